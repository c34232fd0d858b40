/* verify/test_baselines.c: the analytic numbers of bench/harness/baselines.h.
 *
 * 1. Framework formulas against counts derived here by hand (below), for a tiny
 *    config: Megatron-LM TP and TP + sequence parallel, DDP, FSDP, HSDP, ZeRO,
 *    the PP bubbles, and the framework selection from a plan's settings (a plan
 *    renamed, or given another plan's name, gets the baseline of its settings).
 * 2. REGRESSION check, not an independent oracle: the measured TP ledger of the
 *    shipped plans equals the runtime's own closed form (sb_runtime_comm_compute)
 *    byte for byte, term by term. It pins the runtime's comm to its documented
 *    derivation; a change in either shows here.
 * 3. Measured bars against the framework crosses: where the runtime moves more
 *    than the papers count (the loss-parallel scalars, the norm weights'
 *    gradients, the output layer's input-gradient all-reduce) the bar is above
 *    its cross; where it moves less (sequence parallel: it keeps each gathered
 *    block input for backward instead of gathering the stored shard again, as
 *    Korthikanti et al. 2022 sec. 4.2.2 do) it is below. The difference must
 *    equal those named terms, computed here from their sizes.
 *
 * Model: the tiny Llama of verify/test_parallel.c: dim h 64, 8 heads of 8, 4 kv
 * heads, vocab V 128, ffn hidden 192 (int(2*4*64/3) = 170, up to a multiple of
 * 32), batch b 4, seq s 8, f64 (e 8 bytes), L 1 or 2 layers.
 *
 * Hand counts (L 2, t 2; ring: AR 2(t-1)/t = 1 x S, AG / RS (t-1)/t = 1/2 x S):
 *   act = b*s*h*e = 4*8*64*8 = 16384 bytes; AR(act) 16384, AG(act) 8192.
 *   Megatron-LM TP, its layout (1909.08053 sec. 3): 2 AR per split block, 2
 *     blocks per layer: 8 AR = 131072; + embedding AR 16384 = 147456. Unfused
 *     logits AG: b*s*V*e/2 = 4*8*128*8/2 = 16384.
 *   TP + SP (2205.05198 sec. 4.2.2): per block 3 AG + 2 RS = 5 x 8192, 4 blocks:
 *     163840; + embedding 16384 = 180224.
 *   Parameters: embedding and output 128*64 = 8192 each; per layer wq 64*64 =
 *     4096, wk and wv 64*32 = 2048 each, wo 4096, w1 w2 w3 64*192 = 12288 each,
 *     two norms of 64; final norm 64. Split over tp (Megatron's layout, norms
 *     whole): 8192 + 8192 + 2*(12288 + 36864) = 114688; whole: 5*64 = 320. One
 *     rank at t 2: 114688/2 + 320 = 57664 parameters = 461312 bytes = Psi.
 *   DDP over dp_replicate 2 (2006.15704 sec. 3): AR 2 Psi (d-1)/d = 461312.
 *   FSDP over dp_shard 2 (2304.11277 sec. 3.2): 3 Psi (F-1)/F = 691968.
 *   HSDP dp_shard 2 x dp_replicate 2: 691968 + AR of Psi/2 over 2 = 922624.
 *   ZeRO-1 over d 2 (1910.02054 sec. 7.2.1): 2 Psi (d-1)/d = 461312.
 *   PP bubble (8B, p 4, m 8, v 2): GPipe / 1F1B (p-1)/(m+p-1) = 3/11;
 *     interleaved (p-1)/(vm+p-1) = 3/19.
 * The values are sums of exact binary fractions: compared with ==.
 */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../bench/harness/baselines.h"
#include "../bench/harness/verdict.h"
#include "testutil.h"

enum { BATCH = 4, SEQ = 8, DIM = 64, VOCAB = 128 }; /* as verify/test_parallel.c */
static const uint64_t SEED = 20260101;              /* any fixed seed */
/* Measured and closed-form bytes are both sums of exact binary fractions of
 * integers (group sizes 2 and 4, the only ones run here), so their ratio is 1
 * exactly (measured: 0); 1e-12 leaves room for a non-power-of-two group's
 * rounding (about 1e-16 per term over a few thousand terms) should one be added. */
static const double RATIO_TOL = 1e-12;

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

static sb_baseline_in tiny_in(int layers, int tp, int dp_replicate, int dp_shard) {
  sb_baseline_in in;
  memset(&in, 0, sizeof in);
  in.model = tiny_config(layers);
  in.pp = in.cp = 1;
  in.tp = tp;
  in.dp_replicate = dp_replicate;
  in.dp_shard = dp_shard;
  in.batch = (int64_t)BATCH * dp_replicate * dp_shard; /* b = 4 per DP rank */
  in.seq = SEQ;
  in.elem_bytes = 8; /* f64 */
  in.microbatches = in.virtual_stages = 1;
  return in;
}

static const char *plan_path(const char *plan, char *buf, size_t n) {
  char file[96];
  snprintf(file, sizeof file, "%s.plan", plan);
  return tu_plan_path(file, buf, n);
}

/* Parses plan text (a file's, maybe edited) into *p with a host context. */
static int parse_plan(const char *text, const char *path, dt_plan *p) {
  dt_ctx hc;
  dt_ctx_init(&hc, 0, 1);
  dt_status s = dt_plan_parse(&hc, text, path, p);
  TU_CHECK(s == DT_OK, "parse %s: %s", path, dt_last_error(&hc));
  dt_ctx_release(&hc);
  return s == DT_OK ? 0 : -1;
}

/* The traits of a shipped plan for the tiny model with L layers. */
static int shipped_traits(const char *plan, int layers, sb_plan_traits *tr) {
  char path[512];
  char *text = tu_slurp(plan_path(plan, path, sizeof path));
  TU_CHECK(text != NULL, "cannot read %s", path);
  dt_plan *p = calloc(1, sizeof *p);
  int rc = -1;
  if (text && p && parse_plan(text, path, p) == 0) {
    dt_llama_config c = tiny_config(layers);
    sb_plan_traits_get(p, &c, tr);
    rc = 0;
  }
  free(p);
  free(text);
  return rc;
}

/* ---- verifiers (each shown to fail on a planted difference in self_checks) ---- */

static bool ratio_ok(double want, double got) {
  double ratio = want != 0 ? got / want : (got == 0 ? 1.0 : INFINITY);
  return fabs(ratio - 1.0) <= RATIO_TOL;
}

/* +1 above the cross, -1 below, 0 on it (within RATIO_TOL). */
static int side(double bar, double cross) {
  if (ratio_ok(cross, bar)) return 0;
  return bar > cross ? 1 : -1;
}

static void self_checks(void) {
  TU_CHECK(!ratio_ok(147456, 147456 + 1), "ratio_ok accepts a 1-byte difference in 147456");
  TU_CHECK(!ratio_ok(0, 1), "ratio_ok accepts 1 byte where 0 is expected");
  TU_CHECK(ratio_ok(147456, 147456) && ratio_ok(0, 0), "ratio_ok rejects equal values");
  TU_CHECK(side(2, 1) == 1 && side(1, 2) == -1 && side(3, 3) == 0, "side() is wrong");
}

/* ---- 1. framework formulas against the hand counts ---- */

static double row_value(const sb_baseline_row *rows, int n, const char *fw, const char *q) {
  for (int i = 0; i < n; i++)
    if (!strcmp(rows[i].framework, fw) && !strcmp(rows[i].quantity, q)) return rows[i].value;
  TU_CHECK(0, "no row %s %s", fw, q);
  return NAN;
}

static void check_eq(const char *what, double got, double want) {
  printf("  %-50s %14.1f  (hand %.1f)\n", what, got, want);
  TU_CHECK(got == want, "%s: %.17g, hand count %.17g", what, got, want);
}

static void framework_checks(void) {
  printf("framework formulas, tiny config (L 2, t 2, b 4, s 8, h 64, V 128, f64):\n");
  sb_baseline_in in = tiny_in(2, 2, 1, 1);
  sb_baseline_row rows[SB_BASELINE_MAX_ROWS];
  int n = sb_baseline_compute(&in, rows, SB_BASELINE_MAX_ROWS);
  TU_CHECK(n > 0 && n < SB_BASELINE_MAX_ROWS, "row count %d", n);
  check_eq("megatron-tp comm_bytes_per_layer", row_value(rows, n, "megatron-tp",
           "comm_bytes_per_layer"), 65536);
  check_eq("megatron-tp comm_bytes_per_step", row_value(rows, n, "megatron-tp",
           "comm_bytes_per_step"), 147456);
  check_eq("megatron-tp comm_bytes_logits_unfused", row_value(rows, n, "megatron-tp",
           "comm_bytes_logits_unfused"), 16384);
  check_eq("megatron-tp-sp comm_bytes_per_layer", row_value(rows, n, "megatron-tp-sp",
           "comm_bytes_per_layer"), 65536);
  check_eq("megatron-tp-sp comm_bytes_per_layer_stored_shard",
           row_value(rows, n, "megatron-tp-sp", "comm_bytes_per_layer_stored_shard"), 81920);
  check_eq("megatron-tp-sp comm_bytes_per_step", row_value(rows, n, "megatron-tp-sp",
           "comm_bytes_per_step"), 180224);

  sb_plan_traits meg;
  sb_plan_traits_megatron(&in.model, false, &meg);
  check_eq("params per rank (t 2, Megatron layout)", sb_params_per_rank(&in, &meg), 57664);
  sb_baseline_in dp = tiny_in(2, 2, 2, 1), fs = tiny_in(2, 2, 1, 2), hs = tiny_in(2, 2, 2, 2);
  n = sb_baseline_compute(&dp, rows, SB_BASELINE_MAX_ROWS);
  check_eq("ddp comm_bytes_per_step (dp_replicate 2)", row_value(rows, n, "ddp",
           "comm_bytes_per_step"), 461312);
  check_eq("zero1 comm_bytes_per_step (d 2)", row_value(rows, n, "zero1", "comm_bytes_per_step"),
           461312);
  check_eq("zero3 comm_bytes_per_step (d 2)", row_value(rows, n, "zero3", "comm_bytes_per_step"),
           691968);
  sb_framework_comm c;
  TU_CHECK(sb_framework_comm_compute(&dp, &meg, &c) == 0, "framework dp");
  check_eq("plan-selected dp part, dp_replicate 2 (ddp)", c.dp, 461312);
  TU_CHECK(!strcmp(c.name, "megatron-tp+ddp"), "name '%s'", c.name);
  check_eq("  + tp part = combined", c.total, 147456 + 461312);
  TU_CHECK(sb_framework_comm_compute(&fs, &meg, &c) == 0, "framework fsdp");
  check_eq("plan-selected dp part, dp_shard 2 (fsdp)", c.dp, 691968);
  TU_CHECK(!strcmp(c.dp_framework, "fsdp"), "dp framework '%s'", c.dp_framework);
  TU_CHECK(sb_framework_comm_compute(&hs, &meg, &c) == 0, "framework hsdp");
  check_eq("plan-selected dp part, 2 x 2 (hsdp)", c.dp, 922624);
  TU_CHECK(!strcmp(c.dp_framework, "hsdp"), "dp framework '%s'", c.dp_framework);

  /* PP bubbles of the 8B model: p 4, m 8, v 2 */
  sb_baseline_in pp;
  memset(&pp, 0, sizeof pp);
  TU_CHECK(dt_llama_config_get(NULL, "8B", &pp.model) == DT_OK, "8B config");
  pp.pp = 4;
  pp.dp_replicate = pp.dp_shard = pp.cp = 1;
  pp.tp = 8;
  pp.batch = 8;
  pp.seq = 8192;
  pp.elem_bytes = 2;
  pp.microbatches = 8;
  pp.virtual_stages = 2;
  n = sb_baseline_compute(&pp, rows, SB_BASELINE_MAX_ROWS);
  /* (p-1)/(m+p-1) and its /v form: one division of small integers each side,
   * correctly rounded both times, so equal to within an ulp of 0.27 (5.6e-17). */
  TU_CHECK(fabs(row_value(rows, n, "gpipe", "bubble_fraction") - 3.0 / 11.0) < 1e-15, "gpipe");
  TU_CHECK(fabs(row_value(rows, n, "1f1b", "bubble_fraction") - 3.0 / 11.0) < 1e-15, "1f1b");
  TU_CHECK(fabs(row_value(rows, n, "interleaved", "bubble_fraction") - 3.0 / 19.0) < 1e-15,
           "interleaved");
  pp.batch = 7; /* not divisible by dp 2: refused */
  pp.dp_shard = 2;
  char err[128];
  TU_CHECK(sb_baseline_check(&pp, err, sizeof err) != 0, "batch 7 on dp 2 must be refused");
}

/* The framework follows the settings, not the name: each shipped plan's text
 * with its name replaced by another plan's gives the same traits and baseline. */
static void name_checks(void) {
  static const struct {
    const char *plan, *rename, *want;
  } cases[3] = {{"megatron-tp", "torchtitan-tp-sp", "megatron-tp"},
                {"torchtitan-tp-sp", "megatron-tp", "megatron-tp-sp"},
                {"tp-no-loss-parallel", "my-megatron-copy", "megatron-tp-sp"}};
  for (int k = 0; k < 3; k++) {
    char path[512];
    char *text = tu_slurp(plan_path(cases[k].plan, path, sizeof path));
    TU_CHECK(text != NULL, "cannot read %s", path);
    if (!text) continue;
    char *renamed = calloc(1, strlen(text) + 256);
    char *nl = strstr(text, "\nname");
    TU_CHECK(nl != NULL && renamed != NULL, "%s has no name line", path);
    if (nl && renamed) {
      char *eol = strchr(nl + 1, '\n');
      snprintf(renamed, strlen(text) + 256, "%.*s\nname = %s%s", (int)(nl - text), text,
               cases[k].rename, eol ? eol : "");
      dt_plan *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
      if (a && b && parse_plan(text, path, a) == 0 && parse_plan(renamed, "renamed.plan", b) == 0) {
        TU_CHECK(!strcmp(b->name, cases[k].rename), "rename did not take: '%s'", b->name);
        dt_llama_config cfg = tiny_config(2);
        sb_plan_traits ta, tb;
        sb_plan_traits_get(a, &cfg, &ta);
        sb_plan_traits_get(b, &cfg, &tb);
        TU_CHECK(!memcmp(&ta, &tb, sizeof ta), "%s renamed %s: other traits", cases[k].plan,
                 cases[k].rename);
        sb_baseline_in in = tiny_in(2, 2, 1, 1);
        sb_framework_comm ca, cb;
        TU_CHECK(sb_framework_comm_compute(&in, &ta, &ca) == 0 &&
                 sb_framework_comm_compute(&in, &tb, &cb) == 0, "framework comm");
        TU_CHECK(!strcmp(cb.name, cases[k].want) && ca.total == cb.total,
                 "%s named %s selects %s (%.0f), want %s (%.0f)", cases[k].plan, cases[k].rename,
                 cb.name, cb.total, cases[k].want, ca.total);
        printf("  %-20s named %-18s -> %s %.0f bytes\n", cases[k].plan, cases[k].rename, cb.name,
               cb.total);
      }
      free(a);
      free(b);
    }
    free(renamed);
    free(text);
  }
}

/* ---- 2 and 3: runs with the ledger on ---- */

/* Token ids: a fixed LCG (Knuth's MMIX constants), the same on every rank. */
/* Rank 0's ledger rows summed (wire bytes) by class:
 *   act        forward/backward rows on a b*s*h tensor: the blocks plus the
 *              embedding / output boundary (the same size, told apart by the
 *              layer count: per layer = act(L=2) - act(L=1), boundary =
 *              act(L=1) - per layer)
 *   logits     all_gather of the b*s*V logits (no loss parallel)
 *   loss       all_reduce of b*s scalars (loss-parallel cross-entropy)
 *   optimizer  rows in phase "optimizer" (the SP norm weights' gradients)
 *   other      anything else: must be 0 */
enum { C_ACT = 0, C_LOGITS, C_LOSS, C_OPT, C_OTHER, C_N };
static const char *const class_names[C_N] = {"act", "logits", "loss", "optimizer", "other"};

typedef struct job {
  const char *plan;
  int layers;
  double sum[C_N];    /* rank 0's wire bytes per class */
} job;

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
  char path[512];
  DT_CHECK_GOTO(dt_plan_load(ctx, plan_path(jb->plan, path, sizeof path), p), s, done);
  DT_CHECK_GOTO(dt_mesh_create(ctx, ctx->world, 1, shape, nm, &mesh), s, done);
  DT_CHECK_GOTO(dt_model_create(ctx, mesh, &cfg, DT_F64, SEED, &m), s, done);
  DT_CHECK_GOTO(dt_parallelize_module(ctx, m, 0, p->entries, p->n_entries), s, done);
  DT_CHECK_GOTO(dt_model_materialize(ctx, m), s, done);
  DT_CHECK_GOTO(sb_token_tensor(ctx, mesh, BATCH, SEQ, VOCAB, 0u, 0, 0, &tok), s, done);
  DT_CHECK_GOTO(sb_token_tensor(ctx, mesh, BATCH, SEQ, VOCAB, 0u, 0, 1, &tgt), s, done);
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

/* One regression term: prints a row and checks the ratio. */
static void compare(const char *plan, int tp, const char *term, double model, double measured) {
  double ratio = model != 0 ? measured / model : (measured == 0 ? 1.0 : INFINITY);
  printf("  %-20s tp %d  %-16s %14.1f %14.1f  %.15f\n", plan, tp, term, model, measured, ratio);
  TU_CHECK(ratio_ok(model, measured), "%s tp %d %s: measured %.17g vs runtime model %.17g", plan,
           tp, term, measured, model);
}

/* What the papers leave out or add relative to this runtime, per plan shape, for
 * L layers at group size t (ring factors as in the file comment), computed from
 * the tensors' sizes here, not from the closed form:
 *   extra: moved by the runtime, not counted by the framework formula
 *   less:  counted by the framework, not moved by the runtime */
static void paper_diff(const sb_plan_traits *tr, int L, int t, double *extra, double *less) {
  const double e = 8, act = (double)BATCH * SEQ * DIM * e;
  const double ar = 2.0 * (t - 1) / t, ag = (double)(t - 1) / t;
  *extra = *less = 0;
  if (!tr->sequence_parallel) {
    /* the output layer's input gradient is all-reduced in backward (Megatron's f
     * before a column-parallel GEMM); 1909.08053 sec. 3 does not list it */
    *extra += ar * act;
  } else {
    /* the output layer's input: AG forward, RS backward; sec. 4.2.2 covers the
     * transformer layers only */
    *extra += 2 * ag * act;
    /* the 2L+1 norm weights' gradients, Partial over the sequence shards, are
     * all-reduced (h elements each) */
    *extra += (2 * L + 1) * ar * DIM * e;
    /* Korthikanti et al. re-gather each block's stored input shard in backward:
     * 2 AG per layer the runtime does not make (it keeps the gathered input) */
    *less += 2 * L * ag * act;
  }
  /* loss parallel: 3 all-reduces of b*s f64 scalars; the paper's "b x s"
   * scalars are not counted */
  if (tr->loss_parallel) *extra += 3 * ar * BATCH * SEQ * 8;
}

/* The runtime model's cp bytes for the pass-KV ring (dp-cp: ring) in f32 and bf16,
 * derived here: X = b (S/c) h_kv hd elements of one rank's K per layer; forward
 * c - 1 sends of [K | V] (2X), backward c - 1 again plus c of the travelling
 * [dK | dV] (2X), which is f32 for bf16 data (lib/ops/attention_cp.c; PyTorch's
 * accum_dtype). So bf16 moves 2X (2 (c - 1) 2 + 4c) bytes a layer, not the
 * 2X (3c - 2) 2 a bf16 accumulator would. */
static void cp_ring_bytes_checks(void) {
  sb_plan_traits tr;
  if (shipped_traits("dp-cp", 2, &tr)) return;
  TU_CHECK(tr.cp_rotate == DT_CP_RING, "dp-cp.plan is not the ring");
  static const int cps[2] = {2, 4};
  for (int ci = 0; ci < 2; ci++)
    for (int e = 2; e <= 4; e += 2) {
      sb_baseline_in in = tiny_in(2, 1, 1, 1);
      const int c = cps[ci];
      in.cp = c;
      in.elem_bytes = e;
      sb_runtime_comm a;
      TU_CHECK(sb_runtime_comm_compute(&in, &tr, &a) == 0, "dp-cp cp %d: no runtime model", c);
      const double X = (double)BATCH * (SEQ / c) * 4 /* kv heads */ * (DIM / 8) /* head dim */;
      const double want = 2 /* layers */ * 2 * X * (2.0 * (c - 1) * e + 4.0 * c);
      TU_CHECK(a.cp == want, "dp-cp cp %d elem %d bytes: cp traffic %.17g, derived %.17g", c, e,
               a.cp, want);
      TU_CHECK(a.n_cp_send == 2 * (3 * c - 2), "dp-cp cp %d: %d sends, derived %d", c,
               a.n_cp_send, 2 * (3 * c - 2));
    }
  /* the check can fail: the bf16 accumulator's count differs */
  sb_baseline_in in = tiny_in(2, 1, 1, 1);
  in.cp = 2;
  in.elem_bytes = 2;
  sb_runtime_comm a;
  if (sb_runtime_comm_compute(&in, &tr, &a) == 0) {
    const double X = (double)BATCH * (SEQ / 2) * 4 * (DIM / 8);
    TU_CHECK(a.cp != 2 * 2 * X * (3 * 2 - 2) * 2, "cp ring bf16: the bf16-accumulator count passes");
  }
  printf("cp ring bytes (runtime model): f32 and bf16 ([dK | dV] in f32), cp 2 and 4\n");
}

int main(int argc, char **argv) {
  tu_opts o;
  tu_parse(argc, argv, &o);
  if (o.backend != DT_BACKEND_THREADS) return SB_SKIP;
  self_checks();
  framework_checks();
  printf("framework selection follows the plan's settings, not its name:\n");
  name_checks();
  cp_ring_bytes_checks();

  static const char *const plans[3] = {"megatron-tp", "torchtitan-tp-sp", "tp-no-loss-parallel"};
  static const int tps[2] = {2, 4};
  double meas[3][2][2]; /* [plan][tp][L-1]: measured whole step */
  int ran[3][2];
  memset(ran, 0, sizeof ran);
  printf("REGRESSION: rank 0's ledger vs the runtime's own closed form (wire bytes per step)\n");
  printf("  %-20s %-5s  %-16s %14s %14s  %s\n", "plan", "mesh", "term", "runtime model",
         "measured", "ratio");
  for (int pi = 0; pi < 3; pi++)
    for (int ti = 0; ti < 2; ti++) {
      job j1 = {plans[pi], 1, {0}}, j2 = {plans[pi], 2, {0}};
      if (launch(tps[ti], &j1) || launch(tps[ti], &j2)) continue;
      sb_plan_traits tr;
      if (shipped_traits(plans[pi], 2, &tr)) continue;
      sb_baseline_in in = tiny_in(2, tps[ti], 1, 1);
      sb_runtime_comm a;
      TU_CHECK(sb_runtime_comm_compute(&in, &tr, &a) == 0, "%s: no runtime model", plans[pi]);
      double per_layer = j2.sum[C_ACT] - j1.sum[C_ACT];
      double boundary = j1.sum[C_ACT] - per_layer;
      double t1 = 0, t2 = 0;
      for (int c = 0; c < C_N; c++) {
        t1 += j1.sum[c];
        t2 += j2.sum[c];
      }
      compare(plans[pi], tps[ti], "block/layer", a.block_per_layer, per_layer);
      compare(plans[pi], tps[ti], "blocks (L=2)", a.blocks, 2 * per_layer);
      compare(plans[pi], tps[ti], "emb+output", a.boundary, boundary);
      compare(plans[pi], tps[ti], "logits", a.logits, j2.sum[C_LOGITS]);
      compare(plans[pi], tps[ti], "loss", a.loss, j2.sum[C_LOSS]);
      compare(plans[pi], tps[ti], "optimizer", a.optimizer, j2.sum[C_OPT]);
      compare(plans[pi], tps[ti], "whole step", a.total, t2);
      TU_CHECK(j1.sum[C_OTHER] == 0 && j2.sum[C_OTHER] == 0, "%s tp %d: unclassified comm %s %g",
               plans[pi], tps[ti], class_names[C_OTHER], j2.sum[C_OTHER]);
      meas[pi][ti][0] = t1;
      meas[pi][ti][1] = t2;
      ran[pi][ti] = 1;
    }

  printf("measured bar vs framework cross (wire bytes per step; side: + above, - below):\n");
  printf("  %-20s %-5s %-2s %-15s %12s %12s %12s %5s\n", "plan", "mesh", "L", "framework", "cross",
         "bar", "bar-cross", "side");
  int above = 0, below = 0;
  for (int pi = 0; pi < 3; pi++)
    for (int ti = 0; ti < 2; ti++)
      for (int L = 1; L <= 2; L++) {
        if (!ran[pi][ti]) continue;
        sb_plan_traits tr;
        if (shipped_traits(plans[pi], L, &tr)) continue;
        sb_baseline_in in = tiny_in(L, tps[ti], 1, 1);
        sb_framework_comm fw;
        TU_CHECK(sb_framework_comm_compute(&in, &tr, &fw) == 0, "framework comm");
        double bar = meas[pi][ti][L - 1], extra, less;
        paper_diff(&tr, L, tps[ti], &extra, &less);
        int sd = side(bar, fw.total), want = side(extra - less, 0);
        printf("  %-20s tp %d  %d  %-15s %12.0f %12.0f %+12.0f %5s\n", plans[pi], tps[ti], L,
               fw.name, fw.total, bar, bar - fw.total, sd > 0 ? "+" : sd < 0 ? "-" : "0");
        TU_CHECK(ratio_ok(fw.total + extra - less, bar),
                 "%s tp %d L %d: bar %.17g != cross %.17g + runtime extras %.17g - paper extras "
                 "%.17g", plans[pi], tps[ti], L, bar, fw.total, extra, less);
        TU_CHECK(sd == want, "%s tp %d L %d: bar on side %d of its cross, want %d", plans[pi],
                 tps[ti], L, sd, want);
        above += sd > 0;
        below += sd < 0;
      }
  /* both directions occur: megatron-tp and one-layer sequence parallel above,
   * two-layer sequence parallel below */
  TU_CHECK(above > 0 && below > 0, "bars above %d, below %d: want both", above, below);
  return tu_finish("test_baselines");
}
