/* lib/comm/comm_mpi.c: the Open MPI comm backend, and the job it runs in (set
 * up, ended and agreed on for the MPI launcher, lib/launch/launch_mpi.c).
 *
 * One rank per process, under mpirun. The world dt_comm wraps an MPI_Comm_dup of
 * MPI_COMM_WORLD; split comms wrap MPI_Comm_split results. Every blocking
 * operation is issued as the nonblocking MPI call (MPI_Iallreduce, MPI_Ibcast,
 * MPI_Isend, ...) and completed by a poll loop that also watches for an "abort
 * notice" and for the job deadline, so a failed or stalled rank never hangs the
 * others:
 *
 *   - each job owns a private control communicator (another dup of
 *     MPI_COMM_WORLD) with one pre-posted MPI_Irecv(ANY_SOURCE, abort tag);
 *   - a rank whose fn fails, whose collective waits past the job timeout, or
 *     whose MPI call errors sends a notice (its rank, status and last error) to
 *     every other rank, once per job;
 *   - a rank that receives a notice returns DT_ERR_ABORTED from the pending
 *     call and, without touching MPI, from every later one;
 *   - at the end, dt_mpi_job_agree agrees on the outcome over the control comm
 *     (polled MPI_Iallreduce + MPI_Ibcast), since the data comms of an aborted
 *     job may hold collectives that will never complete.
 *
 * Point to point is eager, as in the threads backend: dt_comm_send copies the
 * payload, starts an MPI_Isend from the copy and returns; the copies are reaped
 * by later calls and awaited when fn returns.
 *
 * A waiting rank polls nonstop (yielding) for as long as moving its bytes
 * could take, then sleeps between polls (see DT_MPI_SPIN_S): transfers run at
 * full speed, and a rank waiting for a late peer burns no core.
 *
 * bf16 reductions use user-defined MPI_Ops (created per job) that widen to f32,
 * reduce, and round back to bf16 at each step (dt_reduce_into), like the threads
 * backend; f32/f64 use MPI's built-in ops. AVG is SUM, then a local division by size.
 *
 * All per-process state of a job (control comm, pending abort receive, abort
 * record, bf16 ops) lives in a dt_mpi_job hung off the world comm's impl and
 * shared by pointer with every comm split from it. Only MPI's own
 * initialisation state is global (MPI's, not ours).
 *
 * What it is not: not fault tolerant in the ULFM sense (a crashed process is
 * mpirun's to handle: it kills the job), not heterogeneous (notices are raw
 * bytes), and not a GPU-aware transport (buffers are host memory). Counts above
 * INT_MAX (MPI's int counts) return DT_ERR_UNSUPPORTED.
 *
 * The price of "no hangs": Open MPI's nonblocking collectives (libnbc) are
 * slower than its blocking, tuned ones for large messages (measured here: an
 * 8 MB f64 all_reduce over 2 ranks, 3.6 ms vs 2.2 ms for MPI_Allreduce; small
 * messages ~1 us either way). Ledger seconds of the mpi backend include it.
 *
 * Limits of "no hangs", both inherent to MPI-3 (nonblocking collectives cannot
 * be cancelled):
 *   - after DT_ERR_ABORTED/DT_ERR_TIMEOUT the abandoned MPI request stays
 *     pending; if a late peer still joins it, MPI may write the caller's receive
 *     buffer after the call returned. The data comms of an aborted job are
 *     therefore never freed, and a program should end with dt_mpi_finish(false)
 *     (MPI_Abort) after a failed job, keeping its buffers alive until then.
 *   - split runs a polled barrier first, proving every member arrived, then the
 *     blocking MPI_Comm_split; a member failing between the two cannot happen
 *     (nothing of the caller's runs in between), but a member whose barrier poll
 *     times out in that instant would leave the others in MPI_Comm_split.
 *
 * Without HAVE_MPI this file defines nothing: the MPI launcher refuses with
 * DT_ERR_UNSUPPORTED before it would call into the job. The backend never
 * prints or exits.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"

#ifdef HAVE_MPI

#include <limits.h>
#include <sched.h>
#include <time.h>

#include <mpi.h>

enum {
  /* Tag of abort notices on the control comm: below 32767, the smallest
   * MPI_TAG_UB the standard allows, so it is valid everywhere. */
  DT_MPI_TAG_ABORT = 27001,
};

/* Polling. MPI moves data only while it is polled (no progress thread), so a
 * rank that sleeps between polls slows a transfer that is under way (measured:
 * an 8 MB all_reduce over 2 ranks, 3 ms polled nonstop, 40 ms with 50-200 us
 * naps). A waiting rank therefore polls nonstop (MPI_Test + sched_yield, which
 * lets oversubscribed ranks run) for as long as moving its bytes could take,
 *   spin = DT_MPI_SPIN_S + bytes * DT_MPI_SPIN_S_PER_BYTE,
 * and only a longer wait, which means a peer has not arrived yet, sleeps:
 * 50 us naps, 200 us once the wait passes DT_MPI_NAP_LONG_AFTER_S.
 *   DT_MPI_SPIN_S           shared-memory latency is microseconds and imbalance
 *                           waits of a training step are often under a
 *                           millisecond: neither should pay a nap's latency;
 *   DT_MPI_SPIN_S_PER_BYTE  8 ns/byte = 125 MB/s, below any network we run on,
 *                           so a transfer finishes inside its spin;
 *   naps                    bound the added latency once the late peer arrives
 *                           (<= 200 us) and the poll rate of a long wait (a few
 *                           thousand cheap polls a second: no core burned). */
#define DT_MPI_SPIN_S 1e-3
#define DT_MPI_YIELD_AFTER_S 20e-6
#define DT_MPI_SPIN_S_PER_BYTE 8e-9
#define DT_MPI_NAP_SHORT_NS 50000L
#define DT_MPI_NAP_LONG_NS 200000L
#define DT_MPI_NAP_LONG_AFTER_S 20e-3
/* The end-of-job agreement waits the job timeout plus this grace: after an
 * abort, ranks unwind only at their next collective, which may follow a stretch
 * of local compute; a tight test timeout (0.5 s) should not turn a slow unwind
 * into a second, misleading failure. A rank stuck for good still ends the wait. */
#define DT_MPI_AGREE_GRACE_S 10.0
/* Default collective timeout when the launcher passes none (timeout_s <= 0). */
#define DT_MPI_DEFAULT_TIMEOUT_S 300.0

/* An abort notice as sent on the control comm (MPI_BYTE: homogeneous nodes). */
typedef struct dt_mpi_notice {
  int32_t rank;              /* world rank that failed */
  int32_t status;            /* its dt_status */
  char msg[DT_ERRMSG_LEN];   /* its last error */
} dt_mpi_notice;

/* The payload of the end-of-job broadcast from the first failed rank. */
typedef struct dt_mpi_outcome {
  int32_t status;
  char msg[DT_ERRMSG_LEN];
} dt_mpi_outcome;

/* A buffered send still in flight (see mpi_send). */
typedef struct dt_mpi_pending {
  MPI_Request req;
  void *buf;                  /* malloc'd copy of the payload, or NULL */
  size_t bytes;
  int peer_world, tag;        /* for error messages */
} dt_mpi_pending;

/* Per-process state of one MPI job. Owned by the launcher (dt_mpi_job_open to
 * dt_mpi_job_close); every dt_comm of the
 * job points to it. */
typedef struct dt_mpi_job {
  int rank, size;             /* this process in MPI_COMM_WORLD */
  double timeout_s;
  int tag_ub;                 /* largest valid user tag */
  MPI_Comm ctrl;              /* abort notices and the end-of-job agreement */
  MPI_Request abort_req;      /* pre-posted receive of the first notice, or NULL */
  dt_mpi_notice inbox;        /* its buffer */
  bool aborted;               /* a notice arrived, or this rank sent one */
  bool originated;            /* this rank sent the notice */
  dt_mpi_notice abort;        /* the first failure this rank learnt of */
  dt_mpi_notice outbox;       /* the notice this rank sent (buffer of notice_reqs) */
  MPI_Request *notice_reqs;   /* size entries; MPI_REQUEST_NULL when none */
  bool abandoned;             /* a data-comm request was left pending */
  bool ctrl_busy;             /* a control-comm request was left pending */
  bool have_ops;
  MPI_Op bf16_op[DT_RED_COUNT];
  dt_mpi_pending *pend;       /* buffered sends not yet complete */
  size_t npend, cap_pend;
  /* Buffers of the end-of-job agreement: here, not on the stack, because a
   * timed-out agreement leaves its request (and the job) behind. */
  int agree_key, agree_least;
  dt_mpi_outcome agree_oc;
} dt_mpi_job;

/* impl of an MPI dt_comm. */
typedef struct dt_mpi_comm {
  MPI_Comm comm;
  dt_mpi_job *job;
} dt_mpi_comm;

static const dt_comm_ops mpi_ops;

/* ---- MPI error checking ---------------------------------------------------------
 * One check: an MPI return code becomes DT_OK or DT_ERR_BACKEND with MPI's own
 * text, recorded as "<op>: <MPI function>: <text>". Used through DT_CHECK and
 * DT_CHECK_GOTO: DT_CHECK(DT_MPI(ctx, "split", MPI_Comm_rank, comm, &r)). */
static dt_status mpi_status(dt_ctx *ctx, int rc, const char *op, const char *fn) {
  if (rc == MPI_SUCCESS) return DT_OK;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS || len <= 0)
    snprintf(text, sizeof text, "MPI error code %d", rc);
  return dt_error(ctx, DT_ERR_BACKEND, op, "%s: %s", fn, text);
}
#define DT_MPI(ctx, op, fn, ...) mpi_status((ctx), fn(__VA_ARGS__), (op), #fn)

/* ---- job: abort notices ------------------------------------------------------- */

/* Tests the pre-posted abort receive once. DT_OK: not aborted; DT_ERR_ABORTED:
 * the job is aborted (job->abort says by whom); DT_ERR_BACKEND: MPI failed. */
static dt_status job_poll(dt_mpi_job *job, dt_ctx *ctx) {
  if (job->aborted) return DT_ERR_ABORTED;
  if (job->abort_req == MPI_REQUEST_NULL) return DT_OK;
  int flag = 0;
  DT_CHECK(DT_MPI(ctx, "abort poll", MPI_Test, &job->abort_req, &flag, MPI_STATUS_IGNORE));
  if (!flag) return DT_OK;
  job->abort = job->inbox;
  job->abort.msg[DT_ERRMSG_LEN - 1] = '\0';
  job->aborted = true;
  return DT_ERR_ABORTED;
}

/* Marks the job failed by this rank and sends the notice (status s, message msg)
 * to every other rank, nonblocking. Once per job: a no-op when the job is already
 * aborted (the rank that aborted it has told everyone). The sends complete
 * locally in practice (a small eager message); job_close waits for them. */
static dt_status job_notify(dt_mpi_job *job, dt_ctx *ctx, dt_status s, const char *msg) {
  if (job->aborted) return DT_OK;
  memset(&job->outbox, 0, sizeof job->outbox);
  job->outbox.rank = job->rank;
  job->outbox.status = (int32_t)s;
  snprintf(job->outbox.msg, sizeof job->outbox.msg, "%s", msg && msg[0] ? msg : dt_status_str(s));
  job->abort = job->outbox;
  job->aborted = true;
  job->originated = true;
  dt_status first = DT_OK;
  for (int r = 0; r < job->size; r++) {
    if (r == job->rank) continue;
    int rc = MPI_Isend(&job->outbox, (int)sizeof job->outbox, MPI_BYTE, r, DT_MPI_TAG_ABORT,
                       job->ctrl, &job->notice_reqs[r]);
    /* Keep going: the other ranks still deserve their notice. Recorded without
     * overwriting the failure being reported (the notice carries a copy). */
    if (rc != MPI_SUCCESS && first == DT_OK) {
      first = DT_ERR_BACKEND;
      job->notice_reqs[r] = MPI_REQUEST_NULL;
    }
  }
  (void)ctx;
  return first;
}

/* ---- polling -------------------------------------------------------------------- */

/* Nonstop polling budget of a wait that moves `bytes` (see DT_MPI_SPIN_S). */
static double spin_budget(size_t bytes) {
  return DT_MPI_SPIN_S + (double)bytes * DT_MPI_SPIN_S_PER_BYTE;
}

/* One pause of a poll loop that has waited `waited` seconds with a nonstop
 * polling budget of `spin` seconds. */
static void poll_pause(double waited, double spin) {
  if (waited < spin) {
    /* The first microseconds poll flat out: a yield is a system call, slower
     * than the shared-memory latency it would wait for. */
    if (waited >= DT_MPI_YIELD_AFTER_S) sched_yield();
    return;
  }
  struct timespec ts = {0, waited < spin + DT_MPI_NAP_LONG_AFTER_S ? DT_MPI_NAP_SHORT_NS
                                                                   : DT_MPI_NAP_LONG_NS};
  nanosleep(&ts, NULL);
}

static dt_status comm_aborted(dt_comm *c, const char *op) {
  dt_mpi_job *job = ((dt_mpi_comm *)c->impl)->job;
  return dt_error(c->ctx, DT_ERR_ABORTED, op, "group '%s': job aborted by rank %d: %s", c->name,
                  (int)job->abort.rank, job->abort.msg);
}

/* Completes the buffered sends that are done, freeing their copies. An MPI error
 * fails the job (the receiver would otherwise wait for the message). */
static dt_status job_sweep(dt_mpi_job *job, dt_ctx *ctx) {
  for (size_t i = 0; i < job->npend;) {
    int done = 0;
    int rc = MPI_Test(&job->pend[i].req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      job->abandoned = true;
      dt_status s = mpi_status(ctx, rc, "send", "MPI_Test");
      job_notify(job, ctx, s, dt_last_error(ctx));
      return s;
    }
    if (!done) {
      i++;
      continue;
    }
    free(job->pend[i].buf);
    job->pend[i] = job->pend[--job->npend];
  }
  return DT_OK;
}

/* Every operation starts here: completed buffered sends are reaped, and an
 * aborted job gives DT_ERR_ABORTED (recorded) at once, without MPI traffic. */
static dt_status comm_enter(dt_comm *c, const char *op) {
  dt_mpi_job *job = ((dt_mpi_comm *)c->impl)->job;
  dt_status s = job_poll(job, c->ctx);
  if (s == DT_ERR_ABORTED) return comm_aborted(c, op);
  if (s == DT_OK && job->npend) s = job_sweep(job, c->ctx);
  return s;
}

/* An MPI call that issues an operation failed: record it and tell the others,
 * who would otherwise wait for this rank until their timeout. */
static dt_status comm_issued(dt_comm *c, int rc, const char *op, const char *fn) {
  if (rc == MPI_SUCCESS) return DT_OK;
  dt_mpi_job *job = ((dt_mpi_comm *)c->impl)->job;
  dt_status s = mpi_status(c->ctx, rc, op, fn);
  job_notify(job, c->ctx, s, dt_last_error(c->ctx));
  return s;
}
#define DT_MPI_ISSUE(c, op, fn, ...) comm_issued((c), fn(__VA_ARGS__), (op), #fn)

/* Completes *req, an operation on c issued by this rank, or gives up:
 *   DT_OK            the operation completed (*st filled when not IGNORE);
 *   DT_ERR_ABORTED   another rank's notice arrived (recorded);
 *   DT_ERR_TIMEOUT   nothing completed within the job timeout: this rank sends
 *                    the notice naming op and group, and records the same text;
 *   DT_ERR_BACKEND   MPI reported an error (the others are notified).
 * `bytes`: the data this rank's call moves, for the polling budget.
 * On any failure the request is abandoned, still pending (see the file comment). */
static dt_status comm_wait(dt_comm *c, MPI_Request *req, MPI_Status *st, size_t bytes,
                           const char *op) {
  dt_mpi_job *job = ((dt_mpi_comm *)c->impl)->job;
  double t0 = dt_now(), spin = spin_budget(bytes);
  for (;;) {
    int done = 0;
    int rc = MPI_Test(req, &done, st);
    if (rc != MPI_SUCCESS) {
      job->abandoned = true;
      return comm_issued(c, rc, op, "MPI_Test");
    }
    if (done) return DT_OK;
    dt_status s = job_poll(job, c->ctx);
    if (s != DT_OK) {
      job->abandoned = true;
      if (s == DT_ERR_ABORTED) return comm_aborted(c, op);
      job_notify(job, c->ctx, s, dt_last_error(c->ctx));
      return s;
    }
    double waited = dt_now() - t0;
    if (waited >= job->timeout_s) {
      job->abandoned = true;
      s = dt_error(c->ctx, DT_ERR_TIMEOUT, op, "group '%s' (%d ranks) waited %.3g s", c->name,
                   c->size, job->timeout_s);
      job_notify(job, c->ctx, s, dt_last_error(c->ctx));
      return s;
    }
    poll_pause(waited, spin);
  }
}

/* ---- argument mapping ------------------------------------------------------------ */

static MPI_Datatype mpi_type(dt_dtype t) {
  switch (t) {
    case DT_F32: return MPI_FLOAT;
    case DT_F64: return MPI_DOUBLE;
    case DT_BF16: return MPI_UINT16_T; /* moved as raw 16-bit words */
    case DT_I64: return MPI_INT64_T;   /* moved only: the front refuses to reduce it */
    default: return MPI_DATATYPE_NULL;
  }
}

static dt_status mpi_reduce_op(dt_comm *c, dt_dtype t, dt_reduce_op op, MPI_Op *out,
                               const char *opname) {
  if ((unsigned)op >= DT_RED_COUNT)
    return dt_error(c->ctx, DT_ERR_INVALID, opname, "invalid reduce op %d", (int)op);
  if (t == DT_BF16) {
    dt_mpi_job *job = ((dt_mpi_comm *)c->impl)->job;
    if (!job->have_ops)
      return dt_error(c->ctx, DT_ERR_INTERNAL, opname, "bf16 reduction ops were not created");
    *out = job->bf16_op[op];
    return DT_OK;
  }
  switch (op) {
    case DT_RED_SUM:
    case DT_RED_AVG: *out = MPI_SUM; break;
    case DT_RED_MAX: *out = MPI_MAX; break;
    case DT_RED_MIN: *out = MPI_MIN; break;
    case DT_RED_PROD: *out = MPI_PROD; break;
    default: return dt_error(c->ctx, DT_ERR_INVALID, opname, "invalid reduce op %d", (int)op);
  }
  return DT_OK;
}

/* MPI counts are int: `count` elements per rank, `total` elements in the largest
 * buffer of the call (e.g. count * size for all_gather's output). */
static dt_status check_counts(dt_comm *c, size_t count, size_t total, const char *op) {
  if (count > (size_t)INT_MAX || total > (size_t)INT_MAX)
    return dt_error(c->ctx, DT_ERR_UNSUPPORTED, op,
                    "%zu elements exceed MPI's int count limit (%d)", total, INT_MAX);
  return DT_OK;
}

static dt_status check_type(dt_comm *c, dt_dtype t, const char *op) {
  if (mpi_type(t) == MPI_DATATYPE_NULL)
    return dt_error(c->ctx, DT_ERR_INVALID, op, "invalid dtype %d", (int)t);
  return DT_OK;
}

/* bf16 user ops: inout[i] = in[i] (op) inout[i], through f32. */
#define DT_MPI_BF16_OP(NAME, OP)                                                   \
  static void NAME(void *in, void *inout, int *len, MPI_Datatype *dtype) {         \
    (void)dtype;                                                                   \
    dt_reduce_into(DT_BF16, OP, inout, in, (size_t)(*len > 0 ? *len : 0));         \
  }
DT_MPI_BF16_OP(bf16_sum, DT_RED_SUM)
DT_MPI_BF16_OP(bf16_max, DT_RED_MAX)
DT_MPI_BF16_OP(bf16_min, DT_RED_MIN)
DT_MPI_BF16_OP(bf16_prod, DT_RED_PROD)

/* ---- the backend slots ----------------------------------------------------------- */

/* A synchronising no-data step: zero counts still synchronise (comm.h), which
 * MPI does not promise for empty collectives; split uses it as an arrival proof. */
static dt_status comm_sync(dt_comm *c, const char *op) {
  dt_mpi_comm *m = c->impl;
  MPI_Request req = MPI_REQUEST_NULL;
  DT_CHECK(DT_MPI_ISSUE(c, op, MPI_Ibarrier, m->comm, &req));
  return comm_wait(c, &req, MPI_STATUS_IGNORE, 0, op);
}

static dt_status mpi_all_reduce(dt_comm *c, const void *send, void *recv, size_t count,
                                dt_dtype t, dt_reduce_op op) {
  const char *opn = "all_reduce";
  dt_mpi_comm *m = c->impl;
  MPI_Op mop = MPI_OP_NULL;
  DT_CHECK(check_type(c, t, opn));
  DT_CHECK(mpi_reduce_op(c, t, op, &mop, opn));
  DT_CHECK(check_counts(c, count, count, opn));
  DT_CHECK(comm_enter(c, opn));
  if (count == 0) return comm_sync(c, opn);
  MPI_Request req = MPI_REQUEST_NULL;
  DT_CHECK(DT_MPI_ISSUE(c, opn, MPI_Iallreduce, send == recv ? MPI_IN_PLACE : send, recv,
                        (int)count, mpi_type(t), mop, m->comm, &req));
  DT_CHECK(comm_wait(c, &req, MPI_STATUS_IGNORE, count * dt_dtype_size(t), opn));
  if (op == DT_RED_AVG) dt_div_inplace(t, recv, count, (double)c->size);
  return DT_OK;
}

static dt_status mpi_all_gather(dt_comm *c, const void *send, void *recv, size_t count,
                                dt_dtype t) {
  const char *opn = "all_gather";
  dt_mpi_comm *m = c->impl;
  DT_CHECK(check_type(c, t, opn));
  DT_CHECK(check_counts(c, count, count * (size_t)c->size, opn));
  DT_CHECK(comm_enter(c, opn));
  if (count == 0) return comm_sync(c, opn);
  /* In place when send is the caller's own slot of recv (comm.h). */
  const char *own = (const char *)recv + (size_t)c->rank * count * dt_dtype_size(t);
  const void *sp = (const char *)send == own ? MPI_IN_PLACE : send;
  MPI_Request req = MPI_REQUEST_NULL;
  DT_CHECK(DT_MPI_ISSUE(c, opn, MPI_Iallgather, sp, (int)count, mpi_type(t), recv, (int)count,
                        mpi_type(t), m->comm, &req));
  return comm_wait(c, &req, MPI_STATUS_IGNORE, count * (size_t)c->size * dt_dtype_size(t), opn);
}

static dt_status mpi_reduce_scatter(dt_comm *c, const void *send, void *recv, size_t count,
                                    dt_dtype t, dt_reduce_op op) {
  const char *opn = "reduce_scatter";
  dt_mpi_comm *m = c->impl;
  MPI_Op mop = MPI_OP_NULL;
  DT_CHECK(check_type(c, t, opn));
  DT_CHECK(mpi_reduce_op(c, t, op, &mop, opn));
  DT_CHECK(check_counts(c, count, count * (size_t)c->size, opn));
  DT_CHECK(comm_enter(c, opn));
  /* A group of one may alias (the front forbids it only for larger groups):
   * the result is the input, already in place. */
  if (count == 0 || (c->size == 1 && send == recv)) return comm_sync(c, opn);
  MPI_Request req = MPI_REQUEST_NULL;
  DT_CHECK(DT_MPI_ISSUE(c, opn, MPI_Ireduce_scatter_block, send, recv, (int)count, mpi_type(t),
                        mop, m->comm, &req));
  DT_CHECK(comm_wait(c, &req, MPI_STATUS_IGNORE, count * (size_t)c->size * dt_dtype_size(t), opn));
  if (op == DT_RED_AVG) dt_div_inplace(t, recv, count, (double)c->size);
  return DT_OK;
}

static dt_status mpi_all_to_all(dt_comm *c, const void *send, void *recv, size_t count,
                                dt_dtype t) {
  const char *opn = "all_to_all";
  dt_mpi_comm *m = c->impl;
  DT_CHECK(check_type(c, t, opn));
  DT_CHECK(check_counts(c, count, count * (size_t)c->size, opn));
  DT_CHECK(comm_enter(c, opn));
  if (count == 0 || (c->size == 1 && send == recv)) return comm_sync(c, opn); /* as above */
  MPI_Request req = MPI_REQUEST_NULL;
  DT_CHECK(DT_MPI_ISSUE(c, opn, MPI_Ialltoall, send, (int)count, mpi_type(t), recv, (int)count,
                        mpi_type(t), m->comm, &req));
  return comm_wait(c, &req, MPI_STATUS_IGNORE, count * (size_t)c->size * dt_dtype_size(t), opn);
}

static dt_status mpi_broadcast(dt_comm *c, void *buf, size_t count, dt_dtype t, int root) {
  const char *opn = "broadcast";
  dt_mpi_comm *m = c->impl;
  DT_CHECK(check_type(c, t, opn));
  DT_CHECK(check_counts(c, count, count, opn));
  DT_CHECK(comm_enter(c, opn));
  if (count == 0) return comm_sync(c, opn);
  MPI_Request req = MPI_REQUEST_NULL;
  DT_CHECK(DT_MPI_ISSUE(c, opn, MPI_Ibcast, buf, (int)count, mpi_type(t), root, m->comm, &req));
  return comm_wait(c, &req, MPI_STATUS_IGNORE, count * dt_dtype_size(t), opn);
}

static dt_status mpi_scatter(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t,
                             int root) {
  const char *opn = "scatter";
  dt_mpi_comm *m = c->impl;
  DT_CHECK(check_type(c, t, opn));
  DT_CHECK(check_counts(c, count, count * (size_t)c->size, opn));
  DT_CHECK(comm_enter(c, opn));
  if (count == 0) return comm_sync(c, opn);
  void *rp = recv;
  /* The root's own block already in place: MPI forbids aliasing, IN_PLACE says it. */
  if (c->rank == root && send &&
      (const char *)recv == (const char *)send + (size_t)root * count * dt_dtype_size(t))
    rp = MPI_IN_PLACE;
  MPI_Request req = MPI_REQUEST_NULL;
  DT_CHECK(DT_MPI_ISSUE(c, opn, MPI_Iscatter, send, (int)count, mpi_type(t), rp, (int)count,
                        mpi_type(t), root, m->comm, &req));
  return comm_wait(c, &req, MPI_STATUS_IGNORE, count * (size_t)c->size * dt_dtype_size(t), opn);
}

static dt_status check_tag(dt_comm *c, int tag, const char *op) {
  dt_mpi_job *job = ((dt_mpi_comm *)c->impl)->job;
  if (tag < 0 || tag > job->tag_ub)
    return dt_error(c->ctx, DT_ERR_INVALID, op, "tag %d outside 0..%d (MPI_TAG_UB)", tag,
                    job->tag_ub);
  return DT_OK;
}

/* Point to point is eager, as in the threads backend: send copies the payload,
 * starts an MPI_Isend from the copy and returns, so two ranks that send to each
 * other first cannot deadlock (a plain MPI send of more than the eager limit
 * would wait for the matching receive). Copies of sends still in flight are kept
 * in job->pend, reaped at the next operation, and awaited (with the job timeout)
 * when fn returns; a message nobody receives fails the job there. */
static dt_status mpi_send(dt_comm *c, const void *buf, size_t count, dt_dtype t, int peer,
                          int tag) {
  const char *opn = "send";
  dt_mpi_comm *m = c->impl;
  dt_mpi_job *job = m->job;
  DT_CHECK(check_type(c, t, opn));
  DT_CHECK(check_counts(c, count, count, opn));
  DT_CHECK(check_tag(c, tag, opn));
  DT_CHECK(comm_enter(c, opn));
  if (job->npend == job->cap_pend) {
    size_t cap = job->cap_pend ? 2 * job->cap_pend : 16;
    dt_mpi_pending *p = realloc(job->pend, cap * sizeof *p);
    if (!p) return dt_error(c->ctx, DT_ERR_NOMEM, opn, "no memory for %zu pending sends", cap);
    job->pend = p;
    job->cap_pend = cap;
  }
  size_t bytes = count * dt_dtype_size(t);
  void *copy = NULL;
  if (bytes) {
    copy = malloc(bytes);
    if (!copy) return dt_error(c->ctx, DT_ERR_NOMEM, opn, "cannot buffer %zu bytes", bytes);
    memcpy(copy, buf, bytes);
  }
  MPI_Request req = MPI_REQUEST_NULL;
  dt_status s = DT_MPI_ISSUE(c, opn, MPI_Isend, copy, (int)count, mpi_type(t), peer, tag,
                             m->comm, &req);
  if (s != DT_OK) {
    free(copy);
    return s;
  }
  /* Complete it here if the receiver is ready (small messages leave at once; a
   * large one needs this rank's polling to move): within the spin budget of its
   * bytes. Past that, the receiver is busy: leave the send in flight. */
  double t0 = dt_now(), spin = spin_budget(bytes);
  for (;;) {
    int done = 0;
    int rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      s = comm_issued(c, rc, opn, "MPI_Test");
      break;
    }
    if (done) {
      free(copy);
      return DT_OK;
    }
    s = job_poll(job, c->ctx);
    if (s != DT_OK) {
      if (s == DT_ERR_ABORTED) s = comm_aborted(c, opn);
      break;
    }
    double waited = dt_now() - t0;
    if (waited >= spin) break;
    poll_pause(waited, spin);
  }
  /* In flight (or failed in flight): MPI may still read the copy. */
  job->pend[job->npend++] = (dt_mpi_pending){req, copy, bytes, c->world_ranks[peer], tag};
  if (s != DT_OK) job->abandoned = true;
  return s;
}

/* Waits, when fn has returned, for this rank's buffered sends to be received:
 * within the job timeout, unless the job is aborted. */
static dt_status job_flush(dt_mpi_job *job, dt_ctx *ctx) {
  size_t bytes = 0;
  for (size_t i = 0; i < job->npend; i++) bytes += job->pend[i].bytes;
  double t0 = dt_now(), spin = spin_budget(bytes);
  for (;;) {
    DT_CHECK(job_sweep(job, ctx));
    if (job->npend == 0) return DT_OK;
    dt_status s = job_poll(job, ctx);
    if (s == DT_ERR_ABORTED)
      return dt_error(ctx, s, "send", "job aborted by rank %d before %zu message(s) were received: %s",
                      (int)job->abort.rank, job->npend, job->abort.msg);
    if (s != DT_OK) return s;
    double waited = dt_now() - t0;
    if (waited >= job->timeout_s) {
      s = dt_error(ctx, DT_ERR_TIMEOUT, "send",
                   "%zu message(s) not received within %.3g s after fn returned (first: to "
                   "world rank %d, tag %d)",
                   job->npend, job->timeout_s, job->pend[0].peer_world, job->pend[0].tag);
      job_notify(job, ctx, s, dt_last_error(ctx));
      return s;
    }
    poll_pause(waited, spin);
  }
}

static dt_status mpi_recv(dt_comm *c, void *buf, size_t count, dt_dtype t, int peer, int tag) {
  const char *opn = "recv";
  dt_mpi_comm *m = c->impl;
  DT_CHECK(check_type(c, t, opn));
  DT_CHECK(check_counts(c, count, count, opn));
  DT_CHECK(check_tag(c, tag, opn));
  DT_CHECK(comm_enter(c, opn));
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_Status st;
  DT_CHECK(DT_MPI_ISSUE(c, opn, MPI_Irecv, buf, (int)count, mpi_type(t), peer, tag, m->comm,
                        &req));
  DT_CHECK(comm_wait(c, &req, &st, count * dt_dtype_size(t), opn));
  /* A longer message is an MPI truncation error (above); a shorter one is a
   * mismatched send, which the threads backend also rejects. */
  int got = 0;
  DT_CHECK(DT_MPI(c->ctx, opn, MPI_Get_count, &st, mpi_type(t), &got));
  if (got != (int)count)
    return dt_error(c->ctx, DT_ERR_INVALID, opn,
                    "from %d tag %d: received %d elements, expected %zu", peer, tag, got, count);
  return DT_OK;
}

static dt_status mpi_barrier(dt_comm *c) {
  DT_CHECK(comm_enter(c, "barrier"));
  return comm_sync(c, "barrier");
}

/* World rank of each member of comm (MPI_COMM_WORLD ranks; the world dt_comm is
 * a dup of MPI_COMM_WORLD, so these are dt world ranks). *out is malloc'd. */
static dt_status world_ranks_of(dt_ctx *ctx, MPI_Comm comm, int n, int **out) {
  const char *opn = "split";
  *out = NULL;
  int *mine = malloc((size_t)n * sizeof(int));
  int *wr = malloc((size_t)n * sizeof(int));
  MPI_Group g = MPI_GROUP_NULL, wg = MPI_GROUP_NULL;
  dt_status s = DT_OK;
  if (!mine || !wr) {
    s = dt_error(ctx, DT_ERR_NOMEM, opn, "no memory for %d ranks", n);
    goto out;
  }
  for (int i = 0; i < n; i++) mine[i] = i;
  DT_CHECK_GOTO(DT_MPI(ctx, opn, MPI_Comm_group, comm, &g), s, out);
  DT_CHECK_GOTO(DT_MPI(ctx, opn, MPI_Comm_group, MPI_COMM_WORLD, &wg), s, out);
  DT_CHECK_GOTO(DT_MPI(ctx, opn, MPI_Group_translate_ranks, g, n, mine, wg, wr), s, out);
  *out = wr;
  wr = NULL;
out:
  if (g != MPI_GROUP_NULL) MPI_Group_free(&g);
  if (wg != MPI_GROUP_NULL) MPI_Group_free(&wg);
  free(mine);
  free(wr);
  return s;
}

/* Wraps an MPI communicator (taken over: freed on failure) as a dt_comm of job. */
static dt_status comm_wrap(dt_ctx *ctx, dt_mpi_job *job, MPI_Comm *comm, const char *name,
                           const char *opn, dt_comm **out) {
  *out = NULL;
  dt_status s = DT_OK;
  int rank = 0, size = 0;
  int *wr = NULL;
  dt_comm *c = NULL;
  dt_mpi_comm *m = NULL;
  DT_CHECK_GOTO(DT_MPI(ctx, opn, MPI_Comm_set_errhandler, *comm, MPI_ERRORS_RETURN), s, fail);
  DT_CHECK_GOTO(DT_MPI(ctx, opn, MPI_Comm_rank, *comm, &rank), s, fail);
  DT_CHECK_GOTO(DT_MPI(ctx, opn, MPI_Comm_size, *comm, &size), s, fail);
  DT_CHECK_GOTO(world_ranks_of(ctx, *comm, size, &wr), s, fail);
  c = calloc(1, sizeof *c);
  m = calloc(1, sizeof *m);
  if (!c || !m) {
    s = dt_error(ctx, DT_ERR_NOMEM, opn, "no memory for a communicator");
    goto fail;
  }
  DT_CHECK_GOTO(dt_comm_init_base(c, &mpi_ops, ctx, name, rank, size, wr), s, fail);
  m->comm = *comm;
  m->job = job;
  c->impl = m;
  *comm = MPI_COMM_NULL;
  free(wr);
  *out = c;
  return DT_OK;
fail:
  free(wr);
  free(c);
  free(m);
  if (*comm != MPI_COMM_NULL) MPI_Comm_free(comm);
  return s;
}

/* Collective over c (see dt_comm_ops.split). The new comm is named after the
 * parent until the front renames it. A polled barrier first proves that every
 * member arrived, so the blocking MPI_Comm_split cannot wait on a failed rank. */
static dt_status mpi_split(dt_comm *c, int color, int key, dt_comm **out) {
  const char *opn = "split";
  dt_mpi_comm *m = c->impl;
  *out = NULL;
  DT_CHECK(comm_enter(c, opn));
  DT_CHECK(comm_sync(c, opn));
  MPI_Comm nc = MPI_COMM_NULL;
  DT_CHECK(DT_MPI_ISSUE(c, opn, MPI_Comm_split, m->comm, color < 0 ? MPI_UNDEFINED : color, key,
                        &nc));
  if (nc == MPI_COMM_NULL) return DT_OK;
  return comm_wrap(c->ctx, m->job, &nc, c->name, opn, out);
}

/* Frees the comm. The MPI communicator of an aborted job is kept (leaked): an
 * abandoned request may still reference it, and freeing it under one is
 * undefined. Comms split from the world must be destroyed before fn returns. */
static void mpi_destroy(dt_comm *c) {
  if (!c) return;
  dt_mpi_comm *m = c->impl;
  if (m) {
    if (m->comm != MPI_COMM_NULL && !m->job->aborted && !m->job->abandoned)
      MPI_Comm_free(&m->comm);
    free(m);
  }
  dt_comm_free_base(c);
  free(c);
}

static const dt_comm_ops mpi_ops = {
    .name = "mpi",
    .all_reduce = mpi_all_reduce,
    .all_gather = mpi_all_gather,
    .reduce_scatter = mpi_reduce_scatter,
    .all_to_all = mpi_all_to_all,
    .broadcast = mpi_broadcast,
    .scatter = mpi_scatter,
    .send = mpi_send,
    .recv = mpi_recv,
    .barrier = mpi_barrier,
    .split = mpi_split,
    .destroy = mpi_destroy,
};

/* ---- job lifetime ----------------------------------------------------------------- */

/* Allocates the job state (local; no MPI). NULL, recorded, when out of memory. */
static dt_mpi_job *job_new(dt_ctx *ctx, int rank, int size, double timeout_s) {
  dt_mpi_job *job = calloc(1, sizeof *job);
  MPI_Request *reqs = malloc((size_t)size * sizeof(MPI_Request));
  if (!job || !reqs) {
    free(job);
    free(reqs);
    dt_error(ctx, DT_ERR_NOMEM, "dt_launch_mpi", "no memory for the job state");
    return NULL;
  }
  job->rank = rank;
  job->size = size;
  job->timeout_s = timeout_s;
  job->ctrl = MPI_COMM_NULL;
  job->abort_req = MPI_REQUEST_NULL;
  job->notice_reqs = reqs;
  for (int r = 0; r < size; r++) reqs[r] = MPI_REQUEST_NULL;
  for (int i = 0; i < DT_RED_COUNT; i++) job->bf16_op[i] = MPI_OP_NULL;
  return job;
}

/* Local setup once job->ctrl exists: error handler, tag bound, bf16 ops, and the
 * pre-posted abort receive. On failure the job can still send notices. */
static dt_status job_start(dt_mpi_job *job, dt_ctx *ctx) {
  const char *opn = "dt_launch_mpi";
  DT_CHECK(DT_MPI(ctx, opn, MPI_Comm_set_errhandler, job->ctrl, MPI_ERRORS_RETURN));
  int *ub = NULL, flag = 0;
  DT_CHECK(DT_MPI(ctx, opn, MPI_Comm_get_attr, MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag));
  job->tag_ub = flag && ub ? *ub : 32767; /* 32767: the standard's minimum */
  MPI_User_function *fns[DT_RED_COUNT] = {bf16_sum, bf16_sum, bf16_max, bf16_min, bf16_prod};
  for (int i = 0; i < DT_RED_COUNT; i++)
    DT_CHECK(DT_MPI(ctx, opn, MPI_Op_create, fns[i], 1, &job->bf16_op[i]));
  job->have_ops = true;
  return DT_MPI(ctx, opn, MPI_Irecv, &job->inbox, (int)sizeof job->inbox, MPI_BYTE,
                MPI_ANY_SOURCE, DT_MPI_TAG_ABORT, job->ctrl, &job->abort_req);
}

/* Polls a control-comm request to completion by `deadline` (no abort check:
 * notices are expected here). DT_ERR_TIMEOUT leaves it pending (ctrl_busy). */
static dt_status ctrl_wait(dt_mpi_job *job, dt_ctx *ctx, MPI_Request *req, double deadline,
                           const char *what) {
  double t0 = dt_now();
  for (;;) {
    int done = 0;
    int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      job->ctrl_busy = true;
      return mpi_status(ctx, rc, "dt_launch_mpi", what);
    }
    if (done) return DT_OK;
    double now = dt_now();
    if (now >= deadline) {
      job->ctrl_busy = true;
      return DT_ERR_TIMEOUT;
    }
    poll_pause(now - t0, spin_budget(0));
  }
}

/* Frees the job, or keeps (leaks) whatever an MPI request may still use: the
 * control comm and the job memory when a control request or a notice send is
 * still pending, the bf16 ops when a data request was abandoned. */
static void job_close(dt_mpi_job *job, dt_ctx *ctx) {
  if (!job) return;
  if (job->abort_req != MPI_REQUEST_NULL) {
    if (MPI_Cancel(&job->abort_req) != MPI_SUCCESS ||
        MPI_Wait(&job->abort_req, MPI_STATUS_IGNORE) != MPI_SUCCESS)
      job->ctrl_busy = true;
  }
  if (job->aborted && !job->ctrl_busy) {
    /* Drain surplus notices (several ranks may have failed at once) so the comm
     * is freed with an empty queue. Best effort: a few probes, no waiting. */
    for (int i = 0; i < 4 * job->size; i++) {
      int flag = 0;
      MPI_Status st;
      if (MPI_Iprobe(MPI_ANY_SOURCE, DT_MPI_TAG_ABORT, job->ctrl, &flag, &st) != MPI_SUCCESS ||
          !flag)
        break;
      dt_mpi_notice scratch;
      if (MPI_Recv(&scratch, (int)sizeof scratch, MPI_BYTE, st.MPI_SOURCE, DT_MPI_TAG_ABORT,
                   job->ctrl, MPI_STATUS_IGNORE) != MPI_SUCCESS)
        break;
    }
  }
  if (job->originated) {
    /* Every rank passed the agreement, so its notice was matched or buffered;
     * the sends are done, or done within the job timeout. */
    MPI_Request *reqs = job->notice_reqs;
    double deadline = dt_now() + job->timeout_s;
    double t0 = dt_now();
    for (;;) {
      int done = 0;
      if (MPI_Testall(job->size, reqs, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS) {
        job->ctrl_busy = true;
        break;
      }
      if (done) break;
      double now = dt_now();
      if (now >= deadline) {
        job->ctrl_busy = true;
        break;
      }
      poll_pause(now - t0, spin_budget(0));
    }
  }
  (void)ctx;
  if (job->npend) {
    /* Sends of a failed job that nobody may ever receive: MPI may still read
     * their copies, so the copies are leaked (the request handles need no
     * storage of ours), and so are the data comms (abandoned). */
    job->abandoned = true;
    job->npend = 0;
  }
  if (!job->abandoned)
    for (int i = 0; i < DT_RED_COUNT; i++)
      if (job->bf16_op[i] != MPI_OP_NULL) MPI_Op_free(&job->bf16_op[i]);
  if (job->ctrl_busy) return; /* leaked on purpose: see above */
  if (job->ctrl != MPI_COMM_NULL) MPI_Comm_free(&job->ctrl);
  free(job->notice_reqs);
  free(job->pend);
  free(job);
}

/* Node-local rank of this process (for the GPU ordinal). Collective over
 * MPI_COMM_WORLD. */
static dt_status local_rank(dt_ctx *ctx, int rank, int *out) {
  const char *opn = "dt_launch_mpi";
  MPI_Comm node = MPI_COMM_NULL;
  *out = 0;
  DT_CHECK(DT_MPI(ctx, opn, MPI_Comm_split_type, MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank,
                  MPI_INFO_NULL, &node));
  dt_status s = DT_MPI(ctx, opn, MPI_Comm_rank, node, out);
  MPI_Comm_free(&node);
  return s;
}

/* Agrees on the job's outcome over the control comm, whatever the data comms hold.
 * The first failed rank is the lowest rank that originated the failure (its fn
 * returned an error, or it timed out, or MPI failed there, and it sent the
 * notice); ranks that merely saw a notice (DT_ERR_ABORTED) do not count. When no
 * rank originated one (a fn returned an error without telling anyone, e.g. after
 * ignoring an abort), the lowest rank with an error stands in. Fills the failed_*
 * fields of out (may be NULL) and returns DT_OK when every rank succeeded, else the
 * first failure's status. If the agreement itself times out (a rank never
 * finished fn within timeout + grace), this rank reports what it knows. */
static dt_status job_agree(dt_mpi_job *job, dt_ctx *ctx, dt_status fn_st, dt_job_outcome *out) {
  const int n = job->size, me = job->rank;
  dt_mpi_outcome *oc = &job->agree_oc;
  job->agree_key = job->originated ? me : fn_st != DT_OK ? n + me : 2 * n;
  job->agree_least = job->agree_key;
  memset(oc, 0, sizeof *oc);
  double deadline = dt_now() + job->timeout_s + DT_MPI_AGREE_GRACE_S;
  MPI_Request req = MPI_REQUEST_NULL;
  int root = -1;
  dt_status s = DT_MPI(ctx, "dt_launch_mpi", MPI_Iallreduce, &job->agree_key, &job->agree_least,
                       1, MPI_INT, MPI_MIN, job->ctrl, &req);
  if (s == DT_OK) s = ctrl_wait(job, ctx, &req, deadline, "MPI_Iallreduce");
  if (s == DT_OK && job->agree_least < 2 * n) {
    root = job->agree_least < n ? job->agree_least : job->agree_least - n;
    if (root == me) {
      if (job->originated) {
        oc->status = job->abort.status;
        memcpy(oc->msg, job->abort.msg, sizeof oc->msg);
      } else {
        oc->status = (int32_t)fn_st;
        snprintf(oc->msg, sizeof oc->msg, "%s",
                 ctx->last_error[0] ? ctx->last_error : dt_status_str(fn_st));
      }
    }
    req = MPI_REQUEST_NULL;
    s = DT_MPI(ctx, "dt_launch_mpi", MPI_Ibcast, oc, (int)sizeof *oc, MPI_BYTE, root, job->ctrl,
               &req);
    if (s == DT_OK) s = ctrl_wait(job, ctx, &req, deadline, "MPI_Ibcast");
  }
  dt_status st = root >= 0 ? (dt_status)oc->status : DT_OK;
  char msg[DT_ERRMSG_LEN];
  snprintf(msg, sizeof msg, "%s", root >= 0 ? oc->msg : "");
  if (s == DT_OK && root < 0 && job->aborted) {
    /* "All succeeded", yet a notice came: the ranks that timed out in this
     * agreement (this rank was too late for them) contributed "ok" before they
     * gave up. Their notice is the truth. */
    s = DT_ERR_TIMEOUT;
  }
  if (s != DT_OK) {
    /* No agreement: tell the others (unless the job is already aborted) and
     * report the failure this rank knows of first. */
    if (s == DT_ERR_TIMEOUT && !job->aborted)
      dt_error(ctx, DT_ERR_TIMEOUT, "dt_launch_mpi",
               "the ranks did not all finish within %.3g s (job timeout + %.3g s grace)",
               job->timeout_s, DT_MPI_AGREE_GRACE_S);
    job_notify(job, ctx, DT_ERR_TIMEOUT, dt_last_error(ctx));
    root = job->abort.rank;
    st = (dt_status)job->abort.status;
    snprintf(msg, sizeof msg, "%s", job->abort.msg);
  }
  if (out) {
    out->failed_rank = root;
    out->failed_status = st;
    snprintf(out->failed_msg, sizeof out->failed_msg, "%s", msg);
  }
  return st;
}

/* ---- the job, for the launcher (comm_job.h) -------------------------------------- */

dt_status dt_mpi_job_open(dt_ctx *ctx, dt_status st, double timeout_s, dt_mpi_job **jobp,
                          dt_comm **world, int *node_rank) {
  const char *opn = "dt_launch_mpi";
  *jobp = NULL;
  *world = NULL;
  if (timeout_s <= 0) timeout_s = DT_MPI_DEFAULT_TIMEOUT_S;
  /* Local allocations first; a failure is acted on after the collectives. */
  dt_mpi_job *job = job_new(ctx, ctx->rank, ctx->world_size, timeout_s);
  if (!job && st == DT_OK) st = DT_ERR_NOMEM;

  /* The blocking collectives, each attempted on every rank. */
  MPI_Comm ctrl = MPI_COMM_NULL, data = MPI_COMM_NULL;
  dt_status sc = DT_MPI(ctx, opn, MPI_Comm_dup, MPI_COMM_WORLD, &ctrl);
  dt_status sd = DT_MPI(ctx, opn, MPI_Comm_dup, MPI_COMM_WORLD, &data);
  dt_status sn = node_rank ? local_rank(ctx, ctx->rank, node_rank) : DT_OK;
  if (st == DT_OK) st = sc != DT_OK ? sc : sd != DT_OK ? sd : sn;

  if (!job || ctrl == MPI_COMM_NULL) {
    /* Nobody can be told: the others end by their timeout, not in a hang. */
    if (ctrl != MPI_COMM_NULL) MPI_Comm_free(&ctrl);
    if (data != MPI_COMM_NULL) MPI_Comm_free(&data);
    if (job) {
      free(job->notice_reqs);
      free(job);
    }
    return st;
  }
  job->ctrl = ctrl;
  if (st == DT_OK) st = job_start(job, ctx);
  if (st == DT_OK) st = comm_wrap(ctx, job, &data, "world", opn, world);
  if (data != MPI_COMM_NULL) MPI_Comm_free(&data); /* not taken over */
  *jobp = job;
  return st;
}

dt_status dt_mpi_job_done(dt_mpi_job *job, dt_ctx *ctx, dt_status fn_st) {
  /* fn's sends still in flight must reach their receivers before it counts as done. */
  if (fn_st == DT_OK && job->npend) fn_st = job_flush(job, ctx);
  if (fn_st != DT_OK)
    job_notify(job, ctx, fn_st, ctx->last_error[0] ? ctx->last_error : dt_status_str(fn_st));
  return fn_st;
}

dt_status dt_mpi_job_agree(dt_mpi_job *job, dt_ctx *ctx, dt_status rank_st, dt_job_outcome *out) {
  return job_agree(job, ctx, rank_st, out);
}

void dt_mpi_job_close(dt_mpi_job *job, dt_ctx *ctx) { job_close(job, ctx); }

#endif /* HAVE_MPI */
