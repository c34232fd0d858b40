/* lib/device/cpu/k_pw.c: the CPU device's pw kernels (element-wise, reductions, softmax, permute): host loops
 * behind the dt_kern_pw slots of lib/device/kernels.h. */
#include "config.h"

#include "device/kernels.h"

const dt_kern_pw dt_cpu_pw = {0};
