/* lib/device/cpu/k_optim.c: the CPU device's optim kernels (AdamW): host loops
 * behind the dt_kern_optim slots of lib/device/kernels.h.
 *
 * One pass per element in f64 arithmetic, the update reading the unrounded
 * moments (torch/optim/adamw.py, _single_tensor_adamw: decoupled decay, then
 * the bias-corrected step), the same expression order as the CUDA kernel
 * (lib/device/kern/k_optim.cu). f32 and f64 without master weights, the common
 * case, run as plain loops over typed pointers; the mixed-precision forms
 * (another gradient dtype, f32 master weights behind a bf16 copy) go through
 * element loads and stores. */
#include "config.h"

#include <math.h>

#include "device/kernels.h"

static double ld(const void *p, dt_dtype t, int64_t i) {
  switch (t) {
    case DT_F64: return ((const double *)p)[i];
    case DT_F32: return ((const float *)p)[i];
    default: return dt_bf16_to_f32(((const dt_bf16 *)p)[i]);
  }
}

static void st(void *p, dt_dtype t, int64_t i, double v) {
  switch (t) {
    case DT_F64: ((double *)p)[i] = v; break;
    case DT_F32: ((float *)p)[i] = (float)v; break;
    default: ((dt_bf16 *)p)[i] = dt_f32_to_bf16((float)v); break;
  }
}

static bool floating(dt_dtype t) { return t == DT_F32 || t == DT_F64 || t == DT_BF16; }

static dt_status cpu_adamw(dt_device *d, int64_t n, dt_dtype stt, void *master, void *m, void *v,
                           dt_dtype gt, const void *g, dt_dtype wt, void *w,
                           const dt_kern_adamw_hp *hp) {
  static const char call[] = "kern.adamw";
  if (n == 0) return DT_OK;
  if (!hp || !m || !v || !g || !w) return dt_error(d->ctx, DT_ERR_INVALID, call, "NULL argument");
  if (stt != DT_F32 && stt != DT_F64)
    return dt_error(d->ctx, DT_ERR_UNSUPPORTED, call, "state dtype %s (f32 or f64)",
                    dt_dtype_name(stt));
  if (!floating(gt) || !floating(wt))
    return dt_error(d->ctx, DT_ERR_UNSUPPORTED, call, "gradient %s, weight %s", dt_dtype_name(gt),
                    dt_dtype_name(wt));
  if (!master && wt != stt)
    return dt_error(d->ctx, DT_ERR_INVALID, call, "a %s weight without a master copy in the state's %s",
                    dt_dtype_name(wt), dt_dtype_name(stt));
  const double b1 = hp->beta1, b2 = hp->beta2, eps = hp->eps;
  const double step = hp->lr / hp->bc1, sbc2 = sqrt(hp->bc2), decay = 1.0 - hp->lr * hp->weight_decay;
  if (!master && gt == stt && stt == DT_F64) {
    double *W = w, *M = m, *V = v;
    const double *G = g;
    for (int64_t e = 0; e < n; e++) {
      W[e] *= decay;
      M[e] = b1 * M[e] + (1 - b1) * G[e];
      V[e] = b2 * V[e] + (1 - b2) * G[e] * G[e];
      W[e] -= step * M[e] / (sqrt(V[e]) / sbc2 + eps);
    }
    return DT_OK;
  }
  if (!master && gt == stt && stt == DT_F32) {
    float *W = w, *M = m, *V = v;
    const float *G = g;
    for (int64_t e = 0; e < n; e++) {
      double we = W[e] * decay;
      double me = b1 * M[e] + (1 - b1) * G[e];
      double ve = b2 * V[e] + (1 - b2) * (double)G[e] * G[e];
      M[e] = (float)me;
      V[e] = (float)ve;
      W[e] = (float)(we - step * me / (sqrt(ve) / sbc2 + eps));
    }
    return DT_OK;
  }
  void *ms = master ? master : w;
  for (int64_t e = 0; e < n; e++) {
    const double ge = ld(g, gt, e);
    const double pe = ld(ms, stt, e) * decay;
    const double me = b1 * ld(m, stt, e) + (1 - b1) * ge;
    const double ve = b2 * ld(v, stt, e) + (1 - b2) * ge * ge;
    st(m, stt, e, me);
    st(v, stt, e, ve);
    st(ms, stt, e, pe - step * me / (sqrt(ve) / sbc2 + eps));
    if (master) st(w, wt, e, ld(ms, stt, e));
  }
  return DT_OK;
}

const dt_kern_optim dt_cpu_optim = {
    .adamw = cpu_adamw,
};
