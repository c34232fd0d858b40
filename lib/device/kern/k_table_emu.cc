/* The host (cuda-emu) build of k_table.cu. */
#define SB_KERN_EMU 1
#include "device/kern/k_table.cu"
