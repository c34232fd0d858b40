/* lib/parallel/pipeline.h: pipeline parallel as data: stage splits, schedules
 * as per-rank action lists, their CSV form, validation and analytic counts.
 *
 * Pure functions over small structs (no model, no communication), so a split
 * or a schedule is checked, and refused with a one-line message, before any
 * work. Kept apart from parallel.h because it needs only core (parallel.h
 * includes it, so the umbrella header carries it).
 *
 * Sources: torch/distributed/pipelining/schedules.py (_Action,
 * _ComputationType, ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B,
 * _get_1f1b_rank_ops, _get_warmup_ops, _add_send_recv, _load_csv, _dump_csv,
 * _simulate_comms_compute); torchtitan/distributed/pipeline_parallel.py
 * (generate_llm_fqn_per_model_part, pipeline_module_split) at v0.2.0;
 * Narayanan et al. 2021, arXiv:2104.04473 sec. 2.2 (bubbles). */
#ifndef DT_PIPELINE_H
#define DT_PIPELINE_H

#include <stddef.h>

#include "../core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { DT_PP_MAX_RANKS = 128, DT_PP_MAX_STAGES = 256, DT_PP_MAX_MICROBATCHES = 4096 };

/* ---- stage split ------------------------------------------------------------------ */

/* What one stage holds of the Llama model: transformer blocks layers.first ..
 * layers.first+n_layers-1 (n_layers may be 0), tok_embeddings (the first stage)
 * and norm + output (the last stage). */
typedef struct dt_pp_stage {
  int first_layer;
  int n_layers;
  bool embedding;
  bool head;
} dt_pp_stage;

typedef struct dt_pp_layout {
  int n_layers;
  int n_stages;
  dt_pp_stage stages[DT_PP_MAX_STAGES];
} dt_pp_layout;

/* TorchTitan's generate_llm_fqn_per_model_part: tok_embeddings counts as
 * first_less layers and norm + output as last_less (its
 * pipeline_parallel_first_stage_less_layers / _last_stage_less_layers, both 1 by
 * default); E = n_layers + first_less + last_less effective layers, per = E /
 * n_stages, extra = E % n_stages; stage s gets per + (s < extra) slots, stage 0
 * spends first_less of them on the embedding and the last stage last_less on
 * norm + output, the rest are blocks in order. One stage holds everything.
 * DT_ERR_INVALID, one line: n_stages < 1 or above DT_PP_MAX_STAGES, n_layers <
 * 0, a weight < 0, n_stages > E, per == 0, first_less or last_less > per. */
dt_status dt_pp_split(dt_ctx *ctx, int n_layers, int n_stages, int first_less, int last_less,
                      dt_pp_layout *out);

/* An explicit split (TorchTitan's module_fqns_per_model_part): stage_fqns[s] is
 * stage s's modules joined by ',' ("tok_embeddings,layers.0,layers.1",
 * "layers.2,norm,output"; spaces around names are ignored). Valid when the
 * names are tok_embeddings, layers.N, norm and output, in model order: the
 * embedding first in stage 0, every block exactly once, ascending and
 * contiguous across the stages, norm then output last in the last stage, and
 * no stage empty. `where` ("plans/x.plan:12", or NULL) prefixes the one-line
 * DT_ERR_INVALID message, which names the stage and the module. */
dt_status dt_pp_split_fqns(dt_ctx *ctx, int n_layers, const char *const *stage_fqns, int n_stages,
                           const char *where, dt_pp_layout *out);

/* Stage s's modules as the fqn list above into buf (snprintf's contract). */
int dt_pp_stage_fqns(const dt_pp_layout *l, int stage, char *buf, size_t n);

/* "loop" placement (pipeline_module_split's style "loop", PyTorch's
 * generate_stage_to_rank_mapping): stage s on pp rank s % pp, so rank r holds
 * stages r, r + pp, ..., v = n_stages / pp of them. */
int dt_pp_stage_rank(int stage, int pp);
/* v for n_stages over pp ranks; DT_ERR_INVALID unless pp >= 1 and pp divides
 * n_stages (pipeline_module_split's assert). */
dt_status dt_pp_stages_per_rank(dt_ctx *ctx, int n_stages, int pp, int *v);

/* ---- actions ---------------------------------------------------------------------- */

/* PyTorch's _ComputationType, with its action text ("F", "SEND_F", ...). F, B,
 * SEND_F, RECV_F, SEND_B, RECV_B are supported; I, W, UNSHARD, RESHARD,
 * REDUCE_GRAD are recognised and refused. */
typedef enum dt_pp_kind {
  DT_PP_F = 0, DT_PP_I, DT_PP_B, DT_PP_W, DT_PP_UNSHARD, DT_PP_RESHARD, DT_PP_REDUCE_GRAD,
  DT_PP_SEND_F, DT_PP_RECV_F, DT_PP_SEND_B, DT_PP_RECV_B, DT_PP_KIND_COUNT
} dt_pp_kind;

const char *dt_pp_kind_str(dt_pp_kind k);
bool dt_pp_kind_is_comm(dt_pp_kind k); /* SEND_* and RECV_* */

/* One action: `kind` of stage `stage` on microbatch `mb` (-1: none, as
 * "1UNSHARD"). `col` is where it came from in a CSV (1-based character column
 * of its cell on the rank's line; 0: generated or inserted by the lowering). */
typedef struct dt_pp_action {
  dt_pp_kind kind;
  int stage;
  int mb;
  int col;
} dt_pp_action;

/* "2F0", "3SEND_F1" into buf (snprintf's contract). */
int dt_pp_action_str(dt_pp_action a, char *buf, size_t n);
/* Parses one action text with PyTorch's _action_regex,
 * (\d+)(F|I|B|W|UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)(\d*),
 * which must match the whole text (re.match would ignore trailing text).
 * false when it does not; then *why says what is wrong. */
bool dt_pp_action_parse(const char *text, size_t len, dt_pp_action *out, const char **why);

/* ---- schedules -------------------------------------------------------------------- */

typedef enum dt_pp_schedule_kind {
  DT_PP_GPIPE = 0,         /* ScheduleGPipe */
  DT_PP_1F1B,              /* Schedule1F1B */
  DT_PP_INTERLEAVED_1F1B,  /* ScheduleInterleaved1F1B */
  DT_PP_CSV,               /* loaded from a file */
  DT_PP_SCHEDULE_KIND_COUNT
} dt_pp_schedule_kind;

/* PyTorch's get_schedule_class names, case-insensitive: "GPipe", "1F1B",
 * "Interleaved1F1B". DT_ERR_INVALID (one line, with the valid names) otherwise. */
dt_status dt_pp_schedule_kind_parse(dt_ctx *ctx, const char *name, dt_pp_schedule_kind *out);
const char *dt_pp_schedule_kind_str(dt_pp_schedule_kind k);

/* Per-rank action lists, in execution order, with no idle entries. Compute-only
 * (F and B; with_comms false) as the generators and a compute-only CSV give
 * them, or lowered (with SEND / RECV; with_comms true). Stage s lives on rank
 * dt_pp_stage_rank(s, pp). The lists are allocated with the ctx given to the
 * function that filled the schedule; free them with dt_pp_schedule_free on that
 * ctx. */
typedef struct dt_pp_schedule {
  dt_pp_schedule_kind kind;
  int pp;               /* ranks of the pp group: one list each */
  int n_stages;         /* pp * v */
  int n_microbatches;
  bool with_comms;
  char path[256];       /* the CSV it was loaded from; "" when generated */
  int len[DT_PP_MAX_RANKS];
  int cap[DT_PP_MAX_RANKS];
  dt_pp_action *acts[DT_PP_MAX_RANKS];
} dt_pp_schedule;

void dt_pp_schedule_free(dt_ctx *ctx, dt_pp_schedule *s);

/* The compute-only order of a built-in schedule for pp ranks, v stages per rank
 * (loop placement) and m microbatches:
 *   GPipe (v 1): every rank F0 .. F(m-1), then B0 .. B(m-1).
 *   1F1B (v 1, m >= pp as Schedule1F1B requires): rank r runs min(m, pp - r)
 *     warmup forwards, then backward / forward pairs, then the remaining
 *     backwards (Schedule1F1B._step_microbatches).
 *   Interleaved 1F1B (v >= 2, TorchTitan's multi-stage requirement): rounds =
 *     max(1, m / pp), m % rounds == 0, microbatches per round mpr = m / rounds;
 *     warmup = min((v - 1) mpr + 2 (pp - 1 - r), m v) forwards, then forward /
 *     backward pairs, then backwards; op t forwards local stage (t / mpr) % v
 *     and backwards local stage v - 1 - ((t - warmup) / mpr) % v, microbatches
 *     counted per stage (ScheduleInterleaved1F1B._calculate_single_rank_operations,
 *     _get_1f1b_rank_ops, _get_warmup_ops), idles dropped.
 * DT_ERR_INVALID (one line) for a condition above, pp or m < 1, pp above
 * DT_PP_MAX_RANKS or pp v above DT_PP_MAX_STAGES; DT_ERR_NOMEM. */
dt_status dt_pp_schedule_generate(dt_ctx *ctx, dt_pp_schedule_kind kind, int pp, int v, int m,
                                  dt_pp_schedule *out);

/* Inserts the communication into a compute-only schedule as PyTorch's
 * _add_send_recv does: the ranks are swept in order, one action each per sweep;
 * an F (B) is taken once its input is there (stage 0 / the last stage; the
 * previous (next) stage's F (B) on this rank; or its RECV already listed here);
 * after sF mb, when stage s+1 is on another rank, sSEND_F mb follows it here and
 * (s+1)RECV_F mb is appended to that rank's list; after sB mb, when stage s-1 is
 * on another rank, sSEND_B mb here and (s-1)RECV_B mb there. Stage-to-stage
 * passes within a rank need no comm. (PyTorch runs _add_unshard_reshard and
 * _add_reduce_grad first; FSDP's unshard and the gradient reduction are not
 * actions here.) Validates the compute-only form first (dt_pp_schedule_validate).
 * DT_ERR_INVALID when a sweep takes nothing (the compute order is cyclic),
 * naming each rank's waiting action. A schedule with comms is left as is. */
dt_status dt_pp_schedule_lower(dt_ctx *ctx, dt_pp_schedule *s);

/* How a RECV waits when the lists run. Either way a SEND is eager (dt_comm_send
 * returns once the payload is copied) and actions run in list order.
 *   BLOCKING: the RECV itself waits for its SEND (dt_comm_recv where it stands).
 *   AT_USE: the RECV only posts; the F (B) that consumes it waits for the SEND
 *     (PyTorch's _PipelineScheduleRuntime: irecv at RECV_F / RECV_B, waited in
 *     FORWARD / FULL_BACKWARD; with dt_comm, the runtime calls dt_comm_recv just
 *     before the consumer, a tag per (stage, microbatch, direction)).
 * A schedule that runs under BLOCKING runs under AT_USE (waits only move later
 * in each list), not the other way round; and BLOCKING idles more on
 * _add_send_recv's placement, which lists a RECV as soon as its SEND is listed
 * (1F1B pp 2 m 4: the step takes 19 F-times, not 15, in dt_pp_schedule_stats). */
typedef enum dt_pp_recv_mode { DT_PP_RECV_BLOCKING = 0, DT_PP_RECV_AT_USE } dt_pp_recv_mode;

/* Checks a schedule before any work by running its lists with BLOCKING recvs
 * (the strict mode: what passes runs in either mode). Refused, DT_ERR_INVALID
 * with a one-line message naming the rank, the action's index (1-based) and
 * text (and FILE:LINE:COL for a loaded one):
 *   - a kind other than F, B, SEND_*, RECV_*; a stage or microbatch out of
 *     range; a stage on another rank than its placement;
 *   - a stage missing the F or the B of a microbatch, or running one twice;
 *   - (with comms) a SEND or RECV where the neighbouring stage is on the same
 *     rank or absent, one twice, a SEND without its RECV or a RECV without its
 *     SEND;
 *   - an F before its input (sRECV_F mb, or (s-1)F mb on this rank), a B
 *     before its F or its output gradient (sRECV_B mb, or (s+1)B mb on this
 *     rank), a SEND before the compute whose result it sends;
 *   - a deadlock: every unfinished rank blocked on a RECV, the message naming
 *     the ranks each waiting on the next, round to the cycle.
 * For a compute-only schedule only the first two groups and the per-rank order
 * (B after F; local stage passes) are checked; dt_pp_schedule_lower checks
 * the cross-rank order. */
dt_status dt_pp_schedule_validate(dt_ctx *ctx, const dt_pp_schedule *s);

/* ---- CSV -------------------------------------------------------------------------- */

/* PyTorch's _dump_csv / _load_csv format: one line per rank (rank 0 first), one
 * action per cell in execution order, an empty cell an idle slot (skipped).
 * A file with any SEND / RECV is the compute_comms form and is used as is;
 * otherwise it is compute_only and is lowered on load (dt_pp_schedule_lower).
 * pp, n_stages, m: what the run needs; <= 0 infers it (the rows; the highest
 * stage / microbatch + 1). Cells may carry spaces and double quotes around the
 * text; lines may end in CRLF (Python's csv writer). Then validates.
 * Errors: DT_ERR_IO (cannot read), DT_ERR_INVALID "FILE:LINE:COL: rank R, cell
 * C: ..." for a bad cell, "FILE: ..." for a wrong row count, and the
 * validation's messages prefixed with the cell's FILE:LINE:COL. */
dt_status dt_pp_schedule_load(dt_ctx *ctx, const char *path, int pp, int n_stages, int m,
                              dt_pp_schedule *out);
/* The same from text in memory (path names it in messages). */
dt_status dt_pp_schedule_parse(dt_ctx *ctx, const char *text, const char *path, int pp,
                               int n_stages, int m, dt_pp_schedule *out);
/* The CSV text of s (its lists as they are, one line per rank, "\n"-ended)
 * into buf (snprintf's contract: returns the length it needs). */
int dt_pp_schedule_format(const dt_pp_schedule *s, char *buf, size_t n);
/* Writes dt_pp_schedule_format's text to path through a temporary file renamed
 * over it, so a failure leaves no half-written file. DT_ERR_IO. */
dt_status dt_pp_schedule_save(dt_ctx *ctx, const dt_pp_schedule *s, const char *path);

/* ---- analytic helpers ------------------------------------------------------------- */

/* The idle fraction of a step, Narayanan et al. 2021 sec. 2.2 (equal stage
 * times, t_b = 2 t_f; the fill and drain of the pipeline): GPipe and 1F1B
 * (pp - 1) / (m + pp - 1); interleaved with v stages per rank
 * (pp - 1) / (v m + pp - 1). -1 for a kind with no formula or bad arguments. */
double dt_pp_bubble_fraction(dt_pp_schedule_kind kind, int pp, int v, int m);
/* Point-to-point transfers per step (activations and their gradients): one
 * each way per stage boundary that crosses ranks per microbatch: 2 (pp - 1) m
 * for a single stage per rank, 2 (v pp - 1) m under loop placement. */
long dt_pp_p2p_count(int pp, int v, int m);

/* What walking a schedule's lists gives. */
typedef struct dt_pp_stats {
  int sends[DT_PP_MAX_RANKS];   /* SEND_F + SEND_B actions of each rank */
  long total_sends;             /* p2p transfers per step */
  /* forwards whose backward has not run yet ((stage, microbatch) pairs whose
   * activations the rank holds), at most, over the rank's list */
  int peak_in_flight[DT_PP_MAX_RANKS];
  /* a timed run of the lists in the given recv mode (comm takes no time): F
   * takes t_f, B takes t_b; busy time of each rank, the makespan, and the idle
   * fraction 1 - sum(busy) / (pp makespan) */
  double busy[DT_PP_MAX_RANKS];
  double makespan;
  double bubble;
} dt_pp_stats;

/* Walks a schedule (lowered, or compute-only: then lowered on a copy) after
 * validating it. DT_ERR_INVALID as dt_pp_schedule_validate (and a deadlock in
 * the mode given); DT_ERR_NOMEM. */
dt_status dt_pp_schedule_stats(dt_ctx *ctx, const dt_pp_schedule *s, dt_pp_recv_mode mode,
                               double t_f, double t_b, dt_pp_stats *out);

#ifdef __cplusplus
}
#endif
#endif
