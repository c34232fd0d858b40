/* bench/micro/dispatch.c: what dt_op_call costs over the op's local kernel (the dispatch overhead).
 *
 *   bench/shardbench-dispatch [--reps 21] [--iters 2000] [--worlds 1,8]
 *
 * Threads backend, a 1-D mesh of each world size, tiny f32 tensors ([4, 4], all
 * Replicate, so no input needs redistributing and the time is dispatch alone).
 * For each of add, scale and matmul (those whose kernel exists yet), after a
 * warm-up call (the decision is then cached), it times per rep --iters calls of
 *   (total)  dt_op_call + dt_tensor_free of its output, as a user calls it;
 *   (kernel) op->kernel on the same local arrays with a pre-made output.
 * Per op: the median over --reps of each per-call time (us), on rank 0 and the
 * worst rank; overhead = total - kernel (goal <= 2 us). The ledger stays on, as
 * it is in a run (no collective is issued, so it is not touched). Exit 0 when it
 * ran (the goal is reported, not enforced), 1 on a failed call, 2 on bad flags.
 * What it is not: a benchmark of the kernels or of redistribute.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dtensor.h"
#include "../common/flags.h"
#include "../stats.h"

static const char PROG[] = "dispatch";

enum { MAX_REPS = 1001, MAX_WORLDS = 8, NOPS = 3, MAX_RANKS = 64 };
/* The overhead goal per call, in microseconds (the target). */
static const double GOAL_US = 2.0;

typedef struct bopts {
  int reps, iters;
  int nworlds;
  int worlds[MAX_WORLDS];
} bopts;

typedef struct result {
  bool ran[NOPS];
  double total_us[NOPS], kernel_us[NOPS];       /* wall clock */
  double total_cpu_us[NOPS], kernel_cpu_us[NOPS]; /* this thread's CPU time */
} result;

/* CPU seconds of the calling thread: with more ranks than cores, wall time
 * also counts the slices in which other ranks ran, so the per-thread clock is
 * the fair measure of the work one call does. */
static double thread_cpu(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct job {
  const bopts *o;
  result res[MAX_RANKS];
} job;

static const dt_op *const OPS[NOPS] = {&dt_op_add, &dt_op_scale, &dt_op_matmul};

static dt_status bench_op(dt_ctx *ctx, const bopts *o, const dt_op *op, const dt_tensor *const *in,
                          double *total_us, double *kernel_us, double *total_cpu,
                          double *kernel_cpu) {
  dt_op_attrs a = DT_OP_ATTRS_INIT;
  a.scalar = 0.5; /* scale's factor; add and matmul read no attrs */
  dt_tensor out;
  dt_tensor *outp[1] = {&out};
  /* warm-up: the first call plans and fills the cache; its output is the kernel's */
  DT_CHECK(dt_op_call(ctx, op, &a, in, outp, NULL));
  dt_op_report rep = {0};
  dt_tensor o2;
  dt_tensor *o2p[1] = {&o2};
  dt_status s = dt_op_call(ctx, op, &a, in, o2p, &rep);
  if (s == DT_OK) dt_tensor_free(ctx, &o2);
  if (s == DT_OK && !rep.cached) s = dt_error(ctx, DT_ERR_INTERNAL, PROG, "%s: not cached", op->name);
  size_t nb = sizeof(double) * (size_t)o->reps;
  double *tt = malloc(nb), *tk = malloc(nb), *ct = malloc(nb), *ck = malloc(nb);
  if (!tt || !tk || !ct || !ck) s = DT_ERR_NOMEM;
  for (int r = 0; r < o->reps && s == DT_OK; r++) {
    double c0 = thread_cpu(), t0 = dt_now();
    for (int i = 0; i < o->iters && s == DT_OK; i++) {
      s = dt_op_call(ctx, op, &a, in, o2p, NULL);
      if (s == DT_OK) dt_tensor_free(ctx, &o2);
    }
    double t1 = dt_now(), c1 = thread_cpu();
    for (int i = 0; i < o->iters && s == DT_OK; i++) s = op->kernel(ctx, &a, in, outp);
    double t2 = dt_now(), c2 = thread_cpu();
    ct[r] = (c1 - c0) / o->iters * 1e6;
    ck[r] = (c2 - c1) / o->iters * 1e6;
    tt[r] = (t1 - t0) / o->iters * 1e6;
    tk[r] = (t2 - t1) / o->iters * 1e6;
  }
  if (s == DT_OK) {
    *total_us = sb_median(tt, o->reps);
    *kernel_us = sb_median(tk, o->reps);
    *total_cpu = sb_median(ct, o->reps);
    *kernel_cpu = sb_median(ck, o->reps);
  }
  free(tt);
  free(tk);
  free(ct);
  free(ck);
  dt_tensor_free(ctx, &out);
  return s;
}

static dt_status body(dt_ctx *ctx, void *arg) {
  job *J = arg;
  const bopts *o = J->o;
  int w = ctx->world_size;
  const char *names[1] = {"tp"};
  dt_mesh *mesh = NULL;
  DT_CHECK(dt_mesh_create(ctx, ctx->world, 1, &w, names, &mesh));
  const int64_t shape[2] = {4, 4};
  dt_placement r[1] = {dt_replicate()};
  dt_tensor x, y;
  dt_status s = dt_tensor_rand(ctx, mesh, 2, shape, DT_F32, r, 1, 1, DT_RNG_UNIFORM, -1, 2, &x);
  if (s == DT_OK) s = dt_tensor_rand(ctx, mesh, 2, shape, DT_F32, r, 1, 2, DT_RNG_UNIFORM, -1, 2, &y);
  const dt_tensor *in[2] = {&x, &y};
  result *res = ctx->rank < MAX_RANKS ? &J->res[ctx->rank] : NULL;
  for (int k = 0; k < NOPS && s == DT_OK; k++) {
    const dt_op *op = OPS[k];
    if (!op->kernel || !(op->options || op->candidates)) continue; /* still a placeholder */
    double tt = 0, tk = 0, ct = 0, ck = 0;
    s = bench_op(ctx, o, op, in, &tt, &tk, &ct, &ck);
    if (s == DT_OK && res) {
      res->ran[k] = true;
      res->total_us[k] = tt;
      res->kernel_us[k] = tk;
      res->total_cpu_us[k] = ct;
      res->kernel_cpu_us[k] = ck;
    }
  }
  dt_tensor_free(ctx, &x);
  dt_tensor_free(ctx, &y);
  dt_mesh_free(mesh);
  return s;
}

static void usage(void) {
  fprintf(stderr, "usage: %s [--reps N] [--iters N] [--worlds 1,8]\n", PROG);
  exit(2);
}

/* The value of flag in lo..hi, or "PROG: FLAG: expected an integer in LO..HI, got 'S'"
 * and exit 2. */
static int int_arg(const char *flag, const char *s, int lo, int hi) {
  int v;
  if (sb_flag_int(s, lo, hi, &v) != SB_FLAG_OK)
    exit(sb_flag_bad(PROG, flag, "expected an integer in %d..%d, got '%s'", lo, hi, s));
  return v;
}

int main(int argc, char **argv) {
  /* 21 reps of 2000 calls: each rep ~ a few ms, the median shrugs off preemption */
  bopts o = {.reps = 21, .iters = 2000, .nworlds = 2, .worlds = {1, 8}};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
      o.reps = int_arg("--reps", argv[++i], 1, MAX_REPS);
    } else if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
      o.iters = int_arg("--iters", argv[++i], 1, 100000000);
    } else if (!strcmp(argv[i], "--worlds") && i + 1 < argc) {
      char buf[128];
      snprintf(buf, sizeof buf, "%s", argv[++i]);
      o.nworlds = 0;
      for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (o.nworlds == MAX_WORLDS) usage();
        o.worlds[o.nworlds++] = int_arg("--worlds", tok, 1, MAX_RANKS);
      }
      if (!o.nworlds) usage();
    } else {
      usage();
    }
  }
  dt_device_cpu_blas_threads(1);
  int rc = 0;
  printf("%-6s %-7s %10s %10s %12s %12s | %10s %10s %12s %12s\n", "world", "op", "total_us",
         "kernel_us", "overhead_us", "worst_ovh", "cpu_total", "cpu_kernel", "cpu_overhead",
         "cpu_worst");
  for (int wi = 0; wi < o.nworlds; wi++) {
    job *J = calloc(1, sizeof *J);
    if (!J) return 1;
    J->o = &o;
    dt_launch_opts lo = {.backend = DT_BACKEND_THREADS, .world = o.worlds[wi], .timeout_s = 600};
    dt_launch_report rep;
    dt_status s = dt_launch(&lo, body, J, &rep);
    if (s != DT_OK) {
      fprintf(stderr, "%s: world %d: rank %d: %s\n", PROG, o.worlds[wi], rep.failed_rank,
              rep.failed_msg);
      rc = 1;
    }
    dt_launch_report_free(&rep);
    for (int k = 0; k < NOPS && s == DT_OK; k++) {
      if (!J->res[0].ran[k]) {
        printf("%-6d %-7s (placeholder: not timed)\n", o.worlds[wi], OPS[k]->name);
        continue;
      }
      double worst = 0, cworst = 0;
      for (int r = 0; r < o.worlds[wi] && r < MAX_RANKS; r++) {
        const result *q = &J->res[r];
        if (q->total_us[k] - q->kernel_us[k] > worst) worst = q->total_us[k] - q->kernel_us[k];
        if (q->total_cpu_us[k] - q->kernel_cpu_us[k] > cworst)
          cworst = q->total_cpu_us[k] - q->kernel_cpu_us[k];
      }
      const result *q = &J->res[0];
      printf("%-6d %-7s %10.3f %10.3f %12.3f %12.3f | %10.3f %10.3f %12.3f %12.3f%s\n",
             o.worlds[wi], OPS[k]->name, q->total_us[k], q->kernel_us[k],
             q->total_us[k] - q->kernel_us[k], worst, q->total_cpu_us[k], q->kernel_cpu_us[k],
             q->total_cpu_us[k] - q->kernel_cpu_us[k], cworst,
             cworst > GOAL_US ? "  (cpu overhead above the 2 us goal)" : "");
    }
    free(J);
  }
  return rc;
}
