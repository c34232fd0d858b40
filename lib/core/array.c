/* lib/core/array.c: dt_array, a contiguous row-major local tensor on one device.
 * A host array comes from the host allocator; any other kind from the memory a
 * device backend installed on the rank's context (ctx->dev_mem). */
#include "config.h"

#include <string.h>

#include "core/core.h"

int64_t dt_shape_numel(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) return -1;
    if (shape[i] != 0 && n > INT64_MAX / shape[i]) return -1;
    n *= shape[i];
  }
  return n;
}

static dt_status fill_header(dt_ctx *ctx, const char *call, dt_device_kind dev, dt_dtype dtype,
                             int ndim, const int64_t *shape, dt_array *out) {
  memset(out, 0, sizeof *out);
  if (ndim < 0 || ndim > DT_MAX_DIMS)
    return dt_error(ctx, DT_ERR_INVALID, call, "ndim %d outside 0..%d", ndim, DT_MAX_DIMS);
  if (dt_dtype_size(dtype) == 0)
    return dt_error(ctx, DT_ERR_INVALID, call, "invalid dtype %d", (int)dtype);
  if (ndim > 0 && !shape) return dt_error(ctx, DT_ERR_INVALID, call, "shape is NULL");
  int64_t n = dt_shape_numel(ndim, shape);
  if (n < 0) return dt_error(ctx, DT_ERR_INVALID, call, "negative or overflowing shape");
  if ((uint64_t)n > SIZE_MAX / dt_dtype_size(dtype))
    return dt_error(ctx, DT_ERR_INVALID, call, "array of %lld elements is too large", (long long)n);
  out->dtype = dtype;
  out->ndim = ndim;
  for (int i = 0; i < ndim; i++) out->shape[i] = shape[i];
  out->numel = n;
  out->dev = dev;
  return DT_OK;
}

dt_status dt_array_create(dt_ctx *ctx, dt_device_kind dev, dt_dtype dtype, int ndim,
                          const int64_t *shape, dt_array *out) {
  DT_CHECK(fill_header(ctx, "dt_array_create", dev, dtype, ndim, shape, out));
  size_t bytes = dt_array_bytes(out);
  if (dev == DT_DEV_CPU) {
    out->data = dt_host_alloc(ctx, bytes);
    if (!out->data) return DT_ERR_NOMEM;
  } else {
    if (!ctx || ctx->dev_mem.kind != dev || !ctx->dev_mem.alloc)
      return dt_error(ctx, DT_ERR_INVALID, "dt_array_create",
                      "no device of the requested kind on this rank");
    DT_CHECK(ctx->dev_mem.alloc(ctx->dev_mem.owner, bytes, &out->data));
  }
  out->owns = true;
  return DT_OK;
}

dt_status dt_array_wrap(dt_ctx *ctx, dt_device_kind dev, dt_dtype dtype, int ndim,
                        const int64_t *shape, void *data, dt_array *out) {
  DT_CHECK(fill_header(ctx, "dt_array_wrap", dev, dtype, ndim, shape, out));
  out->data = data;
  out->owns = false;
  return DT_OK;
}

void dt_array_free(dt_ctx *ctx, dt_array *a) {
  if (!a) return;
  if (a->owns && a->data) {
    if (a->dev == DT_DEV_CPU) dt_host_free(ctx, a->data);
    else if (ctx && ctx->dev_mem.kind == a->dev && ctx->dev_mem.free)
      ctx->dev_mem.free(ctx->dev_mem.owner, a->data, dt_array_bytes(a));
  }
  a->data = NULL;
  a->owns = false;
}

size_t dt_array_bytes(const dt_array *a) {
  return (size_t)a->numel * dt_dtype_size(a->dtype);
}

void dt_copy_box(size_t es, int ndim, void *dst, const int64_t *dst_shape, const int64_t *dst_off,
                 const void *src, const int64_t *src_shape, const int64_t *src_off,
                 const int64_t *box) {
  for (int d = 0; d < ndim; d++)
    if (box[d] <= 0) return;
  if (ndim == 0) {
    memcpy(dst, src, es);
    return;
  }
  /* Fold the trailing dims the box covers whole in both arrays into one run. */
  int k = ndim - 1;
  int64_t run = box[k];
  while (k > 0 && box[k] == src_shape[k] && box[k] == dst_shape[k]) {
    k--;
    run *= box[k];
  }
  int64_t sstride[DT_MAX_DIMS], dstride[DT_MAX_DIMS];
  int64_t ss = 1, ds = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    sstride[d] = ss;
    dstride[d] = ds;
    ss *= src_shape[d];
    ds *= dst_shape[d];
  }
  /* run covers dim k (box[k] elements of stride sstride[k]) and everything inner */
  int64_t run_elems = run / box[k] * box[k]; /* == run */
  int64_t idx[DT_MAX_DIMS] = {0};
  const char *s = src;
  char *t = dst;
  for (;;) {
    int64_t so = 0, dof = 0;
    for (int d = 0; d < k; d++) {
      so += (src_off[d] + idx[d]) * sstride[d];
      dof += (dst_off[d] + idx[d]) * dstride[d];
    }
    so += src_off[k] * sstride[k];
    dof += dst_off[k] * dstride[k];
    for (int d = k + 1; d < ndim; d++) { /* offsets inside folded dims are 0 */
      so += src_off[d] * sstride[d];
      dof += dst_off[d] * dstride[d];
    }
    memcpy(t + (size_t)dof * es, s + (size_t)so * es, (size_t)run_elems * es);
    int d = k - 1;
    while (d >= 0 && ++idx[d] == box[d]) idx[d--] = 0;
    if (d < 0) break;
  }
}
