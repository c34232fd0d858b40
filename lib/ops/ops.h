/* lib/ops/ops.h: the op registry and sharding propagation, after PyTorch's
 * torch/distributed/tensor/_sharding_prop.py (ShardingPropagator) and
 * _dispatch.py (OpDispatcher), with the op strategies of its _ops package.
 *
 * An op is a const table: shape inference, a strategy generator (per mesh dim
 * options, expanded over the whole mesh like PyTorch's
 * expand_to_full_mesh_op_strategy, or a whole-mesh candidate list), a local
 * kernel (the device's slots, below) and a backward written with other DTensor ops,
 * so that backward communication is propagated the same way.
 *
 * dt_op_call dispatches: it lists the candidates, drops those whose inputs are
 * not shardable, prices each by the redistribute cost of its inputs (the
 * alpha-beta model of dtensor.h; ties go to generation order, as PyTorch's
 * _select_strategy keeps the first minimum), redistributes the inputs, allocates
 * the outputs, runs the kernel and wraps them. Decisions are cached per rank
 * (op, attrs, input specs). This layer does no autograd (lib/autograd does).
 */
#ifndef DT_OPS_H
#define DT_OPS_H

#include "../device/device.h"
#include "../device/kernels.h"
#include "../dtensor/dtensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A DTensor's description without data. */
typedef struct dt_spec {
  int mesh_ndim;
  dt_placement pl[DT_MAX_MESH_DIMS];
  /* Sizes of the mesh dims (dt_tensor_spec fills them; dt_op_plan overwrites
   * them from its mesh_shape, so strategies may read them: num_shards of the
   * pointwise follow rule, evenness for mean). */
  int mesh_shape[DT_MAX_MESH_DIMS];
  int ndim;
  int64_t gshape[DT_MAX_DIMS];
  dt_dtype dtype;
} dt_spec;

void dt_tensor_spec(const dt_tensor *t, dt_spec *out);
/* Bytes of the global tensor a spec describes. */
double dt_spec_bytes(const dt_spec *s);

enum {
  DT_OP_MAX_IN = 6,  /* sdpa_cp's backward: q, k, v, out, lse, dout */
  DT_OP_MAX_OUT = 3, /* sdpa's backward: dq, dk, dv */
  DT_OP_MAX_OPTIONS = 32,      /* per mesh dim */
  DT_OP_MAX_CANDIDATES = 4096  /* whole mesh, after expansion */
};

/* Static arguments of an op call; each op documents the fields it reads. All
 * fields take part in the dispatch cache key, so zero what an op does not use
 * (use DT_OP_ATTRS_INIT). */
typedef struct dt_op_attrs {
  double scalar;               /* scale factor, eps, ... */
  int dim;                     /* softmax / reduction / gather dim */
  int ndims;
  int dims[DT_MAX_DIMS];       /* reduction dims, permutation */
  int shape_n;
  int64_t shape[DT_MAX_DIMS];  /* view / reshape target (-1 infers one dim) */
  bool keepdim;
  int i0, i1, i2;              /* op-specific integers (documented by the op) */
  char eq[32];                 /* einsum equation "mk,kn->mn" */
} dt_op_attrs;
#define DT_OP_ATTRS_INIT {0}

/* Placements of one mesh dim: outputs, then inputs. */
typedef struct dt_dim_option {
  dt_placement out[DT_OP_MAX_OUT];
  dt_placement in[DT_OP_MAX_IN];
} dt_dim_option;

/* A whole-mesh candidate: placements per output / input per mesh dim. */
typedef struct dt_candidate {
  dt_placement out[DT_OP_MAX_OUT][DT_MAX_MESH_DIMS];
  dt_placement in[DT_OP_MAX_IN][DT_MAX_MESH_DIMS];
  double cost_us;              /* filled by the dispatcher */
} dt_candidate;

typedef struct dt_op dt_op;
struct dt_op {
  const char *name;
  int n_in, n_out;
  /* PyTorch's mm-like ops check every input for shardability, even one that is
   * already in place ([3,4] S(0) on 4 ranks makes mm replicate); other ops
   * check only inputs that would move (expand_to_full_mesh_op_strategy). */
  bool strict_inputs;
  /* Output global shapes and dtypes from the inputs' specs (placements of
   * out[] are ignored). Errors: DT_ERR_INVALID with a message. */
  dt_status (*infer)(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in, dt_spec *out);
  /* Either: options for one mesh dim in generation order (expanded over the
   * mesh by the dispatcher, mesh dim 0 varying slowest) ... */
  dt_status (*options)(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in, const dt_spec *out,
                       int mesh_dim, dt_dim_option *opt, int *n, int max);
  /* ... or whole-mesh candidates directly (e.g. pointwise "follow" rules). */
  dt_status (*candidates)(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in,
                          const dt_spec *out, dt_candidate *cand, int *n, int max);
  /* Fills the outputs' local arrays (already allocated for the chosen
   * placements) from the inputs' locals (already redistributed). */
  dt_status (*kernel)(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                      dt_tensor *const *out);
  /* Gradients of the inputs from those of the outputs, with DTensor ops
   * (dt_op_call), so that backward is propagated like forward. gin[i] == NULL:
   * that gradient is not needed. gout[j] may be NULL (no gradient: zero). */
  dt_status (*backward)(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                        const dt_tensor *const *out, const dt_tensor *const *gout,
                        dt_tensor *const *gin);
  /* What backward reads of the values (the tape keeps those for it, as autograd
   * keeps an op's saved tensors): bit j of bwd_meta_in (bwd_meta_out) set: input
   * (output) j is read for its metadata only (shape, placements, dtype), so its
   * data may be freed before the backward runs. Zero: every value is read. */
  unsigned bwd_meta_in, bwd_meta_out;
};

/* Kernels: every device has a table (lib/device/kernels.h; the CPU's host loops
 * are dt_kernels_cpu), and an op's kernel has one path: it takes the table of
 * the device its arrays live on and calls the slot, with no host/device branch
 * of its own:
 *   dt_kdev kd;   (filled in place, never copied)
 *   DT_CHECK(dt_device_kernels(ctx, y->dev, "silu", &kd));
 *   DT_OP_KSLOT(ctx, "silu", kd.k->pw, silu);
 *   return kd.k->pw->silu(kd.dev, ...);
 * GEMM, fill and axpy go to the same device (dt_device_gemm(kd.dev, ...)). The
 * dispatcher hands a kernel bf16 operands as f32 copies where the table says
 * bf16_as_f32 (the CPU's).
 */
/* Returns DT_ERR_UNSUPPORTED (recorded) when the group or its slot is missing. */
#define DT_OP_KSLOT(ctx, op, group, slot)                                                  \
  do {                                                                                     \
    if (!(group) || !(group)->slot)                                                        \
      return dt_error((ctx), DT_ERR_UNSUPPORTED, (op), "the device has no kernel " #slot); \
  } while (0)

/* The compute ledger's row of a kernel call (core.h, dt_kledger_kernel), written
 * by the call site just before the slot, so every device writes the same rows.
 * FLOPs per element as the slot's contract computes them, an exp, sqrt or
 * reciprocal counted as one: scale, add, sub, mul 1; silu 4 (exp, add, divide,
 * multiply); swiglu 5; silu_grad 8; swiglu_bwd 11; rms_norm 4 (square, add,
 * scale, weight), its backward 8; rope 3 per output (two products, a sum);
 * softmax 4 (max, exp, sum, divide); a sum 1 per input; embedding 0 (a row
 * copy), its backward 1 (an add); cross-entropy's backward 4; adamw 15.
 * Bytes: every operand read once, every output written once (es per element).
 * GEMMs are recorded by dt_device_gemm. */
static inline void dt_op_kledger(dt_ctx *ctx, const char *kernel, dt_dtype t, double flops_per,
                                 int64_t n, int64_t n_read, int64_t n_written) {
  const uint64_t es = dt_dtype_size(t);
  dt_kledger_kernel(ctx, kernel, t, flops_per * (double)n, (uint64_t)n_read * es,
                    (uint64_t)n_written * es);
}

/* The ops (defined in matmul.c, pointwise.c, reduce.c). Attrs each reads:
 *   einsum   eq ("bmk,bkn->bmn"; two operands, letters a-z)
 *   matmul   -   (x[..., m, k] @ y[..., k, n], equal leading batch dims)
 *   linear   -   (x[..., k] with W[n, k] -> [..., n], TorchTitan's nn.Linear, no bias)
 *   add, sub, mul (tensor-tensor, broadcasting), scale (x * scalar)
 *   cast     i0 (the target dt_dtype: f32, f64, bf16; placements kept)
 *   silu, swiglu (silu(a) * b)
 *   sum, mean    dims[0..ndims) (ndims 0: all), keepdim
 *   softmax      dim */
extern const dt_op dt_op_einsum, dt_op_matmul, dt_op_linear;
extern const dt_op dt_op_add, dt_op_sub, dt_op_mul, dt_op_scale, dt_op_cast, dt_op_silu,
    dt_op_swiglu;
extern const dt_op dt_op_sum, dt_op_mean, dt_op_softmax;
/*   view, reshape  shape[0..shape_n) (-1 infers one dim); view refuses what
 *                  needs a redistribution, reshape redistributes (PyTorch's
 *                  strict_view for aten.view, _ops/_view_ops.py)
 *   transpose      i0, i1 (dims to swap);  permute  dims[0..ndims)
 *   rms_norm       x [..., d], weight [d]; scalar = eps (1e-5 when 0)
 *   rope           x [b, s, h, hd]; scalar = theta (0: 10000; Llama 3 uses 500000),
 *                  i0 = 1 applies the Llama 3.1 frequency scaling; interleaved pairs;
 *                  positions are global (a sequence shard uses its offset); i1 = the
 *                  sequence's storage order (dt_seq_position's n_chunks; 0: natural)
 *   sdpa           q [b, h, s, hd], k and v [b, kvh, s, hd]; causal; scale 1/sqrt(hd);
 *                  h % kvh == 0 (query head i reads kv head i / (h/kvh)); i0 = 1:
 *                  [b, s, h, hd] instead; i2 = query rows per block (0: the default)
 *   embedding      weight [vocab, dim], ids (i64) [...] -> [..., dim]; no attrs; row-wise
 *                  (weight S(0)) gives P(sum) with masked lookups; ids get no gradient
 *   cross_entropy  logits [..., vocab], targets (i64) [...] -> mean loss (0-d); no
 *                  attrs; R, or P(sum) on position-sharded mesh dims (exact for uneven
 *                  shards); logits S(last) is loss parallel (3 all_reduces in the kernel)
 *   log_softmax_nll  as cross_entropy, and a second output: log_softmax's (logp, what its
 *                  backward reads; placed as the logits): TorchTitan's f32 loss with
 *                  PyTorch's unfused memory (lib/ops/embedding.c) */
extern const dt_op dt_op_view, dt_op_reshape, dt_op_transpose, dt_op_permute, dt_op_rms_norm;
extern const dt_op dt_op_rope, dt_op_sdpa, dt_op_embedding, dt_op_cross_entropy,
    dt_op_log_softmax_nll;

/* ---- context parallel attention (lib/ops/attention_cp.c) ----
 *
 * Storage order of a sequence under context parallel (PyTorch's head-tail load
 * balancer, torch/distributed/tensor/experimental/_attention.py
 * _generate_round_robin_indices): a sequence of S positions is cut into n_chunks
 * chunks of S / n_chunks; stored chunk k holds position chunk k / 2 when k is even
 * and n_chunks - 1 - k / 2 when odd, so rank r of cp holds chunks r and 2 cp - 1 - r
 * when n_chunks = 2 cp. n_chunks 0 or 1: natural order. The position of stored
 * index i (0 <= i < S; S % n_chunks == 0 and n_chunks even when > 1; -1 when
 * these do not hold). */
int64_t dt_seq_position(int64_t i, int64_t S, int n_chunks);

/* How K and V reach the other cp ranks (TorchTitan's context_parallel_rotate_method). */
typedef enum dt_cp_rotate {
  DT_CP_ALLGATHER = 0, /* K, V all-gathered over cp (the dispatcher's S -> R); dK, dV
                        * reduce-scattered back */
  DT_CP_RING = 1       /* pass-KV: cp - 1 send/recv rotations of [K | V] to the next
                        * cp rank, merged by log-sum-exp; backward rotates dK, dV too */
} dt_cp_rotate;

/*   sdpa_cp        causal GQA attention with the sequence dim sharded over one mesh
 *                  dim (context parallel): q, k, v as sdpa (i0 = layout, 0 [b, h, s, hd],
 *                  1 [b, s, h, hd]) -> out (like q) and lse (q's shape without the last
 *                  dim: each query row's log-sum-exp of its scaled scores, kept for the
 *                  backward). attrs: dim = the cp mesh dim; i1 = the sequence's storage
 *                  order (dt_seq_position's n_chunks); i2 = dt_cp_rotate. The cp mesh
 *                  dim's only option: allgather q S(seq), k R, v R, out and lse S(seq);
 *                  ring all S(seq). Other mesh dims as sdpa (R, heads, batch). */
extern const dt_op dt_op_sdpa_cp;

/* Causal block products sdpa_cp's kernels did on this rank (forward and backward),
 * counted per (query chunk, key chunk) pair of one call: full (every key visible),
 * diagonal (causal within the pair) and skipped (no key visible). */
typedef struct dt_cp_counts {
  uint64_t full, diag, skipped;
} dt_cp_counts;
void dt_sdpa_cp_counts(const dt_ctx *ctx, dt_cp_counts *out);
void dt_sdpa_cp_counts_reset(dt_ctx *ctx);

/* Looks an op up by name in the registry (NULL when unknown). */
const dt_op *dt_op_find(const char *name);
/* The registry, for listing: *n ops. */
const dt_op *const *dt_op_all(int *n);

/* What a dispatch decided, for explain and tests. */
typedef struct dt_op_report {
  int n_candidates;            /* after the shardability filter */
  int n_generated;             /* before it */
  int chosen;                  /* index into cand[] */
  bool cached;                 /* the decision came from the cache */
  dt_candidate *cand;          /* caller's buffer of max_cand entries, or NULL */
  int max_cand;
} dt_op_report;

/* Runs op on DTensors in[0..n_in) (same mesh), writing new DTensors to
 * out[0..n_out) (the caller frees them with dt_tensor_free). rep may be NULL. */
dt_status dt_op_call(dt_ctx *ctx, const dt_op *op, const dt_op_attrs *a,
                     const dt_tensor *const *in, dt_tensor *const *out, dt_op_report *rep);
/* The decision alone, on a mesh of the given sizes: the output specs (with
 * the chosen placements), the chosen candidate, and in rep every candidate
 * with its cost (no comm, no kernel, no cache). */
dt_status dt_op_plan(dt_ctx *ctx, const dt_op *op, const dt_op_attrs *a, const int *mesh_shape,
                     const dt_spec *in, dt_spec *out, dt_candidate *chosen, dt_op_report *rep);

/* Expansion helper for op authors: the cartesian product of per-mesh-dim
 * options (mesh dim 0 slowest), as PyTorch's expand_to_full_mesh_op_strategy. */
dt_status dt_op_expand(int mesh_ndim, int n_in, int n_out, const dt_dim_option *const *opts,
                       const int *n_opts, dt_candidate *cand, int *n, int max);

/* PyTorch's is_tensor_shardable: no tensor dim has fewer elements than the
 * number of shards placed on it. */
bool dt_spec_shardable(const dt_spec *s, const int *mesh_shape, const dt_placement *pl);

/* Frees the rank's dispatch cache (dt_ctx_release calls it too). */
void dt_op_cache_free(dt_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif
