/* lib/device/kern/k_pw.cu: element-wise, layout and reduction kernels (the
 * dt_kern_pw group of lib/device/kernels.h), built for CUDA and for the host
 * emulator (sbk.cuh). Arithmetic is in the storage type's sbk_acc type (f32 for
 * f32 and bf16, f64 for f64), as the ops' host kernels do. */
#include "device/kern/sbk.cuh"

namespace {

enum { PW_BLOCK = 256 };

template <class T> dt_status silu_t(dt_device *d, int64_t n, const void *xv, void *yv) {
  const T *x = (const T *)xv;
  T *y = (T *)yv;
  typedef typename sbk_acc<T>::type A;
  return sbk_launch(d, "kern.silu", sbk_grid(n, PW_BLOCK), PW_BLOCK, 0, 0,
                    SBK_LAMBDA(const sbk_thr &t) {
                      SBK_FOR(i, n, t) {
                        A v = sbk_ld(x, i);
                        sbk_st(y, i, v / ((A)1 + sbk_exp(-v)));
                      }
                    });
}

dt_status silu(dt_device *d, dt_dtype t, int64_t n, const void *x, void *y) {
  if (n == 0) return DT_OK;
  SBK_UNTAG(d, "kern.silu", x, y);
  SBK_FLOAT_DISPATCH(d, "kern.silu", t, silu_t, d, n, x, y);
}

template <class S, class D> dt_status cast_t(dt_device *d, const void *sv, void *dv, int64_t n) {
  const S *s = (const S *)sv;
  D *o = (D *)dv;
  return sbk_launch(d, "kern.cast", sbk_grid(n, PW_BLOCK), PW_BLOCK, 0, 0,
                    SBK_LAMBDA(const sbk_thr &t) {
                      SBK_FOR(i, n, t) sbk_st(o, i, sbk_ld(s, i));
                    });
}

template <class S> dt_status cast_from(dt_device *d, const void *s, dt_dtype td, void *o, int64_t n) {
  switch (td) {
    case DT_F32: return cast_t<S, float>(d, s, o, n);
    case DT_F64: return cast_t<S, double>(d, s, o, n);
    case DT_BF16: return cast_t<S, sbk_bf16>(d, s, o, n);
    default: return dt_error(d->ctx, DT_ERR_UNSUPPORTED, "kern.cast", "to %s", dt_dtype_name(td));
  }
}

dt_status cast(dt_device *d, dt_dtype ts, const void *src, dt_dtype td, void *dst, int64_t n) {
  if (n == 0) return DT_OK;
  SBK_UNTAG(d, "kern.cast", src, dst);
  SBK_FLOAT_DISPATCH(d, "kern.cast", ts, cast_from, d, src, td, dst, n);
}

} // namespace

extern "C" const dt_kern_pw SBK(pw) = {
    silu,
    cast,
};
