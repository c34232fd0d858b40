/* lib/device/kernels.h: the kernels a device runs besides GEMM, fill and axpy.
 *
 * Every device carries a table of them (dt_device_ops.kern): the CPU's host
 * loops (lib/device/cpu/k_GROUP.c, dt_kernels_cpu), the CUDA kernels
 * (lib/device/kern/k_GROUP.cu) built by nvcc for "cuda" and by the C++ compiler
 * for "cuda-emu" (lib/device/kern/sbk.cuh runs each kernel on the host, thread by
 * thread, so CI checks the kernels' logic). An op, a layout copy or an FSDP pack
 * calls the slot of the device its arrays live on (dt_device_kernels) and has no
 * host/device branch of its own. Slots take the device (for its stream and the
 * rank's error record), element counts and pointers into that device's memory,
 * and return DT_OK or a recorded error; on a GPU they queue work on the device's
 * stream and do not wait for it. Every slot works on contiguous row-major data
 * unless it says otherwise.
 *
 * Arithmetic: a slot's contract says what it computes in; where the CPU's loop
 * sums in f64 for f32 data (its kernels keep the arithmetic the runtime's host
 * loops have always had) the slot says so, and the GPU builds may sum in f32.
 *
 * The table is split by group so that each group's slots live with their
 * kernels; a NULL group or slot means unsupported.
 */
#ifndef DT_KERNELS_H
#define DT_KERNELS_H

#include "../core/core.h"
#include "device.h"

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

/* Most summed dims of dt_kern_pw.contract (every letter of two operands). */
enum { DT_KERN_MAX_SUM = 2 * DT_MAX_DIMS };

/* Element-wise, layout and reduction kernels (k_pw.cu on the GPU builds,
 * cpu/k_pw.c on the CPU). Floating slots take f32, f64 and bf16 and compute in
 * f32 for f32 and bf16, in f64 for f64 (the reductions: see reduce). Shapes and
 * strides are host arrays (read at the call); x, y, a, b, g, da, db are device
 * pointers.
 *
 * The CPU's slots are the runtime's host loops: they take f32 and f64 (its
 * table sets bf16_as_f32, so the dispatcher hands them bf16 ops as f32 copies;
 * cast and permute take bf16 too) and compute in f64 for f32 as well, rounding
 * once to f32, except silu and the silu / swiglu kinds of binary and swiglu_bwd
 * on same-shape f32 operands, which run in f32 on vmath.h's vector exp (within
 * a few f32 ulps of the f64 form). Their sums are in f64, in the order each
 * slot states. */
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
   * (y: [outer, inner]); tx, ty in f32, f64, bf16. Sums in f64 for f32 and f64
   * input, in f32 for bf16 (the CPU: in f64, in r's order); alpha multiplies the
   * sum in that type. (The ops' sum and mean use sum_dims.) red == 0
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
  /* The sum of contiguous x (shape[0..nd), nd <= DT_MAX_DIMS) over the dims
   * whose bit is set in dims (bit k: dim k), divided by div (1 for a sum, the
   * count for a mean): y, contiguous, holds x's other dims in order (a size-1
   * dim where a reduced one was, or none: the same elements). tx, ty: f32,
   * f64, bf16. Sums in f64 for f32 and f64 input, in f32 for bf16 (the CPU: in
   * f64, adding the elements in x's row-major order, from 0); then one
   * division by div in that type. No dim reduced: y = (0 + x) / div; an empty
   * reduction gives 0 / div (NaN for a mean's 0 / 0, as torch.mean of an
   * empty tensor). */
  dt_status (*sum_dims)(dt_device *d, dt_dtype tx, int nd, const int64_t *shape, uint32_t dims,
                        const void *x, dt_dtype ty, void *y, double div);
  /* The naive contraction of two operands (an einsum with a letter summed in
   * one input only, which no GEMM maps): over y's oshape[0..no) (no <=
   * DT_MAX_DIMS, y contiguous),
   *   y[i] = sum over j in sshape[0..ns) of a[i.oa + j.sa] * b[i.ob + j.sb]
   * with i.oa = sum_k i_k oa[k] (a letter an operand lacks has stride 0 there),
   * j in row-major order (ns <= DT_KERN_MAX_SUM; ns 0: one product). t: f32,
   * f64, bf16. Sums in f64 for f32 and f64, in f32 for bf16 (the CPU: in f64,
   * from 0, in j's order). */
  dt_status (*contract)(dt_device *d, dt_dtype t, int no, const int64_t *oshape,
                        const int64_t *oa, const int64_t *ob, int ns, const int64_t *sshape,
                        const int64_t *sa, const int64_t *sb, const void *a, const void *b,
                        void *y);
} dt_kern_pw;

/* RoPE on x [b, s, h, hd] (interleaved pairs (2i, 2i+1) rotated by pos * freq_i,
 * freq_i = theta^(-2i/hd), with the Llama 3.1 scaling when scaling = 1; the
 * stored row t of the local shard is at global position
 * seq_position(pos0 + t, gs, n_chunks), the ops' dt_seq_position). */
typedef struct dt_kern_rope_args {
  int64_t b, s, h, hd;   /* local shape; hd even and whole */
  int64_t pos0, gs;      /* the shard's sequence offset, the global sequence */
  int n_chunks;          /* storage order (0 or 1 natural, else head-tail chunks) */
  int scaling;           /* 1: Llama 3.1 frequency scaling */
  double theta;          /* > 0 */
  double sign;           /* +1 forward, -1 backward (rotation by -angle) */
} dt_kern_rope_args;

/* Row-wise kernels: RMSNorm, RoPE, embedding, cross-entropy. On the GPU builds
 * (k_rows.cu) one block per row; bf16 data computes in f32, f32 in f32, f64 in
 * f64, except where a slot says otherwise. On the CPU (cpu/k_rows.c) f32 and
 * f64 only (bf16: DT_ERR_UNSUPPORTED), every element computed in f64 and
 * rounded once to the stored type, every sum an f64 in index order; f32
 * exponentials (cross-entropy) on the f32 vector exp of cpu/vmath.h (within 2
 * ulps). */
typedef struct dt_kern_rows {
  /* RMSNorm over rows of dim: y = x / sqrt(mean(x^2) + eps) * w; x, w, y of
   * dtype t (f32, f64, bf16). */
  dt_status (*rms_fwd)(dt_device *d, dt_dtype t, int64_t rows, int64_t dim, double eps,
                       const void *x, const void *w, void *y);
  /* Its backward, with r = 1 / sqrt(mean(x^2) + eps), xh = x r, g = w dy:
   *   dx = (g - xh mean(g xh)) r;  gxh = dy xh (element-wise; may be NULL);
   *   dw[k] = sum over rows of dy xh (may be NULL; needs ws, dt_kern_rms_ws bytes
   *   of device scratch: per-row r, then per-chunk column sums reduced in a fixed
   *   order, so dw is the same on every run, for every dtype; the CPU sums the
   *   same chunks in f64). The ops take gxh and sum it with the sum op instead,
   *   so that a Shard of an outer dim gives a Partial dweight. */
  dt_status (*rms_bwd)(dt_device *d, dt_dtype t, int64_t rows, int64_t dim, double eps,
                       const void *x, const void *w, const void *dy, void *dx, void *gxh,
                       void *dw, void *ws);
  /* y = rope(x) (a.sign = -1: the backward); t: f32, f64, bf16. Angles and
   * their cos / sin in f64. */
  dt_status (*rope)(dt_device *d, dt_dtype t, const dt_kern_rope_args *a, const void *x,
                    void *y);
  /* Embedding rows: y[i, :] = w[ids[i] - off, :] when 0 <= ids[i] - off < rows,
   * else 0 (a vocab shard of rows rows at offset off); w [rows, cols], y [n, cols]
   * of dtype t; ids i64. */
  dt_status (*embedding)(dt_device *d, dt_dtype t, int64_t n, const int64_t *ids, int64_t rows,
                         int64_t cols, int64_t off, const void *w, void *y);
  /* Its backward: gw (dtype tw: f32, f64) = 0, then gw[ids[i] - off, :] += g[i, :]
   * for the ids held (g dtype tg: f32, f64, bf16), by atomic adds (order, and so
   * f32 / f64 rounding, may vary between runs on the GPU when ids repeat; the
   * CPU adds in the order of i, each add in f64 rounded to tw). */
  dt_status (*embedding_bwd)(dt_device *d, dt_dtype tg, int64_t n, const int64_t *ids,
                             const void *g, int64_t rows, int64_t cols, int64_t off, dt_dtype tw,
                             void *gw);
  /* Cross-entropy statistics of logits x [npos, V] (dtype t; a vocab shard at
   * offset voff), f64 per position: ce_max: mx = max over the row. ce_sumexp:
   * (when find_max, mx as ce_max first) se = sum exp(x - mx) (exp in the
   * arithmetic type, summed in f64), tl = x[p, tg[p] - voff] when held, else 0.
   * The CPU's f32 exp is the vector exp, in chunks of 256 summed in f64. */
  dt_status (*ce_max)(dt_device *d, dt_dtype t, int64_t npos, int64_t V, const void *x,
                      double *mx);
  dt_status (*ce_sumexp)(dt_device *d, dt_dtype t, int64_t npos, int64_t V, int64_t voff,
                         const void *x, const int64_t *tg, bool find_max, double *mx,
                         double *se, double *tl);
  /* lse = log(se) + mx; loss[0] (dtype t) = sum(lse - tl) / n_total, summed in
   * f64 by one block in a fixed order. */
  dt_status (*ce_loss)(dt_device *d, dt_dtype t, int64_t npos, double n_total, const double *mx,
                       const double *se, const double *tl, double *lse, void *loss);
  /* dx = (exp(x - lse) - onehot(tg - voff)) * grad[0] / n_total; x, dx, grad of
   * dtype t (grad a device scalar: no host read). The CPU's f32: exp(x - lse32)
   * by the vector exp times exp(lse32 - lse) in f64, lse32 = (float)lse. */
  dt_status (*ce_bwd)(dt_device *d, dt_dtype t, int64_t npos, int64_t V, int64_t voff,
                      const void *x, const int64_t *tg, const double *lse, const void *grad,
                      double n_total, void *dx);
  /* DT_ERR_INVALID (recorded, naming who: "index I out of range [0, hi)") at
   * the first of ids[0..n) outside [0, hi). Optional: NULL where checking would
   * read the ids back to the host (the GPU builds), and there an id outside a
   * table gives zero rows or no target logit, never a fault. */
  dt_status (*check_ids)(dt_device *d, const char *who, int64_t n, const int64_t *ids,
                         int64_t hi);
} dt_kern_rows;

/* rms_bwd's dw: rows are summed in chunks of at least DT_KERN_RMS_CHUNK_ROWS,
 * at most DT_KERN_RMS_CHUNKS chunks (a function of the shape only, so the sum's
 * order does not depend on the device). */
#define DT_KERN_RMS_CHUNK_ROWS ((int64_t)64)
#define DT_KERN_RMS_CHUNKS ((int64_t)64)
static inline int64_t dt_kern_rms_chunks(int64_t rows) {
  int64_t c = (rows + DT_KERN_RMS_CHUNK_ROWS - 1) / DT_KERN_RMS_CHUNK_ROWS;
  return c < 1 ? 1 : c > DT_KERN_RMS_CHUNKS ? DT_KERN_RMS_CHUNKS : c;
}
/* Bytes of the scratch rms_bwd needs when it computes dw. */
static inline size_t dt_kern_rms_ws(int64_t rows, int64_t dim) {
  return (size_t)(rows + dt_kern_rms_chunks(rows) * dim) * sizeof(double);
}

/* Attention's row kernels: the CPU's loops (cpu/k_attn.c) and the CUDA kernels
 * (kern/k_attn.cu); the GEMMs between them go through dt_device_gemm.
 * Where they find their rows. Scores: `batch` blocks of `rows` rows of `nk`
 * keys; row r of block b starts at element b stride + r ld of the score buffer,
 * and sees keys [0, min(nk, vis0 + r)) (causal block whose first query row is
 * at key index vis0 - 1: vis0 = r0 + 1; no mask: vis0 >= nk); the keys it does
 * not see are set to 0. Per-row statistics (running max m, sum l, lse, D) of
 * row r of block b are element b sstride + r sld of their arrays. */
typedef struct dt_attn_rows {
  int64_t batch, rows, nk, vis0;
  int64_t ld, stride;
  int64_t sld, sstride;
} dt_attn_rows;

/* Attention's row kernels and how the device wants its blocks. They implement
 * the query-chunked attention of Rabe & Staats, "Self-attention does not need
 * O(n^2) memory" (2021), sec. 2-3, with the log-sum-exp bookkeeping of
 * FlashAttention-2 (Dao 2023, Alg. 1 forward, Alg. 2 backward); the ops
 * (sdpa, sdpa_cp) compose them with dt_device_gemm the same way on every
 * device, so a device's numbers follow from its GEMM, these slots and the
 * blocking fields below.
 *
 * t: the dtype of the scores and of q, k, v, out, lse (f32, f64; bf16 on the
 * CUDA builds, where the ops pass f32 scores for bf16 data). The statistics
 * m, l and D are of dt_kern_attn_stat(table, t): f64 when stats_f64, else the
 * arithmetic type (f64 for f64, f32 for f32 and bf16).
 * Arithmetic: the CUDA builds compute in the arithmetic type, a row's
 * reductions by its block of threads through shared memory (a tree). The CPU
 * keeps the host loops the ops always ran: f64 in plain loops with exp, sums
 * left to right; f32 on lib/device/cpu/vmath.h (its exp within 2 ulps, sums
 * and dot products in double in four chains: softmax's sum, softmax_bwd's and
 * rowdot's row sums, online's l), the statistics in f64. */
typedef struct dt_kern_attn {
  /* Row softmax of the scores in place (max-subtracted): p = exp(s - max) and
   * p *= 1 / sum p; masked keys 0. */
  dt_status (*softmax)(dt_device *d, dt_dtype t, const dt_attn_rows *g, void *P);
  /* dS = P (dP - rowsum(dP P)) in place over dP (P the softmax rows); masked 0. */
  dt_status (*softmax_bwd)(dt_device *d, dt_dtype t, const dt_attn_rows *g, const void *P,
                           void *dP);
  /* One online-softmax step over a key block (FlashAttention-2 Alg. 1, lines
   * 8-10): mx = max(m, row max), P = exp(P - mx) (masked 0), l = l e^(m - mx) +
   * rowsum(P), m = mx, and the hd values of the row's unnormalised output
   * (row r of block b at O + b ostride + r old) scaled by e^(m_old - mx)
   * (left alone when that is 1). */
  dt_status (*online)(dt_device *d, dt_dtype t, const dt_attn_rows *g, void *P, void *m, void *l,
                      void *O, int64_t old, int64_t ostride, int64_t hd);
  /* The end of the online softmax over n contiguous rows of hd values (sdpa_cp:
   * the whole local output, in either layout; m, l, lse in the same row order):
   * O[i] *= 1 / l[i] (the reciprocal in the statistics' type, rounded to t),
   * lse[i] = m[i] + log l[i] (rounded to t). */
  dt_status (*finish)(dt_device *d, dt_dtype t, int64_t n, int64_t hd, void *O, const void *m,
                      const void *l, void *lse);
  /* D[i] = rowsum(dO[i] * O[i]) over n contiguous rows of hd values, D
   * indexed like finish's lse (FlashAttention-2 Alg. 2, line 4). */
  dt_status (*rowdot)(dt_device *d, dt_dtype t, int64_t n, int64_t hd, const void *dO,
                      const void *O, void *D);
  /* The backward from a saved lse (FlashAttention-2 Alg. 2, lines 11-14), in
   * place: P = exp(P - lse) over the raw scaled scores, then
   * dS = P (dS - D) over dS = dO V^T; masked keys 0 in both. */
  dt_status (*lse_bwd)(dt_device *d, dt_dtype t, const dt_attn_rows *g, void *P, void *dS,
                       const void *lse, const void *D);
  /* Blocking (data, read by the ops; part of the device's numbers, since a
   * block's GEMM shapes follow from it):
   * block_rows: query rows per block where the op's attrs do not say (sdpa's
   *   attrs.i2 = 0, every sdpa_cp block); > 0.
   * block_bytes: sdpa's bound on the bytes of the scores scratch of one block
   *   over the heads its GEMMs batch (the default block_rows is lowered to
   *   fit; attrs.i2 is not); 0: no bound.
   * gemm_heads: kv heads one of sdpa's strided-batched GEMMs covers (the
   *   scratch holds that many heads' scores); 0: all of a call's (every kv
   *   head, and in [b, h, s, hd] every batch too).
   * stats_f64: m, l, D in f64 for every t (see dt_kern_attn_stat). */
  int64_t block_rows;
  size_t block_bytes;
  int64_t gemm_heads;
  bool stats_f64;
} dt_kern_attn;

/* The dtype of the statistics m, l and D of a table's slots for data of dtype t. */
static inline dt_dtype dt_kern_attn_stat(const dt_kern_attn *k, dt_dtype t) {
  return k->stats_f64 || t == DT_F64 ? DT_F64 : DT_F32;
}

/* Reduce operators of dt_kern_layout.reduce, in the order of dt_reduce_op
 * (lib/comm/comm.h), which the launcher maps onto them. */
enum { DT_KRED_SUM = 0, DT_KRED_AVG = 1, DT_KRED_MAX = 2, DT_KRED_MIN = 3, DT_KRED_PROD = 4 };
/* Inputs one reduce launch takes; more run in rounds (see reduce). */
enum { DT_KRED_MAX_IN = 32 };

/* Layout and data movement: box copies and the element-wise reduce the comm
 * backends apply to device buffers (k_layout.cu). */
typedef struct dt_kern_layout {
  /* The n-d box `box` of src (row-major, shape src_shape, box at src_off) into
   * dst (shape dst_shape, box at dst_off): a byte move of es-byte elements
   * (any dtype), as dt_copy_box does on the host. ndim 0..DT_MAX_DIMS (0: one
   * element); an empty box copies nothing. dst and src must not overlap.
   * The shape and offset arrays are host memory, read before the call returns. */
  dt_status (*copy_box)(dt_device *d, size_t es, int ndim, void *dst, const int64_t *dst_shape,
                        const int64_t *dst_off, const void *src, const int64_t *src_shape,
                        const int64_t *src_off, const int64_t *box);
  /* out[i] = in[0][i] op in[1][i] op ... op in[nin-1][i], left to right, in the
   * arithmetic type (f32 for f32 and bf16, f64 for f64: one rounding to bf16 at
   * the end); op DT_KRED_*: sum, avg (the sum / divisor), max, min, prod; max
   * and min propagate NaN (a NaN operand wins), as dt_reduce_into does. t: f32,
   * f64, bf16. nin >= 1; `in` is a host array of device pointers. out may be one
   * of the inputs (element-wise in place). More than DT_KRED_MAX_IN inputs run
   * in rounds through out, so bf16 then rounds once per round. */
  dt_status (*reduce)(dt_device *d, dt_dtype t, int op, int64_t n, int nin,
                      const void *const *in, void *out, double divisor);
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
  const char *name; /* "cpu", "cuda", "cuda-emu" */
  const dt_kern_pw *pw;
  const dt_kern_rows *rows;
  const dt_kern_attn *attn;
  const dt_kern_layout *layout;
  const dt_kern_optim *optim;
  /* The table's kernels take f32 and f64 only: the dispatcher (dt_op_call)
   * runs an op with bf16 operands on f32 copies made with pw->cast and rounds
   * its bf16 outputs back (to nearest even): the device kernels' arithmetic
   * (f32 for bf16), one rounding per output. The CPU's table sets it. */
  bool bf16_as_f32;
  /* No slot reads or writes data (the meta device): a loop of calls that differ
   * only in their addresses may run one pass and record it in the compute
   * ledger once per pass it stands for (dt_kledger_set_repeat), leaving the
   * rows the whole loop would. */
  bool shape_only;
} dt_kernels;

/* The emulated device's pointers are host addresses plus this: the sum is
 * outside every user-space address (non-canonical on x86-64; bit 55 selects
 * the kernel half on AArch64, above its ignored top byte), so a host
 * dereference of emulated device memory faults at once. */
#define DT_EMU_TAG ((uintptr_t)1 << 55)
/* The meta device's addresses: DT_META_TAG + an offset below 2^53 (bits 54
 * and 55 set: as outside user space as DT_EMU_TAG, and told apart from it). */
#define DT_META_TAG (((uintptr_t)1 << 55) | ((uintptr_t)1 << 54))

/* For kernel sources: the CUDA device's stream, with its GPU made current on
 * the calling thread; NULL (error recorded on d's rank) on failure. */
void *dt_device_cuda_stream(dt_device *d);

/* The two builds of the same kernels: on the GPU (NULL-free only when built
 * with CUDA) and on the host; and the CPU's host loops. */
extern const dt_kernels dt_kernels_cuda;
extern const dt_kernels dt_kernels_emu;
extern const dt_kernels dt_kernels_cpu;

/* For tests: the emulator's attention row kernels built at the block sizes
 * the CUDA build launches (256 threads per score row, 128 per head-dim row)
 * rather than the emulator's 32; same contracts as dt_kernels_emu.attn. */
extern const dt_kern_attn dt_kemu_attn_cuda_blocks;

/* The device whose kernels run on arrays of one kind for a rank, and its table.
 * Filled by dt_device_kernels; `dev` may point at `host` inside the same struct,
 * so a dt_kdev is used where it was filled and never copied. */
typedef struct dt_kdev {
  dt_device *dev;          /* pass to the slots and to dt_device_gemm etc. */
  const dt_kernels *k;     /* dev's table */
  dt_device host;          /* a CPU handle, for host arrays on a rank whose own
                              device is not the CPU (or that has none) */
} dt_kdev;

/* For arrays of kind `kind` on ctx's rank: ctx->device when it is of that kind;
 * for host arrays on any other rank (a GPU rank's host arrays, a context with no
 * device) the CPU device's ops on a handle inside *out. DT_ERR_UNSUPPORTED
 * (recorded, naming `who`) when the rank has no device of that kind. */
dt_status dt_device_kernels(dt_ctx *ctx, dt_device_kind kind, const char *who, dt_kdev *out);

#ifdef __cplusplus
}
#endif
#endif
