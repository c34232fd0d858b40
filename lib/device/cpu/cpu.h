/* lib/device/cpu/cpu.h: what the CPU kernel files share besides their tables. */
#ifndef DT_DEVICE_CPU_H
#define DT_DEVICE_CPU_H

#include "device/kernels.h"

/* The dt_kern_pw.cast contract on host memory: dst[i] = src[i] from ts to td
 * (f32, f64, bf16), through f64 (the widening is exact) and, for bf16, f32 then
 * to nearest even, as the runtime's host conversions have always done (f64 to
 * bf16 therefore rounds twice, as the CUDA kernel's store through f32 does).
 * Equal dtypes: a copy. */
dt_status dt_cpu_cast(dt_device *d, dt_dtype ts, const void *src, dt_dtype td, void *dst,
                      int64_t n);

#endif
