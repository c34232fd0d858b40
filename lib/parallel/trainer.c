/* lib/parallel/trainer.c: TorchTitan's Trainer (torchtitan/train.py): a parallelized
 * Llama on its mesh and its training step, train_step = forward_backward_step
 * (or the pipeline schedule's step), the data-parallel reductions, the optimizer.
 *
 * The reductions, as TorchTitan composes them: FSDP/HSDP units reduce-scatter in
 * backward (fsdp.c; ZeRO-1 all-reduces after it, dt_fsdp_reduce_grads); without
 * FSDP, DDP all-reduces over dp_cp (TorchTitan's apply_ddp on the dp_replicate x cp
 * mesh) in DDP's buckets of the plan's bucket_cap_mb (it caps the first bucket too,
 * as DDP does when it is given: torch/nn/parallel/distributed.py
 * _BucketCapacityConfig.create). The memory of a step is measured around its two
 * halves so that a program's checks between them (gathers) do not count. Not here:
 * the loss check, timing several steps, storing results (programs).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "trainer.h"

struct dt_trainer {
  dt_parallel_dims dims;
  const dt_parallel_plan *plan;  /* borrowed; NULL: none */
  dt_trainer_opts opts;
  dt_llama_config cfg;
  dt_mesh *mesh;
  dt_comm *perm;
  dt_model *model;
  dt_pipeline *pipe;             /* NULL: no pp */
  bool fsdp;                     /* fully_shard applied */
  dt_tensor tok[2];              /* the step's tokens and targets (no pp) */
  dt_tensor *mb;                 /* pp: [2 m] the microbatches' tokens, then targets */
  int ev_cap;                    /* pp: the longest rank's action list */
  dt_pp_event *ev;               /* pp: [ev_cap] this step's events */
  double pp_loss;                /* pp: the schedule's loss (the last stage's rank) */
  dt_tape *loss_tape;            /* pp: holds the shared loss for checks */
  /* the step's memory bookkeeping between its halves */
  dt_mem_peak_at run_peak, grad_peak;
  size_t grad_reserved;                 /* the forward_backward half's reserved peak */
  size_t fb_base, fb_base_grads;        /* bytes in use when forward_backward began, and
                                         * of them the parameters' gradients */
  dt_mem_peak_at fwd_peak;              /* the peak when the last backward began */
  dt_model_mem grads;
};

/* The counters the step's memory is read from (opts.device_memory). */
static bool mem_dev(const dt_trainer *t) { return t->opts.device_memory; }
static size_t mem_cur(const dt_ctx *ctx, const dt_trainer *t) {
  return mem_dev(t) ? ctx->mem.dev_cur : ctx->mem.host_cur;
}

dt_model *dt_trainer_model(const dt_trainer *t) { return t->model; }
dt_mesh *dt_trainer_mesh(const dt_trainer *t) { return t->mesh; }
const dt_parallel_dims *dt_trainer_dims(const dt_trainer *t) { return &t->dims; }
const dt_parallel_plan *dt_trainer_plan(const dt_trainer *t) { return t->plan; }
const dt_pipeline *dt_trainer_pipeline(const dt_trainer *t) { return t->pipe; }

void dt_trainer_free(dt_ctx *ctx, dt_trainer *t) {
  if (!t) return;
  for (int k = 0; k < 2; k++) dt_tensor_free(ctx, &t->tok[k]);
  free(t->mb);
  free(t->ev);
  dt_tape_free(t->loss_tape);
  if (t->pipe) dt_pipeline_free(ctx, t->pipe);
  free(t->pipe);
  if (t->model) {
    dt_parallelize_release(ctx, t->model);
    dt_model_free(ctx, t->model);
  }
  dt_parallel_dims_free_mesh(t->mesh, t->perm);
  free(t);
}

dt_status dt_trainer_create(dt_ctx *ctx, const dt_llama_config *cfg, const dt_parallel_dims *dims,
                            const dt_parallel_plan *plan, const dt_trainer_opts *opts,
                            dt_trainer **out) {
  *out = NULL;
  if (!plan)
    for (int d = 0; d < DT_PDIM_COUNT; d++)
      if (dims->degree[d] != 1)
        return dt_error(ctx, DT_ERR_INVALID, "dt_trainer_create",
                        "%s=%d without a plan (every degree is 1 then)", dt_pdim_name(d),
                        dims->degree[d]);
  for (int d = 0; plan && d < DT_PDIM_COUNT; d++)
    if (plan->degree[d] != dims->degree[d])
      return dt_error(ctx, DT_ERR_INVALID, "dt_trainer_create",
                      "the plan was resolved for %s=%d; the mesh has %s=%d", dt_pdim_name(d),
                      plan->degree[d], dt_pdim_name(d), dims->degree[d]);
  dt_trainer *t = calloc(1, sizeof *t);
  if (!t) return dt_error(ctx, DT_ERR_NOMEM, "dt_trainer_create", "no memory");
  t->dims = *dims;
  t->plan = plan;
  t->opts = *opts;
  t->cfg = *cfg;
  dt_status s = DT_OK;
  if (plan && plan->pp) { /* microbatches: each data-parallel rank's batch over their size */
    t->pipe = calloc(1, sizeof *t->pipe);
    s = t->pipe ? dt_pipeline_llm(ctx, &plan->plan, cfg->n_layers, dims->degree[DT_PDIM_PP],
                                  plan->n_microbatches, t->pipe)
                : dt_error(ctx, DT_ERR_NOMEM, "dt_trainer_create", "no memory");
  }
  if (s == DT_OK) s = dt_parallel_dims_build_mesh(ctx, dims, &t->mesh, &t->perm);
  if (s == DT_OK) s = dt_model_create(ctx, t->mesh, cfg, opts->dtype, opts->seed, &t->model);
  if (s == DT_OK) t->model->ac = opts->ac;
  if (s == DT_OK) s = dt_parallelize_llama(ctx, t->model, dims, plan, &opts->parallelize);
  t->fsdp = plan && plan->fsdp && (dims->dim[DT_PDIM_DP_SHARD] >= 0 || dims->dim[DT_PDIM_CP] >= 0);
  if (s == DT_OK) s = dt_model_materialize(ctx, t->model);
  if (s == DT_OK && opts->load_weights && opts->load_weights[0])
    s = dt_model_load_weights(ctx, t->model, opts->load_weights);
  if (s == DT_OK && opts->hooks.after_init) s = opts->hooks.after_init(ctx, t, opts->hooks.user);
  if (s == DT_OK && t->pipe) { /* this rank keeps its stages' weights only (pipeline_module_split) */
    s = dt_pipeline_release_foreign(ctx, t->model, dims->dim[DT_PDIM_PP], &t->pipe->layout);
    /* the peak restarts: generating every stage's weights from the one seed is setup
     * (TorchTitan initializes only its stages' modules) */
    dt_mem_peak_restart(ctx, mem_dev(t));
  }
  if (s != DT_OK) {
    dt_trainer_free(ctx, t);
    return s;
  }
  *out = t;
  return DT_OK;
}

/* The placements of a batch tensor: Shard(0) on the mesh dims of mask, Replicate
 * elsewhere. */
static void batch_placements(const dt_mesh *mesh, unsigned mask, dt_placement *pl) {
  for (int i = 0; i < dt_mesh_ndim(mesh); i++) pl[i] = mask & (1u << i) ? dt_shard(0) : dt_replicate();
}

/* A global host i64 [rows, seq] batch placed on the mesh: Shard(0) on dp, Shard(1)
 * on cp in the model's storage order (dt_cp_shard_sequence). ids is not kept. */
static dt_status place_batch(dt_ctx *ctx, dt_trainer *t, int64_t rows, int64_t *ids,
                             dt_tensor *out) {
  const int64_t shape[2] = {rows, t->opts.seq};
  dt_array a;
  dt_placement pl[DT_MAX_MESH_DIMS];
  batch_placements(t->mesh, t->dims.dp, pl);
  DT_CHECK(dt_array_wrap(ctx, DT_DEV_CPU, DT_I64, 2, shape, ids, &a));
  return t->dims.dim[DT_PDIM_CP] >= 0 ? dt_cp_shard_sequence(ctx, t->model, &a, 1, pl, out)
                                      : dt_tensor_distribute(ctx, t->mesh, &a, pl, out);
}

/* Microbatch k of the global batch ids [batch, seq] as a [batch / m, seq] tensor whose
 * shard on the data-parallel dims is that rank's k-th chunk of its local batch (the
 * schedule splits each rank's batch: split_args_kwargs_into_chunks). */
static dt_status microbatch(dt_ctx *ctx, dt_trainer *t, const int64_t *all, int k, dt_tensor *out) {
  /* the rank's block d of the nested Shard(0) over the dp dims, outermost first */
  int ndp = 1, d = 0;
  for (int i = 0; i < dt_mesh_ndim(t->mesh); i++)
    if (t->dims.dp & (1u << i)) {
      ndp *= dt_mesh_size(t->mesh, i);
      d = d * dt_mesh_size(t->mesh, i) + dt_mesh_coord(t->mesh, i);
    }
  const int nm = t->pipe->n_microbatches;
  const int64_t B = t->opts.batch, S = t->opts.seq, local = B / ndp, mb = local / nm;
  const int64_t n = B / nm * S;
  /* only the rank's rows are read (the placing takes its shard); the rest stay
   * zero, valid ids, in pages a large calloc never touches */
  int64_t *ids = calloc((size_t)(n > 0 ? n : 1), sizeof *ids);
  if (!ids) return dt_error(ctx, DT_ERR_NOMEM, "dt_trainer", "no memory");
  memcpy(ids + (size_t)(d * mb * S), all + (size_t)((d * local + k * mb) * S),
         sizeof *ids * (size_t)(mb * S));
  dt_status s = place_batch(ctx, t, B / nm, ids, out);
  free(ids);
  return s;
}

/* The global batch placed (no pp). place_batch wraps a writable array, so the
 * rank's rows (its shard of the dp dims' Shard(0), all the placing reads) go into a
 * zeroed copy; the rest stay zero, valid ids, in pages a large calloc never touches. */
static dt_status whole_batch(dt_ctx *ctx, dt_trainer *t, const int64_t *ids, dt_tensor *out) {
  const size_t n = (size_t)t->opts.batch * (size_t)t->opts.seq;
  int64_t *copy = calloc(n ? n : 1, sizeof *copy);
  if (!copy) return dt_error(ctx, DT_ERR_NOMEM, "dt_trainer", "no memory");
  dt_placement pl[DT_MAX_MESH_DIMS];
  batch_placements(t->mesh, t->dims.dp, pl);
  int mnd = 0, msh[DT_MAX_MESH_DIMS], mco[DT_MAX_MESH_DIMS];
  dt_tensor_mesh_info(t->mesh, &mnd, msh, mco);
  const int64_t g[2] = {t->opts.batch, t->opts.seq};
  int64_t ls[2], off[2];
  dt_local_shape_offset(2, g, mnd, msh, mco, pl, ls, off);
  memcpy(copy + (size_t)(off[0] * t->opts.seq), ids + (size_t)(off[0] * t->opts.seq),
         sizeof *copy * (size_t)(ls[0] * t->opts.seq));
  dt_status s = place_batch(ctx, t, t->opts.batch, copy, out);
  free(copy);
  return s;
}

/* The pipelined forward and backward: every microbatch through the schedule (the
 * microbatches placed with the ledger off, before a barrier); rec's events. */
static dt_status pipe_step(dt_ctx *ctx, dt_trainer *t, const int64_t *tokens,
                           const int64_t *targets, int accum, bool record, dt_trainer_step *rec) {
  dt_pipeline *P = t->pipe;
  const int nm = P->n_microbatches, ppd = t->dims.dim[DT_PDIM_PP];
  dt_status s = DT_OK;
  if (!t->mb && !(t->mb = calloc((size_t)(2 * nm), sizeof *t->mb)))
    return dt_error(ctx, DT_ERR_NOMEM, "dt_trainer", "no memory");
  const bool was = dt_ledger_of(ctx)->enabled;
  dt_ledger_enable(ctx, false);
  for (int k = 0; s == DT_OK && k < nm; k++) {
    s = microbatch(ctx, t, tokens, k, &t->mb[k]);
    if (s == DT_OK) s = microbatch(ctx, t, targets, k, &t->mb[nm + k]);
  }
  if (s == DT_OK && !t->ev) { /* the events' buffer */
    for (int r = 0; r < P->schedule.pp; r++)
      t->ev_cap = P->schedule.len[r] > t->ev_cap ? P->schedule.len[r] : t->ev_cap;
    if (!(t->ev = calloc((size_t)(t->ev_cap ? t->ev_cap : 1), sizeof *t->ev)))
      s = dt_error(ctx, DT_ERR_NOMEM, "dt_trainer", "no memory");
  }
  if (s == DT_OK) s = dt_comm_barrier(ctx->world);
  dt_ledger_enable(ctx, was);
  const double zero = dt_now();
  /* the step's own peak above its start (restored to the larger one after) */
  dt_mem_peak_at run_peak, pk;
  dt_mem_peak_get(ctx, mem_dev(t), &run_peak);
  const size_t base = mem_cur(ctx, t);
  dt_mem_peak_restart(ctx, mem_dev(t));
  int n_ev = 0;
  if (s == DT_OK)
    s = dt_pipeline_step_accum(ctx, t->model, ppd, &P->layout, &P->schedule, accum, t->mb,
                               t->mb + nm, &t->pp_loss, record ? t->ev : NULL,
                               record ? t->ev_cap : 0, &n_ev);
  dt_mem_peak_get(ctx, mem_dev(t), &pk);
  const size_t peak = pk.bytes;
  if (run_peak.bytes > peak) dt_mem_peak_set(ctx, mem_dev(t), &run_peak);
  if (rec) {
    int pipe_id = 0;
    for (int d = 0; d < dt_mesh_ndim(t->mesh); d++)
      if (d != ppd) pipe_id = pipe_id * dt_mesh_size(t->mesh, d) + dt_mesh_coord(t->mesh, d);
    rec->n_events = n_ev;
    rec->events = t->ev;
    rec->pp_rank = dt_mesh_coord(t->mesh, ppd);
    rec->pipe_id = pipe_id;
    rec->zero = zero;
    rec->pp_peak_bytes = (int64_t)(peak - base);
  }
  for (int k = 0; k < 2 * nm; k++) dt_tensor_free(ctx, &t->mb[k]);
  return s;
}

/* The data-parallel reductions after a backward: ZeRO-1's all-reduce, or DDP's over
 * dp_replicate x cp (TorchTitan's dp_cp); under FSDP (HSDP) the units reduce. */
static dt_status reduce_grads(dt_ctx *ctx, dt_trainer *t) {
  dt_model *m = t->model;
  const dt_trainer_hooks *h = &t->opts.hooks;
  dt_status s = DT_OK;
  if (t->fsdp) s = dt_fsdp_reduce_grads(ctx, m); /* ZeRO-1's all-reduce */
  if (s == DT_OK && t->dims.dp_cp && !t->fsdp) {
    if (h->before_ddp) h->before_ddp(ctx, t, h->user);
    const double cap = t->plan ? t->plan->plan.bucket_cap_mb : 0;
    const dt_ddp_opts ddp = {cap * 1048576.0, 0};
    s = dt_data_parallel_reduce_grads(ctx, m, t->dims.dp_cp, cap > 0 ? &ddp : NULL);
  }
  return s;
}

/* DDP under gradient accumulation: each microstep's reduced (Replicate) gradients
 * turned back into Partial sums over dp_cp with no comm (kept on the group's first
 * rank, zero elsewhere: DTensor's Replicate -> Partial), so that the next backward
 * accumulates into them locally and its reduction all-reduces once per microstep,
 * as replicate() does every backward. */
static dt_status ddp_reopen(dt_ctx *ctx, dt_trainer *t) {
  dt_model *m = t->model;
  bool first = true;
  for (int d = 0; d < dt_mesh_ndim(t->mesh); d++)
    if (t->dims.dp_cp & (1u << d)) first = first && dt_mesh_coord(t->mesh, d) == 0;
  for (int i = 0; i < m->n_mods; i++) {
    dt_tensor *g = m->mods[i].weight ? (dt_tensor *)dt_var_grad(m->mods[i].weight) : NULL;
    if (!g) continue; /* the tape's gradient, re-placed in place */
    bool any = false;
    for (int d = 0; d < g->mesh_ndim; d++)
      if ((t->dims.dp_cp & (1u << d)) && g->pl[d].kind == DT_PL_REPLICATE) {
        g->pl[d] = dt_partial(DT_RED_SUM);
        any = true;
      }
    if (!any || first || g->local.numel == 0) continue;
    if (g->local.dev == DT_DEV_CPU) {
      memset(g->local.data, 0, dt_dtype_size(g->dtype) * (size_t)g->local.numel);
    } else {
      dt_kdev kd;
      DT_CHECK(dt_device_kernels(ctx, g->local.dev, "dt_trainer", &kd));
      DT_CHECK(dt_device_fill(kd.dev, g->dtype, g->local.data, g->local.numel, 0.0));
    }
  }
  return DT_OK;
}

/* Microstep a's rows [a batch, (a + 1) batch) of the step's tokens and targets
 * placed into t->tok (the ledger off: input placement is not the step's). */
static dt_status place_microstep(dt_ctx *ctx, dt_trainer *t, const int64_t *tokens,
                                 const int64_t *targets, int a) {
  const bool was = dt_ledger_of(ctx)->enabled;
  dt_ledger_enable(ctx, false);
  for (int k = 0; k < 2; k++) dt_tensor_free(ctx, &t->tok[k]);
  const size_t off = (size_t)a * (size_t)t->opts.batch * (size_t)t->opts.seq;
  dt_status s = whole_batch(ctx, t, tokens + off, &t->tok[0]);
  if (s == DT_OK) s = whole_batch(ctx, t, targets + off, &t->tok[1]);
  dt_ledger_enable(ctx, was);
  return s;
}

/* The accumulated step's loss (the sum of the rescaled microstep losses) as a
 * replicated 0-d leaf on t->loss_tape into *loss. */
static dt_status accumulated_loss(dt_ctx *ctx, dt_trainer *t, double v, dt_var **loss) {
  const bool was = dt_ledger_of(ctx)->enabled;
  dt_ledger_enable(ctx, false);
  dt_tape_free(t->loss_tape);
  t->loss_tape = NULL;
  dt_status s = dt_tape_create(ctx, NULL, &t->loss_tape);
  dt_array a;
  dt_tensor lt;
  const int64_t none[1] = {0};
  dt_placement pl[DT_MAX_MESH_DIMS];
  for (int i = 0; i < DT_MAX_MESH_DIMS; i++) pl[i] = dt_replicate();
  const dt_dtype dt = dt_var_value(*loss)->dtype == DT_F64 ? DT_F64 : DT_F32;
  if (s == DT_OK) s = dt_array_create(ctx, DT_DEV_CPU, dt, 0, none, &a);
  if (s == DT_OK) {
    if (dt == DT_F64) ((double *)a.data)[0] = v;
    else ((float *)a.data)[0] = (float)v;
    s = dt_tensor_distribute(ctx, t->mesh, &a, pl, &lt);
    dt_array_free(ctx, &a);
  }
  dt_var *lv = s == DT_OK ? dt_var_leaf(t->loss_tape, &lt, false) : NULL;
  if (s == DT_OK && !lv) s = dt_error(ctx, DT_ERR_NOMEM, "dt_trainer", "no memory");
  if (s == DT_OK) *loss = lv;
  dt_ledger_enable(ctx, was);
  return s;
}

dt_status dt_trainer_forward_backward(dt_ctx *ctx, dt_trainer *t, int step, const int64_t *tokens,
                                      const int64_t *targets, bool record, dt_var **loss,
                                      dt_trainer_step *rec) {
  dt_trainer_step dummy;
  if (!rec) rec = &dummy;
  memset(rec, 0, sizeof *rec);
  *loss = NULL;
  dt_model *m = t->model;
  const dt_trainer_hooks *h = &t->opts.hooks;
  /* the step's own peak, apart from the run's */
  dt_mem_peak_get(ctx, mem_dev(t), &t->run_peak);
  dt_mem_peak_restart(ctx, mem_dev(t));
  dt_mem_peak_at base;
  dt_mem_peak_get(ctx, mem_dev(t), &base);
  t->fb_base = base.bytes;
  t->fb_base_grads = base.note[DT_MEM_NOTE_GRADS];
  dt_ledger_enable(ctx, false);
  dt_status s = DT_OK;
  const int nacc = t->opts.grad_accum_steps > 1 ? t->opts.grad_accum_steps : 1;
  if (nacc > 1 && h->inputs)
    s = dt_error(ctx, DT_ERR_UNSUPPORTED, "dt_trainer", "gradient accumulation with the "
                 "program's own inputs (hooks.inputs)");
  else if (!t->pipe && h->inputs) s = h->inputs(ctx, t, step, h->user);
  else if (!t->pipe) s = place_microstep(ctx, t, tokens, targets, 0);
  if (s == DT_OK) s = dt_comm_barrier(ctx->world); /* every rank starts the step together */
  dt_ledger_enable(ctx, record);
  dt_ctx_set_phase(ctx, "forward");
  const double t0 = dt_now();
  double acc_loss = 0;
  /* the microbatches through the pipeline, once per accumulation step (TorchTitan's
   * train_step runs pp_schedule.step per step of gradient_accumulation_steps; FSDP in
   * the stages gathers and reduce-scatters per pipeline step, into the sharded
   * gradients); rec keeps the last pipeline step's timeline */
  for (int a = 0; t->pipe && a < nacc && s == DT_OK; a++) {
    const size_t off = (size_t)a * (size_t)t->opts.batch * (size_t)t->opts.seq;
    s = pipe_step(ctx, t, tokens + off, targets + off, nacc, record, rec);
    acc_loss += t->pp_loss;
    if (s == DT_OK && a < nacc - 1) s = reduce_grads(ctx, t);
    if (s == DT_OK && a < nacc - 1 && t->dims.dp_cp && !t->fsdp) s = ddp_reopen(ctx, t);
    if (s == DT_OK && a < nacc - 1) dt_ctx_set_phase(ctx, "forward");
  }
  if (t->pipe) t->pp_loss = acc_loss; /* the step's: the sum of the rescaled losses */
  /* gradient accumulation (train_step's loop over gradient_accumulation_steps): each
   * microstep's loss scaled by 1 / nacc (rescale_accumulated_loss) and its gradients
   * reduced after its backward, as FSDP2 and replicate() do with gradient sync on
   * (TorchTitan's train.py never turns it off); the graph dropped between them */
  for (int a = 0; !t->pipe && a < nacc && s == DT_OK; a++) {
    if (a > 0) {
      dt_ctx_set_phase(ctx, "forward");
      s = dt_model_end_step(ctx, m);
      if (s == DT_OK) s = place_microstep(ctx, t, tokens, targets, a);
      if (s != DT_OK) break;
    }
    dt_var *logits = NULL;
    if (h->forward_loss) s = h->forward_loss(ctx, t, step, h->user, loss);
    else {
      s = dt_model_forward(ctx, m, &t->tok[0], &logits);
      if (s == DT_OK) s = dt_model_loss(ctx, m, logits, &t->tok[1], loss);
      /* TorchTitan's train_step drops the logits before backward (`del pred`) */
      if (s == DT_OK) dt_var_release(m->step_tape, logits);
    }
    if (s == DT_OK && nacc > 1) {
      dt_op_attrs at = DT_OP_ATTRS_INIT;
      at.scalar = 1.0 / nacc;
      dt_var *in1[1] = {*loss};
      s = dt_ad_op(m->step_tape, &dt_op_scale, &at, in1, loss);
    }
    if (s == DT_OK) s = dt_model_backward(ctx, m, *loss);
    if (s == DT_OK && nacc > 1) {
      double v = 0;
      s = dt_trainer_loss_value(ctx, t, *loss, &v);
      acc_loss += v;
    }
    if (s == DT_OK && a < nacc - 1) s = reduce_grads(ctx, t);
    if (s == DT_OK && a < nacc - 1 && t->dims.dp_cp && !t->fsdp) s = ddp_reopen(ctx, t);
  }
  if (s == DT_OK) s = reduce_grads(ctx, t);
  if (s == DT_OK && nacc > 1 && !t->pipe) s = accumulated_loss(ctx, t, acc_loss, loss);
  if (s == DT_OK && h->after_reduce) h->after_reduce(ctx, t, h->user);
  rec->forward_backward_s = dt_now() - t0;
  for (int k = 0; k < 2; k++) dt_tensor_free(ctx, &t->tok[k]);
  if (!t->pipe && h->free_inputs) h->free_inputs(ctx, t, h->user);
  dt_model_state_bytes(m, &t->grads);
  dt_mem_peak_get(ctx, mem_dev(t), &t->grad_peak);
  t->grad_reserved = ctx->mem.dev_reserved_peak;
  t->fwd_peak = t->grad_peak; /* a step with no backward on the model's tape (pipelined) */
  if (m->step_tape) {
    dt_mem_peak_at fp;
    dt_tape_forward_peak_at(m->step_tape, mem_dev(t), &fp);
    if (fp.bytes) t->fwd_peak = fp;
  }
  return s;
}

dt_status dt_trainer_optimizer_step(dt_ctx *ctx, dt_trainer *t, bool record, dt_trainer_step *rec) {
  dt_trainer_step dummy;
  if (!rec) {
    memset(&dummy, 0, sizeof dummy);
    rec = &dummy;
  }
  dt_model *m = t->model;
  dt_mem_peak_restart(ctx, mem_dev(t)); /* not what ran between the halves (checks) */
  dt_ledger_enable(ctx, record);
  dt_ctx_set_phase(ctx, "optimizer");
  const double t0 = dt_now();
  dt_status s = DT_OK;
  rec->grad_norm = NAN;
  if (t->opts.clip.max_norm > 0) /* train_step: clip_grad_norm_ before optimizers.step() */
    s = dt_clip_grad_norm(ctx, m, t->dims.dim[DT_PDIM_PP], &t->opts.clip, &rec->grad_norm);
  /* the schedule's lr of this optimizer step (LambdaLR at m->adam_step steps taken) */
  dt_adamw opt = t->opts.adamw;
  opt.lr *= dt_lr_factor(&t->opts.lr_schedule, m->adam_step);
  rec->lr = opt.lr;
  if (s == DT_OK) s = dt_model_adamw_step(ctx, m, &opt);
  if (s == DT_OK) s = dt_fsdp_after_step(ctx, m); /* ZeRO-1's all-gather of the updated rows */
  if (s == DT_OK) s = dt_model_end_step(ctx, m);
  rec->optimizer_s = dt_now() - t0;
  dt_ctx_set_phase(ctx, "");
  dt_model_mem after;
  dt_model_state_bytes(m, &after);
  dt_mem_peak_at opt_peak;
  dt_mem_peak_get(ctx, mem_dev(t), &opt_peak);
  const dt_mem_peak_at *sp = opt_peak.bytes > t->grad_peak.bytes ? &opt_peak : &t->grad_peak;
  const size_t step_peak = sp->bytes;
  rec->peak_at = *sp;
  dt_mem_peak_set(ctx, mem_dev(t), t->run_peak.bytes > step_peak ? &t->run_peak : sp);
  rec->mem_params = after.params;
  rec->mem_grads = t->grads.grads;
  rec->mem_optimizer = after.optimizer;
  /* activations: the peak the forward reached (when the last backward began) above
   * what the rank held when the step began, less the parameters' gradients made by
   * then (an earlier microstep's): what the forward keeps for backward and its
   * buffers. Backward frees them as it goes, so the step's peak may lie later */
  const dt_mem_peak_at *fp = &t->fwd_peak;
  const size_t made = fp->note[DT_MEM_NOTE_GRADS] > t->fb_base_grads
                          ? fp->note[DT_MEM_NOTE_GRADS] - t->fb_base_grads : 0;
  rec->mem_activations =
      fp->bytes > t->fb_base + made ? (int64_t)(fp->bytes - t->fb_base - made) : 0;
  rec->peak_bytes = step_peak;
  rec->reserved_peak_bytes = ctx->mem.dev_reserved_peak > t->grad_reserved
                                 ? ctx->mem.dev_reserved_peak : t->grad_reserved;
  return s;
}

/* A 0-d value read from its full tensor. */
static dt_status scalar_of(dt_ctx *ctx, const dt_tensor *v, double *out) {
  dt_array a;
  DT_CHECK(dt_tensor_full(ctx, v, &a));
  *out = a.dtype == DT_F64    ? ((const double *)a.data)[0]
         : a.dtype == DT_BF16 ? (double)dt_bf16_to_f32(((const dt_bf16 *)a.data)[0])
                              : ((const float *)a.data)[0];
  dt_array_free(ctx, &a);
  return DT_OK;
}

dt_status dt_trainer_share_stages(dt_ctx *ctx, dt_trainer *t, bool grads, dt_var *step_loss,
                                  dt_var **loss) {
  if (loss) *loss = step_loss;
  if (!t->pipe) return DT_OK;
  const int ppd = t->dims.dim[DT_PDIM_PP];
  if (!grads) return dt_pipeline_share(ctx, t->model, ppd, &t->pipe->layout, false);
  dt_comm *c = dt_mesh_comm(t->mesh, ppd);
  DT_CHECK(dt_comm_broadcast(c, &t->pp_loss, 1, DT_F64,
                             dt_pp_stage_rank(t->pipe->schedule.n_stages - 1, c->size)));
  DT_CHECK(dt_pipeline_share(ctx, t->model, ppd, &t->pipe->layout, true));
  dt_tape_free(t->loss_tape);
  t->loss_tape = NULL;
  DT_CHECK(dt_tape_create(ctx, NULL, &t->loss_tape));
  dt_array a;
  dt_tensor v;
  const int64_t none[1] = {0};
  dt_placement pl[DT_MAX_MESH_DIMS];
  for (int i = 0; i < DT_MAX_MESH_DIMS; i++) pl[i] = dt_replicate();
  DT_CHECK(dt_array_create(ctx, DT_DEV_CPU, DT_F64, 0, none, &a));
  ((double *)a.data)[0] = t->pp_loss;
  dt_status s = dt_tensor_distribute(ctx, t->mesh, &a, pl, &v);
  dt_array_free(ctx, &a);
  dt_var *lv = s == DT_OK ? dt_var_leaf(t->loss_tape, &v, false) : NULL;
  if (s == DT_OK && !lv) s = dt_error(ctx, DT_ERR_NOMEM, "dt_trainer_share_stages", "no memory");
  if (loss) *loss = lv;
  return s;
}

dt_status dt_trainer_unshare_stages(dt_ctx *ctx, dt_trainer *t) {
  if (!t->pipe) return DT_OK;
  /* the shared loss too: a check's copy is no part of the step's memory (the
   * optimizer step's peak would count its 8 bytes; a shape-only run has none) */
  dt_tape_free(t->loss_tape);
  t->loss_tape = NULL;
  return dt_pipeline_release_foreign(ctx, t->model, t->dims.dim[DT_PDIM_PP], &t->pipe->layout);
}

dt_status dt_trainer_loss_value(dt_ctx *ctx, dt_trainer *t, const dt_var *loss, double *out) {
  const bool was = dt_ledger_of(ctx)->enabled;
  dt_ledger_enable(ctx, false);
  dt_status s = DT_OK;
  if (t->pipe) {
    dt_comm *c = dt_mesh_comm(t->mesh, t->dims.dim[DT_PDIM_PP]);
    double v = t->pp_loss;
    s = dt_comm_broadcast(c, &v, 1, DT_F64,
                          dt_pp_stage_rank(t->pipe->schedule.n_stages - 1, c->size));
    *out = v;
  } else if (!loss) {
    s = dt_error(ctx, DT_ERR_INVALID, "dt_trainer_loss_value", "no loss");
  } else {
    s = scalar_of(ctx, dt_var_value(loss), out);
  }
  dt_ledger_enable(ctx, was);
  return s;
}

dt_status dt_trainer_train_step(dt_ctx *ctx, dt_trainer *t, int step, const int64_t *tokens,
                                const int64_t *targets, dt_trainer_step *rec) {
  dt_trainer_step r;
  dt_var *loss = NULL;
  DT_CHECK(dt_trainer_forward_backward(ctx, t, step, tokens, targets, true, &loss, &r));
  DT_CHECK(dt_trainer_loss_value(ctx, t, loss, &r.loss));
  DT_CHECK(dt_trainer_optimizer_step(ctx, t, true, &r));
  if (rec) *rec = r;
  return DT_OK;
}
