/* bench/harness/store.h: the results database (results/schema.sql) for `shardbench run`
 * and `shardbench sweep`.
 *
 * One SQLite file holds many runs. sb_store_open refuses, before writing a
 * single byte, a file that is not a SQLite DB or whose schema_version is not
 * SB_SCHEMA_VERSION; otherwise it creates the schema (the text of
 * results/schema.sql, embedded at build time as bench/harness/schema_sql.h) and inserts
 * the version row. Every config's rows (configs, results, comm) are written in
 * one transaction, so a kill at any moment loses no committed row and leaves no
 * half one. WAL journal and a 30 s busy timeout let two sweeps share one file.
 *
 * This is program code: it returns SB_EXIT_* codes and prints one-line errors.
 */
#ifndef SB_STORE_H
#define SB_STORE_H

#include <stdbool.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>

#include <sqlite3.h>

#include "baselines.h"

/* The schema this program writes (results/schema.sql: schema_version). */
enum { SB_SCHEMA_VERSION = 2 };

typedef struct sb_store {
  sqlite3 *db;
  char path[1024];
  int64_t run_id; /* runs.id of this invocation (0 before sb_store_begin_run) */
} sb_store;

/* One communication row (per step, rank 0's ledger). */
typedef struct sb_comm_row {
  char op[32];
  char mesh_dim[64];
  char phase[16];
  int64_t calls;
  int64_t payload_bytes;
  double wire_bytes;
  double seconds;
} sb_comm_row;

/* What a config is: its canonical key and the configs columns. */
typedef struct sb_config {
  char key[512];
  char workload[32], model[32], plan[64], dtype[8], backend[16];
  int pp, dp_replicate, dp_shard, cp, tp;
  int batch, seq, steps, world;
} sb_config;

/* A config's outcome (results columns; NaN / negative = NULL, see store.c). */
typedef struct sb_result {
  char status[16];               /* ok | mismatch | failed | skipped */
  char reason[512];              /* "" = NULL */
  char worst[160];               /* the compared quantity with the largest error; "" = NULL */
  double step_time_s, tokens_per_s, tflops, mfu, peak_tflops;
  int64_t peak_mem_bytes;        /* < 0: NULL */
  double max_abs_err, max_rel_err, tolerance;
  int n_comm;
  sb_comm_row *comm;             /* n_comm rows (borrowed) */
  sb_plan_traits plan_traits;    /* the plan's settings (sb_execute); the store picks the
                                    framework baselines from them, not from the plan's name */
} sb_result;

/* Fills the NULL markers of a result (NaN for reals, -1 for peak_mem). */
void sb_result_init(sb_result *r);

/* Opens (creating when absent) the DB at path. Returns 0 (SB_EXIT_OK) or
 * SB_EXIT_USAGE (not a DB, another schema version: the file is left untouched)
 * or SB_EXIT_FAIL (an SQLite error), after printing one line on stderr. */
int sb_store_open(sb_store *st, const char *path);
void sb_store_close(sb_store *st);

/* Inserts this invocation's runs row (finished NULL). argv joined by spaces. */
int sb_store_begin_run(sb_store *st, int argc, char **argv, const char *backend, int world);
/* Sets this run's MFU denominator (runs.peak_tflops, NaN = NULL) and where it
 * came from (runs.peak_source). */
int sb_store_set_peak(sb_store *st, double peak_tflops, const char *source);
/* Sets runs.finished. */
int sb_store_end_run(sb_store *st);

/* True when some run already has a result row for this config key. */
int sb_store_has_result(sb_store *st, const char *key, bool *has);

/* Writes config (upsert by key), its result and comm rows in one transaction. */
int sb_store_put(sb_store *st, const sb_config *c, const sb_result *r);

/* "sqlite 3.40.1; mpi yes; cuda yes; ..." for runs.versions. */
void sb_versions_str(char *buf, size_t n);
/* UTC ISO 8601 "2026-01-01T12:00:00Z". */
void sb_utc_now(char *buf, size_t n);


/* ---- the config runner (defined in bench/harness/run.c, shared by run and sweep) ---- */

/* TorchTitan's mesh dims in mesh order (torchtitan-llama.md 3.1). */
enum { SB_NDIMS = 5 };
extern const char *const sb_dim_names[SB_NDIMS]; /* pp dp_replicate dp_shard cp tp */

typedef struct sb_opts {
  char model[32], workload[32], plan[64], plans_dir[768];
  int dims[SB_NDIMS];            /* pp, dp_replicate, dp_shard, cp, tp */
  char dtype[8];
  int batch, seq, steps, warmup;
  char backend[16];
  int world;
  double peak_tflops;            /* <= 0: measured (sb_default_peak_tflops) */
  bool quiet;                    /* no per-config summary on stdout */
} sb_opts;

/* The unsharded reference of one (model, workload, dtype, batch, seq, steps):
 * cached by the sweep across configs (same seed and data for every plan). */
typedef struct sb_ref {
  char key[256];                 /* "" = empty */
  int n_steps;
  double *loss;                  /* n_steps */
  int n_mods;
  double **grad;                 /* step 0, per module (NULL: no weight) */
  int64_t *numel;
} sb_ref;
void sb_ref_free(sb_ref *r);

/* The canonical key and configs columns of o. */
void sb_config_fill(const sb_opts *o, sb_config *c);
/* Runs one config (skipping it, with the reason, when unsupported), filling r
 * (r->comm malloc'd: free it). Never exits; failures are r->status "failed".
 * The reference is computed into cache unless cache already holds it.
 * prepare_only: only the checks and the reference; r->status stays "" when
 * the config would run (the sweep then runs it in a child process). */
void sb_execute(const sb_opts *o, sb_ref *cache, bool prepare_only, sb_result *r);
/* Prints a readable summary of a result (or JSON). */
void sb_print_result(FILE *f, const sb_config *c, const sb_result *r, bool json);
/* The plans directory: flag (may be NULL), then bench/harness/datadir.h's
 * rules; the installed one when none holds *.plan files. */
void sb_plans_dir(const char *flag, char *out, size_t n);
/* A measured single-core sgemm peak x min(world, online CPUs), TFLOP/s. */
double sb_default_peak_tflops(int world);

#endif
