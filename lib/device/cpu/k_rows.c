/* lib/device/cpu/k_rows.c: the CPU device's rows kernels (RMSNorm, RoPE, embedding, cross-entropy): host loops
 * behind the dt_kern_rows slots of lib/device/kernels.h. */
#include "config.h"

#include "device/kernels.h"

const dt_kern_rows dt_cpu_rows = {0};
