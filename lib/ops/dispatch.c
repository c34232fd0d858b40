/* lib/ops/dispatch.c: op dispatch with sharding propagation and a per-rank cache.
 *
 * dt_op_plan lists an op's candidates (per-mesh-dim options expanded over the
 * mesh, or whole-mesh candidates), drops those with an unshardable input that
 * would need redistributing, prices each as the sum of its inputs' redistribute
 * costs (PyTorch's redistribute_cost on a CPU topology) and keeps the first of
 * the cheapest (generation order breaks ties, as PyTorch's _select_strategy).
 * dt_op_call adds the cache, the input redistributions, output allocation and
 * the kernel. The cache is an open-addressing table hung off the dt_ctx. */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"

void dt_tensor_spec(const dt_tensor *t, dt_spec *out) {
  memset(out, 0, sizeof *out);
  out->mesh_ndim = t->mesh_ndim;
  for (int i = 0; i < t->mesh_ndim; i++) out->pl[i] = t->pl[i];
  if (t->mesh) {
    int m;
    dt_tensor_mesh_info(t->mesh, &m, out->mesh_shape, NULL);
  }
  out->ndim = t->ndim;
  for (int d = 0; d < t->ndim; d++) out->gshape[d] = t->gshape[d];
  out->dtype = t->dtype;
}

double dt_spec_bytes(const dt_spec *s) {
  double n = (double)dt_dtype_size(s->dtype);
  for (int d = 0; d < s->ndim; d++) n *= (double)s->gshape[d];
  return n;
}

bool dt_spec_shardable(const dt_spec *s, const int *mesh_shape, const dt_placement *pl) {
  int64_t shards[DT_MAX_DIMS];
  for (int d = 0; d < s->ndim; d++) shards[d] = 1;
  for (int i = 0; i < s->mesh_ndim; i++)
    if (pl[i].kind == DT_PL_SHARD && pl[i].dim < s->ndim) shards[pl[i].dim] *= mesh_shape[i];
  for (int d = 0; d < s->ndim; d++)
    if (shards[d] > 1 && shards[d] > s->gshape[d]) return false;
  return true;
}

dt_status dt_op_expand(int mesh_ndim, int n_in, int n_out, const dt_dim_option *const *opts,
                       const int *n_opts, dt_candidate *cand, int *n, int max) {
  int64_t total = 1;
  for (int i = 0; i < mesh_ndim; i++) total *= n_opts[i];
  *n = 0;
  if (total > max) return DT_ERR_INVALID;
  int idx[DT_MAX_MESH_DIMS] = {0};
  for (int64_t c = 0; c < total; c++) {
    dt_candidate *k = &cand[c];
    memset(k, 0, sizeof *k);
    for (int i = 0; i < mesh_ndim; i++) {
      const dt_dim_option *o = &opts[i][idx[i]];
      for (int j = 0; j < n_out; j++) k->out[j][i] = o->out[j];
      for (int j = 0; j < n_in; j++) k->in[j][i] = o->in[j];
    }
    /* mesh dim 0 varies slowest: increment from the last dim */
    for (int i = mesh_ndim - 1; i >= 0; i--) {
      if (++idx[i] < n_opts[i]) break;
      idx[i] = 0;
    }
  }
  *n = (int)total;
  return DT_OK;
}

static bool same_pl(int m, const dt_placement *a, const dt_placement *b) {
  for (int i = 0; i < m; i++)
    if (!dt_placement_eq(a[i], b[i])) return false;
  return true;
}

/* When the per-dim options' product is over max (7 per dim on a 5-D mesh is 16807),
 * the dims with the most options, one at a time, keep only the options that move no
 * input on that dim (each input's placement there already the option's), where
 * there is one, until the product fits. Only reached where expanding everything
 * would fail; a dim kept this way costs nothing to redistribute, so the cheapest
 * candidate overall is still among the kept ones unless another option there is
 * free too (a tie, then decided by the order). */
static void keep_in_place(const dt_op *op, const dt_spec *in, int m,
                          dt_dim_option (*opts)[DT_OP_MAX_OPTIONS], int *nopt, int max) {
  bool done[DT_MAX_MESH_DIMS] = {false};
  for (;;) {
    double prod = 1;
    for (int i = 0; i < m; i++) prod *= nopt[i];
    if (prod <= max) return;
    int d = -1;
    for (int i = 0; i < m; i++)
      if (!done[i] && nopt[i] > 1 && (d < 0 || nopt[i] > nopt[d])) d = i;
    if (d < 0) return;
    done[d] = true;
    int k = 0;
    for (int o = 0; o < nopt[d]; o++) {
      bool stays = true;
      for (int j = 0; j < op->n_in && stays; j++)
        stays = dt_placement_eq(opts[d][o].in[j], in[j].pl[d]);
      if (stays) opts[d][k++] = opts[d][o];
    }
    if (k > 0) nopt[d] = k;
  }
}

dt_status dt_op_plan(dt_ctx *ctx, const dt_op *op, const dt_op_attrs *a, const int *mesh_shape,
                     const dt_spec *in, dt_spec *out, dt_candidate *chosen, dt_op_report *rep) {
  if (!op || !in || !out || !mesh_shape || !chosen)
    return dt_error(ctx, DT_ERR_INVALID, "dt_op_plan", "NULL argument");
  static const dt_op_attrs zero_attrs;
  if (!a) a = &zero_attrs;
  const char *call = op->name;
  int m = in[0].mesh_ndim;
  /* the strategies read the mesh sizes from the specs: set them from mesh_shape */
  dt_spec inx[DT_OP_MAX_IN];
  for (int j = 0; j < op->n_in && j < DT_OP_MAX_IN; j++) {
    inx[j] = in[j];
    for (int i = 0; i < DT_MAX_MESH_DIMS; i++) inx[j].mesh_shape[i] = i < m ? mesh_shape[i] : 0;
  }
  in = inx;
  for (int j = 0; j < op->n_out; j++) memset(&out[j], 0, sizeof out[j]);
  DT_CHECK(op->infer(ctx, a, in, out));
  for (int j = 0; j < op->n_out; j++) out[j].mesh_ndim = m;
  dt_candidate *cand = malloc(sizeof(dt_candidate) * DT_OP_MAX_CANDIDATES);
  if (!cand) return dt_error(ctx, DT_ERR_NOMEM, call, "no memory for candidates");
  int n = 0;
  dt_status s = DT_OK;
  if (op->candidates) {
    s = op->candidates(ctx, a, in, out, cand, &n, DT_OP_MAX_CANDIDATES);
  } else {
    dt_dim_option opts[DT_MAX_MESH_DIMS][DT_OP_MAX_OPTIONS];
    const dt_dim_option *optp[DT_MAX_MESH_DIMS];
    int nopt[DT_MAX_MESH_DIMS];
    for (int i = 0; i < m && s == DT_OK; i++) {
      s = op->options(ctx, a, in, out, i, opts[i], &nopt[i], DT_OP_MAX_OPTIONS);
      optp[i] = opts[i];
    }
    if (s == DT_OK) keep_in_place(op, in, m, opts, nopt, DT_OP_MAX_CANDIDATES);
    if (s == DT_OK && dt_op_expand(m, op->n_in, op->n_out, optp, nopt, cand, &n,
                                   DT_OP_MAX_CANDIDATES) != DT_OK)
      s = dt_error(ctx, DT_ERR_UNSUPPORTED, call, "more than %d candidates", DT_OP_MAX_CANDIDATES);
  }
  if (s != DT_OK) {
    free(cand);
    return s;
  }
  dt_topo topo;
  dt_topo_build(m, mesh_shape, 1, &topo);
  int kept = 0, best = -1;
  for (int c = 0; c < n; c++) {
    bool ok = true;
    /* Inputs that would move must be shardable (strict ops: every input).
     * Outputs are not checked, as in PyTorch: an output that carries an input's
     * layout (e.g. [7,3] S(1) on 4 ranks) keeps it, empty shards and all. */
    for (int j = 0; j < op->n_in && ok; j++)
      if ((op->strict_inputs || !same_pl(m, cand[c].in[j], in[j].pl)) &&
          !dt_spec_shardable(&in[j], mesh_shape, cand[c].in[j]))
        ok = false;
    if (!ok) continue;
    double cost = 0;
    for (int j = 0; j < op->n_in; j++)
      cost += dt_redistribute_cost(&topo, dt_spec_bytes(&in[j]), in[j].pl, cand[c].in[j]);
    cand[kept] = cand[c];
    cand[kept].cost_us = cost;
    if (isfinite(cost) && (best < 0 || cost < cand[best].cost_us)) best = kept;
    kept++;
  }
  if (rep) {
    rep->n_generated = n;
    rep->n_candidates = kept;
    rep->chosen = best;
    rep->cached = false;
    if (rep->cand)
      for (int c = 0; c < kept && c < rep->max_cand; c++) rep->cand[c] = cand[c];
  }
  if (best < 0) {
    free(cand);
    return dt_error(ctx, DT_ERR_UNSUPPORTED, call, "no sharding strategy fits these inputs");
  }
  *chosen = cand[best];
  for (int j = 0; j < op->n_out; j++)
    for (int i = 0; i < m; i++) out[j].pl[i] = chosen->out[j][i];
  free(cand);
  return DT_OK;
}

/* ---- the per-rank decision cache ---- */

typedef struct cache_key {
  const dt_op *op;
  dt_op_attrs attrs;
  int mesh_shape[DT_MAX_MESH_DIMS];
  dt_spec in[DT_OP_MAX_IN];
} cache_key;

typedef struct cache_entry {
  bool used;
  uint64_t hash;
  cache_key key;
  dt_candidate chosen;
  dt_spec out[DT_OP_MAX_OUT];
} cache_entry;

typedef struct op_cache {
  cache_entry *e;
  size_t cap, n;
} op_cache;

enum { CACHE_INIT = 256 }; /* entries; doubles at 50% load */

/* FNV-1a over 64-bit words (the key is zero-padded to whole words): one
 * multiply per 8 bytes keeps a cached dispatch cheap. */
static uint64_t fnv(const void *p, size_t n) {
  const unsigned char *b = p;
  uint64_t h = 1469598103934665603ull; /* FNV offset basis and prime */
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    memcpy(&w, b + i, 8);
    h = (h ^ w) * 1099511628211ull;
  }
  for (; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h ^ (h >> 29); /* fold the high bits into the low ones the table indexes */
}

/* The rank's cache hangs on its context (dt_ctx_ext) under the address of
 * op_cache_key, and is freed by dt_ctx_release. */
static const char op_cache_key;

static void cache_free_fn(dt_ctx *ctx, void *data) {
  (void)ctx;
  op_cache *c = data;
  free(c->e);
  free(c);
}

void dt_op_cache_free(dt_ctx *ctx) { dt_ctx_ext_drop(ctx, &op_cache_key); }

static cache_entry *cache_find(op_cache *c, const cache_key *k, uint64_t h) {
  if (!c || !c->cap) return NULL;
  for (size_t i = h & (c->cap - 1);; i = (i + 1) & (c->cap - 1)) {
    cache_entry *e = &c->e[i];
    if (!e->used) return NULL;
    if (e->hash == h && !memcmp(&e->key, k, sizeof *k)) return e;
  }
}

static void cache_put(dt_ctx *ctx, const cache_key *k, uint64_t h, const dt_candidate *ch,
                      const dt_spec *out, int n_out) {
  op_cache *c = dt_ctx_ext_get(ctx, &op_cache_key);
  if (!c) {
    c = calloc(1, sizeof *c);
    if (!c) return; /* a missing cache only costs speed */
    if (dt_ctx_ext_set(ctx, &op_cache_key, c, cache_free_fn) != DT_OK) {
      free(c);
      return;
    }
  }
  if (2 * (c->n + 1) > c->cap) {
    size_t cap = c->cap ? 2 * c->cap : CACHE_INIT;
    cache_entry *e = calloc(cap, sizeof *e);
    if (!e) return;
    for (size_t i = 0; i < c->cap; i++) {
      if (!c->e[i].used) continue;
      size_t j = c->e[i].hash & (cap - 1);
      while (e[j].used) j = (j + 1) & (cap - 1);
      e[j] = c->e[i];
    }
    free(c->e);
    c->e = e;
    c->cap = cap;
  }
  size_t i = h & (c->cap - 1);
  while (c->e[i].used) i = (i + 1) & (c->cap - 1);
  cache_entry *e = &c->e[i];
  e->used = true;
  e->hash = h;
  e->key = *k;
  e->chosen = *ch;
  for (int j = 0; j < n_out; j++) e->out[j] = out[j];
  c->n++;
}

/* ---- bf16 through f32 copies ------------------------------------------------ */

/* bf16 is a storage type: the GPU kernels compute it in f32. A device whose
 * kernels take f32 and f64 only (its table's bf16_as_f32: the CPU's) gets an op
 * with bf16 operands on f32 copies made by its cast slot, and the outputs
 * rounded back to bf16 (to nearest even): the same arithmetic as the GPU's, one
 * rounding per output. */
static bool has_bf16(const dt_op *op, const dt_tensor *const *in, dt_tensor *const *out) {
  for (int j = 0; j < op->n_in; j++)
    if (in[j]->local.dtype == DT_BF16) return true;
  for (int j = 0; j < op->n_out; j++)
    if (out[j]->local.dtype == DT_BF16) return true;
  return false;
}

/* An f32 array like a (same device and shape), *w a copy of t's header over it. */
static dt_status f32_like(dt_ctx *ctx, const dt_tensor *t, dt_tensor *w) {
  *w = *t;
  w->dtype = DT_F32;
  return dt_array_create(ctx, t->local.dev, DT_F32, t->local.ndim, t->local.shape, &w->local);
}

static dt_status kernel_via_f32(dt_ctx *ctx, dt_kdev *kd, const dt_op *op, const dt_op_attrs *a,
                                const dt_tensor *const *in, dt_tensor *const *out) {
  DT_OP_KSLOT(ctx, op->name, kd->k->pw, cast);
  dt_status (*cast)(dt_device *, dt_dtype, const void *, dt_dtype, void *, int64_t) = kd->k->pw->cast;
  dt_tensor win[DT_OP_MAX_IN], wout[DT_OP_MAX_OUT];
  const dt_tensor *use[DT_OP_MAX_IN];
  dt_tensor *put[DT_OP_MAX_OUT];
  bool wi[DT_OP_MAX_IN] = {false}, wo[DT_OP_MAX_OUT] = {false};
  dt_status s = DT_OK;
  for (int j = 0; j < op->n_in && s == DT_OK; j++) {
    use[j] = in[j];
    if (in[j]->local.dtype != DT_BF16) continue;
    s = f32_like(ctx, in[j], &win[j]);
    if (s != DT_OK) break;
    wi[j] = true, use[j] = &win[j];
    s = cast(kd->dev, DT_BF16, in[j]->local.data, DT_F32, win[j].local.data, in[j]->local.numel);
  }
  for (int j = 0; j < op->n_out && s == DT_OK; j++) {
    put[j] = out[j];
    if (out[j]->local.dtype != DT_BF16) continue;
    s = f32_like(ctx, out[j], &wout[j]);
    if (s == DT_OK) wo[j] = true, put[j] = &wout[j];
  }
  if (s == DT_OK) s = op->kernel(ctx, a, use, put);
  for (int j = 0; j < op->n_out; j++) {
    if (!wo[j]) continue;
    if (s == DT_OK)
      s = cast(kd->dev, DT_F32, wout[j].local.data, DT_BF16, out[j]->local.data, out[j]->local.numel);
    dt_array_free(ctx, &wout[j].local);
  }
  for (int j = 0; j < op->n_in; j++)
    if (wi[j]) dt_array_free(ctx, &win[j].local);
  return s;
}

/* The op's kernel on the redistributed inputs, on f32 copies where the device
 * asks for them. */
static dt_status run_kernel(dt_ctx *ctx, const dt_op *op, const dt_op_attrs *a,
                            dt_device_kind dev, const dt_tensor *const *in, dt_tensor *const *out) {
  if (!has_bf16(op, in, out)) return op->kernel(ctx, a, in, out);
  dt_kdev kd;
  DT_CHECK(dt_device_kernels(ctx, dev, op->name, &kd));
  return kd.k->bf16_as_f32 ? kernel_via_f32(ctx, &kd, op, a, in, out) : op->kernel(ctx, a, in, out);
}

dt_status dt_op_call(dt_ctx *ctx, const dt_op *op, const dt_op_attrs *a,
                     const dt_tensor *const *in, dt_tensor *const *out, dt_op_report *rep) {
  const char *call = op ? op->name : "dt_op_call";
  if (!op || !in || !out) return dt_error(ctx, DT_ERR_INVALID, call, "NULL argument");
  static const dt_op_attrs zero_attrs;
  if (!a) a = &zero_attrs;
  for (int j = 0; j < op->n_out; j++) memset(out[j], 0, sizeof *out[j]);
  dt_mesh *mesh = in[0]->mesh;
  for (int j = 1; j < op->n_in; j++)
    if (in[j]->mesh != mesh)
      return dt_error(ctx, DT_ERR_INVALID, call, "inputs 0 and %d live on different meshes", j);
  cache_key k;
  memset(&k, 0, sizeof k); /* padding too: the key is hashed and compared bytewise */
  k.op = op;
  k.attrs = *a;
  int m;
  dt_tensor_mesh_info(mesh, &m, k.mesh_shape, NULL);
  for (int j = 0; j < op->n_in; j++) dt_tensor_spec(in[j], &k.in[j]);
  uint64_t h = fnv(&k, sizeof k);
  dt_candidate chosen;
  dt_spec os[DT_OP_MAX_OUT];
  cache_entry *e = cache_find(dt_ctx_ext_get(ctx, &op_cache_key), &k, h);
  if (e) {
    chosen = e->chosen;
    for (int j = 0; j < op->n_out; j++) os[j] = e->out[j];
    if (rep) { /* the candidates are not listed again */
      rep->n_candidates = rep->n_generated = 0;
      rep->chosen = -1;
      rep->cached = true;
    }
  } else {
    DT_CHECK(dt_op_plan(ctx, op, a, k.mesh_shape, k.in, os, &chosen, rep));
    cache_put(ctx, &k, h, &chosen, os, op->n_out);
  }
  /* redistribute the inputs that need it */
  dt_tensor moved[DT_OP_MAX_IN];
  const dt_tensor *use[DT_OP_MAX_IN];
  bool own[DT_OP_MAX_IN] = {false};
  dt_status s = DT_OK;
  for (int j = 0; j < op->n_in && s == DT_OK; j++) {
    use[j] = in[j];
    if (same_pl(m, in[j]->pl, chosen.in[j])) continue;
    s = dt_redistribute(ctx, in[j], chosen.in[j], DT_PLANNER_GREEDY, &moved[j]);
    if (s == DT_OK) {
      own[j] = true;
      use[j] = &moved[j];
    }
  }
  /* Outputs live where the inputs do (the ops move nothing between devices). */
  dt_device_kind dev = op->n_in > 0 ? in[0]->local.dev : DT_DEV_CPU;
  for (int j = 1; j < op->n_in && s == DT_OK; j++)
    if (in[j]->local.dev != dev)
      s = dt_error(ctx, DT_ERR_INVALID, op->name, "inputs 0 and %d are on different devices", j);
  int made = 0;
  for (int j = 0; j < op->n_out && s == DT_OK; j++) {
    s = dt_tensor_meta(ctx, mesh, chosen.out[j], os[j].ndim, os[j].gshape, os[j].dtype, call, out[j]);
    if (s != DT_OK) break;
    int64_t ls[DT_MAX_DIMS];
    dt_tensor_local_shape(out[j], ls);
    s = dt_array_create(ctx, dev, os[j].dtype, os[j].ndim, ls, &out[j]->local);
    if (s == DT_OK) made++;
  }
  if (s == DT_OK) s = run_kernel(ctx, op, a, dev, use, out);
  for (int j = 0; j < op->n_in; j++)
    if (own[j]) dt_tensor_free(ctx, &moved[j]);
  if (s != DT_OK)
    for (int j = 0; j < made; j++) dt_tensor_free(ctx, out[j]);
  return s;
}
