/* verify/test_ddp.c: DDP's gradient buckets (dt_data_parallel_reduce_grads) on the
 * debugmodel in f32, threads backend.
 *
 * Model: TorchTitan's debugmodel (dim 256, 6 layers, 16 heads, 16 kv heads, vocab
 * 2048, FFN hidden 768): 57 weights, 6163712 parameters (24654848 f32 bytes).
 * Meshes: dp_replicate 2 and 4 (1-D), and dp_replicate 2 x tp 2 with
 * plans/torchtitan-tp-sp.plan. Tokens: batch = dp sequences of 8, S(0) on dp.
 *
 * Per (mesh, caps): forward, loss, backward; then
 *  (a) buckets: the ledger rows of the reduce alone must be one all_reduce per
 *      bucket on group dp_replicate, phase "backward", f32, with the bucket
 *      sizes (elements) in order equal to the assignment computed here
 *      (expected_buckets) from the gradients' local sizes, which are written
 *      here from the config (shapes of TorchTitan's model.py, the plan's
 *      shards), not read from the model, by DDP's rule
 *      (torch/csrc/distributed/c10d/reducer.cpp, compute_bucket_assignment_by_size:
 *      add the tensor, close the bucket once its bytes >= its limit; the first
 *      limit is the first bucket's cap, then bucket_cap). The order is reverse
 *      module order: output, norm, then per layer 5..0: w3, w2, w1, ffn_norm,
 *      wo, wv, wk, wq, attention_norm, then tok_embeddings. Worked by hand for
 *      dp only (the sizes in f32 bytes: output and tok_embeddings 2 MiB, w1/w2/w3
 *      768 KiB, wq/wk/wv/wo 256 KiB, norms 1 KiB):
 *        defaults (25 MiB, first 1 MiB): output alone closes the first bucket
 *          (2 MiB >= 1 MiB); the other 22557696 bytes < 25 MiB: 2 buckets.
 *        100 MiB for both (TorchTitan's bucket_cap_mb=100 under torch 2.15): 1.
 *        1 MiB for both: output; then norm + w3 + w2 (1.5 MiB), w1 + ffn_norm +
 *          wo, wv + wk + wq + attention_norm + the next w3, ... : 17 buckets.
 *        cap 0: one all_reduce per gradient: 57.
 *        25 MiB, first 2 MiB: output's 2 MiB reach the first cap exactly and
 *          close it (>=, not >): 2 buckets, the first holding output alone.
 *      expected_buckets is checked against these counts first.
 *  (b) values: before the reduce, each gradient that is Partial on dp is
 *      redistributed on its own to Replicate on dp (dt_redistribute: one
 *      all_reduce of that gradient alone); after the reduce, every such
 *      gradient must equal it bit for bit (memcmp of the local data) with the
 *      same placements, so the SP norm weights stay Partial on tp. Bit
 *      equality is what a correct bucket gives: the threads backend sums every
 *      element in rank order whatever the buffer (lib/comm/comm_threads.c),
 *      and for 2 ranks any order gives a + b.
 *  (c) the checks can fail: the same run with the first bucket's gradients
 *      relabelled Replicate on dp before the reduce (so that bucket is never
 *      all-reduced, as a reducer that skipped it) must fail both (a) and (b).
 * Several dims (the mask 0b11 on mesh [dp_replicate 2, cp 2], TorchTitan's dp_cp
 * for DDP with context parallel): one all_reduce per bucket on the flattened group
 * "dp_replicate_cp" of 4 ranks, the buckets of (a) with DDP's defaults; every
 * reduced gradient Replicate on both dims and equal, gathered, to the debugmodel's
 * gradient on a 1-rank mesh over the whole batch (sb_tolerance(f32) before an
 * update: a reordered sum, bench/harness/verdict.c). Twice: the batch (4)
 * Shard(0) on both dims (gradients Partial on both), and the batch (2) on
 * dp_replicate only (Partial there, Replicate on cp: the cp ranks of coordinate 1
 * must contribute zeros, or the sum is twice the reference). The planted skipped
 * first bucket must fail both checks here too.
 * Bad input: NULL model, an empty mask or a dim past the mesh, a NaN cap:
 * DT_ERR_INVALID and no collective.
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../bench/harness/verdict.h"
#include "testutil.h"

enum { SEQ = 8, N_WEIGHTS = 57, MAX_BUCKETS = 64 };
static const uint64_t SEED = 20260102; /* any fixed seed */
static const double MiB = 1024.0 * 1024.0;

/* ---- the analytic assignment ------------------------------------------------------ */

/* The 57 gradients' local sizes (elements) in reverse module order, on a mesh
 * with tensor parallel degree tp under torchtitan-tp-sp (Rowwise/Colwise shards
 * halve every matrix: tok_embeddings and output on the vocab dim, wq/wk/wv/w1/w3
 * on the output dim, wo/w2 on the input dim; norms replicated). Shapes of
 * TorchTitan's model.py: wq [heads*hd, dim], wk/wv [kv*hd, dim], wo [dim,
 * heads*hd], w1/w3 [hidden, dim], w2 [dim, hidden], embeddings [vocab, dim]. */
static int grad_sizes(int tp, int64_t *out) {
  const int64_t D = 256, V = 2048, HID = 768, HD = 16, NH = 16, KV = 16, L = 6;
  int n = 0;
  out[n++] = V * D / tp;            /* output */
  out[n++] = D;                     /* norm */
  for (int64_t l = L - 1; l >= 0; l--) {
    out[n++] = HID * D / tp;        /* w3 */
    out[n++] = D * HID / tp;        /* w2 */
    out[n++] = HID * D / tp;        /* w1 */
    out[n++] = D;                   /* ffn_norm */
    out[n++] = D * NH * HD / tp;    /* wo */
    out[n++] = KV * HD * D / tp;    /* wv */
    out[n++] = KV * HD * D / tp;    /* wk */
    out[n++] = NH * HD * D / tp;    /* wq */
    out[n++] = D;                   /* attention_norm */
  }
  out[n++] = V * D / tp;            /* tok_embeddings */
  return n;
}

/* DDP's assignment of sizes[0..n) (elements of es bytes) into buckets: their
 * element counts into out; returns the count. cap <= 0: one per gradient. */
static int expected_buckets(const int64_t *sizes, int n, int es, double first, double cap,
                            int64_t *out) {
  int nb = 0;
  int64_t elems = 0;
  double bytes = 0, limit = first;
  for (int i = 0; i < n; i++) {
    elems += sizes[i];
    bytes += (double)sizes[i] * es;
    if (cap <= 0 || bytes >= limit) {
      out[nb++] = elems;
      elems = 0;
      bytes = 0;
      limit = cap;
    }
  }
  if (elems) out[nb++] = elems;
  return nb;
}

/* ---- one case ------------------------------------------------------------------------ */

typedef struct variant {
  const char *name;
  bool null_opts;          /* pass NULL (DDP's defaults) */
  dt_ddp_opts opts;
  bool skip_first_bucket;  /* the planted bug of (c) */
} variant;

/* Mismatches found by the two verifiers of one run. */
typedef struct verdicts {
  int ledger, values;
} verdicts;

/* Checks (a): the ledger rows against the expected bucket sizes. Returns the
 * number of mismatches (printed on rank 0 when report). */
static int check_ledger(dt_ctx *ctx, const int64_t *want, int n_want, const char *group,
                        int group_size, const char *label, bool report) {
  const dt_ledger *lg = dt_ledger_of(ctx);
  int bad = 0;
  if ((int)lg->n != n_want) bad++;
  for (size_t i = 0; i < lg->n; i++) {
    const dt_ledger_row *r = &lg->rows[i];
    if (r->op != DT_COLL_ALL_REDUCE || strcmp(r->group, group) || r->group_size != group_size ||
        strcmp(r->phase, "backward") || r->dtype != DT_F32 ||
        (i < (size_t)n_want && r->elems != (uint64_t)want[i]))
      bad++;
  }
  if (bad && report)
    fprintf(stderr, "  %s: rank %d: %zu ledger rows, %d buckets expected (first row: %s %s/%d %s "
            "%llu elements)\n", label, ctx->rank, lg->n, n_want,
            lg->n ? dt_coll_name((dt_coll)lg->rows[0].op) : "-", lg->n ? lg->rows[0].group : "-",
            lg->n ? lg->rows[0].group_size : 0, lg->n ? lg->rows[0].phase : "-",
            lg->n ? (unsigned long long)lg->rows[0].elems : 0ull);
  return bad;
}

/* Checks (b): every gradient that was Partial on dp against its own redistribute. */
static int check_values(dt_model *m, dt_tensor *oracle, const bool *had, int dp_dim, int tp_dim,
                        const char *label, bool report) {
  int bad = 0;
  for (int i = 0; i < m->n_mods; i++) {
    if (!had[i]) continue;
    const dt_tensor *g = dt_var_grad(m->mods[i].weight);
    const dt_tensor *o = &oracle[i];
    bool same = g && g->local.numel == o->local.numel && g->dtype == o->dtype &&
                !memcmp(g->local.data, o->local.data, dt_array_bytes(&o->local));
    for (int d = 0; same && d < o->mesh_ndim; d++) same = dt_placement_eq(g->pl[d], o->pl[d]);
    /* the oracle itself: Replicate on dp, a norm keeps its tp Partial */
    bool norm = m->mods[i].kind == DT_MOD_RMSNORM;
    bool oracle_ok = o->pl[dp_dim].kind == DT_PL_REPLICATE &&
                     (tp_dim < 0 || !norm || o->pl[tp_dim].kind == DT_PL_PARTIAL);
    if (!same || !oracle_ok) {
      if (report && bad == 0)
        fprintf(stderr, "  %s: %s: gradient differs from its own dp all_reduce%s\n", label,
                m->mods[i].fqn, oracle_ok ? "" : " (or the oracle's placements are wrong)");
      bad++;
    }
  }
  return bad;
}

/* forward, loss, backward of step 0 with the ledger off: `batch` sequences of SEQ
 * tokens, Shard(0) on the mesh dims of tok_dims (nested) */
static dt_status grads(dt_ctx *ctx, dt_mesh *mesh, dt_model *m, int batch, unsigned tok_dims) {
  dt_tensor tok, tgt;
  memset(&tok, 0, sizeof tok);
  memset(&tgt, 0, sizeof tgt);
  DT_CHECK(sb_token_tensor(ctx, mesh, batch, SEQ, m->cfg.vocab, tok_dims, 0, 0, &tok));
  dt_status s = sb_token_tensor(ctx, mesh, batch, SEQ, m->cfg.vocab, tok_dims, 0, 1, &tgt);
  dt_var *logits = NULL, *loss = NULL;
  if (s == DT_OK) s = dt_model_forward(ctx, m, &tok, &logits);
  if (s == DT_OK) s = dt_model_loss(ctx, m, logits, &tgt, &loss);
  if (s == DT_OK) s = dt_model_backward(ctx, m, loss);
  dt_tensor_free(ctx, &tok);
  dt_tensor_free(ctx, &tgt);
  return s;
}

/* One variant on a materialized model: gradients, oracle, reduce, verdicts. */
static dt_status run_variant(dt_ctx *ctx, dt_mesh *mesh, dt_model *m, int dp, int tp,
                             int dp_dim, int tp_dim, const variant *v, const char *label,
                             verdicts *out) {
  memset(out, 0, sizeof *out);
  dt_ledger_enable(ctx, false);
  DT_CHECK(grads(ctx, mesh, m, dp, 1u << dp_dim));
  dt_tensor *oracle = calloc((size_t)m->n_mods, sizeof *oracle);
  bool *had = calloc((size_t)m->n_mods, sizeof *had);
  dt_status s = oracle && had ? DT_OK : DT_ERR_NOMEM;
  int n_partial = 0;
  for (int i = 0; s == DT_OK && i < m->n_mods; i++) {
    const dt_tensor *g = m->mods[i].weight ? dt_var_grad(m->mods[i].weight) : NULL;
    if (!g || g->pl[dp_dim].kind != DT_PL_PARTIAL) continue;
    dt_placement dst[DT_MAX_MESH_DIMS];
    for (int d = 0; d < g->mesh_ndim; d++) dst[d] = g->pl[d];
    dst[dp_dim] = dt_replicate();
    s = dt_redistribute(ctx, g, dst, DT_PLANNER_GREEDY, &oracle[i]);
    had[i] = s == DT_OK;
    n_partial++;
  }
  if (s == DT_OK)
    TU_CHECK(n_partial == N_WEIGHTS, "%s: %d gradients Partial on dp, want all %d", label,
             n_partial, N_WEIGHTS);
  /* the expected buckets (the planted bug skips the first one) */
  int64_t sizes[N_WEIGHTS], want[MAX_BUCKETS];
  int ns = grad_sizes(tp, sizes);
  double cap = v->null_opts ? DT_DDP_BUCKET_CAP_BYTES : v->opts.bucket_cap_bytes;
  double first = v->null_opts ? DT_DDP_FIRST_BUCKET_BYTES
                 : v->opts.first_bucket_bytes > 0 ? v->opts.first_bucket_bytes : cap;
  int nw = expected_buckets(sizes, ns, 4, first, cap, want);
  if (s == DT_OK && v->skip_first_bucket) {
    /* relabel the gradients of the first bucket (reverse module order) */
    int64_t left = want[0];
    for (int i = m->n_mods - 1; i >= 0 && left > 0; i--) {
      if (!had[i]) continue;
      dt_tensor *g = (dt_tensor *)dt_var_grad(m->mods[i].weight); /* the planted bug */
      left -= g->local.numel;
      g->pl[dp_dim] = dt_replicate();
    }
  }
  if (s == DT_OK) {
    dt_ctx_set_phase(ctx, "caller");
    dt_ledger_clear(ctx);
    dt_ledger_enable(ctx, true);
    s = dt_data_parallel_reduce_grads(ctx, m, 1u << dp_dim, v->null_opts ? NULL : &v->opts);
    dt_ledger_enable(ctx, false);
    TU_OK(ctx, s);
    TU_CHECK(!strcmp(ctx->phase, "caller"), "%s: phase not restored: '%s'", label, ctx->phase);
    dt_ctx_set_phase(ctx, "");
  }
  if (s == DT_OK) {
    bool report = !v->skip_first_bucket;
    out->ledger = check_ledger(ctx, want, nw, "dp_replicate", dp, label, report);
    out->values = check_values(m, oracle, had, dp_dim, tp_dim, label, report);
    if (ctx->rank == 0) {
      printf("  %-28s %2d buckets (elements:", label, nw);
      for (int b = 0; b < nw && b < 4; b++) printf(" %lld", (long long)want[b]);
      printf("%s); ledger mismatches %d, gradient mismatches %d\n", nw > 4 ? " ..." : "",
             out->ledger, out->values);
    }
  }
  for (int i = 0; oracle && i < m->n_mods; i++) dt_tensor_free(ctx, &oracle[i]);
  free(oracle);
  free(had);
  dt_ledger_enable(ctx, true);
  if (s == DT_OK) s = dt_model_end_step(ctx, m);
  dt_tape_zero_grad(m->tape);
  return s;
}

static const variant variants[] = {
    {"defaults (NULL)", true, {0, 0}, false},
    {"cap 100 MiB (first = cap)", false, {100 * 1048576.0, 0}, false},
    {"cap 1 MiB, first 1 MiB", false, {1048576.0, 1048576.0}, false},
    {"cap 0 (per gradient)", false, {0, 0}, false},
    {"first 2 MiB (= output's)", false, {25 * 1048576.0, 2 * 1048576.0}, false},
};

/* A mesh and the variants run on it (indices into variants[]). */
typedef struct tcase {
  int dp, tp;
  int n_variants;
  int variant[5];
} tcase;

static dt_status bad_inputs(dt_ctx *ctx, dt_model *m) {
  dt_ledger_clear(ctx);
  dt_ddp_opts nan_cap = {NAN, 0};
  TU_CHECK(dt_data_parallel_reduce_grads(ctx, NULL, 1u, NULL) == DT_ERR_INVALID, "NULL model");
  TU_CHECK(dt_data_parallel_reduce_grads(ctx, m, 0u, NULL) == DT_ERR_INVALID, "empty dim mask");
  TU_CHECK(dt_data_parallel_reduce_grads(ctx, m, 1u << dt_mesh_ndim(m->mesh), NULL) ==
               DT_ERR_INVALID, "dp dim past the mesh");
  TU_CHECK(dt_data_parallel_reduce_grads(ctx, m, 1u, &nan_cap) == DT_ERR_INVALID, "NaN cap");
  TU_CHECK(dt_ledger_of(ctx)->n == 0, "bad input made %zu collectives", dt_ledger_of(ctx)->n);
  return DT_OK;
}

static dt_status run_case(dt_ctx *ctx, const tcase *tc) {
  char label[128];
  dt_mesh *mesh = NULL;
  int dp_dim = 0, tp_dim = -1;
  if (tc->tp > 1) {
    const int shape[2] = {tc->dp, tc->tp};
    const char *const nm[2] = {"dp_replicate", "tp"};
    DT_CHECK(dt_mesh_create(ctx, ctx->world, 2, shape, nm, &mesh));
    tp_dim = 1;
  } else {
    const int shape[1] = {tc->dp};
    const char *const nm[1] = {"dp_replicate"};
    DT_CHECK(dt_mesh_create(ctx, ctx->world, 1, shape, nm, &mesh));
  }
  dt_llama_config cfg;
  dt_model *m = NULL;
  dt_plan *plan = NULL;
  dt_status s = dt_llama_config_get(ctx, "debugmodel", &cfg);
  if (s == DT_OK) s = dt_model_create(ctx, mesh, &cfg, DT_F32, SEED, &m);
  if (s == DT_OK && tp_dim >= 0) {
    char path[512];
    tu_plan_path("torchtitan-tp-sp.plan", path, sizeof path);
    plan = malloc(sizeof *plan);
    s = plan ? dt_plan_load(ctx, path, plan) : DT_ERR_NOMEM;
    if (s == DT_OK) s = dt_parallelize_module(ctx, m, tp_dim, plan->entries, plan->n_entries);
  }
  if (s == DT_OK) s = dt_model_materialize(ctx, m);
  TU_OK(ctx, s);
  for (int k = 0; s == DT_OK && k < tc->n_variants; k++) {
    const variant *v = &variants[tc->variant[k]];
    snprintf(label, sizeof label, "dp%d x tp%d %s", tc->dp, tc->tp, v->name);
    verdicts vd;
    s = run_variant(ctx, mesh, m, tc->dp, tc->tp, dp_dim, tp_dim, v, label, &vd);
    TU_OK(ctx, s);
    TU_CHECK(s != DT_OK || (vd.ledger == 0 && vd.values == 0), "%s: %d ledger and %d gradient "
             "mismatches", label, vd.ledger, vd.values);
  }
  if (s == DT_OK) { /* (c): a skipped bucket must be caught by both checks */
    variant planted = variants[0];
    planted.skip_first_bucket = true;
    snprintf(label, sizeof label, "dp%d x tp%d PLANTED skip bucket 0", tc->dp, tc->tp);
    verdicts vd;
    s = run_variant(ctx, mesh, m, tc->dp, tc->tp, dp_dim, tp_dim, &planted, label, &vd);
    TU_OK(ctx, s);
    TU_CHECK(s != DT_OK || (vd.ledger > 0 && vd.values > 0),
             "%s: the checks missed it (%d ledger, %d gradient mismatches)", label, vd.ledger,
             vd.values);
  }
  if (s == DT_OK && tc->tp == 1 && tc->dp == 2) s = bad_inputs(ctx, m);
  free(plan);
  dt_parallelize_release(ctx, m);
  dt_model_free(ctx, m);
  dt_mesh_free(mesh);
  return s;
}

/* ---- several dims: dp_replicate x cp, one all_reduce per bucket on the flattened group */

/* The reference gradients (module order; NULL for modules without a weight): the
 * same model on a 1-rank mesh, `batch` sequences, as f64. */
static dt_status reference_grads(dt_ctx *ctx, int batch, double **ref, int64_t *nref) {
  dt_comm *self = NULL;
  DT_CHECK(dt_comm_split(ctx->world, ctx->rank, 0, "self", &self));
  const int shape[1] = {1};
  const char *const nm[1] = {"dp_replicate"};
  dt_mesh *mesh = NULL;
  dt_llama_config cfg;
  dt_model *m = NULL;
  dt_status s = dt_mesh_create(ctx, self, 1, shape, nm, &mesh);
  if (s == DT_OK) s = dt_llama_config_get(ctx, "debugmodel", &cfg);
  if (s == DT_OK) s = dt_model_create(ctx, mesh, &cfg, DT_F32, SEED, &m);
  if (s == DT_OK) s = dt_model_materialize(ctx, m);
  dt_ledger_enable(ctx, false);
  if (s == DT_OK) s = grads(ctx, mesh, m, batch, 0u);
  for (int i = 0; s == DT_OK && i < m->n_mods; i++)
    if (m->mods[i].weight) s = sb_gather_f64(ctx, dt_var_grad(m->mods[i].weight), &ref[i], &nref[i]);
  dt_ledger_enable(ctx, true);
  dt_model_free(ctx, m);
  dt_mesh_free(mesh);
  dt_comm_destroy(self);
  return s;
}

/* One run on the [dp_replicate 2, cp 2] mesh: the batch (`batch` sequences)
 * Shard(0) on the dims of tok_dims, the reduce over both dims (mask 0b11), DDP's
 * default caps; planted: the first bucket's gradients relabelled Replicate on
 * both dims before the reduce (a reducer that skipped it). */
static dt_status mask_run(dt_ctx *ctx, dt_mesh *mesh, dt_model *m, int batch, unsigned tok_dims,
                          bool planted, double *const *ref, const int64_t *nref,
                          const char *label, verdicts *out) {
  memset(out, 0, sizeof *out);
  dt_ledger_enable(ctx, false);
  dt_status s = grads(ctx, mesh, m, batch, tok_dims);
  int64_t sizes[N_WEIGHTS], want[MAX_BUCKETS];
  const int nw = expected_buckets(sizes, grad_sizes(1, sizes), 4, DT_DDP_FIRST_BUCKET_BYTES,
                                  DT_DDP_BUCKET_CAP_BYTES, want);
  if (s == DT_OK && planted) {
    int64_t left = want[0];
    for (int i = m->n_mods - 1; i >= 0 && left > 0; i--) {
      if (!m->mods[i].weight) continue;
      dt_tensor *g = (dt_tensor *)dt_var_grad(m->mods[i].weight); /* the planted bug */
      left -= g->local.numel;
      g->pl[0] = g->pl[1] = dt_replicate();
    }
  }
  if (s == DT_OK) {
    dt_ledger_clear(ctx);
    dt_ledger_enable(ctx, true);
    s = dt_data_parallel_reduce_grads(ctx, m, 3u, NULL);
    dt_ledger_enable(ctx, false);
    TU_OK(ctx, s);
  }
  if (s == DT_OK) {
    out->ledger = check_ledger(ctx, want, nw, "dp_replicate_cp", 4, label, !planted);
    /* values: every reduced gradient, gathered, against the reference; Replicate
     * on both dims. Tolerance: sb_tolerance(f32, before an update), the bound
     * bench/harness/verdict.c derives for a reordered sum (here: the four ranks'
     * partial sums against the one-rank sum over the batch). */
    sb_cmp c;
    sb_cmp_init(&c);
    int n_cmp = 0;
    for (int i = 0; s == DT_OK && i < m->n_mods; i++) {
      if (!m->mods[i].weight) continue;
      const dt_tensor *g = dt_var_grad(m->mods[i].weight);
      if (!planted && (g->pl[0].kind != DT_PL_REPLICATE || g->pl[1].kind != DT_PL_REPLICATE)) {
        out->values++;
        fprintf(stderr, "  %s: %s: gradient not Replicate on both dims\n", label, m->mods[i].fqn);
      }
      double *v = NULL;
      int64_t n = 0;
      s = sb_gather_f64(ctx, g, &v, &n);
      if (s == DT_OK) sb_cmp_add(&c, m->mods[i].fqn, v, n, ref[i], nref[i],
                                 sb_tolerance(DT_F32, false));
      free(v);
      n_cmp++;
    }
    TU_CHECK(n_cmp == N_WEIGHTS, "%s: %d gradients compared, want %d", label, n_cmp, N_WEIGHTS);
    if (!sb_cmp_ok(&c)) out->values++;
    if (!sb_cmp_ok(&c) && !planted)
      fprintf(stderr, "  %s: rank %d: %s: relative error %.3g over %.1e\n", label, ctx->rank,
              c.worst, c.worst_rel, c.worst_tol);
    if (ctx->rank == 0)
      printf("  %-40s %d buckets on dp_replicate_cp; ledger mismatches %d; worst %s: rel err "
             "%.3g (tolerance %.1e)\n", label, nw, out->ledger, c.worst, c.worst_rel, c.worst_tol);
  }
  dt_ledger_enable(ctx, true);
  if (s == DT_OK) s = dt_model_end_step(ctx, m);
  dt_tape_zero_grad(m->tape);
  return s;
}

/* dp_replicate 2 x cp 2, the reduce over both:
 *   the batch (4) Shard(0) on both: every gradient Partial on both;
 *   the batch (2) Shard(0) on dp_replicate only: gradients Partial on dp_replicate
 *     and Replicate on cp, so the cp ranks of coordinate 1 must contribute zeros
 *     (else the sum is twice the reference's);
 *   PLANTED: the first bucket skipped: both checks must fail. */
static dt_status run_mask(dt_ctx *ctx) {
  const int shape[2] = {2, 2};
  const char *const nm[2] = {"dp_replicate", "cp"};
  dt_mesh *mesh = NULL;
  DT_CHECK(dt_mesh_create(ctx, ctx->world, 2, shape, nm, &mesh));
  dt_llama_config cfg;
  dt_model *m = NULL;
  dt_status s = dt_llama_config_get(ctx, "debugmodel", &cfg);
  if (s == DT_OK) s = dt_model_create(ctx, mesh, &cfg, DT_F32, SEED, &m);
  if (s == DT_OK) s = dt_model_materialize(ctx, m);
  TU_OK(ctx, s);
  /* the references of batch 4 and 2 */
  const int n_mods = m ? m->n_mods : 0;
  double **r4 = calloc((size_t)n_mods + 1, sizeof *r4), **r2 = calloc((size_t)n_mods + 1, sizeof *r2);
  int64_t *n4 = calloc((size_t)n_mods + 1, sizeof *n4), *n2 = calloc((size_t)n_mods + 1, sizeof *n2);
  if (s == DT_OK && !(r4 && r2 && n4 && n2)) s = DT_ERR_NOMEM;
  if (s == DT_OK) s = reference_grads(ctx, 4, r4, n4);
  if (s == DT_OK) s = reference_grads(ctx, 2, r2, n2);
  TU_OK(ctx, s);
  verdicts vd;
  if (s == DT_OK) {
    s = mask_run(ctx, mesh, m, 4, 3u, false, r4, n4, "dp_replicate2 x cp2, batch on both", &vd);
    TU_CHECK(s != DT_OK || (vd.ledger == 0 && vd.values == 0), "batch on both: %d ledger and %d "
             "gradient mismatches", vd.ledger, vd.values);
  }
  if (s == DT_OK) {
    s = mask_run(ctx, mesh, m, 2, 1u, false, r2, n2, "dp_replicate2 x cp2, batch on dp_replicate",
                 &vd);
    TU_CHECK(s != DT_OK || (vd.ledger == 0 && vd.values == 0), "batch on dp_replicate: %d ledger "
             "and %d gradient mismatches", vd.ledger, vd.values);
  }
  if (s == DT_OK) {
    s = mask_run(ctx, mesh, m, 4, 3u, true, r4, n4, "PLANTED dp_replicate2 x cp2 skip bucket 0",
                 &vd);
    TU_CHECK(s != DT_OK || (vd.ledger > 0 && vd.values > 0), "PLANTED skip bucket 0: the checks "
             "missed it (%d ledger, %d gradient mismatches)", vd.ledger, vd.values);
  }
  for (int i = 0; i < n_mods; i++) {
    if (r4) free(r4[i]);
    if (r2) free(r2[i]);
  }
  free(r4);
  free(r2);
  free(n4);
  free(n2);
  dt_model_free(ctx, m);
  dt_mesh_free(mesh);
  return s;
}

static dt_status run_rank(dt_ctx *ctx, void *arg) {
  const tcase *tc = arg;
  if (!tc) return run_mask(ctx);
  return run_case(ctx, tc);
}

/* The hand-worked bucket counts of the file comment, for expected_buckets itself. */
static void check_assignment(void) {
  int64_t sizes[N_WEIGHTS], out[MAX_BUCKETS];
  int n = grad_sizes(1, sizes);
  int64_t total = 0;
  for (int i = 0; i < n; i++) total += sizes[i];
  TU_CHECK(n == N_WEIGHTS && total == 6163712, "debugmodel: %d weights, %lld parameters", n,
           (long long)total);
  dt_llama_config cfg;
  TU_CHECK(dt_llama_config_get(NULL, "debugmodel", &cfg) == DT_OK &&
               dt_llama_nparams(&cfg) == total, "grad_sizes disagrees with the debugmodel config");
  int nb = expected_buckets(sizes, n, 4, 1 * MiB, 25 * MiB, out);
  TU_CHECK(nb == 2 && out[0] == 2048 * 256, "defaults: %d buckets, want 2 (output alone first)",
           nb);
  TU_CHECK(expected_buckets(sizes, n, 4, 100 * MiB, 100 * MiB, out) == 1, "100 MiB: want 1");
  nb = expected_buckets(sizes, n, 4, 1 * MiB, 1 * MiB, out);
  TU_CHECK(nb == 17 && out[1] == 256 + 2 * 196608, "1 MiB: %d buckets, want 17 (the second: "
           "norm, w3, w2)", nb);
  TU_CHECK(expected_buckets(sizes, n, 4, 0, 0, out) == 57, "cap 0: want 57");
  nb = expected_buckets(sizes, n, 4, 2 * MiB, 25 * MiB, out);
  TU_CHECK(nb == 2 && out[0] == 2048 * 256, "first 2 MiB: %d buckets, want 2 (output alone)", nb);
}

static void launch(int world, tcase *tc) {
  dt_launch_opts o;
  memset(&o, 0, sizeof o);
  o.backend = DT_BACKEND_THREADS;
  o.world = world;
  o.timeout_s = 120; /* a hang is a failure */
  o.device = DT_DEV_CPU;
  dt_launch_report rep;
  memset(&rep, 0, sizeof rep);
  double t0 = dt_now();
  dt_status s = dt_launch(&o, run_rank, tc, &rep);
  TU_CHECK(s == DT_OK, "dt_launch(threads, %d) -> %s: rank %d: %s", world, dt_status_str(s),
           rep.failed_rank, rep.failed_msg);
  if (tc) printf("test_ddp: dp %d x tp %d: %.2f s\n", tc->dp, tc->tp, dt_now() - t0);
  else printf("test_ddp: dp_replicate 2 x cp 2: %.2f s\n", dt_now() - t0);
  dt_launch_report_free(&rep);
}

int main(int argc, char **argv) {
  tu_opts o;
  tu_parse(argc, argv, &o);
  if (o.backend != DT_BACKEND_THREADS) {
    fprintf(stderr, "test_ddp: threads backend only\n");
    return SB_SKIP;
  }
  check_assignment();
  tcase c1 = {2, 1, 5, {0, 1, 2, 3, 4}}, c2 = {2, 2, 3, {0, 2, 3}}, c3 = {4, 1, 2, {0, 2}};
  launch(2, &c1);
  launch(4, &c2);
  launch(4, &c3);
  launch(4, NULL); /* dp_replicate 2 x cp 2 */
  return tu_finish("test_ddp");
}
