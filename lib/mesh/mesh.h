/* lib/mesh/mesh.h: DeviceMesh, an N-D named mesh of ranks with one communicator per dim.
 *
 * PyTorch's semantics (torch/distributed/device_mesh.py: init_device_mesh,
 * DeviceMesh.__getitem__, DeviceMesh._flatten): the mesh is
 * arange(world).view(shape), row-major; the group of dim d holds the ranks that
 * differ only in coordinate d, and the group rank is that coordinate. Slicing by
 * names gives the submesh containing the calling rank and reuses the parent's
 * communicators; flattening creates a new communicator over the flattened dims.
 * This layer knows nothing of tensors or placements.
 */
#ifndef DT_MESH_H
#define DT_MESH_H

#include "../comm/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { DT_MESH_MAX_DIMS = 5, DT_MESH_NAME_LEN = 32 };

typedef struct dt_mesh dt_mesh;

/* Collective over `world` (every member calls it): a mesh of ndim (1..5) dims of
 * the given sizes (each >= 1, product == world->size) and unique names (NULL:
 * "dim0"..). Mesh index i is member i of `world` (its world rank is
 * world->world_ranks[i]); `world` is borrowed and must outlive the mesh. ctx may
 * be NULL (world->ctx). Names are identifiers ([A-Za-z_][A-Za-z0-9_]*) of at
 * most DT_MESH_NAME_LEN-1 characters. Errors: DT_ERR_INVALID with a message for
 * a bad shape or a duplicate, empty, too long or non-identifier name, found
 * before any communication, so every rank fails alike and none waits. Each dim
 * gets a communicator named after it (split of world; group rank == coordinate).
 * The mesh owns its communicators; free with dt_mesh_free. */
dt_status dt_mesh_create(dt_ctx *ctx, dt_comm *world, int ndim, const int *shape,
                         const char *const *names, dt_mesh **out);
/* Frees a root mesh and every slice and flattened mesh made from it. Slices
 * must not be freed on their own (a no-op for them). */
void dt_mesh_free(dt_mesh *m);

/* Accessors. An out-of-range dim gives 0 (sizes), NULL (names, comms) or -1
 * (coords, ranks); dt_mesh_group_ranks then writes nothing. */
int dt_mesh_ndim(const dt_mesh *m);
int dt_mesh_size(const dt_mesh *m, int dim);     /* dim -1: all ranks */
const char *dt_mesh_name(const dt_mesh *m, int dim);
/* Index of one of m's own dims by name (flattened names of the root are not
 * dims of the root), -1 when unknown. */
int dt_mesh_dim(const dt_mesh *m, const char *name);
/* This rank's coordinate along dim (== its rank in the dim's group). */
int dt_mesh_coord(const dt_mesh *m, int dim);
/* The global (world) rank at the given coordinates of this mesh; -1 when a
 * coordinate is out of range. */
int dt_mesh_rank_at(const dt_mesh *m, const int *coords);
/* The communicator of dim (group of ranks differing only in that coordinate). */
dt_comm *dt_mesh_comm(const dt_mesh *m, int dim);
/* Writes the world ranks of this rank's group along dim, in group-rank order. */
void dt_mesh_group_ranks(const dt_mesh *m, int dim, int *out);
/* Writes all world ranks of the mesh, row-major (dt_mesh_size(m, -1) entries). */
void dt_mesh_ranks(const dt_mesh *m, int *out);

/* Submesh containing this rank over the named dims, which must be distinct, known
 * (flattened names included) and in ascending dim order, as PyTorch requires. The
 * mesh's own full name list returns m itself. Local: no communication.
 * Flattened names: accepted when slicing the root (as in PyTorch; a slice accepts
 * its own dim names only). A flattened name sorts at its last root dim and may be
 * mixed with plain dims when no root dim is spanned twice, e.g.
 * root[("dp_replicate", "dp_shard_cp")]; root[("dp_cp")] alone is the flattened
 * mesh itself. Results are cached in the root (the same names give the same
 * pointer) and freed with it. Errors: DT_ERR_INVALID naming the bad name. */
dt_status dt_mesh_slice(dt_mesh *m, int n, const char *const *names, dt_mesh **out);
/* Collective over the whole root mesh: flattens the dims of submesh `sub` (a
 * slice of root, or root) into one new dim named `name` (NULL: names joined by
 * "_"), with a new communicator, row-major. The result is cached in the root:
 * the same name with the same dims returns it again; a name reused for other dims
 * or clashing with a dim name is DT_ERR_INVALID. A 1-D mesh flattened to its own
 * name is itself. Validation and the cache lookup come before any communication,
 * so every rank returns the same status. Every rank of the root must call it with
 * the same dims and name, in the same order relative to other collectives. */
dt_status dt_mesh_flatten(dt_mesh *sub, const char *name, dt_mesh **out);

/* Formats "(2, 4) [dp, tp]" into buf (a 1-D mesh: "(8,) [dp_cp]"), truncated to n. */
void dt_mesh_describe(const dt_mesh *m, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif
