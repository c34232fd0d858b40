/* lib/device/kern/k_attn.cu: attention's row kernels (the dt_kern_attn group of
 * lib/device/kernels.h), built for CUDA and for the host emulator (sbk.cuh).
 *
 * The ops (lib/ops/attention.c, attention_cp.c) compute attention a block of
 * query rows at a time, the GEMMs through dt_device_gemm, so only a block's
 * scores exist at once (Rabe & Staats 2021, sec. 2-3); these kernels are the
 * row work between the GEMMs: the masked softmax and its backward, and the
 * online softmax with the log-sum-exp of FlashAttention-2 (Dao 2023, Alg. 1
 * and 2) for the context-parallel blocks. One thread block per score row (a
 * grid-stride loop over rows), its threads on consecutive keys, reductions
 * through shared memory; arithmetic in sbk_acc (f32 for f32 and bf16). */
#include "device/kern/sbk.cuh"

namespace {

/* Threads per row (powers of two: sbk_block_reduce). On the host emulator,
 * where every thread of a syncing block is a fiber, a row takes 32: the same
 * code with fewer switches (rows of 300 and more keys still run several
 * strided rounds per thread there). SBK_EMU_CUDA_BLOCKS builds the emulator's
 * copy at CUDA's block sizes instead (k_attn_emu256.cc, for the tests). */
#if defined(SB_KERN_EMU) && !defined(SBK_EMU_CUDA_BLOCKS)
enum { ROW_BLOCK = 32, HD_BLOCK = 32 };
#else
enum { ROW_BLOCK = 256, HD_BLOCK = 128 };
#endif

struct rows_geo {
  int64_t batch, rows, nk, vis0, ld, stride, sld, sstride;
};

rows_geo geo_of(const dt_attn_rows *g) {
  rows_geo r = {g->batch, g->rows, g->nk, g->vis0, g->ld, g->stride, g->sld, g->sstride};
  return r;
}

/* Keys row r sees. */
static SBK_DEV inline int64_t visible(const rows_geo &g, int64_t r) {
  int64_t c = g.vis0 + r;
  return c < 0 ? 0 : c < g.nk ? c : g.nk;
}

dt_status bad_geo(dt_device *d, const char *call, const dt_attn_rows *g) {
  if (!g) return dt_error(d->ctx, DT_ERR_INVALID, call, "NULL geometry");
  return dt_error(d->ctx, DT_ERR_INVALID, call,
                  "geometry batch %lld rows %lld nk %lld ld %lld stride %lld", (long long)g->batch,
                  (long long)g->rows, (long long)g->nk, (long long)g->ld, (long long)g->stride);
}

bool geo_ok(const dt_attn_rows *g) {
  return g->batch >= 0 && g->rows >= 0 && g->nk >= 0 && g->ld >= g->nk &&
         (g->batch <= 1 || g->stride >= g->rows * g->ld);
}

/* ---- softmax ---------------------------------------------------------------- */

template <class T> dt_status softmax_t(dt_device *d, const dt_attn_rows *gp, void *Pv) {
  typedef typename sbk_acc<T>::type A;
  T *P = (T *)Pv;
  const rows_geo g = geo_of(gp);
  const int64_t n = g.batch * g.rows;
  return sbk_launch(d, "kern.attn_softmax", sbk_grid(n, 1), ROW_BLOCK, ROW_BLOCK * sizeof(A), SBK_SYNC,
                    SBK_LAMBDA(const sbk_thr &t) {
                      A *buf = (A *)t.smem;
                      for (int64_t row = t.bx; row < n; row += t.nbx) {
                        int64_t b = row / g.rows, r = row - b * g.rows, cnt = visible(g, r);
                        T *p = P + b * g.stride + r * g.ld;
                        A mx = -INFINITY, z = 0;
                        for (int64_t j = t.tx; j < cnt; j += t.ntx) {
                          A v = sbk_ld(p, j);
                          mx = v > mx ? v : mx;
                        }
                        mx = sbk_block_reduce(t, mx, buf, 1);
                        for (int64_t j = t.tx; j < cnt; j += t.ntx) {
                          A e = sbk_exp(sbk_ld(p, j) - mx);
                          sbk_st(p, j, e);
                          z += e;
                        }
                        z = sbk_block_reduce(t, z, buf, 0);
                        A inv = cnt > 0 ? (A)1 / z : (A)0;
                        for (int64_t j = t.tx; j < cnt; j += t.ntx) sbk_st(p, j, sbk_ld(p, j) * inv);
                        for (int64_t j = cnt + t.tx; j < g.nk; j += t.ntx) sbk_st(p, j, (A)0);
                      }
                    });
}

dt_status softmax(dt_device *d, dt_dtype t, const dt_attn_rows *g, void *P) {
  static const char c[] = "kern.attn_softmax";
  if (!g || !geo_ok(g)) return bad_geo(d, c, g);
  if (g->batch * g->rows == 0) return DT_OK;
  SBK_UNTAG(d, c, P);
  SBK_FLOAT_DISPATCH(d, c, t, softmax_t, d, g, P);
}

/* ---- softmax backward: dS = P (dP - rowsum(dP P)) ---------------------------- */

template <class T>
dt_status softmax_bwd_t(dt_device *d, const dt_attn_rows *gp, const void *Pv, void *dPv) {
  typedef typename sbk_acc<T>::type A;
  const T *P = (const T *)Pv;
  T *dP = (T *)dPv;
  const rows_geo g = geo_of(gp);
  const int64_t n = g.batch * g.rows;
  return sbk_launch(d, "kern.attn_softmax_bwd", sbk_grid(n, 1), ROW_BLOCK, ROW_BLOCK * sizeof(A),
                    SBK_SYNC, SBK_LAMBDA(const sbk_thr &t) {
                      A *buf = (A *)t.smem;
                      for (int64_t row = t.bx; row < n; row += t.nbx) {
                        int64_t b = row / g.rows, r = row - b * g.rows, cnt = visible(g, r);
                        const T *p = P + b * g.stride + r * g.ld;
                        T *dp = dP + b * g.stride + r * g.ld;
                        A rs = 0;
                        for (int64_t j = t.tx; j < cnt; j += t.ntx) rs += sbk_ld(dp, j) * sbk_ld(p, j);
                        rs = sbk_block_reduce(t, rs, buf, 0);
                        for (int64_t j = t.tx; j < cnt; j += t.ntx)
                          sbk_st(dp, j, sbk_ld(p, j) * (sbk_ld(dp, j) - rs));
                        for (int64_t j = cnt + t.tx; j < g.nk; j += t.ntx) sbk_st(dp, j, (A)0);
                      }
                    });
}

dt_status softmax_bwd(dt_device *d, dt_dtype t, const dt_attn_rows *g, const void *P, void *dP) {
  static const char c[] = "kern.attn_softmax_bwd";
  if (!g || !geo_ok(g)) return bad_geo(d, c, g);
  if (g->batch * g->rows == 0) return DT_OK;
  SBK_UNTAG(d, c, P, dP);
  SBK_FLOAT_DISPATCH(d, c, t, softmax_bwd_t, d, g, P, dP);
}

/* ---- online softmax step ----------------------------------------------------- */

template <class T>
dt_status online_t(dt_device *d, const dt_attn_rows *gp, void *Pv, void *mv, void *lv, void *Ov,
                   int64_t old, int64_t ostride, int64_t hd) {
  typedef typename sbk_acc<T>::type A;
  T *P = (T *)Pv, *O = (T *)Ov;
  A *M = (A *)mv, *L = (A *)lv;
  const rows_geo g = geo_of(gp);
  const int64_t n = g.batch * g.rows;
  /* smem: the reduction buffer, then the row's rescale factor */
  return sbk_launch(d, "kern.attn_online", sbk_grid(n, 1), ROW_BLOCK, (ROW_BLOCK + 1) * sizeof(A),
                    SBK_SYNC, SBK_LAMBDA(const sbk_thr &t) {
                      A *buf = (A *)t.smem, *alpha = buf + ROW_BLOCK;
                      for (int64_t row = t.bx; row < n; row += t.nbx) {
                        int64_t b = row / g.rows, r = row - b * g.rows, cnt = visible(g, r);
                        int64_t si = b * g.sstride + r * g.sld;
                        T *p = P + b * g.stride + r * g.ld;
                        A mo = M[si], mx = mo, z = 0;
                        for (int64_t j = t.tx; j < cnt; j += t.ntx) {
                          A v = sbk_ld(p, j);
                          mx = v > mx ? v : mx;
                        }
                        mx = sbk_block_reduce(t, mx, buf, 1);
                        for (int64_t j = t.tx; j < cnt; j += t.ntx) {
                          A e = sbk_exp(sbk_ld(p, j) - mx);
                          sbk_st(p, j, e);
                          z += e;
                        }
                        for (int64_t j = cnt + t.tx; j < g.nk; j += t.ntx) sbk_st(p, j, (A)0);
                        z = sbk_block_reduce(t, z, buf, 0);
                        /* 0 on a row's first block (mo = -inf); 1 when the max stays */
                        A al = mo == mx ? (A)1 : sbk_exp(mo - mx);
                        if (t.tx == 0) {
                          L[si] = L[si] * al + z;
                          M[si] = mx;
                          *alpha = al;
                        }
                        t.sync();
                        T *o = O + b * ostride + r * old;
                        if (*alpha != (A)1)
                          for (int64_t c = t.tx; c < hd; c += t.ntx) sbk_st(o, c, sbk_ld(o, c) * *alpha);
                        t.sync(); /* alpha is rewritten by the next row */
                      }
                    });
}

dt_status online(dt_device *d, dt_dtype t, const dt_attn_rows *g, void *P, void *m, void *l,
                 void *O, int64_t old, int64_t ostride, int64_t hd) {
  static const char c[] = "kern.attn_online";
  if (!g || !geo_ok(g) || hd < 0) return bad_geo(d, c, g);
  if (g->batch * g->rows == 0) return DT_OK;
  SBK_UNTAG(d, c, P, m, l, O);
  SBK_FLOAT_DISPATCH(d, c, t, online_t, d, g, P, m, l, O, old, ostride, hd);
}

/* ---- finish: O /= l, lse = m + log l ------------------------------------------ */

template <class T>
dt_status finish_t(dt_device *d, int64_t n, int64_t hd, void *Ov, const void *mv, const void *lv,
                   void *lsev) {
  typedef typename sbk_acc<T>::type A;
  T *O = (T *)Ov, *lse = (T *)lsev;
  const A *M = (const A *)mv, *L = (const A *)lv;
  return sbk_launch(d, "kern.attn_finish", sbk_grid(n, 1), HD_BLOCK, 0, 0,
                    SBK_LAMBDA(const sbk_thr &t) {
                      for (int64_t row = t.bx; row < n; row += t.nbx) {
                        A l = L[row], inv = (A)1 / l;
                        T *o = O + row * hd;
                        for (int64_t c = t.tx; c < hd; c += t.ntx) sbk_st(o, c, sbk_ld(o, c) * inv);
                        if (t.tx == 0) sbk_st(lse, row, M[row] + sbk_log(l));
                      }
                    });
}

dt_status finish(dt_device *d, dt_dtype t, int64_t n, int64_t hd, void *O, const void *m,
                 const void *l, void *lse) {
  static const char c[] = "kern.attn_finish";
  if (n < 0 || hd < 0) return dt_error(d->ctx, DT_ERR_INVALID, c, "n %lld hd %lld", (long long)n, (long long)hd);
  if (n == 0) return DT_OK;
  SBK_UNTAG(d, c, O, m, l, lse);
  SBK_FLOAT_DISPATCH(d, c, t, finish_t, d, n, hd, O, m, l, lse);
}

/* ---- rowdot: D = rowsum(dO * O) --------------------------------------------- */

template <class T>
dt_status rowdot_t(dt_device *d, int64_t n, int64_t hd, const void *dOv, const void *Ov, void *Dv) {
  typedef typename sbk_acc<T>::type A;
  const T *dO = (const T *)dOv, *O = (const T *)Ov;
  A *D = (A *)Dv;
  return sbk_launch(d, "kern.attn_rowdot", sbk_grid(n, 1), HD_BLOCK, HD_BLOCK * sizeof(A), SBK_SYNC,
                    SBK_LAMBDA(const sbk_thr &t) {
                      A *buf = (A *)t.smem;
                      for (int64_t row = t.bx; row < n; row += t.nbx) {
                        A acc = 0;
                        for (int64_t c = t.tx; c < hd; c += t.ntx)
                          acc += sbk_ld(dO, row * hd + c) * sbk_ld(O, row * hd + c);
                        acc = sbk_block_reduce(t, acc, buf, 0);
                        if (t.tx == 0) D[row] = acc;
                      }
                    });
}

dt_status rowdot(dt_device *d, dt_dtype t, int64_t n, int64_t hd, const void *dO, const void *O,
                 void *D) {
  static const char c[] = "kern.attn_rowdot";
  if (n < 0 || hd < 0) return dt_error(d->ctx, DT_ERR_INVALID, c, "n %lld hd %lld", (long long)n, (long long)hd);
  if (n == 0) return DT_OK;
  SBK_UNTAG(d, c, dO, O, D);
  SBK_FLOAT_DISPATCH(d, c, t, rowdot_t, d, n, hd, dO, O, D);
}

/* ---- backward from lse: P = exp(S - lse), dS = P (dS - D) ---------------------- */

template <class T>
dt_status lse_bwd_t(dt_device *d, const dt_attn_rows *gp, void *Pv, void *dSv, const void *lsev,
                    const void *Dv) {
  typedef typename sbk_acc<T>::type A;
  T *P = (T *)Pv, *dS = (T *)dSv;
  const T *lse = (const T *)lsev;
  const A *D = (const A *)Dv;
  const rows_geo g = geo_of(gp);
  const int64_t n = g.batch * g.rows;
  return sbk_launch(d, "kern.attn_lse_bwd", sbk_grid(n, 1), ROW_BLOCK, 0, 0,
                    SBK_LAMBDA(const sbk_thr &t) {
                      for (int64_t row = t.bx; row < n; row += t.nbx) {
                        int64_t b = row / g.rows, r = row - b * g.rows, cnt = visible(g, r);
                        int64_t si = b * g.sstride + r * g.sld, off = b * g.stride + r * g.ld;
                        T *p = P + off, *ds = dS + off;
                        A ls = sbk_ld(lse, si), di = D[si];
                        for (int64_t j = t.tx; j < cnt; j += t.ntx) {
                          A e = sbk_exp(sbk_ld(p, j) - ls);
                          sbk_st(p, j, e);
                          sbk_st(ds, j, e * (sbk_ld(ds, j) - di));
                        }
                        for (int64_t j = cnt + t.tx; j < g.nk; j += t.ntx) {
                          sbk_st(p, j, (A)0);
                          sbk_st(ds, j, (A)0);
                        }
                      }
                    });
}

dt_status lse_bwd(dt_device *d, dt_dtype t, const dt_attn_rows *g, void *P, void *dS,
                  const void *lse, const void *D) {
  static const char c[] = "kern.attn_lse_bwd";
  if (!g || !geo_ok(g)) return bad_geo(d, c, g);
  if (g->batch * g->rows == 0) return DT_OK;
  SBK_UNTAG(d, c, P, dS, lse, D);
  SBK_FLOAT_DISPATCH(d, c, t, lse_bwd_t, d, g, P, dS, lse, D);
}

} // namespace

/* Blocking: 256 query rows per block (the causal blocks then do (S + 256) / S
 * of the minimal score work: 1.03 at S = 8192), fewer when sdpa's scores
 * scratch over all of a call's kv heads (one strided-batched GEMM covers them:
 * two GEMMs and one row kernel per forward block, five GEMMs and two row
 * kernels backward, whatever the head count) would pass 256 MiB; statistics
 * in the arithmetic type. */
#ifdef SBK_EMU_CUDA_BLOCKS
#define SBK_ATTN_TABLE dt_kemu_attn_cuda_blocks
#else
#define SBK_ATTN_TABLE SBK(attn)
#endif
extern "C" const dt_kern_attn SBK_ATTN_TABLE = {
    softmax, softmax_bwd, online, finish, rowdot, lse_bwd,
    256, (size_t)256 << 20, 0, false,
};
