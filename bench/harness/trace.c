/* bench/harness/trace.c: `run --save-trace FILE`: the unsharded reference's inputs
 * and results as one safetensors file, for an outside oracle (verify/torch/) to
 * replay and compare:
 *   tokens.step{S}, targets.step{S}   I64 [batch, seq], S = 0 .. steps-1 ([global_batch,
 *                                     seq] under --global-batch: every microstep's rows)
 *   loss                              F64 [steps], each step's mean cross-entropy,
 *                                     before that step's optimizer update
 *   grad.step{S}.{NAME}               F64, every weight's gradient at step S
 *   param.final.{NAME}                F64, the weights after the last update
 *   grad_norm                         F64 [steps], clip_grad_norm_'s total norm (only
 *                                     a run that clips: --max-norm)
 * (NAME: "layers.0.attention.wq.weight"; an f32 run's values widened exactly),
 * with the config, the model's dims (ffn_dim_multiplier 0: none) and AdamW's
 * settings as __metadata__ strings; the recipe's flags, when given, too (max_norm,
 * global_batch, lr_warmup_steps, lr_decay_ratio ("none"), lr_decay_type,
 * lr_min_factor).
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "store.h"

enum { META_N = 40, META_LEN = 96 };

int sb_trace_write(const sb_opts *o, const sb_snap *snap, const char *path, char *err,
                   size_t errn) {
  dt_ctx hc;
  dt_ctx_init(&hc, 0, 1);
  dt_llama_config cfg;
  dt_model *m = NULL;
  int rc = -1;
  const int S = snap->n_steps;
  const int rows = o->global_batch > 0 ? o->global_batch : o->batch;
  const int64_t tok_shape[2] = {rows, o->seq}, loss_shape[1] = {S};
  int n = 0, cap = 2 * S + 2 + (S + 1) * snap->n_mods;
  dt_st_spec *sp = calloc((size_t)cap, sizeof *sp);
  char (*nm)[DT_ST_NAME_LEN] = calloc((size_t)cap, sizeof *nm);
  int64_t *ids = malloc(sizeof *ids * (size_t)rows * (size_t)o->seq);
  dt_st_writer *w = NULL;
  if (!sp || !nm || !ids) {
    snprintf(err, errn, "out of memory");
    goto done;
  }
  if (sb_workload_config(&hc, o->model, o->workload, &cfg) != DT_OK ||
      dt_model_create(&hc, NULL, &cfg, DT_F64, 0, &m) != DT_OK || m->n_mods != snap->n_mods) {
    snprintf(err, errn, "%s", m ? "the model and the reference differ" : sb_strip_rank(dt_last_error(&hc)));
    goto done;
  }
  for (int s = 0; s < S; s++)
    for (int which = 0; which < 2; which++) {
      snprintf(nm[n], sizeof nm[n], "%s.step%d", which ? "targets" : "tokens", s);
      sp[n] = (dt_st_spec){nm[n], DT_I64, 2, tok_shape};
      n++;
    }
  snprintf(nm[n], sizeof nm[n], "loss");
  sp[n] = (dt_st_spec){nm[n], DT_F64, 1, loss_shape};
  n++;
  for (int s = 0; s <= S; s++)
    for (int i = 0; i < snap->n_mods; i++) {
      const dt_module *md = &m->mods[i];
      if (!md->wndim) continue;
      if (s < S) snprintf(nm[n], sizeof nm[n], "grad.step%d.%s", s, snap->name[i]);
      else snprintf(nm[n], sizeof nm[n], "param.final.%s", snap->name[i]);
      sp[n] = (dt_st_spec){nm[n], DT_F64, md->wndim, md->wshape};
      n++;
    }
  if (o->max_norm > 0) {
    snprintf(nm[n], sizeof nm[n], "grad_norm");
    sp[n] = (dt_st_spec){nm[n], DT_F64, 1, loss_shape};
    n++;
  }
  const dt_adamw opt = DT_ADAMW_DEFAULT;
  char v[META_N][META_LEN];
  const char *keys[META_N], *vals[META_N];
  int k = 0;
#define META(key, ...) (keys[k] = (key), snprintf(v[k], META_LEN, __VA_ARGS__), vals[k] = v[k], k++)
  META("format", "shardbench-trace");
  META("version", "1");
  META("model", "%s", cfg.name);
  META("dtype", "%s", o->dtype);
  META("batch", "%d", o->batch);
  META("seq", "%d", o->seq);
  META("steps", "%d", S);
  META("dim", "%d", cfg.dim);
  META("n_layers", "%d", cfg.n_layers);
  META("n_heads", "%d", cfg.n_heads);
  META("n_kv_heads", "%d", cfg.n_kv_heads);
  META("vocab", "%d", cfg.vocab);
  META("multiple_of", "%d", cfg.multiple_of);
  META("ffn_hidden", "%d", dt_llama_ffn_hidden(&cfg));
  META("norm_eps", "%.17g", cfg.norm_eps);
  META("rope_theta", "%.17g", cfg.rope_theta);
  META("rope_scaling", "%d", cfg.rope_scaling ? 1 : 0);
  META("depth_init", "%d", cfg.depth_init ? 1 : 0);
  META("ffn_dim_multiplier", "%.17g", cfg.ffn_dim_multiplier);
  META("lr", "%.17g", opt.lr);
  META("beta1", "%.17g", opt.beta1);
  META("beta2", "%.17g", opt.beta2);
  META("eps", "%.17g", opt.eps);
  META("weight_decay", "%.17g", opt.weight_decay);
  if (o->max_norm > 0) META("max_norm", "%.17g", o->max_norm);
  if (o->global_batch > 0) META("global_batch", "%d", o->global_batch);
  if (o->lr.training_steps > 0) {
    static const char *const decay[] = {"linear", "sqrt", "cosine"};
    META("lr_warmup_steps", "%d", o->lr.warmup_steps);
    if (o->lr.has_decay_ratio) META("lr_decay_ratio", "%.17g", o->lr.decay_ratio);
    else META("lr_decay_ratio", "none");
    META("lr_decay_type", "%s", decay[o->lr.decay_type]);
    META("lr_min_factor", "%.17g", o->lr.min_lr_factor);
  }
#undef META
  if (dt_st_write_begin(&hc, path, n, sp, k, keys, vals, &w) != DT_OK) {
    snprintf(err, errn, "%s", sb_strip_rank(dt_last_error(&hc)));
    goto done;
  }
  dt_status st = DT_OK;
  const int64_t nt = (int64_t)rows * o->seq;
  for (int s = 0; s < S && st == DT_OK; s++)
    for (int which = 0; which < 2 && st == DT_OK; which++) {
      sb_token_ids(s, which, nt, cfg.vocab, ids);
      st = dt_st_write_next(&hc, w, ids, DT_I64);
    }
  if (st == DT_OK) st = dt_st_write_next(&hc, w, snap->loss, DT_F64);
  for (int s = 0; s <= S && st == DT_OK; s++)
    for (int i = 0; i < snap->n_mods && st == DT_OK; i++) {
      if (!m->mods[i].wndim) continue;
      const double *d = s < S ? snap->grad[s * snap->n_mods + i] : snap->param[i];
      st = dt_st_write_next(&hc, w, d, DT_F64);
    }
  if (st == DT_OK && o->max_norm > 0) st = dt_st_write_next(&hc, w, snap->grad_norm, DT_F64);
  if (st == DT_OK) st = dt_st_write_end(&hc, w);
  else dt_st_write_abort(&hc, w);
  w = NULL;
  if (st != DT_OK) snprintf(err, errn, "%s", sb_strip_rank(dt_last_error(&hc)));
  else rc = 0;
done:
  dt_st_write_abort(&hc, w);
  dt_model_free(&hc, m);
  free(sp);
  free(nm);
  free(ids);
  dt_ctx_release(&hc);
  return rc;
}
