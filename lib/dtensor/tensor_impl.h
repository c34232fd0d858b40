/* lib/dtensor/tensor_impl.h: internals shared by tensor.c and redistribute.c.
 * Private to lib/dtensor: not installed.
 *
 * A DTensor's local shard lives on the rank's compute device (dt_tensor_home):
 * host memory on a CPU rank, device memory otherwise. The helpers below move and
 * reshape shard data where it lives, through that device's layout kernels and
 * copies (dt_device_kernels; the CPU's are host loops), one path for all. */
#ifndef DT_TENSOR_IMPL_H
#define DT_TENSOR_IMPL_H

#include "../dtensor/dtensor.h"

/* x /= n element-wise (R -> P(sum) partition), where x lives; i64 is left
 * alone. */
dt_status dt_array_div(dt_ctx *ctx, dt_array *x, double n);

/* dt_copy_box on memory of kind dev (that device's copy_box kernel). */
dt_status dt_box_copy(dt_ctx *ctx, dt_device_kind dev, size_t es, int ndim, void *dst,
                      const int64_t *dst_shape, const int64_t *dst_off, const void *src,
                      const int64_t *src_shape, const int64_t *src_off, const int64_t *box);
/* bytes from src to dst, both of kind dev. */
dt_status dt_mem_copy(dt_ctx *ctx, dt_device_kind dev, void *dst, const void *src, size_t bytes);

/* Scratch memory of kind dev for one step (at least one byte; zeroed when asked). */
typedef struct dt_scratch {
  void *p;
  size_t bytes;
  dt_device_kind dev;
} dt_scratch;
dt_status dt_scratch_get(dt_ctx *ctx, dt_device_kind dev, size_t bytes, bool zero, dt_scratch *s);
void dt_scratch_put(dt_ctx *ctx, dt_scratch *s);

#endif
