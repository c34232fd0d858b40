/* The host (cuda-emu) build of k_attn.cu. */
#define SB_KERN_EMU 1
#include "device/kern/k_attn.cu"
