/* bench/harness/sweep.c: `shardbench sweep`: every mesh shape x plan x workload x dtype
 * (x model) for one world size, into the results DB.
 *
 *   shardbench sweep --world 8 [--models debugmodel] [--plans all|a,b]
 *                    [--workloads block,model] [--dtypes f32] [--batch 8] [--seq 32]
 *                    [--steps 2] [--warmup 1] [--db results/shardbench.db] [--resume]
 *                    [--backend threads|mpi] [--peak-tflops X] [--plans-dir DIR]
 *                    [--shapes dp_shard:2,tp:4/cp:8] [--shard I/N]
 *                    [--launcher 'mpirun -np {world}'] [--config-timeout S]
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
 * Overnight sweeps: with --launcher CMD this process is a driver that joins no
 * collective: each config runs as its own job step, `CMD shardbench sweep ...
 * --step K --step-out FILE` ({world} in CMD replaced) in its own process group,
 * whose rank 0 writes the result to FILE; the driver reads it and writes the DB.
 * Every child and step has a watchdog (--config-timeout, else default_timeout):
 * on timeout the step's group and every process below it get SIGTERM, then
 * SIGKILL, and the config is recorded "failed: timeout after S s"; a step that
 * dies is recorded with its exit status, the launcher's line naming the first
 * rank that died, and the last line shardbench printed. --shard I/N walks part I
 * of N (config k where k mod N = I - 1). The whole list (of the shard) is entered
 * into the configs table before the first config runs, so that `shardbench
 * status` (bench/harness/merge.c) counts what remains.
 *
 * Before any config runs: every flag, every selected plan (parsed, its patterns
 * matched against each model's modules) and the DB are checked (bad input: one
 * line, exit 2, nothing written); the MFU peak is measured once and stored on
 * the run's row (sb_store_begin_run). A config whose estimated memory is over the
 * limit is recorded as skipped with both numbers.
 *
 * --device meta: every config a shape-only run (sb_execute on the meta device and the
 * fake comm, one rank per role, no reference), run in this process and stored in
 * shape_runs / shape_roles / shape_comm (sb_store_put_shape), never in configs or
 * results; --resume looks its keys up there. Threads only (no --launcher, no MPI).
 *
 * Progress on stderr: one line redrawn with \r when stderr is a terminal, else
 * one line per config. Exit: 0 when every config is ok or skipped, 1 when one
 * mismatched or failed (or a DB write failed), 2 on bad input.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "baselines.h"
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
    "                        [--device cpu|cuda|cuda-emu|meta] [--pin-ranks]\n"
    "                        [--ac none,full,selective:2,selective:op]\n"
    "                        [--shard I/N] [--launcher CMD] [--config-timeout S]\n"
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
    "--device meta: every config a shape-only run (run --device meta: one rank per\n"
    "role, no reference, no timing), in this process, into the DB's shape_runs,\n"
    "shape_roles and shape_comm tables (never configs or results); threads only.\n"
    "--pin-ranks: pin each config's rank threads to cores, as run's --pin-ranks.\n"
    "--launcher CMD: this process drives, each config runs as its own job step\n"
    "`CMD shardbench sweep ... --step K` under MPI ({world} in CMD is the world:\n"
    "'mpirun -np {world}', 'srun --ntasks={world} --kill-on-bad-exit=1'); --world is needed.\n"
    "--config-timeout S: a config (threads child or step) not done after S seconds is\n"
    "killed (the whole step) and recorded failed, 'timeout after S s'; default 60 s +\n"
    "50 x its estimated work (reference and sharded FLOPs at the MFU peak).\n"
    "A config that crashes is recorded failed with its exit code or signal, the first\n"
    "rank that died (as mpirun names it) and its last stderr line; the sweep goes on.\n"
    "--shard I/N: only part I of N (config k when k mod N = I - 1), for job arrays;\n"
    "`shardbench merge` joins the parts' DBs, `shardbench status` shows progress.\n"
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

/* The result as a child or a step hands it over: the struct, its comm rows, then
 * (when r->pp) the timeline. Both ends are this same program, so the layout is
 * the struct's own. 0, or -1 when a write failed. */
static int result_write(int fd, const sb_result *cr) {
  return write_all(fd, cr, sizeof *cr) ||
         (cr->n_comm > 0 && write_all(fd, cr->comm, sizeof *cr->comm * (size_t)cr->n_comm)) ||
         (cr->pp && write_all(fd, cr->pp, sb_pp_timeline_bytes(cr->pp->n_events)))
             ? -1 : 0;
}

/* The inverse of result_write on the n bytes at buf: true when they are exactly
 * one whole result (r then owns its comm and pp). */
static bool result_parse(const char *buf, size_t n, sb_result *r) {
  sb_result_init(r);
  if (n < sizeof *r) return false;
  memcpy(r, buf, sizeof *r);
  size_t off = sizeof *r;
  const bool has_pp = r->pp != NULL; /* the writer's pointer: whether a timeline follows */
  r->comm = NULL;
  r->pp = NULL;
  if (r->n_comm < 0 || (size_t)r->n_comm > (n - off) / sizeof *r->comm) goto bad;
  if (r->n_comm > 0) {
    const size_t want = sizeof *r->comm * (size_t)r->n_comm;
    if (!(r->comm = malloc(want))) goto bad;
    memcpy(r->comm, buf + off, want);
    off += want;
  }
  if (has_pp) {
    sb_pp_timeline head;
    if (n - off < sizeof head) goto bad;
    memcpy(&head, buf + off, sizeof head);
    if (head.n_events < 0 ||
        (size_t)head.n_events > (n - off - sizeof head) / sizeof(sb_pp_event))
      goto bad;
    const size_t all = sb_pp_timeline_bytes(head.n_events);
    if (!(r->pp = malloc(all))) goto bad;
    memcpy(r->pp, buf + off, all);
    off += all;
  }
  if (off == n) return true;
bad:
  sb_result_free(r);
  sb_result_init(r);
  return false;
}

/* Reads fd to its end into *buf (malloc'd, *len bytes) until deadline (dt_now()
 * seconds): 0 at the end, 1 when the deadline passed first, -1 on an error. */
static int read_until(int fd, double deadline, char **buf, size_t *len) {
  size_t cap = 1 << 16;
  *len = 0;
  *buf = malloc(cap);
  if (!*buf) return -1;
  for (;;) {
    const double left = deadline - dt_now();
    if (left <= 0) return 1;
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    int pr = poll(&pf, 1, left > 3600 ? 3600000 : (int)ceil(left * 1000));
    if (pr < 0 && errno == EINTR) continue;
    if (pr < 0) return -1;
    if (pr == 0) continue; /* the deadline is checked above */
    if (*len == cap) {
      char *g = realloc(*buf, cap *= 2);
      if (!g) return -1;
      *buf = g;
    }
    ssize_t got = read(fd, *buf + *len, cap - *len);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return -1;
    if (got == 0) return 0;
    *len += (size_t)got;
  }
}

/* Where a sweep keeps each config's stderr and (--launcher) its result file:
 * a private directory under $TMPDIR, removed at the end. */
typedef struct scratch {
  char dir[512], err[600], res[600];
} scratch;

static int scratch_make(scratch *sc) {
  const char *t = getenv("TMPDIR");
  snprintf(sc->dir, sizeof sc->dir, "%s/shardbench-sweep-XXXXXX", t && t[0] ? t : "/tmp");
  if (!mkdtemp(sc->dir)) return -1;
  snprintf(sc->err, sizeof sc->err, "%s/config.err", sc->dir);
  snprintf(sc->res, sizeof sc->res, "%s/config.res", sc->dir);
  return 0;
}

static void scratch_remove(scratch *sc) {
  if (!sc->dir[0]) return;
  unlink(sc->err);
  unlink(sc->res);
  char tmp[640];
  snprintf(tmp, sizeof tmp, "%s.tmp", sc->res);
  unlink(tmp);
  rmdir(sc->dir);
  sc->dir[0] = '\0';
}

/* Copies the config's stderr file to ours (what the config printed stays visible)
 * and keeps the line that says most about a death in last: the last line from
 * shardbench itself (a rank's own message), else the last non-blank one that is
 * not a rule of dashes; the launcher's line on the first rank that died goes into
 * first (mpirun: "... noticed that process rank R ... exited on signal N", srun:
 * "srun: error: NODE: task R: ..."). */
static void stderr_tail(const char *path, char *last, size_t ln, char *first, size_t fn) {
  last[0] = first[0] = '\0';
  FILE *f = fopen(path, "r");
  if (!f) return;
  char line[1024], any[1024] = "";
  while (fgets(line, sizeof line, f)) {
    fputs(line, stderr);
    line[strcspn(line, "\r\n")] = '\0';
    const char *p = line + strspn(line, " \t");
    if (!*p || strspn(p, "-=") == strlen(p)) continue;
    const bool death = strstr(p, "noticed that process rank") || /* mpirun */
                       (!strncmp(p, "srun: error:", 12) && strstr(p, "task"));   /* srun */
    if (death && !first[0]) snprintf(first, fn, "%.*s", (int)fn - 1, p);
    else if (!strncmp(p, "shardbench", 10)) snprintf(last, ln, "%.*s", (int)ln - 1, p);
    snprintf(any, sizeof any, "%s", p);
  }
  if (!last[0]) snprintf(last, ln, "%.*s", (int)ln - 1, any);
  fclose(f);
  fflush(stderr);
}

/* r as "failed" with how the process ended and its stderr's telling lines. */
static void record_death(sb_result *r, const char *who, int ws, bool timed_out, double timeout,
                         const char *errpath) {
  char last[300], first[300], how[160];
  stderr_tail(errpath, last, sizeof last, first, sizeof first);
  sb_result_free(r);
  sb_result_init(r);
  snprintf(r->status, sizeof r->status, "failed");
  if (timed_out)
    snprintf(how, sizeof how, "timeout after %.0f s (%s killed)", timeout, who);
  else if (WIFSIGNALED(ws))
    snprintf(how, sizeof how, "%s died of signal %d (%s)", who, WTERMSIG(ws),
             strsignal(WTERMSIG(ws)));
  else
    snprintf(how, sizeof how, "%s exited %d without a result", who,
             WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
  snprintf(r->reason, sizeof r->reason, "%.150s%s%.160s%s%.160s", how, first[0] ? "; " : "", first,
           last[0] && !timed_out ? "; last stderr line: " : "", timed_out ? "" : last);
}

static void nap_ms(long ms) {
  struct timespec ts = {ms / 1000, ms % 1000 * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* The processes descended from pid (from /proc's ppid links), at most max, into
 * out; their number. A launcher's ranks need not share its process group
 * (mpirun gives each rank its own), so a timeout ends them by pid as well. */
static int descendants(pid_t pid, pid_t *out, int max) {
  int n = 0;
#ifdef __linux__
  enum { MAXP = 1 << 16 }; /* processes scanned: pid_max's default is 32768 (4 M on big hosts) */
  static pid_t ps[MAXP], pp[MAXP];
  int np = 0;
  DIR *d = opendir("/proc");
  struct dirent *e;
  while (d && (e = readdir(d)) != NULL && np < MAXP) {
    char path[300], buf[512];
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    size_t got = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[got] = '\0';
    const char *rp = strrchr(buf, ')'); /* the name may hold spaces: after its ')' */
    int ppid;
    char st;
    if (rp && sscanf(rp + 1, " %c %d", &st, &ppid) == 2) {
      ps[np] = (pid_t)atoi(e->d_name);
      pp[np++] = (pid_t)ppid;
    }
  }
  if (d) closedir(d);
  /* breadth first from pid: out grows while it is walked */
  for (int head = -1; head < n; head++) {
    const pid_t parent = head < 0 ? pid : out[head];
    for (int i = 0; i < np && n < max; i++)
      if (pp[i] == parent) out[n++] = ps[i];
  }
#else
  (void)pid;
  (void)out;
  (void)max;
#endif
  return n;
}

/* Ends pid's process group and every process below pid: SIGTERM (a launcher
 * passes it on to its ranks and cleans up), then SIGKILL after a grace period
 * (a stopped or stuck rank ignores SIGTERM), and reaps pid. */
static void kill_group(pid_t pid, int *ws) {
  enum { GRACE_MS = 3000, MAXD = 1024 };
  static pid_t below[MAXD];
  int nb = descendants(pid, below, MAXD);
  kill(-pid, SIGTERM);
  for (int i = 0; i < nb; i++) kill(below[i], SIGTERM);
  bool reaped = false;
  for (int waited = 0; waited < GRACE_MS && !reaped; waited += 20) {
    reaped = waitpid(pid, ws, WNOHANG) == pid;
    if (!reaped) nap_ms(20);
  }
  kill(-pid, SIGKILL);
  for (int i = 0; i < nb; i++) kill(below[i], SIGKILL);
  if (!reaped)
    while (waitpid(pid, ws, 0) < 0 && errno == EINTR) {
    }
}

/* In a forked child before it works or execs: its own process group (so that a
 * timeout ends it and everything it started), death with the sweep
 * (PR_SET_PDEATHSIG: a killed sweep leaves no orphan to write late), stdout
 * and stderr to errpath. */
static void child_setup(pid_t parent, const char *errpath, int sig) {
  setpgid(0, 0);
#ifdef __linux__
  prctl(PR_SET_PDEATHSIG, sig); /* a killed sweep takes its config with it */
#endif
  if (getppid() != parent) _exit(3); /* the sweep died before prctl */
  int fd = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd >= 0) {
    dup2(fd, STDERR_FILENO);
    close(fd);
  }
}

/* Runs o in a child; r gets its result, or "failed" with how the child died or
 * "timeout after S s" when it did not finish within timeout seconds (then it is
 * killed). */
static void run_isolated(const sb_opts *o, sb_ref *cache, double timeout, const scratch *sc,
                         sb_result *r) {
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
  const double deadline = dt_now() + timeout;
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
    child_setup(parent, sc->err, SIGKILL);
    sb_result cr;
    sb_execute(o, cache, SB_STAGE_RUN, &cr);
    _exit(result_write(fd[1], &cr) ? 3 : 0);
  }
  setpgid(pid, pid); /* as the child does: no race with a kill */
  close(fd[1]);
  char *buf = NULL;
  size_t len = 0;
  const int rd = read_until(fd[0], deadline, &buf, &len);
  close(fd[0]);
  int ws = 0;
  if (rd == 1) kill_group(pid, &ws);
  else
    while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
    }
  const bool whole = rd == 0 && result_parse(buf, len, r);
  free(buf);
  if (rd != 0 || !whole || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
    record_death(r, "the config's process", ws, rd == 1, timeout, sc->err);
  else {
    char last[8], first[8];
    stderr_tail(sc->err, last, sizeof last, first, sizeof first); /* shown, not kept */
  }
}

/* ---- --launcher: each config its own launched job step ----------------------------- */

/* s in single quotes for /bin/sh, appended to out (n bytes). */
static void shq(char *out, size_t n, const char *s) {
  size_t k = strlen(out);
  if (k + 1 < n) out[k++] = '\'';
  for (; *s && k + 5 < n; s++) {
    if (*s == '\'') {
      memcpy(out + k, "'\\''", 4);
      k += 4;
    } else out[k++] = *s;
  }
  if (k + 1 < n) out[k++] = '\'';
  out[k] = '\0';
}

/* The step of config k: `LAUNCHER shardbench sweep FLAGS --step K --step-out FILE`
 * run by /bin/sh in its own process group, its output to the scratch stderr
 * file; watched until timeout, then the whole group is ended. r: the result
 * rank 0 of the step wrote, or "failed" with how the step ended. */
static void run_step(const char *cmd_head, int k, double timeout, const scratch *sc,
                     sb_result *r) {
  static char cmd[16384];
  snprintf(cmd, sizeof cmd, "exec %s --step %d --config-timeout %.0f --step-out ", cmd_head, k,
           ceil(timeout));
  shq(cmd, sizeof cmd, sc->res);
  unlink(sc->res);
  sb_result_init(r);
  fflush(stdout);
  fflush(stderr);
  pid_t parent = getpid();
  const double deadline = dt_now() + timeout;
  pid_t pid = fork();
  if (pid < 0) {
    snprintf(r->status, sizeof r->status, "failed");
    snprintf(r->reason, sizeof r->reason, "fork: %s", strerror(errno));
    return;
  }
  if (pid == 0) {
    child_setup(parent, sc->err, SIGTERM); /* SIGTERM: the launcher ends its ranks */
    dup2(STDERR_FILENO, STDOUT_FILENO);
    execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
    fprintf(stderr, "shardbench sweep: /bin/sh: %s\n", strerror(errno));
    _exit(127);
  }
  setpgid(pid, pid);
  int ws = 0;
  bool timed_out = false;
  for (;;) {
    pid_t w = waitpid(pid, &ws, WNOHANG);
    if (w == pid) {
      kill(-pid, SIGKILL); /* nothing of the step outlives it */
      break;
    }
    if (w < 0 && errno != EINTR) break;
    if (dt_now() >= deadline) {
      timed_out = true;
      kill_group(pid, &ws);
      break;
    }
    nap_ms(20);
  }
  bool whole = false;
  if (!timed_out && WIFEXITED(ws) && WEXITSTATUS(ws) == 0) {
    int fd = open(sc->res, O_RDONLY);
    if (fd >= 0) {
      char *buf = NULL;
      size_t len = 0;
      whole = read_until(fd, dt_now() + 60, &buf, &len) == 0 && result_parse(buf, len, r);
      free(buf);
      close(fd);
    }
  }
  if (!whole) record_death(r, "the step", ws, timed_out, timeout, sc->err);
  else {
    char last[8], first[8];
    stderr_tail(sc->err, last, sizeof last, first, sizeof first);
  }
}

/* The default --config-timeout of o: a generous factor over its estimated work.
 * Work: the sharded and the reference job, (warmup + steps) x batch x seq tokens
 * x dt_llama_flops_per_token (torchtitan/models/utils.py
 * get_dense_model_nparams_and_flops: 6N + the attention term, fwd + bwd) at the
 * invocation's MFU peak. Factor 50 (CPU ranks reach a few % of the sgemm peak on
 * these small shapes; oversubscribed MPI ranks less) plus 60 s for the launch,
 * MPI's start and the verdict. */
static double default_timeout(const sb_opts *o) {
  dt_llama_config c;
  double est = 0;
  if (sb_workload_config(NULL, o->model, o->workload, &c) == DT_OK && o->peak_tflops > 0)
    est = 2.0 * dt_llama_flops_per_token(&c, o->seq) * o->batch * o->seq *
          (o->warmup + o->steps) / (o->peak_tflops * 1e12);
  return 60.0 + 50.0 * (isfinite(est) ? est : 0);
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
  const char *launcher;  /* --launcher: each config its own step under it; NULL: none */
  double config_timeout; /* --config-timeout S; 0: default_timeout per config */
  long shard_i, shard_n; /* --shard I/N (1-based I); 1/1: everything */
  long step;             /* --step K (internal, under the launcher): config K only; -1 */
  const char *step_out;  /* --step-out FILE (internal): where rank 0 writes its result */
  bool backend_given;
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
  int ok, mis, fail, skip, resumed, done, shape; /* shape: shape-only (--device meta) */
  bool db_err;
} tally;

enum { O_WORLD = 256, O_MODELS, O_PLANS, O_WORKLOADS, O_DTYPES, O_BATCH, O_SEQ, O_STEPS,
       O_WARMUP, O_DB, O_RESUME, O_BACKEND, O_PEAK, O_MEMLIM, O_NOMEM, O_PLANSDIR, O_SHAPES,
       O_DEVICE, O_PIN, O_LAUNCHER, O_TIMEOUT, O_SHARD, O_STEP, O_STEPOUT, O_AC, O_HELP };
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
    {"launcher", required_argument, NULL, O_LAUNCHER},
    {"config-timeout", required_argument, NULL, O_TIMEOUT},
    {"shard", required_argument, NULL, O_SHARD},
    {"step", required_argument, NULL, O_STEP},
    {"step-out", required_argument, NULL, O_STEPOUT},
    {"ac", required_argument, NULL, O_AC},
    {"help", no_argument, NULL, O_HELP},
    {NULL, 0, NULL, 0}};

/* The flags into a, with their defaults; 0, -1 after --help, or SB_EXIT_USAGE. */
static int sweep_parse(int argc, char **argv, sweep_args *a) {
  static const char CMD[] = "sweep";
  *a = (sweep_args){.batch = 8, .seq = 32, .steps = 2, .warmup = 1, .models_s = "debugmodel",
                    .plans_s = "all", .workloads_s = "block,model", .dtypes_s = "f32",
                    .db = "results/shardbench.db", .backend_s = "threads",
                    .device_s = "cpu", .shard_i = 1, .shard_n = 1, .step = -1};
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
    case O_BACKEND: a->backend_s = optarg; a->backend_given = true; break;
    case O_LAUNCHER:
      if (!optarg[0] || !strstr(optarg, "{world}"))
        return sb_usage_error(CMD, "--launcher", "expected a command with {world} (e.g. 'mpirun "
                              "-np {world}'), got '%s'", optarg);
      a->launcher = optarg;
      break;
    case O_TIMEOUT: {
      char *end;
      errno = 0;
      a->config_timeout = strtod(optarg, &end);
      if (errno || end == optarg || *end || !(a->config_timeout >= 1) ||
          !(a->config_timeout <= 7 * 86400))
        return sb_usage_error(CMD, "--config-timeout", "expected seconds in 1..604800, got '%s'",
                              optarg);
      break;
    }
    case O_SHARD: {
      char one[32];
      const char *slash = strchr(optarg, '/');
      long i, n;
      if (!slash || (size_t)(slash - optarg) >= sizeof one)
        return sb_usage_error(CMD, "--shard", "expected I/N (1 <= I <= N), got '%s'", optarg);
      memcpy(one, optarg, (size_t)(slash - optarg));
      one[slash - optarg] = '\0';
      if (sb_parse_long(one, 1, 1 << 20, &i, err, sizeof err) != DT_OK ||
          sb_parse_long(slash + 1, 1, 1 << 20, &n, err, sizeof err) != DT_OK || i > n)
        return sb_usage_error(CMD, "--shard", "expected I/N (1 <= I <= N), got '%s'", optarg);
      a->shard_i = i;
      a->shard_n = n;
      break;
    }
    case O_STEP:
      if (sb_parse_long(optarg, 0, 1L << 30, &a->step, err, sizeof err) != DT_OK)
        return sb_usage_error(CMD, "--step", "%s", err);
      break;
    case O_STEPOUT: a->step_out = optarg; break;
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
  if ((a->step >= 0) != (a->step_out != NULL))
    return sb_usage_error(CMD, a->step >= 0 ? "--step" : "--step-out",
                          "--step and --step-out go together (the launcher's step)");
  if (a->launcher) {
    if (a->backend_given && strcmp(a->backend_s, "mpi"))
      return sb_usage_error(CMD, "--backend", "--launcher runs each config under MPI; got '%s'",
                            a->backend_s);
    if (a->step >= 0)
      return sb_usage_error(CMD, "--launcher", "not with --step (a step is one config)");
    a->backend_s = "mpi"; /* the steps' backend: it is in every config's key */
  }
  if (a->step >= 0 && strcmp(a->backend_s, "mpi"))
    return sb_usage_error(CMD, "--step", "a step runs under --backend mpi");
  if (a->step >= 0 && (a->resume || a->shard_n > 1))
    return sb_usage_error(CMD, "--step", "not with --resume or --shard");
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
    return sb_usage_error(CMD, "--device", "expected cpu, cuda, cuda-emu or meta, got '%s'",
                          a->device_s);
  /* shape-only configs run in this process, each rank of a role alone on the fake comm */
  if (!strcmp(a->device_s, "meta") && (a->launcher || strcmp(a->backend_s, "threads")))
    return sb_usage_error(CMD, "--device", "meta: shape-only configs run in this process on the "
                                           "fake comm, not under %s",
                          a->launcher ? "--launcher" : a->backend_s);
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
  if (*be == DT_BACKEND_MPI && !a->launcher) {
    if (dt_mpi_init(argc, argv) != DT_OK)
      return sb_usage_error(CMD, "--backend", "MPI could not be initialised");
    *rank = dt_mpi_rank();
    if (a->world && a->world != dt_mpi_size())
      return sb_usage_error(CMD, "--world", "%ld, but mpirun started %d processes", a->world,
                            dt_mpi_size());
    a->world = dt_mpi_size();
  }
  if (!a->world) return sb_usage_error(CMD, "--world", "required (the number of ranks)");
  if (sb_fault_check(CMD, *rank == 0 && a->step < 0)) return SB_EXIT_USAGE; /* TEST SWITCH (run.c) */
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
  if (a->step >= sp->total)
    return sb_usage_error(CMD, "--step", "%ld, but the sweep has %d configs", a->step, sp->total);
  return 0;
}

/* Rank 0: the DB, this invocation's runs row and its MFU peak, measured once. */
static int sweep_open(const sweep_args *a, sb_store *st, sb_opts *lim, int argc, char **argv) {
  int rc = sb_store_open(st, a->db, "sweep");
  if (rc) return rc;
  if (!(lim->peak_tflops > 0) && strcmp(a->device_s, "meta")) /* meta: no timing */
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

/* How the configs run: in a forked child (threads), in these processes (MPI
 * without a launcher: every process walks the list) or as launched steps. */
typedef struct runner {
  bool mpi;
  int rank;
  char *step_head; /* --launcher: the step's command line up to --step (malloc'd); NULL */
  scratch sc;      /* the children's stderr and the steps' result files */
} runner;

/* Config k of the space, in order: model, workload, dtype, mesh shape, plan, --ac (the
 * AC setting varies fastest, then the plan). */
static void config_at(const sweep_args *a, const sweep_space *sp, const sb_opts *lim, int k,
                      sb_opts *o) {
  const int na = sp->n_ac ? sp->n_ac : 1, ai = k % na; /* --ac innermost */
  k /= na;
  const int pi = k % sp->plans.n, si = k / sp->plans.n % sp->nshapes,
            di = k / sp->plans.n / sp->nshapes % sp->dtypes.n,
            wi = k / sp->plans.n / sp->nshapes / sp->dtypes.n % sp->workloads.n,
            mi = k / sp->plans.n / sp->nshapes / sp->dtypes.n / sp->workloads.n;
  *o = *lim; /* the peak and the memory limit */
  o->ac = sp->n_ac ? sp->ac[ai] : sp->plan_ac[pi];
  snprintf(o->model, sizeof o->model, "%s", sp->models.v[mi]);
  snprintf(o->workload, sizeof o->workload, "%s", sp->workloads.v[wi]);
  snprintf(o->dtype, sizeof o->dtype, "%s", sp->dtypes.v[di]);
  snprintf(o->plan, sizeof o->plan, "%s", sp->plans.v[pi]);
  snprintf(o->plan_path, sizeof o->plan_path, "%s", sp->plan_path[pi]);
  snprintf(o->backend, sizeof o->backend, "%s", a->backend_s);
  snprintf(o->device, sizeof o->device, "%s", a->device_s);
  memcpy(o->dims, sp->shapes[si], sizeof o->dims);
  o->batch = (int)a->batch;
  o->seq = (int)a->seq;
  o->steps = (int)a->steps;
  o->warmup = (int)a->warmup;
  o->world = (int)a->world;
}

/* --shard I/N: config k belongs to part I when k mod N = I - 1 (round robin: the
 * parts get the plans and shapes of every region of the list alike). */
static bool in_shard(const sweep_args *a, int k) { return k % a->shard_n == a->shard_i - 1; }

/* One config: resumed, or checked, run (in a child process on threads, as its own
 * step under --launcher, each under the watchdog) and stored. */
static void sweep_config(const sweep_args *a, const sb_opts *o, int k, sb_ref *ref, sb_store *st,
                         runner *rn, double t0, int total, tally *t) {
  const bool tty = isatty(STDERR_FILENO);
  const bool mpi = rn->mpi;
  const int rank = rn->rank;
  sb_config c;
  sb_config_fill(o, &c);
  t->done++;
  const bool meta = !strcmp(o->device, "meta");
  if (a->resume) {
    bool has = false;
    if (rank == 0 &&
        (meta ? sb_store_has_shape(st, c.key, &has) : sb_store_has_result(st, c.key, &has)))
      t->db_err = true;
    if (mpi) has = mpi_bcast(has) != 0;
    if (has) {
      t->resumed++;
      if (rank == 0) progress(tty, t->done, total, t0, "done", c.key);
      return;
    }
  }
  sb_result r;
  const double timeout = a->config_timeout > 0 ? a->config_timeout : default_timeout(o);
  if (meta) {
    /* shape-only: no reference, no data; one rank per role, in this process (fast,
     * and its roles are not handed through result_write) */
    sb_execute(o, NULL, SB_STAGE_RUN, &r);
  } else if (rn->step_head) {
    sb_execute(o, NULL, SB_STAGE_CHECK, &r); /* the step computes its own reference */
    if (!r.status[0]) run_step(rn->step_head, k, timeout, &rn->sc, &r);
  } else {
    sb_execute(o, ref, SB_STAGE_PREPARE, &r); /* checks and the reference only */
    if (!r.status[0]) {
      if (!mpi) run_isolated(o, ref, timeout, &rn->sc, &r);
      else sb_execute(o, ref, SB_STAGE_RUN, &r);
    }
  }
  if (!strcmp(r.status, "ok")) t->ok++;
  else if (!strcmp(r.status, "shape-only")) t->shape++;
  else if (!strcmp(r.status, "mismatch")) t->mis++;
  else if (!strcmp(r.status, "skipped")) t->skip++;
  else t->fail++;
  if (rank == 0) {
    char ac[32];
    dt_ac_str(&o->ac, ac, sizeof ac);
    if (meta ? sb_store_put_shape(st, &c, ac, &r) : sb_store_put(st, &c, &r)) t->db_err = true;
    progress(tty, t->done, total, t0, r.status, c.key);
  }
  sb_result_free(&r);
}

/* Every config of the space (of this --shard), in order. */
static void sweep_all(const sweep_args *a, const sweep_space *sp, const sb_opts *lim, sb_store *st,
                      runner *rn, int total, tally *t) {
  sb_ref ref;
  memset(&ref, 0, sizeof ref);
  const double t0 = dt_now();
  for (int k = 0; k < sp->total; k++) {
    if (!in_shard(a, k)) continue;
    sb_opts o;
    config_at(a, sp, lim, k, &o);
    sweep_config(a, &o, k, &ref, st, rn, t0, total, t);
  }
  sb_ref_free(&ref);
}

/* Rank 0, before any config runs: every config of this shard in the configs table
 * (one transaction), so that `shardbench status` counts the ones not run yet. */
static int sweep_plan_configs(const sweep_args *a, const sweep_space *sp, const sb_opts *lim,
                              sb_store *st) {
  if (!strcmp(a->device_s, "meta")) return 0; /* shape-only: kept out of configs */
  sb_config *cs = malloc(sizeof *cs * (size_t)(sp->total ? sp->total : 1));
  int n = 0;
  if (!cs) return -1;
  for (int k = 0; k < sp->total; k++)
    if (in_shard(a, k)) {
      sb_opts o;
      config_at(a, sp, lim, k, &o);
      sb_config_fill(&o, &cs[n++]);
    }
  int rc = sb_store_plan_configs(st, cs, n);
  free(cs);
  return rc;
}

/* --step K (inside the launcher's step, every rank): config K alone, with its own
 * reference; rank 0 writes the result to --step-out (FILE.tmp, then renamed, so
 * that the driver never reads half a file). The ranks end themselves when the
 * driver's timeout plus a grace period has passed (alarm: a safety net for a
 * launcher that does not pass on the driver's kill). */
static int sweep_step(const sweep_args *a, const sweep_space *sp, const sb_opts *lim, int rank) {
  if (a->config_timeout > 0) alarm((unsigned)ceil(a->config_timeout) + 30);
  sb_opts o;
  config_at(a, sp, lim, (int)a->step, &o);
  sb_ref ref;
  memset(&ref, 0, sizeof ref);
  sb_result r;
  sb_execute(&o, &ref, SB_STAGE_RUN, &r);
  int rc = SB_EXIT_OK;
  if (rank == 0) {
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", a->step_out);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || result_write(fd, &r) || fsync(fd) || close(fd) || rename(tmp, a->step_out)) {
      fprintf(stderr, "shardbench sweep: --step-out '%s': %s\n", a->step_out, strerror(errno));
      rc = SB_EXIT_FAIL;
    }
  }
  sb_result_free(&r);
  sb_ref_free(&ref);
  dt_mpi_finish(rc == SB_EXIT_OK);
  return rc;
}

/* --launcher: the step's command line up to its --step flag: the launcher with
 * {world} replaced, this program, and the sweep's own flags with the measured
 * MFU peak, so that every step computes as the driver would. */
static char *step_head(const sweep_args *a, const sb_opts *lim) {
  const size_t n = 16384; /* run_step's buffer */
  char *h = malloc(n), exe[1024], num[64];
  if (!h) {
    fprintf(stderr, "shardbench sweep: out of memory\n");
    return NULL;
  }
  ssize_t el = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (el <= 0) snprintf(exe, sizeof exe, "shardbench");
  else exe[el] = '\0';
  h[0] = '\0';
  size_t k = 0;
  for (const char *p = a->launcher; *p && k + 16 < n;) {
    if (!strncmp(p, "{world}", 7)) {
      k += (size_t)snprintf(h + k, n - k, "%ld", a->world);
      p += 7;
    } else h[k++] = *p++;
  }
  h[k] = '\0';
#define ARG(flag, v) do { strncat(h, " " flag " ", n - strlen(h) - 1); shq(h, n, (v)); } while (0)
  strncat(h, " ", n - strlen(h) - 1);
  shq(h, n, exe);
  strncat(h, " sweep --backend mpi", n - strlen(h) - 1);
  snprintf(num, sizeof num, "%ld", a->world); ARG("--world", num);
  ARG("--models", a->models_s);
  ARG("--plans", a->plans_s);
  if (a->plans_flag) ARG("--plans-dir", a->plans_flag);
  ARG("--workloads", a->workloads_s);
  ARG("--dtypes", a->dtypes_s);
  snprintf(num, sizeof num, "%ld", a->batch); ARG("--batch", num);
  snprintf(num, sizeof num, "%ld", a->seq); ARG("--seq", num);
  snprintf(num, sizeof num, "%ld", a->steps); ARG("--steps", num);
  snprintf(num, sizeof num, "%ld", a->warmup); ARG("--warmup", num);
  ARG("--device", a->device_s);
  if (a->shapes_s) ARG("--shapes", a->shapes_s);
  if (a->pin_ranks) strncat(h, " --pin-ranks", n - strlen(h) - 1);
  if (a->no_mem_check) strncat(h, " --no-mem-check", n - strlen(h) - 1);
  else if (a->mem_s) ARG("--mem-limit", a->mem_s);
  if (lim->peak_tflops > 0) {
    snprintf(num, sizeof num, "%.17g", lim->peak_tflops);
    ARG("--peak-tflops", num);
  }
#undef ARG
  if (strlen(h) + 1024 >= n) { /* run_step appends --step, --config-timeout, --step-out */
    fprintf(stderr, "shardbench sweep: --launcher: the step's command line is over %zu bytes\n",
            n - 1024);
    free(h);
    return NULL;
  }
  return h;
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
  if (a.step >= 0) return sweep_step(&a, &sp, &lim, rank);
  runner rn;
  memset(&rn, 0, sizeof rn);
  rn.mpi = be == DT_BACKEND_MPI && !a.launcher;
  rn.rank = rank;
  if (!rn.mpi && scratch_make(&rn.sc)) {
    fprintf(stderr, "shardbench sweep: cannot make a scratch directory under $TMPDIR: %s\n",
            strerror(errno));
    return SB_EXIT_FAIL;
  }
  sb_store st;
  memset(&st, 0, sizeof st);
  if (rank == 0 && (rc = sweep_open(&a, &st, &lim, argc, argv))) {
    scratch_remove(&rn.sc);
    return rc;
  }
  int total = 0;
  for (int k = 0; k < sp.total; k++) total += in_shard(&a, k);
  if (rank == 0 && sweep_plan_configs(&a, &sp, &lim, &st)) {
    sb_store_close(&st);
    scratch_remove(&rn.sc);
    return SB_EXIT_FAIL;
  }
  if (a.launcher && !(rn.step_head = step_head(&a, &lim))) {
    sb_store_close(&st);
    scratch_remove(&rn.sc);
    return SB_EXIT_FAIL;
  }
  char part[64] = "";
  if (a.shard_n > 1) snprintf(part, sizeof part, " (shard %ld/%ld: %d)", a.shard_i, a.shard_n, total);
  if (rank == 0)
    fprintf(stderr, "shardbench sweep: world %ld, %d mesh shapes x %d plans x %d workloads x %d "
                    "dtypes x %d models = %d configs%s -> %s%s; MFU peak %.4g TFLOP/s (%s)\n",
            a.world, sp.nshapes, sp.plans.n, sp.workloads.n, sp.dtypes.n, sp.models.n, sp.total,
            part, a.db, a.resume ? " (resume)" : "", lim.peak_tflops, lim.peak_source);
  tally t = {0};
  const double t0 = dt_now();
  sweep_all(&a, &sp, &lim, &st, &rn, total, &t);
  if (rank == 0) {
    if (sb_store_end_run(&st)) t.db_err = true;
    sb_store_close(&st);
    char shape[48] = "";
    if (!strcmp(a.device_s, "meta")) snprintf(shape, sizeof shape, "%d shape-only, ", t.shape);
    printf("sweep: world %ld: %d configs in %.1f s: %s%d ok, %d mismatch, %d failed, %d skipped, "
           "%d already in the DB -> %s\n",
           a.world, total, dt_now() - t0, shape, t.ok, t.mis, t.fail, t.skip, t.resumed, a.db);
  }
  free(rn.step_head);
  scratch_remove(&rn.sc);
  rc = (t.mis || t.fail || t.db_err) ? SB_EXIT_FAIL : SB_EXIT_OK;
  if (rn.mpi) dt_mpi_finish(true);
  return rc;
}
