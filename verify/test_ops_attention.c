/* verify/test_ops_attention.c: rope and sdpa of lib/ops/attention.c on real
 * ranks (threads backend), against naive references computed here on the
 * unsharded global tensors: PyTorch's sdpa strategies (all R, heads S(1), batch
 * S(0): torch/distributed/tensor/_ops/_matrix_ops.py) and TorchTitan's
 * attention (torchtitan/models/llama3/model/model.py: repeat_kv,
 * precompute_freqs_cis with the Llama 3.1 scaling, apply_rotary_emb).
 *
 * What it checks:
 *  (a) sdpa values: b=2, s=5, hd=4, h=8 with kvh 4, 2, 8, and h=6 with kvh 3
 *      and 2 (heads not divisible by 4 ranks: the head strategy must be
 *      refused), on a 1-D mesh of 4 every combination of {R, S(0), S(1),
 *      P(sum)} for (q, k, v), on a 2x2 mesh every combination of six 2-D
 *      placements: dt_tensor_full(out) equals the reference (repeat_kv
 *      semantics: query head i uses kv head i / (h / kvh));
 *  (b) sdpa oracles: head-sharded (S(1)) inputs with divisible heads run with
 *      0 ledger rows and give an S(1) output (1-D and (S(0), S(1)) / (S(1),
 *      S(1)) on 2x2), batch sharding likewise; non-divisible heads (h=6, or
 *      kvh=2 on 4 ranks) communicate and are still right;
 *  (c) rope values: x [2, 7, 3, 8] (s=7 is uneven on 4 ranks and nested
 *      uneven on 2x2) on every placement from {R, S(0..3), P(sum), P(avg)}
 *      (1-D) / {R, S(0..3), P(sum)}^2 (2x2), theta default, 500000 with and
 *      without the Llama 3.1 scaling: equals the reference with GLOBAL
 *      positions; oracles: S(1) and P(sum) pass through with 0 ledger rows;
 *  (d) the scaling rule: for hd=128, theta=500000, the frequency rope applies
 *      (read back as atan2 of a rotated (1, 0) pair at position 1) equals a
 *      direct transcription of Meta's apply_scaling loop, in all three
 *      regimes (high: unchanged, low: /8, medium: smoothed);
 *  (e) backward of sdpa (dq, dk, dv) and rope against central finite
 *      differences of the reference (loss = sum(out * G)), sharded (1-D mesh
 *      of 4, 2x2) and unsharded (mesh of 1);
 *  (f) no host memory is left allocated.
 *  (g) long sequences (s = 150: three blocks of query rows in the kernels),
 *      f64 and f32, both layouts, forward and backward against a naive
 *      unblocked attention and its gradients in double.
 * (a), (b) and part of (e) run again in layout 1 (attrs.i0: q, k, v, out as
 * [b, s, h, hd], heads sharded as S(2)), against the layout-0 reference on
 * the transposed tensors; a bad layout is refused.
 * What it is not: f32 accuracy, the cost model (test_plan), MPI.
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optest.h"
#include "testutil.h"

enum { MAXN = 1024 }; /* elements of the largest global tensor used here (b4 h8 s5 hd4 = 640) */

/* Tolerances. REL: the kernels compute the same sums as the references in
 * double; P(sum) inputs are split (value / n) and summed back by an all-reduce,
 * which changes values by a few ulps; sums have <= 8 terms of magnitude < 4 and
 * exp / cos / sin are correctly rounded to ~1 ulp, so results agree to ~1e-15
 * and 1e-12 (relative, floor 1) is far below any indexing or strategy error
 * (those are O(0.1)). FD: central differences with h = 1e-6 have truncation
 * error ~h^2 |f'''| (< 1e-10 here: the functions are smooth with O(1)
 * derivatives) and round-off ~eps |L| / h (|L| < 100: ~2e-8), so 1e-6
 * (relative, floor 1) separates a right gradient from a wrong one. */
static const double REL = 1e-12;
static const double FD_H = 1e-6, FD_TOL = 1e-6;

typedef struct garr {
  int ndim;
  int64_t sh[4];
  double v[MAXN];
} garr;

static int64_t numel(const garr *g) {
  int64_t n = 1;
  for (int d = 0; d < g->ndim; d++) n *= g->sh[d];
  return n;
}

/* deterministic values in [-1, 1], no symmetry between heads or positions */
static void gfill(garr *g, int64_t a, int64_t b, int64_t c, int64_t d, int seed) {
  memset(g, 0, sizeof *g);
  g->ndim = 4;
  g->sh[0] = a;
  g->sh[1] = b;
  g->sh[2] = c;
  g->sh[3] = d;
  for (int64_t i = 0; i < numel(g); i++) g->v[i] = sin(0.37 * (double)i + 1.3 * seed) * cos(0.11 * (double)i * seed);
}

/* ---- references -------------------------------------------------------------------- */

/* out [b,h,s,hd] = causal softmax(q k^T / sqrt(hd)) v with repeat_kv */
static void ref_sdpa(const garr *in, garr *out) {
  const garr *q = &in[0], *k = &in[1], *v = &in[2];
  int64_t B = q->sh[0], H = q->sh[1], S = q->sh[2], HD = q->sh[3], KVH = k->sh[1];
  memset(out, 0, sizeof *out);
  out->ndim = 4;
  memcpy(out->sh, q->sh, sizeof out->sh);
  double sc = 1.0 / sqrt((double)HD);
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++) {
      int64_t kh = h / (H / KVH); /* repeat_kv: kv head kh repeated n_rep times */
      for (int64_t i = 0; i < S; i++) {
        double s[64], mx = -INFINITY, z = 0;
        for (int64_t j = 0; j <= i; j++) {
          s[j] = 0;
          for (int64_t d = 0; d < HD; d++)
            s[j] += q->v[((b * H + h) * S + i) * HD + d] * k->v[((b * KVH + kh) * S + j) * HD + d];
          s[j] *= sc;
          mx = fmax(mx, s[j]);
        }
        for (int64_t j = 0; j <= i; j++) z += exp(s[j] - mx);
        for (int64_t d = 0; d < HD; d++) {
          double acc = 0;
          for (int64_t j = 0; j <= i; j++) acc += exp(s[j] - mx) / z * v->v[((b * KVH + kh) * S + j) * HD + d];
          out->v[((b * H + h) * S + i) * HD + d] = acc;
        }
      }
    }
}

/* Meta's apply_scaling (llama3 reference), transcribed loop-style. */
static double direct_scaled_freq(double freq) {
  const double scale_factor = 8, low_freq_factor = 1, high_freq_factor = 4, old_context_len = 8192;
  double low_freq_wavelen = old_context_len / low_freq_factor;
  double high_freq_wavelen = old_context_len / high_freq_factor;
  double wavelen = 2 * acos(-1.0) / freq;
  if (wavelen < high_freq_wavelen) return freq;
  if (wavelen > low_freq_wavelen) return freq / scale_factor;
  double smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
  return (1 - smooth) * freq / scale_factor + smooth * freq;
}

static double ref_freq(const dt_op_attrs *a, int64_t i, int64_t hd) {
  double theta = a->scalar != 0 ? a->scalar : 10000.0; /* the documented default */
  double f = 1.0 / pow(theta, (double)(2 * i) / (double)hd);
  return a->i0 ? direct_scaled_freq(f) : f;
}

/* x [b, s, h, hd] as complex pairs times polar(1, pos * freq), pos global */
static void ref_rope(const dt_op_attrs *a, const garr *x, garr *out) {
  *out = *x;
  int64_t B = x->sh[0], S = x->sh[1], H = x->sh[2], HD = x->sh[3];
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < S; t++)
      for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < HD / 2; i++) {
          int64_t e = ((b * S + t) * H + h) * HD + 2 * i;
          double ang = (double)t * ref_freq(a, i, HD), re = x->v[e], im = x->v[e + 1];
          out->v[e] = re * cos(ang) - im * sin(ang);
          out->v[e + 1] = re * sin(ang) + im * cos(ang);
        }
}

/* y = x with dims 1 and 2 swapped, sizes a x b x c x d -> a x c x b x d */
static void swap12_n(const double *x, double *y, int64_t A, int64_t Bn, int64_t C, int64_t D) {
  for (int64_t i = 0; i < A; i++)
    for (int64_t j = 0; j < Bn; j++)
      for (int64_t k = 0; k < C; k++)
        memcpy(y + ((i * C + k) * Bn + j) * D, x + ((i * Bn + j) * C + k) * D, sizeof *y * (size_t)D);
}

/* the same on a garr: [b, h, s, hd] <-> [b, s, h, hd] */
static void swap12(const garr *x, garr *y) {
  memset(y, 0, sizeof *y);
  y->ndim = 4;
  y->sh[0] = x->sh[0];
  y->sh[1] = x->sh[2];
  y->sh[2] = x->sh[1];
  y->sh[3] = x->sh[3];
  swap12_n(x->v, y->v, x->sh[0], x->sh[1], x->sh[2], x->sh[3]);
}

typedef enum top { T_SDPA, T_ROPE } top;

/* sdpa's layout 1 ([b, s, h, hd], attrs.i0) is checked through the layout-0
 * reference on the transposed tensors */
static void ref(top op, const dt_op_attrs *a, const garr *in, garr *out) {
  if (op == T_SDPA && a->i0 == 1) {
    garr t[3], o;
    for (int j = 0; j < 3; j++) swap12(&in[j], &t[j]);
    ref_sdpa(t, &o);
    swap12(&o, out);
  } else if (op == T_SDPA)
    ref_sdpa(in, out);
  else
    ref_rope(a, &in[0], out);
}

static const struct {
  const char *name;
  const dt_op *op;
  int n_in;
} OPS[2] = {{"sdpa", &dt_op_sdpa, 3}, {"rope", &dt_op_rope, 1}};

/* ---- per-rank helpers ---------------------------------------------------------------- */

typedef ot_rank rk;

static void shape_str(const garr *g, char *buf, size_t n) { ot_shape_str(g->ndim, g->sh, buf, n); }

static dt_status make(rk *R, const garr *g, const dt_placement *pl, dt_tensor *t) {
  return ot_make(R, DT_F64, g->ndim, g->sh, g->v, pl, t);
}

static bool check_full(rk *R, const char *what, const dt_tensor *t, const garr *want, double tol) {
  return ot_check_vals(R, what, t, want->ndim, want->sh, want->v, tol);
}

static void describe(rk *R, top op, const dt_op_attrs *a, const garr *in,
                     dt_placement pl[][DT_MAX_MESH_DIMS], char *what, size_t wn) {
  size_t k = (size_t)snprintf(what, wn, "%s on mesh %s", OPS[op].name, R->mlabel);
  for (int j = 0; j < OPS[op].n_in && k < wn; j++) {
    char ps[64], ss[64];
    dt_placements_str(R->m, pl[j], ps, sizeof ps);
    shape_str(&in[j], ss, sizeof ss);
    k += (size_t)snprintf(what + k, wn - k, "%s %s(%s)", j ? "," : "", ss, ps);
  }
  if (op == T_ROPE && k < wn) snprintf(what + k, wn - k, " theta %g scaling %d", a->scalar, a->i0);
  if (op == T_SDPA && k < wn) snprintf(what + k, wn - k, " layout %s", a->i0 ? "bshd" : "bhsd");
}

typedef struct call_res {
  dt_placement out_pl[DT_MAX_MESH_DIMS];
  size_t comms;
  bool ok;
} call_res;

static void run_case(rk *R, top op, const dt_op_attrs *a, const garr *in,
                     dt_placement pl[][DT_MAX_MESH_DIMS], call_res *res) {
  dt_ctx *ctx = R->ctx;
  int n = OPS[op].n_in;
  char what[320];
  describe(R, op, a, in, pl, what, sizeof what);
  memset(res, 0, sizeof *res);
  dt_tensor t[3], out;
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
  const dt_tensor *ip[3] = {&t[0], &t[1], &t[2]};
  dt_tensor *op_[1] = {&out};
  size_t before = dt_ledger_of(ctx)->n;
  dt_status s = dt_op_call(ctx, OPS[op].op, a, ip, op_, NULL);
  res->comms = dt_ledger_of(ctx)->n - before;
  if (s != DT_OK) {
    tu_fail(__FILE__, __LINE__, "%s, rank %d: dt_op_call -> %s: %s", what, ctx->rank,
            dt_status_str(s), dt_last_error(ctx));
    goto done;
  }
  for (int i = 0; i < R->m; i++) res->out_pl[i] = out.pl[i];
  garr want;
  ref(op, a, in, &want);
  res->ok = check_full(R, what, &out, &want, REL);
  dt_tensor_free(ctx, &out);
  R->cases++;
done:
  for (int j = 0; j < made; j++) dt_tensor_free(ctx, &t[j]);
}

/* ---- (a) sdpa values --------------------------------------------------------------------- */

typedef struct sdpa_cfg { int64_t b, h, kvh; } sdpa_cfg;
static const int64_t SQ = 5, HD = 4; /* sequence and head dim of every sdpa case */

/* q, k, v in layout 0 ([b, h, s, hd]) or 1 ([b, s, h, hd]) */
static void sdpa_inputs_l(const sdpa_cfg *c, garr *in, int layout) {
  gfill(&in[0], c->b, c->h, SQ, HD, 1);
  gfill(&in[1], c->b, c->kvh, SQ, HD, 2);
  gfill(&in[2], c->b, c->kvh, SQ, HD, 3);
  for (int j = 0; j < 3 && layout == 1; j++) {
    garr t = in[j];
    swap12(&t, &in[j]);
  }
}
static void sdpa_inputs(const sdpa_cfg *c, garr *in) { sdpa_inputs_l(c, in, 0); }

/* Every placement combination of (q, k, v) from {R, S(0), S(heads), P(sum)};
 * layout 1 puts the heads in dim 2 (its sequence dim 1 stays unsharded). */
static void sdpa_sweep(rk *R, int layout) {
  const dt_placement SH = dt_shard(layout ? 2 : 1);
  static const sdpa_cfg CFG[] = {{2, 8, 4}, {2, 8, 2}, {2, 8, 8}, {2, 6, 3}, {2, 6, 2}};
  dt_placement one[8][DT_MAX_MESH_DIMS];
  memset(one, 0, sizeof one);
  int n1;
  if (R->m == 1) {
    one[0][0] = dt_replicate();
    one[1][0] = dt_shard(0);
    one[2][0] = SH;
    one[3][0] = dt_partial(DT_RED_SUM);
    n1 = 4;
  } else {
    static const int P2[6][2] = {{0, 0}, {1, 2}, {2, 2}, {2, 1}, {3, 2}, {1, 0}}; /* R, S0, S1, P */
    for (int c = 0; c < 6; c++)
      for (int i = 0; i < 2; i++) {
        int k = P2[c][i];
        one[c][i] = k == 0 ? dt_replicate() : k == 1 ? dt_shard(0) : k == 2 ? SH : dt_partial(DT_RED_SUM);
      }
    n1 = 6;
  }
  dt_op_attrs a;
  memset(&a, 0, sizeof a);
  a.i0 = layout;
  call_res res;
  for (size_t c = 0; c < sizeof CFG / sizeof CFG[0]; c++) {
    garr in[3];
    sdpa_inputs_l(&CFG[c], in, layout);
    for (int x = 0; x < n1; x++)
      for (int y = 0; y < n1; y++)
        for (int z = 0; z < n1; z++) {
          dt_placement pl[3][DT_MAX_MESH_DIMS];
          memcpy(pl[0], one[x], sizeof pl[0]);
          memcpy(pl[1], one[y], sizeof pl[1]);
          memcpy(pl[2], one[z], sizeof pl[2]);
          run_case(R, T_SDPA, &a, in, pl, &res);
        }
  }
}

/* ---- (b) sdpa oracles ---------------------------------------------------------------------- */

static void expect(rk *R, const char *name, const call_res *res, bool zero_comms,
                   const dt_placement *want) {
  char got[64], exp_[64];
  dt_placements_str(R->m, res->out_pl, got, sizeof got);
  if (!res->ok) tu_fail(__FILE__, __LINE__, "oracle %s, rank %d: wrong values (above)", name, R->ctx->rank);
  if (zero_comms != (res->comms == 0))
    tu_fail(__FILE__, __LINE__, "oracle %s, rank %d: %zu ledger rows, expected %s", name, R->ctx->rank,
            res->comms, zero_comms ? "none" : "some");
  if (!want) return;
  dt_placements_str(R->m, want, exp_, sizeof exp_);
  for (int i = 0; i < R->m; i++)
    if (!dt_placement_eq(res->out_pl[i], want[i])) {
      tu_fail(__FILE__, __LINE__, "oracle %s, rank %d: output %s, expected %s", name, R->ctx->rank, got, exp_);
      break;
    }
}

/* p0, p1 in layout 0's terms; layout 1 moves S(1) (heads) to S(2). */
static void sdpa_oracle(rk *R, const char *name, sdpa_cfg c, dt_placement p0, dt_placement p1,
                        bool zero_comms, bool check_pl, int layout) {
  garr in[3];
  sdpa_inputs_l(&c, in, layout);
  const int hdim = layout ? 2 : 1;
  if (p0.kind == DT_PL_SHARD && p0.dim == 1) p0.dim = hdim;
  if (p1.kind == DT_PL_SHARD && p1.dim == 1) p1.dim = hdim;
  dt_placement pl[3][DT_MAX_MESH_DIMS];
  memset(pl, 0, sizeof pl);
  for (int j = 0; j < 3; j++) {
    pl[j][0] = p0;
    pl[j][1] = p1;
  }
  dt_op_attrs a;
  memset(&a, 0, sizeof a);
  a.i0 = layout;
  call_res res;
  run_case(R, T_SDPA, &a, in, pl, &res);
  expect(R, name, &res, zero_comms, check_pl ? pl[0] : NULL);
  /* whatever was chosen, its head shards divide both head counts */
  int64_t N = 1;
  for (int i = 0; i < R->m; i++)
    if (res.out_pl[i].kind == DT_PL_SHARD && res.out_pl[i].dim == hdim) N *= R->ms[i];
  TU_CHECK(c.h % N == 0 && c.kvh % N == 0, "oracle %s, rank %d: output split %lld heads over %lld shards",
           name, R->ctx->rank, (long long)c.kvh, (long long)N);
}

static void sdpa_oracles(rk *R, int layout) {
  const dt_placement Rp = dt_replicate(), S0 = dt_shard(0), S1 = dt_shard(1);
  if (R->m == 1) {
    sdpa_oracle(R, "heads S(1), h8 kvh4", (sdpa_cfg){2, 8, 4}, S1, Rp, true, true, layout);
    sdpa_oracle(R, "heads S(1), h8 kvh8", (sdpa_cfg){2, 8, 8}, S1, Rp, true, true, layout);
    sdpa_oracle(R, "batch S(0), b4", (sdpa_cfg){4, 8, 4}, S0, Rp, true, true, layout);
    /* b 5 on 4 ranks: chunks 2,2,1,0, the last rank's shard is empty */
    sdpa_oracle(R, "batch S(0), b5 (uneven, one empty shard)", (sdpa_cfg){5, 8, 4}, S0, Rp, true, true, layout);
    sdpa_oracle(R, "all R", (sdpa_cfg){2, 8, 4}, Rp, Rp, true, true, layout);
    /* kvh 2 on 4 ranks: not head-shardable, the inputs must move */
    sdpa_oracle(R, "heads S(1), h8 kvh2 (fallback)", (sdpa_cfg){2, 8, 2}, S1, Rp, false, false, layout);
    sdpa_oracle(R, "heads S(1), h6 kvh3 (fallback)", (sdpa_cfg){2, 6, 3}, S1, Rp, false, false, layout);
    sdpa_oracle(R, "heads S(1), h6 kvh2 (fallback)", (sdpa_cfg){2, 6, 2}, S1, Rp, false, false, layout);
  } else {
    sdpa_oracle(R, "(S(0),S(1)), h8 kvh4", (sdpa_cfg){2, 8, 4}, S0, S1, true, true, layout);
    sdpa_oracle(R, "(S(1),S(1)), h8 kvh4", (sdpa_cfg){2, 8, 4}, S1, S1, true, true, layout);
    sdpa_oracle(R, "(S(1),S(0)), h6 kvh2", (sdpa_cfg){2, 6, 2}, S1, S0, true, true, layout);
    sdpa_oracle(R, "(S(1),S(1)), h8 kvh2 (fallback)", (sdpa_cfg){2, 8, 2}, S1, S1, false, false, layout);
    sdpa_oracle(R, "(S(1),S(1)), h6 kvh3 (fallback)", (sdpa_cfg){2, 6, 3}, S1, S1, false, false, layout);
  }
}

/* ---- (c) rope values and oracles ----------------------------------------------------------- */

static const dt_op_attrs *rope_attrs(int k, dt_op_attrs *a) {
  memset(a, 0, sizeof *a);
  if (k >= 1) a->scalar = 500000.0; /* Llama 3's rope_theta */
  if (k == 2) a->i0 = 1;
  return a;
}

static void rope_sweep(rk *R) {
  garr x[1];
  gfill(&x[0], 2, 7, 3, 8, 4); /* s = 7: uneven on 4 ranks and on 2x2 nested */
  dt_placement set[7] = {dt_replicate(), dt_shard(0), dt_shard(1), dt_shard(2), dt_shard(3),
                         dt_partial(DT_RED_SUM), dt_partial(DT_RED_AVG)};
  int ns = R->m == 1 ? 7 : 6, total = R->m == 1 ? ns : ns * ns;
  dt_op_attrs a;
  call_res res;
  for (int k = 0; k < 3; k++)
    for (int c = 0; c < total; c++) {
      dt_placement pl[1][DT_MAX_MESH_DIMS];
      memset(pl, 0, sizeof pl);
      pl[0][0] = set[R->m == 1 ? c : c / ns];
      if (R->m > 1) pl[0][1] = set[c % ns];
      run_case(R, T_ROPE, rope_attrs(k, &a), x, pl, &res);
    }
  /* oracles: sequence shards and P(sum) pass through without communication */
  dt_placement pl[1][DT_MAX_MESH_DIMS];
  memset(pl, 0, sizeof pl);
  pl[0][0] = dt_shard(1);
  pl[0][1] = dt_shard(1);
  run_case(R, T_ROPE, rope_attrs(2, &a), x, pl, &res);
  expect(R, "rope S(1) (uneven)", &res, true, pl[0]);
  pl[0][0] = dt_partial(DT_RED_SUM);
  pl[0][1] = dt_shard(1);
  run_case(R, T_ROPE, rope_attrs(2, &a), x, pl, &res);
  expect(R, "rope P(sum)", &res, true, pl[0]);
  pl[0][0] = dt_shard(3);
  pl[0][1] = dt_replicate();
  run_case(R, T_ROPE, rope_attrs(2, &a), x, pl, &res);
  dt_placement want[DT_MAX_MESH_DIMS] = {dt_replicate(), dt_replicate()};
  expect(R, "rope S(3) (head dim goes to R)", &res, false, want);
}

/* ---- (d) the scaling rule ------------------------------------------------------------------- */

static void rope_scaling(rk *R) {
  dt_ctx *ctx = R->ctx;
  enum { HDS = 128 }; /* Llama 3 8B head dim: frequencies span all three regimes */
  garr x;
  memset(&x, 0, sizeof x);
  x.ndim = 4;
  x.sh[0] = 1;
  x.sh[1] = 2;
  x.sh[2] = 1;
  x.sh[3] = HDS;
  for (int i = 0; i < HDS / 2; i++) x.v[HDS + 2 * i] = x.v[2 * i] = 1.0; /* (1, 0) pairs */
  dt_placement pl[DT_MAX_MESH_DIMS] = {dt_replicate(), dt_replicate()};
  int regimes[3] = {0, 0, 0};
  for (int sc = 0; sc < 2; sc++) {
    dt_op_attrs a;
    memset(&a, 0, sizeof a);
    a.scalar = 500000.0;
    a.i0 = sc;
    dt_tensor t, y;
    dt_array full;
    dt_status s;
    if ((s = make(R, &x, pl, &t)) != DT_OK) {
      tu_fail(__FILE__, __LINE__, "scaling, rank %d: %s", ctx->rank, dt_last_error(ctx));
      return;
    }
    const dt_tensor *ip[1] = {&t};
    dt_tensor *op_[1] = {&y};
    s = dt_op_call(ctx, &dt_op_rope, &a, ip, op_, NULL);
    dt_tensor_free(ctx, &t);
    if (s != DT_OK) {
      tu_fail(__FILE__, __LINE__, "scaling, rank %d: %s", ctx->rank, dt_last_error(ctx));
      return;
    }
    s = dt_tensor_full(ctx, &y, &full);
    dt_tensor_free(ctx, &y);
    if (s != DT_OK) {
      tu_fail(__FILE__, __LINE__, "scaling, rank %d: %s", ctx->rank, dt_last_error(ctx));
      return;
    }
    const double *v = full.data;
    static const int IDX[] = {0, 1, 20, 28, 29, 31, 34, 35, 40, 63}; /* 29..34: medium */
    for (size_t k = 0; k < sizeof IDX / sizeof IDX[0]; k++) {
      int i = IDX[k];
      /* position 1: the angle is the frequency itself (<= 1 < pi, so atan2 recovers it) */
      double got = atan2(v[HDS + 2 * i + 1], v[HDS + 2 * i]);
      double f = pow(500000.0, -2.0 * i / HDS), want = sc ? direct_scaled_freq(f) : f;
      /* 1e-12 relative: atan2/cos/sin are accurate to a few ulps */
      TU_CHECK(fabs(got - want) <= 1e-12 * want, "scaling %d, rank %d: freq %d is %.17g, expected %.17g",
               sc, ctx->rank, i, got, want);
      if (sc) {
        double wl = 2 * acos(-1.0) / f;
        regimes[wl < 2048 ? 0 : wl > 8192 ? 2 : 1]++;
        if (wl < 2048) TU_CHECK(fabs(got - f) <= 1e-12 * f, "high freq %d must be unchanged", i);
        if (wl > 8192) TU_CHECK(fabs(got - f / 8) <= 1e-12 * f, "low freq %d must be divided by 8", i);
        if (wl >= 2048 && wl <= 8192)
          TU_CHECK(got > f / 8 && got < f, "medium freq %d must lie between f/8 and f", i);
      }
      /* position 0 is unrotated */
      TU_CHECK(v[2 * i] == 1.0 && v[2 * i + 1] == 0.0, "rank %d: position 0 was rotated", ctx->rank);
    }
    dt_array_free(ctx, &full);
    R->cases++;
  }
  TU_CHECK(regimes[0] && regimes[1] && regimes[2], "rank %d: the indices miss a regime (%d %d %d)",
           ctx->rank, regimes[0], regimes[1], regimes[2]);
}

/* ---- (e) gradients ------------------------------------------------------------------------ */

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
  char what[320];
  describe(R, op, a, in, pl, what, sizeof what);
  garr G;
  {
    garr out;
    ref(op, a, in, &out);
    gfill(&G, out.sh[0], out.sh[1], out.sh[2], out.sh[3], 9);
  }
  ot_arr ia[3], ga = {G.ndim, G.sh, G.v};
  for (int j = 0; j < n; j++) ia[j] = (ot_arr){in[j].ndim, in[j].sh, in[j].v};
  loss_arg la = {op, a, in, &G};
  ot_grad_check(R, what, OPS[op].op, a, n, ia, pl, &ga, loss_cb, &la, FD_H, FD_TOL);
}

static void grads(rk *R) {
  const dt_placement Rp = dt_replicate(), S0 = dt_shard(0), S1 = dt_shard(1), P = dt_partial(DT_RED_SUM);
  dt_op_attrs a;
  memset(&a, 0, sizeof a);
  /* sdpa: per case the config and (q, k, v) placements on mesh dims 0 and 1 */
  static const struct { sdpa_cfg c; int p[3][2]; } SC[] = {
      {{2, 8, 4}, {{0, 0}, {0, 0}, {0, 0}}}, /* R */
      {{2, 8, 4}, {{2, 2}, {2, 2}, {2, 2}}}, /* heads (2x2: both mesh dims) */
      {{4, 8, 2}, {{1, 2}, {1, 2}, {1, 2}}}, /* batch (1-D); batch x heads (2x2) */
      {{2, 8, 2}, {{2, 0}, {2, 0}, {2, 0}}}, /* heads, kvh 2 */
      {{2, 8, 4}, {{2, 3}, {0, 1}, {3, 0}}}, /* mixed with P(sum) */
      {{2, 6, 3}, {{2, 2}, {2, 2}, {2, 2}}}, /* h 6: not head-shardable on 4 */
      {{5, 8, 4}, {{1, 1}, {1, 1}, {1, 1}}}, /* batch 5: uneven, an empty shard on 4 */
  };
  const dt_placement K[4] = {Rp, S0, S1, P};
  int nsc = R->ms[0] == 1 ? 2 : (int)(sizeof SC / sizeof SC[0]);
  for (int c = 0; c < nsc; c++) {
    garr in[3];
    sdpa_inputs(&SC[c].c, in);
    dt_placement pl[3][DT_MAX_MESH_DIMS];
    memset(pl, 0, sizeof pl);
    for (int j = 0; j < 3; j++)
      for (int i = 0; i < R->m; i++) pl[j][i] = K[SC[c].p[j][i]];
    grad_case(R, T_SDPA, &a, in, pl);
  }
  /* layout 1 ([b, s, h, hd]): heads (S(2)), batch x heads, P(sum) mixed */
  static const struct { sdpa_cfg c; int p[3][2]; } SL[] = {
      {{2, 8, 4}, {{2, 2}, {2, 2}, {2, 2}}},
      {{4, 8, 2}, {{1, 2}, {1, 2}, {1, 2}}},
      {{2, 8, 4}, {{2, 3}, {0, 1}, {3, 0}}},
  };
  const dt_placement KL[4] = {Rp, S0, dt_shard(2), P};
  a.i0 = 1;
  for (int c = 0; c < (R->ms[0] == 1 ? 1 : 3); c++) {
    garr in[3];
    sdpa_inputs_l(&SL[c].c, in, 1);
    dt_placement pl[3][DT_MAX_MESH_DIMS];
    memset(pl, 0, sizeof pl);
    for (int j = 0; j < 3; j++)
      for (int i = 0; i < R->m; i++) pl[j][i] = KL[SL[c].p[j][i]];
    grad_case(R, T_SDPA, &a, in, pl);
  }
  a.i0 = 0;
  /* rope */
  garr x[1];
  gfill(&x[0], 2, 7, 3, 8, 5);
  static const int RP[][2] = {{0, 0}, {2, 2}, {1, 2}, {3, 2}, {4, 0}};
  const dt_placement K2[5] = {Rp, S0, S1, P, dt_shard(3)};
  int nrp = R->ms[0] == 1 ? 1 : (int)(sizeof RP / sizeof RP[0]);
  for (int k = 0; k < 3; k++)
    for (int c = 0; c < nrp; c++) {
      dt_placement pl[1][DT_MAX_MESH_DIMS];
      memset(pl, 0, sizeof pl);
      for (int i = 0; i < R->m; i++) pl[0][i] = K2[RP[c][i]];
      grad_case(R, T_ROPE, rope_attrs(k, &a), x, pl);
    }
}

/* ---- f32 kernels ----------------------------------------------------------------------------- */

/* f32 tolerance: inputs are rounded to f32 once (the reference sees the same
 * rounded values); the kernels accumulate in double and round the result
 * once, so outputs agree to ~1 f32 ulp (6e-8); 1e-6 relative (floor 1) still
 * catches any indexing or strategy error (O(0.1)). */
static const double F32_TOL = 1e-6;

static void f32_case(rk *R, top op, const dt_op_attrs *a, garr *in, dt_placement pl[][DT_MAX_MESH_DIMS]) {
  dt_ctx *ctx = R->ctx;
  int n = OPS[op].n_in;
  float fb[3][MAXN];
  dt_tensor t[3], out;
  int made = 0;
  dt_status s = DT_OK;
  for (int j = 0; j < n; j++) {
    for (int64_t i = 0; i < numel(&in[j]); i++) {
      fb[j][i] = (float)in[j].v[i];
      in[j].v[i] = (double)fb[j][i];
    }
    DT_CHECK_GOTO(ot_make(R, DT_F32, 4, in[j].sh, fb[j], pl[j], &t[j]), s, fail);
    made++;
  }
  const dt_tensor *ip[3] = {&t[0], &t[1], &t[2]};
  dt_tensor *o[1] = {&out};
  DT_CHECK_GOTO(dt_op_call(ctx, OPS[op].op, a, ip, o, NULL), s, fail);
  garr want;
  ref(op, a, in, &want);
  char what[96];
  snprintf(what, sizeof what, "f32 %s on mesh %s", OPS[op].name, R->mlabel);
  ot_check_vals_dt(R, what, &out, DT_F32, want.ndim, want.sh, want.v, F32_TOL);
  dt_tensor_free(ctx, &out);
  R->cases++;
fail:
  if (s != DT_OK)
    tu_fail(__FILE__, __LINE__, "f32 %s on mesh %s, rank %d: %s: %s", OPS[op].name, R->mlabel,
            ctx->rank, dt_status_str(s), dt_last_error(ctx));
  for (int j = 0; j < made; j++) dt_tensor_free(ctx, &t[j]);
}

static void f32_checks(rk *R) {
  dt_op_attrs a;
  garr in[3];
  dt_placement pl[3][DT_MAX_MESH_DIMS];
  memset(pl, 0, sizeof pl);
  for (int j = 0; j < 3; j++) pl[j][0] = dt_shard(1);
  sdpa_inputs(&(sdpa_cfg){2, 8, 4}, in);
  memset(&a, 0, sizeof a);
  f32_case(R, T_SDPA, &a, in, pl);
  sdpa_inputs_l(&(sdpa_cfg){2, 8, 4}, in, 1);
  for (int j = 0; j < 3; j++) pl[j][0] = dt_shard(2);
  a.i0 = 1;
  f32_case(R, T_SDPA, &a, in, pl);
  a.i0 = 0;
  for (int j = 0; j < 3; j++) pl[j][0] = dt_shard(1);
  gfill(&in[0], 2, 7, 3, 8, 4);
  f32_case(R, T_ROPE, rope_attrs(2, &a), in, pl);
}

/* ---- (g) long sequences: the blocked kernels --------------------------------------------- */

/* Naive causal attention and its gradients in double on [b, h, s, hd] arrays
 * (repeat_kv heads): out, and dq, dk, dv for loss = sum(out * dO), straight
 * from the formulas (dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(dP P)),
 * dQ = dS K / sqrt(hd), dK = dS^T Q / sqrt(hd)), no blocking. */
typedef struct lsz { int64_t B, H, KVH, S, HD; } lsz;

static void naive_attn(const lsz *z, const double *q, const double *k, const double *v,
                       const double *dO, double *out, double *dq, double *dk, double *dv) {
  const int64_t S = z->S, D = z->HD, grp = z->H / z->KVH;
  const double sc = 1.0 / sqrt((double)D);
  double *P = malloc(sizeof *P * (size_t)(S * S)), *dP = malloc(sizeof *dP * (size_t)(S * S));
  if (!P || !dP) {
    tu_fail(__FILE__, __LINE__, "naive_attn: out of memory");
    free(P);
    free(dP);
    return;
  }
  memset(dk, 0, sizeof *dk * (size_t)(z->B * z->KVH * S * D));
  memset(dv, 0, sizeof *dv * (size_t)(z->B * z->KVH * S * D));
  for (int64_t b = 0; b < z->B; b++)
    for (int64_t h = 0; h < z->H; h++) {
      const int64_t qo = (b * z->H + h) * S * D, ko = (b * z->KVH + h / grp) * S * D;
      for (int64_t i = 0; i < S; i++) {
        double mx = -INFINITY, zs = 0;
        for (int64_t j = 0; j <= i; j++) {
          double d = 0;
          for (int64_t e = 0; e < D; e++) d += q[qo + i * D + e] * k[ko + j * D + e];
          P[i * S + j] = d * sc;
          mx = fmax(mx, P[i * S + j]);
        }
        for (int64_t j = 0; j <= i; j++) zs += exp(P[i * S + j] - mx);
        for (int64_t j = 0; j <= i; j++) P[i * S + j] = exp(P[i * S + j] - mx) / zs;
        for (int64_t e = 0; e < D; e++) {
          double acc = 0;
          for (int64_t j = 0; j <= i; j++) acc += P[i * S + j] * v[ko + j * D + e];
          out[qo + i * D + e] = acc;
        }
        double rs = 0;
        for (int64_t j = 0; j <= i; j++) {
          double d = 0;
          for (int64_t e = 0; e < D; e++) d += dO[qo + i * D + e] * v[ko + j * D + e];
          dP[i * S + j] = d;
          rs += d * P[i * S + j];
        }
        for (int64_t j = 0; j <= i; j++) dP[i * S + j] = P[i * S + j] * (dP[i * S + j] - rs);
      }
      for (int64_t i = 0; i < S; i++)
        for (int64_t e = 0; e < D; e++) {
          double aq = 0, ak = 0, av = 0;
          for (int64_t j = 0; j <= i; j++) aq += dP[i * S + j] * k[ko + j * D + e];
          for (int64_t r = i; r < S; r++) { /* key i is seen by queries r >= i */
            ak += dP[r * S + i] * q[qo + r * D + e];
            av += P[r * S + i] * dO[qo + r * D + e];
          }
          dq[qo + i * D + e] = aq * sc;
          dk[ko + i * D + e] += ak * sc;
          dv[ko + i * D + e] += av;
        }
    }
  free(P);
  free(dP);
}

/* sdpa and its backward at S = 150 (blocks of 64, 64, 22 query rows), h 4,
 * kvh 2, hd 8, in dtype dt and layout 0 or 1, heads sharded on mesh dim 0
 * when they divide (else the dispatcher moves them), against naive_attn on
 * the same (dtype-rounded) inputs. Tolerances: f64 1e-12 (sums of <= 150
 * terms of O(1) in another order: ~1e-14); f32 2e-5 relative, floor 1
 * (products of 150-term f32 GEMMs, exp within 2 ulps: a few 1e-6 at most; a
 * block boundary or row offset error is O(0.1)). */
static void long_case(rk *R, dt_dtype dt, int layout) {
  dt_ctx *ctx = R->ctx;
  const lsz z = {1, 4, 2, 150, 8};
  const int64_t nq = z.B * z.H * z.S * z.HD, nk = z.B * z.KVH * z.S * z.HD;
  /* 16 arrays below: 8 of q's size and 8 of k's */
  double *buf = calloc((size_t)(8 * nq + 8 * nk), sizeof *buf);
  float *fb = calloc((size_t)(2 * nq + 2 * nk), sizeof *fb); /* q, k, v, dO in f32 */
  if (!buf || !fb) {
    tu_fail(__FILE__, __LINE__, "long_case: out of memory");
    free(buf);
    free(fb);
    return;
  }
  /* bhsd inputs q, k, v, dO; their layout-l copies; the expected out, dq, dk, dv */
  double *q = buf, *k = q + nq, *v = k + nk, *dO = v + nk;
  double *lq = dO + nq, *lk = lq + nq, *lv = lk + nk, *ldo = lv + nk;
  double *out = ldo + nq, *dq = out + nq, *dk = dq + nq, *dv = dk + nk;
  double *lout = dv + nk, *ldq = lout + nq, *ldk = ldq + nq, *ldv = ldk + nk;
  double *src[4] = {q, k, v, dO};
  const int64_t cnt[4] = {nq, nk, nk, nq};
  for (int j = 0; j < 4; j++)
    for (int64_t i = 0; i < cnt[j]; i++) {
      double x = sin(0.37 * (double)i + 1.3 * (j + 1)) * cos(0.011 * (double)i * (j + 2));
      src[j][i] = dt == DT_F32 ? (double)(float)x : x;
    }
  naive_attn(&z, q, k, v, dO, out, dq, dk, dv);
  double *dst[8] = {lq, lk, lv, ldo, lout, ldq, ldk, ldv};
  const double *from[8] = {q, k, v, dO, out, dq, dk, dv};
  const int64_t heads[8] = {z.H, z.KVH, z.KVH, z.H, z.H, z.H, z.KVH, z.KVH};
  for (int j = 0; j < 8; j++) {
    if (layout) swap12_n(from[j], dst[j], z.B, heads[j], z.S, z.HD);
    else memcpy(dst[j], from[j], sizeof *dst[j] * (size_t)(heads[j] * z.B * z.S * z.HD));
  }
  int64_t shq[4] = {z.B, layout ? z.S : z.H, layout ? z.H : z.S, z.HD};
  int64_t shk[4] = {z.B, layout ? z.S : z.KVH, layout ? z.KVH : z.S, z.HD};
  const int hdim = layout ? 2 : 1;
  dt_placement pl[DT_MAX_MESH_DIMS];
  memset(pl, 0, sizeof pl);
  for (int i = 0; i < R->m; i++) pl[i] = i == 0 ? dt_shard(hdim) : dt_replicate();
  char what[96];
  snprintf(what, sizeof what, "sdpa s=150 %s layout %s on mesh %s", dt_dtype_name(dt),
           layout ? "bshd" : "bhsd", R->mlabel);
  dt_tensor t[4], o, g[3];
  int made = 0;
  dt_status s = DT_OK;
  const double *vals[4] = {lq, lk, lv, ldo};
  float *f = fb;
  for (int j = 0; j < 4 && s == DT_OK; j++) {
    const void *data = vals[j];
    if (dt == DT_F32) {
      for (int64_t i = 0; i < cnt[j]; i++) f[i] = (float)vals[j][i];
      data = f;
      f += cnt[j];
    }
    s = ot_make(R, dt, 4, j == 1 || j == 2 ? shk : shq, data, pl, &t[j]);
    if (s == DT_OK) made++;
  }
  dt_op_attrs a;
  memset(&a, 0, sizeof a);
  a.i0 = layout;
  const dt_tensor *in[3] = {&t[0], &t[1], &t[2]}, *go[1] = {&t[3]};
  dt_tensor *op_[1] = {&o}, *gi[3] = {&g[0], &g[1], &g[2]};
  if (s == DT_OK) s = dt_op_call(ctx, &dt_op_sdpa, &a, in, op_, NULL);
  if (s == DT_OK) {
    const dt_tensor *ov[1] = {&o};
    s = dt_op_sdpa.backward(ctx, &a, in, ov, go, gi);
    if (s == DT_OK) {
      const dt_tensor *got[4] = {&o, &g[0], &g[1], &g[2]};
      const double *want[4] = {lout, ldq, ldk, ldv};
      static const char *const NM[4] = {"out", "dq", "dk", "dv"};
      const double tol = dt == DT_F32 ? 2e-5 : 1e-12;
      for (int j = 0; j < 4; j++) {
        char wj[128];
        snprintf(wj, sizeof wj, "%s: %s", what, NM[j]);
        ot_check_vals_dt(R, wj, got[j], dt, 4, j == 0 || j == 1 ? shq : shk, want[j], tol);
      }
      for (int j = 0; j < 3; j++) dt_tensor_free(ctx, &g[j]);
    }
    dt_tensor_free(ctx, &o);
  }
    if (s != DT_OK)
    tu_fail(__FILE__, __LINE__, "%s, rank %d: %s: %s", what, ctx->rank, dt_status_str(s), dt_last_error(ctx));
  for (int j = 0; j < made; j++) dt_tensor_free(ctx, &t[j]);
  free(buf);
  free(fb);
  R->cases++;
}

static void long_checks(rk *R) {
  for (int layout = 0; layout < 2; layout++) {
    long_case(R, DT_F64, layout);
    long_case(R, DT_F32, layout);
  }
}

/* A layout other than 0 or 1 is refused with a message naming it. */
static void bad_layout(rk *R) {
  garr in[3];
  sdpa_inputs(&(sdpa_cfg){2, 8, 4}, in);
  dt_placement pl[DT_MAX_MESH_DIMS];
  memset(pl, 0, sizeof pl);
  for (int i = 0; i < R->m; i++) pl[i] = dt_replicate();
  dt_tensor t[3], out;
  for (int j = 0; j < 3; j++)
    if (make(R, &in[j], pl, &t[j]) != DT_OK) {
      tu_fail(__FILE__, __LINE__, "rank %d: distribute for the bad-layout case", R->ctx->rank);
      for (int k = 0; k < j; k++) dt_tensor_free(R->ctx, &t[k]);
      return;
    }
  dt_op_attrs a;
  memset(&a, 0, sizeof a);
  a.i0 = 2;
  const dt_tensor *ip[3] = {&t[0], &t[1], &t[2]};
  dt_tensor *op_[1] = {&out};
  dt_status s = dt_op_call(R->ctx, &dt_op_sdpa, &a, ip, op_, NULL);
  TU_CHECK(s == DT_ERR_INVALID && strstr(dt_last_error(R->ctx), "layout"),
           "rank %d: sdpa layout 2 -> %s (%s), expected an invalid-layout error", R->ctx->rank,
           dt_status_str(s), dt_last_error(R->ctx));
  if (s == DT_OK) dt_tensor_free(R->ctx, &out);
  for (int j = 0; j < 3; j++) dt_tensor_free(R->ctx, &t[j]);
}

/* ---- jobs ------------------------------------------------------------------------------- */

typedef struct mesh_job {
  const char *label;
  int ndim;
  int shape[DT_MAX_MESH_DIMS];
  bool values;
  long cases; /* rank 0's count */
} mesh_job;

static dt_status body(dt_ctx *ctx, void *arg) {
  mesh_job *J = arg;
  rk R;
  dt_status s = ot_rank_open(&R, ctx, J->label, J->ndim, J->shape);
  if (s != DT_OK) return s;
  size_t mem0 = ctx->mem.host_cur;
  if (J->values) {
    for (int layout = 0; layout < 2; layout++) {
      sdpa_sweep(&R, layout);
      sdpa_oracles(&R, layout);
    }
    rope_sweep(&R);
    rope_scaling(&R);
    f32_checks(&R);
    bad_layout(&R);
  }
  long_checks(&R);
  grads(&R);
  ot_rank_close(&R, mem0); /* every output, gradient and temporary of the ops was freed */
  if (ctx->rank == 0) J->cases = R.cases;
  return DT_OK;
}

int main(int argc, char **argv) {
  tu_opts o;
  tu_parse(argc, argv, &o);
  if (o.backend != DT_BACKEND_THREADS) {
    printf("SKIP: test_ops_attention runs on the threads backend only\n");
    return SB_SKIP;
  }
  dt_device_cpu_blas_threads(1);
  mesh_job jobs[] = {
      {"(4)", 1, {4}, true, 0},
      {"(2,2)", 2, {2, 2}, true, 0},
      {"(1)", 1, {1}, false, 0},
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
  return tu_finish("test_ops_attention");
}
