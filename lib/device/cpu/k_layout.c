/* lib/device/cpu/k_layout.c: the CPU device's layout kernels (box copies and the n-way reduce): host loops
 * behind the dt_kern_layout slots of lib/device/kernels.h. */
#include "config.h"

#include "device/kernels.h"

const dt_kern_layout dt_cpu_layout = {0};
