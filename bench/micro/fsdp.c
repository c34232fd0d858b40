/* bench/micro/fsdp.c: step time and persistent memory per rank of data parallel (dp),
 * ZeRO-1, ZeRO-2 and FSDP (ZeRO-3) on the same Llama model, measured in one run.
 *
 *   bench/shardbench-fsdp [--world 8] [--model debugmodel] [--dtype f32] [--batch 8]
 *                         [--seq 32] [--steps 5] [--warmup 2] [--reps 3]
 *                         [--plans-dir DIR] [--json]
 *
 * Layouts, each on a 1-D mesh of --world ranks (threads backend), from the plan
 * files of the same name: dp (dims = dp_replicate: every rank holds the whole
 * model; DDP's bucketed all_reduce of the gradients, dt_data_parallel_reduce_grads,
 * with the plan's bucket_cap_mb), zero1, zero2 and fsdp (dims = dp_shard: the
 * plan's fully_shard units, dt_fully_shard with the plan's zero stage). A layout
 * the library does not implement (dt_fully_shard answers DT_ERR_UNSUPPORTED) is
 * reported as "n/a (not implemented)". Tokens are Shard(0) on the mesh dim (the
 * batch split over the data-parallel ranks), the same batches for every layout.
 *
 * One launch per layout and rep; within a rep the layouts run in turn, in
 * reverse order every other rep, so that drift in the machine's load hits them
 * alike. Each launch builds the model (same seed: the same global weights),
 * runs --warmup untimed steps, then --steps timed ones. Step time = forward +
 * loss + backward + the data-parallel reduction + AdamW + end_step (every rank
 * starts the step after a barrier), the max over ranks per step; the figure is
 * the median over all timed steps of all reps, and its ratio to dp's.
 *
 * Persistent state per rank is measured from the tensors, at the last step of
 * each launch: parameters (every weight's local array), gradients (every
 * weight's gradient local array after the reduction, before the optimizer,
 * which consumes them), optimizer state (AdamW's m and v local arrays,
 * dt_model.adam_m / adam_v, after the step); each the max over ranks (the
 * total's min over ranks is shown too), and the total's ratio to dp's. Peak
 * host memory per rank is ctx->mem.host_peak of the launch, max over ranks and
 * reps (it includes activations and FSDP's unsharded copies, which are not
 * persistent).
 *
 * The expected persistent state, derived from the weight shapes (printed as
 * "derived", an oracle independent of the tensors measured). With Psi weight
 * elements of e bytes: dp holds parameters, gradients and AdamW's two states
 * whole on every rank, 4 Psi e. ZeRO-3 (FSDP2's fully_shard,
 * torch/distributed/fsdp/_fully_shard/_fsdp_param.py FSDPParam._init_sharded_param)
 * keeps of each weight of L rows and R elements per row only this rank's
 * torch.chunk of the rows, c_r(L) x R (c = ceil(L / W) on the first ranks, a
 * short or empty chunk at the end), and its gradient and AdamW states have the
 * same placement: 4 e sum_w c_r(L_w) R_w, ~ 4 Psi e / W, a little more on the
 * ranks holding full chunks when W does not divide some L. ZeRO-2 as
 * FSDP2 expresses it (reshard_after_forward=False, FSDP1's SHARD_GRAD_OP) keeps
 * the same between steps, the parameters being sharded again after backward;
 * its unsharded parameters live from forward to backward, which the peak shows.
 * ZeRO-1 (Rajbhandari et al. 2020, arXiv:1910.02054, section 5.1, P_os) shards
 * only the optimizer state: 2 Psi e + 2 e sum_w c_r(L_w) R_w. The goal for
 * FSDP: persistent state per rank (max over ranks) / dp's = 1/W within 5%.
 *
 * Exit 0 when every implemented layout ran (a goal miss is reported, not an
 * error), 1 when a run failed, 2 on bad flags or plans (one line on stderr,
 * before any run). This program prints; the library does not.
 */
#include "config.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor.h"
#include "../common/flags.h"
#include "../harness/datadir.h"
#include "../harness/verdict.h"
#include "../stats.h"

static const char PROG[] = "fsdp";

/* Weights are generated from this seed in every layout; any fixed value works. */
static const uint64_t SEED = 20260101;
/* A collective waiting longer than this fails the run instead of hanging it: a
 * debugmodel step of 8 ranks on 2 busy cores takes about a second. */
static const double LAUNCH_TIMEOUT_S = 300;
/* The goals: FSDP's persistent state per rank is 1/W of dp's within this
 * relative margin, and its step time at most this multiple of dp's. */
static const double MEM_GOAL_TOL = 0.05;
static const double TIME_GOAL = 1.5;

enum { MAX_REPS = 100, MAX_STEPS = 1000 };

typedef enum layout_id { L_DP = 0, L_ZERO1, L_ZERO2, L_FSDP, L_COUNT } layout_id;
static const char *const L_NAME[L_COUNT] = {"dp", "zero1", "zero2", "fsdp"};
/* The zero stage each sharded layout's plan must give (0: dp, no fully_shard). */
static const int L_ZERO[L_COUNT] = {0, 1, 2, 3};

/* Persistent state of one rank: parameters, gradients, optimizer, their sum. */
enum { M_PARAM = 0, M_GRAD, M_OPT, M_TOTAL, M_COUNT };
/* Timed parts of a step: forward + loss, backward + the data-parallel reduction,
 * AdamW + end_step, and the whole step. */
enum { P_FWD = 0, P_BWD, P_OPT, P_STEP, P_COUNT };

typedef struct bopts {
  int world;
  char model[96];
  char dtype_name[8];
  dt_dtype dtype;
  int batch, seq, steps, warmup, reps;
  const char *plans_flag;
  bool json;
} bopts;

typedef struct layout {
  dt_plan plan;
  bool na;                      /* not implemented in the library */
  char na_why[DT_ERRMSG_LEN];
  bool ran;
  double *times[P_COUNT];       /* reps x steps: the slowest rank's seconds per timed step
                                 * (and per part of it) */
  double mem_max[M_COUNT];      /* bytes, max over ranks (same in every rep) */
  double total_min;             /* the total's min over ranks */
  double peak;                  /* host_peak, max over ranks and reps */
  bool mem_changed;             /* a rep measured other bytes than the first */
  double derived;               /* the derivation's total, max over ranks */
} layout;

typedef struct shared {
  const bopts *o;
  dt_llama_config cfg;
  char plans_dir[SB_DATA_PATH];
  layout L[L_COUNT];
  int cur, rep;                 /* the launch's layout and rep */
} shared;

/* ---- one launch: a layout's training steps ---- */

static double local_bytes(const dt_tensor *t) {
  return t ? (double)t->local.numel * (double)dt_dtype_size(t->local.dtype) : 0.0;
}

/* This rank's parameter and gradient bytes (call before the optimizer clears
 * the gradients). */
static void measure_params_grads(const dt_model *m, double *mem) {
  mem[M_PARAM] = mem[M_GRAD] = 0;
  for (int i = 0; i < m->n_mods; i++) {
    const dt_module *md = &m->mods[i];
    if (!md->wndim || !md->weight) continue;
    mem[M_PARAM] += local_bytes(dt_var_value(md->weight));
    mem[M_GRAD] += local_bytes(dt_var_grad(md->weight));
  }
}

/* This rank's AdamW state bytes (after a step made it). */
static double measure_opt(const dt_model *m) {
  double b = 0;
  for (int i = 0; i < m->n_mods; i++) {
    if (m->adam_m[i].mesh) b += local_bytes(&m->adam_m[i]);
    if (m->adam_v[i].mesh) b += local_bytes(&m->adam_v[i]);
  }
  return b;
}

/* Builds the layout's model on mesh: fully_shard for the sharded layouts, then
 * materialize. *na when the library does not implement the layout's stage. */
static dt_status build_model(dt_ctx *ctx, dt_mesh *mesh, const shared *sh, const layout *ly,
                             dt_model **out, bool *na) {
  const bopts *o = sh->o;
  dt_model *m = NULL;
  *na = false;
  DT_CHECK(dt_model_create(ctx, mesh, &sh->cfg, o->dtype, SEED, &m));
  dt_status s = DT_OK;
  if (L_ZERO[sh->cur]) {
    const dt_plan *p = &ly->plan;
    const int pds = dt_plan_dim(p, "dp_shard");
    dt_plan_entry *e = malloc(sizeof *e * DT_PLAN_MAX_ENTRIES);
    int n = 0;
    if (!e) s = dt_error(ctx, DT_ERR_NOMEM, PROG, "no memory");
    for (int i = 0; e && i < p->n_entries; i++)
      if (p->entries[i].dim == pds) e[n++] = p->entries[i];
    const dt_fsdp_opts fo = {.shard_dim = 0, .cp_dim = -1, .replicate_dim = -1,
                             .zero = L_ZERO[sh->cur], .param_dtype = p->param_dtype,
                             .reduce_dtype = p->reduce_dtype, .fault_no_reduce = ""};
    if (s == DT_OK) s = dt_fully_shard(ctx, m, e, n, &fo);
    free(e);
    if (s == DT_ERR_UNSUPPORTED) *na = true;
  }
  if (s == DT_OK) s = dt_model_materialize(ctx, m);
  if (s != DT_OK) {
    dt_model_free(ctx, m);
    return s;
  }
  *out = m;
  return DT_OK;
}

/* One step, its parts' seconds into secs[P_COUNT]; on `last`, this rank's
 * persistent bytes into mem. */
static dt_status one_step(dt_ctx *ctx, dt_mesh *mesh, dt_model *m, const shared *sh,
                          const layout *ly, int step, bool last, double *secs, double *mem) {
  const bopts *o = sh->o;
  dt_tensor tok, tgt;
  memset(&tok, 0, sizeof tok);
  memset(&tgt, 0, sizeof tgt);
  /* the batch split over the 1-D mesh's only dim (bit 0) */
  dt_status s = sb_token_tensor(ctx, mesh, o->batch, o->seq, sh->cfg.vocab, 1u, step, 0, &tok);
  if (s == DT_OK) s = sb_token_tensor(ctx, mesh, o->batch, o->seq, sh->cfg.vocab, 1u, step, 1, &tgt);
  if (s == DT_OK) s = dt_comm_barrier(ctx->world); /* every rank starts the step together */
  const double t0 = dt_now();
  dt_var *logits = NULL, *loss = NULL;
  if (s == DT_OK) s = dt_model_forward(ctx, m, &tok, &logits);
  if (s == DT_OK) s = dt_model_loss(ctx, m, logits, &tgt, &loss);
  const double t1 = dt_now();
  if (s == DT_OK) s = dt_model_backward(ctx, m, loss);
  if (s == DT_OK && L_ZERO[sh->cur]) s = dt_fsdp_reduce_grads(ctx, m); /* ZeRO-1's all-reduce */
  if (s == DT_OK && !L_ZERO[sh->cur]) {
    /* DDP; under fully_shard the units reduce. The plan's bucket_cap_mb caps the
     * first bucket too, as DDP does when it is given
     * (torch/nn/parallel/distributed.py _BucketCapacityConfig.create). */
    const double cap = ly->plan.bucket_cap_mb;
    const dt_ddp_opts ddp = {cap * 1048576.0, 0};
    s = dt_data_parallel_reduce_grads(ctx, m, 1u, cap > 0 ? &ddp : NULL);
  }
  const double t2 = dt_now();
  if (s == DT_OK && last) measure_params_grads(m, mem); /* untimed */
  const dt_adamw opt = DT_ADAMW_DEFAULT;
  const double t3 = dt_now();
  if (s == DT_OK) s = dt_model_adamw_step(ctx, m, &opt);
  if (s == DT_OK) s = dt_fsdp_after_step(ctx, m); /* ZeRO-1's all-gather of the updated rows */
  if (s == DT_OK) s = dt_model_end_step(ctx, m);
  secs[P_OPT] = dt_now() - t3;
  secs[P_FWD] = t1 - t0;
  secs[P_BWD] = t2 - t1;
  secs[P_STEP] = secs[P_FWD] + secs[P_BWD] + secs[P_OPT];
  if (s == DT_OK && last) {
    mem[M_OPT] = measure_opt(m);
    mem[M_TOTAL] = mem[M_PARAM] + mem[M_GRAD] + mem[M_OPT];
  }
  dt_tensor_free(ctx, &tok);
  dt_tensor_free(ctx, &tgt);
  return s;
}

static dt_status bench_rank(dt_ctx *ctx, void *arg) {
  shared *sh = arg;
  const bopts *o = sh->o;
  layout *ly = &sh->L[sh->cur];
  const int total = o->warmup + o->steps;
  const char *names[1] = {L_ZERO[sh->cur] ? "dp_shard" : "dp_replicate"};
  dt_mesh *mesh = NULL;
  dt_model *m = NULL;
  double *times = calloc((size_t)total * P_COUNT, sizeof *times); /* [step][part] */
  double mem[M_COUNT] = {0}, mmax[M_COUNT], tmin, peak;
  bool na = false;
  dt_status s = times ? DT_OK : dt_error(ctx, DT_ERR_NOMEM, PROG, "no memory");
  dt_ledger_enable(ctx, false); /* no comm accounting in any layout */
  if (s == DT_OK) s = dt_mesh_create(ctx, ctx->world, 1, &o->world, names, &mesh);
  if (s == DT_OK) s = build_model(ctx, mesh, sh, ly, &m, &na);
  if (na) { /* every rank sees the same answer before any collective */
    if (ctx->rank == 0) {
      ly->na = true;
      snprintf(ly->na_why, sizeof ly->na_why, "%s", dt_last_error(ctx));
    }
    s = DT_OK;
    goto done;
  }
  for (int step = 0; step < total && s == DT_OK; step++)
    s = one_step(ctx, mesh, m, sh, ly, step, step == total - 1, &times[step * P_COUNT], mem);
  if (s == DT_OK)
    s = dt_comm_all_reduce(ctx->world, times, times, (size_t)total * P_COUNT, DT_F64, DT_RED_MAX);
  if (s == DT_OK) s = dt_comm_all_reduce(ctx->world, mem, mmax, M_COUNT, DT_F64, DT_RED_MAX);
  if (s == DT_OK) s = dt_comm_all_reduce(ctx->world, &mem[M_TOTAL], &tmin, 1, DT_F64, DT_RED_MIN);
  peak = (double)ctx->mem.host_peak;
  if (s == DT_OK) s = dt_comm_all_reduce(ctx->world, &peak, &peak, 1, DT_F64, DT_RED_MAX);
  if (s == DT_OK && ctx->rank == 0) {
    for (int k = 0; k < o->steps; k++)
      for (int p = 0; p < P_COUNT; p++)
        ly->times[p][(size_t)sh->rep * (size_t)o->steps + (size_t)k] =
            times[(o->warmup + k) * P_COUNT + p];
    if (ly->ran && (memcmp(mmax, ly->mem_max, sizeof mmax) || tmin != ly->total_min))
      ly->mem_changed = true;
    memcpy(ly->mem_max, mmax, sizeof mmax);
    ly->total_min = tmin;
    if (!ly->ran || peak > ly->peak) ly->peak = peak;
    ly->ran = true;
  }
done:
  dt_model_free(ctx, m);
  dt_mesh_free(mesh);
  free(times);
  return s;
}

/* ---- the derivation (no tensors: the module shapes and torch.chunk) ---- */

/* The derived persistent bytes of layout l, max over the W ranks. */
static double derived_bytes(const dt_model *m, int l, int W, double e) {
  double best = 0;
  for (int r = 0; r < W; r++) {
    double whole = 0, shard = 0; /* elements */
    for (int i = 0; i < m->n_mods; i++) {
      const dt_module *md = &m->mods[i];
      if (!md->wndim) continue;
      const int64_t rows = md->wshape[0], rest = md->wndim > 1 ? md->wshape[1] : 1;
      int64_t c, off;
      dt_chunk(rows, W, r, &c, &off);
      whole += (double)(rows * rest);
      shard += (double)(c * rest);
    }
    const double b = l == L_DP ? 4 * whole * e : l == L_ZERO1 ? (2 * whole + 2 * shard) * e
                                                              : 4 * shard * e;
    if (b > best) best = b;
  }
  return best;
}

/* ---- flags and plans ---- */

static void usage(FILE *f) {
  fprintf(f,
          "usage: bench/shardbench-fsdp [--world N] [--model M] [--dtype f32|f64] [--batch B]\n"
          "                             [--seq S] [--steps N] [--warmup N] [--reps N]\n"
          "                             [--plans-dir DIR] [--json]\n"
          "  Step time and persistent state per rank (parameters, gradients, AdamW) of the\n"
          "  layouts dp, zero1, zero2 and fsdp (plans DIR/NAME.plan) on the threads backend.\n"
          "  Defaults: world 8, debugmodel, f32, batch 8, seq 32, 5 timed steps after 2\n"
          "  warm-up steps per launch, 3 reps; plans from --plans-dir, $SHARDBENCH_PLANS,\n"
          "  $SHARDBENCH_DATADIR/plans, ./plans, then the installed ones.\n");
}

/* One line "PROG: WHERE: message" on stderr (bench/common/flags.h); returns 2. */
#define bad(...) sb_flag_bad(PROG, __VA_ARGS__)

/* "rank N: " that the library's messages may start with. */
static const char *strip_rank(const char *msg) {
  int r, k = 0;
  if (sscanf(msg, "rank %d: %n", &r, &k) >= 1 && k > 0) return msg + k;
  return msg;
}

/* Loads and checks the plan of layout l: dp's has the one dim dp_replicate and no
 * entries; the others the one dim dp_shard, fully_shard entries only, and the
 * layout's zero stage. Returns 0, or 2 after the one-line message. */
static int load_plan(dt_ctx *hc, const char *dir, const shared *sh, int l, dt_plan *p) {
  char path[SB_DATA_PATH + 16];
  snprintf(path, sizeof path, "%s/%s.plan", dir, L_NAME[l]);
  if (dt_plan_load(hc, path, p) != DT_OK) return bad("plan", "%s", strip_rank(dt_last_error(hc)));
  const char *want = L_ZERO[l] ? "dp_shard" : "dp_replicate";
  if (p->n_dims != 1 || strcmp(p->dim_names[0], want))
    return bad(path, "the %s layout needs dims = %s:-1 (one dim), the plan has %d dim(s)%s%s",
               L_NAME[l], want, p->n_dims, p->n_dims ? ", the first " : "",
               p->n_dims ? p->dim_names[0] : "");
  if (!L_ZERO[l] && p->n_entries)
    return bad(path, "line %d: the dp layout takes no style entries", p->entries[0].line);
  for (int i = 0; i < p->n_entries; i++)
    if (p->entries[i].style.kind != DT_STYLE_FULLY_SHARD)
      return bad(path, "line %d: the %s layout takes fully_shard entries only",
                 p->entries[i].line, L_NAME[l]);
  if (L_ZERO[l] && !p->n_entries) return bad(path, "no fully_shard entries");
  const int zero = L_ZERO[l] && !p->zero ? 3 : p->zero;
  if (L_ZERO[l] && zero != L_ZERO[l])
    return bad(path, "zero = %d; the %s layout needs %d", zero, L_NAME[l], L_ZERO[l]);
  if (dt_plan_resolve(hc, p, sh->o->world, &sh->cfg, sh->o->seq) != DT_OK)
    return bad("plan", "%s", strip_rank(dt_last_error(hc)));
  return 0;
}

static int parse_flags(int argc, char **argv, bopts *o) {
  enum { O_PLANS = 256, O_JSON };
  static const struct option lopts[] = {
      {"world", required_argument, 0, 'w'},  {"model", required_argument, 0, 'm'},
      {"dtype", required_argument, 0, 'd'},  {"batch", required_argument, 0, 'b'},
      {"seq", required_argument, 0, 's'},    {"steps", required_argument, 0, 'n'},
      {"warmup", required_argument, 0, 'W'}, {"reps", required_argument, 0, 'r'},
      {"plans-dir", required_argument, 0, O_PLANS}, {"json", no_argument, 0, O_JSON},
      {"help", no_argument, 0, 'h'},         {0, 0, 0, 0}};
  opterr = 0;
  int ch;
  long v;
  while ((ch = getopt_long(argc, argv, ":h", lopts, NULL)) != -1) {
    switch (ch) {
      case 'w':
        if (sb_flag_long(optarg, 2, DT_THREADS_MAX_WORLD, &v))
          return bad("--world", "expected 2..%d (one rank shards nothing), got '%s'",
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
        if (sb_flag_long(optarg, 1, 1 << 20, &v))
          return bad("--batch", "expected 1..1048576, got '%s'", optarg);
        o->batch = (int)v;
        break;
      case 's':
        if (sb_flag_long(optarg, 1, 1 << 20, &v))
          return bad("--seq", "expected 1..1048576, got '%s'", optarg);
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
        if (sb_flag_long(optarg, 1, MAX_REPS, &v))
          return bad("--reps", "expected 1..%d, got '%s'", MAX_REPS, optarg);
        o->reps = (int)v;
        break;
      case O_PLANS:
        if (!*optarg) return bad("--plans-dir", "empty");
        o->plans_flag = optarg;
        break;
      case O_JSON: o->json = true; break;
      case 'h': usage(stdout); return -1;
      default: return sb_flag_getopt_bad(PROG, ch, argv); /* ':' missing value, '?' unknown */
    }
  }
  if (optind < argc) return bad(argv[optind], "unexpected argument");
  if (o->batch % o->world)
    return bad("--batch", "%d is not divisible by --world %d (the batch is split over the ranks)",
               o->batch, o->world);
  return 0;
}

/* ---- the report ---- */

typedef struct summary {
  double t[L_COUNT][P_COUNT];   /* median seconds of the step and of its parts */
  double rep_lo[L_COUNT], rep_hi[L_COUNT]; /* per-rep median step time / dp's: min, max */
  double mem_ratio, time_ratio; /* fsdp / dp: persistent total, step time */
  bool mem_ok, time_ok;         /* the goals */
} summary;

static void summarize(const shared *sh, summary *S) {
  const bopts *o = sh->o;
  const int n = o->reps * o->steps;
  double *v = malloc(sizeof *v * (size_t)n);
  double dp_rep[MAX_REPS];
  for (int l = 0; l < L_COUNT; l++) {
    const layout *ly = &sh->L[l];
    S->rep_lo[l] = S->rep_hi[l] = NAN;
    for (int p = 0; p < P_COUNT; p++) S->t[l][p] = NAN;
    if (!ly->ran || !v) continue;
    for (int p = 0; p < P_COUNT; p++) {
      memcpy(v, ly->times[p], sizeof *v * (size_t)n);
      S->t[l][p] = sb_median(v, n);
    }
    for (int r = 0; r < o->reps; r++) {
      memcpy(v, ly->times[P_STEP] + (size_t)r * o->steps, sizeof *v * (size_t)o->steps);
      const double med = sb_median(v, o->steps);
      if (l == L_DP) dp_rep[r] = med;
      const double ratio = med / dp_rep[r];
      if (r == 0 || ratio < S->rep_lo[l]) S->rep_lo[l] = ratio;
      if (r == 0 || ratio > S->rep_hi[l]) S->rep_hi[l] = ratio;
    }
  }
  free(v);
  const double goal = 1.0 / o->world;
  S->mem_ratio = sh->L[L_FSDP].mem_max[M_TOTAL] / sh->L[L_DP].mem_max[M_TOTAL];
  S->mem_ok = fabs(S->mem_ratio / goal - 1) <= MEM_GOAL_TOL;
  S->time_ratio = S->t[L_FSDP][P_STEP] / S->t[L_DP][P_STEP];
  S->time_ok = S->time_ratio <= TIME_GOAL;
}

static void print_table(const shared *sh, const summary *S, double wall) {
  const bopts *o = sh->o;
  const layout *dp = &sh->L[L_DP];
  const double *tdp = S->t[L_DP];
  printf("# shardbench fsdp: threads, world %d, %s %s, batch %d seq %d; plans from %s\n", o->world,
         o->model, o->dtype_name, o->batch, o->seq, sh->plans_dir);
  printf("# step = forward + loss + backward + reduce + AdamW (max over ranks), median of %d "
         "steps x %d reps after %d warm-up steps per launch\n", o->steps, o->reps, o->warmup);
  printf("# persistent bytes per rank (max over ranks): params, grads (reduced, before AdamW), "
         "optimizer (AdamW m, v), total; derived: the same from the shapes (torch.chunk)\n");
  printf("%-7s %9s %6s %11s %11s %11s %11s %11s %7s %11s %10s\n", "#layout", "step(ms)", "x dp",
         "params", "grads", "optimizer", "total", "total min", "x dp", "derived", "peak(MiB)");
  for (int l = 0; l < L_COUNT; l++) {
    const layout *ly = &sh->L[l];
    if (ly->na) {
      printf("%-7s n/a (not implemented: %s)\n", L_NAME[l], strip_rank(ly->na_why));
      continue;
    }
    printf("%-7s %9.2f %6.3f %11.0f %11.0f %11.0f %11.0f %11.0f %7.4f %11.0f %10.2f%s\n",
           L_NAME[l], S->t[l][P_STEP] * 1e3, S->t[l][P_STEP] / tdp[P_STEP], ly->mem_max[M_PARAM],
           ly->mem_max[M_GRAD], ly->mem_max[M_OPT], ly->mem_max[M_TOTAL], ly->total_min,
           ly->mem_max[M_TOTAL] / dp->mem_max[M_TOTAL], ly->derived, ly->peak / 1048576.0,
           ly->mem_max[M_TOTAL] == ly->derived ? "" : "  (total != derived)");
  }
  printf("# parts of the step in ms (each the median of its max over ranks): forward + loss, "
         "backward + reduce, AdamW; and the step's ratio to dp's per rep (min .. max)\n");
  for (int l = 0; l < L_COUNT; l++)
    if (sh->L[l].ran)
      printf("# %-7s fwd %9.2f  bwd %9.2f  opt %9.2f   x dp per rep %.3f .. %.3f\n", L_NAME[l],
             S->t[l][P_FWD] * 1e3, S->t[l][P_BWD] * 1e3, S->t[l][P_OPT] * 1e3, S->rep_lo[l],
             S->rep_hi[l]);
  for (int l = 0; l < L_COUNT; l++)
    if (sh->L[l].mem_changed)
      printf("# %s: the persistent bytes differed between reps (the last rep's are shown)\n",
             L_NAME[l]);
  printf("fsdp persistent / dp = %.5f (goal 1/%d = %.5f within %.0f%%): %s\n", S->mem_ratio,
         o->world, 1.0 / o->world, 100 * MEM_GOAL_TOL, S->mem_ok ? "PASS" : "MISS");
  printf("fsdp step time / dp = %.3f (goal <= %.1f): %s\n", S->time_ratio, TIME_GOAL,
         S->time_ok ? "PASS" : "MISS");
  printf("# %d launches in %.1f s\n", o->reps * L_COUNT, wall);
}

static void print_json(const shared *sh, const summary *S, double wall) {
  const bopts *o = sh->o;
  const layout *dp = &sh->L[L_DP];
  const double *tdp = S->t[L_DP];
  printf("{\"world\": %d, \"model\": \"%s\", \"dtype\": \"%s\", \"batch\": %d, \"seq\": %d, "
         "\"steps\": %d, \"warmup\": %d, \"reps\": %d, \"wall_s\": %.3f, \"layouts\": [",
         o->world, o->model, o->dtype_name, o->batch, o->seq, o->steps, o->warmup, o->reps, wall);
  for (int l = 0; l < L_COUNT; l++) {
    const layout *ly = &sh->L[l];
    printf("%s{\"layout\": \"%s\", ", l ? ", " : "", L_NAME[l]);
    if (ly->na) {
      printf("\"status\": \"not implemented\"}");
      continue;
    }
    const double *t = S->t[l];
    printf("\"status\": \"ok\", \"step_time_s\": %.9g, \"step_ratio\": %.6g, "
           "\"step_ratio_rep_min\": %.6g, \"step_ratio_rep_max\": %.6g, \"forward_s\": %.9g, "
           "\"backward_s\": %.9g, \"optimizer_s\": %.9g, ",
           t[P_STEP], t[P_STEP] / tdp[P_STEP], S->rep_lo[l], S->rep_hi[l], t[P_FWD], t[P_BWD],
           t[P_OPT]);
    printf("\"params_bytes\": %.0f, \"grads_bytes\": %.0f, \"optimizer_bytes\": %.0f, "
           "\"total_bytes\": %.0f, \"total_min_bytes\": %.0f, \"total_ratio\": %.6g, "
           "\"derived_bytes\": %.0f, \"peak_bytes\": %.0f}",
           ly->mem_max[M_PARAM], ly->mem_max[M_GRAD], ly->mem_max[M_OPT], ly->mem_max[M_TOTAL],
           ly->total_min, ly->mem_max[M_TOTAL] / dp->mem_max[M_TOTAL], ly->derived, ly->peak);
  }
  printf("], \"fsdp_mem_ratio\": %.6g, \"fsdp_mem_goal_met\": %s, \"fsdp_time_ratio\": %.6g, "
         "\"fsdp_time_goal_met\": %s}\n",
         S->mem_ratio, S->mem_ok ? "true" : "false", S->time_ratio, S->time_ok ? "true" : "false");
}

int main(int argc, char **argv) {
  bopts o = {.world = 8, .model = "debugmodel", .dtype_name = "f32", .dtype = DT_F32,
             .batch = 8, .seq = 32, .steps = 5, .warmup = 2, .reps = 3};
  int rc = parse_flags(argc, argv, &o);
  if (rc) return rc < 0 ? 0 : rc;

  shared *sh = calloc(1, sizeof *sh);
  if (!sh) {
    fprintf(stderr, "%s: out of memory\n", PROG);
    return 1;
  }
  sh->o = &o;
  dt_ctx hc; /* a host context: only for library error messages */
  dt_ctx_init(&hc, 0, 1);
  dt_model *desc = NULL;
  rc = 0;
  if (dt_llama_config_get(&hc, o.model, &sh->cfg) != DT_OK)
    rc = bad("--model", "%s", strip_rank(dt_last_error(&hc)));
  char *dir = sh->plans_dir;
  if (!rc && !sb_data_dir(SB_DATA_PLANS, o.plans_flag, dir, sizeof sh->plans_dir))
    rc = bad("--plans-dir", "no plans found (tried $SHARDBENCH_PLANS, $SHARDBENCH_DATADIR/plans, "
             "./plans and %s)", dir);
  for (int l = 0; !rc && l < L_COUNT; l++) rc = load_plan(&hc, dir, sh, l, &sh->L[l].plan);
  /* the described model (no mesh, no weights): its shapes for the derivation */
  if (!rc && dt_model_create(&hc, NULL, &sh->cfg, o.dtype, SEED, &desc) != DT_OK) {
    fprintf(stderr, "%s: %s\n", PROG, strip_rank(dt_last_error(&hc)));
    rc = 1;
  }
  for (int l = 0; !rc && l < L_COUNT; l++) {
    sh->L[l].derived = derived_bytes(desc, l, o.world, (double)dt_dtype_size(o.dtype));
    for (int p = 0; !rc && p < P_COUNT; p++)
      if (!(sh->L[l].times[p] = calloc((size_t)o.reps * (size_t)o.steps, sizeof(double)))) {
        fprintf(stderr, "%s: out of memory\n", PROG);
        rc = 1;
      }
  }
  if (desc) dt_model_free(&hc, desc);
  dt_ctx_release(&hc);

  dt_device_cpu_blas_threads(1); /* ranks are the parallelism: one BLAS thread each */
  const double t_start = dt_now();
  for (int rep = 0; !rc && rep < o.reps; rep++) {
    for (int k = 0; !rc && k < L_COUNT; k++) {
      const int l = rep % 2 ? L_COUNT - 1 - k : k;
      if (sh->L[l].na) continue;
      sh->cur = l;
      sh->rep = rep;
      dt_launch_opts lo = {.backend = DT_BACKEND_THREADS, .world = o.world,
                           .timeout_s = LAUNCH_TIMEOUT_S, .device = DT_DEV_CPU};
      dt_launch_report rp;
      memset(&rp, 0, sizeof rp);
      dt_status s = dt_launch(&lo, bench_rank, sh, &rp);
      if (s != DT_OK) {
        fprintf(stderr, "%s: layout %s, rep %d: rank %d failed: %s (%s)\n", PROG, L_NAME[l], rep,
                rp.failed_rank, strip_rank(rp.failed_msg), dt_status_str(s));
        rc = 1;
      }
      dt_launch_report_free(&rp);
    }
  }
  const double wall = dt_now() - t_start;
  if (!rc && (sh->L[L_DP].na || sh->L[L_FSDP].na)) {
    fprintf(stderr, "%s: the %s layout is not implemented: %s\n", PROG,
            sh->L[L_DP].na ? "dp" : "fsdp",
            strip_rank(sh->L[sh->L[L_DP].na ? L_DP : L_FSDP].na_why));
    rc = 1;
  }
  if (!rc) {
    summary S;
    summarize(sh, &S);
    if (o.json) print_json(sh, &S, wall);
    else print_table(sh, &S, wall);
  }
  for (int l = 0; l < L_COUNT; l++)
    for (int p = 0; p < P_COUNT; p++) free(sh->L[l].times[p]);
  free(sh);
  return rc;
}
