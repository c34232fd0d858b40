/* lib/ops/attention.c: rotary position embedding (rope) and causal scaled dot
 * product attention with grouped KV heads (sdpa) on DTensors (PyTorch's
 * torch/distributed/tensor/_ops/_matrix_ops.py:
 * scaled_dot_product_flash_attention_strategy and the efficient / cudnn ones;
 * torchtitan/models/llama3/model/model.py: Attention, precompute_freqs_cis,
 * apply_rotary_emb, repeat_kv).
 *
 * rope: x [b, s, h, hd] (hd even), interleaved pairs (x[.., 2i], x[.., 2i+1])
 *   rotated by pos * freq_i, freq_i = theta^(-2i/hd) (TorchTitan's
 *   precompute_freqs_cis + apply_rotary_emb, complex form on adjacent
 *   elements). attrs.scalar = theta (0 means 10000, TorchTitan's ModelArgs
 *   default rope_theta; Llama 3 passes 500000), attrs.i0 = 1 applies the
 *   Llama 3.1 frequency scaling (scale 8, low_freq_factor 1, high_freq_factor
 *   4, original context 8192). Positions are GLOBAL sequence positions: a
 *   shard of the sequence dim (S(1), nested or uneven) starts at its goffset[1]
 *   (TorchTitan slices freqs_cis with the local seqlen instead, which is only
 *   right for the first shard). attrs.i1 = the sequence's storage order under
 *   context parallel (dt_seq_position's n_chunks: 0 or 1 natural, 2 cp the
 *   head-tail order; even and dividing s when > 1): stored index t is at
 *   position dt_seq_position(t, s, i1), as TorchTitan permutes freqs_cis with
 *   the inputs (torch/distributed/tensor/experimental/_attention.py:
 *   _context_parallel_buffers).
 *   Strategy (per mesh dim, one option and an all-R fallback): the output
 *   follows x. Shards of b, s or h are kept (the rotation is per element pair,
 *   with the position read from the offset); a Shard of hd goes to R (a pair or
 *   its frequency index could straddle shards); rope is linear in x, so
 *   P(sum) and P(avg) pass through unreduced; P(max) / P(min) go to R (a
 *   rotation does not commute with max). Backward: the private op rope_bwd,
 *   the same rotation by -angle (the transpose of a rotation), same strategy.
 *   Kernel: the rows.rope slot of x's device (angles in f64; the CPU takes
 *   f32 and f64, the GPU builds bf16 too).
 *
 * sdpa: q [b, h, s, hd], k and v [b, kvh, s, hd] (h % kvh == 0; query head i
 *   uses kv head i / (h / kvh), TorchTitan's repeat_kv), causal (query i sees
 *   keys j <= i; the sequence dim is never sharded here), scale 1/sqrt(hd).
 *   attrs.i0 = 1 takes q, k, v and gives the output as [b, s, h, hd] instead
 *   (flash-attn's layout, the one the projections produce): the model then
 *   needs no transposes around attention, and the heads dim below is 2, not 1.
 *   Strategy: per mesh dim the three options of PyTorch's flash / efficient
 *   strategies: all R, head sharding S(1) on q, k, v and the output, batch
 *   sharding S(0) on all; expanded over the mesh, then a candidate is dropped
 *   when its head shards N (product of the mesh sizes sharding dim 1) do not
 *   divide both h and kvh: only then are the local q heads [k h/N, (k+1) h/N)
 *   exactly those that use the local kv heads [k kvh/N, (k+1) kvh/N). Partial
 *   inputs are never kept: the cost model picks R or a Shard target for them
 *   (all-reduce or reduce-scatter). The all-R candidate always survives.
 *   attrs.i2 = query rows per block (0: the device's attn.block_rows, 64 on
 *   the CPU, up to 256 on CUDA), for tuning and tests; results do not depend
 *   on it beyond rounding.
 *   Kernel per (batch, head) and block of query rows (keys up to the
 *   block's last row only: causal blocks skip what they cannot see): GEMMs on
 *   the strided head in place (no copies in either layout), the device's
 *   max-subtracted row softmax between them. This is the query-chunked attention of
 *   Rabe & Staats, "Self-attention does not need O(n^2) memory" (2021), sec.
 *   2-3: the scores of one block of rows exist at a time, never S x S.
 *   Backward: one private op on (q, k, v, dout) with the same strategy,
 *   sdpa_bwd -> (dq, dk, dv), recomputing P once per head (as flash attention
 *   does; nothing S x S is kept from the forward): dV = P^T dO, dP = dO V^T,
 *   dS = P (dP - rowsum(dP P)), dQ = dS K scale, dK = dS^T Q scale, dK and dV
 *   summed over a group's heads.
 *
 * Kernels: one composition on every device (the arrays' kind picks the
 *   device, dt_device_kernels): the blocks, batched over kv heads as the
 *   device's attn table says, through dt_device_gemm and its attn kernels
 *   (lib/device/kernels.h; see sdpa_blk_get below), scratch in the arrays'
 *   memory. f32 and f64 everywhere; bf16 on CUDA (host bf16 arrays reach the
 *   kernel as f32, through the dispatcher).
 * What it is not: sequence-sharded attention (that is sdpa_cp, attention_cp.c), dropout,
 * non-causal masks, rotate-half rope, a flash (online-softmax) kernel: a
 * block's scores over all its keys are materialised (BQ x S).
 */
#include "config.h"

#include <math.h>
#include <string.h>

#include "device/device.h"
#include "device/kernels.h"
#include "ops/ops.h"
#include "ops/attention_impl.h"

/* ---- shared helpers ---------------------------------------------------------------- */

static dt_status check_float(dt_ctx *ctx, const char *name, int j, dt_dtype t) {
  if (t != DT_F32 && t != DT_F64)
    return dt_error(ctx, DT_ERR_UNSUPPORTED, name, "input %d is %s; only f32 and f64 are supported",
                    j, dt_dtype_name(t));
  return DT_OK;
}

dt_status dt_attn_zeros_like(dt_ctx *ctx, const dt_tensor *x, dt_tensor *out) {
  dt_op_attrs z;
  memset(&z, 0, sizeof z); /* scale by 0 */
  const dt_tensor *i1[1] = {x};
  dt_tensor *o1[1] = {out};
  return dt_op_call(ctx, &dt_op_scale, &z, i1, o1, NULL);
}

/* ---- rope --------------------------------------------------------------------------- */

/* TorchTitan's ModelArgs default rope_theta, used when attrs.scalar is 0 */
static const double ROPE_THETA_DEFAULT = 10000.0;

static dt_status rope_infer(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in, dt_spec *out) {
  if (in[0].dtype != DT_BF16) DT_CHECK(check_float(ctx, "rope", 0, in[0].dtype)); /* bf16: device */
  if (in[0].ndim != 4)
    return dt_error(ctx, DT_ERR_INVALID, "rope", "x must be [b, s, h, hd]; it has %d dims", in[0].ndim);
  if (in[0].gshape[3] % 2)
    return dt_error(ctx, DT_ERR_INVALID, "rope", "head dim %lld is odd", (long long)in[0].gshape[3]);
  if (a->i0 != 0 && a->i0 != 1)
    return dt_error(ctx, DT_ERR_INVALID, "rope", "i0 (scaling) must be 0 or 1, not %d", a->i0);
  if (!(a->scalar >= 0) || !isfinite(a->scalar))
    return dt_error(ctx, DT_ERR_INVALID, "rope", "theta %g (must be > 0; 0: the default)", a->scalar);
  if (a->i1 < 0 || (a->i1 > 1 && (a->i1 % 2 || in[0].gshape[1] % a->i1)))
    return dt_error(ctx, DT_ERR_INVALID, "rope",
                    "storage order (i1) %d: 0 or 1 (natural) or an even chunk count dividing the "
                    "sequence %lld", a->i1, (long long)in[0].gshape[1]);
  *out = in[0];
  return DT_OK;
}

static dt_status rope_options(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in,
                              const dt_spec *out, int mesh_dim, dt_dim_option *opt, int *n, int max) {
  (void)a;
  (void)out;
  if (max < 2) return dt_error(ctx, DT_ERR_INTERNAL, "rope", "no room for options");
  dt_placement p = in[0].pl[mesh_dim];
  if (p.kind == DT_PL_SHARD && p.dim == 3) p = dt_replicate();
  if (p.kind == DT_PL_PARTIAL && p.op != DT_RED_SUM && p.op != DT_RED_AVG) p = dt_replicate();
  memset(opt, 0, 2 * sizeof *opt);
  opt[0].in[0] = opt[0].out[0] = p;
  *n = 1;
  if (p.kind != DT_PL_REPLICATE) { /* all-R fallback when p's Shard is unshardable */
    opt[1].in[0] = opt[1].out[0] = dt_replicate();
    *n = 2;
  }
  return DT_OK;
}

static dt_status rope_run(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                          dt_tensor *const *out, double sign) {
  const dt_array *x = &in[0]->local;
  dt_array *y = &out[0]->local;
  if (x->ndim != 4 || y->numel != x->numel)
    return dt_error(ctx, DT_ERR_INTERNAL, "rope", "local shapes do not match");
  int64_t B = x->shape[0], S = x->shape[1], H = x->shape[2], HD = x->shape[3];
  int64_t ghd = in[0]->gshape[3], gs = in[0]->gshape[1], pos0 = in[0]->goffset[1];
  if (HD != ghd) return dt_error(ctx, DT_ERR_INTERNAL, "rope", "head dim is sharded");
  dt_kdev kd; /* the angles in f64 on x's device, from the same attrs */
  DT_CHECK(dt_device_kernels(ctx, x->dev, "rope", &kd));
  DT_OP_KSLOT(ctx, "rope", kd.k->rows, rope);
  dt_op_kledger(ctx, "rope", x->dtype, 3, x->numel, x->numel, x->numel);
  dt_kern_rope_args ra = {B, S, H, HD, pos0, gs, a->i1, a->i0,
                          a->scalar != 0 ? a->scalar : ROPE_THETA_DEFAULT, sign};
  return kd.k->rows->rope(kd.dev, x->dtype, &ra, x->data, y->data);
}

static dt_status rope_kernel(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                             dt_tensor *const *out) {
  return rope_run(ctx, a, in, out, 1.0);
}
static dt_status rope_bwd_kernel(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                                 dt_tensor *const *out) {
  return rope_run(ctx, a, in, out, -1.0);
}

/* rope_bwd(dy) = dy rotated by -angle; same attrs, shapes and strategy as rope. */
static const dt_op op_rope_bwd = {.name = "rope_bwd", .n_in = 1, .n_out = 1, .infer = rope_infer,
                                  .options = rope_options, .kernel = rope_bwd_kernel};

static dt_status rope_backward(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                               const dt_tensor *const *out, const dt_tensor *const *gout,
                               dt_tensor *const *gin) {
  (void)out;
  if (!gin[0]) return DT_OK;
  if (!gout[0]) return dt_attn_zeros_like(ctx, in[0], gin[0]);
  const dt_tensor *i1[1] = {gout[0]};
  return dt_op_call(ctx, &op_rope_bwd, a, i1, gin, NULL);
}

/* ---- sdpa ------------------------------------------------------------------------- */

dt_status dt_attn_layout(dt_ctx *ctx, const char *name, const dt_op_attrs *a, int *hdim, int *sdim) {
  int l = a ? a->i0 : DT_ATTN_BHSD;
  if (l != DT_ATTN_BHSD && l != DT_ATTN_BSHD)
    return dt_error(ctx, DT_ERR_INVALID, name, "layout (i0) %d: 0 is [b, h, s, hd], 1 is [b, s, h, hd]", l);
  *hdim = l == DT_ATTN_BSHD ? 2 : 1;
  *sdim = l == DT_ATTN_BSHD ? 1 : 2;
  return DT_OK;
}

/* Checks q, k, v (and, with dout, dout like q): 4-d, one float dtype, k like v,
 * q like k but in heads, q heads a multiple of kv heads. */
static dt_status sdpa_check(dt_ctx *ctx, const char *name, const dt_op_attrs *a, const dt_spec *in,
                            int n) {
  static const char *const NM[4] = {"q", "k", "v", "dout"};
  int hd_ = 1, sd_ = 2;
  DT_CHECK(dt_attn_layout(ctx, name, a, &hd_, &sd_));
  const char *lay = hd_ == 1 ? "[b, heads, s, hd]" : "[b, s, heads, hd]";
  if (a && a->i2 < 0)
    return dt_error(ctx, DT_ERR_INVALID, name, "query rows per block (i2) %d: 0 (the default) or more",
                    a->i2);
  for (int j = 0; j < n; j++) {
    if (in[j].dtype != DT_F32 && in[j].dtype != DT_F64 && in[j].dtype != DT_BF16)
      return dt_error(ctx, DT_ERR_UNSUPPORTED, name, "input %d is %s; only f32, f64 and bf16 are supported",
                      j, dt_dtype_name(in[j].dtype));
    if (in[j].dtype != in[0].dtype)
      return dt_error(ctx, DT_ERR_INVALID, name, "q and %s differ in dtype", NM[j]);
    if (in[j].ndim != 4)
      return dt_error(ctx, DT_ERR_INVALID, name, "%s must be 4-d %s; it has %d dims", NM[j], lay,
                      in[j].ndim);
  }
  const int64_t *q = in[0].gshape, *k = in[1].gshape, *v = in[2].gshape;
  for (int d = 0; d < 4; d++)
    if (k[d] != v[d])
      return dt_error(ctx, DT_ERR_INVALID, name, "k and v differ in dim %d (%lld, %lld)", d,
                      (long long)k[d], (long long)v[d]);
  for (int d = 0; d < 4; d++)
    if (d != hd_ && q[d] != k[d])
      return dt_error(ctx, DT_ERR_INVALID, name,
                      "q [%lld,%lld,%lld,%lld] and k [%lld,%lld,%lld,%lld] differ in batch, seq or head dim",
                      (long long)q[0], (long long)q[1], (long long)q[2], (long long)q[3],
                      (long long)k[0], (long long)k[1], (long long)k[2], (long long)k[3]);
  if (k[hd_] <= 0 || q[hd_] % k[hd_])
    return dt_error(ctx, DT_ERR_INVALID, name, "q heads %lld are not a multiple of kv heads %lld",
                    (long long)q[hd_], (long long)k[hd_]);
  if (n == 4)
    for (int d = 0; d < 4; d++)
      if (in[3].gshape[d] != q[d])
        return dt_error(ctx, DT_ERR_INVALID, name, "dout differs from q in dim %d", d);
  return DT_OK;
}

static dt_status sdpa_infer(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in, dt_spec *out) {
  DT_CHECK(sdpa_check(ctx, "sdpa", a, in, 3));
  out[0] = in[0];
  return DT_OK;
}

/* sdpa_bwd: dq like q; dk, dv like k. */
static dt_status bwd_infer(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in, dt_spec *out) {
  DT_CHECK(sdpa_check(ctx, "sdpa_bwd", a, in, 4));
  out[0] = in[0];
  out[1] = in[1];
  out[2] = in[2];
  return DT_OK;
}

/* Whole-mesh candidates shared by sdpa and its backward ops: per mesh dim
 * {all R, all S(1), all S(0)} expanded, minus head shardings that split h or
 * kvh unevenly. Every input and output takes the same placement. */
static dt_status sdpa_cands(dt_ctx *ctx, const char *name, const dt_op_attrs *a, const dt_spec *in,
                            int n_in, int n_out, dt_candidate *cand, int *n, int max) {
  int m = in[0].mesh_ndim, hdim = 1, sdim = 2;
  DT_CHECK(dt_attn_layout(ctx, name, a, &hdim, &sdim));
  dt_dim_option opts[DT_MAX_MESH_DIMS][3];
  const dt_dim_option *optp[DT_MAX_MESH_DIMS];
  int nopt[DT_MAX_MESH_DIMS];
  const dt_placement P3[3] = {dt_replicate(), dt_shard(hdim), dt_shard(0)};
  for (int i = 0; i < m; i++) {
    memset(opts[i], 0, sizeof opts[i]);
    for (int o = 0; o < 3; o++) {
      for (int j = 0; j < n_in; j++) opts[i][o].in[j] = P3[o];
      for (int j = 0; j < n_out; j++) opts[i][o].out[j] = P3[o];
    }
    optp[i] = opts[i];
    nopt[i] = 3;
  }
  if (dt_op_expand(m, n_in, n_out, optp, nopt, cand, n, max) != DT_OK)
    return dt_error(ctx, DT_ERR_UNSUPPORTED, name, "more than %d candidates", max);
  return dt_attn_keep_head_splits(ctx, name, in, hdim, cand, n);
}

dt_status dt_attn_keep_head_splits(dt_ctx *ctx, const char *name, const dt_spec *in, int hdim,
                                   dt_candidate *cand, int *n) {
  const int m = in[0].mesh_ndim;
  int64_t h = in[0].gshape[hdim], kvh = in[1].gshape[hdim];
  int kept = 0;
  for (int c = 0; c < *n; c++) {
    int64_t N = 1;
    for (int i = 0; i < m; i++) {
      if (cand[c].in[0][i].kind != DT_PL_SHARD || cand[c].in[0][i].dim != hdim) continue;
      if (in[0].mesh_shape[i] <= 0)
        return dt_error(ctx, DT_ERR_INTERNAL, name, "mesh sizes missing from the spec");
      N *= in[0].mesh_shape[i];
    }
    if (h % N || kvh % N) continue;
    cand[kept++] = cand[c];
  }
  *n = kept;
  return DT_OK;
}

static dt_status sdpa_candidates(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in,
                                 const dt_spec *out, dt_candidate *cand, int *n, int max) {
  (void)out;
  return sdpa_cands(ctx, "sdpa", a, in, 3, 1, cand, n, max);
}
static dt_status bwd_candidates(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in,
                                const dt_spec *out, dt_candidate *cand, int *n, int max) {
  (void)out;
  return sdpa_cands(ctx, "sdpa_bwd", a, in, 4, 3, cand, n, max);
}

/* Local geometry of one call: sizes, and where head (b, h) of q (of k) starts
 * (qb b + qh h elements) with rows qld apart (kb, kh, kld for k). */
typedef struct sdpa_geo {
  int64_t B, H, KVH, S, HD, group;
  int64_t qb, qh, qld, kb, kh, kld;
  double scale;
} sdpa_geo;

static dt_status sdpa_geo_get(dt_ctx *ctx, const char *name, const dt_op_attrs *a,
                              const dt_tensor *const *in, sdpa_geo *g) {
  int hdim = 1, sdim = 2;
  DT_CHECK(dt_attn_layout(ctx, name, a, &hdim, &sdim));
  const dt_array *q = &in[0]->local, *k = &in[1]->local, *v = &in[2]->local;
  g->B = q->shape[0];
  g->H = q->shape[hdim];
  g->S = q->shape[sdim];
  g->HD = q->shape[3];
  g->KVH = k->shape[hdim];
  if (k->shape[0] != g->B || v->shape[0] != g->B || v->shape[hdim] != g->KVH ||
      k->shape[sdim] != g->S || v->shape[sdim] != g->S || k->shape[3] != g->HD ||
      v->shape[3] != g->HD || g->S != in[0]->gshape[sdim])
    return dt_error(ctx, DT_ERR_INTERNAL, name, "local shapes of q, k, v do not match");
  /* an empty batch shard has no heads to pair; otherwise the groups must agree */
  if (g->B > 0 && (g->KVH <= 0 || g->H % g->KVH ||
                   g->H / g->KVH != in[0]->gshape[hdim] / in[1]->gshape[hdim]))
    return dt_error(ctx, DT_ERR_INTERNAL, name, "local heads %lld / kv heads %lld break the grouping",
                    (long long)g->H, (long long)g->KVH);
  g->group = g->KVH > 0 ? g->H / g->KVH : 1;
  g->scale = 1.0 / sqrt((double)in[0]->gshape[3]);
  g->qb = g->H * g->S * g->HD;
  g->kb = g->KVH * g->S * g->HD;
  if (hdim == 1) { /* [b, h, s, hd]: a head is a contiguous S x HD block */
    g->qh = g->kh = g->S * g->HD;
    g->qld = g->kld = g->HD;
  } else { /* [b, s, h, hd]: a head's rows are one token's heads apart */
    g->qh = g->kh = g->HD;
    g->qld = g->H * g->HD;
    g->kld = g->KVH * g->HD;
  }
  return DT_OK;
}

/* The kernel, on every device: per (batch, head) and block of query rows,
 * scores = Q K^T * scale (keys up to the block's last row), the causal row
 * softmax (attn.softmax), out = P V; backward recomputes P, dP = dO V^T, dS =
 * P (dP - rowsum(dP P)) (attn.softmax_bwd), dQ = dS K * scale, and for the kv
 * head of each group dK += dS^T Q * scale, dV += P^T dO (GEMMs with beta = 1).
 * The GEMMs are dt_device_gemm's, on the strided heads in place, in the
 * tensors' dtype. */

dt_status dt_attn_gemm(dt_device *d, dt_dtype t, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                       double alpha, const void *A, int64_t lda, const void *B, int64_t ldb,
                       double beta, void *C, int64_t ldc) {
  dt_gemm_desc g = {.dtype = t, .trans_a = ta, .trans_b = tb, .m = m, .n = n, .k = k,
                    .alpha = alpha, .beta = beta, .a = A, .lda = lda, .b = B, .ldb = ldb,
                    .c = C, .ldc = ldc, .batch = 1, .op = "attn_gemm"};
  return dt_device_gemm(d, &g);
}

dt_status dt_attn_kernels(dt_ctx *ctx, const char *name, dt_device_kind kind, dt_kdev *kd) {
  DT_CHECK(dt_device_kernels(ctx, kind, name, kd));
  if (!kd->k->attn) return dt_error(ctx, DT_ERR_UNSUPPORTED, name, "the device has no attn kernels");
  return DT_OK;
}

/* Blocks are batched over kv heads: one strided-batched GEMM per (group
 * member j, query block, run of gemm_heads kv heads) covers those heads (in
 * [b, h, s, hd] across batches too: query head kvh * group + j of batch b sits
 * at a constant stride from that of batch b, kv head kvh - 1). A kv head's dK
 * and dV so sum its group's members j in turn, each over the blocks in order,
 * however many heads a GEMM takes. Causal block [r0, r1) only sees keys
 * [0, r1), so its scores are a (r1 - r0) x r1 GEMM and the blocks together do
 * (S^2 + S BQ) / 2 of the S^2 score, P V and backward products, with BQ x S
 * scores per batched head instead of S x S. Query rows per block: attrs.i2
 * when set, else the device's attn.block_rows, fewer when the scores of one
 * block, nbuf buffers of nb x BQ x S, would pass its attn.block_bytes. */
typedef struct sdpa_blk {
  dt_device *dev;
  const dt_kern_attn *ka;
  const dt_kern_pw *kp;      /* cast (bf16) */
  int64_t nouter, nbat, nb;  /* outer loop (b in [b, s, h, hd]) x kv heads, per GEMM */
  int64_t oq, ok;            /* q (k) offset of outer index ob, elements */
  int64_t sq, sk;            /* batch strides of q (k) */
  int64_t bq;                /* query rows per block */
  size_t es;
} sdpa_blk;

/* bf16 attention keeps what FlashAttention-2 (Dao 2023, sec. 3.1) keeps in
 * f32: the scores and their softmax (and, backward, dP and dS) are f32
 * (bf16 GEMMs with an f32 C); P and dS are rounded to bf16 only as the A
 * operand of the next GEMM, and dK, dV, which sum over the blocks and the
 * group's query heads, accumulate in f32 and are rounded once at the end. */
static bool sdpa_mixed(dt_dtype t) { return t == DT_BF16; }

/* score_bytes: bytes of scratch per score element over all the block's buffers. */
static dt_status sdpa_blk_get(dt_ctx *ctx, const char *name, const dt_op_attrs *a, const sdpa_geo *g,
                              dt_dtype t, size_t score_bytes, const dt_kdev *kd, sdpa_blk *D) {
  DT_OP_KSLOT(ctx, name, kd->k->attn, softmax);
  DT_OP_KSLOT(ctx, name, kd->k->attn, softmax_bwd);
  if (sdpa_mixed(t)) DT_OP_KSLOT(ctx, name, kd->k->pw, cast);
  D->dev = kd->dev;
  D->ka = kd->k->attn;
  D->kp = kd->k->pw;
  D->es = dt_dtype_size(t);
  bool bhsd = a->i0 == DT_ATTN_BHSD;
  D->nouter = bhsd ? 1 : g->B;
  D->nbat = bhsd ? g->B * g->KVH : g->KVH;
  D->nb = D->ka->gemm_heads > 0 && D->ka->gemm_heads < D->nbat ? D->ka->gemm_heads : D->nbat;
  D->oq = g->qb;
  D->ok = g->kb;
  D->sq = g->group * g->qh;
  D->sk = g->kh;
  int64_t bq = D->ka->block_rows > 0 ? D->ka->block_rows : 1;
  if (D->ka->block_bytes && D->nb * g->S > 0) {
    int64_t cap = (int64_t)(D->ka->block_bytes / (score_bytes * (size_t)(D->nb * g->S)));
    bq = cap < bq ? cap : bq;
  }
  if (a->i2 > 0) bq = a->i2;
  if (bq > g->S) bq = g->S;
  D->bq = bq < 1 ? 1 : bq;
  return DT_OK;
}

/* One strided-batched GEMM of the block loop; t = DT_BF16 with c32: bf16 A and B,
 * f32 C (dt_gemm_desc.c_f32). */
static dt_status blk_gemm_c(const sdpa_blk *D, dt_dtype t, bool c32, bool ta, bool tb, int64_t m,
                            int64_t n, int64_t k, double alpha, const void *A, int64_t lda,
                            int64_t sa, const void *B, int64_t ldb, int64_t sb, double beta, void *C,
                            int64_t ldc, int64_t sc, int64_t batch) {
  dt_gemm_desc d = {.dtype = t, .c_f32 = c32, .trans_a = ta, .trans_b = tb, .m = m, .n = n, .k = k,
                    .alpha = alpha, .beta = beta, .a = A, .lda = lda, .stride_a = sa, .b = B,
                    .ldb = ldb, .stride_b = sb, .c = C, .ldc = ldc, .stride_c = sc, .batch = batch,
                    .op = "attn_gemm"};
  return dt_device_gemm(D->dev, &d);
}

static dt_status blk_gemm(const sdpa_blk *D, dt_dtype t, bool ta, bool tb, int64_t m, int64_t n,
                          int64_t k, double alpha, const void *A, int64_t lda, int64_t sa,
                          const void *B, int64_t ldb, int64_t sb, double beta, void *C, int64_t ldc,
                          int64_t sc, int64_t batch) {
  return blk_gemm_c(D, t, false, ta, tb, m, n, k, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc,
                    batch);
}

/* Ps (nh blocks of bq x S, f32 when mixed, else t) = softmax(scale Q[r0, r1)
 * K[0, r1)^T), causal, for nh heads from Q, K on; when mixed also P = Ps
 * rounded to bf16. */
static dt_status blk_probs(dt_dtype t, const sdpa_geo *g, const sdpa_blk *D, const char *Q,
                           const char *K, int64_t r0, int64_t r1, int64_t nh, void *Ps, void *P) {
  bool mixed = sdpa_mixed(t);
  DT_CHECK(blk_gemm_c(D, t, mixed, false, true, r1 - r0, r1, g->HD, g->scale,
                      Q + (size_t)(r0 * g->qld) * D->es, g->qld, D->sq, K, g->kld, D->sk, 0.0, Ps,
                      g->S, D->bq * g->S, nh));
  dt_attn_rows rg = {.batch = nh, .rows = r1 - r0, .nk = r1, .vis0 = r0 + 1, .ld = g->S,
                     .stride = D->bq * g->S};
  /* exp, max, sum, scale per score */
  dt_attn_rows_kledger(D->dev, "attn_softmax", mixed ? DT_F32 : t, &rg, 4, 1, 1);
  DT_CHECK(D->ka->softmax(D->dev, mixed ? DT_F32 : t, &rg, Ps));
  if (mixed) /* f32 -> bf16 */
    dt_kledger_kernel(D->dev->ctx, "attn_cast", DT_BF16, 0, 4 * (uint64_t)(nh * D->bq * g->S),
                      2 * (uint64_t)(nh * D->bq * g->S));
  return mixed ? D->kp->cast(D->dev, DT_F32, Ps, DT_BF16, P, nh * D->bq * g->S) : DT_OK;
}

static dt_status sdpa_kernel(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                             dt_tensor *const *out) {
  sdpa_geo g;
  DT_CHECK(sdpa_geo_get(ctx, "sdpa", a, in, &g));
  const dt_array *q = &in[0]->local, *k = &in[1]->local, *v = &in[2]->local;
  dt_array *o = &out[0]->local;
  if (g.B * g.H * g.S == 0) return DT_OK;
  dt_dtype t = q->dtype;
  bool mixed = sdpa_mixed(t);
  dt_kdev kd;
  DT_CHECK(dt_attn_kernels(ctx, "sdpa", q->dev, &kd));
  sdpa_blk D;
  DT_CHECK(sdpa_blk_get(ctx, "sdpa", a, &g, t, mixed ? 6 : dt_dtype_size(t), &kd, &D));
  dt_array P, Ps = {0};
  const int64_t pn = D.nb * D.bq * g.S;
  DT_CHECK(dt_array_create(ctx, o->dev, t, 1, &pn, &P));
  dt_status s = mixed ? dt_array_create(ctx, o->dev, DT_F32, 1, &pn, &Ps) : DT_OK;
  int64_t n_ob = D.nouter, n_j = g.group;
  const uint64_t rep = dt_attn_passes(ctx, kd.k, &n_ob, &n_j);
  for (int64_t ob = 0; ob < n_ob && s == DT_OK; ob++)
    for (int64_t h0 = 0; h0 < D.nbat && s == DT_OK; h0 += D.nb) {
      int64_t nh = D.nbat - h0 < D.nb ? D.nbat - h0 : D.nb;
      for (int64_t j = 0; j < n_j && s == DT_OK; j++) {
        size_t qo = (size_t)(ob * D.oq + j * g.qh + h0 * D.sq) * D.es;
        size_t ko = (size_t)(ob * D.ok + h0 * D.sk) * D.es;
        const char *Q = (const char *)q->data + qo, *K = (const char *)k->data + ko;
        const char *V = (const char *)v->data + ko;
        for (int64_t r0 = 0; r0 < g.S && s == DT_OK; r0 += D.bq) {
          int64_t r1 = r0 + D.bq < g.S ? r0 + D.bq : g.S;
          s = blk_probs(t, &g, &D, Q, K, r0, r1, nh, mixed ? Ps.data : P.data, P.data);
          char *O = (char *)o->data + qo + (size_t)(r0 * g.qld) * D.es;
          if (s == DT_OK)
            s = blk_gemm(&D, t, false, false, r1 - r0, g.HD, r1, 1.0, P.data, g.S, D.bq * g.S, V,
                         g.kld, D.sk, 0.0, O, g.qld, D.sq, nh);
        }
      }
    }
  dt_kledger_set_repeat(ctx, rep);
  dt_array_free(ctx, &P);
  if (mixed) dt_array_free(ctx, &Ps);
  return s;
}

/* The backward kernel: dq, dk, dv from q, k, v, dout. Per block P recomputed,
 * dP = dO V^T, dS = P (dP - rowsum(dP P)), dQ = scale dS K, dK += scale dS^T Q,
 * dV += P^T dO (beta = 1: a kv head's gradient sums its group's query heads,
 * which the loop over j visits in turn, and the blocks). */
static dt_status bwd_kernel(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                            dt_tensor *const *out) {
  static const char name[] = "sdpa_bwd";
  sdpa_geo g;
  DT_CHECK(sdpa_geo_get(ctx, name, a, in, &g));
  const dt_array *q = &in[0]->local, *k = &in[1]->local, *v = &in[2]->local, *dO = &in[3]->local;
  if (dO->numel != q->numel) return dt_error(ctx, DT_ERR_INTERNAL, name, "dout shape differs from q");
  dt_array *dq = &out[0]->local, *dk = &out[1]->local, *dv = &out[2]->local;
  dt_dtype t = q->dtype;
  bool mixed = sdpa_mixed(t);
  dt_kdev kd;
  DT_CHECK(dt_attn_kernels(ctx, name, q->dev, &kd));
  if (g.B * g.H * g.S == 0) {
    DT_CHECK(dt_device_fill(kd.dev, t, dk->data, dk->numel, 0.0));
    return dt_device_fill(kd.dev, t, dv->data, dv->numel, 0.0);
  }
  sdpa_blk D;
  DT_CHECK(sdpa_blk_get(ctx, name, a, &g, t, mixed ? 12 : 2 * dt_dtype_size(t), &kd, &D));
  /* Scratch: P and dS in t; when mixed also their f32 forms Ps, dSs and the f32
   * accumulators of dK and dV. */
  const int64_t blk = D.nb * D.bq * g.S, st = D.bq * g.S;
  const int64_t bn = 2 * blk, fn = mixed ? 2 * blk + dk->numel + dv->numel : 0;
  dt_array buf, fbuf = {0};
  DT_CHECK(dt_array_create(ctx, q->dev, t, 1, &bn, &buf));
  dt_status s = mixed ? dt_array_create(ctx, q->dev, DT_F32, 1, &fn, &fbuf) : DT_OK;
  char *P = buf.data, *dS = P + (size_t)blk * D.es;
  char *Ps = P, *dSs = dS, *dk_acc = dk->data, *dv_acc = dv->data;
  dt_dtype at = t;     /* dtype of the dK, dV accumulators */
  size_t aes = D.es;   /* and its size */
  if (mixed && s == DT_OK) {
    Ps = fbuf.data;
    dSs = Ps + (size_t)blk * 4;
    dk_acc = dSs + (size_t)blk * 4;
    dv_acc = dk_acc + (size_t)dk->numel * 4;
    at = DT_F32;
    aes = 4;
  }
  if (s == DT_OK) s = dt_device_fill(D.dev, at, dk_acc, dk->numel, 0.0);
  if (s == DT_OK) s = dt_device_fill(D.dev, at, dv_acc, dv->numel, 0.0);
  int64_t n_ob = D.nouter, n_j = g.group;
  const uint64_t rep = dt_attn_passes(ctx, kd.k, &n_ob, &n_j);
  for (int64_t ob = 0; ob < n_ob && s == DT_OK; ob++)
    for (int64_t h0 = 0; h0 < D.nbat && s == DT_OK; h0 += D.nb) {
      int64_t nh = D.nbat - h0 < D.nb ? D.nbat - h0 : D.nb, nbk = nh * D.bq * g.S;
      size_t ko = (size_t)(ob * D.ok + h0 * D.sk) * D.es, kao = (size_t)(ob * D.ok + h0 * D.sk) * aes;
      const char *K = (const char *)k->data + ko, *V = (const char *)v->data + ko;
      char *DK = dk_acc + kao, *DV = dv_acc + kao;
      for (int64_t j = 0; j < n_j && s == DT_OK; j++) {
        size_t qo = (size_t)(ob * D.oq + j * g.qh + h0 * D.sq) * D.es;
        const char *Q = (const char *)q->data + qo, *DO = (const char *)dO->data + qo;
        for (int64_t r0 = 0; r0 < g.S && s == DT_OK; r0 += D.bq) {
          int64_t r1 = r0 + D.bq < g.S ? r0 + D.bq : g.S, rb = r1 - r0;
          size_t ro = (size_t)(r0 * g.qld) * D.es;
          s = blk_probs(t, &g, &D, Q, K, r0, r1, nh, Ps, P);
          if (s == DT_OK)
            s = blk_gemm_c(&D, t, mixed, false, true, rb, r1, g.HD, 1.0, DO + ro, g.qld, D.sq, V,
                           g.kld, D.sk, 0.0, dSs, g.S, st, nh);
          dt_attn_rows rg = {.batch = nh, .rows = rb, .nk = r1, .vis0 = r0 + 1, .ld = g.S,
                             .stride = st};
          /* dS = P (dP - rowsum(dP P)): multiply, sum, subtract, multiply per score */
          dt_attn_rows_kledger(D.dev, "attn_softmax_bwd", mixed ? DT_F32 : t, &rg, 4, 2, 1);
          if (s == DT_OK) s = D.ka->softmax_bwd(D.dev, mixed ? DT_F32 : t, &rg, Ps, dSs);
          if (mixed) dt_kledger_kernel(ctx, "attn_cast", DT_BF16, 0, 4 * (uint64_t)nbk, 2 * (uint64_t)nbk);
          if (s == DT_OK && mixed) s = D.kp->cast(D.dev, DT_F32, dSs, DT_BF16, dS, nbk);
          char *DQ = (char *)dq->data + qo + ro;
          if (s == DT_OK)
            s = blk_gemm(&D, t, false, false, rb, g.HD, r1, g.scale, dS, g.S, st, K, g.kld, D.sk,
                         0.0, DQ, g.qld, D.sq, nh);
          if (s == DT_OK)
            s = blk_gemm_c(&D, t, mixed, true, false, r1, g.HD, rb, g.scale, dS, g.S, st, Q + ro,
                           g.qld, D.sq, 1.0, DK, g.kld, D.sk, nh);
          if (s == DT_OK)
            s = blk_gemm_c(&D, t, mixed, true, false, r1, g.HD, rb, 1.0, P, g.S, st, DO + ro,
                           g.qld, D.sq, 1.0, DV, g.kld, D.sk, nh);
        }
      }
    }
  dt_kledger_set_repeat(ctx, rep);
  if (mixed) {
    dt_kledger_kernel(ctx, "cast", DT_BF16, 0, 4 * (uint64_t)dk->numel, 2 * (uint64_t)dk->numel);
    dt_kledger_kernel(ctx, "cast", DT_BF16, 0, 4 * (uint64_t)dv->numel, 2 * (uint64_t)dv->numel);
  }
  if (s == DT_OK && mixed) s = D.kp->cast(D.dev, DT_F32, dk_acc, DT_BF16, dk->data, dk->numel);
  if (s == DT_OK && mixed) s = D.kp->cast(D.dev, DT_F32, dv_acc, DT_BF16, dv->data, dv->numel);
  dt_array_free(ctx, &buf);
  if (mixed) dt_array_free(ctx, &fbuf);
  return s;
}

static const dt_op op_sdpa_bwd = {.name = "sdpa_bwd", .n_in = 4, .n_out = 3, .infer = bwd_infer,
                                  .candidates = bwd_candidates, .kernel = bwd_kernel};

static dt_status sdpa_backward(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                               const dt_tensor *const *out, const dt_tensor *const *gout,
                               dt_tensor *const *gin) {
  (void)out;
  dt_status s = DT_OK;
  if (!gout[0]) {
    for (int j = 0; j < 3 && s == DT_OK; j++)
      if (gin[j]) s = dt_attn_zeros_like(ctx, in[j], gin[j]);
    return s;
  }
  const dt_tensor *bi[4] = {in[0], in[1], in[2], gout[0]};
  dt_tensor g3[3];
  dt_tensor *o[3] = {&g3[0], &g3[1], &g3[2]};
  DT_CHECK(dt_op_call(ctx, &op_sdpa_bwd, a, bi, o, NULL));
  for (int j = 0; j < 3; j++) {
    if (gin[j]) *gin[j] = g3[j];
    else dt_tensor_free(ctx, &g3[j]);
  }
  return s;
}

/* ---- the ops ------------------------------------------------------------------------ */

const dt_op dt_op_rope = {.name = "rope", .n_in = 1, .n_out = 1, .infer = rope_infer,
                          .options = rope_options, .kernel = rope_kernel, .backward = rope_backward,
    .bwd_meta_in = 1, .bwd_meta_out = 1};
const dt_op dt_op_sdpa = {.name = "sdpa", .n_in = 3, .n_out = 1, .infer = sdpa_infer,
                          .candidates = sdpa_candidates, .kernel = sdpa_kernel,
                          .backward = sdpa_backward};
