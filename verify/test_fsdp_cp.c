/* verify/test_fsdp_cp.c: FSDP over dp_shard x cp (lib/parallel/fsdp.c, dt_fully_shard
 * with cp_dim), end to end against an unsharded reference, with each step's FSDP
 * collectives checked against counts and payloads derived here.
 *
 * Why cp joins FSDP's group: context-parallel ranks hold the same weights and see
 * different tokens, so their weight gradients are Partial(sum) on cp as on the data
 * dims; TorchTitan shards FSDP over the flattened dp_shard x cp mesh ("dp_shard_cp",
 * torchtitan/distributed/parallel_dims.py ParallelDims; apply_fsdp on
 * world_mesh["dp_shard_cp"] in torchtitan/models/llama3/infra/parallelize.py), and
 * over cp alone when dp_shard is 1. Here the batch is Shard(0) over every data dim
 * and cp (nested in mesh order), which gives cp's gradients the same Partial(sum)
 * without context-parallel attention: the test exercises FSDP's group, not CP.
 *
 * Model: a small Llama (dim 32, 2 layers, 4 heads, 2 kv heads, vocab 64, FFN
 * hidden 90 = int(2 * 4 * 32 / 3) = 85 rounded up to multiple_of 10; f64), seq 8,
 * batch 8. Units and TP entries: plans/fsdp-tp-sp.plan (TorchTitan's apply_fsdp
 * units: tok_embeddings, each block, [norm, output] kept after forward; apply_tp
 * with sequence and loss parallel). Meshes in TorchTitan's order (dp_replicate,
 * dp_shard, cp, tp; dims of size 1 left out):
 *   [cp 2]                        FSDP over cp alone (group "dp_shard_cp", 2 ranks: named
 *                                 as TorchTitan's mesh, apart from cp's own attention rows)
 *   [dp_shard 2, cp 2]            ZeRO-3, ZeRO-2, ZeRO-1 (group "dp_shard_cp", 4)
 *   [dp_replicate 2, dp_shard 2, cp 2]   HSDP
 *   [cp 2, tp 2], [dp_shard 2, cp 2, tp 2]   TP after the FSDP dims: Colwise weights
 *                                 and the Rowwise embedding are Shard(0) on tp, so
 *                                 FSDP shards their dim 1 (FSDP2's
 *                                 shard_placement_fn returning Shard(1))
 * hidden 90 makes w1 / w3 / w2's 90 rows split unevenly and differently nested
 * (torch.chunk: 45, 45, then 23, 22 each: 23, 22, 23, 22) than flattened (23, 23,
 * 23, 21), so a pack that used the flattened chunk would misplace rows.
 *
 * Values: every step's loss and every weight gradient (after FSDP's reduction),
 * every weight after 2 AdamW steps, against the same model on a 1-rank mesh (same
 * seed and batches), by the harness's verifier (bench/harness/verdict.c:
 * normwise error against sb_tolerance, derived there; every rank's own view);
 * the count of compared quantities is checked so a verifier that skipped some
 * cannot pass.
 *
 * Collectives, per step, every ledger row not on "tp" (TP's own are
 * verify/test_parallel.c's), as a multiset of (phase, op, group, group size,
 * elements); nothing else may appear. Derived here from the config's shapes
 * (expected_rows), following FSDP2 (_fsdp_collectives.py foreach_all_gather /
 * foreach_reduce) and TorchTitan v0.2.0's apply_fsdp:
 *   P(unit) = sum over its weights of outer x ceil(L / W) x inner, the tensor
 *   FSDP splits being the weight's TP-local block [outer, L, inner] around the
 *   sharded dim (1 when tp shards dim 0 and comes after the FSDP dims, else 0),
 *   W = dp_shard x cp;
 *   ZeRO-3: forward one all_gather per unit, W x P elements (the output);
 *   backward one all_gather per unit resharded after forward (the embedding and
 *   the blocks), one reduce_scatter per unit (W x P, the input), and for HSDP one
 *   all_reduce per unit over dp_replicate (P); ZeRO-2: no backward all_gather;
 *   ZeRO-1: backward one all_reduce per unit of its whole local gradients (sum of
 *   outer x L x inner) on the FSDP group, optimizer one all_gather per unit (W x P).
 *
 * It can fail: (1) fault_no_reduce on layers.0.attention.wq (each rank keeps its
 * own chunk of its partial gradient) must fail the values naming that gradient;
 * (2) a ZeRO-2 run checked against ZeRO-3's collectives must fail the ledger
 * check (the backward all_gathers are missing) while its values pass.
 * Bad input: no FSDP dim, cp_dim not shard_dim + 1, ZeRO-1 needing a dim-1 shard.
 */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../bench/harness/verdict.h"
#include "testutil.h"

enum {
  BATCH = 8, SEQ = 8, N_LAYERS = 2, N_STEPS = 2,
  DIM = 32, HEADS = 4, KV_HEADS = 2, VOCAB = 64, HIDDEN = 90,
  N_PARAMS = 9 * N_LAYERS + 3,
  N_COMPARED = N_STEPS * (1 + N_PARAMS) + N_PARAMS, /* losses, gradients, final weights */
  N_UNITS = N_LAYERS + 2,                           /* tok_embeddings, blocks, [norm, output] */
  MAX_ROWS = 64,
};
static const uint64_t SEED = 20260113; /* any fixed seed: both sides use it */

static dt_llama_config tiny_config(void) {
  dt_llama_config c;
  memset(&c, 0, sizeof c);
  strcpy(c.name, "tiny-cp");
  c.dim = DIM;
  c.n_layers = N_LAYERS;
  c.n_heads = HEADS;
  c.n_kv_heads = KV_HEADS;
  c.vocab = VOCAB;
  c.multiple_of = 10;
  c.ffn_dim_multiplier = 0;
  c.norm_eps = 1e-5;
  c.rope_theta = 500000;
  c.rope_scaling = false;
  c.depth_init = true;
  return c;
}

/* ---- cases ------------------------------------------------------------------------- */

typedef struct tcase {
  const char *label;
  int R, DS, C, T;       /* dp_replicate, dp_shard, cp, tp sizes (1: dim left out) */
  int zero;
  const char *fault;     /* fault_no_reduce ("" none) */
  int ledger_zero;       /* the stage the ledger is checked against */
  bool planted;          /* a planted failure: the checks must catch it */
} tcase;

static int world_of(const tcase *t) { return t->R * t->DS * t->C * t->T; }

static const tcase cases[] = {
    {"cp2", 1, 1, 2, 1, 3, "", 3, false},
    {"cp2 x tp2", 1, 1, 2, 2, 3, "", 3, false},
    {"dp_shard2 x cp2", 1, 2, 2, 1, 3, "", 3, false},
    {"dp_shard2 x cp2 zero2", 1, 2, 2, 1, 2, "", 2, false},
    {"dp_shard2 x cp2 zero1", 1, 2, 2, 1, 1, "", 1, false},
    {"PLANTED dp_shard2 x cp2 fault_no_reduce wq", 1, 2, 2, 1, 3, "layers.0.attention.wq", 3, true},
    {"PLANTED dp_shard2 x cp2 zero2 as zero3", 1, 2, 2, 1, 2, "", 3, true},
    {"dp_replicate2 x dp_shard2 x cp2 (HSDP)", 2, 2, 2, 1, 3, "", 3, false},
    {"dp_shard2 x cp2 x tp2", 1, 2, 2, 2, 3, "", 3, false},
};
enum { N_CASES = sizeof cases / sizeof cases[0] };

/* The mesh dims of a case: indices (-1: left out) and the mesh itself. */
typedef struct dims {
  int r, ds, c, t;
} dims;

static dt_status make_mesh(dt_ctx *ctx, const tcase *tc, dt_mesh **mesh, dims *d) {
  int shape[4], n = 0;
  const char *names[4];
  d->r = d->ds = d->c = d->t = -1;
  if (tc->R > 1) { d->r = n; names[n] = "dp_replicate"; shape[n++] = tc->R; }
  if (tc->DS > 1) { d->ds = n; names[n] = "dp_shard"; shape[n++] = tc->DS; }
  if (tc->C > 1) { d->c = n; names[n] = "cp"; shape[n++] = tc->C; }
  if (tc->T > 1) { d->t = n; names[n] = "tp"; shape[n++] = tc->T; }
  return dt_mesh_create(ctx, ctx->world, n, shape, names, mesh);
}

/* ---- the expected collectives --------------------------------------------------------- */

/* One weight: its global shape (cols 0: 1-D) and the tensor dim TP shards under
 * fsdp-tp-sp (-1: none): Colwise Linear weights [out, in] and the Rowwise
 * embedding [vocab, dim] on 0, Rowwise Linear weights on 1, norms replicated
 * (SequenceParallel). Shapes of TorchTitan's Llama 3 model.py. */
typedef struct wdesc {
  int64_t rows, cols;
  int tp_dim;
} wdesc;

/* The weights of unit u (0: tok_embeddings; 1..L: a block; L+1: norm, output). */
static int unit_weights(int u, wdesc *w) {
  const int64_t D = DIM, V = VOCAB, F = HIDDEN, hd = DIM / HEADS, H = HEADS, K = KV_HEADS;
  int n = 0;
  if (u == 0) {
    w[n++] = (wdesc){V, D, 0};                  /* tok_embeddings */
  } else if (u <= N_LAYERS) {
    w[n++] = (wdesc){D, 0, -1};                 /* attention_norm */
    w[n++] = (wdesc){H * hd, D, 0};             /* wq */
    w[n++] = (wdesc){K * hd, D, 0};             /* wk */
    w[n++] = (wdesc){K * hd, D, 0};             /* wv */
    w[n++] = (wdesc){D, H * hd, 1};             /* wo */
    w[n++] = (wdesc){D, 0, -1};                 /* ffn_norm */
    w[n++] = (wdesc){F, D, 0};                  /* w1 */
    w[n++] = (wdesc){D, F, 1};                  /* w2 */
    w[n++] = (wdesc){F, D, 0};                  /* w3 */
  } else {
    w[n++] = (wdesc){D, 0, -1};                 /* norm */
    w[n++] = (wdesc){V, D, 0};                  /* output */
  }
  return n;
}

/* A unit's per-rank flat segment P (padded) and its unpadded local elements. TP
 * comes after the FSDP dims in every mesh here, so a weight TP shards on dim 0 is
 * split by FSDP on dim 1. tp divides every sharded size of this config. */
static void unit_sizes(int u, int W, int T, int64_t *P, int64_t *whole) {
  wdesc w[16];
  const int n = unit_weights(u, w);
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
  int group_size;
  uint64_t elems;
} xrow;

static int xrow_cmp(const void *a, const void *b) {
  const xrow *x = a, *y = b;
  int c = strcmp(x->phase, y->phase);
  if (!c) c = x->op - y->op;
  if (!c) c = strcmp(x->group, y->group);
  if (!c) c = x->group_size - y->group_size;
  if (!c) c = x->elems < y->elems ? -1 : x->elems > y->elems;
  return c;
}

static void add_row(xrow *rows, int *n, const char *phase, int op, const char *group, int gs,
                    uint64_t elems) {
  if (*n >= MAX_ROWS) return;
  xrow *r = &rows[(*n)++];
  memset(r, 0, sizeof *r);
  snprintf(r->phase, sizeof r->phase, "%s", phase);
  r->op = op;
  snprintf(r->group, sizeof r->group, "%s", group);
  r->group_size = gs;
  r->elems = elems;
}

static const char *fsdp_group(const tcase *tc) {
  return tc->C > 1 ? "dp_shard_cp" : "dp_shard";
}

/* One step's FSDP rows of a case, as the file comment derives them. */
static int expected_rows(const tcase *tc, int zero, xrow *rows) {
  const int W = tc->DS * tc->C, AG = DT_COLL_ALL_GATHER, RS = DT_COLL_REDUCE_SCATTER,
            AR = DT_COLL_ALL_REDUCE;
  const char *g = fsdp_group(tc);
  int n = 0;
  for (int u = 0; u < N_UNITS; u++) {
    int64_t P, whole;
    unit_sizes(u, W, tc->T, &P, &whole);
    const bool raf = u <= N_LAYERS; /* [norm, output]: reshard_after_forward=False */
    if (zero == 1) {
      add_row(rows, &n, "backward", AR, g, W, (uint64_t)whole);
      if (tc->R > 1) add_row(rows, &n, "backward", AR, "dp_replicate", tc->R, (uint64_t)whole);
      add_row(rows, &n, "optimizer", AG, g, W, (uint64_t)(W * P));
      continue;
    }
    add_row(rows, &n, "forward", AG, g, W, (uint64_t)(W * P));
    if (zero == 3 && raf) add_row(rows, &n, "backward", AG, g, W, (uint64_t)(W * P));
    add_row(rows, &n, "backward", RS, g, W, (uint64_t)(W * P));
    if (tc->R > 1) add_row(rows, &n, "backward", AR, "dp_replicate", tc->R, (uint64_t)P);
  }
  qsort(rows, (size_t)n, sizeof *rows, xrow_cmp);
  return n;
}

/* This step's ledger rows not on tp against the expected ones: mismatches (0: equal). */
static int check_ledger(dt_ctx *ctx, const tcase *tc, const char *label, int step, bool report) {
  xrow want[MAX_ROWS], got[MAX_ROWS];
  const int nw = expected_rows(tc, tc->ledger_zero, want);
  const dt_ledger *lg = dt_ledger_of(ctx);
  int ng = 0, extra = 0;
  for (size_t i = 0; i < lg->n; i++) {
    const dt_ledger_row *r = &lg->rows[i];
    if (!strcmp(r->group, "tp")) continue;
    if (ng < MAX_ROWS) add_row(got, &ng, r->phase, r->op, r->group, r->group_size, r->elems);
    else extra++;
  }
  qsort(got, (size_t)ng, sizeof *got, xrow_cmp);
  int bad = extra + abs(ng - nw);
  for (int i = 0; i < ng && i < nw; i++) bad += xrow_cmp(&got[i], &want[i]) != 0;
  if (bad && report) {
    fprintf(stderr, "  %s step %d: rank %d: %d FSDP rows, %d expected; first differences:\n",
            label, step, ctx->rank, ng, nw);
    for (int i = 0, shown = 0; i < (ng > nw ? ng : nw) && shown < 4; i++) {
      const xrow *a = i < ng ? &got[i] : NULL, *b = i < nw ? &want[i] : NULL;
      if (a && b && !xrow_cmp(a, b)) continue;
      shown++;
      fprintf(stderr, "    got  %s %s %s/%d %llu\n    want %s %s %s/%d %llu\n",
              a ? a->phase : "-", a ? dt_coll_name((dt_coll)a->op) : "-", a ? a->group : "-",
              a ? a->group_size : 0, a ? (unsigned long long)a->elems : 0ull, b ? b->phase : "-",
              b ? dt_coll_name((dt_coll)b->op) : "-", b ? b->group : "-", b ? b->group_size : 0,
              b ? (unsigned long long)b->elems : 0ull);
    }
  }
  return bad;
}

/* ---- one run ------------------------------------------------------------------------------ */

/* The plan's entries of section `dim` ("tp", "dp_shard") into e; returns how many. */
static int plan_section(const dt_plan *p, const char *dim, dt_plan_entry *e) {
  const int d = dt_plan_dim(p, dim);
  int n = 0;
  for (int i = 0; i < p->n_entries; i++)
    if (p->entries[i].dim == d) e[n++] = p->entries[i];
  return n;
}

/* The weight placements fully_shard set, as the file comment says: Shard(d) on each
 * FSDP dim (d = 1 where tp shards dim 0), the tp placement kept, Replicate on
 * dp_replicate. Returns mismatches. */
static int check_placements(const dt_model *m, const tcase *tc, const dims *d) {
  int bad = 0;
  for (int i = 0; i < m->n_mods; i++) {
    const dt_module *md = &m->mods[i];
    if (!md->wndim) continue;
    const bool tp0 = d->t >= 0 && md->wpl[d->t].kind == DT_PL_SHARD && md->wpl[d->t].dim == 0;
    const int want = tp0 ? 1 : 0;
    const int fds[2] = {d->ds, d->c};
    for (int k = 0; k < 2; k++) {
      if (fds[k] < 0) continue;
      const dt_placement p = tc->zero == 1 ? md->opl[fds[k]] : md->wpl[fds[k]];
      if (p.kind != DT_PL_SHARD || p.dim != (tc->zero == 1 ? 0 : want)) bad++;
    }
    if (d->r >= 0 && md->wpl[d->r].kind != DT_PL_REPLICATE) bad++;
  }
  return bad;
}

typedef struct result {
  sb_cmp cmp;
  int ledger_bad;
} result;

/* Trains N_STEPS steps of the case (tc NULL: the reference on `mesh`), keeping the
 * check data into rec or comparing it with ref. */
static dt_status train(dt_ctx *ctx, dt_mesh *mesh, const tcase *tc, const dims *d,
                       const dt_plan *plan, sb_snap *rec, const sb_snap *ref, result *res) {
  const dt_llama_config cfg = tiny_config();
  dt_model *m = NULL;
  dt_status s = DT_OK;
  const char *label = tc ? tc->label : "reference";
  DT_CHECK(dt_model_create(ctx, mesh, &cfg, DT_F64, SEED, &m));
  if (rec) DT_CHECK_GOTO(sb_snap_init(ctx, m, N_STEPS, rec), s, done);
  unsigned dp_dims = 0;
  if (tc) {
    dt_plan_entry e[DT_PLAN_MAX_ENTRIES];
    if (d->t >= 0) {
      const int n = plan_section(plan, "tp", e);
      DT_CHECK_GOTO(dt_parallelize_module(ctx, m, d->t, e, n), s, done);
    }
    const int n = plan_section(plan, "dp_shard", e);
    dt_fsdp_opts fo = {.shard_dim = d->ds, .cp_dim = d->c, .replicate_dim = d->r,
                       .zero = tc->zero, .param_dtype = DT_DTYPE_COUNT,
                       .reduce_dtype = DT_DTYPE_COUNT, .fault_no_reduce = ""};
    snprintf(fo.fault_no_reduce, sizeof fo.fault_no_reduce, "%s", tc->fault);
    DT_CHECK_GOTO(dt_fully_shard(ctx, m, e, n, &fo), s, done);
    const int pb = check_placements(m, tc, d);
    TU_CHECK(pb == 0, "%s: %d weight placements differ from fully_shard's", label, pb);
    dp_dims = (d->r >= 0 ? 1u << d->r : 0u) | (d->ds >= 0 ? 1u << d->ds : 0u) |
              (d->c >= 0 ? 1u << d->c : 0u);
  }
  DT_CHECK_GOTO(dt_model_materialize(ctx, m), s, done);
  const dt_adamw opt = DT_ADAMW_DEFAULT;
  for (int step = 0; step < N_STEPS; step++) {
    dt_tensor tok, tgt;
    memset(&tok, 0, sizeof tok);
    memset(&tgt, 0, sizeof tgt);
    dt_ledger_enable(ctx, false);
    DT_CHECK_GOTO(sb_token_tensor(ctx, mesh, BATCH, SEQ, cfg.vocab, dp_dims, step, 0, &tok), s,
                  done);
    s = sb_token_tensor(ctx, mesh, BATCH, SEQ, cfg.vocab, dp_dims, step, 1, &tgt);
    if (s != DT_OK) {
      dt_tensor_free(ctx, &tok);
      goto done;
    }
    dt_ledger_clear(ctx);
    dt_ledger_enable(ctx, true);
    dt_ctx_set_phase(ctx, "forward");
    dt_var *logits = NULL, *loss = NULL;
    s = dt_model_forward(ctx, m, &tok, &logits);
    if (s == DT_OK) s = dt_model_loss(ctx, m, logits, &tgt, &loss);
    if (s == DT_OK) s = dt_model_backward(ctx, m, loss);
    if (s == DT_OK) s = dt_fsdp_reduce_grads(ctx, m); /* ZeRO-1's all_reduce */
    dt_tensor_free(ctx, &tok);
    dt_tensor_free(ctx, &tgt);
    if (s != DT_OK) goto done;
    dt_ledger_enable(ctx, false);
    dt_ctx_set_phase(ctx, "check");
    DT_CHECK_GOTO(sb_snap_step(ctx, m, loss, step, rec, ref, res ? &res->cmp : NULL), s, done);
    dt_ledger_enable(ctx, true);
    dt_ctx_set_phase(ctx, "optimizer");
    DT_CHECK_GOTO(dt_model_adamw_step(ctx, m, &opt), s, done);
    DT_CHECK_GOTO(dt_fsdp_after_step(ctx, m), s, done); /* ZeRO-1's all_gather */
    DT_CHECK_GOTO(dt_model_end_step(ctx, m), s, done);
    dt_ctx_set_phase(ctx, "");
    if (tc) res->ledger_bad += check_ledger(ctx, tc, label, step, !tc->planted);
  }
  dt_ledger_enable(ctx, false);
  DT_CHECK_GOTO(sb_snap_params(ctx, m, N_STEPS - 1, rec, ref, res ? &res->cmp : NULL), s, done);
done:
  dt_ledger_enable(ctx, true);
  dt_ctx_set_phase(ctx, "");
  dt_parallelize_release(ctx, m);
  dt_model_free(ctx, m);
  return s;
}

/* The reference: the same model on a 1-rank mesh (a split of the world per rank). */
static dt_status reference(dt_ctx *ctx, sb_snap *ref) {
  dt_comm *self = NULL;
  DT_CHECK(dt_comm_split(ctx->world, ctx->rank, 0, "self", &self));
  dt_mesh *mesh = NULL;
  const int shape[1] = {1};
  const char *const nm[1] = {"dp_shard"};
  dt_status s = dt_mesh_create(ctx, self, 1, shape, nm, &mesh);
  if (s == DT_OK) s = train(ctx, mesh, NULL, NULL, NULL, ref, NULL, NULL);
  dt_mesh_free(mesh);
  dt_comm_destroy(self);
  return s;
}

/* Refusals, before any collective: no FSDP dim, cp_dim not after shard_dim, ZeRO-1
 * where tp (after the FSDP dims) shards dim 0. */
static void bad_inputs(dt_ctx *ctx, dt_mesh *mesh, const dims *d, const dt_plan *plan) {
  const dt_llama_config cfg = tiny_config();
  dt_plan_entry e[DT_PLAN_MAX_ENTRIES];
  const int n = plan_section(plan, "dp_shard", e);
  dt_fsdp_opts fo = {.shard_dim = -1, .cp_dim = -1, .replicate_dim = -1, .zero = 3,
                     .param_dtype = DT_DTYPE_COUNT, .reduce_dtype = DT_DTYPE_COUNT,
                     .fault_no_reduce = ""};
  dt_model *m = NULL;
  TU_OK(ctx, dt_model_create(ctx, mesh, &cfg, DT_F64, SEED, &m));
  if (!m) return;
  TU_CHECK(dt_fully_shard(ctx, m, e, n, &fo) == DT_ERR_INVALID, "no FSDP dim must be refused");
  fo.shard_dim = d->c;
  fo.cp_dim = d->ds; /* cp before dp_shard */
  TU_CHECK(dt_fully_shard(ctx, m, e, n, &fo) == DT_ERR_INVALID, "cp before dp_shard must be refused");
  fo.shard_dim = d->ds;
  fo.cp_dim = d->t; /* two dims after dp_shard, not the next one */
  TU_CHECK(dt_fully_shard(ctx, m, e, n, &fo) == DT_ERR_INVALID,
           "a cp dim that is not shard_dim + 1 must be refused");
  TU_CHECK(m->param_state == NULL, "a refused fully_shard left state behind");
  dt_model_free(ctx, m);
  m = NULL;
  /* ZeRO-1 with tp after the FSDP dims: a dim-1 shard AdamW's row state cannot hold */
  TU_OK(ctx, dt_model_create(ctx, mesh, &cfg, DT_F64, SEED, &m));
  if (!m) return;
  dt_plan_entry t[DT_PLAN_MAX_ENTRIES];
  const int nt = plan_section(plan, "tp", t);
  TU_OK(ctx, dt_parallelize_module(ctx, m, d->t, t, nt));
  fo.cp_dim = d->c;
  fo.zero = 1;
  dt_status s = dt_fully_shard(ctx, m, e, n, &fo);
  TU_CHECK(s == DT_ERR_UNSUPPORTED && strstr(dt_last_error(ctx), "ZeRO-1"),
           "ZeRO-1 with a dim-1 shard: %s (%s), want DT_ERR_UNSUPPORTED naming ZeRO-1",
           dt_status_str(s), dt_last_error(ctx));
  const dt_module *wq = dt_model_find(m, "layers.0.attention.wq");
  TU_CHECK(wq && wq->wpl[d->ds].kind == DT_PL_REPLICATE && !wq->has_opl,
           "a refused fully_shard must leave the placements as they were");
  dt_parallelize_release(ctx, m);
  dt_model_free(ctx, m);
}

typedef struct job {
  int world;
  dt_plan *plan;
} job;

static dt_status run_rank(dt_ctx *ctx, void *arg) {
  const job *jb = arg;
  sb_snap ref;
  memset(&ref, 0, sizeof ref);
  dt_status s = reference(ctx, &ref);
  TU_OK(ctx, s);
  for (int k = 0; s == DT_OK && k < (int)N_CASES; k++) {
    const tcase *tc = &cases[k];
    if (world_of(tc) != jb->world) continue;
    dt_mesh *mesh = NULL;
    dims d;
    s = make_mesh(ctx, tc, &mesh, &d);
    TU_OK(ctx, s);
    if (s != DT_OK) break;
    result res;
    memset(&res, 0, sizeof res);
    sb_cmp_init(&res.cmp);
    const double t0 = dt_now();
    s = train(ctx, mesh, tc, &d, jb->plan, NULL, &ref, &res);
    TU_OK(ctx, s);
    if (s == DT_OK) {
      const sb_cmp *c = &res.cmp;
      TU_CHECK(c->n == N_COMPARED, "%s: %lld quantities compared, %d expected", tc->label,
               (long long)c->n, N_COMPARED);
      const bool values_fault = tc->fault[0] != 0, ledger_fault = tc->ledger_zero != tc->zero;
      if (values_fault)
        TU_CHECK(!sb_cmp_ok(c) && strstr(c->worst, tc->fault),
                 "%s: the verifier missed it (worst %s: %.3g over %.1e)", tc->label, c->worst,
                 c->worst_rel, c->worst_tol);
      else
        TU_CHECK(sb_cmp_ok(c), "%s: rank %d: %s: relative error %.3g over tolerance %.1e (%lld "
                 "of %lld over)", tc->label, ctx->rank, c->worst, c->worst_rel, c->worst_tol,
                 (long long)c->n_over, (long long)c->n);
      if (ledger_fault)
        TU_CHECK(res.ledger_bad > 0, "%s: the ledger check missed the missing all_gathers",
                 tc->label);
      else
        TU_CHECK(res.ledger_bad == 0, "%s: %d ledger mismatches", tc->label, res.ledger_bad);
      if (ctx->rank == 0)
        printf("  %-44s worst %s: rel err %.3g (tolerance %.1e); ledger mismatches %d; %.2f s\n",
               tc->label, c->worst, c->worst_rel, c->worst_tol, res.ledger_bad, dt_now() - t0);
    }
    if (s == DT_OK && tc->T > 1 && tc->DS > 1) bad_inputs(ctx, mesh, &d, jb->plan);
    dt_mesh_free(mesh);
  }
  sb_snap_free(&ref);
  return s;
}

static void launch(int world, dt_plan *plan) {
  dt_launch_opts o;
  memset(&o, 0, sizeof o);
  o.backend = DT_BACKEND_THREADS;
  o.world = world;
  o.timeout_s = 120; /* a hang is a failure */
  o.device = DT_DEV_CPU;
  dt_launch_report rep;
  memset(&rep, 0, sizeof rep);
  job jb = {world, plan};
  const double t0 = dt_now();
  dt_status s = dt_launch(&o, run_rank, &jb, &rep);
  TU_CHECK(s == DT_OK, "dt_launch(threads, %d) -> %s: rank %d: %s", world, dt_status_str(s),
           rep.failed_rank, rep.failed_msg);
  printf("test_fsdp_cp: world %d: %.2f s\n", world, dt_now() - t0);
  dt_launch_report_free(&rep);
}

/* The derivation's own numbers, worked by hand: W = 4, no TP: a block's P = norms
 * 2 x 8 + wq 8 x 32 + wk, wv 4 x 32 each + wo 8 x 32 + w1, w3 23 x 32 each + w2 8 x
 * 90 = 16 + 256 + 256 + 256 + 1472 + 720 = 2976; under tp 2 (W = 4): wq's local
 * [16, 32] split on dim 1: 16 x 8, wk / wv [8, 32]: 8 x 8, wo [32, 16] on dim 0:
 * 8 x 16, w1 / w3 [45, 32]: 45 x 8, w2 [32, 45]: 8 x 45, norms 8: 16 + 128 + 128 +
 * 128 + 720 + 360 = 1480. */
static void check_derivation(void) {
  dt_llama_config cfg = tiny_config();
  TU_CHECK(dt_llama_ffn_hidden(&cfg) == HIDDEN, "hidden %d, want %d", dt_llama_ffn_hidden(&cfg),
           HIDDEN);
  int64_t P, whole;
  unit_sizes(1, 4, 1, &P, &whole);
  TU_CHECK(P == 2976, "block P at W 4: %lld, want 2976", (long long)P);
  unit_sizes(1, 4, 2, &P, &whole);
  TU_CHECK(P == 1480, "block P at W 4, tp 2: %lld, want 1480", (long long)P);
  int64_t total = 0;
  for (int u = 0; u < N_UNITS; u++) {
    unit_sizes(u, 1, 1, &P, &whole);
    total += whole;
  }
  TU_CHECK(total == dt_llama_nparams(&cfg), "the units hold %lld parameters, the config %lld",
           (long long)total, (long long)dt_llama_nparams(&cfg));
}

int main(int argc, char **argv) {
  tu_opts o;
  tu_parse(argc, argv, &o);
  if (o.backend != DT_BACKEND_THREADS) {
    fprintf(stderr, "test_fsdp_cp: threads backend only\n");
    return SB_SKIP;
  }
  check_derivation();
  char path[512];
  tu_plan_path("fsdp-tp-sp.plan", path, sizeof path);
  dt_plan *plan = malloc(sizeof *plan);
  dt_status s = plan ? dt_plan_load(NULL, path, plan) : DT_ERR_NOMEM;
  TU_CHECK(s == DT_OK, "%s: %s", path, dt_status_str(s));
  if (s == DT_OK) {
    launch(2, plan);
    launch(4, plan);
    launch(8, plan);
  }
  free(plan);
  return tu_finish("test_fsdp_cp");
}
