/* lib/parallel/pipeline_llm.c: TorchTitan's pipeline_llm (torchtitan/distributed/
 * pipeline_parallel.py): a plan's pipeline schedule and its stage split. The
 * schedule is the plan's (generated: one stage per rank, two for Interleaved1F1B,
 * TorchTitan's defaults for single- and multi-stage schedules; or loaded from its
 * CSV); the split is module_fqns_per_model_part or, without it,
 * generate_llm_fqn_per_model_part with the embedding and the head counted as layers
 * (pipeline_parallel_first_stage_less_layers / _last_stage_less_layers). Not here:
 * running the schedule (pp.c, dt_pipeline_step), generating schedules (pp_schedule.c).
 */
#include <stdio.h>
#include <string.h>

#include "trainer.h"

/* The explicit split's stages per rank (module_fqns_per_model_part over pp), else
 * 2 for the interleaved schedule, 1 for the others. */
static dt_status stages_per_rank(dt_ctx *ctx, const dt_plan *pl, int pp, int *v) {
  *v = pl->pp_schedule == DT_PP_INTERLEAVED_1F1B ? 2 : 1;
  if (pl->pp_n_stages <= 0) return DT_OK;
  if (pl->pp_n_stages % pp)
    return dt_error(ctx, DT_ERR_INVALID, "plan",
                    "%s:%d: module_fqns_per_model_part has %d stages, not a multiple of pp=%d",
                    pl->path, pl->pp_stages_line, pl->pp_n_stages, pp);
  *v = pl->pp_n_stages / pp;
  if ((*v > 1) != (pl->pp_schedule == DT_PP_INTERLEAVED_1F1B))
    return dt_error(ctx, DT_ERR_INVALID, "plan",
                    "%s:%d: module_fqns_per_model_part gives %d stages per pp rank (pp=%d); %s",
                    pl->path, pl->pp_stages_line, *v, pp,
                    *v > 1 ? "a single-stage schedule (GPipe, 1F1B) runs one"
                           : "Interleaved1F1B needs 2 or more");
  return DT_OK;
}

/* The plan's module_fqns_per_model_part into out's layout. */
static dt_status explicit_split(dt_ctx *ctx, const dt_plan *pl, int n_layers, dt_pipeline *out) {
  if (pl->pp_n_stages != out->schedule.n_stages)
    return dt_error(ctx, DT_ERR_INVALID, "plan",
                    "%s:%d: module_fqns_per_model_part has %d stages; the schedule has %d",
                    pl->path, pl->pp_stages_line, pl->pp_n_stages, out->schedule.n_stages);
  char copy[sizeof pl->pp_stages], where[sizeof pl->path + 48];
  const char *parts[DT_PP_MAX_STAGES];
  memcpy(copy, pl->pp_stages, sizeof copy);
  int k = 0;
  for (char *q = copy, *e; k < pl->pp_n_stages; q = e + 1) {
    parts[k++] = q;
    if (!(e = strchr(q, ';'))) break;
    *e = '\0';
  }
  snprintf(where, sizeof where, "%s:%d: module_fqns_per_model_part", pl->path, pl->pp_stages_line);
  return dt_pp_split_fqns(ctx, n_layers, parts, k, where, &out->layout);
}

dt_status dt_pipeline_llm(dt_ctx *ctx, const dt_plan *pl, int n_layers, int pp, int m,
                          dt_pipeline *out) {
  memset(out, 0, sizeof *out);
  out->n_microbatches = m;
  dt_pp_schedule *S = &out->schedule;
  if (pl->pp_schedule == DT_PP_CSV) {
    char path[600];
    const char *slash = strrchr(pl->path, '/');
    if (pl->pp_schedule_csv[0] == '/' || !slash)
      snprintf(path, sizeof path, "%s", pl->pp_schedule_csv);
    else
      snprintf(path, sizeof path, "%.*s/%s", (int)(slash - pl->path), pl->path, pl->pp_schedule_csv);
    DT_CHECK(dt_pp_schedule_load(ctx, path, pp, -1, m, S));
    if (S->n_microbatches != m)
      return dt_error(ctx, DT_ERR_INVALID, "pipeline", "%s has %d microbatches; the run has %d",
                      path, S->n_microbatches, m);
  } else {
    int v = 1;
    DT_CHECK(stages_per_rank(ctx, pl, pp, &v));
    DT_CHECK(dt_pp_schedule_generate(ctx, pl->pp_schedule, pp, v, m, S));
    DT_CHECK(dt_pp_schedule_lower(ctx, S));
  }
  if (pl->pp_n_stages > 0) return explicit_split(ctx, pl, n_layers, out);
  return dt_pp_split(ctx, n_layers, S->n_stages, pl->pp_first_less, pl->pp_last_less, &out->layout);
}

void dt_pipeline_free(dt_ctx *ctx, dt_pipeline *p) {
  dt_pp_schedule_free(ctx, &p->schedule);
  memset(p, 0, sizeof *p);
}
