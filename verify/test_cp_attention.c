/* verify/test_cp_attention.c: context-parallel attention (sdpa_cp) and rope's
 * storage order on real ranks (threads backend), against oracles written here
 * on the global, natural-order tensors.
 *
 * The oracle: O(S^2) causal GQA attention (query head i reads kv head
 * i / (h / kvh)), its log-sum-exp, and the gradients of loss = sum(out * W)
 * from the textbook softmax Jacobian (dS = P (dP - rowsum(P dP))), itself
 * checked against central finite differences on a small case (oracle_fd).
 * The storage order is built here the way PyTorch builds it
 * (torch/distributed/tensor/experimental/_attention.py:
 * _generate_round_robin_indices: 2 cp chunks, rank r takes chunk r then chunk
 * 2 cp - 1 - r), not with dt_seq_position, which is checked against it.
 *
 * What it checks, for both rotate methods (allgather, ring), load balance on
 * (n_chunks = 2 cp) and off, f64 and f32, on meshes [cp] (cp 2, 3, 4, 8; h 4,
 * kvh 2), [cp, tp] (2 x 2 and 4 x 2; h 6, kvh 2, heads sharded over tp: 3
 * query heads per tp rank, one kv head) and [cp 2] at s 320 (units longer
 * than the kernels' 64-row query blocks):
 *  1. values: q, k, v permuted to storage order, S(seq) on cp, sdpa_cp forward
 *     and backward through the tape (loss = sum(out * W), W permuted too);
 *     out, lse, dq, dk, dv gathered, un-permuted and compared with the oracle
 *     (normwise: max |a - b| / max |ref|); one case in layout 0 too;
 *  2. block counts (dt_sdpa_cp_counts) per rank per forward and backward call
 *     equal the pairs derived here from the positions of the test's
 *     permutation, and the closed forms: balanced full 2C-1, diag 2, skipped
 *     2C-1, and full + diag / 2 summed over the cp ranks = 2 C^2 (half of the
 *     (2C)^2 pairs of a non-causal ring); unbalanced rank c has c, 1, C-1-c and
 *     the busiest rank does C times the work of the idlest;
 *  3. ledger rows per call (phase forward / backward, group cp), counts and
 *     payload bytes derived from the shapes: ring C-1 (backward 2C-1) sends and
 *     as many receives of [K | V] (2 b (S/C) kvh_local hd elements); allgather
 *     2 all_gathers (backward 2 all_gathers and 2 reduce_scatters) of
 *     b S kvh_local hd elements; nothing else on any group; the ring's forward
 *     rows alternate send, recv (each rotation's send posted before its recv);
 *  4. the verifier can fail: natural-order tensors under attrs that claim the
 *     head-tail order give a mismatch far above the tolerance;
 *  5. rope with i1: the stored sequence rotated by its positions equals a naive
 *     rope of the natural sequence, permuted; rope with i1 = 0 on the stored
 *     sequence does not (the check can fail); bad i1 values are refused;
 *  6. bad attrs of sdpa_cp (sequence not splitting into the chunks, rotate
 *     method, cp dim) are refused with DT_ERR_INVALID before any comm;
 *  7. no host memory is left allocated;
 *  8. the plan (dt_op_plan, no ranks): on a [other 2, cp 2] mesh, sdpa_cp keeps
 *     q, k, v's placement on the other dim (its backward's candidates come from the
 *     same function, cp_cands) (Replicate, as a pp dim's
 *     tensors are, whose ranks run other stages: any collective there would wait
 *     forever; S(0) and S(heads) as the data and tp dims give them), for both
 *     methods; with other placements on that dim it still plans.
 * What it is not: MPI, bf16, the model wiring (lib/nn) or the harness.
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optest.h"
#include "testutil.h"

/* Tolerances (normwise max |a - b| / max |ref|). f64: the kernels sum the same
 * products as the oracle in another order (online softmax, blocks, GEMMs);
 * measured errors are 5e-16 .. 2.3e-15 (the latter at s 320), so 1e-14. f32:
 * inputs are rounded to f32 once (the oracle sees the same values); the f32
 * GEMMs over hd = 8 and up to 320 keys, exp within 2 ulps and the f32 lse fed
 * back into the backward give measured errors 2.0e-7 .. 4.4e-7 (a few ulps of
 * the largest element), so 2e-6. A wrong mask, position or block is > 1e-2. */
static const double TOL_F64 = 1e-14, TOL_F32 = 2e-6;
/* A wrong order must miss by far more than any tolerance: measured 0.7. */
static const double WRONG_MIN = 1e-2;

/* ---- the oracle (natural order, [b, s, h, hd]) ------------------------------------ */

typedef struct dims {
  int64_t B, S, H, KVH, HD;
} dims;

static int64_t at4(const dims *z, int64_t heads, int64_t b, int64_t s, int64_t h, int64_t d) {
  return ((b * z->S + s) * heads + h) * z->HD + d;
}

/* out, lse [b, s, h] and the gradients of sum(out * W). */
static void oracle(const dims *z, const double *q, const double *k, const double *v, const double *W,
                   double *out, double *lse, double *dq, double *dk, double *dv) {
  const int64_t grp = z->H / z->KVH, S = z->S, HD = z->HD;
  const double sc = 1.0 / sqrt((double)HD);
  double *P = malloc(sizeof *P * (size_t)S), *dP = malloc(sizeof *dP * (size_t)S);
  if (!P || !dP) {
    tu_fail(__FILE__, __LINE__, "oracle: out of memory");
    free(P);
    free(dP);
    return;
  }
  memset(dk, 0, sizeof *dk * (size_t)(z->B * S * z->KVH * HD));
  memset(dv, 0, sizeof *dv * (size_t)(z->B * S * z->KVH * HD));
  for (int64_t b = 0; b < z->B; b++)
    for (int64_t h = 0; h < z->H; h++)
      for (int64_t i = 0; i < S; i++) {
        int64_t kh = h / grp;
        double mx = -INFINITY, zs = 0;
        for (int64_t j = 0; j <= i; j++) { /* causal: key j <= query i */
          double s = 0;
          for (int64_t d = 0; d < HD; d++) s += q[at4(z, z->H, b, i, h, d)] * k[at4(z, z->KVH, b, j, kh, d)];
          P[j] = s * sc;
          mx = fmax(mx, P[j]);
        }
        for (int64_t j = 0; j <= i; j++) zs += exp(P[j] - mx);
        lse[(b * S + i) * z->H + h] = mx + log(zs);
        for (int64_t j = 0; j <= i; j++) P[j] = exp(P[j] - mx) / zs;
        for (int64_t d = 0; d < HD; d++) {
          double acc = 0;
          for (int64_t j = 0; j <= i; j++) acc += P[j] * v[at4(z, z->KVH, b, j, kh, d)];
          out[at4(z, z->H, b, i, h, d)] = acc;
        }
        /* d out_i = W_i: dP_j = W_i . v_j, dS_j = P_j (dP_j - sum_l P_l dP_l) */
        double rs = 0;
        for (int64_t j = 0; j <= i; j++) {
          double s = 0;
          for (int64_t d = 0; d < HD; d++) s += W[at4(z, z->H, b, i, h, d)] * v[at4(z, z->KVH, b, j, kh, d)];
          dP[j] = s;
          rs += P[j] * s;
        }
        for (int64_t d = 0; d < HD; d++) {
          double acc = 0;
          for (int64_t j = 0; j <= i; j++) {
            double dS = P[j] * (dP[j] - rs);
            acc += dS * k[at4(z, z->KVH, b, j, kh, d)];
            dk[at4(z, z->KVH, b, j, kh, d)] += sc * dS * q[at4(z, z->H, b, i, h, d)];
            dv[at4(z, z->KVH, b, j, kh, d)] += P[j] * W[at4(z, z->H, b, i, h, d)];
          }
          dq[at4(z, z->H, b, i, h, d)] = sc * acc;
        }
      }
  free(P);
  free(dP);
}

typedef struct fd_arg {
  const dims *z;
  double *q, *k, *v, *W, *out, *lse, *g[3];
} fd_arg;

static double fd_loss(void *arg) {
  fd_arg *A = arg;
  oracle(A->z, A->q, A->k, A->v, A->W, A->out, A->lse, A->g[0], A->g[1], A->g[2]);
  double L = 0;
  for (int64_t i = 0; i < A->z->B * A->z->S * A->z->H * A->z->HD; i++) L += A->out[i] * A->W[i];
  return L;
}

/* The oracle's gradients against central differences of its own loss (b 1,
 * s 5, h 4, kvh 2, hd 3). h = 1e-6: truncation ~h^2 |f'''| < 1e-10, round-off
 * ~eps |L| / h ~ 1e-9; 1e-7 (relative, floor 1) separates right from wrong
 * (a dropped term is O(0.1)). Also shows the check fails on a planted error. */
static void oracle_fd(void) {
  const dims z = {1, 5, 4, 2, 3};
  enum { NQ = 1 * 5 * 4 * 3, NK = 1 * 5 * 2 * 3 };
  double q[NQ], k[NK], v[NK], W[NQ], out[NQ], lse[20], dq[NQ], dk[NK], dv[NK], s1[NQ], s2[NK], s3[NK];
  double *fill[4] = {q, k, v, W};
  const int64_t cnt[4] = {NQ, NK, NK, NQ};
  for (int j = 0; j < 4; j++)
    for (int64_t i = 0; i < cnt[j]; i++) fill[j][i] = sin(0.7 * (double)i + 1.9 * j) * (1.0 + 0.3 * j);
  oracle(&z, q, k, v, W, out, lse, dq, dk, dv);
  fd_arg A = {&z, q, k, v, W, out, lse, {s1, s2, s3}};
  double *x[3] = {q, k, v}, *an[3] = {dq, dk, dv}, fd[NQ];
  const int64_t nx[3] = {NQ, NK, NK};
  static const char *const NM[3] = {"dq", "dk", "dv"};
  for (int j = 0; j < 3; j++) {
    double keep[NQ];
    memcpy(keep, an[j], sizeof *keep * (size_t)nx[j]);
    ot_fd_grad(x[j], nx[j], 1e-6, fd_loss, &A, fd);
    double worst = 0, planted = 0;
    for (int64_t i = 0; i < nx[j]; i++) {
      worst = fmax(worst, fabs(keep[i] - fd[i]) / (1 + fabs(fd[i])));
      /* the same check with the mask off by one for the last key: must fail */
      planted = fmax(planted, fabs((i == nx[j] - 1 ? 1.1 * keep[i] + 0.1 : keep[i]) - fd[i]) / (1 + fabs(fd[i])));
    }
    TU_CHECK(worst <= 1e-7, "oracle %s against finite differences: error %.3g", NM[j], worst);
    TU_CHECK(planted > 1e-7, "oracle %s: a planted error passes the check (%.3g)", NM[j], planted);
  }
  printf("oracle: gradients match finite differences\n");
}

/* ---- storage order, as PyTorch's _generate_round_robin_indices ------------------- */

/* idx[stored index] = natural position: 2C chunks, rank r holds chunk r then
 * chunk 2C - 1 - r (lb), or the identity. */
static void perm_index(int64_t S, int C, bool lb, int64_t *idx) {
  if (!lb) {
    for (int64_t i = 0; i < S; i++) idx[i] = i;
    return;
  }
  int64_t L = S / (2 * C), n = 0;
  for (int r = 0; r < C; r++) {
    for (int64_t t = 0; t < L; t++) idx[n++] = r * L + t;
    for (int64_t t = 0; t < L; t++) idx[n++] = (2 * C - 1 - r) * L + t;
  }
}

/* ---- a config ---------------------------------------------------------------------- */

typedef struct cfg {
  int rotate;      /* dt_cp_rotate */
  bool lb;         /* head-tail storage (n_chunks = 2 cp) or natural */
  dt_dtype dt;
  int layout;      /* attrs.i0 */
  bool wrong;      /* natural-order tensors, attrs claiming head-tail: must mismatch */
} cfg;

typedef struct job {
  const char *label;
  int cp, tp;                   /* mesh [cp] when tp == 1, else [cp, tp] */
  dims z;
  bool extras;                  /* layout 0, the can-fail case, rope, bad input */
  long cases;                   /* rank 0's */
  dt_cp_counts cnt[2][16];      /* per world rank: forward, backward (for the sums) */
} job;

typedef struct rk {
  dt_ctx *ctx;
  dt_mesh *mesh;
  job *J;
  int c, t;                     /* cp and tp coordinates */
} rk;

/* element (b, s, h, d) of a [b, s, h, hd] (layout 1) or [b, h, s, hd] (0) array */
static int64_t at_l(const dims *z, int layout, int64_t heads, int64_t b, int64_t s, int64_t h, int64_t d) {
  return layout ? at4(z, heads, b, s, h, d) : ((b * heads + h) * z->S + s) * z->HD + d;
}

static double ld(const dt_array *a, int64_t i) {
  return a->dtype == DT_F64 ? ((const double *)a->data)[i] : (double)((const float *)a->data)[i];
}

/* The natural array nat ([b, s, heads, hd]) in storage order and layout, in
 * the dtype, into a malloc'd buffer. */
static void *stored(const dims *z, int layout, int64_t heads, dt_dtype dt, const int64_t *idx,
                    const double *nat) {
  size_t es = dt_dtype_size(dt), n = (size_t)(z->B * z->S * heads * z->HD);
  char *p = malloc(n * es);
  if (!p) return NULL;
  for (int64_t b = 0; b < z->B; b++)
    for (int64_t s = 0; s < z->S; s++)
      for (int64_t h = 0; h < heads; h++)
        for (int64_t d = 0; d < z->HD; d++) {
          double x = nat[at4(z, heads, b, idx[s], h, d)];
          int64_t e = at_l(z, layout, heads, b, s, h, d);
          if (dt == DT_F64) ((double *)p)[e] = x;
          else ((float *)p)[e] = (float)x;
        }
  return p;
}

/* Normwise error of the gathered a (storage order, layout; lse when hd0)
 * against the natural-order reference. */
static double err_of(const dims *z, int layout, int64_t heads, bool is_lse, const int64_t *idx,
                     const dt_array *a, const double *ref) {
  double num = 0, den = 0;
  int64_t HD = is_lse ? 1 : z->HD;
  for (int64_t b = 0; b < z->B; b++)
    for (int64_t s = 0; s < z->S; s++)
      for (int64_t h = 0; h < heads; h++)
        for (int64_t d = 0; d < HD; d++) {
          int64_t e, r;
          if (is_lse) {
            e = layout ? (b * z->S + s) * heads + h : (b * heads + h) * z->S + s;
            r = (b * z->S + idx[s]) * heads + h;
          } else {
            e = at_l(z, layout, heads, b, s, h, d);
            r = at4(z, heads, b, idx[s], h, d);
          }
          double x = ld(a, e);
          num = fmax(num, isnan(x) ? INFINITY : fabs(x - ref[r]));
          den = fmax(den, fabs(ref[r]));
        }
  return num / (den > 0 ? den : 1);
}

/* The natural-order global inputs (f32 rounded when dt is f32), deterministic. */
static void inputs(const dims *z, dt_dtype dt, double *q, double *k, double *v, double *W) {
  const int64_t nq = z->B * z->S * z->H * z->HD, nk = z->B * z->S * z->KVH * z->HD;
  double *a[4] = {q, k, v, W};
  const int64_t n[4] = {nq, nk, nk, nq};
  for (int j = 0; j < 4; j++) {
    dt_rng_fill(DT_F64, a[j], n[j], 2024, 10 + (uint64_t)j, 0, 1, DT_RNG_NORMAL, 0.0, 1.0);
    if (dt == DT_F32)
      for (int64_t i = 0; i < n[j]; i++) a[j][i] = (double)(float)a[j][i];
  }
}

/* Pairs of rank c's query units against every key unit, from the positions of
 * idx (units of S / U rows). */
static dt_cp_counts expected_pairs(const dims *z, int C, bool lb, const int64_t *idx, int c) {
  int64_t U = lb ? 2 * C : C, L = z->S / U, u = U / C;
  dt_cp_counts e = {0, 0, 0};
  for (int64_t a = c * u; a < (c + 1) * u; a++)
    for (int64_t kk = 0; kk < U; kk++) {
      int64_t pq = idx[a * L] / L, pk = idx[kk * L] / L;
      if (pk < pq) e.full++;
      else if (pk == pq) e.diag++;
      else e.skipped++;
    }
  return e;
}

static bool counts_eq(dt_cp_counts a, dt_cp_counts b) {
  return a.full == b.full && a.diag == b.diag && a.skipped == b.skipped;
}

/* Placements of a [b, s / h ...] tensor: S(seq) on cp, S(heads) on tp. */
static void placements(const rk *R, int layout, dt_placement *pl) {
  memset(pl, 0, sizeof *pl * DT_MAX_MESH_DIMS);
  pl[0] = dt_shard(layout ? 1 : 2);
  if (R->J->tp > 1) pl[1] = dt_shard(layout ? 2 : 1);
}

static dt_status make(rk *R, const dims *z, int layout, int64_t heads, dt_dtype dt, const void *data,
                      dt_tensor *t) {
  int64_t sh[4] = {z->B, layout ? z->S : heads, layout ? heads : z->S, z->HD};
  dt_placement pl[DT_MAX_MESH_DIMS];
  placements(R, layout, pl);
  ot_rank o = {.ctx = R->ctx, .mesh = R->mesh};
  return ot_make(&o, dt, 4, sh, data, pl, t);
}

/* ---- 1, 2 and 4: values and counts through the tape ------------------------------- */

static void run_case(rk *R, const cfg *f) {
  dt_ctx *ctx = R->ctx;
  const job *J = R->J;
  const dims *z = &J->z;
  const int C = J->cp;
  const int64_t nq = z->B * z->S * z->H * z->HD, nk = z->B * z->S * z->KVH * z->HD;
  char what[160];
  snprintf(what, sizeof what, "mesh %s %s %s %s layout %d%s", J->label,
           f->rotate == DT_CP_RING ? "ring" : "allgather", f->lb ? "balanced" : "natural",
           dt_dtype_name(f->dt), f->layout, f->wrong ? " (natural data, head-tail attrs)" : "");
  double *buf = calloc((size_t)(9 * nq + 6 * nk + 2 * z->B * z->S * z->H), sizeof *buf);
  int64_t *idx = calloc((size_t)z->S, sizeof *idx);
  void *sq = NULL, *sk = NULL, *sv = NULL, *sw = NULL;
  dt_tape *tape = NULL;
  if (!buf || !idx) {
    tu_fail(__FILE__, __LINE__, "%s: out of memory", what);
    goto out;
  }
  double *q = buf, *W = q + nq, *out = W + nq, *dq = out + nq, *k = dq + nq, *v = k + nk, *dk = v + nk,
         *dv = dk + nk, *lse = dv + nk;
  inputs(z, f->dt, q, k, v, W);
  /* the data's real order; attrs claim head-tail whenever lb or wrong */
  perm_index(z->S, C, f->lb && !f->wrong, idx);
  sq = stored(z, f->layout, z->H, f->dt, idx, q);
  sk = stored(z, f->layout, z->KVH, f->dt, idx, k);
  sv = stored(z, f->layout, z->KVH, f->dt, idx, v);
  sw = stored(z, f->layout, z->H, f->dt, idx, W);
  if (!sq || !sk || !sv || !sw) {
    tu_fail(__FILE__, __LINE__, "%s: out of memory", what);
    goto out;
  }
  dt_op_attrs a = DT_OP_ATTRS_INIT;
  a.dim = 0;
  a.i0 = f->layout;
  a.i1 = f->lb || f->wrong ? 2 * C : 0;
  a.i2 = f->rotate;
  dt_status s = dt_tape_create(ctx, NULL, &tape);
  dt_var *lv[4] = {NULL}, *o2[2] = {NULL}, *prod = NULL, *loss = NULL;
  const void *data[4] = {sq, sk, sv, sw};
  const int64_t heads[4] = {z->H, z->KVH, z->KVH, z->H};
  for (int j = 0; j < 4 && s == DT_OK; j++) {
    dt_tensor t;
    s = make(R, z, f->layout, heads[j], f->dt, data[j], &t);
    if (s == DT_OK && !(lv[j] = dt_var_leaf(tape, &t, j < 3))) s = DT_ERR_NOMEM;
  }
  dt_cp_counts fwd = {0, 0, 0}, bwd = {0, 0, 0};
  dt_sdpa_cp_counts_reset(ctx);
  if (s == DT_OK) s = dt_ad_op(tape, &dt_op_sdpa_cp, &a, lv, o2);
  dt_sdpa_cp_counts(ctx, &fwd);
  dt_sdpa_cp_counts_reset(ctx);
  dt_op_attrs none = DT_OP_ATTRS_INIT;
  if (s == DT_OK) {
    dt_var *mi[2] = {o2[0], lv[3]};
    s = dt_ad_op(tape, &dt_op_mul, &none, mi, &prod);
  }
  if (s == DT_OK) s = dt_ad_op(tape, &dt_op_sum, &none, &prod, &loss);
  if (s == DT_OK) s = dt_backward(tape, loss, NULL);
  dt_sdpa_cp_counts(ctx, &bwd);
  TU_CHECK(s == DT_OK, "%s, rank %d: forward / backward: %s: %s", what, ctx->rank, dt_status_str(s),
           dt_last_error(ctx));
  if (s != DT_OK) goto out;
  const dt_tensor *got[5] = {dt_var_value(o2[0]), dt_var_value(o2[1]), dt_var_grad(lv[0]),
                             dt_var_grad(lv[1]), dt_var_grad(lv[2])};
  dt_array full[5];
  memset(full, 0, sizeof full);
  for (int j = 0; j < 5; j++) {
    TU_CHECK(got[j] != NULL, "%s: result %d missing", what, j);
    if (got[j]) TU_OK(ctx, dt_tensor_full(ctx, got[j], &full[j]));
  }
  if (ctx->rank == 0) {
    oracle(z, q, k, v, W, out, lse, dq, dk, dv);
    static const char *const NM[5] = {"out", "lse", "dq", "dk", "dv"};
    const double *ref[5] = {out, lse, dq, dk, dv};
    const int64_t hh[5] = {z->H, z->H, z->H, z->KVH, z->KVH};
    const double tol = f->dt == DT_F64 ? TOL_F64 : TOL_F32;
    double worst = 0;
    for (int j = 0; j < 5; j++) {
      if (!full[j].data) continue;
      double e = err_of(z, f->layout, hh[j], j == 1, idx, &full[j], ref[j]);
      worst = fmax(worst, e);
      if (!f->wrong)
        TU_CHECK(e <= tol, "%s: %s differs from the oracle: normwise error %.3g (tol %.1g)", what, NM[j],
                 e, tol);
    }
    if (f->wrong)
      TU_CHECK(worst > WRONG_MIN, "%s: the verifier missed a wrong storage order (error %.3g)", what,
               worst);
    if (getenv("SB_CP_VERBOSE")) printf("  %s: worst normwise error %.3g\n", what, worst);
  }
  for (int j = 0; j < 5; j++) dt_array_free(ctx, &full[j]);
  /* 2: block counts, from the positions of the claimed order */
  int64_t *cidx = malloc(sizeof *cidx * (size_t)z->S);
  if (cidx) {
    perm_index(z->S, C, f->lb || f->wrong, cidx);
    dt_cp_counts e = expected_pairs(z, C, f->lb || f->wrong, cidx, R->c);
    TU_CHECK(counts_eq(fwd, e) && counts_eq(bwd, e),
             "%s, rank %d (cp %d): pairs forward %llu/%llu/%llu, backward %llu/%llu/%llu, expected "
             "full/diag/skipped %llu/%llu/%llu",
             what, ctx->rank, R->c, (unsigned long long)fwd.full, (unsigned long long)fwd.diag,
             (unsigned long long)fwd.skipped, (unsigned long long)bwd.full, (unsigned long long)bwd.diag,
             (unsigned long long)bwd.skipped, (unsigned long long)e.full, (unsigned long long)e.diag,
             (unsigned long long)e.skipped);
    /* the closed forms */
    dt_cp_counts cf = f->lb || f->wrong
                          ? (dt_cp_counts){(uint64_t)(2 * C - 1), 2, (uint64_t)(2 * C - 1)}
                          : (dt_cp_counts){(uint64_t)R->c, 1, (uint64_t)(C - 1 - R->c)};
    TU_CHECK(counts_eq(e, cf), "%s, rank %d: the positions give %llu/%llu/%llu pairs, not the closed form",
             what, ctx->rank, (unsigned long long)e.full, (unsigned long long)e.diag,
             (unsigned long long)e.skipped);
    free(cidx);
  }
  R->J->cnt[0][ctx->rank] = fwd;
  R->J->cnt[1][ctx->rank] = bwd;
  TU_OK(ctx, dt_comm_barrier(ctx->world));
  if (ctx->rank == 0 && !f->wrong) {
    /* sums over the cp ranks of tp slice 0 (world rank c * tp) */
    for (int ph = 0; ph < 2; ph++) {
      uint64_t work = 0, mx = 0, mn = UINT64_MAX;
      for (int c = 0; c < C; c++) {
        const dt_cp_counts *n = &R->J->cnt[ph][c * J->tp];
        uint64_t w2 = 2 * n->full + n->diag; /* work in half pairs */
        work += w2;
        mx = w2 > mx ? w2 : mx;
        mn = w2 < mn ? w2 : mn;
      }
      if (f->lb) {
        TU_CHECK(work == 2 * (uint64_t)(2 * C * C), "%s: full + diag/2 over the ranks is %g, want 2C^2 = %d",
                 what, work / 2.0, 2 * C * C);
        TU_CHECK(mx == mn, "%s: balanced work differs between ranks (%llu, %llu half pairs)", what,
                 (unsigned long long)mx, (unsigned long long)mn);
      } else {
        TU_CHECK(work == (uint64_t)(C * C), "%s: full + diag/2 over the ranks is %g, want C^2/2", what,
                 work / 2.0);
        /* rank C-1: C-1 full and a diagonal (2C-1 half pairs); rank 0: the diagonal alone */
        TU_CHECK(mn == 1 && mx == (uint64_t)(2 * C - 1),
                 "%s: unbalanced: busiest %llu, idlest %llu half pairs, want 2C-1 and 1", what,
                 (unsigned long long)mx, (unsigned long long)mn);
      }
    }
  }
  TU_OK(ctx, dt_comm_barrier(ctx->world)); /* rank 0 read cnt before the next case writes it */
  if (ctx->rank == 0) R->J->cases++;
out:
  dt_tape_free(tape);
  free(sq);
  free(sk);
  free(sv);
  free(sw);
  free(buf);
  free(idx);
}

/* ---- 3: ledger rows per call ------------------------------------------------------- */

typedef struct tally {
  int n[DT_COLL_COUNT];
  int other;          /* rows on another group, or of an unexpected size */
  uint64_t bytes[DT_COLL_COUNT];
} tally;

static void tally_rows(dt_ctx *ctx, size_t from, const char *phase, uint64_t elems, tally *t) {
  const dt_ledger *l = dt_ledger_of(ctx);
  memset(t, 0, sizeof *t);
  for (size_t i = from; i < l->n; i++) {
    const dt_ledger_row *r = &l->rows[i];
    if (strcmp(r->group, "cp") || strcmp(r->phase, phase) || r->elems != elems || r->op < 0 ||
        r->op >= DT_COLL_COUNT) {
      t->other++;
      continue;
    }
    t->n[r->op]++;
    t->bytes[r->op] += r->payload_bytes;
  }
}

static void ledger_case(rk *R, int rotate, dt_dtype dt) {
  dt_ctx *ctx = R->ctx;
  const job *J = R->J;
  const dims *z = &J->z;
  const int C = J->cp;
  const int64_t nq = z->B * z->S * z->H * z->HD, nk = z->B * z->S * z->KVH * z->HD;
  char what[96];
  snprintf(what, sizeof what, "ledger, mesh %s %s %s", J->label, rotate ? "ring" : "allgather",
           dt_dtype_name(dt));
  double *buf = calloc((size_t)(2 * nq + 2 * nk), sizeof *buf);
  int64_t *idx = calloc((size_t)z->S, sizeof *idx);
  void *st[4] = {NULL};
  dt_tensor t[4], o[2], g[3];
  int made = 0;
  dt_status s = DT_OK;
  if (!buf || !idx) {
    tu_fail(__FILE__, __LINE__, "%s: out of memory", what);
    goto out;
  }
  inputs(z, dt, buf, buf + 2 * nq, buf + 2 * nq + nk, buf + nq);
  perm_index(z->S, C, true, idx);
  const double *nat[4] = {buf, buf + 2 * nq, buf + 2 * nq + nk, buf + nq};
  const int64_t heads[4] = {z->H, z->KVH, z->KVH, z->H};
  for (int j = 0; j < 4 && s == DT_OK; j++) {
    st[j] = stored(z, 1, heads[j], dt, idx, nat[j]);
    s = st[j] ? make(R, z, 1, heads[j], dt, st[j], &t[j]) : DT_ERR_NOMEM;
    if (s == DT_OK) made++;
  }
  if (s != DT_OK) goto out;
  dt_op_attrs a = DT_OP_ATTRS_INIT;
  a.i0 = 1;
  a.i1 = 2 * C;
  a.i2 = rotate;
  /* the [K | V] block of one cp rank (ring), or one of K, V gathered (allgather) */
  const uint64_t kvh_l = (uint64_t)(z->KVH / J->tp), es = dt_dtype_size(dt);
  const uint64_t ring_el = 2 * (uint64_t)(z->B * (z->S / C) * z->HD) * kvh_l;
  const uint64_t ag_el = (uint64_t)(z->B * z->S * z->HD) * kvh_l;
  const uint64_t el = rotate ? ring_el : ag_el;
  const dt_ledger *l = dt_ledger_of(ctx);
  size_t n0 = l->n;
  dt_ctx_set_phase(ctx, "forward");
  const dt_tensor *in[3] = {&t[0], &t[1], &t[2]};
  dt_tensor *op[2] = {&o[0], &o[1]};
  s = dt_op_call(ctx, &dt_op_sdpa_cp, &a, in, op, NULL);
  TU_CHECK(s == DT_OK, "%s, rank %d: forward: %s", what, ctx->rank, dt_last_error(ctx));
  if (s != DT_OK) goto out;
  tally tf;
  tally_rows(ctx, n0, "forward", el, &tf);
  size_t n1 = l->n;
  if (rotate) { /* the schedule: every rotation's send is posted before its recv waits (the
                 * block's compute runs between them), send, recv, send, recv, ... */
    bool alt = (n1 - n0) % 2 == 0;
    for (size_t i = n0; alt && i < n1; i++)
      alt = l->rows[i].op == ((i - n0) % 2 ? DT_COLL_RECV : DT_COLL_SEND);
    TU_CHECK(alt, "%s, rank %d: the forward's rows are not send, recv, send, recv, ...", what,
             ctx->rank);
  }
  dt_ctx_set_phase(ctx, "backward");
  const dt_tensor *ov[2] = {&o[0], &o[1]}, *go[2] = {&t[3], NULL};
  dt_tensor *gi[3] = {&g[0], &g[1], &g[2]};
  s = dt_op_sdpa_cp.backward(ctx, &a, in, ov, go, gi);
  dt_ctx_set_phase(ctx, "");
  TU_CHECK(s == DT_OK, "%s, rank %d: backward: %s", what, ctx->rank, dt_last_error(ctx));
  if (s == DT_OK) {
    tally tb;
    tally_rows(ctx, n1, "backward", el, &tb);
    int want_f[DT_COLL_COUNT] = {0}, want_b[DT_COLL_COUNT] = {0};
    if (rotate) {
      want_f[DT_COLL_SEND] = want_f[DT_COLL_RECV] = C - 1;
      want_b[DT_COLL_SEND] = want_b[DT_COLL_RECV] = 2 * C - 1;
    } else {
      want_f[DT_COLL_ALL_GATHER] = 2;
      want_b[DT_COLL_ALL_GATHER] = want_b[DT_COLL_REDUCE_SCATTER] = 2;
    }
    TU_CHECK(tf.other == 0 && tb.other == 0, "%s, rank %d: %d forward and %d backward rows that are not "
             "cp rows of %llu elements", what, ctx->rank, tf.other, tb.other, (unsigned long long)el);
    for (int op_ = 0; op_ < DT_COLL_COUNT; op_++) {
      TU_CHECK(tf.n[op_] == want_f[op_] && tf.bytes[op_] == (uint64_t)want_f[op_] * el * es,
               "%s, rank %d: forward %s: %d rows, %llu bytes; want %d, %llu", what, ctx->rank,
               dt_coll_name((dt_coll)op_), tf.n[op_], (unsigned long long)tf.bytes[op_], want_f[op_],
               (unsigned long long)((uint64_t)want_f[op_] * el * es));
      TU_CHECK(tb.n[op_] == want_b[op_] && tb.bytes[op_] == (uint64_t)want_b[op_] * el * es,
               "%s, rank %d: backward %s: %d rows, %llu bytes; want %d, %llu", what, ctx->rank,
               dt_coll_name((dt_coll)op_), tb.n[op_], (unsigned long long)tb.bytes[op_], want_b[op_],
               (unsigned long long)((uint64_t)want_b[op_] * el * es));
    }
    /* the gradients come back in the placements k, v came in */
    for (int j = 1; j < 3; j++)
      for (int i = 0; i < t[j].mesh_ndim; i++)
        TU_CHECK(dt_placement_eq(g[j].pl[i], t[j].pl[i]), "%s: gradient %d on mesh dim %d is not placed "
                 "like its input", what, j, i);
    for (int j = 0; j < 3; j++) dt_tensor_free(ctx, &g[j]);
  }
  dt_tensor_free(ctx, &o[0]);
  dt_tensor_free(ctx, &o[1]);
out:
  dt_ctx_set_phase(ctx, "");
  for (int j = 0; j < made; j++) dt_tensor_free(ctx, &t[j]);
  for (int j = 0; j < 4; j++) free(st[j]);
  free(buf);
  free(idx);
}

/* ---- 5: rope with a storage order ------------------------------------------------- */

/* x [b, s, h, hd] natural, each pair (2i, 2i + 1) at position t rotated by t
 * 10000^(-2i / hd) (TorchTitan's precompute_freqs_cis default theta). */
static void naive_rope(const dims *z, const double *x, double *y) {
  for (int64_t b = 0; b < z->B; b++)
    for (int64_t t = 0; t < z->S; t++)
      for (int64_t h = 0; h < z->H; h++)
        for (int64_t i = 0; i < z->HD / 2; i++) {
          double ang = (double)t * pow(10000.0, -(double)(2 * i) / (double)z->HD);
          int64_t e = at4(z, z->H, b, t, h, 2 * i);
          y[e] = x[e] * cos(ang) - x[e + 1] * sin(ang);
          y[e + 1] = x[e] * sin(ang) + x[e + 1] * cos(ang);
        }
}

static dt_status rope_call(rk *R, int i1, const dt_tensor *x, dt_tensor *y) {
  dt_op_attrs a = DT_OP_ATTRS_INIT;
  a.i1 = i1;
  const dt_tensor *in[1] = {x};
  dt_tensor *o[1] = {y};
  return dt_op_call(R->ctx, &dt_op_rope, &a, in, o, NULL);
}

static void rope_case(rk *R) {
  dt_ctx *ctx = R->ctx;
  const dims *z = &R->J->z;
  const int C = R->J->cp;
  const int64_t n = z->B * z->S * z->H * z->HD;
  double *x = malloc(sizeof *x * (size_t)(2 * n));
  int64_t *idx = malloc(sizeof *idx * (size_t)z->S);
  void *sx = NULL;
  if (!x || !idx) {
    tu_fail(__FILE__, __LINE__, "rope: out of memory");
    goto out;
  }
  double *want = x + n;
  dt_rng_fill(DT_F64, x, n, 7, 1, 0, 1, DT_RNG_NORMAL, 0.0, 1.0);
  naive_rope(z, x, want);
  perm_index(z->S, C, true, idx);
  sx = stored(z, 1, z->H, DT_F64, idx, x);
  dt_tensor t, y;
  dt_status s = sx ? make(R, z, 1, z->H, DT_F64, sx, &t) : DT_ERR_NOMEM;
  TU_OK(ctx, s);
  if (s != DT_OK) goto out;
  const int i1s[2] = {2 * C, 0};
  for (int k = 0; k < 2; k++) {
    dt_array full;
    memset(&full, 0, sizeof full);
    s = rope_call(R, i1s[k], &t, &y);
    TU_OK(ctx, s);
    if (s != DT_OK) continue;
    TU_OK(ctx, dt_tensor_full(ctx, &y, &full));
    if (ctx->rank == 0 && full.data) {
      double e = err_of(z, 1, z->H, false, idx, &full, want);
      if (k == 0)
        TU_CHECK(e <= 1e-14, "rope i1 = %d on the stored sequence: error %.3g against the naive rope "
                 "(cos / sin of the same angles: ~1e-16)", i1s[k], e);
      else
        TU_CHECK(e > WRONG_MIN, "rope i1 = 0 on a head-tail sequence matches the naive rope (%.3g): the "
                 "check cannot fail", e);
    }
    dt_array_free(ctx, &full);
    dt_tensor_free(ctx, &y);
  }
  /* odd, not dividing s, negative */
  const int bad[3] = {3, (int)z->S + 2, -2};
  for (int k = 0; k < 3; k++) {
    s = rope_call(R, bad[k], &t, &y);
    TU_CHECK(s == DT_ERR_INVALID && strstr(dt_last_error(ctx), "i1"),
             "rope i1 = %d -> %s (%s), expected an invalid storage order", bad[k], dt_status_str(s),
             dt_last_error(ctx));
    if (s == DT_OK) dt_tensor_free(ctx, &y);
  }
  dt_tensor_free(ctx, &t);
out:
  free(sx);
  free(x);
  free(idx);
}

/* ---- 6: bad attrs ------------------------------------------------------------------- */

static void bad_attrs(rk *R) {
  dt_ctx *ctx = R->ctx;
  const dims *z = &R->J->z;
  const int64_t nq = z->B * z->S * z->H * z->HD, nk = z->B * z->S * z->KVH * z->HD;
  double *d = calloc((size_t)(nq + 2 * nk), sizeof *d);
  if (!d) {
    tu_fail(__FILE__, __LINE__, "bad attrs: out of memory");
    return;
  }
  dt_tensor t[3];
  int made = 0;
  dt_status s = DT_OK;
  const int64_t heads[3] = {z->H, z->KVH, z->KVH};
  double *p[3] = {d, d + nq, d + nq + nk};
  for (int j = 0; j < 3 && s == DT_OK; j++) {
    s = make(R, z, 1, heads[j], DT_F64, p[j], &t[j]);
    if (s == DT_OK) made++;
  }
  TU_OK(ctx, s);
  struct {
    int dim, i1, i2;
    const char *says;
  } B[] = {
      {0, (int)z->S + 2, DT_CP_RING, "equal chunks"}, /* sequence does not split into i1 chunks */
      {0, 2 * R->J->cp + 1, DT_CP_RING, "i1"},        /* odd chunk count */
      {0, 2 * R->J->cp, 2, "i2"},                     /* no such rotate method */
      {3, 2 * R->J->cp, DT_CP_RING, "attrs.dim"},     /* no such mesh dim */
  };
  size_t rows0 = dt_ledger_of(ctx)->n;
  for (size_t k = 0; k < sizeof B / sizeof B[0] && s == DT_OK; k++) {
    dt_op_attrs a = DT_OP_ATTRS_INIT;
    a.i0 = 1;
    a.dim = B[k].dim;
    a.i1 = B[k].i1;
    a.i2 = B[k].i2;
    dt_tensor o[2];
    const dt_tensor *in[3] = {&t[0], &t[1], &t[2]};
    dt_tensor *op[2] = {&o[0], &o[1]};
    dt_status r = dt_op_call(ctx, &dt_op_sdpa_cp, &a, in, op, NULL);
    TU_CHECK(r == DT_ERR_INVALID && strstr(dt_last_error(ctx), B[k].says),
             "sdpa_cp dim %d i1 %d i2 %d -> %s (%s), expected an invalid-argument error naming %s", a.dim,
             a.i1, a.i2, dt_status_str(r), dt_last_error(ctx), B[k].says);
    if (r == DT_OK) {
      dt_tensor_free(ctx, &o[0]);
      dt_tensor_free(ctx, &o[1]);
    }
  }
  TU_CHECK(dt_ledger_of(ctx)->n == rows0, "rank %d: refused calls communicated", ctx->rank);
  for (int j = 0; j < made; j++) dt_tensor_free(ctx, &t[j]);
  free(d);
}

/* ---- jobs ---------------------------------------------------------------------------- */

static dt_status body(dt_ctx *ctx, void *arg) {
  job *J = arg;
  rk R = {.ctx = ctx, .J = J};
  static const char *const N1[1] = {"cp"}, *const N2[2] = {"cp", "tp"};
  const int shape[2] = {J->cp, J->tp};
  int nd = J->tp > 1 ? 2 : 1;
  dt_status s = dt_mesh_create(ctx, ctx->world, nd, shape, nd == 1 ? N1 : N2, &R.mesh);
  TU_OK(ctx, s);
  if (s != DT_OK) return s;
  R.c = dt_mesh_coord(R.mesh, 0);
  R.t = nd > 1 ? dt_mesh_coord(R.mesh, 1) : 0;
  size_t mem0 = ctx->mem.host_cur;
  const dt_dtype DTS[2] = {DT_F64, DT_F32};
  for (int rot = 0; rot < 2; rot++)
    for (int lb = 0; lb < 2; lb++)
      for (int d = 0; d < 2; d++) run_case(&R, &(cfg){rot, lb, DTS[d], 1, false});
  for (int rot = 0; rot < 2; rot++) ledger_case(&R, rot, DT_F64);
  if (J->extras) {
    for (int rot = 0; rot < 2; rot++) run_case(&R, &(cfg){rot, true, DT_F64, 0, false});
    run_case(&R, &(cfg){DT_CP_RING, false, DT_F64, 1, true});
    run_case(&R, &(cfg){DT_CP_ALLGATHER, false, DT_F32, 1, true});
    rope_case(&R);
    bad_attrs(&R);
  }
  /* every output, gradient, tape and temporary was freed (the counters and the
   * dispatch cache live outside the host allocator) */
  TU_CHECK(ctx->mem.host_cur == mem0, "mesh %s, rank %d: host memory %zu bytes at the end, %zu at the start",
           J->label, ctx->rank, ctx->mem.host_cur, mem0);
  dt_mesh_free(R.mesh);
  return DT_OK;
}

/* dt_seq_position against the test's own permutation. */
static void seq_position_check(void) {
  const int Cs[4] = {2, 3, 4, 8};
  for (int k = 0; k < 4; k++) {
    int64_t S = 16 * Cs[k], idx[128];
    perm_index(S, Cs[k], true, idx);
    int bad = 0;
    for (int64_t i = 0; i < S; i++) bad += dt_seq_position(i, S, 2 * Cs[k]) != idx[i];
    for (int64_t i = 0; i < S; i++) bad += dt_seq_position(i, S, 0) != i || dt_seq_position(i, S, 1) != i;
    TU_CHECK(bad == 0, "dt_seq_position (S %lld, n_chunks %d): %d indices differ from the round-robin "
             "permutation", (long long)S, 2 * Cs[k], bad);
  }
  /* PyTorch's example: cp 4, S 16 -> 0,1,14,15, 2,3,12,13, 4,5,10,11, 6,7,8,9 */
  const int64_t ex[16] = {0, 1, 14, 15, 2, 3, 12, 13, 4, 5, 10, 11, 6, 7, 8, 9};
  int bad = 0;
  for (int i = 0; i < 16; i++) bad += dt_seq_position(i, 16, 8) != ex[i];
  TU_CHECK(bad == 0, "dt_seq_position(., 16, 8) differs from the cp = 4 example in %d places", bad);
  TU_CHECK(dt_seq_position(0, 15, 2) == -1 && dt_seq_position(0, 18, 3) == -1 &&
               dt_seq_position(18, 18, 2) == -1,
           "dt_seq_position accepts an invalid order or index");
}

/* ---- 8: the plan keeps the other dims' placements ------------------------------------ */

/* Plans sdpa_cp on a [2, cp 2] mesh (cp dim 1, layout 1 [b, s, h, hd]: b 4, s 48, h 4,
 * kvh 2, hd 8; the head-tail order), q, k, v S(seq) on cp and pl_q / pl_kv on dim 0. */
static dt_status plan_2d(dt_ctx *ctx, int rotate, dt_placement pl_q, dt_placement pl_kv,
                         dt_candidate *ch) {
  const int ms[2] = {2, 2};
  dt_op_attrs a = DT_OP_ATTRS_INIT;
  a.dim = 1;
  a.i0 = 1;
  a.i1 = 4;
  a.i2 = rotate;
  dt_spec in[3], out[2];
  memset(in, 0, sizeof in);
  for (int j = 0; j < 3; j++) {
    in[j].mesh_ndim = 2;
    in[j].ndim = 4;
    const int64_t g[4] = {4, 48, j ? 2 : 4, 8};
    memcpy(in[j].gshape, g, sizeof g);
    in[j].dtype = DT_F64;
    in[j].pl[0] = j ? pl_kv : pl_q;
    in[j].pl[1] = dt_shard(1);
  }
  return dt_op_plan(ctx, &dt_op_sdpa_cp, &a, ms, in, out, ch, NULL);
}

static void plan_keeps_other_dims(void) {
  dt_ctx ctx;
  dt_ctx_init(&ctx, 0, 1);
  const dt_placement keep[3] = {dt_replicate(), dt_shard(0), dt_shard(2)};
  const char *const names[3] = {"R", "S(0)", "S(heads)"};
  dt_candidate ch;
  for (int rot = 0; rot < 2; rot++)
    for (int p = 0; p < 3; p++) {
      const char *how = rot ? "ring" : "allgather", *was = names[p];
      dt_status st = plan_2d(&ctx, rot ? DT_CP_RING : DT_CP_ALLGATHER, keep[p], keep[p], &ch);
      TU_CHECK(st == DT_OK, "plan sdpa_cp %s with %s on dim 0: %s", how, was, dt_last_error(&ctx));
      for (int j = 0; st == DT_OK && j < 3; j++)
        TU_CHECK(dt_placement_eq(ch.in[j][0], keep[p]), "plan sdpa_cp %s: input %d on dim 0 moves from %s",
                 how, j, was);
    }
  /* placements the dim cannot keep (q Partial there) still plan */
  TU_OK(&ctx, plan_2d(&ctx, DT_CP_ALLGATHER, dt_partial(DT_RED_SUM), dt_replicate(), &ch));
  dt_ctx_release(&ctx);
}

int main(int argc, char **argv) {
  tu_opts o;
  tu_parse(argc, argv, &o);
  if (o.backend != DT_BACKEND_THREADS) {
    printf("SKIP: test_cp_attention runs on the threads backend only\n");
    return SB_SKIP;
  }
  dt_device_cpu_blas_threads(1);
  oracle_fd();
  seq_position_check();
  plan_keeps_other_dims();
  static job jobs[] = {
      {"[cp 2]", 2, 1, {2, 48, 4, 2, 8}, true, 0, {{{0}}}},
      {"[cp 3]", 3, 1, {2, 48, 4, 2, 8}, false, 0, {{{0}}}},
      {"[cp 4]", 4, 1, {2, 48, 4, 2, 8}, false, 0, {{{0}}}},
      {"[cp 8]", 8, 1, {2, 64, 4, 2, 8}, false, 0, {{{0}}}},
      {"[cp 2, tp 2]", 2, 2, {2, 48, 6, 2, 8}, false, 0, {{{0}}}},
      {"[cp 4, tp 2]", 4, 2, {2, 48, 6, 2, 8}, false, 0, {{{0}}}},
      /* units of 160 (natural) and 80 (balanced) rows: several blocks of 64 query
       * rows per pair, the last one short, and diagonal blocks cut at their last row */
      {"[cp 2] s 320", 2, 1, {1, 320, 2, 1, 8}, false, 0, {{{0}}}},
  };
  double t0 = dt_now();
  for (size_t i = 0; i < sizeof jobs / sizeof jobs[0]; i++) {
    job *J = &jobs[i];
    double dt = ot_launch(o.backend, J->label, J->tp > 1 ? 2 : 1, (int[]){J->cp, J->tp}, body, J);
    printf("mesh %-13s %3ld cases %.2f s\n", J->label, J->cases, dt);
    TU_CHECK(J->cases > 0, "mesh %s ran no case", J->label);
  }
  printf("total %.2f s\n", dt_now() - t0);
  return tu_finish("test_cp_attention");
}
