/* bench/harness/cli.h: what the shardbench subcommands share: exit codes, the one-line
 * usage error, parsers for the flags every subcommand speaks (mesh "2x2x2",
 * names "dp,cp,tp", shapes "16,24", placement lists, dtype, planner, counts),
 * a JSON string writer, and each subcommand's entry point.
 *
 * The helpers are defined in bench/harness/shardbench.c, next to main and the
 * subcommand table. They are for the shardbench program only: they print and
 * return exit codes, which libdtensor never does. Parsers write a one-line
 * reason into err (no flag name: the caller knows which flag it parsed) and
 * return DT_ERR_INVALID; they never print.
 *
 * Adding a subcommand: write `int sb_cmd_NAME(int argc, char **argv)` (argv[0]
 * is the subcommand's name, flags follow; parse with getopt_long after
 * sb_getopt_reset), its usage text, declare both here and add one row to the
 * table in shardbench.c.
 */
#ifndef SB_CLI_H
#define SB_CLI_H

#include <getopt.h>
#include <stdio.h>

#include "dtensor.h"

/* Exit codes of every subcommand. */
enum {
  SB_EXIT_OK = 0,    /* done, every check passed */
  SB_EXIT_FAIL = 1,  /* ran, but a check failed or the library reported an error */
  SB_EXIT_USAGE = 2  /* bad input from the user: nothing was run */
};

/* Longest one-line parse reason (fits a terminal line with the flag and prefix). */
enum { SB_ERR_LEN = 256 };

/* Most ranks a threads job runs (the launcher's own limit). */
enum { SB_MAX_WORLD = DT_THREADS_MAX_WORLD };
/* Most ranks of a shape-only job (--device meta: one rank per role runs). */
enum { SB_MAX_WORLD_META = 1 << 20 };

/* Prints "shardbench CMD: FLAG: message" (FLAG omitted when NULL) as one line on
 * stderr and returns SB_EXIT_USAGE, so that `return sb_usage_error(...)` ends a
 * subcommand. */
int sb_usage_error(const char *cmd, const char *flag, const char *fmt, ...) DT_PRINTF(3, 4);

/* Prepares getopt_long for a subcommand's argv (argv[0] = its name): resets the
 * scan and silences getopt's own messages (sb_getopt_error prints ours). */
void sb_getopt_reset(void);
/* The one-line error for getopt_long's '?' (unknown flag, or a value given
 * to a flag that takes none: lopts, the table given to getopt_long, tells
 * which) or ':' (missing value; the optstring must begin with ':').
 * Returns SB_EXIT_USAGE. */
int sb_getopt_error(const char *cmd, int ch, char **argv, const struct option *lopts);
/* A first pass over argv with getopt_long (same optstring and lopts as the
 * subcommand's own loop): a flag given twice with different values is bad
 * input ("--db given twice with different values"); the same value twice
 * passes, and so do the flags named in multi (NULL-terminated, may be NULL),
 * which take a list by repetition. Getopt's own errors come out as
 * sb_getopt_error's. Resets getopt for the subcommand's loop; returns 0 or
 * SB_EXIT_USAGE. */
int sb_getopt_repeats(const char *cmd, int argc, char **argv, const char *optstring,
                      const struct option *lopts, const char *const *multi);

/* ---- parsers: DT_OK, or DT_ERR_INVALID with a one-line reason in err ---- */

/* A decimal integer in lo..hi. */
dt_status sb_parse_long(const char *s, long lo, long hi, long *out, char *err, size_t errn);
/* A byte count: 4096, 64K, 1M, 2G (powers of 1024, optional trailing B), 1..max. */
dt_status sb_parse_bytes(const char *s, size_t max, size_t *out, char *err, size_t errn);
/* A mesh "2x2x2" (or "8"): 1..DT_MESH_MAX_DIMS sizes >= 1, product 1..SB_MAX_WORLD. */
dt_status sb_parse_mesh(const char *s, int *ndim, int shape[DT_MESH_MAX_DIMS], char *err,
                        size_t errn);
/* Mesh dim names "dp,cp,tp": exactly ndim identifiers, unique, each shorter than
 * DT_MESH_NAME_LEN. s == NULL gives the defaults dim0, dim1, ... */
dt_status sb_parse_names(const char *s, int ndim, char names[DT_MESH_MAX_DIMS][DT_MESH_NAME_LEN],
                         char *err, size_t errn);
/* A tensor shape "16,24": 1..DT_MAX_DIMS sizes >= 0 whose product fits int64. */
dt_status sb_parse_shape(const char *s, int *ndim, int64_t shape[DT_MAX_DIMS], char *err,
                         size_t errn);
/* Placements "S(0),R,P(sum)" for a mesh of mesh_ndim dims and a tensor of
 * tensor_ndim dims: exactly mesh_ndim entries, shard dims in range, negative
 * dims normalised. */
dt_status sb_parse_placements(const char *s, int mesh_ndim, int tensor_ndim, dt_placement *out,
                              char *err, size_t errn);
dt_status sb_parse_dtype(const char *s, dt_dtype *out, char *err, size_t errn);
dt_status sb_parse_planner(const char *s, dt_planner *out, char *err, size_t errn);

/* ---- output ---- */

/* Writes s as a JSON string literal: quotes included, '"' and '\\' and control
 * characters escaped (\n, \t, \u00XX); other bytes (UTF-8) pass through. */
void sb_json_str(FILE *f, const char *s);
/* "2x2x2" into buf. */
void sb_mesh_str(int ndim, const int *shape, char *buf, size_t n);
/* "[16, 24]" (or "16,24" when bare) into buf. */
void sb_shape_str(int ndim, const int64_t *shape, bool bare, char *buf, size_t n);

/* ---- subcommands ---- */

/* Shared by the explain subcommands: ledger labels ("?" / "-" for none), a JSON
 * number (null when not finite), a library message without its "rank R: " prefix. */
const char *sb_op_name(int op);
const char *sb_red_name(int reduce);
void sb_json_num(double v);
const char *sb_strip_rank(const char *msg);
/* msg without "rank N: " and a leading library call name ("dt_st_open: "). */
const char *sb_strip_call(const char *msg);
/* --mesh (required; `example` shows one), --world (must equal the mesh's product
 * when given) and --names: fills the mesh fields, or prints the one-line error
 * and returns SB_EXIT_USAGE; 0 on success. */
int sb_parse_mesh_flags(const char *cmd, const char *mesh_s, const char *world_s,
                        const char *names_s, const char *example, int *mesh_ndim, int *mesh_shape,
                        int *world, char names[DT_MESH_MAX_DIMS][DT_MESH_NAME_LEN]);
/* Mesh dim names as the explain options keep them. */
typedef const char (*sb_mesh_names)[DT_MESH_NAME_LEN];
/* A planned redistribute (bench/harness/explain_common.c) with the cost model's
 * per-step estimates: the bytes a rank holds before each step and its cost. */
typedef struct sb_plan_view {
  dt_redist_plan plan;
  double step_cost[DT_MAX_STEPS], local_bytes[DT_MAX_STEPS];
  char *trace; /* malloc'd; sb_plan_view_free */
} sb_plan_view;
enum { SB_PLAN_OK = 0, SB_PLAN_REFUSED = 1 /* the planner said no */, SB_PLAN_BROKEN = 2 };
/* Plans src -> dst of a [gshape] dtype tensor on the mesh; on failure err holds
 * the reason (the planner's message without "rank R: "). */
int sb_plan_view_make(int mesh_ndim, const int *mesh_shape, int ndim, const int64_t *gshape,
                      dt_dtype dtype, const dt_placement *src, const dt_placement *dst,
                      dt_planner planner, sb_plan_view *v, char *err, size_t errn);
void sb_plan_view_free(sb_plan_view *v);
/* The steps' table (header and a row per step, each line prefixed by indent;
 * costs with prec decimals); nothing for an empty plan. */
void sb_print_plan_steps(const sb_plan_view *v, const sb_mesh_names names, int mesh_ndim,
                         const char *indent, int prec);
/* "planner": .., "steps": [..], "trace": .., "cost_us": .. (no braces). */
void sb_json_plan_fields(const sb_plan_view *v, const sb_mesh_names names, int mesh_ndim);
/* Ledger rows summed over ranks per (op, reduce, group, group size), in
 * first-seen order: add each rank's rows into t (room for all of them). */
typedef struct sb_ledger_total {
  int op, reduce;
  char group[DT_LABEL_LEN];
  int group_size;
  uint64_t calls, payload;
  double wire;
} sb_ledger_total;
/* A malloc'd copy of the rank's ledger rows (*rows untouched and *n 0 when empty). */
dt_status sb_ledger_copy(dt_ctx *ctx, dt_ledger_row **rows, size_t *n);
void sb_ledger_total_add(sb_ledger_total *t, size_t *n, const dt_ledger_row *rows, size_t nrows);
/* Text tables (indented 4) of a rank's rows and of the totals over world ranks. */
void sb_print_ledger_rows(const dt_ledger_row *rows, size_t n);
void sb_print_ledger_totals(const sb_ledger_total *t, size_t n, int world);
/* JSON arrays of them, each element on its own line after indent. */
void sb_json_ledger_rows(const dt_ledger_row *rows, size_t n, const char *indent);
void sb_json_ledger_totals(const sb_ledger_total *t, size_t n, const char *indent);
/* [a, b, c] */
void sb_json_shape(int n, const int64_t *v);
int sb_cmd_explain(int argc, char **argv);
/* The harness (bench/harness/run.c, sweep.c, report.c, baselines.c). */
int sb_cmd_run(int argc, char **argv);
int sb_cmd_sweep(int argc, char **argv);
int sb_cmd_merge(int argc, char **argv);  /* bench/harness/merge.c */
int sb_cmd_status(int argc, char **argv); /* bench/harness/merge.c */
int sb_cmd_report(int argc, char **argv);
int sb_cmd_baselines(int argc, char **argv);
int sb_cmd_plan(int argc, char **argv);      /* bench/harness/plan.c */
extern const char sb_run_usage[], sb_sweep_usage[], sb_report_usage[], sb_baselines_usage[],
    sb_plan_usage[];
extern const char sb_merge_usage[], sb_status_usage[];
extern const char sb_explain_usage[];
/* `explain --op NAME` (bench/harness/explain_op.c): sb_cmd_explain routes here when
 * --op is among its flags. */
int sb_cmd_explain_op(int argc, char **argv);

#endif
