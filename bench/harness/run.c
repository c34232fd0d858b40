/* bench/harness/run.c: the config runner (sb_execute) that `shardbench run` and `sweep`
 * share; the run command itself (flags, checks, DB, printing) is
 * bench/harness/run_cmd.c.
 *
 * A config is (model, workload, plan, mesh over TorchTitan's five dims pp,
 * dp_replicate, dp_shard, cp, tp, dtype, batch, seq, steps, backend, world).
 * The mesh keeps only the dims of size > 1, in that order, with their names
 * (torchtitan-llama.md 3.1). Workloads: `model` is the config's layers, `block`
 * the same model with one layer. The plan's [tp] entries go on the tp dim
 * (dt_parallelize_module); a dp_replicate dim adds data parallel
 * (dt_data_parallel_reduce_grads), as TorchTitan composes DDP with TP. Tokens are
 * Shard(0) on dp_replicate and Replicate on tp.
 *
 * Verification, as verify/test_parallel.c does it: the same model on a 1-rank
 * mesh (same seed, weights are sharding-invariant; same token LCG) is the
 * reference; every step's loss and step 0's every weight gradient (reduced and
 * gathered) are compared normwise (max |a - b| / max |ref|). Tolerances (TOL_*
 * below) carry their reasons. Verdict: ok, or mismatch naming the worst tensor.
 *
 * Measures (per timed step, after --warmup steps): step time = forward + loss +
 * backward + DP grad reduce + AdamW + end_step, the max over ranks, median over
 * the timed steps; tokens/s = batch*seq / step time; TFLOP/s by TorchTitan's
 * flops_per_token (torchtitan-llama.md 1.6) x tokens / step time; MFU = that /
 * --peak-tflops (default: a measured single-core sgemm rate x min(world, online
 * CPUs): what the ranks' cores could do on this machine; under MPI on several
 * nodes pass --peak-tflops); peak host memory = max over ranks of
 * ctx->mem.host_peak; comm rows from rank 0's ledger over the timed steps,
 * per step.
 *
 * Unsupported (status skipped, with the reason): pp, dp_shard or cp > 1 (no
 * pipeline, FSDP or context parallel in libdtensor), the embedding / attention /
 * feed_forward workloads, a plan whose dims do not fit the mesh, a plan with
 * [tp] entries on a mesh without tp (TorchTitan applies TP only when tp > 1; the
 * run would be the dp plan's), anything dt_plan_resolve refuses (heads or seq
 * not divisible by tp), a batch not divisible by dp_replicate.
 */
#include "config.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "store.h"
#include "../stats.h"

const char *const sb_dim_names[SB_NDIMS] = {"pp", "dp_replicate", "dp_shard", "cp", "tp"};

/* Weights are generated from this seed on both sides; any fixed value works. */
static const uint64_t SEED = 20260101;
/* TOL f64: a sharded run sums in another order (partial matmul sums reduced
 * across ranks, sequence-sharded norm-gradient sums): a few ulps (1e-16) per op,
 * grown mildly through the layers and softmaxes; test_parallel observes < 1e-13
 * on 2 layers. 1e-9 keeps 3+ orders of margin for 6 layers and bigger dims and
 * is 9 orders below a real bug (a wrong shard or a missing reduce is O(1)). */
static const double TOL_F64 = 1e-9;
/* TOL f32: the same reorderings at f32's unit roundoff (6e-8): sums of a few
 * hundred terms per dot product and reductions over the sequence and the batch
 * give ~1e-6 normwise; 1e-4 leaves two orders of margin for the 6 debugmodel
 * layers and is still 4 orders below an O(1) bug. */
static const double TOL_F32 = 1e-4;
/* A collective waiting longer than this fails the config instead of hanging the
 * sweep: a debugmodel step on 2 cores takes seconds. */
static const double LAUNCH_TIMEOUT_S = 300;
/* Most steps a run takes (warm-up + timed): the per-step arrays are fixed. */
enum { SB_MAX_STEPS = 1000 };
/* Most comm rows (op x group x phase) kept per config. */
enum { MAX_COMM = 64 };

/* ---- small helpers ---------------------------------------------------------- */

void sb_ref_free(sb_ref *r) {
  if (r->grad)
    for (int i = 0; i < r->n_mods; i++) free(r->grad[i]);
  free(r->grad);
  free(r->numel);
  free(r->loss);
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
  snprintf(c->key, sizeof c->key,
           "model=%s workload=%s plan=%s mesh=%s dtype=%s batch=%d seq=%d steps=%d backend=%s "
           "world=%d",
           o->model, o->workload, o->plan, mesh, o->dtype, o->batch, o->seq, o->steps, o->backend,
           o->world);
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

/* ---- one training job (reference or sharded) ------------------------------------ */

/* Token ids of a step: a fixed LCG (Knuth's MMIX constants, as test_parallel), so
 * every rank and the reference see the same batch. which 0: inputs, 1: targets. */
static void make_ids(int step, int which, int n, int vocab, int64_t *ids) {
  uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(2 * step + which + 1);
  for (int i = 0; i < n; i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    ids[i] = (int64_t)((x >> 33) % (uint64_t)vocab);
  }
}

typedef struct job {
  /* in */
  const sb_opts *o;
  dt_llama_config cfg;
  dt_dtype dtype;
  bool reference;               /* a 1-rank mesh, no plan */
  int mesh_ndim;
  int mesh_shape[SB_NDIMS];
  char mesh_names[SB_NDIMS][DT_MESH_NAME_LEN];
  int dp_dim, tp_dim;           /* mesh dims, -1: none */
  dt_plan *plan;                /* NULL: no entries */
  const sb_ref *ref;            /* compare against (sharded job) */
  double tol;
  /* out (rank 0) */
  sb_ref out;                   /* reference job: what it computed */
  double step_time_s;
  int64_t peak_mem;
  double max_abs, max_rel;
  char worst[160];
  int n_comm;
  sb_comm_row comm[MAX_COMM];
} job;

static dt_status to_host(dt_ctx *ctx, const dt_tensor *t, double **out, int64_t *n) {
  dt_placement pl[DT_MAX_MESH_DIMS];
  for (int i = 0; i < t->mesh_ndim; i++)
    pl[i] = t->pl[i].kind == DT_PL_PARTIAL ? dt_replicate() : t->pl[i];
  dt_tensor r;
  DT_CHECK(dt_redistribute(ctx, t, pl, DT_PLANNER_GREEDY, &r));
  dt_array a;
  dt_status s = dt_tensor_full(ctx, &r, &a);
  dt_tensor_free(ctx, &r);
  if (s != DT_OK) return s;
  *n = a.numel;
  *out = malloc((size_t)(a.numel ? a.numel : 1) * sizeof **out);
  if (!*out) {
    dt_array_free(ctx, &a);
    return dt_error(ctx, DT_ERR_NOMEM, "to_host", "no memory");
  }
  for (int64_t i = 0; i < a.numel; i++)
    (*out)[i] = a.dtype == DT_F64 ? ((const double *)a.data)[i]
                                  : (double)((const float *)a.data)[i];
  dt_array_free(ctx, &a);
  return DT_OK;
}

static dt_status make_ids_tensor(dt_ctx *ctx, dt_mesh *mesh, const job *j, int step, int which,
                                 dt_tensor *out) {
  int n = j->o->batch * j->o->seq;
  int64_t *ids = malloc((size_t)n * sizeof *ids);
  if (!ids) return dt_error(ctx, DT_ERR_NOMEM, "make_ids", "no memory");
  make_ids(step, which, n, j->cfg.vocab, ids);
  const int64_t shape[2] = {j->o->batch, j->o->seq};
  dt_array a;
  dt_status s = dt_array_wrap(ctx, DT_DEV_CPU, DT_I64, 2, shape, ids, &a);
  if (s == DT_OK) {
    dt_placement pl[DT_MAX_MESH_DIMS];
    for (int i = 0; i < dt_mesh_ndim(mesh); i++) pl[i] = dt_replicate();
    if (j->dp_dim >= 0 && !j->reference) pl[j->dp_dim] = dt_shard(0);
    s = dt_tensor_distribute(ctx, mesh, &a, pl, out);
  }
  free(ids);
  return s;
}

/* max |a - b| and max |ref| */
static void err_of(const double *a, const double *ref, int64_t n, double *abs_e, double *scale) {
  double md = 0, mr = 1e-300; /* 1e-300: keeps an all-zero reference finite */
  for (int64_t i = 0; i < n; i++) {
    double d = fabs(a[i] - ref[i]);
    if (!(d <= md)) md = d; /* NaN propagates */
    if (fabs(ref[i]) > mr) mr = fabs(ref[i]);
  }
  *abs_e = md;
  *scale = mr;
}

static void note_err(job *j, const char *what, double abs_e, double scale) {
  double rel = abs_e / scale;
  if (!(abs_e <= j->max_abs)) j->max_abs = abs_e;
  if (!(rel <= j->max_rel)) {
    j->max_rel = rel;
    snprintf(j->worst, sizeof j->worst, "%s", what);
  }
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

/* Trains warmup + steps steps on mesh; rank 0 fills j's outputs. */
static dt_status train(dt_ctx *ctx, dt_mesh *mesh, job *j) {
  const sb_opts *o = j->o;
  const int total = o->warmup + o->steps;
  dt_model *m = NULL;
  dt_status s = DT_OK;
  double *times = calloc((size_t)total, sizeof *times);
  double *loss = calloc((size_t)total, sizeof *loss);
  double **grad = NULL;
  int64_t *numel = NULL;
  if (!times || !loss) {
    s = dt_error(ctx, DT_ERR_NOMEM, "train", "no memory");
    goto done;
  }
  DT_CHECK_GOTO(dt_model_create(ctx, mesh, &j->cfg, j->dtype, SEED, &m), s, done);
  grad = calloc((size_t)m->n_mods, sizeof *grad);
  numel = calloc((size_t)m->n_mods, sizeof *numel);
  if (!grad || !numel) {
    s = dt_error(ctx, DT_ERR_NOMEM, "train", "no memory");
    goto done;
  }
  if (j->plan && j->tp_dim >= 0) {
    int ptp = dt_plan_dim(j->plan, "tp");
    dt_plan_entry *e = malloc(sizeof(dt_plan_entry) * DT_PLAN_MAX_ENTRIES);
    if (!e) {
      s = dt_error(ctx, DT_ERR_NOMEM, "train", "no memory");
      goto done;
    }
    int n = 0;
    for (int i = 0; i < j->plan->n_entries; i++)
      if (j->plan->entries[i].dim == ptp) e[n++] = j->plan->entries[i];
    s = dt_parallelize_module(ctx, m, j->tp_dim, e, n);
    free(e);
    if (s != DT_OK) goto done;
  }
  DT_CHECK_GOTO(dt_model_materialize(ctx, m), s, done);
  const dt_adamw opt = DT_ADAMW_DEFAULT;
  dt_ledger_clear(ctx);
  for (int step = 0; step < total; step++) {
    const bool timed = step >= o->warmup;
    dt_tensor tok, tgt;
    memset(&tok, 0, sizeof tok);
    memset(&tgt, 0, sizeof tgt);
    dt_ledger_enable(ctx, false);
    DT_CHECK_GOTO(make_ids_tensor(ctx, mesh, j, step, 0, &tok), s, done);
    s = make_ids_tensor(ctx, mesh, j, step, 1, &tgt);
    if (s != DT_OK) {
      dt_tensor_free(ctx, &tok);
      goto done;
    }
    DT_CHECK_GOTO(dt_comm_barrier(ctx->world), s, done); /* every rank starts the step together */
    dt_ledger_enable(ctx, timed);
    dt_ctx_set_phase(ctx, "forward");
    double t0 = dt_now();
    dt_var *logits = NULL, *lossv = NULL;
    s = dt_model_forward(ctx, m, &tok, &logits);
    if (s == DT_OK) s = dt_model_loss(ctx, m, logits, &tgt, &lossv);
    if (s == DT_OK) s = dt_model_backward(ctx, m, lossv);
    if (s == DT_OK && j->dp_dim >= 0 && !j->reference)
      s = dt_data_parallel_reduce_grads(ctx, m, j->dp_dim);
    double t1 = dt_now();
    dt_tensor_free(ctx, &tok);
    dt_tensor_free(ctx, &tgt);
    if (s != DT_OK) goto done;
    /* results, with the ledger off and outside the timed region */
    dt_ledger_enable(ctx, false);
    dt_ctx_set_phase(ctx, "check");
    double *lv = NULL;
    int64_t ln = 0;
    DT_CHECK_GOTO(to_host(ctx, dt_var_value(lossv), &lv, &ln), s, done);
    loss[step] = lv[0];
    free(lv);
    if (step == 0)
      for (int i = 0; i < m->n_mods; i++) {
        if (!m->mods[i].weight) continue;
        const dt_tensor *g = dt_var_grad(m->mods[i].weight);
        if (!g) {
          s = dt_error(ctx, DT_ERR_INTERNAL, "train", "%s: no gradient", m->mods[i].fqn);
          goto done;
        }
        DT_CHECK_GOTO(to_host(ctx, g, &grad[i], &numel[i]), s, done);
      }
    dt_ledger_enable(ctx, timed);
    dt_ctx_set_phase(ctx, "optimizer");
    double t2 = dt_now();
    DT_CHECK_GOTO(dt_model_adamw_step(ctx, m, &opt), s, done);
    DT_CHECK_GOTO(dt_model_end_step(ctx, m), s, done);
    times[step] = (t1 - t0) + (dt_now() - t2);
    dt_ctx_set_phase(ctx, "");
  }
  dt_ledger_enable(ctx, false);
  /* step times: max over ranks; memory: max over ranks */
  DT_CHECK_GOTO(dt_comm_all_reduce(ctx->world, times, times, (size_t)total, DT_F64, DT_RED_MAX), s,
                done);
  double mem = (double)ctx->mem.host_peak;
  DT_CHECK_GOTO(dt_comm_all_reduce(ctx->world, &mem, &mem, 1, DT_F64, DT_RED_MAX), s, done);
  if (ctx->rank == 0) {
    j->step_time_s = o->steps > 0 ? sb_median(times + o->warmup, o->steps) : NAN;
    j->peak_mem = (int64_t)mem;
    for (size_t i = 0; i < ctx->ledger.n; i++) add_comm(j, &ctx->ledger.rows[i]);
    for (int i = 0; i < j->n_comm; i++) { /* per step */
      sb_comm_row *c = &j->comm[i];
      c->calls = (c->calls + o->steps / 2) / o->steps;
      c->payload_bytes /= o->steps;
      c->wire_bytes /= o->steps;
      c->seconds /= o->steps;
    }
    if (j->reference) {
      j->out.n_steps = total;
      j->out.loss = loss;
      loss = NULL;
      j->out.n_mods = m->n_mods;
      j->out.grad = grad;
      j->out.numel = numel;
      grad = NULL;
      numel = NULL;
    } else {
      const sb_ref *r = j->ref;
      j->max_abs = j->max_rel = 0;
      snprintf(j->worst, sizeof j->worst, "none");
      for (int st = 0; st < total && st < r->n_steps; st++) {
        char what[64];
        snprintf(what, sizeof what, "loss step %d", st);
        note_err(j, what, fabs(loss[st] - r->loss[st]), fmax(fabs(r->loss[st]), 1e-300));
      }
      for (int i = 0; i < m->n_mods && i < r->n_mods; i++) {
        if (!r->grad[i]) continue;
        char what[96];
        snprintf(what, sizeof what, "%s gradient", m->mods[i].fqn);
        if (!grad[i] || numel[i] != r->numel[i]) {
          j->max_abs = j->max_rel = INFINITY;
          snprintf(j->worst, sizeof j->worst, "%s missing or misshapen", what);
          continue;
        }
        double ae, sc;
        err_of(grad[i], r->grad[i], r->numel[i], &ae, &sc);
        note_err(j, what, ae, sc);
      }
    }
  }
done:
  dt_ledger_enable(ctx, false);
  dt_ctx_set_phase(ctx, "");
  if (grad && m)
    for (int i = 0; i < m->n_mods; i++) free(grad[i]);
  free(grad);
  free(numel);
  free(times);
  free(loss);
  if (m) {
    dt_parallelize_release(ctx, m);
    dt_model_free(ctx, m);
  }
  return s;
}

static dt_status job_rank(dt_ctx *ctx, void *arg) {
  job *j = arg;
  dt_mesh *mesh = NULL;
  const char *names[SB_NDIMS];
  for (int i = 0; i < j->mesh_ndim; i++) names[i] = j->mesh_names[i];
  DT_CHECK(dt_mesh_create(ctx, ctx->world, j->mesh_ndim, j->mesh_shape, names, &mesh));
  dt_status s = train(ctx, mesh, j);
  dt_mesh_free(mesh);
  return s;
}

static dt_status launch(dt_backend b, int world, job *j, char *why, size_t whyn) {
  dt_launch_opts lo;
  memset(&lo, 0, sizeof lo);
  lo.backend = b;
  lo.world = world;
  lo.timeout_s = LAUNCH_TIMEOUT_S;
  lo.device = DT_DEV_CPU;
  dt_launch_report rep;
  memset(&rep, 0, sizeof rep);
  dt_status s = dt_launch(&lo, job_rank, j, &rep);
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
  if (o->dims[0] > 1)
    skip(r, "pp=%d: pipeline parallel is not implemented in libdtensor", o->dims[0]);
  else if (o->dims[2] > 1)
    skip(r, "dp_shard=%d: FSDP (sharded data parallel) is not implemented in libdtensor",
         o->dims[2]);
  else if (o->dims[3] > 1)
    skip(r, "cp=%d: context parallel is not implemented in libdtensor", o->dims[3]);
  else if (strcmp(o->workload, "model") && strcmp(o->workload, "block"))
    skip(r, "workload '%s' is not implemented (model and block are)", o->workload);
  else
    return false;
  return true;
}

/* Fits the plan's dims to the mesh and resolves it against the model (heads,
 * seq divisible by tp); skips the config with the reason when it does not fit.
 * True when skipped. */
static bool plan_unfit(const sb_opts *o, dt_ctx *hc, dt_plan *plan, const dt_llama_config *cfg,
                       sb_result *r) {
  int ptp = dt_plan_dim(plan, "tp");
  bool has_tp = false;
  for (int i = 0; i < plan->n_entries; i++) {
    if (plan->entries[i].dim == ptp) {
      has_tp = true;
      continue;
    }
    skip(r, "plan '%s' has entries on [%s]; the harness applies [tp] entries only", o->plan,
         plan->dim_names[plan->entries[i].dim]);
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
  int plan_world = 1;
  for (int i = 0; i < plan->n_dims; i++) {
    int d = 0;
    while (d < SB_NDIMS && strcmp(plan->dim_names[i], sb_dim_names[d])) d++;
    plan->dim_sizes[i] = d < SB_NDIMS ? o->dims[d] : 1;
    plan_world *= plan->dim_sizes[i];
  }
  if (dt_plan_resolve(hc, plan, plan_world, cfg, o->seq) != DT_OK) {
    skip(r, "%s", sb_strip_rank(dt_last_error(hc)));
    return true;
  }
  if (o->batch % o->dims[1]) {
    skip(r, "batch %d is not divisible by dp_replicate=%d", o->batch, o->dims[1]);
    return true;
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
  char rkey[256];
  snprintf(rkey, sizeof rkey, "%s/%s/%s/%d/%d/%d", o->model, o->workload, o->dtype, o->batch,
           o->seq, o->warmup + o->steps);
  if (!strcmp(cache->key, rkey)) return true;
  char why[DT_ERRMSG_LEN + 64];
  sb_ref_free(cache);
  j->reference = true;
  j->mesh_ndim = 1;
  j->mesh_shape[0] = 1;
  snprintf(j->mesh_names[0], DT_MESH_NAME_LEN, "ref");
  j->dp_dim = j->tp_dim = -1;
  if (launch(DT_BACKEND_THREADS, 1, j, why, sizeof why) != DT_OK) {
    sb_ref_free(&j->out);
    failed(r, "reference: %s", why);
    return false;
  }
  *cache = j->out;
  memset(&j->out, 0, sizeof j->out);
  snprintf(cache->key, sizeof cache->key, "%s", rkey);
  return true;
}

/* The sharded job's mesh: the dims of size > 1 in TorchTitan's order. */
static void sharded_mesh(const sb_opts *o, job *j) {
  j->mesh_ndim = 0;
  j->dp_dim = j->tp_dim = -1;
  for (int d = 0; d < SB_NDIMS; d++)
    if (o->dims[d] > 1) {
      if (d == 1) j->dp_dim = j->mesh_ndim;
      if (d == 4) j->tp_dim = j->mesh_ndim;
      j->mesh_shape[j->mesh_ndim] = o->dims[d];
      snprintf(j->mesh_names[j->mesh_ndim], DT_MESH_NAME_LEN, "%s", sb_dim_names[d]);
      j->mesh_ndim++;
    }
  if (j->mesh_ndim == 0) { /* world 1 */
    j->mesh_ndim = 1;
    j->mesh_shape[0] = 1;
    snprintf(j->mesh_names[0], DT_MESH_NAME_LEN, "tp");
  }
}

/* Rank 0's measures and verdict of a finished sharded job into r. */
static void measures(const sb_opts *o, const job *j, sb_result *r) {
  const double tokens = (double)o->batch * o->seq;
  const dt_llama_config *c = &j->cfg;
  const double n_embed = (double)c->vocab * c->dim;
  const double fpt = 6.0 * ((double)dt_llama_nparams(c) - n_embed) +
                     12.0 * c->n_layers * c->n_heads * (double)(c->dim / c->n_heads) * o->seq;
  r->step_time_s = j->step_time_s;
  r->tokens_per_s = tokens / j->step_time_s;
  r->tflops = fpt * tokens / j->step_time_s / 1e12;
  r->peak_tflops = o->peak_tflops > 0 ? o->peak_tflops : NAN;
  r->mfu = r->tflops / r->peak_tflops;
  snprintf(r->peak_source, sizeof r->peak_source, "%s", o->peak_source);
  r->peak_mem_bytes = j->peak_mem;
  r->max_abs_err = j->max_abs;
  r->max_rel_err = j->max_rel;
  r->tolerance = j->tol;
  if (j->max_rel <= j->tol) {
    snprintf(r->status, sizeof r->status, "ok");
  } else {
    snprintf(r->status, sizeof r->status, "mismatch");
    snprintf(r->reason, sizeof r->reason, "%s: relative error %.3g over tolerance %.0e", j->worst,
             j->max_rel, j->tol);
  }
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
  if (dt_llama_config_get(&hc, o->model, &j->cfg) != DT_OK) {
    failed(r, "%s", dt_last_error(&hc));
    goto done;
  }
  if (!strcmp(o->workload, "block")) j->cfg.n_layers = 1; /* one TransformerBlock */
  if (dt_dtype_parse(o->dtype, &j->dtype) != DT_OK || (j->dtype != DT_F32 && j->dtype != DT_F64)) {
    skip(r, "dtype '%s': the harness verifies f32 and f64 only", o->dtype);
    goto done;
  }
  j->tol = j->dtype == DT_F64 ? TOL_F64 : TOL_F32;
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
  char why[DT_ERRMSG_LEN + 64];
  if (launch(be, o->world, j, why, sizeof why) != DT_OK) {
    failed(r, "%s", why);
    goto done;
  }
  measures(o, j, r); /* rank 0's; under MPI the other ranks' are not used */
done:
  free(plan);
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
    if (r->peak_mem_bytes >= 0) fprintf(f, ", \"peak_mem_bytes\": %lld", (long long)r->peak_mem_bytes);
    else fputs(", \"peak_mem_bytes\": null", f);
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
  fprintf(f, "  peak host memory per rank %.2f MiB (estimated %.2f MiB); vs reference: max abs "
             "err %.3g, max rel err %.3g (tolerance %.0e)\n",
          (double)r->peak_mem_bytes / (1024.0 * 1024.0), r->est_mem_bytes / (1024.0 * 1024.0),
          r->max_abs_err, r->max_rel_err, r->tolerance);
  if (r->n_comm) fprintf(f, "  comm per step (rank 0): %-15s %-13s %-9s %6s %12s %14s %10s\n", "op",
                         "mesh dim", "phase", "calls", "payload B", "wire B", "seconds");
  for (int i = 0; i < r->n_comm; i++) {
    const sb_comm_row *cr = &r->comm[i];
    fprintf(f, "  %24s%-15s %-13s %-9s %6lld %12lld %14.0f %10.6f\n", "", cr->op, cr->mesh_dim,
            cr->phase, (long long)cr->calls, (long long)cr->payload_bytes, cr->wire_bytes,
            cr->seconds);
  }
}
