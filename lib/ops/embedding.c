/* lib/ops/embedding.c: embedding and cross-entropy on DTensors (PyTorch's
 * torch/distributed/tensor/_ops/_embedding_ops.py: embedding_strategy,
 * embedding_dense_backward_strategy, _MaskPartial; _ops/_math_ops.py:
 * nll_loss_forward_strategy; parallel/loss.py: loss_parallel).
 *
 * embedding(weight [V, D], ids i64 [...]) -> [..., D]. Options per mesh dim,
 * [out, weight, ids], in generation order (embedding_strategy's):
 *   [R, R, R]; column-wise [S(ids.ndim), S(1), R] (no comm); row-wise
 *   [P(sum), S(0), R]; batch [S(d), R, S(d)] for each ids dim d.
 * Row-wise is PyTorch's _MaskPartial written as a plain P(sum) plus a masked
 * kernel: a rank looks up only the rows it holds (global rows goffset[0] ..
 * goffset[0] + local rows, right for uneven and nested vocab shards too) and
 * writes 0 for the others, so a later all_reduce (to R) or reduce_scatter (to
 * S) of the output resolves it. Ids outside [0, V) are DT_ERR_INVALID (checked
 * on the local ids). Backward: a private op embedding_bwd(grad_out, ids,
 * weight-template) -> grad_w, scatter-add of grad rows by id, with options
 * [grad_w, grad_out, ids, weight]: [R,R,R], [S(1),S(last),R], [P,S(d),S(d)],
 * [P,P,R] (embedding_dense_backward_strategy's) and row-wise [S(0),R,R]; the
 * weight template never moves (it only carries the placement the gradient
 * should prefer: the option whose grad_w matches the weight's placement is
 * generated first, so it wins ties).
 * No gradient for ids.
 *
 * cross_entropy(logits [..., V], targets i64 [...]) -> (mean loss over every
 * position (0-d), lse f64 [...]: each position's log-sum-exp of its logits,
 * placed as the targets; what the backward needs, as PyTorch's log_softmax
 * saves it; a saved statistic, not differentiated: a gradient given for it is
 * ignored, as for the logsumexp output of PyTorch's flash attention). Options
 * per mesh dim, [out, logits, targets] (lse as targets):
 *   [R, R, R] (nll_loss_forward_strategy replicates the class dim: the vocab dim
 *     gathered);
 *   batch [P(sum), S(d), S(d)] for each position dim d: the kernel writes the
 *     LOCAL SUM of losses divided by the GLOBAL number of positions N, so the
 *     P(sum) is exact for uneven position shards too (PyTorch's P(avg) of local
 *     means is not);
 *   loss parallel [R, S(last), R]: the vocab dim is not gathered; the
 *     kernel all_reduces (through the comm front, over each such mesh dim's
 *     communicator) the per-position max (MAX), sum of exp(x - max) (SUM) and
 *     the target logit, which only the owning rank contributes (SUM): three
 *     all_reduces of `positions` f64 elements; loss = log(sumexp) + max - x_t.
 * The dispatcher prices only input redistribution, so loss parallel is chosen
 * when the logits are already S(last). Backward: a private op
 * cross_entropy_bwd(grad 0-d, logits, targets, lse) -> dlogits =
 * (exp(logits - lse) - onehot) * grad / N with the logits' option (R, batch or
 * loss parallel): no collective in any of them (as PyTorch's loss parallel).
 *
 * log_softmax_nll(logits [..., V], targets i64 [...]) -> (mean loss (0-d), logp
 * [..., V] in the logits' dtype): TorchTitan's loss as PyTorch runs it on f32
 * logits, nll_loss(log_softmax(x)), with PyTorch's memory: logp is log_softmax's
 * output, which its backward reads (aten::_log_softmax saves its result), so the
 * logits are not kept for backward; the backward makes nll_loss's dense gradient
 * and then log_softmax's (three [..., V] arrays live at once, as in PyTorch). The
 * loss is cross_entropy's (same kernel, options, all_reduces); logp = x - lse. A
 * gradient given for logp is ignored (it is a saved value, as lse is).
 *
 * Kernels: the rows slots of the arrays' device (lib/device/kernels.h: the
 * CPU's f32 and f64 computed in double, the GPU's f32, f64 and bf16), i64
 * ids/targets: embedding / embedding_bwd (a bf16 gradient is summed in an f32
 * scratch and rounded once), ce_max / ce_sumexp / ce_loss (the loss-parallel
 * all_reduces on the statistics, in the arrays' memory, between them), ce_bwd
 * (the 0-d grad read where it lives). Ids and targets are range-checked by the
 * device's check_ids where it has one (the CPU); the GPU builds would have to
 * read them back to the host, so there an id outside the table gives 0 rows /
 * no target logit, never a fault.
 * What it is not: padding_idx, max_norm, class weights, ignore_index, label
 * smoothing, reductions other than mean.
 */
#include "config.h"

#include <string.h>

#include "ops/ops.h"

/* ---- helpers ----------------------------------------------------------------- */

static dt_status check_float(dt_ctx *ctx, const char *name, const char *what, dt_dtype t) {
  if (t != DT_F32 && t != DT_F64 && t != DT_BF16)
    return dt_error(ctx, DT_ERR_UNSUPPORTED, name, "%s is %s; only f32, f64 and bf16 are supported",
                    what, dt_dtype_name(t));
  return DT_OK;
}


static dt_status check_i64(dt_ctx *ctx, const char *name, const char *what, dt_dtype t) {
  if (t != DT_I64)
    return dt_error(ctx, DT_ERR_INVALID, name, "%s must be i64, not %s", what, dt_dtype_name(t));
  return DT_OK;
}

/* Every local id in [0, V) where the device can check it (its check_ids);
 * DT_ERR_INVALID naming the first one that is not. */
static dt_status check_ids(const dt_kdev *kd, const char *name, const dt_array *ids, int64_t V) {
  if (!kd->k->rows->check_ids) return DT_OK;
  return kd->k->rows->check_ids(kd->dev, name, ids->numel, ids->data, V);
}

static dt_status room(dt_ctx *ctx, const char *name, int need, int max) {
  if (need > max) return dt_error(ctx, DT_ERR_INTERNAL, name, "no room for %d options", need);
  return DT_OK;
}

/* ---- embedding forward ----------------------------------------------------------- */

static dt_status emb_infer(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in, dt_spec *out) {
  (void)a;
  DT_CHECK(check_float(ctx, "embedding", "weight", in[0].dtype));
  DT_CHECK(check_i64(ctx, "embedding", "ids", in[1].dtype));
  if (in[0].ndim != 2)
    return dt_error(ctx, DT_ERR_INVALID, "embedding", "weight must be 2-d [vocab, dim], not %d-d",
                    in[0].ndim);
  if (in[1].ndim + 1 > DT_MAX_DIMS)
    return dt_error(ctx, DT_ERR_INVALID, "embedding", "ids have too many dims (%d)", in[1].ndim);
  out->dtype = in[0].dtype;
  out->ndim = in[1].ndim + 1;
  for (int d = 0; d < in[1].ndim; d++) out->gshape[d] = in[1].gshape[d];
  out->gshape[in[1].ndim] = in[0].gshape[1];
  return DT_OK;
}

static void opt3(dt_dim_option *o, dt_placement out, dt_placement w, dt_placement ids) {
  memset(o, 0, sizeof *o);
  o->out[0] = out;
  o->in[0] = w;
  o->in[1] = ids;
}

static dt_status emb_options(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in,
                             const dt_spec *out, int mesh_dim, dt_dim_option *opt, int *n, int max) {
  (void)a;
  (void)out;
  (void)mesh_dim;
  int r = in[1].ndim;
  DT_CHECK(room(ctx, "embedding", 3 + r, max));
  const dt_placement R = dt_replicate();
  int k = 0;
  opt3(&opt[k++], R, R, R);
  opt3(&opt[k++], dt_shard(r), dt_shard(1), R);
  opt3(&opt[k++], dt_partial(DT_RED_SUM), dt_shard(0), R);
  for (int d = 0; d < r; d++) opt3(&opt[k++], dt_shard(d), R, dt_shard(d));
  *n = k;
  return DT_OK;
}

/* out[i, :] = weight[ids[i] - off, :] when the row is held here, else 0. The
 * local weight is [rows, cols] at global row offset off; the local output is
 * [ids local..., cols]. */
static dt_status emb_kernel(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                            dt_tensor *const *out) {
  (void)a;
  const dt_tensor *w = in[0];
  const dt_array *W = &w->local, *I = &in[1]->local;
  dt_array *Y = &out[0]->local;
  int64_t rows = W->shape[0], cols = W->shape[1], off = w->goffset[0];
  if (Y->numel != I->numel * cols)
    return dt_error(ctx, DT_ERR_INTERNAL, "embedding", "local output has %lld elements, expected %lld",
                    (long long)Y->numel, (long long)(I->numel * cols));
  dt_kdev kd;
  DT_CHECK(dt_device_kernels(ctx, W->dev, "embedding", &kd));
  DT_OP_KSLOT(ctx, "embedding", kd.k->rows, embedding);
  DT_CHECK(check_ids(&kd, "embedding", I, w->gshape[0]));
  dt_op_kledger(ctx, "embedding", W->dtype, 0, Y->numel, Y->numel, Y->numel);
  return kd.k->rows->embedding(kd.dev, W->dtype, I->numel, I->data, rows, cols, off, W->data,
                               Y->data);
}

/* ---- embedding backward: the private op --------------------------------------------- */

/* embedding_bwd(grad_out [..., D], ids [...], weight [V, D]) -> grad_w [V, D].
 * The weight is a template: never moved, its data never read. */
static dt_status embb_infer(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in, dt_spec *out) {
  (void)a;
  DT_CHECK(check_float(ctx, "embedding_bwd", "grad", in[0].dtype));
  DT_CHECK(check_i64(ctx, "embedding_bwd", "ids", in[1].dtype));
  if (in[2].ndim != 2 || in[0].ndim != in[1].ndim + 1 || in[0].gshape[in[1].ndim] != in[2].gshape[1])
    return dt_error(ctx, DT_ERR_INVALID, "embedding_bwd", "grad, ids and weight shapes disagree");
  out->dtype = in[0].dtype;
  out->ndim = 2;
  out->gshape[0] = in[2].gshape[0];
  out->gshape[1] = in[2].gshape[1];
  return DT_OK;
}

static dt_status embb_options(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in,
                              const dt_spec *out, int mesh_dim, dt_dim_option *opt, int *n, int max) {
  (void)a;
  (void)out;
  int r = in[1].ndim;
  DT_CHECK(room(ctx, "embedding_bwd", 5 + r, max));
  const dt_placement R = dt_replicate(), P = dt_partial(DT_RED_SUM), wp = in[2].pl[mesh_dim];
  dt_dim_option all[DT_OP_MAX_OPTIONS];
  int k = 0;
#define EB(gw, go, id)                        \
  do {                                        \
    memset(&all[k], 0, sizeof all[k]);        \
    all[k].out[0] = (gw);                     \
    all[k].in[0] = (go);                      \
    all[k].in[1] = (id);                      \
    all[k].in[2] = wp;                        \
    k++;                                      \
  } while (0)
  EB(R, R, R);
  EB(dt_shard(1), dt_shard(r), R);
  for (int d = 0; d < r; d++) EB(P, dt_shard(d), dt_shard(d));
  EB(P, P, R);
  EB(dt_shard(0), R, R); /* row-wise: each rank accumulates the rows it owns */
#undef EB
  /* the options whose grad_w has the weight's placement first (they win ties) */
  int m = 0;
  for (int pass = 0; pass < 2; pass++)
    for (int j = 0; j < k; j++)
      if (dt_placement_eq(all[j].out[0], wp) == (pass == 0)) opt[m++] = all[j];
  *n = m;
  return DT_OK;
}

static dt_status embb_kernel(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                             dt_tensor *const *out) {
  (void)a;
  const dt_array *G = &in[0]->local, *I = &in[1]->local;
  dt_tensor *gw = out[0];
  dt_array *Y = &gw->local;
  int64_t rows = Y->shape[0], cols = Y->shape[1], off = gw->goffset[0];
  if (G->numel != I->numel * cols)
    return dt_error(ctx, DT_ERR_INTERNAL, "embedding_bwd", "local grad has %lld elements, expected %lld",
                    (long long)G->numel, (long long)(I->numel * cols));
  dt_kdev kd;
  DT_CHECK(dt_device_kernels(ctx, Y->dev, "embedding_bwd", &kd));
  const dt_kern_rows *R = kd.k->rows;
  DT_OP_KSLOT(ctx, "embedding_bwd", R, embedding_bwd);
  DT_CHECK(check_ids(&kd, "embedding_bwd", I, gw->gshape[0]));
  dt_op_kledger(ctx, "embedding_bwd", G->dtype, 1, G->numel, G->numel, G->numel);
  if (Y->dtype != DT_BF16)
    return R->embedding_bwd(kd.dev, G->dtype, I->numel, I->data, G->data, rows, cols, off,
                            Y->dtype, Y->data);
  /* bf16: the sums in f32, rounded to bf16 once */
  DT_OP_KSLOT(ctx, "embedding_bwd", kd.k->pw, cast);
  dt_array acc;
  DT_CHECK(dt_array_create(ctx, Y->dev, DT_F32, 2, Y->shape, &acc));
  dt_status s = R->embedding_bwd(kd.dev, G->dtype, I->numel, I->data, G->data, rows, cols, off,
                                 DT_F32, acc.data);
  dt_kledger_kernel(ctx, "cast", DT_BF16, 0, 4 * (uint64_t)Y->numel, 2 * (uint64_t)Y->numel);
  if (s == DT_OK) s = kd.k->pw->cast(kd.dev, DT_F32, acc.data, DT_BF16, Y->data, Y->numel);
  dt_array_free(ctx, &acc);
  return s;
}

static const dt_op op_embedding_bwd = {.name = "embedding_bwd", .n_in = 3, .n_out = 1,
                                       .infer = embb_infer, .options = embb_options,
                                       .kernel = embb_kernel};

static dt_status emb_backward(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                              const dt_tensor *const *out, const dt_tensor *const *gout,
                              dt_tensor *const *gin) {
  (void)a;
  (void)out;
  /* gin[1] (ids) is left empty: no gradient for indices */
  if (!gin[0] || !gout[0]) return DT_OK; /* no gradient in: grad_w is zero (left empty) */
  dt_op_attrs z;
  memset(&z, 0, sizeof z);
  const dt_tensor *bi[3] = {gout[0], in[1], in[0]};
  dt_tensor *bo[1] = {gin[0]};
  return dt_op_call(ctx, &op_embedding_bwd, &z, bi, bo, NULL);
}

const dt_op dt_op_embedding = {.name = "embedding", .n_in = 2, .n_out = 1, .infer = emb_infer,
                               .options = emb_options, .kernel = emb_kernel,
                               .backward = emb_backward,
    .bwd_meta_out = 1};

/* ---- cross entropy ------------------------------------------------------------------ */

static dt_status ce_shapes(dt_ctx *ctx, const char *name, const dt_spec *x, const dt_spec *t) {
  DT_CHECK(check_float(ctx, name, "logits", x->dtype));
  DT_CHECK(check_i64(ctx, name, "targets", t->dtype));
  bool ok = x->ndim >= 1 && t->ndim == x->ndim - 1;
  for (int d = 0; ok && d < t->ndim; d++) ok = t->gshape[d] == x->gshape[d];
  if (!ok)
    return dt_error(ctx, DT_ERR_INVALID, name,
                    "targets must have the logits' shape without the last (vocab) dim");
  return DT_OK;
}

static dt_status ce_infer(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in, dt_spec *out) {
  (void)a;
  DT_CHECK(ce_shapes(ctx, "cross_entropy", &in[0], &in[1]));
  out[0].dtype = in[0].dtype;
  out[0].ndim = 0;
  out[1].dtype = DT_F64; /* lse, shaped as the targets */
  out[1].ndim = in[1].ndim;
  for (int d = 0; d < in[1].ndim; d++) out[1].gshape[d] = in[1].gshape[d];
  return DT_OK;
}

static dt_status ce_options(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in,
                            const dt_spec *out, int mesh_dim, dt_dim_option *opt, int *n, int max) {
  (void)a;
  (void)out;
  (void)mesh_dim;
  int last = in[0].ndim - 1;
  DT_CHECK(room(ctx, "cross_entropy", 2 + last, max));
  const dt_placement R = dt_replicate();
  int k = 0;
  opt3(&opt[k++], R, R, R);
  for (int d = 0; d < last; d++) opt3(&opt[k++], dt_partial(DT_RED_SUM), dt_shard(d), dt_shard(d));
  opt3(&opt[k++], R, dt_shard(last), R); /* loss parallel */
  for (int i = 0; i < k; i++) opt[i].out[1] = opt[i].in[1]; /* lse is placed as the targets */
  *n = k;
  return DT_OK;
}

/* number of positions of the global logits */
static double ce_N(const dt_tensor *x) {
  double N = 1;
  for (int d = 0; d + 1 < x->ndim; d++) N *= (double)x->gshape[d];
  return N;
}

/* All-reduces the n f64 statistics v (in the logits' memory) with op over
 * each mesh dim that shards the vocab (S(last)). */
static dt_status vocab_all_reduce(const dt_tensor *x, double *v, int64_t n, dt_reduce_op op) {
  for (int i = 0; i < x->mesh_ndim; i++)
    if (x->pl[i].kind == DT_PL_SHARD && x->pl[i].dim == x->ndim - 1)
      DT_CHECK(dt_comm_all_reduce(dt_mesh_comm(x->mesh, i), v, v, (size_t)n, DT_F64, op));
  return DT_OK;
}

/* The statistics in a scratch [mx | se | tl] on the logits' device; per
 * position mx = the global max, se = the global sum of exp(x - mx), tl = the
 * target logit (only the owning vocab shard contributes), each all_reduced
 * over the vocab-sharding mesh dims (the max first: the sum of exp is taken
 * against it); then lse and the loss, the local sum of lse - tl over the
 * GLOBAL number of positions (an exact P(sum)). */
static dt_status ce_kernel(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                           dt_tensor *const *out) {
  (void)a;
  const dt_tensor *x = in[0];
  const dt_array *X = &x->local, *T = &in[1]->local;
  int last = x->ndim - 1;
  int64_t Vl = X->shape[last], voff = x->goffset[last], npos = T->numel;
  if (X->numel != npos * Vl)
    return dt_error(ctx, DT_ERR_INTERNAL, "cross_entropy", "local logits and targets disagree");
  dt_array *lse = &out[1]->local;
  if (lse->numel != npos || lse->dtype != DT_F64)
    return dt_error(ctx, DT_ERR_INTERNAL, "cross_entropy", "local lse and targets disagree");
  dt_kdev kd;
  DT_CHECK(dt_device_kernels(ctx, X->dev, "cross_entropy", &kd));
  const dt_kern_rows *R = kd.k->rows;
  DT_OP_KSLOT(ctx, "cross_entropy", R, ce_max);
  DT_OP_KSLOT(ctx, "cross_entropy", R, ce_sumexp);
  DT_OP_KSLOT(ctx, "cross_entropy", R, ce_loss);
  /* every rank of a vocab group holds the same targets, so all fail alike here,
   * before any collective */
  DT_CHECK(check_ids(&kd, "cross_entropy", T, x->gshape[last]));
  bool vocab_sharded = false;
  for (int i = 0; i < x->mesh_ndim; i++)
    vocab_sharded |= x->pl[i].kind == DT_PL_SHARD && x->pl[i].dim == last;
  int64_t n3 = 3 * npos + 1;
  dt_array st;
  DT_CHECK(dt_array_create(ctx, X->dev, DT_F64, 1, &n3, &st));
  double *mx = st.data, *se = mx + npos, *tl = se + npos;
  dt_status s = DT_OK;
  /* a pass for the row max when the vocabulary is split (else ce_sumexp finds it), then
   * exp, sum and the target's logit per element */
  if (vocab_sharded) dt_op_kledger(ctx, "ce_max", X->dtype, 1, npos * Vl, npos * Vl, 0);
  dt_op_kledger(ctx, "ce_sumexp", X->dtype, 3, npos * Vl, npos * Vl, 0);
  dt_op_kledger(ctx, "ce_loss", DT_F64, 4, npos, 3 * npos, npos);
  if (vocab_sharded) {
    s = R->ce_max(kd.dev, X->dtype, npos, Vl, X->data, mx);
    if (s == DT_OK) s = vocab_all_reduce(x, mx, npos, DT_RED_MAX);
  }
  if (s == DT_OK)
    s = R->ce_sumexp(kd.dev, X->dtype, npos, Vl, voff, X->data, T->data, !vocab_sharded, mx, se,
                     tl);
  if (s == DT_OK) s = vocab_all_reduce(x, se, npos, DT_RED_SUM);
  if (s == DT_OK) s = vocab_all_reduce(x, tl, npos, DT_RED_SUM);
  if (s == DT_OK)
    s = R->ce_loss(kd.dev, X->dtype, npos, ce_N(x), mx, se, tl, lse->data, out[0]->local.data);
  dt_array_free(ctx, &st);
  return s;
}

/* cross_entropy_bwd(grad 0-d, logits, targets) -> dlogits */
static dt_status ceb_infer(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in, dt_spec *out) {
  (void)a;
  DT_CHECK(ce_shapes(ctx, "cross_entropy_bwd", &in[1], &in[2]));
  if (in[0].ndim != 0)
    return dt_error(ctx, DT_ERR_INVALID, "cross_entropy_bwd", "grad must be 0-d");
  bool lse_ok = in[3].dtype == DT_F64 && in[3].ndim == in[2].ndim;
  for (int d = 0; lse_ok && d < in[2].ndim; d++) lse_ok = in[3].gshape[d] == in[2].gshape[d];
  if (!lse_ok)
    return dt_error(ctx, DT_ERR_INVALID, "cross_entropy_bwd", "lse must be f64 shaped as the targets");
  out->dtype = in[1].dtype;
  out->ndim = in[1].ndim;
  for (int d = 0; d < in[1].ndim; d++) out->gshape[d] = in[1].gshape[d];
  return DT_OK;
}

static dt_status ceb_options(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in,
                             const dt_spec *out, int mesh_dim, dt_dim_option *opt, int *n, int max) {
  (void)a;
  (void)out;
  (void)mesh_dim;
  int last = in[1].ndim - 1;
  DT_CHECK(room(ctx, "cross_entropy_bwd", 2 + last, max));
  const dt_placement R = dt_replicate();
  int k = 0;
#define CB(gx, x, t)                   \
  do {                                 \
    memset(&opt[k], 0, sizeof opt[k]); \
    opt[k].out[0] = (gx);              \
    opt[k].in[0] = R;                  \
    opt[k].in[1] = (x);                \
    opt[k].in[2] = (t);                \
    opt[k].in[3] = (t);                \
    k++;                               \
  } while (0)
  CB(R, R, R);
  for (int d = 0; d < last; d++) CB(dt_shard(d), dt_shard(d), dt_shard(d));
  CB(dt_shard(last), dt_shard(last), R);
#undef CB
  *n = k;
  return DT_OK;
}

static dt_status ceb_kernel(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                            dt_tensor *const *out) {
  (void)a;
  const dt_tensor *x = in[1];
  const dt_array *X = &x->local, *T = &in[2]->local;
  dt_array *Y = &out[0]->local;
  int last = x->ndim - 1;
  int64_t Vl = X->shape[last], voff = x->goffset[last], npos = T->numel;
  if (X->numel != npos * Vl || Y->numel != X->numel)
    return dt_error(ctx, DT_ERR_INTERNAL, "cross_entropy_bwd", "local logits and targets disagree");
  const dt_array *LSE = &in[3]->local;
  if (LSE->numel != npos)
    return dt_error(ctx, DT_ERR_INTERNAL, "cross_entropy_bwd", "local lse and targets disagree");
  dt_kdev kd;
  DT_CHECK(dt_device_kernels(ctx, X->dev, "cross_entropy_bwd", &kd));
  DT_OP_KSLOT(ctx, "cross_entropy_bwd", kd.k->rows, ce_bwd);
  DT_CHECK(check_ids(&kd, "cross_entropy_bwd", T, x->gshape[last]));
  dt_op_kledger(ctx, "cross_entropy_bwd", X->dtype, 4, X->numel, X->numel, X->numel);
  return kd.k->rows->ce_bwd(kd.dev, X->dtype, npos, Vl, voff, X->data, T->data, LSE->data,
                            in[0]->local.data, ce_N(x), Y->data);
}

static const dt_op op_cross_entropy_bwd = {.name = "cross_entropy_bwd", .n_in = 4, .n_out = 1,
                                           .infer = ceb_infer, .options = ceb_options,
                                           .kernel = ceb_kernel};

static dt_status ce_backward(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                             const dt_tensor *const *out, const dt_tensor *const *gout,
                             dt_tensor *const *gin) {
  (void)a;
  if (!gin[0] || !gout[0]) return DT_OK; /* gin[1] (targets): no gradient; lse: none */
  dt_op_attrs z;
  memset(&z, 0, sizeof z);
  const dt_tensor *bi[4] = {gout[0], in[0], in[1], out[1]};
  dt_tensor *bo[1] = {gin[0]};
  return dt_op_call(ctx, &op_cross_entropy_bwd, &z, bi, bo, NULL);
}

const dt_op dt_op_cross_entropy = {.name = "cross_entropy", .n_in = 2, .n_out = 2,
                                   .infer = ce_infer, .options = ce_options, .kernel = ce_kernel,
                                   .backward = ce_backward};

/* ---- TorchTitan's loss as PyTorch runs it: nll_loss(log_softmax(x)) ----------------- */

static dt_status lsn_infer(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in, dt_spec *out) {
  (void)a;
  DT_CHECK(ce_shapes(ctx, "log_softmax_nll", &in[0], &in[1]));
  out[0].dtype = in[0].dtype;
  out[0].ndim = 0;
  out[1].dtype = in[0].dtype; /* logp, shaped as the logits */
  out[1].ndim = in[0].ndim;
  for (int d = 0; d < in[0].ndim; d++) out[1].gshape[d] = in[0].gshape[d];
  return DT_OK;
}

static dt_status lsn_options(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in,
                             const dt_spec *out, int mesh_dim, dt_dim_option *opt, int *n, int max) {
  DT_CHECK(ce_options(ctx, a, in, out, mesh_dim, opt, n, max));
  for (int i = 0; i < *n; i++) opt[i].out[1] = opt[i].in[0]; /* logp is placed as the logits */
  return DT_OK;
}

/* The loss by cross_entropy's kernel (its statistics, all_reduces and loss), then
 * logp = x - lse: lse cast to the logits' dtype, subtracted along each row. */
static dt_status lsn_kernel(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                            dt_tensor *const *out) {
  const dt_array *X = &in[0]->local;
  const int64_t npos = in[1]->local.numel, Vl = X->shape[in[0]->ndim - 1];
  dt_tensor lse;
  memset(&lse, 0, sizeof lse);
  DT_CHECK(dt_array_create(ctx, X->dev, DT_F64, 1, &npos, &lse.local));
  dt_tensor *co[2] = {out[0], &lse};
  dt_status s = ce_kernel(ctx, a, in, co);
  dt_array lt = {0};
  if (s == DT_OK) s = dt_array_create(ctx, X->dev, X->dtype, 1, &npos, &lt);
  dt_kdev kd;
  if (s == DT_OK) s = dt_device_kernels(ctx, X->dev, "log_softmax_nll", &kd);
  if (s == DT_OK && (!kd.k->pw || !kd.k->pw->cast || !kd.k->pw->binary))
    s = dt_error(ctx, DT_ERR_UNSUPPORTED, "log_softmax_nll", "the device has no cast or binary");
  if (s == DT_OK) s = kd.k->pw->cast(kd.dev, DT_F64, lse.local.data, X->dtype, lt.data, npos);
  if (s == DT_OK) {
    const int64_t shape[2] = {npos, Vl}, sa[2] = {Vl, 1}, sb[2] = {1, 0};
    dt_op_kledger(ctx, "log_softmax", X->dtype, 1, X->numel, X->numel + npos, X->numel);
    s = kd.k->pw->binary(kd.dev, X->dtype, DT_PW_SUB, 2, shape, X->data, sa, lt.data, sb,
                         out[1]->local.data);
  }
  dt_array_free(ctx, &lt);
  dt_array_free(ctx, &lse.local);
  return s;
}

/* log_softmax_nll_bwd(grad 0-d, logp, targets) -> dlogits */
static dt_status lsnb_infer(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in, dt_spec *out) {
  (void)a;
  DT_CHECK(ce_shapes(ctx, "log_softmax_nll_bwd", &in[1], &in[2]));
  if (in[0].ndim != 0)
    return dt_error(ctx, DT_ERR_INVALID, "log_softmax_nll_bwd", "grad must be 0-d");
  out->dtype = in[1].dtype;
  out->ndim = in[1].ndim;
  for (int d = 0; d < in[1].ndim; d++) out->gshape[d] = in[1].gshape[d];
  return DT_OK;
}

/* nll_loss's gradient G = -onehot * g / N, dense as aten::nll_loss_backward makes it
 * (cross_entropy's backward kernel with an lse of 1e30, where exp(logp - lse) is
 * exactly 0), alive beside logp and dlogits as in PyTorch; then log_softmax's
 * gradient, G - exp(logp) * rowsum(G), in its closed form for this G (rowsum(G) =
 * -g / N: each row's target is held by one vocab shard): (exp(logp) - onehot) * g /
 * N, the same kernel with an lse of 0. G's values are exact but only its memory and
 * its pass are used: the closed form reads logp, not G. */
static dt_status lsnb_kernel(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                             dt_tensor *const *out) {
  (void)a;
  const dt_tensor *y = in[1];
  const dt_array *Y = &y->local, *T = &in[2]->local;
  dt_array *DX = &out[0]->local;
  const int last = y->ndim - 1;
  const int64_t Vl = Y->shape[last], voff = y->goffset[last], npos = T->numel;
  if (Y->numel != npos * Vl || DX->numel != Y->numel)
    return dt_error(ctx, DT_ERR_INTERNAL, "log_softmax_nll_bwd", "local logp and targets disagree");
  dt_kdev kd;
  DT_CHECK(dt_device_kernels(ctx, Y->dev, "log_softmax_nll_bwd", &kd));
  DT_OP_KSLOT(ctx, "log_softmax_nll_bwd", kd.k->rows, ce_bwd);
  DT_CHECK(check_ids(&kd, "log_softmax_nll_bwd", T, y->gshape[last]));
  dt_array big = {0}, zero = {0}, G = {0};
  dt_status s = dt_array_create(ctx, Y->dev, DT_F64, 1, &npos, &big);
  if (s == DT_OK) s = dt_array_create(ctx, Y->dev, DT_F64, 1, &npos, &zero);
  if (s == DT_OK) s = dt_array_create(ctx, Y->dev, Y->dtype, Y->ndim, Y->shape, &G);
  if (s == DT_OK) s = dt_device_fill(kd.dev, DT_F64, big.data, npos, 1e30);
  if (s == DT_OK) s = dt_device_fill(kd.dev, DT_F64, zero.data, npos, 0.0);
  const double N = ce_N(y);
  if (s == DT_OK) {
    dt_op_kledger(ctx, "nll_loss_bwd", Y->dtype, 0, Y->numel, 0, Y->numel);
    s = kd.k->rows->ce_bwd(kd.dev, Y->dtype, npos, Vl, voff, Y->data, T->data, big.data,
                           in[0]->local.data, N, G.data);
  }
  if (s == DT_OK) {
    dt_op_kledger(ctx, "log_softmax_bwd", Y->dtype, 4, Y->numel, 2 * Y->numel, Y->numel);
    s = kd.k->rows->ce_bwd(kd.dev, Y->dtype, npos, Vl, voff, Y->data, T->data, zero.data,
                           in[0]->local.data, N, DX->data);
  }
  dt_array_free(ctx, &G);
  dt_array_free(ctx, &zero);
  dt_array_free(ctx, &big);
  return s;
}

static const dt_op op_log_softmax_nll_bwd = {.name = "log_softmax_nll_bwd", .n_in = 3,
                                             .n_out = 1, .infer = lsnb_infer,
                                             .options = ceb_options, /* its in[3] unread */
                                             .kernel = lsnb_kernel};

static dt_status lsn_backward(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                              const dt_tensor *const *out, const dt_tensor *const *gout,
                              dt_tensor *const *gin) {
  (void)a;
  if (!gin[0] || !gout[0]) return DT_OK; /* no gradient for the targets; none through logp */
  dt_op_attrs z;
  memset(&z, 0, sizeof z);
  const dt_tensor *bi[3] = {gout[0], out[1], in[1]};
  dt_tensor *bo[1] = {gin[0]};
  return dt_op_call(ctx, &op_log_softmax_nll_bwd, &z, bi, bo, NULL);
}

/* backward reads logp and the targets, not the logits (log_softmax's backward reads
 * its output) nor the loss */
const dt_op dt_op_log_softmax_nll = {.name = "log_softmax_nll", .n_in = 2, .n_out = 2,
                                     .infer = lsn_infer, .options = lsn_options,
                                     .kernel = lsn_kernel, .backward = lsn_backward,
                                     .bwd_meta_in = 1, .bwd_meta_out = 1};
