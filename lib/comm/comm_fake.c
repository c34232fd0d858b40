/* lib/comm/comm_fake.c: the fake comm backend, for shape-only runs: one rank
 * runs alone as rank r of a world of any size, and every collective and
 * send/recv completes at once. The front (comm.c) writes the ledger rows as
 * for every backend, from the counts, dtype and group, so the rows equal a
 * real run's (but for seconds).
 *
 * Device buffers (the meta device's, which have no storage) are left as they
 * are. Host buffers get defined values, none invented: all_reduce and
 * reduce_scatter the rank's own input, all_gather the rank's part in every
 * slot, broadcast, scatter and recv zeros unless the caller is the root; so
 * host code that reads a small result back (a loss, a norm) reads no garbage.
 * Sub-communicators come from dt_comm_split_group (the caller names its
 * group); the collective dt_comm_split cannot be answered by one rank and is
 * DT_ERR_UNSUPPORTED. No state outside the communicators. */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"

static bool host(dt_comm *c, const void *p) { return p && !dt_comm_is_device(c, p); }

static dt_status f_all_reduce(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t,
                              dt_reduce_op op) {
  (void)op;
  if (host(c, recv) && send != recv) memmove(recv, send, count * dt_dtype_size(t));
  return DT_OK;
}

static dt_status f_all_gather(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t) {
  if (!host(c, recv)) return DT_OK;
  size_t b = count * dt_dtype_size(t);
  for (int i = 0; i < c->size; i++)
    if ((char *)recv + (size_t)i * b != (const char *)send)
      memmove((char *)recv + (size_t)i * b, send, b);
  return DT_OK;
}

static dt_status f_reduce_scatter(dt_comm *c, const void *send, void *recv, size_t count,
                                  dt_dtype t, dt_reduce_op op) {
  (void)op;
  size_t b = count * dt_dtype_size(t);
  if (host(c, recv)) memmove(recv, (const char *)send + (size_t)c->rank * b, b);
  return DT_OK;
}

static dt_status f_all_to_all(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t) {
  if (host(c, recv)) memmove(recv, send, count * dt_dtype_size(t) * (size_t)c->size);
  return DT_OK;
}

static dt_status f_broadcast(dt_comm *c, void *buf, size_t count, dt_dtype t, int root) {
  if (host(c, buf) && c->rank != root) memset(buf, 0, count * dt_dtype_size(t));
  return DT_OK;
}

static dt_status f_scatter(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t,
                           int root) {
  size_t b = count * dt_dtype_size(t);
  if (!host(c, recv)) return DT_OK;
  if (c->rank == root && send) {
    if ((const char *)send + (size_t)c->rank * b != (char *)recv)
      memmove(recv, (const char *)send + (size_t)c->rank * b, b);
  } else {
    memset(recv, 0, b);
  }
  return DT_OK;
}

static dt_status f_send(dt_comm *c, const void *buf, size_t count, dt_dtype t, int peer, int tag) {
  (void)c; (void)buf; (void)count; (void)t; (void)peer; (void)tag;
  return DT_OK;
}

static dt_status f_recv(dt_comm *c, void *buf, size_t count, dt_dtype t, int peer, int tag) {
  (void)peer; (void)tag;
  if (host(c, buf)) memset(buf, 0, count * dt_dtype_size(t));
  return DT_OK;
}

static dt_status f_barrier(dt_comm *c) { (void)c; return DT_OK; }

static dt_status f_split(dt_comm *c, int color, int key, dt_comm **out) {
  (void)color; (void)key;
  *out = NULL;
  return dt_error(c->ctx, DT_ERR_UNSUPPORTED, "split",
                  "the fake backend's rank runs alone: name the group (dt_comm_split_group)");
}

static dt_status f_split_group(dt_comm *c, int n, const int *members, dt_comm **out);

static void f_destroy(dt_comm *c) {
  if (!c) return;
  dt_comm_free_base(c);
  free(c);
}

static const dt_comm_ops fake_ops = {
    .name = "fake",
    .device_buffers = true,
    .all_reduce = f_all_reduce,
    .all_gather = f_all_gather,
    .reduce_scatter = f_reduce_scatter,
    .all_to_all = f_all_to_all,
    .broadcast = f_broadcast,
    .scatter = f_scatter,
    .send = f_send,
    .recv = f_recv,
    .barrier = f_barrier,
    .split = f_split,
    .split_group = f_split_group,
    .destroy = f_destroy,
};

static dt_status make(dt_ctx *ctx, const char *name, int rank, int size, const int *world_ranks,
                      dt_comm **out) {
  dt_comm *c = calloc(1, sizeof *c);
  if (!c) return dt_error(ctx, DT_ERR_NOMEM, "comm fake", "no memory");
  dt_status s = dt_comm_init_base(c, &fake_ops, ctx, name, rank, size, world_ranks);
  if (s != DT_OK) {
    free(c);
    return s;
  }
  *out = c;
  return DT_OK;
}

static dt_status f_split_group(dt_comm *c, int n, const int *members, dt_comm **out) {
  int *wr = malloc((size_t)n * sizeof *wr), me = -1;
  if (!wr) return dt_error(c->ctx, DT_ERR_NOMEM, "split_group", "no memory");
  for (int i = 0; i < n; i++) {
    wr[i] = c->world_ranks[members[i]];
    if (members[i] == c->rank) me = i;
  }
  dt_status s = make(c->ctx, c->name, me, n, wr, out);
  free(wr);
  return s;
}

dt_status dt_fake_comm_world(dt_ctx *ctx, int rank, int world, dt_comm **out) {
  *out = NULL;
  if (world < 1 || rank < 0 || rank >= world)
    return dt_error(ctx, DT_ERR_INVALID, "dt_fake_comm_world", "rank %d of a world of %d", rank,
                    world);
  return make(ctx, "world", rank, world, NULL, out);
}
