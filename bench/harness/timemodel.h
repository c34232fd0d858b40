/* bench/harness/timemodel.h: the predicted step of one config on a hardware
 * file, from its shape-only run (`run --device meta`: each role's compute
 * ledger rows and comm ledger rows) and its plan's overlap facts. It is an
 * analytic model over exact ledgers, not a simulator of kernels:
 *
 * - compute: each compute-ledger row at its cost (GEMMs at the hardware's
 *   efficiency for their shape, the rest at HBM bandwidth), recompute included;
 * - collectives: alpha-beta per ledger row over the links its mesh dim spans,
 *   the dims laid out on nodes in TorchTitan's rank order (tp innermost, then cp,
 *   dp_shard, dp_replicate, pp), so tp <= gpus_per_node stays in a node;
 * - overlap as each plan documents it (FSDP prefetch, DDP buckets, exposed TP
 *   unless async TP, the CP ring as its kernel posts it);
 * - pipeline: the schedule's per-rank action lists simulated with per-action
 *   times, so the bubble comes from the schedule.
 *
 * It prints nothing and stores nothing (bench/harness/plan.c and store.c do).
 */
#ifndef SB_TIMEMODEL_H
#define SB_TIMEMODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hardware.h"
#include "store.h"

/* What a run does beyond its ledgers, as far as time is concerned. */
typedef struct sb_tm_features {
  bool float8;          /* Float8 linears: fp8 GEMM peak plus the scaling kernels */
  bool compile;         /* torch.compile: fused pointwise kernels */
  bool async_tp;        /* TP collectives overlapped with the GEMMs they feed */
  int accum_steps;      /* microsteps per optimizer step the shape-only run stands for
                         * (it ran one; 0 or 1: one): all but the optimizer repeat */
} sb_tm_features;

/* The predicted step of one config, per GPU (the slowest role). */
typedef struct sb_prediction {
  double step_s;                 /* the whole step */
  double opt_s;                  /* of which once per step, not per microstep: the optimizer's
                                  * compute and its collectives (clipping's norm) */
  double compute_s;              /* forward + backward + optimizer compute, recompute excluded */
  double recompute_s;            /* the recompute phase's compute */
  double bubble_s;               /* pipeline idle time of the slowest rank (0 without pp) */
  double exposed_comm_s[SB_NDIMS]; /* collectives not hidden, per mesh dim (pp, dp_replicate,
                                    * dp_shard, cp, tp; a flattened dim's time goes to its
                                    * outermost member) */
  double comm_s[SB_NDIMS];       /* all collective time per dim, hidden or not */
  double tokens_per_s_per_gpu;
  double mfu;                    /* TorchTitan's flops per token (6 N + 12 L H Q T, no causal
                                  * halving) x tokens/s/GPU / the bf16 peak (Float8 runs too,
                                  * as TorchTitan); an f32 run over the f32 peak */
  double peak_bytes;             /* the worst role's peak + the allocator overhead + reserved */
  double mem_split[4];           /* params, grads, optimizer, activations (worst role) */
  bool fits;                     /* peak_bytes <= the hardware's HBM */
  double over_bytes;             /* peak_bytes - HBM when it does not fit */
  int worst_role;
} sb_prediction;

/* Predicts config o (its dims, batch, seq, dtype, plan, ac, global_batch) from
 * its shape-only result meta (status shape-only, roles filled) on hw with the
 * features f. 0, or -1 with a one-line reason in err. */
int sb_predict(const sb_hw *hw, const sb_opts *o, const sb_result *meta,
               const sb_tm_features *f, sb_prediction *p, char *err, size_t errn);

#endif
