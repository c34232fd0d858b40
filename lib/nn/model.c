/* lib/nn/model.c: TorchTitan's Llama 3 (torchtitan/models/llama3/model/model.py
 * at v0.2.0: Transformer, TransformerBlock, Attention, FeedForward,
 * init_weights) on DTensor ops with autograd, and AdamW.
 *
 * Configs: the four flavours of llama3_args (torchtitan/models/llama3/
 * __init__.py at v0.2.0); FFN hidden size as FeedForward.__init__ computes it,
 * parameter count as get_dense_model_nparams_and_flops (torchtitan/models/
 * utils.py) counts it.
 *
 * Modules: a flat list, parents before children, each with TorchTitan's fqn, as
 *   dt_llama_module_at describes them (lib/nn/llama_tree.c): "" (the model),
 *   tok_embeddings, the blocks' modules, norm, output. A module's index is its RNG
 *   stream. The config's no_* fields leave modules out (a part of the model run
 *   alone): the list keeps the others in the same order, so the positions follow
 *   from the config (dt_llama_layout_of).
 *
 * Weights (dt_model_materialize): generated with dt_tensor_rand on the module's
 * placements wpl (sharding-invariant: element i of the global weight depends on
 * (seed, stream, i) only). Normal: N(0, std). Ones: norms. Truncated normal: a
 * uniform u of the same global element is mapped by the inverse normal CDF into
 * [-b, b] std (the inverse-CDF method of PyTorch's trunc_normal_), an elementwise
 * transform of a sharding-invariant uniform, so it is invariant too.
 *
 * Tape lifetime: weights are leaves of a long-lived tape (m->tape); each step's
 * graph is recorded on a tape of its own (m->step_tape, made by the first
 * forward after end_step) whose ops read the weight variables of m->tape.
 * dt_backward on the step tape accumulates the weights' gradients into those
 * variables (lib/autograd records input pointers and accumulates into them,
 * whichever tape made them); dt_model_end_step frees the step tape (all
 * activations) and keeps weights and gradients. The optimizer updates the
 * weight values in place.
 *
 * Hooks: pre(inputs) / post(outputs) at every module boundary: tok_embeddings
 * (ids / h), every linear (x / y), every norm (x / y), attention (x / out),
 * feed_forward (x / out), each block (h / h); the model root's hooks are not
 * called. Hooks receive the step tape.
 *
 * AdamW: PyTorch's torch.optim.AdamW (decoupled weight decay applied first,
 * bias-corrected moments), on local shards after the gradient is
 * redistributed to the weight's placements: the fused optim.adamw kernel of the
 * device the weight lives on (the CPU's is the host loop; bf16 weights: f32
 * master weights and moments, the bf16 copy rounded from the master).
 *
 * Devices: weights are generated on the host and uploaded once (materialize);
 * the optimizer state is made on the weight's device; nothing of a step comes
 * back to the host here.
 */
#include "config.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "device/xfer.h"
#include "nn/nn.h"

/* ---- configs --------------------------------------------------------------------- */

/* Shared by every Llama 3 flavour: TransformerModelArgs.norm_eps and the
 * rope_theta every entry of llama3_args sets. */
static const double LLAMA_NORM_EPS = 1e-5;
static const double LLAMA3_ROPE_THETA = 500000.0;

typedef struct flavour {
  const char *name;
  int dim, n_layers, n_heads, n_kv_heads, vocab, multiple_of;
  double ffn_mult;
} flavour;

/* llama3_args (torchtitan/models/llama3/__init__.py at v0.2.0): dim, n_layers,
 * n_heads, n_kv_heads (debugmodel: = n_heads), vocab_size, multiple_of,
 * ffn_dim_multiplier (0: none). */
static const flavour FLAVOURS[] = {
    {"debugmodel", 256, 6, 16, 16, 2048, 256, 0.0},
    {"8B", 4096, 32, 32, 8, 128256, 1024, 1.3},
    {"70B", 8192, 80, 64, 8, 128256, 4096, 1.3},
    {"405B", 16384, 126, 128, 8, 128256, 4096, 1.2},
};
enum { N_FLAVOURS = sizeof FLAVOURS / sizeof FLAVOURS[0] };

/* One override "KEY=VALUE" onto c; DT_ERR_INVALID naming it otherwise. */
static dt_status config_override(dt_ctx *ctx, const char *kv, size_t len, dt_llama_config *c) {
  static const char WHO[] = "dt_llama_config_get";
  char buf[64];
  if (len >= sizeof buf)
    return dt_error(ctx, DT_ERR_INVALID, WHO, "override '%.*s...' is too long", 20, kv);
  memcpy(buf, kv, len);
  buf[len] = '\0';
  char *eq = strchr(buf, '=');
  if (!eq || eq == buf || !eq[1])
    return dt_error(ctx, DT_ERR_INVALID, WHO, "override '%s' is not KEY=VALUE", buf);
  *eq = '\0';
  const char *key = buf, *val = eq + 1;
  char *end;
  errno = 0;
  double d = strtod(val, &end);
  if (*end || errno || !isfinite(d))
    return dt_error(ctx, DT_ERR_INVALID, WHO, "override %s: '%s' is not a number", key, val);
  int *ip = !strcmp(key, "dim")           ? &c->dim
            : !strcmp(key, "n_layers")    ? &c->n_layers
            : !strcmp(key, "n_heads")     ? &c->n_heads
            : !strcmp(key, "n_kv_heads")  ? &c->n_kv_heads
            : !strcmp(key, "vocab")       ? &c->vocab
            : !strcmp(key, "multiple_of") ? &c->multiple_of
                                          : NULL;
  bool *bp = !strcmp(key, "rope_scaling") ? &c->rope_scaling
             : !strcmp(key, "depth_init") ? &c->depth_init
                                          : NULL;
  double *dp = !strcmp(key, "ffn_dim_multiplier") ? &c->ffn_dim_multiplier
               : !strcmp(key, "norm_eps")         ? &c->norm_eps
               : !strcmp(key, "rope_theta")       ? &c->rope_theta
                                                  : NULL;
  if (ip) {
    if (d != (double)(int)d || d < 1 || d > 1 << 30)
      return dt_error(ctx, DT_ERR_INVALID, WHO, "override %s: '%s' is not an integer in [1, 2^30]",
                      key, val);
    *ip = (int)d;
  } else if (bp) {
    if (d != 0 && d != 1)
      return dt_error(ctx, DT_ERR_INVALID, WHO, "override %s: '%s' is not 0 or 1", key, val);
    *bp = d == 1;
  } else if (dp) {
    *dp = d;
  } else {
    return dt_error(ctx, DT_ERR_INVALID, WHO,
                    "unknown override '%s' (known: dim, n_layers, n_heads, n_kv_heads, vocab, "
                    "multiple_of, ffn_dim_multiplier, norm_eps, rope_theta, rope_scaling, "
                    "depth_init)", key);
  }
  return DT_OK;
}

dt_status dt_llama_config_get(dt_ctx *ctx, const char *name, dt_llama_config *out) {
  static const char WHO[] = "dt_llama_config_get";
  if (!name || !out) return dt_error(ctx, DT_ERR_INVALID, WHO, "NULL argument");
  const size_t base_len = strcspn(name, ":");
  if (strlen(name) >= sizeof out->name)
    return dt_error(ctx, DT_ERR_INVALID, WHO, "model '%.40s...' is longer than %zu characters",
                    name, sizeof out->name - 1);
  const flavour *f = NULL;
  for (int i = 0; i < N_FLAVOURS && !f; i++)
    if (strlen(FLAVOURS[i].name) == base_len && !strncmp(name, FLAVOURS[i].name, base_len))
      f = &FLAVOURS[i];
  if (!f)
    return dt_error(ctx, DT_ERR_INVALID, WHO,
                    "unknown model \"%.*s\" (known: debugmodel, 8B, 70B, 405B, each optionally "
                    "with :KEY=VALUE overrides)", (int)base_len, name);
  dt_llama_config c;
  memset(&c, 0, sizeof c);
  snprintf(c.name, sizeof c.name, "%s", name);
  c.dim = f->dim;
  c.n_layers = f->n_layers;
  c.n_heads = f->n_heads;
  c.n_kv_heads = f->n_kv_heads;
  c.vocab = f->vocab;
  c.multiple_of = f->multiple_of;
  c.ffn_dim_multiplier = f->ffn_mult;
  c.norm_eps = LLAMA_NORM_EPS;
  c.rope_theta = LLAMA3_ROPE_THETA;
  c.rope_scaling = true;
  c.depth_init = true;
  for (const char *p = name + base_len; *p == ':';) {
    size_t len = strcspn(p + 1, ":");
    DT_CHECK(config_override(ctx, p + 1, len, &c));
    p += 1 + len;
  }
  if (base_len != strlen(name)) DT_CHECK(dt_llama_config_check(ctx, &c));
  *out = c;
  return DT_OK;
}

int dt_llama_ffn_hidden(const dt_llama_config *c) {
  /* FeedForward(hidden_dim = 4*dim): int(2*hidden/3), int(mult*h), round up to multiple_of */
  int h = (int)(2.0 * (4.0 * c->dim) / 3.0);
  if (c->ffn_dim_multiplier != 0) h = (int)(c->ffn_dim_multiplier * h);
  int mo = c->multiple_of > 0 ? c->multiple_of : 1;
  return mo * ((h + mo - 1) / mo);
}

int64_t dt_llama_nparams(const dt_llama_config *c) {
  int64_t D = c->dim, V = c->vocab, hd = c->dim / c->n_heads, F = dt_llama_ffn_hidden(c);
  int64_t H = c->n_heads, KV = c->n_kv_heads;
  int64_t attn = D * H * hd + 2 * D * KV * hd + H * hd * D + D; /* + attention_norm */
  int64_t ffn = 3 * D * F + D;                                  /* + ffn_norm */
  int64_t layer = (c->no_attention ? 0 : attn) + (c->no_feed_forward ? 0 : ffn);
  return (c->no_embedding ? 0 : V * D) + (int64_t)c->n_layers * layer +
         (c->no_head ? 0 : D + V * D); /* embedding, layers, norm + output */
}

double dt_llama_flops_per_token(const dt_llama_config *c, int64_t seq) {
  const double n_embed = c->no_embedding ? 0.0 : (double)c->vocab * c->dim;
  const double hd = (double)(c->dim / c->n_heads);
  const int attn_layers = c->no_attention ? 0 : c->n_layers;
  return 6.0 * ((double)dt_llama_nparams(c) - n_embed) +
         12.0 * attn_layers * c->n_heads * hd * (double)seq;
}

dt_status dt_llama_config_check(dt_ctx *ctx, const dt_llama_config *c) {
  const char *who = "dt_llama_config_check";
  if (!c) return dt_error(ctx, DT_ERR_INVALID, who, "NULL config");
  if (!memchr(c->name, 0, sizeof c->name))
    return dt_error(ctx, DT_ERR_INVALID, who, "name is not NUL-terminated");
  const bool part = c->no_embedding || c->no_attention || c->no_feed_forward || c->no_head;
  if (c->dim <= 0 || c->n_layers < (part ? 0 : 1) || c->n_heads <= 0 || c->n_kv_heads <= 0 ||
      c->vocab <= 0 || c->multiple_of <= 0)
    return dt_error(ctx, DT_ERR_INVALID, who,
                    "dim %d, n_layers %d, n_heads %d, n_kv_heads %d, vocab %d, multiple_of %d "
                    "must all be > 0 (n_layers >= 0 for a part of the model)",
                    c->dim, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab, c->multiple_of);
  if (c->n_layers > 0 && c->no_attention && c->no_feed_forward)
    return dt_error(ctx, DT_ERR_INVALID, who,
                    "blocks without attention and feed_forward are empty (n_layers 0 instead)");
  if (c->n_layers == 0 && c->no_embedding && c->no_head)
    return dt_error(ctx, DT_ERR_INVALID, who, "no module: no layers, no embedding, no head");
  if (c->dim % c->n_heads)
    return dt_error(ctx, DT_ERR_INVALID, who, "dim %d is not a multiple of n_heads %d", c->dim,
                    c->n_heads);
  if (c->n_heads % c->n_kv_heads)
    return dt_error(ctx, DT_ERR_INVALID, who, "n_heads %d is not a multiple of n_kv_heads %d",
                    c->n_heads, c->n_kv_heads);
  if ((c->dim / c->n_heads) % 2)
    return dt_error(ctx, DT_ERR_INVALID, who, "head_dim %d is odd (rope rotates pairs)",
                    c->dim / c->n_heads);
  if (!(c->ffn_dim_multiplier >= 0) || !isfinite(c->ffn_dim_multiplier))
    return dt_error(ctx, DT_ERR_INVALID, who, "ffn_dim_multiplier %g (0: none, else > 0)",
                    c->ffn_dim_multiplier);
  if (!(c->norm_eps > 0) || !isfinite(c->norm_eps))
    return dt_error(ctx, DT_ERR_INVALID, who, "norm_eps %g must be > 0", c->norm_eps);
  if (!(c->rope_theta > 0) || !isfinite(c->rope_theta))
    return dt_error(ctx, DT_ERR_INVALID, who, "rope_theta %g must be > 0", c->rope_theta);
  if (dt_llama_ffn_hidden(c) <= 0)
    return dt_error(ctx, DT_ERR_INVALID, who, "FFN hidden size %d <= 0", dt_llama_ffn_hidden(c));
  return DT_OK;
}

/* ---- module tree (the list: dt_llama_module_at, lib/nn/llama_tree.c) ------------ */

dt_status dt_model_create(dt_ctx *ctx, dt_mesh *mesh, const dt_llama_config *cfg, dt_dtype dtype,
                          uint64_t seed, dt_model **out) {
  const char *who = "dt_model_create";
  if (!ctx || !cfg || !out) return dt_error(ctx, DT_ERR_INVALID, who, "NULL argument");
  *out = NULL;
  DT_CHECK(dt_llama_config_check(ctx, cfg));
  if (dtype != DT_F32 && dtype != DT_F64 && dtype != DT_BF16)
    return dt_error(ctx, DT_ERR_INVALID, who, "dtype must be f32, f64 or bf16");
  dt_model *m = dt_host_calloc(ctx, sizeof *m);
  if (!m) return dt_error(ctx, DT_ERR_NOMEM, who, "no memory");
  const int cap = dt_llama_layout_of(cfg).n;
  m->mods = dt_host_calloc(ctx, (size_t)cap * sizeof *m->mods);
  m->adam_m = dt_host_calloc(ctx, (size_t)cap * sizeof *m->adam_m);
  m->adam_v = dt_host_calloc(ctx, (size_t)cap * sizeof *m->adam_v);
  m->adam_master = dt_host_calloc(ctx, (size_t)cap * sizeof *m->adam_master);
  if (!m->mods || !m->adam_m || !m->adam_v || !m->adam_master) {
    dt_model_free(ctx, m);
    return dt_error(ctx, DT_ERR_NOMEM, who, "no memory for %d modules", cap);
  }
  m->cfg = *cfg;
  m->mesh = mesh;
  m->dtype = dtype;
  m->seed = seed;
  m->cp_dim = -1;
  for (int i = 0; i < cap; i++) {
    dt_llama_module d;
    (void)dt_llama_module_at(cfg, i, &d); /* i < cap: always there */
    dt_module *md = &m->mods[m->n_mods];
    memset(md, 0, sizeof *md);
    snprintf(md->fqn, sizeof md->fqn, "%s", d.fqn);
    md->kind = d.kind;
    md->index = m->n_mods++;
    md->wndim = d.wndim;
    md->wshape[0] = d.wshape[0];
    md->wshape[1] = d.wshape[1];
    md->init = d.init;
    md->init_std = d.init_std;
    md->init_trunc = d.init_trunc;
  }
  *out = m;
  return DT_OK;
}

void dt_model_free(dt_ctx *ctx, dt_model *m) {
  if (!m) return;
  if (m->param_state && m->param_free) m->param_free(ctx, m->param_state);
  dt_tape_free(m->step_tape);
  dt_tape_free(m->tape);
  for (int i = 0; i < m->n_mods; i++) {
    dt_module *md = &m->mods[i];
    if (md->hook_state && md->hook_free) md->hook_free(ctx, md->hook_state);
    if (m->adam_m && m->adam_m[i].mesh) dt_tensor_free(ctx, &m->adam_m[i]);
    if (m->adam_v && m->adam_v[i].mesh) dt_tensor_free(ctx, &m->adam_v[i]);
    if (m->adam_master && m->adam_master[i].mesh) dt_tensor_free(ctx, &m->adam_master[i]);
  }
  dt_host_free(ctx, m->adam_m);
  dt_host_free(ctx, m->adam_v);
  dt_host_free(ctx, m->adam_master);
  dt_host_free(ctx, m->mods);
  dt_host_free(ctx, m);
}

dt_module *dt_model_find(dt_model *m, const char *fqn) {
  if (!m || !fqn) return NULL;
  for (int i = 0; i < m->n_mods; i++)
    if (!strcmp(m->mods[i].fqn, fqn)) return &m->mods[i];
  return NULL;
}

/* ---- initialisation --------------------------------------------------------------- */

/* Acklam's rational approximation of the inverse normal CDF for p in (0, 0.5]
 * (relative error < 1.2e-9), refined by one Halley step on erfc, which brings
 * it to full double precision. Published coefficients, not tunables. */
static double inv_phi_lower(double p) {
  static const double a[6] = {-3.969683028665376e+01, 2.209460984245205e+02,
                              -2.759285104469687e+02, 1.383577518672690e+02,
                              -3.066479806614716e+01, 2.506628277459239e+00};
  static const double b[5] = {-5.447609879822406e+01, 1.615858368580409e+02,
                              -1.556989798598866e+02, 6.680131188771972e+01,
                              -1.328068155288572e+01};
  static const double c[6] = {-7.784894002430293e-03, -3.223964580411365e-01,
                              -2.400758277161838e+00, -2.549732539343734e+00,
                              4.374664141464968e+00,  2.938163982698783e+00};
  static const double d[4] = {7.784695709041462e-03, 3.224671290700398e-01,
                              2.445134137142996e+00, 3.754408661907416e+00};
  static const double P_LOW = 0.02425; /* Acklam's split between tail and central region */
  double x;
  if (p < P_LOW) {
    double q = sqrt(-2 * log(p));
    x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  } else {
    double q = p - 0.5, r = q * q;
    x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
  }
  double e = 0.5 * erfc(-x / sqrt(2.0)) - p;
  double u = e * 2.5066282746310002 /* sqrt(2 pi) */ * exp(x * x / 2);
  return x - u / (1 + x * u / 2);
}

/* A standard normal truncated to [-bound, bound] from a uniform u in [0, 1):
 * x = Phi^-1(lo + u mass), lo = Phi(-bound), mass = Phi(bound) - Phi(-bound),
 * evaluated on the lower half for both halves (by symmetry) so the upper tail
 * keeps its precision. */
static double trunc_normal_from_uniform(double u, double lo, double mass, double bound) {
  bool upper = u >= 0.5;
  double p = lo + (upper ? 1.0 - u : u) * mass;
  if (p < DBL_MIN) p = DBL_MIN; /* bound so wide that Phi(-bound) underflows and u == 0 */
  if (p > 0.5) p = 0.5;
  double x = inv_phi_lower(p);
  if (x < -bound) x = -bound; /* rounding at the edge */
  return upper ? -x : x;
}

/* a's data moved to the host (a device made it) or to where the rank computes
 * (once, at materialize); nothing when it is there. */
static dt_status local_to_host(dt_ctx *ctx, dt_array *a) {
  return dt_array_place(ctx, a, DT_DEV_CPU, "dt_model");
}
static dt_status local_to_device(dt_ctx *ctx, dt_array *a) {
  return dt_array_place(ctx, a, dt_tensor_home(ctx), "dt_model");
}

static dt_status gen_weight(dt_ctx *ctx, dt_model *m, const dt_module *md, dt_tensor *out) {
  const dt_placement *pl = md->wpl;
  uint64_t stream = (uint64_t)md->index;
  switch (md->init) {
  case DT_INIT_NORMAL:
    return dt_tensor_rand(ctx, m->mesh, md->wndim, md->wshape, m->dtype, pl, m->seed, stream,
                          DT_RNG_NORMAL, 0.0, md->init_std, out);
  case DT_INIT_ONES: /* uniform with a = 1, b = 0: exactly 1 */
    return dt_tensor_rand(ctx, m->mesh, md->wndim, md->wshape, m->dtype, pl, m->seed, stream,
                          DT_RNG_UNIFORM, 1.0, 0.0, out);
  case DT_INIT_NONE: /* zeros */
    return dt_tensor_rand(ctx, m->mesh, md->wndim, md->wshape, m->dtype, pl, m->seed, stream,
                          DT_RNG_UNIFORM, 0.0, 0.0, out);
  case DT_INIT_TRUNC_NORMAL: break;
  }
  /* the meta device holds no values: the weight's shape is all there is to make */
  if (dt_tensor_home(ctx) == DT_DEV_META)
    return dt_tensor_rand(ctx, m->mesh, md->wndim, md->wshape, m->dtype, pl, m->seed, stream,
                          DT_RNG_UNIFORM, 0.0, 0.0, out);
  dt_tensor u;
  DT_CHECK(dt_tensor_rand(ctx, m->mesh, md->wndim, md->wshape, DT_F64, pl, m->seed, stream,
                          DT_RNG_UNIFORM, 0.0, 1.0, &u));
  dt_status s = dt_tensor_rand(ctx, m->mesh, md->wndim, md->wshape, m->dtype, pl, m->seed, stream,
                               DT_RNG_UNIFORM, 0.0, 0.0, out);
  if (s != DT_OK) {
    dt_tensor_free(ctx, &u);
    return s;
  }
  /* the transform runs on the host: arrays a device made come down first */
  s = local_to_host(ctx, &u.local);
  if (s == DT_OK) s = local_to_host(ctx, &out->local);
  if (s == DT_OK && u.local.numel != out->local.numel)
    s = dt_error(ctx, DT_ERR_INVALID, "dt_model_materialize", "%s: shards differ", md->fqn);
  if (s != DT_OK) {
    dt_tensor_free(ctx, &u);
    dt_tensor_free(ctx, out);
    return s;
  }
  const double *ud = u.local.data;
  const double bound = md->init_trunc, lo = 0.5 * erfc(bound / sqrt(2.0)), mass = erf(bound / sqrt(2.0));
  for (int64_t i = 0; i < u.local.numel; i++) {
    double w = md->init_std * trunc_normal_from_uniform(ud[i], lo, mass, bound);
    if (m->dtype == DT_F32) ((float *)out->local.data)[i] = (float)w;
    else if (m->dtype == DT_BF16) ((dt_bf16 *)out->local.data)[i] = dt_f32_to_bf16((float)w);
    else ((double *)out->local.data)[i] = w;
  }
  dt_tensor_free(ctx, &u);
  return DT_OK;
}

static void adam_state_free(dt_ctx *ctx, dt_model *m) {
  for (int i = 0; i < m->n_mods; i++) {
    if (m->adam_m[i].mesh) dt_tensor_free(ctx, &m->adam_m[i]);
    if (m->adam_v[i].mesh) dt_tensor_free(ctx, &m->adam_v[i]);
    if (m->adam_master[i].mesh) dt_tensor_free(ctx, &m->adam_master[i]);
    memset(&m->adam_m[i], 0, sizeof m->adam_m[i]);
    memset(&m->adam_v[i], 0, sizeof m->adam_v[i]);
    memset(&m->adam_master[i], 0, sizeof m->adam_master[i]);
  }
  m->adam_step = 0;
}

dt_status dt_model_materialize(dt_ctx *ctx, dt_model *m) {
  if (!ctx || !m) return dt_error(ctx, DT_ERR_INVALID, "dt_model_materialize", "NULL argument");
  if (!m->mesh)
    return dt_error(ctx, DT_ERR_INVALID, "dt_model_materialize", "the model has no mesh");
  /* a second call regenerates every weight (e.g. after new placements) */
  dt_tape_free(m->step_tape);
  m->step_tape = NULL;
  dt_tape_free(m->tape);
  m->tape = NULL;
  adam_state_free(ctx, m);
  for (int i = 0; i < m->n_mods; i++) m->mods[i].weight = NULL;
  DT_CHECK(dt_tape_create(ctx, NULL, &m->tape));
  for (int i = 0; i < m->n_mods; i++) {
    dt_module *md = &m->mods[i];
    if (md->wndim == 0) continue;
    dt_tensor w;
    DT_CHECK(gen_weight(ctx, m, md, &w));
    dt_status s = local_to_device(ctx, &w.local);
    if (s != DT_OK) {
      dt_tensor_free(ctx, &w);
      return s;
    }
    md->weight = dt_var_leaf(m->tape, &w, true);
    if (!md->weight) return DT_ERR_NOMEM;
  }
  return DT_OK;
}

/* ---- forward ----------------------------------------------------------------------- */

static dt_status hook(dt_ctx *ctx, dt_model *m, dt_module *md, bool pre, dt_var **io, int n) {
  if (pre) dt_ctx_set_scope(ctx, md->fqn); /* the ledgers' fqn of what the module runs */
  if (pre && m->param_pre) DT_CHECK(m->param_pre(ctx, md, m->step_tape, io, n, m->param_state));
  dt_module_hook h = pre ? md->pre : md->post;
  if (h) DT_CHECK(h(ctx, md, m->step_tape, io, n, md->hook_state));
  if (!pre && m->param_post) DT_CHECK(m->param_post(ctx, md, m->step_tape, io, n, m->param_state));
  return DT_OK;
}

/* The variable a module's forward computes with (FSDP's unsharded copy or the weight). */
static dt_var *wvar(const dt_module *md) { return md->compute ? md->compute : md->weight; }

static dt_status op1(dt_model *m, const dt_op *op, const dt_op_attrs *a, dt_var *x, dt_var **y) {
  dt_var *in[1] = {x};
  return dt_ad_op(m->step_tape, op, a, in, y);
}

static dt_status op2(dt_model *m, const dt_op *op, const dt_op_attrs *a, dt_var *x, dt_var *w,
                     dt_var **y) {
  dt_var *in[2] = {x, w};
  return dt_ad_op(m->step_tape, op, a, in, y);
}

/* A module with a weight applied to one input: pre hook, op(x, W), post hook. */
static dt_status run_weighted(dt_ctx *ctx, dt_model *m, dt_module *md, const dt_op *op,
                              const dt_op_attrs *a, dt_var *x, dt_var **y) {
  dt_var *io[1] = {x};
  DT_CHECK(hook(ctx, m, md, true, io, 1));
  DT_CHECK(op2(m, op, a, io[0], wvar(md), y));
  io[0] = *y;
  DT_CHECK(hook(ctx, m, md, false, io, 1));
  *y = io[0];
  return DT_OK;
}

static dt_status linear(dt_ctx *ctx, dt_model *m, dt_module *md, dt_var *x, dt_var **y) {
  return run_weighted(ctx, m, md, &dt_op_linear, NULL, x, y);
}

static dt_status rmsnorm(dt_ctx *ctx, dt_model *m, dt_module *md, dt_var *x, dt_var **y) {
  dt_op_attrs a = DT_OP_ATTRS_INIT;
  a.scalar = m->cfg.norm_eps;
  return run_weighted(ctx, m, md, &dt_op_rms_norm, &a, x, y);
}

static dt_op_attrs shape_attrs(int n, const int64_t *shape) {
  dt_op_attrs a = DT_OP_ATTRS_INIT;
  a.shape_n = n;
  for (int i = 0; i < n; i++) a.shape[i] = shape[i];
  return a;
}

/* Attention (TorchTitan's Attention.forward: GQA, RoPE, causal SDPA) on
 * x [b, s, dim] (after attention_norm) -> [b, s, dim]. mods: the
 * attention module, then wq, wk, wv, wo. */
static dt_status attention(dt_ctx *ctx, dt_model *m, dt_module *mods, dt_var *x, dt_var **y) {
  dt_module *att = &mods[0];
  dt_var *io[1] = {x};
  DT_CHECK(hook(ctx, m, att, true, io, 1));
  x = io[0];
  const dt_tensor *xv = dt_var_value(x);
  const int64_t b = xv->gshape[0], s = xv->gshape[1], hd = m->cfg.dim / m->cfg.n_heads;
  dt_var *q, *k, *v;
  DT_CHECK(linear(ctx, m, &mods[1], x, &q));
  DT_CHECK(linear(ctx, m, &mods[2], x, &k));
  DT_CHECK(linear(ctx, m, &mods[3], x, &v));
  /* heads inferred (-1) as TorchTitan does, since TP may shard them */
  const int64_t hshape[4] = {b, s, -1, hd};
  dt_op_attrs va = shape_attrs(4, hshape);
  DT_CHECK(op1(m, &dt_op_view, &va, q, &q));
  DT_CHECK(op1(m, &dt_op_view, &va, k, &k));
  DT_CHECK(op1(m, &dt_op_view, &va, v, &v));
  dt_op_attrs ra = DT_OP_ATTRS_INIT;
  ra.scalar = m->cfg.rope_theta;
  ra.i0 = m->cfg.rope_scaling ? 1 : 0;
  ra.i1 = m->cp_chunks; /* positions of the stored sequence under context parallel */
  DT_CHECK(op1(m, &dt_op_rope, &ra, q, &q));
  DT_CHECK(op1(m, &dt_op_rope, &ra, k, &k));
  /* TorchTitan transposes to [b, h, s, hd] for SDPA and back; sdpa's [b, s, h, hd]
   * layout (attrs.i0 = 1) computes the same without the four copies each way */
  dt_op_attrs sa = DT_OP_ATTRS_INIT;
  sa.i0 = 1;
  dt_var *sin[3] = {q, k, v}, *o;
  if (m->cp_dim >= 0) { /* context parallel: the sequence is sharded over cp */
    sa.dim = m->cp_dim;
    sa.i1 = m->cp_chunks;
    sa.i2 = (int)m->cp_rotate;
    dt_var *so[2]; /* out, and the lse its backward reads */
    DT_CHECK(dt_ad_op(m->step_tape, &dt_op_sdpa_cp, &sa, sin, so));
    o = so[0];
  } else {
    DT_CHECK(dt_ad_op(m->step_tape, &dt_op_sdpa, &sa, sin, &o));
  }
  const int64_t oshape[3] = {b, s, -1};
  dt_op_attrs rsa = shape_attrs(3, oshape);
  DT_CHECK(op1(m, &dt_op_reshape, &rsa, o, &o));
  DT_CHECK(linear(ctx, m, &mods[4], o, &o));
  io[0] = o;
  DT_CHECK(hook(ctx, m, att, false, io, 1));
  *y = io[0];
  return DT_OK;
}

/* SwiGLU FFN: w2(silu(w1 x) * w3 x). mods: feed_forward, w1, w2, w3. */
static dt_status feed_forward(dt_ctx *ctx, dt_model *m, dt_module *mods, dt_var *x, dt_var **y) {
  dt_var *io[1] = {x};
  DT_CHECK(hook(ctx, m, &mods[0], true, io, 1));
  dt_var *g, *u, *z;
  DT_CHECK(linear(ctx, m, &mods[1], io[0], &g));
  DT_CHECK(linear(ctx, m, &mods[3], io[0], &u));
  DT_CHECK(op2(m, &dt_op_swiglu, NULL, g, u, &z));
  DT_CHECK(linear(ctx, m, &mods[2], z, &z));
  io[0] = z;
  DT_CHECK(hook(ctx, m, &mods[0], false, io, 1));
  *y = io[0];
  return DT_OK;
}

/* A copy of a DTensor as a leaf of the step tape (no gradient). */
static dt_status const_leaf(dt_ctx *ctx, dt_model *m, const dt_tensor *t, dt_var **out) {
  dt_tensor c;
  DT_CHECK(dt_tensor_from_local(ctx, t->mesh, &t->local, t->pl, t->ndim, t->gshape, &c));
  *out = dt_var_leaf(m->step_tape, &c, false);
  return *out ? DT_OK : DT_ERR_NOMEM;
}

/* ---- activation checkpointing --------------------------------------------------- */

dt_status dt_ac_parse(dt_ctx *ctx, const char *mode, const char *option, dt_ac_config *out) {
  static const char WHO[] = "dt_ac_parse";
  memset(out, 0, sizeof *out);
  if (!mode) return dt_error(ctx, DT_ERR_INVALID, WHO, "no mode");
  if (!strcmp(mode, "none")) return DT_OK;
  if (!strcmp(mode, "full")) {
    out->mode = DT_AC_FULL;
    return DT_OK;
  }
  if (strcmp(mode, "selective"))
    return dt_error(ctx, DT_ERR_INVALID, WHO, "mode '%s': expected none, selective or full", mode);
  out->mode = DT_AC_SELECTIVE;
  if (!option) option = "2"; /* TorchTitan's default selective_ac_option */
  if (!strcmp(option, "op")) return DT_OK;
  char *end;
  errno = 0;
  long n = strtol(option, &end, 10);
  if (!*option || *end || errno || n < 1 || n > 1 << 20)
    return dt_error(ctx, DT_ERR_INVALID, WHO,
                    "selective_ac_option '%s': expected op or a positive integer", option);
  out->every = (int)n;
  return DT_OK;
}

const char *dt_ac_str(const dt_ac_config *ac, char *buf, size_t n) {
  if (ac->mode == DT_AC_NONE) snprintf(buf, n, "none");
  else if (ac->mode == DT_AC_FULL) snprintf(buf, n, "full");
  else if (ac->every == 0) snprintf(buf, n, "selective:op");
  else snprintf(buf, n, "selective:%d", ac->every);
  return buf;
}

bool dt_ac_block(const dt_ac_config *ac, int l) {
  if (ac->mode == DT_AC_FULL) return true;
  if (ac->mode != DT_AC_SELECTIVE) return false;
  return ac->every == 0 || (l + 1) % ac->every == 0;
}

/* The op-level policy of _save_list (activation_checkpoint.py _get_custom_policy):
 * mm (here the linear op) counted per block in forward order and saved when the
 * count is odd; SDPA and reduce_scatter saved; the rest recomputed. */
typedef struct op_policy {
  int mm_count;
} op_policy;

static bool op_policy_save(void *state, const dt_ad_call_info *c) {
  op_policy *p = state;
  if (c->op == &dt_op_linear) return ++p->mm_count % 2 == 1;
  if (c->op == &dt_op_sdpa || c->op == &dt_op_sdpa_cp) return true;
  if (c->op) return false;
  for (int i = 0; i < c->mesh_ndim; i++) /* Partial -> Shard: a reduce_scatter */
    if (c->src[i].kind == DT_PL_PARTIAL && c->dst[i].kind == DT_PL_SHARD) return true;
  return false;
}

/* Runs the modules of one part on m->step_tape: the embedding of tokens when
 * part->first (x NULL), else from x; layers [layer0, layer1) with the sublayers
 * the model has; norm and output when part->last. */
static dt_status forward_part(dt_ctx *ctx, dt_model *m, const dt_model_part *part,
                              const dt_tensor *tokens, dt_var *x, dt_var **out) {
  dt_module *mods = m->mods;
  const dt_llama_layout L = dt_llama_layout_of(&m->cfg);
  dt_var *io[1], *h = x;
  /* Lifetimes as in PyTorch: a module's values the program no longer holds once it
   * returns (everything it made but its output, and the input `h = layer(h)`
   * replaces) are released to the tape, which frees each once no backward still to
   * come reads it (dt_var_release): an op's saved tensors outlive its forward, the
   * rest does not. */
  dt_tape *tp = m->step_tape;
  if (part->first) {
    dt_module *emb = &mods[L.emb];
    const size_t mark = dt_tape_mark(tp);
    DT_CHECK(const_leaf(ctx, m, tokens, &io[0]));
    DT_CHECK(hook(ctx, m, emb, true, io, 1));
    DT_CHECK(op2(m, &dt_op_embedding, NULL, wvar(emb), io[0], &h));
    io[0] = h;
    DT_CHECK(hook(ctx, m, emb, false, io, 1));
    h = io[0];
    dt_tape_release_since(tp, mark, 1, &h);
  }
  for (int l = part->layer0; l < part->layer1; l++) {
    dt_module *blk = &mods[L.block0 + l * L.per_layer];
    dt_var *const h_in = h;
    const size_t mark = dt_tape_mark(tp);
    io[0] = h;
    DT_CHECK(hook(ctx, m, blk, true, io, 1));
    h = io[0];
    /* the checkpoint wraps the block inside its hooks (TorchTitan applies AC before
     * fully_shard, so FSDP's gather and reshard stay outside) */
    const bool ckpt = dt_ac_block(&m->ac, l);
    op_policy pol = {0};
    const bool by_op = m->ac.mode == DT_AC_SELECTIVE && m->ac.every == 0;
    const dt_checkpoint_opts co = {by_op ? op_policy_save : NULL, &pol, m->ac.fault_zero_call};
    if (ckpt) DT_CHECK(dt_tape_checkpoint_begin(m->step_tape, &co));
    dt_var *xn, *a, *f;
    if (L.attn >= 0) {
      DT_CHECK(rmsnorm(ctx, m, &blk[L.attn], h, &xn));
      DT_CHECK(attention(ctx, m, &blk[L.attn + 1], xn, &a));
      DT_CHECK(op2(m, &dt_op_add, NULL, h, a, &h));
    }
    if (L.ffn >= 0) {
      DT_CHECK(rmsnorm(ctx, m, &blk[L.ffn], h, &xn));
      DT_CHECK(feed_forward(ctx, m, &blk[L.ffn + 1], xn, &f));
      DT_CHECK(op2(m, &dt_op_add, NULL, h, f, &h));
    }
    if (ckpt) DT_CHECK(dt_tape_checkpoint_end(m->step_tape, 1, &h));
    io[0] = h;
    DT_CHECK(hook(ctx, m, blk, false, io, 1));
    h = io[0];
    dt_tape_release_since(tp, mark, 1, &h);
    if (h_in != x) dt_var_release(tp, h_in); /* the caller's x is the caller's */
  }
  if (part->last) {
    dt_var *const h_in = h;
    const size_t mark = dt_tape_mark(tp);
    DT_CHECK(rmsnorm(ctx, m, &mods[L.head], h, &h));
    DT_CHECK(linear(ctx, m, &mods[L.head + 1], h, &h));
    dt_tape_release_since(tp, mark, 1, &h);
    if (h_in != x) dt_var_release(tp, h_in);
  }
  *out = h;
  return DT_OK;
}

/* The whole model from in (tokens, or x without the embedding), the root's
 * parameter hooks around it. */
static dt_status forward_whole(dt_ctx *ctx, dt_model *m, const char *who, const dt_tensor *in,
                               dt_var **out) {
  if (!ctx || !m || !in || !out) return dt_error(ctx, DT_ERR_INVALID, who, "NULL argument");
  *out = NULL;
  if (!m->tape) return dt_error(ctx, DT_ERR_INVALID, who, "call dt_model_materialize first");
  const dt_llama_config *c = &m->cfg;
  if (!c->no_embedding && (in->ndim != 2 || in->dtype != DT_I64 || in->mesh != m->mesh))
    return dt_error(ctx, DT_ERR_INVALID, who, "tokens must be i64 [b, s] on the model's mesh");
  if (c->no_embedding && (in->ndim != 3 || in->gshape[2] != c->dim || in->dtype != m->dtype ||
                          in->mesh != m->mesh))
    return dt_error(ctx, DT_ERR_INVALID, who,
                    "the model has no tok_embeddings: its input is x [b, s, %d] in the model's "
                    "dtype on its mesh", c->dim);
  if (!m->step_tape) DT_CHECK(dt_tape_create(ctx, NULL, &m->step_tape));
  const dt_model_part whole = {!c->no_embedding, 0, c->n_layers, !c->no_head};
  dt_var *io[1], *x = NULL;
  if (c->no_embedding || m->param_pre) DT_CHECK(const_leaf(ctx, m, in, &x));
  if (m->param_pre) { /* the root's parameter hook sees the input */
    io[0] = x;
    DT_CHECK(m->param_pre(ctx, &m->mods[0], m->step_tape, io, 1, m->param_state));
    x = io[0];
  }
  DT_CHECK(forward_part(ctx, m, &whole, c->no_embedding ? NULL : in, c->no_embedding ? x : NULL,
                        out));
  if (m->param_post) {
    io[0] = *out;
    DT_CHECK(m->param_post(ctx, &m->mods[0], m->step_tape, io, 1, m->param_state));
    *out = io[0];
  }
  return DT_OK;
}

dt_status dt_model_forward(dt_ctx *ctx, dt_model *m, const dt_tensor *tokens, dt_var **logits) {
  if (m && (m->cfg.no_embedding || m->cfg.no_head))
    return dt_error(ctx, DT_ERR_INVALID, "dt_model_forward",
                    "the model has no %s: dt_model_forward_input",
                    m->cfg.no_embedding ? "tok_embeddings" : "head (norm, output)");
  return forward_whole(ctx, m, "dt_model_forward", tokens, logits);
}

dt_status dt_model_forward_input(dt_ctx *ctx, dt_model *m, const dt_tensor *in, dt_var **out) {
  return forward_whole(ctx, m, "dt_model_forward_input", in, out);
}

dt_status dt_model_forward_part(dt_ctx *ctx, dt_model *m, const dt_model_part *part,
                                const dt_tensor *tokens, dt_var *x, dt_var **out) {
  const char *who = "dt_model_forward_part";
  if (!ctx || !m || !part || !out) return dt_error(ctx, DT_ERR_INVALID, who, "NULL argument");
  *out = NULL;
  if (!m->tape) return dt_error(ctx, DT_ERR_INVALID, who, "call dt_model_materialize first");
  if (part->layer0 < 0 || part->layer1 < part->layer0 || part->layer1 > m->cfg.n_layers ||
      (!part->first && !part->last && part->layer0 == part->layer1))
    return dt_error(ctx, DT_ERR_INVALID, who, "layers [%d, %d) of %d, %s%s", part->layer0,
                    part->layer1, m->cfg.n_layers, part->first ? "first" : "not first",
                    part->last ? ", last" : "");
  if ((part->first && m->cfg.no_embedding) || (part->last && m->cfg.no_head))
    return dt_error(ctx, DT_ERR_INVALID, who, "the model has no %s for a %s part",
                    part->first && m->cfg.no_embedding ? "tok_embeddings" : "head",
                    part->first && m->cfg.no_embedding ? "first" : "last");
  if (part->first && (!tokens || x || tokens->ndim != 2 || tokens->dtype != DT_I64 ||
                      tokens->mesh != m->mesh))
    return dt_error(ctx, DT_ERR_INVALID, who,
                    "the first part takes tokens (i64 [b, s] on the model's mesh) and no x");
  if (!part->first && (tokens || !x || dt_var_value(x)->mesh != m->mesh))
    return dt_error(ctx, DT_ERR_INVALID, who, "a later part takes x on the model's mesh, no tokens");
  if (!m->step_tape) DT_CHECK(dt_tape_create(ctx, NULL, &m->step_tape));
  return forward_part(ctx, m, part, tokens, x, out);
}

dt_status dt_model_loss(dt_ctx *ctx, dt_model *m, dt_var *logits, const dt_tensor *targets,
                        dt_var **loss) {
  if (!ctx || !m || !logits || !targets || !loss)
    return dt_error(ctx, DT_ERR_INVALID, "dt_model_loss", "NULL argument");
  *loss = NULL;
  if (!m->step_tape)
    return dt_error(ctx, DT_ERR_INVALID, "dt_model_loss", "no step: call dt_model_forward first");
  dt_var *t;
  DT_CHECK(const_leaf(ctx, m, targets, &t));
  /* bf16 logits are upcast first, as TorchTitan's loss does (torchtitan/components/
   * loss.py cross_entropy_loss: cross_entropy(pred.flatten(0, 1).float(), ...)), and
   * the f32 loss is PyTorch's unfused one (log_softmax, then nll_loss) with its
   * memory: the loss, log_softmax's output and the gradients are f32 */
  const size_t mark = dt_tape_mark(m->step_tape);
  dt_var *const x0 = logits;
  if (dt_var_value(logits)->dtype == DT_BF16) {
    dt_op_attrs c = DT_OP_ATTRS_INIT;
    c.i0 = (int)DT_F32;
    dt_var *x[1] = {logits};
    DT_CHECK(dt_ad_op(m->step_tape, &dt_op_cast, &c, x, &logits));
  }
  /* the second output (each position's log-sum-exp; of the f32 loss, log_softmax's
   * output, as PyTorch's unfused cross_entropy keeps it) stays for the backward */
  const dt_op *ce = logits != x0 ? &dt_op_log_softmax_nll : &dt_op_cross_entropy;
  dt_var *in[2] = {logits, t}, *out[2];
  DT_CHECK(dt_ad_op(m->step_tape, ce, NULL, in, out));
  *loss = out[0];
  /* the loss function's values (the f32 copy, the statistics) live for its backward */
  dt_tape_release_since(m->step_tape, mark, 1, loss);
  return DT_OK;
}

dt_status dt_model_backward(dt_ctx *ctx, dt_model *m, dt_var *loss) {
  if (!ctx || !m || !loss)
    return dt_error(ctx, DT_ERR_INVALID, "dt_model_backward", "NULL argument");
  if (!m->step_tape)
    return dt_error(ctx, DT_ERR_INVALID, "dt_model_backward", "no step: call dt_model_forward");
  return dt_backward(m->step_tape, loss, NULL);
}

dt_status dt_model_end_step(dt_ctx *ctx, dt_model *m) {
  if (!ctx || !m) return dt_error(ctx, DT_ERR_INVALID, "dt_model_end_step", "NULL argument");
  dt_tape_free(m->step_tape);
  m->step_tape = NULL;
  for (int i = 0; i < m->n_mods; i++) m->mods[i].compute = NULL;
  return DT_OK;
}

void dt_model_state_bytes(const dt_model *m, dt_model_mem *out) {
  memset(out, 0, sizeof *out);
  for (int i = 0; m && i < m->n_mods; i++) {
    const dt_module *md = &m->mods[i];
    if (!md->weight) continue;
    const dt_array *w = &dt_var_value(md->weight)->local;
    if (w->data) out->params += (int64_t)dt_array_bytes(w); /* released: not held */
    const dt_tensor *g = dt_var_grad(md->weight);
    if (g) out->grads += (int64_t)dt_array_bytes(&g->local);
    if (m->adam_m[i].mesh)
      out->optimizer += (int64_t)(dt_array_bytes(&m->adam_m[i].local) +
                                  dt_array_bytes(&m->adam_v[i].local));
    if (m->adam_master[i].mesh) out->optimizer += (int64_t)dt_array_bytes(&m->adam_master[i].local);
  }
}

/* ---- AdamW -------------------------------------------------------------------------- */

/* AdamW on a weight's elements [at, at + n) (its state's shard) from the
 * gradient gp (the weight's layout, any float dtype): the optim.adamw kernel of
 * the device the weight lives on (the CPU's: the host loop). A bf16 weight gets
 * f32 master weights, made from it at its first step (a model initialised in
 * bf16 then trained with f32 masters). */
static dt_status adamw_kernel(dt_ctx *ctx, dt_model *m, int i, const dt_adamw *o, double bc1,
                              double bc2, const dt_tensor *gp, int64_t at, int64_t n) {
  static const char WHO[] = "dt_model_adamw_step";
  dt_module *md = &m->mods[i];
  dt_tensor *w = (dt_tensor *)dt_var_value(md->weight);
  const dt_tensor *mt = &m->adam_m[i], *vt = &m->adam_v[i];
  const dt_array *la[4] = {&w->local, &gp->local, &mt->local, &vt->local};
  for (int j = 0; j < 4; j++)
    if (la[j]->dev != w->local.dev || la[j]->numel != (j < 2 ? w->local.numel : n))
      return dt_error(ctx, DT_ERR_INVALID, WHO,
                      "%s: the weight, its gradient and state are not on one device in one layout",
                      md->fqn);
  dt_kdev kd;
  DT_CHECK(dt_device_kernels(ctx, w->local.dev, WHO, &kd));
  if (!kd.k->optim || !kd.k->optim->adamw)
    return dt_error(ctx, DT_ERR_UNSUPPORTED, WHO, "the device has no kernel adamw");
  dt_tensor *ms = &m->adam_master[i];
  if (w->dtype == DT_BF16 && !ms->mesh) {
    DT_CHECK(dt_tensor_rand(ctx, m->mesh, w->ndim, w->gshape, DT_F32, md->has_opl ? md->opl : w->pl,
                            0, 0, DT_RNG_UNIFORM, 0.0, 0.0, ms));
    dt_status s = local_to_device(ctx, &ms->local);
    if (s == DT_OK)
      s = dt_device_convert(kd.dev, DT_BF16, (const char *)w->local.data + at * 2, DT_F32,
                            ms->local.data, n);
    if (s != DT_OK) {
      dt_tensor_free(ctx, ms);
      memset(ms, 0, sizeof *ms);
      return s;
    }
  }
  const dt_kern_adamw_hp hp = {o->lr, o->beta1, o->beta2, o->eps, o->weight_decay, bc1, bc2};
  const size_t ws = dt_dtype_size(w->dtype), gs = dt_dtype_size(gp->dtype);
  /* the compute ledger: 15 FLOPs per element (the update's multiplies, adds,
   * sqrt and divide); w, g, m, v (and the master) read, w, m, v (master) written */
  const int64_t nst = ms->mesh ? 4 : 3;
  dt_kledger_kernel(ctx, "adamw", mt->dtype, 15.0 * (double)n,
                    (uint64_t)n * (ws + gs + (uint64_t)(nst - 1) * dt_dtype_size(mt->dtype)),
                    (uint64_t)n * (ws + (uint64_t)(nst - 1) * dt_dtype_size(mt->dtype)));
  return kd.k->optim->adamw(kd.dev, n, mt->dtype, ms->mesh ? ms->local.data : NULL,
                            mt->local.data, vt->local.data, gp->dtype,
                            (const char *)gp->local.data + (size_t)at * gs, w->dtype,
                            (char *)w->local.data + (size_t)at * ws, &hp);
}

static dt_status adamw_one(dt_ctx *ctx, dt_model *m, int i, const dt_adamw *o, double bc1,
                           double bc2) {
  dt_module *md = &m->mods[i];
  const dt_tensor *g0 = dt_var_grad(md->weight);
  if (!g0) return DT_OK; /* no gradient: skipped, as torch.optim does */
  /* The optimizer owns the weights' values and updates them in place (the
   * variable is not const; the accessor is). */
  dt_tensor *w = (dt_tensor *)dt_var_value(md->weight);
  /* the gradient in the weight's placements: reduced (P -> R: all_reduce, P -> S:
   * reduce_scatter) or resharded; used as it is when it already matches */
  bool same = true;
  for (int d = 0; d < w->mesh_ndim; d++) same = same && dt_placement_eq(g0->pl[d], w->pl[d]);
  dt_tensor gr = {0};
  if (!same) DT_CHECK(dt_redistribute(ctx, g0, w->pl, DT_PLANNER_GREEDY, &gr));
  const dt_tensor *gp = same ? g0 : &gr;
  dt_status s = DT_OK;
  /* the state's placements: the weight's, or (ZeRO-1) a row shard of it; its
   * dtype the weight's, f32 for bf16 weights (f32 moments and master weights) */
  const dt_placement *spl = md->has_opl ? md->opl : w->pl;
  const dt_dtype sdt = w->dtype == DT_BF16 ? DT_F32 : w->dtype;
  const bool fresh = !m->adam_m[i].mesh;
  for (int k = 0; k < 2 && s == DT_OK && fresh; k++) {
    dt_tensor *st = k ? &m->adam_v[i] : &m->adam_m[i];
    s = dt_tensor_rand(ctx, m->mesh, w->ndim, w->gshape, sdt, spl, 0, 0, DT_RNG_UNIFORM, 0.0, 0.0,
                       st);
    if (s == DT_OK) s = local_to_device(ctx, &st->local);
    if (s != DT_OK) { /* neither state, so that the next step makes both */
      for (int q = 0; q <= k; q++) {
        dt_tensor *t = q ? &m->adam_v[i] : &m->adam_m[i];
        if (t->mesh) dt_tensor_free(ctx, t);
        memset(t, 0, sizeof *t);
      }
    }
  }
  /* the state covers rows [r0, r0 + n / row) of the weight's local array */
  const dt_tensor *st = &m->adam_m[i];
  const int64_t row = w->ndim > 1 ? w->local.numel / (w->local.shape[0] ? w->local.shape[0] : 1) : 1;
  const int64_t r0 = s == DT_OK && w->ndim ? st->goffset[0] - w->goffset[0] : 0;
  const int64_t n = s == DT_OK ? st->local.numel : 0, at = r0 * row;
  if (s == DT_OK && (r0 < 0 || at + n > w->local.numel))
    s = dt_error(ctx, DT_ERR_INVALID, "dt_model_adamw_step",
                 "%s: the state's shard is not rows of the weight's", md->fqn);
  if (s == DT_OK) s = adamw_kernel(ctx, m, i, o, bc1, bc2, gp, at, n);
  if (!same) dt_tensor_free(ctx, &gr);
  return s;
}

dt_status dt_model_adamw_step(dt_ctx *ctx, dt_model *m, const dt_adamw *opt) {
  if (!ctx || !m || !opt)
    return dt_error(ctx, DT_ERR_INVALID, "dt_model_adamw_step", "NULL argument");
  if (!m->tape)
    return dt_error(ctx, DT_ERR_INVALID, "dt_model_adamw_step", "model not materialized");
  m->adam_step++;
  const double bc1 = 1.0 - pow(opt->beta1, m->adam_step);
  const double bc2 = 1.0 - pow(opt->beta2, m->adam_step);
  for (int i = 0; i < m->n_mods; i++) {
    if (!m->mods[i].weight) continue;
    DT_CHECK(adamw_one(ctx, m, i, opt, bc1, bc2));
  }
  dt_tape_zero_grad(m->tape);
  return DT_OK;
}
