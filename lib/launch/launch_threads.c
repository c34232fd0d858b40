/* lib/launch/launch_threads.c: the threads launcher, N ranks as N threads of
 * this process, each with its own dt_ctx, a world communicator of the threads
 * comm backend and a device. With opts.comm nccl, rank r gets GPU r and an NCCL
 * world communicator instead; the threads job still carries failures. */
/* pthread_setaffinity_np and sched_getaffinity are GNU extensions. */
#define _GNU_SOURCE 1
#include "config.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_job.h"
#include "comm/comm_nccl.h"
#include "device/device.h"
#include "device/kernels.h"
#include "launch/launch.h"
#include "launch/launch_impl.h"

typedef struct rank_run {
  dt_threads_job *job;
  const dt_launch_opts *opts;
  dt_spmd_fn fn;
  void *arg;
  int rank;
  const dt_nccl_id *nccl_id; /* opts->comm nccl: the job's NCCL id */
  dt_status status;
} rank_run;

/* The NCCL communicators' view of the threads job (dt_nccl_hooks). */
static bool job_failed_hook(void *arg, int *rank, char *msg, size_t n) {
  return dt_threads_job_failed(arg, rank, NULL, msg, n);
}
static void job_fail_hook(void *arg, int rank, dt_status s, const char *msg) {
  dt_threads_job_fail(arg, rank, s, msg);
}

/* Rank r's GPU r and its NCCL world communicator. */
static dt_status nccl_rank_setup(rank_run *rr, dt_ctx *ctx, dt_device **dev, dt_comm **world) {
  DT_CHECK(dt_device_cuda_create(ctx, rr->rank, dev));
  void *stream = dt_device_cuda_stream(*dev);
  if (!stream) return ctx->last_status != DT_OK ? ctx->last_status : DT_ERR_BACKEND;
  dt_nccl_hooks hooks = {rr->job, job_failed_hook, job_fail_hook};
  return dt_nccl_comm_world(ctx, rr->nccl_id, rr->rank, stream, rr->opts->timeout_s, &hooks, world);
}

static void *rank_main(void *p) {
  rank_run *rr = p;
  dt_ctx ctx;
  dt_ctx_init(&ctx, rr->rank, rr->opts->world);
  dt_comm *world = NULL;
  dt_device *dev = NULL;
  dt_status s = dt_ledger_init(&ctx, !rr->opts->no_ledger);
  if (s == DT_OK && rr->nccl_id) s = nccl_rank_setup(rr, &ctx, &dev, &world);
  else if (s == DT_OK) s = dt_threads_comm_world(rr->job, &ctx, &world);
  if (s == DT_OK && !rr->nccl_id) {
    /* Every rank of a threads job shares GPU 0 (a stream per rank). */
    if (rr->opts->device == DT_DEV_META) s = dt_device_meta_create(&ctx, &dev);
    else if (rr->opts->device != DT_DEV_CUDA) s = dt_device_cpu_create(&ctx, &dev);
    else if (rr->opts->cuda_emu) s = dt_device_cuda_emu_create(&ctx, &dev);
    else s = dt_device_cuda_create(&ctx, 0, &dev);
  }
  if (s == DT_OK) s = dt_launch_install_comm_mem(world, dev);
  if (s == DT_OK) {
    ctx.world = world;
    ctx.device = dev;
    s = rr->fn(&ctx, rr->arg);
  }
  if (s != DT_OK)
    dt_threads_job_fail(rr->job, rr->rank, s,
                        ctx.last_error[0] ? ctx.last_error : dt_status_str(s));
  rr->status = s;
  /* The communicator first: NCCL's must end before the device's stream goes. */
  dt_comm_destroy(world);
  dt_device_destroy(dev);
  dt_ctx_release(&ctx);
  return NULL;
}

/* opts.bind: with no more ranks than the CPUs this process may use, pin rank r
 * to the r-th of them, as mpirun --bind-to core binds one process per core. Off
 * by default: when other processes share the cores, a pinned rank waits for its
 * own core while the scheduler could have run it on another. With more ranks
 * than CPUs the scheduler balances them better than a fixed binding. */
static void bind_ranks(pthread_t *th, const bool *started, int n) {
#ifdef CPU_SET
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return;
  if (CPU_COUNT(&allowed) < n) return;
  int cpu = -1;
  for (int r = 0; r < n; r++) {
    do cpu++; while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &allowed));
    if (cpu >= CPU_SETSIZE || !started[r]) return;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    (void)pthread_setaffinity_np(th[r], sizeof one, &one); /* best effort */
  }
#else
  (void)th; (void)started; (void)n;
#endif
}

/* An NCCL threads job: a CUDA device, one GPU per rank (NCCL forbids two ranks
 * of one communicator on one GPU), and the job's id. Refusals name the counts. */
static dt_status nccl_check(const dt_launch_opts *opts, int n, dt_nccl_id *id,
                            dt_launch_report *rep) {
  char msg[DT_ERRMSG_LEN];
  dt_status s = DT_OK;
  int ngpu = dt_device_cuda_count();
  if (!dt_comm_nccl_built()) {
    s = DT_ERR_UNSUPPORTED;
    snprintf(msg, sizeof msg, "comm nccl: this libdtensor was built without NCCL");
  } else if (opts->device != DT_DEV_CUDA || opts->cuda_emu) {
    s = DT_ERR_INVALID;
    snprintf(msg, sizeof msg, "comm nccl needs the cuda device (NCCL moves GPU memory)");
  } else if (ngpu < 1) {
    s = DT_ERR_NODEVICE;
    snprintf(msg, sizeof msg, "comm nccl: no GPU is visible");
  } else if (n > ngpu) {
    s = DT_ERR_INVALID;
    snprintf(msg, sizeof msg,
             "comm nccl: a threads job of %d ranks needs %d GPUs, this host has %d (NCCL "
             "forbids two ranks of one communicator on one GPU; the host comm serves that case)",
             n, n, ngpu);
  } else {
    dt_ctx tmp;
    dt_ctx_init(&tmp, 0, n);
    s = dt_nccl_id_make(&tmp, id);
    snprintf(msg, sizeof msg, "%s", tmp.last_error);
    dt_ctx_release(&tmp);
  }
  if (s != DT_OK && rep) {
    rep->failed_status = s;
    snprintf(rep->failed_msg, sizeof rep->failed_msg, "%s", msg);
  }
  return s;
}

dt_status dt_launch_threads(const dt_launch_opts *opts, dt_spmd_fn fn, void *arg,
                            dt_launch_report *rep) {
  int n = opts->world;
  if (rep) {
    memset(rep, 0, sizeof *rep);
    rep->failed_rank = -1;
  }
  if (n < 1 || n > DT_THREADS_MAX_WORLD) {
    if (rep)
      snprintf(rep->failed_msg, sizeof rep->failed_msg, "world %d outside 1..%d", n,
               DT_THREADS_MAX_WORLD);
    return DT_ERR_INVALID;
  }
  dt_nccl_id nccl_id;
  if (opts->comm == DT_COMM_NCCL) {
    dt_status s = nccl_check(opts, n, &nccl_id, rep);
    if (s != DT_OK) return s;
  }
  dt_threads_job *job = NULL;
  DT_CHECK(dt_threads_job_create(n, opts->timeout_s, &job));
  rank_run *runs = calloc((size_t)n, sizeof *runs);
  pthread_t *th = calloc((size_t)n, sizeof *th);
  bool *started = calloc((size_t)n, sizeof *started);
  if (!runs || !th || !started) {
    free(runs); free(th); free(started);
    dt_threads_job_destroy(job);
    return DT_ERR_NOMEM;
  }
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  /* Ranks keep big arrays on the heap; 8 MiB of stack each is plenty. */
  pthread_attr_setstacksize(&attr, (size_t)8 << 20);
  for (int r = 0; r < n; r++) {
    runs[r] = (rank_run){.job = job, .opts = opts, .fn = fn, .arg = arg, .rank = r,
                         .nccl_id = opts->comm == DT_COMM_NCCL ? &nccl_id : NULL};
    if (pthread_create(&th[r], &attr, rank_main, &runs[r]) != 0) {
      char msg[128];
      snprintf(msg, sizeof msg, "launcher: cannot start the thread of rank %d", r);
      runs[r].status = DT_ERR_NOMEM;
      dt_threads_job_fail(job, r, DT_ERR_NOMEM, msg);
      break; /* ranks already running see the abort */
    }
    started[r] = true;
  }
  pthread_attr_destroy(&attr);
  if (opts->bind) bind_ranks(th, started, n);
  for (int r = 0; r < n; r++)
    if (started[r]) pthread_join(th[r], NULL);

  dt_status result = DT_OK;
  int fr = -1;
  dt_status fs = DT_OK;
  char msg[DT_ERRMSG_LEN];
  msg[0] = '\0';
  if (dt_threads_job_failed(job, &fr, &fs, msg, sizeof msg)) result = fs;
  if (rep) {
    rep->world = n;
    rep->first_rank = 0;
    rep->n_local = n;
    rep->rank_status = malloc((size_t)n * sizeof(dt_status));
    if (rep->rank_status)
      for (int r = 0; r < n; r++) rep->rank_status[r] = runs[r].status;
    rep->failed_rank = fr;
    rep->failed_status = fs;
    snprintf(rep->failed_msg, sizeof rep->failed_msg, "%s", msg);
  }
  free(runs);
  free(th);
  free(started);
  dt_threads_job_destroy(job);
  return result;
}
