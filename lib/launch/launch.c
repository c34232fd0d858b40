/* lib/launch/launch.c: dt_launch, which picks the launcher of the backend, and
 * the backend names. The launchers are launch_threads.c and launch_mpi.c. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
  }
  return "?";
}

dt_status dt_comm_kind_parse(const char *s, dt_comm_kind *out) {
  if (s && !strcmp(s, "host")) *out = DT_COMM_HOST;
  else if (s && !strcmp(s, "nccl")) *out = DT_COMM_NCCL;
  else return DT_ERR_INVALID;
  return DT_OK;
}

bool dt_comm_kind_available(dt_comm_kind k) {
  return k == DT_COMM_HOST || (k == DT_COMM_NCCL && dt_comm_nccl_built());
}

void dt_launch_report_free(dt_launch_report *rep) {
  if (!rep) return;
  free(rep->rank_status);
  rep->rank_status = NULL;
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
  if (d->ops->kern == &dt_kernels_emu) return ((uintptr_t)p & DT_EMU_TAG) != 0;
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

dt_status dt_launch_install_comm_mem(dt_comm *world, dt_device *dev) {
  if (!world || !dev || dev->kind == DT_DEV_CPU) return DT_OK;
  const dt_kernels *K = dev->ops->kern;
  if (!K || !K->layout || !K->layout->reduce)
    return dt_error(dev->ctx, DT_ERR_UNSUPPORTED, "dt_launch",
                    "device '%s' has no reduce kernel for the collectives", dev->ops->name);
  dt_comm_mem m = {.dev = dev, .is_device = mem_is_device, .copy = mem_copy,
                   .reduce = mem_reduce, .sync = mem_sync};
  dt_comm_set_mem(world, &m);
  return DT_OK;
}
