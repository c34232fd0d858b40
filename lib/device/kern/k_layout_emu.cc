/* The host (cuda-emu) build of k_layout.cu. */
#define SB_KERN_EMU 1
#include "device/kern/k_layout.cu"
