/* lib/device/kern/k_rows.cu: row-wise kernels (the dt_kern_rows group of
 * lib/device/kernels.h), built for CUDA and for the host emulator (sbk.cuh).
 *
 * Row kernels run one block of ROW_BLOCK threads per row (grid-stride over the
 * rows); the threads walk the row with a stride of the block, so consecutive
 * threads touch consecutive elements, and reduce through shared memory
 * (sbk_block_reduce). Arithmetic is in sbk_acc (f32 for f32 and bf16, f64 for
 * f64); cross-entropy sums its exponentials in f64, the type of its
 * statistics.
 *
 * Formulas: RMSNorm as torch.nn.functional.rms_norm (Zhang & Sennrich 2019,
 * "Root Mean Square Layer Normalization", eq. 4) and its gradient; RoPE as
 * TorchTitan's torchtitan/models/llama3/model/model.py precompute_freqs_cis /
 * apply_rotary_emb (complex pairs of adjacent elements) with Meta's Llama 3.1
 * apply_scaling; cross-entropy as a log-sum-exp with the max subtracted, split
 * into max / sum-exp / target logit so that vocab shards can all_reduce each
 * (PyTorch's torch/distributed/tensor/parallel/loss.py, _log_softmax and
 * _nll_loss_forward under loss_parallel).
 */
#include "device/kern/sbk.cuh"

namespace {

enum { ROW_BLOCK = 256 };

/* Smem for a block reduction of ROW_BLOCK elements of the widest type used. */
static const size_t RED_SMEM = ROW_BLOCK * sizeof(double);

/* ---- RMSNorm -------------------------------------------------------------------- */

/* sum over the block's share of row xr of x^2, then over the block */
template <class T, class A>
static SBK_DEV inline A row_sumsq(const sbk_thr &t, const T *xr, int64_t dim, A *buf) {
  A ss = 0;
  for (int64_t k = t.tx; k < dim; k += t.ntx) {
    A v = sbk_ld(xr, k);
    ss += v * v;
  }
  return sbk_block_reduce<A>(t, ss, buf, 0);
}

template <class T>
dt_status rms_fwd_t(dt_device *d, int64_t rows, int64_t dim, double eps, const void *xv,
                    const void *wv, void *yv) {
  const T *x = (const T *)xv, *w = (const T *)wv;
  T *y = (T *)yv;
  typedef typename sbk_acc<T>::type A;
  const A e = (A)eps, inv_dim = (A)1 / (A)dim;
  return sbk_launch(d, "kern.rms_fwd", sbk_grid(rows, 1), ROW_BLOCK, RED_SMEM, SBK_SYNC,
                    SBK_LAMBDA(const sbk_thr &t) {
                      A *buf = (A *)t.smem;
                      for (int64_t r = t.bx; r < rows; r += t.nbx) {
                        const T *xr = x + r * dim;
                        A inv = (A)1 / sbk_sqrt(row_sumsq<T, A>(t, xr, dim, buf) * inv_dim + e);
                        for (int64_t k = t.tx; k < dim; k += t.ntx)
                          sbk_st(y + r * dim, k, sbk_ld(xr, k) * inv * sbk_ld(w, k));
                      }
                    });
}

dt_status rms_fwd(dt_device *d, dt_dtype t, int64_t rows, int64_t dim, double eps, const void *x,
                  const void *w, void *y) {
  if (rows == 0 || dim == 0) return DT_OK;
  SBK_UNTAG(d, "kern.rms_fwd", x, w, y);
  SBK_FLOAT_DISPATCH(d, "kern.rms_fwd", t, rms_fwd_t, d, rows, dim, eps, x, w, y);
}

/* dx and gxh per row (and r into rs when dw is wanted); then, for dw, column
 * sums per chunk of rows into part[chunk][dim], then those summed over the
 * chunks in order: no atomics, so the same dw on every run. */
template <class T>
dt_status rms_bwd_t(dt_device *d, int64_t rows, int64_t dim, double eps, const void *xv,
                    const void *wv, const void *dyv, void *dxv, void *gxhv, void *dwv, void *wsv) {
  const T *x = (const T *)xv, *w = (const T *)wv, *dy = (const T *)dyv;
  T *dx = (T *)dxv, *gxh = (T *)gxhv, *dw = (T *)dwv;
  typedef typename sbk_acc<T>::type A;
  A *rs = (A *)wsv; /* per-row r, then the chunks' partial sums */
  const A e = (A)eps, inv_dim = (A)1 / (A)dim;
  dt_status s = sbk_launch(
      d, "kern.rms_bwd", sbk_grid(rows, 1), ROW_BLOCK, RED_SMEM, SBK_SYNC,
      SBK_LAMBDA(const sbk_thr &t) {
        A *buf = (A *)t.smem;
        for (int64_t r = t.bx; r < rows; r += t.nbx) {
          const int64_t b = r * dim;
          A inv = (A)1 / sbk_sqrt(row_sumsq<T, A>(t, x + b, dim, buf) * inv_dim + e), dot = 0;
          for (int64_t k = t.tx; k < dim; k += t.ntx) {
            A xh = sbk_ld(x, b + k) * inv, g = sbk_ld(dy, b + k);
            dot += sbk_ld(w, k) * g * xh;
            if (gxh) sbk_st(gxh, b + k, g * xh);
          }
          dot = sbk_block_reduce<A>(t, dot, buf, 0) * inv_dim;
          for (int64_t k = t.tx; k < dim; k += t.ntx) {
            A xh = sbk_ld(x, b + k) * inv;
            sbk_st(dx, b + k, (sbk_ld(w, k) * sbk_ld(dy, b + k) - xh * dot) * inv);
          }
          if (rs && t.tx == 0) rs[r] = inv;
        }
      });
  if (s != DT_OK || !dw) return s;
  const int64_t chunks = dt_kern_rms_chunks(rows), tiles = (dim + ROW_BLOCK - 1) / ROW_BLOCK;
  A *part = rs + rows;
  s = sbk_launch(d, "kern.rms_dw", tiles * chunks, ROW_BLOCK, 0, 0,
                 SBK_LAMBDA(const sbk_thr &t) {
                   const int64_t c = t.bx / tiles, k = (t.bx % tiles) * t.ntx + t.tx;
                   if (k >= dim) return;
                   const int64_t r0 = rows * c / chunks, r1 = rows * (c + 1) / chunks;
                   A acc = 0;
                   for (int64_t r = r0; r < r1; r++)
                     acc += sbk_ld(dy, r * dim + k) * (sbk_ld(x, r * dim + k) * rs[r]);
                   part[c * dim + k] = acc;
                 });
  if (s != DT_OK) return s;
  return sbk_launch(d, "kern.rms_dw_sum", sbk_grid(dim, ROW_BLOCK), ROW_BLOCK, 0, 0,
                    SBK_LAMBDA(const sbk_thr &t) {
                      SBK_FOR(k, dim, t) {
                        A acc = 0;
                        for (int64_t c = 0; c < chunks; c++) acc += part[c * dim + k];
                        sbk_st(dw, k, acc);
                      }
                    });
}

dt_status rms_bwd(dt_device *d, dt_dtype t, int64_t rows, int64_t dim, double eps, const void *x,
                  const void *w, const void *dy, void *dx, void *gxh, void *dw, void *ws) {
  if (dim == 0) return DT_OK;
  if (dw && !ws)
    return dt_error(d->ctx, DT_ERR_INVALID, "kern.rms_bwd", "dw needs the scratch ws");
  if (rows == 0 && !dw) return DT_OK; /* with dw: the sum over no rows, 0, is still written */
  SBK_UNTAG(d, "kern.rms_bwd", x, w, dy, dx, gxh, dw, ws);
  if (!dw) ws = NULL; /* no per-row r to keep */
  SBK_FLOAT_DISPATCH(d, "kern.rms_bwd", t, rms_bwd_t, d, rows, dim, eps, x, w, dy, dx, gxh, dw,
                     ws);
}

/* ---- RoPE ------------------------------------------------------------------------ */

/* Meta's Llama 3.1 apply_scaling constants (scale 8, low_freq_factor 1,
 * high_freq_factor 4, original context 8192): published values. */
static SBK_DEV inline double rope_freq(double theta, int scaling, int64_t i, int64_t hd) {
  double f = pow(theta, -(double)(2 * i) / (double)hd);
  if (scaling != 1) return f;
  const double scale = 8.0, low = 1.0, high = 4.0, ctx = 8192.0;
  const double two_pi = 6.283185307179586476925286766559;
  double wavelen = two_pi / f;
  if (wavelen < ctx / high) return f;
  if (wavelen > ctx / low) return f / scale;
  double smooth = (ctx / wavelen - low) / (high - low);
  return (1.0 - smooth) * f / scale + smooth * f;
}

/* The ops' dt_seq_position (lib/ops/attention_cp.c), for the device: stored
 * index i of S in n_chunks head-tail chunks -> position. */
static SBK_DEV inline int64_t seq_position(int64_t i, int64_t S, int n_chunks) {
  if (n_chunks <= 1) return i;
  int64_t len = S / n_chunks, k = i / len, off = i - k * len;
  int64_t pc = k % 2 == 0 ? k / 2 : n_chunks - 1 - k / 2;
  return pc * len + off;
}

/* One block per (b, s) row of h * hd elements. With hd / 2 <= block, thread tx
 * owns pair i = tx % (hd / 2) of heads tx / (hd / 2), + block / (hd / 2), ...:
 * its frequency is computed once, its angle once per row; otherwise each
 * thread walks pairs with a stride of the block. */
template <class T>
dt_status rope_t(dt_device *d, dt_kern_rope_args a, const void *xv, void *yv) {
  const T *x = (const T *)xv;
  T *y = (T *)yv;
  typedef typename sbk_acc<T>::type A;
  const int64_t np = a.hd / 2, nrows = a.b * a.s, rowlen = a.h * a.hd;
  int block = ROW_BLOCK;
  if (np < ROW_BLOCK) {
    int64_t heads = ROW_BLOCK / np;
    if (heads > a.h) heads = a.h;
    block = (int)(np * heads);
  }
  return sbk_launch(d, "kern.rope", sbk_grid(nrows, 1), block, 0, 0,
                    SBK_LAMBDA(const sbk_thr &t) {
                      const bool own = np <= t.ntx;
                      const int64_t i0 = own ? t.tx % np : t.tx;
                      const int64_t h0 = own ? t.tx / np : 0, hstep = own ? t.ntx / np : 1;
                      const double f0 = own ? rope_freq(a.theta, a.scaling, i0, a.hd) : 0;
                      for (int64_t row = t.bx; row < nrows; row += t.nbx) {
                        const int64_t st = row % a.s;
                        const double pos =
                            (double)seq_position(a.pos0 + st, a.gs, a.n_chunks) * a.sign;
                        const T *xr = x + row * rowlen;
                        T *yr = y + row * rowlen;
                        for (int64_t i = i0; i < np; i += own ? np : t.ntx) {
                          double ang = pos * (own ? f0 : rope_freq(a.theta, a.scaling, i, a.hd));
                          A c = (A)cos(ang), sn = (A)sin(ang);
                          for (int64_t h = h0; h < a.h; h += hstep) {
                            int64_t e = h * a.hd + 2 * i;
                            A x0 = sbk_ld(xr, e), x1 = sbk_ld(xr, e + 1);
                            sbk_st(yr, e, x0 * c - x1 * sn);
                            sbk_st(yr, e + 1, x0 * sn + x1 * c);
                          }
                        }
                      }
                    });
}

dt_status rope(dt_device *d, dt_dtype t, const dt_kern_rope_args *a, const void *x, void *y) {
  if (a->b * a->s * a->h * a->hd == 0) return DT_OK;
  if (a->hd % 2 || !(a->theta > 0) || (a->n_chunks > 1 && (a->n_chunks % 2 || a->gs % a->n_chunks)))
    return dt_error(d->ctx, DT_ERR_INVALID, "kern.rope", "hd %lld, theta %g, n_chunks %d",
                    (long long)a->hd, a->theta, a->n_chunks);
  SBK_UNTAG(d, "kern.rope", x, y);
  SBK_FLOAT_DISPATCH(d, "kern.rope", t, rope_t, d, *a, x, y);
}

/* ---- embedding ---------------------------------------------------------------------- */

template <class T>
dt_status emb_t(dt_device *d, int64_t n, const int64_t *ids, int64_t rows, int64_t cols,
                int64_t off, const void *wv, void *yv) {
  const T *w = (const T *)wv;
  T *y = (T *)yv;
  return sbk_launch(d, "kern.embedding", sbk_grid(n, 1), ROW_BLOCK, 0, 0,
                    SBK_LAMBDA(const sbk_thr &t) {
                      for (int64_t i = t.bx; i < n; i += t.nbx) {
                        const int64_t row = ids[i] - off;
                        T *yr = y + i * cols;
                        if (row >= 0 && row < rows) {
                          const T *wr = w + row * cols;
                          for (int64_t c = t.tx; c < cols; c += t.ntx) yr[c] = wr[c];
                        } else {
                          for (int64_t c = t.tx; c < cols; c += t.ntx) sbk_st(yr, c, 0.0f);
                        }
                      }
                    });
}

dt_status embedding(dt_device *d, dt_dtype t, int64_t n, const int64_t *ids, int64_t rows,
                    int64_t cols, int64_t off, const void *w, void *y) {
  if (n == 0 || cols == 0) return DT_OK;
  SBK_UNTAG(d, "kern.embedding", ids, w, y);
  SBK_FLOAT_DISPATCH(d, "kern.embedding", t, emb_t, d, n, ids, rows, cols, off, w, y);
}

template <class G, class W>
dt_status embb_t(dt_device *d, int64_t n, const int64_t *ids, const void *gv, int64_t rows,
                 int64_t cols, int64_t off, void *gwv) {
  const G *g = (const G *)gv;
  W *gw = (W *)gwv;
  const int64_t total = rows * cols;
  dt_status s = sbk_launch(d, "kern.embedding_bwd_zero", sbk_grid(total, ROW_BLOCK), ROW_BLOCK,
                           0, 0, SBK_LAMBDA(const sbk_thr &t) {
                             SBK_FOR(i, total, t) gw[i] = 0;
                           });
  if (s != DT_OK || n == 0) return s;
  return sbk_launch(d, "kern.embedding_bwd", sbk_grid(n, 1), ROW_BLOCK, 0, 0,
                    SBK_LAMBDA(const sbk_thr &t) {
                      for (int64_t i = t.bx; i < n; i += t.nbx) {
                        const int64_t row = ids[i] - off;
                        if (row < 0 || row >= rows) continue;
                        for (int64_t c = t.tx; c < cols; c += t.ntx)
                          sbk_atomic_add(gw + row * cols + c, (W)sbk_ld(g, i * cols + c));
                      }
                    });
}

template <class G>
dt_status embb_to(dt_device *d, int64_t n, const int64_t *ids, const void *g, int64_t rows,
                  int64_t cols, int64_t off, dt_dtype tw, void *gw) {
  switch (tw) {
    case DT_F32: return embb_t<G, float>(d, n, ids, g, rows, cols, off, gw);
    case DT_F64: return embb_t<G, double>(d, n, ids, g, rows, cols, off, gw);
    default:
      return dt_error(d->ctx, DT_ERR_UNSUPPORTED, "kern.embedding_bwd",
                      "gradient dtype %s (f32 or f64: the sums are atomic adds)", dt_dtype_name(tw));
  }
}

dt_status embedding_bwd(dt_device *d, dt_dtype tg, int64_t n, const int64_t *ids, const void *g,
                        int64_t rows, int64_t cols, int64_t off, dt_dtype tw, void *gw) {
  if (rows == 0 || cols == 0) return DT_OK;
  SBK_UNTAG(d, "kern.embedding_bwd", ids, g, gw);
  SBK_FLOAT_DISPATCH(d, "kern.embedding_bwd", tg, embb_to, d, n, ids, g, rows, cols, off, tw, gw);
}

/* ---- cross-entropy ----------------------------------------------------------------- */

/* max over the block's row xr (-inf for an empty row) */
template <class T, class A>
static SBK_DEV inline A row_max(const sbk_thr &t, const T *xr, int64_t V, A *buf) {
  A m = -(A)INFINITY;
  for (int64_t v = t.tx; v < V; v += t.ntx) {
    A e = sbk_ld(xr, v);
    m = e > m ? e : m;
  }
  return sbk_block_reduce<A>(t, m, buf, 1);
}

template <class T>
dt_status ce_max_t(dt_device *d, int64_t npos, int64_t V, const void *xv, double *mx) {
  const T *x = (const T *)xv;
  typedef typename sbk_acc<T>::type A;
  return sbk_launch(d, "kern.ce_max", sbk_grid(npos, 1), ROW_BLOCK, RED_SMEM, SBK_SYNC,
                    SBK_LAMBDA(const sbk_thr &t) {
                      for (int64_t p = t.bx; p < npos; p += t.nbx) {
                        A m = row_max<T, A>(t, x + p * V, V, (A *)t.smem);
                        if (t.tx == 0) mx[p] = (double)m;
                      }
                    });
}

dt_status ce_max(dt_device *d, dt_dtype t, int64_t npos, int64_t V, const void *x, double *mx) {
  if (npos == 0) return DT_OK;
  SBK_UNTAG(d, "kern.ce_max", x, mx);
  SBK_FLOAT_DISPATCH(d, "kern.ce_max", t, ce_max_t, d, npos, V, x, mx);
}

template <class T>
dt_status ce_sumexp_t(dt_device *d, int64_t npos, int64_t V, int64_t voff, const void *xv,
                      const int64_t *tg, bool find_max, double *mx, double *se, double *tl) {
  const T *x = (const T *)xv;
  typedef typename sbk_acc<T>::type A;
  return sbk_launch(d, "kern.ce_sumexp", sbk_grid(npos, 1), ROW_BLOCK, RED_SMEM, SBK_SYNC,
                    SBK_LAMBDA(const sbk_thr &t) {
                      for (int64_t p = t.bx; p < npos; p += t.nbx) {
                        const T *xr = x + p * V;
                        A m;
                        if (find_max) {
                          m = row_max<T, A>(t, xr, V, (A *)t.smem);
                          if (t.tx == 0) mx[p] = (double)m;
                        } else {
                          m = (A)mx[p]; /* a max of stored values: exact in A */
                        }
                        double s = 0;
                        for (int64_t v = t.tx; v < V; v += t.ntx) s += (double)sbk_exp(sbk_ld(xr, v) - m);
                        s = sbk_block_reduce<double>(t, s, (double *)t.smem, 0);
                        if (t.tx == 0) {
                          se[p] = s;
                          const int64_t v = tg[p] - voff;
                          tl[p] = v >= 0 && v < V ? (double)sbk_ld(xr, v) : 0.0;
                        }
                      }
                    });
}

dt_status ce_sumexp(dt_device *d, dt_dtype t, int64_t npos, int64_t V, int64_t voff, const void *x,
                    const int64_t *tg, bool find_max, double *mx, double *se, double *tl) {
  if (npos == 0) return DT_OK;
  SBK_UNTAG(d, "kern.ce_sumexp", x, tg, mx, se, tl);
  SBK_FLOAT_DISPATCH(d, "kern.ce_sumexp", t, ce_sumexp_t, d, npos, V, voff, x, tg, find_max, mx,
                     se, tl);
}

template <class T>
dt_status ce_loss_t(dt_device *d, int64_t npos, double n_total, const double *mx, const double *se,
                    const double *tl, double *lse, void *lossv) {
  T *loss = (T *)lossv;
  return sbk_launch(d, "kern.ce_loss", 1, ROW_BLOCK, RED_SMEM, SBK_SYNC,
                    SBK_LAMBDA(const sbk_thr &t) {
                      double s = 0;
                      for (int64_t p = t.tx; p < npos; p += t.ntx) {
                        double l = log(se[p]) + mx[p];
                        lse[p] = l;
                        s += l - tl[p];
                      }
                      s = sbk_block_reduce<double>(t, s, (double *)t.smem, 0);
                      if (t.tx == 0) sbk_st(loss, 0, (typename sbk_acc<T>::type)(s / n_total));
                    });
}

dt_status ce_loss(dt_device *d, dt_dtype t, int64_t npos, double n_total, const double *mx,
                  const double *se, const double *tl, double *lse, void *loss) {
  SBK_UNTAG(d, "kern.ce_loss", mx, se, tl, lse, loss);
  SBK_FLOAT_DISPATCH(d, "kern.ce_loss", t, ce_loss_t, d, npos, n_total, mx, se, tl, lse, loss);
}

/* exp(x - lse) with the difference in f64 (lse is f64) and the exp in A */
template <class T>
dt_status ce_bwd_t(dt_device *d, int64_t npos, int64_t V, int64_t voff, const void *xv,
                   const int64_t *tg, const double *lse, const void *gradv, double n_total,
                   void *dxv) {
  const T *x = (const T *)xv, *grad = (const T *)gradv;
  T *dx = (T *)dxv;
  typedef typename sbk_acc<T>::type A;
  return sbk_launch(d, "kern.ce_bwd", sbk_grid(npos, 1), ROW_BLOCK, 0, 0,
                    SBK_LAMBDA(const sbk_thr &t) {
                      const A g = (A)((double)sbk_ld(grad, 0) / n_total);
                      for (int64_t p = t.bx; p < npos; p += t.nbx) {
                        const int64_t tv = tg[p] - voff;
                        const double l = lse[p];
                        for (int64_t v = t.tx; v < V; v += t.ntx) {
                          A e = sbk_exp((A)((double)sbk_ld(x, p * V + v) - l));
                          sbk_st(dx, p * V + v, (e - (v == tv ? (A)1 : (A)0)) * g);
                        }
                      }
                    });
}

dt_status ce_bwd(dt_device *d, dt_dtype t, int64_t npos, int64_t V, int64_t voff, const void *x,
                 const int64_t *tg, const double *lse, const void *grad, double n_total, void *dx) {
  if (npos == 0 || V == 0) return DT_OK;
  SBK_UNTAG(d, "kern.ce_bwd", x, tg, lse, grad, dx);
  SBK_FLOAT_DISPATCH(d, "kern.ce_bwd", t, ce_bwd_t, d, npos, V, voff, x, tg, lse, grad, n_total,
                     dx);
}

} // namespace

extern "C" const dt_kern_rows SBK(rows) = {
    rms_fwd, rms_bwd, rope, embedding, embedding_bwd, ce_max, ce_sumexp, ce_loss, ce_bwd,
    NULL, /* check_ids: it would read the ids back to the host */
};
