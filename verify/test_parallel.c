/* verify/test_parallel.c: parallelize_module and data parallel, end to end, against an
 * unsharded reference, with per-step collective counts checked against the
 * analytic counts of each plan.
 *
 * Model: a tiny debugmodel-shaped Llama (dim 64, 2 layers, 8 heads, 4 kv heads
 * so tp 4 shards the kv heads, vocab 128, ffn hidden 192, seq 8, batch 4, f64).
 * Plans: the shipped files plans/NAME.plan, loaded with dt_plan_load ($srcdir or .):
 *   torchtitan-tp-sp     TorchTitan's TP + SP + loss parallel (apply_tp in
 *                        torchtitan/models/llama3/infra/parallelize.py)
 *   tp-no-loss-parallel  the same with the logits all-gathered to Replicate()
 *   megatron-tp          Megatron TP without SP, no loss parallel
 *   dp                   pure data parallel (no entries)
 * and two built here: megatron-tp-loss-parallel (Megatron's vocab-parallel
 * loss: logits stay Shard(-1)) and tp-sp-no-prepare-input (torchtitan-tp-sp
 * without its PrepareModuleInputs: Colwise input_layouts that lie; our hooks
 * move the actual placement, so the result stays right, at more comm).
 * Meshes: tp 2 and 4 (1-D "tp"), dp_replicate x tp = 2 x 2, dp 2 and 4.
 * Tokens are S(0) on the dp dim (batch sharded) and R on tp.
 *
 * For each (plan, mesh): two training steps (forward, cross-entropy, backward,
 * dt_data_parallel_reduce_grads when dp > 1, AdamW). Checked against the same
 * model on a 1-rank mesh (same seed; weights are sharding-invariant) by the
 * harness's verifier (bench/harness/verdict.c, the oracle for the comparison
 * itself is verify/test_verdict.c): every step's loss and every weight gradient
 * (reduced, gathered with dt_tensor_full), every weight after the 2 AdamW
 * steps, plus step 0's logits; normwise errors (max |a - b| / max |ref|)
 * against sb_tolerance (the derivation and the measured spreads are there:
 * 2^10 u before the first update, 2^17 u after it), on every rank's own view.
 * The count of compared quantities is checked too (N_COMPARED), so a verifier
 * that silently skips some cannot pass. Measured here: <= 9.7e-16 before the
 * first update and <= 7.2e-14 after it, 100x and 200x under the tolerances.
 *
 * Comm counts: every ledger row of each step is counted by (phase, op, group);
 * expected() derives the counts per plan (the derivation is written there) and
 * both steps must match exactly. No other collective may appear.
 *
 * Unit checks (no comm): weight placements and hooks per fqn, bracket patterns,
 * Colwise on an Embedding (Shard(1)), refusals (Colwise on a norm, a bad mesh dim).
 *
 * With --backend mpi (4 processes): torchtitan-tp-sp and megatron-tp on tp 4,
 * and torchtitan-tp-sp on 2 x 2.
 */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../bench/harness/verdict.h"
#include "testutil.h"

/* ---- the model ---------------------------------------------------------------- */

enum {
  BATCH = 4, SEQ = 8, /* batch 4: dp 4 gives each rank one sequence (an empty batch
                       * shard would make the ops replicate instead of shard) */
  N_LAYERS = 2,
  N_STEPS = 2,  /* 2 AdamW steps: the second exercises the moments */
};
static const uint64_t SEED = 20260101; /* any fixed seed: both sides use it */

static dt_llama_config tiny_config(void) {
  dt_llama_config c;
  memset(&c, 0, sizeof c);
  strcpy(c.name, "tiny");
  c.dim = 64;
  c.n_layers = N_LAYERS;
  c.n_heads = 8;
  c.n_kv_heads = 4;       /* tp 4 gives each rank one kv head */
  c.vocab = 128;
  c.multiple_of = 32;     /* ffn hidden: int(2*256/3) = 170 -> 192, divisible by 4 */
  c.ffn_dim_multiplier = 0;
  c.norm_eps = 1e-5;
  c.rope_theta = 500000;
  c.rope_scaling = false;
  c.depth_init = true;
  return c;
}

/* ---- styles and plans (defaults: PyTorch's torch/distributed/tensor/parallel/style.py) */

static dt_style_layout L_(dt_placement p) {
  dt_style_layout l = {false, p};
  return l;
}
static dt_style_layout L_NONE(void) {
  dt_style_layout l = {true, dt_replicate()};
  return l;
}

static dt_style colwise(dt_placement in, dt_placement out, bool local) {
  dt_style s;
  memset(&s, 0, sizeof s);
  s.kind = DT_STYLE_COLWISE;
  s.n_in = s.n_out = 1;
  s.input_layouts[0] = L_(in);
  s.desired_input_layouts[0] = L_(dt_replicate());
  s.output_layouts[0] = L_(out);
  s.desired_output_layouts[0] = L_NONE();
  s.use_local_output = local;
  s.sequence_dim = 1;
  return s;
}
static dt_style rowwise(dt_placement in, dt_placement out) {
  dt_style s;
  memset(&s, 0, sizeof s);
  s.kind = DT_STYLE_ROWWISE;
  s.n_in = s.n_out = 1;
  s.input_layouts[0] = L_(in);
  s.desired_input_layouts[0] = L_(dt_shard(-1));
  s.output_layouts[0] = L_(out);
  s.desired_output_layouts[0] = L_NONE();
  s.use_local_output = true;
  s.sequence_dim = 1;
  return s;
}
static dt_style sequence(void) {
  dt_style s;
  memset(&s, 0, sizeof s);
  s.kind = DT_STYLE_SEQUENCE;
  s.sequence_dim = 1;
  return s;
}
/* PrepareModuleInput(input_layouts=(Shard(1), None, None), desired=(Replicate(), None, None)) */
static dt_style prep_in(int n) {
  dt_style s;
  memset(&s, 0, sizeof s);
  s.kind = DT_STYLE_PREPARE_INPUT;
  s.n_in = n;
  s.input_layouts[0] = L_(dt_shard(1));
  s.desired_input_layouts[0] = L_(dt_replicate());
  for (int i = 1; i < n; i++) s.input_layouts[i] = s.desired_input_layouts[i] = L_NONE();
  s.sequence_dim = 1;
  return s;
}

/* The first four are the shipped plan files (plans/NAME.plan, loaded with
 * dt_plan_load); the last two are built here. */
typedef enum plan_kind {
  P_TORCHTITAN = 0, P_NOLOSSP, P_MEGATRON, P_DP, /* files */
  P_MEGATRON_LP, P_NOPREP, P_N_KINDS             /* built in C */
} plan_kind;
static const char *const plan_names[P_N_KINDS] = {
    "torchtitan-tp-sp", "tp-no-loss-parallel", "megatron-tp", "dp",
    "megatron-tp-loss-parallel", "tp-sp-no-prepare-input"};
/* the files' loss_parallel flags as the comm counts below assume them */
static const bool file_loss_parallel[P_MEGATRON_LP] = {true, false, false, false};

static void put(dt_plan_entry *e, int *n, const char *pat, dt_style s) {
  memset(&e[*n], 0, sizeof e[*n]);
  snprintf(e[*n].pattern, sizeof e[*n].pattern, "%s", pat);
  e[*n].style = s;
  e[*n].line = *n + 1;
  (*n)++;
}

/* C-built plans; the comment beside each entry is its plan-file text. P_TORCHTITAN
 * and P_NOLOSSP here equal the shipped files (the unit checks use them);
 * P_NOPREP is torchtitan-tp-sp without the two PrepareModuleInputs, a plan whose
 * Colwise input_layouts (Replicate()) do not say the truth (the input is S(1));
 * P_MEGATRON_LP is megatron-tp with Megatron's vocab-parallel loss
 * (output ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)) and
 * without PrepareModuleInputs. */
static int plan_entries(plan_kind k, dt_plan_entry *e) {
  int n = 0;
  const dt_placement R = dt_replicate(), S1 = dt_shard(1), Sm1 = dt_shard(-1);
  switch (k) {
  case P_TORCHTITAN:
  case P_NOLOSSP:
  case P_NOPREP:
    /* tok_embeddings: RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)) */
    put(e, &n, "tok_embeddings", rowwise(R, S1));
    /* norm: SequenceParallel() */
    put(e, &n, "norm", sequence());
    if (k != P_NOLOSSP) /* output: ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False) */
      put(e, &n, "output", colwise(S1, Sm1, false));
    else /* output: ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()) */
      put(e, &n, "output", colwise(S1, R, true));
    /* layers.*.attention_norm: SequenceParallel() */
    put(e, &n, "layers.*.attention_norm", sequence());
    /* layers.*.attention: PrepareModuleInput(input_layouts=(Shard(1), None, None),
     *                                        desired_input_layouts=(Replicate(), None, None)) */
    if (k != P_NOPREP) put(e, &n, "layers.*.attention", prep_in(3));
    put(e, &n, "layers.*.attention.wq", colwise(R, Sm1, true)); /* ColwiseParallel() */
    put(e, &n, "layers.*.attention.wk", colwise(R, Sm1, true));
    put(e, &n, "layers.*.attention.wv", colwise(R, Sm1, true));
    /* layers.*.attention.wo: RowwiseParallel(output_layouts=Shard(1)) */
    put(e, &n, "layers.*.attention.wo", rowwise(Sm1, S1));
    put(e, &n, "layers.*.ffn_norm", sequence());
    /* layers.*.feed_forward: PrepareModuleInput(input_layouts=(Shard(1),),
     *                                           desired_input_layouts=(Replicate(),)) */
    if (k != P_NOPREP) put(e, &n, "layers.*.feed_forward", prep_in(1));
    put(e, &n, "layers.*.feed_forward.w1", colwise(R, Sm1, true));
    put(e, &n, "layers.*.feed_forward.w2", rowwise(Sm1, S1));
    put(e, &n, "layers.*.feed_forward.w3", colwise(R, Sm1, true));
    break;
  case P_MEGATRON:
  case P_MEGATRON_LP:
    /* tok_embeddings: RowwiseParallel(input_layouts=Replicate()) */
    put(e, &n, "tok_embeddings", rowwise(R, R));
    /* layers.*.attention.w[qkv]: ColwiseParallel() */
    put(e, &n, "layers.*.attention.w[qkv]", colwise(R, Sm1, true));
    /* layers.*.attention.wo: RowwiseParallel() */
    put(e, &n, "layers.*.attention.wo", rowwise(Sm1, R));
    /* layers.*.feed_forward.w[13]: ColwiseParallel() */
    put(e, &n, "layers.*.feed_forward.w[13]", colwise(R, Sm1, true));
    put(e, &n, "layers.*.feed_forward.w2", rowwise(Sm1, R));
    if (k == P_MEGATRON_LP) /* output: ColwiseParallel(output_layouts=Shard(-1), use_local_output=False) */
      put(e, &n, "output", colwise(R, Sm1, false));
    else /* output: ColwiseParallel(output_layouts=Replicate()) (the file also has PrepareModuleInputs) */
      put(e, &n, "output", colwise(R, R, true));
    break;
  case P_DP:
  case P_N_KINDS:
    break;
  }
  return n;
}

/* The plan's entries: the shipped file for the file kinds (its loss_parallel
 * flag checked), plan_entries() for the others. */
static dt_status get_entries(dt_ctx *ctx, plan_kind k, dt_plan_entry *e, int *n) {
  if (k == P_MEGATRON_LP) {
    *n = plan_entries(k, e);
    return DT_OK;
  }
  plan_kind fk = k == P_NOPREP ? P_TORCHTITAN : k; /* filtered by the caller */
  char path[512], file[96];
  snprintf(file, sizeof file, "%s.plan", plan_names[fk]);
  tu_plan_path(file, path, sizeof path);
  dt_plan *p = malloc(sizeof *p);
  if (!p) return dt_error(ctx, DT_ERR_NOMEM, "get_entries", "no memory");
  dt_status s = dt_plan_load(ctx, path, p);
  if (s == DT_OK) {
    TU_CHECK(p->loss_parallel == file_loss_parallel[fk], "%s: loss_parallel = %d, counts assume %d",
             path, (int)p->loss_parallel, (int)file_loss_parallel[fk]);
    *n = p->n_entries;
    memcpy(e, p->entries, (size_t)p->n_entries * sizeof *e);
  }
  free(p);
  return s;
}

/* ---- collective counts ------------------------------------------------------------ */

enum { PH_FWD = 0, PH_BWD, PH_OPT, PH_OTHER, PH_N };
enum { G_TP = 0, G_DP, G_OTHER, G_N };
static const char *const ph_names[PH_N] = {"forward", "backward", "optimizer", "other"};
static const char *const g_names[G_N] = {"tp", "dp_replicate", "other"};

typedef struct counts {
  int n[PH_N][DT_COLL_COUNT][G_N];
} counts;

static void count_ledger(const dt_ctx *ctx, counts *c) {
  memset(c, 0, sizeof *c);
  for (size_t i = 0; i < dt_ledger_of(ctx)->n; i++) {
    const dt_ledger_row *r = &dt_ledger_of(ctx)->rows[i];
    int ph = PH_OTHER, g = G_OTHER;
    for (int p = 0; p < PH_OTHER; p++)
      if (!strcmp(r->phase, ph_names[p])) ph = p;
    for (int k = 0; k < G_OTHER; k++)
      if (!strcmp(r->group, g_names[k])) g = k;
    int op = r->op >= 0 && r->op < DT_COLL_COUNT ? r->op : DT_COLL_BARRIER;
    c->n[ph][op][g]++;
  }
}

/* The analytic per-step counts (per rank) of plan k with L layers on a mesh
 * (dp, tp). Derivation, by where each collective comes from:
 *
 * torchtitan (TP + SP + loss parallel), on the tp group, when tp > 1:
 *   forward:  tok_embeddings: vocab-sharded lookup is Partial, output hook
 *             P -> S(1): 1 reduce_scatter.
 *             per layer: attention and feed_forward PrepareModuleInput S(1) -> R:
 *             2 all_gathers; wo and w2 output hooks P -> S(1): 2 reduce_scatters.
 *             output: Colwise input S(1) -> R: 1 all_gather; logits S(-1) stay.
 *             loss parallel cross-entropy: 3 all_reduces (max, sum-exp, target).
 *             => AG 2L+1, RS 2L+1, AR 3.
 *   backward: each redistribute's backward (PyTorch's Redistribute.backward in
 *             torch/distributed/tensor/_redistribute.py): P -> S(1) mirrors to S(1) -> R
 *             (all_gather: embedding, wo, w2), S(1) -> R mirrors to a gradient
 *             that is Partial (the sum of wq/wk/wv's, w1/w3's, output's input
 *             gradients, kept Partial by the tape) -> S(1): reduce_scatter.
 *             Loss-parallel CE backward: the forward saved each position's
 *             log-sum-exp (cross_entropy's second output, R on tp), so, as in
 *             PyTorch, 0 comms.  => AG 2L+1, RS 2L+1, AR 0.
 *             The layers give Megatron-SP's 2 AG + 2 RS per layer each way
 *             (Korthikanti et al. 2022, arXiv 2205.05198).
 *   optimizer: the SP norm weights' gradients are Partial on tp (sum over the
 *             local sequence shard); AdamW redistributes each to R: AR 2L+1.
 * nolossp: as torchtitan, plus the output hook S(-1) -> R of the logits:
 *   1 more all_gather forward (backward R -> S(-1) is a local chunk); CE on
 *   replicated logits: 0 forward, 0 backward.  => fwd AG 2L+2, RS 2L+1; bwd AG 2L+1, RS 2L+1; opt AR 2L+1.
 * megatron (plans/megatron-tp.plan: TP, no SP, no loss parallel), tp > 1:
 *   forward:  embedding P -> R: 1 all_reduce; per layer wo and w2 P -> R: 2
 *             all_reduces (Megatron's "g"); the PrepareModuleInputs are
 *             R -> R (no move); output logits S(-1) -> R: 1 all_gather; CE on
 *             replicated logits: 0.  => AR 2L+1, AG 1.
 *   backward: Megatron's "f" all_reduce of the colwise input's gradient. In
 *             PyTorch it comes from from_local(Replicate) of a plain-tensor
 *             input (PrepareModuleInput's, or each Colwise's); here activations
 *             are DTensors already, PrepareModuleInput R -> R records nothing,
 *             and the gradients of x from wq, wk, wv (w1, w3; output) are
 *             Partial and summed while Partial (no comm); the norm's backward
 *             (rms_norm_bwd needs dy Replicate when x is Replicate) all-reduces
 *             the sum once: attention_norm and ffn_norm per layer, the final
 *             norm once. The same count as Megatron's f (one per sub-block),
 *             one op later. The P -> R redistributes' backward (R -> R), the
 *             embedding's and the logits' (R -> S(-1): a chunk) are free.
 *             => AR 2L+1 (Megatron's 2 per layer, plus the output layer's).
 *   optimizer: every gradient already has its weight's placements: 0.
 * megatron-lp (megatron with Megatron's vocab-parallel loss: output logits stay
 *   S(-1); no PrepareModuleInputs): forward AR 2L+1+3 (CE), no AG; backward
 *   AR 2L+1 (the CE backward makes none, as above).
 * noprep (torchtitan without the two PrepareModuleInputs: a plan whose
 *   Colwise input_layouts (default Replicate) are wrong, the activation being
 *   S(1)): PyTorch would not redistribute and compute garbage; our hooks move the
 *   ACTUAL placement, so each of wq, wk, wv, w1, w3 all-gathers its own input
 *   (5 AG per layer instead of 2) and each such redistribute's backward
 *   reduce-scatters its own Partial gradient (5 RS per layer instead of 2).
 *   => fwd AG 5L+1, RS 2L+1, AR 3; bwd AG 2L+1, RS 5L+1, AR 0; opt AR 2L+1.
 * dp (and the dp dim of 2 x 2): the forward and backward make no dp comm
 *   (tokens S(0); the loss is Partial(sum) on dp; weight gradients come out
 *   Partial on dp). dt_data_parallel_reduce_grads (DDP's default caps: first
 *   bucket 1 MiB) puts the 9L+3 weights' gradients into buckets by their local
 *   bytes: all of them together hold at most the whole model, 115008 f64
 *   parameters = 920064 bytes < 1 MiB (checked in main), so the first bucket
 *   never fills: 1 all_reduce, phase "backward". It reduces only the dp dim:
 *   the SP norm weights' tp Partial stays for the optimizer (2L+1 tp
 *   all_reduces there, dp or not). */
static void expected(plan_kind k, int L, int dp, int tp, counts *e) {
  memset(e, 0, sizeof *e);
  const int AR = DT_COLL_ALL_REDUCE, AG = DT_COLL_ALL_GATHER, RS = DT_COLL_REDUCE_SCATTER;
  /* per layer: 2 norms, wq wk wv wo, w1 w2 w3; plus embedding, final norm, output */
  int norms = 2 * L + 1;
  /* loss-parallel cross_entropy_bwd reads the saved log-sum-exp (PyTorch: 0 too) */
  enum { CE_BWD_AR = 0 };
  if (tp > 1) {
    switch (k) {
    case P_TORCHTITAN:
    case P_NOLOSSP:
      e->n[PH_FWD][AG][G_TP] = 2 * L + 1 + (k == P_NOLOSSP ? 1 : 0);
      e->n[PH_FWD][RS][G_TP] = 2 * L + 1;
      e->n[PH_FWD][AR][G_TP] = k == P_TORCHTITAN ? 3 : 0;
      e->n[PH_BWD][AG][G_TP] = 2 * L + 1;
      e->n[PH_BWD][RS][G_TP] = 2 * L + 1;
      e->n[PH_BWD][AR][G_TP] = k == P_TORCHTITAN ? CE_BWD_AR : 0;
      e->n[PH_OPT][AR][G_TP] += norms;
      break;
    case P_NOPREP:
      e->n[PH_FWD][AG][G_TP] = 5 * L + 1;
      e->n[PH_FWD][RS][G_TP] = 2 * L + 1;
      e->n[PH_FWD][AR][G_TP] = 3;
      e->n[PH_BWD][AG][G_TP] = 2 * L + 1;
      e->n[PH_BWD][RS][G_TP] = 5 * L + 1;
      e->n[PH_BWD][AR][G_TP] = CE_BWD_AR;
      e->n[PH_OPT][AR][G_TP] += norms;
      break;
    case P_MEGATRON:
      e->n[PH_FWD][AR][G_TP] = 2 * L + 1;
      e->n[PH_FWD][AG][G_TP] = 1;
      e->n[PH_BWD][AR][G_TP] = 2 * L + 1;
      break;
    case P_MEGATRON_LP:
      e->n[PH_FWD][AR][G_TP] = 2 * L + 1 + 3;
      e->n[PH_BWD][AR][G_TP] = 2 * L + 1 + CE_BWD_AR;
      break;
    case P_DP:
    case P_N_KINDS:
      break;
    }
  }
  if (dp > 1) e->n[PH_BWD][AR][G_DP] = 1; /* one bucket: see above */
}

static bool counts_eq(const counts *a, const counts *b) { return !memcmp(a, b, sizeof *a); }

static void counts_str(const counts *c, char *buf, size_t n) {
  size_t off = 0;
  buf[0] = 0;
  for (int p = 0; p < PH_N; p++)
    for (int o = 0; o < DT_COLL_COUNT; o++)
      for (int g = 0; g < G_N; g++)
        if (c->n[p][o][g] && off < n)
          off += (size_t)snprintf(buf + off, n - off, "%s%s %s@%s=%d", off ? ", " : "", ph_names[p],
                                  dt_coll_name((dt_coll)o), g_names[g], c->n[p][o][g]);
  if (!off) snprintf(buf, n, "none");
}

/* ---- one run (reference or parallel) ------------------------------------------ */

/* The reference's check data (bench/harness/verdict.h: every step's loss and
 * gradients, the final weights) plus step 0's logits. */
typedef struct ref_run {
  sb_snap snap;
  double *logits;
  int64_t n_logits;
} ref_run;

static void ref_run_free(ref_run *r) {
  sb_snap_free(&r->snap);
  free(r->logits);
  memset(r, 0, sizeof *r);
}

/* Every quantity the verifier compares per run: N_STEPS x (the loss and the
 * 9L+3 weight gradients), the 9L+3 final weights, step 0's logits. */
enum { N_PARAMS = 9 * N_LAYERS + 3, N_COMPARED = N_STEPS * (1 + N_PARAMS) + N_PARAMS + 1 };

typedef struct run_cfg {
  plan_kind plan;
  int tp_dim, dp_dim;         /* -1: none */
  int tp, dp;
  bool check_counts;
} run_cfg;

/* Step 0's logits: kept into rec or compared with ref into c. */
static dt_status check_logits(dt_ctx *ctx, const dt_var *logits, ref_run *rec, const ref_run *ref,
                              sb_cmp *c) {
  double *v = NULL;
  int64_t n = 0;
  DT_CHECK(sb_gather_f64(ctx, dt_var_value(logits), &v, &n));
  if (ref)
    sb_cmp_add(c, "logits step 0", v, n, ref->logits, ref->n_logits,
               sb_tolerance(DT_F64, false));
  if (rec) {
    rec->logits = v;
    rec->n_logits = n;
  } else {
    free(v);
  }
  return DT_OK;
}

/* Trains N_STEPS steps on `mesh`, keeping the check data into rec (the
 * reference) or comparing it with ref into c (bench/harness/verdict.c, on every
 * rank); counts are checked per step when rc->check_counts. The ledger is off
 * while results are gathered, so only the step's own collectives are counted. */
static dt_status train(dt_ctx *ctx, dt_mesh *mesh, const run_cfg *rc, const char *label,
                       ref_run *rec, const ref_run *ref, sb_cmp *c) {
  dt_llama_config cfg = tiny_config();
  dt_model *m = NULL;
  dt_status s = DT_OK;
  DT_CHECK(dt_model_create(ctx, mesh, &cfg, DT_F64, SEED, &m));
  if (rec) DT_CHECK_GOTO(sb_snap_init(ctx, m, N_STEPS, &rec->snap), s, done);
  if (rc->tp_dim >= 0) {
    dt_plan_entry entries[DT_PLAN_MAX_ENTRIES];
    int n = 0;
    DT_CHECK_GOTO(get_entries(ctx, rc->plan, entries, &n), s, done);
    if (rc->plan == P_NOPREP) { /* the torchtitan file without its PrepareModuleInputs */
      int k = 0;
      for (int i = 0; i < n; i++)
        if (entries[i].style.kind != DT_STYLE_PREPARE_INPUT) entries[k++] = entries[i];
      n = k;
    }
    DT_CHECK_GOTO(dt_parallelize_module(ctx, m, rc->tp_dim, entries, n), s, done);
  }
  DT_CHECK_GOTO(dt_model_materialize(ctx, m), s, done);
  const dt_adamw opt = DT_ADAMW_DEFAULT;
  counts first;
  memset(&first, 0, sizeof first);
  const unsigned dp_dims = rc->dp_dim >= 0 ? 1u << rc->dp_dim : 0u;
  for (int step = 0; step < N_STEPS; step++) {
    dt_tensor tok, tgt;
    memset(&tok, 0, sizeof tok);
    memset(&tgt, 0, sizeof tgt);
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
    if (s == DT_OK && rc->dp_dim >= 0) s = dt_data_parallel_reduce_grads(ctx, m, dp_dims, NULL);
    dt_tensor_free(ctx, &tok);
    dt_tensor_free(ctx, &tgt);
    if (s != DT_OK) goto done;
    /* gather results with the ledger off */
    dt_ledger_enable(ctx, false);
    dt_ctx_set_phase(ctx, "check");
    if (step == 0) DT_CHECK_GOTO(check_logits(ctx, logits, rec, ref, c), s, done);
    DT_CHECK_GOTO(sb_snap_step(ctx, m, loss, step, rec ? &rec->snap : NULL,
                               ref ? &ref->snap : NULL, c), s, done);
    dt_ledger_enable(ctx, true);
    dt_ctx_set_phase(ctx, "optimizer");
    DT_CHECK_GOTO(dt_model_adamw_step(ctx, m, &opt), s, done);
    DT_CHECK_GOTO(dt_model_end_step(ctx, m), s, done);
    dt_ctx_set_phase(ctx, "");
    if (rc->check_counts) {
      counts got, want;
      count_ledger(ctx, &got);
      expected(rc->plan, N_LAYERS, rc->dp, rc->tp, &want);
      char gb[1024], wb[1024];
      counts_str(&got, gb, sizeof gb);
      counts_str(&want, wb, sizeof wb);
      TU_CHECK(counts_eq(&got, &want), "%s step %d: comm counts\n  got:  %s\n  want: %s", label,
               step, gb, wb);
      if (step == 0) first = got;
      else TU_CHECK(counts_eq(&got, &first), "%s: step %d counts differ from step 0", label, step);
      if (ctx->rank == 0 && step == 0) printf("  %s: per step: %s\n", label, gb);
    }
  }
  dt_ledger_enable(ctx, false);
  DT_CHECK_GOTO(sb_snap_params(ctx, m, N_STEPS - 1, rec ? &rec->snap : NULL,
                               ref ? &ref->snap : NULL, c), s, done);
done:
  dt_ledger_enable(ctx, true);
  dt_ctx_set_phase(ctx, "");
  dt_parallelize_release(ctx, m);
  dt_model_free(ctx, m);
  return s;
}

/* The verdict of one run (this rank's view, bench/harness/verdict.c); also that it
 * compared every quantity it should have. */
static void verdict(dt_ctx *ctx, const char *label, const sb_cmp *c) {
  TU_CHECK(c->n == N_COMPARED, "%s: %lld quantities compared, %d expected", label, (long long)c->n,
           N_COMPARED);
  TU_CHECK(sb_cmp_ok(c), "%s: rank %d: %s: relative error %.3g over tolerance %.1e (%lld of %lld "
           "over)", label, ctx->rank, c->worst, c->worst_rel, c->worst_tol, (long long)c->n_over,
           (long long)c->n);
  if (ctx->rank == 0)
    printf("  %s: worst %s: rel err %.3g (tolerance %.1e)\n", label, c->worst, c->worst_rel,
           c->worst_tol);
}

/* ---- cases -------------------------------------------------------------------------- */

typedef struct tcase {
  plan_kind plan;
  int dp, tp;
} tcase;

static const tcase threads_cases[] = {
    {P_TORCHTITAN, 1, 2}, {P_NOLOSSP, 1, 2}, {P_MEGATRON, 1, 2}, {P_DP, 2, 1},
    {P_TORCHTITAN, 1, 4}, {P_NOLOSSP, 1, 4}, {P_MEGATRON, 1, 4}, {P_DP, 4, 1},
    {P_TORCHTITAN, 2, 2}, {P_NOLOSSP, 2, 2}, {P_MEGATRON, 2, 2}, {P_MEGATRON_LP, 1, 2},
    {P_MEGATRON_LP, 1, 4}, {P_NOPREP, 1, 2}, {P_NOPREP, 2, 2},
};
static const tcase mpi_cases[] = {
    {P_TORCHTITAN, 1, 4}, {P_MEGATRON, 1, 4}, {P_TORCHTITAN, 2, 2},
};

typedef struct job {
  const tcase *cases;
  int n_cases;
} job;

/* The reference: the same model on a 1-rank mesh (a split of the world per rank). */
static dt_status reference(dt_ctx *ctx, ref_run *ref) {
  dt_comm *self = NULL;
  DT_CHECK(dt_comm_split(ctx->world, ctx->rank, 0, "self", &self));
  dt_mesh *mesh = NULL;
  const int shape[1] = {1};
  const char *const nm[1] = {"tp"};
  dt_status s = dt_mesh_create(ctx, self, 1, shape, nm, &mesh);
  if (s == DT_OK) {
    run_cfg rc = {P_DP, -1, -1, 1, 1, false};
    s = train(ctx, mesh, &rc, "reference", ref, NULL, NULL);
  }
  dt_mesh_free(mesh);
  dt_comm_destroy(self);
  return s;
}

static dt_status run_rank(dt_ctx *ctx, void *arg) {
  const job *jb = arg;
  ref_run ref;
  memset(&ref, 0, sizeof ref);
  dt_status s = reference(ctx, &ref);
  TU_OK(ctx, s);
  if (s != DT_OK) {
    ref_run_free(&ref);
    return s;
  }
  for (int c = 0; c < jb->n_cases && s == DT_OK; c++) {
    const tcase *tc = &jb->cases[c];
    if (tc->dp * tc->tp != ctx->world_size) continue;
    char label[96];
    snprintf(label, sizeof label, "%s dp%d x tp%d", plan_names[tc->plan], tc->dp, tc->tp);
    dt_mesh *mesh = NULL;
    run_cfg rc;
    memset(&rc, 0, sizeof rc);
    rc.plan = tc->plan;
    rc.tp = tc->tp;
    rc.dp = tc->dp;
    rc.check_counts = true;
    if (tc->dp > 1 && tc->tp > 1) {
      const int shape[2] = {tc->dp, tc->tp};
      const char *const nm[2] = {"dp_replicate", "tp"};
      s = dt_mesh_create(ctx, ctx->world, 2, shape, nm, &mesh);
      rc.dp_dim = 0;
      rc.tp_dim = 1;
    } else if (tc->tp > 1) {
      const int shape[1] = {tc->tp};
      const char *const nm[1] = {"tp"};
      s = dt_mesh_create(ctx, ctx->world, 1, shape, nm, &mesh);
      rc.dp_dim = -1;
      rc.tp_dim = 0;
    } else {
      const int shape[1] = {tc->dp};
      const char *const nm[1] = {"dp_replicate"};
      s = dt_mesh_create(ctx, ctx->world, 1, shape, nm, &mesh);
      rc.dp_dim = 0;
      rc.tp_dim = -1;
    }
    TU_OK(ctx, s);
    if (s != DT_OK) break;
    sb_cmp cmp;
    sb_cmp_init(&cmp);
    s = train(ctx, mesh, &rc, label, NULL, &ref, &cmp);
    TU_OK(ctx, s);
    if (s == DT_OK) verdict(ctx, label, &cmp);
    dt_mesh_free(mesh);
  }
  ref_run_free(&ref);
  return s;
}

/* ---- unit checks of dt_parallelize_module (no comm) --------------------------------- */

static dt_status run_units(dt_ctx *ctx, void *arg) {
  (void)arg;
  dt_mesh *mesh = NULL;
  const int shape[1] = {ctx->world_size};
  const char *const nm[1] = {"tp"};
  DT_CHECK(dt_mesh_create(ctx, ctx->world, 1, shape, nm, &mesh));
  dt_llama_config cfg = tiny_config();
  dt_model *m = NULL;
  const size_t mem_before_models = ctx->mem.host_cur;
  dt_status s = dt_model_create(ctx, mesh, &cfg, DT_F64, SEED, &m);
  TU_OK(ctx, s);
  if (s == DT_OK) {
    dt_plan_entry e[DT_PLAN_MAX_ENTRIES];
    int n = plan_entries(P_TORCHTITAN, e);
    TU_OK(ctx, dt_parallelize_module(ctx, m, 0, e, n));
    static const struct {
      const char *fqn;
      dt_pl_kind kind;
      int dim;
    } want[] = {
        {"tok_embeddings", DT_PL_SHARD, 0},       {"layers.0.attention.wq", DT_PL_SHARD, 0},
        {"layers.1.attention.wo", DT_PL_SHARD, 1}, {"layers.1.feed_forward.w3", DT_PL_SHARD, 0},
        {"layers.0.feed_forward.w2", DT_PL_SHARD, 1}, {"layers.0.ffn_norm", DT_PL_REPLICATE, 0},
        {"output", DT_PL_SHARD, 0},               {"norm", DT_PL_REPLICATE, 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
      dt_module *md = dt_model_find(m, want[i].fqn);
      TU_CHECK(md != NULL, "no module %s", want[i].fqn);
      if (!md) continue;
      TU_CHECK(md->wpl[0].kind == want[i].kind &&
                   (want[i].kind != DT_PL_SHARD || md->wpl[0].dim == want[i].dim),
               "%s: weight placement kind %d dim %d", want[i].fqn, (int)md->wpl[0].kind,
               md->wpl[0].dim);
      TU_CHECK(md->pre && md->post && md->hook_state, "%s: hooks not installed", want[i].fqn);
    }
    dt_module *blk = dt_model_find(m, "layers.0");
    TU_CHECK(blk && !blk->pre && !blk->hook_state, "layers.0 must have no hooks");
    /* Megatron's bracket patterns and a Colwise embedding (Shard(1)) */
    dt_plan_entry e2[2];
    int n2 = 0;
    put(e2, &n2, "layers.[1].feed_forward.w[13]", colwise(dt_replicate(), dt_shard(-1), true));
    put(e2, &n2, "tok_embeddings", colwise(dt_replicate(), dt_shard(-1), true));
    dt_parallelize_release(ctx, m);
    TU_CHECK(!dt_model_find(m, "output")->pre, "release must remove the hooks");
    dt_model_free(ctx, m);
    m = NULL;
    s = dt_model_create(ctx, mesh, &cfg, DT_F64, SEED, &m);
    TU_OK(ctx, s);
    if (s == DT_OK) {
      TU_OK(ctx, dt_parallelize_module(ctx, m, 0, e2, n2));
      TU_CHECK(dt_model_find(m, "layers.1.feed_forward.w1")->wpl[0].kind == DT_PL_SHARD,
               "w[13] must match w1");
      TU_CHECK(dt_model_find(m, "layers.1.feed_forward.w2")->wpl[0].kind == DT_PL_REPLICATE,
               "w[13] must not match w2");
      TU_CHECK(dt_model_find(m, "layers.0.feed_forward.w1")->wpl[0].kind == DT_PL_REPLICATE,
               "layers.[1] must not match layers.0");
      dt_placement pe = dt_model_find(m, "tok_embeddings")->wpl[0];
      TU_CHECK(pe.kind == DT_PL_SHARD && pe.dim == 1, "Colwise embedding must be Shard(1)");
      /* a Colwise on a norm is unsupported (PyTorch: NotImplementedError) */
      dt_plan_entry e3[1];
      int n3 = 0;
      put(e3, &n3, "norm", colwise(dt_replicate(), dt_shard(-1), true));
      TU_CHECK(dt_parallelize_module(ctx, m, 0, e3, n3) == DT_ERR_UNSUPPORTED,
               "Colwise on a norm must be refused");
      TU_CHECK(dt_parallelize_module(ctx, m, 3, e3, 0) == DT_ERR_INVALID, "bad mesh dim");
      /* no release: dt_model_free frees the hook states itself (the live bytes
       * return to what they were before the model was created) */
    }
  }
  size_t live = ctx->mem.host_cur;
  size_t states = 0;
  for (int i = 0; m && i < m->n_mods; i++) states += m->mods[i].hook_state ? 1 : 0;
  TU_CHECK(states == 3, "3 modules (w1, w3, tok_embeddings) keep hook states before the free, not %zu",
           states);
  dt_model_free(ctx, m);
  TU_CHECK(ctx->mem.host_cur < live && ctx->mem.host_cur == mem_before_models,
           "dt_model_free leaves %zu live bytes (%zu before the models)", ctx->mem.host_cur,
           mem_before_models);
  dt_mesh_free(mesh);
  return DT_OK;
}

/* ---- main ------------------------------------------------------------------------------ */

static dt_status launch(dt_backend b, int world, dt_spmd_fn fn, void *arg) {
  dt_launch_opts o;
  memset(&o, 0, sizeof o);
  o.backend = b;
  o.world = world;
  o.timeout_s = 120; /* a hang is a failure, well before the suite's timeout */
  o.device = DT_DEV_CPU;
  dt_launch_report rep;
  memset(&rep, 0, sizeof rep);
  double t0 = dt_now();
  dt_status s = dt_launch(&o, fn, arg, &rep);
  TU_CHECK(s == DT_OK, "dt_launch(%s, %d) -> %s: rank %d: %s", dt_backend_name(b), world,
           dt_status_str(s), rep.failed_rank, rep.failed_msg);
  if (b == DT_BACKEND_THREADS || rep.first_rank == 0)
    printf("test_parallel: %s world %d: %.2f s\n", dt_backend_name(b), rep.world, dt_now() - t0);
  dt_launch_report_free(&rep);
  return s;
}

int main(int argc, char **argv) {
  tu_opts o;
  tu_parse(argc, argv, &o); /* exits 77 when the backend is not built */
  if (o.backend == DT_BACKEND_MPI) {
    job jb = {mpi_cases, (int)(sizeof mpi_cases / sizeof mpi_cases[0])};
    dt_status s = launch(DT_BACKEND_MPI, 0, run_rank, &jb);
    int rc = tu_finish("test_parallel (mpi)");
    dt_mpi_finish(s == DT_OK);
    return rc;
  }
  /* the dp counts of expected(): the whole model in f64 fits DDP's first bucket */
  dt_llama_config cfg = tiny_config();
  TU_CHECK(dt_llama_nparams(&cfg) == 115008 &&
               dt_llama_nparams(&cfg) * 8 < DT_DDP_FIRST_BUCKET_BYTES,
           "tiny model: %lld parameters; expected() assumes 115008 f64 in one DDP bucket",
           (long long)dt_llama_nparams(&cfg));
  launch(DT_BACKEND_THREADS, 2, run_units, NULL);
  job jb = {threads_cases, (int)(sizeof threads_cases / sizeof threads_cases[0])};
  launch(DT_BACKEND_THREADS, 2, run_rank, &jb);
  launch(DT_BACKEND_THREADS, 4, run_rank, &jb);
  return tu_finish("test_parallel");
}
