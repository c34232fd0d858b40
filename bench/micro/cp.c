/* bench/micro/cp.c: context parallel against the unsharded model, measured in one run:
 * step time and peak activation memory per rank of the same Llama step at a long
 * sequence, unsharded (1 rank) and with the sequence sharded over --world cp ranks
 * with each rotate method (allgather, ring).
 *
 *   bench/shardbench-cp [--world 4] [--model debugmodel] [--dtype f32] [--batch 1]
 *                       [--seq 4096] [--steps 2] [--warmup 1] [--reps 3]
 *                       [--blas-threads 1] [--json]
 *
 * Layouts (threads backend): unsharded (a 1-rank mesh, plain sdpa), allgather and
 * ring (a 1-D mesh [cp] of --world ranks: dt_context_parallel with head-tail load
 * balancing, the tokens in its storage order, Shard(1) on cp (dt_cp_shard_sequence);
 * the weights whole on every rank, their gradients all-reduced over cp,
 * dt_data_parallel_reduce_grads, as TorchTitan's DDP over dp_cp). One launch per
 * layout and rep, the layouts in turn, reversed every other rep so that drift in the
 * machine's load hits them alike. Each launch builds the model (same seed: the same
 * global weights), runs --warmup untimed steps, then --steps timed ones.
 *
 * Every rank runs OpenBLAS with one thread (--blas-threads N: N): the unsharded run is
 * one core's work, the cp ranks share the machine's cores (4 ranks on 2 cores here).
 * More BLAS threads do not help the unsharded step: attention's GEMMs are 64 x L x hd
 * blocks with hd = 16 on the debugmodel, too small to split, and the softmax rows run
 * on the rank's own thread (measured: 2 threads made the unsharded seq-4096 step 21 s
 * instead of about 8 s on 2 cores).
 *
 * Step time = forward + loss + backward + the gradient all-reduce + AdamW + end_step
 * (every rank starts the step after a barrier), the max over ranks per step; the
 * figure is the median over all timed steps of all reps, and its ratio to the
 * unsharded one. Activation memory per rank = the step's peak host bytes
 * (ctx->mem.host_peak, reset at the step's start) minus what the rank holds
 * outside the step's activations: the bytes live at the step's start (weights,
 * AdamW's states) and the weights' gradients (every weight's local gradient after
 * backward; whole on every cp rank, as in the unsharded model). The max over ranks,
 * steps and reps; its ratio to the unsharded run's. The goal: <= 0.3 at
 * cp = 4, seq 4096 (a quarter of the tokens per rank, plus the K/V all-gathered or
 * in flight and the attention's scratch).
 *
 * Exit 0 when every layout ran (a goal miss is reported, not an error), 1 when a run
 * failed, 2 on bad flags (one line on stderr, before any run).
 */
#include "config.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor.h"
#include "../common/flags.h"
#include "../harness/verdict.h"
#include "../stats.h"

static const char PROG[] = "cp";
static const uint64_t SEED = 20260101;
/* A collective waiting longer than this fails the run: a step at seq 4096 on 2 cores
 * takes seconds. */
static const double LAUNCH_TIMEOUT_S = 1200;
static const double ACT_GOAL = 0.3;

enum { MAX_REPS = 100, MAX_STEPS = 1000 };
typedef enum layout_id { L_FULL = 0, L_ALLGATHER, L_RING, L_COUNT } layout_id;
static const char *const L_NAME[L_COUNT] = {"unsharded", "allgather", "ring"};

typedef struct bopts {
  int world;
  char model[96];
  char dtype_name[8];
  dt_dtype dtype;
  int batch, seq, steps, warmup, reps;
  int blas;                     /* OpenBLAS threads per rank */
  bool json;
} bopts;

typedef struct layout {
  double *times;                /* reps x steps: the slowest rank's seconds */
  double act;                   /* activation bytes, max over ranks, steps, reps */
  double peak;                  /* the step's peak host bytes, same maxima */
  bool ran;
} layout;

typedef struct shared {
  const bopts *o;
  dt_llama_config cfg;
  layout L[L_COUNT];
  int cur, rep;
} shared;

static double grad_bytes(const dt_model *m) {
  double b = 0;
  for (int i = 0; i < m->n_mods; i++) {
    const dt_tensor *g = m->mods[i].weight ? dt_var_grad(m->mods[i].weight) : NULL;
    if (g) b += (double)g->local.numel * (double)dt_dtype_size(g->local.dtype);
  }
  return b;
}

/* One step: *secs, and this step's activation and peak bytes. */
static dt_status one_step(dt_ctx *ctx, dt_mesh *mesh, dt_model *m, const shared *sh, int step,
                          double *secs, double *act, double *peak) {
  const bopts *o = sh->o;
  const bool cp = sh->cur != L_FULL;
  dt_tensor tok, tgt;
  memset(&tok, 0, sizeof tok);
  memset(&tgt, 0, sizeof tgt);
  dt_status s = DT_OK;
  for (int w = 0; w < 2 && s == DT_OK; w++)
    s = cp ? sb_token_tensor_cp(ctx, m, o->batch, o->seq, sh->cfg.vocab, 0u, step, w, w ? &tgt : &tok)
           : sb_token_tensor(ctx, mesh, o->batch, o->seq, sh->cfg.vocab, 0u, step, w, w ? &tgt : &tok);
  if (s == DT_OK) s = dt_comm_barrier(ctx->world);
  const size_t held = ctx->mem.host_cur; /* weights, AdamW states, the token batches */
  dt_mem_peak_restart(ctx, false);
  const double t0 = dt_now();
  dt_var *logits = NULL, *loss = NULL;
  if (s == DT_OK) s = dt_model_forward(ctx, m, &tok, &logits);
  if (s == DT_OK) s = dt_model_loss(ctx, m, logits, &tgt, &loss);
  if (s == DT_OK) s = dt_model_backward(ctx, m, loss);
  if (s == DT_OK && cp) s = dt_data_parallel_reduce_grads(ctx, m, 1u, NULL); /* over cp */
  const double grads = s == DT_OK ? grad_bytes(m) : 0;
  const dt_adamw opt = DT_ADAMW_DEFAULT;
  if (s == DT_OK) s = dt_model_adamw_step(ctx, m, &opt);
  if (s == DT_OK) s = dt_model_end_step(ctx, m);
  *secs = dt_now() - t0;
  *peak = (double)ctx->mem.host_peak;
  *act = *peak - (double)held - grads;
  dt_tensor_free(ctx, &tok);
  dt_tensor_free(ctx, &tgt);
  return s;
}

static dt_status bench_rank(dt_ctx *ctx, void *arg) {
  shared *sh = arg;
  const bopts *o = sh->o;
  layout *ly = &sh->L[sh->cur];
  const int total = o->warmup + o->steps, n = ctx->world_size;
  const char *names[1] = {sh->cur == L_FULL ? "ref" : "cp"};
  dt_mesh *mesh = NULL;
  dt_model *m = NULL;
  double *times = calloc((size_t)total, sizeof *times), mx[2] = {0, 0};
  dt_status s = times ? DT_OK : dt_error(ctx, DT_ERR_NOMEM, PROG, "no memory");
  dt_ledger_enable(ctx, false);
  if (s == DT_OK) s = dt_mesh_create(ctx, ctx->world, 1, &n, names, &mesh);
  if (s == DT_OK) s = dt_model_create(ctx, mesh, &sh->cfg, o->dtype, SEED, &m);
  if (s == DT_OK && sh->cur != L_FULL)
    s = dt_context_parallel(ctx, m, 0, sh->cur == L_RING ? DT_CP_RING : DT_CP_ALLGATHER, true);
  if (s == DT_OK) s = dt_model_materialize(ctx, m);
  for (int step = 0; step < total && s == DT_OK; step++) {
    double act = 0, peak = 0;
    s = one_step(ctx, mesh, m, sh, step, &times[step], &act, &peak);
    if (step >= o->warmup) {
      mx[0] = fmax(mx[0], act);
      mx[1] = fmax(mx[1], peak);
    }
  }
  if (s == DT_OK) s = dt_comm_all_reduce(ctx->world, times, times, (size_t)total, DT_F64, DT_RED_MAX);
  if (s == DT_OK) s = dt_comm_all_reduce(ctx->world, mx, mx, 2, DT_F64, DT_RED_MAX);
  if (s == DT_OK && ctx->rank == 0) {
    memcpy(ly->times + (size_t)sh->rep * o->steps, times + o->warmup, sizeof *times * (size_t)o->steps);
    ly->act = fmax(ly->act, mx[0]);
    ly->peak = fmax(ly->peak, mx[1]);
    ly->ran = true;
  }
  dt_model_free(ctx, m);
  dt_mesh_free(mesh);
  free(times);
  return s;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: bench/shardbench-cp [--world N] [--model M] [--dtype f32|f64] [--batch B]\n"
          "                           [--seq S] [--steps N] [--warmup N] [--reps N]\n"
          "                           [--blas-threads N] [--json]\n"
          "  Step time and peak activation memory per rank of the unsharded model and of\n"
          "  context parallel over N ranks (allgather and ring), threads backend.\n"
          "  Defaults: world 4, debugmodel, f32, batch 1, seq 4096, 2 timed steps after 1\n"
          "  warm-up step per launch, 3 reps, 1 BLAS thread per rank.\n");
}

/* One line "PROG: WHERE: message" on stderr (bench/common/flags.h); returns 2. */
#define bad(...) sb_flag_bad(PROG, __VA_ARGS__)

static int parse_flags(int argc, char **argv, bopts *o) {
  enum { O_JSON = 256 };
  static const struct option lopts[] = {
      {"world", required_argument, 0, 'w'},  {"model", required_argument, 0, 'm'},
      {"dtype", required_argument, 0, 'd'},  {"batch", required_argument, 0, 'b'},
      {"seq", required_argument, 0, 's'},    {"steps", required_argument, 0, 'n'},
      {"warmup", required_argument, 0, 'W'}, {"reps", required_argument, 0, 'r'},
      {"blas-threads", required_argument, 0, 'B'},
      {"json", no_argument, 0, O_JSON},      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  opterr = 0;
  int ch;
  long v;
  while ((ch = getopt_long(argc, argv, ":h", lopts, NULL)) != -1) {
    switch (ch) {
      case 'w':
        if (sb_flag_long(optarg, 2, DT_THREADS_MAX_WORLD, &v))
          return bad("--world", "expected 2..%d (cp over one rank shards nothing), got '%s'",
                     DT_THREADS_MAX_WORLD, optarg);
        o->world = (int)v;
        break;
      case 'm':
        if (strlen(optarg) >= sizeof o->model)
          return bad("--model", "too long (at most %zu characters)", sizeof o->model - 1);
        snprintf(o->model, sizeof o->model, "%s", optarg);
        break;
      case 'd':
        if (dt_dtype_parse(optarg, &o->dtype) != DT_OK || (o->dtype != DT_F32 && o->dtype != DT_F64))
          return bad("--dtype", "expected f32 or f64, got '%s'", optarg);
        snprintf(o->dtype_name, sizeof o->dtype_name, "%s", optarg);
        break;
      case 'b':
        if (sb_flag_long(optarg, 1, 1 << 20, &v)) return bad("--batch", "expected 1..1048576, got '%s'", optarg);
        o->batch = (int)v;
        break;
      case 's':
        if (sb_flag_long(optarg, 1, 1 << 20, &v)) return bad("--seq", "expected 1..1048576, got '%s'", optarg);
        o->seq = (int)v;
        break;
      case 'n':
        if (sb_flag_long(optarg, 1, MAX_STEPS, &v))
          return bad("--steps", "expected 1..%d, got '%s'", MAX_STEPS, optarg);
        o->steps = (int)v;
        break;
      case 'W':
        if (sb_flag_long(optarg, 0, MAX_STEPS, &v))
          return bad("--warmup", "expected 0..%d, got '%s'", MAX_STEPS, optarg);
        o->warmup = (int)v;
        break;
      case 'r':
        if (sb_flag_long(optarg, 1, MAX_REPS, &v)) return bad("--reps", "expected 1..%d, got '%s'", MAX_REPS, optarg);
        o->reps = (int)v;
        break;
      case 'B':
        if (sb_flag_long(optarg, 1, 1024, &v)) return bad("--blas-threads", "expected 1..1024, got '%s'", optarg);
        o->blas = (int)v;
        break;
      case O_JSON: o->json = true; break;
      case 'h': usage(stdout); return -1;
      default: return sb_flag_getopt_bad(PROG, ch, argv); /* ':' missing value, '?' unknown */
    }
  }
  if (optind < argc) return bad(argv[optind], "unexpected argument");
  if (o->seq % (2 * o->world))
    return bad("--seq", "%d is not divisible by 2 x --world = %d (head-tail load balancing)",
               o->seq, 2 * o->world);
  return 0;
}

int main(int argc, char **argv) {
  bopts o = {.world = 4, .model = "debugmodel", .dtype_name = "f32", .dtype = DT_F32, .batch = 1,
             .seq = 4096, .steps = 2, .warmup = 1, .reps = 3, .blas = 1};
  int rc = parse_flags(argc, argv, &o);
  if (rc) return rc < 0 ? 0 : rc;
  shared sh;
  memset(&sh, 0, sizeof sh);
  sh.o = &o;
  dt_ctx hc;
  dt_ctx_init(&hc, 0, 1);
  if (dt_llama_config_get(&hc, o.model, &sh.cfg) != DT_OK) {
    rc = bad("--model", "%s", dt_last_error(&hc));
    dt_ctx_release(&hc);
    return rc;
  }
  dt_ctx_release(&hc);
  for (int l = 0; l < L_COUNT; l++)
    if (!(sh.L[l].times = calloc((size_t)o.reps * (size_t)o.steps, sizeof(double)))) {
      fprintf(stderr, "%s: out of memory\n", PROG);
      return 1;
    }
  const double w0 = dt_now();
  for (int rep = 0; rep < o.reps && rc == 0; rep++)
    for (int k = 0; k < L_COUNT && rc == 0; k++) {
      sh.rep = rep;
      sh.cur = rep % 2 ? L_COUNT - 1 - k : k;
      dt_launch_opts lo;
      memset(&lo, 0, sizeof lo);
      lo.backend = DT_BACKEND_THREADS;
      lo.world = sh.cur == L_FULL ? 1 : o.world;
      lo.timeout_s = LAUNCH_TIMEOUT_S;
      lo.device = DT_DEV_CPU;
      dt_launch_report rep_;
      memset(&rep_, 0, sizeof rep_);
      dt_device_cpu_blas_threads(o.blas > 0 ? o.blas : 1);
      if (dt_launch(&lo, bench_rank, &sh, &rep_) != DT_OK) {
        fprintf(stderr, "%s: %s, rep %d: rank %d: %s\n", PROG, L_NAME[sh.cur], rep,
                rep_.failed_rank, rep_.failed_msg);
        rc = 1;
      }
      dt_launch_report_free(&rep_);
    }
  const double wall = dt_now() - w0;
  if (rc == 0) {
    const int n = o.reps * o.steps;
    double t[L_COUNT];
    for (int l = 0; l < L_COUNT; l++) t[l] = sb_median(sh.L[l].times, n);
    const layout *F = &sh.L[L_FULL];
    if (o.json) {
      printf("{\"world\": %d, \"model\": \"%s\", \"dtype\": \"%s\", \"batch\": %d, \"seq\": %d, "
             "\"steps\": %d, \"warmup\": %d, \"reps\": %d, \"blas_threads\": %d, \"wall_s\": %.3f, "
             "\"layouts\": [", o.world, o.model, o.dtype_name, o.batch, o.seq, o.steps, o.warmup,
             o.reps, o.blas, wall);
      for (int l = 0; l < L_COUNT; l++)
        printf("%s{\"layout\": \"%s\", \"step_time_s\": %.9g, \"step_ratio\": %.6g, "
               "\"activation_bytes\": %.0f, \"activation_ratio\": %.6g, \"peak_bytes\": %.0f}",
               l ? ", " : "", L_NAME[l], t[l], t[l] / t[L_FULL], sh.L[l].act,
               sh.L[l].act / F->act, sh.L[l].peak);
      printf("], \"activation_goal\": %g}\n", ACT_GOAL);
    } else {
      printf("# shardbench cp: threads, %s %s, batch %d, seq %d; cp = %d for allgather and ring; "
             "%d BLAS thread(s) per rank\n", o.model, o.dtype_name, o.batch, o.seq, o.world, o.blas);
      printf("# step = forward + loss + backward + grad all-reduce + AdamW (max over ranks), "
             "median of %d steps x %d reps after %d warm-up step(s) per launch\n",
             o.steps, o.reps, o.warmup);
      printf("# activations = the step's peak host bytes - weights, AdamW states and gradients "
             "(max over ranks, steps, reps)\n");
      printf("%-10s %10s %8s %16s %8s %14s\n", "#layout", "step(s)", "x full", "activations(MiB)",
             "x full", "peak(MiB)");
      for (int l = 0; l < L_COUNT; l++)
        printf("%-10s %10.3f %8.3f %16.2f %8.3f %14.2f\n", L_NAME[l], t[l], t[l] / t[L_FULL],
               sh.L[l].act / 1048576.0, sh.L[l].act / F->act, sh.L[l].peak / 1048576.0);
      for (int l = L_ALLGATHER; l < L_COUNT; l++)
        printf("%s activations / unsharded = %.3f (goal <= %.1f): %s\n", L_NAME[l],
               sh.L[l].act / F->act, ACT_GOAL, sh.L[l].act / F->act <= ACT_GOAL ? "PASS" : "MISS");
      printf("# %d launches in %.1f s\n", o.reps * L_COUNT, wall);
    }
  }
  for (int l = 0; l < L_COUNT; l++) free(sh.L[l].times);
  return rc;
}
