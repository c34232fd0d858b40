/* bench/harness/report.c: `shardbench report`, charts and an index page from a results DB.
 *
 *   shardbench report [--db results/shardbench.db] [--out report] [--scripts DIR]
 *                     [--format png,svg] [--run ID|latest|all]
 *
 * It opens the DB read-only (a file that is not SQLite, or a DB of another
 * schema_version, is refused with one line and exit 2, and is not touched),
 * reads the results of one run (or, with --run all, the newest result of every
 * config over all runs), and writes:
 *
 *   OUT/data/NAME.dat whitespace-separated data, one header comment line naming
 *                    the columns and one giving the query; gnuplot reads them
 *   OUT/NAME.png|svg the charts, drawn by the committed scripts/NAME.gp with
 *                      gnuplot -e "datadir='OUT/data'; outdir='OUT'; fmt='png'" scripts/NAME.gp
 *                    (the same line redraws any chart by hand, without the DB)
 *   OUT/index.html   the charts, how to read each, the skipped / failed /
 *                    mismatched configs with their reasons, and where it came from
 *   OUT/gnuplot.log  what gnuplot printed
 *
 * Charts: comm (wire bytes per rank per step, stacked by phase and op, with one
 * framework cross per config: comm_bytes_per_step_combined, the sum of the
 * framework baselines its plan's settings select), throughput (tokens/s and MFU
 * per config), memory (rank 0's split into weights, gradients, optimizer state
 * and activations + buffers, stacked, with the peak bytes per rank and the
 * memory_bytes_per_rank baselines, grouped by plan), error (max_rel_err against the tolerance, log scale),
 * cp_memory (the peak per rank and rank 0's activations against cp, one line per group
 * of configs that differ only in cp, for a fixed global sequence), pp_bubble (each
 * pipelined result's measured bubble against the analytic one, and per stage its
 * peak activation memory and most microbatches in flight; schema version 4 on) and
 * one pp_gantt_RID per pipelined result (result id RID: its last timed step as a Gantt
 * chart, a row per rank, a box per action, drawn by scripts/pp_gantt.gp with
 * rid=RID). comm, throughput, memory and error are small multiples, one panel per plan,
 * each panel's configs sorted by the chart's quantity (see "panels" below), so that a
 * sweep of several hundred configs fits 1600 px. A chart with no rows is not drawn;
 * the index says why.
 *
 * Capacity charts, from `shardbench plan`'s hardware, plan_runs and predictions tables
 * (schema version 5; a DB without them, or without rows, gets none and the index says
 * why): capacity_memory (each plan's chosen layout's peak per GPU against the GPU
 * count, with the hardware's HBM capacity), capacity_throughput (its best fitting
 * layout's tokens/s per GPU), capacity_breakdown (the newest plan run's top ranked
 * layouts' step time, stacked) and, in the index, the ranked layouts and those that do
 * not fit.
 *
 * gnuplot is found as $GNUPLOT or `gnuplot` on PATH; the scripts as --scripts,
 * $SHARDBENCH_SCRIPTS, $SHARDBENCH_DATADIR/scripts, ./scripts, or the installed
 * scripts/ (bench/harness/datadir.h).
 * Without gnuplot the data files and the index are still written, one line says
 * that charts need gnuplot, and the exit code is 0. Exit codes: 0 written,
 * 1 a file could not be written or gnuplot failed, 2 bad input.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <spawn.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "datadir.h"
#include "store.h"

extern char **environ;

#define CMD "report"

/* Room for a path we build (OUT/data/NAME.dat); longer paths are refused. */
enum { RP_PATH = 4096 };

/* Room for a mesh ("pp2.dpr2.dps2.cp2.tp2") and a chart label (plan/mesh/...). */
enum { RP_MESH = 64, RP_LABEL = 320 };

const char sb_report_usage[] =
    "usage: shardbench report [--db results/shardbench.db] [--out report] [--scripts DIR]\n"
    "           [--format png,svg] [--run ID|latest|all]\n"
    "\n"
    "Reads a results DB (read-only) and writes OUT/data/*.dat, the charts OUT/NAME.png\n"
    "and OUT/NAME.svg drawn by scripts/NAME.gp with gnuplot, and OUT/index.html.\n"
    "\n"
    "  --db FILE        the results DB (default results/shardbench.db)\n"
    "  --out DIR        where to write (default report; created if missing)\n"
    "  --scripts DIR    the .gp scripts (default $SHARDBENCH_SCRIPTS,\n"
    "                   $SHARDBENCH_DATADIR/scripts, ./scripts, the installed scripts/)\n"
    "  --format LIST    png, svg or png,svg (default png,svg)\n"
    "  --run WHICH      a run id, latest (default), or all (the newest result of\n"
    "                   each config over every run)\n"
    "\n"
    "Charts: comm (wire bytes per rank per step by plan and mesh, with one cross per\n"
    "config: the frameworks' published formulas), throughput (tokens/s and MFU per config), memory (rank 0's\n"
    "weights, gradients, optimizer state and activations stacked, and the peak bytes per\n"
    "rank, by plan), error (max_rel_err against the tolerance), cp_memory (the peak per\n"
    "rank and rank 0's activations against cp, for a fixed global sequence), pp_bubble\n"
    "(pipelined configs: measured vs analytic bubble, per-stage activation peak and\n"
    "microbatches in flight) and pp_gantt_RID (a pipelined result's timeline, one row per\n"
    "rank, one box per action). comm, throughput, memory and error draw one panel per plan,\n"
    "its configs sorted by the chart's quantity, the best and worst labelled, at most\n"
    "1600 px wide. From `shardbench plan`'s tables (schema version 5): capacity_memory\n"
    "(peak GB per GPU against the GPU count, per plan, with the HBM capacity),\n"
    "capacity_throughput (tokens/s per GPU against the GPU count), capacity_breakdown (the\n"
    "top ranked layouts' step time, stacked) and the ranked layouts in the index. Redraw any chart by\n"
    "hand: gnuplot -e \"datadir='report/data'; outdir='report'\" scripts/comm.gp\n"
    "(a Gantt chart: add rid=RID; scripts/pp_gantt.gp)\n"
    "Without gnuplot the data files and the index are still written (exit 0).\n"
    "Exit codes: 0 written, 1 a write or gnuplot failed, 2 bad input (DB refused).\n";

/* ---- rows read from the DB ---- */

typedef struct rp_row {
  long long result_id, run_id, config_id;
  char status[16];
  char *reason, *key, *workload, *model, *plan, *dtype, *backend;
  int pp, dpr, dps, cp, tp, world;
  long long batch, seq, steps;
  double tokens, mfu, tflops, step_s, mem, rel_err, abs_err, tol; /* NAN when NULL */
  double peak;        /* the result's MFU denominator, TFLOP/s (NAN when NULL) */
  double split[4];    /* rank 0's params, grads, optimizer, activations bytes (NAN when
                       * NULL: not measured, or a DB before schema version 3) */
  char *peak_source;  /* where the run's peak came from ("" when NULL: version 1, or unset) */
  char mesh[RP_MESH];
  char label[RP_LABEL];
} rp_row;

typedef struct rp_report {
  const char *db_path, *out, *scripts;
  bool png, svg;
  long long run;      /* > 0 a run id; 0 all */
  bool run_latest;
  sb_store st;        /* the DB (sb_store_open_read); st.version 1 lacks the runs' peak,
                       * 1 and 2 the memory split */
  sqlite3 *db;        /* st.db */
  rp_row *rows;
  size_t nrows;
  int status_count[4]; /* ok, mismatch, failed, skipped */
  FILE *log;
  bool write_failed;
  char mfu_axis[96];  /* the throughput chart's MFU axis label: which peak */
  char mfu_note[512]; /* the same for the index, with where the peak came from */
} rp_report;

static const char *const rp_statuses[4] = {"ok", "mismatch", "failed", "skipped"};

static char *xstrdup(const char *s) {
  char *p = strdup(s ? s : "");
  if (!p) {
    fputs("shardbench report: out of memory\n", stderr);
    exit(SB_EXIT_FAIL);
  }
  return p;
}

static double col_real(sqlite3_stmt *st, int i) {
  return sqlite3_column_type(st, i) == SQLITE_NULL ? NAN : sqlite3_column_double(st, i);
}

static const char *col_text(sqlite3_stmt *st, int i) {
  const unsigned char *t = sqlite3_column_text(st, i);
  return t ? (const char *)t : "";
}

/* ---- small helpers ---- */

static int mkdir_p(const char *path) {
  char buf[RP_PATH];
  if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return -1;
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
    *p = '/';
  }
  if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
  struct stat sbuf;
  return stat(buf, &sbuf) == 0 && S_ISDIR(sbuf.st_mode) ? 0 : -1;
}

static bool is_file(const char *path) {
  struct stat sbuf;
  return stat(path, &sbuf) == 0 && S_ISREG(sbuf.st_mode);
}

static bool path_join(char *buf, size_t n, const char *dir, const char *name) {
  return snprintf(buf, n, "%s/%s", dir, name) < (int)n;
}

/* A token without blanks for a whitespace-separated .dat column. */
static void dat_token(char *s) {
  if (!*s) return;
  for (char *p = s; *p; p++)
    if (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == '"' || *p == '#')
      *p = '_';
}

static void html_str(FILE *f, const char *s) {
  for (; s && *s; s++) {
    switch (*s) {
      case '<': fputs("&lt;", f); break;
      case '>': fputs("&gt;", f); break;
      case '&': fputs("&amp;", f); break;
      case '"': fputs("&quot;", f); break;
      default: fputc(*s, f);
    }
  }
}

/* A value for a .dat column: NaN (gnuplot skips it) when the DB held NULL. */
static void dat_num(FILE *f, double v) {
  if (isnan(v)) fputs(" NaN", f);
  else fprintf(f, " %.9g", v);
}

static FILE *open_out(rp_report *r, const char *name) {
  char path[RP_PATH];
  if (!path_join(path, sizeof path, r->out, name)) {
    fprintf(stderr, "shardbench report: path too long: %s/%s\n", r->out, name);
    r->write_failed = true;
    return NULL;
  }
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "shardbench report: cannot write %s: %s\n", path, strerror(errno));
    r->write_failed = true;
  }
  return f;
}

static void close_out(rp_report *r, FILE *f, const char *name) {
  if (!f) return;
  if (ferror(f) | fclose(f)) {
    fprintf(stderr, "shardbench report: cannot write %s/%s\n", r->out, name);
    r->write_failed = true;
  }
}

/* ---- opening and reading the DB ---- */

/* Opens the DB through the store's read path (bench/harness/store.c: read-only,
 * schema version 1 to SB_SCHEMA_VERSION, nothing written or created); one line on
 * refusal. */
static int open_db(rp_report *r) {
  int rc = sb_store_open_read(&r->st, r->db_path, CMD);
  if (rc) return rc;
  r->db = r->st.db;
  return SB_EXIT_OK;
}

/* Resolves --run latest / an id; 0 rows of runs leaves run at -1 (empty). */
static int resolve_run(rp_report *r) {
  if (!r->run_latest && r->run == 0) return SB_EXIT_OK; /* all */
  sqlite3_stmt *st = NULL;
  const char *q = r->run_latest ? "SELECT max(id) FROM runs" : "SELECT id FROM runs WHERE id = ?1";
  if (sqlite3_prepare_v2(r->db, q, -1, &st, NULL) != SQLITE_OK)
    return sb_usage_error(CMD, "--db", "cannot read runs: %s", sqlite3_errmsg(r->db));
  if (!r->run_latest) sqlite3_bind_int64(st, 1, r->run);
  int rc = sqlite3_step(st);
  bool found = rc == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL;
  if (found) r->run = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  if (rc != SQLITE_ROW && rc != SQLITE_DONE)
    return sb_usage_error(CMD, "--db", "cannot read runs: %s", sqlite3_errmsg(r->db));
  if (!found) {
    if (!r->run_latest) return sb_usage_error(CMD, "--run", "no run %lld in '%s'", r->run, r->db_path);
    r->run = -1; /* latest of no runs: an empty report */
  }
  return SB_EXIT_OK;
}

/* The results of the chosen run (or the newest per config), with their configs, the
 * run's peak source (schema version 2 on; NULL from a version 1 DB) and rank 0's
 * memory split (version 3 on; NULL before). */
#define RP_ROWS_QUERY(PEAK_SOURCE, SPLIT)                                                       \
  "SELECT r.id, r.run_id, r.config_id, r.status, r.reason, r.tokens_per_s, r.mfu, r.tflops, "   \
  "r.step_time_s, r.peak_mem_bytes, r.max_rel_err, r.max_abs_err, r.tolerance, c.key, "        \
  "c.workload, c.model, c.plan, c.dtype, c.backend, c.pp, c.dp_replicate, c.dp_shard, c.cp, "  \
  "c.tp, c.world, c.batch, c.seq, c.steps, r.peak_tflops, " PEAK_SOURCE ", " SPLIT               \
  " FROM results r JOIN configs c ON c.id = r.config_id JOIN runs ru ON ru.id = r.run_id "     \
  "WHERE (?1 = 0 AND r.id IN (SELECT max(id) FROM results GROUP BY config_id)) "               \
  "OR r.run_id = ?1 ORDER BY c.key"
#define RP_NO_SPLIT "NULL, NULL, NULL, NULL"
#define RP_SPLIT                                                                               \
  "r.mem_params_bytes, r.mem_grads_bytes, r.mem_optimizer_bytes, r.mem_activations_bytes"
static const char rp_rows_query_v1[] = RP_ROWS_QUERY("NULL", RP_NO_SPLIT);
static const char rp_rows_query_v2[] = RP_ROWS_QUERY("ru.peak_source", RP_NO_SPLIT);
static const char rp_rows_query_v3[] = RP_ROWS_QUERY("ru.peak_source", RP_SPLIT);
#define rp_rows_query                                                                          \
  (r->st.version >= 3 ? rp_rows_query_v3                                                       \
                      : r->st.version >= 2 ? rp_rows_query_v2 : rp_rows_query_v1)

/* A mesh's name from its dims (pp, dp_replicate, dp_shard, cp, tp): "dpr2.tp4",
 * "1rank" when all are 1. */
static void mesh_text(const int dims[5], char *mesh, size_t cap) {
  static const char *const names[5] = {"pp", "dpr", "dps", "cp", "tp"};
  size_t k = 0;
  mesh[0] = '\0';
  for (int i = 0; i < 5; i++) {
    if (dims[i] <= 1) continue;
    int n = snprintf(mesh + k, cap - k, "%s%s%d", k ? "." : "", names[i], dims[i]);
    if (n < 0 || (size_t)n >= cap - k) break;
    k += (size_t)n;
  }
  if (!k) snprintf(mesh, cap, "1rank");
}

static void mesh_label(rp_row *w) {
  const int dims[5] = {w->pp, w->dpr, w->dps, w->cp, w->tp};
  mesh_text(dims, w->mesh, sizeof w->mesh);
}

/* Labels name the plan and mesh, plus whichever other fields differ between rows. */
static void make_labels(rp_report *r) {
  bool vary_model = false, vary_wl = false, vary_dt = false, vary_bs = false, vary_be = false;
  for (size_t i = 1; i < r->nrows; i++) {
    const rp_row *a = &r->rows[0], *b = &r->rows[i];
    vary_model |= strcmp(a->model, b->model) != 0;
    vary_wl |= strcmp(a->workload, b->workload) != 0;
    vary_dt |= strcmp(a->dtype, b->dtype) != 0;
    vary_bs |= a->batch != b->batch || a->seq != b->seq;
    vary_be |= strcmp(a->backend, b->backend) != 0;
  }
  for (size_t i = 0; i < r->nrows; i++) {
    rp_row *w = &r->rows[i];
    mesh_label(w);
    char bs[64] = "";
    if (vary_bs) snprintf(bs, sizeof bs, "/b%llds%lld", w->batch, w->seq);
    snprintf(w->label, sizeof w->label, "%s/%s%s%s%s%s%s%s%s%s%s", w->plan, w->mesh,
             vary_model ? "/" : "", vary_model ? w->model : "", vary_wl ? "/" : "",
             vary_wl ? w->workload : "", vary_dt ? "/" : "", vary_dt ? w->dtype : "", bs,
             vary_be ? "/" : "", vary_be ? w->backend : "");
    dat_token(w->label);
  }
}

static int read_rows(rp_report *r) {
  if (r->run < 0) return SB_EXIT_OK;
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(r->db, rp_rows_query, -1, &st, NULL) != SQLITE_OK)
    return sb_usage_error(CMD, "--db", "cannot read results: %s", sqlite3_errmsg(r->db));
  sqlite3_bind_int64(st, 1, r->run);
  size_t cap = 0;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    if (r->nrows == cap) {
      cap = cap ? 2 * cap : 64; /* grow by doubling from a typical sweep's size */
      rp_row *n = realloc(r->rows, cap * sizeof *n);
      if (!n) {
        sqlite3_finalize(st);
        fputs("shardbench report: out of memory\n", stderr);
        return SB_EXIT_FAIL;
      }
      r->rows = n;
    }
    rp_row *w = &r->rows[r->nrows++];
    memset(w, 0, sizeof *w);
    int c = 0;
    w->result_id = sqlite3_column_int64(st, c++);
    w->run_id = sqlite3_column_int64(st, c++);
    w->config_id = sqlite3_column_int64(st, c++);
    snprintf(w->status, sizeof w->status, "%s", col_text(st, c++));
    w->reason = xstrdup(col_text(st, c++));
    w->tokens = col_real(st, c++);
    w->mfu = col_real(st, c++);
    w->tflops = col_real(st, c++);
    w->step_s = col_real(st, c++);
    w->mem = col_real(st, c++);
    w->rel_err = col_real(st, c++);
    w->abs_err = col_real(st, c++);
    w->tol = col_real(st, c++);
    w->key = xstrdup(col_text(st, c++));
    w->workload = xstrdup(col_text(st, c++));
    w->model = xstrdup(col_text(st, c++));
    w->plan = xstrdup(col_text(st, c++));
    w->dtype = xstrdup(col_text(st, c++));
    w->backend = xstrdup(col_text(st, c++));
    w->pp = sqlite3_column_int(st, c++);
    w->dpr = sqlite3_column_int(st, c++);
    w->dps = sqlite3_column_int(st, c++);
    w->cp = sqlite3_column_int(st, c++);
    w->tp = sqlite3_column_int(st, c++);
    w->world = sqlite3_column_int(st, c++);
    w->batch = sqlite3_column_int64(st, c++);
    w->seq = sqlite3_column_int64(st, c++);
    w->steps = sqlite3_column_int64(st, c++);
    w->peak = col_real(st, c++);
    w->peak_source = xstrdup(col_text(st, c++));
    for (int k = 0; k < 4; k++) w->split[k] = col_real(st, c++);
    for (int s = 0; s < 4; s++)
      if (!strcmp(w->status, rp_statuses[s])) r->status_count[s]++;
  }
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE)
    return sb_usage_error(CMD, "--db", "cannot read results: %s", sqlite3_errmsg(r->db));
  make_labels(r);
  return SB_EXIT_OK;
}

static bool measured(const rp_row *w) {
  return !strcmp(w->status, "ok") || !strcmp(w->status, "mismatch");
}

/* ---- orderings: each chart lists its rows in its own order ---- */

static int cmp_mesh(const rp_row *a, const rp_row *b) {
  const int da[6] = {a->world, a->pp, a->dpr, a->dps, a->cp, a->tp};
  const int db[6] = {b->world, b->pp, b->dpr, b->dps, b->cp, b->tp};
  for (int i = 0; i < 6; i++)
    if (da[i] != db[i]) return da[i] < db[i] ? -1 : 1;
  return 0;
}

static int by_plan(const void *pa, const void *pb) {
  const rp_row *a = *(const rp_row *const *)pa, *b = *(const rp_row *const *)pb;
  int c = strcmp(a->plan, b->plan);
  if (!c) c = cmp_mesh(a, b);
  return c ? c : strcmp(a->key, b->key);
}

static int by_mesh(const void *pa, const void *pb) {
  const rp_row *a = *(const rp_row *const *)pa, *b = *(const rp_row *const *)pb;
  int c = cmp_mesh(a, b);
  if (!c) c = strcmp(a->plan, b->plan);
  return c ? c : strcmp(a->key, b->key);
}

/* The rows that pass keep(), in cmp's order; *n their count. */
static const rp_row **select_rows(const rp_report *r, bool (*keep)(const rp_row *),
                                  int (*cmp)(const void *, const void *), size_t *n) {
  const rp_row **v = calloc(r->nrows ? r->nrows : 1, sizeof *v);
  if (!v) {
    fputs("shardbench report: out of memory\n", stderr);
    exit(SB_EXIT_FAIL);
  }
  size_t k = 0;
  for (size_t i = 0; i < r->nrows; i++)
    if (keep(&r->rows[i])) v[k++] = &r->rows[i];
  qsort(v, k, sizeof *v, cmp);
  *n = k;
  return v;
}

/* ---- panels: the fixed charts draw one panel per plan (small multiples) ----
 *
 * A sweep of several hundred configs in one strip of bars is unreadable (a
 * world-8 sweep's comm chart was 5380 px wide). So each chart draws one panel
 * per plan, its bars sorted by the chart's quantity (the best first), and labels
 * the best and worst bar of each panel. The .dat keeps every config; these columns,
 * appended to each row, say where it goes: pid (the plan's panel, 1.., plans
 * alphabetically), pos (0.. within the panel, by the quantity), npos (the panel's
 * bars), mark (1 the panel's best, 2 its worst, 0 neither), panel (the plan) and
 * short (the label less the plan). */
typedef struct rp_place {
  int pid, pos, npos, mark;
} rp_place;

typedef struct rp_keyed {
  const rp_row *w;
  double key; /* the quantity, negated where larger is better; NaN sorts last */
} rp_keyed;

static int by_plan_key(const void *pa, const void *pb) {
  const rp_keyed *a = pa, *b = pb;
  int c = strcmp(a->w->plan, b->w->plan);
  if (c) return c;
  const bool na = isnan(a->key), nb = isnan(b->key);
  if (na != nb) return na ? 1 : -1;
  if (!na && a->key != b->key) return a->key < b->key ? -1 : 1;
  c = cmp_mesh(a->w, b->w);
  return c ? c : strcmp(a->w->key, b->w->key);
}

/* Reorders v[0..n) by plan, then by key[i] (of v[i] as given; ascending, or
 * descending when larger is better), and fills pl[0..n) for the new order. */
static void order_panels(const rp_row **v, size_t n, const double *key, bool larger_better,
                         rp_place *pl) {
  rp_keyed *k = calloc(n ? n : 1, sizeof *k);
  if (!k) {
    fputs("shardbench report: out of memory\n", stderr);
    exit(SB_EXIT_FAIL);
  }
  for (size_t i = 0; i < n; i++) k[i] = (rp_keyed){v[i], larger_better ? -key[i] : key[i]};
  qsort(k, n, sizeof *k, by_plan_key);
  int pid = 0;
  for (size_t i = 0, start = 0; i < n; i++) {
    v[i] = k[i].w;
    if (i == 0 || strcmp(v[i]->plan, v[i - 1]->plan)) {
      pid++;
      start = i;
    }
    pl[i] = (rp_place){.pid = pid, .pos = (int)(i - start)};
    if (i + 1 == n || strcmp(k[i].w->plan, k[i + 1].w->plan)) { /* the panel's last bar */
      const int np = (int)(i - start + 1);
      for (size_t j = start; j <= i; j++) {
        pl[j].npos = np;
        pl[j].mark = pl[j].pos == 0 ? 1 : (np > 1 && pl[j].pos == np - 1) ? 2 : 0;
      }
    }
  }
  free(k);
}

/* The place columns of a row: pid pos npos mark panel short. */
static void dat_place(FILE *f, const rp_row *w, const rp_place *p) {
  char plan[RP_LABEL];
  snprintf(plan, sizeof plan, "%s", w->plan);
  dat_token(plan);
  const size_t l = strlen(plan);
  /* the label begins "PLAN/" (make_labels) */
  const char *s = !strncmp(w->label, plan, l) && w->label[l] == '/' ? w->label + l + 1 : w->label;
  fprintf(f, " %d %d %d %d %s %s", p->pid, p->pos, p->npos, p->mark, plan, s);
}

static rp_place *new_places(size_t n) {
  rp_place *p = calloc(n ? n : 1, sizeof *p);
  if (!p) {
    fputs("shardbench report: out of memory\n", stderr);
    exit(SB_EXIT_FAIL);
  }
  return p;
}

static double *new_keys(size_t n) {
  double *k = calloc(n ? n : 1, sizeof *k);
  if (!k) {
    fputs("shardbench report: out of memory\n", stderr);
    exit(SB_EXIT_FAIL);
  }
  return k;
}

static bool keep_throughput(const rp_row *w) { return measured(w) && !isnan(w->tokens); }
static bool keep_memory(const rp_row *w) { return measured(w) && !isnan(w->mem); }
static bool keep_error(const rp_row *w) { return measured(w) && !isnan(w->rel_err); }

/* ---- the .dat files ---- */

/* Phases in the order they happen in a step; others sort after them. */
static int phase_rank(const char *phase) {
  static const char *const order[3] = {"forward", "backward", "optimizer"};
  for (int i = 0; i < 3; i++)
    if (!strcmp(phase, order[i])) return i;
  return 3;
}

typedef struct rp_series {
  char name[96]; /* "phase:op" */
  char op[64];
  int prank;     /* phase_rank() */
  int oid;       /* 1 + the op's rank among the ops seen (its colour in comm.gp) */
} rp_series;

static int series_cmp(const void *pa, const void *pb) {
  const rp_series *a = pa, *b = pb;
  if (a->prank != b->prank) return a->prank < b->prank ? -1 : 1;
  return strcmp(a->name, b->name);
}

static const char rp_comm_query[] =
    "SELECT phase, op, sum(wire_bytes) FROM comm WHERE result_id = ?1 "
    "GROUP BY phase, op";

/* Baselines of one quantity for the charted configs: idx label framework fid value unit
 * pid pos (the config's panel and place in it, pl[i] for v[i]). */
static size_t write_baselines(rp_report *r, const char *name, const char *quantity,
                              const rp_row **v, const rp_place *pl, size_t n) {
  FILE *f = open_out(r, name);
  if (!f) return 0;
  static const char q[] =
      "SELECT framework, value, unit FROM baselines WHERE quantity = ?1 AND config_id = ?2 "
      "ORDER BY framework";
  fprintf(f, "# idx label framework fid value unit pid pos\n");
  fprintf(f, "# query: %s (?1 = '%s'; ?2 = each charted config; fid numbers the frameworks)\n",
          q, quantity);
  sqlite3_stmt *st = NULL;
  size_t rows = 0;
  char fw[32][64]; /* frameworks seen, for fid: results/schema.sql names 12 */
  int nfw = 0;
  if (sqlite3_prepare_v2(r->db, q, -1, &st, NULL) != SQLITE_OK) {
    fprintf(stderr, "shardbench report: cannot read baselines: %s\n", sqlite3_errmsg(r->db));
    close_out(r, f, name);
    return 0;
  }
  for (size_t i = 0; i < n; i++) {
    sqlite3_reset(st);
    sqlite3_bind_text(st, 1, quantity, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, v[i]->config_id);
    while (sqlite3_step(st) == SQLITE_ROW) {
      char fname[64], unit[64];
      snprintf(fname, sizeof fname, "%s", col_text(st, 0));
      snprintf(unit, sizeof unit, "%s", col_text(st, 2));
      dat_token(fname);
      dat_token(unit);
      if (!fname[0]) snprintf(fname, sizeof fname, "?");
      if (!unit[0]) snprintf(unit, sizeof unit, "?");
      int fid = 0;
      while (fid < nfw && strcmp(fw[fid], fname)) fid++;
      if (fid == nfw && nfw < 32) snprintf(fw[nfw++], sizeof fw[0], "%s", fname);
      fprintf(f, "%zu %s %s %d", i, v[i]->label, fname, fid + 1);
      dat_num(f, sqlite3_column_double(st, 1));
      fprintf(f, " %s %d %d\n", unit, pl[i].pid, pl[i].pos);
      rows++;
    }
  }
  sqlite3_finalize(st);
  close_out(r, f, name);
  return rows;
}

/* comm.dat (idx label series sid wire_bytes base top: the stack's segments),
 * comm_series.dat (sid series) and comm_baselines.dat. Returns the configs charted. */
static size_t write_comm(rp_report *r, size_t *nbase) {
  size_t n = 0;
  const rp_row **v = select_rows(r, measured, by_plan, &n);
  /* Each config's total (the panels' order); a config without comm rows drops out. */
  double *tot = new_keys(n);
  {
    static const char q[] = "SELECT sum(wire_bytes) FROM comm WHERE result_id = ?1";
    sqlite3_stmt *t = NULL;
    if (sqlite3_prepare_v2(r->db, q, -1, &t, NULL) != SQLITE_OK) {
      fprintf(stderr, "shardbench report: cannot read comm: %s\n", sqlite3_errmsg(r->db));
      r->write_failed = true;
      free(v);
      free(tot);
      return 0;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
      sqlite3_reset(t);
      sqlite3_bind_int64(t, 1, v[i]->result_id);
      if (sqlite3_step(t) != SQLITE_ROW || sqlite3_column_type(t, 0) == SQLITE_NULL) continue;
      tot[k] = sqlite3_column_double(t, 0);
      v[k++] = v[i];
    }
    sqlite3_finalize(t);
    n = k;
  }
  rp_place *pl = new_places(n);
  order_panels(v, n, tot, false, pl);
  free(tot);
  sqlite3_stmt *st = NULL;
  rp_series *ser = NULL;
  size_t nser = 0, capser = 0;
  if (sqlite3_prepare_v2(r->db, rp_comm_query, -1, &st, NULL) != SQLITE_OK) {
    fprintf(stderr, "shardbench report: cannot read comm: %s\n", sqlite3_errmsg(r->db));
    r->write_failed = true;
    free(v);
    free(pl);
    return 0;
  }
  /* Pass 1: the series, so each keeps one colour and one stack position. */
  for (size_t i = 0; i < n; i++) {
    sqlite3_reset(st);
    sqlite3_bind_int64(st, 1, v[i]->result_id);
    while (sqlite3_step(st) == SQLITE_ROW) {
      char nm[96];
      snprintf(nm, sizeof nm, "%s:%s", col_text(st, 0), col_text(st, 1));
      dat_token(nm);
      size_t s = 0;
      while (s < nser && strcmp(ser[s].name, nm)) s++;
      if (s < nser) continue;
      if (nser == capser) {
        capser = capser ? 2 * capser : 16; /* a few ops x three phases */
        rp_series *g = realloc(ser, capser * sizeof *g);
        if (!g) {
          fputs("shardbench report: out of memory\n", stderr);
          exit(SB_EXIT_FAIL);
        }
        ser = g;
      }
      snprintf(ser[nser].name, sizeof ser[nser].name, "%s", nm);
      snprintf(ser[nser].op, sizeof ser[nser].op, "%s", col_text(st, 1));
      dat_token(ser[nser].op);
      ser[nser++].prank = phase_rank(col_text(st, 0));
    }
  }
  if (nser) qsort(ser, nser, sizeof *ser, series_cmp);
  /* One colour per op, whatever the phase: oid = 1 + the ops alphabetically before it. */
  for (size_t s = 0; s < nser; s++) {
    ser[s].oid = 1;
    for (size_t t = 0; t < nser; t++) {
      bool seen = false; /* count each distinct op once */
      for (size_t u = 0; u < t; u++) seen |= !strcmp(ser[u].op, ser[t].op);
      if (!seen && strcmp(ser[t].op, ser[s].op) < 0) ser[s].oid++;
    }
  }

  FILE *f = open_out(r, "data/comm_series.dat");
  if (f) {
    fprintf(f, "# sid series op oid phase_id\n");
    fprintf(f, "# query: SELECT DISTINCT phase, op FROM comm (charted results), ordered "
               "forward, backward, optimizer, other, then by op; oid numbers the ops; "
               "phase_id 1..4 = forward, backward, optimizer, other\n");
    for (size_t s = 0; s < nser; s++)
      fprintf(f, "%zu %s %s %d %d\n", s + 1, ser[s].name, ser[s].op, ser[s].oid,
              ser[s].prank + 1);
    close_out(r, f, "data/comm_series.dat");
  }

  /* Pass 2: the stacked segments, in series order within each config. */
  size_t charted = 0;
  f = open_out(r, "data/comm.dat");
  if (f) {
    fprintf(f, "# idx label series sid wire_bytes base top pid pos npos mark panel short\n");
    fprintf(f, "# query: %s (?1 = each ok/mismatch result with comm rows, by plan then its "
               "total; wire bytes per rank per step; base/top stack the segments; pid pos "
               "npos mark panel short: the plan's panel, the config's place in it by total, "
               "the panel's configs, 1 its least, 2 its most (on the config's top segment "
               "only), the plan, the label less the plan)\n", rp_comm_query);
    double *bytes = calloc(nser ? nser : 1, sizeof *bytes);
    if (!bytes) exit(SB_EXIT_FAIL);
    for (size_t i = 0; i < n; i++) {
      for (size_t s = 0; s < nser; s++) bytes[s] = NAN;
      sqlite3_reset(st);
      sqlite3_bind_int64(st, 1, v[i]->result_id);
      while (sqlite3_step(st) == SQLITE_ROW) {
        char nm[96];
        snprintf(nm, sizeof nm, "%s:%s", col_text(st, 0), col_text(st, 1));
        dat_token(nm);
        for (size_t s = 0; s < nser; s++)
          if (!strcmp(ser[s].name, nm)) bytes[s] = sqlite3_column_double(st, 2);
      }
      double base = 0;
      bool any = false;
      size_t top = 0; /* the config's top segment: only it carries the mark */
      for (size_t s = 0; s < nser; s++)
        if (!isnan(bytes[s])) top = s;
      for (size_t s = 0; s < nser; s++) {
        if (isnan(bytes[s])) continue;
        fprintf(f, "%zu %s %s %zu", charted, v[i]->label, ser[s].name, s + 1);
        dat_num(f, bytes[s]);
        dat_num(f, base);
        dat_num(f, base + bytes[s]);
        rp_place at = pl[i];
        if (s != top) at.mark = 0;
        dat_place(f, v[i], &at);
        fputc('\n', f);
        base += bytes[s];
        any = true;
      }
      if (any) charted++; /* every config here has comm rows (its total above) */
    }
    free(bytes);
    close_out(r, f, "data/comm.dat");
  }
  sqlite3_finalize(st);
  free(ser);
  /* one cross per config: the sum of the framework parts (TP + DP) its plan's
   * settings select, stored by the sweep (bench/harness/store.c) or by
   * `shardbench baselines --plan`. The per-framework comm_bytes_per_step rows and
   * the runtime's own closed form are not drawn. */
  *nbase = write_baselines(r, "data/comm_baselines.dat", "comm_bytes_per_step_combined", v,
                           pl, charted);
  free(v);
  free(pl);
  return charted;
}

/* Which peak the MFU of rows v is against: one value and source for all (the
 * usual case: one run), none, or several (--run all over runs measured apart). */
static void mfu_peak_label(rp_report *r, const rp_row **v, size_t n) {
  const rp_row *first = NULL;
  bool several = false;
  for (size_t i = 0; i < n; i++) {
    if (isnan(v[i]->peak)) continue;
    if (!first) first = v[i];
    else if (v[i]->peak != first->peak || strcmp(v[i]->peak_source, first->peak_source))
      several = true;
  }
  if (!first) {
    snprintf(r->mfu_axis, sizeof r->mfu_axis, "MFU (no peak recorded)");
    snprintf(r->mfu_note, sizeof r->mfu_note, "No result recorded an MFU peak, so no MFU.");
  } else if (several) {
    snprintf(r->mfu_axis, sizeof r->mfu_axis, "MFU (%% of each run's peak)");
    snprintf(r->mfu_note, sizeof r->mfu_note, "MFU is against each result's own peak (they "
             "differ between runs: see the runs table).");
  } else {
    snprintf(r->mfu_axis, sizeof r->mfu_axis, "MFU (%% of %.4g TFLOP/s)", first->peak);
    snprintf(r->mfu_note, sizeof r->mfu_note, "MFU is against a peak of %.4g TFLOP/s (%s).",
             first->peak, first->peak_source[0] ? first->peak_source : "source not recorded");
  }
}

static size_t write_throughput(rp_report *r) {
  size_t n = 0;
  const rp_row **v = select_rows(r, keep_throughput, by_mesh, &n);
  mfu_peak_label(r, v, n);
  double *key = new_keys(n);
  for (size_t i = 0; i < n; i++) key[i] = v[i]->tokens;
  rp_place *pl = new_places(n);
  order_panels(v, n, key, true, pl);
  free(key);
  FILE *f = open_out(r, "data/throughput.dat");
  if (f) {
    fprintf(f, "# idx label mesh plan world tokens_per_s mfu_pct tflops step_time_s status "
               "peak_tflops pid pos npos mark panel short mfu_axis\n");
    fprintf(f, "# query: %s (?1 = the run; rows with status ok/mismatch and tokens_per_s, "
               "by plan then tokens_per_s, the most first; mfu_pct = 100 * mfu; mfu_axis: the "
               "MFU axis label, the same on every row; pid pos npos mark panel short: the "
               "plan's panel, the config's place in it, the panel's configs, 1 its fastest, "
               "2 its slowest, the plan, the label less the plan)\n", rp_rows_query);
    for (size_t i = 0; i < n; i++) {
      char plan[RP_LABEL];
      snprintf(plan, sizeof plan, "%s", v[i]->plan);
      dat_token(plan);
      fprintf(f, "%zu %s %s %s %d", i, v[i]->label, v[i]->mesh, plan, v[i]->world);
      dat_num(f, v[i]->tokens);
      dat_num(f, 100.0 * v[i]->mfu); /* fraction to percent */
      dat_num(f, v[i]->tflops);
      dat_num(f, v[i]->step_s);
      fprintf(f, " %s", v[i]->status);
      dat_num(f, v[i]->peak);
      dat_place(f, v[i], &pl[i]);
      fprintf(f, " \"%s\"\n", r->mfu_axis); /* no '"' in it: a number and fixed words */
    }
    close_out(r, f, "data/throughput.dat");
  }
  free(pl);
  free(v);
  return n;
}

static size_t write_memory(rp_report *r, size_t *nbase) {
  size_t n = 0;
  const rp_row **v = select_rows(r, keep_memory, by_plan, &n);
  double *key = new_keys(n);
  for (size_t i = 0; i < n; i++) key[i] = v[i]->mem;
  rp_place *pl = new_places(n);
  order_panels(v, n, key, false, pl);
  free(key);
  FILE *f = open_out(r, "data/memory.dat");
  if (f) {
    fprintf(f, "# idx label plan pid mesh peak_mem_bytes status params_bytes grads_bytes "
               "optimizer_bytes activations_bytes pid pos npos mark panel short\n");
    fprintf(f, "# query: %s (?1 = the run; rows with status ok/mismatch and peak_mem_bytes, "
               "by plan then peak_mem_bytes; pid numbers the plans; peak_mem_bytes is the max "
               "over ranks and the run; params_bytes .. activations_bytes are rank 0's split "
               "in the last timed step, mem_params_bytes .. mem_activations_bytes, all NaN "
               "when one is NULL; pid (again) pos npos mark panel short: the plan's panel, the "
               "config's place in it by peak, the panel's configs, 1 its least, 2 its most, "
               "the plan, the label less the plan)\n",
            rp_rows_query);
    int pid = 0;
    for (size_t i = 0; i < n; i++) {
      if (i == 0 || strcmp(v[i]->plan, v[i - 1]->plan)) pid++;
      char plan[RP_LABEL];
      snprintf(plan, sizeof plan, "%s", v[i]->plan);
      dat_token(plan);
      fprintf(f, "%zu %s %s %d %s", i, v[i]->label, plan, pid, v[i]->mesh);
      dat_num(f, v[i]->mem);
      fprintf(f, " %s", v[i]->status);
      /* a stack is whole or not drawn: one NULL part would shift the ones above it */
      bool whole = true;
      for (int k = 0; k < 4; k++) whole &= !isnan(v[i]->split[k]);
      for (int k = 0; k < 4; k++) dat_num(f, whole ? v[i]->split[k] : NAN);
      dat_place(f, v[i], &pl[i]);
      fputc('\n', f);
    }
    close_out(r, f, "data/memory.dat");
  }
  *nbase = write_baselines(r, "data/memory_baselines.dat", "memory_bytes_per_rank", v, pl, n);
  free(pl);
  free(v);
  return n;
}

/* The cp chart's groups: configs that differ only in cp (the rest of the config key,
 * bench/harness/run.c's sb_config_fill, with the mesh's other dims), then by cp, the
 * newest result first: two configs with the same fields under different key texts
 * (keys written by another version) give one point, the newest. */
static int cmp_cp_group(const rp_row *a, const rp_row *b) {
  int c = strcmp(a->plan, b->plan);
  if (!c) c = strcmp(a->model, b->model);
  if (!c) c = strcmp(a->workload, b->workload);
  if (!c) c = strcmp(a->dtype, b->dtype);
  if (!c) c = strcmp(a->backend, b->backend);
  if (c) return c;
  const long long da[7] = {a->pp, a->dpr, a->dps, a->tp, a->batch, a->seq, a->steps};
  const long long db[7] = {b->pp, b->dpr, b->dps, b->tp, b->batch, b->seq, b->steps};
  for (int i = 0; i < 7; i++)
    if (da[i] != db[i]) return da[i] < db[i] ? -1 : 1;
  return 0;
}

static int by_cp_group(const void *pa, const void *pb) {
  const rp_row *a = *(const rp_row *const *)pa, *b = *(const rp_row *const *)pb;
  int c = cmp_cp_group(a, b);
  if (!c && a->cp != b->cp) c = a->cp < b->cp ? -1 : 1;
  if (!c && a->result_id != b->result_id) c = a->result_id > b->result_id ? -1 : 1;
  return c;
}

/* Why the cp chart is empty; the index prints it after "Not drawn: ". */
static const char rp_cp_none_measured[] =
    "no measured result (status ok or mismatch) with a peak memory in the selected results";
static const char rp_cp_none_cp[] =
    "no measured config with a cp dim (cp of 2 or more) in the selected results";
static const char rp_cp_no_series[] =
    "no series: no group of configs that differ only in cp (same plan, model, workload, "
    "dtype, batch, global seq, steps, backend, pp, dp_replicate, dp_shard and tp) has a "
    "measured peak at two or more cp values";

/* cp_memory.dat: gid label cp peak_mib activations_mib status peak_mem_bytes
 * activations_bytes, one row per config of each group with at least two cp values,
 * by group then cp. Returns the configs charted; *nseries the groups, *why the
 * reason when there are none. */
static size_t write_cp_memory(rp_report *r, size_t *nseries, const char **why) {
  size_t n = 0;
  const rp_row **v = select_rows(r, keep_memory, by_cp_group, &n);
  /* One row per group and cp: the newest (first in by_cp_group's order). */
  size_t k = 0;
  bool any_cp = false;
  for (size_t i = 0; i < n; i++) {
    any_cp |= v[i]->cp > 1;
    if (k && !cmp_cp_group(v[k - 1], v[i]) && v[k - 1]->cp == v[i]->cp) continue;
    v[k++] = v[i];
  }
  n = k;
  /* The label's optional fields: the ones that differ between the rows. */
  bool vary_model = false, vary_wl = false, vary_dt = false, vary_st = false, vary_be = false;
  for (size_t i = 1; i < n; i++) {
    vary_model |= strcmp(v[0]->model, v[i]->model) != 0;
    vary_wl |= strcmp(v[0]->workload, v[i]->workload) != 0;
    vary_dt |= strcmp(v[0]->dtype, v[i]->dtype) != 0;
    vary_st |= v[0]->steps != v[i]->steps;
    vary_be |= strcmp(v[0]->backend, v[i]->backend) != 0;
  }
  *nseries = 0;
  size_t charted = 0;
  FILE *f = open_out(r, "data/cp_memory.dat");
  if (f) {
    fprintf(f, "# gid label cp peak_mib activations_mib status peak_mem_bytes "
               "activations_bytes\n");
    fprintf(f, "# query: %s (?1 = the run; rows with status ok/mismatch and peak_mem_bytes, "
               "grouped by the config less cp (plan, model, workload, dtype, backend, pp, "
               "dp_replicate, dp_shard, tp, batch, seq, steps), by cp within a group; only "
               "groups with two or more cp values; MiB = 2^20 bytes; peak_mem_bytes is the "
               "max over ranks and the run; activations_bytes is rank 0's "
               "mem_activations_bytes in the last timed step, NaN when NULL)\n",
            rp_rows_query);
    for (size_t i = 0; i < n;) {
      size_t e = i + 1;
      while (e < n && !cmp_cp_group(v[i], v[e])) e++;
      if (e - i >= 2) { /* distinct cp values after the dedup above */
        const rp_row *g = v[i];
        char label[RP_LABEL];
        snprintf(label, sizeof label, "%s/pp%d.dpr%d.dps%d.tp%d/b%llds%lld%s%s%s%s%s%s%s%s%s",
                 g->plan, g->pp, g->dpr, g->dps, g->tp, g->batch, g->seq,
                 vary_model ? "/" : "", vary_model ? g->model : "", vary_wl ? "/" : "",
                 vary_wl ? g->workload : "", vary_dt ? "/" : "", vary_dt ? g->dtype : "",
                 vary_be ? "/" : "", vary_be ? g->backend : "", vary_st ? "/steps" : "");
        if (vary_st) {
          size_t l = strlen(label);
          snprintf(label + l, sizeof label - l, "%lld", g->steps);
        }
        dat_token(label);
        ++*nseries;
        for (size_t j = i; j < e; j++) {
          const double mib = 1024.0 * 1024.0; /* bytes per MiB */
          fprintf(f, "%zu %s %d", *nseries, label, v[j]->cp);
          dat_num(f, v[j]->mem / mib);
          dat_num(f, v[j]->split[3] / mib); /* NaN stays NaN */
          fprintf(f, " %s", v[j]->status);
          dat_num(f, v[j]->mem);
          dat_num(f, v[j]->split[3]);
          fputc('\n', f);
          charted++;
        }
      }
      i = e;
    }
    close_out(r, f, "data/cp_memory.dat");
  }
  *why = !n ? rp_cp_none_measured : !any_cp ? rp_cp_none_cp : rp_cp_no_series;
  free(v);
  return charted;
}

static size_t write_error(rp_report *r) {
  size_t n = 0;
  const rp_row **v = select_rows(r, keep_error, by_plan, &n);
  double *key = new_keys(n);
  for (size_t i = 0; i < n; i++) key[i] = v[i]->rel_err;
  rp_place *pl = new_places(n);
  order_panels(v, n, key, false, pl);
  free(key);
  FILE *f = open_out(r, "data/error.dat");
  if (f) {
    fprintf(f, "# idx label status ok max_rel_err tolerance max_abs_err pid pos npos mark "
               "panel short\n");
    fprintf(f, "# query: %s (?1 = the run; rows with status ok/mismatch and max_rel_err, "
               "by plan then max_rel_err; ok = 1 for status ok; pid pos npos mark panel "
               "short: the plan's panel, the config's place in it by error, the panel's "
               "configs, 1 its smallest error, 2 its largest, the plan, the label less the "
               "plan)\n", rp_rows_query);
    for (size_t i = 0; i < n; i++) {
      fprintf(f, "%zu %s %s %d", i, v[i]->label, v[i]->status, !strcmp(v[i]->status, "ok"));
      dat_num(f, v[i]->rel_err);
      dat_num(f, v[i]->tol);
      dat_num(f, v[i]->abs_err);
      dat_place(f, v[i], &pl[i]);
      fputc('\n', f);
    }
    close_out(r, f, "data/error.dat");
  }
  free(pl);
  free(v);
  return n;
}

/* ---- pipeline parallel (the pp_* tables, schema version 4 on) ---- */

static bool keep_pp(const rp_row *w) { return measured(w) && w->pp > 1; }

static const char rp_pp_query[] =
    "SELECT schedule, pp, virtual_stages, microbatches, steps, bubble_measured, "
    "bubble_analytic, span_s FROM pp_stats WHERE result_id = ?1";
static const char rp_pp_stages_query[] =
    "SELECT pp_rank, max_in_flight, peak_act_bytes, busy_s, bubble FROM pp_stages "
    "WHERE result_id = ?1 ORDER BY pp_rank";
static const char rp_pp_events_query[] =
    "SELECT rank, pp_rank, action, stage, microbatch, t0_s, t1_s FROM pp_events "
    "WHERE result_id = ?1 AND step = (SELECT max(step) FROM pp_events WHERE result_id = ?1) "
    "ORDER BY rank, t0_s";

/* The Gantt chart's box colour of an action: 1 F, 2 B, 3 a send, 4 a receive's wait. */
static int gantt_kind(const char *a) {
  if (!strcmp(a, "F")) return 1;
  if (!strcmp(a, "B")) return 2;
  return !strncmp(a, "SEND", 4) ? 3 : 4;
}

/* data/pp_gantt_RID.dat of one result: its last timed step's events. Rows written. */
static size_t write_gantt(rp_report *r, sqlite3_stmt *ev, long long rid, int v) {
  char name[64];
  snprintf(name, sizeof name, "data/pp_gantt_%lld.dat", rid);
  FILE *f = open_out(r, name);
  if (!f) return 0;
  fprintf(f, "# rank pp_rank action kid stage microbatch t0_ms t1_ms text\n");
  fprintf(f, "# query: %s (?1 = %lld; kid 1 F, 2 B, 3 SEND_*, 4 RECV_* (the wait for the "
             "data); ms from the step's zero; text: the box's label, microbatch or "
             "stage:microbatch)\n", rp_pp_events_query, rid);
  sqlite3_reset(ev);
  sqlite3_bind_int64(ev, 1, rid);
  size_t n = 0;
  while (sqlite3_step(ev) == SQLITE_ROW) {
    char act[16], text[32];
    snprintf(act, sizeof act, "%s", col_text(ev, 2));
    dat_token(act);
    const int stage = sqlite3_column_int(ev, 3), mb = sqlite3_column_int(ev, 4);
    if (v > 1) snprintf(text, sizeof text, "%d:%d", stage, mb);
    else snprintf(text, sizeof text, "%d", mb);
    fprintf(f, "%d %d %s %d %d %d", sqlite3_column_int(ev, 0), sqlite3_column_int(ev, 1), act,
            gantt_kind(act), stage, mb);
    dat_num(f, 1e3 * sqlite3_column_double(ev, 5)); /* s to ms */
    dat_num(f, 1e3 * sqlite3_column_double(ev, 6));
    fprintf(f, " %s\n", text);
    n++;
  }
  close_out(r, f, name);
  return n;
}

/* Why pp_bubble is empty; the index prints it after "Not drawn: ". */
static const char rp_pp_old_db[] =
    "the DB is of a schema version before 4, which has no pipeline timelines";
static const char rp_pp_none[] =
    "no measured pipelined config (pp of 2 or more with a pp_stats row) in the selected results";

/* pp_bubble.dat (idx rid label schedule pp v m bubble_measured bubble_analytic span_ms
 * status), pp_stages.dat (idx rid label pp pp_rank max_in_flight peak_act_mib busy_ms
 * bubble) and each result's pp_gantt_RID.dat. Returns the results charted; their ids and
 * rows into *rids / *rows (malloc'd), *why the reason when there are none. */
static size_t write_pp(rp_report *r, long long **rids, const rp_row ***rows, const char **why) {
  size_t n = 0;
  const rp_row **v = select_rows(r, keep_pp, by_plan, &n);
  *rids = calloc(n ? n : 1, sizeof **rids);
  if (!*rids) exit(SB_EXIT_FAIL);
  *rows = v;
  *why = r->st.version < 4 ? rp_pp_old_db : rp_pp_none;
  FILE *f = open_out(r, "data/pp_bubble.dat"), *g = open_out(r, "data/pp_stages.dat");
  sqlite3_stmt *st = NULL, *sg = NULL, *ev = NULL;
  size_t charted = 0;
  if (f) {
    fprintf(f, "# idx rid label schedule pp v m bubble_measured bubble_analytic span_ms status\n");
    fprintf(f, "# query: %s (?1 = each ok/mismatch result with pp > 1, by plan then bubble_measured; "
               "rid = the result's id; v = virtual_stages, m = microbatches; span_ms = "
               "span_s in ms; the bubbles as results/schema.sql defines them)\n", rp_pp_query);
  }
  if (g) {
    fprintf(g, "# idx rid label pp pp_rank max_in_flight peak_act_mib busy_ms bubble\n");
    fprintf(g, "# query: %s (?1 = each result of pp_bubble.dat; idx its idx there; "
               "peak_act_mib = peak_act_bytes / 2^20; busy_ms = busy_s in ms)\n",
            rp_pp_stages_query);
  }
  if (r->st.version >= 4 && f && g &&
      (sqlite3_prepare_v2(r->db, rp_pp_query, -1, &st, NULL) != SQLITE_OK ||
       sqlite3_prepare_v2(r->db, rp_pp_stages_query, -1, &sg, NULL) != SQLITE_OK ||
       sqlite3_prepare_v2(r->db, rp_pp_events_query, -1, &ev, NULL) != SQLITE_OK)) {
    fprintf(stderr, "shardbench report: cannot read the pipeline tables: %s\n",
            sqlite3_errmsg(r->db));
    r->write_failed = true;
  }
  /* Within each plan, the configs by measured bubble (the least first), as the
   * other charts sort by their quantity; one without a pp_stats row sorts last. */
  if (st && n) {
    double *key = new_keys(n);
    for (size_t i = 0; i < n; i++) {
      sqlite3_reset(st);
      sqlite3_bind_int64(st, 1, v[i]->result_id);
      key[i] = sqlite3_step(st) == SQLITE_ROW ? col_real(st, 5) : NAN;
    }
    rp_place *pl = new_places(n);
    order_panels(v, n, key, false, pl);
    free(pl);
    free(key);
  }
  for (size_t i = 0; st && sg && ev && i < n; i++) {
    sqlite3_reset(st);
    sqlite3_bind_int64(st, 1, v[i]->result_id);
    if (sqlite3_step(st) != SQLITE_ROW) continue; /* no timeline (an older run) */
    char sched[32];
    snprintf(sched, sizeof sched, "%s", col_text(st, 0));
    dat_token(sched);
    const int pp = sqlite3_column_int(st, 1), vs = sqlite3_column_int(st, 2);
    fprintf(f, "%zu %lld %s %s %d %d %d", charted, v[i]->result_id, v[i]->label, sched, pp, vs,
            sqlite3_column_int(st, 3));
    dat_num(f, col_real(st, 5));
    dat_num(f, col_real(st, 6)); /* NaN: no formula (a CSV schedule) */
    dat_num(f, 1e3 * col_real(st, 7));
    fprintf(f, " %s\n", v[i]->status);
    sqlite3_reset(sg);
    sqlite3_bind_int64(sg, 1, v[i]->result_id);
    while (sqlite3_step(sg) == SQLITE_ROW) {
      fprintf(g, "%zu %lld %s %d %d %d", charted, v[i]->result_id, v[i]->label, pp,
              sqlite3_column_int(sg, 0), sqlite3_column_int(sg, 1));
      dat_num(g, col_real(sg, 2) / (1024.0 * 1024.0)); /* bytes per MiB */
      dat_num(g, 1e3 * col_real(sg, 3));
      dat_num(g, col_real(sg, 4));
      fputc('\n', g);
    }
    write_gantt(r, ev, v[i]->result_id, vs);
    (*rids)[charted] = v[i]->result_id;
    v[charted++] = v[i];
  }
  sqlite3_finalize(st);
  sqlite3_finalize(sg);
  sqlite3_finalize(ev);
  close_out(r, f, "data/pp_bubble.dat");
  close_out(r, g, "data/pp_stages.dat");
  return charted;
}

/* ---- capacity charts (the plan_runs and predictions tables, schema version 5 on) ----
 *
 * `shardbench plan` writes one plan_runs row per GPU count it is given and its
 * ranked layouts as predictions rows. The charts read one run's plan runs: the
 * --run given, or (latest, all) the newest run that has plan runs. A GPU count
 * planned twice in that run is read from its newest plan run. */

/* What the capacity section found: the run, its newest plan run, and why nothing is drawn. */
typedef struct rp_cap {
  long long run;      /* the run read (0: none) */
  long long newest;   /* its newest plan_runs row (capacity_breakdown, the ranked table) */
  int gpus;           /* that plan run's GPU count */
  double hbm_gb;      /* its hardware's hbm_gb (NaN: none in the file) */
  double tokens;      /* its --tokens (NaN: none): the ranked table adds the training time */
  char hw[128];       /* its hardware's name */
  char desc[384];     /* model, seq, batch, dtype, features, hardware: the charts' subtitle */
  size_t nmem, nthr, nbrk, nrank, nover, ngpus;
  char why[256];      /* when not drawn */
} rp_cap;

static bool has_table(sqlite3 *db, const char *name) {
  sqlite3_stmt *st = NULL;
  bool found = false;
  if (sqlite3_prepare_v2(db, "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1",
                         -1, &st, NULL) == SQLITE_OK) {
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    found = sqlite3_step(st) == SQLITE_ROW;
  }
  sqlite3_finalize(st);
  return found;
}

/* The HBM capacity in GB (1e9 bytes) from a hardware file's text ("key = value  #
 * source" lines, results/hardware/README): hbm_gb = N is N GB; hbm_gib = N, the
 * form the shipped files use (DRAM capacity is binary), is N x 2^30 bytes. NaN when
 * no line sets either. */
static double hw_hbm_gb(const char *text) {
  for (const char *l = text; l && *l;) {
    const char *p = l;
    while (*p == ' ' || *p == '\t') p++;
    const char *k = p;
    while ((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_' || *p == '.') p++;
    const size_t kl = (size_t)(p - k);
    const double unit = kl == 6 && !strncmp(k, "hbm_gb", 6)    ? 1e9
                        : kl == 7 && !strncmp(k, "hbm_gib", 7) ? 1073741824.0 /* 2^30 */
                                                                : 0;
    while (*p == ' ' || *p == '\t') p++;
    if (unit > 0 && *p == '=') {
      char *end;
      double v = strtod(p + 1, &end);
      if (end != p + 1 && v > 0) return v * unit / 1e9;
    }
    l = strchr(l, '\n');
    if (l) l++;
  }
  return NAN;
}

static long long query_ll(sqlite3 *db, const char *q, long long a) {
  sqlite3_stmt *st = NULL;
  long long v = 0;
  if (sqlite3_prepare_v2(db, q, -1, &st, NULL) == SQLITE_OK) {
    sqlite3_bind_int64(st, 1, a);
    if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL)
      v = sqlite3_column_int64(st, 0);
  }
  sqlite3_finalize(st);
  return v;
}

/* Per plan and GPU count, the layouts in the order of choice: the newest plan run
 * of that count first, then those that fit by rank (1 = fastest), then the rest by
 * peak. The first row of each (plan, gpus) is what capacity_memory draws; the first
 * that fits, what capacity_throughput draws. */
static const char rp_cap_query[] =
    "SELECT pr.id, pr.gpus, p.plan, p.pp, p.dp_replicate, p.dp_shard, p.cp, p.tp, p.fits, "
    "p.rank, p.peak_bytes, p.over_bytes, p.tokens_per_s_per_gpu, p.mfu, p.step_s, p.ac, "
    "p.local_batch, p.microbatches, h.text FROM predictions p "
    "JOIN plan_runs pr ON pr.id = p.plan_run_id JOIN hardware h ON h.id = pr.hardware_id "
    "WHERE pr.run_id = ?1 AND pr.id = (SELECT max(q.id) FROM plan_runs q WHERE "
    "q.run_id = pr.run_id AND q.gpus = pr.gpus) "
    "ORDER BY p.plan, pr.gpus, p.fits DESC, p.rank IS NULL, p.rank, p.peak_bytes, p.id";

/* The newest plan run's layouts, ranked first (by rank), then those that do not fit
 * (by how far over). */
static const char rp_cap_ranked_query[] =
    "SELECT rank, plan, pp, dp_replicate, dp_shard, cp, tp, ac, local_batch, accum_steps, "
    "microbatches, coalesce(schedule, '-'), fits, peak_bytes, over_bytes, step_s, "
    "tokens_per_s_per_gpu, mfu, coalesce(verdict, '-'), compute_s, recompute_s, bubble_s, "
    "exposed_pp_s, exposed_dp_replicate_s, exposed_dp_shard_s, exposed_cp_s, exposed_tp_s, "
    "train_s, gpu_hours FROM predictions WHERE plan_run_id = ?1 "
    "ORDER BY rank IS NULL, rank, over_bytes, peak_bytes, id";

/* The top of the ranked layouts that capacity_breakdown draws: about 20 bars stay
 * readable with their labels at 1600 px. */
enum { RP_CAP_TOP = 20 };

static void cap_pred_mesh(sqlite3_stmt *st, int c0, char *mesh, size_t cap) {
  const int dims[5] = {sqlite3_column_int(st, c0), sqlite3_column_int(st, c0 + 1),
                       sqlite3_column_int(st, c0 + 2), sqlite3_column_int(st, c0 + 3),
                       sqlite3_column_int(st, c0 + 4)};
  mesh_text(dims, mesh, cap);
}

/* Writes data/capacity_memory.dat, capacity_throughput.dat, capacity_hw.dat,
 * capacity_breakdown.dat and capacity_ranked.dat; fills *c. */
static void write_capacity(rp_report *r, rp_cap *c) {
  memset(c, 0, sizeof *c);
  c->hbm_gb = NAN;
  c->tokens = NAN;
  static const char *const cap_files[5] = {
      "data/capacity_memory.dat", "data/capacity_throughput.dat", "data/capacity_hw.dat",
      "data/capacity_breakdown.dat", "data/capacity_ranked.dat"};
  FILE *f[5];
  for (int i = 0; i < 5; i++) f[i] = open_out(r, cap_files[i]);
  if (f[0]) {
    fprintf(f[0], "# gpus plan pid mesh peak_gb fits rank over_gb capacity_gb ac local_batch "
                  "microbatches\n");
    fprintf(f[0], "# query: %s (?1 = the run; per plan and gpus its first row: the best "
                  "ranked layout that fits, else the smallest peak; pid numbers the plans; "
                  "GB = 1e9 bytes; capacity_gb: the HBM of the plan run's hardware, hbm_gb or "
                  "hbm_gib in GB)\n",
            rp_cap_query);
  }
  if (f[1]) {
    fprintf(f[1], "# gpus plan pid mesh tokens_per_s_per_gpu mfu_pct rank step_s best\n");
    fprintf(f[1], "# query: %s (?1 = the run; per plan and gpus its first row that fits: "
                  "rank 1 is the fastest; mfu_pct = 100 * mfu; best = 1 on the fastest "
                  "row of its gpus over all plans)\n", rp_cap_query);
  }
  if (f[2]) {
    fprintf(f[2], "# gpus capacity_gb hardware desc\n");
    fprintf(f[2], "# query: SELECT pr.gpus, h.text, h.name FROM plan_runs pr JOIN hardware h "
                  "ON h.id = pr.hardware_id WHERE pr.run_id = ?1 (the newest per gpus); "
                  "capacity_gb: the hbm_gb (GB) or hbm_gib (GiB) line of the text, in GB = 1e9 "
                  "bytes, NaN: none; desc: "
                  "the newest plan run's model, seq, batch, dtype, features and hardware, "
                  "the same on every row\n");
  }
  if (f[3]) {
    fprintf(f[3], "# idx rank label mesh plan compute_s recompute_s bubble_s exposed_pp_s "
                  "exposed_dp_replicate_s exposed_dp_shard_s exposed_cp_s exposed_tp_s step_s\n");
    fprintf(f[3], "# query: %s (?1 = the newest plan run; its first %d ranked layouts)\n",
            rp_cap_ranked_query, RP_CAP_TOP);
  }
  if (f[4]) {
    fprintf(f[4], "# rank plan mesh ac local_batch accum_steps microbatches schedule fits "
                  "peak_gb over_gb step_s tokens_per_s_per_gpu mfu_pct verdict train_s gpu_hours\n");
    fprintf(f[4], "# query: %s (?1 = the newest plan run; rank NaN: does not fit; GB = 1e9 "
                  "bytes)\n", rp_cap_ranked_query);
  }
  if (!has_table(r->db, "predictions") || !has_table(r->db, "plan_runs") ||
      !has_table(r->db, "hardware")) {
    snprintf(c->why, sizeof c->why, "this DB (schema version %d) has no plan_runs and "
             "predictions tables (schema version 5 on; shardbench plan writes them)",
             r->st.version);
    goto done;
  }
  const bool pick_newest = r->run_latest || r->run == 0;
  c->run = pick_newest ? query_ll(r->db, "SELECT max(run_id) FROM plan_runs WHERE ?1 = ?1", 0)
                       : query_ll(r->db, "SELECT max(run_id) FROM plan_runs WHERE run_id = ?1",
                                  r->run);
  if (!c->run) {
    if (pick_newest)
      snprintf(c->why, sizeof c->why, "no plan_runs rows in this DB (shardbench plan writes "
               "them)");
    else
      snprintf(c->why, sizeof c->why, "run %lld has no plan_runs rows (shardbench plan "
               "writes them)", r->run);
    goto done;
  }
  c->newest = query_ll(r->db, "SELECT max(id) FROM plan_runs WHERE run_id = ?1", c->run);
  sqlite3_stmt *st = NULL;
  /* the newest plan run: its description and hardware */
  if (sqlite3_prepare_v2(r->db,
                         "SELECT pr.model, pr.seq, pr.global_batch, pr.dtype, pr.features, "
                         "pr.tokens, h.name, h.text, pr.gpus FROM plan_runs pr JOIN hardware h "
                         "ON h.id = pr.hardware_id WHERE pr.id = ?1",
                         -1, &st, NULL) == SQLITE_OK) {
    sqlite3_bind_int64(st, 1, c->newest);
    if (sqlite3_step(st) == SQLITE_ROW) {
      snprintf(c->hw, sizeof c->hw, "%s", col_text(st, 6));
      c->hbm_gb = hw_hbm_gb(col_text(st, 7));
      c->gpus = sqlite3_column_int(st, 8);
      c->tokens = col_real(st, 5);
      const char *feat = col_text(st, 4);
      char tok[48] = "";
      if (!isnan(c->tokens)) snprintf(tok, sizeof tok, ", %.4g tokens", c->tokens);
      snprintf(c->desc, sizeof c->desc, "model %s, seq %d, global batch %d, %s%s%s%s, on %s",
               col_text(st, 0), sqlite3_column_int(st, 1), sqlite3_column_int(st, 2),
               col_text(st, 3), *feat ? ", " : "", feat, tok, c->hw);
      for (char *q = c->desc; *q; q++)
        if (*q == '"') *q = '\''; /* the desc is a quoted .dat column */
    }
  }
  sqlite3_finalize(st);
  st = NULL;
  /* capacity_hw.dat: the capacity at each GPU count */
  if (f[2] && sqlite3_prepare_v2(r->db,
                                 "SELECT pr.gpus, h.text, h.name FROM plan_runs pr JOIN hardware "
                                 "h ON h.id = pr.hardware_id WHERE pr.run_id = ?1 AND pr.id = "
                                 "(SELECT max(q.id) FROM plan_runs q WHERE q.run_id = pr.run_id "
                                 "AND q.gpus = pr.gpus) ORDER BY pr.gpus",
                                 -1, &st, NULL) == SQLITE_OK) {
    sqlite3_bind_int64(st, 1, c->run);
    while (sqlite3_step(st) == SQLITE_ROW) {
      char name[128];
      snprintf(name, sizeof name, "%s", col_text(st, 2));
      dat_token(name);
      fprintf(f[2], "%d", sqlite3_column_int(st, 0));
      dat_num(f[2], hw_hbm_gb(col_text(st, 1)));
      fprintf(f[2], " %s \"%s\"\n", name[0] ? name : "?", c->desc);
      c->ngpus++;
    }
  }
  sqlite3_finalize(st);
  st = NULL;
  /* capacity_memory.dat and capacity_throughput.dat */
  if (sqlite3_prepare_v2(r->db, rp_cap_query, -1, &st, NULL) != SQLITE_OK) {
    fprintf(stderr, "shardbench report: cannot read predictions: %s\n", sqlite3_errmsg(r->db));
    r->write_failed = true;
    goto done;
  }
  sqlite3_bind_int64(st, 1, c->run);
  /* the fastest that fits at each GPU count, over all plans: capacity_throughput
   * labels it (the newest plan run of each count, as rp_cap_query reads) */
  enum { RP_CAP_GPUS = 64 }; /* GPU counts labelled; more go unlabelled */
  int best_gpus[RP_CAP_GPUS];
  double best_tok[RP_CAP_GPUS];
  size_t nbest = 0;
  {
    sqlite3_stmt *b = NULL;
    if (sqlite3_prepare_v2(r->db,
                           "SELECT pr.gpus, max(p.tokens_per_s_per_gpu) FROM predictions p JOIN "
                           "plan_runs pr ON pr.id = p.plan_run_id WHERE pr.run_id = ?1 AND p.fits "
                           "AND pr.id = (SELECT max(q.id) FROM plan_runs q WHERE q.run_id = "
                           "pr.run_id AND q.gpus = pr.gpus) GROUP BY pr.gpus",
                           -1, &b, NULL) == SQLITE_OK) {
      sqlite3_bind_int64(b, 1, c->run);
      while (sqlite3_step(b) == SQLITE_ROW && nbest < RP_CAP_GPUS) {
        best_gpus[nbest] = sqlite3_column_int(b, 0);
        best_tok[nbest++] = sqlite3_column_double(b, 1);
      }
    }
    sqlite3_finalize(b);
  }
  char last_plan[RP_LABEL] = "";
  int last_gpus = -1, pid = 0;
  bool have_mem = false, have_thr = false;
  while (sqlite3_step(st) == SQLITE_ROW) {
    const int gpus = sqlite3_column_int(st, 1);
    char plan[RP_LABEL], mesh[RP_MESH], ac[64];
    snprintf(plan, sizeof plan, "%s", col_text(st, 2));
    dat_token(plan);
    snprintf(ac, sizeof ac, "%s", col_text(st, 15));
    dat_token(ac);
    if (!ac[0]) snprintf(ac, sizeof ac, "?");
    cap_pred_mesh(st, 3, mesh, sizeof mesh);
    if (strcmp(plan, last_plan)) pid++;
    if (strcmp(plan, last_plan) || gpus != last_gpus) have_mem = have_thr = false;
    snprintf(last_plan, sizeof last_plan, "%s", plan);
    last_gpus = gpus;
    const bool fits = sqlite3_column_int(st, 8) != 0;
    if (!have_mem && f[0]) {
      have_mem = true;
      fprintf(f[0], "%d %s %d %s", gpus, plan, pid, mesh);
      dat_num(f[0], col_real(st, 10) / 1e9); /* bytes to GB */
      fprintf(f[0], " %d", fits);
      dat_num(f[0], col_real(st, 9));
      dat_num(f[0], col_real(st, 11) / 1e9);
      dat_num(f[0], hw_hbm_gb(col_text(st, 18)));
      fprintf(f[0], " %s %d %d\n", ac, sqlite3_column_int(st, 16), sqlite3_column_int(st, 17));
      c->nmem++;
    }
    if (fits && !have_thr && f[1]) {
      have_thr = true;
      fprintf(f[1], "%d %s %d %s", gpus, plan, pid, mesh);
      dat_num(f[1], col_real(st, 12));
      dat_num(f[1], 100.0 * col_real(st, 13)); /* fraction to percent */
      dat_num(f[1], col_real(st, 9));
      dat_num(f[1], col_real(st, 14));
      bool best = false;
      for (size_t b = 0; b < nbest; b++)
        best |= best_gpus[b] == gpus && best_tok[b] == sqlite3_column_double(st, 12);
      fprintf(f[1], " %d\n", best);
      c->nthr++;
    }
  }
  sqlite3_finalize(st);
  st = NULL;
  /* capacity_breakdown.dat and capacity_ranked.dat: the newest plan run */
  if (sqlite3_prepare_v2(r->db, rp_cap_ranked_query, -1, &st, NULL) != SQLITE_OK) {
    fprintf(stderr, "shardbench report: cannot read predictions: %s\n", sqlite3_errmsg(r->db));
    r->write_failed = true;
    goto done;
  }
  sqlite3_bind_int64(st, 1, c->newest);
  while (sqlite3_step(st) == SQLITE_ROW) {
    char plan[RP_LABEL], mesh[RP_MESH], ac[64], sched[64], verdict[32];
    snprintf(plan, sizeof plan, "%s", col_text(st, 1));
    dat_token(plan);
    cap_pred_mesh(st, 2, mesh, sizeof mesh);
    snprintf(ac, sizeof ac, "%s", col_text(st, 7));
    snprintf(sched, sizeof sched, "%s", col_text(st, 11));
    snprintf(verdict, sizeof verdict, "%s", col_text(st, 18));
    dat_token(ac);
    dat_token(sched);
    dat_token(verdict);
    const bool ranked = sqlite3_column_type(st, 0) != SQLITE_NULL;
    const bool fits = sqlite3_column_int(st, 12) != 0;
    if (f[4]) {
      fprintf(f[4], "%s %s %s %s %d %d %d %s %d", ranked ? col_text(st, 0) : "NaN", plan, mesh,
              ac[0] ? ac : "?", sqlite3_column_int(st, 8), sqlite3_column_int(st, 9),
              sqlite3_column_int(st, 10), sched[0] ? sched : "-", fits);
      dat_num(f[4], col_real(st, 13) / 1e9);
      dat_num(f[4], col_real(st, 14) / 1e9);
      dat_num(f[4], col_real(st, 15));
      dat_num(f[4], col_real(st, 16));
      dat_num(f[4], 100.0 * col_real(st, 17));
      fprintf(f[4], " %s", verdict[0] ? verdict : "-");
      dat_num(f[4], col_real(st, 27));
      dat_num(f[4], col_real(st, 28));
      fputc('\n', f[4]);
    }
    if (ranked) c->nrank++;
    if (!fits) c->nover++;
    if (ranked && c->nbrk < RP_CAP_TOP && f[3]) {
      fprintf(f[3], "%zu %s %s/%s %s %s", c->nbrk, col_text(st, 0), mesh, plan, mesh, plan);
      for (int k = 19; k <= 26; k++) dat_num(f[3], col_real(st, k)); /* compute_s .. exposed_tp_s */
      dat_num(f[3], col_real(st, 15));
      fputc('\n', f[3]);
      c->nbrk++;
    }
  }
  sqlite3_finalize(st);
  if (!c->nmem)
    snprintf(c->why, sizeof c->why, "run %lld's plan runs hold no predictions", c->run);
done:
  for (int i = 0; i < 5; i++) close_out(r, f[i], cap_files[i]);
}

/* ---- gnuplot ---- */

/* The program to run: $GNUPLOT or gnuplot, if it is an executable on PATH. */
static const char *find_gnuplot(char *buf, size_t n) {
  const char *prog = getenv("GNUPLOT");
  if (!prog || !*prog) prog = "gnuplot";
  if (strchr(prog, '/')) return access(prog, X_OK) == 0 ? prog : NULL;
  const char *path = getenv("PATH");
  if (!path) return NULL;
  while (*path) {
    size_t l = strcspn(path, ":");
    if (l && (int)l < (int)n - 2 &&
        snprintf(buf, n, "%.*s/%s", (int)l, path, prog) < (int)n && access(buf, X_OK) == 0 &&
        is_file(buf))
      return buf;
    path += l;
    if (*path == ':') path++;
  }
  return NULL;
}

/* The scripts directory: --scripts, then bench/harness/datadir.h's rules; NULL
 * when no directory holds comm.gp. */
static const char *find_scripts(const rp_report *r, char *buf, size_t n) {
  return sb_data_dir(SB_DATA_SCRIPTS, r->scripts, buf, n) ? buf : NULL;
}

/* A gnuplot single-quoted string: '' stands for one quote. */
static void gp_quote(char *dst, size_t n, const char *s) {
  size_t k = 0;
  for (; *s && k + 3 < n; s++) {
    if (*s == '\'') dst[k++] = '\'';
    dst[k++] = *s;
  }
  dst[k] = '\0';
}

/* Runs gnuplot on scripts/SCRIPT.gp for one format, extra (NULL: none) appended to
 * its -e expression, which writes OUT/NAME.FMT; output to the log. */
static bool run_gnuplot(rp_report *r, const char *gp, const char *scripts, const char *script_name,
                        const char *name, const char *extra, const char *fmt) {
  char script[RP_PATH], datadir[RP_PATH], qdata[2 * RP_PATH], qout[2 * RP_PATH];
  char expr[5 * RP_PATH];
  snprintf(script, sizeof script, "%s/%s.gp", scripts, script_name);
  snprintf(datadir, sizeof datadir, "%s/data", r->out);
  gp_quote(qdata, sizeof qdata, datadir);
  gp_quote(qout, sizeof qout, r->out);
  snprintf(expr, sizeof expr, "datadir='%s'; outdir='%s'; fmt='%s'%s%s", qdata, qout, fmt,
           extra ? "; " : "", extra ? extra : "");
  if (r->log) {
    fprintf(r->log, "$ %s -e \"%s\" %s\n", gp, expr, script);
    fflush(r->log);
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (r->log) {
    int fd = fileno(r->log);
    posix_spawn_file_actions_adddup2(&fa, fd, STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&fa, fd, STDERR_FILENO);
  }
  char *argv[] = {(char *)gp, (char *)"-e", expr, script, NULL};
  pid_t pid;
  int rc = posix_spawn(&pid, gp, &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    fprintf(stderr, "shardbench report: cannot run %s: %s\n", gp, strerror(rc));
    return false;
  }
  int wst = 0;
  while (waitpid(pid, &wst, 0) < 0)
    if (errno != EINTR) return false;
  if (!WIFEXITED(wst) || WEXITSTATUS(wst) != 0) {
    fprintf(stderr, "shardbench report: gnuplot failed on %s (%s); see %s/gnuplot.log\n", script,
            fmt, r->out);
    return false;
  }
  char out[RP_PATH];
  struct stat sbuf;
  snprintf(out, sizeof out, "%s/%s.%s", r->out, name, fmt);
  if (stat(out, &sbuf) != 0 || sbuf.st_size == 0) {
    fprintf(stderr, "shardbench report: gnuplot wrote no %s\n", out);
    return false;
  }
  return true;
}

/* ---- the index page ---- */

typedef struct rp_chart {
  const char *name, *title, *how;
  const char *script;   /* scripts/SCRIPT.gp (NULL: NAME) */
  const char *data;     /* its data file's name without .dat (NULL: NAME) */
  char extra[32];       /* appended to gnuplot's -e ("rid=12"), "" none */
  char name_buf[48], title_buf[RP_LABEL + 64];
  size_t rows;      /* configs charted */
  size_t baselines; /* baseline rows next to them */
  size_t series;    /* lines drawn, for a chart of series (cp_memory) */
  bool drawn;
  const char *why_not; /* when not drawn */
  const char *why_empty; /* when no rows: the chart's own reason (NULL: the generic one) */
} rp_chart;

static void write_runs(rp_report *r, FILE *f) {
  sqlite3_stmt *st = NULL;
  /* a version 1 DB has no runs.peak_tflops / peak_source: NULL for them */
  const char *q = r->st.version >= 2
                      ? "SELECT id, started, coalesce(finished, '(not finished)'), host, version, "
                        "backend, world, argv, versions, coalesce(printf('%.4g TFLOP/s', "
                        "peak_tflops) || ' (' || coalesce(peak_source, '?') || ')', "
                        "'(not recorded)') FROM runs WHERE ?1 = 0 OR id = ?1 ORDER BY id"
                      : "SELECT id, started, coalesce(finished, '(not finished)'), host, version, "
                        "backend, world, argv, versions, '(not recorded: schema version 1)' "
                        "FROM runs WHERE ?1 = 0 OR id = ?1 ORDER BY id";
  if (sqlite3_prepare_v2(r->db, q, -1, &st, NULL) != SQLITE_OK) return;
  sqlite3_bind_int64(st, 1, r->run);
  fputs("<table>\n<tr><th>run</th><th>started</th><th>finished</th><th>host</th>"
        "<th>version</th><th>backend</th><th>world</th><th>argv</th><th>versions</th>"
        "<th>MFU peak</th></tr>\n", f);
  while (sqlite3_step(st) == SQLITE_ROW) {
    fputs("<tr>", f);
    for (int c = 0; c < 10; c++) { /* the ten columns selected above */
      fputs("<td>", f);
      html_str(f, col_text(st, c));
      fputs("</td>", f);
    }
    fputs("</tr>\n", f);
  }
  fputs("</table>\n", f);
  sqlite3_finalize(st);
}

/* The ranked layouts of the newest plan run, from data/capacity_ranked.dat's query. */
enum { RP_CAP_TABLE = 50 }; /* rows in each index table; the .dat holds them all */

static void write_cap_tables(rp_report *r, FILE *f, const rp_cap *c) {
  sqlite3_stmt *st = NULL;
  if (!c->newest || sqlite3_prepare_v2(r->db, rp_cap_ranked_query, -1, &st, NULL) != SQLITE_OK)
    return;
  fprintf(f, "<h2 id=\"capacity_ranked\">Ranked layouts of plan run %lld (%d GPUs)</h2>\n<p>",
          c->newest, c->gpus);
  html_str(f, c->desc);
  fprintf(f, ". %zu layout%s fit%s, %zu do%s not; all are in <a href=\"data/capacity_ranked.dat\">"
          "data/capacity_ranked.dat</a>.</p>\n", c->nrank, c->nrank == 1 ? "" : "s",
          c->nrank == 1 ? "s" : "", c->nover, c->nover == 1 ? "es" : "");
  for (int pass = 0; pass < 2; pass++) {
    size_t shown = 0, total = pass ? c->nover : c->nrank;
    if (!total) continue;
    if (pass) fputs("<h3>Layouts that do not fit</h3>\n", f);
    fputs("<table>\n<tr>", f);
    if (!pass) fputs("<th>rank</th>", f);
    fputs("<th>mesh</th><th>plan</th><th>ac</th><th>local batch / microbatches</th>"
          "<th>peak GB</th>", f);
    if (pass) fputs("<th>over GB</th>", f);
    fputs("<th>step s</th><th>tokens/s/GPU</th><th>MFU</th>", f);
    const bool train = !pass && !isnan(c->tokens); /* --tokens: the training time of each */
    if (train) fputs("<th>train days</th><th>GPU hours</th>", f);
    fputs("<th>verdict</th></tr>\n", f);
    sqlite3_reset(st);
    sqlite3_bind_int64(st, 1, c->newest);
    while (sqlite3_step(st) == SQLITE_ROW && shown < RP_CAP_TABLE) {
      const bool ranked = sqlite3_column_type(st, 0) != SQLITE_NULL;
      const bool fits = sqlite3_column_int(st, 12) != 0;
      if (pass ? fits : !ranked) continue;
      char mesh[RP_MESH];
      cap_pred_mesh(st, 2, mesh, sizeof mesh);
      fputs("<tr>", f);
      if (!pass) fprintf(f, "<td>%lld</td>", sqlite3_column_int64(st, 0));
      fprintf(f, "<td>%s</td><td>", mesh);
      html_str(f, col_text(st, 1));
      fputs("</td><td>", f);
      html_str(f, col_text(st, 7));
      fprintf(f, "</td><td>%d / %d</td><td>%.2f</td>", sqlite3_column_int(st, 8),
              sqlite3_column_int(st, 10), sqlite3_column_double(st, 13) / 1e9);
      if (pass) fprintf(f, "<td>%.2f</td>", sqlite3_column_double(st, 14) / 1e9);
      fprintf(f, "<td>%.4g</td><td>%.4g</td><td>%.1f%%</td>", sqlite3_column_double(st, 15),
              sqlite3_column_double(st, 16), 100.0 * sqlite3_column_double(st, 17));
      if (train)
        fprintf(f, "<td>%.3g</td><td>%.4g</td>", col_real(st, 27) / 86400.0, /* s per day */
                col_real(st, 28));
      fputs("<td>", f);
      html_str(f, col_text(st, 18));
      fputs("</td></tr>\n", f);
      shown++;
    }
    fputs("</table>\n", f);
    if (total > shown)
      fprintf(f, "<p>%zu more in <a href=\"data/capacity_ranked.dat\">data/capacity_ranked.dat"
              "</a>.</p>\n", total - shown);
  }
  sqlite3_finalize(st);
}

static void write_index(rp_report *r, rp_chart *charts, size_t ncharts, const char *note,
                        const rp_cap *cap) {
  FILE *f = open_out(r, "index.html");
  if (!f) return;
  fputs("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">\n<title>shardbench report</title>\n"
        "<style>body{font-family:sans-serif;max-width:70em;margin:1em auto;padding:0 1em}"
        "table{border-collapse:collapse}td,th{border:1px solid #bbb;padding:2px 6px;"
        "text-align:left;vertical-align:top}img{max-width:100%;border:1px solid #ddd}"
        "</style>\n</head><body>\n<h1>shardbench report</h1>\n", f);
  fputs("<p>From <code>", f);
  html_str(f, r->db_path);
  if (r->run > 0)
    fprintf(f, "</code>, run %lld", r->run);
  else if (r->run == 0)
    fputs("</code>, all runs (the newest result of each config)", f);
  else
    fputs("</code>, which holds no runs", f);
  fprintf(f, ". Results: %d ok, %d mismatch, %d failed, %d skipped.</p>\n", r->status_count[0],
          r->status_count[1], r->status_count[2], r->status_count[3]);
  if (r->run >= 0) write_runs(r, f);
  /* shape-only runs (--device meta) live in shape_runs, apart from the measured
   * results: counted here, never charted as measured */
  sqlite3_stmt *sq = NULL;
  if (r->st.version >= 6 &&
      sqlite3_prepare_v2(r->st.db, "SELECT count(*) FROM shape_runs WHERE status = 'shape-only'",
                         -1, &sq, NULL) == SQLITE_OK &&
      sqlite3_step(sq) == SQLITE_ROW && sqlite3_column_int64(sq, 0) > 0)
    fprintf(f, "<p>Not charted: %lld shape-only runs (<code>--device meta</code>, table "
               "<code>shape_runs</code>): shapes and ledgers, not measurements.</p>\n",
            (long long)sqlite3_column_int64(sq, 0));
  sqlite3_finalize(sq);
  if (note) {
    fputs("<p><b>Note:</b> ", f);
    html_str(f, note);
    fputs("</p>\n", f);
  }
  if (r->nrows == 0 && cap->nmem) {
    fputs("<p>This DB holds no measured results", f);
    if (r->run > 0) fprintf(f, " for run %lld", r->run);
    fputs(", only the predictions of <code>shardbench plan</code>: the capacity charts "
          "below.</p>\n", f);
  } else if (r->nrows == 0) {
    fputs("<p><b>This DB holds no results", f);
    if (r->run > 0) fprintf(f, " for run %lld", r->run);
    fputs(", so there is nothing to chart.</b> Run <code>shardbench sweep</code> or "
          "<code>shardbench run</code> with this <code>--db</code> first.</p>\n", f);
    if (cap->why[0]) {
      fputs("<p>Capacity charts: <i>Not drawn: ", f);
      html_str(f, cap->why);
      fputs(".</i></p>\n", f);
    }
  }
  for (size_t i = 0; i < ncharts && (r->nrows || cap->nmem); i++) {
    const rp_chart *c = &charts[i];
    if (!r->nrows && strncmp(c->name, "capacity_", 9)) continue; /* only the capacity charts */
    fprintf(f, "<h2 id=\"%s\">%s</h2>\n", c->name, c->title);
    if (c->drawn) {
      const char *img = r->png ? "png" : "svg";
      fprintf(f, "<p><img src=\"%s.%s\" alt=\"%s\"></p>\n<p>", c->name, img, c->title);
      if (r->png) fprintf(f, "<a href=\"%s.png\">PNG</a> ", c->name);
      if (r->svg) fprintf(f, "<a href=\"%s.svg\">SVG</a> ", c->name);
      const char *dat = c->data ? c->data : c->name;
      fprintf(f, "data: <a href=\"data/%s.dat\">data/%s.dat</a>", dat, dat);
      const char *what = strncmp(c->name, "capacity_", 9) ? "config" : "layout";
      fprintf(f, " (%zu %s%s", c->rows, what, c->rows == 1 ? "" : "s");
      if (c->series) fprintf(f, " in %zu series", c->series);
      if (c->baselines) fprintf(f, ", %zu baseline row%s", c->baselines, c->baselines == 1 ? "" : "s");
      fputs(")</p>\n", f);
    } else {
      fprintf(f, "<p><i>Not drawn: %s.</i> Data: <a href=\"data/%s.dat\">data/%s.dat</a></p>\n",
              c->why_not, c->name, c->name);
    }
    fprintf(f, "<p>%s</p>\n", c->how);
    if (!strcmp(c->name, "throughput") && r->mfu_note[0]) {
      fputs("<p>", f);
      html_str(f, r->mfu_note);
      fputs("</p>\n", f);
    }
    fputs("<p>Redraw by hand: <code>gnuplot -e \"datadir='", f);
    html_str(f, r->out);
    fputs("/data'; outdir='", f);
    html_str(f, r->out);
    fprintf(f, "'; fmt='png'%s%s\" scripts/%s.gp</code></p>\n", c->extra[0] ? "; " : "",
            c->extra, c->script ? c->script : c->name);
  }
  write_cap_tables(r, f, cap);
  /* The configs that were not measured, or did not match the reference. */
  size_t nbad = 0;
  for (size_t i = 0; i < r->nrows; i++) nbad += strcmp(r->rows[i].status, "ok") != 0;
  if (r->nrows) {
    fputs("<h2 id=\"problems\">Skipped, failed and mismatched configs</h2>\n", f);
    if (!nbad) {
      fputs("<p>None: every config ran and matched the unsharded reference.</p>\n", f);
    } else {
      fputs("<table>\n<tr><th>status</th><th>config</th><th>reason</th></tr>\n", f);
      static const char *const order[3] = {"failed", "mismatch", "skipped"};
      for (int s = 0; s < 3; s++)
        for (size_t i = 0; i < r->nrows; i++) {
          const rp_row *w = &r->rows[i];
          if (strcmp(w->status, order[s])) continue;
          fprintf(f, "<tr><td>%s</td><td><code>", w->status);
          html_str(f, w->key);
          fputs("</code></td><td>", f);
          html_str(f, w->reason[0] ? w->reason : "(no reason recorded)");
          fputs("</td></tr>\n", f);
        }
      fputs("</table>\n", f);
    }
  }
  fputs("<p>Written by <code>shardbench report</code> (" PACKAGE_STRING "). The data files "
        "in <code>data/</code> begin with a comment naming their columns and the query.</p>\n"
        "</body></html>\n", f);
  close_out(r, f, "index.html");
}

/* ---- flags ---- */

static int parse_format(rp_report *r, const char *s) {
  r->png = r->svg = false;
  const char *p = s;
  for (;;) {
    size_t l = strcspn(p, ",");
    if (l == 3 && !strncmp(p, "png", 3)) r->png = true;
    else if (l == 3 && !strncmp(p, "svg", 3)) r->svg = true;
    else return sb_usage_error(CMD, "--format", "expected png, svg or png,svg, got '%s'", s);
    if (!p[l]) break;
    p += l + 1;
  }
  return SB_EXIT_OK;
}

static int parse_flags(rp_report *r, int argc, char **argv) {
  static const struct option lopts[] = {
      {"db", required_argument, NULL, 'd'},     {"out", required_argument, NULL, 'o'},
      {"scripts", required_argument, NULL, 's'}, {"format", required_argument, NULL, 'f'},
      {"run", required_argument, NULL, 'r'},    {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  int ch = sb_getopt_repeats(CMD, argc, argv, ":h", lopts, NULL);
  if (ch) return ch;
  while ((ch = getopt_long(argc, argv, ":h", lopts, NULL)) != -1) {
    switch (ch) {
      case 'd': r->db_path = optarg; break;
      case 'o': r->out = optarg; break;
      case 's': r->scripts = optarg; break;
      case 'f':
        if (parse_format(r, optarg) != SB_EXIT_OK) return SB_EXIT_USAGE;
        break;
      case 'r':
        if (!strcmp(optarg, "latest")) {
          r->run_latest = true;
        } else if (!strcmp(optarg, "all")) {
          r->run_latest = false;
          r->run = 0;
        } else {
          long v;
          char err[SB_ERR_LEN];
          if (sb_parse_long(optarg, 1, LONG_MAX, &v, err, sizeof err) != DT_OK)
            return sb_usage_error(CMD, "--run", "expected a run id, latest or all, got '%s'",
                                  optarg);
          r->run_latest = false;
          r->run = v;
        }
        break;
      case 'h': fputs(sb_report_usage, stdout); return -1;
      default: return sb_getopt_error(CMD, ch, argv, lopts);
    }
  }
  if (optind < argc) return sb_usage_error(CMD, NULL, "unexpected argument '%s'", argv[optind]);
  if (!*r->out) return sb_usage_error(CMD, "--out", "empty path");
  if (strlen(r->out) > RP_PATH / 4) /* room for OUT/data/NAME.dat in every buffer */
    return sb_usage_error(CMD, "--out", "path longer than %d characters", RP_PATH / 4);
  if (r->scripts) {
    char probe[RP_PATH];
    if (!path_join(probe, sizeof probe, r->scripts, "comm.gp") || !is_file(probe))
      return sb_usage_error(CMD, "--scripts", "no comm.gp in '%s'", r->scripts);
  }
  return SB_EXIT_OK;
}

/* ---- the subcommand ---- */

static const char rp_how_comm[] =
    "One panel per plan, all on one scale so that panels compare; in each, one bar per "
    "config (labelled with its mesh), the least communication first, the least and the most "
    "labelled with their totals (every bar is labelled where the panel has room): the bytes "
    "one rank (rank 0) puts on the wire per training step under the ring model, stacked by phase and "
    "collective (forward:all_gather, backward:reduce_scatter, ...). The black cross is the "
    "frameworks' baseline for the same config: the sum of the published formulas its plan's "
    "settings select (Megatron-LM TP, arXiv:1909.08053 sec. 3, or TP + sequence parallel, "
    "arXiv:2205.05198 sec. 4.2.2, for the tp dim; DDP, FSDP or HSDP for the dp dims), labelled "
    "with their names. The formulas count only what the papers count, so a bar above its cross "
    "moves more than the frameworks (e.g. the loss-parallel cross-entropy's scalars, the "
    "sequence-parallel norm weights' gradients, the output layer's input gradient) and a bar "
    "below it moves less (e.g. a gathered block input kept for backward instead of gathered "
    "again).";
static const char rp_how_throughput[] =
    "One panel per plan, all on one scale; in each, one bar per config (labelled with its "
    "mesh), the fastest first, the fastest and the slowest labelled. Bars: tokens per second "
    "over all ranks (the median timed step, left axis); diamonds: MFU, achieved model "
    "FLOP/s as a percentage of the peak recorded with the result (right axis; its label and "
    "the line below name the peak). On the threads backend "
    "these compare plans with each other, not with GPU clusters. Red bars are mismatched "
    "results: fast but wrong.";
static const char rp_how_memory[] =
    "One panel per plan, all on one scale; in each, one bar per config (labelled with its "
    "mesh), the least peak first, the least and the most labelled: rank 0's memory in the "
    "last timed step, stacked from the bottom: weights (blue; "
    "the rank's shard under FSDP), their gradients after the data-parallel reduction "
    "(orange), AdamW's two states (green), and the rest of that step's peak: activations, "
    "FSDP's gathered copies and communication buffers (grey). The dark red dash is the "
    "measured peak of the busiest rank over the whole run, so it sits on or above the "
    "stack; a config recorded without the split (a DB before schema version 3) shows an "
    "empty outline up to its peak. Crosses are the analytic memory_bytes_per_rank "
    "baselines where the DB has them. Sharding should lower the blue, orange and green "
    "parts as the sharded mesh dims grow; a plan whose parts stay flat replicates what it "
    "claims to shard.";
static const char rp_how_error[] =
    "Largest relative error of the sharded result against the unsharded reference, one panel "
    "per plan, one point per config on a log scale, the smallest first, the largest "
    "labelled; the short red line over each point is that config's "
    "tolerance. Green points under their line passed (status ok); red points above it are "
    "mismatches. Exact results (error 0) are drawn at 1e-17, under the f64 epsilon.";
static const char rp_how_cp_memory[] =
    "One colour per group of measured configs that differ only in the context-parallel "
    "degree cp: same plan, model, workload, dtype, global batch, global sequence length, "
    "steps and backend, and the same other mesh dims, which the label names (plan/"
    "pp.dpr.dps.tp/b batch s seq). x is cp on a log2 axis; the solid line is the measured "
    "peak memory of the busiest rank over the whole run, the dashed line of the same colour "
    "rank 0's activations and buffers in the last timed step (mem_activations_bytes; no "
    "dashed point where it was not recorded), both in MiB. With the global sequence split "
    "over the cp ranks, the activations per rank should fall about as 1/cp; the weights, "
    "gradients and optimizer state fall with cp only where the plan shards them over cp "
    "(TorchTitan folds cp into FSDP's mesh, dp_shard x cp: torchtitan/distributed/"
    "parallel_dims.py), so elsewhere the peak levels off at them. Red rings mark "
    "mismatched results. A group measured at a single cp value is not drawn.";

static const char rp_how_pp_bubble[] =
    "Pipelined configs only (pp of 2 or more), by plan, then by measured bubble (the least "
    "first; where 1600 px leave too little room, only every few configs are labelled). Top: "
    "per config, the measured bubble "
    "(filled bar): the share of the step a rank spends outside its forwards and "
    "backwards (sends, waits for receives, idling), 1 - its F and B seconds / the step's "
    "span from the first action's start to the last action's end, the mean over ranks and "
    "timed steps (results/schema.sql, pp_stats); next to it the analytic bubble (hollow "
    "bar), (p - 1) / (m + p - 1) for GPipe and 1F1B and (p - 1) / (v m + p - 1) for "
    "interleaved 1F1B, the idle share of the step for equal stage times and free "
    "communication (Narayanan et al. 2021, arXiv:2104.04473 sec. 2.2, state it relative to "
    "the ideal time as (p - 1) / m). A measured bar above its analytic one means unequal "
    "stages (the first holds the embedding, the last the norm, output layer and loss), "
    "communication or scheduling noise. Bottom: per stage (pp rank, left to right within "
    "a config), its peak host memory during the pipelined step above the step's start "
    "(activations held, plus its weights' gradients and the transfers' buffers), labelled "
    "with the most microbatches it held in flight: 1F1B keeps at most p - s on stage s, "
    "GPipe all m.";
static const char rp_how_pp_gantt[] =
    "The last timed step of this pipelined result: one row per rank (its pp rank in "
    "brackets), one box per action from its start to its end, in ms from the step's zero "
    "(every rank leaves a barrier just before the step). Tall boxes are computations, "
    "forward F (blue) and backward B (orange), labelled with the microbatch (stage:"
    "microbatch when a rank holds several stages); thin boxes are communication: a send "
    "(grey) and the wait for a receive's data (red, just before the F or B that needs it). "
    "White space is idle time; the title gives the measured and analytic bubble of the "
    "result (the mean over its timed steps).";

static const char rp_how_capacity_memory[] =
    "Predicted peak memory per GPU (GB = 1e9 bytes: the worst role's peak plus the "
    "allocator's overhead and reserve) against the GPU count on a log2 axis, one line per "
    "plan: at each GPU count the plan's best ranked layout that fits (filled point), or "
    "where none fits its smallest-peak layout (hollow point, above the line). The dashed "
    "red line is the hardware's HBM capacity (hbm_gb or hbm_gib of its hardware file, "
    "in GB): where a "
    "plan's line crosses it, that plan stops fitting. From the plan_runs and predictions "
    "tables that shardbench plan writes.";
static const char rp_how_capacity_throughput[] =
    "Predicted tokens per second per GPU against the GPU count (log2 axis), one line per "
    "plan: at each GPU count the plan's best ranked layout that fits (rank 1 is the "
    "fastest); no point where none of its layouts fits. A falling line is the cost of "
    "scaling out: exposed communication and the pipeline bubble grow with the GPU count.";
static const char rp_how_capacity_breakdown[] =
    "The newest plan run's top ranked layouts (rank 1, the fastest that fits, on the "
    "left), one stacked bar each, labelled mesh/plan: the predicted step time split into "
    "compute, recompute (activation checkpointing), the pipeline bubble, and the "
    "communication left exposed (not overlapped) per mesh dim. The black dash is the "
    "predicted step time; where it is longer than the parts (the time model's step is the "
    "slowest role's, with the optimizer once per step), an empty box shows the rest.";

static void free_rows(rp_report *r) {
  for (size_t i = 0; i < r->nrows; i++) {
    rp_row *w = &r->rows[i];
    free(w->reason);
    free(w->key);
    free(w->workload);
    free(w->model);
    free(w->plan);
    free(w->dtype);
    free(w->backend);
    free(w->peak_source);
  }
  free(r->rows);
}

int sb_cmd_report(int argc, char **argv) {
  rp_report r = {.db_path = "results/shardbench.db", .out = "report", .png = true, .svg = true,
                 .run_latest = true};
  int rc = parse_flags(&r, argc, argv);
  if (rc < 0) return SB_EXIT_OK; /* --help */
  if (rc != SB_EXIT_OK) return rc;

  rc = open_db(&r);
  if (rc == SB_EXIT_OK) rc = resolve_run(&r);
  /* One read transaction: a sweep appending meanwhile cannot tear the report. */
  if (rc == SB_EXIT_OK) sqlite3_exec(r.db, "BEGIN", NULL, NULL, NULL);
  if (rc == SB_EXIT_OK) rc = read_rows(&r);
  if (rc != SB_EXIT_OK) {
    sb_store_close(&r.st);
    free_rows(&r);
    return rc;
  }

  char data[RP_PATH];
  snprintf(data, sizeof data, "%s/data", r.out);
  if (mkdir_p(data) != 0) {
    int e = errno;
    sb_store_close(&r.st);
    free_rows(&r);
    return sb_usage_error(CMD, "--out", "cannot create '%s': %s", data, strerror(e));
  }

  long long *pp_rids = NULL;
  const rp_row **pp_rows = NULL;
  const char *pp_why = NULL;
  const size_t npp = write_pp(&r, &pp_rids, &pp_rows, &pp_why);
  /* the fixed charts, then a Gantt chart per pipelined result */
  enum { NFIXED = 9 };
  rp_chart *charts = calloc(NFIXED + npp, sizeof *charts);
  if (!charts) exit(SB_EXIT_FAIL);
  const rp_chart fixed[NFIXED] = {
      {.name = "comm", .title = "Communication per step (wire bytes per rank)", .how = rp_how_comm},
      {.name = "throughput", .title = "Throughput (tokens/s) and MFU per config, by plan",
       .how = rp_how_throughput},
      {.name = "memory", .title = "Memory per rank by plan: rank 0's split and the peak",
       .how = rp_how_memory},
      {.name = "error", .title = "Numerical error vs the unsharded reference",
       .how = rp_how_error},
      {.name = "cp_memory",
       .title = "Peak memory per rank vs context-parallel degree (fixed global sequence)",
       .how = rp_how_cp_memory},
      {.name = "pp_bubble",
       .title = "Pipeline bubble: measured vs analytic, and activation memory per stage",
       .how = rp_how_pp_bubble},
      {.name = "capacity_memory",
       .title = "Capacity: predicted peak memory per GPU against the GPU count, per plan",
       .how = rp_how_capacity_memory},
      {.name = "capacity_throughput",
       .title = "Capacity: predicted tokens/s per GPU against the GPU count, per plan",
       .how = rp_how_capacity_throughput},
      {.name = "capacity_breakdown",
       .title = "Capacity: step-time breakdown of the top ranked layouts",
       .how = rp_how_capacity_breakdown},
  };
  memcpy(charts, fixed, sizeof fixed);
  const size_t ncharts = NFIXED + npp;
  charts[0].rows = write_comm(&r, &charts[0].baselines);
  charts[1].rows = write_throughput(&r);
  charts[2].rows = write_memory(&r, &charts[2].baselines);
  charts[3].rows = write_error(&r);
  charts[4].rows = write_cp_memory(&r, &charts[4].series, &charts[4].why_empty);
  charts[5].rows = npp;
  charts[5].why_empty = pp_why;
  rp_cap cap;
  write_capacity(&r, &cap);
  charts[6].rows = cap.nmem;
  charts[6].why_empty = cap.why;
  charts[7].rows = cap.nmem ? cap.nthr : 0;
  charts[7].why_empty = cap.nmem ? "no layout fits at any GPU count" : cap.why;
  charts[8].rows = cap.nmem ? cap.nbrk : 0;
  charts[8].why_empty = cap.nmem ? "no layout of the newest plan run fits" : cap.why;
  for (size_t i = 0; i < npp; i++) {
    rp_chart *c = &charts[NFIXED + i];
    snprintf(c->name_buf, sizeof c->name_buf, "pp_gantt_%lld", pp_rids[i]);
    snprintf(c->title_buf, sizeof c->title_buf, "Pipeline timeline of %s (result %lld)",
             pp_rows[i]->label, pp_rids[i]);
    snprintf(c->extra, sizeof c->extra, "rid=%lld", pp_rids[i]);
    c->name = c->name_buf;
    c->title = c->title_buf;
    c->script = "pp_gantt";
    c->how = rp_how_pp_gantt;
    c->rows = 1;
  }
  free(pp_rids);
  free(pp_rows);
  sqlite3_exec(r.db, "COMMIT", NULL, NULL, NULL);

  char gpbuf[RP_PATH], scbuf[RP_PATH];
  const char *gp = find_gnuplot(gpbuf, sizeof gpbuf);
  const char *scripts = find_scripts(&r, scbuf, sizeof scbuf);
  const char *note = NULL;
  bool gp_failed = false;
  if (!gp) note = "charts need gnuplot (not found on PATH or as $GNUPLOT); the data files are in data/";
  else if (!scripts)
    note = "charts need the scripts/*.gp files (give --scripts DIR or set SHARDBENCH_SCRIPTS)";
  bool any = false;
  for (size_t i = 0; i < ncharts; i++) {
    rp_chart *c = &charts[i];
    if (!c->rows) {
      c->why_not = c->why_empty ? c->why_empty : "no rows for this chart in the selected results";
      continue;
    }
    if (note) {
      c->why_not = !gp ? "gnuplot was not found" : "the gnuplot scripts were not found";
      continue;
    }
    if (!any) {
      r.log = open_out(&r, "gnuplot.log");
      any = true;
    }
    bool ok = true;
    const char *script = c->script ? c->script : c->name, *extra = c->extra[0] ? c->extra : NULL;
    if (r.png) ok &= run_gnuplot(&r, gp, scripts, script, c->name, extra, "png");
    if (r.svg) ok &= run_gnuplot(&r, gp, scripts, script, c->name, extra, "svg");
    c->drawn = ok;
    if (!ok) {
      c->why_not = "gnuplot failed (see gnuplot.log)";
      gp_failed = true;
    }
  }
  if (r.log) close_out(&r, r.log, "gnuplot.log");
  write_index(&r, charts, ncharts, note, &cap);
  sb_store_close(&r.st);

  if (note && (r.nrows || cap.nmem)) fprintf(stderr, "shardbench report: %s\n", note);
  size_t drawn = 0;
  for (size_t i = 0; i < ncharts; i++) drawn += charts[i].drawn;
  free(charts);
  printf("shardbench report: %zu result%s, %zu chart%s; see %s/index.html\n", r.nrows,
         r.nrows == 1 ? "" : "s", drawn, drawn == 1 ? "" : "s", r.out);
  free_rows(&r);
  if (r.write_failed || gp_failed) return SB_EXIT_FAIL;
  /* Missing gnuplot is not an error (the data is written); missing scripts is. */
  if (note && gp && (r.nrows || cap.nmem)) return SB_EXIT_FAIL;
  return SB_EXIT_OK;
}
