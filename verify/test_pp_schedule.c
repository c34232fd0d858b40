/* verify/test_pp_schedule.c: pipeline stage splits and schedules as data
 * (lib/parallel/pipeline.h).
 *
 * Oracles:
 *  - the stage split against a re-implementation here of TorchTitan's
 *    generate_llm_fqn_per_model_part (torchtitan/distributed/pipeline_parallel.py,
 *    v0.2.0), written as that function builds its name lists, plus literal tables;
 *  - the compute orders against literal per-rank orders of PyTorch's generators
 *    (torch/distributed/pipelining/schedules.py: ScheduleGPipe, Schedule1F1B.
 *    _step_microbatches, ScheduleInterleaved1F1B._calculate_single_rank_operations
 *    with _get_1f1b_rank_ops and _get_warmup_ops, idles dropped);
 *  - the lowering against a hand run of _add_send_recv (pp 2, m 4, 1F1B) and
 *    against counts derived here (one activation and one gradient per stage
 *    boundary that crosses ranks, per microbatch), with every SEND's RECV looked
 *    up here on the neighbour rank;
 *  - peak in-flight microbatches against min(m, pp - r) (1F1B) and m (GPipe),
 *    bubbles of the timed walk against (pp - 1) / (m + pp - 1) and
 *    (pp - 1) / (v m + pp - 1) (Narayanan et al. 2021, arXiv:2104.04473 sec. 2.2).
 * CSV files: the shipped schedules/ must load and equal the generators; the
 * round trip dump -> load is the same lists; malformed files are refused with
 * their FILE:LINE:COL messages.
 *
 * --dump-schedules DIR writes the shipped CSV files of schedules/ (the generators' output
 * through dt_pp_schedule_save). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

/* ---- small helpers ---------------------------------------------------------------- */

static int tmin(int a, int b) { return a < b ? a : b; }

/* A rank's list as "0F0 0F1 ..." (comms included when there). */
static void rank_str(const dt_pp_schedule *s, int r, char *buf, size_t n) {
  size_t at = 0;
  buf[0] = '\0';
  for (int i = 0; i < s->len[r] && at < n; i++) {
    char t[32];
    dt_pp_action_str(s->acts[r][i], t, sizeof t);
    at += (size_t)snprintf(buf + at, n - at, "%s%s", i ? " " : "", t);
  }
}

/* true when every rank's list reads as want[r] */
static bool lists_equal(const dt_pp_schedule *s, const char *const *want, int n, char *diff,
                        size_t dn) {
  if (s->pp != n) {
    snprintf(diff, dn, "%d ranks, want %d", s->pp, n);
    return false;
  }
  for (int r = 0; r < n; r++) {
    char got[8192];
    rank_str(s, r, got, sizeof got);
    if (strcmp(got, want[r]) != 0) {
      snprintf(diff, dn, "rank %d:\n   got  %s\n   want %s", r, got, want[r]);
      return false;
    }
  }
  return true;
}

/* true when the two schedules have the same actions (kind, stage, mb) in order */
static bool same_schedule(const dt_pp_schedule *a, const dt_pp_schedule *b) {
  if (a->pp != b->pp || a->n_stages != b->n_stages || a->n_microbatches != b->n_microbatches ||
      a->with_comms != b->with_comms)
    return false;
  for (int r = 0; r < a->pp; r++) {
    if (a->len[r] != b->len[r]) return false;
    for (int i = 0; i < a->len[r]; i++)
      if (a->acts[r][i].kind != b->acts[r][i].kind || a->acts[r][i].stage != b->acts[r][i].stage ||
          a->acts[r][i].mb != b->acts[r][i].mb)
        return false;
  }
  return true;
}

/* ---- stage split -------------------------------------------------------------------- */

/* TorchTitan's generate_llm_fqn_per_model_part, as it builds the name lists:
 * out[s] is stage s's names joined by ','; returns false where it raises. */
static bool titan_split(int num_stages, int num_layers, int input_weight, int output_weight,
                        char out[][512]) {
  if (num_stages < 1) return false;
  if (num_stages == 1) {
    int at = snprintf(out[0], 512, "tok_embeddings");
    for (int i = 0; i < num_layers; i++) at += snprintf(out[0] + at, 512 - (size_t)at, ",layers.%d", i);
    snprintf(out[0] + at, 512 - (size_t)at, ",norm,output");
    return true;
  }
  int num_effective_layers = num_layers + input_weight + output_weight;
  if (num_stages > num_effective_layers) return false;
  int layers_per_stage = num_effective_layers / num_stages;
  int extra_layers = num_effective_layers % num_stages;
  if (layers_per_stage == 0) return false;
  if (input_weight > layers_per_stage) return false;
  if (output_weight > layers_per_stage) return false;
  int current_layer = 0;
  for (int stage_idx = 0; stage_idx < num_stages; stage_idx++) {
    char *o = out[stage_idx];
    int at = 0;
    o[0] = '\0';
    int effective_layers_for_stage = layers_per_stage + (stage_idx < extra_layers ? 1 : 0);
    int remaining = effective_layers_for_stage;
    if (stage_idx == 0) {
      at += snprintf(o + at, 512 - (size_t)at, "tok_embeddings");
      remaining -= input_weight;
    } else if (stage_idx == num_stages - 1) {
      remaining -= output_weight;
    }
    for (int k = 0; k < remaining; k++)
      if (current_layer < num_layers)
        at += snprintf(o + at, 512 - (size_t)at, "%slayers.%d", at ? "," : "", current_layer++);
    if (stage_idx == num_stages - 1 && stage_idx != 0)
      snprintf(o + at, 512 - (size_t)at, "%snorm,output", at ? "," : "");
  }
  return true;
}

static void check_split_table(dt_ctx *ctx, int layers, int stages, const char *const *want) {
  dt_pp_layout l;
  TU_OK(ctx, dt_pp_split(ctx, layers, stages, 1, 1, &l));
  for (int s = 0; s < stages; s++) {
    char got[512];
    dt_pp_stage_fqns(&l, s, got, sizeof got);
    TU_CHECK(!strcmp(got, want[s]), "split %d layers / %d stages, stage %d: '%s', want '%s'", layers,
             stages, s, got, want[s]);
  }
}

static void check_split(dt_ctx *ctx) {
  /* TorchTitan's split of 6 layers (the debugmodel), 1 stage per rank, worked out
   * from the published algorithm: E = 8; pp 2: per 4; pp 3: per 2, extra 2; pp 4: per 2. */
  const char *pp2[] = {"tok_embeddings,layers.0,layers.1,layers.2", "layers.3,layers.4,layers.5,norm,output"};
  const char *pp3[] = {"tok_embeddings,layers.0,layers.1", "layers.2,layers.3,layers.4",
                       "layers.5,norm,output"};
  const char *pp4[] = {"tok_embeddings,layers.0", "layers.1,layers.2", "layers.3,layers.4",
                       "layers.5,norm,output"};
  /* interleaved, 2 stages per rank on pp 4: 8 stages, per 1: the ends hold no block */
  const char *st8[] = {"tok_embeddings", "layers.0", "layers.1", "layers.2",
                       "layers.3",       "layers.4", "layers.5", "norm,output"};
  /* uneven: 5 layers on 2 stages (E 7, per 3, extra 1); 7 layers on 3 (E 9, per 3) */
  const char *u52[] = {"tok_embeddings,layers.0,layers.1,layers.2", "layers.3,layers.4,norm,output"};
  const char *u73[] = {"tok_embeddings,layers.0,layers.1", "layers.2,layers.3,layers.4",
                       "layers.5,layers.6,norm,output"};
  check_split_table(ctx, 6, 2, pp2);
  check_split_table(ctx, 6, 3, pp3);
  check_split_table(ctx, 6, 4, pp4);
  check_split_table(ctx, 6, 8, st8);
  check_split_table(ctx, 5, 2, u52);
  check_split_table(ctx, 7, 3, u73);

  /* every (layers, stages, weights) in a range against the re-implementation,
   * errors included */
  int compared = 0, refused = 0;
  for (int L = 0; L <= 13; L++)
    for (int S = 1; S <= 10; S++)
      for (int wi = 0; wi <= 2; wi++)
        for (int wo = 0; wo <= 2; wo++) {
          static char want[DT_PP_MAX_STAGES][512];
          bool ok = titan_split(S, L, wi, wo, want);
          dt_pp_layout l;
          dt_status st = dt_pp_split(ctx, L, S, wi, wo, &l);
          TU_CHECK((st == DT_OK) == ok, "split L %d S %d w %d,%d: status %s, TorchTitan %s", L, S,
                   wi, wo, dt_status_str(st), ok ? "splits" : "raises");
          if (!ok) {
            refused++;
            continue;
          }
          if (st != DT_OK) continue;
          for (int s = 0; s < S; s++) {
            char got[512];
            dt_pp_stage_fqns(&l, s, got, sizeof got);
            TU_CHECK(!strcmp(got, want[s]), "split L %d S %d w %d,%d stage %d: '%s', want '%s'", L,
                     S, wi, wo, s, got, want[s]);
          }
          /* the explicit form of the same split gives the same layout */
          const char *fq[DT_PP_MAX_STAGES];
          for (int s = 0; s < S; s++) fq[s] = want[s];
          dt_pp_layout e;
          bool empty = false;
          for (int s = 0; s < S; s++) empty |= want[s][0] == '\0';
          dt_status se = dt_pp_split_fqns(ctx, L, fq, S, "t", &e);
          if (empty) {
            TU_CHECK(se == DT_ERR_INVALID, "explicit split with an empty stage accepted");
          } else {
            TU_OK(ctx, se);
            bool same = se == DT_OK && e.n_stages == l.n_stages && e.n_layers == l.n_layers;
            for (int s = 0; same && s < S; s++)
              same = e.stages[s].first_layer == l.stages[s].first_layer &&
                     e.stages[s].n_layers == l.stages[s].n_layers &&
                     e.stages[s].embedding == l.stages[s].embedding &&
                     e.stages[s].head == l.stages[s].head;
            TU_CHECK(same, "explicit split differs L %d S %d", L, S);
          }
          compared++;
        }
  TU_CHECK(compared > 500 && refused > 100, "split sweep compared %d, refused %d", compared, refused);

  /* the error messages */
  struct {
    int L, S, wi, wo;
    const char *msg;
  } bad[] = {
      {2, 5, 1, 1, "5 stages cannot be more than the 4 effective layers"},
      {6, 4, 3, 1, "first stage weight 3 exceeds the minimum layers per stage (2)"},
      {6, 4, 1, 3, "last stage weight 3 exceeds the minimum layers per stage (2)"},
      {6, 0, 1, 1, "0 stages"},
      {-1, 2, 1, 1, "-1 layers"},
      {6, 2, -1, 1, "weights -1, 1"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    dt_pp_layout l;
    dt_status st = dt_pp_split(ctx, bad[i].L, bad[i].S, bad[i].wi, bad[i].wo, &l);
    TU_CHECK(st == DT_ERR_INVALID && strstr(dt_last_error(ctx), bad[i].msg),
             "split %zu: %s: '%s', want '%s'", i, dt_status_str(st), dt_last_error(ctx), bad[i].msg);
  }

  /* explicit splits: the errors, each naming the stage and module */
  struct {
    int n;
    const char *fq[4];
    const char *msg;
  } ebad[] = {
      {2, {"tok_embeddings,layers.0,layers.1,layers.2", "layers.2,layers.3,layers.4,layers.5,norm,output"},
       "p.plan:3: stage 1: layers.2 again (expected layers.3"},
      {2, {"tok_embeddings,layers.0,layers.1", "layers.3,layers.4,layers.5,norm,output"},
       "stage 1: layers.3 out of order (expected layers.2"},
      {2, {"tok_embeddings,layers.0,layers.2,layers.1", "layers.3,layers.4,layers.5,norm,output"},
       "stage 0: layers.2 out of order"},
      {2, {"layers.0,layers.1,layers.2", "tok_embeddings,layers.3,layers.4,layers.5,norm,output"},
       "stage 0: layers.0 before tok_embeddings"},
      {2, {"tok_embeddings,layers.0,layers.1,layers.2,norm", "layers.3,layers.4,layers.5,output"},
       "stage 0: norm must be in the last stage (1)"},
      {2, {"tok_embeddings,layers.0,layers.1,layers.2", "layers.3,layers.4,norm,output"},
       "stage 1: norm before layers.5"},
      {2, {"tok_embeddings,layers.0,layers.1,layers.2", "layers.3,layers.4,layers.5,norm"},
       "the last stage (1) must end with norm, output"},
      {2, {"tok_embeddings,layers.0,layers.1,layers.2", "layers.3,layers.4,layers.5,output,norm"},
       "stage 1: output before norm"},
      {2, {"tok_embeddings,layers.0,layer.1,layers.2", "layers.3,layers.4,layers.5,norm,output"},
       "stage 0: 'layer.1' is not tok_embeddings, layers.N, norm or output"},
      {2, {"tok_embeddings,layers.0,layers.1,layers.2", "layers.3,layers.4,layers.5,layers.6,norm,output"},
       "stage 1: layers.6, the model has 6 layers"},
      {3, {"tok_embeddings,layers.0,layers.1,layers.2", "", "layers.3,layers.4,layers.5,norm,output"},
       "stage 1 holds no module"},
      {2, {"tok_embeddings,layers.0,,layers.1,layers.2", "layers.3,layers.4,layers.5,norm,output"},
       "stage 0: empty module name"},
      {2, {"tok_embeddings,layers.0,layers.1,layers.2", "layers.3,layers.4,layers.5,norm,output,"},
       "stage 1: empty module name"},
  };
  for (size_t i = 0; i < sizeof ebad / sizeof ebad[0]; i++) {
    dt_pp_layout l;
    dt_status st = dt_pp_split_fqns(ctx, 6, ebad[i].fq, ebad[i].n, "p.plan:3", &l);
    TU_CHECK(st == DT_ERR_INVALID && strstr(dt_last_error(ctx), ebad[i].msg),
             "explicit %zu: %s: '%s', want '%s'", i, dt_status_str(st), dt_last_error(ctx),
             ebad[i].msg);
  }
  /* spaces around names are fine, and an explicit uneven split is kept as given */
  const char *ok2[] = {" tok_embeddings , layers.0 ",
                       "layers.1,layers.2,layers.3,layers.4,layers.5, norm,output"};
  dt_pp_layout l;
  TU_OK(ctx, dt_pp_split_fqns(ctx, 6, ok2, 2, NULL, &l));
  TU_CHECK(l.stages[0].embedding && l.stages[0].n_layers == 1 && l.stages[1].first_layer == 1 &&
               l.stages[1].n_layers == 5 && l.stages[1].head && !l.stages[0].head,
           "explicit uneven split");

  /* loop placement */
  TU_CHECK(dt_pp_stage_rank(5, 4) == 1 && dt_pp_stage_rank(3, 4) == 3 && dt_pp_stage_rank(4, 4) == 0,
           "loop placement");
  int v = 0;
  TU_OK(ctx, dt_pp_stages_per_rank(ctx, 8, 4, &v));
  TU_CHECK(v == 2, "8 stages over pp 4: v %d", v);
  TU_CHECK(dt_pp_stages_per_rank(ctx, 6, 4, &v) == DT_ERR_INVALID &&
               strstr(dt_last_error(ctx), "6 stages do not divide evenly over pp 4"),
           "6 stages over pp 4: '%s'", dt_last_error(ctx));
}

/* ---- generators ------------------------------------------------------------------- */

/* The literal per-rank compute orders PyTorch's generators give
 * (torch/distributed/pipelining/schedules.py; Schedule1F1B as its
 * _step_microbatches runs it, ScheduleInterleaved1F1B from
 * _calculate_single_rank_operations with the idle slots dropped). */
static const char *const k_gpipe_2_4[] = {"0F0 0F1 0F2 0F3 0B0 0B1 0B2 0B3",
                                          "1F0 1F1 1F2 1F3 1B0 1B1 1B2 1B3"};
static const char *const k_1f1b_2_4[] = {"0F0 0F1 0B0 0F2 0B1 0F3 0B2 0B3",
                                         "1F0 1B0 1F1 1B1 1F2 1B2 1F3 1B3"};
static const char *const k_1f1b_4_8[] = {
    "0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0F6 0B3 0F7 0B4 0B5 0B6 0B7",
    "1F0 1F1 1F2 1B0 1F3 1B1 1F4 1B2 1F5 1B3 1F6 1B4 1F7 1B5 1B6 1B7",
    "2F0 2F1 2B0 2F2 2B1 2F3 2B2 2F4 2B3 2F5 2B4 2F6 2B5 2F7 2B6 2B7",
    "3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5 3F6 3B6 3F7 3B7"};
static const char *const k_il_2_4_2[] = {
    "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3",
    "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3"};
static const char *const k_il_4_8_2[] = {
    "0F0 0F1 0F2 0F3 4F0 4F1 4F2 4F3 0F4 0F5 0F6 4B0 0F7 4B1 4F4 4B2 4F5 4B3 4F6 0B0 4F7 0B1 0B2 "
    "0B3 4B4 4B5 4B6 4B7 0B4 0B5 0B6 0B7",
    "1F0 1F1 1F2 1F3 5F0 5F1 5F2 5F3 1F4 5B0 1F5 5B1 1F6 5B2 1F7 5B3 5F4 1B0 5F5 1B1 5F6 1B2 5F7 "
    "1B3 5B4 5B5 5B6 5B7 1B4 1B5 1B6 1B7",
    "2F0 2F1 2F2 2F3 6F0 6F1 6F2 6B0 6F3 6B1 2F4 6B2 2F5 6B3 2F6 2B0 2F7 2B1 6F4 2B2 6F5 2B3 6F6 "
    "6B4 6F7 6B5 6B6 6B7 2B4 2B5 2B6 2B7",
    "3F0 3F1 3F2 3F3 7F0 7B0 7F1 7B1 7F2 7B2 7F3 7B3 3F4 3B0 3F5 3B1 3F6 3B2 3F7 3B3 7F4 7B4 7F5 "
    "7B5 7F6 7B6 7F7 7B7 3B4 3B5 3B6 3B7"};

static void check_order(dt_ctx *ctx, dt_pp_schedule_kind k, int pp, int v, int m,
                        const char *const *want) {
  dt_pp_schedule s;
  TU_OK(ctx, dt_pp_schedule_generate(ctx, k, pp, v, m, &s));
  char diff[20000];
  TU_CHECK(lists_equal(&s, want, pp, diff, sizeof diff), "%s pp %d v %d m %d: %s",
           dt_pp_schedule_kind_str(k), pp, v, m, diff);
  TU_CHECK(!s.with_comms && s.n_stages == pp * v && s.n_microbatches == m, "%s header",
           dt_pp_schedule_kind_str(k));
  dt_pp_schedule_free(ctx, &s);
}

static void check_generators(dt_ctx *ctx) {
  check_order(ctx, DT_PP_GPIPE, 2, 1, 4, k_gpipe_2_4);
  check_order(ctx, DT_PP_1F1B, 2, 1, 4, k_1f1b_2_4);
  check_order(ctx, DT_PP_1F1B, 4, 1, 8, k_1f1b_4_8);
  check_order(ctx, DT_PP_INTERLEAVED_1F1B, 2, 2, 4, k_il_2_4_2);
  check_order(ctx, DT_PP_INTERLEAVED_1F1B, 4, 2, 8, k_il_4_8_2);

  /* the comparison can fail: one swapped pair */
  {
    dt_pp_schedule s;
    TU_OK(ctx, dt_pp_schedule_generate(ctx, DT_PP_1F1B, 2, 1, 4, &s));
    dt_pp_action t = s.acts[0][2];
    s.acts[0][2] = s.acts[0][3];
    s.acts[0][3] = t;
    char diff[2000];
    TU_CHECK(!lists_equal(&s, k_1f1b_2_4, 2, diff, sizeof diff), "swapped order not detected");
    dt_pp_schedule_free(ctx, &s);
  }

  /* refused conditions, before any work */
  struct {
    dt_pp_schedule_kind k;
    int pp, v, m;
    const char *msg;
  } bad[] = {
      {DT_PP_1F1B, 4, 1, 3, "1F1B: 3 microbatches must be >= the 4 stages"},
      {DT_PP_1F1B, 2, 2, 4, "1F1B is a single-stage schedule: 2 stages per rank"},
      {DT_PP_GPIPE, 2, 2, 4, "GPipe is a single-stage schedule"},
      {DT_PP_INTERLEAVED_1F1B, 2, 1, 4, "Interleaved1F1B is a multi-stage schedule: 1 stages per rank"},
      {DT_PP_INTERLEAVED_1F1B, 4, 2, 9, "9 microbatches must be a multiple of the 2 rounds"},
      {DT_PP_INTERLEAVED_1F1B, 3, 2, 7, "7 microbatches must be a multiple of the 2 rounds"},
      {DT_PP_GPIPE, 0, 1, 4, "GPipe: pp 0"},
      {DT_PP_GPIPE, 2, 1, 0, "GPipe: 0 microbatches"},
      {DT_PP_CSV, 2, 1, 4, "not a built-in schedule"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    dt_pp_schedule s;
    dt_status st = dt_pp_schedule_generate(ctx, bad[i].k, bad[i].pp, bad[i].v, bad[i].m, &s);
    TU_CHECK(st == DT_ERR_INVALID && strstr(dt_last_error(ctx), bad[i].msg) && s.len[0] == 0,
             "generate %zu: %s '%s', want '%s'", i, dt_status_str(st), dt_last_error(ctx), bad[i].msg);
  }
  /* pp 4 allows m 10 (rounds 2) and m 3 (rounds 1), as ScheduleInterleaved1F1B's docstring says */
  dt_pp_schedule s;
  TU_OK(ctx, dt_pp_schedule_generate(ctx, DT_PP_INTERLEAVED_1F1B, 4, 2, 10, &s));
  dt_pp_schedule_free(ctx, &s);
  TU_OK(ctx, dt_pp_schedule_generate(ctx, DT_PP_INTERLEAVED_1F1B, 4, 2, 3, &s));
  dt_pp_schedule_free(ctx, &s);

  dt_pp_schedule_kind k;
  TU_OK(ctx, dt_pp_schedule_kind_parse(ctx, "interleaved1f1b", &k));
  TU_CHECK(k == DT_PP_INTERLEAVED_1F1B, "kind parse");
  TU_CHECK(dt_pp_schedule_kind_parse(ctx, "1f1bb", &k) == DT_ERR_INVALID &&
               strstr(dt_last_error(ctx), "unknown pipeline schedule '1f1bb' (GPipe, 1F1B, Interleaved1F1B)"),
           "kind parse error: '%s'", dt_last_error(ctx));
}

/* ---- lowering, counts, in-flight, bubbles -------------------------------------------- */

/* _add_send_recv run by hand on the 1F1B pp 2 m 4 compute order (ranks swept in
 * order, one action each per sweep; the RECV goes to the receiver's list when
 * the sender's compute is taken). */
static const char *const k_1f1b_2_4_comms[] = {
    "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0F2 0SEND_F2 0RECV_B1 0B1 0F3 0SEND_F3 0RECV_B2 0B2 "
    "0RECV_B3 0B3",
    "1RECV_F0 1F0 1RECV_F1 1B0 1SEND_B0 1F1 1RECV_F2 1B1 1SEND_B1 1F2 1RECV_F3 1B2 1SEND_B2 1F3 "
    "1B3 1SEND_B3"};

/* Every SEND has exactly one RECV of the same microbatch on the rank of the
 * neighbouring stage, and every RECV one SEND; the count of SENDs. */
static long check_pairs(const dt_pp_schedule *s, const char *what) {
  long sends = 0;
  for (int r = 0; r < s->pp; r++)
    for (int i = 0; i < s->len[r]; i++) {
      dt_pp_action a = s->acts[r][i];
      dt_pp_kind want;
      int peer_stage;
      switch (a.kind) {
      case DT_PP_SEND_F: want = DT_PP_RECV_F; peer_stage = a.stage + 1; break;
      case DT_PP_SEND_B: want = DT_PP_RECV_B; peer_stage = a.stage - 1; break;
      case DT_PP_RECV_F: want = DT_PP_SEND_F; peer_stage = a.stage - 1; break;
      case DT_PP_RECV_B: want = DT_PP_SEND_B; peer_stage = a.stage + 1; break;
      default: continue;
      }
      if (a.kind == DT_PP_SEND_F || a.kind == DT_PP_SEND_B) sends++;
      int pr = peer_stage % s->pp, found = 0;
      TU_CHECK(pr != r, "%s: rank %d action %d talks to itself", what, r, i);
      for (int j = 0; j < s->len[pr]; j++)
        found += s->acts[pr][j].kind == want && s->acts[pr][j].stage == peer_stage &&
                 s->acts[pr][j].mb == a.mb;
      TU_CHECK(found == 1, "%s: rank %d action %d: %d matching %s on rank %d", what, r, i, found,
               dt_pp_kind_str(want), pr);
    }
  return sends;
}

static void check_lowering(dt_ctx *ctx) {
  dt_pp_schedule s;
  TU_OK(ctx, dt_pp_schedule_generate(ctx, DT_PP_1F1B, 2, 1, 4, &s));
  TU_OK(ctx, dt_pp_schedule_lower(ctx, &s));
  char diff[4000];
  TU_CHECK(s.with_comms && lists_equal(&s, k_1f1b_2_4_comms, 2, diff, sizeof diff),
           "1F1B pp 2 m 4 lowered: %s", diff);
  /* the timed walks of these lists, by hand (F 1, B 2): waiting at the use,
   * rank 1 runs F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7] F2 [7,8] B2 [8,10] F3
   * [10,11] B3 [11,13] and rank 0 ends with B3 [13,15]: 15 = 3 (m + pp - 1).
   * Blocking at the RECV, rank 1 waits at 1RECV_F2 for 0F2 (sent at 7) before
   * it may run B1, and so on: rank 0 ends with 0B3 [17,19]. */
  {
    dt_pp_stats a, b;
    TU_OK(ctx, dt_pp_schedule_stats(ctx, &s, DT_PP_RECV_AT_USE, 1, 2, &a));
    TU_OK(ctx, dt_pp_schedule_stats(ctx, &s, DT_PP_RECV_BLOCKING, 1, 2, &b));
    TU_CHECK(a.makespan == 15 && b.makespan == 19 && a.busy[0] == 12 && b.busy[1] == 12,
             "1F1B pp 2 m 4 walks: at use %g, blocking %g", a.makespan, b.makespan);
  }
  TU_OK(ctx, dt_pp_schedule_lower(ctx, &s)); /* already lowered: unchanged */
  TU_CHECK(lists_equal(&s, k_1f1b_2_4_comms, 2, diff, sizeof diff), "lowering twice: %s", diff);
  dt_pp_schedule_free(ctx, &s);

  /* every built-in over a range: valid, counts, pairs, in-flight, bubbles */
  int n_checked = 0;
  for (int k = DT_PP_GPIPE; k <= DT_PP_INTERLEAVED_1F1B; k++)
    for (int pp = 1; pp <= 5; pp++)
      for (int v = 1; v <= 3; v++)
        for (int m = 1; m <= 2 * pp + 2; m++) {
          if ((k == DT_PP_INTERLEAVED_1F1B) != (v > 1)) continue;
          if (k == DT_PP_1F1B && m < pp) continue;
          int rounds = m / pp > 1 ? m / pp : 1;
          if (k == DT_PP_INTERLEAVED_1F1B && m % rounds) continue;
          char what[64];
          snprintf(what, sizeof what, "%s pp %d v %d m %d", dt_pp_schedule_kind_str(k), pp, v, m);
          TU_OK(ctx, dt_pp_schedule_generate(ctx, (dt_pp_schedule_kind)k, pp, v, m, &s));
          dt_pp_stats cs; /* from the compute-only lists (lowered on a copy) */
          TU_OK(ctx, dt_pp_schedule_stats(ctx, &s, DT_PP_RECV_AT_USE, 1, 2, &cs));
          TU_OK(ctx, dt_pp_schedule_lower(ctx, &s));
          TU_OK(ctx, dt_pp_schedule_validate(ctx, &s));
          long sends = check_pairs(&s, what);
          /* one activation and one gradient per crossing boundary per microbatch:
           * under loop placement every boundary of the v pp stages crosses */
          long want = pp == 1 ? 0 : 2L * (v * pp - 1) * m;
          TU_CHECK(sends == want && dt_pp_p2p_count(pp, v, m) == want, "%s: %ld sends, want %ld",
                   what, sends, want);
          dt_pp_stats st, bl;
          TU_OK(ctx, dt_pp_schedule_stats(ctx, &s, DT_PP_RECV_AT_USE, 1, 2, &st));
          TU_CHECK(!memcmp(&st, &cs, sizeof st), "%s: stats of compute-only and lowered differ", what);
          /* waiting at the RECV can only idle more than waiting at the use */
          TU_OK(ctx, dt_pp_schedule_stats(ctx, &s, DT_PP_RECV_BLOCKING, 1, 2, &bl));
          TU_CHECK(bl.makespan >= st.makespan && bl.total_sends == st.total_sends,
                   "%s: blocking makespan %g < at-use %g", what, bl.makespan, st.makespan);
          TU_CHECK(st.total_sends == want, "%s: stats sends %ld", what, st.total_sends);
          for (int r = 0; r < pp; r++) {
            int peak = k == DT_PP_GPIPE ? m : k == DT_PP_1F1B ? tmin(m, pp - r) : -1;
            if (peak >= 0)
              TU_CHECK(st.peak_in_flight[r] == peak, "%s: rank %d peak in flight %d, want %d", what,
                       r, st.peak_in_flight[r], peak);
            /* every rank computes v m forwards (1) and backwards (2) */
            TU_CHECK(st.busy[r] == 3.0 * v * m, "%s: rank %d busy %g", what, r, st.busy[r]);
          }
          /* the timed walk with t_b = 2 t_f: GPipe and 1F1B idle exactly
           * (pp - 1) / (m + pp - 1) of the step (fill and drain of pp - 1 stage
           * times each; small integers, exact in double but for the last division) */
          if (k != DT_PP_INTERLEAVED_1F1B) {
            double want_b = (double)(pp - 1) / (m + pp - 1);
            TU_CHECK(st.bubble > want_b - 1e-12 && st.bubble < want_b + 1e-12,
                     "%s: bubble %.15g, want %.15g", what, st.bubble, want_b);
            TU_CHECK(dt_pp_bubble_fraction((dt_pp_schedule_kind)k, pp, v, m) == want_b,
                     "%s: formula", what);
            TU_CHECK(st.makespan == 3.0 * (m + pp - 1), "%s: makespan %g", what, st.makespan);
          }
          dt_pp_schedule_free(ctx, &s);
          n_checked++;
        }
  TU_CHECK(n_checked > 100, "only %d schedules checked", n_checked);

  /* the in-flight check can fail: GPipe's lists against 1F1B's bound */
  TU_OK(ctx, dt_pp_schedule_generate(ctx, DT_PP_GPIPE, 4, 1, 8, &s));
  dt_pp_stats st;
  TU_OK(ctx, dt_pp_schedule_stats(ctx, &s, DT_PP_RECV_AT_USE, 1, 2, &st));
  int off = 0;
  for (int r = 0; r < 4; r++) off += st.peak_in_flight[r] != tmin(8, 4 - r);
  TU_CHECK(off == 4, "GPipe pp 4 m 8 passes the 1F1B in-flight bound on %d ranks", 4 - off);
  dt_pp_schedule_free(ctx, &s);

  /* Interleaved 1F1B: the timed walk of PyTorch's order (per-stage times 1/v
   * and 2/v of a single-stage schedule's) against (pp - 1) / (v m + pp - 1) */
  struct {
    int pp, v, m;
  } il[] = {{2, 2, 4}, {4, 2, 8}, {4, 2, 4}, {2, 3, 4}, {4, 4, 8}};
  for (size_t i = 0; i < sizeof il / sizeof il[0]; i++) {
    TU_OK(ctx, dt_pp_schedule_generate(ctx, DT_PP_INTERLEAVED_1F1B, il[i].pp, il[i].v, il[i].m, &s));
    TU_OK(ctx, dt_pp_schedule_stats(ctx, &s, DT_PP_RECV_AT_USE, 1.0 / il[i].v, 2.0 / il[i].v, &st));
    double f = dt_pp_bubble_fraction(DT_PP_INTERLEAVED_1F1B, il[i].pp, il[i].v, il[i].m);
    double want_f = (double)(il[i].pp - 1) / ((double)il[i].v * il[i].m + il[i].pp - 1);
    TU_CHECK(f == want_f, "interleaved formula");
    printf("interleaved pp %d v %d m %d: walk bubble %.4f, formula %.4f\n", il[i].pp, il[i].v,
           il[i].m, st.bubble, f);
    TU_CHECK(st.bubble > f - 1e-9 && st.bubble < f + 1e-9, "interleaved pp %d v %d m %d: bubble %g, formula %g",
             il[i].pp, il[i].v, il[i].m, st.bubble, f);
    dt_pp_schedule_free(ctx, &s);
  }
  /* the published examples: pp 2 m 4: 0.2, interleaved v 2: 1/9; pp 4 m 8: 3/11, 3/19 */
  TU_CHECK(dt_pp_bubble_fraction(DT_PP_1F1B, 2, 1, 4) == 0.2 &&
               dt_pp_bubble_fraction(DT_PP_GPIPE, 2, 1, 4) == 0.2 &&
               dt_pp_bubble_fraction(DT_PP_INTERLEAVED_1F1B, 2, 2, 4) == 1.0 / 9 &&
               dt_pp_bubble_fraction(DT_PP_1F1B, 4, 1, 8) == 3.0 / 11 &&
               dt_pp_bubble_fraction(DT_PP_INTERLEAVED_1F1B, 4, 2, 8) == 3.0 / 19,
           "bubble examples");
}

/* ---- CSV ----------------------------------------------------------------------------- */

static const struct shipped {
  const char *file;
  dt_pp_schedule_kind k;
  int pp, v, m;
  bool comms;
} k_shipped[] = {
    {"gpipe-pp2-m4.csv", DT_PP_GPIPE, 2, 1, 4, false},
    {"1f1b-pp2-m4.csv", DT_PP_1F1B, 2, 1, 4, false},
    {"interleaved-pp2-m4-v2.csv", DT_PP_INTERLEAVED_1F1B, 2, 2, 4, false},
    {"gpipe-pp4-m8.csv", DT_PP_GPIPE, 4, 1, 8, false},
    {"1f1b-pp4-m8.csv", DT_PP_1F1B, 4, 1, 8, false},
    {"interleaved-pp4-m8-v2.csv", DT_PP_INTERLEAVED_1F1B, 4, 2, 8, false},
    {"1f1b-pp2-m4-comms.csv", DT_PP_1F1B, 2, 1, 4, true},
    {"interleaved-pp2-m4-v2-comms.csv", DT_PP_INTERLEAVED_1F1B, 2, 2, 4, true},
};
enum { N_SHIPPED = (int)(sizeof k_shipped / sizeof k_shipped[0]) };

static int dump_schedules(const char *dir) {
  dt_ctx ctx;
  dt_ctx_init(&ctx, 0, 1);
  int rc = 0;
  for (int i = 0; i < N_SHIPPED && rc == 0; i++) {
    const struct shipped *e = &k_shipped[i];
    dt_pp_schedule s;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, e->file);
    dt_status st = dt_pp_schedule_generate(&ctx, e->k, e->pp, e->v, e->m, &s);
    if (st == DT_OK && e->comms) st = dt_pp_schedule_lower(&ctx, &s);
    if (st == DT_OK) st = dt_pp_schedule_save(&ctx, &s, path);
    if (st != DT_OK) {
      fprintf(stderr, "test_pp_schedule: %s: %s\n", path, dt_last_error(&ctx));
      rc = 1;
    } else {
      printf("wrote %s\n", path);
    }
    dt_pp_schedule_free(&ctx, &s);
  }
  dt_ctx_release(&ctx);
  return rc;
}

static void check_shipped(dt_ctx *ctx) {
  const char *src = getenv("srcdir");
  for (int i = 0; i < N_SHIPPED; i++) {
    const struct shipped *e = &k_shipped[i];
    char path[1024];
    snprintf(path, sizeof path, "%s/schedules/%s", src && *src ? src : ".", e->file);
    dt_pp_schedule gen, gen_low, f;
    TU_OK(ctx, dt_pp_schedule_generate(ctx, e->k, e->pp, e->v, e->m, &gen));
    TU_OK(ctx, dt_pp_schedule_generate(ctx, e->k, e->pp, e->v, e->m, &gen_low));
    TU_OK(ctx, dt_pp_schedule_lower(ctx, &gen_low));
    /* the file's text is the dump of the generator's (lowered for -comms) lists */
    char *text = tu_slurp(path);
    TU_CHECK(text != NULL, "cannot read %s", path);
    if (text) {
      const dt_pp_schedule *src_s = e->comms ? &gen_low : &gen;
      int n = dt_pp_schedule_format(src_s, NULL, 0);
      char *want = malloc((size_t)n + 1);
      dt_pp_schedule_format(src_s, want, (size_t)n + 1);
      TU_CHECK(!strcmp(text, want), "%s differs from the generator's dump", path);
      free(want);
      free(text);
    }
    /* loading it (lowering the compute-only form) gives the generator's lowered lists */
    TU_OK(ctx, dt_pp_schedule_load(ctx, path, e->pp, e->pp * e->v, e->m, &f));
    TU_CHECK(same_schedule(&f, &gen_low), "%s loads to other lists than the generator's", path);
    TU_CHECK(f.kind == DT_PP_CSV && strstr(f.path, e->file), "%s: kind / path", path);
    dt_pp_schedule_free(ctx, &f);
    /* inferred sizes */
    TU_OK(ctx, dt_pp_schedule_load(ctx, path, 0, 0, 0, &f));
    TU_CHECK(f.pp == e->pp && f.n_stages == e->pp * e->v && f.n_microbatches == e->m,
             "%s: inferred pp %d stages %d m %d", path, f.pp, f.n_stages, f.n_microbatches);
    dt_pp_schedule_free(ctx, &f);
    dt_pp_schedule_free(ctx, &gen);
    dt_pp_schedule_free(ctx, &gen_low);
  }
}

static void check_round_trip(dt_ctx *ctx) {
  int n = 0;
  for (int k = DT_PP_GPIPE; k <= DT_PP_INTERLEAVED_1F1B; k++)
    for (int pp = 1; pp <= 4; pp++)
      for (int m = pp; m <= 2 * pp; m++)
        for (int lowered = 0; lowered <= 1; lowered++) {
          int v = k == DT_PP_INTERLEAVED_1F1B ? 2 : 1;
          int rounds = m / pp > 1 ? m / pp : 1;
          if (k == DT_PP_INTERLEAVED_1F1B && m % rounds) continue;
          dt_pp_schedule s, back, low;
          TU_OK(ctx, dt_pp_schedule_generate(ctx, (dt_pp_schedule_kind)k, pp, v, m, &s));
          TU_OK(ctx, dt_pp_schedule_generate(ctx, (dt_pp_schedule_kind)k, pp, v, m, &low));
          TU_OK(ctx, dt_pp_schedule_lower(ctx, &low));
          if (lowered) TU_OK(ctx, dt_pp_schedule_lower(ctx, &s));
          int len = dt_pp_schedule_format(&s, NULL, 0);
          char *text = malloc((size_t)len + 1);
          TU_CHECK(dt_pp_schedule_format(&s, text, (size_t)len + 1) == len, "format length");
          TU_OK(ctx, dt_pp_schedule_parse(ctx, text, "rt.csv", pp, pp * v, m, &back));
          /* a compute-only file is lowered on load: compare with the lowered lists */
          TU_CHECK(same_schedule(&back, &low), "round trip %s pp %d m %d%s",
                   dt_pp_schedule_kind_str(k), pp, m, lowered ? " (comms)" : "");
          /* truncated formatting keeps a terminated prefix and the full length */
          char small[16];
          TU_CHECK(dt_pp_schedule_format(&s, small, sizeof small) == len && strlen(small) < 16 &&
                       !strncmp(small, text, strlen(small)),
                   "truncated format");
          free(text);
          dt_pp_schedule_free(ctx, &s);
          dt_pp_schedule_free(ctx, &low);
          dt_pp_schedule_free(ctx, &back);
          n++;
        }
  TU_CHECK(n > 20, "round trips: %d", n);

  /* PyTorch's writer: CRLF lines, idle (empty) cells, quotes and spaces */
  dt_pp_schedule a, b;
  TU_OK(ctx, dt_pp_schedule_parse(ctx, "0F0,,0F1,0B0,0F2,0B1,0F3,0B2,0B3\r\n"
                                       ",1F0,1B0,\"1F1\",1B1, 1F2 ,1B2,1F3,1B3\r\n",
                                  "crlf.csv", 2, 2, 4, &a));
  TU_OK(ctx, dt_pp_schedule_generate(ctx, DT_PP_1F1B, 2, 1, 4, &b));
  TU_OK(ctx, dt_pp_schedule_lower(ctx, &b));
  TU_CHECK(same_schedule(&a, &b), "CRLF / idle cells / quotes");
  dt_pp_schedule_free(ctx, &a);
  dt_pp_schedule_free(ctx, &b);

  /* the save is atomic and loads back */
  char dir[] = "/tmp/sb-pp-XXXXXX";
  if (mkdtemp(dir)) {
    char path[256];
    snprintf(path, sizeof path, "%s/x.csv", dir);
    TU_OK(ctx, dt_pp_schedule_generate(ctx, DT_PP_INTERLEAVED_1F1B, 2, 2, 4, &a));
    TU_OK(ctx, dt_pp_schedule_save(ctx, &a, path));
    TU_OK(ctx, dt_pp_schedule_load(ctx, path, 2, 4, 4, &b));
    TU_OK(ctx, dt_pp_schedule_lower(ctx, &a));
    TU_CHECK(same_schedule(&a, &b), "save / load");
    dt_pp_schedule_free(ctx, &a);
    dt_pp_schedule_free(ctx, &b);
    char bad[300];
    snprintf(bad, sizeof bad, "%s/no/such/dir.csv", dir);
    TU_OK(ctx, dt_pp_schedule_generate(ctx, DT_PP_GPIPE, 2, 1, 4, &a));
    TU_CHECK(dt_pp_schedule_save(ctx, &a, bad) == DT_ERR_IO, "save into a missing directory");
    dt_pp_schedule_free(ctx, &a);
    remove(path);
    rmdir(dir);
  }
}

/* text must be refused with a message containing msg */
#define EXPECT_CSV_ERR(ctx, what, text, pp, ns, m, msg)                                        \
  do {                                                                                         \
    dt_pp_schedule s_;                                                                         \
    dt_status st_ = dt_pp_schedule_parse((ctx), (text), "bad.csv", (pp), (ns), (m), &s_);      \
    TU_CHECK(st_ == DT_ERR_INVALID && strstr(dt_last_error(ctx), (msg)) && s_.len[0] == 0 &&   \
                 !strchr(dt_last_error(ctx), '\n'),                                            \
             "%s: %s '%s', want '%s'", (what), dt_status_str(st_), dt_last_error(ctx), (msg)); \
    dt_pp_schedule_free((ctx), &s_);                                                           \
  } while (0)

static void check_csv_errors(dt_ctx *ctx) {
  /* cells */
  EXPECT_CSV_ERR(ctx, "bad action text", "0F0,0F1,0X0,0B0,0B1\n1F0,1B0,1F1,1B1\n", 2, 2, 2,
                 "bad.csv:1:9: rank 0, cell 3: '0X0': unknown action type");
  EXPECT_CSV_ERR(ctx, "no stage", "0F0,F1\n", 1, 1, 2, "bad.csv:1:5: rank 0, cell 2: 'F1': no stage index");
  EXPECT_CSV_ERR(ctx, "trailing text", "0F0,0B0x\n", 1, 1, 1,
                 "bad.csv:1:5: rank 0, cell 2: '0B0x': trailing text");
  EXPECT_CSV_ERR(ctx, "lower-case type", "0F0,0b0\n", 1, 1, 1,
                 "bad.csv:1:5: rank 0, cell 2: '0b0': unknown action type");
  EXPECT_CSV_ERR(ctx, "unsupported W", "0F0,0I0,0W0\n", 1, 1, 1,
                 "bad.csv:1:5: rank 0, cell 2: '0I0': I actions are not supported");
  EXPECT_CSV_ERR(ctx, "unsupported UNSHARD", "0UNSHARD,0F0,0B0\n", 1, 1, 1,
                 "bad.csv:1:1: rank 0, cell 1: '0UNSHARD': UNSHARD actions are not supported");
  EXPECT_CSV_ERR(ctx, "REDUCE_GRAD", "0F0,0B0,0REDUCE_GRAD\n", 1, 1, 1,
                 "bad.csv:1:9: rank 0, cell 3: '0REDUCE_GRAD': REDUCE_GRAD actions are not supported");
  EXPECT_CSV_ERR(ctx, "no microbatch", "0F0,0B\n", 1, 1, 1, "bad.csv:1:5: rank 0, cell 2: '0B': no microbatch");
  EXPECT_CSV_ERR(ctx, "stage out of range", "0F0,0B0\n1F0,3B0\n", 2, 2, 1,
                 "bad.csv:2:5: rank 1, cell 2: stage 3 out of range (2 stages)");
  EXPECT_CSV_ERR(ctx, "microbatch out of range", "0F0,0B4\n", 1, 1, 4,
                 "bad.csv:1:5: rank 0, cell 2: microbatch 4 out of range (4)");
  /* shape */
  EXPECT_CSV_ERR(ctx, "rows", "0F0,0B0\n", 2, 2, 1, "bad.csv: 1 rows, one per rank of the pp group of 2");
  EXPECT_CSV_ERR(ctx, "empty", "", 0, 0, 0, "bad.csv: no rows");
  EXPECT_CSV_ERR(ctx, "stages over rows", "0F0,2F0,2B0,0B0\n1F0,1B0\n", 0, 0, 0,
                 "bad.csv: 3 stages do not divide over the 2 ranks");
  /* schedule-level, compute-only form */
  EXPECT_CSV_ERR(ctx, "missing B", "0F0,0F1,0B0,0B1\n1F0,1B0,1F1\n", 2, 2, 2,
                 "bad.csv: rank 1 never runs 1B1 (stage 1, microbatch 1)");
  EXPECT_CSV_ERR(ctx, "duplicate F", "0F0,0F1,0F0,0B0,0B1\n1F0,1B0,1F1,1B1\n", 2, 2, 2,
                 "bad.csv:1:9: rank 0, action 3 (0F0): runs twice (first at action 1)");
  EXPECT_CSV_ERR(ctx, "wrong rank", "0F0,1F0,0B0,1B0\n\n", 2, 2, 1,
                 "bad.csv:1:5: rank 0, action 2 (1F0): stage 1 is on rank 1 (loop placement");
  EXPECT_CSV_ERR(ctx, "B before F", "0B0,0F0\n1F0,1B0\n", 2, 2, 1,
                 "bad.csv:1:1: rank 0, action 1 (0B0): backward before its forward 0F0");
  /* pp 1 with 2 stages: both on rank 0, passed locally */
  EXPECT_CSV_ERR(ctx, "local pass order", "1F0,0F0,0B0,1B0\n", 1, 2, 1,
                 "bad.csv:1:1: rank 0, action 1 (1F0): runs before its input 0F0 on this rank");
  EXPECT_CSV_ERR(ctx, "local gradient order", "0F0,1F0,0B0,1B0\n", 1, 2, 1,
                 "bad.csv:1:9: rank 0, action 3 (0B0): runs before its output gradient 1B0 on this rank");
  EXPECT_CSV_ERR(ctx, "cyclic compute order", "0B0,0F0\n1B0,1F0\n", 2, 2, 1,
                 "rank 0, action 1 (0B0): backward before its forward");
  /* a compute order no lowering can place: rank 1's first forward needs 0F1,
   * which rank 0 runs only after 0B0, which needs rank 1's 1B0 */
  EXPECT_CSV_ERR(ctx, "unplaceable", "0F0,0B0,0F1,0B1\n1F1,1F0,1B0,1B1\n", 2, 2, 2,
                 "bad.csv:1:5: cannot place the sends and receives: every rank waits for an input no "
                 "other rank produces first (rank 0 at action 2 (0B0), rank 1 at action 1 (1F1))");
  /* with comms, used as is */
  const char *ok_comms = "0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n";
  dt_pp_schedule s;
  TU_OK(ctx, dt_pp_schedule_parse(ctx, ok_comms, "ok.csv", 2, 2, 1, &s));
  TU_CHECK(s.with_comms && s.len[0] == 4 && s.len[1] == 4, "comms form used as is");
  dt_pp_schedule_free(ctx, &s);
  EXPECT_CSV_ERR(ctx, "deadlock", "0RECV_B0,0F0,0SEND_F0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n", 2, 2, 1,
                 "bad.csv:1:1: rank 0, action 1 (0RECV_B0): deadlock: rank 0 action 1 (0RECV_B0) "
                 "waits for 1SEND_B0, rank 1 action 4; rank 1 action 1 (1RECV_F0) waits for "
                 "0SEND_F0, rank 0 action 3");
  EXPECT_CSV_ERR(ctx, "SEND without RECV", "0F0,0SEND_F0,0RECV_B0,0B0\n1F0,1B0,1SEND_B0\n", 2, 2, 1,
                 "bad.csv:1:5: rank 0, action 2 (0SEND_F0): no 1RECV_F0 on rank 1 to receive it");
  EXPECT_CSV_ERR(ctx, "RECV without SEND", "0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0\n", 2, 2, 1,
                 "bad.csv:2:14: rank 1, action 3 (1B0): no 1SEND_B0 to stage 0 on rank 0");
  EXPECT_CSV_ERR(ctx, "F before RECV", "0F0,0SEND_F0,0RECV_B0,0B0\n1F0,1RECV_F0,1B0,1SEND_B0\n", 2, 2,
                 1, "bad.csv:2:1: rank 1, action 1 (1F0): runs before its input: no 1RECV_F0 before it");
  EXPECT_CSV_ERR(ctx, "SEND before F", "0SEND_F0,0F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n", 2, 2,
                 1, "bad.csv:1:1: rank 0, action 1 (0SEND_F0): sends before 0F0 computed it");
  EXPECT_CSV_ERR(ctx, "RECV twice",
                 "0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1RECV_F0,1F0,1B0,1SEND_B0\n", 2, 2, 1,
                 "bad.csv:2:10: rank 1, action 2 (1RECV_F0): runs twice (first at action 1)");
  EXPECT_CSV_ERR(ctx, "needless SEND", "0F0,0SEND_F0,1F0,1B0,0B0\n", 1, 2, 1,
                 "bad.csv:1:5: rank 0, action 2 (0SEND_F0): no stage after it on another rank to send to");
  EXPECT_CSV_ERR(ctx, "rows", "0F0,0B0\n1F0,1B0\n", 1, 2, 1,
                 "bad.csv: 2 rows, one per rank of the pp group of 1");
  EXPECT_CSV_ERR(ctx, "SEND off the last stage",
                 "0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1SEND_F0,1B0,1SEND_B0\n", 2, 2, 1,
                 "bad.csv:2:14: rank 1, action 3 (1SEND_F0): no stage after it on another rank to send to");
  /* unreadable file */
  TU_CHECK(dt_pp_schedule_load(ctx, "/nonexistent/x.csv", 0, 0, 0, &s) == DT_ERR_IO &&
               strstr(dt_last_error(ctx), "/nonexistent/x.csv: cannot open"),
           "missing file: '%s'", dt_last_error(ctx));
}

/* the validator on generated lists, each defect planted in a copy */
static void check_validator_plants(dt_ctx *ctx) {
  dt_pp_schedule s;
  /* drop rank 1's last action (1SEND_B3) from the lowered 1F1B pp 2 m 4 */
  TU_OK(ctx, dt_pp_schedule_generate(ctx, DT_PP_1F1B, 2, 1, 4, &s));
  TU_OK(ctx, dt_pp_schedule_lower(ctx, &s));
  TU_OK(ctx, dt_pp_schedule_validate(ctx, &s));
  s.len[1]--;
  TU_CHECK(dt_pp_schedule_validate(ctx, &s) == DT_ERR_INVALID &&
               strstr(dt_last_error(ctx), "rank 1, action 15 (1B3): no 1SEND_B3 to stage 0 on rank 0"),
           "dropped SEND: '%s'", dt_last_error(ctx));
  s.len[1]++;
  /* move rank 0's 0RECV_B3 (action 15) to the front: rank 0 blocks on it before
   * sending 0F0, which rank 1 waits for before it can reach 1SEND_B3: a cycle */
  dt_pp_action rb = s.acts[0][14];
  memmove(&s.acts[0][1], &s.acts[0][0], 14 * sizeof rb);
  s.acts[0][0] = rb;
  TU_CHECK(dt_pp_schedule_validate(ctx, &s) == DT_ERR_INVALID &&
               strstr(dt_last_error(ctx), "deadlock: rank 0 action 1 (0RECV_B3) waits for 1SEND_B3"),
           "planted deadlock: '%s'", dt_last_error(ctx));
  dt_pp_schedule_free(ctx, &s);
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "--dump-schedules")) return dump_schedules(argv[2]);
  if (argc != 1) {
    fprintf(stderr, "usage: test_pp_schedule [--dump-schedules DIR]\n");
    return 2;
  }
  dt_ctx ctx;
  dt_ctx_init(&ctx, 0, 1);
  check_split(&ctx);
  check_generators(&ctx);
  check_lowering(&ctx);
  check_shipped(&ctx);
  check_round_trip(&ctx);
  check_csv_errors(&ctx);
  check_validator_plants(&ctx);
  dt_ctx_release(&ctx);
  return tu_finish("test_pp_schedule");
}
