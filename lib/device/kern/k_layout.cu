/* lib/device/kern/k_layout.cu: the dt_kern_layout group of lib/device/kernels.h, built
 * for CUDA and for the host emulator (sbk.h). */
#include "device/kern/sbk.h"

extern "C" const dt_kern_layout SBK(layout) = {
    "layout",
};
