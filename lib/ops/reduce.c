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
 * Kernels: the dt_kern_pw slots of the arrays' device (lib/device/kernels.h):
 * a sum/mean is one sum_dims over the reduced dims (f64 accumulation for f32
 * and f64; the CPU's adds x's elements in order, then divides by the count for
 * a mean), softmax one softmax, sum_bwd's broadcast a strided gather (permute)
 * and a scale. Backward: sum and mean through a private broadcast op (sum_bwd:
 * dC redistributed to R, dx with x's placements, Partial -> R: a Partial
 * gradient of a broadcast is no cheaper and the R gradient is correct for every
 * x layout); softmax as dx = y * (dy - sum(dy * y, dim, keepdim)) with
 * dt_op_call (mul, sum, sub, mul), so it propagates placements like forward.
 *
 * What it is not: max/min/prod/var reductions, log_softmax, fused kernels.
 */
#include "config.h"

#include <string.h>

#include "ops/ops.h"

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

/* y = sum (mean: / local count) of the local x over the masked dims: one
 * sum_dims of the device's (its order and accumulator: lib/device/kernels.h). */
static dt_status red_run(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                         dt_tensor *const *out, bool mean) {
  const char *name = "sum/mean";
  const dt_array *x = &in[0]->local;
  dt_array *y = &out[0]->local;
  bool mask[DT_MAX_DIMS];
  DT_CHECK(red_mask(ctx, name, a, x->ndim, mask));
  int64_t s = 1, count = 1;
  uint32_t dims = 0;
  for (int d = 0; d < x->ndim; d++) {
    if (mask[d]) {
      dims |= 1u << d;
      count *= x->shape[d];
    } else {
      s *= x->shape[d];
    }
  }
  if (s != y->numel)
    return dt_error(ctx, DT_ERR_INTERNAL, name, "local output has %lld elements, expected %lld",
                    (long long)y->numel, (long long)s);
  dt_kdev kd;
  DT_CHECK(dt_device_kernels(ctx, x->dev, name, &kd));
  DT_OP_KSLOT(ctx, name, kd.k->pw, sum_dims);
  dt_op_kledger(ctx, "sum", x->dtype, 1, x->numel, x->numel, y->numel);
  /* mean of an empty local: 0/0 = NaN, as torch.mean of an empty tensor */
  return kd.k->pw->sum_dims(kd.dev, x->dtype, x->ndim, x->shape, dims, x->data, y->dtype, y->data,
                            mean ? (double)count : 1.0);
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
  int64_t gst[DT_MAX_DIMS], s = 1;
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
  /* a broadcasting gather of g at this shard's offset, then scaled (x * 1 is x) */
  dt_kdev kd;
  DT_CHECK(dt_device_kernels(ctx, y->dev, "sum_bwd", &kd));
  DT_OP_KSLOT(ctx, "sum_bwd", kd.k->pw, permute);
  DT_OP_KSLOT(ctx, "sum_bwd", kd.k->pw, scale);
  dt_op_kledger(ctx, "permute", y->dtype, 0, y->numel, y->numel, y->numel);
  DT_CHECK(kd.k->pw->permute(kd.dev, dt_dtype_size(y->dtype), y->ndim, y->shape, gst, p, g->data,
                             y->data));
  if (a->scalar == 1.0) return DT_OK;
  return kd.k->pw->scale(kd.dev, y->dtype, y->numel, a->scalar, y->data, y->data);
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
  dt_kdev kd;
  DT_CHECK(dt_device_kernels(ctx, x->dev, "softmax", &kd));
  DT_OP_KSLOT(ctx, "softmax", kd.k->pw, softmax);
  dt_op_kledger(ctx, "softmax", x->dtype, 4, x->numel, x->numel, x->numel);
  return kd.k->pw->softmax(kd.dev, x->dtype, outer, L, inner, x->data, y->data);
}

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
