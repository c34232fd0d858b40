/* lib/device/cpu/k_rows.c: the CPU device's rows kernels (RMSNorm, RoPE,
 * embedding, cross-entropy): host loops behind the dt_kern_rows slots of
 * lib/device/kernels.h.
 *
 * f32 and f64 data (bf16: DT_ERR_UNSUPPORTED, the host has no bf16 kernels).
 * Every element is computed in double and rounded once to the stored type, and
 * every sum is a double accumulated in index order, so f64 results do not
 * depend on threads or blocks; f32 cross-entropy takes its exponentials on
 * vmath.h's vector exp (within 2 f32 ulps) in f32, summed in double.
 *
 * Formulas: RMSNorm as torch.nn.functional.rms_norm (Zhang & Sennrich 2019,
 * "Root Mean Square Layer Normalization", eq. 4) and its gradient; RoPE as
 * TorchTitan's torchtitan/models/llama3/model/model.py precompute_freqs_cis /
 * apply_rotary_emb with Meta's Llama 3.1 apply_scaling; cross-entropy as a
 * log-sum-exp with the max subtracted, split into max / sum-exp / target logit
 * so that vocab shards can all_reduce each (PyTorch's
 * torch/distributed/tensor/parallel/loss.py under loss_parallel).
 */
#include "config.h"

#include <math.h>

#include "device/cpu/vmath.h"
#include "device/kernels.h"

/* element i of an f32 or f64 buffer, as double; its store, rounded once */
static inline double ld(dt_dtype t, const void *p, int64_t i) {
  return t == DT_F64 ? ((const double *)p)[i] : (double)((const float *)p)[i];
}
static inline void st(dt_dtype t, void *p, int64_t i, double v) {
  if (t == DT_F64)
    ((double *)p)[i] = v;
  else
    ((float *)p)[i] = (float)v;
}

static dt_status host_float(dt_device *d, const char *who, dt_dtype t) {
  if (t == DT_F32 || t == DT_F64) return DT_OK;
  return dt_error(d->ctx, DT_ERR_UNSUPPORTED, who, "%s arrays on the host (the CPU's row kernels take f32 and f64)",
                  dt_dtype_name(t));
}

/* ---- RMSNorm -------------------------------------------------------------------- */

static double rms_inv(dt_dtype t, const void *x, int64_t b, int64_t dim, double eps) {
  double ss = 0;
  for (int64_t k = 0; k < dim; k++) {
    double v = ld(t, x, b + k);
    ss += v * v;
  }
  return 1.0 / sqrt(ss / (double)dim + eps);
}

static dt_status rms_fwd(dt_device *d, dt_dtype t, int64_t rows, int64_t dim, double eps,
                         const void *x, const void *w, void *y) {
  DT_CHECK(host_float(d, "cpu.rms_fwd", t));
  for (int64_t r = 0; r < rows; r++) {
    const int64_t b = r * dim;
    double inv = rms_inv(t, x, b, dim, eps);
    for (int64_t k = 0; k < dim; k++) st(t, y, b + k, ld(t, x, b + k) * inv * ld(t, w, k));
  }
  return DT_OK;
}

/* dx and gxh row by row; dw (when wanted) as the GPU builds chunk it: per-row r
 * in ws, column sums per chunk of rows, then the chunks summed in order. */
static dt_status rms_bwd(dt_device *d, dt_dtype t, int64_t rows, int64_t dim, double eps,
                         const void *x, const void *w, const void *dy, void *dx, void *gxh,
                         void *dw, void *ws) {
  DT_CHECK(host_float(d, "cpu.rms_bwd", t));
  if (dim == 0) return DT_OK;
  if (dw && !ws) return dt_error(d->ctx, DT_ERR_INVALID, "cpu.rms_bwd", "dw needs the scratch ws");
  double *rs = dw ? (double *)ws : NULL;
  for (int64_t r = 0; r < rows; r++) {
    const int64_t b = r * dim;
    double inv = rms_inv(t, x, b, dim, eps), dot = 0;
    for (int64_t k = 0; k < dim; k++) {
      double xh = ld(t, x, b + k) * inv, g = ld(t, dy, b + k);
      dot += ld(t, w, k) * g * xh;
      if (gxh) st(t, gxh, b + k, g * xh);
    }
    dot /= (double)dim;
    for (int64_t k = 0; k < dim; k++) {
      double xh = ld(t, x, b + k) * inv;
      st(t, dx, b + k, (ld(t, w, k) * ld(t, dy, b + k) - xh * dot) * inv);
    }
    if (rs) rs[r] = inv;
  }
  if (!dw) return DT_OK;
  const int64_t chunks = dt_kern_rms_chunks(rows);
  double *part = rs + rows;
  for (int64_t c = 0; c < chunks; c++) {
    const int64_t r0 = rows * c / chunks, r1 = rows * (c + 1) / chunks;
    for (int64_t k = 0; k < dim; k++) {
      double acc = 0;
      for (int64_t r = r0; r < r1; r++) acc += ld(t, dy, r * dim + k) * (ld(t, x, r * dim + k) * rs[r]);
      part[c * dim + k] = acc;
    }
  }
  for (int64_t k = 0; k < dim; k++) {
    double acc = 0;
    for (int64_t c = 0; c < chunks; c++) acc += part[c * dim + k];
    st(t, dw, k, acc);
  }
  return DT_OK;
}

/* ---- RoPE ----------------------------------------------------------------------- */

/* Meta's Llama 3.1 apply_scaling constants (TorchTitan's rope_scaling_args):
 * the published values, not tunables. */
static const double ROPE_SCALE = 8.0, ROPE_LOW = 1.0, ROPE_HIGH = 4.0, ROPE_CTX = 8192.0;

/* freq of pair i of a head of hd elements */
static double rope_freq(double theta, int scaling, int64_t i, int64_t hd) {
  double f = pow(theta, -(double)(2 * i) / (double)hd);
  if (scaling != 1) return f;
  const double two_pi = 2.0 * acos(-1.0);
  double wavelen = two_pi / f, low_wl = ROPE_CTX / ROPE_LOW, high_wl = ROPE_CTX / ROPE_HIGH;
  if (wavelen < high_wl) return f;
  if (wavelen > low_wl) return f / ROPE_SCALE;
  double smooth = (ROPE_CTX / wavelen - ROPE_LOW) / (ROPE_HIGH - ROPE_LOW);
  return (1.0 - smooth) * f / ROPE_SCALE + smooth * f;
}

/* The ops' dt_seq_position (lib/ops/attention_cp.c) for a checked n_chunks:
 * stored index i of S in n_chunks head-tail chunks -> position. */
static int64_t seq_position(int64_t i, int64_t S, int n_chunks) {
  if (n_chunks <= 1) return i;
  int64_t len = S / n_chunks, k = i / len, off = i % len;
  int64_t pc = k % 2 == 0 ? k / 2 : n_chunks - 1 - k / 2;
  return pc * len + off;
}

static dt_status rope(dt_device *d, dt_dtype t, const dt_kern_rope_args *a, const void *x,
                      void *y) {
  DT_CHECK(host_float(d, "cpu.rope", t));
  if (a->b * a->s * a->h * a->hd == 0) return DT_OK;
  if (a->hd % 2 || !(a->theta > 0) || (a->n_chunks > 1 && (a->n_chunks % 2 || a->gs % a->n_chunks)))
    return dt_error(d->ctx, DT_ERR_INVALID, "cpu.rope", "hd %lld, theta %g, n_chunks %d",
                    (long long)a->hd, a->theta, a->n_chunks);
  const int64_t B = a->b, S = a->s, H = a->h, HD = a->hd;
  for (int64_t i = 0; i < HD / 2; i++) {
    double f = rope_freq(a->theta, a->scaling, i, HD);
    for (int64_t ts = 0; ts < S; ts++) {
      int64_t pos = seq_position(a->pos0 + ts, a->gs, a->n_chunks);
      double ang = a->sign * (double)pos * f, c = cos(ang), sn = sin(ang);
      for (int64_t bb = 0; bb < B; bb++)
        for (int64_t h = 0; h < H; h++) {
          int64_t e = ((bb * S + ts) * H + h) * HD + 2 * i;
          double x0 = ld(t, x, e), x1 = ld(t, x, e + 1);
          st(t, y, e, x0 * c - x1 * sn);
          st(t, y, e + 1, x0 * sn + x1 * c);
        }
    }
  }
  return DT_OK;
}

/* ---- embedding ------------------------------------------------------------------ */

static dt_status check_ids(dt_device *d, const char *who, int64_t n, const int64_t *ids,
                           int64_t hi) {
  for (int64_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= hi)
      return dt_error(d->ctx, DT_ERR_INVALID, who, "index %lld out of range [0, %lld)",
                      (long long)ids[i], (long long)hi);
  return DT_OK;
}

static dt_status embedding(dt_device *d, dt_dtype t, int64_t n, const int64_t *ids, int64_t rows,
                           int64_t cols, int64_t off, const void *w, void *y) {
  DT_CHECK(host_float(d, "cpu.embedding", t));
  for (int64_t i = 0; i < n; i++) {
    int64_t row = ids[i] - off;
    bool mine = row >= 0 && row < rows;
    for (int64_t c = 0; c < cols; c++) st(t, y, i * cols + c, mine ? ld(t, w, row * cols + c) : 0.0);
  }
  return DT_OK;
}

/* gw zeroed, then each held id's grad row added in id order (in double,
 * rounded to tw at each add): deterministic. */
static dt_status embedding_bwd(dt_device *d, dt_dtype tg, int64_t n, const int64_t *ids,
                               const void *g, int64_t rows, int64_t cols, int64_t off, dt_dtype tw,
                               void *gw) {
  DT_CHECK(host_float(d, "cpu.embedding_bwd", tg));
  DT_CHECK(host_float(d, "cpu.embedding_bwd", tw));
  for (int64_t i = 0; i < rows * cols; i++) st(tw, gw, i, 0.0);
  for (int64_t i = 0; i < n; i++) {
    int64_t row = ids[i] - off;
    if (row < 0 || row >= rows) continue;
    for (int64_t c = 0; c < cols; c++)
      st(tw, gw, row * cols + c, ld(tw, gw, row * cols + c) + ld(tg, g, i * cols + c));
  }
  return DT_OK;
}

/* ---- cross-entropy -------------------------------------------------------------- */

static void row_max(dt_dtype t, int64_t npos, int64_t V, const void *x, double *mx) {
  for (int64_t p = 0; p < npos; p++) {
    double m = -INFINITY;
    if (t == DT_F32 && V > 0)
      m = dt_max_f32((const float *)x + p * V, V);
    else
      for (int64_t v = 0; v < V; v++) m = fmax(m, ld(t, x, p * V + v));
    mx[p] = m;
  }
}

static dt_status ce_max(dt_device *d, dt_dtype t, int64_t npos, int64_t V, const void *x,
                        double *mx) {
  DT_CHECK(host_float(d, "cpu.ce_max", t));
  row_max(t, npos, V, x, mx);
  return DT_OK;
}

static dt_status ce_sumexp(dt_device *d, dt_dtype t, int64_t npos, int64_t V, int64_t voff,
                           const void *x, const int64_t *tg, bool find_max, double *mx, double *se,
                           double *tl) {
  DT_CHECK(host_float(d, "cpu.ce_sumexp", t));
  if (find_max) row_max(t, npos, V, x, mx);
  for (int64_t p = 0; p < npos; p++) {
    double s = 0;
    if (t == DT_F32) { /* vmath.h's exp (2 ulps) in chunks */
      const float *xf = (const float *)x + p * V;
      float m = (float)mx[p], e[256];
      for (int64_t v = 0; v < V; v += 256) {
        int64_t c = V - v < 256 ? V - v : 256;
        dt_vexp_f32(e, xf + v, m, c);
        s += dt_sum_f32(e, c);
      }
    } else {
      for (int64_t v = 0; v < V; v++) s += exp(ld(t, x, p * V + v) - mx[p]);
    }
    se[p] = s;
  }
  for (int64_t p = 0; p < npos; p++) {
    int64_t v = tg[p] - voff;
    tl[p] = v >= 0 && v < V ? ld(t, x, p * V + v) : 0.0; /* masked: only the owner contributes */
  }
  return DT_OK;
}

static dt_status ce_loss(dt_device *d, dt_dtype t, int64_t npos, double n_total, const double *mx,
                         const double *se, const double *tl, double *lse, void *loss) {
  DT_CHECK(host_float(d, "cpu.ce_loss", t));
  double sum = 0;
  for (int64_t p = 0; p < npos; p++) {
    lse[p] = log(se[p]) + mx[p];
    sum += lse[p] - tl[p];
  }
  st(t, loss, 0, sum / n_total);
  return DT_OK;
}

static dt_status ce_bwd(dt_device *d, dt_dtype t, int64_t npos, int64_t V, int64_t voff,
                        const void *x, const int64_t *tg, const double *lse, const void *grad,
                        double n_total, void *dx) {
  DT_CHECK(host_float(d, "cpu.ce_bwd", t));
  const double g = ld(t, grad, 0) / n_total;
  for (int64_t p = 0; p < npos; p++) {
    int64_t tv = tg[p] - voff;
    if (t == DT_F32) {
      /* exp(x - lse) as exp(x - lse32) exp(lse32 - lse): the f32 shift keeps the
       * vector exp's argument exact to rounding of x - lse32, the correction
       * (|lse32 - lse| <= 1 f32 ulp of lse) is taken in double */
      const float *xf = (const float *)x + p * V;
      float *yf = (float *)dx + p * V, l32 = (float)lse[p];
      dt_vexp_f32(yf, xf, l32, V);
      dt_scale_f32(yf, (float)(g * exp((double)l32 - lse[p])), V);
      if (tv >= 0 && tv < V) yf[tv] = (float)((double)yf[tv] - g);
      continue;
    }
    for (int64_t v = 0; v < V; v++) {
      double sm = exp(ld(t, x, p * V + v) - lse[p]);
      st(t, dx, p * V + v, (sm - (v == tv ? 1.0 : 0.0)) * g);
    }
  }
  return DT_OK;
}

const dt_kern_rows dt_cpu_rows = {
    .rms_fwd = rms_fwd,
    .rms_bwd = rms_bwd,
    .rope = rope,
    .embedding = embedding,
    .embedding_bwd = embedding_bwd,
    .ce_max = ce_max,
    .ce_sumexp = ce_sumexp,
    .ce_loss = ce_loss,
    .ce_bwd = ce_bwd,
    .check_ids = check_ids,
};
