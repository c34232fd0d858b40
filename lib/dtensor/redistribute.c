/* lib/dtensor/redistribute.c: the redistribute executor.
 *
 * Runs a plan (plan.c) step by step on this rank's local shard. Each step
 * changes one mesh dim's placement with one collective on that dim's
 * communicator, or locally:
 *
 *   S(d) -> R      all_gather      (shards padded to ceil(L/n) along d)
 *   P    -> R      all_reduce
 *   P    -> S(d)   reduce_scatter  (input padded to n * ceil(L/n) along d)
 *   S(a) -> S(b)   all_to_all      (a padded to ceil(La/n), b to n * ceil(Lb/n))
 *   R    -> S(d)   local chunk
 *   R    -> P      local (sum: divide by n; avg, max, min: keep)
 *
 * L is the logical size of the tensor dim as the mesh dim sees it: the global
 * size after the shardings of the mesh dims before it (nested left to right).
 * A step on a mesh dim of size 1 moves nothing and issues no collective. When
 * the gathered dim is the outermost non-trivial one and divides evenly, the
 * collective reads and writes the shards in place, with no packing copy.
 * Every collective goes through the comm front, so the ledger shows each step.
 * The steps run where the shard lives: on a device rank the scratch buffers are
 * device memory, the packing copies are the device's copy_box kernel, and the
 * collectives take the device buffers (see lib/comm/comm.h).
 */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "dtensor/tensor_impl.h"

typedef struct step_ctx {
  dt_ctx *ctx;
  const dt_tensor *t;           /* layout source (mesh, gshape, dtype) */
  dt_placement cur[DT_MAX_MESH_DIMS];
  int mesh_shape[DT_MAX_MESH_DIMS], coords[DT_MAX_MESH_DIMS];
  size_t es;
  dt_device_kind dev;           /* where the shard and every scratch buffer live */
} step_ctx;

static int64_t prod(const int64_t *s, int from, int to) {
  int64_t p = 1;
  for (int d = from; d < to; d++) p *= s[d];
  return p;
}

static dt_status invalid_step(step_ctx *sc, int i, const dt_redist_step *st, const char *why) {
  char a[24], b[24], state[128];
  dt_placement_str(st->src, a, sizeof a);
  dt_placement_str(st->dst, b, sizeof b);
  dt_placements_str(sc->t->mesh_ndim, sc->cur, state, sizeof state);
  return dt_error(sc->ctx, DT_ERR_INTERNAL, "dt_redistribute",
                  "step on mesh dim %d, %s -> %s, in state %s: %s", i, a, b, state, why);
}

/* Left-to-right nesting: only the innermost shard of a tensor dim can be undone
 * and a new shard must become the innermost one. */
static bool inner_shards(const step_ctx *sc, int i, int d) {
  for (int j = i + 1; j < sc->t->mesh_ndim; j++)
    if (sc->mesh_shape[j] > 1 && sc->cur[j].kind == DT_PL_SHARD && sc->cur[j].dim == d)
      return true;
  return false;
}

static dt_status new_array(step_ctx *sc, const int64_t *shape, dt_array *y) {
  return dt_array_create(sc->ctx, sc->dev, sc->t->dtype, sc->t->ndim, shape, y);
}

static dt_status do_all_gather(step_ctx *sc, int i, int d, const int64_t *L, const dt_array *x,
                               dt_array *y) {
  int nd = sc->t->ndim, n = sc->mesh_shape[i];
  dt_comm *c = dt_mesh_comm(sc->t->mesh, i);
  int64_t out[DT_MAX_DIMS], pad[DT_MAX_DIMS], zero[DT_MAX_DIMS] = {0};
  for (int e = 0; e < nd; e++) out[e] = pad[e] = x->shape[e];
  int64_t ch = (L[d] + n - 1) / n;
  out[d] = L[d];
  pad[d] = ch;
  DT_CHECK(new_array(sc, out, y));
  int64_t block = prod(pad, 0, nd);
  if (prod(x->shape, 0, d) == 1 && ch * n == L[d])
    return dt_comm_all_gather(c, x->data, y->data, (size_t)block, sc->t->dtype);
  dt_scratch sb, rb;
  dt_status s = dt_scratch_get(sc->ctx, sc->dev, (size_t)block * sc->es, true, &sb);
  if (s == DT_OK) s = dt_scratch_get(sc->ctx, sc->dev, (size_t)(block * n) * sc->es, false, &rb);
  else memset(&rb, 0, sizeof rb);
  char *sbuf = sb.p, *rbuf = rb.p;
  if (s == DT_OK) {
    s = dt_box_copy(sc->ctx, sc->dev, sc->es, nd, sbuf, pad, zero, x->data, x->shape, zero, x->shape);
    if (s == DT_OK) s = dt_comm_all_gather(c, sbuf, rbuf, (size_t)block, sc->t->dtype);
    for (int q = 0; q < n && s == DT_OK; q++) {
      int64_t sz, off, box[DT_MAX_DIMS], doff[DT_MAX_DIMS] = {0};
      dt_chunk(L[d], n, q, &sz, &off);
      for (int e = 0; e < nd; e++) box[e] = x->shape[e];
      box[d] = sz;
      doff[d] = off;
      s = dt_box_copy(sc->ctx, sc->dev, sc->es, nd, y->data, out, doff,
                      rbuf + (size_t)(q * block) * sc->es, pad, zero, box);
    }
  }
  dt_scratch_put(sc->ctx, &sb);
  dt_scratch_put(sc->ctx, &rb);
  return s;
}

static dt_status do_reduce_scatter(step_ctx *sc, int i, int d, dt_reduce_op op, const dt_array *x,
                                   dt_array *y) {
  int nd = sc->t->ndim, n = sc->mesh_shape[i], k = sc->coords[i];
  dt_comm *c = dt_mesh_comm(sc->t->mesh, i);
  int64_t L = x->shape[d], ch = (L + n - 1) / n, mine, moff;
  dt_chunk(L, n, k, &mine, &moff);
  int64_t out[DT_MAX_DIMS], pad[DT_MAX_DIMS], zero[DT_MAX_DIMS] = {0};
  for (int e = 0; e < nd; e++) out[e] = pad[e] = x->shape[e];
  out[d] = mine;
  pad[d] = ch;
  DT_CHECK(new_array(sc, out, y));
  int64_t block = prod(pad, 0, nd);
  if (prod(x->shape, 0, d) == 1 && ch * n == L)
    return dt_comm_reduce_scatter(c, x->data, y->data, (size_t)block, sc->t->dtype, op);
  dt_scratch sb, rb;
  dt_status s = dt_scratch_get(sc->ctx, sc->dev, (size_t)(block * n) * sc->es, true, &sb);
  if (s == DT_OK) s = dt_scratch_get(sc->ctx, sc->dev, (size_t)block * sc->es, false, &rb);
  else memset(&rb, 0, sizeof rb);
  char *sbuf = sb.p, *rbuf = rb.p;
  if (s == DT_OK) {
    for (int q = 0; q < n && s == DT_OK; q++) {
      int64_t sz, off, box[DT_MAX_DIMS], soff[DT_MAX_DIMS] = {0};
      dt_chunk(L, n, q, &sz, &off);
      for (int e = 0; e < nd; e++) box[e] = x->shape[e];
      box[d] = sz;
      soff[d] = off;
      s = dt_box_copy(sc->ctx, sc->dev, sc->es, nd, sbuf + (size_t)(q * block) * sc->es, pad,
                      zero, x->data, x->shape, soff, box);
    }
    if (s == DT_OK) s = dt_comm_reduce_scatter(c, sbuf, rbuf, (size_t)block, sc->t->dtype, op);
    if (s == DT_OK)
      s = dt_box_copy(sc->ctx, sc->dev, sc->es, nd, y->data, out, zero, rbuf, pad, zero, out);
  }
  dt_scratch_put(sc->ctx, &sb);
  dt_scratch_put(sc->ctx, &rb);
  return s;
}

static dt_status do_all_to_all(step_ctx *sc, int i, int a, int b, const int64_t *L,
                               const dt_array *x, dt_array *y) {
  int nd = sc->t->ndim, n = sc->mesh_shape[i], k = sc->coords[i];
  dt_comm *c = dt_mesh_comm(sc->t->mesh, i);
  int64_t La = L[a], Lb = x->shape[b];
  int64_t ca = (La + n - 1) / n, cb = (Lb + n - 1) / n, mb, mboff;
  dt_chunk(Lb, n, k, &mb, &mboff);
  int64_t out[DT_MAX_DIMS], blk[DT_MAX_DIMS], zero[DT_MAX_DIMS] = {0};
  for (int e = 0; e < nd; e++) out[e] = blk[e] = x->shape[e];
  out[a] = La;
  out[b] = mb;
  blk[a] = ca;
  blk[b] = cb;
  DT_CHECK(new_array(sc, out, y));
  int64_t block = prod(blk, 0, nd);
  dt_scratch sb, rb;
  dt_status s = dt_scratch_get(sc->ctx, sc->dev, (size_t)(block * n) * sc->es, true, &sb);
  if (s == DT_OK) s = dt_scratch_get(sc->ctx, sc->dev, (size_t)(block * n) * sc->es, false, &rb);
  else memset(&rb, 0, sizeof rb);
  char *sbuf = sb.p, *rbuf = rb.p;
  if (s == DT_OK) {
    /* block q of the send buffer: my a-shard, b-chunk q of the tensor */
    for (int q = 0; q < n && s == DT_OK; q++) {
      int64_t sz, off, box[DT_MAX_DIMS], soff[DT_MAX_DIMS] = {0};
      dt_chunk(Lb, n, q, &sz, &off);
      for (int e = 0; e < nd; e++) box[e] = x->shape[e];
      box[b] = sz;
      soff[b] = off;
      s = dt_box_copy(sc->ctx, sc->dev, sc->es, nd, sbuf + (size_t)(q * block) * sc->es, blk,
                      zero, x->data, x->shape, soff, box);
    }
    if (s == DT_OK) s = dt_comm_all_to_all(c, sbuf, rbuf, (size_t)block, sc->t->dtype);
    /* block q received: rank q's a-shard of my b-chunk */
    for (int q = 0; q < n && s == DT_OK; q++) {
      int64_t sz, off, box[DT_MAX_DIMS], doff[DT_MAX_DIMS] = {0};
      dt_chunk(La, n, q, &sz, &off);
      for (int e = 0; e < nd; e++) box[e] = out[e];
      box[a] = sz;
      doff[a] = off;
      s = dt_box_copy(sc->ctx, sc->dev, sc->es, nd, y->data, out, doff,
                      rbuf + (size_t)(q * block) * sc->es, blk, zero, box);
    }
  }
  dt_scratch_put(sc->ctx, &sb);
  dt_scratch_put(sc->ctx, &rb);
  return s;
}

static dt_status do_chunk(step_ctx *sc, int i, int d, const dt_array *x, dt_array *y) {
  int nd = sc->t->ndim;
  int64_t sz, off, out[DT_MAX_DIMS], soff[DT_MAX_DIMS] = {0}, zero[DT_MAX_DIMS] = {0};
  dt_chunk(x->shape[d], sc->mesh_shape[i], sc->coords[i], &sz, &off);
  for (int e = 0; e < nd; e++) out[e] = x->shape[e];
  out[d] = sz;
  soff[d] = off;
  DT_CHECK(new_array(sc, out, y));
  return dt_box_copy(sc->ctx, sc->dev, sc->es, nd, y->data, out, zero, x->data, x->shape, soff, out);
}

static dt_status do_copy(step_ctx *sc, const dt_array *x, dt_array *y) {
  DT_CHECK(new_array(sc, x->shape, y));
  return dt_mem_copy(sc->ctx, sc->dev, y->data, x->data, dt_array_bytes(x));
}

static dt_status run_step(step_ctx *sc, const dt_redist_step *st, const dt_array *x, dt_array *y) {
  int i = st->mesh_dim, nd = sc->t->ndim, n = sc->mesh_shape[i];
  dt_placement src = st->src, dst = st->dst;
  if (!dt_placement_eq(src, sc->cur[i])) return invalid_step(sc, i, st, "source placement differs");
  if (src.kind == DT_PL_SHARD && src.dim >= nd) return invalid_step(sc, i, st, "bad dim");
  if (dst.kind == DT_PL_SHARD && dst.dim >= nd) return invalid_step(sc, i, st, "bad dim");
  if (n > 1) {
    if (src.kind == DT_PL_SHARD && dst.kind != DT_PL_SHARD && dst.kind != DT_PL_REPLICATE)
      return invalid_step(sc, i, st, "Shard -> Partial is not supported");
    if (src.kind == DT_PL_SHARD && inner_shards(sc, i, src.dim))
      return invalid_step(sc, i, st, "an inner mesh dim still shards the source dim");
    if (dst.kind == DT_PL_SHARD && inner_shards(sc, i, dst.dim))
      return invalid_step(sc, i, st, "an inner mesh dim already shards the target dim");
    if (src.kind == DT_PL_PARTIAL && dst.kind == DT_PL_PARTIAL && src.op != dst.op)
      return invalid_step(sc, i, st, "Partial to another Partial");
  }
  /* logical shape seen by mesh dim i */
  int64_t L[DT_MAX_DIMS];
  dt_logical_shape(nd, sc->t->gshape, sc->mesh_shape, sc->coords, sc->cur, i, L);
  dt_status s;
  if (n == 1) {
    s = do_copy(sc, x, y); /* a size-1 dim moves nothing: relabel */
  } else if (src.kind == DT_PL_SHARD && dst.kind == DT_PL_REPLICATE) {
    s = do_all_gather(sc, i, src.dim, L, x, y);
  } else if (src.kind == DT_PL_SHARD && dst.kind == DT_PL_SHARD) {
    s = src.dim == dst.dim ? do_copy(sc, x, y) : do_all_to_all(sc, i, src.dim, dst.dim, L, x, y);
  } else if (src.kind == DT_PL_PARTIAL && dst.kind == DT_PL_REPLICATE) {
    s = new_array(sc, x->shape, y);
    if (s == DT_OK)
      s = dt_comm_all_reduce(dt_mesh_comm(sc->t->mesh, i), x->data, y->data, (size_t)x->numel,
                             sc->t->dtype, src.op);
  } else if (src.kind == DT_PL_PARTIAL && dst.kind == DT_PL_SHARD) {
    s = do_reduce_scatter(sc, i, dst.dim, src.op, x, y);
  } else if (src.kind == DT_PL_REPLICATE && dst.kind == DT_PL_SHARD) {
    s = do_chunk(sc, i, dst.dim, x, y);
  } else if (src.kind == DT_PL_REPLICATE && dst.kind == DT_PL_PARTIAL) {
    s = do_copy(sc, x, y);
    if (s == DT_OK && dst.op == DT_RED_SUM) s = dt_array_div(sc->ctx, y, (double)n);
  } else {
    s = do_copy(sc, x, y); /* equal placements */
  }
  if (s != DT_OK) dt_array_free(sc->ctx, y);
  else sc->cur[i] = dst;
  return s;
}

dt_status dt_redistribute_run(dt_ctx *ctx, const dt_tensor *t, const dt_redist_plan *plan,
                              dt_tensor *out) {
  const char *call = "dt_redistribute";
  memset(out, 0, sizeof *out);
  if (!t || !plan) return dt_error(ctx, DT_ERR_INVALID, call, "NULL tensor or plan");
  if (plan->mesh_ndim != t->mesh_ndim || plan->ndim != t->ndim)
    return dt_error(ctx, DT_ERR_INVALID, call, "the plan was made for another layout");
  for (int i = 0; i < t->mesh_ndim; i++)
    if (!dt_placement_eq(plan->src[i], t->pl[i]))
      return dt_error(ctx, DT_ERR_INVALID, call, "the plan starts from other placements");
  step_ctx sc = {.ctx = ctx, .t = t, .es = dt_dtype_size(t->dtype), .dev = t->local.dev};
  int m;
  dt_tensor_mesh_info(t->mesh, &m, sc.mesh_shape, sc.coords);
  for (int i = 0; i < m; i++) sc.cur[i] = t->pl[i];
  const dt_array *x = &t->local;
  dt_array owned;
  memset(&owned, 0, sizeof owned);
  for (int k = 0; k < plan->n; k++) {
    dt_array y;
    dt_status s = run_step(&sc, &plan->steps[k], x, &y);
    if (s != DT_OK) {
      dt_array_free(ctx, &owned);
      return s;
    }
    dt_array_free(ctx, &owned);
    owned = y;
    x = &owned;
  }
  for (int i = 0; i < m; i++)
    if (!dt_placement_eq(sc.cur[i], plan->dst[i])) {
      dt_array_free(ctx, &owned);
      return dt_error(ctx, DT_ERR_INTERNAL, call, "the plan ends short of its target (mesh dim %d)", i);
    }
  dt_status s = dt_tensor_meta(ctx, t->mesh, plan->dst, t->ndim, t->gshape, t->dtype, call, out);
  if (s == DT_OK && x == &t->local) s = do_copy(&sc, &t->local, &owned); /* no step: copy */
  if (s != DT_OK) {
    dt_array_free(ctx, &owned);
    return s;
  }
  out->local = owned;
  return DT_OK;
}

dt_status dt_redistribute(dt_ctx *ctx, const dt_tensor *t, const dt_placement *dst,
                          dt_planner planner, dt_tensor *out) {
  memset(out, 0, sizeof *out);
  if (!t || !dst) return dt_error(ctx, DT_ERR_INVALID, "dt_redistribute", "NULL argument");
  dt_layout lay;
  dt_tensor_layout(t, &lay);
  dt_placement d[DT_MAX_MESH_DIMS];
  char err[160];
  for (int i = 0; i < t->mesh_ndim; i++) d[i] = dst[i];
  if (dt_placements_normalize(t->mesh_ndim, d, t->ndim, err, sizeof err) != DT_OK)
    return dt_error(ctx, DT_ERR_INVALID, "dt_redistribute", "%s", err);
  dt_redist_plan plan;
  DT_CHECK(dt_redistribute_plan(ctx, &lay, t->pl, d, planner, &plan));
  return dt_redistribute_run(ctx, t, &plan, out);
}
