/* bench/micro/gpu.c: bench/shardbench-gpu, the one-GPU bf16 benchmark of the
 * Llama 3 8B shapes.
 *
 *   bench/shardbench-gpu [--device cuda|cuda-emu] [--batch 1] [--seq 8192] [--tiny]
 *                        [--reps 5] [--inner 10] [--layers N] [--mem-gib 139]
 *                        [--peak-tflops 989] [--parts gemm,block,model]
 *
 * World 1, bf16 (A, B and C bf16, f32 accumulation: dt_device_gemm's DT_BF16).
 * Shapes: Llama 3 8B (torchtitan/models/llama3/__init__.py "8B": dim 4096,
 * 32 heads, 8 kv heads, head dim 128, FFN 14336, vocab 128256, rope theta
 * 500000); T = batch * seq tokens. --tiny: dim 64, 2 layers, 4 heads, 2 kv
 * heads, vocab 256, seq 32 (the path CI can run on cuda-emu).
 * Parts:
 *   gemm   the plain cuBLAS bf16 GEMM on the block's shapes: per linear
 *          [in -> out] (QKV fused: out = (H + 2 KV) hd; O; W1; W3; W2) the
 *          forward Y = X W^T (m T, n out, k in), the grad-input dX = dY W
 *          (T, in, out) and the grad-weight dW = dY^T X (out, in, T). Each is
 *          timed as --inner back-to-back calls between dt_device_sync, median of
 *          --reps runs (after one warm-up). gemm rate = sum of 2 m n k over the
 *          sum of the medians (the block's GEMM mix).
 *   block  one transformer block (no embedding, no head): forward from a bf16
 *          x [b, s, dim], backward seeded by a fixed dy, AdamW step, end step.
 *   model  the whole model with --layers layers (default: an estimate of what
 *          fits in --mem-gib, printed with its formula): forward, loss, backward,
 *          AdamW, end step.
 *   block and model: median step time of --reps steps after one warm-up;
 *   tokens/s = T / step time; TFLOP/s from TorchTitan's count
 *   (dt_llama_flops_per_token: 6 (N - N_embedding) + 12 L H hd seq per token,
 *   attention counted full, no causal discount, as PaLM (Chowdhery et al.
 *   2022) appendix B and TorchTitan's get_num_flop_per_token do); MFU = that
 *   over --peak-tflops (989: H100/H200 SXM dense bf16 without sparsity);
 *   ratio = the step's rate over the gemm rate.
 * Output: a table, and one line per measurement
 *   csv,part,name,m,n,k,tokens,seconds,tflops,mfu,ratio
 * Exit: 0 ran, 1 a call failed or a part did not run, 2 bad flags or no usable device (--device cuda
 * on a machine without a GPU or a build without CUDA).
 * What it is not: a check of results (verify/test_device_cuda and the CUDA
 * tests do that), or a sharded benchmark (world 1).
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dtensor.h"
#include "../common/flags.h"
#include "../stats.h"

static const char PROG[] = "shardbench-gpu";
enum { MAX_REPS = 101, N_GEMMS = 15 };

typedef struct bopts {
  bool emu, tiny;
  int batch, seq, reps, inner, layers; /* layers 0: estimate */
  double mem_gib, peak_tflops;
  bool p_gemm, p_block, p_model;
} bopts;

typedef struct gemm_shape {
  char name[16];
  int64_t m, n, k;
  bool ta, tb;
  double t; /* median seconds of one call */
} gemm_shape;

typedef struct step_result {
  bool ran;
  double t;      /* median step seconds */
  double flops;  /* per step, TorchTitan's count */
  int layers;
  char why[DT_ERRMSG_LEN]; /* when it did not run */
} step_result;

typedef struct job {
  const bopts *o;
  dt_llama_config cfg;
  int ffn;
  gemm_shape g[N_GEMMS];
  double gemm_flops, gemm_t;
  step_result block, model;
  char layers_note[160];
} job;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int64_t tokens(const bopts *o) { return (int64_t)o->batch * o->seq; }

/* ---- (a) plain GEMM ------------------------------------------------------------ */

static void shapes(job *J) {
  const dt_llama_config *c = &J->cfg;
  const int64_t T = tokens(J->o), D = c->dim, hd = c->dim / c->n_heads;
  const struct { const char *name; int64_t in, out; } lin[5] = {
      {"qkv", D, (c->n_heads + 2 * c->n_kv_heads) * hd}, {"o", D, D},
      {"w1", D, J->ffn}, {"w3", D, J->ffn}, {"w2", J->ffn, D}};
  for (int i = 0; i < 5; i++) {
    gemm_shape *f = &J->g[3 * i], *dx = f + 1, *dw = f + 2;
    *f = (gemm_shape){.m = T, .n = lin[i].out, .k = lin[i].in, .tb = true};
    *dx = (gemm_shape){.m = T, .n = lin[i].in, .k = lin[i].out};
    *dw = (gemm_shape){.m = lin[i].out, .n = lin[i].in, .k = T, .ta = true};
    snprintf(f->name, sizeof f->name, "%s.fwd", lin[i].name);
    snprintf(dx->name, sizeof dx->name, "%s.dx", lin[i].name);
    snprintf(dw->name, sizeof dw->name, "%s.dw", lin[i].name);
  }
}

/* A device buffer of n bf16 values uniform in [-1, 1) (random, not constant:
 * tensor-core power and so clocks depend on the data). */
static dt_status rand_dev(dt_ctx *ctx, dt_device *d, int64_t n, uint64_t seed, void **out) {
  size_t bytes = (size_t)n * sizeof(dt_bf16);
  void *h = malloc(bytes);
  if (!h) return dt_error(ctx, DT_ERR_NOMEM, PROG, "no host memory for %zu bytes", bytes);
  dt_status s = dt_rng_fill(DT_BF16, h, n, seed, 0, 0, 1, DT_RNG_UNIFORM, -1.0, 2.0);
  if (s == DT_OK) s = dt_device_alloc(d, bytes, out);
  if (s == DT_OK) s = dt_device_copy(d, *out, h, bytes, DT_COPY_H2D);
  free(h);
  return s;
}

static dt_status run_gemms(dt_ctx *ctx, dt_device *d, job *J) {
  const bopts *o = J->o;
  int64_t na = 0, nb = 0, nc = 0;
  for (int i = 0; i < N_GEMMS; i++) {
    const gemm_shape *g = &J->g[i];
    if (g->m * g->k > na) na = g->m * g->k;
    if (g->k * g->n > nb) nb = g->k * g->n;
    if (g->m * g->n > nc) nc = g->m * g->n;
  }
  void *A = NULL, *B = NULL, *C = NULL;
  dt_status s = rand_dev(ctx, d, na, 1, &A);
  if (s == DT_OK) s = rand_dev(ctx, d, nb, 2, &B);
  if (s == DT_OK) s = rand_dev(ctx, d, nc, 3, &C);
  J->gemm_flops = J->gemm_t = 0;
  for (int i = 0; i < N_GEMMS && s == DT_OK; i++) {
    gemm_shape *g = &J->g[i];
    dt_gemm_desc gd = {.dtype = DT_BF16, .trans_a = g->ta, .trans_b = g->tb, .m = g->m,
                       .n = g->n, .k = g->k, .alpha = 1.0, .beta = 0.0, .a = A,
                       .lda = g->ta ? g->m : g->k, .b = B, .ldb = g->tb ? g->k : g->n, .c = C,
                       .ldc = g->n, .batch = 1};
    double t[MAX_REPS];
    for (int r = -1; r < o->reps && s == DT_OK; r++) { /* r = -1: warm-up */
      s = dt_device_sync(d);
      double t0 = now_s();
      for (int q = 0; q < o->inner && s == DT_OK; q++) s = dt_device_gemm(d, &gd);
      if (s == DT_OK) s = dt_device_sync(d);
      if (r >= 0) t[r] = (now_s() - t0) / o->inner;
    }
    if (s != DT_OK) break;
    g->t = sb_median(t, o->reps);
    J->gemm_flops += 2.0 * (double)g->m * (double)g->n * (double)g->k;
    J->gemm_t += g->t;
  }
  dt_device_free(d, A, (size_t)na * sizeof(dt_bf16));
  dt_device_free(d, B, (size_t)nb * sizeof(dt_bf16));
  dt_device_free(d, C, (size_t)nc * sizeof(dt_bf16));
  return s;
}

/* ---- (b), (c) training steps on the library's Llama --------------------------------- */

/* A device tensor (Replicate on the 1-rank mesh) of the values in host h:
 * dt_tensor_distribute places the shard on the rank's device (one upload). */
static dt_status dev_tensor(dt_ctx *ctx, dt_mesh *mesh, dt_dtype t, int ndim, const int64_t *shape,
                            const void *h, dt_tensor *out) {
  dt_array a;
  DT_CHECK(dt_array_wrap(ctx, DT_DEV_CPU, t, ndim, shape, (void *)h, &a));
  dt_placement pl[1] = {dt_replicate()};
  return dt_tensor_distribute(ctx, mesh, &a, pl, out);
}

static dt_status rand_tensor(dt_ctx *ctx, dt_mesh *mesh, int ndim, const int64_t *shape,
                             uint64_t seed, dt_tensor *out) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  dt_bf16 *h = malloc((size_t)n * sizeof *h);
  if (!h) return dt_error(ctx, DT_ERR_NOMEM, PROG, "no host memory");
  dt_status s = dt_rng_fill(DT_BF16, h, n, seed, 0, 0, 1, DT_RNG_NORMAL, 0.0, 1.0);
  if (s == DT_OK) s = dev_tensor(ctx, mesh, DT_BF16, ndim, shape, h, out);
  free(h);
  return s;
}

static dt_status token_tensor(dt_ctx *ctx, dt_mesh *mesh, const job *J, uint64_t salt,
                              dt_tensor *out) {
  const int64_t shape[2] = {J->o->batch, J->o->seq}, n = shape[0] * shape[1];
  int64_t *h = malloc((size_t)n * sizeof *h);
  if (!h) return dt_error(ctx, DT_ERR_NOMEM, PROG, "no host memory");
  uint64_t x = 0x9E3779B97F4A7C15ull ^ salt; /* splitmix64: token ids in [0, vocab) */
  for (int64_t i = 0; i < n; i++) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    h[i] = (int64_t)((z ^ (z >> 31)) % (uint64_t)J->cfg.vocab);
  }
  dt_status s = dev_tensor(ctx, mesh, DT_I64, 2, shape, h, out);
  free(h);
  return s;
}

/* One training step: block (no embedding, no head; x in, dy seeds backward) or
 * the whole model (tokens in, loss). */
static dt_status one_step(dt_ctx *ctx, dt_model *m, bool block, const dt_tensor *in,
                          const dt_tensor *aux) {
  dt_var *out = NULL, *loss = NULL;
  dt_adamw opt = DT_ADAMW_DEFAULT;
  dt_status s;
  if (block) {
    s = dt_model_forward_input(ctx, m, in, &out);
    if (s == DT_OK) s = dt_backward(m->step_tape, out, aux);
  } else {
    s = dt_model_forward(ctx, m, in, &out);
    if (s == DT_OK) s = dt_model_loss(ctx, m, out, aux, &loss);
    if (s == DT_OK) s = dt_model_backward(ctx, m, loss);
  }
  if (s == DT_OK) s = dt_model_adamw_step(ctx, m, &opt);
  dt_status e = dt_model_end_step(ctx, m);
  if (s == DT_OK) s = e;
  if (s == DT_OK) s = dt_device_sync(ctx->device);
  return s;
}

static dt_status time_steps(dt_ctx *ctx, dt_mesh *mesh, job *J, bool block, step_result *r) {
  const bopts *o = J->o;
  dt_llama_config cfg = J->cfg;
  cfg.n_layers = r->layers;
  cfg.no_embedding = cfg.no_head = block;
  dt_model *m = NULL;
  dt_tensor in = {0}, aux = {0};
  dt_status s = dt_model_create(ctx, mesh, &cfg, DT_BF16, 1234, &m);
  if (s == DT_OK) s = dt_model_materialize(ctx, m);
  const int64_t xs[3] = {o->batch, o->seq, cfg.dim};
  if (s == DT_OK)
    s = block ? rand_tensor(ctx, mesh, 3, xs, 11, &in) : token_tensor(ctx, mesh, J, 11, &in);
  if (s == DT_OK)
    s = block ? rand_tensor(ctx, mesh, 3, xs, 12, &aux) : token_tensor(ctx, mesh, J, 12, &aux);
  double t[MAX_REPS];
  for (int i = -1; i < o->reps && s == DT_OK; i++) { /* i = -1: warm-up */
    double t0 = now_s();
    s = one_step(ctx, m, block, &in, &aux);
    if (i >= 0) t[i] = now_s() - t0;
  }
  if (s == DT_OK) {
    r->ran = true;
    r->t = sb_median(t, o->reps);
    r->flops = dt_llama_flops_per_token(&cfg, o->seq) * (double)tokens(o);
  } else {
    snprintf(r->why, sizeof r->why, "%s", dt_last_error(ctx)[0] ? dt_last_error(ctx)
                                                                  : dt_status_str(s));
  }
  dt_tensor_free(ctx, &in);
  dt_tensor_free(ctx, &aux);
  dt_model_free(ctx, m);
  return s;
}

/* How many layers of the model fit in mem_gib, estimated (the library's real
 * footprint is what the run shows): per parameter 20 bytes (bf16 weight 2, f32
 * master 4, f32 gradient 4, AdamW m and v 8, 2 of slack for bf16 compute
 * copies); per layer the activations kept for backward, 34 bytes per token and
 * model dim (Korthikanti et al. 2022, "Reducing Activation Recomputation in
 * Large Transformer Models", Sec. 4.1, sbh(34 + 5as/h) without the 5as/h score
 * term, which memory-efficient attention does not keep) plus 3 bf16 FFN
 * activations of the hidden width (SwiGLU's w1, w3 outputs and their product);
 * the embedding and head once, plus f32 logits and their gradient; 10% headroom
 * for workspace and fragmentation. */
static int fit_layers(job *J) {
  const dt_llama_config *c = &J->cfg;
  const double T = (double)tokens(J->o), B = 20.0;
  dt_llama_config one = *c;
  one.n_layers = 1;
  one.no_embedding = one.no_head = true;
  const double layer = B * (double)dt_llama_nparams(&one) +
                       T * (34.0 * c->dim + 3.0 * 2.0 * J->ffn);
  const double fixed = B * 2.0 * (double)c->vocab * c->dim + T * c->vocab * 8.0;
  const double mem = 0.9 * J->o->mem_gib * 1073741824.0;
  int n = (int)floor((mem - fixed) / layer);
  if (n > c->n_layers) n = c->n_layers;
  if (n < 1) n = 1;
  snprintf(J->layers_note, sizeof J->layers_note,
           "%d layers (estimate: %.2f GB per layer, %.2f GB embedding+head, 90%% of %.0f GiB)",
           n, layer / 1e9, fixed / 1e9, J->o->mem_gib);
  return n;
}

static dt_status body(dt_ctx *ctx, void *arg) {
  job *J = arg;
  const bopts *o = J->o;
  dt_status s = DT_OK;
  if (o->p_gemm) s = run_gemms(ctx, ctx->device, J);
  if (s != DT_OK || (!o->p_block && !o->p_model)) return s;
  dt_mesh *mesh = NULL;
  const int shape[1] = {1};
  const char *names[1] = {"dp"};
  DT_CHECK(dt_mesh_create(ctx, ctx->world, 1, shape, names, &mesh));
  /* A step that cannot run is reported (why) and does not stop the other. */
  if (o->p_block) {
    J->block.layers = 1;
    (void)time_steps(ctx, mesh, J, true, &J->block);
    dt_error_clear(ctx);
  }
  if (o->p_model) {
    J->model.layers = o->layers ? o->layers : fit_layers(J);
    if (o->layers)
      snprintf(J->layers_note, sizeof J->layers_note, "%d layers (--layers)", o->layers);
    (void)time_steps(ctx, mesh, J, false, &J->model);
    dt_error_clear(ctx);
  }
  dt_mesh_free(mesh);
  return DT_OK;
}

/* ---- output --------------------------------------------------------------------- */

static void csv(const char *part, const char *name, int64_t m, int64_t n, int64_t k, int64_t tok,
                double secs, double tflops, double mfu, double ratio) {
  printf("csv,%s,%s,%lld,%lld,%lld,%lld,%.6e,%.4f,%.4f,%.4f\n", part, name, (long long)m,
         (long long)n, (long long)k, (long long)tok, secs, tflops, mfu, ratio);
}

static void report_step(const job *J, const char *part, const step_result *r, double gemm_rate) {
  const bopts *o = J->o;
  if (!r->ran) {
    printf("  %-6s %2d layer(s)  did not run: %s\n", part, r->layers, r->why);
    return;
  }
  const double tf = r->flops / r->t / 1e12, mfu = tf / o->peak_tflops;
  const double ratio = gemm_rate > 0 ? r->flops / r->t / gemm_rate : NAN;
  printf("  %-6s %2d layer(s)  step %.4f s  %.0f tokens/s  %.2f TFLOP/s  MFU %.3f  "
         "ratio to gemm %.3f\n",
         part, r->layers, r->t, (double)tokens(o) / r->t, tf, mfu, ratio);
  char name[32];
  snprintf(name, sizeof name, "layers=%d", r->layers);
  csv(part, name, 0, 0, 0, tokens(o), r->t, tf, mfu, ratio);
}

static void parse_parts(bopts *o, const char *v) {
  o->p_gemm = o->p_block = o->p_model = false;
  char buf[64];
  snprintf(buf, sizeof buf, "%s", v);
  for (char *save = NULL, *p = strtok_r(buf, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
    if (!strcmp(p, "gemm")) o->p_gemm = true;
    else if (!strcmp(p, "block")) o->p_block = true;
    else if (!strcmp(p, "model")) o->p_model = true;
    else {
      fprintf(stderr, "%s: --parts: unknown part \"%s\" (gemm, block, model)\n", PROG, p);
      exit(2);
    }
  }
  if (!o->p_gemm && !o->p_block && !o->p_model) {
    fprintf(stderr, "%s: --parts: no part given\n", PROG);
    exit(2);
  }
}

int main(int argc, char **argv) {
  bopts o = {.batch = 1, .seq = 0, .reps = 5, .inner = 10, .mem_gib = 139, .peak_tflops = 989,
             .p_gemm = true, .p_block = true, .p_model = true};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--tiny")) { o.tiny = true; continue; }
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) {
      fprintf(stderr, "%s: unknown flag or missing value: %s\n", PROG, a);
      return 2;
    }
    if (!strcmp(a, "--device")) {
      if (!strcmp(v, "cuda")) o.emu = false;
      else if (!strcmp(v, "cuda-emu")) o.emu = true;
      else {
        fprintf(stderr, "%s: --device wants cuda or cuda-emu, got \"%s\"\n", PROG, v);
        return 2;
      }
    } else if (!strcmp(a, "--batch")) o.batch = sb_flag_int_arg(PROG, a, v, 1, 1 << 16);
    else if (!strcmp(a, "--seq")) o.seq = sb_flag_int_arg(PROG, a, v, 1, 1 << 20);
    else if (!strcmp(a, "--reps")) o.reps = sb_flag_int_arg(PROG, a, v, 5, MAX_REPS);
    else if (!strcmp(a, "--inner")) o.inner = sb_flag_int_arg(PROG, a, v, 1, 10000);
    else if (!strcmp(a, "--layers")) o.layers = sb_flag_int_arg(PROG, a, v, 1, 1024);
    else if (!strcmp(a, "--mem-gib")) o.mem_gib = sb_flag_positive_arg(PROG, a, v);
    else if (!strcmp(a, "--peak-tflops")) o.peak_tflops = sb_flag_positive_arg(PROG, a, v);
    else if (!strcmp(a, "--parts")) parse_parts(&o, v);
    else {
      fprintf(stderr, "%s: unknown flag %s\n", PROG, a);
      return 2;
    }
    i++;
  }
  if (o.seq == 0) o.seq = o.tiny ? 32 : 8192;
  if (!o.emu && (!dt_device_cuda_built() || dt_device_cuda_count() == 0)) {
    fprintf(stderr, "%s: --device cuda: %s (--device cuda-emu runs the CUDA code on the host)\n",
            PROG, dt_device_cuda_built() ? "no GPU is visible" : "this build has no CUDA");
    return 2;
  }

  job J = {.o = &o};
  dt_ctx hc;
  dt_ctx_init(&hc, 0, 1);
  const char *flavour = o.tiny ? "8B:dim=64:n_layers=2:n_heads=4:n_kv_heads=2:vocab=256:multiple_of=32"
                               : "8B";
  if (dt_llama_config_get(&hc, flavour, &J.cfg) != DT_OK) {
    fprintf(stderr, "%s: %s\n", PROG, dt_last_error(&hc));
    dt_ctx_release(&hc);
    return 1;
  }
  dt_ctx_release(&hc);
  if (o.layers > J.cfg.n_layers) {
    fprintf(stderr, "%s: --layers %d: the model has %d\n", PROG, o.layers, J.cfg.n_layers);
    return 2;
  }
  J.ffn = dt_llama_ffn_hidden(&J.cfg);
  shapes(&J);

  dt_launch_opts lo = {.backend = DT_BACKEND_THREADS, .world = 1, .timeout_s = 3600,
                       .device = DT_DEV_CUDA, .cuda_emu = o.emu};
  dt_launch_report rep;
  dt_status s = dt_launch(&lo, body, &J, &rep);
  if (s != DT_OK) {
    fprintf(stderr, "%s: failed: %s\n", PROG, rep.failed_msg[0] ? rep.failed_msg : dt_status_str(s));
    dt_launch_report_free(&rep);
    return 1;
  }
  dt_launch_report_free(&rep);

  const int64_t T = tokens(&o);
  printf("%s: %s on %s, bf16 (f32 accumulation), world 1, batch %d x seq %d = %lld tokens\n",
         PROG, o.tiny ? "tiny (dim 64)" : "Llama 3 8B", o.emu ? "cuda-emu" : "cuda", o.batch,
         o.seq, (long long)T);
  printf("  dim %d, %d heads, %d kv heads, head dim %d, ffn %d, vocab %d, rope theta %g; "
         "median of %d reps; peak %.0f TFLOP/s\n",
         J.cfg.dim, J.cfg.n_heads, J.cfg.n_kv_heads, J.cfg.dim / J.cfg.n_heads, J.ffn,
         J.cfg.vocab, J.cfg.rope_theta, o.reps, o.peak_tflops);
  printf("csv,part,name,m,n,k,tokens,seconds,tflops,mfu,ratio\n");
  double gemm_rate = 0;
  if (o.p_gemm) {
    printf("  %-8s %8s %8s %8s %12s %10s %6s\n", "gemm", "m", "n", "k", "seconds", "TFLOP/s",
           "MFU");
    for (int i = 0; i < N_GEMMS; i++) {
      const gemm_shape *g = &J.g[i];
      const double tf = 2.0 * (double)g->m * (double)g->n * (double)g->k / g->t / 1e12;
      printf("  %-8s %8lld %8lld %8lld %12.4e %10.2f %6.3f\n", g->name, (long long)g->m,
             (long long)g->n, (long long)g->k, g->t, tf, tf / o.peak_tflops);
      csv("gemm", g->name, g->m, g->n, g->k, T, g->t, tf, tf / o.peak_tflops, NAN);
    }
    gemm_rate = J.gemm_flops / J.gemm_t;
    printf("  gemm mix: %.4e s per block's GEMMs, %.2f TFLOP/s, MFU %.3f\n", J.gemm_t,
           gemm_rate / 1e12, gemm_rate / 1e12 / o.peak_tflops);
    csv("gemm", "mix", 0, 0, 0, T, J.gemm_t, gemm_rate / 1e12, gemm_rate / 1e12 / o.peak_tflops,
        1.0);
  }
  if (o.p_block) report_step(&J, "block", &J.block, gemm_rate);
  if (o.p_model) {
    printf("  model: %s\n", J.layers_note);
    report_step(&J, "model", &J.model, gemm_rate);
  }
  /* a part asked for that did not run is a failure (its line says why) */
  return (o.p_block && !J.block.ran) || (o.p_model && !J.model.ran) ? 1 : 0;
}
