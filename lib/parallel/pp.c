/* lib/parallel/pp.c: the pipeline runtime: one training step's forward and backward
 * of a model split into stages (dt_pp_layout) over the pp mesh dim, driven by a
 * lowered schedule (dt_pp_schedule: this rank's actions in order), as PyTorch's
 * _PipelineScheduleRuntime._step_microbatches runs its action lists
 * (torch/distributed/pipelining/schedules.py) with TorchTitan's loss scaling
 * (torchtitan/distributed/pipeline_parallel.py build_pipeline_schedule:
 * rescale_accumulated_loss, each microbatch's loss divided by m).
 *
 * Every rank's model has every weight's metadata, and its data is generated for all
 * stages (the same on every rank, one RNG stream); a caller then frees the other
 * stages' data (dt_pipeline_release_foreign), as TorchTitan's pipeline_module_split
 * (torchtitan/distributed/pipeline_parallel.py) deletes the other stages' modules
 * from each rank's model copy. A rank runs only its stages' modules (dt_model_forward_part);
 * each (stage, microbatch) forward is recorded on a tape of its own, kept until
 * that microbatch's backward of the stage, then freed, so a rank holds the
 * activations of the forwards whose backward has not run yet (1F1B's bound).
 *   F   stage s, microbatch k: from the tokens (first stage) or the activation
 *       received (RECV_F) or passed from stage s - 1 on this rank (a leaf that
 *       requires a gradient); the last stage adds the cross-entropy of the
 *       microbatch's targets scaled by 1/m (the step's loss is their sum).
 *   B   backward of the stage's tape from that loss, or from the gradient of its
 *       output received (RECV_B) or passed from stage s + 1; the gradient of its
 *       input leaf, in the placements of the activation, is what goes back. The
 *       weights' gradients accumulate over the microbatches.
 *   SEND_F / RECV_F, SEND_B / RECV_B: dt_comm_send / dt_comm_recv on the pp dim's
 *       communicator to the rank of stage s + 1 / s - 1. A SEND is eager (never
 *       blocks); a RECV only marks the transfer expected, and the F or B that
 *       consumes it receives (waits) just before it runs, as
 *       _PipelineScheduleRuntime posts its irecv at the RECV and waits at the
 *       compute: a receive blocking where the lowering lists it would hold the
 *       rank's other work back (1F1B's and the interleaved schedule's overlap).
 *       A forward transfer is preceded by the activation's
 *       shape and placements (int64s) with the ledger off, as PyTorch infers the
 *       stage's shapes before the first step; a backward one needs none (the
 *       gradient takes the placements of the activation its receiver sent).
 * FSDP inside the stages (dt_fully_shard): the step runs between
 *       dt_fsdp_pipeline_begin (the modules of this rank's stages) and
 *       dt_fsdp_pipeline_end; after a stage's m-th B, dt_fsdp_pipeline_stage_done
 *       reduces its units (PyTorch's REDUCE_GRAD after the stage's last backward,
 *       schedules.py _add_reduce_grad), so a unit is gathered once and
 *       reduce-scattered once per step (fsdp.c's pipeline mode).
 * Tags: (stage, microbatch, direction) packed, unique within a step.
 * Each action's start and end (dt_now) go into the caller's timeline.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "parallel/parallel.h"

static const char WHO[] = "dt_pipeline_step";

typedef struct cell {
  dt_tape *tape;    /* the (stage, microbatch) forward's graph */
  dt_var *in;       /* its input leaf (not the first stage) */
  dt_var *out;      /* its output: the activation, or the scaled loss (last stage) */
  dt_tensor act_in; /* received or passed activation, before F makes it a leaf */
  dt_tensor g_out;  /* received or passed gradient of out, before B */
  dt_tensor g_in;   /* the gradient of in, after B, before it is sent or passed */
  bool want_f, want_b; /* a RECV_F / RECV_B was listed: the F / B receives first */
} cell;

typedef struct pp_run {
  dt_ctx *ctx;
  dt_model *m;
  const dt_pp_layout *L;
  const dt_pp_schedule *S;
  int pp_dim, rank, m_mb;
  int accum;        /* the step's gradient-accumulation steps (a microbatch's loss / m_mb accum) */
  dt_comm *comm;
  cell *cells;      /* [n_stages][m] */
  int *n_b;         /* [n_stages]: backwards run; the m-th ends the stage's step (FSDP) */
  const dt_tensor *mb_tokens; /* a microbatch's tokens (their global shape) */
  dt_pp_event *ev;  /* the timeline, or NULL */
  int max_ev, *n_ev;
} pp_run;

static void event(pp_run *r, dt_pp_kind kind, int s, int k, double t0) {
  if (r->ev && r->n_ev && *r->n_ev < r->max_ev)
    r->ev[(*r->n_ev)++] = (dt_pp_event){{kind, s, k, 0}, t0, dt_now()};
}

static cell *at(pp_run *r, int s, int k) { return &r->cells[(size_t)s * (size_t)r->m_mb + (size_t)k]; }

static int tag_of(const pp_run *r, int s, int k, int dir) { return ((s * r->m_mb + k) * 2 + dir) * 2; }

/* A tensor's metadata as int64s: ndim, gshape, then per mesh dim kind, dim, op. */
enum { META_MAX = 1 + DT_MAX_DIMS + 3 * DT_MAX_MESH_DIMS };

static dt_status send_tensor(pp_run *r, const dt_tensor *t, int peer, int tag, bool meta) {
  dt_ctx *ctx = r->ctx;
  if (meta) {
    int64_t h[META_MAX] = {0};
    h[0] = t->ndim;
    for (int i = 0; i < t->ndim; i++) h[1 + i] = t->gshape[i];
    for (int d = 0; d < t->mesh_ndim; d++) {
      h[1 + DT_MAX_DIMS + 3 * d] = t->pl[d].kind;
      h[2 + DT_MAX_DIMS + 3 * d] = t->pl[d].dim;
      h[3 + DT_MAX_DIMS + 3 * d] = t->pl[d].op;
    }
    const bool was = dt_ledger_of(ctx)->enabled;
    dt_ledger_enable(ctx, false); /* shape inference, not the step's traffic */
    dt_status s = dt_comm_send(r->comm, h, META_MAX, DT_I64, peer, tag + 1);
    dt_ledger_enable(ctx, was);
    DT_CHECK(s);
  }
  return dt_comm_send(r->comm, t->local.data, (size_t)t->local.numel, t->dtype, peer, tag);
}

/* Receives into out: with meta, its shape and placements first; else like `like`. */
static dt_status recv_tensor(pp_run *r, const dt_tensor *like, int peer, int tag, dt_tensor *out) {
  dt_ctx *ctx = r->ctx;
  dt_model *m = r->m;
  int ndim;
  int64_t gshape[DT_MAX_DIMS];
  dt_placement pl[DT_MAX_MESH_DIMS];
  const int nd = dt_mesh_ndim(m->mesh);
  if (!like && dt_comm_runs_alone(r->comm)) {
    /* no sender runs: the activation between blocks, as parallelize_llama placed it */
    if (!m->has_act_pl || !r->mb_tokens || !r->mb_tokens->mesh)
      return dt_error(ctx, DT_ERR_UNSUPPORTED, WHO,
                      "a stage receive on a comm whose peers do not run needs the model's "
                      "activation placements (dt_parallelize_llama)");
    ndim = 3;
    gshape[0] = r->mb_tokens->gshape[0];
    gshape[1] = r->mb_tokens->gshape[1];
    gshape[2] = m->cfg.dim;
    memcpy(pl, m->act_pl, sizeof pl);
  } else if (!like) {
    int64_t h[META_MAX];
    const bool was = dt_ledger_of(ctx)->enabled;
    dt_ledger_enable(ctx, false);
    dt_status s = dt_comm_recv(r->comm, h, META_MAX, DT_I64, peer, tag + 1);
    dt_ledger_enable(ctx, was);
    DT_CHECK(s);
    ndim = (int)h[0];
    if (ndim < 1 || ndim > DT_MAX_DIMS)
      return dt_error(ctx, DT_ERR_INTERNAL, WHO, "an activation of %d dims received", ndim);
    for (int i = 0; i < ndim; i++) gshape[i] = h[1 + i];
    for (int d = 0; d < nd; d++) {
      pl[d].kind = (dt_pl_kind)h[1 + DT_MAX_DIMS + 3 * d];
      pl[d].dim = (int)h[2 + DT_MAX_DIMS + 3 * d];
      pl[d].op = (dt_reduce_op)h[3 + DT_MAX_DIMS + 3 * d];
    }
  } else {
    ndim = like->ndim;
    memcpy(gshape, like->gshape, sizeof gshape);
    memcpy(pl, like->pl, sizeof pl);
  }
  DT_CHECK(dt_tensor_meta(ctx, m->mesh, pl, ndim, gshape, m->dtype, WHO, out));
  int64_t ls[DT_MAX_DIMS];
  dt_tensor_local_shape(out, ls);
  /* on the sender's kind of memory: like's, else the rank's compute device (the
   * activations the ops made there; the comm front takes device buffers) */
  const dt_device_kind dev = like ? like->local.dev : dt_tensor_home(ctx);
  dt_status s = dt_array_create(ctx, dev, m->dtype, ndim, ls, &out->local);
  if (s == DT_OK)
    s = dt_comm_recv(r->comm, out->local.data, (size_t)out->local.numel, m->dtype, peer, tag);
  if (s != DT_OK) dt_tensor_free(ctx, out);
  return s;
}

static dt_status copy_tensor(dt_ctx *ctx, const dt_tensor *t, dt_tensor *out) {
  return dt_tensor_from_local(ctx, t->mesh, &t->local, t->pl, t->ndim, t->gshape, out);
}

static dt_model_part part_of(const dt_pp_stage *st) {
  dt_model_part p = {st->embedding, st->first_layer, st->first_layer + st->n_layers, st->head};
  return p;
}

static dt_status do_forward(pp_run *r, int s, int k, const dt_tensor *tokens,
                            const dt_tensor *targets) {
  dt_ctx *ctx = r->ctx;
  dt_model *m = r->m;
  cell *c = at(r, s, k);
  const dt_pp_stage *st = &r->L->stages[s];
  DT_CHECK(dt_tape_create(ctx, NULL, &c->tape));
  dt_tape *saved = m->step_tape;
  m->step_tape = c->tape;
  dt_status rc = DT_OK;
  if (!st->embedding) {
    if (!c->act_in.mesh)
      rc = dt_error(ctx, DT_ERR_INTERNAL, WHO, "stage %d microbatch %d: no input activation", s, k);
    else if (!(c->in = dt_var_leaf(c->tape, &c->act_in, true)))
      rc = DT_ERR_NOMEM;
  }
  const dt_model_part p = part_of(st);
  dt_var *h = NULL;
  if (rc == DT_OK) rc = dt_model_forward_part(ctx, m, &p, st->embedding ? &tokens[k] : NULL, c->in, &h);
  if (rc == DT_OK && st->head) {
    dt_var *loss = NULL;
    rc = dt_model_loss(ctx, m, h, &targets[k], &loss);
    dt_op_attrs a = DT_OP_ATTRS_INIT;
    a.scalar = 1.0 / ((double)r->m_mb * r->accum); /* rescale_accumulated_loss */
    dt_var *in1[1] = {loss};
    if (rc == DT_OK) rc = dt_ad_op(c->tape, &dt_op_scale, &a, in1, &h);
  }
  m->step_tape = saved;
  c->out = h;
  /* a next stage on this rank takes the activation directly */
  if (rc == DT_OK && !st->head && dt_pp_stage_rank(s + 1, r->S->pp) == r->rank)
    rc = copy_tensor(ctx, dt_var_value(h), &at(r, s + 1, k)->act_in);
  return rc;
}

static dt_status do_backward(pp_run *r, int s, int k) {
  dt_ctx *ctx = r->ctx;
  cell *c = at(r, s, k);
  const dt_pp_stage *st = &r->L->stages[s];
  if (!c->tape || !c->out)
    return dt_error(ctx, DT_ERR_INTERNAL, WHO, "stage %d microbatch %d: backward before forward", s, k);
  if (!st->head && !c->g_out.mesh)
    return dt_error(ctx, DT_ERR_INTERNAL, WHO, "stage %d microbatch %d: no output gradient", s, k);
  DT_CHECK(dt_backward(c->tape, c->out, st->head ? NULL : &c->g_out));
  dt_tensor_free(ctx, &c->g_out);
  dt_status rc = DT_OK;
  if (c->in) { /* the input's gradient, in the activation's placements */
    const dt_tensor *g = dt_var_grad(c->in), *v = dt_var_value(c->in);
    if (!g) return dt_error(ctx, DT_ERR_INTERNAL, WHO, "stage %d microbatch %d: no input gradient", s, k);
    bool same = true;
    for (int d = 0; d < v->mesh_ndim; d++) same = same && dt_placement_eq(g->pl[d], v->pl[d]);
    rc = same ? copy_tensor(ctx, g, &c->g_in) : dt_redistribute(ctx, g, v->pl, DT_PLANNER_GREEDY, &c->g_in);
  }
  dt_tape_free(c->tape); /* the microbatch's activations of this stage */
  c->tape = NULL;
  c->in = NULL;
  c->out = NULL;
  if (rc == DT_OK && s > 0 && dt_pp_stage_rank(s - 1, r->S->pp) == r->rank) {
    at(r, s - 1, k)->g_out = c->g_in;
    memset(&c->g_in, 0, sizeof c->g_in);
  }
  return rc;
}

/* The receive a RECV marked, done where its consumer needs it (an event of its own). */
static dt_status await(pp_run *r, int s, int k, bool fwd) {
  cell *c = at(r, s, k);
  const int pp = r->S->pp;
  const double t0 = dt_now();
  dt_status st;
  if (fwd) {
    if (!c->want_f) return DT_OK;
    c->want_f = false;
    st = recv_tensor(r, NULL, dt_pp_stage_rank(s - 1, pp), tag_of(r, s - 1, k, 0), &c->act_in);
  } else {
    if (!c->want_b) return DT_OK;
    c->want_b = false;
    if (!c->out) return dt_error(r->ctx, DT_ERR_INTERNAL, WHO, "%dRECV_B%d before its F", s, k);
    st = recv_tensor(r, dt_var_value(c->out), dt_pp_stage_rank(s + 1, pp), tag_of(r, s + 1, k, 1),
                     &c->g_out);
  }
  event(r, fwd ? DT_PP_RECV_F : DT_PP_RECV_B, s, k, t0);
  return st;
}

static dt_status do_action(pp_run *r, const dt_pp_action *a, const dt_tensor *tokens,
                           const dt_tensor *targets, double *loss) {
  dt_ctx *ctx = r->ctx;
  const int s = a->stage, k = a->mb, pp = r->S->pp;
  cell *c = at(r, s, k);
  dt_status st = DT_OK;
  switch (a->kind) {
    case DT_PP_F: {
      dt_ctx_set_phase(ctx, "forward");
      DT_CHECK(await(r, s, k, true));
      const double t0 = dt_now();
      DT_CHECK(do_forward(r, s, k, tokens, targets));
      event(r, a->kind, s, k, t0);
      if (r->L->stages[s].head) {
        dt_array v;
        /* 0-d, Partial(sum) over the dims the batch is sharded on: a 1-element
         * all_reduce on each */
        DT_CHECK(dt_tensor_full(ctx, dt_var_value(c->out), &v));
        *loss += v.dtype == DT_F64    ? ((const double *)v.data)[0]
                 : v.dtype == DT_BF16 ? (double)dt_bf16_to_f32(((const dt_bf16 *)v.data)[0])
                                      : ((const float *)v.data)[0];
        dt_array_free(ctx, &v);
      }
      return DT_OK;
    }
    case DT_PP_B: {
      dt_ctx_set_phase(ctx, "backward");
      DT_CHECK(await(r, s, k, false));
      const double t0 = dt_now();
      st = do_backward(r, s, k);
      event(r, a->kind, s, k, t0);
      /* the stage's last backward: FSDP reduces its units (PyTorch's REDUCE_GRAD) */
      if (st == DT_OK && ++r->n_b[s] == r->m_mb) st = dt_fsdp_pipeline_stage_done(ctx, r->m, s);
      return st;
    }
    case DT_PP_SEND_F: {
      dt_ctx_set_phase(ctx, "forward");
      if (!c->out) return dt_error(ctx, DT_ERR_INTERNAL, WHO, "%dSEND_F%d before its F", s, k);
      const double t0 = dt_now();
      st = send_tensor(r, dt_var_value(c->out), dt_pp_stage_rank(s + 1, pp), tag_of(r, s, k, 0), true);
      event(r, a->kind, s, k, t0);
      return st;
    }
    case DT_PP_SEND_B: {
      dt_ctx_set_phase(ctx, "backward");
      if (!c->g_in.mesh) return dt_error(ctx, DT_ERR_INTERNAL, WHO, "%dSEND_B%d before its B", s, k);
      const double t0 = dt_now();
      st = send_tensor(r, &c->g_in, dt_pp_stage_rank(s - 1, pp), tag_of(r, s, k, 1), false);
      event(r, a->kind, s, k, t0);
      dt_tensor_free(ctx, &c->g_in);
      return st;
    }
    case DT_PP_RECV_F: c->want_f = true; return DT_OK; /* received by the F (await) */
    case DT_PP_RECV_B: c->want_b = true; return DT_OK; /* received by the B */
    default: {
      char t[32];
      dt_pp_action_str(*a, t, sizeof t);
      return dt_error(ctx, DT_ERR_UNSUPPORTED, WHO, "action %s", t);
    }
  }
}

dt_status dt_pipeline_step(dt_ctx *ctx, dt_model *m, int pp_dim, const dt_pp_layout *L,
                           const dt_pp_schedule *S, const dt_tensor *tokens,
                           const dt_tensor *targets, double *loss, dt_pp_event *events,
                           int max_events, int *n_events) {
  return dt_pipeline_step_accum(ctx, m, pp_dim, L, S, 1, tokens, targets, loss, events, max_events,
                                n_events);
}

dt_status dt_pipeline_step_accum(dt_ctx *ctx, dt_model *m, int pp_dim, const dt_pp_layout *L,
                                 const dt_pp_schedule *S, int accum, const dt_tensor *tokens,
                                 const dt_tensor *targets, double *loss, dt_pp_event *events,
                                 int max_events, int *n_events) {
  if (!ctx || !m || !L || !S || !tokens || !targets || !loss)
    return dt_error(ctx, DT_ERR_INVALID, WHO, "NULL argument");
  if (accum < 1) return dt_error(ctx, DT_ERR_INVALID, WHO, "accum %d: at least 1", accum);
  if (n_events) *n_events = 0;
  *loss = 0;
  if (!m->tape) return dt_error(ctx, DT_ERR_INVALID, WHO, "call dt_model_materialize first");
  if (pp_dim < 0 || pp_dim >= dt_mesh_ndim(m->mesh) || dt_mesh_size(m->mesh, pp_dim) != S->pp)
    return dt_error(ctx, DT_ERR_INVALID, WHO, "pp mesh dim %d: the schedule has %d ranks", pp_dim,
                    S->pp);
  if (!S->with_comms) return dt_error(ctx, DT_ERR_INVALID, WHO, "the schedule is not lowered");
  if (L->n_stages != S->n_stages || L->n_layers != m->cfg.n_layers)
    return dt_error(ctx, DT_ERR_INVALID, WHO, "the layout has %d stages of %d layers; the schedule "
                    "%d stages, the model %d layers", L->n_stages, L->n_layers, S->n_stages,
                    m->cfg.n_layers);
  pp_run r = {.ctx = ctx, .m = m, .L = L, .S = S, .pp_dim = pp_dim,
              .rank = dt_mesh_coord(m->mesh, pp_dim), .m_mb = S->n_microbatches, .accum = accum,
              .comm = dt_mesh_comm(m->mesh, pp_dim), .mb_tokens = tokens, .ev = events, .max_ev = max_events,
              .n_ev = n_events};
  r.cells = calloc((size_t)S->n_stages * (size_t)r.m_mb, sizeof *r.cells);
  r.n_b = calloc((size_t)S->n_stages, sizeof *r.n_b);
  int *stage_of = malloc(sizeof *stage_of * (size_t)m->n_mods);
  if (!r.cells || !r.n_b || !stage_of) {
    free(r.cells);
    free(r.n_b);
    free(stage_of);
    return dt_error(ctx, DT_ERR_NOMEM, WHO, "no memory");
  }
  for (int i = 0; i < m->n_mods; i++) { /* the modules of this rank's stages, for FSDP */
    const int st = dt_pp_module_stage(m, L, i);
    stage_of[i] = st >= 0 && dt_pp_stage_rank(st, S->pp) == r.rank ? st : -1;
  }
  char saved[sizeof ctx->phase];
  memcpy(saved, ctx->phase, sizeof saved);
  dt_status s = dt_fsdp_pipeline_begin(ctx, m, stage_of);
  free(stage_of);
  const int n = s == DT_OK ? S->len[r.rank] : 0;
  for (int i = 0; i < n && s == DT_OK; i++) s = do_action(&r, &S->acts[r.rank][i], tokens, targets, loss);
  for (size_t i = 0; i < (size_t)S->n_stages * (size_t)r.m_mb; i++) {
    cell *c = &r.cells[i];
    dt_tape_free(c->tape);
    dt_tensor_free(ctx, &c->act_in);
    dt_tensor_free(ctx, &c->g_out);
    dt_tensor_free(ctx, &c->g_in);
  }
  free(r.cells);
  free(r.n_b);
  /* FSDP: any unit still open reduced (none after a full schedule), the leaves freed */
  const dt_status fs = dt_fsdp_pipeline_end(ctx, m, s == DT_OK);
  if (s == DT_OK) s = fs;
  dt_ctx_set_phase(ctx, saved);
  return s;
}

/* ---- checks: every rank's copy made its owner's ------------------------------------ */

int dt_pp_module_stage(const dt_model *m, const dt_pp_layout *L, int i) {
  if (!m || !L || i < 0 || i >= m->n_mods) return -1;
  const char *f = m->mods[i].fqn;
  for (int s = 0; s < L->n_stages; s++) {
    const dt_pp_stage *st = &L->stages[s];
    if (!strcmp(f, "tok_embeddings") && st->embedding) return s;
    if ((!strcmp(f, "norm") || !strcmp(f, "output")) && st->head) return s;
    if (!strncmp(f, "layers.", 7)) {
      const int l = atoi(f + 7);
      if (l >= st->first_layer && l < st->first_layer + st->n_layers) return s;
    }
  }
  return -1;
}

dt_status dt_pipeline_share(dt_ctx *ctx, dt_model *m, int pp_dim, const dt_pp_layout *L,
                            bool grads) {
  static const char who[] = "dt_pipeline_share";
  if (!ctx || !m || !L || !m->tape) return dt_error(ctx, DT_ERR_INVALID, who, "NULL argument");
  if (pp_dim < 0 || pp_dim >= dt_mesh_ndim(m->mesh))
    return dt_error(ctx, DT_ERR_INVALID, who, "pp mesh dim %d", pp_dim);
  dt_comm *comm = dt_mesh_comm(m->mesh, pp_dim);
  const int pp = comm->size, me = dt_mesh_coord(m->mesh, pp_dim), nd = dt_mesh_ndim(m->mesh);
  for (int i = 0; i < m->n_mods; i++) {
    dt_module *md = &m->mods[i];
    if (!md->weight) continue;
    const int st = dt_pp_module_stage(m, L, i);
    if (st < 0) return dt_error(ctx, DT_ERR_INVALID, who, "%s is in no stage", md->fqn);
    const int owner = dt_pp_stage_rank(st, pp);
    dt_tensor *w = (dt_tensor *)dt_var_value(md->weight); /* overwritten in place */
    if (!grads) {
      if (!w->local.data && w->local.numel && me == owner)
        return dt_error(ctx, DT_ERR_INVALID, who, "%s: released on its own stage's rank", md->fqn);
      if (!w->local.data) { /* released (dt_pipeline_release_foreign): the owner's copy */
        const dt_array was = w->local; /* its shape: dt_array_create clears out first */
        DT_CHECK(dt_array_create(ctx, was.dev, was.dtype, was.ndim, was.shape, &w->local));
      }
      DT_CHECK(dt_comm_broadcast(comm, w->local.data, (size_t)w->local.numel, w->dtype, owner));
      continue;
    }
    /* the gradient's placements, then its data */
    const dt_tensor *g = dt_var_grad(md->weight);
    int64_t h[1 + 3 * DT_MAX_MESH_DIMS] = {0};
    if (me == owner && g) {
      h[0] = 1;
      for (int d = 0; d < nd; d++) {
        h[1 + 3 * d] = g->pl[d].kind;
        h[2 + 3 * d] = g->pl[d].dim;
        h[3 + 3 * d] = g->pl[d].op;
      }
    }
    DT_CHECK(dt_comm_broadcast(comm, h, 1 + 3 * DT_MAX_MESH_DIMS, DT_I64, owner));
    if (!h[0]) { /* the owner has none: neither has anyone */
      if (me != owner) DT_CHECK(dt_var_set_grad(m->tape, md->weight, NULL));
      continue;
    }
    if (me == owner) {
      DT_CHECK(dt_comm_broadcast(comm, g->local.data, (size_t)g->local.numel, g->dtype, owner));
      continue;
    }
    dt_placement pl[DT_MAX_MESH_DIMS];
    for (int d = 0; d < nd; d++) {
      pl[d].kind = (dt_pl_kind)h[1 + 3 * d];
      pl[d].dim = (int)h[2 + 3 * d];
      pl[d].op = (dt_reduce_op)h[3 + 3 * d];
    }
    dt_tensor t;
    DT_CHECK(dt_tensor_meta(ctx, m->mesh, pl, w->ndim, w->gshape, w->dtype, who, &t));
    int64_t ls[DT_MAX_DIMS];
    dt_tensor_local_shape(&t, ls);
    dt_status s = dt_array_create(ctx, w->local.dev, w->dtype, w->ndim, ls, &t.local); /* the weight's memory */
    if (s == DT_OK) s = dt_comm_broadcast(comm, t.local.data, (size_t)t.local.numel, w->dtype, owner);
    if (s == DT_OK) s = dt_var_set_grad(m->tape, md->weight, &t);
    else dt_tensor_free(ctx, &t);
    DT_CHECK(s);
  }
  return DT_OK;
}

void dt_pipeline_drop_foreign_grads(dt_model *m, int pp_dim, const dt_pp_layout *L) {
  if (!m || !L || !m->tape || pp_dim < 0 || pp_dim >= dt_mesh_ndim(m->mesh)) return;
  const int pp = dt_mesh_size(m->mesh, pp_dim), me = dt_mesh_coord(m->mesh, pp_dim);
  for (int i = 0; i < m->n_mods; i++) {
    const int st = dt_pp_module_stage(m, L, i);
    if (m->mods[i].weight && st >= 0 && dt_pp_stage_rank(st, pp) != me)
      (void)dt_var_set_grad(m->tape, m->mods[i].weight, NULL); /* a drop cannot fail */
  }
}

dt_status dt_pipeline_release_foreign(dt_ctx *ctx, dt_model *m, int pp_dim, const dt_pp_layout *L) {
  static const char who[] = "dt_pipeline_release_foreign";
  if (!ctx || !m || !L || !m->tape) return dt_error(ctx, DT_ERR_INVALID, who, "NULL argument");
  if (pp_dim < 0 || pp_dim >= dt_mesh_ndim(m->mesh))
    return dt_error(ctx, DT_ERR_INVALID, who, "pp mesh dim %d", pp_dim);
  const int pp = dt_mesh_size(m->mesh, pp_dim), me = dt_mesh_coord(m->mesh, pp_dim);
  for (int i = 0; i < m->n_mods; i++) { /* every weight in a stage first: nothing half-released */
    if (m->mods[i].weight && dt_pp_module_stage(m, L, i) < 0)
      return dt_error(ctx, DT_ERR_INVALID, who, "%s is in no stage", m->mods[i].fqn);
  }
  dt_pipeline_drop_foreign_grads(m, pp_dim, L);
  for (int i = 0; i < m->n_mods; i++) {
    if (!m->mods[i].weight || dt_pp_stage_rank(dt_pp_module_stage(m, L, i), pp) == me) continue;
    /* the data only: shape, numel and placements stay for dt_pipeline_share to refill */
    dt_array_free(ctx, &((dt_tensor *)dt_var_value(m->mods[i].weight))->local);
  }
  return DT_OK;
}
