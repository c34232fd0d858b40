/* lib/launch/launch_mpi.c: the MPI launcher, one rank per process (under
 * mpirun), and the MPI process helpers for programs (dt_mpi_init, ...).
 *
 * dt_launch_mpi makes this process's rank: its dt_ctx and ledger, the job and
 * its world communicator (the mpi comm backend, lib/comm/comm_job.h), and a
 * device; runs fn; and reports the outcome every rank agreed on. How failures
 * travel between ranks, and why a failed job must end with
 * dt_mpi_finish(false), is the backend's business (lib/comm/comm_mpi.c).
 *
 * Without HAVE_MPI the launcher and the helpers are stubs: DT_ERR_UNSUPPORTED
 * (rank 0, size 1, finish is a no-op). The library never prints or exits;
 * dt_mpi_finish with job_ok == false calls MPI_Abort, which is its documented
 * purpose. Only MPI's own initialisation state is global (MPI's, not ours).
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_job.h"
#include "comm/comm_nccl.h"
#include "device/device.h"
#include "device/kernels.h"
#include "launch/launch_impl.h"
#include "launch/launch.h"

#ifdef HAVE_MPI

#include <mpi.h>

dt_status dt_mpi_init(int *argc, char ***argv) {
  int inited = 0, finalized = 0;
  if (MPI_Initialized(&inited) != MPI_SUCCESS || MPI_Finalized(&finalized) != MPI_SUCCESS)
    return DT_ERR_BACKEND;
  if (finalized) return DT_ERR_BACKEND; /* MPI cannot be initialised twice */
  if (inited) return DT_OK;
  /* Serialized: only the thread that calls dt_launch talks to MPI. */
  int provided = 0;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
    return DT_ERR_BACKEND;
  return DT_OK;
}

static bool mpi_live(void) {
  int inited = 0, finalized = 0;
  if (MPI_Initialized(&inited) != MPI_SUCCESS || MPI_Finalized(&finalized) != MPI_SUCCESS)
    return false;
  return inited && !finalized;
}

int dt_mpi_rank(void) {
  int r = 0;
  if (!mpi_live() || MPI_Comm_rank(MPI_COMM_WORLD, &r) != MPI_SUCCESS) return 0;
  return r;
}

int dt_mpi_size(void) {
  int n = 1;
  if (!mpi_live() || MPI_Comm_size(MPI_COMM_WORLD, &n) != MPI_SUCCESS) return 1;
  return n;
}

void dt_mpi_finish(bool job_ok) {
  if (!mpi_live()) return;
  if (job_ok)
    MPI_Finalize();
  else
    MPI_Abort(MPI_COMM_WORLD, 1);
}

static void report_init(dt_launch_report *rep) {
  if (!rep) return;
  memset(rep, 0, sizeof *rep);
  rep->failed_rank = -1;
}

/* A failure before the job exists: only this rank knows; report it as its own. */
static dt_status report_local(dt_launch_report *rep, int rank, dt_status s, const char *msg) {
  if (rep) {
    rep->failed_rank = rank;
    rep->failed_status = s;
    snprintf(rep->failed_msg, sizeof rep->failed_msg, "%s", msg);
    if (rep->rank_status) rep->rank_status[0] = s;
  }
  return s;
}

/* opts.comm nccl: this rank's NCCL world communicator on GPU `ordinal` (its
 * rank within its node). Collective over the MPI world, called by every rank
 * whatever `st` (its status so far) says: the ranks agree first that every one
 * has its GPU (an all_reduce of a failure flag), then rank 0's NCCL id is
 * broadcast, so no rank enters NCCL's initialisation for a peer that will never
 * come. Launcher-internal traffic: not recorded in the ledger. */
static dt_status nccl_world_mpi(const dt_launch_opts *opts, dt_ctx *ctx, dt_comm *mpi_world,
                                dt_device *dev, int ordinal, dt_status st, dt_comm **out) {
  const char *opn = "dt_launch_mpi";
  *out = NULL;
  int ngpu = dt_device_cuda_count();
  if (st != DT_OK) {
  } else if (!dt_comm_nccl_built()) {
    st = dt_error(ctx, DT_ERR_UNSUPPORTED, opn, "comm nccl: this libdtensor was built without NCCL");
  } else if (opts->device != DT_DEV_CUDA || opts->cuda_emu) {
    st = dt_error(ctx, DT_ERR_INVALID, opn, "comm nccl needs the cuda device (NCCL moves GPU memory)");
  } else if (ordinal >= ngpu) {
    st = dt_error(ctx, DT_ERR_INVALID, opn,
                  "comm nccl: rank %d is process %d of its node, which has %d GPUs (NCCL forbids "
                  "two ranks of one communicator on one GPU: start at most %d per node)",
                  ctx->rank, ordinal, ngpu, ngpu);
  }
  bool was = dt_ledger_of(ctx)->enabled;
  dt_ledger_enable(ctx, false);
  double bad = st != DT_OK ? 1.0 : 0.0, any = 0.0;
  int64_t msg[1 + sizeof(dt_nccl_id) / sizeof(int64_t)];
  memset(msg, 0, sizeof msg);
  dt_status s = dt_comm_all_reduce(mpi_world, &bad, &any, 1, DT_F64, DT_RED_MAX);
  if (s == DT_OK && any == 0.0 && ctx->rank == 0) {
    dt_nccl_id id;
    msg[0] = dt_nccl_id_make(ctx, &id);
    memcpy(&msg[1], id.bytes, sizeof id.bytes);
  }
  if (s == DT_OK && any == 0.0)
    s = dt_comm_broadcast(mpi_world, msg, sizeof msg / sizeof msg[0], DT_I64, 0);
  dt_ledger_enable(ctx, was);
  if (st != DT_OK || s != DT_OK) return st != DT_OK ? st : s;
  if (any != 0.0)
    return dt_error(ctx, DT_ERR_ABORTED, opn, "comm nccl: another rank could not take its GPU");
  if (msg[0] != DT_OK)
    return ctx->rank == 0 ? (dt_status)msg[0]
                          : dt_error(ctx, DT_ERR_ABORTED, opn,
                                     "comm nccl: rank 0 could not make the NCCL id");
  dt_nccl_id id;
  memcpy(id.bytes, &msg[1], sizeof id.bytes);
  void *stream = dt_device_cuda_stream(dev);
  if (!stream) return ctx->last_status != DT_OK ? ctx->last_status : DT_ERR_BACKEND;
  /* No hooks: a peer's failure reaches this rank through NCCL's errors or the
   * timeout (the MPI abort notices are polled by MPI calls only). */
  return dt_nccl_comm_world(ctx, &id, ordinal, stream, opts->timeout_s, NULL, out);
}

/* Runs fn once on this process's rank (see launch.h). Collective over
 * MPI_COMM_WORLD: every process of the job must call it, with the same opts.
 * Steps: init MPI if needed; local allocations; the job's blocking setup
 * collectives, which every rank runs whatever failed locally so that none is
 * left waiting in them (dt_mpi_job_open); the device; fn; on error, notify the
 * others; agree on the outcome; free. After the setup collectives nothing
 * blocks without polling. MPI stays initialised (dt_mpi_finish ends it). */
dt_status dt_launch_mpi(const dt_launch_opts *opts, dt_spmd_fn fn, void *arg,
                        dt_launch_report *rep) {
  const char *opn = "dt_launch_mpi";
  report_init(rep);
  if (!opts || !fn) return report_local(rep, -1, DT_ERR_INVALID, "dt_launch_mpi: no opts or fn");
  if (dt_mpi_init(NULL, NULL) != DT_OK)
    return report_local(rep, -1, DT_ERR_BACKEND, "dt_launch_mpi: MPI could not be initialised");
  int rank = 0, size = 1;
  if (MPI_Comm_rank(MPI_COMM_WORLD, &rank) != MPI_SUCCESS ||
      MPI_Comm_size(MPI_COMM_WORLD, &size) != MPI_SUCCESS)
    return report_local(rep, -1, DT_ERR_BACKEND, "dt_launch_mpi: MPI_COMM_WORLD unusable");
  dt_ctx ctx;
  dt_ctx_init(&ctx, rank, size);

  /* Local allocations first; a failure is acted on after the collectives. */
  dt_status s = dt_ledger_init(&ctx, !opts->no_ledger);
  if (rep) {
    rep->world = size;
    rep->first_rank = rank;
    rep->n_local = 1;
    rep->rank_status = malloc(sizeof(dt_status));
    if (!rep->rank_status) {
      rep->n_local = 0;
      if (s == DT_OK) s = dt_error(&ctx, DT_ERR_NOMEM, opn, "no memory for the report");
    }
  }

  dt_mpi_job *job = NULL;
  dt_comm *world = NULL;
  int ordinal = 0;
  s = dt_mpi_job_open(&ctx, s, opts->timeout_s, &job, &world,
                      opts->device == DT_DEV_CUDA && !opts->cuda_emu ? &ordinal : NULL);
  if (!job) {
    report_local(rep, rank, s, ctx.last_error);
    dt_ctx_release(&ctx);
    return s;
  }
  dt_device *dev = NULL;
  if (s == DT_OK) {
    if (opts->device == DT_DEV_CUDA && opts->cuda_emu) {
      s = dt_device_cuda_emu_create(&ctx, &dev);
    } else if (opts->device == DT_DEV_CUDA) {
      int ngpu = dt_device_cuda_count();
      s = dt_device_cuda_create(&ctx, ngpu > 0 ? ordinal % ngpu : ordinal, &dev);
    } else {
      s = dt_device_cpu_create(&ctx, &dev);
    }
  }
  if (s == DT_OK) s = dt_launch_install_comm_mem(world, dev);

  dt_comm *ncw = NULL; /* opts.comm nccl: the world fn sees */
  if (opts->comm == DT_COMM_NCCL && world)
    s = nccl_world_mpi(opts, &ctx, world, dev, ordinal, s, &ncw);

  dt_status fn_st = s; /* a setup failure counts as this rank's failure */
  if (s == DT_OK) {
    ctx.world = ncw ? ncw : world;
    ctx.device = dev;
    fn_st = fn(&ctx, arg);
  }
  fn_st = dt_mpi_job_done(job, &ctx, fn_st);
  if (rep && rep->rank_status) rep->rank_status[0] = fn_st;
  dt_job_outcome oc;
  dt_status result = dt_mpi_job_agree(job, &ctx, fn_st, &oc);
  if (rep) {
    rep->failed_rank = oc.failed_rank;
    rep->failed_status = oc.failed_status;
    snprintf(rep->failed_msg, sizeof rep->failed_msg, "%s", oc.failed_msg);
  }

  ctx.world = NULL;
  ctx.device = NULL;
  dt_comm_destroy(ncw); /* before the device, whose stream it uses */
  dt_device_destroy(dev);
  dt_comm_destroy(world);
  dt_mpi_job_close(job, &ctx);
  dt_ctx_release(&ctx);
  return result;
}

#else /* !HAVE_MPI: stubs */

dt_status dt_mpi_init(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  return DT_ERR_UNSUPPORTED;
}

int dt_mpi_rank(void) { return 0; }
int dt_mpi_size(void) { return 1; }
void dt_mpi_finish(bool job_ok) { (void)job_ok; }

dt_status dt_launch_mpi(const dt_launch_opts *opts, dt_spmd_fn fn, void *arg,
                        dt_launch_report *rep) {
  (void)opts;
  (void)fn;
  (void)arg;
  if (rep) {
    memset(rep, 0, sizeof *rep);
    rep->failed_rank = -1;
    rep->failed_status = DT_ERR_UNSUPPORTED;
    snprintf(rep->failed_msg, sizeof rep->failed_msg,
             "dt_launch_mpi: this libdtensor was built without MPI");
  }
  return DT_ERR_UNSUPPORTED;
}

#endif /* HAVE_MPI */
