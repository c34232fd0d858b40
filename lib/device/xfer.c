/* lib/device/xfer.c: see xfer.h. The host/device distinction of the layers
 * above lives here: a copy's kind (H2H, H2D, D2H, D2D) follows from where its
 * two ends are. */
#include "config.h"

#include <string.h>

#include "device/kernels.h"
#include "device/xfer.h"

dt_device_kind dt_device_home(const dt_ctx *ctx) {
  return ctx && ctx->device ? ctx->device->kind : DT_DEV_CPU;
}

static dt_copy_kind within(const dt_device *d) {
  return d->kind == DT_DEV_CPU ? DT_COPY_H2H : DT_COPY_D2D;
}

dt_status dt_device_move(dt_device *d, void *dst, const void *src, size_t bytes) {
  if (!d) return DT_ERR_INVALID;
  dt_kledger_kernel(d->ctx, "copy", DT_F32, 0, bytes, bytes);
  return dt_device_copy(d, dst, src, bytes, within(d));
}

/* dt_device_fill without its compute-ledger row (the caller records one). */
static dt_status fill_unrecorded(dt_device *d, dt_dtype t, void *x, int64_t n, double value) {
  if (!d->ops->fill)
    return dt_error(d->ctx, DT_ERR_UNSUPPORTED, "dt_device_zero", "device '%s' has no fill",
                    d->ops->name);
  return n > 0 ? d->ops->fill(d, t, x, n, value) : DT_OK;
}

dt_status dt_device_zero(dt_device *d, void *p, size_t bytes) {
  if (!d) return DT_ERR_INVALID;
  if (!bytes) return DT_OK;
  /* one compute-ledger row on every device (the pieces below are not recorded) */
  dt_kledger_kernel(d->ctx, "fill", DT_F32, 0, 0, bytes);
  if (d->kind == DT_DEV_CPU) {
    memset(p, 0, bytes);
    return DT_OK;
  }
  /* +0.0 is all zero bits in every float dtype: whole words, then the tail */
  char *c = p;
  const size_t words = bytes / 8;
  size_t at = words * 8;
  DT_CHECK(fill_unrecorded(d, DT_F64, c, (int64_t)words, 0.0));
  if (bytes - at >= 4) {
    DT_CHECK(fill_unrecorded(d, DT_F32, c + at, 1, 0.0));
    at += 4;
  }
  if (bytes - at >= 2) {
    DT_CHECK(fill_unrecorded(d, DT_BF16, c + at, 1, 0.0));
    at += 2;
  }
  static const unsigned char zero = 0;
  return at < bytes ? dt_device_copy(d, c + at, &zero, 1, DT_COPY_H2D) : DT_OK;
}

dt_status dt_device_convert(dt_device *d, dt_dtype ts, const void *src, dt_dtype td, void *dst,
                            int64_t n) {
  if (!d) return DT_ERR_INVALID;
  if (n <= 0) return DT_OK;
  if (ts == td) return dt_device_move(d, dst, src, (size_t)n * dt_dtype_size(td));
  const dt_kernels *K = d->ops->kern;
  dt_status (*cast)(dt_device *, dt_dtype, const void *, dt_dtype, void *, int64_t) =
      K && K->pw ? K->pw->cast : NULL;
  if (!cast)
    return dt_error(d->ctx, DT_ERR_UNSUPPORTED, "dt_device_convert",
                    "device '%s' has no cast kernel", d->ops->name);
  dt_kledger_kernel(d->ctx, "cast", td, 0, (uint64_t)n * dt_dtype_size(ts),
                    (uint64_t)n * dt_dtype_size(td));
  return cast(d, ts, src, td, dst, n);
}

dt_status dt_array_copy_to(dt_ctx *ctx, const dt_array *src, dt_device_kind kind, const char *who,
                           dt_array *out) {
  memset(out, 0, sizeof *out);
  /* the device on the far side, when either end is not host memory */
  dt_device *d = NULL;
  if (src->dev != DT_DEV_CPU || kind != DT_DEV_CPU) {
    const dt_device_kind k = src->dev != DT_DEV_CPU ? src->dev : kind;
    if ((src->dev != DT_DEV_CPU && kind != DT_DEV_CPU && src->dev != kind) || !ctx ||
        !ctx->device || ctx->device->kind != k)
      return dt_error(ctx, DT_ERR_UNSUPPORTED, who,
                      "an array moves between host memory and this rank's device only");
    d = ctx->device;
  }
  DT_CHECK(dt_array_create(ctx, kind, src->dtype, src->ndim, src->shape, out));
  const size_t bytes = dt_array_bytes(src);
  if (!bytes) return DT_OK;
  dt_status s = DT_OK;
  if (!d) {
    memcpy(out->data, src->data, bytes);
  } else {
    const dt_copy_kind ck = src->dev == DT_DEV_CPU ? DT_COPY_H2D
                            : kind == DT_DEV_CPU   ? DT_COPY_D2H
                                                   : DT_COPY_D2D;
    s = dt_device_copy(d, out->data, src->data, bytes, ck);
    if (s == DT_OK && ck == DT_COPY_D2H) s = dt_device_sync(d);
  }
  if (s != DT_OK) dt_array_free(ctx, out);
  return s;
}

dt_status dt_array_place(dt_ctx *ctx, dt_array *a, dt_device_kind kind, const char *who) {
  if (a->dev == kind) return DT_OK;
  dt_array b;
  DT_CHECK(dt_array_copy_to(ctx, a, kind, who, &b));
  dt_array_free(ctx, a);
  *a = b;
  return DT_OK;
}

dt_status dt_array_stage(dt_ctx *ctx, const dt_array *a, dt_array *h) {
  if (a->dev == DT_DEV_CPU) return dt_array_wrap(ctx, DT_DEV_CPU, a->dtype, a->ndim, a->shape, a->data, h);
  return dt_array_create(ctx, DT_DEV_CPU, a->dtype, a->ndim, a->shape, h);
}

dt_status dt_array_stage_end(dt_ctx *ctx, dt_array *a, dt_array *h) {
  dt_status s = DT_OK;
  if (a->dev != DT_DEV_CPU && dt_array_bytes(h)) {
    if (!ctx->device || ctx->device->kind != a->dev)
      s = dt_error(ctx, DT_ERR_UNSUPPORTED, "dt_array_stage_end", "no device of the array's kind");
    else
      s = dt_device_copy(ctx->device, a->data, h->data, dt_array_bytes(h), DT_COPY_H2D);
  }
  dt_array_free(ctx, h);
  return s;
}
