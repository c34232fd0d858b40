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
 * the C++ compiler as the "cuda-emu" device (lib/device/kern/sbk.h), which runs
 * each kernel on the host, thread by thread, so CI checks the kernels' logic.
 */
#ifndef DT_KERNELS_H
#define DT_KERNELS_H

#include "../core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The element-wise ops of dt_kern_pw.binary, on (a, b) in the arithmetic type. */
typedef enum dt_pw_op {
  DT_PW_ADD = 0,      /* a + b */
  DT_PW_SUB = 1,      /* a - b */
  DT_PW_MUL = 2,      /* a * b */
  DT_PW_SWIGLU = 3,   /* silu(a) * b */
  DT_PW_SILU_GRAD = 4 /* b * silu'(a) = b s (1 + a (1 - s)), s = sigmoid(a) */
} dt_pw_op;

/* Element-wise, layout and reduction kernels (k_pw.cu). Floating slots take
 * f32, f64 and bf16 and compute in f32 for f32 and bf16, in f64 for f64 (the
 * reductions: see reduce). Shapes and strides are host arrays (read at the
 * call); x, y, a, b, g, da, db are device pointers. */
typedef struct dt_kern_pw {
  /* y[i] = silu(x[i]) = x / (1 + exp(-x)); t: f32, f64, bf16. */
  dt_status (*silu)(dt_device *d, dt_dtype t, int64_t n, const void *x, void *y);
  /* dst[i] = src[i] converted from dtype ts to td (f32, f64, bf16; bf16 rounds to
   * nearest even). */
  dt_status (*cast)(dt_device *d, dt_dtype ts, const void *src, dt_dtype td, void *dst,
                    int64_t n);
  /* y[i] = alpha * x[i] (alpha rounded to the arithmetic type); y may be x. */
  dt_status (*scale)(dt_device *d, dt_dtype t, int64_t n, double alpha, const void *x, void *y);
  /* y = op(a, b) over y's shape[0..nd) (nd <= DT_MAX_DIMS, y contiguous), operand
   * element j at index (i_0..i_nd-1) read at sum_k i_k sa[k] (b: sb): numpy
   * broadcasting is a 0 stride on the dims an operand stretches or lacks. */
  dt_status (*binary)(dt_device *d, dt_dtype t, dt_pw_op op, int nd, const int64_t *shape,
                      const void *a, const int64_t *sa, const void *b, const int64_t *sb,
                      void *y);
  /* The fused SwiGLU backward over n elements: s = sigmoid(a),
   * db = g a s, da = g b s (1 + a (1 - s)). */
  dt_status (*swiglu_bwd)(dt_device *d, dt_dtype t, int64_t n, const void *a, const void *b,
                          const void *g, void *da, void *db);
  /* y[o, i] = alpha * sum_r x[o, r, i] over x viewed as [outer, red, inner]
   * (y: [outer, inner]); tx, ty in f32, f64, bf16 (a multi-axis reduction keeps
   * bf16's intermediates in f32). Sums in f64 for f32 and f64 input (as the host
   * kernels), in f32 for bf16; alpha multiplies the sum in that type. red == 0
   * gives 0 (times alpha: NaN for a mean's 1/0, as the host's 0/0). */
  dt_status (*reduce)(dt_device *d, dt_dtype tx, const void *x, dt_dtype ty, void *y,
                      int64_t outer, int64_t red, int64_t inner, double alpha);
  /* Softmax over the middle axis of x viewed as [outer, L, inner], with the
   * row maximum subtracted: y = exp(x - max) / sum exp(x - max). One block per
   * row (o, i). */
  dt_status (*softmax)(dt_device *d, dt_dtype t, int64_t outer, int64_t L, int64_t inner,
                       const void *x, void *y);
  /* Its backward on the same view: dx = y (dy - sum_L dy y). */
  dt_status (*softmax_bwd)(dt_device *d, dt_dtype t, int64_t outer, int64_t L, int64_t inner,
                           const void *y, const void *dy, void *dx);
  /* The strided gather y[i_0..i_nd-1] = x[off + sum_k i_k st[k]] over y's
   * shape[0..nd) (y contiguous), elements of es bytes (1, 2, 4, 8; a byte move):
   * a permute or transpose (st: x's strides in y's dim order), a broadcast (0
   * strides), a sub-box (off). x and y must not overlap. */
  dt_status (*permute)(dt_device *d, size_t es, int nd, const int64_t *shape, const int64_t *st,
                       int64_t off, const void *x, void *y);
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

/* The optimizer and the training loop's helpers: AdamW, gradient norms (k_optim.cu). */
typedef struct dt_kern_optim {
  const char *group;
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
