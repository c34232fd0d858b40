/* verify/test_ops_view.c: the view ops (view, reshape, transpose, permute) and
 * rms_norm of lib/ops on real ranks (threads backend), against naive references
 * computed here on the unsharded global tensors. The sharding rules are
 * PyTorch's: propagate_shape_and_sharding (torch/distributed/tensor/_ops/_view_ops.py)
 * and the norm strategies of _ops/_math_ops.py.
 *
 * What it checks:
 *  (a) values: on a 1-D mesh of 4 and a 2x2 mesh, every op on every input
 *      placement list from {R, S(0..r-1), P(sum)} per mesh dim, several shapes
 *      including uneven ones ([7,3], [5,4,2] on 4 ranks): dt_tensor_full of the
 *      output equals the reference (exactly for the view ops, which move data;
 *      within REL for rms_norm); Partial stays Partial through the view ops;
 *      view succeeds exactly where reshape needs no collective (then with the
 *      same output placements) and otherwise fails with DT_ERR_INVALID;
 *  (b) oracles: the cases where PyTorch keeps a Shard whose local block is not
 *      a piece of the viewed tensor ([4,6] S(1) -> [24]; [6,4] S(0) -> [3,2,4]
 *      on 2 ranks) give the right values after one all_gather; the shards that
 *      survive do so with 0 comms; the TP-attention chain of TorchTitan's
 *      Attention.forward with colwise wq (S(2) -> view
 *      -> S(2) -> transpose -> S(1) -> transpose -> S(2) -> view -> S(2)) with 0
 *      comms; rms_norm's test_layer_norm_bwd analogue (x [20,5,10] S(sd):
 *      forward and backward comms 0 if sd < 2 else 1, weight.grad Partial
 *      exactly when an outer dim is sharded) and the SequenceParallel case
 *      (S(1) [20,32,12]: 0 comms forward and backward, weight.grad P(sum));
 *      f32 rms_norm and transpose on S(0);
 *  (c) backward of every op against central finite differences of the
 *      reference (loss = sum(out * G)), sharded (mesh of 4) and unsharded
 *      (mesh of 1); and that every byte the ops allocated was freed.
 * Global values are small multiples of 1/4, so P(sum) splits are exact.
 * What it is not: a test of the cost model, of f32 accuracy, or of squeeze /
 * expand (not implemented).
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optest.h"
#include "testutil.h"

enum { MAXN = 256 }; /* elements of the largest global tensor of the sweeps */

/* Tolerances. EXACT: view ops copy values (and P(sum) splits of multiples of
 * 1/4 into 4 or 2 are exact). REL: rms_norm rounds a sum of <= 10 squares, a
 * sqrt and a product per element in f64 (and the P(sum) input is all-reduced
 * first): a few ulps, far below 1e-12 relative. FD: central differences with
 * h = 1e-6 have truncation error ~h^2 |f'''| (< 1e-10 here, |x| <= 1.5) and
 * round-off ~eps |L| / h (|L| < 100: ~2e-8), so 1e-6 (relative, floor 1)
 * separates a right gradient from a wrong one (errors O(0.1)). */
#define EXACT 0.0
#define REL 1e-12
static const double FD_H = 1e-6, FD_TOL = 1e-6;

typedef struct garr {
  int ndim;
  int64_t sh[DT_MAX_DIMS];
  double v[MAXN];
} garr;

static int64_t numel_of(int ndim, const int64_t *sh) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= sh[d];
  return n;
}
static int64_t numel(const garr *g) { return numel_of(g->ndim, g->sh); }

static void fill(double *v, int64_t n, int seed) {
  for (int64_t i = 0; i < n; i++) v[i] = (double)((7 * i + 5 * seed) % 13 - 6) / 4.0;
}
static void gfill(garr *g, int ndim, const int64_t *sh, int seed) {
  memset(g, 0, sizeof *g);
  g->ndim = ndim;
  for (int d = 0; d < ndim; d++) g->sh[d] = sh[d];
  fill(g->v, numel(g), seed);
}

/* ---- ops and references ------------------------------------------------------------- */

typedef enum top { T_VIEW, T_RESHAPE, T_TRANSPOSE, T_PERMUTE, T_RMS, T_N } top;
static const struct {
  const char *name;
  const dt_op *op;
  int n_in;
  double tol;
} OPS[T_N] = {
    {"view", &dt_op_view, 1, EXACT},           {"reshape", &dt_op_reshape, 1, EXACT},
    {"transpose", &dt_op_transpose, 1, EXACT}, {"permute", &dt_op_permute, 1, EXACT},
    {"rms_norm", &dt_op_rms_norm, 2, REL},
};

/* rms_norm over the last dim of x (n elements) with weight w, into y */
static void rms_ref(const double *x, int ndim, const int64_t *sh, const double *w, double eps, double *y) {
  int64_t d = sh[ndim - 1], n = numel_of(ndim, sh);
  for (int64_t r = 0; r < n / d; r++) {
    double ss = 0;
    for (int64_t k = 0; k < d; k++) ss += x[r * d + k] * x[r * d + k];
    double rms = sqrt(ss / (double)d + eps);
    for (int64_t k = 0; k < d; k++) y[r * d + k] = x[r * d + k] / rms * w[k];
  }
}

static void ref(top op, const dt_op_attrs *a, const garr *in, garr *out) {
  const garr *x = &in[0];
  memset(out, 0, sizeof *out);
  if (op == T_VIEW || op == T_RESHAPE) {
    int64_t known = 1;
    int inf = -1;
    for (int d = 0; d < a->shape_n; d++) {
      if (a->shape[d] < 0) inf = d;
      else known *= a->shape[d];
      out->sh[d] = a->shape[d];
    }
    if (inf >= 0) out->sh[inf] = numel(x) / known;
    out->ndim = a->shape_n;
    memcpy(out->v, x->v, sizeof out->v);
    return;
  }
  if (op == T_RMS) {
    *out = *x;
    rms_ref(x->v, x->ndim, x->sh, in[1].v, a->scalar != 0 ? a->scalar : 1e-5, out->v);
    return;
  }
  int perm[DT_MAX_DIMS];
  for (int d = 0; d < x->ndim; d++) perm[d] = d;
  if (op == T_TRANSPOSE) {
    int i0 = a->i0 < 0 ? a->i0 + x->ndim : a->i0, i1 = a->i1 < 0 ? a->i1 + x->ndim : a->i1;
    perm[i0] = i1;
    perm[i1] = i0;
  } else {
    for (int k = 0; k < x->ndim; k++) perm[k] = a->dims[k] < 0 ? a->dims[k] + x->ndim : a->dims[k];
  }
  out->ndim = x->ndim;
  for (int k = 0; k < x->ndim; k++) out->sh[k] = x->sh[perm[k]];
  int64_t xst[DT_MAX_DIMS], s = 1, idx[DT_MAX_DIMS];
  for (int d = x->ndim - 1; d >= 0; d--) {
    xst[d] = s;
    s *= x->sh[d];
  }
  for (int64_t e = 0; e < numel(out); e++) {
    int64_t r = e, p = 0;
    for (int k = out->ndim - 1; k >= 0; k--) {
      idx[k] = r % out->sh[k];
      r /= out->sh[k];
    }
    for (int k = 0; k < out->ndim; k++) p += idx[k] * xst[perm[k]];
    out->v[e] = x->v[p];
  }
}

/* ---- per-rank helpers ---------------------------------------------------------------- */

typedef ot_rank rk;

static void shape_str(int ndim, const int64_t *sh, char *buf, size_t n) { ot_shape_str(ndim, sh, buf, n); }

static dt_status make_raw(rk *R, int ndim, const int64_t *sh, double *v, const dt_placement *pl,
                          dt_tensor *t) {
  return ot_make(R, DT_F64, ndim, sh, v, pl, t);
}
static dt_status make(rk *R, const garr *g, const dt_placement *pl, dt_tensor *t) {
  return make_raw(R, g->ndim, g->sh, (double *)g->v, pl, t);
}

/* dt_tensor_full(t) == want (n values, shape ndim/sh) within tol (relative, floor 1) */
static bool check_vals(rk *R, const char *what, const dt_tensor *t, int ndim, const int64_t *sh,
                       const double *want, double tol) {
  return ot_check_vals(R, what, t, ndim, sh, want, tol);
}
static bool check_full(rk *R, const char *what, const dt_tensor *t, const garr *want, double tol) {
  return check_vals(R, what, t, want->ndim, want->sh, want->v, tol);
}

typedef struct call_res {
  dt_status st;
  dt_placement out_pl[DT_MAX_MESH_DIMS];
  size_t comms;
  int coll0;
  bool ok;
} call_res;

static void describe(rk *R, top op, const dt_op_attrs *a, const garr *in,
                     dt_placement pl[][DT_MAX_MESH_DIMS], char *what, size_t wn) {
  size_t k = (size_t)snprintf(what, wn, "%s on mesh %s", OPS[op].name, R->mlabel);
  for (int j = 0; j < OPS[op].n_in && k < wn; j++) {
    char ps[64], ss[64];
    dt_placements_str(R->m, pl[j], ps, sizeof ps);
    shape_str(in[j].ndim, in[j].sh, ss, sizeof ss);
    k += (size_t)snprintf(what + k, wn - k, "%s %s(%s)", j ? "," : "", ss, ps);
  }
  if (k >= wn) return;
  if (op == T_VIEW || op == T_RESHAPE) {
    char ss[64];
    shape_str(a->shape_n, a->shape, ss, sizeof ss);
    snprintf(what + k, wn - k, " -> %s", ss);
  } else if (op == T_TRANSPOSE) {
    snprintf(what + k, wn - k, " (%d,%d)", a->i0, a->i1);
  } else if (op == T_PERMUTE) {
    char ss[64];
    int64_t d[DT_MAX_DIMS];
    for (int i = 0; i < a->ndims; i++) d[i] = a->dims[i];
    shape_str(a->ndims, d, ss, sizeof ss);
    snprintf(what + k, wn - k, " dims %s", ss);
  }
}

/* Runs op on the globals `in` placed at pl[j]; when it succeeds checks the values.
 * expect_fail: a DT_ERR_INVALID is expected (and checked) instead. */
static void run_case(rk *R, top op, const dt_op_attrs *a, const garr *in,
                     dt_placement pl[][DT_MAX_MESH_DIMS], bool expect_fail, call_res *res) {
  dt_ctx *ctx = R->ctx;
  int n = OPS[op].n_in;
  char what[256];
  describe(R, op, a, in, pl, what, sizeof what);
  memset(res, 0, sizeof *res);
  res->coll0 = -1;
  dt_tensor t[2], out;
  int made = 0;
  for (int j = 0; j < n; j++) {
    dt_status s = make(R, &in[j], pl[j], &t[j]);
    if (s != DT_OK) {
      tu_fail(__FILE__, __LINE__, "%s, rank %d: distribute input %d -> %s: %s", what, ctx->rank, j,
              dt_status_str(s), dt_last_error(ctx));
      goto done;
    }
    made++;
  }
  const dt_tensor *ip[2] = {&t[0], &t[1]};
  dt_tensor *op_[1] = {&out};
  size_t before = dt_ledger_of(ctx)->n;
  dt_status s = dt_op_call(ctx, OPS[op].op, a, ip, op_, NULL);
  res->st = s;
  res->comms = dt_ledger_of(ctx)->n - before;
  if (res->comms) res->coll0 = dt_ledger_of(ctx)->rows[before].op;
  R->cases++;
  if (expect_fail) {
    if (s != DT_ERR_INVALID)
      tu_fail(__FILE__, __LINE__, "%s, rank %d: expected DT_ERR_INVALID, got %s", what, ctx->rank,
              dt_status_str(s));
    else if (res->comms)
      tu_fail(__FILE__, __LINE__, "%s, rank %d: refused after %zu collectives", what, ctx->rank, res->comms);
    else
      res->ok = true;
    if (s == DT_OK) dt_tensor_free(ctx, &out);
    goto done;
  }
  if (s != DT_OK) {
    tu_fail(__FILE__, __LINE__, "%s, rank %d: dt_op_call -> %s: %s", what, ctx->rank,
            dt_status_str(s), dt_last_error(ctx));
    goto done;
  }
  for (int i = 0; i < R->m; i++) res->out_pl[i] = out.pl[i];
  garr want;
  ref(op, a, in, &want);
  res->ok = check_full(R, what, &out, &want, OPS[op].tol);
  /* the view ops keep Partial (no arithmetic, so no reason to reduce) */
  if (op != T_RMS)
    for (int i = 0; i < R->m; i++)
      if (pl[0][i].kind == DT_PL_PARTIAL && !dt_placement_eq(out.pl[i], pl[0][i]))
        tu_fail(__FILE__, __LINE__, "%s, rank %d: Partial on mesh dim %d was not kept", what, ctx->rank, i);
  dt_tensor_free(ctx, &out);
done:
  for (int j = 0; j < made; j++) dt_tensor_free(ctx, &t[j]);
}

/* all placement lists over the mesh from {R, S(0..r-1), P(sum)} per mesh dim */
enum { MAXL = 64 };
static int pl_lists(const rk *R, int r, dt_placement lists[][DT_MAX_MESH_DIMS]) {
  dt_placement one[DT_MAX_DIMS + 2];
  int k = 0;
  one[k++] = dt_replicate();
  for (int d = 0; d < r; d++) one[k++] = dt_shard(d);
  one[k++] = dt_partial(DT_RED_SUM);
  int total = 1;
  for (int i = 0; i < R->m; i++) total *= k;
  if (total > MAXL) total = MAXL;
  for (int c = 0; c < total; c++)
    for (int i = R->m - 1, e = c; i >= 0; i--) {
      lists[c][i] = one[e % k];
      e /= k;
    }
  return total;
}

/* PyTorch's is_tensor_shardable of a global (dispatch's filter): without it,
 * even a no-comm strategy falls back to R */
static bool shardable(const rk *R, const garr *g, const dt_placement *pl) {
  int64_t nsh[DT_MAX_DIMS];
  for (int d = 0; d < DT_MAX_DIMS; d++) nsh[d] = 1;
  for (int i = 0; i < R->m; i++)
    if (pl[i].kind == DT_PL_SHARD) nsh[pl[i].dim] *= R->ms[i];
  for (int d = 0; d < g->ndim; d++)
    if (nsh[d] > 1 && nsh[d] > g->sh[d]) return false;
  return true;
}

/* ---- (a) sweep ---------------------------------------------------------------------- */

typedef struct vcase {
  int n;
  int64_t s[4];
  int nt;
  int64_t t[5][4]; /* targets, 0-terminated lists padded by n per row below */
  int tn[5];
} vcase;

static void sweep(rk *R) {
  static const vcase VC[] = {
      {2, {4, 6}, 5, {{24}, {2, 12}, {4, 2, 3}, {3, 8}, {-1, 4}}, {1, 2, 3, 2, 2}},
      {2, {8, 6}, 5, {{48}, {2, 4, 6}, {8, 2, 3}, {4, 12}, {16, 3}}, {1, 3, 3, 2, 2}},
      {3, {6, 4, 2}, 5, {{24, 2}, {6, 8}, {3, 2, 4, 2}, {48}, {2, 3, 8}}, {2, 2, 4, 1, 3}},
      {2, {7, 3}, 4, {{21}, {7, 3, 1}, {1, 7, 3}, {7, -1}}, {1, 3, 3, 2}},
      {3, {5, 4, 2}, 4, {{5, 8}, {20, 2}, {10, 4}, {5, 2, 2, 2}}, {2, 2, 2, 4}},
      {1, {12}, 4, {{3, 4}, {4, 3}, {12, 1}, {2, 6}}, {2, 2, 2, 2}},
  };
  dt_placement la[MAXL][DT_MAX_MESH_DIMS];
  dt_op_attrs a;
  call_res rr, rv;
  for (size_t c = 0; c < sizeof VC / sizeof VC[0]; c++) {
    garr in[2];
    gfill(&in[0], VC[c].n, VC[c].s, 1);
    int nl = pl_lists(R, in[0].ndim, la);
    for (int x = 0; x < nl; x++) {
      dt_placement pl[1][DT_MAX_MESH_DIMS];
      memcpy(pl[0], la[x], sizeof pl[0]);
      for (int t = 0; t < VC[c].nt; t++) {
        memset(&a, 0, sizeof a);
        a.shape_n = VC[c].tn[t];
        for (int d = 0; d < a.shape_n; d++) a.shape[d] = VC[c].t[t][d];
        run_case(R, T_RESHAPE, &a, in, pl, false, &rr);
        if (rr.st != DT_OK) continue;
        /* view: the same result exactly where reshape moved nothing */
        run_case(R, T_VIEW, &a, in, pl, rr.comms > 0, &rv);
        if (rr.comms == 0 && rv.ok)
          for (int i = 0; i < R->m; i++)
            if (!dt_placement_eq(rv.out_pl[i], rr.out_pl[i]))
              tu_fail(__FILE__, __LINE__, "view and reshape of case %zu target %d differ in output "
                      "placement on mesh %s", c, t, R->mlabel);
      }
      /* transposes of every pair (negative spellings too) and a few permutations */
      int nd = in[0].ndim;
      for (int i0 = 0; i0 < nd; i0++)
        for (int i1 = i0; i1 < nd; i1++) {
          memset(&a, 0, sizeof a);
          a.i0 = i0;
          a.i1 = (i0 + i1) % 2 ? i1 - nd : i1;
          run_case(R, T_TRANSPOSE, &a, in, pl, false, &rr);
          if (rr.comms && shardable(R, &in[0], pl[0]))
            tu_fail(__FILE__, __LINE__, "transpose moved data on mesh %s case %zu list %d (%d,%d)", R->mlabel, c, x, a.i0, a.i1);
        }
      if (nd == 3) {
        static const int P3[3][3] = {{2, 0, 1}, {1, 2, 0}, {0, -1, 1}};
        for (int p = 0; p < 3; p++) {
          memset(&a, 0, sizeof a);
          a.ndims = 3;
          for (int k = 0; k < 3; k++) a.dims[k] = P3[p][k];
          run_case(R, T_PERMUTE, &a, in, pl, false, &rr);
        }
      } else {
        memset(&a, 0, sizeof a);
        a.ndims = nd;
        for (int k = 0; k < nd; k++) a.dims[k] = nd - 1 - k;
        run_case(R, T_PERMUTE, &a, in, pl, false, &rr);
      }
    }
    /* rms_norm over the last dim; weight R or P(sum) on every mesh dim */
    gfill(&in[1], 1, &in[0].sh[in[0].ndim - 1], 2);
    for (int x = 0; x < nl; x++) {
      dt_placement pl[2][DT_MAX_MESH_DIMS];
      memcpy(pl[0], la[x], sizeof pl[0]);
      for (int w = 0; w < 2; w++) {
        for (int i = 0; i < R->m; i++) pl[1][i] = w ? dt_partial(DT_RED_SUM) : dt_replicate();
        memset(&a, 0, sizeof a);
        a.scalar = w ? 0.25 : 0.0; /* default eps and an explicit one */
        run_case(R, T_RMS, &a, in, pl, false, &rr);
        /* a Shard on an outer dim is kept with no comm */
        bool outer = true;
        for (int i = 0; i < R->m; i++)
          if (pl[0][i].kind != DT_PL_SHARD || pl[0][i].dim == in[0].ndim - 1) outer = false;
        if (!shardable(R, &in[0], pl[0])) outer = false; /* the all-R fallback */
        if (outer && w == 0 && rr.st == DT_OK && rr.comms != 0)
          tu_fail(__FILE__, __LINE__, "rms_norm on outer shards moved data on mesh %s", R->mlabel);
      }
    }
  }
}

/* ---- (b) oracles ------------------------------------------------------------------------ */

static void expect(rk *R, const char *name, const call_res *res, size_t comms, dt_placement want, int coll) {
  char got[32], exp_[32];
  dt_placements_str(1, res->out_pl, got, sizeof got);
  dt_placements_str(1, &want, exp_, sizeof exp_);
  if (!res->ok) tu_fail(__FILE__, __LINE__, "oracle %s, rank %d: failed (above)", name, R->ctx->rank);
  if (res->comms != comms)
    tu_fail(__FILE__, __LINE__, "oracle %s, rank %d: %zu collectives, expected %zu", name, R->ctx->rank,
            res->comms, comms);
  else if (coll >= 0 && comms > 0 && res->coll0 != coll)
    tu_fail(__FILE__, __LINE__, "oracle %s, rank %d: collective %s, expected %s", name, R->ctx->rank,
            dt_coll_name((dt_coll)res->coll0), dt_coll_name((dt_coll)coll));
  if (!dt_placement_eq(res->out_pl[0], want))
    tu_fail(__FILE__, __LINE__, "oracle %s, rank %d: output %s, expected %s", name, R->ctx->rank, got, exp_);
}

static void set_shape(dt_op_attrs *a, int n, const int64_t *s) {
  memset(a, 0, sizeof *a);
  a->shape_n = n;
  for (int d = 0; d < n; d++) a->shape[d] = s[d];
}

/* mesh of 2: the cases PyTorch gets wrong, and surviving shards */
static void oracles_2(rk *R) {
  const dt_placement Rp = dt_replicate(), S0 = dt_shard(0), S1 = dt_shard(1);
  dt_placement pl[1][DT_MAX_MESH_DIMS];
  garr in[1];
  dt_op_attrs a;
  call_res res;
  static const int64_t s46[2] = {4, 6}, s64[2] = {6, 4}, s86[2] = {8, 6}, t24[1] = {24},
                       t324[3] = {3, 2, 4}, t823[3] = {8, 2, 3}, t2x[2] = {2, 12};
  /* [4,6] S(1) viewed as [24]: the local [4,3] blocks are not pieces of the flat tensor */
  gfill(&in[0], 2, s46, 3);
  pl[0][0] = S1;
  set_shape(&a, 1, t24);
  run_case(R, T_VIEW, &a, in, pl, true, &res); /* refuses: DT_ERR_INVALID, checked there */
  run_case(R, T_RESHAPE, &a, in, pl, false, &res);
  expect(R, "reshape([4,6] S(1) -> [24])", &res, 1, Rp, DT_COLL_ALL_GATHER);
  /* [6,4] S(0) -> [3,2,4]: piece 0 (3) is not divisible by 2 */
  gfill(&in[0], 2, s64, 4);
  pl[0][0] = S0;
  set_shape(&a, 3, t324);
  run_case(R, T_VIEW, &a, in, pl, true, &res);
  run_case(R, T_RESHAPE, &a, in, pl, false, &res);
  expect(R, "reshape([6,4] S(0) -> [3,2,4])", &res, 1, Rp, DT_COLL_ALL_GATHER);
  /* surviving shards: flatten on the leftmost dim, split with piece 0 divisible */
  gfill(&in[0], 2, s46, 5);
  set_shape(&a, 1, t24);
  run_case(R, T_VIEW, &a, in, pl, false, &res);
  expect(R, "view([4,6] S(0) -> [24])", &res, 0, S0, -1);
  set_shape(&a, 2, t2x);
  run_case(R, T_VIEW, &a, in, pl, false, &res);
  expect(R, "view([4,6] S(0) -> [2,12])", &res, 0, S0, -1);
  gfill(&in[0], 2, s86, 6);
  pl[0][0] = S1;
  set_shape(&a, 3, t823);
  run_case(R, T_VIEW, &a, in, pl, false, &res);
  expect(R, "view([8,6] S(1) -> [8,2,3])", &res, 0, S1, -1);
  /* reshape error: numel mismatch */
  static const int64_t bad[2] = {5, 5};
  set_shape(&a, 2, bad);
  run_case(R, T_RESHAPE, &a, in, pl, true, &res);
}

/* mesh of 4: the TP-attention chain (TorchTitan's Attention.forward in
 * torchtitan/models/llama3/model/model.py with wq colwise-parallel: the heads
 * dim stays sharded through view, transpose, sdpa and back) */
static void oracle_attention(rk *R) {
  dt_ctx *ctx = R->ctx;
  enum { B = 2, S = 3, H = 4, HD = 2 }; /* h % tp == 0 with tp = 4 */
  int64_t sh[3] = {B, S, H * HD};
  garr g;
  gfill(&g, 3, sh, 7);
  dt_placement pl[DT_MAX_MESH_DIMS] = {dt_shard(2)};
  dt_tensor t[5];
  int made = 0;
  dt_status s;
  size_t before = dt_ledger_of(ctx)->n;
  DT_CHECK_GOTO(make(R, &g, pl, &t[0]), s, fail);
  made = 1;
  before = dt_ledger_of(ctx)->n;
  dt_op_attrs a;
  static const int64_t v4[4] = {B, S, H, HD}, v3[3] = {B, S, H * HD};
  const int want_dim[5] = {2, 2, 1, 2, 2};
  for (int k = 1; k < 5; k++) {
    const dt_op *op;
    if (k == 1 || k == 4) {
      set_shape(&a, k == 1 ? 4 : 3, k == 1 ? v4 : v3);
      op = &dt_op_view;
    } else {
      memset(&a, 0, sizeof a);
      a.i0 = 1;
      a.i1 = k == 2 ? 2 : -2; /* transpose(1,2), then back as transpose(1,-2) */
      op = &dt_op_transpose;
    }
    const dt_tensor *ip[1] = {&t[k - 1]};
    dt_tensor *o[1] = {&t[k]};
    DT_CHECK_GOTO(dt_op_call(ctx, op, &a, ip, o, NULL), s, fail);
    made++;
    TU_CHECK(t[k].pl[0].kind == DT_PL_SHARD && t[k].pl[0].dim == want_dim[k],
             "TP attention step %d, rank %d: output is not S(%d)", k, ctx->rank, want_dim[k]);
  }
  TU_CHECK(dt_ledger_of(ctx)->n == before, "TP attention chain, rank %d: %zu collectives, expected 0",
           ctx->rank, dt_ledger_of(ctx)->n - before);
  check_full(R, "TP attention chain round trip", &t[4], &g, EXACT);
  R->cases++;
  goto done;
fail:
  tu_fail(__FILE__, __LINE__, "TP attention chain, rank %d: %s: %s", ctx->rank, dt_status_str(s),
          dt_last_error(ctx));
done:
  for (int k = 0; k < made; k++) dt_tensor_free(ctx, &t[k]);
}

/* rms_norm forward + backward on x (shape sh) placed pl: comms of each and the
 * weight gradient's placement. Checks the forward values and dweight. */
static void rms_oracle(rk *R, const char *name, int ndim, const int64_t *sh, dt_placement xp,
                       size_t fwd_comms, size_t bwd_comms, dt_placement wgrad) {
  dt_ctx *ctx = R->ctx;
  int64_t n = numel_of(ndim, sh), d = sh[ndim - 1];
  double *x = malloc(sizeof(double) * (size_t)n), *y = malloc(sizeof(double) * (size_t)n),
         *G = malloc(sizeof(double) * (size_t)n), *w = malloc(sizeof(double) * (size_t)d),
         *dw = calloc((size_t)d, sizeof(double));
  dt_tensor tx, tw, ty, tg, gin[2];
  int have = 0;
  dt_status s = DT_OK;
  if (!x || !y || !G || !w || !dw) {
    tu_fail(__FILE__, __LINE__, "%s: out of memory", name);
    goto out;
  }
  fill(x, n, 11);
  fill(G, n, 12);
  fill(w, d, 13);
  rms_ref(x, ndim, sh, w, 1e-5, y);
  /* dweight[k] = sum over rows of G * x_hat */
  for (int64_t r = 0; r < n / d; r++) {
    double ss = 0;
    for (int64_t k = 0; k < d; k++) ss += x[r * d + k] * x[r * d + k];
    double rms = sqrt(ss / (double)d + 1e-5);
    for (int64_t k = 0; k < d; k++) dw[k] += G[r * d + k] * x[r * d + k] / rms;
  }
  dt_placement pl[DT_MAX_MESH_DIMS] = {xp}, rpl[DT_MAX_MESH_DIMS] = {dt_replicate()};
  DT_CHECK_GOTO(make_raw(R, ndim, sh, x, pl, &tx), s, fail);
  have = 1;
  DT_CHECK_GOTO(make_raw(R, 1, &sh[ndim - 1], w, rpl, &tw), s, fail);
  have = 2;
  dt_op_attrs a;
  memset(&a, 0, sizeof a);
  const dt_tensor *ip[2] = {&tx, &tw};
  dt_tensor *op[1] = {&ty};
  size_t b0 = dt_ledger_of(ctx)->n;
  DT_CHECK_GOTO(dt_op_call(ctx, &dt_op_rms_norm, &a, ip, op, NULL), s, fail);
  have = 3;
  size_t fc = dt_ledger_of(ctx)->n - b0;
  DT_CHECK_GOTO(make_raw(R, ndim, sh, G, ty.pl, &tg), s, fail);
  have = 4;
  const dt_tensor *yo[1] = {&ty}, *go[1] = {&tg};
  dt_tensor *gp[2] = {&gin[0], &gin[1]};
  size_t b1 = dt_ledger_of(ctx)->n;
  DT_CHECK_GOTO(dt_op_rms_norm.backward(ctx, &a, ip, yo, go, gp), s, fail);
  have = 5;
  size_t bc = dt_ledger_of(ctx)->n - b1;
  TU_CHECK(fc == fwd_comms, "%s, rank %d: forward %zu collectives, expected %zu", name, ctx->rank, fc, fwd_comms);
  TU_CHECK(bc == bwd_comms, "%s, rank %d: backward %zu collectives, expected %zu", name, ctx->rank, bc, bwd_comms);
  TU_CHECK(dt_placement_eq(gin[1].pl[0], wgrad), "%s, rank %d: weight.grad placement is not the expected one",
           name, ctx->rank);
  /* 1e-10: sums of up to 640 rows of O(1) terms in a different order (f64) */
  check_vals(R, name, &ty, ndim, sh, y, REL);
  check_vals(R, name, &gin[1], 1, &sh[ndim - 1], dw, 1e-10);
  R->cases++;
  goto out;
fail:
  tu_fail(__FILE__, __LINE__, "%s, rank %d: %s: %s", name, ctx->rank, dt_status_str(s), dt_last_error(ctx));
out:
  if (have >= 5) {
    dt_tensor_free(ctx, &gin[0]);
    dt_tensor_free(ctx, &gin[1]);
  }
  if (have >= 4) dt_tensor_free(ctx, &tg);
  if (have >= 3) dt_tensor_free(ctx, &ty);
  if (have >= 2) dt_tensor_free(ctx, &tw);
  if (have >= 1) dt_tensor_free(ctx, &tx);
  free(x);
  free(y);
  free(G);
  free(w);
  free(dw);
}

static void oracles_4(rk *R) {
  oracle_attention(R);
  static const int64_t ln[3] = {20, 5, 10}, sp[3] = {20, 32, 12};
  const dt_placement Ps = dt_partial(DT_RED_SUM), Rp = dt_replicate();
  for (int sd = 0; sd < 3; sd++) {
    char name[96];
    snprintf(name, sizeof name, "rms_norm [20,5,10] S(%d) (test_layer_norm_bwd)", sd);
    rms_oracle(R, name, 3, ln, dt_shard(sd), sd < 2 ? 0 : 1, sd < 2 ? 0 : 1, sd < 2 ? Ps : Rp);
  }
  rms_oracle(R, "rms_norm [20,32,12] S(1) (SequenceParallel)", 3, sp, dt_shard(1), 0, 0, Ps);
}

/* ---- (c) gradients ------------------------------------------------------------------------ */

static double loss_ref(top op, const dt_op_attrs *a, const garr *in, const garr *G) {
  garr out;
  ref(op, a, in, &out);
  double L = 0;
  for (int64_t i = 0; i < numel(&out); i++) L += out.v[i] * G->v[i];
  return L;
}

typedef struct loss_arg {
  top op;
  const dt_op_attrs *a;
  const garr *in, *G;
} loss_arg;
static double loss_cb(void *p) {
  const loss_arg *L = p;
  return loss_ref(L->op, L->a, L->in, L->G);
}

static void grad_case(rk *R, top op, const dt_op_attrs *a, garr *in, dt_placement pl[][DT_MAX_MESH_DIMS]) {
  int n = OPS[op].n_in;
  char what[256];
  snprintf(what, 16, "backward of ");
  describe(R, op, a, in, pl, what + 12, sizeof what - 12);
  garr out, G;
  ref(op, a, in, &out);
  gfill(&G, out.ndim, out.sh, 9);
  for (int64_t i = 0; i < numel(&G); i++) G.v[i] += 0.1 * (double)(i % 3); /* break symmetry */
  ot_arr ia[2], ga = {G.ndim, G.sh, G.v};
  for (int j = 0; j < n; j++) ia[j] = (ot_arr){in[j].ndim, in[j].sh, in[j].v};
  loss_arg la = {op, a, in, &G};
  ot_grad_check(R, what, OPS[op].op, a, n, ia, pl, &ga, loss_cb, &la, FD_H, FD_TOL);
}

static void grads(rk *R) {
  dt_placement set[5] = {dt_replicate(), dt_shard(0), dt_shard(1), dt_partial(DT_RED_SUM), dt_shard(2)};
  int nset = R->ms[0] > 1 ? 5 : 1;
  static const int64_t s3[3] = {4, 6, 2}, s2[2] = {7, 4};
  garr in[2];
  dt_op_attrs a;
  for (int x = 0; x < nset; x++) {
    dt_placement pl[2][DT_MAX_MESH_DIMS];
    memset(pl, 0, sizeof pl);
    pl[0][0] = set[x];
    pl[1][0] = dt_replicate();
    gfill(&in[0], 3, s3, 1);
    static const int64_t tg[3][3] = {{24, 2}, {4, 3, 4}, {2, 2, 12}};
    static const int tn[3] = {2, 3, 3};
    for (int t = 0; t < 3; t++) {
      set_shape(&a, tn[t], tg[t]);
      grad_case(R, T_RESHAPE, &a, in, pl);
    }
    set_shape(&a, 2, tg[0]); /* [24,2]: S(0) survives; S(1) does not; S(2) of a dim of 2
                              * on 4 ranks is unshardable, which view refuses too */
    if (!(set[x].kind == DT_PL_SHARD && set[x].dim >= 1)) grad_case(R, T_VIEW, &a, in, pl);
    memset(&a, 0, sizeof a);
    a.i0 = 0;
    a.i1 = -1;
    grad_case(R, T_TRANSPOSE, &a, in, pl);
    a.ndims = 3;
    a.dims[0] = 1;
    a.dims[1] = 2;
    a.dims[2] = 0;
    grad_case(R, T_PERMUTE, &a, in, pl);
    /* rms_norm: [4,6,2] and [7,4]; weight R and S(0) */
    for (int sh = 0; sh < 2; sh++) {
      if (sh == 1 && set[x].kind == DT_PL_SHARD && set[x].dim == 2) continue;
      if (sh == 0) gfill(&in[0], 3, s3, 3);
      else gfill(&in[0], 2, s2, 3);
      gfill(&in[1], 1, &in[0].sh[in[0].ndim - 1], 4);
      for (int w = 0; w < 2; w++) {
        pl[1][0] = w ? dt_shard(0) : dt_replicate();
        memset(&a, 0, sizeof a);
        a.scalar = 0.5; /* a large eps too: its term must be right */
        grad_case(R, T_RMS, &a, in, pl);
      }
    }
  }
}

/* ---- f32: rms_norm and transpose on S(0) ---------------------------------------------- */

/* f32 tolerance: inputs are exact in f32; rms_norm rounds its result once to
 * f32 (eps 6e-8) after a double computation, so 1e-6 relative (floor 1) is
 * ample and still catches indexing errors (O(0.1)). transpose is exact. */
static const double F32_TOL = 1e-6;

static void f32_checks(rk *R) {
  dt_ctx *ctx = R->ctx;
  static const int64_t sh[2] = {8, 6};
  double xd[48], wd[6], yd[48];
  float xf[48], wf[6];
  fill(xd, 48, 1);
  fill(wd, 6, 2);
  for (int i = 0; i < 48; i++) xf[i] = (float)xd[i];
  for (int i = 0; i < 6; i++) wf[i] = (float)wd[i];
  rms_ref(xd, 2, sh, wd, 1e-5, yd);
  dt_tensor tx, tw, ty, tt;
  int have = 0;
  dt_status s;
  dt_array ax, aw, full;
  dt_placement p0[DT_MAX_MESH_DIMS] = {dt_shard(0)}, pr[DT_MAX_MESH_DIMS] = {dt_replicate()};
  DT_CHECK_GOTO(dt_array_wrap(ctx, DT_DEV_CPU, DT_F32, 2, sh, xf, &ax), s, fail);
  DT_CHECK_GOTO(dt_array_wrap(ctx, DT_DEV_CPU, DT_F32, 1, &sh[1], wf, &aw), s, fail);
  DT_CHECK_GOTO(dt_tensor_distribute(ctx, R->mesh, &ax, p0, &tx), s, fail);
  have = 1;
  DT_CHECK_GOTO(dt_tensor_distribute(ctx, R->mesh, &aw, pr, &tw), s, fail);
  have = 2;
  dt_op_attrs a;
  memset(&a, 0, sizeof a);
  const dt_tensor *ip[2] = {&tx, &tw};
  dt_tensor *o[1] = {&ty};
  DT_CHECK_GOTO(dt_op_call(ctx, &dt_op_rms_norm, &a, ip, o, NULL), s, fail);
  have = 3;
  a.i0 = 0;
  a.i1 = 1;
  o[0] = &tt;
  DT_CHECK_GOTO(dt_op_call(ctx, &dt_op_transpose, &a, ip, o, NULL), s, fail);
  have = 4;
  DT_CHECK_GOTO(dt_tensor_full(ctx, &ty, &full), s, fail);
  const float *v = full.data;
  for (int i = 0; i < 48; i++)
    if (!(fabs((double)v[i] - yd[i]) <= F32_TOL * (1 + fabs(yd[i])))) {
      tu_fail(__FILE__, __LINE__, "f32 rms_norm, rank %d: element %d is %.9g, expected %.9g", ctx->rank, i,
              (double)v[i], yd[i]);
      break;
    }
  dt_array_free(ctx, &full);
  DT_CHECK_GOTO(dt_tensor_full(ctx, &tt, &full), s, fail);
  v = full.data;
  TU_CHECK(tt.pl[0].kind == DT_PL_SHARD && tt.pl[0].dim == 1, "f32 transpose, rank %d: not S(1)", ctx->rank);
  for (int i = 0; i < 6; i++)
    for (int j = 0; j < 8; j++)
      if (v[i * 8 + j] != xf[j * 6 + i]) {
        tu_fail(__FILE__, __LINE__, "f32 transpose, rank %d: element (%d,%d) wrong", ctx->rank, i, j);
        i = 6;
        break;
      }
  dt_array_free(ctx, &full);
  R->cases += 2;
  goto done;
fail:
  tu_fail(__FILE__, __LINE__, "f32 checks, rank %d: %s: %s", ctx->rank, dt_status_str(s), dt_last_error(ctx));
done:
  if (have >= 4) dt_tensor_free(ctx, &tt);
  if (have >= 3) dt_tensor_free(ctx, &ty);
  if (have >= 2) dt_tensor_free(ctx, &tw);
  if (have >= 1) dt_tensor_free(ctx, &tx);
}

/* ---- jobs ------------------------------------------------------------------------------- */

typedef struct mesh_job {
  const char *label;
  int ndim;
  int shape[DT_MAX_MESH_DIMS];
  bool do_sweep, do_oracles, do_grads;
  long cases; /* rank 0's count */
} mesh_job;

static dt_status body(dt_ctx *ctx, void *arg) {
  mesh_job *J = arg;
  rk R;
  dt_status s = ot_rank_open(&R, ctx, J->label, J->ndim, J->shape);
  if (s != DT_OK) return s;
  size_t mem0 = ctx->mem.host_cur;
  if (J->do_sweep) sweep(&R);
  if (J->do_oracles && J->shape[0] == 2) oracles_2(&R);
  if (J->do_oracles && J->shape[0] == 4) oracles_4(&R);
  if (J->do_grads) grads(&R);
  if (J->do_sweep && J->ndim == 1) f32_checks(&R);
  ot_rank_close(&R, mem0); /* every output, gradient and temporary of the ops was freed */
  if (ctx->rank == 0) J->cases = R.cases;
  return DT_OK;
}

int main(int argc, char **argv) {
  tu_opts o;
  tu_parse(argc, argv, &o);
  if (o.backend != DT_BACKEND_THREADS) {
    printf("SKIP: test_ops_view runs on the threads backend only\n");
    return SB_SKIP;
  }
  dt_device_cpu_blas_threads(1);
  mesh_job jobs[] = {
      {"(4)", 1, {4}, true, true, true, 0},
      {"(2,2)", 2, {2, 2}, true, false, false, 0},
      {"(2)", 1, {2}, false, true, false, 0},
      {"(1)", 1, {1}, false, false, true, 0},
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
  return tu_finish("test_ops_view");
}
