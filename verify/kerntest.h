/* verify/kerntest.h: what the device-kernel tests (test_kern*.c) share: a device
 * under test (cuda-emu, cuda with -DKERN_ON_CUDA, or the CPU's host loops with
 * -DKERN_ON_CPU), uploads and downloads
 * through it, seeded inputs, and an element-wise comparison that reports the
 * first mismatch. */
#ifndef SB_KERNTEST_H
#define SB_KERNTEST_H

#include <stdint.h>

#include "testutil.h"

typedef struct kt_dev {
  dt_ctx *ctx;
  dt_device *dev;          /* the device under test */
  const dt_kernels *K;     /* its kernel table */
  const char *name;        /* "cuda-emu", "cuda" or "cpu" */
} kt_dev;

/* Opens the device under test on ctx: GPU 0 when on_cuda (no GPU: prints SKIP
 * and returns SB_SKIP), else cuda-emu; 0 on success, 1 on another failure. */
int kt_open(kt_dev *T, dt_ctx *ctx, bool on_cuda);
/* Opens the CPU device (its kernel table: the host loops); 0 on success. */
int kt_open_cpu(kt_dev *T, dt_ctx *ctx);
void kt_close(kt_dev *T);

/* bytes of host h into device buffer d (on the CPU device: a host copy). */
void kt_h2d(kt_dev *T, void *d, const void *h, size_t bytes);
/* Device buffer of `bytes` holding a copy of host h (h NULL: uninitialised). */
void *kt_up(kt_dev *T, const void *h, size_t bytes);
/* Waits for the device, then copies bytes of device d into host h. */
void kt_down(kt_dev *T, void *h, const void *d, size_t bytes);
void kt_free(kt_dev *T, void *d, size_t bytes);

/* n values uniform in [lo, hi) from (seed, stream), as doubles. */
void kt_uniform(double *v, int64_t n, uint64_t seed, uint64_t stream, double lo, double hi);
/* Host buffer of n elements of dtype t converted from v (bf16 rounds). */
void *kt_pack(dt_dtype t, const double *v, int64_t n);
/* v[i] = element i of buffer p of dtype t (f32, f64, bf16, i64). */
void kt_unpack(dt_dtype t, const void *p, double *v, int64_t n);
/* v rounded to dtype t in place (kt_pack then kt_unpack). */
void kt_round(dt_dtype t, double *v, int64_t n);
/* The bf16 nearest to f, ties to even, found by comparing the two neighbours
 * (an oracle independent of the library's conversion). */
double kt_nearest_bf16(float f);
/* Unit roundoff of dtype t (2^-p for p significand bits: 2^-24, 2^-53, 2^-8). */
double kt_unit(dt_dtype t);

/* The first i with |got - want| > tol * max(1, |want|) (NaN counts), or -1. */
int64_t kt_mismatch(const double *got, const double *want, int64_t n, double tol);
/* kt_mismatch(...) == -1; reports the first
 * mismatch with `what`; counts one check. */
bool kt_close_to(const char *what, const double *got, const double *want, int64_t n, double tol);

/* KT_ON_CUDA: this program tests the GPU (built with -DKERN_ON_CUDA, the
 * test_*_cuda twins), else cuda-emu; KT_NAME(base) is its name for tu_finish. */
#ifdef KERN_ON_CUDA
#define KT_ON_CUDA true
#define KT_NAME(base) base "_cuda"
#elif defined KERN_ON_CPU
#define KT_ON_CUDA false
#define KT_NAME(base) base "_cpu"
#else
#define KT_ON_CUDA false
#define KT_NAME(base) base
#endif

/* For main: a one-rank context and the device under test; nonzero (SKIP or a
 * failure, printed) when it cannot be opened, with ctx already released. */
static inline int kt_start(kt_dev *T, dt_ctx *ctx) {
  dt_ctx_init(ctx, 0, 1);
#ifdef KERN_ON_CPU
  int rc = kt_open_cpu(T, ctx);
#else
  int rc = kt_open(T, ctx, KT_ON_CUDA);
#endif
  if (rc) dt_ctx_release(ctx);
  return rc;
}

/* For main: every device byte freed (one check), then the device and ctx
 * released; tu_finish's exit code. */
static inline int kt_end(kt_dev *T, dt_ctx *ctx, const char *name) {
  TU_CHECK(ctx->mem.dev_cur == 0, "device bytes left: %zu", ctx->mem.dev_cur);
  kt_close(T);
  dt_ctx_release(ctx);
  return tu_finish(name);
}

#endif
