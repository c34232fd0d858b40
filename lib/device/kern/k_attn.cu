/* lib/device/kern/k_attn.cu: attention's row kernels (the dt_kern_attn group of
 * lib/device/kernels.h), built for CUDA and for the host emulator (sbk.cuh). */
#include "device/kern/sbk.cuh"

extern "C" const dt_kern_attn SBK(attn) = {
    "attn",
};
