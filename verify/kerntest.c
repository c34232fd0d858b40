/* verify/kerntest.c: see kerntest.h. */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kerntest.h"

int kt_open(kt_dev *T, dt_ctx *ctx, bool on_cuda) {
  memset(T, 0, sizeof *T);
  T->ctx = ctx;
  dt_status st;
  if (on_cuda) {
    if (!dt_device_cuda_built() || dt_device_cuda_count() == 0) {
      printf("SKIP: no usable GPU (CUDA built: %s)\n", dt_device_cuda_built() ? "yes" : "no");
      return SB_SKIP;
    }
    st = dt_device_cuda_create(ctx, 0, &T->dev);
    if (st == DT_ERR_NODEVICE) {
      printf("SKIP: %s\n", dt_last_error(ctx));
      return SB_SKIP;
    }
    T->name = "cuda";
  } else {
    st = dt_device_cuda_emu_create(ctx, &T->dev);
    T->name = "cuda-emu";
  }
  if (st != DT_OK || !T->dev || !T->dev->ops->kern) {
    printf("FAIL: cannot open %s: %s\n", T->name, dt_last_error(ctx));
    return 1;
  }
  T->K = T->dev->ops->kern;
  printf("device under test: %s (kernels: %s)\n", T->name, T->K->name);
  return 0;
}

int kt_open_cpu(kt_dev *T, dt_ctx *ctx) {
  memset(T, 0, sizeof *T);
  T->ctx = ctx;
  T->name = "cpu";
  if (dt_device_cpu_create(ctx, &T->dev) != DT_OK || !T->dev->ops->kern) {
    printf("FAIL: cannot open cpu: %s\n", dt_last_error(ctx));
    return 1;
  }
  T->K = T->dev->ops->kern;
  printf("device under test: %s (kernels: %s)\n", T->name, T->K->name);
  return 0;
}

void kt_close(kt_dev *T) { dt_device_destroy(T->dev); }

/* The CPU device's memory is host memory: its copies are host to host. */
static dt_copy_kind kind_of(const kt_dev *T, bool up) {
  return T->dev->kind == DT_DEV_CPU ? DT_COPY_H2H : up ? DT_COPY_H2D : DT_COPY_D2H;
}

void kt_h2d(kt_dev *T, void *d, const void *h, size_t bytes) {
  TU_OK(T->ctx, dt_device_copy(T->dev, d, h, bytes, kind_of(T, true)));
}

void *kt_up(kt_dev *T, const void *h, size_t bytes) {
  void *d = NULL;
  TU_OK(T->ctx, dt_device_alloc(T->dev, bytes, &d));
  if (d && h) kt_h2d(T, d, h, bytes);
  return d;
}

void kt_down(kt_dev *T, void *h, const void *d, size_t bytes) {
  TU_OK(T->ctx, dt_device_sync(T->dev));
  TU_OK(T->ctx, dt_device_copy(T->dev, h, d, bytes, kind_of(T, false)));
}

void kt_free(kt_dev *T, void *d, size_t bytes) { dt_device_free(T->dev, d, bytes); }

void kt_uniform(double *v, int64_t n, uint64_t seed, uint64_t stream, double lo, double hi) {
  for (int64_t i = 0; i < n; i++) v[i] = lo + (hi - lo) * dt_rng_uniform(seed, stream, (uint64_t)i);
}

void *kt_pack(dt_dtype t, const double *v, int64_t n) {
  void *p = malloc((size_t)(n > 0 ? n : 1) * dt_dtype_size(t));
  for (int64_t i = 0; i < n; i++) {
    switch (t) {
      case DT_F32: ((float *)p)[i] = (float)v[i]; break;
      case DT_F64: ((double *)p)[i] = v[i]; break;
      case DT_BF16: ((dt_bf16 *)p)[i] = dt_f32_to_bf16((float)v[i]); break;
      case DT_I64: ((int64_t *)p)[i] = (int64_t)v[i]; break;
      default: break;
    }
  }
  return p;
}

void kt_unpack(dt_dtype t, const void *p, double *v, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    switch (t) {
      case DT_F32: v[i] = ((const float *)p)[i]; break;
      case DT_F64: v[i] = ((const double *)p)[i]; break;
      case DT_BF16: v[i] = dt_bf16_to_f32(((const dt_bf16 *)p)[i]); break;
      case DT_I64: v[i] = (double)((const int64_t *)p)[i]; break;
      default: v[i] = NAN; break;
    }
  }
}

void kt_round(dt_dtype t, double *v, int64_t n) {
  void *h = kt_pack(t, v, n);
  kt_unpack(t, h, v, n);
  free(h);
}

double kt_nearest_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
  float flo, fhi;
  memcpy(&flo, &lo, 4);
  memcpy(&fhi, &hi, 4);
  double dl = fabs((double)f - flo), dh = fabs((double)fhi - f);
  if (dl < dh) return flo;
  if (dh < dl) return fhi;
  return (lo >> 16) & 1 ? fhi : flo;
}

double kt_unit(dt_dtype t) {
  return t == DT_F64 ? ldexp(1, -53) : t == DT_BF16 ? ldexp(1, -8) : ldexp(1, -24);
}

int64_t kt_mismatch(const double *got, const double *want, int64_t n, double tol) {
  for (int64_t i = 0; i < n; i++) {
    double scale = fabs(want[i]) > 1 ? fabs(want[i]) : 1;
    if (!(fabs(got[i] - want[i]) <= tol * scale)) return i;
  }
  return -1;
}

bool kt_close_to(const char *what, const double *got, const double *want, int64_t n, double tol) {
  int64_t i = kt_mismatch(got, want, n, tol);
  TU_CHECK(i < 0, "%s: [%lld] = %.17g, expected %.17g (tol %.3g)", what, (long long)i,
           i < 0 ? 0 : got[i], i < 0 ? 0 : want[i], tol);
  return i < 0;
}
