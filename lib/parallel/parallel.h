/* lib/parallel/parallel.h: ParallelStyles, parallelize_module, plans and data parallel.
 *
 * Styles are data: PyTorch's ColwiseParallel, RowwiseParallel, SequenceParallel,
 * PrepareModuleInput, PrepareModuleOutput (torch/distributed/tensor/parallel/
 * style.py) with their input_layouts, desired_input_layouts, output_layouts,
 * use_local_output and defaults. dt_parallelize_module matches fqn patterns token by token with
 * fnmatch and installs each style as module hooks plus weight placements on one
 * mesh dim. Plans are files (plans/NAME.plan) parsed here. Pipeline stage splits
 * and schedules are in pipeline.h (included below).
 */
#ifndef DT_PARALLEL_H
#define DT_PARALLEL_H

#include "../nn/nn.h"
#include "pipeline.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dt_style_kind {
  DT_STYLE_COLWISE = 0, DT_STYLE_ROWWISE, DT_STYLE_SEQUENCE, DT_STYLE_PREPARE_INPUT,
  DT_STYLE_PREPARE_OUTPUT,
  DT_STYLE_FULLY_SHARD  /* FSDP2's fully_shard (torch/distributed/fsdp/_fully_shard/_fully_shard.py),
                         * only under [dp_shard] (dt_fully_shard applies it over dp_shard, cp
                         * or both) */
} dt_style_kind;

enum { DT_STYLE_MAX_ARGS = 4 };

/* A layout of one activation argument on the style's mesh dim; `none` = leave it. */
typedef struct dt_style_layout {
  bool none;
  dt_placement pl;
} dt_style_layout;

typedef struct dt_style {
  dt_style_kind kind;
  int n_in;                                   /* arguments the layouts describe */
  dt_style_layout input_layouts[DT_STYLE_MAX_ARGS];
  dt_style_layout desired_input_layouts[DT_STYLE_MAX_ARGS];
  int n_out;
  dt_style_layout output_layouts[DT_STYLE_MAX_ARGS];
  dt_style_layout desired_output_layouts[DT_STYLE_MAX_ARGS];
  bool use_local_output;
  int sequence_dim;                           /* SequenceParallel (1) */
  int reshard_after_forward;                  /* fully_shard: 1 True, 0 False, -1 not given
                                               * (FSDP2's None: True, except the root) */
} dt_style;

/* A style with PyTorch's defaults for its kind. */
void dt_style_default(dt_style_kind kind, dt_style *out);
/* "ColwiseParallel(output_layouts=Shard(1))" etc. (what plan files contain). */
int dt_style_str(const dt_style *s, char *buf, size_t n);

typedef struct dt_plan_entry {
  char pattern[96];                           /* fqn pattern, fnmatch per '.' token; a
                                               * fully_shard group: patterns joined by ','
                                               * ("norm,output"); the model itself: "root" */
  dt_style style;
  int line;                                   /* where it came from (plan files) */
  int dim;                                    /* index into dt_plan.dim_names ([dim] section) */
} dt_plan_entry;

enum { DT_PLAN_MAX_ENTRIES = 64, DT_PLAN_MAX_DIMS = 5 };

/* A parsed plan file: the parallel dims, the settings and the entries (TP styles
 * under [tp], fully_shard units under [dp_shard]). */
typedef struct dt_plan {
  char name[64];
  char path[256];
  int n_dims;
  char dim_names[DT_PLAN_MAX_DIMS][32];       /* e.g. dp_replicate, tp */
  int dim_sizes[DT_PLAN_MAX_DIMS];            /* -1: inferred from the world (at most one
                                               * when only the world is known) */
  bool loss_parallel;
  /* FSDP / ZeRO ([dp_shard] fully_shard entries) and DDP settings */
  int zero;                                   /* 0: not given (3 with fully_shard entries); 1, 2, 3 */
  dt_dtype param_dtype;                       /* mixed_precision_param; DT_DTYPE_COUNT: not
                                               * given (the model's dtype) */
  dt_dtype reduce_dtype;                      /* mixed_precision_reduce; DT_DTYPE_COUNT: not given */
  double bucket_cap_mb;                       /* DDP's bucket_cap_mb; 0: not given (DDP's 25) */
  /* activation_checkpoint_mode and selective_ac_option (TorchTitan's); zero: none */
  dt_ac_config ac;
  bool ac_given;                              /* activation_checkpoint_mode stated (even
                                               * none): the plan means that AC */
  double max_norm;                            /* TorchTitan's training.max_norm (gradient
                                               * clipping); 0: not given (none) */
  /* context parallel (a cp dim): context_parallel_rotate_method (allgather, the
   * default, or ring) and context_parallel_load_balance (head-tail; default true) */
  dt_cp_rotate cp_rotate;
  bool cp_load_balance;
  /* pipeline parallel (a pp dim): pipeline_parallel_schedule (1F1B, TorchTitan's
   * default; GPipe, Interleaved1F1B with 2 stages per rank) or
   * pipeline_parallel_schedule_csv (DT_PP_CSV: pp_schedule_csv, relative to the plan
   * file's directory), pipeline_parallel_microbatch_size (default 1: microbatches
   * = the local batch) or pipeline_parallel_microbatches (pp_microbatches: N
   * microbatches of local batch / N; -1: the pp degree, TorchTitan's default before
   * microbatch_size replaced it; 0: not given) */
  dt_pp_schedule_kind pp_schedule;
  char pp_schedule_csv[256];
  int pp_microbatch_size;
  int pp_microbatches;
  /* the stage split: module_fqns_per_model_part (TorchTitan's
   * parallelism.module_fqns_per_model_part, one stage per inner list) as stage s's
   * module names joined by ',' and the stages by ';'
   * ("tok_embeddings,layers.0;layers.1,norm,output"; pp_n_stages of them, given on
   * line pp_stages_line), or "" for TorchTitan's generated split, where the embedding
   * and norm + output count as pp_first_less / pp_last_less layers
   * (pipeline_parallel_first_stage_less_layers / _last_stage_less_layers, default 1) */
  char pp_stages[2048];
  int pp_n_stages, pp_stages_line;
  int pp_first_less, pp_last_less;
  int n_entries;
  dt_plan_entry entries[DT_PLAN_MAX_ENTRIES];
} dt_plan;

/* Parses a plan file. Errors: DT_ERR_INVALID with "FILE:LINE:COL: expected ..." in
 * the ctx's last error (syntax), or a one-line message for unknown styles, bad
 * placements, bad dims. DT_ERR_IO when the file cannot be read. */
dt_status dt_plan_load(dt_ctx *ctx, const char *path, dt_plan *out);
dt_status dt_plan_parse(dt_ctx *ctx, const char *text, const char *path, dt_plan *out);
/* Resolves -1 dims against the world size; checks the plan fits the model (every
 * pattern matches some fqn, heads and kv heads divisible by tp, seq divisible by
 * tp under sequence parallel). One-line DT_ERR_INVALID messages. */
dt_status dt_plan_resolve(dt_ctx *ctx, dt_plan *p, int world, const dt_llama_config *cfg,
                          int seq_len);
/* The part of dt_plan_resolve that needs no world: every entry's pattern (each
 * of a group's; `root` always) matches some module fqn of cfg, Colwise/Rowwise
 * ones only Linear or Embedding modules; with fully_shard entries, no weight is
 * in two units and every weight is in one unless a root entry takes the rest.
 * One-line DT_ERR_INVALID "FILE:LINE: pattern '...' ..." / "FILE:LINE: module
 * '...' is in two fully_shard units ..." / "FILE: module '...' is in no ...". */
dt_status dt_plan_check_modules(dt_ctx *ctx, const dt_plan *p, const dt_llama_config *cfg);
/* The patterns of an entry into out (at most max): one, or each of a fully_shard
 * group's ("norm,output" -> "norm", "output"). Returns how many. */
int dt_plan_entry_patterns(const dt_plan_entry *e, char (*out)[96], int max);
/* Index of the dim named `name` ("tp", ...) in p->dim_names, or -1. */
int dt_plan_dim(const dt_plan *p, const char *name);

/* Applies plan entries to the model's modules on mesh dim `mesh_dim` (the tp
 * dim): weight placements and activation hooks. Call before materialize. */
dt_status dt_parallelize_module(dt_ctx *ctx, dt_model *m, int mesh_dim, const dt_plan_entry *entries,
                                int n_entries);
/* fnmatch of one fqn against a pattern, token by token ('.'-separated). */
bool dt_fqn_match(const char *pattern, const char *fqn);

/* Frees the hook states dt_parallelize_module allocated in m's modules and
 * removes its hooks, leaving the model unparallelized (dt_model_free frees
 * them too, through each module's hook_free). Modules whose hooks someone
 * else installed are left alone. */
void dt_parallelize_release(dt_ctx *ctx, dt_model *m);

/* DDP's bucket caps (torch/nn/parallel/distributed.py: _DEFAULT_BUCKET_CAP_MB = 25 MiB;
 * torch/csrc/distributed/c10d/reducer.hpp: kDefaultFirstBucketBytes = 1 MiB, which is
 * dist._DEFAULT_FIRST_BUCKET_BYTES). */
enum { DT_DDP_BUCKET_CAP_BYTES = 25 << 20, DT_DDP_FIRST_BUCKET_BYTES = 1 << 20 };

/* Gradient bucket sizes of dt_data_parallel_reduce_grads, in bytes of local data.
 *   bucket_cap_bytes    DDP's bucket_cap_mb * 2^20; <= 0: no buckets, one all_reduce
 *                       per gradient, in place.
 *   first_bucket_bytes  the cap of the first bucket; <= 0: bucket_cap_bytes. (torch
 *                       2.15, _BucketCapacityConfig.create in distributed.py: 1 MiB only
 *                       when bucket_cap_mb is not given; a given bucket_cap_mb, such as
 *                       TorchTitan's 100 in apply_ddp, caps the first bucket too.) */
typedef struct dt_ddp_opts {
  double bucket_cap_bytes;
  double first_bucket_bytes;
} dt_ddp_opts;

/* Data parallel (replicate), as DDP's Reducer does it, over the mesh dims of the
 * bit mask dp_dims (bit d: mesh dim d): every weight gradient that is Partial on
 * one of them (batch-sharded activations give Partial(sum) weight gradients,
 * since the loss is the global mean; so do sequence-sharded ones under context
 * parallel) is all-reduced over them and becomes Replicate on all of them. The
 * sum of the Partial(sum) contributions of the global mean loss is the DDP
 * average of the per-rank mean losses' gradients. A gradient Partial on some of
 * the dims and Replicate on others is counted once: ranks with a nonzero
 * coordinate on a Replicate one contribute zeros. Only those dims change: a
 * gradient also Partial on another dim (the tp Partial of the SequenceParallel
 * norm weights) keeps that Partial (the optimizer reduces it).
 *
 * The group: one dim, its communicator (dt_mesh_comm); several, one communicator
 * over them flattened (dt_mesh_flatten with PyTorch's default name, the dim names
 * joined by "_": TorchTitan's dp_cp, torchtitan/distributed/parallel_dims.py, on
 * which apply_ddp in torchtitan/models/llama3/infra/parallelize.py all-reduces;
 * created by the first call, a collective over the root mesh, cached after).
 *
 * Buckets (torch/csrc/distributed/c10d/reducer.cpp, compute_bucket_assignment_by_size
 * and Reducer::rebuild_buckets): the gradients are taken in reverse module order
 * (m->mods: parents before children, in execution order; reversed it is the
 * order gradients become ready in backward, the order DDP's rebuilt buckets
 * follow); each is added to the open bucket, which closes once its bytes reach
 * its cap (the gradient that reaches it stays in), the first bucket with
 * first_bucket_bytes, the others with bucket_cap_bytes. A gradient of another
 * dtype or Partial op than the open bucket's closes it first (DDP keeps one
 * open bucket per dtype; here every gradient has the model's). Each bucket is
 * one all_reduce on the group's communicator of its gradients' local data
 * concatenated (copied in and back out, DDP's gradient_as_bucket_view=False;
 * a bucket of one gradient is reduced in place), so the ledger has one row per
 * bucket, named after the group, phase "backward" (the previous phase is
 * restored). Each element is summed as the per-gradient all_reduce sums it, so
 * the result is the same, bit for bit, on a backend whose sum order does not
 * depend on the buffer (threads: rank order; any backend with 2 ranks).
 * PyTorch's very first iteration reduces all gradients in one bucket (the
 * buckets are rebuilt after it); this is the rebuilt, steady-state assignment.
 *
 * opts NULL: DDP's defaults (DT_DDP_BUCKET_CAP_BYTES, DT_DDP_FIRST_BUCKET_BYTES).
 * Call after dt_model_backward and before the optimizer, on every rank of the
 * mesh. DT_ERR_INVALID for an empty mask or a dim past the mesh, a NaN cap or a
 * model not materialized; DT_ERR_UNSUPPORTED for gradients not in host memory or
 * Partial on one of the dims and Shard (or Partial with another op) on another;
 * all before any collective. DT_ERR_NOMEM. */
dt_status dt_data_parallel_reduce_grads(dt_ctx *ctx, dt_model *m, unsigned dp_dims,
                                        const dt_ddp_opts *opts);

/* ---- context parallel: lib/parallel/cp.c ---- */

/* Context parallel over mesh dim cp_dim (PyTorch's context_parallel, TorchTitan's
 * parallelism.context_parallel_degree): the model's attention becomes sdpa_cp with
 * the rotate method, rope reads positions of the stored order, which is head-tail
 * (2 cp chunks) with load_balance and natural without. The tokens and targets must
 * then be given in that order, sharded over cp: dt_cp_shard_sequence. Call before
 * the first forward. DT_ERR_INVALID for a bad dim or method. */
dt_status dt_context_parallel(dt_ctx *ctx, dt_model *m, int cp_dim, dt_cp_rotate rotate,
                              bool load_balance);
/* A global host array (tokens [b, s], targets) in the model's context-parallel
 * storage order along seq_dim, distributed on m's mesh with placements pl, the cp
 * dim's replaced by Shard(seq_dim) (no communication; every rank passes the same
 * global array). DT_ERR_INVALID when the model has no context parallel, the
 * sequence does not divide into the chunks (2 cp load-balanced, else cp), or
 * another mesh dim shards seq_dim. */
dt_status dt_cp_shard_sequence(dt_ctx *ctx, const dt_model *m, const dt_array *global, int seq_dim,
                               const dt_placement *pl, dt_tensor *out);

/* ---- pipeline parallel: the runtime, lib/parallel/pp.c ---- */

/* One action of a step as it ran on this rank: when it started and ended (dt_now).
 * A RECV's event is the receive itself, done (waited for) just before the F or B
 * that consumes it. */
typedef struct dt_pp_event {
  dt_pp_action action;
  double t0, t1;
} dt_pp_event;

/* One step's forward and backward of every microbatch through the pipeline over
 * mesh dim pp_dim: this rank runs its list of the lowered schedule S (actions in
 * order) on the stages of layout L it holds (it runs only its stages' modules,
 * dt_model_forward_part: the other stages' weights may be released). tokens and
 * targets: S->n_microbatches DTensors each (read on the first and the last stage's
 * rank). Each microbatch's loss is divided by the count (TorchTitan's
 * rescale_accumulated_loss); *loss is their sum on the last stage's rank (0
 * elsewhere); the weights' gradients accumulate over the microbatches (the
 * optimizer then steps once). events[0..*n_events) (may be NULL): every action's
 * start and end in the order they ran, at most max_events. Collective over the pp group (and the other
 * mesh dims the stages' ops use). DT_ERR_INVALID for a schedule not lowered or not
 * matching the layout, the mesh or the model. */
dt_status dt_pipeline_step(dt_ctx *ctx, dt_model *m, int pp_dim, const dt_pp_layout *L,
                           const dt_pp_schedule *S, const dt_tensor *tokens,
                           const dt_tensor *targets, double *loss, dt_pp_event *events,
                           int max_events, int *n_events);
/* dt_pipeline_step as one of a step's `accum` gradient-accumulation steps (TorchTitan's
 * train_step calls pp_schedule.step once per step of gradient_accumulation_steps):
 * each microbatch's loss is divided by n_microbatches x accum (rescale_accumulated_loss
 * over the whole step), and the gradients add to those already there (FSDP: to the
 * sharded ones). dt_pipeline_step is accum = 1. */
dt_status dt_pipeline_step_accum(dt_ctx *ctx, dt_model *m, int pp_dim, const dt_pp_layout *L,
                                 const dt_pp_schedule *S, int accum, const dt_tensor *tokens,
                                 const dt_tensor *targets, double *loss, dt_pp_event *events,
                                 int max_events, int *n_events);

/* The stage of layout L holding module i's weight (tok_embeddings: the first stage,
 * layers.N: the stage with layer N, norm and output: the last), -1 when none. */
int dt_pp_module_stage(const dt_model *m, const dt_pp_layout *L, int i);
/* For checks (the verifier, checkpoints): makes every pp rank's copy of each weight's
 * value (grads false) or gradient (grads true) its owner's: the pp rank holding the
 * weight's stage broadcasts it over the pp group (a gradient's placements first).
 * A value released on this rank (dt_pipeline_release_foreign) is allocated first.
 * Collective over the pp group. Afterwards the other ranks hold gradients of weights
 * they do not train (dt_pipeline_drop_foreign_grads before the optimizer) and, with
 * grads false, the other stages' values (dt_pipeline_release_foreign after the check). */
dt_status dt_pipeline_share(dt_ctx *ctx, dt_model *m, int pp_dim, const dt_pp_layout *L,
                            bool grads);
/* Drops the gradients of the weights whose stages this rank does not hold. */
void dt_pipeline_drop_foreign_grads(dt_model *m, int pp_dim, const dt_pp_layout *L);
/* Frees the local data of every weight whose stage this rank does not hold (under
 * FSDP the local data is the shard), and drops their gradients: the rank then holds
 * only its stages' weights, as TorchTitan's pipeline_module_split leaves each rank
 * (torchtitan/distributed/pipeline_parallel.py). The tensors' metadata stay, so
 * dt_pipeline_share can refill them; dt_model_state_bytes counts only allocated
 * values. Idempotent; local, no communication. DT_ERR_INVALID for a bad pp_dim or a
 * weight in no stage of L (nothing released then). */
dt_status dt_pipeline_release_foreign(dt_ctx *ctx, dt_model *m, int pp_dim, const dt_pp_layout *L);

/* ---- FSDP2 (fully_shard), HSDP, ZeRO: lib/parallel/fsdp.c ---- */

/* Fill with designated initialisers: a dim left out would be 0, a real dim. */
typedef struct dt_fsdp_opts {
  int shard_dim;        /* the dp_shard mesh dim; -1: none (FSDP over cp_dim alone) */
  int cp_dim;           /* the cp mesh dim, sharded with shard_dim as one flattened group
                         * (TorchTitan's dp_shard_cp; it must be shard_dim + 1 when both are
                         * given); -1: none */
  int replicate_dim;    /* HSDP: the dp_replicate mesh dim (gradients all-reduced there
                         * after the reduce_scatter); -1: none */
  int zero;             /* 3: FSDP (reshard after forward as each entry says); 2: never
                         * reshard after forward; 1: weights stay whole, only AdamW's
                         * state is sharded (dt_fsdp_reduce_grads, dt_fsdp_after_step) */
  dt_dtype param_dtype; /* the all-gathered copy's dtype (FSDP2's MixedPrecisionPolicy
                         * param_dtype; DT_BF16 rounds the copy, which is computed on in
                         * the model's dtype); DT_DTYPE_COUNT: the model's */
  dt_dtype reduce_dtype;/* the reduce_scatter's dtype; DT_DTYPE_COUNT: the model's */
  /* Fault injection for tests that must see the verification fail: the weight of
   * this module fqn ("" none) skips the reduction (each rank keeps its own chunk
   * of its partial gradient, as if the unit's reduce_scatter never ran for it). */
  char fault_no_reduce[64];
} dt_fsdp_opts;

/* Applies fully_shard entries (DT_STYLE_FULLY_SHARD: patterns, groups, "root") to
 * the model over the FSDP dims (shard_dim, cp_dim or both; at least one): every
 * weight goes to Shard(d) on each of them (nested, dp_shard outer), the units
 * gather their weights before their forward (one all_gather each) and
 * reduce-scatter their gradients in backward (one reduce_scatter each, plus one
 * all_reduce over replicate_dim for HSDP), on the FSDP dim's communicator or, with
 * both dims, on the flattened pair's (dt_mesh_flatten, named by joining the two
 * dim names: "dp_shard_cp"), as fsdp.c describes. d is 0, or 1 for a 2-D weight
 * whose dim 0 a mesh dim after the FSDP dims shards (TP after dp_shard, cp:
 * FSDP2's shard_placement_fn returning Shard(1)) and no later dim shards dim 1.
 * Collective over the model's root mesh when both dims are given (every rank
 * calls it). Call after dt_parallelize_module and before dt_model_materialize.
 * Every weight must fall in some unit. DT_ERR_INVALID naming the entry or module
 * otherwise (bad dims, cp_dim not shard_dim + 1, a weight no dim can be chosen
 * for); DT_ERR_UNSUPPORTED for ZeRO-1 with a dim-1 shard (AdamW's ZeRO-1 state is
 * a shard of rows). dt_model_free releases it. */
dt_status dt_fully_shard(dt_ctx *ctx, dt_model *m, const dt_plan_entry *entries, int n_entries,
                         const dt_fsdp_opts *o);
/* After backward, before the optimizer: ZeRO-1 all-reduces each unit's gradients
 * over the FSDP group (and over dp_replicate) in one call per unit and group; ZeRO-2/3 did
 * their reduction in backward (no-op). Phase "backward". */
dt_status dt_fsdp_reduce_grads(dt_ctx *ctx, dt_model *m);
/* After the optimizer step: ZeRO-1 all-gathers each unit's updated row shards
 * (AdamW updated only this rank's rows) into every rank's whole weights, one
 * call per unit; no-op otherwise. */
dt_status dt_fsdp_after_step(dt_ctx *ctx, dt_model *m);
/* Removes FSDP from the model (its state and hooks); no-op when not applied. */
void dt_fsdp_release(dt_ctx *ctx, dt_model *m);

/* FSDP inside pipeline stages (dt_pipeline_step calls these; no-ops on a model
 * without FSDP). As TorchTitan's apply_fsdp with pp (reshard_after_forward False)
 * and PyTorch's pipelining (stage.py backward_maybe_with_nosync, perform_reduce_grad):
 * between begin and end each unit gathers only its members on this rank's stages,
 * once, at the first forward that reaches it, into unsharded leaves kept for the
 * step; every microbatch's backward accumulates their gradients; a unit is
 * reduce-scattered (+ HSDP all_reduce) once, when every stage its members are on
 * has run its last backward (stage_done), and the result is added to the sharded
 * weights' gradients. A unit none of whose members is here is never gathered. Per
 * step and unit opened: one all_gather, one reduce_scatter (+ one all_reduce).
 * ZeRO-1: begin only records the members here, which dt_fsdp_reduce_grads and
 * dt_fsdp_after_step then reduce and gather (one call per unit with members here).
 * stage_of[i]: the stage of module i when this rank runs it, else -1. */
dt_status dt_fsdp_pipeline_begin(dt_ctx *ctx, dt_model *m, const int *stage_of);
/* After the last backward of `stage` on this rank: reduces the units now complete. */
dt_status dt_fsdp_pipeline_stage_done(dt_ctx *ctx, dt_model *m, int stage);
/* Ends the step: reduce true reduces any unit still open (false, after a failure:
 * nothing is communicated), then frees the unsharded leaves. */
dt_status dt_fsdp_pipeline_end(dt_ctx *ctx, dt_model *m, bool reduce);

#ifdef __cplusplus
}
#endif
#endif
