/* lib/dtensor/tensor_impl.h: internals shared by tensor.c and redistribute.c. */
#ifndef DT_TENSOR_IMPL_H
#define DT_TENSOR_IMPL_H

#include "dtensor/dtensor.h"

/* This rank's coordinates and the mesh's sizes. */
void dt_tensor_mesh_info(const dt_mesh *mesh, int *mesh_ndim, int *shape, int *coords);
/* Fills t's metadata (mesh, placements, shapes, this rank's offset) without
 * allocating; validates placements (normalised, dims in range) and shape. */
dt_status dt_tensor_meta(dt_ctx *ctx, dt_mesh *mesh, const dt_placement *pl, int ndim,
                         const int64_t *gshape, dt_dtype dtype, const char *call, dt_tensor *t);
/* Local shape of t as its metadata says (lshape[0..ndim)). */
void dt_tensor_local_shape(const dt_tensor *t, int64_t *lshape);
/* x /= n element-wise on a host array (R -> P(sum) partition). */
void dt_array_div(dt_array *x, double n);

#endif
