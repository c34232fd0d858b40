/* bench/micro/model_flops.c: how close one unsharded Llama training step of lib/nn comes
 * to plain cblas_sgemm on the same matrix products.
 *
 *   bench/shardbench-model-flops [--model debugmodel] [--batch 1] [--seq 128] [--reps 5]
 *                     [--warmup 1] [--threads 1]
 *
 * One rank (threads backend, 1-rank mesh), f32, CPU. Per rep it times
 *   (model) dt_model_forward + dt_model_loss + dt_model_backward + end_step;
 *   (gemm)  every matrix product that step implies, as plain cblas_sgemm calls on
 *           preallocated buffers: per linear [in -> out] over T = batch*seq tokens
 *           the forward x W^T (T,out,in), grad-input dY W (T,in,out) and
 *           grad-weight dY^T X (out,in,T); per layer and (batch, head) the six
 *           attention products (Q K^T, P V; backward dV, dP, dQ, dK), each of
 *           2 S S hd flops; each distinct shape timed for its count.
 * Model FLOPs are TorchTitan's formula (torchtitan/models/utils.py
 * get_dense_model_nparams_and_flops):
 *   6 (N - N_embedding) T + 12 L H hd S T,
 * the GEMM FLOPs are counted from the shapes (2 m n k each); they differ only
 * by the norm weights' 6 (2L + 1) D T. Rates are each count over the median
 * time of --reps reps (after --warmup); ratio = model rate / gemm rate (goal
 * >= 0.6). Exit 0 when it ran (the goal is reported, not enforced), 1 on a
 * failed call, 2 on bad flags.
 * What it is not: a benchmark of sharded steps, of the optimizer, or of GPUs.
 *
 *   bench/shardbench-model-flops --sgemm-sweep 64,128,256,512,1024 [--threads 1] [--reps 5]
 *
 * instead times plain square cblas_sgemm n x n x n for each n (no model): each
 * rep is as many back-to-back calls as fill about 50 ms (at least one), after one
 * warm-up rep; the best rep's time per call. One csv line per size:
 *   sgemm,n,flops_per_call,seconds_per_call,gflops
 * (bench/calibrate-local.sh reads it for the `local` hardware file's GEMM table).
 */
#include "config.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor.h"
#include "../common/flags.h"
#include "../stats.h"

static const char PROG[] = "model_flops";
/* The target: model FLOP rate over plain sgemm's on the same shapes. */
static const double GOAL_RATIO = 0.6;
enum { MAX_REPS = 101, MAX_SHAPES = 64 };

typedef struct bopts {
  char model[32];
  int batch, seq, reps, warmup, threads;
} bopts;

typedef struct gshape {
  int m, n, k;
  bool ta, tb;
  long count;
} gshape;

typedef struct job {
  const bopts *o;
  int ok;
  double t_model, t_gemm;             /* median seconds */
  double flops_model, flops_gemm;     /* per step */
  double loss;
} job;

static void add_shape(gshape *s, int *ns, int m, int n, int k, bool ta, bool tb, long count) {
  for (int i = 0; i < *ns; i++)
    if (s[i].m == m && s[i].n == n && s[i].k == k && s[i].ta == ta && s[i].tb == tb) {
      s[i].count += count;
      return;
    }
  if (*ns < MAX_SHAPES) s[(*ns)++] = (gshape){m, n, k, ta, tb, count};
}

/* Forward, grad-input and grad-weight products of a linear [in -> out] on T rows. */
static void add_linear(gshape *s, int *ns, int T, int in, int out, long count) {
  add_shape(s, ns, T, out, in, false, true, count);  /* y = x W^T */
  add_shape(s, ns, T, in, out, false, false, count); /* dx = dy W */
  add_shape(s, ns, out, in, T, true, false, count);  /* dW = dy^T x */
}

static double gemm_flops(const gshape *s, int ns) {
  double f = 0;
  for (int i = 0; i < ns; i++) f += 2.0 * s[i].m * s[i].n * s[i].k * (double)s[i].count;
  return f;
}

/* Runs every shape its count of times on buffers A, B, C (large enough). */
static void run_gemms(const gshape *s, int ns, const float *A, const float *B, float *C) {
  for (int i = 0; i < ns; i++) {
    const gshape *g = &s[i];
    int lda = g->ta ? g->m : g->k, ldb = g->tb ? g->k : g->n;
    for (long c = 0; c < g->count; c++)
      cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans,
                  g->tb ? CblasTrans : CblasNoTrans, g->m, g->n, g->k, 1.0f, A, lda, B, ldb, 0.0f,
                  C, g->n);
  }
}

/* --sgemm-sweep: the best time per call of n^3 sgemm for each n of the list. */
static int sgemm_sweep(const char *list, int reps) {
  int sizes[32], ns = 0;
  for (const char *c = list; *c;) {
    char *end;
    long n = strtol(c, &end, 10);
    if (end == c || n < 1 || n > 8192 || (*end && *end != ',') || ns == 32) {
      fprintf(stderr, "%s: --sgemm-sweep: expected up to 32 sizes 1..8192 separated by ',', got '%s'\n",
              PROG, list);
      return 2;
    }
    sizes[ns++] = (int)n;
    c = *end ? end + 1 : end;
  }
  if (ns == 0) {
    fprintf(stderr, "%s: --sgemm-sweep: no sizes\n", PROG);
    return 2;
  }
  printf("sgemm,n,flops_per_call,seconds_per_call,gflops\n");
  for (int i = 0; i < ns; i++) {
    const int n = sizes[i];
    const size_t e = (size_t)n * (size_t)n;
    float *A = malloc(e * sizeof *A), *B = malloc(e * sizeof *B), *C = malloc(e * sizeof *C);
    if (!A || !B || !C) {
      fprintf(stderr, "%s: --sgemm-sweep: cannot allocate 3 x %d^2 floats\n", PROG, n);
      free(A), free(B), free(C);
      return 1;
    }
    dt_rng_fill(DT_F32, A, (int64_t)e, 7, 1, 0, 1, DT_RNG_UNIFORM, -1.0, 2.0);
    dt_rng_fill(DT_F32, B, (int64_t)e, 7, 2, 0, 1, DT_RNG_UNIFORM, -1.0, 2.0);
    const double flops = 2.0 * n * (double)n * n;
    double t0 = dt_now(); /* one call sizes the reps (and warms the caches) */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
    double one = dt_now() - t0;
    long calls = one > 0 ? (long)(0.05 / one) : 1000000;
    if (calls < 1) calls = 1;
    if (calls > 1000000) calls = 1000000;
    double best = 1e30;
    for (int r = -1; r < reps; r++) {
      t0 = dt_now();
      for (long c = 0; c < calls; c++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
      double t = (dt_now() - t0) / (double)calls;
      if (r >= 0 && t < best) best = t;
    }
    printf("sgemm,%d,%.6g,%.6g,%.4f\n", n, flops, best, flops / best * 1e-9);
    free(A), free(B), free(C);
  }
  return 0;
}

static dt_status body(dt_ctx *ctx, void *arg) {
  job *J = arg;
  const bopts *o = J->o;
  const char *names[1] = {"one"};
  const int shape[1] = {1};
  dt_mesh *mesh = NULL;
  dt_model *m = NULL;
  dt_tensor tok = {0}, tgt = {0};
  int64_t *ids = NULL;
  float *A = NULL, *B = NULL, *C = NULL;
  double *tm = calloc((size_t)o->reps, sizeof *tm), *tg = calloc((size_t)o->reps, sizeof *tg);
  dt_llama_config cfg;
  dt_status s = dt_llama_config_get(ctx, o->model, &cfg);
  if (s == DT_OK) s = dt_mesh_create(ctx, ctx->world, 1, shape, names, &mesh);
  if (s == DT_OK) s = dt_model_create(ctx, mesh, &cfg, DT_F32, 1, &m);
  if (s == DT_OK) s = dt_model_materialize(ctx, m);
  const int T = o->batch * o->seq;
  ids = malloc(sizeof *ids * (size_t)T * 2);
  if (!tm || !tg || !ids) s = DT_ERR_NOMEM;
  if (s != DT_OK) goto done;
  for (int i = 0; i < 2 * T; i++) ids[i] = (int64_t)(((uint64_t)i * 2654435761u) % cfg.vocab);
  {
    const int64_t sh[2] = {o->batch, o->seq};
    dt_placement pl[DT_MAX_MESH_DIMS];
    memset(pl, 0, sizeof pl);
    dt_array a;
    s = dt_array_wrap(ctx, DT_DEV_CPU, DT_I64, 2, sh, ids, &a);
    if (s == DT_OK) s = dt_tensor_distribute(ctx, mesh, &a, pl, &tok);
    if (s == DT_OK) s = dt_array_wrap(ctx, DT_DEV_CPU, DT_I64, 2, sh, ids + T, &a);
    if (s == DT_OK) s = dt_tensor_distribute(ctx, mesh, &a, pl, &tgt);
  }
  if (s != DT_OK) goto done;

  /* the step's products */
  gshape gs[MAX_SHAPES];
  int ns = 0;
  const int D = cfg.dim, hd = cfg.dim / cfg.n_heads, F = dt_llama_ffn_hidden(&cfg);
  const int QD = cfg.n_heads * hd, KD = cfg.n_kv_heads * hd, S = o->seq, L = cfg.n_layers;
  add_linear(gs, &ns, T, D, QD, L);     /* wq */
  add_linear(gs, &ns, T, D, KD, 2L * L); /* wk, wv */
  add_linear(gs, &ns, T, QD, D, L);     /* wo */
  add_linear(gs, &ns, T, D, F, 2L * L); /* w1, w3 */
  add_linear(gs, &ns, T, F, D, L);      /* w2 */
  add_linear(gs, &ns, T, D, cfg.vocab, 1);
  long heads = (long)L * o->batch * cfg.n_heads;
  add_shape(gs, &ns, S, S, hd, false, true, 2 * heads);  /* Q K^T, dP = dO V^T */
  add_shape(gs, &ns, S, hd, S, false, false, 2 * heads); /* P V, dQ = dS K */
  add_shape(gs, &ns, S, hd, S, true, false, 2 * heads);  /* dV = P^T dO, dK = dS^T Q */
  J->flops_gemm = gemm_flops(gs, ns);
  J->flops_model = dt_llama_flops_per_token(&cfg, S) * T;
  size_t maxe = 0;
  for (int i = 0; i < ns; i++) {
    size_t a = (size_t)gs[i].m * gs[i].k, b = (size_t)gs[i].k * gs[i].n, c = (size_t)gs[i].m * gs[i].n;
    if (a > maxe) maxe = a;
    if (b > maxe) maxe = b;
    if (c > maxe) maxe = c;
  }
  A = malloc(maxe * sizeof *A);
  B = malloc(maxe * sizeof *B);
  C = malloc(maxe * sizeof *C);
  if (!A || !B || !C) {
    s = DT_ERR_NOMEM;
    goto done;
  }
  /* small O(1) operands (the values do not affect sgemm's speed; no denormals) */
  dt_rng_fill(DT_F32, A, (int64_t)maxe, 7, 1, 0, 1, DT_RNG_UNIFORM, -1.0, 2.0);
  dt_rng_fill(DT_F32, B, (int64_t)maxe, 7, 2, 0, 1, DT_RNG_UNIFORM, -1.0, 2.0);

  for (int r = -o->warmup; r < o->reps && s == DT_OK; r++) {
    double t0 = dt_now();
    dt_var *logits = NULL, *loss = NULL;
    s = dt_model_forward(ctx, m, &tok, &logits);
    if (s == DT_OK) s = dt_model_loss(ctx, m, logits, &tgt, &loss);
    if (s == DT_OK) s = dt_model_backward(ctx, m, loss);
    if (s == DT_OK && r == o->reps - 1) {
      dt_array f;
      if (dt_tensor_full(ctx, dt_var_value(loss), &f) == DT_OK) {
        J->loss = ((const float *)f.data)[0];
        dt_array_free(ctx, &f);
      }
    }
    if (s == DT_OK) s = dt_model_end_step(ctx, m);
    dt_tape_zero_grad(m->tape); /* the next step's gradients start from none */
    double t1 = dt_now();
    run_gemms(gs, ns, A, B, C);
    double t2 = dt_now();
    if (r >= 0) {
      tm[r] = t1 - t0;
      tg[r] = t2 - t1;
    }
  }
  if (s == DT_OK) {
    J->t_model = sb_median(tm, o->reps);
    J->t_gemm = sb_median(tg, o->reps);
    J->ok = 1;
  }
done:
  free(A);
  free(B);
  free(C);
  free(tm);
  free(tg);
  if (tok.mesh) dt_tensor_free(ctx, &tok);
  if (tgt.mesh) dt_tensor_free(ctx, &tgt);
  free(ids);
  dt_model_free(ctx, m);
  dt_mesh_free(mesh);
  return s;
}

int main(int argc, char **argv) {
  bopts o = {"debugmodel", 1, 128, 5, 1, 1};
  const char *sweep = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) {
      fprintf(stderr, "%s: unknown flag or missing value: %s\n", PROG, a);
      return 2;
    }
    if (!strcmp(a, "--model")) snprintf(o.model, sizeof o.model, "%s", v);
    else if (!strcmp(a, "--batch")) o.batch = sb_flag_int_arg(PROG, a, v, 1, 1 << 16);
    else if (!strcmp(a, "--seq")) o.seq = sb_flag_int_arg(PROG, a, v, 1, 1 << 20);
    else if (!strcmp(a, "--reps")) o.reps = sb_flag_int_arg(PROG, a, v, 1, MAX_REPS);
    else if (!strcmp(a, "--warmup")) o.warmup = sb_flag_int_arg(PROG, a, v, 0, 100);
    else if (!strcmp(a, "--threads")) o.threads = sb_flag_int_arg(PROG, a, v, 1, 1024);
    else if (!strcmp(a, "--sgemm-sweep")) sweep = v;
    else {
      fprintf(stderr, "%s: unknown flag %s\n", PROG, a);
      return 2;
    }
    i++;
  }
  dt_device_cpu_blas_threads(o.threads);
  if (sweep) return sgemm_sweep(sweep, o.reps);
  job J = {.o = &o};
  dt_launch_opts lo = {.backend = DT_BACKEND_THREADS, .world = 1, .timeout_s = 600};
  dt_launch_report rep;
  dt_status s = dt_launch(&lo, body, &J, &rep);
  if (s != DT_OK || !J.ok) {
    fprintf(stderr, "%s: failed: %s\n", PROG, rep.failed_msg[0] ? rep.failed_msg : dt_status_str(s));
    dt_launch_report_free(&rep);
    return 1;
  }
  dt_launch_report_free(&rep);
  double model_rate = J.flops_model / J.t_model, gemm_rate = J.flops_gemm / J.t_gemm;
  double ratio = model_rate / gemm_rate;
  printf("%s: %s f32, batch %d seq %d, %d BLAS thread(s), median of %d reps\n", PROG, o.model,
         o.batch, o.seq, o.threads, o.reps);
  printf("  step (fwd+loss+bwd)  %.4f s  %.3e model FLOPs (TorchTitan formula)  %.2f GFLOP/s\n",
         J.t_model, J.flops_model, model_rate * 1e-9);
  printf("  plain sgemm          %.4f s  %.3e GEMM FLOPs (same shapes)           %.2f GFLOP/s\n",
         J.t_gemm, J.flops_gemm, gemm_rate * 1e-9);
  printf("  ratio %.3f (goal >= %.1f: %s)  loss %.4f\n", ratio, GOAL_RATIO,
         ratio >= GOAL_RATIO ? "met" : "NOT met", J.loss);
  return 0;
}
