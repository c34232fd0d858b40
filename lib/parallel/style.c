/* lib/parallel/style.c: parallelize_module (styles as weight placements plus
 * activation hooks) and data-parallel gradient reduction.
 *
 * dt_parallelize_module gives every module whose fqn matches an entry's
 * pattern (dt_fqn_match: fnmatch token by token, as PyTorch's parallelize_module
 * in torch/distributed/tensor/parallel/api.py; "" is the root) the entry's
 * style (parallel/style.py) on one mesh dim (the tp dim):
 *   ColwiseParallel   Linear weight S(0), Embedding weight S(1)
 *   RowwiseParallel   Linear weight S(1), Embedding weight S(0)
 *   SequenceParallel  weight R (norms: the same ones on every rank)
 *   PrepareModuleInput / PrepareModuleOutput: no weight
 * and installs its hooks (pre on the inputs, post on the outputs), which
 * redistribute activations on the model's tape with dt_ad_redistribute, so the
 * backward of every move is recorded (Redistribute.backward's rule, autograd.h):
 *   Colwise / Rowwise pre: inputs[0] goes to the desired input layout (Colwise
 *     R; Rowwise S(-1) on a Linear, R on an Embedding, as PyTorch's _apply).
 *     Activations here are DTensors already: PyTorch trusts the style's
 *     input_layouts and compares them with the desired ones; we redistribute
 *     from the ACTUAL placement instead, so a plan whose input_layouts lie stays
 *     correct (when they tell the truth both do the same thing).
 *   Colwise / Rowwise post: outputs[0] goes to output_layouts (Partial -> R is
 *     an all_reduce, Partial -> S(d) a reduce_scatter, S(-1) -> R an all_gather).
 *   SequenceParallel pre: inputs[0] goes to S(sequence_dim); post: nothing.
 *   PrepareModuleInput pre / PrepareModuleOutput post: per argument whose
 *     desired layout is given (not None), redistribute when the actual
 *     placement differs. A non-None layout for an argument the module does not
 *     have is DT_ERR_INVALID (PyTorch: ValueError on a count mismatch; TorchTitan's
 *     (x, freqs_cis, masks) layouts end in Nones, which are skipped).
 *   use_local_output has no effect on values: to_local / from_local of a DTensor
 *   with the same placements is the identity here, since activations stay
 *   DTensors from module to module. (It matters in PyTorch for autograd: a
 *   from_local(Replicate) input turns a Partial gradient into an all_reduce at
 *   that boundary; here a Partial gradient stays Partial, summed over every
 *   use, until the first consumer that needs it reduced: see verify/test_parallel.c
 *   for where that puts the Megatron all_reduces.)
 * Only mesh dim `mesh_dim` of an activation's placements is changed.
 *
 * Hook states (the style and the mesh dim) are allocated per module with the
 * rank's counted allocator and freed by dt_parallelize_release or, through
 * the module's hook_free, by dt_model_free. A module matched by several entries keeps the
 * last one (its earlier state is freed). Patterns that match nothing are
 * skipped, as PyTorch does (it warns; the library never prints: plan files are
 * checked by dt_plan_resolve).
 *
 * dt_data_parallel_reduce_grads: see parallel.h.
 */
#include "config.h"

#include <math.h>
#include <string.h>

#include "device/kernels.h"
#include "device/xfer.h"
#include "parallel/parallel.h"

typedef struct style_state {
  dt_style style;
  int mesh_dim;
} style_state;

/* Redistributes io[i] so that its placement on mesh_dim is `want` (negative
 * shard dims resolved against the activation), when it differs. */
static dt_status move_to(dt_ctx *ctx, dt_module *m, struct dt_tape *tape, dt_var **io, int i,
                         int mesh_dim, dt_placement want) {
  const dt_tensor *v = dt_var_value(io[i]);
  if (!v) return dt_error(ctx, DT_ERR_INVALID, "dt_parallelize_module", "%s: no activation", m->fqn);
  if (mesh_dim < 0 || mesh_dim >= v->mesh_ndim)
    return dt_error(ctx, DT_ERR_INVALID, "dt_parallelize_module",
                    "%s: mesh dim %d out of range (the activation's mesh has %d dims)", m->fqn,
                    mesh_dim, v->mesh_ndim);
  char err[128] = ""; /* one line: the placement and the dim range */
  if (dt_placements_normalize(1, &want, v->ndim, err, sizeof err) != DT_OK)
    return dt_error(ctx, DT_ERR_INVALID, "dt_parallelize_module", "%s: input %d: %s", m->fqn, i,
                    err);
  if (dt_placement_eq(v->pl[mesh_dim], want)) return DT_OK;
  dt_placement dst[DT_MAX_MESH_DIMS];
  for (int d = 0; d < v->mesh_ndim; d++) dst[d] = v->pl[d];
  dst[mesh_dim] = want;
  dt_var *out = NULL;
  DT_CHECK(dt_ad_redistribute(tape, io[i], dst, &out));
  io[i] = out;
  return DT_OK;
}

/* The desired input layout of a Colwise / Rowwise style on this module. */
static dt_placement desired_input(const dt_module *m, const dt_style *s) {
  if (s->kind == DT_STYLE_ROWWISE && m->kind == DT_MOD_EMBEDDING) return dt_replicate();
  if (s->n_in > 0 && !s->desired_input_layouts[0].none) return s->desired_input_layouts[0].pl;
  return s->kind == DT_STYLE_ROWWISE ? dt_shard(-1) : dt_replicate();
}

static dt_status style_pre(dt_ctx *ctx, dt_module *m, struct dt_tape *tape, dt_var **io, int n,
                           void *state) {
  const style_state *st = state;
  const dt_style *s = &st->style;
  switch (s->kind) {
  case DT_STYLE_COLWISE:
  case DT_STYLE_ROWWISE:
    if (n < 1) return DT_OK;
    return move_to(ctx, m, tape, io, 0, st->mesh_dim, desired_input(m, s));
  case DT_STYLE_SEQUENCE:
    if (n < 1) return DT_OK;
    return move_to(ctx, m, tape, io, 0, st->mesh_dim, dt_shard(s->sequence_dim));
  case DT_STYLE_PREPARE_INPUT:
    for (int i = 0; i < s->n_in; i++) {
      if (s->desired_input_layouts[i].none) continue;
      if (i >= n)
        return dt_error(ctx, DT_ERR_INVALID, "dt_parallelize_module",
                        "%s: PrepareModuleInput gives a layout for input %d, the module has %d",
                        m->fqn, i, n);
      DT_CHECK(move_to(ctx, m, tape, io, i, st->mesh_dim, s->desired_input_layouts[i].pl));
    }
    return DT_OK;
  case DT_STYLE_PREPARE_OUTPUT:
  case DT_STYLE_FULLY_SHARD: /* refused by dt_parallelize_module */
    return DT_OK;
  }
  return DT_OK;
}

static dt_status style_post(dt_ctx *ctx, dt_module *m, struct dt_tape *tape, dt_var **io, int n,
                            void *state) {
  const style_state *st = state;
  const dt_style *s = &st->style;
  switch (s->kind) {
  case DT_STYLE_COLWISE:
  case DT_STYLE_ROWWISE: {
    if (n < 1) return DT_OK;
    dt_placement want = s->kind == DT_STYLE_COLWISE ? dt_shard(-1) : dt_replicate();
    if (s->n_out > 0 && !s->output_layouts[0].none) want = s->output_layouts[0].pl;
    return move_to(ctx, m, tape, io, 0, st->mesh_dim, want);
  }
  case DT_STYLE_PREPARE_OUTPUT:
    for (int i = 0; i < s->n_out; i++) {
      if (s->desired_output_layouts[i].none) continue;
      if (i >= n)
        return dt_error(ctx, DT_ERR_INVALID, "dt_parallelize_module",
                        "%s: PrepareModuleOutput gives a layout for output %d, the module has %d",
                        m->fqn, i, n);
      DT_CHECK(move_to(ctx, m, tape, io, i, st->mesh_dim, s->desired_output_layouts[i].pl));
    }
    return DT_OK;
  case DT_STYLE_SEQUENCE: /* the output stays S(sequence_dim) */
  case DT_STYLE_PREPARE_INPUT:
  case DT_STYLE_FULLY_SHARD:
    return DT_OK;
  }
  return DT_OK;
}

static bool ours(const dt_module *md) { return md->pre == style_pre || md->post == style_post; }

static const char *kind_name(dt_style_kind k) {
  switch (k) {
  case DT_STYLE_COLWISE: return "ColwiseParallel";
  case DT_STYLE_ROWWISE: return "RowwiseParallel";
  case DT_STYLE_SEQUENCE: return "SequenceParallel";
  case DT_STYLE_PREPARE_INPUT: return "PrepareModuleInput";
  case DT_STYLE_PREPARE_OUTPUT: return "PrepareModuleOutput";
  case DT_STYLE_FULLY_SHARD: return "fully_shard";
  }
  return "?";
}

/* The weight placement a style gives a module on the mesh dim; false (with
 * an error) for a module the style does not support. */
static dt_status weight_placement(dt_ctx *ctx, const dt_module *md, const dt_style *s,
                                  bool *has, dt_placement *pl) {
  *has = false;
  switch (s->kind) {
  case DT_STYLE_COLWISE:
  case DT_STYLE_ROWWISE: {
    bool col = s->kind == DT_STYLE_COLWISE;
    if (md->kind == DT_MOD_LINEAR) {
      *pl = dt_shard(col ? 0 : 1);
    } else if (md->kind == DT_MOD_EMBEDDING) {
      *pl = dt_shard(col ? 1 : 0);
    } else {
      return dt_error(ctx, DT_ERR_UNSUPPORTED, "dt_parallelize_module",
                      "%s: %s supports Linear and Embedding modules only", md->fqn,
                      kind_name(s->kind));
    }
    *has = true;
    return DT_OK;
  }
  case DT_STYLE_SEQUENCE:
    if (md->wndim > 0) {
      *pl = dt_replicate();
      *has = true;
    }
    return DT_OK;
  case DT_STYLE_PREPARE_INPUT:
  case DT_STYLE_PREPARE_OUTPUT:
  case DT_STYLE_FULLY_SHARD:
    return DT_OK;
  }
  return dt_error(ctx, DT_ERR_INVALID, "dt_parallelize_module", "unknown style kind %d",
                  (int)s->kind);
}

static void free_state(dt_ctx *ctx, void *st) { dt_host_free(ctx, st); }

static void release_module(dt_ctx *ctx, dt_module *md) {
  if (!ours(md)) return;
  dt_host_free(ctx, md->hook_state);
  md->hook_state = NULL;
  md->hook_free = NULL;
  md->pre = NULL;
  md->post = NULL;
}

dt_status dt_parallelize_module(dt_ctx *ctx, dt_model *m, int mesh_dim,
                                const dt_plan_entry *entries, int n_entries) {
  if (!m || (!entries && n_entries > 0) || n_entries < 0)
    return dt_error(ctx, DT_ERR_INVALID, "dt_parallelize_module", "NULL argument");
  int mesh_nd = dt_mesh_ndim(m->mesh);
  if (mesh_dim < 0 || mesh_dim >= mesh_nd)
    return dt_error(ctx, DT_ERR_INVALID, "dt_parallelize_module",
                    "mesh dim %d out of range (the model's mesh has %d dims)", mesh_dim, mesh_nd);
  for (int i = 0; i < m->n_mods; i++)
    if (m->mods[i].weight)
      return dt_error(ctx, DT_ERR_INVALID, "dt_parallelize_module",
                      "the model is materialized already; parallelize before dt_model_materialize");
  for (int e = 0; e < n_entries; e++) {
    const dt_style *s = &entries[e].style;
    if (s->kind == DT_STYLE_FULLY_SHARD)
      return dt_error(ctx, DT_ERR_INVALID, "dt_parallelize_module",
                      "entry '%s': fully_shard is applied by dt_fully_shard, not here",
                      entries[e].pattern);
    if (s->n_in < 0 || s->n_in > DT_STYLE_MAX_ARGS || s->n_out < 0 || s->n_out > DT_STYLE_MAX_ARGS)
      return dt_error(ctx, DT_ERR_INVALID, "dt_parallelize_module",
                      "entry '%s': %d inputs, %d outputs (at most %d)", entries[e].pattern,
                      s->n_in, s->n_out, (int)DT_STYLE_MAX_ARGS);
    for (int i = 0; i < m->n_mods; i++) {
      dt_module *md = &m->mods[i];
      if (!dt_fqn_match(entries[e].pattern, md->fqn)) continue;
      bool has = false;
      dt_placement pl = dt_replicate();
      DT_CHECK(weight_placement(ctx, md, s, &has, &pl));
      style_state *st = dt_host_alloc(ctx, sizeof *st);
      if (!st)
        return dt_error(ctx, DT_ERR_NOMEM, "dt_parallelize_module", "no memory for a hook state");
      st->style = *s;
      st->mesh_dim = mesh_dim;
      if (md->hook_state && !ours(md)) {
        dt_host_free(ctx, st);
        return dt_error(ctx, DT_ERR_INVALID, "dt_parallelize_module",
                        "%s: has hooks that lib/parallel did not install", md->fqn);
      }
      release_module(ctx, md);
      if (has) md->wpl[mesh_dim] = pl;
      md->hook_state = st;
      md->hook_free = free_state;
      md->pre = style_pre;
      md->post = style_post;
    }
  }
  return DT_OK;
}

void dt_parallelize_release(dt_ctx *ctx, dt_model *m) {
  if (!m) return;
  for (int i = 0; i < m->n_mods; i++) release_module(ctx, &m->mods[i]);
}

/* ---- data parallel: DDP's gradient buckets ----------------------------------------- */

/* The data-parallel group: its communicator (one mesh dim's, or the flattened
 * group of several) and the mesh dims it spans. */
typedef struct ddp_group {
  dt_comm *comm;
  int n_dims, dims[DT_MAX_MESH_DIMS];
} ddp_group;

/* One bucket: grads[0..n) of the reverse-module-order list (ops[0..n) their
 * Partial ops), all of one dtype and op, all-reduced together. */
typedef struct ddp_bucket {
  dt_tensor *const *grads;
  const dt_reduce_op *ops;
  int n;
  size_t bytes;
} ddp_bucket;

/* All-reduces one bucket over the group (flat buffer: copy in, reduce, copy out;
 * one gradient: in place) and relabels its gradients Replicate on the group's
 * dims. A group of one rank moves nothing (as dt_redistribute: a relabel, no
 * collective). */
static dt_status ddp_reduce_bucket(dt_ctx *ctx, const ddp_group *grp, const ddp_bucket *b) {
  const dt_tensor *g0 = b->grads[0];
  const dt_reduce_op op = b->ops[0];
  dt_status s = DT_OK;
  if (grp->comm->size > 1) {
    dt_comm *c = grp->comm;
    if (b->n == 1) {
      void *p = g0->local.data;
      s = dt_comm_all_reduce(c, p, p, (size_t)g0->local.numel, g0->dtype, op);
    } else {
      /* the bucket lives where the gradients do: copies in and out there */
      static const char who[] = "dt_data_parallel_reduce_grads";
      size_t count = 0;
      for (int i = 0; i < b->n; i++) count += (size_t)b->grads[i]->local.numel;
      dt_kdev kd;
      dt_array fb = {0};
      const int64_t fl = (int64_t)(count ? count : 1);
      DT_CHECK(dt_device_kernels(ctx, g0->local.dev, who, &kd));
      if (dt_array_create(ctx, g0->local.dev, g0->dtype, 1, &fl, &fb) != DT_OK)
        return dt_error(ctx, DT_ERR_NOMEM, who, "no memory for a %zu-byte gradient bucket",
                        b->bytes);
      char *buf = fb.data;
      size_t off = 0;
      for (int i = 0; s == DT_OK && i < b->n; i++) {
        size_t nb = dt_array_bytes(&b->grads[i]->local);
        s = dt_device_move(kd.dev, buf + off, b->grads[i]->local.data, nb);
        off += nb;
      }
      if (s == DT_OK) s = dt_comm_all_reduce(c, buf, buf, count, g0->dtype, op);
      off = 0;
      for (int i = 0; s == DT_OK && i < b->n; i++) {
        size_t nb = dt_array_bytes(&b->grads[i]->local);
        s = dt_device_move(kd.dev, b->grads[i]->local.data, buf + off, nb);
        off += nb;
      }
      dt_array_free(ctx, &fb);
    }
  }
  for (int i = 0; s == DT_OK && i < b->n; i++)
    for (int k = 0; k < grp->n_dims; k++) b->grads[i]->pl[grp->dims[k]] = dt_replicate();
  return s;
}

/* Cuts the list g[0..n) into buckets by DDP's rule (parallel.h) and reduces each as
 * soon as it closes, in list order. */
static dt_status ddp_reduce_all(dt_ctx *ctx, const ddp_group *grp, dt_tensor *const *g,
                                const dt_reduce_op *ops, int n, double first_cap, double cap) {
  double limit = cap > 0 ? first_cap : 0; /* 0: every gradient closes its own bucket */
  ddp_bucket b = {g, ops, 0, 0};
  for (int i = 0; i < n; i++) {
    if (b.n > 0 && (g[i]->dtype != b.grads[0]->dtype || ops[i] != b.ops[0])) {
      DT_CHECK(ddp_reduce_bucket(ctx, grp, &b));
      b = (ddp_bucket){g + i, ops + i, 0, 0};
      limit = cap > 0 ? cap : 0;
    }
    b.n++;
    b.bytes += dt_array_bytes(&g[i]->local);
    if ((double)b.bytes >= limit) { /* reducer.cpp: bucket.size >= bucket_size_limit */
      DT_CHECK(ddp_reduce_bucket(ctx, grp, &b));
      b = (ddp_bucket){g + i + 1, ops + i + 1, 0, 0};
      limit = cap > 0 ? cap : 0;
    }
  }
  return b.n > 0 ? ddp_reduce_bucket(ctx, grp, &b) : DT_OK;
}

/* A gradient's part in the reduce over the group's dims: *take when it is Partial
 * on one of them (with that op in *op), *zero when it is also Replicate on one
 * where this rank's coordinate is not 0 (it is counted once, from coordinate 0).
 * DT_ERR_UNSUPPORTED when it mixes Partial ops or is Shard on one of them. */
static dt_status ddp_part(dt_ctx *ctx, const dt_mesh *mesh, const ddp_group *grp,
                          const dt_module *md, const dt_tensor *gr, bool *take, bool *zero,
                          dt_reduce_op *op) {
  *take = *zero = false;
  bool shard = false;
  for (int k = 0; k < grp->n_dims; k++) {
    const dt_placement p = gr->pl[grp->dims[k]];
    if (p.kind == DT_PL_PARTIAL) {
      if (*take && p.op != *op)
        return dt_error(ctx, DT_ERR_UNSUPPORTED, "dt_data_parallel_reduce_grads",
                        "%s: gradient Partial with different ops on the data-parallel dims",
                        md->fqn);
      *take = true;
      *op = p.op;
    } else if (p.kind == DT_PL_SHARD) {
      shard = true;
    } else if (dt_mesh_coord(mesh, grp->dims[k]) != 0) {
      *zero = true;
    }
  }
  if (*take && shard)
    return dt_error(ctx, DT_ERR_UNSUPPORTED, "dt_data_parallel_reduce_grads",
                    "%s: gradient Partial on one data-parallel dim and Shard on another", md->fqn);
  return DT_OK;
}

dt_status dt_data_parallel_reduce_grads(dt_ctx *ctx, dt_model *m, unsigned dp_dims,
                                        const dt_ddp_opts *opts) {
  const char *call = "dt_data_parallel_reduce_grads";
  if (!ctx || !m) return dt_error(ctx, DT_ERR_INVALID, call, "NULL context or model");
  int nd = dt_mesh_ndim(m->mesh);
  if (dp_dims == 0 || nd <= 0 || dp_dims >> nd)
    return dt_error(ctx, DT_ERR_INVALID, call,
                    "data-parallel dims mask 0x%x: no dim, or a dim past the model's mesh (%d "
                    "dims)", dp_dims, nd);
  double cap = DT_DDP_BUCKET_CAP_BYTES, first_cap = DT_DDP_FIRST_BUCKET_BYTES;
  if (opts) {
    if (isnan(opts->bucket_cap_bytes) || isnan(opts->first_bucket_bytes))
      return dt_error(ctx, DT_ERR_INVALID, call, "bucket cap is NaN");
    cap = opts->bucket_cap_bytes;
    first_cap = opts->first_bucket_bytes > 0 ? opts->first_bucket_bytes : cap;
  }
  ddp_group grp;
  memset(&grp, 0, sizeof grp);
  const char *names[DT_MAX_MESH_DIMS];
  for (int d = 0; d < nd; d++)
    if (dp_dims >> d & 1u) {
      names[grp.n_dims] = dt_mesh_name(m->mesh, d);
      grp.dims[grp.n_dims++] = d;
    }
  /* The gradients to reduce, in reverse module order; checked before any comm. */
  dt_tensor **g = dt_host_alloc(ctx, (size_t)(m->n_mods > 0 ? m->n_mods : 1) * sizeof *g);
  dt_reduce_op *ops = dt_host_alloc(ctx, (size_t)(m->n_mods > 0 ? m->n_mods : 1) * sizeof *ops);
  bool *zero = dt_host_alloc(ctx, (size_t)(m->n_mods > 0 ? m->n_mods : 1) * sizeof *zero);
  dt_status s = g && ops && zero ? DT_OK
                                 : dt_error(ctx, DT_ERR_NOMEM, call, "no memory for %d gradients",
                                            m->n_mods);
  int n = 0;
  for (int i = m->n_mods - 1; i >= 0 && s == DT_OK; i--) {
    dt_module *md = &m->mods[i];
    if (md->wndim == 0) continue;
    if (!md->weight) {
      s = dt_error(ctx, DT_ERR_INVALID, call, "%s: not materialized", md->fqn);
      break;
    }
    /* Between backward and the optimizer the reduce owns the gradients and
     * writes them in place (the tape's accessor is const), as DDP's Reducer
     * writes param.grad. */
    dt_tensor *gr = (dt_tensor *)dt_var_grad(md->weight);
    if (!gr) continue;
    bool take = false;
    s = ddp_part(ctx, m->mesh, &grp, md, gr, &take, &zero[n], &ops[n]);
    if (s != DT_OK || !take) continue;
    if (n && gr->local.dev != g[0]->local.dev)
      s = dt_error(ctx, DT_ERR_UNSUPPORTED, call, "%s: gradients on different devices", md->fqn);
    g[n++] = gr;
  }
  /* One dim: its communicator; several: one over the flattened group, named by
   * joining the dim names with "_" (PyTorch's DeviceMesh._flatten default;
   * TorchTitan's dp_cp in torchtitan/distributed/parallel_dims.py, on which
   * apply_ddp in torchtitan/models/llama3/infra/parallelize.py all-reduces).
   * Collective over the root mesh the first time, cached after. */
  if (s == DT_OK && grp.n_dims == 1) {
    grp.comm = dt_mesh_comm(m->mesh, grp.dims[0]);
  } else if (s == DT_OK) {
    dt_mesh *sub = NULL, *flat = NULL;
    s = dt_mesh_slice(m->mesh, grp.n_dims, names, &sub);
    if (s == DT_OK) s = dt_mesh_flatten(sub, NULL, &flat);
    if (s == DT_OK) grp.comm = dt_mesh_comm(flat, 0);
  }
  if (s == DT_OK) {
    /* a gradient Replicate on some of the dims counts once: zeros elsewhere */
    for (int i = 0; s == DT_OK && i < n; i++) {
      if (!zero[i] || !g[i]->local.numel) continue;
      dt_kdev kd;
      s = dt_device_kernels(ctx, g[i]->local.dev, call, &kd);
      if (s == DT_OK) s = dt_device_zero(kd.dev, g[i]->local.data, dt_array_bytes(&g[i]->local));
    }
    char saved[sizeof ctx->phase];
    memcpy(saved, ctx->phase, sizeof saved);
    dt_ctx_set_phase(ctx, "backward");
    if (s == DT_OK) s = ddp_reduce_all(ctx, &grp, g, ops, n, first_cap, cap);
    dt_ctx_set_phase(ctx, saved);
  }
  dt_host_free(ctx, g);
  dt_host_free(ctx, ops);
  dt_host_free(ctx, zero);
  return s;
}
