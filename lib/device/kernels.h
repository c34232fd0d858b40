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

/* Where attention's row kernels find their rows. Scores: `batch` blocks of
 * `rows` rows of `nk` keys; row r of block b starts at element b stride + r ld
 * of the score buffer, and sees keys [0, min(nk, vis0 + r)) (causal block whose
 * first query row is at key index vis0 - 1: vis0 = r0 + 1; no mask: vis0 >= nk);
 * the keys it does not see are set to 0. Per-row statistics (running max m, sum
 * l, lse, D) of row r of block b are element b sstride + r sld of their arrays. */
typedef struct dt_attn_rows {
  int64_t batch, rows, nk, vis0;
  int64_t ld, stride;
  int64_t sld, sstride;
} dt_attn_rows;

/* Attention's row kernels (k_attn.cu); the GEMMs go through dt_device_gemm.
 * t: the dtype of the scores and of q, k, v, out (f32, f64, bf16); the running
 * statistics m, l and D are in its arithmetic type (f64 for f64, else f32),
 * lse in t. They implement the query-chunked attention of Rabe & Staats, "Self-
 * attention does not need O(n^2) memory" (2021), sec. 2-3, with the log-sum-exp
 * bookkeeping of FlashAttention-2 (Dao 2023, Alg. 1 forward, Alg. 2 backward). */
typedef struct dt_kern_attn {
  /* Row softmax of the scores in place (max-subtracted), masked keys 0. */
  dt_status (*softmax)(dt_device *d, dt_dtype t, const dt_attn_rows *g, void *P);
  /* dS = P (dP - rowsum(dP P)) in place over dP (P the softmax rows); masked 0. */
  dt_status (*softmax_bwd)(dt_device *d, dt_dtype t, const dt_attn_rows *g, const void *P,
                           void *dP);
  /* One online-softmax step over a key block (FlashAttention-2 Alg. 1, lines
   * 8-10): mx = max(m, row max), P = exp(P - mx) (masked 0), l = l e^(m - mx) +
   * rowsum(P), m = mx, and the hd values of the row's unnormalised output
   * (row r of block b at O + b ostride + r old) scaled by e^(m_old - mx). */
  dt_status (*online)(dt_device *d, dt_dtype t, const dt_attn_rows *g, void *P, void *m, void *l,
                      void *O, int64_t old, int64_t ostride, int64_t hd);
  /* The end of the online softmax over n contiguous rows of hd values:
   * O[i] /= l[i], lse[i] = m[i] + log l[i]. */
  dt_status (*finish)(dt_device *d, dt_dtype t, int64_t n, int64_t hd, void *O, const void *m,
                      const void *l, void *lse);
  /* D[i] = rowsum(dO[i] * O[i]) over n contiguous rows of hd values
   * (FlashAttention-2 Alg. 2, line 4). */
  dt_status (*rowdot)(dt_device *d, dt_dtype t, int64_t n, int64_t hd, const void *dO,
                      const void *O, void *D);
  /* The backward from a saved lse (FlashAttention-2 Alg. 2, lines 11-14), in
   * place: P = exp(P - lse) over the raw scaled scores, then
   * dS = P (dS - D) over dS = dO V^T; masked keys 0 in both. */
  dt_status (*lse_bwd)(dt_device *d, dt_dtype t, const dt_attn_rows *g, void *P, void *dS,
                       const void *lse, const void *D);
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
