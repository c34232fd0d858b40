/* lib/autograd/autograd.h: reverse-mode autograd over DTensor ops (a per-rank tape).
 *
 * A tape records the DTensor ops a rank runs (dt_ad_op: any op of lib/ops;
 * dt_ad_redistribute: a placement change) on variables (dt_var: a DTensor value
 * plus, after dt_backward, its gradient, itself a DTensor). dt_backward walks the
 * tape in reverse and calls each op's backward (written with dt_op_call, so the
 * gradients' sharding and communication are propagated like the forward's).
 *
 * Gradients stay in whatever placement the backward ops produce, Partial
 * included: contributions to a variable used several times are summed with the
 * add op, which keeps P + P as P with no communication, so a Partial gradient
 * is reduced once, when a consumer needs it reduced or when the user asks
 * (dt_var_grad_reduce). The tape flag eager_reduce instead all_reduces each
 * incoming Partial contribution to Replicate before accumulating it (PyTorch's
 * behaviour), one collective per use. Redistribute's backward is PyTorch's
 * (torch/distributed/tensor/_redistribute.py, Redistribute.backward): the
 * gradient goes from the target placements back to the source's, where a
 * Partial source dim becomes Replicate unless the gradient is itself Partial
 * there, so a gradient is never turned back into a pending reduction.
 *
 * Collectives: dt_ad_op, dt_ad_redistribute, dt_backward and dt_var_grad_reduce
 * may communicate, so every rank of the mesh calls them in the same order (SPMD).
 * During dt_backward and dt_var_grad_reduce the context's phase is "backward"
 * (ledger rows say so); the previous phase is restored after.
 *
 * Custom functions (dt_ad_custom, PyTorch's torch.autograd.Function): the
 * caller computes the outputs (any communication included) and gives a
 * backward callback; the tape records it like an op, with any number of
 * inputs and outputs. FSDP's parameter all-gather (whose backward is the
 * gradient reduce-scatter) is one.
 *
 * What it is not: no higher-order gradients (backward is not recorded), no
 * in-place ops, no hooks; a tape is used by one rank (one dt_ctx) only.
 */
#ifndef DT_AUTOGRAD_H
#define DT_AUTOGRAD_H

#include "../ops/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_tape dt_tape;
typedef struct dt_var dt_var;

/* Options of a tape (zero is the default). */
typedef struct dt_tape_opts {
  /* true: every Partial gradient contribution is redistributed to Replicate on
   * its Partial mesh dims (all_reduce) before it is accumulated (PyTorch). */
  bool eager_reduce;
} dt_tape_opts;

/* Creates an empty tape for this rank; opts may be NULL (defaults). Memory is
 * counted in ctx->mem. Errors: DT_ERR_INVALID (NULL), DT_ERR_NOMEM. */
dt_status dt_tape_create(dt_ctx *ctx, const dt_tape_opts *opts, dt_tape **out);
/* Frees the tape, every variable it made, their values and gradients. NULL is a
 * no-op. Variables and the tensors read from them are invalid afterwards. */
void dt_tape_free(dt_tape *t);

/* A leaf variable holding `value`, which is moved in: the tape owns its local
 * array afterwards and *value is zeroed (the caller must not free it). Returns
 * NULL on a NULL argument or no memory (the value is then freed, so it never
 * leaks; the reason is the ctx's last error). */
dt_var *dt_var_leaf(dt_tape *t, dt_tensor *value, bool requires_grad);

/* Runs op on the variables' values (dt_op_call) and makes op->n_out new
 * variables in out[0..n_out). When any input requires a gradient, the call is
 * recorded (op, a copy of attrs (NULL: zero attrs), inputs, outputs) and the
 * outputs require gradients. Errors: those of dt_op_call; DT_ERR_UNSUPPORTED
 * when a gradient is required and the op has no backward. On error out[] is
 * set to NULL and nothing is recorded. */
dt_status dt_ad_op(dt_tape *t, const dt_op *op, const dt_op_attrs *attrs, dt_var *const *in,
                   dt_var **out);

/* Redistributes x's value to dst (greedy planner) into a new variable *out,
 * recorded as described above (backward: Redistribute.backward's rule, above). */
dt_status dt_ad_redistribute(dt_tape *t, dt_var *x, const dt_placement *dst, dt_var **out);

/* A custom function's backward: the outputs' gradients gout[0..n_out) (NULL: that
 * output got none) into the inputs' gin[0..n_in) (gin[j] NULL: not needed; leave
 * gin[j]->mesh NULL for "no gradient"). state: what dt_ad_custom was given. */
typedef dt_status (*dt_ad_backward_fn)(dt_ctx *ctx, void *state, int n_out,
                                       const dt_tensor *const *gout, int n_in,
                                       dt_tensor *const *gin);
/* Records a custom function: outputs out[0..n_out) made from values[0..n_out)
 * (moved in, as dt_var_leaf does), computed by the caller from in[0..n_in). When
 * any input requires a gradient the outputs do too and backward is called in
 * dt_backward; state is borrowed (it must outlive the tape's backward). On error
 * nothing is recorded and every value is freed. */
dt_status dt_ad_custom(dt_tape *t, const char *name, dt_ad_backward_fn backward, void *state,
                       int n_in, dt_var *const *in, int n_out, dt_tensor *values, dt_var **out);

/* ---- activation checkpointing (torch.utils.checkpoint) ----
 *
 * A checkpointed region is the part of the tape recorded between
 * dt_tape_checkpoint_begin and dt_tape_checkpoint_end (a transformer block, as
 * TorchTitan's ptd_checkpoint_wrapper wraps one). At its end the values of the
 * region's recorded outputs are freed, except those the save policy keeps
 * (torch.utils.checkpoint's CheckpointPolicy.MUST_SAVE), the outputs of custom
 * functions (their forward is the caller's, so it cannot be re-run) and the
 * variables named as the region's outputs. The region's inputs (made before
 * it) are kept. In dt_backward, before the region's last node runs, the freed
 * values are recomputed: the region's recorded calls re-run in their forward
 * order with the same ops, attrs and inputs (so the same kernels, collectives
 * included, and bitwise the same values), with the context's phase
 * "recompute"; after the region's first node has run they are freed again.
 * Regions do not nest. A call after the region that reads a freed value is
 * DT_ERR_INVALID (only the named outputs leave a region). */

/* What a save policy sees of a call being recorded in a region. */
typedef struct dt_ad_call_info {
  const dt_op *op;              /* the op; NULL: a redistribute */
  int mesh_ndim;                /* redistribute: the source and target placements */
  const dt_placement *src, *dst;
} dt_ad_call_info;
/* true: keep the call's outputs (MUST_SAVE); false: recompute them. Called once
 * per recorded call, in forward order. */
typedef bool (*dt_ad_save_fn)(void *state, const dt_ad_call_info *call);

typedef struct dt_checkpoint_opts {
  dt_ad_save_fn save;           /* NULL: save nothing (full AC: the region keeps its inputs) */
  void *state;                  /* save's, borrowed for the region's recording */
  /* Test hook (a planted bug): k > 0 leaves the k-th recomputed call's outputs
   * zero instead of recomputing them; 0: off. */
  int fault_zero_call;
} dt_checkpoint_opts;

/* Opens a region on t (o NULL: full AC). DT_ERR_INVALID when one is open. */
dt_status dt_tape_checkpoint_begin(dt_tape *t, const dt_checkpoint_opts *o);
/* Closes the open region: frees what it does not keep (above); keep[0..n_keep)
 * are its outputs. DT_ERR_INVALID when none is open. */
dt_status dt_tape_checkpoint_end(dt_tape *t, int n_keep, dt_var *const *keep);
/* The bytes of the values the tape holds now (its variables' owned local
 * arrays), e.g. what a forward keeps for backward. */
size_t dt_tape_value_bytes(const dt_tape *t);

/* ---- lifetimes (what the program holds, what backward reads) ----
 *
 * A value stays on the tape until dt_tape_free unless the program releases it:
 * dt_var_release says the program holds v no more (PyTorch: its last Python
 * reference dropped), and the tape frees v's value as soon as nothing recorded
 * still to come reads it: the backward of a call that reads it (dt_op's
 * bwd_meta_in / bwd_meta_out say which values each op's backward reads, as
 * autograd's saved tensors), or the recompute of a checkpointed region. So a
 * released value is freed at once when no backward reads it, or right after the
 * last backward that does. Leaves and custom functions' outputs are never freed
 * this way (their memory is their owner's); a custom output that views an input
 * keeps that input while it lives. A dt_backward that needs a freed value again
 * (a second backward over released values) is DT_ERR_INVALID. */
void dt_var_release(dt_tape *t, dt_var *v);
/* The tape's variable count now, and: releases every variable made since mark
 * except keep[0..n_keep) (what a module made, less what it returns). */
size_t dt_tape_mark(const dt_tape *t);
void dt_tape_release_since(dt_tape *t, size_t mark, int n_keep, dt_var *const *keep);
/* dt_tape_value_bytes when the latest dt_backward began (what the forward left for
 * backward); 0 before any. */
size_t dt_tape_backward_start_bytes(const dt_tape *t);
/* The rank's memory peak record (host or device counters, ctx->mem: its bytes, where
 * it was reached, the noted bytes then) when the latest dt_backward began: the
 * forward's, since the last dt_mem_peak_restart; zero before any. */
void dt_tape_forward_peak_at(const dt_tape *t, bool device, dt_mem_peak_at *out);

/* Backpropagates from root. seed: the gradient of root (copied; same mesh and
 * global shape as root's value, any placements), or NULL: ones, with root's
 * placements where each Partial becomes Replicate. Gradients of leaves that
 * require them accumulate into their grad (a second dt_backward adds to them);
 * gradients of non-leaf variables are freed as soon as they are consumed (read
 * dt_var_grad of a leaf only). Forward values are kept until dt_tape_free,
 * except released ones (above). The recorded graph is kept, so a later
 * dt_backward may run again over values that were not released.
 * Errors: DT_ERR_INVALID (root not on this tape, seed shape/mesh mismatch),
 * DT_ERR_UNSUPPORTED (root does not require a gradient), those of the ops. */
dt_status dt_backward(dt_tape *t, dt_var *root, const dt_tensor *seed);

/* The value (borrowed, valid while the tape lives). */
const dt_tensor *dt_var_value(const dt_var *v);
/* The accumulated gradient (borrowed), NULL when there is none yet. It may be
 * Partial on some mesh dims (see dt_var_grad_reduce). */
const dt_tensor *dt_var_grad(const dt_var *v);
bool dt_var_requires_grad(const dt_var *v);
/* Redistributes the gradient's Partial mesh dims to Replicate in place (one
 * all_reduce per Partial dim, phase "backward"; no comm when none is Partial).
 * No gradient: DT_OK, nothing done. */
dt_status dt_var_grad_reduce(dt_tape *t, dt_var *v);
/* Replaces v's gradient by *g (moved in: *g is zeroed; same mesh and global shape
 * as v's value, any placements), or drops it when g is NULL (param.grad = ... /
 * None). t: the tape that made v. DT_ERR_INVALID (g freed) on a mismatch. */
dt_status dt_var_set_grad(dt_tape *t, dt_var *v, dt_tensor *g);
/* v's gradient is kept in dtype: each contribution is cast to it before it
 * accumulates (FSDP2's unsharded gradients, summed in the reduce dtype over a
 * pipeline's microbatches). */
void dt_var_accumulate_in(dt_var *v, dt_dtype dtype);
/* Drops every leaf's gradient (like optimizer.zero_grad(set_to_none=True)). */
void dt_tape_zero_grad(dt_tape *t);

#ifdef __cplusplus
}
#endif
#endif
