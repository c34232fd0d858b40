/* lib/mesh/mesh.c: DeviceMesh, an N-D named mesh of ranks with one communicator per dim.
 *
 * What it is: the bookkeeping of PyTorch's DeviceMesh (torch/distributed/
 * device_mesh.py: init_device_mesh, __getitem__ slicing, _flatten) over the
 * dt_comm front. The root mesh is arange(world->size).view(shape), row-major, in
 * terms of the ranks of the `world` communicator it was created over; global ranks
 * are world->world_ranks[i]. Slices and flattened meshes are cached in their root
 * and freed with it. What it is not: it knows nothing of tensors or placements,
 * never prints and holds no global state (everything hangs off the root mesh,
 * which belongs to one rank).
 *
 * Representation. Every dim of every mesh (root, slice or flattened) is a
 * "layout": an ordered list of root dims, outermost first. A root dim spans
 * itself; a flattened dim spans the root dims it flattened. The coordinate along
 * a dim is the row-major index of the rank's root coordinates over its layout,
 * and the ranks of a mesh are found by varying the root coordinates of its
 * layouts while the other root coordinates stay those of the calling rank. This
 * one rule gives slices, flattened meshes and slices that mix both.
 */
#include "mesh/mesh.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct mesh_dim {
  char name[DT_MESH_NAME_LEN];
  int size;                 /* product of the root sizes of the layout */
  int nrd;                  /* root dims spanned: 1 for a plain dim */
  int rd[DT_MESH_MAX_DIMS]; /* those root dims, outermost first */
  int coord;                /* this rank's coordinate (== its rank in comm) */
  dt_comm *comm;            /* owned by the root (root dims) or by a flattened mesh */
} mesh_dim;

struct dt_mesh {
  dt_ctx *ctx;
  dt_mesh *root;            /* itself for a root mesh */
  int ndim;
  mesh_dim dim[DT_MESH_MAX_DIMS];
  int size;                 /* ranks in the mesh */
  int *ranks;               /* their world ranks, row-major (owned) */
  bool flattened;           /* made by dt_mesh_flatten: owns dim[0].comm */
  /* root only */
  dt_comm *world;           /* not owned: the launcher's or the caller's */
  dt_mesh **kids;           /* slices and flattened meshes, in creation order */
  int n_kids, cap_kids;
};

/* ---- helpers -------------------------------------------------------------- */

static dt_ctx *mesh_ctx(const dt_mesh *m) { return m ? m->ctx : NULL; }

/* [A-Za-z_][A-Za-z0-9_]* */
static bool is_identifier(const char *s) {
  if (!((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || *s == '_')) return false;
  for (s++; *s; s++) {
    if (!((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') ||
          *s == '_'))
      return false;
  }
  return true;
}

/* Validates a dim name; `what` says where it came from ("mesh dim 2", "flattened dim"). */
static dt_status check_name(dt_ctx *ctx, const char *call, const char *what, const char *name) {
  if (!name) return dt_error(ctx, DT_ERR_INVALID, call, "%s has a NULL name", what);
  size_t len = strlen(name);
  if (len == 0) return dt_error(ctx, DT_ERR_INVALID, call, "%s has an empty name", what);
  if (len > DT_MESH_NAME_LEN - 1)
    return dt_error(ctx, DT_ERR_INVALID, call, "%s name '%.40s%s' is longer than %d characters",
                    what, name, len > 40 ? "..." : "", DT_MESH_NAME_LEN - 1);
  if (!is_identifier(name))
    return dt_error(ctx, DT_ERR_INVALID, call,
                    "%s name '%s' is not an identifier ([A-Za-z_][A-Za-z0-9_]*)", what, name);
  return DT_OK;
}

/* Appends "(2, 4)" (a 1-D shape as "(8,)") to buf at *pos. */
static void fmt_append(char *buf, size_t n, size_t *pos, const char *fmt, ...) DT_PRINTF(4, 5);
static void fmt_append(char *buf, size_t n, size_t *pos, const char *fmt, ...) {
  if (*pos >= n) return;
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(buf + *pos, n - *pos, fmt, ap);
  va_end(ap);
  if (k < 0) return;
  *pos = (size_t)k >= n - *pos ? n : *pos + (size_t)k;
}

static void fmt_shape(char *buf, size_t n, int ndim, const int *shape) {
  size_t pos = 0;
  if (n == 0) return;
  buf[0] = '\0';
  fmt_append(buf, n, &pos, "(");
  for (int i = 0; i < ndim; i++) fmt_append(buf, n, &pos, i ? ", %d" : "%d", shape[i]);
  fmt_append(buf, n, &pos, ndim == 1 ? ",)" : ")");
}

/* "[dp, cp]" for the root dims of a layout. */
static void fmt_layout(const dt_mesh *root, const mesh_dim *d, char *buf, size_t n) {
  size_t pos = 0;
  if (n == 0) return;
  buf[0] = '\0';
  fmt_append(buf, n, &pos, "[");
  for (int k = 0; k < d->nrd; k++)
    fmt_append(buf, n, &pos, k ? ", %s" : "%s", root->dim[d->rd[k]].name);
  fmt_append(buf, n, &pos, "]");
}

/* Row-major index of the root coordinates rc over the layout of d. */
static int layout_index(const dt_mesh *root, const mesh_dim *d, const int *rc) {
  int idx = 0;
  for (int k = 0; k < d->nrd; k++) idx = idx * root->dim[d->rd[k]].size + rc[d->rd[k]];
  return idx;
}

/* Inverse of layout_index: writes the root coordinates of index e into rc. */
static void layout_set(const dt_mesh *root, const mesh_dim *d, int e, int *rc) {
  for (int k = d->nrd - 1; k >= 0; k--) {
    int s = root->dim[d->rd[k]].size;
    rc[d->rd[k]] = e % s;
    e /= s;
  }
}

/* World rank at the given coordinates of m; other root coordinates are this rank's. */
static int rank_at(const dt_mesh *m, const int *coords) {
  const dt_mesh *root = m->root;
  int rc[DT_MESH_MAX_DIMS];
  for (int j = 0; j < root->ndim; j++) rc[j] = root->dim[j].coord;
  for (int i = 0; i < m->ndim; i++) layout_set(root, &m->dim[i], coords[i], rc);
  int idx = 0;
  for (int j = 0; j < root->ndim; j++) idx = idx * root->dim[j].size + rc[j];
  return root->world->world_ranks[idx];
}

/* Fills m->size, the coordinates and m->ranks from the layouts (m->root set). */
static dt_status fill_ranks(dt_mesh *m) {
  const dt_mesh *root = m->root;
  int rc[DT_MESH_MAX_DIMS];
  for (int j = 0; j < root->ndim; j++) rc[j] = root->dim[j].coord;
  m->size = 1;
  for (int i = 0; i < m->ndim; i++) {
    m->size *= m->dim[i].size;
    m->dim[i].coord = layout_index(root, &m->dim[i], rc);
  }
  m->ranks = malloc((size_t)m->size * sizeof *m->ranks);
  if (!m->ranks) return dt_error(m->ctx, DT_ERR_NOMEM, "dt_mesh", "out of memory for %d ranks",
                                 m->size);
  int c[DT_MESH_MAX_DIMS];
  for (int f = 0; f < m->size; f++) {
    int e = f;
    for (int i = m->ndim - 1; i >= 0; i--) {
      c[i] = e % m->dim[i].size;
      e /= m->dim[i].size;
    }
    m->ranks[f] = rank_at(m, c);
  }
  return DT_OK;
}

static dt_status add_kid(dt_mesh *root, dt_mesh *kid) {
  if (root->n_kids == root->cap_kids) {
    int cap = root->cap_kids ? 2 * root->cap_kids : 8;
    dt_mesh **k = realloc(root->kids, (size_t)cap * sizeof *k);
    if (!k) return dt_error(root->ctx, DT_ERR_NOMEM, "dt_mesh", "out of memory for submeshes");
    root->kids = k;
    root->cap_kids = cap;
  }
  root->kids[root->n_kids++] = kid;
  return DT_OK;
}

static bool same_layout(const mesh_dim *a, const mesh_dim *b) {
  if (a->nrd != b->nrd) return false;
  for (int k = 0; k < a->nrd; k++)
    if (a->rd[k] != b->rd[k]) return false;
  return true;
}

static bool same_dims(const dt_mesh *a, const dt_mesh *b) {
  if (a->ndim != b->ndim) return false;
  for (int i = 0; i < a->ndim; i++)
    if (strcmp(a->dim[i].name, b->dim[i].name) != 0 || !same_layout(&a->dim[i], &b->dim[i]))
      return false;
  return true;
}

static dt_mesh *find_flattened(const dt_mesh *root, const char *name) {
  for (int k = 0; k < root->n_kids; k++)
    if (root->kids[k]->flattened && strcmp(root->kids[k]->dim[0].name, name) == 0)
      return root->kids[k];
  return NULL;
}

static void free_one(dt_mesh *m) {
  if (m->flattened) dt_comm_destroy(m->dim[0].comm);
  free(m->ranks);
  free(m);
}

/* The ranks (in the root's world communicator) of the caller's group over
 * root dims rd[0..nrd) (row-major over them, rd[0] slowest), the other dims'
 * coordinates the caller's: what a split with the mesh's color and key gives,
 * named for dt_comm_split_group. n entries, malloc'd; NULL when out of memory. */
static int *group_members(const dt_mesh *root, const int *rd, int nrd, int n) {
  int *mem = malloc((size_t)n * sizeof *mem);
  if (!mem) return NULL;
  int stride[DT_MESH_MAX_DIMS], s = 1;
  for (int j = root->ndim - 1; j >= 0; j--) {
    stride[j] = s;
    s *= root->dim[j].size;
  }
  int base = root->world->rank;
  for (int i = 0; i < nrd; i++) base -= root->dim[rd[i]].coord * stride[rd[i]];
  for (int k = 0; k < n; k++) {
    int r = base, q = k;
    for (int i = nrd - 1; i >= 0; i--) {
      r += (q % root->dim[rd[i]].size) * stride[rd[i]];
      q /= root->dim[rd[i]].size;
    }
    mem[k] = r;
  }
  return mem;
}

/* ---- creation -------------------------------------------------------------- */

dt_status dt_mesh_create(dt_ctx *ctx, dt_comm *world, int ndim, const int *shape,
                         const char *const *names, dt_mesh **out) {
  static const char *call = "dt_mesh_create";
  if (!ctx && world) ctx = world->ctx;
  if (out) *out = NULL;
  if (!world || !out) return dt_error(ctx, DT_ERR_INVALID, call, "NULL world or out");
  if (ndim < 1 || ndim > DT_MESH_MAX_DIMS)
    return dt_error(ctx, DT_ERR_INVALID, call, "a mesh has 1 to %d dims, got %d",
                    DT_MESH_MAX_DIMS, ndim);
  if (!shape) return dt_error(ctx, DT_ERR_INVALID, call, "NULL shape");

  /* Validation first: every rank sees the same arguments, so every rank fails
   * here together and nobody is left waiting in a split. */
  char shp[128];
  fmt_shape(shp, sizeof shp, ndim, shape);
  int64_t prod = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 1)
      return dt_error(ctx, DT_ERR_INVALID, call, "mesh shape %s: dim %d has size %d; sizes must be >= 1",
                      shp, i, shape[i]);
    if (prod <= INT32_MAX) prod *= shape[i]; /* saturates well below int64 overflow */
  }
  if (prod != world->size) {
    if (prod > INT32_MAX)
      return dt_error(ctx, DT_ERR_INVALID, call,
                      "mesh shape %s has more than %d ranks but the world has %d", shp,
                      INT32_MAX, world->size);
    return dt_error(ctx, DT_ERR_INVALID, call, "mesh shape %s has %lld ranks but the world has %d",
                    shp, (long long)prod, world->size);
  }
  char dflt[DT_MESH_MAX_DIMS][DT_MESH_NAME_LEN];
  const char *nm[DT_MESH_MAX_DIMS];
  for (int i = 0; i < ndim; i++) {
    if (names) {
      nm[i] = names[i];
    } else {
      snprintf(dflt[i], sizeof dflt[i], "dim%d", i);
      nm[i] = dflt[i];
    }
    char what[32];
    snprintf(what, sizeof what, "mesh dim %d", i);
    DT_CHECK(check_name(ctx, call, what, nm[i]));
    for (int j = 0; j < i; j++)
      if (strcmp(nm[i], nm[j]) == 0)
        return dt_error(ctx, DT_ERR_INVALID, call,
                        "mesh dim name '%s' is used twice (dims %d and %d); names must be unique",
                        nm[i], j, i);
  }
  if (world->rank < 0 || world->rank >= world->size || !world->world_ranks)
    return dt_error(ctx, DT_ERR_INVALID, call, "world communicator '%s' has rank %d of %d",
                    world->name, world->rank, world->size);

  dt_mesh *m = calloc(1, sizeof *m);
  if (!m) return dt_error(ctx, DT_ERR_NOMEM, call, "out of memory");
  m->ctx = ctx;
  m->root = m;
  m->world = world;
  m->ndim = ndim;
  int r = world->rank;
  for (int i = ndim - 1; i >= 0; i--) { /* c_i = (r / prod(shape[i+1:])) % shape[i] */
    mesh_dim *d = &m->dim[i];
    snprintf(d->name, sizeof d->name, "%s", nm[i]);
    d->size = shape[i];
    d->nrd = 1;
    d->rd[0] = i;
    d->coord = r % shape[i];
    r /= shape[i];
  }
  dt_status st = fill_ranks(m);
  if (st != DT_OK) {
    free(m);
    return st;
  }

  /* One split per dim: color numbers this rank's group (row-major over the other
   * coordinates), key is the coordinate along the dim, so group rank == coord. */
  for (int d = 0; d < ndim; d++) {
    int color = 0;
    for (int j = 0; j < ndim; j++)
      if (j != d) color = color * m->dim[j].size + m->dim[j].coord;
    dt_comm *c = NULL;
    int *mem = group_members(m, &d, 1, m->dim[d].size);
    st = mem ? dt_comm_split_group(world, color, m->dim[d].coord, m->dim[d].size, mem,
                                   m->dim[d].name, &c)
             : dt_error(ctx, DT_ERR_NOMEM, call, "out of memory");
    free(mem);
    if (st == DT_OK && (!c || c->size != m->dim[d].size || c->rank != m->dim[d].coord)) {
      st = dt_error(ctx, DT_ERR_INTERNAL, call,
                    "split for mesh dim '%s' gave rank %d of %d, expected %d of %d",
                    m->dim[d].name, c ? c->rank : -1, c ? c->size : 0, m->dim[d].coord,
                    m->dim[d].size);
      dt_comm_destroy(c);
      c = NULL;
    }
    if (st != DT_OK) {
      for (int j = 0; j < d; j++) dt_comm_destroy(m->dim[j].comm);
      free(m->ranks);
      free(m);
      return st;
    }
    m->dim[d].comm = c;
  }
  *out = m;
  return DT_OK;
}

void dt_mesh_free(dt_mesh *m) {
  if (!m || m->root != m) return;
  for (int k = 0; k < m->n_kids; k++) free_one(m->kids[k]);
  free(m->kids);
  for (int d = 0; d < m->ndim; d++) dt_comm_destroy(m->dim[d].comm);
  free(m->ranks);
  free(m);
}

/* ---- accessors ------------------------------------------------------------- */

static bool dim_ok(const dt_mesh *m, int dim) { return m && dim >= 0 && dim < m->ndim; }

int dt_mesh_ndim(const dt_mesh *m) { return m ? m->ndim : 0; }

int dt_mesh_size(const dt_mesh *m, int dim) {
  if (m && dim == -1) return m->size;
  return dim_ok(m, dim) ? m->dim[dim].size : 0;
}

const char *dt_mesh_name(const dt_mesh *m, int dim) {
  return dim_ok(m, dim) ? m->dim[dim].name : NULL;
}

int dt_mesh_dim(const dt_mesh *m, const char *name) {
  if (!m || !name) return -1;
  for (int i = 0; i < m->ndim; i++)
    if (strcmp(m->dim[i].name, name) == 0) return i;
  return -1;
}

int dt_mesh_coord(const dt_mesh *m, int dim) { return dim_ok(m, dim) ? m->dim[dim].coord : -1; }

int dt_mesh_rank_at(const dt_mesh *m, const int *coords) {
  if (!m || !coords) return -1;
  for (int i = 0; i < m->ndim; i++)
    if (coords[i] < 0 || coords[i] >= m->dim[i].size) return -1;
  return rank_at(m, coords);
}

dt_comm *dt_mesh_comm(const dt_mesh *m, int dim) {
  return dim_ok(m, dim) ? m->dim[dim].comm : NULL;
}

void dt_mesh_group_ranks(const dt_mesh *m, int dim, int *out) {
  if (!dim_ok(m, dim) || !out) return;
  int c[DT_MESH_MAX_DIMS];
  for (int i = 0; i < m->ndim; i++) c[i] = m->dim[i].coord;
  for (int k = 0; k < m->dim[dim].size; k++) {
    c[dim] = k;
    out[k] = rank_at(m, c);
  }
}

void dt_mesh_ranks(const dt_mesh *m, int *out) {
  if (!m || !out) return;
  memcpy(out, m->ranks, (size_t)m->size * sizeof *out);
}

void dt_mesh_describe(const dt_mesh *m, char *buf, size_t n) {
  if (!buf || n == 0) return;
  if (!m) {
    snprintf(buf, n, "(null mesh)");
    return;
  }
  int shape[DT_MESH_MAX_DIMS];
  for (int i = 0; i < m->ndim; i++) shape[i] = m->dim[i].size;
  fmt_shape(buf, n, m->ndim, shape);
  size_t pos = strlen(buf);
  fmt_append(buf, n, &pos, " [");
  for (int i = 0; i < m->ndim; i++) fmt_append(buf, n, &pos, i ? ", %s" : "%s", m->dim[i].name);
  fmt_append(buf, n, &pos, "]");
}

/* ---- slicing --------------------------------------------------------------- */

/* "[dp, tp] and flattened [dp_cp]" for error messages: the names m accepts. */
static void fmt_valid_names(const dt_mesh *m, char *buf, size_t n) {
  size_t pos = 0;
  buf[0] = '\0';
  fmt_append(buf, n, &pos, "[");
  for (int i = 0; i < m->ndim; i++) fmt_append(buf, n, &pos, i ? ", %s" : "%s", m->dim[i].name);
  fmt_append(buf, n, &pos, "]");
  if (m->root != m) return;
  int nf = 0;
  for (int k = 0; k < m->n_kids; k++) {
    if (!m->kids[k]->flattened) continue;
    fmt_append(buf, n, &pos, nf++ ? ", %s" : " and flattened [%s", m->kids[k]->dim[0].name);
  }
  if (nf) fmt_append(buf, n, &pos, "]");
}

/* Which names are accepted (documented in mesh.h):
 *  - the mesh's own dim names, in ascending dim order;
 *  - from a root mesh only (as in PyTorch), the names of its flattened meshes. A
 *    flattened name sorts at its last (innermost) root dim, as PyTorch's
 *    `_get_slice_mesh_dims` orders it, and may be mixed with plain dims when the
 *    two span no common root dim: root[("dp_replicate", "dp_shard_cp")] is
 *    TorchTitan's HSDP mesh. The result is exact for any such mix (PyTorch only
 *    reconstructs contiguous flattened dims). */
dt_status dt_mesh_slice(dt_mesh *m, int n, const char *const *names, dt_mesh **out) {
  static const char *call = "dt_mesh_slice";
  dt_ctx *ctx = mesh_ctx(m);
  if (out) *out = NULL;
  if (!m || !out || !names) return dt_error(ctx, DT_ERR_INVALID, call, "NULL mesh, names or out");
  if (n < 1) return dt_error(ctx, DT_ERR_INVALID, call, "slicing needs at least one dim name, got %d", n);
  dt_mesh *root = m->root;
  char valid[256];
  fmt_valid_names(m, valid, sizeof valid);
  if (n > DT_MESH_MAX_DIMS)
    return dt_error(ctx, DT_ERR_INVALID, call, "%d dim names given; a mesh has at most %d (valid: %s)",
                    n, DT_MESH_MAX_DIMS, valid);

  dt_mesh cand;
  memset(&cand, 0, sizeof cand);
  cand.ctx = m->ctx;
  cand.root = root;
  cand.ndim = n;
  int key[DT_MESH_MAX_DIMS];   /* sort key: own dim index, or last root dim from the root */
  int owner[DT_MESH_MAX_DIMS]; /* root dim -> entry spanning it, -1 none */
  for (int j = 0; j < DT_MESH_MAX_DIMS; j++) owner[j] = -1;
  for (int i = 0; i < n; i++) {
    const char *nm = names[i];
    if (!nm) return dt_error(ctx, DT_ERR_INVALID, call, "dim name %d is NULL", i);
    for (int k = 0; k < i; k++)
      if (strcmp(names[k], nm) == 0)
        return dt_error(ctx, DT_ERR_INVALID, call, "mesh dim name '%s' is given twice", nm);
    const mesh_dim *src = NULL;
    int j = dt_mesh_dim(m, nm);
    if (j >= 0) {
      src = &m->dim[j];
      key[i] = m == root ? m->dim[j].rd[0] : j;
    } else {
      const dt_mesh *f = find_flattened(root, nm);
      if (f && m != root)
        return dt_error(ctx, DT_ERR_INVALID, call,
                        "'%s' is a flattened dim of the root mesh: slice it from the root "
                        "(this mesh has %s)", nm, valid);
      if (!f)
        return dt_error(ctx, DT_ERR_INVALID, call, "unknown mesh dim name '%s' (valid: %s)", nm,
                        valid);
      src = &f->dim[0];
      key[i] = 0;
      for (int k = 0; k < src->nrd; k++)
        if (src->rd[k] > key[i]) key[i] = src->rd[k];
    }
    for (int k = 0; k < src->nrd; k++) {
      int rd = src->rd[k];
      if (owner[rd] >= 0)
        return dt_error(ctx, DT_ERR_INVALID, call,
                        "'%s' and '%s' both span mesh dim '%s'; slice dims must not overlap",
                        names[owner[rd]], nm, root->dim[rd].name);
      owner[rd] = i;
    }
    if (i > 0 && key[i] <= key[i - 1])
      return dt_error(ctx, DT_ERR_INVALID, call,
                      "mesh dim names must be in ascending dim order (as in PyTorch): '%s' "
                      "(dim %d) comes after '%s' (dim %d)",
                      nm, key[i], names[i - 1], key[i - 1]);
    cand.dim[i] = *src;
  }
  if (same_dims(&cand, m)) {
    *out = m;
    return DT_OK;
  }
  if (same_dims(&cand, root)) {
    *out = root;
    return DT_OK;
  }
  for (int k = 0; k < root->n_kids; k++) {
    if (same_dims(&cand, root->kids[k])) {
      *out = root->kids[k];
      return DT_OK;
    }
  }
  dt_mesh *s = malloc(sizeof *s);
  if (!s) return dt_error(ctx, DT_ERR_NOMEM, call, "out of memory");
  *s = cand;
  dt_status st = fill_ranks(s);
  if (st == DT_OK) st = add_kid(root, s);
  if (st != DT_OK) {
    free(s->ranks);
    free(s);
    return st;
  }
  *out = s;
  return DT_OK;
}

/* ---- flattening ------------------------------------------------------------ */

dt_status dt_mesh_flatten(dt_mesh *sub, const char *name, dt_mesh **out) {
  static const char *call = "dt_mesh_flatten";
  dt_ctx *ctx = mesh_ctx(sub);
  if (out) *out = NULL;
  if (!sub || !out) return dt_error(ctx, DT_ERR_INVALID, call, "NULL mesh or out");
  dt_mesh *root = sub->root;

  char joined[DT_MESH_NAME_LEN];
  if (!name) {
    size_t pos = 0, need = 0;
    for (int i = 0; i < sub->ndim; i++) need += strlen(sub->dim[i].name) + (i ? 1 : 0);
    if (need > DT_MESH_NAME_LEN - 1) {
      char full[DT_MESH_MAX_DIMS * DT_MESH_NAME_LEN];
      size_t fp = 0;
      for (int i = 0; i < sub->ndim; i++)
        fmt_append(full, sizeof full, &fp, i ? "_%s" : "%s", sub->dim[i].name);
      return dt_error(ctx, DT_ERR_INVALID, call,
                      "default flattened name '%s' is longer than %d characters; pass a name",
                      full, DT_MESH_NAME_LEN - 1);
    }
    joined[0] = '\0';
    for (int i = 0; i < sub->ndim; i++)
      fmt_append(joined, sizeof joined, &pos, i ? "_%s" : "%s", sub->dim[i].name);
    name = joined;
  }
  /* A 1-D mesh flattened to its own name is itself, as PyTorch's
   * DeviceMesh._flatten returns self for it (torch/distributed/device_mesh.py). */
  if (sub->ndim == 1 && strcmp(name, sub->dim[0].name) == 0) {
    *out = sub;
    return DT_OK;
  }
  DT_CHECK(check_name(ctx, call, "flattened dim", name));

  mesh_dim fd;
  memset(&fd, 0, sizeof fd);
  snprintf(fd.name, sizeof fd.name, "%s", name);
  fd.size = 1;
  for (int i = 0; i < sub->ndim; i++) {
    for (int k = 0; k < sub->dim[i].nrd; k++) fd.rd[fd.nrd++] = sub->dim[i].rd[k];
    fd.size *= sub->dim[i].size;
  }
  if (dt_mesh_dim(root, name) >= 0)
    return dt_error(ctx, DT_ERR_INVALID, call,
                    "flattened dim name '%s' clashes with a dim of the root mesh", name);
  dt_mesh *have = find_flattened(root, name);
  if (have) {
    if (same_layout(&have->dim[0], &fd)) {
      *out = have;
      return DT_OK;
    }
    char a[160], b[160];
    fmt_layout(root, &have->dim[0], a, sizeof a);
    fmt_layout(root, &fd, b, sizeof b);
    return dt_error(ctx, DT_ERR_INVALID, call,
                    "flattened dim '%s' already exists over %s; it cannot be reused for %s", name,
                    a, b);
  }

  /* Everything that can fail locally happens before the collective split. */
  dt_mesh *f = calloc(1, sizeof *f);
  if (!f) return dt_error(ctx, DT_ERR_NOMEM, call, "out of memory");
  f->ctx = root->ctx;
  f->root = root;
  f->ndim = 1;
  f->dim[0] = fd;
  f->flattened = true;
  dt_status st = fill_ranks(f);
  if (st == DT_OK) st = add_kid(root, f); /* reserve the slot before communicating */
  if (st != DT_OK) {
    free(f->ranks);
    free(f);
    return st;
  }
  root->n_kids--; /* re-added below once the split succeeded */

  /* color: row-major index over the root dims not flattened; key: the
   * flattened coordinate, so the new comm's rank order is row-major. */
  bool in[DT_MESH_MAX_DIMS] = {false};
  for (int k = 0; k < fd.nrd; k++) in[fd.rd[k]] = true;
  int color = 0;
  for (int j = 0; j < root->ndim; j++)
    if (!in[j]) color = color * root->dim[j].size + root->dim[j].coord;
  dt_comm *c = NULL;
  int *mem = group_members(root, fd.rd, fd.nrd, fd.size);
  st = mem ? dt_comm_split_group(root->world, color, f->dim[0].coord, fd.size, mem, name, &c)
           : dt_error(ctx, DT_ERR_NOMEM, call, "out of memory");
  free(mem);
  if (st == DT_OK && (!c || c->size != fd.size || c->rank != f->dim[0].coord)) {
    st = dt_error(ctx, DT_ERR_INTERNAL, call,
                  "split for flattened dim '%s' gave rank %d of %d, expected %d of %d", name,
                  c ? c->rank : -1, c ? c->size : 0, f->dim[0].coord, fd.size);
    dt_comm_destroy(c);
  }
  if (st != DT_OK) {
    free(f->ranks);
    free(f);
    return st;
  }
  f->dim[0].comm = c;
  root->kids[root->n_kids++] = f;
  *out = f;
  return DT_OK;
}
