/* verify/test_redistribute.c: DTensor creation, conversion and redistribute
 * (lib/dtensor) on real ranks, against references computed here.
 *
 * References. The global tensor of a case is G[i] = ((7 i + seed) mod 13) - 6 over
 * the flat row-major index i: small integers, exact in f32, f64 and bf16, so sums,
 * max and min are exact whatever the reduction order. Shard geometry is this
 * file's own naive torch.chunk, mesh dims applied left to right (ref_geom); mesh
 * coordinates are row-major over the rank (init_device_mesh lays the ranks out
 * as torch.arange(world).view(shape), torch/distributed/device_mesh.py). Partial
 * sources are built per rank so that the reduction over every Partial mesh dim
 * gives G exactly (make_local): sum: v - (n-1) w on one "holder" coordinate and w
 * elsewhere; max/min: v on the holder, smaller/larger elsewhere; avg: v everywhere.
 * A Partial that the target keeps is checked against make_local reduced (by
 * enumeration) over the mesh dims the target does reduce (want_local).
 *
 * What it checks, with --backend threads (default): meshes (1), (4), (3), (2,2),
 * (2,3), (4,1), (2,2,2), (2,1,3), (2,2,2,2), (2,2,2,2,2) (32 ranks); two (2,2)
 * meshes over interleaved halves of 8 ranks (mesh index != world rank); 1-D and
 * 2-D slices and a flattened dim of bigger meshes (group names tp, dp, dp_tp).
 * Tensors of rank 0..3: even, uneven, empty (a 0 dim) and smaller-than-the-mesh
 * dims, and a few bigger ones. For every (src, dst) in {R, S(0..r-1), P(sum)}^m x
 * {R, S(0..r-1)}^m on the 1-3-D meshes (a deterministic sample on 4-D, 5-D and the
 * bigger shapes):
 *   (a) dt_tensor_full of the result equals G;
 *   (b) the result's local shard, shape, global offset, placements equal the
 *       reference, and it owns its data;
 *   (c) the ledger rows the redistribute added are exactly the collectives of
 *       the communicating steps of dt_redistribute_plan(same inputs), in order
 *       (steps on size-1 mesh dims and chunk/partition steps issue none), with the
 *       mesh dim's name as group, its size, the dtype, the Partial's reduce op and
 *       the padded element count (ref_step_elems); the
 *       plan is also checked structurally (each step starts where the last left
 *       its mesh dim, its kind matches (src, dst), the steps end at dst);
 *   (d) the source is unchanged and host memory returns to its start.
 * On a subset of pairs: the min-cost planner (half through dt_redistribute_run),
 * f64 and bf16, P(avg|max|min) sources, a source Partial kept in the target,
 * negative shard dims in the arguments. Per placement list over {R, S, P} on the
 * 1-3-D meshes: dt_tensor_distribute (every rank holds G), dt_tensor_scatter_from
 * (G only on a non-zero rank), dt_tensor_rand (against dt_rng_uniform /
 * dt_rng_normal on the global index, and bitwise against the all-Replicate
 * layout): local shards and full_tensor; R -> P(op) (local partition). Errors:
 * dt_tensor_from_local with a wrong local shape (DT_ERR_INVALID naming the dim and
 * both sizes) or rank; gshape NULL inferred as local x mesh size on sharded dims;
 * redistribute S -> P, P(x) -> P(y), S(ndim) refused on every rank with no
 * collective; scatter_from a rank outside the mesh refused.
 * With --backend mpi (under mpirun): the same kinds of checks on 1-D (every pair),
 * 2-D and 3-D meshes whose size is the world. --quick (implied when SB_SANITIZER
 * is thread): about an eighth of the pairs.
 * What it is not: a test of the planners' choices (test_plan) or a benchmark.
 */
#include "config.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

enum { MAXM = DT_MAX_MESH_DIMS, MAXR = 3, MAXSH = 12 };

/* ---- configuration ------------------------------------------------------------- */

typedef struct shape_cfg {
  int ndim;
  int64_t g[MAXR];
} shape_cfg;

#define SH0 {0, {0, 0, 0}}
#define SH1(a) {1, {a, 0, 0}}
#define SH2(a, b) {2, {a, b, 0}}
#define SH3(a, b, c) {3, {a, b, c}}

typedef struct mesh_cfg {
  const char *label; /* for the summary */
  int ndim;
  int shape[MAXM];
  const char *names[MAXM];
  int nshapes;
  shape_cfg shapes[MAXSH];
  /* pairs per shape by tensor rank (index 0..3): -1 all, else a deterministic
   * sample of about that many */
  long want[MAXR + 1];
  /* of the pairs run, per mille also run with: the min-cost planner, f64, bf16,
   * and (for sources with a Partial, twice) P(avg|max|min) instead of P(sum), and
   * a Partial kept in the target */
  int mincost_pm, f64_pm, bf16_pm, pop_pm;
  bool creation; /* distribute / scatter_from / rand / from_local for every list */
  /* > 1: the world is `split` interleaved copies of the mesh (mesh k holds the
   * world ranks r with r % split == k), each over a communicator split from the
   * world, so mesh indices and world ranks differ */
  int split;
  /* nonzero: the tensors live on a view of the mesh above: the slice over these
   * dims (bit i = dim i), or with flatten the flattened slice (one dim named by
   * joining the names with "_", a communicator of its own) */
  unsigned view;
  bool flatten;
} mesh_cfg;

typedef struct stats {
  long pairs, mincost, f64, bf16, pop, keep, lists, topart;
  double seconds;
} stats;

typedef struct job {
  const mesh_cfg *mc;
  stats st;       /* written by rank 0 only */
  bool quick;
} job;

/* ---- small helpers ---------------------------------------------------------------- */

static uint64_t mix(uint64_t x) { /* splitmix64 finaliser: the sampling hash */
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static const char *red_name(dt_reduce_op op) {
  switch (op) {
    case DT_RED_SUM: return "sum";
    case DT_RED_AVG: return "avg";
    case DT_RED_MAX: return "max";
    case DT_RED_MIN: return "min";
    default: return "?";
  }
}

static const char *coll_name(int op) {
  switch (op) {
    case DT_COLL_ALL_REDUCE: return "all_reduce";
    case DT_COLL_ALL_GATHER: return "all_gather";
    case DT_COLL_REDUCE_SCATTER: return "reduce_scatter";
    case DT_COLL_ALL_TO_ALL: return "all_to_all";
    case DT_COLL_BROADCAST: return "broadcast";
    case DT_COLL_SCATTER: return "scatter";
    default: return "other";
  }
}

/* Our own formatter (messages never depend on the code under test). */
static void fmt_pl(char *buf, size_t n, int m, const dt_placement *pl) {
  size_t pos = 0;
  buf[0] = '\0';
  for (int i = 0; i < m && pos + 16 < n; i++) {
    const char *sep = i ? "," : "";
    if (pl[i].kind == DT_PL_SHARD)
      pos += (size_t)snprintf(buf + pos, n - pos, "%sS(%d)", sep, pl[i].dim);
    else if (pl[i].kind == DT_PL_REPLICATE)
      pos += (size_t)snprintf(buf + pos, n - pos, "%sR", sep);
    else
      pos += (size_t)snprintf(buf + pos, n - pos, "%sP(%s)", sep, red_name(pl[i].op));
  }
}

static void fmt_i64(char *buf, size_t n, int k, const int64_t *v) {
  size_t pos = 0;
  buf[0] = '\0';
  for (int i = 0; i < k && pos + 24 < n; i++)
    pos += (size_t)snprintf(buf + pos, n - pos, i ? ",%lld" : "%lld", (long long)v[i]);
}

static bool ref_eq(dt_placement a, dt_placement b) {
  if (a.kind != b.kind) return false;
  if (a.kind == DT_PL_SHARD) return a.dim == b.dim;
  if (a.kind == DT_PL_PARTIAL) return a.op == b.op;
  return true;
}

static void set_el(dt_dtype t, void *p, int64_t i, double v) {
  if (t == DT_F32) ((float *)p)[i] = (float)v;
  else if (t == DT_F64) ((double *)p)[i] = v;
  else ((dt_bf16 *)p)[i] = dt_f32_to_bf16((float)v);
}

static double get_el(dt_dtype t, const void *p, int64_t i) {
  if (t == DT_F32) return ((const float *)p)[i];
  if (t == DT_F64) return ((const double *)p)[i];
  return dt_bf16_to_f32(((const dt_bf16 *)p)[i]);
}

/* A value as the dtype stores it. */
static double in_dtype(dt_dtype t, double v) {
  if (t == DT_F32) return (float)v;
  if (t == DT_F64) return v;
  return dt_bf16_to_f32(dt_f32_to_bf16((float)v));
}

/* Spacing of the dtype relative to a value: ulp(v) <= rel * |v|. */
static double ulp_rel(dt_dtype t) {
  return t == DT_F64 ? 0x1p-52 : t == DT_F32 ? 0x1p-23 : 0x1p-7;
}

static bool close_to(dt_dtype t, double got, double want, int ulps) {
  if (ulps == 0) return got == want;
  return fabs(got - want) <= ulps * ulp_rel(t) * fabs(want);
}

static bool pow2(int n) { return n > 0 && (n & (n - 1)) == 0; }

static bool one_line_msg(const char *s) { return s && s[0] && !strchr(s, '\n'); }

/* The global value: small integers in -6..6. */
static double gval(int seed, int64_t flat) { return (double)((flat * 7 + seed) % 13) - 6.0; }

/* torch.chunk of L over n, piece k. */
static void ref_chunk(int64_t L, int n, int k, int64_t *size, int64_t *off) {
  int64_t c = (L + n - 1) / n;
  int64_t lo = (int64_t)k * c, hi = (int64_t)(k + 1) * c;
  if (hi > L) hi = L;
  *size = hi - lo > 0 ? hi - lo : 0;
  *off = lo < L ? lo : L;
}

/* Local shape and global offset at coordinates c: mesh dims left to right, each
 * Shard re-chunking the local piece (R and P keep it). */
static void ref_geom(int ndim, const int64_t *g, int m, const int *ms, const int *c,
                     const dt_placement *pl, int64_t *lshape, int64_t *off) {
  for (int d = 0; d < ndim; d++) {
    lshape[d] = g[d];
    off[d] = 0;
  }
  for (int i = 0; i < m; i++) {
    if (pl[i].kind != DT_PL_SHARD) continue;
    int d = pl[i].dim;
    int64_t sz, o;
    ref_chunk(lshape[d], ms[i], c[i], &sz, &o);
    lshape[d] = sz;
    off[d] += o;
  }
}

static int64_t numel_of(int ndim, const int64_t *s) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= s[d];
  return n;
}

/* Global flat index of local element j of a shard (lshape at off) of g. */
static int64_t gflat(int ndim, const int64_t *g, const int64_t *lshape, const int64_t *off,
                     int64_t j) {
  int64_t flat = 0, stride = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    int64_t idx = j % lshape[d];
    j /= lshape[d];
    flat += (off[d] + idx) * stride;
    stride *= g[d];
  }
  return flat;
}

/* Per-rank value of a source element whose global value is v, for placements pl at
 * coordinates c: reducing it over every Partial mesh dim (any order) gives v. */
static double make_local(double v, int64_t flat, int m, const int *ms, const int *c,
                         const dt_placement *pl) {
  for (int i = 0; i < m; i++) {
    if (pl[i].kind != DT_PL_PARTIAL) continue;
    int n = ms[i];
    bool holder = c[i] == (int)((flat + i) % n);
    double w = (double)((flat * 3 + i * 5 + 1) % 7) - 3.0; /* -3..3 */
    double k = (double)((flat + i) % 3);                   /* 0..2 */
    switch (pl[i].op) {
      case DT_RED_SUM: v = holder ? v - (n - 1) * w : w; break;
      case DT_RED_MAX: v = holder ? v : v - 1 - k; break;
      case DT_RED_MIN: v = holder ? v : v + 1 + k; break;
      default: break; /* avg: every rank holds v */
    }
  }
  return v;
}

/* ---- per-rank state ------------------------------------------------------------------ */

typedef struct rk {
  dt_ctx *ctx;
  dt_mesh *root;  /* the mesh created (owns mesh when mesh is a view of it) */
  dt_mesh *mesh;  /* the mesh the tensors live on */
  const char *names[MAXM]; /* its dim names (the ledger's group names) */
  char fname[DT_MESH_NAME_LEN * MAXM];
  int rc[MAXM];   /* coordinates in root */
  dt_comm *base; /* the communicator the mesh is over (the world, or a split of it) */
  const mesh_cfg *mc;
  int m;
  int ms[MAXM];
  int c[MAXM];
  char mdesc[200];
  dt_status fatal; /* a library call that may have left peers in a collective failed */
} rk;

/* A failure naming mesh, case and rank (and the line of the check). */
static void cfail_at(int line, const rk *R, const char *cs, const char *fmt, ...)
    DT_PRINTF(4, 5);
static void cfail_at(int line, const rk *R, const char *cs, const char *fmt, ...) {
  char msg[700];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  tu_fail(__FILE__, line, "mesh %s, %s, rank %d: %s", R->mdesc, cs, R->ctx->rank, msg);
}
#define cfail(R, cs, ...) cfail_at(__LINE__, R, cs, __VA_ARGS__)

/* A status check; a non-OK status from a call that communicates makes the rank
 * stop (the launcher then aborts its peers instead of letting them hang). It
 * counts one check (tu_count), as do check_slice, check_meta, check_plan and
 * check_ledger: tu_finish fails a run in which none ran. */
static bool ok_or_fail_at(int line, rk *R, const char *cs, const char *call, dt_status s,
                          bool comm) {
  tu_count();
  if (s == DT_OK) return true;
  cfail_at(line, R, cs, "%s -> %s: %s", call, dt_status_str(s), dt_last_error(R->ctx));
  if (comm && R->fatal == DT_OK) R->fatal = s;
  dt_error_clear(R->ctx);
  return false;
}
#define ok_or_fail(R, cs, call, s, comm) ok_or_fail_at(__LINE__, R, cs, call, s, comm)

/* Compares an array against the slice (lshape at off) of the reference global
 * tensor, where element value = want(flat); tolerance ulps (0: exact). */
typedef double (*want_fn)(const void *arg, int64_t flat);

/* a itself when it is host memory, else a host copy of it in *tmp (freed by
 * the caller with dt_array_free; tmp->data NULL when none was made); NULL when
 * the download fails (reported). */
static const dt_array *host_view(const rk *R, const char *cs, const dt_array *a, dt_array *tmp);

static void check_slice(const rk *R, const char *cs, const char *what, const dt_array *a,
                        dt_dtype dt, int ndim, const int64_t *g, const int64_t *lshape,
                        const int64_t *off, want_fn want, const void *warg, int ulps) {
  if (a->dev != DT_DEV_CPU) {
    dt_array h;
    const dt_array *v = host_view(R, cs, a, &h);
    if (v) check_slice(R, cs, what, v, dt, ndim, g, lshape, off, want, warg, ulps);
    dt_array_free(R->ctx, &h);
    return;
  }
  tu_count();
  bool shape_ok = a->ndim == ndim && a->dtype == dt;
  for (int d = 0; shape_ok && d < ndim; d++) shape_ok = a->shape[d] == lshape[d];
  if (!shape_ok) {
    char s1[64], s2[64];
    fmt_i64(s1, sizeof s1, a->ndim, a->shape);
    fmt_i64(s2, sizeof s2, ndim, lshape);
    cfail(R, cs, "%s has shape [%s] dtype %s, expected [%s] dtype %s", what, s1,
          dt_dtype_name(a->dtype), s2, dt_dtype_name(dt));
    return;
  }
  int64_t n = numel_of(ndim, lshape), bad = 0, first = -1;
  double fg = 0, fw = 0;
  if (n > 0 && !a->data) {
    cfail(R, cs, "%s has no data", what);
    return;
  }
  for (int64_t j = 0; j < n; j++) {
    int64_t f = gflat(ndim, g, lshape, off, j);
    double w = in_dtype(dt, want(warg, f)), got = get_el(dt, a->data, j);
    if (!close_to(dt, got, w, ulps)) {
      if (!bad) {
        first = f;
        fg = got;
        fw = w;
      }
      bad++;
    }
  }
  if (bad)
    cfail(R, cs, "%s: %lld of %lld elements differ (tolerance %d ulps), first at global flat "
          "index %lld: %.9g, expected %.9g",
          what, (long long)bad, (long long)n, ulps, (long long)first, fg, fw);
}

static const dt_array *host_view(const rk *R, const char *cs, const dt_array *a, dt_array *tmp) {
  memset(tmp, 0, sizeof *tmp);
  if (a->dev == DT_DEV_CPU) return a;
  dt_status s = tu_host_copy(R->ctx, a, tmp);
  if (s != DT_OK) {
    cfail(R, cs, "download of a device shard -> %s: %s", dt_status_str(s), dt_last_error(R->ctx));
    return NULL;
  }
  return tmp;
}

static double want_g(const void *arg, int64_t flat) { return gval(*(const int *)arg, flat); }

/* Checks the metadata of a DTensor against the reference geometry. */
static void check_meta(const rk *R, const char *cs, const char *what, const dt_tensor *t,
                       const dt_placement *pl, int ndim, const int64_t *g, dt_dtype dt) {
  /* the shard lives on the rank's compute device (SB_TEST_DEVICE) */
  dt_device_kind home = R->ctx->device ? R->ctx->device->kind : DT_DEV_CPU;
  TU_CHECK(t->local.dev == home, "%s %s: the local shard is on device kind %d, the rank computes on %d",
           cs, what, (int)t->local.dev, (int)home);
  tu_count();
  int64_t ls[DT_MAX_DIMS], off[DT_MAX_DIMS];
  ref_geom(ndim, g, R->m, R->ms, R->c, pl, ls, off);
  bool ok = t->mesh == R->mesh && t->mesh_ndim == R->m && t->ndim == ndim && t->dtype == dt;
  for (int i = 0; ok && i < R->m; i++) ok = ref_eq(t->pl[i], pl[i]);
  for (int d = 0; ok && d < ndim; d++) ok = t->gshape[d] == g[d] && t->goffset[d] == off[d];
  if (!ok) {
    char a[96], b[96], s1[64], s2[64], o1[64], o2[64];
    fmt_pl(a, sizeof a, t->mesh_ndim > 0 && t->mesh_ndim <= MAXM ? t->mesh_ndim : 0, t->pl);
    fmt_pl(b, sizeof b, R->m, pl);
    fmt_i64(s1, sizeof s1, t->ndim > 0 && t->ndim <= DT_MAX_DIMS ? t->ndim : 0, t->gshape);
    fmt_i64(s2, sizeof s2, ndim, g);
    fmt_i64(o1, sizeof o1, t->ndim > 0 && t->ndim <= DT_MAX_DIMS ? t->ndim : 0, t->goffset);
    fmt_i64(o2, sizeof o2, ndim, off);
    cfail(R, cs,
          "%s metadata: mesh %s, mesh_ndim %d, placements %s, gshape [%s], offset [%s], "
          "dtype %s; expected mesh_ndim %d, %s, [%s], [%s], %s",
          what, t->mesh == R->mesh ? "ok" : "WRONG", t->mesh_ndim, a, s1, o1,
          dt_dtype_name(t->dtype), R->m, b, s2, o2, dt_dtype_name(dt));
  }
  const dt_array *loc = dt_tensor_local(t);
  if (loc != &t->local) cfail(R, cs, "%s: dt_tensor_local does not return the local shard", what);
}

/* ---- plan and ledger --------------------------------------------------------------- */

/* The step kind (src -> dst) implies; -1 for a no-op or impossible step. */
static int ref_step_kind(dt_placement s, dt_placement d) {
  if (ref_eq(s, d)) return -1;
  if (s.kind == DT_PL_SHARD && d.kind == DT_PL_REPLICATE) return DT_STEP_ALL_GATHER;
  if (s.kind == DT_PL_PARTIAL && d.kind == DT_PL_REPLICATE) return DT_STEP_ALL_REDUCE;
  if (s.kind == DT_PL_PARTIAL && d.kind == DT_PL_SHARD) return DT_STEP_REDUCE_SCATTER;
  if (s.kind == DT_PL_SHARD && d.kind == DT_PL_SHARD) return DT_STEP_ALL_TO_ALL;
  if (s.kind == DT_PL_REPLICATE && d.kind == DT_PL_SHARD) return DT_STEP_CHUNK;
  if (s.kind == DT_PL_REPLICATE && d.kind == DT_PL_PARTIAL) return DT_STEP_PARTITION;
  return -1;
}

/* The collective a step issues (our own table); -1 for local steps. */
static int ref_step_coll(int kind) {
  switch (kind) {
    case DT_STEP_ALL_GATHER: return DT_COLL_ALL_GATHER;
    case DT_STEP_ALL_REDUCE: return DT_COLL_ALL_REDUCE;
    case DT_STEP_REDUCE_SCATTER: return DT_COLL_REDUCE_SCATTER;
    case DT_STEP_ALL_TO_ALL: return DT_COLL_ALL_TO_ALL;
    default: return -1;
  }
}

static void fmt_plan(char *buf, size_t n, const dt_redist_plan *p) {
  size_t pos = 0;
  buf[0] = '\0';
  for (int k = 0; k < p->n && k < DT_MAX_STEPS && pos + 48 < n; k++) {
    char a[24], b[24];
    fmt_pl(a, sizeof a, 1, &p->steps[k].src);
    fmt_pl(b, sizeof b, 1, &p->steps[k].dst);
    pos += (size_t)snprintf(buf + pos, n - pos, "%s%d: %s->%s", k ? ", " : "", p->steps[k].mesh_dim,
                            a, b);
  }
}

/* Structural check of a plan: each step starts from the current placement of its
 * mesh dim, its kind matches (src, dst), and the steps end at dst. */
static void check_plan(const rk *R, const char *cs, const dt_redist_plan *p, int ndim,
                       const dt_placement *src, const dt_placement *dst, dt_planner planner) {
  tu_count();
  char ps[512];
  fmt_plan(ps, sizeof ps, p);
  if (p->n < 0 || p->n > DT_MAX_STEPS || p->mesh_ndim != R->m || p->ndim != ndim ||
      p->planner != planner) {
    cfail(R, cs, "plan header: n %d, mesh_ndim %d, ndim %d, planner %d", p->n, p->mesh_ndim,
          p->ndim, (int)p->planner);
    return;
  }
  for (int i = 0; i < R->m; i++)
    if (!ref_eq(p->src[i], src[i]) || !ref_eq(p->dst[i], dst[i])) {
      cfail(R, cs, "plan src/dst placements differ from the request at mesh dim %d", i);
      break;
    }
  dt_placement cur[MAXM];
  memcpy(cur, src, sizeof(dt_placement) * (size_t)R->m);
  for (int k = 0; k < p->n; k++) {
    const dt_redist_step *s = &p->steps[k];
    if (s->mesh_dim < 0 || s->mesh_dim >= R->m) {
      cfail(R, cs, "plan [%s]: step %d on mesh dim %d", ps, k, s->mesh_dim);
      return;
    }
    if (!ref_eq(s->src, cur[s->mesh_dim])) {
      cfail(R, cs, "plan [%s]: step %d starts from a placement mesh dim %d does not have", ps, k,
            s->mesh_dim);
      return;
    }
    int kind = ref_step_kind(s->src, s->dst);
    if (kind < 0 || kind != (int)s->kind) {
      cfail(R, cs, "plan [%s]: step %d has kind %d, expected %d", ps, k, (int)s->kind, kind);
      return;
    }
    if (s->dst.kind == DT_PL_SHARD && (s->dst.dim < 0 || s->dst.dim >= ndim)) {
      cfail(R, cs, "plan [%s]: step %d shards dim %d", ps, k, s->dst.dim);
      return;
    }
    cur[s->mesh_dim] = s->dst;
  }
  for (int i = 0; i < R->m; i++)
    if (!ref_eq(cur[i], dst[i])) {
      cfail(R, cs, "plan [%s] does not end at the target (mesh dim %d)", ps, i);
      return;
    }
}

/* Elements the ledger row of a communicating step records: the total array size
 * S of nccl-tests (doc/PERFORMANCE.md of NVIDIA/nccl-tests; for AG and RS,
 * count per rank x n), with the padding PyTorch's Shard collectives really move
 * (each shard padded to c: Shard._to_replicate_tensor, _reduce_shard_tensor,
 * _to_new_shard_dim in torch/distributed/tensor/placement_types.py): L is the
 * logical size of the tensor dim as mesh dim i sees it (after the shardings of the
 * mesh dims before i, in the current state), c = ceil(L/n), rest the product of
 * the local tensor's other dims. AG: n*c*rest; RS: n*c*rest; AR: the local numel;
 * A2A S(a)->S(b): n * c_a * c_b * rest. */
static uint64_t ref_step_elems(const rk *R, int ndim, const int64_t *g, const dt_placement *cur,
                               const dt_redist_step *s) {
  int i = s->mesh_dim, n = R->ms[i];
  int64_t ls[DT_MAX_DIMS], lo[DT_MAX_DIMS], li[DT_MAX_DIMS], lio[DT_MAX_DIMS];
  ref_geom(ndim, g, R->m, R->ms, R->c, cur, ls, lo); /* the local shape now */
  ref_geom(ndim, g, i, R->ms, R->c, cur, li, lio);   /* the logical shape at mesh dim i */
  int a = -1, b = -1;
  switch (s->kind) {
    case DT_STEP_ALL_REDUCE: return (uint64_t)numel_of(ndim, ls);
    case DT_STEP_ALL_GATHER: a = s->src.dim; break;
    case DT_STEP_REDUCE_SCATTER: a = s->dst.dim; break;
    case DT_STEP_ALL_TO_ALL: a = s->src.dim; b = s->dst.dim; break;
    default: return 0;
  }
  int64_t count = (li[a] + n - 1) / n;
  if (b >= 0) count *= (li[b] + n - 1) / n;
  for (int e = 0; e < ndim; e++)
    if (e != a && e != b) count *= ls[e];
  return (uint64_t)count * (uint64_t)n;
}

/* The ledger rows [before, after) against the plan's communicating steps. */
static void check_ledger(const rk *R, const char *cs, const dt_redist_plan *p, size_t before,
                         dt_dtype dt, int ndim, const int64_t *g) {
  tu_count();
  const dt_ledger *l = dt_ledger_of(R->ctx);
  int exp_step[DT_MAX_STEPS], ne = 0;
  uint64_t exp_elems[DT_MAX_STEPS];
  dt_placement cur[MAXM];
  memcpy(cur, p->src, sizeof(dt_placement) * (size_t)R->m);
  for (int k = 0; k < p->n && k < DT_MAX_STEPS; k++) {
    const dt_redist_step *s = &p->steps[k];
    if (s->mesh_dim < 0 || s->mesh_dim >= R->m) return; /* reported by check_plan */
    int coll = ref_step_coll((int)s->kind);
    if (coll >= 0 && R->ms[s->mesh_dim] > 1) {
      exp_elems[ne] = ref_step_elems(R, ndim, g, cur, s);
      exp_step[ne++] = k;
    }
    cur[s->mesh_dim] = s->dst;
  }
  size_t got = l->n - before;
  bool ok = got == (size_t)ne;
  for (int e = 0; ok && e < ne; e++) {
    const dt_ledger_row *r = &l->rows[before + (size_t)e];
    const dt_redist_step *s = &p->steps[exp_step[e]];
    int coll = ref_step_coll((int)s->kind);
    ok = r->op == coll && strcmp(r->group, R->names[s->mesh_dim]) == 0 &&
         r->group_size == R->ms[s->mesh_dim];
    if (ok && (coll == DT_COLL_ALL_REDUCE || coll == DT_COLL_REDUCE_SCATTER))
      ok = r->reduce == (int)s->src.op;
    /* bf16 is storage only: a backend may move it as f32; f32/f64 move as is */
    if (ok && dt != DT_BF16) ok = r->dtype == (int)dt && r->elems == exp_elems[e];
  }
  if (ok) return;
  char es[600], gs[600], ps[512];
  size_t pos = 0;
  es[0] = gs[0] = '\0';
  for (int e = 0; e < ne && pos + 80 < sizeof es; e++) {
    const dt_redist_step *s = &p->steps[exp_step[e]];
    pos += (size_t)snprintf(es + pos, sizeof es - pos, "%s%s@%s(n=%d,S=%llu)", e ? " " : "",
                            coll_name(ref_step_coll((int)s->kind)), R->names[s->mesh_dim],
                            R->ms[s->mesh_dim], (unsigned long long)exp_elems[e]);
  }
  pos = 0;
  for (size_t k = before; k < l->n && pos + 96 < sizeof gs; k++)
    pos += (size_t)snprintf(gs + pos, sizeof gs - pos, "%s%s@%s(n=%d,S=%llu,red=%d,%s)",
                            k > before ? " " : "", coll_name(l->rows[k].op), l->rows[k].group,
                            l->rows[k].group_size, (unsigned long long)l->rows[k].elems,
                            l->rows[k].reduce, dt_dtype_name((dt_dtype)l->rows[k].dtype));
  fmt_plan(ps, sizeof ps, p);
  cfail(R, cs, "ledger has [%s], expected [%s] (plan [%s])", gs, es, ps);
}

/* ---- one redistribute case ------------------------------------------------------------ */

typedef struct pair_case {
  const shape_cfg *sh;
  dt_dtype dt;
  dt_placement src[MAXM], dst[MAXM];
  dt_planner planner;
  int seed;
  bool neg_dims;  /* pass S(d) as S(d - ndim) to from_local and dt_redistribute */
  bool run_plan;  /* run the plan with dt_redistribute_run instead of dt_redistribute */
} pair_case;

/* The per-rank value of element flat after redistributing src -> dst, where the
 * source was built with make_local: the src Partials that dst keeps stay as
 * make_local left them; the others are reduced, so the value is the reduction of
 * make_local over every coordinate of the reduced mesh dims (computed naively
 * here, by enumeration). G itself when dst keeps no Partial. */
typedef struct local_want {
  int seed, m;
  const int *ms, *c;
  const dt_placement *src, *dst;
} local_want;

static double want_local(const void *arg, int64_t flat) {
  const local_want *w = arg;
  double v = gval(w->seed, flat);
  int red[MAXM], nr = 0, combos = 1;
  dt_reduce_op op = DT_RED_SUM;
  for (int i = 0; i < w->m; i++)
    if (w->src[i].kind == DT_PL_PARTIAL && w->dst[i].kind != DT_PL_PARTIAL) {
      red[nr++] = i;
      combos *= w->ms[i];
      op = w->src[i].op; /* one op per source in this test */
    }
  int cc[MAXM];
  memcpy(cc, w->c, sizeof(int) * (size_t)w->m);
  double acc = 0;
  for (int k = 0; k < combos; k++) {
    for (int j = 0, e = k; j < nr; j++) {
      cc[red[j]] = e % w->ms[red[j]];
      e /= w->ms[red[j]];
    }
    double x = make_local(v, flat, w->m, w->ms, cc, w->src);
    if (k == 0) acc = x;
    else if (op == DT_RED_MAX) acc = x > acc ? x : acc;
    else if (op == DT_RED_MIN) acc = x < acc ? x : acc;
    else acc += x;
  }
  if (op == DT_RED_AVG) acc /= combos; /* combos equal values: exact */
  return acc;
}

/* S(d) -> S(d - ndim), the negative form PyTorch normalises. */
static void negate(int m, int ndim, const dt_placement *in, dt_placement *out) {
  for (int i = 0; i < m; i++) {
    out[i] = in[i];
    if (in[i].kind == DT_PL_SHARD) out[i].dim = in[i].dim - ndim;
  }
}

static void run_pair(rk *R, const pair_case *pc) {
  dt_ctx *ctx = R->ctx;
  const int ndim = pc->sh->ndim;
  const int64_t *g = pc->sh->g;
  char cs[320], a[96], b[96], gsd[48];
  fmt_pl(a, sizeof a, R->m, pc->src);
  fmt_pl(b, sizeof b, R->m, pc->dst);
  fmt_i64(gsd, sizeof gsd, ndim, g);
  snprintf(cs, sizeof cs, "shape [%s] %s %s%s%s, %s -> %s", gsd, dt_dtype_name(pc->dt),
           dt_planner_name(pc->planner), pc->run_plan ? " (dt_redistribute_run)" : "",
           pc->neg_dims ? " (negative dims)" : "", a, b);
  size_t mem0 = ctx->mem.host_cur;

  /* the source, from this rank's piece */
  int64_t ls[DT_MAX_DIMS], off[DT_MAX_DIMS];
  ref_geom(ndim, g, R->m, R->ms, R->c, pc->src, ls, off);
  dt_array piece;
  if (!ok_or_fail(R, cs, "dt_array_create",
                  dt_array_create(ctx, DT_DEV_CPU, pc->dt, ndim, ls, &piece), true))
    return;
  int64_t n = numel_of(ndim, ls);
  for (int64_t j = 0; j < n; j++) {
    int64_t f = gflat(ndim, g, ls, off, j);
    set_el(pc->dt, piece.data, j, make_local(gval(pc->seed, f), f, R->m, R->ms, R->c, pc->src));
  }
  dt_placement src_arg[MAXM], dst_arg[MAXM];
  if (pc->neg_dims) {
    negate(R->m, ndim, pc->src, src_arg);
    negate(R->m, ndim, pc->dst, dst_arg);
  } else {
    memcpy(src_arg, pc->src, sizeof(dt_placement) * (size_t)R->m);
    memcpy(dst_arg, pc->dst, sizeof(dt_placement) * (size_t)R->m);
  }
  dt_tensor t, out;
  memset(&t, 0, sizeof t);
  memset(&out, 0, sizeof out);
  if (!ok_or_fail(R, cs, "dt_tensor_from_local (consistent gshape)",
                  dt_tensor_from_local(ctx, R->mesh, &piece, src_arg, ndim, g, &t), true)) {
    dt_array_free(ctx, &piece);
    return;
  }
  check_meta(R, cs, "source", &t, pc->src, ndim, g, pc->dt);
  dt_layout lay, tl;
  memset(&lay, 0, sizeof lay);
  lay.mesh_ndim = R->m;
  for (int i = 0; i < R->m; i++) lay.mesh_shape[i] = R->ms[i];
  lay.ndim = ndim;
  for (int d = 0; d < ndim; d++) lay.gshape[d] = g[d];
  lay.dtype = pc->dt;
  dt_tensor_layout(&t, &tl);
  bool lay_ok = tl.mesh_ndim == lay.mesh_ndim && tl.ndim == lay.ndim && tl.dtype == lay.dtype;
  for (int i = 0; lay_ok && i < R->m; i++) lay_ok = tl.mesh_shape[i] == lay.mesh_shape[i];
  for (int d = 0; lay_ok && d < ndim; d++) lay_ok = tl.gshape[d] == lay.gshape[d];
  if (!lay_ok) cfail(R, cs, "dt_tensor_layout of the source differs from the mesh and shape");

  /* the plan (normalised placements, as its contract asks) */
  dt_redist_plan plan;
  memset(&plan, 0, sizeof plan);
  dt_status ps = dt_redistribute_plan(ctx, &lay, pc->src, pc->dst, pc->planner, &plan);
  bool have_plan = ok_or_fail(R, cs, "dt_redistribute_plan", ps, false);
  if (have_plan) check_plan(R, cs, &plan, ndim, pc->src, pc->dst, pc->planner);
  if (!have_plan && pc->run_plan) { /* every rank fails alike: the planner is pure */
    dt_tensor_free(ctx, &t);
    dt_array_free(ctx, &piece);
    return;
  }

  size_t before = dt_ledger_of(ctx)->n;
  dt_status s = pc->run_plan ? dt_redistribute_run(ctx, &t, &plan, &out)
                             : dt_redistribute(ctx, &t, dst_arg, pc->planner, &out);
  if (ok_or_fail(R, cs, pc->run_plan ? "dt_redistribute_run" : "dt_redistribute", s, true)) {
    if (have_plan) check_ledger(R, cs, &plan, before, pc->dt, ndim, g);
    /* (b) the result's shard */
    int tol = 0; /* exact: every value is a small integer and sums/max/min are exact */
    for (int i = 0; i < R->m; i++)
      if (pc->src[i].kind == DT_PL_PARTIAL && pc->src[i].op == DT_RED_AVG &&
          pc->dst[i].kind != DT_PL_PARTIAL && !pow2(R->ms[i]))
        tol += 3; /* avg = fl(fl(sum) * fl(1/n)): 1/n and the product each round (2 ulps),
                   * plus one for summing already-averaged values on a later dim */
    check_meta(R, cs, "result", &out, pc->dst, ndim, g, pc->dt);
    int64_t dls[DT_MAX_DIMS], doff[DT_MAX_DIMS];
    ref_geom(ndim, g, R->m, R->ms, R->c, pc->dst, dls, doff);
    local_want lw = {pc->seed, R->m, R->ms, R->c, pc->src, pc->dst};
    check_slice(R, cs, "result local shard", &out.local, pc->dt, ndim, g, dls, doff, want_local,
                &lw, tol);
    /* (d) the source is unchanged */
    dt_array th;
    const dt_array *tv = host_view(R, cs, &t.local, &th);
    bool same = tv && t.local.numel == piece.numel && t.local.dtype == piece.dtype &&
                (piece.numel == 0 || memcmp(tv->data, piece.data, dt_array_bytes(&piece)) == 0);
    dt_array_free(ctx, &th);
    for (int i = 0; same && i < R->m; i++) same = ref_eq(t.pl[i], pc->src[i]);
    if (!same) cfail(R, cs, "the source DTensor changed");
    /* (a) full_tensor */
    dt_array full;
    memset(&full, 0, sizeof full);
    if (ok_or_fail(R, cs, "dt_tensor_full", dt_tensor_full(ctx, &out, &full), true)) {
      int64_t zero[DT_MAX_DIMS] = {0};
      for (int i = 0; i < R->m; i++)
        if (pc->dst[i].kind == DT_PL_PARTIAL && pc->dst[i].op == DT_RED_AVG && !pow2(R->ms[i]))
          tol += 3; /* the kept P(avg) is reduced by full_tensor: as above */
      check_slice(R, cs, "full_tensor", &full, pc->dt, ndim, g, g, zero, want_g, &pc->seed, tol);
      dt_array_free(ctx, &full);
    }
    /* the result owns its data: overwriting it leaves the source alone */
    if (out.local.numel > 0 && out.local.data) {
      if (out.local.dev == DT_DEV_CPU)
        memset(out.local.data, 0x7f, dt_array_bytes(&out.local));
      else
        ok_or_fail(R, cs, "dt_device_fill",
                   dt_device_fill(ctx->device, DT_F64, out.local.data,
                                  (int64_t)(dt_array_bytes(&out.local) / 8), 1e300), true);
      tv = host_view(R, cs, &t.local, &th);
      if (tv && piece.numel > 0 && memcmp(tv->data, piece.data, dt_array_bytes(&piece)) != 0)
        cfail(R, cs, "the result's local shard aliases the source's");
      dt_array_free(ctx, &th);
    }
    dt_tensor_free(ctx, &out);
  }
  dt_tensor_free(ctx, &t);
  dt_array_free(ctx, &piece);
  if (ctx->mem.host_cur != mem0)
    cfail(R, cs, "host memory in use is %zu bytes after freeing everything, %zu before",
          ctx->mem.host_cur, mem0);
}

/* src option v of k = ndim + 2: 0 R, 1..ndim S(v-1), ndim+1 P(op); dst: k = ndim + 1. */
static dt_placement opt_pl(int v, int ndim, dt_reduce_op op) {
  if (v == 0) return dt_replicate();
  if (v <= ndim) return dt_shard(v - 1);
  return dt_partial(op);
}

static void run_pairs(rk *R, job *J, int si) {
  const mesh_cfg *mc = R->mc;
  const shape_cfg *sh = &mc->shapes[si];
  const int m = R->m, r = sh->ndim;
  const int ks = r + 2, kd = r + 1;
  long nsrc = 1, ndst = 1;
  for (int i = 0; i < m; i++) {
    nsrc *= ks;
    ndst *= kd;
  }
  long total = nsrc * ndst;
  long want = mc->want[r];
  if (J->quick) { /* an eighth, at least 8 */
    want = (want < 0 || want > total ? total : want) / 8;
    if (want < 8) want = 8;
  }
  /* keep a pair when its hash falls below ppm (parts per million) */
  uint64_t ppm = want < 0 || want >= total ? 1000000u : (uint64_t)(want * 1000000 / total);
  if (ppm == 0) ppm = 1;
  for (long idx = 0; idx < total && R->fatal == DT_OK; idx++) {
    uint64_t h = mix((uint64_t)idx * 1315423911u + (uint64_t)si * 2654435761u +
                     (uint64_t)m * 97u + (uint64_t)mc->shape[0] * 7919u);
    if (h % 1000000u >= ppm) continue;
    long sidx = idx / ndst, didx = idx % ndst;
    pair_case pc;
    memset(&pc, 0, sizeof pc);
    pc.sh = sh;
    pc.dt = DT_F32;
    pc.planner = DT_PLANNER_GREEDY;
    pc.seed = (int)(idx % 13);
    pc.neg_dims = (h >> 40) % 8 == 0; /* one in eight passes negative shard dims */
    bool has_p = false;
    long q = sidx, e = didx;
    for (int i = 0; i < m; i++) {
      pc.src[i] = opt_pl((int)(q % ks), r, DT_RED_SUM);
      has_p = has_p || pc.src[i].kind == DT_PL_PARTIAL;
      q /= ks;
      pc.dst[i] = opt_pl((int)(e % kd), r, DT_RED_SUM);
      e /= kd;
    }
    run_pair(R, &pc);
    if (R->ctx->rank == 0) J->st.pairs++;
    pc.neg_dims = false;
    uint64_t h2 = mix(h);
    if ((int)(h2 % 1000) < mc->mincost_pm && R->fatal == DT_OK) {
      pair_case v = pc;
      v.planner = DT_PLANNER_MIN_COST;
      v.run_plan = (h2 >> 32) % 2 == 0;
      run_pair(R, &v);
      if (R->ctx->rank == 0) J->st.mincost++;
    }
    h2 = mix(h2);
    if ((int)(h2 % 1000) < mc->f64_pm && R->fatal == DT_OK) {
      pair_case v = pc;
      v.dt = DT_F64;
      run_pair(R, &v);
      if (R->ctx->rank == 0) J->st.f64++;
    }
    h2 = mix(h2);
    if ((int)(h2 % 1000) < mc->bf16_pm && R->fatal == DT_OK) {
      pair_case v = pc;
      v.dt = DT_BF16;
      run_pair(R, &v);
      if (R->ctx->rank == 0) J->st.bf16++;
    }
    h2 = mix(h2);
    if (has_p && (int)(h2 % 1000) < mc->pop_pm && R->fatal == DT_OK) {
      static const dt_reduce_op ops[3] = {DT_RED_AVG, DT_RED_MAX, DT_RED_MIN};
      pair_case v = pc;
      dt_reduce_op op = ops[(h2 >> 20) % 3];
      for (int i = 0; i < m; i++)
        if (v.src[i].kind == DT_PL_PARTIAL) v.src[i].op = op;
      run_pair(R, &v);
      if (R->ctx->rank == 0) J->st.pop++;
    }
    h2 = mix(h2);
    if (has_p && (int)(h2 % 1000) < mc->pop_pm && R->fatal == DT_OK) {
      /* a Partial kept on its mesh dim (P -> P, a no-op there), the rest as before;
       * the op is sum or, every other time, avg/max/min */
      static const dt_reduce_op ops[4] = {DT_RED_SUM, DT_RED_AVG, DT_RED_MAX, DT_RED_MIN};
      pair_case v = pc;
      dt_reduce_op op = ops[(h2 >> 20) % 4];
      int kept = 0;
      for (int i = 0; i < m; i++)
        if (v.src[i].kind == DT_PL_PARTIAL) {
          v.src[i].op = op;
          if (kept++ % 2 == 0) v.dst[i] = v.src[i];
        }
      run_pair(R, &v);
      if (R->ctx->rank == 0) J->st.keep++;
    }
  }
}

/* Requests the planner must refuse, alike on every rank and before any
 * communication: S -> P, P(x) -> P(y), a shard dim out of range. Nothing leaks
 * and nothing is recorded in the ledger. */
static void run_refusals(rk *R, const shape_cfg *sh) {
  dt_ctx *ctx = R->ctx;
  const int m = R->m, ndim = sh->ndim;
  for (int i = 0; i < m && R->fatal == DT_OK; i++) {
    for (int kind = 0; kind < 3 && R->fatal == DT_OK; kind++) {
      dt_placement src[MAXM], dst[MAXM];
      for (int j = 0; j < m; j++) src[j] = dst[j] = dt_replicate();
      const char *what;
      if (kind == 0) {
        src[i] = dt_shard(0);
        dst[i] = dt_partial(DT_RED_SUM);
        what = "S(0) -> P(sum)";
      } else if (kind == 1) {
        src[i] = dt_partial(DT_RED_SUM);
        dst[i] = dt_partial(DT_RED_MAX);
        what = "P(sum) -> P(max)";
      } else {
        dst[i] = dt_shard(ndim);
        what = "R -> S(ndim)";
      }
      char cs[160], gsd[48];
      fmt_i64(gsd, sizeof gsd, ndim, sh->g);
      snprintf(cs, sizeof cs, "shape [%s], refused request %s on mesh dim %d", gsd, what, i);
      int64_t ls[DT_MAX_DIMS], off[DT_MAX_DIMS];
      ref_geom(ndim, sh->g, m, R->ms, R->c, src, ls, off);
      size_t mem0 = ctx->mem.host_cur;
      dt_array piece;
      if (!ok_or_fail(R, cs, "dt_array_create",
                      dt_array_create(ctx, DT_DEV_CPU, DT_F32, ndim, ls, &piece), true))
        return;
      if (piece.numel) memset(piece.data, 0, dt_array_bytes(&piece));
      dt_tensor t, out;
      memset(&t, 0, sizeof t);
      if (ok_or_fail(R, cs, "dt_tensor_from_local",
                     dt_tensor_from_local(ctx, R->mesh, &piece, src, ndim, sh->g, &t), true)) {
        size_t before = dt_ledger_of(ctx)->n;
        dt_status s = dt_redistribute(ctx, &t, dst, DT_PLANNER_GREEDY, &out);
        if (s != DT_ERR_INVALID) {
          cfail(R, cs, "dt_redistribute returned %s, expected invalid argument",
                dt_status_str(s));
          if (s == DT_OK) dt_tensor_free(ctx, &out);
        } else if (!one_line_msg(dt_last_error(ctx))) {
          cfail(R, cs, "the reason '%s' is not a non-empty single line", dt_last_error(ctx));
        }
        if (dt_ledger_of(ctx)->n != before)
          cfail(R, cs, "a refused redistribute recorded %zu collectives", dt_ledger_of(ctx)->n - before);
        dt_error_clear(ctx);
        dt_layout lay;
        dt_tensor_layout(&t, &lay);
        dt_redist_plan plan;
        s = dt_redistribute_plan(ctx, &lay, src, dst, DT_PLANNER_MIN_COST, &plan);
        if (s != DT_ERR_INVALID)
          cfail(R, cs, "min-cost dt_redistribute_plan returned %s, expected invalid argument",
                dt_status_str(s));
        dt_error_clear(ctx);
        dt_tensor_free(ctx, &t);
      }
      dt_array_free(ctx, &piece);
      if (ctx->mem.host_cur != mem0)
        cfail(R, cs, "host memory in use is %zu bytes after, %zu before", ctx->mem.host_cur,
              mem0);
    }
  }
}

/* R -> P(op) is a local partition (sum: v/n; avg, max, min: v), mixed with R -> S:
 * the result's shard, no collective, and full_tensor back to G. */
static void check_created(rk *R, const char *cs, const char *what, dt_tensor *t,
                          const dt_placement *pl, const shape_cfg *sh, dt_dtype dt, int seed);

static void run_to_partial(rk *R, job *J, const shape_cfg *sh) {
  dt_ctx *ctx = R->ctx;
  const int m = R->m, ndim = sh->ndim, k = ndim + 2;
  long total = 1;
  for (int i = 0; i < m; i++) total *= k;
  static const dt_reduce_op ops[4] = {DT_RED_SUM, DT_RED_AVG, DT_RED_MAX, DT_RED_MIN};
  for (long idx = 0; idx < total && R->fatal == DT_OK; idx++) {
    dt_placement src[MAXM], dst[MAXM];
    long q = idx;
    bool has_p = false;
    for (int i = 0; i < m; i++) {
      src[i] = dt_replicate();
      dst[i] = opt_pl((int)(q % k), ndim, ops[idx % 4]);
      has_p = has_p || dst[i].kind == DT_PL_PARTIAL;
      q /= k;
    }
    if (!has_p) continue;
    int seed = (int)(idx % 13);
    char cs[200], a[96], gsd[48];
    fmt_pl(a, sizeof a, m, dst);
    fmt_i64(gsd, sizeof gsd, ndim, sh->g);
    snprintf(cs, sizeof cs, "shape [%s] f32 greedy, R -> %s", gsd, a);
    size_t mem0 = ctx->mem.host_cur;
    dt_array glob;
    if (!ok_or_fail(R, cs, "dt_array_create",
                    dt_array_create(ctx, DT_DEV_CPU, DT_F32, ndim, sh->g, &glob), true))
      return;
    for (int64_t j = 0; j < glob.numel; j++) set_el(DT_F32, glob.data, j, gval(seed, j));
    dt_tensor t, out;
    memset(&t, 0, sizeof t);
    if (ok_or_fail(R, cs, "dt_tensor_from_local",
                   dt_tensor_from_local(ctx, R->mesh, &glob, src, ndim, sh->g, &t), true)) {
      dt_layout lay;
      dt_tensor_layout(&t, &lay);
      dt_redist_plan plan;
      bool have_plan = ok_or_fail(
          R, cs, "dt_redistribute_plan",
          dt_redistribute_plan(ctx, &lay, src, dst, DT_PLANNER_GREEDY, &plan), false);
      if (have_plan) check_plan(R, cs, &plan, ndim, src, dst, DT_PLANNER_GREEDY);
      size_t before = dt_ledger_of(ctx)->n;
      if (ok_or_fail(R, cs, "dt_redistribute",
                     dt_redistribute(ctx, &t, dst, DT_PLANNER_GREEDY, &out), true)) {
        if (have_plan) check_ledger(R, cs, &plan, before, DT_F32, ndim, sh->g);
        if (dt_ledger_of(ctx)->n != before)
          cfail(R, cs, "R -> S/P is local but recorded %zu collectives", dt_ledger_of(ctx)->n - before);
        check_created(R, cs, "R -> P", &out, dst, sh, DT_F32, seed);
        dt_tensor_free(ctx, &out);
      }
      dt_tensor_free(ctx, &t);
    }
    dt_array_free(ctx, &glob);
    if (ctx->mem.host_cur != mem0)
      cfail(R, cs, "host memory in use is %zu bytes after, %zu before", ctx->mem.host_cur, mem0);
    if (ctx->rank == 0) J->st.topart++;
  }
}

/* ---- creation: distribute, scatter_from, rand ------------------------------------------ */

typedef struct part_want {
  int seed;
  double div; /* the local value is G / div (distribute of P(sum)) */
} part_want;

static double want_div(const void *arg, int64_t flat) {
  const part_want *w = arg;
  return gval(w->seed, flat) / w->div;
}

typedef struct rng_want {
  uint64_t seed, stream;
  dt_rng_dist dist;
  double a, b;
  double zero; /* 1: the element is 0 (a non-holder of P(sum)) */
} rng_want;

static double want_rng(const void *arg, int64_t flat) {
  const rng_want *w = arg;
  if (w->zero != 0) return 0.0;
  double u = w->dist == DT_RNG_UNIFORM ? dt_rng_uniform(w->seed, w->stream, (uint64_t)flat)
                                       : dt_rng_normal(w->seed, w->stream, (uint64_t)flat);
  return w->a + w->b * u;
}

/* Tolerances of a placement list holding Partials created by partitioning:
 * *loc for the local value, *full for full_tensor. Exact (0) when every Partial
 * dim's size is a power of two: v/n and the sum of n copies of v/n are exact. */
static void partition_tol(const rk *R, const dt_placement *pl, int *loc, int *full) {
  *loc = *full = 0;
  for (int i = 0; i < R->m; i++) {
    if (pl[i].kind != DT_PL_PARTIAL || pow2(R->ms[i])) continue;
    if (pl[i].op == DT_RED_SUM) {
      *loc += 2;              /* v/n (or v * fl(1/n)): at most two roundings */
      *full += 2 + R->ms[i];  /* those, plus n-1 additions of about v/n, each <= 1 ulp of v */
    } else if (pl[i].op == DT_RED_AVG) {
      *full += 3;             /* avg of n equal values: fl(1/n), the product, and slack */
    }
  }
}

static void check_created(rk *R, const char *cs, const char *what, dt_tensor *t,
                          const dt_placement *pl, const shape_cfg *sh, dt_dtype dt, int seed) {
  dt_ctx *ctx = R->ctx;
  check_meta(R, cs, what, t, pl, sh->ndim, sh->g, dt);
  int64_t ls[DT_MAX_DIMS], off[DT_MAX_DIMS];
  ref_geom(sh->ndim, sh->g, R->m, R->ms, R->c, pl, ls, off);
  part_want pw = {seed, 1.0};
  for (int i = 0; i < R->m; i++)
    if (pl[i].kind == DT_PL_PARTIAL && pl[i].op == DT_RED_SUM) pw.div *= R->ms[i];
  int tl, tf;
  partition_tol(R, pl, &tl, &tf);
  char w[96];
  snprintf(w, sizeof w, "%s local shard", what);
  check_slice(R, cs, w, &t->local, dt, sh->ndim, sh->g, ls, off, want_div, &pw, tl);
  dt_array full;
  memset(&full, 0, sizeof full);
  if (ok_or_fail(R, cs, "dt_tensor_full", dt_tensor_full(ctx, t, &full), true)) {
    int64_t zero[DT_MAX_DIMS] = {0};
    snprintf(w, sizeof w, "%s full_tensor", what);
    check_slice(R, cs, w, &full, dt, sh->ndim, sh->g, sh->g, zero, want_g, &seed, tf);
    dt_array_free(ctx, &full);
  }
}

/* World rank of member q (row-major index) of the mesh the tensors live on. */
static int member_rank(const rk *R, int q) {
  const mesh_cfg *mc = R->mc;
  if (!mc->view) return R->base->world_ranks[q];
  int c[MAXM];
  memcpy(c, R->rc, sizeof c);
  for (int d = mc->ndim - 1; d >= 0; d--) /* the view's dims, innermost first */
    if (mc->view >> d & 1u) {
      c[d] = q % mc->shape[d];
      q /= mc->shape[d];
    }
  int idx = 0;
  for (int d = 0; d < mc->ndim; d++) idx = idx * mc->shape[d] + c[d];
  return R->base->world_ranks[idx];
}

/* The comm counts and paths of PyTorch's greedy planner asserted in
 * test/distributed/tensor/test_redistribute.py, end to end: the collectives the
 * greedy redistribute records, by op and mesh dim, in order; plus the greedy
 * trace of DistributeWithDeviceOrderTest (same file). Values are checked as
 * in run_pair. Runs on the (2,2) and (2,2,2) meshes. */
typedef struct oracle {
  int m;
  const char *src, *dst;
  const char *colls; /* "AG1 A2A0": op and mesh dim of each recorded collective */
} oracle;

static const oracle ORACLES[] = {
    {2, "S(0),S(1)", "S(0),S(0)", "A2A1"},
    {2, "S(0),S(1)", "S(1),S(0)", "AG1 A2A0"},
    {2, "S(0),S(0)", "S(1),S(1)", "AG1 A2A0"},
    {2, "S(0),S(2)", "S(1),S(0)", "AG1 A2A0"},
    {2, "S(1),S(1)", "S(1),S(2)", "A2A1"},
    {2, "P,P", "R,R", "AR0 AR1"},
    {2, "P,P", "S(0),S(0)", "RS0 RS1"},
    {3, "S(0),S(0),S(0)", "S(1),S(1),S(1)", "AG2 AG1 A2A0"},
    {3, "S(0),S(1),S(0)", "S(1),S(0),S(0)", "AG2 AG1 A2A0"},
    {3, "S(0),S(1),S(2)", "S(2),S(1),S(0)", "AG2 A2A0"},
    {3, "S(1),S(0),S(0)", "R,S(0),S(0)", "AG0"},
    {3, "S(1),R,S(0)", "R,S(0),S(0)", "AG2 AG0"},
    {3, "S(0),S(0),S(1)", "S(0),S(1),S(2)", "A2A2 A2A1"},
};

static void run_oracles(rk *R) {
  dt_ctx *ctx = R->ctx;
  if (R->mc->view || R->mc->split > 1) return;
  for (int i = 0; i < R->m; i++)
    if (R->ms[i] != 2) return;
  static const shape_cfg cube = SH3(8, 8, 8);
  for (size_t k = 0; k < sizeof ORACLES / sizeof ORACLES[0] && R->fatal == DT_OK; k++) {
    const oracle *o = &ORACLES[k];
    if (o->m != R->m) continue;
    pair_case pc;
    memset(&pc, 0, sizeof pc);
    pc.sh = &cube;
    pc.dt = DT_F32;
    pc.planner = DT_PLANNER_GREEDY;
    pc.seed = (int)k;
    int n1 = 0, n2 = 0;
    /* the examples are written in the parser's syntax: its own test covers it */
    if (dt_placements_parse(o->src, MAXM, pc.src, &n1, NULL, 0) != DT_OK ||
        dt_placements_parse(o->dst, MAXM, pc.dst, &n2, NULL, 0) != DT_OK || n1 != R->m ||
        n2 != R->m) {
      cfail(R, o->src, "cannot parse the oracle %s -> %s", o->src, o->dst);
      continue;
    }
    size_t before = dt_ledger_of(ctx)->n;
    run_pair(R, &pc); /* values, plan and ledger as every pair */
    if (R->fatal != DT_OK) return;
    /* the first rows after `before` are the redistribute's: run_pair then calls
     * dt_tensor_full (all_gathers) only; count the redistribute's from the plan */
    dt_layout lay;
    memset(&lay, 0, sizeof lay);
    lay.mesh_ndim = R->m;
    for (int i = 0; i < R->m; i++) lay.mesh_shape[i] = R->ms[i];
    lay.ndim = 3;
    for (int d = 0; d < 3; d++) lay.gshape[d] = 8;
    lay.dtype = DT_F32;
    dt_redist_plan plan;
    if (dt_redistribute_plan(ctx, &lay, pc.src, pc.dst, DT_PLANNER_GREEDY, &plan) != DT_OK) {
      cfail(R, o->src, "greedy plan %s -> %s failed: %s", o->src, o->dst, dt_last_error(ctx));
      dt_error_clear(ctx);
      continue;
    }
    int ncomm = 0;
    for (int j = 0; j < plan.n; j++) ncomm += ref_step_coll((int)plan.steps[j].kind) >= 0;
    char got[128] = "";
    size_t pos = 0;
    for (size_t r = before; r < before + (size_t)ncomm && r < dt_ledger_of(ctx)->n; r++) {
      const dt_ledger_row *row = &dt_ledger_of(ctx)->rows[r];
      const char *op = row->op == DT_COLL_ALL_GATHER ? "AG"
                       : row->op == DT_COLL_ALL_TO_ALL ? "A2A"
                       : row->op == DT_COLL_ALL_REDUCE ? "AR"
                       : row->op == DT_COLL_REDUCE_SCATTER ? "RS" : "?";
      int dim = -1;
      for (int i = 0; i < R->m; i++)
        if (!strcmp(row->group, R->names[i])) dim = i;
      pos += (size_t)snprintf(got + pos, sizeof got - pos, "%s%s%d", pos ? " " : "", op, dim);
    }
    if (strcmp(got, o->colls) != 0) {
      char cs[96];
      snprintf(cs, sizeof cs, "%s -> %s", o->src, o->dst);
      cfail(R, cs, "greedy redistribute recorded [%s], PyTorch's count/path is [%s]", got,
            o->colls);
    }
  }
  /* DistributeWithDeviceOrderTest: the greedy trace of S(0) on [0,1,2] -> S(1) on [0,1,2] */
  if (R->m == 3) {
    dt_layout lay;
    memset(&lay, 0, sizeof lay);
    lay.mesh_ndim = 3;
    for (int i = 0; i < 3; i++) lay.mesh_shape[i] = 2;
    lay.ndim = 2;
    lay.gshape[0] = lay.gshape[1] = 8;
    lay.dtype = DT_F32;
    dt_placement a[3] = {dt_shard(0), dt_shard(0), dt_shard(0)};
    dt_placement b[3] = {dt_shard(1), dt_shard(1), dt_shard(1)};
    dt_redist_plan plan;
    char tr[512] = "";
    if (dt_redistribute_plan(ctx, &lay, a, b, DT_PLANNER_GREEDY, &plan) == DT_OK)
      dt_redist_plan_trace(&plan, tr, sizeof tr);
    const char *want = "S(0)[0]S(0)[1]S(0)[2]->S(0)[0]S(0)[1]R->S(0)RR->S(1)RR->"
                       "S(1)[0]S(1)[1]R->S(1)[0]S(1)[1]S(1)[2]";
    if (strcmp(tr, want) != 0)
      cfail(R, "greedy trace (DistributeWithDeviceOrderTest)", "'%s', expected '%s'", tr, want);
    dt_error_clear(ctx);
  }
}

/* scatter_from a source rank outside the mesh: DT_ERR_INVALID on every rank,
 * before any communication (every rank can tell), nothing leaked. */
static void run_bad_source(rk *R) {
  dt_ctx *ctx = R->ctx;
  int size = 1;
  for (int i = 0; i < R->m; i++) size *= R->ms[i];
  int cand[3] = {-1, ctx->world_size, -1}, nc = 2;
  for (int w = 0; w < ctx->world_size && nc == 2; w++) { /* a world rank of another mesh */
    bool in = false;
    for (int q = 0; q < size && !in; q++) in = member_rank(R, q) == w;
    if (!in) cand[nc++] = w;
  }
  const int64_t g[2] = {5, 3};
  dt_placement pl[MAXM];
  for (int i = 0; i < R->m; i++) pl[i] = i == 0 ? dt_shard(0) : dt_replicate();
  for (int k = 0; k < nc; k++) {
    char cs[96];
    snprintf(cs, sizeof cs, "scatter_from world rank %d (not in the mesh)", cand[k]);
    size_t mem0 = ctx->mem.host_cur, before = dt_ledger_of(ctx)->n;
    dt_array glob;
    if (!ok_or_fail(R, cs, "dt_array_create",
                    dt_array_create(ctx, DT_DEV_CPU, DT_F32, 2, g, &glob), true))
      return;
    memset(glob.data, 0, dt_array_bytes(&glob));
    dt_tensor t;
    memset(&t, 0, sizeof t);
    dt_status s = dt_tensor_scatter_from(ctx, R->mesh, &glob, cand[k], 2, g, DT_F32, pl, &t);
    if (s != DT_ERR_INVALID) {
      cfail(R, cs, "returned %s, expected invalid argument", dt_status_str(s));
      if (s == DT_OK) dt_tensor_free(ctx, &t);
      else R->fatal = s; /* a peer may be waiting */
    }
    if (dt_ledger_of(ctx)->n != before)
      cfail(R, cs, "recorded %zu collectives", dt_ledger_of(ctx)->n - before);
    dt_error_clear(ctx);
    dt_array_free(ctx, &glob);
    if (ctx->mem.host_cur != mem0)
      cfail(R, cs, "host memory in use is %zu bytes after, %zu before", ctx->mem.host_cur, mem0);
  }
}

static void run_creation(rk *R, job *J, const shape_cfg *sh, const dt_placement *pl, dt_dtype dt,
                         int idx) {
  dt_ctx *ctx = R->ctx;
  char cs[256], a[96], gsd[48];
  fmt_pl(a, sizeof a, R->m, pl);
  fmt_i64(gsd, sizeof gsd, sh->ndim, sh->g);
  int seed = idx % 13;
  size_t mem0 = ctx->mem.host_cur;
  /* one list in three is passed with negative shard dims (normalised by the callee) */
  dt_placement pla[MAXM];
  if (idx % 3 == 0) negate(R->m, sh->ndim, pl, pla);
  else memcpy(pla, pl, sizeof(dt_placement) * (size_t)R->m);

  /* distribute: every rank holds G */
  snprintf(cs, sizeof cs, "shape [%s] %s, distribute to %s", gsd, dt_dtype_name(dt), a);
  dt_array glob;
  if (!ok_or_fail(R, cs, "dt_array_create",
                  dt_array_create(ctx, DT_DEV_CPU, dt, sh->ndim, sh->g, &glob), true))
    return;
  for (int64_t j = 0; j < glob.numel; j++) set_el(dt, glob.data, j, gval(seed, j));
  dt_tensor t;
  memset(&t, 0, sizeof t);
  if (ok_or_fail(R, cs, "dt_tensor_distribute",
                 dt_tensor_distribute(ctx, R->mesh, &glob, pla, &t), true)) {
    check_created(R, cs, "distribute", &t, pl, sh, dt, seed);
    dt_tensor_free(ctx, &t);
  }
  if (R->fatal != DT_OK) {
    dt_array_free(ctx, &glob);
    return;
  }

  /* scatter_from a non-zero world rank; the others pass NULL */
  int world = 1; /* the mesh's ranks; srcr is a world rank among them */
  for (int i = 0; i < R->m; i++) world *= R->ms[i];
  int srcr = member_rank(R, world > 1 ? 1 + idx % (world - 1) : 0);
  snprintf(cs, sizeof cs, "shape [%s] %s, scatter_from rank %d to %s", gsd, dt_dtype_name(dt),
           srcr, a);
  memset(&t, 0, sizeof t);
  size_t lb = dt_ledger_of(ctx)->n;
  if (ok_or_fail(R, cs, "dt_tensor_scatter_from",
                 dt_tensor_scatter_from(ctx, R->mesh, ctx->rank == srcr ? &glob : NULL, srcr,
                                        sh->ndim, sh->g, dt, pla, &t),
                 true)) {
    /* the data moved through the comm front when the mesh has more than one rank */
    if (world > 1 && dt_ledger_of(ctx)->n == lb)
      cfail(R, cs, "scatter_from recorded no collective in the ledger");
    check_created(R, cs, "scatter_from", &t, pl, sh, dt, seed);
    dt_tensor_free(ctx, &t);
  }
  dt_array_free(ctx, &glob);
  if (R->fatal != DT_OK) return;

  /* rand: two parameter sets; the all-Replicate layout is the bitwise reference of
   * sharding invariance, dt_rng_* on the global index the independent one */
  for (int v = 0; v < 2 && R->fatal == DT_OK; v++) {
    rng_want rw = {.seed = 1000u + (uint64_t)idx, .stream = 3u + (uint64_t)v,
                   .dist = v ? DT_RNG_NORMAL : DT_RNG_UNIFORM, .a = v ? 0.5 : 0.0,
                   .b = v ? 2.0 : 1.0, .zero = 0};
    /* (0, 1): u converts to the dtype with one rounding, so exact. (0.5, 2): the
     * library may form a + b*u in f64 or in the dtype: within 1 ulp. */
    int tol = v ? 1 : 0;
    snprintf(cs, sizeof cs, "shape [%s] %s, rand %s(a=%g, b=%g) to %s", gsd, dt_dtype_name(dt),
             v ? "normal" : "uniform", rw.a, rw.b, a);
    dt_tensor rr, ref;
    memset(&rr, 0, sizeof rr);
    memset(&ref, 0, sizeof ref);
    dt_placement allr[MAXM];
    for (int i = 0; i < R->m; i++) allr[i] = dt_replicate();
    bool okr = ok_or_fail(R, cs, "dt_tensor_rand (all Replicate)",
                          dt_tensor_rand(ctx, R->mesh, sh->ndim, sh->g, dt, allr, rw.seed,
                                         rw.stream, rw.dist, rw.a, rw.b, &ref),
                          false);
    if (!ok_or_fail(R, cs, "dt_tensor_rand",
                    dt_tensor_rand(ctx, R->mesh, sh->ndim, sh->g, dt, pla, rw.seed, rw.stream,
                                   rw.dist, rw.a, rw.b, &rr),
                    false)) {
      if (okr) dt_tensor_free(ctx, &ref);
      continue;
    }
    check_meta(R, cs, "rand", &rr, pl, sh->ndim, sh->g, dt);
    int64_t ls[DT_MAX_DIMS], off[DT_MAX_DIMS];
    ref_geom(sh->ndim, sh->g, R->m, R->ms, R->c, pl, ls, off);
    /* P(sum): the value on coordinate 0 of every P(sum) dim, 0 elsewhere */
    for (int i = 0; i < R->m; i++)
      if (pl[i].kind == DT_PL_PARTIAL && pl[i].op == DT_RED_SUM && R->c[i] != 0) rw.zero = 1;
    check_slice(R, cs, "rand local shard", &rr.local, dt, sh->ndim, sh->g, ls, off, want_rng, &rw,
                tol);
    if (okr && rw.zero == 0 && rr.local.numel > 0 &&
        ref.local.numel == numel_of(sh->ndim, sh->g) && ref.local.dtype == dt) {
      /* bitwise: the shard's elements are the all-Replicate tensor's */
      size_t es = dt_dtype_size(dt);
      int64_t bad = 0;
      dt_array rh, fh;
      const dt_array *rv = host_view(R, cs, &rr.local, &rh), *fv = host_view(R, cs, &ref.local, &fh);
      for (int64_t j = 0; rv && fv && j < rr.local.numel; j++) {
        int64_t f = gflat(sh->ndim, sh->g, ls, off, j);
        bad += memcmp((const char *)rv->data + (size_t)j * es,
                      (const char *)fv->data + (size_t)f * es, es) != 0;
      }
      dt_array_free(ctx, &rh);
      dt_array_free(ctx, &fh);
      if (bad)
        cfail(R, cs, "%lld local elements differ bitwise from the all-Replicate layout's",
              (long long)bad);
    }
    dt_array full;
    memset(&full, 0, sizeof full);
    if (ok_or_fail(R, cs, "dt_tensor_full", dt_tensor_full(ctx, &rr, &full), true)) {
      int64_t zero[DT_MAX_DIMS] = {0};
      rng_want rf = rw;
      rf.zero = 0;
      int ftol = tol;
      for (int i = 0; i < R->m; i++)
        if (pl[i].kind == DT_PL_PARTIAL && pl[i].op == DT_RED_AVG && !pow2(R->ms[i]))
          ftol += 3; /* avg of n equal values: see partition_tol */
      check_slice(R, cs, "rand full_tensor", &full, dt, sh->ndim, sh->g, sh->g, zero, want_rng,
                  &rf, ftol);
      dt_array_free(ctx, &full);
    }
    dt_tensor_free(ctx, &rr);
    if (okr) dt_tensor_free(ctx, &ref);
  }
  if (ctx->mem.host_cur != mem0)
    cfail(R, cs, "host memory in use is %zu bytes after the creation tests, %zu before",
          ctx->mem.host_cur, mem0);
  if (R->ctx->rank == 0) J->st.lists++;
}

static void run_creations(rk *R, job *J, int si) {
  const shape_cfg *sh = &R->mc->shapes[si];
  const int m = R->m, r = sh->ndim, k = r + 2;
  long total = 1;
  for (int i = 0; i < m; i++) total *= k;
  static const dt_reduce_op ops[3] = {DT_RED_AVG, DT_RED_MAX, DT_RED_MIN};
  for (long idx = 0; idx < total && R->fatal == DT_OK; idx++) {
    if (J->quick && idx % 4) continue;
    dt_placement pl[MAXM];
    long q = idx;
    bool has_p = false;
    for (int i = 0; i < m; i++) {
      pl[i] = opt_pl((int)(q % k), r, DT_RED_SUM);
      has_p = has_p || pl[i].kind == DT_PL_PARTIAL;
      q /= k;
    }
    dt_dtype dt = idx % 5 == 1 ? DT_F64 : idx % 7 == 2 ? DT_BF16 : DT_F32;
    run_creation(R, J, sh, pl, dt, (int)idx);
    if (has_p && R->fatal == DT_OK) {
      for (int i = 0; i < m; i++)
        if (pl[i].kind == DT_PL_PARTIAL) pl[i].op = ops[idx % 3];
      run_creation(R, J, sh, pl, DT_F32, (int)idx + 1);
    }
  }
}

/* ---- from_local ------------------------------------------------------------------------ */

static void run_from_local(rk *R) {
  dt_ctx *ctx = R->ctx;
  const int64_t g[2] = {29, 13};
  size_t mem0 = ctx->mem.host_cur;
  for (int i = 0; i < R->m; i++) {
    if (R->ms[i] < 2) continue;
    /* S(0) on mesh dim i, R elsewhere: a wrong size on dim 0 (sharded) or dim 1 */
    dt_placement pl[MAXM];
    for (int j = 0; j < R->m; j++) pl[j] = dt_replicate();
    pl[i] = dt_shard(0);
    int64_t ls[DT_MAX_DIMS], off[DT_MAX_DIMS];
    ref_geom(2, g, R->m, R->ms, R->c, pl, ls, off);
    for (int bad_dim = 0; bad_dim < 2; bad_dim++) {
      char cs[160], a[64];
      fmt_pl(a, sizeof a, R->m, pl);
      snprintf(cs, sizeof cs, "from_local [29,13] %s with dim %d too big by 11", a, bad_dim);
      int64_t wrong[2] = {ls[0], ls[1]};
      wrong[bad_dim] += 11;
      dt_array loc;
      if (!ok_or_fail(R, cs, "dt_array_create",
                      dt_array_create(ctx, DT_DEV_CPU, DT_F32, 2, wrong, &loc), false))
        continue;
      memset(loc.data, 0, dt_array_bytes(&loc));
      dt_tensor t;
      memset(&t, 0, sizeof t);
      dt_error_clear(ctx);
      dt_status s = dt_tensor_from_local(ctx, R->mesh, &loc, pl, 2, g, &t);
      const char *msg = dt_last_error(ctx);
      char dimw[16], ew[24], gw[24];
      snprintf(dimw, sizeof dimw, "%d", bad_dim);
      snprintf(ew, sizeof ew, "%lld", (long long)ls[bad_dim]);
      snprintf(gw, sizeof gw, "%lld", (long long)wrong[bad_dim]);
      if (s != DT_ERR_INVALID)
        cfail(R, cs, "dt_tensor_from_local returned %s, expected invalid argument",
              dt_status_str(s));
      else if (!strstr(msg, "dim") || !strstr(msg, dimw) || !strstr(msg, ew) || !strstr(msg, gw))
        cfail(R, cs, "the message '%s' does not name the dim %s, expected %s and given %s", msg,
              dimw, ew, gw);
      if (s == DT_OK) dt_tensor_free(ctx, &t);
      dt_error_clear(ctx);
      dt_array_free(ctx, &loc);
    }
    /* a local array of the wrong rank */
    {
      char cs[96];
      snprintf(cs, sizeof cs, "from_local [29,13] with a 1-D local");
      dt_array loc;
      int64_t one[1] = {ls[0]};
      if (ok_or_fail(R, cs, "dt_array_create",
                     dt_array_create(ctx, DT_DEV_CPU, DT_F32, 1, one, &loc), false)) {
        dt_tensor t;
        memset(&t, 0, sizeof t);
        dt_status s = dt_tensor_from_local(ctx, R->mesh, &loc, pl, 2, g, &t);
        if (s != DT_ERR_INVALID)
          cfail(R, cs, "dt_tensor_from_local returned %s, expected invalid argument",
                dt_status_str(s));
        if (s == DT_OK) dt_tensor_free(ctx, &t);
        dt_error_clear(ctx);
        dt_array_free(ctx, &loc);
      }
    }
  }
  if (ctx->mem.host_cur != mem0)
    cfail(R, "from_local errors", "host memory in use is %zu bytes after, %zu before",
          ctx->mem.host_cur, mem0);

  /* gshape NULL: local x mesh size on each sharded dim (PyTorch), for several lists;
   * the local is even by construction, so the inferred tensor is a consistent one */
  const int64_t lsh[2] = {2, 3};
  int k = 4; /* R, P(sum), S(0), S(1) */
  long total = 1;
  for (int i = 0; i < R->m; i++) total *= k;
  for (long idx = 0; idx < total && R->fatal == DT_OK; idx++) {
    dt_placement pl[MAXM];
    long q = idx;
    int64_t gw[2] = {lsh[0], lsh[1]};
    for (int i = 0; i < R->m; i++) {
      int v = (int)(q % k);
      q /= k;
      pl[i] = v == 0 ? dt_replicate() : v == 1 ? dt_partial(DT_RED_SUM) : dt_shard(v - 2);
      if (v >= 2) gw[v - 2] *= R->ms[i];
    }
    char cs[160], a[64];
    fmt_pl(a, sizeof a, R->m, pl);
    snprintf(cs, sizeof cs, "from_local local [2,3] %s gshape NULL", a);
    int64_t ls[DT_MAX_DIMS], off[DT_MAX_DIMS];
    ref_geom(2, gw, R->m, R->ms, R->c, pl, ls, off);
    dt_array loc;
    if (!ok_or_fail(R, cs, "dt_array_create",
                    dt_array_create(ctx, DT_DEV_CPU, DT_F32, 2, lsh, &loc), true))
      return;
    int seed = (int)(idx % 13);
    for (int64_t j = 0; j < loc.numel; j++) {
      int64_t f = gflat(2, gw, ls, off, j);
      set_el(DT_F32, loc.data, j, make_local(gval(seed, f), f, R->m, R->ms, R->c, pl));
    }
    dt_tensor t;
    memset(&t, 0, sizeof t);
    if (ok_or_fail(R, cs, "dt_tensor_from_local", dt_tensor_from_local(ctx, R->mesh, &loc, pl, 2,
                                                                       NULL, &t),
                   true)) {
      check_meta(R, cs, "from_local", &t, pl, 2, gw, DT_F32);
      dt_array full;
      memset(&full, 0, sizeof full);
      if (ok_or_fail(R, cs, "dt_tensor_full", dt_tensor_full(ctx, &t, &full), true)) {
        int64_t zero[DT_MAX_DIMS] = {0};
        check_slice(R, cs, "full_tensor", &full, DT_F32, 2, gw, gw, zero, want_g, &seed, 0);
        dt_array_free(ctx, &full);
      }
      dt_tensor_free(ctx, &t);
    }
    dt_array_free(ctx, &loc);
  }
}

/* ---- the SPMD body ---------------------------------------------------------------------- */

static void describe(char *buf, size_t n, int m, const int *ms, const char *const *names) {
  size_t pos = (size_t)snprintf(buf, n, "(");
  for (int i = 0; i < m && pos < n; i++)
    pos += (size_t)snprintf(buf + pos, n - pos, i ? ",%d" : "%d", ms[i]);
  for (int i = 0; i < m && pos < n; i++)
    pos += (size_t)snprintf(buf + pos, n - pos, i ? ",%s" : ")[%s", names[i]);
  if (pos < n) snprintf(buf + pos, n - pos, "]");
}

static dt_status body(dt_ctx *ctx, void *arg) {
  job *J = arg;
  const mesh_cfg *mc = J->mc;
  rk R;
  memset(&R, 0, sizeof R);
  R.ctx = ctx;
  R.mc = mc;
  char rootd[80];
  describe(rootd, sizeof rootd, mc->ndim, mc->shape, mc->names);
  dt_comm *sub = NULL;
  R.base = ctx->world;
  if (mc->split > 1) {
    dt_status ss = dt_comm_split(ctx->world, ctx->rank % mc->split, ctx->rank, "part", &sub);
    if (ss != DT_OK || !sub) {
      tu_fail(__FILE__, __LINE__, "mesh %s, rank %d: dt_comm_split -> %s: %s", rootd, ctx->rank,
              dt_status_str(ss), dt_last_error(ctx));
      return ss != DT_OK ? ss : DT_ERR_INTERNAL;
    }
    R.base = sub;
  }
  /* row-major coordinates of this rank's index in the mesh's communicator */
  for (int i = mc->ndim - 1, e = R.base->rank; i >= 0; i--) {
    R.rc[i] = e % mc->shape[i];
    e /= mc->shape[i];
  }
  dt_status s = dt_mesh_create(ctx, R.base, mc->ndim, mc->shape, mc->names, &R.root);
  if (s != DT_OK) {
    dt_comm_destroy(sub);
    tu_fail(__FILE__, __LINE__, "mesh %s, rank %d: dt_mesh_create -> %s: %s", rootd, ctx->rank,
            dt_status_str(s), dt_last_error(ctx));
    return s;
  }
  if (!mc->view) {
    R.mesh = R.root;
    R.m = mc->ndim;
    for (int i = 0; i < R.m; i++) {
      R.ms[i] = mc->shape[i];
      R.names[i] = mc->names[i];
      R.c[i] = R.rc[i];
    }
  } else {
    const char *sn[MAXM];
    int k = 0, flat = 0, fsize = 1;
    size_t fp = 0;
    for (int d = 0; d < mc->ndim; d++)
      if (mc->view >> d & 1u) {
        sn[k] = mc->names[d];
        R.ms[k] = mc->shape[d];
        R.names[k] = mc->names[d];
        R.c[k] = R.rc[d];
        flat = flat * mc->shape[d] + R.rc[d];
        fsize *= mc->shape[d];
        fp += (size_t)snprintf(R.fname + fp, sizeof R.fname - fp, k ? "_%s" : "%s", sn[k]);
        k++;
      }
    dt_mesh *sl = NULL;
    s = dt_mesh_slice(R.root, k, sn, &sl);
    if (s == DT_OK && mc->flatten) s = dt_mesh_flatten(sl, NULL, &R.mesh);
    else R.mesh = sl;
    if (s != DT_OK || !R.mesh) {
      tu_fail(__FILE__, __LINE__, "mesh %s, rank %d: slice/flatten -> %s: %s", rootd, ctx->rank,
              dt_status_str(s), dt_last_error(ctx));
      dt_mesh_free(R.root);
      dt_comm_destroy(sub);
      return s != DT_OK ? s : DT_ERR_INTERNAL;
    }
    R.m = k;
    if (mc->flatten) {
      R.m = 1;
      R.ms[0] = fsize;
      R.names[0] = R.fname;
      R.c[0] = flat;
    }
  }
  describe(R.mdesc, sizeof R.mdesc, R.m, R.ms, R.names);
  if (mc->view || mc->split > 1) {
    size_t pos = strlen(R.mdesc);
    if (mc->view)
      pos += (size_t)snprintf(R.mdesc + pos, sizeof R.mdesc - pos, " %s of %s",
                              mc->flatten ? "flattened" : "slice", rootd);
    if (mc->split > 1)
      snprintf(R.mdesc + pos, sizeof R.mdesc - pos, " on world ranks %% %d == %d", mc->split,
               ctx->rank % mc->split);
  }
  for (int i = 0; i < R.m; i++)
    if (dt_mesh_coord(R.mesh, i) != R.c[i] || dt_mesh_size(R.mesh, i) != R.ms[i])
      tu_fail(__FILE__, __LINE__, "mesh %s, rank %d: dim %d has coordinate %d of %d, expected "
              "%d of %d", R.mdesc, ctx->rank, i, dt_mesh_coord(R.mesh, i),
              dt_mesh_size(R.mesh, i), R.c[i], R.ms[i]);
  double t0 = dt_now();
  for (int si = 0; si < mc->nshapes && R.fatal == DT_OK; si++) run_pairs(&R, J, si);
  if (R.fatal == DT_OK) run_oracles(&R);
  if (mc->creation) {
    for (int si = 0; si < mc->nshapes && R.fatal == DT_OK; si++) {
      run_creations(&R, J, si);
      if (R.fatal == DT_OK) run_to_partial(&R, J, &mc->shapes[si]);
    }
    if (R.fatal == DT_OK) run_from_local(&R);
    if (R.fatal == DT_OK) run_refusals(&R, &mc->shapes[mc->nshapes - 1]);
    if (R.fatal == DT_OK) run_bad_source(&R);
  }
  if (ctx->rank == 0) J->st.seconds = dt_now() - t0;
  dt_mesh_free(R.root);
  dt_comm_destroy(sub);
  return R.fatal;
}

/* ---- the mesh list ---------------------------------------------------------------------- */


static const mesh_cfg THREADS_MESHES[] = {
    /* label, ndim, shape, names, nshapes, shapes, want[rank 0..3],
     * min-cost, f64, bf16, P-op per mille, creation, split, view, flatten */
    {"1-D (1)", 1, {1}, {"tp"}, 4, {SH0, SH1(7), SH2(5, 3), SH3(3, 5, 2)}, {-1, -1, -1, -1},
     1000, 1000, 1000, 1000, true, 0, 0u, false},
    {"1-D (4)", 1, {4}, {"tp"}, 11,
     {SH0, SH1(0), SH1(8), SH1(7), SH1(3), SH2(8, 6), SH2(5, 3), SH2(1, 9), SH2(4, 0),
      SH3(6, 4, 4), SH3(3, 5, 2)},
     {-1, -1, -1, -1}, 1000, 1000, 1000, 1000, true, 0, 0u, false},
    {"1-D (3)", 1, {3}, {"tp"}, 6, {SH0, SH1(7), SH1(3), SH2(5, 3), SH2(1, 9), SH3(3, 5, 2)},
     {-1, -1, -1, -1}, 1000, 1000, 1000, 1000, true, 0, 0u, false},
    {"2-D (2,2)", 2, {2, 2}, {"dp", "tp"}, 12,
     {SH0, SH1(0), SH1(8), SH1(7), SH1(3), SH2(8, 6), SH2(5, 3), SH2(1, 9), SH2(1, 8),
      SH2(0, 3), SH3(6, 4, 4), SH3(3, 5, 2)},
     {-1, -1, -1, -1}, 1000, 300, 300, 500, true, 0, 0u, false},
    {"2-D (2,3)", 2, {2, 3}, {"dp", "tp"}, 8,
     {SH0, SH1(7), SH1(3), SH2(5, 3), SH2(1, 9), SH2(1, 12), SH2(8, 6), SH3(3, 5, 2)},
     {-1, -1, -1, -1}, 250, 100, 100, 300, true, 0, 0u, false},
    {"2-D (2,3) big", 2, {2, 3}, {"dp", "tp"}, 3, {SH1(130), SH2(33, 17), SH3(9, 10, 11)},
     {-1, 150, 150, 150}, 250, 100, 100, 300, false, 0, 0u, false},
    {"2-D (4,1)", 2, {4, 1}, {"dp", "tp"}, 3, {SH1(7), SH2(5, 3), SH3(6, 4, 4)}, {-1, -1, -1, -1},
     250, 100, 100, 300, true, 0, 0u, false},
    {"2-D (2,2) x2", 2, {2, 2}, {"dp", "tp"}, 3, {SH1(7), SH2(5, 3), SH3(3, 5, 2)},
     {-1, -1, 200, 200}, 250, 100, 100, 300, true, 2, 0u, false},
    {"slice tp of (2,4)", 2, {2, 4}, {"dp", "tp"}, 3, {SH1(7), SH2(5, 3), SH3(3, 5, 2)},
     {-1, -1, -1, -1}, 250, 100, 100, 300, true, 0, 2u, false},
    {"slice dp of (2,4)", 2, {2, 4}, {"dp", "tp"}, 3, {SH1(7), SH2(5, 3), SH3(3, 5, 2)},
     {-1, -1, -1, -1}, 250, 100, 100, 300, true, 0, 1u, false},
    {"dp_tp of (2,2,2)", 3, {2, 2, 2}, {"pp", "dp", "tp"}, 3, {SH1(7), SH2(5, 3), SH3(3, 5, 2)},
     {-1, -1, -1, -1}, 250, 100, 100, 300, true, 0, 6u, true},
    {"(pp,tp) of (2,2,2)", 3, {2, 2, 2}, {"pp", "dp", "tp"}, 3, {SH1(7), SH2(5, 3), SH3(3, 5, 2)},
     {-1, -1, 300, 300}, 250, 100, 100, 300, true, 0, 5u, false},
    {"3-D (2,2,2)", 3, {2, 2, 2}, {"pp", "dp", "tp"}, 6,
     {SH0, SH1(7), SH2(5, 3), SH2(8, 6), SH2(1, 8), SH3(3, 5, 2)}, {-1, -1, -1, -1}, 100, 30, 30,
     150, true, 0, 0u, false},
    {"3-D (2,1,3)", 3, {2, 1, 3}, {"dp", "cp", "tp"}, 3, {SH1(7), SH2(5, 3), SH3(3, 5, 2)},
     {-1, -1, -1, -1}, 100, 30, 30, 150, true, 0, 0u, false},
    {"4-D (2,2,2,2)", 4, {2, 2, 2, 2}, {"pp", "dp", "cp", "tp"}, 4,
     {SH0, SH1(7), SH2(8, 6), SH3(3, 5, 2)}, {-1, 1500, 1500, 1500}, 150, 50, 50, 200, false, 0, 0u, false},
    {"5-D (2,2,2,2,2)", 5, {2, 2, 2, 2, 2}, {"pp", "dp", "ep", "cp", "tp"}, 4,
     {SH0, SH1(8), SH2(5, 3), SH3(6, 4, 4)}, {-1, 500, 500, 500}, 150, 50, 50, 200, false, 0, 0u, false},
};

static int mesh_world(const mesh_cfg *mc) {
  int w = mc->split > 1 ? mc->split : 1;
  for (int i = 0; i < mc->ndim; i++) w *= mc->shape[i];
  return w;
}

static void summary(const job *J) {
  printf("%-19s pairs %5ld (+ min-cost %4ld, f64 %4ld, bf16 %4ld, P(avg|max|min) %4ld, "
         "P kept %4ld); creation lists %4ld, R->P %4ld: %.2f s\n",
         J->mc->label, J->st.pairs, J->st.mincost, J->st.f64, J->st.bf16, J->st.pop, J->st.keep,
         J->st.lists, J->st.topart, J->st.seconds);
  fflush(stdout);
}

int main(int argc, char **argv) {
  tu_opts o;
  tu_parse(argc, argv, &o);
  /* ThreadSanitizer slows 32 ranks on two cores about tenfold: the reduced set */
  const char *san = getenv("SB_SANITIZER");
  if (san && !strcmp(san, "thread")) o.quick = 1;
  dt_device_cpu_blas_threads(1);
  dt_launch_opts lo = {.backend = o.backend, .timeout_s = 60};
  tu_launch_device(&lo);
  if (o.backend == DT_BACKEND_MPI) {
    /* MPI: meshes whose size is the world: 1-D (every pair), 2-D (2, w/2) and 3-D
     * (2, 2, w/4) or (2, 1, w/2) (a sample of pairs); a few seconds at -np 8 on two
     * cores (processes busy-poll, so keep it modest). */
    dt_status s = dt_mpi_init(&argc, &argv);
    int w = dt_mpi_size(), me = dt_mpi_rank();
    mesh_cfg ms[3];
    int nm = 0;
    const shape_cfg shapes[4] = {SH0, SH1(7), SH2(5, 3), SH3(3, 5, 2)};
    mesh_cfg base;
    memset(&base, 0, sizeof base);
    base.nshapes = 4;
    memcpy(base.shapes, shapes, sizeof shapes);
    base.mincost_pm = 300;
    base.f64_pm = 200;
    base.bf16_pm = 200;
    base.pop_pm = 500;
    base.creation = !o.quick;
    ms[nm] = base;
    ms[nm].label = "mpi 1-D";
    ms[nm].ndim = 1;
    ms[nm].shape[0] = w;
    ms[nm].names[0] = "tp";
    ms[nm].want[0] = ms[nm].want[1] = ms[nm].want[2] = ms[nm].want[3] = o.quick ? 8 : -1;
    ms[nm].mincost_pm = ms[nm].f64_pm = ms[nm].bf16_pm = ms[nm].pop_pm = 1000;
    nm++;
    if (w % 2 == 0 && w >= 4) {
      ms[nm] = base;
      ms[nm].label = "mpi 2-D";
      ms[nm].ndim = 2;
      ms[nm].shape[0] = 2;
      ms[nm].shape[1] = w / 2;
      ms[nm].names[0] = "dp";
      ms[nm].names[1] = "tp";
      ms[nm].want[0] = -1;
      ms[nm].want[1] = ms[nm].want[2] = ms[nm].want[3] = o.quick ? 8 : 300;
      nm++;
      ms[nm] = base;
      ms[nm].label = "mpi 3-D";
      ms[nm].ndim = 3;
      ms[nm].shape[0] = 2;
      ms[nm].shape[1] = w % 4 == 0 && w >= 8 ? 2 : 1;
      ms[nm].shape[2] = w / (2 * ms[nm].shape[1]);
      ms[nm].names[0] = "pp";
      ms[nm].names[1] = "dp";
      ms[nm].names[2] = "tp";
      ms[nm].want[0] = -1;
      ms[nm].want[1] = ms[nm].want[2] = ms[nm].want[3] = o.quick ? 8 : 200;
      nm++;
    }
    for (int i = 0; i < nm && s == DT_OK; i++) {
      job J;
      memset(&J, 0, sizeof J);
      J.mc = &ms[i];
      J.quick = o.quick;
      dt_launch_report rep;
      s = dt_launch(&lo, body, &J, &rep);
      if (s != DT_OK)
        tu_fail(__FILE__, __LINE__, "%s: launch: rank %d: %s", ms[i].label, rep.failed_rank,
                rep.failed_msg);
      dt_launch_report_free(&rep);
      if (me == 0) summary(&J);
    }
    int rc = tu_finish("test_redistribute (mpi)");
    dt_mpi_finish(s == DT_OK);
    return rc;
  }
  double t0 = dt_now();
  for (size_t i = 0; i < sizeof THREADS_MESHES / sizeof THREADS_MESHES[0]; i++) {
    job J;
    memset(&J, 0, sizeof J);
    J.mc = &THREADS_MESHES[i];
    J.quick = o.quick;
    lo.world = mesh_world(J.mc);
    dt_launch_report rep;
    dt_status s = dt_launch(&lo, body, &J, &rep);
    if (s != DT_OK)
      tu_fail(__FILE__, __LINE__, "%s: launch: rank %d: %s", J.mc->label, rep.failed_rank,
              rep.failed_msg);
    dt_launch_report_free(&rep);
    summary(&J);
  }
  printf("total %.2f s\n", dt_now() - t0);
  return tu_finish("test_redistribute");
}
