/* lib/ops/pointwise.c: element-wise DTensor ops (PyTorch's
 * torch/distributed/tensor/_ops/_pointwise_ops.py: pointwise_strategy,
 * linear_pointwise_ops):
 * add, sub, mul (tensor-tensor, numpy broadcasting), scale (x * scalar), cast (a
 * dtype conversion, placements kept as PyTorch's aten._to_copy: Partial(sum|avg)
 * stays, as scale's; backward casts the gradient back), silu,
 * swiglu (silu(a) * b), a private silu_grad used by silu's backward and a
 * private swiglu_bwd (a, b, g) -> (da, db) that is swiglu's, fused.
 *
 * Strategy: one whole-mesh candidate, as PyTorch's pointwise strategy. It
 * follows the tensor input with the most shards (num_shards: product of the
 * mesh sizes of its Shard dims; ties: larger ndim, then the first arg); the
 * output takes its placements (Shard dims shifted for broadcasting) and the
 * other inputs are mapped to them (a broadcast dim becomes R). Partial by
 * linearity class: scale keeps P(sum|avg); add/sub keep P(sum|avg) when every
 * other operand is R (partitioned locally, R -> P) or the same Partial; mul
 * keeps the followed operand's P(sum|avg) and forces the others to R; silu,
 * swiglu, silu_grad send every Partial to R. A Partial that cannot propagate
 * makes that mesh dim R for everyone. When the candidate would need an
 * unshardable placement (a dim smaller than its shard count) a second, all-R
 * candidate is added so that dispatch always finds one.
 *
 * Kernels: the dt_kern_pw slots of the arrays' device (lib/device/kernels.h:
 * binary with the operands' broadcast strides, scale, silu, swiglu_bwd); the
 * CPU's compute f32 and f64 in double, except f32 silu / swiglu / their
 * gradients, in float on vmath.h's vector exp; the GPU's in f32 for f32 and
 * bf16, f64 for f64. The inputs' dtypes must agree (no promotion). Backward is
 * written with dt_op_call of these ops and dt_op_sum (for broadcast operands),
 * so backward communication is propagated like forward.
 *
 * What it is not: in-place ops, scalar-tensor add (P + 1 is class -1 in
 * PyTorch; not offered here), type promotion (cast is explicit), maximum/minimum.
 */
#include "config.h"

#include <string.h>

#include "ops/ops.h"

typedef enum pw_kind { PW_ADD, PW_SUB, PW_MUL, PW_SCALE, PW_SILU, PW_SWIGLU, PW_SILU_GRAD } pw_kind;

/* PyTorch's linearity classes (linear_pointwise_ops). */
typedef enum lin_class { LIN_NONE = -1, LIN_UNARY = 0, LIN_ADD = 1, LIN_MUL = 2 } lin_class;

/* ---- shape inference --------------------------------------------------------- */

static dt_status check_dtype(dt_ctx *ctx, const char *name, const dt_spec *in, int n) {
  for (int j = 0; j < n; j++) {
    if (in[j].dtype != DT_F32 && in[j].dtype != DT_F64 && in[j].dtype != DT_BF16)
      return dt_error(ctx, DT_ERR_UNSUPPORTED, name, "input %d is %s; only f32, f64 and bf16 are supported",
                      j, dt_dtype_name(in[j].dtype));
    if (in[j].dtype != in[0].dtype)
      return dt_error(ctx, DT_ERR_INVALID, name, "inputs 0 and %d differ in dtype (%s, %s)", j,
                      dt_dtype_name(in[0].dtype), dt_dtype_name(in[j].dtype));
  }
  return DT_OK;
}

/* numpy broadcasting: trailing alignment; a size-1 dim stretches. */
static dt_status bcast_shape(dt_ctx *ctx, const char *name, const dt_spec *in, int n, dt_spec *out) {
  DT_CHECK(check_dtype(ctx, name, in, n));
  int nd = 0;
  for (int j = 0; j < n; j++)
    if (in[j].ndim > nd) nd = in[j].ndim;
  out->ndim = nd;
  out->dtype = in[0].dtype;
  for (int D = 0; D < nd; D++) {
    int64_t size = 1;
    for (int j = 0; j < n; j++) {
      int d = D - (nd - in[j].ndim);
      if (d < 0 || in[j].gshape[d] == 1) continue;
      if (size == 1)
        size = in[j].gshape[d];
      else if (size != in[j].gshape[d])
        return dt_error(ctx, DT_ERR_INVALID, name,
                        "shapes do not broadcast: output dim %d is %lld, input %d has %lld", D,
                        (long long)size, j, (long long)in[j].gshape[d]);
    }
    out->gshape[D] = size;
  }
  return DT_OK;
}

static dt_status infer_unary(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in, dt_spec *out) {
  (void)a;
  return bcast_shape(ctx, "pointwise", in, 1, out);
}

static dt_status infer_binary(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in, dt_spec *out) {
  (void)a;
  return bcast_shape(ctx, "pointwise", in, 2, out);
}

static dt_status infer_same(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in, dt_spec *out) {
  (void)a;
  bool same = in[0].ndim == in[1].ndim;
  for (int d = 0; same && d < in[0].ndim; d++) same = in[0].gshape[d] == in[1].gshape[d];
  if (!same) return dt_error(ctx, DT_ERR_INVALID, "swiglu", "a and b must have the same shape");
  return bcast_shape(ctx, "swiglu", in, 2, out);
}

/* ---- strategy ---------------------------------------------------------------- */

static int64_t num_shards(const dt_spec *s) {
  int64_t n = 1;
  for (int i = 0; i < s->mesh_ndim; i++)
    if (s->pl[i].kind == DT_PL_SHARD) n *= s->mesh_shape[i] > 0 ? s->mesh_shape[i] : 1;
  return n;
}

static int pick_follow(const dt_spec *in, int n) {
  int best = 0;
  for (int j = 1; j < n; j++) {
    int64_t a = num_shards(&in[j]), b = num_shards(&in[best]);
    if (a > b || (a == b && in[j].ndim > in[best].ndim)) best = j;
  }
  return best;
}

static bool is_linear_partial(dt_placement p) {
  return p.kind == DT_PL_PARTIAL && (p.op == DT_RED_SUM || p.op == DT_RED_AVG);
}

/* An output placement as input x sees it: a Shard of a dim x lacks or
 * broadcasts becomes R (PyTorch's map_placements_after_broadcast). */
static dt_placement map_to_input(dt_placement p, const dt_spec *out, const dt_spec *x) {
  if (p.kind != DT_PL_SHARD) return p;
  int d = p.dim - (out->ndim - x->ndim);
  if (d < 0 || (x->gshape[d] == 1 && out->gshape[p.dim] != 1)) return dt_replicate();
  return dt_shard(d);
}

static void follow_candidate(const dt_spec *in, int n, const dt_spec *out, lin_class lc,
                             dt_candidate *c) {
  memset(c, 0, sizeof *c);
  int f = pick_follow(in, n);
  int off = out->ndim - in[f].ndim;
  for (int i = 0; i < in[0].mesh_ndim; i++) {
    dt_placement p = in[f].pl[i], o = dt_replicate();
    if (p.kind == DT_PL_SHARD) {
      /* a Shard of a broadcast (size-1) dim cannot shard the stretched output */
      if (!(in[f].gshape[p.dim] == 1 && out->gshape[p.dim + off] != 1)) o = dt_shard(p.dim + off);
    } else if (p.kind == DT_PL_PARTIAL && lc != LIN_NONE && is_linear_partial(p)) {
      o = p;
      if (lc == LIN_ADD)
        for (int j = 0; j < n; j++) {
          dt_placement q = in[j].pl[i];
          if (j != f && q.kind != DT_PL_REPLICATE && !dt_placement_eq(q, p)) o = dt_replicate();
        }
    }
    c->out[0][i] = o;
    for (int j = 0; j < n; j++) {
      if (o.kind == DT_PL_PARTIAL)
        c->in[j][i] = (j == f || lc != LIN_MUL) ? o : dt_replicate();
      else
        c->in[j][i] = map_to_input(o, out, &in[j]);
    }
  }
}

static dt_status pw_candidates(const dt_spec *in, int n, const dt_spec *out, lin_class lc,
                               dt_candidate *cand, int *nc, int max) {
  if (max < 2) return DT_ERR_INVALID;
  follow_candidate(in, n, out, lc, &cand[0]);
  *nc = 1;
  const int *ms = in[0].mesh_shape;
  bool ok = dt_spec_shardable(out, ms, cand[0].out[0]);
  for (int j = 0; j < n && ok; j++) ok = dt_spec_shardable(&in[j], ms, cand[0].in[j]);
  if (!ok) { /* the dispatcher would drop it: offer all-Replicate too */
    dt_candidate *c = &cand[1];
    memset(c, 0, sizeof *c);
    for (int i = 0; i < in[0].mesh_ndim; i++) {
      c->out[0][i] = dt_replicate();
      for (int j = 0; j < n; j++) c->in[j][i] = dt_replicate();
    }
    *nc = 2;
  }
  return DT_OK;
}

#define PW_CANDS(fn, n, lc)                                                                  \
  static dt_status fn(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in, const dt_spec *out, \
                      dt_candidate *cand, int *nc, int max) {                                \
    (void)a;                                                                                 \
    dt_status s_ = pw_candidates(in, n, out, lc, cand, nc, max);                             \
    return s_ == DT_OK ? s_ : dt_error(ctx, s_, "pointwise", "no room for candidates");     \
  }
PW_CANDS(cands_add, 2, LIN_ADD)
PW_CANDS(cands_mul, 2, LIN_MUL)
PW_CANDS(cands_unary_linear, 1, LIN_UNARY)
PW_CANDS(cands_unary_nonlinear, 1, LIN_NONE)
PW_CANDS(cands_binary_nonlinear, 2, LIN_NONE)

/* ---- kernels ----------------------------------------------------------------- */

/* y = k(x0, x1) on the local arrays, by the device's dt_kern_pw slots (scale,
 * silu, binary); an operand's size-1 dim (or a dim it lacks) is read at index 0
 * (broadcast: such a dim is R, so its local is 1), a stride of 0 in binary. */
static dt_status pw_run(dt_ctx *ctx, pw_kind k, double sc, const dt_tensor *const *in, int n,
                        dt_tensor *out) {
  const char *name = "pointwise";
  dt_array *y = &out->local;
  const int nd = y->ndim;
  const int64_t *ys = y->shape;
  int64_t st[2][DT_MAX_DIMS];
  memset(st, 0, sizeof st);
  for (int j = 0; j < n; j++) {
    const dt_array *x = &in[j]->local;
    int off = nd - x->ndim;
    int64_t s = 1;
    for (int D = nd - 1; D >= 0; D--) {
      int d = D - off;
      if (d < 0) continue;
      if (x->shape[d] == ys[D])
        st[j][D] = s;
      else if (x->shape[d] != 1)
        return dt_error(ctx, DT_ERR_INTERNAL, name,
                        "local shapes disagree: input %d dim %d is %lld, output dim %d is %lld", j,
                        d, (long long)x->shape[d], D, (long long)ys[D]);
      s *= x->shape[d];
    }
  }
  dt_kdev kd;
  DT_CHECK(dt_device_kernels(ctx, y->dev, name, &kd));
  const dt_kern_pw *K = kd.k->pw;
  const void *x0 = in[0]->local.data;
  if (k == PW_SCALE) {
    DT_OP_KSLOT(ctx, name, K, scale);
    dt_op_kledger(ctx, "scale", y->dtype, 1, y->numel, y->numel, y->numel);
    return K->scale(kd.dev, y->dtype, y->numel, sc, x0, y->data);
  }
  if (k == PW_SILU) {
    DT_OP_KSLOT(ctx, name, K, silu);
    dt_op_kledger(ctx, "silu", y->dtype, 4, y->numel, y->numel, y->numel);
    return K->silu(kd.dev, y->dtype, y->numel, x0, y->data);
  }
  if (n != 2) return dt_error(ctx, DT_ERR_INTERNAL, name, "binary kind with %d operands", n);
  dt_pw_op op = k == PW_ADD ? DT_PW_ADD : k == PW_SUB ? DT_PW_SUB : k == PW_MUL ? DT_PW_MUL
              : k == PW_SWIGLU ? DT_PW_SWIGLU : DT_PW_SILU_GRAD;
  DT_OP_KSLOT(ctx, name, K, binary);
  static const char *const BIN[] = {"add", "sub", "mul", "swiglu", "silu_grad"};
  static const double BIN_FLOPS[] = {1, 1, 1, 5, 8};
  dt_op_kledger(ctx, BIN[op], y->dtype, BIN_FLOPS[op], y->numel,
                in[0]->local.numel + in[1]->local.numel, y->numel);
  return K->binary(kd.dev, y->dtype, op, nd, ys, x0, st[0], in[1]->local.data, st[1], y->data);
}

#define PW_KERNEL(fn, kind, n)                                                                    \
  static dt_status fn(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,              \
                      dt_tensor *const *out) {                                                    \
    return pw_run(ctx, kind, a->scalar, in, n, out[0]);                                           \
  }
PW_KERNEL(k_add, PW_ADD, 2)
PW_KERNEL(k_sub, PW_SUB, 2)
PW_KERNEL(k_mul, PW_MUL, 2)
PW_KERNEL(k_scale, PW_SCALE, 1)
PW_KERNEL(k_silu, PW_SILU, 1)
PW_KERNEL(k_swiglu, PW_SWIGLU, 2)
PW_KERNEL(k_silu_grad, PW_SILU_GRAD, 2)

/* cast: y = x converted to y's dtype by the device's cast slot (bf16 rounds to
 * nearest even); the ledger row is memory traffic only. */
static dt_status k_cast(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                        dt_tensor *const *out) {
  (void)a;
  const dt_array *x = &in[0]->local;
  dt_array *y = &out[0]->local;
  dt_kdev kd;
  DT_CHECK(dt_device_kernels(ctx, y->dev, "cast", &kd));
  DT_OP_KSLOT(ctx, "cast", kd.k->pw, cast);
  dt_kledger_kernel(ctx, "cast", y->dtype, 0, (uint64_t)dt_array_bytes(x),
                    (uint64_t)dt_array_bytes(y));
  return kd.k->pw->cast(kd.dev, x->dtype, x->data, y->dtype, y->data, y->numel);
}

static dt_status infer_cast(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in, dt_spec *out) {
  DT_CHECK(bcast_shape(ctx, "cast", in, 1, out));
  const dt_dtype td = (dt_dtype)a->i0;
  if (td != DT_F32 && td != DT_F64 && td != DT_BF16)
    return dt_error(ctx, DT_ERR_INVALID, "cast", "target dtype %d is not f32, f64 or bf16", a->i0);
  out->dtype = td;
  return DT_OK;
}

/* silu_grad(x, g) = g * silu'(x): only the backward of silu and swiglu uses it. */
static const dt_op op_silu_grad = {.name = "silu_grad", .n_in = 2, .n_out = 1,
                                   .infer = infer_binary, .candidates = cands_binary_nonlinear,
                                   .kernel = k_silu_grad};

/* ---- backward ---------------------------------------------------------------- */

static dt_status call1(dt_ctx *ctx, const dt_op *op, const dt_op_attrs *a, const dt_tensor *x,
                       dt_tensor *out) {
  const dt_tensor *in[1] = {x};
  dt_tensor *o[1] = {out};
  return dt_op_call(ctx, op, a, in, o, NULL);
}

static dt_status call2(dt_ctx *ctx, const dt_op *op, const dt_tensor *x, const dt_tensor *y,
                       dt_tensor *out) {
  dt_op_attrs a;
  memset(&a, 0, sizeof a); /* the attrs are a cache key: no stray bytes */
  const dt_tensor *in[2] = {x, y};
  dt_tensor *o[1] = {out};
  return dt_op_call(ctx, op, &a, in, o, NULL);
}

static dt_status scale_by(dt_ctx *ctx, const dt_tensor *x, double s, dt_tensor *out) {
  dt_op_attrs a;
  memset(&a, 0, sizeof a);
  a.scalar = s;
  return call1(ctx, &dt_op_scale, &a, x, out);
}

/* out = g summed over the dims that broadcasting stretched to reach x's shape
 * (x's size-1 dims keep size 1, dims x lacks are dropped), times s. */
static dt_status reduce_to(dt_ctx *ctx, const dt_tensor *g, const dt_tensor *x, double s,
                           dt_tensor *out) {
  int off = g->ndim - x->ndim;
  dt_op_attrs a;
  memset(&a, 0, sizeof a);
  a.keepdim = true;
  for (int d = 0; d < x->ndim; d++)
    if (x->gshape[d] == 1 && g->gshape[d + off] != 1) a.dims[a.ndims++] = d + off;
  dt_tensor t1, t2;
  const dt_tensor *cur = g;
  dt_status st = DT_OK;
  bool own1 = false, own2 = false;
  if (a.ndims > 0) {
    DT_CHECK(call1(ctx, &dt_op_sum, &a, g, &t1));
    cur = &t1;
    own1 = true;
  }
  if (off > 0) {
    dt_op_attrs b;
    memset(&b, 0, sizeof b);
    b.ndims = off;
    for (int d = 0; d < off; d++) b.dims[d] = d;
    DT_CHECK_GOTO(call1(ctx, &dt_op_sum, &b, cur, &t2), st, done);
    cur = &t2;
    own2 = true;
  }
  if (s == 1.0 && (own1 || own2)) { /* move the last result into out */
    *out = *cur;
    if (own2) own2 = false; else own1 = false;
  } else {
    st = scale_by(ctx, cur, s, out);
  }
done:
  if (own1) dt_tensor_free(ctx, &t1);
  if (own2) dt_tensor_free(ctx, &t2);
  return st;
}

static dt_status bw_add_sub(dt_ctx *ctx, const dt_tensor *const *in, const dt_tensor *g,
                            dt_tensor *const *gin, double sign_b) {
  for (int j = 0; j < 2; j++) {
    if (!gin[j]) continue;
    if (!g)
      DT_CHECK(scale_by(ctx, in[j], 0.0, gin[j]));
    else
      DT_CHECK(reduce_to(ctx, g, in[j], j == 1 ? sign_b : 1.0, gin[j]));
  }
  return DT_OK;
}

static dt_status b_add(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                       const dt_tensor *const *out, const dt_tensor *const *gout,
                       dt_tensor *const *gin) {
  (void)a;
  (void)out;
  return bw_add_sub(ctx, in, gout[0], gin, 1.0);
}

static dt_status b_sub(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                       const dt_tensor *const *out, const dt_tensor *const *gout,
                       dt_tensor *const *gin) {
  (void)a;
  (void)out;
  return bw_add_sub(ctx, in, gout[0], gin, -1.0);
}

static dt_status b_mul(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                       const dt_tensor *const *out, const dt_tensor *const *gout,
                       dt_tensor *const *gin) {
  (void)a;
  (void)out;
  for (int j = 0; j < 2; j++) {
    if (!gin[j]) continue;
    if (!gout[0]) {
      DT_CHECK(scale_by(ctx, in[j], 0.0, gin[j]));
      continue;
    }
    dt_tensor t;
    DT_CHECK(call2(ctx, &dt_op_mul, gout[0], in[1 - j], &t));
    dt_status s = reduce_to(ctx, &t, in[j], 1.0, gin[j]);
    dt_tensor_free(ctx, &t);
    DT_CHECK(s);
  }
  return DT_OK;
}

static dt_status b_scale(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                         const dt_tensor *const *out, const dt_tensor *const *gout,
                         dt_tensor *const *gin) {
  (void)out;
  if (!gin[0]) return DT_OK;
  if (!gout[0]) return scale_by(ctx, in[0], 0.0, gin[0]);
  return scale_by(ctx, gout[0], a->scalar, gin[0]);
}

static dt_status b_silu(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                        const dt_tensor *const *out, const dt_tensor *const *gout,
                        dt_tensor *const *gin) {
  (void)a;
  (void)out;
  if (!gin[0]) return DT_OK;
  if (!gout[0]) return scale_by(ctx, in[0], 0.0, gin[0]);
  return call2(ctx, &op_silu_grad, in[0], gout[0], gin[0]);
}

/* cast's backward: the gradient cast back to the input's dtype. */
static dt_status b_cast(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                        const dt_tensor *const *out, const dt_tensor *const *gout,
                        dt_tensor *const *gin) {
  (void)a;
  (void)out;
  if (!gin[0]) return DT_OK;
  if (!gout[0]) return scale_by(ctx, in[0], 0.0, gin[0]);
  dt_op_attrs c;
  memset(&c, 0, sizeof c);
  c.i0 = (int)in[0]->dtype;
  return call1(ctx, &dt_op_cast, &c, gout[0], gin[0]);
}

/* swiglu_bwd(a, b, g) -> (da, db) = (g b silu'(a), g silu(a)) in one pass: the
 * sigmoid once per element, no temporaries (the unfused form is mul,
 * silu_grad, silu, mul: four passes and two temporaries). a, b, g one shape. */
static dt_status sgb_infer(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in, dt_spec *out) {
  (void)a;
  for (int j = 1; j < 3; j++) {
    bool same = in[j].ndim == in[0].ndim;
    for (int d = 0; same && d < in[0].ndim; d++) same = in[j].gshape[d] == in[0].gshape[d];
    if (!same) return dt_error(ctx, DT_ERR_INVALID, "swiglu_bwd", "input %d differs in shape from a", j);
  }
  DT_CHECK(bcast_shape(ctx, "swiglu_bwd", in, 3, &out[0]));
  out[1] = out[0];
  return DT_OK;
}

static dt_status sgb_candidates(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in,
                                const dt_spec *out, dt_candidate *cand, int *nc, int max) {
  (void)a;
  dt_status s = pw_candidates(in, 3, out, LIN_NONE, cand, nc, max);
  if (s != DT_OK) return dt_error(ctx, s, "swiglu_bwd", "no room for candidates");
  for (int c = 0; c < *nc; c++) memcpy(cand[c].out[1], cand[c].out[0], sizeof cand[c].out[0]);
  return DT_OK;
}

static dt_status sgb_kernel(dt_ctx *ctx, const dt_op_attrs *at, const dt_tensor *const *in,
                            dt_tensor *const *out) {
  (void)at;
  const char *name = "swiglu_bwd";
  const int64_t n = out[0]->local.numel;
  if (out[1]->local.numel != n || in[0]->local.numel != n || in[1]->local.numel != n ||
      in[2]->local.numel != n)
    return dt_error(ctx, DT_ERR_INTERNAL, name, "local sizes differ");
  dt_kdev kd;
  DT_CHECK(dt_device_kernels(ctx, out[0]->local.dev, name, &kd));
  DT_OP_KSLOT(ctx, name, kd.k->pw, swiglu_bwd);
  dt_op_kledger(ctx, "swiglu_bwd", out[0]->local.dtype, 11, n, 3 * n, 2 * n);
  return kd.k->pw->swiglu_bwd(kd.dev, out[0]->local.dtype, n, in[0]->local.data,
                              in[1]->local.data, in[2]->local.data, out[0]->local.data,
                              out[1]->local.data);
}

static const dt_op op_swiglu_bwd = {.name = "swiglu_bwd", .n_in = 3, .n_out = 2, .infer = sgb_infer,
                                    .candidates = sgb_candidates, .kernel = sgb_kernel};

/* swiglu(a, b) = silu(a) * b: da = silu'(a) * (g * b), db = g * silu(a). */
static dt_status b_swiglu(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,
                          const dt_tensor *const *out, const dt_tensor *const *gout,
                          dt_tensor *const *gin) {
  (void)out;
  const dt_tensor *g = gout[0];
  if (!g) {
    for (int j = 0; j < 2; j++)
      if (gin[j]) DT_CHECK(scale_by(ctx, in[j], 0.0, gin[j]));
    return DT_OK;
  }
  if (!gin[0] && !gin[1]) return DT_OK;
  const dt_tensor *bi[3] = {in[0], in[1], g};
  dt_tensor d[2];
  dt_tensor *bo[2] = {&d[0], &d[1]};
  DT_CHECK(dt_op_call(ctx, &op_swiglu_bwd, a, bi, bo, NULL));
  for (int j = 0; j < 2; j++) {
    if (gin[j]) *gin[j] = d[j];
    else dt_tensor_free(ctx, &d[j]);
  }
  return DT_OK;
}

/* ---- the ops ----------------------------------------------------------------- */

const dt_op dt_op_add = {.name = "add", .n_in = 2, .n_out = 1, .infer = infer_binary,
                         .candidates = cands_add, .kernel = k_add, .backward = b_add,
    .bwd_meta_in = 3, .bwd_meta_out = 1};
const dt_op dt_op_sub = {.name = "sub", .n_in = 2, .n_out = 1, .infer = infer_binary,
                         .candidates = cands_add, .kernel = k_sub, .backward = b_sub,
    .bwd_meta_in = 3, .bwd_meta_out = 1};
const dt_op dt_op_mul = {.name = "mul", .n_in = 2, .n_out = 1, .infer = infer_binary,
                         .candidates = cands_mul, .kernel = k_mul, .backward = b_mul,
    .bwd_meta_out = 1};
/* attrs.scalar: the factor */
const dt_op dt_op_scale = {.name = "scale", .n_in = 1, .n_out = 1, .infer = infer_unary,
                           .candidates = cands_unary_linear, .kernel = k_scale,
                           .backward = b_scale,
    .bwd_meta_in = 1, .bwd_meta_out = 1};
/* attrs.i0: the target dtype (dt_dtype: f32, f64, bf16) */
const dt_op dt_op_cast = {.name = "cast", .n_in = 1, .n_out = 1, .infer = infer_cast,
                          .candidates = cands_unary_linear, .kernel = k_cast,
                          .backward = b_cast,
    .bwd_meta_in = 1, .bwd_meta_out = 1};
const dt_op dt_op_silu = {.name = "silu", .n_in = 1, .n_out = 1, .infer = infer_unary,
                          .candidates = cands_unary_nonlinear, .kernel = k_silu,
                          .backward = b_silu,
    .bwd_meta_out = 1};
const dt_op dt_op_swiglu = {.name = "swiglu", .n_in = 2, .n_out = 1, .infer = infer_same,
                            .candidates = cands_binary_nonlinear, .kernel = k_swiglu,
                            .backward = b_swiglu,
    .bwd_meta_out = 1};
