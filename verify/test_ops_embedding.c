/* verify/test_ops_embedding.c: embedding and cross-entropy of lib/ops on real
 * ranks (threads backend) against naive references computed here on the
 * unsharded globals. The sharding rules are PyTorch's: embedding_strategy
 * (torch/distributed/tensor/_ops/_embedding_ops.py), nll_loss_forward_strategy
 * (_ops/_math_ops.py), and loss_parallel (torch/distributed/tensor/parallel/loss.py).
 *
 * What it checks:
 *  (a) embedding values: on a 1-D mesh of 4 and a 2x2 mesh, every combination
 *      of weight placements {R, S(0), S(1), P(sum)} and ids placements
 *      {R, S(0), S(1)} per mesh dim, with an uneven vocab (V = 10 on 4 ranks)
 *      and uneven ids ([3,5]): dt_tensor_full of the output equals the lookup
 *      exactly;
 *  (b) the embedding oracles of test/distributed/tensor/test_embedding_ops.py on
 *      the mesh of 4: row-wise, column-wise and
 *      batch forwards and the backward with replicated ids cost 0 collectives
 *      and give the expected placements; dt_tensor_full of the row-wise
 *      (P(sum)) output costs exactly 1 all_reduce; out-of-range ids
 *      (>= V and < 0) are DT_ERR_INVALID;
 *  (c) cross-entropy values for logits {R, S(0), S(last)} x targets {R, S(0)}
 *      per mesh dim (uneven positions 7 and vocab 10 on 4 ranks), equal to the
 *      naive reference; the loss-parallel oracle (test_loss_parallel in
 *      test/distributed/tensor/parallel/test_tp_examples.py): logits S(-1), targets R
 *      -> 3 all_reduces of `positions` elements and no all_gather; the second
 *      output (each position's log-sum-exp) against the reference and placed
 *      as the targets; gathered (R)
 *      and unsharded (mesh of 1) give the same value; uneven positions S(0)
 *      give the exact global mean (P(sum) of local sums / N) where PyTorch's
 *      P(avg) of local means would not; an out-of-range target is
 *      DT_ERR_INVALID on every rank (no rank left waiting in a collective);
 *  (d) gradients against central finite differences of the reference: the
 *      embedding weight (loss = sum(out * G)) and the cross-entropy logits
 *      (loss = g * CE), sharded and on a mesh of 1;
 *  (e) every rank frees all it allocated (host_cur at the end == at the start).
 * Values are small multiples of 1/4 ((7 i + 5 seed) mod 13 - 6) / 4.
 *  (f) f32 cross-entropy (loss and dlogits) on wide logits against the closed
 *      forms in double, loss parallel, batch-sharded and replicated.
 * What it is not: a test of the cost model.
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optest.h"
#include "testutil.h"

enum { MAXN = 256 }; /* elements of the largest global tensor used here */

/* Tolerances. EXACT: an embedding is a lookup; a P(sum) split (value / 4 or / 2)
 * of multiples of 1/4 and its all_reduce are exact in f64. CE_TOL: the loss
 * uses exp/log and sums of <= 10 exps per position and <= 8 positions, in a
 * different order than the reference (max taken per shard, sums split over
 * ranks): a few ulps of values O(1), far below 1e-12 relative. FD: central
 * differences with h = 1e-6: truncation ~h^2 |f'''| (< 1e-11 for these smooth
 * losses; 0 for the linear embedding loss), round-off ~eps |L| / h (|L| < 50:
 * ~1e-8), so 1e-6 (relative, floor 1) still separates right from wrong
 * gradients (errors of those are O(0.1)). */
#define EXACT 0.0
static const double CE_TOL = 1e-12, FD_H = 1e-6, FD_TOL = 1e-6;

typedef struct garr {
  int ndim;
  int64_t sh[DT_MAX_DIMS];
  double v[MAXN];
} garr;

typedef struct iarr {
  int ndim;
  int64_t sh[DT_MAX_DIMS];
  int64_t v[MAXN];
} iarr;

static int64_t numel_sh(int ndim, const int64_t *sh) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= sh[d];
  return n;
}

static void gfill(garr *g, int ndim, const int64_t *sh, int seed) {
  memset(g, 0, sizeof *g);
  g->ndim = ndim;
  for (int d = 0; d < ndim; d++) g->sh[d] = sh[d];
  for (int64_t i = 0; i < numel_sh(ndim, sh); i++)
    g->v[i] = (double)((7 * i + 5 * seed) % 13 - 6) / 4.0;
}

/* ids in [0, V): a spread that hits the first, the last and repeated rows */
static void ifill(iarr *g, int ndim, const int64_t *sh, int64_t V, int seed) {
  memset(g, 0, sizeof *g);
  g->ndim = ndim;
  for (int d = 0; d < ndim; d++) g->sh[d] = sh[d];
  for (int64_t i = 0; i < numel_sh(ndim, sh); i++) g->v[i] = (3 * i + seed) % V;
}

/* ---- references ------------------------------------------------------------------- */

static void emb_ref(const garr *w, const iarr *ids, garr *out) {
  memset(out, 0, sizeof *out);
  out->ndim = ids->ndim + 1;
  for (int d = 0; d < ids->ndim; d++) out->sh[d] = ids->sh[d];
  int64_t D = w->sh[1];
  out->sh[ids->ndim] = D;
  for (int64_t i = 0; i < numel_sh(ids->ndim, ids->sh); i++)
    for (int64_t c = 0; c < D; c++) out->v[i * D + c] = w->v[ids->v[i] * D + c];
}

static double ce_ref(const garr *x, const iarr *t) {
  int64_t V = x->sh[x->ndim - 1], N = numel_sh(t->ndim, t->sh);
  double L = 0;
  for (int64_t p = 0; p < N; p++) {
    double mx = -INFINITY, z = 0;
    for (int64_t v = 0; v < V; v++) mx = fmax(mx, x->v[p * V + v]);
    for (int64_t v = 0; v < V; v++) z += exp(x->v[p * V + v] - mx);
    L += log(z) + mx - x->v[p * V + t->v[p]];
  }
  return L / (double)N;
}

/* each position's log-sum-exp (cross_entropy's second output) */
static void lse_ref(const garr *x, const iarr *t, double *out) {
  int64_t V = x->sh[x->ndim - 1], N = numel_sh(t->ndim, t->sh);
  for (int64_t p = 0; p < N; p++) {
    double mx = -INFINITY, z = 0;
    for (int64_t v = 0; v < V; v++) mx = fmax(mx, x->v[p * V + v]);
    for (int64_t v = 0; v < V; v++) z += exp(x->v[p * V + v] - mx);
    out[p] = log(z) + mx;
  }
}

/* ---- per-rank helpers -------------------------------------------------------------- */

typedef ot_rank rk;

static dt_status make(rk *R, const garr *g, const dt_placement *pl, dt_tensor *t) {
  return ot_make(R, DT_F64, g->ndim, g->sh, g->v, pl, t);
}

static dt_status make_i(rk *R, const iarr *g, const dt_placement *pl, dt_tensor *t) {
  return ot_make(R, DT_I64, g->ndim, g->sh, g->v, pl, t);
}

static void desc(rk *R, char *buf, size_t n, const char *op, const dt_placement *p0,
                 const dt_placement *p1) {
  char a[64], b[64];
  dt_placements_str(R->m, p0, a, sizeof a);
  dt_placements_str(R->m, p1, b, sizeof b);
  snprintf(buf, n, "%s on mesh %s, (%s), (%s)", op, R->mlabel, a, b);
}

/* dt_tensor_full(t) == want (ndim, shape, values within tol relative, floor 1) */
static bool check_full(rk *R, const char *what, const dt_tensor *t, int ndim, const int64_t *sh,
                       const double *want, double tol) {
  return ot_check_vals(R, what, t, ndim, sh, want, tol);
}

/* placement lists over the mesh from a per-mesh-dim set: returns the count */
static int pl_lists(const rk *R, const dt_placement *one, int k, dt_placement lists[][DT_MAX_MESH_DIMS]) {
  int total = 1;
  for (int i = 0; i < R->m; i++) total *= k;
  for (int c = 0; c < total; c++)
    for (int i = R->m - 1, e = c; i >= 0; i--) {
      lists[c][i] = one[e % k];
      e /= k;
    }
  return total;
}

typedef struct res {
  size_t comms;
  int coll[8];
  int reduce[8];
  uint64_t elems[8];
  dt_placement out_pl[DT_MAX_MESH_DIMS];
} res;

static void ledger_since(rk *R, size_t before, res *r) {
  r->comms = dt_ledger_of(R->ctx)->n - before;
  for (size_t k = 0; k < r->comms && k < 8; k++) {
    r->coll[k] = dt_ledger_of(R->ctx)->rows[before + k].op;
    r->elems[k] = dt_ledger_of(R->ctx)->rows[before + k].elems;
    r->reduce[k] = dt_ledger_of(R->ctx)->rows[before + k].reduce;
  }
}

/* Runs embedding on (w, ids) at the given placements; checks values; out kept
 * in *o when o is given (caller frees), else freed. */
static bool emb_case(rk *R, const garr *w, const iarr *ids, const dt_placement *pw,
                     const dt_placement *pi, res *r, dt_tensor *o) {
  dt_ctx *ctx = R->ctx;
  char what[200];
  desc(R, what, sizeof what, "embedding", pw, pi);
  memset(r, 0, sizeof *r);
  dt_tensor tw, ti, out;
  bool ok = false;
  dt_status s;
  if ((s = make(R, w, pw, &tw)) != DT_OK) goto fail0;
  if ((s = make_i(R, ids, pi, &ti)) != DT_OK) goto fail1;
  const dt_tensor *in[2] = {&tw, &ti};
  dt_tensor *op[1] = {&out};
  size_t before = dt_ledger_of(ctx)->n;
  s = dt_op_call(ctx, &dt_op_embedding, NULL, in, op, NULL);
  ledger_since(R, before, r);
  if (s != DT_OK) goto fail2;
  for (int i = 0; i < R->m; i++) r->out_pl[i] = out.pl[i];
  garr want;
  emb_ref(w, ids, &want);
  ok = check_full(R, what, &out, want.ndim, want.sh, want.v, EXACT);
  if (o)
    *o = out;
  else
    dt_tensor_free(ctx, &out);
  R->cases++;
fail2:
  dt_tensor_free(ctx, &ti);
fail1:
  dt_tensor_free(ctx, &tw);
fail0:
  if (s != DT_OK)
    tu_fail(__FILE__, __LINE__, "%s, rank %d: %s: %s", what, ctx->rank, dt_status_str(s),
            dt_last_error(ctx));
  return ok;
}

/* ---- (a) embedding sweep ------------------------------------------------------------- */

static void emb_sweep(rk *R) {
  static const int64_t wsh[2] = {10, 6}, ish[2] = {3, 5};
  garr w;
  iarr ids;
  gfill(&w, 2, wsh, 1);
  ifill(&ids, 2, ish, wsh[0], 2);
  const dt_placement wset[4] = {dt_replicate(), dt_shard(0), dt_shard(1), dt_partial(DT_RED_SUM)};
  const dt_placement iset[3] = {dt_replicate(), dt_shard(0), dt_shard(1)};
  dt_placement lw[16][DT_MAX_MESH_DIMS], li[16][DT_MAX_MESH_DIMS];
  int nw = pl_lists(R, wset, 4, lw), ni = pl_lists(R, iset, 3, li);
  res r;
  for (int x = 0; x < nw; x++)
    for (int y = 0; y < ni; y++) emb_case(R, &w, &ids, lw[x], li[y], &r, NULL);
  /* 1-d ids too */
  static const int64_t ish1[1] = {7};
  iarr ids1;
  ifill(&ids1, 1, ish1, wsh[0], 5);
  for (int x = 0; x < nw; x++) emb_case(R, &w, &ids1, lw[x], li[x % 2], &r, NULL);
}

/* ---- (b) embedding oracles (1-D mesh) --------------------------------------------------- */

static void expect(rk *R, const char *name, const res *r, size_t comms, dt_placement want) {
  char got[32], ex[32];
  dt_placement_str(r->out_pl[0], got, sizeof got);
  dt_placement_str(want, ex, sizeof ex);
  TU_CHECK(r->comms == comms, "oracle %s, rank %d: %zu collectives, expected %zu", name,
           R->ctx->rank, r->comms, comms);
  TU_CHECK(dt_placement_eq(r->out_pl[0], want), "oracle %s, rank %d: output %s, expected %s", name,
           R->ctx->rank, got, ex);
}

/* backward of embedding with weight at pw, ids at pi: grad_w vs the scatter-add
 * reference (exact: sums of <= 3 multiples of 1/4 per element) and its ledger */
static void emb_bwd_oracle(rk *R, const char *name, const garr *w, const iarr *ids,
                           dt_placement pw, dt_placement pi, dt_placement want_pl) {
  dt_ctx *ctx = R->ctx;
  res r;
  dt_tensor out, tw, ti, g, gw;
  dt_placement PW[1] = {pw}, PI[1] = {pi};
  if (!emb_case(R, w, ids, PW, PI, &r, &out)) return;
  garr G;
  gfill(&G, out.ndim, out.gshape, 9);
  dt_placement gpl[1] = {out.pl[0].kind == DT_PL_PARTIAL ? dt_replicate() : out.pl[0]};
  TU_OK(ctx, make(R, w, PW, &tw));
  TU_OK(ctx, make_i(R, ids, PI, &ti));
  TU_OK(ctx, make(R, &G, gpl, &g));
  const dt_tensor *in[2] = {&tw, &ti}, *ov[1] = {&out}, *go[1] = {&g};
  dt_tensor *gin[2] = {&gw, NULL};
  size_t before = dt_ledger_of(ctx)->n;
  dt_status s = dt_op_embedding.backward(ctx, NULL, in, ov, go, gin);
  ledger_since(R, before, &r);
  if (s != DT_OK) {
    tu_fail(__FILE__, __LINE__, "oracle %s, rank %d: backward -> %s: %s", name, ctx->rank,
            dt_status_str(s), dt_last_error(ctx));
  } else {
    r.out_pl[0] = gw.pl[0];
    expect(R, name, &r, 0, want_pl);
    garr want;
    memset(&want, 0, sizeof want);
    int64_t D = w->sh[1];
    for (int64_t i = 0; i < numel_sh(ids->ndim, ids->sh); i++)
      for (int64_t c = 0; c < D; c++) want.v[ids->v[i] * D + c] += G.v[i * D + c];
    check_full(R, name, &gw, 2, w->sh, want.v, EXACT);
    dt_tensor_free(ctx, &gw);
  }
  dt_tensor_free(ctx, &g);
  dt_tensor_free(ctx, &ti);
  dt_tensor_free(ctx, &tw);
  dt_tensor_free(ctx, &out);
}

static void emb_oracles(rk *R) {
  dt_ctx *ctx = R->ctx;
  static const int64_t wsh[2] = {10, 8}, ish[2] = {4, 5};
  garr w;
  iarr ids;
  gfill(&w, 2, wsh, 3);
  ifill(&ids, 2, ish, wsh[0], 1);
  const dt_placement Rp = dt_replicate(), S0 = dt_shard(0), S1 = dt_shard(1), S2 = dt_shard(2),
                     Ps = dt_partial(DT_RED_SUM);
  res r;
  dt_tensor out;
  /* row-wise: 0 comms, P(sum); full_tensor: exactly one all_reduce */
  if (emb_case(R, &w, &ids, &S0, &Rp, &r, &out)) {
    expect(R, "row-wise embedding", &r, 0, Ps);
    dt_array full;
    size_t before = dt_ledger_of(ctx)->n;
    TU_OK(ctx, dt_tensor_full(ctx, &out, &full));
    ledger_since(R, before, &r);
    TU_CHECK(r.comms == 1 && r.coll[0] == DT_COLL_ALL_REDUCE,
             "oracle row-wise full_tensor, rank %d: %zu collectives (first %s), expected 1 all_reduce",
             ctx->rank, r.comms, r.comms ? dt_coll_name((dt_coll)r.coll[0]) : "-");
    dt_array_free(ctx, &full);
    dt_tensor_free(ctx, &out);
  }
  emb_case(R, &w, &ids, &S1, &Rp, &r, NULL);
  expect(R, "column-wise embedding", &r, 0, S2);
  emb_case(R, &w, &ids, &Rp, &S0, &r, NULL);
  expect(R, "batch embedding", &r, 0, S0);
  /* backward with replicated ids: 0 comms, grad_w keeps the weight's sharding */
  emb_bwd_oracle(R, "row-wise embedding backward", &w, &ids, S0, Rp, S0);
  emb_bwd_oracle(R, "column-wise embedding backward", &w, &ids, S1, Rp, S1);
  emb_bwd_oracle(R, "replicated embedding backward", &w, &ids, Rp, Rp, Rp);
  /* out-of-range ids: DT_ERR_INVALID with a message, on every rank */
  for (int bad = 0; bad < 2; bad++) {
    iarr b = ids;
    b.v[3] = bad ? -1 : wsh[0];
    dt_tensor tw, ti, o;
    TU_OK(ctx, make(R, &w, &S0, &tw));
    TU_OK(ctx, make_i(R, &b, &Rp, &ti));
    const dt_tensor *in[2] = {&tw, &ti};
    dt_tensor *op[1] = {&o};
    dt_status s = dt_op_call(ctx, &dt_op_embedding, NULL, in, op, NULL);
    TU_CHECK(s == DT_ERR_INVALID && strstr(dt_last_error(ctx), "out of range"),
             "rank %d: embedding with id %lld -> %s (%s), expected invalid argument", ctx->rank,
             (long long)b.v[3], dt_status_str(s), dt_last_error(ctx));
    if (s == DT_OK) dt_tensor_free(ctx, &o);
    dt_tensor_free(ctx, &ti);
    dt_tensor_free(ctx, &tw);
  }
}

/* ---- (c) cross-entropy ------------------------------------------------------------------ */

/* Runs CE on logits x at px, targets t at pt; checks the loss; ledger in r */
static bool ce_case(rk *R, const garr *x, const iarr *t, const dt_placement *px,
                    const dt_placement *pt, res *r) {
  dt_ctx *ctx = R->ctx;
  char what[200];
  desc(R, what, sizeof what, "cross_entropy", px, pt);
  memset(r, 0, sizeof *r);
  dt_tensor tx, tt, out, lse;
  bool ok = false;
  dt_status s;
  if ((s = make(R, x, px, &tx)) != DT_OK) goto fail0;
  if ((s = make_i(R, t, pt, &tt)) != DT_OK) goto fail1;
  const dt_tensor *in[2] = {&tx, &tt};
  dt_tensor *op[2] = {&out, &lse};
  size_t before = dt_ledger_of(ctx)->n;
  s = dt_op_call(ctx, &dt_op_cross_entropy, NULL, in, op, NULL);
  ledger_since(R, before, r);
  if (s != DT_OK) goto fail2;
  for (int i = 0; i < R->m; i++) r->out_pl[i] = out.pl[i];
  double want = ce_ref(x, t), wl[MAXN];
  ok = check_full(R, what, &out, 0, NULL, &want, CE_TOL);
  /* the saved log-sum-exp, placed as the targets (the backward's input) */
  lse_ref(x, t, wl);
  char lw[240];
  snprintf(lw, sizeof lw, "%s: lse", what);
  ok = check_full(R, lw, &lse, t->ndim, t->sh, wl, CE_TOL) && ok;
  for (int i = 0; i < R->m; i++)
    if (lse.pl[i].kind == DT_PL_PARTIAL || (lse.pl[i].kind == DT_PL_SHARD && lse.pl[i].dim >= t->ndim)) {
      tu_fail(__FILE__, __LINE__, "%s, rank %d: lse placement on mesh dim %d is not one of the targets'",
              what, ctx->rank, i);
      ok = false;
    }
  dt_tensor_free(ctx, &out);
  dt_tensor_free(ctx, &lse);
  R->cases++;
fail2:
  dt_tensor_free(ctx, &tt);
fail1:
  dt_tensor_free(ctx, &tx);
fail0:
  if (s != DT_OK)
    tu_fail(__FILE__, __LINE__, "%s, rank %d: %s: %s", what, ctx->rank, dt_status_str(s),
            dt_last_error(ctx));
  return ok;
}

static void ce_sweep(rk *R) {
  static const struct { int n; int64_t s[3]; } SH[] = {{2, {7, 10}}, {3, {2, 3, 10}}, {1, {10, 0, 0}}};
  for (size_t k = 0; k < sizeof SH / sizeof SH[0]; k++) {
    garr x;
    iarr t;
    gfill(&x, SH[k].n, SH[k].s, (int)k + 1);
    ifill(&t, SH[k].n - 1, SH[k].s, SH[k].s[SH[k].n - 1], (int)k);
    int last = SH[k].n - 1;
    dt_placement xset[4], tset[3];
    int nx = 0, nt = 0;
    xset[nx++] = dt_replicate();
    tset[nt++] = dt_replicate();
    for (int d = 0; d < last && d < 2; d++) {
      xset[nx++] = dt_shard(d);
      tset[nt++] = dt_shard(d);
    }
    xset[nx++] = dt_shard(last);
    dt_placement lx[64][DT_MAX_MESH_DIMS], lt[16][DT_MAX_MESH_DIMS];
    int nlx = pl_lists(R, xset, nx, lx), nlt = pl_lists(R, tset, nt, lt);
    res r;
    for (int a = 0; a < nlx; a++)
      for (int b = 0; b < nlt; b++) ce_case(R, &x, &t, lx[a], lt[b], &r);
  }
}

static void ce_oracles(rk *R) {
  dt_ctx *ctx = R->ctx;
  static const int64_t sh[2] = {8, 16}, ush[2] = {7, 10};
  garr x;
  iarr t;
  gfill(&x, 2, sh, 4);
  ifill(&t, 1, sh, sh[1], 3);
  const dt_placement Rp = dt_replicate(), S0 = dt_shard(0), S1 = dt_shard(1),
                     Ps = dt_partial(DT_RED_SUM);
  res r;
  /* loss parallel: 3 all_reduces of 8 (positions) elements, no all_gather, output R */
  ce_case(R, &x, &t, &S1, &Rp, &r);
  expect(R, "loss-parallel cross_entropy", &r, 3, Rp);
  for (size_t k = 0; k < r.comms && k < 8; k++)
    TU_CHECK(r.coll[k] == DT_COLL_ALL_REDUCE && r.elems[k] == (uint64_t)sh[0],
             "oracle loss parallel, rank %d: collective %zu is %s of %llu elements, expected "
             "all_reduce of %lld", ctx->rank, k, dt_coll_name((dt_coll)r.coll[k]),
             (unsigned long long)r.elems[k], (long long)sh[0]);
  /* loss_parallel's three reductions, in order: MAX of the local max, SUM of
   * the local sum-exp, SUM of the masked target logit (_MaskPartial) */
  static const int WANT_RED[3] = {DT_RED_MAX, DT_RED_SUM, DT_RED_SUM};
  for (size_t k = 0; k < r.comms && k < 3; k++)
    TU_CHECK(r.reduce[k] == WANT_RED[k], "oracle loss parallel, rank %d: all_reduce %zu reduces "
             "with op %d, expected %d", ctx->rank, k, r.reduce[k], WANT_RED[k]);
  /* gathered: logits already R, no comm, same value (checked inside ce_case) */
  ce_case(R, &x, &t, &Rp, &Rp, &r);
  expect(R, "replicated cross_entropy", &r, 0, Rp);
  /* S(1) logits with S(0) targets: targets go to R (dispatch picks loss parallel) */
  ce_case(R, &x, &t, &S1, &S0, &r);
  /* an out-of-range target under loss parallel: every rank of the vocab group
   * refuses it before any collective (none hangs) */
  {
    iarr b = t;
    b.v[5] = sh[1];
    dt_tensor tx, tt, o, ol;
    TU_OK(ctx, make(R, &x, &S1, &tx));
    TU_OK(ctx, make_i(R, &b, &Rp, &tt));
    const dt_tensor *in[2] = {&tx, &tt};
    dt_tensor *op[2] = {&o, &ol};
    dt_status s = dt_op_call(ctx, &dt_op_cross_entropy, NULL, in, op, NULL);
    TU_CHECK(s == DT_ERR_INVALID && strstr(dt_last_error(ctx), "out of range"),
             "rank %d: cross_entropy with target %lld -> %s (%s), expected invalid argument",
             ctx->rank, (long long)b.v[5], dt_status_str(s), dt_last_error(ctx));
    if (s == DT_OK) {
      dt_tensor_free(ctx, &o);
      dt_tensor_free(ctx, &ol);
    }
    dt_tensor_free(ctx, &tt);
    dt_tensor_free(ctx, &tx);
  }
  /* uneven positions: 7 on 4 ranks, S(0) on both -> P(sum), exact global mean */
  garr u;
  iarr ut;
  gfill(&u, 2, ush, 5);
  ifill(&ut, 1, ush, ush[1], 4);
  ce_case(R, &u, &ut, &S0, &S0, &r);
  expect(R, "cross_entropy uneven positions S(0)", &r, 0, Ps);
  /* ... where the average of the shard means (PyTorch's P(avg)) is wrong */
  double naive = 0, per[7];
  for (int64_t p = 0; p < ush[0]; p++) {
    garr one;
    iarr onet;
    gfill(&one, 2, ush, 0);
    one.sh[0] = 1;
    memcpy(one.v, &u.v[p * ush[1]], (size_t)ush[1] * sizeof(double));
    onet.ndim = 1;
    onet.sh[0] = 1;
    onet.v[0] = ut.v[p];
    per[p] = ce_ref(&one, &onet);
  }
  for (int k = 0; k < 4; k++) {
    int64_t sz, off;
    dt_chunk(ush[0], 4, k, &sz, &off);
    double sm = 0;
    for (int64_t p = off; p < off + sz; p++) sm += per[p];
    naive += sz ? sm / (double)sz / 4.0 : 0;
  }
  /* 1e-3: a real difference of uneven means is O(0.01) or more here; round-off is ~1e-16 */
  TU_CHECK(fabs(naive - ce_ref(&u, &ut)) > 1e-3,
           "rank %d: the naive P(avg) of uneven shard means should differ from the global mean "
           "(%.17g vs %.17g)", ctx->rank, naive, ce_ref(&u, &ut));
}

static void ce_oracles_2d(rk *R) {
  static const int64_t sh[3] = {4, 3, 10};
  garr x;
  iarr t;
  gfill(&x, 3, sh, 6);
  ifill(&t, 2, sh, sh[2], 2);
  dt_placement px[2] = {dt_shard(0), dt_shard(2)}, pt[2] = {dt_shard(0), dt_replicate()};
  res r;
  ce_case(R, &x, &t, px, pt, &r);
  TU_CHECK(r.comms == 3, "2x2 loss parallel, rank %d: %zu collectives, expected 3", R->ctx->rank,
           r.comms);
  TU_CHECK(r.out_pl[0].kind == DT_PL_PARTIAL && r.out_pl[1].kind == DT_PL_REPLICATE,
           "2x2 loss parallel, rank %d: output not (P(sum), R)", R->ctx->rank);
  for (size_t k = 0; k < r.comms && k < 8; k++)
    TU_CHECK(r.coll[k] == DT_COLL_ALL_REDUCE && r.elems[k] == 6,
             "2x2 loss parallel, rank %d: collective %zu is %s of %llu elements, expected "
             "all_reduce of 6 (local positions)", R->ctx->rank, k, dt_coll_name((dt_coll)r.coll[k]),
             (unsigned long long)r.elems[k]);
}

/* ---- (d) gradients ---------------------------------------------------------------------- */

static double emb_loss(const garr *w, const iarr *ids, const garr *G) {
  garr o;
  emb_ref(w, ids, &o);
  double L = 0;
  for (int64_t i = 0; i < numel_sh(o.ndim, o.sh); i++) L += o.v[i] * G->v[i];
  return L;
}

typedef struct emb_loss_arg {
  const garr *w;
  const iarr *ids;
  const garr *G;
} emb_loss_arg;
static double emb_loss_cb(void *p) {
  const emb_loss_arg *L = p;
  return emb_loss(L->w, L->ids, L->G);
}

static void emb_grad(rk *R, garr *w, const iarr *ids, const dt_placement *pw, const dt_placement *pi) {
  dt_ctx *ctx = R->ctx;
  char what[200];
  desc(R, what, sizeof what, "embedding backward", pw, pi);
  res r;
  dt_tensor out, tw, ti, g, gw;
  if (!emb_case(R, w, ids, pw, pi, &r, &out)) return;
  garr G;
  gfill(&G, out.ndim, out.gshape, 9);
  for (int64_t i = 0; i < numel_sh(G.ndim, G.sh); i++) G.v[i] += 0.1 * (double)(i % 3);
  dt_placement gpl[DT_MAX_MESH_DIMS];
  for (int i = 0; i < R->m; i++) gpl[i] = out.pl[i].kind == DT_PL_PARTIAL ? dt_replicate() : out.pl[i];
  TU_OK(ctx, make(R, w, pw, &tw));
  TU_OK(ctx, make_i(R, ids, pi, &ti));
  TU_OK(ctx, make(R, &G, gpl, &g));
  const dt_tensor *in[2] = {&tw, &ti}, *ov[1] = {&out}, *go[1] = {&g};
  dt_tensor *gin[2] = {&gw, NULL};
  dt_status s = dt_op_embedding.backward(ctx, NULL, in, ov, go, gin);
  if (s != DT_OK) {
    tu_fail(__FILE__, __LINE__, "%s, rank %d: %s: %s", what, ctx->rank, dt_status_str(s),
            dt_last_error(ctx));
  } else {
    garr want = *w;
    emb_loss_arg la = {w, ids, &G};
    ot_fd_grad(w->v, numel_sh(w->ndim, w->sh), FD_H, emb_loss_cb, &la, want.v);
    check_full(R, what, &gw, 2, w->sh, want.v, FD_TOL);
    dt_tensor_free(ctx, &gw);
  }
  dt_tensor_free(ctx, &g);
  dt_tensor_free(ctx, &ti);
  dt_tensor_free(ctx, &tw);
  dt_tensor_free(ctx, &out);
}

typedef struct ce_loss_arg {
  const garr *x;
  const iarr *t;
  double gval;
} ce_loss_arg;
static double ce_loss_cb(void *p) {
  const ce_loss_arg *L = p;
  return L->gval * ce_ref(L->x, L->t);
}

/* loss = gval * CE(x, t); backward from a 0-d R gradient gval. Returns the
 * number of collectives the backward recorded (or (size_t)-1 on error). */
static size_t ce_grad(rk *R, garr *x, const iarr *t, const dt_placement *px, const dt_placement *pt,
                      dt_placement *gx_pl) {
  dt_ctx *ctx = R->ctx;
  char what[200];
  desc(R, what, sizeof what, "cross_entropy backward", px, pt);
  const double gval = 1.25; /* not 1: the gradient must scale with it */
  dt_tensor tx, tt, out, lse, g, gx;
  size_t comms = (size_t)-1;
  TU_OK(ctx, make(R, x, px, &tx));
  TU_OK(ctx, make_i(R, t, pt, &tt));
  const dt_tensor *in[2] = {&tx, &tt};
  dt_tensor *op[2] = {&out, &lse};
  dt_status s = dt_op_call(ctx, &dt_op_cross_entropy, NULL, in, op, NULL);
  if (s != DT_OK) {
    tu_fail(__FILE__, __LINE__, "%s, rank %d: forward: %s: %s", what, ctx->rank, dt_status_str(s),
            dt_last_error(ctx));
    goto done0;
  }
  garr G;
  memset(&G, 0, sizeof G);
  G.v[0] = gval;
  dt_placement gpl[DT_MAX_MESH_DIMS];
  for (int i = 0; i < R->m; i++) gpl[i] = dt_replicate();
  TU_OK(ctx, make(R, &G, gpl, &g));
  const dt_tensor *ov[2] = {&out, &lse}, *go[1] = {&g};
  dt_tensor *gin[2] = {&gx, NULL};
  size_t before = dt_ledger_of(ctx)->n;
  s = dt_op_cross_entropy.backward(ctx, NULL, in, ov, go, gin);
  if (s != DT_OK) {
    tu_fail(__FILE__, __LINE__, "%s, rank %d: %s: %s", what, ctx->rank, dt_status_str(s),
            dt_last_error(ctx));
  } else {
    comms = dt_ledger_of(ctx)->n - before;
    for (int i = 0; i < R->m; i++) gx_pl[i] = gx.pl[i];
    garr want = *x;
    ce_loss_arg la = {x, t, gval};
    ot_fd_grad(x->v, numel_sh(x->ndim, x->sh), FD_H, ce_loss_cb, &la, want.v);
    check_full(R, what, &gx, x->ndim, x->sh, want.v, FD_TOL);
    dt_tensor_free(ctx, &gx);
  }
  dt_tensor_free(ctx, &g);
  dt_tensor_free(ctx, &out);
  dt_tensor_free(ctx, &lse);
  R->cases++;
done0:
  dt_tensor_free(ctx, &tt);
  dt_tensor_free(ctx, &tx);
  return comms;
}

/* f32 cross-entropy, forward and backward, on logits spread over [-40, 40]
 * (exp(x - lse) spans f32's whole range) at placements px / pt, against the
 * closed forms in double: loss = mean(lse - x_t), dlogits = (softmax - onehot)
 * g / N. Tolerance 1e-5 (relative, floor 1): the f32 kernels round each value
 * a handful of times (eps 6e-8) and use vmath.h's exp (2 ulps); an indexing,
 * shift or scaling error is O(0.01) or more. */
static void ce_f32(rk *R, const dt_placement *px, const dt_placement *pt) {
  dt_ctx *ctx = R->ctx;
  enum { P = 6, V = 12 };
  const int64_t xs[2] = {P, V}, ts[1] = {P};
  float xf[P * V];
  int64_t tv[P];
  double lse[P], want_loss = 0, want_g[P * V];
  const double gval = 0.75;
  for (int p = 0; p < P; p++) {
    double mx = -INFINITY, z = 0;
    for (int v = 0; v < V; v++) {
      xf[p * V + v] = (float)(40.0 * sin(1.3 * (p * V + v) + 0.4));
      mx = fmax(mx, xf[p * V + v]);
    }
    tv[p] = (p * 5 + 3) % V;
    for (int v = 0; v < V; v++) z += exp(xf[p * V + v] - mx);
    lse[p] = log(z) + mx;
    want_loss += (lse[p] - xf[p * V + tv[p]]) / P;
    for (int v = 0; v < V; v++)
      want_g[p * V + v] = (exp(xf[p * V + v] - lse[p]) - (v == tv[p])) * gval / P;
  }
  char what[200];
  desc(R, what, sizeof what, "f32 cross_entropy", px, pt);
  dt_tensor tx, tt, out, ls, g, gx;
  TU_OK(ctx, ot_make(R, DT_F32, 2, xs, xf, px, &tx));
  TU_OK(ctx, ot_make(R, DT_I64, 1, ts, tv, pt, &tt));
  float gv = (float)gval;
  dt_placement rp[DT_MAX_MESH_DIMS];
  for (int i = 0; i < R->m; i++) rp[i] = dt_replicate();
  TU_OK(ctx, ot_make(R, DT_F32, 0, NULL, &gv, rp, &g));
  const dt_tensor *in[2] = {&tx, &tt}, *go[1] = {&g};
  dt_tensor *op[2] = {&out, &ls}, *gin[2] = {&gx, NULL};
  dt_status s = dt_op_call(ctx, &dt_op_cross_entropy, NULL, in, op, NULL);
  if (s == DT_OK) {
    const dt_tensor *ov[2] = {&out, &ls};
    s = dt_op_cross_entropy.backward(ctx, NULL, in, ov, go, gin);
    if (s == DT_OK) {
      char w2[240];
      snprintf(w2, sizeof w2, "%s: loss", what);
      ot_check_vals_dt(R, w2, &out, DT_F32, 0, NULL, &want_loss, 1e-5);
      snprintf(w2, sizeof w2, "%s: dlogits", what);
      ot_check_vals_dt(R, w2, &gx, DT_F32, 2, xs, want_g, 1e-5);
      dt_tensor_free(ctx, &gx);
    }
    dt_tensor_free(ctx, &out);
    dt_tensor_free(ctx, &ls);
  }
  if (s != DT_OK)
    tu_fail(__FILE__, __LINE__, "%s, rank %d: %s: %s", what, ctx->rank, dt_status_str(s), dt_last_error(ctx));
  dt_tensor_free(ctx, &g);
  dt_tensor_free(ctx, &tt);
  dt_tensor_free(ctx, &tx);
  R->cases++;
}

static void grads(rk *R) {
  static const int64_t wsh[2] = {10, 6}, ish[2] = {3, 5}, xsh[2] = {7, 10};
  garr w, x;
  iarr ids, t;
  gfill(&w, 2, wsh, 1);
  ifill(&ids, 2, ish, wsh[0], 2);
  gfill(&x, 2, xsh, 2);
  ifill(&t, 1, xsh, xsh[1], 1);
  const dt_placement wset[3] = {dt_replicate(), dt_shard(0), dt_shard(1)};
  const dt_placement iset[2] = {dt_replicate(), dt_shard(0)};
  const dt_placement xset[3] = {dt_replicate(), dt_shard(0), dt_shard(1)};
  dt_placement lw[16][DT_MAX_MESH_DIMS], li[16][DT_MAX_MESH_DIMS], lx[16][DT_MAX_MESH_DIMS];
  int nw = pl_lists(R, wset, 3, lw), ni = pl_lists(R, iset, 2, li), nx = pl_lists(R, xset, 3, lx);
  for (int a = 0; a < nw; a++)
    for (int b = 0; b < ni; b++) emb_grad(R, &w, &ids, lw[a], li[b]);
  dt_placement gx_pl[DT_MAX_MESH_DIMS];
  for (int a = 0; a < nx; a++)
    for (int b = 0; b < ni; b++) ce_grad(R, &x, &t, lx[a], li[b], gx_pl);
  {
    /* f32: loss parallel (logits S(1), targets R), batch (S(0), S(0)) and R */
    dt_placement px[3][DT_MAX_MESH_DIMS], pt[3][DT_MAX_MESH_DIMS];
    for (int i = 0; i < R->m; i++) {
      px[0][i] = dt_shard(1), pt[0][i] = dt_replicate();
      px[1][i] = i == 0 ? dt_shard(0) : dt_replicate(), pt[1][i] = px[1][i];
      px[2][i] = dt_replicate(), pt[2][i] = dt_replicate();
    }
    for (int c = 0; c < 3; c++) ce_f32(R, px[c], pt[c]);
  }
  if (R->m == 1 && R->ms[0] == 4) {
    /* loss parallel backward: dlogits stays S(1), and the forward's saved
     * log-sum-exp (R, as the targets) makes it communication-free, as PyTorch's */
    const dt_placement S1 = dt_shard(1), Rp = dt_replicate();
    size_t c = ce_grad(R, &x, &t, &S1, &Rp, gx_pl);
    TU_CHECK(c == 0, "loss-parallel backward, rank %d: %zu collectives, expected 0", R->ctx->rank, c);
    TU_CHECK(dt_placement_eq(gx_pl[0], S1), "loss-parallel backward, rank %d: dlogits not S(1)",
             R->ctx->rank);
  }
}

/* ---- jobs ------------------------------------------------------------------------------- */

typedef struct mesh_job {
  const char *label;
  int ndim;
  int shape[DT_MAX_MESH_DIMS];
  bool sweep, oracles, grads;
  long cases; /* rank 0's count */
} mesh_job;

static dt_status body(dt_ctx *ctx, void *arg) {
  mesh_job *J = arg;
  rk R;
  dt_status s = ot_rank_open(&R, ctx, J->label, J->ndim, J->shape);
  if (s != DT_OK) return s;
  size_t mem0 = ctx->mem.host_cur;
  if (J->sweep) {
    emb_sweep(&R);
    ce_sweep(&R);
  }
  if (J->oracles && J->ndim == 1) {
    emb_oracles(&R);
    ce_oracles(&R);
  }
  if (J->oracles && J->ndim == 2) ce_oracles_2d(&R);
  if (J->grads) grads(&R);
  ot_rank_close(&R, mem0); /* every output, gradient and temporary of the ops was freed */
  if (ctx->rank == 0) J->cases = R.cases;
  return DT_OK;
}

int main(int argc, char **argv) {
  tu_opts o;
  tu_parse(argc, argv, &o);
  if (o.backend != DT_BACKEND_THREADS) {
    printf("SKIP: test_ops_embedding runs on the threads backend only\n");
    return SB_SKIP;
  }
  dt_device_cpu_blas_threads(1);
  mesh_job jobs[] = {
      {"(4)", 1, {4}, true, true, true, 0},
      {"(2,2)", 2, {2, 2}, true, true, true, 0},
      {"(1)", 1, {1}, true, false, true, 0},
  };
  double t0 = dt_now();
  for (size_t i = 0; i < sizeof jobs / sizeof jobs[0]; i++) {
    mesh_job *J = &jobs[i];
    double dt = ot_launch(o.backend, J->label, J->ndim, J->shape, body, J);
    printf("mesh %-6s %6ld cases %.2f s\n", J->label, J->cases, dt);
    /* a sweep that enumerates nothing must not pass on the other meshes' checks */
    TU_CHECK(J->cases > 0, "mesh %s ran no case", J->label);
  }
  printf("total %.2f s\n", dt_now() - t0);
  return tu_finish("test_ops_embedding");
}
