/* bench/harness/store.c: the results database (see bench/harness/store.h and results/schema.sql).
 *
 * Every command opens its --db here: sb_store_open to write (run, sweep,
 * baselines), sb_store_open_read to read (report). Before SQLite opens a file
 * read-write, the path is checked (not "", ":memory:" or a "file:" URI, not a
 * directory, its directory exists), an existing non-empty file must begin with
 * SQLite's 16-byte magic, and a read-only look must find no table (a fresh
 * file) or a schema_version table holding 1 to SB_SCHEMA_VERSION: another
 * application's SQLite file is refused untouched. The look creates nothing
 * beside the file (open_ro). Only then is the DB reopened read-write, switched to
 * WAL and given the schema; an older DB is upgraded to SB_SCHEMA_VERSION in the
 * same transaction (results/schema.sql's header). A reader never writes: an
 * older DB keeps its version (st->version tells the reader which columns exist).
 *
 * The schema text is results/schema.sql itself: the Makefile turns it into the
 * C string literal of bench/harness/schema_sql.h (one source of truth); every statement
 * in it is CREATE ... IF NOT EXISTS, so running it on an existing DB is a no-op.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "store.h"

static const char SB_SCHEMA_SQL[] =
#include "bench/harness/schema_sql.h"
    ;

/* SQLite waits this long for a lock held by another writer (a second sweep on
 * the same DB) before giving up: a config's transaction takes milliseconds,
 * so 30 s (results/schema.sql) means something is stuck. */
enum { SB_BUSY_TIMEOUT_MS = 30000 };
/* SQLite's file header: the first 16 bytes of every database file. */
static const char SQLITE_MAGIC[16] = "SQLite format 3";

/* Check macro for SQLite calls: anything but OK/ROW/DONE prints the statement's
 * context and sqlite3_errmsg on one line and jumps to `fail`. */
#define SB_SQL(st, expr, what)                                                     \
  do {                                                                             \
    int sb_rc_ = (expr);                                                           \
    if (sb_rc_ != SQLITE_OK && sb_rc_ != SQLITE_ROW && sb_rc_ != SQLITE_DONE) {    \
      fprintf(stderr, "shardbench: DB '%s': %s: %s\n", (st)->path, (what),         \
              sqlite3_errmsg((st)->db));                                           \
      goto fail;                                                                   \
    }                                                                              \
  } while (0)

/* NaN (or a negative for the integer) binds NULL. */
static void bind_real(sqlite3_stmt *q, int i, double v) {
  if (isnan(v)) sqlite3_bind_null(q, i);
  else sqlite3_bind_double(q, i, v);
}

static void bind_bytes(sqlite3_stmt *q, int i, int64_t v) {
  if (v < 0) sqlite3_bind_null(q, i);
  else sqlite3_bind_int64(q, i, v);
}

void sb_result_init(sb_result *r) {
  memset(r, 0, sizeof *r);
  r->step_time_s = r->tokens_per_s = r->tflops = r->mfu = r->peak_tflops = NAN;
  r->max_abs_err = r->max_rel_err = r->tolerance = r->grad_norm = NAN;
  r->est_mem_bytes = r->est_need_bytes = NAN;
  r->peak_mem_bytes = -1;
  r->host_staged_bytes = -1;
  r->mem_params_bytes = r->mem_grads_bytes = r->mem_optimizer_bytes = -1;
  r->mem_activations_bytes = -1;
}

void sb_roles_free(sb_role *roles, int n) {
  if (!roles) return;
  for (int i = 0; i < n; i++) {
    free(roles[i].krows);
    free(roles[i].fcomm);
  }
  free(roles);
}

void sb_result_free(sb_result *r) {
  free(r->comm);
  free(r->pp);
  sb_roles_free(r->roles, r->n_roles);
  free(r->shape.role_of);
  free(r->shape.pp_len);
  free(r->shape.pp_acts);
  memset(&r->shape, 0, sizeof r->shape);
  r->comm = NULL;
  r->pp = NULL;
  r->roles = NULL;
  r->n_roles = 0;
  r->n_comm = 0;
}

size_t sb_pp_timeline_bytes(int n_events) {
  return sizeof(sb_pp_timeline) + sizeof(sb_pp_event) * (size_t)(n_events > 0 ? n_events : 0);
}

void sb_utc_now(char *buf, size_t n) {
  time_t t = time(NULL);
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

void sb_versions_str(char *buf, size_t n) {
  snprintf(buf, n, "shardbench %s; sqlite %s; mpi %s; cuda %s", PACKAGE_VERSION,
           sqlite3_libversion(),
#ifdef HAVE_MPI
           "built",
#else
           "no",
#endif
#ifdef HAVE_CUDA
           "built"
#else
           "no"
#endif
  );
}

/* ---- opening: one path for every command ---------------------------------------- */

/* The byte of SQLite's header that says the DB is in WAL mode (offsets 18 and 19,
 * the file format write and read versions: 1 legacy, 2 WAL; sqlite.org fileformat
 * section 1.3.3). */
enum { SQLITE_HDR_WAL_OFF = 18, SQLITE_HDR_LEN = 100 };

/* What the checks found about the path. */
typedef struct db_file {
  bool exists;      /* a non-empty regular file */
  bool wal;         /* its header says WAL mode */
  bool dir_writable;/* its directory takes new files (-wal, -shm, the DB itself) */
} db_file;

static int refuse(const char *cmd, const char *path, const char *fmt, ...) DT_PRINTF(3, 4);
static int refuse(const char *cmd, const char *path, const char *fmt, ...) {
  char msg[SB_ERR_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return sb_usage_error(cmd, "--db", "'%s': %s", path, msg);
}

/* The directory part of path ("." for a bare name) into dir. */
static void dir_of(const char *path, char *dir, size_t n) {
  const char *slash = strrchr(path, '/');
  if (!slash) snprintf(dir, n, ".");
  else if (slash == path) snprintf(dir, n, "/");
  else snprintf(dir, n, "%.*s", (int)(slash - path), path);
}

/* Checks the path before SQLite sees it: a name SQLite reads as something else
 * (":memory:", a "file:" URI, ""), a directory or device, a missing directory,
 * a file that is not SQLite (its 16-byte magic). for_write: an absent or empty
 * file is a new DB; else it must exist. SB_EXIT_OK or SB_EXIT_USAGE (printed). */
static int check_path(const char *cmd, const char *path, bool for_write, db_file *f) {
  memset(f, 0, sizeof *f);
  if (!path[0]) return sb_usage_error(cmd, "--db", "empty path");
  if (!strcmp(path, ":memory:"))
    return refuse(cmd, path, "SQLite's in-memory DB: the results would go nowhere");
  if (!strncmp(path, "file:", 5))
    return refuse(cmd, path, "SQLite would read it as a URI; give a plain file path");
  if (strlen(path) >= sizeof ((sb_store *)0)->path)
    return refuse(cmd, path, "longer than %zu characters", sizeof ((sb_store *)0)->path - 1);
  char dir[sizeof ((sb_store *)0)->path];
  dir_of(path, dir, sizeof dir);
  struct stat sd;
  if (stat(dir, &sd) != 0 || !S_ISDIR(sd.st_mode))
    return refuse(cmd, path, "directory '%s' does not exist", dir);
  f->dir_writable = access(dir, W_OK | X_OK) == 0;
  struct stat sf;
  if (stat(path, &sf) != 0) {
    if (errno != ENOENT) return refuse(cmd, path, "%s", strerror(errno));
    if (!for_write) return refuse(cmd, path, "no such file");
    if (!f->dir_writable)
      return refuse(cmd, path, "cannot create it: directory '%s' is not writable", dir);
    return SB_EXIT_OK;
  }
  if (S_ISDIR(sf.st_mode)) return refuse(cmd, path, "is a directory");
  if (!S_ISREG(sf.st_mode)) return refuse(cmd, path, "not a regular file");
  FILE *fp = fopen(path, "rb");
  if (!fp) return refuse(cmd, path, "cannot read: %s", strerror(errno));
  unsigned char h[SQLITE_HDR_LEN];
  size_t got = fread(h, 1, sizeof h, fp);
  fclose(fp);
  if (got == 0) {
    if (!for_write) return refuse(cmd, path, "empty file, not a results DB");
    if (access(path, W_OK) != 0) return refuse(cmd, path, "cannot write: %s", strerror(errno));
    return SB_EXIT_OK; /* an empty file: a new DB */
  }
  if (got < sizeof h || memcmp(h, SQLITE_MAGIC, sizeof SQLITE_MAGIC) != 0)
    return refuse(cmd, path, "not a SQLite database");
  if (for_write && access(path, W_OK) != 0)
    return refuse(cmd, path, "cannot write: %s", strerror(errno));
  f->exists = true;
  f->wal = h[SQLITE_HDR_WAL_OFF] == 2;
  return SB_EXIT_OK;
}

/* Opens path read-only without creating anything beside it. A WAL-mode DB
 * needs a -shm file to be read with locks: when none exists (no connection is
 * open: SQLite keeps -wal and -shm while one is) or the directory takes no new
 * file, the DB is opened immutable (sqlite.org/uri.html: no locks, no -wal or
 * -shm; what an absent -wal would hold is in the main file). */
static int open_ro(const char *path, const db_file *f, sqlite3 **db) {
  char side[sizeof ((sb_store *)0)->path + 8];
  snprintf(side, sizeof side, "%s-wal", path);
  bool wal_there = access(side, F_OK) == 0;
  if (!f->wal || (wal_there && f->dir_writable))
    return sqlite3_open_v2(path, db, SQLITE_OPEN_READONLY, NULL);
  /* file:PATH?immutable=1 with PATH percent-encoded where a URI needs it */
  char uri[3 * sizeof ((sb_store *)0)->path + 32];
  size_t k = (size_t)snprintf(uri, sizeof uri, "file:");
  for (const unsigned char *p = (const unsigned char *)path; *p && k + 4 < sizeof uri; p++) {
    if (*p == '%' || *p == '?' || *p == '#' || *p <= ' ' || *p >= 0x7f)
      k += (size_t)snprintf(uri + k, sizeof uri - k, "%%%02X", *p);
    else uri[k++] = (char)*p;
  }
  snprintf(uri + k, sizeof uri - k, "?immutable=1");
  return sqlite3_open_v2(uri, db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, NULL);
}

void sb_store_ro_uri(const char *path, char *uri, size_t n) {
  db_file f;
  memset(&f, 0, sizeof f);
  unsigned char h[SQLITE_HDR_LEN];
  FILE *fp = fopen(path, "rb");
  if (fp) {
    f.wal = fread(h, 1, sizeof h, fp) == sizeof h && h[SQLITE_HDR_WAL_OFF] == 2;
    fclose(fp);
  }
  char dir[sizeof ((sb_store *)0)->path], side[sizeof ((sb_store *)0)->path + 8];
  dir_of(path, dir, sizeof dir);
  f.dir_writable = access(dir, W_OK | X_OK) == 0;
  snprintf(side, sizeof side, "%s-wal", path);
  const bool immutable = f.wal && !(access(side, F_OK) == 0 && f.dir_writable);
  size_t k = (size_t)snprintf(uri, n, "file:");
  for (const unsigned char *p = (const unsigned char *)path; *p && k + 4 < n; p++) {
    if (*p == '%' || *p == '?' || *p == '#' || *p <= ' ' || *p >= 0x7f)
      k += (size_t)snprintf(uri + k, n - k, "%%%02X", *p);
    else uri[k++] = (char)*p;
  }
  snprintf(uri + k, n - k, immutable ? "?immutable=1" : "?mode=ro");
}

/* Read-only look at an existing SQLite file: its schema version (1 to
 * SB_SCHEMA_VERSION), 0 when it has no table yet (a new DB), or the refusal
 * (SB_EXIT_USAGE printed, as -1). */
static int read_version(const char *cmd, const char *path, sqlite3 *db) {
  sqlite3_stmt *q = NULL;
  int ver = -1;
  if (sqlite3_prepare_v2(db,
                         "SELECT count(*), sum(name = 'schema_version') FROM sqlite_master "
                         "WHERE type = 'table'",
                         -1, &q, NULL) != SQLITE_OK ||
      sqlite3_step(q) != SQLITE_ROW) {
    refuse(cmd, path, "not a SQLite database (%s)", sqlite3_errmsg(db));
    goto done;
  }
  int ntables = sqlite3_column_int(q, 0), has_version = sqlite3_column_int(q, 1);
  sqlite3_finalize(q);
  q = NULL;
  if (ntables == 0) {
    ver = 0;
    goto done;
  }
  if (!has_version) {
    refuse(cmd, path, "another application's SQLite DB (no schema_version table)");
    goto done;
  }
  if (sqlite3_prepare_v2(db, "SELECT version FROM schema_version", -1, &q, NULL) != SQLITE_OK) {
    refuse(cmd, path, "%s", sqlite3_errmsg(db));
    goto done;
  }
  int nrows = 0, v = 0, bad = 0;
  while (sqlite3_step(q) == SQLITE_ROW) {
    v = sqlite3_column_int(q, 0);
    nrows++;
    if (v < 1 || v > SB_SCHEMA_VERSION) bad = 1;
  }
  if (bad)
    refuse(cmd, path, "schema version %d, this shardbench reads 1 to %d", v, SB_SCHEMA_VERSION);
  else if (nrows > 1)
    refuse(cmd, path, "schema_version has %d rows, expected 1", nrows);
  else
    ver = nrows ? v : 0; /* 0 rows: another process is creating it; it inserts the row */
done:
  sqlite3_finalize(q);
  return ver;
}

/* The step from version i + 1 to i + 2 (results/schema.sql's header lists them):
 * the columns that version added, NULL in the rows already there. */
static const char *const upgrade_sql[SB_SCHEMA_VERSION - 1] = {
    "ALTER TABLE runs ADD COLUMN peak_tflops REAL;"
    "ALTER TABLE runs ADD COLUMN peak_source TEXT;"
    "ALTER TABLE results ADD COLUMN worst TEXT;"
    "UPDATE schema_version SET version = 2;",
    "ALTER TABLE results ADD COLUMN mem_params_bytes INTEGER;"
    "ALTER TABLE results ADD COLUMN mem_grads_bytes INTEGER;"
    "ALTER TABLE results ADD COLUMN mem_optimizer_bytes INTEGER;"
    "ALTER TABLE results ADD COLUMN mem_activations_bytes INTEGER;"
    "UPDATE schema_version SET version = 3;",
    /* the pp_* tables: created by the schema text, which runs first */
    "UPDATE schema_version SET version = 4;",
    "ALTER TABLE results ADD COLUMN grad_norm REAL;"
    "UPDATE schema_version SET version = 5;",
    /* the shape_* tables: created by the schema text, which runs first */
    "UPDATE schema_version SET version = 6;",
    "ALTER TABLE shape_roles ADD COLUMN reserved_peak_bytes INTEGER;"
    "UPDATE schema_version SET version = 7;",
};

/* The column a step adds to a table the schema text makes (which runs first): a
 * DB older than the table gets it from the text with the column already (SQLite
 * has no ADD COLUMN IF NOT EXISTS), so the step then only sets its version. */
static const char *const upgrade_column[SB_SCHEMA_VERSION - 1][2] = {
    [5] = {"shape_roles", "reserved_peak_bytes"},
};

/* 1 when table t has column c, 0 when not, -1 on an SQLite error. */
static int has_column(sqlite3 *db, const char *t, const char *c) {
  sqlite3_stmt *q = NULL;
  if (sqlite3_prepare_v2(db, "SELECT count(*) FROM pragma_table_info(?) WHERE name = ?", -1, &q,
                         NULL) != SQLITE_OK)
    return -1;
  sqlite3_bind_text(q, 1, t, -1, SQLITE_STATIC);
  sqlite3_bind_text(q, 2, c, -1, SQLITE_STATIC);
  const int has = sqlite3_step(q) == SQLITE_ROW ? sqlite3_column_int(q, 0) > 0 : -1;
  sqlite3_finalize(q);
  return has;
}

/* Inside the open's write transaction: an older DB gets every later version's
 * columns, one step after the other. Returns an SQLite code. */
static int upgrade(sb_store *st) {
  sqlite3_stmt *q = NULL;
  int rc = sqlite3_prepare_v2(st->db, "SELECT version FROM schema_version", -1, &q, NULL);
  if (rc != SQLITE_OK) return rc;
  int ver = sqlite3_step(q) == SQLITE_ROW ? sqlite3_column_int(q, 0) : SB_SCHEMA_VERSION;
  sqlite3_finalize(q);
  for (int v = ver; v >= 1 && v < SB_SCHEMA_VERSION; v++) {
    const char *sql = upgrade_sql[v - 1];
    char only_version[64];
    if (upgrade_column[v - 1][0]) {
      const int has = has_column(st->db, upgrade_column[v - 1][0], upgrade_column[v - 1][1]);
      if (has < 0) return SQLITE_ERROR;
      if (has) {
        snprintf(only_version, sizeof only_version, "UPDATE schema_version SET version = %d;",
                 v + 1);
        sql = only_version;
      }
    }
    rc = sqlite3_exec(st->db, sql, NULL, NULL, NULL);
    if (rc != SQLITE_OK) return rc;
  }
  return SQLITE_OK;
}

int sb_store_open_read(sb_store *st, const char *path, const char *cmd) {
  memset(st, 0, sizeof *st);
  db_file f;
  int rc = check_path(cmd, path, false, &f);
  if (rc) return rc;
  snprintf(st->path, sizeof st->path, "%s", path);
  if (open_ro(path, &f, &st->db) != SQLITE_OK) {
    rc = refuse(cmd, path, "cannot open: %s", st->db ? sqlite3_errmsg(st->db) : "out of memory");
    sb_store_close(st);
    return rc;
  }
  sqlite3_busy_timeout(st->db, SB_BUSY_TIMEOUT_MS);
  int ver = read_version(cmd, path, st->db);
  if (ver <= 0) {
    if (ver == 0) refuse(cmd, path, "holds no shardbench tables");
    sb_store_close(st);
    return SB_EXIT_USAGE;
  }
  st->version = ver;
  return SB_EXIT_OK;
}

int sb_store_open(sb_store *st, const char *path, const char *cmd) {
  memset(st, 0, sizeof *st);
  db_file f;
  int rc = check_path(cmd, path, true, &f);
  if (rc) return rc;
  snprintf(st->path, sizeof st->path, "%s", path);
  if (f.exists) {
    sqlite3 *look = NULL;
    int ver = -1;
    if (open_ro(path, &f, &look) != SQLITE_OK)
      refuse(cmd, path, "not a SQLite database (%s)", look ? sqlite3_errmsg(look) : "cannot open");
    else {
      sqlite3_busy_timeout(look, SB_BUSY_TIMEOUT_MS);
      ver = read_version(cmd, path, look);
    }
    sqlite3_close(look);
    if (ver < 0) return SB_EXIT_USAGE;
  }
  if (sqlite3_open_v2(path, &st->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) !=
      SQLITE_OK) {
    fprintf(stderr, "shardbench %s: --db: '%s': cannot open: %s\n", cmd, path,
            st->db ? sqlite3_errmsg(st->db) : "out of memory");
    sb_store_close(st);
    return SB_EXIT_FAIL;
  }
  sqlite3_busy_timeout(st->db, SB_BUSY_TIMEOUT_MS);
  /* Switching a new file to WAL takes an exclusive lock, and SQLite answers BUSY
   * at once (no busy handler: it could deadlock) while another process is
   * creating or switching the same file: retry for the busy timeout. */
  {
    int rc2 = SQLITE_BUSY;
    for (int waited = 0; waited <= SB_BUSY_TIMEOUT_MS; waited += 10) {
      rc2 = sqlite3_exec(st->db, "PRAGMA journal_mode = WAL", NULL, NULL, NULL);
      if (rc2 != SQLITE_BUSY && rc2 != SQLITE_LOCKED) break;
      sqlite3_sleep(10);
    }
    SB_SQL(st, rc2, "PRAGMA journal_mode");
  }
  SB_SQL(st, sqlite3_exec(st->db, "PRAGMA foreign_keys = ON", NULL, NULL, NULL),
         "PRAGMA foreign_keys");
  /* Create and version in one write transaction, so two processes creating the
   * same new file leave exactly one version row. */
  SB_SQL(st, sqlite3_exec(st->db, "BEGIN IMMEDIATE", NULL, NULL, NULL), "BEGIN");
  SB_SQL(st, sqlite3_exec(st->db, SB_SCHEMA_SQL, NULL, NULL, NULL), "creating the schema");
  {
    char sql[160];
    snprintf(sql, sizeof sql,
             "INSERT INTO schema_version(version) SELECT %d "
             "WHERE NOT EXISTS (SELECT 1 FROM schema_version)",
             SB_SCHEMA_VERSION);
    SB_SQL(st, sqlite3_exec(st->db, sql, NULL, NULL, NULL), "schema_version");
  }
  SB_SQL(st, upgrade(st), "upgrading an older schema version");
  SB_SQL(st, sqlite3_exec(st->db, "COMMIT", NULL, NULL, NULL), "COMMIT");
  st->version = SB_SCHEMA_VERSION;
  return SB_EXIT_OK;
fail:
  sb_store_close(st);
  return SB_EXIT_FAIL;
}

void sb_store_close(sb_store *st) {
  if (st->db) sqlite3_close(st->db);
  st->db = NULL;
}

int sb_store_begin_run(sb_store *st, int argc, char **argv, const char *backend, int world,
                       double peak_tflops, const char *peak_source) {
  char now[32], host[256] = "unknown", vers[256];
  sb_utc_now(now, sizeof now);
  if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "unknown");
  host[sizeof host - 1] = '\0';
  sb_versions_str(vers, sizeof vers);
  size_t len = 1;
  for (int i = 0; i < argc; i++) len += strlen(argv[i]) + 1;
  char *args = malloc(len);
  if (!args) {
    fprintf(stderr, "shardbench: out of memory\n");
    return 1;
  }
  args[0] = '\0';
  for (int i = 0; i < argc; i++) {
    if (i) strcat(args, " ");
    strcat(args, argv[i]);
  }
  sqlite3_stmt *q = NULL;
  SB_SQL(st,
         sqlite3_prepare_v2(st->db,
                            "INSERT INTO runs(started, host, version, versions, argv, backend, "
                            "world, peak_tflops, peak_source) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            -1, &q, NULL),
         "prepare runs");
  sqlite3_bind_text(q, 1, now, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(q, 2, host, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(q, 3, PACKAGE_VERSION, -1, SQLITE_STATIC);
  sqlite3_bind_text(q, 4, vers, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(q, 5, args, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(q, 6, backend, -1, SQLITE_TRANSIENT);
  sqlite3_bind_int(q, 7, world);
  bind_real(q, 8, peak_tflops > 0 ? peak_tflops : NAN);
  sqlite3_bind_text(q, 9, peak_source, -1, SQLITE_TRANSIENT);
  SB_SQL(st, sqlite3_step(q), "insert runs");
  st->run_id = sqlite3_last_insert_rowid(st->db);
  sqlite3_finalize(q);
  free(args);
  return 0;
fail:
  sqlite3_finalize(q);
  free(args);
  return 1;
}

int sb_store_end_run(sb_store *st) {
  char now[32];
  sb_utc_now(now, sizeof now);
  sqlite3_stmt *q = NULL;
  SB_SQL(st, sqlite3_prepare_v2(st->db, "UPDATE runs SET finished = ? WHERE id = ?", -1, &q, NULL),
         "prepare finish");
  sqlite3_bind_text(q, 1, now, -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(q, 2, st->run_id);
  SB_SQL(st, sqlite3_step(q), "finish run");
  sqlite3_finalize(q);
  return 0;
fail:
  sqlite3_finalize(q);
  return 1;
}

int sb_store_has_result(sb_store *st, const char *key, bool *has) {
  sqlite3_stmt *q = NULL;
  *has = false;
  SB_SQL(st,
         sqlite3_prepare_v2(st->db,
                            "SELECT 1 FROM results r JOIN configs c ON c.id = r.config_id "
                            "WHERE c.key = ? LIMIT 1",
                            -1, &q, NULL),
         "prepare resume lookup");
  sqlite3_bind_text(q, 1, key, -1, SQLITE_TRANSIENT);
  int rc = sqlite3_step(q);
  SB_SQL(st, rc, "resume lookup");
  *has = rc == SQLITE_ROW;
  sqlite3_finalize(q);
  return 0;
fail:
  sqlite3_finalize(q);
  return 1;
}


int sb_store_plan_configs(sb_store *st, const sb_config *cs, int n) {
  SB_SQL(st, sqlite3_exec(st->db, "BEGIN IMMEDIATE", NULL, NULL, NULL), "BEGIN");
  for (int i = 0; i < n; i++) {
    int64_t id;
    if (sb_store_config_id(st, &cs[i], &id)) goto fail;
  }
  SB_SQL(st, sqlite3_exec(st->db, "COMMIT", NULL, NULL, NULL), "COMMIT");
  return 0;
fail:
  sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
  return 1;
}

/* The analytic numbers stored next to a measured config's comm rows:
 * - the framework baselines its plan's settings select (sb_baseline_plan_rows:
 *   the TP part, Megatron-LM TP or TP + sequence parallel, and the DP part,
 *   DDP / FSDP / HSDP, and the CP part, PyTorch's ring or all-gather attention,
 *   as comm_bytes_per_step rows, and their sum as
 *   comm_bytes_per_step_combined, the comm chart's cross), read from
 *   r->plan_traits, never from the plan's name;
 * - the runtime's own closed form (framework "runtime-model", quantity
 *   comm_bytes_per_step_runtime_model), for the regression check of
 *   verify/harness.sh only: it is not a framework baseline and is not charted.
 * Replaces the config's earlier rows; 0 rows when nothing applies. */
static int put_baselines(sb_store *st, const sb_config *c, const sb_result *r, int64_t config_id) {
  if (!r->plan_traits.valid) return 0; /* no plan settings: nothing to select by */
  dt_llama_config cfg;
  if (sb_workload_config(NULL, c->model, c->workload, &cfg) != DT_OK) return 0; /* custom: none */
  dt_dtype dt;
  if (dt_dtype_parse(c->dtype, &dt) != DT_OK) return 0;
  sb_baseline_in in = {.model = cfg, .pp = c->pp, .dp_replicate = c->dp_replicate,
                       .dp_shard = c->dp_shard, .cp = c->cp, .tp = c->tp, .batch = c->batch,
                       .seq = c->seq, .elem_bytes = (int)dt_dtype_size(dt), .microbatches = 1,
                       .virtual_stages = 1};
  enum { MAX_ROWS = 6 }; /* tp, dp, cp and pp parts, their sum, the runtime model */
  sb_baseline_row rows[MAX_ROWS];
  int n = sb_baseline_plan_rows(&in, &r->plan_traits, rows, MAX_ROWS - 1);
  if (n < 0) n = 0;
  if (sb_runtime_comm_row(&in, &r->plan_traits, &rows[n]) == 0) n++;
  return sb_store_put_baselines(st, config_id, rows, n);
}

int sb_store_put_baselines(sb_store *st, int64_t config_id, const sb_baseline_row *rows, int n) {
  sqlite3_stmt *q = NULL;
  if (config_id > 0) {
    SB_SQL(st, sqlite3_prepare_v2(st->db, "DELETE FROM baselines WHERE config_id = ?", -1, &q, NULL),
           "prepare baselines delete");
    sqlite3_bind_int64(q, 1, config_id);
    SB_SQL(st, sqlite3_step(q), "delete baselines");
    sqlite3_finalize(q);
    q = NULL;
  }
  SB_SQL(st,
         sqlite3_prepare_v2(st->db,
                            "INSERT INTO baselines(config_id, framework, quantity, value, unit, "
                            "formula) VALUES (?, ?, ?, ?, ?, ?)",
                            -1, &q, NULL),
         "prepare baselines");
  for (int i = 0; i < n; i++) {
    sqlite3_reset(q);
    if (config_id > 0) sqlite3_bind_int64(q, 1, config_id);
    else sqlite3_bind_null(q, 1);
    sqlite3_bind_text(q, 2, rows[i].framework, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(q, 3, rows[i].quantity, -1, SQLITE_TRANSIENT);
    sqlite3_bind_double(q, 4, rows[i].value);
    sqlite3_bind_text(q, 5, rows[i].unit, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(q, 6, rows[i].formula, -1, SQLITE_TRANSIENT);
    SB_SQL(st, sqlite3_step(q), "insert baselines");
  }
  sqlite3_finalize(q);
  return 0;
fail:
  sqlite3_finalize(q);
  return 1;
}

int sb_store_config_id(sb_store *st, const sb_config *c, int64_t *id) {
  sqlite3_stmt *q = NULL;
  SB_SQL(st,
         sqlite3_prepare_v2(st->db,
                            "INSERT OR IGNORE INTO configs(key, workload, model, plan, pp, "
                            "dp_replicate, dp_shard, cp, tp, dtype, batch, seq, steps, backend, "
                            "world) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            -1, &q, NULL),
         "prepare configs");
  sqlite3_bind_text(q, 1, c->key, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(q, 2, c->workload, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(q, 3, c->model, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(q, 4, c->plan, -1, SQLITE_TRANSIENT);
  const int ints[] = {c->pp, c->dp_replicate, c->dp_shard, c->cp, c->tp};
  for (int i = 0; i < 5; i++) sqlite3_bind_int(q, 5 + i, ints[i]);
  sqlite3_bind_text(q, 10, c->dtype, -1, SQLITE_TRANSIENT);
  sqlite3_bind_int(q, 11, c->batch);
  sqlite3_bind_int(q, 12, c->seq);
  sqlite3_bind_int(q, 13, c->steps);
  sqlite3_bind_text(q, 14, c->backend, -1, SQLITE_TRANSIENT);
  sqlite3_bind_int(q, 15, c->world);
  SB_SQL(st, sqlite3_step(q), "insert configs");
  sqlite3_finalize(q);
  q = NULL;
  SB_SQL(st, sqlite3_prepare_v2(st->db, "SELECT id FROM configs WHERE key = ?", -1, &q, NULL),
         "prepare config id");
  sqlite3_bind_text(q, 1, c->key, -1, SQLITE_TRANSIENT);
  int rc = sqlite3_step(q);
  SB_SQL(st, rc, "config id");
  if (rc != SQLITE_ROW) {
    fprintf(stderr, "shardbench: DB '%s': config row vanished\n", st->path);
    goto fail;
  }
  *id = sqlite3_column_int64(q, 0);
  sqlite3_finalize(q);
  return 0;
fail:
  sqlite3_finalize(q);
  return 1;
}

/* The results row of r for config_id; its id into *id. Inside a transaction. */
static int put_result(sb_store *st, int64_t config_id, const sb_result *r, int64_t *id) {
  sqlite3_stmt *q = NULL;
  char now[32];
  sb_utc_now(now, sizeof now);
  SB_SQL(st,
         sqlite3_prepare_v2(st->db,
                            "INSERT INTO results(run_id, config_id, status, reason, step_time_s, "
                            "tokens_per_s, tflops, mfu, peak_tflops, peak_mem_bytes, max_abs_err, "
                            "max_rel_err, tolerance, created, worst, mem_params_bytes, "
                            "mem_grads_bytes, mem_optimizer_bytes, mem_activations_bytes, grad_norm) "
                            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            -1, &q, NULL),
         "prepare results");
  sqlite3_bind_int64(q, 1, st->run_id);
  sqlite3_bind_int64(q, 2, config_id);
  sqlite3_bind_text(q, 3, r->status, -1, SQLITE_TRANSIENT);
  if (r->reason[0]) sqlite3_bind_text(q, 4, r->reason, -1, SQLITE_TRANSIENT);
  else sqlite3_bind_null(q, 4);
  bind_real(q, 5, r->step_time_s);
  bind_real(q, 6, r->tokens_per_s);
  bind_real(q, 7, r->tflops);
  bind_real(q, 8, r->mfu);
  bind_real(q, 9, r->peak_tflops);
  bind_bytes(q, 10, r->peak_mem_bytes);
  bind_real(q, 11, r->max_abs_err);
  bind_real(q, 12, r->max_rel_err);
  bind_real(q, 13, r->tolerance);
  sqlite3_bind_text(q, 14, now, -1, SQLITE_TRANSIENT);
  if (r->worst[0]) sqlite3_bind_text(q, 15, r->worst, -1, SQLITE_TRANSIENT);
  else sqlite3_bind_null(q, 15);
  bind_bytes(q, 16, r->mem_params_bytes);
  bind_bytes(q, 17, r->mem_grads_bytes);
  bind_bytes(q, 18, r->mem_optimizer_bytes);
  bind_bytes(q, 19, r->mem_activations_bytes);
  bind_real(q, 20, r->grad_norm);
  SB_SQL(st, sqlite3_step(q), "insert results");
  *id = sqlite3_last_insert_rowid(st->db);
  sqlite3_finalize(q);
  return 0;
fail:
  sqlite3_finalize(q);
  return 1;
}

/* The comm rows of r for result_id. Inside a transaction. */
static int put_comm(sb_store *st, int64_t result_id, const sb_result *r) {
  if (r->n_comm <= 0) return 0;
  sqlite3_stmt *q = NULL;
  SB_SQL(st,
         sqlite3_prepare_v2(st->db,
                            "INSERT INTO comm(result_id, op, mesh_dim, phase, calls, "
                            "payload_bytes, wire_bytes, seconds) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                            -1, &q, NULL),
         "prepare comm");
  for (int i = 0; i < r->n_comm; i++) {
    const sb_comm_row *cr = &r->comm[i];
    sqlite3_reset(q);
    sqlite3_bind_int64(q, 1, result_id);
    sqlite3_bind_text(q, 2, cr->op, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(q, 3, cr->mesh_dim, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(q, 4, cr->phase, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(q, 5, cr->calls);
    sqlite3_bind_int64(q, 6, cr->payload_bytes);
    sqlite3_bind_double(q, 7, cr->wire_bytes);
    sqlite3_bind_double(q, 8, cr->seconds);
    SB_SQL(st, sqlite3_step(q), "insert comm");
  }
  sqlite3_finalize(q);
  return 0;
fail:
  sqlite3_finalize(q);
  return 1;
}

/* The pp_stats, pp_stages and pp_events rows of a pipelined r. Inside a transaction. */
static int put_pp(sb_store *st, int64_t result_id, const sb_result *r) {
  const sb_pp_timeline *t = r->pp;
  if (!t) return 0;
  sqlite3_stmt *q = NULL;
  SB_SQL(st,
         sqlite3_prepare_v2(st->db,
                            "INSERT INTO pp_stats(result_id, schedule, pp, virtual_stages, "
                            "microbatches, steps, bubble_measured, bubble_analytic, span_s) "
                            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            -1, &q, NULL),
         "prepare pp_stats");
  sqlite3_bind_int64(q, 1, result_id);
  sqlite3_bind_text(q, 2, t->schedule, -1, SQLITE_TRANSIENT);
  sqlite3_bind_int(q, 3, t->pp);
  sqlite3_bind_int(q, 4, t->virtual_stages);
  sqlite3_bind_int(q, 5, t->microbatches);
  sqlite3_bind_int(q, 6, t->steps);
  sqlite3_bind_double(q, 7, t->bubble_measured);
  bind_real(q, 8, t->bubble_analytic);
  sqlite3_bind_double(q, 9, t->span_s);
  SB_SQL(st, sqlite3_step(q), "insert pp_stats");
  sqlite3_finalize(q);
  q = NULL;
  SB_SQL(st,
         sqlite3_prepare_v2(st->db,
                            "INSERT INTO pp_stages(result_id, pp_rank, max_in_flight, "
                            "peak_act_bytes, busy_s, bubble) VALUES (?, ?, ?, ?, ?, ?)",
                            -1, &q, NULL),
         "prepare pp_stages");
  for (int i = 0; i < t->pp && i < DT_PP_MAX_RANKS; i++) {
    const sb_pp_stage *g = &t->stages[i];
    sqlite3_reset(q);
    sqlite3_bind_int64(q, 1, result_id);
    sqlite3_bind_int(q, 2, i);
    sqlite3_bind_int(q, 3, g->max_in_flight);
    sqlite3_bind_int64(q, 4, g->peak_act_bytes);
    sqlite3_bind_double(q, 5, g->busy_s);
    sqlite3_bind_double(q, 6, g->bubble);
    SB_SQL(st, sqlite3_step(q), "insert pp_stages");
  }
  sqlite3_finalize(q);
  q = NULL;
  SB_SQL(st,
         sqlite3_prepare_v2(st->db,
                            "INSERT INTO pp_events(result_id, step, rank, pp_rank, action, stage, "
                            "microbatch, t0_s, t1_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            -1, &q, NULL),
         "prepare pp_events");
  for (int i = 0; i < t->n_events; i++) {
    const sb_pp_event *e = &t->events[i];
    sqlite3_reset(q);
    sqlite3_bind_int64(q, 1, result_id);
    sqlite3_bind_int(q, 2, e->step);
    sqlite3_bind_int(q, 3, e->rank);
    sqlite3_bind_int(q, 4, e->pp_rank);
    sqlite3_bind_text(q, 5, dt_pp_kind_str((dt_pp_kind)e->kind), -1, SQLITE_STATIC);
    sqlite3_bind_int(q, 6, e->stage);
    sqlite3_bind_int(q, 7, e->mb);
    sqlite3_bind_double(q, 8, e->t0);
    sqlite3_bind_double(q, 9, e->t1);
    SB_SQL(st, sqlite3_step(q), "insert pp_events");
  }
  sqlite3_finalize(q);
  return 0;
fail:
  sqlite3_finalize(q);
  return 1;
}

int sb_store_put(sb_store *st, const sb_config *c, const sb_result *r) {
  int64_t config_id = 0, result_id = 0;
  SB_SQL(st, sqlite3_exec(st->db, "BEGIN IMMEDIATE", NULL, NULL, NULL), "BEGIN");
  if (sb_store_config_id(st, c, &config_id) || put_result(st, config_id, r, &result_id) ||
      put_comm(st, result_id, r) || put_pp(st, result_id, r) || (!strcmp(r->status, "ok") && put_baselines(st, c, r, config_id))) {
    sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
    return 1;
  }
  SB_SQL(st, sqlite3_exec(st->db, "COMMIT", NULL, NULL, NULL), "COMMIT");
  return 0;
fail:
  sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL); /* no-op when BEGIN failed */
  return 1;
}

/* ---- shape-only runs (--device meta): shape_runs, shape_roles, shape_comm ---------- */

/* A role's linear-layer GEMM FLOPs (op "gemm") of phase ph, from its merged ledger. */
static double role_gemm_flops(const sb_role *ro, const char *ph) {
  double f = 0;
  for (int i = 0; i < ro->n_krows; i++)
    if (!strcmp(ro->krows[i].op, "gemm") && !strcmp(ro->krows[i].phase, ph))
      f += ro->krows[i].flops * (double)ro->krows[i].calls;
  return f;
}

static const char *const GEMM_PHASES[3] = {"forward", "backward", "recompute"};

/* The shape_runs row; its id into *id. Inside a transaction. */
static int put_shape_run(sb_store *st, const sb_config *c, const char *ac, const sb_result *r,
                         int64_t *id) {
  sqlite3_stmt *q = NULL;
  char now[32];
  sb_utc_now(now, sizeof now);
  const bool shape = !strcmp(r->status, "shape-only");
  SB_SQL(st,
         sqlite3_prepare_v2(st->db,
                            "INSERT INTO shape_runs(run_id, key, workload, model, plan, pp, "
                            "dp_replicate, dp_shard, cp, tp, dtype, batch, seq, ac, world, status, "
                            "reason, n_roles, peak_mem_bytes, mem_params_bytes, mem_grads_bytes, "
                            "mem_optimizer_bytes, mem_activations_bytes, flops_forward, "
                            "flops_backward, flops_recompute, flops_optimizer, flops_other, "
                            "gemm_flops_forward, gemm_flops_backward, gemm_flops_recompute, "
                            "created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
                            "?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            -1, &q, NULL),
         "prepare shape_runs");
  int k = 1;
  sqlite3_bind_int64(q, k++, st->run_id);
  sqlite3_bind_text(q, k++, c->key, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(q, k++, c->workload, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(q, k++, c->model, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(q, k++, c->plan, -1, SQLITE_TRANSIENT);
  const int ints[] = {c->pp, c->dp_replicate, c->dp_shard, c->cp, c->tp};
  for (int i = 0; i < 5; i++) sqlite3_bind_int(q, k++, ints[i]);
  sqlite3_bind_text(q, k++, c->dtype, -1, SQLITE_TRANSIENT);
  sqlite3_bind_int(q, k++, c->batch);
  sqlite3_bind_int(q, k++, c->seq);
  sqlite3_bind_text(q, k++, ac, -1, SQLITE_TRANSIENT);
  sqlite3_bind_int(q, k++, c->world);
  sqlite3_bind_text(q, k++, r->status, -1, SQLITE_TRANSIENT);
  if (r->reason[0]) sqlite3_bind_text(q, k++, r->reason, -1, SQLITE_TRANSIENT);
  else sqlite3_bind_null(q, k++);
  sqlite3_bind_int(q, k++, shape ? r->n_roles : 0);
  const int64_t mem[5] = {r->peak_mem_bytes, r->mem_params_bytes, r->mem_grads_bytes,
                          r->mem_optimizer_bytes, r->mem_activations_bytes};
  for (int i = 0; i < 5; i++) bind_bytes(q, k++, shape ? mem[i] : -1);
  /* the step's FLOPs over every rank: each role's times the ranks it stands for */
  double fl[SB_ROLE_PHASES] = {0}, gf[3] = {0};
  for (int i = 0; i < r->n_roles; i++) {
    const sb_role *ro = &r->roles[i];
    for (int p = 0; p < SB_ROLE_PHASES; p++) fl[p] += ro->flops[p] * ro->count;
    for (int p = 0; p < 3; p++) gf[p] += role_gemm_flops(ro, GEMM_PHASES[p]) * ro->count;
  }
  for (int p = 0; p < SB_ROLE_PHASES; p++) bind_real(q, k++, shape ? fl[p] : NAN);
  for (int p = 0; p < 3; p++) bind_real(q, k++, shape ? gf[p] : NAN);
  sqlite3_bind_text(q, k++, now, -1, SQLITE_TRANSIENT);
  SB_SQL(st, sqlite3_step(q), "insert shape_runs");
  *id = sqlite3_last_insert_rowid(st->db);
  sqlite3_finalize(q);
  return 0;
fail:
  sqlite3_finalize(q);
  return 1;
}

/* The shape_roles and shape_comm rows of r's roles. Inside a transaction. */
static int put_shape_roles(sb_store *st, int64_t id, const sb_result *r) {
  sqlite3_stmt *q = NULL, *qc = NULL;
  SB_SQL(st,
         sqlite3_prepare_v2(st->db,
                            "INSERT INTO shape_roles(shape_run_id, role, first_rank, ranks, "
                            "peak_mem_bytes, mem_params_bytes, mem_grads_bytes, "
                            "mem_optimizer_bytes, mem_activations_bytes, flops_forward, "
                            "flops_backward, flops_recompute, flops_optimizer, flops_other, "
                            "gemm_flops_forward, gemm_flops_backward, gemm_flops_recompute, "
                            "kernels_dropped_calls, peak_phase, peak_module, "
                            "peak_fsdp_params_bytes, peak_comm_buffers_bytes, "
                            "reserved_peak_bytes) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
                            "?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            -1, &q, NULL),
         "prepare shape_roles");
  SB_SQL(st,
         sqlite3_prepare_v2(st->db,
                            "INSERT INTO shape_comm(shape_run_id, role, op, mesh_dim, phase, fqn, "
                            "calls, payload_bytes, wire_bytes) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            -1, &qc, NULL),
         "prepare shape_comm");
  for (int i = 0; i < r->n_roles; i++) {
    const sb_role *ro = &r->roles[i];
    sqlite3_reset(q);
    int k = 1;
    sqlite3_bind_int64(q, k++, id);
    sqlite3_bind_int(q, k++, i);
    sqlite3_bind_int(q, k++, ro->rank);
    sqlite3_bind_int(q, k++, ro->count);
    sqlite3_bind_int64(q, k++, ro->peak);
    for (int m = 0; m < 4; m++) sqlite3_bind_int64(q, k++, ro->mem[m]);
    for (int p = 0; p < SB_ROLE_PHASES; p++) sqlite3_bind_double(q, k++, ro->flops[p]);
    for (int p = 0; p < 3; p++) sqlite3_bind_double(q, k++, role_gemm_flops(ro, GEMM_PHASES[p]));
    sqlite3_bind_int64(q, k++, ro->krows_dropped);
    sqlite3_bind_text(q, k++, ro->peak_at.phase, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(q, k++, ro->peak_at.where, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(q, k++, (int64_t)ro->peak_at.note[DT_MEM_NOTE_FSDP_PARAMS]);
    sqlite3_bind_int64(q, k++, (int64_t)ro->peak_at.note[DT_MEM_NOTE_COMM]);
    bind_bytes(q, k++, ro->reserved > 0 ? ro->reserved : -1); /* 0: no allocator model */
    SB_SQL(st, sqlite3_step(q), "insert shape_roles");
    for (int c = 0; c < ro->n_fcomm; c++) {
      const sb_fqn_comm *fc = &ro->fcomm[c];
      sqlite3_reset(qc);
      sqlite3_bind_int64(qc, 1, id);
      sqlite3_bind_int(qc, 2, i);
      sqlite3_bind_text(qc, 3, fc->op, -1, SQLITE_TRANSIENT);
      sqlite3_bind_text(qc, 4, fc->mesh_dim, -1, SQLITE_TRANSIENT);
      sqlite3_bind_text(qc, 5, fc->phase, -1, SQLITE_TRANSIENT);
      sqlite3_bind_text(qc, 6, fc->fqn, -1, SQLITE_TRANSIENT);
      sqlite3_bind_int64(qc, 7, fc->calls);
      sqlite3_bind_int64(qc, 8, fc->payload_bytes);
      sqlite3_bind_double(qc, 9, fc->wire_bytes);
      SB_SQL(st, sqlite3_step(qc), "insert shape_comm");
    }
  }
  sqlite3_finalize(q);
  sqlite3_finalize(qc);
  return 0;
fail:
  sqlite3_finalize(q);
  sqlite3_finalize(qc);
  return 1;
}

int sb_store_put_shape(sb_store *st, const sb_config *c, const char *ac, const sb_result *r) {
  int64_t id = 0;
  SB_SQL(st, sqlite3_exec(st->db, "BEGIN IMMEDIATE", NULL, NULL, NULL), "BEGIN");
  if (put_shape_run(st, c, ac, r, &id) ||
      (!strcmp(r->status, "shape-only") && put_shape_roles(st, id, r))) {
    sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
    return 1;
  }
  SB_SQL(st, sqlite3_exec(st->db, "COMMIT", NULL, NULL, NULL), "COMMIT");
  return 0;
fail:
  sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL); /* no-op when BEGIN failed */
  return 1;
}

int sb_store_has_shape(sb_store *st, const char *key, bool *has) {
  sqlite3_stmt *q = NULL;
  *has = false;
  SB_SQL(st, sqlite3_prepare_v2(st->db, "SELECT 1 FROM shape_runs WHERE key = ? LIMIT 1", -1, &q,
                                NULL),
         "prepare resume lookup");
  sqlite3_bind_text(q, 1, key, -1, SQLITE_TRANSIENT);
  int rc = sqlite3_step(q);
  SB_SQL(st, rc, "resume lookup");
  *has = rc == SQLITE_ROW;
  sqlite3_finalize(q);
  return 0;
fail:
  sqlite3_finalize(q);
  return 1;
}
