/* bench/harness/run.c: the config runner (sb_execute) that `shardbench run` and `sweep`
 * share; the run command itself (flags, checks, DB, printing) is
 * bench/harness/run_cmd.c.
 *
 * A config is (model, workload, plan, mesh over TorchTitan's five dims pp,
 * dp_replicate, dp_shard, cp, tp, dtype, batch, seq, steps, backend, world).
 * The mesh keeps only the dims of size > 1, in that order (but for FSDP + TP,
 * below), with their names (TorchTitan's torchtitan/distributed/parallel_dims.py
 * ParallelDims). Workloads: `model` is the config's layers, `block` the same model
 * with one layer; the single-layer workloads run one layer type alone, with only
 * its modules (sb_workload_config: the others are not created, so the weights,
 * memory, comm and FLOPs are that layer type's):
 *   embedding     tok_embeddings: tokens -> y [b, s, dim];
 *   attention     y = x + attention(attention_norm(x)), one layer's (sdpa_cp under cp);
 *   feed_forward  y = x + feed_forward(ffn_norm(x));
 *   output        norm + output + the model's cross-entropy against the targets.
 * x is an N(0, 1) activation [b, s, dim] drawn from the seed (wl_normal: the same
 * values on every rank and in the reference, new ones each step), N(0, 1) as
 * tok_embeddings' init makes layer 0's input, placed as the model's layers receive
 * it: Shard(0) on the dp dims, Shard(1) on cp in its storage order, on tp what the
 * plan's tok_embeddings style puts out (Shard(1) under sequence parallel, else
 * Replicate), so the layer's comm is the one a layer of the model does. The ones
 * without the head train on L = mean(y * R), R a fixed N(0, 1) [b, s, dim] tensor
 * placed like y: a linear probe, whose gradient dL/dy = R / N does not depend on
 * y, so every weight's gradient is the layer's own backward, not a function of
 * its forward error, and the loss is sharding-invariant (mean over every element,
 * for any placement: P(avg)/Shard reduce in the op). 0.5 mean(y^2) was the other
 * choice: its value is dominated by the residual x, not the layer. The plan is
 * resolved against the whole layer (sb_workload_whole: a typo is still an error);
 * its entries that match no module of the workload are left out. pp > 1 is
 * skipped (one layer has no stages to split).
 * The plan's [tp] entries go on the tp dim (dt_parallelize_module);
 * a dp_replicate dim without FSDP adds data parallel (dt_data_parallel_reduce_grads,
 * DDP's buckets, the plan's bucket_cap_mb), as TorchTitan composes DDP with TP.
 * Tokens are Shard(0) on the dp dims, Shard(1) on cp and Replicate on tp.
 *
 * Verification (bench/harness/verdict.c, shared with verify/test_parallel.c): the
 * same model on a 1-rank mesh (same seed, weights are sharding-invariant; same
 * token batches) is the reference; every step's loss and every weight gradient
 * (warm-up steps included; reduced and gathered) and every weight after the last
 * step are compared normwise (max |a - b| / max |ref|) on every rank, against
 * sb_tolerance (2^10 u before the first optimizer update, 2^17 u after: the
 * derivation and the measured spreads are there). Verdict: ok or mismatch, and
 * in both cases the worst quantity's name (sb_result.worst, e.g.
 * "layers.0.attention.wq.weight grad step 1"). SHARDBENCH_FAULT (a test switch,
 * below) injects a fault into the sharded job so that a test can see it fail.
 *
 * Measures (per timed step, after --warmup steps): step time = forward + loss +
 * backward + DP grad reduce + AdamW + end_step, the max over ranks, median over
 * the timed steps; tokens/s = batch*seq / step time; TFLOP/s by TorchTitan's
 * flops_per_token (torchtitan/models/utils.py get_dense_model_nparams_and_flops;
 * over the workload's modules, dt_llama_flops_per_token: the embedding alone counts
 * 0, a lookup) x tokens / step time; MFU = that / the invocation's peak (o->peak_tflops:
 * --peak-tflops, or a single-core sgemm rate x min(world, online CPUs) measured
 * once per run or sweep and stored on its runs row; under MPI on several nodes
 * pass --peak-tflops); peak host memory = max over ranks of
 * *mem_peak(ctx); comm rows from rank 0's ledger over the timed steps,
 * per step.
 *
 * FSDP: a plan's [dp_shard] fully_shard entries go on the dp_shard dim
 * (dt_fully_shard: FSDP2, HSDP with dp_replicate, ZeRO-1/2/3, mixed precision);
 * the tokens are Shard(0) over dp_replicate x dp_shard; with tp too the mesh
 * orders tp before dp_shard (same groups as TorchTitan's, a permuted world), so
 * FSDP splits TP's local block. The verdict's tolerance follows the plan's
 * parameter dtype (sb_tolerance_params).
 *
 * Context parallel (a cp dim): dt_context_parallel with the plan's rotate method
 * and load balancing; the tokens and targets in its storage order, Shard(1) on cp
 * (sb_token_tensor_cp); FSDP shards over dp_shard x cp (TorchTitan's dp_shard_cp,
 * also when dp_shard is 1), DDP all-reduces over dp_replicate x cp (dp_cp). The
 * mesh keeps TorchTitan's order then (sequence parallel nests in cp's chunks).
 *
 * Pipeline parallel (a pp dim): the plan's schedule (generated or from its CSV) over
 * each data-parallel rank's batch cut into microbatches of the plan's size, the
 * stages split as TorchTitan does (pipe_build, dt_pipeline_step); the loss and
 * every weight's gradient are shared from their stage's rank for the verifier
 * (dt_pipeline_share; each rank's optimizer then trains its own stages only). A rank
 * holds only its stages' weights (dt_pipeline_release_foreign after build_model and
 * save_weights; the final check shares the others' in, then releases them again), so
 * the memory split and the peak count this rank's stages.
 * Every rank's timeline of each timed step (dt_pipeline_step's events) and its host
 * peak during the step go to rank 0 after the run (pipe_gather), which derives the
 * measured bubble and the per-stage figures of results/schema.sql's pp_* tables.
 *
 * FSDP inside pipeline stages (fully_shard entries with pp > 1): dt_pipeline_step
 * gathers each unit once per step and reduce-scatters it after its stage's last
 * backward (dt_fsdp_pipeline_begin); that reduction precedes dt_pipeline_share.
 *
 * Unsupported (status skipped, with the reason): fully_shard(reshard_after_forward=True)
 * with pp > 1, a pp plan on pp = 1, a batch the microbatches or a model the stages
 * do not divide, a single-layer workload on pp > 1, a plan whose dims do not fit the
 * mesh, a plan with [tp] entries on a
 * mesh without tp or fully_shard entries without dp_shard or cp (TorchTitan applies
 * TP and FSDP only when their dims are > 1; the run would be the dp plan's), a
 * dp_shard dim without fully_shard entries, anything dt_plan_resolve refuses
 * (heads or seq not divisible by tp), a batch not divisible by dp_replicate.
 */
#include "config.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "store.h"
#include "verdict.h"
#include "../stats.h"

const char *const sb_dim_names[SB_NDIMS] = {"pp", "dp_replicate", "dp_shard", "cp", "tp"};

/* The memory a run measures: the rank's device memory when it computes on a
 * device (its arrays live there; the host holds only the run's bookkeeping),
 * else host memory. */
static bool on_device(const dt_ctx *ctx) { return ctx->device && ctx->device->kind != DT_DEV_CPU; }
static size_t *mem_peak(dt_ctx *ctx) {
  return on_device(ctx) ? &ctx->mem.dev_peak : &ctx->mem.host_peak;
}
static size_t *mem_cur(dt_ctx *ctx) { return on_device(ctx) ? &ctx->mem.dev_cur : &ctx->mem.host_cur; }

/* Weights are generated from this seed on both sides; any fixed value works. */
static const uint64_t SEED = 20260101;
/* A collective waiting longer than this fails the config instead of hanging the
 * sweep: a debugmodel step on 2 cores takes seconds. */
static const double LAUNCH_TIMEOUT_S = 300;
/* Most comm rows (op x group x phase) kept per config. */
enum { MAX_COMM = 64 };

/* ---- small helpers ---------------------------------------------------------- */

void sb_ref_free(sb_ref *r) {
  sb_snap_free(&r->snap);
  memset(r, 0, sizeof *r);
}

static void mesh_str(const int dims[SB_NDIMS], char *buf, size_t n) {
  size_t k = 0;
  buf[0] = '\0';
  for (int i = 0; i < SB_NDIMS; i++)
    if (dims[i] > 1 && k < n)
      k += (size_t)snprintf(buf + k, n - k, "%s%s:%d", k ? "," : "", sb_dim_names[i], dims[i]);
  if (!k) snprintf(buf, n, "1"); /* a 1-rank job: no dim of size > 1 */
}

void sb_config_fill(const sb_opts *o, sb_config *c) {
  memset(c, 0, sizeof *c);
  char mesh[128];
  mesh_str(o->dims, mesh, sizeof mesh);
  /* the device joins the key only off the CPU, so a CPU config keeps the key
   * (and the DB row) it always had */
  const bool dev = o->device[0] && strcmp(o->device, "cpu");
  snprintf(c->key, sizeof c->key,
           "model=%s workload=%s plan=%s mesh=%s dtype=%s batch=%d seq=%d steps=%d backend=%s "
           "world=%d%s%s",
           o->model, o->workload, o->plan, mesh, o->dtype, o->batch, o->seq, o->steps, o->backend,
           o->world, dev ? " device=" : "", dev ? o->device : "");
  snprintf(c->workload, sizeof c->workload, "%s", o->workload);
  snprintf(c->model, sizeof c->model, "%s", o->model);
  snprintf(c->plan, sizeof c->plan, "%s", o->plan);
  snprintf(c->dtype, sizeof c->dtype, "%s", o->dtype);
  snprintf(c->backend, sizeof c->backend, "%s", o->backend);
  c->pp = o->dims[0];
  c->dp_replicate = o->dims[1];
  c->dp_shard = o->dims[2];
  c->cp = o->dims[3];
  c->tp = o->dims[4];
  c->batch = o->batch;
  c->seq = o->seq;
  c->steps = o->steps;
  c->world = o->world;
}

/* ---- TEST SWITCH: fault injection (verify/fault.sh) ------------------------------ *
 * SHARDBENCH_FAULT makes the sharded job wrong on purpose, so that a test can watch
 * the verdict fail end to end. Never set it in normal use; when set, the program
 * says so on stderr (sb_fault_check). PARAM is a parameter as `worst` names it
 * ("layers.0.attention.wq.weight"):
 *   skip-reduce:PARAM        PARAM's gradient skips the data-parallel reduction:
 *                            each dp_replicate replica keeps its own partial
 *                            gradient as the whole one (DDP with that parameter's
 *                            bucket never reduced); under FSDP each dp_shard rank
 *                            keeps its own chunk of its partial gradient (the
 *                            unit's reduce_scatter skipped for it). No effect
 *                            without dp_replicate or dp_shard.
 *   perturb-grad:PARAM:RANK  after the reduce, world rank RANK's local shard of
 *                            PARAM's gradient gets 1e-3 x the shard's largest
 *                            magnitude added to every element (a small bug: 16x
 *                            the f32 tolerance before the first update).
 * The reference job never sees a fault. */
typedef enum fault_kind { FAULT_NONE = 0, FAULT_SKIP_REDUCE, FAULT_PERTURB_GRAD } fault_kind;
typedef struct fault {
  fault_kind kind;
  char param[SB_PARAM_NAME_LEN];
  int rank;
} fault;
static const double FAULT_PERTURB = 1e-3;

/* The fault in s (NULL or "": none); -1 with a reason in err when s is malformed. */
static int fault_parse(const char *s, fault *f, char *err, size_t errn) {
  memset(f, 0, sizeof *f);
  if (!s || !s[0]) return 0;
  const char *param = strchr(s, ':'), *rank = NULL;
  if (param && (size_t)(param - s) == strlen("skip-reduce") && !strncmp(s, "skip-reduce", 11)) {
    f->kind = FAULT_SKIP_REDUCE;
  } else if (param && (size_t)(param - s) == strlen("perturb-grad") &&
             !strncmp(s, "perturb-grad", 12)) {
    f->kind = FAULT_PERTURB_GRAD;
    rank = strchr(param + 1, ':');
  }
  size_t pl = !param ? 0 : rank ? (size_t)(rank - param - 1) : strlen(param + 1);
  if (f->kind == FAULT_NONE || (f->kind == FAULT_PERTURB_GRAD && !rank) || pl == 0 ||
      pl >= sizeof f->param || memchr(param + 1, ':', pl)) {
    snprintf(err, errn, "expected skip-reduce:PARAM or perturb-grad:PARAM:RANK, got '%s'", s);
    return -1;
  }
  long r = 0;
  if (rank && sb_parse_long(rank + 1, 0, SB_MAX_WORLD - 1, &r, err, errn) != DT_OK) return -1;
  memcpy(f->param, param + 1, pl);
  f->param[pl] = '\0';
  f->rank = (int)r;
  return 0;
}

int sb_fault_check(const char *cmd, bool warn) {
  const char *s = getenv("SHARDBENCH_FAULT");
  fault f;
  char err[SB_ERR_LEN];
  if (fault_parse(s, &f, err, sizeof err))
    return sb_usage_error(cmd, "SHARDBENCH_FAULT", "%s", err);
  if (f.kind != FAULT_NONE && warn)
    fprintf(stderr, "shardbench %s: warning: SHARDBENCH_FAULT=%s: a fault is injected on purpose "
                    "(test switch); the verdict should fail\n", cmd, s);
  return SB_EXIT_OK;
}

/* The module whose weight is the fault's parameter; NULL (and an error) when none. */
static dt_module *fault_module(dt_ctx *ctx, dt_model *m, const fault *f) {
  for (int i = 0; i < m->n_mods; i++) {
    size_t l = strlen(m->mods[i].fqn);
    if (m->mods[i].wndim && !strncmp(f->param, m->mods[i].fqn, l) &&
        !strcmp(f->param + l, ".weight"))
      return &m->mods[i];
  }
  dt_error(ctx, DT_ERR_INVALID, "SHARDBENCH_FAULT", "no parameter '%s' in this model", f->param);
  return NULL;
}

/* skip-reduce: the gradient's Partial on dp becomes Replicate without the sum, so
 * dt_data_parallel_reduce_grads passes it by. Before the reduce. */
static void fault_skip_reduce(dt_model *m, const fault *f, unsigned dp_dims) {
  dt_module *md = f->kind == FAULT_SKIP_REDUCE ? fault_module(NULL, m, f) : NULL;
  dt_tensor *g = md ? (dt_tensor *)dt_var_grad(md->weight) : NULL; /* the test switch writes it */
  for (int d = 0; g && d < g->mesh_ndim; d++)
    if ((dp_dims & (1u << d)) && g->pl[d].kind == DT_PL_PARTIAL) g->pl[d] = dt_replicate();
}

/* perturb-grad: after the reduce, on the fault's rank. */
static void fault_perturb_grad(dt_ctx *ctx, dt_model *m, const fault *f) {
  dt_module *md = f->kind == FAULT_PERTURB_GRAD && ctx->rank == f->rank ? fault_module(NULL, m, f)
                                                                         : NULL;
  const dt_tensor *g = md ? dt_var_grad(md->weight) : NULL;
  if (!g) return;
  const dt_array *a = dt_tensor_local(g);
  double big = 0;
  for (int64_t i = 0; i < a->numel; i++)
    big = fmax(big, fabs(a->dtype == DT_F64 ? ((double *)a->data)[i] : ((float *)a->data)[i]));
  for (int64_t i = 0; i < a->numel; i++)
    if (a->dtype == DT_F64) ((double *)a->data)[i] += FAULT_PERTURB * big;
    else ((float *)a->data)[i] += (float)(FAULT_PERTURB * big);
}

/* ---- the single-layer workloads' inputs and loss ---------------------------------- */

typedef enum wl_kind { WL_MODEL = 0, WL_EMBEDDING, WL_ATTENTION, WL_FEED_FORWARD, WL_OUTPUT } wl_kind;

static wl_kind wl_of(const char *w) {
  return !strcmp(w, "embedding")      ? WL_EMBEDDING
         : !strcmp(w, "attention")    ? WL_ATTENTION
         : !strcmp(w, "feed_forward") ? WL_FEED_FORWARD
         : !strcmp(w, "output")       ? WL_OUTPUT
                                      : WL_MODEL; /* model, block */
}

/* Which random tensor: the activation x of a step, or the probe R (one for the run). */
enum { WL_X = 2, WL_PROBE = 3 }; /* after sb_token_ids' inputs (0) and targets (1) */

/* n N(0, 1) values of (which, step) from SEED: splitmix64 (Steele et al., "Fast
 * splittable pseudorandom number generators", OOPSLA 2014) uniforms through
 * Box-Muller; the same on every rank, like sb_token_ids. */
static void wl_normal(int which, int step, int64_t n, double *out) {
  uint64_t st = SEED ^ (0x9E3779B97F4A7C15ull * (uint64_t)(1 + which + 4 * (int64_t)step));
  for (int64_t i = 0; i < n; i += 2) {
    double u[2];
    for (int k = 0; k < 2; k++) {
      uint64_t z = (st += 0x9E3779B97F4A7C15ull);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      u[k] = (double)(z >> 11) * 0x1p-53; /* [0, 1) */
    }
    const double r = sqrt(-2.0 * log(1.0 - u[0])), a = 6.283185307179586 * u[1]; /* 2 pi */
    out[i] = r * cos(a);
    if (i + 1 < n) out[i + 1] = r * sin(a);
  }
}

/* The tp placement of the activations between the model's layers: what the plan's
 * tok_embeddings style puts out (TorchTitan's RowwiseParallel(output_layouts=
 * Shard(1)) under sequence parallel; Replicate, its default, otherwise), as a dim
 * of [b, s, dim]. Replicate without a [tp] entry for it. */
static dt_placement wl_layer_tp(const dt_plan *p) {
  dt_placement r = dt_replicate();
  const int ptp = p ? dt_plan_dim(p, "tp") : -1;
  for (int i = 0; ptp >= 0 && i < p->n_entries; i++) {
    const dt_plan_entry *e = &p->entries[i];
    if (e->dim == ptp && dt_fqn_match(e->pattern, "tok_embeddings") &&
        (e->style.kind == DT_STYLE_ROWWISE || e->style.kind == DT_STYLE_COLWISE) &&
        e->style.n_out > 0 && !e->style.output_layouts[0].none)
      r = e->style.output_layouts[0].pl; /* the last entry wins, as in dt_parallelize_module */
  }
  if (r.kind == DT_PL_SHARD && r.dim < 0) r.dim += 3;
  return r;
}


typedef struct job {
  /* in */
  const sb_opts *o;
  dt_llama_config cfg;
  dt_dtype dtype;               /* the reference's (and the inputs') dtype */
  dt_dtype model_dtype;         /* the sharded job's model: dtype, or bf16 */
  bool reference;               /* a 1-rank mesh, no plan */
  int mesh_ndim;
  int mesh_shape[SB_NDIMS];
  char mesh_names[SB_NDIMS][DT_MESH_NAME_LEN];
  int dp_dim, tp_dim;           /* mesh dims, -1: none */
  int dps_dim;                  /* the dp_shard mesh dim, -1: none */
  int cp_dim;                   /* the cp mesh dim, -1: none */
  int pp_dim;                   /* the pp mesh dim, -1: none */
  bool fsdp;                    /* the plan's fully_shard entries apply (dp_shard or cp) */
  bool tp_before_dps;           /* mesh dims ordered ..., tp, dp_shard (FSDP + TP) */
  dt_plan *plan;                /* NULL: no entries */
  const sb_ref *ref;            /* compare against (sharded job) */
  fault fault;                  /* TEST SWITCH (sharded job only) */
  bool per_process;             /* MPI: each process has its own job (else the ranks share it) */
  /* out (rank 0; the verdict on every rank of an MPI job) */
  sb_snap out;                  /* reference job: what it computed */
  double step_time_s;
  int64_t peak_mem;
  sb_cmp cmp;                   /* sharded job: the verdict, worst over every rank */
  bool weights_saved;           /* sharded job: o->save_weights written */
  int64_t mem[4];               /* rank 0, last timed step: params, grads, optimizer,
                                 * the rest of the step's peak (sb_result.mem_*) */
  int n_comm;
  sb_comm_row comm[MAX_COMM];
  sb_pp_timeline *ppt;          /* rank 0, a pipelined sharded job: the timeline (pipe_gather) */
} job;

/* An N(0, 1) [batch, seq, dim] tensor (wl_normal) in the model's dtype, placed as the
 * model's layers receive their input: Shard(0) on dp_dims, Shard(1) on cp in its
 * storage order (cp >= 0), wl_layer_tp on tp. The global values are made on every
 * rank outside the counted allocator (as the token batches are). */
static dt_status wl_tensor(dt_ctx *ctx, const job *j, dt_mesh *mesh, const dt_model *m,
                           unsigned dp_dims, int cp, int which, int step, dt_tensor *out) {
  const int64_t shape[3] = {j->o->batch, j->o->seq, j->cfg.dim}, n = shape[0] * shape[1] * shape[2];
  const size_t es = j->dtype == DT_F64 ? sizeof(double) : sizeof(float);
  double *v = malloc(sizeof *v * (size_t)(n ? n : 1));
  void *data = malloc(es * (size_t)(n ? n : 1));
  dt_status s = v && data ? DT_OK : dt_error(ctx, DT_ERR_NOMEM, "workload", "no memory");
  dt_tensor t;
  memset(&t, 0, sizeof t);
  const int nd = dt_mesh_ndim(mesh);
  dt_placement pl[DT_MAX_MESH_DIMS];
  for (int i = 0; i < nd; i++) pl[i] = dp_dims & (1u << i) ? dt_shard(0) : dt_replicate();
  if (s == DT_OK) {
    wl_normal(which, step, n, v);
    for (int64_t i = 0; i < n; i++)
      if (j->dtype == DT_F64) ((double *)data)[i] = v[i];
      else ((float *)data)[i] = (float)v[i];
    dt_array a;
    s = dt_array_wrap(ctx, DT_DEV_CPU, j->dtype, 3, shape, data, &a);
    if (s == DT_OK)
      s = cp >= 0 ? dt_cp_shard_sequence(ctx, m, &a, 1, pl, &t)
                  : dt_tensor_distribute(ctx, mesh, &a, pl, &t);
  }
  free(v);
  free(data);
  const int tp = j->reference ? -1 : j->tp_dim;
  const dt_placement want = tp >= 0 ? wl_layer_tp(j->plan) : dt_replicate();
  if (s == DT_OK && tp >= 0 && !dt_placement_eq(want, t.pl[tp])) { /* a local slice */
    for (int i = 0; i < nd; i++) pl[i] = t.pl[i];
    pl[tp] = want;
    s = dt_redistribute(ctx, &t, pl, DT_PLANNER_GREEDY, out);
    dt_tensor_free(ctx, &t);
  } else if (s == DT_OK) {
    *out = t;
  }
  return s;
}

/* L = mean(y * R) on the step tape: the probe R is moved to y's placements first
 * (Partial read as Replicate), with the ledger off, when the plan left y elsewhere
 * than the layers' input (wl_tensor). R is consumed. */
static dt_status wl_probe_loss(dt_ctx *ctx, dt_model *m, dt_var *y, dt_tensor *R, dt_var **loss) {
  const dt_tensor *yv = dt_var_value(y);
  dt_placement want[DT_MAX_MESH_DIMS];
  bool same = true;
  for (int d = 0; d < yv->mesh_ndim; d++) {
    want[d] = yv->pl[d].kind == DT_PL_PARTIAL ? dt_replicate() : yv->pl[d];
    same = same && dt_placement_eq(want[d], R->pl[d]);
  }
  if (!same) {
    const bool was = dt_ledger_of(ctx)->enabled;
    dt_ledger_enable(ctx, false);
    dt_tensor moved;
    dt_status s = dt_redistribute(ctx, R, want, DT_PLANNER_GREEDY, &moved);
    dt_ledger_enable(ctx, was);
    dt_tensor_free(ctx, R);
    memset(R, 0, sizeof *R);
    DT_CHECK(s);
    *R = moved;
  }
  dt_var *r = dt_var_leaf(m->step_tape, R, false), *in[2] = {y, r}, *p;
  memset(R, 0, sizeof *R); /* moved into r, or freed when r is NULL */
  if (!r) return dt_error(ctx, DT_ERR_NOMEM, "workload", "no memory for the probe");
  DT_CHECK(dt_ad_op(m->step_tape, &dt_op_mul, NULL, in, &p));
  return dt_ad_op(m->step_tape, &dt_op_mean, NULL, &p, loss); /* ndims 0: every element */
}

/* Whether one of the entry's patterns matches a module of m ("root": the model). */
static bool wl_entry_matches(const dt_model *m, const dt_plan_entry *e) {
  char pats[8][96];
  const int np = dt_plan_entry_patterns(e, pats, 8);
  for (int k = 0; k < np; k++) {
    if (e->style.kind == DT_STYLE_FULLY_SHARD && !strcmp(pats[k], "root")) return true;
    for (int i = 1; i < m->n_mods; i++)
      if (dt_fqn_match(pats[k], m->mods[i].fqn)) return true;
  }
  return false;
}

static void add_comm(job *j, const dt_ledger_row *r) {
  const char *op = dt_coll_name((dt_coll)r->op);
  for (int i = 0; i < j->n_comm; i++) {
    sb_comm_row *c = &j->comm[i];
    if (!strcmp(c->op, op) && !strcmp(c->mesh_dim, r->group) && !strcmp(c->phase, r->phase)) {
      c->calls++;
      c->payload_bytes += (int64_t)r->payload_bytes;
      c->wire_bytes += r->wire_bytes;
      c->seconds += r->seconds;
      return;
    }
  }
  if (j->n_comm == MAX_COMM) return;
  sb_comm_row *c = &j->comm[j->n_comm++];
  memset(c, 0, sizeof *c);
  snprintf(c->op, sizeof c->op, "%s", op);
  snprintf(c->mesh_dim, sizeof c->mesh_dim, "%s", r->group);
  snprintf(c->phase, sizeof c->phase, "%s", r->phase[0] ? r->phase : "other");
  c->calls = 1;
  c->payload_bytes = (int64_t)r->payload_bytes;
  c->wire_bytes = r->wire_bytes;
  c->seconds = r->seconds;
}

/* The model on mesh: created, the plan's [tp] entries applied, materialized. */
static dt_status build_model(dt_ctx *ctx, dt_mesh *mesh, const job *j, dt_model **out) {
  dt_model *m = NULL;
  DT_CHECK(dt_model_create(ctx, mesh, &j->cfg, j->reference ? j->dtype : j->model_dtype, SEED,
                           &m));
  const bool single = sb_workload_single(j->o->workload);
  dt_status s = DT_OK;
  if (j->plan && j->tp_dim >= 0) {
    int ptp = dt_plan_dim(j->plan, "tp");
    dt_plan_entry *e = malloc(sizeof(dt_plan_entry) * DT_PLAN_MAX_ENTRIES);
    if (!e) s = dt_error(ctx, DT_ERR_NOMEM, "train", "no memory");
    int n = 0;
    for (int i = 0; e && i < j->plan->n_entries; i++)
      if (j->plan->entries[i].dim == ptp && (!single || wl_entry_matches(m, &j->plan->entries[i])))
        e[n++] = j->plan->entries[i];
    if (s == DT_OK) s = dt_parallelize_module(ctx, m, j->tp_dim, e, n);
    free(e);
  }
  if (s == DT_OK && j->cp_dim >= 0)
    s = dt_context_parallel(ctx, m, j->cp_dim, j->plan->cp_rotate, j->plan->cp_load_balance);
  if (s == DT_OK && j->fsdp) {
    const dt_plan *p = j->plan;
    int pds = dt_plan_dim(p, "dp_shard"), n = 0;
    dt_plan_entry *e = malloc(sizeof(dt_plan_entry) * DT_PLAN_MAX_ENTRIES);
    if (!e) s = dt_error(ctx, DT_ERR_NOMEM, "train", "no memory");
    for (int i = 0; e && i < p->n_entries; i++) /* a single-layer workload: its modules' */
      if (p->entries[i].dim == pds && (!single || wl_entry_matches(m, &p->entries[i])))
        e[n++] = p->entries[i];
    /* FSDP over dp_shard x cp (TorchTitan's dp_shard_cp), HSDP's replicas on dp_replicate */
    dt_fsdp_opts fo = {.shard_dim = j->dps_dim, .replicate_dim = j->dp_dim, .cp_dim = j->cp_dim,
                       .zero = p->zero ? p->zero : 3, .param_dtype = p->param_dtype,
                       .reduce_dtype = p->reduce_dtype};
    if (j->fault.kind == FAULT_SKIP_REDUCE) { /* TEST SWITCH: the unit skips its reduction */
      const char *dot = strrchr(j->fault.param, '.');
      if (dot && !strcmp(dot, ".weight"))
        snprintf(fo.fault_no_reduce, sizeof fo.fault_no_reduce, "%.*s",
                 (int)(dot - j->fault.param), j->fault.param);
    }
    if (s == DT_OK) s = dt_fully_shard(ctx, m, e, n, &fo);
    free(e);
  }
  if (s == DT_OK && j->fault.kind != FAULT_NONE) { /* TEST SWITCH: refuse a bad target early */
    if (!fault_module(ctx, m, &j->fault)) s = DT_ERR_INVALID;
    else if (j->fault.rank >= ctx->world_size)
      s = dt_error(ctx, DT_ERR_INVALID, "SHARDBENCH_FAULT", "rank %d, but the world has %d ranks",
                   j->fault.rank, ctx->world_size);
  }
  if (s == DT_OK) s = dt_model_materialize(ctx, m);
  if (s == DT_OK && j->o->load_weights[0]) s = dt_model_load_weights(ctx, m, j->o->load_weights);
  if (s != DT_OK) {
    dt_parallelize_release(ctx, m);
    dt_model_free(ctx, m);
    return s;
  }
  *out = m;
  return DT_OK;
}

/* The sharded job's initial weights to o->save_weights (gathered one at a time,
 * the ledger off). The gathers' buffers are not the run's: the peak memory
 * measure restarts after them. */
static dt_status save_weights(dt_ctx *ctx, dt_model *m, const job *j) {
  const char *keys[] = {"format", "producer", "model", "names"};
  const char *vals[] = {"pt", "shardbench " PACKAGE_VERSION, j->o->model,
                        j->o->weights_names == DT_NAMES_HF ? "huggingface" : "torchtitan"};
  dt_ledger_enable(ctx, false);
  dt_status s = dt_model_save_weights(ctx, m, j->o->save_weights, j->o->weights_dtype,
                                      j->o->weights_names, 4, keys, vals);
  *mem_peak(ctx) = *mem_cur(ctx);
  return s;
}

/* ---- pipeline parallel ----------------------------------------------------------- */

/* A rank's pipeline: the stages and this run's lowered schedule (the same on every
 * rank), and the last step's loss (the last stage's rank's sum, shared for checks). */
typedef struct pipe {
  dt_pp_layout L;
  dt_pp_schedule S;
  int m;                        /* microbatches */
  double loss;
  dt_tape *loss_tape;           /* holds the loss as a variable for the verifier */
  /* the timeline of this rank's timed steps (pipe_step), gathered by pipe_gather */
  int cap;                      /* events per step: the longest rank's action list */
  dt_pp_event *ev;              /* [cap], one step's */
  double *rec;                  /* [timed steps][REC_HEAD + 5 cap]: pipe_rec */
} pipe;

/* A rank's record of one timed step, as doubles for one all_gather over the world:
 * the event count, pp rank, pipeline (the rank's coordinates off the pp dim), the
 * step's zero on its clock (its exit from the barrier before the step), its host
 * peak above the step's start, then per event kind, stage, microbatch, t0, t1. */
enum { REC_N = 0, REC_PP_RANK, REC_PIPE, REC_ZERO, REC_PEAK, REC_HEAD };
static size_t rec_stride(const pipe *p) { return REC_HEAD + 5 * (size_t)p->cap; }

/* The plan's schedule over pp ranks with m microbatches (TorchTitan's defaults: one
 * stage per rank, two for the interleaved schedule; split by
 * generate_llm_fqn_per_model_part with the embedding and the head as one layer each). */
static dt_status pipe_build(dt_ctx *ctx, const dt_plan *pl, int n_layers, int pp, int m, pipe *p) {
  p->m = m;
  if (pl->pp_schedule == DT_PP_CSV) {
    char path[600];
    const char *slash = strrchr(pl->path, '/');
    if (pl->pp_schedule_csv[0] == '/' || !slash)
      snprintf(path, sizeof path, "%s", pl->pp_schedule_csv);
    else
      snprintf(path, sizeof path, "%.*s/%s", (int)(slash - pl->path), pl->path, pl->pp_schedule_csv);
    DT_CHECK(dt_pp_schedule_load(ctx, path, pp, -1, m, &p->S));
    if (p->S.n_microbatches != m)
      return dt_error(ctx, DT_ERR_INVALID, "pipeline", "%s has %d microbatches; the run has %d",
                      path, p->S.n_microbatches, m);
  } else {
    /* stages per rank: the explicit split's count over pp (pipeline_module_split),
     * else 2 for the interleaved schedule (TorchTitan's default for multi-stage
     * schedules) */
    int v = pl->pp_schedule == DT_PP_INTERLEAVED_1F1B ? 2 : 1;
    if (pl->pp_n_stages > 0) {
      if (pl->pp_n_stages % pp)
        return dt_error(ctx, DT_ERR_INVALID, "plan",
                        "%s:%d: module_fqns_per_model_part has %d stages, not a multiple of pp=%d",
                        pl->path, pl->pp_stages_line, pl->pp_n_stages, pp);
      v = pl->pp_n_stages / pp;
      if ((v > 1) != (pl->pp_schedule == DT_PP_INTERLEAVED_1F1B))
        return dt_error(ctx, DT_ERR_INVALID, "plan",
                        "%s:%d: module_fqns_per_model_part gives %d stages per pp rank (pp=%d); "
                        "%s", pl->path, pl->pp_stages_line, v, pp,
                        v > 1 ? "a single-stage schedule (GPipe, 1F1B) runs one"
                              : "Interleaved1F1B needs 2 or more");
    }
    DT_CHECK(dt_pp_schedule_generate(ctx, pl->pp_schedule, pp, v, m, &p->S));
    DT_CHECK(dt_pp_schedule_lower(ctx, &p->S));
  }
  if (pl->pp_n_stages > 0) {
    if (pl->pp_n_stages != p->S.n_stages)
      return dt_error(ctx, DT_ERR_INVALID, "plan",
                      "%s:%d: module_fqns_per_model_part has %d stages; the schedule has %d",
                      pl->path, pl->pp_stages_line, pl->pp_n_stages, p->S.n_stages);
    char copy[sizeof pl->pp_stages], where[sizeof pl->path + 48];
    const char *parts[DT_PP_MAX_STAGES];
    memcpy(copy, pl->pp_stages, sizeof copy);
    int k = 0;
    for (char *q = copy, *e; k < pl->pp_n_stages; q = e + 1) {
      parts[k++] = q;
      if (!(e = strchr(q, ';'))) break;
      *e = '\0';
    }
    snprintf(where, sizeof where, "%s:%d: module_fqns_per_model_part", pl->path,
             pl->pp_stages_line);
    return dt_pp_split_fqns(ctx, n_layers, parts, k, where, &p->L);
  }
  return dt_pp_split(ctx, n_layers, p->S.n_stages, pl->pp_first_less, pl->pp_last_less, &p->L);
}

/* Microbatch k of the step's batch as a [batch / m, seq] tensor whose shard on the
 * data-parallel dims is that rank's k-th chunk of its local batch (the schedule
 * splits each rank's batch, split_args_kwargs_into_chunks). */
static dt_status microbatch_tensor(dt_ctx *ctx, const job *j, dt_mesh *mesh, const dt_model *m,
                                   unsigned dp_dims, int ndp, int step, int which, int k, int nm,
                                   dt_tensor *out) {
  const sb_opts *o = j->o;
  const int64_t B = o->batch, S = o->seq, local = B / ndp, mb = local / nm;
  int64_t *all = malloc(sizeof *all * (size_t)(B * S));
  int64_t *ids = malloc(sizeof *ids * (size_t)(B / nm * S));
  dt_status s = all && ids ? DT_OK : dt_error(ctx, DT_ERR_NOMEM, "pipeline", "no memory");
  if (s == DT_OK) {
    sb_token_ids(step, which, B * S, j->cfg.vocab, all);
    for (int d = 0; d < ndp; d++)
      memcpy(ids + (size_t)(d * mb * S), all + (size_t)((d * local + k * mb) * S),
             sizeof *ids * (size_t)(mb * S));
    const int64_t shape[2] = {B / nm, S};
    dt_array a;
    dt_placement pl[DT_MAX_MESH_DIMS];
    for (int i = 0; i < dt_mesh_ndim(mesh); i++)
      pl[i] = dp_dims & (1u << i) ? dt_shard(0) : dt_replicate();
    s = dt_array_wrap(ctx, DT_DEV_CPU, DT_I64, 2, shape, ids, &a);
    if (s == DT_OK)
      s = j->cp_dim >= 0 ? dt_cp_shard_sequence(ctx, m, &a, 1, pl, out)
                         : dt_tensor_distribute(ctx, mesh, &a, pl, out);
  }
  free(all);
  free(ids);
  return s;
}

/* One pipelined step's forward and backward: every microbatch through the schedule
 * (the token batches made with the ledger off, before the barrier). */
static dt_status pipe_step(dt_ctx *ctx, dt_mesh *mesh, dt_model *m, const job *j, pipe *p,
                           unsigned dp_dims, int step) {
  const int nm = p->m;
  int ndp = 1;
  for (int i = 0; i < dt_mesh_ndim(mesh); i++)
    if (dp_dims & (1u << i)) ndp *= dt_mesh_size(mesh, i);
  dt_tensor *tok = calloc((size_t)(2 * nm), sizeof *tok), *tgt = tok ? tok + nm : NULL;
  dt_status s = tok ? DT_OK : dt_error(ctx, DT_ERR_NOMEM, "pipeline", "no memory");
  const bool was = dt_ledger_of(ctx)->enabled;
  dt_ledger_enable(ctx, false);
  for (int k = 0; s == DT_OK && k < nm; k++) {
    s = microbatch_tensor(ctx, j, mesh, m, dp_dims, ndp, step, 0, k, nm, &tok[k]);
    if (s == DT_OK) s = microbatch_tensor(ctx, j, mesh, m, dp_dims, ndp, step, 1, k, nm, &tgt[k]);
  }
  const int timed = step - j->o->warmup; /* the timed step's index, < 0: warm-up */
  if (s == DT_OK && timed >= 0 && !p->rec) { /* the timeline's buffers, at the first timed step */
    for (int r = 0; r < p->S.pp; r++) p->cap = p->S.len[r] > p->cap ? p->S.len[r] : p->cap;
    p->ev = calloc((size_t)p->cap, sizeof *p->ev);
    p->rec = calloc((size_t)j->o->steps * rec_stride(p), sizeof *p->rec);
    if (!p->ev || !p->rec) s = dt_error(ctx, DT_ERR_NOMEM, "pipeline", "no memory");
  }
  if (s == DT_OK) s = dt_comm_barrier(ctx->world);
  dt_ledger_enable(ctx, was);
  const double zero = dt_now();
  /* the step's own peak above its start (restored to the larger one after) */
  const size_t run_peak = *mem_peak(ctx), base = *mem_cur(ctx);
  *mem_peak(ctx) = base;
  int n_ev = 0;
  if (s == DT_OK)
    s = dt_pipeline_step(ctx, m, j->pp_dim, &p->L, &p->S, tok, tgt, &p->loss,
                         timed >= 0 ? p->ev : NULL, timed >= 0 ? p->cap : 0, &n_ev);
  const size_t peak = *mem_peak(ctx);
  if (run_peak > *mem_peak(ctx)) *mem_peak(ctx) = run_peak;
  if (s == DT_OK && timed >= 0) {
    double *rec = p->rec + (size_t)timed * rec_stride(p);
    int pipe_id = 0;
    for (int d = 0; d < dt_mesh_ndim(mesh); d++)
      if (d != j->pp_dim) pipe_id = pipe_id * dt_mesh_size(mesh, d) + dt_mesh_coord(mesh, d);
    rec[REC_N] = n_ev;
    rec[REC_PP_RANK] = dt_mesh_coord(mesh, j->pp_dim);
    rec[REC_PIPE] = pipe_id;
    rec[REC_ZERO] = zero;
    rec[REC_PEAK] = (double)(peak - base);
    for (int i = 0; i < n_ev; i++) {
      double *e = rec + REC_HEAD + 5 * (size_t)i;
      e[0] = p->ev[i].action.kind;
      e[1] = p->ev[i].action.stage;
      e[2] = p->ev[i].action.mb;
      e[3] = p->ev[i].t0;
      e[4] = p->ev[i].t1;
    }
  }
  for (int k = 0; tok && k < 2 * nm; k++) dt_tensor_free(ctx, &tok[k]);
  free(tok);
  return s;
}

/* The in-flight count walked from one rank's events of a step in execution order:
 * an F holds its (stage, microbatch) activations from its end until its B ends. */
static int in_flight_max(const double *rec) {
  int cur = 0, most = 0;
  for (int i = 0; i < (int)rec[REC_N]; i++) {
    const int kind = (int)rec[REC_HEAD + 5 * (size_t)i];
    if (kind == DT_PP_F && ++cur > most) most = cur;
    if (kind == DT_PP_B) cur--;
  }
  return most;
}

/* Every rank's timeline records to rank 0 (an all_gather over the world with the
 * ledger off, outside the timed steps), which builds j->ppt: the events with times
 * from the step's zero (results/schema.sql, pp_events: the earliest rank's barrier
 * exit when the ranks share a clock (the threads backend); each rank's own under
 * MPI, whose processes may run on hosts with unrelated clocks), the measured and
 * analytic bubbles and the per-stage figures. */
static dt_status pipe_gather(dt_ctx *ctx, job *j, const pipe *p) {
  const int world = ctx->world_size, steps = j->o->steps, pp = p->S.pp;
  const size_t stride = rec_stride(p), mine = (size_t)steps * stride;
  if (steps <= 0 || !p->rec) return DT_OK;
  double *all = malloc(sizeof *all * mine * (size_t)world);
  if (!all) return dt_error(ctx, DT_ERR_NOMEM, "pipeline", "no memory");
  const bool was = dt_ledger_of(ctx)->enabled;
  dt_ledger_enable(ctx, false);
  dt_status s = dt_comm_all_gather(ctx->world, p->rec, all, mine, DT_F64);
  dt_ledger_enable(ctx, was);
  if (s != DT_OK || ctx->rank != 0) {
    free(all);
    return s;
  }
#define REC(r, st) (all + (size_t)(r) * mine + (size_t)(st) * stride)
  int n = 0;
  for (int r = 0; r < world; r++)
    for (int st = 0; st < steps; st++) n += (int)REC(r, st)[REC_N];
  sb_pp_timeline *t = calloc(1, sb_pp_timeline_bytes(n));
  double *span = malloc(sizeof *span * 3 * (size_t)world); /* per pipeline id, one step */
  if (!t || !span) {
    free(t);
    free(span);
    free(all);
    return dt_error(ctx, DT_ERR_NOMEM, "pipeline", "no memory");
  }
  const int v = p->S.n_stages / pp, npipe = world / pp;
  snprintf(t->schedule, sizeof t->schedule, "%s", dt_pp_schedule_kind_str(p->S.kind));
  t->pp = pp;
  t->virtual_stages = v;
  t->microbatches = p->S.n_microbatches;
  t->steps = steps;
  const double an = dt_pp_bubble_fraction(p->S.kind, pp, v, p->S.n_microbatches);
  t->bubble_analytic = an >= 0 ? an : NAN;
  int per_rank[DT_PP_MAX_RANKS] = {0}; /* (rank, step) samples per pp rank */
  double bubble_sum = 0, span_sum = 0;
  for (int st = 0; st < steps; st++) {
    double zero = INFINITY; /* the shared clock's zero: the earliest barrier exit */
    for (int r = 0; r < world; r++) zero = fmin(zero, REC(r, st)[REC_ZERO]);
    double *lo = span + world, *hi = span + 2 * world; /* each pipeline's first start, last end */
    for (int g = 0; g < npipe; g++) lo[g] = INFINITY, hi[g] = -INFINITY;
    for (int r = 0; r < world; r++) {
      const double *rec = REC(r, st);
      const double z = j->per_process ? rec[REC_ZERO] : zero;
      const int g = (int)rec[REC_PIPE] % npipe;
      for (int i = 0; i < (int)rec[REC_N]; i++) {
        const double *e = rec + REC_HEAD + 5 * (size_t)i;
        sb_pp_event *o = &t->events[t->n_events++];
        *o = (sb_pp_event){st, r, (int)rec[REC_PP_RANK], (int)e[0], (int)e[1], (int)e[2],
                           e[3] - z, e[4] - z};
        lo[g] = fmin(lo[g], o->t0);
        hi[g] = fmax(hi[g], o->t1);
      }
    }
    for (int g = 0; g < npipe; g++) {
      span[g] = hi[g] > lo[g] ? hi[g] - lo[g] : 0;
      span_sum += span[g];
    }
    for (int r = 0; r < world; r++) {
      const double *rec = REC(r, st);
      const int pr = (int)rec[REC_PP_RANK], g = (int)rec[REC_PIPE] % npipe;
      double busy = 0;
      for (int i = 0; i < (int)rec[REC_N]; i++) {
        const double *e = rec + REC_HEAD + 5 * (size_t)i;
        if ((int)e[0] == DT_PP_F || (int)e[0] == DT_PP_B) busy += e[4] - e[3];
      }
      const double b = span[g] > 0 ? 1 - busy / span[g] : 0;
      sb_pp_stage *sg = &t->stages[pr];
      const int fl = in_flight_max(rec);
      if (fl > sg->max_in_flight) sg->max_in_flight = fl;
      if ((int64_t)rec[REC_PEAK] > sg->peak_act_bytes) sg->peak_act_bytes = (int64_t)rec[REC_PEAK];
      sg->busy_s += busy;
      sg->bubble += b;
      per_rank[pr]++;
      bubble_sum += b;
    }
  }
#undef REC
  for (int r = 0; r < pp; r++) {
    t->stages[r].busy_s /= per_rank[r] ? per_rank[r] : 1;
    t->stages[r].bubble /= per_rank[r] ? per_rank[r] : 1;
  }
  t->bubble_measured = bubble_sum / ((double)steps * world);
  t->span_s = span_sum / ((double)steps * npipe);
  free(j->ppt);
  j->ppt = t;
  free(span);
  free(all);
  return DT_OK;
}

/* For the verifier: the loss (from the last stage's rank) and every weight's gradient
 * (from its stage's rank) on every rank; *loss a variable holding the loss. */
static dt_status pipe_share(dt_ctx *ctx, dt_model *m, const job *j, pipe *p, dt_var **loss) {
  dt_comm *c = dt_mesh_comm(m->mesh, j->pp_dim);
  DT_CHECK(dt_comm_broadcast(c, &p->loss, 1, DT_F64, dt_pp_stage_rank(p->S.n_stages - 1, c->size)));
  DT_CHECK(dt_pipeline_share(ctx, m, j->pp_dim, &p->L, true));
  dt_tape_free(p->loss_tape);
  p->loss_tape = NULL;
  DT_CHECK(dt_tape_create(ctx, NULL, &p->loss_tape));
  dt_array a;
  dt_tensor t;
  const int64_t none[1] = {0};
  dt_placement pl[DT_MAX_MESH_DIMS];
  for (int i = 0; i < DT_MAX_MESH_DIMS; i++) pl[i] = dt_replicate();
  DT_CHECK(dt_array_create(ctx, DT_DEV_CPU, DT_F64, 0, none, &a));
  ((double *)a.data)[0] = p->loss;
  dt_status s = dt_tensor_distribute(ctx, m->mesh, &a, pl, &t);
  dt_array_free(ctx, &a);
  if (s == DT_OK && !(*loss = dt_var_leaf(p->loss_tape, &t, false))) s = DT_ERR_NOMEM;
  return s;
}

/* One step's forward, loss, backward and data-parallel reduce, timed: *secs.
 * *loss lives until dt_model_end_step. */
static dt_status step_grads(dt_ctx *ctx, dt_mesh *mesh, dt_model *m, const job *j, pipe *pp,
                            int step, bool timed, dt_var **loss, double *secs) {
  const int dp = j->reference ? -1 : j->dp_dim, dps = j->reference ? -1 : j->dps_dim;
  const int cp = j->reference ? -1 : j->cp_dim;
  const unsigned dp_dims = (dp >= 0 ? 1u << dp : 0u) | (dps >= 0 ? 1u << dps : 0u);
  dt_tensor tok, tgt, probe; /* the input (tokens, or x), the targets, the probe R */
  memset(&tok, 0, sizeof tok);
  memset(&tgt, 0, sizeof tgt);
  memset(&probe, 0, sizeof probe);
  dt_ledger_enable(ctx, false);
  const sb_opts *o = j->o;
  const wl_kind wl = wl_of(o->workload);
  dt_status s = DT_OK;
  for (int which = 0; which < 2 && s == DT_OK && !pp; which++) { /* inputs, targets */
    if (wl != WL_MODEL && which == (wl == WL_EMBEDDING ? 1 : 0))
      continue; /* the embedding has no targets; the others take x */
    s = cp >= 0 ? sb_token_tensor_cp(ctx, m, o->batch, o->seq, j->cfg.vocab, dp_dims, step, which,
                                     which ? &tgt : &tok)
                : sb_token_tensor(ctx, mesh, o->batch, o->seq, j->cfg.vocab, dp_dims, step, which,
                                  which ? &tgt : &tok);
  }
  if (s == DT_OK && wl != WL_MODEL && wl != WL_EMBEDDING)
    s = wl_tensor(ctx, j, mesh, m, dp_dims, cp, WL_X, step, &tok);
  if (s == DT_OK && wl != WL_MODEL && wl != WL_OUTPUT)
    s = wl_tensor(ctx, j, mesh, m, dp_dims, cp, WL_PROBE, 0, &probe);
  if (s == DT_OK) s = dt_comm_barrier(ctx->world); /* every rank starts the step together */
  dt_ledger_enable(ctx, timed);
  dt_ctx_set_phase(ctx, "forward");
  double t0 = dt_now();
  dt_var *logits = NULL;
  if (pp) { /* the microbatches through the pipeline */
    if (s == DT_OK) s = pipe_step(ctx, mesh, m, j, pp, dp_dims, step);
  } else if (wl != WL_MODEL) { /* from tokens (embedding) or x; the probe without the head */
    if (s == DT_OK) s = dt_model_forward_input(ctx, m, &tok, &logits);
    if (s == DT_OK)
      s = wl == WL_OUTPUT ? dt_model_loss(ctx, m, logits, &tgt, loss)
                          : wl_probe_loss(ctx, m, logits, &probe, loss);
    if (s == DT_OK) s = dt_model_backward(ctx, m, *loss);
  } else {
    if (s == DT_OK) s = dt_model_forward(ctx, m, &tok, &logits);
    if (s == DT_OK) s = dt_model_loss(ctx, m, logits, &tgt, loss);
    if (s == DT_OK) s = dt_model_backward(ctx, m, *loss);
  }
  const bool fsdp = !j->reference && j->fsdp;
  if (s == DT_OK && fsdp) s = dt_fsdp_reduce_grads(ctx, m); /* ZeRO-1's all-reduce */
  /* DDP over dp_replicate x cp (TorchTitan's dp_cp); under FSDP (HSDP) the units reduce */
  const unsigned ddp_dims = (dp >= 0 ? 1u << dp : 0u) | (cp >= 0 ? 1u << cp : 0u);
  if (s == DT_OK && ddp_dims && !fsdp) {
    fault_skip_reduce(m, &j->fault, ddp_dims); /* TEST SWITCH */
    /* DDP's buckets; a plan's bucket_cap_mb caps the first bucket too, as DDP does when
     * it is given (torch/nn/parallel/distributed.py _BucketCapacityConfig.create) */
    const double cap = j->plan ? j->plan->bucket_cap_mb : 0;
    const dt_ddp_opts ddp = {cap * 1048576.0, 0};
    s = dt_data_parallel_reduce_grads(ctx, m, ddp_dims, cap > 0 ? &ddp : NULL);
  }
  if (s == DT_OK) fault_perturb_grad(ctx, m, &j->fault); /* TEST SWITCH */
  *secs = dt_now() - t0;
  dt_tensor_free(ctx, &tok);
  dt_tensor_free(ctx, &tgt);
  dt_tensor_free(ctx, &probe); /* zeroed when the loss consumed it */
  return s;
}

/* AdamW and the end of the step, timed: *secs. */
static dt_status step_update(dt_ctx *ctx, dt_model *m, bool timed, double *secs) {
  const dt_adamw opt = DT_ADAMW_DEFAULT;
  dt_ledger_enable(ctx, timed);
  dt_ctx_set_phase(ctx, "optimizer");
  double t0 = dt_now();
  dt_status s = dt_model_adamw_step(ctx, m, &opt);
  if (s == DT_OK) s = dt_fsdp_after_step(ctx, m); /* ZeRO-1's all-gather of the updated rows */
  if (s == DT_OK) s = dt_model_end_step(ctx, m);
  *secs = dt_now() - t0;
  dt_ctx_set_phase(ctx, "");
  return s;
}

/* The check data of a step (step >= 0: loss and gradients) or of the final weights
 * (step < 0, after last): kept (reference) or compared into c (sharded), with the
 * ledger off and outside the timed region. */
static dt_status collect(dt_ctx *ctx, dt_model *m, job *j, pipe *pp, const dt_var *loss, int step,
                         int last, sb_cmp *c) {
  dt_ledger_enable(ctx, false);
  dt_ctx_set_phase(ctx, "check");
  sb_snap *rec = j->reference && ctx->rank == 0 ? &j->out : NULL;
  const sb_snap *ref = j->reference ? NULL : &j->ref->snap;
  dt_status s = DT_OK;
  if (pp) { /* every rank checks every weight: the owners' copies shared over pp */
    dt_var *pl = NULL;
    s = step >= 0 ? pipe_share(ctx, m, j, pp, &pl) : dt_pipeline_share(ctx, m, j->pp_dim, &pp->L, false);
    loss = pl;
  }
  if (s == DT_OK)
    s = step >= 0 ? sb_snap_step(ctx, m, loss, step, rec, ref, c)
                  : sb_snap_params(ctx, m, last, rec, ref, c);
  /* the other stages' gradients (AdamW trains this rank's) and shared weights go again */
  if (pp) {
    const dt_status r = dt_pipeline_release_foreign(ctx, m, j->pp_dim, &pp->L);
    if (s == DT_OK) s = r;
  }
  dt_ctx_set_phase(ctx, "");
  return s;
}

/* Step times and peak memory (max over ranks) and rank 0's comm rows per step. */
static dt_status measures(dt_ctx *ctx, job *j, double *times, int total) {
  const sb_opts *o = j->o;
  DT_CHECK(dt_comm_all_reduce(ctx->world, times, times, (size_t)total, DT_F64, DT_RED_MAX));
  double mem = (double)*mem_peak(ctx);
  DT_CHECK(dt_comm_all_reduce(ctx->world, &mem, &mem, 1, DT_F64, DT_RED_MAX));
  if (ctx->rank != 0) return DT_OK;
  j->step_time_s = o->steps > 0 ? sb_median(times + o->warmup, o->steps) : NAN;
  j->peak_mem = (int64_t)mem;
  for (size_t i = 0; i < dt_ledger_of(ctx)->n; i++) add_comm(j, &dt_ledger_of(ctx)->rows[i]);
  for (int i = 0; i < j->n_comm; i++) { /* per step */
    sb_comm_row *c = &j->comm[i];
    c->calls = (c->calls + o->steps / 2) / o->steps;
    c->payload_bytes /= o->steps;
    c->wire_bytes /= o->steps;
    c->seconds /= o->steps;
  }
  return DT_OK;
}

/* Trains warmup + steps steps on mesh, checking every one; rank 0 fills j's
 * outputs (the reference's snapshot, or the sharded job's verdict). */
static dt_status train(dt_ctx *ctx, dt_mesh *mesh, job *j) {
  const int total = j->o->warmup + j->o->steps;
  dt_model *m = NULL;
  sb_cmp c;
  sb_cmp_init(&c);
  /* FSDP mixed precision: the weights' rounding to param_dtype sets the tolerance */
  if (j->plan && j->fsdp) c.param_dtype = j->plan->param_dtype;
  /* a bf16 model against its f32 reference: bf16's rounding of every weight */
  if (!j->reference && j->model_dtype == DT_BF16) c.param_dtype = DT_BF16;
  double *times = calloc((size_t)total, sizeof *times);
  pipe *pp = !j->reference && j->pp_dim >= 0 ? calloc(1, sizeof *pp) : NULL;
  if (!times || (!j->reference && j->pp_dim >= 0 && !pp)) {
    free(times);
    free(pp);
    return dt_error(ctx, DT_ERR_NOMEM, "train", "no memory");
  }
  dt_status s = DT_OK;
  if (pp) { /* microbatches: each data-parallel rank's batch over the microbatch size */
    int ndp = 1;
    if (j->dp_dim >= 0) ndp *= dt_mesh_size(mesh, j->dp_dim);
    if (j->dps_dim >= 0) ndp *= dt_mesh_size(mesh, j->dps_dim);
    s = pipe_build(ctx, j->plan, j->cfg.n_layers, dt_mesh_size(mesh, j->pp_dim),
                   j->o->batch / ndp / j->plan->pp_microbatch_size, pp);
  }
  if (s == DT_OK) s = build_model(ctx, mesh, j, &m);
  if (s == DT_OK && !j->reference && j->o->save_weights[0]) {
    s = save_weights(ctx, m, j);
    if (s == DT_OK && ctx->rank == 0) j->weights_saved = true;
  }
  if (s == DT_OK && pp) { /* this rank keeps its stages' weights only (pipeline_module_split) */
    s = dt_pipeline_release_foreign(ctx, m, j->pp_dim, &pp->L);
    /* the peak restarts: generating every stage's weights from the one seed, as the
     * reference does, is setup (TorchTitan initializes only its stages' modules) */
    *mem_peak(ctx) = *mem_cur(ctx);
  }
  if (s == DT_OK && j->reference && ctx->rank == 0) s = sb_snap_init(ctx, m, total, &j->out);
  if (s == DT_OK) dt_ledger_clear(ctx);
  for (int step = 0; step < total && s == DT_OK; step++) {
    const bool timed = step >= j->o->warmup;
    dt_var *loss = NULL;
    double t_grad = 0, t_update = 0;
    /* the step's own peak, apart from the run's (the checks' gathers are not the step's) */
    const size_t run_peak = *mem_peak(ctx);
    *mem_peak(ctx) = *mem_cur(ctx);
    dt_model_mem grads, after;
    s = step_grads(ctx, mesh, m, j, pp, step, timed, &loss, &t_grad);
    dt_model_state_bytes(m, &grads);
    const size_t grad_peak = *mem_peak(ctx);
    if (s == DT_OK) s = collect(ctx, m, j, pp, loss, step, total - 1, &c);
    *mem_peak(ctx) = *mem_cur(ctx); /* not the checks' gathers */
    if (s == DT_OK) s = step_update(ctx, m, timed, &t_update);
    dt_model_state_bytes(m, &after);
    const size_t step_peak = *mem_peak(ctx) > grad_peak ? *mem_peak(ctx) : grad_peak;
    *mem_peak(ctx) = run_peak > step_peak ? run_peak : step_peak;
    if (timed && ctx->rank == 0) {
      const int64_t persistent = after.params + grads.grads + after.optimizer;
      j->mem[0] = after.params;
      j->mem[1] = grads.grads;
      j->mem[2] = after.optimizer;
      j->mem[3] = (int64_t)step_peak > persistent ? (int64_t)step_peak - persistent : 0;
    }
    times[step] = t_grad + t_update;
  }
  dt_ledger_enable(ctx, false);
  if (s == DT_OK) s = measures(ctx, j, times, total);
  if (s == DT_OK && pp) s = pipe_gather(ctx, j, pp);
  if (s == DT_OK) s = collect(ctx, m, j, pp, NULL, -1, total - 1, &c);
  if (s == DT_OK && !j->reference) s = sb_cmp_merge(ctx->world, &c);
  if (s == DT_OK && !j->reference && (ctx->rank == 0 || j->per_process)) j->cmp = c;
  dt_ctx_set_phase(ctx, "");
  free(times);
  if (pp) {
    free(pp->ev);
    free(pp->rec);
    dt_tape_free(pp->loss_tape);
    dt_pp_schedule_free(ctx, &pp->S);
    free(pp);
  }
  if (m) {
    dt_parallelize_release(ctx, m);
    dt_model_free(ctx, m);
  }
  return s;
}

/* This rank's index in the mesh when its last two dims (tp, dp_shard) are swapped
 * relative to TorchTitan's order (..., dp_shard, tp): the same groups, with tp's
 * shards nested before dp_shard's. */
static int swapped_index(const job *j, int rank) {
  const int nd = j->mesh_ndim, t = j->mesh_shape[nd - 2], d = j->mesh_shape[nd - 1];
  const int outer = rank / (t * d), in = rank % (t * d); /* TorchTitan: in = s * t + tp */
  return outer * (t * d) + (in % t) * d + in / t;
}

static dt_status job_rank(dt_ctx *ctx, void *arg) {
  job *j = arg;
  dt_mesh *mesh = NULL;
  dt_comm *world = ctx->world, *perm = NULL;
  const char *names[SB_NDIMS];
  for (int i = 0; i < j->mesh_ndim; i++) names[i] = j->mesh_names[i];
  if (j->tp_before_dps) {
    DT_CHECK(dt_comm_split(ctx->world, 0, swapped_index(j, ctx->rank), "world_tp_dps", &perm));
    world = perm;
  }
  dt_status s = dt_mesh_create(ctx, world, j->mesh_ndim, j->mesh_shape, names, &mesh);
  if (s == DT_OK) s = train(ctx, mesh, j);
  dt_mesh_free(mesh);
  if (perm) dt_comm_destroy(perm);
  return s;
}

/* sharded: the job under test (the reference runs on the host comm and the CPU). */
static dt_status launch(dt_backend b, int world, bool sharded, job *j, char *why, size_t whyn) {
  dt_launch_opts lo;
  memset(&lo, 0, sizeof lo);
  lo.backend = b;
  lo.world = world;
  lo.timeout_s = LAUNCH_TIMEOUT_S;
  lo.bind = j->o->pin_ranks;
  /* the sharded job on --device (--comm nccl: the cuda device, a GPU per rank);
   * the reference on the CPU */
  const char *dev = j->reference ? "cpu" : j->o->device;
  lo.device = !dev[0] || !strcmp(dev, "cpu") ? DT_DEV_CPU : DT_DEV_CUDA;
  lo.cuda_emu = !strcmp(dev, "cuda-emu");
  lo.comm = sharded && j->o->comm[0] && dt_comm_kind_parse(j->o->comm, &lo.comm) == DT_OK ? lo.comm
                                                                              : DT_COMM_HOST;
  if (lo.comm == DT_COMM_NCCL) {
    lo.device = DT_DEV_CUDA;
    lo.cuda_emu = false;
  }
  j->per_process = b == DT_BACKEND_MPI;
  dt_launch_report rep;
  memset(&rep, 0, sizeof rep);
  /* the ranks are the parallelism: one BLAS thread each (OpenBLAS's threads of several
   * ranks on the same cores spin against each other; the MFU peak counts one core per
   * rank too) */
  const int blas = dt_device_cpu_blas_threads(1);
  dt_status s = dt_launch(&lo, job_rank, j, &rep);
  if (blas > 0) dt_device_cpu_blas_threads(blas);
  if (s != DT_OK)
    snprintf(why, whyn, "rank %d: %s: %s", rep.failed_rank, dt_status_str(rep.failed_status),
             rep.failed_msg);
  dt_launch_report_free(&rep);
  return s;
}

/* ---- the runner ---------------------------------------------------------------- */

static void skip(sb_result *r, const char *fmt, ...) DT_PRINTF(2, 3);
static void skip(sb_result *r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  snprintf(r->status, sizeof r->status, "skipped");
  vsnprintf(r->reason, sizeof r->reason, fmt, ap);
  va_end(ap);
}

static void failed(sb_result *r, const char *fmt, ...) DT_PRINTF(2, 3);
static void failed(sb_result *r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  snprintf(r->status, sizeof r->status, "failed");
  vsnprintf(r->reason, sizeof r->reason, fmt, ap);
  va_end(ap);
  for (char *p = r->reason; *p; p++)
    if (*p == '\n') *p = ' ';
}

/* What the runner cannot do: status skipped with the reason. True when skipped. */
static bool unsupported(const sb_opts *o, sb_result *r) {
  if (sb_workload_single(o->workload) && o->dims[0] > 1)
    skip(r, "pp=%d: workload '%s' is one layer type, with no stages to split over pp",
         o->dims[0], o->workload);
  else
    return false;
  return true;
}

/* Fits the plan's dims to the mesh and resolves it against the model (heads,
 * seq divisible by tp); skips the config with the reason when it does not fit.
 * True when skipped. */
static bool plan_unfit(const sb_opts *o, dt_ctx *hc, dt_plan *plan, const dt_llama_config *cfg,
                       sb_result *r) {
  int ptp = dt_plan_dim(plan, "tp"), pds = dt_plan_dim(plan, "dp_shard");
  bool has_tp = false, has_fsdp = false;
  for (int i = 0; i < plan->n_entries; i++) {
    if (plan->entries[i].dim == ptp) {
      has_tp = true;
      continue;
    }
    if (plan->entries[i].dim == pds && plan->entries[i].style.kind == DT_STYLE_FULLY_SHARD) {
      has_fsdp = true;
      continue;
    }
    skip(r, "plan '%s' has entries on [%s]; the harness applies [tp] and [dp_shard] entries only",
         o->plan, plan->dim_names[plan->entries[i].dim]);
    return true;
  }
  for (int d = 0; d < SB_NDIMS; d++) {
    int pi = dt_plan_dim(plan, sb_dim_names[d]);
    if (o->dims[d] > 1 && pi < 0 && d != 1) {
      skip(r, "plan '%s' has no dim %s (the mesh has %s=%d)", o->plan, sb_dim_names[d],
           sb_dim_names[d], o->dims[d]);
      return true;
    }
    if (pi >= 0 && plan->dim_sizes[pi] != -1 && plan->dim_sizes[pi] != o->dims[d]) {
      skip(r, "plan '%s' fixes %s=%d; the mesh has %s=%d", o->plan, sb_dim_names[d],
           plan->dim_sizes[pi], sb_dim_names[d], o->dims[d]);
      return true;
    }
  }
  if (has_tp && o->dims[4] == 1) {
    skip(r, "tp=1: the plan's [tp] entries would not apply (TorchTitan applies TP only when "
            "tp > 1); the run equals plan dp's");
    return true;
  }
  if (dt_plan_dim(plan, "pp") >= 0 && o->dims[0] == 1) {
    skip(r, "pp=1: the plan's pipeline would not apply (TorchTitan applies PP only when pp > "
            "1); the run equals the plan's without its pp dim");
    return true;
  }
  if (has_fsdp && o->dims[2] == 1 && o->dims[3] == 1) {
    skip(r, "dp_shard=1, cp=1: the plan's fully_shard entries would not apply (TorchTitan "
            "applies FSDP only when dp_shard x cp > 1); the run equals plan dp's");
    return true;
  }
  if (o->dims[2] > 1 && !has_fsdp) {
    skip(r, "dp_shard=%d: plan '%s' has no fully_shard entries to shard over it", o->dims[2],
         o->plan);
    return true;
  }
  int plan_world = 1;
  for (int i = 0; i < plan->n_dims; i++) {
    int d = 0;
    while (d < SB_NDIMS && strcmp(plan->dim_names[i], sb_dim_names[d])) d++;
    plan->dim_sizes[i] = d < SB_NDIMS ? o->dims[d] : 1;
    plan_world *= plan->dim_sizes[i];
  }
  dt_llama_config whole; /* a single-layer workload: the plan is the whole layer's */
  sb_workload_whole(cfg, &whole);
  if (dt_plan_resolve(hc, plan, plan_world, &whole, o->seq) != DT_OK) {
    skip(r, "%s", sb_strip_rank(dt_last_error(hc)));
    return true;
  }
  sb_plan_traits_get(plan, cfg, &r->plan_traits); /* for the store's framework baselines */
  if (o->batch % o->dims[1]) {
    skip(r, "batch %d is not divisible by dp_replicate=%d", o->batch, o->dims[1]);
    return true;
  }
  if (o->dims[0] > 1) { /* pipeline: the microbatches, the schedule and the stage split */
    for (int i = 0; has_fsdp && i < plan->n_entries; i++) /* dt_fsdp_pipeline_begin's refusal */
      if (plan->entries[i].dim == pds && plan->entries[i].style.reshard_after_forward == 1 &&
          (plan->zero == 0 || plan->zero == 3)) {
        skip(r, "pp=%d: '%s' = fully_shard(reshard_after_forward=True): inside pipeline stages "
                "a unit stays gathered for the step (TorchTitan's default with pp)",
             o->dims[0], plan->entries[i].pattern);
        return true;
      }
    const int ndp = o->dims[1] * o->dims[2];
    if (o->batch % ndp || (o->batch / ndp) % plan->pp_microbatch_size) {
      skip(r, "batch %d over dp_replicate x dp_shard = %d is not a multiple of the pipeline "
              "microbatch size %d", o->batch, ndp, plan->pp_microbatch_size);
      return true;
    }
    pipe *p = calloc(1, sizeof *p);
    if (!p) return false; /* the run reports the memory */
    dt_status st = pipe_build(hc, plan, cfg->n_layers, o->dims[0],
                              o->batch / ndp / plan->pp_microbatch_size, p);
    dt_pp_schedule_free(hc, &p->S);
    free(p);
    if (st != DT_OK) {
      skip(r, "pipeline: %s", sb_strip_rank(dt_last_error(hc)));
      return true;
    }
  }
  return false;
}

/* The memory estimate (bench/harness/memory.c) into r; over o->mem_limit (when
 * set) the config is skipped with both numbers and r->mem_refused. True then. */
static bool over_memory(const sb_opts *o, const dt_plan *plan, sb_result *r) {
  sb_mem_est e;
  if (sb_mem_estimate(o, plan, &e) != 0) return false;
  r->est_mem_bytes = e.rank_bytes;
  r->est_need_bytes = e.need_bytes;
  if (!(o->mem_limit > 0) || e.need_bytes <= o->mem_limit) return false;
  char need[32], rank[32], lim[32];
  sb_bytes_str(e.need_bytes, need, sizeof need);
  sb_bytes_str(e.rank_bytes, rank, sizeof rank);
  sb_bytes_str(o->mem_limit, lim, sizeof lim);
  skip(r, "estimated memory %s (%s per rank x %d ranks, the reference and the comparison "
          "copies) is over the %s of %s (--no-mem-check or --mem-limit to run it anyway)",
       need, rank, o->world, lim, o->mem_limit_src);
  r->mem_refused = true;
  return true;
}

/* The unsharded reference of the config into cache (kept when cache already
 * holds the one of the same model, workload, dtype, batch, seq and steps).
 * False (r failed) when it could not be computed. */
static bool reference(const sb_opts *o, job *j, sb_ref *cache, sb_result *r) {
  char rkey[sizeof cache->key];
  snprintf(rkey, sizeof rkey, "%s/%s/%s/%d/%d/%d/%s", o->model, o->workload, o->dtype, o->batch,
           o->seq, o->warmup + o->steps, o->load_weights);
  if (!strcmp(cache->key, rkey)) return true;
  char why[DT_ERRMSG_LEN + 64];
  sb_ref_free(cache);
  j->reference = true;
  j->mesh_ndim = 1;
  j->mesh_shape[0] = 1;
  snprintf(j->mesh_names[0], DT_MESH_NAME_LEN, "ref");
  j->dp_dim = j->tp_dim = j->dps_dim = j->cp_dim = j->pp_dim = -1;
  j->fsdp = j->tp_before_dps = false;
  if (launch(DT_BACKEND_THREADS, 1, false, j, why, sizeof why) != DT_OK) {
    sb_snap_free(&j->out);
    failed(r, "reference: %s", why);
    return false;
  }
  cache->snap = j->out;
  memset(&j->out, 0, sizeof j->out);
  snprintf(cache->key, sizeof cache->key, "%s", rkey);
  return true;
}

/* The sharded job's mesh: the dims of size > 1 in TorchTitan's order. */
static void sharded_mesh(const sb_opts *o, job *j) {
  j->mesh_ndim = 0;
  j->dp_dim = j->tp_dim = j->dps_dim = j->cp_dim = j->pp_dim = -1;
  /* FSDP + TP: tp before dp_shard, so that FSDP splits TP's blocks (fsdp.c). Not with
   * cp: sequence parallel and cp both shard the sequence, cp outer (TorchTitan's
   * order), and FSDP then shards the other dim of TP's dim-0 blocks (fsdp.c) */
  j->tp_before_dps = o->dims[2] > 1 && o->dims[4] > 1 && o->dims[3] == 1;
  static const int ORDER[SB_NDIMS] = {0, 1, 2, 3, 4}, SWAPPED[SB_NDIMS] = {0, 1, 3, 4, 2};
  const int *order = j->tp_before_dps ? SWAPPED : ORDER;
  for (int k = 0; k < SB_NDIMS; k++) {
    const int d = order[k];
    if (o->dims[d] > 1) {
      if (d == 0) j->pp_dim = j->mesh_ndim;
      if (d == 1) j->dp_dim = j->mesh_ndim;
      if (d == 2) j->dps_dim = j->mesh_ndim;
      if (d == 3) j->cp_dim = j->mesh_ndim;
      if (d == 4) j->tp_dim = j->mesh_ndim;
      j->mesh_shape[j->mesh_ndim] = o->dims[d];
      snprintf(j->mesh_names[j->mesh_ndim], DT_MESH_NAME_LEN, "%s", sb_dim_names[d]);
      j->mesh_ndim++;
    }
  }
  if (j->mesh_ndim == 0) { /* world 1 */
    j->mesh_ndim = 1;
    j->mesh_shape[0] = 1;
    snprintf(j->mesh_names[0], DT_MESH_NAME_LEN, "tp");
  }
}

/* Rank 0's measures and verdict of a finished sharded job into r. */
static void result_of(const sb_opts *o, const job *j, sb_result *r) {
  const double tokens = (double)o->batch * o->seq;
  const dt_llama_config *c = &j->cfg;
  const double fpt = dt_llama_flops_per_token(c, o->seq);
  r->step_time_s = j->step_time_s;
  r->tokens_per_s = tokens / j->step_time_s;
  r->tflops = fpt * tokens / j->step_time_s / 1e12;
  r->peak_tflops = o->peak_tflops > 0 ? o->peak_tflops : NAN;
  r->mfu = r->tflops / r->peak_tflops;
  snprintf(r->peak_source, sizeof r->peak_source, "%s", o->peak_source);
  r->peak_mem_bytes = j->peak_mem;
  r->weights_saved = j->weights_saved;
  r->mem_params_bytes = j->mem[0];
  r->mem_grads_bytes = j->mem[1];
  r->mem_optimizer_bytes = j->mem[2];
  r->mem_activations_bytes = j->mem[3];
  r->max_abs_err = j->cmp.max_abs;
  r->max_rel_err = j->cmp.worst_rel;
  r->tolerance = j->cmp.worst_tol;
  r->n_compared = j->cmp.n;
  snprintf(r->worst, sizeof r->worst, "%s", j->cmp.worst);
  if (sb_cmp_ok(&j->cmp)) {
    snprintf(r->status, sizeof r->status, "ok");
  } else {
    snprintf(r->status, sizeof r->status, "mismatch");
    snprintf(r->reason, sizeof r->reason, "%s: relative error %.3g over tolerance %.1e (%lld of "
             "%lld compared tensors over)", j->cmp.worst, j->cmp.worst_rel, j->cmp.worst_tol,
             (long long)j->cmp.n_over, (long long)j->cmp.n);
  }
  r->pp = j->ppt; /* moved: the result owns it */
  r->n_comm = j->n_comm;
  if (j->n_comm) {
    r->comm = malloc(sizeof *r->comm * (size_t)j->n_comm);
    if (r->comm) memcpy(r->comm, j->comm, sizeof *r->comm * (size_t)j->n_comm);
    else r->n_comm = 0;
  }
}

void sb_execute(const sb_opts *o, sb_ref *cache, sb_stage stage, sb_result *r) {
  sb_result_init(r);
  dt_ctx hc; /* a host context: only for library error messages */
  dt_ctx_init(&hc, 0, 1);
  dt_plan *plan = NULL;
  job *j = NULL;
  dt_backend be;
  int world = 1;
  for (int i = 0; i < SB_NDIMS; i++) world *= o->dims[i];
  if (world != o->world) {
    failed(r, "mesh has %d ranks, world is %d", world, o->world);
    goto done;
  }
  if (unsupported(o, r)) goto done;
  j = calloc(1, sizeof *j);
  plan = calloc(1, sizeof *plan);
  if (!j || !plan) {
    failed(r, "out of memory");
    goto done;
  }
  j->o = o;
  if (sb_workload_config(&hc, o->model, o->workload, &j->cfg) != DT_OK) {
    failed(r, "%s", dt_last_error(&hc));
    goto done;
  }
  if (dt_dtype_parse(o->dtype, &j->dtype) != DT_OK ||
      (j->dtype != DT_F32 && j->dtype != DT_F64 && j->dtype != DT_BF16)) {
    skip(r, "dtype '%s': the harness verifies f32, f64 and bf16 only", o->dtype);
    goto done;
  }
  /* bf16: the sharded job's parameters and activations; the reference runs f32
   * on the CPU, and the verdict allows bf16's rounding (sb_cmp.param_dtype) */
  j->model_dtype = j->dtype;
  if (j->dtype == DT_BF16) {
    if (wl_of(o->workload) != WL_MODEL) {
      skip(r, "dtype bf16: workload '%s' (its input x is made in f32 and f64 only; model and "
              "block run bf16)", o->workload);
      goto done;
    }
    j->dtype = DT_F32;
  }
  /* the commands validated the plan up front; failing here, it changed since */
  if (dt_plan_load(&hc, o->plan_path, plan) != DT_OK) {
    failed(r, "plan: %s", sb_strip_rank(dt_last_error(&hc)));
    goto done;
  }
  if (plan_unfit(o, &hc, plan, &j->cfg, r) || over_memory(o, plan, r)) goto done;
  if (dt_backend_parse(o->backend, &be) != DT_OK || !dt_backend_available(be)) {
    skip(r, "backend '%s' is not built in", o->backend);
    goto done;
  }
  if (stage == SB_STAGE_CHECK || !reference(o, j, cache, r) || stage == SB_STAGE_PREPARE)
    goto done; /* status "" when it would run */
  j->reference = false;
  j->ref = cache;
  j->plan = plan;
  j->n_comm = 0;
  sharded_mesh(o, j);
  for (int i = 0; i < plan->n_entries; i++) /* fully_shard over dp_shard x cp */
    if (plan->entries[i].style.kind == DT_STYLE_FULLY_SHARD && (j->dps_dim >= 0 || j->cp_dim >= 0))
      j->fsdp = true;
  char why[DT_ERRMSG_LEN + 64];
  if (fault_parse(getenv("SHARDBENCH_FAULT"), &j->fault, why, sizeof why)) {
    failed(r, "SHARDBENCH_FAULT: %s", why);
    goto done;
  }
  if (launch(be, o->world, true, j, why, sizeof why) != DT_OK) {
    failed(r, "%s", why);
    goto done;
  }
  result_of(o, j, r); /* rank 0's; under MPI the other ranks' are not used */
  j->ppt = NULL;
done:
  free(plan);
  if (j) free(j->ppt);
  free(j);
  dt_ctx_release(&hc);
}

void sb_print_result(FILE *f, const sb_config *c, const sb_result *r, bool json) {
  if (json) {
    fputs("{\"key\": ", f);
    sb_json_str(f, c->key);
    fputs(", \"status\": ", f);
    sb_json_str(f, r->status);
    fputs(", \"reason\": ", f);
    if (r->reason[0]) sb_json_str(f, r->reason);
    else fputs("null", f);
#define NUM(name, v) \
  if (isfinite(v)) fprintf(f, ", \"" name "\": %.9g", (v)); \
  else fprintf(f, ", \"" name "\": null")
    NUM("step_time_s", r->step_time_s);
    NUM("tokens_per_s", r->tokens_per_s);
    NUM("tflops", r->tflops);
    NUM("mfu", r->mfu);
    NUM("peak_tflops", r->peak_tflops);
    NUM("max_abs_err", r->max_abs_err);
    NUM("max_rel_err", r->max_rel_err);
    NUM("tolerance", r->tolerance);
    NUM("est_mem_bytes", r->est_mem_bytes);
    NUM("est_need_bytes", r->est_need_bytes);
#undef NUM
    fprintf(f, ", \"compared\": %lld", (long long)r->n_compared);
    fputs(", \"worst\": ", f);
    if (r->worst[0]) sb_json_str(f, r->worst);
    else fputs("null", f);
    if (r->peak_mem_bytes >= 0) fprintf(f, ", \"peak_mem_bytes\": %lld", (long long)r->peak_mem_bytes);
    else fputs(", \"peak_mem_bytes\": null", f);
    const int64_t mem[4] = {r->mem_params_bytes, r->mem_grads_bytes, r->mem_optimizer_bytes,
                            r->mem_activations_bytes};
    static const char *const mem_k[4] = {"mem_params_bytes", "mem_grads_bytes",
                                         "mem_optimizer_bytes", "mem_activations_bytes"};
    for (int k = 0; k < 4; k++)
      if (mem[k] >= 0) fprintf(f, ", \"%s\": %lld", mem_k[k], (long long)mem[k]);
      else fprintf(f, ", \"%s\": null", mem_k[k]);
    fputs(", \"comm\": [", f);
    for (int i = 0; i < r->n_comm; i++) {
      const sb_comm_row *cr = &r->comm[i];
      fprintf(f, "%s{\"op\": ", i ? ", " : "");
      sb_json_str(f, cr->op);
      fputs(", \"mesh_dim\": ", f);
      sb_json_str(f, cr->mesh_dim);
      fputs(", \"phase\": ", f);
      sb_json_str(f, cr->phase);
      fprintf(f, ", \"calls\": %lld, \"payload_bytes\": %lld, \"wire_bytes\": %.17g, "
                 "\"seconds\": %.9g}",
              (long long)cr->calls, (long long)cr->payload_bytes, cr->wire_bytes, cr->seconds);
    }
    fputs("]}\n", f);
    return;
  }
  fprintf(f, "%s\n  status: %s%s%s\n", c->key, r->status, r->reason[0] ? ": " : "", r->reason);
  if (!isfinite(r->step_time_s)) return;
  fprintf(f, "  step time %.4f s (median), %.1f tokens/s, %.4f TFLOP/s, MFU %.2f%% of %.4f "
             "TFLOP/s (%s)\n", r->step_time_s, r->tokens_per_s, r->tflops, 100 * r->mfu,
          r->peak_tflops, r->peak_source[0] ? r->peak_source : "no peak");
  fprintf(f, "  peak %s memory per rank %.2f MiB (estimated %.2f MiB); vs reference: max abs "
             "err %.3g, max rel err %.3g (tolerance %.1e)\n",
          strstr(c->key, " device=") ? "device" : "host", (double)r->peak_mem_bytes / (1024.0 * 1024.0), r->est_mem_bytes / (1024.0 * 1024.0),
          r->max_abs_err, r->max_rel_err, r->tolerance);
  if (r->mem_params_bytes >= 0)
    fprintf(f, "  memory rank 0: params %.2f MiB, grads %.2f MiB, optimizer %.2f MiB, "
               "activations and buffers %.2f MiB\n",
            r->mem_params_bytes / 1048576.0, r->mem_grads_bytes / 1048576.0,
            r->mem_optimizer_bytes / 1048576.0, r->mem_activations_bytes / 1048576.0);
  if (r->worst[0]) fprintf(f, "  worst: %s\n", r->worst);
  if (r->n_comm) fprintf(f, "  comm per step (rank 0): %-15s %-13s %-9s %6s %12s %14s %10s\n", "op",
                         "mesh dim", "phase", "calls", "payload B", "wire B", "seconds");
  for (int i = 0; i < r->n_comm; i++) {
    const sb_comm_row *cr = &r->comm[i];
    fprintf(f, "  %24s%-15s %-13s %-9s %6lld %12lld %14.0f %10.6f\n", "", cr->op, cr->mesh_dim,
            cr->phase, (long long)cr->calls, (long long)cr->payload_bytes, cr->wire_bytes,
            cr->seconds);
  }
}
