/* verify/test_hardware.c: the hardware files and bench/harness/hardware.c.
 *
 *   - every shipped file (results/hardware/ of the data dir) loads by name, has
 *     the six expected systems among it, and, by a naive scan of its text done
 *     here, cites every numeric key (a trailing comment or a source.KEY line);
 *   - on a file written here with round numbers, the unit costs against the
 *     formulas worked out in this test: GEMM efficiency at, between (linear in
 *     log10 flops) and beyond the table's points (clamped), batch, unrated dtype;
 *     memory-bound time; every collective's steps, bus factor and link (one
 *     node, several nodes, one GPU per node, a slow NVLink), tree and ring,
 *     send/recv, barrier, groups of one, unknown ops;
 *   - every bad-input case gives -1, "FILE:LINE: reason" with the right line,
 *     and an empty sb_hw; a planted uncited number is refused;
 *   - planted bugs: an oracle with linear (not log) interpolation, and one with
 *     all_reduce's bus factor (n-1)/n, differ from the library by far more than
 *     the tolerance, so these checks can fail.
 * Tolerance: relative 1e-12 — the test computes the same closed forms in its
 * own order; only double rounding differs (a few ulps).
 * Extra arguments: paths of hardware files to load and scan as the shipped ones
 * (verify/hardware.sh passes a fresh bench/calibrate-local.sh output).
 */
#include "config.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../bench/harness/datadir.h"
#include "../bench/harness/hardware.h"
#include "testutil.h"

/* the formulas of the test and of hardware.c in another order of operations: a few ulps */
static const double TOL = 1e-12;
static char tmpdir[256];

#define close_to(got, want) tu_close((got), (want), TOL)
/* CHECK_NEAR(got, want, printf format and arguments naming the check) */
#define CHECK_NEAR(got, want, ...) TU_CHECK_REL((got), (want), TOL, __VA_ARGS__)

/* Writes text to tmpdir/name; returns the path (static buffer per call site). */
static const char *put_file(const char *name, const char *text, char *path, size_t n) {
  snprintf(path, n, "%s/%s", tmpdir, name);
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "test_hardware: cannot write %s\n", path);
    exit(1);
  }
  fputs(text, f);
  fclose(f);
  return path;
}

/* ---- a naive citation scan (independent of the loader's parser) ------------------- */

/* Every "key = value" line whose key is not description/source.* and whose value
 * starts like a number must have a '#' after the value or a "source.key =" line. */
static int uncited_lines(const char *text, char *first_key, size_t n) {
  int bad = 0, line = 0;
  const char *p = text;
  while (*p) {
    const char *e = strchr(p, '\n');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    char buf[4096];
    snprintf(buf, sizeof buf, "%.*s", (int)(len < sizeof buf ? len : sizeof buf - 1), p);
    line++;
    char *s = buf;
    while (*s == ' ' || *s == '\t') s++;
    char *eq = strchr(s, '=');
    if (*s && *s != '#' && eq && strncmp(s, "source.", 7) && strncmp(s, "description", 11)) {
      char key[128];
      size_t kl = (size_t)(eq - s);
      while (kl && (s[kl - 1] == ' ' || s[kl - 1] == '\t')) kl--;
      snprintf(key, sizeof key, "%.*s", (int)kl, s);
      bool hash = strchr(eq, '#') != NULL;
      char pat[160];
      snprintf(pat, sizeof pat, "source.%s =", key);
      bool src = strstr(text, pat) != NULL;
      if (!hash && !src) {
        if (!bad) snprintf(first_key, n, "%s (line %d)", key, line);
        bad++;
      }
    }
    p = e ? e + 1 : p + len;
  }
  return bad;
}

static void check_loaded(const char *what, const sb_hw *h) {
  char k[200] = "";
  TU_CHECK(h->text && uncited_lines(h->text, k, sizeof k) == 0, "%s: uncited number: %s", what, k);
  bool rated = false;
  for (int d = 0; d < SB_HW_NDTYPES; d++) {
    if (h->peak_flops[d] > 0) rated = true;
    TU_CHECK((h->peak_flops[d] > 0) == (h->n_gemm[d] > 0), "%s: dtype %d peak %g, %d points", what,
             d, h->peak_flops[d], h->n_gemm[d]);
    for (int i = 0; i < h->n_gemm[d]; i++)
      TU_CHECK(h->gemm[d][i].eff > 0 && h->gemm[d][i].eff <= 1 &&
                   (i == 0 || h->gemm[d][i].flops > h->gemm[d][i - 1].flops),
               "%s: dtype %d point %d", what, d, i);
  }
  TU_CHECK(rated, "%s: no dtype rated", what);
  TU_CHECK(h->hbm_bytes > 0 && h->hbm_bw > 0 && h->hbm_eff > 0 && h->hbm_eff <= 1 &&
               h->gpus_per_node >= 1 && h->intra_bw > 0 && h->inter_bw > 0 &&
               h->reserved_bytes < h->hbm_bytes,
           "%s: a field out of range", what);
}

static void test_shipped(void) {
  char res[SB_DATA_PATH], dir[SB_DATA_PATH + 16];
  sb_data_dir(SB_DATA_RESULTS, NULL, res, sizeof res);
  snprintf(dir, sizeof dir, "%s/hardware", res);
  const char *expect[] = {"h100-sxm-80gb", "h100-96gb", "h200", "a100-80gb", "b200", "local"};
  bool seen[6] = {false};
  DIR *d = opendir(dir);
  TU_CHECK(d != NULL, "cannot list %s", dir);
  if (!d) return;
  int nfiles = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.' || !strcmp(e->d_name, "README.md")) continue;
    sb_hw h;
    char err[512];
    int rc = sb_hw_load(e->d_name, &h, err, sizeof err);
    TU_CHECK(rc == 0, "shipped %s does not load: %s", e->d_name, err);
    if (rc) continue;
    nfiles++;
    TU_CHECK(!strcmp(h.name, e->d_name), "name '%s' for file %s", h.name, e->d_name);
    check_loaded(e->d_name, &h);
    for (int i = 0; i < 6; i++)
      if (!strcmp(e->d_name, expect[i])) seen[i] = true;
    sb_hw_free(&h);
    TU_CHECK(h.text == NULL, "sb_hw_free leaves text");
  }
  closedir(d);
  for (int i = 0; i < 6; i++) TU_CHECK(seen[i], "no shipped hardware file %s in %s", expect[i], dir);
  TU_CHECK(nfiles >= 6, "%d files", nfiles);
}

/* ---- the unit costs on a file of round numbers ---------------------------------------- */

static const char *GOOD =
    "# a test system\n"
    "description = test box # not a comment: free text\n"
    "peak_bf16_tflops = 100  # t\n"
    "peak_fp8_tflops = 200\n"
    "source.peak_fp8_tflops = t\n"
    "gemm_bf16 = 1e9:0.2 1e11:0.6 1e12:0.8  # t\n"
    "gemm_fp8 = 1e9:0.5  # t\n"
    "hbm_gib = 80  # t\n"
    "hbm_tbps = 2  # t\n"
    "hbm_eff = 0.5  # t\n"
    "gpus_per_node = 8  # t\n"
    "intra_gbps = 100  # t\n"
    "intra_lat_us = 2  # t\n"
    "inter_gbps = 10  # t\n"
    "inter_lat_us = 5  # t\n"
    "coll_base_lat_us = 1  # t\n"
    "alloc_overhead = 0.05  # t\n"
    "reserved_gb = 2  # t\n";

static void test_costs(void) {
  char path[512], err[512];
  sb_hw h;
  put_file("good", GOOD, path, sizeof path);
  int rc = sb_hw_load(path, &h, err, sizeof err);
  TU_CHECK(rc == 0, "good file: %s", err);
  if (rc) return;
  TU_CHECK(!strcmp(h.name, "good") && !strcmp(h.path, path), "name '%s' path '%s'", h.name, h.path);
  CHECK_NEAR(h.hbm_bytes, 80.0 * 1024 * 1024 * 1024, "hbm_gib");
  CHECK_NEAR(h.reserved_bytes, 2e9, "reserved_gb");
  CHECK_NEAR(h.peak_flops[SB_HW_FP8], 200e12, "fp8 peak via source.KEY");
  TU_CHECK(h.peak_flops[SB_HW_F32] == 0 && h.n_gemm[SB_HW_F32] == 0, "f32 not rated");
  TU_CHECK(sb_hw_dtype("bf16") == SB_HW_BF16 && sb_hw_dtype("fp8") == SB_HW_FP8 &&
               sb_hw_dtype("f32") == SB_HW_F32 && sb_hw_dtype("f64") == SB_HW_F32 &&
               sb_hw_dtype("f16") == -1 && sb_hw_dtype(NULL) == -1,
           "sb_hw_dtype");

  /* GEMM: 2 m n k = 1e9 exactly at the first point: eff 0.2 */
  const double P = 100e12;
  CHECK_NEAR(sb_hw_gemm_s(&h, SB_HW_BF16, 1000, 500, 1000, 1), 1e9 / (P * 0.2), "gemm at 1e9");
  CHECK_NEAR(sb_hw_gemm_s(&h, SB_HW_BF16, 1000, 500, 1000, 3), 3e9 / (P * 0.2), "gemm batch 3");
  /* at the second point (1e11): 0.6 */
  CHECK_NEAR(sb_hw_gemm_s(&h, SB_HW_BF16, 5000, 1000, 10000, 1), 1e11 / (P * 0.6), "gemm at 1e11");
  /* halfway in log between 1e9 and 1e11 (1e10): 0.4 */
  CHECK_NEAR(sb_hw_gemm_s(&h, SB_HW_BF16, 1000, 5000, 1000, 1), 1e10 / (P * 0.4), "gemm at 1e10");
  /* 3e10: 0.2 + 0.4 (log10(3e10) - 9) / 2 */
  const double e3 = 0.2 + 0.4 * (log10(3e10) - 9) / 2;
  CHECK_NEAR(sb_hw_gemm_s(&h, SB_HW_BF16, 1000, 15000, 1000, 1), 3e10 / (P * e3), "gemm at 3e10");
  /* the second segment: 3e11 -> 0.6 + 0.2 log10(3) */
  const double e4 = 0.6 + 0.2 * (log10(3e11) - 11);
  CHECK_NEAR(sb_hw_gemm_s(&h, SB_HW_BF16, 15000, 1000, 10000, 1), 3e11 / (P * e4), "gemm at 3e11");
  /* clamped: 2e6 -> 0.2, 2e13 -> 0.8 */
  CHECK_NEAR(sb_hw_gemm_s(&h, SB_HW_BF16, 100, 100, 100, 1), 2e6 / (P * 0.2), "gemm below the table");
  CHECK_NEAR(sb_hw_gemm_s(&h, SB_HW_BF16, 10000, 10000, 100000, 1), 2e13 / (P * 0.8),
             "gemm above the table");
  /* one-point table: constant; unrated dtype: inf; empty shapes: 0 */
  CHECK_NEAR(sb_hw_gemm_s(&h, SB_HW_FP8, 10, 10, 10, 7), 7 * 2e3 / (200e12 * 0.5), "fp8 one point");
  TU_CHECK(isinf(sb_hw_gemm_s(&h, SB_HW_F32, 10, 10, 10, 1)), "unrated f32 must be inf");
  TU_CHECK(isinf(sb_hw_gemm_s(&h, 7, 10, 10, 10, 1)) && isinf(sb_hw_gemm_s(&h, -1, 10, 10, 10, 1)),
           "bad dtype index must be inf");
  TU_CHECK(sb_hw_gemm_s(&h, SB_HW_BF16, 0, 10, 10, 1) == 0 &&
               sb_hw_gemm_s(&h, SB_HW_BF16, 10, 10, 10, 0) == 0,
           "empty GEMM must cost 0");
  /* planted bug: linear-in-flops interpolation at 1e10 gives 0.2 + 0.4 * 9e9 / 9.9e10 */
  double lin = 1e10 / (P * (0.2 + 0.4 * (1e10 - 1e9) / (1e11 - 1e9)));
  TU_CHECK(!close_to(sb_hw_gemm_s(&h, SB_HW_BF16, 1000, 5000, 1000, 1), lin),
           "planted bug (linear interpolation) not told apart");

  /* memory-bound */
  CHECK_NEAR(sb_hw_mem_s(&h, 3e9), 3e9 / (2e12 * 0.5), "mem 3 GB");
  TU_CHECK(sb_hw_mem_s(&h, 0) == 0, "mem 0");

  /* collectives: base 1 us, intra 2 us / 100 GB/s, inter 5 us / 10 GB/s */
  const double B = 1e-6, LI = 2e-6, LX = 5e-6, BI = 100e9, BX = 10e9, S = 1e9;
  /* one node, n = 8: ring 2(n-1) = 14 NVLink steps, factor 14/8 */
  CHECK_NEAR(sb_hw_coll_s(&h, "all_reduce", S, 8, 8, SB_HW_RING), B + 14 * LI + 14.0 / 8 * S / BI,
             "all_reduce 8 in a node");
  CHECK_NEAR(sb_hw_coll_s(&h, "all_gather", S, 8, 8, SB_HW_RING), B + 7 * LI + 7.0 / 8 * S / BI,
             "all_gather 8 in a node");
  CHECK_NEAR(sb_hw_coll_s(&h, "reduce_scatter", S, 8, 8, SB_HW_RING), B + 7 * LI + 7.0 / 8 * S / BI,
             "reduce_scatter 8 in a node");
  CHECK_NEAR(sb_hw_coll_s(&h, "broadcast", S, 8, 8, SB_HW_RING), B + 7 * LI + S / BI,
             "broadcast 8 in a node (factor 1)");
  CHECK_NEAR(sb_hw_coll_s(&h, "reduce", S, 4, 4, SB_HW_RING), B + 3 * LI + S / BI, "reduce 4");
  CHECK_NEAR(sb_hw_coll_s(&h, "all_to_all", S, 8, 8, SB_HW_RING), B + 7 * LI + 7.0 / 8 * S / BI,
             "all_to_all 8 in a node");
  /* two nodes of 8: all_reduce 30 steps, 2N = 4 across; busbw min(100, 10) */
  CHECK_NEAR(sb_hw_coll_s(&h, "all_reduce", S, 16, 8, SB_HW_RING),
             B + 26 * LI + 4 * LX + 30.0 / 16 * S / BX, "all_reduce 16 over 2 nodes");
  CHECK_NEAR(sb_hw_coll_s(&h, "all_gather", S, 16, 8, SB_HW_RING),
             B + 14 * LI + 1 * LX + 15.0 / 16 * S / BX, "all_gather 16 over 2 nodes");
  /* one GPU per node, 4 nodes: all_reduce 6 steps, tuning.cc's 2N = 8 capped at 6 */
  CHECK_NEAR(sb_hw_coll_s(&h, "all_reduce", S, 4, 1, SB_HW_RING), B + 6 * LX + 6.0 / 4 * S / BX,
             "all_reduce 4 nodes x 1");
  CHECK_NEAR(sb_hw_coll_s(&h, "all_gather", S, 4, 1, SB_HW_RING), B + 3 * LX + 3.0 / 4 * S / BX,
             "all_gather 4 nodes x 1");
  /* per_node out of range is clamped: 0 -> 1, 99 -> n */
  CHECK_NEAR(sb_hw_coll_s(&h, "all_gather", S, 4, 0, SB_HW_RING),
             sb_hw_coll_s(&h, "all_gather", S, 4, 1, SB_HW_RING), "per_node 0 as 1");
  CHECK_NEAR(sb_hw_coll_s(&h, "all_gather", S, 4, 99, SB_HW_RING),
             sb_hw_coll_s(&h, "all_gather", S, 4, 4, SB_HW_RING), "per_node 99 as n");
  /* tree, 64 ranks on 8 nodes: 2 (7 LI + log2(8) LX) + 2 S / busbw */
  const double tree64 = B + 2 * (7 * LI + 3 * LX) + 2 * S / BX;
  CHECK_NEAR(sb_hw_coll_s(&h, "all_reduce", S, 64, 8, SB_HW_TREE), tree64, "tree all_reduce 64");
  /* 48 ranks on 6 nodes: floor(log2 6) = 2 */
  CHECK_NEAR(sb_hw_coll_s(&h, "all_reduce", S, 48, 8, SB_HW_TREE),
             B + 2 * (7 * LI + 2 * LX) + 2 * S / BX, "tree all_reduce 48 (floor log2)");
  /* tree for other ops is the ring */
  CHECK_NEAR(sb_hw_coll_s(&h, "all_gather", S, 64, 8, SB_HW_TREE),
             sb_hw_coll_s(&h, "all_gather", S, 64, 8, SB_HW_RING), "tree all_gather = ring");
  /* best: small payload over many nodes -> the tree; large in a node -> the ring */
  const double ring512 = B + (2 * 511 - 128) * LI + 128 * LX + 2.0 * 511 / 512 * 1e3 / BX;
  const double tree512 = B + 2 * (7 * LI + 6 * LX) + 2 * 1e3 / BX;
  CHECK_NEAR(sb_hw_coll_s(&h, "all_reduce", 1e3, 512, 8, SB_HW_RING), ring512, "ring 512 small");
  CHECK_NEAR(sb_hw_coll_best_s(&h, "all_reduce", 1e3, 512, 8), fmin(ring512, tree512), "best 512");
  TU_CHECK(tree512 < ring512, "the test's case must favour the tree");
  CHECK_NEAR(sb_hw_coll_best_s(&h, "all_reduce", S, 8, 8), B + 14 * LI + 14.0 / 8 * S / BI,
             "best in a node = ring");
  /* send / recv: one step on the link */
  CHECK_NEAR(sb_hw_coll_s(&h, "send", S, 2, 2, SB_HW_RING), B + LI + S / BI, "send in a node");
  CHECK_NEAR(sb_hw_coll_s(&h, "recv", S, 2, 1, SB_HW_RING), B + LX + S / BX, "recv across nodes");
  /* barrier: a 0-byte all_reduce; groups of one; unknown ops */
  CHECK_NEAR(sb_hw_coll_s(&h, "barrier", 123, 8, 8, SB_HW_RING), B + 14 * LI, "barrier");
  TU_CHECK(sb_hw_coll_s(&h, "all_reduce", S, 1, 1, SB_HW_RING) == 0, "n = 1 costs 0");
  TU_CHECK(isinf(sb_hw_coll_s(&h, "all_sum", S, 8, 8, SB_HW_RING)) &&
               isinf(sb_hw_coll_s(&h, NULL, S, 8, 8, SB_HW_RING)),
           "unknown op must be inf");
  /* planted bug: all_reduce with all_gather's factor (n-1)/n */
  TU_CHECK(!close_to(sb_hw_coll_s(&h, "all_reduce", S, 8, 8, SB_HW_RING),
                     B + 14 * LI + 7.0 / 8 * S / BI),
           "planted bug (all_reduce factor (n-1)/n) not told apart");
  sb_hw_free(&h);

  /* a node whose NVLink is slower than its NIC: busbw = min(intra, inter) */
  char slow[2048];
  snprintf(slow, sizeof slow, "%s", GOOD);
  char *p = strstr(slow, "inter_gbps = 10");
  memcpy(p, "inter_gbps = 400", 16); /* "inter_gbps = 10 " -> "inter_gbps = 400" */
  put_file("slow-nvlink", slow, path, sizeof path);
  rc = sb_hw_load(path, &h, err, sizeof err);
  TU_CHECK(rc == 0, "slow-nvlink: %s", err);
  if (rc) return;
  CHECK_NEAR(sb_hw_coll_s(&h, "all_gather", S, 16, 8, SB_HW_RING),
             B + 14 * LI + LX + 15.0 / 16 * S / BI, "hierarchical busbw = the slower NVLink");
  CHECK_NEAR(sb_hw_coll_s(&h, "all_gather", S, 4, 1, SB_HW_RING), B + 3 * LX + 3.0 / 4 * S / 400e9,
             "one GPU per node: the NIC alone");
  sb_hw_free(&h);
}

/* ---- bad input ------------------------------------------------------------------------ */

/* GOOD with line `line` (1-based) replaced by `repl` (NULL: deleted) and `extra`
 * appended. */
static void variant(char *out, size_t n, int line, const char *repl, const char *extra) {
  size_t used = 0;
  int l = 0;
  for (const char *p = GOOD; *p;) {
    const char *e = strchr(p, '\n');
    size_t len = (size_t)(e - p) + 1;
    l++;
    const char *w = l == line ? repl : NULL;
    if (l == line && !repl) {
      p += len;
      continue;
    }
    used += (size_t)snprintf(out + used, n - used, "%.*s", w ? (int)strlen(w) : (int)len, w ? w : p);
    if (w) used += (size_t)snprintf(out + used, n - used, "\n");
    p += len;
  }
  if (extra) snprintf(out + used, n - used, "%s", extra);
}

static int lines_of(const char *t) {
  int k = 0;
  for (; *t; t++) k += *t == '\n';
  return k;
}

static void bad(const char *tag, const char *text, int want_line, const char *want_reason) {
  char path[512], err[512], prefix[600];
  put_file(tag, text, path, sizeof path);
  sb_hw h;
  memset(&h, 0x5a, sizeof h);
  err[0] = '\0';
  int rc = sb_hw_load(path, &h, err, sizeof err);
  snprintf(prefix, sizeof prefix, "%s:%d: ", path, want_line);
  TU_CHECK(rc == -1, "%s: loads (rc %d)", tag, rc);
  TU_CHECK(!strncmp(err, prefix, strlen(prefix)), "%s: error '%s', want it to start '%s'", tag, err,
           prefix);
  TU_CHECK(strstr(err, want_reason) != NULL, "%s: error '%s' lacks '%s'", tag, err, want_reason);
  TU_CHECK(!strchr(err, '\n'), "%s: the error must be one line", tag);
  TU_CHECK(h.text == NULL && h.name[0] == '\0' && h.n_gemm[0] == 0,
           "%s: a failed load must leave the sb_hw empty", tag);
}

static void test_bad_input(void) {
  char t[4096];
  const int last = lines_of(GOOD);
  /* GOOD's lines: 3 peak_bf16, 4 peak_fp8, 5 its source, 6 gemm_bf16, 7 gemm_fp8, 8 hbm_gib,
   * 9 hbm_tbps, 10 hbm_eff, 11 gpus_per_node, 12 intra_gbps, 13 intra_lat, 14 inter_gbps,
   * 15 inter_lat, 16 base, 17 alloc, 18 reserved */
  variant(t, sizeof t, 0, NULL, "hbm_speed = 3  # t\n");
  bad("unknown-key", t, last + 1, "unknown key 'hbm_speed'");
  variant(t, sizeof t, 9, "hbm_tbps = 3.3x  # t", NULL);
  bad("bad-number", t, 9, "bad number '3.3x'");
  variant(t, sizeof t, 9, "hbm_tbps = nan  # t", NULL);
  bad("nan", t, 9, "bad number 'nan'");
  variant(t, sizeof t, 9, "hbm_tbps =   # t", NULL);
  bad("no-value", t, 9, "has no value");
  variant(t, sizeof t, 9, NULL, NULL);
  bad("missing-key", t, last - 1, "missing required key 'hbm_tbps' or 'hbm_gbps'");
  variant(t, sizeof t, 0, NULL, "intra_gbps = 50  # t\n");
  bad("duplicate", t, last + 1, "duplicate key 'intra_gbps' (first set on line 12)");
  variant(t, sizeof t, 0, NULL, "hbm_gb = 80  # t\n");
  bad("duplicate-alias", t, last + 1, "'hbm_gb' sets what 'hbm_gib' set on line 8");
  variant(t, sizeof t, 0, NULL, "source.intra_gbps = again\nsource.intra_gbps = twice\n");
  bad("duplicate-source", t, last + 2, "duplicate source for 'intra_gbps'");
  variant(t, sizeof t, 10, "hbm_eff = 1.5  # t", NULL);
  bad("eff-above-1", t, 10, "(0, 1]");
  variant(t, sizeof t, 10, "hbm_eff = 0  # t", NULL);
  bad("eff-zero", t, 10, "(0, 1]");
  variant(t, sizeof t, 6, "gemm_bf16 = 1e9:0.2 1e11:1.2  # t", NULL);
  bad("gemm-eff", t, 6, "(0, 1]");
  variant(t, sizeof t, 12, "intra_gbps = -1  # t", NULL);
  bad("negative-bw", t, 12, "must be > 0");
  variant(t, sizeof t, 15, "inter_lat_us = -0.5  # t", NULL);
  bad("negative-lat", t, 15, "must be >= 0");
  variant(t, sizeof t, 6, "gemm_bf16 = 1e9:0.2 1e11:0.6 1e10:0.7  # t", NULL);
  bad("gemm-order", t, 6, "points must increase in flops");
  variant(t, sizeof t, 6, "gemm_bf16 = 1e9:0.2 1e9:0.3  # t", NULL);
  bad("gemm-equal", t, 6, "points must increase in flops");
  variant(t, sizeof t, 6, "gemm_bf16 = 1e9-0.2  # t", NULL);
  bad("gemm-token", t, 6, "is not FLOPS:EFF");
  variant(t, sizeof t, 6, "gemm_bf16 = 1e9:x  # t", NULL);
  bad("gemm-number", t, 6, "bad number in point");
  variant(t, sizeof t, 11, "gpus_per_node = 2.5  # t", NULL);
  bad("gpn-fraction", t, 11, "whole number");
  variant(t, sizeof t, 17, "alloc_overhead = 1  # t", NULL);
  bad("alloc-1", t, 17, "[0, 1)");
  variant(t, sizeof t, 18, "reserved_gb = 90  # t", NULL);
  bad("reserved-over-hbm", t, 18, "not below the HBM capacity");
  variant(t, sizeof t, 0, NULL, "just some words\n");
  bad("no-equals", t, last + 1, "expected 'key = value'");
  /* the planted uncited number: no comment, no source line */
  variant(t, sizeof t, 13, "intra_lat_us = 2", NULL);
  bad("uncited", t, 13, "'intra_lat_us' has no source");
  variant(t, sizeof t, 13, "intra_lat_us = 2  #   ", NULL);
  bad("empty-citation", t, 13, "'intra_lat_us' has no source");
  variant(t, sizeof t, 5, NULL, NULL); /* peak_fp8's source.KEY removed */
  bad("uncited-source-line", t, 4, "'peak_fp8_tflops' has no source");
  variant(t, sizeof t, 0, NULL, "source.peak_f32_tflops = nothing to cite\n");
  bad("source-unset", t, last + 1, "cites a key the file does not set");
  variant(t, sizeof t, 0, NULL, "source.speed = x\n");
  bad("source-unknown", t, last + 1, "cites unknown key 'speed'");
  variant(t, sizeof t, 0, NULL, "source.description = x\n");
  bad("source-text", t, last + 1, "cites unknown key 'description'");
  variant(t, sizeof t, 0, NULL, "source.hbm_eff =\n");
  bad("source-empty", t, last + 1, "is empty");
  variant(t, sizeof t, 7, NULL, NULL); /* fp8 rated, its table removed */
  bad("no-table", t, last - 1, "missing required key 'gemm_fp8'");
  variant(t, sizeof t, 0, NULL, "gemm_f32 = 1e9:0.5  # t\n");
  bad("table-unrated", t, last + 1, "'gemm_f32' given but f32 has no peak > 0");
  variant(t, sizeof t, 3, "peak_bf16_tflops = 0  # t", NULL);
  bad("table-zero-peak", t, 6, "'gemm_bf16' given but bf16 has no peak > 0");
  /* no dtype rated at all */
  variant(t, sizeof t, 3, NULL, NULL);
  char t2[4096];
  snprintf(t2, sizeof t2, "%s", t);
  {
    /* drop peak_fp8 (now line 3), its source (4), gemm_bf16 (5) and gemm_fp8 (6) */
    char *q = t2;
    for (int k = 0; k < 2; k++) q = strchr(q, '\n') + 1;
    char *end = q;
    for (int k = 0; k < 4; k++) end = strchr(end, '\n') + 1;
    memmove(q, end, strlen(end) + 1);
  }
  bad("unrated", t2, lines_of(t2), "no dtype is rated");
  bad("empty-file", "", 0, "missing required key");

  /* names and paths */
  sb_hw h;
  char err[512];
  TU_CHECK(sb_hw_load("no-such-gpu", &h, err, sizeof err) == -1 && strstr(err, "no-such-gpu") &&
               strstr(err, "known: ") && strstr(err, "h100-sxm-80gb") && h.text == NULL,
           "unknown name: '%s'", err);
  TU_CHECK(sb_hw_load("/nonexistent/dir/x", &h, err, sizeof err) == -1 &&
               strstr(err, "/nonexistent/dir/x: cannot read"),
           "missing path: '%s'", err);
  TU_CHECK(sb_hw_load("bad name", &h, err, sizeof err) == -1 && strstr(err, "bad name"),
           "bad name: '%s'", err);
  TU_CHECK(sb_hw_load("", &h, err, sizeof err) == -1, "empty name loads");
}

int main(int argc, char **argv) {
  const char *base = getenv("TMPDIR");
  snprintf(tmpdir, sizeof tmpdir, "%s/test_hardware.XXXXXX", base && *base ? base : "/tmp");
  if (!mkdtemp(tmpdir)) {
    perror("test_hardware: mkdtemp");
    return 1;
  }
  test_shipped();
  test_costs();
  test_bad_input();
  for (int i = 1; i < argc; i++) {
    sb_hw h;
    char err[512];
    int rc = sb_hw_load(argv[i], &h, err, sizeof err);
    TU_CHECK(rc == 0, "%s: %s", argv[i], err);
    if (rc == 0) {
      check_loaded(argv[i], &h);
      sb_hw_free(&h);
    }
  }
  /* remove the scratch files */
  DIR *d = opendir(tmpdir);
  if (d) {
    char p[512];
    for (struct dirent *e; (e = readdir(d));)
      if (e->d_name[0] != '.' && snprintf(p, sizeof p, "%s/%s", tmpdir, e->d_name) < (int)sizeof p)
        unlink(p);
    closedir(d);
  }
  rmdir(tmpdir);
  return tu_finish("test_hardware");
}
