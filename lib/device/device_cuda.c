/* lib/device/device_cuda.c: the CUDA device ("cuda"): device memory, copies, GEMM,
 * fill and axpy on one GPU through the CUDA runtime and cuBLAS.
 *
 * What it is: plain C compiled by the C compiler with CUDA_CFLAGS (no nvcc, no .cu
 * files, hence no custom kernels). Every handle (one cudaStream_t and one cuBLAS
 * handle per dt_device) hangs off d->impl; nothing here is global. Errors are
 * recorded on the owning rank's dt_ctx with the failing call, file:line and the
 * CUDA/cuBLAS error string; the backend never prints and never exits.
 *
 * What it is not: no bf16 arithmetic outside GEMM (GEMM takes f32/f64 and bf16
 * with f32 accumulation; axpy f32/f64; fill also bf16), no multi-GPU logic (one device per handle), no communication.
 * Built without HAVE_CUDA it reduces to stubs that report DT_ERR_UNSUPPORTED.
 *
 * Ordering: work is queued on the device's stream. GEMM, fill, axpy and D2D copies
 * return before the GPU has finished (dt_device_sync waits); H2D and D2H copies are
 * complete when they return, so host buffers may be reused or read at once.
 */
#include "config.h"

#include "device/device.h"
#include "device/kernels.h"

#ifdef HAVE_CUDA

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

/* cuBLAS 12 added the 64-bit-integer API (cublasSgemmStridedBatched_64, ...).
 * Defining DT_CUBLAS_NO_64 forces the int API, so that path can be compile-tested. */
#if defined(CUBLAS_VER_MAJOR) && CUBLAS_VER_MAJOR >= 12 && !defined(DT_CUBLAS_NO_64)
#define DT_CUBLAS_64 1
#else
#define DT_CUBLAS_64 0
#endif

/* Fill stages at most this many bytes on the host: one H2D copy of the pattern,
 * then device-to-device copies that double the filled prefix. 1 MiB keeps the
 * host buffer small and makes the doubling copies large enough to run at
 * device bandwidth. */
enum { CUDA_FILL_STAGE_BYTES = 1 << 20 };

typedef struct cuda_impl {
  int ordinal;
  cudaStream_t stream;
  cublasHandle_t blas;
  void *stage;            /* CUDA_FILL_STAGE_BYTES of host memory, made on first use */
  cudaEvent_t stage_done; /* recorded after the last copy out of stage */
} cuda_impl;

/* ---- error checks ---------------------------------------------------------- */

#if DT_CUBLAS_64 || (defined(CUBLAS_VERSION) && CUBLAS_VERSION >= 11402)
static const char *cublas_str(cublasStatus_t s) { return cublasGetStatusString(s); }
#else
static const char *cublas_str(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "unknown cuBLAS status";
  }
}
#endif

/* CUDA keeps the last error of the thread until it is read; reading it after a
 * failure keeps a recovered error (a failed cudaMalloc) from being reported again
 * by an unrelated later call. (Errors that poison the context stay sticky.) */
static void cuda_clear(void) { (void)cudaGetLastError(); }
static void cublas_clear(void) {}

/* DTC_CHECK_GEN: evaluate `expr` (of type T) once; if it is not `ok`, run
 * clear(), record DT_ERR_BACKEND on ctx as "file:line expr: error string" under
 * the calling function's name, and run `on_fail` with dtc_s_ holding the status.
 * Forms: *_RET returns the status; *_GOTO stores it in st and jumps to label. */
#define DTC_CHECK_GEN(ctx, T, expr, ok, strfn, clear, on_fail)                       \
  do {                                                                               \
    T dtc_e_ = (expr);                                                               \
    if (dtc_e_ != (ok)) {                                                            \
      clear();                                                                       \
      dt_status dtc_s_ = dt_error((ctx), DT_ERR_BACKEND, __func__, "%s:%d %s: %s",   \
                                  __FILE__, __LINE__, #expr, strfn(dtc_e_));         \
      on_fail;                                                                       \
    }                                                                                \
  } while (0)

#define CUDA_RET(ctx, expr) \
  DTC_CHECK_GEN(ctx, cudaError_t, expr, cudaSuccess, cudaGetErrorString, cuda_clear, return dtc_s_)
#define CUDA_GOTO(ctx, expr, st, label)                                               \
  DTC_CHECK_GEN(ctx, cudaError_t, expr, cudaSuccess, cudaGetErrorString, cuda_clear, \
                (st) = dtc_s_; goto label)
#define CUBLAS_RET(ctx, expr)                                                        \
  DTC_CHECK_GEN(ctx, cublasStatus_t, expr, CUBLAS_STATUS_SUCCESS, cublas_str, cublas_clear, \
                return dtc_s_)
#define CUBLAS_GOTO(ctx, expr, st, label)                                            \
  DTC_CHECK_GEN(ctx, cublasStatus_t, expr, CUBLAS_STATUS_SUCCESS, cublas_str, cublas_clear, \
                (st) = dtc_s_; goto label)

static cuda_impl *impl_of(dt_device *d) { return (cuda_impl *)d->impl; }

/* Each rank (thread) may drive a different GPU, and the current device is per
 * thread: every entry point selects the handle's device first. */
#define CUDA_ENTER(d) CUDA_RET((d)->ctx, cudaSetDevice(impl_of(d)->ordinal))

/* ---- slots ---------------------------------------------------------------- */

/* bytes == 0 still yields a unique non-NULL pointer (one byte, counted as 0),
 * as the host allocator does. Out of memory is DT_ERR_NOMEM. */
static dt_status cuda_alloc(dt_device *d, size_t bytes, void **out) {
  if (!out) return dt_error(d->ctx, DT_ERR_INVALID, "dt_device_alloc", "NULL out");
  *out = NULL;
  CUDA_ENTER(d);
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
  if (e != cudaSuccess) {
    cuda_clear();
    return dt_error(d->ctx, e == cudaErrorMemoryAllocation ? DT_ERR_NOMEM : DT_ERR_BACKEND,
                    "dt_device_alloc", "cudaMalloc(%zu bytes) on GPU %d: %s", bytes,
                    impl_of(d)->ordinal, cudaGetErrorString(e));
  }
  dt_mem_track_device(d->ctx, bytes, true);
  *out = p;
  return DT_OK;
}

/* `bytes` must be the size given to alloc (it is what the device-memory counters subtract). */
static void cuda_free(dt_device *d, void *p, size_t bytes) {
  if (!p) return;
  if (cudaSetDevice(impl_of(d)->ordinal) != cudaSuccess || cudaFree(p) != cudaSuccess) {
    cuda_clear();
    (void)dt_error(d->ctx, DT_ERR_BACKEND, "dt_device_free", "cudaFree failed on GPU %d",
                   impl_of(d)->ordinal);
  }
  dt_mem_track_device(d->ctx, bytes, false);
}

/* H2H is a host memmove. Device ranges must not overlap. H2D and D2H are complete
 * on return; D2D is queued on the stream. */
static dt_status cuda_copy(dt_device *d, void *dst, const void *src, size_t bytes,
                           dt_copy_kind kind) {
  if (bytes == 0) return DT_OK;
  enum cudaMemcpyKind k;
  switch (kind) {
    case DT_COPY_H2H: memmove(dst, src, bytes); return DT_OK;
    case DT_COPY_H2D: k = cudaMemcpyHostToDevice; break;
    case DT_COPY_D2H: k = cudaMemcpyDeviceToHost; break;
    case DT_COPY_D2D: k = cudaMemcpyDeviceToDevice; break;
    default:
      return dt_error(d->ctx, DT_ERR_INVALID, "dt_device_copy", "copy kind %d", (int)kind);
  }
  CUDA_ENTER(d);
  cuda_impl *im = impl_of(d);
  CUDA_RET(d->ctx, cudaMemcpyAsync(dst, src, bytes, k, im->stream));
  if (kind != DT_COPY_D2D) CUDA_RET(d->ctx, cudaStreamSynchronize(im->stream));
  return DT_OK;
}

#if !DT_CUBLAS_64
static bool fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }
#endif

/* k == 0: C = beta C, defined here rather than left to cuBLAS (a BLAS corner
 * case): beta 0 writes zeros without reading C (so NaN does not survive, as in
 * BLAS), beta 1 is a no-op, other betas scale C in place with geam
 * (C = 0 * C + beta * C; geam does not read an operand whose scalar is 0). */
static dt_status gemm_bf16(dt_device *d, const dt_gemm_desc *g, int64_t k);

static dt_status gemm_k0(dt_device *d, const dt_gemm_desc *g) {
  cuda_impl *im = impl_of(d);
  const dt_dtype ct = g->c_f32 ? DT_F32 : g->dtype;
  size_t es = dt_dtype_size(ct);
  if (g->beta == 1.0) return DT_OK;
  /* bf16 C with another beta: cuBLAS has no bf16 geam; one GEMM with k = 1 on
   * zero operands gives beta C rounded once, as the k = 0 definition asks. */
  if (ct == DT_BF16 && g->beta != 0.0) return gemm_bf16(d, g, 1);
  for (int64_t b = 0; b < g->batch; b++) {
    char *c = (char *)g->c + (size_t)(b * g->stride_c) * es;
    if (g->beta == 0.0) {
      CUDA_RET(d->ctx, cudaMemset2DAsync(c, (size_t)g->ldc * es, 0, (size_t)g->n * es,
                                         (size_t)g->m, im->stream));
    } else if (ct == DT_F32) {
      const float zero = 0.0f, beta = (float)g->beta;
      float *cf = (float *)(void *)c;
#if DT_CUBLAS_64
      CUBLAS_RET(d->ctx, cublasSgeam_64(im->blas, CUBLAS_OP_N, CUBLAS_OP_N, g->n, g->m, &zero,
                                        cf, g->ldc, &beta, cf, g->ldc, cf, g->ldc));
#else
      CUBLAS_RET(d->ctx, cublasSgeam(im->blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)g->n, (int)g->m,
                                     &zero, cf, (int)g->ldc, &beta, cf, (int)g->ldc, cf,
                                     (int)g->ldc));
#endif
    } else {
      const double zero = 0.0, beta = g->beta;
      double *cd = (double *)(void *)c;
#if DT_CUBLAS_64
      CUBLAS_RET(d->ctx, cublasDgeam_64(im->blas, CUBLAS_OP_N, CUBLAS_OP_N, g->n, g->m, &zero,
                                        cd, g->ldc, &beta, cd, g->ldc, cd, g->ldc));
#else
      CUBLAS_RET(d->ctx, cublasDgeam(im->blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)g->n, (int)g->m,
                                     &zero, cd, (int)g->ldc, &beta, cd, (int)g->ldc, cd,
                                     (int)g->ldc));
#endif
    }
  }
  return DT_OK;
}

/* Row-major C = alpha op(A) op(B) + beta C is, read column-major, the same
 * memory as C^T = alpha op(B)^T op(A)^T + beta C^T: so cuBLAS gets B as its
 * first operand and A as its second, n and m swapped, and each operand keeps its
 * own transpose flag (a row-major X read column-major is X^T already). The leading
 * dims carry over unchanged; dt_gemm_check has validated them. */
/* bf16 A and B, f32 accumulation and f32 alpha/beta (CUBLAS_COMPUTE_32F with
 * CUBLAS_GEMM_DEFAULT: cuBLAS picks a tensor-core kernel), C bf16 or f32
 * (c_f32): cublasGemmStridedBatchedEx, operands swapped as in cuda_gemm.
 * k0 == 1 is gemm_k0's helper: A and B become zero operands of inner size 1
 * (one zeroed scratch vector, stride 0 over the batch), so C = beta C. */
static dt_status gemm_bf16(dt_device *d, const dt_gemm_desc *g, int64_t k0) {
  cuda_impl *im = impl_of(d);
  const float alpha = (float)g->alpha, beta = (float)g->beta;
  const cudaDataType_t ct = g->c_f32 ? CUDA_R_32F : CUDA_R_16BF;
  const void *A = g->a, *B = g->b;
  long long lda = g->lda, ldb = g->ldb, k = g->k;
  long long sa = g->batch > 1 ? g->stride_a : 0, sb = g->batch > 1 ? g->stride_b : 0;
  const long long sc = g->batch > 1 ? g->stride_c : 0;
  void *zeros = NULL;
  size_t zbytes = 0;
  if (k0 == 1) {
    const int64_t mx = g->m > g->n ? g->m : g->n;
    zbytes = (size_t)mx * sizeof(dt_bf16);
    CUDA_RET(d->ctx, cudaMalloc(&zeros, zbytes));
    cudaError_t ce = cudaMemsetAsync(zeros, 0, zbytes, im->stream);
    if (ce != cudaSuccess) {
      cuda_clear();
      (void)cudaFree(zeros);
      return dt_error(d->ctx, DT_ERR_BACKEND, "dt_device_gemm", "cudaMemsetAsync: %s",
                      cudaGetErrorString(ce));
    }
    A = B = zeros;
    k = 1;
    lda = g->trans_a ? (g->m > 1 ? g->m : 1) : 1;
    ldb = g->trans_b ? 1 : (g->n > 1 ? g->n : 1);
    sa = sb = 0;
  }
  cublasOperation_t op_b = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t op_a = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasStatus_t e;
#if DT_CUBLAS_64
  e = cublasGemmStridedBatchedEx_64(im->blas, op_b, op_a, g->n, g->m, k, &alpha, B, CUDA_R_16BF,
                                    ldb, sb, A, CUDA_R_16BF, lda, sa, &beta, g->c, ct, g->ldc,
                                    sc, g->batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
#else
  e = cublasGemmStridedBatchedEx(im->blas, op_b, op_a, (int)g->n, (int)g->m, (int)k, &alpha, B,
                                 CUDA_R_16BF, (int)ldb, sb, A, CUDA_R_16BF, (int)lda, sa, &beta,
                                 g->c, ct, (int)g->ldc, sc, (int)g->batch, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT);
#endif
  if (zeros) { /* the GEMM that reads the scratch must be done before it is freed */
    (void)cudaStreamSynchronize(im->stream);
    (void)cudaFree(zeros);
  }
  if (e != CUBLAS_STATUS_SUCCESS)
    return dt_error(d->ctx, DT_ERR_BACKEND, "dt_device_gemm",
                    "cublasGemmStridedBatchedEx (bf16, m=%lld n=%lld k=%lld batch=%lld): %s",
                    (long long)g->m, (long long)g->n, (long long)k, (long long)g->batch,
                    cublas_str(e));
  return DT_OK;
}

static dt_status cuda_gemm(dt_device *d, const dt_gemm_desc *g) {
  if (g->dtype != DT_F32 && g->dtype != DT_F64 && g->dtype != DT_BF16)
    return dt_error(d->ctx, DT_ERR_UNSUPPORTED, "dt_device_gemm",
                    "the cuda device has no %s GEMM (f32, f64 and bf16 only)",
                    dt_dtype_name(g->dtype));
  if (g->m == 0 || g->n == 0 || g->batch <= 0) return DT_OK;
  cublasOperation_t op_b = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t op_a = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
#if !DT_CUBLAS_64
  if (!fits_int(g->m) || !fits_int(g->n) || !fits_int(g->k) || !fits_int(g->lda) ||
      !fits_int(g->ldb) || !fits_int(g->ldc) || !fits_int(g->batch))
    return dt_error(d->ctx, DT_ERR_INVALID, "dt_device_gemm",
                    "m=%lld n=%lld k=%lld lda=%lld ldb=%lld ldc=%lld batch=%lld exceed the "
                    "int range of this cuBLAS (< 12, no 64-bit API)",
                    (long long)g->m, (long long)g->n, (long long)g->k, (long long)g->lda,
                    (long long)g->ldb, (long long)g->ldc, (long long)g->batch);
#endif
  CUDA_ENTER(d);
  if (g->k == 0) return gemm_k0(d, g);
  if (g->dtype == DT_BF16) return gemm_bf16(d, g, 0);
  cublasHandle_t h = impl_of(d)->blas;
  /* With one matrix the strides are unused (and unchecked by the front). */
  const long long sa = g->batch > 1 ? g->stride_a : 0, sb = g->batch > 1 ? g->stride_b : 0,
                  sc = g->batch > 1 ? g->stride_c : 0;
  if (g->dtype == DT_F32) {
    const float alpha = (float)g->alpha, beta = (float)g->beta;
#if DT_CUBLAS_64
    CUBLAS_RET(d->ctx, cublasSgemmStridedBatched_64(
                           h, op_b, op_a, g->n, g->m, g->k, &alpha, (const float *)g->b, g->ldb,
                           sb, (const float *)g->a, g->lda, sa, &beta,
                           (float *)g->c, g->ldc, sc, g->batch));
#else
    CUBLAS_RET(d->ctx, cublasSgemmStridedBatched(
                           h, op_b, op_a, (int)g->n, (int)g->m, (int)g->k, &alpha,
                           (const float *)g->b, (int)g->ldb, sb, (const float *)g->a,
                           (int)g->lda, sa, &beta, (float *)g->c, (int)g->ldc,
                           sc, (int)g->batch));
#endif
  } else {
    const double alpha = g->alpha, beta = g->beta;
#if DT_CUBLAS_64
    CUBLAS_RET(d->ctx, cublasDgemmStridedBatched_64(
                           h, op_b, op_a, g->n, g->m, g->k, &alpha, (const double *)g->b,
                           g->ldb, sb, (const double *)g->a, g->lda, sa,
                           &beta, (double *)g->c, g->ldc, sc, g->batch));
#else
    CUBLAS_RET(d->ctx, cublasDgemmStridedBatched(
                           h, op_b, op_a, (int)g->n, (int)g->m, (int)g->k, &alpha,
                           (const double *)g->b, (int)g->ldb, sb, (const double *)g->a,
                           (int)g->lda, sa, &beta, (double *)g->c, (int)g->ldc,
                           sc, (int)g->batch));
#endif
  }
  return DT_OK;
}

/* x[0..n) = value converted to t (bf16: round to nearest even through f32).
 * An all-zero bit pattern (+0.0) is a cudaMemset; anything else (-0.0 included)
 * stages up to CUDA_FILL_STAGE_BYTES of the pattern on the host, copies it once
 * and then doubles the filled prefix with device-to-device copies. */
static dt_status cuda_fill(dt_device *d, dt_dtype t, void *x, int64_t n, double value) {
  unsigned char pat[8];
  size_t es = dt_dtype_size(t);
  switch (t) {
    case DT_F32: { float v = (float)value; memcpy(pat, &v, sizeof v); break; }
    case DT_F64: memcpy(pat, &value, sizeof value); break;
    case DT_BF16: { dt_bf16 v = dt_f32_to_bf16((float)value); memcpy(pat, &v, sizeof v); break; }
    default:
      return dt_error(d->ctx, DT_ERR_INVALID, "dt_device_fill", "dtype %d", (int)t);
  }
  if (n <= 0) return DT_OK;
  if ((uint64_t)n > SIZE_MAX / es)
    return dt_error(d->ctx, DT_ERR_INVALID, "dt_device_fill", "n=%lld overflows size_t",
                    (long long)n);
  size_t total = (size_t)n * es;
  CUDA_ENTER(d);
  cuda_impl *im = impl_of(d);
  bool zero = true;
  for (size_t i = 0; i < es; i++) zero = zero && pat[i] == 0;
  if (zero) {
    CUDA_RET(d->ctx, cudaMemsetAsync(x, 0, total, im->stream));
    return DT_OK;
  }
  if (!im->stage) {
    if (!im->stage_done)
      CUDA_RET(d->ctx, cudaEventCreateWithFlags(&im->stage_done, cudaEventDisableTiming));
    if (!(im->stage = malloc(CUDA_FILL_STAGE_BYTES)))
      return dt_error(d->ctx, DT_ERR_NOMEM, "dt_device_fill", "no memory for the fill stage");
  } else {
    /* The previous fill's copy out of the stage must be done before it is rewritten
     * (for pageable memory it is by the time cudaMemcpyAsync returns; the event
     * makes that independent of the driver's staging). */
    CUDA_RET(d->ctx, cudaEventSynchronize(im->stage_done));
  }
  size_t chunk = total < CUDA_FILL_STAGE_BYTES ? total : CUDA_FILL_STAGE_BYTES / es * es;
  unsigned char *s = im->stage;
  for (size_t off = 0; off < chunk; off += es) memcpy(s + off, pat, es);
  CUDA_RET(d->ctx, cudaMemcpyAsync(x, s, chunk, cudaMemcpyHostToDevice, im->stream));
  CUDA_RET(d->ctx, cudaEventRecord(im->stage_done, im->stream));
  unsigned char *xb = x;
  for (size_t done = chunk; done < total;) {
    size_t c = total - done < done ? total - done : done; /* [0, done) holds the pattern */
    CUDA_RET(d->ctx, cudaMemcpyAsync(xb + done, xb, c, cudaMemcpyDeviceToDevice, im->stream));
    done += c;
  }
  return DT_OK;
}

/* y += alpha x for f32/f64 device vectors (cublas axpy; no overlap of x and y). */
static dt_status cuda_axpy(dt_device *d, dt_dtype t, int64_t n, double alpha, const void *x,
                           void *y) {
  if (t != DT_F32 && t != DT_F64 && t != DT_BF16)
    return dt_error(d->ctx, DT_ERR_UNSUPPORTED, "dt_device_axpy",
                    "the cuda device has no %s axpy (f32, f64 and bf16 only)", dt_dtype_name(t));
  if (n <= 0) return DT_OK;
  CUDA_ENTER(d);
  cublasHandle_t h = impl_of(d)->blas;
  const float af = (float)alpha;
  if (t == DT_BF16) {
    /* bf16 x and y, f32 alpha and arithmetic, one rounding of each y. */
#if DT_CUBLAS_64
    CUBLAS_RET(d->ctx, cublasAxpyEx_64(h, n, &af, CUDA_R_32F, x, CUDA_R_16BF, 1, y, CUDA_R_16BF, 1,
                                       CUDA_R_32F));
#else
    for (int64_t off = 0; off < n;) {
      int c = n - off > INT_MAX ? INT_MAX : (int)(n - off);
      CUBLAS_RET(d->ctx, cublasAxpyEx(h, c, &af, CUDA_R_32F, (const char *)x + (size_t)off * 2,
                                      CUDA_R_16BF, 1, (char *)y + (size_t)off * 2, CUDA_R_16BF, 1,
                                      CUDA_R_32F));
      off += c;
    }
#endif
    return DT_OK;
  }
#if DT_CUBLAS_64
  if (t == DT_F32)
    CUBLAS_RET(d->ctx, cublasSaxpy_64(h, n, &af, x, 1, y, 1));
  else
    CUBLAS_RET(d->ctx, cublasDaxpy_64(h, n, &alpha, x, 1, y, 1));
#else
  /* The int API: chunks of at most INT_MAX elements. */
  size_t es = dt_dtype_size(t);
  for (int64_t off = 0; off < n;) {
    int c = n - off > INT_MAX ? INT_MAX : (int)(n - off);
    const char *xo = (const char *)x + (size_t)off * es;
    char *yo = (char *)y + (size_t)off * es;
    if (t == DT_F32)
      CUBLAS_RET(d->ctx, cublasSaxpy(h, c, &af, (const float *)xo, 1, (float *)yo, 1));
    else
      CUBLAS_RET(d->ctx, cublasDaxpy(h, c, &alpha, (const double *)xo, 1, (double *)yo, 1));
    off += c;
  }
#endif
  return DT_OK;
}

/* Waits for everything queued on the device's stream; asynchronous kernel
 * errors surface here. */
static dt_status cuda_sync(dt_device *d) {
  CUDA_ENTER(d);
  CUDA_RET(d->ctx, cudaStreamSynchronize(impl_of(d)->stream));
  return DT_OK;
}

/* Releases the handles and d itself; errors cannot be reported from here. */
static void cuda_destroy(dt_device *d) {
  cuda_impl *im = impl_of(d);
  if (im) {
    if (cudaSetDevice(im->ordinal) == cudaSuccess) {
      if (im->stream) (void)cudaStreamSynchronize(im->stream);
      if (im->blas) (void)cublasDestroy(im->blas);
      if (im->stage_done) (void)cudaEventDestroy(im->stage_done);
      if (im->stream) (void)cudaStreamDestroy(im->stream);
    }
    cuda_clear();
    free(im->stage);
    free(im);
  }
  free(d);
}

static const dt_device_ops cuda_ops = {
    .name = "cuda",
    .alloc = cuda_alloc,
    .free = cuda_free,
    .copy = cuda_copy,
    .gemm = cuda_gemm,
    .fill = cuda_fill,
    .axpy = cuda_axpy,
    .sync = cuda_sync,
    .destroy = cuda_destroy,
    .kern = &dt_kernels_cuda,
};

void *dt_device_cuda_stream(dt_device *d) {
  if (!d || d->ops != &cuda_ops) {
    if (d) (void)dt_error(d->ctx, DT_ERR_INVALID, "dt_device_cuda_stream", "not a cuda device");
    return NULL;
  }
  cudaError_t e = cudaSetDevice(impl_of(d)->ordinal);
  if (e != cudaSuccess) {
    cuda_clear();
    (void)dt_error(d->ctx, DT_ERR_BACKEND, "dt_device_cuda_stream", "cudaSetDevice(%d): %s",
                   impl_of(d)->ordinal, cudaGetErrorString(e));
    return NULL;
  }
  return impl_of(d)->stream;
}

/* Errors of cudaGetDeviceCount that mean "no usable GPU here" rather than a fault. */
static bool no_device_error(cudaError_t e) {
  return e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver
#if CUDART_VERSION >= 11010
         || e == cudaErrorStubLibrary
#endif
      ;
}

int dt_device_cuda_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cuda_clear();
    return 0;
  }
  return n;
}

bool dt_device_cuda_built(void) { return true; }

dt_status dt_device_cuda_create(dt_ctx *ctx, int ordinal, dt_device **out) {
  static const char call[] = "dt_device_cuda_create";
  if (!out) return dt_error(ctx, DT_ERR_INVALID, call, "NULL out");
  *out = NULL;
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cuda_clear();
    return dt_error(ctx, no_device_error(e) ? DT_ERR_NODEVICE : DT_ERR_BACKEND, call,
                    "cudaGetDeviceCount: %s", cudaGetErrorString(e));
  }
  if (count == 0) return dt_error(ctx, DT_ERR_NODEVICE, call, "no CUDA device is visible");
  if (ordinal < 0 || ordinal >= count)
    return dt_error(ctx, DT_ERR_INVALID, call, "GPU ordinal %d (this host has %d)", ordinal,
                    count);

  dt_status st = DT_OK;
  dt_device *d = calloc(1, sizeof *d);
  cuda_impl *im = calloc(1, sizeof *im);
  if (!d || !im) {
    st = dt_error(ctx, DT_ERR_NOMEM, call, "no memory for the device handle");
    goto fail;
  }
  im->ordinal = ordinal;
  d->ops = &cuda_ops;
  d->kind = DT_DEV_CUDA;
  d->ctx = ctx;
  d->impl = im;
  CUDA_GOTO(ctx, cudaSetDevice(ordinal), st, fail);
  /* A blocking stream: it still orders against the legacy default stream, which
   * code outside this backend may use on the same buffers. */
  CUDA_GOTO(ctx, cudaStreamCreateWithFlags(&im->stream, cudaStreamDefault), st, fail);
  CUBLAS_GOTO(ctx, cublasCreate(&im->blas), st, fail);
  CUBLAS_GOTO(ctx, cublasSetStream(im->blas, im->stream), st, fail);
  /* alpha and beta are host scalars. Default math: no reduced-precision (TF32)
   * tensor-core paths for f32, so f32 results keep the f32 error bound. */
  CUBLAS_GOTO(ctx, cublasSetPointerMode(im->blas, CUBLAS_POINTER_MODE_HOST), st, fail);
  CUBLAS_GOTO(ctx, cublasSetMathMode(im->blas, CUBLAS_DEFAULT_MATH), st, fail);
  dt_device_install_memory(d);
  *out = d;
  return DT_OK;
fail:
  if (d && im) {
    cuda_destroy(d);
  } else {
    free(im);
    free(d);
  }
  return st;
}

#else /* !HAVE_CUDA */

dt_status dt_device_cuda_create(dt_ctx *ctx, int ordinal, dt_device **out) {
  (void)ordinal;
  if (out) *out = NULL;
  return dt_error(ctx, DT_ERR_UNSUPPORTED, "dt_device_cuda_create",
                  "this build has no CUDA (configure --with-cuda)");
}

int dt_device_cuda_count(void) { return 0; }

bool dt_device_cuda_built(void) { return false; }

void *dt_device_cuda_stream(dt_device *d) {
  if (d) (void)dt_error(d->ctx, DT_ERR_UNSUPPORTED, "dt_device_cuda_stream", "no CUDA in this build");
  return NULL;
}

#endif /* HAVE_CUDA */
