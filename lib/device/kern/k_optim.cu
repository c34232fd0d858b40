/* lib/device/kern/k_optim.cu: the dt_kern_optim group of lib/device/kernels.h, built
 * for CUDA and for the host emulator (sbk.cuh). */
#include "device/kern/sbk.cuh"

extern "C" const dt_kern_optim SBK(optim) = {
    "optim",
};
