/* verify/test_kern.c: the device kernel table (lib/device/kernels.h) against
 * host references computed here in double, on the cuda-emu device (the CUDA
 * kernels built for the host) or, built with -DKERN_ON_CUDA (test_kern_cuda),
 * on GPU 0, which exits 77 (SKIP) where there is none.
 *
 * Sizes are odd on purpose (1, a partial block, several grid-stride rounds).
 * Tolerances: the kernels compute in f32 for f32 and bf16 and in f64 for f64;
 * a result is within a few roundings of the stored type (kt_unit) of the
 * double-precision reference on the same (rounded) inputs.
 */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kerntest.h"

static const int64_t sizes[] = {1, 7, 256, 1000, 100003};
enum { N_SIZES = sizeof sizes / sizeof sizes[0] };
static const dt_dtype ftypes[] = {DT_F32, DT_F64, DT_BF16};

/* ---- pw.silu: y = x / (1 + exp(-x)) ------------------------------------------- */
static void test_silu(kt_dev *T) {
  for (int ti = 0; ti < 3; ti++) {
    dt_dtype t = ftypes[ti];
    size_t es = dt_dtype_size(t);
    for (int si = 0; si < N_SIZES; si++) {
      int64_t n = sizes[si];
      double *x = malloc(n * sizeof *x), *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
      kt_uniform(x, n, 7, (uint64_t)si, -12, 12);
      void *hx = kt_pack(t, x, n), *hy = malloc(n * es);
      kt_unpack(t, hx, x, n); /* the reference sees the rounded inputs */
      for (int64_t i = 0; i < n; i++) want[i] = x[i] / (1 + exp(-x[i]));
      void *dx = kt_up(T, hx, n * es), *dy = kt_up(T, NULL, n * es);
      TU_OK(T->ctx, T->K->pw->silu(T->dev, t, n, dx, dy));
      kt_down(T, hy, dy, n * es);
      kt_unpack(t, hy, got, n);
      /* exp, the add and the divide each round once in the arithmetic type, then
       * the store rounds to t: 4 units of the arithmetic type plus one of t. */
      double tol = 4 * kt_unit(t == DT_F64 ? DT_F64 : DT_F32) + kt_unit(t);
      char what[64];
      snprintf(what, sizeof what, "silu %s n=%lld", dt_dtype_name(t), (long long)n);
      kt_close_to(what, got, want, n, tol);
      kt_free(T, dx, n * es);
      kt_free(T, dy, n * es);
      free(x), free(want), free(got), free(hx), free(hy);
    }
  }
  printf("pw.silu: f32, f64, bf16 x %d sizes\n", N_SIZES);
}

/* ---- pw.cast ---------------------------------------------------------------- */
/* The bf16 nearest to f (ties to even), by comparing the two neighbours. */
static double nearest_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
  float flo, fhi;
  memcpy(&flo, &lo, 4);
  memcpy(&fhi, &hi, 4);
  double dl = fabs((double)f - flo), dh = fabs((double)fhi - f);
  if (dl < dh) return flo;
  if (dh < dl) return fhi;
  return (lo >> 16) & 1 ? fhi : flo;
}

static void test_cast(kt_dev *T) {
  int64_t n = 100003;
  double *x = malloc(n * sizeof *x), *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
  kt_uniform(x, n, 11, 0, -3e3, 3e3);
  for (int si = 0; si < 3; si++) {
    for (int di = 0; di < 3; di++) {
      dt_dtype ts = ftypes[si], td = ftypes[di];
      void *hs = kt_pack(ts, x, n), *hd = malloc(n * dt_dtype_size(td));
      double *xs = malloc(n * sizeof *xs);
      kt_unpack(ts, hs, xs, n);
      for (int64_t i = 0; i < n; i++)
        want[i] = td == DT_F64 ? xs[i] : td == DT_F32 ? (double)(float)xs[i]
                                                      : nearest_bf16((float)xs[i]);
      void *ds = kt_up(T, hs, n * dt_dtype_size(ts)), *dd = kt_up(T, NULL, n * dt_dtype_size(td));
      TU_OK(T->ctx, T->K->pw->cast(T->dev, ts, ds, td, dd, n));
      kt_down(T, hd, dd, n * dt_dtype_size(td));
      kt_unpack(td, hd, got, n);
      char what[64];
      snprintf(what, sizeof what, "cast %s -> %s", dt_dtype_name(ts), dt_dtype_name(td));
      /* f64 -> bf16 goes through f32 (double rounding): allow that one unit. */
      kt_close_to(what, got, want, n, ts == DT_F64 && td == DT_BF16 ? kt_unit(DT_BF16) : 0);
      kt_free(T, ds, n * dt_dtype_size(ts));
      kt_free(T, dd, n * dt_dtype_size(td));
      free(hs), free(hd), free(xs);
    }
  }
  free(x), free(want), free(got);
  printf("pw.cast: every pair of f32, f64, bf16\n");
}

/* ---- the guards ------------------------------------------------------------ */
static void test_guards(kt_dev *T) {
#ifndef KERN_ON_CUDA
  /* A host pointer handed to an emulated kernel is refused, not dereferenced. */
  float h[4] = {1, 2, 3, 4};
  void *dy = kt_up(T, NULL, sizeof h);
  dt_status st = T->K->pw->silu(T->dev, DT_F32, 4, h, dy);
  TU_CHECK(st == DT_ERR_INVALID, "silu on a host pointer -> %s", dt_status_str(st));
  kt_free(T, dy, sizeof h);
  dt_error_clear(T->ctx);
#endif
  /* The comparison can say no: one value off by 8 units of f32, or a NaN. */
  double want[3] = {1, -2, 3e5}, got[3] = {1, -2, 3e5};
  got[2] *= 1 + 8 * kt_unit(DT_F32);
  TU_CHECK(kt_mismatch(got, want, 3, 4 * kt_unit(DT_F32)) == 2, "an 8-unit error passes 4 units");
  got[2] = want[2];
  got[0] = NAN;
  TU_CHECK(kt_mismatch(got, want, 3, 1) == 0, "a NaN passes");
}

int main(void) {
  dt_ctx ctx;
  dt_ctx_init(&ctx, 0, 1);
  kt_dev T;
#ifdef KERN_ON_CUDA
  int rc = kt_open(&T, &ctx, true);
#else
  int rc = kt_open(&T, &ctx, false);
#endif
  if (rc) {
    dt_ctx_release(&ctx);
    return rc;
  }
  test_silu(&T);
  test_cast(&T);
  test_guards(&T);
  TU_CHECK(ctx.mem.dev_cur == 0, "device bytes left: %zu", ctx.mem.dev_cur);
  kt_close(&T);
  dt_ctx_release(&ctx);
#ifdef KERN_ON_CUDA
  return tu_finish("test_kern_cuda");
#else
  return tu_finish("test_kern");
#endif
}
