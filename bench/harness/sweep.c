/* bench/harness/sweep.c: `shardbench sweep`: every mesh shape x plan x workload x dtype
 * (x model) for one world size, into the results DB.
 *
 *   shardbench sweep --world 8 [--models debugmodel] [--plans all|a,b]
 *                    [--workloads block,model] [--dtypes f32] [--batch 8] [--seq 32]
 *                    [--steps 2] [--warmup 1] [--db results/shardbench.db] [--resume]
 *                    [--backend threads|mpi] [--peak-tflops X] [--plans-dir DIR]
 *                    [--shapes dp_shard:2,tp:4/cp:8]
 *
 * Mesh shapes: every ordered factorisation of the world into TorchTitan's
 * (pp, dp_replicate, dp_shard, cp, tp) (all 5-tuples of divisors whose product is
 * the world: 35 for world 8). Each config goes through bench/harness/run.c's runner
 * (sb_execute): unsupported ones are recorded as skipped with the reason, at no
 * cost. Isolation (threads backend): each config that runs does so in a forked
 * child process that hands its result back through a pipe, so a crash (a signal,
 * an abort) is recorded as that config's failure and the sweep goes on; the
 * child dies with the sweep (PR_SET_PDEATHSIG) so a killed sweep leaves no
 * orphan to write late. The unsharded reference is computed once per (model,
 * workload, dtype, batch, seq, steps) in the parent before forking, and
 * inherited. Only the parent writes the DB: one transaction per config
 * (bench/harness/store.c), so a SIGKILL loses no finished row and leaves no half row;
 * --resume skips configs that already have a result row (any status, any run)
 * by config key. Under --backend mpi every process walks the same list, rank 0
 * decides the resume skips (broadcast) and alone writes the DB; no fork.
 *
 * Before any config runs: every flag, every selected plan (parsed, its patterns
 * matched against each model's modules) and the DB are checked (bad input: one
 * line, exit 2, nothing written); the MFU peak is measured once and stored on
 * the run's row (sb_store_begin_run). A config whose estimated memory is over the
 * limit is recorded as skipped with both numbers.
 *
 * Progress on stderr: one line redrawn with \r when stderr is a terminal, else
 * one line per config. Exit: 0 when every config is ok or skipped, 1 when one
 * mismatched or failed (or a DB write failed), 2 on bad input.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "cli.h"
#include "store.h"

/* Lists (--models, --plans, ...) hold at most this many names. */
enum { MAX_LIST = 32 };
/* Ordered 5-factorisations of a world <= 1024 number far fewer than this
 * (1024 = 2^10: C(14, 4) = 1001). */
enum { MAX_SHAPES = 4096 };

const char sb_sweep_usage[] =
    "usage: shardbench sweep --world N [--models debugmodel] [--plans all|a,b]\n"
    "                        [--workloads block,model] [--dtypes f32[,f64]] [--batch 8]\n"
    "                        [--seq 32] [--steps 2] [--warmup 1]\n"
    "                        [--db results/shardbench.db] [--resume]\n"
    "                        [--backend threads|mpi] [--peak-tflops X] [--plans-dir DIR]\n"
    "                        [--mem-limit BYTES | --no-mem-check] [--shapes S/S/...]\n"
    "                        [--device cpu|cuda|cuda-emu] [--pin-ranks]\n"
    "                        [--ac none,full,selective:2,selective:op]\n"
    "\n"
    "Runs every ordered factorisation of the world into (pp, dp_replicate, dp_shard, cp,\n"
    "tp) (or only the --shapes given, each as run's --mesh: dp_shard:2,tp:4/cp:8)\n"
    "x plans x workloads x dtypes x models with `shardbench run`'s runner and writes\n"
    "each outcome (ok, mismatch, failed, skipped with its reason) to the DB, one\n"
    "transaction per config. Each config runs in its own process (threads backend), so\n"
    "a crash is recorded and the sweep goes on. --resume skips configs that already have\n"
    "a result in the DB. Defaults (batch 8, seq 32, 2 timed steps after 1 warm-up) keep\n"
    "a world-8 debugmodel sweep of every shipped plan to a few minutes on 2 cores.\n"
    "Under mpirun (--backend mpi) the world is the number of processes; rank 0 writes.\n"
    "Before any config runs, every plan (NAME in --plans-dir, or a path) is parsed and\n"
    "its patterns matched against each model's modules: a broken plan is bad input.\n"
    "The MFU peak (--peak-tflops, else a 1-core sgemm rate x min(world, CPUs)) is\n"
    "measured once and stored with the run. A config whose estimated memory is over\n"
    "--mem-limit (default: the machine's available memory) is recorded as skipped with\n"
    "both numbers; --no-mem-check runs it anyway.\n"
    "Workloads: model (the config's layers), block (one layer), and one layer type\n"
    "alone, to isolate its cost and communication: embedding (tok_embeddings), attention\n"
    "(x + attention(attention_norm(x))), feed_forward (x + feed_forward(ffn_norm(x))),\n"
    "output (norm + output + the cross-entropy loss); see `shardbench run --help`. They\n"
    "skip pp > 1 (one layer has no stages to split).\n"
    "--device cpu|cuda|cuda-emu: where every config's sharded job computes, as run's\n"
    "--device (it joins each config's key off the CPU); --dtypes bf16 needs a device.\n"
    "--pin-ranks: pin each config's rank threads to cores, as run's --pin-ranks.\n"
    "--ac LIST: each config once per activation checkpointing setting (run's --ac;\n"
    "selective alone is TorchTitan's default selective:2); default: each plan's own.\n"
    "\n"
    "Exit: 0 all ok or skipped, 1 a mismatch or failure, 2 bad input (flags, a plan,\n"
    "the DB).\n";

typedef struct list {
  int n;
  char v[MAX_LIST][64];
} list;

static int split_list(const char *s, list *l, char *err, size_t errn) {
  l->n = 0;
  const char *p = s;
  for (;;) {
    size_t k = strcspn(p, ",");
    if (k == 0 || k >= sizeof l->v[0]) {
      snprintf(err, errn, "expected names joined by ',', got '%s'", s);
      return -1;
    }
    if (l->n == MAX_LIST) {
      snprintf(err, errn, "more than %d names in '%s'", MAX_LIST, s);
      return -1;
    }
    memcpy(l->v[l->n], p, k);
    l->v[l->n][k] = '\0';
    for (int i = 0; i < l->n; i++)
      if (!strcmp(l->v[i], l->v[l->n])) {
        snprintf(err, errn, "'%s' appears twice", l->v[i]);
        return -1;
      }
    l->n++;
    if (!p[k]) break;
    p += k + 1;
  }
  return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(a, b); }

/* Every NAME.plan in dir, sorted. */
static int all_plans(const char *dir, list *l) {
  DIR *d = opendir(dir);
  l->n = 0;
  if (!d) return -1;
  struct dirent *e;
  while ((e = readdir(d)) != NULL && l->n < MAX_LIST) {
    size_t n = strlen(e->d_name);
    if (n > 5 && n - 5 < sizeof l->v[0] && !strcmp(e->d_name + n - 5, ".plan")) {
      memcpy(l->v[l->n], e->d_name, n - 5);
      l->v[l->n][n - 5] = '\0';
      l->n++;
    }
  }
  closedir(d);
  qsort(l->v, (size_t)l->n, sizeof l->v[0], cmp_str);
  return 0;
}

/* All 5-tuples of divisors with product `rest`, in lexicographic order. */
static void factor(int rest, int d, int cur[SB_NDIMS], int (*out)[SB_NDIMS], int *n) {
  if (d == SB_NDIMS - 1) {
    cur[d] = rest;
    if (*n < MAX_SHAPES) memcpy(out[(*n)++], cur, sizeof(int) * SB_NDIMS);
    return;
  }
  for (int f = 1; f <= rest; f++)
    if (rest % f == 0) {
      cur[d] = f;
      factor(rest / f, d + 1, cur, out, n);
    }
}

/* ---- one config in a child process ----------------------------------------------- */

static int write_all(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

static size_t read_all(int fd, void *buf, size_t n) {
  char *p = buf;
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, p + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  return got;
}

/* Runs o in a child; r gets its result, or "failed" with how the child died. */
static void run_isolated(const sb_opts *o, sb_ref *cache, sb_result *r) {
  int fd[2];
  sb_result_init(r);
  fflush(stdout);
  fflush(stderr);
  if (pipe(fd) != 0) {
    snprintf(r->status, sizeof r->status, "failed");
    snprintf(r->reason, sizeof r->reason, "pipe: %s", strerror(errno));
    return;
  }
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    close(fd[0]);
    close(fd[1]);
    snprintf(r->status, sizeof r->status, "failed");
    snprintf(r->reason, sizeof r->reason, "fork: %s", strerror(errno));
    return;
  }
  if (pid == 0) {
    close(fd[0]);
#ifdef __linux__
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* a killed sweep takes its config with it */
#endif
    if (getppid() != parent) _exit(3); /* the sweep died before prctl */
    sb_result cr;
    sb_execute(o, cache, SB_STAGE_RUN, &cr);
    int rc = write_all(fd[1], &cr, sizeof cr) ||
             (cr.n_comm > 0 && write_all(fd[1], cr.comm, sizeof *cr.comm * (size_t)cr.n_comm)) ||
             (cr.pp && write_all(fd[1], cr.pp, sb_pp_timeline_bytes(cr.pp->n_events)));
    _exit(rc ? 3 : 0);
  }
  close(fd[1]);
  size_t got = read_all(fd[0], r, sizeof *r);
  bool whole = got == sizeof *r;
  r->comm = NULL;
  const bool has_pp = r->pp != NULL; /* the child's pointer: whether a timeline follows */
  r->pp = NULL;
  if (whole && r->n_comm > 0) {
    r->comm = malloc(sizeof *r->comm * (size_t)r->n_comm);
    size_t want = sizeof *r->comm * (size_t)r->n_comm;
    if (!r->comm || read_all(fd[0], r->comm, want) != want) whole = false;
  }
  if (whole && has_pp) { /* the fixed part, then its events */
    sb_pp_timeline head;
    whole = read_all(fd[0], &head, sizeof head) == sizeof head && head.n_events >= 0;
    r->pp = whole ? malloc(sb_pp_timeline_bytes(head.n_events)) : NULL;
    const size_t rest = whole ? sizeof(sb_pp_event) * (size_t)head.n_events : 0;
    if (!r->pp || read_all(fd[0], r->pp->events, rest) != rest) whole = false;
    else memcpy(r->pp, &head, sizeof head);
  }
  close(fd[0]);
  int ws = 0;
  while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
  }
  if (!whole || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
    sb_result_free(r);
    sb_result_init(r);
    snprintf(r->status, sizeof r->status, "failed");
    if (WIFSIGNALED(ws))
      snprintf(r->reason, sizeof r->reason, "the config's process died of signal %d (%s)",
               WTERMSIG(ws), strsignal(WTERMSIG(ws)));
    else
      snprintf(r->reason, sizeof r->reason, "the config's process exited %d without a result",
               WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
  }
}

/* ---- MPI: rank 0's decision to every rank --------------------------------------- */

typedef struct bcast_arg {
  int64_t v;
} bcast_arg;

static dt_status bcast_rank(dt_ctx *ctx, void *arg) {
  bcast_arg *b = arg;
  return dt_comm_broadcast(ctx->world, &b->v, 1, DT_I64, 0);
}

static int64_t mpi_bcast(int64_t v) {
  dt_launch_opts lo;
  memset(&lo, 0, sizeof lo);
  lo.backend = DT_BACKEND_MPI;
  lo.no_ledger = true;
  bcast_arg b = {v};
  if (dt_launch(&lo, bcast_rank, &b, NULL) != DT_OK) return -1;
  return b.v;
}

/* ---- progress ------------------------------------------------------------------------- */

static void fmt_dur(double s, char *buf, size_t n) {
  if (!isfinite(s) || s < 0) snprintf(buf, n, "?");
  else if (s < 60) snprintf(buf, n, "%.0fs", s);
  else if (s < 3600) snprintf(buf, n, "%dm%02ds", (int)s / 60, (int)s % 60);
  else snprintf(buf, n, "%dh%02dm", (int)s / 3600, (int)s / 60 % 60);
}

static void progress(bool tty, int done, int total, double t0, const char *status,
                     const char *key) {
  double el = dt_now() - t0;
  char eta[32], els[32];
  fmt_dur(done ? el / done * (total - done) : NAN, eta, sizeof eta);
  fmt_dur(el, els, sizeof els);
  int pct = total ? 100 * done / total : 100;
  if (tty) {
    /* One line of at most ~120 columns, redrawn: bar, counts, ETA, the key's head. */
    enum { BAR = 24 };
    char bar[BAR + 1];
    int fill = total ? BAR * done / total : BAR;
    for (int i = 0; i < BAR; i++) bar[i] = i < fill ? '#' : '.';
    bar[BAR] = '\0';
    fprintf(stderr, "\r[%s] %d/%d %3d%% %s ETA %s  %-8s %.60s\033[K", bar, done, total, pct, els,
            eta, status, key);
    if (done == total) fputc('\n', stderr);
  } else {
    fprintf(stderr, "[%d/%d %3d%% %s ETA %s] %s %s\n", done, total, pct, els, eta, status, key);
  }
  fflush(stderr);
}

/* ---- the command -------------------------------------------------------------------- */

typedef struct sweep_args {
  long world, batch, seq, steps, warmup;
  const char *models_s, *plans_s, *workloads_s, *dtypes_s, *db, *backend_s, *plans_flag;
  const char *shapes_s; /* --shapes: NULL, every factorisation */
  const char *device_s; /* --device: cpu, cuda, cuda-emu */
  const char *peak_s, *mem_s;
  const char *ac_s;     /* --ac: NULL, each plan's own */
  bool resume, no_mem_check, pin_ranks;
} sweep_args;

/* What the sweep walks: the lists, the plans' files, the mesh shapes. */
typedef struct sweep_space {
  list models, plans, workloads, dtypes;
  char plan_path[MAX_LIST][1024];
  int nshapes;
  int (*shapes)[SB_NDIMS];
  int total;
  int n_ac;                          /* --ac settings (0: each plan's own, plan_ac) */
  dt_ac_config ac[MAX_LIST], plan_ac[MAX_LIST];
} sweep_space;

/* Outcomes so far. */
typedef struct tally {
  int ok, mis, fail, skip, resumed, done;
  bool db_err;
} tally;

enum { O_WORLD = 256, O_MODELS, O_PLANS, O_WORKLOADS, O_DTYPES, O_BATCH, O_SEQ, O_STEPS,
       O_WARMUP, O_DB, O_RESUME, O_BACKEND, O_PEAK, O_MEMLIM, O_NOMEM, O_PLANSDIR, O_SHAPES,
       O_DEVICE, O_PIN, O_AC, O_HELP };
static const struct option sweep_lopts[] = {
    {"world", required_argument, NULL, O_WORLD},
    {"models", required_argument, NULL, O_MODELS},
    {"plans", required_argument, NULL, O_PLANS},
    {"workloads", required_argument, NULL, O_WORKLOADS},
    {"dtypes", required_argument, NULL, O_DTYPES},
    {"batch", required_argument, NULL, O_BATCH},
    {"seq", required_argument, NULL, O_SEQ},
    {"steps", required_argument, NULL, O_STEPS},
    {"warmup", required_argument, NULL, O_WARMUP},
    {"db", required_argument, NULL, O_DB},
    {"resume", no_argument, NULL, O_RESUME},
    {"backend", required_argument, NULL, O_BACKEND},
    {"peak-tflops", required_argument, NULL, O_PEAK},
    {"mem-limit", required_argument, NULL, O_MEMLIM},
    {"no-mem-check", no_argument, NULL, O_NOMEM},
    {"plans-dir", required_argument, NULL, O_PLANSDIR},
    {"shapes", required_argument, NULL, O_SHAPES},
    {"device", required_argument, NULL, O_DEVICE},
    {"pin-ranks", no_argument, NULL, O_PIN},
    {"ac", required_argument, NULL, O_AC},
    {"help", no_argument, NULL, O_HELP},
    {NULL, 0, NULL, 0}};

/* The flags into a, with their defaults; 0, -1 after --help, or SB_EXIT_USAGE. */
static int sweep_parse(int argc, char **argv, sweep_args *a) {
  static const char CMD[] = "sweep";
  *a = (sweep_args){.batch = 8, .seq = 32, .steps = 2, .warmup = 1, .models_s = "debugmodel",
                    .plans_s = "all", .workloads_s = "block,model", .dtypes_s = "f32",
                    .db = "results/shardbench.db", .backend_s = "threads",
                    .device_s = "cpu"};
  int rc = sb_getopt_repeats(CMD, argc, argv, ":", sweep_lopts, NULL);
  if (rc) return rc;
  char err[SB_ERR_LEN];
  int ch;
  while ((ch = getopt_long(argc, argv, ":", sweep_lopts, NULL)) != -1) {
    switch (ch) {
    case O_WORLD: case O_BATCH: case O_SEQ: case O_STEPS: case O_WARMUP: {
      long lo = ch == O_WARMUP ? 0 : 1, v,
           hi = ch == O_WORLD ? SB_MAX_WORLD : ch == O_STEPS || ch == O_WARMUP ? SB_MAX_STEPS
                                                                               : 1 << 20;
      char flag[40];
      snprintf(flag, sizeof flag, "--%s", sweep_lopts[ch - O_WORLD].name);
      if (sb_parse_long(optarg, lo, hi, &v, err, sizeof err) != DT_OK)
        return sb_usage_error(CMD, flag, "%s", err);
      *(ch == O_WORLD ? &a->world : ch == O_BATCH ? &a->batch : ch == O_SEQ ? &a->seq
        : ch == O_STEPS ? &a->steps : &a->warmup) = v;
      break;
    }
    case O_MODELS: a->models_s = optarg; break;
    case O_PLANS: a->plans_s = optarg; break;
    case O_WORKLOADS: a->workloads_s = optarg; break;
    case O_DTYPES: a->dtypes_s = optarg; break;
    case O_DB: a->db = optarg; break;
    case O_RESUME: a->resume = true; break;
    case O_BACKEND: a->backend_s = optarg; break;
    case O_PLANSDIR: a->plans_flag = optarg; break;
    case O_SHAPES: a->shapes_s = optarg; break;
    case O_DEVICE: a->device_s = optarg; break;
    case O_PEAK: a->peak_s = optarg; break;
    case O_MEMLIM: a->mem_s = optarg; break;
    case O_NOMEM: a->no_mem_check = true; break;
    case O_PIN: a->pin_ranks = true; break;
    case O_AC: a->ac_s = optarg; break;
    case O_HELP: fputs(sb_sweep_usage, stdout); return -1;
    default: return sb_getopt_error(CMD, ch, argv, sweep_lopts);
    }
  }
  if (optind < argc) return sb_usage_error(CMD, NULL, "unexpected argument '%s'", argv[optind]);
  return 0;
}

/* --models, --workloads, --dtypes: split and each name checked. */
static int sweep_lists(const sweep_args *a, sweep_space *sp) {
  static const char CMD[] = "sweep";
  char err[SB_ERR_LEN];
  if (split_list(a->models_s, &sp->models, err, sizeof err))
    return sb_usage_error(CMD, "--models", "%s", err);
  for (int i = 0; i < sp->models.n; i++)
    if (sb_check_model(CMD, "--models", sp->models.v[i])) return SB_EXIT_USAGE;
  if (split_list(a->workloads_s, &sp->workloads, err, sizeof err))
    return sb_usage_error(CMD, "--workloads", "%s", err);
  for (int i = 0; i < sp->workloads.n; i++)
    if (sb_check_workload(CMD, "--workloads", sp->workloads.v[i])) return SB_EXIT_USAGE;
  if (split_list(a->dtypes_s, &sp->dtypes, err, sizeof err))
    return sb_usage_error(CMD, "--dtypes", "%s", err);
  const char *flag;
  if (strlen(a->device_s) >= sizeof ((sb_opts *)0)->device)
    return sb_usage_error(CMD, "--device", "expected cpu, cuda or cuda-emu, got '%s'", a->device_s);
  for (int i = 0; i < sp->dtypes.n; i++) {
    if (strcmp(sp->dtypes.v[i], "f32") && strcmp(sp->dtypes.v[i], "f64") &&
        strcmp(sp->dtypes.v[i], "bf16"))
      return sb_usage_error(CMD, "--dtypes", "expected f32, f64 or bf16, got '%s'",
                            sp->dtypes.v[i]);
    if (sb_check_device(a->device_s, sp->dtypes.v[i], &flag, err, sizeof err))
      return sb_usage_error(CMD, !strcmp(flag, "--dtype") ? "--dtypes" : flag, "%s", err);
  }
  if (a->ac_s) {
    list acs;
    if (split_list(a->ac_s, &acs, err, sizeof err)) return sb_usage_error(CMD, "--ac", "%s", err);
    for (int i = 0; i < acs.n; i++)
      if (sb_parse_ac(CMD, "--ac", acs.v[i], &sp->ac[i])) return SB_EXIT_USAGE;
    sp->n_ac = acs.n;
  }
  return 0;
}

/* --plans: the names (or paths) and their files, every one parsed and its
 * patterns matched against every model's modules before any config runs. */
static int sweep_plans(const sweep_args *a, sweep_space *sp) {
  static const char CMD[] = "sweep";
  char err[SB_ERR_LEN], dir[768];
  sb_plans_dir(a->plans_flag, dir, sizeof dir);
  list given;
  if (!strcmp(a->plans_s, "all")) {
    if (all_plans(dir, &given) || given.n == 0)
      return sb_usage_error(CMD, "--plans", "no NAME.plan files in '%s' (see --plans-dir)", dir);
  } else if (split_list(a->plans_s, &given, err, sizeof err)) {
    return sb_usage_error(CMD, "--plans", "%s", err);
  }
  const char *models[MAX_LIST];
  for (int i = 0; i < sp->models.n; i++) models[i] = sp->models.v[i];
  sp->plans.n = given.n;
  for (int i = 0; i < given.n; i++) {
    if (sb_plan_locate(dir, given.v[i], sp->plan_path[i], sizeof sp->plan_path[i], sp->plans.v[i],
                       sizeof sp->plans.v[i], err, sizeof err))
      return sb_usage_error(CMD, "--plans", "%s", err);
    int rc = sb_plan_validate(CMD, "--plans", sp->plan_path[i], models, sp->models.n);
    if (rc) return rc;
    sb_plan_ac(sp->plan_path[i], &sp->plan_ac[i]);
  }
  return 0;
}

/* Every check before any work; under MPI it joins the job (rank). */
static int sweep_check(sweep_args *a, sweep_space *sp, sb_opts *lim, dt_backend *be, int *rank,
                       int *argc, char ***argv) {
  static const char CMD[] = "sweep";
  if (dt_backend_parse(a->backend_s, be) != DT_OK)
    return sb_usage_error(CMD, "--backend", "expected threads or mpi, got '%s'", a->backend_s);
  if (!dt_backend_available(*be))
    return sb_usage_error(CMD, "--backend", "'%s' is not built into this shardbench", a->backend_s);
  int rc = sweep_lists(a, sp);
  if (!rc) rc = sweep_plans(a, sp);
  if (!rc) rc = sb_limits_from_flags(CMD, a->peak_s, a->mem_s, a->no_mem_check, lim);
  if (rc) return rc;
  lim->pin_ranks = a->pin_ranks;
  if (*be == DT_BACKEND_MPI) {
    if (dt_mpi_init(argc, argv) != DT_OK)
      return sb_usage_error(CMD, "--backend", "MPI could not be initialised");
    *rank = dt_mpi_rank();
    if (a->world && a->world != dt_mpi_size())
      return sb_usage_error(CMD, "--world", "%ld, but mpirun started %d processes", a->world,
                            dt_mpi_size());
    a->world = dt_mpi_size();
  }
  if (!a->world) return sb_usage_error(CMD, "--world", "required (the number of ranks)");
  if (sb_fault_check(CMD, *rank == 0)) return SB_EXIT_USAGE; /* TEST SWITCH (run.c) */
  static int shapes[MAX_SHAPES][SB_NDIMS];
  int cur[SB_NDIMS];
  sp->nshapes = 0;
  sp->shapes = shapes;
  if (a->shapes_s) {
    /* --shapes S/S/...: each S as run's --mesh, its product the world, each once */
    const char *q = a->shapes_s;
    char one[256], err[SB_ERR_LEN];
    for (;;) {
      size_t k = strcspn(q, "/");
      if (k == 0 || k >= sizeof one)
        return sb_usage_error(CMD, "--shapes", "expected meshes joined by '/' (e.g. "
                              "dp_shard:2,tp:4/cp:8), got '%s'", a->shapes_s);
      memcpy(one, q, k);
      one[k] = '\0';
      int *d = shapes[sp->nshapes];
      if (sb_parse_mesh_named(one, d, err, sizeof err))
        return sb_usage_error(CMD, "--shapes", "'%s': %s", one, err);
      long prod = 1;
      for (int i = 0; i < SB_NDIMS; i++) prod *= d[i];
      if (prod != a->world)
        return sb_usage_error(CMD, "--shapes", "'%s' has %ld ranks, the world is %ld", one, prod,
                              a->world);
      for (int j = 0; j < sp->nshapes; j++)
        if (!memcmp(shapes[j], d, sizeof shapes[j]))
          return sb_usage_error(CMD, "--shapes", "'%s' given twice", one);
      if (++sp->nshapes == MAX_SHAPES && q[k])
        return sb_usage_error(CMD, "--shapes", "more than %d shapes", MAX_SHAPES);
      if (!q[k]) break;
      q += k + 1;
    }
  } else {
    factor((int)a->world, 0, cur, shapes, &sp->nshapes);
  }
  sp->total = sp->models.n * sp->workloads.n * sp->dtypes.n * sp->nshapes * sp->plans.n *
              (sp->n_ac ? sp->n_ac : 1);
  return 0;
}

/* Rank 0: the DB, this invocation's runs row and its MFU peak, measured once. */
static int sweep_open(const sweep_args *a, sb_store *st, sb_opts *lim, int argc, char **argv) {
  int rc = sb_store_open(st, a->db, "sweep");
  if (rc) return rc;
  if (!(lim->peak_tflops > 0))
    /* on a GPU, the first dtype's GEMM rate (one peak per invocation) */
    lim->peak_tflops = sb_default_peak_tflops_on((int)a->world, a->device_s,
                                                 a->dtypes_s && !strncmp(a->dtypes_s, "bf16", 4)
                                                     ? "bf16" : "f32",
                                                 lim->peak_source, sizeof lim->peak_source);
  if (sb_store_begin_run(st, argc, argv, a->backend_s, (int)a->world, lim->peak_tflops,
                         lim->peak_source)) {
    sb_store_close(st);
    return SB_EXIT_FAIL;
  }
  return 0;
}

/* One config: resumed, or checked, run (in a child process on threads) and stored. */
static void sweep_config(const sweep_args *a, const sb_opts *o, sb_ref *ref, sb_store *st,
                         bool mpi, int rank, double t0, int total, tally *t) {
  const bool tty = isatty(STDERR_FILENO);
  sb_config c;
  sb_config_fill(o, &c);
  t->done++;
  if (a->resume) {
    bool has = false;
    if (rank == 0 && sb_store_has_result(st, c.key, &has)) t->db_err = true;
    if (mpi) has = mpi_bcast(has) != 0;
    if (has) {
      t->resumed++;
      if (rank == 0) progress(tty, t->done, total, t0, "done", c.key);
      return;
    }
  }
  sb_result r;
  sb_execute(o, ref, SB_STAGE_PREPARE, &r); /* checks and the reference only */
  if (!r.status[0]) {
    if (!mpi) run_isolated(o, ref, &r);
    else sb_execute(o, ref, SB_STAGE_RUN, &r);
  }
  if (!strcmp(r.status, "ok")) t->ok++;
  else if (!strcmp(r.status, "mismatch")) t->mis++;
  else if (!strcmp(r.status, "skipped")) t->skip++;
  else t->fail++;
  if (rank == 0) {
    if (sb_store_put(st, &c, &r)) t->db_err = true;
    progress(tty, t->done, total, t0, r.status, c.key);
  }
  sb_result_free(&r);
}

/* Every config of the space, in order: model, workload, dtype, mesh shape, plan, AC. */
static void sweep_all(const sweep_args *a, const sweep_space *sp, const sb_opts *lim, sb_store *st,
                      bool mpi, int rank, tally *t) {
  sb_ref ref;
  memset(&ref, 0, sizeof ref);
  const double t0 = dt_now();
  for (int mi = 0; mi < sp->models.n; mi++)
    for (int wi = 0; wi < sp->workloads.n; wi++)
      for (int di = 0; di < sp->dtypes.n; di++)
        for (int si = 0; si < sp->nshapes; si++)
          for (int pi = 0; pi < sp->plans.n; pi++)
          for (int ai = 0; ai < (sp->n_ac ? sp->n_ac : 1); ai++) {
            sb_opts o = *lim; /* the peak and the memory limit */
            o.ac = sp->n_ac ? sp->ac[ai] : sp->plan_ac[pi];
            snprintf(o.model, sizeof o.model, "%s", sp->models.v[mi]);
            snprintf(o.workload, sizeof o.workload, "%s", sp->workloads.v[wi]);
            snprintf(o.dtype, sizeof o.dtype, "%s", sp->dtypes.v[di]);
            snprintf(o.plan, sizeof o.plan, "%s", sp->plans.v[pi]);
            snprintf(o.plan_path, sizeof o.plan_path, "%s", sp->plan_path[pi]);
            snprintf(o.backend, sizeof o.backend, "%s", a->backend_s);
            snprintf(o.device, sizeof o.device, "%s", a->device_s);
            memcpy(o.dims, sp->shapes[si], sizeof o.dims);
            o.batch = (int)a->batch;
            o.seq = (int)a->seq;
            o.steps = (int)a->steps;
            o.warmup = (int)a->warmup;
            o.world = (int)a->world;
            sweep_config(a, &o, &ref, st, mpi, rank, t0, sp->total, t);
          }
  sb_ref_free(&ref);
}

int sb_cmd_sweep(int argc, char **argv) {
  sweep_args a;
  sweep_space sp;
  sb_opts lim;
  memset(&sp, 0, sizeof sp);
  memset(&lim, 0, sizeof lim);
  dt_backend be;
  int rank = 0;
  int rc = sweep_parse(argc, argv, &a);
  if (rc) return rc < 0 ? SB_EXIT_OK : rc;
  if ((rc = sweep_check(&a, &sp, &lim, &be, &rank, &argc, &argv))) return rc;
  sb_store st;
  memset(&st, 0, sizeof st);
  if (rank == 0 && (rc = sweep_open(&a, &st, &lim, argc, argv))) return rc;
  if (rank == 0)
    fprintf(stderr, "shardbench sweep: world %ld, %d mesh shapes x %d plans x %d workloads x %d "
                    "dtypes x %d models = %d configs -> %s%s; MFU peak %.4g TFLOP/s (%s)\n",
            a.world, sp.nshapes, sp.plans.n, sp.workloads.n, sp.dtypes.n, sp.models.n, sp.total,
            a.db, a.resume ? " (resume)" : "", lim.peak_tflops, lim.peak_source);
  tally t = {0};
  const double t0 = dt_now();
  sweep_all(&a, &sp, &lim, &st, be == DT_BACKEND_MPI, rank, &t);
  if (rank == 0) {
    if (sb_store_end_run(&st)) t.db_err = true;
    sb_store_close(&st);
    printf("sweep: world %ld: %d configs in %.1f s: %d ok, %d mismatch, %d failed, %d skipped, "
           "%d already in the DB -> %s\n",
           a.world, sp.total, dt_now() - t0, t.ok, t.mis, t.fail, t.skip, t.resumed, a.db);
  }
  rc = (t.mis || t.fail || t.db_err) ? SB_EXIT_FAIL : SB_EXIT_OK;
  if (be == DT_BACKEND_MPI) dt_mpi_finish(true);
  return rc;
}
