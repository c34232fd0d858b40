/* bench/harness/run.c: `shardbench run`, and the config runner that `sweep` shares.
 *
 *   shardbench run --model debugmodel --workload model|block --plan NAME
 *                  --mesh dp_replicate:2,tp:4 | --tp 4 --dp-replicate 2 ...
 *                  --dtype f32|f64 --batch N --seq N --steps N [--warmup N]
 *                  [--backend threads|mpi] [--world N] [--peak-tflops X]
 *                  [--plans-dir DIR] [--db FILE] [--json]
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

#include <cblas.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "datadir.h"
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
/* The sgemm peak probe: n x n x n products (512: big enough to reach the BLAS
 * kernel's steady rate, 0.27 GFLOP, a few ms), best of PEAK_REPS after one warm-up. */
enum { PEAK_N = 512, PEAK_REPS = 5 };
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

void sb_plans_dir(const char *flag, char *out, size_t n) {
  sb_data_dir(SB_DATA_PLANS, flag, out, n); /* none found: out names the installed one */
}

double sb_default_peak_tflops(int world) {
  static double per_core = 0; /* measured once per process */
  if (per_core <= 0) {
    float *a = malloc(sizeof(float) * PEAK_N * PEAK_N * 3);
    if (!a) return NAN;
    for (long i = 0; i < 3L * PEAK_N * PEAK_N; i++) a[i] = (float)((i % 17) * 0.01);
    int prev = dt_device_cpu_blas_threads(1);
    double best = 1e30;
    for (int r = 0; r <= PEAK_REPS; r++) {
      double t0 = dt_now();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, PEAK_N, PEAK_N, PEAK_N, 1.0f, a,
                  PEAK_N, a + PEAK_N * PEAK_N, PEAK_N, 0.0f, a + 2 * PEAK_N * PEAK_N, PEAK_N);
      double t = dt_now() - t0;
      if (r > 0 && t < best) best = t;
    }
    if (prev > 0) dt_device_cpu_blas_threads(prev);
    free(a);
    per_core = 2.0 * PEAK_N * PEAK_N * PEAK_N / best / 1e12;
  }
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  if (ncpu < 1) ncpu = 1;
  return per_core * (double)(world < ncpu ? world : ncpu);
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
    for (size_t i = 0; i < dt_ledger_of(ctx)->n; i++) add_comm(j, &dt_ledger_of(ctx)->rows[i]);
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

void sb_execute(const sb_opts *o, sb_ref *cache, bool prepare_only, sb_result *r) {
  sb_result_init(r);
  dt_ctx hc; /* a host context: only for library error messages */
  dt_ctx_init(&hc, 0, 1);
  dt_plan *plan = NULL;
  job *j = NULL;
  int world = 1;
  for (int i = 0; i < SB_NDIMS; i++) world *= o->dims[i];
  if (world != o->world) {
    failed(r, "mesh has %d ranks, world is %d", world, o->world);
    goto done;
  }
  if (o->dims[0] > 1) {
    skip(r, "pp=%d: pipeline parallel is not implemented in libdtensor", o->dims[0]);
    goto done;
  }
  if (o->dims[2] > 1) {
    skip(r, "dp_shard=%d: FSDP (sharded data parallel) is not implemented in libdtensor",
         o->dims[2]);
    goto done;
  }
  if (o->dims[3] > 1) {
    skip(r, "cp=%d: context parallel is not implemented in libdtensor", o->dims[3]);
    goto done;
  }
  if (strcmp(o->workload, "model") && strcmp(o->workload, "block")) {
    skip(r, "workload '%s' is not implemented (model and block are)", o->workload);
    goto done;
  }
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
  char path[1024];
  snprintf(path, sizeof path, "%s/%s.plan", o->plans_dir, o->plan);
  if (dt_plan_load(&hc, path, plan) != DT_OK) {
    failed(r, "plan: %s", dt_last_error(&hc));
    goto done;
  }
  /* fit the plan's dims to the mesh */
  bool plan_has_tp_entries = false;
  int ptp = dt_plan_dim(plan, "tp");
  for (int i = 0; i < plan->n_entries; i++)
    if (plan->entries[i].dim == ptp) plan_has_tp_entries = true;
  for (int i = 0; i < plan->n_entries; i++)
    if (plan->entries[i].dim != ptp) {
      skip(r, "plan '%s' has entries on [%s]; the harness applies [tp] entries only", o->plan,
           plan->dim_names[plan->entries[i].dim]);
      goto done;
    }
  for (int d = 0; d < SB_NDIMS; d++) {
    int pi = dt_plan_dim(plan, sb_dim_names[d]);
    if (o->dims[d] > 1 && pi < 0 && d != 1) {
      skip(r, "plan '%s' has no dim %s (the mesh has %s=%d)", o->plan, sb_dim_names[d],
           sb_dim_names[d], o->dims[d]);
      goto done;
    }
    if (pi >= 0 && plan->dim_sizes[pi] != -1 && plan->dim_sizes[pi] != o->dims[d]) {
      skip(r, "plan '%s' fixes %s=%d; the mesh has %s=%d", o->plan, sb_dim_names[d],
           plan->dim_sizes[pi], sb_dim_names[d], o->dims[d]);
      goto done;
    }
  }
  if (plan_has_tp_entries && o->dims[4] == 1) {
    skip(r, "tp=1: the plan's [tp] entries would not apply (TorchTitan applies TP only when "
            "tp > 1); the run equals plan dp's");
    goto done;
  }
  int plan_world = 1;
  for (int i = 0; i < plan->n_dims; i++) {
    int d = 0;
    while (d < SB_NDIMS && strcmp(plan->dim_names[i], sb_dim_names[d])) d++;
    plan->dim_sizes[i] = d < SB_NDIMS ? o->dims[d] : 1;
    plan_world *= plan->dim_sizes[i];
  }
  if (dt_plan_resolve(&hc, plan, plan_world, &j->cfg, o->seq) != DT_OK) {
    skip(r, "%s", dt_last_error(&hc));
    goto done;
  }
  sb_plan_traits_get(plan, &j->cfg, &r->plan_traits); /* for the store's framework baselines */
  if (o->batch % o->dims[1]) {
    skip(r, "batch %d is not divisible by dp_replicate=%d", o->batch, o->dims[1]);
    goto done;
  }
  dt_backend be;
  if (dt_backend_parse(o->backend, &be) != DT_OK || !dt_backend_available(be)) {
    skip(r, "backend '%s' is not built in", o->backend);
    goto done;
  }
  /* the reference: cached by (model, workload, dtype, batch, seq, steps) */
  char rkey[256];
  snprintf(rkey, sizeof rkey, "%s/%s/%s/%d/%d/%d", o->model, o->workload, o->dtype, o->batch,
           o->seq, o->warmup + o->steps);
  char why[DT_ERRMSG_LEN + 64];
  if (strcmp(cache->key, rkey)) {
    sb_ref_free(cache);
    j->reference = true;
    j->mesh_ndim = 1;
    j->mesh_shape[0] = 1;
    snprintf(j->mesh_names[0], DT_MESH_NAME_LEN, "ref");
    j->dp_dim = j->tp_dim = -1;
    if (launch(DT_BACKEND_THREADS, 1, j, why, sizeof why) != DT_OK) {
      sb_ref_free(&j->out);
      failed(r, "reference: %s", why);
      goto done;
    }
    *cache = j->out;
    memset(&j->out, 0, sizeof j->out);
    snprintf(cache->key, sizeof cache->key, "%s", rkey);
  }
  if (prepare_only) goto done; /* status "": it would run */
  /* the sharded job */
  j->reference = false;
  j->ref = cache;
  j->plan = plan;
  j->n_comm = 0;
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
  if (launch(be, o->world, j, why, sizeof why) != DT_OK) {
    failed(r, "%s", why);
    goto done;
  }
  /* rank 0 (this process under MPI: only rank 0's values are meaningful) */
  const double tokens = (double)o->batch * o->seq;
  const dt_llama_config *c = &j->cfg;
  const double n_embed = (double)c->vocab * c->dim;
  const double fpt = 6.0 * ((double)dt_llama_nparams(c) - n_embed) +
                     12.0 * c->n_layers * c->n_heads * (double)(c->dim / c->n_heads) * o->seq;
  r->step_time_s = j->step_time_s;
  r->tokens_per_s = tokens / j->step_time_s;
  r->tflops = fpt * tokens / j->step_time_s / 1e12;
  r->peak_tflops = o->peak_tflops > 0 ? o->peak_tflops : sb_default_peak_tflops(o->world);
  r->mfu = r->tflops / r->peak_tflops;
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
  fprintf(f, "  step time %.4f s (median), %.1f tokens/s, %.4f TFLOP/s, MFU %.2f%% of %.4f TFLOP/s\n",
          r->step_time_s, r->tokens_per_s, r->tflops, 100 * r->mfu, r->peak_tflops);
  fprintf(f, "  peak host memory per rank %.2f MiB; vs reference: max abs err %.3g, max rel err "
             "%.3g (tolerance %.0e)\n",
          (double)r->peak_mem_bytes / (1024.0 * 1024.0), r->max_abs_err, r->max_rel_err,
          r->tolerance);
  if (r->n_comm) fprintf(f, "  comm per step (rank 0): %-15s %-13s %-9s %6s %12s %14s %10s\n", "op",
                         "mesh dim", "phase", "calls", "payload B", "wire B", "seconds");
  for (int i = 0; i < r->n_comm; i++) {
    const sb_comm_row *cr = &r->comm[i];
    fprintf(f, "  %24s%-15s %-13s %-9s %6lld %12lld %14.0f %10.6f\n", "", cr->op, cr->mesh_dim,
            cr->phase, (long long)cr->calls, (long long)cr->payload_bytes, cr->wire_bytes,
            cr->seconds);
  }
}

/* ---- shardbench run -------------------------------------------------------------- */

const char sb_run_usage[] =
    "usage: shardbench run [--model debugmodel] [--workload model|block] [--plan NAME]\n"
    "                      [--mesh dp_replicate:2,tp:4 | --pp N --dp-replicate N --dp-shard N\n"
    "                       --cp N --tp N] [--dtype f32|f64] [--batch 8] [--seq 32]\n"
    "                      [--steps 2] [--warmup 1] [--backend threads|mpi] [--world N]\n"
    "                      [--peak-tflops X] [--plans-dir DIR] [--db FILE] [--json]\n"
    "\n"
    "Runs one config: builds the mesh over TorchTitan's dims pp, dp_replicate, dp_shard,\n"
    "cp, tp (only dims of size > 1, in that order), applies plans/NAME.plan (the [tp]\n"
    "entries on tp; dp_replicate adds data parallel), trains warm-up + timed steps with\n"
    "AdamW, and checks every loss and step 0's weight gradients against the same model\n"
    "on one rank (tolerance f64 1e-9, f32 1e-4, relative). Prints step time (median),\n"
    "tokens/s, TFLOP/s (TorchTitan's flops_per_token), MFU, peak host memory per rank\n"
    "and comm per step. Unsupported configs (pp, dp_shard, cp > 1; a plan that does not\n"
    "fit the mesh) are reported as skipped with the reason.\n"
    "\n"
    "  --world N        ranks (default: the mesh's product; alone: tp = N)\n"
    "  --peak-tflops X  MFU denominator (default: measured 1-core sgemm x min(world, CPUs))\n"
    "  --plans-dir DIR  where NAME.plan lives (default: $SHARDBENCH_PLANS,\n"
    "                   $SHARDBENCH_DATADIR/plans, ./plans, the installed plans/)\n"
    "  --db FILE        append runs/configs/results/comm rows (results/schema.sql)\n"
    "  --json           one JSON object instead of the summary\n"
    "\n"
    "Exit: 0 ok or skipped, 1 mismatch or failure, 2 bad flags.\n";

/* "dp_replicate:2,tp:4" into dims (all others 1). */
static int parse_mesh_named(const char *s, int dims[SB_NDIMS], char *err, size_t errn) {
  for (int i = 0; i < SB_NDIMS; i++) dims[i] = 1;
  if (!strcmp(s, "1")) return 0;
  const char *p = s;
  int last = -1;
  while (*p) {
    size_t l = strcspn(p, ":,");
    int d = 0;
    while (d < SB_NDIMS && (strlen(sb_dim_names[d]) != l || strncmp(p, sb_dim_names[d], l))) d++;
    if (d == SB_NDIMS || p[l] != ':') {
      snprintf(err, errn, "expected NAME:SIZE,... with names pp, dp_replicate, dp_shard, cp, tp, "
                          "got '%s'", s);
      return -1;
    }
    if (d <= last) {
      snprintf(err, errn, "dims must be distinct, in the order pp, dp_replicate, dp_shard, cp, tp");
      return -1;
    }
    last = d;
    p += l + 1;
    size_t v = strcspn(p, ",");
    char num[16];
    if (v == 0 || v >= sizeof num) {
      snprintf(err, errn, "bad size in '%s'", s);
      return -1;
    }
    memcpy(num, p, v);
    num[v] = '\0';
    long x;
    if (sb_parse_long(num, 1, SB_MAX_WORLD, &x, err, errn) != DT_OK) return -1;
    dims[d] = (int)x;
    p += v;
    if (*p == ',') p++;
  }
  return 0;
}

int sb_cmd_run(int argc, char **argv) {
  static const char CMD[] = "run";
  enum { O_MODEL = 256, O_WORKLOAD, O_PLAN, O_MESH, O_PP, O_DPR, O_DPS, O_CP, O_TP, O_DTYPE,
         O_BATCH, O_SEQ, O_STEPS, O_WARMUP, O_BACKEND, O_WORLD, O_PEAK, O_PLANS, O_DB, O_JSON,
         O_HELP };
  static const struct option lopts[] = {
      {"model", required_argument, NULL, O_MODEL}, {"workload", required_argument, NULL, O_WORKLOAD},
      {"plan", required_argument, NULL, O_PLAN},   {"mesh", required_argument, NULL, O_MESH},
      {"pp", required_argument, NULL, O_PP},       {"dp-replicate", required_argument, NULL, O_DPR},
      {"dp-shard", required_argument, NULL, O_DPS}, {"cp", required_argument, NULL, O_CP},
      {"tp", required_argument, NULL, O_TP},       {"dtype", required_argument, NULL, O_DTYPE},
      {"batch", required_argument, NULL, O_BATCH}, {"seq", required_argument, NULL, O_SEQ},
      {"steps", required_argument, NULL, O_STEPS}, {"warmup", required_argument, NULL, O_WARMUP},
      {"backend", required_argument, NULL, O_BACKEND}, {"world", required_argument, NULL, O_WORLD},
      {"peak-tflops", required_argument, NULL, O_PEAK},
      {"plans-dir", required_argument, NULL, O_PLANS}, {"db", required_argument, NULL, O_DB},
      {"json", no_argument, NULL, O_JSON},         {"help", no_argument, NULL, O_HELP},
      {NULL, 0, NULL, 0}};
  sb_opts o;
  memset(&o, 0, sizeof o);
  snprintf(o.model, sizeof o.model, "debugmodel");
  snprintf(o.workload, sizeof o.workload, "model");
  snprintf(o.plan, sizeof o.plan, "torchtitan-tp-sp");
  snprintf(o.dtype, sizeof o.dtype, "f32");
  snprintf(o.backend, sizeof o.backend, "threads");
  o.batch = 8;   /* debugmodel dims, a small batch: seconds per step on 2 cores */
  o.seq = 32;
  o.steps = 2;   /* a median of 2 timed steps */
  o.warmup = 1;  /* the first step faults in pages and fills the caches */
  for (int i = 0; i < SB_NDIMS; i++) o.dims[i] = 1;
  bool dims_given = false, mesh_given = false, json = false;
  long world = 0;
  const char *db = NULL, *plans_flag = NULL;
  char err[SB_ERR_LEN];
  long v;
  int ch;
  sb_getopt_reset();
  while ((ch = getopt_long(argc, argv, ":", lopts, NULL)) != -1) {
    char flag[40]; /* "--name" of the option being parsed (for messages) */
    snprintf(flag, sizeof flag, "--%s", ch >= O_MODEL && ch <= O_HELP ? lopts[ch - O_MODEL].name : "?");
    switch (ch) {
    case O_MODEL: case O_WORKLOAD: case O_PLAN: case O_DTYPE: case O_BACKEND: {
      char *dst = ch == O_MODEL ? o.model : ch == O_WORKLOAD ? o.workload
                  : ch == O_PLAN ? o.plan : ch == O_DTYPE ? o.dtype : o.backend;
      size_t cap = ch == O_MODEL ? sizeof o.model : ch == O_WORKLOAD ? sizeof o.workload
                   : ch == O_PLAN ? sizeof o.plan : ch == O_DTYPE ? sizeof o.dtype
                   : sizeof o.backend;
      if (strlen(optarg) >= cap || !optarg[0])
        return sb_usage_error(CMD, NULL, "value '%s' is empty or longer than %zu characters",
                              optarg, cap - 1);
      snprintf(dst, cap, "%s", optarg);
      break;
    }
    case O_MESH:
      if (parse_mesh_named(optarg, o.dims, err, sizeof err))
        return sb_usage_error(CMD, "--mesh", "%s", err);
      mesh_given = true;
      break;
    case O_PP: case O_DPR: case O_DPS: case O_CP: case O_TP:
      if (sb_parse_long(optarg, 1, SB_MAX_WORLD, &v, err, sizeof err) != DT_OK)
        return sb_usage_error(CMD, flag, "%s", err);
      o.dims[ch - O_PP] = (int)v;
      dims_given = true;
      break;
    case O_BATCH: case O_SEQ: case O_STEPS: case O_WARMUP: {
      long lo = ch == O_WARMUP ? 0 : 1, hi = ch == O_STEPS || ch == O_WARMUP ? SB_MAX_STEPS / 2 : 1 << 20;
      if (sb_parse_long(optarg, lo, hi, &v, err, sizeof err) != DT_OK)
        return sb_usage_error(CMD, flag, "%s", err);
      if (ch == O_BATCH) o.batch = (int)v;
      else if (ch == O_SEQ) o.seq = (int)v;
      else if (ch == O_STEPS) o.steps = (int)v;
      else o.warmup = (int)v;
      break;
    }
    case O_WORLD:
      if (sb_parse_long(optarg, 1, SB_MAX_WORLD, &world, err, sizeof err) != DT_OK)
        return sb_usage_error(CMD, "--world", "%s", err);
      break;
    case O_PEAK: {
      char *end;
      o.peak_tflops = strtod(optarg, &end);
      if (end == optarg || *end || !(o.peak_tflops > 0) || !isfinite(o.peak_tflops))
        return sb_usage_error(CMD, "--peak-tflops", "expected a positive number, got '%s'",
                              optarg);
      break;
    }
    case O_PLANS: plans_flag = optarg; break;
    case O_DB: db = optarg; break;
    case O_JSON: json = true; break;
    case O_HELP: fputs(sb_run_usage, stdout); return SB_EXIT_OK;
    default: return sb_getopt_error(CMD, ch, argv, lopts);
    }
  }
  if (optind < argc) return sb_usage_error(CMD, NULL, "unexpected argument '%s'", argv[optind]);
  if (mesh_given && dims_given)
    return sb_usage_error(CMD, NULL, "give --mesh or --pp/--dp-replicate/--dp-shard/--cp/--tp, "
                                     "not both");
  dt_backend be;
  if (dt_backend_parse(o.backend, &be) != DT_OK)
    return sb_usage_error(CMD, "--backend", "expected threads or mpi, got '%s'", o.backend);
  if (!dt_backend_available(be))
    return sb_usage_error(CMD, "--backend", "'%s' is not built into this shardbench", o.backend);
  dt_dtype dtype;
  if (dt_dtype_parse(o.dtype, &dtype) != DT_OK || (dtype != DT_F32 && dtype != DT_F64))
    return sb_usage_error(CMD, "--dtype", "expected f32 or f64, got '%s'", o.dtype);
  if (strcmp(o.workload, "model") && strcmp(o.workload, "block") &&
      strcmp(o.workload, "embedding") && strcmp(o.workload, "attention") &&
      strcmp(o.workload, "feed_forward"))
    return sb_usage_error(CMD, "--workload",
                          "expected model, block, embedding, attention or feed_forward, got '%s'",
                          o.workload);
  {
    dt_llama_config tmp;
    if (dt_llama_config_get(NULL, o.model, &tmp) != DT_OK)
      return sb_usage_error(CMD, "--model", "unknown model '%s' (known: debugmodel, 8B, 70B, 405B)",
                            o.model);
  }
  int rank = 0;
  if (be == DT_BACKEND_MPI) {
    if (dt_mpi_init(&argc, &argv) != DT_OK)
      return sb_usage_error(CMD, "--backend", "MPI could not be initialised");
    rank = dt_mpi_rank();
    if (world && world != dt_mpi_size())
      return sb_usage_error(CMD, "--world", "%ld, but mpirun started %d processes", world,
                            dt_mpi_size());
    world = dt_mpi_size();
  }
  int prod = 1;
  for (int i = 0; i < SB_NDIMS; i++) prod *= o.dims[i];
  if (!world) world = prod;
  if (!mesh_given && !dims_given && prod == 1) o.dims[4] = (int)world, prod = (int)world;
  if (prod != world)
    return sb_usage_error(CMD, NULL, "the mesh has %d ranks but the world is %ld", prod, world);
  o.world = (int)world;
  sb_plans_dir(plans_flag, o.plans_dir, sizeof o.plans_dir);
  {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.plan", o.plans_dir, o.plan);
    if (access(path, R_OK) != 0)
      return sb_usage_error(CMD, "--plan", "no plan file '%s' (see --plans-dir)", path);
  }
  sb_store st;
  memset(&st, 0, sizeof st);
  if (db && rank == 0) {
    int rc = sb_store_open(&st, db);
    if (rc) return rc;
  }
  sb_config c;
  sb_config_fill(&o, &c);
  sb_ref ref;
  memset(&ref, 0, sizeof ref);
  sb_result r;
  sb_execute(&o, &ref, false, &r);
  sb_ref_free(&ref);
  int rc = SB_EXIT_OK;
  if (rank == 0) {
    sb_print_result(stdout, &c, &r, json);
    if (db) {
      if (sb_store_begin_run(&st, argc, argv, o.backend, o.world) || sb_store_put(&st, &c, &r) ||
          sb_store_end_run(&st))
        rc = SB_EXIT_FAIL;
      sb_store_close(&st);
    }
  }
  if (!strcmp(r.status, "mismatch") || !strcmp(r.status, "failed")) rc = SB_EXIT_FAIL;
  free(r.comm);
  /* a failed job may leave collectives pending: dt_mpi_finish(false) aborts */
  if (be == DT_BACKEND_MPI) dt_mpi_finish(strcmp(r.status, "failed") != 0);
  return rc;
}
