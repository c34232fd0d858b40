/* lib/device/device_cpu.c: the CPU device: host memory and cblas (OpenBLAS);
 * bf16 GEMM goes through f32 sgemm.
 *
 * BLAS runs on the calling thread's rank. With the threads comm backend every
 * rank is a thread, so a program should keep OpenBLAS single-threaded
 * (dt_device_cpu_blas_threads(1)) to avoid oversubscribing the cores. */
#include "config.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "device/device.h"
#include "device/kernels.h"

static dt_status cpu_alloc(dt_device *d, size_t bytes, void **out) {
  *out = dt_host_alloc(d->ctx, bytes);
  return *out ? DT_OK : DT_ERR_NOMEM;
}

static void cpu_free(dt_device *d, void *p, size_t bytes) {
  (void)bytes;
  dt_host_free(d->ctx, p);
}

static dt_status cpu_copy(dt_device *d, void *dst, const void *src, size_t bytes, dt_copy_kind k) {
  /* the CPU device's memory is host memory: a copy within it (D2D) is H2H */
  if (k != DT_COPY_H2H && k != DT_COPY_D2D)
    return dt_error(d->ctx, DT_ERR_INVALID, "dt_device_copy", "the cpu device copies host to host only");
  memmove(dst, src, bytes);
  return DT_OK;
}

/* cblas takes int dims; larger problems are rejected rather than truncated. */
static bool fits_int(int64_t v) { return v >= 0 && v <= 2147483647; }

/* dst[r * cols + c] = f32 of the bf16 src[r * ld + c]: a stored matrix made dense. */
static void bf16_to_f32_mat(float *dst, const dt_bf16 *src, int64_t rows, int64_t cols, int64_t ld) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) dst[r * cols + c] = dt_bf16_to_f32(src[r * ld + c]);
}

/* bf16 A and B through f32: each matrix is widened (exact), multiplied by
 * sgemm with f32 accumulation and f32 alpha/beta, and C is rounded once to bf16
 * (or written as f32 with c_f32). Slow, but the same arithmetic contract as the
 * cuBLAS path (CUBLAS_COMPUTE_32F). */
static dt_status cpu_gemm_bf16(dt_device *d, const dt_gemm_desc *g) {
  const int64_t m = g->m, n = g->n, k = g->k;
  const int64_t a_rows = g->trans_a ? k : m, a_cols = g->trans_a ? m : k;
  const int64_t b_rows = g->trans_b ? n : k, b_cols = g->trans_b ? k : n;
  const size_t na = (size_t)(a_rows * a_cols), nb = (size_t)(b_rows * b_cols);
  float *fa = malloc((na ? na : 1) * sizeof *fa), *fb = malloc((nb ? nb : 1) * sizeof *fb);
  float *fc = g->c_f32 ? NULL : malloc((size_t)(m * n) * sizeof *fc);
  if (!fa || !fb || (!g->c_f32 && !fc)) {
    free(fa);
    free(fb);
    free(fc);
    return dt_error(d->ctx, DT_ERR_NOMEM, "dt_device_gemm", "bf16 staging for %lldx%lldx%lld",
                    (long long)m, (long long)n, (long long)k);
  }
  enum CBLAS_TRANSPOSE ta = g->trans_a ? CblasTrans : CblasNoTrans;
  enum CBLAS_TRANSPOSE tb = g->trans_b ? CblasTrans : CblasNoTrans;
  const float alpha = (float)g->alpha, beta = (float)g->beta;
  for (int64_t b = 0; b < g->batch; b++) {
    if (k > 0) {
      bf16_to_f32_mat(fa, (const dt_bf16 *)g->a + b * g->stride_a, a_rows, a_cols, g->lda);
      bf16_to_f32_mat(fb, (const dt_bf16 *)g->b + b * g->stride_b, b_rows, b_cols, g->ldb);
    }
    if (g->c_f32) {
      cblas_sgemm(CblasRowMajor, ta, tb, (int)m, (int)n, (int)k, alpha, fa,
                  (int)(a_cols > 1 ? a_cols : 1), fb, (int)(b_cols > 1 ? b_cols : 1), beta,
                  (float *)g->c + b * g->stride_c, (int)g->ldc);
      continue;
    }
    dt_bf16 *C = (dt_bf16 *)g->c + b * g->stride_c;
    /* beta 0: C is not read (NaN there must not propagate) */
    if (beta != 0.0f) bf16_to_f32_mat(fc, C, m, n, g->ldc);
    cblas_sgemm(CblasRowMajor, ta, tb, (int)m, (int)n, (int)k, alpha, fa,
                (int)(a_cols > 1 ? a_cols : 1), fb, (int)(b_cols > 1 ? b_cols : 1), beta, fc,
                (int)(n > 1 ? n : 1));
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) C[i * g->ldc + j] = dt_f32_to_bf16(fc[i * n + j]);
  }
  free(fa);
  free(fb);
  free(fc);
  return DT_OK;
}

static dt_status cpu_gemm(dt_device *d, const dt_gemm_desc *g) {
  if (!fits_int(g->m) || !fits_int(g->n) || !fits_int(g->k) || !fits_int(g->lda) ||
      !fits_int(g->ldb) || !fits_int(g->ldc))
    return dt_error(d->ctx, DT_ERR_INVALID, "dt_device_gemm", "dims exceed the cblas int range");
  enum CBLAS_TRANSPOSE ta = g->trans_a ? CblasTrans : CblasNoTrans;
  enum CBLAS_TRANSPOSE tb = g->trans_b ? CblasTrans : CblasNoTrans;
  if (g->dtype == DT_BF16) return cpu_gemm_bf16(d, g);
  int m = (int)g->m, n = (int)g->n, k = (int)g->k;
  for (int64_t b = 0; b < g->batch; b++) {
    if (g->dtype == DT_F32) {
      const float *A = (const float *)g->a + b * g->stride_a;
      const float *B = (const float *)g->b + b * g->stride_b;
      float *C = (float *)g->c + b * g->stride_c;
      cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, (float)g->alpha, A, (int)g->lda, B,
                  (int)g->ldb, (float)g->beta, C, (int)g->ldc);
    } else {
      const double *A = (const double *)g->a + b * g->stride_a;
      const double *B = (const double *)g->b + b * g->stride_b;
      double *C = (double *)g->c + b * g->stride_c;
      cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, g->alpha, A, (int)g->lda, B, (int)g->ldb,
                  g->beta, C, (int)g->ldc);
    }
  }
  return DT_OK;
}

static dt_status cpu_fill(dt_device *d, dt_dtype t, void *x, int64_t n, double value) {
  switch (t) {
    case DT_F32: { float v = (float)value, *p = x; for (int64_t i = 0; i < n; i++) p[i] = v; break; }
    case DT_F64: { double *p = x; for (int64_t i = 0; i < n; i++) p[i] = value; break; }
    case DT_BF16: {
      dt_bf16 v = dt_f32_to_bf16((float)value), *p = x;
      for (int64_t i = 0; i < n; i++) p[i] = v;
      break;
    }
    default: return dt_error(d->ctx, DT_ERR_INVALID, "dt_device_fill", "bad dtype");
  }
  return DT_OK;
}

static dt_status cpu_axpy(dt_device *d, dt_dtype t, int64_t n, double alpha, const void *x, void *y) {
  /* A plain loop: n can exceed cblas's int, and it vectorises at -O2. */
  if (t == DT_F32) {
    const float *xs = x; float *ys = y; float a = (float)alpha;
    for (int64_t i = 0; i < n; i++) ys[i] += a * xs[i];
  } else if (t == DT_F64) {
    const double *xs = x; double *ys = y;
    for (int64_t i = 0; i < n; i++) ys[i] += alpha * xs[i];
  } else if (t == DT_BF16) { /* f32 arithmetic, one rounding of each y, as the cuda device */
    const dt_bf16 *xs = x; dt_bf16 *ys = y; float a = (float)alpha;
    for (int64_t i = 0; i < n; i++)
      ys[i] = dt_f32_to_bf16(dt_bf16_to_f32(ys[i]) + a * dt_bf16_to_f32(xs[i]));
  } else {
    return dt_error(d->ctx, DT_ERR_UNSUPPORTED, "dt_device_axpy", "dtype %s", dt_dtype_name(t));
  }
  return DT_OK;
}

static void cpu_destroy(dt_device *d) { free(d); }

static const dt_device_ops cpu_ops = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy = cpu_copy,
    .gemm = cpu_gemm,
    .fill = cpu_fill,
    .axpy = cpu_axpy,
    .sync = NULL, /* the CPU device is synchronous */
    .destroy = cpu_destroy,
    .kern = &dt_kernels_cpu,
};

const dt_device_ops *dt_device_cpu_ops(void) { return &cpu_ops; }

dt_status dt_device_cpu_create(dt_ctx *ctx, dt_device **out) {
  dt_device *d = calloc(1, sizeof *d);
  if (!d) return dt_error(ctx, DT_ERR_NOMEM, "dt_device_cpu_create", "no memory");
  d->ops = &cpu_ops;
  d->kind = DT_DEV_CPU;
  d->ctx = ctx;
  *out = d;
  return DT_OK;
}

int dt_device_cpu_blas_threads(int n) {
#ifdef HAVE_OPENBLAS_SET_NUM_THREADS
  int old = 1;
#ifdef HAVE_OPENBLAS_GET_NUM_THREADS
  old = openblas_get_num_threads();
#endif
  if (n > 0) openblas_set_num_threads(n);
  return old;
#else
  (void)n;
  return -1;
#endif
}
