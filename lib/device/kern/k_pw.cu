/* lib/device/kern/k_pw.cu: element-wise, layout and reduction kernels (the
 * dt_kern_pw group of lib/device/kernels.h), built for CUDA and for the host
 * emulator (sbk.cuh). Arithmetic is in the storage type's sbk_acc type (f32 for
 * f32 and bf16, f64 for f64), as the ops' host kernels do; sums over a
 * reduction axis accumulate in f64 for f32 and f64 (the host kernels' double
 * accumulators) and in f32 for bf16.
 *
 * Shapes go through pw_merge first: size-1 dims are dropped and neighbours
 * that every operand walks contiguously are fused, so a same-shape operation is
 * one flat loop and a transpose keeps only the dims it really permutes. Then
 *  - one dim left: a flat grid-stride loop (no index arithmetic but a multiply);
 *  - an innermost run of >= PW_MIN_ROW elements: one block per row (grid-stride
 *    over rows), the row's base offsets decomposed once per row, threads on
 *    consecutive elements of the row (coalesced stores, and coalesced loads
 *    wherever the operand's innermost stride is 1);
 *  - else a flat loop that decomposes every index (short rows).
 * Row reductions (softmax, sum over the last axis, sum_dims when x's innermost
 * dim is reduced) are one block per row with a shared-memory block reduction
 * (sbk_block_reduce), the layout PyTorch's cunn_SoftMaxForward
 * (aten/src/ATen/native/cuda/SoftMax.cu) uses for long rows; other sums are
 * COL_GROUPS threads per output with a tree over them when an output has
 * COL_MIN terms or more (sum_dims_cols), else a thread per output. A permute that moves the innermost dim goes through
 * shared-memory tiles (permute_tiled). */
#include "device/kern/sbk.cuh"

namespace {

enum { PW_BLOCK = 256, PW_MIN_ROW = 32, RED_BLOCK = 256 };
/* sum_dims with x's innermost dim kept and at least COL_MIN terms an output:
 * a block of COL_W consecutive outputs (coalesced loads along the kept dim) x
 * COL_GROUPS threads each, every thread summing every COL_GROUPS-th term, then
 * a shared-memory tree of log2(COL_GROUPS) levels over the groups. */
enum { COL_W = 32, COL_GROUPS = 8, COL_MIN = 64 };

/* ---- shapes ------------------------------------------------------------------ */

/* A shape with up to two operands' element strides. */
struct pw_dims {
  int nd;
  int64_t n[DT_MAX_DIMS];
  int64_t s[2][DT_MAX_DIMS];
};

/* D = shape[0..nd) with nops operands' strides st[j], size-1 dims dropped and
 * adjacent dims fused where every operand steps over the inner one exactly
 * (s[outer] == s[inner] * n[inner]); at least one dim (a scalar is [1]).
 * False when nd is out of range or a size is negative. */
bool pw_merge(int nd, const int64_t *shape, int nops, const int64_t *const *st, pw_dims *D) {
  if (nd < 0 || nd > DT_MAX_DIMS) return false;
  D->nd = 0;
  for (int k = 0; k < nd; k++) {
    if (shape[k] < 0) return false;
    if (shape[k] == 1) continue;
    int p = D->nd - 1;
    bool fuse = p >= 0;
    for (int j = 0; j < nops && fuse; j++) fuse = D->s[j][p] == st[j][k] * shape[k];
    if (fuse) {
      D->n[p] *= shape[k];
      for (int j = 0; j < nops; j++) D->s[j][p] = st[j][k];
    } else {
      D->n[D->nd] = shape[k];
      for (int j = 0; j < 2; j++) D->s[j][D->nd] = j < nops ? st[j][k] : 0;
      D->nd++;
    }
  }
  if (D->nd == 0) {
    D->nd = 1;
    D->n[0] = 1;
    D->s[0][0] = D->s[1][0] = 0;
  }
  return true;
}

/* Offsets of the operands at index i of dims [0, nd) (row-major). */
static SBK_DEV inline void pw_offsets(const pw_dims &D, int nd, int64_t i, int64_t &o0,
                                      int64_t &o1) {
  for (int k = nd - 1; k >= 0; k--) {
    int64_t q = i % D.n[k];
    i /= D.n[k];
    o0 += q * D.s[0][k];
    o1 += q * D.s[1][k];
  }
}

/* The smallest power of two >= w, within [PW_MIN_ROW, PW_BLOCK]. */
static inline int row_block(int64_t w) {
  int b = PW_MIN_ROW;
  while (b < PW_BLOCK && b < w) b *= 2;
  return b;
}

/* ---- silu -------------------------------------------------------------------- */

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

/* ---- cast -------------------------------------------------------------------- */

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

/* ---- scale ------------------------------------------------------------------- */

template <class T>
dt_status scale_t(dt_device *d, int64_t n, double alpha, const void *xv, void *yv) {
  const T *x = (const T *)xv;
  T *y = (T *)yv;
  typedef typename sbk_acc<T>::type A;
  A al = (A)alpha;
  return sbk_launch(d, "kern.scale", sbk_grid(n, PW_BLOCK), PW_BLOCK, 0, 0,
                    SBK_LAMBDA(const sbk_thr &t) {
                      SBK_FOR(i, n, t) sbk_st(y, i, al * sbk_ld(x, i));
                    });
}

dt_status scale(dt_device *d, dt_dtype t, int64_t n, double alpha, const void *x, void *y) {
  if (n == 0) return DT_OK;
  SBK_UNTAG(d, "kern.scale", x, y);
  SBK_FLOAT_DISPATCH(d, "kern.scale", t, scale_t, d, n, alpha, x, y);
}

/* ---- binary ------------------------------------------------------------------ */

template <class A> static SBK_DEV inline A pw_eval(int op, A a, A b) {
  switch (op) {
    case DT_PW_ADD: return a + b;
    case DT_PW_SUB: return a - b;
    case DT_PW_MUL: return a * b;
    case DT_PW_SWIGLU: return a * ((A)1 / ((A)1 + sbk_exp(-a))) * b;
    default: { /* DT_PW_SILU_GRAD */
      A s = (A)1 / ((A)1 + sbk_exp(-a));
      return b * s * ((A)1 + a * ((A)1 - s));
    }
  }
}

template <class T>
dt_status binary_t(dt_device *d, int op, const pw_dims &D, int64_t numel, const void *av,
                   const void *bv, void *yv) {
  const T *a = (const T *)av, *b = (const T *)bv;
  T *y = (T *)yv;
  typedef typename sbk_acc<T>::type A;
  const int nd = D.nd;
  const int64_t W = D.n[nd - 1], sa = D.s[0][nd - 1], sb = D.s[1][nd - 1];
  if (nd == 1)
    return sbk_launch(d, "kern.binary", sbk_grid(numel, PW_BLOCK), PW_BLOCK, 0, 0,
                      SBK_LAMBDA(const sbk_thr &t) {
                        SBK_FOR(i, numel, t) {
                          sbk_st(y, i, pw_eval<A>(op, sbk_ld(a, i * sa), sbk_ld(b, i * sb)));
                        }
                      });
  if (W >= PW_MIN_ROW) {
    const int64_t rows = numel / W;
    return sbk_launch(d, "kern.binary", sbk_grid(rows, 1), row_block(W), 0, 0,
                      SBK_LAMBDA(const sbk_thr &t) {
                        for (int64_t r = t.bx; r < rows; r += t.nbx) {
                          int64_t oa = 0, ob = 0;
                          pw_offsets(D, nd - 1, r, oa, ob);
                          T *yr = y + r * W;
                          for (int64_t c = t.tx; c < W; c += t.ntx)
                            sbk_st(yr, c, pw_eval<A>(op, sbk_ld(a, oa + c * sa),
                                                     sbk_ld(b, ob + c * sb)));
                        }
                      });
  }
  return sbk_launch(d, "kern.binary", sbk_grid(numel, PW_BLOCK), PW_BLOCK, 0, 0,
                    SBK_LAMBDA(const sbk_thr &t) {
                      SBK_FOR(i, numel, t) {
                        int64_t oa = 0, ob = 0;
                        pw_offsets(D, nd, i, oa, ob);
                        sbk_st(y, i, pw_eval<A>(op, sbk_ld(a, oa), sbk_ld(b, ob)));
                      }
                    });
}

dt_status binary(dt_device *d, dt_dtype t, dt_pw_op op, int nd, const int64_t *shape,
                 const void *a, const int64_t *sa, const void *b, const int64_t *sb, void *y) {
  const char *call = "kern.binary";
  if ((int)op < DT_PW_ADD || (int)op > DT_PW_SILU_GRAD)
    return dt_error(d->ctx, DT_ERR_INVALID, call, "unknown op %d", (int)op);
  const int64_t *st[2] = {sa, sb};
  pw_dims D;
  if (!pw_merge(nd, shape, 2, st, &D))
    return dt_error(d->ctx, DT_ERR_INVALID, call, "bad shape (%d dims)", nd);
  int64_t n = 1;
  for (int k = 0; k < D.nd; k++) n *= D.n[k];
  if (n == 0) return DT_OK;
  SBK_UNTAG(d, call, a, b, y);
  SBK_FLOAT_DISPATCH(d, call, t, binary_t, d, (int)op, D, n, a, b, y);
}

/* ---- swiglu backward ---------------------------------------------------------- */

template <class T>
dt_status swiglu_bwd_t(dt_device *d, int64_t n, const void *av, const void *bv, const void *gv,
                       void *dav, void *dbv) {
  const T *a = (const T *)av, *b = (const T *)bv, *g = (const T *)gv;
  T *da = (T *)dav, *db = (T *)dbv;
  typedef typename sbk_acc<T>::type A;
  return sbk_launch(d, "kern.swiglu_bwd", sbk_grid(n, PW_BLOCK), PW_BLOCK, 0, 0,
                    SBK_LAMBDA(const sbk_thr &t) {
                      SBK_FOR(i, n, t) {
                        A x = sbk_ld(a, i), gi = sbk_ld(g, i);
                        A s = (A)1 / ((A)1 + sbk_exp(-x));
                        sbk_st(db, i, gi * x * s);
                        sbk_st(da, i, gi * sbk_ld(b, i) * s * ((A)1 + x * ((A)1 - s)));
                      }
                    });
}

dt_status swiglu_bwd(dt_device *d, dt_dtype t, int64_t n, const void *a, const void *b,
                     const void *g, void *da, void *db) {
  if (n == 0) return DT_OK;
  SBK_UNTAG(d, "kern.swiglu_bwd", a, b, g, da, db);
  SBK_FLOAT_DISPATCH(d, "kern.swiglu_bwd", t, swiglu_bwd_t, d, n, a, b, g, da, db);
}

/* ---- reduce ------------------------------------------------------------------ */

/* The accumulator of a sum over storage type T. */
template <class T> struct red_acc { typedef double type; };
template <> struct red_acc<sbk_bf16> { typedef float type; };

template <class TX, class TY>
dt_status reduce_t(dt_device *d, const void *xv, void *yv, int64_t outer, int64_t red,
                   int64_t inner, double alpha) {
  const TX *x = (const TX *)xv;
  TY *y = (TY *)yv;
  typedef typename red_acc<TX>::type R;
  const R al = (R)alpha;
  if (inner == 1) /* rows: one block per output, the block reduces the row */
    return sbk_launch(d, "kern.reduce", sbk_grid(outer, 1), RED_BLOCK, RED_BLOCK * sizeof(R),
                      SBK_SYNC, SBK_LAMBDA(const sbk_thr &t) {
                        R *buf = (R *)t.smem;
                        for (int64_t o = t.bx; o < outer; o += t.nbx) {
                          const TX *xr = x + o * red;
                          R acc = 0;
                          for (int64_t r = t.tx; r < red; r += t.ntx) acc += (R)sbk_ld(xr, r);
                          acc = sbk_block_reduce(t, acc, buf, 0);
                          if (t.tx == 0) sbk_st(y, o, acc * al);
                        }
                      });
  /* columns: a thread per output, consecutive threads on consecutive i */
  const int64_t n = outer * inner;
  return sbk_launch(d, "kern.reduce", sbk_grid(n, PW_BLOCK), PW_BLOCK, 0, 0,
                    SBK_LAMBDA(const sbk_thr &t) {
                      SBK_FOR(j, n, t) {
                        int64_t o = j / inner;
                        const TX *xp = x + o * red * inner + (j - o * inner);
                        R acc = 0;
                        for (int64_t r = 0; r < red; r++) acc += (R)sbk_ld(xp, r * inner);
                        sbk_st(y, j, acc * al);
                      }
                    });
}

template <class TX>
dt_status reduce_from(dt_device *d, const void *x, dt_dtype ty, void *y, int64_t outer,
                      int64_t red, int64_t inner, double alpha) {
  switch (ty) {
    case DT_F32: return reduce_t<TX, float>(d, x, y, outer, red, inner, alpha);
    case DT_F64: return reduce_t<TX, double>(d, x, y, outer, red, inner, alpha);
    case DT_BF16: return reduce_t<TX, sbk_bf16>(d, x, y, outer, red, inner, alpha);
    default: return dt_error(d->ctx, DT_ERR_UNSUPPORTED, "kern.reduce", "to %s", dt_dtype_name(ty));
  }
}

dt_status reduce(dt_device *d, dt_dtype tx, const void *x, dt_dtype ty, void *y, int64_t outer,
                 int64_t red, int64_t inner, double alpha) {
  if (outer < 0 || red < 0 || inner < 0)
    return dt_error(d->ctx, DT_ERR_INVALID, "kern.reduce", "negative size");
  if (outer * inner == 0) return DT_OK;
  SBK_UNTAG(d, "kern.reduce", x, y);
  SBK_FLOAT_DISPATCH(d, "kern.reduce", tx, reduce_from, d, x, ty, y, outer, red, inner, alpha);
}

/* ---- sum over dims ------------------------------------------------------------ */

/* x's dims, size-1 ones dropped, split into the kept ones (y's, in order) and
 * the reduced ones, each with x's element strides; neighbours of one kind
 * fuse (x is contiguous, so they are walked contiguously). */
struct red_dims {
  int nk, nr;
  int64_t kn[DT_MAX_DIMS], ks[DT_MAX_DIMS], rn[DT_MAX_DIMS], rs[DT_MAX_DIMS];
  int64_t ny, nred; /* outputs; elements summed into each */
  bool rows;        /* x's innermost dim is reduced: each output's terms are one row */
};

bool red_split(int nd, const int64_t *shape, uint32_t dims, red_dims *R) {
  if (nd < 0 || nd > DT_MAX_DIMS) return false;
  int64_t st[DT_MAX_DIMS], s = 1;
  for (int k = nd - 1; k >= 0; k--) {
    if (shape[k] < 0) return false;
    st[k] = s;
    s *= shape[k];
  }
  R->nk = R->nr = 0;
  R->ny = R->nred = 1;
  R->rows = false;
  int last = -1; /* the kind of the previous dim kept (0) or reduced (1) */
  for (int k = 0; k < nd; k++) {
    if (shape[k] == 1) continue;
    int red = (int)(dims >> k & 1u);
    int64_t *n = red ? R->rn : R->kn, *sv = red ? R->rs : R->ks;
    int &c = red ? R->nr : R->nk;
    if (last == red) {
      n[c - 1] *= shape[k];
      sv[c - 1] = st[k];
    } else {
      n[c] = shape[k];
      sv[c] = st[k];
      c++;
    }
    last = red;
    (red ? R->nred : R->ny) *= shape[k];
  }
  R->rows = last == 1;
  return true;
}

/* The offset of index i of dims n[0..c) with strides s (row-major). */
static SBK_DEV inline int64_t dims_offset(const int64_t *n, const int64_t *s, int c, int64_t i) {
  int64_t o = 0;
  for (int k = c - 1; k >= 0; k--) {
    int64_t q = i % n[k];
    i /= n[k];
    o += q * s[k];
  }
  return o;
}

template <class TX, class TY>
dt_status sum_dims_t(dt_device *d, const red_dims &D, const void *xv, void *yv, double div) {
  const TX *x = (const TX *)xv;
  TY *y = (TY *)yv;
  typedef typename red_acc<TX>::type R;
  const R dv = (R)div;
  const int64_t ny = D.ny, nr = D.nred;
  if (D.rows) /* one block per output, the block reduces its terms */
    return sbk_launch(d, "kern.sum_dims", sbk_grid(ny, 1), RED_BLOCK, RED_BLOCK * sizeof(R),
                      SBK_SYNC, SBK_LAMBDA(const sbk_thr &t) {
                        R *buf = (R *)t.smem;
                        for (int64_t j = t.bx; j < ny; j += t.nbx) {
                          const int64_t base = dims_offset(D.kn, D.ks, D.nk, j);
                          R acc = 0;
                          for (int64_t r = t.tx; r < nr; r += t.ntx)
                            acc += (R)sbk_ld(x, base + dims_offset(D.rn, D.rs, D.nr, r));
                          acc = sbk_block_reduce(t, acc, buf, 0);
                          if (t.tx == 0) sbk_st(y, j, acc / dv);
                        }
                      });
  if (nr >= COL_MIN) /* columns: COL_GROUPS threads per output, a tree over them */
    return sbk_launch(d, "kern.sum_dims_cols", sbk_grid((ny + COL_W - 1) / COL_W, 1),
                      COL_W * COL_GROUPS, COL_W * COL_GROUPS * sizeof(R), SBK_SYNC,
                      SBK_LAMBDA(const sbk_thr &t) {
                        R *buf = (R *)t.smem;
                        const int lx = t.tx % COL_W, g = t.tx / COL_W;
                        const int64_t tiles = (ny + COL_W - 1) / COL_W;
                        for (int64_t b = t.bx; b < tiles; b += t.nbx) {
                          const int64_t j = b * COL_W + lx;
                          R acc = 0;
                          if (j < ny) {
                            const int64_t base = dims_offset(D.kn, D.ks, D.nk, j);
                            for (int64_t r = g; r < nr; r += COL_GROUPS)
                              acc += (R)sbk_ld(x, base + dims_offset(D.rn, D.rs, D.nr, r));
                          }
                          buf[g * COL_W + lx] = acc;
                          t.sync();
                          for (int h = COL_GROUPS / 2; h > 0; h >>= 1) {
                            if (g < h) buf[g * COL_W + lx] += buf[(g + h) * COL_W + lx];
                            t.sync();
                          }
                          if (g == 0 && j < ny) sbk_st(y, j, buf[lx] / dv);
                          t.sync(); /* buf is refilled for the next b */
                        }
                      });
  /* a thread per output: consecutive threads on x's innermost (kept) dim */
  return sbk_launch(d, "kern.sum_dims", sbk_grid(ny, PW_BLOCK), PW_BLOCK, 0, 0,
                    SBK_LAMBDA(const sbk_thr &t) {
                      SBK_FOR(j, ny, t) {
                        const int64_t base = dims_offset(D.kn, D.ks, D.nk, j);
                        R acc = 0;
                        for (int64_t r = 0; r < nr; r++)
                          acc += (R)sbk_ld(x, base + dims_offset(D.rn, D.rs, D.nr, r));
                        sbk_st(y, j, acc / dv);
                      }
                    });
}

template <class TX>
dt_status sum_dims_from(dt_device *d, const red_dims &D, const void *x, dt_dtype ty, void *y,
                        double div) {
  switch (ty) {
    case DT_F32: return sum_dims_t<TX, float>(d, D, x, y, div);
    case DT_F64: return sum_dims_t<TX, double>(d, D, x, y, div);
    case DT_BF16: return sum_dims_t<TX, sbk_bf16>(d, D, x, y, div);
    default: return dt_error(d->ctx, DT_ERR_UNSUPPORTED, "kern.sum_dims", "to %s", dt_dtype_name(ty));
  }
}

dt_status sum_dims(dt_device *d, dt_dtype tx, int nd, const int64_t *shape, uint32_t dims,
                   const void *x, dt_dtype ty, void *y, double div) {
  const char *call = "kern.sum_dims";
  red_dims D;
  if (!red_split(nd, shape, dims, &D))
    return dt_error(d->ctx, DT_ERR_INVALID, call, "bad shape (%d dims)", nd);
  if (D.ny == 0) return DT_OK;
  SBK_UNTAG(d, call, x, y);
  SBK_FLOAT_DISPATCH(d, call, tx, sum_dims_from, d, D, x, ty, y, div);
}

/* ---- naive contraction ----------------------------------------------------------- */

struct con_dims {
  int no, ns;
  int64_t on[DT_MAX_DIMS], oa[DT_MAX_DIMS], ob[DT_MAX_DIMS];
  int64_t sn[DT_KERN_MAX_SUM], sa[DT_KERN_MAX_SUM], sb[DT_KERN_MAX_SUM];
};

/* Offsets into both operands of index i of dims n[0..c) (row-major). */
static SBK_DEV inline void two_offsets(const int64_t *n, const int64_t *s0, const int64_t *s1, int c,
                                       int64_t i, int64_t &o0, int64_t &o1) {
  for (int k = c - 1; k >= 0; k--) {
    int64_t q = i % n[k];
    i /= n[k];
    o0 += q * s0[k];
    o1 += q * s1[k];
  }
}

/* A thread per output, its terms summed in order. */
template <class T>
dt_status contract_t(dt_device *d, const con_dims &C, int64_t nc, int64_t nsum, const void *av,
                     const void *bv, void *yv) {
  const T *a = (const T *)av, *b = (const T *)bv;
  T *y = (T *)yv;
  typedef typename red_acc<T>::type R;
  return sbk_launch(d, "kern.contract", sbk_grid(nc, PW_BLOCK), PW_BLOCK, 0, 0,
                    SBK_LAMBDA(const sbk_thr &t) {
                      SBK_FOR(c, nc, t) {
                        int64_t pa = 0, pb = 0;
                        two_offsets(C.on, C.oa, C.ob, C.no, c, pa, pb);
                        R acc = 0;
                        for (int64_t s = 0; s < nsum; s++) {
                          int64_t qa = pa, qb = pb;
                          two_offsets(C.sn, C.sa, C.sb, C.ns, s, qa, qb);
                          acc += (R)sbk_ld(a, qa) * (R)sbk_ld(b, qb);
                        }
                        sbk_st(y, c, acc);
                      }
                    });
}

dt_status contract(dt_device *d, dt_dtype t, int no, const int64_t *oshape, const int64_t *oa,
                   const int64_t *ob, int ns, const int64_t *sshape, const int64_t *sa,
                   const int64_t *sb, const void *a, const void *b, void *y) {
  const char *call = "kern.contract";
  if (no < 0 || no > DT_MAX_DIMS || ns < 0 || ns > DT_KERN_MAX_SUM)
    return dt_error(d->ctx, DT_ERR_INVALID, call, "%d output and %d summed dims", no, ns);
  con_dims C;
  memset(&C, 0, sizeof C);
  C.no = no;
  C.ns = ns;
  int64_t nc = 1, nsum = 1;
  for (int k = 0; k < no; k++) {
    if (oshape[k] < 0) return dt_error(d->ctx, DT_ERR_INVALID, call, "negative size");
    C.on[k] = oshape[k], C.oa[k] = oa[k], C.ob[k] = ob[k];
    nc *= oshape[k];
  }
  for (int k = 0; k < ns; k++) {
    if (sshape[k] < 0) return dt_error(d->ctx, DT_ERR_INVALID, call, "negative size");
    C.sn[k] = sshape[k], C.sa[k] = sa[k], C.sb[k] = sb[k];
    nsum *= sshape[k];
  }
  if (nc == 0) return DT_OK;
  SBK_UNTAG(d, call, a, b, y);
  SBK_FLOAT_DISPATCH(d, call, t, contract_t, d, C, nc, nsum, a, b, y);
}

/* ---- softmax ----------------------------------------------------------------- */

template <class T>
dt_status softmax_t(dt_device *d, int64_t outer, int64_t L, int64_t inner, const void *xv,
                    void *yv) {
  const T *x = (const T *)xv;
  T *y = (T *)yv;
  typedef typename sbk_acc<T>::type A;
  const int64_t rows = outer * inner;
  return sbk_launch(d, "kern.softmax", sbk_grid(rows, 1), RED_BLOCK, RED_BLOCK * sizeof(A),
                    SBK_SYNC, SBK_LAMBDA(const sbk_thr &t) {
                      A *buf = (A *)t.smem;
                      for (int64_t row = t.bx; row < rows; row += t.nbx) {
                        int64_t o = row / inner;
                        const int64_t base = o * L * inner + (row - o * inner);
                        A mx = (A)-INFINITY;
                        for (int64_t k = t.tx; k < L; k += t.ntx) {
                          A v = sbk_ld(x, base + k * inner);
                          mx = v > mx ? v : mx;
                        }
                        mx = sbk_block_reduce(t, mx, buf, 1);
                        A z = 0;
                        for (int64_t k = t.tx; k < L; k += t.ntx)
                          z += sbk_exp(sbk_ld(x, base + k * inner) - mx);
                        z = sbk_block_reduce(t, z, buf, 0);
                        for (int64_t k = t.tx; k < L; k += t.ntx)
                          sbk_st(y, base + k * inner, sbk_exp(sbk_ld(x, base + k * inner) - mx) / z);
                      }
                    });
}

dt_status softmax(dt_device *d, dt_dtype t, int64_t outer, int64_t L, int64_t inner, const void *x,
                  void *y) {
  if (outer < 0 || L < 0 || inner < 0)
    return dt_error(d->ctx, DT_ERR_INVALID, "kern.softmax", "negative size");
  if (outer * L * inner == 0) return DT_OK;
  SBK_UNTAG(d, "kern.softmax", x, y);
  SBK_FLOAT_DISPATCH(d, "kern.softmax", t, softmax_t, d, outer, L, inner, x, y);
}

template <class T>
dt_status softmax_bwd_t(dt_device *d, int64_t outer, int64_t L, int64_t inner, const void *yv,
                        const void *dyv, void *dxv) {
  const T *y = (const T *)yv, *dy = (const T *)dyv;
  T *dx = (T *)dxv;
  typedef typename sbk_acc<T>::type A;
  const int64_t rows = outer * inner;
  return sbk_launch(d, "kern.softmax_bwd", sbk_grid(rows, 1), RED_BLOCK, RED_BLOCK * sizeof(A),
                    SBK_SYNC, SBK_LAMBDA(const sbk_thr &t) {
                      A *buf = (A *)t.smem;
                      for (int64_t row = t.bx; row < rows; row += t.nbx) {
                        int64_t o = row / inner;
                        const int64_t base = o * L * inner + (row - o * inner);
                        A dot = 0;
                        for (int64_t k = t.tx; k < L; k += t.ntx) {
                          int64_t e = base + k * inner;
                          dot += sbk_ld(dy, e) * sbk_ld(y, e);
                        }
                        dot = sbk_block_reduce(t, dot, buf, 0);
                        for (int64_t k = t.tx; k < L; k += t.ntx) {
                          int64_t e = base + k * inner;
                          sbk_st(dx, e, sbk_ld(y, e) * (sbk_ld(dy, e) - dot));
                        }
                      }
                    });
}

dt_status softmax_bwd(dt_device *d, dt_dtype t, int64_t outer, int64_t L, int64_t inner,
                      const void *y, const void *dy, void *dx) {
  if (outer < 0 || L < 0 || inner < 0)
    return dt_error(d->ctx, DT_ERR_INVALID, "kern.softmax_bwd", "negative size");
  if (outer * L * inner == 0) return DT_OK;
  SBK_UNTAG(d, "kern.softmax_bwd", y, dy, dx);
  SBK_FLOAT_DISPATCH(d, "kern.softmax_bwd", t, softmax_bwd_t, d, outer, L, inner, y, dy, dx);
}

/* ---- permute (strided gather) ------------------------------------------------ */

/* A permute that moves the innermost dim (y's last dim has x-stride != 1 while
 * an outer dim p of y has x-stride 1) is a batch of 2-D transposes: tiles of
 * TILE x TILE elements through shared memory, read with consecutive threads on
 * x's contiguous dim p and written with consecutive threads on y's last dim,
 * so both sides are coalesced (the tiled transpose of NVIDIA's "An Efficient
 * Matrix Transpose in CUDA C/C++", M. Harris 2013; the row is padded to
 * TILE + 1 against shared-memory bank conflicts). TILE_ROWS rows of threads
 * walk a tile's rows. */
enum { TILE = 32, TILE_ROWS = 8, TILE_MIN = 8 };

template <class E>
dt_status permute_tiled(dt_device *d, const pw_dims &D, int p, int64_t numel, const E *x, E *y) {
  const int nd = D.nd;
  const int64_t A = D.n[p], W = D.n[nd - 1], sw = D.s[0][nd - 1];
  int64_t ys[DT_MAX_DIMS], acc = 1;
  for (int k = nd - 1; k >= 0; k--) ys[k] = acc, acc *= D.n[k];
  const int64_t ysp = ys[p];
  /* the other dims: slabs, with x's strides (s[0]) and y's (s[1]) */
  pw_dims O;
  O.nd = 0;
  for (int k = 0; k < nd - 1; k++)
    if (k != p) {
      O.n[O.nd] = D.n[k];
      O.s[0][O.nd] = D.s[0][k];
      O.s[1][O.nd] = ys[k];
      O.nd++;
    }
  if (O.nd == 0) O.nd = 1, O.n[0] = 1, O.s[0][0] = O.s[1][0] = 0;
  const int64_t ta = (A + TILE - 1) / TILE, tc = (W + TILE - 1) / TILE;
  const int64_t tiles = numel / (A * W) * ta * tc;
  return sbk_launch(d, "kern.permute_tiled", sbk_grid(tiles, 1), TILE * TILE_ROWS,
                    TILE * (TILE + 1) * sizeof(E), SBK_SYNC, SBK_LAMBDA(const sbk_thr &t) {
                      E *tile = (E *)t.smem;
                      const int lx = t.tx % TILE, ly = t.tx / TILE;
                      for (int64_t b = t.bx; b < tiles; b += t.nbx) {
                        const int64_t ci = b % tc, ai = (b / tc) % ta, sl = b / tc / ta;
                        int64_t ox = 0, oy = 0;
                        pw_offsets(O, O.nd, sl, ox, oy);
                        const int64_t a0 = ai * TILE, c0 = ci * TILE;
                        for (int r = ly; r < TILE; r += TILE_ROWS) /* tile[c][a] */
                          if (a0 + lx < A && c0 + r < W)
                            tile[r * (TILE + 1) + lx] = x[ox + a0 + lx + (c0 + r) * sw];
                        t.sync();
                        for (int r = ly; r < TILE; r += TILE_ROWS)
                          if (a0 + r < A && c0 + lx < W)
                            y[oy + (a0 + r) * ysp + c0 + lx] = tile[lx * (TILE + 1) + r];
                        t.sync(); /* the tile is refilled for the next b */
                      }
                    });
}

template <class E>
dt_status permute_t(dt_device *d, const pw_dims &D, int64_t numel, int64_t off, const void *xv,
                    void *yv) {
  const E *x = (const E *)xv + off;
  E *y = (E *)yv;
  const int nd = D.nd;
  const int64_t W = D.n[nd - 1], sw = D.s[0][nd - 1];
  if (nd >= 2 && sw != 1 && W >= TILE_MIN)
    for (int p = nd - 2; p >= 0; p--)
      if (D.s[0][p] == 1 && D.n[p] >= TILE_MIN) return permute_tiled<E>(d, D, p, numel, x, y);
  if (nd == 1)
    return sbk_launch(d, "kern.permute", sbk_grid(numel, PW_BLOCK), PW_BLOCK, 0, 0,
                      SBK_LAMBDA(const sbk_thr &t) {
                        SBK_FOR(i, numel, t) y[i] = x[i * sw];
                      });
  if (W >= PW_MIN_ROW) {
    const int64_t rows = numel / W;
    return sbk_launch(d, "kern.permute", sbk_grid(rows, 1), row_block(W), 0, 0,
                      SBK_LAMBDA(const sbk_thr &t) {
                        for (int64_t r = t.bx; r < rows; r += t.nbx) {
                          int64_t o = 0, unused = 0;
                          pw_offsets(D, nd - 1, r, o, unused);
                          E *yr = y + r * W;
                          for (int64_t c = t.tx; c < W; c += t.ntx) yr[c] = x[o + c * sw];
                        }
                      });
  }
  return sbk_launch(d, "kern.permute", sbk_grid(numel, PW_BLOCK), PW_BLOCK, 0, 0,
                    SBK_LAMBDA(const sbk_thr &t) {
                      SBK_FOR(i, numel, t) {
                        int64_t o = 0, unused = 0;
                        pw_offsets(D, nd, i, o, unused);
                        y[i] = x[o];
                      }
                    });
}

dt_status permute(dt_device *d, size_t es, int nd, const int64_t *shape, const int64_t *st,
                  int64_t off, const void *x, void *y) {
  const char *call = "kern.permute";
  const int64_t *sts[1] = {st};
  pw_dims D;
  if (!pw_merge(nd, shape, 1, sts, &D))
    return dt_error(d->ctx, DT_ERR_INVALID, call, "bad shape (%d dims)", nd);
  int64_t n = 1;
  for (int k = 0; k < D.nd; k++) n *= D.n[k];
  if (n == 0) return DT_OK;
  SBK_UNTAG(d, call, x, y);
  switch (es) {
    case 1: return permute_t<uint8_t>(d, D, n, off, x, y);
    case 2: return permute_t<uint16_t>(d, D, n, off, x, y);
    case 4: return permute_t<uint32_t>(d, D, n, off, x, y);
    case 8: return permute_t<uint64_t>(d, D, n, off, x, y);
    default: return dt_error(d->ctx, DT_ERR_UNSUPPORTED, call, "element size %zu", es);
  }
}

} // namespace

extern "C" const dt_kern_pw SBK(pw) = {
    silu, cast, scale, binary, swiglu_bwd, reduce, softmax, softmax_bwd, permute, sum_dims,
    contract,
};
