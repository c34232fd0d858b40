/* verify/golden_check.c: shardbench's unsharded reference against PyTorch's numbers.
 *
 * The golden file (verify/golden/debugmodel.json, written by verify/torch/oracle.py
 * with the torch version it names) holds, for a few runs (model, dtype, batch,
 * seq, steps; from version 2 also TorchTitan's recipe, max_norm, global_batch
 * and lr, and activation checkpointing, ac), checksums of what PyTorch computed
 * from shardbench's initial weights and token batches: each step's loss (and
 * clip_grad_norm_'s total norm, "grad_norm step S"), each weight's gradient at
 * each step and each weight after the last AdamW update, as numel, sum, sum |x|,
 * sum x^2, max |x| and sampled elements. This program recomputes the same
 * checksums from a `shardbench run --save-trace` file and compares them: the
 * oracle is PyTorch, not this library.
 *
 *   golden_check list GOLDEN                  one line per run: "I MODEL DTYPE BATCH SEQ STEPS
 *                                             [FLAGS]", FLAGS the run's settings as
 *                                             `shardbench run` flags (--ac, --max-norm,
 *                                             --global-batch, --lr-*)
 *   golden_check comm-list GOLDEN             one line per (plan, tp) of the comm rows
 *   golden_check check GOLDEN I TRACE [W]     run I against TRACE (and its --save-weights
 *                                             file W); exit 0 ok, 1 off, 3 stale (the
 *                                             inputs are not the golden's)
 *   golden_check job GOLDEN I RUNJSON         run I's `shardbench run --json` verdict: ok,
 *                                             with tensors compared; a run with ac: its
 *                                             key says ac=MODE and its AC'd job is bitwise
 *                                             the reference the trace is of; exit 0 or 1
 *   golden_check perturb IN OUT NAME INDEX F  OUT = IN with element INDEX of NAME times F
 *   golden_check comm GOLDEN PLAN TP RUNJSON  PyTorch's collective counts per op and
 *                                             phase against `shardbench run --json`'s
 *
 * Comparison of one quantity (its errors normwise, as the sharded verdict
 * measures them): the samples and max |x| by |got - ref| / max |ref|; the sum by
 * |got - ref| / sum |ref| (a sum's rounding is bounded relative to sum |x|, not
 * to the sum, which may cancel); sum |x| and sum x^2 relatively. Tolerances:
 * TOL_F64 / TOL_F32 below, with the measured spread they were set from.
 */
#include "config.h"

#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor.h"

/* Tolerances per dtype, before the first AdamW update (step 0's loss and
 * gradients) and after it (later steps, the final weights). Measured with the
 * committed golden file (torch 2.15, batch 4, seq 32, 2 steps): the largest
 * error over every quantity and checksum was, f64: 3.2e-14 before, 6.1e-14
 * after (debugmodel; the GQA run 3.1e-14 / 3.3e-14); f32: 5.8e-7 before,
 * 1.4e-5 after. Both sides round differently (BLAS blocking, summation
 * orders), so errors are a few hundred u (f64 1.1e-16, f32 6.0e-8) before the
 * update; after it AdamW's lr * m / (sqrt(v) + eps) turns a gradient element
 * near zero into a +-lr step whose sign rounding decides, so f32 grows 20x.
 * Each tolerance is 8x the measured value rounded up to a power of two: room
 * for another BLAS or torch build, far below what a real bug moves (one weight
 * element scaled by 1.01, or RoPE base 10000: golden.sh). The recipe runs (2
 * layers, 2 microsteps of batch 2 x seq 16, clipped at max_norm 0.5, the lr
 * schedule, 3 steps) and the AC runs (2 layers, batch 2 x seq 16, 2 steps) stay
 * within them: largest f64 2.1e-14 before, 3.5e-14 after; f32 5.8e-7 before,
 * 4.4e-6 after (the clipped gradients, 4x smaller, enter AdamW's m / sqrt(v)
 * scale-free). A step's total norm ("grad_norm step S", clip_grad_norm_'s,
 * before clipping) takes that step's gradients' tolerance: a 2-norm is
 * 1-Lipschitz, | |g'| - |g| | <= |g' - g|, so its relative error is at most the
 * gradients' (measured f64 9.4e-15, f32 1.8e-8 by verify/torch/oracle.py). */
typedef struct tol {
  double before, after;
} tol;
static const tol TOL_F64 = {0x1p-41 /* 4.5e-13 */, 0x1p-40 /* 9.1e-13 */};
static const tol TOL_F32 = {0x1p-17 /* 7.6e-6 */, 0x1p-13 /* 1.2e-4 */};

static int usage(void) {
  fprintf(stderr, "usage: golden_check list GOLDEN | comm-list GOLDEN | check GOLDEN I TRACE [W] | "
                  "job GOLDEN I RUNJSON | perturb IN OUT NAME INDEX FACTOR | "
                  "comm GOLDEN PLAN TP RUNJSON\n");
  return 2;
}

static json_t *load_json(const char *path) {
  json_error_t e;
  json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &e);
  if (!j) fprintf(stderr, "golden_check: %s:%d: %s\n", path, e.line, e.text);
  return j;
}

/* The golden format versions this program reads: 1 (plain runs), 2 (runs with
 * settings and grad_norm quantities). */
enum { GOLDEN_VERSION_MAX = 2 };

static json_t *golden_runs(json_t *g, const char *path) {
  json_t *runs = json_object_get(g, "runs");
  const char *fmt = json_string_value(json_object_get(g, "format"));
  if (!fmt || strcmp(fmt, "shardbench-golden") || !json_is_array(runs)) {
    fprintf(stderr, "golden_check: %s: not a shardbench-golden file with runs\n", path);
    return NULL;
  }
  json_t *v = json_object_get(g, "version");
  if (!json_is_integer(v) || json_integer_value(v) < 1 ||
      json_integer_value(v) > GOLDEN_VERSION_MAX) {
    if (json_is_integer(v))
      fprintf(stderr, "golden_check: %s: format version %lld, this golden_check reads 1 to %d\n",
              path, (long long)json_integer_value(v), GOLDEN_VERSION_MAX);
    else
      fprintf(stderr, "golden_check: %s: no format version (an integer)\n", path);
    return NULL;
  }
  return runs;
}

/* A word safe to pass through the shell's field splitting (golden.sh). */
static bool plain_word(const char *s) {
  if (!s || !*s) return false;
  for (; *s; s++)
    if (!(isalnum((unsigned char)*s) || strchr(":._-=", *s))) return false;
  return true;
}

/* x in the fewest digits that read back as x (0.1, not 0.10000000000000001). */
static const char *shortest(double x, char *buf, size_t n) {
  for (int p = 1; p <= 17; p++) {
    snprintf(buf, n, "%.*g", p, x);
    if (strtod(buf, NULL) == x) break;
  }
  return buf;
}

/* The run's settings beyond its shape as `shardbench run` flags into buf (""
 * for a plain run). A key this program does not know, a warmup other than 0 or
 * a malformed value is an error (printed, -1): a setting left out would make
 * the run another run than the golden's. */
static int run_flags(const char *path, size_t idx, json_t *r, char *buf, size_t n) {
  static const char *const known[] = {"model", "dtype", "batch", "seq", "warmup", "steps",
                                      "inputs", "quantities", "ac", "max_norm", "global_batch",
                                      "lr"};
  const char *k;
  json_t *v;
  size_t len = 0;
  char d1[32], d2[32];
  buf[0] = '\0';
#define ADD(...) (len += (size_t)snprintf(buf + len, len < n ? n - len : 0, __VA_ARGS__))
  json_object_foreach(r, k, v) {
    size_t i = 0;
    while (i < sizeof known / sizeof *known && strcmp(known[i], k)) i++;
    if (i == sizeof known / sizeof *known) {
      fprintf(stderr, "golden_check: %s: run %zu: setting '%s' unknown to this golden_check\n",
              path, idx, k);
      return -1;
    }
  }
  json_t *wu = json_object_get(r, "warmup");
  if (wu && !(json_is_integer(wu) && json_integer_value(wu) == 0)) {
    fprintf(stderr, "golden_check: %s: run %zu: warmup must be 0 (golden.sh runs --warmup 0)\n",
            path, idx);
    return -1;
  }
  json_t *ac = json_object_get(r, "ac"), *mn = json_object_get(r, "max_norm");
  json_t *gb = json_object_get(r, "global_batch"), *lr = json_object_get(r, "lr");
  bool ok = (!ac || plain_word(json_string_value(ac))) && (!mn || json_is_number(mn)) &&
            (!gb || json_is_integer(gb)) && (!lr || json_is_object(lr));
  if (ok && ac) ADD(" --ac %s", json_string_value(ac));
  if (ok && mn) ADD(" --max-norm %s", shortest(json_number_value(mn), d1, sizeof d1));
  if (ok && gb) ADD(" --global-batch %lld", (long long)json_integer_value(gb));
  if (ok && lr) {
    json_t *ws = json_object_get(lr, "warmup_steps"), *dr = json_object_get(lr, "decay_ratio");
    json_t *dt = json_object_get(lr, "decay_type"), *mf = json_object_get(lr, "min_lr_factor");
    ok = json_is_integer(ws) && (json_is_null(dr) || json_is_number(dr)) &&
         plain_word(json_string_value(dt)) && json_is_number(mf) && json_object_size(lr) == 4;
    if (ok) {
      ADD(" --lr-warmup-steps %lld --lr-decay-ratio ", (long long)json_integer_value(ws));
      if (json_is_null(dr)) ADD("none");
      else ADD("%s", shortest(json_number_value(dr), d1, sizeof d1));
      ADD(" --lr-decay-type %s --lr-min-factor %s", json_string_value(dt),
          shortest(json_number_value(mf), d2, sizeof d2));
    }
  }
#undef ADD
  if (!ok || len >= n) {
    fprintf(stderr, "golden_check: %s: run %zu: malformed settings (ac, max_norm, global_batch, "
            "lr: warmup_steps, decay_ratio, decay_type, min_lr_factor)\n", path, idx);
    return -1;
  }
  return 0;
}

static int cmd_list(const char *path) {
  json_t *g = load_json(path), *runs = g ? golden_runs(g, path) : NULL;
  if (!runs) return 2;
  size_t i;
  json_t *r;
  char flags[512];
  json_array_foreach(runs, i, r) { /* every run's settings read before any line */
    if (run_flags(path, i, r, flags, sizeof flags)) {
      json_decref(g);
      return 2;
    }
  }
  json_array_foreach(runs, i, r) {
    run_flags(path, i, r, flags, sizeof flags);
    printf("%zu %s %s %lld %lld %lld%s\n", i, json_string_value(json_object_get(r, "model")),
           json_string_value(json_object_get(r, "dtype")),
           (long long)json_integer_value(json_object_get(r, "batch")),
           (long long)json_integer_value(json_object_get(r, "seq")),
           (long long)json_integer_value(json_object_get(r, "steps")), flags);
  }
  json_decref(g);
  return 0;
}

/* The trace tensor behind a golden quantity name: "loss step S" (one element of
 * "loss"), "grad_norm step S" (one element of "grad_norm"), "NAME grad step S"
 * -> grad.stepS.NAME, "NAME param after step S" -> param.final.NAME. Returns the
 * tensor, *elem = the loss or norm element or -1. */
static const dt_st_tensor *trace_tensor(const dt_st_file *f, const char *q, int64_t *elem) {
  char name[DT_ST_NAME_LEN], buf[DT_ST_NAME_LEN + 32];
  int s, k = 0;
  *elem = -1;
  if (sscanf(q, "loss step %d%n", &s, &k) == 1 && !q[k]) {
    *elem = s;
    return dt_st_find(f, "loss");
  }
  if (sscanf(q, "grad_norm step %d%n", &s, &k) == 1 && !q[k]) {
    *elem = s;
    return dt_st_find(f, "grad_norm");
  }
  const char *g = strstr(q, " grad step "), *p = strstr(q, " param after step ");
  if (g && (size_t)(g - q) < sizeof name && sscanf(g, " grad step %d%n", &s, &k) == 1 && !g[k]) {
    snprintf(name, sizeof name, "%.*s", (int)(g - q), q);
    snprintf(buf, sizeof buf, "grad.step%d.%s", s, name);
    return dt_st_find(f, buf);
  }
  if (p && (size_t)(p - q) < sizeof name) {
    snprintf(name, sizeof name, "%.*s", (int)(p - q), q);
    snprintf(buf, sizeof buf, "param.final.%s", name);
    return dt_st_find(f, buf);
  }
  return NULL;
}

/* Whether quantity q comes after the first optimizer update. */
static bool after_update(const char *q) {
  const char *s = strstr(q, "step ");
  return strstr(q, " param after step ") || (s && atoi(s + 5) > 0);
}

typedef struct worst {
  double ratio;   /* error / tolerance */
  char what[256];
} worst;

static void note(worst *w, const char *q, const char *which, double err, double tl) {
  double r = isnan(err) ? INFINITY : err / tl;
  if (r > w->ratio || !w->what[0]) {
    w->ratio = r;
    snprintf(w->what, sizeof w->what, "%s (%s): error %.3g, tolerance %.3g", q, which, err, tl);
  }
}

static double num(json_t *o, const char *k) {
  json_t *v = json_object_get(o, k);
  return json_is_number(v) ? json_number_value(v) : NAN;
}

/* The golden's checksums of x[0..n): sum, sum |x|, sum x^2, max |x|. */
static void checksums(const double *x, int64_t n, double *sum, double *sabs, double *ssq,
                      double *mabs) {
  *sum = *sabs = *ssq = *mabs = 0;
  for (int64_t i = 0; i < n; i++) {
    *sum += x[i];
    *sabs += fabs(x[i]);
    *ssq += x[i] * x[i];
    *mabs = fmax(*mabs, fabs(x[i]));
  }
}

/* The run's inputs (the golden's "inputs": what PyTorch computed from) against
 * this shardbench's: the token batches in the trace and, given the run's
 * --save-weights file, the initial weights. The values must be the same numbers:
 * samples and max |x| exactly, the sums up to their summation order (2^-40
 * relative: the order differs, the addends do not). Returns the mismatches
 * (printed), or -1 when a file cannot be read. */
static long check_inputs(dt_ctx *hc, json_t *run, const dt_st_file *trace, const char *wpath) {
  json_t *ins = json_object_get(run, "inputs");
  if (!json_is_object(ins)) return 0; /* an older golden file: nothing to tell */
  dt_st_file wf;
  bool have_w = wpath && dt_st_open(hc, wpath, &wf) == DT_OK;
  if (wpath && !have_w) {
    fprintf(stderr, "golden_check: %s\n", dt_last_error(hc));
    return -1;
  }
  long bad = 0;
  const char *n;
  json_t *gq;
  json_object_foreach(ins, n, gq) {
    const bool init = !strncmp(n, "init ", 5);
    if (init && !have_w) continue;
    const dt_st_tensor *t = init ? dt_st_find(&wf, n + 5) : dt_st_find(trace, n);
    double *x = t ? malloc(sizeof *x * (size_t)(t->numel ? t->numel : 1)) : NULL;
    bool same = x && t->numel == (int64_t)num(gq, "numel") &&
                dt_st_read(hc, init ? &wf : trace, t, strcmp(t->dtype, "I64") ? DT_F64 : DT_I64,
                           x) == DT_OK;
    if (same && !strcmp(t->dtype, "I64")) /* token ids: exact as doubles below 2^53 */
      for (int64_t i = 0; i < t->numel; i++) x[i] = (double)((int64_t *)x)[i];
    double sum = 0, sabs = 0, ssq = 0, mabs = 0;
    if (same) checksums(x, t->numel, &sum, &sabs, &ssq, &mabs);
    const double rel = 0x1p-40, rabs = num(gq, "sum_abs");
    same = same && mabs == num(gq, "max_abs") && fabs(sum - num(gq, "sum")) <= rel * rabs &&
           fabs(sabs - rabs) <= rel * rabs && fabs(ssq - num(gq, "sumsq")) <= rel * num(gq, "sumsq");
    size_t si;
    json_t *smp;
    json_array_foreach(json_object_get(gq, "samples"), si, smp) {
      int64_t i = (int64_t)json_integer_value(json_array_get(smp, 0));
      same = same && i >= 0 && i < t->numel && x[i] == json_number_value(json_array_get(smp, 1));
    }
    free(x);
    if (!same) {
      if (bad < 5) printf("INPUT differs from the golden's: %s\n", n);
      bad++;
    }
  }
  if (have_w) dt_st_close(hc, &wf);
  return bad;
}

static int cmd_check(const char *path, const char *idx_s, const char *trace, const char *weights) {
  json_t *g = load_json(path), *runs = g ? golden_runs(g, path) : NULL;
  if (!runs) return 2;
  json_t *run = json_array_get(runs, (size_t)atoi(idx_s));
  json_t *qs = json_object_get(run, "quantities");
  if (!json_is_object(qs)) {
    fprintf(stderr, "golden_check: %s: no run %s with quantities\n", path, idx_s);
    json_decref(g);
    return 2;
  }
  const char *dts = json_string_value(json_object_get(run, "dtype"));
  const tol t = dts && !strcmp(dts, "f32") ? TOL_F32 : TOL_F64;
  dt_ctx hc;
  dt_ctx_init(&hc, 0, 1);
  dt_st_file f;
  if (dt_st_open(&hc, trace, &f) != DT_OK) {
    fprintf(stderr, "golden_check: %s\n", dt_last_error(&hc));
    json_decref(g);
    dt_ctx_release(&hc);
    return 2;
  }
  const long stale = check_inputs(&hc, run, &f, weights);
  if (stale != 0) {
    if (stale > 0)
      printf("golden run %s: STALE: %ld of its inputs (shardbench's initial weights or token "
             "batches) are not what the golden file was made from; regenerate it with "
             "`make check-torch GOLDEN=1` after checking why they changed\n", idx_s, stale);
    dt_st_close(&hc, &f);
    dt_ctx_release(&hc);
    json_decref(g);
    return stale > 0 ? 3 : 2;
  }
  const char *tm = dt_st_meta(&f, "model"), *gm = json_string_value(json_object_get(run, "model"));
  if (tm && gm && strcmp(tm, gm))
    printf("note: the trace is of model %s, the golden run of %s\n", tm, gm);
  worst w = {0, ""};
  double max_before = 0, max_after = 0; /* the largest error of each kind, for the summary */
  long n = 0, over = 0, missing = 0;
  const char *q;
  json_t *gq;
  double *buf = NULL;
  int64_t cap = 0;
  json_object_foreach(qs, q, gq) {
    int64_t elem;
    const dt_st_tensor *tt = trace_tensor(&f, q, &elem);
    int64_t numel = elem >= 0 ? 1 : tt ? tt->numel : 0;
    if (!tt || (elem >= 0 && elem >= tt->numel) || numel != (int64_t)num(gq, "numel")) {
      printf("MISSING or differently sized in the trace: %s\n", q);
      missing++;
      continue;
    }
    if (tt->numel > cap) {
      free(buf);
      cap = tt->numel;
      buf = malloc(sizeof *buf * (size_t)cap);
      if (!buf) {
        fprintf(stderr, "golden_check: out of memory\n");
        return 2;
      }
    }
    if (dt_st_read(&hc, &f, tt, DT_F64, buf) != DT_OK) {
      fprintf(stderr, "golden_check: %s\n", dt_last_error(&hc));
      return 2;
    }
    const double *x = elem >= 0 ? buf + elem : buf;
    double sum, sabs, ssq, mabs;
    checksums(x, numel, &sum, &sabs, &ssq, &mabs);
    const double tl = after_update(q) ? t.after : t.before;
    const double rmax = num(gq, "max_abs"), rabs = num(gq, "sum_abs");
    double e[4] = {fabs(sum - num(gq, "sum")) / rabs, fabs(sabs - rabs) / rabs,
                   fabs(ssq - num(gq, "sumsq")) / num(gq, "sumsq"), fabs(mabs - rmax) / rmax};
    static const char *const what[4] = {"sum", "sum |x|", "sum x^2", "max |x|"};
    double qe = 0;
    for (int k = 0; k < 4; k++) {
      if (rabs == 0) e[k] = mabs == 0 ? 0 : INFINITY;
      note(&w, q, what[k], e[k], tl);
      qe = isnan(e[k]) || e[k] > qe ? e[k] : qe;
    }
    size_t si;
    json_t *smp;
    json_array_foreach(json_object_get(gq, "samples"), si, smp) {
      int64_t i = (int64_t)json_integer_value(json_array_get(smp, 0));
      double ref = json_number_value(json_array_get(smp, 1));
      double err = i >= 0 && i < numel ? fabs(x[i] - ref) / (rmax > 0 ? rmax : 1) : INFINITY;
      char which[48];
      snprintf(which, sizeof which, "element %lld", (long long)i);
      note(&w, q, which, err, tl);
      qe = isnan(err) || err > qe ? err : qe;
    }
    n++;
    if (!(qe <= tl)) over++;
    double *mk = after_update(q) ? &max_after : &max_before;
    *mk = isnan(qe) || qe > *mk ? qe : *mk;
  }
  free(buf);
  dt_st_close(&hc, &f);
  dt_ctx_release(&hc);
  printf("golden run %s (%s): %ld quantities compared, %ld over tolerance, %ld missing; largest "
         "error before the first update %.3g (tolerance %.3g), after %.3g (tolerance %.3g); "
         "worst: %s (%.3g of its tolerance)\n", idx_s, dts ? dts : "?", n, over, missing,
         max_before, t.before, max_after, t.after, w.what, w.ratio);
  json_decref(g);
  return n > 0 && over == 0 && missing == 0 ? 0 : 1;
}

/* Run I's `shardbench run --world 1 --json` verdict (its job against its
 * unsharded reference, every step's loss, gradients and norm and the final
 * weights). The trace `check` compares is the reference's, which runs without
 * AC; so for a run with ac the AC'd job must be bitwise that reference
 * (max_abs_err 0: at world 1 both compute the same sums in the same order, and
 * recomputing a block's forward gives the same bits, verify/test_ac.c), which
 * makes PyTorch's torch.utils.checkpoint numbers shardbench's AC job's too. */
static int cmd_job(const char *path, const char *idx_s, const char *runjson) {
  json_t *g = load_json(path), *runs = g ? golden_runs(g, path) : NULL;
  json_t *run = runs ? json_array_get(runs, (size_t)atoi(idx_s)) : NULL;
  json_t *r = run ? load_json(runjson) : NULL;
  if (!r || !json_is_object(r)) {
    if (run && r) fprintf(stderr, "golden_check: %s: not a JSON object\n", runjson);
    if (g && runs && !run) fprintf(stderr, "golden_check: %s: no run %s\n", path, idx_s);
    json_decref(g);
    json_decref(r);
    return 2;
  }
  const char *ac = json_string_value(json_object_get(run, "ac"));
  const char *st = json_string_value(json_object_get(r, "status"));
  const char *key = json_string_value(json_object_get(r, "key"));
  const char *reason = json_string_value(json_object_get(r, "reason"));
  json_t *cmp = json_object_get(r, "compared"), *mae = json_object_get(r, "max_abs_err");
  char want[64] = "";
  if (ac) snprintf(want, sizeof want, " ac=%s", ac);
  const char *at = ac && key ? strstr(key, want) : NULL;
  const bool key_ok = !ac || (at && (at[strlen(want)] == ' ' || !at[strlen(want)]));
  const bool ok = st && !strcmp(st, "ok") && json_is_integer(cmp) && json_integer_value(cmp) > 0 &&
                  key_ok && (!ac || (json_is_number(mae) && json_number_value(mae) == 0));
  printf("golden run %s job%s: %s, %lld tensors compared against the reference, max abs error "
         "%.3g%s%s%s\n", idx_s, want, st ? st : "no status",
         (long long)json_integer_value(cmp), json_is_number(mae) ? json_number_value(mae) : NAN,
         !key_ok ? "; the key does not say" : "", !key_ok ? want : "",
         ok ? "" : ac ? ": OFF (an AC job must be ok and bitwise its reference)" : ": OFF");
  if (!ok && reason) printf("  reason: %s\n", reason);
  json_decref(g);
  json_decref(r);
  return ok ? 0 : 1;
}

/* OUT = IN with one element scaled: the test's way to plant a wrong weight. */
static int cmd_perturb(const char *in, const char *out, const char *name, const char *idx_s,
                       const char *fac_s) {
  dt_ctx hc;
  dt_ctx_init(&hc, 0, 1);
  dt_st_file f;
  if (dt_st_open(&hc, in, &f) != DT_OK) {
    fprintf(stderr, "golden_check: %s\n", dt_last_error(&hc));
    return 2;
  }
  dt_st_spec *sp = calloc((size_t)f.n, sizeof *sp);
  const char **keys = calloc((size_t)f.n_meta + 1, sizeof *keys);
  const char **vals = calloc((size_t)f.n_meta + 1, sizeof *vals);
  int rc = 2;
  dt_st_writer *w = NULL;
  if (!sp || !keys || !vals) goto done;
  for (int i = 0; i < f.n_meta; i++) keys[i] = f.meta_key[i], vals[i] = f.meta_val[i];
  for (int i = 0; i < f.n; i++) {
    dt_dtype d;
    if (strcmp(f.t[i].dtype, "F64") && strcmp(f.t[i].dtype, "F32")) {
      fprintf(stderr, "golden_check: %s: '%s' is %s (F64 or F32 only)\n", in, f.t[i].name,
              f.t[i].dtype);
      goto done;
    }
    d = strcmp(f.t[i].dtype, "F64") ? DT_F32 : DT_F64;
    sp[i] = (dt_st_spec){f.t[i].name, d, f.t[i].ndim, f.t[i].shape};
  }
  if (!dt_st_find(&f, name)) {
    fprintf(stderr, "golden_check: %s: no tensor '%s'\n", in, name);
    goto done;
  }
  if (dt_st_write_begin(&hc, out, f.n, sp, f.n_meta, keys, vals, &w) != DT_OK) goto fail;
  for (int i = 0; i < f.n; i++) {
    double *x = malloc(sizeof *x * (size_t)(f.t[i].numel ? f.t[i].numel : 1));
    if (!x || dt_st_read(&hc, &f, &f.t[i], DT_F64, x) != DT_OK) {
      free(x);
      goto fail;
    }
    long long at = atoll(idx_s);
    if (!strcmp(f.t[i].name, name) && at >= 0 && at < f.t[i].numel) x[at] *= atof(fac_s);
    dt_status s = dt_st_write_next(&hc, w, x, DT_F64);
    free(x);
    if (s != DT_OK) goto fail;
  }
  if (dt_st_write_end(&hc, w) != DT_OK) {
    w = NULL;
    goto fail;
  }
  w = NULL;
  rc = 0;
  goto done;
fail:
  fprintf(stderr, "golden_check: %s\n", dt_last_error(&hc));
done:
  dt_st_write_abort(&hc, w);
  free(sp);
  free(keys);
  free(vals);
  dt_st_close(&hc, &f);
  dt_ctx_release(&hc);
  return rc;
}

/* PyTorch's collective counts (the golden's "comm" rows of PLAN at TP) against the
 * run's ledger (RUNJSON: `shardbench run --json` of the same config, steps 1).
 * Each row's PyTorch count over its "pytorch_calls_per_reduction" (default 1)
 * must equal shardbench's count of that op in that phase: a row where PyTorch
 * runs the same reduction several times says so there, with the reason in its
 * note (DTensor's Partial->Replicate at every read of an unreduced gradient by
 * a non-foreach AdamW: exp_avg.lerp_, exp_avg_sq.addcmul_(grad, grad) read it
 * three times). Every shardbench call must be accounted for by some row. */
static int cmd_comm(const char *path, const char *plan, const char *tp_s, const char *runjson) {
  json_t *g = load_json(path), *r = load_json(runjson);
  if (!g || !r) return 2;
  json_t *rows = json_object_get(g, "comm"), *sc = json_object_get(r, "comm");
  if (!json_is_array(rows) || !json_is_array(sc)) {
    fprintf(stderr, "golden_check: no comm rows in %s or %s\n", path, runjson);
    return 2;
  }
  long checked = 0, bad = 0;
  size_t i, k;
  json_t *row, *c;
  long long sb_total = 0, want_total = 0;
  json_array_foreach(sc, k, c) sb_total += json_integer_value(json_object_get(c, "calls"));
  json_array_foreach(rows, i, row) {
    const char *p = json_string_value(json_object_get(row, "plan"));
    if (!p || strcmp(p, plan) || json_integer_value(json_object_get(row, "tp")) != atoi(tp_s))
      continue;
    const char *op = json_string_value(json_object_get(row, "op"));
    const char *ph = json_string_value(json_object_get(row, "phase"));
    json_t *per_j = json_object_get(row, "pytorch_calls_per_reduction");
    long long pt = json_integer_value(json_object_get(row, "pytorch")), got = 0;
    long long per = json_is_integer(per_j) ? json_integer_value(per_j) : 1;
    if (!op || !ph || per < 1 || pt % per) {
      fprintf(stderr, "golden_check: %s: malformed comm row %zu\n", path, i);
      return 2;
    }
    long long want = pt / per;
    want_total += want;
    json_array_foreach(sc, k, c) {
      if (!strcmp(json_string_value(json_object_get(c, "op")), op) &&
          !strcmp(json_string_value(json_object_get(c, "phase")), ph))
        got += json_integer_value(json_object_get(c, "calls"));
    }
    checked++;
    if (got != want) {
      bad++;
      printf("FAIL: %s tp %s %s %s: PyTorch %lld (%lld per reduction), shardbench %lld\n", plan,
             tp_s, op, ph, pt, per, got);
    }
  }
  checked++;
  if (sb_total != want_total) {
    bad++;
    printf("FAIL: %s tp %s: shardbench makes %lld collective calls per step, PyTorch's rows "
           "account for %lld\n", plan, tp_s, sb_total, want_total);
  }
  printf("comm %s tp %s: %ld checks, %ld failed\n", plan, tp_s, checked, bad);
  json_decref(g);
  json_decref(r);
  return checked > 1 && !bad ? 0 : 1;
}

static int cmd_comm_list(const char *path) {
  json_t *g = load_json(path);
  if (!g) return 2;
  json_t *rows = json_object_get(g, "comm"), *row;
  size_t i, k;
  json_array_foreach(rows, i, row) { /* each (plan, tp) once, in first-seen order */
    const char *p = json_string_value(json_object_get(row, "plan"));
    json_int_t tp = json_integer_value(json_object_get(row, "tp"));
    bool seen = false;
    for (k = 0; k < i && !seen; k++) {
      json_t *o = json_array_get(rows, k);
      const char *q = json_string_value(json_object_get(o, "plan"));
      seen = p && q && !strcmp(p, q) && json_integer_value(json_object_get(o, "tp")) == tp;
    }
    if (p && !seen) printf("%s %lld\n", p, (long long)tp);
  }
  json_decref(g);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "list")) return cmd_list(argv[2]);
  if (argc == 3 && !strcmp(argv[1], "comm-list")) return cmd_comm_list(argv[2]);
  if ((argc == 5 || argc == 6) && !strcmp(argv[1], "check"))
    return cmd_check(argv[2], argv[3], argv[4], argc == 6 ? argv[5] : NULL);
  if (argc == 5 && !strcmp(argv[1], "job")) return cmd_job(argv[2], argv[3], argv[4]);
  if (argc == 7 && !strcmp(argv[1], "perturb"))
    return cmd_perturb(argv[2], argv[3], argv[4], argv[5], argv[6]);
  if (argc == 6 && !strcmp(argv[1], "comm")) return cmd_comm(argv[2], argv[3], argv[4], argv[5]);
  return usage();
}
