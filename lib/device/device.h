/* lib/device/device.h: the compute-backend vtable (cpu | cuda | cuda-emu | meta).
 *
 * A device owns memory and runs the few dense kernels the runtime needs: GEMM
 * (strided-batched, transposes, f32/f64/bf16), fill, copy and axpy. The CPU device is
 * always built (cblas from OpenBLAS); the CUDA device (cuBLAS) is built when
 * configure finds CUDA and returns DT_ERR_NODEVICE where no GPU is present;
 * cuda-emu runs the CUDA device's kernels on the host. Besides these slots a
 * device carries a kernel table (lib/device/kernels.h) for the ops.
 * This layer does no communication.
 */
#ifndef DT_DEVICE_H
#define DT_DEVICE_H

#include "../core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dt_copy_kind {
  DT_COPY_H2H = 0, DT_COPY_H2D = 1, DT_COPY_D2H = 2, DT_COPY_D2D = 3
} dt_copy_kind;

/* Row-major GEMM description for
 *   C_b[m,n] = alpha * op(A_b)[m,k] * op(B_b)[k,n] + beta * C_b[m,n],  b < batch,
 * where op(X) = X or X^T, X_b starts at X + b*stride_x elements, and ld* are row
 * strides in elements of the matrices as stored (A stored m x k, or k x m when
 * trans_a). beta == 0 means C is not read (NaN there does not propagate); k == 0
 * gives C = beta * C.
 * dtype DT_BF16: A and B are bf16, products are accumulated in f32 with f32
 * alpha and beta (cuBLAS CUBLAS_COMPUTE_32F, the tensor-core path; the host
 * devices convert to f32 and call sgemm), and C is bf16 (one rounding of the f32
 * result) or, with c_f32, f32 (no rounding; for gradients accumulated in f32
 * from bf16 operands: one of cublasGemmEx's documented type combinations,
 * A/B CUDA_R_16BF, C CUDA_R_32F, compute CUBLAS_COMPUTE_32F). On cuda, H2D and D2H copies are complete on return; D2D,
 * gemm, fill and axpy are queued on the device's stream until dt_device_sync.
 * free takes the byte count given to alloc. Copy ranges must not overlap. */
typedef struct dt_gemm_desc {
  dt_dtype dtype;              /* DT_F32, DT_F64 or DT_BF16 (of A and B; of C unless c_f32) */
  bool trans_a, trans_b;
  int64_t m, n, k;
  double alpha, beta;
  const void *a; int64_t lda; int64_t stride_a;
  const void *b; int64_t ldb; int64_t stride_b;
  void *c;       int64_t ldc; int64_t stride_c;
  int64_t batch;               /* >= 1 */
  bool c_f32;                  /* C (and ldc, stride_c) is f32; only with dtype DT_BF16 */
  const char *op;              /* its compute-ledger op (NULL: "gemm"); attention's tiles say
                                * "attn_gemm" so a time model can cost them as one fused kernel */
} dt_gemm_desc;

/* Backend slots. NULL optional slots mean unsupported (DT_ERR_UNSUPPORTED). */
typedef struct dt_device_ops {
  const char *name;
  dt_status (*alloc)(dt_device *d, size_t bytes, void **out);
  void (*free)(dt_device *d, void *p, size_t bytes);
  dt_status (*copy)(dt_device *d, void *dst, const void *src, size_t bytes, dt_copy_kind kind);
  dt_status (*gemm)(dt_device *d, const dt_gemm_desc *g);
  dt_status (*fill)(dt_device *d, dt_dtype t, void *x, int64_t n, double value);
  /* y += alpha * x */
  dt_status (*axpy)(dt_device *d, dt_dtype t, int64_t n, double alpha, const void *x, void *y);
  dt_status (*sync)(dt_device *d);
  void (*destroy)(dt_device *d);
  /* The device's other kernels (lib/device/kernels.h); every device has one. */
  const struct dt_kernels *kern;
} dt_device_ops;

struct dt_device {
  const dt_device_ops *ops;
  dt_device_kind kind;
  dt_ctx *ctx;     /* the rank that owns the device handle; errors go to it */
  void *impl;
};

/* The CPU device's slots (for handles on host arrays, lib/device/kernels.h). */
const dt_device_ops *dt_device_cpu_ops(void);
/* Creates the CPU device for ctx. Its BLAS calls run on the calling thread. */
dt_status dt_device_cpu_create(dt_ctx *ctx, dt_device **out);
/* Creates a CUDA device on GPU `ordinal`; the first one created on a rank is the
 * memory behind that rank's CUDA arrays. DT_ERR_UNSUPPORTED when built without
 * CUDA, DT_ERR_NODEVICE when no GPU is visible. */
dt_status dt_device_cuda_create(dt_ctx *ctx, int ordinal, dt_device **out);
/* Creates the emulated CUDA device ("cuda-emu"): arrays of kind DT_DEV_CUDA in
 * host memory behind tagged pointers (DT_EMU_TAG), the CUDA kernels built for
 * the host, GEMM through cblas. Synchronous. Always built; for tests of the
 * GPU path on machines without a GPU. */
dt_status dt_device_cuda_emu_create(dt_ctx *ctx, dt_device **out);
/* Creates the meta device: arrays of kind DT_DEV_META with shape and no storage
 * (addresses DT_META_TAG + offset that fault when the host dereferences them),
 * accounted in the rank's device memory counters; every slot a no-op (GEMM and
 * the kernels still write the compute ledger at their call sites); a copy to
 * the host writes zeros. The attention blocking of cuda-emu. Always built. */
dt_status dt_device_meta_create(dt_ctx *ctx, dt_device **out);
bool dt_device_is_meta(const dt_device *d);
/* Number of visible GPUs (0 when built without CUDA or none present). */
int dt_device_cuda_count(void);
bool dt_device_cuda_built(void);
/* Destroys d; when it is the memory behind its rank's arrays, uninstalls it first. */
void dt_device_destroy(dt_device *d);
/* For backends, from their create: makes d (a non-CPU device) the memory behind
 * its rank's arrays of d->kind (core's dt_dev_mem) when the rank has none yet,
 * so the first such device of a rank serves dt_array_create. */
void dt_device_install_memory(dt_device *d);
/* Process-wide setting, for programs: the number of threads OpenBLAS may use
 * (n <= 0 only queries). Returns the previous count, -1 when not OpenBLAS. */
int dt_device_cpu_blas_threads(int n);

/* Front functions: validate, then call the slot. */
dt_status dt_device_alloc(dt_device *d, size_t bytes, void **out);
void dt_device_free(dt_device *d, void *p, size_t bytes);
dt_status dt_device_copy(dt_device *d, void *dst, const void *src, size_t bytes, dt_copy_kind k);
dt_status dt_device_gemm(dt_device *d, const dt_gemm_desc *g);
dt_status dt_device_fill(dt_device *d, dt_dtype t, void *x, int64_t n, double value);
dt_status dt_device_axpy(dt_device *d, dt_dtype t, int64_t n, double alpha, const void *x, void *y);
dt_status dt_device_sync(dt_device *d);

/* Validates a GEMM description (dims, leading dims, strides, dtype). */
dt_status dt_gemm_check(dt_ctx *ctx, const dt_gemm_desc *g);

#ifdef __cplusplus
}
#endif
#endif
