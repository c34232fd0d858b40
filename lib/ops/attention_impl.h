/* lib/ops/attention_impl.h: what sdpa (attention.c) and sdpa_cp (attention_cp.c)
 * share; internal to lib/ops, not installed. */
#ifndef DT_ATTENTION_IMPL_H
#define DT_ATTENTION_IMPL_H

#include "device/kernels.h"
#include "ops/ops.h"

/* attrs.i0 of both: the layout of q, k, v and the output. */
enum { DT_ATTN_BHSD = 0, DT_ATTN_BSHD = 1 };

/* The heads dim and the sequence dim of a layout (a NULL: [b, h, s, hd]);
 * DT_ERR_INVALID naming `name` for another i0. */
dt_status dt_attn_layout(dt_ctx *ctx, const char *name, const dt_op_attrs *a, int *hdim, int *sdim);
/* The kernels of the device arrays of `kind` live on (dt_device_kernels), with
 * an attn group; DT_ERR_UNSUPPORTED naming `name` otherwise. kd is used where
 * it was filled (it may point into itself). */
dt_status dt_attn_kernels(dt_ctx *ctx, const char *name, dt_device_kind kind, dt_kdev *kd);
/* One GEMM on device d in dtype t (row-major, C = alpha op(A) op(B) + beta C). */
dt_status dt_attn_gemm(dt_device *d, dt_dtype t, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                       double alpha, const void *A, int64_t lda, const void *B, int64_t ldb,
                       double beta, void *C, int64_t ldc);
/* The compute-ledger row of one row-kernel call over the score blocks g (every
 * score of batch x rows x nk counted, the causal mask's zeros included: the
 * kernel visits them): `flops` and elements `reads` / `writes` per score, es
 * bytes each (the dtype the kernel runs in). */
static inline void dt_attn_rows_kledger(dt_device *d, const char *op, dt_dtype t,
                                        const dt_attn_rows *g, double flops, int reads,
                                        int writes) {
  dt_op_kledger(d->ctx, op, t, flops, g->batch * g->rows * g->nk, reads * g->batch * g->rows * g->nk,
                writes * g->batch * g->rows * g->nk);
}

/* The passes a block loop makes over its runs of one shape, n_outer outer
 * indices x group members (runs that differ only in their addresses): all of
 * them, or on a shape-only device (dt_kernels.shape_only) one of each, which
 * the compute ledger counts n_outer x group times. Returns the ledger's repeat
 * factor to set back after the loop (dt_kledger_set_repeat). */
static inline uint64_t dt_attn_passes(dt_ctx *ctx, const dt_kernels *k, int64_t *n_outer,
                                      int64_t *group) {
  if (!k->shape_only) return dt_kledger_of(ctx)->repeat; /* every pass runs: nothing to set */
  const uint64_t prev = dt_kledger_set_repeat(ctx, 1);
  dt_kledger_set_repeat(ctx, prev * (uint64_t)*n_outer * (uint64_t)*group);
  *n_outer = *n_outer > 0 ? 1 : 0;
  *group = *group > 0 ? 1 : 0;
  return prev;
}

/* out = x * 0 (a gradient of x's shape and placements that is all zeros). */
dt_status dt_attn_zeros_like(dt_ctx *ctx, const dt_tensor *x, dt_tensor *out);
/* Drops the candidates whose head shards N (the product of the mesh sizes sharding
 * dim hdim of input 0) do not divide both q's heads and k's (input 1's): only then
 * are a rank's query heads exactly those that read its kv heads. */
dt_status dt_attn_keep_head_splits(dt_ctx *ctx, const char *name, const dt_spec *in, int hdim,
                                   dt_candidate *cand, int *n);

#endif
