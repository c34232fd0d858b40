/* verify/optest.c: helpers shared by the op tests; see optest.h. */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optest.h"

void ot_shape_str(int ndim, const int64_t *sh, char *buf, size_t n) {
  size_t k = (size_t)snprintf(buf, n, "[");
  for (int d = 0; d < ndim && k < n; d++)
    k += (size_t)snprintf(buf + k, n - k, "%s%lld", d ? "," : "", (long long)sh[d]);
  if (k < n) snprintf(buf + k, n - k, "]");
}

dt_status ot_make(ot_rank *R, dt_dtype dtype, int ndim, const int64_t *sh, const void *v,
                  const dt_placement *pl, dt_tensor *t) {
  dt_array arr;
  dt_status s = dt_array_wrap(R->ctx, DT_DEV_CPU, dtype, ndim, sh, (void *)v, &arr);
  if (s != DT_OK) return s;
  return dt_tensor_distribute(R->ctx, R->mesh, &arr, pl, t);
}

bool ot_check_vals_dt(ot_rank *R, const char *what, const dt_tensor *t, dt_dtype dtype, int ndim,
                      const int64_t *sh, const double *want, double tol) {
  tu_count(); /* one check: the whole tensor */
  dt_array full;
  dt_status s = dt_tensor_full(R->ctx, t, &full);
  if (s != DT_OK) {
    tu_fail(__FILE__, __LINE__, "%s, rank %d: dt_tensor_full -> %s: %s", what, R->ctx->rank,
            dt_status_str(s), dt_last_error(R->ctx));
    return false;
  }
  bool ok = full.ndim == ndim && full.dtype == dtype && (dtype == DT_F64 || dtype == DT_F32);
  for (int d = 0; ok && d < ndim; d++) ok = full.shape[d] == sh[d];
  if (!ok) {
    char ws[64], gs[64];
    ot_shape_str(ndim, sh, ws, sizeof ws);
    ot_shape_str(full.ndim, full.shape, gs, sizeof gs);
    tu_fail(__FILE__, __LINE__, "%s, rank %d: output is %s %s, expected %s %s", what, R->ctx->rank,
            dt_dtype_name(full.dtype), gs, dt_dtype_name(dtype), ws);
  }
  for (int64_t i = 0; ok && i < full.numel; i++) {
    double v = dtype == DT_F64 ? ((const double *)full.data)[i] : (double)((const float *)full.data)[i];
    if (!(fabs(v - want[i]) <= tol * (1.0 + fabs(want[i])))) {
      tu_fail(__FILE__, __LINE__, "%s, rank %d: element %lld is %.17g, expected %.17g (tol %g)", what,
              R->ctx->rank, (long long)i, v, want[i], tol);
      ok = false;
    }
  }
  dt_array_free(R->ctx, &full);
  return ok;
}

bool ot_check_vals(ot_rank *R, const char *what, const dt_tensor *t, int ndim, const int64_t *sh,
                   const double *want, double tol) {
  return ot_check_vals_dt(R, what, t, DT_F64, ndim, sh, want, tol);
}

void ot_fd_grad(double *x, int64_t n, double h, ot_loss_fn loss, void *arg, double *grad) {
  for (int64_t i = 0; i < n; i++) {
    double v = x[i];
    x[i] = v + h;
    double lp = loss(arg);
    x[i] = v - h;
    double lm = loss(arg);
    x[i] = v;
    grad[i] = (lp - lm) / (2 * h);
  }
}

void ot_grad_check(ot_rank *R, const char *what, const dt_op *op, const dt_op_attrs *a, int n_in,
                   ot_arr *in, dt_placement pl[][DT_MAX_MESH_DIMS], const ot_arr *G, ot_loss_fn loss,
                   void *arg, double h, double tol) {
  dt_ctx *ctx = R->ctx;
  tu_count(); /* one check: the op's backward (each input's gradient counts one more) */
  int n = n_in;
  dt_tensor t[3], y, g, gin[3];
  int made = 0;
  bool have_y = false, have_g = false;
  dt_status s = DT_OK;
  for (int j = 0; j < n; j++) {
    DT_CHECK_GOTO(ot_make(R, DT_F64, in[j].ndim, in[j].sh, in[j].v, pl[j], &t[j]), s, fail);
    made++;
  }
  const dt_tensor *ip[3] = {&t[0], &t[1], &t[2]};
  dt_tensor *yp[1] = {&y};
  DT_CHECK_GOTO(dt_op_call(ctx, op, a, ip, yp, NULL), s, fail);
  have_y = true;
  dt_placement gpl[DT_MAX_MESH_DIMS];
  for (int i = 0; i < R->m; i++) gpl[i] = y.pl[i].kind == DT_PL_PARTIAL ? dt_replicate() : y.pl[i];
  DT_CHECK_GOTO(ot_make(R, DT_F64, G->ndim, G->sh, G->v, gpl, &g), s, fail);
  have_g = true;
  const dt_tensor *yo[1] = {&y}, *go[1] = {&g};
  dt_tensor *gp[3] = {&gin[0], n > 1 ? &gin[1] : NULL, n > 2 ? &gin[2] : NULL};
  DT_CHECK_GOTO(op->backward(ctx, a, ip, yo, go, gp), s, fail);
  for (int j = 0; j < n; j++) {
    int64_t ne = dt_shape_numel(in[j].ndim, in[j].sh);
    double *want = malloc((size_t)(ne > 0 ? ne : 1) * sizeof *want);
    if (!want) {
      tu_fail(__FILE__, __LINE__, "%s, rank %d: out of memory", what, ctx->rank);
    } else {
      ot_fd_grad(in[j].v, ne, h, loss, arg, want);
      char w2[400];
      snprintf(w2, sizeof w2, "%s: gradient of input %d", what, j);
      ot_check_vals(R, w2, &gin[j], in[j].ndim, in[j].sh, want, tol);
      free(want);
    }
    dt_tensor_free(ctx, &gin[j]);
  }
  R->cases++;
  goto done;
fail:
  tu_fail(__FILE__, __LINE__, "%s, rank %d: %s: %s", what, ctx->rank, dt_status_str(s), dt_last_error(ctx));
done:
  if (have_g) dt_tensor_free(ctx, &g);
  if (have_y) dt_tensor_free(ctx, &y);
  for (int j = 0; j < made; j++) dt_tensor_free(ctx, &t[j]);
}

dt_status ot_rank_open(ot_rank *R, dt_ctx *ctx, const char *label, int ndim, const int *shape) {
  static const char *const NAMES[] = {"dp", "tp"};
  const char *const *names = ndim == 1 ? &NAMES[1] : NAMES;
  memset(R, 0, sizeof *R);
  R->ctx = ctx;
  R->mlabel = label;
  R->m = ndim;
  for (int i = 0; i < ndim; i++) R->ms[i] = shape[i];
  dt_status s = dt_mesh_create(ctx, ctx->world, ndim, shape, names, &R->mesh);
  if (s != DT_OK)
    tu_fail(__FILE__, __LINE__, "mesh %s, rank %d: dt_mesh_create -> %s: %s", label, ctx->rank,
            dt_status_str(s), dt_last_error(ctx));
  return s;
}

void ot_rank_close(ot_rank *R, size_t mem0) {
  dt_ctx *ctx = R->ctx;
  /* every output, gradient and temporary of the ops was freed */
  TU_CHECK(ctx->mem.host_cur == mem0, "mesh %s, rank %d: host memory %zu bytes at the end, %zu at the start",
           R->mlabel, ctx->rank, ctx->mem.host_cur, mem0);
  dt_mesh_free(R->mesh);
}

double ot_launch(dt_backend backend, const char *label, int ndim, const int *shape, dt_spmd_fn fn,
                 void *arg) {
  dt_launch_opts lo = {.backend = backend, .timeout_s = 60};
  tu_launch_device(&lo);
  lo.world = 1;
  for (int d = 0; d < ndim; d++) lo.world *= shape[d];
  dt_launch_report rep;
  double t1 = dt_now();
  dt_status s = dt_launch(&lo, fn, arg, &rep);
  if (s != DT_OK)
    tu_fail(__FILE__, __LINE__, "mesh %s: launch: rank %d: %s", label, rep.failed_rank, rep.failed_msg);
  dt_launch_report_free(&rep);
  return dt_now() - t1;
}
