/* lib/launch/launch.c: dt_launch, which picks the launcher of the backend, and
 * the backend names. The launchers are launch_threads.c and launch_mpi.c. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_job.h"
#include "comm/comm_nccl.h"
#include "device/device.h"
#include "device/kernels.h"
#include "launch/launch.h"
#include "launch/launch_impl.h"

#ifdef HAVE_CUDA
#include <cuda_runtime.h>
#endif

const char *dt_backend_name(dt_backend b) {
  switch (b) {
    case DT_BACKEND_THREADS: return "threads";
    case DT_BACKEND_MPI: return "mpi";
  }
  return "?";
}

dt_status dt_backend_parse(const char *s, dt_backend *out) {
  if (s && !strcmp(s, "threads")) *out = DT_BACKEND_THREADS;
  else if (s && !strcmp(s, "mpi")) *out = DT_BACKEND_MPI;
  else return DT_ERR_INVALID;
  return DT_OK;
}

bool dt_backend_available(dt_backend b) {
  if (b == DT_BACKEND_THREADS) return true;
#ifdef HAVE_MPI
  if (b == DT_BACKEND_MPI) return true;
#endif
  return false;
}

const char *dt_comm_kind_name(dt_comm_kind k) {
  switch (k) {
    case DT_COMM_HOST: return "host";
    case DT_COMM_NCCL: return "nccl";
    case DT_COMM_FAKE: return "fake";
  }
  return "?";
}

dt_status dt_comm_kind_parse(const char *s, dt_comm_kind *out) {
  if (s && !strcmp(s, "host")) *out = DT_COMM_HOST;
  else if (s && !strcmp(s, "nccl")) *out = DT_COMM_NCCL;
  else if (s && !strcmp(s, "fake")) *out = DT_COMM_FAKE;
  else return DT_ERR_INVALID;
  return DT_OK;
}

bool dt_comm_kind_available(dt_comm_kind k) {
  return k == DT_COMM_HOST || k == DT_COMM_FAKE || (k == DT_COMM_NCCL && dt_comm_nccl_built());
}

void dt_launch_report_free(dt_launch_report *rep) {
  if (!rep) return;
  free(rep->rank_status);
  rep->rank_status = NULL;
}

/* One rank of a fake job, alone in the calling thread. */
static dt_status fake_rank(const dt_launch_opts *opts, int rank, dt_spmd_fn fn, void *arg,
                           char *msg, size_t msgn) {
  dt_ctx ctx;
  dt_ctx_init(&ctx, rank, opts->world);
  dt_comm *world = NULL;
  dt_device *dev = NULL;
  dt_status s = dt_ledger_init(&ctx, !opts->no_ledger);
  if (s == DT_OK) s = dt_fake_comm_world(&ctx, rank, opts->world, &world);
  if (s == DT_OK) {
    if (opts->device == DT_DEV_META) s = dt_device_meta_create(&ctx, &dev);
    else if (opts->device == DT_DEV_CUDA && opts->cuda_emu) s = dt_device_cuda_emu_create(&ctx, &dev);
    else if (opts->device == DT_DEV_CUDA) s = dt_device_cuda_create(&ctx, 0, &dev);
    else s = dt_device_cpu_create(&ctx, &dev);
  }
  if (s == DT_OK) s = dt_launch_install_comm_mem(world, dev);
  if (s == DT_OK) {
    ctx.world = world;
    ctx.device = dev;
    s = fn(&ctx, arg);
  }
  if (s != DT_OK) snprintf(msg, msgn, "%s", ctx.last_error[0] ? ctx.last_error : dt_status_str(s));
  dt_comm_destroy(world);
  dt_device_destroy(dev);
  dt_ctx_release(&ctx);
  return s;
}

/* comm fake: the listed ranks one after another; the first failure ends the job. */
static dt_status launch_fake(const dt_launch_opts *opts, dt_spmd_fn fn, void *arg,
                             dt_launch_report *rep) {
  int n = opts->fake_ranks ? opts->n_fake_ranks : opts->world;
  char msg[DT_ERRMSG_LEN] = "";
  if (opts->world < 1 || n < 1) {
    if (rep) snprintf(rep->failed_msg, sizeof rep->failed_msg, "comm fake: world %d, %d ranks",
                      opts->world, n);
    return DT_ERR_INVALID;
  }
  dt_status *st = calloc((size_t)n, sizeof *st), result = DT_OK;
  if (!st) return DT_ERR_NOMEM;
  int fr = -1;
  for (int i = 0; i < n; i++) {
    int r = opts->fake_ranks ? opts->fake_ranks[i] : i;
    if (r < 0 || r >= opts->world) {
      st[i] = DT_ERR_INVALID;
      snprintf(msg, sizeof msg, "comm fake: rank %d outside the world of %d", r, opts->world);
    } else {
      st[i] = fake_rank(opts, r, fn, arg, msg, sizeof msg);
    }
    if (st[i] != DT_OK) {
      result = st[i];
      fr = r;
      break;
    }
  }
  if (rep) {
    rep->world = opts->world;
    rep->first_rank = opts->fake_ranks ? opts->fake_ranks[0] : 0;
    rep->n_local = n;
    rep->rank_status = st;
    rep->failed_rank = fr;
    rep->failed_status = result;
    snprintf(rep->failed_msg, sizeof rep->failed_msg, "%s", msg);
  } else {
    free(st);
  }
  return result;
}

dt_status dt_launch(const dt_launch_opts *opts, dt_spmd_fn fn, void *arg, dt_launch_report *rep) {
  if (rep) {
    memset(rep, 0, sizeof *rep);
    rep->failed_rank = -1;
  }
  if (!opts || !fn) {
    if (rep) snprintf(rep->failed_msg, sizeof rep->failed_msg, "dt_launch: NULL opts or fn");
    return DT_ERR_INVALID;
  }
  if (opts->comm == DT_COMM_FAKE) return launch_fake(opts, fn, arg, rep);
  switch (opts->backend) {
    case DT_BACKEND_THREADS: return dt_launch_threads(opts, fn, arg, rep);
    case DT_BACKEND_MPI: return dt_launch_mpi(opts, fn, arg, rep);
  }
  return DT_ERR_INVALID;
}


/* ---- the comm layer's view of a rank's device ----
 * The comm layer sits beside lib/device and cannot call it; these adapters do.
 * The reduce ops keep one order in both layers (dt_reduce_op, DT_KRED_*). */
_Static_assert((int)DT_RED_SUM == (int)DT_KRED_SUM && (int)DT_RED_AVG == (int)DT_KRED_AVG &&
                   (int)DT_RED_MAX == (int)DT_KRED_MAX && (int)DT_RED_MIN == (int)DT_KRED_MIN &&
                   (int)DT_RED_PROD == (int)DT_KRED_PROD,
               "dt_reduce_op and DT_KRED_* differ");

static bool mem_is_device(void *dev, const void *p) {
  dt_device *d = dev;
  if (d->kind == DT_DEV_META) return ((uintptr_t)p & DT_META_TAG) == DT_META_TAG;
  /* by name: a test may run the emulator on a copy of its slots (another kernel table) */
  if (!strcmp(d->ops->name, "cuda-emu")) return ((uintptr_t)p & DT_EMU_TAG) != 0;
#ifdef HAVE_CUDA
  struct cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError(); /* an unknown host pointer: clear the sticky error */
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
#else
  (void)p;
  return false;
#endif
}

static dt_status mem_copy(void *dev, void *dst, const void *src, size_t bytes,
                          dt_comm_copy_kind k) {
  return dt_device_copy(dev, dst, src, bytes, (dt_copy_kind)k);
}

static dt_status mem_reduce(void *dev, dt_dtype t, dt_reduce_op op, size_t n, int nin,
                            const void *const *in, void *out, double divisor) {
  dt_device *d = dev;
  return d->ops->kern->layout->reduce(d, t, (int)op, (int64_t)n, nin, in, out, divisor);
}

static dt_status mem_sync(void *dev) { return dt_device_sync(dev); }

/* Comm scratch: device memory through a handle with no rank, so the rank's
 * device-memory counters (which the owning rank alone updates) never see it;
 * the host staging it replaces was malloc'd, outside them too. */
static dt_status mem_scratch_alloc(void *dev, size_t bytes, void **out) {
  dt_device *d = dev, h = *d;
  h.ctx = NULL;
  dt_status s = dt_device_alloc(&h, bytes, out);
  if (s != DT_OK)
    return dt_error(d->ctx, s, "dt_comm_send", "no device memory for a %zu-byte message", bytes);
  return DT_OK;
}

static void mem_scratch_free(void *dev, void *p, size_t bytes) {
  dt_device h = *(dt_device *)dev;
  h.ctx = NULL;
  dt_device_free(&h, p, bytes);
}

dt_status dt_launch_install_comm_mem(dt_comm *world, dt_device *dev) {
  if (!world || !dev || dev->kind == DT_DEV_CPU) return DT_OK;
  const dt_kernels *K = dev->ops->kern;
  if (!K || !K->layout || !K->layout->reduce)
    return dt_error(dev->ctx, DT_ERR_UNSUPPORTED, "dt_launch",
                    "device '%s' has no reduce kernel for the collectives", dev->ops->name);
  dt_comm_mem m = {.dev = dev, .is_device = mem_is_device, .copy = mem_copy,
                   .reduce = mem_reduce, .sync = mem_sync};
  if (!dt_device_is_meta(dev)) { /* (the meta device's memory is counted, never stored) */
    m.scratch_alloc = mem_scratch_alloc;
    m.scratch_free = mem_scratch_free;
  }
  dt_comm_set_mem(world, &m);
  return DT_OK;
}
