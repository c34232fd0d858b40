/* lib/device/kernels.h: the kernels a device runs besides GEMM, fill and axpy.
 *
 * A non-CPU device carries a table of them (dt_device_ops.kern); the ops layer
 * calls a slot when its arrays live on that device (the CPU device has no table:
 * the ops' own host loops are its kernels). Slots take the device (for its
 * stream and the rank's error record), element counts and device pointers, and
 * return DT_OK or a recorded error; they queue work on the device's stream and
 * do not wait for it. Every slot works on contiguous row-major data.
 *
 * The table is split by group so that each group's slots live with their
 * kernels (lib/device/kern/k_GROUP.cu); a NULL group or slot means unsupported.
 * The same .cu sources build twice: with nvcc for the "cuda" device, and with
 * the C++ compiler as the "cuda-emu" device (lib/device/kern/sbk.cuh), which runs
 * each kernel on the host, thread by thread, so CI checks the kernels' logic.
 */
#ifndef DT_KERNELS_H
#define DT_KERNELS_H

#include "../core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element-wise, layout and reduction kernels (k_pw.cu). */
typedef struct dt_kern_pw {
  /* y[i] = silu(x[i]) = x / (1 + exp(-x)); t: f32, f64, bf16. */
  dt_status (*silu)(dt_device *d, dt_dtype t, int64_t n, const void *x, void *y);
  /* dst[i] = src[i] converted from dtype ts to td (f32, f64, bf16; bf16 rounds to
   * nearest even). */
  dt_status (*cast)(dt_device *d, dt_dtype ts, const void *src, dt_dtype td, void *dst,
                    int64_t n);
} dt_kern_pw;

/* Row-wise kernels: norms, softmax, rope, embedding, cross-entropy, AdamW (k_rows.cu). */
typedef struct dt_kern_rows {
  const char *group;
} dt_kern_rows;

/* Attention's row kernels (k_attn.cu); the GEMMs go through dt_device_gemm. */
typedef struct dt_kern_attn {
  const char *group;
} dt_kern_attn;

/* Layout and data movement: box copies, permutes, and the element-wise reduce
 * the threads comm backend applies to device buffers (k_layout.cu). */
typedef struct dt_kern_layout {
  const char *group;
} dt_kern_layout;

/* One AdamW step's hyper-parameters, as torch.optim.AdamW's update reads them
 * (torch/optim/adamw.py, _single_tensor_adamw: decoupled decay, bias-corrected
 * moments): bc1 = 1 - beta1^step, bc2 = 1 - beta2^step, computed by the caller. */
typedef struct dt_kern_adamw_hp {
  double lr, beta1, beta2, eps, weight_decay, bc1, bc2;
} dt_kern_adamw_hp;

/* The optimizer and the training loop's helpers (k_optim.cu). */
typedef struct dt_kern_optim {
  /* One AdamW step on n elements, in f64 arithmetic (the host loop's, so f32 and
   * f64 runs match it to the last rounding but for contraction into FMAs):
   *   p = master * (1 - lr wd); m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g g;
   *   master = p - lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps).
   * master, m, v: dtype st (f32 or f64); g: dtype gt (f32, f64, bf16). master
   * NULL: w is the master (wt == st). Otherwise (mixed precision: f32 master
   * weights and moments, bf16 w) w is written from the updated master, rounded
   * to wt (f32, f64 or bf16; bf16 to nearest even from the master's f32). */
  dt_status (*adamw)(dt_device *d, int64_t n, dt_dtype st, void *master, void *m, void *v,
                     dt_dtype gt, const void *g, dt_dtype wt, void *w,
                     const dt_kern_adamw_hp *hp);
} dt_kern_optim;

typedef struct dt_kernels {
  const char *name; /* "cuda", "cuda-emu" */
  const dt_kern_pw *pw;
  const dt_kern_rows *rows;
  const dt_kern_attn *attn;
  const dt_kern_layout *layout;
  const dt_kern_optim *optim;
} dt_kernels;

/* The emulated device's pointers are host addresses plus this: the sum is
 * outside every user-space address (non-canonical on x86-64; bit 55 selects
 * the kernel half on AArch64, above its ignored top byte), so a host
 * dereference of emulated device memory faults at once. */
#define DT_EMU_TAG ((uintptr_t)1 << 55)

/* For kernel sources: the CUDA device's stream, with its GPU made current on
 * the calling thread; NULL (error recorded on d's rank) on failure. */
void *dt_device_cuda_stream(dt_device *d);

/* The two builds of the same kernels: on the GPU (NULL-free only when built
 * with CUDA) and on the host. */
extern const dt_kernels dt_kernels_cuda;
extern const dt_kernels dt_kernels_emu;

#ifdef __cplusplus
}
#endif
#endif
