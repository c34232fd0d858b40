/* lib/device/cpu/k_pw.c: the CPU device's pw kernels (element-wise, reductions,
 * softmax, permute, cast, the naive contraction): host loops behind the
 * dt_kern_pw slots of lib/device/kernels.h.
 *
 * Arithmetic (the contract's CPU notes): f32 and f64 data are computed in
 * double and rounded once to the stored type, except the f32 silu / swiglu
 * kinds on same-shape operands, which run in float on vmath.h's 4-wide exp
 * (PyTorch's CPU kernels vectorise the same way, aten/src/ATen/native/cpu/
 * Activation.cpp). Sums accumulate in double in the order each slot states.
 * The element-wise loops are written per kind with the switch hoisted out of
 * the loop, so that they vectorise; the general strided loop walks the
 * output's index with per-operand strides (numpy broadcasting: stride 0). */
#include "config.h"

#include <math.h>
#include <string.h>

#include "device/cpu/vmath.h"
#include "device/kernels.h"

static dt_status bad_dtype(dt_device *d, const char *call, dt_dtype t) {
  return dt_error(d->ctx, DT_ERR_UNSUPPORTED, call, "dtype %s (the cpu kernels take f32 and f64)",
                  dt_dtype_name(t));
}

/* Element i of an f32, f64 or bf16 array as double, and its store rounded once
 * to the array's type (bf16: through f32, to nearest even). */
static inline double ld_el(dt_dtype t, const void *p, int64_t i) {
  switch (t) {
    case DT_F64: return ((const double *)p)[i];
    case DT_F32: return (double)((const float *)p)[i];
    default: return (double)dt_bf16_to_f32(((const dt_bf16 *)p)[i]);
  }
}
static inline void st_el(dt_dtype t, void *p, int64_t i, double v) {
  switch (t) {
    case DT_F64: ((double *)p)[i] = v; break;
    case DT_F32: ((float *)p)[i] = (float)v; break;
    default: ((dt_bf16 *)p)[i] = dt_f32_to_bf16((float)v); break;
  }
}
static bool is_float(dt_dtype t) { return t == DT_F32 || t == DT_F64 || t == DT_BF16; }

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

/* ---- silu, scale, binary, swiglu_bwd ------------------------------------------ */

/* The element-wise kinds: the dt_pw_op values, and scale and silu after them. */
enum { K_SCALE = DT_PW_SILU_GRAD + 1, K_SILU };

static double pw_apply(int k, double s, double a, double b) {
  switch (k) {
    case DT_PW_ADD: return a + b;
    case DT_PW_SUB: return a - b;
    case DT_PW_MUL: return a * b;
    case K_SCALE: return s * a;
    case K_SILU: return a * sigmoid(a);
    case DT_PW_SWIGLU: return a * sigmoid(a) * b;
    default: { /* DT_PW_SILU_GRAD: b * d/da silu(a) */
      double g = sigmoid(a);
      return b * g * (1.0 + a * (1.0 - g));
    }
  }
}

/* f32 silu / swiglu / silu_grad of 4 lanes (a, b), on vmath.h's sigmoid */
static inline dt_v4f silu_v4(int k, dt_v4f a, dt_v4f b) {
  dt_v4f g = dt_v4_sigmoid(a);
  return k == K_SILU ? a * g : k == DT_PW_SWIGLU ? a * g * b : b * g * (1.0f + a * (1.0f - g));
}

static void silu_f32(int k, int64_t n, const float *x0, const float *x1, float *y) {
  int64_t e = 0;
  for (; e + 4 <= n; e += 4) dt_v4_store(y + e, silu_v4(k, dt_v4_load(x0 + e), dt_v4_load(x1 + e)));
  if (e < n)
    dt_v4_store_n(y + e, silu_v4(k, dt_v4_load_n(x0 + e, n - e), dt_v4_load_n(x1 + e, n - e)), n - e);
}

/* Operands of the output's own shape (x1 may be x0): one loop per kind, in
 * double, rounded once to T. */
#define PW_FAST(T)                                                                              \
  do {                                                                                          \
    const T *x0 = a0, *x1 = a1;                                                                 \
    T *y = yv;                                                                                  \
    switch (k) {                                                                                \
      case DT_PW_ADD: for (int64_t e = 0; e < n; e++) y[e] = (T)((double)x0[e] + (double)x1[e]); break; \
      case DT_PW_SUB: for (int64_t e = 0; e < n; e++) y[e] = (T)((double)x0[e] - (double)x1[e]); break; \
      case DT_PW_MUL: for (int64_t e = 0; e < n; e++) y[e] = (T)((double)x0[e] * (double)x1[e]); break; \
      case K_SCALE: for (int64_t e = 0; e < n; e++) y[e] = (T)(sc * (double)x0[e]); break;     \
      default: for (int64_t e = 0; e < n; e++) y[e] = (T)pw_apply(k, sc, (double)x0[e], (double)x1[e]); break; \
    }                                                                                           \
  } while (0)

static dt_status pw_flat(dt_device *d, const char *call, dt_dtype t, int k, double sc, int64_t n,
                         const void *a0, const void *a1, void *yv) {
  if (n <= 0) return DT_OK;
  if (t == DT_F32 && (k == K_SILU || k == DT_PW_SWIGLU || k == DT_PW_SILU_GRAD))
    silu_f32(k, n, a0, a1, yv);
  else if (t == DT_F64)
    PW_FAST(double);
  else if (t == DT_F32)
    PW_FAST(float);
  else
    return bad_dtype(d, call, t);
  return DT_OK;
}

static dt_status cpu_silu(dt_device *d, dt_dtype t, int64_t n, const void *x, void *y) {
  return pw_flat(d, "cpu.silu", t, K_SILU, 0.0, n, x, x, y);
}

static dt_status cpu_scale(dt_device *d, dt_dtype t, int64_t n, double alpha, const void *x,
                           void *y) {
  return pw_flat(d, "cpu.scale", t, K_SCALE, alpha, n, x, x, y);
}

/* The general strided loop: y's index over shape walks both operands. */
#define PW_LOOP(T)                                                                  \
  do {                                                                              \
    const T *x0 = a, *x1 = b;                                                       \
    T *yy = y;                                                                      \
    for (int64_t e = 0; e < numel; e++) {                                           \
      yy[e] = (T)pw_apply(op, 0.0, (double)x0[p0], (double)x1[p1]);                 \
      for (int D = nd - 1; D >= 0; D--) {                                           \
        idx[D]++;                                                                   \
        p0 += sa[D];                                                                \
        p1 += sb[D];                                                                \
        if (idx[D] < shape[D]) break;                                               \
        p0 -= sa[D] * shape[D];                                                     \
        p1 -= sb[D] * shape[D];                                                     \
        idx[D] = 0;                                                                 \
      }                                                                             \
    }                                                                               \
  } while (0)

static dt_status cpu_binary(dt_device *d, dt_dtype t, dt_pw_op op, int nd, const int64_t *shape,
                            const void *a, const int64_t *sa, const void *b, const int64_t *sb,
                            void *y) {
  const char *call = "cpu.binary";
  if ((int)op < DT_PW_ADD || (int)op > DT_PW_SILU_GRAD)
    return dt_error(d->ctx, DT_ERR_INVALID, call, "unknown op %d", (int)op);
  if (nd < 0 || nd > DT_MAX_DIMS) return dt_error(d->ctx, DT_ERR_INVALID, call, "%d dims", nd);
  int64_t numel = 1, s = 1;
  bool same = true; /* both operands laid out as y (a size-1 dim's stride is moot) */
  for (int D = nd - 1; D >= 0; D--) {
    if (shape[D] < 0) return dt_error(d->ctx, DT_ERR_INVALID, call, "negative size");
    if (shape[D] != 1) same = same && sa[D] == s && sb[D] == s;
    s *= shape[D];
  }
  numel = s;
  if (numel == 0) return DT_OK;
  if (same) return pw_flat(d, call, t, (int)op, 0.0, numel, a, b, y);
  int64_t p0 = 0, p1 = 0, idx[DT_MAX_DIMS] = {0};
  if (t == DT_F64)
    PW_LOOP(double);
  else if (t == DT_F32)
    PW_LOOP(float);
  else
    return bad_dtype(d, call, t);
  return DT_OK;
}

/* (da, db) = (g b silu'(a), g silu(a)) of 4 lanes */
static inline void swiglu_grads_v4(dt_v4f a, dt_v4f b, dt_v4f g, dt_v4f *da, dt_v4f *db) {
  dt_v4f sg = dt_v4_sigmoid(a);
  *db = g * a * sg;
  *da = g * b * sg * (1.0f + a * (1.0f - sg));
}

static dt_status cpu_swiglu_bwd(dt_device *d, dt_dtype t, int64_t n, const void *av, const void *bv,
                                const void *gv, void *dav, void *dbv) {
  if (n <= 0) return DT_OK;
  if (t == DT_F32) {
    const float *A = av, *B = bv, *G = gv;
    float *DA = dav, *DB = dbv;
    int64_t e = 0;
    dt_v4f da, db;
    for (; e + 4 <= n; e += 4) {
      swiglu_grads_v4(dt_v4_load(A + e), dt_v4_load(B + e), dt_v4_load(G + e), &da, &db);
      dt_v4_store(DA + e, da);
      dt_v4_store(DB + e, db);
    }
    if (e < n) {
      int64_t w = n - e;
      swiglu_grads_v4(dt_v4_load_n(A + e, w), dt_v4_load_n(B + e, w), dt_v4_load_n(G + e, w), &da, &db);
      dt_v4_store_n(DA + e, da, w);
      dt_v4_store_n(DB + e, db, w);
    }
  } else if (t == DT_F64) {
    const double *A = av, *B = bv, *G = gv;
    double *DA = dav, *DB = dbv;
    for (int64_t e = 0; e < n; e++) {
      double a = A[e], sg = sigmoid(a);
      DB[e] = G[e] * a * sg;
      DA[e] = G[e] * B[e] * sg * (1.0 + a * (1.0 - sg));
    }
  } else {
    return bad_dtype(d, "cpu.swiglu_bwd", t);
  }
  return DT_OK;
}

/* ---- cast ---------------------------------------------------------------------- */

static dt_status cpu_cast(dt_device *d, dt_dtype ts, const void *src, dt_dtype td, void *dst,
                          int64_t n) {
  if (!is_float(ts) || !is_float(td))
    return dt_error(d->ctx, DT_ERR_UNSUPPORTED, "cpu.cast", "%s to %s", dt_dtype_name(ts),
                    dt_dtype_name(td));
  if (ts == DT_BF16 && td == DT_F32) { /* exact */
    const dt_bf16 *s = src;
    float *o = dst;
    for (int64_t i = 0; i < n; i++) o[i] = dt_bf16_to_f32(s[i]);
  } else if (ts == DT_F32 && td == DT_BF16) {
    const float *s = src;
    dt_bf16 *o = dst;
    for (int64_t i = 0; i < n; i++) o[i] = dt_f32_to_bf16(s[i]);
  } else {
    for (int64_t i = 0; i < n; i++) st_el(td, dst, i, ld_el(ts, src, i));
  }
  return DT_OK;
}

/* ---- reductions ------------------------------------------------------------------ */

static dt_status cpu_reduce(dt_device *d, dt_dtype tx, const void *x, dt_dtype ty, void *y,
                            int64_t outer, int64_t red, int64_t inner, double alpha) {
  if (outer < 0 || red < 0 || inner < 0)
    return dt_error(d->ctx, DT_ERR_INVALID, "cpu.reduce", "negative size");
  if (!is_float(tx) || !is_float(ty)) return bad_dtype(d, "cpu.reduce", is_float(tx) ? ty : tx);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      double acc = 0;
      for (int64_t r = 0; r < red; r++) acc += ld_el(tx, x, (o * red + r) * inner + i);
      st_el(ty, y, o * inner + i, acc * alpha);
    }
  return DT_OK;
}

/* One pass over x in its order, each element added to its output's f64
 * accumulator (ost: the output stride of each dim, 0 on reduced ones). */
static dt_status cpu_sum_dims(dt_device *d, dt_dtype tx, int nd, const int64_t *shape,
                              uint32_t dims, const void *x, dt_dtype ty, void *y, double div) {
  const char *call = "cpu.sum_dims";
  if (nd < 0 || nd > DT_MAX_DIMS) return dt_error(d->ctx, DT_ERR_INVALID, call, "%d dims", nd);
  if (!is_float(tx) || !is_float(ty)) return bad_dtype(d, call, is_float(tx) ? ty : tx);
  int64_t ost[DT_MAX_DIMS], idx[DT_MAX_DIMS] = {0}, ny = 1, nx = 1;
  for (int k = nd - 1; k >= 0; k--) {
    if (shape[k] < 0) return dt_error(d->ctx, DT_ERR_INVALID, call, "negative size");
    ost[k] = dims >> k & 1u ? 0 : ny;
    if (!(dims >> k & 1u)) ny *= shape[k];
    nx *= shape[k];
  }
  double *acc = dt_host_calloc(d->ctx, (size_t)(ny > 0 ? ny : 1) * sizeof(double));
  if (!acc) return dt_error(d->ctx, DT_ERR_NOMEM, call, "accumulator of %lld", (long long)ny);
  int64_t p = 0;
  for (int64_t e = 0; e < nx; e++) {
    acc[p] += ld_el(tx, x, e);
    for (int k = nd - 1; k >= 0; k--) {
      idx[k]++;
      p += ost[k];
      if (idx[k] < shape[k]) break;
      p -= ost[k] * shape[k];
      idx[k] = 0;
    }
  }
  for (int64_t i = 0; i < ny; i++) st_el(ty, y, i, acc[i] / div);
  dt_host_free(d->ctx, acc);
  return DT_OK;
}

static dt_status cpu_contract(dt_device *d, dt_dtype t, int no, const int64_t *oshape,
                              const int64_t *oa, const int64_t *ob, int ns, const int64_t *sshape,
                              const int64_t *sa, const int64_t *sb, const void *a, const void *b,
                              void *y) {
  const char *call = "cpu.contract";
  if (no < 0 || no > DT_MAX_DIMS || ns < 0 || ns > DT_KERN_MAX_SUM)
    return dt_error(d->ctx, DT_ERR_INVALID, call, "%d output and %d summed dims", no, ns);
  if (!is_float(t)) return bad_dtype(d, call, t);
  int64_t nc = 1, nsum = 1;
  for (int i = 0; i < no; i++) nc *= oshape[i];
  for (int i = 0; i < ns; i++) nsum *= sshape[i];
  int64_t ci[DT_MAX_DIMS] = {0};
  for (int64_t c = 0; c < nc; c++) {
    int64_t ba = 0, bb = 0;
    for (int i = 0; i < no; i++) {
      ba += ci[i] * oa[i];
      bb += ci[i] * ob[i];
    }
    double acc = 0;
    int64_t si[DT_KERN_MAX_SUM] = {0};
    for (int64_t s = 0; s < nsum; s++) {
      int64_t pa = ba, pb = bb;
      for (int i = 0; i < ns; i++) {
        pa += si[i] * sa[i];
        pb += si[i] * sb[i];
      }
      acc += ld_el(t, a, pa) * ld_el(t, b, pb);
      for (int i = ns - 1; i >= 0; i--) {
        if (++si[i] < sshape[i]) break;
        si[i] = 0;
      }
    }
    st_el(t, y, c, acc);
    for (int i = no - 1; i >= 0; i--) {
      if (++ci[i] < oshape[i]) break;
      ci[i] = 0;
    }
  }
  return DT_OK;
}

/* ---- softmax ----------------------------------------------------------------- */

static dt_status cpu_softmax(dt_device *d, dt_dtype t, int64_t outer, int64_t L, int64_t inner,
                             const void *x, void *y) {
  if (outer < 0 || L < 0 || inner < 0)
    return dt_error(d->ctx, DT_ERR_INVALID, "cpu.softmax", "negative size");
  if (t != DT_F32 && t != DT_F64) return bad_dtype(d, "cpu.softmax", t);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      int64_t base = o * L * inner + i;
      double mx = -INFINITY, z = 0;
      for (int64_t k = 0; k < L; k++) mx = fmax(mx, ld_el(t, x, base + k * inner));
      for (int64_t k = 0; k < L; k++) z += exp(ld_el(t, x, base + k * inner) - mx);
      for (int64_t k = 0; k < L; k++)
        st_el(t, y, base + k * inner, exp(ld_el(t, x, base + k * inner) - mx) / z);
    }
  return DT_OK;
}

/* dx = y (dy - dot), dot = sum_L dy y in f64 in L's order. */
static dt_status cpu_softmax_bwd(dt_device *d, dt_dtype t, int64_t outer, int64_t L, int64_t inner,
                                 const void *y, const void *dy, void *dx) {
  if (outer < 0 || L < 0 || inner < 0)
    return dt_error(d->ctx, DT_ERR_INVALID, "cpu.softmax_bwd", "negative size");
  if (t != DT_F32 && t != DT_F64) return bad_dtype(d, "cpu.softmax_bwd", t);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      int64_t base = o * L * inner + i;
      double dot = 0;
      for (int64_t k = 0; k < L; k++)
        dot += ld_el(t, dy, base + k * inner) * ld_el(t, y, base + k * inner);
      for (int64_t k = 0; k < L; k++) {
        int64_t e = base + k * inner;
        st_el(t, dx, e, ld_el(t, y, e) * (ld_el(t, dy, e) - dot));
      }
    }
  return DT_OK;
}

/* ---- permute ----------------------------------------------------------------- */

#define GATHER(E)                                                                   \
  do {                                                                              \
    const E *s = (const E *)x + off;                                                \
    E *o = y;                                                                       \
    for (int64_t e = 0; e < n; e++) {                                               \
      o[e] = s[p];                                                                  \
      for (int k = nd - 1; k >= 0; k--) {                                           \
        idx[k]++;                                                                   \
        p += st[k];                                                                 \
        if (idx[k] < shape[k]) break;                                               \
        p -= st[k] * shape[k];                                                      \
        idx[k] = 0;                                                                 \
      }                                                                             \
    }                                                                               \
  } while (0)

/* A byte move: a contiguous source (strides those of shape, size-1 dims aside)
 * is one memcpy, else an element loop on the element's own width. */
static dt_status cpu_permute(dt_device *d, size_t es, int nd, const int64_t *shape,
                             const int64_t *st, int64_t off, const void *x, void *y) {
  const char *call = "cpu.permute";
  if (nd < 0 || nd > DT_MAX_DIMS) return dt_error(d->ctx, DT_ERR_INVALID, call, "%d dims", nd);
  int64_t n = 1;
  bool flat = true;
  for (int k = nd - 1; k >= 0; k--) {
    if (shape[k] < 0) return dt_error(d->ctx, DT_ERR_INVALID, call, "negative size");
    if (shape[k] != 1) flat = flat && st[k] == n;
    n *= shape[k];
  }
  if (n == 0) return DT_OK;
  if (flat) {
    memcpy(y, (const char *)x + (size_t)off * es, (size_t)n * es);
    return DT_OK;
  }
  int64_t p = 0, idx[DT_MAX_DIMS] = {0};
  switch (es) {
    case 1: GATHER(uint8_t); break;
    case 2: GATHER(uint16_t); break;
    case 4: GATHER(uint32_t); break;
    case 8: GATHER(uint64_t); break;
    default: return dt_error(d->ctx, DT_ERR_UNSUPPORTED, call, "element size %zu", es);
  }
  return DT_OK;
}

const dt_kern_pw dt_cpu_pw = {
    .silu = cpu_silu,
    .cast = cpu_cast,
    .scale = cpu_scale,
    .binary = cpu_binary,
    .swiglu_bwd = cpu_swiglu_bwd,
    .reduce = cpu_reduce,
    .softmax = cpu_softmax,
    .softmax_bwd = cpu_softmax_bwd,
    .permute = cpu_permute,
    .sum_dims = cpu_sum_dims,
    .contract = cpu_contract,
};
