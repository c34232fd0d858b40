/* lib/ops/vmath.h: the element access and f32 row primitives of the CPU
 * kernels (lib/device/cpu/vmath.h), for the ops' remaining host loops. */
#ifndef DT_OPS_VMATH_H
#define DT_OPS_VMATH_H

#include "../device/cpu/vmath.h"

#endif
