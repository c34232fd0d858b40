/* lib/device/cpu/k_attn.c: the CPU device's attn kernels (attention): host loops
 * behind the dt_kern_attn slots of lib/device/kernels.h. */
#include "config.h"

#include "device/kernels.h"

const dt_kern_attn dt_cpu_attn = {0};
