/* verify/test_ac.c: activation checkpointing (TorchTitan's activation_checkpoint
 * modes, lib/nn dt_ac_config, the tape's checkpointed regions) verified on the
 * training step (dt_trainer), threads backend, debugmodel cut to 4 layers and a
 * 256-token vocabulary, batch 2, seq 8, f64 and f32:
 *   1. bitwise: the loss, every local gradient shard after backward and every local
 *      weight shard after AdamW of a run with full AC, every 2nd block
 *      (selective:2) and the op-level policy (selective:op) equal, byte for byte,
 *      those of the same run without AC, on every rank, for 1 rank, TP + SP,
 *      FSDP, FSDP x TP, CP (FSDP over cp) and PP x TP. The oracle is the run
 *      without AC: recomputation must give the same bits, not only close ones.
 *   2. the recompute's collectives (ledger rows with phase "recompute") on TP + SP:
 *      derived from the TP plan, a block's forward under SequenceParallel has two
 *      all_gathers on tp (PrepareModuleInput of attention and feed_forward:
 *      Shard(1) -> Replicate) and two reduce_scatters (RowwiseParallel wo and w2:
 *      Partial -> Shard(1)); a checkpointed block recomputes all four in full
 *      mode, and in op mode only the two all_gathers (reduce_scatter is on
 *      _save_list). FSDP: the unit's all_gather before backward serves the
 *      recompute, so backward's all_gather count on the FSDP dim is the no-AC
 *      one and nothing of FSDP is recomputed. CP: a checkpointed attention's ring
 *      is recomputed in full mode (recompute rows on cp = forward rows on cp),
 *      not in op mode (SDPA is saved).
 *   3. memory on 1 rank, exact: what the step tape holds when backward begins
 *      (dt_tape_backward_start_bytes: what the forward kept for backward) without
 *      AC minus with it equals what the test derives from the shapes (below,
 *      derive_block); and the forward's peak (dt_tape_forward_peak_at) is lower with
 *      AC, by at least (L - 1) blocks' saving: without AC it holds every block's
 *      saved values, with AC only one block's values are alive at a time. (The
 *      step's peak is later, where this small model's gradients outweigh its
 *      activations, which backward frees as it goes.)
 *   4. the tape's region API on its own (check_tape_api: refusals, an analytic
 *      gradient through a recomputed value).
 *   5. it can fail: a recompute that leaves one call's output zero
 *      (dt_checkpoint_opts.fault_zero_call) differs from the no-AC bits on every
 *      rank of every config (f64).
 * Not here: the CLI and plan settings (verify/ac.sh), PyTorch's numbers.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor.h"
#include "testutil.h"

/* a small vocabulary keeps the test short: the blocks are what AC is about */
enum { B = 2, S = 8, N_LAYERS = 4, VOCAB = 256 };

typedef struct acase {
  const char *name, *plan; /* plan file under plans/; NULL: none (1 rank) */
  int deg[DT_PDIM_COUNT];  /* pp, dp_replicate, dp_shard, cp, tp */
} acase;

static const acase CASES[] = {
    {"1-rank", NULL, {1, 1, 1, 1, 1}},
    {"tp+sp", "torchtitan-tp-sp.plan", {1, 1, 1, 1, 2}},
    {"fsdp", "fsdp.plan", {1, 1, 2, 1, 1}},
    {"fsdp x tp", "fsdp-tp-sp.plan", {1, 1, 2, 1, 2}},
    {"cp", "fsdp-cp.plan", {1, 1, 1, 2, 1}},
    {"pp x tp", "pp-tp-sp.plan", {2, 1, 1, 1, 2}},
};
enum { N_CASES = sizeof CASES / sizeof CASES[0] };

/* The modes compared with none: full, every 2nd block, op-level. */
static const struct { const char *mode, *opt; } MODES[] = {
    {"full", NULL}, {"selective", "2"}, {"selective", "op"}};
enum { N_MODES = sizeof MODES / sizeof MODES[0] };

/* A growing byte buffer: one run's bits on one rank. */
typedef struct blob {
  unsigned char *p;
  size_t n, cap;
} blob;

static void put(blob *b, const void *x, size_t n) {
  if (b->n + n > b->cap) {
    size_t c = b->cap ? b->cap : 4096;
    while (c < b->n + n) c *= 2;
    unsigned char *q = realloc(b->p, c);
    if (!q) abort();
    b->p = q;
    b->cap = c;
  }
  memcpy(b->p + b->n, x, n);
  b->n += n;
}

/* One run's results on this rank. */
typedef struct result {
  blob bits;                    /* loss, local gradients, local weights after AdamW */
  int rec[DT_COLL_COUNT][2];    /* recompute rows: [op][0] on tp, [1] on cp */
  int fwd_cp;                   /* forward rows on cp */
  int bwd_fsdp_ag;              /* backward all_gathers on the FSDP dim */
  int rec_fsdp;                 /* recompute rows on the FSDP dim */
  size_t tape_bytes;            /* the step tape's values after backward */
  int64_t mem_act;              /* the step record's mem_activations */
  int64_t fb_peak;              /* the forward's peak (when backward began) */
} result;

typedef struct arg {
  const acase *c;
  const dt_plan *plan;
} arg;

/* The local shards of every weight's gradient (grads) or value into b. */
static void put_weights(blob *b, dt_model *m, bool grads) {
  for (int i = 0; i < m->n_mods; i++) {
    if (!m->mods[i].weight) continue;
    const dt_tensor *v = grads ? dt_var_grad(m->mods[i].weight) : dt_var_value(m->mods[i].weight);
    if (!v || !v->local.data) continue; /* another stage's, or no gradient */
    put(b, v->local.data, dt_array_bytes(&v->local));
  }
}

static void count_ledger(dt_ctx *ctx, result *r) {
  const dt_ledger *L = dt_ledger_of(ctx);
  for (size_t i = 0; i < L->n; i++) {
    const dt_ledger_row *w = &L->rows[i];
    const bool rec = !strcmp(w->phase, "recompute");
    const bool fsdp = !strcmp(w->group, "dp_shard") || !strcmp(w->group, "dp_shard_cp");
    if (rec && !strcmp(w->group, "tp")) r->rec[w->op][0]++;
    if (rec && !strcmp(w->group, "cp")) r->rec[w->op][1]++;
    if (rec && fsdp) r->rec_fsdp++;
    if (!strcmp(w->phase, "forward") && !strcmp(w->group, "cp")) r->fwd_cp++;
    if (!strcmp(w->phase, "backward") && fsdp && w->op == DT_COLL_ALL_GATHER) r->bwd_fsdp_ag++;
  }
}

/* One training step of the case with ac on this rank into r. */
static dt_status run(dt_ctx *ctx, const arg *a, dt_dtype dt, const dt_ac_config *ac, result *r) {
  memset(r, 0, sizeof *r);
  dt_llama_config cfg;
  DT_CHECK(dt_llama_config_get(ctx, "debugmodel", &cfg));
  cfg.n_layers = N_LAYERS;
  cfg.vocab = VOCAB;
  dt_parallel_dims dims;
  DT_CHECK(dt_parallel_dims_init(ctx, a->c->deg, ctx->world_size, &dims));
  dt_parallel_plan *pp = NULL;
  dt_status s = DT_OK;
  if (a->plan) {
    pp = malloc(sizeof *pp);
    s = pp ? dt_parallel_plan_resolve(ctx, a->plan, a->c->deg, &cfg, B, S, pp) : DT_ERR_NOMEM;
  }
  dt_trainer_opts o;
  memset(&o, 0, sizeof o);
  const dt_adamw adamw = DT_ADAMW_DEFAULT;
  o.dtype = dt;
  o.seed = 11;
  o.batch = B;
  o.seq = S;
  o.adamw = adamw;
  o.ac = *ac;
  dt_trainer *t = NULL;
  if (s == DT_OK) s = dt_trainer_create(ctx, &cfg, &dims, pp, &o, &t);
  int64_t ids[2 * B * S];
  for (int i = 0; i < 2 * B * S; i++) ids[i] = (int64_t)((i * 7919 + 13) % cfg.vocab);
  dt_var *loss = NULL;
  dt_trainer_step st;
  if (s == DT_OK) dt_ledger_clear(ctx);
  if (s == DT_OK) s = dt_trainer_forward_backward(ctx, t, 0, ids, ids + B * S, true, &loss, &st);
  double lv = 0;
  if (s == DT_OK) s = dt_trainer_loss_value(ctx, t, loss, &lv);
  if (s == DT_OK) {
    dt_model *m = dt_trainer_model(t);
    count_ledger(ctx, r);
    r->tape_bytes = dt_tape_backward_start_bytes(m->step_tape);
    dt_mem_peak_at fp;
    dt_tape_forward_peak_at(m->step_tape, false, &fp); /* host: a CPU run */
    r->fb_peak = (int64_t)fp.bytes;
    put(&r->bits, &lv, sizeof lv);
    put_weights(&r->bits, m, true);
    s = dt_trainer_optimizer_step(ctx, t, false, &st);
    if (s == DT_OK) put_weights(&r->bits, m, false);
    r->mem_act = st.mem_activations;
  }
  dt_trainer_free(ctx, t);
  free(pp);
  return s;
}

/* What a block holds for backward at 1 rank, in elements, from the shapes (every
 * op of lib/ops writes a new array; views copy): none: attention_norm, wq, view q,
 * rope q, sdpa, reshape, wo, the residual add, ffn_norm, w2, the second add (11 x
 * b s dim), wk, wv, view k, view v, rope k (5 x b s kvdim), w1, w3, swiglu (3 x b s
 * hidden); full: the block's output (the next block's input) only; op: wq (mm 1),
 * wv (mm 3), sdpa, w1 (mm 5), w2 (mm 7) and the output. */
static int64_t derive_block(const dt_llama_config *c, const char *mode, const char *opt) {
  const int64_t bsd = (int64_t)B * S * c->dim, hd = c->dim / c->n_heads;
  const int64_t bskv = (int64_t)B * S * c->n_kv_heads * hd;
  const int64_t bsh = (int64_t)B * S * dt_llama_ffn_hidden(c);
  /* none: what a block's backward reads (the values freed at the block's end are
   * those no backward reads): attention_norm's output (read by wq, wk, wv), the
   * roped q and k and the viewed v (sdpa), sdpa's output and its reshape (wo), the
   * residual h1 (ffn_norm), ffn_norm's output (w1, w3), w1's and w3's outputs
   * (swiglu) and swiglu's (w2), and the block's output; not q, k, v before their
   * views, the views before rope, wo's and w2's outputs (add reads no value) */
  if (!strcmp(mode, "none")) return 7 * bsd + 2 * bskv + 3 * bsh;
  if (!strcmp(mode, "full") || strcmp(opt, "op")) return bsd;
  return 4 * bsd + bskv + bsh;
}

/* The tape's region API on 1 rank, x [4] of ones: y = x + x and z = y + y in a full
 * region keeping z; what the tape holds after it is x and z (y freed: 2 x 32 bytes),
 * a call reading y is refused, regions do not nest, and backward recomputes y:
 * dz/dx = 4 everywhere (analytic). */
static void check_tape_api(dt_ctx *ctx) {
  const int shape[1] = {1};
  const char *names[1] = {"tp"};
  dt_mesh *mesh = NULL;
  dt_tape *t = NULL;
  TU_OK(ctx, dt_mesh_create(ctx, ctx->world, 1, shape, names, &mesh));
  TU_OK(ctx, dt_tape_create(ctx, NULL, &t));
  if (!mesh || !t) return;
  const int64_t gs[1] = {4};
  const dt_placement r[1] = {dt_replicate()};
  dt_tensor xv;
  TU_OK(ctx, dt_tensor_rand(ctx, mesh, 1, gs, DT_F64, r, 0, 0, DT_RNG_UNIFORM, 1.0, 0.0, &xv));
  dt_var *x = dt_var_leaf(t, &xv, true), *y = NULL, *z = NULL, *w = NULL;
  TU_OK(ctx, dt_tape_checkpoint_begin(t, NULL));
  TU_CHECK(dt_tape_checkpoint_begin(t, NULL) == DT_ERR_INVALID, "a nested region was accepted");
  dt_var *in[2] = {x, x};
  TU_OK(ctx, dt_ad_op(t, &dt_op_add, NULL, in, &y));
  in[0] = in[1] = y;
  TU_OK(ctx, dt_ad_op(t, &dt_op_add, NULL, in, &z));
  TU_OK(ctx, dt_tape_checkpoint_end(t, 1, &z));
  TU_CHECK(dt_tape_checkpoint_end(t, 0, NULL) == DT_ERR_INVALID, "end without a region accepted");
  TU_CHECK(dt_tape_value_bytes(t) == 2 * 4 * sizeof(double), "the tape holds %zu bytes, want 64",
           dt_tape_value_bytes(t));
  in[0] = y;
  in[1] = x;
  TU_CHECK(dt_ad_op(t, &dt_op_add, NULL, in, &w) == DT_ERR_INVALID,
           "a call reading a freed value was accepted");
  TU_OK(ctx, dt_backward(t, z, NULL));
  const dt_tensor *g = dt_var_grad(x);
  bool four = g && g->local.numel == 4;
  for (int i = 0; four && i < 4; i++) four = ((const double *)g->local.data)[i] == 4.0;
  TU_CHECK(four, "dz/dx after the recompute is not 4 everywhere");
  dt_tape_free(t);
  dt_mesh_free(mesh);
}

static bool same(const blob *a, const blob *b) { return a->n == b->n && !memcmp(a->p, b->p, a->n); }

static dt_status body(dt_ctx *ctx, void *varg) {
  const arg *a = varg;
  const char *cn = a->c->name;
  const bool tp = a->c->deg[DT_PDIM_TP] > 1, cp = a->c->deg[DT_PDIM_CP] > 1;
  const bool fsdp = a->c->deg[DT_PDIM_DP_SHARD] * a->c->deg[DT_PDIM_CP] > 1 && a->c->plan &&
                    strstr(a->c->plan, "fsdp");
  const bool pp = a->c->deg[DT_PDIM_PP] > 1;
  const dt_dtype dts[2] = {DT_F64, DT_F32};
  dt_llama_config cfg;
  DT_CHECK(dt_llama_config_get(ctx, "debugmodel", &cfg));
  cfg.n_layers = N_LAYERS;
  cfg.vocab = VOCAB;
  if (!a->c->plan) check_tape_api(ctx);
  for (int di = 0; di < 2; di++) {
    const dt_dtype dt = dts[di];
    const char *dn = dt == DT_F64 ? "f64" : "f32";
    dt_ac_config none = {0};
    result ref;
    DT_CHECK(run(ctx, a, dt, &none, &ref));
    TU_CHECK(ref.rec_fsdp + ref.rec[DT_COLL_ALL_GATHER][0] == 0, "%s %s: recompute rows without AC",
             cn, dn);
    for (int k = 0; k < N_MODES; k++) {
      dt_ac_config ac;
      DT_CHECK(dt_ac_parse(ctx, MODES[k].mode, MODES[k].opt, &ac));
      char acs[32];
      dt_ac_str(&ac, acs, sizeof acs);
      result r;
      dt_status s = run(ctx, a, dt, &ac, &r);
      TU_CHECK(s == DT_OK, "%s %s %s: rank %d: %s", cn, dn, acs, ctx->rank, dt_last_error(ctx));
      if (s != DT_OK) return s;
      TU_CHECK(same(&r.bits, &ref.bits), "%s %s %s: rank %d: loss, gradients or weights differ "
               "from the run without AC (%zu / %zu bytes)", cn, dn, acs, ctx->rank, r.bits.n,
               ref.bits.n);
      /* the blocks checkpointed: every one, or 2 of 4 (layers 1 and 3) for selective:2;
       * with pp, this rank's stage's share (TorchTitan's split of 4 layers + 2 over 2
       * stages: layers 0-1 and 2-3, one checkpointed block each for selective:2) */
      const int held = pp ? N_LAYERS / 2 : N_LAYERS;
      const int nck = ac.mode == DT_AC_SELECTIVE && ac.every == 2 ? held / 2 : held;
      const int mb = pp ? B : 1; /* pp: microbatch size 1, so B microbatches per stage */
      if (tp) {
        const bool op = ac.mode == DT_AC_SELECTIVE && ac.every == 0;
        const int ag = r.rec[DT_COLL_ALL_GATHER][0], rs = r.rec[DT_COLL_REDUCE_SCATTER][0];
        TU_CHECK(ag == 2 * nck * mb && rs == (op ? 0 : 2 * nck * mb),
                 "%s %s %s: rank %d: recompute on tp: %d all_gather, %d reduce_scatter; derived "
                 "%d, %d", cn, dn, acs, ctx->rank, ag, rs, 2 * nck * mb, op ? 0 : 2 * nck * mb);
      }
      if (fsdp)
        TU_CHECK(r.rec_fsdp == 0 && r.bwd_fsdp_ag == ref.bwd_fsdp_ag,
                 "%s %s %s: rank %d: FSDP recompute rows %d, backward all_gathers %d (no AC %d)",
                 cn, dn, acs, ctx->rank, r.rec_fsdp, r.bwd_fsdp_ag, ref.bwd_fsdp_ag);
      if (cp) {
        int rc = 0;
        for (int op = 0; op < DT_COLL_COUNT; op++) rc += r.rec[op][1];
        const bool op = ac.mode == DT_AC_SELECTIVE && ac.every == 0;
        /* the forward's ring rows are per attention, the same for each block */
        const int want = op ? 0 : ref.fwd_cp * nck / N_LAYERS;
        TU_CHECK(ref.fwd_cp > 0 && rc == want,
                 "%s %s %s: rank %d: recompute rows on cp %d, want %d (forward %d)", cn, dn, acs,
                 ctx->rank, rc, want, ref.fwd_cp);
      }
      if (!a->c->plan) { /* memory, 1 rank: exact from the shapes */
        const size_t es = dt_dtype_size(dt);
        const int64_t per = derive_block(&cfg, "none", NULL) -
                            derive_block(&cfg, MODES[k].mode, MODES[k].opt);
        const int64_t want = per * nck * (int64_t)es;
        const int64_t got = (int64_t)ref.tape_bytes - (int64_t)r.tape_bytes;
        TU_CHECK(got == want,
                 "%s %s %s: the tape holds %lld bytes less than without AC; derived %lld", cn, dn,
                 acs, (long long)got, (long long)want);
        /* less 1 KiB: the tape's own record of its regions (a counted host array of
         * 16 entries, 384 bytes measured) is in the AC run's peak only */
        TU_CHECK(ref.fb_peak - r.fb_peak >= per * (nck - 1) * (int64_t)es - 1024,
                 "%s %s %s: the forward's peak %lld with AC, %lld without: saving under "
                 "(L - 1) blocks' %lld", cn, dn, acs, (long long)r.fb_peak, (long long)ref.fb_peak,
                 (long long)(per * (nck - 1) * (int64_t)es));
        if (di == 0)
          printf("  %s %s: tape %zu bytes (none %zu), mem_activations %lld (none %lld)\n", cn, acs,
                 r.tape_bytes, ref.tape_bytes, (long long)r.mem_act, (long long)ref.mem_act);
      }
      free(r.bits.p);
    }
    /* it can fail: one recomputed call left zero (the 3rd: wk's output in a block) */
    dt_ac_config bad = {DT_AC_FULL, 0, 3};
    if (dt != DT_F64) {
      free(ref.bits.p);
      continue;
    }
    result r;
    dt_status s = run(ctx, a, dt, &bad, &r);
    TU_CHECK(s == DT_OK && !same(&r.bits, &ref.bits),
             "%s %s: planted bug (a recomputed output left zero): rank %d: %s", cn, dn, ctx->rank,
             s == DT_OK ? "the bits still equal: the check cannot fail" : dt_last_error(ctx));
    free(r.bits.p);
    free(ref.bits.p);
  }
  return DT_OK;
}

/* Bad input to dt_ac_parse: an unknown mode, N < 1, not a number. */
static void check_parse(void) {
  dt_ctx ctx;
  dt_ctx_init(&ctx, 0, 1);
  dt_ac_config ac;
  TU_CHECK(dt_ac_parse(&ctx, "partial", NULL, &ac) == DT_ERR_INVALID, "unknown mode accepted");
  TU_CHECK(dt_ac_parse(&ctx, "selective", "0", &ac) == DT_ERR_INVALID, "N = 0 accepted");
  TU_CHECK(dt_ac_parse(&ctx, "selective", "-2", &ac) == DT_ERR_INVALID, "N = -2 accepted");
  TU_CHECK(dt_ac_parse(&ctx, "selective", "2x", &ac) == DT_ERR_INVALID, "'2x' accepted");
  TU_CHECK(dt_ac_parse(&ctx, "selective", NULL, &ac) == DT_OK && ac.every == 2,
           "selective's default option is not TorchTitan's 2");
  TU_CHECK(dt_ac_parse(&ctx, "selective", "op", &ac) == DT_OK && ac.every == 0, "op refused");
  /* every N-th block counted from 1 (ptd_checkpoint_wrapper._count % N == 0) */
  ac = (dt_ac_config){DT_AC_SELECTIVE, 3, 0};
  TU_CHECK(!dt_ac_block(&ac, 0) && !dt_ac_block(&ac, 1) && dt_ac_block(&ac, 2) &&
               dt_ac_block(&ac, 5),
           "selective:3 checkpoints the wrong blocks");
  dt_ctx_release(&ctx);
}

int main(int argc, char **argv) {
  tu_opts o;
  tu_parse(argc, argv, &o);
  if (o.backend != DT_BACKEND_THREADS) {
    printf("SKIP: test_ac runs with the threads backend only\n");
    return SB_SKIP;
  }
  dt_device_cpu_blas_threads(1);
  check_parse();
  for (int i = 0; i < N_CASES; i++) {
    const acase *c = &CASES[i];
    int world = 1;
    for (int d = 0; d < DT_PDIM_COUNT; d++) world *= c->deg[d];
    dt_plan *plan = NULL;
    if (c->plan) {
      char p[512];
      tu_plan_path(c->plan, p, sizeof p);
      plan = malloc(sizeof *plan);
      dt_status s = plan ? dt_plan_load(NULL, p, plan) : DT_ERR_NOMEM;
      TU_CHECK(s == DT_OK, "%s: %s", p, dt_status_str(s));
      if (s != DT_OK) continue;
    }
    printf("%s (world %d)\n", c->name, world);
    arg a = {c, plan};
    dt_launch_opts lo = {.backend = DT_BACKEND_THREADS, .world = world, .timeout_s = 300};
    dt_launch_report rep;
    dt_status s = dt_launch(&lo, body, &a, &rep);
    if (s != DT_OK)
      tu_fail(__FILE__, __LINE__, "%s: launch: rank %d: %s", c->name, rep.failed_rank,
              rep.failed_msg);
    dt_launch_report_free(&rep);
    free(plan);
  }
  return tu_finish("test_ac");
}
