/* lib/device/device_emu.c: the emulated CUDA device ("cuda-emu").
 *
 * It stands in for the cuda device where no GPU is: its arrays are of kind
 * DT_DEV_CUDA, its kernels are the CUDA kernels built for the host
 * (dt_kernels_emu, lib/device/kern), and GEMM, fill and axpy run on the CPU
 * device's code. Its memory is host memory handed out as address + DT_EMU_TAG,
 * so code above that reads or writes device memory without the device (a
 * missing copy to or from the host) faults here as it would on a GPU, instead
 * of passing by accident. Everything is synchronous. No state outside d->impl.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "device/device.h"
#include "device/kernels.h"

typedef struct emu_impl {
  dt_device *cpu; /* GEMM, fill and axpy on untagged pointers */
} emu_impl;

static emu_impl *impl_of(dt_device *d) { return (emu_impl *)d->impl; }

/* The host address behind a device pointer; NULL (error recorded) when p is
 * not one. */
static void *untag(dt_device *d, const void *p, const char *call) {
  uintptr_t u = (uintptr_t)p;
  if (!(u & DT_EMU_TAG)) {
    (void)dt_error(d->ctx, DT_ERR_INVALID, call, "%p is not a cuda-emu device pointer", p);
    return NULL;
  }
  return (void *)(u - DT_EMU_TAG);
}

static dt_status emu_alloc(dt_device *d, size_t bytes, void **out) {
  /* 256-byte alignment, as cudaMalloc gives. */
  *out = NULL;
  void *p = bytes > SIZE_MAX - 512 ? NULL : aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
  if (!p) return dt_error(d->ctx, DT_ERR_NOMEM, "dt_device_alloc", "cuda-emu: %zu bytes", bytes);
  dt_mem_track_device(d->ctx, bytes, true);
  *out = (void *)((uintptr_t)p + DT_EMU_TAG);
  return DT_OK;
}

static void emu_free(dt_device *d, void *p, size_t bytes) {
  void *h = untag(d, p, "dt_device_free");
  if (!h) return;
  free(h);
  dt_mem_track_device(d->ctx, bytes, false);
}

static dt_status emu_copy(dt_device *d, void *dst, const void *src, size_t bytes, dt_copy_kind k) {
  const char *c = "dt_device_copy";
  void *hd = dst;
  const void *hs = src;
  if (k == DT_COPY_H2D || k == DT_COPY_D2D) hd = untag(d, dst, c);
  if (k == DT_COPY_D2H || k == DT_COPY_D2D) hs = untag(d, src, c);
  if (!hd || !hs) return d->ctx ? d->ctx->last_status : DT_ERR_INVALID;
  /* A host side that is a device pointer is the caller's wrong copy kind. */
  if ((k == DT_COPY_D2H || k == DT_COPY_H2H) && ((uintptr_t)dst & DT_EMU_TAG))
    return dt_error(d->ctx, DT_ERR_INVALID, c, "the destination is device memory");
  if ((k == DT_COPY_H2D || k == DT_COPY_H2H) && ((uintptr_t)src & DT_EMU_TAG))
    return dt_error(d->ctx, DT_ERR_INVALID, c, "the source is device memory");
  memmove(hd, hs, bytes);
  return DT_OK;
}

static dt_status emu_gemm(dt_device *d, const dt_gemm_desc *g) {
  dt_gemm_desc h = *g;
  const char *c = "dt_device_gemm";
  h.c = untag(d, g->c, c);
  if (g->k > 0) {
    h.a = untag(d, g->a, c);
    h.b = untag(d, g->b, c);
    if (!h.a || !h.b) return d->ctx ? d->ctx->last_status : DT_ERR_INVALID;
  }
  if (!h.c) return d->ctx ? d->ctx->last_status : DT_ERR_INVALID;
  /* the CPU's slot, not its front: the front already checked and recorded this call */
  dt_device *cpu = impl_of(d)->cpu;
  return cpu->ops->gemm(cpu, &h);
}

static dt_status emu_fill(dt_device *d, dt_dtype t, void *x, int64_t n, double value) {
  void *h = untag(d, x, "dt_device_fill");
  if (!h) return d->ctx ? d->ctx->last_status : DT_ERR_INVALID;
  dt_device *cpu = impl_of(d)->cpu; /* the slot: the front recorded this call */
  return cpu->ops->fill(cpu, t, h, n, value);
}

static dt_status emu_axpy(dt_device *d, dt_dtype t, int64_t n, double alpha, const void *x,
                          void *y) {
  const void *hx = untag(d, x, "dt_device_axpy");
  void *hy = untag(d, y, "dt_device_axpy");
  if (!hx || !hy) return d->ctx ? d->ctx->last_status : DT_ERR_INVALID;
  dt_device *cpu = impl_of(d)->cpu; /* the slot: the front recorded this call */
  return cpu->ops->axpy(cpu, t, n, alpha, hx, hy);
}

static void emu_destroy(dt_device *d) {
  if (d->impl) dt_device_destroy(impl_of(d)->cpu);
  free(d->impl);
  free(d);
}

static const dt_device_ops emu_ops = {
    .name = "cuda-emu",
    .alloc = emu_alloc,
    .free = emu_free,
    .copy = emu_copy,
    .gemm = emu_gemm,
    .fill = emu_fill,
    .axpy = emu_axpy,
    .sync = NULL,
    .destroy = emu_destroy,
    .kern = &dt_kernels_emu,
};

dt_status dt_device_cuda_emu_create(dt_ctx *ctx, dt_device **out) {
  if (!out) return dt_error(ctx, DT_ERR_INVALID, "dt_device_cuda_emu_create", "NULL out");
  *out = NULL;
  dt_device *d = calloc(1, sizeof *d);
  emu_impl *im = calloc(1, sizeof *im);
  if (!d || !im) {
    free(d);
    free(im);
    return dt_error(ctx, DT_ERR_NOMEM, "dt_device_cuda_emu_create", "no memory");
  }
  d->ops = &emu_ops;
  d->kind = DT_DEV_CUDA;
  d->ctx = ctx;
  d->impl = im;
  dt_status st = dt_device_cpu_create(ctx, &im->cpu);
  if (st != DT_OK) {
    free(im);
    free(d);
    return st;
  }
  dt_device_install_memory(d);
  *out = d;
  return DT_OK;
}
