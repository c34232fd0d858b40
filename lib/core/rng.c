/* lib/core/rng.c: the sharding-invariant counter RNG (Philox4x32-10, Salmon et al.,
 * "Parallel random numbers: as easy as 1, 2, 3", SC'11).
 *
 * The value of element `index` of stream (seed, stream) is a pure function of
 * those three numbers: counter = (index, stream), key = seed. Any rank generates
 * exactly the elements of its shard, and every layout, including the unsharded
 * reference, sees the same global tensor. Not a cryptographic generator. */
#include "config.h"

#include <math.h>

#include "core/core.h"

/* Philox4x32 multipliers and Weyl key increments from the paper (Random123). */
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void dt_philox4x32(uint64_t seed, uint64_t stream, uint64_t index, uint32_t out[4]) {
  uint32_t c0 = (uint32_t)index, c1 = (uint32_t)(index >> 32);
  uint32_t c2 = (uint32_t)stream, c3 = (uint32_t)(stream >> 32);
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int r = 0; r < 10; r++) {
    uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
    uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
    uint32_t n1 = (uint32_t)p1;
    uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    uint32_t n3 = (uint32_t)p0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += PHILOX_W0;
    k1 += PHILOX_W1;
  }
  out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

/* 53 random bits -> [0, 1). */
static double u53(uint32_t hi, uint32_t lo) {
  uint64_t v = ((uint64_t)hi << 21) ^ (uint64_t)(lo >> 11);
  return (double)(v & ((1ull << 53) - 1)) * 0x1.0p-53;
}

double dt_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  uint32_t o[4];
  dt_philox4x32(seed, stream, index, o);
  return u53(o[0], o[1]);
}

double dt_rng_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  uint32_t o[4];
  dt_philox4x32(seed, stream, index, o);
  double u1 = 1.0 - u53(o[0], o[1]); /* (0, 1]: log stays finite */
  double u2 = u53(o[2], o[3]);
  /* Box-Muller, cosine branch only: one normal per counter keeps element i a
   * function of i alone. */
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2);
}

dt_status dt_rng_fill(dt_dtype dtype, void *out, int64_t n, uint64_t seed, uint64_t stream,
                      uint64_t first, uint64_t stride, dt_rng_dist dist, double a, double b) {
  if (n < 0 || (n > 0 && !out)) return DT_ERR_INVALID;
  if (dist != DT_RNG_UNIFORM && dist != DT_RNG_NORMAL) return DT_ERR_INVALID;
  for (int64_t i = 0; i < n; i++) {
    uint64_t idx = first + (uint64_t)i * stride;
    double r = dist == DT_RNG_UNIFORM ? dt_rng_uniform(seed, stream, idx)
                                      : dt_rng_normal(seed, stream, idx);
    double v = a + b * r;
    switch (dtype) {
      case DT_F32: ((float *)out)[i] = (float)v; break;
      case DT_F64: ((double *)out)[i] = v; break;
      case DT_BF16: ((dt_bf16 *)out)[i] = dt_f32_to_bf16((float)v); break;
      default: return DT_ERR_INVALID;
    }
  }
  return DT_OK;
}
