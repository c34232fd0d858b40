/* lib/parallel/parallel_dims.c: TorchTitan's ParallelDims (torchtitan/distributed/
 * parallel_dims.py): the mesh of the five degrees and its flattened dims.
 *
 * TorchTitan's mesh keeps the degrees > 1 in the order pp, dp_replicate, dp_shard,
 * cp, tp and flattens dp (dp_replicate, dp_shard: data loading), dp_shard_cp
 * (dp_shard, cp: FSDP) and dp_cp (dp_replicate, cp: the loss, DDP). Here the
 * flattened dims are bit masks of mesh dims: the calls that reduce over several
 * dims flatten them on use (dt_mesh_flatten in fsdp.c and DDP).
 *
 * One difference, for FSDP + TP without cp: tp comes before dp_shard, so FSDP's
 * Shard(0) nests inside TP's local block (fsdp.c). The groups are TorchTitan's (each
 * tp group and each dp_shard group holds the same world ranks); only each rank's
 * index in the mesh is permuted (dt_parallel_dims_rank_index). With cp, the order
 * stays TorchTitan's: sequence parallel and cp both shard the sequence, cp outer,
 * and FSDP then shards the other dim of TP's dim-0 blocks (fsdp.c). Not here: which
 * parallelism applies to which module (parallelize_llama.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer.h"

static const char *const PDIM_NAMES[DT_PDIM_COUNT] = {"pp", "dp_replicate", "dp_shard", "cp", "tp"};

const char *dt_pdim_name(int d) { return d >= 0 && d < DT_PDIM_COUNT ? PDIM_NAMES[d] : NULL; }

dt_status dt_parallel_dims_init(dt_ctx *ctx, const int degree[DT_PDIM_COUNT], int world_size,
                                dt_parallel_dims *d) {
  memset(d, 0, sizeof *d);
  int world = 1;
  for (int i = 0; i < DT_PDIM_COUNT; i++) {
    if (degree[i] < 1)
      return dt_error(ctx, DT_ERR_INVALID, "dt_parallel_dims_init", "%s=%d: a degree is >= 1",
                      PDIM_NAMES[i], degree[i]);
    d->degree[i] = degree[i];
    world *= degree[i];
  }
  if (world != world_size)
    return dt_error(ctx, DT_ERR_INVALID, "dt_parallel_dims_init", "mesh has %d ranks, world is %d",
                    world, world_size);
  d->world_size = world_size;
  d->tp_before_dp_shard = degree[DT_PDIM_DP_SHARD] > 1 && degree[DT_PDIM_TP] > 1 &&
                          degree[DT_PDIM_CP] == 1;
  static const int ORDER[DT_PDIM_COUNT] = {0, 1, 2, 3, 4}, SWAPPED[DT_PDIM_COUNT] = {0, 1, 3, 4, 2};
  const int *order = d->tp_before_dp_shard ? SWAPPED : ORDER;
  for (int i = 0; i < DT_PDIM_COUNT; i++) d->dim[i] = -1;
  for (int k = 0; k < DT_PDIM_COUNT; k++) {
    const int p = order[k];
    if (degree[p] == 1) continue;
    d->dim[p] = d->ndim;
    d->shape[d->ndim] = degree[p];
    snprintf(d->names[d->ndim], DT_MESH_NAME_LEN, "%s", PDIM_NAMES[p]);
    d->ndim++;
  }
  if (d->ndim == 0) { /* world 1 */
    d->ndim = 1;
    d->shape[0] = 1;
    snprintf(d->names[0], DT_MESH_NAME_LEN, "tp");
  }
#define BIT(p) (d->dim[p] >= 0 ? 1u << d->dim[p] : 0u)
  d->dp = BIT(DT_PDIM_DP_REPLICATE) | BIT(DT_PDIM_DP_SHARD);
  d->dp_shard_cp = BIT(DT_PDIM_DP_SHARD) | BIT(DT_PDIM_CP);
  d->dp_cp = BIT(DT_PDIM_DP_REPLICATE) | BIT(DT_PDIM_CP);
#undef BIT
  return DT_OK;
}

int dt_parallel_dims_rank_index(const dt_parallel_dims *d, int rank) {
  if (!d->tp_before_dp_shard) return rank;
  const int nd = d->ndim, t = d->shape[nd - 2], s = d->shape[nd - 1];
  const int outer = rank / (t * s), in = rank % (t * s); /* TorchTitan: in = s_coord * t + tp */
  return outer * (t * s) + (in % t) * s + in / t;
}

dt_status dt_parallel_dims_build_mesh(dt_ctx *ctx, const dt_parallel_dims *d, dt_mesh **mesh,
                                      dt_comm **perm) {
  *mesh = NULL;
  *perm = NULL;
  dt_comm *world = ctx->world;
  const char *names[DT_PDIM_COUNT];
  for (int i = 0; i < d->ndim; i++) names[i] = d->names[i];
  if (d->tp_before_dp_shard) {
    /* members in the permuted order: member i is the world rank whose index is i */
    int n = ctx->world->size, *mem = malloc((size_t)n * sizeof *mem);
    if (!mem) return dt_error(ctx, DT_ERR_NOMEM, "dt_parallel_dims_build_mesh", "no memory");
    for (int r = 0; r < n; r++) mem[dt_parallel_dims_rank_index(d, r)] = r;
    dt_status ps = dt_comm_split_group(ctx->world, 0, dt_parallel_dims_rank_index(d, ctx->rank),
                                       n, mem, "world_tp_dps", perm);
    free(mem);
    DT_CHECK(ps);
    world = *perm;
  }
  dt_status s = dt_mesh_create(ctx, world, d->ndim, d->shape, names, mesh);
  if (s != DT_OK && *perm) {
    dt_comm_destroy(*perm);
    *perm = NULL;
  }
  return s;
}

void dt_parallel_dims_free_mesh(dt_mesh *mesh, dt_comm *perm) {
  dt_mesh_free(mesh);
  if (perm) dt_comm_destroy(perm);
}

/* ---- roles ---- */

static bool divides(int64_t d, int64_t n) { return d <= 1 || n % d == 0; }

/* L cut by torch.chunk over k nested dims of sizes n[] at coordinates c[]: the
 * last chunk's size (dt_chunk, as FSDP and the batch's Shard(0) cut). */
static int64_t nested_chunk(int64_t L, int k, const int *n, const int *c) {
  for (int i = 0; i < k; i++) dt_chunk(L, n[i], c[i], &L, NULL);
  return L;
}

/* An open-addressing map of 64-bit keys to roles; slot holds index + 1. */
typedef struct role_map {
  uint64_t *key;
  int *val;
  size_t cap; /* a power of two over twice the keys */
} role_map;

static int *role_slot(role_map *m, uint64_t k) {
  size_t h = (size_t)((k ^ (k >> 29)) * 0x9e3779b97f4a7c15ull) & (m->cap - 1);
  while (m->val[h] && m->key[h] != k) h = (h + 1) & (m->cap - 1);
  m->key[h] = k;
  return &m->val[h];
}

int dt_parallel_dims_roles(const dt_parallel_dims *d, const dt_llama_config *cfg, int batch,
                           int seq, int *role_of) {
  const int *g = d->degree;
  const int64_t t = g[DT_PDIM_TP], c = g[DT_PDIM_CP], s = g[DT_PDIM_DP_SHARD],
                r = g[DT_PDIM_DP_REPLICATE];
  const int64_t H = cfg->n_heads, KV = cfg->n_kv_heads, D = cfg->dim, V = cfg->vocab;
  const int64_t hd = H ? D / H : 0, F = dt_llama_ffn_hidden(cfg);
  const bool tp_uneven = !divides(t, H) || !divides(t, KV) || !divides(t, F) || !divides(t, V) ||
                         !divides(t, D) || !divides(t * 2 * c, seq);
  const bool cp_uneven = !divides(2 * c, seq) || !divides(2 * c * t, seq);
  /* FSDP shards a dim of each TP-local weight over dp_shard x cp (nested, in mesh
   * order); every size it may cut is here */
  const int64_t rows[] = {V / t, H * hd / t, KV * hd / t, D, F / t};
  enum { NROWS = sizeof rows / sizeof rows[0] };
  const int W = d->world_size;
  role_map m = {NULL, NULL, 1};
  while (m.cap < 2 * (size_t)W + 2) m.cap *= 2;
  m.key = malloc(m.cap * sizeof *m.key);
  m.val = calloc(m.cap, sizeof *m.val);
  /* the distinct shard signatures: rows' chunk sizes then the batch's */
  int64_t(*sig)[NROWS + 1] = malloc((size_t)W * sizeof *sig);
  if (!m.key || !m.val || !sig) {
    free(m.key), free(m.val), free(sig);
    return -1;
  }
  int n = 0, nsig = 0;
  for (int rank = 0; rank < W; rank++) {
    int idx = dt_parallel_dims_rank_index(d, rank), coord[DT_PDIM_COUNT] = {0};
    int mc[DT_MAX_MESH_DIMS];
    for (int k = d->ndim - 1; k >= 0; k--) {
      mc[k] = idx % d->shape[k];
      idx /= d->shape[k];
    }
    for (int p = 0; p < DT_PDIM_COUNT; p++) coord[p] = d->dim[p] >= 0 ? mc[d->dim[p]] : 0;
    /* a rank's shards: the chunk sizes FSDP and the batch's Shard(0) give it */
    const int fn[2] = {(int)s, (int)c}, fc[2] = {coord[DT_PDIM_DP_SHARD], coord[DT_PDIM_CP]};
    const int bn[2] = {(int)r, (int)s}, bc[2] = {coord[DT_PDIM_DP_REPLICATE], coord[DT_PDIM_DP_SHARD]};
    int64_t v[NROWS + 1];
    for (int i = 0; i < NROWS; i++) v[i] = nested_chunk(rows[i], 2, fn, fc);
    v[NROWS] = nested_chunk(batch, 2, bn, bc);
    int q = 0;
    while (q < nsig && memcmp(sig[q], v, sizeof v)) q++;
    if (q == nsig) memcpy(sig[nsig++], v, sizeof v);
    /* the role's key: the pp stage, the tp and cp coordinates where their cuts are
     * uneven, the shard signature */
    const uint64_t key =
        (((uint64_t)coord[DT_PDIM_PP] * (uint64_t)t + (uint64_t)(tp_uneven ? coord[DT_PDIM_TP] : 0)) *
             (uint64_t)c +
         (uint64_t)(cp_uneven ? coord[DT_PDIM_CP] : 0)) *
            (uint64_t)W +
        (uint64_t)q;
    int *slot = role_slot(&m, key);
    if (!*slot) *slot = ++n;
    role_of[rank] = *slot - 1;
  }
  free(m.key), free(m.val), free(sig);
  return n;
}
