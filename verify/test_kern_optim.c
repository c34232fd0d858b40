/* verify/test_kern_optim.c: the optimizer kernels (lib/device/kernels.h,
 * dt_kern_optim) against a reference computed here in double, on the cuda-emu
 * device or, built with -DKERN_ON_CUDA (test_kern_optim_cuda), on GPU 0, which
 * exits 77 (SKIP) where there is none, or with -DKERN_ON_CPU (test_kern_optim_cpu)
 * on the CPU device's host loop.
 *
 * optim.adamw against torch.optim.AdamW's update as torch/optim/adamw.py
 * (_single_tensor_adamw, decoupled weight decay) writes it:
 *   param.mul_(1 - lr * weight_decay)
 *   exp_avg.lerp_(grad, 1 - beta1)
 *   exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
 *   step_size = lr / (1 - beta1^step); bias_correction2_sqrt = sqrt(1 - beta2^step)
 *   denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
 *   param.addcdiv_(exp_avg, denom, value=-step_size)
 * for several steps (the bias corrections change each step), on f32 and f64
 * state, and on bf16 weights with f32 master weights and moments (a bf16 or an
 * f32 gradient), the bf16 copy rounded from the updated master (TorchTitan's
 * FSDP2 MixedPrecisionPolicy(param_dtype=bf16): the optimizer steps the f32
 * sharded parameter; the bf16 copy is made from it).
 *
 * Each step's reference starts from the state the kernel stored after the
 * previous step (downloaded), so a step is checked alone and errors do not
 * compound. Tolerance: both sides compute in f64 from the same stored inputs
 * (a handful of f64 roundings apart, FMA contraction on the GPU included)
 * and each rounds once to the state's dtype, so two results can land one
 * unit (2 u of the dtype, relative) apart when they straddle a rounding
 * boundary: 2 u(st) + 64 u(f64), relative to the magnitude of the terms that
 * make the value (|a| + |b| for a + b), the forward-error scale of a sum
 * whose terms may cancel. The bf16 copy must be exactly the bf16 nearest the
 * stored f32 master.
 */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kerntest.h"

static const int64_t sizes[] = {1, 7, 256, 1000, 100003};
enum { N_SIZES = sizeof sizes / sizeof sizes[0], N_STEPS = 4 };


/* The first i with |got - want| > tol * scale[i] (NaN counts), or -1. */
static int64_t scaled_mismatch(const double *got, const double *want, const double *scale,
                               int64_t n, double tol) {
  for (int64_t i = 0; i < n; i++)
    if (!(fabs(got[i] - want[i]) <= tol * scale[i])) return i;
  return -1;
}

static bool scaled_close(const char *what, const double *got, const double *want,
                         const double *scale, int64_t n, double tol) {
  int64_t i = scaled_mismatch(got, want, scale, n, tol);
  TU_CHECK(i < 0, "%s: [%lld] got %.17g want %.17g (|diff| %.3g > %.3g)", what,
           (long long)(i < 0 ? 0 : i), got[i < 0 ? 0 : i], want[i < 0 ? 0 : i],
           i < 0 ? 0.0 : fabs(got[i] - want[i]), i < 0 ? 0.0 : tol * scale[i]);
  return i < 0;
}

typedef struct acase {
  dt_dtype st, gt, wt; /* state, gradient, weight */
  bool master;         /* a separate master copy (the weight is wt) */
  double lr, wd;
} acase;

static void one_case(kt_dev *T, const acase *c, int64_t n) {
  const size_t ss = dt_dtype_size(c->st), gs = dt_dtype_size(c->gt), ws = dt_dtype_size(c->wt);
  const double b1 = 0.9, b2 = 0.95, eps = 1e-8;
  double *p = malloc(n * sizeof *p), *m = calloc(n, sizeof *m), *v = calloc(n, sizeof *v);
  double *g = malloc(n * sizeof *g), *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
  double *scale = malloc(n * sizeof *scale), *tmp = malloc(n * sizeof *tmp);
  kt_uniform(p, n, 5, 0, -1, 1);
  void *hp = kt_pack(c->st, p, n), *hm = kt_pack(c->st, m, n), *hv = kt_pack(c->st, v, n);
  void *hw = malloc(n * ws), *hg = NULL;
  void *dms = kt_up(T, hp, n * ss), *dm = kt_up(T, hm, n * ss), *dv = kt_up(T, hv, n * ss);
  void *dw = c->master ? kt_up(T, NULL, n * ws) : NULL, *dg = kt_up(T, NULL, n * gs);
  kt_unpack(c->st, hp, p, n); /* the state as stored */
  char what[96];
  for (int step = 1; step <= N_STEPS; step++) {
    /* gradients of mixed sign and size, new each step */
    kt_uniform(g, n, 9, (uint64_t)step, -0.05, 0.05);
    free(hg);
    hg = kt_pack(c->gt, g, n);
    kt_unpack(c->gt, hg, g, n);
    kt_h2d(T, dg, hg, n * gs);
    const dt_kern_adamw_hp h = {c->lr, b1, b2, eps, c->wd, 1 - pow(b1, step), 1 - pow(b2, step)};
    TU_OK(T->ctx, T->K->optim->adamw(T->dev, n, c->st, c->master ? dms : NULL, dm, dv, c->gt, dg,
                                     c->wt, c->master ? dw : dms, &h));
    /* the reference from the previous stored state (p, m, v) */
    const double step_size = c->lr / (1 - pow(b1, step)), bc2_sqrt = sqrt(1 - pow(b2, step));
    double *mn = malloc(n * sizeof *mn), *vn = malloc(n * sizeof *vn);
    double *sm = malloc(n * sizeof *sm), *sv = malloc(n * sizeof *sv);
    for (int64_t i = 0; i < n; i++) {
      const double pd = p[i] * (1 - c->lr * c->wd);
      mn[i] = m[i] + (1 - b1) * (g[i] - m[i]); /* lerp */
      sm[i] = fabs(b1 * m[i]) + fabs((1 - b1) * g[i]);
      vn[i] = v[i] * b2 + (1 - b2) * g[i] * g[i];
      sv[i] = vn[i];
      const double denom = sqrt(vn[i]) / bc2_sqrt + eps, u = step_size * mn[i] / denom;
      want[i] = pd - u;
      scale[i] = fabs(pd) + fabs(u);
    }
    const double tol = 2 * kt_unit(c->st) + 64 * kt_unit(DT_F64);
    snprintf(what, sizeof what, "adamw st=%s g=%s w=%s%s n=%lld step %d", dt_dtype_name(c->st),
             dt_dtype_name(c->gt), dt_dtype_name(c->wt), c->master ? " (master)" : "",
             (long long)n, step);
    kt_down(T, hp, dms, n * ss);
    kt_down(T, hm, dm, n * ss);
    kt_down(T, hv, dv, n * ss);
    kt_unpack(c->st, hp, got, n);
    bool ok = scaled_close(what, got, want, scale, n, tol);
    memcpy(p, got, n * sizeof *p);
    kt_unpack(c->st, hm, got, n);
    ok = scaled_close(what, got, mn, sm, n, tol) && ok;
    memcpy(m, got, n * sizeof *m);
    kt_unpack(c->st, hv, got, n);
    ok = scaled_close(what, got, vn, sv, n, tol) && ok;
    memcpy(v, got, n * sizeof *v);
    if (c->master) { /* the low-precision copy: the nearest wt value to the stored master */
      kt_down(T, hw, dw, n * ws);
      kt_unpack(c->wt, hw, got, n);
      for (int64_t i = 0; i < n; i++)
        tmp[i] = c->wt == DT_BF16 ? kt_nearest_bf16((float)p[i]) : c->wt == DT_F32 ? (float)p[i] : p[i];
      kt_close_to(what, got, tmp, n, 0);
    }
    free(mn), free(vn), free(sm), free(sv);
    if (!ok) break;
  }
  kt_free(T, dms, n * ss), kt_free(T, dm, n * ss), kt_free(T, dv, n * ss), kt_free(T, dg, n * gs);
  if (dw) kt_free(T, dw, n * ws);
  free(p), free(m), free(v), free(g), free(want), free(got), free(scale), free(tmp);
  free(hp), free(hm), free(hv), free(hw), free(hg);
}

static void test_adamw(kt_dev *T) {
  const acase cases[] = {
      {DT_F32, DT_F32, DT_F32, false, 8e-4, 0.1}, /* run's defaults (DT_ADAMW_DEFAULT) */
      {DT_F64, DT_F64, DT_F64, false, 8e-4, 0.1},
      {DT_F32, DT_F32, DT_F32, false, 3e-2, 0.5}, /* decay large enough to dominate */
      {DT_F32, DT_BF16, DT_BF16, true, 8e-4, 0.1}, /* bf16 params and grads, f32 master */
      {DT_F32, DT_F32, DT_BF16, true, 3e-2, 0.1},  /* bf16 params, f32 grads (reduce_dtype) */
      {DT_F64, DT_F64, DT_F32, true, 3e-2, 0.1},
  };
  const int nc = (int)(sizeof cases / sizeof cases[0]);
  for (int k = 0; k < nc; k++)
    for (int si = 0; si < N_SIZES; si++) one_case(T, &cases[k], sizes[si]);
  printf("optim.adamw: %d dtype cases x %d sizes x %d steps\n", nc, N_SIZES, N_STEPS);
}

#ifdef KERN_ON_CPU
/* The CPU kernel's plain f32 / f64 loops, written here one element at a time in
 * the kernel's expression order (lib/device/cpu/k_optim.c): the CPU's vector
 * path must give these bits exactly, at every length (the 4-wide body and the
 * scalar tail) and offset. fma = true is the planted bug: the moments'
 * products contracted into fused multiply-adds, which the comparison must tell
 * apart (bitwise). */
static void naive_f32(int64_t n, float *W, float *M, float *V, const float *G,
                      const dt_kern_adamw_hp *h, bool fma_bug) {
  const double b1 = h->beta1, b2 = h->beta2, eps = h->eps, step = h->lr / h->bc1;
  const double sbc2 = sqrt(h->bc2), decay = 1.0 - h->lr * h->weight_decay;
  for (int64_t e = 0; e < n; e++) {
    double we = W[e] * decay;
    double me = fma_bug ? fma(b1, M[e], (1 - b1) * G[e]) : b1 * M[e] + (1 - b1) * G[e];
    double ve = b2 * V[e] + (1 - b2) * (double)G[e] * G[e];
    M[e] = (float)me;
    V[e] = (float)ve;
    W[e] = (float)(we - step * me / (sqrt(ve) / sbc2 + eps));
  }
}
static void naive_f64(int64_t n, double *W, double *M, double *V, const double *G,
                      const dt_kern_adamw_hp *h, bool fma_bug) {
  const double b1 = h->beta1, b2 = h->beta2, eps = h->eps, step = h->lr / h->bc1;
  const double sbc2 = sqrt(h->bc2), decay = 1.0 - h->lr * h->weight_decay;
  for (int64_t e = 0; e < n; e++) {
    W[e] *= decay;
    M[e] = fma_bug ? fma(b1, M[e], (1 - b1) * G[e]) : b1 * M[e] + (1 - b1) * G[e];
    V[e] = b2 * V[e] + (1 - b2) * G[e] * G[e];
    W[e] -= step * M[e] / (sqrt(V[e]) / sbc2 + eps);
  }
}

/* Byte-compares the kernel's w, m, v after 3 steps with the naive loop's (or,
 * fma_bug, the planted one's); true when all equal. */
static bool cpu_bits_case(kt_dev *T, dt_dtype t, int64_t n, int64_t off, bool fma_bug) {
  const size_t es = dt_dtype_size(t), bytes = (size_t)(n + off) * es;
  double *tmp = malloc((size_t)(n + off) * sizeof *tmp);
  char *buf[8];
  for (int k = 0; k < 8; k++) buf[k] = malloc(bytes ? bytes : 1);
  /* buf 0-3: the kernel's w m v g; 4-7: the naive loop's */
  kt_uniform(tmp, n + off, 21, 0, -1, 1);
  void *w0 = kt_pack(t, tmp, n + off);
  memcpy(buf[0], w0, bytes), memcpy(buf[4], w0, bytes), free(w0);
  memset(buf[1], 0, bytes), memset(buf[2], 0, bytes), memset(buf[5], 0, bytes), memset(buf[6], 0, bytes);
  bool same = true;
  for (int step = 1; step <= 3; step++) {
    kt_uniform(tmp, n + off, 22, (uint64_t)step, -0.05, 0.05);
    void *g = kt_pack(t, tmp, n + off);
    memcpy(buf[3], g, bytes), memcpy(buf[7], g, bytes), free(g);
    const dt_kern_adamw_hp h = {8e-4, 0.9, 0.95, 1e-8, 0.1, 1 - pow(0.9, step), 1 - pow(0.95, step)};
    char *W = buf[0] + off * es, *M = buf[1] + off * es, *V = buf[2] + off * es, *G = buf[3] + off * es;
    TU_OK(T->ctx, T->K->optim->adamw(T->dev, n, t, NULL, M, V, t, G, t, W, &h));
    if (t == DT_F32)
      naive_f32(n, (float *)(buf[4] + off * es), (float *)(buf[5] + off * es),
                (float *)(buf[6] + off * es), (const float *)(buf[7] + off * es), &h, fma_bug);
    else
      naive_f64(n, (double *)(buf[4] + off * es), (double *)(buf[5] + off * es),
                (double *)(buf[6] + off * es), (const double *)(buf[7] + off * es), &h, fma_bug);
  }
  for (int k = 0; k < 3; k++) same = same && memcmp(buf[k], buf[4 + k], bytes) == 0;
  for (int k = 0; k < 8; k++) free(buf[k]);
  free(tmp);
  return same;
}

static void test_cpu_bits(kt_dev *T) {
  static const int64_t ns[] = {1, 3, 4, 5, 7, 8, 1000, 100003};
  int cases = 0;
  for (int d = 0; d < 2; d++)
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
      for (int64_t off = 0; off < 2; off++) {
        const dt_dtype t = d ? DT_F64 : DT_F32;
        TU_CHECK(cpu_bits_case(T, t, ns[i], off, false),
                 "adamw %s n=%lld offset %lld: not bitwise the scalar loop's", dt_dtype_name(t),
                 (long long)ns[i], (long long)off);
        cases++;
      }
  /* the comparison can fail: a fused multiply-add rounds differently somewhere in
   * 100003 elements */
  TU_CHECK(!cpu_bits_case(T, DT_F32, 100003, 0, true), "f32: the FMA plant was not told apart");
  TU_CHECK(!cpu_bits_case(T, DT_F64, 100003, 0, true), "f64: the FMA plant was not told apart");
  printf("optim.adamw (cpu): bitwise the scalar loop on %d length/offset cases\n", cases);
}
#endif

static void test_guards(kt_dev *T) {
  const dt_kern_adamw_hp h = {1e-3, 0.9, 0.95, 1e-8, 0.1, 0.1, 0.05};
  void *a = kt_up(T, NULL, 64), *b = kt_up(T, NULL, 64), *c = kt_up(T, NULL, 64);
  void *w = kt_up(T, NULL, 64);
  /* a bf16 weight with no master copy: the state cannot be the weight */
  dt_status st = T->K->optim->adamw(T->dev, 4, DT_F32, NULL, a, b, DT_F32, c, DT_BF16, w, &h);
  TU_CHECK(st == DT_ERR_INVALID, "bf16 weight without master -> %s", dt_status_str(st));
  dt_error_clear(T->ctx);
  st = T->K->optim->adamw(T->dev, 4, DT_BF16, a, a, b, DT_F32, c, DT_BF16, w, &h);
  TU_CHECK(st == DT_ERR_UNSUPPORTED, "bf16 state -> %s", dt_status_str(st));
  dt_error_clear(T->ctx);
#if !defined KERN_ON_CUDA && !defined KERN_ON_CPU /* the emulator's tagged pointers */
  float hbuf[4] = {0};
  st = T->K->optim->adamw(T->dev, 4, DT_F32, NULL, a, b, DT_F32, hbuf, DT_F32, w, &h);
  TU_CHECK(st == DT_ERR_INVALID, "adamw on a host pointer -> %s", dt_status_str(st));
  dt_error_clear(T->ctx);
#endif
  kt_free(T, a, 64), kt_free(T, b, 64), kt_free(T, c, 64), kt_free(T, w, 64);
  /* the comparison can say no: 3 units of f32 against a 2-unit bound, and a NaN */
  double want[2] = {0.5, 1}, got[2] = {0.5 * (1 + 3 * kt_unit(DT_F32)), 1}, sc[2] = {0.5, 1};
  TU_CHECK(scaled_mismatch(got, want, sc, 2, 2 * kt_unit(DT_F32)) == 0, "3 units pass 2");
  got[0] = 0.5;
  got[1] = NAN;
  TU_CHECK(scaled_mismatch(got, want, sc, 2, 1) == 1, "a NaN passes");
}

int main(void) {
  dt_ctx ctx;
  kt_dev T;
  int rc = kt_start(&T, &ctx);
  if (rc) return rc;
  TU_CHECK(T.K->optim && T.K->optim->adamw, "no optim.adamw slot");
  if (T.K->optim && T.K->optim->adamw) {
    test_adamw(&T);
    test_guards(&T);
#ifdef KERN_ON_CPU
    test_cpu_bits(&T);
#endif
  }
  return kt_end(&T, &ctx, KT_NAME("test_kern_optim"));
}
