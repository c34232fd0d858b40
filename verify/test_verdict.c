/* verify/test_verdict.c: the oracle for the sharded-vs-unsharded comparison of
 * bench/harness/verdict.c (what `shardbench run`/`sweep` and verify/test_parallel
 * judge with), on hand-made arrays whose errors are worked out here:
 *   - normwise error: max |got - ref| / max |ref|, with values that are exact
 *     binary fractions, so the expected errors are exact (compared with ==);
 *   - the worst quantity is the largest error / tolerance (not the largest
 *     error), the first one on ties, and its name is kept;
 *   - NaN anywhere makes that quantity the worst, and a later finite error
 *     does not displace it;
 *   - an all-zero reference: 0 when got is all zero too, +inf otherwise;
 *   - a length mismatch: +inf, named with both lengths;
 *   - no quantity compared is not ok;
 *   - the merge over ranks (3 threads) picks the worst rank's record, the lowest
 *     rank on ties, and the largest absolute error of any rank;
 *   - gathering (2 threads): a Shard(0) and a Partial(sum) f64/f32 tensor come
 *     back as the global array that was distributed.
 */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../bench/harness/verdict.h"
#include "optest.h"
#include "testutil.h"

static void test_known_worst(void) {
  const double ref_a[3] = {1, -4, 2}, got_a[3] = {1, -4.5, 2};   /* abs 0.5, rel 0.125 */
  const double ref_b[2] = {8, 0.25}, got_b[2] = {8.5, 0.25};     /* abs 0.5, rel 1/16 */
  const double ref_c[2] = {-2, 1}, got_c[2] = {-2, 1};           /* 0 */
  sb_cmp c;
  sb_cmp_init(&c);
  TU_CHECK(!sb_cmp_ok(&c), "nothing compared must not be ok");
  /* tolerances: a's ratio 0.125/0.25 = 0.5; b's (1/16)/(1/32) = 2 (over): b is the
   * worst although a's relative error is larger */
  double ra = sb_cmp_add(&c, "a", got_a, 3, ref_a, 3, 0.25);
  double rb = sb_cmp_add(&c, "b", got_b, 2, ref_b, 2, 1.0 / 32);
  double rc = sb_cmp_add(&c, "c", got_c, 2, ref_c, 2, 1e-9);
  TU_CHECK(ra == 0.125 && rb == 1.0 / 16 && rc == 0, "rel errors %.17g %.17g %.17g", ra, rb, rc);
  TU_CHECK(!strcmp(c.worst, "b") && c.worst_rel == 1.0 / 16 && c.worst_abs == 0.5 &&
               c.worst_tol == 1.0 / 32,
           "worst '%s' rel %.17g abs %.17g tol %.17g, expected b 0.0625 0.5 0.03125", c.worst,
           c.worst_rel, c.worst_abs, c.worst_tol);
  TU_CHECK(c.n == 3 && c.n_over == 1 && c.max_abs == 0.5, "n %lld over %lld max_abs %.17g",
           (long long)c.n, (long long)c.n_over, c.max_abs);
  TU_CHECK(!sb_cmp_ok(&c), "b is over its tolerance: not ok");

  /* all within: ok, and the worst is still named (first on ties: two zeros) */
  sb_cmp d;
  sb_cmp_init(&d);
  sb_cmp_add(&d, "zero1", got_c, 2, ref_c, 2, 1e-9);
  sb_cmp_add(&d, "zero2", got_c, 2, ref_c, 2, 1e-9);
  TU_CHECK(sb_cmp_ok(&d) && !strcmp(d.worst, "zero1") && d.worst_rel == 0,
           "ties keep the first: '%s', ok %d", d.worst, (int)sb_cmp_ok(&d));
  sb_cmp_add(&d, "a", got_a, 3, ref_a, 3, 0.25);
  TU_CHECK(sb_cmp_ok(&d) && !strcmp(d.worst, "a"), "a within tolerance is the worst: '%s'",
           d.worst);
}

static void test_nan(void) {
  const double ref[3] = {1, 2, 4}, got_nan[3] = {1, NAN, 4}, got_big[3] = {1, 2, 100};
  sb_cmp c;
  sb_cmp_init(&c);
  double r = sb_cmp_add(&c, "nan", got_nan, 3, ref, 3, 1e-3);
  TU_CHECK(isnan(r) && isnan(c.worst_rel) && !strcmp(c.worst, "nan") && c.n_over == 1,
           "NaN in got: rel %g, worst '%s', over %lld", r, c.worst, (long long)c.n_over);
  sb_cmp_add(&c, "big", got_big, 3, ref, 3, 1e-3); /* rel 24: finite, must not displace NaN */
  TU_CHECK(!strcmp(c.worst, "nan") && c.n_over == 2 && isnan(c.max_abs),
           "NaN must stay the worst: '%s', over %lld, max_abs %g", c.worst, (long long)c.n_over,
           c.max_abs);
  /* a NaN after a finite error takes over; a NaN in the reference counts too */
  sb_cmp d;
  sb_cmp_init(&d);
  sb_cmp_add(&d, "big", got_big, 3, ref, 3, 1e-3);
  sb_cmp_add(&d, "refnan", ref, 3, got_nan, 3, 1e-3);
  TU_CHECK(!strcmp(d.worst, "refnan") && isnan(d.worst_rel), "NaN in ref: worst '%s' rel %g",
           d.worst, d.worst_rel);
}

static void test_zero_ref(void) {
  const double zero[2] = {0, 0}, tiny[2] = {0, 0x1p-1000};
  sb_cmp c;
  sb_cmp_init(&c);
  double r0 = sb_cmp_add(&c, "zeros", zero, 2, zero, 2, 1e-9);
  TU_CHECK(r0 == 0 && sb_cmp_ok(&c), "zero vs zero: rel %g", r0);
  double r1 = sb_cmp_add(&c, "tiny", tiny, 2, zero, 2, 1e-9);
  TU_CHECK(isinf(r1) && r1 > 0 && !strcmp(c.worst, "tiny") && c.worst_abs == 0x1p-1000 &&
               !sb_cmp_ok(&c),
           "nonzero vs an all-zero reference: rel %g (want +inf), worst '%s'", r1, c.worst);
}

static void test_length(void) {
  const double a[3] = {1, 2, 3}, b[2] = {1, 2};
  sb_cmp c;
  sb_cmp_init(&c);
  double r = sb_cmp_add(&c, "w grad step 0", a, 3, b, 2, 1);
  TU_CHECK(isinf(r) && isinf(c.worst_abs) && !sb_cmp_ok(&c) &&
               !strcmp(c.worst, "w grad step 0 (3 elements, reference 2)"),
           "length mismatch: rel %g, worst '%s'", r, c.worst);
  sb_cmp d;
  sb_cmp_init(&d);
  TU_CHECK(isinf(sb_cmp_add(&d, "missing", a, 3, NULL, 0, 1)), "a missing reference is +inf");
}

/* ---- across ranks ---- */

static dt_status merge_rank(dt_ctx *ctx, void *arg) {
  (void)arg;
  /* rank r's record: rank 1 and 2 tie for the worst ratio (2), rank 2 has the
   * largest max_abs (7), rank 0 is within tolerance */
  static const double rel[3] = {0.5, 0.25, 0.25}, tol[3] = {1, 0.125, 0.125},
                      max_abs[3] = {1, 3, 7};
  sb_cmp c;
  sb_cmp_init(&c);
  c.worst_rel = rel[ctx->rank];
  c.worst_tol = tol[ctx->rank];
  c.worst_abs = 1;
  c.max_abs = max_abs[ctx->rank];
  c.n = 10 + ctx->rank;
  c.n_over = ctx->rank;
  snprintf(c.worst, sizeof c.worst, "quantity of rank %d", ctx->rank);
  dt_status s = sb_cmp_merge(ctx->world, &c);
  TU_OK(ctx, s);
  TU_CHECK(!strcmp(c.worst, "quantity of rank 1") && c.worst_rel == 0.25 && c.n == 11 &&
               c.n_over == 1 && c.max_abs == 7,
           "rank %d: merged worst '%s' rel %g n %lld over %lld max_abs %g; want rank 1's, max_abs "
           "7", ctx->rank, c.worst, c.worst_rel, (long long)c.n, (long long)c.n_over, c.max_abs);
  return s;
}

static dt_status gather_rank(dt_ctx *ctx, void *arg) {
  (void)arg;
  const int shape[1] = {2};
  const char *const nm[1] = {"dp"};
  dt_mesh *mesh = NULL;
  DT_CHECK(dt_mesh_create(ctx, ctx->world, 1, shape, nm, &mesh));
  static const double g64[6] = {1, -2, 0.5, 3, -0.25, 8}; /* exact under /2 and *2 */
  static const float g32[6] = {1, -2, 0.5f, 3, -0.25f, 8};
  const int64_t gshape[2] = {3, 2};
  dt_status s = DT_OK;
  for (int k = 0; k < 4 && s == DT_OK; k++) {
    const bool f64 = k < 2, partial = k % 2;
    dt_array a;
    s = dt_array_wrap(ctx, DT_DEV_CPU, f64 ? DT_F64 : DT_F32, 2, gshape,
                      f64 ? (void *)g64 : (void *)g32, &a);
    dt_placement pl[1] = {partial ? dt_partial(DT_RED_SUM) : dt_shard(0)};
    dt_tensor t;
    if (s == DT_OK) s = dt_tensor_distribute(ctx, mesh, &a, pl, &t);
    TU_OK(ctx, s);
    if (s != DT_OK) break;
    double *v = NULL;
    int64_t n = 0;
    s = sb_gather_f64(ctx, &t, &v, &n);
    TU_OK(ctx, s);
    bool same = s == DT_OK && n == 6;
    for (int i = 0; same && i < 6; i++) same = v[i] == g64[i];
    TU_CHECK(same, "rank %d: gather of a %s %s tensor differs from the global array", ctx->rank,
             f64 ? "f64" : "f32", partial ? "Partial(sum)" : "Shard(0)");
    free(v);
    dt_tensor_free(ctx, &t);
  }
  dt_mesh_free(mesh);
  return s;
}

int main(int argc, char **argv) {
  tu_opts o;
  tu_parse(argc, argv, &o);
  test_known_worst();
  test_nan();
  test_zero_ref();
  test_length();
  ot_launch(DT_BACKEND_THREADS, "merge", 1, (const int[]){3}, merge_rank, NULL);
  ot_launch(DT_BACKEND_THREADS, "gather", 1, (const int[]){2}, gather_rank, NULL);
  return tu_finish("test_verdict");
}
