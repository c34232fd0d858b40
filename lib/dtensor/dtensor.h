/* lib/dtensor/dtensor.h: placements, shard geometry, DTensor and redistribute.
 *
 * Semantics follow PyTorch's torch.distributed.tensor (placement_types.py:
 * Shard, Replicate, Partial; _utils.py: compute_local_shape_and_global_offset;
 * _redistribute.py): Shard(d) splits a tensor dim with torch.chunk semantics
 * (chunk = ceil(L/n), short and empty shards at the end), several mesh dims
 * sharding one tensor dim apply left to right, Replicate holds the whole,
 * Partial(op) holds a value pending a reduction. Geometry functions
 * are pure (no communication); redistribute plans the per-mesh-dim steps and
 * runs them through the comm front, so the ledger shows every step.
 */
#ifndef DT_DTENSOR_LAYER_H
#define DT_DTENSOR_LAYER_H

#include "../mesh/mesh.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- placements ---- */

typedef enum dt_pl_kind { DT_PL_REPLICATE = 0, DT_PL_SHARD = 1, DT_PL_PARTIAL = 2 } dt_pl_kind;

typedef struct dt_placement {
  dt_pl_kind kind;
  int dim;            /* Shard: tensor dim (normalised, >= 0) */
  dt_reduce_op op;    /* Partial: sum, avg, max or min */
} dt_placement;

dt_placement dt_shard(int dim);
dt_placement dt_replicate(void);
dt_placement dt_partial(dt_reduce_op op);
bool dt_placement_eq(dt_placement a, dt_placement b);

/* Parses one placement: "S(0)", "Shard(0)", "S(-1)" (negative dims are kept
 * negative here; dt_placements_normalize resolves them), "R", "Replicate()",
 * "P", "P(sum)", "Partial(avg)", ... Whitespace around tokens is allowed.
 * On error returns DT_ERR_INVALID and, when err is given, a one-line reason. */
dt_status dt_placement_parse(const char *s, dt_placement *out, char *err, size_t errn);
/* Parses a comma-separated list ("S(0),R,P(sum)") into out[0..*n). */
dt_status dt_placements_parse(const char *s, int max, dt_placement *out, int *n, char *err,
                              size_t errn);
/* Resolves negative shard dims against a tensor of `ndim` dims; DT_ERR_INVALID
 * (with a reason in err) when a dim is out of range. */
dt_status dt_placements_normalize(int n, dt_placement *pl, int ndim, char *err, size_t errn);
/* "S(0)", "R", "P(sum)"; returns the length written (snprintf rules). */
int dt_placement_str(dt_placement p, char *buf, size_t n);
/* "S(0),R,P(sum)" */
int dt_placements_str(int n, const dt_placement *pl, char *buf, size_t bn);

/* ---- shard geometry (pure) ---- */

/* torch.chunk of length L over n: the size and offset of chunk k. */
void dt_chunk(int64_t L, int n, int k, int64_t *size, int64_t *offset);

/* Local shape and global offset of the shard at mesh coordinates `coords`
 * (mesh of mesh_ndim dims with sizes mesh_shape), nested left to right. */
void dt_local_shape_offset(int ndim, const int64_t *gshape, int mesh_ndim, const int *mesh_shape,
                           const int *coords, const dt_placement *pl, int64_t *lshape,
                           int64_t *goffset);

/* ---- DTensor ---- */

enum { DT_MAX_MESH_DIMS = DT_MESH_MAX_DIMS };

typedef struct dt_tensor {
  dt_mesh *mesh;                          /* borrowed */
  int mesh_ndim;
  dt_placement pl[DT_MAX_MESH_DIMS];
  int ndim;
  int64_t gshape[DT_MAX_DIMS];            /* global shape */
  int64_t goffset[DT_MAX_DIMS];           /* this rank's global offset */
  dt_dtype dtype;
  dt_array local;                         /* this rank's shard, owned */
} dt_tensor;

/* Padding the collectives of one mesh dim need for chunk k of L over n:
 * ceil(L/n) - size_k (>= 0). */
int64_t dt_chunk_pad(int64_t L, int n, int k);

/* The logical shape of the tensor as mesh dim `upto` sees it: the global shape
 * after the shardings of mesh dims 0..upto-1 at these coordinates. upto = 0 is the
 * global shape; upto = mesh_ndim is the local shape. */
void dt_logical_shape(int ndim, const int64_t *gshape, const int *mesh_shape, const int *coords,
                      const dt_placement *pl, int upto, int64_t *out);

/* Number of shards: product of the mesh sizes of dims whose placement is Shard. */
int64_t dt_num_shards(int mesh_ndim, const int *mesh_shape, const dt_placement *pl);

/* ---- redistribute plans (pure: no communication) ---- */

typedef enum dt_step_kind {
  DT_STEP_ALL_GATHER = 0,   /* S(d) -> R */
  DT_STEP_ALL_REDUCE,       /* P -> R */
  DT_STEP_REDUCE_SCATTER,   /* P -> S(d) */
  DT_STEP_ALL_TO_ALL,       /* S(a) -> S(b) */
  DT_STEP_CHUNK,            /* R -> S(d), local */
  DT_STEP_PARTITION,        /* R -> P, local (sum: divide by n; avg, max, min: keep) */
  DT_STEP_KIND_COUNT
} dt_step_kind;

const char *dt_step_kind_name(dt_step_kind k); /* "all_gather", ..., "chunk", "partition" */
/* The comm op a step issues; false for local steps. */
bool dt_step_coll(dt_step_kind k, dt_coll *out);

typedef struct dt_redist_step {
  int mesh_dim;
  dt_placement src, dst;
  dt_step_kind kind;
} dt_redist_step;

enum { DT_MAX_STEPS = 32 };

typedef enum dt_planner { DT_PLANNER_GREEDY = 0, DT_PLANNER_MIN_COST = 1 } dt_planner;
const char *dt_planner_name(dt_planner p);            /* "greedy", "min-cost" */
dt_status dt_planner_parse(const char *s, dt_planner *out);

/* Mesh and tensor facts a plan depends on (no communicator needed). */
typedef struct dt_layout {
  int mesh_ndim;
  int mesh_shape[DT_MAX_MESH_DIMS];
  int ndim;
  int64_t gshape[DT_MAX_DIMS];
  dt_dtype dtype;
} dt_layout;

typedef struct dt_redist_plan {
  dt_planner planner;
  int mesh_ndim, ndim;
  dt_placement src[DT_MAX_MESH_DIMS], dst[DT_MAX_MESH_DIMS];
  int n;                                /* steps, in execution order */
  dt_redist_step steps[DT_MAX_STEPS];
  double cost_us;                       /* the alpha-beta estimate of all steps */
} dt_redist_plan;

/* Plans src -> dst. Placements must be normalised (dims in range). Errors
 * (DT_ERR_INVALID with a one-line reason in ctx's last error): a target Partial
 * where the source is not that same Partial ("redistributing to Partial is for
 * internal use only" is PyTorch's user-API rule; here R -> P is allowed as a
 * local step and S -> P is rejected), P(x) -> P(y) with x != y, shard dims out
 * of range. greedy is PyTorch's greedy planner (_redistribute.py:
 * _gen_transform_infos, DTensorRedistributePlanner.generate_greedy_transform_infos
 * in recent versions); min-cost searches placement states with the cost model
 * below and never returns a plan that costs more than the greedy one. ctx may
 * be NULL. */
dt_status dt_redistribute_plan(dt_ctx *ctx, const dt_layout *lay, const dt_placement *src,
                               const dt_placement *dst, dt_planner planner, dt_redist_plan *out);

/* PyTorch's trace form: the source state then each state after a step, joined
 * by "->"; a state prints each mesh dim's placement, with "[k]" after S(d) when
 * several mesh dims shard tensor dim d (k: its position, left to right), e.g.
 * "S(0)[0]S(0)[1]R->S(0)RR". Returns the length (snprintf rules). */
int dt_redist_plan_trace(const dt_redist_plan *p, char *buf, size_t n);

/* ---- the cost model (PyTorch's _collective_utils.py; microseconds) ---- */

/* Per mesh dim bandwidth (GB/s) and latency (us) as PyTorch's MeshTopoInfo:
 * 87.7 GB/s and 0.6 us within a host; walking mesh dims from last to first
 * multiplying sizes, once the product exceeds devices_per_host that dim and all
 * earlier ones get bw * 0.22 and 2.7 us. CPU meshes use devices_per_host = 1. */
typedef struct dt_topo {
  int mesh_ndim;
  double bw_gbps[DT_MAX_MESH_DIMS];
  double lat_us[DT_MAX_MESH_DIMS];
  int size[DT_MAX_MESH_DIMS];
} dt_topo;
void dt_topo_build(int mesh_ndim, const int *mesh_shape, int devices_per_host, dt_topo *out);
double dt_cost_allgather(const dt_topo *t, int mesh_dim, double bytes);     /* = reduce_scatter */
double dt_cost_reduce_scatter(const dt_topo *t, int mesh_dim, double bytes);
double dt_cost_allreduce(const dt_topo *t, int mesh_dim, double bytes);
/* PyTorch's redistribute_cost(cur, tgt) for a tensor of global_bytes: 0 when cur
 * is all Replicate; INFINITY for S -> P. */
double dt_redistribute_cost(const dt_topo *t, double global_bytes, const dt_placement *cur,
                            const dt_placement *tgt);
/* Cost of one step given the bytes of the local tensor before it. */
double dt_step_cost(const dt_topo *t, const dt_redist_step *s, double local_bytes);

/* ---- DTensor: creation, conversion, redistribute (collective over the mesh) ---- */

/* Every rank passes the same global tensor (host array): each keeps its shard,
 * no communication. Partial: replicate then partition, as PyTorch (sum: value/n
 * on every rank; avg, max, min: the value). */
dt_status dt_tensor_distribute(dt_ctx *ctx, dt_mesh *mesh, const dt_array *global,
                               const dt_placement *pl, dt_tensor *out);
/* The global tensor lives on one rank (src_rank, a world rank in the mesh);
 * others pass NULL. Shards are scattered and replicas broadcast per mesh dim
 * through the comm front (PyTorch's src_data_rank path). Partial as above.
 * Only the source can check its tensor against gshape and dtype: when it
 * refuses, the others are released by the job's failure propagation. */
dt_status dt_tensor_scatter_from(dt_ctx *ctx, dt_mesh *mesh, const dt_array *global, int src_rank,
                                 int ndim, const int64_t *gshape, dt_dtype dtype,
                                 const dt_placement *pl, dt_tensor *out);
/* Generates only this rank's shard of the global tensor whose element at flat
 * row-major index i is a + b * rng(seed, stream, i) (uniform [0,1) or normal):
 * every layout sees the same global values. Partial(sum): coordinate 0 holds the
 * value, the others 0; avg, max, min: every rank holds the value. No comm. */
dt_status dt_tensor_rand(dt_ctx *ctx, dt_mesh *mesh, int ndim, const int64_t *gshape,
                         dt_dtype dtype, const dt_placement *pl, uint64_t seed, uint64_t stream,
                         dt_rng_dist dist, double a, double b, dt_tensor *out);
/* Wraps a local shard (copied). gshape NULL: PyTorch's inference (local size
 * times the mesh size on each sharded dim; right only for even shards). With
 * gshape, the local shape is validated against this rank's expected shard
 * (DT_ERR_INVALID naming the dim, the expected and the given size). No comm. */
dt_status dt_tensor_from_local(dt_ctx *ctx, dt_mesh *mesh, const dt_array *local,
                               const dt_placement *pl, int ndim, const int64_t *gshape,
                               dt_tensor *out);
/* Where the local shards of ctx's rank live: its compute device's kind (host
 * memory, DT_DEV_CPU, when it has none). */
dt_device_kind dt_tensor_home(const dt_ctx *ctx);
/* The local shard (borrowed; valid while t lives). */
const dt_array *dt_tensor_local(const dt_tensor *t);
/* Gathers the global tensor on every rank into out (allocated, caller frees
 * with dt_array_free). */
dt_status dt_tensor_full(dt_ctx *ctx, const dt_tensor *t, dt_array *out);
/* Redistributes to dst placements (a new DTensor in out, which must not be t;
 * t is unchanged). */
dt_status dt_redistribute(dt_ctx *ctx, const dt_tensor *t, const dt_placement *dst,
                          dt_planner planner, dt_tensor *out);
/* Runs a given plan (made for t's layout and placements). */
dt_status dt_redistribute_run(dt_ctx *ctx, const dt_tensor *t, const dt_redist_plan *plan,
                              dt_tensor *out);
/* The layout (mesh shape, global shape, dtype) of t. */
void dt_tensor_layout(const dt_tensor *t, dt_layout *out);

/* ---- DTensor metadata, for the layers that build DTensors (lib/ops) ---- */

/* The mesh's number of dims in *mesh_ndim and, when not NULL, its sizes in
 * shape[0..mesh_ndim) and this rank's coordinates in coords[0..mesh_ndim). */
void dt_tensor_mesh_info(const dt_mesh *mesh, int *mesh_ndim, int *shape, int *coords);
/* Fills every field of *t but the local array (zeroed, not allocated): mesh,
 * placements (copied, then normalised against ndim), global shape, dtype and
 * this rank's global offset. No communication. DT_ERR_INVALID (recorded on ctx
 * under the name `call`) for a NULL mesh, ndim outside 0..DT_MAX_DIMS, an
 * invalid dtype, a negative dim, a shard dim out of range or a Partial op other
 * than sum, avg, max or min. The caller then allocates t->local with the shape
 * dt_tensor_local_shape gives. */
dt_status dt_tensor_meta(dt_ctx *ctx, dt_mesh *mesh, const dt_placement *pl, int ndim,
                         const int64_t *gshape, dt_dtype dtype, const char *call, dt_tensor *t);
/* The local shape (lshape[0..t->ndim)) of this rank's shard as t's metadata
 * says: what t->local must hold. */
void dt_tensor_local_shape(const dt_tensor *t, int64_t *lshape);
void dt_tensor_free(dt_ctx *ctx, dt_tensor *t);

#ifdef __cplusplus
}
#endif
#endif
