/* bench/harness/plan.c: `shardbench plan`, capacity planning from shape-only runs.
 *
 *   shardbench plan --model 70B --gpus 256 --hardware h100-sxm-80gb --seq 8192
 *                   --global-batch 512 [--plans a,b] [--mesh M]... [--ac LIST]
 *                   [--dtype bf16|fp8] [--features compile,async_tp] [--tokens 15e12]
 *                   [--local-batch LIST] [--top N] [--json] [--db F] [--verify K]
 *                   [--plans-dir D]
 *
 * For every GPU count it enumerates the layouts that divide the job: each plan
 * with a size for each of its own dims (a plan applies a dim only when it is over
 * 1, as TorchTitan does) that multiply to the GPUs, tp within a node and dividing
 * the heads, cp dividing the sequence's load-balanced chunks, the data-parallel
 * degree dividing the global batch; x AC modes (a plan that states
 * activation_checkpoint_mode is searched at that AC alone unless --ac is given) x
 * local batches. Each layout runs once shape-only (`run --device meta`: one rank
 * per role, exact ledgers and memory) and goes through the time model (bench/harness/timemodel.h) on the
 * hardware file. The largest local batch that fits comes from the line through the
 * two smallest local batches' memory (memory is affine in it); that layout's time and
 * memory are interpolated from the same two runs, and after the search the top rows
 * of each GPU count run at their own local batch (--exact: every layout does). An AC
 * mode heavier than one that already fits at the largest local batch is dominated
 * (the same work plus recompute) and is not run.
 * Layouts that do not fit are listed with how far over they are. The rest are
 * ranked by predicted tokens/s per GPU.
 *
 * --verify K runs the top K for real on this machine: the threads backend, the
 * debugmodel, the same plan and mesh dims, each dim capped so the world fits
 * (a dim halves until the product is at most 8 and the debugmodel accepts it),
 * checked against the unsharded reference.
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "hardware.h"
#include "store.h"
#include "timemodel.h"

enum { PL_MAX_GPUS = 16, PL_MAX_PLANS = 32, PL_MAX_MESH = 64, PL_MAX_AC = 8, PL_MAX_LB = 16 };
/* --verify's world on this machine */
enum { PL_VERIFY_WORLD = 8 };

const char sb_plan_usage[] =
    "usage: shardbench plan --model M --gpus N[,N..] --hardware H --global-batch B\n"
    "                       [--seq 8192] [--plans a,b] [--mesh pp:1,dp_shard:32,tp:8]...\n"
    "                       [--ac none,selective:op,full] [--dtype bf16|fp8|f32]\n"
    "                       [--features compile,async_tp] [--tokens 15e12]\n"
    "                       [--local-batch 1,2,4] [--top 20] [--json] [--db FILE]\n"
    "                       [--verify K] [--plans-dir DIR] [--max-cp 16] [--max-pp 16]\n"
    "                       [--max-local-batch 32] [--jobs N] [--exact]\n"
    "  Every layout of the job (a plan x sizes of its dims x AC x local batch), run\n"
    "  shape-only (meta device, fake comm) and timed by the model on the hardware\n"
    "  file (results/hardware/H): fits or not (by how much), memory split, time\n"
    "  split, tokens/s/GPU, MFU, and with --tokens the days and GPU-hours; ranked.\n"
    "  --gpus       GPU counts (one table each; several draw the capacity charts)\n"
    "  --hardware   a results/hardware/ name or a path\n"
    "  --global-batch  sequences per optimizer step (accumulation fills it)\n"
    "  --plans      plan names, found in the plans dir's capacity/, published/, then in\n"
    "               it, or paths (default: TorchTitan's production layouts,\n"
    "               plans/capacity/tt-*.plan)\n"
    "  --mesh       only these meshes (repeatable; TorchTitan's dim names)\n"
    "  --ac         AC modes to try (default: a plan's activation_checkpoint_mode where it\n"
    "               states one, else none,selective:op,full; --ac overrides the plans')\n"
    "  --dtype      bf16, fp8 (TorchTitan's Float8 linears; the run is bf16), or f32\n"
    "  --features   compile (fused pointwise kernels), async_tp (overlapped TP)\n"
    "  --local-batch  local batches to try (default: every divisor, bisected)\n"
    "  --top        rows printed (default 20; --json prints all)\n"
    "  --db         store the predictions (tables plan_runs, predictions, hardware)\n"
    "  --verify K   run the top K for real (threads, debugmodel, dims capped to 8 ranks)\n"
    "  --jobs N     worker processes for the shape-only runs (default: the online CPUs)\n"
    "  --exact      run every layout at its chosen local batch (default: the top rows run,\n"
    "               the rest interpolated from their two smallest local batches' runs)\n"
    "  --max-cp, --max-pp, --max-local-batch  the search's bounds (a ring of more than 16,\n"
    "               a pipeline of more than 16 stages, more than 32 sequences per rank)\n"
    "Exit: 0 done, 1 a shape-only run failed or a verified layout mismatched, 2 bad input.\n";

/* src into dst (n bytes), cut to fit. */
static void copy_str(char *dst, size_t n, const char *src) {
  const size_t l = strnlen(src, n - 1);
  memcpy(dst, src, l);
  dst[l] = '\0';
}

static const char DEFAULT_PLANS[] =
    "tt-fsdp,tt-hsdp,tt-fsdp-tp,tt-fsdp-cp,tt-fsdp-tp-cp,tt-pp-fsdp-tp,tt-pp-fsdp-tp-i,"
    "tt-pp-fsdp-tp-cp";

typedef struct pl_args {
  char model[96];
  int gpus[PL_MAX_GPUS], n_gpus;
  const char *hardware;
  int seq, global_batch;
  char plans_s[1024];
  int meshes[PL_MAX_MESH][SB_NDIMS], n_mesh;
  dt_ac_config acs[PL_MAX_AC];
  int n_ac;
  bool ac_given;                 /* --ac given: it overrides the plans' own AC */
  bool fp8;
  bool f32;                      /* --dtype f32: the shape-only run in f32 (a CPU's hardware file) */
  sb_tm_features feat;
  double tokens;
  int lbs[PL_MAX_LB], n_lb;
  int top;
  int max_cp, max_pp, max_lb;
  int jobs;                      /* worker processes (--jobs; default: online CPUs) */
  bool exact;                    /* --exact: run every layout's local batch, estimate none */
  bool json;
  const char *db;
  int verify;
  const char *plans_dir;
} pl_args;

/* One layout and its prediction. */
typedef struct pl_row {
  int gpus;
  char plan[64];
  char plan_path[1024];
  int dims[SB_NDIMS];
  dt_ac_config ac;
  int local_batch, accum, microbatches;
  int mb_count;                  /* the plan's pipeline_parallel_microbatches (0: not given;
                                  * -1: the pp degree) */
  char schedule[32];
  sb_prediction p;
  int rank;                      /* 1 = fastest that fits; 0: does not fit */
  char verdict[16], vreason[256];
  bool estimated;                /* interpolated from two smaller local batches' runs, not
                                  * run itself (the top rows are then run: refine) */
  int pi;                        /* its plan's index in the plan list */
  int task;                      /* the search's order (task x AC): ties rank by it */
  sb_prediction micro;           /* the same run predicted as one microstep (no accumulation) */
} pl_row;

typedef struct pl_rows {
  pl_row *v;
  size_t n, cap;
  int shape_runs;                /* shape-only runs made */
  int dominated;                 /* (layout, AC) pairs skipped as dominated */
  int failed;                    /* shape-only runs that failed */
  char first_failure[512];
} pl_rows;

static pl_row *rows_add(pl_rows *R) {
  if (R->n == R->cap) {
    size_t cap = R->cap ? 2 * R->cap : 64;
    pl_row *g = realloc(R->v, cap * sizeof *g);
    if (!g) return NULL;
    R->v = g;
    R->cap = cap;
  }
  pl_row *r = &R->v[R->n++];
  memset(r, 0, sizeof *r);
  return r;
}

static int parse_int_list(const char *cmd, const char *flag, const char *s, int lo, int hi,
                          int *out, int max, int *n) {
  char buf[1024];
  if (strlen(s) >= sizeof buf) return sb_usage_error(cmd, flag, "list too long");
  snprintf(buf, sizeof buf, "%s", s);
  *n = 0;
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    long v;
    char err[SB_ERR_LEN];
    if (sb_parse_long(t, lo, hi, &v, err, sizeof err) != DT_OK)
      return sb_usage_error(cmd, flag, "'%s': %s", t, err);
    if (*n == max) return sb_usage_error(cmd, flag, "at most %d values", max);
    out[(*n)++] = (int)v;
  }
  if (!*n) return sb_usage_error(cmd, flag, "empty list");
  return 0;
}

/* The recompute an AC mode adds, as an order: none < selective:N (larger N
 * recomputes less) < selective:op < full. */
static double ac_weight(const dt_ac_config *ac) {
  switch (ac->mode) {
    case DT_AC_NONE: return 0;
    case DT_AC_FULL: return 3;
    default: return ac->every > 0 ? 1 + 1.0 / (ac->every + 1) : 2; /* every 0: op */
  }
}
static int ac_cmp(const void *x, const void *y) {
  const double a = ac_weight(x), b = ac_weight(y);
  return (a > b) - (a < b);
}

static int pl_parse(int argc, char **argv, pl_args *a) {
  static const char CMD[] = "plan";
  static const struct option lopts[] = {
      {"model", required_argument, NULL, 'm'},   {"gpus", required_argument, NULL, 'g'},
      {"hardware", required_argument, NULL, 'H'}, {"seq", required_argument, NULL, 's'},
      {"global-batch", required_argument, NULL, 'B'}, {"plans", required_argument, NULL, 'p'},
      {"mesh", required_argument, NULL, 'M'},    {"ac", required_argument, NULL, 'a'},
      {"dtype", required_argument, NULL, 'd'},   {"features", required_argument, NULL, 'f'},
      {"tokens", required_argument, NULL, 't'},  {"local-batch", required_argument, NULL, 'l'},
      {"top", required_argument, NULL, 'T'},     {"json", no_argument, NULL, 'j'},
      {"db", required_argument, NULL, 'D'},      {"verify", required_argument, NULL, 'V'},
      {"plans-dir", required_argument, NULL, 'P'}, {"help", no_argument, NULL, 'h'},
      {"max-cp", required_argument, NULL, 'c'},  {"max-pp", required_argument, NULL, 'q'},
      {"max-local-batch", required_argument, NULL, 'L'}, {"jobs", required_argument, NULL, 'J'},
      {"exact", no_argument, NULL, 'E'},
      {NULL, 0, NULL, 0}};
  memset(a, 0, sizeof *a);
  snprintf(a->model, sizeof a->model, "70B");
  a->seq = 8192;
  a->top = 20;
  a->max_cp = 16;
  a->max_pp = 16;
  a->max_lb = 32;
  {
    const long c = sysconf(_SC_NPROCESSORS_ONLN);
    a->jobs = c < 1 ? 1 : c > 64 ? 64 : (int)c;
  }
  a->tokens = NAN;
  snprintf(a->plans_s, sizeof a->plans_s, "%s", DEFAULT_PLANS);
  static const char *const multi[] = {"mesh", NULL};
  int rc = sb_getopt_repeats(CMD, argc, argv, ":", lopts, multi);
  if (rc) return rc;
  const char *ac_s = "none,selective:op,full";
  int ch;
  long v;
  char err[SB_ERR_LEN];
  while ((ch = getopt_long(argc, argv, ":", lopts, NULL)) != -1) {
    switch (ch) {
      case 'm':
        if (strlen(optarg) >= sizeof a->model) return sb_usage_error(CMD, "--model", "too long");
        snprintf(a->model, sizeof a->model, "%s", optarg);
        break;
      case 'g':
        if ((rc = parse_int_list(CMD, "--gpus", optarg, 1, SB_MAX_WORLD_META, a->gpus, PL_MAX_GPUS,
                                 &a->n_gpus)))
          return rc;
        break;
      case 'H': a->hardware = optarg; break;
      case 's':
        if (sb_parse_long(optarg, 1, 1 << 24, &v, err, sizeof err) != DT_OK)
          return sb_usage_error(CMD, "--seq", "%s", err);
        a->seq = (int)v;
        break;
      case 'B':
        if (sb_parse_long(optarg, 1, 1 << 24, &v, err, sizeof err) != DT_OK)
          return sb_usage_error(CMD, "--global-batch", "%s", err);
        a->global_batch = (int)v;
        break;
      case 'p':
        if (strlen(optarg) >= sizeof a->plans_s) return sb_usage_error(CMD, "--plans", "too long");
        snprintf(a->plans_s, sizeof a->plans_s, "%s", optarg);
        break;
      case 'M':
        if (a->n_mesh == PL_MAX_MESH) return sb_usage_error(CMD, "--mesh", "at most %d", PL_MAX_MESH);
        if (sb_parse_mesh_named(optarg, a->meshes[a->n_mesh], err, sizeof err))
          return sb_usage_error(CMD, "--mesh", "'%s': %s", optarg, err);
        a->n_mesh++;
        break;
      case 'a': ac_s = optarg, a->ac_given = true; break;
      case 'd':
        if (!strcmp(optarg, "fp8")) a->fp8 = true;
        else if (!strcmp(optarg, "f32")) a->f32 = true;
        else if (strcmp(optarg, "bf16"))
          return sb_usage_error(CMD, "--dtype", "expected bf16, fp8 or f32, got '%s'", optarg);
        break;
      case 'f': {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", optarg);
        for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
          if (!strcmp(t, "compile")) a->feat.compile = true;
          else if (!strcmp(t, "async_tp")) a->feat.async_tp = true;
          else if (!strcmp(t, "float8")) a->fp8 = true;
          else return sb_usage_error(CMD, "--features", "expected compile, async_tp or float8, "
                                     "got '%s'", t);
        }
        break;
      }
      case 't': {
        char *end;
        errno = 0;
        double t = strtod(optarg, &end);
        if (errno || *end || !(t > 0) || !isfinite(t))
          return sb_usage_error(CMD, "--tokens", "expected a positive number, got '%s'", optarg);
        a->tokens = t;
        break;
      }
      case 'l':
        if ((rc = parse_int_list(CMD, "--local-batch", optarg, 1, 1 << 20, a->lbs, PL_MAX_LB,
                                 &a->n_lb)))
          return rc;
        break;
      case 'T':
        if (sb_parse_long(optarg, 1, 1 << 20, &v, err, sizeof err) != DT_OK)
          return sb_usage_error(CMD, "--top", "%s", err);
        a->top = (int)v;
        break;
      case 'j': a->json = true; break;
      case 'D': a->db = optarg; break;
      case 'V':
        if (sb_parse_long(optarg, 0, 100, &v, err, sizeof err) != DT_OK)
          return sb_usage_error(CMD, "--verify", "%s", err);
        a->verify = (int)v;
        break;
      case 'P': a->plans_dir = optarg; break;
      case 'E': a->exact = true; break;
      case 'J':
        if (sb_parse_long(optarg, 1, 64, &v, err, sizeof err) != DT_OK)
          return sb_usage_error(CMD, "--jobs", "%s", err);
        a->jobs = (int)v;
        break;
      case 'c': case 'q': case 'L': {
        const char *fl = ch == 'c' ? "--max-cp" : ch == 'q' ? "--max-pp" : "--max-local-batch";
        if (sb_parse_long(optarg, 1, 1 << 20, &v, err, sizeof err) != DT_OK)
          return sb_usage_error(CMD, fl, "%s", err);
        *(ch == 'c' ? &a->max_cp : ch == 'q' ? &a->max_pp : &a->max_lb) = (int)v;
        break;
      }
      case 'h': fputs(sb_plan_usage, stdout); return -1;
      default: return sb_getopt_error(CMD, ch, argv, lopts);
    }
  }
  if (optind < argc) return sb_usage_error(CMD, NULL, "unexpected argument '%s'", argv[optind]);
  if (!a->n_gpus) return sb_usage_error(CMD, "--gpus", "required (the GPU counts to plan for)");
  if (!a->hardware) return sb_usage_error(CMD, "--hardware", "required (a results/hardware/ name)");
  if (!a->global_batch)
    return sb_usage_error(CMD, "--global-batch", "required (sequences per optimizer step)");
  if ((rc = sb_check_model(CMD, "--model", a->model))) return rc;
  char buf[256];
  if (strlen(ac_s) >= sizeof buf) return sb_usage_error(CMD, "--ac", "too long");
  snprintf(buf, sizeof buf, "%s", ac_s);
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    if (a->n_ac == PL_MAX_AC) return sb_usage_error(CMD, "--ac", "at most %d modes", PL_MAX_AC);
    if ((rc = sb_parse_ac(CMD, "--ac", t, &a->acs[a->n_ac]))) return rc;
    a->n_ac++;
  }
  a->feat.float8 = a->fp8;
  qsort(a->acs, (size_t)a->n_ac, sizeof a->acs[0], ac_cmp); /* lightest first: dominance */
  return 0;
}

typedef struct pl_plan {
  char name[64], path[1024];
  dt_plan plan;
  bool uses[SB_NDIMS];
  int fixed[SB_NDIMS];           /* > 0: the plan fixes the dim's size */
  int mb_size;                   /* pipeline_parallel_microbatch_size */
  int mb_count;                  /* pipeline_parallel_microbatches (0, -1: the pp degree, N) */
  dt_ac_config acs[PL_MAX_AC];   /* the AC modes searched, lightest first: the plan's own when
                                  * it states activation_checkpoint_mode and --ac is not
                                  * given (a plan that states its AC means it), else --ac's */
  int n_ac;
} pl_plan;

static int dim_index(const char *name) {
  for (int d = 0; d < SB_NDIMS; d++)
    if (!strcmp(name, sb_dim_names[d])) return d;
  return -1;
}

static int load_plans(const pl_args *a, pl_plan *P, int *n) {
  static const char CMD[] = "plan";
  char dir[768], err[SB_ERR_LEN], buf[1024];
  sb_plans_dir(a->plans_dir, dir, sizeof dir);
  snprintf(buf, sizeof buf, "%s", a->plans_s);
  *n = 0;
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    if (*n == PL_MAX_PLANS) return sb_usage_error(CMD, "--plans", "at most %d", PL_MAX_PLANS);
    pl_plan *p = &P[*n];
    memset(p, 0, sizeof *p);
    /* a name: the plans dir's capacity/, then published/ (the published runs' plans,
     * results/published-layouts.csv), then the dir itself; a path as given */
    static const char *const sub[] = {"/capacity", "/published", ""};
    for (size_t k = 0; k < sizeof sub / sizeof sub[0]; k++) {
      char cdir[800];
      snprintf(cdir, sizeof cdir, "%.760s%s", dir, sub[k]);
      if (sb_plan_locate(cdir, t, p->path, sizeof p->path, p->name, sizeof p->name, err, sizeof err))
        return sb_usage_error(CMD, "--plans", "%s", err);
      if (access(p->path, R_OK) == 0) break;
    }
    const char *models[1] = {a->model};
    int rc = sb_plan_validate(CMD, "--plans", p->path, models, 1);
    if (rc) return rc;
    dt_ctx hc;
    dt_ctx_init(&hc, 0, 1);
    dt_status s = dt_plan_load(&hc, p->path, &p->plan);
    if (s != DT_OK) {
      rc = sb_usage_error(CMD, "--plans", "%s", sb_plan_msg(dt_last_error(&hc)));
      dt_ctx_release(&hc);
      return rc;
    }
    dt_ctx_release(&hc);
    for (int i = 0; i < p->plan.n_dims; i++) {
      const int d = dim_index(p->plan.dim_names[i]);
      if (d < 0) continue;
      p->uses[d] = true;
      p->fixed[d] = p->plan.dim_sizes[i] > 0 ? p->plan.dim_sizes[i] : 0;
    }
    p->mb_size = p->plan.pp_microbatch_size > 0 ? p->plan.pp_microbatch_size : 1;
    p->mb_count = p->plan.pp_microbatches;
    if (p->plan.ac_given && !a->ac_given) {
      p->acs[0] = p->plan.ac;
      p->n_ac = 1;
    } else {
      memcpy(p->acs, a->acs, sizeof p->acs);
      p->n_ac = a->n_ac;
    }
    (*n)++;
  }
  return 0;
}

/* Fills the shape-only opts of a layout. */
static void layout_opts(const pl_args *a, const pl_plan *pp, const int dims[SB_NDIMS],
                        const dt_ac_config *ac, int lb, sb_opts *o) {
  memset(o, 0, sizeof *o);
  snprintf(o->model, sizeof o->model, "%s", a->model);
  snprintf(o->workload, sizeof o->workload, "model");
  copy_str(o->plan, sizeof o->plan, pp->name);
  snprintf(o->plan_path, sizeof o->plan_path, "%s", pp->path);
  int world = 1;
  for (int d = 0; d < SB_NDIMS; d++) o->dims[d] = dims[d], world *= dims[d];
  snprintf(o->dtype, sizeof o->dtype, "%s", a->f32 ? "f32" : "bf16");
  o->batch = lb * dims[1] * dims[2];
  o->seq = a->seq;
  /* one warm-up step: the timed one is a steady-state step (AdamW's state made, the
   * allocator's segments those a first step leaves), as TorchTitan's logs are */
  o->warmup = 1;
  o->steps = 1;
  snprintf(o->backend, sizeof o->backend, "threads");
  snprintf(o->comm, sizeof o->comm, "host");
  snprintf(o->device, sizeof o->device, "meta");
  o->world = world;
  o->ac = *ac;
  o->max_norm = pp->plan.max_norm;
}

/* One shape-only run and its prediction into row. 1: the plan does not apply to
 * this layout (skipped, reason in why); 0: predicted; -1: the run failed. */
static int predict_layout(const pl_args *a, const sb_hw *hw, const pl_plan *pp,
                          const int dims[SB_NDIMS], const dt_ac_config *ac, int lb, pl_row *row,
                          pl_rows *R, char *why, size_t whyn) {
  sb_opts o;
  layout_opts(a, pp, dims, ac, lb, &o);
  sb_result r;
  sb_execute(&o, NULL, SB_STAGE_RUN, &r);
  R->shape_runs++;
  int rc = 0;
  if (!strcmp(r.status, "skipped")) {
    snprintf(why, whyn, "%s", r.reason);
    rc = 1;
  } else if (strcmp(r.status, "shape-only")) {
    snprintf(why, whyn, "%s", r.reason);
    rc = -1;
  } else {
    const int dp = dims[1] * dims[2];
    sb_tm_features f = a->feat;
    f.accum_steps = a->global_batch / (lb * dp);
    char err[SB_ERR_LEN];
    sb_tm_features f1 = f;
    f1.accum_steps = 1;
    if (sb_predict(hw, &o, &r, &f, &row->p, err, sizeof err) ||
        sb_predict(hw, &o, &r, &f1, &row->micro, err, sizeof err)) {
      snprintf(why, whyn, "time model: %s", err);
      rc = -1;
    }
    row->microbatches = r.shape.pp > 1 ? r.shape.pp_m : 1;
    snprintf(row->schedule, sizeof row->schedule, "%s",
             r.shape.pp > 1 ? dt_pp_schedule_kind_str((dt_pp_schedule_kind)r.shape.pp_kind) : "");
    row->accum = f.accum_steps;
  }
  row->local_batch = lb;
  row->mb_count = pp->mb_count;
  row->ac = *ac;
  memcpy(row->dims, dims, sizeof row->dims);
  copy_str(row->plan, sizeof row->plan, pp->name);
  snprintf(row->plan_path, sizeof row->plan_path, "%s", pp->path);
  sb_result_free(&r);
  return rc;
}

/* Whether local batch l cuts into the pipeline's microbatches: mbn of them (the plan's
 * count; -1: pp), else microbatches of mb, at least pp of them. */
static bool cuts(int l, int pp, int mb, int mbn) {
  if (pp <= 1) return true;
  if (mbn) return l % (mbn < 0 ? pp : mbn) == 0;
  return l % mb == 0 && l / mb >= pp;
}

/* The local batches of a layout, ascending: divisors of global / dp (or --local-batch's
 * that divide it) that cut into its microbatches. */
static int local_batches(const pl_args *a, int dp, int pp, int mb, int mbn, int *out, int max) {
  int n = 0;
  if (a->global_batch % dp) return 0;
  const int per = a->global_batch / dp;
  if (a->n_lb) {
    for (int i = 0; i < a->n_lb && n < max; i++)
      if (per % a->lbs[i] == 0 && cuts(a->lbs[i], pp, mb, mbn)) out[n++] = a->lbs[i];
    /* ascending */
    for (int i = 1; i < n; i++)
      for (int j = i; j > 0 && out[j - 1] > out[j]; j--) {
        int t = out[j];
        out[j] = out[j - 1];
        out[j - 1] = t;
      }
    return n;
  }
  for (int l = 1; l <= per && l <= a->max_lb && n < max; l++)
    if (per % l == 0 && cuts(l, pp, mb, mbn)) out[n++] = l;
  return n;
}

/* Whether the model takes tp / cp of this size (TorchTitan's checks: heads split
 * over tp; cp's load balancing cuts the sequence in 2 cp chunks, each over tp for SP). */
static bool dims_sane(const dt_llama_config *cfg, const pl_args *a, const int d[SB_NDIMS],
                      const sb_hw *hw) {
  const int tp = d[4], cp = d[3], pp = d[0];
  if (tp > 1 && (cfg->n_heads % tp || cfg->n_kv_heads % tp || tp > hw->gpus_per_node)) return false;
  if (a->seq % (2 * cp * tp)) return false;
  if (pp > cfg->n_layers || pp > a->max_pp || cp > a->max_cp) return false;
  if (a->global_batch % (d[1] * d[2])) return false;
  return true;
}

/* The meshes of a plan over G GPUs: each dim the plan uses takes a size (its fixed
 * one, or any divisor, over 1: a plan's dim applies only when it is over 1), the
 * others 1. */
static void meshes_of(const pl_plan *p, int G, int d, int rest, int cur[SB_NDIMS],
                      int (*out)[SB_NDIMS], int *n, int max) {
  if (d == SB_NDIMS) {
    if (rest == 1 && *n < max) memcpy(out[(*n)++], cur, sizeof(int) * SB_NDIMS);
    return;
  }
  if (!p->uses[d]) {
    cur[d] = 1;
    meshes_of(p, G, d + 1, rest, cur, out, n, max);
    return;
  }
  for (int s = 2; s <= rest; s++) {
    if (rest % s || (p->fixed[d] && s != p->fixed[d])) continue;
    cur[d] = s;
    meshes_of(p, G, d + 1, rest / s, cur, out, n, max);
  }
}

static bool mesh_allowed(const pl_args *a, const int d[SB_NDIMS]) {
  if (!a->n_mesh) return true;
  for (int i = 0; i < a->n_mesh; i++)
    if (!memcmp(a->meshes[i], d, sizeof(int) * SB_NDIMS)) return true;
  return false;
}

static void note_failure(pl_rows *R, const char *what, const char *why) {
  R->failed++;
  if (!R->first_failure[0]) snprintf(R->first_failure, sizeof R->first_failure, "%.200s: %.300s", what, why);
}

static void mesh_str(const int d[SB_NDIMS], char *buf, size_t n) {
  size_t k = 0;
  buf[0] = '\0';
  for (int i = 0; i < SB_NDIMS; i++)
    if (d[i] > 1 && k < n) k += (size_t)snprintf(buf + k, n - k, "%s%s%d", k ? "," : "",
                                                 sb_dim_names[i], d[i]);
  if (!k) snprintf(buf, n, "1");
}

/* The row of local batch l from the runs at r0's and r1's: a microstep's time is
 * affine in the local batch, memory grows by mem_slope per sequence (per-sequence work and activations on top of
 * fixed weights, optimizer and unit gathers), the step is the accumulation steps of
 * microsteps plus the optimizer once. Marked estimated. */
static void interpolate(const pl_args *a, const pl_row *r0, const pl_row *r1, int l,
                        double mem_slope, pl_row *out) {
  *out = *r1;
  const double u = (double)(l - r0->local_batch) / (double)(r1->local_batch - r0->local_batch);
  const sb_prediction *p0 = &r0->micro, *p1 = &r1->micro;
#define LIN(f) (p0->f + u * (p1->f - p0->f))
  const int dp = r1->dims[1] * r1->dims[2];
  const int A = a->global_batch / (l * dp);
  sb_prediction *p = &out->p;
  const double opt = LIN(opt_s);
  p->step_s = A * (LIN(step_s) - opt) + opt;
  p->opt_s = opt;
  p->compute_s = A * LIN(compute_s);
  p->recompute_s = A * LIN(recompute_s);
  p->bubble_s = A * LIN(bubble_s);
  for (int d = 0; d < SB_NDIMS; d++)
    p->exposed_comm_s[d] = A * LIN(exposed_comm_s[d]), p->comm_s[d] = A * LIN(comm_s[d]);
  for (int k = 0; k < 3; k++) p->mem_split[k] = LIN(mem_split[k]);
  p->peak_bytes = r1->p.peak_bytes + mem_slope * (l - r1->local_batch);
  p->mem_split[3] = r1->p.mem_split[3] + mem_slope * (l - r1->local_batch);
#undef LIN
  int world = 1;
  for (int d = 0; d < SB_NDIMS; d++) world *= r1->dims[d];
  p->tokens_per_s_per_gpu = (double)a->global_batch * a->seq / p->step_s / world;
  p->mfu = r1->p.mfu * p->tokens_per_s_per_gpu / r1->p.tokens_per_s_per_gpu;
  p->fits = true; /* the memory line's pick */
  p->over_bytes = 0;
  out->local_batch = l;
  out->accum = A;
  out->microbatches = r1->dims[0] <= 1 ? 1
                      : r1->mb_count ? r1->microbatches /* a count: the same at any batch */
                                     : r1->microbatches / r1->local_batch * l;
  out->estimated = true;
}

/* One shape-only run of a layout at local batch lb into *row (its gpus and plan
 * index set). 0; 1: the plan does not apply to the layout; -1: the run failed
 * (noted in R). */
static int run_at(const pl_args *a, const sb_hw *hw, const pl_plan *pp, int pi,
                  const int dims[SB_NDIMS], const dt_ac_config *ac, int lb, int G, pl_rows *R,
                  pl_row *row) {
  char why[512];
  memset(row, 0, sizeof *row);
  row->gpus = G;
  const int rc = predict_layout(a, hw, pp, dims, ac, lb, row, R, why, sizeof why);
  row->pi = pi;
  if (rc < 0) {
    char m[128], what[256];
    mesh_str(dims, m, sizeof m);
    snprintf(what, sizeof what, "%.63s %.96s lb %d", pp->name, m, lb);
    note_failure(R, what, why);
  }
  return rc;
}

/* One (layout, AC mode): the row of the largest of its local batches lbs (nl,
 * ascending) that fits, or of the smallest when none does, into *out; *top when it
 * is the largest candidate. Memory is affine in the local batch (weights, gradients
 * and optimizer state fixed, activations per sequence), so the two smallest give a
 * line; the largest candidate under the HBM on it is interpolated from those two
 * (up to 4x the second's local batch, and not with --exact: further out the peak can
 * move to another phase) or run, and the next smaller one when a run says it is over
 * after all. The two small runs cost little: a run's work grows with its local batch.
 * 0, or run_at's 1 / -1. */
static int best_local_batch(const pl_args *a, const sb_hw *hw, const pl_plan *pp, int pi,
                            const int dims[SB_NDIMS], const dt_ac_config *ac, const int *lbs,
                            int nl, int G, pl_rows *R, pl_row *out, bool *top) {
  pl_row r0, r1, r;
  int rc = run_at(a, hw, pp, pi, dims, ac, lbs[0], G, R, &r0);
  if (rc) return rc;
  *out = r0;
  *top = nl == 1 && r0.p.fits;
  if (!r0.p.fits || nl == 1) return 0;
  if ((rc = run_at(a, hw, pp, pi, dims, ac, lbs[1], G, R, &r1))) return rc;
  if (!r1.p.fits) return 0;
  *out = r1;
  int best = 1;
  /* the steeper of the line through the two and all of the second's activations per
   * sequence (a peak can move to where more of them live) */
  const double line = (r1.p.peak_bytes - r0.p.peak_bytes) / (double)(lbs[1] - lbs[0]);
  const double act = r1.p.mem_split[3] / (double)lbs[1];
  const double slope = line > act ? line : act;
  for (int k = nl - 1; k > 1; k--) {
    if (slope > 0 && r0.p.peak_bytes + slope * (lbs[k] - lbs[0]) > hw->hbm_bytes) continue;
    if (!a->exact && lbs[k] <= 4 * lbs[1]) {
      interpolate(a, &r0, &r1, lbs[k], slope, out); /* the top rows run after the search */
      best = k;
      break;
    }
    if ((rc = run_at(a, hw, pp, pi, dims, ac, lbs[k], G, R, &r))) return rc;
    if (r.p.fits) {
      *out = r;
      best = k;
      break;
    }
  }
  *top = best == nl - 1;
  return 0;
}

/* One task of the search: a (GPU count, plan, mesh) whose local batch and AC the
 * task picks. */
typedef struct pl_task {
  int gpus, pi;
  int dims[SB_NDIMS];
} pl_task;

/* Every (GPU count, plan, mesh) the search covers, in a fixed order; NULL when out of
 * memory. */
static pl_task *search_tasks(const pl_args *a, const sb_hw *hw, const pl_plan *P, int np,
                             const dt_llama_config *cfg, int *n) {
  static int meshes[4096][SB_NDIMS];
  size_t cap = 256;
  pl_task *T = malloc(cap * sizeof *T);
  *n = 0;
  for (int g = 0; T && g < a->n_gpus; g++)
    for (int pi = 0; T && pi < np; pi++) {
      int nm = 0, cur[SB_NDIMS];
      meshes_of(&P[pi], a->gpus[g], 0, a->gpus[g], cur, meshes, &nm, 4096);
      for (int mi = 0; mi < nm; mi++) {
        if (!mesh_allowed(a, meshes[mi]) || !dims_sane(cfg, a, meshes[mi], hw)) continue;
        if ((size_t)*n == cap) {
          pl_task *g2 = realloc(T, 2 * cap * sizeof *T);
          if (!g2) {
            free(T);
            return NULL;
          }
          T = g2, cap *= 2;
        }
        pl_task *t = &T[(*n)++];
        t->gpus = a->gpus[g], t->pi = pi;
        memcpy(t->dims, meshes[mi], sizeof t->dims);
      }
    }
  return T;
}

typedef struct search_env {
  const sb_hw *hw;
  const pl_plan *P;
  const pl_task *T;
  pl_row *refine;                /* the refinement's rows (refine_task) */
} search_env;

/* Task i of the search: its layout's row per AC mode of its plan, lightest first,
 * until one fits at its largest local batch (the heavier ones are then dominated). */
static void search_task(const pl_args *a, const search_env *e, int i, pl_rows *R) {
  const pl_task *t = &e->T[i];
  const pl_plan *pp = &e->P[t->pi];
  const int *d = t->dims;
  int lbs[256];
  const int nl = local_batches(a, d[1] * d[2], d[0], pp->mb_size, pp->mb_count, lbs, 256);
  if (!nl) return;
  for (int ai = 0; ai < pp->n_ac; ai++) {
    pl_row out;
    bool top = false;
    if (best_local_batch(a, e->hw, pp, t->pi, d, &pp->acs[ai], lbs, nl, t->gpus, R, &out, &top))
      break;
    pl_row *r = rows_add(R);
    if (!r) return;
    *r = out;
    r->task = i * PL_MAX_AC + ai;
    if (top) { /* heavier AC at the largest local batch that already fits: dominated */
      R->dominated += pp->n_ac - 1 - ai;
      break;
    }
  }
}

/* Refinement task i: e->refine[i] run exactly at its local batch, the row that
 * replaces it into R; none when the run fails (noted in R: the plan exits 1). */
static void refine_task(const pl_args *a, const search_env *e, int i, pl_rows *R) {
  const pl_row *r = &e->refine[i];
  pl_row *o = rows_add(R);
  if (!o) return;
  if (run_at(a, e->hw, &e->P[r->pi], r->pi, r->dims, &r->ac, r->local_batch, r->gpus, R, o))
    R->n--;
  else
    o->task = i; /* the refinement's index; the caller restores the search's order */
}

typedef void (*pl_task_fn)(const pl_args *a, const search_env *e, int i, pl_rows *R);

/* What a worker sends back: its counters, then n_rows rows (plain data). */
typedef struct pl_wire {
  size_t n_rows;
  int shape_runs, dominated, failed;
  char first_failure[512];
} pl_wire;

static bool read_all(int fd, void *buf, size_t n) {
  char *p = buf;
  while (n) {
    ssize_t k = read(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k, n -= (size_t)k;
  }
  return true;
}

static bool write_all(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n) {
    ssize_t k = write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k, n -= (size_t)k;
  }
  return true;
}

/* Tasks 0..n-1 of fn into R over a->jobs worker processes: each reads the next
 * task's number from a shared pipe (reads of an int are atomic: POSIX's PIPE_BUF),
 * so a worker that drew short tasks takes more (shape-only runs differ a
 * hundredfold in cost), and pipes its rows back when the tasks run out; in this
 * process when jobs is 1 or the pipe cannot be made. */
static void run_pool(const pl_args *a, const search_env *e, int n, pl_task_fn fn, pl_rows *R) {
  int W = a->jobs > 1 ? a->jobs : 1;
  if (W > n) W = n;
  if (W > 64) W = 64;
  int q[2] = {-1, -1};
  if (W <= 1 || pipe(q) != 0) {
    for (int i = 0; i < n; i++) fn(a, e, i, R);
    return;
  }
  pid_t pid[64];
  int fd[64];
  fflush(NULL);
  for (int w = 0; w < W; w++) {
    int p[2];
    pid[w] = -1;
    fd[w] = -1;
    if (pipe(p) != 0) continue;
    pid[w] = fork();
    if (pid[w] == 0) {
      close(p[0]);
      for (int k = 0; k < w; k++) close(fd[k]);
      close(q[1]);
      pl_rows mine;
      memset(&mine, 0, sizeof mine);
      for (int i; read_all(q[0], &i, sizeof i);) fn(a, e, i, &mine);
      pl_wire h;
      memset(&h, 0, sizeof h);
      h.n_rows = mine.n;
      h.shape_runs = mine.shape_runs, h.dominated = mine.dominated, h.failed = mine.failed;
      memcpy(h.first_failure, mine.first_failure, sizeof h.first_failure);
      const bool ok = write_all(p[1], &h, sizeof h) &&
                      (!mine.n || write_all(p[1], mine.v, mine.n * sizeof *mine.v));
      _exit(ok ? 0 : 1);
    }
    close(p[1]);
    if (pid[w] < 0) close(p[0]);
    else fd[w] = p[0];
  }
  close(q[0]);
  /* the tasks in order (a full pipe waits for the workers); the end of the pipe ends them */
  bool any = false;
  for (int w = 0; w < W; w++) any |= fd[w] >= 0;
  struct sigaction ign, old;
  memset(&ign, 0, sizeof ign);
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  const bool quiet = sigaction(SIGPIPE, &ign, &old) == 0; /* every worker gone: EPIPE, not death */
  for (int i = 0; any && i < n; i++)
    if (!write_all(q[1], &i, sizeof i)) break;
  close(q[1]);
  if (quiet) sigaction(SIGPIPE, &old, NULL);
  for (int w = 0; w < W; w++) {
    if (fd[w] < 0) {
      note_failure(R, "worker", "could not start a worker process");
      continue;
    }
    pl_wire h;
    bool ok = read_all(fd[w], &h, sizeof h);
    for (size_t i = 0; ok && i < h.n_rows; i++) {
      pl_row *r = rows_add(R);
      ok = r && read_all(fd[w], r, sizeof *r);
      if (!ok && r) R->n--;
    }
    close(fd[w]);
    int st = 0;
    waitpid(pid[w], &st, 0);
    if (!ok || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      note_failure(R, "worker", "a worker process died before it sent all its layouts");
      continue;
    }
    R->shape_runs += h.shape_runs, R->dominated += h.dominated;
    if (h.failed) {
      if (!R->first_failure[0]) memcpy(R->first_failure, h.first_failure, sizeof R->first_failure);
      R->failed += h.failed;
    }
  }
}

static int row_cmp(const void *x, const void *y) {
  const pl_row *a = x, *b = y;
  if (a->gpus != b->gpus) return a->gpus - b->gpus;
  if (a->p.fits != b->p.fits) return a->p.fits ? -1 : 1;
  if (a->p.fits) {
    const double u = a->p.tokens_per_s_per_gpu, v = b->p.tokens_per_s_per_gpu;
    if (u != v) return (u < v) - (u > v);
  } else if (a->p.over_bytes != b->p.over_bytes) {
    return (a->p.over_bytes > b->p.over_bytes) - (a->p.over_bytes < b->p.over_bytes);
  }
  return a->task - b->task; /* the search's order: the same ranking from any worker count */
}

/* Sorts R (by GPU count, fitting first, then tokens/s per GPU) and numbers the ranks. */
static void rank_rows(pl_rows *R) {
  qsort(R->v, R->n, sizeof *R->v, row_cmp);
  for (size_t i = 0, k = 0; i < R->n; i++) {
    if (i && R->v[i].gpus != R->v[i - 1].gpus) k = 0;
    R->v[i].rank = R->v[i].p.fits ? (int)++k : 0;
  }
}

/* ---- --verify: the layout on this machine, debugmodel, threads ---- */

static void verify_row(pl_row *row) {
  sb_opts o;
  memset(&o, 0, sizeof o);
  snprintf(o.model, sizeof o.model, "debugmodel");
  snprintf(o.workload, sizeof o.workload, "model");
  snprintf(o.plan, sizeof o.plan, "%s", row->plan);
  snprintf(o.plan_path, sizeof o.plan_path, "%s", row->plan_path);
  int d[SB_NDIMS], world = 1;
  memcpy(d, row->dims, sizeof d);
  /* cap: halve the largest dim over 2 until the world fits (each used dim stays >= 2,
   * so the plan applies as it does at scale) */
  for (;;) {
    world = 1;
    for (int i = 0; i < SB_NDIMS; i++) world *= d[i];
    if (world <= PL_VERIFY_WORLD) break;
    int big = -1;
    for (int i = 0; i < SB_NDIMS; i++)
      if (d[i] > 2 && (big < 0 || d[i] > d[big])) big = i;
    if (big < 0) break;
    d[big] = d[big] % 2 == 0 ? d[big] / 2 : 2;
  }
  if (world > PL_VERIFY_WORLD * 4) {
    snprintf(row->verdict, sizeof row->verdict, "skipped");
    snprintf(row->vreason, sizeof row->vreason, "every dim at 2 is still %d ranks", world);
    return;
  }
  for (int i = 0; i < SB_NDIMS; i++) o.dims[i] = d[i];
  snprintf(o.dtype, sizeof o.dtype, "f32");
  const int dp = d[1] * d[2];
  /* a pipeline needs pp microbatches (or the plan's count of them) */
  const int lb = d[0] <= 1 ? 1 : row->mb_count > 0 ? row->mb_count : d[0];
  o.batch = lb * dp;
  o.seq = 32;
  while (o.seq % (2 * d[3] * d[4])) o.seq *= 2;
  o.steps = 1;
  o.warmup = 0;
  snprintf(o.backend, sizeof o.backend, "threads");
  snprintf(o.comm, sizeof o.comm, "host");
  snprintf(o.device, sizeof o.device, "cpu");
  o.world = world;
  o.ac = row->ac;
  sb_result r;
  sb_ref ref;
  memset(&ref, 0, sizeof ref);
  sb_execute(&o, &ref, SB_STAGE_RUN, &r);
  char m[96];
  mesh_str(d, m, sizeof m);
  snprintf(row->verdict, sizeof row->verdict, "%s", r.status);
  snprintf(row->vreason, sizeof row->vreason, "debugmodel %.96s batch %d seq %d%s%.100s", m, o.batch,
           o.seq, r.reason[0] ? ": " : "", r.reason);
  sb_ref_free(&ref);
  sb_result_free(&r);
}

/* ---- output ---- */

static const double GIB = 1024.0 * 1024.0 * 1024.0;

static void print_table(FILE *f, const pl_args *a, const sb_hw *hw, const pl_rows *R, int G) {
  int shown = 0, fits = 0, over = 0;
  for (size_t i = 0; i < R->n; i++)
    if (R->v[i].gpus == G) R->v[i].p.fits ? fits++ : over++;
  fprintf(f, "%s on %d x %s, seq %d, global batch %d%s%s%s: %d layouts fit, %d do not\n",
          a->model, G, hw->name, a->seq, a->global_batch, a->fp8 ? ", float8" : "",
          a->feat.compile ? ", compile" : "", a->feat.async_tp ? ", async TP" : "", fits, over);
  fprintf(f, "%4s %-30s %-14s %-12s %5s %7s %7s %7s %7s %7s | %7s %6s %6s %6s %6s %6s | %8s %5s",
          "rank", "mesh", "plan", "ac", "lb", "peakGiB", "params", "grads", "optim", "act",
          "step_s", "comp", "recomp", "bubble", "x_comm", "x_tp", "tok/s/gpu", "mfu");
  if (isfinite(a->tokens)) fprintf(f, " %8s %10s", "days", "gpu_hours");
  if (a->verify) fprintf(f, " %s", "verify");
  fputc('\n', f);
  for (size_t i = 0; i < R->n && shown < a->top; i++) {
    const pl_row *r = &R->v[i];
    if (r->gpus != G || !r->p.fits) continue;
    char m[96], ac[32], lb[24];
    mesh_str(r->dims, m, sizeof m);
    dt_ac_str(&r->ac, ac, sizeof ac);
    if (r->dims[0] > 1) snprintf(lb, sizeof lb, "%dm%d", r->local_batch, r->microbatches);
    else snprintf(lb, sizeof lb, "%dx%d", r->local_batch, r->accum);
    double xc = 0;
    for (int d = 0; d < 4; d++) xc += r->p.exposed_comm_s[d];
    fprintf(f, "%4d %-30s %-14s %-12s %5s %7.1f %7.1f %7.1f %7.1f %7.1f | %7.3f %6.3f %6.3f %6.3f "
            "%6.3f %6.3f | %8.0f %5.3f",
            r->rank, m, r->plan, ac, lb, r->p.peak_bytes / GIB, r->p.mem_split[0] / GIB,
            r->p.mem_split[1] / GIB, r->p.mem_split[2] / GIB, r->p.mem_split[3] / GIB, r->p.step_s,
            r->p.compute_s, r->p.recompute_s, r->p.bubble_s, xc, r->p.exposed_comm_s[4],
            r->p.tokens_per_s_per_gpu, r->p.mfu);
    if (isfinite(a->tokens)) {
      const double s = a->tokens / (r->p.tokens_per_s_per_gpu * G);
      fprintf(f, " %8.1f %10.3g", s / 86400, s * G / 3600);
    }
    if (r->verdict[0]) fprintf(f, " %s (%s)", r->verdict, r->vreason);
    fputc('\n', f);
    shown++;
  }
  int listed = 0;
  for (size_t i = 0; i < R->n; i++) {
    const pl_row *r = &R->v[i];
    if (r->gpus != G || r->p.fits) continue;
    if (!listed++) fprintf(f, "do not fit (%.1f GiB per GPU; least over first):\n", hw->hbm_bytes / GIB);
    if (listed > a->top) continue;
    char m[96], ac[32];
    mesh_str(r->dims, m, sizeof m);
    dt_ac_str(&r->ac, ac, sizeof ac);
    fprintf(f, "     %-30s %-14s %-12s lb %-3d peak %7.1f GiB, over by %.1f GiB\n", m, r->plan, ac,
            r->local_batch, r->p.peak_bytes / GIB, r->p.over_bytes / GIB);
  }
  if (listed > a->top) fprintf(f, "     ... and %d more\n", listed - a->top);
}

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') fputc('\\', f);
    if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", *s);
    else fputc(*s, f);
  }
  fputc('"', f);
}

static void print_json(FILE *f, const pl_args *a, const sb_hw *hw, const pl_rows *R) {
  fprintf(f, "{\"model\": ");
  json_str(f, a->model);
  fprintf(f, ", \"hardware\": ");
  json_str(f, hw->name);
  fprintf(f, ", \"seq\": %d, \"global_batch\": %d, \"float8\": %s, \"compile\": %s, "
          "\"async_tp\": %s, \"shape_runs\": %d, \"dominated\": %d, \"layouts\": [",
          a->seq, a->global_batch, a->fp8 ? "true" : "false", a->feat.compile ? "true" : "false",
          a->feat.async_tp ? "true" : "false", R->shape_runs, R->dominated);
  for (size_t i = 0; i < R->n; i++) {
    const pl_row *r = &R->v[i];
    char m[96], ac[32];
    mesh_str(r->dims, m, sizeof m);
    dt_ac_str(&r->ac, ac, sizeof ac);
    fprintf(f, "%s\n {\"gpus\": %d, \"rank\": %d, \"mesh\": \"%s\", \"plan\": ", i ? "," : "",
            r->gpus, r->rank, m);
    json_str(f, r->plan);
    fprintf(f, ", \"pp\": %d, \"dp_replicate\": %d, \"dp_shard\": %d, \"cp\": %d, \"tp\": %d, "
            "\"ac\": \"%s\", \"local_batch\": %d, \"accum_steps\": %d, \"microbatches\": %d, "
            "\"schedule\": \"%s\", \"fits\": %s, \"peak_bytes\": %.17g, \"over_bytes\": %.17g, "
            "\"mem_params_bytes\": %.17g, \"mem_grads_bytes\": %.17g, "
            "\"mem_optimizer_bytes\": %.17g, \"mem_activations_bytes\": %.17g, "
            "\"step_s\": %.17g, \"compute_s\": %.17g, \"recompute_s\": %.17g, \"bubble_s\": %.17g, "
            "\"exposed_comm_s\": {",
            r->dims[0], r->dims[1], r->dims[2], r->dims[3], r->dims[4], ac, r->local_batch,
            r->accum, r->microbatches, r->schedule, r->p.fits ? "true" : "false", r->p.peak_bytes,
            r->p.over_bytes, r->p.mem_split[0], r->p.mem_split[1], r->p.mem_split[2],
            r->p.mem_split[3], r->p.step_s, r->p.compute_s, r->p.recompute_s, r->p.bubble_s);
    for (int d = 0; d < SB_NDIMS; d++)
      fprintf(f, "%s\"%s\": %.17g", d ? ", " : "", sb_dim_names[d], r->p.exposed_comm_s[d]);
    fprintf(f, "}, \"tokens_per_s_per_gpu\": %.17g, \"mfu\": %.17g", r->p.tokens_per_s_per_gpu,
            r->p.mfu);
    if (isfinite(a->tokens)) {
      const double s = a->tokens / (r->p.tokens_per_s_per_gpu * r->gpus);
      fprintf(f, ", \"train_s\": %.17g, \"gpu_hours\": %.17g", s, s * r->gpus / 3600);
    }
    fprintf(f, ", \"estimated\": %s", r->estimated ? "true" : "false");
    if (r->verdict[0]) {
      fprintf(f, ", \"verdict\": \"%s\", \"verify_reason\": ", r->verdict);
      json_str(f, r->vreason);
    }
    fputc('}', f);
  }
  fprintf(f, "\n]}\n");
}

/* The predictions into the DB (results/schema.sql: hardware, plan_runs,
 * predictions), one plan_runs row per GPU count, all in one transaction. */
static int store_rows(sb_store *st, int argc, char **argv, const pl_args *a, const sb_hw *hw,
                      const pl_rows *R) {
  char feats[64];
  snprintf(feats, sizeof feats, "%s%s%s%s%s", a->fp8 ? "float8" : "",
           a->fp8 && (a->feat.compile || a->feat.async_tp) ? "," : "",
           a->feat.compile ? "compile" : "", a->feat.compile && a->feat.async_tp ? "," : "",
           a->feat.async_tp ? "async_tp" : "");
  if (sb_store_begin_run(st, argc, argv, "meta", 0, NAN, "")) return -1;
  sqlite3 *db = st->db;
  sqlite3_stmt *q = NULL;
  int rc = sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK;
  int64_t hw_id = 0;
  if (!rc) {
    rc = sqlite3_prepare_v2(db, "INSERT OR IGNORE INTO hardware (name, text) VALUES (?, ?)", -1, &q,
                            NULL) != SQLITE_OK;
    if (!rc) {
      sqlite3_bind_text(q, 1, hw->name, -1, SQLITE_STATIC);
      sqlite3_bind_text(q, 2, hw->text ? hw->text : "", -1, SQLITE_STATIC);
      rc = sqlite3_step(q) != SQLITE_DONE;
    }
    sqlite3_finalize(q);
    q = NULL;
  }
  if (!rc) {
    rc = sqlite3_prepare_v2(db, "SELECT id FROM hardware WHERE name = ? AND text = ?", -1, &q,
                            NULL) != SQLITE_OK;
    if (!rc) {
      sqlite3_bind_text(q, 1, hw->name, -1, SQLITE_STATIC);
      sqlite3_bind_text(q, 2, hw->text ? hw->text : "", -1, SQLITE_STATIC);
      rc = sqlite3_step(q) != SQLITE_ROW;
      if (!rc) hw_id = sqlite3_column_int64(q, 0);
    }
    sqlite3_finalize(q);
    q = NULL;
  }
  for (int g = 0; g < a->n_gpus && !rc; g++) {
    rc = sqlite3_prepare_v2(db, "INSERT INTO plan_runs (run_id, hardware_id, model, gpus, seq, "
                            "global_batch, dtype, tokens, features) VALUES (?,?,?,?,?,?,?,?,?)",
                            -1, &q, NULL) != SQLITE_OK;
    if (!rc) {
      sqlite3_bind_int64(q, 1, st->run_id);
      sqlite3_bind_int64(q, 2, hw_id);
      sqlite3_bind_text(q, 3, a->model, -1, SQLITE_STATIC);
      sqlite3_bind_int(q, 4, a->gpus[g]);
      sqlite3_bind_int(q, 5, a->seq);
      sqlite3_bind_int(q, 6, a->global_batch);
      sqlite3_bind_text(q, 7, a->fp8 ? "fp8" : a->f32 ? "f32" : "bf16", -1, SQLITE_STATIC);
      if (isfinite(a->tokens)) sqlite3_bind_double(q, 8, a->tokens);
      else sqlite3_bind_null(q, 8);
      sqlite3_bind_text(q, 9, feats, -1, SQLITE_STATIC);
      rc = sqlite3_step(q) != SQLITE_DONE;
    }
    sqlite3_finalize(q);
    q = NULL;
    const int64_t pr = sqlite3_last_insert_rowid(db);
    if (!rc)
      rc = sqlite3_prepare_v2(
               db,
               "INSERT INTO predictions (plan_run_id, rank, plan, pp, dp_replicate, dp_shard, cp, "
               "tp, ac, local_batch, accum_steps, microbatches, schedule, fits, peak_bytes, "
               "over_bytes, mem_params_bytes, mem_grads_bytes, mem_optimizer_bytes, "
               "mem_activations_bytes, step_s, compute_s, recompute_s, bubble_s, exposed_pp_s, "
               "exposed_dp_replicate_s, exposed_dp_shard_s, exposed_cp_s, exposed_tp_s, "
               "tokens_per_s_per_gpu, mfu, train_s, gpu_hours, verdict, verify_reason) VALUES "
               "(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
               -1, &q, NULL) != SQLITE_OK;
    for (size_t i = 0; i < R->n && !rc; i++) {
      const pl_row *r = &R->v[i];
      if (r->gpus != a->gpus[g]) continue;
      char ac[32];
      dt_ac_str(&r->ac, ac, sizeof ac);
      int c = 1;
      sqlite3_reset(q);
      sqlite3_clear_bindings(q);
      sqlite3_bind_int64(q, c++, pr);
      if (r->rank > 0) sqlite3_bind_int(q, c++, r->rank);
      else sqlite3_bind_null(q, c++);
      sqlite3_bind_text(q, c++, r->plan, -1, SQLITE_TRANSIENT);
      for (int d = 0; d < SB_NDIMS; d++) sqlite3_bind_int(q, c++, r->dims[d]);
      sqlite3_bind_text(q, c++, ac, -1, SQLITE_TRANSIENT);
      sqlite3_bind_int(q, c++, r->local_batch);
      sqlite3_bind_int(q, c++, r->accum);
      sqlite3_bind_int(q, c++, r->microbatches);
      if (r->schedule[0]) sqlite3_bind_text(q, c++, r->schedule, -1, SQLITE_TRANSIENT);
      else sqlite3_bind_null(q, c++);
      sqlite3_bind_int(q, c++, r->p.fits);
      sqlite3_bind_double(q, c++, r->p.peak_bytes);
      if (r->p.fits) sqlite3_bind_null(q, c++);
      else sqlite3_bind_double(q, c++, r->p.over_bytes);
      for (int k = 0; k < 4; k++) sqlite3_bind_double(q, c++, r->p.mem_split[k]);
      sqlite3_bind_double(q, c++, r->p.step_s);
      sqlite3_bind_double(q, c++, r->p.compute_s);
      sqlite3_bind_double(q, c++, r->p.recompute_s);
      sqlite3_bind_double(q, c++, r->p.bubble_s);
      for (int d = 0; d < SB_NDIMS; d++) sqlite3_bind_double(q, c++, r->p.exposed_comm_s[d]);
      sqlite3_bind_double(q, c++, r->p.tokens_per_s_per_gpu);
      sqlite3_bind_double(q, c++, r->p.mfu);
      if (isfinite(a->tokens) && r->p.fits) {
        const double s = a->tokens / (r->p.tokens_per_s_per_gpu * r->gpus);
        sqlite3_bind_double(q, c++, s);
        sqlite3_bind_double(q, c++, s * r->gpus / 3600);
      } else {
        sqlite3_bind_null(q, c++);
        sqlite3_bind_null(q, c++);
      }
      if (r->verdict[0]) {
        sqlite3_bind_text(q, c++, r->verdict, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(q, c++, r->vreason, -1, SQLITE_TRANSIENT);
      } else if (r->estimated) {
        sqlite3_bind_null(q, c++);
        sqlite3_bind_text(q, c++, "estimated: interpolated from the two smallest local batches' "
                          "runs (not itself run)", -1, SQLITE_STATIC);
      } else {
        sqlite3_bind_null(q, c++);
        sqlite3_bind_null(q, c++);
      }
      rc = sqlite3_step(q) != SQLITE_DONE;
    }
    sqlite3_finalize(q);
    q = NULL;
  }
  if (rc) {
    fprintf(stderr, "shardbench plan: --db: '%s': %s\n", st->path, sqlite3_errmsg(db));
    sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    return -1;
  }
  if (sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) return -1;
  return sb_store_end_run(st);
}

int sb_cmd_plan(int argc, char **argv) {
  pl_args a;
  int rc = pl_parse(argc, argv, &a);
  if (rc) return rc < 0 ? SB_EXIT_OK : rc;
  static pl_plan P[PL_MAX_PLANS];
  int np = 0;
  if ((rc = load_plans(&a, P, &np))) return rc;
  sb_hw hw;
  char err[SB_ERR_LEN * 4];
  if (sb_hw_load(a.hardware, &hw, err, sizeof err))
    return sb_usage_error("plan", "--hardware", "%s", err);
  dt_llama_config cfg;
  dt_ctx hc;
  dt_ctx_init(&hc, 0, 1);
  if (sb_workload_config(&hc, a.model, "model", &cfg) != DT_OK) {
    rc = sb_usage_error("plan", "--model", "%s", dt_last_error(&hc));
    dt_ctx_release(&hc);
    sb_hw_free(&hw);
    return rc;
  }
  dt_ctx_release(&hc);
  sb_store st;
  memset(&st, 0, sizeof st);
  if (a.db && (rc = sb_store_open(&st, a.db, "plan"))) {
    sb_hw_free(&hw);
    return rc;
  }
  pl_rows R;
  memset(&R, 0, sizeof R);
  int nt = 0;
  pl_task *T = search_tasks(&a, &hw, P, np, &cfg, &nt);
  if (!T) note_failure(&R, "search", "no memory for the layouts");
  search_env env = {&hw, P, T, NULL};
  run_pool(&a, &env, nt, search_task, &R);
  rank_rows(&R);
  /* the estimated rows among each GPU count's top ones run exactly, in the workers
   * (then re-rank: an exact run may rank lower, or not fit after all) */
  const int K = a.top > a.verify ? a.top : a.verify;
  for (int round = 0; round < 64; round++) {
    size_t nr = 0;
    for (size_t i = 0; i < R.n; i++) nr += R.v[i].estimated && R.v[i].rank >= 1 && R.v[i].rank <= K;
    if (!nr) break;
    pl_row *todo = malloc(nr * sizeof *todo);
    size_t *at = malloc(nr * sizeof *at);
    if (!todo || !at) {
      free(todo), free(at);
      note_failure(&R, "refine", "no memory");
      break;
    }
    nr = 0;
    for (size_t i = 0; i < R.n; i++)
      if (R.v[i].estimated && R.v[i].rank >= 1 && R.v[i].rank <= K) todo[nr] = R.v[i], at[nr++] = i;
    pl_rows E;
    memset(&E, 0, sizeof E);
    env.refine = todo;
    run_pool(&a, &env, (int)nr, refine_task, &E);
    R.shape_runs += E.shape_runs;
    if (E.failed) {
      if (!R.first_failure[0]) memcpy(R.first_failure, E.first_failure, sizeof R.first_failure);
      R.failed += E.failed;
    }
    /* a row whose run failed or whose worker died does not fit (counted as failed
     * above, never rerun); the others take their exact run */
    for (size_t i = 0; i < nr; i++) R.v[at[i]].estimated = false, R.v[at[i]].p.fits = false;
    for (size_t i = 0; i < E.n; i++) {
      pl_row *r = &R.v[at[E.v[i].task]];
      const int task = r->task;
      *r = E.v[i];
      r->task = task;
    }
    free(E.v), free(todo), free(at);
    rank_rows(&R);
  }
  free(T);
  int bad_verify = 0;
  if (a.verify)
    for (int g = 0; g < a.n_gpus; g++)
      for (size_t i = 0; i < R.n; i++)
        if (R.v[i].gpus == a.gpus[g] && R.v[i].rank >= 1 && R.v[i].rank <= a.verify) {
          verify_row(&R.v[i]);
          if (!strcmp(R.v[i].verdict, "mismatch") || !strcmp(R.v[i].verdict, "failed"))
            bad_verify++;
        }
  if (a.json) {
    print_json(stdout, &a, &hw, &R);
  } else {
    for (int g = 0; g < a.n_gpus; g++) {
      if (g) fputc('\n', stdout);
      print_table(stdout, &a, &hw, &R, a.gpus[g]);
    }
    int est = 0;
    for (size_t i = 0; i < R.n; i++) est += R.v[i].estimated;
    printf("%d shape-only runs, %d (layout, AC) pairs dominated by a lighter AC that fits, %d "
           "layouts below the top %d estimated from two smaller local batches (--exact: run)\n",
           R.shape_runs, R.dominated, est, K);
  }
  rc = SB_EXIT_OK;
  if (R.failed) {
    fprintf(stderr, "shardbench plan: %d shape-only run(s) failed; first: %s\n", R.failed,
            R.first_failure);
    rc = SB_EXIT_FAIL;
  }
  if (bad_verify) rc = SB_EXIT_FAIL;
  if (a.db) {
    if (store_rows(&st, argc, argv, &a, &hw, &R)) rc = SB_EXIT_FAIL;
    sb_store_close(&st);
  }
  free(R.v);
  sb_hw_free(&hw);
  return rc;
}
