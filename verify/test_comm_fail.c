/* verify/test_comm_fail.c: a failing or stalled rank must not hang the others.
 *
 * Each case is one dt_launch whose SPMD function injects a fault on one rank:
 *   error     rank R returns an error before a world all_reduce the others enter:
 *             they get DT_ERR_ABORTED (and again, at once, from a later barrier);
 *             the report names R, DT_ERR_INVALID and the injected message.
 *   stall     rank R sleeps 2 s, past the 0.5 s job timeout, before its
 *             all_reduce: the waiters time out or are aborted within bounded
 *             time; the report names a waiter that timed out (DT_ERR_TIMEOUT, a
 *             message naming all_reduce), never R; R's late call is aborted.
 *   subgroup  the world is split into halves A and B; a rank of A fails; the rest
 *             of A is blocked in an A all_reduce, B finishes a B all_reduce and
 *             then waits in a world barrier: all of them must be aborted.
 *   after     (threads only) a clean job after an aborted one works normally.
 * "Bounded" is asserted as: the whole launch takes under 10 s, while the error
 * and subgroup cases run with a 30 s timeout (so only abort propagation, not the
 * timeout, can end their waits in time).
 *
 * --backend threads (default): every case at worlds 2, 4 and 8, in one process.
 * --backend mpi --case error|stall|subgroup: one case per mpirun invocation (an
 *   aborted MPI job may leave collectives pending for good), judged per rank:
 *   each rank prints "rank R: case C: ok (...)" or "... FAIL (...)" and, after
 *   the expected failure, ends with dt_mpi_finish(false) (MPI_Abort), so the
 *   driver verify/mpi-fail.sh judges by those lines and by the elapsed time,
 *   not by mpirun's exit code.
 *
 * This is not a test of the collectives' results (test_comm does that). */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "testutil.h"

typedef enum fcase { CASE_ERROR = 0, CASE_STALL, CASE_SUBGROUP, CASE_AFTER, CASE_COUNT } fcase;
static const char *const case_names[CASE_COUNT] = {"error", "stall", "subgroup", "after"};

/* Timeouts and wall-time bound, with their reasons:
 *   STALL_TIMEOUT_S  short, so the stall case is quick;
 *   STALL_SLEEP_S    4x that: the stalled rank is unambiguously late, even with
 *                    8 ranks sharing 2 cores under a sanitizer;
 *   LONG_TIMEOUT_S   for the error/subgroup cases: far above BOUND_S, so a wait
 *                    that ends within BOUND_S was ended by the abort, not by it;
 *   BOUND_S          a generous "did not hang" bound for one launch (the stall
 *                    case needs ~STALL_SLEEP_S; the MPI agreement waits for the
 *                    stalled rank, which is within it as well). */
#define STALL_TIMEOUT_S 0.5
#define STALL_SLEEP_S 2.0
#define LONG_TIMEOUT_S 30.0
#define BOUND_S 10.0
/* A call of an already aborted job must return "at once": 1 s is far above the
 * microseconds it takes, and far below any timeout here that could end it. */
#define IMMEDIATE_S 1.0

enum { NVAL = 4 };

typedef struct fail_arg {
  fcase which;
  int world;
  int bad;                      /* the failing or stalled rank */
  dt_status *st1, *st2;         /* per rank: first and second collective */
  double *secs2;                /* per rank: seconds of the second collective */
  double *buf;                  /* per rank NVAL doubles (kept alive: see comm_mpi.c) */
  char (*err1)[DT_ERRMSG_LEN];  /* per rank: last error after the first collective */
} fail_arg;

static void sleep_s(double s) {
  struct timespec ts;
  ts.tv_sec = (time_t)s;
  ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
  while (nanosleep(&ts, &ts) != 0) {
  }
}

static int bad_rank(fcase c, int world) {
  switch (c) {
    case CASE_ERROR: return world / 2;       /* a middle rank: not 0, not the last */
    case CASE_STALL: return world - 1;
    case CASE_SUBGROUP: return world / 2 - 1; /* the last rank of half A */
    default: return -1;
  }
}

static void fill(double *x, int rank) {
  for (int i = 0; i < NVAL; i++) x[i] = (double)(rank + 1) * (i + 1);
}

static void keep_err(fail_arg *a, dt_ctx *ctx) {
  snprintf(a->err1[ctx->rank], DT_ERRMSG_LEN, "%s", dt_last_error(ctx));
}

static dt_status fn_error(dt_ctx *ctx, void *p) {
  fail_arg *a = p;
  int r = ctx->rank;
  if (r == a->bad) return dt_error(ctx, DT_ERR_INVALID, "test", "injected failure on rank %d", r);
  double *x = a->buf + (size_t)r * NVAL;
  fill(x, r);
  a->st1[r] = dt_comm_all_reduce(ctx->world, x, x, NVAL, DT_F64, DT_RED_SUM);
  keep_err(a, ctx);
  double t0 = dt_now();
  a->st2[r] = dt_comm_barrier(ctx->world);
  a->secs2[r] = dt_now() - t0;
  return a->st1[r] != DT_OK ? a->st1[r] : a->st2[r];
}

static dt_status fn_stall(dt_ctx *ctx, void *p) {
  fail_arg *a = p;
  int r = ctx->rank;
  if (r == a->bad) sleep_s(STALL_SLEEP_S);
  double *x = a->buf + (size_t)r * NVAL;
  fill(x, r);
  a->st1[r] = dt_comm_all_reduce(ctx->world, x, x, NVAL, DT_F64, DT_RED_SUM);
  keep_err(a, ctx);
  double t0 = dt_now();
  a->st2[r] = dt_comm_barrier(ctx->world);
  a->secs2[r] = dt_now() - t0;
  return a->st1[r] != DT_OK ? a->st1[r] : a->st2[r];
}

/* Half A: ranks 0 .. world/2-1; half B: the rest. */
static dt_status fn_subgroup(dt_ctx *ctx, void *p) {
  fail_arg *a = p;
  int r = ctx->rank, half = a->world / 2;
  int color = r < half ? 0 : 1;
  dt_comm *sub = NULL;
  dt_status s = dt_comm_split(ctx->world, color, r, color ? "half_b" : "half_a", &sub);
  if (s != DT_OK) return s;
  if (r == a->bad) {
    dt_comm_destroy(sub);
    return dt_error(ctx, DT_ERR_INVALID, "test", "injected failure on rank %d of half A", r);
  }
  double *x = a->buf + (size_t)r * NVAL;
  fill(x, r);
  a->st1[r] = dt_comm_all_reduce(sub, x, x, NVAL, DT_F64, DT_RED_SUM);
  keep_err(a, ctx);
  /* B's all_reduce may well succeed; B would then wait for R forever here. */
  double t0 = dt_now();
  a->st2[r] = dt_comm_barrier(ctx->world);
  a->secs2[r] = dt_now() - t0;
  dt_comm_destroy(sub);
  return a->st1[r] != DT_OK ? a->st1[r] : a->st2[r];
}

/* A clean job: a world all_reduce and a split all_reduce with checked values. */
static dt_status fn_clean(dt_ctx *ctx, void *p) {
  fail_arg *a = p;
  int r = ctx->rank, n = ctx->world_size;
  double *x = a->buf + (size_t)r * NVAL;
  fill(x, r);
  DT_CHECK(dt_comm_all_reduce(ctx->world, x, x, NVAL, DT_F64, DT_RED_SUM));
  for (int i = 0; i < NVAL; i++)
    TU_CHECK(x[i] == (double)n * (n + 1) / 2 * (i + 1), "rank %d: sum[%d] = %g", r, i, x[i]);
  dt_comm *sub = NULL;
  DT_CHECK(dt_comm_split(ctx->world, r % 2, r, "parity", &sub));
  double v = 1.0;
  dt_status s = dt_comm_all_reduce(sub, &v, &v, 1, DT_F64, DT_RED_SUM);
  if (s == DT_OK) TU_CHECK(v == (double)sub->size, "rank %d: parity count %g", r, v);
  dt_comm_destroy(sub);
  if (s != DT_OK) return s;
  return dt_comm_barrier(ctx->world);
}

static dt_status fn_barrier(dt_ctx *ctx, void *p) {
  (void)p;
  return dt_comm_barrier(ctx->world);
}

static void arg_free(fail_arg *a) {
  free(a->st1);
  free(a->st2);
  free(a->secs2);
  free(a->buf);
  free(a->err1);
}

static bool arg_alloc(fail_arg *a, fcase which, int world) {
  memset(a, 0, sizeof *a);
  a->which = which;
  a->world = world;
  a->bad = bad_rank(which, world);
  size_t n = (size_t)world;
  a->st1 = calloc(n, sizeof *a->st1);
  a->st2 = calloc(n, sizeof *a->st2);
  a->secs2 = calloc(n, sizeof *a->secs2);
  a->buf = calloc(n * NVAL, sizeof *a->buf);
  a->err1 = calloc(n, sizeof *a->err1);
  if (a->st1 && a->st2 && a->secs2 && a->buf && a->err1) return true;
  arg_free(a);
  return false;
}

static const char *sname(dt_status s) { return dt_status_str(s); }

/* Checks one finished case: the launch result, the report and, for each rank
 * that ran in this process, what its calls returned. */
static void check_case(const fail_arg *a, dt_status res, const dt_launch_report *rep,
                       double secs) {
  const char *cn = case_names[a->which];
  TU_CHECK(secs < BOUND_S, "case %s world %d: launch took %.2f s (bound %.0f s)", cn, a->world,
           secs, BOUND_S);
  if (a->which == CASE_AFTER) {
    TU_CHECK(res == DT_OK, "case %s world %d: launch -> %s: %s", cn, a->world, sname(res),
             rep->failed_msg);
    TU_CHECK(rep->failed_rank == -1, "case %s: failed_rank %d", cn, rep->failed_rank);
    for (int i = 0; i < rep->n_local && rep->rank_status; i++)
      TU_CHECK(rep->rank_status[i] == DT_OK, "case %s: rank %d -> %s", cn, rep->first_rank + i,
               sname(rep->rank_status[i]));
    return;
  }
  TU_CHECK(res != DT_OK, "case %s world %d: the launch succeeded", cn, a->world);
  TU_CHECK(rep->world == a->world, "case %s: report world %d, want %d", cn, rep->world,
           a->world);
  TU_CHECK(rep->rank_status != NULL, "case %s: no rank_status", cn);
  if (a->which == CASE_STALL) {
    TU_CHECK(rep->failed_rank >= 0 && rep->failed_rank < a->world && rep->failed_rank != a->bad,
             "case stall world %d: failed_rank %d, want a waiting rank (not %d)", a->world,
             rep->failed_rank, a->bad);
    TU_CHECK(rep->failed_status == DT_ERR_TIMEOUT, "case stall: failed_status %s",
             sname(rep->failed_status));
    TU_CHECK(strstr(rep->failed_msg, "all_reduce") != NULL,
             "case stall: failed_msg does not name the op: '%s'", rep->failed_msg);
    TU_CHECK(res == DT_ERR_TIMEOUT, "case stall: launch -> %s", sname(res));
  } else {
    TU_CHECK(rep->failed_rank == a->bad, "case %s world %d: failed_rank %d, want %d", cn,
             a->world, rep->failed_rank, a->bad);
    TU_CHECK(rep->failed_status == DT_ERR_INVALID, "case %s: failed_status %s", cn,
             sname(rep->failed_status));
    TU_CHECK(strstr(rep->failed_msg, "injected") != NULL, "case %s: failed_msg '%s'", cn,
             rep->failed_msg);
    TU_CHECK(res == DT_ERR_INVALID, "case %s: launch -> %s", cn, sname(res));
  }
  for (int i = 0; rep->rank_status && i < rep->n_local; i++) {
    int r = rep->first_rank + i;
    dt_status rs = rep->rank_status[i];
    if (r == a->bad) {
      if (a->which == CASE_STALL) {
        TU_CHECK(a->st1[r] == DT_ERR_ABORTED, "case stall: the stalled rank's late all_reduce "
                 "-> %s, want aborted", sname(a->st1[r]));
        TU_CHECK(rs == DT_ERR_ABORTED, "case stall: stalled rank %d -> %s", r, sname(rs));
      } else {
        TU_CHECK(rs == DT_ERR_INVALID, "case %s: failing rank %d -> %s", cn, r, sname(rs));
      }
      continue;
    }
    bool in_b = a->which == CASE_SUBGROUP && r >= a->world / 2;
    if (a->which == CASE_STALL) {
      TU_CHECK(a->st1[r] == DT_ERR_TIMEOUT || a->st1[r] == DT_ERR_ABORTED,
               "case stall: rank %d all_reduce -> %s, want timed out or aborted", r,
               sname(a->st1[r]));
    } else if (in_b) {
      /* B's own all_reduce does not need R: done, or aborted if R failed first. */
      TU_CHECK(a->st1[r] == DT_OK || a->st1[r] == DT_ERR_ABORTED,
               "case subgroup: rank %d (half B) all_reduce -> %s", r, sname(a->st1[r]));
    } else {
      TU_CHECK(a->st1[r] == DT_ERR_ABORTED, "case %s: rank %d all_reduce -> %s, want aborted",
               cn, r, sname(a->st1[r]));
      TU_CHECK(strstr(a->err1[r], "injected") != NULL,
               "case %s: rank %d's error does not carry the cause: '%s'", cn, r, a->err1[r]);
    }
    TU_CHECK(a->st2[r] == DT_ERR_ABORTED, "case %s: rank %d barrier -> %s, want aborted", cn, r,
             sname(a->st2[r]));
    if (a->st1[r] != DT_OK)
      TU_CHECK(a->secs2[r] < IMMEDIATE_S,
               "case %s: rank %d: barrier of an aborted job took %.3f s", cn, r, a->secs2[r]);
    TU_CHECK(rs == a->st1[r] || (a->st1[r] == DT_OK && rs == a->st2[r]),
             "case %s: rank %d fn -> %s", cn, r, sname(rs));
  }
}

static dt_spmd_fn case_fn(fcase c) {
  switch (c) {
    case CASE_ERROR: return fn_error;
    case CASE_STALL: return fn_stall;
    case CASE_SUBGROUP: return fn_subgroup;
    default: return fn_clean;
  }
}

/* Runs one case; returns the launch status; fills rep (caller frees it). */
static dt_status run_case(dt_backend be, fail_arg *a, dt_launch_report *rep, double *secs) {
  dt_launch_opts o;
  memset(&o, 0, sizeof o);
  o.backend = be;
  o.world = a->world;
  o.timeout_s = a->which == CASE_STALL ? STALL_TIMEOUT_S : LONG_TIMEOUT_S;
  o.device = DT_DEV_CPU;
  double t0 = dt_now();
  dt_status s = dt_launch(&o, case_fn(a->which), a, rep);
  *secs = dt_now() - t0;
  check_case(a, s, rep, *secs);
  return s;
}

static int run_threads(void) {
  static const int worlds[] = {2, 4, 8};
  for (size_t w = 0; w < sizeof worlds / sizeof worlds[0]; w++) {
    for (int c = 0; c < CASE_COUNT; c++) {
      fail_arg a;
      if (!arg_alloc(&a, (fcase)c, worlds[w])) {
        TU_CHECK(0, "out of memory");
        return tu_finish("test_comm_fail");
      }
      dt_launch_report rep;
      double secs = 0;
      long f0 = tu_failures();
      run_case(DT_BACKEND_THREADS, &a, &rep, &secs);
      printf("world %d: case %s: %s in %.2f s (failed rank %d: %s)\n", worlds[w], case_names[c],
             tu_failures() == f0 ? "ok" : "FAIL", secs, rep.failed_rank,
             rep.failed_rank >= 0 ? rep.failed_msg : "none");
      dt_launch_report_free(&rep);
      arg_free(&a);
    }
  }
  return tu_finish("test_comm_fail");
}

/* One case per process under mpirun (see the file comment). */
static int run_mpi(int *argc, char ***argv, fcase which) {
  if (dt_mpi_init(argc, argv) != DT_OK) {
    fprintf(stderr, "test_comm_fail: MPI could not be initialised\n");
    return 1;
  }
  int rank = dt_mpi_rank(), world = dt_mpi_size();
  if (world < 2) {
    printf("SKIP: the failure cases need at least 2 MPI ranks\n");
    dt_mpi_finish(true);
    return SB_SKIP;
  }
  fail_arg a;
  if (!arg_alloc(&a, which, world)) {
    fprintf(stderr, "rank %d: out of memory\n", rank);
    dt_mpi_finish(false);
    return 1;
  }
  dt_launch_report rep;
  double secs = 0;
  long f0 = tu_failures();
  dt_status res = run_case(DT_BACKEND_MPI, &a, &rep, &secs);
  printf("rank %d: case %s: %s in %.2f s (%s %d: %s)\n", rank, case_names[which],
         tu_failures() == f0 ? "ok" : "FAIL", secs,
         which == CASE_STALL ? "timed out first: rank" : "aborted by rank", rep.failed_rank,
         rep.failed_rank >= 0 ? rep.failed_msg : "none");
  int code = tu_finish("test_comm_fail");
  fflush(stdout);
  fflush(stderr);
  /* MPI_Abort from the first rank to get here could kill the others before they
   * print: one more (clean) launch first, as a barrier, on fresh communicators. */
  dt_launch_opts o;
  memset(&o, 0, sizeof o);
  o.backend = DT_BACKEND_MPI;
  o.timeout_s = LONG_TIMEOUT_S;
  dt_launch_report rep2;
  dt_status s2 = dt_launch(&o, fn_barrier, NULL, &rep2);
  if (s2 != DT_OK) {
    fprintf(stderr, "rank %d: the launch after the failed job -> %s: %s\n", rank, sname(s2),
            rep2.failed_msg);
    code = 1;
  }
  dt_launch_report_free(&rep2);
  dt_launch_report_free(&rep);
  fflush(stdout);
  fflush(stderr);
  /* The failed job's buffers (a.buf) stay allocated: an abandoned MPI request may
   * still refer to them until MPI_Abort ends the process. */
  if (res == DT_OK) arg_free(&a);
  dt_mpi_finish(res == DT_OK);
  return code;
}

int main(int argc, char **argv) {
  /* --case is ours; the rest goes to tu_parse. */
  int which = -1;
  char **rest = calloc((size_t)argc + 1, sizeof *rest);
  if (!rest) return 1;
  int nrest = 0;
  rest[nrest++] = argv[0];
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--case") && i + 1 < argc) {
      const char *v = argv[++i];
      for (int c = 0; c < CASE_AFTER; c++)
        if (!strcmp(v, case_names[c])) which = c;
      if (which < 0) {
        fprintf(stderr, "%s: --case: expected error, stall or subgroup, got '%s'\n", argv[0], v);
        free(rest);
        return 2;
      }
    } else {
      rest[nrest++] = argv[i];
    }
  }
  tu_opts opts;
  tu_parse(nrest, rest, &opts);
  free(rest);
  if (opts.backend == DT_BACKEND_MPI) {
    if (which < 0) {
      fprintf(stderr, "%s: --backend mpi needs --case error|stall|subgroup (one per run)\n",
              argv[0]);
      return 2;
    }
    return run_mpi(&argc, &argv, (fcase)which);
  }
  if (which >= 0) {
    fprintf(stderr, "%s: --case is for --backend mpi; threads runs every case\n", argv[0]);
    return 2;
  }
  return run_threads();
}
