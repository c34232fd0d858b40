/* lib/ops/vmath.h: the CPU kernels' element access and f32 row primitives
 * (lib/device/cpu/vmath.h), for the ops' own host loops. */
#ifndef DT_OPS_VMATH_H
#define DT_OPS_VMATH_H

#include "device/cpu/vmath.h"

#endif
