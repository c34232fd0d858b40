/* verify/test_kern_rows.c: the row kernels (dt_kern_rows of lib/device/kernels.h:
 * RMSNorm, RoPE, embedding, cross-entropy) against references computed here in
 * double on the same rounded inputs, on the cuda-emu device or, built with
 * -DKERN_ON_CUDA (test_kern_rows_cuda), on GPU 0 (SKIP without one). The
 * gradients of RMSNorm and cross-entropy are also checked against central
 * finite differences of the double reference forward (an oracle that does not
 * share the gradient formulas).
 *
 * Tolerances are error bounds in units u of the arithmetic type (kt_unit of f32
 * for f32 and bf16, of f64 for f64) relative to a per-element scale the test
 * derives (the magnitude the rounding errors scale with: e.g. the sum of |terms|
 * of a dot product, Higham's bound gamma_n sum |a_i|), plus one unit of the
 * stored type for the final rounding. Each check prints the largest error it
 * saw in those units, so the margin is visible in the log.
 */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kerntest.h"

static const dt_dtype ftypes[] = {DT_F32, DT_F64, DT_BF16};
enum { BLOCK = 256 }; /* the kernels' block: each thread sums dim / BLOCK terms, then a tree of 8 */

static double uacc(dt_dtype t) { return kt_unit(t == DT_F64 ? DT_F64 : DT_F32); }

/* ---- helpers ------------------------------------------------------------------ */

/* Device copy of v as dtype t; v is replaced by the rounded values. */
static void *up(kt_dev *T, dt_dtype t, double *v, int64_t n) {
  void *h = kt_pack(t, v, n);
  kt_unpack(t, h, v, n);
  void *d = kt_up(T, h, (size_t)n * dt_dtype_size(t));
  free(h);
  return d;
}
static void *up_ids(kt_dev *T, const int64_t *ids, int64_t n) {
  return kt_up(T, ids, (size_t)n * sizeof *ids);
}
static void *alloc_dev(kt_dev *T, dt_dtype t, int64_t n) {
  return kt_up(T, NULL, (size_t)(n > 0 ? n : 1) * dt_dtype_size(t));
}
static void down(kt_dev *T, dt_dtype t, const void *d, double *v, int64_t n) {
  void *h = malloc((size_t)n * dt_dtype_size(t));
  kt_down(T, h, d, (size_t)n * dt_dtype_size(t));
  kt_unpack(t, h, v, n);
  free(h);
}
static void freed(kt_dev *T, dt_dtype t, void *d, int64_t n) {
  kt_free(T, d, (size_t)(n > 0 ? n : 1) * dt_dtype_size(t));
}

/* Largest |got - want| / (u scale + ut |want|) in units of u (ut: the stored
 * type's unit, for the final rounding; NaN: infinite); *at its index. */
static double err_units(const double *got, const double *want, const double *scale, int64_t n,
                        double u, double ut, int64_t *at) {
  double worst = 0;
  *at = -1;
  for (int64_t i = 0; i < n; i++) {
    double den = u * scale[i] + ut * fabs(want[i]), e = fabs(got[i] - want[i]);
    double r = isnan(got[i]) ? INFINITY : e == 0 ? 0 : den > 0 ? e / den * 1.0 : INFINITY;
    if (r > worst || *at < 0) worst = r, *at = i;
  }
  return worst;
}

/* One check: every element within tol units (see err_units). When u is f64's,
 * the double reference rounds as much as the kernel: tol doubles. */
static void check_units(const char *what, const double *got, const double *want,
                        const double *scale, int64_t n, double u, double ut, double tol) {
  if (u == kt_unit(DT_F64)) tol *= 2;
  int64_t at;
  double e = err_units(got, want, scale, n, u, ut, &at);
  tu_count();
  if (!(e <= tol))
    tu_fail(__FILE__, __LINE__, "%s: [%lld] got %.17g want %.17g (scale %g): %.3g units > %g",
            what, (long long)at, got[at], want[at], scale[at], e, tol);
  else
    printf("  %-44s max %.3g of %g units\n", what, e, tol);
}

/* ---- RMSNorm ------------------------------------------------------------------- */

typedef struct rms_ref {
  double *y, *ys, *dx, *dxs, *gxh, *gxhs, *dw, *dws;
} rms_ref;

/* y = x r w, r = 1/sqrt(mean x^2 + eps); and the backward with its scales */
static void rms_reference(int64_t rows, int64_t dim, double eps, const double *x, const double *w,
                          const double *dy, rms_ref *R) {
  memset(R->dw, 0, dim * sizeof(double));
  memset(R->dws, 0, dim * sizeof(double));
  for (int64_t r = 0; r < rows; r++) {
    const double *xr = x + r * dim, *gr = dy + r * dim;
    long double ss = 0, dot = 0; /* long double: the f64 reference's sums stay below f64's rounding */
    for (int64_t k = 0; k < dim; k++) ss += (long double)xr[k] * xr[k];
    double inv = (double)(1 / sqrtl(ss / dim + eps)), adot = 0;
    for (int64_t k = 0; k < dim; k++) {
      double xh = xr[k] * inv;
      dot += (long double)w[k] * gr[k] * xh;
      adot += fabs(w[k] * gr[k] * xh);
    }
    double dotd = (double)(dot / dim);
    adot /= dim;
    for (int64_t k = 0; k < dim; k++) {
      int64_t e = r * dim + k;
      double xh = xr[k] * inv;
      R->y[e] = xh * w[k];
      R->ys[e] = fabs(R->y[e]);
      R->dx[e] = (w[k] * gr[k] - xh * dotd) * inv;
      R->dxs[e] = (fabs(w[k] * gr[k]) + fabs(xh) * adot) * inv;
      R->gxh[e] = gr[k] * xh;
      R->gxhs[e] = fabs(R->gxh[e]);
      R->dw[k] += gr[k] * xh;
      R->dws[k] += fabs(gr[k] * xh);
    }
  }
}

static void test_rms(kt_dev *T) {
  static const int64_t shapes[][2] = {{1, 1}, {3, 7}, {2, 4096}, {3, 4099}, {1, 14336}, {200, 33}};
  const double eps = 1e-5;
  for (int ti = 0; ti < 3; ti++) {
    dt_dtype t = ftypes[ti];
    double u = uacc(t), ut = kt_unit(t);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
      int64_t rows = shapes[si][0], dim = shapes[si][1], n = rows * dim;
      double *x = malloc(n * 8), *dy = malloc(n * 8), *w = malloc(dim * 8), *got = malloc(n * 8);
      rms_ref R = {malloc(n * 8), malloc(n * 8), malloc(n * 8), malloc(n * 8), malloc(n * 8),
                   malloc(n * 8), malloc(dim * 8), malloc(dim * 8)};
      kt_uniform(x, n, 21, si, -2, 2);
      kt_uniform(dy, n, 22, si, -1, 1);
      kt_uniform(w, dim, 23, si, 0.5, 1.5);
      void *dxp = up(T, t, x, n), *dwp = up(T, t, w, dim), *ddy = up(T, t, dy, n);
      void *dyo = alloc_dev(T, t, n), *ddx = alloc_dev(T, t, n), *dgxh = alloc_dev(T, t, n),
           *ddw = alloc_dev(T, t, dim);
      size_t wsb = dt_kern_rms_ws(rows, dim);
      void *ws = kt_up(T, NULL, wsb);
      rms_reference(rows, dim, eps, x, w, dy, &R);
      TU_OK(T->ctx, T->K->rows->rms_fwd(T->dev, t, rows, dim, eps, dxp, dwp, dyo));
      TU_OK(T->ctx, T->K->rows->rms_bwd(T->dev, t, rows, dim, eps, dxp, dwp, ddy, ddx, dgxh, ddw, ws));
      char what[96];
      /* sum of squares: dim/BLOCK sequential adds then 8 tree levels, n = k + 8
       * roundings, taken at the probabilistic bound 2 sqrt(n) u (Higham & Mary
       * 2019, "A new approach to probabilistic rounding error analysis", Thm
       * 2.4; the worst case n u is never approached by random data), halved by
       * the sqrt; the divide, sqrt and two products: 4 more. */
      double k = (double)(dim + BLOCK - 1) / BLOCK, sq = 2 * sqrt(k + 8), tol_fwd = sq / 2 + 4;
      down(T, t, dyo, got, n);
      snprintf(what, sizeof what, "rms_fwd %s %lldx%lld y", dt_dtype_name(t), (long long)rows,
               (long long)dim);
      check_units(what, got, R.y, R.ys, n, u, ut, tol_fwd);
      /* dx: r as above, the dot product over the row ((k + 8) u of sum |terms|),
       * the products and the difference: a few more */
      down(T, t, ddx, got, n);
      snprintf(what, sizeof what, "rms_bwd %s %lldx%lld dx", dt_dtype_name(t), (long long)rows,
               (long long)dim);
      check_units(what, got, R.dx, R.dxs, n, u, ut, tol_fwd + sq + 4);
      down(T, t, dgxh, got, n);
      snprintf(what, sizeof what, "rms_bwd %s %lldx%lld dy*xh", dt_dtype_name(t), (long long)rows,
               (long long)dim);
      check_units(what, got, R.gxh, R.gxhs, n, u, ut, tol_fwd + 2);
      /* dw: each term as dy*xh, then rows/chunks sequential adds per chunk and
       * the chunks in order (probabilistic bound as above) */
      down(T, t, ddw, got, dim);
      snprintf(what, sizeof what, "rms_bwd %s %lldx%lld dw", dt_dtype_name(t), (long long)rows,
               (long long)dim);
      int64_t ch = dt_kern_rms_chunks(rows);
      check_units(what, got, R.dw, R.dws, dim, u, ut,
                  tol_fwd + 2 + 2 * sqrt((double)((rows + ch - 1) / ch + ch)));
      /* dw again without gxh: the same bits (fixed summation order) */
      if (rows > 1) {
        double *again = malloc(dim * 8), *d0 = malloc(dim * 8);
        kt_unpack(DT_F64, got, d0, dim);
        TU_OK(T->ctx,
              T->K->rows->rms_bwd(T->dev, t, rows, dim, eps, dxp, dwp, ddy, ddx, NULL, ddw, ws));
        down(T, t, ddw, again, dim);
        TU_CHECK(memcmp(again, d0, dim * 8) == 0, "rms_bwd %s %lldx%lld: dw differs between runs",
                 dt_dtype_name(t), (long long)rows, (long long)dim);
        free(again), free(d0);
      }
      kt_free(T, ws, wsb);
      freed(T, t, dxp, n), freed(T, t, dwp, dim), freed(T, t, ddy, n), freed(T, t, dyo, n);
      freed(T, t, ddx, n), freed(T, t, dgxh, n), freed(T, t, ddw, dim);
      free(x), free(dy), free(w), free(got);
      free(R.y), free(R.ys), free(R.dx), free(R.dxs), free(R.gxh), free(R.gxhs), free(R.dw),
          free(R.dws);
    }
  }
  printf("rows.rms_fwd, rms_bwd: f32, f64, bf16\n");
}

/* sum of c . rms_norm(x, w) in double */
static double rms_loss(int64_t rows, int64_t dim, double eps, const double *x, const double *w,
                       const double *c) {
  double L = 0;
  for (int64_t r = 0; r < rows; r++) {
    double ss = 0;
    for (int64_t k = 0; k < dim; k++) ss += x[r * dim + k] * x[r * dim + k];
    double inv = 1 / sqrt(ss / dim + eps);
    for (int64_t k = 0; k < dim; k++) L += c[r * dim + k] * x[r * dim + k] * inv * w[k];
  }
  return L;
}

/* Central differences, step h: truncation O(h^2 f''') ~ 1e-10 here, rounding
 * ~ u |L| / h ~ 1e-11; the tolerance 1e-8 (absolute, the gradients are O(1))
 * sits two orders above and far below any formula error. */
static const double FD_H = 1e-5, FD_TOL = 1e-8;

static void test_rms_fd(kt_dev *T) {
  const int64_t rows = 2, dim = 5, n = rows * dim;
  const double eps = 1e-5;
  double x[10], w[5], c[10], gx[10], gw[5], fx[10], fw[5];
  kt_uniform(x, n, 31, 0, -1, 1);
  kt_uniform(w, dim, 32, 0, 0.5, 1.5);
  kt_uniform(c, n, 33, 0, -1, 1);
  for (int64_t i = 0; i < n; i++) {
    double s = x[i];
    x[i] = s + FD_H;
    double lp = rms_loss(rows, dim, eps, x, w, c);
    x[i] = s - FD_H;
    double lm = rms_loss(rows, dim, eps, x, w, c);
    x[i] = s;
    fx[i] = (lp - lm) / (2 * FD_H);
  }
  for (int64_t k = 0; k < dim; k++) {
    double s = w[k];
    w[k] = s + FD_H;
    double lp = rms_loss(rows, dim, eps, x, w, c);
    w[k] = s - FD_H;
    double lm = rms_loss(rows, dim, eps, x, w, c);
    w[k] = s;
    fw[k] = (lp - lm) / (2 * FD_H);
  }
  void *dxp = up(T, DT_F64, x, n), *dwp = up(T, DT_F64, w, dim), *dc = up(T, DT_F64, c, n);
  void *ddx = alloc_dev(T, DT_F64, n), *ddw = alloc_dev(T, DT_F64, dim);
  size_t wsb = dt_kern_rms_ws(rows, dim);
  void *ws = kt_up(T, NULL, wsb);
  TU_OK(T->ctx, T->K->rows->rms_bwd(T->dev, DT_F64, rows, dim, eps, dxp, dwp, dc, ddx, NULL, ddw, ws));
  down(T, DT_F64, ddx, gx, n);
  down(T, DT_F64, ddw, gw, dim);
  TU_CHECK(kt_mismatch(gx, fx, n, FD_TOL) < 0 && kt_mismatch(gw, fw, dim, FD_TOL) < 0,
           "rms_bwd against finite differences: dx[0] %.12g vs %.12g, dw[0] %.12g vs %.12g",
           gx[0], fx[0], gw[0], fw[0]);
  double e = 0;
  for (int64_t i = 0; i < n; i++) e = fmax(e, fabs(gx[i] - fx[i]));
  for (int64_t k = 0; k < dim; k++) e = fmax(e, fabs(gw[k] - fw[k]));
  printf("rows.rms_bwd f64 vs central differences: max |diff| %.2g (tol %g)\n", e, FD_TOL);
  kt_free(T, ws, wsb);
  freed(T, DT_F64, dxp, n), freed(T, DT_F64, dwp, dim), freed(T, DT_F64, dc, n);
  freed(T, DT_F64, ddx, n), freed(T, DT_F64, ddw, dim);
}

/* ---- RoPE ------------------------------------------------------------------------ */

/* Written from the definitions: freq_i = theta^(-2i/hd); Llama 3.1's scaling
 * (Meta's apply_scaling: factor 8, low 1, high 4, original context 8192);
 * head-tail storage (chunk k of n holds position chunk k/2 if k even, else
 * n - 1 - k/2). */
static double ref_freq(double theta, int scaling, int64_t i, int64_t hd) {
  double f = pow(theta, -2.0 * (double)i / (double)hd);
  if (!scaling) return f;
  double wl = 4 * acos(0.0) / f; /* 2 pi */
  if (wl < 8192.0 / 4) return f;
  if (wl > 8192.0 / 1) return f / 8;
  double sm = (8192.0 / wl - 1) / (4 - 1);
  return (1 - sm) * f / 8 + sm * f;
}
static int64_t ref_pos(int64_t i, int64_t S, int nc) {
  if (nc <= 1) return i;
  int64_t len = S / nc, k = i / len;
  return (k % 2 == 0 ? k / 2 : nc - 1 - k / 2) * len + i % len;
}

static void test_rope(kt_dev *T) {
  /* b, s, h, hd, pos0, gs, n_chunks, scaling, theta, sign */
  static const struct { int64_t b, s, h, hd, pos0, gs; int nc, sc; double theta, sign; } cs[] = {
      {1, 3, 32, 128, 0, 3, 0, 1, 500000, 1},     /* Llama 3 8B heads */
      {2, 5, 3, 6, 0, 5, 0, 0, 10000, 1},         /* odd: 3 pairs, a partial block */
      {1, 2, 2, 1024, 7, 9, 0, 0, 10000, -1},     /* more pairs than threads; backward */
      {2, 4, 8, 128, 4, 16, 4, 1, 500000, 1},     /* a cp shard in head-tail order */
      {1, 3, 1, 64, 131069, 131072, 0, 1, 500000, -1}, /* far positions (angles ~ 1e5) */
  };
  for (int ti = 0; ti < 3; ti++) {
    dt_dtype t = ftypes[ti];
    double u = uacc(t), ut = kt_unit(t);
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
      dt_kern_rope_args a = {cs[ci].b, cs[ci].s, cs[ci].h, cs[ci].hd, cs[ci].pos0, cs[ci].gs,
                             cs[ci].nc, cs[ci].sc, cs[ci].theta, cs[ci].sign};
      int64_t n = a.b * a.s * a.h * a.hd;
      double *x = malloc(n * 8), *want = malloc(n * 8), *sc = malloc(n * 8), *got = malloc(n * 8);
      kt_uniform(x, n, 41, ci, -1, 1);
      void *dx = up(T, t, x, n), *dy = alloc_dev(T, t, n);
      for (int64_t bb = 0; bb < a.b; bb++)
        for (int64_t s = 0; s < a.s; s++)
          for (int64_t h = 0; h < a.h; h++)
            for (int64_t i = 0; i < a.hd / 2; i++) {
              double ang = a.sign * (double)ref_pos(a.pos0 + s, a.gs, a.n_chunks) *
                           ref_freq(a.theta, a.scaling, i, a.hd);
              int64_t e = ((bb * a.s + s) * a.h + h) * a.hd + 2 * i;
              double x0 = x[e], x1 = x[e + 1];
              want[e] = x0 * cos(ang) - x1 * sin(ang);
              want[e + 1] = x0 * sin(ang) + x1 * cos(ang);
              /* cos, sin rounded to the arithmetic type, two products and a sum
               * (4 u of |x0| + |x1|); the f64 angle's own error (pow and the
               * product, a few ulps of f64 of |angle|) moves the result by that
               * much times |x0| + |x1|, expressed here in units of u */
              sc[e] = sc[e + 1] = (fabs(x0) + fabs(x1)) * (1 + fabs(ang) * kt_unit(DT_F64) / u);
            }
      TU_OK(T->ctx, T->K->rows->rope(T->dev, t, &a, dx, dy));
      down(T, t, dy, got, n);
      char what[96];
      snprintf(what, sizeof what, "rope %s [%lld,%lld,%lld,%lld] pos0 %lld nc %d %s",
               dt_dtype_name(t), (long long)a.b, (long long)a.s, (long long)a.h, (long long)a.hd,
               (long long)a.pos0, a.n_chunks, a.sign > 0 ? "fwd" : "bwd");
      check_units(what, got, want, sc, n, u, ut, 4);
      freed(T, t, dx, n), freed(T, t, dy, n);
      free(x), free(want), free(sc), free(got);
    }
  }
  printf("rows.rope: f32, f64, bf16\n");
}

/* ---- embedding ------------------------------------------------------------------ */

static void test_embedding(kt_dev *T) {
  const int64_t V = 1000;
  /* n ids, cols, the shard [off, off + rows) */
  static const int64_t cs[][4] = {{1, 7, 0, 1000}, {37, 4099, 0, 1000}, {13, 4096, 350, 300},
                                  {5, 1, 999, 1}};
  for (int ti = 0; ti < 3; ti++) {
    dt_dtype t = ftypes[ti];
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
      int64_t n = cs[ci][0], cols = cs[ci][1], off = cs[ci][2], rows = cs[ci][3];
      int64_t *ids = malloc(n * sizeof *ids);
      for (int64_t i = 0; i < n; i++) ids[i] = (int64_t)(dt_rng_uniform(51, ci, i) * V);
      ids[0] = off; /* at least one held row, and a repeat of it */
      if (n > 2) ids[2] = off;
      if (n > 1) ids[1] = off + rows - 1;
      double *w = malloc(rows * cols * 8), *want = calloc(n * cols, 8), *got = malloc(n * cols * 8);
      kt_uniform(w, rows * cols, 52, ci, -1, 1);
      void *dw = up(T, t, w, rows * cols), *di = up_ids(T, ids, n), *dy = alloc_dev(T, t, n * cols);
      for (int64_t i = 0; i < n; i++)
        if (ids[i] >= off && ids[i] < off + rows)
          memcpy(want + i * cols, w + (ids[i] - off) * cols, cols * 8);
      TU_OK(T->ctx, T->K->rows->embedding(T->dev, t, n, di, rows, cols, off, dw, dy));
      down(T, t, dy, got, n * cols);
      char what[96];
      snprintf(what, sizeof what, "embedding %s n=%lld cols=%lld rows [%lld, %lld)",
               dt_dtype_name(t), (long long)n, (long long)cols, (long long)off,
               (long long)(off + rows));
      kt_close_to(what, got, want, n * cols, 0); /* a copy: exact */
      /* backward into f32 (and f64 for f64 grads): scatter-add of g's rows */
      for (int wi = 0; wi < (t == DT_F64 ? 2 : 1); wi++) {
        dt_dtype tw = wi ? DT_F64 : DT_F32;
        double *g = malloc(n * cols * 8), *gw = calloc(rows * cols, 8), *gs = calloc(rows * cols, 8),
               *gg = malloc(rows * cols * 8);
        int64_t maxrep = 1;
        kt_uniform(g, n * cols, 53, ci, -1, 1);
        void *dg = up(T, t, g, n * cols), *dgw = alloc_dev(T, tw, rows * cols);
        for (int64_t i = 0; i < n; i++) {
          int64_t r = ids[i] - off, rep = 0;
          if (r < 0 || r >= rows) continue;
          for (int64_t j = 0; j <= i; j++) rep += ids[j] == ids[i];
          maxrep = rep > maxrep ? rep : maxrep;
          for (int64_t c = 0; c < cols; c++) {
            gw[r * cols + c] += g[i * cols + c];
            gs[r * cols + c] += fabs(g[i * cols + c]);
          }
        }
        TU_OK(T->ctx, T->K->rows->embedding_bwd(T->dev, t, n, di, dg, rows, cols, off, tw, dgw));
        down(T, tw, dgw, gg, rows * cols);
        snprintf(what, sizeof what, "embedding_bwd %s->%s n=%lld cols=%lld", dt_dtype_name(t),
                 dt_dtype_name(tw), (long long)n, (long long)cols);
        /* one rounding of tw per add after the first (any order): maxrep - 1 units
         * of sum |g| (exact when no id repeats) */
        /* (an f64 g added to f32 rounds once more per term) */
        check_units(what, gg, gw, gs, rows * cols, kt_unit(tw), 0,
                    (double)(maxrep - 1) + (t == DT_F64 && tw == DT_F32));
        freed(T, t, dg, n * cols), freed(T, tw, dgw, rows * cols);
        free(g), free(gw), free(gs), free(gg);
      }
      freed(T, t, dw, rows * cols), freed(T, t, dy, n * cols);
      kt_free(T, di, n * sizeof *ids);
      free(ids), free(w), free(want), free(got);
    }
  }
  printf("rows.embedding, embedding_bwd: f32, f64, bf16, vocab shards\n");
}

/* ---- cross-entropy -------------------------------------------------------------- */

/* Reference statistics of x [npos, V] in double: mx, se, tl, lse, the loss
 * sum(lse - tl) / N, and the gradient (softmax - onehot) * g / N. */
static void ce_reference(int64_t npos, int64_t V, const double *x, const int64_t *tg, double N,
                         double g, double *mx, double *se, double *tl, double *lse, double *loss,
                         double *dx) {
  double L = 0;
  for (int64_t p = 0; p < npos; p++) {
    double m = -INFINITY;
    long double s = 0;
    for (int64_t v = 0; v < V; v++) m = fmax(m, x[p * V + v]);
    for (int64_t v = 0; v < V; v++) s += exp(x[p * V + v] - m);
    mx[p] = m, se[p] = (double)s, tl[p] = x[p * V + tg[p]], lse[p] = log(se[p]) + m;
    L += lse[p] - tl[p];
    if (dx)
      for (int64_t v = 0; v < V; v++)
        dx[p * V + v] = (exp(x[p * V + v] - lse[p]) - (v == tg[p])) * g / N;
  }
  *loss = L / N;
}

/* Runs the kernels on x split into vocab shards at bounds cut[0..ns] (ns 1: no
 * split, the fused find_max path), combining each statistic over the shards
 * as the op's all_reduces do (max, sum, sum), then ce_loss and ce_bwd per
 * shard. Returns the loss; lse and dx (whole) filled. */
static double ce_run(kt_dev *T, dt_dtype t, int64_t npos, int64_t V, const double *x,
                     const int64_t *tg, const int64_t *cut, int ns, double N, double g,
                     double *lse, double *dx, double *mx_out, double *se_out, double *tl_out) {
  double *mx = calloc(npos, 8), *se = calloc(npos, 8), *tl = calloc(npos, 8), *tmp = malloc(npos * 8);
  for (int p = 0; p < npos; p++) mx[p] = -INFINITY;
  void *dtg = up_ids(T, tg, npos);
  void *dmx = alloc_dev(T, DT_F64, npos), *dse = alloc_dev(T, DT_F64, npos),
       *dtl = alloc_dev(T, DT_F64, npos), *dlse = alloc_dev(T, DT_F64, npos);
  void *dxs[8];
  int64_t Vs[8];
  for (int k = 0; k < ns; k++) {
    int64_t V0 = cut[k], Vl = cut[k + 1] - cut[k];
    double *xs = malloc(npos * Vl * 8);
    for (int64_t p = 0; p < npos; p++) memcpy(xs + p * Vl, x + p * V + V0, Vl * 8);
    Vs[k] = Vl;
    dxs[k] = up(T, t, xs, npos * Vl);
    free(xs);
    if (ns > 1) {
      TU_OK(T->ctx, T->K->rows->ce_max(T->dev, t, npos, Vl, dxs[k], dmx));
      down(T, DT_F64, dmx, tmp, npos);
      for (int p = 0; p < npos; p++) mx[p] = fmax(mx[p], tmp[p]);
    }
  }
  void *hm = kt_pack(DT_F64, mx, npos);
  if (ns > 1) TU_OK(T->ctx, dt_device_copy(T->dev, dmx, hm, npos * 8, DT_COPY_H2D));
  free(hm);
  for (int k = 0; k < ns; k++) {
    TU_OK(T->ctx, T->K->rows->ce_sumexp(T->dev, t, npos, Vs[k], cut[k], dxs[k], dtg, ns == 1, dmx,
                                        dse, dtl));
    down(T, DT_F64, dse, tmp, npos);
    for (int p = 0; p < npos; p++) se[p] += tmp[p];
    down(T, DT_F64, dtl, tmp, npos);
    for (int p = 0; p < npos; p++) tl[p] += tmp[p];
  }
  if (ns == 1) down(T, DT_F64, dmx, mx, npos);
  void *h1 = kt_pack(DT_F64, se, npos), *h2 = kt_pack(DT_F64, tl, npos);
  TU_OK(T->ctx, dt_device_copy(T->dev, dse, h1, npos * 8, DT_COPY_H2D));
  TU_OK(T->ctx, dt_device_copy(T->dev, dtl, h2, npos * 8, DT_COPY_H2D));
  free(h1), free(h2);
  void *dloss = alloc_dev(T, t, 1);
  TU_OK(T->ctx, T->K->rows->ce_loss(T->dev, t, npos, N, dmx, dse, dtl, dlse, dloss));
  double loss;
  down(T, t, dloss, &loss, 1);
  down(T, DT_F64, dlse, lse, npos);
  double gv = g;
  void *dgrad = up(T, t, &gv, 1);
  for (int k = 0; k < ns; k++) {
    void *ddx = alloc_dev(T, t, npos * Vs[k]);
    double *part = malloc(npos * Vs[k] * 8);
    TU_OK(T->ctx, T->K->rows->ce_bwd(T->dev, t, npos, Vs[k], cut[k], dxs[k], dtg, dlse, dgrad, N, ddx));
    down(T, t, ddx, part, npos * Vs[k]);
    for (int64_t p = 0; p < npos; p++) memcpy(dx + p * V + cut[k], part + p * Vs[k], Vs[k] * 8);
    freed(T, t, ddx, npos * Vs[k]), freed(T, t, dxs[k], npos * Vs[k]);
    free(part);
  }
  memcpy(mx_out, mx, npos * 8), memcpy(se_out, se, npos * 8), memcpy(tl_out, tl, npos * 8);
  freed(T, t, dgrad, 1), freed(T, t, dloss, 1);
  freed(T, DT_F64, dmx, npos), freed(T, DT_F64, dse, npos), freed(T, DT_F64, dtl, npos),
      freed(T, DT_F64, dlse, npos);
  kt_free(T, dtg, npos * sizeof *tg);
  free(mx), free(se), free(tl), free(tmp);
  return loss;
}

static void test_ce(kt_dev *T) {
  /* npos, V, shards (1: whole vocab) */
  static const int64_t cs[][3] = {{1, 7, 1}, {3, 4099, 1}, {2, 128256, 1}, {3, 4099, 3},
                                  {17, 1000, 2}, {2, 128256, 4}};
  for (int ti = 0; ti < 3; ti++) {
    dt_dtype t = ftypes[ti];
    double u = uacc(t), ut = kt_unit(t);
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
      int64_t npos = cs[ci][0], V = cs[ci][1], n = npos * V;
      int ns = (int)cs[ci][2];
      int64_t cut[8], *tg = malloc(npos * sizeof *tg);
      for (int k = 0; k <= ns; k++) cut[k] = V * k / ns + (k > 0 && k < ns ? 1 : 0); /* uneven */
      for (int64_t p = 0; p < npos; p++) tg[p] = (int64_t)(dt_rng_uniform(61, ci, p) * V);
      double *x = malloc(n * 8), *dx = malloc(n * 8), *wdx = malloc(n * 8), *dxs = malloc(n * 8);
      double *mx = malloc(npos * 8), *se = malloc(npos * 8), *tl = malloc(npos * 8),
             *lse = malloc(npos * 8), *wmx = malloc(npos * 8), *wse = malloc(npos * 8),
             *wtl = malloc(npos * 8), *wlse = malloc(npos * 8), *sc = malloc(npos * 8);
      kt_uniform(x, n, 62, ci, -8, 8);
      double *xr = malloc(n * 8); /* the stored values, as the reference sees them */
      void *hx = kt_pack(t, x, n);
      kt_unpack(t, hx, xr, n);
      free(hx);
      const double N = (double)npos * 3, g = 1.25; /* this rank's positions are a third of N */
      double wloss, loss = ce_run(T, t, npos, V, xr, tg, cut, ns, N, g, lse, dx, mx, se, tl);
      ce_reference(npos, V, xr, tg, N, g, wmx, wse, wtl, wlse, &wloss, wdx);
      char what[96];
      snprintf(what, sizeof what, "ce %s %lldx%lld in %d shards", dt_dtype_name(t),
               (long long)npos, (long long)V, ns);
      printf("  %s:\n", what);
      /* max and the target logit are stored values: exact */
      kt_close_to(what, mx, wmx, npos, 0);
      kt_close_to(what, tl, wtl, npos, 0);
      /* se: each exp(x - mx) carries the rounding of x - mx to the arithmetic
       * type (|x - mx| u; none for bf16 values, whose differences are exact in
       * f32) and of the exp (2 u); summed in f64 (negligible beside f32, ~V u
       * of the sum for f64; the tree makes it log2: 8 + V / 256). Scale: the sum
       * of each term times its bound, so tol is 1 unit. */
      double *rel = malloc(npos * 8); /* se's relative error bound, in units */
      for (int64_t p = 0; p < npos; p++) {
        double s = 0;
        for (int64_t v = 0; v < V; v++) {
          double d = xr[p * V + v] - wmx[p];
          s += exp(d) * (fabs(d) + 2);
        }
        sc[p] = s + (t == DT_F64 ? (8 + V / 256.0) * wse[p] : 0);
        rel[p] = sc[p] / wse[p];
      }
      check_units("  se", se, wse, sc, npos, u, 0, 1);
      /* lse = log(se) + mx: se's relative error becomes lse's absolute one;
       * the log and the add round in f64 */
      check_units("  lse", lse, wlse, rel, npos, u, 2 * kt_unit(DT_F64), 1);
      /* loss: the lse errors (tl exact), summed in f64 (npos f64 units of the
       * sum of |lse - tl|), divided by N; then stored as t */
      double lsc = 0, labs = 0;
      for (int64_t p = 0; p < npos; p++) lsc += rel[p], labs += fabs(wlse[p] - wtl[p]);
      lsc = (lsc + (double)(npos + 2) * labs * kt_unit(DT_F64) / u) / N;
      check_units("  loss", &loss, &wloss, &lsc, 1, u, ut, 1);
      /* dx = (e - onehot) g / N: e = exp of (x - lse) rounded to the arithmetic
       * type (|x - lse| u), the exp (2 u), lse's own error (rel[p] u), the
       * product (1 u); g / N rounded (1 u) for both terms; then the store */
      for (int64_t p = 0; p < npos; p++)
        for (int64_t v = 0; v < V; v++) {
          int64_t e = p * V + v;
          double d = xr[e] - wlse[p], sm = exp(d);
          dxs[e] = (sm * (fabs(d) + 2 + rel[p] + 2) + (v == tg[p] ? 2 : 0)) * g / N;
        }
      check_units("  dx", dx, wdx, dxs, n, u, ut, 1);
      free(rel);
      free(tg), free(x), free(dx), free(wdx), free(dxs), free(mx), free(se), free(tl), free(lse);
      free(wmx), free(wse), free(wtl), free(wlse), free(sc), free(xr);
    }
  }
  printf("rows.ce_max, ce_sumexp, ce_loss, ce_bwd: f32, f64, bf16, vocab shards\n");
}

/* loss of x [npos, V] in double */
static double ce_loss_ref(int64_t npos, int64_t V, const double *x, const int64_t *tg, double N) {
  double L = 0;
  for (int64_t p = 0; p < npos; p++) {
    double m = -INFINITY, s = 0;
    for (int64_t v = 0; v < V; v++) m = fmax(m, x[p * V + v]);
    for (int64_t v = 0; v < V; v++) s += exp(x[p * V + v] - m);
    L += log(s) + m - x[p * V + tg[p]];
  }
  return L / N;
}

static void test_ce_fd(kt_dev *T) {
  const int64_t npos = 2, V = 6, n = npos * V, tg[2] = {4, 0}, cut[3] = {0, 2, 6};
  const double N = 3, g = 0.75;
  double x[12], fx[12], dx[12], lse[2], mx[2], se[2], tl[2];
  kt_uniform(x, n, 71, 0, -3, 3);
  for (int64_t i = 0; i < n; i++) {
    double s = x[i];
    x[i] = s + FD_H;
    double lp = ce_loss_ref(npos, V, x, tg, N);
    x[i] = s - FD_H;
    double lm = ce_loss_ref(npos, V, x, tg, N);
    x[i] = s;
    fx[i] = g * (lp - lm) / (2 * FD_H);
  }
  for (int ns = 1; ns <= 2; ns++) {
    ce_run(T, DT_F64, npos, V, x, tg, ns == 1 ? (const int64_t[]){0, 6} : cut, ns, N, g, lse, dx,
           mx, se, tl);
    double e = 0;
    for (int64_t i = 0; i < n; i++) e = fmax(e, fabs(dx[i] - fx[i]));
    TU_CHECK(kt_mismatch(dx, fx, n, FD_TOL) < 0, "ce_bwd (%d shards) against finite differences: %.3g",
             ns, e);
    printf("rows.ce_bwd f64 (%d shard%s) vs central differences: max |diff| %.2g (tol %g)\n", ns,
           ns > 1 ? "s" : "", e, FD_TOL);
  }
}

/* ---- the checks can fail; the guards -------------------------------------------- */
static void test_can_fail(kt_dev *T) {
  /* RMSNorm with eps 1e-2 instead of 1e-5 on a row of rms ~0.3: 5% off, which
   * the f32 check must see (hundreds of thousands of units). */
  const int64_t dim = 33;
  double x[33], w[33], got[33], want[33], sc[33], dy[33];
  kt_uniform(x, dim, 81, 0, -0.5, 0.5);
  kt_uniform(w, dim, 82, 0, 0.5, 1.5);
  kt_uniform(dy, dim, 83, 0, -1, 1);
  void *dx = up(T, DT_F32, x, dim), *dw = up(T, DT_F32, w, dim), *dy_ = alloc_dev(T, DT_F32, dim);
  TU_OK(T->ctx, T->K->rows->rms_fwd(T->dev, DT_F32, 1, dim, 1e-2, dx, dw, dy_));
  down(T, DT_F32, dy_, got, dim);
  double *tmp = malloc(dim * 8 * 6);
  rms_ref R = {want, sc, tmp, tmp + dim, tmp + 2 * dim, tmp + 3 * dim, tmp + 4 * dim, tmp + 5 * dim};
  rms_reference(1, dim, 1e-5, x, w, dy, &R);
  int64_t at;
  double e = err_units(got, want, sc, dim, kt_unit(DT_F32), kt_unit(DT_F32), &at);
  TU_CHECK(e > 1000, "a wrong eps passes the rms check (%.3g units)", e);
  printf("planted: rms_fwd with the wrong eps is %.3g units off (caught)\n", e);
  free(tmp);
  freed(T, DT_F32, dx, dim), freed(T, DT_F32, dw, dim), freed(T, DT_F32, dy_, dim);
#ifndef KERN_ON_CUDA
  /* a host pointer is refused, not dereferenced */
  float h[4] = {1, 2, 3, 4};
  void *d = kt_up(T, NULL, sizeof h);
  dt_status st = T->K->rows->rms_fwd(T->dev, DT_F32, 1, 4, 1e-5, h, d, d);
  TU_CHECK(st == DT_ERR_INVALID, "rms_fwd on a host pointer -> %s", dt_status_str(st));
  kt_free(T, d, sizeof h);
  dt_error_clear(T->ctx);
#endif
  /* dw without its scratch is an error, not a fault */
  dt_status st2 = T->K->rows->rms_bwd(T->dev, DT_F32, 1, 4, 1e-5, NULL, NULL, NULL, NULL, NULL,
                                      (void *)1, NULL);
  TU_CHECK(st2 == DT_ERR_INVALID, "rms_bwd without ws -> %s", dt_status_str(st2));
  dt_error_clear(T->ctx);
}

int main(void) {
  dt_ctx ctx;
  kt_dev T;
  int rc = kt_start(&T, &ctx);
  if (rc) return rc;
  test_rms(&T);
  test_rms_fd(&T);
  test_rope(&T);
  test_embedding(&T);
  test_ce(&T);
  test_ce_fd(&T);
  test_can_fail(&T);
  return kt_end(&T, &ctx, KT_NAME("test_kern_rows"));
}
