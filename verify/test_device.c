/* verify/test_device.c: the CPU device against naive references: strided-batched
 * GEMM in f32 and f64 with every transpose pair, padded leading dims, alpha and
 * beta, compared with a triple loop in long double; fill, axpy and copy; and the
 * argument checks of the front. */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "testutil.h"

static double getv(dt_dtype t, const void *p, int64_t i) {
  return t == DT_F32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}

static void gemm_case(dt_ctx *ctx, dt_device *d, dt_dtype t, bool ta, bool tb, int64_t m,
                      int64_t n, int64_t k, int64_t batch, int pad) {
  size_t es = dt_dtype_size(t);
  int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
  int64_t lda = ac + pad, ldb = bc + pad, ldc = n + pad;
  int64_t sa = ar * lda + pad * 3, sb = br * ldb + pad * 5, sc = m * ldc + pad * 7;
  void *A = dt_host_alloc(ctx, (size_t)(sa * batch + 1) * es);
  void *B = dt_host_alloc(ctx, (size_t)(sb * batch + 1) * es);
  void *C = dt_host_alloc(ctx, (size_t)(sc * batch + 1) * es);
  void *C0 = dt_host_alloc(ctx, (size_t)(sc * batch + 1) * es);
  dt_rng_fill(t, A, sa * batch, 1, 1, 0, 1, DT_RNG_UNIFORM, -1, 2);
  dt_rng_fill(t, B, sb * batch, 1, 2, 0, 1, DT_RNG_UNIFORM, -1, 2);
  dt_rng_fill(t, C, sc * batch, 1, 3, 0, 1, DT_RNG_UNIFORM, -1, 2);
  memcpy(C0, C, (size_t)(sc * batch) * es);
  double alpha = 0.75, beta = -0.5;
  dt_gemm_desc g = {.dtype = t, .trans_a = ta, .trans_b = tb, .m = m, .n = n, .k = k,
                    .alpha = alpha, .beta = beta, .a = A, .lda = lda, .stride_a = sa,
                    .b = B, .ldb = ldb, .stride_b = sb, .c = C, .ldc = ldc, .stride_c = sc,
                    .batch = batch};
  TU_OK(ctx, dt_device_gemm(d, &g));
  /* Tolerance: each output is a k-term dot product of values in [-1,1]; its
   * rounding error is at most k*eps*sum|a||b| <= k*eps*k (Higham, 3.5) plus the
   * alpha/beta terms: bound k*(k+2)*eps. */
  double eps = t == DT_F32 ? 0x1p-24 : 0x1p-53, tol = (double)(k + 2) * (double)(k + 2) * eps;
  long bad = 0;
  double worst = 0;
  for (int64_t b = 0; b < batch; b++)
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        long double acc = 0;
        for (int64_t p = 0; p < k; p++) {
          double a = getv(t, A, b * sa + (ta ? p * lda + i : i * lda + p));
          double bb = getv(t, B, b * sb + (tb ? j * ldb + p : p * ldb + j));
          acc += (long double)a * bb;
        }
        double want = (double)(alpha * acc + beta * (long double)getv(t, C0, b * sc + i * ldc + j));
        double err = fabs(getv(t, C, b * sc + i * ldc + j) - want);
        if (err > worst) worst = err;
        if (err > tol) bad++;
      }
  /* padding between rows and batches is untouched */
  long touched = 0;
  for (int64_t b = 0; b < batch; b++)
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = n; j < ldc && (i < m - 1 || b < batch - 1); j++)
        touched += getv(t, C, b * sc + i * ldc + j) != getv(t, C0, b * sc + i * ldc + j);
  TU_CHECK(bad == 0 && touched == 0,
           "gemm %s ta=%d tb=%d m=%lld n=%lld k=%lld batch=%lld: %ld wrong (worst %g > tol %g), %ld padding writes",
           dt_dtype_name(t), ta, tb, (long long)m, (long long)n, (long long)k, (long long)batch, bad,
           worst, tol, touched);
  dt_host_free(ctx, A);
  dt_host_free(ctx, B);
  dt_host_free(ctx, C);
  dt_host_free(ctx, C0);
}

int main(int argc, char **argv) {
  tu_opts o;
  tu_parse(argc, argv, &o);
  dt_device_cpu_blas_threads(1);
  dt_ctx ctx;
  dt_ctx_init(&ctx, 0, 1);
  dt_device *d = NULL;
  TU_OK(&ctx, dt_device_cpu_create(&ctx, &d));
  if (!d) return tu_finish("test_device");
  const int64_t shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {16, 1, 9}, {1, 13, 4}, {33, 17, 1}, {64, 48, 40}};
  for (int di = 0; di < 2; di++)
    for (int s = 0; s < 6; s++)
      for (int tr = 0; tr < 4; tr++)
        for (int batch = 1; batch <= 3; batch += 2)
          gemm_case(&ctx, d, di ? DT_F64 : DT_F32, tr & 1, tr >> 1, shapes[s][0], shapes[s][1],
                    shapes[s][2], batch, (s + tr) % 3);

  /* fill, axpy, copy */
  double x[100], y[100];
  TU_OK(&ctx, dt_device_fill(d, DT_F64, x, 100, 2.5));
  TU_OK(&ctx, dt_device_fill(d, DT_F64, y, 100, -1.0));
  TU_OK(&ctx, dt_device_axpy(d, DT_F64, 100, 3.0, x, y));
  long bad = 0;
  for (int i = 0; i < 100; i++) bad += y[i] != 6.5 || x[i] != 2.5;
  TU_CHECK(bad == 0, "fill/axpy f64");
  float xf[37], yf[37];
  TU_OK(&ctx, dt_device_fill(d, DT_F32, xf, 37, 0.25));
  TU_OK(&ctx, dt_device_copy(d, yf, xf, sizeof xf, DT_COPY_H2H));
  bad = 0;
  for (int i = 0; i < 37; i++) bad += yf[i] != 0.25f;
  TU_CHECK(bad == 0, "fill/copy f32");
  dt_bf16 hb[5];
  TU_OK(&ctx, dt_device_fill(d, DT_BF16, hb, 5, 1.5));
  TU_CHECK(dt_bf16_to_f32(hb[4]) == 1.5f, "fill bf16");
  TU_CHECK(dt_device_copy(d, yf, xf, 4, DT_COPY_H2D) == DT_ERR_INVALID, "cpu rejects H2D");

  /* argument checks */
  dt_gemm_desc g = {.dtype = DT_F32, .m = 2, .n = 2, .k = 2, .a = xf, .lda = 1, .b = xf,
                    .ldb = 2, .c = yf, .ldc = 2, .batch = 1};
  TU_CHECK(dt_device_gemm(d, &g) == DT_ERR_INVALID && strstr(dt_last_error(&ctx), "lda"),
           "small lda rejected: %s", dt_last_error(&ctx));
  g.lda = 2;
  g.dtype = DT_I64;
  TU_CHECK(dt_device_gemm(d, &g) == DT_ERR_UNSUPPORTED, "i64 gemm unsupported");
  g.dtype = DT_F32;
  g.batch = 0;
  TU_CHECK(dt_device_gemm(d, &g) == DT_ERR_INVALID, "batch 0 rejected");

  dt_device_destroy(d);
  TU_CHECK(ctx.mem.host_cur == 0, "all device memory returned (%zu left)", ctx.mem.host_cur);
  dt_ctx_release(&ctx);
  return tu_finish("test_device");
}
