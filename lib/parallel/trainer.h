/* lib/parallel/trainer.h: TorchTitan's composition and training step as a library API.
 *
 *   dt_parallel_dims   the mesh from the five degrees (torchtitan/distributed/
 *                      parallel_dims.py ParallelDims), with its flattened dims
 *                      (dp, dp_shard_cp, dp_cp) as masks of mesh dims;
 *   dt_parallel_plan   a plan file fitted to the degrees and resolved against the
 *                      model once (the entries each part applies, the settings);
 *   dt_parallelize_llama  TP/SP, CP, FSDP/HSDP on a created model
 *                      (torchtitan/models/llama3/infra/parallelize.py
 *                      parallelize_llama; DDP is the step's reduction);
 *   dt_pipeline_llm    the stage split and the lowered schedule
 *                      (torchtitan/distributed/pipeline_parallel.py pipeline_llm);
 *   dt_trainer         a parallelized Llama and its training step (torchtitan/train.py
 *                      Trainer.train_step, forward_backward_step): the batch placed
 *                      or cut into microbatches, the forward/backward or the pipeline
 *                      schedule, the data-parallel reductions, AdamW.
 * Not here: checking the results, timing several steps, storing them (programs do).
 */
#ifndef DT_TRAINER_H
#define DT_TRAINER_H

#include "parallel.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- ParallelDims: lib/parallel/parallel_dims.c ---- */

/* The five degrees, in TorchTitan's mesh order. */
typedef enum dt_pdim {
  DT_PDIM_PP = 0, DT_PDIM_DP_REPLICATE, DT_PDIM_DP_SHARD, DT_PDIM_CP, DT_PDIM_TP, DT_PDIM_COUNT
} dt_pdim;

/* "pp", "dp_replicate", "dp_shard", "cp", "tp"; NULL past DT_PDIM_COUNT. */
const char *dt_pdim_name(int d);

typedef struct dt_parallel_dims {
  int degree[DT_PDIM_COUNT];    /* pp, dp_replicate, dp_shard, cp, tp (each >= 1) */
  int world_size;               /* their product */
  /* the mesh: the degrees > 1 in TorchTitan's order, but for FSDP + TP without cp
   * (tp_before_dp_shard), where tp comes before dp_shard, so that FSDP shards TP's
   * local blocks (lib/parallel/fsdp.c); the same groups as TorchTitan's mesh, the
   * ranks permuted (dt_parallel_dims_rank_index). World 1: one dim "tp" of size 1. */
  int ndim;
  int shape[DT_PDIM_COUNT];
  char names[DT_PDIM_COUNT][DT_MESH_NAME_LEN];
  int dim[DT_PDIM_COUNT];       /* the mesh dim of each degree; -1: not in the mesh */
  bool tp_before_dp_shard;
  /* TorchTitan's flattened dims, as bit masks of mesh dims (bit d: mesh dim d):
   * dp = dp_replicate x dp_shard (the batch), dp_shard_cp = dp_shard x cp (FSDP),
   * dp_cp = dp_replicate x cp (DDP's all-reduce, the loss) */
  unsigned dp, dp_shard_cp, dp_cp;
} dt_parallel_dims;

/* Fills d from the degrees (pp, dp_replicate, dp_shard, cp, tp) and the world size.
 * DT_ERR_INVALID when a degree is < 1 or their product is not world_size. */
dt_status dt_parallel_dims_init(dt_ctx *ctx, const int degree[DT_PDIM_COUNT], int world_size,
                                dt_parallel_dims *d);
/* The index of world rank `rank` in d's mesh: the rank itself in TorchTitan's order;
 * with tp_before_dp_shard, its place when the last two dims (dp_shard, tp) are
 * swapped (TorchTitan's rank = ... + s * tp + t becomes ... + t * dp_shard + s). */
int dt_parallel_dims_rank_index(const dt_parallel_dims *d, int rank);
/* The mesh of d over ctx's world (ctx->world of d->world_size ranks). *perm: the
 * permuted world communicator behind it (tp_before_dp_shard; else NULL), to be
 * destroyed after the mesh (dt_parallel_dims_free_mesh). Collective over the world. */
dt_status dt_parallel_dims_build_mesh(dt_ctx *ctx, const dt_parallel_dims *d, dt_mesh **mesh,
                                      dt_comm **perm);
void dt_parallel_dims_free_mesh(dt_mesh *mesh, dt_comm *perm);

/* The distinct roles of a job's ranks, for shape-only runs (one rank per role):
 * ranks whose stages, shards and partners' sizes are the same do the same
 * allocations, kernels and collectives. Two ranks share a role when they have
 * the same pp coordinate, the same tp coordinate when tp does not divide all the
 * sizes it cuts (heads, kv heads, the FFN hidden size, vocab, dim and the
 * sequence it shards), the same cp coordinate when cp does not divide the
 * sequence in 2 cp load-balanced chunks, and the same shard sizes: torch.chunk's
 * cut, nested over dp_shard x cp, of each size of a TP-local weight FSDP may
 * shard, and over dp_replicate x dp_shard of the batch (FSDP pads its
 * collectives to the largest shard, so equal sizes make equal work). (A
 * conservative rule: ranks it puts apart may still behave alike.) role_of[r]
 * (world entries) gets the role of world rank r, roles numbered by their lowest
 * rank; returns the number of roles, or -1 when out of memory. */
int dt_parallel_dims_roles(const dt_parallel_dims *d, const dt_llama_config *cfg, int batch,
                           int seq, int *role_of);

/* ---- a resolved plan: lib/parallel/parallelize_llama.c ---- */

/* A plan fitted to the degrees and resolved against the model, once per config;
 * what every user of a plan reads (plain data). */
typedef struct dt_parallel_plan {
  dt_plan plan;                 /* the parsed plan, its dim sizes the degrees' */
  int degree[DT_PDIM_COUNT];
  bool tp;                      /* [tp] entries apply (tp > 1) */
  bool fsdp;                    /* fully_shard entries apply (dp_shard x cp > 1) */
  bool pp;                      /* a pipeline (pp > 1) */
  int n_tp, n_fsdp;             /* the entries on [tp] and the fully_shard ones, in file order */
  dt_plan_entry tp_entries[DT_PLAN_MAX_ENTRIES];
  dt_plan_entry fsdp_entries[DT_PLAN_MAX_ENTRIES];
  int n_microbatches;           /* pp: each data-parallel rank's batch over the microbatch size */
  bool resolved;                /* dt_plan_resolve accepted it (set also when a later check
                                 * refuses the config: the plan's settings are then valid) */
} dt_parallel_plan;

/* Fits plan p to the degrees and resolves it (dt_plan_resolve) against cfg_whole
 * (the model the plan is written for; a single-layer model is resolved as its whole
 * layer) at batch x seq, into out. What TorchTitan would not apply, or this runtime
 * cannot, is DT_ERR_UNSUPPORTED with the reason as the ctx's error (one line, after
 * "dt_parallel_plan_resolve: "; dt_plan_resolve's own errors pass through as they
 * are): entries on dims other than [tp] and [dp_shard], a degree > 1
 * the plan has no dim for (dp_replicate excepted: DDP), a plan dim fixed to another
 * size, [tp] entries with tp = 1, a pp dim with pp = 1, fully_shard entries with
 * dp_shard x cp = 1, dp_shard > 1 without fully_shard entries, what dt_plan_resolve
 * refuses, a batch not divisible by dp_replicate, and with pp > 1: a
 * reshard_after_forward=True unit, a batch the microbatches do not divide, a schedule
 * or split that does not fit (dt_pipeline_llm). */
dt_status dt_parallel_plan_resolve(dt_ctx *ctx, const dt_plan *p, const int degree[DT_PDIM_COUNT],
                                   const dt_llama_config *cfg_whole, int batch, int seq,
                                   dt_parallel_plan *out);

/* Test hook: a module fqn ("" none) whose FSDP unit skips its weight's reduction
 * (dt_fsdp_opts.fault_no_reduce). */
typedef struct dt_parallelize_opts {
  char fault_no_reduce[64];
} dt_parallelize_opts;

/* parallelize_llama: applies plan pp (NULL: nothing) to the created model m on the
 * mesh of dims, as TorchTitan composes them: the [tp] entries on the tp dim
 * (dt_parallelize_module; TP/SP and loss parallel), context parallel on the cp dim
 * (dt_context_parallel with the plan's rotate method and load balancing), then the
 * fully_shard entries over dp_shard x cp (dt_fully_shard: FSDP2, HSDP's replicas on
 * dp_replicate, the plan's ZeRO stage and mixed precision). Entries matching no
 * module of m (a single-layer model) are left out. DDP is not a wrapper here: the
 * training step all-reduces over dp_cp (dt_trainer). Before dt_model_materialize.
 * Collective over m's mesh. o may be NULL. */
dt_status dt_parallelize_llama(dt_ctx *ctx, dt_model *m, const dt_parallel_dims *dims,
                               const dt_parallel_plan *pp, const dt_parallelize_opts *o);

/* ---- pipeline_llm: lib/parallel/pipeline_llm.c ---- */

/* The stages and the schedule of a pipelined run. */
typedef struct dt_pipeline {
  dt_pp_layout layout;          /* which modules each stage holds */
  dt_pp_schedule schedule;      /* lowered; the same on every rank */
  int n_microbatches;
} dt_pipeline;

/* pipeline_llm: the plan's schedule over pp ranks with m microbatches (generated,
 * one stage per rank and two for Interleaved1F1B, TorchTitan's defaults, or the
 * plan's CSV, relative to the plan file) and its stage split of n_layers layers
 * (module_fqns_per_model_part, or generate_llm_fqn_per_model_part with the embedding
 * and the head counted as first_less / last_less layers). DT_ERR_INVALID naming the
 * plan file:line for a split that does not fit the schedule. Local, no comm.
 * Free with dt_pipeline_free. */
dt_status dt_pipeline_llm(dt_ctx *ctx, const dt_plan *plan, int n_layers, int pp, int m,
                          dt_pipeline *out);
void dt_pipeline_free(dt_ctx *ctx, dt_pipeline *p);

/* ---- clip_grad_norm_: lib/parallel/clip_grad.c ---- */

/* Gradient-norm clipping (TorchTitan's training.max_norm; torchtitan/distributed/
 * utils.py clip_grad_norm_). The test switches make the norm wrong on purpose
 * (never set them in normal use). */
typedef struct dt_clip_opts {
  double max_norm;              /* > 0: clip to it; <= 0 (dt_trainer): no clipping */
  double norm_type;             /* 2 (0 reads as 2) or INFINITY */
  char fault_count_replicated[64]; /* TEST SWITCH: a module fqn whose gradient is summed
                                 * over the mesh dims it is Replicate on as if sharded
                                 * there (counted once per rank of them) */
  int fault_drop_pp_rank;       /* TEST SWITCH: 1 + the pp coordinate whose stages'
                                 * norm is left out of the pp reduction; 0: none */
} dt_clip_opts;

/* clip_grad_norm_ on m's gradients: *total the norm over every parameter however
 * placed (each gradient first reduced to its weight's placements as AdamW would,
 * and kept so); a Shard mesh dim's partial sums reduced over it, a Replicate dim
 * counted once, the stages over pp_dim (-1: no pp) by an all_reduce of norm^2
 * (max for inf); then every gradient scaled by max_norm / (total + 1e-6) when
 * that is below 1. Collectives: one all_reduce (f64) per mesh dim other than
 * pp_dim on which some gradient is Shard, of one element per set of shard dims
 * containing it, then one over pp_dim; in the context's phase. DT_ERR_INVALID for
 * max_norm <= 0, DT_ERR_UNSUPPORTED for a norm_type other than 2 and inf.
 * Collective over m's mesh. */
dt_status dt_clip_grad_norm(dt_ctx *ctx, dt_model *m, int pp_dim, const dt_clip_opts *o,
                            double *total);

/* ---- the learning-rate schedule: lib/parallel/lr_schedule.c ---- */

typedef enum dt_lr_decay { DT_LR_LINEAR = 0, DT_LR_SQRT, DT_LR_COSINE } dt_lr_decay;

/* TorchTitan's lr_scheduler (torchtitan/components/lr_scheduler.py
 * build_lr_schedulers, linear_warmup_stable_decay: a LambdaLR factor of the base lr). */
typedef struct dt_lr_schedule {
  int training_steps;           /* training.steps; 0: no schedule (the factor is 1) */
  int warmup_steps;             /* lr_scheduler.warmup_steps (>= 0) */
  bool has_decay_ratio;         /* lr_scheduler.decay_ratio given (else None: the decay
                                 * takes every step after the warm-up) */
  double decay_ratio;           /* in [0, 1] */
  dt_lr_decay decay_type;       /* lr_scheduler.decay_type */
  double min_lr_factor;         /* lr_scheduler.min_lr_factor, in [0, 1] */
} dt_lr_schedule;

/* The lr factor of the 0-based step `step` (the LambdaLR's value when that step's
 * optimizer runs): warm-up steps clamped to training_steps, decay steps
 * round(training_steps x decay_ratio) clamped to what the warm-up leaves, one
 * virtual stable step at the end (TorchTitan's: the lr never reaches 0). */
double dt_lr_factor(const dt_lr_schedule *s, int step);
/* "linear", "sqrt", "cosine" -> *out; false for another name. */
bool dt_lr_decay_parse(const char *name, dt_lr_decay *out);

/* ---- the Trainer: lib/parallel/trainer.c ---- */

typedef struct dt_trainer dt_trainer;

/* Calls into the program at fixed points of a step (each may be NULL; user is
 * passed back). inputs/forward_loss replace the model's own input and loss (a
 * program that trains one layer on its own input and loss, no pipeline):
 *   inputs        before the step's barrier, with the ledger off: make the step's
 *                 inputs (they count in the step's memory);
 *   forward_loss  in the timed step, after the phase is "forward": forward and loss
 *                 on m->step_tape into *loss;
 *   free_inputs   after the step's reductions;
 *   after_init    after the weights are made (and loaded), before a pipelined rank
 *                 frees the other stages' weights (e.g. to save them whole);
 *   before_ddp    before DDP's all-reduce over dp_cp (not under FSDP);
 *   after_reduce  after every data-parallel reduction, before the optimizer. */
typedef struct dt_trainer_hooks {
  dt_status (*inputs)(dt_ctx *ctx, dt_trainer *t, int step, void *user);
  dt_status (*forward_loss)(dt_ctx *ctx, dt_trainer *t, int step, void *user, dt_var **loss);
  void (*free_inputs)(dt_ctx *ctx, dt_trainer *t, void *user);
  dt_status (*after_init)(dt_ctx *ctx, dt_trainer *t, void *user);
  void (*before_ddp)(dt_ctx *ctx, dt_trainer *t, void *user);
  void (*after_reduce)(dt_ctx *ctx, dt_trainer *t, void *user);
  void *user;
} dt_trainer_hooks;

typedef struct dt_trainer_opts {
  dt_dtype dtype;               /* the model's parameters and activations */
  uint64_t seed;                /* the weights' (sharding-invariant) */
  int batch, seq;               /* the global batch */
  dt_adamw adamw;               /* DT_ADAMW_DEFAULT is TorchTitan's debugmodel recipe */
  const char *load_weights;     /* a weights file to start from; NULL or "": none */
  bool device_memory;           /* the step record's memory from the ctx's device
                                 * counters (mem.dev_*), else the host's */
  dt_parallelize_opts parallelize;
  dt_trainer_hooks hooks;
  /* activation checkpointing of the blocks (nn.h dt_ac_config; zero: none): the
   * program's choice, e.g. the plan's activation_checkpoint_mode (dt_plan.ac) or
   * its override */
  dt_ac_config ac;
  dt_clip_opts clip;            /* clip.max_norm > 0: clip_grad_norm_ before AdamW */
  dt_lr_schedule lr_schedule;   /* training_steps > 0: adamw.lr times dt_lr_factor */
  int grad_accum_steps;         /* > 1: gradient accumulation, TorchTitan's
                                 * global_batch_size / (local_batch_size x dp): a
                                 * step's tokens and targets hold grad_accum_steps x
                                 * batch rows, microstep a its rows [a batch, (a + 1)
                                 * batch), each placed and reduced as a step's batch
                                 * (under pp: one pipeline step each, its microbatches
                                 * the schedule's) */
} dt_trainer_opts;

/* What one step did on this rank. */
typedef struct dt_trainer_step {
  double loss;                  /* dt_trainer_train_step: the step's loss (every rank) */
  double forward_backward_s;    /* forward, loss, backward and the reductions */
  double optimizer_s;           /* clipping, AdamW, ZeRO-1's gather, the end of the step */
  double grad_norm;             /* the total gradient norm before clipping (every rank);
                                 * NaN without clipping */
  double lr;                    /* the lr AdamW stepped with */
  /* memory (this rank, the counters opts.device_memory names): after the step the
   * parameters and AdamW's state, the gradients after backward (as
   * dt_model_state_bytes), and the activations: the peak the forward reached (when
   * the last backward began) above what the rank held when the step began, less the
   * parameters' gradients made by then: what the forward kept for backward, FSDP's
   * gathered parameters, buffers. The tape frees activations as backward consumes
   * them, so the step's peak may lie later (the loss's backward, the optimizer) */
  int64_t mem_params, mem_grads, mem_optimizer, mem_activations;
  size_t peak_bytes;            /* the step's peak (the forward_backward half's and the
                                 * optimizer's, not what ran between them) */
  size_t reserved_peak_bytes;   /* the same halves' peak of what the device's caching
                                 * allocator held (dt_mem_stats.dev_reserved_peak: the
                                 * meta device's model of PyTorch's); 0 where none */
  dt_mem_peak_at peak_at;       /* where in the step it was reached (phase, module scope)
                                 * and what of it FSDP's unsharded parameters and the
                                 * collectives' flat buffers held (dt_mem_note) */
  /* a pipelined step: this rank's actions as they ran (borrowed, valid until the
   * next step), its pp coordinate, its pipeline (its coordinates off the pp dim),
   * the step's zero (dt_now after the barrier before the schedule) and the step's
   * peak above its start */
  int n_events;
  const dt_pp_event *events;
  int pp_rank, pipe_id;
  double zero;
  int64_t pp_peak_bytes;
} dt_trainer_step;

/* A training job on this rank, collective over ctx's world: the mesh of dims
 * (dt_parallel_dims_build_mesh), the Llama of cfg in opts->dtype with weights from
 * opts->seed, parallelized by plan (dt_parallelize_llama; NULL: none, every degree
 * must then be 1) and materialized, the pipeline (plan->pp: dt_pipeline_llm; the
 * rank then frees the weights of the stages it does not hold, and the memory peak
 * restarts). DT_ERR_INVALID when plan was resolved for other degrees than dims';
 * otherwise the failing call's status. Nothing is left allocated on failure. */
dt_status dt_trainer_create(dt_ctx *ctx, const dt_llama_config *cfg, const dt_parallel_dims *dims,
                            const dt_parallel_plan *plan, const dt_trainer_opts *opts,
                            dt_trainer **out);
void dt_trainer_free(dt_ctx *ctx, dt_trainer *t);

/* What a program reads (borrowed). */
dt_model *dt_trainer_model(const dt_trainer *t);
dt_mesh *dt_trainer_mesh(const dt_trainer *t);
const dt_parallel_dims *dt_trainer_dims(const dt_trainer *t);
const dt_parallel_plan *dt_trainer_plan(const dt_trainer *t); /* NULL: none */
const dt_pipeline *dt_trainer_pipeline(const dt_trainer *t);  /* NULL: no pp */

/* The first half of a step (forward_backward_step and the reductions): the global
 * batch's token ids and targets (host [batch, seq] i64, the same on every rank;
 * read unless hooks.inputs is given) placed as Shard(0) on dp (the batch dims),
 * Shard(1) on cp in the model's storage order, or cut into the pipeline's
 * microbatches (each data-parallel rank's k-th chunk of its local batch,
 * split_args_kwargs_into_chunks); a barrier; the forward, loss and backward (the
 * pipeline schedule, each microbatch's loss scaled by 1/m); ZeRO-1's gradient
 * all-reduce, or DDP's over dp_cp when FSDP does not apply. The ledger records
 * this part when record is true (phases forward / backward), never the input
 * placement. *loss: the loss on the step tape (NULL under pp: the schedule keeps
 * it; dt_trainer_share_stages makes one); it lives until dt_trainer_optimizer_step.
 * rec (may be NULL) gets the times and, under pp, the events (of the last pipeline
 * step). With opts.grad_accum_steps = k > 1, tokens and targets hold k x batch rows:
 * k microsteps, each placed, run with its loss scaled by 1 / k and reduced as
 * above, the graph dropped between them; *loss is then a leaf holding the step's
 * loss (the sum of the scaled ones). Under pp each microstep is a pipeline step
 * (dt_pipeline_step_accum) and the schedule keeps the summed loss. */
dt_status dt_trainer_forward_backward(dt_ctx *ctx, dt_trainer *t, int step, const int64_t *tokens,
                                      const int64_t *targets, bool record, dt_var **loss,
                                      dt_trainer_step *rec);
/* The second half: clip_grad_norm_ when opts.clip.max_norm > 0 (over every
 * parameter, the stages combined over pp), AdamW (each pp rank its stages') at
 * the schedule's lr for this optimizer step, ZeRO-1's all-gather of the
 * updated rows, the end of the step (the tape freed); rec: the optimizer's time and
 * the step's memory split (the same rec as the first half's). */
dt_status dt_trainer_optimizer_step(dt_ctx *ctx, dt_trainer *t, bool record, dt_trainer_step *rec);
/* Both halves (Trainer.train_step), with rec->loss read between them (a collective
 * with the ledger off). */
dt_status dt_trainer_train_step(dt_ctx *ctx, dt_trainer *t, int step, const int64_t *tokens,
                                const int64_t *targets, dt_trainer_step *rec);

/* For checks between the halves or after a step, under pp: every pp rank's copy of
 * each weight's gradient (grads true; *loss then a variable holding the step's
 * loss, broadcast from the last stage's rank) or value (grads false) made its
 * owner's (dt_pipeline_share); dt_trainer_unshare_stages frees the other stages'
 * again, and that loss variable. Without pp: *loss the step's loss variable as given, no comm.
 * Collective over the pp group. loss may be NULL with grads false. */
dt_status dt_trainer_share_stages(dt_ctx *ctx, dt_trainer *t, bool grads, dt_var *step_loss,
                                  dt_var **loss);
dt_status dt_trainer_unshare_stages(dt_ctx *ctx, dt_trainer *t);

/* The step loss's value (a full_tensor of the 0-d loss; under pp the schedule's
 * sum, broadcast from the last stage's rank). Collective; the ledger off. */
dt_status dt_trainer_loss_value(dt_ctx *ctx, dt_trainer *t, const dt_var *loss, double *out);

#ifdef __cplusplus
}
#endif
#endif
