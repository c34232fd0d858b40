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
 * The training itself is the library's (lib/parallel/trainer.h): the mesh from the
 * five degrees (dt_parallel_dims, TorchTitan's ParallelDims), the plan resolved
 * once per config (dt_parallel_plan_resolve), the model parallelized by it
 * (dt_parallelize_llama: TP/SP, CP, FSDP/HSDP/ZeRO), the pipeline (dt_pipeline_llm)
 * and each step (dt_trainer_forward_backward: the batch placed or cut into
 * microbatches, the schedule, DDP's or FSDP's reductions; dt_trainer_optimizer_step:
 * AdamW). This file drives it: the single-layer workloads' inputs and probe loss
 * are trainer hooks (they exist to isolate one layer's comm, not to train), so are
 * the fault switches.
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
 * mem_peak(ctx); comm rows from rank 0's ledger over the timed steps,
 * per step.
 *
 * FSDP's mixed precision and a bf16 model set the verdict's tolerance (the plan's
 * parameter dtype, sb_tolerance_params).
 *
 * Pipeline parallel (a pp dim): the loss and every weight's gradient are shared
 * from their stage's rank for the verifier between the step's halves
 * (dt_trainer_share_stages; each rank's optimizer trains its own stages only, and a
 * rank holds only its stages' weights: dt_trainer_unshare_stages after each check),
 * so the memory split and the peak count this rank's stages. Every rank's timeline
 * of each timed step (the trainer's step record) and its host peak during the step
 * go to rank 0 after the run (pipe_gather), which derives the measured bubble and
 * the per-stage figures of results/schema.sql's pp_* tables.
 *
 * Unsupported (status skipped, with the reason): fully_shard(reshard_after_forward=True)
 * with pp > 1, a pp plan on pp = 1, a batch the microbatches or a model the stages
 * do not divide, a single-layer workload on pp > 1, a plan whose dims do not fit the
 * mesh, a plan with [tp] entries on a
 * mesh without tp or fully_shard entries without dp_shard or cp (TorchTitan applies
 * TP and FSDP only when their dims are > 1; the run would be the dp plan's), a
 * dp_shard dim without fully_shard entries, anything dt_plan_resolve refuses
 * (heads or seq not divisible by tp), a batch not divisible by dp_replicate: what
 * dt_parallel_plan_resolve refuses.
 */
#include "config.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <signal.h>
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
static size_t mem_peak(const dt_ctx *ctx) {
  return on_device(ctx) ? ctx->mem.dev_peak : ctx->mem.host_peak;
}

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
  /* activation checkpointing likewise joins only when on, as ac=MODE[:OPTION] */
  char ac[40] = "";
  if (o->ac.mode != DT_AC_NONE) {
    char a[32];
    snprintf(ac, sizeof ac, " ac=%s", dt_ac_str(&o->ac, a, sizeof a));
  }
  /* the recipe's flags likewise join it only when given (a plan's max_norm is the plan's) */
  char recipe[160] = "";
  int at = 0;
  if (o->max_norm > 0) at = snprintf(recipe, sizeof recipe, " max_norm=%.9g", o->max_norm);
  if (o->global_batch > 0 && at >= 0 && (size_t)at < sizeof recipe)
    at += snprintf(recipe + at, sizeof recipe - (size_t)at, " global_batch=%d", o->global_batch);
  static const char *const decay[] = {"linear", "sqrt", "cosine"};
  if (o->lr.training_steps > 0 && at >= 0 && (size_t)at < sizeof recipe) {
    char ratio[32] = "none";
    if (o->lr.has_decay_ratio) snprintf(ratio, sizeof ratio, "%.9g", o->lr.decay_ratio);
    snprintf(recipe + at, sizeof recipe - (size_t)at, " lr=warmup:%d,decay_ratio:%s,%s,min:%.9g",
             o->lr.warmup_steps, ratio, decay[o->lr.decay_type], o->lr.min_lr_factor);
  }
  snprintf(c->key, sizeof c->key,
           "model=%s workload=%s plan=%s mesh=%s dtype=%s batch=%d seq=%d steps=%d backend=%s "
           "world=%d%s%s%s%s",
           o->model, o->workload, o->plan, mesh, o->dtype, o->batch, o->seq, o->steps, o->backend,
           o->world, dev ? " device=" : "", dev ? o->device : "", ac, recipe);
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
 *   ac-zero:K                with activation checkpointing on, the K-th recomputed
 *                            call of each checkpointed block leaves its output zero
 *                            (dt_checkpoint_opts.fault_zero_call; K >= 1).
 *   hang:RANK                world rank RANK stops for good once its weights are
 *                            made (sigsuspend, as a rank stopped by SIGSTOP or a
 *                            collective that never returns): the others wait in
 *                            their next collective; the sweep's watchdog must end it.
 *   crash:RANK               world rank RANK prints one line and aborts (SIGABRT)
 *                            once its weights are made.
 *   norm-replicated:PARAM    clip_grad_norm_ sums PARAM's gradient over the mesh dims
 *                            it is Replicate on as if it were sharded there (a
 *                            replicated norm weight counted tp times).
 *   norm-drop-stage:K        clip_grad_norm_ leaves pp rank K's stages out of the
 *                            total norm.
 *   host-staging             point to point on device buffers goes through host
 *                            memory (dt_comm_mem.p2p_via_host on the world, so on
 *                            every communicator split from it): the verdict stays
 *                            ok, but host_staged_bytes in --json is no longer 0.
 *   extra-all-reduce         every timed step, after its optimizer step, the sharded
 *                            job makes one more all_reduce (one f64 on the world,
 *                            phase "optimizer") that the step does not need: the
 *                            verdict stays ok, but rank 0's comm rows gain it
 *                            (verify/meta-sweep.sh: a shape-only run must differ).
 *                            (The norm faults act only on a run that clips, --max-norm.)
 * Items join with ';' ("hang:2@plan=dp;crash:1@plan=fsdp "); an item followed by
 * @MATCH applies only to configs whose key contains MATCH. At most one
 * skip-reduce / perturb-grad / ac-zero / norm-* item applies to a config.
 * The reference job never sees a fault. */
typedef enum fault_kind {
  FAULT_NONE = 0, FAULT_SKIP_REDUCE, FAULT_PERTURB_GRAD, FAULT_AC_ZERO, FAULT_NORM_REPLICATED,
  FAULT_NORM_DROP_STAGE
} fault_kind;
typedef struct fault {
  fault_kind kind;
  char param[SB_PARAM_NAME_LEN];
  int rank;
  int hang_rank, crash_rank; /* -1: none */
  bool host_staging;
  bool extra_all_reduce;
} fault;
static const double FAULT_PERTURB = 1e-3;

/* One item (no ';', no '@') into f; -1 with a reason in err when malformed. */
static int fault_item(const char *s, fault *f, char *err, size_t errn) {
  const char *param = strchr(s, ':'), *rank = NULL;
  if (param && (size_t)(param - s) == strlen("ac-zero") && !strncmp(s, "ac-zero", 7)) {
    long k;
    if (sb_parse_long(param + 1, 1, 1 << 20, &k, err, errn) != DT_OK) return -1;
    if (f->kind != FAULT_NONE) {
      snprintf(err, errn, "more than one skip-reduce / perturb-grad / ac-zero item applies");
      return -1;
    }
    f->kind = FAULT_AC_ZERO;
    f->rank = (int)k; /* K */
    return 0;
  }
  if (!strcmp(s, "host-staging")) {
    f->host_staging = true;
    return 0;
  }
  if (!strcmp(s, "extra-all-reduce")) {
    f->extra_all_reduce = true;
    return 0;
  }
  if (param && ((size_t)(param - s) == 4 && !strncmp(s, "hang", 4))) {
    long r;
    if (sb_parse_long(param + 1, 0, SB_MAX_WORLD - 1, &r, err, errn) != DT_OK) return -1;
    f->hang_rank = (int)r;
    return 0;
  }
  if (param && ((size_t)(param - s) == 5 && !strncmp(s, "crash", 5))) {
    long r;
    if (sb_parse_long(param + 1, 0, SB_MAX_WORLD - 1, &r, err, errn) != DT_OK) return -1;
    f->crash_rank = (int)r;
    return 0;
  }
  fault_kind kind = FAULT_NONE;
  if (param && (size_t)(param - s) == strlen("skip-reduce") && !strncmp(s, "skip-reduce", 11)) {
    kind = FAULT_SKIP_REDUCE;
  } else if (param && (size_t)(param - s) == strlen("norm-replicated") &&
             !strncmp(s, "norm-replicated", 15)) {
    kind = FAULT_NORM_REPLICATED;
  } else if (param && (size_t)(param - s) == strlen("norm-drop-stage") &&
             !strncmp(s, "norm-drop-stage", 15)) {
    kind = FAULT_NORM_DROP_STAGE;
    rank = param; /* the stage is the rank field; no PARAM */
  } else if (param && (size_t)(param - s) == strlen("perturb-grad") &&
             !strncmp(s, "perturb-grad", 12)) {
    kind = FAULT_PERTURB_GRAD;
    rank = strchr(param + 1, ':');
  }
  size_t pl = !param || rank == param ? 0 : rank ? (size_t)(rank - param - 1) : strlen(param + 1);
  if (kind == FAULT_NONE || (kind == FAULT_PERTURB_GRAD && !rank) ||
      (pl == 0 && kind != FAULT_NORM_DROP_STAGE) || pl >= sizeof f->param ||
      (pl && memchr(param + 1, ':', pl))) {
    snprintf(err, errn, "expected skip-reduce:PARAM, perturb-grad:PARAM:RANK, ac-zero:K, "
                        "norm-replicated:PARAM, norm-drop-stage:K, hang:RANK, crash:RANK, "
                        "host-staging or extra-all-reduce (joined by ';', each with an "
                        "optional @MATCH), got '%s'", s);
    return -1;
  }
  long r = 0;
  if (rank && sb_parse_long(rank + 1, 0, SB_MAX_WORLD - 1, &r, err, errn) != DT_OK) return -1;
  if (f->kind != FAULT_NONE) {
    snprintf(err, errn, "more than one skip-reduce / perturb-grad item applies");
    return -1;
  }
  f->kind = kind;
  memcpy(f->param, param + 1, pl);
  f->param[pl] = '\0';
  f->rank = (int)r;
  return 0;
}

/* The faults in s (NULL or "": none) that apply to the config key (NULL: every
 * item, to validate them all); -1 with a reason in err when s is malformed. */
static int fault_parse(const char *s, const char *key, fault *f, char *err, size_t errn) {
  memset(f, 0, sizeof *f);
  f->hang_rank = f->crash_rank = -1;
  if (!s || !s[0]) return 0;
  for (const char *p = s;;) {
    size_t n = strcspn(p, ";");
    char item[SB_PARAM_NAME_LEN + 512];
    if (n == 0 || n >= sizeof item) {
      snprintf(err, errn, "an empty or overlong item in '%s'", s);
      return -1;
    }
    memcpy(item, p, n);
    item[n] = '\0';
    char *at = strchr(item, '@');
    if (at) *at++ = '\0';
    if (at && !at[0]) {
      snprintf(err, errn, "an empty @MATCH in '%s'", s);
      return -1;
    }
    fault one;
    memset(&one, 0, sizeof one);
    one.hang_rank = one.crash_rank = -1;
    if (fault_item(item, &one, err, errn)) return -1;
    if (!key || !at || strstr(key, at)) {
      if (one.hang_rank >= 0) f->hang_rank = one.hang_rank;
      if (one.crash_rank >= 0) f->crash_rank = one.crash_rank;
      f->host_staging = f->host_staging || one.host_staging;
      f->extra_all_reduce = f->extra_all_reduce || one.extra_all_reduce;
      if (one.kind != FAULT_NONE) {
        if (f->kind != FAULT_NONE && key) {
          snprintf(err, errn, "more than one skip-reduce / perturb-grad item applies");
          return -1;
        }
        if (f->kind == FAULT_NONE) {
          f->kind = one.kind;
          memcpy(f->param, one.param, sizeof f->param);
          f->rank = one.rank;
        }
      }
    }
    if (!p[n]) break;
    p += n + 1;
  }
  return 0;
}

int sb_fault_check(const char *cmd, bool warn) {
  const char *s = getenv("SHARDBENCH_FAULT");
  fault f;
  char err[SB_ERR_LEN];
  if (fault_parse(s, NULL, &f, err, sizeof err))
    return sb_usage_error(cmd, "SHARDBENCH_FAULT", "%s", err);
  if ((f.kind != FAULT_NONE || f.hang_rank >= 0 || f.crash_rank >= 0 || f.host_staging ||
       f.extra_all_reduce) && warn)
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
 * DDP's reduction (dt_data_parallel_reduce_grads) passes it by. Before the reduce
 * (the trainer's before_ddp hook). */
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
  dt_parallel_dims dims;        /* the mesh (every degree 1: the reference) */
  const dt_parallel_plan *plan; /* the resolved plan; NULL: the reference */
  const sb_ref *ref;            /* compare against (sharded job) */
  fault fault;                  /* TEST SWITCH (sharded job only) */
  double max_norm;              /* clipping (o->max_norm, else the plan's); 0: none */
  bool per_process;             /* MPI: each process has its own job (else the ranks share it) */
  /* out (rank 0; the verdict on every rank of an MPI job) */
  sb_snap out;                  /* reference job: what it computed */
  double step_time_s;
  int64_t peak_mem;
  int64_t staged;               /* host-staged comm bytes per step, summed over the ranks */
  sb_cmp cmp;                   /* sharded job: the verdict, worst over every rank */
  bool weights_saved;           /* sharded job: o->save_weights written */
  double grad_norm;             /* rank 0, last timed step: the total gradient norm */
  int64_t mem[4];               /* rank 0, last timed step: params, grads, optimizer,
                                 * the rest of the step's peak (sb_result.mem_*) */
  dt_mem_peak_at peak_at;       /* rank 0, last timed step: where it peaked */
  int n_comm;
  sb_comm_row comm[MAX_COMM];
  sb_pp_timeline *ppt;          /* rank 0, a pipelined sharded job: the timeline (pipe_gather) */
  /* shape-only (--device meta): the role of each world rank and each role's outputs */
  int *role_of;
  sb_role *roles;
  int n_roles;
  sb_shape_facts shape;         /* rank 0 fills the pipeline's actions (meta_train) */
} job;

/* A rank's state for the trainer's hooks: the job, and a single-layer workload's
 * step inputs (x or tokens, the targets, the probe R). */
typedef struct rank_job {
  job *j;
  dt_tensor tok, tgt, probe;
} rank_job;

/* An N(0, 1) [batch, seq, dim] tensor (wl_normal) in the model's dtype, placed as the
 * model's layers receive their input: Shard(0) on dp_dims, Shard(1) on cp in its
 * storage order (cp >= 0), wl_layer_tp on tp. The global values are made on every
 * rank outside the counted allocator (as the token batches are). */
static dt_status wl_tensor(dt_ctx *ctx, const job *j, dt_trainer *tr, int which, int step,
                           dt_tensor *out) {
  dt_mesh *mesh = dt_trainer_mesh(tr);
  const dt_model *m = dt_trainer_model(tr);
  const dt_parallel_dims *d = dt_trainer_dims(tr);
  const unsigned dp_dims = d->dp;
  const int cp = d->dim[DT_PDIM_CP], tp = d->dim[DT_PDIM_TP];
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
  const dt_placement want = tp >= 0 ? wl_layer_tp(&j->plan->plan) : dt_replicate();
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
  dt_mem_peak_restart(ctx, on_device(ctx));
  return s;
}

/* ---- the trainer's hooks ------------------------------------------------------------ */

/* After the weights are made: a fault's target checked (TEST SWITCH), the initial
 * weights saved (before a pipelined rank frees the other stages'). */
static dt_status hook_after_init(dt_ctx *ctx, dt_trainer *t, void *user) {
  job *j = ((rank_job *)user)->j;
  dt_model *m = dt_trainer_model(t);
  /* TEST SWITCH: refuse a bad target (ac-zero and norm-drop-stage have none) */
  if (j->fault.kind != FAULT_NONE && j->fault.kind != FAULT_AC_ZERO &&
      j->fault.kind != FAULT_NORM_DROP_STAGE) {
    if (!fault_module(ctx, m, &j->fault)) return DT_ERR_INVALID;
    if (j->fault.rank >= ctx->world_size)
      return dt_error(ctx, DT_ERR_INVALID, "SHARDBENCH_FAULT", "rank %d, but the world has %d ranks",
                      j->fault.rank, ctx->world_size);
  }
  if (!j->reference && ctx->rank == j->fault.crash_rank) { /* TEST SWITCH: a rank dies */
    fprintf(stderr, "shardbench: rank %d: SHARDBENCH_FAULT crash:%d: aborting on purpose\n",
            ctx->rank, ctx->rank);
    fflush(stderr);
    abort();
  }
  if (!j->reference && ctx->rank == j->fault.hang_rank) { /* TEST SWITCH: a rank stops */
    sigset_t none;
    sigemptyset(&none);
    for (;;) sigsuspend(&none);
  }
  if (j->reference || !j->o->save_weights[0]) return DT_OK;
  DT_CHECK(save_weights(ctx, m, j));
  if (ctx->rank == 0) j->weights_saved = true;
  return DT_OK;
}

static void hook_before_ddp(dt_ctx *ctx, dt_trainer *t, void *user) {
  (void)ctx;
  fault_skip_reduce(dt_trainer_model(t), &((rank_job *)user)->j->fault, dt_trainer_dims(t)->dp_cp);
}

static void hook_after_reduce(dt_ctx *ctx, dt_trainer *t, void *user) {
  fault_perturb_grad(ctx, dt_trainer_model(t), &((rank_job *)user)->j->fault);
}

/* A single-layer workload's inputs (before the step's barrier, the ledger off): the
 * tokens (embedding) or the targets and x (the others), the probe (all but output). */
static dt_status hook_inputs(dt_ctx *ctx, dt_trainer *t, int step, void *user) {
  rank_job *rj = user;
  const job *j = rj->j;
  const sb_opts *o = j->o;
  const wl_kind wl = wl_of(o->workload);
  dt_model *m = dt_trainer_model(t);
  dt_mesh *mesh = dt_trainer_mesh(t);
  const dt_parallel_dims *d = dt_trainer_dims(t);
  const int cp = d->dim[DT_PDIM_CP];
  dt_status s = DT_OK;
  { /* the embedding's tokens; the others' targets (the head's; x replaces the tokens) */
    const int which = wl == WL_EMBEDDING ? 0 : 1;
    dt_tensor *out = which ? &rj->tgt : &rj->tok;
    s = cp >= 0 ? sb_token_tensor_cp(ctx, m, o->batch, o->seq, j->cfg.vocab, d->dp, step, which, out)
                : sb_token_tensor(ctx, mesh, o->batch, o->seq, j->cfg.vocab, d->dp, step, which, out);
  }
  if (s == DT_OK && wl != WL_EMBEDDING) s = wl_tensor(ctx, j, t, WL_X, step, &rj->tok);
  if (s == DT_OK && wl != WL_OUTPUT) s = wl_tensor(ctx, j, t, WL_PROBE, 0, &rj->probe);
  return s;
}

/* A single-layer workload's forward and loss (the head's cross-entropy, else the probe). */
static dt_status hook_forward_loss(dt_ctx *ctx, dt_trainer *t, int step, void *user,
                                   dt_var **loss) {
  (void)step;
  rank_job *rj = user;
  dt_model *m = dt_trainer_model(t);
  dt_var *y = NULL;
  DT_CHECK(dt_model_forward_input(ctx, m, &rj->tok, &y));
  return wl_of(rj->j->o->workload) == WL_OUTPUT ? dt_model_loss(ctx, m, y, &rj->tgt, loss)
                                                : wl_probe_loss(ctx, m, y, &rj->probe, loss);
}

static void hook_free_inputs(dt_ctx *ctx, dt_trainer *t, void *user) {
  (void)t;
  rank_job *rj = user;
  dt_tensor_free(ctx, &rj->tok);
  dt_tensor_free(ctx, &rj->tgt);
  dt_tensor_free(ctx, &rj->probe); /* zeroed when the loss consumed it */
}

/* ---- pipeline parallel: the timeline ---------------------------------------------- */

/* A rank's pipeline timeline over the timed steps (the trainer's step records). */
typedef struct pipe {
  dt_pp_schedule S;             /* the trainer's lowered schedule (a borrowed view) */
  int cap;                      /* events per step: the longest rank's action list */
  double *rec;                  /* [timed steps][REC_HEAD + 5 cap]: pipe_rec */
} pipe;

/* A rank's record of one timed step, as doubles for one all_gather over the world:
 * the event count, pp rank, pipeline (the rank's coordinates off the pp dim), the
 * step's zero on its clock (its exit from the barrier before the step), its host
 * peak above the step's start, then per event kind, stage, microbatch, t0, t1. */
enum { REC_N = 0, REC_PP_RANK, REC_PIPE, REC_ZERO, REC_PEAK, REC_HEAD };
static size_t rec_stride(const pipe *p) { return REC_HEAD + 5 * (size_t)p->cap; }

/* The timeline's buffers for steps timed steps of the trainer's pipeline. */
static dt_status pipe_init(dt_ctx *ctx, const dt_pipeline *P, int steps, pipe *p) {
  memset(p, 0, sizeof *p);
  p->S = P->schedule;
  for (int r = 0; r < p->S.pp; r++) p->cap = p->S.len[r] > p->cap ? p->S.len[r] : p->cap;
  p->rec = calloc((size_t)(steps > 0 ? steps : 1) * rec_stride(p), sizeof *p->rec);
  return p->rec ? DT_OK : dt_error(ctx, DT_ERR_NOMEM, "pipeline", "no memory");
}

/* Timed step `timed`'s record from the trainer's step record. */
static void pipe_rec(pipe *p, int timed, const dt_trainer_step *st) {
  double *rec = p->rec + (size_t)timed * rec_stride(p);
  const int n = st->n_events < p->cap ? st->n_events : p->cap;
  rec[REC_N] = n;
  rec[REC_PP_RANK] = st->pp_rank;
  rec[REC_PIPE] = st->pipe_id;
  rec[REC_ZERO] = st->zero;
  rec[REC_PEAK] = (double)st->pp_peak_bytes;
  for (int i = 0; i < n; i++) {
    double *e = rec + REC_HEAD + 5 * (size_t)i;
    e[0] = st->events[i].action.kind;
    e[1] = st->events[i].action.stage;
    e[2] = st->events[i].action.mb;
    e[3] = st->events[i].t0;
    e[4] = st->events[i].t1;
  }
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


/* The check data of a step (step >= 0: loss and gradients) or of the final weights
 * (step < 0, after last): kept (reference) or compared into c (sharded), with the
 * ledger off and outside the timed region. Under pp every rank checks every weight:
 * the owners' copies are shared over pp, and freed again after. */
static dt_status collect(dt_ctx *ctx, dt_trainer *t, job *j, dt_var *loss, int step, int last,
                         sb_cmp *c) {
  dt_ledger_enable(ctx, false);
  dt_ctx_set_phase(ctx, "check");
  sb_snap *rec = j->reference && ctx->rank == 0 ? &j->out : NULL;
  const sb_snap *ref = j->reference ? NULL : &j->ref->snap;
  const dt_model *m = dt_trainer_model(t);
  dt_var *l = NULL;
  dt_status s = dt_trainer_share_stages(ctx, t, step >= 0, loss, &l);
  if (s == DT_OK)
    s = step >= 0 ? sb_snap_step(ctx, m, l, step, rec, ref, c)
                  : sb_snap_params(ctx, m, last, rec, ref, c);
  /* the other stages' gradients (AdamW trains this rank's) and shared weights go again */
  const dt_status r = dt_trainer_unshare_stages(ctx, t);
  if (s == DT_OK) s = r;
  dt_ctx_set_phase(ctx, "");
  return s;
}

/* Step times and peak memory (max over ranks) and rank 0's comm rows per step. */
static dt_status measures(dt_ctx *ctx, job *j, double *times, int total) {
  const sb_opts *o = j->o;
  DT_CHECK(dt_comm_all_reduce(ctx->world, times, times, (size_t)total, DT_F64, DT_RED_MAX));
  double mem = (double)mem_peak(ctx);
  DT_CHECK(dt_comm_all_reduce(ctx->world, &mem, &mem, 1, DT_F64, DT_RED_MAX));
  double staged = (double)dt_ledger_of(ctx)->staged_bytes; /* exact below 2^53 */
  DT_CHECK(dt_comm_all_reduce(ctx->world, &staged, &staged, 1, DT_F64, DT_RED_SUM));
  if (ctx->rank != 0) return DT_OK;
  j->step_time_s = o->steps > 0 ? sb_median(times + o->warmup, o->steps) : NAN;
  j->peak_mem = (int64_t)mem;
  j->staged = o->steps > 0 ? (int64_t)staged / o->steps : -1;
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


/* The trainer's options for j on this rank (hooks' state in rj). */
static void trainer_opts(const dt_ctx *ctx, job *j, rank_job *rj, dt_trainer_opts *to) {
  const dt_adamw adamw = DT_ADAMW_DEFAULT;
  memset(to, 0, sizeof *to);
  to->dtype = j->reference ? j->dtype : j->model_dtype;
  to->seed = SEED;
  to->batch = j->o->batch;
  to->seq = j->o->seq;
  to->adamw = adamw;
  to->load_weights = j->o->load_weights;
  to->device_memory = on_device(ctx);
  if (!j->reference) to->ac = j->o->ac; /* the reference: no AC (AC changes no bits) */
  if (!j->reference && j->fault.kind == FAULT_AC_ZERO) /* TEST SWITCH: a broken recompute */
    to->ac.fault_zero_call = j->fault.rank;
  to->clip.max_norm = j->max_norm;
  to->lr_schedule = j->o->lr;
  to->grad_accum_steps = j->o->global_batch > 0 ? j->o->global_batch / j->o->batch : 1;
  const char *fdot = strrchr(j->fault.param, '.');
  if (!j->reference && j->fault.kind == FAULT_NORM_REPLICATED && fdot &&
      !strcmp(fdot, ".weight")) /* TEST SWITCH: the module of PARAM */
    snprintf(to->clip.fault_count_replicated, sizeof to->clip.fault_count_replicated, "%.*s",
             (int)(fdot - j->fault.param), j->fault.param);
  if (!j->reference && j->fault.kind == FAULT_NORM_DROP_STAGE) /* TEST SWITCH */
    to->clip.fault_drop_pp_rank = j->fault.rank + 1;
  if (j->fault.kind == FAULT_SKIP_REDUCE) { /* TEST SWITCH: the FSDP unit skips its reduction */
    const char *dot = strrchr(j->fault.param, '.');
    if (dot && !strcmp(dot, ".weight"))
      snprintf(to->parallelize.fault_no_reduce, sizeof to->parallelize.fault_no_reduce, "%.*s",
               (int)(dot - j->fault.param), j->fault.param);
  }
  dt_trainer_hooks *h = &to->hooks;
  h->user = rj;
  h->after_init = hook_after_init;
  h->before_ddp = hook_before_ddp;
  h->after_reduce = hook_after_reduce;
  if (wl_of(j->o->workload) != WL_MODEL) {
    h->inputs = hook_inputs;
    h->forward_loss = hook_forward_loss;
    h->free_inputs = hook_free_inputs;
  }
}

/* Trains warmup + steps steps through the trainer, checking every one between its
 * backward and its optimizer step; rank 0 fills j's outputs (the reference's
 * snapshot, or the sharded job's verdict). */
static dt_status train(dt_ctx *ctx, job *j) {
  const int total = j->o->warmup + j->o->steps;
  /* a step's sequences: every microstep's under gradient accumulation */
  const int64_t n = (int64_t)(j->o->global_batch > 0 ? j->o->global_batch : j->o->batch) * j->o->seq;
  sb_cmp c;
  sb_cmp_init(&c);
  /* FSDP mixed precision: the weights' rounding to param_dtype sets the tolerance */
  if (j->plan && j->plan->fsdp) c.param_dtype = j->plan->plan.param_dtype;
  /* a bf16 model against its f32 reference: bf16's rounding of every weight */
  if (!j->reference && j->model_dtype == DT_BF16) c.param_dtype = DT_BF16;
  rank_job rj;
  memset(&rj, 0, sizeof rj);
  rj.j = j;
  if (ctx->world->mem.dev) {
    /* TEST SWITCH: before the meshes split the world (and off again for the next job) */
    dt_comm_mem hm = ctx->world->mem;
    hm.p2p_via_host = !j->reference && j->fault.host_staging;
    dt_comm_set_mem(ctx->world, &hm);
  }
  dt_trainer_opts to;
  trainer_opts(ctx, j, &rj, &to);
  double *times = calloc((size_t)total, sizeof *times);
  int64_t *ids = malloc(sizeof *ids * (size_t)(2 * (n ? n : 1)));
  pipe pp;
  memset(&pp, 0, sizeof pp);
  dt_trainer *t = NULL;
  dt_status s = times && ids ? DT_OK : dt_error(ctx, DT_ERR_NOMEM, "train", "no memory");
  if (s == DT_OK) s = dt_trainer_create(ctx, &j->cfg, &j->dims, j->plan, &to, &t);
  const dt_pipeline *P = s == DT_OK ? dt_trainer_pipeline(t) : NULL;
  if (s == DT_OK && P) s = pipe_init(ctx, P, j->o->steps, &pp);
  if (s == DT_OK && j->reference && ctx->rank == 0)
    s = sb_snap_init(ctx, dt_trainer_model(t), total, &j->out);
  if (s == DT_OK) dt_ledger_clear(ctx);
  for (int step = 0; step < total && s == DT_OK; step++) {
    const bool timed = step >= j->o->warmup;
    dt_var *loss = NULL;
    dt_trainer_step st;
    sb_token_ids(step, 0, n, j->cfg.vocab, ids); /* the global batch, the same on every rank */
    sb_token_ids(step, 1, n, j->cfg.vocab, ids + n);
    s = dt_trainer_forward_backward(ctx, t, step, ids, ids + n, timed, &loss, &st);
    if (s == DT_OK) s = collect(ctx, t, j, loss, step, total - 1, &c);
    if (s == DT_OK) s = dt_trainer_optimizer_step(ctx, t, timed, &st);
    if (s == DT_OK && timed && !j->reference && j->fault.extra_all_reduce) {
      /* TEST SWITCH: one collective the step does not need, in the ledger */
      const bool was = dt_ledger_of(ctx)->enabled;
      double one = 1;
      dt_ledger_enable(ctx, true);
      dt_ctx_set_phase(ctx, "optimizer");
      s = dt_comm_all_reduce(ctx->world, &one, &one, 1, DT_F64, DT_RED_SUM);
      dt_ctx_set_phase(ctx, "");
      dt_ledger_enable(ctx, was);
    }
    if (s == DT_OK && j->max_norm > 0) /* the norm the step clipped with, against the reference's */
      sb_snap_norm(dt_trainer_model(t), step, st.grad_norm,
                   j->reference && ctx->rank == 0 ? &j->out : NULL,
                   j->reference ? NULL : &j->ref->snap, &c);
    if (s == DT_OK && timed && P) pipe_rec(&pp, step - j->o->warmup, &st);
    if (timed && ctx->rank == 0) {
      j->mem[0] = st.mem_params;
      j->mem[1] = st.mem_grads;
      j->mem[2] = st.mem_optimizer;
      j->mem[3] = st.mem_activations;
      j->grad_norm = st.grad_norm;
      j->peak_at = st.peak_at;
    }
    times[step] = st.forward_backward_s + st.optimizer_s;
  }
  dt_ledger_enable(ctx, false);
  if (s == DT_OK) s = measures(ctx, j, times, total);
  if (s == DT_OK && P) s = pipe_gather(ctx, j, &pp);
  if (s == DT_OK) s = collect(ctx, t, j, NULL, -1, total - 1, &c);
  if (s == DT_OK && !j->reference) s = sb_cmp_merge(ctx->world, &c);
  if (s == DT_OK && !j->reference && (ctx->rank == 0 || j->per_process)) j->cmp = c;
  dt_ctx_set_phase(ctx, "");
  free(times);
  free(ids);
  free(pp.rec);
  dt_trainer_free(ctx, t);
  return s;
}

static dt_status job_rank(dt_ctx *ctx, void *arg) { return train(ctx, arg); }

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

/* ---- shape-only runs (--device meta) ------------------------------------------------
 * One rank per role (dt_parallel_dims_roles) runs alone on the meta device with the
 * fake comm: the trainer's real step (the same dispatch, styles, FSDP units, CP ring)
 * with shapes and no data. Each role keeps its step's memory split and device peak,
 * its comm ledger per (op, mesh dim, phase) and its compute ledger per phase. No
 * reference, no verdict, no timing: status shape-only. */

const char *const sb_role_phases[SB_ROLE_PHASES] = {"forward", "backward", "recompute", "optimizer",
                                                    "other"};

static void role_comm(sb_role *ro, const dt_ledger_row *r) {
  const char *op = dt_coll_name((dt_coll)r->op);
  const char *ph = r->phase[0] ? r->phase : "other";
  for (int i = 0; i < ro->n_comm; i++) {
    sb_comm_row *c = &ro->comm[i];
    if (!strcmp(c->op, op) && !strcmp(c->mesh_dim, r->group) && !strcmp(c->phase, ph)) {
      c->calls++;
      c->payload_bytes += (int64_t)r->payload_bytes;
      c->wire_bytes += r->wire_bytes;
      return;
    }
  }
  if (ro->n_comm == SB_ROLE_MAX_COMM) return;
  sb_comm_row *c = &ro->comm[ro->n_comm++];
  memset(c, 0, sizeof *c);
  snprintf(c->op, sizeof c->op, "%s", op);
  snprintf(c->mesh_dim, sizeof c->mesh_dim, "%s", r->group);
  snprintf(c->phase, sizeof c->phase, "%s", ph);
  c->calls = 1;
  c->payload_bytes = (int64_t)r->payload_bytes;
  c->wire_bytes = r->wire_bytes;
}

/* An open-addressing index of a role's merged rows by their merge key, so merging a
 * ledger of n rows costs O(n) and not O(n^2) (a 405B pipeline's ledger has hundreds of
 * thousands of rows). slot[] holds row index + 1, 0 = empty. */
typedef struct row_index {
  int *slot;
  size_t cap; /* a power of two, at least twice the rows */
} row_index;

/* Rebuilds the index at twice the capacity over rows [0, n), row i's key hash
 * hash_of(rows, i); false when out of memory. */
static bool row_index_grow(row_index *x, int n, uint64_t (*hash_of)(const void *rows, int i),
                           const void *rows) {
  size_t cap = x->cap ? 2 * x->cap : 256;
  int *slot = calloc(cap, sizeof *slot);
  if (!slot) return false;
  for (int i = 0; i < n; i++) {
    size_t h = (size_t)hash_of(rows, i) & (cap - 1);
    while (slot[h]) h = (h + 1) & (cap - 1);
    slot[h] = i + 1;
  }
  free(x->slot);
  x->slot = slot;
  x->cap = cap;
  return true;
}

/* The role's per-fqn comm rows (sb_role.fcomm), merged by (op, mesh dim, phase, fqn)
 * through a row_index. False when out of memory. */
typedef row_index fcomm_index;

static uint64_t fcomm_hash(const char *op, const char *dim, const char *ph, const char *fqn) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a over the four strings and their ends */
  const char *const s[4] = {op, dim, ph, fqn};
  for (int i = 0; i < 4; i++) {
    for (const char *c = s[i]; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
    h = (h ^ 0xffu) * 1099511628211ull;
  }
  return h;
}

static uint64_t fcomm_hash_of(const void *rows, int i) {
  const sb_fqn_comm *f = (const sb_fqn_comm *)rows + i;
  return fcomm_hash(f->op, f->mesh_dim, f->phase, f->fqn);
}

static bool fcomm_grow(fcomm_index *x, sb_role *ro) {
  return row_index_grow(x, ro->n_fcomm, fcomm_hash_of, ro->fcomm);
}

static bool role_fcomm(sb_role *ro, fcomm_index *x, const dt_ledger_row *r) {
  const char *op = dt_coll_name((dt_coll)r->op);
  const char *ph = r->phase[0] ? r->phase : "other";
  if ((size_t)ro->n_fcomm * 2 + 2 > x->cap && !fcomm_grow(x, ro)) return false;
  size_t h = (size_t)fcomm_hash(op, r->group, ph, r->scope) & (x->cap - 1);
  for (; x->slot[h]; h = (h + 1) & (x->cap - 1)) {
    sb_fqn_comm *f = &ro->fcomm[x->slot[h] - 1];
    if (!strcmp(f->op, op) && !strcmp(f->mesh_dim, r->group) && !strcmp(f->phase, ph) &&
        !strcmp(f->fqn, r->scope)) {
      f->calls++;
      f->payload_bytes += (int64_t)r->payload_bytes;
      f->wire_bytes += r->wire_bytes;
      return true;
    }
  }
  if (ro->n_fcomm == ro->cap_fcomm) {
    int cap = ro->cap_fcomm ? 2 * ro->cap_fcomm : 32;
    sb_fqn_comm *g = realloc(ro->fcomm, sizeof *g * (size_t)cap);
    if (!g) return false;
    ro->fcomm = g;
    ro->cap_fcomm = cap;
  }
  x->slot[h] = ro->n_fcomm + 1;
  sb_fqn_comm *f = &ro->fcomm[ro->n_fcomm++];
  memset(f, 0, sizeof *f);
  snprintf(f->op, sizeof f->op, "%s", op);
  snprintf(f->mesh_dim, sizeof f->mesh_dim, "%s", r->group);
  snprintf(f->phase, sizeof f->phase, "%s", ph);
  snprintf(f->fqn, sizeof f->fqn, "%s", r->scope);
  f->calls = 1;
  f->payload_bytes = (int64_t)r->payload_bytes;
  f->wire_bytes = r->wire_bytes;
  return true;
}

/* A role's krows by their merge key (a row_index). */
typedef row_index krow_index;

static uint64_t krow_hash(const char *op, const char *phase, int dtype, int64_t m, int64_t n,
                          int64_t k, int64_t batch, double flops, double bytes) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (const char *c = op; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
  for (const char *c = phase; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
  uint64_t w[7];
  memcpy(&w[0], &flops, 8);
  memcpy(&w[1], &bytes, 8);
  w[2] = (uint64_t)m, w[3] = (uint64_t)n, w[4] = (uint64_t)k, w[5] = (uint64_t)batch;
  w[6] = (uint64_t)dtype;
  for (int i = 0; i < 7; i++) h = (h ^ w[i]) * 1099511628211ull, h ^= h >> 29;
  return h;
}

static bool krow_same(const sb_krow *r, const dt_kledger_row *k, const char *phase, double bytes) {
  return !strcmp(r->op, k->op) && !strcmp(r->phase, phase) && r->dtype == k->dtype &&
         r->m == k->m && r->n == k->n && r->k == k->k && r->batch == k->batch &&
         r->flops == k->flops && r->bytes == bytes;
}

static uint64_t krow_hash_of(const void *rows, int i) {
  const sb_krow *r = (const sb_krow *)rows + i;
  return krow_hash(r->op, r->phase, r->dtype, r->m, r->n, r->k, r->batch, r->flops, r->bytes);
}

static bool krow_index_grow(krow_index *x, const sb_role *ro) {
  return row_index_grow(x, ro->n_krows, krow_hash_of, ro->krows);
}

static void role_krow(sb_role *ro, krow_index *x, const dt_kledger_row *k, const char *phase) {
  const double bytes = (double)(k->bytes_read + k->bytes_written);
  if ((size_t)ro->n_krows * 2 + 2 > x->cap && !krow_index_grow(x, ro)) {
    ro->krows_dropped += (int64_t)k->calls;
    return;
  }
  size_t h = (size_t)krow_hash(k->op, phase, k->dtype, k->m, k->n, k->k, k->batch, k->flops,
                               bytes) & (x->cap - 1);
  for (; x->slot[h]; h = (h + 1) & (x->cap - 1)) {
    sb_krow *r = &ro->krows[x->slot[h] - 1];
    if (krow_same(r, k, phase, bytes)) {
      r->calls += (int64_t)k->calls;
      return;
    }
  }
  if (ro->n_krows == ro->cap_krows) {
    int cap = ro->cap_krows ? 2 * ro->cap_krows : 64;
    sb_krow *g = cap <= SB_ROLE_MAX_KROWS ? realloc(ro->krows, sizeof *g * (size_t)cap) : NULL;
    if (!g) {
      ro->krows_dropped += (int64_t)k->calls;
      return;
    }
    ro->krows = g;
    ro->cap_krows = cap;
  }
  x->slot[h] = ro->n_krows + 1;
  sb_krow *r = &ro->krows[ro->n_krows++];
  memset(r, 0, sizeof *r);
  snprintf(r->op, sizeof r->op, "%s", k->op);
  snprintf(r->phase, sizeof r->phase, "%s", phase);
  r->dtype = k->dtype;
  r->m = k->m, r->n = k->n, r->k = k->k, r->batch = k->batch;
  r->flops = k->flops;
  r->bytes = bytes;
  r->calls = (int64_t)k->calls;
}

/* The pipeline's F and B actions per pp rank, in execution order, into f (no pp: pp 1). */
static dt_status meta_pipeline(dt_ctx *ctx, const dt_pipeline *p, sb_shape_facts *f) {
  f->pp = 1;
  f->pp_v = f->pp_m = 1;
  f->pp_kind = -1;
  if (!p) return DT_OK;
  const dt_pp_schedule *S = &p->schedule;
  size_t n = 0;
  for (int r = 0; r < S->pp; r++) n += (size_t)S->len[r];
  f->pp_len = calloc((size_t)S->pp, sizeof *f->pp_len);
  f->pp_acts = malloc(sizeof *f->pp_acts * (n ? n : 1));
  if (!f->pp_len || !f->pp_acts) return dt_error(ctx, DT_ERR_NOMEM, "shape-only", "no memory");
  size_t k = 0;
  for (int r = 0; r < S->pp; r++)
    for (int i = 0; i < S->len[r]; i++) {
      const dt_pp_action a = S->acts[r][i];
      if (a.kind != DT_PP_F && a.kind != DT_PP_B) continue;
      f->pp_acts[k++] = a;
      f->pp_len[r]++;
    }
  f->pp = S->pp;
  f->pp_v = S->n_stages / S->pp;
  f->pp_m = S->n_microbatches;
  f->pp_kind = (int)S->kind;
  return DT_OK;
}

static dt_status meta_train(dt_ctx *ctx, void *arg) {
  job *j = arg;
  const int64_t n = (int64_t)j->o->batch * j->o->seq;
  rank_job rj;
  memset(&rj, 0, sizeof rj);
  rj.j = j;
  dt_trainer_opts to;
  trainer_opts(ctx, j, &rj, &to);
  to.device_memory = true;
  /* token 0 throughout: meta reads no ids, and zeroed pages cost only what the
   * rank's slice touches (the global batch is batch x seq ids on every role) */
  int64_t *ids = calloc((size_t)(2 * (n ? n : 1)), sizeof *ids);
  dt_trainer *t = NULL;
  dt_status s = ids ? DT_OK : dt_error(ctx, DT_ERR_NOMEM, "shape-only", "no memory");
  if (s == DT_OK) s = dt_trainer_create(ctx, &j->cfg, &j->dims, j->plan, &to, &t);
  dt_trainer_step st;
  memset(&st, 0, sizeof st);
  /* warm-up + timed steps, the last recorded. After the first, AdamW's state exists
   * (PyTorch's optimizers make it in their first step()) and the caching allocator
   * holds the segments a real run's first step leaves: a later step is a
   * steady-state step, what TorchTitan's logged memory describes */
  const int nsteps = j->o->warmup + j->o->steps > 1 ? j->o->warmup + j->o->steps : 1;
  for (int k = 0; k < nsteps && s == DT_OK; k++) {
    const bool last = k == nsteps - 1;
    dt_ledger_clear(ctx);
    dt_var *loss = NULL;
    s = dt_trainer_forward_backward(ctx, t, k, ids, ids + n, last, &loss, &st);
    if (s == DT_OK) s = dt_trainer_optimizer_step(ctx, t, last, &st);
  }
  dt_ledger_enable(ctx, false);
  if (s == DT_OK && ctx->rank == 0) s = meta_pipeline(ctx, dt_trainer_pipeline(t), &j->shape);
  if (s == DT_OK) {
    sb_role *ro = &j->roles[j->role_of[ctx->rank]];
    ro->rank = ctx->rank;
    ro->mem[0] = st.mem_params;
    ro->mem[1] = st.mem_grads;
    ro->mem[2] = st.mem_optimizer;
    ro->mem[3] = st.mem_activations;
    ro->peak = (int64_t)st.peak_bytes;
    ro->reserved = (int64_t)st.reserved_peak_bytes;
    ro->peak_at = st.peak_at;
    const dt_ledger *L = dt_ledger_of(ctx);
    fcomm_index fx = {NULL, 0};
    for (size_t i = 0; i < L->n && s == DT_OK; i++) {
      role_comm(ro, &L->rows[i]);
      if (!role_fcomm(ro, &fx, &L->rows[i]))
        s = dt_error(ctx, DT_ERR_NOMEM, "shape-only", "no memory for the comm rows");
    }
    free(fx.slot);
    const dt_kledger *K = dt_kledger_of(ctx);
    ro->krows_dropped += (int64_t)K->dropped_calls;
    krow_index x = {NULL, 0};
    for (size_t i = 0; i < K->n; i++) {
      const dt_kledger_row *k = &K->rows[i];
      int p = SB_ROLE_PHASES - 1;
      for (int q = 0; q < SB_ROLE_PHASES - 1; q++)
        if (!strcmp(k->phase, sb_role_phases[q])) p = q;
      role_krow(ro, &x, k, sb_role_phases[p]);
      ro->flops[p] += k->flops * (double)k->calls;
      ro->bytes[p] += (double)(k->bytes_read + k->bytes_written) * (double)k->calls;
      if (!strcmp(k->op, "gemm") || !strcmp(k->op, "attn_gemm"))
        ro->gemm_flops += k->flops * (double)k->calls;
    }
    free(x.slot);
  }
  free(ids);
  dt_trainer_free(ctx, t);
  return s;
}

/* The roles of j's mesh, one rank each on meta + fake; r gets the roles and their max. */
static void meta_run(const sb_opts *o, job *j, sb_result *r) {
  const int W = o->world;
  j->role_of = malloc((size_t)W * sizeof *j->role_of);
  int n = j->role_of ? dt_parallel_dims_roles(&j->dims, &j->cfg, o->batch, o->seq, j->role_of) : -1;
  int *reps = n > 0 ? malloc((size_t)n * sizeof *reps) : NULL;
  j->roles = n > 0 ? calloc((size_t)n, sizeof *j->roles) : NULL;
  if (!reps || !j->roles) {
    failed(r, "out of memory");
    free(reps);
    return;
  }
  j->n_roles = n;
  for (int i = 0; i < n; i++) reps[i] = -1;
  for (int rank = 0; rank < W; rank++) {
    sb_role *ro = &j->roles[j->role_of[rank]];
    if (reps[j->role_of[rank]] < 0) reps[j->role_of[rank]] = rank;
    ro->count++;
  }
  dt_launch_opts lo;
  memset(&lo, 0, sizeof lo);
  lo.world = W;
  lo.device = DT_DEV_META;
  lo.comm = DT_COMM_FAKE;
  lo.fake_ranks = reps;
  lo.n_fake_ranks = n;
  dt_launch_report rep;
  memset(&rep, 0, sizeof rep);
  dt_status s = dt_launch(&lo, meta_train, j, &rep);
  if (s != DT_OK) {
    failed(r, "rank %d: %s: %s", rep.failed_rank, dt_status_str(rep.failed_status), rep.failed_msg);
  } else {
    snprintf(r->status, sizeof r->status, "shape-only");
    int64_t mx[4] = {0, 0, 0, 0}, peak = 0;
    int worst = 0;
    double worst_wire = -1;
    for (int i = 0; i < n; i++) {
      const sb_role *ro = &j->roles[i];
      for (int k = 0; k < 4; k++) mx[k] = ro->mem[k] > mx[k] ? ro->mem[k] : mx[k];
      peak = ro->peak > peak ? ro->peak : peak;
      double w = 0;
      for (int c = 0; c < ro->n_comm; c++) w += ro->comm[c].wire_bytes;
      if (w > worst_wire) worst_wire = w, worst = i;
    }
    r->mem_params_bytes = mx[0];
    r->mem_grads_bytes = mx[1];
    r->mem_optimizer_bytes = mx[2];
    r->mem_activations_bytes = mx[3];
    r->peak_mem_bytes = peak;
    /* the comm rows of the role that moves the most */
    const sb_role *wr = &j->roles[worst];
    r->comm = wr->n_comm ? malloc(sizeof *r->comm * (size_t)wr->n_comm) : NULL;
    if (r->comm) {
      memcpy(r->comm, wr->comm, sizeof *r->comm * (size_t)wr->n_comm);
      r->n_comm = wr->n_comm;
    }
    r->roles = j->roles; /* moved: the result owns them */
    r->n_roles = n;
    j->roles = NULL;
    r->shape = j->shape; /* moved, with role_of */
    memset(&j->shape, 0, sizeof j->shape);
    r->shape.world = W;
    r->shape.role_of = j->role_of;
    j->role_of = NULL;
    r->shape.flops_per_token = dt_llama_flops_per_token(&j->cfg, o->seq);
    r->shape.vocab = j->cfg.vocab;
    r->shape.dim = j->cfg.dim;
    r->shape.tokens_per_step =
        (int64_t)(o->global_batch > 0 ? o->global_batch : o->batch) * o->seq;
  }
  dt_launch_report_free(&rep);
  free(reps);
  free(j->shape.pp_len); /* a failed run's */
  free(j->shape.pp_acts);
  memset(&j->shape, 0, sizeof j->shape);
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

/* Fits the plan to the mesh and resolves it against the model, once for the config
 * (dt_parallel_plan_resolve, into rp: what the memory estimate, the store's traits
 * and the trainer read); skips the config with the reason when it does not fit. A
 * single-layer workload's plan is resolved against the whole layer (a typo is still
 * an error). True when skipped. */
static bool plan_unfit(const sb_opts *o, dt_ctx *hc, const dt_plan *plan,
                       const dt_llama_config *cfg, dt_parallel_plan *rp, sb_result *r) {
  dt_llama_config whole;
  sb_workload_whole(cfg, &whole);
  const dt_status s = dt_parallel_plan_resolve(hc, plan, o->dims, &whole, o->batch, o->seq, rp);
  if (rp->resolved) sb_plan_traits_get(&rp->plan, cfg, &r->plan_traits); /* the store's baselines */
  if (s == DT_OK) return false;
  static const char WHO[] = "dt_parallel_plan_resolve: "; /* its own refusals */
  const char *why = sb_strip_rank(dt_last_error(hc));
  if (!strncmp(why, WHO, sizeof WHO - 1)) why += sizeof WHO - 1;
  skip(r, "%s", why);
  return true;
}

/* The memory estimate (bench/harness/memory.c) into r; over o->mem_limit (when
 * set) the config is skipped with both numbers and r->mem_refused. True then. */
static bool over_memory(const sb_opts *o, const dt_parallel_plan *plan, sb_result *r) {
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
  /* the recipe too: the reference clips and schedules as the sharded job */
  snprintf(rkey, sizeof rkey, "%s/%s/%s/%d/%d/%d/%s/%.17g/%d/%d,%d,%d,%.17g,%d,%.17g", o->model,
           o->workload, o->dtype, o->batch, o->seq, o->warmup + o->steps, o->load_weights,
           j->max_norm, o->global_batch, o->lr.training_steps, o->lr.warmup_steps,
           o->lr.has_decay_ratio, o->lr.decay_ratio, (int)o->lr.decay_type, o->lr.min_lr_factor);
  if (!strcmp(cache->key, rkey)) return true;
  char why[DT_ERRMSG_LEN + 64];
  sb_ref_free(cache);
  j->reference = true;
  j->plan = NULL;
  const int ones[DT_PDIM_COUNT] = {1, 1, 1, 1, 1};
  if (dt_parallel_dims_init(NULL, ones, 1, &j->dims) != DT_OK) {
    failed(r, "reference: no 1-rank mesh");
    return false;
  }
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
  r->host_staged_bytes = j->staged;
  r->weights_saved = j->weights_saved;
  r->mem_params_bytes = j->mem[0];
  r->mem_grads_bytes = j->mem[1];
  r->mem_optimizer_bytes = j->mem[2];
  r->mem_activations_bytes = j->mem[3];
  r->peak_at = j->peak_at;
  r->grad_norm = j->max_norm > 0 ? j->grad_norm : NAN;
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
  dt_parallel_plan *rp = NULL; /* the plan resolved for this config */
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
  rp = calloc(1, sizeof *rp);
  if (!j || !plan || !rp) {
    failed(r, "out of memory");
    goto done;
  }
  j->fault.hang_rank = j->fault.crash_rank = -1; /* no fault until fault_parse */
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
  const bool meta = !strcmp(o->device, "meta");
  if (plan_unfit(o, &hc, plan, &j->cfg, rp, r) || (!meta && over_memory(o, rp, r))) goto done;
  j->max_norm = o->max_norm > 0 ? o->max_norm : plan->max_norm; /* --max-norm over the plan's */
  if (dt_backend_parse(o->backend, &be) != DT_OK || !dt_backend_available(be)) {
    skip(r, "backend '%s' is not built in", o->backend);
    goto done;
  }
  if (meta) { /* shape-only: no reference, no verdict */
    if (stage != SB_STAGE_RUN) goto done;
    j->plan = rp;
    if (dt_parallel_dims_init(&hc, o->dims, o->world, &j->dims) != DT_OK) {
      failed(r, "%s", sb_strip_rank(dt_last_error(&hc)));
      goto done;
    }
    meta_run(o, j, r);
    goto done;
  }
  if (stage == SB_STAGE_CHECK || !reference(o, j, cache, r) || stage == SB_STAGE_PREPARE)
    goto done; /* status "" when it would run */
  j->reference = false;
  j->ref = cache;
  j->plan = rp;
  j->n_comm = 0;
  if (dt_parallel_dims_init(&hc, o->dims, o->world, &j->dims) != DT_OK) {
    failed(r, "%s", sb_strip_rank(dt_last_error(&hc)));
    goto done;
  }
  char why[DT_ERRMSG_LEN + 64];
  sb_config fc;
  sb_config_fill(o, &fc);
  if (fault_parse(getenv("SHARDBENCH_FAULT"), fc.key, &j->fault, why, sizeof why)) {
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
  free(rp);
  if (j) {
    free(j->ppt);
    free(j->role_of);
    sb_roles_free(j->roles, j->n_roles);
  }
  free(j);
  dt_ctx_release(&hc);
}

static const char *const MEM_NAMES[4] = {"params", "grads", "optimizer", "activations"};

/* `, "peak_at": {...}`: where a step peaked (its phase, module and noted bytes). */
static void peak_at_json(FILE *f, const dt_mem_peak_at *p) {
  fputs(", \"peak_at\": {\"phase\": ", f);
  sb_json_str(f, p->phase);
  fputs(", \"module\": ", f);
  sb_json_str(f, p->where);
  fprintf(f, ", \"fsdp_unsharded_params_bytes\": %zu, \"collective_buffers_bytes\": %zu}",
          p->note[DT_MEM_NOTE_FSDP_PARAMS], p->note[DT_MEM_NOTE_COMM]);
}

/* A shape-only result's roles, then the max over them. */
static void print_roles_text(FILE *f, const sb_result *r) {
  fprintf(f, "  shape-only: %d role(s) ran, one rank each (meta device, fake comm); the last "
             "step's figures\n",
          r->n_roles);
  for (int i = 0; i < r->n_roles; i++) {
    const sb_role *ro = &r->roles[i];
    fprintf(f, "  role %d: rank %d, for %d rank(s)\n", i, ro->rank, ro->count);
    fprintf(f, "    memory: params %.2f MiB, grads %.2f MiB, optimizer %.2f MiB, activations "
               "and buffers %.2f MiB; peak %.2f MiB\n", ro->mem[0] / 1048576.0,
            ro->mem[1] / 1048576.0, ro->mem[2] / 1048576.0, ro->mem[3] / 1048576.0,
            ro->peak / 1048576.0);
    fprintf(f, "    peak reached in %s%s%s; then FSDP's unsharded parameters %.2f MiB, "
               "collective buffers %.2f MiB\n", ro->peak_at.phase[0] ? ro->peak_at.phase : "(setup)",
            ro->peak_at.where[0] ? " in " : "", ro->peak_at.where,
            ro->peak_at.note[DT_MEM_NOTE_FSDP_PARAMS] / 1048576.0,
            ro->peak_at.note[DT_MEM_NOTE_COMM] / 1048576.0);
    if (ro->reserved > 0)
      fprintf(f, "    reserved peak %.2f MiB (the caching allocator's segments, as PyTorch's "
                 "max_memory_reserved)\n", ro->reserved / 1048576.0);
    fprintf(f, "    compute:");
    for (int p = 0; p < SB_ROLE_PHASES; p++)
      if (ro->flops[p] > 0 || ro->bytes[p] > 0)
        fprintf(f, " %s %.4g FLOP (%.4g B)", sb_role_phases[p], ro->flops[p], ro->bytes[p]);
    fprintf(f, "; GEMM %.4g FLOP\n", ro->gemm_flops);
    for (int k = 0; k < ro->n_comm; k++) {
      const sb_comm_row *cr = &ro->comm[k];
      fprintf(f, "    comm %-15s %-13s %-9s %6lld calls %14lld payload B %16.0f wire B\n", cr->op,
              cr->mesh_dim, cr->phase, (long long)cr->calls, (long long)cr->payload_bytes,
              cr->wire_bytes);
    }
  }
  fprintf(f, "  max over roles: params %.2f MiB, grads %.2f MiB, optimizer %.2f MiB, activations "
             "and buffers %.2f MiB; peak %.2f MiB\n", r->mem_params_bytes / 1048576.0,
          r->mem_grads_bytes / 1048576.0, r->mem_optimizer_bytes / 1048576.0,
          r->mem_activations_bytes / 1048576.0, r->peak_mem_bytes / 1048576.0);
}

static void print_roles_json(FILE *f, const sb_result *r) {
  fputs(", \"roles\": [", f);
  for (int i = 0; i < r->n_roles; i++) {
    const sb_role *ro = &r->roles[i];
    fprintf(f, "%s{\"rank\": %d, \"count\": %d, \"peak_mem_bytes\": %lld, "
               "\"reserved_peak_bytes\": %lld", i ? ", " : "",
            ro->rank, ro->count, (long long)ro->peak, (long long)ro->reserved);
    for (int k = 0; k < 4; k++) fprintf(f, ", \"mem_%s_bytes\": %lld", MEM_NAMES[k], (long long)ro->mem[k]);
    peak_at_json(f, &ro->peak_at);
    fputs(", \"compute\": {", f);
    for (int p = 0; p < SB_ROLE_PHASES; p++)
      fprintf(f, "%s\"%s\": {\"flops\": %.17g, \"bytes\": %.17g}", p ? ", " : "",
              sb_role_phases[p], ro->flops[p], ro->bytes[p]);
    fprintf(f, "}, \"gemm_flops\": %.17g, \"comm\": [", ro->gemm_flops);
    for (int k = 0; k < ro->n_comm; k++) {
      const sb_comm_row *cr = &ro->comm[k];
      fprintf(f, "%s{\"op\": ", k ? ", " : "");
      sb_json_str(f, cr->op);
      fputs(", \"mesh_dim\": ", f);
      sb_json_str(f, cr->mesh_dim);
      fputs(", \"phase\": ", f);
      sb_json_str(f, cr->phase);
      fprintf(f, ", \"calls\": %lld, \"payload_bytes\": %lld, \"wire_bytes\": %.17g}",
              (long long)cr->calls, (long long)cr->payload_bytes, cr->wire_bytes);
    }
    fprintf(f, "], \"kernels_dropped_calls\": %lld, \"kernels\": [", (long long)ro->krows_dropped);
    for (int k = 0; k < ro->n_krows; k++) {
      const sb_krow *kr = &ro->krows[k];
      fprintf(f, "%s{\"op\": ", k ? ", " : "");
      sb_json_str(f, kr->op);
      fputs(", \"phase\": ", f);
      sb_json_str(f, kr->phase);
      fprintf(f, ", \"dtype\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, \"batch\": %lld, "
              "\"flops\": %.17g, \"bytes\": %.17g, \"calls\": %lld}",
              dt_dtype_name((dt_dtype)kr->dtype), (long long)kr->m, (long long)kr->n,
              (long long)kr->k, (long long)kr->batch, kr->flops, kr->bytes, (long long)kr->calls);
    }
    fputs("]}", f);
  }
  fputs("]", f);
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
    NUM("grad_norm", r->grad_norm);
    NUM("est_mem_bytes", r->est_mem_bytes);
    NUM("est_need_bytes", r->est_need_bytes);
#undef NUM
    fprintf(f, ", \"compared\": %lld", (long long)r->n_compared);
    fputs(", \"worst\": ", f);
    if (r->worst[0]) sb_json_str(f, r->worst);
    else fputs("null", f);
    if (r->peak_mem_bytes >= 0) fprintf(f, ", \"peak_mem_bytes\": %lld", (long long)r->peak_mem_bytes);
    else fputs(", \"peak_mem_bytes\": null", f);
    if (r->host_staged_bytes >= 0)
      fprintf(f, ", \"host_staged_bytes\": %lld", (long long)r->host_staged_bytes);
    else fputs(", \"host_staged_bytes\": null", f);
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
    fputs("]", f);
    if (r->peak_at.phase[0] && !r->n_roles) peak_at_json(f, &r->peak_at);
    if (r->n_roles) print_roles_json(f, r);
    fputs("}\n", f);
    return;
  }
  fprintf(f, "%s\n  status: %s%s%s\n", c->key, r->status, r->reason[0] ? ": " : "", r->reason);
  if (r->n_roles) {
    print_roles_text(f, r);
    return;
  }
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
  if (r->peak_at.phase[0])
    fprintf(f, "  peak rank 0 reached in %s%s%s; then FSDP's unsharded parameters %.2f MiB, "
               "collective buffers %.2f MiB\n", r->peak_at.phase, r->peak_at.where[0] ? " in " : "",
            r->peak_at.where, r->peak_at.note[DT_MEM_NOTE_FSDP_PARAMS] / 1048576.0,
            r->peak_at.note[DT_MEM_NOTE_COMM] / 1048576.0);
  if (isfinite(r->grad_norm))
    fprintf(f, "  grad norm (clip_grad_norm_, last timed step, before clipping): %.9g\n",
            r->grad_norm);
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
