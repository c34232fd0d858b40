/* verify/test_ops_pointwise.c: the pointwise ops (add, sub, mul, scale, silu,
 * swiglu), the reductions (sum, mean) and softmax of lib/ops on real ranks
 * (threads backend), against naive references computed here on the unsharded
 * global tensors. The sharding rules are PyTorch's: pointwise_strategy and
 * linear_pointwise_ops (torch/distributed/tensor/_ops/_pointwise_ops.py),
 * common_reduction_strategy and softmax_strategy (_ops/_math_ops.py).
 *
 * What it checks:
 *  (a) values: on a 1-D mesh of 4 and a 2x2 mesh, every op on every combination
 *      of input placements from {R, S(0..r-1), P(sum)} per mesh dim (on the 1-D
 *      mesh also P(avg) and P(max)), shapes including uneven ones ([7,3] on 4
 *      ranks), broadcasting ([2,5,4]+[4], [6,1]+[5], [4]+[3,4]), reductions
 *      over several dim sets with and without keepdim: dt_tensor_full of the
 *      output equals the reference;
 *  (b) the oracles of test/distributed/tensor/test_pointwise_ops.py and
 *      test_math_ops.py on a 1-D mesh of 4: the collectives the call
 *      records in the ledger and the output placements;
 *  (c) backward of every op against central finite differences of the
 *      reference (loss = sum(out * G), G fixed), on a 1-D mesh of 4 with several
 *      input placements and on a mesh of 1;
 *  (d) the CPU kernels' f32 vector primitives (lib/device/cpu/vmath.h: exp, sum, dot, max)
 *      against libm in double, and f32 silu / swiglu / swiglu's fused backward
 *      on inputs where exp over- and underflows.
 * Global values are small multiples of 1/4 ((7 i + 5 seed) mod 13 - 6) / 4, so
 * sums of them (and P(sum) splits by 4 and 2) are exact in f64.
 * What it is not: a test of dispatch's cost model (test_plan / explain) or of
 * f32 accuracy; matmul ops are in test_ops_matmul.
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/cpu/vmath.h"
#include "optest.h"
#include "testutil.h"

enum { MAXN = 128 }; /* elements of the largest global tensor used here */

/* Tolerances. EXACT: add/sub/sum of multiples of 1/16 are exact in f64 whatever
 * the order. REL: other ops round; f64 sums of <= 40 terms of magnitude < 10,
 * exp, and splits over 4 ranks differ from the reference's order by a few
 * hundred ulps at most, far below 1e-12 relative. FD: central differences with
 * h = 1e-6 have truncation error ~h^2 |f'''| (< 1e-11 here) and round-off
 * ~eps |L| / h (|L| < 100: ~2e-8), so 1e-6 (relative, floor 1) separates a
 * right gradient from a wrong one by orders of magnitude. */
#define EXACT 0.0
#define REL 1e-12
static const double FD_H = 1e-6, FD_TOL = 1e-6;

typedef struct garr {
  int ndim;
  int64_t sh[DT_MAX_DIMS];
  double v[MAXN];
} garr;

static int64_t numel(const garr *g) {
  int64_t n = 1;
  for (int d = 0; d < g->ndim; d++) n *= g->sh[d];
  return n;
}

static void gfill(garr *g, int ndim, const int64_t *sh, int seed) {
  memset(g, 0, sizeof *g);
  g->ndim = ndim;
  for (int d = 0; d < ndim; d++) g->sh[d] = sh[d];
  for (int64_t i = 0; i < numel(g); i++) g->v[i] = (double)((7 * i + 5 * seed) % 13 - 6) / 4.0;
}

/* ---- the ops under test and their references ---------------------------------------- */

typedef enum top { T_ADD, T_SUB, T_MUL, T_SCALE, T_SILU, T_SWIGLU, T_SUM, T_MEAN, T_SOFTMAX, T_N } top;

static const struct {
  const char *name;
  const dt_op *op;
  int n_in;
  double tol;
} OPS[T_N] = {
    {"add", &dt_op_add, 2, EXACT},   {"sub", &dt_op_sub, 2, EXACT},
    {"mul", &dt_op_mul, 2, REL},     {"scale", &dt_op_scale, 1, REL},
    {"silu", &dt_op_silu, 1, REL},   {"swiglu", &dt_op_swiglu, 2, REL},
    {"sum", &dt_op_sum, 1, EXACT},   {"mean", &dt_op_mean, 1, REL},
    {"softmax", &dt_op_softmax, 1, REL},
};

static double sig(double x) { return 1.0 / (1.0 + exp(-x)); }

static void unflat(const garr *g, int64_t i, int64_t *idx) {
  for (int d = g->ndim - 1; d >= 0; d--) {
    idx[d] = g->sh[d] ? i % g->sh[d] : 0;
    if (g->sh[d]) i /= g->sh[d];
  }
}

/* element of x at output multi-index idx (ndim nd), numpy broadcasting */
static double bget(const garr *x, int nd, const int64_t *idx) {
  int64_t f = 0;
  for (int d = 0; d < x->ndim; d++) {
    int64_t i = x->sh[d] == 1 ? 0 : idx[d + nd - x->ndim];
    f = f * x->sh[d] + i;
  }
  return x->v[f];
}

static bool reduced(const dt_op_attrs *a, int ndim, int d) {
  if (a->ndims == 0) return true;
  for (int k = 0; k < a->ndims; k++)
    if ((a->dims[k] < 0 ? a->dims[k] + ndim : a->dims[k]) == d) return true;
  return false;
}

static void ref(top op, const dt_op_attrs *a, const garr *in, garr *out) {
  memset(out, 0, sizeof *out);
  if (op == T_SUM || op == T_MEAN) {
    const garr *x = &in[0];
    int64_t ost[DT_MAX_DIMS], s = 1, cnt = 1;
    for (int d = x->ndim - 1; d >= 0; d--) {
      bool r = reduced(a, x->ndim, d);
      ost[d] = r ? 0 : s;
      if (!r) s *= x->sh[d];
      else cnt *= x->sh[d];
    }
    for (int d = 0; d < x->ndim; d++) {
      bool r = reduced(a, x->ndim, d);
      if (r && !a->keepdim) continue;
      out->sh[out->ndim++] = r ? 1 : x->sh[d];
    }
    int64_t idx[DT_MAX_DIMS];
    for (int64_t i = 0; i < numel(x); i++) {
      unflat(x, i, idx);
      int64_t p = 0;
      for (int d = 0; d < x->ndim; d++) p += idx[d] * ost[d];
      out->v[p] += x->v[i];
    }
    if (op == T_MEAN)
      for (int64_t i = 0; i < numel(out); i++) out->v[i] /= (double)cnt;
    return;
  }
  if (op == T_SOFTMAX) {
    const garr *x = &in[0];
    *out = *x;
    int dim = a->dim < 0 ? a->dim + x->ndim : a->dim;
    int64_t idx[DT_MAX_DIMS], st = 1;
    for (int d = x->ndim - 1; d > dim; d--) st *= x->sh[d];
    for (int64_t i = 0; i < numel(x); i++) {
      unflat(x, i, idx);
      int64_t base = i - idx[dim] * st;
      double mx = -INFINITY, z = 0;
      for (int64_t k = 0; k < x->sh[dim]; k++) mx = fmax(mx, x->v[base + k * st]);
      for (int64_t k = 0; k < x->sh[dim]; k++) z += exp(x->v[base + k * st] - mx);
      out->v[i] = exp(x->v[i] - mx) / z;
    }
    return;
  }
  int n = OPS[op].n_in;
  for (int j = 0; j < n; j++)
    if (in[j].ndim > out->ndim) out->ndim = in[j].ndim;
  for (int D = 0; D < out->ndim; D++) {
    out->sh[D] = 1;
    for (int j = 0; j < n; j++) {
      int d = D - (out->ndim - in[j].ndim);
      if (d >= 0 && in[j].sh[d] != 1) out->sh[D] = in[j].sh[d];
    }
  }
  int64_t idx[DT_MAX_DIMS];
  for (int64_t i = 0; i < numel(out); i++) {
    unflat(out, i, idx);
    double x = bget(&in[0], out->ndim, idx), y = n > 1 ? bget(&in[1], out->ndim, idx) : 0;
    double r = 0;
    switch (op) {
    case T_ADD: r = x + y; break;
    case T_SUB: r = x - y; break;
    case T_MUL: r = x * y; break;
    case T_SCALE: r = a->scalar * x; break;
    case T_SILU: r = x * sig(x); break;
    case T_SWIGLU: r = x * sig(x) * y; break;
    default: break;
    }
    out->v[i] = r;
  }
}

/* ---- per-rank helpers ---------------------------------------------------------------- */

typedef ot_rank rk;

static void pl_str(int m, const dt_placement *pl, char *buf, size_t n) { dt_placements_str(m, pl, buf, n); }

static void shape_str(const garr *g, char *buf, size_t n) { ot_shape_str(g->ndim, g->sh, buf, n); }

static dt_status make(rk *R, const garr *g, const dt_placement *pl, dt_tensor *t) {
  return ot_make(R, DT_F64, g->ndim, g->sh, g->v, pl, t);
}

/* dt_tensor_full(t) == want within tol (relative, floor 1). Returns false on a mismatch. */
static bool check_full(rk *R, const char *what, const dt_tensor *t, const garr *want, double tol) {
  return ot_check_vals(R, what, t, want->ndim, want->sh, want->v, tol);
}

typedef struct call_res {
  dt_placement out_pl[DT_MAX_MESH_DIMS];
  size_t comms;
  int coll[8]; /* the first ledger rows' dt_coll */
  bool ok;
} call_res;

/* Runs op on the globals `in` placed at pl[j], checks the values against the
 * reference, reports placements and ledger rows of the call. */
static void run_case(rk *R, top op, const dt_op_attrs *a, const garr *in, dt_placement pl[][DT_MAX_MESH_DIMS],
                     call_res *res) {
  dt_ctx *ctx = R->ctx;
  int n = OPS[op].n_in;
  char what[256];
  size_t k = (size_t)snprintf(what, sizeof what, "%s on mesh %s", OPS[op].name, R->mlabel);
  for (int j = 0; j < n; j++) {
    char ps[64], ss[64];
    pl_str(R->m, pl[j], ps, sizeof ps);
    shape_str(&in[j], ss, sizeof ss);
    k += (size_t)snprintf(what + k, sizeof what - k, "%s %s(%s)", j ? "," : "", ss, ps);
  }
  if (op == T_SUM || op == T_MEAN) {
    k += (size_t)snprintf(what + k, sizeof what - k, " dims{");
    for (int d = 0; d < a->ndims; d++) k += (size_t)snprintf(what + k, sizeof what - k, "%s%d", d ? "," : "", a->dims[d]);
    snprintf(what + k, sizeof what - k, "} keepdim %d", a->keepdim);
  } else if (op == T_SOFTMAX) {
    snprintf(what + k, sizeof what - k, " dim %d", a->dim);
  } else if (op == T_SCALE) {
    snprintf(what + k, sizeof what - k, " scalar %g", a->scalar);
  }
  memset(res, 0, sizeof *res);
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
  res->comms = dt_ledger_of(ctx)->n - before;
  for (size_t r = 0; r < res->comms && r < 8; r++) res->coll[r] = dt_ledger_of(ctx)->rows[before + r].op;
  if (s != DT_OK) {
    tu_fail(__FILE__, __LINE__, "%s, rank %d: dt_op_call -> %s: %s", what, ctx->rank,
            dt_status_str(s), dt_last_error(ctx));
    goto done;
  }
  for (int i = 0; i < R->m; i++) res->out_pl[i] = out.pl[i];
  garr want;
  ref(op, a, in, &want);
  res->ok = check_full(R, what, &out, &want, OPS[op].tol);
  dt_tensor_free(ctx, &out);
  R->cases++;
done:
  for (int j = 0; j < made; j++) dt_tensor_free(ctx, &t[j]);
}

/* placement list of a rank-r tensor: R, S(0..r-1), P(sum) [, P(avg), P(max)] */
static int pl_set(int r, bool more, dt_placement *out) {
  int n = 0;
  out[n++] = dt_replicate();
  for (int d = 0; d < r; d++) out[n++] = dt_shard(d);
  out[n++] = dt_partial(DT_RED_SUM);
  if (more) {
    out[n++] = dt_partial(DT_RED_AVG);
    out[n++] = dt_partial(DT_RED_MAX);
  }
  return n;
}

/* all placement lists over the mesh for a rank-r tensor: returns the count */
static int pl_lists(const rk *R, int r, bool more, dt_placement lists[][DT_MAX_MESH_DIMS], int max) {
  dt_placement one[DT_MAX_DIMS + 4];
  int k = pl_set(r, more, one), total = 1;
  for (int i = 0; i < R->m; i++) total *= k;
  if (total > max) total = max;
  for (int c = 0; c < total; c++)
    for (int i = R->m - 1, e = c; i >= 0; i--) {
      lists[c][i] = one[e % k];
      e /= k;
    }
  return total;
}

enum { MAXL = 64 };

/* (a): every op on every placement combination */
static void sweep(rk *R) {
  bool more = R->m == 1;
  static const struct { int na, nb; int64_t a[3], b[3]; } PAIRS[] = {
      {2, 2, {7, 3}, {7, 3}}, {3, 1, {2, 5, 4}, {4}}, {2, 1, {6, 1}, {5}}, {1, 2, {4}, {3, 4}},
  };
  dt_placement la[MAXL][DT_MAX_MESH_DIMS], lb[MAXL][DT_MAX_MESH_DIMS];
  dt_op_attrs a;
  call_res res;
  for (size_t p = 0; p < sizeof PAIRS / sizeof PAIRS[0]; p++) {
    garr in[2];
    gfill(&in[0], PAIRS[p].na, PAIRS[p].a, 1);
    gfill(&in[1], PAIRS[p].nb, PAIRS[p].b, 2);
    int nla = pl_lists(R, in[0].ndim, more, la, MAXL), nlb = pl_lists(R, in[1].ndim, more, lb, MAXL);
    for (int x = 0; x < nla; x++)
      for (int y = 0; y < nlb; y++) {
        dt_placement pl[2][DT_MAX_MESH_DIMS];
        memcpy(pl[0], la[x], sizeof pl[0]);
        memcpy(pl[1], lb[y], sizeof pl[1]);
        memset(&a, 0, sizeof a);
        for (top op = T_ADD; op <= T_SWIGLU; op++) {
          if (OPS[op].n_in != 2) continue;
          if (op == T_SWIGLU && p != 0) continue; /* swiglu takes equal shapes */
          run_case(R, op, &a, in, pl, &res);
        }
      }
    /* unary ops on the first operand of each pair */
    for (int x = 0; x < nla; x++) {
      dt_placement pl[1][DT_MAX_MESH_DIMS];
      memcpy(pl[0], la[x], sizeof pl[0]);
      memset(&a, 0, sizeof a);
      a.scalar = 2.0;
      run_case(R, T_SCALE, &a, in, pl, &res);
      a.scalar = -0.75;
      run_case(R, T_SCALE, &a, in, pl, &res);
      memset(&a, 0, sizeof a);
      run_case(R, T_SILU, &a, in, pl, &res);
      for (int d = 0; d < in[0].ndim; d++) {
        a.dim = d;
        run_case(R, T_SOFTMAX, &a, in, pl, &res);
      }
    }
  }
  /* reductions: an uneven, an even and a 3-d shape; several dim sets */
  static const struct { int n; int64_t s[3]; } RSH[] = {{2, {7, 3}}, {2, {8, 4}}, {3, {2, 5, 4}}};
  static const struct { int n; int d[2]; } DIMS[] = {{0, {0, 0}}, {1, {0, 0}}, {1, {1, 0}}, {2, {0, 1}}, {1, {-1, 0}}};
  for (size_t r = 0; r < sizeof RSH / sizeof RSH[0]; r++) {
    garr in[1];
    gfill(&in[0], RSH[r].n, RSH[r].s, 3);
    int nla = pl_lists(R, in[0].ndim, more, la, MAXL);
    for (int x = 0; x < nla; x++) {
      dt_placement pl[1][DT_MAX_MESH_DIMS];
      memcpy(pl[0], la[x], sizeof pl[0]);
      for (size_t k = 0; k < sizeof DIMS / sizeof DIMS[0]; k++)
        for (int kd = 0; kd < 2; kd++)
          for (top op = T_SUM; op <= T_MEAN; op++) {
            memset(&a, 0, sizeof a);
            a.ndims = DIMS[k].n;
            for (int d = 0; d < a.ndims; d++) a.dims[d] = DIMS[k].d[d];
            a.keepdim = kd;
            run_case(R, op, &a, in, pl, &res);
          }
    }
  }
}

/* ---- (b) oracles ------------------------------------------------------------------------ */

static void expect(rk *R, const char *name, const call_res *res, size_t comms, dt_placement want,
                   int coll) {
  char got[32], exp_[32];
  pl_str(1, res->out_pl, got, sizeof got);
  pl_str(1, &want, exp_, sizeof exp_);
  if (!res->ok) tu_fail(__FILE__, __LINE__, "oracle %s, rank %d: wrong values (above)", name, R->ctx->rank);
  if (res->comms != comms)
    tu_fail(__FILE__, __LINE__, "oracle %s, rank %d: %zu collectives, expected %zu", name, R->ctx->rank,
            res->comms, comms);
  else if (coll >= 0 && comms > 0 && res->coll[0] != coll)
    tu_fail(__FILE__, __LINE__, "oracle %s, rank %d: collective %s, expected %s", name, R->ctx->rank,
            dt_coll_name((dt_coll)res->coll[0]), dt_coll_name((dt_coll)coll));
  if (!dt_placement_eq(res->out_pl[0], want))
    tu_fail(__FILE__, __LINE__, "oracle %s, rank %d: output %s, expected %s", name, R->ctx->rank, got, exp_);
}

static void oracles(rk *R) {
  const dt_placement Ps = dt_partial(DT_RED_SUM), Pa = dt_partial(DT_RED_AVG),
                     Pm = dt_partial(DT_RED_MAX), Rp = dt_replicate(), S0 = dt_shard(0),
                     S1 = dt_shard(1);
  const int64_t sh[2] = {8, 4}, ush[2] = {7, 3};
  garr in[2];
  gfill(&in[0], 2, sh, 1);
  gfill(&in[1], 2, sh, 2);
  dt_op_attrs a;
  call_res res;
  dt_placement pl[2][DT_MAX_MESH_DIMS];
  memset(&a, 0, sizeof a);
#define SET(p0, p1) (pl[0][0] = (p0), pl[1][0] = (p1))
  SET(Ps, Ps);
  run_case(R, T_MUL, &a, in, pl, &res);
  expect(R, "P*P", &res, 1, Ps, DT_COLL_ALL_REDUCE);
  SET(Ps, Ps);
  run_case(R, T_ADD, &a, in, pl, &res);
  expect(R, "P+P", &res, 0, Ps, -1);
  run_case(R, T_SUB, &a, in, pl, &res);
  expect(R, "P-P", &res, 0, Ps, -1);
  SET(Ps, Rp);
  run_case(R, T_ADD, &a, in, pl, &res);
  expect(R, "P+R", &res, 0, Ps, -1);
  run_case(R, T_MUL, &a, in, pl, &res);
  expect(R, "P*R", &res, 0, Ps, -1);
  SET(Pm, Rp);
  run_case(R, T_MUL, &a, in, pl, &res);
  expect(R, "P(max)*R", &res, 1, Rp, DT_COLL_ALL_REDUCE);
  SET(Ps, Rp);
  a.scalar = 2.0;
  run_case(R, T_SCALE, &a, in, pl, &res);
  expect(R, "P(sum)*2.0", &res, 0, Ps, -1);
  SET(Pa, Rp);
  run_case(R, T_SCALE, &a, in, pl, &res);
  expect(R, "P(avg)*2.0", &res, 0, Pa, -1);
  memset(&a, 0, sizeof a);
  SET(Ps, Rp);
  run_case(R, T_SILU, &a, in, pl, &res);
  expect(R, "silu(P)", &res, 1, Rp, DT_COLL_ALL_REDUCE);
  /* reductions */
  a.ndims = 1;
  a.dims[0] = 0;
  SET(S0, Rp);
  run_case(R, T_SUM, &a, in, pl, &res);
  expect(R, "sum(S(0), dim 0)", &res, 0, Ps, -1);
  run_case(R, T_MEAN, &a, in, pl, &res);
  expect(R, "mean(S(0) even [8,4], dim 0)", &res, 0, Pa, -1);
  a.dims[0] = 1;
  run_case(R, T_MEAN, &a, in, pl, &res);
  expect(R, "mean(S(0), dim 1)", &res, 0, S0, -1);
  /* mean over an unevenly sharded dim: redistributed first, so the value is right */
  garr u;
  gfill(&u, 2, ush, 4);
  a.dims[0] = 0;
  run_case(R, T_MEAN, &a, &u, pl, &res);
  expect(R, "mean(S(0) uneven [7,3], dim 0)", &res, 1, Rp, DT_COLL_ALL_GATHER);
  /* ... where the naive Partial(avg) (average of the shard means) is wrong */
  double worst = 0;
  for (int64_t c = 0; c < ush[1]; c++) {
    double naive = 0, global = 0;
    for (int k = 0; k < 4; k++) {
      int64_t sz, off;
      dt_chunk(ush[0], 4, k, &sz, &off);
      double sm = 0;
      for (int64_t r = off; r < off + sz; r++) sm += u.v[r * ush[1] + c];
      naive += sz ? sm / (double)sz / 4.0 : 0;
      global += sm;
    }
    global /= (double)ush[0];
    worst = fmax(worst, fabs(naive - global));
  }
  /* 0.01: the data's values are multiples of 1/4, so a real difference is far larger */
  TU_CHECK(worst > 0.01, "rank %d: the naive P(avg) mean of uneven shards should differ from the "
                         "global mean (max difference %g)", R->ctx->rank, worst);
  /* softmax */
  memset(&a, 0, sizeof a);
  a.dim = 1;
  SET(S0, Rp);
  run_case(R, T_SOFTMAX, &a, in, pl, &res);
  expect(R, "softmax(S(0), dim 1)", &res, 0, S0, -1);
  a.dim = 0;
  run_case(R, T_SOFTMAX, &a, in, pl, &res);
  expect(R, "softmax(S(0), dim 0)", &res, 1, Rp, DT_COLL_ALL_GATHER);
  SET(S1, Rp);
  a.dim = -1;
  run_case(R, T_SOFTMAX, &a, in, pl, &res);
  expect(R, "softmax(S(1), dim -1)", &res, 1, Rp, DT_COLL_ALL_GATHER);
#undef SET
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
  char what[200];
  size_t k = (size_t)snprintf(what, sizeof what, "backward of %s on mesh %s", OPS[op].name, R->mlabel);
  for (int j = 0; j < n; j++) {
    char ps[64], ss[64];
    pl_str(R->m, pl[j], ps, sizeof ps);
    shape_str(&in[j], ss, sizeof ss);
    k += (size_t)snprintf(what + k, sizeof what - k, "%s %s(%s)", j ? "," : "", ss, ps);
  }
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
  static const struct { int na, nb; int64_t a[3], b[3]; } PAIRS[] = {
      {2, 2, {7, 3}, {7, 3}}, {3, 1, {2, 5, 4}, {4}}, {2, 2, {6, 1}, {1, 5}},
  };
  dt_placement set[4] = {dt_replicate(), dt_shard(0), dt_partial(DT_RED_SUM), dt_shard(1)};
  int nset = R->m == 1 && R->ms[0] > 1 ? 4 : 1;
  dt_op_attrs a;
  for (size_t p = 0; p < sizeof PAIRS / sizeof PAIRS[0]; p++) {
    garr in[2];
    gfill(&in[0], PAIRS[p].na, PAIRS[p].a, 1);
    gfill(&in[1], PAIRS[p].nb, PAIRS[p].b, 2);
    for (int x = 0; x < nset; x++)
      for (int y = 0; y < nset; y++) {
        dt_placement pl[2][DT_MAX_MESH_DIMS];
        memset(pl, 0, sizeof pl);
        pl[0][0] = set[x];
        pl[1][0] = set[y];
        if (pl[1][0].kind == DT_PL_SHARD && pl[1][0].dim >= in[1].ndim) continue;
        memset(&a, 0, sizeof a);
        for (top op = T_ADD; op <= T_SWIGLU; op++) {
          if (OPS[op].n_in == 1 && y > 0) continue;
          if (op == T_SWIGLU && p != 0) continue;
          a.scalar = op == T_SCALE ? -1.5 : 0.0;
          grad_case(R, op, &a, in, pl);
        }
        if (y > 0) continue;
        memset(&a, 0, sizeof a);
        a.dim = 1;
        grad_case(R, T_SOFTMAX, &a, in, pl);
        a.dim = 0;
        grad_case(R, T_SOFTMAX, &a, in, pl);
        for (top op = T_SUM; op <= T_MEAN; op++)
          for (int kd = 0; kd < 2; kd++) {
            memset(&a, 0, sizeof a);
            a.keepdim = kd;
            grad_case(R, op, &a, in, pl); /* all dims */
            a.ndims = 1;
            a.dims[0] = 0;
            grad_case(R, op, &a, in, pl);
            a.dims[0] = -1;
            grad_case(R, op, &a, in, pl);
          }
      }
  }
}

/* ---- f32 kernels: a few ops on S(0) / R inputs --------------------------------------------- */

/* f32 tolerance: inputs are exact in f32; each op rounds a handful of times (sums of
 * <= 40 terms, exp) at eps 6e-8, so 1e-5 relative (floor 1) is ample and still
 * catches any indexing or strategy error (those are O(0.1)). */
static const double F32_TOL = 1e-5;

static void f32_checks(rk *R) {
  dt_ctx *ctx = R->ctx;
  static const int64_t sa[3] = {2, 5, 4}, sb[1] = {4};
  garr in[2];
  gfill(&in[0], 3, sa, 1);
  gfill(&in[1], 1, sb, 2);
  float fa[MAXN], fb[MAXN];
  for (int64_t i = 0; i < numel(&in[0]); i++) fa[i] = (float)in[0].v[i];
  for (int64_t i = 0; i < numel(&in[1]); i++) fb[i] = (float)in[1].v[i];
  static const top ops[] = {T_ADD, T_MUL, T_SWIGLU, T_SILU, T_SCALE, T_SUM, T_MEAN, T_SOFTMAX};
  for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
    top op = ops[k];
    garr b2 = in[0];
    const garr *gi[2] = {&in[0], op == T_SWIGLU ? &b2 : &in[1]};
    float *fi[2] = {fa, op == T_SWIGLU ? fa : fb};
    dt_op_attrs a;
    memset(&a, 0, sizeof a);
    a.scalar = 0.5;
    a.dim = 2;
    a.ndims = op == T_SUM || op == T_MEAN ? 1 : 0;
    a.dims[0] = 0;
    dt_tensor t[2], out;
    int made = 0;
    dt_status s = DT_OK;
    for (int j = 0; j < OPS[op].n_in; j++) {
      dt_array arr;
      dt_placement pl[DT_MAX_MESH_DIMS] = {j == 0 ? dt_shard(1) : dt_replicate()};
      DT_CHECK_GOTO(dt_array_wrap(ctx, DT_DEV_CPU, DT_F32, gi[j]->ndim, gi[j]->sh, fi[j], &arr), s, fail);
      DT_CHECK_GOTO(dt_tensor_distribute(ctx, R->mesh, &arr, pl, &t[j]), s, fail);
      made++;
    }
    const dt_tensor *ip[2] = {&t[0], &t[1]};
    dt_tensor *o[1] = {&out};
    DT_CHECK_GOTO(dt_op_call(ctx, OPS[op].op, &a, ip, o, NULL), s, fail);
    garr want, in2[2] = {*gi[0], *gi[1]};
    ref(op, &a, in2, &want);
    char what[96];
    snprintf(what, sizeof what, "f32 %s on mesh %s, [2,5,4](S(1))", OPS[op].name, R->mlabel);
    ot_check_vals_dt(R, what, &out, DT_F32, want.ndim, want.sh, want.v, F32_TOL);
    R->cases++;
    dt_tensor_free(ctx, &out);
  fail:
    if (s != DT_OK)
      tu_fail(__FILE__, __LINE__, "f32 %s on mesh %s, rank %d: %s: %s", OPS[op].name, R->mlabel,
              ctx->rank, dt_status_str(s), dt_last_error(ctx));
    for (int j = 0; j < made; j++) dt_tensor_free(ctx, &t[j]);
  }
}

/* f32 silu / swiglu and swiglu's fused backward on a wide range of inputs
 * (a from -100 to 100: exp(-a) overflows and underflows in f32, the vector exp
 * must clamp to inf / 0 and the results still be silu's limits), sharded S(1),
 * against the formulas in double. da, db: g b s (1 + a (1 - s)), g a s with
 * s = sigmoid(a). Tolerance F32_TOL as above (a few roundings of eps). */
static void f32_wide(rk *R) {
  dt_ctx *ctx = R->ctx;
  enum { N = 63 };
  const int64_t sh[2] = {3, 21}; /* S(1) on 4 ranks: local 18, 15, 15, 15: 4-lane tails of 2 and 3 */
  float fa[N], fb[N], fg[N];
  for (int i = 0; i < N; i++) {
    fa[i] = i % 2 ? (float)(-100.0 + 200.0 * i / (N - 1)) : (float)(0.37 * (i - 32) / 4.0);
    fb[i] = (float)cos(0.7 * i);
    fg[i] = (float)sin(0.3 * i + 0.2);
  }
  dt_placement pl[DT_MAX_MESH_DIMS];
  memset(pl, 0, sizeof pl);
  for (int i = 0; i < R->m; i++) pl[i] = i == 0 ? dt_shard(1) : dt_replicate();
  dt_tensor A, B, G, y[2], d[2];
  dt_status s = ot_make(R, DT_F32, 2, sh, fa, pl, &A);
  if (s == DT_OK) s = ot_make(R, DT_F32, 2, sh, fb, pl, &B);
  if (s == DT_OK) s = ot_make(R, DT_F32, 2, sh, fg, pl, &G);
  if (s != DT_OK) {
    tu_fail(__FILE__, __LINE__, "f32 wide, rank %d: inputs: %s", ctx->rank, dt_last_error(ctx));
    return;
  }
  dt_op_attrs at;
  memset(&at, 0, sizeof at);
  const dt_tensor *i1[1] = {&A}, *i2[2] = {&A, &B}, *go[1] = {&G};
  dt_tensor *o1[1] = {&y[0]}, *o2[1] = {&y[1]}, *gi[2] = {&d[0], &d[1]};
  s = dt_op_call(ctx, &dt_op_silu, &at, i1, o1, NULL);
  if (s == DT_OK) s = dt_op_call(ctx, &dt_op_swiglu, &at, i2, o2, NULL);
  if (s == DT_OK) s = dt_op_swiglu.backward(ctx, &at, i2, (const dt_tensor *const *)o2, go, gi);
  if (s != DT_OK) {
    tu_fail(__FILE__, __LINE__, "f32 wide, rank %d: %s", ctx->rank, dt_last_error(ctx));
  } else {
    static const char *const NM[4] = {"silu", "swiglu", "swiglu da", "swiglu db"};
    const dt_tensor *got[4] = {&y[0], &y[1], &d[0], &d[1]};
    for (int k = 0; k < 4; k++) {
      double want[N];
      for (int i = 0; i < N; i++) {
        double av = fa[i], sg = 1.0 / (1.0 + exp(-av));
        want[i] = k == 0 ? av * sg : k == 1 ? av * sg * fb[i] : k == 2 ? fg[i] * fb[i] * sg * (1 + av * (1 - sg))
                                                                        : fg[i] * av * sg;
      }
      char what[64];
      snprintf(what, sizeof what, "f32 %s, a in [-100, 100]", NM[k]);
      ot_check_vals_dt(R, what, got[k], DT_F32, 2, sh, want, F32_TOL);
    }
    for (int k = 0; k < 2; k++) {
      dt_tensor_free(ctx, &y[k]);
      dt_tensor_free(ctx, &d[k]);
    }
  }
  dt_tensor_free(ctx, &A);
  dt_tensor_free(ctx, &B);
  dt_tensor_free(ctx, &G);
  R->cases++;
}

/* (d) vmath.h's f32 primitives against libm in double. exp: over 2^20 points
 * of [ln FLT_MIN, ln FLT_MAX] the relative error stays within 4 f32 ulps
 * (4.8e-7; it measures 2.5e-7, and the r^5 coefficient off by 1% already
 * gives 7.3e-7), and the edges: -inf, -1000 and -87.5 give 0, 89 and +inf give +inf,
 * NaN stays NaN, 0 gives exactly 1; every length 0..9 (the 4-wide body and
 * the tail) with a shift. sum, dot, max: against naive double loops. */
static void vmath_checks(void) {
  enum { NP = 1 << 20 };
  float *x = malloc(NP * sizeof *x), *y = malloc(NP * sizeof *y);
  if (!x || !y) {
    tu_fail(__FILE__, __LINE__, "vmath: out of memory");
    free(x);
    free(y);
    return;
  }
  const double lo = -87.33, hi = 88.72;
  for (int i = 0; i < NP; i++) x[i] = (float)(lo + (hi - lo) * i / (NP - 1));
  dt_vexp_f32(y, x, 0.0f, NP);
  double worst = 0;
  int at = 0;
  for (int i = 0; i < NP; i++) {
    double e = exp((double)x[i]), r = fabs((double)y[i] - e) / e;
    if (r > worst) worst = r, at = i;
  }
  TU_CHECK(worst <= 4.8e-7, "vmath exp: relative error %.3g at x = %.9g (limit 4 ulps, 4.8e-7)", worst,
           (double)x[at]);
  float sp[8] = {-INFINITY, -1000.0f, -87.5f, 89.0f, INFINITY, NAN, 0.0f, 1.0f};
  dt_vexp_f32(sp, sp, 0.0f, 8);
  TU_CHECK(sp[0] == 0 && sp[1] == 0 && sp[2] == 0, "vmath exp: underflow gives %g %g %g, expected 0",
           (double)sp[0], (double)sp[1], (double)sp[2]);
  TU_CHECK(isinf(sp[3]) && sp[3] > 0 && isinf(sp[4]) && sp[4] > 0, "vmath exp: overflow gives %g %g",
           (double)sp[3], (double)sp[4]);
  TU_CHECK(isnan(sp[5]) && sp[6] == 1.0f, "vmath exp: NaN -> %g, 0 -> %.9g", (double)sp[5], (double)sp[6]);
  for (int n = 0; n <= 9; n++) {
    float a[9], b[9];
    double sum = 0, dot = 0, mx = -INFINITY;
    for (int i = 0; i < 9; i++) {
      a[i] = (float)(0.25 * i - 1.0);
      b[i] = i < n ? a[i] : 123.0f; /* past n: must be left alone */
    }
    dt_vexp_f32(b, b, 0.5f, n);
    for (int i = 0; i < 9; i++) {
      double want = i < n ? exp((double)a[i] - 0.5) : 123.0;
      TU_CHECK(fabs(b[i] - want) <= 4.8e-7 * want, "vmath exp n=%d: element %d is %.9g, expected %.9g", n, i,
               (double)b[i], want);
    }
    for (int i = 0; i < n; i++) {
      sum += a[i];
      dot += (double)a[i] * b[i];
      mx = a[i] > mx ? a[i] : mx;
    }
    TU_CHECK(dt_sum_f32(a, n) == sum, "vmath sum n=%d: %.17g, expected %.17g", n, dt_sum_f32(a, n), sum);
    TU_CHECK(fabs(dt_dot_f32(a, b, n) - dot) <= 1e-15 * (1 + fabs(dot)), "vmath dot n=%d", n);
    if (n > 0) TU_CHECK(dt_max_f32(a, n) == (float)mx, "vmath max n=%d: %g, expected %g", n, (double)dt_max_f32(a, n), mx);
  }
  free(x);
  free(y);
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
  if (J->do_oracles) oracles(&R);
  if (J->do_grads) grads(&R);
  if (J->do_sweep) f32_checks(&R);
  if (J->do_sweep) f32_wide(&R);
  ot_rank_close(&R, mem0); /* every output, gradient and temporary of the ops was freed */
  if (ctx->rank == 0) J->cases = R.cases;
  return DT_OK;
}

int main(int argc, char **argv) {
  tu_opts o;
  tu_parse(argc, argv, &o);
  if (o.backend != DT_BACKEND_THREADS) {
    printf("SKIP: test_ops_pointwise runs on the threads backend only\n");
    return SB_SKIP;
  }
  dt_device_cpu_blas_threads(1);
  mesh_job jobs[] = {
      {"(4)", 1, {4}, true, true, true, 0},
      {"(2,2)", 2, {2, 2}, true, false, false, 0},
      {"(1)", 1, {1}, false, false, true, 0},
  };
  double t0 = dt_now();
  vmath_checks();
  for (size_t i = 0; i < sizeof jobs / sizeof jobs[0]; i++) {
    mesh_job *J = &jobs[i];
    double dt = ot_launch(o.backend, J->label, J->ndim, J->shape, body, J);
    printf("mesh %-6s %6ld cases %.2f s\n", J->label, J->cases, dt);
    /* a sweep that enumerates nothing must not pass on the other meshes' checks */
    TU_CHECK(J->cases > 0, "mesh %s ran no case", J->label);
  }
  printf("total %.2f s\n", dt_now() - t0);
  return tu_finish("test_ops_pointwise");
}
