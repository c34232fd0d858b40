/* lib/device/kern/k_layout.cu: the dt_kern_layout group of lib/device/kernels.h, built
 * for CUDA and for the host emulator (sbk.cuh). */
#include "device/kern/sbk.cuh"

extern "C" const dt_kern_layout SBK(layout) = {
    "layout",
};
