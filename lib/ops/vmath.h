/* lib/ops/vmath.h: the CPU kernels' element access and f32 vector primitives
 * (lib/device/cpu/vmath.h), for the host loops still in lib/ops. */
#ifndef DT_OPS_VMATH_H
#define DT_OPS_VMATH_H

#include "../device/cpu/vmath.h"

#endif
