/* lib/comm/comm_nccl.c: the NCCL comm backend (see comm_nccl.h for what the
 * caller sees: streams, modes, point to point, failure).
 *
 * Layout. A rank's NCCL communicators share one nc_rank (its GPU, its compute
 * stream, the job timeout and the launcher's hooks, and the list of its comms so
 * that a failure aborts them all, as PyTorch's ProcessGroupNCCL watchdog aborts
 * every communicator of the group: torch/csrc/distributed/c10d/
 * ProcessGroupNCCL.cpp, abort()). Each dt_comm holds two NCCL communicators:
 * `nc` for collectives on stream `cs`, and `p2p`, split from it, for send/recv on
 * stream `ps`. Operations get tickets 1, 2, ...; the done event of the last
 * NC_RING of them is kept. Since each stream runs in order, the newest event of a
 * stream covers every older operation on it: a ticket that left the ring is
 * waited for through the newest events of both streams.
 *
 * Waits poll (cudaEventQuery, ncclCommGetAsyncError, the launcher's failed
 * hook) rather than block, yielding for the first NC_SPIN_S and napping after,
 * so a rank waiting on a late peer burns no core and never outlives the job
 * timeout. Non-blocking communicators: NCCL's user guide, "Fault Tolerance" and
 * ncclConfig_t.blocking: a call may answer ncclInProgress, and the comm must then
 * be polled with ncclCommGetAsyncError until it leaves that state.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"
#include "comm/comm_nccl.h"

#ifdef HAVE_NCCL

#include <sched.h>
#include <time.h>

#include <cuda_runtime.h>
/* nccl.h declares ncclGroupStart() and a few others without (void). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

/* ncclAvg, ncclBfloat16 and non-blocking communicators with ncclCommSplit need
 * NCCL 2.18 (ncclCommSplit's release). */
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "the nccl comm backend needs NCCL >= 2.18 (ncclCommSplit, non-blocking communicators)"
#endif

enum { NC_RING = 64 };
/* Polling: yield for the first NC_SPIN_S of a wait (a collective on one node
 * takes microseconds to milliseconds), then nap NC_NAP_NS between polls (the
 * latency added once a late peer arrives). */
#define NC_SPIN_S 2e-3
#define NC_NAP_NS 50000L
#define NC_DEFAULT_TIMEOUT_S 300.0
/* Scratch for host buffers: regions aligned for any NCCL datatype and for
 * coalesced access. */
#define NC_ALIGN 256

typedef struct nc_rank {
  int refs;                 /* comms alive on it */
  int ordinal;              /* the GPU */
  cudaStream_t compute;     /* the device's stream (not ours) */
  double timeout_s;
  dt_nccl_hooks hooks;
  bool aborted;             /* its comms were aborted */
  struct nc_comm *comms;    /* live comms, for the abort */
} nc_rank;

/* A send queued until the next group is issued (see comm_nccl.h). */
typedef struct nc_send {
  void *buf;                /* stream-ordered device copy of the payload */
  size_t count;
  ncclDataType_t type;
  int peer;
} nc_send;

typedef struct nc_event {
  cudaEvent_t ev;
  uint64_t ticket;          /* 0: never recorded */
  int lane;                 /* 0: cs, 1: ps */
} nc_event;

typedef struct nc_comm {
  nc_rank *rk;
  struct nc_comm *next;     /* rk->comms */
  ncclComm_t nc, p2p;
  cudaStream_t cs, ps;
  cudaEvent_t ready;        /* recorded on the compute stream before an operation */
  nc_event ring[NC_RING];
  uint64_t seq;             /* last ticket */
  uint64_t last[2];         /* last ticket per lane */
  dt_nccl_mode mode;
  nc_send *q;
  size_t nq, capq;
  void *scratch;            /* device staging of host buffers */
  size_t scratch_bytes;
  float *one;               /* one device float: the barrier's payload */
} nc_comm;

static const dt_comm_ops nccl_ops;

/* ---- errors and failure ---------------------------------------------------------- */

/* Aborts every communicator of the rank (once); later calls see DT_ERR_ABORTED. */
static void rank_abort(nc_rank *rk) {
  if (rk->aborted) return;
  rk->aborted = true;
  (void)cudaSetDevice(rk->ordinal);
  for (nc_comm *m = rk->comms; m; m = m->next) {
    /* ncclCommAbort stops what is still running on the GPU and frees the
     * communicator; its status is moot on this path. */
    if (m->p2p) (void)ncclCommAbort(m->p2p);
    if (m->nc) (void)ncclCommAbort(m->nc);
    m->p2p = NULL;
    m->nc = NULL;
  }
}

/* This rank failed with the error already recorded on ctx: abort its comms and
 * tell the job (a threads job wakes the other ranks at once). */
static dt_status rank_fail(dt_ctx *ctx, nc_rank *rk, dt_status s) {
  rank_abort(rk);
  if (rk->hooks.fail) rk->hooks.fail(rk->hooks.arg, ctx ? ctx->rank : -1, s, dt_last_error(ctx));
  return s;
}

static dt_status cuda_fail(dt_ctx *ctx, nc_rank *rk, cudaError_t e, const char *op, const char *fn,
                           bool fatal) {
  (void)cudaGetLastError(); /* read the sticky-until-read error, so it is reported once */
  dt_status s = dt_error(ctx, e == cudaErrorMemoryAllocation ? DT_ERR_NOMEM : DT_ERR_BACKEND, op,
                         "%s: %s", fn, cudaGetErrorString(e));
  return fatal ? rank_fail(ctx, rk, s) : s;
}
/* A CUDA call that, failing, leaves the comms usable (allocation, a copy not
 * yet issued): the error is returned. */
#define NC_CUDA(ctx, rk, op, call)                                                    \
  do {                                                                                \
    cudaError_t e_ = (call);                                                          \
    if (e_ != cudaSuccess) return cuda_fail((ctx), (rk), e_, (op), #call, false);     \
  } while (0)
/* One whose failure leaves an operation half issued: the rank fails. */
#define NC_CUDA_FATAL(ctx, rk, op, call)                                              \
  do {                                                                                \
    cudaError_t e_ = (call);                                                          \
    if (e_ != cudaSuccess) return cuda_fail((ctx), (rk), e_, (op), #call, true);      \
  } while (0)

static dt_status nccl_fail(dt_ctx *ctx, nc_rank *rk, ncclComm_t nc, ncclResult_t r,
                           const char *op, const char *fn) {
  const char *last = nc ? ncclGetLastError(nc) : ncclGetLastError(NULL);
  dt_status s = dt_error(ctx, DT_ERR_BACKEND, op, "%s: %s%s%s", fn, ncclGetErrorString(r),
                         last && last[0] ? ": " : "", last ? last : "");
  return rank_fail(ctx, rk, s);
}

/* DT_ERR_ABORTED (recorded) when the rank's comms are aborted or the launcher
 * says another rank failed (then they are aborted now). */
static dt_status peer_check(dt_ctx *ctx, nc_rank *rk, const char *op, const char *group) {
  int r = -1;
  char msg[DT_ERRMSG_LEN];
  msg[0] = '\0';
  if (!rk->aborted && !(rk->hooks.failed && rk->hooks.failed(rk->hooks.arg, &r, msg, sizeof msg)))
    return DT_OK;
  rank_abort(rk);
  if (r >= 0)
    return dt_error(ctx, DT_ERR_ABORTED, op, "group '%s': job aborted by rank %d: %s", group, r,
                    msg);
  return dt_error(ctx, DT_ERR_ABORTED, op, "group '%s': the rank's NCCL communicators were aborted",
                  group);
}

static void poll_pause(double waited) {
  if (waited < NC_SPIN_S) {
    sched_yield();
    return;
  }
  struct timespec ts = {0, NC_NAP_NS};
  nanosleep(&ts, NULL);
}

static dt_status timed_out(dt_ctx *ctx, nc_rank *rk, const char *op, const char *group, int size,
                           const char *what) {
  dt_status s = dt_error(ctx, DT_ERR_TIMEOUT, op, "group '%s' (%d ranks) waited %.3g s for %s",
                         group, size, rk->timeout_s, what);
  return rank_fail(ctx, rk, s);
}

/* Settles an NCCL call on a non-blocking communicator: ncclInProgress is polled
 * with ncclCommGetAsyncError until it resolves, within the timeout. */
static dt_status settle(dt_ctx *ctx, nc_rank *rk, ncclComm_t nc, ncclResult_t r, const char *op,
                        const char *fn, const char *group, int size) {
  double t0 = dt_now();
  while (r == ncclInProgress) {
    DT_CHECK(peer_check(ctx, rk, op, group));
    double waited = dt_now() - t0;
    if (waited >= rk->timeout_s) return timed_out(ctx, rk, op, group, size, fn);
    poll_pause(waited);
    ncclResult_t q = ncclCommGetAsyncError(nc, &r);
    if (q != ncclSuccess) r = q;
  }
  if (r != ncclSuccess) return nccl_fail(ctx, rk, nc, r, op, fn);
  return DT_OK;
}
#define NC_NCCL(c, m, op, fn, ...)                                                         \
  settle((c)->ctx, (m)->rk, (m)->nc, fn(__VA_ARGS__), (op), #fn, (c)->name, (c)->size)

/* Waits on the host for ev (of comm c) within the timeout, watching NCCL's
 * asynchronous errors on both of c's communicators and the job. */
static dt_status wait_event(dt_comm *c, cudaEvent_t ev, const char *op) {
  nc_comm *m = c->impl;
  nc_rank *rk = m->rk;
  double t0 = dt_now();
  for (;;) {
    cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) return DT_OK;
    if (e != cudaErrorNotReady) return cuda_fail(c->ctx, rk, e, op, "cudaEventQuery", true);
    ncclComm_t lanes[2] = {m->nc, m->p2p};
    for (int i = 0; i < 2; i++) {
      ncclResult_t a = ncclSuccess;
      ncclResult_t q = lanes[i] ? ncclCommGetAsyncError(lanes[i], &a) : ncclSuccess;
      if (q != ncclSuccess) a = q;
      if (a != ncclSuccess && a != ncclInProgress)
        return nccl_fail(c->ctx, rk, lanes[i], a, op, "ncclCommGetAsyncError");
    }
    DT_CHECK(peer_check(c->ctx, rk, op, c->name));
    double waited = dt_now() - t0;
    if (waited >= rk->timeout_s) return timed_out(c->ctx, rk, op, c->name, c->size, "completion");
    poll_pause(waited);
  }
}

/* ---- types ------------------------------------------------------------------------ */

static bool nccl_type(dt_dtype t, ncclDataType_t *out) {
  switch (t) {
    case DT_F32: *out = ncclFloat32; return true;
    case DT_F64: *out = ncclFloat64; return true;
    case DT_BF16: *out = ncclBfloat16; return true;
    case DT_I64: *out = ncclInt64; return true;
    default: return false;
  }
}

static bool nccl_red(dt_reduce_op op, ncclRedOp_t *out) {
  switch (op) {
    case DT_RED_SUM: *out = ncclSum; return true;
    case DT_RED_AVG: *out = ncclAvg; return true;
    case DT_RED_MAX: *out = ncclMax; return true;
    case DT_RED_MIN: *out = ncclMin; return true;
    case DT_RED_PROD: *out = ncclProd; return true;
    default: return false;
  }
}

/* ---- tickets and ordering --------------------------------------------------------- */

/* Records the done event of a new operation on lane (0: cs, 1: ps). */
static dt_status record_done(dt_comm *c, int lane, const char *op, cudaEvent_t *ev) {
  nc_comm *m = c->impl;
  uint64_t t = m->seq + 1;
  nc_event *e = &m->ring[t % NC_RING];
  NC_CUDA_FATAL(c->ctx, m->rk, op, cudaEventRecord(e->ev, lane ? m->ps : m->cs));
  e->ticket = t;
  e->lane = lane;
  m->seq = t;
  m->last[lane] = t;
  *ev = e->ev;
  return DT_OK;
}

/* The done events that cover ticket t: its own while in the ring, else the
 * newest of each lane. n set to 0, 1 or 2. */
static void events_for(nc_comm *m, uint64_t t, cudaEvent_t ev[2], int *n) {
  *n = 0;
  if (t == 0) return;
  if (t > m->seq) t = m->seq;
  nc_event *e = &m->ring[t % NC_RING];
  if (e->ticket == t) {
    ev[(*n)++] = e->ev;
    return;
  }
  for (int lane = 0; lane < 2; lane++)
    if (m->last[lane]) ev[(*n)++] = m->ring[m->last[lane] % NC_RING].ev;
}

/* ---- host buffers ----------------------------------------------------------------- */

static bool is_device_ptr(const void *p) {
  struct cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError(); /* an unknown pointer is host memory */
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

/* One buffer of an operation: `user` as the caller gave it, `dev` what NCCL
 * gets (user itself for device memory, a scratch region for host memory). */
typedef struct nc_buf {
  const void *user;
  size_t bytes;
  bool in, out;
  bool host;
  int parent;     /* index of the host buffer containing this one, or -1 */
  size_t off;     /* offset in scratch (own region) or in the parent */
  void *dev;
} nc_buf;

static dt_status scratch_reserve(dt_comm *c, size_t bytes, const char *op) {
  nc_comm *m = c->impl;
  if (bytes <= m->scratch_bytes) return DT_OK;
  if (m->scratch) {
    /* Host-buffer calls block until done, so nothing queued still uses it. */
    NC_CUDA(c->ctx, m->rk, op, cudaFree(m->scratch));
    m->scratch = NULL;
    m->scratch_bytes = 0;
  }
  NC_CUDA(c->ctx, m->rk, op, cudaMalloc(&m->scratch, bytes));
  m->scratch_bytes = bytes;
  return DT_OK;
}

/* Maps the buffers; host ones get scratch regions (a host buffer inside an
 * earlier one shares its region, keeping in-place calls in place) and inputs
 * are copied in on `stream`. *staged: some buffer is host memory. */
static dt_status stage_in(dt_comm *c, nc_buf *b, int n, cudaStream_t stream, const char *op,
                          bool *staged) {
  nc_comm *m = c->impl;
  size_t total = 0;
  *staged = false;
  for (int i = 0; i < n; i++) {
    b[i].parent = -1;
    b[i].dev = (void *)b[i].user;
    b[i].host = b[i].user && b[i].bytes && !is_device_ptr(b[i].user);
    if (!b[i].host) continue;
    *staged = true;
    const char *u = b[i].user;
    for (int j = 0; j < i && b[i].parent < 0; j++) {
      const char *v = b[j].user;
      if (b[j].host && b[j].parent < 0 && u >= v && u + b[i].bytes <= v + b[j].bytes) {
        b[i].parent = j;
        b[i].off = (size_t)(u - v);
      }
    }
    if (b[i].parent >= 0) continue;
    b[i].off = total;
    total += (b[i].bytes + NC_ALIGN - 1) / NC_ALIGN * NC_ALIGN;
  }
  if (!*staged) return DT_OK;
  DT_CHECK(scratch_reserve(c, total, op));
  for (int i = 0; i < n; i++) {
    if (!b[i].host) continue;
    size_t base = b[i].parent >= 0 ? b[b[i].parent].off + b[i].off : b[i].off;
    b[i].dev = (char *)m->scratch + base;
  }
  for (int i = 0; i < n; i++)
    if (b[i].host && b[i].in)
      NC_CUDA_FATAL(c->ctx, m->rk, op,
                    cudaMemcpyAsync(b[i].dev, b[i].user, b[i].bytes, cudaMemcpyHostToDevice, stream));
  return DT_OK;
}

/* Copies the staged outputs back (after the operation completed). */
static dt_status stage_out(dt_comm *c, nc_buf *b, int n, cudaStream_t stream, const char *op) {
  nc_comm *m = c->impl;
  bool any = false;
  for (int i = 0; i < n; i++)
    if (b[i].host && b[i].out) {
      NC_CUDA_FATAL(c->ctx, m->rk, op,
                    cudaMemcpyAsync((void *)b[i].user, b[i].dev, b[i].bytes,
                                    cudaMemcpyDeviceToHost, stream));
      any = true;
    }
  /* The operation is complete, so this sync waits for the copies only. */
  if (any) NC_CUDA_FATAL(c->ctx, m->rk, op, cudaStreamSynchronize(stream));
  return DT_OK;
}

/* ---- issuing ---------------------------------------------------------------------- */

/* Common entry: aborted job, device, and the queued sends issued. */
static dt_status flush_sends(dt_comm *c, const char *op);

static dt_status enter(dt_comm *c, const char *op) {
  nc_comm *m = c->impl;
  DT_CHECK(peer_check(c->ctx, m->rk, op, c->name));
  NC_CUDA(c->ctx, m->rk, op, cudaSetDevice(m->rk->ordinal));
  return DT_OK;
}

/* The lane's stream waits for the work queued so far on the compute stream. */
static dt_status after_compute(dt_comm *c, cudaStream_t lane, const char *op) {
  nc_comm *m = c->impl;
  NC_CUDA_FATAL(c->ctx, m->rk, op, cudaEventRecord(m->ready, m->rk->compute));
  NC_CUDA_FATAL(c->ctx, m->rk, op, cudaStreamWaitEvent(lane, m->ready, 0));
  return DT_OK;
}

/* After an operation was issued and its done event recorded: the mode's wait. */
static dt_status finish(dt_comm *c, cudaEvent_t done, bool staged, nc_buf *b, int n,
                        cudaStream_t lane, const char *op) {
  nc_comm *m = c->impl;
  if (m->mode == DT_NCCL_BLOCKING || staged) {
    DT_CHECK(wait_event(c, done, op));
    if (staged) DT_CHECK(stage_out(c, b, n, lane, op));
  }
  if (m->mode != DT_NCCL_DEFERRED || staged)
    NC_CUDA_FATAL(c->ctx, m->rk, op, cudaStreamWaitEvent(m->rk->compute, done, 0));
  return DT_OK;
}

typedef struct nc_args {
  dt_coll kind;
  const char *name;
  size_t count;
  dt_dtype t;
  dt_reduce_op red;
  int root;
} nc_args;

/* Issues one collective on cs with device pointers s (send) and r (recv). */
static dt_status issue(dt_comm *c, const nc_args *a, const void *s, void *r) {
  nc_comm *m = c->impl;
  const char *op = a->name;
  ncclDataType_t ty = ncclFloat32;
  ncclRedOp_t ro = ncclSum;
  (void)nccl_type(a->t, &ty);
  (void)nccl_red(a->red, &ro);
  size_t cnt = a->count, blk = cnt * dt_dtype_size(a->t);
  switch (a->kind) {
    case DT_COLL_ALL_REDUCE:
      return NC_NCCL(c, m, op, ncclAllReduce, s, r, cnt, ty, ro, m->nc, m->cs);
    case DT_COLL_ALL_GATHER:
      return NC_NCCL(c, m, op, ncclAllGather, s, r, cnt, ty, m->nc, m->cs);
    case DT_COLL_REDUCE_SCATTER:
      return NC_NCCL(c, m, op, ncclReduceScatter, s, r, cnt, ty, ro, m->nc, m->cs);
    case DT_COLL_BROADCAST:
      return NC_NCCL(c, m, op, ncclBroadcast, r, r, cnt, ty, a->root, m->nc, m->cs);
    case DT_COLL_BARRIER:
      return NC_NCCL(c, m, op, ncclAllReduce, m->one, m->one, 1, ncclFloat32, ncclSum, m->nc,
                     m->cs);
    case DT_COLL_ALL_TO_ALL:
    case DT_COLL_SCATTER: {
      /* Grouped point to point on the collective communicator, as PyTorch's
       * all_to_all_single does (torch/csrc/cuda/nccl.cpp, all2all_single_equal_split).
       * The own block is a device copy; the group issues in one launch. */
      bool a2a = a->kind == DT_COLL_ALL_TO_ALL;
      DT_CHECK(NC_NCCL(c, m, op, ncclGroupStart));
      dt_status st = DT_OK;
      for (int p = 0; p < c->size && st == DT_OK; p++) {
        const char *sp = (const char *)s + (size_t)p * blk;
        char *rp = (char *)r + (a2a ? (size_t)p * blk : 0);
        if (p == c->rank) {
          if ((a2a || c->rank == a->root) && sp != rp) {
            cudaError_t e = cudaMemcpyAsync(rp, sp, blk, cudaMemcpyDeviceToDevice, m->cs);
            if (e != cudaSuccess) st = cuda_fail(c->ctx, m->rk, e, op, "cudaMemcpyAsync", true);
          }
          continue;
        }
        if (a2a || c->rank == a->root)
          st = NC_NCCL(c, m, op, ncclSend, sp, cnt, ty, p, m->nc, m->cs);
        if (st == DT_OK && (a2a || p == a->root))
          st = NC_NCCL(c, m, op, ncclRecv, rp, cnt, ty, p, m->nc, m->cs);
      }
      /* The group is closed whatever failed, so NCCL's group state is clean. */
      dt_status se = NC_NCCL(c, m, op, ncclGroupEnd);
      return st != DT_OK ? st : se;
    }
    default:
      return dt_error(c->ctx, DT_ERR_INTERNAL, op, "not a collective: %d", (int)a->kind);
  }
}

/* Runs a collective: buffers staged when on the host, ordered after the
 * compute stream, issued on cs, and finished by the mode. */
static dt_status coll(dt_comm *c, const nc_args *a, const void *send, size_t send_bytes,
                      void *recv, size_t recv_bytes, bool recv_in) {
  nc_comm *m = c->impl;
  const char *op = a->name;
  ncclDataType_t ty;
  ncclRedOp_t ro;
  if (!nccl_type(a->t, &ty)) return dt_error(c->ctx, DT_ERR_INVALID, op, "invalid dtype %d", (int)a->t);
  if (!nccl_red(a->red, &ro)) return dt_error(c->ctx, DT_ERR_INVALID, op, "invalid reduce op");
  DT_CHECK(enter(c, op));
  DT_CHECK(flush_sends(c, op));
  nc_args z = *a;
  if (a->count == 0) {
    /* Zero counts still synchronise (comm.h): a barrier. */
    z.kind = DT_COLL_BARRIER;
    send = NULL;
    recv = NULL;
    send_bytes = recv_bytes = 0;
  }
  /* recv first: a send inside it (in-place all_gather, scatter's root) shares its region. */
  nc_buf b[2] = {{.user = recv, .bytes = recv_bytes, .in = recv_in, .out = true},
                 {.user = send, .bytes = send_bytes, .in = true, .out = false}};
  bool staged = false;
  DT_CHECK(after_compute(c, m->cs, op));
  DT_CHECK(stage_in(c, b, 2, m->cs, op, &staged));
  DT_CHECK(issue(c, &z, b[1].dev, b[0].dev));
  cudaEvent_t done;
  DT_CHECK(record_done(c, 0, op, &done));
  return finish(c, done, staged, b, 2, m->cs, op);
}

/* ---- the slots -------------------------------------------------------------------- */

static dt_status nccl_all_reduce(dt_comm *c, const void *send, void *recv, size_t count,
                                 dt_dtype t, dt_reduce_op op) {
  nc_args a = {DT_COLL_ALL_REDUCE, "all_reduce", count, t, op, 0};
  size_t bytes = count * dt_dtype_size(t);
  return coll(c, &a, send, bytes, recv, bytes, send == recv);
}

static dt_status nccl_all_gather(dt_comm *c, const void *send, void *recv, size_t count,
                                 dt_dtype t) {
  nc_args a = {DT_COLL_ALL_GATHER, "all_gather", count, t, DT_RED_SUM, 0};
  size_t bytes = count * dt_dtype_size(t);
  return coll(c, &a, send, bytes, recv, bytes * (size_t)c->size, false);
}

static dt_status nccl_reduce_scatter(dt_comm *c, const void *send, void *recv, size_t count,
                                     dt_dtype t, dt_reduce_op op) {
  nc_args a = {DT_COLL_REDUCE_SCATTER, "reduce_scatter", count, t, op, 0};
  size_t bytes = count * dt_dtype_size(t);
  return coll(c, &a, send, bytes * (size_t)c->size, recv, bytes, send == recv);
}

static dt_status nccl_all_to_all(dt_comm *c, const void *send, void *recv, size_t count,
                                 dt_dtype t) {
  nc_args a = {DT_COLL_ALL_TO_ALL, "all_to_all", count, t, DT_RED_SUM, 0};
  size_t bytes = count * dt_dtype_size(t) * (size_t)c->size;
  return coll(c, &a, send, bytes, recv, bytes, send == recv);
}

static dt_status nccl_broadcast(dt_comm *c, void *buf, size_t count, dt_dtype t, int root) {
  nc_args a = {DT_COLL_BROADCAST, "broadcast", count, t, DT_RED_SUM, root};
  return coll(c, &a, NULL, 0, buf, count * dt_dtype_size(t), c->rank == root);
}

static dt_status nccl_scatter(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t,
                              int root) {
  nc_args a = {DT_COLL_SCATTER, "scatter", count, t, DT_RED_SUM, root};
  size_t bytes = count * dt_dtype_size(t);
  bool am_root = c->rank == root;
  return coll(c, &a, am_root ? send : NULL, am_root ? bytes * (size_t)c->size : 0, recv, bytes,
              false);
}

static dt_status nccl_barrier(dt_comm *c) {
  nc_args a = {DT_COLL_BARRIER, "barrier", 0, DT_F32, DT_RED_SUM, 0};
  return coll(c, &a, NULL, 0, NULL, 0, false);
}

/* ---- point to point --------------------------------------------------------------- */

/* Issues the queued sends, and the receive r when given, as one group on ps;
 * frees the payload copies in stream order. Returns the done event's ticket
 * through *done when something was issued. */
typedef struct nc_recv {
  void *buf;
  size_t count;
  ncclDataType_t type;
  int peer;
} nc_recv;

static dt_status issue_p2p(dt_comm *c, const nc_recv *r, const char *op, cudaEvent_t *done,
                           bool *issued) {
  nc_comm *m = c->impl;
  *issued = false;
  if (m->nq == 0 && !r) return DT_OK;
  DT_CHECK(NC_NCCL(c, m, op, ncclGroupStart));
  dt_status st = DT_OK;
  for (size_t i = 0; i < m->nq && st == DT_OK; i++)
    st = settle(c->ctx, m->rk, m->p2p,
                ncclSend(m->q[i].buf, m->q[i].count, m->q[i].type, m->q[i].peer, m->p2p, m->ps),
                op, "ncclSend", c->name, c->size);
  if (st == DT_OK && r)
    st = settle(c->ctx, m->rk, m->p2p, ncclRecv(r->buf, r->count, r->type, r->peer, m->p2p, m->ps),
                op, "ncclRecv", c->name, c->size);
  dt_status se = settle(c->ctx, m->rk, m->p2p, ncclGroupEnd(), op, "ncclGroupEnd", c->name,
                        c->size);
  if (st == DT_OK) st = se;
  if (st != DT_OK) return st; /* the rank failed: its comms are aborted, copies go with them */
  for (size_t i = 0; i < m->nq; i++)
    NC_CUDA_FATAL(c->ctx, m->rk, op, cudaFreeAsync(m->q[i].buf, m->ps));
  m->nq = 0;
  DT_CHECK(record_done(c, 1, op, done));
  *issued = true;
  return DT_OK;
}

static dt_status flush_sends(dt_comm *c, const char *op) {
  nc_comm *m = c->impl;
  if (m->nq == 0) return DT_OK;
  cudaEvent_t done;
  bool issued;
  return issue_p2p(c, NULL, op, &done, &issued);
}

/* Eager: the payload is copied (stream-ordered, after the compute stream's work)
 * into a device allocation and the send is queued (see comm_nccl.h). A zero-count
 * message is not sent, and the matching zero-count recv receives nothing. */
static dt_status nccl_send(dt_comm *c, const void *buf, size_t count, dt_dtype t, int peer,
                           int tag) {
  const char *op = "send";
  nc_comm *m = c->impl;
  ncclDataType_t ty;
  (void)tag; /* not NCCL's: messages from one peer arrive in send order */
  if (!nccl_type(t, &ty)) return dt_error(c->ctx, DT_ERR_INVALID, op, "invalid dtype %d", (int)t);
  DT_CHECK(enter(c, op));
  if (count == 0) return DT_OK;
  if (m->nq == m->capq) {
    size_t cap = m->capq ? 2 * m->capq : 8;
    nc_send *q = realloc(m->q, cap * sizeof *q);
    if (!q) return dt_error(c->ctx, DT_ERR_NOMEM, op, "no memory for %zu queued sends", cap);
    m->q = q;
    m->capq = cap;
  }
  size_t bytes = count * dt_dtype_size(t);
  void *copy = NULL;
  NC_CUDA(c->ctx, m->rk, op, cudaMallocAsync(&copy, bytes, m->ps));
  bool dev = is_device_ptr(buf);
  if (dev) DT_CHECK(after_compute(c, m->ps, op));
  /* From pageable host memory the copy returns once the payload is taken, so
   * the caller may reuse buf at once either way. */
  NC_CUDA_FATAL(c->ctx, m->rk, op,
                cudaMemcpyAsync(copy, buf, bytes,
                                dev ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice, m->ps));
  m->q[m->nq++] = (nc_send){copy, count, ty, peer};
  return DT_OK;
}

static dt_status nccl_recv(dt_comm *c, void *buf, size_t count, dt_dtype t, int peer, int tag) {
  const char *op = "recv";
  nc_comm *m = c->impl;
  ncclDataType_t ty;
  (void)tag;
  if (!nccl_type(t, &ty)) return dt_error(c->ctx, DT_ERR_INVALID, op, "invalid dtype %d", (int)t);
  DT_CHECK(enter(c, op));
  if (count == 0) return flush_sends(c, op);
  nc_buf b[1] = {{.user = buf, .bytes = count * dt_dtype_size(t), .in = false, .out = true}};
  bool staged = false;
  /* The receive overwrites buf: it must wait for the compute stream's readers. */
  DT_CHECK(after_compute(c, m->ps, op));
  DT_CHECK(stage_in(c, b, 1, m->ps, op, &staged));
  nc_recv r = {b[0].dev, count, ty, peer};
  cudaEvent_t done;
  bool issued;
  DT_CHECK(issue_p2p(c, &r, op, &done, &issued));
  return finish(c, done, staged, b, 1, m->ps, op);
}

/* ---- creation and destruction ----------------------------------------------------- */

static void comm_unlink(nc_comm *m) {
  for (nc_comm **p = &m->rk->comms; *p; p = &(*p)->next)
    if (*p == m) {
      *p = m->next;
      break;
    }
}

/* Frees what m holds besides the NCCL communicators (already finalized or
 * aborted) and drops its reference on the rank. */
static void comm_free_local(nc_comm *m) {
  nc_rank *rk = m->rk;
  (void)cudaSetDevice(rk->ordinal);
  for (size_t i = 0; i < m->nq; i++) (void)cudaFreeAsync(m->q[i].buf, m->ps);
  free(m->q);
  if (m->scratch) (void)cudaFree(m->scratch);
  if (m->one) (void)cudaFree(m->one);
  for (int i = 0; i < NC_RING; i++)
    if (m->ring[i].ev) (void)cudaEventDestroy(m->ring[i].ev);
  if (m->ready) (void)cudaEventDestroy(m->ready);
  if (m->cs) (void)cudaStreamDestroy(m->cs);
  if (m->ps) (void)cudaStreamDestroy(m->ps);
  (void)cudaGetLastError();
  comm_unlink(m);
  free(m);
  if (--rk->refs == 0) free(rk);
}

/* Finalizes a live NCCL communicator (non-blocking: polled within the timeout);
 * a failure aborts the rank. */
static dt_status comm_close(dt_ctx *ctx, nc_rank *rk, ncclComm_t *nc, const char *group, int size) {
  if (!*nc) return DT_OK;
  dt_status s = settle(ctx, rk, *nc, ncclCommFinalize(*nc), "destroy", "ncclCommFinalize", group,
                       size);
  if (s != DT_OK) return s; /* aborted with the rank's other comms */
  ncclResult_t r = ncclCommDestroy(*nc);
  *nc = NULL;
  if (r != ncclSuccess)
    return dt_error(ctx, DT_ERR_BACKEND, "destroy", "ncclCommDestroy: %s", ncclGetErrorString(r));
  return DT_OK;
}

static void nccl_destroy(dt_comm *c) {
  if (!c) return;
  nc_comm *m = c->impl;
  if (m) {
    nc_rank *rk = m->rk;
    if (!rk->aborted) {
      /* Everything queued must end before the communicators go. */
      dt_status s = cudaSetDevice(rk->ordinal) == cudaSuccess ? flush_sends(c, "destroy")
                                                               : DT_ERR_BACKEND;
      if (s == DT_OK) s = dt_comm_nccl_sync(c);
      if (s == DT_OK) s = comm_close(c->ctx, rk, &m->p2p, c->name, c->size);
      if (s == DT_OK) s = comm_close(c->ctx, rk, &m->nc, c->name, c->size);
      if (s != DT_OK) rank_abort(rk);
    }
    comm_free_local(m);
  }
  dt_comm_free_base(c);
  free(c);
}

/* Wraps the NCCL communicators nc (collectives) and p2p as a dt_comm named
 * `name`; takes them over (aborted on failure). world_ranks: NULL for the
 * world, else gathered over the new comm. */
static dt_status comm_make(dt_ctx *ctx, nc_rank *rk, ncclComm_t nc, ncclComm_t p2p,
                           const char *name, const int *parent_world_ranks, int parent_rank,
                           dt_nccl_mode mode, dt_comm **out) {
  const char *op = "nccl";
  *out = NULL;
  int rank = 0, size = 0;
  ncclResult_t r1 = ncclCommUserRank(nc, &rank), r2 = ncclCommCount(nc, &size);
  dt_comm *c = calloc(1, sizeof *c);
  nc_comm *m = calloc(1, sizeof *m);
  if (!c || !m) {
    free(c);
    free(m);
    (void)ncclCommAbort(p2p);
    (void)ncclCommAbort(nc);
    return dt_error(ctx, DT_ERR_NOMEM, op, "no memory for a communicator");
  }
  m->rk = rk;
  m->nc = nc;
  m->p2p = p2p;
  m->mode = mode;
  rk->refs++;
  m->next = rk->comms;
  rk->comms = m;
  c->impl = m;
  c->ctx = ctx;
  dt_status s = DT_OK;
  if (r1 != ncclSuccess || r2 != ncclSuccess) {
    s = nccl_fail(ctx, rk, nc, r1 != ncclSuccess ? r1 : r2, op, "ncclCommUserRank/ncclCommCount");
    goto fail;
  }
  s = dt_comm_init_base(c, &nccl_ops, ctx, name, rank, size, NULL);
  if (s != DT_OK) goto fail;
  c->impl = m;
#define MK(call)                                                               \
  do {                                                                         \
    cudaError_t e_ = (call);                                                   \
    if (e_ != cudaSuccess) {                                                   \
      s = cuda_fail(ctx, rk, e_, op, #call, false);                            \
      goto fail;                                                               \
    }                                                                          \
  } while (0)
  MK(cudaStreamCreateWithFlags(&m->cs, cudaStreamNonBlocking));
  MK(cudaStreamCreateWithFlags(&m->ps, cudaStreamNonBlocking));
  MK(cudaEventCreateWithFlags(&m->ready, cudaEventDisableTiming));
  for (int i = 0; i < NC_RING; i++)
    MK(cudaEventCreateWithFlags(&m->ring[i].ev, cudaEventDisableTiming));
  MK(cudaMalloc((void **)&m->one, sizeof(float)));
  MK(cudaMemsetAsync(m->one, 0, sizeof(float), m->cs));
#undef MK
  if (parent_world_ranks) {
    /* World rank of each member: gathered over the new comm (host buffers,
     * staged; not a ledger row: the front is bypassed). */
    int64_t mine = parent_world_ranks[parent_rank];
    int64_t *all = malloc((size_t)size * sizeof *all);
    if (!all) {
      s = dt_error(ctx, DT_ERR_NOMEM, op, "no memory for %d ranks", size);
      goto fail;
    }
    s = nccl_all_gather(c, &mine, all, 1, DT_I64);
    for (int i = 0; s == DT_OK && i < size; i++) c->world_ranks[i] = (int)all[i];
    free(all);
    if (s != DT_OK) goto fail;
  }
  *out = c;
  return DT_OK;
fail:
  rank_fail(ctx, rk, s);
  comm_free_local(m);
  dt_comm_free_base(c);
  free(c);
  return s;
}

static ncclConfig_t nb_config(const char *name) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  cfg.commName = name;
  return cfg;
}

/* Splits nc into the point-to-point duplicate (every rank, color 0, own order). */
static dt_status split_p2p(dt_ctx *ctx, nc_rank *rk, ncclComm_t nc, int rank, const char *group,
                           int size, ncclComm_t *out) {
  ncclConfig_t cfg = nb_config("p2p");
  *out = NULL;
  ncclResult_t r = ncclCommSplit(nc, 0, rank, out, &cfg);
  return settle(ctx, rk, *out ? *out : nc, r, "nccl", "ncclCommSplit", group, size);
}

static dt_status nccl_split(dt_comm *c, int color, int key, dt_comm **out) {
  const char *op = "split";
  nc_comm *m = c->impl;
  *out = NULL;
  DT_CHECK(enter(c, op));
  DT_CHECK(flush_sends(c, op));
  ncclConfig_t cfg = nb_config(c->name);
  ncclComm_t nc = NULL, p2p = NULL;
  ncclResult_t r = ncclCommSplit(m->nc, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &nc, &cfg);
  DT_CHECK(settle(c->ctx, m->rk, nc ? nc : m->nc, r, op, "ncclCommSplit", c->name, c->size));
  if (!nc) return DT_OK;
  int nrank = 0, nsize = 0;
  if (ncclCommUserRank(nc, &nrank) != ncclSuccess || ncclCommCount(nc, &nsize) != ncclSuccess) {
    (void)ncclCommAbort(nc);
    return nccl_fail(c->ctx, m->rk, NULL, ncclInternalError, op, "ncclCommUserRank");
  }
  dt_status s = split_p2p(c->ctx, m->rk, nc, nrank, c->name, nsize, &p2p);
  if (s != DT_OK) {
    if (p2p) (void)ncclCommAbort(p2p);
    (void)ncclCommAbort(nc);
    return s;
  }
  return comm_make(c->ctx, m->rk, nc, p2p, c->name, c->world_ranks, c->rank, m->mode, out);
}

static const dt_comm_ops nccl_ops = {
    .name = "nccl",
    .all_reduce = nccl_all_reduce,
    .all_gather = nccl_all_gather,
    .reduce_scatter = nccl_reduce_scatter,
    .all_to_all = nccl_all_to_all,
    .broadcast = nccl_broadcast,
    .scatter = nccl_scatter,
    .send = nccl_send,
    .recv = nccl_recv,
    .barrier = nccl_barrier,
    .split = nccl_split,
    .destroy = nccl_destroy,
};

/* ---- public ----------------------------------------------------------------------- */

bool dt_comm_nccl_built(void) { return true; }

bool dt_comm_is_nccl(const dt_comm *c) { return c && c->ops == &nccl_ops; }

static dt_status need_nccl(dt_comm *c, const char *op) {
  if (!c) return DT_ERR_INVALID;
  if (!dt_comm_is_nccl(c))
    return dt_error(c->ctx, DT_ERR_INVALID, op, "group '%s' is a %s communicator, not nccl",
                    c->name, c->ops ? c->ops->name : "?");
  return DT_OK;
}

dt_status dt_comm_nccl_set_mode(dt_comm *c, dt_nccl_mode mode) {
  DT_CHECK(need_nccl(c, "dt_comm_nccl_set_mode"));
  if (mode != DT_NCCL_BLOCKING && mode != DT_NCCL_STREAM && mode != DT_NCCL_DEFERRED)
    return dt_error(c->ctx, DT_ERR_INVALID, "dt_comm_nccl_set_mode", "mode %d", (int)mode);
  ((nc_comm *)c->impl)->mode = mode;
  return DT_OK;
}

uint64_t dt_comm_nccl_ticket(const dt_comm *c) {
  return dt_comm_is_nccl(c) ? ((const nc_comm *)c->impl)->seq : 0;
}

dt_status dt_comm_nccl_wait(dt_comm *c, uint64_t ticket) {
  const char *op = "dt_comm_nccl_wait";
  DT_CHECK(need_nccl(c, op));
  nc_comm *m = c->impl;
  DT_CHECK(enter(c, op));
  DT_CHECK(flush_sends(c, op));
  if (ticket > m->seq)
    return dt_error(c->ctx, DT_ERR_INVALID, op, "ticket %llu was not issued (last %llu)",
                    (unsigned long long)ticket, (unsigned long long)m->seq);
  ncclComm_t lanes[2] = {m->nc, m->p2p};
  for (int i = 0; i < 2; i++) {
    ncclResult_t a = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(lanes[i], &a);
    if (q != ncclSuccess) a = q;
    if (a != ncclSuccess && a != ncclInProgress)
      return nccl_fail(c->ctx, m->rk, lanes[i], a, op, "ncclCommGetAsyncError");
  }
  cudaEvent_t ev[2];
  int n;
  events_for(m, ticket, ev, &n);
  for (int i = 0; i < n; i++)
    NC_CUDA_FATAL(c->ctx, m->rk, op, cudaStreamWaitEvent(m->rk->compute, ev[i], 0));
  return DT_OK;
}

dt_status dt_comm_nccl_sync(dt_comm *c) {
  const char *op = "dt_comm_nccl_sync";
  DT_CHECK(need_nccl(c, op));
  nc_comm *m = c->impl;
  DT_CHECK(enter(c, op));
  DT_CHECK(flush_sends(c, op));
  for (int lane = 0; lane < 2; lane++)
    if (m->last[lane]) DT_CHECK(wait_event(c, m->ring[m->last[lane] % NC_RING].ev, op));
  return DT_OK;
}

dt_status dt_nccl_id_make(dt_ctx *ctx, dt_nccl_id *out) {
  ncclUniqueId id;
  _Static_assert(sizeof id == sizeof out->bytes, "ncclUniqueId is NCCL_UNIQUE_ID_BYTES");
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess)
    return dt_error(ctx, DT_ERR_BACKEND, "nccl", "ncclGetUniqueId: %s: %s", ncclGetErrorString(r),
                    ncclGetLastError(NULL));
  memcpy(out->bytes, &id, sizeof id);
  return DT_OK;
}

dt_status dt_nccl_comm_world(dt_ctx *ctx, const dt_nccl_id *id, int ordinal, void *compute_stream,
                             double timeout_s, const dt_nccl_hooks *hooks, dt_comm **out) {
  const char *op = "nccl";
  *out = NULL;
  if (!id || !compute_stream)
    return dt_error(ctx, DT_ERR_INVALID, op, "no NCCL id or compute stream");
  nc_rank *rk = calloc(1, sizeof *rk);
  if (!rk) return dt_error(ctx, DT_ERR_NOMEM, op, "no memory for the rank's NCCL state");
  rk->ordinal = ordinal;
  rk->compute = (cudaStream_t)compute_stream;
  rk->timeout_s = timeout_s > 0 ? timeout_s : NC_DEFAULT_TIMEOUT_S;
  if (hooks) rk->hooks = *hooks;
  cudaError_t e = cudaSetDevice(ordinal);
  if (e != cudaSuccess) {
    dt_status s = cuda_fail(ctx, rk, e, op, "cudaSetDevice", false);
    free(rk);
    return s;
  }
  ncclUniqueId uid;
  memcpy(&uid, id->bytes, sizeof uid);
  ncclConfig_t cfg = nb_config("world");
  ncclComm_t nc = NULL, p2p = NULL;
  ncclResult_t r = ncclCommInitRankConfig(&nc, ctx->world_size, uid, ctx->rank, &cfg);
  dt_status s = settle(ctx, rk, nc, r, op, "ncclCommInitRankConfig", "world", ctx->world_size);
  if (s == DT_OK) s = split_p2p(ctx, rk, nc, ctx->rank, "world", ctx->world_size, &p2p);
  if (s != DT_OK) {
    if (p2p) (void)ncclCommAbort(p2p);
    if (nc) (void)ncclCommAbort(nc);
    free(rk);
    return s;
  }
  s = comm_make(ctx, rk, nc, p2p, "world", NULL, 0, DT_NCCL_BLOCKING, out);
  /* comm_make took rk (refs 1) or freed it with the failed comm. */
  return s;
}

#else /* !HAVE_NCCL: stubs */

static dt_status no_nccl(dt_ctx *ctx, const char *op) {
  return dt_error(ctx, DT_ERR_UNSUPPORTED, op, "this libdtensor was built without NCCL");
}

bool dt_comm_nccl_built(void) { return false; }
bool dt_comm_is_nccl(const dt_comm *c) {
  (void)c;
  return false;
}
dt_status dt_comm_nccl_set_mode(dt_comm *c, dt_nccl_mode mode) {
  (void)mode;
  return no_nccl(c ? c->ctx : NULL, "dt_comm_nccl_set_mode");
}
uint64_t dt_comm_nccl_ticket(const dt_comm *c) {
  (void)c;
  return 0;
}
dt_status dt_comm_nccl_wait(dt_comm *c, uint64_t ticket) {
  (void)ticket;
  return no_nccl(c ? c->ctx : NULL, "dt_comm_nccl_wait");
}
dt_status dt_comm_nccl_sync(dt_comm *c) { return no_nccl(c ? c->ctx : NULL, "dt_comm_nccl_sync"); }
dt_status dt_nccl_id_make(dt_ctx *ctx, dt_nccl_id *out) {
  (void)out;
  return no_nccl(ctx, "nccl");
}
dt_status dt_nccl_comm_world(dt_ctx *ctx, const dt_nccl_id *id, int ordinal, void *compute_stream,
                             double timeout_s, const dt_nccl_hooks *hooks, dt_comm **out) {
  (void)id;
  (void)ordinal;
  (void)compute_stream;
  (void)timeout_s;
  (void)hooks;
  *out = NULL;
  return no_nccl(ctx, "nccl");
}

#endif /* HAVE_NCCL */
