/* lib/device/cpu/k_optim.c: the CPU device's optim kernels (AdamW): host loops
 * behind the dt_kern_optim slots of lib/device/kernels.h.
 *
 * One pass per element in f64 arithmetic, the update reading the unrounded
 * moments (torch/optim/adamw.py, _single_tensor_adamw: decoupled decay, then
 * the bias-corrected step), the same expression order as the CUDA kernel
 * (lib/device/kern/k_optim.cu). f32 and f64 without master weights, the common
 * case, run as plain loops over typed pointers; the mixed-precision forms
 * (another gradient dtype, f32 master weights behind a bf16 copy) go through
 * element loads and stores.
 *
 * On x86-64 CPUs with AVX2 the two plain loops run four elements at a time
 * (adamw_f32_avx2 / adamw_f64_avx2, chosen at run time by
 * __builtin_cpu_supports): the same f64 operations in the same order, each
 * lane IEEE-rounded as the scalar loop rounds it (mul, add, div and sqrt are
 * correctly rounded in both; no FMA: the target is avx2 alone and -std=c11
 * turns contraction off), so the results are bitwise those of the scalar loop
 * (verify/test_kern_optim_cpu checks it). The loop is bound by its f64 divide
 * and square root, which the vector units do four at a time. */
#include "config.h"

#include <math.h>

#include "device/kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define DT_ADAMW_AVX2 1

/* Constants of one call: W = W decay; M = b1 M + c1 G; V = b2 V + c2 G G;
 * W -= step M / (sqrt(V) / sbc2 + eps), with c1 = 1 - b1 and c2 = 1 - b2. */
typedef struct adamw_c {
  double b1, c1, b2, c2, step, sbc2, eps, decay;
} adamw_c;

/* Elements [0, n - n % 4) of the f32 loop below; returns where it stopped. */
__attribute__((target("avx2"))) static int64_t adamw_f32_avx2(int64_t n, float *W, float *M,
                                                                float *V, const float *G,
                                                                const adamw_c *c) {
  const __m256d b1 = _mm256_set1_pd(c->b1), c1 = _mm256_set1_pd(c->c1);
  const __m256d b2 = _mm256_set1_pd(c->b2), c2 = _mm256_set1_pd(c->c2);
  const __m256d step = _mm256_set1_pd(c->step), sbc2 = _mm256_set1_pd(c->sbc2);
  const __m256d eps = _mm256_set1_pd(c->eps), decay = _mm256_set1_pd(c->decay);
  int64_t e = 0;
  for (; e + 4 <= n; e += 4) {
    const __m256d g = _mm256_cvtps_pd(_mm_loadu_ps(G + e));
    const __m256d we = _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(W + e)), decay);
    const __m256d me = _mm256_add_pd(_mm256_mul_pd(b1, _mm256_cvtps_pd(_mm_loadu_ps(M + e))),
                                     _mm256_mul_pd(c1, g));
    const __m256d ve = _mm256_add_pd(_mm256_mul_pd(b2, _mm256_cvtps_pd(_mm_loadu_ps(V + e))),
                                     _mm256_mul_pd(_mm256_mul_pd(c2, g), g));
    const __m256d den = _mm256_add_pd(_mm256_div_pd(_mm256_sqrt_pd(ve), sbc2), eps);
    _mm_storeu_ps(M + e, _mm256_cvtpd_ps(me));
    _mm_storeu_ps(V + e, _mm256_cvtpd_ps(ve));
    _mm_storeu_ps(W + e, _mm256_cvtpd_ps(_mm256_sub_pd(we, _mm256_div_pd(_mm256_mul_pd(step, me), den))));
  }
  return e;
}

/* Elements [0, n - n % 4) of the f64 loop below; returns where it stopped. */
__attribute__((target("avx2"))) static int64_t adamw_f64_avx2(int64_t n, double *W, double *M,
                                                                double *V, const double *G,
                                                                const adamw_c *c) {
  const __m256d b1 = _mm256_set1_pd(c->b1), c1 = _mm256_set1_pd(c->c1);
  const __m256d b2 = _mm256_set1_pd(c->b2), c2 = _mm256_set1_pd(c->c2);
  const __m256d step = _mm256_set1_pd(c->step), sbc2 = _mm256_set1_pd(c->sbc2);
  const __m256d eps = _mm256_set1_pd(c->eps), decay = _mm256_set1_pd(c->decay);
  int64_t e = 0;
  for (; e + 4 <= n; e += 4) {
    const __m256d g = _mm256_loadu_pd(G + e);
    const __m256d w = _mm256_mul_pd(_mm256_loadu_pd(W + e), decay);
    const __m256d m = _mm256_add_pd(_mm256_mul_pd(b1, _mm256_loadu_pd(M + e)), _mm256_mul_pd(c1, g));
    const __m256d v = _mm256_add_pd(_mm256_mul_pd(b2, _mm256_loadu_pd(V + e)),
                                    _mm256_mul_pd(_mm256_mul_pd(c2, g), g));
    const __m256d den = _mm256_add_pd(_mm256_div_pd(_mm256_sqrt_pd(v), sbc2), eps);
    _mm256_storeu_pd(M + e, m);
    _mm256_storeu_pd(V + e, v);
    _mm256_storeu_pd(W + e, _mm256_sub_pd(w, _mm256_div_pd(_mm256_mul_pd(step, m), den)));
  }
  return e;
}

static bool have_avx2(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
}
#endif

static double ld(const void *p, dt_dtype t, int64_t i) {
  switch (t) {
    case DT_F64: return ((const double *)p)[i];
    case DT_F32: return ((const float *)p)[i];
    default: return dt_bf16_to_f32(((const dt_bf16 *)p)[i]);
  }
}

static void st(void *p, dt_dtype t, int64_t i, double v) {
  switch (t) {
    case DT_F64: ((double *)p)[i] = v; break;
    case DT_F32: ((float *)p)[i] = (float)v; break;
    default: ((dt_bf16 *)p)[i] = dt_f32_to_bf16((float)v); break;
  }
}

static bool floating(dt_dtype t) { return t == DT_F32 || t == DT_F64 || t == DT_BF16; }

static dt_status cpu_adamw(dt_device *d, int64_t n, dt_dtype stt, void *master, void *m, void *v,
                           dt_dtype gt, const void *g, dt_dtype wt, void *w,
                           const dt_kern_adamw_hp *hp) {
  static const char call[] = "kern.adamw";
  if (n == 0) return DT_OK;
  if (!hp || !m || !v || !g || !w) return dt_error(d->ctx, DT_ERR_INVALID, call, "NULL argument");
  if (stt != DT_F32 && stt != DT_F64)
    return dt_error(d->ctx, DT_ERR_UNSUPPORTED, call, "state dtype %s (f32 or f64)",
                    dt_dtype_name(stt));
  if (!floating(gt) || !floating(wt))
    return dt_error(d->ctx, DT_ERR_UNSUPPORTED, call, "gradient %s, weight %s", dt_dtype_name(gt),
                    dt_dtype_name(wt));
  if (!master && wt != stt)
    return dt_error(d->ctx, DT_ERR_INVALID, call, "a %s weight without a master copy in the state's %s",
                    dt_dtype_name(wt), dt_dtype_name(stt));
  const double b1 = hp->beta1, b2 = hp->beta2, eps = hp->eps;
  const double step = hp->lr / hp->bc1, sbc2 = sqrt(hp->bc2), decay = 1.0 - hp->lr * hp->weight_decay;
  if (!master && gt == stt && stt == DT_F64) {
    double *W = w, *M = m, *V = v;
    const double *G = g;
    int64_t e = 0;
#ifdef DT_ADAMW_AVX2
    const adamw_c c = {b1, 1 - b1, b2, 1 - b2, step, sbc2, eps, decay};
    if (have_avx2()) e = adamw_f64_avx2(n, W, M, V, G, &c);
#endif
    for (; e < n; e++) {
      W[e] *= decay;
      M[e] = b1 * M[e] + (1 - b1) * G[e];
      V[e] = b2 * V[e] + (1 - b2) * G[e] * G[e];
      W[e] -= step * M[e] / (sqrt(V[e]) / sbc2 + eps);
    }
    return DT_OK;
  }
  if (!master && gt == stt && stt == DT_F32) {
    float *W = w, *M = m, *V = v;
    const float *G = g;
    int64_t e = 0;
#ifdef DT_ADAMW_AVX2
    const adamw_c c = {b1, 1 - b1, b2, 1 - b2, step, sbc2, eps, decay};
    if (have_avx2()) e = adamw_f32_avx2(n, W, M, V, G, &c);
#endif
    for (; e < n; e++) {
      double we = W[e] * decay;
      double me = b1 * M[e] + (1 - b1) * G[e];
      double ve = b2 * V[e] + (1 - b2) * (double)G[e] * G[e];
      M[e] = (float)me;
      V[e] = (float)ve;
      W[e] = (float)(we - step * me / (sqrt(ve) / sbc2 + eps));
    }
    return DT_OK;
  }
  void *ms = master ? master : w;
  for (int64_t e = 0; e < n; e++) {
    const double ge = ld(g, gt, e);
    const double pe = ld(ms, stt, e) * decay;
    const double me = b1 * ld(m, stt, e) + (1 - b1) * ge;
    const double ve = b2 * ld(v, stt, e) + (1 - b2) * ge * ge;
    st(m, stt, e, me);
    st(v, stt, e, ve);
    st(ms, stt, e, pe - step * me / (sqrt(ve) / sbc2 + eps));
    if (master) st(w, wt, e, ld(ms, stt, e));
  }
  return DT_OK;
}

const dt_kern_optim dt_cpu_optim = {
    .adamw = cpu_adamw,
};
