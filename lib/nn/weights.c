/* lib/nn/weights.c: the model's weights to and from safetensors files.
 *
 * Names: TorchTitan's fqns + ".weight" (the model's state_dict keys), or
 * Hugging Face Llama's, mapped as TorchTitan's Llama3StateDictAdapter maps them
 * (torchtitan/models/llama3/model/state_dict_adapter.py: from_hf_map, to_hf,
 * from_hf). HF's LlamaAttention applies rope with rotate_half (pairs (i,
 * i + hd/2)), TorchTitan with interleaved pairs (2i, 2i + 1); to_hf therefore
 * permutes the rows of wq and wk per head: TorchTitan row 2j + t of a head is
 * HF row t * hd/2 + j (_permute: view(heads, hd/2, 2, in).transpose(1, 2)).
 *
 * Loading: every rank opens the file, checks it against the model, and for each
 * weight reads only the rows of dim 0 its shard covers (in HF files, those
 * rows' permuted positions), then copies its columns' box into the local shard.
 * Saving: each weight is gathered (full_tensor) on every rank, the rank at mesh
 * coordinates 0 streams it to the writer.
 */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "device/xfer.h"
#include "nn/nn.h"

static const char *const TT_SUFFIX = ".weight";

/* HF's name of a TorchTitan fqn (without ".weight"), or NULL when it has none. */
static void hf_name(const char *fqn, char *buf, size_t n) {
  static const struct { const char *tt, *hf; } LEAF[] = {
      {"attention.wq", "self_attn.q_proj"},   {"attention.wk", "self_attn.k_proj"},
      {"attention.wv", "self_attn.v_proj"},   {"attention.wo", "self_attn.o_proj"},
      {"feed_forward.w1", "mlp.gate_proj"},   {"feed_forward.w3", "mlp.up_proj"},
      {"feed_forward.w2", "mlp.down_proj"},   {"attention_norm", "input_layernorm"},
      {"ffn_norm", "post_attention_layernorm"},
  };
  int layer, used = 0;
  if (sscanf(fqn, "layers.%d.%n", &layer, &used) == 1 && used > 0) {
    for (size_t i = 0; i < sizeof LEAF / sizeof LEAF[0]; i++)
      if (!strcmp(fqn + used, LEAF[i].tt)) {
        snprintf(buf, n, "model.layers.%d.%s.weight", layer, LEAF[i].hf);
        return;
      }
  }
  if (!strcmp(fqn, "tok_embeddings")) snprintf(buf, n, "model.embed_tokens.weight");
  else if (!strcmp(fqn, "norm")) snprintf(buf, n, "model.norm.weight");
  else if (!strcmp(fqn, "output")) snprintf(buf, n, "lm_head.weight");
  else snprintf(buf, n, "%s%s", fqn, TT_SUFFIX); /* not a Llama weight: kept */
}

void dt_weight_name(const dt_module *md, dt_weight_names names, char *buf, size_t n) {
  if (names == DT_NAMES_HF) hf_name(md->fqn, buf, n);
  else snprintf(buf, n, "%s%s", md->fqn, TT_SUFFIX);
}

/* Heads whose rows HF permutes: wq's n_heads, wk's n_kv_heads; 0 for the others. */
static int hf_permuted_heads(const dt_model *m, const dt_module *md) {
  size_t l = strlen(md->fqn);
  if (l > 13 && !strcmp(md->fqn + l - 13, ".attention.wq")) return m->cfg.n_heads;
  if (l > 13 && !strcmp(md->fqn + l - 13, ".attention.wk")) return m->cfg.n_kv_heads;
  return 0;
}

/* The HF row that holds TorchTitan row r of a weight of `rows` rows over `heads` heads. */
static int64_t hf_row(int64_t r, int64_t rows, int heads) {
  const int64_t hd = rows / heads, h = r / hd, i = r % hd;
  return h * hd + (i % 2) * (hd / 2) + i / 2;
}

dt_status dt_model_weights_check(dt_ctx *ctx, const dt_model *m, const dt_st_file *f,
                                 dt_weight_names *names) {
  static const char WHO[] = "dt_model_weights_check";
  if (!m || !f || !names) return dt_error(ctx, DT_ERR_INVALID, WHO, "NULL argument");
  *names = dt_st_find(f, "model.embed_tokens.weight") ? DT_NAMES_HF : DT_NAMES_TORCHTITAN;
  int found = 0;
  char name[DT_ST_NAME_LEN];
  for (int i = 0; i < m->n_mods; i++) {
    const dt_module *md = &m->mods[i];
    if (!md->wndim) continue;
    dt_weight_name(md, *names, name, sizeof name);
    const dt_st_tensor *t = dt_st_find(f, name);
    if (!t)
      return dt_error(ctx, DT_ERR_INVALID, WHO, "%s: no tensor '%s' (%s names; model %s)",
                      f->path, name, *names == DT_NAMES_HF ? "Hugging Face" : "TorchTitan",
                      m->cfg.name);
    bool same = t->ndim == md->wndim;
    for (int d = 0; same && d < md->wndim; d++) same = t->shape[d] == md->wshape[d];
    if (!same) {
      char want[48], got[96];
      snprintf(want, sizeof want, md->wndim == 1 ? "[%lld]" : "[%lld, %lld]",
               (long long)md->wshape[0], (long long)md->wshape[1]);
      int k = snprintf(got, sizeof got, "[");
      for (int d = 0; d < t->ndim && k < (int)sizeof got; d++)
        k += snprintf(got + k, sizeof got - (size_t)k, "%s%lld", d ? ", " : "",
                      (long long)t->shape[d]);
      if (k < (int)sizeof got) snprintf(got + k, sizeof got - (size_t)k, "]");
      return dt_error(ctx, DT_ERR_INVALID, WHO, "%s: '%s' has shape %s; model %s needs %s",
                      f->path, name, got, m->cfg.name, want);
    }
    if (strcmp(t->dtype, "F64") && strcmp(t->dtype, "F32") && strcmp(t->dtype, "BF16") &&
        strcmp(t->dtype, "F16"))
      return dt_error(ctx, DT_ERR_INVALID, WHO, "%s: '%s' is %s; weights must be F64, F32, BF16 "
                      "or F16", f->path, name, t->dtype);
    found++;
  }
  if (found != f->n) {
    for (int j = 0; j < f->n; j++) {
      bool known = false;
      for (int i = 0; i < m->n_mods && !known; i++) {
        if (!m->mods[i].wndim) continue;
        dt_weight_name(&m->mods[i], *names, name, sizeof name);
        known = !strcmp(name, f->t[j].name);
      }
      if (!known)
        return dt_error(ctx, DT_ERR_INVALID, WHO, "%s: tensor '%s' is not a weight of model %s",
                        f->path, f->t[j].name, m->cfg.name);
    }
  }
  return DT_OK;
}

/* One weight's local shard from t. */
static dt_status load_one(dt_ctx *ctx, dt_model *m, dt_module *md, const dt_st_file *f,
                          const dt_st_tensor *t, dt_weight_names names) {
  dt_tensor *w = (dt_tensor *)dt_var_value(md->weight); /* the model owns its weights */
  for (int d = 0; d < w->mesh_ndim; d++)
    if (w->pl[d].kind == DT_PL_PARTIAL)
      return dt_error(ctx, DT_ERR_UNSUPPORTED, "dt_model_load_weights", "%s: a Partial weight",
                      md->fqn);
  const int64_t lrows = w->local.ndim ? w->local.shape[0] : 1;
  const int64_t grows = w->ndim ? w->gshape[0] : 1, r0 = w->ndim ? w->goffset[0] : 0;
  const int64_t grow = w->ndim > 1 ? w->gshape[1] : 1;
  const int heads = names == DT_NAMES_HF ? hf_permuted_heads(m, md) : 0;
  int64_t *rows = dt_host_alloc(ctx, (size_t)(lrows ? lrows : 1) * sizeof *rows);
  void *buf = dt_host_alloc(ctx, (size_t)(lrows ? lrows : 1) * (size_t)grow *
                                     dt_dtype_size(w->dtype));
  dt_status s = rows && buf ? DT_OK : dt_error(ctx, DT_ERR_NOMEM, "dt_model_load_weights",
                                              "no memory");
  for (int64_t i = 0; s == DT_OK && i < lrows; i++)
    rows[i] = heads ? hf_row(r0 + i, grows, heads) : r0 + i;
  if (s == DT_OK) s = dt_st_read_rows(ctx, f, t, rows, lrows, w->dtype, buf);
  /* the shard is assembled on the host (in place for a host weight), then
   * uploaded to a device weight */
  dt_array host = {0};
  if (s == DT_OK && (s = dt_array_stage(ctx, &w->local, &host)) == DT_OK) {
    const int64_t bshape[2] = {lrows, grow}, boff[2] = {0, w->ndim > 1 ? w->goffset[1] : 0};
    const int64_t zero[2] = {0, 0};
    dt_copy_box(dt_dtype_size(w->dtype), w->ndim, host.data, w->local.shape, zero, buf, bshape,
                boff, w->local.shape);
    s = dt_array_stage_end(ctx, &w->local, &host);
  }
  dt_host_free(ctx, rows);
  dt_host_free(ctx, buf);
  return s;
}

dt_status dt_model_load_weights(dt_ctx *ctx, dt_model *m, const char *path) {
  static const char WHO[] = "dt_model_load_weights";
  if (!ctx || !m || !path) return dt_error(ctx, DT_ERR_INVALID, WHO, "NULL argument");
  if (!m->tape) return dt_error(ctx, DT_ERR_INVALID, WHO, "call dt_model_materialize first");
  dt_st_file f;
  DT_CHECK(dt_st_open(ctx, path, &f));
  dt_weight_names names;
  dt_status s = dt_model_weights_check(ctx, m, &f, &names);
  char name[DT_ST_NAME_LEN];
  for (int i = 0; s == DT_OK && i < m->n_mods; i++) {
    dt_module *md = &m->mods[i];
    if (!md->wndim) continue;
    dt_weight_name(md, names, name, sizeof name);
    s = load_one(ctx, m, md, &f, dt_st_find(&f, name), names);
  }
  dt_st_close(ctx, &f);
  if (s != DT_OK) return s;
  for (int i = 0; i < m->n_mods; i++) { /* fresh optimizer state for the new weights */
    if (m->adam_m[i].mesh) dt_tensor_free(ctx, &m->adam_m[i]);
    if (m->adam_v[i].mesh) dt_tensor_free(ctx, &m->adam_v[i]);
    if (m->adam_master[i].mesh) dt_tensor_free(ctx, &m->adam_master[i]);
    memset(&m->adam_m[i], 0, sizeof m->adam_m[i]);
    memset(&m->adam_v[i], 0, sizeof m->adam_v[i]);
    memset(&m->adam_master[i], 0, sizeof m->adam_master[i]);
  }
  m->adam_step = 0;
  return DT_OK;
}

static bool writes(const dt_mesh *mesh) {
  for (int d = 0; d < dt_mesh_ndim(mesh); d++)
    if (dt_mesh_coord(mesh, d) != 0) return false;
  return true;
}

dt_status dt_model_save_weights(dt_ctx *ctx, dt_model *m, const char *path, dt_dtype dtype,
                                dt_weight_names names, int n_meta, const char *const *keys,
                                const char *const *vals) {
  static const char WHO[] = "dt_model_save_weights";
  if (!ctx || !m || !path) return dt_error(ctx, DT_ERR_INVALID, WHO, "NULL argument");
  if (!m->tape) return dt_error(ctx, DT_ERR_INVALID, WHO, "call dt_model_materialize first");
  if (dtype != DT_F32 && dtype != DT_F64 && dtype != DT_BF16)
    return dt_error(ctx, DT_ERR_INVALID, WHO, "file dtype must be f32, f64 or bf16");
  const bool writer = writes(m->mesh);
  int n = 0;
  for (int i = 0; i < m->n_mods; i++) n += m->mods[i].wndim > 0;
  dt_st_spec *specs = dt_host_calloc(ctx, (size_t)(n ? n : 1) * sizeof *specs);
  char (*nm)[DT_ST_NAME_LEN] = dt_host_calloc(ctx, (size_t)(n ? n : 1) * sizeof *nm);
  if (!specs || !nm) {
    dt_host_free(ctx, specs);
    dt_host_free(ctx, nm);
    return dt_error(ctx, DT_ERR_NOMEM, WHO, "no memory");
  }
  for (int i = 0, k = 0; i < m->n_mods; i++) {
    const dt_module *md = &m->mods[i];
    if (!md->wndim) continue;
    dt_weight_name(md, names, nm[k], sizeof nm[k]);
    specs[k] = (dt_st_spec){nm[k], dtype, md->wndim, md->wshape};
    k++;
  }
  dt_st_writer *w = NULL;
  dt_status s = writer ? dt_st_write_begin(ctx, path, n, specs, n_meta, keys, vals, &w) : DT_OK;
  /* every rank takes part in every gather, whatever the writer's state, so that a
   * failed write cannot leave the others waiting in a collective */
  for (int i = 0; i < m->n_mods; i++) {
    dt_module *md = &m->mods[i];
    if (!md->wndim) continue;
    dt_array full;
    dt_status g = dt_tensor_full(ctx, dt_var_value(md->weight), &full);
    if (g != DT_OK) {
      if (s == DT_OK) s = g;
      break; /* a failed collective: the job is failing anyway */
    }
    const int heads = names == DT_NAMES_HF ? hf_permuted_heads(m, md) : 0;
    if (s == DT_OK && writer && heads) { /* HF row order, in place through a copy */
      dt_array src;
      s = dt_array_create(ctx, DT_DEV_CPU, full.dtype, full.ndim, full.shape, &src);
      if (s == DT_OK) {
        const size_t row = (size_t)full.shape[1] * dt_dtype_size(full.dtype);
        memcpy(src.data, full.data, dt_array_bytes(&full));
        for (int64_t r = 0; r < full.shape[0]; r++)
          memcpy((char *)full.data + (size_t)hf_row(r, full.shape[0], heads) * row,
                 (char *)src.data + (size_t)r * row, row);
        dt_array_free(ctx, &src);
      }
    }
    if (s == DT_OK && writer) s = dt_st_write_next(ctx, w, full.data, full.dtype);
    dt_array_free(ctx, &full);
  }
  if (writer && w) {
    if (s == DT_OK) s = dt_st_write_end(ctx, w);
    else dt_st_write_abort(ctx, w);
  }
  dt_host_free(ctx, specs);
  dt_host_free(ctx, nm);
  return s;
}
