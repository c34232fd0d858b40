/* lib/dtensor/tensor_impl.h: internals shared by tensor.c and redistribute.c.
 * Private to lib/dtensor: not installed. */
#ifndef DT_TENSOR_IMPL_H
#define DT_TENSOR_IMPL_H

#include "../dtensor/dtensor.h"

/* x /= n element-wise on a host array (R -> P(sum) partition); i64 is left alone. */
void dt_array_div(dt_array *x, double n);

#endif
