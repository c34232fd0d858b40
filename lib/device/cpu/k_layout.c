/* lib/device/cpu/k_layout.c: the CPU device's layout kernels (box copies and the
 * n-way reduce): host loops behind the dt_kern_layout slots of
 * lib/device/kernels.h.
 *
 * copy_box is core's dt_copy_box. reduce folds its inputs left to right in the
 * arithmetic type (f32 for f32 and bf16, f64 for f64), max and min letting a NaN
 * operand win, as the comm backends' dt_reduce_into does for each pair; bf16 is
 * rounded once, at the end. avg divides the sum as dt_div_inplace does: a true
 * division (the mean of equal values is exact), f32 by the divisor rounded to
 * f32, bf16 in f64 then rounded to f32 and to bf16 (the value of an f32
 * division: double rounding is harmless for a quotient of f32 values). */
#include "config.h"

#include <string.h>

#include "device/kernels.h"

static dt_status cpu_copy_box(dt_device *d, size_t es, int ndim, void *dst,
                              const int64_t *dst_shape, const int64_t *dst_off, const void *src,
                              const int64_t *src_shape, const int64_t *src_off,
                              const int64_t *box) {
  if (ndim < 0 || ndim > DT_MAX_DIMS || es == 0)
    return dt_error(d->ctx, DT_ERR_INVALID, "kern.copy_box", "ndim %d, element size %zu", ndim, es);
  dt_copy_box(es, ndim, dst, dst_shape, dst_off, src, src_shape, src_off, box);
  return DT_OK;
}

/* One round: out[i] = in[0][i] op ... op in[nin-1][i] in the arithmetic type A
 * of storage T (LD / ST convert), then / divisor when divide. */
#define RED_ROUND(T, A, LD, ST, DIV)                                                       \
  do {                                                                                     \
    T *o_ = out;                                                                           \
    for (int64_t i = 0; i < n; i++) {                                                      \
      A x = LD(((const T *)in[0])[i]);                                                     \
      for (int j = 1; j < nin; j++) {                                                      \
        A y = LD(((const T *)in[j])[i]);                                                   \
        switch (op) {                                                                      \
          case DT_KRED_MAX: x = y > x || y != y ? y : x; break;                            \
          case DT_KRED_MIN: x = y < x || y != y ? y : x; break;                            \
          case DT_KRED_PROD: x = x * y; break;                                             \
          default: x = x + y; break;                                                       \
        }                                                                                  \
      }                                                                                    \
      if (divide) x = DIV(x);                                                              \
      o_[i] = ST(x);                                                                       \
    }                                                                                      \
  } while (0)

#define ID(v) (v)
#define DIV_F32(v) ((v) / fdiv)
#define DIV_F64(v) ((v) / divisor)
#define DIV_BF16(v) ((float)((double)(v) / divisor))

static dt_status cpu_reduce(dt_device *d, dt_dtype t, int op, int64_t n, int nin,
                            const void *const *in, void *out, double divisor) {
  if (n == 0) return DT_OK;
  if (nin < 1 || !in || op < DT_KRED_SUM || op > DT_KRED_PROD)
    return dt_error(d->ctx, DT_ERR_INVALID, "kern.reduce", "%d inputs, op %d", nin, op);
  const bool divide = op == DT_KRED_AVG;
  const float fdiv = (float)divisor;
  /* out may be one of the inputs: each element is read before it is written */
  switch (t) {
    case DT_F32: RED_ROUND(float, float, ID, ID, DIV_F32); break;
    case DT_F64: RED_ROUND(double, double, ID, ID, DIV_F64); break;
    case DT_BF16: RED_ROUND(dt_bf16, float, dt_bf16_to_f32, dt_f32_to_bf16, DIV_BF16); break;
    default:
      return dt_error(d->ctx, DT_ERR_UNSUPPORTED, "kern.reduce", "dtype %s", dt_dtype_name(t));
  }
  return DT_OK;
}

const dt_kern_layout dt_cpu_layout = {
    .copy_box = cpu_copy_box,
    .reduce = cpu_reduce,
};
