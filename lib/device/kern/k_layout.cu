/* lib/device/kern/k_layout.cu: the dt_kern_layout group of lib/device/kernels.h
 * (box copies for the DTensor layout changes, the element-wise reduce of the
 * comm backends on device buffers), built for CUDA and for the host emulator
 * (sbk.cuh). */
#include "device/kern/sbk.cuh"

namespace {

enum { LAYOUT_BLOCK = 256 };

/* ---- copy_box ------------------------------------------------------------------
 * The box is folded as dt_copy_box folds it: the trailing dims it covers whole
 * in both arrays become one contiguous run, the rest are "rows". The run is
 * moved in the widest word (16, 8, 4, 2 or 1 bytes) that divides every row's
 * start and length in both arrays, so a bf16 or f32 shard moves 16 bytes per
 * thread where alignment allows. A row is served by a group of G threads (G a
 * power of two >= the run's words, at most the block), several rows per block
 * when runs are short: consecutive threads touch consecutive words, and each
 * row's offsets cost a few divisions per row, never per element. */

struct alignas(16) w16 {
  uint64_t a, b;
};

struct box_geom {
  int nouter;                  /* row dims (0..k-1 of the folded box) */
  int64_t box[DT_MAX_DIMS];    /* row counts per row dim */
  int64_t ss[DT_MAX_DIMS];     /* row-dim strides in words, src */
  int64_t ds[DT_MAX_DIMS];     /* and dst */
  int64_t s0, d0;              /* the box's first word in src and dst */
  int64_t rows, words;         /* rows, words per row */
};

template <class W>
dt_status copy_box_t(dt_device *d, W *dst, const W *src, box_geom g) {
  int G = 1, lg = 0;
  while (G < g.words && G < LAYOUT_BLOCK) G <<= 1, lg++;
  int rpb = LAYOUT_BLOCK / G; /* rows per block */
  int64_t grid = sbk_grid(g.rows, rpb);
  return sbk_launch(d, "kern.copy_box", grid, LAYOUT_BLOCK, 0, 0, SBK_LAMBDA(const sbk_thr &t) {
    int lane = t.tx & (G - 1), grp = t.tx >> lg;
    for (int64_t r = (int64_t)t.bx * rpb + grp; r < g.rows; r += (int64_t)t.nbx * rpb) {
      int64_t so = g.s0, dof = g.d0, rest = r;
      for (int k = g.nouter - 1; k >= 0; k--) {
        int64_t i = rest % g.box[k];
        rest /= g.box[k];
        so += i * g.ss[k];
        dof += i * g.ds[k];
      }
      for (int64_t j = lane; j < g.words; j += G) dst[dof + j] = src[so + j];
    }
  });
}

dt_status copy_box(dt_device *d, size_t es, int ndim, void *dst, const int64_t *dst_shape,
                   const int64_t *dst_off, const void *src, const int64_t *src_shape,
                   const int64_t *src_off, const int64_t *box) {
  const char *call = "kern.copy_box";
  if (ndim < 0 || ndim > DT_MAX_DIMS || es == 0)
    return dt_error(d->ctx, DT_ERR_INVALID, call, "ndim %d, element size %zu", ndim, es);
  for (int k = 0; k < ndim; k++)
    if (box[k] <= 0) return DT_OK; /* n == 0 */
  SBK_UNTAG(d, call, dst, src);
  box_geom g;
  memset(&g, 0, sizeof g);
  int64_t run = 1, k = ndim - 1;
  int64_t sstride[DT_MAX_DIMS], dstride[DT_MAX_DIMS], ss = 1, ds = 1;
  for (int e = ndim - 1; e >= 0; e--) {
    sstride[e] = ss;
    dstride[e] = ds;
    ss *= src_shape[e];
    ds *= dst_shape[e];
  }
  if (ndim > 0) {
    run = box[k];
    while (k > 0 && box[k] == src_shape[k] && box[k] == dst_shape[k]) {
      k--;
      run *= box[k];
    }
  } else {
    k = 0;
  }
  int64_t s0 = 0, d0 = 0;
  for (int e = 0; e < ndim; e++) {
    s0 += src_off[e] * sstride[e];
    d0 += dst_off[e] * dstride[e];
  }
  /* The widest word dividing every byte offset and length involved. */
  uint64_t m = (uint64_t)run * es | (uint64_t)s0 * es | (uint64_t)d0 * es |
               (uint64_t)(uintptr_t)dst | (uint64_t)(uintptr_t)src;
  for (int e = 0; e < k; e++) m |= (uint64_t)sstride[e] * es | (uint64_t)dstride[e] * es;
  size_t w = 16;
  while (w > 1 && (m & (w - 1))) w >>= 1;
  g.nouter = (int)k;
  g.rows = 1;
  for (int e = 0; e < k; e++) {
    g.box[e] = box[e];
    g.ss[e] = sstride[e] * (int64_t)es / (int64_t)w;
    g.ds[e] = dstride[e] * (int64_t)es / (int64_t)w;
    g.rows *= box[e];
  }
  g.s0 = s0 * (int64_t)es / (int64_t)w;
  g.d0 = d0 * (int64_t)es / (int64_t)w;
  g.words = run * (int64_t)es / (int64_t)w;
  switch (w) {
    case 16: return copy_box_t(d, (w16 *)dst, (const w16 *)src, g);
    case 8: return copy_box_t(d, (uint64_t *)dst, (const uint64_t *)src, g);
    case 4: return copy_box_t(d, (uint32_t *)dst, (const uint32_t *)src, g);
    case 2: return copy_box_t(d, (uint16_t *)dst, (const uint16_t *)src, g);
    default: return copy_box_t(d, (uint8_t *)dst, (const uint8_t *)src, g);
  }
}

/* ---- reduce ------------------------------------------------------------------
 * One launch reduces up to DT_KRED_MAX_IN inputs, whose pointers travel in the
 * kernel's parameters; each thread folds its elements over the inputs in order,
 * so every element is reduced left to right exactly as the host's
 * dt_reduce_into chain does (PyTorch's ReduceOp semantics: max/min propagate
 * NaN like torch.maximum/torch.minimum). */

template <class T> struct in_list {
  const T *p[DT_KRED_MAX_IN];
};

template <int OP, class A> static SBK_DEV inline A red_op(A x, A y) {
  if (OP == DT_KRED_MAX) return y > x || y != y ? y : x;
  if (OP == DT_KRED_MIN) return y < x || y != y ? y : x;
  if (OP == DT_KRED_PROD) return x * y;
  return x + y;
}

template <class T, int OP>
dt_status reduce_op(dt_device *d, int64_t n, int nin, in_list<T> in, T *out, bool divide,
                    double divisor) {
  typedef typename sbk_acc<T>::type A;
  A dv = (A)divisor;
  return sbk_launch(d, "kern.reduce", sbk_grid(n, LAYOUT_BLOCK), LAYOUT_BLOCK, 0, 0,
                    SBK_LAMBDA(const sbk_thr &t) {
                      SBK_FOR(i, n, t) {
                        A acc = sbk_ld(in.p[0], i);
                        for (int m = 1; m < nin; m++) acc = red_op<OP, A>(acc, sbk_ld(in.p[m], i));
                        /* a true division, as the host's avg: the mean of equal values is exact */
                        if (divide) acc = acc / dv;
                        sbk_st(out, i, acc);
                      }
                    });
}

template <class T>
dt_status reduce_t(dt_device *d, int op, int64_t n, int nin, const void *const *in, void *outv,
                   double divisor) {
  T *out = (T *)outv;
  dt_status s = DT_OK;
  /* Rounds: the first takes up to DT_KRED_MAX_IN inputs, each later one the
   * running result (out) and up to DT_KRED_MAX_IN - 1 more. */
  for (int done = 0; done < nin && s == DT_OK;) {
    in_list<T> L;
    int k = 0;
    if (done > 0) L.p[k++] = out;
    while (k < DT_KRED_MAX_IN && done < nin) L.p[k++] = (const T *)in[done++];
    for (int j = k; j < DT_KRED_MAX_IN; j++) L.p[j] = L.p[0];
    bool divide = op == DT_KRED_AVG && done == nin;
    switch (op) {
      case DT_KRED_SUM: case DT_KRED_AVG: s = reduce_op<T, DT_KRED_SUM>(d, n, k, L, out, divide, divisor); break;
      case DT_KRED_MAX: s = reduce_op<T, DT_KRED_MAX>(d, n, k, L, out, false, divisor); break;
      case DT_KRED_MIN: s = reduce_op<T, DT_KRED_MIN>(d, n, k, L, out, false, divisor); break;
      default: s = reduce_op<T, DT_KRED_PROD>(d, n, k, L, out, false, divisor); break;
    }
  }
  return s;
}

dt_status reduce(dt_device *d, dt_dtype t, int op, int64_t n, int nin, const void *const *in,
                 void *out, double divisor) {
  const char *call = "kern.reduce";
  if (n == 0) return DT_OK;
  if (nin < 1 || !in || op < DT_KRED_SUM || op > DT_KRED_PROD)
    return dt_error(d->ctx, DT_ERR_INVALID, call, "%d inputs, op %d", nin, op);
  SBK_UNTAG(d, call, out);
  /* The input pointers, untagged: at most 1024 ranks (DT_THREADS_MAX_WORLD)
   * reduce together; rounds of DT_KRED_MAX_IN read them from here. */
  enum { MAX_LIST = 1024 };
  if (nin > MAX_LIST)
    return dt_error(d->ctx, DT_ERR_INVALID, call, "%d inputs (at most %d)", nin, (int)MAX_LIST);
  const void *un[MAX_LIST];
  for (int m = 0; m < nin; m++) {
    un[m] = in[m];
    SBK_UNTAG(d, call, un[m]);
  }
  SBK_FLOAT_DISPATCH(d, call, t, reduce_t, d, op, n, nin, un, out, divisor);
}

} // namespace

extern "C" const dt_kern_layout SBK(layout) = {
    copy_box,
    reduce,
};
