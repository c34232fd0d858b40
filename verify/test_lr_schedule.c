/* verify/test_lr_schedule.c: the training recipe's pieces on one rank, each
 * against an independent oracle:
 *   1. dt_lr_factor (TorchTitan's linear_warmup_stable_decay) against values worked
 *      out by hand in this file for a 10-step run (warm-up, stable, the three decay
 *      types, min_lr_factor, decay_ratio None, the warm-up clamped, Python's
 *      half-to-even round of the decay steps);
 *   2. the trainer steps AdamW at base lr x that factor over 10 steps (rec.lr);
 *   3. dt_clip_grad_norm on a 1-rank model: the total norm against a naive sum
 *      of squares (and max |g| for inf) over the gathered gradients, and the
 *      gradients after it against coef x before, coef = max_norm / (norm + 1e-6);
 *      a max_norm above the norm leaves them bitwise as they were.
 * The sharded norm (every mesh dim, pp) is verify/clip.sh's.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor.h"
#include "testutil.h"

/* ---- 1. the factor, by hand ---- */

/* N = 10 steps, warm-up 2, decay_ratio 0.4: decay steps round(4.0) = 4, stable
 * 10 + 1 - 2 - 4 = 5 (the virtual last step), so steps 0..1 warm up ((s + 1) / 2),
 * 2..6 are stable, 7..9 decay with progress (s + 1 - 7) / 4 = 1/4, 2/4, 3/4. */
static const double WSD_LINEAR[10] = {0.5, 1, 1, 1, 1, 1, 1, 0.75, 0.5, 0.25};
/* 1 - sqrt(p): 1 - 0.5, 1 - 0.70710678..., 1 - 0.86602540... */
static const double WSD_SQRT[10] = {0.5, 1, 1, 1, 1, 1, 1, 0.5, 0.29289321881345254,
                                    0.1339745962155614};
/* (1 + cos(pi p)) / 2: (1 + 0.70710678...) / 2, 1/2, (1 - 0.70710678...) / 2 */
static const double WSD_COSINE[10] = {0.5, 1, 1, 1, 1, 1, 1, 0.8535533905932737, 0.5,
                                      0.14644660940672627};

static void check_factor(void) {
  /* the factors are a few f64 operations on small integers: a few ulps */
  const double tol = 1e-15;
  dt_lr_schedule s = {10, 2, true, 0.4, DT_LR_LINEAR, 0.0};
  const double *want[3] = {WSD_LINEAR, WSD_SQRT, WSD_COSINE};
  for (int k = 0; k < 3; k++) {
    s.decay_type = (dt_lr_decay)k;
    for (int i = 0; i < 10; i++)
      TU_CHECK(fabs(dt_lr_factor(&s, i) - want[k][i]) <= tol, "decay %d step %d: %.17g, want %.17g",
               k, i, dt_lr_factor(&s, i), want[k][i]);
  }
  /* the tables tell a schedule one step early apart (LambdaLR stepped before the
   * optimizer: a planted bug the trainer check below would then catch) */
  for (int k = 0; k < 3; k++) {
    s.decay_type = (dt_lr_decay)k;
    int off = 0;
    for (int i = 0; i < 9; i++) off += fabs(dt_lr_factor(&s, i + 1) - want[k][i]) > tol;
    TU_CHECK(off >= 3, "decay %d: a one-step shift differs at %d steps only", k, off);
  }
  /* min_lr_factor 0.1: 0.1 + 0.9 x the linear decay's 0.75, 0.5, 0.25 */
  s.decay_type = DT_LR_LINEAR;
  s.min_lr_factor = 0.1;
  const double lin_min[3] = {0.775, 0.55, 0.325};
  for (int i = 7; i < 10; i++)
    TU_CHECK(fabs(dt_lr_factor(&s, i) - lin_min[i - 7]) <= tol, "min 0.1 step %d: %.17g", i,
             dt_lr_factor(&s, i));
  TU_CHECK(dt_lr_factor(&s, 3) == 1.0, "min 0.1 stable: %g", dt_lr_factor(&s, 3));
  /* decay_ratio None: decay over N - W = 8 steps, stable 1: step 2 stable, then
   * progress (s + 1 - 3) / 8 = 1/8 .. 7/8; the last step's lr is 1/8, never 0 */
  dt_lr_schedule n = {10, 2, false, 0, DT_LR_LINEAR, 0.0};
  TU_CHECK(dt_lr_factor(&n, 2) == 1.0, "None: step 2 %g", dt_lr_factor(&n, 2));
  for (int i = 3; i < 10; i++)
    TU_CHECK(fabs(dt_lr_factor(&n, i) - (1.0 - (i - 2) / 8.0)) <= tol, "None: step %d %.17g", i,
             dt_lr_factor(&n, i));
  /* warm-up 20 > 10 steps: clamped to 10, (s + 1) / 10 over the whole run */
  dt_lr_schedule w = {10, 20, false, 0, DT_LR_LINEAR, 0.0};
  for (int i = 0; i < 10; i++)
    TU_CHECK(fabs(dt_lr_factor(&w, i) - (i + 1) / 10.0) <= tol, "clamped warm-up: step %d %.17g",
             i, dt_lr_factor(&w, i));
  /* decay_ratio 0.25 of 10: round(2.5) = 2 (half to even), stable 11 - 0 - 2 = 9:
   * step 8 stable, step 9 progress 1/2 */
  dt_lr_schedule h = {10, 0, true, 0.25, DT_LR_LINEAR, 0.0};
  TU_CHECK(dt_lr_factor(&h, 8) == 1.0 && dt_lr_factor(&h, 9) == 0.5, "round half even: %g %g",
           dt_lr_factor(&h, 8), dt_lr_factor(&h, 9));
  /* no schedule: 1 */
  dt_lr_schedule off = {0, 5, true, 0.5, DT_LR_COSINE, 0.5};
  TU_CHECK(dt_lr_factor(&off, 3) == 1.0, "off: %g", dt_lr_factor(&off, 3));
  dt_lr_decay d;
  TU_CHECK(dt_lr_decay_parse("cosine", &d) && d == DT_LR_COSINE && !dt_lr_decay_parse("exp", &d),
           "dt_lr_decay_parse");
}

/* ---- 2. and 3. on a trainer ---- */

enum { STEPS = 10, BATCH = 2, SEQ = 8 };

typedef struct job {
  dt_llama_config cfg;
  const dt_parallel_dims *dims;
} job;

static void batch(const dt_llama_config *c, int64_t *tok, int64_t *tgt) {
  for (int i = 0; i < BATCH * SEQ; i++) {
    tok[i] = (int64_t)((5 * i + 1) % c->vocab);
    tgt[i] = (int64_t)((5 * i + 6) % c->vocab);
  }
}

/* Every gradient gathered, in module order, into one malloc'd array. */
static double *all_grads(dt_ctx *ctx, dt_model *m, int64_t *n) {
  *n = 0;
  double *out = NULL;
  for (int i = 0; i < m->n_mods; i++) {
    const dt_tensor *g = m->mods[i].weight ? dt_var_grad(m->mods[i].weight) : NULL;
    if (!g) continue;
    int64_t k = 0;
    double *v = tu_full_f64(ctx, g, &k);
    double *grown = v ? realloc(out, sizeof *out * (size_t)(*n + k)) : NULL;
    if (!grown) {
      free(v);
      free(out);
      return NULL;
    }
    out = grown;
    memcpy(out + *n, v, sizeof *v * (size_t)k);
    *n += k;
    free(v);
  }
  return out;
}

static dt_status rank_main(dt_ctx *ctx, void *arg) {
  job *j = arg;
  int64_t tok[BATCH * SEQ], tgt[BATCH * SEQ];
  batch(&j->cfg, tok, tgt);
  const dt_adamw adamw = DT_ADAMW_DEFAULT;
  dt_trainer_opts o;
  memset(&o, 0, sizeof o);
  o.dtype = DT_F64;
  o.seed = 3;
  o.batch = BATCH;
  o.seq = SEQ;
  o.adamw = adamw;
  o.lr_schedule = (dt_lr_schedule){STEPS, 2, true, 0.4, DT_LR_COSINE, 0.0};
  dt_trainer *t = NULL;
  DT_CHECK(dt_trainer_create(ctx, &j->cfg, j->dims, NULL, &o, &t));
  dt_model *m = dt_trainer_model(t);
  dt_status s = DT_OK;
  /* 2: the lr of each of 10 steps: the base lr times the hand-worked cosine factors */
  for (int step = 0; step < STEPS && s == DT_OK; step++) {
    dt_trainer_step rec;
    s = dt_trainer_train_step(ctx, t, step, tok, tgt, &rec);
    const double want = adamw.lr * WSD_COSINE[step];
    TU_CHECK(s != DT_OK || fabs(rec.lr - want) <= 1e-15 * want, "step %d: lr %.17g, want %.17g",
             step, rec.lr, want);
    TU_CHECK(s != DT_OK || isnan(rec.grad_norm), "step %d: a norm without clipping", step);
  }
  /* 3: the norm and the scale on this model's gradients */
  for (int k = 0; k < 3 && s == DT_OK; k++) {
    const bool inf = k == 2, above = k == 1;
    dt_var *loss = NULL;
    s = dt_trainer_forward_backward(ctx, t, STEPS + k, tok, tgt, false, &loss, NULL);
    int64_t n = 0;
    double *before = s == DT_OK ? all_grads(ctx, m, &n) : NULL;
    if (s == DT_OK && !before) s = dt_error(ctx, DT_ERR_NOMEM, "test", "no memory");
    double naive = 0;
    for (int64_t i = 0; before && i < n; i++)
      naive = inf ? fmax(naive, fabs(before[i])) : naive + before[i] * before[i];
    if (!inf) naive = sqrt(naive);
    const double max_norm = above ? 2 * naive : 0.25 * naive;
    const dt_clip_opts co = {max_norm, inf ? INFINITY : 2.0, "", 0};
    double total = 0;
    if (s == DT_OK) s = dt_clip_grad_norm(ctx, m, -1, &co, &total);
    /* one f64 sum of squares in another order: n u relative at most */
    TU_CHECK(s != DT_OK || fabs(total - naive) <= 1e-12 * naive, "%s norm %.17g, naive %.17g",
             inf ? "inf" : "2", total, naive);
    int64_t n2 = 0;
    double *after = s == DT_OK ? all_grads(ctx, m, &n2) : NULL;
    const double coef = above ? 1.0 : max_norm / (total + 1e-6);
    double worst = 0;
    for (int64_t i = 0; after && i < n && n2 == n; i++)
      worst = above ? fmax(worst, after[i] != before[i])
                    : fmax(worst, fabs(after[i] - coef * before[i]) / (fabs(coef * before[i]) + 1e-300));
    /* f64: one rounding of the product (0.5 ulp, relative) */
    TU_CHECK(after && n2 == n && worst <= (above ? 0 : 1.2e-16), "%s: scaled gradients off by %.3g",
             above ? "max_norm above the norm" : inf ? "inf" : "2", worst);
    free(before);
    free(after);
    if (s == DT_OK) s = dt_trainer_optimizer_step(ctx, t, false, NULL);
  }
  /* max_norm <= 0 and norm_type 1 are refused */
  const dt_clip_opts bad0 = {0, 2.0, "", 0}, bad1 = {1.0, 1.0, "", 0};
  double tot;
  TU_CHECK(dt_clip_grad_norm(ctx, m, -1, &bad0, &tot) == DT_ERR_INVALID, "max_norm 0 accepted");
  TU_CHECK(dt_clip_grad_norm(ctx, m, -1, &bad1, &tot) == DT_ERR_UNSUPPORTED, "norm_type 1 accepted");
  dt_trainer_free(ctx, t);
  return s;
}

int main(void) {
  check_factor();
  dt_ctx hc;
  dt_ctx_init(&hc, 0, 1);
  job j;
  memset(&j, 0, sizeof j);
  const int ones[DT_PDIM_COUNT] = {1, 1, 1, 1, 1};
  dt_parallel_dims d1;
  TU_OK(&hc, dt_llama_config_get(&hc, "debugmodel:n_layers=1", &j.cfg));
  TU_OK(&hc, dt_parallel_dims_init(&hc, ones, 1, &d1));
  j.dims = &d1;
  dt_launch_opts lo;
  memset(&lo, 0, sizeof lo);
  lo.backend = DT_BACKEND_THREADS;
  lo.world = 1;
  lo.timeout_s = 120;
  dt_launch_report rep;
  memset(&rep, 0, sizeof rep);
  const dt_status s = dt_launch(&lo, rank_main, &j, &rep);
  TU_CHECK(s == DT_OK, "rank %d: %s", rep.failed_rank, rep.failed_msg);
  dt_launch_report_free(&rep);
  dt_ctx_release(&hc);
  return tu_finish("test_lr_schedule");
}
