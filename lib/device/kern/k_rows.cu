/* lib/device/kern/k_rows.cu: row-wise kernels (the dt_kern_rows group of
 * lib/device/kernels.h), built for CUDA and for the host emulator (sbk.cuh). */
#include "device/kern/sbk.cuh"

extern "C" const dt_kern_rows SBK(rows) = {
    "rows",
};
