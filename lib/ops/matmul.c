/* lib/ops/matmul.c: the matmul family as DTensor ops: einsum (two operands),
 * matmul (x[..., m, k] @ y[..., k, n]) and linear (x[..., k] with W[n, k], no
 * bias), all on one engine.
 *
 * Strategies are PyTorch's gen_einsum_strategies (torch/distributed/tensor/
 * _ops/_einsum_strategy.py, used by _ops/_matrix_ops.py for mm, bmm, einsum),
 * given per mesh dim through the options slot (the dispatcher expands them over
 * the mesh and drops unshardable ones), in generation order: all R; each batch
 * letter S everywhere; each contracting letter out P(sum), inputs S; each
 * lhs-free letter [S, S, R]; each rhs-free letter [S, R, S]; letters sorted
 * within a category. Added, as PyTorch's newer per-input linearity: when an
 * input is already P(sum) or P(avg) on that mesh dim, [P, P, R] (input 0) or
 * [P, R, P] (input 1). They are generated only then (an R or S input never
 * gains by becoming Partial, and the extra options would push 5-D meshes past
 * DT_OP_MAX_CANDIDATES), so PyTorch's strategy counts (test_op_strategy.py,
 * TestEinsumStrategies: mk,kn->mn 4 on a 1-D mesh, 16 on a 2-D one) hold for
 * non-Partial inputs. The all-P option of linearity=True is not generated.
 *
 * The kernel maps the local einsum onto one strided-batched GEMM
 * (dt_device_gemm of the arrays' device: cblas on the CPU, cuBLAS on cuda):
 * operands already laid out as [batch, free, contract] (or transposed) are used
 * in place, others are permuted into a temporary of the same device first (its
 * permute slot, so nothing leaves the device); equations with a letter in one
 * input only (summed there) run the device's naive contract slot (the CPU's
 * accumulates in double). Any dtype dt_device_gemm takes (the CPU's bf16 ops
 * reach it as f32, lib/device/kernels.h bf16_as_f32).
 *
 * Backward is written with dt_op_call on einsum with derived equations, so
 * gradients propagate shardings like forward.
 *
 * What it is not: no implicit-output or ellipsis equations, no repeated letters
 * within an operand (diagonals), no broadcasting of size-1 dims, no bias.
 */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "device/device.h"
#include "ops/ops.h"

/* ---- equations ---- */

enum { NLET = 26 };

typedef struct eqn {
  int n[3];                   /* letters of A, B, C */
  char l[3][DT_MAX_DIMS + 1]; /* the letters, NUL-terminated */
} eqn;

/* Where letter c sits in operand o (-1: absent). */
static int pos_of(const eqn *e, int o, char c) {
  for (int i = 0; i < e->n[o]; i++)
    if (e->l[o][i] == c) return i;
  return -1;
}

static dt_status parse_eq(dt_ctx *ctx, const char *call, const char *s, eqn *e) {
  memset(e, 0, sizeof *e);
  int o = 0;
  const char *p = s;
  for (;; p++) {
    char c = *p;
    if (c >= 'a' && c <= 'z') {
      if (e->n[o] >= DT_MAX_DIMS)
        return dt_error(ctx, DT_ERR_INVALID, call,
                        "equation \"%s\": operand %d has more than %d dims", s, o, DT_MAX_DIMS);
      if (pos_of(e, o, c) >= 0)
        return dt_error(ctx, DT_ERR_INVALID, call,
                        "equation \"%s\": letter '%c' repeated in operand %d (no diagonals)", s, c,
                        o);
      e->l[o][e->n[o]++] = c;
    } else if (c == ',' && o == 0) {
      o = 1;
    } else if (c == '-' && p[1] == '>' && o == 1) {
      o = 2;
      p++;
    } else if (c == '\0' && o == 2) {
      break;
    } else {
      return dt_error(
          ctx, DT_ERR_INVALID, call,
          "equation \"%s\": expected \"ab,bc->ac\" (two operands, letters a-z, explicit output)",
          s);
    }
  }
  for (int i = 0; i < e->n[2]; i++)
    if (pos_of(e, 0, e->l[2][i]) < 0 && pos_of(e, 1, e->l[2][i]) < 0)
      return dt_error(ctx, DT_ERR_INVALID, call, "equation \"%s\": output letter '%c' in no input",
                      s, e->l[2][i]);
  return DT_OK;
}

/* The parts one after another in buf (n > 0 bytes), cut to fit, NUL-terminated:
 * snprintf's "%s%s..." without its format parsing (these run on every call). */
static void join(char *buf, size_t n, const char *const *parts, int np) {
  size_t u = 0;
  for (int i = 0; i < np && u + 1 < n; i++) {
    size_t l = strlen(parts[i]);
    if (l > n - 1 - u) l = n - 1 - u;
    memcpy(buf + u, parts[i], l);
    u += l;
  }
  buf[u] = '\0';
}

/* The einsum equation an op computes, in buf (size 32 as dt_op_attrs.eq). */
typedef enum { K_EINSUM, K_MATMUL, K_LINEAR } op_kind;

static dt_status op_eq(dt_ctx *ctx, op_kind kind, const dt_op_attrs *a, const dt_spec *in,
                       char *buf, size_t bn) {
  if (kind == K_EINSUM) {
    if (memchr(a->eq, '\0', sizeof a->eq) == NULL)
      return dt_error(ctx, DT_ERR_INVALID, "einsum", "equation not NUL-terminated");
    join(buf, bn, (const char *const[]){a->eq}, 1);
    return DT_OK;
  }
  if (kind == K_MATMUL) {
    int r = in[0].ndim;
    if (r < 2 || r > DT_MAX_DIMS || in[1].ndim != r)
      return dt_error(ctx, DT_ERR_INVALID, "matmul",
                      "x has %d dims and y %d: both need the same rank >= 2", in[0].ndim,
                      in[1].ndim);
    /* batch letters a.. (at most DT_MAX_DIMS - 2 = 6: a-f, clear of k, m, n) */
    char b[DT_MAX_DIMS + 1];
    for (int i = 0; i < r - 2; i++) b[i] = (char)('a' + i);
    b[r - 2] = '\0';
    join(buf, bn, (const char *const[]){b, "mk,", b, "kn->", b, "mn"}, 6);
    return DT_OK;
  }
  int r = in[0].ndim;
  if (r < 1 || r > DT_MAX_DIMS || in[1].ndim != 2)
    return dt_error(ctx, DT_ERR_INVALID, "linear",
                    "x has %d dims and W %d: need x[..., k], W[n, k]", in[0].ndim, in[1].ndim);
  /* leading letters a.. (at most 7: a-g, clear of k and n) */
  char b[DT_MAX_DIMS + 1];
  for (int i = 0; i < r - 1; i++) b[i] = (char)('a' + i);
  b[r - 1] = '\0';
  join(buf, bn, (const char *const[]){b, "k,nk->", b, "n"}, 4);
  return DT_OK;
}

static dt_status op_parse(dt_ctx *ctx, op_kind kind, const char *call, const dt_op_attrs *a,
                          const dt_spec *in, eqn *e) {
  char eq[64]; /* > 3 * DT_MAX_DIMS + 3: room for any built equation */
  DT_CHECK(op_eq(ctx, kind, a, in, eq, sizeof eq));
  return parse_eq(ctx, call, eq, e);
}

/* ---- infer ---- */

static dt_status infer_common(dt_ctx *ctx, op_kind kind, const char *call, const dt_op_attrs *a,
                              const dt_spec *in, dt_spec *out) {
  eqn e;
  DT_CHECK(op_parse(ctx, kind, call, a, in, &e));
  for (int o = 0; o < 2; o++)
    if (in[o].ndim != e.n[o])
      return dt_error(ctx, DT_ERR_INVALID, call, "input %d has %d dims, equation operand \"%s\" %d",
                      o, in[o].ndim, e.l[o], e.n[o]);
  if (in[0].dtype != in[1].dtype)
    return dt_error(ctx, DT_ERR_INVALID, call, "dtypes differ: %s and %s",
                    dt_dtype_name(in[0].dtype), dt_dtype_name(in[1].dtype));
  if (in[0].dtype != DT_F32 && in[0].dtype != DT_F64 && in[0].dtype != DT_BF16)
    return dt_error(ctx, DT_ERR_INVALID, call, "dtype %s (f32, f64 and bf16 only)",
                    dt_dtype_name(in[0].dtype));
  for (int i = 0; i < e.n[0]; i++) {
    int j = pos_of(&e, 1, e.l[0][i]);
    if (j >= 0 && in[0].gshape[i] != in[1].gshape[j])
      return dt_error(ctx, DT_ERR_INVALID, call,
                      "'%c' is %lld in input 0 (dim %d) but %lld in input 1 (dim %d)", e.l[0][i],
                      (long long)in[0].gshape[i], i, (long long)in[1].gshape[j], j);
  }
  out->ndim = e.n[2];
  out->dtype = in[0].dtype;
  for (int i = 0; i < e.n[2]; i++) {
    int j = pos_of(&e, 0, e.l[2][i]);
    out->gshape[i] = j >= 0 ? in[0].gshape[j] : in[1].gshape[pos_of(&e, 1, e.l[2][i])];
  }
  return DT_OK;
}

/* ---- strategies ---- */

static dt_placement pl_at(const eqn *e, int o, char c) {
  int p = pos_of(e, o, c);
  return p >= 0 ? dt_shard(p) : dt_replicate();
}

static bool linear_partial(dt_placement p) {
  return p.kind == DT_PL_PARTIAL && (p.op == DT_RED_SUM || p.op == DT_RED_AVG);
}

static dt_status options_common(dt_ctx *ctx, op_kind kind, const char *call, const dt_op_attrs *a,
                                const dt_spec *in, int mesh_dim, dt_dim_option *opt, int *n,
                                int max) {
  eqn e;
  DT_CHECK(op_parse(ctx, kind, call, a, in, &e));
  int k = 0;
  dt_dim_option o;
#define PUSH()                                                                                 \
  do {                                                                                         \
    if (k >= max) return dt_error(ctx, DT_ERR_UNSUPPORTED, call, "more than %d options", max); \
    opt[k++] = o;                                                                              \
  } while (0)
  memset(&o, 0, sizeof o);
  o.out[0] = o.in[0] = o.in[1] = dt_replicate();
  PUSH(); /* 1. all R */
  for (int cat = 2; cat <= 5; cat++) {
    for (char c = 'a'; c <= 'z'; c++) {
      bool ia = pos_of(&e, 0, c) >= 0, ib = pos_of(&e, 1, c) >= 0, ic = pos_of(&e, 2, c) >= 0;
      if (!ia && !ib) continue;
      bool take = (cat == 2 && ia && ib && ic) || (cat == 3 && !ic) ||
                  (cat == 4 && ia && !ib && ic) || (cat == 5 && ib && !ia && ic);
      if (!take) continue;
      o.out[0] = cat == 3 ? dt_partial(DT_RED_SUM) : pl_at(&e, 2, c);
      o.in[0] = pl_at(&e, 0, c);
      o.in[1] = pl_at(&e, 1, c);
      PUSH();
    }
  }
  /* per-input linearity, only for an input already Partial on this mesh dim */
  for (int j = 0; j < 2; j++) {
    dt_placement p = in[j].pl[mesh_dim];
    if (!linear_partial(p)) continue;
    o.out[0] = p;
    o.in[j] = p;
    o.in[1 - j] = dt_replicate();
    PUSH();
  }
#undef PUSH
  *n = k;
  return DT_OK;
}

/* ---- kernel ---- */

/* dst (letters dl, a permutation of sl) from src (letters sl, shape ss) on the
 * device kd: its permute slot; es: element bytes. */
static dt_status permute_to(dt_ctx *ctx, dt_kdev *kd, const char *call, size_t es, int nd,
                            const char *sl, const int64_t *ss, const void *src, const char *dl,
                            void *dst) {
  int64_t dshape[DT_MAX_DIMS], sstride[DT_MAX_DIMS], map[DT_MAX_DIMS], st = 1;
  for (int i = nd - 1; i >= 0; i--) {
    sstride[i] = st;
    st *= ss[i];
  }
  for (int i = 0; i < nd; i++) {
    int p = (int)(strchr(sl, dl[i]) - sl);
    dshape[i] = ss[p];
    map[i] = sstride[p];
  }
  DT_OP_KSLOT(ctx, call, kd->k->pw, permute);
  uint64_t bytes = es;
  for (int i = 0; i < nd; i++) bytes *= (uint64_t)dshape[i];
  dt_kledger_kernel(ctx, "permute", DT_F32, 0, bytes, bytes);
  return kd->k->pw->permute(kd->dev, es, nd, dshape, map, 0, src, dst);
}

/* A temporary like array a, in a's memory (tmp->data NULL on failure, error
 * recorded). */
static dt_status tmp_like(dt_ctx *ctx, const dt_array *a, dt_array *tmp) {
  memset(tmp, 0, sizeof *tmp);
  int64_t n = a->numel;
  return dt_array_create(ctx, a->dev, a->dtype, 1, &n, tmp);
}

/* Operand a (labels sl) copied into a new temporary *tmp laid out as dl. */
static dt_status relayout(dt_ctx *ctx, dt_kdev *kd, const char *call, size_t es, int nd,
                          const char *sl, const dt_array *a, const char *dl, dt_array *tmp) {
  DT_CHECK(tmp_like(ctx, a, tmp));
  return permute_to(ctx, kd, call, es, nd, sl, a->shape, a->data, dl, tmp->data);
}

/* The naive einsum on the device's contract slot: every output element a sum
 * over the other letters (in alphabetical order, row-major). */
static dt_status naive_einsum(dt_ctx *ctx, dt_kdev *kd, const char *call, const eqn *e,
                              const int64_t *size, dt_dtype t, const void *A, const void *B,
                              void *C) {
  int64_t strd[3][NLET];
  memset(strd, 0, sizeof strd);
  for (int o = 0; o < 3; o++) {
    int64_t st = 1;
    for (int i = e->n[o] - 1; i >= 0; i--) {
      strd[o][e->l[o][i] - 'a'] = st;
      st *= size[e->l[o][i] - 'a'];
    }
  }
  int64_t on[DT_MAX_DIMS], oa[DT_MAX_DIMS], ob[DT_MAX_DIMS];
  int64_t sn[DT_KERN_MAX_SUM], sa[DT_KERN_MAX_SUM], sb[DT_KERN_MAX_SUM];
  for (int i = 0; i < e->n[2]; i++) {
    int L = e->l[2][i] - 'a';
    on[i] = size[L], oa[i] = strd[0][L], ob[i] = strd[1][L];
  }
  int ns = 0;
  for (char c = 'a'; c <= 'z'; c++) {
    int L = c - 'a';
    if (size[L] < 0 || pos_of(e, 2, c) >= 0) continue;
    if (ns >= DT_KERN_MAX_SUM)
      return dt_error(ctx, DT_ERR_INTERNAL, call, "more than %d summed letters", DT_KERN_MAX_SUM);
    sn[ns] = size[L], sa[ns] = strd[0][L], sb[ns] = strd[1][L];
    ns++;
  }
  DT_OP_KSLOT(ctx, call, kd->k->pw, contract);
  {
    /* a multiply-add per (output element, summed index) */
    double no = 1, nsum = 1;
    for (int i = 0; i < e->n[2]; i++) no *= (double)on[i];
    for (int i = 0; i < ns; i++) nsum *= (double)sn[i];
    const uint64_t es = dt_dtype_size(t);
    dt_kledger_kernel(ctx, "contract", t, 2 * no * nsum, (uint64_t)(2 * no * nsum) * es,
                      (uint64_t)no * es);
  }
  return kd->k->pw->contract(kd->dev, t, e->n[2], on, oa, ob, ns, sn, sa, sb, A, B, C);
}

static void cat3(char *d, const char *x, const char *y, const char *z) {
  join(d, DT_MAX_DIMS + 1, (const char *const[]){x, y, z}, 3);
}

static dt_status kernel_common(dt_ctx *ctx, op_kind kind, const char *call, const dt_op_attrs *a,
                               const dt_tensor *const *in, dt_tensor *const *out) {
  dt_spec sp[2];
  dt_tensor_spec(in[0], &sp[0]);
  dt_tensor_spec(in[1], &sp[1]);
  eqn e;
  DT_CHECK(op_parse(ctx, kind, call, a, sp, &e));
  const dt_array *arr[3] = {&in[0]->local, &in[1]->local, &out[0]->local};
  dt_dtype t = arr[2]->dtype;
  for (int o = 0; o < 3; o++) {
    if (arr[o]->ndim != e.n[o] || arr[o]->dtype != t || arr[o]->dev != arr[2]->dev)
      return dt_error(ctx, DT_ERR_INTERNAL, call, "operand %d: local array does not match", o);
  }
  dt_kdev kd;
  DT_CHECK(dt_device_kernels(ctx, arr[2]->dev, call, &kd));
  int64_t size[NLET];
  for (int i = 0; i < NLET; i++) size[i] = -1;
  for (int o = 0; o < 3; o++)
    for (int i = 0; i < e.n[o]; i++) {
      int L = e.l[o][i] - 'a';
      if (size[L] >= 0 && size[L] != arr[o]->shape[i])
        return dt_error(ctx, DT_ERR_INTERNAL, call,
                        "local size of '%c' is %lld in operand %d but %lld elsewhere", e.l[o][i],
                        (long long)arr[o]->shape[i], o, (long long)size[L]);
      size[L] = arr[o]->shape[i];
    }
  void *C = arr[2]->data;
  if (arr[2]->numel == 0) return DT_OK;
  /* letter groups: batch / lhs-free / rhs-free in output order, contracting in A's order */
  char gb[DT_MAX_DIMS + 1] = "", gl[DT_MAX_DIMS + 1] = "", gr[DT_MAX_DIMS + 1] = "",
                        gk[DT_MAX_DIMS + 1] = "";
  int nb = 0, nl = 0, nr = 0, nk = 0;
  int64_t Bt = 1, M = 1, N = 1, K = 1;
  bool one_side = false;
  for (int i = 0; i < e.n[2]; i++) {
    char c = e.l[2][i];
    bool ia = pos_of(&e, 0, c) >= 0, ib = pos_of(&e, 1, c) >= 0;
    int64_t s = size[c - 'a'];
    if (ia && ib) {
      gb[nb++] = c;
      Bt *= s;
    } else if (ia) {
      gl[nl++] = c;
      M *= s;
    } else {
      gr[nr++] = c;
      N *= s;
    }
  }
  for (int i = 0; i < e.n[0]; i++) {
    char c = e.l[0][i];
    if (pos_of(&e, 2, c) >= 0) continue;
    if (pos_of(&e, 1, c) < 0) one_side = true;
    gk[nk++] = c;
    K *= size[c - 'a'];
  }
  for (int i = 0; i < e.n[1]; i++)
    if (pos_of(&e, 2, e.l[1][i]) < 0 && pos_of(&e, 0, e.l[1][i]) < 0) one_side = true;
  gb[nb] = gl[nl] = gr[nr] = gk[nk] = '\0';
  if (one_side) return naive_einsum(ctx, &kd, call, &e, size, t, arr[0]->data, arr[1]->data, C);
  if (K == 0) return dt_device_fill(kd.dev, t, C, arr[2]->numel, 0.0);
  size_t es = dt_dtype_size(t);
  char want[DT_MAX_DIMS + 1], alt[DT_MAX_DIMS + 1];
  dt_array tmp[3];
  memset(tmp, 0, sizeof tmp);
  const void *pa = arr[0]->data, *pb = arr[1]->data;
  void *pc = C;
  bool ta = false, tb = false;
  dt_status s = DT_OK;
  /* A as [batch, lhs-free, contract] or, transposed, [batch, contract, lhs-free] */
  cat3(want, gb, gl, gk);
  cat3(alt, gb, gk, gl);
  if (!strcmp(e.l[0], want)) {
  } else if (!strcmp(e.l[0], alt)) {
    ta = true;
  } else {
    s = relayout(ctx, &kd, call, es, e.n[0], e.l[0], arr[0], want, &tmp[0]);
    if (s != DT_OK) goto done;
    pa = tmp[0].data;
  }
  /* B as [batch, contract, rhs-free] or, transposed, [batch, rhs-free, contract] */
  cat3(want, gb, gk, gr);
  cat3(alt, gb, gr, gk);
  if (!strcmp(e.l[1], want)) {
  } else if (!strcmp(e.l[1], alt)) {
    tb = true;
  } else {
    s = relayout(ctx, &kd, call, es, e.n[1], e.l[1], arr[1], want, &tmp[1]);
    if (s != DT_OK) goto done;
    pb = tmp[1].data;
  }
  /* C as [batch, lhs-free, rhs-free], else through a temporary */
  cat3(want, gb, gl, gr);
  if (strcmp(e.l[2], want)) {
    s = tmp_like(ctx, arr[2], &tmp[2]);
    if (s != DT_OK) goto done;
    pc = tmp[2].data;
  }
  {
    dt_gemm_desc g = {.dtype = t,
                      .trans_a = ta,
                      .trans_b = tb,
                      .m = M,
                      .n = N,
                      .k = K,
                      .alpha = 1.0,
                      .beta = 0.0,
                      .a = pa,
                      .lda = ta ? M : K,
                      .stride_a = M * K,
                      .b = pb,
                      .ldb = tb ? K : N,
                      .stride_b = K * N,
                      .c = pc,
                      .ldc = N,
                      .stride_c = M * N,
                      .batch = Bt};
    if (g.lda < 1) g.lda = 1;
    if (g.ldb < 1) g.ldb = 1;
    if (g.ldc < 1) g.ldc = 1;
    s = dt_device_gemm(kd.dev, &g);
    if (s != DT_OK) goto done;
  }
  if (tmp[2].data) {
    int64_t ws[DT_MAX_DIMS];
    for (int i = 0; i < e.n[2]; i++) ws[i] = size[want[i] - 'a'];
    s = permute_to(ctx, &kd, call, es, e.n[2], want, ws, tmp[2].data, e.l[2], C);
  }
done:
  for (int i = 0; i < 3; i++) dt_array_free(ctx, &tmp[i]);
  return s;
}

/* ---- backward ---- */

/* A zero DTensor shaped like t, replicated (for a missing output gradient). */
static dt_status zeros_like(dt_ctx *ctx, const dt_tensor *t, dt_tensor *out) {
  dt_placement pl[DT_MAX_MESH_DIMS];
  for (int i = 0; i < t->mesh_ndim; i++) pl[i] = dt_replicate();
  /* 0 + 0 * u: the RNG only supplies a shape-correct zero fill */
  return dt_tensor_rand(ctx, t->mesh, t->ndim, t->gshape, t->dtype, pl, 0, 0, DT_RNG_UNIFORM, 0.0,
                        0.0, out);
}

static dt_status sub_einsum(dt_ctx *ctx, const char *x, const char *y, const char *z,
                            const dt_tensor *p, const dt_tensor *q, dt_tensor *out) {
  dt_op_attrs at = DT_OP_ATTRS_INIT;
  join(at.eq, sizeof at.eq, (const char *const[]){x, ",", y, "->", z}, 5);
  const dt_tensor *ins[2] = {p, q};
  dt_tensor *outs[1] = {out};
  return dt_op_call(ctx, &dt_op_einsum, &at, ins, outs, NULL);
}

/* For C = einsum(A, B): dA = einsum(dC, B -> A), dB = einsum(A, dC -> B), or
 * dB = einsum(dC, A -> B) when dc_first (linear's dW = dy^T x). A letter
 * summed in one input only has no einsum gradient (unsupported). */
static dt_status backward_common(dt_ctx *ctx, op_kind kind, const char *call, const dt_op_attrs *a,
                                 const dt_tensor *const *in, const dt_tensor *const *gout,
                                 dt_tensor *const *gin) {
  static const dt_op_attrs zero_attrs; /* const: no mutable global state */
  if (!a) a = &zero_attrs;
  dt_spec sp[2];
  dt_tensor_spec(in[0], &sp[0]);
  dt_tensor_spec(in[1], &sp[1]);
  eqn e;
  DT_CHECK(op_parse(ctx, kind, call, a, sp, &e));
  for (int o = 0; o < 2; o++)
    for (int i = 0; i < e.n[o]; i++)
      if (pos_of(&e, 2, e.l[o][i]) < 0 && pos_of(&e, 1 - o, e.l[o][i]) < 0)
        return dt_error(ctx, DT_ERR_UNSUPPORTED, call,
                        "no backward for '%c', summed in input %d only", e.l[o][i], o);
  dt_tensor zero;
  const dt_tensor *g = gout[0];
  if (!g) {
    /* shape of C from the inputs */
    dt_spec os;
    memset(&os, 0, sizeof os);
    DT_CHECK(infer_common(ctx, kind, call, a, sp, &os));
    dt_tensor shape;
    memset(&shape, 0, sizeof shape);
    shape.mesh = in[0]->mesh;
    shape.mesh_ndim = in[0]->mesh_ndim;
    shape.ndim = os.ndim;
    for (int i = 0; i < os.ndim; i++) shape.gshape[i] = os.gshape[i];
    shape.dtype = os.dtype;
    DT_CHECK(zeros_like(ctx, &shape, &zero));
    g = &zero;
  }
  dt_status s = DT_OK;
  bool made0 = false;
  if (gin[0]) {
    s = sub_einsum(ctx, e.l[2], e.l[1], e.l[0], g, in[1], gin[0]);
    made0 = s == DT_OK;
  }
  if (s == DT_OK && gin[1]) {
    if (kind == K_LINEAR)
      s = sub_einsum(ctx, e.l[2], e.l[0], e.l[1], g, in[0], gin[1]);
    else
      s = sub_einsum(ctx, e.l[0], e.l[2], e.l[1], in[0], g, gin[1]);
    if (s != DT_OK && made0) dt_tensor_free(ctx, gin[0]);
  }
  if (g == &zero) dt_tensor_free(ctx, &zero);
  return s;
}

/* ---- the op tables ---- */

#define OP_FUNCS(tag, KIND, NAME)                                                                \
  static dt_status tag##_infer(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in,             \
                               dt_spec *out) {                                                   \
    return infer_common(ctx, KIND, NAME, a, in, out);                                            \
  }                                                                                              \
  static dt_status tag##_options(dt_ctx *ctx, const dt_op_attrs *a, const dt_spec *in,           \
                                 const dt_spec *out, int mesh_dim, dt_dim_option *opt, int *n,   \
                                 int max) {                                                      \
    (void)out;                                                                                   \
    return options_common(ctx, KIND, NAME, a, in, mesh_dim, opt, n, max);                        \
  }                                                                                              \
  static dt_status tag##_kernel(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in,   \
                                dt_tensor *const *out) {                                         \
    return kernel_common(ctx, KIND, NAME, a, in, out);                                           \
  }                                                                                              \
  static dt_status tag##_backward(dt_ctx *ctx, const dt_op_attrs *a, const dt_tensor *const *in, \
                                  const dt_tensor *const *out, const dt_tensor *const *gout,     \
                                  dt_tensor *const *gin) {                                       \
    (void)out;                                                                                   \
    return backward_common(ctx, KIND, NAME, a, in, gout, gin);                                   \
  }

OP_FUNCS(einsum, K_EINSUM, "einsum")
OP_FUNCS(matmul, K_MATMUL, "matmul")
OP_FUNCS(linear, K_LINEAR, "linear")

const dt_op dt_op_einsum = {.name = "einsum", .strict_inputs = true,
                            .n_in = 2,
                            .n_out = 1,
                            .infer = einsum_infer,
                            .options = einsum_options,
                            .kernel = einsum_kernel,
                            .backward = einsum_backward,
    .bwd_meta_out = 1};
const dt_op dt_op_matmul = {.name = "matmul", .strict_inputs = true,
                            .n_in = 2,
                            .n_out = 1,
                            .infer = matmul_infer,
                            .options = matmul_options,
                            .kernel = matmul_kernel,
                            .backward = matmul_backward,
    .bwd_meta_out = 1};
const dt_op dt_op_linear = {.name = "linear", .strict_inputs = true,
                            .n_in = 2,
                            .n_out = 1,
                            .infer = linear_infer,
                            .options = linear_options,
                            .kernel = linear_kernel,
                            .backward = linear_backward,
    .bwd_meta_out = 1};
