/* lib/parallel/lr_schedule.c: TorchTitan's learning-rate schedule, the factor of
 * the base lr per step (torchtitan/components/lr_scheduler.py build_lr_schedulers,
 * linear_warmup_stable_decay, a LambdaLR: step s's optimizer runs at lr x f(s)).
 * Not here: the optimizer (lib/nn dt_model_adamw_step) and its base lr.
 */
#include <math.h>
#include <string.h>

#include "trainer.h"

static const double PI = 3.14159265358979323846;

bool dt_lr_decay_parse(const char *name, dt_lr_decay *out) {
  static const char *const names[] = {"linear", "sqrt", "cosine"};
  for (int i = 0; i < 3; i++)
    if (!strcmp(name, names[i])) {
      *out = (dt_lr_decay)i;
      return true;
    }
  return false;
}

double dt_lr_factor(const dt_lr_schedule *s, int step) {
  const int n = s->training_steps;
  if (n <= 0) return 1.0;
  /* build_lr_schedulers: the warm-up clamped to the run, the decay to what it leaves,
   * and a virtual last stable step so that the lr does not reach 0 */
  const int warm = s->warmup_steps > n ? n : s->warmup_steps;
  int decay = s->has_decay_ratio ? (int)nearbyint((double)n * s->decay_ratio) : n - warm;
  /* nearbyint: to nearest, ties to even, as Python's round */
  if (warm + decay > n) decay = n - warm;
  const int stable = n + 1 - warm - decay;
  if (step < warm) return (double)(step + 1) / warm;
  if (step < warm + stable) return 1.0;
  const double progress = (double)(step + 1 - (warm + stable)) / decay;
  const double adj = s->decay_type == DT_LR_SQRT     ? 1.0 - sqrt(progress)
                     : s->decay_type == DT_LR_COSINE ? 0.5 * (1.0 + cos(PI * progress))
                                                     : 1.0 - progress;
  return s->min_lr_factor + (1.0 - s->min_lr_factor) * adj;
}
