/* lib/device/xfer.h: moving data within a device's memory and across between a
 * rank's host memory and its device.
 *
 * The layers above have one code path for every device: they call a device's
 * slots through dt_device_kernels (kernels.h) and the functions here, which are
 * the only places that know whether an array is host memory. On the CPU device
 * (and for host arrays on any rank) every function is a host copy or nothing:
 * placing a host array on the CPU moves no byte and allocates nothing, so a CPU
 * run's memory is what its arrays need and no more. */
#ifndef DT_XFER_H
#define DT_XFER_H

#include "../core/core.h"
#include "device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The kind of memory ctx's rank computes in: its device's, host memory
 * (DT_DEV_CPU) when it has none. */
dt_device_kind dt_device_home(const dt_ctx *ctx);

/* ---- within one device's memory ---- */

/* bytes from src to dst, both d's memory (D2D; on the CPU a host copy). They
 * must not overlap. */
dt_status dt_device_move(dt_device *d, void *dst, const void *src, size_t bytes);
/* bytes of d's memory at p set to zero bits (the value 0 of every dtype). */
dt_status dt_device_zero(dt_device *d, void *p, size_t bytes);
/* n elements from src (dtype ts) to dst (td), both d's memory: a move when the
 * dtypes are equal, else the device's pw cast (f32, f64, bf16; bf16 rounds to
 * nearest even). */
dt_status dt_device_convert(dt_device *d, dt_dtype ts, const void *src, dt_dtype td, void *dst,
                            int64_t n);

/* ---- across, for a rank's arrays ---- */

/* out: a new array of kind `kind` holding src's values, src host memory or the
 * rank's device memory (H2H, H2D, D2H, D2D; complete on return).
 * DT_ERR_UNSUPPORTED (recorded, naming who) when the rank has no device of
 * src's or of that kind. */
dt_status dt_array_copy_to(dt_ctx *ctx, const dt_array *src, dt_device_kind kind, const char *who,
                           dt_array *out);
/* *a replaced by a copy of itself in memory of kind `kind` (the old data freed);
 * nothing when it is there already (a host array placed on the host, on a CPU
 * rank: no copy). On failure *a is unchanged. */
dt_status dt_array_place(dt_ctx *ctx, dt_array *a, dt_device_kind kind, const char *who);

/* Host staging of an array that is written on the host (values assembled or
 * read from a file): *h is a itself (not owned, nothing allocated) when a is
 * host memory, else a new host array of a's shape and dtype (its values
 * undefined). dt_array_stage_end then uploads h into a when they differ, and
 * frees h. */
dt_status dt_array_stage(dt_ctx *ctx, const dt_array *a, dt_array *h);
dt_status dt_array_stage_end(dt_ctx *ctx, dt_array *a, dt_array *h);

#ifdef __cplusplus
}
#endif
#endif
