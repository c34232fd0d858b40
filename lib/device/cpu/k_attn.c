/* lib/device/cpu/k_attn.c: the CPU device's attn kernels (attention): host loops
 * behind the dt_kern_attn slots of lib/device/kernels.h.
 *
 * These are the row loops sdpa and sdpa_cp have always run between their
 * GEMMs, one score row at a time: f64 in plain loops with exp; f32 on the
 * vector primitives of vmath.h (its exp within 2 ulps, 3x expf: these rows are
 * most of the attention time outside the GEMMs), with the sums and dot
 * products in double. The running statistics m, l and D are f64 for every
 * dtype (stats_f64). Blocking: 64 query rows per block, one head per GEMM
 * (batching buys nothing on the host and would multiply the scratch), no
 * scratch bound (a block's scratch is 64 x S scores). */
#include "config.h"

#include <math.h>
#include <string.h>

#include "device/kernels.h"
#include "device/cpu/vmath.h"

static dt_status bad_geo(dt_device *d, const char *call, const dt_attn_rows *g) {
  if (!g) return dt_error(d->ctx, DT_ERR_INVALID, call, "NULL geometry");
  return dt_error(d->ctx, DT_ERR_INVALID, call,
                  "geometry batch %lld rows %lld nk %lld ld %lld stride %lld", (long long)g->batch,
                  (long long)g->rows, (long long)g->nk, (long long)g->ld, (long long)g->stride);
}

static bool geo_ok(const dt_attn_rows *g) {
  return g && g->batch >= 0 && g->rows >= 0 && g->nk >= 0 && g->ld >= g->nk &&
         (g->batch <= 1 || g->stride >= g->rows * g->ld);
}

/* f32 and f64 only: bf16 host arrays reach the ops as f32 (the dispatcher
 * converts them), so bf16 scores never come here. */
static dt_status float_only(dt_device *d, const char *call, dt_dtype t) {
  if (t == DT_F32 || t == DT_F64) return DT_OK;
  return dt_error(d->ctx, DT_ERR_UNSUPPORTED, call, "%s scores: the CPU's attn kernels take f32 and f64",
                  dt_dtype_name(t));
}

/* Keys row r sees. */
static int64_t visible(const dt_attn_rows *g, int64_t r) {
  int64_t c = g->vis0 + r;
  return c < 0 ? 0 : c < g->nk ? c : g->nk;
}

/* Element offset of row r of block b in the scores, and of its statistics. */
static int64_t row_at(const dt_attn_rows *g, int64_t b, int64_t r) { return b * g->stride + r * g->ld; }
static int64_t stat_at(const dt_attn_rows *g, int64_t b, int64_t r) {
  return b * g->sstride + r * g->sld;
}

/* ---- softmax -------------------------------------------------------------------- */

static void softmax_row_double(double *row, int64_t cnt, int64_t nk) {
  if (cnt > 0) {
    double mx = row[0], z = 0;
    for (int64_t j = 1; j < cnt; j++) mx = row[j] > mx ? row[j] : mx;
    for (int64_t j = 0; j < cnt; j++) {
      row[j] = exp(row[j] - mx);
      z += row[j];
    }
    double inv = 1.0 / z;
    for (int64_t j = 0; j < cnt; j++) row[j] *= inv;
  }
  for (int64_t j = cnt; j < nk; j++) row[j] = 0;
}

static void softmax_row_float(float *row, int64_t cnt, int64_t nk) {
  if (cnt > 0) {
    float mx = dt_max_f32(row, cnt);
    dt_vexp_f32(row, row, mx, cnt);
    dt_scale_f32(row, (float)(1.0 / dt_sum_f32(row, cnt)), cnt);
  }
  memset(row + cnt, 0, (size_t)(nk - cnt) * sizeof *row);
}

static dt_status cpu_softmax(dt_device *d, dt_dtype t, const dt_attn_rows *g, void *P) {
  static const char c[] = "kern.attn_softmax";
  if (!geo_ok(g)) return bad_geo(d, c, g);
  DT_CHECK(float_only(d, c, t));
  for (int64_t b = 0; b < g->batch; b++)
    for (int64_t r = 0; r < g->rows; r++) {
      int64_t o = row_at(g, b, r), cnt = visible(g, r);
      if (t == DT_F32) softmax_row_float((float *)P + o, cnt, g->nk);
      else softmax_row_double((double *)P + o, cnt, g->nk);
    }
  return DT_OK;
}

/* ---- softmax backward: dS = P (dP - rowsum(dP P)) ----------------------------------- */

static dt_status cpu_softmax_bwd(dt_device *d, dt_dtype t, const dt_attn_rows *g, const void *P,
                                 void *dP) {
  static const char c[] = "kern.attn_softmax_bwd";
  if (!geo_ok(g)) return bad_geo(d, c, g);
  DT_CHECK(float_only(d, c, t));
  for (int64_t b = 0; b < g->batch; b++)
    for (int64_t r = 0; r < g->rows; r++) {
      int64_t o = row_at(g, b, r), cnt = visible(g, r), nk = g->nk;
      if (t == DT_F32) {
        const float *p = (const float *)P + o;
        float *dr = (float *)dP + o, rs = (float)dt_dot_f32(dr, p, cnt);
        int64_t j = 0;
        for (; j + 4 <= cnt; j += 4) dt_v4_store(dr + j, dt_v4_load(p + j) * (dt_v4_load(dr + j) - rs));
        for (; j < cnt; j++) dr[j] = p[j] * (dr[j] - rs);
        memset(dr + cnt, 0, (size_t)(nk - cnt) * sizeof *dr);
      } else {
        const double *p = (const double *)P + o;
        double *dr = (double *)dP + o, rs = 0;
        for (int64_t j = 0; j < cnt; j++) rs += dr[j] * p[j];
        for (int64_t j = 0; j < cnt; j++) dr[j] = p[j] * (dr[j] - rs);
        for (int64_t j = cnt; j < nk; j++) dr[j] = 0;
      }
    }
  return DT_OK;
}

/* ---- online softmax step --------------------------------------------------------------- */

static dt_status cpu_online(dt_device *d, dt_dtype t, const dt_attn_rows *g, void *P, void *mv,
                            void *lv, void *O, int64_t old, int64_t ostride, int64_t hd) {
  static const char c[] = "kern.attn_online";
  if (!geo_ok(g) || hd < 0) return bad_geo(d, c, g);
  DT_CHECK(float_only(d, c, t));
  double *m = mv, *l = lv;
  for (int64_t b = 0; b < g->batch; b++)
    for (int64_t r = 0; r < g->rows; r++) {
      int64_t o = row_at(g, b, r), si = stat_at(g, b, r), cnt = visible(g, r), nk = g->nk;
      double mx, z = 0;
      if (t == DT_F32) {
        float *row = (float *)P + o;
        mx = cnt > 0 ? dt_max_f32(row, cnt) : -INFINITY;
        mx = m[si] > mx ? m[si] : mx;
        dt_vexp_f32(row, row, (float)mx, cnt);
        z = dt_sum_f32(row, cnt);
        memset(row + cnt, 0, (size_t)(nk - cnt) * sizeof *row);
      } else {
        double *row = (double *)P + o;
        mx = m[si];
        for (int64_t j = 0; j < cnt; j++) mx = row[j] > mx ? row[j] : mx;
        for (int64_t j = 0; j < cnt; j++) {
          row[j] = exp(row[j] - mx);
          z += row[j];
        }
        for (int64_t j = cnt; j < nk; j++) row[j] = 0;
      }
      double al = exp(m[si] - mx); /* 0 on a row's first block (m = -inf) */
      l[si] = l[si] * al + z;
      m[si] = mx;
      if (al == 1.0) continue;
      int64_t oo = b * ostride + r * old;
      if (t == DT_F32) dt_scale_f32((float *)O + oo, (float)al, hd);
      else
        for (int64_t e = 0; e < hd; e++) ((double *)O + oo)[e] *= al;
    }
  return DT_OK;
}

/* ---- finish: O *= 1 / l, lse = m + log l ------------------------------------------------- */

static dt_status cpu_finish(dt_device *d, dt_dtype t, int64_t n, int64_t hd, void *O, const void *mv,
                            const void *lv, void *lse) {
  static const char c[] = "kern.attn_finish";
  if (n < 0 || hd < 0) return dt_error(d->ctx, DT_ERR_INVALID, c, "n %lld hd %lld", (long long)n, (long long)hd);
  DT_CHECK(float_only(d, c, t));
  const double *m = mv, *l = lv;
  for (int64_t i = 0; i < n; i++) {
    double inv = 1.0 / l[i], ls = m[i] + log(l[i]);
    if (t == DT_F32) {
      dt_scale_f32((float *)O + i * hd, (float)inv, hd);
      ((float *)lse)[i] = (float)ls;
    } else {
      double *row = (double *)O + i * hd;
      for (int64_t e = 0; e < hd; e++) row[e] *= inv;
      ((double *)lse)[i] = ls;
    }
  }
  return DT_OK;
}

/* ---- rowdot: D = rowsum(dO * O) ---------------------------------------------------------- */

static dt_status cpu_rowdot(dt_device *d, dt_dtype t, int64_t n, int64_t hd, const void *dO,
                            const void *O, void *Dv) {
  static const char c[] = "kern.attn_rowdot";
  if (n < 0 || hd < 0) return dt_error(d->ctx, DT_ERR_INVALID, c, "n %lld hd %lld", (long long)n, (long long)hd);
  DT_CHECK(float_only(d, c, t));
  double *D = Dv;
  for (int64_t i = 0; i < n; i++) {
    double acc = 0;
    if (t == DT_F32) acc = dt_dot_f32((const float *)dO + i * hd, (const float *)O + i * hd, hd);
    else
      for (int64_t e = 0; e < hd; e++)
        acc += ((const double *)dO)[i * hd + e] * ((const double *)O)[i * hd + e];
    D[i] = acc;
  }
  return DT_OK;
}

/* ---- backward from lse: P = exp(S - lse), dS = P (dS - D) ---------------------------------- */

static dt_status cpu_lse_bwd(dt_device *d, dt_dtype t, const dt_attn_rows *g, void *P, void *dS,
                             const void *lse, const void *Dv) {
  static const char c[] = "kern.attn_lse_bwd";
  if (!geo_ok(g)) return bad_geo(d, c, g);
  DT_CHECK(float_only(d, c, t));
  const double *D = Dv;
  for (int64_t b = 0; b < g->batch; b++)
    for (int64_t r = 0; r < g->rows; r++) {
      int64_t o = row_at(g, b, r), si = stat_at(g, b, r), cnt = visible(g, r), nk = g->nk;
      double Di = D[si];
      if (t == DT_F32) {
        float *p = (float *)P + o, *dr = (float *)dS + o;
        dt_vexp_f32(p, p, ((const float *)lse)[si], cnt);
        memset(p + cnt, 0, (size_t)(nk - cnt) * sizeof *p);
        const float df = (float)Di;
        int64_t j = 0;
        for (; j + 4 <= cnt; j += 4) dt_v4_store(dr + j, dt_v4_load(p + j) * (dt_v4_load(dr + j) - df));
        for (; j < cnt; j++) dr[j] = p[j] * (dr[j] - df);
        memset(dr + cnt, 0, (size_t)(nk - cnt) * sizeof *dr);
      } else {
        double *p = (double *)P + o, *dr = (double *)dS + o, li = ((const double *)lse)[si];
        for (int64_t j = 0; j < cnt; j++) {
          p[j] = exp(p[j] - li);
          dr[j] = p[j] * (dr[j] - Di);
        }
        for (int64_t j = cnt; j < nk; j++) p[j] = dr[j] = 0;
      }
    }
  return DT_OK;
}

const dt_kern_attn dt_cpu_attn = {
    .softmax = cpu_softmax,
    .softmax_bwd = cpu_softmax_bwd,
    .online = cpu_online,
    .finish = cpu_finish,
    .rowdot = cpu_rowdot,
    .lse_bwd = cpu_lse_bwd,
    .block_rows = 64,
    .block_bytes = 0,
    .gemm_heads = 1,
    .stats_f64 = true,
};
