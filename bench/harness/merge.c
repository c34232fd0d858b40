/* bench/harness/merge.c: `shardbench merge` (result DBs of a split sweep into one) and
 * `shardbench status` (a DB's done, failed and remaining configs at a glance).
 *
 *   shardbench merge OUT.db IN.db...
 *   shardbench status --db F [--json]
 *
 * Both take only shardbench DBs of this program's schema version: every input
 * (and an existing OUT) is checked read-only first (bench/harness/store.c's
 * checks: not empty, not a directory, SQLite, ours) and refused, untouched, with
 * one line and exit 2, before anything is written.
 *
 * The merge rule, one result per config key: a verdict (ok, mismatch, skipped)
 * beats a failure (failed: a crash, a timeout, an error: no verdict), and between
 * two of the same kind the later `created` wins; on a tie the row already in OUT
 * (an earlier input) stays. So merging the same input twice changes nothing, and
 * a config rerun after a failure keeps its rerun. A kept result keeps its run
 * (copied into OUT's runs: host, argv, versions, peak), its comm rows, its pp_*
 * timeline rows, and its config's baselines rows; configs without any result (a
 * sweep's list not run yet) are copied too. Shape-only runs (shape_runs, by key,
 * with their shape_roles and shape_comm rows) follow the same rule, shape-only
 * counting as a verdict. Each input is merged in one transaction.
 *
 * It is not a general SQLite copier: the tables are the ones of results/schema.sql.
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "store.h"

const char sb_merge_usage[] =
    "usage: shardbench merge OUT.db IN.db...\n"
    "\n"
    "Merges result DBs (the --shard I/N parts of a sweep, or any runs) into OUT.db\n"
    "(created when absent). Configs are matched by key; each keeps one result: a\n"
    "verdict (ok, mismatch, skipped) beats failed, and between two of the same kind\n"
    "the later one wins (a tie keeps the row already in OUT). A kept result brings its\n"
    "run (provenance), its comm and pipeline timeline rows and its config's baselines.\n"
    "Shape-only runs (--device meta: shape_runs, shape_roles, shape_comm) merge by key\n"
    "alike.\n"
    "Every input and an existing OUT must be a shardbench DB of this schema version;\n"
    "anything else (another file, an empty file, a directory, another version) is\n"
    "refused untouched before anything is written.\n"
    "Exit: 0 merged, 1 an SQLite error, 2 bad input.\n";

const char sb_status_usage[] =
    "usage: shardbench status --db F [--json]\n"
    "\n"
    "What a results DB holds: configs done (ok, mismatch, failed, skipped), the\n"
    "failures and mismatches with their reasons, the configs still to run (a sweep\n"
    "enters its whole list before its first config), the mean wall time per config so\n"
    "far and the time left at that rate, and runs that never finished (killed, or\n"
    "still running). Each config counts its result by merge's rule.\n"
    "Exit: 0, 2 bad input (not a shardbench DB of this schema version).\n";

/* A result's standing under the merge rule: failed below any verdict. */
static int verdict_rank(const char *status) { return strcmp(status, "failed") != 0; }

/* Whether (status a, created a) beats (status b, created b). */
static bool beats(const char *sa, const char *ca, const char *sb, const char *cb) {
  int ra = verdict_rank(sa), rb = verdict_rank(sb);
  return ra != rb ? ra > rb : strcmp(ca, cb) > 0;
}

/* Opens path read-only to check it: a shardbench DB of exactly SB_SCHEMA_VERSION.
 * 0 or SB_EXIT_USAGE (printed). */
static int check_input(const char *cmd, const char *path) {
  sb_store st;
  int rc = sb_store_open_read(&st, path, cmd);
  if (rc) return rc;
  int ver = st.version;
  sb_store_close(&st);
  if (ver != SB_SCHEMA_VERSION)
    return sb_usage_error(cmd, NULL, "'%s': schema version %d, this shardbench merges only "
                          "version %d (a run or sweep on it upgrades it)", path, ver,
                          SB_SCHEMA_VERSION);
  return 0;
}

/* ---- merge ------------------------------------------------------------------------ */

#define SQLOK(expr, what)                                                                  \
  do {                                                                                     \
    int rc_ = (expr);                                                                      \
    if (rc_ != SQLITE_OK && rc_ != SQLITE_ROW && rc_ != SQLITE_DONE) {                     \
      fprintf(stderr, "shardbench merge: '%s': %s: %s\n", out, (what), sqlite3_errmsg(db)); \
      goto fail;                                                                           \
    }                                                                                      \
  } while (0)

/* The columns of table t joined by ", " without the ones in skip (NULL-ended). */
static int columns(sqlite3 *db, const char *t, const char *const *skip, char *buf, size_t n) {
  char sql[96];
  snprintf(sql, sizeof sql, "PRAGMA main.table_info(%s)", t);
  sqlite3_stmt *q = NULL;
  if (sqlite3_prepare_v2(db, sql, -1, &q, NULL) != SQLITE_OK) return -1;
  buf[0] = '\0';
  while (sqlite3_step(q) == SQLITE_ROW) {
    const char *c = (const char *)sqlite3_column_text(q, 1);
    bool skipped = false;
    for (const char *const *s = skip; *s; s++) skipped |= !strcmp(*s, c);
    if (skipped) continue;
    if (buf[0]) strncat(buf, ", ", n - strlen(buf) - 1);
    strncat(buf, c, n - strlen(buf) - 1);
  }
  sqlite3_finalize(q);
  return buf[0] ? 0 : -1;
}

/* One statement with up to three int64 parameters, stepped to its end; the new
 * rowid in *id when id. SQLite code. */
static int exec3(sqlite3 *db, const char *sql, int64_t a, int64_t b, int64_t c, int64_t *id) {
  sqlite3_stmt *q = NULL;
  int rc = sqlite3_prepare_v2(db, sql, -1, &q, NULL);
  if (rc != SQLITE_OK) return rc;
  int np = sqlite3_bind_parameter_count(q);
  if (np >= 1) sqlite3_bind_int64(q, 1, a);
  if (np >= 2) sqlite3_bind_int64(q, 2, b);
  if (np >= 3) sqlite3_bind_int64(q, 3, c);
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
  }
  sqlite3_finalize(q);
  if (id) *id = sqlite3_last_insert_rowid(db);
  return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

typedef struct run_map {
  int n, cap;
  int64_t (*v)[2]; /* src id, OUT id */
} run_map;

/* OUT's id of src's runs row `run`, copied into OUT on first use; 0 on an error. */
static int64_t map_run(sqlite3 *db, run_map *rm, const char *c_run, int64_t run) {
  for (int i = 0; i < rm->n; i++)
    if (rm->v[i][0] == run) return rm->v[i][1];
  char sql[4096];
  int64_t mrun = 0;
  snprintf(sql, sizeof sql, "INSERT INTO main.runs(%s) SELECT %s FROM src.runs WHERE id = ?",
           c_run, c_run);
  if (exec3(db, sql, run, 0, 0, &mrun) != SQLITE_OK) return 0;
  if (rm->n == rm->cap) {
    void *g = realloc(rm->v, sizeof *rm->v * (size_t)(rm->cap ? 2 * rm->cap : 16));
    if (!g) return 0;
    rm->v = g;
    rm->cap = rm->cap ? 2 * rm->cap : 16;
  }
  rm->v[rm->n][0] = run;
  rm->v[rm->n++][1] = mrun;
  return mrun;
}

/* The shape-only runs of src (shape_runs with their shape_roles and shape_comm):
 * one row per key by the results' rule (shape-only or skipped beats failed, then
 * the later created; a tie keeps OUT's), its run copied as a result's is. */
static int merge_shapes(sqlite3 *db, const char *out, run_map *rm, const char *c_run) {
  static const char *const skip_run[] = {"id", "run_id", NULL};
  static const char *const skip_sid[] = {"shape_run_id", NULL};
  char c_sr[2048], c_role[1024], c_sc[512], sql[8192];
  sqlite3_stmt *q = NULL, *ex = NULL;
  if (columns(db, "shape_runs", skip_run, c_sr, sizeof c_sr) ||
      columns(db, "shape_roles", skip_sid, c_role, sizeof c_role) ||
      columns(db, "shape_comm", skip_sid, c_sc, sizeof c_sc)) {
    fprintf(stderr, "shardbench merge: '%s': cannot read the schema\n", out);
    return -1;
  }
  SQLOK(sqlite3_prepare_v2(db, "SELECT id, run_id, status, created, key FROM src.shape_runs "
                           "ORDER BY id", -1, &q, NULL), "reading shape_runs");
  SQLOK(sqlite3_prepare_v2(db, "SELECT status, created FROM main.shape_runs WHERE key = ?", -1,
                           &ex, NULL), "prepare");
  int rc;
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    const int64_t sid = sqlite3_column_int64(q, 0), run = sqlite3_column_int64(q, 1);
    char status[16], created[40];
    snprintf(status, sizeof status, "%s", (const char *)sqlite3_column_text(q, 2));
    snprintf(created, sizeof created, "%s", (const char *)sqlite3_column_text(q, 3));
    bool wins = true;
    sqlite3_reset(ex);
    sqlite3_bind_text(ex, 1, (const char *)sqlite3_column_text(q, 4), -1, SQLITE_TRANSIENT);
    while (wins && sqlite3_step(ex) == SQLITE_ROW)
      wins = beats(status, created, (const char *)sqlite3_column_text(ex, 0),
                   (const char *)sqlite3_column_text(ex, 1));
    sqlite3_reset(ex);
    if (!wins) continue;
    /* shape_roles and shape_comm follow (ON DELETE CASCADE) */
    SQLOK(exec3(db, "DELETE FROM main.shape_runs WHERE key = (SELECT key FROM src.shape_runs "
                "WHERE id = ?)", sid, 0, 0, NULL), "delete");
    const int64_t mrun = map_run(db, rm, c_run, run);
    if (!mrun) SQLOK(SQLITE_ERROR, "runs");
    int64_t msid;
    snprintf(sql, sizeof sql, "INSERT INTO main.shape_runs(run_id, %s) SELECT ?, %s FROM "
             "src.shape_runs WHERE id = ?", c_sr, c_sr);
    SQLOK(exec3(db, sql, mrun, sid, 0, &msid), "shape_runs");
    static const char *const tabs[] = {"shape_roles", "shape_comm"};
    const char *cols[] = {c_role, c_sc};
    for (int t = 0; t < 2; t++) {
      snprintf(sql, sizeof sql, "INSERT INTO main.%s(shape_run_id, %s) SELECT ?, %s FROM src.%s "
               "WHERE shape_run_id = ? ORDER BY rowid", tabs[t], cols[t], cols[t], tabs[t]);
      SQLOK(exec3(db, sql, msid, sid, 0, NULL), tabs[t]);
    }
  }
  SQLOK(rc, "reading shape_runs");
  sqlite3_finalize(q);
  sqlite3_finalize(ex);
  return 0;
fail:
  sqlite3_finalize(q);
  sqlite3_finalize(ex);
  return -1;
}

/* The attached input `src` into main, in the caller's transaction. */
static int merge_one(sqlite3 *db, const char *out) {
  static const char *const skip_id[] = {"id", NULL};
  static const char *const skip_res[] = {"id", "run_id", "config_id", NULL};
  static const char *const skip_rid[] = {"id", "result_id", NULL};
  static const char *const skip_cfg[] = {"id", "config_id", NULL};
  char c_cfg[1024], c_run[1024], c_res[2048], c_comm[512], c_ev[512], c_stat[512], c_stage[512],
      c_base[512], sql[8192];
  sqlite3_stmt *q = NULL, *ex = NULL;
  run_map rm = {0, 0, NULL};
  if (columns(db, "configs", skip_id, c_cfg, sizeof c_cfg) ||
      columns(db, "runs", skip_id, c_run, sizeof c_run) ||
      columns(db, "results", skip_res, c_res, sizeof c_res) ||
      columns(db, "comm", skip_rid, c_comm, sizeof c_comm) ||
      columns(db, "pp_events", skip_rid, c_ev, sizeof c_ev) ||
      columns(db, "pp_stats", skip_rid, c_stat, sizeof c_stat) ||
      columns(db, "pp_stages", skip_rid, c_stage, sizeof c_stage) ||
      columns(db, "baselines", skip_cfg, c_base, sizeof c_base)) {
    fprintf(stderr, "shardbench merge: '%s': cannot read the schema\n", out);
    return -1;
  }
  snprintf(sql, sizeof sql, "INSERT OR IGNORE INTO main.configs(%s) SELECT %s FROM src.configs "
           "ORDER BY id", c_cfg, c_cfg);
  SQLOK(exec3(db, sql, 0, 0, 0, NULL), "configs");
  SQLOK(exec3(db, "INSERT INTO main.published(framework, model, hardware, gpus, metric, value, "
              "source) SELECT framework, model, hardware, gpus, metric, value, source FROM "
              "src.published WHERE NOT EXISTS (SELECT 1 FROM main.published) ORDER BY id",
              0, 0, 0, NULL), "published");
  SQLOK(sqlite3_prepare_v2(db, "SELECT r.id, r.run_id, r.status, r.created, c.id, m.id FROM "
                           "src.results r JOIN src.configs c ON c.id = r.config_id JOIN "
                           "main.configs m ON m.key = c.key ORDER BY r.id", -1, &q, NULL),
        "reading results");
  SQLOK(sqlite3_prepare_v2(db, "SELECT status, created FROM main.results WHERE config_id = ?",
                           -1, &ex, NULL), "prepare");
  int rc;
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    const int64_t rid = sqlite3_column_int64(q, 0), run = sqlite3_column_int64(q, 1),
                  scfg = sqlite3_column_int64(q, 4), mcfg = sqlite3_column_int64(q, 5);
    char status[16], created[40];
    snprintf(status, sizeof status, "%s", (const char *)sqlite3_column_text(q, 2));
    snprintf(created, sizeof created, "%s", (const char *)sqlite3_column_text(q, 3));
    bool wins = true;
    sqlite3_reset(ex);
    sqlite3_bind_int64(ex, 1, mcfg);
    while (wins && sqlite3_step(ex) == SQLITE_ROW)
      wins = beats(status, created, (const char *)sqlite3_column_text(ex, 0),
                   (const char *)sqlite3_column_text(ex, 1));
    sqlite3_reset(ex);
    if (!wins) continue;
    /* comm and pp_* rows follow their results (ON DELETE CASCADE) */
    SQLOK(exec3(db, "DELETE FROM main.results WHERE config_id = ?", mcfg, 0, 0, NULL), "delete");
    const int64_t mrun = map_run(db, &rm, c_run, run);
    if (!mrun) SQLOK(SQLITE_ERROR, "runs");
    int64_t mres;
    snprintf(sql, sizeof sql, "INSERT INTO main.results(run_id, config_id, %s) SELECT ?, ?, %s "
             "FROM src.results WHERE id = ?", c_res, c_res);
    SQLOK(exec3(db, sql, mrun, mcfg, rid, &mres), "results");
    static const char *const tabs[] = {"comm", "pp_events", "pp_stats", "pp_stages"};
    const char *cols[] = {c_comm, c_ev, c_stat, c_stage};
    for (int t = 0; t < 4; t++) {
      snprintf(sql, sizeof sql, "INSERT INTO main.%s(result_id, %s) SELECT ?, %s FROM src.%s "
               "WHERE result_id = ? ORDER BY rowid", tabs[t], cols[t], cols[t], tabs[t]);
      SQLOK(exec3(db, sql, mres, rid, 0, NULL), tabs[t]);
    }
    SQLOK(exec3(db, "DELETE FROM main.baselines WHERE config_id = ?", mcfg, 0, 0, NULL),
          "baselines");
    snprintf(sql, sizeof sql, "INSERT INTO main.baselines(config_id, %s) SELECT ?, %s FROM "
             "src.baselines WHERE config_id = ? ORDER BY id", c_base, c_base);
    SQLOK(exec3(db, sql, mcfg, scfg, 0, NULL), "baselines");
  }
  SQLOK(rc, "reading results");
  sqlite3_finalize(q);
  sqlite3_finalize(ex);
  q = ex = NULL;
  if (merge_shapes(db, out, &rm, c_run)) goto fail;
  free(rm.v);
  return 0;
fail:
  sqlite3_finalize(q);
  sqlite3_finalize(ex);
  free(rm.v);
  return -1;
}

int sb_cmd_merge(int argc, char **argv) {
  static const char CMD[] = "merge";
  if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
    fputs(sb_merge_usage, stdout);
    return SB_EXIT_OK;
  }
  for (int i = 1; i < argc; i++)
    if (argv[i][0] == '-')
      return sb_usage_error(CMD, NULL, "unknown flag '%s' (see `shardbench help merge`)", argv[i]);
  if (argc < 3) return sb_usage_error(CMD, NULL, "expected OUT.db IN.db... (at least one input)");
  const char *out = argv[1];
  struct stat so;
  const bool out_there = stat(out, &so) == 0;
  for (int i = 2; i < argc; i++) {
    struct stat si;
    if (out_there && stat(argv[i], &si) == 0 && si.st_dev == so.st_dev && si.st_ino == so.st_ino)
      return sb_usage_error(CMD, NULL, "'%s' is the output too", argv[i]);
    int rc = check_input(CMD, argv[i]);
    if (rc) return rc;
  }
  if (out_there && S_ISREG(so.st_mode) && so.st_size > 0) {
    int rc = check_input(CMD, out);
    if (rc) return rc;
  }
  sb_store st;
  int rc = sb_store_open(&st, out, CMD); /* creates OUT's schema; the checks again */
  if (rc) return rc;
  sb_store_close(&st);
  sqlite3 *db = NULL;
  int inputs = 0;
  /* URI names in ATTACH: each input read-only (mode=ro, or immutable where a
   * WAL DB could not be read without creating files beside it). */
  if (sqlite3_open_v2(out, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_URI, NULL) != SQLITE_OK) {
    fprintf(stderr, "shardbench merge: '%s': cannot open: %s\n", out,
            db ? sqlite3_errmsg(db) : "out of memory");
    sqlite3_close(db);
    return SB_EXIT_FAIL;
  }
  sqlite3_busy_timeout(db, 30000); /* another writer's transaction: store.c's 30 s */
  SQLOK(sqlite3_exec(db, "PRAGMA foreign_keys = ON", NULL, NULL, NULL), "PRAGMA foreign_keys");
  for (int i = 2; i < argc; i++) {
    char uri[4096];
    sb_store_ro_uri(argv[i], uri, sizeof uri);
    sqlite3_stmt *q = NULL;
    SQLOK(sqlite3_prepare_v2(db, "ATTACH DATABASE ? AS src", -1, &q, NULL), "ATTACH");
    sqlite3_bind_text(q, 1, uri, -1, SQLITE_TRANSIENT);
    int arc = sqlite3_step(q);
    sqlite3_finalize(q);
    SQLOK(arc, argv[i]);
    SQLOK(sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL), "BEGIN");
    if (merge_one(db, out)) {
      sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
      goto fail;
    }
    SQLOK(sqlite3_exec(db, "COMMIT", NULL, NULL, NULL), "COMMIT");
    SQLOK(sqlite3_exec(db, "DETACH DATABASE src", NULL, NULL, NULL), "DETACH");
    inputs++;
  }
  sqlite3_stmt *q = NULL;
  long long nres = 0, ncfg = 0;
  if (sqlite3_prepare_v2(db, "SELECT (SELECT count(*) FROM results), (SELECT count(*) FROM "
                         "configs)", -1, &q, NULL) == SQLITE_OK && sqlite3_step(q) == SQLITE_ROW) {
    nres = sqlite3_column_int64(q, 0);
    ncfg = sqlite3_column_int64(q, 1);
  }
  sqlite3_finalize(q);
  sqlite3_close(db);
  printf("merge: %d DBs -> %s: %lld configs, %lld results\n", inputs, out, ncfg, nres);
  return SB_EXIT_OK;
fail:
  sqlite3_close(db);
  return SB_EXIT_FAIL;
}

/* ---- status ----------------------------------------------------------------------- */

enum { S_DB = 256, S_JSON, S_HELP };
static const struct option status_lopts[] = {{"db", required_argument, NULL, S_DB},
                                             {"json", no_argument, NULL, S_JSON},
                                             {"help", no_argument, NULL, S_HELP},
                                             {NULL, 0, NULL, 0}};

int sb_cmd_status(int argc, char **argv) {
  static const char CMD[] = "status";
  const char *path = NULL;
  bool json = false;
  int rc = sb_getopt_repeats(CMD, argc, argv, ":", status_lopts, NULL);
  if (rc) return rc;
  int ch;
  while ((ch = getopt_long(argc, argv, ":", status_lopts, NULL)) != -1) {
    switch (ch) {
    case S_DB: path = optarg; break;
    case S_JSON: json = true; break;
    case S_HELP: fputs(sb_status_usage, stdout); return SB_EXIT_OK;
    default: return sb_getopt_error(CMD, ch, argv, status_lopts);
    }
  }
  if (optind < argc) return sb_usage_error(CMD, NULL, "unexpected argument '%s'", argv[optind]);
  if (!path) return sb_usage_error(CMD, "--db", "required (the results DB)");
  if ((rc = check_input(CMD, path))) return rc;
  sb_store st;
  if ((rc = sb_store_open_read(&st, path, CMD))) return rc;
  sqlite3 *db = st.db;
  /* Each config's result by merge's rule: the verdicts above failed, then the latest. */
  sqlite3_stmt *q = NULL;
  if (sqlite3_prepare_v2(db,
                         "SELECT c.key, r.status, r.reason FROM configs c LEFT JOIN results r ON "
                         "r.id = (SELECT id FROM results x WHERE x.config_id = c.id ORDER BY "
                         "x.status != 'failed' DESC, x.created DESC, x.id ASC LIMIT 1) ORDER BY c.id",
                         -1, &q, NULL) != SQLITE_OK) {
    fprintf(stderr, "shardbench status: '%s': %s\n", path, sqlite3_errmsg(db));
    sb_store_close(&st);
    return SB_EXIT_FAIL;
  }
  long n = 0, ok = 0, mis = 0, fail = 0, skip = 0, left = 0;
  enum { MAX_SHOWN = 200 };
  char (*fk)[512] = malloc(sizeof *fk * MAX_SHOWN), (*fr)[512] = malloc(sizeof *fr * MAX_SHOWN),
       fs[MAX_SHOWN][16];
  int nf = 0;
  while (sqlite3_step(q) == SQLITE_ROW) {
    n++;
    const char *s = (const char *)sqlite3_column_text(q, 1);
    if (!s) {
      left++;
      continue;
    }
    if (!strcmp(s, "ok")) ok++;
    else if (!strcmp(s, "skipped")) skip++;
    else {
      if (!strcmp(s, "mismatch")) mis++;
      else fail++;
      if (nf < MAX_SHOWN && fk && fr) {
        const char *why = (const char *)sqlite3_column_text(q, 2);
        snprintf(fk[nf], sizeof fk[nf], "%s", (const char *)sqlite3_column_text(q, 0));
        snprintf(fr[nf], sizeof fr[nf], "%s", why ? why : "");
        snprintf(fs[nf], sizeof fs[nf], "%s", s);
        nf++;
      }
    }
  }
  sqlite3_finalize(q);
  /* Wall time per config: each run's span (its start to its last result) over
   * the results it wrote, summed over the runs. */
  double span = 0;
  long nres = 0, nruns = 0;
  if (sqlite3_prepare_v2(db,
                         "SELECT (julianday(max(r.created)) - julianday(u.started)) * 86400, "
                         "count(*) FROM runs u JOIN results r ON r.run_id = u.id GROUP BY u.id",
                         -1, &q, NULL) == SQLITE_OK)
    while (sqlite3_step(q) == SQLITE_ROW) {
      span += sqlite3_column_double(q, 0);
      nres += sqlite3_column_int64(q, 1);
    }
  sqlite3_finalize(q);
  int64_t unfinished[64];
  char ustart[64][40];
  int nu = 0;
  if (sqlite3_prepare_v2(db, "SELECT count(*) FROM runs", -1, &q, NULL) == SQLITE_OK &&
      sqlite3_step(q) == SQLITE_ROW)
    nruns = sqlite3_column_int64(q, 0);
  sqlite3_finalize(q);
  if (sqlite3_prepare_v2(db, "SELECT id, started FROM runs WHERE finished IS NULL ORDER BY id",
                         -1, &q, NULL) == SQLITE_OK)
    while (nu < 64 && sqlite3_step(q) == SQLITE_ROW) {
      unfinished[nu] = sqlite3_column_int64(q, 0);
      snprintf(ustart[nu], sizeof ustart[nu], "%s", (const char *)sqlite3_column_text(q, 1));
      nu++;
    }
  sqlite3_finalize(q);
  sb_store_close(&st);
  const double per = nres > 0 ? span / (double)nres : NAN;
  if (json) {
    printf("{\"db\": ");
    sb_json_str(stdout, path);
    printf(", \"configs\": %ld, \"done\": %ld, \"ok\": %ld, \"mismatch\": %ld, \"failed\": %ld, "
           "\"skipped\": %ld, \"remaining\": %ld, ", n, n - left, ok, mis, fail, skip, left);
    if (isfinite(per)) printf("\"per_config_s\": %.3f, \"left_s\": %.1f", per, per * (double)left);
    else printf("\"per_config_s\": null, \"left_s\": null");
    printf(", \"runs\": %ld, \"unfinished_runs\": [", nruns);
    for (int i = 0; i < nu; i++) printf("%s%lld", i ? ", " : "", (long long)unfinished[i]);
    printf("], \"failures\": [");
    for (int i = 0; i < nf; i++) {
      printf("%s{\"key\": ", i ? ", " : "");
      sb_json_str(stdout, fk[i]);
      printf(", \"status\": ");
      sb_json_str(stdout, fs[i]);
      printf(", \"reason\": ");
      sb_json_str(stdout, fr[i]);
      printf("}");
    }
    printf("]}\n");
  } else {
    printf("%s: %ld configs: %ld done (%ld ok, %ld mismatch, %ld failed, %ld skipped), %ld "
           "remaining\n", path, n, n - left, ok, mis, fail, skip, left);
    if (left && isfinite(per))
      printf("left: %ld configs at %.1f s each (the mean so far): about %.0f s\n", left, per,
             per * (double)left);
    for (int i = 0; i < nf; i++) printf("%s: %s: %s\n", fs[i], fk[i], fr[i]);
    if (fail + mis > nf) printf("... and %ld more\n", fail + mis - nf);
    printf("runs: %ld", nruns);
    for (int i = 0; i < nu; i++)
      printf("%s%lld (started %s)", i ? ", " : "; not finished (running or killed): run ",
             (long long)unfinished[i], ustart[i]);
    printf("\n");
  }
  free(fk);
  free(fr);
  return SB_EXIT_OK;
}
