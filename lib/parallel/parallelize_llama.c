/* lib/parallel/parallelize_llama.c: a plan resolved once per config
 * (dt_parallel_plan_resolve) and TorchTitan's parallelize_llama
 * (torchtitan/models/llama3/infra/parallelize.py): TP/SP, CP, then FSDP/HSDP on a
 * created model. TorchTitan applies each parallelism only when its degree is > 1;
 * a plan whose part would not apply is refused here (the run would be another
 * plan's), with the reason. Not here: the mesh (parallel_dims.c), the pipeline split
 * (pipeline_llm.c), DDP's reduction (the training step, trainer.c).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer.h"

static const char *const WHO = "dt_parallel_plan_resolve";

static dt_status refuse(dt_ctx *ctx, const char *fmt, ...) DT_PRINTF(2, 3);
static dt_status refuse(dt_ctx *ctx, const char *fmt, ...) {
  char why[DT_ERRMSG_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  return dt_error(ctx, DT_ERR_UNSUPPORTED, WHO, "%s", why);
}

/* The message of the ctx's last error without its "rank N: " prefix. */
static const char *without_rank(const char *m) {
  int r, k = 0;
  return sscanf(m, "rank %d: %n", &r, &k) >= 1 && k > 0 ? m + k : m;
}

dt_status dt_parallel_plan_resolve(dt_ctx *ctx, const dt_plan *p, const int degree[DT_PDIM_COUNT],
                                   const dt_llama_config *cfg_whole, int batch, int seq,
                                   dt_parallel_plan *out) {
  memset(out, 0, sizeof *out);
  out->plan = *p;
  dt_plan *plan = &out->plan;
  for (int d = 0; d < DT_PDIM_COUNT; d++) out->degree[d] = degree[d];
  const int ptp = dt_plan_dim(plan, "tp"), pds = dt_plan_dim(plan, "dp_shard");
  bool has_tp = false, has_fsdp = false;
  for (int i = 0; i < plan->n_entries; i++) {
    const dt_plan_entry *e = &plan->entries[i];
    if (e->dim == ptp) {
      has_tp = true;
      out->tp_entries[out->n_tp++] = *e;
    } else if (e->dim == pds && e->style.kind == DT_STYLE_FULLY_SHARD) {
      has_fsdp = true;
      out->fsdp_entries[out->n_fsdp++] = *e;
    } else {
      return refuse(ctx, "plan '%s' has entries on [%s]; the harness applies [tp] and [dp_shard] "
                         "entries only", plan->name, plan->dim_names[e->dim]);
    }
  }
  for (int d = 0; d < DT_PDIM_COUNT; d++) {
    const int pi = dt_plan_dim(plan, dt_pdim_name(d));
    if (degree[d] > 1 && pi < 0 && d != DT_PDIM_DP_REPLICATE) /* dp_replicate: DDP */
      return refuse(ctx, "plan '%s' has no dim %s (the mesh has %s=%d)", plan->name,
                    dt_pdim_name(d), dt_pdim_name(d), degree[d]);
    if (pi >= 0 && plan->dim_sizes[pi] != -1 && plan->dim_sizes[pi] != degree[d])
      return refuse(ctx, "plan '%s' fixes %s=%d; the mesh has %s=%d", plan->name, dt_pdim_name(d),
                    plan->dim_sizes[pi], dt_pdim_name(d), degree[d]);
  }
  if (has_tp && degree[DT_PDIM_TP] == 1)
    return refuse(ctx, "tp=1: the plan's [tp] entries would not apply (TorchTitan applies TP only "
                       "when tp > 1); the run equals plan dp's");
  if (dt_plan_dim(plan, "pp") >= 0 && degree[DT_PDIM_PP] == 1)
    return refuse(ctx, "pp=1: the plan's pipeline would not apply (TorchTitan applies PP only "
                       "when pp > 1); the run equals the plan's without its pp dim");
  if (has_fsdp && degree[DT_PDIM_DP_SHARD] == 1 && degree[DT_PDIM_CP] == 1)
    return refuse(ctx, "dp_shard=1, cp=1: the plan's fully_shard entries would not apply "
                       "(TorchTitan applies FSDP only when dp_shard x cp > 1); the run equals "
                       "plan dp's");
  if (degree[DT_PDIM_DP_SHARD] > 1 && !has_fsdp)
    return refuse(ctx, "dp_shard=%d: plan '%s' has no fully_shard entries to shard over it",
                  degree[DT_PDIM_DP_SHARD], plan->name);
  int plan_world = 1;
  for (int i = 0; i < plan->n_dims; i++) {
    int d = 0;
    while (d < DT_PDIM_COUNT && strcmp(plan->dim_names[i], dt_pdim_name(d))) d++;
    plan->dim_sizes[i] = d < DT_PDIM_COUNT ? degree[d] : 1;
    plan_world *= plan->dim_sizes[i];
  }
  DT_CHECK(dt_plan_resolve(ctx, plan, plan_world, cfg_whole, seq));
  out->resolved = true;
  out->tp = has_tp;
  out->fsdp = has_fsdp;
  out->pp = degree[DT_PDIM_PP] > 1;
  if (batch % degree[DT_PDIM_DP_REPLICATE])
    return refuse(ctx, "batch %d is not divisible by dp_replicate=%d", batch,
                  degree[DT_PDIM_DP_REPLICATE]);
  if (!out->pp) return DT_OK;
  /* the pipeline: the microbatches, the schedule and the stage split */
  for (int i = 0; i < out->n_fsdp; i++) /* dt_fsdp_pipeline_begin's refusal */
    if (out->fsdp_entries[i].style.reshard_after_forward == 1 && (plan->zero == 0 || plan->zero == 3))
      return refuse(ctx, "pp=%d: '%s' = fully_shard(reshard_after_forward=True): inside pipeline "
                         "stages a unit stays gathered for the step (TorchTitan's default with pp)",
                    degree[DT_PDIM_PP], out->fsdp_entries[i].pattern);
  const int ndp = degree[DT_PDIM_DP_REPLICATE] * degree[DT_PDIM_DP_SHARD];
  /* a count of microbatches (pp: the degree), else microbatches of a size */
  const int nmb = plan->pp_microbatches < 0 ? degree[DT_PDIM_PP] : plan->pp_microbatches;
  const int unit = nmb > 0 ? nmb : plan->pp_microbatch_size;
  if (batch % ndp || (batch / ndp) % unit)
    return refuse(ctx, "batch %d over dp_replicate x dp_shard = %d is not a multiple of the "
                       "%s %d", batch, ndp, nmb > 0 ? "pipeline microbatch count" :
                       "pipeline microbatch size", unit);
  out->n_microbatches = nmb > 0 ? nmb : batch / ndp / unit;
  dt_pipeline pl;
  memset(&pl, 0, sizeof pl);
  dt_status s = dt_pipeline_llm(ctx, plan, cfg_whole->n_layers, degree[DT_PDIM_PP],
                                out->n_microbatches, &pl);
  dt_pipeline_free(ctx, &pl);
  if (s != DT_OK) {
    char inner[DT_ERRMSG_LEN];
    snprintf(inner, sizeof inner, "%s", without_rank(dt_last_error(ctx)));
    return refuse(ctx, "pipeline: %s", inner);
  }
  return DT_OK;
}

/* Whether one of the entry's patterns matches a module of m ("root": the model). */
static bool entry_matches(const dt_model *m, const dt_plan_entry *e) {
  char pats[8][96];
  const int np = dt_plan_entry_patterns(e, pats, 8);
  for (int k = 0; k < np; k++) {
    if (e->style.kind == DT_STYLE_FULLY_SHARD && !strcmp(pats[k], "root")) return true;
    for (int i = 1; i < m->n_mods; i++)
      if (dt_fqn_match(pats[k], m->mods[i].fqn)) return true;
  }
  return false;
}

/* The entries of in[0..n) that match a module of m, into out; their count. */
static int present(const dt_model *m, const dt_plan_entry *in, int n, dt_plan_entry *out) {
  int k = 0;
  for (int i = 0; i < n; i++)
    if (entry_matches(m, &in[i])) out[k++] = in[i];
  return k;
}

dt_status dt_parallelize_llama(dt_ctx *ctx, dt_model *m, const dt_parallel_dims *dims,
                               const dt_parallel_plan *pp, const dt_parallelize_opts *o) {
  if (!pp) return DT_OK;
  dt_plan_entry *e = malloc(sizeof *e * DT_PLAN_MAX_ENTRIES);
  if (!e) return dt_error(ctx, DT_ERR_NOMEM, "dt_parallelize_llama", "no memory");
  const int tp = dims->dim[DT_PDIM_TP], cp = dims->dim[DT_PDIM_CP];
  const int dps = dims->dim[DT_PDIM_DP_SHARD], dpr = dims->dim[DT_PDIM_DP_REPLICATE];
  /* the activation between blocks: the batch Shard(0) on dp, the sequence Shard(1) on
   * cp, and on tp what tok_embeddings' style outputs (RowwiseParallel's default:
   * Replicate; sequence parallel: Shard(1)); every block keeps it (x + f(x)) */
  m->has_act_pl = true;
  for (int d = 0; d < DT_MAX_MESH_DIMS; d++) m->act_pl[d] = dt_replicate();
  if (dpr >= 0) m->act_pl[dpr] = dt_shard(0);
  if (dps >= 0) m->act_pl[dps] = dt_shard(0);
  if (cp >= 0) m->act_pl[cp] = dt_shard(1);
  for (int i = 0; tp >= 0 && i < pp->n_tp; i++) {
    const dt_style *st = &pp->tp_entries[i].style;
    if (!strcmp(pp->tp_entries[i].pattern, "tok_embeddings") && st->n_out > 0 &&
        !st->output_layouts[0].none)
      m->act_pl[tp] = st->output_layouts[0].pl;
  }
  dt_status s = DT_OK;
  if (tp >= 0) s = dt_parallelize_module(ctx, m, tp, e, present(m, pp->tp_entries, pp->n_tp, e));
  if (s == DT_OK && cp >= 0)
    s = dt_context_parallel(ctx, m, cp, pp->plan.cp_rotate, pp->plan.cp_load_balance);
  if (s == DT_OK && pp->fsdp && (dps >= 0 || cp >= 0)) {
    /* FSDP over dp_shard x cp (TorchTitan's dp_shard_cp), HSDP's replicas on dp_replicate */
    dt_fsdp_opts fo = {.shard_dim = dps, .replicate_dim = dpr, .cp_dim = cp,
                       .zero = pp->plan.zero ? pp->plan.zero : 3,
                       .param_dtype = pp->plan.param_dtype, .reduce_dtype = pp->plan.reduce_dtype};
    if (o) snprintf(fo.fault_no_reduce, sizeof fo.fault_no_reduce, "%s", o->fault_no_reduce);
    s = dt_fully_shard(ctx, m, e, present(m, pp->fsdp_entries, pp->n_fsdp, e), &fo);
  }
  free(e);
  return s;
}
