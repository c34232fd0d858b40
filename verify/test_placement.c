/* verify/test_placement.c: placements and shard geometry (lib/dtensor, the pure part)
 * against references written here. No ranks, no communication.
 *
 * What it checks:
 * - Placement parsing and printing: S(d) (negative d kept as given until
 *   dt_placements_normalize), R, P (= P(sum)), P(sum|avg|max|min), the long forms
 *   Shard(d) / Replicate() / Partial(op), whitespace around tokens, comma lists;
 *   print -> parse round trips; snprintf return rules; dt_placement_eq
 *   (Replicate and Partial compare their kind (and op) only, as in PyTorch).
 * - Errors: typos, unknown reduce ops, unbalanced parentheses, trailing junk (also
 *   after a long run of spaces), empty entries, too many list entries,
 *   out-of-range normalisation all return DT_ERR_INVALID with a non-empty one-line
 *   reason.
 * - dt_chunk: torch.chunk's sizes for L in {12, 13, 10, 9, 5, 3, 1} over 4
 *   ranks exactly (PyTorch's Shard uses torch.chunk, empty shards last:
 *   Shard.local_shard_size_and_offset in torch/distributed/tensor/placement_types.py),
 *   and every L in 0..40 over n in 1..9 against a naive torch.chunk (c = ceil(L/n);
 *   size max(0, min(L,(k+1)c) - kc); offset min(kc, L)); dt_chunk_pad = c - size.
 * - dt_local_shape_offset: the nested [2,5] (S(1),S(1)) on (2,2) example of the
 *   docstring of compute_local_shape_and_global_offset
 *   (torch/distributed/tensor/_utils.py) exactly, and exhaustively for every mesh of 1..3 dims with sizes 1..4, tensors
 *   of rank 1..3 (even, uneven, empty and smaller-than-mesh dims), every placement
 *   list over {R, P(sum), S(0..ndim-1)} and every coordinate, against a naive
 *   left-to-right re-chunking; the shards of all coordinates cover every global
 *   element exactly prod(sizes of non-Shard mesh dims) times (once for Shard-only
 *   lists: a tiling); dt_logical_shape for every upto in 0..mesh_ndim;
 *   dt_num_shards.
 * - dt_step_kind_name / dt_step_coll (the step -> collective map the redistribute
 *   test relies on).
 * What it is not: a test of redistribute or of the planners (test_redistribute,
 * test_plan).
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* ---- helpers ---------------------------------------------------------------- */

/* Our own placement formatter for messages (never the function under test). */
static const char *red_name(dt_reduce_op op) {
  switch (op) {
    case DT_RED_SUM: return "sum";
    case DT_RED_AVG: return "avg";
    case DT_RED_MAX: return "max";
    case DT_RED_MIN: return "min";
    default: return "?";
  }
}

static void fmt_pl(char *buf, size_t n, int m, const dt_placement *pl) {
  size_t pos = 0;
  buf[0] = '\0';
  for (int i = 0; i < m && pos + 16 < n; i++) {
    const char *sep = i ? "," : "";
    if (pl[i].kind == DT_PL_SHARD)
      pos += (size_t)snprintf(buf + pos, n - pos, "%sS(%d)", sep, pl[i].dim);
    else if (pl[i].kind == DT_PL_REPLICATE)
      pos += (size_t)snprintf(buf + pos, n - pos, "%sR", sep);
    else
      pos += (size_t)snprintf(buf + pos, n - pos, "%sP(%s)", sep, red_name(pl[i].op));
  }
}

static void fmt_i64(char *buf, size_t n, int k, const int64_t *v) {
  size_t pos = 0;
  buf[0] = '\0';
  for (int i = 0; i < k && pos + 24 < n; i++)
    pos += (size_t)snprintf(buf + pos, n - pos, i ? ",%lld" : "%lld", (long long)v[i]);
}

static void fmt_int(char *buf, size_t n, int k, const int *v) {
  size_t pos = 0;
  buf[0] = '\0';
  for (int i = 0; i < k && pos + 16 < n; i++)
    pos += (size_t)snprintf(buf + pos, n - pos, i ? ",%d" : "%d", v[i]);
}

/* Structural equality as the semantics define it: Shard compares dim, Partial op. */
static bool ref_eq(dt_placement a, dt_placement b) {
  if (a.kind != b.kind) return false;
  if (a.kind == DT_PL_SHARD) return a.dim == b.dim;
  if (a.kind == DT_PL_PARTIAL) return a.op == b.op;
  return true;
}

/* ---- parse / print ------------------------------------------------------------- */

typedef struct parse_case {
  const char *in;
  dt_pl_kind kind;
  int dim;
  dt_reduce_op op;
  const char *canon; /* dt_placement_str of the result */
} parse_case;

static const parse_case GOOD[] = {
    {"S(0)", DT_PL_SHARD, 0, DT_RED_SUM, "S(0)"},
    {"S(1)", DT_PL_SHARD, 1, DT_RED_SUM, "S(1)"},
    {"S(7)", DT_PL_SHARD, 7, DT_RED_SUM, "S(7)"},
    {"S(-1)", DT_PL_SHARD, -1, DT_RED_SUM, "S(-1)"},
    {"S(-3)", DT_PL_SHARD, -3, DT_RED_SUM, "S(-3)"},
    {"Shard(0)", DT_PL_SHARD, 0, DT_RED_SUM, "S(0)"},
    {"Shard(-2)", DT_PL_SHARD, -2, DT_RED_SUM, "S(-2)"},
    {"R", DT_PL_REPLICATE, 0, DT_RED_SUM, "R"},
    {"Replicate()", DT_PL_REPLICATE, 0, DT_RED_SUM, "R"},
    {"P", DT_PL_PARTIAL, 0, DT_RED_SUM, "P(sum)"},
    {"P(sum)", DT_PL_PARTIAL, 0, DT_RED_SUM, "P(sum)"},
    {"P(avg)", DT_PL_PARTIAL, 0, DT_RED_AVG, "P(avg)"},
    {"P(max)", DT_PL_PARTIAL, 0, DT_RED_MAX, "P(max)"},
    {"P(min)", DT_PL_PARTIAL, 0, DT_RED_MIN, "P(min)"},
    {"Partial(sum)", DT_PL_PARTIAL, 0, DT_RED_SUM, "P(sum)"},
    {"Partial(avg)", DT_PL_PARTIAL, 0, DT_RED_AVG, "P(avg)"},
    {"Partial(max)", DT_PL_PARTIAL, 0, DT_RED_MAX, "P(max)"},
    {"Partial(min)", DT_PL_PARTIAL, 0, DT_RED_MIN, "P(min)"},
    /* whitespace around every token */
    {" S(0) ", DT_PL_SHARD, 0, DT_RED_SUM, "S(0)"},
    {"S( 1 )", DT_PL_SHARD, 1, DT_RED_SUM, "S(1)"},
    {"\tS ( 2 )\t", DT_PL_SHARD, 2, DT_RED_SUM, "S(2)"},
    {"  S(-1)", DT_PL_SHARD, -1, DT_RED_SUM, "S(-1)"},
    {"Shard( 3 ) ", DT_PL_SHARD, 3, DT_RED_SUM, "S(3)"},
    {" R ", DT_PL_REPLICATE, 0, DT_RED_SUM, "R"},
    {"Replicate( ) ", DT_PL_REPLICATE, 0, DT_RED_SUM, "R"},
    {"  P  ", DT_PL_PARTIAL, 0, DT_RED_SUM, "P(sum)"},
    {"P( avg )", DT_PL_PARTIAL, 0, DT_RED_AVG, "P(avg)"},
    {" Partial ( max ) ", DT_PL_PARTIAL, 0, DT_RED_MAX, "P(max)"},
};

/* Each must fail: typos, unknown ops, unbalanced parentheses, trailing junk. */
static const char *const BAD[] = {
    "",        "   ",      "S(x)",       "S()",      "S(0",      "S0)",      "S 0",
    "S(0)x",   "S(0))",    "S(0)(1)",    "S(1.5)",   "S(--1)",   "S(1-)",    "S(0) R",
    "Q",       "X(0)",     "Sh(0)",      "Shard(x)", "Shard(0",  "RR",       "R R",
    "R x",     "Rep",      "Replicate(", "P(mean)",  "P(sum",    "P()x",     "P(sum)x",
    "P(su m)", "Partial(", "Partial(prd)", "P(sum,avg)", "S(99999999999999999999)", ",",
    "S(0),R",  "R,",
};

static bool one_line(const char *s) { return s[0] != '\0' && strchr(s, '\n') == NULL; }

static void test_parse_one(void) {
  for (size_t i = 0; i < sizeof GOOD / sizeof GOOD[0]; i++) {
    const parse_case *c = &GOOD[i];
    dt_placement p;
    memset(&p, 0x5a, sizeof p);
    char err[256] = "";
    dt_status s = dt_placement_parse(c->in, &p, err, sizeof err);
    TU_CHECK(s == DT_OK, "parse '%s' -> %s (%s), expected OK", c->in, dt_status_str(s), err);
    if (s != DT_OK) continue;
    TU_CHECK(p.kind == c->kind, "parse '%s': kind %d, expected %d", c->in, (int)p.kind,
             (int)c->kind);
    if (c->kind == DT_PL_SHARD)
      TU_CHECK(p.dim == c->dim, "parse '%s': dim %d, expected %d", c->in, p.dim, c->dim);
    if (c->kind == DT_PL_PARTIAL)
      TU_CHECK(p.op == c->op, "parse '%s': op %d, expected %d (%s)", c->in, (int)p.op,
               (int)c->op, red_name(c->op));
    char buf[64];
    int len = dt_placement_str(p, buf, sizeof buf);
    TU_CHECK(strcmp(buf, c->canon) == 0 && len == (int)strlen(c->canon),
             "str(parse('%s')) = '%s' (returned %d), expected '%s'", c->in, buf, len, c->canon);
    /* the canonical form parses back to an equal placement */
    dt_placement q;
    s = dt_placement_parse(buf, &q, NULL, 0);
    TU_CHECK(s == DT_OK && ref_eq(p, q), "parse(str(p)) for '%s' ('%s') differs", c->in, buf);
  }
  for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
    dt_placement p;
    char err[256] = "";
    dt_status s = dt_placement_parse(BAD[i], &p, err, sizeof err);
    TU_CHECK(s == DT_ERR_INVALID, "parse '%s' -> %s, expected invalid argument", BAD[i],
             dt_status_str(s));
    TU_CHECK(one_line(err), "parse '%s': reason '%s' is not a non-empty single line", BAD[i], err);
    /* err may be NULL: must not crash and must still fail */
    s = dt_placement_parse(BAD[i], &p, NULL, 0);
    TU_CHECK(s == DT_ERR_INVALID, "parse '%s' with err NULL -> %s", BAD[i], dt_status_str(s));
    /* a tiny error buffer is still terminated */
    char tiny[4] = {'x', 'x', 'x', 'x'};
    (void)dt_placement_parse(BAD[i], &p, tiny, sizeof tiny);
    TU_CHECK(memchr(tiny, '\0', sizeof tiny) != NULL,
             "parse '%s': a 4-byte error buffer is not NUL-terminated", BAD[i]);
  }
}

/* Every placement prints canonically and parses back equal. */
static void test_round_trip(void) {
  dt_placement all[32];
  int n = 0;
  all[n++] = dt_replicate();
  /* every tensor dim a DT_MAX_DIMS tensor can have, and its negative forms */
  for (int d = -DT_MAX_DIMS; d < DT_MAX_DIMS; d++) all[n++] = dt_shard(d);
  for (int op = DT_RED_SUM; op <= DT_RED_MIN; op++) all[n++] = dt_partial((dt_reduce_op)op);
  for (int i = 0; i < n; i++) {
    char buf[64], want[64];
    fmt_pl(want, sizeof want, 1, &all[i]);
    int len = dt_placement_str(all[i], buf, sizeof buf);
    TU_CHECK(strcmp(buf, want) == 0 && len == (int)strlen(want), "str gives '%s' (%d), expected '%s'",
             buf, len, want);
    dt_placement q;
    char err[128] = "";
    dt_status s = dt_placement_parse(buf, &q, err, sizeof err);
    TU_CHECK(s == DT_OK && ref_eq(all[i], q), "round trip of %s: %s %s", want, dt_status_str(s), err);
    /* snprintf rules: the full length is returned, the buffer truncated and terminated */
    char small[3] = {'#', '#', '#'};
    len = dt_placement_str(all[i], small, sizeof small);
    size_t keep = strlen(want) < 2 ? strlen(want) : 2;
    TU_CHECK(len == (int)strlen(want) && memchr(small, '\0', 3) && strlen(small) == keep &&
                 strncmp(small, want, keep) == 0,
             "str of %s into 3 bytes: returned %d, buffer '%.3s'", want, len, small);
    char zero[2] = {'#', '#'};
    len = dt_placement_str(all[i], zero, 0);
    TU_CHECK(len == (int)strlen(want) && zero[0] == '#',
             "str of %s into 0 bytes: returned %d, wrote the buffer", want, len);
  }
  /* constructors and equality */
  dt_placement s2 = dt_shard(2), r = dt_replicate(), pm = dt_partial(DT_RED_MAX);
  TU_CHECK(s2.kind == DT_PL_SHARD && s2.dim == 2, "dt_shard(2) is kind %d dim %d", (int)s2.kind, s2.dim);
  TU_CHECK(r.kind == DT_PL_REPLICATE, "dt_replicate() kind %d", (int)r.kind);
  TU_CHECK(pm.kind == DT_PL_PARTIAL && pm.op == DT_RED_MAX, "dt_partial(max) kind %d op %d",
           (int)pm.kind, (int)pm.op);
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++)
      TU_CHECK(dt_placement_eq(all[i], all[j]) == (i == j), "dt_placement_eq(#%d, #%d) = %d", i,
               j, (int)dt_placement_eq(all[i], all[j]));
  /* fields that do not belong to the kind are ignored (all Replicate compare equal) */
  dt_placement r2 = {DT_PL_REPLICATE, 5, DT_RED_MAX}, p2 = {DT_PL_PARTIAL, 3, DT_RED_MAX},
               s3 = {DT_PL_SHARD, 2, DT_RED_MIN};
  TU_CHECK(dt_placement_eq(r, r2), "R with a stray dim/op is not equal to R");
  TU_CHECK(dt_placement_eq(pm, p2), "P(max) with a stray dim is not equal to P(max)");
  TU_CHECK(dt_placement_eq(s2, s3), "S(2) with a stray op is not equal to S(2)");
}

static void test_list(void) {
  typedef struct {
    const char *in;
    int n;
    const char *canon;
  } lc;
  static const lc L[] = {
      {"S(0),R,P(sum)", 3, "S(0),R,P(sum)"},
      {"S(0)", 1, "S(0)"},
      {" S(0) , R , P(avg) ", 3, "S(0),R,P(avg)"},
      {"Shard(1),Replicate(),Partial(max)", 3, "S(1),R,P(max)"},
      {"P,P,P,P,P", 5, "P(sum),P(sum),P(sum),P(sum),P(sum)"},
      {"S(-1),S(0)", 2, "S(-1),S(0)"},
      {"R,P(min),S(2),S(2)", 4, "R,P(min),S(2),S(2)"},
  };
  for (size_t i = 0; i < sizeof L / sizeof L[0]; i++) {
    dt_placement pl[8];
    int n = -1;
    char err[256] = "";
    dt_status s = dt_placements_parse(L[i].in, 8, pl, &n, err, sizeof err);
    TU_CHECK(s == DT_OK && n == L[i].n, "list '%s' -> %s, n %d (expected %d): %s", L[i].in,
             dt_status_str(s), n, L[i].n, err);
    if (s != DT_OK || n != L[i].n) continue;
    char buf[128], mine[128];
    int len = dt_placements_str(n, pl, buf, sizeof buf);
    fmt_pl(mine, sizeof mine, n, pl);
    TU_CHECK(strcmp(buf, L[i].canon) == 0 && len == (int)strlen(L[i].canon),
             "str of list '%s' = '%s' (%d), expected '%s'", L[i].in, buf, len, L[i].canon);
    TU_CHECK(strcmp(mine, L[i].canon) == 0, "list '%s' parsed as %s, expected %s", L[i].in, mine,
             L[i].canon);
    /* exactly max entries is fine */
    s = dt_placements_parse(L[i].in, L[i].n, pl, &n, err, sizeof err);
    TU_CHECK(s == DT_OK && n == L[i].n, "list '%s' with max %d -> %s", L[i].in, L[i].n,
             dt_status_str(s));
    /* one too many */
    if (L[i].n > 1) {
      err[0] = '\0';
      s = dt_placements_parse(L[i].in, L[i].n - 1, pl, &n, err, sizeof err);
      TU_CHECK(s == DT_ERR_INVALID && one_line(err),
               "list '%s' with max %d -> %s, reason '%s' (expected invalid + a reason)", L[i].in,
               L[i].n - 1, dt_status_str(s), err);
    }
  }
  static const char *const BADL[] = {"S(0),,R", "S(0),R,", ",S(0)", "R;S(0)", "S(0) R",
                                     "S(0),Q",  "R,P(mean)", "S(0),S(x)", "R,S(0", "R,R)"};
  for (size_t i = 0; i < sizeof BADL / sizeof BADL[0]; i++) {
    dt_placement pl[8];
    int n = 0;
    char err[256] = "";
    dt_status s = dt_placements_parse(BADL[i], 8, pl, &n, err, sizeof err);
    TU_CHECK(s == DT_ERR_INVALID && one_line(err), "list '%s' -> %s, reason '%s'", BADL[i],
             dt_status_str(s), err);
  }
  /* long entries (whitespace is allowed anywhere around tokens): junk after a long
   * run of spaces is still junk, and long valid entries still parse */
  {
    char lng[160];
    dt_placement pl[8];
    int n = 0;
    char err[256] = "";
    memset(lng, ' ', sizeof lng);
    lng[0] = 'R';
    strcpy(lng + 80, "junk");
    dt_status s = dt_placements_parse(lng, 8, pl, &n, err, sizeof err);
    TU_CHECK(s == DT_ERR_INVALID, "list 'R' + 79 spaces + 'junk' -> %s, n %d (expected invalid)",
             dt_status_str(s), n);
    memset(lng, ' ', sizeof lng);
    memcpy(lng, "P(sum)", 6);
    strcpy(lng + 72, "x,R");
    s = dt_placements_parse(lng, 8, pl, &n, err, sizeof err);
    TU_CHECK(s == DT_ERR_INVALID, "list 'P(sum)' + 66 spaces + 'x,R' -> %s, n %d (expected invalid)",
             dt_status_str(s), n);
    memset(lng, ' ', sizeof lng);
    memcpy(lng, "S(1)", 4);
    strcpy(lng + 90, ",  R");
    s = dt_placements_parse(lng, 8, pl, &n, err, sizeof err);
    TU_CHECK(s == DT_OK && n == 2 && pl[0].kind == DT_PL_SHARD && pl[0].dim == 1 &&
                 pl[1].kind == DT_PL_REPLICATE,
             "list 'S(1)' + 86 spaces + ',  R' -> %s, n %d: %s", dt_status_str(s), n, err);
  }
  /* a long list */
  dt_placement many[5] = {dt_shard(0), dt_replicate(), dt_partial(DT_RED_SUM), dt_shard(-1),
                          dt_partial(DT_RED_MIN)};
  char buf[128];
  int len = dt_placements_str(5, many, buf, sizeof buf);
  TU_CHECK(strcmp(buf, "S(0),R,P(sum),S(-1),P(min)") == 0 && len == 26,
           "dt_placements_str gave '%s' (%d)", buf, len);
  char small[5];
  len = dt_placements_str(5, many, small, sizeof small);
  TU_CHECK(len == 26 && strcmp(small, "S(0)") == 0, "dt_placements_str into 5 bytes: %d '%s'",
           len, small);
}

static void test_normalize(void) {
  for (int ndim = 1; ndim <= 4; ndim++) {
    for (int d = -ndim - 2; d <= ndim + 1; d++) {
      dt_placement pl[3] = {dt_replicate(), dt_shard(d), dt_partial(DT_RED_AVG)};
      char err[256] = "";
      dt_status s = dt_placements_normalize(3, pl, ndim, err, sizeof err);
      bool ok = d >= -ndim && d < ndim;
      if (ok) {
        int want = d < 0 ? d + ndim : d;
        TU_CHECK(s == DT_OK && pl[1].kind == DT_PL_SHARD && pl[1].dim == want,
                 "normalize S(%d) for ndim %d -> %s, dim %d (expected %d)", d, ndim,
                 dt_status_str(s), pl[1].dim, want);
        TU_CHECK(pl[0].kind == DT_PL_REPLICATE && pl[2].kind == DT_PL_PARTIAL &&
                     pl[2].op == DT_RED_AVG,
                 "normalize changed R or P(avg) (ndim %d)", ndim);
      } else {
        TU_CHECK(s == DT_ERR_INVALID && one_line(err),
                 "normalize S(%d) for ndim %d -> %s, reason '%s' (expected invalid + reason)", d,
                 ndim, dt_status_str(s), err);
        s = dt_placements_normalize(3, pl, ndim, NULL, 0);
        TU_CHECK(s == DT_ERR_INVALID, "normalize S(%d) ndim %d with err NULL -> %s", d, ndim,
                 dt_status_str(s));
      }
    }
  }
  /* a parsed negative dim stays negative until normalisation */
  dt_placement pl[2];
  int n = 0;
  TU_CHECK(dt_placements_parse("S(-1),S(-2)", 2, pl, &n, NULL, 0) == DT_OK && n == 2 &&
               pl[0].dim == -1 && pl[1].dim == -2,
           "parse kept negative dims? got %d, %d", pl[0].dim, pl[1].dim);
  TU_CHECK(dt_placements_normalize(2, pl, 3, NULL, 0) == DT_OK && pl[0].dim == 2 && pl[1].dim == 1,
           "normalize S(-1),S(-2) ndim 3 gave %d, %d", pl[0].dim, pl[1].dim);
}

/* ---- dt_chunk ------------------------------------------------------------------- */

static void ref_chunk(int64_t L, int n, int k, int64_t *size, int64_t *off) {
  int64_t c = (L + n - 1) / n;
  int64_t lo = (int64_t)k * c, hi = (int64_t)(k + 1) * c;
  if (hi > L) hi = L;
  *size = hi - lo > 0 ? hi - lo : 0;
  *off = lo < L ? lo : L;
}

static void test_chunk(void) {
  /* torch.chunk(L, 4) sizes: c = ceil(L/4) per rank, the remainder last, then empty */
  static const int64_t Ls[7] = {12, 13, 10, 9, 5, 3, 1};
  static const int64_t sizes[7][4] = {{3, 3, 3, 3}, {4, 4, 4, 1}, {3, 3, 3, 1}, {3, 3, 3, 0},
                                      {2, 2, 1, 0}, {1, 1, 1, 0}, {1, 0, 0, 0}};
  for (int t = 0; t < 7; t++) {
    int64_t off = 0;
    for (int k = 0; k < 4; k++) {
      int64_t sz = -1, o = -1;
      dt_chunk(Ls[t], 4, k, &sz, &o);
      int64_t want_off = off < Ls[t] ? off : Ls[t];
      TU_CHECK(sz == sizes[t][k] && o == want_off,
               "torch.chunk sizes: chunk(L=%lld, n=4, k=%d) = size %lld offset %lld, expected %lld at %lld",
               (long long)Ls[t], k, (long long)sz, (long long)o, (long long)sizes[t][k],
               (long long)want_off);
      off += (Ls[t] + 3) / 4;
    }
  }
  for (int64_t L = 0; L <= 40; L++)
    for (int n = 1; n <= 9; n++) {
      int64_t total = 0;
      for (int k = 0; k < n; k++) {
        int64_t sz = -1, o = -1, rs, ro;
        dt_chunk(L, n, k, &sz, &o);
        ref_chunk(L, n, k, &rs, &ro);
        TU_CHECK(sz == rs && o == ro, "chunk(L=%lld, n=%d, k=%d) = %lld@%lld, expected %lld@%lld",
                 (long long)L, n, k, (long long)sz, (long long)o, (long long)rs, (long long)ro);
        int64_t pad = dt_chunk_pad(L, n, k);
        int64_t want_pad = (L + n - 1) / n - rs;
        TU_CHECK(pad == want_pad, "chunk_pad(L=%lld, n=%d, k=%d) = %lld, expected %lld",
                 (long long)L, n, k, (long long)pad, (long long)want_pad);
        total += rs;
      }
      TU_CHECK(total == L, "reference self-check: chunks of %lld over %d sum to %lld",
               (long long)L, n, (long long)total);
    }
}

/* ---- nested geometry ---------------------------------------------------------------- */

/* The naive reference: mesh dims left to right, each Shard re-chunks the local
 * piece of its tensor dim; offsets add. Also returns the logical shape before each
 * mesh dim (logical[i] = shape after mesh dims < i; logical[m] = local). */
static void ref_geom(int ndim, const int64_t *gshape, int m, const int *mshape, const int *coords,
                     const dt_placement *pl, int64_t *lshape, int64_t *off,
                     int64_t logical[][DT_MAX_DIMS]) {
  for (int d = 0; d < ndim; d++) {
    lshape[d] = gshape[d];
    off[d] = 0;
  }
  for (int i = 0; i < m; i++) {
    if (logical) memcpy(logical[i], lshape, sizeof(int64_t) * (size_t)ndim);
    if (pl[i].kind != DT_PL_SHARD) continue;
    int d = pl[i].dim;
    int64_t sz, o;
    ref_chunk(lshape[d], mshape[i], coords[i], &sz, &o);
    lshape[d] = sz;
    off[d] += o;
  }
  if (logical) memcpy(logical[m], lshape, sizeof(int64_t) * (size_t)ndim);
}

static void test_nested_example(void) {
  const int64_t g[2] = {2, 5};
  const int ms[2] = {2, 2};
  const dt_placement pl[2] = {dt_shard(1), dt_shard(1)};
  static const int64_t ls[4][2] = {{2, 2}, {2, 1}, {2, 1}, {2, 1}};
  static const int64_t of[4][2] = {{0, 0}, {0, 2}, {0, 3}, {0, 4}};
  for (int r = 0; r < 4; r++) {
    int c[2] = {r / 2, r % 2};
    int64_t l[2] = {-1, -1}, o[2] = {-1, -1};
    dt_local_shape_offset(2, g, 2, ms, c, pl, l, o);
    TU_CHECK(l[0] == ls[r][0] && l[1] == ls[r][1] && o[0] == of[r][0] && o[1] == of[r][1],
             "nested [2,5] (S(1),S(1)) on (2,2) (_utils.py docstring), rank %d (%d,%d): local (%lld,%lld) "
             "offset (%lld,%lld), expected (%lld,%lld) at (%lld,%lld)",
             r, c[0], c[1], (long long)l[0], (long long)l[1], (long long)o[0], (long long)o[1],
             (long long)ls[r][0], (long long)ls[r][1], (long long)of[r][0], (long long)of[r][1]);
  }
}

enum { MAXM = 3, MAXE = 512 };

typedef struct geo_stats {
  long meshes, cases, coords;
} geo_stats;

/* One (mesh, shape, placements): every coordinate against the reference, plus the
 * coverage count of every global element. */
static void geo_case(int ndim, const int64_t *g, int m, const int *ms, const dt_placement *pl,
                     geo_stats *st) {
  int64_t numel = 1;
  for (int d = 0; d < ndim; d++) numel *= g[d];
  static int cover[MAXE];
  if (numel > MAXE) return;
  memset(cover, 0, sizeof(int) * (size_t)numel);
  int total = 1;
  for (int i = 0; i < m; i++) total *= ms[i];
  char pls[64], gs[64], mss[32];
  fmt_pl(pls, sizeof pls, m, pl);
  fmt_i64(gs, sizeof gs, ndim, g);
  fmt_int(mss, sizeof mss, m, ms);
  int bad = 0;
  for (int f = 0; f < total; f++) {
    int c[MAXM], e = f;
    for (int i = m - 1; i >= 0; i--) {
      c[i] = e % ms[i];
      e /= ms[i];
    }
    int64_t rl[DT_MAX_DIMS], ro[DT_MAX_DIMS], l[DT_MAX_DIMS], o[DT_MAX_DIMS];
    int64_t logical[MAXM + 1][DT_MAX_DIMS];
    ref_geom(ndim, g, m, ms, c, pl, rl, ro, logical);
    for (int d = 0; d < ndim; d++) l[d] = o[d] = -7;
    dt_local_shape_offset(ndim, g, m, ms, c, pl, l, o);
    st->coords++;
    bool same = true;
    for (int d = 0; d < ndim; d++) same = same && l[d] == rl[d] && o[d] == ro[d];
    if (!same && bad++ < 3) {
      char a[64], b[64], x[64], y[64], cs[32];
      fmt_i64(a, sizeof a, ndim, l);
      fmt_i64(b, sizeof b, ndim, o);
      fmt_i64(x, sizeof x, ndim, rl);
      fmt_i64(y, sizeof y, ndim, ro);
      fmt_int(cs, sizeof cs, m, c);
      tu_fail(__FILE__, __LINE__,
              "local_shape_offset mesh (%s) shape [%s] %s coords (%s): local [%s] offset [%s], "
              "expected [%s] at [%s]",
              mss, gs, pls, cs, a, b, x, y);
    }
    for (int u = 0; u <= m; u++) {
      int64_t ls[DT_MAX_DIMS];
      for (int d = 0; d < ndim; d++) ls[d] = -7;
      dt_logical_shape(ndim, g, ms, c, pl, u, ls);
      bool ok = true;
      for (int d = 0; d < ndim; d++) ok = ok && ls[d] == logical[u][d];
      if (!ok && bad++ < 3) {
        char a[64], x[64], cs[32];
        fmt_i64(a, sizeof a, ndim, ls);
        fmt_i64(x, sizeof x, ndim, logical[u]);
        fmt_int(cs, sizeof cs, m, c);
        tu_fail(__FILE__, __LINE__,
                "logical_shape mesh (%s) shape [%s] %s coords (%s) upto %d: [%s], expected [%s]",
                mss, gs, pls, cs, u, a, x);
      }
    }
    /* mark the reference shard's elements */
    int64_t ln = 1;
    for (int d = 0; d < ndim; d++) ln *= rl[d];
    for (int64_t j = 0; j < ln; j++) {
      int64_t rem = j, flat = 0, stride = 1;
      for (int d = ndim - 1; d >= 0; d--) {
        int64_t idx = rem % rl[d];
        rem /= rl[d];
        flat += (ro[d] + idx) * stride;
        stride *= g[d];
      }
      cover[flat]++;
    }
  }
  /* every element is held by prod(non-Shard mesh sizes) coordinates (once: a tiling) */
  int repl = 1;
  int64_t shards = 1;
  for (int i = 0; i < m; i++) {
    if (pl[i].kind == DT_PL_SHARD) shards *= ms[i];
    else repl *= ms[i];
  }
  int64_t wrong = 0;
  for (int64_t k = 0; k < numel; k++) wrong += cover[k] != repl;
  TU_CHECK(wrong == 0,
           "reference shards of mesh (%s) shape [%s] %s do not cover each element %d times "
           "(%lld elements wrong)",
           mss, gs, pls, repl, (long long)wrong);
  int64_t ns = dt_num_shards(m, ms, pl);
  TU_CHECK(ns == shards, "num_shards mesh (%s) %s = %lld, expected %lld", mss, pls, (long long)ns,
           (long long)shards);
  st->cases++;
}

static void test_geometry_exhaustive(geo_stats *st) {
  static const int64_t shapes[][3] = {
      /* rank 1 */
      {0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {12}, {13},
      /* rank 2 */
      {0, 3}, {1, 9}, {2, 5}, {5, 3}, {7, 4}, {8, 6}, {3, 1},
      /* rank 3 */
      {3, 5, 2}, {6, 4, 4}, {2, 1, 7}, {5, 0, 3}, {4, 3, 5}};
  static const int ranks[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3};
  const int nshapes = (int)(sizeof ranks / sizeof ranks[0]);
  for (int m = 1; m <= MAXM; m++) {
    int nm = 1;
    for (int i = 0; i < m; i++) nm *= 4;
    for (int mi = 0; mi < nm; mi++) {
      int ms[MAXM], e = mi;
      for (int i = 0; i < m; i++) {
        ms[i] = e % 4 + 1; /* sizes 1..4 */
        e /= 4;
      }
      st->meshes++;
      for (int si = 0; si < nshapes; si++) {
        int ndim = ranks[si];
        int k = ndim + 2; /* R, P(sum), S(0..ndim-1) */
        int np = 1;
        for (int i = 0; i < m; i++) np *= k;
        for (int pi = 0; pi < np; pi++) {
          dt_placement pl[MAXM];
          int q = pi;
          for (int i = 0; i < m; i++) {
            int v = q % k;
            q /= k;
            pl[i] = v == 0 ? dt_replicate() : v == 1 ? dt_partial(DT_RED_SUM) : dt_shard(v - 2);
          }
          geo_case(ndim, shapes[si], m, ms, pl, st);
        }
      }
    }
  }
}

/* dt_num_shards on 4-D and 5-D meshes too (pure product). */
static void test_num_shards(void) {
  const int ms[5] = {2, 3, 1, 4, 2};
  for (int pi = 0; pi < 243; pi++) {
    dt_placement pl[5];
    int q = pi;
    int64_t want = 1;
    for (int i = 0; i < 5; i++) {
      int v = q % 3;
      q /= 3;
      pl[i] = v == 0 ? dt_replicate() : v == 1 ? dt_partial(DT_RED_MAX) : dt_shard(i % 2);
      if (v == 2) want *= ms[i];
    }
    for (int m = 4; m <= 5; m++) {
      int64_t w = m == 5 ? want : 1;
      if (m == 4) {
        for (int i = 0; i < 4; i++)
          if (pl[i].kind == DT_PL_SHARD) w *= ms[i];
      }
      char s[64];
      fmt_pl(s, sizeof s, m, pl);
      TU_CHECK(dt_num_shards(m, ms, pl) == w, "num_shards (2,3,1,4,2)[:%d] %s = %lld, expected %lld",
               m, s, (long long)dt_num_shards(m, ms, pl), (long long)w);
    }
  }
}

static void test_step_kinds(void) {
  static const struct {
    dt_step_kind k;
    const char *name;
    bool comm;
    dt_coll coll;
  } T[] = {{DT_STEP_ALL_GATHER, "all_gather", true, DT_COLL_ALL_GATHER},
           {DT_STEP_ALL_REDUCE, "all_reduce", true, DT_COLL_ALL_REDUCE},
           {DT_STEP_REDUCE_SCATTER, "reduce_scatter", true, DT_COLL_REDUCE_SCATTER},
           {DT_STEP_ALL_TO_ALL, "all_to_all", true, DT_COLL_ALL_TO_ALL},
           {DT_STEP_CHUNK, "chunk", false, DT_COLL_COUNT},
           {DT_STEP_PARTITION, "partition", false, DT_COLL_COUNT}};
  for (size_t i = 0; i < sizeof T / sizeof T[0]; i++) {
    const char *nm = dt_step_kind_name(T[i].k);
    TU_CHECK(nm && strcmp(nm, T[i].name) == 0, "dt_step_kind_name(%d) = '%s', expected '%s'",
             (int)T[i].k, nm ? nm : "(null)", T[i].name);
    dt_coll c = DT_COLL_COUNT;
    bool comm = dt_step_coll(T[i].k, &c);
    TU_CHECK(comm == T[i].comm && (!comm || c == T[i].coll),
             "dt_step_coll(%s) = %d (coll %d), expected %d (coll %d)", T[i].name, (int)comm,
             (int)c, (int)T[i].comm, (int)T[i].coll);
  }
}

int main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  double t0 = dt_now();
  test_parse_one();
  test_round_trip();
  test_list();
  test_normalize();
  test_chunk();
  test_nested_example();
  geo_stats st = {0, 0, 0};
  test_geometry_exhaustive(&st);
  test_num_shards();
  test_step_kinds();
  printf("geometry: %ld meshes, %ld (mesh, shape, placements) cases, %ld coordinates; %.2f s\n",
         st.meshes, st.cases, st.coords, dt_now() - t0);
  return tu_finish("test_placement");
}
