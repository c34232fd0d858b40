/* lib/ops/view.c: view ops on DTensors (PyTorch's torch/distributed/tensor/
 * _ops/_view_ops.py: view_groups, propagate_shape_and_sharding): view and
 * reshape (attrs.shape[0..shape_n), one -1 inferred), transpose (attrs.i0,
 * attrs.i1; negative dims count from the end) and permute (attrs.dims[0..ndims)).
 *
 * Strategy.
 *  - transpose / permute (PyTorch's InputDim map): per mesh dim, a Shard is
 *    renumbered through the permutation, R and Partial are kept; no comm.
 *  - view / reshape: the input and output dims are cut into minimal groups of
 *    equal products (PyTorch's view_groups: identity, flatten, split, or a
 *    flatten followed by a split), size-1 dims standing alone (singletons). A
 *    Shard on input dim d (N = product of the mesh sizes sharding d) survives
 *      - on an identity group (one input dim, one output dim): always;
 *      - otherwise only when d is the group's first non-singleton input dim,
 *        gshape[d] % N == 0 and the group's first non-singleton output dim
 *        (piece 0) has size % N == 0: then every rank's local block is one
 *        contiguous piece of the group's flat range, the same piece the output
 *        sharding gives it, and the kernel is a plain local reshape;
 *      - else that dim goes to R (every mesh dim sharding it), so the values are
 *        right also where PyTorch keeps a Shard whose local block is not a piece
 *        of the flat tensor (e.g. [4,6] S(1) viewed as [24]).
 *    R and Partial are kept. reshape redistributes when needed (and offers an
 *    all-R candidate when the first one is unshardable under dispatch's rule);
 *    view is strict (aten.view's strict_view): it returns DT_ERR_INVALID when the
 *    input would have to move.
 * Kernels: any dtype (views move bytes, no arithmetic): view/reshape copy the
 * contiguous local block, transpose/permute do a local permuted copy, both
 * through the permute slot of the arrays' device (lib/device/kernels.h; a
 * contiguous gather is a flat copy). Backward:
 * reshape the gradient back to the input's shape, transpose back, or the
 * inverse permutation, all through dt_op_call.
 *
 * What it is not: squeeze/unsqueeze/expand/repeat as separate ops, strided
 * (non-contiguous) views, _StridedShard placements.
 */
#include "config.h"

#include <string.h>

#include "ops/ops.h"

/* ---- shapes ------------------------------------------------------------------- */

static dt_status view_shape(dt_ctx *ctx, const char *name, const dt_op_attrs *a, const dt_spec *x,
                            int *ond, int64_t *oshape) {
  if (a->shape_n < 0 || a->shape_n > DT_MAX_DIMS)
    return dt_error(ctx, DT_ERR_INVALID, name, "shape_n %d out of range (0..%d)", a->shape_n,
                    DT_MAX_DIMS);
  int64_t n = 1, known = 1;
  for (int d = 0; d < x->ndim; d++) n *= x->gshape[d];
  int infer = -1;
  for (int d = 0; d < a->shape_n; d++) {
    int64_t s = a->shape[d];
    if (s == -1) {
      if (infer >= 0) return dt_error(ctx, DT_ERR_INVALID, name, "more than one -1 in the shape");
      infer = d;
    } else if (s < 0) {
      return dt_error(ctx, DT_ERR_INVALID, name, "invalid size %lld at dim %d", (long long)s, d);
    } else {
      known *= s;
    }
    oshape[d] = s;
  }
  if (infer >= 0) {
    if (known == 0 || n % known)
      return dt_error(ctx, DT_ERR_INVALID, name,
                      "shape with -1 cannot hold %lld elements (the other sizes multiply to %lld)",
                      (long long)n, (long long)known);
    oshape[infer] = n / known;
    known = n;
  }
  if (known != n)
    return dt_error(ctx, DT_ERR_INVALID, name,
                    "shape has %lld elements but the input has %lld", (long long)known, (long long)n);
  *ond = a->shape_n;
  return DT_OK;
}

static dt_status view_infer(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in, dt_spec *out) {
  out->dtype = in[0].dtype;
  return view_shape(ctx, "view/reshape", a, &in[0], &out->ndim, out->gshape);
}

/* perm[k] = the input dim of output dim k. */
static dt_status get_perm(dt_ctx *ctx, bool transpose, const dt_op_attrs *a, int ndim, int *perm) {
  const char *name = transpose ? "transpose" : "permute";
  for (int d = 0; d < ndim; d++) perm[d] = d;
  if (transpose) {
    if (ndim == 0 && (a->i0 == 0 || a->i0 == -1) && (a->i1 == 0 || a->i1 == -1)) return DT_OK;
    int i0 = a->i0 < 0 ? a->i0 + ndim : a->i0, i1 = a->i1 < 0 ? a->i1 + ndim : a->i1;
    if (i0 < 0 || i0 >= ndim || i1 < 0 || i1 >= ndim)
      return dt_error(ctx, DT_ERR_INVALID, name, "dims (%d, %d) out of range for a %d-d tensor",
                      a->i0, a->i1, ndim);
    perm[i0] = i1;
    perm[i1] = i0;
    return DT_OK;
  }
  if (a->ndims != ndim)
    return dt_error(ctx, DT_ERR_INVALID, name, "%d dims given for a %d-d tensor", a->ndims, ndim);
  bool seen[DT_MAX_DIMS] = {false};
  for (int k = 0; k < ndim; k++) {
    int d = a->dims[k] < 0 ? a->dims[k] + ndim : a->dims[k];
    if (d < 0 || d >= ndim)
      return dt_error(ctx, DT_ERR_INVALID, name, "dim %d out of range for a %d-d tensor",
                      a->dims[k], ndim);
    if (seen[d]) return dt_error(ctx, DT_ERR_INVALID, name, "dim %d listed twice", a->dims[k]);
    seen[d] = true;
    perm[k] = d;
  }
  return DT_OK;
}

static dt_status perm_infer_common(dt_ctx *ctx, bool tr, const dt_op_attrs *a, const dt_spec *in,
                                   dt_spec *out) {
  int perm[DT_MAX_DIMS];
  DT_CHECK(get_perm(ctx, tr, a, in[0].ndim, perm));
  out->dtype = in[0].dtype;
  out->ndim = in[0].ndim;
  for (int k = 0; k < in[0].ndim; k++) out->gshape[k] = in[0].gshape[perm[k]];
  return DT_OK;
}
static dt_status tr_infer(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in, dt_spec *out) {
  return perm_infer_common(ctx, true, a, in, out);
}
static dt_status pm_infer(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in, dt_spec *out) {
  return perm_infer_common(ctx, false, a, in, out);
}

/* ---- strategies ----------------------------------------------------------------- */

static dt_status perm_options_common(dt_ctx *ctx, bool tr, const dt_op_attrs *a, const dt_spec *in,
                                     int mesh_dim, dt_dim_option *opt, int *n, int max) {
  const char *name = tr ? "transpose" : "permute";
  int perm[DT_MAX_DIMS], inv[DT_MAX_DIMS];
  DT_CHECK(get_perm(ctx, tr, a, in[0].ndim, perm));
  for (int k = 0; k < in[0].ndim; k++) inv[perm[k]] = k;
  if (max < 2) return dt_error(ctx, DT_ERR_INTERNAL, name, "no room for options");
  memset(opt, 0, 2 * sizeof *opt);
  dt_placement p = in[0].pl[mesh_dim];
  opt[0].in[0] = p;
  opt[0].out[0] = p.kind == DT_PL_SHARD ? dt_shard(inv[p.dim]) : p;
  *n = 1;
  /* all-R fallback: dispatch drops the first option when the renumbered Shard
   * lands on an output dim smaller than its shard count */
  if (p.kind == DT_PL_SHARD) {
    opt[1].in[0] = opt[1].out[0] = dt_replicate();
    *n = 2;
  }
  return DT_OK;
}
static dt_status tr_options(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in, const dt_spec *out,
                            int mesh_dim, dt_dim_option *opt, int *n, int max) {
  (void)out;
  return perm_options_common(ctx, true, a, in, mesh_dim, opt, n, max);
}
static dt_status pm_options(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in, const dt_spec *out,
                            int mesh_dim, dt_dim_option *opt, int *n, int max) {
  (void)out;
  return perm_options_common(ctx, false, a, in, mesh_dim, opt, n, max);
}

/* The target placements of a view from x (gshape x->gshape) to out: in_pl what
 * the input must be, out_pl what the output is (see the file comment). */
static void view_map(const dt_spec *x, const dt_spec *out, dt_placement *in_pl, dt_placement *out_pl) {
  const int nin = x->ndim, nout = out->ndim;
  const int64_t *is = x->gshape, *os = out->gshape;
  int m = x->mesh_ndim;
  /* per input dim: target output dim, or -1 (goes to R) */
  int target[DT_MAX_DIMS];
  for (int d = 0; d < nin; d++) target[d] = -1;
  int64_t numel = 1;
  for (int d = 0; d < nin; d++) numel *= is[d];
  if (numel > 0) {
    int64_t nsh[DT_MAX_DIMS];
    for (int d = 0; d < nin; d++) nsh[d] = 1;
    for (int i = 0; i < m; i++)
      if (x->pl[i].kind == DT_PL_SHARD && x->pl[i].dim < nin)
        nsh[x->pl[i].dim] *= x->mesh_shape[i] > 0 ? x->mesh_shape[i] : 1;
    int i = 0, j = 0;
    while (i < nin || j < nout) {
      if (i < nin && j < nout && is[i] == 1 && os[j] == 1) { /* singleton kept */
        target[i++] = j++;
        continue;
      }
      if (i < nin && is[i] == 1) { /* dropped singleton */
        i++;
        continue;
      }
      if (j < nout && os[j] == 1) { /* new singleton */
        j++;
        continue;
      }
      if (i >= nin || j >= nout) break; /* cannot happen when the numels agree */
      int i0 = i, j0 = j;
      int64_t pi = is[i++], pj = os[j++];
      while (pi != pj) {
        if (pi < pj && i < nin)
          pi *= is[i++];
        else if (pj < pi && j < nout)
          pj *= os[j++];
        else
          break;
      }
      if (i - i0 == 1 && j - j0 == 1) { /* identity */
        target[i0] = j0;
        continue;
      }
      /* flatten / split: only the first non-singleton dims may carry the Shard */
      int d0 = i0, o0 = j0;
      while (d0 < i && is[d0] == 1) d0++;
      while (o0 < j && os[o0] == 1) o0++;
      if (d0 < i && o0 < j && is[d0] % nsh[d0] == 0 && os[o0] % nsh[d0] == 0) target[d0] = o0;
    }
  }
  for (int k = 0; k < m; k++) {
    dt_placement p = x->pl[k];
    if (p.kind == DT_PL_SHARD) {
      int t = p.dim < nin ? target[p.dim] : -1;
      if (t < 0) {
        in_pl[k] = out_pl[k] = dt_replicate();
      } else {
        in_pl[k] = p;
        out_pl[k] = dt_shard(t);
      }
    } else {
      in_pl[k] = out_pl[k] = p;
    }
  }
}

static dt_status view_cands_common(dt_ctx *ctx, bool strict, const dt_spec *in, const dt_spec *out,
                                   dt_candidate *cand, int *n, int max) {
  const char *name = strict ? "view" : "reshape";
  if (max < 2) return dt_error(ctx, DT_ERR_INTERNAL, name, "no room for candidates");
  const dt_spec *x = &in[0];
  int m = x->mesh_ndim;
  memset(cand, 0, 2 * sizeof *cand);
  view_map(x, out, cand[0].in[0], cand[0].out[0]);
  *n = 1;
  bool moves = false, any = false;
  for (int i = 0; i < m; i++) {
    if (!dt_placement_eq(cand[0].in[0][i], x->pl[i])) moves = true;
    if (cand[0].in[0][i].kind != DT_PL_REPLICATE) any = true;
  }
  bool ok = dt_spec_shardable(out, x->mesh_shape, cand[0].out[0]);
  if (strict && moves) {
    char have[96], need[96];
    dt_placements_str(m, x->pl, have, sizeof have);
    dt_placements_str(m, cand[0].in[0], need, sizeof need);
    return dt_error(ctx, DT_ERR_INVALID, name,
                    "the input %s would have to be redistributed to %s first (its local "
                    "shards are not pieces of the viewed tensor); use reshape",
                    have, need);
  }
  if (!ok && any) { /* all-R fallback (the dispatcher drops the first) */
    for (int i = 0; i < m; i++) cand[1].in[0][i] = cand[1].out[0][i] = dt_replicate();
    *n = 2;
  }
  return DT_OK;
}
static dt_status view_cands(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in, const dt_spec *out,
                            dt_candidate *cand, int *n, int max) {
  (void)a;
  return view_cands_common(ctx, true, in, out, cand, n, max);
}
static dt_status reshape_cands(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in,
                               const dt_spec *out, dt_candidate *cand, int *n, int max) {
  (void)a;
  return view_cands_common(ctx, false, in, out, cand, n, max);
}

/* ---- kernels -------------------------------------------------------------------- */

static dt_status view_kernel(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                             dt_tensor *const *out) {
  (void)a;
  const dt_array *x = &in[0]->local;
  dt_array *y = &out[0]->local;
  if (x->numel != y->numel || x->dtype != y->dtype)
    return dt_error(ctx, DT_ERR_INTERNAL, "view/reshape",
                    "local input has %lld elements, local output %lld (strategy bug)",
                    (long long)x->numel, (long long)y->numel);
  if (x->numel == 0) return DT_OK;
  /* a contiguous gather: one flat copy on the device */
  const char *name = "view/reshape";
  const int64_t n = x->numel, one = 1;
  dt_kdev kd;
  DT_CHECK(dt_device_kernels(ctx, x->dev, name, &kd));
  DT_OP_KSLOT(ctx, name, kd.k->pw, permute);
  dt_op_kledger(ctx, "copy", x->dtype, 0, n, n, n);
  return kd.k->pw->permute(kd.dev, dt_dtype_size(x->dtype), 1, &n, &one, 0, x->data, y->data);
}

static dt_status perm_kernel_common(dt_ctx *ctx, bool tr, const dt_op_attrs *a,
                                    const dt_tensor *const *in, dt_tensor *const *out) {
  const char *name = tr ? "transpose" : "permute";
  const dt_array *x = &in[0]->local;
  dt_array *y = &out[0]->local;
  int nd = x->ndim, perm[DT_MAX_DIMS];
  DT_CHECK(get_perm(ctx, tr, a, nd, perm));
  int64_t xst[DT_MAX_DIMS], st[DT_MAX_DIMS], s = 1;
  for (int d = nd - 1; d >= 0; d--) {
    xst[d] = s;
    s *= x->shape[d];
  }
  bool ok = y->ndim == nd && y->numel == x->numel && y->dtype == x->dtype;
  for (int k = 0; ok && k < nd; k++) ok = y->shape[k] == x->shape[perm[k]];
  if (!ok)
    return dt_error(ctx, DT_ERR_INTERNAL, name, "local output shape does not match (strategy bug)");
  for (int k = 0; k < nd; k++) st[k] = xst[perm[k]]; /* input stride of output dim k */
  dt_kdev kd;
  DT_CHECK(dt_device_kernels(ctx, x->dev, name, &kd));
  DT_OP_KSLOT(ctx, name, kd.k->pw, permute);
  dt_op_kledger(ctx, "permute", x->dtype, 0, x->numel, x->numel, x->numel);
  return kd.k->pw->permute(kd.dev, dt_dtype_size(x->dtype), nd, y->shape, st, 0, x->data, y->data);
}
static dt_status tr_kernel(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                           dt_tensor *const *out) {
  return perm_kernel_common(ctx, true, a, in, out);
}
static dt_status pm_kernel(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                           dt_tensor *const *out) {
  return perm_kernel_common(ctx, false, a, in, out);
}

/* ---- backward ------------------------------------------------------------------- */

/* no gradient: zeros shaped like x (scale by 0) */
static dt_status zeros_like(dt_ctx *ctx, const dt_tensor *x, dt_tensor *g) {
  dt_op_attrs z;
  memset(&z, 0, sizeof z);
  const dt_tensor *zi[1] = {x};
  dt_tensor *zo[1] = {g};
  return dt_op_call(ctx, &dt_op_scale, &z, zi, zo, NULL);
}

static dt_status view_backward(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                               const dt_tensor *const *out, const dt_tensor *const *gout,
                               dt_tensor *const *gin) {
  (void)a;
  (void)out;
  if (!gin[0]) return DT_OK;
  if (!gout[0]) return zeros_like(ctx, in[0], gin[0]);
  dt_op_attrs b;
  memset(&b, 0, sizeof b);
  b.shape_n = in[0]->ndim;
  for (int d = 0; d < in[0]->ndim; d++) b.shape[d] = in[0]->gshape[d];
  /* reshape, not view: the gradient's layout need not allow a strict view */
  return dt_op_call(ctx, &dt_op_reshape, &b, gout, gin, NULL);
}

static dt_status perm_backward_common(dt_ctx *ctx, bool tr, const dt_op_attrs *a,
                                      const dt_tensor *const *in, const dt_tensor *const *gout,
                                      dt_tensor *const *gin) {
  if (!gin[0]) return DT_OK;
  if (!gout[0]) return zeros_like(ctx, in[0], gin[0]);
  int perm[DT_MAX_DIMS];
  DT_CHECK(get_perm(ctx, tr, a, in[0]->ndim, perm));
  dt_op_attrs b;
  memset(&b, 0, sizeof b);
  b.ndims = in[0]->ndim;
  for (int k = 0; k < b.ndims; k++) b.dims[perm[k]] = k; /* the inverse permutation */
  return dt_op_call(ctx, &dt_op_permute, &b, gout, gin, NULL);
}
static dt_status tr_backward(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                             const dt_tensor *const *out, const dt_tensor *const *gout,
                             dt_tensor *const *gin) {
  (void)out;
  if (!gin[0]) return DT_OK;
  if (!gout[0]) return zeros_like(ctx, in[0], gin[0]);
  return dt_op_call(ctx, &dt_op_transpose, a, gout, gin, NULL); /* a swap is its own inverse */
}
static dt_status pm_backward(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                             const dt_tensor *const *out, const dt_tensor *const *gout,
                             dt_tensor *const *gin) {
  (void)out;
  return perm_backward_common(ctx, false, a, in, gout, gin);
}

/* ---- the ops -------------------------------------------------------------------- */

const dt_op dt_op_view = {.name = "view", .n_in = 1, .n_out = 1, .infer = view_infer,
                          .candidates = view_cands, .kernel = view_kernel,
                          .backward = view_backward,
    .bwd_meta_in = 1, .bwd_meta_out = 1};
const dt_op dt_op_reshape = {.name = "reshape", .n_in = 1, .n_out = 1, .infer = view_infer,
                             .candidates = reshape_cands, .kernel = view_kernel,
                             .backward = view_backward,
    .bwd_meta_in = 1, .bwd_meta_out = 1};
const dt_op dt_op_transpose = {.name = "transpose", .n_in = 1, .n_out = 1, .infer = tr_infer,
                               .options = tr_options, .kernel = tr_kernel,
                               .backward = tr_backward,
    .bwd_meta_in = 1, .bwd_meta_out = 1};
const dt_op dt_op_permute = {.name = "permute", .n_in = 1, .n_out = 1, .infer = pm_infer,
                             .options = pm_options, .kernel = pm_kernel, .backward = pm_backward,
    .bwd_meta_in = 1, .bwd_meta_out = 1};
