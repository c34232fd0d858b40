/* verify/test_nn.c: the Llama model of lib/nn (configs, weights, forward, backward,
 * AdamW) against independent references.
 *
 * What it checks (threads backend, f64 unless said):
 *  - configs: the four flavours' dims (llama3_args in
 *    torchtitan/models/llama3/__init__.py, TorchTitan v0.2.0) and FFN hidden
 *    sizes (FeedForward.__init__ in torchtitan/models/llama3/model/model.py:
 *    int(2 * 4 * dim / 3), times ffn_dim_multiplier, rounded up to multiple_of),
 *    parameter counts (6.16M, 8.03B, 70.55B, 405.85B to the printed
 *    digits), dt_llama_config_check rejecting bad custom configs, the module
 *    list (count, fqns, parents before children).
 *  - the module tree (dt_llama_module_at): the parameters of 8B (8,030,261,248)
 *    and debugmodel (derived here from its config) summed over it, 4 kv heads
 *    taking exactly wk's and wv's rows off; fqns, kinds, blocks and shapes at
 *    the model's positions; a part's tree; dt_model_create's modules equal to it.
 *  - on a tiny custom config (dim 32, 2 layers, 4 heads, 2 kv heads, vocab 64,
 *    batch 2, seq 8) on a 1-rank mesh:
 *    (a) the model's loss equals a naive C implementation of the same model
 *        written here on plain arrays (embedding, RMSNorm, linear, interleaved
 *        RoPE with the Llama 3.1 scaling, causal GQA attention, SwiGLU, mean
 *        cross-entropy) from the same weights read back with dt_tensor_full;
 *    (b) weight gradients equal central finite differences of the model's loss;
 *    (c) two AdamW steps equal a naive AdamW (PyTorch's formula) applied here;
 *    (d) the initialisation: same seed -> identical weights, another seed ->
 *        different; truncated-normal weights within their bounds with about the
 *        right std; and weights generated sharded (S(0), and S(1) for matrices)
 *        on a 4-rank mesh, gathered, equal the 1-rank weights exactly;
 *    (e) the model run as two parts (dt_model_forward_part, a pipeline's stages)
 *        on two tapes, the second's input a leaf and the first's backward seeded
 *        with that leaf's gradient, equals the whole model bit for bit (logits,
 *        loss, every weight gradient); bad parts are refused.
 *    (f) the single-layer parts (dt_llama_config's no_*: the embedding alone, one
 *        block of attention only or feed_forward only, norm + output alone):
 *        exactly their modules, their parameter and FLOP counts derived here
 *        (TorchTitan's get_dense_model_nparams_and_flops over those modules),
 *        the output (or, for the head, the cross-entropy of the logits) equal to
 *        the naive model's pieces, weight gradients of the probe loss
 *        mean(y * R) (or the cross-entropy) equal to central differences;
 *        dt_model_forward and a first part refused without the embedding.
 * What it is not: a test of sharded forward/backward (test_parallel) or of the
 * ops themselves (test_ops_*).
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* ---- configs ------------------------------------------------------------------------- */

static void check_configs(void) {
  struct {
    const char *name;
    int dim, layers, heads, kv, vocab, ffn;
    double params; /* the reference table's rounded count */
    double unit;   /* its printed precision (1e4 for "6.16 M", 1e7 for "8.03 B") */
  } want[] = {
      {"debugmodel", 256, 6, 16, 16, 2048, 768, 6.16e6, 1e4},
      {"8B", 4096, 32, 32, 8, 128256, 14336, 8.03e9, 1e7},
      {"70B", 8192, 80, 64, 8, 128256, 28672, 70.55e9, 1e7},
      {"405B", 16384, 126, 128, 8, 128256, 53248, 405.85e9, 1e7},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    dt_llama_config c;
    dt_status s = dt_llama_config_get(NULL, want[i].name, &c);
    TU_CHECK(s == DT_OK, "config %s: %s", want[i].name, dt_status_str(s));
    if (s != DT_OK) continue;
    TU_CHECK(c.dim == want[i].dim && c.n_layers == want[i].layers && c.n_heads == want[i].heads &&
                 c.n_kv_heads == want[i].kv && c.vocab == want[i].vocab,
             "config %s: dims differ from the reference table", want[i].name);
    TU_CHECK(c.norm_eps == 1e-5 && c.rope_theta == 500000.0 && c.rope_scaling && c.depth_init,
             "config %s: eps/theta/scaling/depth_init", want[i].name);
    TU_CHECK(dt_llama_ffn_hidden(&c) == want[i].ffn, "config %s: ffn hidden %d, want %d",
             want[i].name, dt_llama_ffn_hidden(&c), want[i].ffn);
    double np = (double)dt_llama_nparams(&c);
    /* the table rounds to its printed digits: within half a unit */
    TU_CHECK(fabs(np - want[i].params) <= 0.5 * want[i].unit, "config %s: nparams %.0f, want %.6g",
             want[i].name, np, want[i].params);
    printf("  %-10s dim %5d layers %3d heads %3d kv %2d ffn %5d nparams %.0f\n", c.name, c.dim,
           c.n_layers, c.n_heads, c.n_kv_heads, dt_llama_ffn_hidden(&c), np);
    TU_CHECK(dt_llama_config_check(NULL, &c) == DT_OK, "config %s fails its check", c.name);
  }
  dt_llama_config c;
  TU_CHECK(dt_llama_config_get(NULL, "7B", &c) == DT_ERR_INVALID, "unknown flavour accepted");
  dt_llama_config_get(NULL, "debugmodel", &c);
  dt_llama_config bad = c;
  bad.n_heads = 7; /* 256 % 7 != 0 */
  TU_CHECK(dt_llama_config_check(NULL, &bad) == DT_ERR_INVALID, "dim %% heads accepted");
  bad = c;
  bad.n_kv_heads = 3; /* 16 % 3 != 0 */
  TU_CHECK(dt_llama_config_check(NULL, &bad) == DT_ERR_INVALID, "heads %% kv accepted");
  bad = c;
  bad.n_heads = 128; /* head_dim 2: fine */
  TU_CHECK(dt_llama_config_check(NULL, &bad) == DT_OK, "head_dim 2 rejected");
  bad.n_heads = 256; /* head_dim 1: odd, rope cannot pair */
  bad.n_kv_heads = 16;
  TU_CHECK(dt_llama_config_check(NULL, &bad) == DT_ERR_INVALID, "odd head_dim accepted");
  bad = c;
  bad.norm_eps = 0;
  TU_CHECK(dt_llama_config_check(NULL, &bad) == DT_ERR_INVALID, "eps 0 accepted");
}

/* ---- the module tree (dt_llama_module_at) ------------------------------------------ */

/* Weight elements of a config's tree, and its module count. */
static int64_t tree_params(const dt_llama_config *c, int *n_mods) {
  int64_t sum = 0;
  int n = 0;
  dt_llama_module md;
  for (; dt_llama_module_at(c, n, &md); n++)
    if (md.wndim) sum += md.wshape[0] * (md.wndim == 2 ? md.wshape[1] : 1);
  if (n_mods) *n_mods = n;
  return sum;
}

static void check_tree(void) {
  dt_llama_config c8, dm, kv4;
  TU_OK(NULL, dt_llama_config_get(NULL, "8B", &c8));
  TU_OK(NULL, dt_llama_config_get(NULL, "debugmodel", &dm));
  TU_OK(NULL, dt_llama_config_get(NULL, "debugmodel:n_kv_heads=4", &kv4));
  /* Llama 3 8B: 8,030,261,248 parameters (Meta's model card rounds it to 8.0B;
   * TorchTitan logs this exact count): dim 4096, 32 layers, 32 heads, 8 kv heads of
   * 128, vocab 128256, FFN 14336: 2 x 128256 x 4096 + 4096 + 32 x (2 x 4096^2 +
   * 2 x 1024 x 4096 + 3 x 4096 x 14336 + 2 x 4096) */
  int n = 0;
  int64_t got = tree_params(&c8, &n);
  TU_CHECK(got == 8030261248LL, "tree: 8B has %lld parameters, want 8030261248", (long long)got);
  TU_CHECK(n == 3 + 32 * 12 + 1, "tree: 8B has %d modules, want %d", n, 3 + 32 * 12 + 1);
  /* debugmodel from its config: dim 256, 6 layers, 16 heads = kv heads, vocab 2048,
   * FFN int(2 x 4 x 256 / 3) = 682 rounded up to a multiple of 256: 768 */
  const int64_t D = 256, L = 6, V = 2048, F = 768;
  const int64_t want_dm = 2 * V * D + D + L * (4 * D * D + 3 * D * F + 2 * D);
  got = tree_params(&dm, &n);
  TU_CHECK(got == want_dm, "tree: debugmodel has %lld parameters, want %lld", (long long)got,
           (long long)want_dm);
  TU_CHECK(got == dt_llama_nparams(&dm), "tree: debugmodel %lld, dt_llama_nparams %lld",
           (long long)got, (long long)dt_llama_nparams(&dm));
  /* fewer kv heads: wk and wv lose (16 - 4) x 16 rows in each of the 6 layers */
  const int64_t got4 = tree_params(&kv4, NULL);
  TU_CHECK(got - got4 == L * 2 * (16 - 4) * 16 * D, "tree: 4 kv heads take %lld parameters off, "
           "want %lld", (long long)(got - got4), (long long)(L * 2 * (16 - 4) * 16 * D));
  /* the order, names, kinds and blocks: TorchTitan's Transformer, parents first */
  static const struct {
    int i;
    const char *fqn;
    dt_module_kind kind;
    dt_llama_role role;
    int layer, wndim;
    int64_t w0, w1;
  } at[] = {{0, "", DT_MOD_MODEL, DT_LR_MODEL, -1, 0, 0, 0},
            {1, "tok_embeddings", DT_MOD_EMBEDDING, DT_LR_TOK_EMBEDDINGS, -1, 2, 2048, 256},
            {2, "layers.0", DT_MOD_BLOCK, DT_LR_BLOCK, 0, 0, 0, 0},
            {3, "layers.0.attention_norm", DT_MOD_RMSNORM, DT_LR_ATTENTION_NORM, 0, 1, 256, 0},
            {4, "layers.0.attention", DT_MOD_ATTENTION, DT_LR_ATTENTION, 0, 0, 0, 0},
            {6, "layers.0.attention.wk", DT_MOD_LINEAR, DT_LR_WK, 0, 2, 256, 256},
            {8, "layers.0.attention.wo", DT_MOD_LINEAR, DT_LR_WO, 0, 2, 256, 256},
            {9, "layers.0.ffn_norm", DT_MOD_RMSNORM, DT_LR_FFN_NORM, 0, 1, 256, 0},
            {10, "layers.0.feed_forward", DT_MOD_FEEDFORWARD, DT_LR_FEED_FORWARD, 0, 0, 0, 0},
            {12, "layers.0.feed_forward.w2", DT_MOD_LINEAR, DT_LR_W2, 0, 2, 256, 768},
            {13, "layers.0.feed_forward.w3", DT_MOD_LINEAR, DT_LR_W3, 0, 2, 768, 256},
            {14, "layers.1", DT_MOD_BLOCK, DT_LR_BLOCK, 1, 0, 0, 0},
            {2 + 6 * 12 - 1, "layers.5.feed_forward.w3", DT_MOD_LINEAR, DT_LR_W3, 5, 2, 768, 256},
            {2 + 6 * 12, "norm", DT_MOD_RMSNORM, DT_LR_NORM, -1, 1, 256, 0},
            {3 + 6 * 12, "output", DT_MOD_LINEAR, DT_LR_OUTPUT, -1, 2, 2048, 256}};
  TU_CHECK(n == 4 + 6 * 12, "tree: debugmodel has %d modules, want %d", n, 4 + 6 * 12);
  dt_llama_module md;
  for (size_t k = 0; k < sizeof at / sizeof at[0]; k++) {
    TU_CHECK(dt_llama_module_at(&dm, at[k].i, &md), "tree: no module %d", at[k].i);
    TU_CHECK(!strcmp(md.fqn, at[k].fqn) && md.kind == at[k].kind && md.role == at[k].role &&
                 md.layer == at[k].layer && md.wndim == at[k].wndim &&
                 md.wshape[0] == at[k].w0 && md.wshape[1] == at[k].w1,
             "tree: module %d is '%s' (kind %d role %d layer %d, %d-D [%lld, %lld]), want '%s'",
             at[k].i, md.fqn, (int)md.kind, (int)md.role, md.layer, md.wndim,
             (long long)md.wshape[0], (long long)md.wshape[1], at[k].fqn);
  }
  TU_CHECK(!dt_llama_module_at(&dm, n, &md) && !dt_llama_module_at(&dm, -1, &md) && !md.fqn[0],
           "tree: a module past the end");
  /* a part: the whole model's tree without the parts no_* leaves out */
  dt_llama_config ffn = dm;
  ffn.no_embedding = ffn.no_attention = ffn.no_head = true;
  got = tree_params(&ffn, &n);
  TU_CHECK(got == L * (3 * D * F + D) && n == 1 + 6 * 6, "tree: feed_forward only: %lld "
           "parameters in %d modules", (long long)got, n);
  const dt_llama_config back = dt_llama_config_whole(&ffn);
  TU_CHECK(tree_params(&back, NULL) == want_dm, "tree: dt_llama_config_whole lost modules");
  /* dt_model_create lists the same modules (a model described only: no mesh) */
  const dt_llama_config *cs[] = {&c8, &kv4, &ffn};
  dt_ctx hc;
  dt_ctx_init(&hc, 0, 1);
  for (int k = 0; k < 3; k++) {
    dt_model *m = NULL;
    TU_OK(&hc, dt_model_create(&hc, NULL, cs[k], DT_F32, 0, &m));
    if (!m) continue;
    tree_params(cs[k], &n);
    TU_CHECK(m->n_mods == n, "tree: the model has %d modules, the tree %d", m->n_mods, n);
    for (int i = 0; i < m->n_mods && dt_llama_module_at(cs[k], i, &md); i++) {
      const dt_module *o = &m->mods[i];
      TU_CHECK(!strcmp(o->fqn, md.fqn) && o->kind == md.kind && o->index == i &&
                   o->wndim == md.wndim && o->wshape[0] == md.wshape[0] &&
                   o->wshape[1] == (md.wndim == 2 ? md.wshape[1] : 0) && o->init == md.init &&
                   o->init_std == md.init_std && o->init_trunc == md.init_trunc,
               "tree: model module %d '%s' differs from the tree's '%s'", i, o->fqn, md.fqn);
    }
    dt_model_free(&hc, m);
  }
  dt_ctx_release(&hc);
  printf("  tree: 8B 8030261248 parameters, debugmodel %lld in %d modules\n", (long long)want_dm,
         4 + 6 * 12);
}

/* ---- the tiny model ------------------------------------------------------------------- */

enum { TB = 2, TS = 8 };            /* batch, seq */
static const uint64_t SEED = 1234;  /* any fixed seed */

static dt_llama_config tiny_config(void) {
  dt_llama_config c;
  memset(&c, 0, sizeof c);
  snprintf(c.name, sizeof c.name, "tiny");
  c.dim = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.vocab = 64;
  c.multiple_of = 16; /* hidden int(2*128/3) = 85 -> 96 */
  c.norm_eps = 1e-5;
  c.rope_theta = 500000;
  c.rope_scaling = true; /* head_dim 8 at theta 5e5: pairs in all three scaling bands */
  c.depth_init = true;
  return c;
}

/* tokens and targets (i64 [TB, TS]), a fixed pseudo-random pattern */
static void make_ids(dt_ctx *ctx, dt_mesh *mesh, int vocab, int salt, dt_tensor *out) {
  int64_t ids[TB * TS];
  for (int i = 0; i < TB * TS; i++) ids[i] = (int64_t)((i * 37 + salt * 11 + 5) % vocab);
  const int64_t sh[2] = {TB, TS};
  dt_array a;
  TU_OK(ctx, dt_array_wrap(ctx, DT_DEV_CPU, DT_I64, 2, sh, ids, &a));
  dt_placement pl[DT_MAX_MESH_DIMS];
  memset(pl, 0, sizeof pl);
  TU_OK(ctx, dt_tensor_distribute(ctx, mesh, &a, pl, out));
}

static double loss_value(dt_ctx *ctx, dt_var *loss) {
  dt_array f;
  double v = NAN;
  if (dt_tensor_full(ctx, dt_var_value(loss), &f) == DT_OK) {
    v = ((const double *)f.data)[0];
    dt_array_free(ctx, &f);
  }
  return v;
}

/* forward + loss (+ backward); ends the step. */
static double model_step(dt_ctx *ctx, dt_model *m, const dt_tensor *tok, const dt_tensor *tgt,
                         bool backward) {
  dt_var *logits = NULL, *loss = NULL;
  double v = NAN;
  dt_status s = dt_model_forward(ctx, m, tok, &logits);
  TU_OK(ctx, s);
  if (s == DT_OK) TU_OK(ctx, s = dt_model_loss(ctx, m, logits, tgt, &loss));
  if (s == DT_OK) v = loss_value(ctx, loss);
  if (s == DT_OK && backward) TU_OK(ctx, dt_model_backward(ctx, m, loss));
  TU_OK(ctx, dt_model_end_step(ctx, m));
  return v;
}

/* Full (gathered) copy of every module weight, indexed by module; NULL for none. */
static double **full_weights(dt_ctx *ctx, dt_model *m, bool grads) {
  double **w = calloc((size_t)m->n_mods, sizeof *w);
  for (int i = 0; i < m->n_mods; i++) {
    if (!m->mods[i].weight) continue;
    const dt_tensor *t = grads ? dt_var_grad(m->mods[i].weight) : dt_var_value(m->mods[i].weight);
    if (!t) continue;
    dt_array f;
    TU_OK(ctx, dt_tensor_full(ctx, t, &f));
    w[i] = malloc((size_t)f.numel * sizeof(double));
    if (f.dtype == DT_F64) memcpy(w[i], f.data, (size_t)f.numel * sizeof(double));
    else
      for (int64_t e = 0; e < f.numel; e++) w[i][e] = ((const float *)f.data)[e];
    dt_array_free(ctx, &f);
  }
  return w;
}

static void free_weights(const dt_model *m, double **w) {
  for (int i = 0; i < m->n_mods; i++) free(w[i]);
  free(w);
}

/* ---- the naive reference (plain arrays, no lib/ops) ------------------------------------- */

typedef struct naive {
  int D, L, H, KV, V, F, hd;
  double eps, theta;
  bool scaling;
} naive;

/* y[n, o] = x[n, i] W[o, i] */
static void nv_linear(int n, int in, int out, const double *x, const double *W, double *y) {
  for (int r = 0; r < n; r++)
    for (int o = 0; o < out; o++) {
      double s = 0;
      for (int k = 0; k < in; k++) s += x[r * in + k] * W[o * in + k];
      y[r * out + o] = s;
    }
}

static void nv_rmsnorm(int n, int d, double eps, const double *x, const double *w, double *y) {
  for (int r = 0; r < n; r++) {
    double ss = 0;
    for (int k = 0; k < d; k++) ss += x[r * d + k] * x[r * d + k];
    double inv = 1.0 / sqrt(ss / d + eps);
    for (int k = 0; k < d; k++) y[r * d + k] = x[r * d + k] * inv * w[k];
  }
}

/* Meta's apply_scaling (Llama 3.1): factor 8, low 1, high 4, original context 8192 */
static double nv_freq(const naive *c, int i) {
  double f = 1.0 / pow(c->theta, (2.0 * i) / c->hd);
  if (!c->scaling) return f;
  const double scale = 8, low = 1, high = 4, ctxlen = 8192;
  double wavelen = 2 * 3.14159265358979323846 / f;
  if (wavelen < ctxlen / high) return f;
  if (wavelen > ctxlen / low) return f / scale;
  double smooth = (ctxlen / wavelen - low) / (high - low);
  return (1 - smooth) * f / scale + smooth * f;
}

/* x [B, S, nh, hd] in place, interleaved pairs */
static void nv_rope(const naive *c, int nh, double *x) {
  for (int b = 0; b < TB; b++)
    for (int s = 0; s < TS; s++)
      for (int h = 0; h < nh; h++)
        for (int i = 0; i < c->hd / 2; i++) {
          double a = s * nv_freq(c, i);
          double *p = &x[((b * TS + s) * nh + h) * c->hd + 2 * i];
          double x0 = p[0], x1 = p[1];
          p[0] = x0 * cos(a) - x1 * sin(a);
          p[1] = x0 * sin(a) + x1 * cos(a);
        }
}

/* q [B, S, H, hd], k, v [B, S, KV, hd] -> o [B, S, H, hd], causal, GQA */
static void nv_attention(const naive *c, const double *q, const double *k, const double *v,
                         double *o) {
  const int hd = c->hd, rep = c->H / c->KV;
  double sc[TS];
  for (int b = 0; b < TB; b++)
    for (int h = 0; h < c->H; h++)
      for (int i = 0; i < TS; i++) {
        const double *qi = &q[((b * TS + i) * c->H + h) * hd];
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j <= i; j++) {
          const double *kj = &k[((b * TS + j) * c->KV + h / rep) * hd];
          double d = 0;
          for (int e = 0; e < hd; e++) d += qi[e] * kj[e];
          sc[j] = d / sqrt((double)hd);
          if (sc[j] > mx) mx = sc[j];
        }
        for (int j = 0; j <= i; j++) sum += (sc[j] = exp(sc[j] - mx));
        double *oi = &o[((b * TS + i) * c->H + h) * hd];
        for (int e = 0; e < hd; e++) oi[e] = 0;
        for (int j = 0; j <= i; j++) {
          const double *vj = &v[((b * TS + j) * c->KV + h / rep) * hd];
          for (int e = 0; e < hd; e++) oi[e] += sc[j] / sum * vj[e];
        }
      }
}

/* The loss of the model with weights w (indexed like the model's modules). */
static double nv_loss(const naive *c, double *const *w, const int64_t *tok, const int64_t *tgt) {
  const int N = TB * TS, D = c->D, QD = c->H * c->hd, KD = c->KV * c->hd, F = c->F;
  double *h = malloc(sizeof(double) * N * D), *x = malloc(sizeof(double) * N * D);
  double *q = malloc(sizeof(double) * N * QD), *k = malloc(sizeof(double) * N * KD);
  double *v = malloc(sizeof(double) * N * KD), *o = malloc(sizeof(double) * N * QD);
  double *t = malloc(sizeof(double) * N * D), *g = malloc(sizeof(double) * N * F);
  double *u = malloc(sizeof(double) * N * F), *lg = malloc(sizeof(double) * N * c->V);
  int mi = 1;
  for (int r = 0; r < N; r++) memcpy(&h[r * D], &w[mi][tok[r] * D], sizeof(double) * D);
  mi++;
  for (int l = 0; l < c->L; l++) {
    double *const *W = &w[mi]; /* block, attention_norm, attention, wq, wk, wv, wo, ffn_norm,
                                  feed_forward, w1, w2, w3 */
    nv_rmsnorm(N, D, c->eps, h, W[1], x);
    nv_linear(N, D, QD, x, W[3], q);
    nv_linear(N, D, KD, x, W[4], k);
    nv_linear(N, D, KD, x, W[5], v);
    nv_rope(c, c->H, q);
    nv_rope(c, c->KV, k);
    nv_attention(c, q, k, v, o);
    nv_linear(N, QD, D, o, W[6], t);
    for (int e = 0; e < N * D; e++) h[e] += t[e];
    nv_rmsnorm(N, D, c->eps, h, W[7], x);
    nv_linear(N, D, F, x, W[9], g);
    nv_linear(N, D, F, x, W[11], u);
    for (int e = 0; e < N * F; e++) g[e] = g[e] / (1 + exp(-g[e])) * u[e];
    nv_linear(N, F, D, g, W[10], t);
    for (int e = 0; e < N * D; e++) h[e] += t[e];
    mi += 12;
  }
  nv_rmsnorm(N, D, c->eps, h, w[mi], x);
  nv_linear(N, D, c->V, x, w[mi + 1], lg);
  double loss = 0;
  for (int r = 0; r < N; r++) {
    const double *z = &lg[r * c->V];
    double mx = -INFINITY, s = 0;
    for (int e = 0; e < c->V; e++) mx = z[e] > mx ? z[e] : mx;
    for (int e = 0; e < c->V; e++) s += exp(z[e] - mx);
    loss += mx + log(s) - z[tgt[r]];
  }
  free(h); free(x); free(q); free(k); free(v); free(o); free(t); free(g); free(u); free(lg);
  return loss / N;
}

/* ---- hooks ------------------------------------------------------------------------------ */

typedef struct hook_count {
  int pre[64], post[64], bad_n;
} hook_count;

/* Counts the calls and replaces the activation by a recorded redistribute to its
 * own placements (an identity with a backward), as a style's hook would. */
static dt_status count_hook(dt_ctx *ctx, dt_module *m, dt_tape *tape, dt_var **io, int n,
                            void *state, bool pre) {
  (void)ctx;
  hook_count *c = state;
  if (n != 1 || !io[0]) c->bad_n++;
  if (pre) c->pre[m->index]++;
  else c->post[m->index]++;
  dt_var *y;
  DT_CHECK(dt_ad_redistribute(tape, io[0], dt_var_value(io[0])->pl, &y));
  io[0] = y;
  return DT_OK;
}
static dt_status pre_hook(dt_ctx *ctx, dt_module *m, dt_tape *tape, dt_var **io, int n,
                          void *state) {
  return count_hook(ctx, m, tape, io, n, state, true);
}
static dt_status post_hook(dt_ctx *ctx, dt_module *m, dt_tape *tape, dt_var **io, int n,
                           void *state) {
  return count_hook(ctx, m, tape, io, n, state, false);
}

/* Every module but the root gets its pre and post hook once per forward; identity
 * hooks leave the loss and the gradients unchanged (bit for bit: same ops). */
static void check_hooks(dt_ctx *ctx, dt_model *m, const dt_tensor *tok, const dt_tensor *tgt,
                        double loss, double *const *G) {
  hook_count c;
  memset(&c, 0, sizeof c);
  TU_CHECK(m->n_mods <= 64, "too many modules for the hook test");
  if (m->n_mods > 64) return;
  for (int i = 0; i < m->n_mods; i++) {
    m->mods[i].pre = pre_hook;
    m->mods[i].post = post_hook;
    m->mods[i].hook_state = &c;
  }
  dt_tape_zero_grad(m->tape); /* gradients accumulate over backwards (PyTorch) */
  double l2 = model_step(ctx, m, tok, tgt, true);
  double **G2 = full_weights(ctx, m, true);
  TU_CHECK(l2 == loss, "hooks: loss %.17g, without hooks %.17g", l2, loss);
  TU_CHECK(c.bad_n == 0, "hooks: %d calls with n != 1 or a NULL var", c.bad_n);
  for (int i = 0; i < m->n_mods; i++) {
    int want = i == 0 ? 0 : 1;
    TU_CHECK(c.pre[i] == want && c.post[i] == want, "hooks: %s pre %d post %d, want %d",
             m->mods[i].fqn, c.pre[i], c.post[i], want);
    if (G[i] && G2[i]) {
      int64_t n = m->mods[i].wshape[0] * (m->mods[i].wndim == 2 ? m->mods[i].wshape[1] : 1);
      TU_CHECK(!memcmp(G[i], G2[i], (size_t)n * sizeof(double)), "hooks: %s gradient differs",
               m->mods[i].fqn);
    }
    m->mods[i].pre = m->mods[i].post = NULL;
    m->mods[i].hook_state = NULL;
  }
  free_weights(m, G2);
  dt_tape_zero_grad(m->tape);
  printf("  hooks: pre/post once per module boundary, identity hooks keep loss and grads\n");
}

/* ---- (a) - (c) on one rank --------------------------------------------------------------- */

/* (a) The naive loss is the same arithmetic in another order (sums of at most
 * a few hundred O(1) terms, exp/log/sqrt): differences are a few hundred ulps
 * at most (~1e-13 relative; measured here: 0). 1e-12 covers that estimate with
 * a factor 10 for other BLAS orderings and is far below any modelling error (a
 * missing scaling band or wrong head map changes the loss by > 1e-6 relative). */
static const double TOL_LOSS = 1e-12;
/* (b) central differences with h = 1e-6: truncation h^2/6 |f'''| ~ 1e-12 and
 * rounding eps |L| / h ~ 2.2e-16 * 4.2 / 1e-6 ~ 1e-9 absolute; gradients here
 * are 1e-4 .. 1, so 1e-7 absolute + 1e-5 relative is above both noise terms
 * and far below a wrong gradient (a missing term is > 1e-3 relative). */
static const double FD_H = 1e-6;
static const double TOL_FD_ABS = 1e-7, TOL_FD_REL = 1e-5;
/* (c) the same f64 operations in the same order: a few ulps; 1e-13 relative. */
static const double TOL_ADAM = 1e-13;

static naive naive_of(const dt_llama_config *c) {
  naive n = {c->dim, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab, dt_llama_ffn_hidden(c),
             c->dim / c->n_heads, c->norm_eps, c->rope_theta, c->rope_scaling};
  return n;
}

static void host_ids(dt_ctx *ctx, const dt_tensor *t, int64_t *out) {
  dt_array f;
  TU_OK(ctx, dt_tensor_full(ctx, t, &f));
  memcpy(out, f.data, sizeof(int64_t) * TB * TS);
  dt_array_free(ctx, &f);
}

static void check_fd_weight(dt_ctx *ctx, dt_model *m, const char *fqn, const dt_tensor *tok,
                            const dt_tensor *tgt, double *const *grad, int *n_checked,
                            double *worst) {
  dt_module *md = dt_model_find(m, fqn);
  TU_CHECK(md && md->weight, "no module %s", fqn);
  if (!md || !md->weight) return;
  /* the weight is modified in place for the differences (as the optimizer does) */
  dt_tensor *w = (dt_tensor *)dt_var_value(md->weight);
  double *W = w->local.data;
  const double *G = grad[md->index];
  TU_CHECK(G != NULL, "%s has no gradient", fqn);
  if (!G) return;
  const int64_t n = w->local.numel, picks[4] = {0, n / 3, (2 * n) / 3 + 1, n - 1};
  for (int p = 0; p < 4; p++) {
    int64_t e = picks[p];
    double w0 = W[e];
    W[e] = w0 + FD_H;
    double up = model_step(ctx, m, tok, tgt, false);
    W[e] = w0 - FD_H;
    double dn = model_step(ctx, m, tok, tgt, false);
    W[e] = w0;
    double fd = (up - dn) / (2 * FD_H), err = fabs(fd - G[e]);
    double tol = TOL_FD_ABS + TOL_FD_REL * fabs(fd);
    TU_CHECK(err <= tol, "grad %s[%lld]: backward %.12g, finite difference %.12g", fqn,
             (long long)e, G[e], fd);
    if (err / tol > *worst) *worst = err / tol;
    (*n_checked)++;
  }
}

/* (e) parts: the model as two parts on two tapes (a pipeline's stages on one rank):
 * part 0 = embedding + layer 0, part 1 = the other layers + norm + output. Part 1's
 * input is a leaf holding part 0's output; backward from the loss on part 1's tape
 * gives that leaf's gradient, the seed of part 0's backward. The logits, the loss
 * and every weight gradient must equal dt_model_forward's bit for bit: the same ops
 * run on the same values, and each weight is used once, so its gradient is
 * accumulated from the same single contribution. */
static void check_parts(dt_ctx *ctx, dt_model *m, const dt_tensor *tok, const dt_tensor *tgt) {
  dt_var *logits = NULL, *loss = NULL;
  TU_OK(ctx, dt_model_forward(ctx, m, tok, &logits));
  TU_OK(ctx, dt_model_loss(ctx, m, logits, tgt, &loss));
  dt_array lw, lg;
  TU_OK(ctx, dt_tensor_full(ctx, dt_var_value(logits), &lw));
  const double whole_loss = loss_value(ctx, loss);
  TU_OK(ctx, dt_model_backward(ctx, m, loss));
  double **G = full_weights(ctx, m, true);
  TU_OK(ctx, dt_model_end_step(ctx, m));
  dt_tape_zero_grad(m->tape);

  const dt_model_part p0 = {true, 0, 1, false}, p1 = {false, 1, m->cfg.n_layers, true};
  dt_tape *t0 = NULL, *t1 = NULL;
  TU_OK(ctx, dt_tape_create(ctx, NULL, &t0));
  TU_OK(ctx, dt_tape_create(ctx, NULL, &t1));
  dt_var *h = NULL, *x = NULL;
  m->step_tape = t0;
  TU_OK(ctx, dt_model_forward_part(ctx, m, &p0, tok, NULL, &h));
  const dt_tensor *hv = dt_var_value(h);
  dt_tensor xc;
  TU_OK(ctx, dt_tensor_from_local(ctx, hv->mesh, &hv->local, hv->pl, hv->ndim, hv->gshape, &xc));
  x = dt_var_leaf(t1, &xc, true);
  m->step_tape = t1;
  TU_OK(ctx, dt_model_forward_part(ctx, m, &p1, NULL, x, &logits));
  TU_OK(ctx, dt_model_loss(ctx, m, logits, tgt, &loss));
  TU_OK(ctx, dt_tensor_full(ctx, dt_var_value(logits), &lg));
  const double parts_loss = loss_value(ctx, loss);
  TU_OK(ctx, dt_backward(t1, loss, NULL));
  TU_CHECK(dt_var_grad(x) != NULL, "(e) part 1's input has no gradient");
  if (dt_var_grad(x)) TU_OK(ctx, dt_backward(t0, h, dt_var_grad(x)));
  m->step_tape = NULL;
  double **P = full_weights(ctx, m, true);
  TU_CHECK(lw.numel == lg.numel && !memcmp(lw.data, lg.data, dt_array_bytes(&lw)),
           "(e) the parts' logits differ from the whole model's");
  TU_CHECK(parts_loss == whole_loss, "(e) loss %.17g, whole model %.17g", parts_loss, whole_loss);
  int64_t differ = 0, compared = 0;
  for (int i = 0; i < m->n_mods; i++) {
    if (!m->mods[i].weight) continue;
    TU_CHECK(G[i] && P[i], "(e) %s: no gradient", m->mods[i].fqn);
    if (!G[i] || !P[i]) continue;
    int64_t n = m->mods[i].wshape[0] * (m->mods[i].wndim == 2 ? m->mods[i].wshape[1] : 1);
    compared++;
    if (memcmp(G[i], P[i], (size_t)n * sizeof(double))) differ++;
  }
  TU_CHECK(compared > 0 && differ == 0, "(e) %lld of %lld weight gradients differ", (long long)differ,
           (long long)compared);
  printf("  (e) two parts on two tapes = the whole model, bit for bit: logits, loss, %lld "
         "gradients\n", (long long)compared);
  /* bad parts are refused */
  const dt_model_part bad[3] = {{false, 1, 0, true}, {false, 0, 9, false}, {false, 1, 1, false}};
  for (int i = 0; i < 3; i++)
    TU_CHECK(dt_model_forward_part(ctx, m, &bad[i], NULL, x, &h) == DT_ERR_INVALID,
             "(e) bad part %d accepted", i);
  TU_CHECK(dt_model_forward_part(ctx, m, &p0, NULL, x, &h) == DT_ERR_INVALID,
           "(e) a first part without tokens accepted");
  dt_tape_free(t1);
  dt_tape_free(t0);
  dt_tape_zero_grad(m->tape);
  dt_array_free(ctx, &lw);
  dt_array_free(ctx, &lg);
  free_weights(m, G);
  free_weights(m, P);
}

/* ---- (f) single-layer parts --------------------------------------------------------------- */

typedef enum { PT_EMB, PT_ATTN, PT_FFN, PT_HEAD } part_kind;

static dt_llama_config part_config(part_kind k) {
  dt_llama_config c = tiny_config();
  c.n_layers = k == PT_ATTN || k == PT_FFN ? 1 : 0;
  c.no_embedding = k != PT_EMB;
  c.no_head = k != PT_HEAD;
  c.no_attention = k == PT_FFN;
  c.no_feed_forward = k == PT_ATTN;
  return c;
}

/* a fixed [TB, TS, D] pattern of O(1) values (x, or the probe R with salt 1) */
static void part_pattern(int D, int salt, double *v) {
  for (int i = 0; i < TB * TS * D; i++) v[i] = sin(0.37 * i + 1.3 * salt) + 0.25 * cos(0.011 * i * i);
}

static void part_tensor(dt_ctx *ctx, dt_mesh *mesh, int D, const double *v, dt_tensor *out) {
  const int64_t sh[3] = {TB, TS, D};
  dt_array a;
  TU_OK(ctx, dt_array_wrap(ctx, DT_DEV_CPU, DT_F64, 3, sh, (void *)v, &a));
  dt_placement pl[DT_MAX_MESH_DIMS];
  memset(pl, 0, sizeof pl);
  TU_OK(ctx, dt_tensor_distribute(ctx, mesh, &a, pl, out));
}

/* The part's loss (the cross-entropy with the head, else mean(y * R)), its output y
 * gathered into *y when y != NULL, its backward when asked; ends the step. */
static double part_step(dt_ctx *ctx, dt_model *m, const dt_tensor *in, const dt_tensor *R,
                        const dt_tensor *tgt, bool backward, double *y) {
  dt_var *out = NULL, *loss = NULL;
  double v = NAN;
  TU_OK(ctx, dt_model_forward_input(ctx, m, in, &out));
  if (out && y) {
    dt_array f;
    TU_OK(ctx, dt_tensor_full(ctx, dt_var_value(out), &f));
    memcpy(y, f.data, dt_array_bytes(&f));
    dt_array_free(ctx, &f);
  }
  if (out && m->cfg.no_head) {
    dt_tensor rc;
    TU_OK(ctx, dt_tensor_from_local(ctx, R->mesh, &R->local, R->pl, R->ndim, R->gshape, &rc));
    dt_var *r = dt_var_leaf(m->step_tape, &rc, false), *mi[2] = {out, r}, *p = NULL;
    TU_OK(ctx, dt_ad_op(m->step_tape, &dt_op_mul, NULL, mi, &p));
    if (p) TU_OK(ctx, dt_ad_op(m->step_tape, &dt_op_mean, NULL, &p, &loss));
  } else if (out) {
    TU_OK(ctx, dt_model_loss(ctx, m, out, tgt, &loss));
  }
  if (loss) v = loss_value(ctx, loss);
  if (loss && backward) TU_OK(ctx, dt_model_backward(ctx, m, loss));
  TU_OK(ctx, dt_model_end_step(ctx, m));
  return v;
}

/* The naive part (plain arrays, the nv_* pieces of the model above) from the same
 * weights: y [TB TS, D] (logits [TB TS, V] for the head) and its loss. */
static double part_naive(const naive *c, part_kind k, dt_model *m, double *const *w,
                         const double *x, const int64_t *tok, const double *R, const int64_t *tgt,
                         double *y) {
  const int N = TB * TS, D = c->D, QD = c->H * c->hd, KD = c->KV * c->hd, F = c->F;
#define WT(fqn) w[dt_model_find(m, fqn)->index]
  double *xn = malloc(sizeof(double) * N * D), *t = malloc(sizeof(double) * N * D);
  double *q = malloc(sizeof(double) * N * QD), *kk = malloc(sizeof(double) * N * KD);
  double *v = malloc(sizeof(double) * N * KD), *o = malloc(sizeof(double) * N * QD);
  double *g = malloc(sizeof(double) * N * F), *u = malloc(sizeof(double) * N * F);
  double loss = 0;
  if (k == PT_EMB) {
    for (int r = 0; r < N; r++) memcpy(&y[r * D], &WT("tok_embeddings")[tok[r] * D], sizeof(double) * D);
  } else if (k == PT_ATTN) {
    nv_rmsnorm(N, D, c->eps, x, WT("layers.0.attention_norm"), xn);
    nv_linear(N, D, QD, xn, WT("layers.0.attention.wq"), q);
    nv_linear(N, D, KD, xn, WT("layers.0.attention.wk"), kk);
    nv_linear(N, D, KD, xn, WT("layers.0.attention.wv"), v);
    nv_rope(c, c->H, q);
    nv_rope(c, c->KV, kk);
    nv_attention(c, q, kk, v, o);
    nv_linear(N, QD, D, o, WT("layers.0.attention.wo"), t);
    for (int e = 0; e < N * D; e++) y[e] = x[e] + t[e];
  } else if (k == PT_FFN) {
    nv_rmsnorm(N, D, c->eps, x, WT("layers.0.ffn_norm"), xn);
    nv_linear(N, D, F, xn, WT("layers.0.feed_forward.w1"), g);
    nv_linear(N, D, F, xn, WT("layers.0.feed_forward.w3"), u);
    for (int e = 0; e < N * F; e++) g[e] = g[e] / (1 + exp(-g[e])) * u[e];
    nv_linear(N, F, D, g, WT("layers.0.feed_forward.w2"), t);
    for (int e = 0; e < N * D; e++) y[e] = x[e] + t[e];
  } else { /* the head: logits by hand, then the mean cross-entropy */
    nv_rmsnorm(N, D, c->eps, x, WT("norm"), xn);
    nv_linear(N, D, c->V, xn, WT("output"), y);
    for (int r = 0; r < N; r++) {
      const double *z = &y[r * c->V];
      double mx = -INFINITY, se = 0;
      for (int e = 0; e < c->V; e++) mx = z[e] > mx ? z[e] : mx;
      for (int e = 0; e < c->V; e++) se += exp(z[e] - mx);
      loss += mx + log(se) - z[tgt[r]];
    }
    loss /= N;
  }
#undef WT
  if (k != PT_HEAD) {
    for (int e = 0; e < N * D; e++) loss += y[e] * R[e];
    loss /= N * D;
  }
  free(xn); free(t); free(q); free(kk); free(v); free(o); free(g); free(u);
  return loss;
}

static void check_single_layers(dt_ctx *ctx, dt_mesh *mesh, const dt_tensor *tok,
                                const dt_tensor *tgt) {
  static const char *const names[4] = {"embedding", "attention", "feed_forward", "output"};
  static const char *const fqns[4][7] = {
      {"", "tok_embeddings"},
      {"", "layers.0", "layers.0.attention_norm", "layers.0.attention", "layers.0.attention.wq",
       "layers.0.attention.wk", "layers.0.attention.wv"}, /* then wo */
      {"", "layers.0", "layers.0.ffn_norm", "layers.0.feed_forward", "layers.0.feed_forward.w1",
       "layers.0.feed_forward.w2", "layers.0.feed_forward.w3"},
      {"", "norm", "output"}};
  static const int nmods[4] = {2, 8, 7, 3};
  const dt_llama_config tc = tiny_config();
  const naive nc = naive_of(&tc);
  const int D = tc.dim, N = TB * TS;
  const int64_t Dl = D, V = tc.vocab, hd = D / tc.n_heads, F = dt_llama_ffn_hidden(&tc);
  /* the parameters of each part (TorchTitan counts them the same way for the model) */
  const int64_t params[4] = {V * Dl, Dl + Dl * tc.n_heads * hd + 2 * Dl * tc.n_kv_heads * hd +
                                         tc.n_heads * hd * Dl,
                             Dl + 3 * Dl * F, Dl + V * Dl};
  double *x = malloc(sizeof(double) * N * D), *R = malloc(sizeof(double) * N * D);
  double *y = malloc(sizeof(double) * N * (D > V ? D : V)), *yn = malloc(sizeof(double) * N * (D > V ? D : V));
  part_pattern(D, 0, x);
  part_pattern(D, 1, R);
  int64_t htok[TB * TS], htgt[TB * TS];
  host_ids(ctx, tok, htok);
  host_ids(ctx, tgt, htgt);
  dt_tensor xt, Rt;
  part_tensor(ctx, mesh, D, x, &xt);
  part_tensor(ctx, mesh, D, R, &Rt);
  int nfd = 0;
  double worst_y = 0, worst_loss = 0, worst_fd = 0;
  for (int k = 0; k < 4; k++) {
    const dt_llama_config c = part_config((part_kind)k);
    TU_OK(ctx, dt_llama_config_check(ctx, &c));
    TU_CHECK(dt_llama_nparams(&c) == params[k], "(f) %s: %lld parameters, want %lld", names[k],
             (long long)dt_llama_nparams(&c), (long long)params[k]);
    /* 6 x the matmul parameters (the embedding's are a lookup) + 12 L H hd seq with attention */
    const double fpt = 6.0 * (k == PT_EMB ? 0 : (double)params[k]) +
                       (k == PT_ATTN ? 12.0 * tc.n_heads * hd * TS : 0);
    TU_CHECK(dt_llama_flops_per_token(&c, TS) == fpt, "(f) %s: %.0f flops per token, want %.0f",
             names[k], dt_llama_flops_per_token(&c, TS), fpt);
    dt_model *m = NULL;
    TU_OK(ctx, dt_model_create(ctx, mesh, &c, DT_F64, SEED, &m));
    if (!m) continue;
    TU_CHECK(m->n_mods == nmods[k], "(f) %s: %d modules, want %d", names[k], m->n_mods, nmods[k]);
    for (int i = 0; i < m->n_mods && i < nmods[k]; i++) {
      const char *want = i < 7 && fqns[k][i] ? fqns[k][i] : "layers.0.attention.wo";
      TU_CHECK(!strcmp(m->mods[i].fqn, want), "(f) %s: module %d is '%s', want '%s'", names[k], i,
               m->mods[i].fqn, want);
    }
    TU_OK(ctx, dt_model_materialize(ctx, m));
    const dt_tensor *in = k == PT_EMB ? tok : &xt;
    dt_var *out = NULL;
    if (k != PT_EMB) /* no embedding: the whole-model forward and a first part refused */
      TU_CHECK(dt_model_forward(ctx, m, tok, &out) == DT_ERR_INVALID,
               "(f) %s: dt_model_forward accepted a model without the embedding", names[k]);
    const double loss = part_step(ctx, m, in, &Rt, tgt, true, y);
    double **W = full_weights(ctx, m, false), **G = full_weights(ctx, m, true);
    const double ref = part_naive(&nc, (part_kind)k, m, W, x, htok, R, htgt, yn);
    const int ny = N * (k == PT_HEAD ? (int)V : D);
    double dmax = 0, ymax = 0;
    for (int e = 0; e < ny; e++) {
      dmax = fmax(dmax, fabs(y[e] - yn[e]));
      ymax = fmax(ymax, fabs(yn[e]));
    }
    const double rel_y = dmax / ymax, rel_loss = fabs(loss - ref) / fabs(ref);
    TU_CHECK(rel_y <= TOL_LOSS, "(f) %s: output differs from the naive one by %.3g", names[k], rel_y);
    TU_CHECK(rel_loss <= TOL_LOSS, "(f) %s: loss %.17g, naive %.17g", names[k], loss, ref);
    worst_y = fmax(worst_y, rel_y);
    worst_loss = fmax(worst_loss, rel_loss);
    /* every weight's gradient against central differences, 3 elements each */
    for (int i = 0; i < m->n_mods; i++) {
      dt_module *md = &m->mods[i];
      if (!md->weight) continue;
      TU_CHECK(G[i] != NULL, "(f) %s: %s has no gradient", names[k], md->fqn);
      if (!G[i]) continue;
      dt_tensor *wt = (dt_tensor *)dt_var_value(md->weight);
      double *Wd = wt->local.data;
      const int64_t n = wt->local.numel, picks[3] = {0, n / 2 + 1, n - 1};
      /* the embedding: rows of tokens that occur (others have no gradient) */
      const int64_t epicks[3] = {htok[0] * D, htok[5] * D + 3, htok[TB * TS - 1] * D + D - 1};
      for (int p = 0; p < 3; p++) {
        const int64_t e = k == PT_EMB ? epicks[p] : picks[p];
        const double w0 = Wd[e];
        Wd[e] = w0 + FD_H;
        const double up = part_step(ctx, m, in, &Rt, tgt, false, NULL);
        Wd[e] = w0 - FD_H;
        const double dn = part_step(ctx, m, in, &Rt, tgt, false, NULL);
        Wd[e] = w0;
        const double fd = (up - dn) / (2 * FD_H), tol = TOL_FD_ABS + TOL_FD_REL * fabs(fd);
        TU_CHECK(fabs(fd - G[i][e]) <= tol, "(f) %s: grad %s[%lld]: backward %.12g, finite "
                 "difference %.12g", names[k], md->fqn, (long long)e, G[i][e], fd);
        worst_fd = fmax(worst_fd, fabs(fd - G[i][e]) / tol);
        nfd++;
      }
    }
    if (k != PT_EMB) {
      const dt_model_part first = {true, 0, c.n_layers, false};
      TU_CHECK(dt_model_forward_part(ctx, m, &first, tok, NULL, &out) == DT_ERR_INVALID,
               "(f) %s: a first part accepted without the embedding", names[k]);
    }
    free_weights(m, W);
    free_weights(m, G);
    dt_model_free(ctx, m);
  }
  /* bad parts of the config */
  dt_llama_config bad = part_config(PT_ATTN);
  bad.no_attention = true; /* a block with neither sublayer */
  TU_CHECK(dt_llama_config_check(ctx, &bad) == DT_ERR_INVALID, "(f) an empty block accepted");
  bad = part_config(PT_EMB);
  bad.no_embedding = true; /* nothing at all */
  TU_CHECK(dt_llama_config_check(ctx, &bad) == DT_ERR_INVALID, "(f) a model of no module accepted");
  bad = tiny_config();
  bad.n_layers = 0; /* the whole model keeps its layers */
  TU_CHECK(dt_llama_config_check(ctx, &bad) == DT_ERR_INVALID, "(f) a 0-layer model accepted");
  printf("  (f) embedding, attention, feed_forward, output alone: outputs vs naive rel %.2e, "
         "losses %.2e (tol %.0e); %d gradient elements vs central differences: worst err/tol "
         "%.3f\n", worst_y, worst_loss, TOL_LOSS, nfd, worst_fd);
  dt_tensor_free(ctx, &xt);
  dt_tensor_free(ctx, &Rt);
  free(x);
  free(R);
  free(y);
  free(yn);
}

static dt_status body_one(dt_ctx *ctx, void *arg) {
  (void)arg;
  const char *names[1] = {"tp"};
  const int shape[1] = {1};
  dt_mesh *mesh = NULL;
  TU_OK(ctx, dt_mesh_create(ctx, ctx->world, 1, shape, names, &mesh));
  if (!mesh) return DT_ERR_INTERNAL;
  dt_llama_config cfg = tiny_config();
  dt_model *m = NULL;
  size_t base = ctx->mem.host_cur;
  TU_OK(ctx, dt_model_create(ctx, mesh, &cfg, DT_F64, SEED, &m));
  if (!m) return DT_ERR_INTERNAL;
  TU_CHECK(m->n_mods == 2 + 12 * cfg.n_layers + 2, "module count %d", m->n_mods);
  TU_CHECK(!strcmp(m->mods[0].fqn, "") && !strcmp(m->mods[1].fqn, "tok_embeddings") &&
               !strcmp(m->mods[m->n_mods - 1].fqn, "output") &&
               !strcmp(m->mods[m->n_mods - 2].fqn, "norm"),
           "module order");
  for (int i = 0; i < m->n_mods; i++) { /* every parent (fqn prefix) comes earlier */
    const char *f = m->mods[i].fqn;
    const char *dot = strrchr(f, '.');
    if (!dot) continue; /* top level: the parent is the root, index 0 */
    char parent[64];
    snprintf(parent, sizeof parent, "%.*s", (int)(dot - f), f);
    if (!strcmp(parent, "layers")) continue;
    dt_module *p = dt_model_find(m, parent);
    TU_CHECK(p && p->index < i, "module %s: parent %s missing or later", f, parent);
  }
  TU_CHECK(dt_model_find(m, "layers.1.feed_forward.w3") != NULL, "find w3");
  TU_OK(ctx, dt_model_materialize(ctx, m));
  dt_tensor tok, tgt;
  make_ids(ctx, mesh, cfg.vocab, 0, &tok);
  make_ids(ctx, mesh, cfg.vocab, 1, &tgt);
  int64_t htok[TB * TS], htgt[TB * TS];
  host_ids(ctx, &tok, htok);
  host_ids(ctx, &tgt, htgt);
  naive nc = naive_of(&cfg);

  /* (a) forward loss against the naive model */
  double loss = model_step(ctx, m, &tok, &tgt, true);
  double **W0 = full_weights(ctx, m, false);
  double ref = nv_loss(&nc, W0, htok, htgt);
  double rel = fabs(loss - ref) / fabs(ref);
  TU_CHECK(rel <= TOL_LOSS, "(a) loss %.17g, naive %.17g (rel %.3g)", loss, ref, rel);
  printf("  (a) loss %.15f, naive %.15f, rel diff %.2e (tol %.0e)\n", loss, ref, rel, TOL_LOSS);
  /* the loss near log(vocab) at init (output std dim^-0.5 on unit-norm rows) */
  TU_CHECK(fabs(loss - log(cfg.vocab)) < 1.0, "(a) initial loss %.4f far from log(V) %.4f", loss,
           log(cfg.vocab));

  /* (b) gradients against finite differences */
  double **G = full_weights(ctx, m, true);
  const char *fd_fqns[] = {"tok_embeddings", "layers.0.attention_norm", "layers.0.attention.wq",
                           "layers.0.attention.wk", "layers.1.attention.wv",
                           "layers.1.attention.wo", "layers.0.feed_forward.w1",
                           "layers.1.feed_forward.w2", "layers.1.feed_forward.w3", "norm",
                           "output"};
  int nfd = 0;
  double worst = 0;
  for (size_t i = 0; i < sizeof fd_fqns / sizeof fd_fqns[0]; i++)
    check_fd_weight(ctx, m, fd_fqns[i], &tok, &tgt, G, &nfd, &worst);
  /* grads of the hook run are compared, then cleared; restore the original ones */
  check_hooks(ctx, m, &tok, &tgt, loss, G);
  check_parts(ctx, m, &tok, &tgt);
  model_step(ctx, m, &tok, &tgt, true);
  printf("  (b) %d gradient elements vs central differences: worst err/tol %.3f\n", nfd, worst);
  for (int i = 0; i < m->n_mods; i++)
    TU_CHECK(!m->mods[i].weight || G[i], "(b) %s has no gradient", m->mods[i].fqn);

  /* (c) two AdamW steps against the naive AdamW */
  const dt_adamw opt = DT_ADAMW_DEFAULT;
  double **Mm = calloc((size_t)m->n_mods, sizeof *Mm), **Vm = calloc((size_t)m->n_mods, sizeof *Vm);
  double worst_adam = 0;
  for (int stepi = 1; stepi <= 2; stepi++) {
    if (stepi == 2) { /* fresh gradients at the updated weights */
      free_weights(m, G);
      model_step(ctx, m, &tok, &tgt, true);
      G = full_weights(ctx, m, true);
    }
    double **Wb = full_weights(ctx, m, false);
    TU_OK(ctx, dt_model_adamw_step(ctx, m, &opt));
    double **Wa = full_weights(ctx, m, false);
    double bc1 = 1 - pow(opt.beta1, stepi), bc2 = 1 - pow(opt.beta2, stepi);
    for (int i = 0; i < m->n_mods; i++) {
      if (!Wb[i]) continue;
      int64_t n = m->mods[i].wshape[0] * (m->mods[i].wndim == 2 ? m->mods[i].wshape[1] : 1);
      if (!Mm[i]) {
        Mm[i] = calloc((size_t)n, sizeof(double));
        Vm[i] = calloc((size_t)n, sizeof(double));
      }
      for (int64_t e = 0; e < n; e++) {
        double g = G[i][e], w = Wb[i][e] * (1 - opt.lr * opt.weight_decay);
        Mm[i][e] = opt.beta1 * Mm[i][e] + (1 - opt.beta1) * g;
        Vm[i][e] = opt.beta2 * Vm[i][e] + (1 - opt.beta2) * g * g;
        w -= opt.lr / bc1 * Mm[i][e] / (sqrt(Vm[i][e]) / sqrt(bc2) + opt.eps);
        double err = fabs(w - Wa[i][e]) / (fabs(w) + 1e-300);
        if (err > worst_adam) worst_adam = err;
      }
      TU_CHECK(!dt_var_grad(m->mods[i].weight), "(c) %s: gradient not cleared",
               m->mods[i].fqn);
    }
    free_weights(m, Wb);
    free_weights(m, Wa);
  }
  TU_CHECK(worst_adam <= TOL_ADAM, "(c) AdamW differs from the naive update: rel %.3g",
           worst_adam);
  printf("  (c) 2 AdamW steps vs naive: worst rel diff %.2e (tol %.0e)\n", worst_adam, TOL_ADAM);
  check_single_layers(ctx, mesh, &tok, &tgt);
  double after = model_step(ctx, m, &tok, &tgt, false);
  TU_CHECK(after < loss, "(c) loss did not decrease after 2 steps: %.6f -> %.6f", loss, after);
  for (int i = 0; i < m->n_mods; i++) {
    free(Mm[i]);
    free(Vm[i]);
  }
  free(Mm);
  free(Vm);
  free_weights(m, G);
  free_weights(m, W0);
  dt_tensor_free(ctx, &tok);
  dt_tensor_free(ctx, &tgt);
  dt_model_free(ctx, m);
  TU_CHECK(ctx->mem.host_cur == base, "host bytes in use %zu after dt_model_free, want %zu (leak)",
           ctx->mem.host_cur, base);
  dt_mesh_free(mesh);
  return DT_OK;
}

/* ---- (d) initialisation: determinism and sharding invariance --------------------------- */

/* Weights of a model made on `mesh` with placements chosen by `mode`
 * (0: all R, 1: all S(0), 2: S(1) for matrices, S(0) for vectors, 3: see below),
 * gathered. */
static int64_t wnumel(const dt_module *md);
static double **init_weights(dt_ctx *ctx, dt_mesh *mesh, uint64_t seed, dt_dtype dt, int mode,
                             dt_model **keep) {
  dt_llama_config cfg = tiny_config();
  dt_model *m = NULL;
  TU_OK(ctx, dt_model_create(ctx, mesh, &cfg, dt, seed, &m));
  if (!m) return NULL;
  for (int i = 0; i < m->n_mods; i++) {
    dt_module *md = &m->mods[i];
    if (mode == 1) md->wpl[0] = dt_shard(0);
    /* 3: as 1 but wk, wv replicated: 4 shards of their 2 kv heads would cut heads,
     * which the head view refuses (TorchTitan needs n_kv_heads % tp == 0 too) */
    bool kv = strstr(md->fqn, ".wk") || strstr(md->fqn, ".wv");
    if (mode == 3 && !kv) md->wpl[0] = dt_shard(0);
    if (mode == 2) md->wpl[0] = dt_shard(md->wndim == 2 ? 1 : 0);
  }
  TU_OK(ctx, dt_model_materialize(ctx, m));
  double **w = full_weights(ctx, m, false);
  *keep = m;
  return w;
}

/* One train step (forward, backward, AdamW) of the tiny f64 model on `mesh` with
 * placements by `mode` (as init_weights); returns the loss and the gathered
 * updated weights. */
static double **train_step(dt_ctx *ctx, dt_mesh *mesh, int mode, double *loss, dt_model **keep) {
  double **w0 = init_weights(ctx, mesh, SEED, DT_F64, mode, keep);
  dt_model *m = *keep;
  if (!w0) return NULL;
  free_weights(m, w0);
  dt_tensor tok, tgt;
  make_ids(ctx, mesh, m->cfg.vocab, 0, &tok);
  make_ids(ctx, mesh, m->cfg.vocab, 1, &tgt);
  *loss = model_step(ctx, m, &tok, &tgt, true);
  const dt_adamw opt = DT_ADAMW_DEFAULT;
  TU_OK(ctx, dt_model_adamw_step(ctx, m, &opt));
  dt_tensor_free(ctx, &tok);
  dt_tensor_free(ctx, &tgt);
  return full_weights(ctx, m, false);
}

/* Sharded weights (no hooks: the ops' dispatch moves the activations) give the
 * unsharded loss and, after AdamW (gradients reduced to the weights'
 * placements), the same weights. The same math summed in another order
 * (partial sums per rank, then all_reduce): ~1e-15 relative per value; AdamW
 * divides by sqrt(v) ~ |g|, so a weight moves by ~lr whatever the gradient's
 * rounding: 1e-12 relative on the loss and 1e-10 absolute on weights (lr 8e-4
 * times a relative gradient error far below 1e-6) leave wide margins and catch
 * a wrong or missing reduction (an error of O(lr) = 1e-4 or more). */
static const double TOL_SHARD_LOSS = 1e-12, TOL_SHARD_W = 1e-10;

static void check_sharded_step(dt_ctx *ctx, dt_mesh *mesh, dt_mesh *solo) {
  dt_model *ref_m = NULL;
  double ref_loss = NAN;
  double **ref = train_step(ctx, solo, 0, &ref_loss, &ref_m);
  for (int mode = 2; mode <= 3 && ref; mode++) {
    dt_model *m = NULL;
    double loss = NAN;
    double **w = train_step(ctx, mesh, mode, &loss, &m);
    if (w) {
      TU_CHECK(fabs(loss - ref_loss) <= TOL_SHARD_LOSS * fabs(ref_loss),
               "sharded step (mode %d): loss %.17g, 1 rank %.17g", mode, loss, ref_loss);
      double worst = 0;
      for (int i = 0; i < m->n_mods; i++)
        if (w[i])
          for (int64_t e = 0; e < wnumel(&m->mods[i]); e++)
            if (fabs(w[i][e] - ref[i][e]) > worst) worst = fabs(w[i][e] - ref[i][e]);
      TU_CHECK(worst <= TOL_SHARD_W, "sharded step (mode %d): weights differ by %.3g", mode,
               worst);
      if (ctx->rank == 0)
        printf("  sharded weights (%s): loss rel diff %.2e, weights after AdamW max diff %.2e\n",
               mode == 3 ? "S(0) but wk, wv" : "S(1) matrices", fabs(loss - ref_loss) / fabs(ref_loss),
               worst);
      free_weights(m, w);
    }
    dt_model_free(ctx, m);
  }
  if (ref) free_weights(ref_m, ref);
  dt_model_free(ctx, ref_m);
}

static int64_t wnumel(const dt_module *md) {
  return md->wshape[0] * (md->wndim == 2 ? md->wshape[1] : 1);
}

static dt_status body_init(dt_ctx *ctx, void *arg) {
  (void)arg;
  const char *names[1] = {"tp"}, *one_names[1] = {"one"};
  const int shape[1] = {4}, one_shape[1] = {1};
  dt_mesh *mesh = NULL, *solo = NULL;
  dt_comm *one = NULL;
  dt_status s = dt_mesh_create(ctx, ctx->world, 1, shape, names, &mesh);
  if (s == DT_OK) s = dt_comm_split(ctx->world, ctx->rank, 0, "solo", &one);
  if (s == DT_OK) s = dt_mesh_create(ctx, one, 1, one_shape, one_names, &solo);
  TU_OK(ctx, s);
  if (s != DT_OK) goto done;
  for (int dti = 0; dti < 2; dti++) {
    dt_dtype dt = dti ? DT_F32 : DT_F64;
    dt_model *ref_m = NULL, *again_m = NULL, *other_m = NULL, *s0_m = NULL, *s1_m = NULL;
    double **ref = init_weights(ctx, solo, SEED, dt, 0, &ref_m);
    double **again = init_weights(ctx, solo, SEED, dt, 0, &again_m);
    double **other = init_weights(ctx, solo, SEED + 1, dt, 0, &other_m);
    double **s0 = init_weights(ctx, mesh, SEED, dt, 1, &s0_m);
    double **s1 = init_weights(ctx, mesh, SEED, dt, 2, &s1_m);
    if (!ref || !again || !other || !s0 || !s1) goto next;
    for (int i = 0; i < ref_m->n_mods; i++) {
      const dt_module *md = &ref_m->mods[i];
      if (!md->weight) continue;
      size_t bytes = (size_t)wnumel(md) * sizeof(double);
      TU_CHECK(!memcmp(ref[i], again[i], bytes), "(d) %s: same seed, different weights", md->fqn);
      TU_CHECK(md->init == DT_INIT_ONES || memcmp(ref[i], other[i], bytes),
               "(d) %s: another seed, same weights", md->fqn);
      TU_CHECK(!memcmp(ref[i], s0[i], bytes), "(d) %s (%s): S(0) on 4 ranks != 1 rank", md->fqn,
               dt == DT_F32 ? "f32" : "f64");
      TU_CHECK(!memcmp(ref[i], s1[i], bytes), "(d) %s (%s): S(1) on 4 ranks != 1 rank", md->fqn,
               dt == DT_F32 ? "f32" : "f64");
      /* statistics: n >= 32 * 16 elements; sample std within 15% (> 3 standard
       * errors of 1/sqrt(2n) <= 3.2%) and truncation bounds exact */
      int64_t n = wnumel(md);
      double mean = 0, var = 0, mx = 0;
      for (int64_t e = 0; e < n; e++) mean += ref[i][e];
      mean /= (double)n;
      for (int64_t e = 0; e < n; e++) {
        var += (ref[i][e] - mean) * (ref[i][e] - mean);
        if (fabs(ref[i][e]) > mx) mx = fabs(ref[i][e]);
      }
      double sd = sqrt(var / (double)n);
      if (md->init == DT_INIT_ONES) {
        TU_CHECK(mean == 1 && var == 0, "(d) %s: not ones", md->fqn);
        continue;
      }
      /* std of N(0,1) truncated at +-3: sqrt(1 - 2*3*phi(3)/(1 - 2 Phi(-3))) = 0.9866 */
      double want = md->init_std * (md->init_trunc == 3.0 ? 0.98658 : 1.0);
      TU_CHECK(fabs(sd / want - 1) < 0.15, "(d) %s: std %.4g, want %.4g", md->fqn, sd, want);
      if (md->init == DT_INIT_TRUNC_NORMAL)
        TU_CHECK(mx <= md->init_trunc * md->init_std * (1 + 1e-6), /* f32 rounding of the bound */
                 "(d) %s: |w| %.6g beyond %.6g", md->fqn, mx, md->init_trunc * md->init_std);
    }
    if (ctx->rank == 0)
      printf("  (d) %s: seed determinism, S(0) and S(1) on 4 ranks == 1 rank, std and bounds ok\n",
             dt == DT_F32 ? "f32" : "f64");
  next:
    if (ref) free_weights(ref_m, ref);
    if (again) free_weights(again_m, again);
    if (other) free_weights(other_m, other);
    if (s0) free_weights(s0_m, s0);
    if (s1) free_weights(s1_m, s1);
    dt_model_free(ctx, ref_m);
    dt_model_free(ctx, again_m);
    dt_model_free(ctx, other_m);
    dt_model_free(ctx, s0_m);
    dt_model_free(ctx, s1_m);
  }
  check_sharded_step(ctx, mesh, solo);
done:
  dt_mesh_free(solo);
  dt_mesh_free(mesh);
  dt_comm_destroy(one);
  return s;
}

int main(int argc, char **argv) {
  tu_opts o;
  tu_parse(argc, argv, &o);
  if (o.backend != DT_BACKEND_THREADS) {
    printf("SKIP: test_nn runs with the threads backend only\n");
    return SB_SKIP;
  }
  dt_device_cpu_blas_threads(1);
  printf("configs\n");
  check_configs();
  check_tree();
  struct {
    int world;
    dt_spmd_fn fn;
    const char *label;
  } jobs[] = {{1, body_one, "tiny model, 1 rank: (a) loss, (b) gradients, (c) AdamW"},
              {4, body_init, "initialisation, 4 ranks: (d)"}};
  for (size_t i = 0; i < sizeof jobs / sizeof jobs[0]; i++) {
    printf("%s\n", jobs[i].label);
    dt_launch_opts lo = {.backend = DT_BACKEND_THREADS, .world = jobs[i].world, .timeout_s = 120};
    dt_launch_report rep;
    dt_status s = dt_launch(&lo, jobs[i].fn, NULL, &rep);
    if (s != DT_OK)
      tu_fail(__FILE__, __LINE__, "%s: launch: rank %d: %s", jobs[i].label, rep.failed_rank,
              rep.failed_msg);
    dt_launch_report_free(&rep);
  }
  return tu_finish("test_nn");
}
