/* lib/device/kern/k_optim.cu: the dt_kern_optim group of lib/device/kernels.h, built
 * for CUDA and for the host emulator (sbk.cuh).
 *
 * AdamW is one fused element-wise pass over a flat buffer: every operand is
 * read and written once (7 memory streams with a separate bf16 copy), as
 * PyTorch's fused AdamW (torch/optim/adamw.py, fused=True: _fused_adamw_)
 * does. The arithmetic is f64 whatever the storage: the host loop of
 * lib/nn/model.c computes in f64 too, and the pass is memory-bound, so the
 * wider arithmetic costs nothing measurable. */
#include "device/kern/sbk.cuh"

namespace {

enum { OPT_BLOCK = 256 };

static SBK_DEV inline void st_f(float *p, int64_t i, double v) { p[i] = (float)v; }
static SBK_DEV inline void st_f(double *p, int64_t i, double v) { p[i] = v; }
static SBK_DEV inline void st_f(sbk_bf16 *p, int64_t i, double v) { p[i] = sbk_f2bf((float)v); }

/* S: master/moment storage, G: gradient, P: the low-precision copy (unused when w == NULL). */
template <class S, class G, class P>
dt_status adamw_t(dt_device *d, int64_t n, S *ms, S *m, S *v, const G *g, P *w,
                  dt_kern_adamw_hp hp) {
  const double b1 = hp.beta1, b2 = hp.beta2, eps = hp.eps;
  const double step = hp.lr / hp.bc1, sbc2 = sqrt(hp.bc2), decay = 1.0 - hp.lr * hp.weight_decay;
  return sbk_launch(d, "kern.adamw", sbk_grid(n, OPT_BLOCK), OPT_BLOCK, 0, 0,
                    SBK_LAMBDA(const sbk_thr &t) {
                      SBK_FOR(i, n, t) {
                        const double ge = (double)sbk_ld(g, i);
                        const double pe = (double)sbk_ld(ms, i) * decay;
                        const double me = b1 * (double)sbk_ld(m, i) + (1 - b1) * ge;
                        const double ve = b2 * (double)sbk_ld(v, i) + (1 - b2) * ge * ge;
                        st_f(m, i, me);
                        st_f(v, i, ve);
                        /* the update reads the unrounded moments, as the host loop does */
                        const double upd = pe - step * me / (sqrt(ve) / sbc2 + eps);
                        st_f(ms, i, upd);
                        if (w) st_f(w, i, (double)sbk_ld(ms, i));
                      }
                    });
}

template <class S, class G>
dt_status adamw_w(dt_device *d, int64_t n, void *ms, void *m, void *v, const void *g, dt_dtype wt,
                  void *w, const dt_kern_adamw_hp &hp) {
  S *s = (S *)ms, *mm = (S *)m, *vv = (S *)v;
  const G *gg = (const G *)g;
  switch (wt) {
    case DT_F32: return adamw_t<S, G, float>(d, n, s, mm, vv, gg, (float *)w, hp);
    case DT_F64: return adamw_t<S, G, double>(d, n, s, mm, vv, gg, (double *)w, hp);
    case DT_BF16: return adamw_t<S, G, sbk_bf16>(d, n, s, mm, vv, gg, (sbk_bf16 *)w, hp);
    default:
      return dt_error(d->ctx, DT_ERR_UNSUPPORTED, "kern.adamw", "weight dtype %s",
                      dt_dtype_name(wt));
  }
}

template <class S>
dt_status adamw_g(dt_device *d, int64_t n, void *ms, void *m, void *v, dt_dtype gt, const void *g,
                  dt_dtype wt, void *w, const dt_kern_adamw_hp &hp) {
  switch (gt) {
    case DT_F32: return adamw_w<S, float>(d, n, ms, m, v, g, wt, w, hp);
    case DT_F64: return adamw_w<S, double>(d, n, ms, m, v, g, wt, w, hp);
    case DT_BF16: return adamw_w<S, sbk_bf16>(d, n, ms, m, v, g, wt, w, hp);
    default:
      return dt_error(d->ctx, DT_ERR_UNSUPPORTED, "kern.adamw", "gradient dtype %s",
                      dt_dtype_name(gt));
  }
}

dt_status adamw(dt_device *d, int64_t n, dt_dtype st, void *master, void *m, void *v, dt_dtype gt,
                const void *g, dt_dtype wt, void *w, const dt_kern_adamw_hp *hp) {
  if (n == 0) return DT_OK;
  if (!hp || !m || !v || !g || !w)
    return dt_error(d->ctx, DT_ERR_INVALID, "kern.adamw", "NULL argument");
  if (!master && wt != st)
    return dt_error(d->ctx, DT_ERR_INVALID, "kern.adamw",
                    "a %s weight without a master copy in the state's %s", dt_dtype_name(wt),
                    dt_dtype_name(st));
  SBK_UNTAG(d, "kern.adamw", master, m, v, g, w);
  void *ms = master ? master : w, *wc = master ? w : NULL;
  const dt_kern_adamw_hp h = *hp;
  switch (st) {
    case DT_F32: return adamw_g<float>(d, n, ms, m, v, gt, g, wt, wc, h);
    case DT_F64: return adamw_g<double>(d, n, ms, m, v, gt, g, wt, wc, h);
    default:
      return dt_error(d->ctx, DT_ERR_UNSUPPORTED, "kern.adamw", "state dtype %s (f32 or f64)",
                      dt_dtype_name(st));
  }
}

} // namespace

extern "C" const dt_kern_optim SBK(optim) = {
    adamw,
};
