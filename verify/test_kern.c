/* verify/test_kern.c: the device kernel table (lib/device/kernels.h) against
 * host references computed here in double, on the cuda-emu device (the CUDA
 * kernels built for the host) or, built with -DKERN_ON_CUDA (test_kern_cuda),
 * on GPU 0, which exits 77 (SKIP) where there is none.
 *
 * Sizes are odd on purpose (1, a partial block, several grid-stride rounds).
 * Tolerances: the kernels compute in f32 for f32 and bf16 and in f64 for f64;
 * a result is within a few roundings of the stored type (kt_unit) of the
 * double-precision reference on the same (rounded) inputs.
 */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kerntest.h"

static const int64_t sizes[] = {1, 7, 256, 1000, 100003};
enum { N_SIZES = sizeof sizes / sizeof sizes[0] };
static const dt_dtype ftypes[] = {DT_F32, DT_F64, DT_BF16};

/* ---- pw.silu: y = x / (1 + exp(-x)) ------------------------------------------- */
static void test_silu(kt_dev *T) {
  for (int ti = 0; ti < 3; ti++) {
    dt_dtype t = ftypes[ti];
    size_t es = dt_dtype_size(t);
    for (int si = 0; si < N_SIZES; si++) {
      int64_t n = sizes[si];
      double *x = malloc(n * sizeof *x), *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
      kt_uniform(x, n, 7, (uint64_t)si, -12, 12);
      void *hx = kt_pack(t, x, n), *hy = malloc(n * es);
      kt_unpack(t, hx, x, n); /* the reference sees the rounded inputs */
      for (int64_t i = 0; i < n; i++) want[i] = x[i] / (1 + exp(-x[i]));
      void *dx = kt_up(T, hx, n * es), *dy = kt_up(T, NULL, n * es);
      TU_OK(T->ctx, T->K->pw->silu(T->dev, t, n, dx, dy));
      kt_down(T, hy, dy, n * es);
      kt_unpack(t, hy, got, n);
      /* exp, the add and the divide each round once in the arithmetic type, then
       * the store rounds to t: 4 units of the arithmetic type plus one of t. */
      double tol = 4 * kt_unit(t == DT_F64 ? DT_F64 : DT_F32) + kt_unit(t);
      char what[64];
      snprintf(what, sizeof what, "silu %s n=%lld", dt_dtype_name(t), (long long)n);
      kt_close_to(what, got, want, n, tol);
      kt_free(T, dx, n * es);
      kt_free(T, dy, n * es);
      free(x), free(want), free(got), free(hx), free(hy);
    }
  }
  printf("pw.silu: f32, f64, bf16 x %d sizes\n", N_SIZES);
}

/* ---- pw.cast ---------------------------------------------------------------- */

static void test_cast(kt_dev *T) {
  int64_t n = 100003;
  double *x = malloc(n * sizeof *x), *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
  kt_uniform(x, n, 11, 0, -3e3, 3e3);
  for (int si = 0; si < 3; si++) {
    for (int di = 0; di < 3; di++) {
      dt_dtype ts = ftypes[si], td = ftypes[di];
      void *hs = kt_pack(ts, x, n), *hd = malloc(n * dt_dtype_size(td));
      double *xs = malloc(n * sizeof *xs);
      kt_unpack(ts, hs, xs, n);
      for (int64_t i = 0; i < n; i++)
        want[i] = td == DT_F64 ? xs[i] : td == DT_F32 ? (double)(float)xs[i]
                                                      : kt_nearest_bf16((float)xs[i]);
      void *ds = kt_up(T, hs, n * dt_dtype_size(ts)), *dd = kt_up(T, NULL, n * dt_dtype_size(td));
      TU_OK(T->ctx, T->K->pw->cast(T->dev, ts, ds, td, dd, n));
      kt_down(T, hd, dd, n * dt_dtype_size(td));
      kt_unpack(td, hd, got, n);
      char what[64];
      snprintf(what, sizeof what, "cast %s -> %s", dt_dtype_name(ts), dt_dtype_name(td));
      /* f64 -> bf16 goes through f32 (double rounding): allow that one unit. */
      kt_close_to(what, got, want, n, ts == DT_F64 && td == DT_BF16 ? kt_unit(DT_BF16) : 0);
      kt_free(T, ds, n * dt_dtype_size(ts));
      kt_free(T, dd, n * dt_dtype_size(td));
      free(hs), free(hd), free(xs);
    }
  }
  free(x), free(want), free(got);
  printf("pw.cast: every pair of f32, f64, bf16\n");
}

/* ---- shared helpers of the slot tests -------------------------------------- */
/* Unit roundoff of the arithmetic type the kernels use for storage type t. */
static double arith_unit(dt_dtype t) { return kt_unit(t == DT_F64 ? DT_F64 : DT_F32); }

/* Row-major strides of shape[0..nd). */
static void strides_of(int nd, const int64_t *shape, int64_t *st) {
  int64_t s = 1;
  for (int k = nd - 1; k >= 0; k--) {
    st[k] = s;
    s *= shape[k];
  }
}

static int64_t numel_of(int nd, const int64_t *shape) {
  int64_t n = 1;
  for (int k = 0; k < nd; k++) n *= shape[k];
  return n;
}

/* Uploads n doubles as dtype t; *xr gets the rounded values the device sees. */
static void *up_rounded(kt_dev *T, dt_dtype t, double *x, int64_t n) {
  void *h = kt_pack(t, x, n);
  kt_unpack(t, h, x, n);
  void *d = kt_up(T, h, (size_t)n * dt_dtype_size(t));
  free(h);
  return d;
}

/* Downloads n elements of dtype t as doubles. */
static void down_unpacked(kt_dev *T, dt_dtype t, const void *d, double *v, int64_t n) {
  void *h = malloc((size_t)(n > 0 ? n : 1) * dt_dtype_size(t));
  kt_down(T, h, d, (size_t)n * dt_dtype_size(t));
  kt_unpack(t, h, v, n);
  free(h);
}

static double sigm(double a) { return 1 / (1 + exp(-a)); }

/* ---- pw.scale: y = alpha x ---------------------------------------------------- */
static void test_scale(kt_dev *T) {
  const double alpha = -0.3711;
  for (int ti = 0; ti < 3; ti++) {
    dt_dtype t = ftypes[ti];
    for (int si = 0; si < N_SIZES; si++) {
      int64_t n = sizes[si];
      double *x = malloc(n * sizeof *x), *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
      kt_uniform(x, n, 13, (uint64_t)si, -50, 50);
      void *dx = up_rounded(T, t, x, n), *dy = kt_up(T, NULL, n * dt_dtype_size(t));
      for (int64_t i = 0; i < n; i++) want[i] = alpha * x[i];
      TU_OK(T->ctx, T->K->pw->scale(T->dev, t, n, alpha, dx, dy));
      down_unpacked(T, t, dy, got, n);
      /* alpha rounded to the arithmetic type, the product rounded there, the
       * store rounded to t: 2 units of the arithmetic type and 1 of t. */
      char what[64];
      snprintf(what, sizeof what, "scale %s n=%lld", dt_dtype_name(t), (long long)n);
      kt_close_to(what, got, want, n, 2 * arith_unit(t) + kt_unit(t));
      kt_free(T, dx, n * dt_dtype_size(t));
      kt_free(T, dy, n * dt_dtype_size(t));
      free(x), free(want), free(got);
    }
  }
  printf("pw.scale: f32, f64, bf16 x %d sizes\n", N_SIZES);
}

/* ---- pw.binary: add, sub, mul, swiglu, silu_grad with broadcasting ------------ */
typedef struct bcase {
  int nd;
  int64_t y[DT_MAX_DIMS];
  int na, nb;             /* trailing-aligned operand ranks */
  int64_t a[DT_MAX_DIMS], b[DT_MAX_DIMS];
} bcase;

static const bcase bcases[] = {
    {1, {1}, 1, 1, {1}, {1}},                                /* one element */
    {1, {7}, 1, 1, {7}, {7}},                                /* a partial block */
    {1, {100003}, 1, 1, {100003}, {100003}},                 /* grid-stride rounds */
    {1, {100003}, 1, 1, {100003}, {1}},                      /* a scalar operand */
    {2, {5, 7}, 2, 1, {5, 7}, {7}},                          /* leading broadcast, short rows */
    {2, {3, 4099}, 2, 2, {3, 4099}, {3, 1}},                 /* trailing broadcast, long rows */
    {2, {2, 4099}, 1, 2, {4099}, {2, 4099}},                 /* a lacks the leading dim */
    {3, {6, 5, 37}, 3, 3, {6, 1, 37}, {6, 5, 37}},           /* middle broadcast */
    {3, {4, 3, 2}, 3, 3, {4, 1, 2}, {1, 3, 1}},              /* both broadcast, outer product */
    {5, {2, 3, 4, 5, 6}, 5, 4, {2, 3, 4, 5, 6}, {3, 1, 5, 1}}, /* 5-D, mixed */
    {3, {2, 16, 4096}, 3, 1, {2, 16, 4096}, {4096}},         /* the model's width, a row vector */
};
enum { N_BCASES = sizeof bcases / sizeof bcases[0] };

/* Element strides of an operand of rank na (trailing-aligned, size-1 dims
 * broadcast) over the output's nd dims. */
static void bstrides(int nd, const int64_t *y, int na, const int64_t *a, int64_t *st) {
  int64_t s = 1;
  for (int k = nd - 1; k >= 0; k--) {
    int d = k - (nd - na);
    st[k] = 0;
    if (d < 0) continue;
    if (a[d] == y[k] && a[d] != 1) st[k] = s;
    s *= a[d];
  }
}

/* Reference: operand index by a naive walk of the output index (independent of
 * the kernel's dim fusion). */
static int64_t bindex(int nd, const int64_t *y, int na, const int64_t *a, int64_t e) {
  int64_t idx[DT_MAX_DIMS], off = 0, s = 1;
  for (int k = nd - 1; k >= 0; k--) {
    idx[k] = e % y[k];
    e /= y[k];
  }
  for (int d = na - 1; d >= 0; d--) {
    int k = d + (nd - na);
    off += (a[d] == 1 ? 0 : idx[k]) * s;
    s *= a[d];
  }
  return off;
}

static double bref(dt_pw_op op, double a, double b) {
  switch (op) {
    case DT_PW_ADD: return a + b;
    case DT_PW_SUB: return a - b;
    case DT_PW_MUL: return a * b;
    case DT_PW_SWIGLU: return a * sigm(a) * b;
    default: {
      double s = sigm(a);
      return b * s * (1 + a * (1 - s));
    }
  }
}

/* Tolerances in units of the arithmetic type (plus one of t for the store).
 * add/sub/mul: one rounding. swiglu: exp, 1 + e, the divide, two products:
 * 5, plus 1 for exp's own error (glibc/CUDA expf are within 1-2 ulp): 6.
 * silu_grad on |a| <= 8: s = 1/(1 + e^-a) is within 3 units relatively, so
 * 1 - s is within 3 units of 1 absolutely and a (1 - s) within 8 * 3 + 1 = 25
 * units absolutely, 1 + a (1 - s) adds 1; the products b s (...) add 3 more,
 * relative to the result whose factor (1 + a (1 - s)) is >= 1 - 0.28 (its
 * minimum over a, at a ~ -2.4): (25 + 1) / 0.72 + 3 + 3 = 42 units. */
static double btol(dt_pw_op op, dt_dtype t) {
  double u = arith_unit(t), k = op <= DT_PW_MUL ? 1 : op == DT_PW_SWIGLU ? 6 : 42;
  return k * u + kt_unit(t);
}

static const char *opname[] = {"add", "sub", "mul", "swiglu", "silu_grad"};

static void test_binary(kt_dev *T) {
  for (int ci = 0; ci < N_BCASES; ci++) {
    const bcase *c = &bcases[ci];
    int64_t n = numel_of(c->nd, c->y), na = numel_of(c->na, c->a), nb = numel_of(c->nb, c->b);
    int64_t sa[DT_MAX_DIMS], sb[DT_MAX_DIMS];
    bstrides(c->nd, c->y, c->na, c->a, sa);
    bstrides(c->nd, c->y, c->nb, c->b, sb);
    for (int ti = 0; ti < 3; ti++) {
      dt_dtype t = ftypes[ti];
      size_t es = dt_dtype_size(t);
      double *a = malloc(na * sizeof *a), *b = malloc(nb * sizeof *b);
      double *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
      kt_uniform(a, na, 17, (uint64_t)ci, -8, 8);
      kt_uniform(b, nb, 19, (uint64_t)ci, -8, 8);
      void *da = up_rounded(T, t, a, na), *db = up_rounded(T, t, b, nb), *dy = kt_up(T, NULL, n * es);
      for (int op = DT_PW_ADD; op <= DT_PW_SILU_GRAD; op++) {
        for (int64_t e = 0; e < n; e++)
          want[e] = bref((dt_pw_op)op, a[bindex(c->nd, c->y, c->na, c->a, e)],
                         b[bindex(c->nd, c->y, c->nb, c->b, e)]);
        TU_OK(T->ctx, T->K->pw->binary(T->dev, t, (dt_pw_op)op, c->nd, c->y, da, sa, db, sb, dy));
        down_unpacked(T, t, dy, got, n);
        char what[96];
        snprintf(what, sizeof what, "binary %s %s case %d", opname[op], dt_dtype_name(t), ci);
        kt_close_to(what, got, want, n, btol((dt_pw_op)op, t));
      }
      kt_free(T, da, na * es);
      kt_free(T, db, nb * es);
      kt_free(T, dy, n * es);
      free(a), free(b), free(want), free(got);
    }
  }
  printf("pw.binary: 5 ops x f32, f64, bf16 x %d broadcast cases\n", N_BCASES);
}

/* ---- pw.swiglu_bwd ---------------------------------------------------------- */
static void test_swiglu_bwd(kt_dev *T) {
  for (int ti = 0; ti < 3; ti++) {
    dt_dtype t = ftypes[ti];
    size_t es = dt_dtype_size(t);
    for (int si = 0; si < N_SIZES; si++) {
      int64_t n = sizes[si];
      double *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *g = malloc(n * sizeof *g);
      double *wa = malloc(n * sizeof *wa), *wb = malloc(n * sizeof *wb), *got = malloc(n * sizeof *got);
      kt_uniform(a, n, 23, (uint64_t)si, -8, 8);
      kt_uniform(b, n, 29, (uint64_t)si, -8, 8);
      kt_uniform(g, n, 31, (uint64_t)si, -2, 2);
      void *da = up_rounded(T, t, a, n), *db = up_rounded(T, t, b, n), *dg = up_rounded(T, t, g, n);
      void *oa = kt_up(T, NULL, n * es), *ob = kt_up(T, NULL, n * es);
      for (int64_t i = 0; i < n; i++) {
        double s = sigm(a[i]);
        wb[i] = g[i] * a[i] * s;
        wa[i] = g[i] * b[i] * s * (1 + a[i] * (1 - s));
      }
      TU_OK(T->ctx, T->K->pw->swiglu_bwd(T->dev, t, n, da, db, dg, oa, ob));
      char what[64];
      /* da is silu_grad times g (one more product), db swiglu's arithmetic. */
      down_unpacked(T, t, oa, got, n);
      snprintf(what, sizeof what, "swiglu_bwd da %s n=%lld", dt_dtype_name(t), (long long)n);
      kt_close_to(what, got, wa, n, btol(DT_PW_SILU_GRAD, t) + arith_unit(t));
      down_unpacked(T, t, ob, got, n);
      snprintf(what, sizeof what, "swiglu_bwd db %s n=%lld", dt_dtype_name(t), (long long)n);
      kt_close_to(what, got, wb, n, btol(DT_PW_SWIGLU, t));
      void *bufs[5] = {da, db, dg, oa, ob};
      for (int k = 0; k < 5; k++) kt_free(T, bufs[k], n * es);
      free(a), free(b), free(g), free(wa), free(wb), free(got);
    }
  }
  printf("pw.swiglu_bwd: f32, f64, bf16 x %d sizes\n", N_SIZES);
}

/* ---- pw.reduce: [outer, red, inner] -> [outer, inner] ------------------------ */
static const int64_t rcases[][3] = {
    {1, 1, 1}, {3, 7, 1}, {2, 4099, 1}, {1, 100003, 1}, /* rows: the block reduction */
    {5, 7, 3}, {4, 1, 9}, {1, 33, 4099}, {3, 300, 2},   /* columns: a thread per output */
    {6, 0, 2},                                          /* nothing to sum: 0 (times alpha) */
};
enum { N_RCASES = sizeof rcases / sizeof rcases[0] };

static void test_reduce(kt_dev *T) {
  /* (tx, ty): each dtype to itself, and bf16's f32 intermediates both ways */
  const dt_dtype pairs[][2] = {{DT_F32, DT_F32}, {DT_F64, DT_F64}, {DT_BF16, DT_BF16},
                               {DT_BF16, DT_F32}, {DT_F32, DT_BF16}};
  for (int ci = 0; ci < N_RCASES; ci++) {
    int64_t O = rcases[ci][0], R = rcases[ci][1], I = rcases[ci][2], nx = O * R * I, ny = O * I;
    for (int pi = 0; pi < 5; pi++) {
      dt_dtype tx = pairs[pi][0], ty = pairs[pi][1];
      for (int mean = 0; mean < 2; mean++) {
        double alpha = mean ? 1.0 / (double)R : 1.0;
        double *x = malloc((nx ? nx : 1) * sizeof *x), *want = malloc(ny * sizeof *want),
               *got = malloc(ny * sizeof *got);
        /* positive terms: no cancellation, so a bound relative to the sum holds */
        kt_uniform(x, nx, 37, (uint64_t)ci, 0.25, 1.25);
        void *dx = up_rounded(T, tx, x, nx), *dy = kt_up(T, NULL, ny * dt_dtype_size(ty));
        for (int64_t o = 0; o < O; o++)
          for (int64_t i = 0; i < I; i++) {
            double s = 0;
            for (int64_t r = 0; r < R; r++) s += x[(o * R + r) * I + i];
            want[o * I + i] = s * alpha;
          }
        TU_OK(T->ctx, T->K->pw->reduce(T->dev, tx, dx, ty, dy, O, R, I, alpha));
        down_unpacked(T, ty, dy, got, ny);
        /* Sums of positive terms in any order are within (terms - 1) units of
         * the accumulator relative (Higham, Accuracy and Stability, sec. 4.2);
         * a row's block reduction sums ceil(R/256) terms per thread then 8
         * tree levels; a column sums R terms in turn. Then alpha's product and
         * the store: 1 unit of the accumulator and 1 of ty, plus 1 of f32 for
         * an f64 accumulator rounded to bf16 through f32. */
        double ua = tx == DT_BF16 ? kt_unit(DT_F32) : kt_unit(DT_F64);
        double terms = I == 1 ? (double)((R + 255) / 256 + 8) : (double)R;
        double tol = (terms + 2) * ua + kt_unit(ty) + (ty == DT_BF16 && tx != DT_BF16 ? kt_unit(DT_F32) : 0);
        char what[96];
        snprintf(what, sizeof what, "reduce %s->%s [%lld,%lld,%lld]%s", dt_dtype_name(tx),
                 dt_dtype_name(ty), (long long)O, (long long)R, (long long)I, mean ? " mean" : "");
        if (R == 0 && mean) { /* 0 * (1/0): NaN, as the host's 0/0 */
          bool nan = true;
          for (int64_t j = 0; j < ny; j++) nan = nan && isnan(got[j]);
          TU_CHECK(nan, "%s: not NaN", what);
        } else {
          kt_close_to(what, got, want, ny, tol);
        }
        kt_free(T, dx, nx * dt_dtype_size(tx));
        kt_free(T, dy, ny * dt_dtype_size(ty));
        free(x), free(want), free(got);
      }
    }
  }
  printf("pw.reduce: %d shapes x 5 dtype pairs x sum, mean\n", N_RCASES);
}

/* ---- pw.sum_dims: a sum over any set of dims, divided ------------------------- */
typedef struct sdcase {
  int nd;
  int64_t shape[4];
  uint32_t dims;
} sdcase;
static const sdcase sdcases[] = {
    {3, {4, 6, 33}, 0x2},   /* a middle run: a thread per output */
    {3, {4, 6, 33}, 0x5},   /* two runs around a kept dim, the innermost reduced: blocks */
    {4, {5, 1, 7, 3}, 0x3}, /* reduced dims before a kept innermost one (and a size-1) */
    {4, {2, 3, 4, 5}, 0xf}, /* everything: one output */
    {1, {100003}, 0x1},     /* one long row: several grid rounds of a block */
    {3, {3, 1, 4}, 0x2},    /* only a size-1 dim reduced: y = x */
    {3, {6, 0, 2}, 0x2},    /* nothing to sum: 0 (a mean's 0/0: NaN) */
    {2, {0, 5}, 0x2},       /* no outputs */
    {0, {0}, 0x0},          /* a scalar */
    /* the innermost dim kept, >= 64 terms an output: the device's column
     * kernel (8 threads an output, a tree); outputs off its 32-wide tile */
    {3, {300, 5, 13}, 0x1},
    {3, {9, 70, 37}, 0x3},
};
enum { N_SDCASES = sizeof sdcases / sizeof sdcases[0] };

/* The reference: each element of x (row-major, in order) added in double to its
 * output, from 0, then divided: the order the CPU slot promises, so its f64
 * results must equal this bit for bit. */
static void sum_dims_ref(const sdcase *c, const double *x, double *want, double div) {
  int64_t ny = 1, nx = 1, ost[4] = {0}, s = 1;
  for (int k = c->nd - 1; k >= 0; k--) {
    nx *= c->shape[k];
    if (c->dims >> k & 1u) continue;
    ost[k] = s;
    s *= c->shape[k];
  }
  ny = s;
  for (int64_t j = 0; j < ny; j++) want[j] = 0;
  for (int64_t e = 0; e < nx; e++) {
    int64_t r = e, p = 0;
    for (int k = c->nd - 1; k >= 0; k--) {
      p += (r % c->shape[k]) * ost[k];
      r /= c->shape[k];
    }
    want[p] += x[e];
  }
  for (int64_t j = 0; j < ny; j++) want[j] /= div;
}

static void test_sum_dims(kt_dev *T) {
  const dt_dtype pairs[][2] = {{DT_F32, DT_F32}, {DT_F64, DT_F64}, {DT_BF16, DT_BF16},
                               {DT_BF16, DT_F32}, {DT_F32, DT_BF16}};
  dt_device cpu = {.ops = dt_device_cpu_ops(), .kind = DT_DEV_CPU, .ctx = T->ctx};
  int exact = 0;
  for (int ci = 0; ci < N_SDCASES; ci++) {
    const sdcase *c = &sdcases[ci];
    int64_t nx = 1, ny = 1, nred = 1;
    bool rows = false;
    for (int k = 0; k < c->nd; k++) {
      nx *= c->shape[k];
      if (c->dims >> k & 1u) nred *= c->shape[k];
      else ny *= c->shape[k];
      if (c->shape[k] != 1) rows = c->dims >> k & 1u;
    }
    for (int pi = 0; pi < 5; pi++) {
      dt_dtype tx = pairs[pi][0], ty = pairs[pi][1];
      for (int mean = 0; mean < 2; mean++) {
        double div = mean ? (double)nred : 1.0;
        double *x = malloc((nx ? nx : 1) * sizeof *x), *want = malloc((ny ? ny : 1) * sizeof *want),
               *got = malloc((ny ? ny : 1) * sizeof *got);
        kt_uniform(x, nx, 41, (uint64_t)ci, 0.25, 1.25); /* positive: see test_reduce */
        void *dx = up_rounded(T, tx, x, nx), *dy = kt_up(T, NULL, (ny ? ny : 1) * dt_dtype_size(ty));
        sum_dims_ref(c, x, want, div);
        TU_OK(T->ctx, T->K->pw->sum_dims(T->dev, tx, c->nd, c->shape, c->dims, dx, ty, dy, div));
        down_unpacked(T, ty, dy, got, ny);
        /* as test_reduce's bound: a block sums ceil(n/256) terms a thread then 8
         * tree levels, a thread per output all n; then the division and the store */
        double ua = tx == DT_BF16 ? kt_unit(DT_F32) : kt_unit(DT_F64);
        double terms = rows ? (double)((nred + 255) / 256 + 8) : (double)nred;
        /* the column kernel (not the cpu's in-order loop): ceil(n/8) terms a
         * thread, then 3 tree levels */
        if (!rows && nred >= 64 && strcmp(T->name, "cpu") != 0) terms = (double)((nred + 7) / 8 + 3);
        double tol = (terms + 2) * ua + kt_unit(ty) + (ty == DT_BF16 && tx != DT_BF16 ? kt_unit(DT_F32) : 0);
        char what[96];
        snprintf(what, sizeof what, "sum_dims %s->%s case %d%s", dt_dtype_name(tx), dt_dtype_name(ty),
                 ci, mean ? " mean" : "");
        if (nred == 0 && mean) {
          bool nan = true;
          for (int64_t j = 0; j < ny; j++) nan = nan && isnan(got[j]);
          TU_CHECK(nan, "%s: not NaN", what);
        } else {
          kt_close_to(what, got, want, ny, tol);
        }
        if (tx == DT_F64 && ty == DT_F64) { /* the CPU's: the reference's order, bit for bit */
          double *hy = malloc((ny ? ny : 1) * sizeof *hy);
          TU_OK(T->ctx, dt_kernels_cpu.pw->sum_dims(&cpu, tx, c->nd, c->shape, c->dims, x, ty, hy, div));
          for (int64_t j = 0; j < ny; j++) {
            TU_CHECK(memcmp(&hy[j], &want[j], sizeof *hy) == 0 || (isnan(hy[j]) && isnan(want[j])),
                     "%s on the cpu: element %lld is %.17g, the in-order sum %.17g", what, (long long)j,
                     hy[j], want[j]);
            exact++;
          }
          free(hy);
        }
        kt_free(T, dx, nx * dt_dtype_size(tx));
        kt_free(T, dy, (ny ? ny : 1) * dt_dtype_size(ty));
        free(x), free(want), free(got);
      }
    }
  }
  /* The bitwise check can fail: summing [4, 6, 33] over dims 0 and 2 in two
   * passes (dim 2, then dim 0: the order of a pass-per-run reduction) differs
   * from the in-order sum in some element. */
  double x[4 * 6 * 33], want[6], two[6];
  kt_uniform(x, 4 * 6 * 33, 41, 99, 0.25, 1.25);
  sum_dims_ref(&sdcases[1], x, want, 1.0);
  int differ = 0;
  for (int j = 0; j < 6; j++) {
    two[j] = 0;
    for (int a = 0; a < 4; a++) {
      double r = 0;
      for (int b = 0; b < 33; b++) r += x[(a * 6 + j) * 33 + b];
      two[j] += r;
    }
    differ += memcmp(&two[j], &want[j], sizeof two[j]) != 0;
  }
  TU_CHECK(differ > 0, "a two-pass sum matches the in-order sum bit for bit in all 6 elements");
  /* The column kernel's tolerance can fail: its sums accumulated in f32 (the
   * bf16-accumulator plant) for f64 input [300, 5, 13] over dim 0 miss the f64
   * bound (300 / 8 + 3 + 2) u64 + u64 in some output. */
  {
    const sdcase *c = &sdcases[N_SDCASES - 2];
    int64_t nx = 300 * 5 * 13, ny = 65;
    double *xc = malloc(nx * sizeof *xc), *wc = malloc(ny * sizeof *wc), worst_c = 0;
    kt_uniform(xc, nx, 41, (uint64_t)(N_SDCASES - 2), 0.25, 1.25);
    sum_dims_ref(c, xc, wc, 1.0);
    for (int64_t j = 0; j < ny; j++) {
      float f = 0;
      for (int64_t r = 0; r < 300; r++) f += (float)xc[r * ny + j];
      double e = fabs((double)f - wc[j]) / fmax(1, fabs(wc[j]));
      if (e > worst_c) worst_c = e;
    }
    double tol = (300.0 / 8 + 3 + 2) * kt_unit(DT_F64) + kt_unit(DT_F64);
    TU_CHECK(worst_c > tol, "an f32-accumulated column sum passes the f64 bound (%.3g <= %.3g)", worst_c, tol);
    free(xc), free(wc);
  }
  printf("pw.sum_dims: %d shapes x 5 dtype pairs x sum, mean; cpu f64 in order (%d elements)\n",
         N_SDCASES, exact);
}

/* ---- pw.contract: the naive two-operand contraction -------------------------- */
typedef struct ccase {
  int no, ns;
  int64_t on[2], oa[2], ob[2], sn[2], sa[2], sb[2];
  int64_t na, nb; /* operand sizes */
} ccase;
static const ccase ccases[] = {
    /* ij,jk->i: A [7, 5], B [5, 3]; j and k summed (k in B only) */
    {1, 2, {7}, {5}, {0}, {5, 3}, {1, 0}, {3, 1}, 35, 15},
    /* bij,bl->bi: A [3, 4, 6], B [3, 2]; j in A only, l in B only */
    {2, 2, {3, 4}, {24, 6}, {2, 0}, {6, 2}, {1, 0}, {0, 1}, 72, 6},
    /* i,i->i over 1000: no summed dim, one product each */
    {1, 0, {1000}, {1}, {1}, {0}, {0}, {0}, 1000, 1000},
    /* i,j->i over [300] x [257]: grid rounds, long sums */
    {1, 1, {300}, {1}, {0}, {257}, {0}, {1}, 300, 257},
};
enum { N_CCASES = sizeof ccases / sizeof ccases[0] };

static void test_contract(kt_dev *T) {
  dt_device cpu = {.ops = dt_device_cpu_ops(), .kind = DT_DEV_CPU, .ctx = T->ctx};
  for (int ci = 0; ci < N_CCASES; ci++) {
    const ccase *c = &ccases[ci];
    int64_t nc = 1, nsum = 1;
    for (int k = 0; k < c->no; k++) nc *= c->on[k];
    for (int k = 0; k < c->ns; k++) nsum *= c->sn[k];
    for (int ti = 0; ti < 3; ti++) {
      dt_dtype t = ftypes[ti];
      size_t es = dt_dtype_size(t);
      double *a = malloc(c->na * sizeof *a), *b = malloc(c->nb * sizeof *b),
             *want = malloc(nc * sizeof *want), *got = malloc(nc * sizeof *got);
      kt_uniform(a, c->na, 43, (uint64_t)ci, 0.25, 1.25);
      kt_uniform(b, c->nb, 47, (uint64_t)ci, 0.25, 1.25);
      void *da = up_rounded(T, t, a, c->na), *db = up_rounded(T, t, b, c->nb);
      void *dy = kt_up(T, NULL, nc * es);
      for (int64_t i = 0; i < nc; i++) { /* the reference: each output's terms in order */
        int64_t pa = 0, pb = 0, r = i;
        for (int k = c->no - 1; k >= 0; k--) {
          pa += (r % c->on[k]) * c->oa[k];
          pb += (r % c->on[k]) * c->ob[k];
          r /= c->on[k];
        }
        double acc = 0;
        for (int64_t j = 0; j < nsum; j++) {
          int64_t qa = pa, qb = pb, q = j;
          for (int k = c->ns - 1; k >= 0; k--) {
            qa += (q % c->sn[k]) * c->sa[k];
            qb += (q % c->sn[k]) * c->sb[k];
            q /= c->sn[k];
          }
          acc += a[qa] * b[qb];
        }
        want[i] = acc;
      }
      TU_OK(T->ctx, T->K->pw->contract(T->dev, t, c->no, c->on, c->oa, c->ob, c->ns, c->sn, c->sa,
                                       c->sb, da, db, dy));
      down_unpacked(T, t, dy, got, nc);
      /* positive products summed in turn: each product and each add one unit of
       * the accumulator (f32 for bf16, else f64), then the store */
      double ua = t == DT_BF16 ? kt_unit(DT_F32) : kt_unit(DT_F64);
      char what[64];
      snprintf(what, sizeof what, "contract %s case %d", dt_dtype_name(t), ci);
      kt_close_to(what, got, want, nc, (2 * (double)nsum + 2) * ua + kt_unit(t));
      if (t == DT_F64) { /* the CPU's: the reference's order, bit for bit */
        double *hy = malloc(nc * sizeof *hy);
        TU_OK(T->ctx, dt_kernels_cpu.pw->contract(&cpu, t, c->no, c->on, c->oa, c->ob, c->ns, c->sn,
                                                   c->sa, c->sb, a, b, hy));
        TU_CHECK(memcmp(hy, want, nc * sizeof *hy) == 0, "%s on the cpu: not the in-order sum", what);
        free(hy);
      }
      kt_free(T, da, c->na * es);
      kt_free(T, db, c->nb * es);
      kt_free(T, dy, nc * es);
      free(a), free(b), free(want), free(got);
    }
  }
  printf("pw.contract: %d shapes x f32, f64, bf16; cpu f64 in order\n", N_CCASES);
}

/* ---- pw.softmax and pw.softmax_bwd over [outer, L, inner] -------------------- */
static const int64_t scases[][3] = {{1, 1, 1}, {3, 7, 1}, {2, 4099, 1}, {2, 5, 3}, {1, 300, 4}};
enum { N_SCASES = sizeof scases / sizeof scases[0] };

static void test_softmax(kt_dev *T) {
  for (int ci = 0; ci < N_SCASES; ci++) {
    int64_t O = scases[ci][0], L = scases[ci][1], I = scases[ci][2], n = O * L * I;
    for (int ti = 0; ti < 3; ti++) {
      dt_dtype t = ftypes[ti];
      size_t es = dt_dtype_size(t);
      double *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y), *dy = malloc(n * sizeof *dy),
             *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
      kt_uniform(x, n, 41, (uint64_t)ci, -10, 10);
      /* the last outer row sits near 1000: exp overflows there without the
       * max subtraction (e^990 > f64's range) */
      for (int64_t e = (O - 1) * L * I; e < n; e++) x[e] += 1000;
      kt_uniform(dy, n, 43, (uint64_t)ci, -1, 1);
      void *dx = up_rounded(T, t, x, n), *ddy = up_rounded(T, t, dy, n);
      void *dout = kt_up(T, NULL, n * es);
      for (int64_t o = 0; o < O; o++)
        for (int64_t i = 0; i < I; i++) {
          double m = -INFINITY, z = 0;
          for (int64_t k = 0; k < L; k++) m = fmax(m, x[(o * L + k) * I + i]);
          for (int64_t k = 0; k < L; k++) z += exp(x[(o * L + k) * I + i] - m);
          for (int64_t k = 0; k < L; k++) want[(o * L + k) * I + i] = exp(x[(o * L + k) * I + i] - m) / z;
        }
      TU_OK(T->ctx, T->K->pw->softmax(T->dev, t, O, L, I, dx, dout));
      down_unpacked(T, t, dout, got, n);
      memcpy(y, got, n * sizeof *y);
      /* Relative errors (got / want against 1; every want > 0 here): x - max
       * is exact near 1000 (Sterbenz), else one rounding of a value <= 20, so
       * exp's argument is off by <= 20 units absolutely: 20 units of e^..
       * relative; exp itself 2, the sum of positive terms (ceil(L/256) + 8
       * levels, Higham sec. 4.2), the divide 1; then the store. */
      for (int64_t e = 0; e < n; e++) got[e] /= want[e], want[e] = 1;
      double u = arith_unit(t), tol = (20 + 2 + (double)((L + 255) / 256 + 8) + 1) * u + kt_unit(t);
      char what[96];
      snprintf(what, sizeof what, "softmax %s [%lld,%lld,%lld]", dt_dtype_name(t), (long long)O,
               (long long)L, (long long)I);
      kt_close_to(what, got, want, n, tol);
      /* backward on the device's own y (rounded to t): dx = y (dy - sum dy y) */
      for (int64_t o = 0; o < O; o++)
        for (int64_t i = 0; i < I; i++) {
          double dot = 0;
          for (int64_t k = 0; k < L; k++) dot += dy[(o * L + k) * I + i] * y[(o * L + k) * I + i];
          for (int64_t k = 0; k < L; k++) {
            int64_t e = (o * L + k) * I + i;
            want[e] = y[e] * (dy[e] - dot);
          }
        }
      void *dgx = kt_up(T, NULL, n * es);
      TU_OK(T->ctx, T->K->pw->softmax_bwd(T->dev, t, O, L, I, dout, ddy, dgx));
      down_unpacked(T, t, dgx, got, n);
      /* Compared as dx / y = dy - dot (|.| <= 2, y > 0): dot = sum dy y with
       * sum |dy y| <= sum y = 1 errs by its L products and ceil(L/256) + 8
       * addition levels, (ceil(L/256) + 9) units absolutely; the subtraction
       * and the product by y one unit each of a value <= 2; the store one unit
       * of t relative. */
      for (int64_t e = 0; e < n; e++) got[e] /= y[e], want[e] /= y[e];
      tol = ((double)((L + 255) / 256 + 9) + 4) * u + kt_unit(t);
      snprintf(what, sizeof what, "softmax_bwd %s [%lld,%lld,%lld]", dt_dtype_name(t), (long long)O,
               (long long)L, (long long)I);
      kt_close_to(what, got, want, n, tol);
      void *bufs[4] = {dx, ddy, dout, dgx};
      for (int k = 0; k < 4; k++) kt_free(T, bufs[k], n * es);
      free(x), free(y), free(dy), free(want), free(got);
    }
  }
  printf("pw.softmax, pw.softmax_bwd: f32, f64, bf16 x %d shapes\n", N_SCASES);
}

/* ---- pw.permute: the strided gather ---------------------------------------- */
typedef struct pcase {
  int nd;
  int64_t x[DT_MAX_DIMS];
  int perm[DT_MAX_DIMS]; /* output dim k is input dim perm[k] */
} pcase;

static const pcase pcases[] = {
    {2, {3, 5}, {1, 0}},                        /* short rows: per-element indices */
    {2, {37, 41}, {1, 0}},                      /* a transpose with long rows */
    {3, {2, 3, 4}, {2, 0, 1}},
    {3, {8, 64, 33}, {1, 0, 2}},                /* contiguous inner runs */
    {4, {2, 16, 8, 64}, {0, 2, 1, 3}},          /* [b, s, h, d] -> [b, h, s, d] */
    {4, {4, 5, 6, 7}, {0, 2, 1, 3}},
    {4, {1, 5, 1, 40}, {3, 2, 1, 0}},           /* size-1 dims */
    {5, {2, 3, 5, 7, 11}, {4, 3, 2, 1, 0}},     /* 5-D reversal */
    {5, {3, 2, 4, 2, 33}, {1, 3, 0, 2, 4}},
    /* the innermost dim moves (kern.permute_tiled on the device): sizes off
     * the 32-element tile, partial tiles on both axes, slabs around them */
    {2, {33, 70}, {1, 0}},
    {3, {3, 45, 37}, {0, 2, 1}},                /* 3 slabs of 45 x 37 */
    {3, {9, 5, 65}, {2, 1, 0}},                 /* the slab dim between */
    {4, {2, 40, 3, 11}, {0, 3, 2, 1}},          /* [b, s, h, d] -> [b, d, h, s] */
};
enum { N_PCASES = sizeof pcases / sizeof pcases[0] };

/* Gathers on the device with element size es and compares with a host walk;
 * x holds distinct byte patterns per element. */
static void run_gather(kt_dev *T, size_t es, int nd, const int64_t *yshape, const int64_t *st,
                       int64_t off, int64_t nx, const char *what) {
  int64_t ny = numel_of(nd, yshape);
  unsigned char *hx = malloc(nx * es), *want = malloc(ny * es + 1), *got = malloc(ny * es + 1);
  for (int64_t i = 0; i < nx; i++)
    for (size_t b = 0; b < es; b++) hx[i * es + b] = (unsigned char)((i * 131 + b * 7 + (i >> 8)) & 0xff);
  for (int64_t e = 0; e < ny; e++) {
    int64_t r = e, src = off;
    for (int k = nd - 1; k >= 0; k--) {
      src += (r % yshape[k]) * st[k];
      r /= yshape[k];
    }
    memcpy(want + e * es, hx + src * es, es);
  }
  void *dx = kt_up(T, hx, nx * es), *dy = kt_up(T, NULL, ny * es);
  TU_OK(T->ctx, T->K->pw->permute(T->dev, es, nd, yshape, st, off, dx, dy));
  kt_down(T, got, dy, ny * es);
  int64_t bad = -1;
  for (int64_t e = 0; e < ny && bad < 0; e++)
    if (memcmp(got + e * es, want + e * es, es)) bad = e;
  TU_CHECK(bad < 0, "%s (es %zu): element %lld differs", what, es, (long long)bad);
  kt_free(T, dx, nx * es);
  kt_free(T, dy, ny * es);
  free(hx), free(want), free(got);
}

static void test_permute(kt_dev *T) {
  const size_t ess[] = {1, 2, 4, 8};
  for (int ci = 0; ci < N_PCASES; ci++) {
    const pcase *c = &pcases[ci];
    int64_t xst[DT_MAX_DIMS], st[DT_MAX_DIMS], ys[DT_MAX_DIMS];
    strides_of(c->nd, c->x, xst);
    for (int k = 0; k < c->nd; k++) {
      ys[k] = c->x[c->perm[k]];
      st[k] = xst[c->perm[k]];
    }
    char what[64];
    snprintf(what, sizeof what, "permute case %d (%d-D)", ci, c->nd);
    for (int ei = 0; ei < 4; ei++) run_gather(T, ess[ei], c->nd, ys, st, 0, numel_of(c->nd, c->x), what);
  }
  /* a broadcast with an offset (sum_bwd's use): y[i][j] = x[7 + j] */
  const int64_t bs[2] = {3, 50}, bst[2] = {0, 1};
  run_gather(T, 4, 2, bs, bst, 7, 60, "broadcast gather at offset 7");
  printf("pw.permute: %d permutations (2-D..5-D) x element sizes 1, 2, 4, 8; a broadcast\n", N_PCASES);
}

/* ---- the ops on device arrays ----------------------------------------------- */
/* A 1-rank job whose rank device is the device under test runs the ops of
 * lib/ops/pointwise.c, reduce.c, view.c and matmul.c (forward, and the
 * backward kernels: silu_grad, swiglu_bwd, sum_bwd, softmax_bwd) on DTensors
 * whose locals it puts on the device itself; a CPU job runs the same ops on
 * host arrays; the results must agree (the host kernels are the oracle, checked
 * by test_ops_* against naive references). */
enum { OP_MAX = 32 };

typedef struct opjob {
  bool dev;
  dt_dtype t;
  int nres;
  const char *name[OP_MAX];
  double *res[OP_MAX];
  int64_t n[OP_MAX];
  double terms[OP_MAX]; /* summed terms per value (0: no sum), for the tolerance */
  double next_terms;    /* terms of the next results kept */
} opjob;

/* A replicated tensor of uniform [-2, 2) values from seed; its local moved to
 * the device (upload, then swap) when the job runs on one and the DTensor
 * layer left it on the host. */
static dt_tensor mk(dt_ctx *ctx, dt_mesh *mesh, const opjob *J, int nd, const int64_t *shape,
                    uint64_t seed) {
  dt_tensor x;
  dt_placement pl[1] = {dt_replicate()};
  /* seeds >= 100: positive values in [0.5, 1.5), for sums (no cancellation) */
  double lo = seed >= 100 ? 0.5 : -2, w = seed >= 100 ? 1 : 4;
  TU_OK(ctx, dt_tensor_rand(ctx, mesh, nd, shape, J->t, pl, seed, 0, DT_RNG_UNIFORM, lo, w, &x));
  if (J->dev && x.local.dev == DT_DEV_CPU) {
    dt_array d;
    TU_OK(ctx, dt_array_create(ctx, DT_DEV_CUDA, x.local.dtype, x.local.ndim, x.local.shape, &d));
    TU_OK(ctx, dt_device_copy(ctx->device, d.data, x.local.data, dt_array_bytes(&x.local), DT_COPY_H2D));
    dt_array_free(ctx, &x.local);
    x.local = d;
  }
  return x;
}

/* Records t's values under name (downloaded from the device when there) and frees t. */
static void keep(dt_ctx *ctx, opjob *J, const char *name, dt_tensor *t) {
  const dt_array *a = &t->local;
  TU_CHECK(a->dev == (J->dev ? DT_DEV_CUDA : DT_DEV_CPU), "%s: output on the wrong device", name);
  size_t bytes = dt_array_bytes(a);
  void *h = malloc(bytes ? bytes : 1);
  if (a->dev != DT_DEV_CPU) {
    TU_OK(ctx, dt_device_sync(ctx->device));
    TU_OK(ctx, dt_device_copy(ctx->device, h, a->data, bytes, DT_COPY_D2H));
  } else {
    memcpy(h, a->data, bytes);
  }
  if (J->nres < OP_MAX) {
    int k = J->nres++;
    J->name[k] = name;
    J->n[k] = a->numel;
    J->terms[k] = J->next_terms;
    J->res[k] = malloc((a->numel ? a->numel : 1) * sizeof(double));
    kt_unpack(a->dtype, h, J->res[k], a->numel);
  }
  free(h);
  dt_tensor_free(ctx, t);
}

static void call(dt_ctx *ctx, opjob *J, const char *name, const dt_op *op, const dt_op_attrs *a,
                 const dt_tensor *x, const dt_tensor *y) {
  const dt_tensor *in[2] = {x, y};
  dt_tensor out;
  dt_tensor *o[1] = {&out};
  dt_status s = dt_op_call(ctx, op, a, in, o, NULL);
  TU_CHECK(s == DT_OK, "%s on %s: %s", name, J->dev ? "device" : "host", dt_last_error(ctx));
  if (s == DT_OK) keep(ctx, J, name, &out);
}

/* The op's backward (its kernels through dt_op_call) for output gradient g. */
static void call_bwd(dt_ctx *ctx, opjob *J, const char *name, const dt_op *op, const dt_op_attrs *a,
                     const dt_tensor *x, const dt_tensor *y, const dt_tensor *g) {
  const dt_tensor *in[2] = {x, y};
  dt_tensor out, gx[2];
  dt_tensor *o[1] = {&out};
  dt_tensor *gi[2] = {&gx[0], op->n_in > 1 ? &gx[1] : NULL};
  TU_OK(ctx, dt_op_call(ctx, op, a, in, o, NULL));
  const dt_tensor *outs[1] = {&out}, *gouts[1] = {g};
  dt_status s = op->backward(ctx, a, in, outs, gouts, gi);
  TU_CHECK(s == DT_OK, "%s backward on %s: %s", name, J->dev ? "device" : "host", dt_last_error(ctx));
  dt_tensor_free(ctx, &out);
  if (s != DT_OK) return;
  keep(ctx, J, name, &gx[0]);
  if (op->n_in > 1) keep(ctx, J, name, &gx[1]);
}

static dt_status op_rank(dt_ctx *ctx, void *arg) {
  opjob *J = arg;
  dt_mesh *mesh;
  const int ms[1] = {1};
  DT_CHECK(dt_mesh_create(ctx, ctx->world, 1, ms, NULL, &mesh));
  const int64_t s2[2] = {6, 33}, s1[1] = {33}, s3[3] = {4, 6, 33}, sa[3] = {2, 5, 7},
                sb[3] = {2, 7, 3}, sx[2] = {4, 9}, sw[2] = {6, 9}, sm[3] = {5, 2, 7};
  dt_tensor x = mk(ctx, mesh, J, 2, s2, 1), x2 = mk(ctx, mesh, J, 2, s2, 2), v = mk(ctx, mesh, J, 1, s1, 3),
            x3 = mk(ctx, mesh, J, 3, s3, 4), A = mk(ctx, mesh, J, 3, sa, 5), B = mk(ctx, mesh, J, 3, sb, 6),
            X = mk(ctx, mesh, J, 2, sx, 7), W = mk(ctx, mesh, J, 2, sw, 8), M = mk(ctx, mesh, J, 3, sm, 9),
            P = mk(ctx, mesh, J, 3, s3, 100), g6 = mk(ctx, mesh, J, 1, s3 + 1, 10);
  dt_op_attrs a = DT_OP_ATTRS_INIT;
  call(ctx, J, "add (broadcast)", &dt_op_add, &a, &x, &v);
  call(ctx, J, "sub", &dt_op_sub, &a, &x, &x2);
  call(ctx, J, "mul (broadcast)", &dt_op_mul, &a, &v, &x);
  call(ctx, J, "silu", &dt_op_silu, &a, &x, NULL);
  call(ctx, J, "swiglu", &dt_op_swiglu, &a, &x, &x2);
  call_bwd(ctx, J, "silu backward", &dt_op_silu, &a, &x, NULL, &x2);
  call_bwd(ctx, J, "swiglu backward", &dt_op_swiglu, &a, &x, &x2, &x);
  call_bwd(ctx, J, "mul backward (broadcast)", &dt_op_mul, &a, &x, &v, &x2);
  a.scalar = 0.375;
  call(ctx, J, "scale", &dt_op_scale, &a, &x, NULL);
  a = (dt_op_attrs)DT_OP_ATTRS_INIT;
  a.ndims = 1, a.dims[0] = 1, a.keepdim = true;
  J->next_terms = 6;
  call(ctx, J, "sum dim 1 keepdim", &dt_op_sum, &a, &P, NULL);
  a.ndims = 2, a.dims[0] = 0, a.dims[1] = 2, a.keepdim = false;
  J->next_terms = 4 * 33;
  call(ctx, J, "sum dims 0, 2", &dt_op_sum, &a, &P, NULL);
  J->next_terms = 0;
  call_bwd(ctx, J, "sum backward", &dt_op_sum, &a, &x3, NULL, &g6);
  a = (dt_op_attrs)DT_OP_ATTRS_INIT;
  J->next_terms = 4 * 6 * 33;
  call(ctx, J, "mean (all)", &dt_op_mean, &a, &P, NULL);
  J->next_terms = 0;
  a.dim = -1;
  call(ctx, J, "softmax dim -1", &dt_op_softmax, &a, &x, NULL);
  call_bwd(ctx, J, "softmax backward", &dt_op_softmax, &a, &x, NULL, &x2);
  a.dim = 0;
  call(ctx, J, "softmax dim 0", &dt_op_softmax, &a, &x, NULL);
  a = (dt_op_attrs)DT_OP_ATTRS_INIT;
  call(ctx, J, "matmul", &dt_op_matmul, &a, &A, &B);
  call(ctx, J, "linear", &dt_op_linear, &a, &X, &W);
  snprintf(a.eq, sizeof a.eq, "mbk,bkn->bmn"); /* A re-laid out on the device */
  call(ctx, J, "einsum mbk,bkn->bmn", &dt_op_einsum, &a, &M, &B);
  snprintf(a.eq, sizeof a.eq, "bmk,bkn->mbn"); /* C through device scratch */
  call(ctx, J, "einsum bmk,bkn->mbn", &dt_op_einsum, &a, &A, &B);
  snprintf(a.eq, sizeof a.eq, "ij,kj->i"); /* k summed in one input: the contract slot */
  J->next_terms = 6 * 9;
  call(ctx, J, "einsum ij,kj->i", &dt_op_einsum, &a, &X, &W);
  J->next_terms = 0;
  a = (dt_op_attrs)DT_OP_ATTRS_INIT;
  a.i0 = 0, a.i1 = 1;
  call(ctx, J, "transpose", &dt_op_transpose, &a, &x, NULL);
  a = (dt_op_attrs)DT_OP_ATTRS_INIT;
  a.ndims = 3, a.dims[0] = 2, a.dims[1] = 0, a.dims[2] = 1;
  call(ctx, J, "permute", &dt_op_permute, &a, &x3, NULL);
  a = (dt_op_attrs)DT_OP_ATTRS_INIT;
  a.shape_n = 2, a.shape[0] = 24, a.shape[1] = -1;
  call(ctx, J, "reshape", &dt_op_reshape, &a, &x3, NULL);
  dt_tensor *all[] = {&x, &x2, &v, &x3, &A, &B, &X, &W, &M, &P, &g6};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dt_tensor_free(ctx, all[i]);
  if (J->dev) TU_CHECK(ctx->mem.dev_cur == 0, "device bytes left after the ops: %zu", ctx->mem.dev_cur);
  dt_mesh_free(mesh);
  return DT_OK;
}

static void run_ops(opjob *J, bool on_cuda) {
  dt_launch_opts lo = {.backend = DT_BACKEND_THREADS, .world = 1, .timeout_s = 60};
  if (J->dev) {
    lo.device = DT_DEV_CUDA;
    lo.cuda_emu = !on_cuda;
  }
  dt_launch_report rep;
  if (dt_launch(&lo, op_rank, J, &rep) != DT_OK)
    tu_fail(__FILE__, __LINE__, "op job (%s): rank %d: %s", J->dev ? "device" : "host",
            rep.failed_rank, rep.failed_msg);
  dt_launch_report_free(&rep);
}

static void test_ops(bool on_cuda) {
  for (int ti = 0; ti < 2; ti++) {
    opjob H = {.dev = false, .t = ftypes[ti]}, D = {.dev = true, .t = ftypes[ti]};
    run_ops(&H, on_cuda);
    run_ops(&D, on_cuda);
    TU_CHECK(H.nres == D.nres, "%d results on the host, %d on the device", H.nres, D.nres);
    /* The host computes in double (f32: rounded once, or float on vmath.h's
     * exp for silu/swiglu), the device in the arithmetic type: softmax's f32
     * bound of test_softmax (32 units for rows <= 33) is the largest of the
     * kernels' differences; GEMMs of k <= 9 agree within k units. */
    double tol0 = 32 * arith_unit(ftypes[ti]) + kt_unit(ftypes[ti]);
    for (int k = 0; k < H.nres && k < D.nres; k++) {
      /* Sums of positive terms (both sides accumulate in f64, in different
       * orders) are each within (terms - 1) f64 units of the exact sum,
       * relatively (Higham sec. 4.2). */
      double tol = tol0 + 2 * H.terms[k] * kt_unit(DT_F64);
      char what[96];
      snprintf(what, sizeof what, "op %s %s: device vs host", H.name[k], dt_dtype_name(ftypes[ti]));
      TU_CHECK(H.n[k] == D.n[k], "%s: %lld vs %lld elements", what, (long long)D.n[k], (long long)H.n[k]);
      if (H.n[k] == D.n[k]) kt_close_to(what, D.res[k], H.res[k], H.n[k], tol);
    }
    for (int k = 0; k < H.nres; k++) free(H.res[k]);
    for (int k = 0; k < D.nres; k++) free(D.res[k]);
  }
  printf("ops on device arrays: %s, f32 and f64, against the same ops on host arrays\n",
         on_cuda ? "cuda" : "cuda-emu");
}

/* ---- the guards ------------------------------------------------------------ */
static void test_guards(kt_dev *T) {
#ifndef KERN_ON_CUDA
  /* A host pointer handed to an emulated kernel is refused, not dereferenced. */
  float h[4] = {1, 2, 3, 4};
  void *dy = kt_up(T, NULL, sizeof h);
  dt_status st = T->K->pw->silu(T->dev, DT_F32, 4, h, dy);
  TU_CHECK(st == DT_ERR_INVALID, "silu on a host pointer -> %s", dt_status_str(st));
  kt_free(T, dy, sizeof h);
  dt_error_clear(T->ctx);
#endif
  /* The comparison can say no: one value off by 8 units of f32, or a NaN. */
  double want[3] = {1, -2, 3e5}, got[3] = {1, -2, 3e5};
  got[2] *= 1 + 8 * kt_unit(DT_F32);
  TU_CHECK(kt_mismatch(got, want, 3, 4 * kt_unit(DT_F32)) == 2, "an 8-unit error passes 4 units");
  got[2] = want[2];
  got[0] = NAN;
  TU_CHECK(kt_mismatch(got, want, 3, 1) == 0, "a NaN passes");
  /* And a slot run with an operand stride off by one (39 for the row stride of
   * a [5, 40] b) is caught by the same comparison the binary checks use. */
  const int64_t shape[2] = {5, 40}, sa[2] = {40, 1}, sb_bad[2] = {39, 1};
  double a[200], b[200], w[200], g[200];
  kt_uniform(a, 200, 3, 0, -1, 1);
  kt_uniform(b, 200, 5, 0, -1, 1);
  void *da = up_rounded(T, DT_F32, a, 200), *db = up_rounded(T, DT_F32, b, 200);
  void *dz = kt_up(T, NULL, 200 * sizeof(float));
  for (int i = 0; i < 200; i++) w[i] = a[i] + b[i];
  TU_OK(T->ctx, T->K->pw->binary(T->dev, DT_F32, DT_PW_ADD, 2, shape, da, sa, db, sb_bad, dz));
  down_unpacked(T, DT_F32, dz, g, 200);
  TU_CHECK(kt_mismatch(g, w, 200, btol(DT_PW_ADD, DT_F32)) == 40,
           "an off-by-one stride passes (first mismatch %lld, expected row 1's first, 40)",
           (long long)kt_mismatch(g, w, 200, btol(DT_PW_ADD, DT_F32)));
  kt_free(T, da, 200 * sizeof(float));
  kt_free(T, db, 200 * sizeof(float));
  kt_free(T, dz, 200 * sizeof(float));
}

int main(void) {
  dt_ctx ctx;
  kt_dev T;
  int rc = kt_start(&T, &ctx);
  if (rc) return rc;
  test_silu(&T);
  test_cast(&T);
  test_scale(&T);
  test_binary(&T);
  test_swiglu_bwd(&T);
  test_reduce(&T);
  test_sum_dims(&T);
  test_contract(&T);
  test_softmax(&T);
  test_permute(&T);
  test_guards(&T);
  test_ops(KT_ON_CUDA);
  return kt_end(&T, &ctx, KT_NAME("test_kern"));
}
