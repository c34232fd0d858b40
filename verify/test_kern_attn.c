/* verify/test_kern_attn.c: attention on a device: the attn kernels of
 * lib/device/kernels.h, and the sdpa and sdpa_cp ops (lib/ops/attention.c,
 * attention_cp.c) on device arrays, on the cuda-emu device (the CUDA kernels
 * built for the host) or, built with -DKERN_ON_CUDA (test_kern_attn_cuda), on
 * GPU 0, which exits 77 (SKIP) where there is none.
 *
 * Oracles, all written here in double:
 *  (a) attn.softmax and attn.online against a direct row softmax / online
 *      step, key counts 1, 7, 300 (more than a block of threads) and 1000,
 *      masks partial and none, f32, f64 and bf16; attn.softmax_bwd and
 *      attn.lse_bwd likewise (f32, f64; a softmax_bwd reference without the
 *      row sum is refused), attn.rowdot at head dims 64 and 300 (f32, f64,
 *      bf16);
 *  (b) sdpa forward (out) and backward (dq, dk, dv) against a naive causal
 *      attention over the whole S x S (and its gradients from the softmax
 *      Jacobian), GQA with Hq = 4 Hkv and Hq = Hkv, S = 1, 7, 130 (with 48
 *      query rows per block, attrs.i2: blocks of 48, 48, 34, and the default),
 *      head dim 64 and 128, both layouts, f32 and f64;
 *  (c) sdpa_cp on a one-rank cp mesh with 2 and 4 storage chunks (4: the
 *      positions are permuted, so its full, diagonal and skipped pairs and the
 *      online softmax over several key blocks all run): out, lse, dq, dk, dv;
 *  (d) the device gradients of sdpa and sdpa_cp against central finite
 *      differences of the device forward (loss = sum(out G)), f64, tiny;
 *  (e) the comparisons can fail: the naive reference without the causal mask
 *      is refused by the same check;
 *  (f) on cuda-emu, (a) again, every row kernel, with them built at CUDA's block
 *      sizes (dt_kemu_attn_cuda_blocks: 256 threads per score row, 128 per
 *      head-dim row; the device's own table runs 32), so the launch shape the
 *      GPU runs, with idle threads (7 keys) and strided rounds (300, 1000), is
 *      exercised under the emulator's barrier and shared-memory rules;
 *  (g) on cuda-emu, two ranks on one emulated GPU (threads): device point to
 *      point is eager (the sender reuses its buffer at once) and stages 0
 *      bytes through the host (dt_ledger.staged_bytes), 2 x the payload with
 *      the planted p2p_via_host; then sdpa_cp in bf16 over a cp ring of 2 (S
 *      128 in 4 head-tail chunks, GQA 2:1, logits of several units; once more
 *      with the ops' row kernels at CUDA's block sizes, 256 / 128 threads) and
 *      over allgather: out, lse (f32), dq, dk, dv against the double oracle (its D
 *      from the stored out, as FlashAttention-2's backward reads it), with
 *      per-element bounds from the oracle's term magnitudes (ring_tol); the
 *      ring's cp sends equal the derivation (bf16 [K | V], f32 [dK | dV]), 0
 *      bytes staged (planted via host: 2 x the sends); and the oracle with
 *      bf16 scores and a bf16 lse (what a bf16-accumulating sdpa_cp computes)
 *      fails the same bounds.
 * Tolerances: a result is a chain of dot products of at most S + HD terms
 * over inputs in [-1, 1]. The worst-case bound for a length-n sum is n u, but
 * rounding errors of independent sign grow like sqrt(n) u (the probabilistic
 * bound of Higham & Mary, SIAM J. Sci. Comput. 2019, Thm. 3.1), so
 * c sqrt(S + HD) u (u = the dtype's unit roundoff, relative with floor 1)
 * with c = 4 for the forward (a GEMM, the softmax, a GEMM), 8 for the
 * gradients (two more chained GEMMs and a row sum). The run prints the worst
 * error as a fraction of it.
 */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kerntest.h"

#ifdef KERN_ON_CUDA
static const bool ON_CUDA = true;
#else
static const bool ON_CUDA = false;
#endif

/* ---- (a) the row kernels ----------------------------------------------------------- */

static void test_rows(kt_dev *T) {
  static const int64_t nks[] = {1, 7, 300, 1000};
  static const dt_dtype ts[] = {DT_F32, DT_F64, DT_BF16};
  for (int ti = 0; ti < 3; ti++)
    for (int ki = 0; ki < 4; ki++) {
      dt_dtype t = ts[ti];
      size_t es = dt_dtype_size(t);
      int64_t nk = nks[ki], rows = 5, batch = 3, ld = nk + 3, stride = rows * ld + 2;
      int64_t n = batch * stride;
      /* causal rows (vis0 = nk - rows + 1: the last row sees every key), or none */
      for (int causal = 0; causal < 2; causal++) {
        int64_t vis0 = causal ? nk - rows + 1 : nk;
        double *x = malloc(n * sizeof *x), *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
        kt_uniform(x, n, 21, (uint64_t)(ti * 8 + ki * 2 + causal), -8, 8);
        void *hx = kt_pack(t, x, n), *hy = malloc(n * es);
        kt_unpack(t, hx, x, n);
        memcpy(want, x, n * sizeof *x);
        for (int64_t b = 0; b < batch; b++)
          for (int64_t r = 0; r < rows; r++) {
            double *p = want + b * stride + r * ld, mx = -INFINITY, z = 0;
            int64_t cnt = vis0 + r < 0 ? 0 : vis0 + r < nk ? vis0 + r : nk;
            for (int64_t j = 0; j < cnt; j++) mx = fmax(mx, p[j]);
            for (int64_t j = 0; j < cnt; j++) z += exp(p[j] - mx);
            for (int64_t j = 0; j < nk; j++) p[j] = j < cnt ? exp(p[j] - mx) / z : 0;
          }
        void *dx = kt_up(T, hx, n * es);
        dt_attn_rows g = {.batch = batch, .rows = rows, .nk = nk, .vis0 = vis0, .ld = ld, .stride = stride};
        TU_OK(T->ctx, T->K->attn->softmax(T->dev, t, &g, dx));
        kt_down(T, hy, dx, n * es);
        kt_unpack(t, hy, got, n);
        /* exp, the sum (a tree of <= 1000 terms: log2 levels) and the scale
         * round in the arithmetic type, then the store in t; the padding
         * between rows is untouched (compared exactly) */
        double tol = 16 * kt_unit(t == DT_F64 ? DT_F64 : DT_F32) + kt_unit(t);
        char what[96];
        snprintf(what, sizeof what, "attn.softmax %s nk=%lld %s", dt_dtype_name(t), (long long)nk,
                 causal ? "causal" : "full");
        kt_close_to(what, got, want, n, tol);
        kt_free(T, dx, n * es);
        free(x), free(want), free(got), free(hx), free(hy);
      }
    }
  printf("attn.softmax: f32, f64, bf16 x nk 1, 7, 300, 1000, causal and full\n");

  /* online: two key blocks per row; after both, finish gives O / l and lse */
  for (int ti = 0; ti < 2; ti++) {
    dt_dtype t = ts[ti], at = t;
    size_t es = dt_dtype_size(t);
    int64_t rows = 6, nk = 300, hd = 64;
    double *s1 = malloc(rows * nk * sizeof(double)), *s2 = malloc(rows * nk * sizeof(double));
    double *o = malloc(rows * hd * sizeof(double));
    kt_uniform(s1, rows * nk, 31, 0, -6, 6);
    kt_uniform(s2, rows * nk, 31, 1, -3, 9); /* larger max: the rescale runs */
    kt_uniform(o, rows * hd, 31, 2, -1, 1);
    double m0[6], l0[6];
    for (int64_t r = 0; r < rows; r++) m0[r] = -INFINITY, l0[r] = 0;
    void *h1 = kt_pack(t, s1, rows * nk), *h2 = kt_pack(t, s2, rows * nk), *ho = kt_pack(t, o, rows * hd);
    void *hm = kt_pack(at, m0, rows), *hl = kt_pack(at, l0, rows);
    void *d1 = kt_up(T, h1, rows * nk * es), *d2 = kt_up(T, h2, rows * nk * es);
    void *dO = kt_up(T, NULL, rows * hd * es), *dm = kt_up(T, hm, rows * es), *dl = kt_up(T, hl, rows * es);
    void *dlse = kt_up(T, NULL, rows * es);
    TU_OK(T->ctx, dt_device_fill(T->dev, t, dO, rows * hd, 0.0));
    dt_attn_rows g1 = {.batch = 1, .rows = rows, .nk = nk, .vis0 = nk, .ld = nk, .sld = 1};
    dt_attn_rows g2 = {.batch = 1, .rows = rows, .nk = nk, .vis0 = nk - rows + 1, .ld = nk, .sld = 1};
    /* O accumulates P V with V = the identity on the first hd keys: O[r][c] +=
     * P[r][c]; done on the host between the steps (the op does it by GEMM) */
    double *want_o = calloc(rows * hd, sizeof(double)), *want_lse = malloc(rows * sizeof(double));
    double *p1 = malloc(rows * nk * sizeof(double)), *p2 = malloc(rows * nk * sizeof(double));
    TU_OK(T->ctx, T->K->attn->online(T->dev, t, &g1, d1, dm, dl, dO, hd, 0, hd));
    kt_down(T, h1, d1, rows * nk * es);
    kt_unpack(t, h1, p1, rows * nk);
    double *oh = malloc(rows * hd * sizeof(double));
    for (int64_t r = 0; r < rows; r++)
      for (int64_t c = 0; c < hd; c++) oh[r * hd + c] = p1[r * nk + c];
    void *hoh = kt_pack(t, oh, rows * hd);
    kt_free(T, dO, rows * hd * es);
    dO = kt_up(T, hoh, rows * hd * es);
    TU_OK(T->ctx, T->K->attn->online(T->dev, t, &g2, d2, dm, dl, dO, hd, 0, hd));
    kt_down(T, h2, d2, rows * nk * es);
    kt_unpack(t, h2, p2, rows * nk);
    kt_down(T, hoh, dO, rows * hd * es);
    kt_unpack(t, hoh, oh, rows * hd);
    for (int64_t r = 0; r < rows; r++)
      for (int64_t c = 0; c < hd; c++) oh[r * hd + c] += p2[r * nk + c];
    free(hoh);
    hoh = kt_pack(t, oh, rows * hd);
    kt_free(T, dO, rows * hd * es);
    dO = kt_up(T, hoh, rows * hd * es);
    TU_OK(T->ctx, T->K->attn->finish(T->dev, t, rows, hd, dO, dm, dl, dlse));
    double *got_o = malloc(rows * hd * sizeof(double)), got_lse[6];
    kt_down(T, hoh, dO, rows * hd * es);
    kt_unpack(t, hoh, got_o, rows * hd);
    void *hlse = malloc(rows * es);
    kt_down(T, hlse, dlse, rows * es);
    kt_unpack(t, hlse, got_lse, rows);
    /* the reference: softmax over the union of both blocks' visible keys */
    double *r1 = malloc(rows * nk * sizeof(double)), *r2 = malloc(rows * nk * sizeof(double));
    void *q1 = kt_pack(t, s1, rows * nk), *q2 = kt_pack(t, s2, rows * nk);
    kt_unpack(t, q1, r1, rows * nk);
    kt_unpack(t, q2, r2, rows * nk);
    for (int64_t r = 0; r < rows; r++) {
      int64_t c2 = g2.vis0 + r < nk ? g2.vis0 + r : nk;
      double mx = -INFINITY, z = 0;
      for (int64_t j = 0; j < nk; j++) mx = fmax(mx, r1[r * nk + j]);
      for (int64_t j = 0; j < c2; j++) mx = fmax(mx, r2[r * nk + j]);
      for (int64_t j = 0; j < nk; j++) z += exp(r1[r * nk + j] - mx);
      for (int64_t j = 0; j < c2; j++) z += exp(r2[r * nk + j] - mx);
      want_lse[r] = mx + log(z);
      for (int64_t c = 0; c < hd; c++)
        want_o[r * hd + c] = (exp(r1[r * nk + c] - mx) + (c < c2 ? exp(r2[r * nk + c] - mx) : 0)) / z;
    }
    /* exp, the rescales and the tree sums: a few dozen roundings at most */
    double tol = 64 * kt_unit(t);
    char what[64];
    snprintf(what, sizeof what, "attn.online+finish out %s", dt_dtype_name(t));
    kt_close_to(what, got_o, want_o, rows * hd, tol);
    snprintf(what, sizeof what, "attn.online+finish lse %s", dt_dtype_name(t));
    kt_close_to(what, got_lse, want_lse, rows, tol);
    kt_free(T, d1, rows * nk * es), kt_free(T, d2, rows * nk * es), kt_free(T, dO, rows * hd * es);
    kt_free(T, dm, rows * es), kt_free(T, dl, rows * es), kt_free(T, dlse, rows * es);
    free(s1), free(s2), free(o), free(h1), free(h2), free(ho), free(hm), free(hl), free(want_o);
    free(want_lse), free(p1), free(p2), free(oh), free(hoh), free(got_o), free(hlse), free(r1), free(r2);
    free(q1), free(q2);
  }
  printf("attn.online, attn.finish: f32, f64, two key blocks\n");
}

/* softmax_bwd, rowdot and lse_bwd against direct loops in double: key counts
 * 1, 7, 300, 1000 (masks partial and none), f32 and f64 (rowdot bf16 too: the
 * ops call it on bf16 out and dout); head dims 64 and 300 for rowdot. */
static void test_rows_bwd(kt_dev *T) {
  static const int64_t nks[] = {1, 7, 300, 1000};
  static const dt_dtype ts[] = {DT_F32, DT_F64, DT_BF16};
  for (int ti = 0; ti < 2; ti++)
    for (int ki = 0; ki < 4; ki++)
      for (int causal = 0; causal < 2; causal++) {
        dt_dtype t = ts[ti], st = dt_kern_attn_stat(T->K->attn, t);
        size_t es = dt_dtype_size(t), ss = dt_dtype_size(st);
        int64_t nk = nks[ki], rows = 5, batch = 3, ld = nk + 3, stride = rows * ld + 2;
        int64_t n = batch * stride, vis0 = causal ? nk - rows + 1 : nk, sld = 2, sstride = rows * sld + 1;
        int64_t ns = batch * sstride;
        double *S = malloc(n * sizeof *S), *dP = malloc(n * sizeof *dP), *P = malloc(n * sizeof *P);
        double *lse = calloc(ns, sizeof *lse), *D = malloc(ns * sizeof *D);
        double *wP = malloc(n * sizeof *wP), *wS = malloc(n * sizeof *wS), *got = malloc(n * sizeof *got);
        uint64_t sd = (uint64_t)(100 + ti * 8 + ki * 2 + causal);
        kt_uniform(S, n, 61, sd, -8, 8);
        kt_uniform(dP, n, 62, sd, -1, 1);
        kt_uniform(D, ns, 63, sd, -1, 1);
        kt_round(t, S, n);
        kt_round(t, dP, n);
        kt_round(st, D, ns);
        /* P: the rows' softmax (rounded to t), lse: their log-sum-exp (rounded) */
        memcpy(P, S, n * sizeof *P);
        for (int64_t b = 0; b < batch; b++)
          for (int64_t r = 0; r < rows; r++) {
            double *s = S + b * stride + r * ld, *p = P + b * stride + r * ld, mx = -INFINITY, z = 0;
            int64_t cnt = vis0 + r < 0 ? 0 : vis0 + r < nk ? vis0 + r : nk;
            for (int64_t j = 0; j < cnt; j++) mx = fmax(mx, s[j]);
            for (int64_t j = 0; j < cnt; j++) z += exp(s[j] - mx);
            for (int64_t j = 0; j < nk; j++) p[j] = j < cnt ? exp(s[j] - mx) / z : 0;
            lse[b * sstride + r * sld] = cnt ? mx + log(z) : 0;
          }
        kt_round(t, P, n);
        kt_round(t, lse, ns);
        memcpy(wS, dP, n * sizeof *wS);
        memcpy(wP, S, n * sizeof *wP);
        double *wL = malloc(n * sizeof *wL);
        memcpy(wL, dP, n * sizeof *wL);
        for (int64_t b = 0; b < batch; b++)
          for (int64_t r = 0; r < rows; r++) {
            int64_t o = b * stride + r * ld, cnt = vis0 + r < 0 ? 0 : vis0 + r < nk ? vis0 + r : nk;
            double rs = 0, ls = lse[b * sstride + r * sld], di = D[b * sstride + r * sld];
            for (int64_t j = 0; j < cnt; j++) rs += P[o + j] * dP[o + j];
            for (int64_t j = 0; j < nk; j++) {
              wS[o + j] = j < cnt ? P[o + j] * (dP[o + j] - rs) : 0;
              double e = exp(S[o + j] - ls);
              wP[o + j] = j < cnt ? e : 0;
              wL[o + j] = j < cnt ? e * (dP[o + j] - di) : 0;
            }
          }
        dt_attn_rows g = {.batch = batch, .rows = rows, .nk = nk, .vis0 = vis0, .ld = ld,
                          .stride = stride, .sld = sld, .sstride = sstride};
        char what[96];
        /* softmax_bwd: the row sum (a tree of <= 1000 terms of |P dP| <= 1,
         * summing to at most 1: log2 levels), the subtract and multiply in the
         * arithmetic type, then the store in t; padding untouched */
        const double ua = kt_unit(t == DT_F64 ? DT_F64 : DT_F32), tol = 16 * ua + kt_unit(t);
        void *hP = kt_pack(t, P, n), *hd = kt_pack(t, dP, n), *hy = malloc(n * es);
        void *dPp = kt_up(T, hP, n * es), *ddP = kt_up(T, hd, n * es);
        TU_OK(T->ctx, T->K->attn->softmax_bwd(T->dev, t, &g, dPp, ddP));
        kt_down(T, hy, ddP, n * es);
        kt_unpack(t, hy, got, n);
        snprintf(what, sizeof what, "attn.softmax_bwd %s nk=%lld %s", dt_dtype_name(t), (long long)nk,
                 causal ? "causal" : "full");
        kt_close_to(what, got, wS, n, tol);
        /* the check can fail: a reference without the row sum is refused */
        for (int64_t i = 0; i < n; i++) wP[i] = P[i] * dP[i];
        TU_CHECK(kt_mismatch(got, wP, n, tol) >= 0, "%s: P dP without the row sum passes", what);
        memcpy(wP, S, n * sizeof *wP);
        for (int64_t b = 0; b < batch; b++)
          for (int64_t r = 0; r < rows; r++) {
            int64_t o = b * stride + r * ld, cnt = vis0 + r < 0 ? 0 : vis0 + r < nk ? vis0 + r : nk;
            for (int64_t j = 0; j < nk; j++)
              wP[o + j] = j < cnt ? exp(S[o + j] - lse[b * sstride + r * sld]) : 0;
          }
        kt_free(T, dPp, n * es), kt_free(T, ddP, n * es);
        free(hP), free(hd);
        /* lse_bwd: s - lse (|lse| < 16: 16 ua of absolute error in exp's
         * argument, relative in P), the exp, then one subtract and multiply */
        void *hS = kt_pack(t, S, n), *hl = kt_pack(t, lse, ns), *hD = kt_pack(st, D, ns);
        hd = kt_pack(t, dP, n);
        void *dS_ = kt_up(T, hS, n * es), *ddS = kt_up(T, hd, n * es);
        void *dl = kt_up(T, hl, ns * es), *dD = kt_up(T, hD, ns * ss);
        TU_OK(T->ctx, T->K->attn->lse_bwd(T->dev, t, &g, dS_, ddS, dl, dD));
        kt_down(T, hy, dS_, n * es);
        kt_unpack(t, hy, got, n);
        snprintf(what, sizeof what, "attn.lse_bwd P %s nk=%lld %s", dt_dtype_name(t), (long long)nk,
                 causal ? "causal" : "full");
        kt_close_to(what, got, wP, n, 2 * tol);
        kt_down(T, hy, ddS, n * es);
        kt_unpack(t, hy, got, n);
        snprintf(what, sizeof what, "attn.lse_bwd dS %s nk=%lld %s", dt_dtype_name(t), (long long)nk,
                 causal ? "causal" : "full");
        kt_close_to(what, got, wL, n, 4 * tol);
        kt_free(T, dS_, n * es), kt_free(T, ddS, n * es), kt_free(T, dl, ns * es), kt_free(T, dD, ns * ss);
        free(hS), free(hl), free(hD), free(hd), free(hy);
        free(S), free(dP), free(P), free(lse), free(D), free(wP), free(wS), free(wL), free(got);
      }
  printf("attn.softmax_bwd, attn.lse_bwd: f32, f64 x nk 1, 7, 300, 1000, causal and full\n");
  /* rowdot: n rows of hd, D in the statistics' type; a tree over hd products of
   * inputs in [-1, 1] (|D| <= hd): log2(hd) levels of ua |D|-scaled error */
  static const int64_t hds[] = {64, 300};
  for (int ti = 0; ti < 3; ti++)
    for (int hi = 0; hi < 2; hi++) {
      dt_dtype t = ts[ti], st = dt_kern_attn_stat(T->K->attn, t);
      size_t es = dt_dtype_size(t), ss = dt_dtype_size(st);
      int64_t rows = 9, hd = hds[hi], n = rows * hd;
      double *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), want[9], got[9];
      kt_uniform(a, n, 71, (uint64_t)(ti * 2 + hi), -1, 1);
      kt_uniform(b, n, 72, (uint64_t)(ti * 2 + hi), -1, 1);
      void *ha = kt_pack(t, a, n), *hb = kt_pack(t, b, n);
      kt_unpack(t, ha, a, n);
      kt_unpack(t, hb, b, n);
      for (int64_t r = 0; r < rows; r++) {
        want[r] = 0;
        for (int64_t c = 0; c < hd; c++) want[r] += a[r * hd + c] * b[r * hd + c];
      }
      void *da = kt_up(T, ha, n * es), *db = kt_up(T, hb, n * es), *dD = kt_up(T, NULL, rows * ss);
      TU_OK(T->ctx, T->K->attn->rowdot(T->dev, t, rows, hd, da, db, dD));
      void *hD = malloc(rows * ss);
      kt_down(T, hD, dD, rows * ss);
      kt_unpack(st, hD, got, rows);
      char what[64];
      snprintf(what, sizeof what, "attn.rowdot %s hd=%lld", dt_dtype_name(t), (long long)hd);
      kt_close_to(what, got, want, rows, 16 * (double)hd * kt_unit(t == DT_F64 ? DT_F64 : DT_F32));
      kt_free(T, da, n * es), kt_free(T, db, n * es), kt_free(T, dD, rows * ss);
      free(a), free(b), free(ha), free(hb), free(hD);
    }
  printf("attn.rowdot: f32, f64, bf16 x head dim 64, 300\n");
}

/* The largest error of the op checks as a fraction of their tolerance, per
 * family (0 forward, 1 gradients), printed at the end: how near the bound
 * the kernels come. */
static double worst[2];

static void close_to(int fam, const char *what, const double *got, const double *want, int64_t n,
                     double tol) {
  for (int64_t i = 0; i < n; i++) {
    double e = fabs(got[i] - want[i]) / (fabs(want[i]) > 1 ? fabs(want[i]) : 1) / tol;
    if (e > worst[fam]) worst[fam] = e;
  }
  kt_close_to(what, got, want, n, tol);
}

/* ---- the naive reference ------------------------------------------------------------ */

/* Geometry of one case: logical [B, H, S, HD] (kv: KVH heads), stored in layout
 * `lay` (0 [b, h, s, hd], 1 [b, s, h, hd]); pos[i]: position of stored row i
 * (causal: key j visible to query i iff pos[j] <= pos[i]; nomask: all). */
typedef struct acase {
  int64_t B, H, KVH, S, HD;
  int lay;
  const int64_t *pos;
  bool nomask;
  /* planted, what a bf16-accumulating sdpa_cp computes first: each scaled
   * score rounded to bf16 (a bf16 C of the scores GEMM) and, backward, P
   * recomputed as exp(score - lse) from lse rounded to bf16 (a bf16 lse) */
  bool bf16_scores;
  /* when set, D_i = rowsum(dO_i * O_i) from this out (laid out like q)
   * instead of the exact one: the stored out, which FlashAttention-2's
   * backward (Alg. 2, line 4) reads, so the oracle is exact arithmetic on
   * what the algorithm reads */
  const double *d_out;
  /* when set, sum |term| of each dq, dk, dv element: the scale of its
   * operands' roundings (see ring_tol) */
  double *dqmag, *dkmag, *dvmag;
} acase;

static int64_t at(const acase *c, int64_t nh, int64_t b, int64_t h, int64_t s, int64_t d) {
  return c->lay == 0 ? ((b * nh + h) * c->S + s) * c->HD + d : ((b * c->S + s) * nh + h) * c->HD + d;
}
static int64_t lse_at(const acase *c, int64_t b, int64_t h, int64_t s) {
  return c->lay == 0 ? (b * c->H + h) * c->S + s : (b * c->S + s) * c->H + h;
}

/* out, lse (either may be NULL) and, with dO, dq dk dv (zeroed here). */
static void ref_attn(const acase *c, const double *q, const double *k, const double *v,
                     const double *dO, double *out, double *lse, double *dq, double *dk, double *dv) {
  int64_t S = c->S, HD = c->HD, grp = c->H / c->KVH;
  double sc = 1.0 / sqrt((double)HD);
  double *P = malloc(S * sizeof *P), *dP = malloc(S * sizeof *dP);
  if (dO) {
    memset(dq, 0, c->B * c->H * S * HD * sizeof *dq);
    memset(dk, 0, c->B * c->KVH * S * HD * sizeof *dk);
    memset(dv, 0, c->B * c->KVH * S * HD * sizeof *dv);
  }
  if (dO && c->dqmag) {
    memset(c->dqmag, 0, c->B * c->H * S * HD * sizeof *dq);
    memset(c->dkmag, 0, c->B * c->KVH * S * HD * sizeof *dk);
    memset(c->dvmag, 0, c->B * c->KVH * S * HD * sizeof *dv);
  }
  for (int64_t b = 0; b < c->B; b++)
    for (int64_t h = 0; h < c->H; h++) {
      int64_t kh = h / grp; /* repeat_kv */
      for (int64_t i = 0; i < S; i++) {
        double mx = -INFINITY, z = 0;
        for (int64_t j = 0; j < S; j++) {
          if (!c->nomask && c->pos[j] > c->pos[i]) {
            P[j] = -INFINITY;
            continue;
          }
          double s = 0;
          for (int64_t d = 0; d < HD; d++) s += q[at(c, c->H, b, h, i, d)] * k[at(c, c->KVH, b, kh, j, d)];
          P[j] = s * sc;
          if (c->bf16_scores) P[j] = dt_bf16_to_f32(dt_f32_to_bf16((float)P[j]));
          mx = fmax(mx, P[j]);
        }
        for (int64_t j = 0; j < S; j++) z += P[j] == -INFINITY ? 0 : exp(P[j] - mx);
        for (int64_t j = 0; j < S; j++) P[j] = P[j] == -INFINITY ? 0 : exp(P[j] - mx) / z;
        if (lse) lse[lse_at(c, b, h, i)] = mx + log(z);
        if (out)
          for (int64_t d = 0; d < HD; d++) {
            double acc = 0;
            for (int64_t j = 0; j < S; j++) acc += P[j] * v[at(c, c->KVH, b, kh, j, d)];
            out[at(c, c->H, b, h, i, d)] = acc;
          }
        if (c->bf16_scores && dO) { /* backward: P = exp(s - bf16(lse)), from P = exp(s - mx) / z */
          double lb = dt_bf16_to_f32(dt_f32_to_bf16((float)(mx + log(z))));
          for (int64_t j = 0; j < S; j++) P[j] = P[j] == 0 ? 0 : exp(log(P[j] * z) + mx - lb);
        }
        if (!dO) continue;
        /* softmax Jacobian: dS_j = P_j (dP_j - sum_l P_l dP_l) */
        double rs = 0;
        for (int64_t j = 0; j < S; j++) {
          dP[j] = 0;
          for (int64_t d = 0; d < HD; d++) dP[j] += dO[at(c, c->H, b, h, i, d)] * v[at(c, c->KVH, b, kh, j, d)];
          rs += P[j] * dP[j];
        }
        if (c->d_out) {
          rs = 0;
          for (int64_t d = 0; d < HD; d++)
            rs += dO[at(c, c->H, b, h, i, d)] * c->d_out[at(c, c->H, b, h, i, d)];
        }
        for (int64_t j = 0; j < S; j++) {
          double ds = P[j] * (dP[j] - rs) * sc;
          for (int64_t d = 0; d < HD; d++) {
            dq[at(c, c->H, b, h, i, d)] += ds * k[at(c, c->KVH, b, kh, j, d)];
            dk[at(c, c->KVH, b, kh, j, d)] += ds * q[at(c, c->H, b, h, i, d)];
            dv[at(c, c->KVH, b, kh, j, d)] += P[j] * dO[at(c, c->H, b, h, i, d)];
            if (!c->dqmag) continue;
            const double kj = fabs(k[at(c, c->KVH, b, kh, j, d)]), qi = fabs(q[at(c, c->H, b, h, i, d)]);
            c->dqmag[at(c, c->H, b, h, i, d)] += fabs(ds) * kj;
            c->dkmag[at(c, c->KVH, b, kh, j, d)] += fabs(ds) * qi;
            c->dvmag[at(c, c->KVH, b, kh, j, d)] += fabs(P[j] * dO[at(c, c->H, b, h, i, d)]);
          }
        }
      }
    }
  free(P), free(dP);
}

/* ---- the ops on the device ------------------------------------------------------------ */

/* A one-rank DTensor on the device holding v (dtype t), placement pl. */
static void dev_tensor(dt_ctx *ctx, dt_mesh *mesh, dt_dtype t, dt_placement pl, int ndim,
                       const int64_t *shape, const double *v, dt_tensor *out) {
  TU_OK(ctx, dt_tensor_meta(ctx, mesh, &pl, ndim, shape, t, "test", out));
  TU_OK(ctx, dt_array_create(ctx, DT_DEV_CUDA, t, ndim, shape, &out->local));
  void *h = kt_pack(t, v, out->local.numel);
  TU_OK(ctx, dt_device_copy(ctx->device, out->local.data, h, dt_array_bytes(&out->local), DT_COPY_H2D));
  free(h);
}

/* The device tensor's values as doubles (n of them). */
static void dev_read(dt_ctx *ctx, const dt_tensor *x, double *v) {
  size_t nb = dt_array_bytes(&x->local);
  void *h = malloc(nb ? nb : 1);
  TU_OK(ctx, dt_device_sync(ctx->device));
  TU_OK(ctx, dt_device_copy(ctx->device, h, x->local.data, nb, DT_COPY_D2H));
  kt_unpack(x->local.dtype, h, v, x->local.numel);
  free(h);
}

/* Inputs rounded to t (the reference sees what the device sees). */
static double *rounded(dt_dtype t, int64_t n, uint64_t stream) {
  double *v = malloc(n * sizeof *v);
  kt_uniform(v, n, 41, stream, -1, 1);
  kt_round(t, v, n);
  return v;
}

typedef struct run_out {
  double *out, *lse, *dq, *dk, *dv; /* lse: cp only */
} run_out;

/* Runs sdpa (cp_chunks 0) or sdpa_cp on a one-rank mesh ("cp"), forward and,
 * when dO, backward; fills r (allocated here). */
static dt_status run_op(dt_ctx *ctx, dt_mesh *mesh, dt_dtype t, const acase *c, int cp_chunks, int bq,
                        const double *q, const double *k, const double *v, const double *G,
                        run_out *r) {
  int hdim = c->lay == 0 ? 1 : 2, sdim = c->lay == 0 ? 2 : 1;
  int64_t qs[4] = {c->B, c->H, c->S, c->HD}, ks[4] = {c->B, c->KVH, c->S, c->HD};
  if (c->lay == 1) {
    qs[1] = ks[1] = c->S;
    qs[2] = c->H;
    ks[2] = c->KVH;
  }
  (void)hdim;
  dt_placement pl = cp_chunks ? dt_shard(sdim) : dt_replicate();
  dt_tensor tq, tk, tv, to[2], tg, gi[3];
  dev_tensor(ctx, mesh, t, pl, 4, qs, q, &tq);
  dev_tensor(ctx, mesh, t, pl, 4, ks, k, &tk);
  dev_tensor(ctx, mesh, t, pl, 4, ks, v, &tv);
  dt_op_attrs a = DT_OP_ATTRS_INIT;
  a.i0 = c->lay;
  const dt_op *op = &dt_op_sdpa;
  if (cp_chunks) {
    op = &dt_op_sdpa_cp;
    a.dim = 0;
    a.i1 = cp_chunks;
    a.i2 = DT_CP_RING;
  } else {
    a.i2 = bq;
  }
  const dt_tensor *in[3] = {&tq, &tk, &tv};
  dt_tensor *out[2] = {&to[0], &to[1]};
  dt_status s = dt_op_call(ctx, op, &a, in, out, NULL);
  int64_t nq = c->B * c->H * c->S * c->HD, nk = c->B * c->KVH * c->S * c->HD;
  memset(r, 0, sizeof *r);
  if (s == DT_OK) {
    r->out = malloc(nq * sizeof(double));
    dev_read(ctx, &to[0], r->out);
    if (cp_chunks) {
      r->lse = malloc(c->B * c->H * c->S * sizeof(double));
      dev_read(ctx, &to[1], r->lse);
    }
  }
  if (s == DT_OK && G) {
    dev_tensor(ctx, mesh, t, pl, 4, qs, G, &tg);
    const dt_tensor *gout[2] = {&tg, NULL};
    dt_tensor *gin[3] = {&gi[0], &gi[1], &gi[2]};
    const dt_tensor *oc[2] = {&to[0], &to[1]};
    s = op->backward(ctx, &a, in, oc, gout, gin);
    if (s == DT_OK) {
      r->dq = malloc(nq * sizeof(double));
      r->dk = malloc(nk * sizeof(double));
      r->dv = malloc(nk * sizeof(double));
      dev_read(ctx, &gi[0], r->dq);
      dev_read(ctx, &gi[1], r->dk);
      dev_read(ctx, &gi[2], r->dv);
      for (int j = 0; j < 3; j++) dt_tensor_free(ctx, &gi[j]);
    }
    dt_tensor_free(ctx, &tg);
  }
  if (r->out) {
    dt_tensor_free(ctx, &to[0]);
    if (cp_chunks) dt_tensor_free(ctx, &to[1]);
  }
  dt_tensor_free(ctx, &tq), dt_tensor_free(ctx, &tk), dt_tensor_free(ctx, &tv);
  return s;
}

static void run_free(run_out *r) { free(r->out), free(r->lse), free(r->dq), free(r->dk), free(r->dv); }

/* (b), (c), and (e) on the f64 sdpa cases: one case against the reference. */
static void check_case(dt_ctx *ctx, dt_mesh *mesh, dt_dtype t, const acase *c, int cp_chunks, int bq) {
  int64_t nq = c->B * c->H * c->S * c->HD, nk = c->B * c->KVH * c->S * c->HD;
  uint64_t st = (uint64_t)(c->S * 1000 + c->HD * 10 + c->H);
  double *q = rounded(t, nq, st), *k = rounded(t, nk, st + 1), *v = rounded(t, nk, st + 2);
  double *G = rounded(t, nq, st + 3);
  double *o = malloc(nq * sizeof *o), *lse = malloc(c->B * c->H * c->S * sizeof *lse);
  double *dq = malloc(nq * sizeof *dq), *dk = malloc(nk * sizeof *dk), *dv = malloc(nk * sizeof *dv);
  ref_attn(c, q, k, v, G, o, lse, dq, dk, dv);
  run_out r;
  char what[160];
  snprintf(what, sizeof what, "%s %s B%lld H%lld KVH%lld S%lld HD%lld layout %d bq %d", cp_chunks ? "sdpa_cp" : "sdpa",
           dt_dtype_name(t), (long long)c->B, (long long)c->H, (long long)c->KVH, (long long)c->S,
           (long long)c->HD, c->lay, cp_chunks ? cp_chunks : bq);
  dt_status s = run_op(ctx, mesh, t, c, cp_chunks, bq, q, k, v, G, &r);
  TU_CHECK(s == DT_OK, "%s: %s", what, dt_last_error(ctx));
  if (s == DT_OK) {
    double u = kt_unit(t), n = sqrt((double)(c->S + c->HD));
    char w2[200];
    snprintf(w2, sizeof w2, "%s out", what);
    close_to(0, w2, r.out, o, nq, 4 * n * u);
    if (cp_chunks) {
      snprintf(w2, sizeof w2, "%s lse", what);
      close_to(0, w2, r.lse, lse, c->B * c->H * c->S, 4 * n * u);
    }
    snprintf(w2, sizeof w2, "%s dq", what);
    close_to(1, w2, r.dq, dq, nq, 8 * n * u);
    snprintf(w2, sizeof w2, "%s dk", what);
    close_to(1, w2, r.dk, dk, nk, 8 * n * u);
    snprintf(w2, sizeof w2, "%s dv", what);
    close_to(1, w2, r.dv, dv, nk, 8 * n * u);
    if (c->S > 1 && !cp_chunks && bq == 0 && t == DT_F64) {
      /* (e) the same check refuses a reference that drops the causal mask */
      acase nm = *c;
      nm.nomask = true;
      ref_attn(&nm, q, k, v, NULL, o, NULL, NULL, NULL, NULL);
      TU_CHECK(kt_mismatch(r.out, o, nq, 4 * n * u) >= 0, "%s: the unmasked reference passes", what);
    }
  }
  run_free(&r);
  free(q), free(k), free(v), free(G), free(o), free(lse), free(dq), free(dk), free(dv);
}

/* (d) central differences of loss = sum(out G) on the device forward. */
static void check_fd(dt_ctx *ctx, dt_mesh *mesh, const acase *c, int cp_chunks) {
  const dt_dtype t = DT_F64;
  int64_t nq = c->B * c->H * c->S * c->HD, nk = c->B * c->KVH * c->S * c->HD;
  double *x[3] = {rounded(t, nq, 501), rounded(t, nk, 502), rounded(t, nk, 503)};
  double *G = rounded(t, nq, 504);
  int64_t nx[3] = {nq, nk, nk};
  run_out r;
  TU_OK(ctx, run_op(ctx, mesh, t, c, cp_chunks, 2, x[0], x[1], x[2], G, &r));
  if (!r.dq) return;
  double *grad[3] = {r.dq, r.dk, r.dv};
  /* h = 1e-5: truncation ~h^2 |f'''| (smooth, O(1) derivatives: ~1e-10),
   * round-off ~u |L| / h (|L| < 100: ~2e-9); 1e-7 is far below a wrong
   * gradient (O(0.01) and more) */
  const double h = 1e-5, tol = 1e-7;
  static const char *const NM[3] = {"dq", "dk", "dv"};
  for (int j = 0; j < 3; j++) {
    double *fd = malloc(nx[j] * sizeof *fd);
    for (int64_t e = 0; e < nx[j]; e++) {
      double keep = x[j][e], L[2];
      for (int sgn = 0; sgn < 2; sgn++) {
        x[j][e] = keep + (sgn ? -h : h);
        run_out f;
        TU_OK(ctx, run_op(ctx, mesh, t, c, cp_chunks, 2, x[0], x[1], x[2], NULL, &f));
        L[sgn] = 0;
        for (int64_t i = 0; f.out && i < nq; i++) L[sgn] += f.out[i] * G[i];
        run_free(&f);
      }
      x[j][e] = keep;
      fd[e] = (L[0] - L[1]) / (2 * h);
    }
    char what[96];
    snprintf(what, sizeof what, "%s finite differences %s layout %d", cp_chunks ? "sdpa_cp" : "sdpa", NM[j], c->lay);
    kt_close_to(what, grad[j], fd, nx[j], tol);
    free(fd);
  }
  run_free(&r);
  for (int j = 0; j < 3; j++) free(x[j]);
  free(G);
}

/* ---- (g) sdpa_cp bf16 over a ring of two cuda-emu ranks, and its traffic ---------------- */

/* Rows [off, off + len) of dim sd of the row-major array g (nd dims, shape gs). */
static double *slice(const double *g, const int64_t *gs, int nd, int sd, int64_t off, int64_t len) {
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < sd; d++) outer *= gs[d];
  for (int d = sd + 1; d < nd; d++) inner *= gs[d];
  double *o = malloc((size_t)(outer * len * inner + 1) * sizeof *o);
  for (int64_t a = 0; a < outer; a++)
    memcpy(o + a * len * inner, g + (a * gs[sd] + off) * inner, (size_t)(len * inner) * sizeof *o);
  return o;
}

/* This rank's shard (placement pl) of the global array v on the device. */
static void dev_shard(dt_ctx *ctx, dt_mesh *mesh, dt_dtype t, dt_placement pl, int nd,
                      const int64_t *gs, const double *v, dt_tensor *out) {
  TU_OK(ctx, dt_tensor_meta(ctx, mesh, &pl, nd, gs, t, "test", out));
  int64_t ls[DT_MAX_DIMS];
  dt_tensor_local_shape(out, ls);
  TU_OK(ctx, dt_array_create(ctx, DT_DEV_CUDA, t, nd, ls, &out->local));
  int sd = pl.kind == DT_PL_SHARD ? pl.dim : 0;
  double *loc = slice(v, gs, nd, sd, out->goffset[sd], ls[sd]);
  void *h = kt_pack(t, loc, out->local.numel);
  TU_OK(ctx, dt_device_copy(ctx->device, out->local.data, h, dt_array_bytes(&out->local), DT_COPY_H2D));
  free(h), free(loc);
}

/* The bytes this rank sent on communicator `group` since the last ledger clear,
 * and how many of the sends were of dtype t. */
static uint64_t sent_bytes(const dt_ctx *ctx, const char *group, dt_dtype t, int *n_t) {
  const dt_ledger *L = dt_ledger_of(ctx);
  uint64_t b = 0;
  *n_t = 0;
  for (size_t i = 0; i < L->n; i++) {
    const dt_ledger_row *r = &L->rows[i];
    if (r->op != DT_COLL_SEND || strcmp(r->group, group)) continue;
    b += r->payload_bytes;
    *n_t += r->dtype == (int)t;
  }
  return b;
}

/* Eager device messages: the sender overwrites its buffer right after each
 * send, the receiver must still get what was sent, and nothing goes through
 * the host (then, with the test switch p2p_via_host, everything does: a D2H
 * copy per send and an H2D copy per receive). */
static void check_p2p(dt_ctx *ctx, bool via_host) {
  dt_comm *w = ctx->world;
  dt_comm_mem keep = w->mem, hm = w->mem;
  hm.p2p_via_host = via_host;
  dt_comm_set_mem(w, &hm);
  const int64_t n = 1000;
  const size_t nb = (size_t)n * sizeof(float);
  float *h = malloc(nb);
  void *d = kt_up((&(kt_dev){.ctx = ctx, .dev = ctx->device}), NULL, nb);
  dt_ledger_clear(ctx);
  for (int round = 0; round < 2; round++) {
    if (ctx->rank == 0) {
      for (int64_t i = 0; i < n; i++) h[i] = (float)(i + 1000 * round);
      TU_OK(ctx, dt_device_copy(ctx->device, d, h, nb, DT_COPY_H2D));
      TU_OK(ctx, dt_comm_send(w, d, (size_t)n, DT_F32, 1, 7));
      TU_OK(ctx, dt_device_fill(ctx->device, DT_F32, d, n, -1.0)); /* reused at once */
    } else {
      TU_OK(ctx, dt_comm_recv(w, d, (size_t)n, DT_F32, 0, 7));
      TU_OK(ctx, dt_device_copy(ctx->device, h, d, nb, DT_COPY_D2H));
      int64_t bad = -1;
      for (int64_t i = 0; i < n && bad < 0; i++)
        if (h[i] != (float)(i + 1000 * round)) bad = i;
      TU_CHECK(bad < 0, "device p2p round %d%s: element %lld is %g", round,
               via_host ? " via host" : "", (long long)bad, bad < 0 ? 0.0 : h[bad]);
    }
  }
  uint64_t st = dt_ledger_of(ctx)->staged_bytes;
  TU_CHECK(st == (via_host ? 2 * nb : 0), "device p2p%s: rank %d staged %llu bytes, expected %zu",
           via_host ? " via host" : "", ctx->rank, (unsigned long long)st, via_host ? 2 * nb : 0);
  kt_free((&(kt_dev){.ctx = ctx, .dev = ctx->device}), d, nb);
  free(h);
  dt_comm_set_mem(w, &keep);
}

/* The bf16 tolerance of one element. out (no mag): tol relative with floor 1
 * (sdpa's bf16 out bound: 2u + the f32 sums); lse: the f32 sums alone. A
 * gradient (mag: acase.dqmag, against the oracle whose D reads the stored
 * out, acase.d_out): each product has one operand rounded to bf16 (dS or P;
 * the other is a bf16 input), at most u of its magnitude, the f32 sums at
 * most f of it, and the result is rounded once, u of it: (u + f) mag +
 * u |want| + f (the floor: a zero sum). First-order worst case (errors all of
 * one sign). For a gradient, tol is the number of bf16
 * roundings relative to mag: 1, or 2 under allgather for dk, dv (each rank's
 * Partial is rounded to bf16 before the reduce_scatter sums them). */
static double ring_tol(double want, double mag, bool grad, double tol) {
  if (!grad) return tol * (fabs(want) > 1 ? fabs(want) : 1);
  const double u = kt_unit(DT_BF16), f = 4 * sqrt(128.0 + 64.0) * kt_unit(DT_F32);
  return (tol * u + f) * mag + u * fabs(want) + f;
}

/* The first element of got outside its tolerance, or -1; *worst (when given)
 * raised to the largest error / tolerance. */
static int64_t ring_mismatch(const double *got, const double *want, const double *mag, int64_t n,
                             double tol, double *worst_out) {
  int64_t bad = -1;
  for (int64_t i = 0; i < n; i++) {
    double t = ring_tol(want[i], mag ? mag[i] : 0, mag != NULL, tol), e = fabs(got[i] - want[i]);
    if (worst_out && e / t > *worst_out) *worst_out = e / t;
    if (!(e <= t) && bad < 0) bad = i;
  }
  return bad;
}

/* One ring run (forward and backward) of the case on this rank; the local out,
 * lse, dq, dk, dv compared with the oracle's rows (bf16 tolerances as sdpa's
 * bf16 check above: the scores, statistics, lse and the dQ, dK, dV
 * accumulators, the travelling one included, are f32, so what is left is the
 * bf16 rounding of the inputs of the PV, dS K, dS^T Q and P^T dO GEMMs and
 * of the results, plus the f32 sums, and the error of the stored out that
 * the backward's D reads; lse itself is f32: the f32 sums alone).
 * Returns the rank's staged bytes and fills its cp send bytes. */
typedef struct ring_case {
  acase c;
  int chunks;
  const double *q, *k, *v, *G;          /* storage order, global */
  const double *o, *lse, *dq, *dk, *dv; /* the oracle */
} ring_case;

static uint64_t run_ring(dt_ctx *ctx, dt_mesh *mesh, const ring_case *R, bool ring,
                         const char *what, uint64_t *sent, int *n_f32) {
  const acase *c = &R->c;
  const dt_dtype t = DT_BF16;
  int64_t qs[4] = {c->B, c->S, c->H, c->HD}, ks[4] = {c->B, c->S, c->KVH, c->HD};
  int64_t ls3[3] = {c->B, c->S, c->H};
  dt_placement pl = dt_shard(1);
  dt_tensor tq, tk, tv, to[2], tg, gi[3];
  dev_shard(ctx, mesh, t, pl, 4, qs, R->q, &tq);
  dev_shard(ctx, mesh, t, pl, 4, ks, R->k, &tk);
  dev_shard(ctx, mesh, t, pl, 4, ks, R->v, &tv);
  dev_shard(ctx, mesh, t, pl, 4, qs, R->G, &tg);
  dt_op_attrs a = DT_OP_ATTRS_INIT;
  a.i0 = 1; /* [b, s, h, hd] */
  a.dim = 0;
  a.i1 = R->chunks;
  a.i2 = ring ? DT_CP_RING : DT_CP_ALLGATHER;
  const dt_tensor *in[3] = {&tq, &tk, &tv};
  dt_tensor *out[2] = {&to[0], &to[1]};
  dt_ledger_clear(ctx);
  dt_status s = dt_op_call(ctx, &dt_op_sdpa_cp, &a, in, out, NULL);
  TU_CHECK(s == DT_OK, "%s forward: %s", what, dt_last_error(ctx));
  if (s == DT_OK) {
    const dt_tensor *gout[2] = {&tg, NULL};
    dt_tensor *gin[3] = {&gi[0], &gi[1], &gi[2]};
    const dt_tensor *oc[2] = {&to[0], &to[1]};
    s = dt_op_sdpa_cp.backward(ctx, &a, in, oc, gout, gin);
    TU_CHECK(s == DT_OK, "%s backward: %s", what, dt_last_error(ctx));
  }
  uint64_t staged = dt_ledger_of(ctx)->staged_bytes;
  *sent = sent_bytes(ctx, "cp", DT_F32, n_f32);
  const int64_t nq = c->B * c->H * c->S * c->HD, nk = c->B * c->KVH * c->S * c->HD;
  double *gdq = malloc(nq * sizeof *gdq), *gdk = malloc(nk * sizeof *gdk), *gdv = malloc(nk * sizeof *gdv);
  double *go = malloc(nq * sizeof *go), *tmp = malloc(nq * sizeof *tmp);
  double *mq = malloc(nq * sizeof *mq), *mk = malloc(nk * sizeof *mk), *mv = malloc(nk * sizeof *mv);
  if (s == DT_OK) {
    /* the stored out of every rank (B = 1: rank r's rows are the r-th block
     * of [s, h, hd]), then the oracle's gradients with D from it */
    double *lo = malloc((size_t)to[0].local.numel * sizeof *lo);
    dev_read(ctx, &to[0], lo);
    TU_OK(ctx, dt_comm_all_gather(dt_mesh_comm(mesh, 0), lo, go, (size_t)to[0].local.numel, DT_F64));
    free(lo);
    acase cd = *c; /* with D from the stored out; its own mag arrays */
    cd.d_out = go;
    cd.dqmag = mq, cd.dkmag = mk, cd.dvmag = mv;
    ref_attn(&cd, R->q, R->k, R->v, R->G, tmp, NULL, gdq, gdk, gdv);
  }
  if (s == DT_OK) {
    TU_CHECK(to[1].local.dtype == DT_F32, "%s: lse is %s, not f32", what, dt_dtype_name(to[1].local.dtype));
    const int64_t off = tq.goffset[1], len = tq.local.shape[1];
    const double u = kt_unit(DT_BF16), f = 4 * sqrt((double)(c->S + c->HD)) * kt_unit(DT_F32);
    const dt_tensor *res[5] = {&to[0], &to[1], &gi[0], &gi[1], &gi[2]};
    const double *want[5] = {R->o, R->lse, gdq, gdk, gdv};
    const double *mag[5] = {NULL, NULL, mq, mk, mv};
    const int64_t *shp[5] = {qs, ls3, qs, ks, ks};
    static const char *const NM[5] = {"out", "lse", "dq", "dk", "dv"};
    for (int j = 0; j < 5; j++) {
      int nd = j == 1 ? 3 : 4;
      const int64_t n = res[j]->local.numel;
      double *wl = slice(want[j], shp[j], nd, 1, off, len);
      double *ml = mag[j] ? slice(mag[j], shp[j], nd, 1, off, len) : NULL;
      double *got = malloc((size_t)(n + 1) * sizeof *got);
      dev_read(ctx, res[j], got);
      const double tj = j == 0 ? 2 * u + f : j == 1 ? f : j > 2 && !ring ? 2 : 1;
      int64_t bad = ring_mismatch(got, wl, ml, n, tj, ctx->rank == 0 ? &worst[j < 2 ? 0 : 1] : NULL);
      TU_CHECK(bad < 0, "%s rank %d %s: [%lld] = %.9g, expected %.9g (tol %.3g)", what, ctx->rank,
               NM[j], (long long)bad, bad < 0 ? 0 : got[bad], bad < 0 ? 0 : wl[bad],
               bad < 0 ? 0 : ring_tol(wl[bad], ml ? ml[bad] : 0, ml != NULL, tj));
      free(wl), free(ml), free(got);
    }
    for (int j = 0; j < 3; j++) dt_tensor_free(ctx, &gi[j]);
  }
  if (s == DT_OK) dt_tensor_free(ctx, &to[0]), dt_tensor_free(ctx, &to[1]);
  free(gdq), free(gdk), free(gdv), free(go), free(tmp), free(mq), free(mk), free(mv);
  dt_tensor_free(ctx, &tq), dt_tensor_free(ctx, &tk), dt_tensor_free(ctx, &tv), dt_tensor_free(ctx, &tg);
  return staged;
}

static dt_status body_ring(dt_ctx *ctx, void *arg) {
  (void)arg;
  check_p2p(ctx, false);
  check_p2p(ctx, true); /* planted: the host staging the device path replaced */
  /* B 1, 4 query heads on 2 kv heads (GQA 2:1; the device's GEMMs batch both
   * kv heads), S 128 in 4 chunks (each rank holds two units of L = 32 rows, one
   * early and one late: full, diagonal and skipped pairs and both ring steps
   * run), head dim 64, [b, s, h, hd] */
  ring_case R = {.c = {.B = 1, .H = 4, .KVH = 2, .S = 128, .HD = 64, .lay = 1}, .chunks = 4};
  acase *c = &R.c;
  int64_t pos[128];
  for (int64_t i = 0; i < c->S; i++) pos[i] = dt_seq_position(i, c->S, R.chunks);
  c->pos = pos;
  const int64_t nq = c->B * c->H * c->S * c->HD, nk = c->B * c->KVH * c->S * c->HD;
  double *q = rounded(DT_BF16, nq, 951), *k = rounded(DT_BF16, nk, 952), *v = rounded(DT_BF16, nk, 953);
  double *G = rounded(DT_BF16, nq, 954);
  /* logits of several units (x 8 is exact in bf16), as in sdpa's bf16 check */
  for (int64_t i = 0; i < nq; i++) q[i] *= 8;
  double *o = malloc(nq * sizeof *o), *lse = malloc(c->B * c->H * c->S * sizeof *lse);
  double *dq = malloc(nq * sizeof *dq), *dk = malloc(nk * sizeof *dk), *dv = malloc(nk * sizeof *dv);
  c->dqmag = malloc(nq * sizeof(double));
  c->dkmag = malloc(nk * sizeof(double));
  c->dvmag = malloc(nk * sizeof(double));
  ref_attn(c, q, k, v, G, o, lse, dq, dk, dv);
  R.q = q, R.k = k, R.v = v, R.G = G, R.o = o, R.lse = lse, R.dq = dq, R.dk = dk, R.dv = dv;

  dt_mesh *mesh = NULL;
  const char *nm[1] = {"cp"};
  TU_OK(ctx, dt_mesh_create(ctx, ctx->world, 1, (int[]){2}, nm, &mesh));
  if (!mesh) return DT_ERR_INTERNAL;
  uint64_t sent = 0;
  int n_f32 = 0;
  uint64_t staged = run_ring(ctx, mesh, &R, true, "sdpa_cp bf16 ring", &sent, &n_f32);
  /* The traffic, derived: X = B (S / C) KVH HD elements of K (or V) per rank;
   * forward C - 1 sends of [K | V] in bf16 (2 X elements, 2 bytes), backward
   * C - 1 again plus C of the travelling [dK | dV] in f32 (4 bytes: PyTorch's
   * accum_dtype under convert_to_f32). */
  const int C = 2;
  const uint64_t X = (uint64_t)(c->B * (c->S / C) * c->KVH * c->HD);
  const uint64_t want = 2 * (uint64_t)(C - 1) * 2 * X * 2 + (uint64_t)C * 2 * X * 4;
  TU_CHECK(sent == want, "ring: rank %d sent %llu bytes on cp, derived %llu", ctx->rank,
           (unsigned long long)sent, (unsigned long long)want);
  TU_CHECK(n_f32 == C, "ring: rank %d sent %d f32 messages, expected the %d [dK | dV] ones",
           ctx->rank, n_f32, C);
  TU_CHECK(staged == 0, "ring: rank %d staged %llu bytes through the host", ctx->rank,
           (unsigned long long)staged);
  /* the same ring with the row kernels at CUDA's block sizes (256 / 128
   * threads, dt_kemu_attn_cuda_blocks) in the ops themselves: this rank's
   * device handle on a copy of its slots whose kernel table has that attn */
  {
    dt_device *dev = ctx->device;
    const dt_device_ops *keep = dev->ops;
    dt_device_ops o256 = *keep;
    dt_kernels k256 = *keep->kern;
    k256.attn = &dt_kemu_attn_cuda_blocks;
    o256.kern = &k256;
    dev->ops = &o256;
    uint64_t st256 = run_ring(ctx, mesh, &R, true, "sdpa_cp bf16 ring, 256-thread rows", &sent, &n_f32);
    dev->ops = keep;
    TU_CHECK(st256 == 0 && sent == want, "ring (256): rank %d staged %llu, sent %llu", ctx->rank,
             (unsigned long long)st256, (unsigned long long)sent);
  }
  /* allgather: the same values (dk, dv's bf16 Partials reduce-scattered) */
  staged = run_ring(ctx, mesh, &R, false, "sdpa_cp bf16 allgather", &sent, &n_f32);
  TU_CHECK(staged == 0 && sent == 0, "allgather: rank %d staged %llu bytes, sent %llu", ctx->rank,
           (unsigned long long)staged, (unsigned long long)sent);
  dt_mesh_free(mesh);

  /* planted: the same ring through host memory stages every message twice
   * (each rank receives what it sends: D2H at the send, H2D at the receive) */
  dt_comm_mem keep = ctx->world->mem, hm = ctx->world->mem;
  hm.p2p_via_host = true;
  dt_comm_set_mem(ctx->world, &hm);
  mesh = NULL;
  TU_OK(ctx, dt_mesh_create(ctx, ctx->world, 1, (int[]){2}, nm, &mesh));
  dt_comm_set_mem(ctx->world, &keep);
  if (!mesh) return DT_ERR_INTERNAL;
  staged = run_ring(ctx, mesh, &R, true, "sdpa_cp bf16 ring via host", &sent, &n_f32);
  TU_CHECK(staged == 2 * want, "ring via host: rank %d staged %llu bytes, derived %llu", ctx->rank,
           (unsigned long long)staged, (unsigned long long)(2 * want));
  dt_mesh_free(mesh);

  /* (e) for the bf16 check: what bf16 accumulation would give fails it. The
   * oracle with every scaled score rounded to bf16 (what a bf16 C of the
   * scores GEMM stores, the first thing a bf16-accumulating version rounds):
   * its out and gradients must fall outside the tolerances above. */
  if (ctx->rank == 0) {
    acase pc = *c;
    pc.bf16_scores = true;
    pc.dqmag = pc.dkmag = pc.dvmag = NULL;
    double *po = malloc(nq * sizeof *po), *pdq = malloc(nq * sizeof *pdq);
    double *pdk = malloc(nk * sizeof *pdk), *pdv = malloc(nk * sizeof *pdv);
    ref_attn(&pc, q, k, v, G, po, NULL, pdq, pdk, pdv);
    const double u = kt_unit(DT_BF16), f = 4 * sqrt((double)(c->S + c->HD)) * kt_unit(DT_F32);
    double pw[3] = {0, 0, 0}; /* the planted results' worst error / tolerance */
    TU_CHECK(ring_mismatch(po, o, NULL, nq, 2 * u + f, &pw[0]) >= 0, "bf16 scores pass the bf16 out check");
    TU_CHECK(ring_mismatch(pdk, dk, c->dkmag, nk, 1, &pw[1]) >= 0, "bf16 scores pass the bf16 dk check");
    TU_CHECK(ring_mismatch(pdq, dq, c->dqmag, nq, 1, &pw[2]) >= 0, "bf16 scores pass the bf16 dq check");
    printf("planted bf16 scores and lse: worst error / tolerance out %.3g, dk %.3g, dq %.3g (> 1: "
           "refused)\n", pw[0], pw[1], pw[2]);
    free(po), free(pdq), free(pdk), free(pdv);
    printf("sdpa_cp bf16 over a 2-rank ring on cuda-emu: out, lse, dq, dk, dv; cp traffic %llu "
           "bytes per rank (f32 [dK | dV]); 0 staged through the host (planted: %llu)\n",
           (unsigned long long)want, (unsigned long long)(2 * want));
    printf("ring, rank 0: worst error / tolerance: forward %.3g, gradients %.3g\n", worst[0], worst[1]);
  }
  TU_CHECK(ctx->mem.dev_cur == 0, "ring: device bytes left on rank %d: %zu", ctx->rank, ctx->mem.dev_cur);
  free(q), free(k), free(v), free(G), free(o), free(lse), free(dq), free(dk), free(dv);
  free(c->dqmag), free(c->dkmag), free(c->dvmag);
  return DT_OK;
}

static dt_status body(dt_ctx *ctx, void *arg) {
  (void)arg;
  kt_dev T = {.ctx = ctx, .dev = ctx->device, .K = ctx->device->ops->kern, .name = ON_CUDA ? "cuda" : "cuda-emu"};
  test_rows(&T);
  test_rows_bwd(&T);
  if (!ON_CUDA) { /* (f) */
    dt_kernels k256 = *T.K;
    k256.attn = &dt_kemu_attn_cuda_blocks;
    TU_CHECK(k256.attn != T.K->attn, "the cuda-emu device already uses the CUDA-block table");
    kt_dev T256 = T;
    T256.K = &k256;
    test_rows(&T256);
    test_rows_bwd(&T256);
    printf("row kernels at CUDA's block sizes (256 / 128 threads) on cuda-emu\n");
  }
  dt_mesh *mesh = NULL;
  const char *nm[1] = {"cp"};
  TU_OK(ctx, dt_mesh_create(ctx, ctx->world, 1, (int[]){1}, nm, &mesh));
  if (!mesh) return DT_ERR_INTERNAL;
  int64_t natural[130], perm4[132];
  for (int64_t i = 0; i < 130; i++) natural[i] = i;

  /* (b) sdpa */
  static const int64_t Ss[] = {1, 7, 130};
  static const dt_dtype ts[] = {DT_F64, DT_F32};
  for (int ti = 0; ti < 2; ti++)
    for (int si = 0; si < 3; si++)
      for (int hi = 0; hi < 2; hi++)
        for (int gi = 0; gi < 2; gi++)
          for (int lay = 0; lay < 2; lay++) {
            int64_t HD = hi ? 128 : 64, S = Ss[si];
            /* the big f32/f64 x 130 x 128 cases in one layout each keep the emulator quick */
            if (S == 130 && HD == 128 && lay != ti) continue;
            acase c = {.B = 2, .H = gi ? 4 : 2, .KVH = gi ? 1 : 2, .S = S, .HD = HD, .lay = lay, .pos = natural};
            check_case(ctx, mesh, ts[ti], &c, 0, S == 130 ? 48 : 0);
            if (S == 130 && HD == 64) check_case(ctx, mesh, ts[ti], &c, 0, 0);
            if (S == 7 && HD == 64) check_case(ctx, mesh, ts[ti], &c, 0, 3);
          }
  printf("sdpa on %s: S 1, 7, 130 x head dim 64, 128 x GQA 4:1, 1:1 x both layouts, f32, f64\n",
         ON_CUDA ? "cuda" : "cuda-emu");

  /* (c) sdpa_cp: 2 chunks (natural order) and 4 (positions 0, 3, 1, 2 per chunk) */
  for (int ti = 0; ti < 2; ti++)
    for (int lay = 0; lay < 2; lay++) {
      acase c = {.B = 2, .H = 4, .KVH = 1, .S = 132, .HD = 64, .lay = lay, .pos = perm4};
      for (int64_t i = 0; i < 132; i++) perm4[i] = dt_seq_position(i, 132, 4);
      check_case(ctx, mesh, ts[ti], &c, 4, 0);
      acase c2 = {.B = 1, .H = 2, .KVH = 2, .S = 8, .HD = 128, .lay = lay, .pos = natural};
      check_case(ctx, mesh, ts[ti], &c2, 2, 0);
    }
  printf("sdpa_cp on %s: 4 chunks S 132 GQA 4:1, 2 chunks S 8 head dim 128, both layouts, f32, f64\n",
         ON_CUDA ? "cuda" : "cuda-emu");

  /* bf16 (q, k, v, out, dO and the gradients bf16): scores, softmax, dP and dS
   * in f32, P and dS rounded to bf16 as GEMM operands, dK and dV summed in f32
   * over the 3 query blocks (bq 48 of S 130) and the 4 query heads of the group,
   * then rounded once. Against the double reference on the same bf16 inputs:
   * forward, one rounding of P (relative u = 2^-8 per probability: at most u
   * times the largest |v| over a convex sum) and one of out: 2u, plus the f32
   * sums' 4 sqrt(S + HD) u_f32; gradients, the roundings of P or dS as operands
   * and of the result, and dS = P (dP - D) cancels, so the error is relative
   * to the terms, not the result: 4u on the (floor 1) scale, plus the f32 sums. */
  {
    acase c = {.B = 1, .H = 4, .KVH = 1, .S = 130, .HD = 64, .lay = 1, .pos = natural};
    int64_t nq = c.B * c.H * c.S * c.HD, nk = c.B * c.KVH * c.S * c.HD;
    double *q = rounded(DT_BF16, nq, 901), *k = rounded(DT_BF16, nk, 902), *v = rounded(DT_BF16, nk, 903);
    double *G = rounded(DT_BF16, nq, 904);
    /* Logits of several units, as trained attention has (x 8 is exact in
     * bf16): a score rounded to bf16 would then be off by more than 2u in
     * its probability, which this check must see. */
    for (int64_t i = 0; i < nq; i++) q[i] *= 8;
    double *o = malloc(nq * sizeof *o), *dq = malloc(nq * sizeof *dq), *dk = malloc(nk * sizeof *dk),
           *dv = malloc(nk * sizeof *dv);
    ref_attn(&c, q, k, v, G, o, NULL, dq, dk, dv);
    run_out r;
    dt_status s = run_op(ctx, mesh, DT_BF16, &c, 0, 48, q, k, v, G, &r);
    TU_CHECK(s == DT_OK, "sdpa bf16: %s", dt_last_error(ctx));
    if (s == DT_OK) {
      double u = kt_unit(DT_BF16), f = 4 * sqrt((double)(c.S + c.HD)) * kt_unit(DT_F32);
      close_to(0, "sdpa bf16 out", r.out, o, nq, 2 * u + f);
      close_to(1, "sdpa bf16 dq", r.dq, dq, nq, 4 * u + 2 * f);
      close_to(1, "sdpa bf16 dk", r.dk, dk, nk, 4 * u + 2 * f);
      close_to(1, "sdpa bf16 dv", r.dv, dv, nk, 4 * u + 2 * f);
      printf("sdpa bf16: S 130 in 3 blocks, GQA 4:1: out, dq, dk, dv\n");
    }
    run_free(&r);
    free(q), free(k), free(v), free(G), free(o), free(dq), free(dk), free(dv);
  }

  /* The batched GEMMs above write [b, s, h, hd] heads side by side within a
   * row; outputs that really overlap are still refused. */
  {
    float dummy[1]; /* only checked, never read */
    dt_gemm_desc g = {.dtype = DT_F32, .m = 3, .n = 4, .k = 2, .lda = 2, .ldb = 4, .ldc = 8,
                      .stride_a = 6, .stride_b = 8, .batch = 2, .alpha = 1, .a = dummy,
                      .b = dummy, .c = dummy};
    g.stride_c = 4; /* side by side: columns [0, 4) and [4, 8) */
    TU_CHECK(dt_gemm_check(ctx, &g) == DT_OK, "side-by-side outputs refused: %s", dt_last_error(ctx));
    g.stride_c = 3; /* columns [0, 4) and [3, 7) share column 3 */
    TU_CHECK(dt_gemm_check(ctx, &g) == DT_ERR_INVALID, "overlapping outputs accepted");
    g.stride_c = 5; /* [5, 9) passes the row of 8 into the next row */
    TU_CHECK(dt_gemm_check(ctx, &g) == DT_ERR_INVALID, "outputs past ldc accepted");
    dt_error_clear(ctx);
  }

  /* (d) finite differences */
  for (int lay = 0; lay < 2; lay++) {
    acase c = {.B = 1, .H = 2, .KVH = 1, .S = 5, .HD = 4, .lay = lay, .pos = natural};
    check_fd(ctx, mesh, &c, 0);
    int64_t p4[8];
    for (int64_t i = 0; i < 8; i++) p4[i] = dt_seq_position(i, 8, 4);
    acase c4 = {.B = 1, .H = 2, .KVH = 1, .S = 8, .HD = 4, .lay = lay, .pos = p4};
    check_fd(ctx, mesh, &c4, 4);
  }
  printf("finite differences: sdpa and sdpa_cp gradients, f64, both layouts\n");
  printf("worst error / tolerance: forward %.3g, gradients %.3g\n", worst[0], worst[1]);
  dt_mesh_free(mesh);
  TU_CHECK(ctx->mem.dev_cur == 0, "device bytes left: %zu", ctx->mem.dev_cur);
  return DT_OK;
}

int main(void) {
  if (ON_CUDA && (!dt_device_cuda_built() || dt_device_cuda_count() == 0)) {
    printf("SKIP: no usable GPU (CUDA built: %s)\n", dt_device_cuda_built() ? "yes" : "no");
    return SB_SKIP;
  }
  dt_launch_opts lo = {.backend = DT_BACKEND_THREADS, .world = 1, .timeout_s = 600,
                       .device = DT_DEV_CUDA, .cuda_emu = !ON_CUDA};
  dt_launch_report rep;
  dt_status s = dt_launch(&lo, body, NULL, &rep);
  if (s != DT_OK)
    tu_fail(__FILE__, __LINE__, "launch: rank %d: %s", rep.failed_rank, rep.failed_msg);
  dt_launch_report_free(&rep);
  if (!ON_CUDA) { /* (g): two ranks on one emulated GPU */
    lo.world = 2;
    worst[0] = worst[1] = 0;
    s = dt_launch(&lo, body_ring, NULL, &rep);
    if (s != DT_OK)
      tu_fail(__FILE__, __LINE__, "launch (ring): rank %d: %s", rep.failed_rank, rep.failed_msg);
    dt_launch_report_free(&rep);
  }
#ifdef KERN_ON_CUDA
  return tu_finish("test_kern_attn_cuda");
#else
  return tu_finish("test_kern_attn");
#endif
}
