/* lib/parallel/cp.c: context parallel on a model (PyTorch's context_parallel,
 * torch/distributed/tensor/experimental/_attention.py; TorchTitan v0.2.0's
 * create_context_parallel_ctx in torchtitan/distributed/utils.py).
 *
 * The sequence dim of the inputs, the labels and every activation is sharded over
 * the cp mesh dim, stored in head-tail order when load balancing (the sequence cut
 * into 2 cp chunks, cp rank r holding chunks r and 2 cp - 1 - r, so that every rank
 * has the same causal attention work: _generate_round_robin_indices). Only rope
 * and attention depend on positions: the model passes the storage order to both
 * (rope reads each stored row's true position, sdpa_cp masks by positions and
 * brings K, V from the other cp ranks). The loss is a mean over every token, which
 * the order does not change. Weights stay whole over cp; their gradients come
 * out Partial(sum) there and are reduced with the data dims' (FSDP over
 * dp_shard x cp, or DDP's all_reduce over dp_replicate x cp).
 */
#include "config.h"

#include <string.h>

#include "parallel/parallel.h"

dt_status dt_context_parallel(dt_ctx *ctx, dt_model *m, int cp_dim, dt_cp_rotate rotate,
                              bool load_balance) {
  static const char who[] = "dt_context_parallel";
  if (!ctx || !m || !m->mesh) return dt_error(ctx, DT_ERR_INVALID, who, "no model or mesh");
  if (cp_dim < 0 || cp_dim >= dt_mesh_ndim(m->mesh))
    return dt_error(ctx, DT_ERR_INVALID, who, "cp mesh dim %d (the mesh has %d dims)", cp_dim,
                    dt_mesh_ndim(m->mesh));
  if (rotate != DT_CP_ALLGATHER && rotate != DT_CP_RING)
    return dt_error(ctx, DT_ERR_INVALID, who, "rotate method %d (allgather or ring)", (int)rotate);
  m->cp_dim = cp_dim;
  m->cp_chunks = load_balance ? 2 * dt_mesh_size(m->mesh, cp_dim) : 0;
  m->cp_rotate = rotate;
  return DT_OK;
}

dt_status dt_cp_shard_sequence(dt_ctx *ctx, const dt_model *m, const dt_array *global, int seq_dim,
                               const dt_placement *pl, dt_tensor *out) {
  static const char who[] = "dt_cp_shard_sequence";
  if (!ctx || !m || !global || !pl || !out) return dt_error(ctx, DT_ERR_INVALID, who, "NULL argument");
  if (m->cp_dim < 0) return dt_error(ctx, DT_ERR_INVALID, who, "the model has no context parallel");
  if (seq_dim < 0 || seq_dim >= global->ndim)
    return dt_error(ctx, DT_ERR_INVALID, who, "sequence dim %d of a %d-d array", seq_dim, global->ndim);
  if (global->dev != DT_DEV_CPU) return dt_error(ctx, DT_ERR_UNSUPPORTED, who, "a host array only");
  const int64_t S = global->shape[seq_dim];
  const int cp = dt_mesh_size(m->mesh, m->cp_dim), nc = m->cp_chunks;
  if (S % cp || (nc > 1 && S % nc))
    return dt_error(ctx, DT_ERR_INVALID, who,
                    "sequence length %lld is not divisible by %d (%s)", (long long)S,
                    nc > 1 ? nc : cp, nc > 1 ? "2 x cp, load-balanced" : "cp");
  for (int d = 0; d < dt_mesh_ndim(m->mesh); d++)
    if (d != m->cp_dim && pl[d].kind == DT_PL_SHARD && pl[d].dim == seq_dim)
      return dt_error(ctx, DT_ERR_INVALID, who, "mesh dim %d also shards the sequence dim", d);
  /* rows of the stored order: stored index i takes position dt_seq_position(i) */
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < seq_dim; d++) outer *= global->shape[d];
  for (int d = seq_dim + 1; d < global->ndim; d++) inner *= global->shape[d];
  dt_array perm;
  DT_CHECK(dt_array_create(ctx, DT_DEV_CPU, global->dtype, global->ndim, global->shape, &perm));
  const size_t row = (size_t)inner * dt_dtype_size(global->dtype);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < S; i++)
      memcpy((char *)perm.data + (size_t)(o * S + i) * row,
             (const char *)global->data + (size_t)(o * S + dt_seq_position(i, S, nc)) * row, row);
  dt_placement p[DT_MAX_MESH_DIMS];
  for (int d = 0; d < dt_mesh_ndim(m->mesh); d++) p[d] = pl[d];
  p[m->cp_dim] = dt_shard(seq_dim);
  dt_status s = dt_tensor_distribute(ctx, m->mesh, &perm, p, out);
  dt_array_free(ctx, &perm);
  return s;
}
