/* bench/harness/store.h: the results database (results/schema.sql) for `shardbench run`
 * and `shardbench sweep`.
 *
 * One SQLite file holds many runs. Every command opens its --db through this
 * file. sb_store_open refuses, before writing a single byte, a path that is no
 * DB file (empty, ":memory:", a directory, a missing directory), a file that is
 * not a SQLite DB, another application's SQLite DB, or a schema_version outside
 * 1 to SB_SCHEMA_VERSION; otherwise it creates the schema (the text of
 * results/schema.sql, embedded at build time as bench/harness/schema_sql.h),
 * inserts the version row and upgrades an older DB. Every config's rows (configs, results,
 * comm, pp_*; a shape-only run's shape_runs, shape_roles, shape_comm) are written in one
 * transaction, so a kill at any moment loses no committed row and leaves no
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

#include "dtensor.h"
#include "baselines.h"
#include "verdict.h"

/* The schema this program writes (results/schema.sql: schema_version). */
enum { SB_SCHEMA_VERSION = 7 };

typedef struct sb_store {
  sqlite3 *db;
  char path[1024];
  int version;    /* the DB's schema_version, 1 to SB_SCHEMA_VERSION (a reader's older DB) */
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
  char workload[32], model[96], plan[64], dtype[8], backend[16];
  int pp, dp_replicate, dp_shard, cp, tp;
  int batch, seq, steps, world;
} sb_config;

/* A pipelined config's timeline (results/schema.sql: pp_events, pp_stats,
 * pp_stages), gathered from every rank by bench/harness/run.c. */
typedef struct sb_pp_event {
  int step;                      /* the timed step, 0-based (warm-up steps are not kept) */
  int rank, pp_rank;             /* global rank; its coordinate on the pp dim */
  int kind;                      /* dt_pp_kind: F, B, SEND_F, RECV_F, SEND_B, RECV_B */
  int stage, mb;
  double t0, t1;                 /* seconds from the step's start (pp_events) */
} sb_pp_event;

typedef struct sb_pp_stage {     /* one pp rank (stage group), over its ranks and the steps */
  int max_in_flight;             /* (stage, microbatch) forwards whose backward has not run */
  int64_t peak_act_bytes;        /* host peak during the pipelined step above its start */
  double busy_s;                 /* F + B seconds per step, mean */
  double bubble;                 /* 1 - busy / span, mean */
} sb_pp_stage;

typedef struct sb_pp_timeline {
  char schedule[32];             /* dt_pp_schedule_kind_str */
  int pp, virtual_stages, microbatches, steps;
  double bubble_measured, bubble_analytic, span_s; /* pp_stats; analytic NaN: no formula */
  sb_pp_stage stages[DT_PP_MAX_RANKS];             /* [pp] */
  int n_events;
  sb_pp_event events[];          /* n_events, by step, rank, then execution order */
} sb_pp_timeline;

/* One comm row of a shape-only role per (op, mesh dim, phase, fqn): results/schema.sql's
 * shape_comm. */
typedef struct sb_fqn_comm {
  char op[32];
  char mesh_dim[DT_LABEL_LEN];
  char phase[16];
  char fqn[DT_LABEL_LEN];        /* the ledger row's scope: module fqn or caller label */
  int64_t calls;
  int64_t payload_bytes;
  double wire_bytes;
} sb_fqn_comm;

/* Bytes of a timeline with n events. */
size_t sb_pp_timeline_bytes(int n_events);

/* One role of a shape-only run (--device meta): a rank that ran for `count`
 * ranks alike (dt_parallel_dims_roles), its step's memory split and peak, its
 * comm ledger per (op, mesh dim, phase) and its compute ledger per phase. */
enum { SB_ROLE_MAX_COMM = 64, SB_ROLE_PHASES = 5, SB_ROLE_MAX_KROWS = 1 << 16 };

/* One compute-ledger row of a role (dt_kledger_row without the scope): per call
 * flops and bytes (read + written), and the calls. */
typedef struct sb_krow {
  char op[24];
  char phase[16];
  int dtype;                     /* dt_dtype */
  int64_t m, n, k, batch;        /* GEMM shape (0 for other kernels) */
  double flops, bytes;
  int64_t calls;
} sb_krow;
/* forward backward recompute optimizer other */
extern const char *const sb_role_phases[SB_ROLE_PHASES];
typedef struct sb_role {
  int rank, count;
  int64_t mem[4];                /* params, grads, optimizer, activations (as results.mem_*) */
  int64_t peak;                  /* the step's device peak */
  int64_t reserved;              /* the step's peak of the caching allocator's segments
                                  * (the meta device's model of PyTorch's); 0: none */
  dt_mem_peak_at peak_at;        /* where in the step it was reached, and what of it FSDP's
                                  * unsharded parameters and the collectives' buffers held */
  double flops[SB_ROLE_PHASES], bytes[SB_ROLE_PHASES]; /* compute ledger sums per phase */
  double gemm_flops;             /* of which GEMMs (all phases) */
  int n_comm;
  sb_comm_row comm[SB_ROLE_MAX_COMM];
  /* the compute ledger merged per (op, phase, dtype, GEMM shape, per-call cost), in
   * first-seen order (malloc'd, owned by the role: sb_roles_free); krows_dropped counts
   * the calls of rows beyond SB_ROLE_MAX_KROWS or a failed allocation (their flops and
   * bytes are in the sums above all the same) */
  sb_krow *krows;
  int n_krows, cap_krows;
  int64_t krows_dropped;
  /* the comm ledger per (op, mesh dim, phase, fqn), in first-seen order (malloc'd,
   * owned by the role); summed over fqn it is comm[] (which stops at SB_ROLE_MAX_COMM
   * rows, this does not) */
  sb_fqn_comm *fcomm;
  int n_fcomm, cap_fcomm;
} sb_role;

/* What a shape-only run knows beside its roles, for the time model
 * (bench/harness/timemodel.h): which role each world rank has, the pipeline's
 * compute order, and the model's per-token FLOPs. */
typedef struct sb_shape_facts {
  int world;
  int *role_of;                  /* world entries: the role of each rank (malloc'd; NULL: none) */
  int pp, pp_v, pp_m;            /* pp ranks, stages per rank, microbatches (pp 1: no pipeline) */
  int pp_kind;                   /* dt_pp_schedule_kind */
  int *pp_len;                   /* pp entries: F and B actions of each pp rank (malloc'd) */
  dt_pp_action *pp_acts;         /* those actions, rank after rank, in execution order */
  double flops_per_token;        /* dt_llama_flops_per_token (TorchTitan's MFU count) */
  int64_t vocab, dim;            /* the model's vocabulary and hidden size */
  int64_t tokens_per_step;       /* the tokens the run itself stepped over (its --global-batch,
                                  * else its batch, x seq); sb_tm_features.accum_steps counts
                                  * the microsteps beyond it */
} sb_shape_facts;

/* A config's outcome (results columns; NaN / negative = NULL, see store.c). */
typedef struct sb_result {
  char status[16];               /* ok | mismatch | failed | skipped | shape-only (--device
                                  * meta: never stored with the measured results) */
  char reason[512];              /* "" = NULL */
  char worst[160];               /* the compared quantity with the largest error relative to
                                  * its tolerance (bench/harness/verdict.h); "" = NULL */
  double step_time_s, tokens_per_s, tflops, mfu, peak_tflops;
  char peak_source[96];          /* where peak_tflops came from (sb_opts.peak_source) */
  int64_t peak_mem_bytes;        /* < 0: NULL */
  /* bytes of device buffers the comm layer copied through host memory per timed
   * step, summed over the ranks (dt_ledger.staged_bytes; --json only, not
   * stored); < 0: not measured */
  int64_t host_staged_bytes;
  /* rank 0's memory split (< 0: NULL; results.mem_*_bytes), measured from the tensors in the last timed
   * step: its weights (the sharded master under FSDP), their gradients after the
   * data-parallel reduction, AdamW's two states; and the rest of that step's peak
   * (activations, FSDP's gathered copies, communication buffers) */
  int64_t mem_params_bytes, mem_grads_bytes, mem_optimizer_bytes, mem_activations_bytes;
  dt_mem_peak_at peak_at;        /* rank 0, last timed step: where it peaked (phase "": none) */
  double est_mem_bytes;          /* estimated peak per rank (sb_mem_estimate; NaN: none) */
  double est_need_bytes;         /* estimated memory of the whole invocation (NaN: none) */
  bool mem_refused;              /* skipped: est_need_bytes over sb_opts.mem_limit */
  bool weights_saved;            /* sb_opts.save_weights written */
  double grad_norm;              /* the last timed step's total gradient norm (clip_grad_norm_,
                                  * rank 0); NaN: the run does not clip */
  double max_abs_err, max_rel_err, tolerance;
  int64_t n_compared;            /* quantities the verdict compared (sb_cmp.n); 0: none */
  int n_comm;
  sb_comm_row *comm;             /* n_comm rows (borrowed) */
  sb_plan_traits plan_traits;    /* the plan's settings (sb_execute); the store picks the
                                    framework baselines from them, not from the plan's name */
  sb_pp_timeline *pp;            /* pipelined configs: the timeline (malloc'd, NULL: none) */
  int n_roles;                   /* shape-only: the roles run (malloc'd, NULL: none) */
  sb_role *roles;
  sb_shape_facts shape;          /* shape-only: what the time model reads beside the roles */
} sb_result;

/* Frees n roles and what each owns. */
void sb_roles_free(sb_role *roles, int n);

/* Fills the NULL markers of a result (NaN for reals, -1 for peak_mem and the split). */
void sb_result_init(sb_result *r);
/* Frees what a result owns (comm, pp) and sets them NULL. */
void sb_result_free(sb_result *r);

/* Opens (creating when absent) the DB at path for writing. Returns 0
 * (SB_EXIT_OK), or SB_EXIT_USAGE (bad input: the file is left untouched, nothing
 * is created beside it) or SB_EXIT_FAIL (an SQLite error on a valid DB) after
 * printing one line on stderr: "shardbench CMD: --db: 'PATH': reason". */
int sb_store_open(sb_store *st, const char *path, const char *cmd);
/* Opens an existing DB of schema version 1 to SB_SCHEMA_VERSION read-only
 * (st->version says which; a version 1 DB lacks runs.peak_tflops,
 * runs.peak_source and results.worst, a version 1 or 2 DB the results.mem_*_bytes
 * split, a version 1 to 3 DB the pp_* tables, a version 1 to 5 DB the shape_* tables,
 * a version 6 DB shape_roles.reserved_peak_bytes).
 * Writes nothing, and creates no -wal or
 * -shm where none exists or where the directory is read-only (the DB is then
 * read immutable). Same returns and messages as sb_store_open. */
int sb_store_open_read(sb_store *st, const char *path, const char *cmd);
void sb_store_close(sb_store *st);
/* The SQLite URI that reads path as sb_store_open_read does (for ATTACH on a
 * connection opened with SQLITE_OPEN_URI): "file:PATH?mode=ro", or
 * "?immutable=1" for a WAL DB whose -shm could not be made or has no -wal. */
void sb_store_ro_uri(const char *path, char *uri, size_t n);

/* Inserts this invocation's runs row (finished NULL): argv joined by spaces, the
 * MFU denominator of all its results (peak_tflops <= 0 or NaN: NULL) and where
 * it came from. */
int sb_store_begin_run(sb_store *st, int argc, char **argv, const char *backend, int world,
                       double peak_tflops, const char *peak_source);
/* Sets runs.finished. */
int sb_store_end_run(sb_store *st);

/* True when some run already has a result row for this config key. */
int sb_store_has_result(sb_store *st, const char *key, bool *has);

/* The configs rows of cs (n of them; those already there kept) in one
 * transaction: a sweep's whole list before its first config runs, so that a
 * config without a result is one still to run (`shardbench status`). */
int sb_store_plan_configs(sb_store *st, const sb_config *cs, int n);
/* Writes config (upsert by key), its result, comm rows and (pipelined) its
 * pp_stats, pp_stages and pp_events rows in one transaction. */
int sb_store_put(sb_store *st, const sb_config *c, const sb_result *r);
/* A shape-only outcome (--device meta: r->status shape-only, or skipped / failed):
 * its shape_runs row (c's key and columns, ac its activation checkpointing as
 * dt_ac_str) and, when shape-only, its shape_roles and shape_comm rows, in one
 * transaction. Nothing goes to configs or results. */
int sb_store_put_shape(sb_store *st, const sb_config *c, const char *ac, const sb_result *r);
/* True when some run already has a shape_runs row for this config key. */
int sb_store_has_shape(sb_store *st, const char *key, bool *has);
/* Inside a write transaction the caller holds: the configs row of c, inserted
 * when new; its id into *id. */
int sb_store_config_id(sb_store *st, const sb_config *c, int64_t *id);
/* Inside a write transaction the caller holds: the baselines rows of config_id
 * replaced by rows (config_id <= 0: rows linked to no config, added). */
int sb_store_put_baselines(sb_store *st, int64_t config_id, const sb_baseline_row *rows, int n);

/* "sqlite 3.40.1; mpi yes; cuda yes; ..." for runs.versions. */
void sb_versions_str(char *buf, size_t n);
/* UTC ISO 8601 "2026-01-01T12:00:00Z". */
void sb_utc_now(char *buf, size_t n);


/* ---- the config runner (defined in bench/harness/run.c, shared by run and sweep) ---- */

/* TorchTitan's mesh dims in mesh order (torchtitan/distributed/parallel_dims.py,
 * ParallelDims.build_mesh: pp, dp_replicate, dp_shard, cp, tp). */
enum { SB_NDIMS = 5 };
/* Most timed (and most warm-up) steps of a config: a sanity bound on a flag; the
 * memory check bounds what the reference keeps per step. */
enum { SB_MAX_STEPS = 500 };
extern const char *const sb_dim_names[SB_NDIMS]; /* pp dp_replicate dp_shard cp tp */
/* "dp_replicate:2,tp:4" into dims (TorchTitan's order, all others 1); "1" for one
 * rank. 0, or -1 with the reason in err (bench/harness/run_cmd.c). */
int sb_parse_mesh_named(const char *s, int dims[SB_NDIMS], char *err, size_t errn);
/* --device VALUE and --dtype DTYPE (run and sweep): cpu, cuda (a CUDA build and
 * a visible GPU) or cuda-emu (always); bf16 only off the CPU (the host ops are
 * f32 and f64). 0, or -1 with the flag at fault and the reason (bench/harness/run_cmd.c). */
int sb_check_device(const char *device, const char *dtype, const char **flag, char *err,
                    size_t errn);

typedef struct sb_opts {
  char model[96], workload[32];
  char plan[64];                 /* the plan's name (its file's base name without .plan) */
  char plan_path[1024];          /* its file (sb_plan_locate) */
  int dims[SB_NDIMS];            /* pp, dp_replicate, dp_shard, cp, tp */
  char dtype[8];
  int batch, seq, steps, warmup;
  char backend[16];
  char comm[8];                  /* the world's transport: "host" or "nccl" (dt_comm_kind) */
  char device[16];               /* cpu, cuda or cuda-emu (the sharded job's ranks) */
  int world;
  double peak_tflops;            /* MFU denominator, measured once per invocation; <= 0: none */
  char peak_source[96];          /* "--peak-tflops" or how it was measured */
  double mem_limit;              /* bytes a config may need (sb_mem_estimate); 0: no check */
  char mem_limit_src[64];        /* where mem_limit came from, for messages */
  /* weights files (run only; "" = none): both jobs start from load_weights
   * (checked up front); the sharded job writes its initial weights to
   * save_weights as weights_dtype under weights_names */
  char load_weights[1024], save_weights[1024];
  dt_dtype weights_dtype;
  dt_weight_names weights_names;
  bool pin_ranks;                /* --pin-ranks: dt_launch_opts.bind (threads backend) */
  /* the sharded job's activation checkpointing: --ac, else the plan's
   * activation_checkpoint_mode (sb_plan_ac); the reference runs without */
  dt_ac_config ac;
  /* the training recipe (both jobs run it): gradient clipping at max_norm (--max-norm,
   * else the plan's max_norm; 0: none) and the lr schedule (--lr-*; its training_steps
   * is set to warmup + steps when one is given, 0: a constant lr) */
  double max_norm;
  dt_lr_schedule lr;
  int global_batch;              /* --global-batch: gradient accumulation to this many
                                  * sequences per step (a multiple of batch, the
                                  * per-microstep batch over every dp rank); 0: batch */
} sb_opts;

/* The unsharded reference of one (model, workload, dtype, batch, seq, steps):
 * cached by the sweep across configs (same seed and data for every plan). What
 * it keeps and what that costs: bench/harness/verdict.h. */
typedef struct sb_ref {
  char key[1400];                /* "" = empty */
  sb_snap snap;                  /* every step's loss and gradients, the final weights */
} sb_ref;
void sb_ref_free(sb_ref *r);

/* `run --save-trace`: the reference snapshot snap of config o (its token batches
 * regenerated) to path as safetensors (bench/harness/trace.c says what is in it).
 * 0, or -1 with the reason in err (nothing left at path). */
int sb_trace_write(const sb_opts *o, const sb_snap *snap, const char *path, char *err,
                   size_t errn);

/* The canonical key and configs columns of o. */
void sb_config_fill(const sb_opts *o, sb_config *c);
/* How far sb_execute goes: the checks only (pp, dp_shard, cp, workload, the plan
 * against the mesh and the model, the memory estimate against o->mem_limit; no
 * work), the checks and the reference, or the whole config. */
typedef enum sb_stage { SB_STAGE_CHECK, SB_STAGE_PREPARE, SB_STAGE_RUN } sb_stage;
/* Runs one config (skipping it, with the reason, when unsupported), filling r
 * (r->comm and r->pp malloc'd: sb_result_free). Never exits; failures are r->status "failed".
 * The reference is computed into cache unless cache already holds it (cache
 * may be NULL for SB_STAGE_CHECK). Before SB_STAGE_RUN r->status stays "" when
 * the config would run (the sweep then runs it in a child process). */
void sb_execute(const sb_opts *o, sb_ref *cache, sb_stage stage, sb_result *r);
/* TEST SWITCH: validates $SHARDBENCH_FAULT (the fault injection of bench/harness/run.c;
 * unset: nothing). Returns 0, or SB_EXIT_USAGE after the one-line error when it is
 * malformed; when set and warn, prints one warning line naming the fault. */
int sb_fault_check(const char *cmd, bool warn);
/* Prints a readable summary of a result (or JSON). */
void sb_print_result(FILE *f, const sb_config *c, const sb_result *r, bool json);
/* ---- plans, peak and memory (bench/harness/run_cmd.c, memory.c), shared by run and sweep ---- */

/* The plans directory: flag (may be NULL), then bench/harness/datadir.h's
 * rules; the installed one when none holds *.plan files. */
void sb_plans_dir(const char *flag, char *out, size_t n);
/* The file of --plan ARG: ARG itself when it is a path (contains a '/' or ends
 * in .plan), else DIR/ARG.plan; name gets the file's base name without .plan.
 * -1 (reason in err) when a name or path is too long or the name is empty. */
int sb_plan_locate(const char *dir, const char *arg, char *path, size_t pn, char *name, size_t nn,
                   char *err, size_t errn);
/* The --model / --workload names run and sweep take: 0, or the one-line error
 * (cmd, flag) printed and SB_EXIT_USAGE. */
int sb_check_model(const char *cmd, const char *flag, const char *model);
int sb_check_workload(const char *cmd, const char *flag, const char *workload);
/* A plan error for the user: the library's "rank R: dt_plan_xxx: " prefix off,
 * so that it starts with FILE:LINE. Points into m. */
const char *sb_plan_msg(const char *m);
/* Loads the plan file and checks it against the module fqns of every model in
 * models (n of them; full depth): "FILE:LINE:COL: ..." for a syntax error,
 * "FILE:LINE: pattern '...' matches no module" for a typo. 0, or the one-line
 * error printed naming flag and SB_EXIT_USAGE. */
/* --ac MODE[:OPTION] (TorchTitan's activation_checkpoint mode and
 * selective_ac_option: none, full, selective[:op|:N]) into out: 0, or the one-line
 * error (cmd, flag) printed and SB_EXIT_USAGE. */
int sb_parse_ac(const char *cmd, const char *flag, const char *s, dt_ac_config *out);
/* The activation checkpointing a (validated) plan file asks for; none when it
 * cannot be read. */
void sb_plan_ac(const char *path, dt_ac_config *out);
int sb_plan_validate(const char *cmd, const char *flag, const char *path, const char *const *models,
                     int n);
/* A measured single-core sgemm rate x min(world, online CPUs), TFLOP/s, with
 * how it was measured in source. Call once per invocation. */
double sb_default_peak_tflops(int world, char *source, size_t n);
/* The same for the ranks' device: --device cuda measures the GPU (a 4096^3
 * GEMM of dtype), any other device the CPU as above. */
double sb_default_peak_tflops_on(int world, const char *device, const char *dtype, char *source,
                                 size_t n);
/* The MFU peak and memory limit flags of run and sweep into o: --peak-tflops
 * (NULL: o->peak_tflops stays 0, for sb_default_peak_tflops once the input is
 * checked), --mem-limit (NULL: the machine's available memory), --no-mem-check.
 * 0 or the one-line error's SB_EXIT_USAGE. */
int sb_limits_from_flags(const char *cmd, const char *peak_s, const char *mem_s, bool no_mem_check,
                         sb_opts *o);

/* A config's estimated memory (bench/harness/memory.c). */
typedef struct sb_mem_est {
  double rank_bytes;             /* one rank's peak, the quantity of results.peak_mem_bytes */
  double need_bytes;             /* the invocation on this machine (every rank, the reference) */
} sb_mem_est;
/* Estimates o with its resolved plan (dt_parallel_plan_resolve; NULL: none); -1 for an
 * unknown model or dtype. */
int sb_mem_estimate(const sb_opts *o, const dt_parallel_plan *plan, sb_mem_est *e);
/* Bytes the machine can give now: MemAvailable of /proc/meminfo, else
 * sysconf's available pages; src says which. NaN when neither is known. */
double sb_mem_available(char *src, size_t n);
/* "1.50 GiB" (from 1 GiB up) or "12.00 MiB". */
void sb_bytes_str(double bytes, char *buf, size_t n);

#endif
