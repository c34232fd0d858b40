/* verify/testutil.h: small helpers shared by the test programs (not part of libdtensor).
 * Tests print what failed and exit non-zero; 77 means SKIP (Automake). */
#ifndef SB_TESTUTIL_H
#define SB_TESTUTIL_H

#include <stdio.h>
#include "dtensor.h"

#define SB_SKIP 77

/* Per-rank failure counting: thread-safe (atomic) across the ranks of one process. */
void tu_fail(const char *file, int line, const char *fmt, ...) DT_PRINTF(3, 4);
long tu_failures(void);

#define TU_CHECK(cond, ...)                                           \
  do {                                                                \
    if (!(cond)) tu_fail(__FILE__, __LINE__, __VA_ARGS__);            \
  } while (0)
/* Check a dt_status is DT_OK; print the rank's last error otherwise. */
#define TU_OK(ctx, expr)                                                         \
  do {                                                                           \
    dt_status tu_s_ = (expr);                                                    \
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

/* Ends a test program: prints a summary line and returns the exit code
 * (0 pass, 1 fail). For MPI, the failure count is summed over ranks by the caller. */
int tu_finish(const char *name);

#endif
