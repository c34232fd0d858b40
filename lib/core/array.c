/* lib/core/array.c: dt_array, a contiguous row-major local tensor on one device.
 * Allocation on a CUDA array goes through the rank's device (ctx->device). */
#include "config.h"

#include <string.h>

#include "core/core.h"
#include "device/device.h"

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
    if (!ctx || !ctx->device || ctx->device->kind != dev)
      return dt_error(ctx, DT_ERR_INVALID, "dt_array_create",
                      "no device of the requested kind on this rank");
    DT_CHECK(dt_device_alloc(ctx->device, bytes, &out->data));
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
    else if (ctx && ctx->device) dt_device_free(ctx->device, a->data, dt_array_bytes(a));
  }
  a->data = NULL;
  a->owns = false;
}

size_t dt_array_bytes(const dt_array *a) {
  return (size_t)a->numel * dt_dtype_size(a->dtype);
}
