/* bench/harness/shardbench.c: the shardbench program: main, the subcommand table, help,
 * and the helpers every subcommand shares (declared in bench/harness/cli.h).
 *
 *   shardbench help | --help | -h        the list of subcommands
 *   shardbench help CMD | CMD --help     one subcommand's usage
 *   shardbench CMD [flags]               run a subcommand
 *
 * Each subcommand lives in its own file (bench/harness/explain.c, ...) and is one row
 * of the table below; later ones (run, sweep, report, baselines) join the same
 * way. This file does no distributed work itself. Bad input gets one line on
 * stderr and exit code 2.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "../common/flags.h"

/* ---- the subcommand table ---- */

typedef struct sb_cmd {
  const char *name;
  const char *summary;           /* one line for `shardbench help` */
  int (*fn)(int argc, char **argv);
  const char *usage;             /* full text for `shardbench help CMD` */
} sb_cmd;

static const sb_cmd sb_cmds[] = {
    {"run", "run one config, verify it against the unsharded reference, measure it",
     sb_cmd_run, sb_run_usage},
    {"sweep", "run every mesh shape x plan x workload x dtype for a world into a DB",
     sb_cmd_sweep, sb_sweep_usage},
    {"merge", "merge result DBs (a split sweep's shards) into one, by config key",
     sb_cmd_merge, sb_merge_usage},
    {"status", "a results DB's done, failed and remaining configs, with the time left",
     sb_cmd_status, sb_status_usage},
    {"report", "gnuplot charts and an index page from a results DB", sb_cmd_report,
     sb_report_usage},
    {"plan", "capacity planning: every layout of a job on a hardware file, fitted and ranked",
     sb_cmd_plan, sb_plan_usage},
    {"baselines", "analytic framework baselines (Megatron, ZeRO, FSDP, PP, CP) for a config",
     sb_cmd_baselines, sb_baselines_usage},
    {"explain", "show shards, the redistribute plan, its cost, and run it on threads",
     sb_cmd_explain, sb_explain_usage},
};
static const size_t sb_ncmds = sizeof sb_cmds / sizeof sb_cmds[0];

static const sb_cmd *find_cmd(const char *name) {
  for (size_t i = 0; i < sb_ncmds; i++)
    if (!strcmp(sb_cmds[i].name, name)) return &sb_cmds[i];
  return NULL;
}

static void print_overview(FILE *f) {
  fprintf(f,
          "usage: shardbench COMMAND [flags]\n"
          "       shardbench help [COMMAND]\n"
          "\n"
          "shardbench: a DTensor runtime (libdtensor) and its benchmarks.\n"
          "\n"
          "commands:\n");
  for (size_t i = 0; i < sb_ncmds; i++)
    fprintf(f, "  %-12s %s\n", sb_cmds[i].name, sb_cmds[i].summary);
  fprintf(f, "  %-12s %s\n", "help", "this list, or `help COMMAND` for one command's flags");
  fprintf(f, "\nExit codes: 0 ok, 1 a check or the run failed, 2 bad input.\n");
}

static int cmd_help(int argc, char **argv) {
  if (argc <= 1) {
    print_overview(stdout);
    return SB_EXIT_OK;
  }
  if (argc > 2) return sb_usage_error("help", NULL, "unexpected argument '%s'", argv[2]);
  const sb_cmd *c = find_cmd(argv[1]);
  if (!c) {
    if (!strcmp(argv[1], "help")) {
      print_overview(stdout);
      return SB_EXIT_OK;
    }
    return sb_usage_error("help", NULL, "unknown command '%s' (see `shardbench help`)", argv[1]);
  }
  fputs(c->usage, stdout);
  return SB_EXIT_OK;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "shardbench: no command given (see `shardbench help`)\n");
    return SB_EXIT_USAGE;
  }
  const char *name = argv[1];
  if (!strcmp(name, "help") || !strcmp(name, "--help") || !strcmp(name, "-h"))
    return cmd_help(argc - 1, argv + 1);
  if (name[0] == '-') {
    fprintf(stderr, "shardbench: unknown option '%s' (see `shardbench help`)\n", name);
    return SB_EXIT_USAGE;
  }
  const sb_cmd *c = find_cmd(name);
  if (!c) {
    fprintf(stderr, "shardbench: unknown command '%s' (see `shardbench help`)\n", name);
    return SB_EXIT_USAGE;
  }
  /* Make sure a failure to write stdout (a closed pipe, a full disk) is not a
   * silent success: the subcommand's exit code stands unless stdout failed. */
  int rc = c->fn(argc - 1, argv + 1);
  if (fflush(stdout) != 0 || ferror(stdout)) {
    fprintf(stderr, "shardbench %s: cannot write stdout: %s\n", name, strerror(errno));
    if (rc == SB_EXIT_OK) rc = SB_EXIT_FAIL;
  }
  return rc;
}

/* ---- messages and getopt ---- */

int sb_usage_error(const char *cmd, const char *flag, const char *fmt, ...) {
  char msg[2 * SB_ERR_LEN], prog[64];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  snprintf(prog, sizeof prog, "shardbench %s", cmd);
  return sb_flag_bad(prog, flag, "%s", msg);
}

void sb_getopt_reset(void) {
  optind = 0; /* glibc: 0 re-initialises the scan (1 would keep stale state) */
  opterr = 0;
}

int sb_getopt_error(const char *cmd, int ch, char **argv, const struct option *lopts) {
  /* optind has moved past the offending word; optopt is the short option, or 0
   * for an unknown long one (then the word itself names it). */
  const char *word = optind > 0 ? argv[optind - 1] : "?";
  char shortf[3] = {'-', (char)optopt, '\0'};
  const char *what = optopt && optopt != '?' ? shortf : word;
  if (ch == ':') {
    /* For a long option with a missing value getopt sets optopt to its val;
     * the word is the one to show ("--mesh"). */
    if (!strncmp(word, "--", 2)) what = word;
    return sb_usage_error(cmd, what, "missing value (see `shardbench help %s`)", cmd);
  }
  if (!strncmp(word, "--", 2)) {
    char name[64];
    size_t l = strcspn(word, "=");
    if (l >= sizeof name) l = sizeof name - 1;
    memcpy(name, word, l);
    name[l] = '\0';
    /* A flag that takes no value but was given one ("--json=1") also lands here. */
    for (const struct option *op = lopts; op && op->name; op++)
      if (op->has_arg == no_argument && !strcmp(op->name, name + 2) && word[l] == '=')
        return sb_usage_error(cmd, name, "takes no value, got '%s'", word);
    /* getopt_long accepts unique prefixes; a prefix of two flags lands here too. */
    return sb_usage_error(cmd, NULL, "unknown or ambiguous flag '%s' (see `shardbench help %s`)",
                          name, cmd);
  }
  return sb_usage_error(cmd, NULL, "unknown flag '%s' (see `shardbench help %s`)", what, cmd);
}

int sb_getopt_repeats(const char *cmd, int argc, char **argv, const char *optstring,
                      const struct option *lopts, const char *const *multi) {
  enum { MAX_OPTS = 64 };
  const char *seen[MAX_OPTS];
  bool given[MAX_OPTS] = {false};
  int ch, li;
  sb_getopt_reset();
  while ((li = -1, ch = getopt_long(argc, argv, optstring, lopts, &li)) != -1) {
    if (ch == '?' || ch == ':') return sb_getopt_error(cmd, ch, argv, lopts);
    if (li < 0) /* a short option: find its long twin by val */
      for (int i = 0; lopts[i].name; i++)
        if (lopts[i].val == ch) li = i;
    if (li < 0 || li >= MAX_OPTS) continue;
    bool many = false;
    for (const char *const *m = multi; m && *m; m++) many |= !strcmp(*m, lopts[li].name);
    if (many) continue;
    const char *v = optarg ? optarg : "";
    if (given[li] && strcmp(seen[li], v))
      return sb_usage_error(cmd, NULL, "--%s given twice with different values ('%s', '%s')",
                            lopts[li].name, seen[li], v);
    given[li] = true;
    seen[li] = v;
  }
  sb_getopt_reset();
  return 0;
}

/* ---- parsers ---- */

static dt_status fail(char *err, size_t errn, const char *fmt, ...) DT_PRINTF(3, 4);
static dt_status fail(char *err, size_t errn, const char *fmt, ...) {
  if (err && errn) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errn, fmt, ap);
    va_end(ap);
  }
  return DT_ERR_INVALID;
}

dt_status sb_parse_long(const char *s, long lo, long hi, long *out, char *err, size_t errn) {
  long v = 0;
  switch (sb_flag_long(s, lo, hi, &v)) {
    case SB_FLAG_OK: *out = v; return DT_OK;
    case SB_FLAG_RANGE: return fail(err, errn, "expected %ld..%ld, got %ld", lo, hi, v);
    default: return fail(err, errn, "expected an integer in %ld..%ld, got '%s'", lo, hi, s);
  }
}

dt_status sb_parse_bytes(const char *s, size_t max, size_t *out, char *err, size_t errn) {
  switch (sb_flag_bytes(s, max, out)) {
    case SB_FLAG_OK: return DT_OK;
    case SB_FLAG_RANGE: return fail(err, errn, "expected 1..%zu bytes, got '%s'", max, s);
    default: return fail(err, errn, "expected a size like 4096, 64K or 1M, got '%s'", s);
  }
}

/* Reads one decimal size at *p (digits only), advancing *p. -1 when none or > cap. */
static long long read_size(const char **p, long long cap) {
  const char *s = *p;
  if (!isdigit((unsigned char)*s)) return -1;
  long long v = 0;
  while (isdigit((unsigned char)*s)) {
    v = v * 10 + (*s - '0');
    if (v > cap) return -1;
    s++;
  }
  *p = s;
  return v;
}

dt_status sb_parse_mesh(const char *s, int *ndim, int shape[DT_MESH_MAX_DIMS], char *err,
                        size_t errn) {
  const char *p = s;
  int n = 0;
  long long prod = 1;
  for (;;) {
    long long v = read_size(&p, SB_MAX_WORLD);
    if (v < 0) {
      if (isdigit((unsigned char)*p))
        return fail(err, errn, "a mesh dim of '%s' is over %d ranks", s, SB_MAX_WORLD);
      return fail(err, errn, "expected sizes joined by 'x' like 2x2x2, got '%s'", s);
    }
    if (v == 0) return fail(err, errn, "mesh dim %d of '%s' is 0; sizes are >= 1", n, s);
    if (n == DT_MESH_MAX_DIMS)
      return fail(err, errn, "'%s' has more than %d dims", s, DT_MESH_MAX_DIMS);
    shape[n++] = (int)v;
    prod *= v;
    if (prod > SB_MAX_WORLD)
      return fail(err, errn, "'%s' is over %d ranks (the threads backend's limit)", s,
                  SB_MAX_WORLD);
    if (*p == '\0') break;
    if (*p != 'x' && *p != 'X')
      return fail(err, errn, "expected sizes joined by 'x' like 2x2x2, got '%s'", s);
    p++;
  }
  *ndim = n;
  return DT_OK;
}

static bool is_identifier(const char *s) {
  if (!(isalpha((unsigned char)s[0]) || s[0] == '_')) return false;
  for (const char *p = s + 1; *p; p++)
    if (!(isalnum((unsigned char)*p) || *p == '_')) return false;
  return true;
}

dt_status sb_parse_names(const char *s, int ndim, char names[DT_MESH_MAX_DIMS][DT_MESH_NAME_LEN],
                         char *err, size_t errn) {
  if (!s) {
    for (int i = 0; i < ndim; i++) snprintf(names[i], DT_MESH_NAME_LEN, "dim%d", i);
    return DT_OK;
  }
  int n = 0;
  const char *p = s;
  for (;;) {
    size_t l = strcspn(p, ",");
    if (n == ndim) {
      int total = ndim + 1;
      for (const char *q = p; (q = strchr(q, ',')) != NULL; q++) total++;
      return fail(err, errn, "%d names for a mesh of %d dim%s", total, ndim, ndim == 1 ? "" : "s");
    }
    if (l == 0) return fail(err, errn, "name %d of '%s' is empty", n, s);
    if (l >= DT_MESH_NAME_LEN)
      return fail(err, errn, "name %d of '%s' is longer than %d characters", n, s,
                  DT_MESH_NAME_LEN - 1);
    memcpy(names[n], p, l);
    names[n][l] = '\0';
    if (!is_identifier(names[n]))
      return fail(err, errn, "'%s' is not an identifier ([A-Za-z_][A-Za-z0-9_]*)", names[n]);
    for (int j = 0; j < n; j++)
      if (!strcmp(names[j], names[n])) return fail(err, errn, "'%s' appears twice", names[n]);
    n++;
    if (p[l] == '\0') break;
    p += l + 1;
  }
  if (n != ndim)
    return fail(err, errn, "%d name%s for a mesh of %d dims", n, n == 1 ? "" : "s", ndim);
  return DT_OK;
}

dt_status sb_parse_shape(const char *s, int *ndim, int64_t shape[DT_MAX_DIMS], char *err,
                         size_t errn) {
  /* A dim is at most 2^40 elements: far more than any run holds, and small
   * enough that the parser needs no overflow tricks per digit. */
  const long long dim_cap = 1LL << 40;
  const char *p = s;
  int n = 0;
  for (;;) {
    long long v = read_size(&p, dim_cap);
    if (v < 0) {
      if (isdigit((unsigned char)*p))
        return fail(err, errn, "a dim of '%s' is over 2^40 elements", s);
      return fail(err, errn, "expected non-negative sizes joined by ',' like 16,24, got '%s'",
                  s);
    }
    if (n == DT_MAX_DIMS) return fail(err, errn, "'%s' has more than %d dims", s, DT_MAX_DIMS);
    shape[n++] = v;
    if (*p == '\0') break;
    if (*p != ',')
      return fail(err, errn, "expected non-negative sizes joined by ',' like 16,24, got '%s'",
                  s);
    p++;
  }
  if (dt_shape_numel(n, shape) < 0)
    return fail(err, errn, "'%s' has more elements than an int64 counts", s);
  *ndim = n;
  return DT_OK;
}

dt_status sb_parse_placements(const char *s, int mesh_ndim, int tensor_ndim, dt_placement *out,
                              char *err, size_t errn) {
  char why[SB_ERR_LEN] = "";
  int n = 0;
  /* Parse into room for more than a mesh can have, so "too many" is reported
   * as a count, not as a parse error. */
  dt_placement pl[2 * DT_MAX_MESH_DIMS];
  if (dt_placements_parse(s, (int)(sizeof pl / sizeof pl[0]), pl, &n, why, sizeof why) != DT_OK)
    return fail(err, errn, "%s (in '%s')", why[0] ? why : "cannot parse", s);
  if (n != mesh_ndim)
    return fail(err, errn, "'%s' has %d placement%s; the mesh has %d dim%s (one placement per "
                "mesh dim)", s, n, n == 1 ? "" : "s", mesh_ndim, mesh_ndim == 1 ? "" : "s");
  if (dt_placements_normalize(n, pl, tensor_ndim, why, sizeof why) != DT_OK) {
    if (why[0]) return fail(err, errn, "%s (in '%s')", why, s);
    return fail(err, errn, "a shard dim of '%s' is out of range for a tensor of %d dim%s", s,
                tensor_ndim, tensor_ndim == 1 ? "" : "s");
  }
  /* The library normalises; check anyway, so a lenient normaliser cannot let an
   * out-of-range dim reach the geometry code. */
  for (int i = 0; i < n; i++)
    if (pl[i].kind == DT_PL_SHARD && (pl[i].dim < 0 || pl[i].dim >= tensor_ndim))
      return fail(err, errn, "S(%d) in '%s' is out of range for a tensor of %d dims", pl[i].dim,
                  s, tensor_ndim);
  memcpy(out, pl, (size_t)n * sizeof *pl);
  return DT_OK;
}

dt_status sb_parse_dtype(const char *s, dt_dtype *out, char *err, size_t errn) {
  /* i64 is the library's id type: no command computes or checks i64 values
   * (explain compares floats; explain --op takes ids with an input's " i64") */
  if (dt_dtype_parse(s, out) != DT_OK || *out == DT_I64)
    return fail(err, errn, "expected f32, f64 or bf16, got '%s'", s);
  return DT_OK;
}

dt_status sb_parse_planner(const char *s, dt_planner *out, char *err, size_t errn) {
  if (dt_planner_parse(s, out) != DT_OK)
    return fail(err, errn, "expected greedy or min-cost, got '%s'", s);
  return DT_OK;
}

/* ---- output helpers ---- */

void sb_json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    switch (*p) {
      case '"': fputs("\\\"", f); break;
      case '\\': fputs("\\\\", f); break;
      case '\n': fputs("\\n", f); break;
      case '\r': fputs("\\r", f); break;
      case '\t': fputs("\\t", f); break;
      default:
        if (*p < 0x20 || *p == 0x7f) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
  }
  fputc('"', f);
}

void sb_mesh_str(int ndim, const int *shape, char *buf, size_t n) {
  size_t k = 0;
  buf[0] = '\0';
  for (int i = 0; i < ndim && k < n; i++) {
    int w = snprintf(buf + k, n - k, "%s%d", i ? "x" : "", shape[i]);
    if (w < 0) break;
    k += (size_t)w;
  }
}

void sb_shape_str(int ndim, const int64_t *shape, bool bare, char *buf, size_t n) {
  size_t k = 0;
  int w = snprintf(buf, n, "%s", bare ? "" : "[");
  if (w > 0) k = (size_t)w;
  for (int i = 0; i < ndim && k < n; i++) {
    w = snprintf(buf + k, n - k, "%s%lld", i ? (bare ? "," : ", ") : "", (long long)shape[i]);
    if (w < 0) break;
    k += (size_t)w;
  }
  if (!bare && k < n) snprintf(buf + k, n - k, "]");
}

/* ---- shared by the explain subcommands ---- */

const char *sb_op_name(int op) {
  return op >= 0 && op < DT_COLL_COUNT ? dt_coll_name((dt_coll)op) : "?";
}

const char *sb_red_name(int r) {
  return r >= 0 && r < DT_RED_COUNT ? dt_reduce_name((dt_reduce_op)r) : "-";
}

void sb_json_num(double v) {
  if (isfinite(v)) printf("%.15g", v); /* 15: round numbers stay round */
  else printf("null");
}

const char *sb_strip_rank(const char *msg) {
  int r, k = 0;
  if (sscanf(msg, "rank %d: %n", &r, &k) >= 1 && k > 0) return msg + k;
  return msg;
}

const char *sb_strip_call(const char *msg) {
  msg = sb_strip_rank(msg);
  if (!strncmp(msg, "dt_", 3)) {
    size_t k = strspn(msg, "abcdefghijklmnopqrstuvwxyz_0123456789");
    if (!strncmp(msg + k, ": ", 2)) return msg + k + 2;
  }
  return msg;
}

int sb_parse_mesh_flags(const char *cmd, const char *mesh_s, const char *world_s,
                        const char *names_s, const char *example, int *mesh_ndim, int *mesh_shape,
                        int *world, char names[DT_MESH_MAX_DIMS][DT_MESH_NAME_LEN]) {
  char err[SB_ERR_LEN];
  if (!mesh_s) return sb_usage_error(cmd, "--mesh", "required, e.g. --mesh %s", example);
  if (sb_parse_mesh(mesh_s, mesh_ndim, mesh_shape, err, sizeof err) != DT_OK)
    return sb_usage_error(cmd, "--mesh", "%s", err);
  int prod = 1;
  for (int i = 0; i < *mesh_ndim; i++) prod *= mesh_shape[i];
  *world = prod;
  if (world_s) {
    long w;
    if (sb_parse_long(world_s, 1, SB_MAX_WORLD, &w, err, sizeof err) != DT_OK)
      return sb_usage_error(cmd, "--world", "%s", err);
    if (w != prod)
      return sb_usage_error(cmd, "--mesh", "%s has %d ranks but --world is %ld; the product "
                            "of the mesh sizes must equal the world", mesh_s, prod, w);
  }
  if (sb_parse_names(names_s, *mesh_ndim, names, err, sizeof err) != DT_OK)
    return sb_usage_error(cmd, "--names", "%s", err);
  return 0;
}
