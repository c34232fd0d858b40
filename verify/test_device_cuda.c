/* verify/test_device_cuda.c: the CUDA device ("cuda") against host references;
 * built with -DDEVICE_ON_EMU (test_device_emu) the same checks run on the
 * cuda-emu device, so machines without a GPU exercise them too.
 *
 * GEMM (f32/f64, bf16 with bf16 or f32 C, every transpose pair, odd shapes,
 * k = 0 and 1, m or n = 1, batches with gaps and a broadcast A, padded leading
 * dims) is compared with a naive triple loop in double on the host (on the
 * rounded inputs), and the CPU device runs the same cases as a second opinion. Fill, axpy and H2D/D2D/D2H copies are checked
 * bit for bit (axpy within a rounding bound), and the device-memory counters
 * must return to zero with the right peak.
 *
 * On cuda: exits 77 (SKIP) when this build has no CUDA or no GPU is visible.
 * It is not a benchmark and does not time anything.
 */
#include "config.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#ifdef DEVICE_ON_EMU
enum { ON_EMU = 1 };
#else
enum { ON_EMU = 0 };
#endif

/* One rank, one context: a test program may keep it global. */
static dt_ctx ctx;
static dt_device *gpu, *cpu;
/* What the device-memory counters must read: every GPU allocation of the test
 * goes through gpu_alloc/gpu_free, which keep these alongside. */
static size_t exp_cur, exp_peak;

static void *gpu_alloc(size_t bytes) {
  void *p = NULL;
  TU_OK(&ctx, dt_device_alloc(gpu, bytes, &p));
  if (!p) return NULL;
  exp_cur += bytes;
  if (exp_cur > exp_peak) exp_peak = exp_cur;
  TU_CHECK(ctx.mem.dev_cur == exp_cur, "dev_cur %zu after alloc, expected %zu", ctx.mem.dev_cur,
           exp_cur);
  return p;
}

static void gpu_free(void *p, size_t bytes) {
  if (!p) return;
  dt_device_free(gpu, p, bytes);
  exp_cur -= bytes;
  TU_CHECK(ctx.mem.dev_cur == exp_cur, "dev_cur %zu after free, expected %zu", ctx.mem.dev_cur,
           exp_cur);
}

/* Host buffers come from the CPU device (the counted host allocator). */
static void *host_alloc(size_t bytes) {
  void *p = NULL;
  TU_OK(&ctx, dt_device_alloc(cpu, bytes, &p));
  return p;
}
static void host_free(void *p) { dt_device_free(cpu, p, 0); }

static void *upload(const void *h, size_t bytes) {
  void *d = gpu_alloc(bytes);
  if (d) TU_OK(&ctx, dt_device_copy(gpu, d, h, bytes, DT_COPY_H2D));
  return d;
}

static double get(dt_dtype t, const void *p, int64_t i) {
  if (t == DT_BF16) return (double)dt_bf16_to_f32(((const dt_bf16 *)p)[i]);
  return t == DT_F32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}
static void set(dt_dtype t, void *p, int64_t i, double v) {
  if (t == DT_BF16) ((dt_bf16 *)p)[i] = dt_f32_to_bf16((float)v);
  else if (t == DT_F32) ((float *)p)[i] = (float)v;
  else ((double *)p)[i] = v;
}
/* The dtype of C in a GEMM description. */
static dt_dtype c_type(const dt_gemm_desc *g) { return g->c_f32 ? DT_F32 : g->dtype; }

/* ---- GEMM ------------------------------------------------------------------ */

typedef struct gemm_case {
  int64_t m, n, k, batch;
  int64_t pad;  /* extra elements per row of A, B and C (padded leading dims) */
  int64_t gap;  /* extra elements between batch matrices (strides > the matrix) */
  bool bcast_a; /* stride_a = 0: one A for the whole batch */
} gemm_case;

static const gemm_case gemm_cases[] = {
    {1, 1, 1, 1, 0, 0, false},      {5, 7, 3, 1, 0, 0, false},
    {7, 5, 1, 1, 3, 5, false},      /* k = 1, padded */
    {1, 9, 4, 3, 2, 7, false},      /* m = 1, batch */
    {6, 1, 5, 3, 1, 3, false},      /* n = 1, batch */
    {4, 3, 0, 2, 1, 2, false},      /* k = 0: C = beta C */
    {17, 13, 29, 3, 5, 11, false},  {12, 10, 8, 3, 2, 1, true}, /* broadcast A */
    {64, 48, 80, 1, 0, 0, false},   {33, 65, 127, 3, 4, 9, false},
    {130, 70, 300, 1, 7, 0, false},
};

/* alpha, beta pairs: general, negative, beta 0 (C is write-only: the GPU run
 * starts from NaN in C), beta 1. Exactly representable in f32. */
static const double gemm_scalars[][2] = {{0.75, -0.5}, {-1.25, 1.5}, {1.0, 0.0}, {0.5, 1.0}};

static double worst_gemm_ratio; /* max |err| / tol over all checked elements */

/* Checks C (total_c elements as stored) after a GEMM: matrix elements against the
 * double reference, everything else (padding, batch gaps) bit-identical to c0. */
static void check_gemm(const char *who, const char *label, const dt_gemm_desc *g, const void *a,
                       const void *b, const void *c0, const void *c, int64_t total_c) {
  dt_dtype t = g->dtype, ct = c_type(g);
  size_t es = dt_dtype_size(ct);
  /* Error bound. Inputs are exact in the dtype, so the only errors are roundings
   * in the k-term dot product and the alpha/beta update: for any summation order
   * (cuBLAS may split k), |fl - exact| <= gamma_{k+2} * mag with
   * mag = |alpha| sum_p |a_ip||b_pj| + |beta||c_ij| and gamma_j ~ j * u,
   * u = eps/2. We allow (k+2) * eps (twice the bound), plus (k+2) * 2^-52 for
   * the rounding of the double reference itself (it matters for f64).
   * bf16 accumulates in f32 (eps = 2^-23: products of two bf16 values are
   * exact in f32, so the k-term bound is the f32 one) and a bf16 C adds one
   * rounding of the f32 result to bf16: u_bf16 = 2^-8 times its magnitude,
   * which is at most |ref| + the f32 error. */
  double eps = t == DT_F64 ? 0x1p-52 : 0x1p-23;
  double rel = (double)(g->k + 2) * (eps + 0x1p-52);
  double out_u = ct == DT_BF16 ? 0x1p-8 : 0.0;
  char *seen = calloc((size_t)total_c, 1);
  int64_t wrong = 0, worst_i = -1;
  double worst = 0, worst_got = 0, worst_ref = 0;
  for (int64_t bb = 0; bb < g->batch; bb++) {
    const int64_t oa = bb * g->stride_a, ob = bb * g->stride_b, oc = bb * g->stride_c;
    for (int64_t i = 0; i < g->m; i++) {
      for (int64_t j = 0; j < g->n; j++) {
        double s = 0, mag = 0;
        for (int64_t p = 0; p < g->k; p++) {
          double x = get(t, a, oa + (g->trans_a ? p * g->lda + i : i * g->lda + p));
          double y = get(t, b, ob + (g->trans_b ? j * g->ldb + p : p * g->ldb + j));
          s += x * y;
          mag += fabs(x * y);
        }
        int64_t ci = oc + i * g->ldc + j;
        double cin = g->beta == 0.0 ? 0.0 : get(ct, c0, ci);
        double ref = g->alpha * s + g->beta * cin;
        mag = fabs(g->alpha) * mag + fabs(g->beta * cin);
        double tol = rel * mag + out_u * (fabs(ref) + rel * mag) + 1e-300;
        double got = get(ct, c, ci), err = fabs(got - ref);
        if (seen) seen[ci] = 1;
        if (!(err <= tol)) wrong++; /* NaN counts as wrong */
        double ratio = err / tol;
        if (isnan(ratio) || ratio > worst) {
          worst = ratio;
          worst_i = ci;
          worst_got = got;
          worst_ref = ref;
        }
      }
    }
  }
  int64_t clobbered = 0, first_clobbered = -1;
  for (int64_t i = 0; seen && i < total_c; i++) {
    if (seen[i]) continue;
    if (memcmp((const char *)c + (size_t)i * es, (const char *)c0 + (size_t)i * es, es) != 0) {
      if (clobbered++ == 0) first_clobbered = i;
    }
  }
  free(seen);
  if (isnan(worst) || worst > worst_gemm_ratio) worst_gemm_ratio = worst;
  TU_CHECK(wrong == 0, "%s gemm %s: %lld wrong; worst at C[%lld]: got %.17g ref %.17g (err/tol %g)",
           who, label, (long long)wrong, (long long)worst_i, worst_got, worst_ref, worst);
  TU_CHECK(clobbered == 0, "%s gemm %s: %lld elements outside the matrices changed (first C[%lld])",
           who, label, (long long)clobbered, (long long)first_clobbered);
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

static void test_gemm_one(dt_dtype t, bool c_f32, bool ta, bool tb, const gemm_case *gc,
                          double alpha, double beta, uint64_t seed) {
  const int64_t m = gc->m, n = gc->n, k = gc->k;
  const int64_t a_rows = ta ? k : m, a_cols = ta ? m : k;
  const int64_t b_rows = tb ? n : k, b_cols = tb ? k : n;
  dt_gemm_desc g = {.dtype = t, .trans_a = ta, .trans_b = tb, .m = m, .n = n, .k = k,
                    .alpha = alpha, .beta = beta, .batch = gc->batch, .c_f32 = c_f32};
  const dt_dtype ct = c_type(&g);
  g.lda = max64(a_cols, 1) + gc->pad;
  g.ldb = max64(b_cols, 1) + 2 * gc->pad; /* different pads per operand */
  g.ldc = max64(n, 1) + gc->pad + (gc->pad ? 1 : 0);
  const int64_t mat_a = a_rows * g.lda, mat_b = b_rows * g.ldb, mat_c = m * g.ldc;
  g.stride_a = gc->bcast_a ? 0 : mat_a + gc->gap;
  g.stride_b = mat_b + gc->gap + 1;
  g.stride_c = mat_c + gc->gap;
  const int64_t total_a = max64((gc->batch - 1) * g.stride_a + mat_a, 1);
  const int64_t total_b = max64((gc->batch - 1) * g.stride_b + mat_b, 1);
  const int64_t total_c = max64((gc->batch - 1) * g.stride_c + mat_c, 1);
  const size_t es = dt_dtype_size(t);
  const size_t bytes_a = (size_t)total_a * es, bytes_b = (size_t)total_b * es,
               bytes_c = (size_t)total_c * dt_dtype_size(ct);

  char label[160];
  snprintf(label, sizeof label,
           "%s%s ta=%d tb=%d m=%lld n=%lld k=%lld batch=%lld lda=%lld ldb=%lld ldc=%lld%s "
           "alpha=%g beta=%g",
           dt_dtype_name(t), c_f32 ? "->f32" : "", ta, tb, (long long)m, (long long)n, (long long)k,
           (long long)gc->batch, (long long)g.lda, (long long)g.ldb, (long long)g.ldc,
           gc->bcast_a ? " bcastA" : "", alpha, beta);

  void *ha = host_alloc(bytes_a), *hb = host_alloc(bytes_b), *hc0 = host_alloc(bytes_c);
  void *hin = host_alloc(bytes_c), *hout = host_alloc(bytes_c), *hcpu = host_alloc(bytes_c);
  if (!ha || !hb || !hc0 || !hin || !hout || !hcpu) goto out_host;
  /* Uniform in [-1, 1): signs mix, so the bound's mag is not the |result|. */
  TU_OK(&ctx, dt_rng_fill(t, ha, total_a, seed, 1, 0, 1, DT_RNG_UNIFORM, -1.0, 2.0));
  TU_OK(&ctx, dt_rng_fill(t, hb, total_b, seed, 2, 0, 1, DT_RNG_UNIFORM, -1.0, 2.0));
  TU_OK(&ctx, dt_rng_fill(ct, hc0, total_c, seed, 3, 0, 1, DT_RNG_UNIFORM, -1.0, 2.0));
  memcpy(hin, hc0, bytes_c);
  if (beta == 0.0) /* C is write-only when beta is 0: NaN in it must not leak */
    for (int64_t bb = 0; bb < gc->batch; bb++)
      for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) set(ct, hin, bb * g.stride_c + i * g.ldc + j, NAN);

  void *da = upload(ha, bytes_a), *db = upload(hb, bytes_b), *dc = upload(hin, bytes_c);
  if (da && db && dc) {
    g.a = da;
    g.b = db;
    g.c = dc;
    TU_OK(&ctx, dt_device_gemm(gpu, &g));
    TU_OK(&ctx, dt_device_sync(gpu));
    memset(hout, 0xff, bytes_c);
    TU_OK(&ctx, dt_device_copy(gpu, hout, dc, bytes_c, DT_COPY_D2H));
    check_gemm(gpu->ops->name, label, &g, ha, hb, hc0, hout, total_c);
  }
  gpu_free(da, bytes_a);
  gpu_free(db, bytes_b);
  gpu_free(dc, bytes_c);

  /* The CPU device on the same case (finite C): a second, independent opinion. */
  memcpy(hcpu, hc0, bytes_c);
  g.a = ha;
  g.b = hb;
  g.c = hcpu;
  TU_OK(&ctx, dt_device_gemm(cpu, &g));
  check_gemm("cpu", label, &g, ha, hb, hc0, hcpu, total_c);

out_host:
  host_free(ha);
  host_free(hb);
  host_free(hc0);
  host_free(hin);
  host_free(hout);
  host_free(hcpu);
}

static void test_gemm(void) {
  /* f32, f64, bf16 with a bf16 C, bf16 with an f32 C */
  const dt_dtype types[] = {DT_F32, DT_F64, DT_BF16, DT_BF16};
  const bool c_f32[] = {false, false, false, true};
  const size_t ncases = sizeof gemm_cases / sizeof gemm_cases[0];
  int runs = 0;
  uint64_t seed = 1000;
  for (int ti = 0; ti < 4; ti++)
    for (size_t c = 0; c < ncases; c++)
      for (int tr = 0; tr < 4; tr++) {
        /* each shape sees every (alpha, beta) pair across its four transposes */
        const double *s = gemm_scalars[(c + (size_t)tr) % 4];
        test_gemm_one(types[ti], c_f32[ti], tr & 1, (tr >> 1) & 1, &gemm_cases[c], s[0], s[1],
                      seed++);
        runs++;
      }
  printf("gemm: %d cases on %s and cpu, worst err/tol %.3g\n", runs, gpu->ops->name,
         worst_gemm_ratio);

  /* c_f32 is for bf16 inputs only; i64 has no GEMM. */
  float dummy[4] = {0};
  dt_gemm_desc g = {.dtype = DT_F32, .m = 1, .n = 1, .k = 1, .alpha = 1, .a = dummy, .lda = 1,
                    .b = dummy, .ldb = 1, .c = dummy, .ldc = 1, .batch = 1, .c_f32 = true};
  TU_CHECK(dt_device_gemm(gpu, &g) == DT_ERR_INVALID, "c_f32 with f32 inputs is rejected");
  g.c_f32 = false;
  g.dtype = DT_I64;
  TU_CHECK(dt_device_gemm(gpu, &g) == DT_ERR_UNSUPPORTED, "i64 gemm via the front");
}

/* ---- fill ------------------------------------------------------------------- */

/* The fill stages at most 1 MiB on the host (CUDA_FILL_STAGE_BYTES in
 * device_cuda.c); sizes of 1, 2 and 3+ MiB cover one chunk, whole doublings and
 * a ragged last copy. */
enum { STAGE = 1 << 20, GUARD = 3 };

static void test_fill(void) {
  const dt_dtype types[] = {DT_F32, DT_F64, DT_BF16};
  const double values[] = {0.0, -0.0, 3.25, -1.0e-3, 1.0e30};
  int runs = 0;
  for (int ti = 0; ti < 3; ti++) {
    const dt_dtype t = types[ti];
    const size_t es = dt_dtype_size(t);
    const int64_t sizes[] = {1, 1000, (int64_t)(STAGE / es), (int64_t)(2 * STAGE / es),
                             (int64_t)(3 * STAGE / es) + 7};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
      const int64_t n = sizes[si];
      const size_t bytes = (size_t)(n + 2 * GUARD) * es;
      unsigned char *h = host_alloc(bytes);
      void *d = gpu_alloc(bytes);
      for (size_t vi = 0; h && d && vi < sizeof values / sizeof values[0]; vi++) {
        const double v = values[vi];
        unsigned char pat[8];
        if (t == DT_F32) { float f = (float)v; memcpy(pat, &f, 4); }
        else if (t == DT_F64) memcpy(pat, &v, 8);
        else { dt_bf16 hb = dt_f32_to_bf16((float)v); memcpy(pat, &hb, 2); }
        memset(h, 0xa5, bytes); /* sentinel around (and under) the filled range */
        TU_OK(&ctx, dt_device_copy(gpu, d, h, bytes, DT_COPY_H2D));
        /* an offset pointer: the fill starts GUARD elements into the buffer */
        TU_OK(&ctx, dt_device_fill(gpu, t, (char *)d + GUARD * es, n, v));
        memset(h, 0, bytes);
        TU_OK(&ctx, dt_device_copy(gpu, h, d, bytes, DT_COPY_D2H));
        int64_t bad = 0, first = -1;
        for (int64_t i = 0; i < n + 2 * GUARD; i++) {
          const unsigned char *e = h + (size_t)i * es;
          bool inside = i >= GUARD && i < n + GUARD, ok = true;
          for (size_t b = 0; b < es; b++) ok = ok && e[b] == (inside ? pat[b] : 0xa5);
          if (!ok && bad++ == 0) first = i - GUARD;
        }
        TU_CHECK(bad == 0, "fill %s n=%lld value=%g: %lld elements wrong (first at %lld)",
                 dt_dtype_name(t), (long long)n, v, (long long)bad, (long long)first);
        runs++;
      }
      gpu_free(d, bytes);
      host_free(h);
    }
  }
  printf("fill: %d cases\n", runs);
}

/* ---- axpy -------------------------------------------------------------------- */

static void test_axpy(void) {
  const dt_dtype types[] = {DT_F32, DT_F64, DT_BF16};
  const int64_t sizes[] = {1, 1000, (1 << 20) + 3};
  const double alphas[] = {-1.75, 0.5, 3.0e-3};
  int runs = 0;
  for (int ti = 0; ti < 3; ti++) {
    const dt_dtype t = types[ti];
    const size_t es = dt_dtype_size(t);
    /* y + alpha x rounds at most twice in the dtype (product, sum; once with
     * FMA): |err| <= eps * (|alpha x| + |y|). The double reference adds up to
     * two roundings of 2^-53 each; 2 eps covers both for f32 and f64. bf16
     * computes in f32 (those two f32 roundings) and rounds y once to bf16
     * (2^-8 of the result, itself at most |alpha x| + |y|). */
    const double tol_rel = t == DT_BF16 ? 0x1p-8 + 2.0 * 0x1p-23
                                        : 2.0 * (t == DT_F32 ? 0x1p-23 : 0x1p-52);
    for (size_t si = 0; si < 3; si++)
      for (size_t ai = 0; ai < 3; ai++) {
        const int64_t n = sizes[si];
        const double alpha = alphas[ai];
        const size_t bytes = (size_t)n * es;
        void *hx = host_alloc(bytes), *hy = host_alloc(bytes), *hr = host_alloc(bytes);
        void *hx2 = host_alloc(bytes);
        if (!hx || !hy || !hr || !hx2) goto next;
        TU_OK(&ctx, dt_rng_fill(t, hx, n, 77 + si, 4, 0, 1, DT_RNG_NORMAL, 0.0, 1.0));
        TU_OK(&ctx, dt_rng_fill(t, hy, n, 77 + si, 5, 0, 1, DT_RNG_NORMAL, 0.0, 1.0));
        void *dx = upload(hx, bytes), *dy = upload(hy, bytes);
        if (dx && dy) {
          TU_OK(&ctx, dt_device_axpy(gpu, t, n, alpha, dx, dy));
          TU_OK(&ctx, dt_device_copy(gpu, hr, dy, bytes, DT_COPY_D2H));
          TU_OK(&ctx, dt_device_copy(gpu, hx2, dx, bytes, DT_COPY_D2H));
          /* alpha as the device sees it: f32 arithmetic takes (float)alpha */
          const double a = t != DT_F64 ? (double)(float)alpha : alpha;
          int64_t bad = 0, first = -1;
          for (int64_t i = 0; i < n; i++) {
            double x = get(t, hx, i), y = get(t, hy, i), ref = a * x + y;
            double err = fabs(get(t, hr, i) - ref);
            if (!(err <= tol_rel * (fabs(a * x) + fabs(y))) && bad++ == 0) first = i;
          }
          TU_CHECK(bad == 0, "axpy %s n=%lld alpha=%g: %lld wrong (first at %lld)",
                   dt_dtype_name(t), (long long)n, alpha, (long long)bad, (long long)first);
          TU_CHECK(memcmp(hx, hx2, bytes) == 0, "axpy %s n=%lld changed x", dt_dtype_name(t),
                   (long long)n);
        }
        gpu_free(dx, bytes);
        gpu_free(dy, bytes);
        runs++;
      next:
        host_free(hx);
        host_free(hy);
        host_free(hr);
        host_free(hx2);
      }
  }
  /* indices are never summed */
  void *d = gpu_alloc(32);
  if (d) TU_CHECK(dt_device_axpy(gpu, DT_I64, 4, 1.0, d, d) == DT_ERR_UNSUPPORTED, "i64 axpy");
  gpu_free(d, 32);
  printf("axpy: %d cases\n", runs);
}

/* ---- copy --------------------------------------------------------------------- */

static void test_copy(void) {
  const size_t sizes[] = {1, 7, 4096 + 3, ((size_t)1 << 22) + 5};
  for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
    const size_t n = sizes[si];
    unsigned char *src = host_alloc(n), *dst = host_alloc(n), *hh = host_alloc(n);
    /* one byte of offset: copies need not be aligned */
    unsigned char *d1 = gpu_alloc(n + 1), *d2 = gpu_alloc(n + 1);
    if (src && dst && hh && d1 && d2) {
      uint32_t x = 2463534242u ^ (uint32_t)n; /* xorshift32: bytes with every value */
      for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        src[i] = (unsigned char)x;
      }
      memset(dst, 0, n);
      TU_OK(&ctx, dt_device_copy(gpu, d1 + 1, src, n, DT_COPY_H2D));
      TU_OK(&ctx, dt_device_copy(gpu, d2, d1 + 1, n, DT_COPY_D2D));
      /* no sync: D2H must be ordered after the queued D2D on the device's stream */
      TU_OK(&ctx, dt_device_copy(gpu, dst, d2, n, DT_COPY_D2H));
      TU_CHECK(memcmp(src, dst, n) == 0, "copy round trip H2D/D2D/D2H of %zu bytes differs", n);
      memset(hh, 0, n);
      TU_OK(&ctx, dt_device_copy(gpu, hh, src, n, DT_COPY_H2H));
      TU_CHECK(memcmp(src, hh, n) == 0, "H2H copy of %zu bytes on the cuda device differs", n);
    }
    gpu_free(d1, n + 1);
    gpu_free(d2, n + 1);
    host_free(src);
    host_free(dst);
    host_free(hh);
  }
  printf("copy: %zu sizes\n", sizeof sizes / sizeof sizes[0]);
}

/* ---- memory accounting and errors ------------------------------------------------ */

static void test_memory(void) {
  TU_CHECK(ctx.mem.dev_cur == 0 && ctx.mem.dev_peak == 0, "fresh ctx: dev_cur %zu dev_peak %zu",
           ctx.mem.dev_cur, ctx.mem.dev_peak);
  void *a = gpu_alloc(1000), *b = gpu_alloc(3000); /* peak 4000 */
  gpu_free(a, 1000);
  void *c = gpu_alloc(500), *z = gpu_alloc(0); /* 3500; zero bytes: a unique pointer */
  TU_CHECK(z != NULL && z != b && z != c, "alloc(0) gives a unique non-NULL pointer");
  TU_CHECK(ctx.mem.dev_cur == 3500, "dev_cur %zu, expected 3500", ctx.mem.dev_cur);
  TU_CHECK(ctx.mem.dev_peak == 4000, "dev_peak %zu, expected 4000", ctx.mem.dev_peak);
  gpu_free(b, 3000);
  gpu_free(c, 500);
  gpu_free(z, 0);
  TU_CHECK(ctx.mem.dev_cur == 0, "dev_cur %zu after freeing all", ctx.mem.dev_cur);

  /* An impossible request is DT_ERR_NOMEM with a message, changes no counter, and
   * leaves no sticky CUDA error behind: the next allocation works. */
  void *huge = (void *)&huge;
  dt_error_clear(&ctx);
  dt_status st = dt_device_alloc(gpu, (size_t)1 << 60, &huge);
  TU_CHECK(st == DT_ERR_NOMEM, "2^60-byte alloc -> %s, expected out of memory", dt_status_str(st));
  TU_CHECK(huge == NULL, "failed alloc leaves *out NULL");
  TU_CHECK(dt_last_error(&ctx)[0] != '\0', "failed alloc records a message");
  TU_CHECK(ctx.mem.dev_cur == 0 && ctx.mem.dev_peak == 4000, "failed alloc changed the counters");
  void *after = gpu_alloc(64);
  TU_CHECK(after != NULL, "alloc after a failed alloc");
  if (after) TU_OK(&ctx, dt_device_fill(gpu, DT_F32, after, 16, 1.0));
  TU_OK(&ctx, dt_device_sync(gpu));
  gpu_free(after, 64);
  printf("memory: counters and out-of-memory checked\n");
}

static void test_handles(int count) {
  TU_CHECK(gpu->kind == DT_DEV_CUDA, "kind %d", (int)gpu->kind);
  TU_CHECK(gpu->ops && strcmp(gpu->ops->name, ON_EMU ? "cuda-emu" : "cuda") == 0, "ops name");
  TU_CHECK(gpu->ctx == &ctx, "device ctx");
  if (ON_EMU) return; /* ordinals and second handles are the cuda device's */
  dt_device *bad = (dt_device *)&bad;
  TU_CHECK(dt_device_cuda_create(&ctx, count, &bad) == DT_ERR_INVALID && bad == NULL,
           "ordinal %d of %d is invalid", count, count);
  TU_CHECK(dt_device_cuda_create(&ctx, -1, &bad) == DT_ERR_INVALID, "ordinal -1 is invalid");

  /* A second handle (the last GPU; the same one on a one-GPU host, as two ranks
   * of the threads backend would share it) works next to the first. */
  dt_device *g2 = NULL;
  TU_OK(&ctx, dt_device_cuda_create(&ctx, count - 1, &g2));
  if (!g2) return;
  float h[5] = {0};
  void *d = NULL;
  TU_OK(&ctx, dt_device_alloc(g2, sizeof h, &d));
  if (d) { /* same ctx: its bytes count in the same counters */
    exp_cur += sizeof h;
    if (exp_cur > exp_peak) exp_peak = exp_cur;
    TU_OK(&ctx, dt_device_fill(g2, DT_F32, d, 5, -2.5));
    TU_OK(&ctx, dt_device_copy(g2, h, d, sizeof h, DT_COPY_D2H));
    for (int i = 0; i < 5; i++) TU_CHECK(h[i] == -2.5f, "second handle fill [%d] = %g", i, h[i]);
    dt_device_free(g2, d, sizeof h);
    exp_cur -= sizeof h;
  }
  dt_device_destroy(g2);
  TU_CHECK(ctx.mem.dev_cur == exp_cur, "second handle left dev_cur %zu", ctx.mem.dev_cur);
}

static void run_all(int count) {
  test_memory();
  test_handles(count);
  test_copy();
  test_fill();
  test_axpy();
  test_gemm();

  TU_CHECK(ctx.mem.dev_cur == 0, "dev_cur %zu at the end, expected 0", ctx.mem.dev_cur);
  TU_CHECK(ctx.mem.dev_peak == exp_peak, "dev_peak %zu, expected %zu", ctx.mem.dev_peak, exp_peak);
  printf("memory: dev_peak %zu bytes, dev_cur %zu at the end\n", ctx.mem.dev_peak, ctx.mem.dev_cur);
}

int main(void) {
  if (ON_EMU) {
    dt_ctx_init(&ctx, 0, 1);
    TU_OK(&ctx, dt_device_cuda_emu_create(&ctx, &gpu));
    TU_OK(&ctx, dt_device_cpu_create(&ctx, &cpu));
    if (gpu && cpu) run_all(0);
    dt_device_destroy(gpu);
    dt_device_destroy(cpu);
    dt_ctx_release(&ctx);
    return tu_finish("test_device_emu");
  }
  if (!dt_device_cuda_built()) {
    printf("SKIP: this build has no CUDA (configure --with-cuda)\n");
    return SB_SKIP;
  }
  const int count = dt_device_cuda_count();
  dt_ctx_init(&ctx, 0, 1);
  /* With no GPU, create still runs: its message says why (no device, old driver). */
  dt_status st = dt_device_cuda_create(&ctx, 0, &gpu);
  if (count == 0 || st == DT_ERR_NODEVICE) {
    printf("SKIP: CUDA is built but no GPU is usable (%d visible): %s\n", count,
           st != DT_OK ? dt_last_error(&ctx) : "");
    dt_device_destroy(gpu);
    dt_ctx_release(&ctx);
    return SB_SKIP;
  }
  TU_OK(&ctx, st);
  TU_OK(&ctx, dt_device_cpu_create(&ctx, &cpu));
  if (!gpu || !cpu) {
    dt_device_destroy(gpu);
    dt_device_destroy(cpu);
    dt_ctx_release(&ctx);
    return tu_finish("test_device_cuda");
  }
  printf("cuda: %d GPU(s) visible; testing GPU 0\n", count);
  run_all(count);

  dt_device_destroy(gpu);
  dt_device_destroy(cpu);
  dt_ctx_release(&ctx);
  return tu_finish("test_device_cuda");
}
