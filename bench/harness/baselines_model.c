/* bench/harness/baselines_model.c: the analytic framework baselines (bench/harness/baselines.h),
 * no I/O, so the tests link it alone. Every formula names its section of
 * /work/shared/reference/baselines.md ("bl" below); [runtime] marks terms derived
 * from what our runtime does for the shipped plans (verify/test_parallel.c,
 * `expected`), which the TP totals must match byte for byte.
 *
 * Symbols (bl 0): b = sequences per DP rank per step (all micro-batches),
 * s = tokens per CP rank, h = dim, a = heads, h_kv = kv_heads * head_dim,
 * V = vocab, L = layers, t/p/c = tp/pp/cp, d = dp_replicate * dp_shard,
 * e = bytes per element, Psi = parameters per model-parallel rank.
 * Ring model (bl 0, 5.1): AR 2(n-1)/n * S, AG and RS (n-1)/n * S, S = full bytes.
 */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "baselines.h"

/* Loss-parallel cross-entropy reduces f64 scalars whatever the model dtype
 * (lib/ops/embedding.c: dt_comm_all_reduce(..., DT_F64, ...)). */
enum { CE_SCALAR_BYTES = 8 };
/* Loss-parallel CE collectives per step [runtime]: forward max, sum-exp and the
 * target logit; backward none (it reads the forward's saved log-sum-exp, as
 * PyTorch does). */
enum { CE_FWD_AR = 3, CE_BWD_AR = 0 };
/* Mixed-precision Adam optimizer state bytes per parameter: fp32 master params,
 * momentum, variance (bl 2.1, K = 12). */
static const double ZERO_K = 12.0;
/* 16-bit params and 16-bit grads (bl 2.1: 2Psi + 2Psi). */
static const double ZERO_PARAM_B = 2.0, ZERO_GRAD_B = 2.0;
/* FSDP2 per-rank bytes per parameter: 4 param + 4 grad + 8 Adam (bl 2.3). */
static const double FSDP_BYTES_PER_PARAM = 16.0;
/* torchtitan FSDP2 mixed precision: AG bf16 (2 B) twice + RS fp32 (4 B) (bl 2.2). */
static const double FSDP_MP_BYTES = 2.0 + 2.0 + 4.0;

static double ring_ar(double bytes, int n) { return n > 1 ? 2.0 * (n - 1) / n * bytes : 0.0; }
static double ring_ag(double bytes, int n) { return n > 1 ? (double)(n - 1) / n * bytes : 0.0; }

int sb_baseline_check(const sb_baseline_in *in, char *err, size_t errn) {
  const dt_llama_config *m = &in->model;
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
  if (in->pp > m->n_layers) {
    snprintf(err, errn, "pp %d is more than the model's %d layers", in->pp, m->n_layers);
    return -1;
  }
  return 0;
}

/* Whole-model TP comm of one rank per step. With pp > 1 the rank holds
 * ceil(L/p) layers (the busiest stage); the embedding, output and loss terms
 * are counted whole (they live on the first and last stages).
 *
 * Megatron TP (bl 1.1; plans/megatron-tp.plan) [runtime counts]:
 *   forward  AR 2L+1 of b*s*h: 2 per layer (wo, w2: "g") + the vocab-parallel
 *            embedding's AR (bl 1.1 "Embedding"); no loss parallel: AG of the
 *            b*s*V logits; loss parallel: CE_FWD_AR ARs of b*s f64 scalars.
 *   backward AR 2L+1 of b*s*h: 2 per layer ("f") + 1 for the final norm /
 *            output input; loss parallel: CE_BWD_AR of b*s scalars.
 *   => per layer 4 AR of bsh: 8bsh(t-1)/t elements (bl 1.1).
 * TorchTitan TP + SP (bl 1.2; torchtitan-llama.md 2.1; plans/torchtitan-tp-sp.plan):
 *   forward  per layer 2 AG + 2 RS of b*s*h; embedding RS + output-input AG;
 *            loss parallel CE_FWD_AR ARs, else the logits AG.
 *   backward mirrored: per layer 2 AG + 2 RS; embedding AG + output RS;
 *            loss parallel CE_BWD_AR ARs.
 *   optimizer AR of the 2L+1 SP norm weights' gradients (h elements each).
 *   => per layer 4 AG + 4 RS: 8bsh(t-1)/t elements, the same as TP (bl 1.2). */
int sb_baseline_tp_terms(const sb_baseline_in *in, sb_tp_kind kind, bool loss_parallel,
                         sb_tp_terms *out) {
  char err[128];
  memset(out, 0, sizeof *out);
  if (sb_baseline_check(in, err, sizeof err)) return -1;
  const int t = in->tp;
  const int L = (in->model.n_layers + in->pp - 1) / in->pp;
  const double e = in->elem_bytes;
  const double b = (double)(in->batch / ((int64_t)in->dp_replicate * in->dp_shard));
  const double s = (double)(in->seq / in->cp);
  const double h = in->model.dim, V = in->model.vocab;
  const double act = b * s * h * e;        /* one b*s*h activation, bytes */
  const double logits = b * s * V * e;     /* the full logits */
  const double ce = b * s * CE_SCALAR_BYTES; /* one CE all-reduce (per position) */
  out->layers = L;
  if (kind == SB_TP_MEGATRON) {
    out->block_per_layer = 4 * ring_ar(act, t);
    out->boundary = 2 * ring_ar(act, t);
    out->n_ar = 2 * (2 * L + 1);
  } else {
    out->block_per_layer = 8 * ring_ag(act, t);
    out->boundary = 4 * ring_ag(act, t);
    out->optimizer = (2 * L + 1) * ring_ar(h * e, t);
    out->n_ag = 2 * L + 1 + 2 * L + 1;
    out->n_rs = out->n_ag;
    out->n_ar = 2 * L + 1;
  }
  if (loss_parallel) {
    out->loss = (CE_FWD_AR + CE_BWD_AR) * ring_ar(ce, t);
    out->n_ar += CE_FWD_AR + CE_BWD_AR;
  } else {
    out->logits = ring_ag(logits, t);
    out->n_ag += 1;
  }
  if (t == 1) out->n_ar = out->n_ag = out->n_rs = 0; /* a 1-rank group moves nothing */
  out->blocks = L * out->block_per_layer;
  out->total = out->blocks + out->boundary + out->logits + out->loss + out->optimizer;
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
  const double N = (double)dt_llama_nparams(mc);
  const double psi = N / ((double)t * p); /* what DP/ZeRO/FSDP shard: one model-parallel part */
  int n = 0;
#define ADD(fw, q, val, unit, f)                                  \
  do {                                                            \
    if (add(rows, &n, max, fw, q, val, unit, f)) return n;        \
  } while (0)

  /* ---- Megatron TP and TP + SP (bl 1.1, 1.2, 1.3) ---- */
  sb_tp_terms tm, ts;
  sb_baseline_tp_terms(in, SB_TP_MEGATRON, false, &tm);
  sb_baseline_tp_terms(in, SB_TP_SP, true, &ts);
  const double per_layer = 8 * b * s * h * (t - 1) / t * e;
  ADD("megatron-tp", "comm_bytes_per_layer", per_layer, "bytes",
      "bl 1.1: 4 AR of b*s*h per layer (2 fwd + 2 bwd): 8bsh(t-1)/t * e");
  ADD("megatron-tp", "comm_bytes_per_step_blocks", tm.blocks, "bytes",
      "bl 1.1: L/p * 8bsh(t-1)/t * e");
  ADD("megatron-tp", "comm_bytes_per_step", tm.total, "bytes",
      "bl 1.1 + embedding AR: (4L+2) AR of bsh + AG of b*s*V logits (no loss parallel)");
  ADD("megatron-tp", "activation_bytes_per_layer",
      s * mb * h * (10 + 24.0 / t + 5 * a * s / (h * t)), "bytes",
      "bl 1.3: sbh(10 + 24/t + 5as/(ht)), 16-bit activations, b = micro-batch");
  ADD("megatron-tp-sp", "comm_bytes_per_layer", per_layer, "bytes",
      "bl 1.2: 4 AG + 4 RS of b*s*h per layer: 8bsh(t-1)/t * e");
  ADD("megatron-tp-sp", "comm_bytes_per_layer_megatron_impl", 10 * b * s * h * (t - 1) / t * e,
      "bytes", "bl 1.2 impl: 6 AG + 4 RS (re-all-gather in bwd): 10bsh(t-1)/t * e");
  ADD("megatron-tp-sp", "comm_bytes_per_step_blocks", ts.blocks, "bytes",
      "bl 1.2: L/p * 8bsh(t-1)/t * e");
  ADD("megatron-tp-sp", "comm_bytes_per_step", ts.total, "bytes",
      "bl 1.2 + torchtitan 2.1: (4L+2)(AG+RS) of bsh + 3 AR of b*s f64 (loss parallel) + "
      "(2L+1) AR of h (SP norm grads)");
  ADD("megatron-tp-sp", "activation_bytes_per_layer", s * mb * h / t * (34 + 5 * a * s / h),
      "bytes", "bl 1.3: sbh/t (34 + 5as/h), 16-bit activations");
  ADD("megatron-tp-sp", "activation_bytes_per_layer_selective", 34 * s * mb * h / t, "bytes",
      "bl 1.3: 34sbh/t (TP + SP + selective recompute)");
  ADD("megatron-tp-sp", "activation_bytes_per_rank", Lr * 34 * s * mb * h / t * p, "bytes",
      "bl 1.3: 1F1B stage 0 holds p micro-batches x L/p layers = 34sbh/t * L");

  /* ---- ZeRO, DDP, FSDP, HSDP (bl 2.1, 2.2, 2.3) ---- */
  ADD("ddp", "comm_bytes_per_step", ring_ar(psi * e, d), "bytes",
      "bl 2.2: all-reduce of grads 2Psi(d-1)/d * e");
  ADD("ddp", "memory_bytes_per_rank", (ZERO_PARAM_B + ZERO_GRAD_B + ZERO_K) * psi, "bytes",
      "bl 2.1: baseline DP (2 + 2 + K)Psi, K = 12");
  ADD("zero1", "memory_bytes_per_rank", (ZERO_PARAM_B + ZERO_GRAD_B) * psi + ZERO_K * psi / d,
      "bytes", "bl 2.1: 2Psi + 2Psi + K Psi/N_d");
  ADD("zero1", "comm_bytes_per_step", 2 * ring_ag(psi * e, d), "bytes",
      "bl 2.2: RS grads + AG params = 2Psi(N_d-1)/N_d * e");
  ADD("zero2", "memory_bytes_per_rank", ZERO_PARAM_B * psi + (ZERO_GRAD_B + ZERO_K) * psi / d,
      "bytes", "bl 2.1: 2Psi + (2 + K)Psi/N_d");
  ADD("zero2", "comm_bytes_per_step", 2 * ring_ag(psi * e, d), "bytes",
      "bl 2.2: RS grads + AG params = 2Psi(N_d-1)/N_d * e");
  ADD("zero3", "memory_bytes_per_rank", (ZERO_PARAM_B + ZERO_GRAD_B + ZERO_K) * psi / d, "bytes",
      "bl 2.1: (2 + 2 + K)Psi/N_d");
  ADD("zero3", "comm_bytes_per_step", 3 * ring_ag(psi * e, d), "bytes",
      "bl 2.2: AG fwd + AG bwd + RS grads = 3Psi(N_d-1)/N_d * e");
  ADD("fsdp", "comm_bytes_per_step", 3 * ring_ag(psi * e, d), "bytes",
      "bl 2.3: FULL_SHARD = ZeRO-3: 3Psi(d-1)/d * e over dp_replicate*dp_shard");
  ADD("fsdp", "comm_bytes_per_step_bf16ag_fp32rs", ring_ag(FSDP_MP_BYTES * psi, d), "bytes",
      "bl 2.2: torchtitan mixed precision (2 + 2 + 4)Psi(d-1)/d");
  ADD("fsdp", "memory_bytes_per_rank", FSDP_BYTES_PER_PARAM * psi / d, "bytes",
      "bl 2.3: 16Psi/N_d (4 param + 4 grad + 8 Adam), no activations");
  ADD("hsdp", "comm_bytes_per_step", 3 * ring_ag(psi * e, F) + ring_ar(psi / F * e, R), "bytes",
      "bl 2.3: 3Psi(F-1)/F + 2(Psi/F)(R-1)/R, F = dp_shard, R = dp_replicate, * e");
  ADD("hsdp", "comm_bytes_per_step_inter_group", ring_ar(psi / F * e, R), "bytes",
      "bl 2.3: inter-group AR 2(Psi/F)(R-1)/R * e");
  ADD("hsdp", "memory_bytes_per_rank", FSDP_BYTES_PER_PARAM * psi / F, "bytes",
      "bl 2.3: 16Psi/F");

  /* ---- pipeline (bl 3) ---- */
  const double act_mb = Lr * 34 * s * mb * h / t; /* one micro-batch on a stage: bl 1.3 */
  const double p2p = 2 * b * s * h * e;           /* per boundary per step, fwd + bwd */
  ADD("gpipe", "bubble_fraction", (double)(p - 1) / (m + p - 1), "fraction",
      "bl 3: (p-1)/(m+p-1) of total time");
  ADD("gpipe", "activation_bytes_per_rank", m * act_mb, "bytes",
      "bl 3: m micro-batches stashed x L/p layers x 34sbh/t (bl 1.3)");
  ADD("gpipe", "p2p_bytes_per_step", p > 1 ? p2p : 0, "bytes",
      "bl 3: 2 m b s h * e per stage boundary (act fwd + grad bwd)");
  ADD("1f1b", "bubble_fraction", (double)(p - 1) / (m + p - 1), "fraction",
      "bl 3: same bubble as GPipe, (p-1)/(m+p-1) of total time");
  ADD("1f1b", "bubble_over_ideal", (double)(p - 1) / m, "fraction", "bl 3: (p-1)/m");
  ADD("1f1b", "activation_bytes_per_rank", (m < p ? m : p) * act_mb, "bytes",
      "bl 3: min(m, p) micro-batches in flight on stage 0 x L/p layers x 34sbh/t");
  ADD("1f1b", "p2p_bytes_per_step", p > 1 ? p2p : 0, "bytes",
      "bl 3: 2 m b s h * e per stage boundary");
  ADD("interleaved", "bubble_fraction", (double)(p - 1) / ((double)v * m + p - 1), "fraction",
      "bl 3: bubble/ideal (1/v)(p-1)/m, as a fraction of total (p-1)/(vm+p-1)");
  ADD("interleaved", "bubble_over_ideal", (double)(p - 1) / ((double)v * m), "fraction",
      "bl 3: (1/v)(p-1)/m");
  ADD("interleaved", "activation_bytes_per_rank",
      (m < p ? m : p) * act_mb * (1 + (double)(p - 1) / ((double)p * v)), "bytes",
      "bl 1.3/3: 1F1B x (1 + (p-1)/(p v))");
  ADD("interleaved", "p2p_bytes_per_step", p > 1 ? v * p2p : 0, "bytes",
      "bl 3: v x 2 m b s h * e per rank");

  /* ---- context parallel (bl 4.1): KV = 2 b s h_kv for the full sequence; a TP
   * rank holds h_kv/t of it (kv heads are column-sharded) ---- */
  const double kv = 2 * b * (s * c) * hkv / t * e;
  const double cp_layer = c > 1 ? 3 * kv * (c - 1) / c : 0;
  ADD("ring-cp", "comm_bytes_per_layer", cp_layer, "bytes",
      "bl 4.1: KV(c-1)/c fwd + (KV + dKV)(c-1)/c bwd, KV = 2bsh_kv/t * e");
  ADD("ring-cp", "comm_bytes_per_step", Lr * cp_layer, "bytes", "bl 4.1: L/p x per layer");

  /* ---- FLOPs (bl 6.1, torchtitan convention) ---- */
  const double fpt = 6 * (N - V * h) + 12.0 * mc->n_layers * h * (double)in->seq;
  ADD("torchtitan", "flops_per_token", fpt, "flop",
      "bl 6.1: 6 N_matmul + 12 L h s (N_matmul = N - embedding; no causal discount)");
  ADD("torchtitan", "flops_per_step", fpt * (double)in->batch * (double)in->seq, "flop",
      "bl 6.1: flops_per_token x global batch x seq");
#undef ADD
  return n;
}
