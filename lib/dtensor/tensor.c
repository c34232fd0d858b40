/* lib/dtensor/tensor.c: DTensor creation and conversion: distribute (every rank
 * holds the global), scatter_from (one rank holds it; scatter/broadcast per mesh
 * dim through the comm front), rand (the sharding-invariant RNG generates only
 * the local shard), from_local (validated), full (gather everything).
 * Redistribution itself lives in redistribute.c. Shards live on the rank's
 * compute device (dt_tensor_home): the global arrays given and returned are
 * host memory, and a device rank moves each shard across once (distribute and
 * rand build the shard on the host and upload it; full downloads the gathered
 * tensor), while scatter_from and the gathers run on device buffers. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/device.h"
#include "device/kernels.h"
#include "device/xfer.h"
#include "dtensor/tensor_impl.h"

/* ---- where shards live, and moving data there ---- */

dt_device_kind dt_tensor_home(const dt_ctx *ctx) { return dt_device_home(ctx); }

static const char RWHO[] = "dt_redistribute";

/* The device whose memory (kind dev) the helpers below work in, and its layout
 * kernels. */
static dt_status layout_of(dt_ctx *ctx, dt_device_kind dev, dt_kdev *kd) {
  DT_CHECK(dt_device_kernels(ctx, dev, RWHO, kd));
  if (!kd->k->layout || !kd->k->layout->copy_box || !kd->k->layout->reduce)
    return dt_error(ctx, DT_ERR_UNSUPPORTED, RWHO, "the device has no layout kernels");
  return DT_OK;
}

dt_status dt_box_copy(dt_ctx *ctx, dt_device_kind dev, size_t es, int ndim, void *dst,
                      const int64_t *dst_shape, const int64_t *dst_off, const void *src,
                      const int64_t *src_shape, const int64_t *src_off, const int64_t *box) {
  dt_kdev kd;
  DT_CHECK(layout_of(ctx, dev, &kd));
  uint64_t n = es;
  for (int i = 0; i < ndim; i++) n *= (uint64_t)(box[i] > 0 ? box[i] : 0);
  dt_kledger_kernel(ctx, "copy_box", DT_F32, 0, n, n);
  return kd.k->layout->copy_box(kd.dev, es, ndim, dst, dst_shape, dst_off, src, src_shape,
                                src_off, box);
}

dt_status dt_mem_copy(dt_ctx *ctx, dt_device_kind dev, void *dst, const void *src, size_t bytes) {
  if (!bytes) return DT_OK;
  dt_kdev kd;
  DT_CHECK(dt_device_kernels(ctx, dev, RWHO, &kd));
  return dt_device_move(kd.dev, dst, src, bytes);
}

dt_status dt_scratch_get(dt_ctx *ctx, dt_device_kind dev, size_t bytes, bool zero, dt_scratch *s) {
  memset(s, 0, sizeof *s);
  s->dev = dev;
  dt_kdev kd;
  DT_CHECK(dt_device_kernels(ctx, dev, RWHO, &kd));
  s->bytes = bytes + 1; /* at least one byte */
  DT_CHECK(dt_device_alloc(kd.dev, s->bytes, &s->p));
  dt_status st = zero ? dt_device_zero(kd.dev, s->p, bytes) : DT_OK;
  if (st != DT_OK) dt_scratch_put(ctx, s);
  return st;
}

void dt_scratch_put(dt_ctx *ctx, dt_scratch *s) {
  if (!s->p) return;
  dt_kdev kd;
  if (dt_device_kernels(ctx, s->dev, RWHO, &kd) == DT_OK) dt_device_free(kd.dev, s->p, s->bytes);
  s->p = NULL;
}

void dt_tensor_mesh_info(const dt_mesh *mesh, int *mesh_ndim, int *shape, int *coords) {
  int m = dt_mesh_ndim(mesh);
  *mesh_ndim = m;
  for (int i = 0; i < m; i++) {
    if (shape) shape[i] = dt_mesh_size(mesh, i);
    if (coords) coords[i] = dt_mesh_coord(mesh, i);
  }
}

dt_status dt_tensor_meta(dt_ctx *ctx, dt_mesh *mesh, const dt_placement *pl, int ndim,
                         const int64_t *gshape, dt_dtype dtype, const char *call, dt_tensor *t) {
  memset(t, 0, sizeof *t);
  if (!mesh) return dt_error(ctx, DT_ERR_INVALID, call, "NULL mesh");
  if (ndim < 0 || ndim > DT_MAX_DIMS)
    return dt_error(ctx, DT_ERR_INVALID, call, "tensor of %d dims (0..%d)", ndim, DT_MAX_DIMS);
  if (dt_dtype_size(dtype) == 0) return dt_error(ctx, DT_ERR_INVALID, call, "invalid dtype");
  for (int d = 0; d < ndim; d++)
    if (gshape[d] < 0)
      return dt_error(ctx, DT_ERR_INVALID, call, "global dim %d has negative size %lld", d,
                      (long long)gshape[d]);
  int shape[DT_MAX_MESH_DIMS], coords[DT_MAX_MESH_DIMS];
  dt_tensor_mesh_info(mesh, &t->mesh_ndim, shape, coords);
  char err[160];
  for (int i = 0; i < t->mesh_ndim; i++) t->pl[i] = pl[i];
  if (dt_placements_normalize(t->mesh_ndim, t->pl, ndim, err, sizeof err) != DT_OK)
    return dt_error(ctx, DT_ERR_INVALID, call, "%s", err);
  for (int i = 0; i < t->mesh_ndim; i++)
    if (t->pl[i].kind == DT_PL_PARTIAL && (unsigned)t->pl[i].op > DT_RED_MIN)
      return dt_error(ctx, DT_ERR_INVALID, call, "mesh dim %d: Partial op must be sum, avg, max or min", i);
  t->mesh = mesh;
  t->ndim = ndim;
  t->dtype = dtype;
  for (int d = 0; d < ndim; d++) t->gshape[d] = gshape[d];
  int64_t lshape[DT_MAX_DIMS];
  dt_local_shape_offset(ndim, gshape, t->mesh_ndim, shape, coords, t->pl, lshape, t->goffset);
  return DT_OK;
}

void dt_tensor_local_shape(const dt_tensor *t, int64_t *lshape) {
  int shape[DT_MAX_MESH_DIMS], coords[DT_MAX_MESH_DIMS], m;
  int64_t off[DT_MAX_DIMS];
  dt_tensor_mesh_info(t->mesh, &m, shape, coords);
  dt_local_shape_offset(t->ndim, t->gshape, m, shape, coords, t->pl, lshape, off);
}

dt_status dt_array_div(dt_ctx *ctx, dt_array *x, double n) {
  if (x->dtype == DT_I64 || x->numel == 0) return DT_OK;
  dt_kdev kd;
  DT_CHECK(layout_of(ctx, x->dev, &kd));
  /* x = x / n: a one-input avg (a true division; bf16 divides in f32) */
  const void *in[1] = {x->data};
  return kd.k->layout->reduce(kd.dev, x->dtype, DT_KRED_AVG, x->numel, 1, in, x->data, n);
}

void dt_tensor_layout(const dt_tensor *t, dt_layout *out) {
  memset(out, 0, sizeof *out);
  dt_tensor_mesh_info(t->mesh, &out->mesh_ndim, out->mesh_shape, NULL);
  out->ndim = t->ndim;
  for (int d = 0; d < t->ndim; d++) out->gshape[d] = t->gshape[d];
  out->dtype = t->dtype;
}

const dt_array *dt_tensor_local(const dt_tensor *t) { return &t->local; }

void dt_tensor_free(dt_ctx *ctx, dt_tensor *t) {
  if (!t) return;
  dt_array_free(ctx, &t->local);
}

/* Replicate-then-partition for Partial placements, as PyTorch's distribute. */
static dt_status partition_partials(dt_ctx *ctx, dt_tensor *t, dt_array *x) {
  for (int i = 0; i < t->mesh_ndim; i++)
    if (t->pl[i].kind == DT_PL_PARTIAL && t->pl[i].op == DT_RED_SUM)
      DT_CHECK(dt_array_div(ctx, x, (double)dt_mesh_size(t->mesh, i)));
  return DT_OK;
}

static dt_status check_global(dt_ctx *ctx, const dt_array *g, const char *call) {
  if (!g || (g->numel > 0 && !g->data))
    return dt_error(ctx, DT_ERR_INVALID, call, "NULL global tensor");
  if (g->dev != DT_DEV_CPU)
    return dt_error(ctx, DT_ERR_UNSUPPORTED, call, "the global tensor must be in host memory");
  return DT_OK;
}

dt_status dt_tensor_distribute(dt_ctx *ctx, dt_mesh *mesh, const dt_array *global,
                               const dt_placement *pl, dt_tensor *out) {
  const char *call = "dt_tensor_distribute";
  memset(out, 0, sizeof *out);
  DT_CHECK(check_global(ctx, global, call));
  DT_CHECK(dt_tensor_meta(ctx, mesh, pl, global->ndim, global->shape, global->dtype, call, out));
  int64_t ls[DT_MAX_DIMS], zero[DT_MAX_DIMS] = {0};
  dt_tensor_local_shape(out, ls);
  dt_array h;
  DT_CHECK(dt_array_create(ctx, DT_DEV_CPU, out->dtype, out->ndim, ls, &h));
  dt_copy_box(dt_dtype_size(out->dtype), out->ndim, h.data, ls, zero, global->data,
              global->shape, out->goffset, ls);
  dt_status s = partition_partials(ctx, out, &h);
  if (s == DT_OK) s = dt_array_place(ctx, &h, dt_tensor_home(ctx), call);
  if (s != DT_OK) {
    dt_array_free(ctx, &h);
    return s;
  }
  out->local = h;
  return DT_OK;
}

/* dt_tensor_rand's shard in host memory. */
static dt_status rand_host(dt_ctx *ctx, dt_mesh *mesh, int ndim, const int64_t *gshape,
                           dt_dtype dtype, const dt_placement *pl, uint64_t seed, uint64_t stream,
                           dt_rng_dist dist, double a, double b, dt_tensor *out) {
  const char *call = "dt_tensor_rand";
  DT_CHECK(dt_tensor_meta(ctx, mesh, pl, ndim, gshape, dtype, call, out));
  int64_t ls[DT_MAX_DIMS];
  dt_tensor_local_shape(out, ls);
  DT_CHECK(dt_array_create(ctx, DT_DEV_CPU, dtype, ndim, ls, &out->local));
  dt_array *x = &out->local;
  /* Partial(sum): coordinate 0 of every sum dim holds the value, others 0. */
  bool zero = false;
  for (int i = 0; i < out->mesh_ndim; i++)
    if (out->pl[i].kind == DT_PL_PARTIAL && out->pl[i].op == DT_RED_SUM &&
        dt_mesh_coord(mesh, i) != 0)
      zero = true;
  if (x->numel == 0) return DT_OK;
  size_t es = dt_dtype_size(dtype);
  if (zero) {
    memset(x->data, 0, (size_t)x->numel * es);
    return DT_OK;
  }
  if (ndim == 0) return dt_rng_fill(dtype, x->data, 1, seed, stream, 0, 1, dist, a, b);
  int64_t gstride[DT_MAX_DIMS], s = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    gstride[d] = s;
    s *= gshape[d];
  }
  int64_t row = ls[ndim - 1], rows = x->numel / row, idx[DT_MAX_DIMS] = {0};
  for (int64_t r = 0; r < rows; r++) {
    int64_t first = 0;
    for (int d = 0; d < ndim; d++) first += (out->goffset[d] + idx[d]) * gstride[d];
    DT_CHECK(dt_rng_fill(dtype, (char *)x->data + (size_t)(r * row) * es, row, seed, stream,
                         (uint64_t)first, 1, dist, a, b));
    for (int d = ndim - 2; d >= 0; d--) {
      if (++idx[d] < ls[d]) break;
      idx[d] = 0;
    }
  }
  return DT_OK;
}

dt_status dt_tensor_rand(dt_ctx *ctx, dt_mesh *mesh, int ndim, const int64_t *gshape,
                         dt_dtype dtype, const dt_placement *pl, uint64_t seed, uint64_t stream,
                         dt_rng_dist dist, double a, double b, dt_tensor *out) {
  if (dt_tensor_home(ctx) == DT_DEV_META) { /* shapes only: no value to generate */
    DT_CHECK(dt_tensor_meta(ctx, mesh, pl, ndim, gshape, dtype, "dt_tensor_rand", out));
    int64_t ls[DT_MAX_DIMS];
    dt_tensor_local_shape(out, ls);
    return dt_array_create(ctx, DT_DEV_META, dtype, ndim, ls, &out->local);
  }
  DT_CHECK(rand_host(ctx, mesh, ndim, gshape, dtype, pl, seed, stream, dist, a, b, out));
  /* generated on the host, moved once to where the rank computes */
  dt_status s = dt_array_place(ctx, &out->local, dt_tensor_home(ctx), "dt_tensor_rand");
  if (s != DT_OK) dt_array_free(ctx, &out->local);
  return s;
}

dt_status dt_tensor_from_local(dt_ctx *ctx, dt_mesh *mesh, const dt_array *local,
                               const dt_placement *pl, int ndim, const int64_t *gshape,
                               dt_tensor *out) {
  const char *call = "dt_tensor_from_local";
  memset(out, 0, sizeof *out);
  if (!local || (local->numel > 0 && !local->data))
    return dt_error(ctx, DT_ERR_INVALID, call, "NULL local tensor");
  if (local->ndim != ndim)
    return dt_error(ctx, DT_ERR_INVALID, call, "local tensor has %d dims, the global %d",
                    local->ndim, ndim);
  int64_t g[DT_MAX_DIMS];
  for (int d = 0; d < ndim; d++) g[d] = gshape ? gshape[d] : local->shape[d];
  if (!gshape) {
    /* PyTorch's inference: local size times the mesh size on sharded dims. */
    dt_tensor probe;
    DT_CHECK(dt_tensor_meta(ctx, mesh, pl, ndim, g, local->dtype, call, &probe));
    for (int i = 0; i < probe.mesh_ndim; i++)
      if (probe.pl[i].kind == DT_PL_SHARD) g[probe.pl[i].dim] *= dt_mesh_size(mesh, i);
  }
  DT_CHECK(dt_tensor_meta(ctx, mesh, pl, ndim, g, local->dtype, call, out));
  int64_t ls[DT_MAX_DIMS];
  dt_tensor_local_shape(out, ls);
  for (int d = 0; d < ndim; d++)
    if (ls[d] != local->shape[d])
      return dt_error(ctx, DT_ERR_INVALID, call,
                      "local dim %d has size %lld but this rank's shard of the global shape "
                      "has %lld (uneven shards need the explicit global shape)",
                      d, (long long)local->shape[d], (long long)ls[d]);
  /* a copy where the rank computes (from the host or from that device) */
  return dt_array_copy_to(ctx, local, dt_tensor_home(ctx), call, &out->local);
}

/* Mesh coordinates of world rank r, or false when r is not in the mesh. */
static bool coords_of(const dt_mesh *mesh, int r, int *coords) {
  int n = dt_mesh_size(mesh, -1), m = dt_mesh_ndim(mesh);
  int *ranks = malloc((size_t)n * sizeof(int));
  bool found = false;
  if (!ranks) return false;
  dt_mesh_ranks(mesh, ranks);
  for (int f = 0; f < n && !found; f++) {
    if (ranks[f] != r) continue;
    for (int i = m - 1, rest = f; i >= 0; i--) {
      int s = dt_mesh_size(mesh, i);
      coords[i] = rest % s;
      rest /= s;
    }
    found = true;
  }
  free(ranks);
  return found;
}

dt_status dt_tensor_scatter_from(dt_ctx *ctx, dt_mesh *mesh, const dt_array *global, int src_rank,
                                 int ndim, const int64_t *gshape, dt_dtype dtype,
                                 const dt_placement *pl, dt_tensor *out) {
  const char *call = "dt_tensor_scatter_from";
  DT_CHECK(dt_tensor_meta(ctx, mesh, pl, ndim, gshape, dtype, call, out));
  int m, shape[DT_MAX_MESH_DIMS], me[DT_MAX_MESH_DIMS], src[DT_MAX_MESH_DIMS];
  dt_tensor_mesh_info(mesh, &m, shape, me);
  if (!coords_of(mesh, src_rank, src))
    return dt_error(ctx, DT_ERR_INVALID, call, "source rank %d is not in the mesh", src_rank);
  bool is_src = true;
  for (int i = 0; i < m; i++) is_src = is_src && me[i] == src[i];
  if (is_src) {
    DT_CHECK(check_global(ctx, global, call));
    if (global->ndim != ndim || global->dtype != dtype)
      return dt_error(ctx, DT_ERR_INVALID, call, "the source's tensor does not match the shape or dtype");
    for (int d = 0; d < ndim; d++)
      if (global->shape[d] != gshape[d])
        return dt_error(ctx, DT_ERR_INVALID, call, "source dim %d is %lld, expected %lld", d,
                        (long long)global->shape[d], (long long)gshape[d]);
  }
  size_t es = dt_dtype_size(dtype);
  /* Every step runs where the shard will live (dev): on a device rank the source
   * uploads the global once and the scatters and broadcasts move device memory. */
  dt_device_kind dev = dt_tensor_home(ctx);
  /* cur: the logical piece this rank holds so far (after mesh dims < i). */
  dt_array cur;
  memset(&cur, 0, sizeof cur);
  bool have = false;
  if (is_src) {
    DT_CHECK(dt_array_copy_to(ctx, global, dev, call, &cur));
    have = true;
  }
  dt_status s = DT_OK;
  for (int i = 0; i < m && s == DT_OK; i++) {
    /* Step i runs in the dim-i groups whose coordinates beyond i equal the source's. */
    bool part = true;
    for (int j = i + 1; j < m; j++) part = part && me[j] == src[j];
    if (!part) continue;
    int64_t before[DT_MAX_DIMS], after[DT_MAX_DIMS];
    dt_logical_shape(ndim, gshape, shape, me, out->pl, i, before);
    dt_logical_shape(ndim, gshape, shape, me, out->pl, i + 1, after);
    dt_comm *c = dt_mesh_comm(mesh, i);
    int n = shape[i], root = src[i];
    dt_array next;
    DT_CHECK_GOTO(dt_array_create(ctx, dev, dtype, ndim, after, &next), s, done);
    if (out->pl[i].kind != DT_PL_SHARD) {
      if (have && next.numel) s = dt_mem_copy(ctx, dev, next.data, cur.data, dt_array_bytes(&cur));
      if (s == DT_OK) s = dt_comm_broadcast(c, next.data, (size_t)next.numel, dtype, root);
    } else {
      int d = out->pl[i].dim;
      int64_t L = before[d], ch = (L + n - 1) / n;
      int64_t block[DT_MAX_DIMS], zero[DT_MAX_DIMS] = {0};
      for (int e = 0; e < ndim; e++) block[e] = before[e];
      block[d] = ch;
      int64_t belems = dt_shape_numel(ndim, block);
      dt_scratch sb = {0}, rb = {0};
      s = dt_scratch_get(ctx, dev, (size_t)belems * es, true, &rb);
      if (s == DT_OK && have) s = dt_scratch_get(ctx, dev, (size_t)belems * (size_t)n * es, true, &sb);
      char *sendbuf = sb.p, *recvbuf = rb.p;
      if (s == DT_OK) {
        if (have)
          for (int q = 0; q < n && s == DT_OK; q++) {
            int64_t sz, off, soff[DT_MAX_DIMS] = {0}, box[DT_MAX_DIMS];
            dt_chunk(L, n, q, &sz, &off);
            for (int e = 0; e < ndim; e++) box[e] = before[e];
            box[d] = sz;
            soff[d] = off;
            s = dt_box_copy(ctx, dev, es, ndim, sendbuf + (size_t)(q * belems) * es, block, zero,
                            cur.data, before, soff, box);
          }
        if (s == DT_OK) s = dt_comm_scatter(c, sendbuf, recvbuf, (size_t)belems, dtype, root);
        if (s == DT_OK)
          s = dt_box_copy(ctx, dev, es, ndim, next.data, after, zero, recvbuf, block, zero, after);
      }
      dt_scratch_put(ctx, &sb);
      dt_scratch_put(ctx, &rb);
    }
    if (s != DT_OK) {
      dt_array_free(ctx, &next);
      break;
    }
    dt_array_free(ctx, &cur);
    cur = next;
    have = true;
  }
done:
  if (s != DT_OK) {
    dt_array_free(ctx, &cur);
    return s;
  }
  s = partition_partials(ctx, out, &cur);
  if (s != DT_OK) {
    dt_array_free(ctx, &cur);
    return s;
  }
  out->local = cur;
  return DT_OK;
}

dt_status dt_tensor_full(dt_ctx *ctx, const dt_tensor *t, dt_array *out) {
  memset(out, 0, sizeof *out);
  dt_placement rep[DT_MAX_MESH_DIMS];
  for (int i = 0; i < t->mesh_ndim; i++) rep[i] = dt_replicate();
  dt_tensor r;
  DT_CHECK(dt_redistribute(ctx, t, rep, DT_PLANNER_GREEDY, &r));
  /* the replicated local tensor is the global one, in host memory (gathered on a
   * device: one download) */
  dt_status s = dt_array_place(ctx, &r.local, DT_DEV_CPU, "dt_tensor_full");
  if (s != DT_OK) {
    dt_array_free(ctx, &r.local);
    return s;
  }
  *out = r.local;
  return DT_OK;
}
