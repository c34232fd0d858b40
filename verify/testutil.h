/* verify/testutil.h: small helpers shared by the test programs (not part of libdtensor).
 * Tests print what failed and exit non-zero; 77 means SKIP (Automake). */
#ifndef SB_TESTUTIL_H
#define SB_TESTUTIL_H

#include <stdbool.h>
#include <stdio.h>
#include "dtensor.h"

#define SB_SKIP 77

/* Failure and check counting, per process: thread-safe (atomic) across the
 * ranks of a threads job. Every check counts one whether it passes or not
 * (TU_CHECK, TU_OK, and the optest helpers that compare values), so that
 * tu_finish can tell a test that checked nothing from one that passed. */
void tu_fail(const char *file, int line, const char *fmt, ...) DT_PRINTF(3, 4);
long tu_failures(void);
void tu_count(void);
long tu_checks(void);

#define TU_CHECK(cond, ...)                                           \
  do {                                                                \
    tu_count();                                                       \
    if (!(cond)) tu_fail(__FILE__, __LINE__, __VA_ARGS__);            \
  } while (0)
/* |got - want| <= rtol |want| (equal values, infinities included, pass). */
bool tu_close(double got, double want, double rtol);
/* TU_CHECK of tu_close(got, want, rtol); the rest is a printf format naming the check. */
#define TU_CHECK_REL(got, want, rtol, ...)                                             \
  do {                                                                                 \
    const double tu_g_ = (got), tu_w_ = (want);                                        \
    char tu_m_[256];                                                                   \
    snprintf(tu_m_, sizeof tu_m_, __VA_ARGS__);                                        \
    TU_CHECK(tu_close(tu_g_, tu_w_, (rtol)), "%s: got %.17g, want %.17g", tu_m_, tu_g_, \
             tu_w_);                                                                   \
  } while (0)
/* Check a dt_status is DT_OK; print the rank's last error otherwise. */
#define TU_OK(ctx, expr)                                                         \
  do {                                                                           \
    dt_status tu_s_ = (expr);                                                    \
    tu_count();                                                                  \
    if (tu_s_ != DT_OK)                                                          \
      tu_fail(__FILE__, __LINE__, "%s -> %s: %s", #expr, dt_status_str(tu_s_),  \
              dt_last_error(ctx));                                               \
  } while (0)

/* Parses the common test flags: --backend threads|mpi. Unknown flags: exit 2. */
typedef struct tu_opts {
  dt_backend backend;
  int quick;      /* --quick: a reduced set (used under sanitizers / MPI) */
} tu_opts;
void tu_parse(int argc, char **argv, tu_opts *o);

/* srcdir/plans/FILE into buf (srcdir as the Automake harness sets it, else "."). */
const char *tu_plan_path(const char *file, char *buf, size_t n);
/* The whole file as a malloc'd NUL-terminated string; NULL when unreadable. */
char *tu_slurp(const char *path);

/* The whole (gathered) value of an f64 DTensor as a malloc'd array of *n doubles;
 * NULL when t is NULL or the gather fails. Collective over t's mesh. */
double *tu_full_f64(dt_ctx *ctx, const dt_tensor *t, int64_t *n);
/* Normwise relative error max |a - b| / max |ref| (max |a - b| when ref is 0). */
double tu_normwise(const double *a, const double *ref, int64_t n);

/* The device the DTensor tests run their ranks on, from the environment:
 * SB_TEST_DEVICE unset, "" or "cpu": the CPU (lo unchanged); "cuda-emu": every
 * rank gets a cuda-emu device (the CUDA kernels on the host, device memory a
 * host dereference faults on); "cuda": GPU 0. Anything else: a one-line error
 * and exit 2. Sets lo->device and lo->cuda_emu. */
void tu_launch_device(dt_launch_opts *lo);
/* The name of that device ("cpu", "cuda-emu", "cuda"). */
const char *tu_device_name(void);
/* A host copy of array a (host or the rank's device memory; waits for the
 * device); free with dt_array_free. */
dt_status tu_host_copy(dt_ctx *ctx, const dt_array *a, dt_array *out);

/* Ends a test program: prints a summary line and returns the exit code: 0 when
 * at least one check ran and none failed; 1 on a failure, or when no check ran
 * ("ran no check": a test that verified nothing must not pass). The counts are
 * this process's: under MPI each process is one rank and finishes on its own
 * counts (a caller that wants the job's totals sums them over the ranks, as
 * test_mesh does for failures). */
int tu_finish(const char *name);

#endif
