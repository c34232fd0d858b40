/* lib/device/kern/sbk.cuh: write a GPU kernel once, build it for the GPU or the host.
 *
 * Compiled by nvcc, a kernel is a __global__ launch on the device's stream.
 * Compiled by the C++ compiler with SB_KERN_EMU (the "cuda-emu" device), the same
 * body runs on the host: the blocks one after another, and within a block each
 * thread in turn; a kernel launched with SBK_SYNC runs its threads as fibers
 * (ucontext) that switch at t.sync(), so __syncthreads and shared memory behave
 * as on the GPU, and a barrier that not every thread reaches is reported
 * (lib/device/kern/emu.cc). The emulated device's pointers are host addresses
 * with DT_EMU_TAG added, so host code that dereferences device memory faults;
 * a slot untags its pointers once (SBK_UNTAG), and a host pointer handed to a
 * slot is an error.
 *
 * A kernel body is a lambda on `const sbk_thr &t`: t.tx / t.ntx (thread in block,
 * threads per block), t.bx / t.nbx (block, blocks), t.smem (the dynamic shared
 * memory), t.sync(). Grids are 1-D. No warp intrinsics: block reductions go
 * through shared memory (sbk_block_reduce), which both builds run the same way.
 */
#ifndef SBK_H
#define SBK_H

#include "config.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "device/device.h"
#include "device/kernels.h"

enum { SBK_SYNC = 1 };       /* the kernel calls t.sync() */
enum { SBK_MAX_BLOCK = 1024, SBK_MAX_SMEM = 48 * 1024 }; /* CUDA's default launch limits */

#ifdef SB_KERN_EMU

#define SBK(name) dt_kemu_##name
#define SBK_DEV
#define SBK_LAMBDA [=]

struct sbk_thr;
extern "C" void sbk_emu_sync(const sbk_thr *t);
struct sbk_thr {
  int tx, bx, ntx, nbx;
  char *smem;
  void *blk; /* the emulator's block state */
  void sync() const { sbk_emu_sync(this); }
};

typedef struct sbk_bf16 { uint16_t bits; } sbk_bf16;
static inline float sbk_bf2f(sbk_bf16 h) {
  dt_bf16 b; b.bits = h.bits; return dt_bf16_to_f32(b);
}
static inline sbk_bf16 sbk_f2bf(float f) {
  sbk_bf16 h; h.bits = dt_f32_to_bf16(f).bits; return h;
}
static inline void sbk_atomic_add(float *p, float v) { *p += v; }
static inline void sbk_atomic_add(double *p, double v) { *p += v; }

extern "C" dt_status sbk_emu_run(dt_device *d, const char *name, int64_t grid, int block,
                                 size_t smem, int flags,
                                 void (*call)(const void *f, const sbk_thr *t), const void *f);

template <class F> static void sbk_call(const void *f, const sbk_thr *t) { (*(const F *)f)(*t); }

template <class F>
static dt_status sbk_launch(dt_device *d, const char *name, int64_t grid, int block, size_t smem,
                            int flags, F f) {
  return sbk_emu_run(d, name, grid, block, smem, flags, &sbk_call<F>, &f);
}

/* Grids stay small on the host: grid-stride loops cover the rest, and two or
 * more blocks still run wherever the work allows. */
enum { SBK_GRID_CAP = 4 };

static inline bool sbk_untag1(dt_device *d, const char *call, const void *&p) {
  if (!p) return true;
  uintptr_t u = (uintptr_t)p;
  if (!(u & DT_EMU_TAG)) {
    (void)dt_error(d->ctx, DT_ERR_INVALID, call, "a host pointer %p was given to a device kernel", p);
    return false;
  }
  p = (const void *)(u - DT_EMU_TAG);
  return true;
}
template <class P> static inline bool sbk_untag_one(dt_device *d, const char *call, P *&p) {
  const void *q = p;
  if (!sbk_untag1(d, call, q)) return false;
  p = (P *)q;
  return true;
}
template <class... P> static inline bool sbk_untag_all(dt_device *d, const char *call, P *&...p) {
  return (sbk_untag_one(d, call, p) && ...);
}

#else /* CUDA */

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#define SBK(name) dt_kcu_##name
#define SBK_DEV __device__
#define SBK_LAMBDA [=] __device__

struct sbk_thr {
  int tx, bx, ntx, nbx;
  char *smem;
  void *blk;
  __device__ void sync() const { __syncthreads(); }
};

typedef __nv_bfloat16 sbk_bf16;
static __device__ inline float sbk_bf2f(sbk_bf16 h) { return __bfloat162float(h); }
static __device__ inline sbk_bf16 sbk_f2bf(float f) { return __float2bfloat16_rn(f); }
static __device__ inline void sbk_atomic_add(float *p, float v) { atomicAdd(p, v); }
static __device__ inline void sbk_atomic_add(double *p, double v) { atomicAdd(p, v); }

template <class F> __global__ void sbk_entry(F f) {
  extern __shared__ __align__(16) char sbk_smem[];
  sbk_thr t;
  t.tx = (int)threadIdx.x;
  t.bx = (int)blockIdx.x;
  t.ntx = (int)blockDim.x;
  t.nbx = (int)gridDim.x;
  t.smem = sbk_smem;
  t.blk = nullptr;
  f(t);
}

template <class F>
static dt_status sbk_launch(dt_device *d, const char *name, int64_t grid, int block, size_t smem,
                            int flags, F f) {
  (void)flags;
  if (grid <= 0 || grid > INT_MAX || block <= 0 || block > SBK_MAX_BLOCK || smem > SBK_MAX_SMEM)
    return dt_error(d->ctx, DT_ERR_INVALID, name, "launch <<<%lld, %d, %zu>>> out of range",
                    (long long)grid, block, smem);
  cudaStream_t s = (cudaStream_t)dt_device_cuda_stream(d);
  if (!s) return d->ctx ? d->ctx->last_status : DT_ERR_BACKEND;
  sbk_entry<<<(unsigned)grid, (unsigned)block, smem, s>>>(f);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return dt_error(d->ctx, DT_ERR_BACKEND, name, "launch <<<%lld, %d, %zu>>>: %s",
                    (long long)grid, block, smem, cudaGetErrorString(e));
  return DT_OK;
}

/* Enough blocks to fill an H200 (132 SMs) several times over. */
enum { SBK_GRID_CAP = 132 * 16 };

template <class... P> static inline bool sbk_untag_all(dt_device *, const char *, P *&...) {
  return true;
}

#endif /* SB_KERN_EMU */

/* Untags the named device pointers in place (a no-op on the GPU); returns the
 * recorded error when one is a host pointer on the emulated device. */
#define SBK_UNTAG(d, call, ...)                                       \
  do {                                                                \
    if (!sbk_untag_all((d), (call), __VA_ARGS__)) return DT_ERR_INVALID; \
  } while (0)

/* Blocks for n items at `block` threads each, capped (grid-stride loops do the rest). */
static inline int64_t sbk_grid(int64_t n, int block) {
  int64_t g = (n + block - 1) / block;
  if (g > SBK_GRID_CAP) g = SBK_GRID_CAP;
  return g < 1 ? 1 : g;
}

/* for (i = global thread; i < n; i += all threads) */
#define SBK_FOR(i, n, t)                                                       \
  for (int64_t i = (int64_t)(t).bx * (t).ntx + (t).tx; i < (int64_t)(n);      \
       i += (int64_t)(t).nbx * (t).ntx)

/* Arithmetic type of a storage type: double for f64, float otherwise. */
template <class T> struct sbk_acc { typedef float type; };
template <> struct sbk_acc<double> { typedef double type; };

static SBK_DEV inline float sbk_ld(const float *p, int64_t i) { return p[i]; }
static SBK_DEV inline double sbk_ld(const double *p, int64_t i) { return p[i]; }
static SBK_DEV inline float sbk_ld(const sbk_bf16 *p, int64_t i) { return sbk_bf2f(p[i]); }
static SBK_DEV inline void sbk_st(float *p, int64_t i, float v) { p[i] = v; }
static SBK_DEV inline void sbk_st(double *p, int64_t i, double v) { p[i] = v; }
static SBK_DEV inline void sbk_st(sbk_bf16 *p, int64_t i, float v) { p[i] = sbk_f2bf(v); }

static SBK_DEV inline float sbk_exp(float x) { return expf(x); }
static SBK_DEV inline double sbk_exp(double x) { return exp(x); }
static SBK_DEV inline float sbk_log(float x) { return logf(x); }
static SBK_DEV inline double sbk_log(double x) { return log(x); }
static SBK_DEV inline float sbk_sqrt(float x) { return sqrtf(x); }
static SBK_DEV inline double sbk_sqrt(double x) { return sqrt(x); }
static SBK_DEV inline float sbk_sin(float x) { return sinf(x); }
static SBK_DEV inline double sbk_sin(double x) { return sin(x); }
static SBK_DEV inline float sbk_cos(float x) { return cosf(x); }
static SBK_DEV inline double sbk_cos(double x) { return cos(x); }
static SBK_DEV inline float sbk_pow(float x, float y) { return powf(x, y); }
static SBK_DEV inline double sbk_pow(double x, double y) { return pow(x, y); }

/* Reduction of v over the block's threads (t.ntx a power of two), through
 * t.ntx elements of A at buf in shared memory; every thread gets the result.
 * op: 0 sum, 1 max. Must be reached by every thread of the block. */
template <class A> static SBK_DEV inline A sbk_block_reduce(const sbk_thr &t, A v, A *buf, int op) {
  buf[t.tx] = v;
  t.sync();
  for (int s = t.ntx / 2; s > 0; s >>= 1) {
    if (t.tx < s) buf[t.tx] = op ? (buf[t.tx] > buf[t.tx + s] ? buf[t.tx] : buf[t.tx + s])
                                 : buf[t.tx] + buf[t.tx + s];
    t.sync();
  }
  A r = buf[0];
  t.sync();
  return r;
}

/* Dispatches on a floating dtype to FN<float|double|sbk_bf16>(args). */
#define SBK_FLOAT_DISPATCH(d, call, t, FN, ...)                                      \
  switch (t) {                                                                       \
    case DT_F32: return FN<float>(__VA_ARGS__);                                      \
    case DT_F64: return FN<double>(__VA_ARGS__);                                     \
    case DT_BF16: return FN<sbk_bf16>(__VA_ARGS__);                                  \
    default:                                                                         \
      return dt_error((d)->ctx, DT_ERR_UNSUPPORTED, (call), "dtype %s", dt_dtype_name(t)); \
  }

#endif /* SBK_H */
