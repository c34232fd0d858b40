/* lib/ops/norm.c: RMSNorm on DTensors (PyTorch's torch/distributed/tensor/
 * _ops/_math_ops.py: layer_norm_strategy and its backward, whose rule the
 * fused RMSNorm shares):
 *   y = x / sqrt(mean(x^2 over the last dim) + eps) * weight,
 * x [..., d], weight [d], attrs.scalar = eps (1e-5 when 0, torch's RMSNorm
 * default for the fused kernel's callers in TorchTitan).
 *
 * Strategy (PyTorch's _common_norm_forward_strategy, one option per mesh dim
 * plus an all-R fallback): x keeps its Shards on dims < last; a Shard on the
 * last dim and any Partial go to R; weight R; the output follows x.
 * Kernels: the rows.rms_fwd / rms_bwd slots of the arrays' device
 * (lib/device/kernels.h: the CPU's f32 / f64 accumulated in double, the GPU's
 * f32, f64 and bf16 one block per row).
 * Backward: a private op rms_norm_bwd(x, weight, dy) -> (dx, dy * x_hat) with
 * the forward's placements (dx follows x, as PyTorch's d_input), then
 * dweight = sum(dy * x_hat) over the outer dims with dt_op_sum, which turns a
 * Shard on an outer dim into Partial(sum) with no comm, as PyTorch's norm
 * backward strategy gives d_weight (test_math_ops.py, test_layer_norm_bwd:
 * weight.grad is Partial exactly when an outer dim is sharded).
 *   dx = (g - x_hat * mean(g * x_hat, last)) / rms,  g = weight * dy.
 *
 * What it is not: LayerNorm, a normalized_shape of more than the last dim,
 * bf16 host kernels.
 */
#include "config.h"

#include <string.h>

#include "ops/ops.h"

/* torch.nn.RMSNorm uses finfo(dtype).eps when eps is None; TorchTitan passes
 * 1e-5 explicitly, which is what attrs.scalar == 0 stands for here. */
static const double DEFAULT_EPS = 1e-5;

static double get_eps(const dt_op_attrs *a) { return a->scalar != 0 ? a->scalar : DEFAULT_EPS; }

static dt_status rms_check(dt_ctx *ctx, const char *name, const dt_spec *x, const dt_spec *w) {
  if (x->dtype != DT_F32 && x->dtype != DT_F64 && x->dtype != DT_BF16)
    return dt_error(ctx, DT_ERR_UNSUPPORTED, name, "dtype %s; only f32, f64 and bf16 are supported",
                    dt_dtype_name(x->dtype));
  if (w->dtype != x->dtype)
    return dt_error(ctx, DT_ERR_INVALID, name, "weight is %s, x is %s", dt_dtype_name(w->dtype),
                    dt_dtype_name(x->dtype));
  if (x->ndim < 1) return dt_error(ctx, DT_ERR_INVALID, name, "x must have at least one dim");
  if (w->ndim != 1 || w->gshape[0] != x->gshape[x->ndim - 1])
    return dt_error(ctx, DT_ERR_INVALID, name, "weight must be [%lld] (x's last dim)",
                    (long long)x->gshape[x->ndim - 1]);
  return DT_OK;
}

static void copy_shape(const dt_spec *x, dt_spec *out) {
  out->dtype = x->dtype;
  out->ndim = x->ndim;
  for (int d = 0; d < x->ndim; d++) out->gshape[d] = x->gshape[d];
}

static dt_status rms_infer(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in, dt_spec *out) {
  (void)a;
  DT_CHECK(rms_check(ctx, "rms_norm", &in[0], &in[1]));
  copy_shape(&in[0], &out[0]);
  return DT_OK;
}

/* x's placement on one mesh dim as the norm needs it */
static dt_placement norm_pl(const dt_spec *x, int mesh_dim) {
  dt_placement p = x->pl[mesh_dim];
  if (p.kind == DT_PL_SHARD && p.dim < x->ndim - 1) return p;
  return dt_replicate();
}

static dt_status rms_options(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in,
                             const dt_spec *out, int mesh_dim, dt_dim_option *opt, int *n, int max) {
  (void)a;
  (void)out;
  if (max < 2) return dt_error(ctx, DT_ERR_INTERNAL, "rms_norm", "no room for options");
  memset(opt, 0, 2 * sizeof *opt);
  dt_placement p = norm_pl(&in[0], mesh_dim);
  opt[0].in[0] = opt[0].out[0] = p;
  opt[0].in[1] = dt_replicate();
  *n = 1;
  if (p.kind != DT_PL_REPLICATE) { /* all-R fallback when the Shard is unshardable */
    opt[1].in[0] = opt[1].out[0] = opt[1].in[1] = dt_replicate();
    *n = 2;
  }
  return DT_OK;
}

static dt_status rows(dt_ctx *ctx, const char *name, const dt_array *x, const dt_array *w,
                      int64_t *nrows, int64_t *d) {
  if (x->ndim < 1 || w->ndim != 1 || x->shape[x->ndim - 1] != w->shape[0])
    return dt_error(ctx, DT_ERR_INTERNAL, name, "local last dim is not whole (strategy bug)");
  *d = w->shape[0];
  *nrows = *d ? x->numel / *d : 0;
  return DT_OK;
}

static dt_status rms_kernel(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                            dt_tensor *const *out) {
  const dt_array *x = &in[0]->local, *w = &in[1]->local;
  dt_array *y = &out[0]->local;
  int64_t nr = 0, d = 0;
  DT_CHECK(rows(ctx, "rms_norm", x, w, &nr, &d));
  if (y->numel != x->numel)
    return dt_error(ctx, DT_ERR_INTERNAL, "rms_norm", "local output size differs (strategy bug)");
  dt_kdev kd;
  DT_CHECK(dt_device_kernels(ctx, x->dev, "rms_norm", &kd));
  DT_OP_KSLOT(ctx, "rms_norm", kd.k->rows, rms_fwd);
  dt_op_kledger(ctx, "rms_norm", x->dtype, 4, x->numel, x->numel + d, x->numel);
  return kd.k->rows->rms_fwd(kd.dev, x->dtype, nr, d, get_eps(a), x->data, w->data, y->data);
}

/* ---- backward: rms_norm_bwd(x, weight, dy) -> (dx, dy * x_hat) ------------------- */

static dt_status bwd_infer(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in, dt_spec *out) {
  (void)a;
  DT_CHECK(rms_check(ctx, "rms_norm_bwd", &in[0], &in[1]));
  bool same = in[2].ndim == in[0].ndim && in[2].dtype == in[0].dtype;
  for (int d = 0; same && d < in[0].ndim; d++) same = in[2].gshape[d] == in[0].gshape[d];
  if (!same) return dt_error(ctx, DT_ERR_INVALID, "rms_norm_bwd", "dy must be shaped like x");
  copy_shape(&in[0], &out[0]);
  copy_shape(&in[0], &out[1]);
  return DT_OK;
}

static dt_status bwd_options(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in,
                             const dt_spec *out, int mesh_dim, dt_dim_option *opt, int *n, int max) {
  (void)a;
  (void)out;
  if (max < 2) return dt_error(ctx, DT_ERR_INTERNAL, "rms_norm_bwd", "no room for options");
  memset(opt, 0, 2 * sizeof *opt);
  dt_placement p = norm_pl(&in[0], mesh_dim);
  opt[0].in[0] = opt[0].in[2] = opt[0].out[0] = opt[0].out[1] = p;
  opt[0].in[1] = dt_replicate();
  *n = 1;
  if (p.kind != DT_PL_REPLICATE) {
    opt[1].in[0] = opt[1].in[1] = opt[1].in[2] = opt[1].out[0] = opt[1].out[1] = dt_replicate();
    *n = 2;
  }
  return DT_OK;
}

static dt_status bwd_kernel(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                            dt_tensor *const *out) {
  const dt_array *x = &in[0]->local, *w = &in[1]->local, *dy = &in[2]->local;
  dt_array *dx = &out[0]->local, *gw = &out[1]->local;
  int64_t nr = 0, d = 0;
  DT_CHECK(rows(ctx, "rms_norm_bwd", x, w, &nr, &d));
  if (dy->numel != x->numel || dx->numel != x->numel || gw->numel != x->numel)
    return dt_error(ctx, DT_ERR_INTERNAL, "rms_norm_bwd", "local sizes differ (strategy bug)");
  /* dweight is the sum op over gw (rms_backward), the same composition on every device */
  dt_kdev kd;
  DT_CHECK(dt_device_kernels(ctx, x->dev, "rms_norm_bwd", &kd));
  DT_OP_KSLOT(ctx, "rms_norm_bwd", kd.k->rows, rms_bwd);
  dt_op_kledger(ctx, "rms_norm_bwd", x->dtype, 8, x->numel, 2 * x->numel + d, 2 * x->numel);
  return kd.k->rows->rms_bwd(kd.dev, x->dtype, nr, d, get_eps(a), x->data, w->data, dy->data,
                             dx->data, gw->data, NULL, NULL);
}

static const dt_op op_rms_norm_bwd = {.name = "rms_norm_bwd", .n_in = 3, .n_out = 2,
                                      .infer = bwd_infer, .options = bwd_options,
                                      .kernel = bwd_kernel};

static dt_status rms_backward(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                              const dt_tensor *const *out, const dt_tensor *const *gout,
                              dt_tensor *const *gin) {
  (void)out;
  dt_op_attrs z;
  memset(&z, 0, sizeof z);
  if (!gout[0]) { /* no gradient: zeros */
    for (int j = 0; j < 2; j++) {
      if (!gin[j]) continue;
      const dt_tensor *zi[1] = {in[j]};
      dt_tensor *zo[1] = {gin[j]};
      DT_CHECK(dt_op_call(ctx, &dt_op_scale, &z, zi, zo, NULL));
    }
    return DT_OK;
  }
  if (!gin[0] && !gin[1]) return DT_OK;
  dt_op_attrs b;
  memset(&b, 0, sizeof b);
  b.scalar = get_eps(a); /* normalised, so the cache key does not depend on the spelling */
  dt_tensor dx, gxh;
  const dt_tensor *bi[3] = {in[0], in[1], gout[0]};
  dt_tensor *bo[2] = {&dx, &gxh};
  DT_CHECK(dt_op_call(ctx, &op_rms_norm_bwd, &b, bi, bo, NULL));
  dt_status s = DT_OK;
  if (gin[1]) {
    dt_op_attrs sa;
    memset(&sa, 0, sizeof sa);
    const dt_tensor *si[1] = {&gxh};
    dt_tensor *so[1] = {gin[1]};
    if (in[0]->ndim == 1) { /* no outer dims: dweight = dy * x_hat itself */
      sa.scalar = 1.0;
      s = dt_op_call(ctx, &dt_op_scale, &sa, si, so, NULL);
    } else {
      sa.ndims = in[0]->ndim - 1;
      for (int d = 0; d < sa.ndims; d++) sa.dims[d] = d;
      s = dt_op_call(ctx, &dt_op_sum, &sa, si, so, NULL);
    }
  }
  dt_tensor_free(ctx, &gxh);
  if (gin[0] && s == DT_OK)
    *gin[0] = dx;
  else
    dt_tensor_free(ctx, &dx);
  return s;
}

const dt_op dt_op_rms_norm = {.name = "rms_norm", .n_in = 2, .n_out = 1, .infer = rms_infer,
                              .options = rms_options, .kernel = rms_kernel,
                              .backward = rms_backward,
    .bwd_meta_out = 1};
