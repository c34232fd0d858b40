/* bench/harness/baselines.h: the analytic framework baselines of
 * /work/shared/reference/baselines.md ("baselines.md" below) as a C API, so that
 * `shardbench baselines`, run/sweep and the tests compute the same numbers.
 *
 * Units: communication is WIRE BYTES PER RANK PER STEP by the ring model the
 * ledger uses (baselines.md 0 and 5.1): all_reduce 2(n-1)/n * S, all_gather and
 * reduce_scatter (n-1)/n * S, S = the full tensor's bytes; so an analytic value
 * compares directly with the sum of dt_ledger_row.wire_bytes of one rank.
 * Memory is bytes per rank; bubble fractions are fractions of total step time.
 */
#ifndef SB_BASELINES_H
#define SB_BASELINES_H

#include <stdbool.h>
#include <stdint.h>

#include "nn/nn.h"

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
  char framework[24];     /* megatron-tp | megatron-tp-sp | zero1 | ... (schema.sql) */
  char quantity[40];      /* comm_bytes_per_step | memory_bytes_per_rank | ... */
  double value;
  char unit[16];          /* bytes | fraction | flop */
  char formula[192];      /* the formula and its baselines.md section */
} sb_baseline_row;

/* The whole-model TP communication of rank 0 per step, split by where it comes
 * from (wire bytes, ring model). Derivation in baselines.c (tp_terms). */
typedef enum sb_tp_kind {
  SB_TP_MEGATRON = 0,     /* plans/megatron-tp.plan: AR per sub-block, no SP */
  SB_TP_SP                /* plans/torchtitan-tp-sp.plan: AG/RS per sub-block (SP) */
} sb_tp_kind;

typedef struct sb_tp_terms {
  int layers;             /* transformer layers on the rank (L / pp) */
  double block_per_layer; /* one layer's matmul-block collectives, fwd + bwd */
  double blocks;          /* layers * block_per_layer */
  double boundary;        /* embedding output + final norm / output input, fwd + bwd */
  double logits;          /* logits all-gather (no loss parallel) */
  double loss;            /* loss-parallel cross-entropy all-reduces (f64 scalars) */
  double optimizer;       /* SP norm weights' gradient all-reduces */
  double total;           /* the sum of the five terms above */
  int n_ar, n_ag, n_rs;   /* collective calls per step */
} sb_tp_terms;

/* Fills *out for `kind` with or without loss parallel. Returns 0, or -1 for a
 * bad input (sizes < 1, a batch that the dp degree does not divide). */
int sb_baseline_tp_terms(const sb_baseline_in *in, sb_tp_kind kind, bool loss_parallel,
                         sb_tp_terms *out);

/* Every baseline for the config into rows[0..max); returns how many were
 * written (<= max), or -1 for a bad input. SB_BASELINE_MAX_ROWS is enough. */
enum { SB_BASELINE_MAX_ROWS = 64 };
int sb_baseline_compute(const sb_baseline_in *in, sb_baseline_row *rows, int max);

/* Checks the input: 0, or -1 with a one-line reason in err. */
int sb_baseline_check(const sb_baseline_in *in, char *err, size_t errn);

#endif
