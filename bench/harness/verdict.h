/* bench/harness/verdict.h: checking a sharded training run against the unsharded one,
 * shared by `shardbench run` / `sweep` (bench/harness/run.c) and verify/test_parallel.c.
 *
 * The reference is the same model trained on a 1-rank mesh (same seed: the
 * weights are sharding-invariant; same token batches). What is compared, as
 * host f64 arrays of the global tensors (DTensor full_tensor()):
 *   every step's loss                      "loss step S"
 *   every step's every weight gradient,
 *     after the data-parallel reduce       "NAME grad step S"
 *   every weight after the last step       "NAME param after step S"
 *   every step's total gradient norm,
 *     when the run clips                   "grad_norm step S"
 * where NAME is the parameter's name as torch's named_parameters() spells it
 * ("layers.0.attention.wq.weight"). The error of a quantity is normwise,
 * max |got - ref| / max |ref|: rounding noise is relative to the tensor's scale,
 * so an element that is 0 up to rounding (AdamW's sign-like update of a tiny
 * gradient) does not blow up an elementwise ratio. Each quantity has its
 * tolerance (sb_tolerance, or sb_tolerance_params when FSDP computes with the
 * weights rounded to bf16: tighter before the first optimizer update than after
 * it); the verdict is ok when every quantity meets its own, and names the worst
 * quantity (the largest error / tolerance; NaN the worst of all) either way.
 *
 * Every rank compares its own gathered view with the reference, and the worst
 * over ranks is kept (sb_cmp_merge): a replica that diverged from the others
 * (a skipped reduce, a corrupted local shard) is caught even when rank 0's own
 * view is right.
 *
 * Memory: the reference keeps every step's gradients and the final weights as
 * doubles: 8 bytes x parameters x (steps + 1) (the 6-layer debugmodel, 6.2 M
 * parameters, 3 steps: 200 MB); the sharded side gathers one tensor at a time.
 *
 * Program code (bench/): functions return dt_status and never print.
 */
#ifndef SB_VERDICT_H
#define SB_VERDICT_H

#include <stdint.h>

#include "dtensor.h"

/* ---- token batches ---- */

/* Token ids of a step: a fixed LCG (Knuth's MMIX constants), so every rank and
 * the reference see the same batch. which 0: inputs, 1: targets. ids in [0, vocab). */
void sb_token_ids(int step, int which, int64_t n, int vocab, int64_t *ids);
/* The [batch, seq] i64 token tensor of (step, which) on mesh: Shard(0) on each mesh
 * dim in the bit mask dp_dims (the batch split over the data-parallel dims, nested
 * in mesh order as TorchTitan's flattened dp mesh; 0: none), Replicate elsewhere. */
dt_status sb_token_tensor(dt_ctx *ctx, dt_mesh *mesh, int batch, int seq, int vocab,
                          unsigned dp_dims, int step, int which, dt_tensor *out);
/* The same for a model with context parallel (dt_context_parallel): the sequence in
 * the model's storage order, Shard(1) on its cp dim (dt_cp_shard_sequence). */
dt_status sb_token_tensor_cp(dt_ctx *ctx, const dt_model *m, int batch, int seq, int vocab,
                             unsigned dp_dims, int step, int which, dt_tensor *out);

/* ---- gathering ---- */

/* The global value of t (any placements; Partial dims are reduced) as a malloc'd
 * f64 array of *n elements. Collective on t's mesh. */
dt_status sb_gather_f64(dt_ctx *ctx, const dt_tensor *t, double **out, int64_t *n);

/* ---- the normwise comparison ---- */

enum { SB_WORST_LEN = 160 };

/* The running verdict over compared quantities. Plain data (merged across ranks
 * by value). */
typedef struct sb_cmp {
  double worst_rel, worst_abs;   /* the worst quantity's errors */
  double worst_tol;              /* and its tolerance */
  double max_abs;                /* largest absolute error over all quantities */
  int64_t n, n_over;             /* quantities compared; over their tolerance */
  char worst[SB_WORST_LEN];      /* the worst quantity's name; "" before the first */
  dt_dtype param_dtype;          /* what the compared run computes its weights in (FSDP's
                                  * MixedPrecisionPolicy param_dtype): DT_BF16 selects
                                  * sb_tolerance_params' bf16 tier in sb_snap_*; set by the
                                  * caller after sb_cmp_init (DT_DTYPE_COUNT: the model's) */
} sb_cmp;

/* Clears c; param_dtype DT_DTYPE_COUNT. */
void sb_cmp_init(sb_cmp *c);
/* Compares got (n_got elements) with ref (n_ref) against relative tolerance tol
 * (> 0): abs = max |got - ref| (NaN when any difference is NaN), rel = abs /
 * max |ref|; an all-zero ref gives rel 0 when got is all zero and +inf
 * otherwise (no scale to be relative to); different lengths give abs = rel =
 * +inf and " (N elements, reference M)" after the name. The worst quantity is
 * the one with the largest rel / tol (NaN the worst of all; the first on ties).
 * Updates c and returns rel. */
double sb_cmp_add(sb_cmp *c, const char *what, const double *got, int64_t n_got,
                  const double *ref, int64_t n_ref, double tol);
/* True when every quantity met the tolerance (and at least one was compared). */
bool sb_cmp_ok(const sb_cmp *c);
/* Replaces every rank's c by the worst over the ranks of comm (the lowest rank
 * on ties; max_abs the max over ranks). Collective on comm. */
dt_status sb_cmp_merge(dt_comm *comm, sb_cmp *c);

/* The relative tolerance of a quantity of a sharded run in dtype (f32 or f64)
 * against the reference: before any optimizer update (step 0's loss and
 * gradients) or after one (later steps, the final weights). The derivation and
 * the measured spreads are next to the numbers, in verdict.c. */
double sb_tolerance(dt_dtype dtype, bool after_update);
/* The same for a run whose weights are rounded to param_dtype before every use
 * (FSDP's mixed precision) while its model, master weights and reference stay
 * in dtype: the bf16 rounding's own tiers when param_dtype is DT_BF16, f32's
 * when it is DT_F32, else sb_tolerance(dtype, after_update) (DT_DTYPE_COUNT:
 * the model's). */
double sb_tolerance_params(dt_dtype dtype, dt_dtype param_dtype, bool after_update);

/* ---- what a run computed ---- */

enum { SB_PARAM_NAME_LEN = 80 };

/* One run's check data as host f64 global arrays (the reference keeps one). */
typedef struct sb_snap {
  int n_steps, n_mods;
  char (*name)[SB_PARAM_NAME_LEN]; /* per module: "FQN.weight"; "" = no weight */
  int64_t *numel;                  /* per module: the weight's element count */
  double *loss;                    /* [n_steps] */
  double *grad_norm;               /* [n_steps]: clip_grad_norm_'s total norm (runs that clip) */
  double **grad;                   /* [n_steps * n_mods]: step s, module i at s * n_mods + i */
  double **param;                  /* [n_mods]: the weights after the last step */
} sb_snap;

/* Sizes s for m (its modules and names) and n_steps steps; nothing gathered yet. */
dt_status sb_snap_init(dt_ctx *ctx, const dt_model *m, int n_steps, sb_snap *s);
void sb_snap_free(sb_snap *s);

/* A step's check data, after backward (and the data-parallel reduce), before the
 * optimizer: the loss and every weight gradient, gathered. Stored into rec when
 * rec != NULL (the reference); compared with ref into c when ref != NULL. Every
 * rank of m's mesh calls it (collective); every rank compares its own view. */
dt_status sb_snap_step(dt_ctx *ctx, const dt_model *m, const dt_var *loss, int step, sb_snap *rec,
                       const sb_snap *ref, sb_cmp *c);
/* A step's total gradient norm (clip_grad_norm_'s, before the scale): kept in rec
 * (the reference), compared with ref's into c (the gradients' tolerance). Local. */
void sb_snap_norm(const dt_model *m, int step, double norm, sb_snap *rec, const sb_snap *ref,
                  sb_cmp *c);
/* The weights after the last step (step: that step's index, for the names), as
 * above. */
dt_status sb_snap_params(dt_ctx *ctx, const dt_model *m, int step, sb_snap *rec,
                         const sb_snap *ref, sb_cmp *c);

#endif
