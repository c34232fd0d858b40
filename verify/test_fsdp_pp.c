/* verify/test_fsdp_pp.c: FSDP inside pipeline stages (lib/parallel/fsdp.c's pipeline
 * mode, driven by dt_pipeline_step in lib/parallel/pp.c) on the threads backend,
 * against the unsharded model computed by every rank on a mesh of its own (the
 * oracle: the same f64 model, forward + loss + backward on the whole batch, one
 * AdamW step; no pipeline, no FSDP).
 *
 * What PyTorch / TorchTitan do, and so what is expected: TorchTitan's apply_fsdp
 * (torchtitan/models/llama3/infra/parallelize.py, v0.2.0) keeps every unit
 * gathered after forward when pp is enabled, and PyTorch's pipelining
 * (torch/distributed/pipelining/stage.py, backward_maybe_with_nosync and
 * perform_reduce_grad) accumulates the unsharded gradients over the microbatches
 * and reduce-scatters once after the stage's last backward. So per step, every
 * unit with modules on this rank's stages is all-gathered once and
 * reduce-scattered once (HSDP: one all_reduce over dp_replicate too), whatever
 * the schedule and the number of microbatches m, and a unit with none is never
 * touched.
 *
 * Model: dim 32, 4 layers, 4 heads, 2 kv heads, vocab 64, FFN hidden 90 (85 rounded
 * up to multiple_of 10: uneven torch.chunk splits over 4 ranks, 23 23 23 21); seq
 * 8, batch 24. Units: plans/pp-fsdp.plan (tok_embeddings, each block, [norm,
 * output], root: none left), with TP plans/pp-fsdp-tp-sp.plan's [tp] and
 * [dp_shard] sections. Stages: TorchTitan's split (dt_pp_split), loop placement.
 * Meshes, TorchTitan's dim order (tp after the FSDP dims: FSDP shards dim 1 of a
 * weight tp shards on dim 0, as FSDP2's shard_placement_fn would):
 *   [pp 2, dp_shard 2]                 GPipe m 1..4, 1F1B m 2..4, Interleaved1F1B
 *                                      (v 2: 4 stages) m 2..4; ZeRO-2, ZeRO-1
 *   [pp 2, cp 2]                       FSDP over cp alone (group "dp_shard_cp")
 *   [pp 2, dp_shard 2, tp 2]           TP + SP + loss parallel inside the stages
 *   [pp 2, dp_replicate 2, dp_shard 2] HSDP
 *   [pp 2, dp_shard 2, cp 2]           FSDP over the flattened dp_shard x cp
 * The batch is Shard(0) over every data dim and cp (as verify/test_fsdp_cp.c does:
 * cp's weight gradients are then Partial(sum) as under context parallel, which
 * is what FSDP's group sees; the attention itself is not context parallel here).
 * Data rank d (the data dims and cp flattened in mesh order) takes rows
 * [d B/ndp, (d+1) B/ndp), and its microbatch k the k-th m-th of those, as the
 * harness cuts them (bench/harness/run.c microbatch_tensor).
 *
 * Checks, every rank, for the weights of its own stages:
 *   - each gradient (gathered) against the reference's, normwise, within TOL;
 *   - the loss on the last stage's rank;
 *   - every other weight has no gradient;
 *   - each weight after one AdamW step (ZeRO-1: then dt_fsdp_after_step), and the
 *     other stages' weights too after dt_pipeline_share refilled them;
 *   - the parameter bytes held after dt_pipeline_release_foreign (before the step and
 *     after the share + a new release): this rank's stages' weights only, their FSDP
 *     shards' torch.chunk rows derived here from the shapes (held_bytes);
 *   - the ledger: the rows on the FSDP group and on dp_replicate, as a multiset of
 *     (phase, op, group, elements) derived here from the layout and the shapes
 *     (expected_rows); nothing else may appear there.
 * It can fail: (1) fault_no_reduce on layers.0.attention.wq (each rank keeps its
 * own chunk of its partial gradient) must fail that gradient on the rank holding
 * layer 0; (2) a ZeRO-1 run checked against ZeRO-3's rows must fail the ledger
 * check while its values pass. Bad input: an explicit reshard_after_forward=True
 * inside the stages is refused (DT_ERR_UNSUPPORTED naming the unit) before any
 * communication.
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor.h"
#include "testutil.h"

enum {
  TB = 24, TS = 8, N_LAYERS = 4, DIM = 32, HEADS = 4, KV_HEADS = 2, VOCAB = 64, HIDDEN = 90,
  MAX_ROWS = 64,
};
static const uint64_t SEED = 20260114; /* any fixed seed: both sides use it */
/* f64: the microbatches, the reduce_scatter and the gathers sum the same products
 * in other orders. 2^10 u, the harness's bound for a reordered sum before an update
 * (bench/harness/verdict.c sb_tolerance), as verify/test_pp.c; measured (printed
 * per case) <= 1.5e-15 on the gradients and <= 3.1e-14 on the weights after AdamW
 * (its sqrt(v) division amplifies the gradients' rounding; TP's most), so one bound
 * fits both */
static const double TOL = 0x1p-43;

static dt_llama_config tiny_config(void) {
  dt_llama_config c;
  memset(&c, 0, sizeof c);
  snprintf(c.name, sizeof c.name, "tiny-pp");
  c.dim = DIM;
  c.n_layers = N_LAYERS;
  c.n_heads = HEADS;
  c.n_kv_heads = KV_HEADS;
  c.vocab = VOCAB;
  c.multiple_of = 10;
  c.norm_eps = 1e-5;
  c.rope_theta = 500000;
  c.rope_scaling = false;
  c.depth_init = true;
  return c;
}

/* ---- cases ------------------------------------------------------------------------- */

typedef struct tcase {
  const char *label;
  int R, DS, C, T;          /* dp_replicate, dp_shard, cp, tp (1: dim left out); pp is 2 */
  int zero;
  dt_pp_schedule_kind kind;
  int v, m;
  const char *fault;        /* fault_no_reduce ("" none) */
  int ledger_zero;          /* the stage the ledger is checked against */
} tcase;

enum { PP = 2 };

static const tcase cases[] = {
    {"GPipe m1", 1, 2, 1, 1, 3, DT_PP_GPIPE, 1, 1, "", 3},
    {"GPipe m2", 1, 2, 1, 1, 3, DT_PP_GPIPE, 1, 2, "", 3},
    {"GPipe m3", 1, 2, 1, 1, 3, DT_PP_GPIPE, 1, 3, "", 3},
    {"GPipe m4", 1, 2, 1, 1, 3, DT_PP_GPIPE, 1, 4, "", 3},
    {"1F1B m2", 1, 2, 1, 1, 3, DT_PP_1F1B, 1, 2, "", 3},
    {"1F1B m3", 1, 2, 1, 1, 3, DT_PP_1F1B, 1, 3, "", 3},
    {"1F1B m4", 1, 2, 1, 1, 3, DT_PP_1F1B, 1, 4, "", 3},
    {"Interleaved m2", 1, 2, 1, 1, 3, DT_PP_INTERLEAVED_1F1B, 2, 2, "", 3},
    {"Interleaved m3", 1, 2, 1, 1, 3, DT_PP_INTERLEAVED_1F1B, 2, 3, "", 3},
    {"Interleaved m4", 1, 2, 1, 1, 3, DT_PP_INTERLEAVED_1F1B, 2, 4, "", 3},
    {"1F1B m4 zero2", 1, 2, 1, 1, 2, DT_PP_1F1B, 1, 4, "", 2},
    {"1F1B m4 zero1", 1, 2, 1, 1, 1, DT_PP_1F1B, 1, 4, "", 1},
    {"Interleaved m2 zero1", 1, 2, 1, 1, 1, DT_PP_INTERLEAVED_1F1B, 2, 2, "", 1},
    {"PLANTED 1F1B m4 fault_no_reduce wq", 1, 2, 1, 1, 3, DT_PP_1F1B, 1, 4,
     "layers.0.attention.wq", 3},
    {"PLANTED 1F1B m4 zero1 as zero3", 1, 2, 1, 1, 1, DT_PP_1F1B, 1, 4, "", 3},
    {"cp2 1F1B m2", 1, 1, 2, 1, 3, DT_PP_1F1B, 1, 2, "", 3},
    {"cp2 Interleaved m4", 1, 1, 2, 1, 3, DT_PP_INTERLEAVED_1F1B, 2, 4, "", 3},
    {"tp2 1F1B m2", 1, 2, 1, 2, 3, DT_PP_1F1B, 1, 2, "", 3},
    {"tp2 GPipe m3", 1, 2, 1, 2, 3, DT_PP_GPIPE, 1, 3, "", 3},
    {"tp2 Interleaved m2", 1, 2, 1, 2, 3, DT_PP_INTERLEAVED_1F1B, 2, 2, "", 3},
    {"HSDP 1F1B m3", 2, 2, 1, 1, 3, DT_PP_1F1B, 1, 3, "", 3},
    {"HSDP Interleaved m2", 2, 2, 1, 1, 3, DT_PP_INTERLEAVED_1F1B, 2, 2, "", 3},
    {"HSDP GPipe m2 zero1", 2, 2, 1, 1, 1, DT_PP_GPIPE, 1, 2, "", 1},
    {"dp_shard2 x cp2 1F1B m3", 1, 2, 2, 1, 3, DT_PP_1F1B, 1, 3, "", 3},
};
enum { N_CASES = sizeof cases / sizeof cases[0] };

static int world_of(const tcase *t) { return PP * t->R * t->DS * t->C * t->T; }
static bool planted(const tcase *t) { return t->fault[0] || t->ledger_zero != t->zero; }

typedef struct dims {
  int pp, r, ds, c, t, n;
} dims;

static dt_status make_mesh(dt_ctx *ctx, const tcase *tc, dt_mesh **mesh, dims *d) {
  int shape[5], n = 0;
  const char *names[5];
  d->r = d->ds = d->c = d->t = -1;
  d->pp = n; names[n] = "pp"; shape[n++] = PP;
  if (tc->R > 1) { d->r = n; names[n] = "dp_replicate"; shape[n++] = tc->R; }
  if (tc->DS > 1) { d->ds = n; names[n] = "dp_shard"; shape[n++] = tc->DS; }
  if (tc->C > 1) { d->c = n; names[n] = "cp"; shape[n++] = tc->C; }
  if (tc->T > 1) { d->t = n; names[n] = "tp"; shape[n++] = tc->T; }
  d->n = n;
  return dt_mesh_create(ctx, ctx->world, n, shape, names, mesh);
}

/* ---- tokens ------------------------------------------------------------------------ */

/* Row `row`'s ids (which 0: tokens, 1: targets): a mixed index, no period. */
static void row_ids(int which, int row, int64_t *out) {
  for (int i = 0; i < TS; i++) { /* Knuth's MMIX LCG constants */
    uint64_t x = (uint64_t)(row * TS + i + 1) * 6364136223846793005u +
                 1442695040888963407u * (uint64_t)(which + 1);
    x ^= x >> 33;
    out[i] = (int64_t)(x % (uint64_t)VOCAB);
  }
}

/* rows[0..nr) of the batch as a DTensor on mesh, Shard(0) on the mesh dims of mask
 * (nested in mesh order), Replicate elsewhere. */
static dt_status rows_tensor(dt_ctx *ctx, dt_mesh *mesh, unsigned mask, int which, const int *rows,
                             int nr, dt_tensor *out) {
  int64_t *v = malloc(sizeof *v * (size_t)(nr * TS));
  if (!v) return DT_ERR_NOMEM;
  for (int i = 0; i < nr; i++) row_ids(which, rows[i], v + (size_t)i * TS);
  const int64_t sh[2] = {nr, TS};
  dt_array a;
  dt_status s = dt_array_wrap(ctx, DT_DEV_CPU, DT_I64, 2, sh, v, &a);
  dt_placement pl[DT_MAX_MESH_DIMS];
  for (int d = 0; d < DT_MAX_MESH_DIMS; d++) pl[d] = mask & (1u << d) ? dt_shard(0) : dt_replicate();
  if (s == DT_OK) s = dt_tensor_distribute(ctx, mesh, &a, pl, out);
  free(v);
  return s;
}

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
  int rows[TB];
  for (int i = 0; i < TB; i++) rows[i] = i;
  dt_tensor tok = {0}, tgt = {0};
  if (s == DT_OK) s = rows_tensor(ctx, solo, 0, 0, rows, TB, &tok);
  if (s == DT_OK) s = rows_tensor(ctx, solo, 0, 1, rows, TB, &tgt);
  dt_var *lg = NULL, *loss = NULL;
  if (s == DT_OK) s = dt_model_forward(ctx, m, &tok, &lg);
  if (s == DT_OK) s = dt_model_loss(ctx, m, lg, &tgt, &loss);
  if (s == DT_OK) s = dt_model_backward(ctx, m, loss);
  out->n_mods = m->n_mods;
  out->grad = calloc((size_t)m->n_mods, sizeof *out->grad);
  out->after = calloc((size_t)m->n_mods, sizeof *out->after);
  out->n = calloc((size_t)m->n_mods, sizeof *out->n);
  if (s == DT_OK && (!out->grad || !out->after || !out->n)) s = DT_ERR_NOMEM;
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

/* ---- the expected collectives ------------------------------------------------------ */

/* One weight: its global shape (cols 0: 1-D) and the tensor dim TP shards under
 * pp-fsdp-tp-sp (-1: none): Colwise Linear weights [out, in], the Rowwise embedding
 * [vocab, dim] and the Colwise output on 0, Rowwise Linear weights on 1, norms
 * replicated (SequenceParallel). Shapes of TorchTitan's Llama 3 model.py. */
typedef struct wdesc {
  int64_t rows, cols;
  int tp_dim;
} wdesc;

/* The weights of a unit: kind 0 tok_embeddings, 1 a block, 2 [norm, output]. */
static int unit_weights(int kind, wdesc *w) {
  const int64_t D = DIM, V = VOCAB, F = HIDDEN, hd = DIM / HEADS, H = HEADS, K = KV_HEADS;
  int n = 0;
  if (kind == 0) {
    w[n++] = (wdesc){V, D, 0};
  } else if (kind == 1) {
    w[n++] = (wdesc){D, 0, -1};     /* attention_norm */
    w[n++] = (wdesc){H * hd, D, 0}; /* wq */
    w[n++] = (wdesc){K * hd, D, 0}; /* wk */
    w[n++] = (wdesc){K * hd, D, 0}; /* wv */
    w[n++] = (wdesc){D, H * hd, 1}; /* wo */
    w[n++] = (wdesc){D, 0, -1};     /* ffn_norm */
    w[n++] = (wdesc){F, D, 0};      /* w1 */
    w[n++] = (wdesc){D, F, 1};      /* w2 */
    w[n++] = (wdesc){F, D, 0};      /* w3 */
  } else {
    w[n++] = (wdesc){D, 0, -1};     /* norm */
    w[n++] = (wdesc){V, D, 0};      /* output */
  }
  return n;
}

/* A unit's flat segment P per rank (each weight's TP-local block [outer, L, inner]
 * around the dim FSDP splits, ceil(L / W) rows of it: torch.chunk's padded chunk)
 * and its unpadded local elements. tp comes after the FSDP dims here, so a weight
 * tp shards on dim 0 is split by FSDP on dim 1. */
static void unit_sizes(int kind, int W, int T, int64_t *P, int64_t *whole) {
  wdesc w[16];
  const int n = unit_weights(kind, w);
  *P = *whole = 0;
  for (int k = 0; k < n; k++) {
    int64_t sh[2] = {w[k].rows, w[k].cols ? w[k].cols : 1};
    if (T > 1 && w[k].tp_dim >= 0) sh[w[k].tp_dim] /= T;
    const int fd = T > 1 && w[k].tp_dim == 0 ? 1 : 0;
    const int64_t L = sh[fd], rest = sh[0] * sh[1] / L;
    *P += rest * ((L + W - 1) / W);
    *whole += sh[0] * sh[1];
  }
}

typedef struct xrow {
  char phase[16];
  int op;
  char group[32];
  uint64_t elems;
} xrow;

static int xrow_cmp(const void *a, const void *b) {
  const xrow *x = a, *y = b;
  int c = strcmp(x->phase, y->phase);
  if (!c) c = x->op - y->op;
  if (!c) c = strcmp(x->group, y->group);
  if (!c) c = x->elems < y->elems ? -1 : x->elems > y->elems;
  return c;
}

static void add_row(xrow *rows, int *n, const char *phase, int op, const char *group,
                    uint64_t elems) {
  if (*n >= MAX_ROWS) return;
  xrow *r = &rows[(*n)++];
  memset(r, 0, sizeof *r);
  snprintf(r->phase, sizeof r->phase, "%s", phase);
  r->op = op;
  snprintf(r->group, sizeof r->group, "%s", group);
  r->elems = elems;
}

static const char *fsdp_group(const tcase *tc) { return tc->C > 1 ? "dp_shard_cp" : "dp_shard"; }

/* The unit kinds this pp rank holds, from the layout: tok_embeddings with the
 * embedding stage, one block per layer of its stages, [norm, output] with the head
 * (a unit never spans two ranks' stages: the root unit is empty). */
static int rank_units(const dt_pp_layout *L, int rank, int *kinds) {
  int n = 0;
  for (int s = 0; s < L->n_stages; s++) {
    if (dt_pp_stage_rank(s, PP) != rank) continue;
    const dt_pp_stage *st = &L->stages[s];
    if (st->embedding) kinds[n++] = 0;
    for (int l = 0; l < st->n_layers; l++) kinds[n++] = 1;
    if (st->head) kinds[n++] = 2;
  }
  return n;
}

/* torch.chunk's piece i of len rows over w: ceil(len / w) each, the last ones fewer or none. */
static int64_t chunk_rows(int64_t len, int w, int i) {
  const int64_t c = (len + w - 1) / w, left = len - i * c;
  return left < 0 ? 0 : left < c ? left : c;
}

/* The bytes of this rank's own stages' weights as it holds them (f64): each weight's
 * TP-local block, and under ZeRO-2/3 of it the rows on the dim FSDP splits as the
 * weight's placements give them: Shard on dp_shard (coordinate ds), then Shard of that
 * on cp (coordinate c), each a torch.chunk (DTensor's nested sharding, as
 * dt_fully_shard documents; a flattened dp_shard_cp chunk differs for uneven rows:
 * HIDDEN 90 is 23 22 23 22 nested, 23 23 23 21 flat). ZeRO-1 keeps whole weights. */
static int64_t held_bytes(const tcase *tc, const dt_pp_layout *L, int rank, int ds, int cc) {
  const int T = tc->T;
  int kinds[2 * N_LAYERS + 4];
  const int nu = rank_units(L, rank, kinds);
  int64_t e = 0;
  for (int u = 0; u < nu; u++) {
    wdesc w[16];
    const int n = unit_weights(kinds[u], w);
    for (int k = 0; k < n; k++) {
      int64_t sh[2] = {w[k].rows, w[k].cols ? w[k].cols : 1};
      if (T > 1 && w[k].tp_dim >= 0) sh[w[k].tp_dim] /= T;
      const int fd = T > 1 && w[k].tp_dim == 0 ? 1 : 0;
      const int64_t len = sh[fd], rest = sh[0] * sh[1] / len;
      e += rest * (tc->zero == 1 ? len : chunk_rows(chunk_rows(len, tc->DS, ds), tc->C, cc));
    }
  }
  return e * (int64_t)sizeof(double);
}

/* One step's rows on the FSDP group and dp_replicate of this rank: per unit here,
 * ZeRO-2/3 one forward all_gather (W P, the output) and one backward reduce_scatter
 * (W P, the input), HSDP one all_reduce (P); ZeRO-1 one backward all_reduce of the
 * whole local gradients per group and one optimizer all_gather (W P); and the
 * loss's reductions on the last stage's rank. */
static int expected_rows(const tcase *tc, int zero, const dt_pp_layout *L, int rank, xrow *rows) {
  const int W = tc->DS * tc->C, AG = DT_COLL_ALL_GATHER, RS = DT_COLL_REDUCE_SCATTER,
            AR = DT_COLL_ALL_REDUCE;
  const char *g = fsdp_group(tc);
  int kinds[2 * N_LAYERS + 4];
  const int nu = rank_units(L, rank, kinds);
  int n = 0;
  for (int u = 0; u < nu; u++) {
    int64_t P, whole;
    unit_sizes(kinds[u], W, tc->T, &P, &whole);
    if (zero == 1) {
      add_row(rows, &n, "backward", AR, g, (uint64_t)whole);
      if (tc->R > 1) add_row(rows, &n, "backward", AR, "dp_replicate", (uint64_t)whole);
      add_row(rows, &n, "optimizer", AG, g, (uint64_t)(W * P));
      continue;
    }
    add_row(rows, &n, "forward", AG, g, (uint64_t)(W * P));
    add_row(rows, &n, "backward", RS, g, (uint64_t)(W * P));
    if (tc->R > 1) add_row(rows, &n, "backward", AR, "dp_replicate", (uint64_t)P);
  }
  /* the last stage's rank reads each microbatch's loss (pp.c's F): 0-d, Partial(sum)
   * over every dim the batch is sharded on, so one 1-element all_reduce per such dim
   * (with cp the counted FSDP group is dp_shard_cp, not dp_shard) */
  for (int k = 0; rank == dt_pp_stage_rank(L->n_stages - 1, PP) && k < tc->m; k++) {
    if (tc->DS > 1 && tc->C == 1) add_row(rows, &n, "forward", AR, "dp_shard", 1);
    if (tc->R > 1) add_row(rows, &n, "forward", AR, "dp_replicate", 1);
  }
  qsort(rows, (size_t)n, sizeof *rows, xrow_cmp);
  return n;
}

/* The ledger's rows on the FSDP group and dp_replicate against the expected ones:
 * mismatches (0: equal). */
static int check_ledger(dt_ctx *ctx, const tcase *tc, const dt_pp_layout *L, int rank,
                        const char *what, bool report) {
  xrow want[MAX_ROWS], got[MAX_ROWS];
  const int nw = expected_rows(tc, tc->ledger_zero, L, rank, want);
  const dt_ledger *lg = dt_ledger_of(ctx);
  int ng = 0, extra = 0;
  for (size_t i = 0; i < lg->n; i++) {
    const dt_ledger_row *r = &lg->rows[i];
    if (strcmp(r->group, fsdp_group(tc)) && strcmp(r->group, "dp_replicate")) continue;
    if (ng < MAX_ROWS) add_row(got, &ng, r->phase, r->op, r->group, r->elems);
    else extra++;
  }
  qsort(got, (size_t)ng, sizeof *got, xrow_cmp);
  int bad = extra + (ng != nw);
  for (int i = 0; i < ng && i < nw; i++) bad += xrow_cmp(&got[i], &want[i]) != 0;
  if (bad && report) {
    fprintf(stderr, "%s, pp rank %d: FSDP rows, %d got / %d expected:\n", what, rank, ng, nw);
    for (int i = 0; i < ng || i < nw; i++)
      fprintf(stderr, "  got %-8s %-14s %-12s %10llu | want %-8s %-14s %-12s %10llu\n",
              i < ng ? got[i].phase : "", i < ng ? dt_coll_name((dt_coll)got[i].op) : "",
              i < ng ? got[i].group : "", i < ng ? (unsigned long long)got[i].elems : 0ull,
              i < nw ? want[i].phase : "", i < nw ? dt_coll_name((dt_coll)want[i].op) : "",
              i < nw ? want[i].group : "", i < nw ? (unsigned long long)want[i].elems : 0ull);
  }
  return bad;
}

/* ---- one case ---------------------------------------------------------------------- */

/* The plan's entries of section `dim` ("tp", "dp_shard") into e; returns how many. */
static int plan_section(const dt_plan *p, const char *dim, dt_plan_entry *e) {
  const int d = dt_plan_dim(p, dim);
  int n = 0;
  for (int i = 0; d >= 0 && i < p->n_entries; i++)
    if (p->entries[i].dim == d) e[n++] = p->entries[i];
  return n;
}

/* Whether module i's weight is on a stage of pp rank r. */
static bool mine(const dt_model *m, const dt_pp_layout *L, int i, int r) {
  const int st = dt_pp_module_stage(m, L, i);
  return st >= 0 && dt_pp_stage_rank(st, PP) == r;
}

typedef struct plans {
  const dt_plan *fsdp, *tp; /* pp-fsdp.plan, pp-fsdp-tp-sp.plan */
} plans;

/* The model of a case: TP, then FSDP (raf_true: every entry with
 * reshard_after_forward=True, the refused input), then the weights. */
static dt_status build(dt_ctx *ctx, dt_mesh *mesh, const tcase *tc, const dims *d,
                       const plans *pl, bool raf_true, dt_model **out) {
  dt_llama_config cfg = tiny_config();
  dt_plan_entry *e = malloc(sizeof *e * DT_PLAN_MAX_ENTRIES);
  if (!e) return DT_ERR_NOMEM;
  dt_status s = dt_model_create(ctx, mesh, &cfg, DT_F64, SEED, out);
  if (s == DT_OK && tc->T > 1) s = dt_parallelize_module(ctx, *out, d->t, e, plan_section(pl->tp, "tp", e));
  const int n = plan_section(tc->T > 1 ? pl->tp : pl->fsdp, "dp_shard", e);
  for (int i = 0; raf_true && i < n; i++) e[i].style.reshard_after_forward = 1;
  dt_fsdp_opts fo = {.shard_dim = d->ds, .cp_dim = d->c, .replicate_dim = d->r, .zero = tc->zero,
                     .param_dtype = DT_DTYPE_COUNT, .reduce_dtype = DT_DTYPE_COUNT};
  snprintf(fo.fault_no_reduce, sizeof fo.fault_no_reduce, "%s", tc->fault);
  if (s == DT_OK) s = dt_fully_shard(ctx, *out, e, n, &fo);
  if (s == DT_OK) s = dt_model_materialize(ctx, *out);
  free(e);
  return s;
}

/* Microbatch k of M: each data rank's k-th M-th of its rows. */
static dt_status microbatch(dt_ctx *ctx, dt_mesh *mesh, unsigned dmask, int ndp, int which, int k,
                            int M, dt_tensor *out) {
  const int local = TB / ndp, mb = local / M;
  int rows[TB], n = 0;
  for (int dr = 0; dr < ndp; dr++)
    for (int i = 0; i < mb; i++) rows[n++] = dr * local + k * mb + i;
  return rows_tensor(ctx, mesh, dmask, which, rows, n, out);
}

static void run_case(dt_ctx *ctx, const ref *R, const tcase *tc, const plans *pl) {
  dt_mesh *mesh = NULL;
  dims d;
  dt_status s = make_mesh(ctx, tc, &mesh, &d);
  TU_OK(ctx, s);
  if (s != DT_OK) return;
  const int r = dt_mesh_coord(mesh, d.pp), M = tc->m;
  char what[96];
  snprintf(what, sizeof what, "%s (world %d)", tc->label, world_of(tc));
  const unsigned dmask = (d.r >= 0 ? 1u << d.r : 0) | (d.ds >= 0 ? 1u << d.ds : 0) |
                         (d.c >= 0 ? 1u << d.c : 0);
  const int ndp = tc->R * tc->DS * tc->C;
  dt_pp_layout L;
  dt_pp_schedule S;
  memset(&S, 0, sizeof S);
  dt_model *m = NULL;
  dt_tensor tok[4], tgt[4];
  memset(tok, 0, sizeof tok);
  memset(tgt, 0, sizeof tgt);
  s = dt_pp_split(ctx, N_LAYERS, PP * tc->v, 1, 1, &L);
  if (s == DT_OK) s = dt_pp_schedule_generate(ctx, tc->kind, PP, tc->v, M, &S);
  if (s == DT_OK) s = dt_pp_schedule_lower(ctx, &S);
  if (s == DT_OK) s = build(ctx, mesh, tc, &d, pl, false, &m);
  /* this rank keeps its stages' weights (their FSDP shards) only */
  if (s == DT_OK) s = dt_pipeline_release_foreign(ctx, m, d.pp, &L);
  const int64_t want_bytes = held_bytes(tc, &L, r, d.ds >= 0 ? dt_mesh_coord(mesh, d.ds) : 0,
                                        d.c >= 0 ? dt_mesh_coord(mesh, d.c) : 0);
  dt_model_mem mem;
  dt_model_state_bytes(m, &mem);
  TU_CHECK(s != DT_OK || mem.params == want_bytes,
           "%s, rank %d: %lld parameter bytes after the release, want its stages' shards' %lld",
           what, ctx->rank, (long long)mem.params, (long long)want_bytes);
  dt_ledger_enable(ctx, false);
  for (int k = 0; s == DT_OK && k < M; k++) {
    s = microbatch(ctx, mesh, dmask, ndp, 0, k, M, &tok[k]);
    if (s == DT_OK) s = microbatch(ctx, mesh, dmask, ndp, 1, k, M, &tgt[k]);
  }
  TU_CHECK(s == DT_OK, "%s: setup: %s", what, dt_last_error(ctx));
  double loss = 0;
  dt_ledger_clear(ctx);
  dt_ledger_enable(ctx, true);
  if (s == DT_OK) s = dt_pipeline_step(ctx, m, d.pp, &L, &S, tok, tgt, &loss, NULL, 0, NULL);
  if (s == DT_OK) s = dt_fsdp_reduce_grads(ctx, m); /* ZeRO-1's all-reduce; else no-op */
  dt_ledger_enable(ctx, false);
  TU_CHECK(s == DT_OK, "%s, pp rank %d: step: %s", what, r, dt_last_error(ctx));
  double wg = 0, wa = 0, wq = 0;
  int ledger_bad = 0;
  if (s == DT_OK) {
    for (int i = 0; i < m->n_mods; i++) {
      if (!m->mods[i].weight) continue;
      const dt_tensor *g = dt_var_grad(m->mods[i].weight);
      if (!mine(m, &L, i, r)) {
        TU_CHECK(!g, "%s, pp rank %d: %s has a gradient but is not on this rank", what, r,
                 m->mods[i].fqn);
        continue;
      }
      int64_t n = 0;
      double *gv = tu_full_f64(ctx, g, &n);
      TU_CHECK(gv && n == R->n[i], "%s, pp rank %d: %s: no gradient", what, r, m->mods[i].fqn);
      const double e = gv && n == R->n[i] ? tu_normwise(gv, R->grad[i], n) : INFINITY;
      if (tc->fault[0] && !strcmp(m->mods[i].fqn, tc->fault)) wq = e;
      else wg = fmax(wg, e);
      free(gv);
    }
    if (dt_pp_stage_rank(L.n_stages - 1, PP) == r) wg = fmax(wg, fabs(loss - R->loss) / fabs(R->loss));
    /* one AdamW step; ZeRO-1 then gathers the updated rows */
    const dt_adamw opt = DT_ADAMW_DEFAULT;
    TU_OK(ctx, dt_model_end_step(ctx, m));
    dt_ledger_enable(ctx, true);
    dt_ctx_set_phase(ctx, "optimizer"); /* the harness's phase (bench/harness/run.c) */
    TU_OK(ctx, dt_model_adamw_step(ctx, m, &opt));
    TU_OK(ctx, dt_fsdp_after_step(ctx, m));
    dt_ctx_set_phase(ctx, "");
    dt_ledger_enable(ctx, false);
    ledger_bad = check_ledger(ctx, tc, &L, r, what, !planted(tc));
    for (int i = 0; !tc->fault[0] && i < m->n_mods; i++) {
      if (!m->mods[i].weight || !mine(m, &L, i, r)) continue;
      int64_t n = 0;
      double *wv = tu_full_f64(ctx, dt_var_value(m->mods[i].weight), &n);
      wa = fmax(wa, wv && n == R->n[i] ? tu_normwise(wv, R->after[i], n) : INFINITY);
      free(wv);
    }
    /* every weight after the share of the owners' values (the released ones refilled),
     * then released again */
    TU_OK(ctx, dt_pipeline_share(ctx, m, d.pp, &L, false));
    for (int i = 0; !tc->fault[0] && i < m->n_mods; i++) {
      if (!m->mods[i].weight || mine(m, &L, i, r)) continue;
      int64_t n = 0;
      double *wv = tu_full_f64(ctx, dt_var_value(m->mods[i].weight), &n);
      wa = fmax(wa, wv && n == R->n[i] ? tu_normwise(wv, R->after[i], n) : INFINITY);
      free(wv);
    }
    TU_OK(ctx, dt_pipeline_release_foreign(ctx, m, d.pp, &L));
    dt_model_state_bytes(m, &mem);
    TU_CHECK(mem.params == want_bytes, "%s, rank %d: %lld parameter bytes after the share and "
             "release, want %lld", what, ctx->rank, (long long)mem.params, (long long)want_bytes);
    if (tc->fault[0]) {
      if (r == 0) /* layer 0 is on stage 0, pp rank 0 */
        TU_CHECK(wq > 1e-3, "%s, pp rank %d: the unreduced %s went unnoticed (%.3g)", what, r,
                 tc->fault, wq);
      TU_CHECK(wg <= TOL, "%s, pp rank %d: the other gradients differ by %.3g", what, r, wg);
    } else {
      TU_CHECK(wg <= TOL, "%s, pp rank %d: gradients / loss differ by %.3g (tolerance %.0e)", what,
               r, wg, TOL);
      TU_CHECK(wa <= TOL, "%s, pp rank %d: weights after AdamW differ by %.3g (tolerance %.0e)",
               what, r, wa, TOL);
    }
    if (tc->ledger_zero != tc->zero)
      TU_CHECK(ledger_bad > 0, "%s, pp rank %d: ZeRO-%d's rows passed as ZeRO-%d's", what, r,
               tc->zero, tc->ledger_zero);
    else
      TU_CHECK(ledger_bad == 0, "%s, pp rank %d: %d FSDP ledger rows differ", what, r, ledger_bad);
    if (ctx->rank == 0)
      printf("  %-38s grads/loss %.2e, weights %.2e%s\n", what, wg, wa,
             tc->fault[0] ? "  (planted: the faulty gradient is excluded)" : "");
  }
  for (int k = 0; k < M; k++) {
    dt_tensor_free(ctx, &tok[k]);
    dt_tensor_free(ctx, &tgt[k]);
  }
  dt_pp_schedule_free(ctx, &S);
  dt_model_free(ctx, m);
  dt_mesh_free(mesh);
}

/* An explicit reshard_after_forward=True is refused by the step, before any
 * communication (TorchTitan's default with pp keeps the units gathered). */
static void bad_input(dt_ctx *ctx, const plans *pl) {
  const tcase tc = {"raf", 1, 2, 1, 1, 3, DT_PP_1F1B, 1, 2, "", 3};
  if (world_of(&tc) != ctx->world_size) return;
  dt_mesh *mesh = NULL;
  dims d;
  TU_OK(ctx, make_mesh(ctx, &tc, &mesh, &d));
  dt_pp_layout L;
  dt_pp_schedule S;
  memset(&S, 0, sizeof S);
  dt_model *m = NULL;
  dt_tensor tok[2], tgt[2];
  memset(tok, 0, sizeof tok);
  memset(tgt, 0, sizeof tgt);
  dt_status s = dt_pp_split(ctx, N_LAYERS, PP, 1, 1, &L);
  if (s == DT_OK) s = dt_pp_schedule_generate(ctx, DT_PP_1F1B, PP, 1, 2, &S);
  if (s == DT_OK) s = dt_pp_schedule_lower(ctx, &S);
  if (s == DT_OK) s = build(ctx, mesh, &tc, &d, pl, true, &m);
  for (int k = 0; s == DT_OK && k < 2; k++) {
    s = microbatch(ctx, mesh, 1u << d.ds, 2, 0, k, 2, &tok[k]);
    if (s == DT_OK) s = microbatch(ctx, mesh, 1u << d.ds, 2, 1, k, 2, &tgt[k]);
  }
  TU_OK(ctx, s);
  if (s == DT_OK) {
    double loss;
    dt_ledger_clear(ctx);
    dt_ledger_enable(ctx, true);
    s = dt_pipeline_step(ctx, m, d.pp, &L, &S, tok, tgt, &loss, NULL, 0, NULL);
    dt_ledger_enable(ctx, false);
    TU_CHECK(s == DT_ERR_UNSUPPORTED && strstr(dt_last_error(ctx), "reshard_after_forward=True"),
             "reshard_after_forward=True in stages: %s (%s), want DT_ERR_UNSUPPORTED", dt_status_str(s),
             dt_last_error(ctx));
    TU_CHECK(dt_ledger_of(ctx)->n == 0, "the refused step communicated (%zu ledger rows)",
             dt_ledger_of(ctx)->n);
    for (int i = 0; i < m->n_mods; i++)
      TU_CHECK(!m->mods[i].weight || !dt_var_grad(m->mods[i].weight), "the refused step left a gradient");
  }
  for (int k = 0; k < 2; k++) {
    dt_tensor_free(ctx, &tok[k]);
    dt_tensor_free(ctx, &tgt[k]);
  }
  dt_pp_schedule_free(ctx, &S);
  dt_model_free(ctx, m);
  dt_mesh_free(mesh);
}

static dt_status body(dt_ctx *ctx, void *arg) {
  const plans *pl = arg;
  dt_comm *one = NULL;
  dt_mesh *solo = NULL;
  const char *sn[1] = {"solo"};
  const int sshape[1] = {1};
  dt_status s = dt_comm_split(ctx->world, ctx->rank, 0, "solo", &one);
  if (s == DT_OK) s = dt_mesh_create(ctx, one, 1, sshape, sn, &solo);
  ref R;
  memset(&R, 0, sizeof R);
  dt_ledger_enable(ctx, false);
  if (s == DT_OK) s = reference(ctx, solo, &R);
  TU_CHECK(s == DT_OK, "reference: %s", dt_last_error(ctx));
  for (int k = 0; s == DT_OK && k < (int)N_CASES; k++)
    if (world_of(&cases[k]) == ctx->world_size) run_case(ctx, &R, &cases[k], pl);
  if (s == DT_OK) bad_input(ctx, pl);
  ref_free(&R);
  dt_mesh_free(solo);
  if (one) dt_comm_destroy(one);
  return DT_OK;
}

/* The derivation's own numbers against the config (a wrong shape table would make
 * the ledger check agree with a wrong implementation only by accident). */
static void check_derivation(void) {
  const dt_llama_config cfg = tiny_config();
  TU_CHECK(dt_llama_ffn_hidden(&cfg) == HIDDEN, "FFN hidden %d, the table says %d",
           dt_llama_ffn_hidden(&cfg), HIDDEN);
  int64_t total = 0, P, whole;
  for (int kind = 0; kind < 3; kind++) {
    unit_sizes(kind, 1, 1, &P, &whole);
    total += whole * (kind == 1 ? N_LAYERS : 1);
  }
  TU_CHECK(total == dt_llama_nparams(&cfg), "the units hold %lld parameters, the config %lld",
           (long long)total, (long long)dt_llama_nparams(&cfg));
  unit_sizes(1, 4, 1, &P, &whole); /* a block at W 4: w1, w3 pad 90 rows to 4 x 23 */
  TU_CHECK(P == 2976, "block P at W 4: %lld, want 2976", (long long)P);
}

int main(int argc, char **argv) {
  tu_opts o;
  tu_parse(argc, argv, &o);
  if (o.backend != DT_BACKEND_THREADS) {
    printf("SKIP: test_fsdp_pp runs with the threads backend only\n");
    return SB_SKIP;
  }
  dt_device_cpu_blas_threads(1);
  check_derivation();
  char p1[512], p2[512];
  tu_plan_path("pp-fsdp.plan", p1, sizeof p1);
  tu_plan_path("pp-fsdp-tp-sp.plan", p2, sizeof p2);
  dt_plan *a = malloc(sizeof *a), *b = malloc(sizeof *b);
  dt_status s = a && b ? dt_plan_load(NULL, p1, a) : DT_ERR_NOMEM;
  TU_CHECK(s == DT_OK, "%s: %s", p1, dt_status_str(s));
  if (s == DT_OK) s = dt_plan_load(NULL, p2, b);
  TU_CHECK(s == DT_OK, "%s: %s", p2, dt_status_str(s));
  plans pl = {a, b};
  for (int world = 4; s == DT_OK && world <= 8; world *= 2) {
    printf("world %d\n", world);
    dt_launch_opts lo = {.backend = DT_BACKEND_THREADS, .world = world, .timeout_s = 120};
    dt_launch_report rep;
    s = dt_launch(&lo, body, &pl, &rep);
    if (s != DT_OK)
      tu_fail(__FILE__, __LINE__, "world %d: launch: rank %d: %s", world, rep.failed_rank,
              rep.failed_msg);
    dt_launch_report_free(&rep);
  }
  free(a);
  free(b);
  return tu_finish("test_fsdp_pp");
}
