/* verify/test_kern_layout.c: the layout kernels (dt_kern_layout of
 * lib/device/kernels.h) against naive host references written here, on the
 * cuda-emu device or, built with -DKERN_ON_CUDA (test_kern_layout_cuda), on
 * GPU 0 (SKIP without one), or with -DKERN_ON_CPU (test_kern_layout_cpu) on the
 * CPU device's host loops.
 *
 * copy_box: 0-D to 5-D boxes at random offsets inside random shapes, element
 * sizes 2 (bf16), 4 (f32), 8 (f64, i64) and 1/16 (odd words), compared byte for
 * byte with an element-by-element multi-index copy over the whole destination
 * (what lies outside the box must stay as it was). The oracle walks every
 * element with its own index arithmetic, not the kernel's row folding.
 * reduce: every op, f32/f64/bf16, 1, 3 and 33 inputs (33 runs two rounds),
 * against a double-precision fold of the same rounded inputs; NaN propagation
 * of max/min; in place (out is input 0).
 */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kerntest.h"

/* splitmix64: the test's own deterministic generator */
static uint64_t rnd(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* ---- copy_box ------------------------------------------------------------------ */

/* Element-by-element reference: for every index i of the box,
 * dst[dst_off + i] = src[src_off + i]. */
static void ref_copy_box(size_t es, int nd, unsigned char *dst, const int64_t *dsh,
                         const int64_t *doff, const unsigned char *src, const int64_t *ssh,
                         const int64_t *soff, const int64_t *box) {
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= box[d];
  for (int64_t e = 0; e < n; e++) {
    int64_t rest = e, si = 0, di = 0, sst = 1, dst_ = 1;
    for (int d = nd - 1; d >= 0; d--) {
      int64_t i = rest % box[d];
      rest /= box[d];
      si += (soff[d] + i) * sst;
      di += (doff[d] + i) * dst_;
      sst *= ssh[d];
      dst_ *= dsh[d];
    }
    memcpy(dst + di * (int64_t)es, src + si * (int64_t)es, es);
  }
}

static int64_t numel(int nd, const int64_t *s) {
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= s[d];
  return n;
}

static long copy_cases;

/* One case: the given box shape, shapes and offsets drawn around it. full_inner:
 * the trailing dims span the whole shapes (the folded, contiguous case). */
static void one_copy(kt_dev *T, uint64_t *rs, size_t es, int nd, const int64_t *box, bool full_inner) {
  int64_t ssh[DT_MAX_DIMS], dsh[DT_MAX_DIMS], soff[DT_MAX_DIMS], doff[DT_MAX_DIMS];
  for (int d = 0; d < nd; d++) {
    bool whole = full_inner && d >= nd / 2;
    soff[d] = whole ? 0 : (int64_t)(rnd(rs) % 3);
    doff[d] = whole ? 0 : (int64_t)(rnd(rs) % 3);
    ssh[d] = box[d] + soff[d] + (whole ? 0 : (int64_t)(rnd(rs) % 2));
    dsh[d] = box[d] + doff[d] + (whole ? 0 : (int64_t)(rnd(rs) % 2));
  }
  size_t sb = (size_t)numel(nd, ssh) * es, db = (size_t)numel(nd, dsh) * es;
  unsigned char *hs = malloc(sb), *hd = malloc(db), *want = malloc(db), *got = malloc(db);
  for (size_t i = 0; i < sb; i++) hs[i] = (unsigned char)rnd(rs);
  for (size_t i = 0; i < db; i++) hd[i] = (unsigned char)(0x5A ^ i);
  memcpy(want, hd, db);
  ref_copy_box(es, nd, want, dsh, doff, hs, ssh, soff, box);
  void *ds = kt_up(T, hs, sb), *dd = kt_up(T, hd, db);
  TU_OK(T->ctx, T->K->layout->copy_box(T->dev, es, nd, dd, dsh, doff, ds, ssh, soff, box));
  kt_down(T, got, dd, db);
  size_t bad = db;
  for (size_t i = 0; i < db && bad == db; i++)
    if (got[i] != want[i]) bad = i;
  char bs[64];
  {
    size_t k = (size_t)snprintf(bs, sizeof bs, "[");
    for (int d = 0; d < nd && k < sizeof bs; d++)
      k += (size_t)snprintf(bs + k, sizeof bs - k, "%s%lld", d ? "," : "", (long long)box[d]);
    if (k < sizeof bs) snprintf(bs + k, sizeof bs - k, "]");
  }
  TU_CHECK(bad == db, "copy_box es=%zu %d-D box %s: byte %zu of %zu is 0x%02x, expected 0x%02x", es,
           nd, bs, bad, db, bad < db ? got[bad] : 0, bad < db ? want[bad] : 0);
  kt_free(T, ds, sb);
  kt_free(T, dd, db);
  free(hs), free(hd), free(want), free(got);
  copy_cases++;
}

static void test_copy_box(kt_dev *T) {
  uint64_t rs = 12345;
  static const size_t ess[] = {1, 2, 4, 8, 16};
  for (int ei = 0; ei < 5; ei++) {
    size_t es = ess[ei];
    for (int nd = 0; nd <= 5; nd++) {
      for (int rep = 0; rep < 6; rep++) {
        int64_t box[DT_MAX_DIMS];
        for (int d = 0; d < nd; d++) box[d] = 1 + (int64_t)(rnd(&rs) % (nd <= 2 ? 9 : 4));
        one_copy(T, &rs, es, nd, box, rep % 2 == 1);
      }
    }
    /* long runs: several grid-stride rounds and a row wider than a block */
    int64_t b1[1] = {100003}, b2[2] = {3, 1027}, b3[3] = {257, 2, 3};
    one_copy(T, &rs, es, 1, b1, false);
    one_copy(T, &rs, es, 2, b2, false);
    one_copy(T, &rs, es, 2, b2, true);
    one_copy(T, &rs, es, 3, b3, false);
  }
  /* an empty box copies nothing (the destination stays as it was) */
  int64_t e3[3] = {2, 0, 3};
  one_copy(T, &rs, 4, 3, e3, false);
  printf("layout.copy_box: %ld cases, 0-D..5-D, element sizes 1, 2, 4, 8, 16\n", copy_cases);
}

/* ---- reduce ----------------------------------------------------------------------- */

static const char *const op_names[] = {"sum", "avg", "max", "min", "prod"};

static void one_reduce(kt_dev *T, dt_dtype t, int op, int nin, int64_t n, bool in_place) {
  size_t es = dt_dtype_size(t);
  double **x = calloc((size_t)nin, sizeof *x);
  void **h = calloc((size_t)nin, sizeof *h), **dv = calloc((size_t)nin, sizeof *dv);
  double *want = malloc((size_t)n * sizeof *want), *got = malloc((size_t)n * sizeof *got);
  /* sum/avg: positive inputs, so sum |x| = |sum| and the bound below is relative;
   * prod: near 1, so 33 factors stay far from overflow */
  bool nan_case = (op == DT_KRED_MAX || op == DT_KRED_MIN) && nin > 1 && n > 3;
  double lo = op == DT_KRED_PROD ? 0.9 : op <= DT_KRED_AVG ? 0.5 : -4;
  double hi = op == DT_KRED_PROD ? 1.1 : op <= DT_KRED_AVG ? 1.5 : 4;
  for (int m = 0; m < nin; m++) {
    x[m] = malloc((size_t)n * sizeof **x);
    kt_uniform(x[m], n, 99, (uint64_t)(m * 7 + op), lo, hi);
    if (nan_case && m == nin - 1) x[m][3] = NAN;
    h[m] = kt_pack(t, x[m], n);
    kt_unpack(t, h[m], x[m], n); /* the reference sees the rounded inputs */
    dv[m] = kt_up(T, h[m], (size_t)n * es);
  }
  for (int64_t i = 0; i < n; i++) {
    double a = x[0][i];
    for (int m = 1; m < nin; m++) {
      double y = x[m][i];
      if (op == DT_KRED_MAX) a = (isnan(a) || isnan(y)) ? NAN : fmax(a, y);
      else if (op == DT_KRED_MIN) a = (isnan(a) || isnan(y)) ? NAN : fmin(a, y);
      else if (op == DT_KRED_PROD) a *= y;
      else a += y;
    }
    if (op == DT_KRED_AVG) a /= nin;
    want[i] = a;
  }
  void *out = in_place ? dv[0] : kt_up(T, NULL, (size_t)n * es);
  TU_OK(T->ctx, T->K->layout->reduce(T->dev, t, op, n, nin, (const void *const *)dv, out, nin));
  void *hg = malloc((size_t)n * es);
  kt_down(T, hg, out, (size_t)n * es);
  kt_unpack(t, hg, got, n);
  /* max/min select one input: exact. sum/prod: nin-1 roundings of the
   * arithmetic type (relative, as the operands are positive), avg one more;
   * then one rounding to t per round (bf16 stores the running result between
   * rounds of DT_KRED_MAX_IN inputs). */
  int rounds = nin <= DT_KRED_MAX_IN ? 1 : 1 + (nin - DT_KRED_MAX_IN + DT_KRED_MAX_IN - 2) / (DT_KRED_MAX_IN - 1);
  double ua = kt_unit(t == DT_F64 ? DT_F64 : DT_F32);
  double tol = op == DT_KRED_MAX || op == DT_KRED_MIN
                   ? 0
                   : (nin - 1 + (op == DT_KRED_AVG)) * ua * 1.01 + rounds * kt_unit(t);
  /* a relative bound: kt_mismatch scales by max(1, |want|); sum reaches nin * 1.5 */
  char what[96];
  snprintf(what, sizeof what, "reduce %s %s nin=%d n=%lld%s", op_names[op], dt_dtype_name(t), nin,
           (long long)n, in_place ? " in place" : "");
  if (nan_case) {
    TU_CHECK(isnan(got[3]), "%s: a NaN input must win, got %g", what, got[3]);
    got[3] = want[3] = 0; /* checked: the comparison below counts NaN as a mismatch */
  }
  kt_close_to(what, got, want, n, tol);
  if (!in_place) kt_free(T, out, (size_t)n * es);
  for (int m = 0; m < nin; m++) {
    kt_free(T, dv[m], (size_t)n * es);
    free(x[m]), free(h[m]);
  }
  free(x), free(h), free(dv), free(want), free(got), free(hg);
}

static void test_reduce(kt_dev *T) {
  static const dt_dtype ts[] = {DT_F32, DT_F64, DT_BF16};
  static const int nins[] = {1, 3, 33};
  static const int64_t ns[] = {1, 7, 1000, 100003};
  long cases = 0;
  for (int ti = 0; ti < 3; ti++)
    for (int op = DT_KRED_SUM; op <= DT_KRED_PROD; op++)
      for (int ni = 0; ni < 3; ni++)
        for (int si = 0; si < 4; si++) {
          if (nins[ni] == 33 && ns[si] > 1000) continue; /* rounds are covered at 1000 */
          one_reduce(T, ts[ti], op, nins[ni], ns[si], false);
          cases++;
        }
  for (int ti = 0; ti < 3; ti++) {
    one_reduce(T, ts[ti], DT_KRED_SUM, 4, 1003, true);
    one_reduce(T, ts[ti], DT_KRED_AVG, 33, 77, true);
    cases += 2;
  }
  printf("layout.reduce: %ld cases, sum/avg/max/min/prod x f32/f64/bf16, 1..33 inputs\n", cases);
}

/* The oracle's own check: a planted one-byte error is reported. */
static void test_guards(void) {
  unsigned char a[4] = {1, 2, 3, 4}, b[8] = {0};
  int64_t as[1] = {4}, bs[1] = {8}, z[1] = {0}, o[1] = {2}, box[1] = {4};
  ref_copy_box(1, 1, b, bs, o, a, as, z, box);
  TU_CHECK(b[0] == 0 && b[2] == 1 && b[5] == 4 && b[6] == 0, "reference copy_box misplaces bytes");
}

int main(void) {
  dt_ctx ctx;
  kt_dev T;
  int rc = kt_start(&T, &ctx);
  if (rc) return rc;
  test_guards();
  test_copy_box(&T);
  test_reduce(&T);
  return kt_end(&T, &ctx, KT_NAME("test_kern_layout"));
}
