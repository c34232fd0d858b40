/* lib/device/cpu/k_optim.c: the CPU device's optim kernels (AdamW): host loops
 * behind the dt_kern_optim slots of lib/device/kernels.h. */
#include "config.h"

#include "device/kernels.h"

const dt_kern_optim dt_cpu_optim = {0};
