/* lib/parallel/plan_file.c: plan files (plans/NAME.plan, format in plans/README.md),
 * ParallelStyle defaults and printing, fqn matching and plan resolution.
 *
 * A plan file holds settings (name, dims, loss_parallel; zero, mixed_precision_param,
 * mixed_precision_reduce for FSDP; bucket_cap_mb for DDP; max_norm, the step's
 * gradient clipping) and, under [dim] headers,
 * entries "pattern = Style(kwarg=value, ...)" written as PyTorch writes them
 * (torch/distributed/tensor/parallel/style.py: ColwiseParallel, RowwiseParallel,
 * SequenceParallel, PrepareModuleInput, PrepareModuleOutput; under [dp_shard] only
 * FSDP2's fully_shard, torch/distributed/fsdp/_fully_shard/_fully_shard.py, whose
 * left-hand side may be a group "norm, output" (one unit of several modules) or
 * "root", the model itself). Styles take PyTorch's defaults for omitted kwargs.
 * Every error is found before any work: syntax errors name FILE:LINE:COLUMN and
 * what was expected; semantic errors are one-line DT_ERR_INVALID messages that
 * name FILE:LINE. dt_plan_resolve infers a -1 dim from the world (TorchTitan's
 * ParallelDims._validate, torchtitan/distributed/parallel_dims.py: dp_shard = -1)
 * and checks the plan against a Llama config whose fqns it generates itself
 * (the module tree of torchtitan/models/llama3/model/model.py), so this file
 * does not depend on lib/nn code; there it also checks that fully_shard units
 * claim every weight once (TorchTitan's apply_fsdp units never overlap; a root
 * entry takes what no unit took). No state outside the caller's structs.
 */
#include "config.h"
#include "parallel/parallel.h"

#include <ctype.h>
#include <fnmatch.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- names --------------------------------------------------------------------- */

/* Indexed by dt_style_kind. */
static const char *const k_style_names[] = {"ColwiseParallel", "RowwiseParallel",
                                            "SequenceParallel", "PrepareModuleInput",
                                            "PrepareModuleOutput", "fully_shard"};
enum { N_STYLES = (int)(sizeof k_style_names / sizeof k_style_names[0]) };

/* TorchTitan's mesh dims in mesh order (ParallelDims.build_mesh,
 * torchtitan/distributed/parallel_dims.py at v0.2.0: [pp, dp_replicate,
 * dp_shard, cp, tp], TP innermost). */
static const char *const k_dim_names[] = {"pp", "dp_replicate", "dp_shard", "cp", "tp"};
enum { N_DIM_NAMES = (int)(sizeof k_dim_names / sizeof k_dim_names[0]) };
_Static_assert((int)N_DIM_NAMES == (int)DT_PLAN_MAX_DIMS, "one plan dim per TorchTitan dim");

typedef enum kwarg {
  KW_INPUT_LAYOUTS = 0, KW_DESIRED_INPUT_LAYOUTS, KW_OUTPUT_LAYOUTS, KW_DESIRED_OUTPUT_LAYOUTS,
  KW_USE_LOCAL_OUTPUT, KW_SEQUENCE_DIM, KW_RESHARD_AFTER_FORWARD, N_KWARGS
} kwarg;
static const char *const k_kwarg_names[N_KWARGS] = {
    "input_layouts", "desired_input_layouts", "output_layouts", "desired_output_layouts",
    "use_local_output", "sequence_dim", "reshard_after_forward"};

#define KWBIT(k) (1u << (k))
/* The kwargs each style's constructor takes in PyTorch (style.py), by dt_style_kind. */
static const unsigned k_style_kwargs[N_STYLES] = {
    KWBIT(KW_INPUT_LAYOUTS) | KWBIT(KW_OUTPUT_LAYOUTS) | KWBIT(KW_USE_LOCAL_OUTPUT),
    KWBIT(KW_INPUT_LAYOUTS) | KWBIT(KW_OUTPUT_LAYOUTS) | KWBIT(KW_USE_LOCAL_OUTPUT),
    KWBIT(KW_SEQUENCE_DIM) | KWBIT(KW_USE_LOCAL_OUTPUT),
    KWBIT(KW_INPUT_LAYOUTS) | KWBIT(KW_DESIRED_INPUT_LAYOUTS) | KWBIT(KW_USE_LOCAL_OUTPUT),
    KWBIT(KW_OUTPUT_LAYOUTS) | KWBIT(KW_DESIRED_OUTPUT_LAYOUTS) | KWBIT(KW_USE_LOCAL_OUTPUT),
    /* fully_shard(module, *, mesh, reshard_after_forward, shard_placement_fn, mp_policy,
     * offload_policy, ignored_params): the mesh is the [dp_shard] dim and mp_policy the
     * plan's mixed_precision_* settings, so reshard_after_forward is the one kwarg left */
    KWBIT(KW_RESHARD_AFTER_FORWARD)};

/* Settings allowed above the first [dim] header. */
typedef enum setting_id {
  SET_NAME = 0, SET_DIMS, SET_LOSS_PARALLEL, SET_ZERO, SET_MP_PARAM, SET_MP_REDUCE,
  SET_BUCKET_CAP_MB, SET_CP_ROTATE, SET_CP_LOAD_BALANCE, SET_PP_SCHEDULE, SET_PP_CSV,
  SET_PP_MBS, SET_PP_MBN, SET_PP_STAGES, SET_PP_FIRST_LESS, SET_PP_LAST_LESS, SET_AC_MODE, SET_AC_OPTION,
  SET_MAX_NORM, N_SETTINGS
} setting_id;
static const char *const k_settings[N_SETTINGS] = {
    "name", "dims", "loss_parallel", "zero", "mixed_precision_param", "mixed_precision_reduce",
    "bucket_cap_mb", "context_parallel_rotate_method", "context_parallel_load_balance",
    "pipeline_parallel_schedule", "pipeline_parallel_schedule_csv",
    "pipeline_parallel_microbatch_size", "pipeline_parallel_microbatches",
    "module_fqns_per_model_part",
    "pipeline_parallel_first_stage_less_layers", "pipeline_parallel_last_stage_less_layers",
    "activation_checkpoint_mode", "selective_ac_option", "max_norm"};
#define SETBIT(k) (1u << (k))

/* The model itself in a fully_shard entry (TorchTitan's final fully_shard(model)). */
static const char k_root[] = "root";

/* Plan files are hand-written and a few KiB; anything over 1 MiB is not a plan. */
enum { PLAN_FILE_MAX_BYTES = 1 << 20 };
/* Dim sizes above this are typos, not clusters; it also keeps products in range. */
enum { PLAN_DIM_MAX = 1 << 20 };
/* Longest style / kwarg / dim / placement word we look at (names are < 32 chars). */
enum { WORD_MAX = 64 };
/* Edit distance under which a misspelt name gets a "did you mean" hint. */
enum { SUGGEST_MAX_DIST = 3 };
/* Longest fqn token fnmatch sees (dt_plan_entry.pattern is 96 chars). */
enum { FQN_TOKEN_MAX = 128 };
/* Most patterns in one fully_shard group: each takes at least 2 of the pattern's
 * 96 chars (a letter and a ','), so no group can have more. */
enum { GROUP_MAX = 48 };
/* bucket_cap_mb above 1 TiB is larger than any device's memory: a typo, not a bucket. */
enum { BUCKET_CAP_MB_MAX = 1 << 20 };
/* max_norm: any norm a gradient reaches in f32 is below this; more is a typo. */
static const double MAX_NORM_MAX = 1e30;

/* ---- small helpers -------------------------------------------------------------- */

/* Levenshtein distance, case-insensitive, ignoring '_' (so colwise_parallel is
 * close to ColwiseParallel); words longer than WORD_MAX count as far. */
static int edit_distance(const char *a, const char *b) {
  char x[WORD_MAX], y[WORD_MAX];
  size_t n = 0, m = 0;
  for (; *a; a++) {
    if (*a == '_') continue;
    if (n + 1 >= sizeof x) return WORD_MAX;
    x[n++] = (char)tolower((unsigned char)*a);
  }
  for (; *b; b++) {
    if (*b == '_') continue;
    if (m + 1 >= sizeof y) return WORD_MAX;
    y[m++] = (char)tolower((unsigned char)*b);
  }
  int row[WORD_MAX + 1];
  for (size_t j = 0; j <= m; j++) row[j] = (int)j;
  for (size_t i = 1; i <= n; i++) {
    int diag = row[0];
    row[0] = (int)i;
    for (size_t j = 1; j <= m; j++) {
      int up = row[j];
      int best = diag + (x[i - 1] != y[j - 1]);
      if (up + 1 < best) best = up + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      row[j] = best;
      diag = up;
    }
  }
  return row[m];
}

/* The closest of names[0..n) to `w`, or NULL when none is close. */
static const char *suggest(const char *w, const char *const *names, int n) {
  const char *best = NULL;
  int bestd = SUGGEST_MAX_DIST + 1;
  for (int i = 0; i < n; i++) {
    int d = edit_distance(w, names[i]);
    if (d < bestd) {
      bestd = d;
      best = names[i];
    }
  }
  return best;
}

static int find_name(const char *w, const char *const *names, int n) {
  for (int i = 0; i < n; i++)
    if (!strcmp(w, names[i])) return i;
  return -1;
}

/* snprintf-style appender: counts what would be written, truncates safely. */
typedef struct appender {
  char *buf;
  size_t n;
  size_t len;
} appender;

static void app(appender *a, const char *fmt, ...) DT_PRINTF(2, 3);
static void app(appender *a, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  size_t room = a->len < a->n ? a->n - a->len : 0;
  int w = vsnprintf(room ? a->buf + a->len : NULL, room, fmt, ap);
  va_end(ap);
  if (w > 0) a->len += (size_t)w;
}

static void app_placement(appender *a, dt_placement p) {
  switch (p.kind) {
    case DT_PL_SHARD: app(a, "Shard(%d)", p.dim); break;
    case DT_PL_REPLICATE: app(a, "Replicate()"); break;
    case DT_PL_PARTIAL:
      if (p.op == DT_RED_SUM) app(a, "Partial()");
      else app(a, "Partial(%s)", dt_reduce_name(p.op));
      break;
  }
}

static void app_layout(appender *a, dt_style_layout l) {
  if (l.none) app(a, "None");
  else app_placement(a, l.pl);
}

static void app_tuple(appender *a, const dt_style_layout *l, int n) {
  app(a, "(");
  for (int i = 0; i < n; i++) {
    if (i) app(a, ", ");
    app_layout(a, l[i]);
  }
  app(a, n == 1 ? ",)" : ")");
}

static bool layout_eq(dt_style_layout a, dt_style_layout b) {
  if (a.none || b.none) return a.none == b.none;
  return dt_placement_eq(a.pl, b.pl);
}

static dt_style_layout lay(dt_placement p) { return (dt_style_layout){.none = false, .pl = p}; }

/* ---- styles --------------------------------------------------------------------- */

void dt_style_default(dt_style_kind kind, dt_style *out) {
  memset(out, 0, sizeof *out);
  out->kind = kind;
  out->sequence_dim = 1; /* SequenceParallel's default: dim 1 of (bs, seq, dim) */
  out->reshard_after_forward = -1; /* fully_shard's None */
  switch (kind) {
    case DT_STYLE_COLWISE:
      out->n_in = out->n_out = 1;
      out->input_layouts[0] = lay(dt_replicate());
      out->desired_input_layouts[0] = lay(dt_replicate());
      out->output_layouts[0] = lay(dt_shard(-1));
      out->use_local_output = true;
      break;
    case DT_STYLE_ROWWISE:
      /* desired input S(-1) is for nn.Linear; an nn.Embedding wants Replicate()
       * (PyTorch decides by module type when the style is applied). */
      out->n_in = out->n_out = 1;
      out->input_layouts[0] = lay(dt_shard(-1));
      out->desired_input_layouts[0] = lay(dt_shard(-1));
      out->output_layouts[0] = lay(dt_replicate());
      out->use_local_output = true;
      break;
    case DT_STYLE_SEQUENCE:
      /* Not kwargs: the layouts SequenceParallel implies (input taken as / made
       * Shard(sequence_dim), output Shard(sequence_dim)), filled for the hooks. */
      out->n_in = out->n_out = 1;
      out->input_layouts[0] = lay(dt_shard(1));
      out->desired_input_layouts[0] = lay(dt_shard(1));
      out->output_layouts[0] = lay(dt_shard(1));
      out->use_local_output = false;
      break;
    case DT_STYLE_PREPARE_INPUT: out->use_local_output = false; break;
    case DT_STYLE_PREPARE_OUTPUT: out->use_local_output = true; break;
    case DT_STYLE_FULLY_SHARD: break;
  }
}

static void sequence_fill(dt_style *s) {
  s->input_layouts[0] = lay(dt_shard(s->sequence_dim));
  s->desired_input_layouts[0] = lay(dt_shard(s->sequence_dim));
  s->output_layouts[0] = lay(dt_shard(s->sequence_dim));
}

int dt_style_str(const dt_style *s, char *buf, size_t n) {
  appender a = {buf, n, 0};
  if (buf && n) buf[0] = '\0';
  if (!s || (int)s->kind < 0 || (int)s->kind >= N_STYLES) {
    app(&a, "?");
    return (int)a.len;
  }
  dt_style d;
  dt_style_default(s->kind, &d);
  app(&a, "%s(", k_style_names[s->kind]);
  const char *sep = "";
  switch (s->kind) {
    case DT_STYLE_COLWISE:
    case DT_STYLE_ROWWISE:
      if (s->n_in == 1 && !layout_eq(s->input_layouts[0], d.input_layouts[0])) {
        app(&a, "input_layouts=");
        app_layout(&a, s->input_layouts[0]);
        sep = ", ";
      }
      if (s->n_out == 1 && !layout_eq(s->output_layouts[0], d.output_layouts[0])) {
        app(&a, "%soutput_layouts=", sep);
        app_layout(&a, s->output_layouts[0]);
        sep = ", ";
      }
      break;
    case DT_STYLE_SEQUENCE:
      if (s->sequence_dim != d.sequence_dim) {
        app(&a, "sequence_dim=%d", s->sequence_dim);
        sep = ", ";
      }
      break;
    case DT_STYLE_PREPARE_INPUT:
      app(&a, "input_layouts=");
      app_tuple(&a, s->input_layouts, s->n_in);
      app(&a, ", desired_input_layouts=");
      app_tuple(&a, s->desired_input_layouts, s->n_in);
      sep = ", ";
      break;
    case DT_STYLE_PREPARE_OUTPUT:
      app(&a, "output_layouts=");
      app_tuple(&a, s->output_layouts, s->n_out);
      app(&a, ", desired_output_layouts=");
      app_tuple(&a, s->desired_output_layouts, s->n_out);
      sep = ", ";
      break;
    case DT_STYLE_FULLY_SHARD:
      if (s->reshard_after_forward >= 0)
        app(&a, "reshard_after_forward=%s", s->reshard_after_forward ? "True" : "False");
      app(&a, ")");
      return (int)a.len;
  }
  if (s->use_local_output != d.use_local_output)
    app(&a, "%suse_local_output=%s", sep, s->use_local_output ? "True" : "False");
  app(&a, ")");
  return (int)a.len;
}

/* ---- fqn matching --------------------------------------------------------------- */

bool dt_fqn_match(const char *pattern, const char *fqn) {
  if (!pattern || !fqn) return false;
  const char *p = pattern, *f = fqn;
  for (;;) {
    const char *pe = strchr(p, '.'), *fe = strchr(f, '.');
    size_t pl = pe ? (size_t)(pe - p) : strlen(p);
    size_t fl = fe ? (size_t)(fe - f) : strlen(f);
    if (pl >= FQN_TOKEN_MAX || fl >= FQN_TOKEN_MAX) return false;
    char pt[FQN_TOKEN_MAX], ft[FQN_TOKEN_MAX];
    memcpy(pt, p, pl);
    pt[pl] = '\0';
    memcpy(ft, f, fl);
    ft[fl] = '\0';
    if (fnmatch(pt, ft, 0) != 0) return false;
    if (!pe || !fe) return !pe && !fe; /* token counts must match */
    p = pe + 1;
    f = fe + 1;
  }
}

int dt_plan_entry_patterns(const dt_plan_entry *e, char (*out)[96], int max) {
  int n = 0;
  for (const char *p = e->pattern; *p && n < max;) {
    size_t l = strcspn(p, ",");
    snprintf(out[n++], sizeof out[0], "%.*s", (int)l, p);
    p += l;
    if (*p == ',') p++;
  }
  return n;
}

int dt_plan_dim(const dt_plan *p, const char *name) {
  if (!p || !name) return -1;
  for (int i = 0; i < p->n_dims; i++)
    if (!strcmp(p->dim_names[i], name)) return i;
  return -1;
}

/* ---- the parser ----------------------------------------------------------------- */

typedef struct pstate {
  dt_ctx *ctx;
  const char *path;
  dt_plan *plan;
  int line;
  const char *ls;   /* start of the current line (column 1) */
  const char *p;    /* cursor */
  const char *end;  /* end of the line's content (before a comment / newline) */
  int cur_dim;      /* the [dim] section, -1 before the first header */
  unsigned seen;    /* settings given (SETBIT per setting_id) */
  int set_line[N_SETTINGS], set_col[N_SETTINGS]; /* where each setting was given */
  char ac_option[WORD_MAX];  /* selective_ac_option as given ("": not given) */
} pstate;

static int col_of(const pstate *s, const char *at) { return (int)(at - s->ls) + 1; }

/* "FILE:LINE:COL: msg" (col > 0) or "FILE:LINE: msg" (col 0) or "FILE: msg" (line 0). */
static dt_status perr(pstate *s, int line, int col, const char *fmt, ...) DT_PRINTF(4, 5);
static dt_status perr(pstate *s, int line, int col, const char *fmt, ...) {
  char msg[DT_ERRMSG_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (line > 0 && col > 0)
    return dt_error(s->ctx, DT_ERR_INVALID, "dt_plan_parse", "%s:%d:%d: %s", s->path, line, col,
                    msg);
  if (line > 0)
    return dt_error(s->ctx, DT_ERR_INVALID, "dt_plan_parse", "%s:%d: %s", s->path, line, msg);
  return dt_error(s->ctx, DT_ERR_INVALID, "dt_plan_parse", "%s: %s", s->path, msg);
}

static void ws(pstate *s) {
  while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\r')) s->p++;
}

static bool at(const pstate *s, char c) { return s->p < s->end && *s->p == c; }

static bool is_ident_start(char c) { return isalpha((unsigned char)c) || c == '_'; }
static bool is_ident(char c) { return isalnum((unsigned char)c) || c == '_'; }

/* Reads an identifier into w (truncated names are rejected by the callers'
 * lookups, since every known name is short); returns its length (0: none). */
static size_t ident(pstate *s, char *w, size_t wn) {
  const char *b = s->p;
  if (s->p >= s->end || !is_ident_start(*s->p)) return 0;
  while (s->p < s->end && is_ident(*s->p)) s->p++;
  size_t l = (size_t)(s->p - b);
  size_t c = l < wn - 1 ? l : wn - 1;
  memcpy(w, b, c);
  w[c] = '\0';
  return l;
}

/* An integer at the cursor (optional '-'); false when none or out of range. */
static bool integer(pstate *s, long lo, long hi, long *out) {
  const char *b = s->p;
  bool neg = at(s, '-');
  if (neg) s->p++;
  if (s->p >= s->end || !isdigit((unsigned char)*s->p)) {
    s->p = b;
    return false;
  }
  long v = 0;
  bool big = false;
  while (s->p < s->end && isdigit((unsigned char)*s->p)) {
    if (v > PLAN_DIM_MAX) big = true; /* stop growing; still consume the digits */
    else v = v * 10 + (*s->p - '0');
    s->p++;
  }
  if (neg) v = -v;
  if (big || v < lo || v > hi) {
    s->p = b;
    return false;
  }
  *out = v;
  return true;
}

static const char *const k_layout_expect =
    "expected a layout (Shard(d), Replicate(), Partial(), S(d), R, P, None or a tuple of them)";

/* One layout: None or a placement word with an optional (...) group. */
static dt_status one_layout(pstate *s, dt_style_layout *out) {
  const char *b = s->p;
  char w[WORD_MAX];
  if (!ident(s, w, sizeof w)) return perr(s, s->line, col_of(s, b), "%s", k_layout_expect);
  if (!strcmp(w, "None")) {
    out->none = true;
    out->pl = dt_replicate();
    return DT_OK;
  }
  const char *e = s->p;
  ws(s);
  if (at(s, '(')) {
    const char *open = s->p;
    int depth = 0;
    for (; s->p < s->end; s->p++) {
      if (*s->p == '(') depth++;
      else if (*s->p == ')' && --depth == 0) break;
    }
    if (s->p >= s->end) {
      s->p = s->end;
      return perr(s, s->line, col_of(s, s->p), "expected ')' to close the '(' at column %d",
                  col_of(s, open));
    }
    s->p++;
    e = s->p;
  } else {
    s->p = e;
  }
  char text[WORD_MAX], why[DT_ERRMSG_LEN / 2];
  size_t l = (size_t)(e - b);
  if (l >= sizeof text) return perr(s, s->line, col_of(s, b), "bad placement: too long");
  memcpy(text, b, l);
  text[l] = '\0';
  why[0] = '\0';
  if (dt_placement_parse(text, &out->pl, why, sizeof why) != DT_OK)
    return perr(s, s->line, col_of(s, b), "bad placement '%s'%s%s", text, why[0] ? ": " : "",
                why);
  out->none = false;
  return DT_OK;
}

/* A layout or a tuple of them; *tuple says which was written. */
static dt_status layouts(pstate *s, dt_style_layout *out, int *n, bool *tuple) {
  *n = 0;
  *tuple = false;
  if (!at(s, '(')) {
    DT_CHECK(one_layout(s, &out[0]));
    *n = 1;
    return DT_OK;
  }
  *tuple = true;
  const char *open = s->p;
  s->p++;
  ws(s);
  if (at(s, ')')) return perr(s, s->line, col_of(s, open), "an empty layout tuple");
  for (;;) {
    ws(s);
    if (*n == DT_STYLE_MAX_ARGS)
      return perr(s, s->line, col_of(s, s->p), "at most %d layouts in a tuple",
                  DT_STYLE_MAX_ARGS);
    DT_CHECK(one_layout(s, &out[*n]));
    (*n)++;
    ws(s);
    if (at(s, ',')) {
      s->p++;
      ws(s);
      if (at(s, ')')) {
        s->p++;
        return DT_OK;
      }
      continue;
    }
    if (at(s, ')')) {
      s->p++;
      return DT_OK;
    }
    return perr(s, s->line, col_of(s, s->p), "expected ')' or ',' in a layout tuple");
  }
}

static void names_list(char *buf, size_t n, const char *const *names, int k, unsigned mask) {
  appender a = {buf, n, 0};
  buf[0] = '\0';
  int total = 0, done = 0;
  for (int i = 0; i < k; i++)
    if (mask & (1u << i)) total++;
  for (int i = 0; i < k; i++) {
    if (!(mask & (1u << i))) continue;
    app(&a, "%s%s", done == 0 ? "" : done == total - 1 ? " or " : ", ", names[i]);
    done++;
  }
}

/* What a [dim] section holds: fully_shard under [dp_shard], the TP styles elsewhere. */
static bool in_dp_shard(const pstate *s) {
  return s->cur_dim >= 0 && !strcmp(s->plan->dim_names[s->cur_dim], "dp_shard");
}

static const char *expected_styles(const pstate *s) {
  return in_dp_shard(s) ? "fully_shard"
                        : "ColwiseParallel, RowwiseParallel, SequenceParallel, "
                          "PrepareModuleInput or PrepareModuleOutput";
}

/* The left-hand side of an entry: one pattern or a fully_shard group. */
typedef struct lhs {
  int n;                       /* patterns */
  const char *at[GROUP_MAX];   /* each pattern's first char */
  size_t len[GROUP_MAX];
  const char *b;               /* the first pattern (column of the entry) */
  char text[96 * 2];           /* as written, for messages ("norm, output") */
} lhs;

/* Style(kwargs...) at the cursor, up to the end of the line, for the entry `key`.
 * The style must fit the section (fully_shard only under [dp_shard] and only
 * there) and the left-hand side (a group or `root` only for fully_shard). */
static dt_status style_call(pstate *s, dt_style *st, const lhs *key) {
  const char *b = s->p;
  char w[WORD_MAX];
  if (!ident(s, w, sizeof w))
    return perr(s, s->line, col_of(s, b), "expected a style (%s)", expected_styles(s));
  int kind = find_name(w, k_style_names, N_STYLES);
  if (kind < 0) {
    if (!strcmp(w, "PrepareModuleInputOutput"))
      return perr(s, s->line, col_of(s, b), "style 'PrepareModuleInputOutput' is not supported "
                  "(write a PrepareModuleInput and a PrepareModuleOutput entry)");
    const char *hint = suggest(w, k_style_names, N_STYLES);
    if (hint)
      return perr(s, s->line, col_of(s, b), "unknown style '%s' (did you mean %s?)", w, hint);
    return perr(s, s->line, col_of(s, b), "unknown style '%s' (expected %s)", w,
                expected_styles(s));
  }
  bool fs = kind == DT_STYLE_FULLY_SHARD;
  if (fs && !in_dp_shard(s))
    return perr(s, s->line, col_of(s, b),
                "fully_shard belongs under [dp_shard], not [%s] (FSDP shards the parameters "
                "over the dp_shard dim)", s->plan->dim_names[s->cur_dim]);
  if (!fs && in_dp_shard(s))
    return perr(s, s->line, col_of(s, b),
                "[dp_shard] holds fully_shard entries only, not %s (tensor-parallel styles go "
                "under [tp])", w);
  if (!fs && key->n > 1)
    return perr(s, s->line, col_of(s, key->b),
                "a group of patterns ('%s') is one fully_shard unit; %s takes one pattern per "
                "entry", key->text, w);
  if (!fs && key->len[0] == strlen(k_root) && !memcmp(key->at[0], k_root, key->len[0]))
    return perr(s, s->line, col_of(s, key->b),
                "'root' (the model itself) is for fully_shard only; %s needs a module pattern", w);
  dt_style_default((dt_style_kind)kind, st);
  ws(s);
  if (!at(s, '(')) return perr(s, s->line, col_of(s, s->p), "expected '(' after '%s'", w);
  s->p++;
  unsigned given = 0;
  int kw_line_col[N_KWARGS] = {0};
  int n_lay[N_KWARGS] = {0};
  for (;;) {
    ws(s);
    if (at(s, ')')) break;
    const char *kb = s->p;
    char kw[WORD_MAX];
    if (!ident(s, kw, sizeof kw))
      return perr(s, s->line, col_of(s, kb), "expected a keyword argument or ')'");
    ws(s);
    if (!at(s, '='))
      return perr(s, s->line, col_of(s, s->p),
                  "expected '=' after '%s' (styles take keyword arguments only)", kw);
    s->p++;
    ws(s);
    int k = find_name(kw, k_kwarg_names, N_KWARGS);
    unsigned ok = k_style_kwargs[kind];
    if (k < 0 || !(ok & KWBIT(k))) {
      char list[DT_ERRMSG_LEN / 2];
      names_list(list, sizeof list, k_kwarg_names, N_KWARGS, ok);
      const char *hint = NULL;
      for (int i = 0; i < N_KWARGS && !hint; i++)
        if ((ok & KWBIT(i)) && edit_distance(kw, k_kwarg_names[i]) <= SUGGEST_MAX_DIST)
          hint = k_kwarg_names[i];
      if (hint)
        return perr(s, s->line, col_of(s, kb),
                    "unknown keyword argument '%s' for %s (did you mean %s?)", kw, w, hint);
      return perr(s, s->line, col_of(s, kb), "unknown keyword argument '%s' for %s (expected %s)",
                  kw, w, list);
    }
    if (given & KWBIT(k))
      return perr(s, s->line, col_of(s, kb), "keyword argument '%s' given twice", kw);
    given |= KWBIT(k);
    kw_line_col[k] = col_of(s, kb);
    const char *vb = s->p;
    if (k == KW_USE_LOCAL_OUTPUT) {
      char v[WORD_MAX] = ""; /* stays "" when no word follows */
      ident(s, v, sizeof v);
      if (!strcmp(v, "True") || !strcmp(v, "true")) st->use_local_output = true;
      else if (!strcmp(v, "False") || !strcmp(v, "false")) st->use_local_output = false;
      else {
        s->p = vb;
        return perr(s, s->line, col_of(s, vb), "expected True or False after '%s='", kw);
      }
    } else if (k == KW_RESHARD_AFTER_FORWARD) {
      /* FSDP2: bool | int | None. An int reshards to a sub-group of that many ranks
       * (the post-forward mesh of _get_post_forward_mesh_info), which is not supported. */
      char v[WORD_MAX] = ""; /* stays "" when no word follows */
      long iv;
      if (integer(s, -PLAN_DIM_MAX, PLAN_DIM_MAX, &iv)) {
        s->p = vb;
        return perr(s, s->line, col_of(s, vb),
                    "reshard_after_forward=%ld: an int (FSDP2's reshard to a sub-group of that "
                    "many ranks) is not supported; expected True or False", iv);
      }
      ident(s, v, sizeof v);
      if (!strcmp(v, "True") || !strcmp(v, "true")) st->reshard_after_forward = 1;
      else if (!strcmp(v, "False") || !strcmp(v, "false")) st->reshard_after_forward = 0;
      else if (!strcmp(v, "None")) st->reshard_after_forward = -1;
      else {
        s->p = vb;
        return perr(s, s->line, col_of(s, vb), "expected True, False or None after '%s='", kw);
      }
    } else if (k == KW_SEQUENCE_DIM) {
      long v;
      if (!integer(s, -DT_MAX_DIMS, DT_MAX_DIMS - 1, &v))
        return perr(s, s->line, col_of(s, vb),
                    "expected an integer in [%d, %d] after 'sequence_dim='", -DT_MAX_DIMS,
                    DT_MAX_DIMS - 1);
      st->sequence_dim = (int)v;
    } else {
      dt_style_layout l[DT_STYLE_MAX_ARGS];
      int n;
      bool tuple;
      DT_CHECK(layouts(s, l, &n, &tuple));
      bool bare_none = !tuple && l[0].none;
      if (kind == DT_STYLE_COLWISE || kind == DT_STYLE_ROWWISE) {
        /* PyTorch: one Placement (None means the default). */
        if (!bare_none) {
          if (n != 1 || l[0].none)
            return perr(s, s->line, col_of(s, vb), "%s's %s takes one placement", w, kw);
          if (k == KW_INPUT_LAYOUTS) st->input_layouts[0] = l[0];
          else st->output_layouts[0] = l[0];
        }
      } else {
        /* PrepareModule*: a Placement or a tuple; a bare None means not given. */
        int cnt = bare_none ? 0 : n;
        dt_style_layout *dst = k == KW_INPUT_LAYOUTS           ? st->input_layouts
                               : k == KW_DESIRED_INPUT_LAYOUTS ? st->desired_input_layouts
                               : k == KW_OUTPUT_LAYOUTS        ? st->output_layouts
                                                               : st->desired_output_layouts;
        for (int i = 0; i < cnt; i++) dst[i] = l[i];
        n_lay[k] = cnt;
      }
    }
    ws(s);
    if (at(s, ',')) {
      s->p++;
      continue;
    }
    if (at(s, ')')) break;
    return perr(s, s->line, col_of(s, s->p), "expected ')' or ',' after a keyword argument");
  }
  s->p++; /* ')' */
  ws(s);
  if (s->p != s->end) return perr(s, s->line, col_of(s, s->p), "expected the end of the line after ')'");

  if (kind == DT_STYLE_SEQUENCE) sequence_fill(st);
  if (kind == DT_STYLE_PREPARE_INPUT || kind == DT_STYLE_PREPARE_OUTPUT) {
    kwarg a = kind == DT_STYLE_PREPARE_INPUT ? KW_INPUT_LAYOUTS : KW_OUTPUT_LAYOUTS;
    kwarg d = kind == DT_STYLE_PREPARE_INPUT ? KW_DESIRED_INPUT_LAYOUTS : KW_DESIRED_OUTPUT_LAYOUTS;
    if (!n_lay[a] || !n_lay[d])
      return perr(s, s->line, col_of(s, b), "%s needs both %s and %s", w, k_kwarg_names[a],
                  k_kwarg_names[d]);
    if (n_lay[a] != n_lay[d])
      return perr(s, s->line, kw_line_col[d], "%s has %d layouts but %s has %d", k_kwarg_names[a],
                  n_lay[a], k_kwarg_names[d], n_lay[d]);
    if (kind == DT_STYLE_PREPARE_INPUT) st->n_in = n_lay[a];
    else st->n_out = n_lay[a];
  }
  return DT_OK;
}

/* dims = NAME:SIZE, ... */
static dt_status dims_setting(pstate *s) {
  dt_plan *pl = s->plan;
  int last = -1;
  for (;;) {
    ws(s);
    const char *b = s->p;
    char w[WORD_MAX];
    if (!ident(s, w, sizeof w))
      return perr(s, s->line, col_of(s, b), "expected a dim name (pp, dp_replicate, dp_shard, cp or tp)");
    int k = find_name(w, k_dim_names, N_DIM_NAMES);
    if (k < 0) {
      const char *hint = suggest(w, k_dim_names, N_DIM_NAMES);
      if (hint)
        return perr(s, s->line, col_of(s, b), "unknown dim '%s' (did you mean %s?)", w, hint);
      return perr(s, s->line, col_of(s, b),
                  "unknown dim '%s' (expected pp, dp_replicate, dp_shard, cp or tp)", w);
    }
    for (int i = 0; i < pl->n_dims; i++)
      if (!strcmp(pl->dim_names[i], w))
        return perr(s, s->line, col_of(s, b), "dim '%s' given twice", w);
    if (k < last)
      return perr(s, s->line, col_of(s, b),
                  "dim '%s' is out of order (TorchTitan's mesh order is pp, dp_replicate, "
                  "dp_shard, cp, tp)", w);
    last = k;
    ws(s);
    if (!at(s, ':')) return perr(s, s->line, col_of(s, s->p), "expected ':' and a size after '%s'", w);
    s->p++;
    ws(s);
    const char *vb = s->p;
    long v;
    if (!integer(s, -1, PLAN_DIM_MAX, &v) || v == 0)
      return perr(s, s->line, col_of(s, vb), "expected a size >= 1 (at most %d) or -1 for '%s'",
                  PLAN_DIM_MAX, w);
    memcpy(pl->dim_names[pl->n_dims], k_dim_names[k], strlen(k_dim_names[k]) + 1); /* all < 32 */
    pl->dim_sizes[pl->n_dims] = (int)v;
    pl->n_dims++;
    ws(s);
    if (s->p == s->end) return DT_OK;
    if (!at(s, ',')) return perr(s, s->line, col_of(s, s->p), "expected ',' or the end of the line after a dim");
    s->p++;
  }
}

/* The end of a setting's line. */
static dt_status setting_end(pstate *s, const char *what) {
  ws(s);
  if (s->p != s->end)
    return perr(s, s->line, col_of(s, s->p), "expected the end of the line after '%s'", what);
  return DT_OK;
}

/* true / True / false / False for `name`. */
static dt_status bool_setting(pstate *s, const char *name, bool *out) {
  const char *b = s->p;
  char w[WORD_MAX] = ""; /* stays "" when no word follows */
  ident(s, w, sizeof w);
  if (!strcmp(w, "true") || !strcmp(w, "True")) *out = true;
  else if (!strcmp(w, "false") || !strcmp(w, "False")) *out = false;
  else {
    s->p = b;
    return perr(s, s->line, col_of(s, b), "expected true or false after '%s ='", name);
  }
  return setting_end(s, w);
}

/* A dtype word for mixed_precision_*: the plan's short names or TorchTitan's
 * (training.mixed_precision_param = "bfloat16"), limited to `allowed`. */
static dt_status dtype_setting(pstate *s, const char *name, unsigned allowed, const char *list,
                               dt_dtype *out) {
  const char *b = s->p;
  char w[WORD_MAX] = ""; /* stays "" when no word follows */
  ident(s, w, sizeof w);
  dt_dtype t;
  if (!w[0] || dt_dtype_parse(w, &t) != DT_OK || !(allowed & (1u << t))) {
    s->p = b;
    if (!w[0]) return perr(s, s->line, col_of(s, b), "expected %s after '%s ='", list, name);
    return perr(s, s->line, col_of(s, b), "'%s' is not a dtype for %s (expected %s)", w, name,
                list);
  }
  *out = t;
  return setting_end(s, w);
}

/* context_parallel_rotate_method = allgather | ring (TorchTitan's
 * parallelism.context_parallel_rotate_method; its "alltoall", PyTorch's
 * _RotateMethod.ALL_TO_ALL, is the same pass-KV ring and is accepted for it). */
static dt_status rotate_setting(pstate *s) {
  const char *b = s->p;
  char w[WORD_MAX] = "";
  ident(s, w, sizeof w);
  if (!strcmp(w, "allgather")) s->plan->cp_rotate = DT_CP_ALLGATHER;
  else if (!strcmp(w, "ring") || !strcmp(w, "alltoall")) s->plan->cp_rotate = DT_CP_RING;
  else {
    s->p = b;
    return perr(s, s->line, col_of(s, b),
                "expected allgather or ring (alltoall) after 'context_parallel_rotate_method ='");
  }
  return setting_end(s, w);
}

/* pipeline_parallel_schedule = GPipe | 1F1B | Interleaved1F1B (TorchTitan's
 * parallelism.pipeline_parallel_schedule, PyTorch's schedule class names). */
static dt_status pp_schedule_setting(pstate *s) {
  const char *b = s->p;
  while (s->p < s->end && !isspace((unsigned char)*s->p)) s->p++;
  char w[WORD_MAX];
  size_t l = (size_t)(s->p - b);
  dt_pp_schedule_kind k = DT_PP_SCHEDULE_KIND_COUNT;
  if (l > 0 && l < sizeof w) {
    memcpy(w, b, l);
    w[l] = '\0';
    dt_ctx quiet;
    dt_ctx_init(&quiet, 0, 1);
    if (dt_pp_schedule_kind_parse(&quiet, w, &k) != DT_OK || k == DT_PP_CSV) k = DT_PP_SCHEDULE_KIND_COUNT;
    dt_ctx_release(&quiet);
  }
  if (k == DT_PP_SCHEDULE_KIND_COUNT) {
    s->p = b;
    return perr(s, s->line, col_of(s, b), "expected GPipe, 1F1B or Interleaved1F1B after "
                "'pipeline_parallel_schedule =' (a CSV: pipeline_parallel_schedule_csv)");
  }
  s->plan->pp_schedule = k;
  return setting_end(s, "pipeline_parallel_schedule");
}

/* pipeline_parallel_schedule_csv = PATH (a schedule in PyTorch's CSV form; relative
 * to the plan file's directory). */
static dt_status pp_csv_setting(pstate *s) {
  const char *b = s->p;
  while (s->p < s->end && !isspace((unsigned char)*s->p)) s->p++;
  size_t l = (size_t)(s->p - b);
  if (l == 0 || l >= sizeof s->plan->pp_schedule_csv) {
    s->p = b;
    return perr(s, s->line, col_of(s, b), "expected a path (at most %zu characters) after "
                "'pipeline_parallel_schedule_csv ='", sizeof s->plan->pp_schedule_csv - 1);
  }
  memcpy(s->plan->pp_schedule_csv, b, l);
  s->plan->pp_schedule_csv[l] = '\0';
  s->plan->pp_schedule = DT_PP_CSV;
  return setting_end(s, "pipeline_parallel_schedule_csv");
}

/* module_fqns_per_model_part = [["tok_embeddings", "layers.0"], ["layers.1", "norm",
 * "output"]]: TorchTitan's TOML list of lists (double or single quotes), one inner
 * list per stage, into pp_stages ("a,b;c,d,e"). The names and their order are
 * checked here (dt_pp_split_fqns over the layers the list names); whether they cover
 * the model's layers, and whether the stages match pp, is the run's check. */
static dt_status pp_stages_setting(pstate *s) {
  static const char key[] = "module_fqns_per_model_part";
  dt_plan *pl = s->plan;
  char *out = pl->pp_stages;
  const size_t cap = sizeof pl->pp_stages;
  size_t n = 0;
  int stages = 0, max_layer = -1;
  if (!at(s, '['))
    return perr(s, s->line, col_of(s, s->p), "expected '[' (a list of lists of module names, "
                "e.g. [[\"tok_embeddings\", \"layers.0\"], [\"layers.1\", \"norm\", \"output\"]]) "
                "after '%s ='", key);
  s->p++;
  for (;;) {
    ws(s);
    if (at(s, ']') && stages > 0) {
      s->p++;
      break;
    }
    if (!at(s, '['))
      return perr(s, s->line, col_of(s, s->p), "expected '[' (stage %d's module names) in '%s'",
                  stages, key);
    s->p++;
    if (stages > 0) {
      if (n + 1 >= cap) return perr(s, s->line, col_of(s, s->p), "'%s' is too long", key);
      out[n++] = ';';
    }
    int names = 0;
    for (;;) {
      ws(s);
      if (at(s, ']') && names > 0) {
        s->p++;
        break;
      }
      const char q = s->p < s->end ? *s->p : '\0';
      if (q != '"' && q != '\'')
        return perr(s, s->line, col_of(s, s->p), "expected a quoted module name in stage %d of '%s'",
                    stages, key);
      const char *b = ++s->p;
      while (s->p < s->end && *s->p != q) s->p++;
      if (s->p >= s->end)
        return perr(s, s->line, col_of(s, b - 1), "unterminated string in '%s'", key);
      const size_t l = (size_t)(s->p - b);
      s->p++;
      if (l == 0 || memchr(b, ',', l) || memchr(b, ';', l))
        return perr(s, s->line, col_of(s, b - 1), "expected a module name in stage %d of '%s'",
                    stages, key);
      if (l > 7 && !memcmp(b, "layers.", 7)) {
        long k = 0;
        for (size_t i = 7; i < l && isdigit((unsigned char)b[i]) && k <= PLAN_DIM_MAX; i++)
          k = k * 10 + (b[i] - '0');
        if (k <= PLAN_DIM_MAX && k > max_layer) max_layer = (int)k;
      }
      if (n + l + 2 >= cap) return perr(s, s->line, col_of(s, b), "'%s' is too long", key);
      if (names > 0) out[n++] = ',';
      memcpy(out + n, b, l);
      n += l;
      names++;
      ws(s);
      if (at(s, ',')) s->p++;
      else if (!at(s, ']'))
        return perr(s, s->line, col_of(s, s->p), "expected ',' or ']' in stage %d of '%s'", stages,
                    key);
    }
    stages++;
    ws(s);
    if (at(s, ',')) s->p++;
    else if (!at(s, ']'))
      return perr(s, s->line, col_of(s, s->p), "expected ',' or ']' after stage %d of '%s'",
                  stages - 1, key);
  }
  out[n] = '\0';
  if (stages > DT_PP_MAX_STAGES)
    return perr(s, s->line, 0, "'%s' has %d stages (at most %d)", key, stages, DT_PP_MAX_STAGES);
  /* the names and their order, over the layers the list names */
  const char *parts[DT_PP_MAX_STAGES];
  char copy[sizeof pl->pp_stages];
  memcpy(copy, out, n + 1);
  int k = 0;
  for (char *p = copy, *e; k < stages; p = e + 1) {
    parts[k++] = p;
    e = strchr(p, ';');
    if (!e) break;
    *e = '\0';
  }
  dt_ctx quiet;
  dt_ctx_init(&quiet, 0, 1);
  dt_pp_layout *L = dt_host_alloc(&quiet, sizeof *L);
  dt_status st = L ? dt_pp_split_fqns(&quiet, max_layer + 1, parts, stages, key, L) : DT_ERR_NOMEM;
  char msg[DT_ERRMSG_LEN];
  snprintf(msg, sizeof msg, "%s", st == DT_ERR_NOMEM ? "no memory" : dt_last_error(&quiet));
  dt_host_free(&quiet, L);
  dt_ctx_release(&quiet);
  /* the message after dt_pp_split_fqns' "rank 0: who: key: " prefix */
  const char *why = strstr(msg, key);
  why = why && why[sizeof key - 1] == ':' ? why + sizeof key + 1 : msg;
  if (st != DT_OK) return perr(s, s->line, 0, "%s: %s", key, why);
  pl->pp_n_stages = stages;
  pl->pp_stages_line = s->line;
  return setting_end(s, key);
}

/* KEY = X: a decimal number in (0, max] into *out; hint and eg: what the error
 * says is expected, and its examples. */
static dt_status positive_setting(pstate *s, const char *key, double max, const char *hint,
                                  const char *eg, double *out) {
  const char *b = s->p;
  int digits = 0, dots = 0;
  while (s->p < s->end && (isdigit((unsigned char)*s->p) || *s->p == '.')) {
    if (*s->p == '.') dots++;
    else digits++;
    s->p++;
  }
  char num[WORD_MAX];
  size_t l = (size_t)(s->p - b);
  double v = 0;
  bool ok = digits > 0 && dots <= 1 && l < sizeof num && !(s->p < s->end && is_ident(*s->p));
  if (ok) {
    memcpy(num, b, l);
    num[l] = '\0';
    v = strtod(num, NULL);
    ok = v > 0 && v <= max;
  }
  if (!ok) {
    s->p = b;
    return perr(s, s->line, col_of(s, b), "expected %s after '%s =' (e.g. %s)", hint, key, eg);
  }
  *out = v;
  return setting_end(s, key);
}

/* bucket_cap_mb = X: a decimal number > 0 (DDP takes a float: 25 by default). */
static dt_status bucket_setting(pstate *s) {
  char hint[96];
  snprintf(hint, sizeof hint, "a number of MiB > 0 and <= %d", BUCKET_CAP_MB_MAX);
  return positive_setting(s, "bucket_cap_mb", BUCKET_CAP_MB_MAX, hint, "25 or 100",
                          &s->plan->bucket_cap_mb);
}

/* activation_checkpoint_mode = none | selective | full and selective_ac_option = op | N
 * (N >= 1), TorchTitan's [activation_checkpoint] mode and selective_ac_option; the
 * two are combined after the file (dt_ac_parse), each checked on its own line. */
static dt_status ac_setting(pstate *s, setting_id which) {
  const char *b = s->p;
  char w[WORD_MAX] = "";
  while (s->p < s->end && !isspace((unsigned char)*s->p) && (size_t)(s->p - b) + 1 < sizeof w)
    s->p++;
  memcpy(w, b, (size_t)(s->p - b));
  w[s->p - b] = '\0';
  dt_ac_config ac;
  dt_ctx quiet;
  dt_ctx_init(&quiet, 0, 1);
  const bool mode = which == SET_AC_MODE;
  const dt_status st = dt_ac_parse(&quiet, mode ? w : "selective", mode ? NULL : w, &ac);
  dt_ctx_release(&quiet);
  if (st != DT_OK) {
    s->p = b;
    return perr(s, s->line, col_of(s, b),
                mode ? "'%s': expected none, selective or full after 'activation_checkpoint_mode ='"
                     : "'%s': expected op or an integer >= 1 after 'selective_ac_option ='",
                w);
  }
  if (mode) s->plan->ac.mode = ac.mode;
  else snprintf(s->ac_option, sizeof s->ac_option, "%s", w);
  return setting_end(s, k_settings[which]);
}

static dt_status setting(pstate *s, setting_id which, const char *kb) {
  dt_plan *pl = s->plan;
  if (s->seen & SETBIT(which))
    return perr(s, s->line, col_of(s, kb), "setting '%s' given twice (first at line %d)",
                k_settings[which], s->set_line[which]);
  s->seen |= SETBIT(which);
  s->set_line[which] = s->line;
  s->set_col[which] = col_of(s, kb);
  switch (which) {
    case SET_NAME: {
      const char *b = s->p;
      while (s->p < s->end && (is_ident(*s->p) || *s->p == '-' || *s->p == '.')) s->p++;
      size_t l = (size_t)(s->p - b);
      if (l == 0)
        return perr(s, s->line, col_of(s, b), "expected a name (letters, digits, '_', '-', '.')");
      if (l >= sizeof pl->name)
        return perr(s, s->line, col_of(s, b), "name is longer than %zu characters",
                    sizeof pl->name - 1);
      ws(s);
      if (s->p != s->end)
        return perr(s, s->line, col_of(s, s->p), "expected the end of the line after the name");
      memcpy(pl->name, b, l);
      pl->name[l] = '\0';
      return DT_OK;
    }
    case SET_DIMS: return dims_setting(s);
    case SET_LOSS_PARALLEL: return bool_setting(s, "loss_parallel", &pl->loss_parallel);
    case SET_ZERO: {
      const char *b = s->p;
      long v;
      if (!integer(s, 1, 3, &v) || (s->p < s->end && is_ident(*s->p))) {
        s->p = b;
        return perr(s, s->line, col_of(s, b), "expected 1, 2 or 3 (the ZeRO stage) after 'zero ='");
      }
      pl->zero = (int)v;
      return setting_end(s, "zero");
    }
    case SET_MP_PARAM:
      return dtype_setting(s, k_settings[which],
                           (1u << DT_BF16) | (1u << DT_F32) | (1u << DT_F64), "bf16, f32 or f64",
                           &pl->param_dtype);
    case SET_MP_REDUCE:
      return dtype_setting(s, k_settings[which], (1u << DT_F32) | (1u << DT_F64), "f32 or f64",
                           &pl->reduce_dtype);
    case SET_BUCKET_CAP_MB: return bucket_setting(s);
    case SET_MAX_NORM: /* training.max_norm: clip_grad_norm_'s; > 0 (TorchTitan's default 1.0) */
      return positive_setting(s, "max_norm", MAX_NORM_MAX, "a gradient norm > 0", "1.0",
                              &pl->max_norm);
    case SET_CP_ROTATE: return rotate_setting(s);
    case SET_PP_SCHEDULE: return pp_schedule_setting(s);
    case SET_PP_CSV: return pp_csv_setting(s);
    case SET_PP_MBS: {
      const char *b = s->p;
      long v;
      if (!integer(s, 1, 1 << 20, &v) || (s->p < s->end && is_ident(*s->p))) {
        s->p = b;
        return perr(s, s->line, col_of(s, b),
                    "expected a microbatch size >= 1 after 'pipeline_parallel_microbatch_size ='");
      }
      pl->pp_microbatch_size = (int)v;
      return setting_end(s, "pipeline_parallel_microbatch_size");
    }
    case SET_PP_MBN: { /* N, or pp: the pp degree */
      const char *b = s->p;
      long v;
      if (s->end - s->p >= 2 && !strncmp(s->p, "pp", 2) && (s->end - s->p == 2 || !is_ident(s->p[2]))) {
        s->p += 2;
        pl->pp_microbatches = -1;
      } else if (integer(s, 1, 1 << 20, &v) && !(s->p < s->end && is_ident(*s->p))) {
        pl->pp_microbatches = (int)v;
      } else {
        s->p = b;
        return perr(s, s->line, col_of(s, b),
                    "expected a microbatch count >= 1 or pp after 'pipeline_parallel_microbatches ='");
      }
      return setting_end(s, "pipeline_parallel_microbatches");
    }
    case SET_CP_LOAD_BALANCE:
      return bool_setting(s, "context_parallel_load_balance", &pl->cp_load_balance);
    case SET_PP_STAGES: return pp_stages_setting(s);
    case SET_AC_MODE:
    case SET_AC_OPTION: return ac_setting(s, which);
    case SET_PP_FIRST_LESS:
    case SET_PP_LAST_LESS: {
      const char *b = s->p;
      long v;
      if (!integer(s, 0, PLAN_DIM_MAX, &v) || (s->p < s->end && is_ident(*s->p))) {
        s->p = b;
        return perr(s, s->line, col_of(s, b), "expected a number of layers >= 0 after '%s ='",
                    k_settings[which]);
      }
      *(which == SET_PP_FIRST_LESS ? &pl->pp_first_less : &pl->pp_last_less) = (int)v;
      return setting_end(s, k_settings[which]);
    }
    case N_SETTINGS: break;
  }
  return perr(s, s->line, col_of(s, kb), "unknown setting");
}

static bool pattern_char(char c) {
  return is_ident(c) || c == '.' || c == '*' || c == '?' || c == '[' || c == ']' || c == '!' ||
         c == '-' || c == '^';
}

/* One pattern at the cursor; false when there is none. */
static bool pattern(pstate *s, const char **pb, size_t *len) {
  *pb = s->p;
  while (s->p < s->end && pattern_char(*s->p)) s->p++;
  *len = (size_t)(s->p - *pb);
  return *len > 0;
}

/* PATTERN or PATTERN, PATTERN, ... (a fully_shard group) at the cursor. */
static dt_status lhs_read(pstate *s, lhs *k) {
  memset(k, 0, sizeof *k);
  k->b = s->p;
  appender a = {k->text, sizeof k->text, 0};
  for (;;) {
    const char *pb;
    size_t len;
    if (!pattern(s, &pb, &len)) {
      if (k->n == 0)
        return perr(s, s->line, col_of(s, pb), "expected a pattern, a setting or a [dim] header");
      return perr(s, s->line, col_of(s, pb), "expected a pattern after ','");
    }
    if (k->n == GROUP_MAX)
      return perr(s, s->line, col_of(s, pb), "more than %d patterns in a group", GROUP_MAX);
    k->at[k->n] = pb;
    k->len[k->n] = len;
    app(&a, "%s%.*s", k->n ? ", " : "", (int)len, pb);
    k->n++;
    ws(s);
    if (!at(s, ',')) return DT_OK;
    s->p++;
    ws(s);
  }
}

static dt_status entry(pstate *s, const lhs *k) {
  dt_plan *pl = s->plan;
  char pat[sizeof pl->entries[0].pattern];
  appender a = {pat, sizeof pat, 0};
  pat[0] = '\0';
  for (int i = 0; i < k->n; i++) {
    const char *pb = k->at[i];
    size_t kl = k->len[i];
    for (size_t j = 0; j < kl; j++) {
      bool empty_tok = pb[j] == '.' && (j == 0 || j + 1 == kl || pb[j + 1] == '.');
      if (empty_tok)
        return perr(s, s->line, col_of(s, pb), "bad pattern '%.*s': an empty token", (int)kl, pb);
    }
    bool root = kl == strlen(k_root) && !memcmp(pb, k_root, kl);
    if (root && k->n > 1)
      return perr(s, s->line, col_of(s, pb),
                  "'root' (the model itself) cannot be in a group; write 'root = fully_shard()' "
                  "on a line of its own");
    for (int j = 0; j < i; j++)
      if (k->len[j] == kl && !memcmp(k->at[j], pb, kl))
        return perr(s, s->line, col_of(s, pb), "pattern '%.*s' twice in one group", (int)kl, pb);
    app(&a, "%s%.*s", i ? "," : "", (int)kl, pb);
  }
  if (a.len >= sizeof pat)
    return perr(s, s->line, col_of(s, k->b), "pattern is longer than %zu characters",
                sizeof pat - 1);
  for (int i = 0; i < pl->n_entries; i++)
    if (pl->entries[i].dim == s->cur_dim && !strcmp(pl->entries[i].pattern, pat))
      return perr(s, s->line, col_of(s, k->b),
                  "duplicate pattern '%s' under [%s] (first at line %d)", k->text,
                  pl->dim_names[s->cur_dim], pl->entries[i].line);
  if (pl->n_entries == DT_PLAN_MAX_ENTRIES)
    return perr(s, s->line, col_of(s, k->b), "too many entries (at most %d)", DT_PLAN_MAX_ENTRIES);
  dt_plan_entry *e = &pl->entries[pl->n_entries];
  memset(e, 0, sizeof *e);
  DT_CHECK(style_call(s, &e->style, k));
  memcpy(e->pattern, pat, a.len + 1);
  e->line = s->line;
  e->dim = s->cur_dim;
  pl->n_entries++;
  return DT_OK;
}

/* Whether the value at the cursor looks like a style call: IDENT '('. */
static bool looks_like_call(const pstate *s) {
  const char *q = s->p;
  if (q >= s->end || !is_ident_start(*q)) return false;
  while (q < s->end && is_ident(*q)) q++;
  while (q < s->end && (*q == ' ' || *q == '\t')) q++;
  return q < s->end && *q == '(';
}

static dt_status parse_line(pstate *s) {
  ws(s);
  if (s->p == s->end) return DT_OK;
  if (at(s, '[')) {
    s->p++;
    ws(s);
    const char *b = s->p;
    char w[WORD_MAX];
    if (!ident(s, w, sizeof w)) return perr(s, s->line, col_of(s, b), "expected a dim name after '['");
    ws(s);
    if (!at(s, ']')) return perr(s, s->line, col_of(s, s->p), "expected ']' after the dim name");
    s->p++;
    ws(s);
    if (s->p != s->end) return perr(s, s->line, col_of(s, s->p), "expected the end of the line after ']'");
    if (!(s->seen & SETBIT(SET_DIMS)))
      return perr(s, s->line, col_of(s, b), "[%s]: a [dim] header needs a 'dims = ...' line above it", w);
    int d = dt_plan_dim(s->plan, w);
    if (d < 0) {
      char list[DT_ERRMSG_LEN / 2];
      appender a = {list, sizeof list, 0};
      for (int i = 0; i < s->plan->n_dims; i++) app(&a, "%s%s", i ? ", " : "", s->plan->dim_names[i]);
      return perr(s, s->line, col_of(s, b), "[%s]: dim '%s' is not in dims (%s)", w, w, list);
    }
    s->cur_dim = d;
    return DT_OK;
  }
  lhs k;
  DT_CHECK(lhs_read(s, &k));
  if (!at(s, '=')) return perr(s, s->line, col_of(s, s->p), "expected '=' after '%s'", k.text);
  s->p++;
  ws(s);
  char key[WORD_MAX];
  snprintf(key, sizeof key, "%.*s", (int)k.len[0], k.at[0]);
  int which = k.n == 1 && k.len[0] < sizeof key ? find_name(key, k_settings, N_SETTINGS) : -1;
  if (s->cur_dim < 0) {
    if (which >= 0) return setting(s, (setting_id)which, k.b);
    if (looks_like_call(s))
      return perr(s, s->line, col_of(s, k.b),
                  "entry '%s' comes before a [dim] header (add e.g. [tp] or [dp_shard] above it)",
                  k.text);
    char list[DT_ERRMSG_LEN / 2];
    names_list(list, sizeof list, k_settings, N_SETTINGS, SETBIT(N_SETTINGS) - 1u);
    const char *hint = suggest(k.text, k_settings, N_SETTINGS);
    if (hint)
      return perr(s, s->line, col_of(s, k.b), "unknown setting '%s' (did you mean %s?)", k.text,
                  hint);
    return perr(s, s->line, col_of(s, k.b), "unknown setting '%s' (expected %s)", k.text, list);
  }
  if (which >= 0 && !looks_like_call(s))
    return perr(s, s->line, col_of(s, k.b), "setting '%s' must come before the first [dim] header",
                key);
  return entry(s, &k);
}

/* Checks the output entry loss parallel needs: TorchTitan's apply_tp
 * (torchtitan/models/llama3/infra/parallelize.py) gives "output"
 * ColwiseParallel(output_layouts=Shard(-1), use_local_output=False) when loss
 * parallel is on, so the loss sees vocab-sharded logits. */
static dt_status check_loss_parallel(pstate *s) {
  dt_plan *pl = s->plan;
  if (!pl->loss_parallel) return DT_OK;
  int tp = dt_plan_dim(pl, "tp");
  if (tp < 0) return perr(s, 0, 0, "loss_parallel = true needs a tp dim in dims");
  for (int i = 0; i < pl->n_entries; i++) {
    const dt_plan_entry *e = &pl->entries[i];
    if (e->dim != tp || !dt_fqn_match(e->pattern, "output")) continue;
    const dt_style *st = &e->style;
    bool shard_last = st->n_out >= 1 && !st->output_layouts[0].none &&
                      st->output_layouts[0].pl.kind == DT_PL_SHARD &&
                      (st->output_layouts[0].pl.dim == -1 || st->output_layouts[0].pl.dim == 2);
    if (st->kind != DT_STYLE_COLWISE || !shard_last) {
      char buf[DT_ERRMSG_LEN / 2];
      dt_style_str(st, buf, sizeof buf);
      return perr(s, e->line, 0,
                  "loss_parallel = true needs 'output' to be ColwiseParallel with "
                  "output_layouts=Shard(-1) (vocab-sharded logits), got %s", buf);
    }
    if (st->use_local_output)
      return perr(s, e->line, 0,
                  "loss_parallel = true needs use_local_output=False on 'output' (the loss "
                  "needs the logits as a DTensor)");
    return DT_OK;
  }
  return perr(s, 0, 0, "loss_parallel = true needs an 'output' entry under [tp] "
              "(ColwiseParallel(..., output_layouts=Shard(-1), use_local_output=False))");
}

/* The FSDP / ZeRO / DDP settings against the dims and entries they need:
 * zero needs a dp_shard dim and, at stage 1 or 2, no unit with
 * reshard_after_forward=True; mixed_precision_* (FSDP2's MixedPrecisionPolicy,
 * given to fully_shard) needs fully_shard entries; bucket_cap_mb (DDP's
 * gradient buckets, TorchTitan's apply_ddp) needs a dp_replicate dim and no
 * fully_shard entries, since with them dp_replicate is HSDP's replica dim,
 * which FSDP2 all-reduces per unit, not in buckets. */
static dt_status check_fsdp_settings(pstate *s) {
  dt_plan *pl = s->plan;
  const dt_plan_entry *fs = NULL;
  for (int i = 0; i < pl->n_entries && !fs; i++)
    if (pl->entries[i].style.kind == DT_STYLE_FULLY_SHARD) fs = &pl->entries[i];
  if ((s->seen & SETBIT(SET_ZERO)) && dt_plan_dim(pl, "dp_shard") < 0)
    return perr(s, s->set_line[SET_ZERO], s->set_col[SET_ZERO],
                "zero = %d needs a dp_shard dim in dims (ZeRO shards over dp_shard)", pl->zero);
  if (pl->zero == 1 || pl->zero == 2) {
    for (int i = 0; i < pl->n_entries; i++) {
      const dt_plan_entry *e = &pl->entries[i];
      if (e->style.kind != DT_STYLE_FULLY_SHARD || e->style.reshard_after_forward != 1) continue;
      return perr(s, e->line, 0,
                  "'%s': reshard_after_forward=True contradicts zero = %d (line %d): %s", e->pattern,
                  pl->zero, s->set_line[SET_ZERO],
                  pl->zero == 2 ? "ZeRO-2 keeps the parameters gathered from forward to backward"
                                : "ZeRO-1 shards only the optimizer state");
    }
  }
  static const setting_id mp[] = {SET_MP_PARAM, SET_MP_REDUCE};
  for (int i = 0; i < 2; i++)
    if ((s->seen & SETBIT(mp[i])) && !fs)
      return perr(s, s->set_line[mp[i]], s->set_col[mp[i]],
                  "%s needs fully_shard entries under [dp_shard] (FSDP2's MixedPrecisionPolicy "
                  "is a fully_shard argument)", k_settings[mp[i]]);
  if (s->seen & SETBIT(SET_BUCKET_CAP_MB)) {
    if (dt_plan_dim(pl, "dp_replicate") < 0)
      return perr(s, s->set_line[SET_BUCKET_CAP_MB], s->set_col[SET_BUCKET_CAP_MB],
                  "bucket_cap_mb needs a dp_replicate dim in dims (DDP's gradient buckets)");
    if (fs)
      return perr(s, s->set_line[SET_BUCKET_CAP_MB], s->set_col[SET_BUCKET_CAP_MB],
                  "bucket_cap_mb is DDP's; with fully_shard entries (line %d) dp_replicate is "
                  "HSDP's, which has no buckets", fs->line);
  }
  return DT_OK;
}

/* The context- and pipeline-parallel settings need their dim. */
static dt_status check_cp_settings(pstate *s) {
  static const setting_id cps[] = {SET_CP_ROTATE, SET_CP_LOAD_BALANCE, SET_PP_SCHEDULE,
                                   SET_PP_CSV,    SET_PP_MBS,          SET_PP_MBN,
                                   SET_PP_STAGES, SET_PP_FIRST_LESS,   SET_PP_LAST_LESS};
  for (int i = 0; i < (int)(sizeof cps / sizeof cps[0]); i++) {
    const char *dim = i < 2 ? "cp" : "pp";
    if ((s->seen & SETBIT(cps[i])) && dt_plan_dim(s->plan, dim) < 0)
      return perr(s, s->set_line[cps[i]], s->set_col[cps[i]], "%s needs a %s dim in dims",
                  k_settings[cps[i]], dim);
  }
  if ((s->seen & SETBIT(SET_PP_SCHEDULE)) && (s->seen & SETBIT(SET_PP_CSV)))
    return perr(s, s->set_line[SET_PP_CSV], s->set_col[SET_PP_CSV],
                "give pipeline_parallel_schedule (line %d) or pipeline_parallel_schedule_csv, "
                "not both", s->set_line[SET_PP_SCHEDULE]);
  if ((s->seen & SETBIT(SET_PP_MBS)) && (s->seen & SETBIT(SET_PP_MBN)))
    return perr(s, s->set_line[SET_PP_MBN], s->set_col[SET_PP_MBN],
                "give pipeline_parallel_microbatch_size (line %d) or "
                "pipeline_parallel_microbatches, not both", s->set_line[SET_PP_MBS]);
  for (int i = SET_PP_FIRST_LESS; i <= SET_PP_LAST_LESS; i++)
    if ((s->seen & SETBIT(i)) && (s->seen & SETBIT(SET_PP_STAGES)))
      return perr(s, s->set_line[i], s->set_col[i],
                  "%s shapes the generated split; module_fqns_per_model_part (line %d) gives "
                  "the stages: not both", k_settings[i], s->set_line[SET_PP_STAGES]);
  return DT_OK;
}

dt_status dt_plan_parse(dt_ctx *ctx, const char *text, const char *path, dt_plan *out) {
  if (!out) return dt_error(ctx, DT_ERR_INVALID, "dt_plan_parse", "no output plan");
  memset(out, 0, sizeof *out);
  const char *shown = path && *path ? path : "<plan>";
  if (!text) return dt_error(ctx, DT_ERR_INVALID, "dt_plan_parse", "%s: no text", shown);
  snprintf(out->path, sizeof out->path, "%s", shown);
  out->param_dtype = out->reduce_dtype = DT_DTYPE_COUNT; /* not given */
  out->cp_rotate = DT_CP_ALLGATHER;                      /* TorchTitan's default */
  out->cp_load_balance = true;
  out->pp_schedule = DT_PP_1F1B;                         /* TorchTitan's defaults */
  out->pp_microbatch_size = 1;
  out->pp_first_less = out->pp_last_less = 1;
  pstate s = {.ctx = ctx, .path = shown, .plan = out, .cur_dim = -1};
  const char *t = text;
  while (*t) {
    s.line++;
    const char *eol = strchr(t, '\n');
    if (!eol) eol = t + strlen(t);
    const char *hash = memchr(t, '#', (size_t)(eol - t));
    s.ls = s.p = t;
    s.end = hash ? hash : eol;
    dt_status st = parse_line(&s);
    if (st != DT_OK) {
      memset(out, 0, sizeof *out);
      return st;
    }
    t = *eol ? eol + 1 : eol;
  }
  dt_status st = DT_OK;
  if (!(s.seen & SETBIT(SET_DIMS))) st = perr(&s, 0, 0, "no 'dims = ...' line (e.g. dims = tp:-1)");
  if (st == DT_OK) st = check_loss_parallel(&s);
  if (st == DT_OK) st = check_fsdp_settings(&s);
  if (st == DT_OK && out->ac.mode == DT_AC_SELECTIVE) /* both words were checked already */
    st = dt_ac_parse(ctx, "selective", s.ac_option[0] ? s.ac_option : NULL, &out->ac);
  out->ac_given = (s.seen & SETBIT(SET_AC_MODE)) != 0;
  if (st == DT_OK) st = check_cp_settings(&s);
  if (st != DT_OK) {
    memset(out, 0, sizeof *out);
    return st;
  }
  if (!out->name[0]) { /* default: the file's base name without ".plan" */
    const char *base = strrchr(shown, '/');
    base = base ? base + 1 : shown;
    size_t l = strlen(base);
    if (l > 5 && !strcmp(base + l - 5, ".plan")) l -= 5; /* 5 = strlen(".plan") */
    if (l >= sizeof out->name) l = sizeof out->name - 1;
    memcpy(out->name, base, l);
    out->name[l] = '\0';
  }
  return DT_OK;
}

dt_status dt_plan_load(dt_ctx *ctx, const char *path, dt_plan *out) {
  if (!path || !out) return dt_error(ctx, DT_ERR_INVALID, "dt_plan_load", "no path or plan");
  FILE *f = fopen(path, "rb");
  if (!f) return dt_error(ctx, DT_ERR_IO, "dt_plan_load", "%s: cannot open", path);
  char *buf = dt_host_alloc(ctx, PLAN_FILE_MAX_BYTES + 1);
  if (!buf) {
    fclose(f);
    return DT_ERR_NOMEM; /* dt_host_alloc recorded it */
  }
  size_t n = fread(buf, 1, PLAN_FILE_MAX_BYTES + 1, f);
  bool bad = ferror(f) != 0;
  fclose(f);
  dt_status st;
  if (bad) st = dt_error(ctx, DT_ERR_IO, "dt_plan_load", "%s: read error", path);
  else if (n > PLAN_FILE_MAX_BYTES)
    st = dt_error(ctx, DT_ERR_INVALID, "dt_plan_load", "%s: larger than %d bytes, not a plan",
                  path, PLAN_FILE_MAX_BYTES);
  else if (memchr(buf, '\0', n))
    st = dt_error(ctx, DT_ERR_INVALID, "dt_plan_load", "%s: contains a NUL byte, not a plan", path);
  else {
    buf[n] = '\0';
    st = dt_plan_parse(ctx, buf, path, out);
  }
  dt_host_free(ctx, buf);
  return st;
}

/* ---- resolution ----------------------------------------------------------------- */

/* The modules a plan's patterns name: lib/nn's tree of the whole model
 * (dt_llama_module_at; a part run alone keeps the model's plan), without the
 * root "" (a plan names it `root`). Module i + 1 of the tree; false past the end. */
static bool plan_module(const dt_llama_config *whole, int i, dt_llama_module *out) {
  return dt_llama_module_at(whole, i + 1, out);
}

static bool is_seq_shard(const dt_style_layout *l, int n) {
  for (int i = 0; i < n; i++) /* Shard(1) / Shard(-2): the seq dim of (bs, seq, dim) */
    if (!l[i].none && l[i].pl.kind == DT_PL_SHARD && (l[i].pl.dim == 1 || l[i].pl.dim == -2))
      return true;
  return false;
}

static dt_status rerr(dt_ctx *ctx, const char *call, const dt_plan *p, int line, const char *fmt,
                      ...) DT_PRINTF(5, 6);
static dt_status rerr(dt_ctx *ctx, const char *call, const dt_plan *p, int line, const char *fmt,
                      ...) {
  char msg[DT_ERRMSG_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  const char *where = p->path[0] ? p->path : p->name;
  if (line > 0)
    return dt_error(ctx, DT_ERR_INVALID, call, "%s:%d: %s", where, line, msg);
  return dt_error(ctx, DT_ERR_INVALID, call, "%s: %s", where, msg);
}

static bool is_root(const char *pattern) { return !strcmp(pattern, k_root); }

/* The first non-root fully_shard entry at or after `from` with a pattern that
 * matches the weight module `w` or one of its parents: the unit that claims
 * w's weight (FSDP2's fully_shard(module) takes every parameter under module
 * that no earlier call took). The parents are w's fqn cut at each '.', except
 * the bare "layers" (TorchTitan's ModuleDict of blocks, not a module here:
 * lib/nn's module list has no such entry). -1 when none. */
static int claiming_unit(const dt_plan *p, int from, const char *w) {
  for (int e = from; e < p->n_entries; e++) {
    const dt_plan_entry *en = &p->entries[e];
    if (en->style.kind != DT_STYLE_FULLY_SHARD || is_root(en->pattern)) continue;
    char pats[GROUP_MAX][96];
    int np = dt_plan_entry_patterns(en, pats, GROUP_MAX);
    for (int k = 0; k < np; k++) {
      char pre[FQN_TOKEN_MAX];
      for (size_t i = 0;; i++) {
        if (w[i] != '.' && w[i] != '\0') continue;
        if (i >= sizeof pre) break;
        memcpy(pre, w, i);
        pre[i] = '\0';
        if (strcmp(pre, "layers") && dt_fqn_match(pats[k], pre)) return e;
        if (w[i] == '\0') break;
      }
    }
  }
  return -1;
}

dt_status dt_plan_check_modules(dt_ctx *ctx, const dt_plan *p, const dt_llama_config *cfg) {
  if (!p || !cfg) return dt_error(ctx, DT_ERR_INVALID, "dt_plan_check_modules", "no plan or config");
  /* every pattern (each of a group's) matches a module, `root` the model itself;
   * Colwise/Rowwise only on Linear/Embedding */
  const dt_llama_config whole = dt_llama_config_whole(cfg);
  dt_llama_module md;
  bool any_fs = false, has_root = false;
  for (int e = 0; e < p->n_entries; e++) {
    const dt_plan_entry *en = &p->entries[e];
    const dt_style *st = &en->style;
    bool fs = st->kind == DT_STYLE_FULLY_SHARD;
    any_fs |= fs;
    char pats[GROUP_MAX][96];
    int np = dt_plan_entry_patterns(en, pats, GROUP_MAX);
    for (int k = 0; k < np; k++) {
      if (fs && is_root(pats[k])) {
        has_root = true;
        continue;
      }
      bool hit = false;
      for (int i = 0; plan_module(&whole, i, &md); i++) {
        if (!dt_fqn_match(pats[k], md.fqn)) continue;
        hit = true;
        if ((st->kind == DT_STYLE_COLWISE || st->kind == DT_STYLE_ROWWISE) &&
            md.kind != DT_MOD_LINEAR && md.kind != DT_MOD_EMBEDDING)
          return rerr(ctx, "dt_plan_check_modules", p, en->line, "pattern '%s' matches '%s', which is not a Linear or an "
                      "Embedding (%s needs one)", pats[k], md.fqn, k_style_names[st->kind]);
      }
      if (!hit)
        return rerr(ctx, "dt_plan_check_modules", p, en->line, "pattern '%s' matches no module of %s (%d layers)",
                    pats[k], cfg->name[0] ? cfg->name : "the model", cfg->n_layers);
    }
  }
  if (!any_fs) return DT_OK;
  /* fully_shard units: every weight in exactly one unit, or left to a root entry */
  for (int i = 0; plan_module(&whole, i, &md); i++) {
    if (!md.wndim) continue; /* a container: its weights are its children's */
    const char *fqn = md.fqn;
    int a = claiming_unit(p, 0, fqn);
    int b = a >= 0 ? claiming_unit(p, a + 1, fqn) : -1;
    if (b >= 0)
      return rerr(ctx, "dt_plan_check_modules", p, p->entries[b].line,
                  "module '%s' is in two fully_shard units: '%s' (line %d) and '%s' (line %d); "
                  "a module may be in one unit only", fqn, p->entries[a].pattern,
                  p->entries[a].line, p->entries[b].pattern, p->entries[b].line);
    if (a < 0 && !has_root)
      return rerr(ctx, "dt_plan_check_modules", p, 0,
                  "module '%s' is in no fully_shard unit (add a root = fully_shard() entry or a "
                  "unit for it)", fqn);
  }
  return DT_OK;
}

dt_status dt_plan_resolve(dt_ctx *ctx, dt_plan *p, int world, const dt_llama_config *cfg,
                          int seq_len) {
  if (!p || !cfg) return dt_error(ctx, DT_ERR_INVALID, "dt_plan_resolve", "no plan or config");
  if (world < 1) return rerr(ctx, "dt_plan_resolve", p, 0, "world size %d must be >= 1", world);
  if (cfg->n_layers < 0 || cfg->n_heads < 1)
    return rerr(ctx, "dt_plan_resolve", p, 0, "config '%s' has %d layers and %d heads", cfg->name, cfg->n_layers,
                cfg->n_heads);

  /* dims: infer the -1 (ParallelDims: product == world) */
  char dims[DT_ERRMSG_LEN / 2];
  appender a = {dims, sizeof dims, 0};
  dims[0] = '\0';
  long long known = 1;
  int neg = -1;
  for (int i = 0; i < p->n_dims; i++) {
    app(&a, "%s%s:%d", i ? " x " : "", p->dim_names[i], p->dim_sizes[i]);
    if (p->dim_sizes[i] != -1) known *= p->dim_sizes[i];
    else if (neg >= 0)
      return rerr(ctx, "dt_plan_resolve", p, 0,
                  "dims %s and %s are both -1: the world alone cannot size them (give the mesh)",
                  p->dim_names[neg], p->dim_names[i]);
    else neg = i;
  }
  if (neg >= 0) {
    if (world % known)
      return rerr(ctx, "dt_plan_resolve", p, 0, "world %d is not divisible by the other dims (%s: %lld) to infer %s",
                  world, dims, known, p->dim_names[neg]);
    p->dim_sizes[neg] = (int)(world / known);
  } else if (known != world) {
    return rerr(ctx, "dt_plan_resolve", p, 0, "dims %s = %lld ranks do not match the world of %d", dims, known, world);
  }
  int tpi = dt_plan_dim(p, "tp"), cpi = dt_plan_dim(p, "cp");
  int tp = tpi >= 0 ? p->dim_sizes[tpi] : 1, cp = cpi >= 0 ? p->dim_sizes[cpi] : 1;

  DT_CHECK(dt_plan_check_modules(ctx, p, cfg));
  bool sp = false;
  for (int e = 0; e < p->n_entries; e++) {
    const dt_plan_entry *en = &p->entries[e];
    const dt_style *st = &en->style;
    if (en->dim == tpi &&
        (st->kind == DT_STYLE_SEQUENCE || is_seq_shard(st->input_layouts, st->n_in) ||
         is_seq_shard(st->desired_input_layouts, st->n_in) ||
         is_seq_shard(st->output_layouts, st->n_out) ||
         is_seq_shard(st->desired_output_layouts, st->n_out)))
      sp = true;
  }

  /* TP shards heads (wq colwise) and kv heads (wk/wv colwise), as apply_tp's
   * plan does, so both head counts must divide by tp (there is no KV-head
   * replication: TorchTitan fails in a reshape otherwise). */
  int kv = cfg->n_kv_heads > 0 ? cfg->n_kv_heads : cfg->n_heads;
  if (cfg->n_heads % tp)
    return rerr(ctx, "dt_plan_resolve", p, 0, "n_heads %d of %s is not divisible by tp %d", cfg->n_heads, cfg->name,
                tp);
  if (kv % tp)
    return rerr(ctx, "dt_plan_resolve", p, 0, "n_kv_heads %d of %s is not divisible by tp %d (no KV-head "
                "replication)", kv, cfg->name, tp);
  /* ParallelDims.seq_len_divisor: tp under sequence parallel, times 2*cp (load-balanced CP) */
  if (seq_len > 0) {
    long long div = (sp ? tp : 1) * (cp > 1 ? (p->cp_load_balance ? 2LL : 1LL) * cp : 1);
    if (seq_len % div)
      return rerr(ctx, "dt_plan_resolve", p, 0, "seq_len %d is not divisible by %lld (%s%s%s)", seq_len, div,
                  sp && tp > 1 ? "tp under sequence parallel" : "",
                  sp && tp > 1 && cp > 1 ? " x " : "",
                  cp <= 1 ? "" : p->cp_load_balance ? "2 x cp, load-balanced" : "cp");
  }
  return DT_OK;
}
