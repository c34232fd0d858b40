/* lib/comm/comm.c: the comm front. Every collective of the runtime passes here:
 * arguments are checked, the backend slot runs, and the call is appended to the
 * rank's ledger with its bytes by the ring model (nccl-tests bus factors).
 * Also: names, the element-wise reduction kernels the backends share. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"

static const char *const coll_names[DT_COLL_COUNT] = {
    "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
    "scatter",    "send",       "recv",           "barrier"};
static const char *const red_names[DT_RED_COUNT] = {"sum", "avg", "max", "min", "prod"};

const char *dt_coll_name(dt_coll c) {
  return (unsigned)c < DT_COLL_COUNT ? coll_names[c] : "?";
}

dt_status dt_coll_parse(const char *s, dt_coll *out) {
  for (int i = 0; s && i < DT_COLL_COUNT; i++)
    if (!strcmp(s, coll_names[i])) { *out = (dt_coll)i; return DT_OK; }
  return DT_ERR_INVALID;
}

const char *dt_reduce_name(dt_reduce_op r) {
  return (unsigned)r < DT_RED_COUNT ? red_names[r] : "?";
}

dt_status dt_reduce_parse(const char *s, dt_reduce_op *out) {
  for (int i = 0; s && i < DT_RED_COUNT; i++)
    if (!strcmp(s, red_names[i])) { *out = (dt_reduce_op)i; return DT_OK; }
  return DT_ERR_INVALID;
}

double dt_coll_bus_factor(dt_coll c, int n) {
  if (n <= 1) return 0.0;
  double f = (double)(n - 1) / (double)n;
  switch (c) {
    case DT_COLL_ALL_REDUCE: return 2.0 * f;
    case DT_COLL_ALL_GATHER:
    case DT_COLL_REDUCE_SCATTER:
    case DT_COLL_ALL_TO_ALL:
    case DT_COLL_SCATTER: return f;
    case DT_COLL_BROADCAST:
    case DT_COLL_SEND: return 1.0;
    default: return 0.0;
  }
}

uint64_t dt_coll_elems(dt_coll c, uint64_t count, int n) {
  switch (c) {
    case DT_COLL_ALL_GATHER:
    case DT_COLL_REDUCE_SCATTER:
    case DT_COLL_ALL_TO_ALL:
    case DT_COLL_SCATTER: return count * (uint64_t)n;
    case DT_COLL_BARRIER: return 0;
    default: return count;
  }
}

/* ---- ledger ----
 * The rank's ledger hangs on its context (dt_ctx_ext) under the address of
 * ledger_key, and is freed by dt_ctx_release. */

static const char ledger_key;
static const dt_ledger no_ledger = {NULL, 0, 0, true, 0};

static void ledger_free(dt_ctx *ctx, void *data) {
  (void)ctx;
  dt_ledger *l = data;
  free(l->rows);
  free(l);
}

static dt_ledger *ledger_get(const dt_ctx *ctx) { return dt_ctx_ext_get(ctx, &ledger_key); }

const dt_ledger *dt_ledger_of(const dt_ctx *ctx) {
  const dt_ledger *l = ledger_get(ctx);
  return l ? l : &no_ledger;
}

dt_status dt_ledger_init(dt_ctx *ctx, bool enabled) {
  if (!ctx) return DT_ERR_INVALID;
  dt_ledger *l = ledger_get(ctx);
  if (!l) {
    l = calloc(1, sizeof *l);
    if (!l) return dt_error(ctx, DT_ERR_NOMEM, "dt_ledger_init", "no memory for the ledger");
    dt_status s = dt_ctx_ext_set(ctx, &ledger_key, l, ledger_free);
    if (s != DT_OK) {
      free(l);
      return s;
    }
  }
  l->enabled = enabled;
  /* the compute ledger records the same part of the step (core.h) */
  return dt_kledger_init(ctx, enabled);
}

void dt_ledger_clear(dt_ctx *ctx) {
  dt_ledger *l = ledger_get(ctx);
  if (l) l->n = 0, l->staged_bytes = 0;
  dt_kledger_clear(ctx);
}

void dt_ledger_add_staged(dt_ctx *ctx, uint64_t bytes) {
  dt_ledger *l = ctx ? ledger_get(ctx) : NULL;
  if (l && l->enabled) l->staged_bytes += bytes;
}

void dt_ledger_enable(dt_ctx *ctx, bool on) { (void)dt_ledger_init(ctx, on); }

dt_status dt_ledger_append(dt_ctx *ctx, const dt_ledger_row *row) {
  dt_ledger *l = ledger_get(ctx);
  if (!l) {
    DT_CHECK(dt_ledger_init(ctx, true));
    l = ledger_get(ctx);
  }
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 64;
    dt_ledger_row *r = realloc(l->rows, cap * sizeof *r);
    if (!r) return dt_error(ctx, DT_ERR_NOMEM, "dt_ledger_append", "cannot grow the ledger");
    l->rows = r;
    l->cap = cap;
  }
  l->rows[l->n++] = *row;
  return DT_OK;
}

static void record(dt_comm *c, dt_coll op, int red, uint64_t count, dt_dtype t, double secs) {
  dt_ctx *ctx = c->ctx;
  if (!ctx || !dt_ledger_of(ctx)->enabled) return;
  dt_ledger_row r;
  memset(&r, 0, sizeof r);
  r.op = (int)op;
  r.reduce = red;
  memcpy(r.group, c->name, sizeof r.group);
  r.group_size = c->size;
  r.elems = dt_coll_elems(op, count, c->size);
  r.dtype = (int)t;
  r.payload_bytes = r.elems * dt_dtype_size(t);
  /* Point to point: the bytes cross the link once whatever the group size, counted
   * on the sender's row (the receiver's row has the payload and no wire bytes), so a
   * ring of send/recv pairs moves per rank what it sends, as the collectives count
   * one direction of each rank's link. */
  r.wire_bytes = op == DT_COLL_SEND   ? (double)r.payload_bytes
                 : op == DT_COLL_RECV ? 0.0
                                      : (double)r.payload_bytes * dt_coll_bus_factor(op, c->size);
  r.seconds = secs;
  memcpy(r.phase, ctx->phase, sizeof r.phase);
  memcpy(r.scope, ctx->scope, sizeof r.scope);
  (void)dt_ledger_append(ctx, &r); /* a full ledger never fails the collective */
}

/* ---- argument checks ---- */

static dt_status check_common(dt_comm *c, const char *call, dt_dtype t, const void *a,
                              const void *b, size_t count) {
  if (!c) return DT_ERR_INVALID;
  if (dt_dtype_size(t) == 0) return dt_error(c->ctx, DT_ERR_INVALID, call, "invalid dtype");
  if (count > 0 && (!a || !b))
    return dt_error(c->ctx, DT_ERR_INVALID, call, "NULL buffer with count %zu", count);
  if (count > SIZE_MAX / 8 / (size_t)(c->size > 0 ? c->size : 1))
    return dt_error(c->ctx, DT_ERR_INVALID, call, "count %zu overflows", count);
  return DT_OK;
}

static dt_status check_op(dt_comm *c, const char *call, dt_reduce_op op, dt_dtype t) {
  if (t == DT_I64)
    return dt_error(c->ctx, DT_ERR_UNSUPPORTED, call, "i64 data is moved, never reduced");
  if ((unsigned)op >= DT_RED_COUNT)
    return dt_error(c->ctx, DT_ERR_INVALID, call, "invalid reduce op %d", (int)op);
  return DT_OK;
}

static dt_status check_root(dt_comm *c, const char *call, int root) {
  if (root < 0 || root >= c->size)
    return dt_error(c->ctx, DT_ERR_INVALID, call, "root %d outside group '%s' of %d", root,
                    c->name, c->size);
  return DT_OK;
}

static dt_status slot(dt_comm *c, const void *fn, const char *call) {
  if (!fn)
    return dt_error(c->ctx, DT_ERR_UNSUPPORTED, call, "backend '%s' lacks %s", c->ops->name, call);
  return DT_OK;
}

/* ---- device buffers ---- */

void dt_comm_set_mem(dt_comm *c, const dt_comm_mem *m) {
  if (!c) return;
  if (m && m->dev) c->mem = *m;
  else memset(&c->mem, 0, sizeof c->mem);
}

bool dt_comm_is_device(const dt_comm *c, const void *p) {
  return c && c->mem.dev && c->mem.is_device && p && c->mem.is_device(c->mem.dev, p);
}

/* Where a call's buffers live: 0 host, 1 device; -1 (error recorded) when the
 * non-NULL ones are mixed. */
static int where(dt_comm *c, const char *call, const void *a, const void *b) {
  if (!c->mem.dev) return 0;
  bool da = dt_comm_is_device(c, a), db = dt_comm_is_device(c, b);
  if ((a && b && da != db)) {
    (void)dt_error(c->ctx, DT_ERR_INVALID, call, "one buffer is device memory, the other host memory");
    return -1;
  }
  return da || db;
}

/* Staging of device buffers through host memory for a backend that takes host
 * buffers only. Each staged buffer is malloc'd (not the rank's tracked host
 * memory: it lives for one call). */
typedef struct stage {
  dt_comm *c;
  void *h[2];
} stage;

static dt_status st_alloc(stage *S, int i, size_t bytes, void **out) {
  S->h[i] = malloc(bytes ? bytes : 1);
  if (!S->h[i]) return dt_error(S->c->ctx, DT_ERR_NOMEM, "comm", "staging %zu bytes", bytes);
  *out = S->h[i];
  return DT_OK;
}

/* The device's queued work is done before its memory is read from the host. */
static dt_status st_down(stage *S, void *h, const void *d, size_t bytes) {
  dt_comm_mem *m = &S->c->mem;
  if (m->sync) DT_CHECK(m->sync(m->dev));
  dt_ledger_add_staged(S->c->ctx, bytes);
  return bytes ? m->copy(m->dev, h, d, bytes, DT_COMM_D2H) : DT_OK;
}

static dt_status st_up(stage *S, void *d, const void *h, size_t bytes) {
  dt_comm_mem *m = &S->c->mem;
  dt_ledger_add_staged(S->c->ctx, bytes);
  return bytes ? m->copy(m->dev, d, h, bytes, DT_COMM_H2D) : DT_OK;
}

static void st_free(stage *S) {
  free(S->h[0]);
  free(S->h[1]);
}

/* Runs a collective with send (sbytes, read) and recv (rbytes, written)
 * staged. in_place_off: recv lies at send + off (scatter) or send at recv + off
 * (all_gather), or -1; the staged copies keep that relation. */
typedef enum { ST_ALL_REDUCE, ST_ALL_GATHER, ST_REDUCE_SCATTER, ST_ALL_TO_ALL, ST_SCATTER } st_kind;

static dt_status staged(dt_comm *c, st_kind k, const void *send, void *recv, size_t count,
                        dt_dtype t, dt_reduce_op op, int root) {
  size_t es = dt_dtype_size(t), n = (size_t)c->size, cb = count * es;
  size_t sbytes = k == ST_REDUCE_SCATTER || k == ST_ALL_TO_ALL || k == ST_SCATTER ? cb * n : cb;
  size_t rbytes = k == ST_ALL_GATHER || k == ST_ALL_TO_ALL ? cb * n : cb;
  stage S = {c, {NULL, NULL}};
  void *hs = NULL, *hr = NULL;
  dt_status s = DT_OK;
  bool has_send = send && (k != ST_SCATTER || c->rank == root);
  if (k == ST_ALL_GATHER && (const char *)send == (char *)recv + (size_t)c->rank * cb) {
    s = st_alloc(&S, 1, rbytes, &hr);
    hs = (char *)hr + (size_t)c->rank * cb;
  } else if (k == ST_SCATTER && has_send && (char *)recv == (const char *)send + (size_t)c->rank * cb) {
    s = st_alloc(&S, 0, sbytes, &hs);
    hr = (char *)hs + (size_t)c->rank * cb;
  } else if (k == ST_ALL_REDUCE && send == recv) {
    s = st_alloc(&S, 0, sbytes, &hs);
    hr = hs;
  } else {
    if (has_send) s = st_alloc(&S, 0, sbytes, &hs);
    if (s == DT_OK) s = st_alloc(&S, 1, rbytes, &hr);
  }
  if (s == DT_OK && has_send) s = st_down(&S, hs, send, sbytes);
  if (s == DT_OK) {
    switch (k) {
      case ST_ALL_REDUCE: s = c->ops->all_reduce(c, hs, hr, count, t, op); break;
      case ST_ALL_GATHER: s = c->ops->all_gather(c, hs, hr, count, t); break;
      case ST_REDUCE_SCATTER: s = c->ops->reduce_scatter(c, hs, hr, count, t, op); break;
      case ST_ALL_TO_ALL: s = c->ops->all_to_all(c, hs, hr, count, t); break;
      case ST_SCATTER: s = c->ops->scatter(c, hs, hr, count, t, root); break;
    }
  }
  if (s == DT_OK) s = st_up(&S, recv, hr, rbytes);
  st_free(&S);
  return s;
}

static dt_status staged_broadcast(dt_comm *c, void *buf, size_t count, dt_dtype t, int root) {
  size_t bytes = count * dt_dtype_size(t);
  stage S = {c, {NULL, NULL}};
  void *h = NULL;
  dt_status s = st_alloc(&S, 0, bytes, &h);
  if (s == DT_OK && c->rank == root) s = st_down(&S, h, buf, bytes);
  if (s == DT_OK) s = c->ops->broadcast(c, h, count, t, root);
  if (s == DT_OK && c->rank != root) s = st_up(&S, buf, h, bytes);
  st_free(&S);
  return s;
}

static dt_status staged_p2p(dt_comm *c, bool is_send, void *buf, size_t count, dt_dtype t,
                            int peer, int tag) {
  size_t bytes = count * dt_dtype_size(t);
  stage S = {c, {NULL, NULL}};
  void *h = NULL;
  dt_status s = st_alloc(&S, 0, bytes, &h);
  if (s == DT_OK && is_send) s = st_down(&S, h, buf, bytes);
  if (s == DT_OK) s = is_send ? c->ops->send(c, h, count, t, peer, tag)
                              : c->ops->recv(c, h, count, t, peer, tag);
  if (s == DT_OK && !is_send) s = st_up(&S, buf, h, bytes);
  st_free(&S);
  return s;
}

/* True when the call's buffers are device memory the backend cannot take (the
 * front stages them); -1 on mixed buffers. */
static int must_stage(dt_comm *c, const char *call, const void *a, const void *b, size_t count) {
  int w = where(c, call, a, b);
  if (w < 0) return -1;
  return w == 1 && count > 0 && !c->ops->device_buffers;
}

#define STAGE_OR(c, call, a, b, count, var)            \
  int var = must_stage((c), (call), (a), (b), (count)); \
  if (var < 0) return c->ctx ? c->ctx->last_status : DT_ERR_INVALID

#define TIMED(c, op, red, count, t, expr)        \
  do {                                           \
    double t0_ = dt_now();                       \
    dt_status s_ = (expr);                       \
    if (s_ != DT_OK) return s_;                  \
    record((c), (op), (red), (count), (t), dt_now() - t0_); \
    return DT_OK;                                \
  } while (0)

dt_status dt_comm_all_reduce(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t,
                             dt_reduce_op op) {
  DT_CHECK(check_common(c, "all_reduce", t, send, recv, count));
  DT_CHECK(check_op(c, "all_reduce", op, t));
  DT_CHECK(slot(c, (const void *)c->ops->all_reduce, "all_reduce"));
  STAGE_OR(c, "all_reduce", send, recv, count, stg);
  TIMED(c, DT_COLL_ALL_REDUCE, (int)op, count, t,
        stg ? staged(c, ST_ALL_REDUCE, send, recv, count, t, op, 0)
            : c->ops->all_reduce(c, send, recv, count, t, op));
}

dt_status dt_comm_all_gather(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t) {
  DT_CHECK(check_common(c, "all_gather", t, send, recv, count));
  DT_CHECK(slot(c, (const void *)c->ops->all_gather, "all_gather"));
  STAGE_OR(c, "all_gather", send, recv, count, stg);
  TIMED(c, DT_COLL_ALL_GATHER, -1, count, t,
        stg ? staged(c, ST_ALL_GATHER, send, recv, count, t, DT_RED_SUM, 0)
            : c->ops->all_gather(c, send, recv, count, t));
}

dt_status dt_comm_reduce_scatter(dt_comm *c, const void *send, void *recv, size_t count,
                                 dt_dtype t, dt_reduce_op op) {
  DT_CHECK(check_common(c, "reduce_scatter", t, send, recv, count));
  DT_CHECK(check_op(c, "reduce_scatter", op, t));
  DT_CHECK(slot(c, (const void *)c->ops->reduce_scatter, "reduce_scatter"));
  if (count > 0 && send == recv && c->size > 1)
    return dt_error(c->ctx, DT_ERR_INVALID, "reduce_scatter", "send and recv must differ");
  STAGE_OR(c, "reduce_scatter", send, recv, count, stg);
  TIMED(c, DT_COLL_REDUCE_SCATTER, (int)op, count, t,
        stg ? staged(c, ST_REDUCE_SCATTER, send, recv, count, t, op, 0)
            : c->ops->reduce_scatter(c, send, recv, count, t, op));
}

dt_status dt_comm_all_to_all(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t) {
  DT_CHECK(check_common(c, "all_to_all", t, send, recv, count));
  DT_CHECK(slot(c, (const void *)c->ops->all_to_all, "all_to_all"));
  if (count > 0 && send == recv && c->size > 1)
    return dt_error(c->ctx, DT_ERR_INVALID, "all_to_all", "send and recv must differ");
  STAGE_OR(c, "all_to_all", send, recv, count, stg);
  TIMED(c, DT_COLL_ALL_TO_ALL, -1, count, t,
        stg ? staged(c, ST_ALL_TO_ALL, send, recv, count, t, DT_RED_SUM, 0)
            : c->ops->all_to_all(c, send, recv, count, t));
}

dt_status dt_comm_broadcast(dt_comm *c, void *buf, size_t count, dt_dtype t, int root) {
  DT_CHECK(check_common(c, "broadcast", t, buf, buf, count));
  DT_CHECK(check_root(c, "broadcast", root));
  DT_CHECK(slot(c, (const void *)c->ops->broadcast, "broadcast"));
  STAGE_OR(c, "broadcast", buf, buf, count, stg);
  TIMED(c, DT_COLL_BROADCAST, -1, count, t,
        stg ? staged_broadcast(c, buf, count, t, root) : c->ops->broadcast(c, buf, count, t, root));
}

dt_status dt_comm_scatter(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t,
                          int root) {
  DT_CHECK(check_common(c, "scatter", t, recv, recv, count));
  DT_CHECK(check_root(c, "scatter", root));
  if (c && c->rank == root && count > 0 && !send)
    return dt_error(c->ctx, DT_ERR_INVALID, "scatter", "root has a NULL send buffer");
  DT_CHECK(slot(c, (const void *)c->ops->scatter, "scatter"));
  STAGE_OR(c, "scatter", c->rank == root ? send : NULL, recv, count, stg);
  TIMED(c, DT_COLL_SCATTER, -1, count, t,
        stg ? staged(c, ST_SCATTER, send, recv, count, t, DT_RED_SUM, root)
            : c->ops->scatter(c, send, recv, count, t, root));
}

dt_status dt_comm_send(dt_comm *c, const void *buf, size_t count, dt_dtype t, int peer, int tag) {
  DT_CHECK(check_common(c, "send", t, buf, buf, count));
  DT_CHECK(check_root(c, "send", peer));
  if (peer == c->rank) return dt_error(c->ctx, DT_ERR_INVALID, "send", "send to self");
  if (tag < 0) return dt_error(c->ctx, DT_ERR_INVALID, "send", "negative tag %d", tag);
  DT_CHECK(slot(c, (const void *)c->ops->send, "send"));
  STAGE_OR(c, "send", buf, buf, count, stg);
  TIMED(c, DT_COLL_SEND, -1, count, t,
        stg ? staged_p2p(c, true, (void *)buf, count, t, peer, tag)
            : c->ops->send(c, buf, count, t, peer, tag));
}

dt_status dt_comm_recv(dt_comm *c, void *buf, size_t count, dt_dtype t, int peer, int tag) {
  DT_CHECK(check_common(c, "recv", t, buf, buf, count));
  DT_CHECK(check_root(c, "recv", peer));
  if (peer == c->rank) return dt_error(c->ctx, DT_ERR_INVALID, "recv", "receive from self");
  if (tag < 0) return dt_error(c->ctx, DT_ERR_INVALID, "recv", "negative tag %d", tag);
  DT_CHECK(slot(c, (const void *)c->ops->recv, "recv"));
  STAGE_OR(c, "recv", buf, buf, count, stg);
  TIMED(c, DT_COLL_RECV, -1, count, t,
        stg ? staged_p2p(c, false, buf, count, t, peer, tag)
            : c->ops->recv(c, buf, count, t, peer, tag));
}

dt_status dt_comm_barrier(dt_comm *c) {
  if (!c) return DT_ERR_INVALID;
  DT_CHECK(slot(c, (const void *)c->ops->barrier, "barrier"));
  TIMED(c, DT_COLL_BARRIER, -1, 0, DT_F32, c->ops->barrier(c));
}

dt_status dt_comm_split(dt_comm *c, int color, int key, const char *name, dt_comm **out) {
  if (!c || !out) return dt_error(c ? c->ctx : NULL, DT_ERR_INVALID, "split", "NULL argument");
  *out = NULL;
  DT_CHECK(slot(c, (const void *)c->ops->split, "split"));
  DT_CHECK(c->ops->split(c, color, key, out));
  if (*out) dt_comm_set_mem(*out, &c->mem);
  if (*out && name) {
    size_t l = strlen(name);
    if (l >= sizeof (*out)->name) l = sizeof (*out)->name - 1;
    memcpy((*out)->name, name, l);
    (*out)->name[l] = '\0';
  }
  return DT_OK;
}

dt_status dt_comm_split_group(dt_comm *c, int color, int key, int n, const int *members,
                              const char *name, dt_comm **out) {
  const char *call = "split_group";
  if (!c || !out || n < 1 || !members)
    return dt_error(c ? c->ctx : NULL, DT_ERR_INVALID, call, "NULL argument or empty group");
  *out = NULL;
  int me = -1;
  for (int i = 0; i < n; i++) {
    if (members[i] < 0 || members[i] >= c->size)
      return dt_error(c->ctx, DT_ERR_INVALID, call, "member %d outside '%s' of %d", members[i],
                      c->name, c->size);
    if (members[i] == c->rank) me = i;
  }
  if (me < 0)
    return dt_error(c->ctx, DT_ERR_INVALID, call, "rank %d of '%s' is not among the members",
                    c->rank, c->name);
  if (!c->ops->split_group) {
    DT_CHECK(dt_comm_split(c, color, key, name, out));
    bool ok = *out && (*out)->size == n && (*out)->rank == me;
    for (int i = 0; ok && i < n; i++) ok = (*out)->world_ranks[i] == c->world_ranks[members[i]];
    if (!ok) {
      dt_comm_destroy(*out);
      *out = NULL;
      return dt_error(c->ctx, DT_ERR_INTERNAL, call, "split of '%s' gave another group than named",
                      c->name);
    }
    return DT_OK;
  }
  DT_CHECK(c->ops->split_group(c, n, members, out));
  if (*out) dt_comm_set_mem(*out, &c->mem);
  if (*out && name) snprintf((*out)->name, sizeof (*out)->name, "%s", name);
  return DT_OK;
}

bool dt_comm_runs_alone(const dt_comm *c) { return c && c->ops->split_group != NULL; }

void dt_comm_destroy(dt_comm *c) {
  if (c && c->ops->destroy) c->ops->destroy(c);
}

dt_status dt_comm_init_base(dt_comm *c, const dt_comm_ops *ops, dt_ctx *ctx, const char *name,
                            int rank, int size, const int *world_ranks) {
  c->ops = ops;
  c->ctx = ctx;
  memset(&c->mem, 0, sizeof c->mem);
  c->rank = rank;
  c->size = size;
  c->name[0] = '\0';
  if (name) {
    size_t l = strlen(name);
    if (l >= sizeof c->name) l = sizeof c->name - 1;
    memcpy(c->name, name, l);
    c->name[l] = '\0';
  }
  c->world_ranks = malloc((size_t)(size > 0 ? size : 1) * sizeof(int));
  if (!c->world_ranks) return dt_error(ctx, DT_ERR_NOMEM, "dt_comm_init_base", "no memory");
  for (int i = 0; i < size; i++) c->world_ranks[i] = world_ranks ? world_ranks[i] : i;
  return DT_OK;
}

void dt_comm_free_base(dt_comm *c) {
  free(c->world_ranks);
  c->world_ranks = NULL;
}

/* ---- reduction kernels ----
 * max and min propagate NaN (as torch.maximum does): a NaN on any rank wins.
 * The loops run in fixed blocks of 16 over restrict pointers, so that the
 * compiler vectorises them at -O2 (GCC's cheap cost model only vectorises a
 * loop whose trip count is a known multiple of the vector width). */

#define RED_VEC 16
#define REDUCE_LOOP(T, OPEXPR)                                                 \
  do {                                                                         \
    T *restrict a_ = acc;                                                      \
    const T *restrict b_ = in;                                                 \
    size_t i = 0;                                                              \
    for (; i + RED_VEC <= n; i += RED_VEC)                                     \
      for (size_t j = i; j < i + RED_VEC; j++) {                               \
        T x = a_[j], y = b_[j];                                                \
        a_[j] = (OPEXPR);                                                      \
      }                                                                        \
    for (; i < n; i++) {                                                       \
      T x = a_[i], y = b_[i];                                                  \
      a_[i] = (OPEXPR);                                                        \
    }                                                                          \
  } while (0)

void dt_reduce_into(dt_dtype t, dt_reduce_op op, void *restrict acc, const void *restrict in,
                    size_t n) {
  if (t == DT_F32) {
    switch (op) {
      case DT_RED_SUM: case DT_RED_AVG: REDUCE_LOOP(float, x + y); break;
      case DT_RED_MAX: REDUCE_LOOP(float, y > x || y != y ? y : x); break;
      case DT_RED_MIN: REDUCE_LOOP(float, y < x || y != y ? y : x); break;
      case DT_RED_PROD: REDUCE_LOOP(float, x * y); break;
      default: break;
    }
  } else if (t == DT_F64) {
    switch (op) {
      case DT_RED_SUM: case DT_RED_AVG: REDUCE_LOOP(double, x + y); break;
      case DT_RED_MAX: REDUCE_LOOP(double, y > x || y != y ? y : x); break;
      case DT_RED_MIN: REDUCE_LOOP(double, y < x || y != y ? y : x); break;
      case DT_RED_PROD: REDUCE_LOOP(double, x * y); break;
      default: break;
    }
  } else if (t == DT_BF16) {
    dt_bf16 *a = acc;
    const dt_bf16 *b = in;
    for (size_t i = 0; i < n; i++) {
      float x = dt_bf16_to_f32(a[i]), y = dt_bf16_to_f32(b[i]), r;
      switch (op) {
        case DT_RED_MAX: r = y > x || y != y ? y : x; break;
        case DT_RED_MIN: r = y < x || y != y ? y : x; break;
        case DT_RED_PROD: r = x * y; break;
        default: r = x + y; break;
      }
      a[i] = dt_f32_to_bf16(r);
    }
  }
}

void dt_div_inplace(dt_dtype t, void *acc, size_t n, double divisor) {
  /* a true division, not a multiply by 1/n: the mean of n equal values is exact */
  if (t == DT_F32) {
    float *a = acc, f = (float)divisor;
    for (size_t i = 0; i < n; i++) a[i] /= f;
  } else if (t == DT_F64) {
    double *a = acc;
    for (size_t i = 0; i < n; i++) a[i] /= divisor;
  } else if (t == DT_BF16) {
    dt_bf16 *a = acc;
    for (size_t i = 0; i < n; i++) a[i] = dt_f32_to_bf16((float)(dt_bf16_to_f32(a[i]) / divisor));
  }
}
