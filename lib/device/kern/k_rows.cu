/* lib/device/kern/k_rows.cu: row-wise kernels (the dt_kern_rows group of
 * lib/device/kernels.h), built for CUDA and for the host emulator (sbk.h). */
#include "device/kern/sbk.h"

extern "C" const dt_kern_rows SBK(rows) = {
    "rows",
};
