/* verify/test_ops_matmul.c: the matmul family (lib/ops/matmul.c: einsum, matmul,
 * linear) through the dispatcher, on real ranks (threads backend).
 *
 * What it checks:
 *   (1) strategy counts of gen_einsum_strategies (torch/distributed/tensor/_ops/
 *       _einsum_strategy.py) as TestEinsumStrategies asserts them
 *       (test/distributed/tensor/test_op_strategy.py) (dt_op_plan's n_generated,
 *       before the shardability filter) on 1-D and 2-D meshes;
 *   (2) the comm-mode oracle of test_comm_mode_with_dtensor
 *       (test/distributed/tensor/debug/test_comm_mode.py): world 2, x [8,8] S(0),
 *       y [8,32] S(0), mm:
 *       exactly one all_gather in the ledger during dt_op_call (the lhs-free
 *       option [S(0), S(0), R]), and what the dispatcher chose;
 *   (3) lowering oracles: linear colwise (x R, W S(0)) gives S(2) with no comm,
 *       rowwise (x S(2), W S(1)) gives P(sum) with no comm; a [3,4] S(0) operand on
 *       4 ranks makes mm's output R (the output shardability filter);
 *   (4) correctness, f64: every input placement combination from {R, S(0..r-1),
 *       P(sum)} per mesh dim for mm (uneven 7x5 @ 5x6), matmul (batched), linear
 *       (3-D x) and a broadcasting einsum "bmk,kn->bmn", on meshes (1), (4) and
 *       (2,2): dt_tensor_full of the output against loops over the global
 *       inputs (generated here from dt_rng_uniform, independently of the shards);
 *   (5) gradients, f64: mm and linear backward (op->backward, i.e. dt_op_call on
 *       einsum) for several input and output-gradient placements, dA and dB
 *       (full) against central finite differences of loss = sum(C * G).
 * What it is not: a benchmark, nor a test of the redistribute planners.
 */
#include "config.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/tensor_impl.h"
#include "testutil.h"

enum { MAXM = 2, MAXR = 3 };

/* ---- global references ---- */

typedef enum { C_MM, C_MATMUL, C_LINEAR, C_BCAST, C_TRANS, C_ONESIDE } case_kind;

typedef struct mcase {
  const char *name;
  case_kind kind;
  const dt_op *op;
  const char *eq; /* einsum only */
  int ra, rb;
  int64_t sa[MAXR], sb[MAXR];
} mcase;

static const mcase CASES[] = {
    {"mm", C_MM, &dt_op_matmul, NULL, 2, 2, {7, 5}, {5, 6}},
    {"matmul-batched", C_MATMUL, &dt_op_matmul, NULL, 3, 3, {3, 5, 4}, {3, 4, 6}},
    {"linear", C_LINEAR, &dt_op_linear, NULL, 3, 2, {2, 5, 7}, {6, 7}},
    {"einsum bmk,kn->bmn", C_BCAST, &dt_op_einsum, "bmk,kn->bmn", 3, 2, {3, 5, 4}, {4, 6}},
    /* operands transposed and the output permuted (the kernel's permute path) */
    {"einsum km,nk->nm", C_TRANS, &dt_op_einsum, "km,nk->nm", 2, 2, {5, 7}, {6, 5}},
    /* k summed in A only (the kernel's naive path) */
    {"einsum mk,n->mn", C_ONESIDE, &dt_op_einsum, "mk,n->mn", 2, 1, {7, 5}, {6}},
};

static int64_t numel(int r, const int64_t *s) {
  int64_t n = 1;
  for (int i = 0; i < r; i++) n *= s[i];
  return n;
}

/* Output shape, contraction length K, and C = op(A, B) by loops (and, when S is
 * given, S[c] = sum over the k terms of |a||b|, for the error bound). */
static void ref_shape(const mcase *c, int *rc, int64_t *sc, int64_t *K) {
  switch (c->kind) {
    case C_MM:
      *rc = 2;
      sc[0] = c->sa[0];
      sc[1] = c->sb[1];
      *K = c->sa[1];
      break;
    case C_MATMUL:
      *rc = 3;
      sc[0] = c->sa[0];
      sc[1] = c->sa[1];
      sc[2] = c->sb[2];
      *K = c->sa[2];
      break;
    case C_LINEAR:
      *rc = 3;
      sc[0] = c->sa[0];
      sc[1] = c->sa[1];
      sc[2] = c->sb[0];
      *K = c->sa[2];
      break;
    case C_BCAST:
      *rc = 3;
      sc[0] = c->sa[0];
      sc[1] = c->sa[1];
      sc[2] = c->sb[1];
      *K = c->sa[2];
      break;
    case C_TRANS:
      *rc = 2;
      sc[0] = c->sb[0];
      sc[1] = c->sa[1];
      *K = c->sa[0];
      break;
    case C_ONESIDE:
      *rc = 2;
      sc[0] = c->sa[0];
      sc[1] = c->sb[0];
      *K = c->sa[1];
      break;
  }
}

static void ref_compute(const mcase *c, const double *A, const double *B, double *C, double *S) {
  int rc;
  int64_t sc[MAXR], K;
  ref_shape(c, &rc, sc, &K);
  int64_t nb = rc == 3 ? sc[0] : 1, M = sc[rc - 2], N = sc[rc - 1];
  if (c->kind == C_TRANS) { /* C[n, m] */
    M = sc[1];
    N = sc[0];
  }
  for (int64_t b = 0; b < nb; b++)
    for (int64_t m = 0; m < M; m++)
      for (int64_t n = 0; n < N; n++) {
        double acc = 0, s = 0;
        for (int64_t k = 0; k < K; k++) {
          double a = c->kind == C_TRANS ? A[k * M + m] : A[(b * M + m) * K + k], w;
          switch (c->kind) {
            case C_TRANS:
              w = B[n * K + k];
              break;
            case C_ONESIDE:
              w = B[n];
              break;
            case C_MATMUL:
              w = B[(b * K + k) * N + n];
              break;
            case C_LINEAR:
              w = B[n * K + k];
              break; /* x @ W^T */
            default:
              w = B[k * N + n];
              break; /* mm; bcast: B shared by every b */
          }
          acc += a * w;
          s += fabs(a) * fabs(w);
        }
        int64_t ci = c->kind == C_TRANS ? n * M + m : (b * M + m) * N + n;
        C[ci] = acc;
        if (S) S[ci] = s;
      }
}

static void gen_global(int r, const int64_t *s, uint64_t seed, uint64_t stream, double *out) {
  int64_t n = numel(r, s);
  for (int64_t i = 0; i < n; i++) out[i] = -1.0 + 2.0 * dt_rng_uniform(seed, stream, (uint64_t)i);
}

/* ---- per-job state ---- */

typedef struct job {
  const char *label;
  int m;
  int shape[MAXM];
  const char *names[MAXM];
  long combos, checks, grads;
} job;

static void pl_str(int m, const dt_placement *pl, char *buf, size_t n) {
  dt_placements_str(m, pl, buf, n);
}

static size_t ledger_n(const dt_ctx *ctx) {
  return dt_ledger_of(ctx)->n;
}

/* Placement choice i of {R, S(0..r-1), P(sum)}. */
static dt_placement choice(int i, int r) {
  if (i == 0) return dt_replicate();
  if (i <= r) return dt_shard(i - 1);
  return dt_partial(DT_RED_SUM);
}

static dt_status make_input(dt_ctx *ctx, dt_mesh *mesh, int r, const int64_t *s,
                            const dt_placement *pl, uint64_t stream, dt_tensor *t) {
  /* seed 42; values uniform in [-1, 1) */
  return dt_tensor_rand(ctx, mesh, r, s, DT_F64, pl, 42, stream, DT_RNG_UNIFORM, -1.0, 2.0, t);
}

static void set_attrs(const mcase *c, dt_op_attrs *a) {
  memset(a, 0, sizeof *a);
  if (c->eq) snprintf(a->eq, sizeof a->eq, "%s", c->eq);
}

/* (4) every placement combination of one case. */
static dt_status check_case(dt_ctx *ctx, dt_mesh *mesh, job *J, const mcase *c) {
  int m = J->m;
  int rc;
  int64_t sc[MAXR], K;
  ref_shape(c, &rc, sc, &K);
  int64_t na = numel(c->ra, c->sa), nb = numel(c->rb, c->sb), nc = numel(rc, sc);
  double *A = malloc(sizeof(double) * (size_t)na), *B = malloc(sizeof(double) * (size_t)nb);
  double *C = malloc(sizeof(double) * (size_t)nc), *S = malloc(sizeof(double) * (size_t)nc);
  if (!A || !B || !C || !S) {
    free(A);
    free(B);
    free(C);
    free(S);
    return DT_ERR_NOMEM;
  }
  gen_global(c->ra, c->sa, 42, 1, A);
  gen_global(c->rb, c->sb, 42, 2, B);
  ref_compute(c, A, B, C, S);
  int ca = c->ra + 2, cb = c->rb + 2; /* choices per mesh dim */
  long total = 1;
  for (int i = 0; i < m; i++) total *= (long)ca * cb;
  dt_op_attrs at;
  set_attrs(c, &at);
  dt_status st = DT_OK;
  for (long combo = 0; combo < total && st == DT_OK; combo++) {
    dt_placement pa[MAXM], pb[MAXM];
    long x = combo;
    for (int i = m - 1; i >= 0; i--) {
      pb[i] = choice((int)(x % cb), c->rb);
      x /= cb;
      pa[i] = choice((int)(x % ca), c->ra);
      x /= ca;
    }
    char sa[64], sb[64], so[64];
    pl_str(m, pa, sa, sizeof sa);
    pl_str(m, pb, sb, sizeof sb);
    dt_tensor ta, tb, tc;
    st = make_input(ctx, mesh, c->ra, c->sa, pa, 1, &ta);
    if (st != DT_OK) {
      tu_fail(__FILE__, __LINE__, "%s on %s, rank %d: input A %s: %s", c->name, J->label, ctx->rank,
              sa, dt_last_error(ctx));
      break;
    }
    st = make_input(ctx, mesh, c->rb, c->sb, pb, 2, &tb);
    if (st != DT_OK) {
      tu_fail(__FILE__, __LINE__, "%s on %s, rank %d: input B %s: %s", c->name, J->label, ctx->rank,
              sb, dt_last_error(ctx));
      dt_tensor_free(ctx, &ta);
      break;
    }
    const dt_tensor *ins[2] = {&ta, &tb};
    dt_tensor *outs[1] = {&tc};
    st = dt_op_call(ctx, c->op, &at, ins, outs, NULL);
    if (st != DT_OK) {
      tu_fail(__FILE__, __LINE__, "%s on %s, rank %d, inputs (%s) (%s): dt_op_call -> %s: %s",
              c->name, J->label, ctx->rank, sa, sb, dt_status_str(st), dt_last_error(ctx));
    } else {
      pl_str(m, tc.pl, so, sizeof so);
      dt_array full;
      st = dt_tensor_full(ctx, &tc, &full);
      if (st != DT_OK) {
        tu_fail(__FILE__, __LINE__, "%s on %s, rank %d: full_tensor of output %s: %s", c->name,
                J->label, ctx->rank, so, dt_last_error(ctx));
      } else {
        bool shape_ok = full.ndim == rc && full.numel == nc;
        TU_CHECK(shape_ok,
                 "%s on %s, rank %d, inputs (%s) (%s): output shape wrong (ndim %d, numel %lld)",
                 c->name, J->label, ctx->rank, sa, sb, full.ndim, (long long)full.numel);
        const double *got = full.data;
        int bad = 0;
        for (int64_t i = 0; shape_ok && i < nc && bad < 3; i++) {
          /* f64 dot product of K terms plus up to 4 cross-rank Partial additions
           * (mesh of 4 ranks): |err| <= (K + 4) * 2^-53 * sum|a||b| (gamma_n bound),
           * doubled for slack on the reduction order; exact zero terms aside. */
          double tol = 2.0 * (double)(K + 4) * (DBL_EPSILON / 2) * S[i] + 1e-300;
          if (!(fabs(got[i] - C[i]) <= tol)) {
            tu_fail(__FILE__, __LINE__,
                    "%s on %s, rank %d, inputs (%s) (%s) -> output (%s): element %lld is %.17g, "
                    "want %.17g (tol %.3g)",
                    c->name, J->label, ctx->rank, sa, sb, so, (long long)i, got[i], C[i], tol);
            bad++;
          }
        }
        if (ctx->rank == 0) J->checks++;
        dt_array_free(ctx, &full);
      }
      dt_tensor_free(ctx, &tc);
    }
    dt_tensor_free(ctx, &ta);
    dt_tensor_free(ctx, &tb);
    if (ctx->rank == 0) J->combos++;
  }
  free(A);
  free(B);
  free(C);
  free(S);
  return st;
}

/* (5) gradients against central finite differences. */
static dt_status check_grad(dt_ctx *ctx, dt_mesh *mesh, job *J, const mcase *c,
                            const dt_placement *pa, const dt_placement *pb,
                            const dt_placement *pg) {
  int m = J->m;
  int rc;
  int64_t sc[MAXR], K;
  ref_shape(c, &rc, sc, &K);
  int64_t na = numel(c->ra, c->sa), nb = numel(c->rb, c->sb), nc = numel(rc, sc);
  double *A = malloc(sizeof(double) * (size_t)na), *B = malloc(sizeof(double) * (size_t)nb);
  double *C = malloc(sizeof(double) * (size_t)nc), *G = malloc(sizeof(double) * (size_t)nc);
  double *S = malloc(sizeof(double) * (size_t)nc);
  dt_status st = DT_OK;
  if (!A || !B || !C || !G || !S) {
    st = DT_ERR_NOMEM;
    goto out;
  }
  gen_global(c->ra, c->sa, 42, 1, A);
  gen_global(c->rb, c->sb, 42, 2, B);
  gen_global(rc, sc, 42, 3, G);
  char sa[64], sb[64], sg[64];
  pl_str(m, pa, sa, sizeof sa);
  pl_str(m, pb, sb, sizeof sb);
  pl_str(m, pg, sg, sizeof sg);
  dt_tensor ta, tb, tc, tg, ga, gb;
  st = make_input(ctx, mesh, c->ra, c->sa, pa, 1, &ta);
  if (st == DT_OK) st = make_input(ctx, mesh, c->rb, c->sb, pb, 2, &tb);
  if (st == DT_OK) st = make_input(ctx, mesh, rc, sc, pg, 3, &tg);
  if (st != DT_OK) {
    tu_fail(__FILE__, __LINE__, "grad %s on %s, rank %d: inputs: %s", c->name, J->label, ctx->rank,
            dt_last_error(ctx));
    goto out; /* (leaks the made inputs on this error path; the test fails anyway) */
  }
  dt_op_attrs at;
  set_attrs(c, &at);
  const dt_tensor *ins[2] = {&ta, &tb};
  dt_tensor *outs[1] = {&tc};
  st = dt_op_call(ctx, c->op, &at, ins, outs, NULL);
  if (st == DT_OK) {
    const dt_tensor *gouts[1] = {&tg};
    const dt_tensor *couts[1] = {&tc};
    dt_tensor *gins[2] = {&ga, &gb};
    st = c->op->backward(ctx, &at, ins, couts, gouts, gins);
    if (st != DT_OK) {
      tu_fail(__FILE__, __LINE__, "grad %s on %s, rank %d, A %s B %s G %s: backward -> %s: %s",
              c->name, J->label, ctx->rank, sa, sb, sg, dt_status_str(st), dt_last_error(ctx));
    } else {
      for (int w = 0; w < 2 && st == DT_OK; w++) {
        dt_array full;
        st = dt_tensor_full(ctx, w ? &gb : &ga, &full);
        if (st != DT_OK) break;
        double *X = w ? B : A;
        int64_t nx = w ? nb : na;
        const double *got = full.data;
        TU_CHECK(full.numel == nx, "grad %s on %s, rank %d: d%c has %lld elements, want %lld",
                 c->name, J->label, ctx->rank, w ? 'B' : 'A', (long long)full.numel, (long long)nx);
        const double h = 1e-6; /* central difference step */
        int bad = 0;
        for (int64_t i = 0; i < nx && full.numel == nx && bad < 3; i++) {
          double x0 = X[i], lp = 0, lm = 0, sabs = 0;
          X[i] = x0 + h;
          ref_compute(c, A, B, C, S);
          for (int64_t j = 0; j < nc; j++) {
            lp += C[j] * G[j];
            sabs += S[j] * fabs(G[j]);
          }
          X[i] = x0 - h;
          ref_compute(c, A, B, C, NULL);
          for (int64_t j = 0; j < nc; j++) lm += C[j] * G[j];
          X[i] = x0;
          double fd = (lp - lm) / (2 * h);
          /* The loss is linear in each input, so the central difference has no
           * truncation error; what remains is the rounding of the two losses,
           * each within (K + numel(C)) * 2^-53 * sum|a||b||g| (gamma_n), divided
           * by 2h, plus the sharded gradient's own rounding (far smaller). */
          double tol = 2.0 * (double)(K + nc) * (DBL_EPSILON / 2) * sabs / (2 * h) + 1e-12;
          if (!(fabs(got[i] - fd) <= tol)) {
            tu_fail(__FILE__, __LINE__,
                    "grad %s on %s, rank %d, A %s B %s G %s: d%c[%lld] is %.12g, "
                    "finite difference %.12g (tol %.3g)",
                    c->name, J->label, ctx->rank, sa, sb, sg, w ? 'B' : 'A', (long long)i, got[i],
                    fd, tol);
            bad++;
          }
        }
        dt_array_free(ctx, &full);
        if (ctx->rank == 0) J->grads += nx;
      }
      dt_tensor_free(ctx, &ga);
      dt_tensor_free(ctx, &gb);
    }
    dt_tensor_free(ctx, &tc);
  } else {
    tu_fail(__FILE__, __LINE__, "grad %s on %s, rank %d: forward: %s", c->name, J->label, ctx->rank,
            dt_last_error(ctx));
  }
  dt_tensor_free(ctx, &ta);
  dt_tensor_free(ctx, &tb);
  dt_tensor_free(ctx, &tg);
out:
  free(A);
  free(B);
  free(C);
  free(G);
  free(S);
  return st;
}

static const mcase GRAD_CASES[] = {
    {"mm", C_MM, &dt_op_matmul, NULL, 2, 2, {4, 3}, {3, 5}},
    {"linear", C_LINEAR, &dt_op_linear, NULL, 3, 2, {2, 3, 4}, {5, 4}},
};

static dt_status body(dt_ctx *ctx, void *arg) {
  job *J = arg;
  dt_mesh *mesh = NULL;
  DT_CHECK(dt_mesh_create(ctx, ctx->world, J->m, J->shape, J->names, &mesh));
  dt_status st = DT_OK;
  size_t mem0 = ctx->mem.host_cur;
  for (size_t i = 0; i < sizeof CASES / sizeof CASES[0] && st == DT_OK; i++)
    st = check_case(ctx, mesh, J, &CASES[i]);
  /* gradients: a few placement triples (A, B, G) per mesh dim, same on every dim */
  static const struct {
    int a, b, g;
  } GP[] = {
      {0, 0, 0}, /* all R: the unsharded path */
      {1, 0, 1}, /* A S(0), G S(0) */
      {2, 1, 0}, /* A S(1), B S(0) (contracting for mm) */
      {0, 2, 9}, /* B S(1) (mm: rhs-free), G P(sum) */
      {9, 0, 2}, /* A P(sum), G S(1) */
  };
  for (size_t gc = 0; gc < sizeof GRAD_CASES / sizeof GRAD_CASES[0] && st == DT_OK; gc++) {
    const mcase *c = &GRAD_CASES[gc];
    for (size_t p = 0; p < sizeof GP / sizeof GP[0] && st == DT_OK; p++) {
      dt_placement pa[MAXM], pb[MAXM], pg[MAXM];
      for (int i = 0; i < J->m; i++) {
        pa[i] = GP[p].a == 9 ? dt_partial(DT_RED_SUM) : choice(GP[p].a, c->ra);
        pb[i] = GP[p].b == 9 ? dt_partial(DT_RED_SUM) : choice(GP[p].b, c->rb);
        pg[i] = GP[p].g == 9 ? dt_partial(DT_RED_SUM) : choice(GP[p].g, c->ra);
      }
      st = check_grad(ctx, mesh, J, c, pa, pb, pg);
    }
  }
  TU_CHECK(st != DT_OK || ctx->mem.host_cur == mem0,
           "mesh %s, rank %d: host memory %zu bytes after the checks, %zu before (a leak)",
           J->label, ctx->rank, ctx->mem.host_cur, mem0);
  dt_mesh_free(mesh);
  return st;
}

/* ---- (1) strategy counts ---- */

static void check_counts(void) {
  static const struct {
    const char *eq;
    int m;
    int want;
  } T[] = {
      {"mk,kn->mn", 1, 4},       {"mk,kn->mn", 2, 16},   {"bmk,bkn->bmn", 1, 5},
      {"bmk,bkn->bmn", 2, 25},   {"bmk,kn->bmn", 2, 25}, {"bmk,k->bm", 2, 16},
      {"abcd,abcd->abcd", 1, 5},
  };
  dt_ctx ctx;
  dt_ctx_init(&ctx, 0, 1);
  for (size_t t = 0; t < sizeof T / sizeof T[0]; t++) {
    dt_op_attrs at = DT_OP_ATTRS_INIT;
    snprintf(at.eq, sizeof at.eq, "%s", T[t].eq);
    const char *comma = strchr(T[t].eq, ','), *arrow = strstr(T[t].eq, "->");
    dt_spec in[2], out[1];
    memset(in, 0, sizeof in);
    for (int j = 0; j < 2; j++) {
      in[j].mesh_ndim = T[t].m;
      in[j].ndim = j == 0 ? (int)(comma - T[t].eq) : (int)(arrow - comma - 1);
      for (int d = 0; d < in[j].ndim; d++) in[j].gshape[d] = 16; /* >= 2x2: nothing filtered */
      in[j].dtype = DT_F32;
      for (int i = 0; i < T[t].m; i++) in[j].pl[i] = dt_replicate();
    }
    int ms[2] = {2, 2};
    dt_candidate ch;
    dt_op_report rep;
    memset(&rep, 0, sizeof rep);
    dt_status s = dt_op_plan(&ctx, &dt_op_einsum, &at, ms, in, out, &ch, &rep);
    TU_CHECK(s == DT_OK, "einsum %s on a %d-D mesh: dt_op_plan -> %s: %s", T[t].eq, T[t].m,
             dt_status_str(s), dt_last_error(&ctx));
    TU_CHECK(rep.n_generated == T[t].want && rep.n_candidates == T[t].want,
             "einsum %s on a %d-D mesh of 2s: %d strategies generated (%d kept), want %d", T[t].eq,
             T[t].m, rep.n_generated, rep.n_candidates, T[t].want);
  }
  /* the same generator behind matmul and linear: 2-D mm and 3-D x linear */
  dt_spec in[2], out[1];
  memset(in, 0, sizeof in);
  int ms[1] = {2};
  for (int j = 0; j < 2; j++) {
    in[j].mesh_ndim = 1;
    in[j].ndim = 2;
    in[j].gshape[0] = in[j].gshape[1] = 16;
    in[j].dtype = DT_F64;
  }
  dt_candidate ch;
  dt_op_report rep;
  memset(&rep, 0, sizeof rep);
  TU_OK(&ctx, dt_op_plan(&ctx, &dt_op_matmul, NULL, ms, in, out, &ch, &rep));
  TU_CHECK(rep.n_generated == 4, "matmul 2-D on a 1-D mesh: %d strategies, want 4 (mk,kn->mn)",
           rep.n_generated);
  in[0].ndim = 3;
  in[0].gshape[2] = 16;
  TU_OK(&ctx, dt_op_plan(&ctx, &dt_op_linear, NULL, ms, in, out, &ch, &rep));
  TU_CHECK(rep.n_generated == 5, "linear 3-D x on a 1-D mesh: %d strategies, want 5 (abk,nk->abn)",
           rep.n_generated);
  /* errors: mismatched contraction, dtype, bad equation */
  in[0].ndim = 2;
  in[0].gshape[1] = 15;
  dt_status s = dt_op_plan(&ctx, &dt_op_matmul, NULL, ms, in, out, &ch, NULL);
  TU_CHECK(s == DT_ERR_INVALID && strstr(dt_last_error(&ctx), "matmul"),
           "matmul [16,15] @ [16,16]: want DT_ERR_INVALID naming matmul, got %s: %s",
           dt_status_str(s), dt_last_error(&ctx));
  in[0].gshape[1] = 16;
  in[1].dtype = DT_F32;
  s = dt_op_plan(&ctx, &dt_op_matmul, NULL, ms, in, out, &ch, NULL);
  TU_CHECK(s == DT_ERR_INVALID && strstr(dt_last_error(&ctx), "dtype"),
           "matmul f64 @ f32: want DT_ERR_INVALID about dtypes, got %s: %s", dt_status_str(s),
           dt_last_error(&ctx));
  in[1].dtype = DT_F64;
  dt_op_attrs at = DT_OP_ATTRS_INIT;
  snprintf(at.eq, sizeof at.eq, "mk,kn");
  s = dt_op_plan(&ctx, &dt_op_einsum, &at, ms, in, out, &ch, NULL);
  TU_CHECK(s == DT_ERR_INVALID, "einsum \"mk,kn\" (no output): want DT_ERR_INVALID, got %s",
           dt_status_str(s));
  dt_ctx_release(&ctx);
}

/* ---- (2), (3) oracles on real ranks ---- */

typedef struct oracle_job {
  char chosen[256]; /* rank 0's description of the mm choice */
} oracle_job;

static dt_status run_call(dt_ctx *ctx, const dt_op *op, const dt_tensor *x, const dt_tensor *y,
                          dt_tensor *out, size_t *ncomm, dt_op_report *rep) {
  const dt_tensor *ins[2] = {x, y};
  dt_tensor *outs[1] = {out};
  size_t before = ledger_n(ctx);
  dt_status s = dt_op_call(ctx, op, NULL, ins, outs, rep);
  *ncomm = ledger_n(ctx) - before;
  return s;
}

static dt_status oracle_body2(dt_ctx *ctx, void *arg) {
  oracle_job *O = arg;
  dt_mesh *mesh;
  int shape[1] = {2};
  const char *names[1] = {"tp"};
  DT_CHECK(dt_mesh_create(ctx, ctx->world, 1, shape, names, &mesh));
  dt_placement s0[1] = {dt_shard(0)};
  int64_t xs[2] = {8, 8}, ys[2] = {8, 32};
  dt_tensor x, y, z;
  dt_status st = make_input(ctx, mesh, 2, xs, s0, 1, &x);
  if (st == DT_OK) st = make_input(ctx, mesh, 2, ys, s0, 2, &y);
  if (st != DT_OK) {
    dt_mesh_free(mesh);
    return st;
  }
  dt_candidate cand[8];
  dt_op_report rep = {.cand = cand, .max_cand = 8};
  size_t n0 = ledger_n(ctx), nc;
  st = run_call(ctx, &dt_op_matmul, &x, &y, &z, &nc, &rep);
  TU_OK(ctx, st);
  if (st == DT_OK) {
    int ag = 0, other = 0;
    for (size_t i = n0; i < ledger_n(ctx); i++)
      if (dt_ledger_of(ctx)->rows[i].op == DT_COLL_ALL_GATHER)
        ag++;
      else
        other++;
    char a[32], b[32], o[32];
    if (rep.chosen >= 0 && rep.chosen < 8) {
      pl_str(1, cand[rep.chosen].in[0], a, sizeof a);
      pl_str(1, cand[rep.chosen].in[1], b, sizeof b);
      pl_str(1, cand[rep.chosen].out[0], o, sizeof o);
      if (ctx->rank == 0)
        snprintf(O->chosen, sizeof O->chosen,
                 "mm x[8,8] S(0) @ y[8,32] S(0) on 2 ranks: chose (%s, %s) -> %s at %.3f us of %d "
                 "candidates; ledger: %d all_gather, %d other",
                 a, b, o, cand[rep.chosen].cost_us, rep.n_candidates, ag, other);
    }
    TU_CHECK(ag == 1 && other == 0 && nc == 1,
             "oracle mm on (2), rank %d, x S(0) y S(0): %d all_gather and %d other comms, want "
             "exactly 1 all_gather",
             ctx->rank, ag, other);
    TU_CHECK(z.pl[0].kind == DT_PL_SHARD && z.pl[0].dim == 0,
             "oracle mm on (2), rank %d: output not S(0)", ctx->rank);
    dt_tensor_free(ctx, &z);
  }
  dt_tensor_free(ctx, &x);
  dt_tensor_free(ctx, &y);
  dt_mesh_free(mesh);
  return st;
}

static dt_status oracle_body4(dt_ctx *ctx, void *arg) {
  (void)arg;
  dt_mesh *mesh;
  int shape[1] = {4};
  const char *names[1] = {"tp"};
  DT_CHECK(dt_mesh_create(ctx, ctx->world, 1, shape, names, &mesh));
  dt_placement R[1] = {dt_replicate()}, s0[1] = {dt_shard(0)}, s1[1] = {dt_shard(1)},
               s2[1] = {dt_shard(2)};
  int64_t xs[3] = {2, 5, 16}, ws[2] = {32, 16};
  dt_tensor x, w, y;
  size_t nc;
  dt_status st;
  /* colwise: x R, W S(0) -> S(2), no comm */
  st = make_input(ctx, mesh, 3, xs, R, 1, &x);
  if (st == DT_OK) st = make_input(ctx, mesh, 2, ws, s0, 2, &w);
  if (st == DT_OK) {
    st = run_call(ctx, &dt_op_linear, &x, &w, &y, &nc, NULL);
    TU_OK(ctx, st);
    if (st == DT_OK) {
      TU_CHECK(nc == 0 && y.pl[0].kind == DT_PL_SHARD && y.pl[0].dim == 2,
               "linear colwise on (4), rank %d, x R, W S(0): %zu comms, output %s; want S(2), 0",
               ctx->rank, nc, y.pl[0].kind == DT_PL_SHARD ? "S(d)" : "not S");
      /* its backward with dy = y (S(2)): dx = dy @ W contracts n, so P(sum);
       * dW = dy^T x keeps n sharded, so S(0); neither needs comm */
      const dt_tensor *ins[2] = {&x, &w}, *outs[1] = {&y}, *gouts[1] = {&y};
      dt_tensor gx, gw;
      dt_tensor *gins[2] = {&gx, &gw};
      size_t n0 = ledger_n(ctx);
      dt_status sb = dt_op_linear.backward(ctx, NULL, ins, outs, gouts, gins);
      TU_OK(ctx, sb);
      if (sb == DT_OK) {
        TU_CHECK(ledger_n(ctx) == n0 && gx.pl[0].kind == DT_PL_PARTIAL &&
                     gw.pl[0].kind == DT_PL_SHARD && gw.pl[0].dim == 0,
                 "linear colwise backward on (4), rank %d: %zu comms, dx kind %d, dW kind %d "
                 "dim %d; want 0 comms, dx P(sum), dW S(0)",
                 ctx->rank, ledger_n(ctx) - n0, (int)gx.pl[0].kind, (int)gw.pl[0].kind,
                 gw.pl[0].dim);
        dt_tensor_free(ctx, &gx);
        dt_tensor_free(ctx, &gw);
      }
      dt_tensor_free(ctx, &y);
    }
    dt_tensor_free(ctx, &x);
    dt_tensor_free(ctx, &w);
  }
  /* rowwise: x S(2), W S(1) -> P(sum), no comm */
  if (st == DT_OK) st = make_input(ctx, mesh, 3, xs, s2, 1, &x);
  if (st == DT_OK) st = make_input(ctx, mesh, 2, ws, s1, 2, &w);
  if (st == DT_OK) {
    st = run_call(ctx, &dt_op_linear, &x, &w, &y, &nc, NULL);
    TU_OK(ctx, st);
    if (st == DT_OK) {
      TU_CHECK(nc == 0 && y.pl[0].kind == DT_PL_PARTIAL && y.pl[0].op == DT_RED_SUM,
               "linear rowwise on (4), rank %d, x S(2), W S(1): %zu comms, output kind %d; want "
               "P(sum), 0",
               ctx->rank, nc, (int)y.pl[0].kind);
      dt_tensor_free(ctx, &y);
    }
    dt_tensor_free(ctx, &x);
    dt_tensor_free(ctx, &w);
  }
  /* [3,4] S(0) on 4 ranks: the output S(0) would be unshardable: output R */
  int64_t as[2] = {3, 4}, bs[2] = {4, 8};
  if (st == DT_OK) st = make_input(ctx, mesh, 2, as, s0, 1, &x);
  if (st == DT_OK) st = make_input(ctx, mesh, 2, bs, R, 2, &w);
  if (st == DT_OK) {
    st = run_call(ctx, &dt_op_matmul, &x, &w, &y, &nc, NULL);
    TU_OK(ctx, st);
    if (st == DT_OK) {
      TU_CHECK(y.pl[0].kind == DT_PL_REPLICATE,
               "mm [3,4] S(0) @ [4,8] R on (4), rank %d: output kind %d, want R", ctx->rank,
               (int)y.pl[0].kind);
      dt_tensor_free(ctx, &y);
    }
    dt_tensor_free(ctx, &x);
    dt_tensor_free(ctx, &w);
  }
  dt_mesh_free(mesh);
  return st;
}

/* Per-input linearity (PyTorch's test_mm_partial_inputs): on (4), P(sum) @ P(sum)
 * costs exactly one all_reduce and gives P(sum); on (2,2), (P, R) @ (R, P) gives
 * (P, P) with no comm. Values are checked too. */
static dt_status partial_body(dt_ctx *ctx, void *arg) {
  (void)arg;
  dt_status st = DT_OK;
  for (int v = 0; v < 2 && st == DT_OK; v++) {
    dt_mesh *mesh;
    int shape[2] = {v ? 2 : 4, 2};
    const char *names[2] = {"dp", "tp"};
    int m = v ? 2 : 1;
    DT_CHECK(dt_mesh_create(ctx, ctx->world, m, shape, names, &mesh));
    dt_placement P = dt_partial(DT_RED_SUM), R = dt_replicate();
    dt_placement pa[2] = {P, v ? R : P}, pb[2] = {v ? R : P, P};
    int64_t as[2] = {8, 6}, bs[2] = {6, 4};
    dt_tensor a, b, c;
    size_t nc;
    st = make_input(ctx, mesh, 2, as, pa, 1, &a);
    if (st == DT_OK) st = make_input(ctx, mesh, 2, bs, pb, 2, &b);
    if (st == DT_OK) {
      size_t n0 = ledger_n(ctx);
      st = run_call(ctx, &dt_op_matmul, &a, &b, &c, &nc, NULL);
      TU_OK(ctx, st);
      if (st == DT_OK) {
        int ar = 0;
        for (size_t i = n0; i < ledger_n(ctx); i++)
          ar += dt_ledger_of(ctx)->rows[i].op == DT_COLL_ALL_REDUCE;
        bool pp = true;
        for (int i = 0; i < m; i++)
          pp = pp && c.pl[i].kind == DT_PL_PARTIAL && c.pl[i].op == DT_RED_SUM;
        size_t want = v ? 0 : 1;
        TU_CHECK(nc == want && ar == (int)want && pp,
                 "mm partial inputs on %s, rank %d: %zu comms (%d all_reduce), output all P(sum): "
                 "%d; want %zu all_reduce and all P(sum)",
                 v ? "(2,2) (P,R)@(R,P)" : "(4) P@P", ctx->rank, nc, ar, (int)pp, want);
        dt_array full;
        st = dt_tensor_full(ctx, &c, &full);
        if (st == DT_OK) {
          mcase mc = {"mm", C_MM, &dt_op_matmul, NULL, 2, 2, {8, 6}, {6, 4}};
          double A[48], B[24], C[32], S[32];
          gen_global(2, as, 42, 1, A);
          gen_global(2, bs, 42, 2, B);
          ref_compute(&mc, A, B, C, S);
          const double *got = full.data;
          for (int i = 0; i < 32; i++) {
            /* as in check_case: K = 6 terms plus up to 4 Partial additions */
            double tol = 2.0 * (6 + 4) * (DBL_EPSILON / 2) * S[i] + 1e-300;
            TU_CHECK(fabs(got[i] - C[i]) <= tol,
                     "mm partial inputs, rank %d: element %d is %.17g, want %.17g", ctx->rank, i,
                     got[i], C[i]);
          }
          dt_array_free(ctx, &full);
        }
        dt_tensor_free(ctx, &c);
      }
      dt_tensor_free(ctx, &a);
      dt_tensor_free(ctx, &b);
    }
    dt_mesh_free(mesh);
  }
  return st;
}

/* f32: mm and linear on (4) for a few placements, against the f64 loops. */
static dt_status f32_body(dt_ctx *ctx, void *arg) {
  (void)arg;
  dt_mesh *mesh;
  int shape[1] = {4};
  const char *names[1] = {"tp"};
  DT_CHECK(dt_mesh_create(ctx, ctx->world, 1, shape, names, &mesh));
  dt_status st = DT_OK;
  for (int ci = 0; ci < 3 && st == DT_OK; ci++) {
    const mcase *c = &CASES[ci == 2 ? 2 : 0];
    for (int pi = 0; pi < 4 && st == DT_OK; pi++) {
      dt_placement pa[1] = {choice(pi % 3, c->ra)}, pb[1] = {choice((pi + 1) % 3, c->rb)};
      dt_tensor a, b, o;
      st =
          dt_tensor_rand(ctx, mesh, c->ra, c->sa, DT_F32, pa, 42, 1, DT_RNG_UNIFORM, -1.0, 2.0, &a);
      if (st != DT_OK) break;
      st =
          dt_tensor_rand(ctx, mesh, c->rb, c->sb, DT_F32, pb, 42, 2, DT_RNG_UNIFORM, -1.0, 2.0, &b);
      if (st != DT_OK) {
        dt_tensor_free(ctx, &a);
        break;
      }
      dt_op_attrs at;
      set_attrs(c, &at);
      const dt_tensor *ins[2] = {&a, &b};
      dt_tensor *outs[1] = {&o};
      st = dt_op_call(ctx, c->op, &at, ins, outs, NULL);
      TU_OK(ctx, st);
      if (st == DT_OK) {
        dt_array full;
        st = dt_tensor_full(ctx, &o, &full);
        if (st == DT_OK) {
          int rc;
          int64_t sc[MAXR], K;
          ref_shape(c, &rc, sc, &K);
          int64_t na = numel(c->ra, c->sa), nb = numel(c->rb, c->sb), nc = numel(rc, sc);
          double *A = malloc(sizeof(double) * (size_t)(na + nb + 2 * nc));
          if (!A) st = DT_ERR_NOMEM;
          for (int64_t i = 0; A && i < na + nb;
               i++) /* the f32 inputs, exactly as the shards hold them */
            A[i] = (double)(float)(-1.0 + 2.0 * dt_rng_uniform(42, i < na ? 1 : 2,
                                                               (uint64_t)(i < na ? i : i - na)));
          if (A) {
            ref_compute(c, A, A + na, A + na + nb, A + na + nb + nc);
            const float *got = full.data;
            for (int64_t i = 0; i < nc; i++) {
              /* f32 K-term dot product plus the rounding of the result to f32:
               * (K + 4 + 1) * 2^-24 * sum|a||b| (gamma_n in single precision) */
              double tol = (double)(K + 5) * (FLT_EPSILON / 2) * A[na + nb + nc + i] + 1e-30;
              TU_CHECK(fabs((double)got[i] - A[na + nb + i]) <= tol,
                       "f32 %s on (4), rank %d, placement %d: element %lld is %.9g, want %.9g (tol "
                       "%.3g)",
                       c->name, ctx->rank, pi, (long long)i, (double)got[i], A[na + nb + i], tol);
            }
            free(A);
          }
          dt_array_free(ctx, &full);
        }
        dt_tensor_free(ctx, &o);
      }
      dt_tensor_free(ctx, &a);
      dt_tensor_free(ctx, &b);
    }
  }
  dt_mesh_free(mesh);
  return st;
}

static void launch(dt_launch_opts *lo, int world, dt_spmd_fn fn, void *arg, const char *what) {
  lo->world = world;
  dt_launch_report rep;
  dt_status s = dt_launch(lo, fn, arg, &rep);
  if (s != DT_OK)
    tu_fail(__FILE__, __LINE__, "%s: launch: rank %d: %s", what, rep.failed_rank, rep.failed_msg);
  dt_launch_report_free(&rep);
}

int main(int argc, char **argv) {
  tu_opts o;
  tu_parse(argc, argv, &o);
  if (o.backend != DT_BACKEND_THREADS) {
    fprintf(stderr, "test_ops_matmul: threads backend only\n");
    return SB_SKIP;
  }
  dt_device_cpu_blas_threads(1);
  double t0 = dt_now();
  check_counts();
  dt_launch_opts lo = {.backend = o.backend, .timeout_s = 60};
  oracle_job O;
  memset(&O, 0, sizeof O);
  launch(&lo, 2, oracle_body2, &O, "mm oracle (2)");
  printf("%s\n", O.chosen);
  launch(&lo, 4, oracle_body4, NULL, "lowering oracles (4)");
  launch(&lo, 4, partial_body, NULL, "partial inputs (4), (2,2)");
  launch(&lo, 4, f32_body, NULL, "f32 (4)");
  job jobs[3] = {
      {"(1)", 1, {1, 1}, {"tp", NULL}, 0, 0, 0},
      {"(4)", 1, {4, 1}, {"tp", NULL}, 0, 0, 0},
      {"(2,2)", 2, {2, 2}, {"dp", "tp"}, 0, 0, 0},
  };
  for (int i = 0; i < 3; i++) {
    launch(&lo, jobs[i].shape[0] * (jobs[i].m > 1 ? jobs[i].shape[1] : 1), body, &jobs[i],
           jobs[i].label);
    printf("mesh %-6s %ld placement combinations checked, %ld gradient elements\n", jobs[i].label,
           jobs[i].combos, jobs[i].grads);
    /* a sweep that enumerates nothing must not pass on the other meshes' checks */
    TU_CHECK(jobs[i].combos > 0 && jobs[i].grads > 0, "mesh %s: %ld combinations, %ld gradient "
             "elements checked", jobs[i].label, jobs[i].combos, jobs[i].grads);
  }
  printf("total %.2f s\n", dt_now() - t0);
  return tu_finish("test_ops_matmul");
}
