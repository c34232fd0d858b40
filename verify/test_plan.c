/* verify/test_plan.c: tests of the redistribute planners (lib/dtensor/plan.c) and
 * of the cost model (lib/dtensor/cost.c).
 *
 * What it checks, against references written here and not taken from the library:
 *   - greedy reproduces PyTorch's greedy planner (generate_greedy_transform_infos
 *     in torch/distributed/tensor/_redistribute.py) on the paths and comm counts
 *     that test/distributed/tensor/test_redistribute.py asserts, the Partial-only
 *     sources (one step per mesh dim, outer first), and the greedy trace of
 *     DistributeWithDeviceOrderTest in the same file;
 *   - the cost model (torch/distributed/tensor/_collective_utils.py:
 *     MeshTopoInfo.build_from_mesh, allgather_cost, allreduce_cost,
 *     redistribute_cost) on a worked example computed by hand from those
 *     formulas, the comparisons of TestCostModel
 *     (test/distributed/tensor/test_op_strategy.py), and the topology rule;
 *   - exhaustive sweeps on small meshes: every greedy and min-cost plan is accepted,
 *     reaches dst step by step, only takes steps the executor can run (the nesting
 *     rule, re-implemented below), prices its steps by the rule above (own
 *     formula), and min-cost equals min(greedy, the optimum found by an
 *     independent Bellman-Ford over the same state space);
 *   - rejections (S -> P, P(x) -> P(y), out-of-range dims, 6 mesh dims, ...).
 * What it is not: a test of the executor (test_redistribute.c runs plans).
 * It prints, on stdout, how often min-cost beats greedy, with example traces.
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "testutil.h"

/* ---- independent references ------------------------------------------------- */

static bool peq(dt_placement a, dt_placement b) {
  if (a.kind != b.kind) return false;
  if (a.kind == DT_PL_SHARD) return a.dim == b.dim;
  if (a.kind == DT_PL_PARTIAL) return a.op == b.op;
  return true;
}

static bool pl_list_eq(int m, const dt_placement *a, const dt_placement *b) {
  for (int i = 0; i < m; i++)
    if (!peq(a[i], b[i])) return false;
  return true;
}

/* The step kind for src -> dst on one mesh dim, as PyTorch's
 * redistribute_local_tensor does it (S->R all_gather, S->S all_to_all, P->R
 * all_reduce, P->S reduce_scatter, R->S local chunk, R->P local partition);
 * -1 for none. */
static int ref_kind(dt_placement s, dt_placement d) {
  if (peq(s, d)) return -1;
  if (s.kind == DT_PL_SHARD && d.kind == DT_PL_REPLICATE) return DT_STEP_ALL_GATHER;
  if (s.kind == DT_PL_SHARD && d.kind == DT_PL_SHARD) return DT_STEP_ALL_TO_ALL;
  if (s.kind == DT_PL_PARTIAL && d.kind == DT_PL_REPLICATE) return DT_STEP_ALL_REDUCE;
  if (s.kind == DT_PL_PARTIAL && d.kind == DT_PL_SHARD) return DT_STEP_REDUCE_SCATTER;
  if (s.kind == DT_PL_REPLICATE && d.kind == DT_PL_SHARD) return DT_STEP_CHUNK;
  if (s.kind == DT_PL_REPLICATE && d.kind == DT_PL_PARTIAL) return DT_STEP_PARTITION;
  return -1;
}

/* The executor's nesting rule (lib/dtensor/plan.c runs only "valid" steps;
 * shards of one tensor dim nest left to right): on mesh dim i of size > 1, undoing
 * S(d) (to R or to S(b)) needs no later size>1 mesh dim sharding d; a new S(b)
 * needs no later size>1 mesh dim sharding b. Size-1 dims: always valid. */
static bool ref_valid(int m, const int *ms, const dt_placement *cur, int i, dt_placement to) {
  if (ms[i] == 1) return true;
  for (int j = i + 1; j < m; j++) {
    if (ms[j] == 1 || cur[j].kind != DT_PL_SHARD) continue;
    if (cur[i].kind == DT_PL_SHARD && to.kind != DT_PL_PARTIAL && cur[j].dim == cur[i].dim)
      return false;
    if (to.kind == DT_PL_SHARD && cur[j].dim == to.dim) return false;
  }
  return true;
}

static double ref_shards(int m, const int *ms, const dt_placement *pl) {
  double s = 1;
  for (int i = 0; i < m; i++)
    if (pl[i].kind == DT_PL_SHARD) s *= ms[i];
  return s;
}

/* 3.2 on a CPU mesh (every dim inter-host: 87.7 * 0.22 GB/s, 2.7 us per hop);
 * factor 1: all_gather / reduce_scatter, 2: all_reduce. */
static double ref_ring(int n, double bytes, double factor) {
  if (n == 1) return 0.0;
  double gb = bytes / (1024.0 * 1024.0 * 1024.0);
  return 6.6 + factor * (n - 1) * 2.7 + 1e6 * gb * factor * (n - 1) / n / (87.7 * 0.22);
}

static double ref_step_cost(int n, dt_placement s, dt_placement d, double local) {
  if (n == 1) return 0.0;
  switch (ref_kind(s, d)) {
    case DT_STEP_ALL_GATHER: return ref_ring(n, local * n, 1);
    case DT_STEP_ALL_TO_ALL: return ref_ring(n, local, 1) + 1.0;
    case DT_STEP_ALL_REDUCE: return ref_ring(n, local, 2);
    case DT_STEP_REDUCE_SCATTER: return ref_ring(n, local, 1);
    default: return 0.0;
  }
}

/* Relative tolerance (plus as much absolute, us) for two sums of the same costs
 * added in another order: rounding is ~1e-15 relative; the planner's tie rule
 * uses the same 1e-9, so "strictly cheaper" means the same thing on both sides. */
#define COST_TOL 1e-9
static bool cost_close(double a, double b) { return fabs(a - b) <= COST_TOL * (1.0 + fabs(b)); }

/* ---- helpers ------------------------------------------------------------------ */

static dt_layout mk_layout(int m, const int *ms, int ndim, const int64_t *gs) {
  dt_layout l;
  memset(&l, 0, sizeof l);
  l.mesh_ndim = m;
  for (int i = 0; i < m && i < DT_MAX_MESH_DIMS; i++) l.mesh_shape[i] = ms[i];
  l.ndim = ndim;
  for (int i = 0; i < ndim && i < DT_MAX_DIMS; i++) l.gshape[i] = gs[i];
  l.dtype = DT_F32;
  return l;
}

static double gbytes_of(const dt_layout *l) {
  double n = 1;
  for (int i = 0; i < l->ndim; i++) n *= (double)l->gshape[i];
  return n * (double)dt_dtype_size(l->dtype);
}

static void parse_pl(const char *s, int m, dt_placement *out) {
  char err[128] = "";
  int n = 0;
  if (dt_placements_parse(s, DT_MAX_MESH_DIMS, out, &n, err, sizeof err) != DT_OK || n != m) {
    fprintf(stderr, "test_plan: bad placements '%s' (%s)\n", s, err);
    exit(2);
  }
}

/* "1:S(1)->R,0:S(0)->S(1)" */
static void path_str(const dt_redist_plan *p, char *buf, size_t n) {
  size_t len = 0;
  buf[0] = '\0';
  for (int k = 0; k < p->n && len < n; k++) {
    char a[32], b[32];
    dt_placement_str(p->steps[k].src, a, sizeof a);
    dt_placement_str(p->steps[k].dst, b, sizeof b);
    len += (size_t)snprintf(buf + len, n - len, "%s%d:%s->%s", k ? "," : "", p->steps[k].mesh_dim,
                            a, b);
  }
}

static int comm_count(const dt_layout *l, const dt_redist_plan *p) {
  int c = 0;
  for (int k = 0; k < p->n; k++)
    if (dt_step_coll(p->steps[k].kind, NULL) && l->mesh_shape[p->steps[k].mesh_dim] > 1) c++;
  return c;
}

static void mesh_str(const dt_layout *l, char *buf, size_t n) {
  size_t len = 0;
  buf[0] = '\0';
  for (int i = 0; i < l->mesh_ndim && len < n; i++)
    len += (size_t)snprintf(buf + len, n - len, "%s%d", i ? "x" : "", l->mesh_shape[i]);
}

static void shape_str(const dt_layout *l, char *buf, size_t n) {
  size_t len = (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < l->ndim && len < n; i++)
    len += (size_t)snprintf(buf + len, n - len, "%s%lld", i ? "," : "", (long long)l->gshape[i]);
  if (len < n) snprintf(buf + len, n - len, "]");
}

/* Simulates plan p from its src: every step starts from the current placement,
 * has the kind of its (src,dst), is valid, and the end state is dst. Returns the
 * plan's cost by the reference formula (and checks cost_us against it). */
static double check_plan(const dt_layout *l, const dt_placement *src, const dt_placement *dst,
                         const dt_redist_plan *p, const char *what) {
  int m = l->mesh_ndim;
  char s1[96], s2[96];
  dt_placements_str(m, src, s1, sizeof s1);
  dt_placements_str(m, dst, s2, sizeof s2);
  TU_CHECK(p->mesh_ndim == m && p->ndim == l->ndim, "%s (%s)->(%s): plan dims %d/%d", what, s1,
           s2, p->mesh_ndim, p->ndim);
  TU_CHECK(pl_list_eq(m, p->src, src) && pl_list_eq(m, p->dst, dst),
           "%s (%s)->(%s): src/dst not recorded", what, s1, s2);
  TU_CHECK(p->n >= 0 && p->n <= DT_MAX_STEPS, "%s: %d steps", what, p->n);
  dt_placement cur[DT_MAX_MESH_DIMS];
  memcpy(cur, src, sizeof(dt_placement) * (size_t)m);
  double gb = gbytes_of(l), cost = 0;
  for (int k = 0; k < p->n && k < DT_MAX_STEPS; k++) {
    const dt_redist_step *s = &p->steps[k];
    int i = s->mesh_dim;
    if (i < 0 || i >= m) {
      TU_CHECK(0, "%s (%s)->(%s): step %d on mesh dim %d", what, s1, s2, k, i);
      return INFINITY;
    }
    TU_CHECK(peq(s->src, cur[i]), "%s (%s)->(%s): step %d does not start from the state", what,
             s1, s2, k);
    int kind = ref_kind(s->src, s->dst);
    TU_CHECK(kind >= 0 && kind == (int)s->kind, "%s (%s)->(%s): step %d kind %s for its (src,dst)",
             what, s1, s2, k, dt_step_kind_name(s->kind));
    if (!ref_valid(m, l->mesh_shape, cur, i, s->dst)) {
      char tr[512];
      dt_redist_plan_trace(p, tr, sizeof tr);
      TU_CHECK(0, "%s mesh dim %d (%s)->(%s): step %d is not valid: %s", what, i, s1, s2, k, tr);
    }
    cost += ref_step_cost(l->mesh_shape[i], s->src, s->dst, gb / ref_shards(m, l->mesh_shape, cur));
    cur[i] = s->dst;
  }
  TU_CHECK(pl_list_eq(m, cur, dst), "%s (%s)->(%s): plan does not reach dst", what, s1, s2);
  TU_CHECK(cost_close(p->cost_us, cost), "%s (%s)->(%s): cost_us %.9g, reference %.9g", what, s1,
           s2, p->cost_us, cost);
  return cost;
}

/* ---- 1. greedy: the paths of PyTorch's test_redistribute.py -------------------------- */

typedef struct greedy_row {
  int m, ms[3], ndim;
  const char *src, *dst, *path;
  int comms;
} greedy_row;

static const greedy_row kGreedyRows[] = {
    {2, {2, 2}, 2, "S(0),S(1)", "S(0),S(0)", "1:S(1)->S(0)", 1},
    {2, {2, 2}, 2, "S(0),S(1)", "S(1),S(0)", "1:S(1)->R,0:S(0)->S(1),1:R->S(0)", 2},
    {2, {2, 2}, 2, "S(0),S(0)", "S(1),S(1)", "1:S(0)->R,0:S(0)->S(1),1:R->S(1)", 2},
    {2, {2, 2}, 3, "S(0),S(2)", "S(1),S(0)", "1:S(2)->R,0:S(0)->S(1),1:R->S(0)", 2},
    {2, {2, 2}, 3, "S(1),S(1)", "S(1),S(2)", "1:S(1)->S(2)", 1},
    {3, {2, 2, 2}, 3, "S(0),S(0),S(0)", "S(1),S(1),S(1)",
     "2:S(0)->R,1:S(0)->R,0:S(0)->S(1),1:R->S(1),2:R->S(1)", 3},
    {3, {2, 2, 2}, 3, "S(0),S(1),S(0)", "S(1),S(0),S(0)",
     "2:S(0)->R,1:S(1)->R,0:S(0)->S(1),1:R->S(0),2:R->S(0)", 3},
    {3, {2, 2, 2}, 3, "S(0),S(1),S(2)", "S(2),S(1),S(0)", "2:S(2)->R,0:S(0)->S(2),2:R->S(0)", 2},
    {3, {2, 2, 2}, 3, "S(1),S(0),S(0)", "R,S(0),S(0)", "0:S(1)->R", 1},
    {3, {2, 2, 2}, 3, "S(1),R,S(0)", "R,S(0),S(0)", "2:S(0)->R,1:R->S(0),0:S(1)->R,2:R->S(0)", 2},
    {3, {2, 2, 2}, 3, "S(0),S(0),S(1)", "S(0),S(1),S(2)", "2:S(1)->S(2),1:S(0)->S(1)", 2},
    /* Partial-only sources skip the greedy planner's first (inner to outer) pass. */
    {2, {2, 2}, 2, "P(sum),P(sum)", "R,R", "0:P(sum)->R,1:P(sum)->R", 2},
    {2, {2, 2}, 2, "P(sum),P(sum)", "S(0),S(0)", "0:P(sum)->S(0),1:P(sum)->S(0)", 2},
};

static void test_greedy_table(void) {
  const int64_t gs[3] = {8, 8, 8};
  for (size_t r = 0; r < sizeof kGreedyRows / sizeof kGreedyRows[0]; r++) {
    const greedy_row *g = &kGreedyRows[r];
    dt_layout l = mk_layout(g->m, g->ms, g->ndim, gs);
    dt_placement src[3], dst[3];
    parse_pl(g->src, g->m, src);
    parse_pl(g->dst, g->m, dst);
    dt_redist_plan p;
    TU_OK(NULL, dt_redistribute_plan(NULL, &l, src, dst, DT_PLANNER_GREEDY, &p));
    char path[512];
    path_str(&p, path, sizeof path);
    TU_CHECK(!strcmp(path, g->path), "greedy (%s)->(%s): path %s, expected %s", g->src, g->dst,
             path, g->path);
    TU_CHECK(comm_count(&l, &p) == g->comms, "greedy (%s)->(%s): %d comms, expected %d", g->src,
             g->dst, comm_count(&l, &p), g->comms);
    TU_CHECK(p.planner == DT_PLANNER_GREEDY, "planner recorded");
    check_plan(&l, src, dst, &p, "greedy table");
  }
  /* The Partial rows use all_reduce and reduce_scatter. */
  {
    const int ms[2] = {2, 2};
    dt_layout l = mk_layout(2, ms, 2, gs);
    dt_placement src[2], dst[2];
    dt_redist_plan p;
    parse_pl("P(sum),P(sum)", 2, src);
    parse_pl("R,R", 2, dst);
    TU_OK(NULL, dt_redistribute_plan(NULL, &l, src, dst, DT_PLANNER_GREEDY, &p));
    dt_coll c = DT_COLL_COUNT;
    TU_CHECK(p.n == 2 && dt_step_coll(p.steps[0].kind, &c) && c == DT_COLL_ALL_REDUCE,
             "(P,P)->(R,R): all_reduce");
    parse_pl("S(0),S(0)", 2, dst);
    TU_OK(NULL, dt_redistribute_plan(NULL, &l, src, dst, DT_PLANNER_GREEDY, &p));
    TU_CHECK(p.n == 2 && dt_step_coll(p.steps[1].kind, &c) && c == DT_COLL_REDUCE_SCATTER,
             "(P,P)->(S0,S0): reduce_scatter");
  }
  /* The traces: DistributeWithDeviceOrderTest's greedy one, and S(0)^3 -> R^3. */
  {
    const int ms[3] = {2, 2, 2};
    dt_layout l = mk_layout(3, ms, 3, gs);
    dt_placement src[3], dst[3];
    dt_redist_plan p;
    char tr[512];
    parse_pl("S(0),S(0),S(0)", 3, src);
    parse_pl("S(1),S(1),S(1)", 3, dst);
    TU_OK(NULL, dt_redistribute_plan(NULL, &l, src, dst, DT_PLANNER_GREEDY, &p));
    int len = dt_redist_plan_trace(&p, tr, sizeof tr);
    const char *want = "S(0)[0]S(0)[1]S(0)[2]->S(0)[0]S(0)[1]R->S(0)RR->S(1)RR->"
                       "S(1)[0]S(1)[1]R->S(1)[0]S(1)[1]S(1)[2]";
    TU_CHECK(!strcmp(tr, want), "greedy trace (DistributeWithDeviceOrderTest): %s", tr);
    TU_CHECK(len == (int)strlen(want), "trace length %d", len);
    /* snprintf rules: truncated output, full length returned, NULL/0 allowed. */
    char small[10];
    TU_CHECK(dt_redist_plan_trace(&p, small, sizeof small) == len && strlen(small) == 9 &&
                 !strncmp(small, want, 9),
             "truncated trace '%s'", small);
    TU_CHECK(dt_redist_plan_trace(&p, NULL, 0) == len, "trace length with no buffer");
    parse_pl("R,R,R", 3, dst);
    TU_OK(NULL, dt_redistribute_plan(NULL, &l, src, dst, DT_PLANNER_GREEDY, &p));
    dt_redist_plan_trace(&p, tr, sizeof tr);
    TU_CHECK(!strcmp(tr, "S(0)[0]S(0)[1]S(0)[2]->S(0)[0]S(0)[1]R->S(0)RR->RRR"), "trace %s", tr);
    /* Partial prints P(op); a plan with no steps is just the source state. */
    parse_pl("P(sum),S(1),S(1)", 3, src);
    TU_OK(NULL, dt_redistribute_plan(NULL, &l, src, src, DT_PLANNER_MIN_COST, &p));
    dt_redist_plan_trace(&p, tr, sizeof tr);
    TU_CHECK(p.n == 0 && !strcmp(tr, "P(sum)S(1)[0]S(1)[1]"), "no-op trace %s", tr);
  }
  /* A 0-d tensor (a loss): only R and Partial exist; (P,P) -> (R,R) is 2 all_reduces. */
  {
    const int m22[2] = {2, 2};
    dt_layout l0 = mk_layout(2, m22, 0, gs);
    dt_placement src[2], dst[2];
    dt_redist_plan p;
    parse_pl("P(avg),P(sum)", 2, src);
    parse_pl("R,R", 2, dst);
    for (int pl = 0; pl < 2; pl++) {
      TU_OK(NULL, dt_redistribute_plan(NULL, &l0, src, dst, (dt_planner)pl, &p));
      TU_CHECK(p.n == 2 && p.steps[0].kind == DT_STEP_ALL_REDUCE && p.steps[0].mesh_dim == 0 &&
                   p.steps[0].src.op == DT_RED_AVG,
               "0-d (P(avg),P(sum)) -> (R,R)");
      check_plan(&l0, src, dst, &p, "0-d");
    }
  }
  /* A 1-D mesh: one step (none when equal); size-1 mesh dims get their step too. */
  {
    const int m1[1] = {4}, m14[2] = {1, 4};
    dt_layout l1 = mk_layout(1, m1, 2, gs), l14 = mk_layout(2, m14, 2, gs);
    dt_placement src[2], dst[2];
    dt_redist_plan p;
    parse_pl("S(0)", 1, src);
    parse_pl("S(1)", 1, dst);
    TU_OK(NULL, dt_redistribute_plan(NULL, &l1, src, dst, DT_PLANNER_GREEDY, &p));
    TU_CHECK(p.n == 1 && p.steps[0].kind == DT_STEP_ALL_TO_ALL, "1-D S0->S1: one all_to_all");
    TU_OK(NULL, dt_redistribute_plan(NULL, &l1, src, src, DT_PLANNER_GREEDY, &p));
    TU_CHECK(p.n == 0 && p.cost_us == 0.0, "1-D S0->S0: no step");
    parse_pl("S(0),S(1)", 2, src);
    parse_pl("S(1),R", 2, dst);
    TU_OK(NULL, dt_redistribute_plan(NULL, &l14, src, dst, DT_PLANNER_GREEDY, &p));
    char path[256];
    path_str(&p, path, sizeof path);
    TU_CHECK(!strcmp(path, "1:S(1)->R,0:S(0)->S(1)"), "1x4 path %s", path);
    TU_CHECK(comm_count(&l14, &p) == 1, "1x4: one comm (the size-1 step moves nothing)");
  }
}

/* ---- 2. the cost model ------------------------------------------------------------- */

static void test_cost(void) {
  /* Worked example: 1-D mesh of 4 (CPU), 10x10 f32 = 400 B. On a CPU mesh
   * device_count() is 1, so every mesh dim is "inter-host": bw 87.7 * 0.22
   * GB/s, latency 2.7 us (MeshTopoInfo.build_from_mesh). By hand:
   * S0->R = all_gather of the 400 B = 6.6 + 3 * 2.7 + 1e6 * (400 / 2^30) * 3/4 / 19.294
   * = 14.7145, and the P->R all_reduce of 400 B
   * = 6.6 + 6 * 2.7 + 1e6 * (400 / 2^30) * 2 * 3/4 / 19.294 = 22.829. */
  const int m4[1] = {4};
  dt_topo t;
  dt_topo_build(1, m4, 1, &t);
  TU_CHECK(t.mesh_ndim == 1 && t.size[0] == 4, "topo size");
  /* 87.7 * 0.22 = 19.294; 1e-12 is the rounding of that product. */
  TU_CHECK(fabs(t.bw_gbps[0] - 19.294) < 1e-12 && t.lat_us[0] == 2.7, "CPU topo bw %g lat %g",
           t.bw_gbps[0], t.lat_us[0]);
  dt_placement S0 = dt_shard(0), S1 = dt_shard(1), R = dt_replicate(), P = dt_partial(DT_RED_SUM);
  double s2r = dt_redistribute_cost(&t, 400, &S0, &R);
  double p2s = dt_redistribute_cost(&t, 400, &P, &S0);
  double p2r = dt_redistribute_cost(&t, 400, &P, &R);
  double s2p = dt_redistribute_cost(&t, 400, &S0, &P);
  /* The hand values above are rounded to 4 decimals: compare to 1e-3. */
  TU_CHECK(fabs(s2r - 14.7145) < 1e-3, "S0->R = %.6f, expected 14.7145", s2r);
  TU_CHECK(fabs(p2s - s2r) < 1e-12, "P->S0 = %.6f equals S0->R", p2s);
  TU_CHECK(fabs(p2r - 22.829) < 1e-3, "P->R = %.6f, expected 22.829", p2r);
  TU_CHECK(p2r + 1.0 < s2r + p2s, "AR + 1 < AG + RS");
  TU_CHECK(isinf(s2p) && s2p > 0, "S->P is inf");
  TU_CHECK(dt_redistribute_cost(&t, 400, &R, &S0) == 0.0, "R->S costs 0");
  TU_CHECK(dt_redistribute_cost(&t, 400, &R, &P) == 0.0, "R->P costs 0 (replicated source)");
  TU_CHECK(dt_redistribute_cost(&t, 400, &S0, &S0) == 0.0, "S0->S0 costs 0");
  double s2s = dt_redistribute_cost(&t, 400, &S0, &S1);
  TU_CHECK(cost_close(s2s, ref_ring(4, 100, 1) + 1.0), "S0->S1 = AG(local)+1: %.6f", s2s);
  /* The per-collective functions, against the formula with the numbers written out. */
  const double gb400 = 400.0 / 1073741824.0;
  TU_CHECK(cost_close(dt_cost_allgather(&t, 0, 400), 6.6 + 3 * 2.7 + 1e6 * gb400 * 3 / 4 / 19.294),
           "allgather formula");
  TU_CHECK(cost_close(dt_cost_reduce_scatter(&t, 0, 400), dt_cost_allgather(&t, 0, 400)),
           "reduce_scatter = allgather");
  TU_CHECK(cost_close(dt_cost_allreduce(&t, 0, 400), 6.6 + 6 * 2.7 + 1e6 * gb400 * 6 / 4 / 19.294),
           "allreduce formula");
  /* Plans price the same example identically. */
  {
    const int64_t gs[2] = {10, 10};
    dt_layout l = mk_layout(1, m4, 2, gs);
    dt_redist_plan p;
    TU_OK(NULL, dt_redistribute_plan(NULL, &l, &S0, &R, DT_PLANNER_GREEDY, &p));
    TU_CHECK(fabs(p.cost_us - 14.7145) < 1e-3, "plan S0->R cost %.6f", p.cost_us);
    TU_OK(NULL, dt_redistribute_plan(NULL, &l, &P, &R, DT_PLANNER_GREEDY, &p));
    TU_CHECK(fabs(p.cost_us - 22.829) < 1e-3, "plan P->R cost %.6f", p.cost_us);
  }
  /* dt_step_cost: local bytes before the step. */
  {
    dt_redist_step st = {.mesh_dim = 0, .src = S0, .dst = R, .kind = DT_STEP_ALL_GATHER};
    TU_CHECK(cost_close(dt_step_cost(&t, &st, 100), s2r), "step AG(100 local) = S0->R");
    st.dst = S1;
    st.kind = DT_STEP_ALL_TO_ALL;
    TU_CHECK(cost_close(dt_step_cost(&t, &st, 100), s2s), "step A2A");
    st.src = P;
    st.dst = R;
    st.kind = DT_STEP_ALL_REDUCE;
    TU_CHECK(cost_close(dt_step_cost(&t, &st, 400), p2r), "step AR");
    st.dst = S0;
    st.kind = DT_STEP_REDUCE_SCATTER;
    TU_CHECK(cost_close(dt_step_cost(&t, &st, 400), p2s), "step RS");
    st.src = R;
    st.kind = DT_STEP_CHUNK;
    TU_CHECK(dt_step_cost(&t, &st, 400) == 0.0, "step chunk 0");
    st.dst = P;
    st.kind = DT_STEP_PARTITION;
    TU_CHECK(dt_step_cost(&t, &st, 400) == 0.0, "step partition 0");
  }
  /* TestCostModel's 2x2 assertions: (P,P)->(R,R) costs more than (S0,S0)->(R,R)
   * and more than (P,P)->(S0,S0). */
  {
    const int m22[2] = {2, 2};
    dt_topo t2;
    dt_topo_build(2, m22, 1, &t2);
    dt_placement pp[2] = {P, P}, rr[2] = {R, R}, ss[2] = {S0, S0};
    double pp_rr = dt_redistribute_cost(&t2, 400, pp, rr);
    double ss_rr = dt_redistribute_cost(&t2, 400, ss, rr);
    double pp_ss = dt_redistribute_cost(&t2, 400, pp, ss);
    TU_CHECK(pp_rr > ss_rr && pp_rr > pp_ss, "2x2: (P,P)->(R,R) %.4f > (S0,S0)->(R,R) %.4f, "
             "(P,P)->(S0,S0) %.4f", pp_rr, ss_rr, pp_ss);
    /* The walk over mesh dims: AG(200 B) on dim 0 then AG(400 B) on dim 1. */
    TU_CHECK(cost_close(ss_rr, ref_ring(2, 200, 1) + ref_ring(2, 400, 1)), "(S0,S0)->(R,R) walk");
    TU_CHECK(cost_close(pp_ss, ref_ring(2, 400, 1) + ref_ring(2, 200, 1)), "(P,P)->(S0,S0) walk");
  }
  /* Topology for a GPU mesh: (2,8) with 8 devices per host: dim 1 intra, dim 0 inter. */
  {
    const int m28[2] = {2, 8}, m224[3] = {2, 2, 4}, m8[1] = {8};
    dt_topo g;
    dt_topo_build(2, m28, 8, &g);
    TU_CHECK(g.bw_gbps[1] == 87.7 && g.lat_us[1] == 0.6, "(2,8)/8: dim 1 intra-host");
    TU_CHECK(fabs(g.bw_gbps[0] - 19.294) < 1e-12 && g.lat_us[0] == 2.7, "(2,8)/8: dim 0 inter");
    /* 1 GiB all_gather on the intra-host dim: 6.6 + 7*0.6 + 1e6*(7/8)/87.7 us. */
    TU_CHECK(cost_close(dt_cost_allgather(&g, 1, 1073741824.0),
                        6.6 + 7 * 0.6 + 1e6 * 7.0 / 8 / 87.7),
             "intra-host all_gather");
    dt_topo_build(3, m224, 8, &g);
    TU_CHECK(g.lat_us[2] == 0.6 && g.lat_us[1] == 0.6 && g.lat_us[0] == 2.7,
             "(2,2,4)/8: products 4, 8 stay in the host, 16 crosses");
    dt_topo_build(1, m8, 8, &g);
    TU_CHECK(g.bw_gbps[0] == 87.7, "(8)/8: one host");
    dt_topo_build(2, m28, 1, &g);
    TU_CHECK(g.lat_us[0] == 2.7 && g.lat_us[1] == 2.7, "(2,8)/1: CPU, all inter-host");
    /* A size-1 mesh dim moves nothing and costs 0. */
    const int m14[2] = {1, 4};
    dt_topo_build(2, m14, 1, &g);
    TU_CHECK(dt_cost_allgather(&g, 0, 1e6) == 0.0 && dt_cost_allreduce(&g, 0, 1e6) == 0.0,
             "size-1 dim costs 0");
    dt_placement a[2] = {S0, R}, b[2] = {S1, R};
    TU_CHECK(dt_redistribute_cost(&g, 400, a, b) == 0.0, "S0->S1 on a size-1 dim costs 0");
  }
}

/* ---- 3. rejections and small API ------------------------------------------------------ */

static void expect_invalid(dt_ctx *ctx, const dt_layout *l, const dt_placement *src,
                           const dt_placement *dst, const char *needle, const char *what) {
  dt_redist_plan p;
  for (int pl = 0; pl < 2; pl++) {
    dt_error_clear(ctx);
    dt_status s = dt_redistribute_plan(ctx, l, src, dst, (dt_planner)pl, &p);
    TU_CHECK(s == DT_ERR_INVALID, "%s: status %s", what, dt_status_str(s));
    const char *msg = dt_last_error(ctx);
    TU_CHECK(strstr(msg, "dt_redistribute_plan") && strstr(msg, needle) && !strchr(msg, '\n'),
             "%s: message '%s' lacks '%s'", what, msg, needle);
    /* ctx may be NULL: same status, no message to record. */
    TU_CHECK(dt_redistribute_plan(NULL, l, src, dst, (dt_planner)pl, &p) == DT_ERR_INVALID,
             "%s: NULL ctx", what);
  }
}

static void test_rejections(void) {
  dt_ctx ctx;
  dt_ctx_init(&ctx, 0, 1);
  const int64_t gs[3] = {8, 8, 8};
  const int m22[2] = {2, 2};
  dt_layout l = mk_layout(2, m22, 2, gs);
  dt_placement src[DT_MAX_MESH_DIMS], dst[DT_MAX_MESH_DIMS];

  parse_pl("R,S(0)", 2, src);
  parse_pl("R,P(sum)", 2, dst);
  expect_invalid(&ctx, &l, src, dst, "mesh dim 1: S(0) -> P(sum) is not supported", "S->P");
  parse_pl("P(sum),R", 2, src);
  parse_pl("P(max),R", 2, dst);
  expect_invalid(&ctx, &l, src, dst, "mesh dim 0: P(sum) -> P(max)", "P(sum)->P(max)");
  parse_pl("S(2),R", 2, src);
  parse_pl("R,R", 2, dst);
  expect_invalid(&ctx, &l, src, dst, "mesh dim 0", "shard dim 2 of a 2-d tensor");
  parse_pl("R,R", 2, src);
  parse_pl("R,S(-1)", 2, dst);
  expect_invalid(&ctx, &l, src, dst, "mesh dim 1", "an unnormalised negative dim");
  {
    dt_layout l6 = l;
    l6.mesh_ndim = 6;
    for (int i = 0; i < DT_MAX_MESH_DIMS; i++) {
      l6.mesh_shape[i] = 2;
      src[i] = dst[i] = dt_replicate();
    }
    expect_invalid(&ctx, &l6, src, dst, "6 dims", "6 mesh dims");
    l6.mesh_ndim = 0;
    expect_invalid(&ctx, &l6, src, dst, "0 dims", "0 mesh dims");
  }
  {
    dt_layout l9 = l;
    l9.ndim = 9;
    parse_pl("R,R", 2, src);
    expect_invalid(&ctx, &l9, src, src, "9 dims", "a 9-d tensor");
    dt_layout l0 = l;
    l0.mesh_shape[1] = 0;
    expect_invalid(&ctx, &l0, src, src, "mesh dim 1 has size 0", "a mesh dim of size 0");
  }
  /* Accepted Partial targets: R -> P (a local partition), P -> the same P (no step). */
  {
    dt_redist_plan p;
    parse_pl("R,P(sum)", 2, src);
    parse_pl("P(avg),P(sum)", 2, dst);
    for (int pl = 0; pl < 2; pl++) {
      TU_OK(&ctx, dt_redistribute_plan(&ctx, &l, src, dst, (dt_planner)pl, &p));
      TU_CHECK(p.n == 1 && p.steps[0].kind == DT_STEP_PARTITION && p.steps[0].mesh_dim == 0 &&
                   p.cost_us == 0.0,
               "R->P(avg): one partition");
    }
    /* A bad planner value and a NULL plan are rejected too. */
    TU_CHECK(dt_redistribute_plan(NULL, &l, src, dst, (dt_planner)7, &p) == DT_ERR_INVALID,
             "planner 7");
    TU_CHECK(dt_redistribute_plan(NULL, &l, src, dst, DT_PLANNER_GREEDY, NULL) == DT_ERR_INVALID,
             "NULL plan");
  }
  dt_ctx_release(&ctx);

  /* Names, parsing, the collective of each step. */
  const char *names[DT_STEP_KIND_COUNT] = {"all_gather", "all_reduce", "reduce_scatter",
                                           "all_to_all", "chunk",      "partition"};
  const int colls[DT_STEP_KIND_COUNT] = {DT_COLL_ALL_GATHER, DT_COLL_ALL_REDUCE,
                                         DT_COLL_REDUCE_SCATTER, DT_COLL_ALL_TO_ALL, -1, -1};
  for (int k = 0; k < DT_STEP_KIND_COUNT; k++) {
    TU_CHECK(!strcmp(dt_step_kind_name((dt_step_kind)k), names[k]), "step name %d", k);
    dt_coll c = DT_COLL_COUNT;
    bool has = dt_step_coll((dt_step_kind)k, &c);
    TU_CHECK(has == (colls[k] >= 0) && (!has || (int)c == colls[k]), "step coll %d", k);
  }
  dt_planner pl;
  TU_CHECK(dt_planner_parse("greedy", &pl) == DT_OK && pl == DT_PLANNER_GREEDY, "parse greedy");
  TU_CHECK(dt_planner_parse("min-cost", &pl) == DT_OK && pl == DT_PLANNER_MIN_COST, "parse mc");
  TU_CHECK(dt_planner_parse("fast", &pl) == DT_ERR_INVALID, "parse junk");
  TU_CHECK(!strcmp(dt_planner_name(DT_PLANNER_GREEDY), "greedy") &&
               !strcmp(dt_planner_name(DT_PLANNER_MIN_COST), "min-cost"),
           "planner names");
}

/* ---- 4. exhaustive sweeps --------------------------------------------------------------- */

enum { MAX_OPTS = 8, MAX_STATES = 1024 };

/* Single-source optimum by Bellman-Ford over the states min-cost searches (per
 * mesh dim: R, S(0..ndim-1), the source's Partial), with edges = one valid step
 * (no S -> P, no partition: the sweep's targets hold no Partial). */
typedef struct bf_space {
  int m, nopt[DT_MAX_MESH_DIMS], stride[DT_MAX_MESH_DIMS], n;
  dt_placement opt[DT_MAX_MESH_DIMS][MAX_OPTS];
} bf_space;

static void bf_decode(const bf_space *b, int v, dt_placement *pl) {
  for (int i = 0; i < b->m; i++) pl[i] = b->opt[i][(v / b->stride[i]) % b->nopt[i]];
}

static int bf_encode(const bf_space *b, const dt_placement *pl) {
  int v = 0;
  for (int i = 0; i < b->m; i++) {
    int k = 0;
    while (k < b->nopt[i] && !peq(b->opt[i][k], pl[i])) k++;
    if (k == b->nopt[i]) return -1;
    v += k * b->stride[i];
  }
  return v;
}

static void bf_run(const dt_layout *l, const dt_placement *src, bf_space *b, double *dist) {
  b->m = l->mesh_ndim;
  b->n = 1;
  for (int i = 0; i < b->m; i++) {
    int k = 0;
    b->opt[i][k++] = dt_replicate();
    for (int d = 0; d < l->ndim; d++) b->opt[i][k++] = dt_shard(d);
    if (src[i].kind == DT_PL_PARTIAL) b->opt[i][k++] = src[i];
    b->nopt[i] = k;
    b->stride[i] = b->n;
    b->n *= k;
  }
  for (int v = 0; v < b->n; v++) dist[v] = INFINITY;
  dist[bf_encode(b, src)] = 0;
  double gb = gbytes_of(l);
  for (bool changed = true; changed;) {
    changed = false;
    for (int v = 0; v < b->n; v++) {
      if (isinf(dist[v])) continue;
      dt_placement cur[DT_MAX_MESH_DIMS];
      bf_decode(b, v, cur);
      double local = gb / ref_shards(b->m, l->mesh_shape, cur);
      for (int i = 0; i < b->m; i++)
        for (int k = 0; k < b->nopt[i]; k++) {
          dt_placement to = b->opt[i][k];
          int kind = ref_kind(cur[i], to);
          if (kind < 0 || kind == DT_STEP_PARTITION) continue;
          if (!ref_valid(b->m, l->mesh_shape, cur, i, to)) continue;
          dt_placement nx[DT_MAX_MESH_DIMS];
          memcpy(nx, cur, sizeof nx);
          nx[i] = to;
          int w = bf_encode(b, nx);
          double c = dist[v] + ref_step_cost(l->mesh_shape[i], cur[i], to, local);
          /* Strict improvement beyond rounding, so the loop ends. */
          if (c < dist[w] - COST_TOL * (1.0 + c)) {
            dist[w] = c;
            changed = true;
          }
        }
    }
  }
}

typedef struct sweep_stats {
  long pairs, wins, examples;
  double best_gain;
} sweep_stats;

static long g_examples_printed;
/* Example traces printed per sweep group, and in all (a few, for the reader of the log). */
enum { EXAMPLES_PER_GROUP = 1, EXAMPLES_TOTAL = 10 };

static void print_example(const dt_layout *l, const dt_redist_plan *g, const dt_redist_plan *mc) {
  char ms[32], gs[64], s1[96], s2[96], t1[512], t2[512];
  mesh_str(l, ms, sizeof ms);
  shape_str(l, gs, sizeof gs);
  dt_placements_str(l->mesh_ndim, g->src, s1, sizeof s1);
  dt_placements_str(l->mesh_ndim, g->dst, s2, sizeof s2);
  dt_redist_plan_trace(g, t1, sizeof t1);
  dt_redist_plan_trace(mc, t2, sizeof t2);
  printf("  example: mesh %s f32%s (%s)->(%s)\n    greedy   %10.4f us  %s\n"
         "    min-cost %10.4f us  %s\n",
         ms, gs, s1, s2, g->cost_us, t1, mc->cost_us, t2);
}

/* Sweeps every (src, dst) with src in {R, S(0..r-1), P(ops...)}^m and dst in
 * {R, S(0..r-1)}^m. */
static void sweep(int m, const int *ms, int ndim, const int64_t *gs, const dt_reduce_op *pops,
                  int npops, sweep_stats *st) {
  dt_layout l = mk_layout(m, ms, ndim, gs);
  dt_placement so[MAX_OPTS], dopt[MAX_OPTS];
  int ns = 0, nd = 0;
  so[ns++] = dopt[nd++] = dt_replicate();
  for (int d = 0; d < ndim; d++) so[ns++] = dopt[nd++] = dt_shard(d);
  for (int k = 0; k < npops; k++) so[ns++] = dt_partial(pops[k]);
  int nsrc = 1, ndst = 1;
  for (int i = 0; i < m; i++) {
    nsrc *= ns;
    ndst *= nd;
  }
  static double dist[MAX_STATES];
  long group_examples = 0;
  for (int a = 0; a < nsrc; a++) {
    dt_placement src[DT_MAX_MESH_DIMS], dst[DT_MAX_MESH_DIMS];
    for (int i = 0, x = a; i < m; i++, x /= ns) src[i] = so[x % ns];
    bf_space b;
    bf_run(&l, src, &b, dist);
    for (int c = 0; c < ndst; c++) {
      for (int i = 0, x = c; i < m; i++, x /= nd) dst[i] = dopt[x % nd];
      dt_redist_plan g, mc;
      dt_status s1 = dt_redistribute_plan(NULL, &l, src, dst, DT_PLANNER_GREEDY, &g);
      dt_status s2 = dt_redistribute_plan(NULL, &l, src, dst, DT_PLANNER_MIN_COST, &mc);
      TU_CHECK(s1 == DT_OK && s2 == DT_OK, "sweep: plan rejected (%d, %d)", s1, s2);
      if (s1 != DT_OK || s2 != DT_OK) continue;
      st->pairs++;
      double gc = check_plan(&l, src, dst, &g, "greedy");
      double mcc = check_plan(&l, src, dst, &mc, "min-cost");
      TU_CHECK(g.planner == DT_PLANNER_GREEDY && mc.planner == DT_PLANNER_MIN_COST, "planner");
      TU_CHECK(mc.cost_us <= g.cost_us + 1e-9, "min-cost %.9g > greedy %.9g", mc.cost_us,
               g.cost_us);
      /* Optimality against the independent search: min-cost = min(greedy, optimum). */
      double opt = dist[bf_encode(&b, dst)];
      double want = opt < gc - COST_TOL * (1.0 + gc) ? opt : gc;
      char t[512];
      dt_redist_plan_trace(&mc, t, sizeof t);
      TU_CHECK(cost_close(mcc, want), "min-cost %.9g, expected min(greedy %.9g, optimum %.9g): %s",
               mcc, gc, opt, t);
      /* Ties keep greedy's steps. */
      if (cost_close(mcc, gc)) {
        bool same = mc.n == g.n;
        for (int k = 0; same && k < g.n; k++)
          same = mc.steps[k].mesh_dim == g.steps[k].mesh_dim &&
                 mc.steps[k].kind == g.steps[k].kind && peq(mc.steps[k].src, g.steps[k].src) &&
                 peq(mc.steps[k].dst, g.steps[k].dst);
        TU_CHECK(same, "min-cost tie does not keep the greedy steps: %s", t);
      } else {
        st->wins++;
        if (g.cost_us - mc.cost_us > st->best_gain) st->best_gain = g.cost_us - mc.cost_us;
        if (group_examples < EXAMPLES_PER_GROUP && g_examples_printed < EXAMPLES_TOTAL) {
          print_example(&l, &g, &mc);
          group_examples++;
          g_examples_printed++;
        }
      }
    }
  }
}

/* Targets holding a Partial: accepted iff every such dim has R or that same
 * Partial as source; accepted plans are checked as above (partition steps). */
static void sweep_partial_targets(int m, const int *ms, int ndim, const int64_t *gs, long *n) {
  dt_layout l = mk_layout(m, ms, ndim, gs);
  dt_placement o[MAX_OPTS];
  int no = 0;
  o[no++] = dt_replicate();
  for (int d = 0; d < ndim; d++) o[no++] = dt_shard(d);
  o[no++] = dt_partial(DT_RED_SUM);
  o[no++] = dt_partial(DT_RED_MAX);
  int tot = 1;
  for (int i = 0; i < m; i++) tot *= no;
  for (int a = 0; a < tot; a++)
    for (int c = 0; c < tot; c++) {
      dt_placement src[DT_MAX_MESH_DIMS], dst[DT_MAX_MESH_DIMS];
      bool ok = true, has_p = false;
      for (int i = 0, x = a, y = c; i < m; i++, x /= no, y /= no) {
        src[i] = o[x % no];
        dst[i] = o[y % no];
        if (dst[i].kind == DT_PL_PARTIAL) {
          has_p = true;
          if (!peq(src[i], dst[i]) && src[i].kind != DT_PL_REPLICATE) ok = false;
        }
      }
      if (!has_p) continue;
      for (int pl = 0; pl < 2; pl++) {
        dt_redist_plan p;
        dt_status s = dt_redistribute_plan(NULL, &l, src, dst, (dt_planner)pl, &p);
        TU_CHECK(s == (ok ? DT_OK : DT_ERR_INVALID), "partial target: status %d (ok %d)", s, ok);
        if (s == DT_OK) {
          (*n)++;
          check_plan(&l, src, dst, &p, pl ? "min-cost (P target)" : "greedy (P target)");
        }
      }
    }
}

typedef struct sweep_mesh {
  int m, ms[3];
} sweep_mesh;

static void test_sweeps(void) {
  const sweep_mesh meshes[] = {{1, {4}},       {2, {2, 2}}, {2, {2, 3}}, {2, {3, 2}},
                               {3, {2, 2, 2}}, {2, {1, 4}}, {3, {2, 1, 2}}};
  /* Small shapes (even, and an uneven one per rank: 7 and 5x3 do not divide by 2..4)
   * where latency dominates; big ones (64 MiB f32) where bandwidth does. */
  static const struct {
    int ndim;
    int64_t gs[3];
    const char *tag;
  } shapes[] = {
      {1, {8}, "small"},          {1, {7}, "small"},           {2, {8, 6}, "small"},
      {2, {5, 3}, "small"},       {3, {6, 4, 8}, "small"},     {1, {1 << 24}, "big"},
      {2, {4096, 4096}, "big"},   {3, {256, 256, 256}, "big"},
  };
  const dt_reduce_op sum[1] = {DT_RED_SUM};
  const dt_reduce_op three[3] = {DT_RED_SUM, DT_RED_AVG, DT_RED_MAX};
  printf("min-cost vs greedy (CPU topology; pairs = (src,dst) with src in {R,S(d),P}^m, "
         "dst in {R,S(d)}^m):\n");
  printf("  %-6s %-16s %5s %7s %6s %10s\n", "mesh", "shape", "kind", "pairs", "wins",
         "best gain");
  long tot_pairs = 0, tot_wins = 0;
  for (size_t mi = 0; mi < sizeof meshes / sizeof meshes[0]; mi++)
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
      sweep_stats st = {0};
      sweep(meshes[mi].m, meshes[mi].ms, shapes[si].ndim, shapes[si].gs, sum, 1, &st);
      dt_layout l = mk_layout(meshes[mi].m, meshes[mi].ms, shapes[si].ndim, shapes[si].gs);
      char ms[32], gs[64];
      mesh_str(&l, ms, sizeof ms);
      shape_str(&l, gs, sizeof gs);
      printf("  %-6s %-16s %5s %7ld %6ld %8.3fus\n", ms, gs, shapes[si].tag, st.pairs, st.wins,
             st.best_gain);
      tot_pairs += st.pairs;
      tot_wins += st.wins;
    }
  /* Sources with P(avg) / P(max) (and mixes) on two meshes. */
  for (int mi = 1; mi <= 2; mi++)
    for (size_t si = 2; si <= 3; si++) {
      sweep_stats st = {0};
      sweep(meshes[mi].m, meshes[mi].ms, shapes[si].ndim, shapes[si].gs, three, 3, &st);
      tot_pairs += st.pairs;
      tot_wins += st.wins;
      printf("  %dx%d   (P sum/avg/max)  small %7ld %6ld %8.3fus\n", meshes[mi].ms[0],
             meshes[mi].ms[1], st.pairs, st.wins, st.best_gain);
    }
  printf("  total: %ld pairs, min-cost strictly cheaper on %ld\n", tot_pairs, tot_wins);
  TU_CHECK(tot_pairs > 0, "sweeps ran");

  long np = 0;
  const int64_t g2[2] = {8, 6};
  for (int mi = 0; mi < 5; mi++) sweep_partial_targets(meshes[mi].m, meshes[mi].ms, 2, g2, &np);
  TU_CHECK(np > 0, "partial-target plans checked");

  /* DistributeWithDeviceOrderTest's example under min-cost (printed; greedy is
   * asserted above). */
  {
    const int m222[3] = {2, 2, 2};
    const int64_t g3[3] = {6, 4, 8};
    dt_layout l = mk_layout(3, m222, 3, g3);
    dt_placement src[3], dst[3];
    parse_pl("S(0),S(0),S(0)", 3, src);
    parse_pl("S(1),S(1),S(1)", 3, dst);
    dt_redist_plan g, mc;
    TU_OK(NULL, dt_redistribute_plan(NULL, &l, src, dst, DT_PLANNER_GREEDY, &g));
    TU_OK(NULL, dt_redistribute_plan(NULL, &l, src, dst, DT_PLANNER_MIN_COST, &mc));
    check_plan(&l, src, dst, &mc, "min-cost DistributeWithDeviceOrderTest");
    printf("DistributeWithDeviceOrderTest example:\n");
    print_example(&l, &g, &mc);
  }
}

/* The largest search (5 mesh dims, 8 tensor dims: 9^5 states) stays valid and quick. */
static void test_large_search(void) {
  const int ms[5] = {2, 2, 2, 2, 2};
  const int64_t gs[8] = {16, 16, 16, 16, 16, 16, 16, 16};
  dt_layout l = mk_layout(5, ms, 8, gs);
  const char *pairs[][2] = {
      {"S(0),S(0),S(0),S(0),S(0)", "S(7),S(7),S(7),S(7),S(7)"},
      {"S(0),S(1),S(2),S(3),S(4)", "S(4),S(3),S(2),S(1),S(0)"},
      {"P(sum),S(1),P(sum),S(1),S(2)", "S(1),S(1),R,S(2),S(1)"},
  };
  clock_t t0 = clock();
  for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
    dt_placement src[5], dst[5];
    parse_pl(pairs[k][0], 5, src);
    parse_pl(pairs[k][1], 5, dst);
    dt_redist_plan g, mc;
    TU_OK(NULL, dt_redistribute_plan(NULL, &l, src, dst, DT_PLANNER_GREEDY, &g));
    TU_OK(NULL, dt_redistribute_plan(NULL, &l, src, dst, DT_PLANNER_MIN_COST, &mc));
    check_plan(&l, src, dst, &g, "greedy 5-D");
    check_plan(&l, src, dst, &mc, "min-cost 5-D");
    TU_CHECK(mc.cost_us <= g.cost_us + 1e-9, "5-D min-cost <= greedy");
  }
  double sec = (double)(clock() - t0) / CLOCKS_PER_SEC;
  printf("5-D searches (2^5 mesh, 8-d tensor): %zu pairs in %.3f s\n",
         sizeof pairs / sizeof pairs[0], sec);
}

int main(int argc, char **argv) {
  tu_opts o;
  tu_parse(argc, argv, &o);
  test_greedy_table();
  test_cost();
  test_rejections();
  test_sweeps();
  test_large_search();
  return tu_finish("test_plan");
}
