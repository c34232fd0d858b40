/* lib/ops/reduce.c: reductions and softmax on DTensors (PyTorch's
 * torch/distributed/tensor/_ops/_math_ops.py: common_reduction_strategy,
 * softmax_strategy): sum and mean over attrs.dims[0..ndims) (ndims 0: every dim; negative
 * dims count from the end) with attrs.keepdim, and softmax over attrs.dim.
 *
 * Strategy (per mesh dim options, one option each, as PyTorch's
 * common_reduction_strategy generates one strategy from the input's one spec):
 *  - linear case: every input Partial has the op's reduce op (sum: P(sum);
 *    mean: P(avg)): Partials are kept, a Shard on a reduced dim becomes
 *    P(sum) / P(avg) in the output (no comm), other Shards are renumbered;
 *  - mean is linear on a reduced dim only where that dim is EVENLY sharded
 *    (every level of the nested chunking divides): the local mean of an uneven
 *    shard is not 1/n of the global mean, so PyTorch's P(avg) there is silently
 *    wrong. Such a dim goes to R first (every mesh dim sharding it);
 *  - otherwise the input's Partials and its Shards on reduced dims go to R.
 *  - softmax: a Shard on the softmax dim and any Partial go to R; the output
 *    follows the input's target.
 * Kernels: f32 and f64 host arrays, accumulated in double (host bf16 arrays
 * are refused by the kernels). Device arrays (f32, f64, bf16) run the device's
 * dt_kern_pw slots: a sum/mean is one reduce over the middle axis of an
 * [outer, red, inner] view per run of adjacent reduced dims (the last run
 * first; bf16 keeps its intermediates in f32), softmax and its backward one
 * block per row, sum_bwd's broadcast a strided gather (permute) and a scale.
 * Backward: sum and
 * mean through a private broadcast op (sum_bwd: dC redistributed to R, dx with
 * x's placements, Partial -> R: a Partial gradient of a broadcast is no cheaper
 * and the R gradient is correct for every x layout); softmax as
 * dx = y * (dy - sum(dy * y, dim, keepdim)) with dt_op_call on host arrays, one
 * private fused op (softmax_bwd, the same placements) on device arrays.
 *
 * What it is not: max/min/prod/var reductions, log_softmax, fused kernels.
 */
#include "config.h"

#include <math.h>
#include <string.h>

#include "ops/ops.h"
#include "ops/vmath.h"

/* ---- dims --------------------------------------------------------------------- */

/* mask[d]: dim d of an ndim tensor is reduced. */
static dt_status red_mask(dt_ctx *ctx, const char *name, const dt_op_attrs *a, int ndim, bool *mask) {
  for (int d = 0; d < DT_MAX_DIMS; d++) mask[d] = a->ndims == 0 && d < ndim;
  if (a->ndims < 0 || a->ndims > DT_MAX_DIMS)
    return dt_error(ctx, DT_ERR_INVALID, name, "ndims %d out of range", a->ndims);
  for (int k = 0; k < a->ndims; k++) {
    int d = a->dims[k] < 0 ? a->dims[k] + ndim : a->dims[k];
    if (d < 0 || d >= ndim)
      return dt_error(ctx, DT_ERR_INVALID, name, "dim %d out of range for a %d-d tensor",
                      a->dims[k], ndim);
    if (mask[d]) return dt_error(ctx, DT_ERR_INVALID, name, "dim %d listed twice", a->dims[k]);
    mask[d] = true;
  }
  return DT_OK;
}

static dt_status check_float(dt_ctx *ctx, const char *name, dt_dtype t) {
  if (t != DT_F32 && t != DT_F64 && t != DT_BF16)
    return dt_error(ctx, DT_ERR_UNSUPPORTED, name, "dtype %s; only f32, f64 and bf16 are supported",
                    dt_dtype_name(t));
  return DT_OK;
}

/* The host kernels compute f32 and f64 (dt_elem_ld / dt_elem_st). */
static dt_status check_host(dt_ctx *ctx, const char *name, const dt_array *x) {
  if (x->dtype != DT_F32 && x->dtype != DT_F64)
    return dt_error(ctx, DT_ERR_UNSUPPORTED, name, "dtype %s on host arrays (f32 and f64 only)",
                    dt_dtype_name(x->dtype));
  return DT_OK;
}

static dt_status dev_kernels(dt_ctx *ctx, const char *name, const dt_kernels **K) {
  DT_CHECK(dt_op_kernels(ctx, name, K));
  if (!(*K)->pw) return dt_error(ctx, DT_ERR_UNSUPPORTED, name, "the device has no pw kernels");
  return DT_OK;
}

static dt_status red_infer(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in, dt_spec *out) {
  bool mask[DT_MAX_DIMS];
  DT_CHECK(check_float(ctx, "sum/mean", in[0].dtype));
  DT_CHECK(red_mask(ctx, "sum/mean", a, in[0].ndim, mask));
  out->dtype = in[0].dtype;
  out->ndim = 0;
  for (int d = 0; d < in[0].ndim; d++) {
    if (mask[d] && !a->keepdim) continue;
    out->gshape[out->ndim++] = mask[d] ? 1 : in[0].gshape[d];
  }
  return DT_OK;
}

/* ---- strategies ----------------------------------------------------------------- */

static dt_status red_options(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in, int mesh_dim,
                             dt_dim_option *opt, int *n, int max, dt_reduce_op rop) {
  const dt_spec *x = &in[0];
  bool mask[DT_MAX_DIMS], uneven[DT_MAX_DIMS] = {false};
  DT_CHECK(red_mask(ctx, "sum/mean", a, x->ndim, mask));
  if (max < 2) return dt_error(ctx, DT_ERR_INTERNAL, "sum/mean", "no room for options");
  bool linear = true;
  for (int i = 0; i < x->mesh_ndim; i++)
    if (x->pl[i].kind == DT_PL_PARTIAL && x->pl[i].op != rop) linear = false;
  if (rop == DT_RED_AVG)
    for (int d = 0; d < x->ndim; d++) {
      if (!mask[d]) continue;
      int64_t L = x->gshape[d];
      for (int i = 0; i < x->mesh_ndim; i++) {
        if (x->pl[i].kind != DT_PL_SHARD || x->pl[i].dim != d) continue;
        int sz = x->mesh_shape[i];
        if (sz <= 0) return dt_error(ctx, DT_ERR_INTERNAL, "mean", "mesh sizes missing from the spec");
        if (L % sz) uneven[d] = true;
        L /= sz;
      }
    }
  dt_placement p = x->pl[mesh_dim], ip = dt_replicate(), op = dt_replicate();
  if (p.kind == DT_PL_SHARD) {
    if (!mask[p.dim]) {
      int nd = p.dim;
      if (!a->keepdim)
        for (int d = 0; d < p.dim; d++) nd -= mask[d];
      ip = p;
      op = dt_shard(nd);
    } else if (linear && !uneven[p.dim]) {
      ip = p;
      op = dt_partial(rop);
    }
  } else if (p.kind == DT_PL_PARTIAL && linear) {
    ip = op = p;
  }
  memset(opt, 0, 2 * sizeof *opt);
  opt[0].in[0] = ip;
  opt[0].out[0] = op;
  *n = 1;
  /* all-R fallback: dispatch drops the first option when it keeps an input's
   * Shard of a dim smaller than its shard count (the output would be unshardable) */
  if (ip.kind != DT_PL_REPLICATE && max >= 2) {
    opt[1].in[0] = opt[1].out[0] = dt_replicate();
    *n = 2;
  }
  return DT_OK;
}

static dt_status opt_sum(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in, const dt_spec *out,
                         int mesh_dim, dt_dim_option *opt, int *n, int max) {
  (void)out;
  return red_options(ctx, a, in, mesh_dim, opt, n, max, DT_RED_SUM);
}

static dt_status opt_mean(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in, const dt_spec *out,
                          int mesh_dim, dt_dim_option *opt, int *n, int max) {
  (void)out;
  return red_options(ctx, a, in, mesh_dim, opt, n, max, DT_RED_AVG);
}

/* ---- kernels -------------------------------------------------------------------- */

/* red_run on device arrays: the dims (size-1 dims dropped) fused into runs of
 * reduced / kept dims; each pass reduces the last reduced run as the middle
 * axis of [outer, run, inner] into a scratch (f32 for bf16), the last pass into
 * y, times 1/count for a mean. Nothing to reduce: a copy. */
static dt_status red_device(dt_ctx *ctx, const dt_array *x, dt_array *y, const bool *mask,
                            int64_t count, bool mean) {
  const char *name = "sum/mean";
  const dt_kernels *K;
  DT_CHECK(dev_kernels(ctx, name, &K));
  DT_OP_KSLOT(ctx, name, K->pw, reduce);
  int64_t sz[DT_MAX_DIMS];
  bool rd[DT_MAX_DIMS];
  int n = 0;
  for (int d = 0; d < x->ndim; d++) {
    if (x->shape[d] == 1) continue;
    if (n > 0 && rd[n - 1] == mask[d]) {
      sz[n - 1] *= x->shape[d];
    } else {
      sz[n] = x->shape[d];
      rd[n++] = mask[d];
    }
  }
  int passes = 0;
  for (int g = 0; g < n; g++) passes += rd[g];
  if (passes == 0)
    return dt_device_copy(ctx->device, y->data, x->data, dt_array_bytes(x), DT_COPY_D2D);
  dt_dtype mid = x->dtype == DT_BF16 ? DT_F32 : x->dtype;
  dt_array cur = *x, next;
  cur.owns = false; /* x is borrowed */
  dt_status st = DT_OK;
  for (int p = 0; p < passes && st == DT_OK; p++) {
    int g = n - 1;
    while (!rd[g]) g--;
    int64_t outer = 1, inner = 1, rest;
    for (int k = 0; k < g; k++) outer *= sz[k];
    for (int k = g + 1; k < n; k++) inner *= sz[k];
    rest = outer * inner;
    bool last = p == passes - 1;
    if (last) {
      next = *y;
      next.owns = false;
    } else {
      st = dt_array_create(ctx, x->dev, mid, 1, &rest, &next);
      if (st != DT_OK) break;
    }
    st = K->pw->reduce(ctx->device, cur.dtype, cur.data, next.dtype, next.data, outer, sz[g], inner,
                       last && mean ? 1.0 / (double)count : 1.0);
    if (cur.owns) dt_array_free(ctx, &cur);
    cur = next;
    /* drop run g; its neighbours (both kept) fuse */
    if (g > 0 && g + 1 < n) {
      sz[g - 1] *= sz[g + 1];
      for (int k = g; k + 2 < n; k++) sz[k] = sz[k + 2], rd[k] = rd[k + 2];
      n -= 2;
    } else {
      for (int k = g; k + 1 < n; k++) sz[k] = sz[k + 1], rd[k] = rd[k + 1];
      n -= 1;
    }
  }
  if (cur.owns) dt_array_free(ctx, &cur);
  return st;
}

/* y = sum (mean: / local count) of the local x over the masked dims. */
static dt_status red_run(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                         dt_tensor *const *out, bool mean) {
  const dt_array *x = &in[0]->local;
  dt_array *y = &out[0]->local;
  bool mask[DT_MAX_DIMS];
  DT_CHECK(red_mask(ctx, "sum/mean", a, x->ndim, mask));
  int64_t ost[DT_MAX_DIMS], idx[DT_MAX_DIMS] = {0}, s = 1, count = 1;
  for (int d = x->ndim - 1; d >= 0; d--) {
    if (mask[d]) {
      ost[d] = 0;
      count *= x->shape[d];
    } else {
      ost[d] = s;
      s *= x->shape[d];
    }
  }
  if (s != y->numel)
    return dt_error(ctx, DT_ERR_INTERNAL, "sum/mean", "local output has %lld elements, expected %lld",
                    (long long)y->numel, (long long)s);
  if (x->dev != DT_DEV_CPU) return red_device(ctx, x, y, mask, count, mean);
  DT_CHECK(check_host(ctx, "sum/mean", x));
  double *acc = dt_host_calloc(ctx, (size_t)(y->numel > 0 ? y->numel : 1) * sizeof(double));
  if (!acc) return dt_error(ctx, DT_ERR_NOMEM, "sum/mean", "accumulator");
  int64_t p = 0;
  for (int64_t e = 0; e < x->numel; e++) {
    acc[p] += dt_elem_ld(x, e);
    for (int d = x->ndim - 1; d >= 0; d--) {
      idx[d]++;
      p += ost[d];
      if (idx[d] < x->shape[d]) break;
      p -= ost[d] * x->shape[d];
      idx[d] = 0;
    }
  }
  /* mean of an empty local: 0/0 = NaN, as torch.mean of an empty tensor */
  for (int64_t i = 0; i < y->numel; i++) dt_elem_st(y, i, mean ? acc[i] / (double)count : acc[i]);
  dt_host_free(ctx, acc);
  return DT_OK;
}

static dt_status k_sum(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                       dt_tensor *const *out) {
  return red_run(ctx, a, in, out, false);
}
static dt_status k_mean(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                        dt_tensor *const *out) {
  return red_run(ctx, a, in, out, true);
}

/* ---- sum/mean backward: the private broadcast op ---------------------------------- */

/* sum_bwd(dC, x) = dC broadcast back to x's shape, times attrs.scalar; attrs.dims,
 * ndims, keepdim as the forward reduction. x is only a template (shape,
 * placements): it is never moved and its data is not read. */
static dt_status bwd_infer(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in, dt_spec *out) {
  bool mask[DT_MAX_DIMS];
  DT_CHECK(red_mask(ctx, "sum_bwd", a, in[1].ndim, mask));
  out->dtype = in[0].dtype;
  out->ndim = in[1].ndim;
  for (int d = 0; d < in[1].ndim; d++) out->gshape[d] = in[1].gshape[d];
  return DT_OK;
}

static dt_status bwd_options(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in,
                             const dt_spec *out, int mesh_dim, dt_dim_option *opt, int *n, int max) {
  (void)a;
  (void)out;
  if (max < 2) return dt_error(ctx, DT_ERR_INTERNAL, "sum_bwd", "no room for options");
  memset(opt, 0, 2 * sizeof *opt);
  dt_placement p = in[1].pl[mesh_dim];
  opt[0].in[0] = dt_replicate();
  opt[0].in[1] = p;
  opt[0].out[0] = p.kind == DT_PL_PARTIAL ? dt_replicate() : p;
  *n = 1;
  if (p.kind == DT_PL_SHARD) { /* R fallback when x's Shard is unshardable (see opt_sum) */
    opt[1].in[0] = opt[1].out[0] = dt_replicate();
    opt[1].in[1] = p;
    *n = 2;
  }
  return DT_OK;
}

static dt_status bwd_kernel(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                            dt_tensor *const *out) {
  const dt_array *g = &in[0]->local; /* replicated: the whole reduced tensor */
  const dt_tensor *yt = out[0];
  dt_array *y = &out[0]->local;
  bool mask[DT_MAX_DIMS];
  DT_CHECK(red_mask(ctx, "sum_bwd", a, yt->ndim, mask));
  int64_t gst[DT_MAX_DIMS], idx[DT_MAX_DIMS] = {0}, s = 1;
  for (int d = yt->ndim - 1; d >= 0; d--) {
    gst[d] = mask[d] ? 0 : s;
    if (!mask[d]) s *= yt->gshape[d];
  }
  if (s != g->numel)
    return dt_error(ctx, DT_ERR_INTERNAL, "sum_bwd", "gradient has %lld elements, expected %lld",
                    (long long)g->numel, (long long)s);
  if (y->numel <= 0) return DT_OK;
  int64_t p = 0;
  for (int d = 0; d < yt->ndim; d++) p += yt->goffset[d] * gst[d];
  if (y->dev != DT_DEV_CPU) { /* a broadcasting gather of g at this shard's offset, scaled */
    const dt_kernels *K;
    DT_CHECK(dev_kernels(ctx, "sum_bwd", &K));
    DT_OP_KSLOT(ctx, "sum_bwd", K->pw, permute);
    DT_OP_KSLOT(ctx, "sum_bwd", K->pw, scale);
    DT_CHECK(K->pw->permute(ctx->device, dt_dtype_size(y->dtype), y->ndim, y->shape, gst, p, g->data,
                            y->data));
    if (a->scalar == 1.0) return DT_OK;
    return K->pw->scale(ctx->device, y->dtype, y->numel, a->scalar, y->data, y->data);
  }
  DT_CHECK(check_host(ctx, "sum_bwd", y));
  for (int64_t e = 0; e < y->numel; e++) {
    dt_elem_st(y, e, dt_elem_ld(g, p) * a->scalar);
    for (int d = yt->ndim - 1; d >= 0; d--) {
      idx[d]++;
      p += gst[d];
      if (idx[d] < y->shape[d]) break;
      p -= gst[d] * y->shape[d];
      idx[d] = 0;
    }
  }
  return DT_OK;
}

static const dt_op op_sum_bwd = {.name = "sum_bwd", .n_in = 2, .n_out = 1, .infer = bwd_infer,
                                 .options = bwd_options, .kernel = bwd_kernel};

static dt_status red_backward(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                              const dt_tensor *const *gout, dt_tensor *const *gin, bool mean) {
  if (!gin[0]) return DT_OK;
  bool mask[DT_MAX_DIMS];
  DT_CHECK(red_mask(ctx, "sum/mean backward", a, in[0]->ndim, mask));
  dt_op_attrs b;
  /* normalised dims, so the cache key does not depend on how they were spelt */
  memset(&b, 0, sizeof b);
  b.keepdim = a->keepdim;
  double N = 1;
  for (int d = 0; d < in[0]->ndim; d++)
    if (mask[d]) {
      b.dims[b.ndims++] = d;
      N *= (double)in[0]->gshape[d];
    }
  if (in[0]->ndim == 0) b.ndims = 0;
  b.scalar = mean ? 1.0 / N : 1.0;
  if (!gout[0]) { /* no gradient: zeros shaped like x */
    dt_op_attrs z;
    memset(&z, 0, sizeof z);
    const dt_tensor *zi[1] = {in[0]};
    dt_tensor *zo[1] = {gin[0]};
    return dt_op_call(ctx, &dt_op_scale, &z, zi, zo, NULL);
  }
  const dt_tensor *bi[2] = {gout[0], in[0]};
  dt_tensor *bo[1] = {gin[0]};
  return dt_op_call(ctx, &op_sum_bwd, &b, bi, bo, NULL);
}

static dt_status b_sum(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                       const dt_tensor *const *out, const dt_tensor *const *gout,
                       dt_tensor *const *gin) {
  (void)out;
  return red_backward(ctx, a, in, gout, gin, false);
}
static dt_status b_mean(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                        const dt_tensor *const *out, const dt_tensor *const *gout,
                        dt_tensor *const *gin) {
  (void)out;
  return red_backward(ctx, a, in, gout, gin, true);
}

/* ---- softmax -------------------------------------------------------------------- */

static dt_status sm_dim(dt_ctx *ctx, const dt_op_attrs *a, int ndim, int *dim) {
  int d = a->dim < 0 ? a->dim + ndim : a->dim;
  if (d < 0 || d >= ndim)
    return dt_error(ctx, DT_ERR_INVALID, "softmax", "dim %d out of range for a %d-d tensor", a->dim,
                    ndim);
  *dim = d;
  return DT_OK;
}

static dt_status sm_infer(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in, dt_spec *out) {
  int d = 0;
  DT_CHECK(check_float(ctx, "softmax", in[0].dtype));
  DT_CHECK(sm_dim(ctx, a, in[0].ndim, &d));
  out->dtype = in[0].dtype;
  out->ndim = in[0].ndim;
  for (int k = 0; k < in[0].ndim; k++) out->gshape[k] = in[0].gshape[k];
  return DT_OK;
}

static dt_status sm_options(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in,
                            const dt_spec *out, int mesh_dim, dt_dim_option *opt, int *n, int max) {
  (void)out;
  int d = 0;
  DT_CHECK(sm_dim(ctx, a, in[0].ndim, &d));
  if (max < 2) return dt_error(ctx, DT_ERR_INTERNAL, "softmax", "no room for options");
  dt_placement p = in[0].pl[mesh_dim];
  if (p.kind == DT_PL_PARTIAL || (p.kind == DT_PL_SHARD && p.dim == d)) p = dt_replicate();
  memset(opt, 0, 2 * sizeof *opt);
  opt[0].in[0] = opt[0].out[0] = p;
  *n = 1;
  if (p.kind != DT_PL_REPLICATE && max >= 2) { /* all-R fallback, as for sum/mean */
    opt[1].in[0] = opt[1].out[0] = dt_replicate();
    *n = 2;
  }
  return DT_OK;
}

static dt_status sm_kernel(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                           dt_tensor *const *out) {
  const dt_array *x = &in[0]->local;
  dt_array *y = &out[0]->local;
  int dim = 0;
  DT_CHECK(sm_dim(ctx, a, x->ndim, &dim));
  int64_t outer = 1, inner = 1, L = x->shape[dim];
  for (int d = 0; d < dim; d++) outer *= x->shape[d];
  for (int d = dim + 1; d < x->ndim; d++) inner *= x->shape[d];
  if (x->dev != DT_DEV_CPU) {
    const dt_kernels *K;
    DT_CHECK(dev_kernels(ctx, "softmax", &K));
    DT_OP_KSLOT(ctx, "softmax", K->pw, softmax);
    return K->pw->softmax(ctx->device, x->dtype, outer, L, inner, x->data, y->data);
  }
  DT_CHECK(check_host(ctx, "softmax", x));
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      int64_t base = o * L * inner + i;
      double mx = -INFINITY, z = 0;
      for (int64_t k = 0; k < L; k++) mx = fmax(mx, dt_elem_ld(x, base + k * inner));
      for (int64_t k = 0; k < L; k++) z += exp(dt_elem_ld(x, base + k * inner) - mx);
      for (int64_t k = 0; k < L; k++) dt_elem_st(y, base + k * inner, exp(dt_elem_ld(x, base + k * inner) - mx) / z);
    }
  return DT_OK;
}

/* softmax_bwd(y, dy) -> dx = y (dy - sum(dy y, dim, keepdim)) in one device
 * kernel (PyTorch's _softmax_backward_data); attrs.dim as softmax. y and dy
 * take softmax's placements of y (a Shard of dim or a Partial goes to R). */
static dt_status smb_infer(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in, dt_spec *out) {
  bool same = in[0].ndim == in[1].ndim && in[0].dtype == in[1].dtype;
  for (int d = 0; same && d < in[0].ndim; d++) same = in[0].gshape[d] == in[1].gshape[d];
  if (!same) return dt_error(ctx, DT_ERR_INVALID, "softmax_bwd", "y and dy differ in shape or dtype");
  return sm_infer(ctx, a, in, out);
}

static dt_status smb_options(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in,
                             const dt_spec *out, int mesh_dim, dt_dim_option *opt, int *n, int max) {
  DT_CHECK(sm_options(ctx, a, in, out, mesh_dim, opt, n, max));
  for (int k = 0; k < *n; k++) opt[k].in[1] = opt[k].in[0];
  return DT_OK;
}

static dt_status smb_kernel(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                            dt_tensor *const *out) {
  const dt_array *y = &in[0]->local, *dy = &in[1]->local;
  dt_array *dx = &out[0]->local;
  int dim = 0;
  DT_CHECK(sm_dim(ctx, a, y->ndim, &dim));
  if (y->dev == DT_DEV_CPU || dy->numel != y->numel || dx->numel != y->numel)
    return dt_error(ctx, DT_ERR_INTERNAL, "softmax_bwd", "device arrays of one shape expected");
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; d++) outer *= y->shape[d];
  for (int d = dim + 1; d < y->ndim; d++) inner *= y->shape[d];
  const dt_kernels *K;
  DT_CHECK(dev_kernels(ctx, "softmax_bwd", &K));
  DT_OP_KSLOT(ctx, "softmax_bwd", K->pw, softmax_bwd);
  return K->pw->softmax_bwd(ctx->device, y->dtype, outer, y->shape[dim], inner, y->data, dy->data,
                            dx->data);
}

static const dt_op op_softmax_bwd = {.name = "softmax_bwd", .n_in = 2, .n_out = 1,
                                     .infer = smb_infer, .options = smb_options,
                                     .kernel = smb_kernel};

/* dx = y * (dy - sum(dy * y, dim, keepdim)) */
static dt_status sm_backward(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                             const dt_tensor *const *out, const dt_tensor *const *gout,
                             dt_tensor *const *gin) {
  if (!gin[0]) return DT_OK;
  dt_op_attrs z;
  memset(&z, 0, sizeof z);
  if (!gout[0]) {
    const dt_tensor *zi[1] = {in[0]};
    dt_tensor *zo[1] = {gin[0]};
    return dt_op_call(ctx, &dt_op_scale, &z, zi, zo, NULL);
  }
  if (out[0]->local.dev != DT_DEV_CPU) {
    const dt_tensor *bi[2] = {out[0], gout[0]};
    return dt_op_call(ctx, &op_softmax_bwd, a, bi, gin, NULL);
  }
  int dim = 0;
  DT_CHECK(sm_dim(ctx, a, in[0]->ndim, &dim));
  dt_op_attrs sa;
  memset(&sa, 0, sizeof sa);
  sa.ndims = 1;
  sa.dims[0] = dim;
  sa.keepdim = true;
  dt_tensor t1, t2, t3;
  dt_status s;
  const dt_tensor *i2[2] = {gout[0], out[0]};
  dt_tensor *o1[1] = {&t1};
  DT_CHECK(dt_op_call(ctx, &dt_op_mul, &z, i2, o1, NULL));
  const dt_tensor *i1[1] = {&t1};
  dt_tensor *o2[1] = {&t2};
  s = dt_op_call(ctx, &dt_op_sum, &sa, i1, o2, NULL);
  dt_tensor_free(ctx, &t1);
  DT_CHECK(s);
  const dt_tensor *i3[2] = {gout[0], &t2};
  dt_tensor *o3[1] = {&t3};
  s = dt_op_call(ctx, &dt_op_sub, &z, i3, o3, NULL);
  dt_tensor_free(ctx, &t2);
  DT_CHECK(s);
  const dt_tensor *i4[2] = {out[0], &t3};
  s = dt_op_call(ctx, &dt_op_mul, &z, i4, gin, NULL);
  dt_tensor_free(ctx, &t3);
  return s;
}

/* ---- the ops -------------------------------------------------------------------- */

const dt_op dt_op_sum = {.name = "sum", .n_in = 1, .n_out = 1, .infer = red_infer,
                         .options = opt_sum, .kernel = k_sum, .backward = b_sum};
const dt_op dt_op_mean = {.name = "mean", .n_in = 1, .n_out = 1, .infer = red_infer,
                          .options = opt_mean, .kernel = k_mean, .backward = b_mean};
const dt_op dt_op_softmax = {.name = "softmax", .n_in = 1, .n_out = 1, .infer = sm_infer,
                             .options = sm_options, .kernel = sm_kernel, .backward = sm_backward};
