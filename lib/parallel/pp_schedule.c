/* lib/parallel/pp_schedule.c: pipeline stage splits and schedules as data
 * (pipeline.h): TorchTitan's stage split, PyTorch's GPipe / 1F1B / Interleaved
 * 1F1B compute orders, the send / recv lowering, the CSV form, validation by
 * simulating the lists, and the counts the tests check against formulas.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "parallel/pipeline.h"

/* ---- stage split ---------------------------------------------------------------- */

dt_status dt_pp_split(dt_ctx *ctx, int n_layers, int n_stages, int first_less, int last_less,
                      dt_pp_layout *out) {
  static const char who[] = "dt_pp_split";
  if (!out) return dt_error(ctx, DT_ERR_INVALID, who, "no layout");
  memset(out, 0, sizeof *out);
  if (n_stages < 1 || n_stages > DT_PP_MAX_STAGES)
    return dt_error(ctx, DT_ERR_INVALID, who, "%d stages (1 .. %d)", n_stages, DT_PP_MAX_STAGES);
  if (n_layers < 0) return dt_error(ctx, DT_ERR_INVALID, who, "%d layers", n_layers);
  if (first_less < 0 || last_less < 0)
    return dt_error(ctx, DT_ERR_INVALID, who, "first/last stage weights %d, %d (>= 0)", first_less,
                    last_less);
  out->n_layers = n_layers;
  out->n_stages = n_stages;
  if (n_stages == 1) { /* generate_llm_fqn_per_model_part: a single stage gets everything */
    out->stages[0] = (dt_pp_stage){0, n_layers, true, true};
    return DT_OK;
  }
  int e = n_layers + first_less + last_less;
  if (n_stages > e)
    return dt_error(ctx, DT_ERR_INVALID, who,
                    "%d stages cannot be more than the %d effective layers (%d layers + %d + %d)",
                    n_stages, e, n_layers, first_less, last_less);
  int per = e / n_stages, extra = e % n_stages; /* per >= 1: TorchTitan's per == 0 error is
                                                  * the case n_stages > E above */
  if (first_less > per)
    return dt_error(ctx, DT_ERR_INVALID, who,
                    "first stage weight %d exceeds the minimum layers per stage (%d)", first_less, per);
  if (last_less > per)
    return dt_error(ctx, DT_ERR_INVALID, who,
                    "last stage weight %d exceeds the minimum layers per stage (%d)", last_less, per);
  int next = 0;
  for (int s = 0; s < n_stages; s++) {
    int slots = per + (s < extra ? 1 : 0);
    dt_pp_stage *st = &out->stages[s];
    if (s == 0) {
      st->embedding = true;
      slots -= first_less;
    } else if (s == n_stages - 1) {
      st->head = true;
      slots -= last_less;
    }
    if (slots > n_layers - next) slots = n_layers - next; /* TorchTitan's current_layer < num_layers */
    st->first_layer = next;
    st->n_layers = slots;
    next += slots;
  }
  return DT_OK;
}

static const char *skip_ws(const char *p, const char *end) {
  while (p < end && (*p == ' ' || *p == '\t')) p++;
  return p;
}

dt_status dt_pp_split_fqns(dt_ctx *ctx, int n_layers, const char *const *stage_fqns, int n_stages,
                           const char *where, dt_pp_layout *out) {
  static const char who[] = "dt_pp_split_fqns";
  const char *w = where ? where : "module_fqns_per_model_part";
  if (!out) return dt_error(ctx, DT_ERR_INVALID, who, "no layout");
  memset(out, 0, sizeof *out);
  if (!stage_fqns || n_stages < 1 || n_stages > DT_PP_MAX_STAGES)
    return dt_error(ctx, DT_ERR_INVALID, who, "%s: %d stages (1 .. %d)", w, n_stages,
                    DT_PP_MAX_STAGES);
  if (n_layers < 0) return dt_error(ctx, DT_ERR_INVALID, who, "%s: %d layers", w, n_layers);
  out->n_layers = n_layers;
  out->n_stages = n_stages;
  /* model order: 0 before the embedding, 1 after it (blocks), 2 after norm, 3 after output */
  int phase = 0, next = 0;
  for (int s = 0; s < n_stages; s++) {
    const char *p = stage_fqns[s] ? stage_fqns[s] : "";
    const char *end = p + strlen(p);
    dt_pp_stage *st = &out->stages[s];
    st->first_layer = next;
    int n_mods = 0;
    while (p <= end) {
      const char *q = memchr(p, ',', (size_t)(end - p));
      if (!q) q = end;
      const char *a = skip_ws(p, q), *b = q;
      while (b > a && (b[-1] == ' ' || b[-1] == '\t')) b--;
      int len = (int)(b - a);
      if (len == 0) {
        if (n_mods == 0 && q == end) break; /* a blank stage: reported below */
        return dt_error(ctx, DT_ERR_INVALID, who, "%s: stage %d: empty module name in '%s'", w, s,
                        stage_fqns[s] ? stage_fqns[s] : "");
      }
      n_mods++;
      if (len == 14 && !memcmp(a, "tok_embeddings", 14)) {
        if (s != 0 || phase != 0)
          return dt_error(ctx, DT_ERR_INVALID, who,
                          "%s: stage %d: tok_embeddings must come first, in stage 0", w, s);
        st->embedding = true;
        phase = 1;
      } else if (len > 7 && !memcmp(a, "layers.", 7)) {
        long k = 0;
        bool digits = true;
        for (const char *c = a + 7; c < b; c++) {
          if (!isdigit((unsigned char)*c) || k > 1000000) {
            digits = false;
            break;
          }
          k = k * 10 + (*c - '0');
        }
        if (!digits)
          return dt_error(ctx, DT_ERR_INVALID, who, "%s: stage %d: '%.*s' is not a module (layers.N)",
                          w, s, len, a);
        if (phase == 0)
          return dt_error(ctx, DT_ERR_INVALID, who,
                          "%s: stage %d: layers.%ld before tok_embeddings (stage 0 starts with it)",
                          w, s, k);
        if (phase > 1)
          return dt_error(ctx, DT_ERR_INVALID, who, "%s: stage %d: layers.%ld after norm/output", w, s,
                          k);
        if (k >= n_layers)
          return dt_error(ctx, DT_ERR_INVALID, who, "%s: stage %d: layers.%ld, the model has %d layers",
                          w, s, k, n_layers);
        if (k != next)
          return dt_error(ctx, DT_ERR_INVALID, who,
                          "%s: stage %d: layers.%ld %s (expected layers.%d: every layer once, in order)",
                          w, s, k, k < next ? "again" : "out of order", next);
        next++;
        st->n_layers++;
      } else if ((len == 4 && !memcmp(a, "norm", 4)) || (len == 6 && !memcmp(a, "output", 6))) {
        bool is_norm = len == 4;
        if (phase == 0)
          return dt_error(ctx, DT_ERR_INVALID, who, "%s: stage %d: %.*s before tok_embeddings", w, s,
                          len, a);
        if (s != n_stages - 1)
          return dt_error(ctx, DT_ERR_INVALID, who, "%s: stage %d: %.*s must be in the last stage (%d)",
                          w, s, len, a, n_stages - 1);
        if (is_norm ? phase != 1 : phase != 2)
          return dt_error(ctx, DT_ERR_INVALID, who, "%s: stage %d: %s", w, s,
                          is_norm ? "norm twice or after output" : "output before norm, or twice");
        if (next != n_layers)
          return dt_error(ctx, DT_ERR_INVALID, who, "%s: stage %d: %.*s before layers.%d", w, s, len,
                          a, next);
        phase = is_norm ? 2 : 3;
        if (!is_norm) st->head = true;
      } else {
        return dt_error(ctx, DT_ERR_INVALID, who,
                        "%s: stage %d: '%.*s' is not tok_embeddings, layers.N, norm or output", w, s,
                        len, a);
      }
      if (q == end) break;
      p = q + 1;
    }
    if (n_mods == 0) return dt_error(ctx, DT_ERR_INVALID, who, "%s: stage %d holds no module", w, s);
  }
  if (phase == 0) return dt_error(ctx, DT_ERR_INVALID, who, "%s: no stage holds tok_embeddings", w);
  if (next != n_layers)
    return dt_error(ctx, DT_ERR_INVALID, who, "%s: layers.%d is in no stage", w, next);
  if (phase != 3)
    return dt_error(ctx, DT_ERR_INVALID, who, "%s: the last stage (%d) must end with norm, output", w,
                    n_stages - 1);
  return DT_OK;
}

int dt_pp_stage_fqns(const dt_pp_layout *l, int stage, char *buf, size_t n) {
  if (!l || stage < 0 || stage >= l->n_stages) return snprintf(buf, n, "%s", "");
  const dt_pp_stage *st = &l->stages[stage];
  size_t at = 0;
  int tot = 0;
#define PUT(...)                                                         \
  do {                                                                   \
    int k_ = snprintf(at < n ? buf + at : NULL, at < n ? n - at : 0, __VA_ARGS__); \
    if (k_ > 0) {                                                        \
      tot += k_;                                                         \
      at += (size_t)k_;                                                  \
    }                                                                    \
  } while (0)
  const char *sep = "";
  if (st->embedding) {
    PUT("tok_embeddings");
    sep = ",";
  }
  for (int i = 0; i < st->n_layers; i++) {
    PUT("%slayers.%d", sep, st->first_layer + i);
    sep = ",";
  }
  if (st->head) PUT("%snorm,output", sep);
#undef PUT
  if (tot == 0 && n > 0) buf[0] = '\0';
  return tot;
}

int dt_pp_stage_rank(int stage, int pp) { return pp > 0 && stage >= 0 ? stage % pp : -1; }

dt_status dt_pp_stages_per_rank(dt_ctx *ctx, int n_stages, int pp, int *v) {
  if (pp < 1 || n_stages < 1 || n_stages % pp != 0)
    return dt_error(ctx, DT_ERR_INVALID, "dt_pp_stages_per_rank",
                    "%d stages do not divide evenly over pp %d", n_stages, pp);
  if (v) *v = n_stages / pp;
  return DT_OK;
}

/* ---- actions ---------------------------------------------------------------------- */

static const char *const k_kind_names[DT_PP_KIND_COUNT] = {
    [DT_PP_F] = "F",          [DT_PP_I] = "I",           [DT_PP_B] = "B",
    [DT_PP_W] = "W",          [DT_PP_UNSHARD] = "UNSHARD", [DT_PP_RESHARD] = "RESHARD",
    [DT_PP_REDUCE_GRAD] = "REDUCE_GRAD", [DT_PP_SEND_F] = "SEND_F", [DT_PP_RECV_F] = "RECV_F",
    [DT_PP_SEND_B] = "SEND_B", [DT_PP_RECV_B] = "RECV_B"};

/* The regex's alternation order: F|I|B|W|UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B.
 * No name is a prefix of a later one, so the first that matches is the one. */
static const dt_pp_kind k_regex_order[DT_PP_KIND_COUNT] = {
    DT_PP_F,      DT_PP_I,      DT_PP_B,      DT_PP_W,      DT_PP_UNSHARD, DT_PP_RESHARD,
    DT_PP_REDUCE_GRAD, DT_PP_SEND_F, DT_PP_RECV_F, DT_PP_SEND_B, DT_PP_RECV_B};

const char *dt_pp_kind_str(dt_pp_kind k) {
  return (unsigned)k < DT_PP_KIND_COUNT ? k_kind_names[k] : "?";
}

bool dt_pp_kind_is_comm(dt_pp_kind k) {
  return k == DT_PP_SEND_F || k == DT_PP_RECV_F || k == DT_PP_SEND_B || k == DT_PP_RECV_B;
}

int dt_pp_action_str(dt_pp_action a, char *buf, size_t n) {
  if (a.mb >= 0) return snprintf(buf, n, "%d%s%d", a.stage, dt_pp_kind_str(a.kind), a.mb);
  return snprintf(buf, n, "%d%s", a.stage, dt_pp_kind_str(a.kind));
}

/* Reads up to 9 digits (a stage or microbatch index; more is out of any range). */
static int read_index(const char *p, const char *end, long *out) {
  int k = 0;
  long v = 0;
  while (p + k < end && isdigit((unsigned char)p[k])) {
    if (k == 9) return -1;
    v = v * 10 + (p[k] - '0');
    k++;
  }
  *out = v;
  return k;
}

bool dt_pp_action_parse(const char *text, size_t len, dt_pp_action *out, const char **why) {
  const char *p = text, *end = text + len;
  const char *dummy;
  if (!why) why = &dummy;
  long stage, mb = -1;
  int k = text ? read_index(p, end, &stage) : 0;
  if (k < 0) {
    *why = "stage index too large";
    return false;
  }
  if (k == 0) {
    *why = "no stage index ({stage}{type}{microbatch}, e.g. 2F0)";
    return false;
  }
  p += k;
  int kind = -1;
  for (int i = 0; i < DT_PP_KIND_COUNT; i++) {
    const char *nm = k_kind_names[k_regex_order[i]];
    size_t nl = strlen(nm);
    if ((size_t)(end - p) >= nl && !memcmp(p, nm, nl)) {
      kind = (int)k_regex_order[i];
      p += nl;
      break;
    }
  }
  if (kind < 0) {
    *why = "unknown action type (F, I, B, W, UNSHARD, RESHARD, REDUCE_GRAD, SEND_F, RECV_F, "
           "SEND_B, RECV_B)";
    return false;
  }
  if (p < end) {
    k = read_index(p, end, &mb);
    if (k < 0) {
      *why = "microbatch index too large";
      return false;
    }
    p += k;
    if (p < end) {
      *why = "trailing text after the microbatch ({stage}{type}{microbatch}, e.g. 2F0)";
      return false;
    }
    if (k == 0) mb = -1;
  }
  *out = (dt_pp_action){(dt_pp_kind)kind, (int)stage, (int)mb, 0};
  return true;
}

/* ---- schedules: storage ------------------------------------------------------------ */

void dt_pp_schedule_free(dt_ctx *ctx, dt_pp_schedule *s) {
  if (!s) return;
  for (int r = 0; r < DT_PP_MAX_RANKS; r++) dt_host_free(ctx, s->acts[r]);
  memset(s, 0, sizeof *s);
}

static dt_status push(dt_ctx *ctx, dt_pp_schedule *s, int r, dt_pp_action a) {
  if (s->len[r] == s->cap[r]) {
    if (s->cap[r] >= (1 << 24))
      return dt_error(ctx, DT_ERR_INVALID, "dt_pp_schedule", "rank %d: more than %d actions", r,
                      1 << 24);
    int nc = s->cap[r] ? 2 * s->cap[r] : 32;
    dt_pp_action *na = dt_host_alloc(ctx, (size_t)nc * sizeof *na);
    if (!na) return DT_ERR_NOMEM;
    if (s->len[r]) memcpy(na, s->acts[r], (size_t)s->len[r] * sizeof *na);
    dt_host_free(ctx, s->acts[r]);
    s->acts[r] = na;
    s->cap[r] = nc;
  }
  s->acts[r][s->len[r]++] = a;
  return DT_OK;
}

static dt_pp_action act(dt_pp_kind k, int stage, int mb) { return (dt_pp_action){k, stage, mb, 0}; }

/* ---- schedules: generators ---------------------------------------------------------- */

static const char *const k_sched_names[DT_PP_SCHEDULE_KIND_COUNT] = {
    [DT_PP_GPIPE] = "GPipe", [DT_PP_1F1B] = "1F1B", [DT_PP_INTERLEAVED_1F1B] = "Interleaved1F1B",
    [DT_PP_CSV] = "csv"};

const char *dt_pp_schedule_kind_str(dt_pp_schedule_kind k) {
  return (unsigned)k < DT_PP_SCHEDULE_KIND_COUNT ? k_sched_names[k] : "?";
}

dt_status dt_pp_schedule_kind_parse(dt_ctx *ctx, const char *name, dt_pp_schedule_kind *out) {
  for (int k = 0; k < DT_PP_CSV; k++)
    if (name && !strcasecmp(name, k_sched_names[k])) {
      if (out) *out = (dt_pp_schedule_kind)k;
      return DT_OK;
    }
  return dt_error(ctx, DT_ERR_INVALID, "dt_pp_schedule_kind_parse",
                  "unknown pipeline schedule '%s' (GPipe, 1F1B, Interleaved1F1B)", name ? name : "");
}

static dt_status gen_rank(dt_ctx *ctx, dt_pp_schedule *s, int r, int v, int *fcnt, int *bcnt) {
  int pp = s->pp, m = s->n_microbatches;
  switch (s->kind) {
  case DT_PP_GPIPE: /* ScheduleGPipe._step_microbatches: all forwards, then backwards ascending */
    for (int i = 0; i < m; i++) DT_CHECK(push(ctx, s, r, act(DT_PP_F, r, i)));
    for (int i = 0; i < m; i++) DT_CHECK(push(ctx, s, r, act(DT_PP_B, r, i)));
    return DT_OK;
  case DT_PP_1F1B: { /* Schedule1F1B._step_microbatches: warmup, 1B1F, cooldown */
    int warm = m < pp - r ? m : pp - r, f = 0, b = 0;
    for (; f < warm; f++) DT_CHECK(push(ctx, s, r, act(DT_PP_F, r, f)));
    for (;;) {
      DT_CHECK(push(ctx, s, r, act(DT_PP_B, r, b++)));
      if (f == m) break;
      DT_CHECK(push(ctx, s, r, act(DT_PP_F, r, f++)));
    }
    while (b < m) DT_CHECK(push(ctx, s, r, act(DT_PP_B, r, b++)));
    return DT_OK;
  }
  case DT_PP_INTERLEAVED_1F1B: {
    /* ScheduleInterleaved1F1B._calculate_single_rank_operations with _get_warmup_ops
     * (multiply_factor 2) and _get_1f1b_rank_ops (no zero bubble), idles dropped */
    int rounds = m / pp > 1 ? m / pp : 1, mpr = m / rounds;
    int warm = (v - 1) * mpr + 2 * (pp - 1 - r);
    if (warm > m * v) warm = m * v;
    int fwd_bwd = m * v - warm, cool = m * v - fwd_bwd, total = warm + fwd_bwd + cool;
    memset(fcnt, 0, (size_t)s->n_stages * sizeof *fcnt);
    memset(bcnt, 0, (size_t)s->n_stages * sizeof *bcnt);
    for (int op = 0; op < total; op++) {
      int fs = ((op / mpr) % v) * pp + r;
      int bs = op >= warm ? (v - 1 - ((op - warm) / mpr) % v) * pp + r : -1;
      if (op < warm + fwd_bwd) DT_CHECK(push(ctx, s, r, act(DT_PP_F, fs, fcnt[fs]++)));
      if (op >= warm) DT_CHECK(push(ctx, s, r, act(DT_PP_B, bs, bcnt[bs]++)));
    }
    return DT_OK;
  }
  default:
    return dt_error(ctx, DT_ERR_INVALID, "dt_pp_schedule_generate", "not a built-in schedule");
  }
}

dt_status dt_pp_schedule_generate(dt_ctx *ctx, dt_pp_schedule_kind kind, int pp, int v, int m,
                                  dt_pp_schedule *out) {
  static const char who[] = "dt_pp_schedule_generate";
  if (!out) return dt_error(ctx, DT_ERR_INVALID, who, "no schedule");
  memset(out, 0, sizeof *out);
  if (kind != DT_PP_GPIPE && kind != DT_PP_1F1B && kind != DT_PP_INTERLEAVED_1F1B)
    return dt_error(ctx, DT_ERR_INVALID, who, "not a built-in schedule (%d)", (int)kind);
  const char *nm = k_sched_names[kind];
  if (pp < 1 || pp > DT_PP_MAX_RANKS)
    return dt_error(ctx, DT_ERR_INVALID, who, "%s: pp %d (1 .. %d)", nm, pp, DT_PP_MAX_RANKS);
  if (m < 1 || m > DT_PP_MAX_MICROBATCHES)
    return dt_error(ctx, DT_ERR_INVALID, who, "%s: %d microbatches (1 .. %d)", nm, m,
                    DT_PP_MAX_MICROBATCHES);
  if (kind != DT_PP_INTERLEAVED_1F1B && v != 1)
    return dt_error(ctx, DT_ERR_INVALID, who,
                    "%s is a single-stage schedule: %d stages per rank (exactly 1)", nm, v);
  if (kind == DT_PP_INTERLEAVED_1F1B && v < 2)
    return dt_error(ctx, DT_ERR_INVALID, who,
                    "%s is a multi-stage schedule: %d stages per rank (at least 2)", nm, v);
  if (v > DT_PP_MAX_STAGES / pp)
    return dt_error(ctx, DT_ERR_INVALID, who, "%s: %d x %d stages (at most %d)", nm, pp, v,
                    DT_PP_MAX_STAGES);
  if (kind == DT_PP_1F1B && m < pp)
    return dt_error(ctx, DT_ERR_INVALID, who,
                    "%s: %d microbatches must be >= the %d stages (Schedule1F1B)", nm, m, pp);
  if (kind == DT_PP_INTERLEAVED_1F1B) {
    int rounds = m / pp > 1 ? m / pp : 1;
    if (m % rounds != 0)
      return dt_error(ctx, DT_ERR_INVALID, who,
                      "%s: %d microbatches must be a multiple of the %d rounds (max(1, m / pp))", nm,
                      m, rounds);
  }
  out->kind = kind;
  out->pp = pp;
  out->n_stages = pp * v;
  out->n_microbatches = m;
  int cnt[2 * DT_PP_MAX_STAGES];
  for (int r = 0; r < pp; r++) {
    dt_status st = gen_rank(ctx, out, r, v, cnt, cnt + DT_PP_MAX_STAGES);
    if (st != DT_OK) {
      dt_pp_schedule_free(ctx, out);
      return st;
    }
  }
  return DT_OK;
}

/* ---- validation ------------------------------------------------------------------- */

/* Slots of the per-(stage, microbatch) tables: where each action is. */
enum { SL_F, SL_B, SL_SEND_F, SL_RECV_F, SL_SEND_B, SL_RECV_B, N_SLOTS };

static int slot_of(dt_pp_kind k) {
  switch (k) {
  case DT_PP_F: return SL_F;
  case DT_PP_B: return SL_B;
  case DT_PP_SEND_F: return SL_SEND_F;
  case DT_PP_RECV_F: return SL_RECV_F;
  case DT_PP_SEND_B: return SL_SEND_B;
  case DT_PP_RECV_B: return SL_RECV_B;
  default: return -1;
  }
}

typedef struct vstate {
  dt_ctx *ctx;
  const dt_pp_schedule *s;
  const char *who;
  int ns, m;
  int *pos[N_SLOTS];  /* [stage * m + mb]: index in its rank's list, -1 none */
  char *done[N_SLOTS];/* ran (simulation) */
  double *t_send[2];  /* SEND_F / SEND_B: when it ran */
} vstate;

/* "PATH:LINE:COL: rank R, action I (TEXT): msg" (the location only for a loaded action). */
static dt_status verr(vstate *v, int r, int i, const char *fmt, ...) DT_PRINTF(4, 5);
static dt_status verr(vstate *v, int r, int i, const char *fmt, ...) {
  char msg[DT_ERRMSG_LEN], loc[300] = "", txt[48] = "";
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (r < 0) return dt_error(v->ctx, DT_ERR_INVALID, v->who, "%s%s%s", v->s->path,
                             v->s->path[0] ? ": " : "", msg);
  const dt_pp_action *a = &v->s->acts[r][i];
  dt_pp_action_str(*a, txt, sizeof txt);
  if (v->s->path[0] && a->col > 0) snprintf(loc, sizeof loc, "%s:%d:%d: ", v->s->path, r + 1, a->col);
  return dt_error(v->ctx, DT_ERR_INVALID, v->who, "%srank %d, action %d (%s): %s", loc, r, i + 1,
                  txt, msg);
}

static void vfree(vstate *v) {
  for (int k = 0; k < N_SLOTS; k++) dt_host_free(v->ctx, v->pos[k]);
  for (int k = 0; k < N_SLOTS; k++) dt_host_free(v->ctx, v->done[k]);
  for (int k = 0; k < 2; k++) dt_host_free(v->ctx, v->t_send[k]);
}

static dt_status vinit(vstate *v, dt_ctx *ctx, const dt_pp_schedule *s, const char *who) {
  memset(v, 0, sizeof *v);
  v->ctx = ctx;
  v->s = s;
  v->who = who;
  v->ns = s->n_stages;
  v->m = s->n_microbatches;
  size_t n = (size_t)v->ns * (size_t)v->m;
  for (int k = 0; k < N_SLOTS; k++) {
    v->pos[k] = dt_host_alloc(ctx, n * sizeof(int));
    v->done[k] = dt_host_calloc(ctx, n);
    if (!v->pos[k] || !v->done[k]) goto nomem;
    for (size_t j = 0; j < n; j++) v->pos[k][j] = -1;
  }
  for (int k = 0; k < 2; k++)
    if (!(v->t_send[k] = dt_host_alloc(ctx, n * sizeof(double)))) goto nomem;
  return DT_OK;
nomem:
  vfree(v);
  return DT_ERR_NOMEM;
}

static bool crosses(const dt_pp_schedule *s, int a, int b) {
  return dt_pp_stage_rank(a, s->pp) != dt_pp_stage_rank(b, s->pp);
}

/* Static checks: kinds, ranges, placement, each action once, every F and B
 * there, and (with comms) the SEND / RECV pairs. Fills v->pos. */
static dt_status check_static(vstate *v) {
  const dt_pp_schedule *s = v->s;
  int ns = v->ns, m = v->m;
  for (int r = 0; r < s->pp; r++) {
    for (int i = 0; i < s->len[r]; i++) {
      dt_pp_action a = s->acts[r][i];
      int sl = slot_of(a.kind);
      if (sl < 0)
        return verr(v, r, i, "%s actions are not supported (F, B, SEND_F, RECV_F, SEND_B, RECV_B)",
                    dt_pp_kind_str(a.kind));
      if (!s->with_comms && dt_pp_kind_is_comm(a.kind))
        return verr(v, r, i, "a communication action in a compute-only schedule");
      if (a.stage < 0 || a.stage >= ns)
        return verr(v, r, i, "stage %d out of range (%d stages)", a.stage, ns);
      if (a.mb < 0) return verr(v, r, i, "no microbatch index");
      if (a.mb >= m) return verr(v, r, i, "microbatch %d out of range (%d)", a.mb, m);
      int home = dt_pp_stage_rank(a.stage, s->pp);
      if (home != r)
        return verr(v, r, i, "stage %d is on rank %d (loop placement: stage %% %d)", a.stage, home,
                    s->pp);
      bool ok = true;
      const char *why = "";
      switch (a.kind) {
      case DT_PP_SEND_F:
        ok = a.stage < ns - 1 && crosses(s, a.stage, a.stage + 1);
        why = "no stage after it on another rank to send to";
        break;
      case DT_PP_RECV_F:
        ok = a.stage > 0 && crosses(s, a.stage, a.stage - 1);
        why = "no stage before it on another rank to receive from";
        break;
      case DT_PP_SEND_B:
        ok = a.stage > 0 && crosses(s, a.stage, a.stage - 1);
        why = "no stage before it on another rank to send the gradient to";
        break;
      case DT_PP_RECV_B:
        ok = a.stage < ns - 1 && crosses(s, a.stage, a.stage + 1);
        why = "no stage after it on another rank to receive the gradient from";
        break;
      default: break;
      }
      if (!ok) return verr(v, r, i, "%s", why);
      int *p = &v->pos[sl][a.stage * m + a.mb];
      if (*p >= 0) return verr(v, r, i, "runs twice (first at action %d)", *p + 1);
      *p = i;
    }
  }
  for (int st = 0; st < ns; st++) {
    int r = dt_pp_stage_rank(st, s->pp);
    for (int mb = 0; mb < m; mb++) {
      if (v->pos[SL_F][st * m + mb] < 0)
        return verr(v, -1, 0, "rank %d never runs %dF%d (stage %d, microbatch %d)", r, st, mb, st, mb);
      if (v->pos[SL_B][st * m + mb] < 0)
        return verr(v, -1, 0, "rank %d never runs %dB%d (stage %d, microbatch %d)", r, st, mb, st, mb);
    }
  }
  if (!s->with_comms) return DT_OK;
  for (int st = 0; st + 1 < ns; st++) {
    if (!crosses(s, st, st + 1)) continue;
    int r0 = dt_pp_stage_rank(st, s->pp), r1 = dt_pp_stage_rank(st + 1, s->pp);
    for (int mb = 0; mb < m; mb++) {
      int j = st * m + mb, j1 = (st + 1) * m + mb;
      if (v->pos[SL_SEND_F][j] < 0)
        return verr(v, r0, v->pos[SL_F][j], "no %dSEND_F%d to stage %d on rank %d", st, mb, st + 1,
                    r1);
      if (v->pos[SL_RECV_F][j1] < 0)
        return verr(v, r0, v->pos[SL_SEND_F][j], "no %dRECV_F%d on rank %d to receive it", st + 1,
                    mb, r1);
      if (v->pos[SL_SEND_B][j1] < 0)
        return verr(v, r1, v->pos[SL_B][j1], "no %dSEND_B%d to stage %d on rank %d", st + 1, mb, st,
                    r0);
      if (v->pos[SL_RECV_B][j] < 0)
        return verr(v, r1, v->pos[SL_SEND_B][j1], "no %dRECV_B%d on rank %d to receive it", st, mb,
                    r0);
    }
  }
  return DT_OK;
}

/* Checks action i of rank r against what this rank has run; NULL when fine. */
static dt_status check_local(vstate *v, int r, int i) {
  const dt_pp_schedule *s = v->s;
  dt_pp_action a = s->acts[r][i];
  int m = v->m, j = a.stage * m + a.mb, ns = v->ns;
  switch (a.kind) {
  case DT_PP_F:
    if (a.stage > 0) {
      if (!crosses(s, a.stage, a.stage - 1)) {
        if (!v->done[SL_F][j - m])
          return verr(v, r, i, "runs before its input %dF%d on this rank", a.stage - 1, a.mb);
      } else if (s->with_comms && !v->done[SL_RECV_F][j]) {
        return verr(v, r, i, "runs before its input: no %dRECV_F%d before it", a.stage, a.mb);
      }
    }
    break;
  case DT_PP_B:
    if (!v->done[SL_F][j]) return verr(v, r, i, "backward before its forward %dF%d", a.stage, a.mb);
    if (a.stage < ns - 1) {
      if (!crosses(s, a.stage, a.stage + 1)) {
        if (!v->done[SL_B][j + m])
          return verr(v, r, i, "runs before its output gradient %dB%d on this rank", a.stage + 1,
                      a.mb);
      } else if (s->with_comms && !v->done[SL_RECV_B][j]) {
        return verr(v, r, i, "runs before its output gradient: no %dRECV_B%d before it", a.stage,
                    a.mb);
      }
    }
    break;
  case DT_PP_SEND_F:
    if (!v->done[SL_F][j]) return verr(v, r, i, "sends before %dF%d computed it", a.stage, a.mb);
    break;
  case DT_PP_SEND_B:
    if (!v->done[SL_B][j]) return verr(v, r, i, "sends before %dB%d computed it", a.stage, a.mb);
    break;
  default: break;
  }
  return DT_OK;
}

/* The SEND action i of rank r waits for in this mode: false when none; else its
 * slot and table index. */
static bool wait_for(const vstate *v, dt_pp_recv_mode mode, const dt_pp_action *a, int *slot,
                     int *j) {
  const dt_pp_schedule *s = v->s;
  int m = v->m;
  bool fwd;
  if (mode == DT_PP_RECV_BLOCKING) {
    if (a->kind != DT_PP_RECV_F && a->kind != DT_PP_RECV_B) return false;
    fwd = a->kind == DT_PP_RECV_F;
  } else {
    if (!s->with_comms) return false;
    if (a->kind == DT_PP_F && a->stage > 0 && crosses(s, a->stage, a->stage - 1)) fwd = true;
    else if (a->kind == DT_PP_B && a->stage < v->ns - 1 && crosses(s, a->stage, a->stage + 1))
      fwd = false;
    else return false;
  }
  *slot = fwd ? SL_SEND_F : SL_SEND_B;
  *j = (fwd ? a->stage - 1 : a->stage + 1) * m + a->mb;
  return true;
}

typedef struct simout {
  int peak[DT_PP_MAX_RANKS];
  double busy[DT_PP_MAX_RANKS];
  double clock[DT_PP_MAX_RANKS];
} simout;

/* Runs the lists: each rank in order until it waits for a SEND that has not
 * run (mode: at a RECV, or at the compute using it), sweeping the ranks until
 * all finish or none moves (a deadlock). Compute-only lists run each rank alone
 * (no cross-rank waits). */
static dt_status simulate(vstate *v, dt_pp_recv_mode mode, double t_f, double t_b, simout *so) {
  const dt_pp_schedule *s = v->s;
  int pc[DT_PP_MAX_RANKS] = {0}, live[DT_PP_MAX_RANKS] = {0};
  memset(so, 0, sizeof *so);
  int m = v->m;
  bool progress = true, all = false;
  while (progress && !all) {
    progress = false;
    all = true;
    for (int r = 0; r < s->pp; r++) {
      while (pc[r] < s->len[r]) {
        int i = pc[r];
        dt_pp_action a = s->acts[r][i];
        int j = a.stage * m + a.mb, ws, wj;
        DT_CHECK(check_local(v, r, i));
        if (wait_for(v, mode, &a, &ws, &wj)) {
          if (!v->done[ws][wj]) break;
          double t = v->t_send[ws == SL_SEND_F ? 0 : 1][wj];
          if (t > so->clock[r]) so->clock[r] = t;
        }
        switch (a.kind) {
        case DT_PP_F:
          so->clock[r] += t_f;
          so->busy[r] += t_f;
          if (++live[r] > so->peak[r]) so->peak[r] = live[r];
          break;
        case DT_PP_B:
          so->clock[r] += t_b;
          so->busy[r] += t_b;
          live[r]--;
          break;
        case DT_PP_SEND_F: v->t_send[0][j] = so->clock[r]; break;
        case DT_PP_SEND_B: v->t_send[1][j] = so->clock[r]; break;
        default: break;
        }
        v->done[slot_of(a.kind)][j] = 1;
        pc[r]++;
        progress = true;
      }
      if (pc[r] < s->len[r]) all = false;
    }
  }
  if (all) return DT_OK;
  /* Deadlock: follow who waits on whom from the first blocked rank round to a
   * rank already named (each waits for a SEND later in an unfinished list). */
  char msg[DT_ERRMSG_LEN];
  size_t at = 0;
  int r = 0;
  while (pc[r] >= s->len[r]) r++;
  bool seen[DT_PP_MAX_RANKS] = {false};
  int first = r;
  msg[0] = '\0';
  while (!seen[r] && pc[r] < s->len[r]) {
    seen[r] = true;
    dt_pp_action a = s->acts[r][pc[r]];
    int ws, wj;
    if (!wait_for(v, mode, &a, &ws, &wj)) break; /* cannot happen: a rank stops only to wait */
    int peer_stage = wj / m;
    int pr = dt_pp_stage_rank(peer_stage, s->pp);
    char t1[48], t2[48];
    dt_pp_action_str(a, t1, sizeof t1);
    dt_pp_action_str(act(ws == SL_SEND_F ? DT_PP_SEND_F : DT_PP_SEND_B, peer_stage, a.mb), t2,
                     sizeof t2);
    if (at < sizeof msg)
      at += (size_t)snprintf(msg + at, sizeof msg - at,
                             "%srank %d action %d (%s) waits for %s, rank %d action %d",
                             r == first ? "" : "; ", r, pc[r] + 1, t1, t2, pr, v->pos[ws][wj] + 1);
    r = pr;
  }
  return verr(v, first, pc[first], "deadlock: %s", msg);
}

dt_status dt_pp_schedule_validate(dt_ctx *ctx, const dt_pp_schedule *s) {
  static const char who[] = "dt_pp_schedule_validate";
  if (!s) return dt_error(ctx, DT_ERR_INVALID, who, "no schedule");
  if (s->pp < 1 || s->pp > DT_PP_MAX_RANKS || s->n_stages < 1 || s->n_stages > DT_PP_MAX_STAGES ||
      s->n_stages % s->pp != 0 || s->n_microbatches < 1 ||
      s->n_microbatches > DT_PP_MAX_MICROBATCHES)
    return dt_error(ctx, DT_ERR_INVALID, who, "%s%spp %d, %d stages, %d microbatches", s->path,
                    s->path[0] ? ": " : "", s->pp, s->n_stages, s->n_microbatches);
  vstate v;
  DT_CHECK(vinit(&v, ctx, s, who));
  dt_status st = check_static(&v);
  simout so;
  if (st == DT_OK) st = simulate(&v, DT_PP_RECV_BLOCKING, 1, 2, &so);
  vfree(&v);
  return st;
}

/* ---- lowering --------------------------------------------------------------------- */

dt_status dt_pp_schedule_lower(dt_ctx *ctx, dt_pp_schedule *s) {
  static const char who[] = "dt_pp_schedule_lower";
  if (!s) return dt_error(ctx, DT_ERR_INVALID, who, "no schedule");
  if (s->with_comms) return DT_OK;
  DT_CHECK(dt_pp_schedule_validate(ctx, s));
  int pp = s->pp, ns = s->n_stages, m = s->n_microbatches;
  size_t n = (size_t)ns * (size_t)m;
  /* what has been listed: F, B, RECV_F, RECV_B of (stage, mb); each stage is on one rank */
  char *listed = dt_host_calloc(ctx, 4 * n);
  if (!listed) return DT_ERR_NOMEM;
  char *lF = listed, *lB = listed + n, *lRF = listed + 2 * n, *lRB = listed + 3 * n;
  dt_pp_schedule o;
  memset(&o, 0, sizeof o);
  o.kind = s->kind;
  o.pp = pp;
  o.n_stages = ns;
  o.n_microbatches = m;
  o.with_comms = true;
  memcpy(o.path, s->path, sizeof o.path);
  int pc[DT_PP_MAX_RANKS] = {0};
  dt_status st = DT_OK;
  for (;;) {
    bool progress = false, left = false;
    for (int r = 0; r < pp && st == DT_OK; r++) {
      if (pc[r] >= s->len[r]) continue;
      left = true;
      dt_pp_action a = s->acts[r][pc[r]];
      int j = a.stage * m + a.mb;
      bool ready;
      if (a.kind == DT_PP_F)
        ready = a.stage == 0 || lRF[j] || (!crosses(s, a.stage, a.stage - 1) && lF[j - m]);
      else
        ready = a.stage == ns - 1 || lRB[j] || (!crosses(s, a.stage, a.stage + 1) && lB[j + m]);
      if (!ready) continue;
      st = push(ctx, &o, r, a);
      if (a.kind == DT_PP_F) {
        lF[j] = 1;
        if (st == DT_OK && a.stage < ns - 1 && crosses(s, a.stage, a.stage + 1)) {
          st = push(ctx, &o, r, act(DT_PP_SEND_F, a.stage, a.mb));
          if (st == DT_OK)
            st = push(ctx, &o, dt_pp_stage_rank(a.stage + 1, pp), act(DT_PP_RECV_F, a.stage + 1, a.mb));
          lRF[j + m] = 1;
        }
      } else {
        lB[j] = 1;
        if (st == DT_OK && a.stage > 0 && crosses(s, a.stage, a.stage - 1)) {
          st = push(ctx, &o, r, act(DT_PP_SEND_B, a.stage, a.mb));
          if (st == DT_OK)
            st = push(ctx, &o, dt_pp_stage_rank(a.stage - 1, pp), act(DT_PP_RECV_B, a.stage - 1, a.mb));
          lRB[j - m] = 1;
        }
      }
      pc[r]++;
      progress = true;
    }
    if (st != DT_OK || !left) break;
    if (!progress) {
      char msg[DT_ERRMSG_LEN];
      size_t at = 0;
      int first = -1;
      msg[0] = '\0';
      for (int r = 0; r < pp; r++) {
        if (pc[r] >= s->len[r]) continue;
        if (first < 0) first = r;
        char t[48];
        dt_pp_action_str(s->acts[r][pc[r]], t, sizeof t);
        if (at < sizeof msg)
          at += (size_t)snprintf(msg + at, sizeof msg - at, "%srank %d at action %d (%s)",
                                 first == r ? "" : ", ", r, pc[r] + 1, t);
      }
      const dt_pp_action *fa = &s->acts[first][pc[first]];
      char loc[300] = "";
      if (s->path[0] && fa->col > 0) snprintf(loc, sizeof loc, "%s:%d:%d: ", s->path, first + 1, fa->col);
      st = dt_error(ctx, DT_ERR_INVALID, who,
                    "%scannot place the sends and receives: every rank waits for an input no "
                    "other rank produces first (%s)",
                    loc, msg);
      break;
    }
  }
  dt_host_free(ctx, listed);
  if (st == DT_OK) st = dt_pp_schedule_validate(ctx, &o);
  if (st != DT_OK) {
    dt_pp_schedule_free(ctx, &o);
    return st;
  }
  dt_pp_schedule_free(ctx, s);
  *s = o;
  return DT_OK;
}

/* ---- CSV -------------------------------------------------------------------------- */

enum { PP_CSV_MAX_BYTES = 16 << 20 };

dt_status dt_pp_schedule_parse(dt_ctx *ctx, const char *text, const char *path, int pp,
                               int n_stages, int m, dt_pp_schedule *out) {
  static const char who[] = "dt_pp_schedule_parse";
  if (!out) return dt_error(ctx, DT_ERR_INVALID, who, "no schedule");
  memset(out, 0, sizeof *out);
  const char *name = path && *path ? path : "<schedule>";
  if (!text) return dt_error(ctx, DT_ERR_INVALID, who, "%s: no text", name);
  out->kind = DT_PP_CSV;
  snprintf(out->path, sizeof out->path, "%s", name);
  dt_status st = DT_OK;
  int rows = 0, max_stage = -1, max_mb = -1;
  bool comms = false;
  const char *p = text;
  while (*p && st == DT_OK) {
    const char *eol = strchr(p, '\n');
    const char *next = eol ? eol + 1 : p + strlen(p);
    if (!eol) eol = next;
    const char *le = eol;
    if (le > p && le[-1] == '\r') le--;
    if (rows == DT_PP_MAX_RANKS) {
      st = dt_error(ctx, DT_ERR_INVALID, who, "%s:%d: more than %d rows (one per pp rank)", name,
                    rows + 1, DT_PP_MAX_RANKS);
      break;
    }
    int r = rows++, cell = 0;
    const char *c = p;
    for (;;) {
      const char *ce = memchr(c, ',', (size_t)(le - c));
      if (!ce) ce = le;
      cell++;
      const char *a = skip_ws(c, ce), *b = ce;
      while (b > a && (b[-1] == ' ' || b[-1] == '\t')) b--;
      if (b - a >= 2 && *a == '"' && b[-1] == '"') {
        a++;
        b--;
      }
      int col = (int)(a - p) + 1;
      if (b > a) {
        dt_pp_action ac;
        const char *why;
        if (!dt_pp_action_parse(a, (size_t)(b - a), &ac, &why)) {
          st = dt_error(ctx, DT_ERR_INVALID, who, "%s:%d:%d: rank %d, cell %d: '%.*s': %s", name,
                        r + 1, col, r, cell, (int)(b - a) > 40 ? 40 : (int)(b - a), a, why);
          break;
        }
        if (slot_of(ac.kind) < 0) {
          st = dt_error(ctx, DT_ERR_INVALID, who,
                        "%s:%d:%d: rank %d, cell %d: '%.*s': %s actions are not supported (F, B, "
                        "SEND_F, RECV_F, SEND_B, RECV_B)",
                        name, r + 1, col, r, cell, (int)(b - a), a, dt_pp_kind_str(ac.kind));
          break;
        }
        if (ac.mb < 0) {
          st = dt_error(ctx, DT_ERR_INVALID, who, "%s:%d:%d: rank %d, cell %d: '%.*s': no microbatch",
                        name, r + 1, col, r, cell, (int)(b - a), a);
          break;
        }
        if ((n_stages > 0 && ac.stage >= n_stages) || ac.stage >= DT_PP_MAX_STAGES) {
          st = dt_error(ctx, DT_ERR_INVALID, who,
                        "%s:%d:%d: rank %d, cell %d: stage %d out of range (%d stages)", name, r + 1,
                        col, r, cell, ac.stage, n_stages > 0 ? n_stages : DT_PP_MAX_STAGES);
          break;
        }
        if ((m > 0 && ac.mb >= m) || ac.mb >= DT_PP_MAX_MICROBATCHES) {
          st = dt_error(ctx, DT_ERR_INVALID, who,
                        "%s:%d:%d: rank %d, cell %d: microbatch %d out of range (%d)", name, r + 1,
                        col, r, cell, ac.mb, m > 0 ? m : DT_PP_MAX_MICROBATCHES);
          break;
        }
        ac.col = col;
        if (ac.stage > max_stage) max_stage = ac.stage;
        if (ac.mb > max_mb) max_mb = ac.mb;
        if (dt_pp_kind_is_comm(ac.kind)) comms = true;
        if ((st = push(ctx, out, r, ac)) != DT_OK) break;
      }
      if (ce == le) break;
      c = ce + 1;
    }
    p = next;
  }
  if (st == DT_OK && rows == 0) st = dt_error(ctx, DT_ERR_INVALID, who, "%s: no rows", name);
  if (st == DT_OK && pp > 0 && rows != pp)
    st = dt_error(ctx, DT_ERR_INVALID, who, "%s: %d rows, one per rank of the pp group of %d", name,
                  rows, pp);
  if (st == DT_OK) {
    out->pp = rows;
    out->n_stages = n_stages > 0 ? n_stages : max_stage + 1;
    out->n_microbatches = m > 0 ? m : max_mb + 1;
    out->with_comms = comms;
    if (out->n_stages < 1 || out->n_stages % rows != 0)
      st = dt_error(ctx, DT_ERR_INVALID, who, "%s: %d stages do not divide over the %d ranks (rows)",
                    name, out->n_stages, rows);
  }
  if (st == DT_OK) st = comms ? dt_pp_schedule_validate(ctx, out) : dt_pp_schedule_lower(ctx, out);
  if (st != DT_OK) dt_pp_schedule_free(ctx, out);
  return st;
}

dt_status dt_pp_schedule_load(dt_ctx *ctx, const char *path, int pp, int n_stages, int m,
                              dt_pp_schedule *out) {
  static const char who[] = "dt_pp_schedule_load";
  if (out) memset(out, 0, sizeof *out);
  if (!path || !out) return dt_error(ctx, DT_ERR_INVALID, who, "no path or schedule");
  FILE *f = fopen(path, "rb");
  if (!f) return dt_error(ctx, DT_ERR_IO, who, "%s: cannot open: %s", path, strerror(errno));
  char *buf = dt_host_alloc(ctx, PP_CSV_MAX_BYTES + 1);
  if (!buf) {
    fclose(f);
    return DT_ERR_NOMEM;
  }
  size_t n = fread(buf, 1, PP_CSV_MAX_BYTES + 1, f);
  bool bad = ferror(f) != 0;
  fclose(f);
  dt_status st;
  if (bad) st = dt_error(ctx, DT_ERR_IO, who, "%s: read error", path);
  else if (n > PP_CSV_MAX_BYTES)
    st = dt_error(ctx, DT_ERR_INVALID, who, "%s: larger than %d bytes, not a schedule", path,
                  PP_CSV_MAX_BYTES);
  else if (memchr(buf, '\0', n))
    st = dt_error(ctx, DT_ERR_INVALID, who, "%s: contains a NUL byte, not a schedule", path);
  else {
    buf[n] = '\0';
    st = dt_pp_schedule_parse(ctx, buf, path, pp, n_stages, m, out);
  }
  dt_host_free(ctx, buf);
  return st;
}

int dt_pp_schedule_format(const dt_pp_schedule *s, char *buf, size_t n) {
  size_t at = 0;
  long tot = 0;
  if (n > 0) buf[0] = '\0';
  if (!s) return 0;
  for (int r = 0; r < s->pp; r++) {
    for (int i = 0; i <= s->len[r]; i++) {
      char t[64];
      int k;
      if (i < s->len[r]) {
        k = dt_pp_action_str(s->acts[r][i], t, sizeof t);
        if (i + 1 < s->len[r]) t[k++] = ',';
      } else {
        t[0] = '\n';
        k = 1;
      }
      t[k] = '\0';
      if (at + (size_t)k < n) {
        memcpy(buf + at, t, (size_t)k + 1);
        at += (size_t)k;
      } else {
        at = n; /* truncated: stop writing, keep counting */
      }
      tot += k;
    }
  }
  return tot > 0x7fffffff ? -1 : (int)tot;
}

dt_status dt_pp_schedule_save(dt_ctx *ctx, const dt_pp_schedule *s, const char *path) {
  static const char who[] = "dt_pp_schedule_save";
  if (!s || !path) return dt_error(ctx, DT_ERR_INVALID, who, "no schedule or path");
  int len = dt_pp_schedule_format(s, NULL, 0);
  if (len < 0) return dt_error(ctx, DT_ERR_INVALID, who, "%s: schedule too large", path);
  char *text = dt_host_alloc(ctx, (size_t)len + 1);
  if (!text) return DT_ERR_NOMEM;
  dt_pp_schedule_format(s, text, (size_t)len + 1);
  char tmp[4096];
  dt_status st = DT_OK;
  if ((size_t)snprintf(tmp, sizeof tmp, "%s.XXXXXX", path) >= sizeof tmp) {
    st = dt_error(ctx, DT_ERR_IO, who, "%s: path too long", path);
  } else {
    int fd = mkstemp(tmp);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f) {
      if (fd >= 0) close(fd);
      st = dt_error(ctx, DT_ERR_IO, who, "%s: cannot create a temporary file: %s", path,
                    strerror(errno));
    } else {
      bool ok = fwrite(text, 1, (size_t)len, f) == (size_t)len;
      ok = (fclose(f) == 0) && ok;
      if (!ok || rename(tmp, path) != 0) {
        st = dt_error(ctx, DT_ERR_IO, who, "%s: write failed: %s", path, strerror(errno));
        remove(tmp);
      }
    }
  }
  dt_host_free(ctx, text);
  return st;
}

/* ---- analytic helpers ------------------------------------------------------------- */

double dt_pp_bubble_fraction(dt_pp_schedule_kind kind, int pp, int v, int m) {
  if (pp < 1 || m < 1 || v < 1) return -1;
  if (kind == DT_PP_GPIPE || kind == DT_PP_1F1B)
    return v == 1 ? (double)(pp - 1) / (double)(m + pp - 1) : -1;
  if (kind == DT_PP_INTERLEAVED_1F1B) return (double)(pp - 1) / ((double)v * m + pp - 1);
  return -1;
}

long dt_pp_p2p_count(int pp, int v, int m) {
  if (pp < 1 || v < 1 || m < 1) return -1;
  if (pp == 1) return 0; /* every stage on one rank: all passes are local */
  return 2L * ((long)v * pp - 1) * m;
}

dt_status dt_pp_schedule_stats(dt_ctx *ctx, const dt_pp_schedule *s, dt_pp_recv_mode mode,
                               double t_f, double t_b, dt_pp_stats *out) {
  static const char who[] = "dt_pp_schedule_stats";
  if (!s || !out) return dt_error(ctx, DT_ERR_INVALID, who, "no schedule or stats");
  memset(out, 0, sizeof *out);
  if (mode != DT_PP_RECV_BLOCKING && mode != DT_PP_RECV_AT_USE)
    return dt_error(ctx, DT_ERR_INVALID, who, "recv mode %d", (int)mode);
  if (!(t_f >= 0) || !(t_b >= 0))
    return dt_error(ctx, DT_ERR_INVALID, who, "action times %g, %g (>= 0)", t_f, t_b);
  const dt_pp_schedule *w = s;
  dt_pp_schedule low;
  memset(&low, 0, sizeof low);
  if (!s->with_comms) { /* lower a copy */
    low = *s;
    for (int r = 0; r < DT_PP_MAX_RANKS; r++) {
      low.acts[r] = NULL;
      low.len[r] = low.cap[r] = 0;
    }
    dt_status st = DT_OK;
    for (int r = 0; r < s->pp && st == DT_OK; r++)
      for (int i = 0; i < s->len[r] && st == DT_OK; i++) st = push(ctx, &low, r, s->acts[r][i]);
    if (st == DT_OK) st = dt_pp_schedule_lower(ctx, &low);
    if (st != DT_OK) {
      dt_pp_schedule_free(ctx, &low);
      return st;
    }
    w = &low;
  }
  vstate v;
  dt_status st = vinit(&v, ctx, w, who);
  simout so;
  if (st == DT_OK) {
    st = check_static(&v);
    /* the strict run validates (and times BLOCKING); AT_USE runs again afresh */
    if (st == DT_OK) st = simulate(&v, DT_PP_RECV_BLOCKING, t_f, t_b, &so);
    vfree(&v);
    if (st == DT_OK && mode == DT_PP_RECV_AT_USE) {
      st = vinit(&v, ctx, w, who);
      if (st == DT_OK) {
        st = check_static(&v);
        if (st == DT_OK) st = simulate(&v, mode, t_f, t_b, &so);
        vfree(&v);
      }
    }
  }
  if (st == DT_OK) {
    double busy = 0;
    for (int r = 0; r < w->pp; r++) {
      for (int i = 0; i < w->len[r]; i++)
        if (w->acts[r][i].kind == DT_PP_SEND_F || w->acts[r][i].kind == DT_PP_SEND_B) out->sends[r]++;
      out->total_sends += out->sends[r];
      out->peak_in_flight[r] = so.peak[r];
      out->busy[r] = so.busy[r];
      busy += so.busy[r];
      if (so.clock[r] > out->makespan) out->makespan = so.clock[r];
    }
    out->bubble = out->makespan > 0 ? 1.0 - busy / (w->pp * out->makespan) : 0;
  }
  dt_pp_schedule_free(ctx, &low);
  return st;
}
