/* A second host (cuda-emu) build of k_attn.cu at CUDA's block sizes (256 and
 * 128 threads), so the tests exercise the launch shape the GPU runs; the
 * cuda-emu device's own table keeps the emulator's 32 (k_attn_emu.cc). */
#define SB_KERN_EMU 1
#define SBK_EMU_CUDA_BLOCKS 1
#include "device/kern/k_attn.cu"
