/* verify/test_pp.c: the pipeline runtime (lib/parallel/pp.c, dt_pipeline_step) on
 * the threads backend, against the unsharded model computed by every rank on a
 * mesh of its own (the oracle: the same model, forward + loss + backward on the
 * whole batch; no pipeline).
 *
 * For GPipe, 1F1B and Interleaved 1F1B (v = 2) on pp = 2, 3, 4 ranks, microbatches
 * m from 1 (GPipe) or pp (1F1B) to 2 pp, a tiny f64 Llama (6 layers; TorchTitan's
 * split, so pp = 4 puts 1 or 2 layers on a stage, and pp = 4, v = 2 gives stages
 * with no block at all): every rank checks
 *   - the gradients of the weights of its own stages: the sum over microbatches of
 *     each microbatch's loss / m gradients equals the whole batch's mean loss
 *     gradient (equal microbatches), normwise within TOL (f64: the sums run in
 *     another order, measured <= 1e-14);
 *   - the loss on the last stage's rank: the sum of the scaled microbatch losses;
 *   - the weights of its stages after one AdamW step;
 *   - the ledger: sends and recvs per rank as the schedule's analytic count
 *     (2 (v pp - 1) m transfers per step in all: rank r's share derived here from
 *     the placement), each of one microbatch's activation [b/m, s, dim];
 *   - the memory a rank holds: after dt_pipeline_release_foreign, its parameter
 *     bytes (dt_model_state_bytes) are its stages' weights, derived here from the
 *     config's shapes (Llama's layout: wq, wo dim x dim; wk, wv kv_heads x head_dim
 *     rows; w1, w3, w2 with TorchTitan's FeedForward hidden size computed here; two
 *     norms per block; the embedding and the output vocab x dim, the final norm dim),
 *     and after AdamW its optimizer bytes twice that;
 *   - dt_pipeline_share of the values then refills the released weights with their
 *     owners' copies: every weight on every rank equals the reference after AdamW,
 *     the parameter bytes are the whole model's; a second release brings them back;
 *   - one case proving the check can fail: the step run with the targets of
 *     another microbatch order (the loss changes, the gradients differ).
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor.h"
#include "testutil.h"

enum { TB = 24, TS = 8 }; /* 24: microbatches of 1, 2, 3, 4, 6 and 8 equal rows */
static const uint64_t SEED = 4321;
/* f64: the microbatches sum the same products in another order. 2^10 u, the
 * harness's bound for a reordered sum before an update (bench/harness/verdict.c
 * sb_tolerance); measured <= 1.0e-15 on the gradients and 9e-15 on the weights after
 * AdamW (its sqrt(v) division amplifies the gradients' rounding), so one bound fits both */
static const double TOL = 0x1p-43;

static dt_llama_config tiny_config(void) {
  dt_llama_config c;
  memset(&c, 0, sizeof c);
  snprintf(c.name, sizeof c.name, "tiny");
  c.dim = 32;
  c.n_layers = 6;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.vocab = 64;
  c.multiple_of = 16;
  c.norm_eps = 1e-5;
  c.rope_theta = 500000;
  c.rope_scaling = true;
  c.depth_init = true;
  return c;
}

/* ids of rows [r0, r0 + nr) of the batch (which 0: tokens, 1: targets) */
static void ids(int which, int r0, int nr, int vocab, int64_t *out) {
  for (int i = 0; i < nr * TS; i++) { /* a mixed index (Knuth's MMIX LCG constants): no period */
    uint64_t x = (uint64_t)(r0 * TS + i + 1) * 6364136223846793005u + 1442695040888963407u * (uint64_t)(which + 1);
    x ^= x >> 33;
    out[i] = (int64_t)(x % (uint64_t)vocab);
  }
}

static dt_status ids_tensor(dt_ctx *ctx, dt_mesh *mesh, int which, int r0, int nr, int vocab,
                            dt_tensor *out) {
  int64_t *v = malloc(sizeof *v * (size_t)(nr * TS));
  if (!v) return DT_ERR_NOMEM;
  ids(which, r0, nr, vocab, v);
  const int64_t sh[2] = {nr, TS};
  dt_array a;
  dt_status s = dt_array_wrap(ctx, DT_DEV_CPU, DT_I64, 2, sh, v, &a);
  dt_placement pl[DT_MAX_MESH_DIMS];
  memset(pl, 0, sizeof pl); /* Replicate */
  for (int d = 0; d < DT_MAX_MESH_DIMS; d++) pl[d] = dt_replicate();
  if (s == DT_OK) s = dt_tensor_distribute(ctx, mesh, &a, pl, out);
  free(v);
  return s;
}

/* The reference on a solo mesh: loss, every weight's gradient, and the weights after one
 * AdamW step (indexed by module). */
typedef struct ref {
  double loss;
  double **grad, **after;
  int64_t *n;
  int n_mods;
} ref;

static void ref_free(ref *r) {
  for (int i = 0; r->grad && i < r->n_mods; i++) {
    free(r->grad[i]);
    free(r->after[i]);
  }
  free(r->grad);
  free(r->after);
  free(r->n);
}

static dt_status reference(dt_ctx *ctx, dt_mesh *solo, ref *out) {
  dt_llama_config cfg = tiny_config();
  dt_model *m = NULL;
  DT_CHECK(dt_model_create(ctx, solo, &cfg, DT_F64, SEED, &m));
  dt_status s = dt_model_materialize(ctx, m);
  dt_tensor tok = {0}, tgt = {0};
  if (s == DT_OK) s = ids_tensor(ctx, solo, 0, 0, TB, cfg.vocab, &tok);
  if (s == DT_OK) s = ids_tensor(ctx, solo, 1, 0, TB, cfg.vocab, &tgt);
  dt_var *lg = NULL, *loss = NULL;
  if (s == DT_OK) s = dt_model_forward(ctx, m, &tok, &lg);
  if (s == DT_OK) s = dt_model_loss(ctx, m, lg, &tgt, &loss);
  if (s == DT_OK) s = dt_model_backward(ctx, m, loss);
  out->n_mods = m->n_mods;
  out->grad = calloc((size_t)m->n_mods, sizeof *out->grad);
  out->after = calloc((size_t)m->n_mods, sizeof *out->after);
  out->n = calloc((size_t)m->n_mods, sizeof *out->n);
  if (s == DT_OK) {
    int64_t one;
    double *lv = tu_full_f64(ctx, dt_var_value(loss), &one);
    out->loss = lv ? lv[0] : NAN;
    free(lv);
    for (int i = 0; i < m->n_mods; i++)
      if (m->mods[i].weight) out->grad[i] = tu_full_f64(ctx, dt_var_grad(m->mods[i].weight), &out->n[i]);
    const dt_adamw opt = DT_ADAMW_DEFAULT;
    s = dt_model_end_step(ctx, m);
    if (s == DT_OK) s = dt_model_adamw_step(ctx, m, &opt);
    for (int i = 0; s == DT_OK && i < m->n_mods; i++)
      if (m->mods[i].weight) out->after[i] = tu_full_f64(ctx, dt_var_value(m->mods[i].weight), &out->n[i]);
  }
  dt_tensor_free(ctx, &tok);
  dt_tensor_free(ctx, &tgt);
  dt_model_free(ctx, m);
  return s;
}

/* Whether module i belongs to stage st (6 layers, MODS_PER_LAYER = 12 modules per block). */
static bool in_stage(const dt_model *m, int i, const dt_pp_stage *st) {
  const int per = (m->n_mods - 4) / m->cfg.n_layers;
  if (i == 1) return st->embedding;
  if (i >= m->n_mods - 2) return st->head;
  const int l = (i - 2) / per;
  return l >= st->first_layer && l < st->first_layer + st->n_layers;
}

/* Elements of stage st's weights, from the config (TorchTitan's Llama 3: model.py
 * Attention, FeedForward, TransformerBlock; the hidden size as FeedForward.__init__). */
static int64_t stage_elems(const dt_llama_config *c, const dt_pp_stage *st) {
  const int64_t d = c->dim, hd = c->dim / c->n_heads, v = c->vocab;
  int64_t hidden = 2 * (4 * d) / 3; /* no ffn_dim_multiplier in tiny_config */
  hidden = c->multiple_of * ((hidden + c->multiple_of - 1) / c->multiple_of);
  const int64_t block = 2 * d * d + 2 * (c->n_kv_heads * hd) * d + 3 * hidden * d + 2 * d;
  return (st->embedding ? v * d : 0) + st->n_layers * block + (st->head ? d + v * d : 0);
}

typedef struct pcase {
  dt_pp_schedule_kind kind;
  int v, m;
  bool wrong; /* targets rotated by one microbatch: must mismatch */
} pcase;

static void run_case(dt_ctx *ctx, dt_mesh *mesh, const ref *R, const pcase *pc) {
  const int pp = dt_mesh_size(mesh, 0), r = dt_mesh_coord(mesh, 0), M = pc->m;
  char what[96];
  snprintf(what, sizeof what, "%s pp %d v %d m %d%s", dt_pp_schedule_kind_str(pc->kind), pp, pc->v,
           M, pc->wrong ? " (wrong targets)" : "");
  dt_llama_config cfg = tiny_config();
  dt_pp_layout *L = calloc(1, sizeof *L);
  dt_pp_schedule *S = calloc(1, sizeof *S);
  dt_model *m = NULL;
  dt_tensor tok[TB], tgt[TB];
  memset(tok, 0, sizeof tok);
  memset(tgt, 0, sizeof tgt);
  dt_status s = L && S ? DT_OK : DT_ERR_NOMEM;
  if (s == DT_OK) s = dt_pp_split(ctx, cfg.n_layers, pp * pc->v, 1, 1, L);
  if (s == DT_OK) s = dt_pp_schedule_generate(ctx, pc->kind, pp, pc->v, M, S);
  if (s == DT_OK) s = dt_pp_schedule_lower(ctx, S);
  if (s == DT_OK) s = dt_model_create(ctx, mesh, &cfg, DT_F64, SEED, &m);
  if (s == DT_OK) s = dt_model_materialize(ctx, m);
  /* this rank keeps its stages' weights only (the runtime reads no other) */
  if (s == DT_OK) s = dt_pipeline_release_foreign(ctx, m, 0, L);
  int64_t mine_bytes = 0, all_bytes = 0; /* this rank's stages' weights, the model's */
  for (int st = 0; s == DT_OK && st < L->n_stages; st++) {
    const int64_t b = stage_elems(&cfg, &L->stages[st]) * (int64_t)sizeof(double);
    all_bytes += b;
    if (dt_pp_stage_rank(st, pp) == r) mine_bytes += b;
  }
  dt_model_mem mem;
  dt_model_state_bytes(m, &mem);
  TU_CHECK(s != DT_OK || mem.params == mine_bytes,
           "%s, rank %d: %lld parameter bytes held after the release, want its stages' %lld", what,
           r, (long long)mem.params, (long long)mine_bytes);
  for (int k = 0; s == DT_OK && k < M; k++) {
    s = ids_tensor(ctx, mesh, 0, k * TB / M, TB / M, cfg.vocab, &tok[k]);
    const int kt = pc->wrong ? (k + 1) % M : k;
    if (s == DT_OK) s = ids_tensor(ctx, mesh, 1, kt * TB / M, TB / M, cfg.vocab, &tgt[k]);
  }
  TU_CHECK(s == DT_OK, "%s: setup: %s", what, dt_last_error(ctx));
  double loss = 0;
  dt_ledger_clear(ctx);
  if (s == DT_OK) s = dt_pipeline_step(ctx, m, 0, L, S, tok, tgt, &loss, NULL, 0, NULL);
  TU_CHECK(s == DT_OK, "%s, rank %d: step: %s", what, r, dt_last_error(ctx));
  if (s == DT_OK) {
    /* the ledger: this rank's sends and recvs, from the placement */
    int sends = 0, recvs = 0, want_s = 0, want_r = 0;
    for (size_t i = 0; i < dt_ledger_of(ctx)->n; i++) {
      const dt_ledger_row *row = &dt_ledger_of(ctx)->rows[i];
      if (row->op == DT_COLL_SEND) sends++;
      if (row->op == DT_COLL_RECV) recvs++;
      if ((row->op == DT_COLL_SEND || row->op == DT_COLL_RECV) &&
          row->elems != (uint64_t)(TB / M * TS * cfg.dim))
        TU_CHECK(false, "%s, rank %d: a transfer of %llu elements, want %d", what, r,
                 (unsigned long long)row->elems, TB / M * TS * cfg.dim);
    }
    for (int st = 0; st < pp * pc->v; st++) {
      if (dt_pp_stage_rank(st, pp) != r) continue;
      if (st + 1 < pp * pc->v) want_s += M, want_r += M; /* activation out, its gradient in */
      if (st > 0) want_r += M, want_s += M;              /* activation in, its gradient out */
    }
    TU_CHECK(sends == want_s && recvs == want_r, "%s, rank %d: %d sends, %d recvs; want %d, %d",
             what, r, sends, recvs, want_s, want_r);
    /* gradients and the loss */
    double worst = 0;
    const dt_pp_stage *last = &L->stages[L->n_stages - 1];
    bool holds_last = dt_pp_stage_rank(L->n_stages - 1, pp) == r;
    (void)last;
    for (int i = 0; i < m->n_mods; i++) {
      if (!m->mods[i].weight) continue;
      bool mine = false;
      for (int st = 0; st < L->n_stages; st++)
        if (dt_pp_stage_rank(st, pp) == r && in_stage(m, i, &L->stages[st])) mine = true;
      const dt_tensor *g = dt_var_grad(m->mods[i].weight);
      if (!mine) {
        TU_CHECK(!g, "%s, rank %d: %s has a gradient but is not on this rank", what, r, m->mods[i].fqn);
        continue;
      }
      int64_t n = 0;
      double *gv = tu_full_f64(ctx, g, &n);
      TU_CHECK(gv && n == R->n[i], "%s, rank %d: %s: no gradient", what, r, m->mods[i].fqn);
      if (gv && n == R->n[i]) worst = fmax(worst, tu_normwise(gv, R->grad[i], n));
      free(gv);
    }
    if (holds_last) worst = fmax(worst, fabs(loss - R->loss) / fabs(R->loss));
    if (pc->wrong) {
      TU_CHECK(worst > 1e-3, "%s, rank %d: the wrong targets went unnoticed (%.3g)", what, r, worst);
    } else {
      TU_CHECK(worst <= TOL, "%s, rank %d: gradients / loss differ by %.3g (tolerance %.0e)", what, r,
               worst, TOL);
      /* one AdamW step on this rank's stages */
      const dt_adamw opt = DT_ADAMW_DEFAULT;
      TU_OK(ctx, dt_model_end_step(ctx, m));
      TU_OK(ctx, dt_model_adamw_step(ctx, m, &opt));
      double wa = 0;
      for (int i = 0; i < m->n_mods; i++) {
        if (!m->mods[i].weight || !R->after[i]) continue;
        bool mine = false;
        for (int st = 0; st < L->n_stages; st++)
          if (dt_pp_stage_rank(st, pp) == r && in_stage(m, i, &L->stages[st])) mine = true;
        if (!mine) continue;
        int64_t n = 0;
        double *wv = tu_full_f64(ctx, dt_var_value(m->mods[i].weight), &n);
        if (wv && n == R->n[i]) wa = fmax(wa, tu_normwise(wv, R->after[i], n));
        free(wv);
      }
      TU_CHECK(wa <= TOL, "%s, rank %d: weights after AdamW differ by %.3g", what, r, wa);
      dt_model_state_bytes(m, &mem);
      TU_CHECK(mem.params == mine_bytes && mem.optimizer == 2 * mine_bytes,
               "%s, rank %d: after AdamW %lld parameter, %lld optimizer bytes; want %lld, %lld",
               what, r, (long long)mem.params, (long long)mem.optimizer, (long long)mine_bytes,
               2 * (long long)mine_bytes);
      /* the owners' values into the released weights: every weight as the reference's */
      TU_OK(ctx, dt_pipeline_share(ctx, m, 0, L, false));
      double ws = 0;
      int n_cmp = 0;
      for (int i = 0; i < m->n_mods; i++) {
        if (!m->mods[i].weight) continue;
        int64_t n = 0;
        double *wv = tu_full_f64(ctx, dt_var_value(m->mods[i].weight), &n);
        TU_CHECK(wv && R->after[i] && n == R->n[i], "%s, rank %d: %s: no value after the share",
                 what, r, m->mods[i].fqn);
        if (wv && R->after[i] && n == R->n[i]) ws = fmax(ws, tu_normwise(wv, R->after[i], n)), n_cmp++;
        free(wv);
      }
      TU_CHECK(ws <= TOL && n_cmp > 0, "%s, rank %d: shared weights differ by %.3g (%d compared)",
               what, r, ws, n_cmp);
      dt_model_state_bytes(m, &mem);
      TU_CHECK(mem.params == all_bytes, "%s, rank %d: %lld parameter bytes after the share, want "
               "the model's %lld", what, r, (long long)mem.params, (long long)all_bytes);
      TU_OK(ctx, dt_pipeline_release_foreign(ctx, m, 0, L));
      TU_OK(ctx, dt_pipeline_release_foreign(ctx, m, 0, L)); /* idempotent */
      dt_model_state_bytes(m, &mem);
      TU_CHECK(mem.params == mine_bytes, "%s, rank %d: %lld parameter bytes after the second "
               "release, want %lld", what, r, (long long)mem.params, (long long)mine_bytes);
      if (r == pp - 1 && !pc->wrong)
        printf("  %-40s grads/loss %.2e, weights %.2e\n", what, worst, wa);
    }
  }
  for (int k = 0; k < M; k++) {
    dt_tensor_free(ctx, &tok[k]);
    dt_tensor_free(ctx, &tgt[k]);
  }
  if (S) dt_pp_schedule_free(ctx, S);
  free(S);
  free(L);
  dt_model_free(ctx, m);
}

static dt_status body(dt_ctx *ctx, void *arg) {
  (void)arg;
  const int pp = ctx->world_size;
  dt_comm *one = NULL;
  dt_mesh *mesh = NULL, *solo = NULL;
  const char *names[1] = {"pp"}, *sn[1] = {"solo"};
  const int shape[1] = {pp}, sshape[1] = {1};
  dt_status s = dt_mesh_create(ctx, ctx->world, 1, shape, names, &mesh);
  if (s == DT_OK) s = dt_comm_split(ctx->world, ctx->rank, 0, "solo", &one);
  if (s == DT_OK) s = dt_mesh_create(ctx, one, 1, sshape, sn, &solo);
  ref R;
  memset(&R, 0, sizeof R);
  dt_ledger_enable(ctx, false);
  if (s == DT_OK) s = reference(ctx, solo, &R);
  dt_ledger_enable(ctx, true);
  TU_CHECK(s == DT_OK, "reference: %s", dt_last_error(ctx));
  for (int M = 1; s == DT_OK && M <= 2 * pp; M++) {
    if (TB % M) continue;
    pcase g = {DT_PP_GPIPE, 1, M, false};
    run_case(ctx, mesh, &R, &g);
    if (M >= pp) {
      pcase f = {DT_PP_1F1B, 1, M, false};
      run_case(ctx, mesh, &R, &f);
    }
    const int rounds = M / pp > 1 ? M / pp : 1;
    if (pp * 2 <= 2 * tiny_config().n_layers + 2 && M % rounds == 0) {
      pcase iv = {DT_PP_INTERLEAVED_1F1B, 2, M, false};
      run_case(ctx, mesh, &R, &iv);
    }
  }
  if (s == DT_OK) {
    pcase bad = {DT_PP_1F1B, 1, pp, true};
    run_case(ctx, mesh, &R, &bad);
  }
  ref_free(&R);
  dt_mesh_free(solo);
  dt_mesh_free(mesh);
  if (one) dt_comm_destroy(one);
  return DT_OK;
}

int main(int argc, char **argv) {
  tu_opts o;
  tu_parse(argc, argv, &o);
  if (o.backend != DT_BACKEND_THREADS) {
    printf("SKIP: test_pp runs with the threads backend only\n");
    return SB_SKIP;
  }
  dt_device_cpu_blas_threads(1);
  for (int pp = 2; pp <= 4; pp++) {
    printf("pp %d\n", pp);
    dt_launch_opts lo = {.backend = DT_BACKEND_THREADS, .world = pp, .timeout_s = 120};
    dt_launch_report rep;
    dt_status s = dt_launch(&lo, body, NULL, &rep);
    if (s != DT_OK)
      tu_fail(__FILE__, __LINE__, "pp %d: launch: rank %d: %s", pp, rep.failed_rank, rep.failed_msg);
    dt_launch_report_free(&rep);
  }
  return tu_finish("test_pp");
}
