/* lib/device/kern/k_table.cu: the kernel table of the cuda device (nvcc) or of
 * the cuda-emu device (SB_KERN_EMU). */
#include "device/kern/sbk.cuh"

extern "C" {
extern const dt_kern_pw SBK(pw);
extern const dt_kern_rows SBK(rows);
extern const dt_kern_attn SBK(attn);
extern const dt_kern_layout SBK(layout);
extern const dt_kern_optim SBK(optim);
}

#ifdef SB_KERN_EMU
extern "C" const dt_kernels dt_kernels_emu = {"cuda-emu", &SBK(pw), &SBK(rows), &SBK(attn),
                                      &SBK(layout), &SBK(optim), false, false};
#else
extern "C" const dt_kernels dt_kernels_cuda = {"cuda", &SBK(pw), &SBK(rows), &SBK(attn),
                                      &SBK(layout), &SBK(optim), false, false};
#endif
