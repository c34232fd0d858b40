/* lib/ops/attention_cp.c: context-parallel causal attention (sdpa_cp), the
 * storage order of a load-balanced sequence (dt_seq_position) and the per-rank
 * block counters, after PyTorch's ring attention
 * (torch/distributed/tensor/experimental/_attention.py:
 * _templated_ring_attention, _templated_ring_attention_backward, _SDPAMerger,
 * _AllGatherRotater, _AllToAllRotater, _generate_round_robin_indices), Liu et
 * al., "Ring Attention with Blockwise Transformers" (arXiv:2310.01889) and
 * FlashAttention-2 (arXiv:2307.08691) for the online softmax and the backward
 * from the saved log-sum-exp.
 *
 * Storage order: with n_chunks = 2 cp (PyTorch's head-tail load balancer) the
 * sequence is cut into 2 cp position chunks and cp rank r stores chunks r and
 * 2 cp - 1 - r, so every rank holds one early and one late chunk and the causal
 * work per rank is equal; n_chunks 0 / 1 is the natural order, where rank r's
 * queries see r + 1 of the cp key blocks (the last rank does cp times the
 * first's work).
 *
 * sdpa_cp(q, k, v) -> (out, lse): q, k, v as sdpa (attrs.i0: 0 [b, h, s, hd],
 *   1 [b, s, h, hd]), causal over POSITIONS (dt_seq_position of the stored
 *   index, attrs.i1 = n_chunks), GQA (query head i reads kv head i / (h / kvh)),
 *   scale 1 / sqrt(hd); lse [b, h, s] / [b, s, h]: log sum_{j visible} exp(scale
 *   q_i . k_j), f32 for bf16 q (cp_lse_dtype), else q's dtype. attrs.dim = the cp mesh dim, the only mesh dim sharding the
 *   sequence: cp rank c holds stored rows [c S / C, (c + 1) S / C).
 *   attrs.i2 = dt_cp_rotate:
 *   - allgather: the cp mesh dim's option takes k and v Replicate, so the
 *     dispatcher all-gathers them (PyTorch's _AllGatherRotater gathers the
 *     [K | V] buffer once per call); the kernel walks the gathered blocks.
 *   - ring (pass-KV, PyTorch's _AllToAllRotater): everything stays S(seq); at
 *     step i = 0 .. C - 1 rank c holds the [K | V] block of cp rank (c - i) mod
 *     C, in one flat buffer (K then V, the local layout). For i < C - 1 it posts
 *     the send of that block to rank c + 1 BEFORE computing with it (the
 *     transfer overlaps the compute where sends are asynchronous), computes,
 *     then receives the next block from rank c - 1: C - 1 sends and C - 1
 *     receives per call.
 *   Both walk the blocks in the same order.
 *   The work is split in units: U = n_chunks (> 1) or C units of L = S / U
 *   rows; a (query unit, key unit) pair at positions pq, pk is full (pk < pq),
 *   diagonal (pk == pq: causal inside, rows are consecutive positions) or
 *   skipped (pk > pq: never computed), as PyTorch's _is_causal_behavior
 *   splits its ring steps. A pair runs over every (batch, head) at once, as
 *   strided-batched GEMMs (see cp_dev), in blocks of at most BQ query rows (the device's attn.block_rows: 64 on the CPU, 256 on CUDA)
 *   against the unit's keys (a diagonal block only up to its last row): GEMMs
 *   on the strided heads in place (dt_device_gemm), then the online softmax of
 *   FlashAttention-2 per row (attn.online: running max and sum, the output
 *   kept unnormalised in out and rescaled when the max grows; normalised, and
 *   lse = max + log(sum), at the end by attn.finish). Scratch is BQ x L scores
 *   and two statistics per local query row: memory per rank falls with cp.
 *   Candidates: per mesh dim other than cp {all R, all S(heads), all S(0)} for
 *   q, k, v, out and lse (lse's first three dims are q's), minus head
 *   shardings that do not divide both h and kvh (as sdpa); on the cp mesh dim
 *   the single option above.
 * Backward: the private op sdpa_cp_bwd (q, k, v, out, lse, dout) -> (dq, dk,
 *   dv) with the same candidates, except that under allgather dk and dv come
 *   out Partial(sum) on cp (each rank's contributions to every block); the
 *   op's backward then redistributes dk, dv to the placements k, v came in
 *   (Partial made Replicate): for k, v S(seq) on cp that is the reduce_scatter
 *   of dK and dV (and the dispatcher's all-gather of K, V for the backward op
 *   is the second gather). Per pair, with the saved out and lse
 *   (FlashAttention-2, Algorithm 2): D_i = rowsum(dO_i * O_i), P = exp(scale
 *   S - lse) masked, dV += P^T dO, dP = dO V^T, dS = P (dP - D), dQ += scale dS
 *   K, dK += scale dS^T Q (dK, dV summed over a group's query heads). Ring:
 *   C - 1 rotations of [K | V] as in the forward, and C rotations of a
 *   travelling [dK | dV] accumulator in the accumulators' dtype (f32 for bf16,
 *   as PyTorch's accum_dtype; else the tensors'): at step i rank c
 *   computes its contributions to the held block, adds them to that block's
 *   accumulator received from rank c - 1 (step 0: its own, fresh) and sends it
 *   on to rank c + 1; after the C-th transfer each rank holds its own block's
 *   dK, dV summed over all cp ranks (PyTorch moves dK, dV the same way,
 *   _templated_ring_attention_backward). 2 C - 1 sends and receives per call.
 *   dout with no gradient gives zeros; a gradient through lse is refused
 *   (DT_ERR_UNSUPPORTED: lse is kept for the backward, as the flash kernels'
 *   logsumexp output).
 * Counters: each kernel call (forward and backward) adds its (query unit, key
 *   unit) pairs once (not per batch or head) to the rank's dt_cp_counts, kept
 *   on the context (dt_ctx_ext).
 * Kernels: one composition on every device (the arrays' kind picks it,
 *   dt_device_kernels): the pairs and blocks through dt_device_gemm and the
 *   device's attn kernels (lib/device/kernels.h), scratch and the [K | V] and
 *   [dK | dV] buffers in the arrays' memory (the comm front moves them). f32
 *   and f64 everywhere; bf16 on CUDA (and cuda-emu) with f32 scores,
 *   statistics and accumulators across the ring steps (see cp_dev); host bf16
 *   arrays reach the kernel as f32, through the dispatcher. Under allgather a
 *   bf16 rank's Partial dk, dv leave the kernel rounded to bf16, and their
 *   reduce_scatter sums bf16 (the ring sums in f32). What it is not:
 *   non-causal or document masks, dropout.
 */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device/device.h"
#include "ops/ops.h"
#include "ops/attention_impl.h"

/* ---- storage order ---------------------------------------------------------------- */

int64_t dt_seq_position(int64_t i, int64_t S, int n_chunks) {
  if (S <= 0 || i < 0 || i >= S || n_chunks < 0) return -1;
  if (n_chunks <= 1) return i;
  if (n_chunks % 2 || S % n_chunks) return -1;
  int64_t len = S / n_chunks, k = i / len, off = i % len;
  int64_t pc = k % 2 == 0 ? k / 2 : n_chunks - 1 - k / 2;
  return pc * len + off;
}

/* ---- block counters --------------------------------------------------------------- */

/* The rank's counters hang on its context under the address of counts_key. */
static const char counts_key;

static void counts_free(dt_ctx *ctx, void *data) {
  (void)ctx;
  free(data);
}

void dt_sdpa_cp_counts(const dt_ctx *ctx, dt_cp_counts *out) {
  const dt_cp_counts *c = dt_ctx_ext_get(ctx, &counts_key);
  if (c) *out = *c;
  else memset(out, 0, sizeof *out);
}

void dt_sdpa_cp_counts_reset(dt_ctx *ctx) {
  dt_cp_counts *c = dt_ctx_ext_get(ctx, &counts_key);
  if (c) memset(c, 0, sizeof *c);
}

static dt_status counts_add(dt_ctx *ctx, const dt_cp_counts *add) {
  dt_cp_counts *c = dt_ctx_ext_get(ctx, &counts_key);
  if (!c) {
    c = calloc(1, sizeof *c);
    if (!c) return dt_error(ctx, DT_ERR_NOMEM, "sdpa_cp", "block counters");
    dt_status s = dt_ctx_ext_set(ctx, &counts_key, c, counts_free);
    if (s != DT_OK) {
      free(c);
      return s;
    }
  }
  c->full += add->full;
  c->diag += add->diag;
  c->skipped += add->skipped;
  return DT_OK;
}

/* ---- checks, shapes and candidates -------------------------------------------------- */

/* Message tags on the cp communicator, one per purpose (a receive takes the
 * oldest message of its tag from its peer, so the streams never mix). */
enum { CP_TAG_FWD_KV = 0x4350, CP_TAG_BWD_KV = 0x4351, CP_TAG_BWD_DKV = 0x4352 };


/* lse's dtype for q's: f32 for bf16 (a bf16 lse would be off by up to
 * 2^-9 |lse|, an error of that size in every probability the backward
 * recomputes from it; the flash kernels' logsumexp is f32 for bf16 inputs
 * too), else q's. */
static dt_dtype cp_lse_dtype(dt_dtype t) { return t == DT_BF16 ? DT_F32 : t; }

/* Checks the inputs (q, k, v; with bwd also out, lse, dout) and the attrs
 * against the mesh sizes in the specs; sets *units (U) and *cp (C). */
static dt_status cp_check(dt_ctx *ctx, const char *name, const dt_op_attrs *a, const dt_spec *in,
                          bool bwd, int64_t *units, int *cp) {
  static const char *const NM[6] = {"q", "k", "v", "out", "lse", "dout"};
  int hdim = 1, sdim = 2, n = bwd ? 6 : 3;
  DT_CHECK(dt_attn_layout(ctx, name, a, &hdim, &sdim));
  for (int j = 0; j < n; j++) {
    if (in[j].dtype != DT_F32 && in[j].dtype != DT_F64 && in[j].dtype != DT_BF16)
      return dt_error(ctx, DT_ERR_UNSUPPORTED, name, "%s is %s; only f32, f64 and bf16 are supported",
                      NM[j], dt_dtype_name(in[j].dtype));
    if (j == 4 && in[j].dtype != cp_lse_dtype(in[0].dtype))
      return dt_error(ctx, DT_ERR_INVALID, name, "lse is %s; for %s q it is %s",
                      dt_dtype_name(in[j].dtype), dt_dtype_name(in[0].dtype),
                      dt_dtype_name(cp_lse_dtype(in[0].dtype)));
    if (j != 4 && in[j].dtype != in[0].dtype)
      return dt_error(ctx, DT_ERR_INVALID, name, "q and %s differ in dtype", NM[j]);
    int want = j == 4 ? 3 : 4;
    if (in[j].ndim != want)
      return dt_error(ctx, DT_ERR_INVALID, name, "%s must be %d-d; it has %d dims", NM[j], want, in[j].ndim);
  }
  const int64_t *q = in[0].gshape, *k = in[1].gshape, *v = in[2].gshape;
  for (int d = 0; d < 4; d++) {
    if (k[d] != v[d])
      return dt_error(ctx, DT_ERR_INVALID, name, "k and v differ in dim %d (%lld, %lld)", d,
                      (long long)k[d], (long long)v[d]);
    if (d != hdim && q[d] != k[d])
      return dt_error(ctx, DT_ERR_INVALID, name, "q and k differ in dim %d (%lld, %lld)", d,
                      (long long)q[d], (long long)k[d]);
  }
  if (k[hdim] <= 0 || q[hdim] % k[hdim])
    return dt_error(ctx, DT_ERR_INVALID, name, "q heads %lld are not a multiple of kv heads %lld",
                    (long long)q[hdim], (long long)k[hdim]);
  for (int j = 3; j < n; j++)
    for (int d = 0; d < in[j].ndim; d++)
      if (in[j].gshape[d] != q[d])
        return dt_error(ctx, DT_ERR_INVALID, name, "%s differs from q in dim %d", NM[j], d);
  int m = in[0].mesh_ndim;
  if (a->dim < 0 || a->dim >= m)
    return dt_error(ctx, DT_ERR_INVALID, name, "cp mesh dim (attrs.dim) %d is not a dim of the %d-d mesh",
                    a->dim, m);
  int C = in[0].mesh_shape[a->dim];
  if (C <= 0) return dt_error(ctx, DT_ERR_INTERNAL, name, "mesh sizes missing from the spec");
  if (a->i1 < 0 || (a->i1 > 1 && a->i1 % 2))
    return dt_error(ctx, DT_ERR_INVALID, name,
                    "storage order (i1) %d: 0 or 1 (natural) or an even chunk count", a->i1);
  if (a->i2 != DT_CP_ALLGATHER && a->i2 != DT_CP_RING)
    return dt_error(ctx, DT_ERR_INVALID, name, "rotate method (i2) %d: 0 allgather, 1 ring", a->i2);
  int64_t S = q[sdim], U = a->i1 > 1 ? a->i1 : C;
  if (S < U || S % U)
    return dt_error(ctx, DT_ERR_INVALID, name,
                    "sequence %lld does not split into %lld equal chunks (%s)", (long long)S, (long long)U,
                    a->i1 > 1 ? "attrs.i1" : "the cp size");
  if (U % C)
    return dt_error(ctx, DT_ERR_INVALID, name, "%lld storage chunks (attrs.i1) do not split over cp %d",
                    (long long)U, C);
  *units = U;
  *cp = C;
  return DT_OK;
}

static dt_status cp_infer(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in, dt_spec *out) {
  int64_t U;
  int C;
  DT_CHECK(cp_check(ctx, "sdpa_cp", a, in, false, &U, &C));
  out[0] = in[0];
  out[1] = in[0];
  out[1].dtype = cp_lse_dtype(in[0].dtype);
  out[1].ndim = 3;
  out[1].gshape[3] = 0;
  return DT_OK;
}

static dt_status cp_bwd_infer(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in, dt_spec *out) {
  int64_t U;
  int C;
  DT_CHECK(cp_check(ctx, "sdpa_cp_bwd", a, in, true, &U, &C));
  out[0] = in[0];
  out[1] = in[1];
  out[2] = in[2];
  return DT_OK;
}

/* Per mesh dim but cp, the placement q, k and v already share there when it is R,
 * S(heads) or S(0) (kept: attention needs no communication over a dim it does not
 * attend across, and a dim such as pp, whose ranks run other stages, must not see
 * any), else {all R, all S(heads), all S(0)}; on the cp dim the one option is
 * (allgather) q, out, lse, dout, dq S(seq), k, v R, dk, dv P(sum), or (ring)
 * everything S(seq). Expanded, then head shardings that split h or kvh unevenly
 * dropped. Inputs: q k v [out lse dout]; outputs: out lse or dq dk dv. */
static dt_status cp_cands(dt_ctx *ctx, const char *name, const dt_op_attrs *a, const dt_spec *in,
                          bool bwd, dt_candidate *cand, int *n, int max) {
  int m = in[0].mesh_ndim, hdim = 1, sdim = 2, n_in = bwd ? 6 : 3, n_out = bwd ? 3 : 2;
  DT_CHECK(dt_attn_layout(ctx, name, a, &hdim, &sdim));
  if (a->dim < 0 || a->dim >= m)
    return dt_error(ctx, DT_ERR_INVALID, name, "cp mesh dim (attrs.dim) %d is not a dim of the %d-d mesh",
                    a->dim, m);
  dt_dim_option opts[DT_MAX_MESH_DIMS][3];
  const dt_dim_option *optp[DT_MAX_MESH_DIMS];
  int nopt[DT_MAX_MESH_DIMS];
  const dt_placement P3[3] = {dt_replicate(), dt_shard(hdim), dt_shard(0)};
  const bool ring = a->i2 == DT_CP_RING;
  for (int i = 0; i < m; i++) {
    memset(opts[i], 0, sizeof opts[i]);
    optp[i] = opts[i];
    if (i == a->dim) {
      dt_dim_option *o = &opts[i][0];
      for (int j = 0; j < n_in; j++) o->in[j] = dt_shard(sdim);
      for (int j = 0; j < n_out; j++) o->out[j] = dt_shard(sdim);
      if (!ring) {
        o->in[1] = o->in[2] = dt_replicate();
        if (bwd) o->out[1] = o->out[2] = dt_partial(DT_RED_SUM);
      }
      nopt[i] = 1;
      continue;
    }
    int keep = -1;
    for (int c = 0; c < 3; c++)
      if (dt_placement_eq(in[0].pl[i], P3[c]) && dt_placement_eq(in[1].pl[i], P3[c]) &&
          dt_placement_eq(in[2].pl[i], P3[c]))
        keep = c;
    nopt[i] = 0;
    for (int c = 0; c < 3; c++) {
      if (keep >= 0 && c != keep) continue;
      for (int j = 0; j < n_in; j++) opts[i][nopt[i]].in[j] = P3[c];
      for (int j = 0; j < n_out; j++) opts[i][nopt[i]].out[j] = P3[c];
      nopt[i]++;
    }
  }
  if (dt_op_expand(m, n_in, n_out, optp, nopt, cand, n, max) != DT_OK)
    return dt_error(ctx, DT_ERR_UNSUPPORTED, name, "more than %d candidates", max);
  return dt_attn_keep_head_splits(ctx, name, in, hdim, cand, n);
}

static dt_status cp_candidates(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in,
                               const dt_spec *out, dt_candidate *cand, int *n, int max) {
  (void)out;
  return cp_cands(ctx, "sdpa_cp", a, in, false, cand, n, max);
}
static dt_status cp_bwd_candidates(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in,
                                   const dt_spec *out, dt_candidate *cand, int *n, int max) {
  (void)out;
  return cp_cands(ctx, "sdpa_cp_bwd", a, in, true, cand, n, max);
}

/* ---- kernel geometry ---------------------------------------------------------------- */

/* One call's local geometry. q, out, dout, dq rows: head (b, h) starts at
 * b qb + h qh, rows qld apart; lse (and the per-row scratch) at b lb + h lh +
 * row lld. */
typedef struct cp_geo {
  dt_dtype t;
  size_t es;
  int layout, n_chunks, C, c;
  bool ring;
  int64_t B, H, KVH, HD, group;
  int64_t S, Sq, Sk, U, u, L; /* global seq, local q rows, local k rows, units, per rank, rows */
  int64_t qb, qh, qld, lb, lh, lld;
  int64_t kb, kh, kld;        /* a block of Sq k rows (the ring's held buffer) */
  int64_t fkb, fkh, fkld;     /* the local k, v (Sk rows: all S under allgather) */
  double scale;
  dt_comm *comm;
} cp_geo;

static void kv_strides(const cp_geo *g, int64_t rows, int64_t *kb, int64_t *kh, int64_t *kld) {
  *kb = g->KVH * rows * g->HD;
  *kh = g->layout == DT_ATTN_BHSD ? rows * g->HD : g->HD;
  *kld = g->layout == DT_ATTN_BHSD ? g->HD : g->KVH * g->HD;
}

static dt_status cp_geo_get(dt_ctx *ctx, const char *name, const dt_op_attrs *a,
                            const dt_tensor *const *in, cp_geo *g) {
  int hdim = 1, sdim = 2;
  DT_CHECK(dt_attn_layout(ctx, name, a, &hdim, &sdim));
  memset(g, 0, sizeof *g);
  const dt_array *q = &in[0]->local, *k = &in[1]->local, *v = &in[2]->local;
  int m = 0, shape[DT_MAX_MESH_DIMS], coords[DT_MAX_MESH_DIMS];
  dt_tensor_mesh_info(in[0]->mesh, &m, shape, coords);
  if (a->dim < 0 || a->dim >= m) return dt_error(ctx, DT_ERR_INTERNAL, name, "cp mesh dim out of range");
  g->t = q->dtype;
  g->es = dt_dtype_size(g->t);
  g->layout = a->i0;
  g->ring = a->i2 == DT_CP_RING;
  g->C = shape[a->dim];
  g->c = coords[a->dim];
  g->comm = dt_mesh_comm(in[0]->mesh, a->dim);
  g->n_chunks = a->i1;
  g->S = in[0]->gshape[sdim];
  g->U = a->i1 > 1 ? a->i1 : g->C;
  if (!g->comm || g->comm->size != g->C || g->comm->rank != g->c || g->U % g->C || g->S % g->U)
    return dt_error(ctx, DT_ERR_INTERNAL, name, "cp group or chunking does not match the mesh");
  g->u = g->U / g->C;
  g->L = g->S / g->U;
  g->Sq = g->S / g->C;
  g->Sk = g->ring ? g->Sq : g->S;
  g->B = q->shape[0];
  g->H = q->shape[hdim];
  g->HD = q->shape[3];
  g->KVH = k->shape[hdim];
  if (q->shape[sdim] != g->Sq || in[0]->goffset[sdim] != g->c * g->Sq || k->shape[sdim] != g->Sk ||
      k->shape[0] != g->B || k->shape[3] != g->HD || v->numel != k->numel || v->shape[hdim] != g->KVH)
    return dt_error(ctx, DT_ERR_INTERNAL, name, "local shapes of q, k, v do not match the cp layout");
  if (g->B > 0 && (g->KVH <= 0 || g->H % g->KVH ||
                   g->H / g->KVH != in[0]->gshape[hdim] / in[1]->gshape[hdim]))
    return dt_error(ctx, DT_ERR_INTERNAL, name, "local heads %lld / kv heads %lld break the grouping",
                    (long long)g->H, (long long)g->KVH);
  g->group = g->KVH > 0 ? g->H / g->KVH : 1;
  g->scale = 1.0 / sqrt((double)in[0]->gshape[3]);
  g->qb = g->H * g->Sq * g->HD;
  g->qh = g->layout == DT_ATTN_BHSD ? g->Sq * g->HD : g->HD;
  g->qld = g->layout == DT_ATTN_BHSD ? g->HD : g->H * g->HD;
  g->lb = g->H * g->Sq;
  g->lh = g->layout == DT_ATTN_BHSD ? g->Sq : 1;
  g->lld = g->layout == DT_ATTN_BHSD ? 1 : g->H;
  kv_strides(g, g->Sq, &g->kb, &g->kh, &g->kld);
  kv_strides(g, g->Sk, &g->fkb, &g->fkh, &g->fkld);
  return DT_OK;
}

/* Position chunk of stored unit k. */
static int64_t unit_pos(const cp_geo *g, int64_t k) {
  return dt_seq_position(k * g->L, g->S, g->n_chunks) / g->L;
}

typedef enum pair_kind { PAIR_SKIP = 0, PAIR_FULL, PAIR_DIAG } pair_kind;

/* Local query unit a against unit bu of cp rank s's key block; counted. */
static pair_kind pair_of(const cp_geo *g, int64_t a, int s, int64_t bu, dt_cp_counts *n) {
  int64_t pq = unit_pos(g, g->c * g->u + a), pk = unit_pos(g, s * g->u + bu);
  if (pk < pq) {
    n->full++;
    return PAIR_FULL;
  }
  if (pk == pq) {
    n->diag++;
    return PAIR_DIAG;
  }
  n->skipped++;
  return PAIR_SKIP;
}

/* A key block in use: K and V at its first element (the tensors' dtype),
 * strides kb, kh, kld; the gradient block dK, dV, when there is one, has the
 * same strides in the accumulators' dtype (cp_dev.at). */
typedef struct kv_view {
  const char *K, *V;
  char *dK, *dV;
  int64_t kb, kh, kld;
} kv_view;

/* The view of cp rank s's block: in the ring's held buffer [K | V] (and the
 * gradient scratch [dK | dV], aes bytes per element), or rows [s Sq, (s + 1)
 * Sq) of the local (gathered) k, v (and the accumulators dk, dv of the local
 * gradients, laid out like k). */
static void view_of(const cp_geo *g, size_t aes, bool held, const char *buf, char *gbuf,
                    const dt_array *k, const dt_array *v, char *dk, char *dv, int s, kv_view *w) {
  const int64_t nk = g->B * g->KVH * g->Sq * g->HD;
  memset(w, 0, sizeof *w);
  if (held) {
    w->K = buf;
    w->V = buf + (size_t)nk * g->es;
    if (gbuf) {
      w->dK = gbuf;
      w->dV = gbuf + (size_t)nk * aes;
    }
    w->kb = g->kb;
    w->kh = g->kh;
    w->kld = g->kld;
    return;
  }
  const int64_t off = (int64_t)s * g->Sq * g->fkld;
  w->K = (const char *)k->data + (size_t)off * g->es;
  w->V = (const char *)v->data + (size_t)off * g->es;
  if (dk) {
    w->dK = dk + (size_t)off * aes;
    w->dV = dv + (size_t)off * aes;
  }
  w->kb = g->fkb;
  w->kh = g->fkh;
  w->kld = g->fkld;
}


/* ---- the kernels ------------------------------------------------------------------- */

/* Every device runs the same pairs and blocks through dt_device_gemm and its
 * attn kernels (lib/device/kernels.h), scratch in the arrays' memory: the
 * running max and sum m, l (and the backward's D) in the table's statistics
 * dtype (dt_kern_attn_stat), indexed like lse, so that finish and rowdot take
 * every local row at once; the online step rescales the output rows itself.
 * Query rows per block: the device's attn.block_rows (scores of that many rows
 * x L per block), at most L, fewer when the scores of one block over the heads
 * a GEMM batches would pass attn.block_bytes.
 *
 * Batching, as sdpa's (attention.c, sdpa_blk): a pair's GEMMs and row kernels
 * run per (group member j, block of query rows, run of attn.gemm_heads kv
 * heads) as strided-batched GEMMs, the query head kvh * group + j of
 * consecutive kv heads sitting at a constant stride (in [b, h, s, hd] across
 * batches too: nouter 1, nbat B KVH; in [b, s, h, hd] per batch: nouter B,
 * nbat KVH). A kv head's dK, dV then sum its group's members j in turn, each
 * over the blocks in order, as the per-head loop did; with one head per GEMM
 * (the CPU's table) the calls are the per-head ones.
 *
 * bf16 (mixed: a device whose kernels take bf16; the CPU's get f32 copies from
 * the dispatcher) keeps in f32 what FlashAttention-2 (Dao 2023, sec. 3.1) and
 * PyTorch's ring attention keep in f32 (_templated_ring_attention merges out
 * and lse in f32 under _cp_options.convert_to_f32, the default;
 * _templated_ring_attention_backward's accum_dtype): the scores (bf16 GEMMs
 * with an f32 C), the online statistics, the output accumulator over every key
 * block and ring step, lse (an f32 output), dP and dS, and the dQ, dK, dV
 * accumulators, the travelling [dK | dV] included (it is sent in f32: 4 bytes
 * an element, twice the bf16 tensors'). P and dS are rounded to bf16 only as
 * the A operand of the next GEMM; out, dq, dk, dv are rounded to bf16 once, at
 * the end. */
typedef struct cp_dev {
  dt_device *dev;
  const dt_kern_attn *ka;
  const dt_kern_pw *kp;     /* cast (mixed) */
  bool mixed;
  dt_dtype at;              /* scores, lse and accumulators: f32 when mixed, else t */
  size_t aes;
  dt_dtype st;              /* m, l, D */
  size_t ss;
  int64_t bq;
  const dt_kernels *k;      /* the device's table (shape_only: dt_attn_passes) */
  int64_t nouter, nbat, nb; /* outer loop (b in [b, s, h, hd]) x kv heads, per GEMM */
  int64_t sq, sl;           /* q (and out, dq) and lse strides between consecutive kv heads */
} cp_dev;

static bool cp_mixed(dt_dtype t) { return t == DT_BF16; }

/* score_bytes: bytes of scratch per score element over all the block's buffers. */
static dt_status cp_dev_get(dt_ctx *ctx, const char *name, const cp_geo *g, const dt_kdev *kd,
                            size_t score_bytes, cp_dev *D) {
  const dt_kern_attn *ka = kd->k->attn;
  DT_OP_KSLOT(ctx, name, ka, online);
  DT_OP_KSLOT(ctx, name, ka, finish);
  DT_OP_KSLOT(ctx, name, ka, rowdot);
  DT_OP_KSLOT(ctx, name, ka, lse_bwd);
  D->mixed = cp_mixed(g->t);
  if (D->mixed) DT_OP_KSLOT(ctx, name, kd->k->pw, cast);
  D->dev = kd->dev;
  D->k = kd->k;
  D->ka = ka;
  D->kp = kd->k->pw;
  D->at = D->mixed ? DT_F32 : g->t;
  D->aes = dt_dtype_size(D->at);
  D->st = dt_kern_attn_stat(ka, g->t);
  D->ss = dt_dtype_size(D->st);
  const bool bhsd = g->layout == DT_ATTN_BHSD;
  D->nouter = bhsd ? 1 : g->B;
  D->nbat = bhsd ? g->B * g->KVH : g->KVH;
  D->nb = ka->gemm_heads > 0 && ka->gemm_heads < D->nbat ? ka->gemm_heads : D->nbat;
  if (D->nb < 1) D->nb = 1;
  D->sq = g->group * g->qh;
  D->sl = g->group * g->lh;
  int64_t bq = ka->block_rows > 0 ? ka->block_rows : 1;
  if (ka->block_bytes && D->nb * g->L > 0) {
    int64_t cap = (int64_t)(ka->block_bytes / (score_bytes * (size_t)(D->nb * g->L)));
    bq = cap < bq ? cap : bq;
  }
  if (bq > g->L) bq = g->L;
  D->bq = bq < 1 ? 1 : bq;
  return DT_OK;
}

/* One strided-batched GEMM of a pair; mixed: bf16 A and B, f32 C (c_f32). */
static dt_status pair_gemm(const cp_dev *D, dt_dtype t, bool ta, bool tb, int64_t m, int64_t n,
                           int64_t k, double alpha, const void *A, int64_t lda, int64_t sa,
                           const void *B, int64_t ldb, int64_t sb, double beta, void *C,
                           int64_t ldc, int64_t sc, int64_t batch) {
  dt_gemm_desc d = {.dtype = t, .c_f32 = D->mixed, .trans_a = ta, .trans_b = tb, .m = m, .n = n,
                    .k = k, .alpha = alpha, .beta = beta, .a = A, .lda = lda, .stride_a = sa,
                    .b = B, .ldb = ldb, .stride_b = sb, .c = C, .ldc = ldc, .stride_c = sc,
                    .batch = batch, .op = "attn_gemm"};
  return dt_device_gemm(D->dev, &d);
}

/* mixed: n f32 scores at src rounded to bf16 at dst (the next GEMM's A). */
static dt_status to_bf16(const cp_dev *D, const char *op, const void *src, void *dst, int64_t n) {
  if (!D->mixed) return DT_OK;
  dt_kledger_kernel(D->dev->ctx, op, DT_BF16, 0, 4 * (uint64_t)n, 2 * (uint64_t)n);
  return D->kp->cast(D->dev, DT_F32, src, DT_BF16, dst, n);
}

/* The scores of rows [r0, r1) of a pair for nh heads (rb x nk each, row i sees
 * its first diag ? i + 1 : nk keys), for the attn kernels. */
static dt_attn_rows pair_rows(const cp_geo *g, const cp_dev *D, int64_t nh, int64_t r0, int64_t r1,
                              int64_t nk, bool diag) {
  dt_attn_rows rg = {.batch = nh, .rows = r1 - r0, .nk = nk, .vis0 = diag ? r0 + 1 : nk, .ld = g->L,
                     .stride = D->bq * g->L, .sld = g->lld, .sstride = D->sl};
  return rg;
}

/* One run of a pair: outer index ob, kv heads [h0, h0 + nh), group member j,
 * query unit a against key unit bu of block w; element offsets of its first
 * query row (q, out, dout, dq), key row (k, v, dk, dv) and statistic. */
typedef struct pair_run {
  int64_t nh, qo, ko, lo;
} pair_run;

static pair_run run_of(const cp_geo *g, const cp_dev *D, const kv_view *w, int64_t ob, int64_t h0,
                       int64_t nh, int64_t j, int64_t a, int64_t bu) {
  pair_run r = {.nh = nh,
                .qo = ob * g->qb + j * g->qh + h0 * D->sq + a * g->L * g->qld,
                .ko = ob * w->kb + h0 * w->kh + bu * g->L * w->kld,
                .lo = ob * g->lb + j * g->lh + h0 * D->sl + a * g->L * g->lld};
  return r;
}

/* ---- forward -------------------------------------------------------------------------- */

/* One run of a pair: per block of rows the scores, the online softmax step
 * (which rescales the output rows), and O += P V. O: the output accumulator
 * (at, laid out like out); m, l: the statistics (indexed like lse); Ps: the
 * scores scratch (at), Pb its bf16 copy (mixed). */
static dt_status fwd_run(const cp_geo *g, const cp_dev *D, const kv_view *w, const pair_run *p,
                         bool diag, const dt_array *q, char *O, char *m, char *l, void *Ps,
                         void *Pb) {
  const size_t es = g->es, aes = D->aes;
  const int64_t L = g->L, bq = D->bq, st = bq * L;
  const char *Q = (const char *)q->data + (size_t)p->qo * es;
  const char *K = w->K + (size_t)p->ko * es, *V = w->V + (size_t)p->ko * es;
  for (int64_t r0 = 0; r0 < L; r0 += bq) {
    int64_t r1 = r0 + bq < L ? r0 + bq : L, nk = diag ? r1 : L, rb = r1 - r0;
    size_t so = (size_t)(p->lo + r0 * g->lld) * D->ss;
    char *Or = O + (size_t)(p->qo + r0 * g->qld) * aes;
    DT_CHECK(pair_gemm(D, g->t, false, true, rb, nk, g->HD, g->scale, Q + (size_t)(r0 * g->qld) * es,
                       g->qld, D->sq, K, w->kld, w->kh, 0.0, Ps, L, st, p->nh));
    dt_attn_rows rg = pair_rows(g, D, p->nh, r0, r1, nk, diag);
    /* online softmax: max, exp, sum, rescale per score; O rescaled per row */
    dt_attn_rows_kledger(D->dev, "attn_online", D->at, &rg, 5, 1, 1);
    DT_CHECK(D->ka->online(D->dev, D->at, &rg, Ps, m + so, l + so, Or, g->qld, D->sq, g->HD));
    DT_CHECK(to_bf16(D, "attn_cast", Ps, Pb, p->nh * st));
    DT_CHECK(pair_gemm(D, g->t, false, false, rb, g->HD, nk, 1.0, D->mixed ? Pb : Ps, L, st, V,
                       w->kld, w->kh, 1.0, Or, g->qld, D->sq, p->nh));
  }
  return DT_OK;
}

/* Scratch in the arrays' memory (dt_array_create / dt_array_free, so it is
 * counted); an empty shard still gets a buffer. */
static void *buf_get(dt_ctx *ctx, dt_array *b, dt_device_kind kind, dt_dtype t, int64_t n) {
  memset(b, 0, sizeof *b);
  int64_t m = n > 0 ? n : 1;
  if (dt_array_create(ctx, kind, t, 1, &m, b) != DT_OK) return NULL;
  return b->data;
}

static void buf_put(dt_ctx *ctx, dt_array *b) {
  if (b->data) dt_array_free(ctx, b);
  memset(b, 0, sizeof *b);
}

/* Every pair of this rank's query units with cp rank s's key units, each over
 * all the heads in runs. */
static dt_status fwd_block(const cp_geo *g, const cp_dev *D, const kv_view *w, int s,
                           const dt_array *q, char *O, char *m, char *l, void *Ps, void *Pb,
                           dt_cp_counts *n) {
  int64_t n_ob = D->nouter, n_j = g->group;
  const uint64_t rep = dt_attn_passes(D->dev->ctx, D->k, &n_ob, &n_j);
  dt_status st = DT_OK;
  for (int64_t a = 0; a < g->u && st == DT_OK; a++)
    for (int64_t bu = 0; bu < g->u && st == DT_OK; bu++) {
      pair_kind k = pair_of(g, a, s, bu, n);
      if (k == PAIR_SKIP) continue;
      for (int64_t ob = 0; ob < n_ob && st == DT_OK; ob++)
        for (int64_t h0 = 0; h0 < D->nbat && st == DT_OK; h0 += D->nb)
          for (int64_t j = 0; j < n_j && st == DT_OK; j++) {
            int64_t nh = D->nbat - h0 < D->nb ? D->nbat - h0 : D->nb;
            pair_run p = run_of(g, D, w, ob, h0, nh, j, a, bu);
            st = fwd_run(g, D, w, &p, k == PAIR_DIAG, q, O, m, l, Ps, Pb);
          }
    }
  dt_kledger_set_repeat(D->dev->ctx, rep);
  return st;
}

/* [K | V] of the local k, v into buf (one flat buffer, K then V). */
static dt_status pack_kv(const cp_dev *D, const dt_array *k, const dt_array *v, char *buf) {
  size_t nb = dt_array_bytes(k);
  DT_CHECK(dt_device_copy(D->dev, buf, k->data, nb, DT_COPY_D2D));
  return dt_device_copy(D->dev, buf + nb, v->data, nb, DT_COPY_D2D);
}

/* mixed: the f32 accumulator acc (n elements) rounded into the bf16 result. */
static dt_status acc_out(const cp_dev *D, const void *acc, void *out, int64_t n) {
  if (!D->mixed) return DT_OK;
  dt_kledger_kernel(D->dev->ctx, "cast", DT_BF16, 0, 4 * (uint64_t)n, 2 * (uint64_t)n);
  return D->kp->cast(D->dev, DT_F32, acc, DT_BF16, out, n);
}

static dt_status cp_kernel(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                           dt_tensor *const *out) {
  static const char name[] = "sdpa_cp";
  cp_geo g;
  DT_CHECK(cp_geo_get(ctx, name, a, in, &g));
  const dt_array *q = &in[0]->local, *k = &in[1]->local, *v = &in[2]->local;
  dt_array *o = &out[0]->local, *lse = &out[1]->local;
  dt_kdev kd;
  cp_dev D;
  DT_CHECK(dt_attn_kernels(ctx, name, q->dev, &kd));
  const bool mixed = cp_mixed(g.t);
  DT_CHECK(cp_dev_get(ctx, name, &g, &kd, mixed ? 6 : g.es, &D));
  if (lse->dtype != D.at)
    return dt_error(ctx, DT_ERR_INTERNAL, name, "lse is %s, not %s", dt_dtype_name(lse->dtype),
                    dt_dtype_name(D.at));
  const bool rotate = g.ring && g.C > 1;
  const size_t kvbytes = 2 * dt_array_bytes(k);
  const int64_t rows = g.B * g.H * g.Sq, pn = D.nb * D.bq * g.L;
  dt_array bml = {0}, bP = {0}, bPb = {0}, bO = {0}, bbuf = {0};
  char *m = buf_get(ctx, &bml, q->dev, D.st, 2 * rows);
  void *Ps = buf_get(ctx, &bP, q->dev, D.at, pn);
  void *Pb = mixed ? buf_get(ctx, &bPb, q->dev, g.t, pn) : NULL;
  char *O = mixed ? buf_get(ctx, &bO, q->dev, D.at, o->numel) : o->data;
  char *buf = rotate ? buf_get(ctx, &bbuf, q->dev, g.t, 2 * (int64_t)(kvbytes / g.es)) : NULL;
  dt_status s = DT_OK;
  if (!m || !Ps || (mixed && (!Pb || !O)) || (rotate && !buf)) {
    s = dt_error(ctx, DT_ERR_NOMEM, name, "scratch");
    goto done;
  }
  char *l = m + (size_t)rows * D.ss;
  s = dt_device_fill(D.dev, D.at, O, o->numel, 0.0);
  if (s == DT_OK) s = dt_device_fill(D.dev, D.st, m, rows, -INFINITY);
  if (s == DT_OK) s = dt_device_fill(D.dev, D.st, l, rows, 0.0);
  char *cur = buf, *nxt = buf ? buf + kvbytes : NULL;
  if (rotate && s == DT_OK) s = pack_kv(&D, k, v, cur);
  const int next = (g.c + 1) % g.C, prev = (g.c - 1 + g.C) % g.C;
  dt_cp_counts n = {0, 0, 0};
  for (int i = 0; i < g.C && s == DT_OK; i++) {
    int src = (g.c - i + g.C) % g.C; /* whose block is held at step i */
    if (rotate && i < g.C - 1) {
      s = dt_comm_send(g.comm, cur, kvbytes / g.es, g.t, next, CP_TAG_FWD_KV);
      if (s != DT_OK) break;
    }
    kv_view w;
    view_of(&g, D.aes, rotate, cur, NULL, k, v, NULL, NULL, src, &w);
    s = fwd_block(&g, &D, &w, src, q, O, m, l, Ps, Pb, &n);
    if (s == DT_OK && rotate && i < g.C - 1) {
      s = dt_comm_recv(g.comm, nxt, kvbytes / g.es, g.t, prev, CP_TAG_FWD_KV);
      char *t = cur;
      cur = nxt;
      nxt = t;
    }
  }
  if (s == DT_OK) s = counts_add(ctx, &n);
  /* normalise, and lse = max + log(sum): every row sees at least its own key */
  dt_op_kledger(ctx, "attn_finish", D.at, 1, rows * g.HD, rows * g.HD, rows * g.HD);
  if (s == DT_OK) s = D.ka->finish(D.dev, D.at, rows, g.HD, O, m, l, lse->data);
  if (s == DT_OK) s = acc_out(&D, O, o->data, o->numel);
done:
  buf_put(ctx, &bml);
  buf_put(ctx, &bP);
  buf_put(ctx, &bPb);
  buf_put(ctx, &bO);
  buf_put(ctx, &bbuf);
  return s;
}

/* ---- backward ------------------------------------------------------------------------- */

/* One run of a pair: dQ rows +=, and the block's dK, dV (w->dK, w->dV) +=;
 * DQ: the dq accumulator (at, laid out like q); Dr: the rowdot statistics
 * (indexed like lse); Ps, dSs: the scores scratch (at), Pb, dSb their bf16
 * copies (mixed). */
static dt_status bwd_run(const cp_geo *g, const cp_dev *Dv, const kv_view *w, const pair_run *p,
                         bool diag, const dt_tensor *const *in, char *DQ, const char *Dr, char *Ps,
                         char *dSs, char *Pb, char *dSb) {
  const size_t es = g->es, aes = Dv->aes;
  const int64_t L = g->L, bq = Dv->bq, st = bq * L, nh = p->nh;
  const dt_array *q = &in[0]->local, *lse = &in[4]->local, *dO = &in[5]->local;
  const size_t les = dt_dtype_size(lse->dtype);
  const char *Q = (const char *)q->data + (size_t)p->qo * es;
  const char *DO = (const char *)dO->data + (size_t)p->qo * es;
  const char *K = w->K + (size_t)p->ko * es, *V = w->V + (size_t)p->ko * es;
  char *DK = w->dK + (size_t)p->ko * aes, *DV = w->dV + (size_t)p->ko * aes;
  const char *P = Dv->mixed ? Pb : Ps, *dS = Dv->mixed ? dSb : dSs;
  const dt_dtype t = g->t;
  for (int64_t r0 = 0; r0 < L; r0 += bq) {
    int64_t r1 = r0 + bq < L ? r0 + bq : L, rb = r1 - r0, nk = diag ? r1 : L;
    size_t ro = (size_t)(r0 * g->qld) * es;
    int64_t si = p->lo + r0 * g->lld;
    DT_CHECK(pair_gemm(Dv, t, false, true, rb, nk, g->HD, g->scale, Q + ro, g->qld, Dv->sq, K,
                       w->kld, w->kh, 0.0, Ps, L, st, nh));
    DT_CHECK(pair_gemm(Dv, t, false, true, rb, nk, g->HD, 1.0, DO + ro, g->qld, Dv->sq, V, w->kld,
                       w->kh, 0.0, dSs, L, st, nh));
    dt_attn_rows rg = pair_rows(g, Dv, nh, r0, r1, nk, diag);
    /* P = exp(S - lse), dS = P (dP - D): subtract, exp, subtract, multiply per score */
    dt_attn_rows_kledger(Dv->dev, "attn_lse_bwd", Dv->at, &rg, 4, 2, 2);
    DT_CHECK(Dv->ka->lse_bwd(Dv->dev, Dv->at, &rg, Ps, dSs, (const char *)lse->data + (size_t)si * les,
                             Dr + (size_t)si * Dv->ss));
    DT_CHECK(to_bf16(Dv, "attn_cast", Ps, Pb, nh * st));
    DT_CHECK(to_bf16(Dv, "attn_cast", dSs, dSb, nh * st));
    DT_CHECK(pair_gemm(Dv, t, false, false, rb, g->HD, nk, g->scale, dS, L, st, K, w->kld, w->kh,
                       1.0, DQ + (size_t)(p->qo + r0 * g->qld) * aes, g->qld, Dv->sq, nh));
    DT_CHECK(pair_gemm(Dv, t, true, false, nk, g->HD, rb, g->scale, dS, L, st, Q + ro, g->qld,
                       Dv->sq, 1.0, DK, w->kld, w->kh, nh));
    DT_CHECK(pair_gemm(Dv, t, true, false, nk, g->HD, rb, 1.0, P, L, st, DO + ro, g->qld, Dv->sq,
                       1.0, DV, w->kld, w->kh, nh));
  }
  return DT_OK;
}

static dt_status bwd_block(const cp_geo *g, const cp_dev *Dv, const kv_view *w, int s,
                           const dt_tensor *const *in, char *DQ, const char *Dr, char *Ps,
                           char *dSs, char *Pb, char *dSb, dt_cp_counts *n) {
  int64_t n_ob = Dv->nouter, n_j = g->group;
  const uint64_t rep = dt_attn_passes(Dv->dev->ctx, Dv->k, &n_ob, &n_j);
  dt_status st = DT_OK;
  for (int64_t a = 0; a < g->u && st == DT_OK; a++)
    for (int64_t bu = 0; bu < g->u && st == DT_OK; bu++) {
      pair_kind k = pair_of(g, a, s, bu, n);
      if (k == PAIR_SKIP) continue;
      for (int64_t ob = 0; ob < n_ob && st == DT_OK; ob++)
        for (int64_t h0 = 0; h0 < Dv->nbat && st == DT_OK; h0 += Dv->nb)
          for (int64_t j = 0; j < n_j && st == DT_OK; j++) {
            int64_t nh = Dv->nbat - h0 < Dv->nb ? Dv->nbat - h0 : Dv->nb;
            pair_run p = run_of(g, Dv, w, ob, h0, nh, j, a, bu);
            st = bwd_run(g, Dv, w, &p, k == PAIR_DIAG, in, DQ, Dr, Ps, dSs, Pb, dSb);
          }
    }
  dt_kledger_set_repeat(Dv->dev->ctx, rep);
  return st;
}

static dt_status cp_bwd_kernel(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                               dt_tensor *const *out) {
  static const char name[] = "sdpa_cp_bwd";
  cp_geo g;
  DT_CHECK(cp_geo_get(ctx, name, a, in, &g));
  const dt_array *k = &in[1]->local, *v = &in[2]->local, *O = &in[3]->local, *dO = &in[5]->local;
  dt_array *dq = &out[0]->local, *dk = &out[1]->local, *dv = &out[2]->local;
  if (O->numel != in[0]->local.numel || dO->numel != O->numel ||
      in[4]->local.numel * g.HD != O->numel || dk->numel != k->numel || dv->numel != v->numel)
    return dt_error(ctx, DT_ERR_INTERNAL, name, "local shapes of out, lse, dout or the gradients differ");
  dt_kdev kd;
  cp_dev Dv;
  DT_CHECK(dt_attn_kernels(ctx, name, O->dev, &kd));
  const bool mixed = cp_mixed(g.t);
  DT_CHECK(cp_dev_get(ctx, name, &g, &kd, mixed ? 12 : 2 * g.es, &Dv));
  if (in[4]->local.dtype != Dv.at)
    return dt_error(ctx, DT_ERR_INTERNAL, name, "lse is %s, not %s",
                    dt_dtype_name(in[4]->local.dtype), dt_dtype_name(Dv.at));
  dt_device *d = Dv.dev;
  const bool rotate = g.ring && g.C > 1;
  const dt_dtype at = Dv.at;
  const size_t es = g.es, aes = Dv.aes, kvbytes = 2 * dt_array_bytes(k);
  const size_t kvn = kvbytes / es;
  const int64_t rows = g.B * g.H * g.Sq, pn = Dv.nb * Dv.bq * g.L;
  dt_array bD = {0}, bP = {0}, bPb = {0}, bbuf = {0}, bg = {0}, bdq = {0};
  char *Dr = buf_get(ctx, &bD, O->dev, Dv.st, rows);
  char *Ps = buf_get(ctx, &bP, O->dev, at, 2 * pn);
  char *Pb = mixed ? buf_get(ctx, &bPb, O->dev, g.t, 2 * pn) : NULL;
  /* ring: the held [K | V] and the next (t); the travelling [dK | dV] and this
   * step's contributions (at). Else, mixed: the f32 accumulators of dk, dv. */
  char *buf = rotate ? buf_get(ctx, &bbuf, O->dev, g.t, 2 * (int64_t)kvn) : NULL;
  char *gbuf = rotate || mixed ? buf_get(ctx, &bg, O->dev, at, 2 * (int64_t)kvn) : NULL;
  char *DQ = mixed ? buf_get(ctx, &bdq, O->dev, at, dq->numel) : dq->data;
  dt_status s = DT_OK;
  if (!Dr || !Ps || (mixed && (!Pb || !DQ)) || (rotate && !buf) || ((rotate || mixed) && !gbuf)) {
    s = dt_error(ctx, DT_ERR_NOMEM, name, "scratch");
    goto done;
  }
  char *dSs = Ps + (size_t)pn * aes, *dSb = Pb ? Pb + (size_t)pn * es : NULL;
  char *DK = mixed && !rotate ? gbuf : dk->data;
  char *DV = mixed && !rotate ? gbuf + (size_t)kvn / 2 * aes : dv->data;
  /* (the ring's dk, dv come whole from the last transfer) */
  s = dt_device_fill(d, at, DQ, dq->numel, 0.0);
  if (s == DT_OK && !rotate) s = dt_device_fill(d, at, DK, dk->numel, 0.0);
  if (s == DT_OK && !rotate) s = dt_device_fill(d, at, DV, dv->numel, 0.0);
  /* D_i = rowsum(dO_i * O_i) for every local row at once, indexed like lse
   * (from the rounded out, as FlashAttention-2's Alg. 2 line 4 reads O) */
  dt_op_kledger(ctx, "attn_rowdot", g.t, 2, rows * g.HD, 2 * rows * g.HD, rows);
  if (s == DT_OK) s = Dv.ka->rowdot(d, g.t, rows, g.HD, dO->data, O->data, Dr);
  char *cur = buf, *nxt = buf ? buf + kvbytes : NULL;
  char *acc = rotate ? gbuf : NULL, *part = rotate ? gbuf + kvn * aes : NULL;
  if (rotate && s == DT_OK) s = pack_kv(&Dv, k, v, cur);
  const int next = (g.c + 1) % g.C, prev = (g.c - 1 + g.C) % g.C;
  dt_cp_counts n = {0, 0, 0};
  for (int i = 0; i < g.C && s == DT_OK; i++) {
    int src = (g.c - i + g.C) % g.C;
    if (rotate && i < g.C - 1) {
      s = dt_comm_send(g.comm, cur, kvn, g.t, next, CP_TAG_BWD_KV);
      if (s != DT_OK) break;
    }
    if (rotate) s = dt_device_fill(d, at, part, (int64_t)kvn, 0.0);
    if (s != DT_OK) break;
    kv_view w;
    view_of(&g, aes, rotate, cur, part, k, v, DK, DV, src, &w);
    s = bwd_block(&g, &Dv, &w, src, in, DQ, Dr, Ps, dSs, Pb, dSb, &n);
    if (s != DT_OK || !rotate) continue;
    /* the held block's accumulator: fresh at step 0, else from rank c - 1 */
    if (i == 0) {
      char *t = acc;
      acc = part;
      part = t;
    } else {
      s = dt_comm_recv(g.comm, acc, kvn, at, prev, CP_TAG_BWD_DKV);
      if (s != DT_OK) break;
      s = dt_device_axpy(d, at, (int64_t)kvn, 1.0, part, acc);
      if (s != DT_OK) break;
    }
    s = dt_comm_send(g.comm, acc, kvn, at, next, CP_TAG_BWD_DKV);
    if (s == DT_OK && i < g.C - 1) {
      s = dt_comm_recv(g.comm, nxt, kvn, g.t, prev, CP_TAG_BWD_KV);
      char *t = cur;
      cur = nxt;
      nxt = t;
    }
  }
  /* the C-th transfer brings this rank's own block, summed over every rank */
  if (s == DT_OK && rotate) {
    s = dt_comm_recv(g.comm, acc, kvn, at, prev, CP_TAG_BWD_DKV);
    if (s == DT_OK && mixed) {
      DK = acc;
      DV = acc + kvn / 2 * aes;
    } else {
      if (s == DT_OK) s = dt_device_copy(d, dk->data, acc, kvbytes / 2, DT_COPY_D2D);
      if (s == DT_OK) s = dt_device_copy(d, dv->data, acc + kvbytes / 2, kvbytes / 2, DT_COPY_D2D);
    }
  }
  if (s == DT_OK) s = acc_out(&Dv, DQ, dq->data, dq->numel);
  if (s == DT_OK) s = acc_out(&Dv, DK, dk->data, dk->numel);
  if (s == DT_OK) s = acc_out(&Dv, DV, dv->data, dv->numel);
  if (s == DT_OK) s = counts_add(ctx, &n);
done:
  buf_put(ctx, &bD);
  buf_put(ctx, &bP);
  buf_put(ctx, &bPb);
  buf_put(ctx, &bbuf);
  buf_put(ctx, &bg);
  buf_put(ctx, &bdq);
  return s;
}

static const dt_op op_sdpa_cp_bwd = {.name = "sdpa_cp_bwd", .n_in = 6, .n_out = 3,
                                     .infer = cp_bwd_infer, .candidates = cp_bwd_candidates,
                                     .kernel = cp_bwd_kernel};


static dt_status cp_backward(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                             const dt_tensor *const *out, const dt_tensor *const *gout,
                             dt_tensor *const *gin) {
  if (gout[1])
    return dt_error(ctx, DT_ERR_UNSUPPORTED, "sdpa_cp",
                    "no gradient flows through lse (it is kept for the backward only)");
  dt_status s = DT_OK;
  if (!gout[0]) {
    for (int j = 0; j < 3 && s == DT_OK; j++)
      if (gin[j]) s = dt_attn_zeros_like(ctx, in[j], gin[j]);
    return s;
  }
  const dt_tensor *bi[6] = {in[0], in[1], in[2], out[0], out[1], gout[0]};
  dt_tensor g3[3];
  dt_tensor *o[3] = {&g3[0], &g3[1], &g3[2]};
  DT_CHECK(dt_op_call(ctx, &op_sdpa_cp_bwd, a, bi, o, NULL));
  /* dk, dv to the placements k, v came in (Partial ones made Replicate):
   * under allgather, the reduce_scatter of the Partial(sum) dK, dV */
  for (int j = 1; j < 3 && s == DT_OK; j++) {
    if (!gin[j]) continue;
    dt_placement want[DT_MAX_MESH_DIMS];
    bool same = true;
    for (int i = 0; i < in[j]->mesh_ndim; i++) {
      want[i] = in[j]->pl[i].kind == DT_PL_PARTIAL ? dt_replicate() : in[j]->pl[i];
      same = same && dt_placement_eq(want[i], g3[j].pl[i]);
    }
    if (same) continue;
    dt_tensor r;
    s = dt_redistribute(ctx, &g3[j], want, DT_PLANNER_GREEDY, &r);
    if (s != DT_OK) break;
    dt_tensor_free(ctx, &g3[j]);
    g3[j] = r;
  }
  for (int j = 0; j < 3; j++) {
    if (gin[j] && s == DT_OK) *gin[j] = g3[j];
    else dt_tensor_free(ctx, &g3[j]);
  }
  return s;
}

const dt_op dt_op_sdpa_cp = {.name = "sdpa_cp", .n_in = 3, .n_out = 2, .infer = cp_infer,
                             .candidates = cp_candidates, .kernel = cp_kernel,
                             .backward = cp_backward};
