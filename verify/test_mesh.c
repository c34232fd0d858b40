/* verify/test_mesh.c: DeviceMesh (lib/mesh) against a naive reference computed here.
 *
 * What it checks: coordinates, per-dim groups and group ranks, communicator sizes,
 * members and wiring (a real all_gather on every dim communicator), slicing and
 * flattening with PyTorch's semantics (torch/distributed/device_mesh.py:
 * init_device_mesh's row-major layout, __getitem__ slicing in ascending dim
 * order, _flatten) and its examples, and the errors. The reference never calls the
 * mesh: a rank's coordinates are c_i = (r / prod(shape[i+1:])) % shape[i], and the
 * submesh over a set S of dims is every rank that agrees with r outside S, in
 * increasing rank order (which is row-major over S).
 *
 * Coverage: with --backend threads (the default), for worlds 8 and 32, every
 * ordered factorization of the world into TorchTitan's dims [pp, dp_replicate,
 * dp_shard, cp, tp], both as a 5-D mesh with size-1 dims and in the compact form
 * without them; every ascending slice of each; flattening of every subset of two
 * or more dims of the 5-D meshes of 8, and TorchTitan's flattens (dp_shard_cp,
 * dp, dp_cp) with the slices that mix them with plain dims on every 5-D mesh.
 * Plus PyTorch's worked examples (world 8: the (2,4) tp/dp groups, the
 * ("dp","cp") slice and its flatten of a (2,2,2) mesh), a mesh over a
 * communicator that is not the world, and the errors. With --backend mpi (under
 * mpirun) the same at the job's world size, all factorizations up to 8 ranks and
 * a few beyond. What it is not: a benchmark.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

enum { NDIM5 = 5, MAXW = 64, MAXF = 256 };

static const char *const TT[NDIM5] = {"pp", "dp_replicate", "dp_shard", "cp", "tp"};

/* ---- the naive reference -------------------------------------------------- */

static int ref_coord(int ndim, const int *shape, int r, int i) {
  int stride = 1;
  for (int j = i + 1; j < ndim; j++) stride *= shape[j];
  return (r / stride) % shape[i];
}

/* Mesh indices of the submesh over the dims in `sel` (bit d = dim d) containing
 * index r, in increasing order; returns how many. */
static int ref_members(int ndim, const int *shape, int r, unsigned sel, int *out) {
  int total = 1, n = 0, stride[NDIM5], rc[NDIM5];
  for (int j = ndim - 1; j >= 0; j--) {
    stride[j] = total;
    total *= shape[j];
    rc[j] = ref_coord(ndim, shape, r, j);
  }
  for (int q = 0; q < total; q++) {
    bool same = true;
    for (int j = 0; j < ndim && same; j++)
      if (!(sel >> j & 1u) && (q / stride[j]) % shape[j] != rc[j]) same = false;
    if (same) out[n++] = q;
  }
  return n;
}

/* Every ordered k-tuple of positive integers with product n (k <= 5). */
typedef struct factorizations {
  int n;
  int t[MAXF][NDIM5];
} factorizations;

static void enum_rec(factorizations *f, int *cur, int pos, int k, int rest) {
  if (pos == k - 1) {
    cur[pos] = rest;
    if (f->n < MAXF) memcpy(f->t[f->n++], cur, sizeof f->t[0]);
    return;
  }
  for (int a = 1; a <= rest; a++) {
    if (rest % a) continue;
    cur[pos] = a;
    enum_rec(f, cur, pos + 1, k, rest / a);
  }
}

static void enum_factorizations(int world, factorizations *f) {
  int cur[NDIM5] = {0};
  f->n = 0;
  enum_rec(f, cur, 0, NDIM5, world);
}

/* ---- small check helpers -------------------------------------------------- */

static bool same_ints(const int *a, const int *b, int n) {
  for (int i = 0; i < n; i++)
    if (a[i] != b[i]) return false;
  return true;
}

static void fmt_ints(char *buf, size_t n, const int *v, int k) {
  size_t pos = 0;
  buf[0] = '\0';
  for (int i = 0; i < k && pos + 12 < n; i++)
    pos += (size_t)snprintf(buf + pos, n - pos, i ? ",%d" : "%d", v[i]);
}

static void expect_ints(dt_ctx *ctx, const char *mesh, const char *what, const int *got,
                        const int *exp, int n) {
  if (same_ints(got, exp, n)) return;
  char g[512], e[512];
  fmt_ints(g, sizeof g, got, n);
  fmt_ints(e, sizeof e, exp, n);
  tu_fail(__FILE__, __LINE__, "rank %d, mesh %s: %s is [%s], expected [%s]", ctx->rank, mesh,
          what, g, e);
}

/* An error call must fail with DT_ERR_INVALID, leave *out NULL and record a
 * message containing `want`. */
static void expect_invalid(dt_ctx *ctx, const char *what, dt_status s, const void *out,
                           const char *want) {
  TU_CHECK(s == DT_ERR_INVALID, "rank %d: %s returned %s, expected invalid argument", ctx->rank,
           what, dt_status_str(s));
  TU_CHECK(out == NULL, "rank %d: %s left a non-NULL result", ctx->rank, what);
  const char *msg = dt_last_error(ctx);
  TU_CHECK(msg && strstr(msg, want), "rank %d: %s: message '%s' lacks '%s'", ctx->rank, what,
           msg ? msg : "(null)", want);
  dt_error_clear(ctx);
}

/* all_gather of the global rank over c: the members, in group-rank order. */
static void check_wired(dt_ctx *ctx, dt_comm *c, const int *exp, int n, const char *mesh,
                        const char *what) {
  double mine = ctx->rank, got[MAXW];
  int gi[MAXW];
  if (!c || c->size != n || n > MAXW) return; /* reported by the caller */
  TU_OK(ctx, dt_comm_all_gather(c, &mine, got, 1, DT_F64));
  for (int k = 0; k < n; k++) gi[k] = (int)got[k];
  expect_ints(ctx, mesh, what, gi, exp, n);
}

/* Checks a communicator's size, rank, members and name against expectations. */
static void check_comm(dt_ctx *ctx, dt_comm *c, const int *exp, int n, int rank,
                       const char *name, const char *mesh, const char *what) {
  TU_CHECK(c != NULL, "rank %d, mesh %s: %s has no communicator", ctx->rank, mesh, what);
  if (!c) return;
  TU_CHECK(c->size == n && c->rank == rank, "rank %d, mesh %s: %s comm is rank %d of %d, expected %d of %d",
           ctx->rank, mesh, what, c->rank, c->size, rank, n);
  if (c->size == n) expect_ints(ctx, mesh, what, c->world_ranks, exp, n);
  TU_CHECK(strcmp(c->name, name) == 0, "rank %d, mesh %s: %s comm is named '%s', expected '%s'",
           ctx->rank, mesh, what, c->name, name);
}

/* ---- one mesh --------------------------------------------------------------- */

/* A mesh as the test sees it: ndim dims of `shape` named `names`, over a world
 * communicator whose member i has global rank map[i]. */
typedef struct ref_mesh {
  int ndim;
  int shape[NDIM5];
  const char *names[NDIM5];
  const int *map;
  int r;            /* the calling rank's mesh index */
  int total;
  char desc[128];   /* "(2, 4) [dp, tp]" */
} ref_mesh;

static void ref_init(ref_mesh *rm, int ndim, const int *shape, const char *const *names,
                     dt_comm *world) {
  rm->ndim = ndim;
  rm->total = 1;
  size_t pos = 0;
  pos += (size_t)snprintf(rm->desc, sizeof rm->desc, "(");
  for (int i = 0; i < ndim; i++) {
    rm->shape[i] = shape[i];
    rm->names[i] = names[i];
    rm->total *= shape[i];
    pos += (size_t)snprintf(rm->desc + pos, sizeof rm->desc - pos, i ? ", %d" : "%d", shape[i]);
  }
  pos += (size_t)snprintf(rm->desc + pos, sizeof rm->desc - pos, ndim == 1 ? ",) [" : ") [");
  for (int i = 0; i < ndim; i++)
    pos += (size_t)snprintf(rm->desc + pos, sizeof rm->desc - pos, i ? ", %s" : "%s", names[i]);
  snprintf(rm->desc + pos, sizeof rm->desc - pos, "]");
  rm->map = world->world_ranks;
  rm->r = world->rank;
}

/* Expected global ranks of the submesh over `sel`. */
static int ref_global(const ref_mesh *rm, unsigned sel, int *out) {
  int n = ref_members(rm->ndim, rm->shape, rm->r, sel, out);
  for (int k = 0; k < n; k++) out[k] = rm->map[out[k]];
  return n;
}

/* Checks mesh `m` (the submesh of rm over the dims listed in dims[0..k-1], each a
 * bit set of rm's dims, outermost first) against the reference: ndim, sizes,
 * names, coordinates, all ranks, rank_at, group ranks. */
static void check_submesh(dt_ctx *ctx, const ref_mesh *rm, const dt_mesh *m, int k,
                          const unsigned *dims, const char *const *names) {
  char d[160];
  dt_mesh_describe(m, d, sizeof d);
  TU_CHECK(dt_mesh_ndim(m) == k, "rank %d, mesh %s: ndim %d, expected %d", ctx->rank, d,
           dt_mesh_ndim(m), k);
  if (dt_mesh_ndim(m) != k) return;
  unsigned all = 0;
  int exp[MAXW], got[MAXW];
  for (int i = 0; i < k; i++) {
    all |= dims[i];
    int sz = 1;
    for (int j = 0; j < rm->ndim; j++)
      if (dims[i] >> j & 1u) sz *= rm->shape[j];
    TU_CHECK(dt_mesh_size(m, i) == sz, "rank %d, mesh %s: dim %d has size %d, expected %d",
             ctx->rank, d, i, dt_mesh_size(m, i), sz);
    TU_CHECK(strcmp(dt_mesh_name(m, i), names[i]) == 0,
             "rank %d, mesh %s: dim %d is named %s, expected %s", ctx->rank, d, i,
             dt_mesh_name(m, i), names[i]);
    TU_CHECK(dt_mesh_dim(m, names[i]) == i, "rank %d, mesh %s: dt_mesh_dim(%s) = %d", ctx->rank,
             d, names[i], dt_mesh_dim(m, names[i]));
  }
  int n = ref_global(rm, all, exp);
  TU_CHECK(dt_mesh_size(m, -1) == n, "rank %d, mesh %s: %d ranks, expected %d", ctx->rank, d,
           dt_mesh_size(m, -1), n);
  if (dt_mesh_size(m, -1) != n) return;
  dt_mesh_ranks(m, got);
  expect_ints(ctx, d, "dt_mesh_ranks", got, exp, n);
  /* Row-major: position f of the submesh has coordinates f decomposed over the
   * dim sizes; the calling rank sits at the position of its own global rank. */
  int me = -1;
  for (int f = 0; f < n; f++) {
    int c[NDIM5], e = f;
    for (int i = k - 1; i >= 0; i--) {
      c[i] = e % dt_mesh_size(m, i);
      e /= dt_mesh_size(m, i);
    }
    got[f] = dt_mesh_rank_at(m, c);
    if (exp[f] == rm->map[rm->r]) {
      me = f;
      for (int i = 0; i < k; i++)
        TU_CHECK(dt_mesh_coord(m, i) == c[i], "rank %d, mesh %s: coord %d is %d, expected %d",
                 ctx->rank, d, i, dt_mesh_coord(m, i), c[i]);
    }
  }
  expect_ints(ctx, d, "dt_mesh_rank_at over all coords", got, exp, n);
  TU_CHECK(me >= 0, "rank %d, mesh %s: the calling rank is not in it", ctx->rank, d);
  /* Groups of each dim: the members that differ only in that dim's coordinate. */
  for (int i = 0; i < k; i++) {
    int gexp[MAXW], g[MAXW];
    int gn = ref_global(rm, dims[i], gexp);
    dt_mesh_group_ranks(m, i, g);
    char what[64];
    snprintf(what, sizeof what, "group ranks of dim %s", names[i]);
    expect_ints(ctx, d, what, g, gexp, gn);
  }
}

/* All checks of one freshly created mesh: the dims, their communicators (with a
 * collective each) and every ascending slice. Returns the mesh (NULL on failure). */
static dt_mesh *check_mesh(dt_ctx *ctx, dt_comm *world, int ndim, const int *shape,
                           const char *const *names, bool slices) {
  ref_mesh rm;
  ref_init(&rm, ndim, shape, names, world);
  dt_mesh *m = NULL;
  dt_status s = dt_mesh_create(ctx, world, ndim, shape, names, &m);
  TU_CHECK(s == DT_OK && m, "rank %d: dt_mesh_create %s -> %s: %s", ctx->rank, rm.desc,
           dt_status_str(s), dt_last_error(ctx));
  if (s != DT_OK || !m) return NULL;
  char d[160];
  dt_mesh_describe(m, d, sizeof d);
  TU_CHECK(strcmp(d, rm.desc) == 0, "rank %d: describe gives '%s', expected '%s'", ctx->rank, d,
           rm.desc);
  unsigned dims[NDIM5] = {0};
  for (int i = 0; i < ndim; i++) dims[i] = 1u << i;
  check_submesh(ctx, &rm, m, ndim, dims, names);
  for (int i = 0; i < ndim; i++) {
    int c = ref_coord(ndim, shape, rm.r, i);
    TU_CHECK(dt_mesh_coord(m, i) == c, "rank %d, mesh %s: coord %d is %d, expected %d",
             ctx->rank, d, i, dt_mesh_coord(m, i), c);
    int exp[MAXW];
    int n = ref_global(&rm, 1u << i, exp);
    char what[64];
    snprintf(what, sizeof what, "comm of dim %s", names[i]);
    check_comm(ctx, dt_mesh_comm(m, i), exp, n, c, names[i], d, what);
    check_wired(ctx, dt_mesh_comm(m, i), exp, n, d, what);
  }
  if (!slices) return m;
  /* Every ascending subset of the dims. */
  for (unsigned sel = 1; sel < (1u << ndim); sel++) {
    const char *sn[NDIM5];
    unsigned sd[NDIM5];
    int k = 0;
    for (int i = 0; i < ndim; i++)
      if (sel >> i & 1u) {
        sn[k] = names[i];
        sd[k++] = 1u << i;
      }
    dt_mesh *sub = NULL;
    s = dt_mesh_slice(m, k, sn, &sub);
    TU_CHECK(s == DT_OK && sub, "rank %d, mesh %s: slice %u -> %s: %s", ctx->rank, d, sel,
             dt_status_str(s), dt_last_error(ctx));
    if (!sub) continue;
    if (k == ndim) TU_CHECK(sub == m, "rank %d, mesh %s: the full slice is not the mesh", ctx->rank, d);
    check_submesh(ctx, &rm, sub, k, sd, sn);
    for (int i = 0; i < k; i++) {
      int rd = 0;
      while (sd[i] != 1u << rd) rd++;
      TU_CHECK(dt_mesh_comm(sub, i) == dt_mesh_comm(m, rd),
               "rank %d, mesh %s: slice %u does not reuse the comm of %s", ctx->rank, d, sel, sn[i]);
    }
    dt_mesh *again = NULL, *one = NULL, *one_root = NULL;
    TU_OK(ctx, dt_mesh_slice(m, k, sn, &again));
    TU_CHECK(again == sub, "rank %d, mesh %s: slicing twice gave two meshes", ctx->rank, d);
    TU_OK(ctx, dt_mesh_slice(sub, k, sn, &again));
    TU_CHECK(again == sub, "rank %d, mesh %s: a slice's full name list is not itself", ctx->rank, d);
    TU_OK(ctx, dt_mesh_slice(sub, 1, &sn[k - 1], &one));
    TU_OK(ctx, dt_mesh_slice(m, 1, &sn[k - 1], &one_root));
    TU_CHECK(one && one == one_root, "rank %d, mesh %s: slice of a slice by %s is not cached",
             ctx->rank, d, sn[k - 1]);
    if (k >= 2) {
      const char *rev[NDIM5];
      for (int i = 0; i < k; i++) rev[i] = sn[k - 1 - i];
      dt_mesh *bad = NULL;
      s = dt_mesh_slice(m, k, rev, &bad);
      expect_invalid(ctx, "slice in descending order", s, bad, "ascending");
    }
  }
  return m;
}

/* ---- flattening ------------------------------------------------------------- */

/* Flattens the dims of m (from rm) listed in sel, named name (NULL: default), and
 * checks the result: ranks, communicator (with a collective), cache, root slice. */
static dt_mesh *check_flatten(dt_ctx *ctx, const ref_mesh *rm, dt_mesh *m, unsigned sel,
                              const char *name) {
  const char *sn[NDIM5];
  int k = 0;
  char dflt[DT_MESH_NAME_LEN * NDIM5] = "";
  for (int i = 0; i < rm->ndim; i++)
    if (sel >> i & 1u) {
      if (k) strcat(dflt, "_");
      strcat(dflt, rm->names[i]);
      sn[k++] = rm->names[i];
    }
  const char *want = name ? name : dflt;
  dt_mesh *sub = NULL, *f = NULL, *again = NULL, *viaroot = NULL;
  TU_OK(ctx, dt_mesh_slice(m, k, sn, &sub));
  if (!sub) return NULL;
  dt_status s = dt_mesh_flatten(sub, name, &f);
  TU_CHECK(s == DT_OK && f, "rank %d, mesh %s: flatten %s -> %s: %s", ctx->rank, rm->desc, want,
           dt_status_str(s), dt_last_error(ctx));
  if (!f) return NULL;
  unsigned one = sel;
  const char *fn[1] = {want};
  check_submesh(ctx, rm, f, 1, &one, fn);
  int exp[MAXW];
  int n = ref_global(rm, sel, exp);
  int me = 0;
  while (me < n && exp[me] != rm->map[rm->r]) me++;
  char what[200];
  snprintf(what, sizeof what, "flattened comm %s", want);
  check_comm(ctx, dt_mesh_comm(f, 0), exp, n, me, want, rm->desc, what);
  check_wired(ctx, dt_mesh_comm(f, 0), exp, n, rm->desc, what);
  TU_OK(ctx, dt_mesh_flatten(sub, name, &again));
  TU_CHECK(again == f, "rank %d, mesh %s: flattening %s twice gave two meshes", ctx->rank,
           rm->desc, want);
  TU_OK(ctx, dt_mesh_flatten(f, NULL, &again));
  TU_CHECK(again == f, "rank %d, mesh %s: a flattened mesh flattened to its name is not itself",
           ctx->rank, rm->desc);
  TU_OK(ctx, dt_mesh_slice(m, 1, fn, &viaroot));
  TU_CHECK(viaroot == f, "rank %d, mesh %s: root[%s] is not the flattened mesh", ctx->rank,
           rm->desc, want);
  return f;
}

/* ---- the tests ------------------------------------------------------------- */

typedef struct job {
  dt_backend backend;
} job;

/* PyTorch's DeviceMesh examples (world 8), from the docstrings of
 * torch/distributed/device_mesh.py (init_device_mesh, __getitem__, _flatten). */
static void test_examples(dt_ctx *ctx) {
  dt_comm *w = ctx->world;
  int r = ctx->rank, got[8];

  /* (2, 4) [dp, tp] */
  const int s24[2] = {2, 4};
  const char *const n24[2] = {"dp", "tp"};
  dt_mesh *m = NULL, *tp = NULL, *dp = NULL, *same = NULL, *bad = NULL;
  TU_OK(ctx, dt_mesh_create(ctx, w, 2, s24, n24, &m));
  if (!m) return;
  char d[64];
  dt_mesh_describe(m, d, sizeof d);
  TU_CHECK(strcmp(d, "(2, 4) [dp, tp]") == 0, "describe: '%s'", d);
  const char *ntp[1] = {"tp"}, *ndp[1] = {"dp"};
  TU_OK(ctx, dt_mesh_slice(m, 1, ntp, &tp));
  TU_OK(ctx, dt_mesh_slice(m, 1, ndp, &dp));
  if (tp && dp) {
    const int tp_lo[4] = {0, 1, 2, 3}, tp_hi[4] = {4, 5, 6, 7};
    dt_mesh_ranks(tp, got);
    expect_ints(ctx, "(2, 4) [dp, tp]", "mesh[\"tp\"]", got, r < 4 ? tp_lo : tp_hi, 4);
    const int dp_exp[2] = {r % 4, r % 4 + 4};
    dt_mesh_ranks(dp, got);
    expect_ints(ctx, "(2, 4) [dp, tp]", "mesh[\"dp\"]", got, dp_exp, 2);
    if (r == 1) TU_CHECK(got[0] == 1 && got[1] == 5, "mesh[\"dp\"] on rank 1 is [%d,%d]", got[0], got[1]);
    dt_mesh_describe(tp, d, sizeof d);
    TU_CHECK(strcmp(d, "(4,) [tp]") == 0, "describe of mesh[\"tp\"]: '%s'", d);
  }
  dt_mesh_group_ranks(m, 1, got);
  expect_ints(ctx, "(2, 4) [dp, tp]", "tp group", got, r < 4 ? (const int[]){0, 1, 2, 3}
                                                          : (const int[]){4, 5, 6, 7}, 4);
  dt_mesh_group_ranks(m, 0, got);
  expect_ints(ctx, "(2, 4) [dp, tp]", "dp group", got, (const int[]){r % 4, r % 4 + 4}, 2);
  if (r == 6)
    TU_CHECK(dt_mesh_coord(m, 0) == 1 && dt_mesh_coord(m, 1) == 2, "rank 6 is at (%d, %d)",
             dt_mesh_coord(m, 0), dt_mesh_coord(m, 1));
  TU_CHECK(dt_mesh_rank_at(m, (const int[]){1, 2}) == 6, "rank at (1, 2) is %d",
           dt_mesh_rank_at(m, (const int[]){1, 2}));
  TU_CHECK(dt_mesh_rank_at(m, (const int[]){2, 0}) == -1, "rank at (2, 0) is not -1");
  /* The ledger names the group after the dim. */
  double x = r, sum = 0;
  TU_OK(ctx, dt_comm_all_reduce(dt_mesh_comm(m, 1), &x, &sum, 1, DT_F64, DT_RED_SUM));
  TU_CHECK(sum == (r < 4 ? 6.0 : 22.0), "tp all_reduce sum %g", sum);
  if (dt_ledger_of(ctx)->enabled && dt_ledger_of(ctx)->n > 0)
    TU_CHECK(strcmp(dt_ledger_of(ctx)->rows[dt_ledger_of(ctx)->n - 1].group, "tp") == 0,
             "ledger group '%s', expected tp", dt_ledger_of(ctx)->rows[dt_ledger_of(ctx)->n - 1].group);
  TU_OK(ctx, dt_mesh_slice(m, 2, n24, &same));
  TU_CHECK(same == m, "mesh[\"dp\", \"tp\"] is not the mesh itself");
  const char *rev[2] = {"tp", "dp"};
  expect_invalid(ctx, "mesh[\"tp\", \"dp\"]", dt_mesh_slice(m, 2, rev, &bad), bad, "ascending");
  const char *unk[1] = {"pp"};
  expect_invalid(ctx, "mesh[\"pp\"]", dt_mesh_slice(m, 1, unk, &bad), bad, "'pp'");
  const char *dup[2] = {"dp", "dp"};
  expect_invalid(ctx, "mesh[\"dp\", \"dp\"]", dt_mesh_slice(m, 2, dup, &bad), bad, "twice");
  expect_invalid(ctx, "mesh[()]", dt_mesh_slice(m, 0, n24, &bad), bad, "at least one");
  dt_mesh_free(tp); /* a slice: no-op */
  dt_mesh_free(m);

  /* (2, 2, 2) [dp, pp, cp]: mesh["dp", "cp"] is [[0,1],[4,5]] on ranks 0, 1, 4, 5. */
  const int s222[3] = {2, 2, 2};
  const char *const n3[3] = {"dp", "pp", "cp"};
  dt_mesh *m3 = NULL, *dpcp = NULL, *f = NULL;
  TU_OK(ctx, dt_mesh_create(ctx, w, 3, s222, n3, &m3));
  if (!m3) return;
  const char *ndc[2] = {"dp", "cp"};
  TU_OK(ctx, dt_mesh_slice(m3, 2, ndc, &dpcp));
  if (dpcp) {
    TU_CHECK(dt_mesh_size(dpcp, 0) == 2 && dt_mesh_size(dpcp, 1) == 2, "mesh_3d[dp, cp] shape");
    dt_mesh_ranks(dpcp, got);
    bool lo = r == 0 || r == 1 || r == 4 || r == 5;
    expect_ints(ctx, "(2, 2, 2) [dp, pp, cp]", "mesh[\"dp\", \"cp\"]", got,
                lo ? (const int[]){0, 1, 4, 5} : (const int[]){2, 3, 6, 7}, 4);
    /* Flattened with these names it keeps the slice's ranks, in row-major order. */
    TU_OK(ctx, dt_mesh_flatten(dpcp, NULL, &f));
    if (f) {
      TU_CHECK(strcmp(dt_mesh_name(f, 0), "dp_cp") == 0, "flattened name %s", dt_mesh_name(f, 0));
      dt_mesh_ranks(f, got);
      expect_ints(ctx, "(2, 2, 2) [dp, pp, cp]", "flatten of mesh[\"dp\", \"cp\"]", got,
                  lo ? (const int[]){0, 1, 4, 5} : (const int[]){2, 3, 6, 7}, 4);
      check_wired(ctx, dt_mesh_comm(f, 0), got, 4, "(2, 2, 2) [dp, pp, cp]", "dp_cp comm");
      /* The mixture of a plain dim and a flattened one that it interleaves with:
       * pp sorts before dp_cp (whose last dim is cp); the result is exact:
       * row-major over (pp, (dp, cp)). */
      const char *mix[2] = {"pp", "dp_cp"};
      dt_mesh *mx = NULL;
      TU_OK(ctx, dt_mesh_slice(m3, 2, mix, &mx));
      if (mx) {
        dt_mesh_ranks(mx, got);
        expect_ints(ctx, "(2, 2, 2) [dp, pp, cp]", "mesh[\"pp\", \"dp_cp\"]", got,
                    (const int[]){0, 1, 4, 5, 2, 3, 6, 7}, 8);
        TU_CHECK(dt_mesh_comm(mx, 1) == dt_mesh_comm(f, 0), "mixed slice does not reuse dp_cp");
      }
    }
  }
  dt_mesh_free(m3);

  /* PyTorch's test_flatten_mesh_3d: (2, 2, 2) [dp, cp, tp], mesh_3d["dp", "cp"]._flatten()
   * is [0,2,4,6] on ranks 0, 2, 4, 6 and [1,3,5,7] on the others, named dp_cp. */
  const char *const nct[3] = {"dp", "cp", "tp"};
  TU_OK(ctx, dt_mesh_create(ctx, w, 3, s222, nct, &m3));
  if (!m3) return;
  dpcp = f = NULL;
  TU_OK(ctx, dt_mesh_slice(m3, 2, ndc, &dpcp));
  if (dpcp) TU_OK(ctx, dt_mesh_flatten(dpcp, NULL, &f));
  if (f) {
    const int ev[4] = {0, 2, 4, 6}, od[4] = {1, 3, 5, 7};
    TU_CHECK(strcmp(dt_mesh_name(f, 0), "dp_cp") == 0, "flattened name %s", dt_mesh_name(f, 0));
    dt_mesh_describe(f, d, sizeof d);
    TU_CHECK(strcmp(d, "(4,) [dp_cp]") == 0, "describe of dp_cp: '%s'", d);
    dt_mesh_ranks(f, got);
    expect_ints(ctx, "(2, 2, 2) [dp, cp, tp]", "dp_cp", got, r % 2 ? od : ev, 4);
    dt_comm *fc = dt_mesh_comm(f, 0);
    TU_CHECK(fc && fc != dt_mesh_comm(m3, 0) && fc != dt_mesh_comm(m3, 1) &&
                 fc != dt_mesh_comm(m3, 2), "dp_cp has no new communicator");
    check_wired(ctx, fc, r % 2 ? od : ev, 4, "(2, 2, 2) [dp, cp, tp]", "dp_cp comm");
    if (fc) {
      double one = 1, cnt = 0;
      TU_OK(ctx, dt_comm_all_reduce(fc, &one, &cnt, 1, DT_F64, DT_RED_SUM));
      TU_CHECK(cnt == 4, "dp_cp all_reduce of 1 is %g", cnt);
    }
    dt_mesh *again = NULL, *viaroot = NULL, *tpm = NULL, *self = NULL;
    TU_OK(ctx, dt_mesh_flatten(dpcp, NULL, &again));
    TU_CHECK(again == f, "second flatten is not the cached mesh");
    TU_OK(ctx, dt_mesh_flatten(dpcp, "dp_cp", &again));
    TU_CHECK(again == f, "flatten with the explicit same name is not the cached mesh");
    const char *ndpcp[1] = {"dp_cp"};
    TU_OK(ctx, dt_mesh_slice(m3, 1, ndpcp, &viaroot));
    TU_CHECK(viaroot == f, "root[\"dp_cp\"] is not the flattened mesh");
    /* A 1-D mesh flattened to its own name is itself. */
    TU_OK(ctx, dt_mesh_slice(m3, 1, (const char *const[]){"tp"}, &tpm));
    if (tpm) {
      TU_OK(ctx, dt_mesh_flatten(tpm, NULL, &self));
      TU_CHECK(self == tpm, "mesh[\"tp\"] flattened to tp is not itself");
      TU_OK(ctx, dt_mesh_flatten(tpm, "tp", &self));
      TU_CHECK(self == tpm, "mesh[\"tp\"] flattened to \"tp\" is not itself");
    }
    /* dp_cp with other dims; a name that is a dim name; a bad name. */
    dt_mesh *dptp = NULL;
    const char *ndt[2] = {"dp", "tp"};
    TU_OK(ctx, dt_mesh_slice(m3, 2, ndt, &dptp));
    if (dptp) {
      expect_invalid(ctx, "flatten [dp, tp] as dp_cp", dt_mesh_flatten(dptp, "dp_cp", &bad), bad,
                     "already exists");
      expect_invalid(ctx, "flatten [dp, tp] as tp", dt_mesh_flatten(dptp, "tp", &bad), bad,
                     "clashes");
      expect_invalid(ctx, "flatten [dp, tp] as dp-tp", dt_mesh_flatten(dptp, "dp-tp", &bad), bad,
                     "identifier");
      expect_invalid(ctx, "flatten [dp, cp] as cp", dt_mesh_flatten(dpcp, "cp", &bad), bad,
                     "clashes");
    }
    /* Mixtures with the flattened name. */
    dt_mesh *mx = NULL;
    TU_OK(ctx, dt_mesh_slice(m3, 2, (const char *const[]){"dp_cp", "tp"}, &mx));
    if (mx) {
      TU_CHECK(dt_mesh_size(mx, 0) == 4 && dt_mesh_size(mx, 1) == 2, "root[dp_cp, tp] shape");
      dt_mesh_ranks(mx, got);
      expect_ints(ctx, "(2, 2, 2) [dp, cp, tp]", "root[\"dp_cp\", \"tp\"]", got,
                  (const int[]){0, 1, 2, 3, 4, 5, 6, 7}, 8);
      TU_CHECK(dt_mesh_comm(mx, 0) == fc && dt_mesh_comm(mx, 1) == dt_mesh_comm(m3, 2),
               "root[dp_cp, tp] does not reuse the comms");
    }
    expect_invalid(ctx, "root[tp, dp_cp]",
                   dt_mesh_slice(m3, 2, (const char *const[]){"tp", "dp_cp"}, &bad), bad,
                   "ascending");
    expect_invalid(ctx, "root[dp, dp_cp]",
                   dt_mesh_slice(m3, 2, (const char *const[]){"dp", "dp_cp"}, &bad), bad,
                   "both span");
    expect_invalid(ctx, "root[dp, cp][dp_cp]", dt_mesh_slice(dpcp, 1, ndpcp, &bad), bad,
                   "root");
  }
  dt_mesh_free(m3);
}

/* Bad arguments: every rank fails alike, with a message, and nothing hangs. */
static void test_errors(dt_ctx *ctx) {
  dt_comm *w = ctx->world;
  int W = w->size;
  dt_mesh *m = NULL;
  char want[128];
  const char *const two[2] = {"dp", "tp"};
  if (W != 6) {
    snprintf(want, sizeof want, "mesh shape (2, 3) has 6 ranks but the world has %d", W);
    expect_invalid(ctx, "shape (2, 3)", dt_mesh_create(ctx, w, 2, (const int[]){2, 3}, two, &m),
                   m, want);
  }
  snprintf(want, sizeof want, "has %d ranks but the world has %d", 2 * W, W);
  expect_invalid(ctx, "shape (2, W)", dt_mesh_create(ctx, w, 2, (const int[]){2, W}, two, &m), m,
                 want);
  expect_invalid(ctx, "duplicate name",
                 dt_mesh_create(ctx, w, 2, (const int[]){1, W}, (const char *const[]){"dp", "dp"}, &m),
                 m, "'dp' is used twice");
  expect_invalid(ctx, "0 dims", dt_mesh_create(ctx, w, 0, (const int[]){W}, two, &m), m,
                 "1 to 5 dims");
  expect_invalid(ctx, "6 dims",
                 dt_mesh_create(ctx, w, 6, (const int[]){1, 1, 1, 1, 1, W},
                                (const char *const[]){"a", "b", "c", "d", "e", "f"}, &m),
                 m, "1 to 5 dims");
  expect_invalid(ctx, "size 0", dt_mesh_create(ctx, w, 2, (const int[]){0, W}, two, &m), m,
                 "size 0");
  expect_invalid(ctx, "size -1", dt_mesh_create(ctx, w, 2, (const int[]){-1, -W}, two, &m), m,
                 "size -1");
  expect_invalid(ctx, "empty name",
                 dt_mesh_create(ctx, w, 2, (const int[]){1, W}, (const char *const[]){"dp", ""}, &m),
                 m, "empty name");
  expect_invalid(ctx, "NULL name",
                 dt_mesh_create(ctx, w, 2, (const int[]){1, W}, (const char *const[]){NULL, "tp"}, &m),
                 m, "NULL name");
  expect_invalid(ctx, "long name",
                 dt_mesh_create(ctx, w, 1, (const int[]){W},
                                (const char *const[]){"a_name_that_is_much_too_long_for_a_mesh"}, &m),
                 m, "longer than 31");
  expect_invalid(ctx, "non-identifier",
                 dt_mesh_create(ctx, w, 1, (const int[]){W}, (const char *const[]){"dp-tp"}, &m),
                 m, "not an identifier");
  expect_invalid(ctx, "leading digit",
                 dt_mesh_create(ctx, w, 1, (const int[]){W}, (const char *const[]){"2d"}, &m), m,
                 "not an identifier");
  /* A 31-character name is the longest allowed; default names are dim0, dim1. */
  const char *longest = "abcdefghijklmnopqrstuvwxyz_1234";
  TU_OK(ctx, dt_mesh_create(ctx, w, 1, (const int[]){W}, &longest, &m));
  if (m) {
    TU_CHECK(strcmp(dt_mesh_name(m, 0), longest) == 0, "31-char name not kept");
    dt_mesh *self = NULL, *bad = NULL;
    /* Flattening a 1-D mesh to its own name is itself; the default joined name
     * of (longest, x) would be too long. */
    TU_OK(ctx, dt_mesh_flatten(m, NULL, &self));
    TU_CHECK(self == m, "1-D root flattened is not itself");
    const char *unk[1] = {"nope"};
    expect_invalid(ctx, "unknown slice name", dt_mesh_slice(m, 1, unk, &bad), bad,
                   "unknown mesh dim name 'nope'");
    dt_mesh_free(m);
    m = NULL;
  }
  TU_OK(ctx, dt_mesh_create(ctx, w, 2, (const int[]){1, W}, NULL, &m));
  if (m) {
    TU_CHECK(strcmp(dt_mesh_name(m, 0), "dim0") == 0 && strcmp(dt_mesh_name(m, 1), "dim1") == 0,
             "default names are %s, %s", dt_mesh_name(m, 0), dt_mesh_name(m, 1));
    TU_CHECK(dt_mesh_size(m, 2) == 0 && dt_mesh_name(m, 2) == NULL && dt_mesh_coord(m, -1) == -1 &&
                 dt_mesh_comm(m, 5) == NULL && dt_mesh_dim(m, "tp") == -1,
             "out-of-range accessors");
    dt_mesh_free(m);
    m = NULL;
  }
  const char *const tlong[2] = {"abcdefghijklmnop", "qrstuvwxyz_1234"};
  TU_OK(ctx, dt_mesh_create(ctx, w, 2, (const int[]){1, W}, tlong, &m));
  if (m) {
    dt_mesh *bad = NULL;
    expect_invalid(ctx, "long default flatten name", dt_mesh_flatten(m, NULL, &bad), bad,
                   "pass a name");
    dt_mesh_free(m);
    m = NULL;
  }
  expect_invalid(ctx, "NULL world", dt_mesh_create(ctx, NULL, 1, (const int[]){W}, two, &m), m,
                 "NULL");
  /* Still in step: a collective after all the failures completes. */
  TU_OK(ctx, dt_comm_barrier(w));
}

/* A mesh over a communicator that is not the world, with reversed rank order:
 * mesh index i is member i, whose global rank is world_ranks[i]. */
static void test_subworld(dt_ctx *ctx) {
  dt_comm *w = ctx->world, *half = NULL;
  if (w->size % 4) return;
  TU_OK(ctx, dt_comm_split(w, ctx->rank % 2, -ctx->rank, "half", &half));
  if (!half) return;
  int exp_members = w->size / 2;
  TU_CHECK(half->size == exp_members, "half has %d members", half->size);
  const int shape[2] = {2, w->size / 4};
  const char *const names[2] = {"a", "b"};
  dt_mesh *m = check_mesh(ctx, half, 2, shape, names, true);
  if (m) {
    ref_mesh rm; /* the flattened comm is split from `half`, not the world */
    ref_init(&rm, 2, shape, names, half);
    check_flatten(ctx, &rm, m, 3u, NULL);
  }
  dt_mesh_free(m);
  dt_comm_destroy(half);
}

/* Every factorization of the world: 5-D with size-1 dims and compact. */
static void test_factorizations(dt_ctx *ctx, int max_meshes, bool flatten_all) {
  dt_comm *w = ctx->world;
  for (int i = 0; i < w->size; i++)
    TU_CHECK(w->world_ranks[i] == i, "world member %d has global rank %d", i, w->world_ranks[i]);
  factorizations *fs = malloc(sizeof *fs);
  if (!fs) {
    TU_CHECK(0, "out of memory");
    return;
  }
  enum_factorizations(w->size, fs);
  int step = fs->n > max_meshes ? (fs->n + max_meshes - 1) / max_meshes : 1;
  for (int t = 0; t < fs->n; t += step) {
    const int *shape = fs->t[t];
    /* 5-D form, with every ascending slice. */
    dt_mesh *m = check_mesh(ctx, w, NDIM5, shape, TT, true);
    if (m) {
      ref_mesh rm;
      ref_init(&rm, NDIM5, shape, TT, w);
      if (flatten_all) /* every subset of two dims or more, default names */
        for (unsigned sel = 1; sel < (1u << NDIM5); sel++)
          if (sel & (sel - 1)) check_flatten(ctx, &rm, m, sel, NULL);
      {
        /* TorchTitan's: dp_shard_cp, dp (= dp_replicate x dp_shard), dp_cp. */
        dt_mesh *f1 = check_flatten(ctx, &rm, m, 1u << 2 | 1u << 3, NULL);
        dt_mesh *f2 = check_flatten(ctx, &rm, m, 1u << 1 | 1u << 2, "dp");
        check_flatten(ctx, &rm, m, 1u << 1 | 1u << 2 | 1u << 3, "dp_cp");
        TU_CHECK(!f1 || strcmp(dt_mesh_name(f1, 0), "dp_shard_cp") == 0, "default name %s",
                 f1 ? dt_mesh_name(f1, 0) : "");
        /* Slices mixing plain and flattened dims, as TorchTitan takes them. */
        struct { int k; const char *n[3]; unsigned d[3]; } mixes[] = {
            {2, {"dp_replicate", "dp_shard_cp"}, {1u << 1, 1u << 2 | 1u << 3}},
            {2, {"dp", "cp"}, {1u << 1 | 1u << 2, 1u << 3}},
            {3, {"pp", "dp_shard_cp", "tp"}, {1u << 0, 1u << 2 | 1u << 3, 1u << 4}},
            {2, {"dp_cp", "tp"}, {1u << 1 | 1u << 2 | 1u << 3, 1u << 4}},
        };
        for (size_t q = 0; q < sizeof mixes / sizeof mixes[0]; q++) {
          dt_mesh *s = NULL;
          TU_OK(ctx, dt_mesh_slice(m, mixes[q].k, mixes[q].n, &s));
          if (s) check_submesh(ctx, &rm, s, mixes[q].k, mixes[q].d, mixes[q].n);
          if (s && q == 0 && f1)
            TU_CHECK(dt_mesh_comm(s, 0) == dt_mesh_comm(m, 1) && dt_mesh_comm(s, 1) == dt_mesh_comm(f1, 0),
                     "HSDP slice does not reuse the comms");
          if (s && q == 1 && f2)
            TU_CHECK(dt_mesh_comm(s, 0) == dt_mesh_comm(f2, 0), "[dp, cp] does not reuse dp");
        }
        dt_mesh *bad = NULL;
        expect_invalid(ctx, "root[dp_shard_cp, dp]",
                       dt_mesh_slice(m, 2, (const char *const[]){"dp_shard_cp", "dp"}, &bad), bad,
                       "both span");
        expect_invalid(ctx, "root[cp, dp]",
                       dt_mesh_slice(m, 2, (const char *const[]){"cp", "dp"}, &bad), bad,
                       "ascending");
      }
      dt_mesh_free(m);
    }
    /* Compact form: size-1 dims dropped, order kept. */
    int cs[NDIM5], k = 0;
    const char *cn[NDIM5];
    for (int i = 0; i < NDIM5; i++)
      if (shape[i] > 1) {
        cs[k] = shape[i];
        cn[k++] = TT[i];
      }
    if (k == 0) {
      cs[0] = 1;
      cn[0] = TT[0];
      k = 1;
    }
    if (k < NDIM5) dt_mesh_free(check_mesh(ctx, w, k, cs, cn, true));
  }
  free(fs);
}

static dt_status run_rank(dt_ctx *ctx, void *arg) {
  const job *jb = arg;
  int W = ctx->world_size;
  bool threads = jb->backend == DT_BACKEND_THREADS;
  if (W == 8) test_examples(ctx);
  test_errors(ctx);
  test_subworld(ctx);
  /* All factorizations up to 32 ranks (8 on MPI), a few beyond; flattening of
   * every dim subset up to 8 ranks, TorchTitan's flattens always. */
  test_factorizations(ctx, W <= (threads ? 32 : 8) ? MAXF : 8, W <= 8);
  if (!threads) {
    /* Sum the failures of all processes so every rank reports the job's. */
    double mine = (double)tu_failures(), all = 0;
    TU_OK(ctx, dt_comm_all_reduce(ctx->world, &mine, &all, 1, DT_F64, DT_RED_SUM));
    if (all > 0 && tu_failures() == 0)
      tu_fail(__FILE__, __LINE__, "rank %d: %g failures on other ranks", ctx->rank, all);
  }
  return DT_OK;
}

static dt_status launch(dt_backend b, int world) {
  dt_launch_opts o;
  memset(&o, 0, sizeof o);
  o.backend = b;
  o.world = world;
  o.timeout_s = 120; /* a hang is a failure, well before the suite's timeout */
  o.device = DT_DEV_CPU;
  job jb = {b};
  dt_launch_report rep;
  memset(&rep, 0, sizeof rep);
  double t0 = dt_now();
  dt_status s = dt_launch(&o, run_rank, &jb, &rep);
  TU_CHECK(s == DT_OK, "dt_launch(%s, %d) -> %s: rank %d: %s", dt_backend_name(b), world,
           dt_status_str(s), rep.failed_rank, rep.failed_msg);
  if (b == DT_BACKEND_THREADS || rep.first_rank == 0)
    printf("test_mesh: %s world %d: %.2f s\n", dt_backend_name(b), rep.world, dt_now() - t0);
  dt_launch_report_free(&rep);
  return s;
}

int main(int argc, char **argv) {
  tu_opts o;
  tu_parse(argc, argv, &o); /* exits 77 when the backend is not built */
  if (o.backend == DT_BACKEND_MPI) {
    dt_status s = launch(DT_BACKEND_MPI, 0);
    int rc = tu_finish("test_mesh (mpi)");
    dt_mpi_finish(s == DT_OK);
    return rc;
  }
  launch(DT_BACKEND_THREADS, 8);
  launch(DT_BACKEND_THREADS, 32);
  return tu_finish("test_mesh");
}
