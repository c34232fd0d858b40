/* verify/test_baselines.c: the measured TP communication of the shipped plans
 * equals the analytic Megatron baselines (bench/harness/baselines.h) byte for byte.
 *
 * Model: the tiny Llama of verify/test_parallel.c (dim 64, 8 heads, 4 kv heads,
 * vocab 128, ffn hidden 192, seq 8, batch 4, f64) with 1 and 2 layers. Plans:
 * plans/megatron-tp.plan (TP, no SP, no loss parallel) and
 * plans/torchtitan-tp-sp.plan (TP + SP + loss parallel), on a 1-D "tp" mesh of
 * 2 and 4 ranks (threads). One training step (forward, cross-entropy, backward,
 * AdamW) with the ledger on; rank 0's rows are summed (wire_bytes, the ring
 * model) by class:
 *   act        forward/backward rows on a b*s*h tensor: the matmul blocks plus
 *              the embedding / output boundary (the same size, so they are told
 *              apart by the layer count: per layer = act(L=2) - act(L=1),
 *              boundary = act(L=1) - per layer)
 *   logits     all_gather of the b*s*V logits (no loss parallel)
 *   loss       all_reduce of b*s scalars (loss-parallel cross-entropy)
 *   optimizer  rows in phase "optimizer" (the SP norm weights' gradients)
 *   other      anything else: must be 0
 * Each measured term, and the whole step, must equal the analytic one:
 * |measured/analytic - 1| <= 1e-12 (both are sums of exact binary fractions of
 * integers, so the ratio is 1 exactly; 1e-12 only allows for a future
 * non-power-of-two group). A term that is 0 analytically must measure 0.
 */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../bench/harness/baselines.h"
#include "testutil.h"

enum { BATCH = 4, SEQ = 8, DIM = 64, VOCAB = 128 }; /* as verify/test_parallel.c */
static const uint64_t SEED = 20260101;              /* any fixed seed */
static const double RATIO_TOL = 1e-12;              /* see the file comment */

static dt_llama_config tiny_config(int layers) {
  dt_llama_config c;
  memset(&c, 0, sizeof c);
  strcpy(c.name, "tiny");
  c.dim = DIM;
  c.n_layers = layers;
  c.n_heads = 8;
  c.n_kv_heads = 4;   /* tp 4: one kv head per rank */
  c.vocab = VOCAB;
  c.multiple_of = 32; /* ffn hidden 192, divisible by 4 */
  c.norm_eps = 1e-5;
  c.rope_theta = 500000;
  c.depth_init = true;
  return c;
}

/* Token ids: a fixed LCG (Knuth's MMIX constants), the same on every rank. */
static void make_ids(int which, int64_t *ids) {
  uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(which + 1);
  for (int i = 0; i < BATCH * SEQ; i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    ids[i] = (int64_t)((x >> 33) % (uint64_t)VOCAB);
  }
}

enum { C_ACT = 0, C_LOGITS, C_LOSS, C_OPT, C_OTHER, C_N };
static const char *const class_names[C_N] = {"act", "logits", "loss", "optimizer", "other"};

typedef struct job {
  const char *plan;
  int layers;
  double sum[C_N];    /* rank 0's wire bytes per class */
  bool loss_parallel;
  int failed;
} job;

static dt_status ids_tensor(dt_ctx *ctx, dt_mesh *mesh, int which, dt_tensor *out) {
  int64_t ids[BATCH * SEQ];
  make_ids(which, ids);
  const int64_t shape[2] = {BATCH, SEQ};
  dt_array a;
  DT_CHECK(dt_array_wrap(ctx, DT_DEV_CPU, DT_I64, 2, shape, ids, &a));
  dt_placement pl[1] = {dt_replicate()};
  return dt_tensor_distribute(ctx, mesh, &a, pl, out);
}

static void classify(const dt_ctx *ctx, double sum[C_N]) {
  const uint64_t act = (uint64_t)BATCH * SEQ * DIM, logits = (uint64_t)BATCH * SEQ * VOCAB,
                 pos = (uint64_t)BATCH * SEQ;
  for (int i = 0; i < C_N; i++) sum[i] = 0;
  for (size_t i = 0; i < dt_ledger_of(ctx)->n; i++) {
    const dt_ledger_row *r = &dt_ledger_of(ctx)->rows[i];
    int c = C_OTHER;
    bool fb = !strcmp(r->phase, "forward") || !strcmp(r->phase, "backward");
    if (!strcmp(r->phase, "optimizer") && r->op == DT_COLL_ALL_REDUCE) c = C_OPT;
    else if (fb && r->elems == act &&
             (r->op == DT_COLL_ALL_REDUCE || r->op == DT_COLL_ALL_GATHER ||
              r->op == DT_COLL_REDUCE_SCATTER))
      c = C_ACT;
    else if (fb && r->elems == logits && r->op == DT_COLL_ALL_GATHER) c = C_LOGITS;
    else if (fb && r->elems == pos && r->op == DT_COLL_ALL_REDUCE) c = C_LOSS;
    if (strcmp(r->group, "tp")) c = C_OTHER;
    sum[c] += r->wire_bytes;
  }
}

static dt_status run_rank(dt_ctx *ctx, void *arg) {
  job *jb = arg;
  dt_llama_config cfg = tiny_config(jb->layers);
  dt_mesh *mesh = NULL;
  dt_model *m = NULL;
  dt_plan *p = calloc(1, sizeof *p);
  dt_tensor tok, tgt;
  memset(&tok, 0, sizeof tok);
  memset(&tgt, 0, sizeof tgt);
  dt_status s = DT_OK;
  if (!p) return dt_error(ctx, DT_ERR_NOMEM, "run_rank", "no memory");
  const int shape[1] = {ctx->world_size};
  const char *const nm[1] = {"tp"};
  const char *dir = getenv("srcdir"); /* set by the Automake test harness */
  char path[512];
  snprintf(path, sizeof path, "%s/plans/%s.plan", dir && dir[0] ? dir : ".", jb->plan);
  DT_CHECK_GOTO(dt_plan_load(ctx, path, p), s, done);
  if (ctx->rank == 0) jb->loss_parallel = p->loss_parallel; /* shared: one writer */
  DT_CHECK_GOTO(dt_mesh_create(ctx, ctx->world, 1, shape, nm, &mesh), s, done);
  DT_CHECK_GOTO(dt_model_create(ctx, mesh, &cfg, DT_F64, SEED, &m), s, done);
  DT_CHECK_GOTO(dt_parallelize_module(ctx, m, 0, p->entries, p->n_entries), s, done);
  DT_CHECK_GOTO(dt_model_materialize(ctx, m), s, done);
  DT_CHECK_GOTO(ids_tensor(ctx, mesh, 0, &tok), s, done);
  DT_CHECK_GOTO(ids_tensor(ctx, mesh, 1, &tgt), s, done);
  dt_ledger_clear(ctx);
  dt_ledger_enable(ctx, true);
  dt_ctx_set_phase(ctx, "forward");
  dt_var *logits = NULL, *loss = NULL;
  DT_CHECK_GOTO(dt_model_forward(ctx, m, &tok, &logits), s, done);
  DT_CHECK_GOTO(dt_model_loss(ctx, m, logits, &tgt, &loss), s, done);
  dt_ctx_set_phase(ctx, "backward");
  DT_CHECK_GOTO(dt_model_backward(ctx, m, loss), s, done);
  dt_ctx_set_phase(ctx, "optimizer");
  const dt_adamw opt = DT_ADAMW_DEFAULT;
  DT_CHECK_GOTO(dt_model_adamw_step(ctx, m, &opt), s, done);
  DT_CHECK_GOTO(dt_model_end_step(ctx, m), s, done);
  dt_ctx_set_phase(ctx, "");
  if (ctx->rank == 0) classify(ctx, jb->sum);
done:
  dt_ledger_enable(ctx, false);
  dt_ctx_set_phase(ctx, "");
  dt_tensor_free(ctx, &tok);
  dt_tensor_free(ctx, &tgt);
  if (m) {
    dt_parallelize_release(ctx, m);
    dt_model_free(ctx, m);
  }
  dt_mesh_free(mesh);
  free(p);
  return s;
}

static int launch(int world, job *jb) {
  dt_launch_opts o;
  memset(&o, 0, sizeof o);
  o.backend = DT_BACKEND_THREADS;
  o.world = world;
  o.timeout_s = 120; /* a hang is a failure, well before the suite's timeout */
  o.device = DT_DEV_CPU;
  dt_launch_report rep;
  memset(&rep, 0, sizeof rep);
  dt_status s = dt_launch(&o, run_rank, jb, &rep);
  TU_CHECK(s == DT_OK, "dt_launch(threads, %d) %s L=%d -> %s: rank %d: %s", world, jb->plan,
           jb->layers, dt_status_str(s), rep.failed_rank, rep.failed_msg);
  dt_launch_report_free(&rep);
  return s == DT_OK ? 0 : -1;
}

/* One compared term: prints a row and checks the ratio. */
static void compare(const char *fw, int tp, const char *term, double analytic, double measured) {
  double ratio = analytic != 0 ? measured / analytic : (measured == 0 ? 1.0 : INFINITY);
  printf("  %-16s tp %d  %-16s %14.1f %14.1f  %.15f\n", fw, tp, term, analytic, measured, ratio);
  TU_CHECK(fabs(ratio - 1.0) <= RATIO_TOL, "%s tp %d %s: measured %.17g vs analytic %.17g", fw,
           tp, term, measured, analytic);
}

/* Unit checks of the model that need no run (baselines.md 3, 1.1). */
static void unit_checks(void) {
  sb_baseline_in in;
  memset(&in, 0, sizeof in);
  TU_CHECK(dt_llama_config_get(NULL, "8B", &in.model) == DT_OK, "8B config");
  in.pp = 4;
  in.dp_replicate = in.dp_shard = in.cp = 1;
  in.tp = 8;
  in.batch = 8;
  in.seq = 8192;
  in.elem_bytes = 2;
  in.microbatches = 8;
  in.virtual_stages = 2;
  sb_baseline_row rows[SB_BASELINE_MAX_ROWS];
  int n = sb_baseline_compute(&in, rows, SB_BASELINE_MAX_ROWS);
  TU_CHECK(n > 0 && n < SB_BASELINE_MAX_ROWS, "row count %d", n);
  int found = 0;
  for (int i = 0; i < n; i++) {
    if (!strcmp(rows[i].quantity, "bubble_fraction") &&
        (!strcmp(rows[i].framework, "gpipe") || !strcmp(rows[i].framework, "1f1b"))) {
      TU_CHECK(fabs(rows[i].value - 3.0 / 11.0) < 1e-15, "%s bubble %.17g != 3/11",
               rows[i].framework, rows[i].value);
      found++;
    }
    if (!strcmp(rows[i].framework, "interleaved") && !strcmp(rows[i].quantity, "bubble_fraction")) {
      TU_CHECK(fabs(rows[i].value - 3.0 / 19.0) < 1e-15, "interleaved bubble %.17g != 3/19",
               rows[i].value);
      found++;
    }
    if (!strcmp(rows[i].framework, "megatron-tp") && !strcmp(rows[i].quantity, "comm_bytes_per_layer")) {
      /* 8bsh(t-1)/t * 2 B: b 8, s 8192, h 4096, t 8 */
      TU_CHECK(rows[i].value == 8.0 * 8 * 8192 * 4096 * 7 / 8 * 2, "per-layer %.17g",
               rows[i].value);
      found++;
    }
  }
  TU_CHECK(found == 4, "expected rows not found (%d)", found);
  in.batch = 7; /* not divisible by dp is fine at dp 1; a bad one: */
  in.dp_shard = 2;
  char err[128];
  TU_CHECK(sb_baseline_check(&in, err, sizeof err) != 0, "batch 7 on dp 2 must be refused");
}

int main(int argc, char **argv) {
  tu_opts o;
  tu_parse(argc, argv, &o);
  if (o.backend != DT_BACKEND_THREADS) return SB_SKIP;
  unit_checks();
  static const char *const plans[2] = {"megatron-tp", "torchtitan-tp-sp"};
  static const char *const fws[2] = {"megatron-tp", "megatron-tp-sp"};
  static const int tps[2] = {2, 4};
  printf("test_baselines: wire bytes per rank per step, rank 0 (ring model)\n");
  printf("  %-16s %-5s  %-16s %14s %14s  %s\n", "framework", "mesh", "term", "analytic",
         "measured", "ratio");
  for (int pi = 0; pi < 2; pi++)
    for (int ti = 0; ti < 2; ti++) {
      job j1 = {plans[pi], 1, {0}, false, 0}, j2 = {plans[pi], 2, {0}, false, 0};
      if (launch(tps[ti], &j1) || launch(tps[ti], &j2)) continue;
      sb_baseline_in in;
      memset(&in, 0, sizeof in);
      in.model = tiny_config(2);
      in.pp = in.dp_replicate = in.dp_shard = in.cp = 1;
      in.tp = tps[ti];
      in.batch = BATCH;
      in.seq = SEQ;
      in.elem_bytes = 8; /* f64 */
      in.microbatches = in.virtual_stages = 1;
      sb_tp_terms a;
      TU_CHECK(sb_baseline_tp_terms(&in, pi == 0 ? SB_TP_MEGATRON : SB_TP_SP, j2.loss_parallel,
                                    &a) == 0, "tp_terms");
      double per_layer = j2.sum[C_ACT] - j1.sum[C_ACT];
      double boundary = j1.sum[C_ACT] - per_layer;
      double total = 0;
      for (int c = 0; c < C_N; c++) total += j2.sum[c];
      compare(fws[pi], tps[ti], "block/layer", a.block_per_layer, per_layer);
      compare(fws[pi], tps[ti], "blocks (L=2)", a.blocks, 2 * per_layer);
      compare(fws[pi], tps[ti], "emb+output", a.boundary, boundary);
      compare(fws[pi], tps[ti], "logits", a.logits, j2.sum[C_LOGITS]);
      compare(fws[pi], tps[ti], "loss", a.loss, j2.sum[C_LOSS]);
      compare(fws[pi], tps[ti], "optimizer", a.optimizer, j2.sum[C_OPT]);
      compare(fws[pi], tps[ti], "whole step", a.total, total);
      TU_CHECK(j1.sum[C_OTHER] == 0 && j2.sum[C_OTHER] == 0, "%s tp %d: unclassified comm %s %g",
               plans[pi], tps[ti], class_names[C_OTHER], j2.sum[C_OTHER]);
    }
  return tu_finish("test_baselines");
}
