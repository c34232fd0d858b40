/* lib/dtensor/plan.c: redistribute planners (greedy and min-cost) and the plan trace.
 *
 * What it is: pure functions from (layout, src placements, dst placements) to an
 * ordered list of per-mesh-dim steps, with the cost estimate of cost.c.
 *   - greedy is PyTorch's greedy planner (torch/distributed/tensor/
 *     _redistribute.py: _gen_transform_infos; in recent versions
 *     DTensorRedistributePlanner.generate_greedy_transform_infos);
 *   - min-cost is a Dijkstra search over placement states (in the spirit of
 *     DTensorRedistributePlanner's graph search in the same file) whose edges
 *     are the steps the executor can run; it never returns a plan that costs
 *     more than greedy.
 * What it is not: the executor (redistribute.c runs plans), and it does no
 * communication, no printing and keeps no state between calls. The only heap
 * use is the search's state table, freed before returning.
 *
 * The nesting rule the executor relies on ("valid" steps): shards of one tensor
 * dim nest left to right over the mesh dims, so a step on mesh dim i (size > 1)
 * may only undo the innermost shard of a tensor dim (S(d) -> R or S(d) -> S(b)
 * needs no mesh dim j > i of size > 1 sharding d) and a new shard S(b) must
 * become the innermost one (no mesh dim j > i of size > 1 sharding b). Steps on
 * size-1 mesh dims move no data and are always valid. greedy plans satisfy this
 * by construction (verify/test_plan.c checks it exhaustively on small meshes).
 */
#include "config.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/dtensor.h"

static const char *const kStepNames[DT_STEP_KIND_COUNT] = {
    [DT_STEP_ALL_GATHER] = "all_gather",     [DT_STEP_ALL_REDUCE] = "all_reduce",
    [DT_STEP_REDUCE_SCATTER] = "reduce_scatter", [DT_STEP_ALL_TO_ALL] = "all_to_all",
    [DT_STEP_CHUNK] = "chunk",               [DT_STEP_PARTITION] = "partition",
};

const char *dt_step_kind_name(dt_step_kind k) {
  if ((int)k < 0 || k >= DT_STEP_KIND_COUNT) return "unknown";
  return kStepNames[k];
}

bool dt_step_coll(dt_step_kind k, dt_coll *out) {
  dt_coll c;
  switch (k) {
    case DT_STEP_ALL_GATHER: c = DT_COLL_ALL_GATHER; break;
    case DT_STEP_ALL_REDUCE: c = DT_COLL_ALL_REDUCE; break;
    case DT_STEP_REDUCE_SCATTER: c = DT_COLL_REDUCE_SCATTER; break;
    case DT_STEP_ALL_TO_ALL: c = DT_COLL_ALL_TO_ALL; break;
    default: return false; /* chunk, partition: local */
  }
  if (out) *out = c;
  return true;
}

const char *dt_planner_name(dt_planner p) {
  switch (p) {
    case DT_PLANNER_GREEDY: return "greedy";
    case DT_PLANNER_MIN_COST: return "min-cost";
  }
  return "unknown";
}

dt_status dt_planner_parse(const char *s, dt_planner *out) {
  if (!s || !out) return DT_ERR_INVALID;
  if (!strcmp(s, "greedy")) {
    *out = DT_PLANNER_GREEDY;
    return DT_OK;
  }
  if (!strcmp(s, "min-cost")) {
    *out = DT_PLANNER_MIN_COST;
    return DT_OK;
  }
  return DT_ERR_INVALID;
}

/* ---- placement helpers (local: plan.c needs only these three facts) ---- */

static bool pl_eq(dt_placement a, dt_placement b) {
  if (a.kind != b.kind) return false;
  if (a.kind == DT_PL_SHARD) return a.dim == b.dim;
  if (a.kind == DT_PL_PARTIAL) return a.op == b.op;
  return true;
}

static bool is_shard(dt_placement p, int d) { return p.kind == DT_PL_SHARD && p.dim == d; }

/* The step kind of src -> dst on one mesh dim; false when there is no such step
 * (equal placements, S -> P, P(x) -> P(y)). */
static bool step_kind(dt_placement s, dt_placement d, dt_step_kind *k) {
  if (pl_eq(s, d)) return false;
  switch (s.kind) {
    case DT_PL_SHARD:
      if (d.kind == DT_PL_REPLICATE) *k = DT_STEP_ALL_GATHER;
      else if (d.kind == DT_PL_SHARD) *k = DT_STEP_ALL_TO_ALL;
      else return false;
      return true;
    case DT_PL_PARTIAL:
      if (d.kind == DT_PL_REPLICATE) *k = DT_STEP_ALL_REDUCE;
      else if (d.kind == DT_PL_SHARD) *k = DT_STEP_REDUCE_SCATTER;
      else return false;
      return true;
    case DT_PL_REPLICATE:
      *k = d.kind == DT_PL_SHARD ? DT_STEP_CHUNK : DT_STEP_PARTITION;
      return true;
  }
  return false;
}

/* Whether the executor can run cur[i] -> to in state cur (the nesting rule in
 * the file comment). */
static bool step_valid(const dt_layout *lay, const dt_placement *cur, int i, dt_placement to) {
  if (lay->mesh_shape[i] == 1) return true;
  dt_placement from = cur[i];
  for (int j = i + 1; j < lay->mesh_ndim; j++) {
    if (lay->mesh_shape[j] == 1) continue;
    if (from.kind == DT_PL_SHARD && to.kind != DT_PL_PARTIAL && is_shard(cur[j], from.dim))
      return false;
    if (to.kind == DT_PL_SHARD && is_shard(cur[j], to.dim)) return false;
  }
  return true;
}

static double num_shards(const dt_layout *lay, const dt_placement *pl) {
  double s = 1.0;
  for (int i = 0; i < lay->mesh_ndim; i++)
    if (pl[i].kind == DT_PL_SHARD) s *= lay->mesh_shape[i];
  return s;
}

/* Appends step cur[i] -> to and applies it to cur. */
static void push_step(dt_redist_plan *p, dt_placement *cur, int i, dt_placement to) {
  dt_redist_step *s = &p->steps[p->n++];
  s->mesh_dim = i;
  s->src = cur[i];
  s->dst = to;
  s->kind = DT_STEP_CHUNK;
  (void)step_kind(cur[i], to, &s->kind);
  cur[i] = to;
}

/* ---- validation ---- */

static const char kCall[] = "dt_redistribute_plan";

static dt_status validate(dt_ctx *ctx, const dt_layout *lay, const dt_placement *src,
                          const dt_placement *dst, dt_planner planner) {
  if (!lay || !src || !dst)
    return dt_error(ctx, DT_ERR_INVALID, kCall, "NULL layout or placements");
  if (planner != DT_PLANNER_GREEDY && planner != DT_PLANNER_MIN_COST)
    return dt_error(ctx, DT_ERR_INVALID, kCall, "unknown planner %d", (int)planner);
  if (lay->mesh_ndim < 1 || lay->mesh_ndim > DT_MAX_MESH_DIMS)
    return dt_error(ctx, DT_ERR_INVALID, kCall, "mesh has %d dims; expected 1..%d",
                    lay->mesh_ndim, (int)DT_MAX_MESH_DIMS);
  if (lay->ndim < 0 || lay->ndim > DT_MAX_DIMS)
    return dt_error(ctx, DT_ERR_INVALID, kCall, "tensor has %d dims; expected 0..%d", lay->ndim,
                    (int)DT_MAX_DIMS);
  if (dt_dtype_size(lay->dtype) == 0)
    return dt_error(ctx, DT_ERR_INVALID, kCall, "invalid dtype %d", (int)lay->dtype);
  if (dt_shape_numel(lay->ndim, lay->gshape) < 0)
    return dt_error(ctx, DT_ERR_INVALID, kCall, "invalid global shape (negative or overflow)");
  for (int i = 0; i < lay->mesh_ndim; i++) {
    if (lay->mesh_shape[i] < 1)
      return dt_error(ctx, DT_ERR_INVALID, kCall, "mesh dim %d has size %d", i,
                      lay->mesh_shape[i]);
    const dt_placement *two[2] = {&src[i], &dst[i]};
    for (int w = 0; w < 2; w++) {
      dt_placement p = *two[w];
      const char *side = w ? "dst" : "src";
      if (p.kind == DT_PL_SHARD && (p.dim < 0 || p.dim >= lay->ndim))
        return dt_error(ctx, DT_ERR_INVALID, kCall,
                        "mesh dim %d: %s S(%d) is out of range for a %d-d tensor", i, side,
                        p.dim, lay->ndim);
      if (p.kind == DT_PL_PARTIAL && ((int)p.op < 0 || p.op >= DT_RED_COUNT))
        return dt_error(ctx, DT_ERR_INVALID, kCall, "mesh dim %d: %s Partial op %d is unknown",
                        i, side, (int)p.op);
      if (p.kind != DT_PL_SHARD && p.kind != DT_PL_REPLICATE && p.kind != DT_PL_PARTIAL)
        return dt_error(ctx, DT_ERR_INVALID, kCall, "mesh dim %d: %s placement kind %d", i,
                        side, (int)p.kind);
    }
    if (dst[i].kind != DT_PL_PARTIAL || pl_eq(src[i], dst[i])) continue;
    char a[32], b[32];
    dt_placement_str(src[i], a, sizeof a);
    dt_placement_str(dst[i], b, sizeof b);
    if (src[i].kind == DT_PL_SHARD)
      return dt_error(ctx, DT_ERR_INVALID, kCall, "mesh dim %d: %s -> %s is not supported", i, a,
                      b);
    if (src[i].kind == DT_PL_PARTIAL)
      return dt_error(ctx, DT_ERR_INVALID, kCall,
                      "mesh dim %d: %s -> %s: redistribution between partial types is not "
                      "supported",
                      i, a, b);
    /* R -> P(prod) has no partition (PyTorch raises for product). */
    if (dst[i].op == DT_RED_PROD)
      return dt_error(ctx, DT_ERR_INVALID, kCall, "mesh dim %d: %s -> %s is not supported", i, a,
                      b);
  }
  return DT_OK;
}

/* ---- greedy: generate_greedy_transform_infos ---- */

static void plan_greedy(const dt_layout *lay, const dt_placement *src, const dt_placement *dst,
                        dt_redist_plan *p) {
  int m = lay->mesh_ndim;
  dt_placement cur[DT_MAX_MESH_DIMS];
  memcpy(cur, src, (size_t)m * sizeof *cur);
  p->n = 0;
  /* Pass 1, inner -> outer, only when the source is sharded at all: a Shard
   * target whose tensor dim is sharded by a different list of earlier mesh dims
   * (now vs. in the target) is replicated first. */
  if (num_shards(lay, src) > 1) {
    for (int i = m - 1; i >= 0; i--) {
      dt_placement tgt = dst[i];
      if (tgt.kind == DT_PL_SHARD) {
        bool same = true;
        for (int j = 0; j < i; j++)
          if (is_shard(cur[j], tgt.dim) != is_shard(dst[j], tgt.dim)) same = false;
        if (!same) tgt = dt_replicate();
      }
      if (!pl_eq(cur[i], tgt)) push_step(p, cur, i, tgt);
    }
  }
  /* Pass 2, outer -> inner: whatever still differs goes straight to dst. */
  for (int i = 0; i < m; i++)
    if (!pl_eq(cur[i], dst[i])) push_step(p, cur, i, dst[i]);
}

/* The cost of a plan by the step rule: each step priced with the local bytes of
 * the state before it (global bytes / num_shards), CPU topology. */
static double plan_cost(const dt_layout *lay, const dt_topo *topo, double gbytes,
                        const dt_redist_plan *p) {
  dt_placement cur[DT_MAX_MESH_DIMS];
  memcpy(cur, p->src, (size_t)lay->mesh_ndim * sizeof *cur);
  double c = 0.0;
  for (int k = 0; k < p->n; k++) {
    c += dt_step_cost(topo, &p->steps[k], gbytes / num_shards(lay, cur));
    cur[p->steps[k].mesh_dim] = p->steps[k].dst;
  }
  return c;
}

/* ---- min-cost: Dijkstra over placement states ---- */

/* Per mesh dim: R, S(0..ndim-1) and the Partial of src or dst on that dim (at
 * most one: validation rejects P(x) -> P(y)). */
enum { DT_OPT_MAX = 1 + DT_MAX_DIMS + 1 };

/* Two costs closer than this (relative, plus as much absolute in us) are a tie,
 * and then fewer steps win. Sums of up to DT_MAX_STEPS terms added in another
 * order differ by ~1e-15 relative, far inside it; a latency hop is 0.6 us, and
 * the only real differences it can hide are a few bytes on a tensor of GBs,
 * below the meaning of the model. */
#define DT_COST_TIE_REL 1e-9

/* a < b by more than the tie tolerance; INFINITY (unreached) is above every cost. */
static bool cost_lt(double a, double b) {
  if (isinf(b)) return !isinf(a);
  if (isinf(a)) return false;
  return a < b - DT_COST_TIE_REL * (1.0 + fabs(b));
}

typedef struct mc_node {
  double cost;
  int steps;
  int prev;      /* state index, -1 for the source */
  int heap_pos;  /* -1: not in the heap */
  signed char dim, opt; /* the step that reached it: mesh dim, option index */
  bool done;
} mc_node;

typedef struct mc_search {
  const dt_layout *lay;
  int m;
  int nopt[DT_MAX_MESH_DIMS];
  dt_placement opt[DT_MAX_MESH_DIMS][DT_OPT_MAX];
  int stride[DT_MAX_MESH_DIMS];
  int nstates;
  mc_node *node;
  int *heap;
  int heap_n;
} mc_search;

static bool node_lt(const mc_search *s, int a, int b) {
  const mc_node *x = &s->node[a], *y = &s->node[b];
  if (cost_lt(x->cost, y->cost)) return true;
  if (cost_lt(y->cost, x->cost)) return false;
  if (x->steps != y->steps) return x->steps < y->steps;
  return a < b;
}

static void heap_swap(mc_search *s, int i, int j) {
  int a = s->heap[i], b = s->heap[j];
  s->heap[i] = b;
  s->heap[j] = a;
  s->node[b].heap_pos = i;
  s->node[a].heap_pos = j;
}

static void heap_up(mc_search *s, int i) {
  while (i > 0) {
    int par = (i - 1) / 2;
    if (!node_lt(s, s->heap[i], s->heap[par])) break;
    heap_swap(s, i, par);
    i = par;
  }
}

static void heap_down(mc_search *s, int i) {
  for (;;) {
    int l = 2 * i + 1, r = l + 1, best = i;
    if (l < s->heap_n && node_lt(s, s->heap[l], s->heap[best])) best = l;
    if (r < s->heap_n && node_lt(s, s->heap[r], s->heap[best])) best = r;
    if (best == i) break;
    heap_swap(s, i, best);
    i = best;
  }
}

static int heap_pop(mc_search *s) {
  int top = s->heap[0];
  s->heap_n--;
  if (s->heap_n > 0) {
    s->heap[0] = s->heap[s->heap_n];
    s->node[s->heap[0]].heap_pos = 0;
    heap_down(s, 0);
  }
  s->node[top].heap_pos = -1;
  return top;
}

static int opt_index(const mc_search *s, int i, dt_placement p) {
  for (int k = 0; k < s->nopt[i]; k++)
    if (pl_eq(s->opt[i][k], p)) return k;
  return -1;
}

static void decode(const mc_search *s, int state, dt_placement *pl) {
  for (int i = 0; i < s->m; i++) pl[i] = s->opt[i][(state / s->stride[i]) % s->nopt[i]];
}

/* Searches the cheapest valid step sequence src -> dst. On success fills p's
 * steps and returns DT_OK; DT_ERR_NOMEM when the table cannot be allocated;
 * DT_ERR_INTERNAL when dst is unreachable or the path is longer than
 * DT_MAX_STEPS (then the caller keeps greedy). */
static dt_status plan_min_cost(const dt_layout *lay, const dt_topo *topo, double gbytes,
                               const dt_placement *src, const dt_placement *dst,
                               dt_redist_plan *p) {
  mc_search s;
  memset(&s, 0, sizeof s);
  s.lay = lay;
  s.m = lay->mesh_ndim;
  int total = 1;
  for (int i = s.m - 1; i >= 0; i--) {
    int k = 0;
    s.opt[i][k++] = dt_replicate();
    for (int d = 0; d < lay->ndim; d++) s.opt[i][k++] = dt_shard(d);
    if (src[i].kind == DT_PL_PARTIAL) s.opt[i][k++] = src[i];
    else if (dst[i].kind == DT_PL_PARTIAL) s.opt[i][k++] = dst[i];
    s.nopt[i] = k;
    s.stride[i] = total;
    total *= k; /* at most 10^5 states (DT_OPT_MAX^DT_MAX_MESH_DIMS) */
  }
  s.nstates = total;
  int start = 0, goal = 0;
  for (int i = 0; i < s.m; i++) {
    start += opt_index(&s, i, src[i]) * s.stride[i];
    goal += opt_index(&s, i, dst[i]) * s.stride[i];
  }
  s.node = malloc((size_t)total * sizeof *s.node);
  s.heap = malloc((size_t)total * sizeof *s.heap);
  if (!s.node || !s.heap) {
    free(s.node);
    free(s.heap);
    return DT_ERR_NOMEM;
  }
  for (int v = 0; v < total; v++)
    s.node[v] = (mc_node){.cost = INFINITY, .steps = 0, .prev = -1, .heap_pos = -1};
  s.node[start].cost = 0.0;
  s.heap[0] = start;
  s.node[start].heap_pos = 0;
  s.heap_n = 1;

  while (s.heap_n > 0) {
    int v = heap_pop(&s);
    mc_node *nv = &s.node[v];
    nv->done = true;
    if (v == goal) break;
    dt_placement cur[DT_MAX_MESH_DIMS];
    decode(&s, v, cur);
    double local = gbytes / num_shards(lay, cur);
    for (int i = 0; i < s.m; i++) {
      int ci = (v / s.stride[i]) % s.nopt[i];
      for (int k = 0; k < s.nopt[i]; k++) {
        if (k == ci) continue;
        dt_placement to = s.opt[i][k];
        dt_redist_step st = {.mesh_dim = i, .src = cur[i], .dst = to};
        if (!step_kind(cur[i], to, &st.kind)) continue;
        /* A Partial is only reduced, never re-created, except the partition
         * that sets dst's own Partial on this dim. */
        if (st.kind == DT_STEP_PARTITION && !pl_eq(to, dst[i])) continue;
        if (!step_valid(lay, cur, i, to)) continue;
        int w = v + (k - ci) * s.stride[i];
        mc_node *nw = &s.node[w];
        if (nw->done) continue;
        double c = nv->cost + dt_step_cost(topo, &st, local);
        int steps = nv->steps + 1;
        bool better = cost_lt(c, nw->cost) || (!cost_lt(nw->cost, c) && steps < nw->steps);
        if (!better) continue;
        nw->cost = c;
        nw->steps = steps;
        nw->prev = v;
        nw->dim = (signed char)i;
        nw->opt = (signed char)k;
        if (nw->heap_pos < 0) {
          nw->heap_pos = s.heap_n;
          s.heap[s.heap_n++] = w;
        }
        heap_up(&s, nw->heap_pos);
      }
    }
  }

  dt_status st = DT_OK;
  if (!s.node[goal].done || s.node[goal].steps > DT_MAX_STEPS) {
    st = DT_ERR_INTERNAL;
  } else {
    int n = s.node[goal].steps;
    p->n = n;
    /* Walk back from the goal, filling steps from the end. */
    for (int v = goal, k = n - 1; v != start; v = s.node[v].prev, k--) {
      int pv = s.node[v].prev;
      dt_placement before[DT_MAX_MESH_DIMS];
      decode(&s, pv, before);
      int i = s.node[v].dim;
      dt_redist_step *step = &p->steps[k];
      step->mesh_dim = i;
      step->src = before[i];
      step->dst = s.opt[i][(int)s.node[v].opt];
      (void)step_kind(step->src, step->dst, &step->kind);
    }
  }
  free(s.node);
  free(s.heap);
  return st;
}

dt_status dt_redistribute_plan(dt_ctx *ctx, const dt_layout *lay, const dt_placement *src,
                               const dt_placement *dst, dt_planner planner, dt_redist_plan *out) {
  if (!out) return dt_error(ctx, DT_ERR_INVALID, kCall, "NULL output plan");
  memset(out, 0, sizeof *out);
  dt_status st = validate(ctx, lay, src, dst, planner);
  if (st != DT_OK) return st;

  int m = lay->mesh_ndim;
  out->planner = planner;
  out->mesh_ndim = m;
  out->ndim = lay->ndim;
  memcpy(out->src, src, (size_t)m * sizeof *src);
  memcpy(out->dst, dst, (size_t)m * sizeof *dst);

  dt_topo topo;
  /* CPU meshes: PyTorch's device_count() is 1 there, so every dim is inter-host. */
  dt_topo_build(m, lay->mesh_shape, 1, &topo);
  double gbytes =
      (double)dt_shape_numel(lay->ndim, lay->gshape) * (double)dt_dtype_size(lay->dtype);

  plan_greedy(lay, src, dst, out);
  out->cost_us = plan_cost(lay, &topo, gbytes, out);
  if (planner == DT_PLANNER_GREEDY) return DT_OK;

  dt_redist_plan mc = *out;
  st = plan_min_cost(lay, &topo, gbytes, src, dst, &mc);
  if (st == DT_ERR_NOMEM)
    return dt_error(ctx, DT_ERR_NOMEM, kCall, "min-cost search: out of memory");
  if (st != DT_OK) return DT_OK; /* no better path found: greedy stands */
  mc.cost_us = plan_cost(lay, &topo, gbytes, &mc);
  /* Only a strictly cheaper plan replaces greedy, so ties keep PyTorch's order. */
  if (cost_lt(mc.cost_us, out->cost_us)) *out = mc;
  return DT_OK;
}

/* ---- trace ---- */

typedef struct sbuf {
  char *buf;
  size_t n;
  size_t len;
} sbuf;

static void sb_put(sbuf *b, const char *s) {
  size_t l = strlen(s);
  if (b->n && b->len < b->n) {
    size_t room = b->n - 1 - b->len;
    size_t c = l < room ? l : room;
    memcpy(b->buf + b->len, s, c);
    b->buf[b->len + c] = '\0';
  }
  b->len += l;
}

static void put_state(sbuf *b, int m, const dt_placement *pl) {
  for (int i = 0; i < m; i++) {
    char t[48];
    dt_placement_str(pl[i], t, sizeof t);
    sb_put(b, t);
    if (pl[i].kind != DT_PL_SHARD) continue;
    int count = 0, pos = 0;
    for (int j = 0; j < m; j++) {
      if (!is_shard(pl[j], pl[i].dim)) continue;
      if (j < i) pos++;
      count++;
    }
    if (count >= 2) {
      snprintf(t, sizeof t, "[%d]", pos);
      sb_put(b, t);
    }
  }
}

int dt_redist_plan_trace(const dt_redist_plan *p, char *buf, size_t n) {
  sbuf b = {.buf = buf, .n = n, .len = 0};
  if (buf && n) buf[0] = '\0';
  if (!p || p->mesh_ndim < 1 || p->mesh_ndim > DT_MAX_MESH_DIMS) return 0;
  dt_placement cur[DT_MAX_MESH_DIMS];
  memcpy(cur, p->src, (size_t)p->mesh_ndim * sizeof *cur);
  put_state(&b, p->mesh_ndim, cur);
  for (int k = 0; k < p->n && k < DT_MAX_STEPS; k++) {
    int i = p->steps[k].mesh_dim;
    if (i < 0 || i >= p->mesh_ndim) break;
    cur[i] = p->steps[k].dst;
    sb_put(&b, "->");
    put_state(&b, p->mesh_ndim, cur);
  }
  return b.len > (size_t)INT32_MAX ? INT32_MAX : (int)b.len;
}
