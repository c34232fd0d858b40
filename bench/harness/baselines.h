/* bench/harness/baselines.h: analytic communication, memory, bubble and FLOP
 * numbers as a C API, so that `shardbench baselines`, run/sweep (the store) and
 * the tests compute the same values. Two kinds, kept apart:
 *
 * - Framework baselines (sb_baseline_compute, sb_framework_comm): what
 *   Megatron-LM, ZeRO, PyTorch DDP and FSDP move according to their published
 *   formulas (each formula cites its paper and section in baselines_model.c). A
 *   term the paper does not count (the fused cross-entropy's scalars, the output
 *   layer's input-gradient all-reduce, the sequence-parallel norm weights'
 *   gradients) is not counted here either: the difference between a measured
 *   bar and its framework cross is the point of the comm chart. Which framework
 *   applies to a config follows from the plan's settings (sb_plan_traits: the
 *   styles on each module, sequence parallel, loss_parallel) and the mesh's dp
 *   dims, never from the plan's name.
 *
 * - The runtime's own closed form (sb_runtime_comm): what this runtime's ledger
 *   records for the shipped plan shapes, derived from its own choices (f64 loss
 *   scalars, the output boundary, the norm weights' gradients). It is a
 *   REGRESSION model: verify/test_baselines.c and verify/harness.sh check the
 *   ledger against it byte for byte. It is never drawn or stored as a framework
 *   baseline.
 *
 * Units: communication is WIRE BYTES PER RANK PER STEP under the ring model the
 * ledger uses (NVIDIA/nccl-tests doc/PERFORMANCE.md bus bandwidth): all_reduce
 * 2(n-1)/n * S, all_gather and reduce_scatter (n-1)/n * S, S = the full
 * tensor's bytes; so a value compares directly with the sum of one rank's
 * dt_ledger_row.wire_bytes. Memory is bytes per rank; bubbles are fractions of
 * the step time.
 */
#ifndef SB_BASELINES_H
#define SB_BASELINES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nn/nn.h"
#include "parallel/parallel.h"

/* One configuration (what `shardbench baselines` parses). */
typedef struct sb_baseline_in {
  dt_llama_config model;
  int pp, dp_replicate, dp_shard, cp, tp;
  int64_t batch;          /* global batch (sequences) */
  int64_t seq;            /* sequence length (tokens) */
  int elem_bytes;         /* bytes per element of activations/params/grads (dtype) */
  int microbatches;       /* m (PP); >= 1 */
  int virtual_stages;     /* v (interleaved PP); >= 1 */
} sb_baseline_in;

/* One analytic number, as the baselines table stores it. */
typedef struct sb_baseline_row {
  char framework[48];     /* megatron-tp | megatron-tp-sp | ddp | zero3 | ... (schema.sql) */
  char quantity[40];      /* comm_bytes_per_step | memory_bytes_per_rank | ... */
  double value;
  char unit[16];          /* bytes | fraction | flop */
  char formula[192];      /* the formula and the paper (section) it comes from */
} sb_baseline_row;

/* What a plan does, as far as the formulas care, read from the parsed plan (its
 * [tp] entries and loss_parallel) for one model config. */
typedef struct sb_plan_traits {
  bool valid;             /* filled by sb_plan_traits_get / sb_plan_traits_megatron */
  int layers;             /* the model config's layers */
  int attn_tp_layers;     /* layers whose attention is split as Megatron-LM's: wq, wk, wv
                             ColwiseParallel and wo RowwiseParallel on tp */
  int mlp_tp_layers;      /* layers whose MLP is: w1, w3 ColwiseParallel, w2 RowwiseParallel */
  int prepared_layers;    /* layers whose attention and feed_forward both have a
                             PrepareModuleInput on tp (one gather per block input) */
  bool vocab_embedding;   /* tok_embeddings RowwiseParallel on tp: the vocabulary split */
  bool vocab_output;      /* output ColwiseParallel on tp: vocabulary-sharded logits */
  bool sequence_parallel; /* a SequenceParallel entry or a Shard(1) / Shard(-2) layout on tp */
  bool loss_parallel;     /* cross-entropy on the vocabulary-sharded logits */
  double tp_params;       /* parameters of the modules the plan splits over tp */
  double rep_params;      /* parameters every tp rank holds whole (norms, unsplit modules) */
  bool fsdp;              /* fully_shard entries on dp_shard */
  bool fsdp_torchtitan;   /* exactly TorchTitan's units: tok_embeddings, layers.*, the group
                             [norm, output] (kept after forward), root */
  int zero;               /* the plan's zero setting (0: not given) */
  int fsdp_param_bytes;   /* FSDP mixed precision: bytes per all-gathered element
                             (mixed_precision_param); 0: the run's dtype */
  int fsdp_reduce_bytes;  /* bytes per reduced gradient element (mixed_precision_reduce);
                             0: the run's dtype */
  dt_cp_rotate cp_rotate; /* context_parallel_rotate_method (allgather unless the plan says) */
  int pp_virtual;         /* pipeline stages per rank of the plan's schedule (interleaved: 2) */
  int pp_stages;          /* the plan's explicit stage count (module_fqns_per_model_part),
                             0: none; stages per rank are then pp_stages / pp */
} sb_plan_traits;

/* Fills *out from a parsed plan (the entries on its "tp" dim; a plan without one
 * splits nothing) for the model config cfg. The plan's name is not read. */
void sb_plan_traits_get(const dt_plan *plan, const dt_llama_config *cfg, sb_plan_traits *out);
/* Megatron-LM's published layout (Shoeybi et al. 2019, sec. 3): every attention
 * and MLP block split, vocabulary-parallel embedding and output, the output fused
 * with the cross-entropy; sequence parallel as given. */
/* The model a harness workload trains: `model` is the named config, `block` the
 * same with one TransformerBlock; the single-layer workloads keep only their
 * modules (dt_llama_config's no_* fields): `embedding` tok_embeddings alone (no
 * layers), `attention` one block of attention_norm + attention, `feed_forward` one
 * block of ffn_norm + feed_forward, `output` norm + output alone (no layers).
 * DT_ERR_INVALID (recorded on ctx, which may be NULL) for an unknown model or
 * workload. */
dt_status sb_workload_config(dt_ctx *ctx, const char *model, const char *workload,
                             dt_llama_config *out);
/* Whether the workload is one of the single-layer ones (not model or block). */
bool sb_workload_single(const char *workload);
/* The whole model a workload's config c is cut from (every module, at least one
 * layer): what its plan is resolved against, so that a plan pattern that names a
 * module of the model but not of the workload is no error, a typo still one. */
void sb_workload_whole(const dt_llama_config *c, dt_llama_config *out);
void sb_plan_traits_megatron(const dt_llama_config *cfg, bool sequence_parallel,
                             sb_plan_traits *out);
/* Parameters on one rank under the traits' tp split: tp_params/tp + rep_params,
 * shared by the pp stages (/pp). What DDP all-reduces and FSDP shards. */
double sb_params_per_rank(const sb_baseline_in *in, const sb_plan_traits *tr);

/* The framework baseline of one config: the TP part (Megatron-LM TP, or TP +
 * sequence parallel) and the DP part (DDP over dp_replicate, FSDP over
 * dp_shard, HSDP over both), each from its paper's formula. */
typedef struct sb_framework_comm {
  char tp_framework[24];  /* megatron-tp | megatron-tp-sp | "" (no tp split) */
  double tp_blocks;       /* the split attention and MLP blocks */
  double tp_embedding;    /* the vocabulary-parallel embedding's all-reduce */
  double tp_logits;       /* unfused output: the b*s*V logits all-gather */
  double tp;              /* tp_blocks + tp_embedding + tp_logits */
  char tp_formula[160];
  char dp_framework[24];  /* ddp | fsdp | hsdp | "" (no dp dim); under cp its dims are
                             dp_replicate x cp (ddp) or dp_shard x cp (FSDP) */
  double dp;
  char dp_formula[160];
  char cp_framework[24];  /* ring-cp | allgather-cp | "" (cp = 1) */
  double cp;              /* attention's K/V traffic over cp */
  char cp_formula[160];
  char pp_framework[24];  /* pp-p2p | "" (pp = 1) */
  double pp;              /* rank 0's pipeline sends */
  char pp_formula[160];
  char name[96];          /* "megatron-tp-sp+ddp": the parts that apply, joined by '+' */
  double total;           /* tp + dp + cp + pp: the comm chart's cross */
} sb_framework_comm;

/* Returns 0, or -1 for a bad input (sb_baseline_check) or invalid traits. */
int sb_framework_comm_compute(const sb_baseline_in *in, const sb_plan_traits *tr,
                              sb_framework_comm *out);

/* The runtime's own closed form (a regression model; see the file comment).
 * Applies to the layouts the shipped plans have: no tp split, or every block,
 * the embedding and the output split with PrepareModuleInput on each block
 * (plans/megatron-tp.plan: replicated activations; plans/torchtitan-tp-sp.plan
 * and plans/tp-no-loss-parallel.plan: sequence parallel), with dp_replicate,
 * TorchTitan's FSDP units over dp_shard, and cp; pp = 1. Derivation in
 * baselines_model.c. */
typedef struct sb_runtime_comm {
  int layers;             /* transformer layers */
  double block_per_layer; /* one layer's block collectives, fwd + bwd */
  double blocks;          /* layers * block_per_layer */
  double boundary;        /* embedding output + final norm / output input, fwd + bwd */
  double logits;          /* logits all-gather (no loss parallel) */
  double loss;            /* loss-parallel cross-entropy all-reduces (f64 scalars) */
  double optimizer;       /* SP norm weights' gradient all-reduces over tp */
  double tp;              /* the six tp terms above summed */
  double dp;              /* the gradient all-reduces over dp_replicate (DDP), or FSDP's
                             all-gathers and reduce-scatters over dp_shard and HSDP's
                             all-reduces over dp_replicate (x cp: see cp) */
  double cp;              /* context parallel's K/V traffic over cp (sdpa_cp) */
  double total;           /* tp + dp + cp */
  int n_ar, n_ag, n_rs;   /* tp collective calls per step */
  int n_cp_send, n_cp_ag, n_cp_rs; /* cp collective calls per step (sends: the recvs match) */
} sb_runtime_comm;

/* Returns 0, or -1 when the layout is not one the model covers or the input is bad. */
int sb_runtime_comm_compute(const sb_baseline_in *in, const sb_plan_traits *tr,
                            sb_runtime_comm *out);
/* The same total as the DB row framework "runtime-model" (quantity
 * comm_bytes_per_step_runtime_model) the regression checks read; 0 or -1. */
int sb_runtime_comm_row(const sb_baseline_in *in, const sb_plan_traits *tr,
                        sb_baseline_row *row);

/* Every framework baseline for the config (Megatron-LM's own layout for the TP
 * rows) into rows[0..max); returns how many were written (<= max), or -1 for a
 * bad input. SB_BASELINE_MAX_ROWS is enough. */
enum { SB_BASELINE_MAX_ROWS = 64 };
int sb_baseline_compute(const sb_baseline_in *in, sb_baseline_row *rows, int max);

/* The rows a config's plan selects: the TP part and the DP part
 * (comm_bytes_per_step, their framework names) and their sum, the comm chart's
 * cross (quantity comm_bytes_per_step_combined, framework "megatron-tp+ddp" and
 * the like). Returns how many (0 when no framework applies: one rank), or -1. */
int sb_baseline_plan_rows(const sb_baseline_in *in, const sb_plan_traits *tr,
                          sb_baseline_row *rows, int max);

/* Checks the input: 0, or -1 with a one-line reason in err. */
int sb_baseline_check(const sb_baseline_in *in, char *err, size_t errn);

#endif
