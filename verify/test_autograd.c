/* verify/test_autograd.c: the DTensor autograd tape (lib/autograd) on real ranks.
 *
 * What it checks (threads backend, f64):
 *  (a) Gradients of a small graph (matmul, silu, mul with a value used twice,
 *      linear, softmax, add with the input used twice, scale, sum) on a 1-D mesh
 *      of 4 (two input layouts) and a 2x2 mesh: every leaf gets a gradient, and
 *      each, gathered with dt_tensor_full, equals the gradient of the same graph
 *      run unsharded (each rank replays it on a 1-rank mesh over a communicator
 *      of its own); the unsharded gradients equal central finite differences of
 *      the loss.
 *  (b) Partial gradient accumulation: x (R) feeding three column-sharded
 *      matmuls: 1 all_reduce for grad x by default (reduced once), 3 with the
 *      tape's eager_reduce (PyTorch's behaviour), counted in the ledger's
 *      "backward" rows.
 *  (c) Redistribute's backward, ledger rows per phase (forward / backward):
 *      S->R 1 AG / 0; R->S 0 / 1 AG; P->R 1 AR / 0; P->S 1 RS / 1 AG;
 *      S(a)->S(b) 1 A2A / 1 A2A; the gradient's placements and values (ones).
 *      The rule is PyTorch's Redistribute.backward
 *      (torch/distributed/tensor/_redistribute.py): the gradient goes back to
 *      the source placements, a Partial source becomes Replicate when the
 *      gradient is Shard or Replicate there; the counts are those of the
 *      *_forward_backward tests in test/distributed/tensor/test_redistribute.py.
 *  (d) No leaks: host bytes in use return to their start after dt_tape_free.
 *  (e) Every op of the registry (dt_op_all): it has a backward and a case here
 *      (an op added without either fails), run through the tape on both meshes
 *      with sharded inputs and a random output gradient; every input's gathered
 *      gradient equals central finite differences of sum(out * G) computed
 *      unsharded. An input that cannot have a gradient (integer indices of
 *      embedding and cross_entropy) says why, and the test asserts none is made.
 * What it is not: a test of the ops' forward values or sharding choices
 * (test_ops_*), or of redistribute itself (test_redistribute).
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optest.h"

enum { B = 8, D = 6, H = 8 }; /* x [B, D], W1 [D, H], W2 [D, H] (linear: [out, in]) */
enum { NLEAF = 3 };

/* Sharded vs unsharded gradients: the same f64 arithmetic in another order
 * (sharded contractions sum partial products per rank, then all_reduce). Each
 * value is a sum of at most a few dozen O(1) terms, so the difference is at
 * most a few dozen ulps of the largest term (~5e-15; measured: 9e-17). 1e-14
 * covers that bound and still catches any wrong term (errors of a missing or
 * doubled term are O(0.01) or more). */
static const double TOL_SHARD = 1e-14;
/* Finite differences, central, step h = 1e-5: the truncation error is
 * h^2/6 |f'''| ~ 2e-11 |f'''| for these O(1) smooth functions, and rounding is
 * eps |L| / h ~ 2e-16 * 10 / 1e-5 = 2e-10 (|L| < 10 here). The worst error
 * measured, over the graph of (a) and every op of (e), is 1.1e-10; 1e-8
 * (absolute + relative) leaves a factor 100 for other compilers and BLAS
 * orderings and is far below a wrong gradient (a backward off by 0.1% misses
 * by about 1e-4). */
static const double FD_H = 1e-5;
static const double TOL_FD = 1e-8;

/* ---- the graph -------------------------------------------------------------------- */

typedef struct graph_out {
  double loss;
  bool has_grad[NLEAF];
  dt_array grad[NLEAF]; /* full gradients (owned, when has_grad) */
} graph_out;

static void graph_out_free(dt_ctx *ctx, graph_out *g) {
  for (int i = 0; i < NLEAF; i++)
    if (g->has_grad[i]) dt_array_free(ctx, &g->grad[i]);
  memset(g, 0, sizeof *g);
}

static dt_status op1(dt_tape *t, const dt_op *op, const dt_op_attrs *a, dt_var *x, dt_var **y) {
  dt_var *in[1] = {x};
  return dt_ad_op(t, op, a, in, y);
}
static dt_status op2(dt_tape *t, const dt_op *op, const dt_op_attrs *a, dt_var *x, dt_var *w,
                     dt_var **y) {
  dt_var *in[2] = {x, w};
  return dt_ad_op(t, op, a, in, y);
}

/* Sum of every element of a (host f64). */
static double host_sum(const dt_array *a) {
  double s = 0;
  for (int64_t i = 0; i < a->numel; i++) s += ((const double *)a->data)[i];
  return s;
}

/* Runs the graph on `mesh` with leaves distributed from the host globals G[]
 * with placements pl[]:
 *   h = x @ W1; a = silu(h); g = a * h; z = linear(g, W2); s = softmax(z, 1);
 *   u = s + x; v = 0.5 * u; w = v * v; loss = sum(w)
 * Loss = full(loss) read on the host. With grads, backpropagates and gathers
 * each leaf's gradient. */
static dt_status run_graph(dt_ctx *ctx, dt_mesh *mesh, const dt_array *G,
                           const dt_placement (*pl)[DT_MAX_MESH_DIMS], bool grads,
                           graph_out *out) {
  memset(out, 0, sizeof *out);
  size_t base = ctx->mem.host_cur;
  dt_tape *t = NULL;
  DT_CHECK(dt_tape_create(ctx, NULL, &t));
  dt_status s = DT_OK;
  dt_var *leaf[NLEAF] = {NULL};
  for (int i = 0; i < NLEAF && s == DT_OK; i++) {
    dt_tensor v;
    s = dt_tensor_distribute(ctx, mesh, &G[i], pl[i], &v);
    if (s == DT_OK) {
      leaf[i] = dt_var_leaf(t, &v, true);
      if (!leaf[i]) s = DT_ERR_NOMEM;
    }
  }
  dt_var *cur = leaf[0], *h = NULL, *nx = NULL;
  dt_op_attrs a = DT_OP_ATTRS_INIT;
  if (s == DT_OK) s = op2(t, &dt_op_matmul, NULL, cur, leaf[1], &cur);
  h = cur;
  if (s == DT_OK) s = op1(t, &dt_op_silu, NULL, h, &cur);
  if (s == DT_OK) s = op2(t, &dt_op_mul, NULL, cur, h, &cur);
  if (s == DT_OK) s = op2(t, &dt_op_linear, NULL, cur, leaf[2], &cur);
  if (s == DT_OK) {
    a.dim = 1;
    s = op1(t, &dt_op_softmax, &a, cur, &cur);
    memset(&a, 0, sizeof a);
  }
  if (s == DT_OK) s = op2(t, &dt_op_add, NULL, cur, leaf[0], &cur);
  if (s == DT_OK) {
    a.scalar = 0.5;
    s = op1(t, &dt_op_scale, &a, cur, &cur);
    memset(&a, 0, sizeof a);
  }
  if (s == DT_OK) s = op2(t, &dt_op_mul, NULL, cur, cur, &cur);
  if (s == DT_OK) s = op1(t, &dt_op_sum, NULL, cur, &cur);
  nx = cur;
  if (s == DT_OK) {
    dt_array full;
    s = dt_tensor_full(ctx, dt_var_value(nx), &full);
    if (s == DT_OK) {
      out->loss = host_sum(&full);
      dt_array_free(ctx, &full);
    }
  }
  if (s == DT_OK && grads) {
    s = dt_backward(t, nx, NULL);
    for (int i = 0; i < NLEAF && s == DT_OK; i++) {
      if (!dt_var_grad(leaf[i])) continue;
      s = dt_tensor_full(ctx, dt_var_grad(leaf[i]), &out->grad[i]);
      if (s == DT_OK) out->has_grad[i] = true;
    }
  }
  dt_tape_free(t);
  size_t kept = 0;
  for (int i = 0; i < NLEAF; i++)
    if (out->has_grad[i]) kept += dt_array_bytes(&out->grad[i]);
  TU_CHECK(ctx->mem.host_cur == base + kept,
           "rank %d: host bytes in use %zu after dt_tape_free, want %zu (leak)", ctx->rank,
           ctx->mem.host_cur, base + kept);
  if (s != DT_OK) graph_out_free(ctx, out);
  return s;
}

/* ---- ledger counting -------------------------------------------------------------- */

static int count_rows(const dt_ctx *ctx, size_t from, int coll, const char *phase) {
  int n = 0;
  for (size_t i = from; i < dt_ledger_of(ctx)->n; i++)
    if (dt_ledger_of(ctx)->rows[i].op == coll && !strcmp(dt_ledger_of(ctx)->rows[i].phase, phase)) n++;
  return n;
}
static int count_all(const dt_ctx *ctx, size_t from, const char *phase) {
  int n = 0;
  for (size_t i = from; i < dt_ledger_of(ctx)->n; i++)
    if (!strcmp(dt_ledger_of(ctx)->rows[i].phase, phase) && dt_ledger_of(ctx)->rows[i].op != DT_COLL_BARRIER)
      n++;
  return n;
}

/* ---- the job ------------------------------------------------------------------------ */

typedef struct job {
  int mesh_ndim;
  int shape[2];
  const char *label;
  bool fd;        /* also run finite differences (rank 0, unsharded) */
  bool ledger;    /* also run (b) and (c) (1-D mesh) */
} job;

static void fill_globals(dt_ctx *ctx, dt_array *G) {
  const int64_t sx[2] = {B, D}, s1[2] = {D, H}, s2[2] = {D, H};
  const int64_t *sh[NLEAF] = {sx, s1, s2};
  for (int i = 0; i < NLEAF; i++) {
    TU_OK(ctx, dt_array_create(ctx, DT_DEV_CPU, DT_F64, 2, sh[i], &G[i]));
    /* N(0, 0.5^2): O(1) activations, so silu and softmax are well inside their
     * smooth, non-saturated range */
    TU_OK(ctx, dt_rng_fill(DT_F64, G[i].data, G[i].numel, 1234, (uint64_t)i + 1, 0, 1,
                           DT_RNG_NORMAL, 0.0, 0.5));
  }
}

static void compare_grads(dt_ctx *ctx, const char *what, const graph_out *got,
                          const graph_out *ref, double tol) {
  TU_CHECK(fabs(got->loss - ref->loss) <= tol * (1 + fabs(ref->loss)),
           "%s rank %d: loss %.17g, unsharded %.17g", what, ctx->rank, got->loss, ref->loss);
  for (int i = 0; i < NLEAF; i++) {
    TU_CHECK(got->has_grad[i] == ref->has_grad[i], "%s rank %d: leaf %d has grad %d, unsharded %d",
             what, ctx->rank, i, got->has_grad[i], ref->has_grad[i]);
    if (!got->has_grad[i] || !ref->has_grad[i]) continue;
    TU_CHECK(got->grad[i].numel == ref->grad[i].numel, "%s: leaf %d numel", what, i);
    double worst = 0;
    int64_t at = -1;
    for (int64_t k = 0; k < got->grad[i].numel && k < ref->grad[i].numel; k++) {
      double g = ((double *)got->grad[i].data)[k], r = ((double *)ref->grad[i].data)[k];
      double e = fabs(g - r) / (1 + fabs(r));
      if (!(e <= worst)) { /* NaN-safe: a NaN becomes the worst */
        worst = isnan(e) ? INFINITY : e;
        at = k;
      }
    }
    TU_CHECK(worst <= tol, "%s rank %d: leaf %d grad differs at %lld by %.3g (tol %.1g)", what,
             ctx->rank, i, (long long)at, worst, tol);
  }
}

/* (a) for one layout. */
static void check_graph(dt_ctx *ctx, dt_mesh *mesh, dt_mesh *solo, const dt_array *G,
                        const dt_placement (*pl)[DT_MAX_MESH_DIMS], const char *what) {
  graph_out got, ref;
  dt_placement rpl[NLEAF][DT_MAX_MESH_DIMS];
  for (int i = 0; i < NLEAF; i++) rpl[i][0] = dt_replicate();
  TU_OK(ctx, run_graph(ctx, mesh, G, pl, true, &got));
  TU_OK(ctx, run_graph(ctx, solo, G, (const dt_placement(*)[DT_MAX_MESH_DIMS])rpl, true, &ref));
  compare_grads(ctx, what, &got, &ref, TOL_SHARD);
  /* x, W1 and W2 all reach the loss */
  int n = 0;
  for (int i = 0; i < NLEAF; i++) n += got.has_grad[i];
  TU_CHECK(n == NLEAF, "%s: %d of %d leaves got a gradient", what, n, NLEAF);
  graph_out_free(ctx, &got);
  graph_out_free(ctx, &ref);
}

/* (a) finite differences on the unsharded graph. */
static void check_fd(dt_ctx *ctx, dt_mesh *solo, dt_array *G) {
  dt_placement rpl[NLEAF][DT_MAX_MESH_DIMS];
  for (int i = 0; i < NLEAF; i++) rpl[i][0] = dt_replicate();
  const dt_placement(*pl)[DT_MAX_MESH_DIMS] = (const dt_placement(*)[DT_MAX_MESH_DIMS])rpl;
  graph_out ref;
  TU_OK(ctx, run_graph(ctx, solo, G, pl, true, &ref));
  long checked = 0;
  for (int i = 0; i < NLEAF; i++) {
    TU_CHECK(ref.has_grad[i], "finite differences: leaf %d has no gradient", i);
    for (int64_t k = 0; k < G[i].numel; k++) {
      double *p = &((double *)G[i].data)[k], keep = *p;
      graph_out up, dn;
      *p = keep + FD_H;
      TU_OK(ctx, run_graph(ctx, solo, G, pl, false, &up));
      *p = keep - FD_H;
      TU_OK(ctx, run_graph(ctx, solo, G, pl, false, &dn));
      *p = keep;
      double fd = (up.loss - dn.loss) / (2 * FD_H);
      double an = ref.has_grad[i] ? ((double *)ref.grad[i].data)[k] : 0.0;
      TU_CHECK(fabs(fd - an) <= TOL_FD * (1 + fabs(fd)),
               "finite differences: leaf %d element %lld: analytic %.12g, numeric %.12g", i,
               (long long)k, an, fd);
      checked++;
    }
  }
  printf("  finite differences: %ld elements of %d leaves checked (loss %.6f)\n", checked, NLEAF,
         ref.loss);
  graph_out_free(ctx, &ref);
}

/* (c) redistribute forward/backward comm (see the file comment), and the gradient (ones). */
static void check_redist_backward(dt_ctx *ctx, dt_mesh *mesh) {
  struct rcase {
    const char *name;
    dt_placement src, dst, grad;  /* grad: the gradient's expected placement */
    int fwd_coll, bwd_coll;       /* -1: no comm */
  } cases[] = {
      {"S(0)->R", dt_shard(0), dt_replicate(), dt_shard(0), DT_COLL_ALL_GATHER, -1},
      {"R->S(0)", dt_replicate(), dt_shard(0), dt_replicate(), -1, DT_COLL_ALL_GATHER},
      {"P->R", dt_partial(DT_RED_SUM), dt_replicate(), dt_replicate(), DT_COLL_ALL_REDUCE, -1},
      {"P->S(0)", dt_partial(DT_RED_SUM), dt_shard(0), dt_replicate(), DT_COLL_REDUCE_SCATTER,
       DT_COLL_ALL_GATHER},
      {"S(0)->S(1)", dt_shard(0), dt_shard(1), dt_shard(0), DT_COLL_ALL_TO_ALL,
       DT_COLL_ALL_TO_ALL},
  };
  const int64_t gs[2] = {8, 4};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const struct rcase *rc = &cases[c];
    size_t base = ctx->mem.host_cur;
    dt_tape *t = NULL;
    TU_OK(ctx, dt_tape_create(ctx, NULL, &t));
    if (!t) return;
    dt_tensor xv;
    dt_placement src[1] = {rc->src}, dst[1] = {rc->dst};
    TU_OK(ctx, dt_tensor_rand(ctx, mesh, 2, gs, DT_F64, src, 7, 1, DT_RNG_NORMAL, 0, 1, &xv));
    dt_var *x = dt_var_leaf(t, &xv, true), *y = NULL;
    size_t row0 = dt_ledger_of(ctx)->n;
    dt_ctx_set_phase(ctx, "forward");
    TU_OK(ctx, dt_ad_redistribute(t, x, dst, &y));
    dt_ctx_set_phase(ctx, "");
    int nf = count_all(ctx, row0, "forward");
    int want_f = rc->fwd_coll < 0 ? 0 : 1;
    TU_CHECK(nf == want_f && (want_f == 0 || count_rows(ctx, row0, rc->fwd_coll, "forward") == 1),
             "redistribute %s: forward %d collectives, want %d of kind %d", rc->name, nf, want_f,
             rc->fwd_coll);
    size_t row1 = dt_ledger_of(ctx)->n;
    if (y) TU_OK(ctx, dt_backward(t, y, NULL));
    TU_CHECK(!strcmp(ctx->phase, ""), "phase not restored after dt_backward: '%s'", ctx->phase);
    int nb = count_all(ctx, row1, "backward");
    int want_b = rc->bwd_coll < 0 ? 0 : 1;
    TU_CHECK(nb == want_b && (want_b == 0 || count_rows(ctx, row1, rc->bwd_coll, "backward") == 1),
             "redistribute %s: backward %d collectives, want %d of kind %d", rc->name, nb, want_b,
             rc->bwd_coll);
    TU_CHECK(count_all(ctx, row1, "forward") == 0 && count_all(ctx, row1, "") == 0,
             "redistribute %s: backward rows not labelled backward", rc->name);
    const dt_tensor *g = dt_var_grad(x);
    TU_CHECK(g != NULL, "redistribute %s: no gradient", rc->name);
    if (g) {
      TU_CHECK(dt_placement_eq(g->pl[0], rc->grad), "redistribute %s: gradient placement %d/%d",
               rc->name, g->pl[0].kind, g->pl[0].dim);
      dt_array full;
      TU_OK(ctx, dt_tensor_full(ctx, g, &full));
      bool ones = full.numel == gs[0] * gs[1];
      for (int64_t k = 0; ones && k < full.numel; k++) ones = ((double *)full.data)[k] == 1.0;
      TU_CHECK(ones, "redistribute %s: gradient is not all ones", rc->name);
      dt_array_free(ctx, &full);
    }
    dt_tape_free(t);
    TU_CHECK(ctx->mem.host_cur == base, "redistribute %s: leak of %lld bytes", rc->name,
             (long long)ctx->mem.host_cur - (long long)base);
  }
}

/* (b) x (R, [B, D]) feeding three column-sharded matmuls y_i = x @ W_i, W_i
 * S(1) [D, H], so y_i is S(1); loss = sum(y_1) + sum(y_2) + sum(y_3).
 * Derivation: each dy_i is ones (R or S(1)); dx_i = dy_i @ W_i^T contracts the
 * sharded H dim, so the cheapest strategy (dy_i chunked to S(1) at no cost,
 * W_i^T is S(0)) gives a Partial(sum) dx_i with no comm. Default: dx = dx_1 +
 * dx_2 + dx_3 by the add op keeps P + P as P (no comm), and reducing the grad
 * once (dt_var_grad_reduce) is 1 all_reduce. eager_reduce: each dx_i is
 * all_reduced before it is accumulated: 3, and the reduce finds no Partial: 0.
 * dW_i = x^T @ dy_i is S(1) with no comm either way. */
static void check_partial_accum(dt_ctx *ctx, dt_mesh *mesh) {
  const int64_t sx[2] = {B, D}, sw[2] = {D, H};
  int got[2] = {-1, -1};
  dt_array gx[2];
  memset(gx, 0, sizeof gx);
  for (int eager = 0; eager < 2; eager++) {
    dt_tape_opts o = {.eager_reduce = eager != 0};
    size_t base = ctx->mem.host_cur;
    dt_tape *t = NULL;
    TU_OK(ctx, dt_tape_create(ctx, &o, &t));
    if (!t) return;
    dt_placement r[1] = {dt_replicate()}, s1[1] = {dt_shard(1)};
    dt_tensor xv;
    TU_OK(ctx, dt_tensor_rand(ctx, mesh, 2, sx, DT_F64, r, 99, 1, DT_RNG_NORMAL, 0, 1, &xv));
    dt_var *x = dt_var_leaf(t, &xv, true), *acc = NULL;
    dt_var *w[3];
    for (int i = 0; i < 3; i++) {
      dt_tensor wv;
      TU_OK(ctx, dt_tensor_rand(ctx, mesh, 2, sw, DT_F64, s1, 99, 2 + (uint64_t)i, DT_RNG_NORMAL,
                                0, 1, &wv));
      w[i] = dt_var_leaf(t, &wv, true);
      dt_var *y = NULL;
      TU_OK(ctx, op2(t, &dt_op_matmul, NULL, x, w[i], &y));
      if (y) TU_OK(ctx, op1(t, &dt_op_sum, NULL, y, &y));
      if (!y) break;
      if (!acc) acc = y;
      else TU_OK(ctx, op2(t, &dt_op_add, NULL, acc, y, &acc));
    }
    size_t row0 = dt_ledger_of(ctx)->n;
    if (acc) TU_OK(ctx, dt_backward(t, acc, NULL));
    int in_bw = count_rows(ctx, row0, DT_COLL_ALL_REDUCE, "backward");
    TU_CHECK(dt_var_grad(x) != NULL, "partial accumulation: no grad for x");
    bool partial = dt_var_grad(x) && dt_var_grad(x)->pl[0].kind == DT_PL_PARTIAL;
    size_t row1 = dt_ledger_of(ctx)->n;
    TU_OK(ctx, dt_var_grad_reduce(t, x));
    int in_red = count_rows(ctx, row1, DT_COLL_ALL_REDUCE, "backward");
    got[eager] = count_rows(ctx, row0, DT_COLL_ALL_REDUCE, "backward");
    if (ctx->rank == 0)
      printf("  partial accumulation, %s: %d all_reduce in dt_backward (grad x %s) + %d in "
             "dt_var_grad_reduce = %d (other backward collectives: %d)\n",
             eager ? "eager_reduce" : "default", in_bw, partial ? "Partial" : "not Partial",
             in_red, got[eager], count_all(ctx, row0, "backward") - got[eager]);
    if (dt_var_grad(x)) TU_OK(ctx, dt_tensor_full(ctx, dt_var_grad(x), &gx[eager]));
    dt_tape_free(t);
    TU_CHECK(ctx->mem.host_cur == base + dt_array_bytes(&gx[eager]),
             "partial accumulation: leak");
  }
  TU_CHECK(got[0] == 1, "partial accumulation (default): %d all_reduces for grad x, want 1", got[0]);
  TU_CHECK(got[1] == 3, "partial accumulation (eager_reduce): %d all_reduces, want 3", got[1]);
  /* Both modes give the same gradient, and it equals sum_i ones @ W_i^T
   * (row sums of each W_i, same for every row of x) up to summation order
   * (TOL_SHARD, as in (a)). */
  bool ok = gx[0].numel == B * D && gx[1].numel == B * D;
  double worst = 0;
  if (ok) {
    dt_array W;
    TU_OK(ctx, dt_array_create(ctx, DT_DEV_CPU, DT_F64, 2, sw, &W));
    double want[D] = {0};
    for (int i = 0; i < 3; i++) {
      TU_OK(ctx, dt_rng_fill(DT_F64, W.data, W.numel, 99, 2 + (uint64_t)i, 0, 1, DT_RNG_NORMAL, 0, 1));
      for (int d = 0; d < D; d++)
        for (int hh = 0; hh < H; hh++) want[d] += ((double *)W.data)[d * H + hh];
    }
    dt_array_free(ctx, &W);
    for (int e = 0; e < 2; e++)
      for (int64_t k = 0; k < B * D; k++) {
        double err = fabs(((double *)gx[e].data)[k] - want[k % D]) / (1 + fabs(want[k % D]));
        if (!(err <= worst)) worst = isnan(err) ? INFINITY : err; /* NaN fails the check */
      }
  }
  TU_CHECK(ok && worst <= TOL_SHARD, "partial accumulation: grad x wrong (worst %.3g)", worst);
  dt_array_free(ctx, &gx[0]);
  dt_array_free(ctx, &gx[1]);
}

/* ---- (e) every op of the registry through the tape ------------------------------- */

enum { MAXIN = 3, MAXEL = 64 };

/* One gradient case: an op on small inputs, each placed on the job's mesh at
 * pl (every mesh dim), with the attributes it reads. An input that cannot
 * have a gradient says why (nograd); the test asserts that none is made. */
typedef struct gcase {
  const dt_op *op;
  dt_op_attrs a;
  int n_in;
  int ndim[MAXIN];
  int64_t sh[MAXIN][4];
  dt_dtype dt[MAXIN];        /* DT_F64, or DT_I64 for indices (values (5 k + 3) mod imax) */
  int64_t imax[MAXIN];
  dt_placement pl[MAXIN];
  const char *nograd[MAXIN];
} gcase;

#define S0 {.kind = DT_PL_SHARD, .dim = 0}
#define S1 {.kind = DT_PL_SHARD, .dim = 1}
#define S2 {.kind = DT_PL_SHARD, .dim = 2}
#define RR {.kind = DT_PL_REPLICATE}
static const char IDS[] = "integer indices (i64): the op's backward makes no gradient for them";

/* Each op of lib/ops/ops.h with the attributes it documents there; shapes small
 * enough for finite differences, and shards that split real work (a sharded
 * contraction, a reduced dim, the vocab of cross-entropy, a sequence for rope). */
static const gcase GCASES[] = {
    {.op = &dt_op_einsum, .a = {.eq = "bmk,kn->bmn"}, .n_in = 2, .ndim = {3, 2},
     .sh = {{4, 3, 4}, {4, 5}}, .dt = {DT_F64, DT_F64}, .pl = {S0, RR}},
    {.op = &dt_op_matmul, .n_in = 2, .ndim = {2, 2}, .sh = {{5, 4}, {4, 6}}, .dt = {DT_F64, DT_F64},
     .pl = {S1, S0}},
    {.op = &dt_op_linear, .n_in = 2, .ndim = {3, 2}, .sh = {{2, 3, 4}, {6, 4}},
     .dt = {DT_F64, DT_F64}, .pl = {RR, S0}},
    {.op = &dt_op_add, .n_in = 2, .ndim = {2, 1}, .sh = {{4, 6}, {6}}, .dt = {DT_F64, DT_F64},
     .pl = {S0, RR}},
    {.op = &dt_op_sub, .n_in = 2, .ndim = {2, 2}, .sh = {{4, 6}, {4, 6}}, .dt = {DT_F64, DT_F64},
     .pl = {S1, RR}},
    {.op = &dt_op_mul, .n_in = 2, .ndim = {2, 2}, .sh = {{4, 6}, {4, 1}}, .dt = {DT_F64, DT_F64},
     .pl = {S0, RR}},
    {.op = &dt_op_scale, .a = {.scalar = 0.7}, .n_in = 1, .ndim = {2}, .sh = {{4, 6}},
     .dt = {DT_F64}, .pl = {S1}},
    /* cast to its own dtype: finite differences need f64 on both sides (the f32 and
     * bf16 roundings are the kernels' tests') */
    {.op = &dt_op_cast, .a = {.i0 = DT_F64}, .n_in = 1, .ndim = {2}, .sh = {{4, 6}},
     .dt = {DT_F64}, .pl = {S1}},
    {.op = &dt_op_silu, .n_in = 1, .ndim = {2}, .sh = {{4, 6}}, .dt = {DT_F64}, .pl = {S0}},
    {.op = &dt_op_swiglu, .n_in = 2, .ndim = {2, 2}, .sh = {{4, 6}, {4, 6}}, .dt = {DT_F64, DT_F64},
     .pl = {S1, S1}},
    {.op = &dt_op_sum, .a = {.ndims = 1, .dims = {1}}, .n_in = 1, .ndim = {2}, .sh = {{4, 6}},
     .dt = {DT_F64}, .pl = {S1}},
    {.op = &dt_op_mean, .a = {.ndims = 1, .dims = {0}, .keepdim = true}, .n_in = 1, .ndim = {2},
     .sh = {{4, 6}}, .dt = {DT_F64}, .pl = {S0}},
    {.op = &dt_op_softmax, .a = {.dim = 1}, .n_in = 1, .ndim = {2}, .sh = {{4, 6}}, .dt = {DT_F64},
     .pl = {S0}},
    {.op = &dt_op_view, .a = {.shape_n = 3, .shape = {4, 2, 3}}, .n_in = 1, .ndim = {2},
     .sh = {{4, 6}}, .dt = {DT_F64}, .pl = {S0}},
    {.op = &dt_op_reshape, .a = {.shape_n = 1, .shape = {-1}}, .n_in = 1, .ndim = {2},
     .sh = {{4, 6}}, .dt = {DT_F64}, .pl = {S1}},
    {.op = &dt_op_transpose, .a = {.i0 = 0, .i1 = 1}, .n_in = 1, .ndim = {2}, .sh = {{4, 6}},
     .dt = {DT_F64}, .pl = {S0}},
    {.op = &dt_op_permute, .a = {.ndims = 3, .dims = {2, 0, 1}}, .n_in = 1, .ndim = {3},
     .sh = {{2, 3, 4}}, .dt = {DT_F64}, .pl = {S2}},
    {.op = &dt_op_rms_norm, .n_in = 2, .ndim = {2, 1}, .sh = {{4, 6}, {6}}, .dt = {DT_F64, DT_F64},
     .pl = {S0, RR}},
    {.op = &dt_op_rope, .n_in = 1, .ndim = {4}, .sh = {{1, 4, 2, 4}}, .dt = {DT_F64}, .pl = {S1}},
    {.op = &dt_op_sdpa, .n_in = 3, .ndim = {4, 4, 4},
     .sh = {{1, 2, 4, 4}, {1, 1, 4, 4}, {1, 1, 4, 4}}, .dt = {DT_F64, DT_F64, DT_F64},
     .pl = {S1, RR, RR}},
    /* context parallel over mesh dim 0, ring, head-tail order of 8 chunks
     * (layout [b, s, h, hd]: the sequence is dim 1) */
    {.op = &dt_op_sdpa_cp, .a = {.dim = 0, .i0 = 1, .i1 = 8, .i2 = DT_CP_RING}, .n_in = 3,
     .ndim = {4, 4, 4}, .sh = {{1, 8, 2, 4}, {1, 8, 1, 4}, {1, 8, 1, 4}},
     .dt = {DT_F64, DT_F64, DT_F64}, .pl = {S1, S1, S1}},
    {.op = &dt_op_embedding, .n_in = 2, .ndim = {2, 2}, .sh = {{10, 4}, {2, 3}},
     .dt = {DT_F64, DT_I64}, .imax = {0, 10}, .pl = {S0, RR}, .nograd = {NULL, IDS}},
    {.op = &dt_op_cross_entropy, .n_in = 2, .ndim = {2, 1}, .sh = {{6, 5}, {6}},
     .dt = {DT_F64, DT_I64}, .imax = {0, 5}, .pl = {S1, RR}, .nograd = {NULL, IDS}},
    {.op = &dt_op_log_softmax_nll, .n_in = 2, .ndim = {2, 1}, .sh = {{6, 5}, {6}},
     .dt = {DT_F64, DT_I64}, .imax = {0, 5}, .pl = {S1, RR}, .nograd = {NULL, IDS}},
};
#undef S0
#undef S1
#undef S2
#undef RR
enum { NGCASES = sizeof GCASES / sizeof GCASES[0] };

/* The case's host inputs and the output gradient G (f64, or i64 for indices). */
typedef struct gdata {
  const gcase *c;
  double v[MAXIN][MAXEL];
  int64_t iv[MAXIN][MAXEL];
  double g[MAXEL];
  dt_ctx *ctx;
  dt_mesh *solo;
  bool failed;   /* a reference forward failed (reported once) */
} gdata;

/* Distributes input j of the case from the host over mesh, at pl on every mesh dim. */
static dt_status make_input(dt_ctx *ctx, dt_mesh *mesh, const gdata *gd, int j, dt_tensor *t) {
  const gcase *c = gd->c;
  dt_array arr;
  const void *p = c->dt[j] == DT_I64 ? (const void *)gd->iv[j] : (const void *)gd->v[j];
  DT_CHECK(dt_array_wrap(ctx, DT_DEV_CPU, c->dt[j], c->ndim[j], c->sh[j], (void *)p, &arr));
  dt_placement pl[DT_MAX_MESH_DIMS];
  for (int i = 0; i < dt_mesh_ndim(mesh); i++) pl[i] = c->pl[j];
  return dt_tensor_distribute(ctx, mesh, &arr, pl, t);
}

/* loss = sum(out[0] * G) for the current host inputs, unsharded (the rank's
 * mesh of 1): the reference the central differences differentiate. */
static double case_loss(void *arg) {
  gdata *gd = arg;
  const gcase *c = gd->c;
  dt_ctx *ctx = gd->ctx;
  dt_tensor in[MAXIN], out[DT_OP_MAX_OUT];
  const dt_tensor *ip[DT_OP_MAX_IN] = {NULL};
  dt_tensor *op[DT_OP_MAX_OUT] = {NULL};
  int made = 0;
  double loss = NAN;
  dt_status s = DT_OK;
  while (made < c->n_in && s == DT_OK) {
    s = make_input(ctx, gd->solo, gd, made, &in[made]);
    if (s == DT_OK) {
      ip[made] = &in[made];
      made++;
    }
  }
  for (int j = 0; j < c->op->n_out; j++) op[j] = &out[j];
  if (s == DT_OK) s = dt_op_call(ctx, c->op, &c->a, ip, op, NULL);
  if (s == DT_OK) {
    dt_array full;
    s = dt_tensor_full(ctx, &out[0], &full);
    if (s == DT_OK) {
      loss = 0;
      for (int64_t k = 0; k < full.numel && k < MAXEL; k++) loss += ((double *)full.data)[k] * gd->g[k];
      dt_array_free(ctx, &full);
    }
    for (int j = 0; j < c->op->n_out; j++) dt_tensor_free(ctx, &out[j]);
  }
  for (int j = 0; j < made; j++) dt_tensor_free(ctx, &in[j]);
  if (s != DT_OK && !gd->failed) {
    gd->failed = true;
    tu_fail(__FILE__, __LINE__, "%s: reference forward: %s: %s", c->op->name, dt_status_str(s),
            dt_last_error(ctx));
  }
  return loss;
}

/* One case on mesh: forward through the tape, dt_backward seeded with G (placed
 * like out[0], Partial as Replicate), each differentiable leaf's gathered
 * gradient against central differences of case_loss (rank 0), no gradient for
 * a nograd input, and no bytes left after dt_tape_free. */
static void check_op_grad(dt_ctx *ctx, dt_mesh *mesh, dt_mesh *solo, const gcase *c, int ci,
                          const char *label) {
  gdata *gd = calloc(1, sizeof *gd);
  if (!gd) {
    TU_CHECK(0, "%s: out of memory", c->op->name);
    return;
  }
  gd->c = c;
  gd->ctx = ctx;
  gd->solo = solo;
  for (int j = 0; j < c->n_in; j++) {
    int64_t n = dt_shape_numel(c->ndim[j], c->sh[j]);
    TU_CHECK(n <= MAXEL, "%s: input %d has %lld elements (MAXEL %d)", c->op->name, j, (long long)n, MAXEL);
    if (n > MAXEL) n = MAXEL;
    for (int64_t k = 0; k < n; k++) gd->iv[j][k] = (5 * k + 3) % (c->imax[j] > 0 ? c->imax[j] : 1);
    /* N(0, 0.5^2): O(1) values inside every op's smooth range */
    TU_OK(ctx, dt_rng_fill(DT_F64, gd->v[j], n, 4321, 100 * (uint64_t)ci + (uint64_t)j, 0, 1,
                           DT_RNG_NORMAL, 0.0, 0.5));
  }
  size_t base = ctx->mem.host_cur;
  dt_tape *t = NULL;
  TU_OK(ctx, dt_tape_create(ctx, NULL, &t));
  if (!t) {
    free(gd);
    return;
  }
  dt_var *leaf[MAXIN] = {NULL}, *out[DT_OP_MAX_OUT] = {NULL};
  dt_status s = DT_OK;
  for (int j = 0; j < c->n_in && s == DT_OK; j++) {
    dt_tensor v;
    s = make_input(ctx, mesh, gd, j, &v);
    if (s == DT_OK && !(leaf[j] = dt_var_leaf(t, &v, true))) s = DT_ERR_NOMEM;
  }
  if (s == DT_OK) s = dt_ad_op(t, c->op, &c->a, leaf, out);
  TU_CHECK(s == DT_OK, "%s on %s: forward through the tape: %s: %s", c->op->name, label,
           dt_status_str(s), dt_last_error(ctx));
  dt_tensor seed;
  bool have_seed = false;
  if (s == DT_OK) {
    const dt_tensor *y = dt_var_value(out[0]);
    int64_t n = dt_shape_numel(y->ndim, y->gshape);
    TU_CHECK(n <= MAXEL, "%s: output has %lld elements (MAXEL %d)", c->op->name, (long long)n, MAXEL);
    TU_OK(ctx, dt_rng_fill(DT_F64, gd->g, n <= MAXEL ? n : MAXEL, 4321, 100 * (uint64_t)ci + 99, 0,
                           1, DT_RNG_NORMAL, 0.0, 1.0));
    dt_placement gpl[DT_MAX_MESH_DIMS];
    for (int i = 0; i < y->mesh_ndim; i++)
      gpl[i] = y->pl[i].kind == DT_PL_PARTIAL ? dt_replicate() : y->pl[i];
    dt_array ga;
    s = dt_array_wrap(ctx, DT_DEV_CPU, DT_F64, y->ndim, y->gshape, gd->g, &ga);
    if (s == DT_OK) s = dt_tensor_distribute(ctx, mesh, &ga, gpl, &seed);
    have_seed = s == DT_OK;
    if (s == DT_OK) s = dt_backward(t, out[0], &seed);
    TU_CHECK(s == DT_OK, "%s on %s: dt_backward: %s: %s", c->op->name, label, dt_status_str(s),
             dt_last_error(ctx));
  }
  for (int j = 0; j < c->n_in && s == DT_OK; j++) {
    const dt_tensor *g = dt_var_grad(leaf[j]);
    if (c->nograd[j]) {
      TU_CHECK(g == NULL, "%s on %s: input %d got a gradient, but it has none: %s", c->op->name,
               label, j, c->nograd[j]);
      continue;
    }
    TU_CHECK(g != NULL, "%s on %s: input %d got no gradient", c->op->name, label, j);
    if (!g) continue;
    dt_array full;
    TU_OK(ctx, dt_tensor_full(ctx, g, &full));
    /* central differences on rank 0 only: the other ranks hold the same full gradient */
    if (ctx->rank == 0 && full.data) {
      int64_t n = dt_shape_numel(c->ndim[j], c->sh[j]);
      bool shape_ok = full.numel == n && full.ndim == c->ndim[j] && full.dtype == DT_F64;
      TU_CHECK(shape_ok, "%s on %s: gradient of input %d has %lld elements, want %lld",
               c->op->name, label, j, (long long)full.numel, (long long)n);
      double fd[MAXEL];
      if (shape_ok) {
        ot_fd_grad(gd->v[j], n, FD_H, case_loss, gd, fd);
        double worst = 0;
        int64_t at = 0;
        for (int64_t k = 0; k < n; k++) {
          double e = fabs(((double *)full.data)[k] - fd[k]) / (1 + fabs(fd[k]));
          if (!(e <= worst)) { /* NaN-safe */
            worst = isnan(e) ? INFINITY : e;
            at = k;
          }
        }
        TU_CHECK(worst <= TOL_FD, "%s on %s: gradient of input %d: element %lld is %.12g, "
                 "finite differences %.12g (error %.3g, tol %.1g)", c->op->name, label, j,
                 (long long)at, ((double *)full.data)[at], fd[at], worst, TOL_FD);
      }
    }
    dt_array_free(ctx, &full);
  }
  if (have_seed) dt_tensor_free(ctx, &seed);
  dt_tape_free(t);
  TU_CHECK(ctx->mem.host_cur == base, "%s on %s: %lld bytes left after dt_tape_free", c->op->name,
           label, (long long)ctx->mem.host_cur - (long long)base);
  free(gd);
}

/* (e) every case on this job's mesh. */
static void check_registry_grads(dt_ctx *ctx, dt_mesh *mesh, dt_mesh *solo, const char *label) {
  for (int i = 0; i < NGCASES; i++) check_op_grad(ctx, mesh, solo, &GCASES[i], i, label);
  if (ctx->rank == 0) printf("  %d ops: tape gradients against finite differences\n", NGCASES);
}

/* Every op of the registry has a backward and exactly one case above (an op
 * added to lib/ops without either fails here), and every case's op is in the
 * registry. */
static void check_registry_covered(void) {
  int n = 0;
  const dt_op *const *all = dt_op_all(&n);
  for (int i = 0; i < n; i++) {
    int k = 0;
    for (int c = 0; c < NGCASES; c++) k += GCASES[c].op == all[i];
    TU_CHECK(k == 1, "op %s of the registry has %d gradient cases in test_autograd, want 1",
             all[i]->name, k);
    TU_CHECK(all[i]->backward != NULL, "op %s of the registry has no backward", all[i]->name);
  }
  for (int c = 0; c < NGCASES; c++) {
    int k = 0;
    for (int i = 0; i < n; i++) k += GCASES[c].op == all[i];
    TU_CHECK(k == 1, "gradient case %d (op %s) is not in the registry", c, GCASES[c].op->name);
    TU_CHECK(GCASES[c].n_in == GCASES[c].op->n_in, "gradient case %s: %d inputs, the op takes %d",
             GCASES[c].op->name, GCASES[c].n_in, GCASES[c].op->n_in);
  }
  printf("registry: %d ops, %d gradient cases\n", n, NGCASES);
}

static dt_status body(dt_ctx *ctx, void *arg) {
  const job *J = arg;
  const char *names1[1] = {"tp"}, *names2[2] = {"dp", "tp"};
  dt_mesh *mesh = NULL, *solo = NULL;
  dt_comm *one = NULL;
  dt_status s = dt_mesh_create(ctx, ctx->world, J->mesh_ndim, J->shape,
                               J->mesh_ndim == 1 ? names1 : names2, &mesh);
  if (s == DT_OK) s = dt_comm_split(ctx->world, ctx->rank, 0, "solo", &one);
  const int one_shape[1] = {1};
  const char *one_names[1] = {"one"};
  if (s == DT_OK) s = dt_mesh_create(ctx, one, 1, one_shape, one_names, &solo);
  TU_OK(ctx, s);
  if (s != DT_OK) goto done;
  dt_array G[NLEAF];
  fill_globals(ctx, G);
  if (J->ledger) check_redist_backward(ctx, mesh);
  if (J->ledger) check_partial_accum(ctx, mesh);
  {
    dt_placement pl[NLEAF][DT_MAX_MESH_DIMS];
    const dt_placement(*cpl)[DT_MAX_MESH_DIMS] = (const dt_placement(*)[DT_MAX_MESH_DIMS])pl;
    char what[96];
    if (J->mesh_ndim == 1) {
      /* Megatron MLP: column-parallel W1, row-parallel W2 (linear's in dim is 1) */
      pl[0][0] = dt_shard(0); pl[1][0] = dt_shard(1); pl[2][0] = dt_shard(1);
      snprintf(what, sizeof what, "%s x S(0)", J->label);
      check_graph(ctx, mesh, solo, G, cpl, what);
      pl[0][0] = dt_replicate();
      snprintf(what, sizeof what, "%s x R", J->label);
      check_graph(ctx, mesh, solo, G, cpl, what);
    } else {
      pl[0][0] = dt_shard(0); pl[0][1] = dt_replicate();
      pl[1][0] = dt_replicate(); pl[1][1] = dt_shard(1);
      pl[2][0] = dt_replicate(); pl[2][1] = dt_shard(1);
      snprintf(what, sizeof what, "%s dp x tp", J->label);
      check_graph(ctx, mesh, solo, G, cpl, what);
    }
  }
  if (J->fd && ctx->rank == 0) check_fd(ctx, solo, G);
  check_registry_grads(ctx, mesh, solo, J->label);
  for (int i = 0; i < NLEAF; i++) dt_array_free(ctx, &G[i]);
done:
  dt_mesh_free(solo);
  dt_mesh_free(mesh);
  dt_comm_destroy(one);
  return s;
}

int main(int argc, char **argv) {
  tu_opts o;
  tu_parse(argc, argv, &o);
  if (o.backend != DT_BACKEND_THREADS) {
    printf("SKIP: test_autograd runs with the threads backend only\n");
    return SB_SKIP;
  }
  dt_device_cpu_blas_threads(1);
  check_registry_covered();
  const job jobs[] = {
      {1, {4, 0}, "mesh (4)", true, true},
      {2, {2, 2}, "mesh (2,2)", false, false},
  };
  for (size_t i = 0; i < sizeof jobs / sizeof jobs[0]; i++) {
    printf("%s\n", jobs[i].label);
    dt_launch_opts lo = {.backend = DT_BACKEND_THREADS, .world = 4, .timeout_s = 60};
    dt_launch_report rep;
    dt_status s = dt_launch(&lo, body, (void *)&jobs[i], &rep);
    if (s != DT_OK)
      tu_fail(__FILE__, __LINE__, "%s: launch: rank %d: %s", jobs[i].label, rep.failed_rank,
              rep.failed_msg);
    dt_launch_report_free(&rep);
  }
  return tu_finish("test_autograd");
}
