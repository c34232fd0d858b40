/* lib/device/cpu/vmath.h: element access for the plain kernels (dt_elem_ld/st),
 * and f32 row primitives for the CPU kernels' hot loops (softmax,
 * SiLU / SwiGLU, cross-entropy), written on GCC / Clang 4-wide vector
 * extensions so they vectorise at -O2 on any x86-64 (SSE2) or AArch64 (NEON)
 * without -ffast-math or per-file flags. Private to the CPU device's kernels.
 *
 * dt_v4_exp: exp(x) in f32 by x = n ln2 + r (|r| <= ln2 / 2, ln2 split in two
 *   so n ln2 is exact to 2^-40), e^r by its degree-6 Taylor polynomial
 *   (truncation < 2^-24 on that range), 2^n from the exponent bits. Measured
 *   maximum relative error 2.5e-7 (2 f32 ulps) over [-87.3, 88.7]; below
 *   ln FLT_MIN it returns 0 (e^x is then subnormal), above ln FLT_MAX +inf;
 *   NaN stays NaN. About
 *   3x glibc's expf per element (1.1 vs 3.1 ns here), which is what the
 *   softmax and SiLU loops spend their time in.
 * dt_sum_f32: the sum of n floats in double, in four independent chains (a
 *   single chain waits on each add's latency).
 * dt_max_f32: the largest of n >= 1 floats (NaN-free input).
 * dt_v4_sigmoid: 1 / (1 + e^-a) on dt_v4_exp.
 * dt_dot_f32: sum of a[i] b[i] in double, four chains.
 * dt_scale_f32: x[i] *= s.
 */
#ifndef DT_CPU_VMATH_H
#define DT_CPU_VMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../../core/core.h"

/* Element i of an f32 or f64 host array, as double; and its store, rounded
 * once to the array's dtype (the plain kernels' loads and stores). */
static inline double dt_elem_ld(const dt_array *x, int64_t i) {
  return x->dtype == DT_F64 ? ((const double *)x->data)[i] : (double)((const float *)x->data)[i];
}
static inline void dt_elem_st(dt_array *y, int64_t i, double v) {
  if (y->dtype == DT_F64)
    ((double *)y->data)[i] = v;
  else
    ((float *)y->data)[i] = (float)v;
}

typedef float dt_v4f __attribute__((vector_size(16)));
typedef int32_t dt_v4i __attribute__((vector_size(16)));

static inline dt_v4f dt_v4_splat(float x) { return (dt_v4f){x, x, x, x}; }

static inline dt_v4f dt_v4_load(const float *p) {
  dt_v4f v;
  memcpy(&v, p, sizeof v);
  return v;
}
static inline void dt_v4_store(float *p, dt_v4f v) { memcpy(p, &v, sizeof v); }

/* The first n < 4 lanes from / to memory (the rest read as 0): a row's tail
 * goes through the same vector arithmetic as its body, so an element's value
 * does not depend on where a shard boundary puts it. */
static inline dt_v4f dt_v4_load_n(const float *p, int64_t n) {
  dt_v4f v = {0, 0, 0, 0};
  memcpy(&v, p, (size_t)n * sizeof *p);
  return v;
}
static inline void dt_v4_store_n(float *p, dt_v4f v, int64_t n) { memcpy(p, &v, (size_t)n * sizeof *p); }

/* m ? a : b, lane-wise (m: all-ones or zero lanes from a comparison) */
static inline dt_v4f dt_v4_select(dt_v4i m, dt_v4f a, dt_v4f b) {
  return (dt_v4f)(((dt_v4i)a & m) | ((dt_v4i)b & ~m));
}

static inline dt_v4f dt_v4_exp(dt_v4f x) {
  const dt_v4f lo = dt_v4_splat(-87.33f), hi = dt_v4_splat(88.72f); /* ln of FLT_MIN, FLT_MAX */
  dt_v4i under = x < lo, over = x > hi;
  dt_v4f c = dt_v4_select(under, lo, dt_v4_select(over, hi, x));
  const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
  dt_v4f n = (c * 1.44269504088896341f + magic) - magic;
  n = dt_v4_select(n == n, n, dt_v4_splat(0.0f)); /* NaN: no float -> int conversion of it */
  dt_v4f r = c - n * 0.693145751953125f; /* ln2's high part: 16 bits, n * it is exact */
  r = r - n * 1.42860682030941723212e-6f; /* ln2's low part */
  dt_v4f p = dt_v4_splat(1.0f / 720.0f);
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  /* 2^n for n in [-126, 128] as 2^h 2^(n-h), h = floor(n/2): both factors normal */
  dt_v4i ni = __builtin_convertvector(n, dt_v4i), h = ni >> 1;
  dt_v4i e1 = (h + 127) << 23, e2 = (ni - h + 127) << 23;
  dt_v4f y = p * (dt_v4f)e1 * (dt_v4f)e2;
  y = dt_v4_select(under, dt_v4_splat(0.0f), y);
  return dt_v4_select(over, dt_v4_splat(INFINITY), y);
}

/* 1 / (1 + e^-a), lane-wise (0 and 1 at the ends: e^-a overflows to inf, underflows to 0) */
static inline dt_v4f dt_v4_sigmoid(dt_v4f a) { return 1.0f / (1.0f + dt_v4_exp(-a)); }

/* y[i] = exp(x[i] - shift) for n elements; y may be x. */
static inline void dt_vexp_f32(float *y, const float *x, float shift, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) dt_v4_store(y + i, dt_v4_exp(dt_v4_load(x + i) - shift));
  if (i < n) dt_v4_store_n(y + i, dt_v4_exp(dt_v4_load_n(x + i, n - i) - shift), n - i);
}

static inline double dt_sum_f32(const float *x, int64_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += (double)x[i];
    s1 += (double)x[i + 1];
    s2 += (double)x[i + 2];
    s3 += (double)x[i + 3];
  }
  for (; i < n; i++) s0 += (double)x[i];
  return (s0 + s1) + (s2 + s3);
}

static inline float dt_max_f32(const float *x, int64_t n) {
  float m = x[0];
  int64_t i = 0;
  if (n >= 4) {
    dt_v4f v = dt_v4_load(x);
    for (i = 4; i + 4 <= n; i += 4) {
      dt_v4f w = dt_v4_load(x + i);
      v = dt_v4_select(w > v, w, v);
    }
    m = v[0];
    for (int k = 1; k < 4; k++) m = v[k] > m ? v[k] : m;
  }
  for (; i < n; i++) m = x[i] > m ? x[i] : m;
  return m;
}

static inline double dt_dot_f32(const float *a, const float *b, int64_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += (double)a[i] * (double)b[i];
    s1 += (double)a[i + 1] * (double)b[i + 1];
    s2 += (double)a[i + 2] * (double)b[i + 2];
    s3 += (double)a[i + 3] * (double)b[i + 3];
  }
  for (; i < n; i++) s0 += (double)a[i] * (double)b[i];
  return (s0 + s1) + (s2 + s3);
}

static inline void dt_scale_f32(float *x, float s, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) dt_v4_store(x + i, dt_v4_load(x + i) * s);
  for (; i < n; i++) x[i] *= s;
}

#endif
