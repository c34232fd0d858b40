/* verify/test_testutil.c: the test helpers' own verdict rule. A test program
 * that ran no check must fail, not pass.
 *
 * `test_testutil --case C` is one small program per case, ending with
 * tu_finish: none (no check), check-pass, check-fail, ok-pass, ok-fail,
 * vals-pass, vals-fail (ot_check_vals only, no TU_* macro), grad-pass
 * (ot_grad_check only). Without arguments, the program runs itself once per
 * case (fork + exec, so each case starts with zero counts) and checks the
 * exit code and, for "none", the "ran no check" line: the oracle is the rule
 * itself (no check: 1; a failed check: 1; only passing checks: 0).
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "optest.h"

/* ---- the cases (each a process of its own) ---------------------------------------- */

typedef struct vals_arg {
  bool grad;   /* ot_grad_check of scale instead of ot_check_vals */
  bool wrong;  /* compare against a wrong expectation */
} vals_arg;

static double scale_loss(void *arg) {
  /* loss = sum(2 x * G) for G = 1: the reference of scale's gradient check */
  const double *x = arg;
  return 2 * (x[0] + x[1] + x[2] + x[3]);
}

/* One rank, a mesh of 1: a tensor [4] compared by an optest helper; no TU_*
 * macro runs, so any count comes from the helper. */
static dt_status vals_body(dt_ctx *ctx, void *argp) {
  const vals_arg *va = argp;
  ot_rank R;
  const int shape[1] = {1};
  if (ot_rank_open(&R, ctx, "(1)", 1, shape) != DT_OK) return DT_ERR_INVALID;
  const int64_t sh[1] = {4};
  double x[4] = {1, 2, 3, 4}, want[4] = {1, 2, 3, va->wrong ? 5 : 4};
  dt_placement pl[1][DT_MAX_MESH_DIMS] = {{dt_replicate()}};
  if (va->grad) {
    dt_op_attrs a = DT_OP_ATTRS_INIT;
    a.scalar = 2;
    double gv[4] = {1, 1, 1, 1};
    ot_arr in = {1, sh, x}, G = {1, sh, gv};
    /* central differences of a linear loss are exact up to rounding */
    ot_grad_check(&R, "scale", &dt_op_scale, &a, 1, &in, pl, &G, scale_loss, x, 1e-3, 1e-9);
  } else {
    dt_tensor t;
    dt_status s = ot_make(&R, DT_F64, 1, sh, x, pl[0], &t);
    if (s == DT_OK) {
      ot_check_vals(&R, "x", &t, 1, sh, want, 0);
      dt_tensor_free(ctx, &t);
    }
  }
  dt_mesh_free(R.mesh);
  return DT_OK;
}

static int run_case(const char *c) {
  dt_ctx ctx;
  dt_ctx_init(&ctx, 0, 1);
  if (!strcmp(c, "check-pass")) TU_CHECK(1 + 1 == 2, "arithmetic");
  else if (!strcmp(c, "check-fail")) TU_CHECK(1 + 1 == 3, "planted failure");
  else if (!strcmp(c, "ok-pass")) TU_OK(&ctx, DT_OK);
  else if (!strcmp(c, "ok-fail")) TU_OK(&ctx, dt_error(&ctx, DT_ERR_INVALID, "test", "planted"));
  else if (!strncmp(c, "vals-", 5) || !strcmp(c, "grad-pass")) {
    vals_arg va = {.grad = c[0] == 'g', .wrong = !strcmp(c, "vals-fail")};
    const int shape[1] = {1};
    ot_launch(DT_BACKEND_THREADS, "(1)", 1, shape, vals_body, &va);
  } else if (strcmp(c, "none")) {
    fprintf(stderr, "test_testutil: --case: unknown case '%s'\n", c);
    dt_ctx_release(&ctx);
    return 2;
  }
  dt_ctx_release(&ctx);
  return tu_finish(c);
}

/* ---- the driver ----------------------------------------------------------------------- */

/* Runs `self --case c`; returns its exit code (-1 if it did not exit) and its
 * stderr (up to n-1 bytes) in err. */
static int spawn(const char *self, const char *c, char *err, size_t n) {
  int fd[2];
  err[0] = 0;
  if (pipe(fd)) return -1;
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    close(fd[0]);
    dup2(fd[1], 2);
    close(fd[1]);
    execl(self, self, "--case", c, (char *)NULL);
    _exit(127);
  }
  close(fd[1]);
  size_t k = 0;
  ssize_t r;
  while (k < n - 1 && (r = read(fd[0], err + k, n - 1 - k)) > 0) k += (size_t)r;
  err[k] = 0;
  char drain[256];
  while (read(fd[0], drain, sizeof drain) > 0) {}
  close(fd[0]);
  int st;
  if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) return -1;
  return WEXITSTATUS(st);
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "--case")) return run_case(argv[2]);
  if (argc != 1) {
    fprintf(stderr, "%s: usage: %s [--case CASE]\n", argv[0], argv[0]);
    return 2;
  }
  static const struct {
    const char *c;
    int want;
  } cases[] = {
      {"none", 1},      {"check-pass", 0}, {"check-fail", 1}, {"ok-pass", 0},
      {"ok-fail", 1},   {"vals-pass", 0},  {"vals-fail", 1},  {"grad-pass", 0},
  };
  enum { N = sizeof cases / sizeof cases[0] };
  int rc[N];
  char err[N][2048];
  /* every child first: this process's own counts start at zero in each child */
  for (int i = 0; i < N; i++) rc[i] = spawn(argv[0], cases[i].c, err[i], sizeof err[i]);
  for (int i = 0; i < N; i++) {
    TU_CHECK(rc[i] == cases[i].want, "--case %s exited %d, expected %d; its stderr:\n%s",
             cases[i].c, rc[i], cases[i].want, err[i]);
    printf("case %-10s exit %d (expected %d)\n", cases[i].c, rc[i], cases[i].want);
  }
  TU_CHECK(strstr(err[0], "ran no check") != NULL,
           "--case none: stderr does not say \"ran no check\": %s", err[0]);
  return tu_finish("test_testutil");
}
