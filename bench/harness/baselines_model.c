/* bench/harness/baselines_model.c: the analytic numbers of bench/harness/baselines.h,
 * no I/O, so the tests link it alone.
 *
 * Framework baselines come from the published formulas only, each cited where
 * it is used:
 *   [MLM]  Shoeybi et al. 2019, "Megatron-LM: Training Multi-Billion Parameter
 *          Language Models Using Model Parallelism", arXiv:1909.08053
 *   [SP]   Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
 *          Transformer Models", arXiv:2205.05198
 *   [PTD]  Narayanan et al. 2021, "Efficient Large-Scale Language Model Training
 *          on GPU Clusters Using Megatron-LM", arXiv:2104.04473
 *   [ZeRO] Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training
 *          Trillion Parameter Models", arXiv:1910.02054
 *   [DDP]  Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data
 *          Parallel Training", arXiv:2006.15704
 *   [FSDP] Zhao et al. 2023, "PyTorch FSDP: Experiences on Scaling Fully Sharded
 *          Data Parallel", arXiv:2304.11277
 *   [GPipe] Huang et al. 2019, arXiv:1811.06965; [Ring] Liu et al. 2023, "Ring
 *          Attention with Blockwise Transformers", arXiv:2310.01889
 *   ring model: NVIDIA/nccl-tests doc/PERFORMANCE.md (bus bandwidth factors)
 * The runtime's own closed form (sb_runtime_comm) is at the end, apart.
 *
 * Symbols: b = sequences per DP rank per step (all micro-batches), s = tokens
 * per CP rank, h = dim, a = heads, h_kv = kv_heads * head_dim, V = vocab, L =
 * layers, t/p/c = tp/pp/cp, d = dp_replicate * dp_shard, e = bytes per element,
 * Psi = parameters on one rank (sb_params_per_rank).
 * Ring model: AR 2(n-1)/n * S, AG and RS (n-1)/n * S, S = the full tensor's bytes.
 */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "baselines.h"

/* Mixed-precision Adam: 16-bit params and grads (2 + 2 bytes) and K = 12 bytes of
 * optimizer state per parameter (fp32 master params, momentum, variance):
 * [ZeRO] sec. 3.1. */
static const double ZERO_K = 12.0;
static const double ZERO_PARAM_B = 2.0, ZERO_GRAD_B = 2.0;
/* fp32 training with Adam, fully sharded: 4 param + 4 grad + 8 Adam bytes per
 * parameter (the fp32 case of the same count). */
static const double FSDP_BYTES_PER_PARAM = 16.0;
/* torchtitan's FSDP2 mixed precision: params all-gathered in bf16 (2 B) twice,
 * gradients reduce-scattered in fp32 (4 B) (its mixed_precision_param /
 * mixed_precision_reduce defaults). */
static const double FSDP_MP_BYTES = 2.0 + 2.0 + 4.0;

static double ring_ar(double bytes, int n) { return n > 1 ? 2.0 * (n - 1) / n * bytes : 0.0; }
static double ring_ag(double bytes, int n) { return n > 1 ? (double)(n - 1) / n * bytes : 0.0; }

int sb_baseline_check(const sb_baseline_in *in, char *err, size_t errn) {
  const dt_llama_config *m = &in->model;
  if (m->no_embedding || m->no_attention || m->no_feed_forward || m->no_head) {
    snprintf(err, errn, "the framework formulas count a whole model (embedding, layers, head); "
                        "the single-layer workloads have none");
    return -1;
  }
  if (in->pp < 1 || in->dp_replicate < 1 || in->dp_shard < 1 || in->cp < 1 || in->tp < 1) {
    snprintf(err, errn, "mesh sizes must be >= 1");
    return -1;
  }
  if (in->batch < 1 || in->seq < 1 || in->elem_bytes < 1 || in->microbatches < 1 ||
      in->virtual_stages < 1) {
    snprintf(err, errn, "batch, seq, microbatches and virtual stages must be >= 1");
    return -1;
  }
  if (m->dim < 1 || m->n_layers < 1 || m->n_heads < 1 || m->n_kv_heads < 1 || m->vocab < 1) {
    snprintf(err, errn, "bad model config");
    return -1;
  }
  int64_t d = (int64_t)in->dp_replicate * in->dp_shard;
  if (in->batch % d) {
    snprintf(err, errn, "batch %lld is not divisible by dp_replicate * dp_shard = %lld",
             (long long)in->batch, (long long)d);
    return -1;
  }
  if (in->seq % in->cp) {
    snprintf(err, errn, "seq %lld is not divisible by cp %d", (long long)in->seq, in->cp);
    return -1;
  }
  if (in->pp > m->n_layers + 2) { /* the embedding and the head count as a layer each */
    snprintf(err, errn, "pp %d is more than the model's %d layers + 2", in->pp, m->n_layers);
    return -1;
  }
  return 0;
}

/* ---- a plan's traits ---- */

/* The style the plan gives fqn on plan dim tpi: the last matching entry, as
 * dt_parallelize_module applies entries in order and a later one replaces an
 * earlier one's hooks. NULL: none. */
static const dt_style *style_on(const dt_plan *p, int tpi, const char *fqn) {
  const dt_style *s = NULL;
  if (tpi < 0) return NULL;
  for (int e = 0; e < p->n_entries; e++)
    if (p->entries[e].dim == tpi && dt_fqn_match(p->entries[e].pattern, fqn))
      s = &p->entries[e].style;
  return s;
}

static bool is_style(const dt_style *s, dt_style_kind k) { return s && s->kind == k; }

/* Shard(1) / Shard(-2): the sequence dim of (batch, seq, dim) activations. */
static bool seq_shard(const dt_style_layout *l, int n) {
  for (int i = 0; i < n; i++)
    if (!l[i].none && l[i].pl.kind == DT_PL_SHARD && (l[i].pl.dim == 1 || l[i].pl.dim == -2))
      return true;
  return false;
}

dt_status sb_workload_config(dt_ctx *ctx, const char *model, const char *workload,
                             dt_llama_config *out) {
  DT_CHECK(dt_llama_config_get(ctx, model, out));
  if (!strcmp(workload, "model")) return DT_OK;
  /* one layer, or none, with only the workload's modules (lib/nn's no_* fields) */
  const bool emb = !strcmp(workload, "embedding"), att = !strcmp(workload, "attention");
  const bool ffn = !strcmp(workload, "feed_forward"), head = !strcmp(workload, "output");
  if (!emb && !att && !ffn && !head && strcmp(workload, "block"))
    return dt_error(ctx, DT_ERR_INVALID, "sb_workload_config", "unknown workload '%s'", workload);
  out->n_layers = att || ffn || !strcmp(workload, "block") ? 1 : 0;
  out->no_embedding = !emb && strcmp(workload, "block");
  out->no_head = !head && strcmp(workload, "block");
  out->no_attention = ffn;
  out->no_feed_forward = att;
  return DT_OK;
}

bool sb_workload_single(const char *workload) {
  return strcmp(workload, "model") && strcmp(workload, "block");
}

void sb_workload_whole(const dt_llama_config *c, dt_llama_config *out) {
  *out = *c;
  out->no_embedding = out->no_attention = out->no_feed_forward = out->no_head = false;
  if (out->n_layers < 1) out->n_layers = 1;
}

void sb_plan_traits_get(const dt_plan *plan, const dt_llama_config *cfg, sb_plan_traits *out) {
  memset(out, 0, sizeof *out);
  const int tpi = dt_plan_dim(plan, "tp");
  out->valid = true;
  out->layers = cfg->n_layers;
  out->loss_parallel = plan->loss_parallel;
  out->zero = plan->zero;
  out->cp_rotate = plan->cp_rotate;
  out->pp_virtual = plan->pp_schedule == DT_PP_INTERLEAVED_1F1B ? 2 : 1;
  out->pp_stages = plan->pp_n_stages;
  if (plan->param_dtype < DT_DTYPE_COUNT)
    out->fsdp_param_bytes = (int)dt_dtype_size(plan->param_dtype);
  if (plan->reduce_dtype < DT_DTYPE_COUNT)
    out->fsdp_reduce_bytes = (int)dt_dtype_size(plan->reduce_dtype);
  const int dsi = dt_plan_dim(plan, "dp_shard");
  int tt_units = 0, units = 0;
  for (int e = 0; e < plan->n_entries; e++) {
    const dt_plan_entry *en = &plan->entries[e];
    if (en->dim != dsi || en->style.kind != DT_STYLE_FULLY_SHARD) continue;
    const int raf = en->style.reshard_after_forward;
    units++;
    const bool kept_ok = raf != 0 || plan->zero == 2; /* ZeRO-2 keeps every unit */
    if ((!strcmp(en->pattern, "tok_embeddings") && kept_ok) ||
        (!strcmp(en->pattern, "layers.*") && kept_ok) ||
        (!strcmp(en->pattern, "norm,output") && raf != 1) || !strcmp(en->pattern, "root"))
      tt_units++;
  }
  out->fsdp = units > 0;
  out->fsdp_torchtitan = units == 4 && tt_units == 4;
  for (int e = 0; e < plan->n_entries; e++) {
    const dt_plan_entry *en = &plan->entries[e];
    const dt_style *st = &en->style;
    if (en->dim == tpi &&
        (st->kind == DT_STYLE_SEQUENCE || seq_shard(st->input_layouts, st->n_in) ||
         seq_shard(st->desired_input_layouts, st->n_in) ||
         seq_shard(st->output_layouts, st->n_out) ||
         seq_shard(st->desired_output_layouts, st->n_out)))
      out->sequence_parallel = true;
  }
  /* a Colwise/Rowwise module's weight is split over tp; every other weight is whole
   * (every weight of the model the workload is cut from: lib/nn's tree) */
  const dt_llama_config whole = dt_llama_config_whole(cfg);
  dt_llama_module md;
  for (int i = 0; dt_llama_module_at(&whole, i, &md); i++) {
    if (!md.wndim) continue;
    const dt_style *s = style_on(plan, tpi, md.fqn);
    const double n = (double)md.wshape[0] * (md.wndim == 2 ? (double)md.wshape[1] : 1);
    if (is_style(s, DT_STYLE_COLWISE) || is_style(s, DT_STYLE_ROWWISE)) out->tp_params += n;
    else out->rep_params += n;
  }
  out->vocab_embedding = is_style(style_on(plan, tpi, "tok_embeddings"), DT_STYLE_ROWWISE);
  out->vocab_output = is_style(style_on(plan, tpi, "output"), DT_STYLE_COLWISE);
  const dt_llama_layout L = dt_llama_layout_of(&whole);
  for (int l = 0; l < cfg->n_layers; l++) {
    const dt_style *s[DT_LR_COUNT] = {NULL}; /* the block's modules' styles, by role */
    for (int k = 0; k < L.per_layer; k++)
      if (dt_llama_module_at(&whole, L.block0 + l * L.per_layer + k, &md))
        s[md.role] = style_on(plan, tpi, md.fqn);
    if (is_style(s[DT_LR_WQ], DT_STYLE_COLWISE) && is_style(s[DT_LR_WK], DT_STYLE_COLWISE) &&
        is_style(s[DT_LR_WV], DT_STYLE_COLWISE) && is_style(s[DT_LR_WO], DT_STYLE_ROWWISE))
      out->attn_tp_layers++;
    if (is_style(s[DT_LR_W1], DT_STYLE_COLWISE) && is_style(s[DT_LR_W3], DT_STYLE_COLWISE) &&
        is_style(s[DT_LR_W2], DT_STYLE_ROWWISE))
      out->mlp_tp_layers++;
    if (is_style(s[DT_LR_ATTENTION], DT_STYLE_PREPARE_INPUT) &&
        is_style(s[DT_LR_FEED_FORWARD], DT_STYLE_PREPARE_INPUT))
      out->prepared_layers++;
  }
}

void sb_plan_traits_megatron(const dt_llama_config *cfg, bool sequence_parallel,
                             sb_plan_traits *out) {
  memset(out, 0, sizeof *out);
  out->valid = true;
  out->layers = cfg->n_layers;
  out->attn_tp_layers = out->mlp_tp_layers = out->prepared_layers = cfg->n_layers;
  out->vocab_embedding = out->vocab_output = true;
  out->sequence_parallel = sequence_parallel;
  out->loss_parallel = true; /* [MLM] sec. 3: the output GEMM is fused with the cross-entropy */
  /* [MLM] sec. 3: the layer-norm parameters are duplicated on every rank; every
   * matrix (embedding, projections, output) is split */
  const dt_llama_config whole = dt_llama_config_whole(cfg);
  dt_llama_module md;
  for (int i = 0; dt_llama_module_at(&whole, i, &md); i++) {
    if (md.wndim == 1) out->rep_params += (double)md.wshape[0];
    else if (md.wndim == 2) out->tp_params += (double)md.wshape[0] * (double)md.wshape[1];
  }
}

double sb_params_per_rank(const sb_baseline_in *in, const sb_plan_traits *tr) {
  return (tr->tp_params / in->tp + tr->rep_params) / in->pp;
}

/* ---- framework baselines ---- */

/* FSDP's flat segment per rank of TorchTitan's units (tok_embeddings, each block,
 * [norm, output]): sum over a unit's weights of ceil(rows / F) x elements per row
 * of the tensor FSDP splits (TP's local block at tp coordinate 0 when split). */
static void fsdp_units(const sb_baseline_in *in, bool split, double *emb, double *block,
                       double *last) {
  const int64_t t = split ? in->tp : 1, F = in->dp_shard;
#define CEIL(a, b) (((a) + (b) - 1) / (b))
  *emb = *block = *last = 0;
  dt_llama_module md; /* lib/nn's tree: tok_embeddings, layer 0's modules, norm and output */
  for (int i = 0; dt_llama_module_at(&in->model, i, &md); i++) {
    if (!md.wndim || md.layer > 0) continue;
    const int64_t rows = md.wshape[0], cols = md.wshape[1];
    double seg;
    if (md.wndim == 1) seg = (double)CEIL(rows, F);                      /* whole */
    else if (md.role == DT_LR_WO || md.role == DT_LR_W2)
      seg = (double)(CEIL(rows, F) * CEIL(cols, t));                     /* columns split by TP */
    else seg = (double)(CEIL(CEIL(rows, t), F) * cols);                  /* rows split by TP */
    *(md.layer == 0 ? block : md.role == DT_LR_TOK_EMBEDDINGS ? emb : last) += seg;
  }
#undef CEIL
}

/* FSDP2's dp bytes per rank per step on TorchTitan's units (apply_fsdp at v0.2.0:
 * tok_embeddings, each block, [norm, output] not resharded after forward; the root
 * holds nothing): per unit one all_gather forward and one again backward when
 * resharded (not under ZeRO-2), one reduce_scatter, HSDP's all_reduce of the shard
 * over R, in the plan's MixedPrecisionPolicy dtypes; ZeRO-1: every unit's whole
 * gradients all-reduced over F and R (reduce dtype), then its updated row shards
 * all-gathered over F (the model's dtype). Ring wire bytes. */
static double fsdp2_dp_bytes(const sb_baseline_in *in, const sb_plan_traits *tr, bool split) {
  double emb, block, last, emb1, block1, last1;
  sb_baseline_in one = *in;
  one.dp_shard = 1; /* the unpadded TP-local sizes */
  fsdp_units(in, split, &emb, &block, &last);
  fsdp_units(&one, split, &emb1, &block1, &last1);
  const int L = tr->layers, F = in->dp_shard, R = in->dp_replicate;
  const double e = in->elem_bytes;
  const double all = emb + L * block + last, whole = emb1 + L * block1 + last1;
  const double ep = tr->fsdp_param_bytes ? tr->fsdp_param_bytes : e;
  const double er = tr->fsdp_reduce_bytes ? tr->fsdp_reduce_bytes : e;
  if (tr->zero == 1) return ring_ar(whole * er, F) + ring_ar(whole * er, R) + (F - 1) * all * e;
  const double raf = tr->zero == 2 ? 0 : emb + L * block;
  return (F - 1) * ((all + raf) * ep + all * er) + ring_ar(all * er, R);
}

/* Context parallel's K/V bytes per rank per step over cp: the framework's (PyTorch's
 * torch/distributed/tensor/experimental/_attention.py, ring attention arXiv:2310.01889
 * sec. 3) when framework, else this runtime's (lib/ops/attention_cp.c). X = one
 * rank's K (or V) of each layer: b (S/c) h_kv/t hd elements (kv heads split by TP;
 * no repeat to the query heads). Per layer:
 *   ring (pass-KV): forward c-1 sends of [K | V] (2X), backward c-1 again plus c
 *     sends of the travelling [dK | dV]: 2X (3c - 2) elements, in both; the
 *     travelling accumulator is f32 for bf16 (PyTorch's accum_dtype under
 *     _cp_options.convert_to_f32, the default; this runtime likewise), so its 2Xc
 *     elements take 4 bytes where the data take 2;
 *   allgather: PyTorch all-gathers [K | V] forward and again backward (each 2X(c-1)
 *     wire) and rotates [dK | dV] c times (2Xc, f32 for bf16); this runtime
 *     all-gathers K and V in forward and backward and reduce-scatters dK, dV in
 *     the data's dtype: 6X(c-1). */
static double cp_bytes(const sb_baseline_in *in, const sb_plan_traits *tr, bool framework,
                       int *sends, int *ags, int *rss) {
  const int c = in->cp, t = in->tp, L = tr->layers;
  const dt_llama_config *m = &in->model;
  const double b = (double)(in->batch / ((int64_t)in->dp_replicate * in->dp_shard));
  const double X = b * (double)(in->seq / c) * (double)(m->n_kv_heads / t) *
                   (double)(m->dim / m->n_heads) * in->elem_bytes;
  /* the [dK | dV] accumulator's element over the data's: f32 for a narrower dtype */
  const double acc = in->elem_bytes < 4 ? 4.0 / in->elem_bytes : 1.0;
  if (sends) *sends = *ags = *rss = 0;
  if (c <= 1) return 0;
  if (tr->cp_rotate == DT_CP_RING) {
    if (sends) *sends = L * (3 * c - 2);
    return L * 2 * X * (2 * (c - 1) + acc * c);
  }
  if (framework) return L * (2 * ring_ag(2 * X * c, c) + acc * 2 * X * c);
  if (sends) {
    *ags = L * 4;
    *rss = L * 2;
  }
  return L * 6 * ring_ag(X * c, c);
}

/* Under cp the data dims gain cp (TorchTitan's dp_cp for DDP, dp_shard_cp for FSDP):
 * the same per-rank token count (b s is what the TP terms use) over one more dim. */
static sb_baseline_in fold_cp(const sb_baseline_in *in, const sb_plan_traits *tr) {
  sb_baseline_in f = *in;
  if (in->cp > 1) {
    if (tr->fsdp) f.dp_shard *= in->cp;
    else f.dp_replicate *= in->cp;
    f.batch *= in->cp;
    f.seq /= in->cp;
    f.cp = 1;
  }
  return f;
}

int sb_framework_comm_compute(const sb_baseline_in *in0, const sb_plan_traits *tr,
                              sb_framework_comm *out) {
  char err[128];
  memset(out, 0, sizeof *out);
  if (!tr->valid || tr->layers < 1 || sb_baseline_check(in0, err, sizeof err)) return -1;
  if (in0->cp > 1) {
    out->cp = cp_bytes(in0, tr, true, NULL, NULL, NULL);
    snprintf(out->cp_framework, sizeof out->cp_framework, "%s",
             tr->cp_rotate == DT_CP_RING ? "ring-cp" : "allgather-cp");
    snprintf(out->cp_formula, sizeof out->cp_formula, "%s",
             tr->cp_rotate == DT_CP_RING
                 ? "PyTorch ring attention (arXiv:2310.01889): per layer [K|V] c-1 sends fwd, c-1 "
                   "+ c [dK|dV] bwd, 2X(3c-2)"
                 : "PyTorch _AllGatherRotater: per layer AG of [K|V] fwd and bwd + c [dK|dV] "
                   "sends, 4X(c-1) + 2Xc");
  }
  const sb_baseline_in folded = fold_cp(in0, tr), *in = &folded;
  const int t = in->tp, R = in->dp_replicate, F = in->dp_shard;
  const double e = in->elem_bytes;
  const double b = (double)(in->batch / ((int64_t)R * F));
  const double s = (double)(in->seq / in->cp);
  const double h = in->model.dim, V = in->model.vocab;
  const double act = b * s * h * e; /* one b*s*h activation, bytes */
  /* the busiest pp stage holds ceil(L/p) of the layers; the split blocks are
   * counted in that share (exact for a plan that splits every layer alike) */
  const double stage = (double)((tr->layers + in->pp - 1) / in->pp) / tr->layers;
  const double blocks = (tr->attn_tp_layers + tr->mlp_tp_layers) * stage;
  if (t > 1 && (blocks > 0 || tr->vocab_embedding || tr->vocab_output)) {
    if (tr->sequence_parallel) {
      /* [SP] sec. 4.2.2, Fig. 5: per split block g (AG fwd, RS bwd) and g-bar
       * (RS fwd, AG bwd) of b*s*h, "the same bandwidth" as [MLM]'s two ARs; and
       * since only the sequence shard Y_i^s of the block input is stored, "an
       * extra all-gather in the backward pass": 3 AG + 2 RS per block,
       * 10bsh(t-1)/t per layer. */
      snprintf(out->tp_framework, sizeof out->tp_framework, "megatron-tp-sp");
      out->tp_blocks = blocks * 5 * ring_ag(act, t);
      snprintf(out->tp_formula, sizeof out->tp_formula,
               "arXiv:2205.05198 sec. 4.2.2: per split block AG+RS (g) and RS+AG (g-bar) of bsh "
               "+ AG of the stored shard in bwd; embedding per 1909.08053 sec. 3");
    } else {
      /* [MLM] sec. 3, Fig. 3-4: per split block one AR of b*s*h forward (g) and
       * one backward (f): 4 per layer, 8bsh(t-1)/t. */
      snprintf(out->tp_framework, sizeof out->tp_framework, "megatron-tp");
      out->tp_blocks = blocks * 2 * ring_ar(act, t);
      snprintf(out->tp_formula, sizeof out->tp_formula,
               "arXiv:1909.08053 sec. 3: per split block AR fwd (g) + AR bwd (f) of bsh; embedding "
               "AR; unfused output: AG of bsV logits");
    }
    /* [MLM] sec. 3: "an all-reduce (g operator) is required after the input
     * embedding" (forward only). Under sequence parallel the same bytes move as
     * RS forward + AG backward ([SP] sec. 4.2.2: a ring AR is an RS plus an AG). */
    if (tr->vocab_embedding) out->tp_embedding = ring_ar(act, t);
    /* [MLM] sec. 3: without the fusion, the output all-gathers the b*s*V logits;
     * fused with the cross-entropy it moves b*s scalars, which the paper does not
     * count (and neither do we). */
    if (tr->vocab_output && !tr->loss_parallel) out->tp_logits = ring_ag(b * s * V * e, t);
    out->tp = out->tp_blocks + out->tp_embedding + out->tp_logits;
  }
  const double psi = sb_params_per_rank(in, tr) * e; /* bytes of one rank's parameters */
  if (R > 1 && F == 1) {
    /* [DDP] sec. 3: an all-reduce of every gradient (bucketed); [ZeRO] sec. 7.1: 2 Psi */
    snprintf(out->dp_framework, sizeof out->dp_framework, "ddp");
    out->dp = ring_ar(psi, R);
    snprintf(out->dp_formula, sizeof out->dp_formula,
             "arXiv:2006.15704 sec. 3, arXiv:1910.02054 sec. 7.1: AR of the rank's gradients, "
             "2 Psi (d-1)/d");
  } else if (F > 1 && tr->fsdp_torchtitan) {
    /* TorchTitan v0.2.0 apply_fsdp's units (tok_embeddings, each block, [norm, output]
     * not resharded after forward; the root holds nothing) with FSDP2's collectives
     * (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py foreach_all_gather /
     * foreach_reduce: one per unit, every weight padded to ceil(rows / F) rows), in the
     * plan's MixedPrecisionPolicy dtypes; ZeRO-1 (DeepSpeed stage 1, arXiv:1910.02054
     * sec. 5.1): the gradients all-reduced, the updated shards all-gathered */
    const bool split = t > 1 && (blocks > 0 || tr->vocab_embedding || tr->vocab_output);
    out->dp = fsdp2_dp_bytes(in, tr, split);
    if (tr->zero == 1) {
      snprintf(out->dp_framework, sizeof out->dp_framework, "zero1");
      snprintf(out->dp_formula, sizeof out->dp_formula,
               "arXiv:1910.02054 sec. 5.1 on TorchTitan's FSDP units: AR of the gradients over "
               "F (and R) + AG of the updated shards, per unit");
    } else {
      snprintf(out->dp_framework, sizeof out->dp_framework, "%s",
               tr->zero == 2 ? "zero2" : R > 1 ? "hsdp" : "fsdp");
      snprintf(out->dp_formula, sizeof out->dp_formula,
               "TorchTitan v0.2.0 apply_fsdp units, FSDP2 foreach_all_gather / foreach_reduce: "
               "per unit AG fwd, AG bwd if resharded, RS (padded rows)%s",
               R > 1 ? ", AR of the shard over R" : "");
    }
  } else if (F > 1 && R == 1) {
    /* [FSDP] sec. 3.2 full sharding = [ZeRO] sec. 7.2.2 (P_os+g+p): parameters
     * all-gathered forward and again backward, gradients reduce-scattered: 3 Psi */
    snprintf(out->dp_framework, sizeof out->dp_framework, "fsdp");
    out->dp = 3 * ring_ag(psi, F);
    snprintf(out->dp_formula, sizeof out->dp_formula,
             "arXiv:2304.11277 sec. 3.2 full sharding = arXiv:1910.02054 sec. 7.2.2: AG fwd + AG "
             "bwd + RS, 3 Psi (F-1)/F");
  } else if (F > 1 && R > 1) {
    /* [FSDP] sec. 3.2 hybrid sharding: full sharding within F ranks, then an
     * all-reduce of the gradient shards across the R replicas */
    snprintf(out->dp_framework, sizeof out->dp_framework, "hsdp");
    out->dp = 3 * ring_ag(psi, F) + ring_ar(psi / F, R);
    snprintf(out->dp_formula, sizeof out->dp_formula,
             "arXiv:2304.11277 sec. 3.2 hybrid sharding: 3 Psi (F-1)/F within F + AR 2 (Psi/F) "
             "(R-1)/R across R");
  }
  if (in->pp > 1) {
    /* PyTorch's pipelining (torch/distributed/pipelining/schedules.py, _add_send_recv):
     * the first rank's stages send each microbatch's activation forward (the last stage
     * overall excepted) and its gradient back (stage 0 excepted): with v stages per rank
     * (loop placement) rank 0 sends (2v - 1) activations of b/m x s x h per microbatch,
     * (2v - 1) b s h e per step; under sequence parallel the activation is split over tp */
    const int v = tr->pp_stages > 0 && tr->pp_stages % in->pp == 0 ? tr->pp_stages / in->pp
                  : tr->pp_virtual > 0                                ? tr->pp_virtual
                                                                      : 1;
    snprintf(out->pp_framework, sizeof out->pp_framework, "pp-p2p");
    out->pp = (2 * v - 1) * act / (tr->sequence_parallel ? t : 1);
    snprintf(out->pp_formula, sizeof out->pp_formula,
             "PyTorch pipelining _add_send_recv: rank 0's (2v-1) activation sends of b s h e "
             "per step (/tp under SP), v stages per rank");
  }
  snprintf(out->name, sizeof out->name, "%s%s%s%s%s%s%s", out->tp_framework,
           out->tp_framework[0] && out->dp_framework[0] ? "+" : "", out->dp_framework,
           out->cp_framework[0] && (out->tp_framework[0] || out->dp_framework[0]) ? "+" : "",
           out->cp_framework,
           out->pp_framework[0] && (out->tp_framework[0] || out->dp_framework[0] ||
                                    out->cp_framework[0]) ? "+" : "",
           out->pp_framework);
  out->total = out->tp + out->dp + out->cp + out->pp;
  return 0;
}

static int add(sb_baseline_row *rows, int *n, int max, const char *fw, const char *q, double v,
               const char *unit, const char *formula) {
  if (*n >= max) return -1;
  sb_baseline_row *r = &rows[(*n)++];
  memset(r, 0, sizeof *r);
  snprintf(r->framework, sizeof r->framework, "%s", fw);
  snprintf(r->quantity, sizeof r->quantity, "%s", q);
  r->value = v;
  snprintf(r->unit, sizeof r->unit, "%s", unit);
  snprintf(r->formula, sizeof r->formula, "%s", formula);
  return 0;
}

int sb_runtime_comm_row(const sb_baseline_in *in, const sb_plan_traits *tr,
                        sb_baseline_row *row) {
  sb_runtime_comm rt;
  if (sb_runtime_comm_compute(in, tr, &rt)) return -1;
  int n = 0;
  return add(row, &n, 1, "runtime-model", "comm_bytes_per_step_runtime_model", rt.total, "bytes",
             "this runtime's own closed form (bench/harness/baselines_model.c sb_runtime_comm): "
             "a regression model, not a framework baseline");
}

int sb_baseline_plan_rows(const sb_baseline_in *in, const sb_plan_traits *tr,
                          sb_baseline_row *rows, int max) {
  sb_framework_comm fw;
  if (sb_framework_comm_compute(in, tr, &fw)) return -1;
  int n = 0;
  if (!fw.name[0]) return 0;
  if (fw.tp_framework[0] &&
      add(rows, &n, max, fw.tp_framework, "comm_bytes_per_step", fw.tp, "bytes", fw.tp_formula))
    return n;
  if (fw.dp_framework[0] &&
      add(rows, &n, max, fw.dp_framework, "comm_bytes_per_step", fw.dp, "bytes", fw.dp_formula))
    return n;
  if (fw.cp_framework[0] &&
      add(rows, &n, max, fw.cp_framework, "comm_bytes_per_step", fw.cp, "bytes", fw.cp_formula))
    return n;
  if (fw.pp_framework[0] &&
      add(rows, &n, max, fw.pp_framework, "comm_bytes_per_step", fw.pp, "bytes", fw.pp_formula))
    return n;
  char f[192];
  snprintf(f, sizeof f,
           "the framework parts this plan's settings select, summed: %s %.0f + %s %.0f + %s %.0f",
           fw.tp_framework[0] ? fw.tp_framework : "(no tp)", fw.tp,
           fw.dp_framework[0] ? fw.dp_framework : "(no dp)", fw.dp,
           fw.cp_framework[0] ? fw.cp_framework : "(no cp)", fw.cp);
  add(rows, &n, max, fw.name, "comm_bytes_per_step_combined", fw.total, "bytes", f);
  return n;
}

int sb_baseline_compute(const sb_baseline_in *in, sb_baseline_row *rows, int max) {
  char err[128];
  if (sb_baseline_check(in, err, sizeof err)) return -1;
  const dt_llama_config *mc = &in->model;
  const int t = in->tp, p = in->pp, c = in->cp, m = in->microbatches, v = in->virtual_stages;
  const int F = in->dp_shard, R = in->dp_replicate, d = F * R;
  const double e = in->elem_bytes;
  const double b = (double)(in->batch / d);  /* sequences per DP rank per step */
  const double mb = b / m;                   /* micro-batch size */
  const double s = (double)(in->seq / c);    /* tokens per CP rank */
  const double h = mc->dim, a = mc->n_heads, V = mc->vocab;
  const double hkv = (double)mc->n_kv_heads * (mc->dim / mc->n_heads);
  const double Lr = (double)((mc->n_layers + p - 1) / p); /* layers on the busiest stage */
  sb_plan_traits tm, ts;
  sb_plan_traits_megatron(mc, false, &tm);
  sb_plan_traits_megatron(mc, true, &ts);
  const double psi = sb_params_per_rank(in, &tm); /* what DP, ZeRO and FSDP replicate or shard */
  sb_framework_comm fm, fs; /* their .tp parts are the TP rows */
  if (sb_framework_comm_compute(in, &tm, &fm) || sb_framework_comm_compute(in, &ts, &fs)) return -1;
  int n = 0;
#define ADD(fw, q, val, unit, f)                                  \
  do {                                                            \
    if (add(rows, &n, max, fw, q, val, unit, f)) return n;        \
  } while (0)

  /* ---- Megatron-LM TP and TP + SP, its own layout (every block split, vocabulary-
   * parallel embedding and output, output fused with the cross-entropy) ---- */
  const double act = b * s * h * e;
  ADD("megatron-tp", "comm_bytes_per_layer", 4 * ring_ar(act, t), "bytes",
      "arXiv:1909.08053 sec. 3, Fig. 4: 2 AR fwd + 2 AR bwd of b*s*h per layer: 8bsh(t-1)/t * e");
  ADD("megatron-tp", "comm_bytes_embedding", ring_ar(act, t), "bytes",
      "arXiv:1909.08053 sec. 3: AR (g) of b*s*h after the vocabulary-parallel input embedding");
  ADD("megatron-tp", "comm_bytes_logits_unfused", ring_ag(b * s * V * e, t), "bytes",
      "arXiv:1909.08053 sec. 3: the AG of b*s*V logits that fusing the output with the "
      "cross-entropy avoids");
  ADD("megatron-tp", "comm_bytes_per_step", fm.tp, "bytes",
      "arXiv:1909.08053 sec. 3: L/p x 8bsh(t-1)/t + embedding AR, output fused with the CE (its "
      "b*s scalars are not counted by the paper)");
  ADD("megatron-tp", "activation_bytes_per_layer",
      s * mb * h * (10 + 24.0 / t + 5 * a * s / (h * t)), "bytes",
      "arXiv:2205.05198 eq. 2: sbh(10 + 24/t + 5as/(ht)), 16-bit activations, b = micro-batch");
  ADD("megatron-tp-sp", "comm_bytes_per_layer", 8 * ring_ag(act, t), "bytes",
      "arXiv:2205.05198 sec. 4.2.2: 4 AG + 4 RS of b*s*h per layer, the bandwidth of TP's 4 AR");
  ADD("megatron-tp-sp", "comm_bytes_per_layer_stored_shard", 10 * ring_ag(act, t), "bytes",
      "arXiv:2205.05198 sec. 4.2.2: + the AG of the stored sequence shard in bwd per block: "
      "6 AG + 4 RS, 10bsh(t-1)/t * e");
  ADD("megatron-tp-sp", "comm_bytes_per_step", fs.tp, "bytes",
      "arXiv:2205.05198 sec. 4.2.2: L/p x 10bsh(t-1)/t + embedding (1909.08053 sec. 3, as RS "
      "fwd + AG bwd); output fused with the CE");
  ADD("megatron-tp-sp", "activation_bytes_per_layer", s * mb * h / t * (34 + 5 * a * s / h),
      "bytes", "arXiv:2205.05198 eq. 4: sbh/t (34 + 5as/h), 16-bit activations");
  ADD("megatron-tp-sp", "activation_bytes_per_layer_selective", 34 * s * mb * h / t, "bytes",
      "arXiv:2205.05198 Table 2: 34sbh/t (TP + SP + selective recompute)");
  ADD("megatron-tp-sp", "activation_bytes_per_rank", Lr * 34 * s * mb * h / t * p, "bytes",
      "arXiv:2205.05198 sec. 4.2.3: 1F1B stage 0 holds p micro-batches x L/p layers x 34sbh/t");

  /* ---- DDP, ZeRO, FSDP, HSDP ---- */
  ADD("ddp", "comm_bytes_per_step", ring_ar(psi * e, d), "bytes",
      "arXiv:2006.15704 sec. 3, arXiv:1910.02054 sec. 7.1: AR of the gradients, 2Psi(d-1)/d * e");
  ADD("ddp", "memory_bytes_per_rank", (ZERO_PARAM_B + ZERO_GRAD_B + ZERO_K) * psi, "bytes",
      "arXiv:1910.02054 sec. 3.1, Fig. 1: baseline DP (2 + 2 + K)Psi, K = 12");
  ADD("zero1", "memory_bytes_per_rank", (ZERO_PARAM_B + ZERO_GRAD_B) * psi + ZERO_K * psi / d,
      "bytes", "arXiv:1910.02054 Fig. 1 (P_os): 2Psi + 2Psi + K Psi/N_d");
  ADD("zero1", "comm_bytes_per_step", 2 * ring_ag(psi * e, d), "bytes",
      "arXiv:1910.02054 sec. 7.2.1: RS grads + AG params = 2Psi(N_d-1)/N_d * e");
  ADD("zero2", "memory_bytes_per_rank", ZERO_PARAM_B * psi + (ZERO_GRAD_B + ZERO_K) * psi / d,
      "bytes", "arXiv:1910.02054 Fig. 1 (P_os+g): 2Psi + (2 + K)Psi/N_d");
  ADD("zero2", "comm_bytes_per_step", 2 * ring_ag(psi * e, d), "bytes",
      "arXiv:1910.02054 sec. 7.2.1: RS grads + AG params = 2Psi(N_d-1)/N_d * e");
  ADD("zero3", "memory_bytes_per_rank", (ZERO_PARAM_B + ZERO_GRAD_B + ZERO_K) * psi / d, "bytes",
      "arXiv:1910.02054 Fig. 1 (P_os+g+p): (2 + 2 + K)Psi/N_d");
  ADD("zero3", "comm_bytes_per_step", 3 * ring_ag(psi * e, d), "bytes",
      "arXiv:1910.02054 sec. 7.2.2: AG fwd + AG bwd + RS grads = 3Psi(N_d-1)/N_d * e");
  ADD("fsdp", "comm_bytes_per_step", 3 * ring_ag(psi * e, d), "bytes",
      "arXiv:2304.11277 sec. 3.2 full sharding (F = d): AG fwd + AG bwd + RS, 3Psi(d-1)/d * e");
  ADD("fsdp", "comm_bytes_per_step_bf16ag_fp32rs", ring_ag(FSDP_MP_BYTES * psi, d), "bytes",
      "torchtitan FSDP2 mixed precision (bf16 AG twice, fp32 RS): (2 + 2 + 4)Psi(d-1)/d");
  ADD("fsdp", "memory_bytes_per_rank", FSDP_BYTES_PER_PARAM * psi / d, "bytes",
      "fp32 param 4 + grad 4 + Adam 8 bytes per parameter, sharded d ways: 16Psi/d, "
      "no activations");
  ADD("hsdp", "comm_bytes_per_step", 3 * ring_ag(psi * e, F) + ring_ar(psi / F * e, R), "bytes",
      "arXiv:2304.11277 sec. 3.2 hybrid: 3Psi(F-1)/F + 2(Psi/F)(R-1)/R, F = dp_shard, "
      "R = dp_replicate, * e");
  ADD("hsdp", "comm_bytes_per_step_inter_group", ring_ar(psi / F * e, R), "bytes",
      "arXiv:2304.11277 sec. 3.2 hybrid: the AR across replicas 2(Psi/F)(R-1)/R * e");
  ADD("hsdp", "memory_bytes_per_rank", FSDP_BYTES_PER_PARAM * psi / F, "bytes",
      "16Psi/F: as fsdp, sharded over dp_shard only");

  /* ---- pipeline ---- */
  const double act_mb = Lr * 34 * s * mb * h / t; /* one micro-batch on a stage: [SP] Table 2 */
  const double p2p = 2 * b * s * h * e;           /* per boundary per step, fwd + bwd */
  ADD("gpipe", "bubble_fraction", (double)(p - 1) / (m + p - 1), "fraction",
      "arXiv:1811.06965: bubble (p-1)/(m+p-1) of the step");
  ADD("gpipe", "activation_bytes_per_rank", m * act_mb, "bytes",
      "arXiv:1811.06965: all m micro-batches stashed x L/p layers x 34sbh/t (2205.05198 Table 2)");
  ADD("gpipe", "p2p_bytes_per_step", p > 1 ? p2p : 0, "bytes",
      "the b*s*h activation fwd and its gradient bwd per micro-batch per stage boundary: 2bsh * e");
  ADD("1f1b", "bubble_fraction", (double)(p - 1) / (m + p - 1), "fraction",
      "arXiv:2104.04473 sec. 2.2.1: bubble/ideal (p-1)/m, i.e. (p-1)/(m+p-1) of the step");
  ADD("1f1b", "bubble_over_ideal", (double)(p - 1) / m, "fraction",
      "arXiv:2104.04473 sec. 2.2.1: (p-1)/m");
  ADD("1f1b", "activation_bytes_per_rank", (m < p ? m : p) * act_mb, "bytes",
      "arXiv:2205.05198 sec. 4.2.3: stage 0 holds min(m, p) micro-batches x L/p layers x 34sbh/t");
  ADD("1f1b", "p2p_bytes_per_step", p > 1 ? p2p : 0, "bytes",
      "the b*s*h activation fwd and its gradient bwd per micro-batch per stage boundary: 2bsh * e");
  ADD("interleaved", "bubble_fraction", (double)(p - 1) / ((double)v * m + p - 1), "fraction",
      "arXiv:2104.04473 sec. 2.2.2: bubble/ideal (1/v)(p-1)/m, of the step (p-1)/(vm+p-1)");
  ADD("interleaved", "bubble_over_ideal", (double)(p - 1) / ((double)v * m), "fraction",
      "arXiv:2104.04473 sec. 2.2.2: (1/v)(p-1)/m");
  ADD("interleaved", "activation_bytes_per_rank",
      (m < p ? m : p) * act_mb * (1 + (double)(p - 1) / ((double)p * v)), "bytes",
      "arXiv:2205.05198 sec. 4.2.3: 1F1B x (1 + (p-1)/(p v)) for the interleaved schedule");
  ADD("interleaved", "p2p_bytes_per_step", p > 1 ? v * p2p : 0, "bytes",
      "arXiv:2104.04473 sec. 2.2.2: v times the p2p of 1F1B");

  /* ---- context parallel: KV = 2 b s h_kv for the full sequence; a TP rank holds
   * h_kv/t of it (kv heads are column-split) ---- */
  const double kv = 2 * b * (s * c) * hkv / t * e;
  const double cp_layer = c > 1 ? 3 * kv * (c - 1) / c : 0;
  ADD("ring-cp", "comm_bytes_per_layer", cp_layer, "bytes",
      "from arXiv:2310.01889: KV over c-1 ring steps fwd, KV + dKV bwd: 3 KV(c-1)/c, "
      "KV = 2bsh_kv/t * e");
  ADD("ring-cp", "comm_bytes_per_step", Lr * cp_layer, "bytes", "L/p x per layer");

  /* ---- FLOPs ---- */
  const double fpt = dt_llama_flops_per_token(mc, in->seq);
  ADD("torchtitan", "flops_per_token", fpt, "flop",
      "torchtitan get_dense_model_nparams_and_flops: 6 N_matmul + 12 L h s (N_matmul = N - Vh; "
      "no causal discount)");
  ADD("torchtitan", "flops_per_step", fpt * (double)in->batch * (double)in->seq, "flop",
      "flops_per_token x global batch x seq");
#undef ADD
  return n;
}

/* ---- the runtime's own closed form (regression model, not a baseline) ----
 *
 * What this runtime's ledger records per step on rank 0 (wire bytes, ring
 * model), derived from its choices for the shipped plan shapes; the collective
 * counts are those verify/test_parallel.c's `expected` derives per plan.
 *
 * Replicated activations (plans/megatron-tp.plan):
 *   forward  AR 2L+1 of b*s*h: 2 per layer (wo, w2 output P -> R) + the
 *            vocabulary-split embedding's P -> R; no loss parallel: AG of the
 *            b*s*V logits; loss parallel: CE_FWD_AR ARs of b*s f64 scalars.
 *   backward AR 2L+1 of b*s*h: 2 per layer (each norm's backward reduces the
 *            summed Partial input gradient of the block it feeds) + 1 for the
 *            final norm / output input; loss parallel: CE_BWD_AR.
 * Sequence parallel (plans/torchtitan-tp-sp.plan, tp-no-loss-parallel.plan):
 *   forward  per layer 2 AG + 2 RS of b*s*h; embedding RS + output-input AG;
 *            loss parallel: CE_FWD_AR ARs, else the logits AG.
 *   backward mirrored: per layer 2 AG + 2 RS (the gathered block input is kept,
 *            not gathered again); embedding AG + output RS; CE_BWD_AR.
 *   optimizer AR of the 2L+1 norm weights' gradients (h elements each; Partial
 *            over tp under sequence parallel).
 * Data parallel over dp_replicate: DDP's gradient buckets (lib/parallel
 *   dt_data_parallel_reduce_grads), one AR per bucket of the local shards: in all
 *   the rank's parameters, tp_params/t + rep_params (even splits); the ring
 *   model's bytes do not depend on how they are bucketed. */

/* Loss-parallel cross-entropy reduces f64 scalars whatever the model dtype
 * (lib/ops/embedding.c: dt_comm_all_reduce(..., DT_F64, ...)). */
enum { CE_SCALAR_BYTES = 8 };
/* Loss-parallel CE collectives per step: forward max, sum-exp and the target
 * logit; backward none (it reads the forward's saved log-sum-exp). */
enum { CE_FWD_AR = 3, CE_BWD_AR = 0 };

int sb_runtime_comm_compute(const sb_baseline_in *in0, const sb_plan_traits *tr,
                            sb_runtime_comm *out) {
  char err[128];
  memset(out, 0, sizeof *out);
  if (!tr->valid || sb_baseline_check(in0, err, sizeof err)) return -1;
  if (in0->pp != 1) return -1; /* no pipeline in the runtime */
  out->cp = cp_bytes(in0, tr, false, &out->n_cp_send, &out->n_cp_ag, &out->n_cp_rs);
  const sb_baseline_in folded = fold_cp(in0, tr), *in = &folded;
  if (in->dp_shard > 1 && !tr->fsdp_torchtitan) return -1; /* units the closed form lacks */
  const int t = in->tp, L = tr->layers;
  const bool split = tr->attn_tp_layers || tr->mlp_tp_layers || tr->vocab_embedding ||
                     tr->vocab_output;
  const bool whole = tr->attn_tp_layers == L && tr->mlp_tp_layers == L &&
                     tr->prepared_layers == L && tr->vocab_embedding && tr->vocab_output;
  if (t > 1 && split && !whole) return -1; /* a layout the closed form does not cover */
  const double e = in->elem_bytes;
  const double b = (double)(in->batch / (in->dp_replicate * in->dp_shard));
  const double s = (double)in->seq;
  const double h = in->model.dim, V = in->model.vocab;
  const double act = b * s * h * e;
  out->layers = L;
  if (t > 1 && split) {
    if (!tr->sequence_parallel) {
      out->block_per_layer = 4 * ring_ar(act, t);
      out->boundary = 2 * ring_ar(act, t);
      out->n_ar = 2 * (2 * L + 1);
    } else {
      out->block_per_layer = 8 * ring_ag(act, t);
      out->boundary = 4 * ring_ag(act, t);
      /* the norms' gradients, each rank's FSDP chunk of them under dp_shard */
      const double hn = (double)((in->model.dim + in->dp_shard - 1) / in->dp_shard);
      out->optimizer = (2 * L + 1) * ring_ar(hn * e, t);
      out->n_ag = 2 * L + 1 + 2 * L + 1;
      out->n_rs = out->n_ag;
      out->n_ar = 2 * L + 1;
    }
    if (tr->loss_parallel) {
      out->loss = (CE_FWD_AR + CE_BWD_AR) * ring_ar(b * s * CE_SCALAR_BYTES, t);
      out->n_ar += CE_FWD_AR + CE_BWD_AR;
    } else {
      out->logits = ring_ag(b * s * V * e, t);
      out->n_ag += 1;
    }
    out->blocks = L * out->block_per_layer;
  }
  out->tp = out->blocks + out->boundary + out->logits + out->loss + out->optimizer;
  if (in->dp_shard > 1) {
    /* lib/parallel/fsdp.c implements FSDP2's collectives on these units: the
     * framework's count is the runtime's */
    out->dp = fsdp2_dp_bytes(in, tr, t > 1 && split);
  } else {
    out->dp = ring_ar(sb_params_per_rank(in, tr) * e, in->dp_replicate);
  }
  out->total = out->tp + out->dp + out->cp;
  return 0;
}
