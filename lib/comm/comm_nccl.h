/* lib/comm/comm_nccl.h: the NCCL comm backend ("nccl"): collectives between
 * GPUs, one rank per GPU, on device buffers, behind the same front (comm.h) and
 * ledger as the threads and mpi backends.
 *
 * Streams. Each NCCL communicator has its own communication stream. A call
 * records an event on the rank's compute stream (the stream of the rank's CUDA
 * device, handed over by the launcher), makes the comm stream wait on it (so the
 * collective reads what earlier kernels wrote), runs the NCCL operation on the
 * comm stream and records a "done" event there. What happens next depends on
 * the comm's mode (dt_comm_nccl_set_mode):
 *   DT_NCCL_BLOCKING (default)  the host waits for the done event, polling for
 *                               errors, peers' failures and the job timeout
 *                               (no call can hang); then the compute stream
 *                               waits on it. Ledger seconds: issue to completion,
 *                               which includes the compute work queued before it.
 *   DT_NCCL_STREAM              the compute stream waits on the done event and
 *                               the call returns at once: later kernels are
 *                               ordered after the collective with no host sync.
 *                               Ledger seconds: the time to queue it.
 *   DT_NCCL_DEFERRED            like STREAM, but the compute stream does not wait
 *                               until dt_comm_nccl_wait(c, ticket): kernels
 *                               queued in between overlap the collective (FSDP's
 *                               all-gather prefetch, ring attention's exchange).
 *                               Ledger seconds: the time to queue it.
 * The asynchronous modes: dt_comm_nccl_ticket after a call is its handle;
 * dt_comm_nccl_wait orders the compute stream after it (device side), and
 * dt_comm_nccl_sync waits on the host, with the timeout, for everything queued
 * on the comm (do that, or any blocking call on it, before a device sync: a
 * device sync behind a collective whose peer never came would wait forever).
 * A call with a host buffer (the harness gathers timings through host memory)
 * is staged through a device scratch and always blocks; cudaPointerGetAttributes
 * tells host from device memory.
 *
 * Point to point. NCCL matches sends and receives between two ranks in issue
 * order and has no tags. send keeps the front's eager promise (it returns once
 * the payload is copied, and two ranks may send to each other first) by copying
 * the payload into a stream-ordered device allocation and queueing the send; the
 * queue is issued together with the next recv on the comm in one
 * ncclGroupStart/End group (or at the next collective, wait, sync or destroy).
 * Send and recv run on a second NCCL communicator split from the first with
 * its own stream, so a queued send never sits behind a collective (PyTorch's
 * ProcessGroupNCCL likewise keeps point-to-point traffic off the collective
 * communicator). Tags are not matched: messages from one peer are received in
 * the order they were sent, whatever their tags, and a recv must name the
 * count that was sent (NCCL does not check it).
 *
 * Failure. Communicators are non-blocking (ncclConfig_t.blocking = 0): every
 * NCCL call that answers ncclInProgress is polled with ncclCommGetAsyncError
 * within the job timeout, as is every wait. A wait that passes the timeout, an
 * asynchronous NCCL error, or a failure reported by the launcher's hook (another
 * rank of a threads job failed) aborts the rank's communicators
 * (ncclCommAbort) and returns DT_ERR_TIMEOUT / DT_ERR_BACKEND / DT_ERR_ABORTED;
 * every later call on them returns DT_ERR_ABORTED. Under MPI a peer's failure
 * reaches this rank through NCCL's own errors or the timeout.
 *
 * Reductions: sum, avg (ncclAvg), max, min, prod on f32/f64/bf16 (NCCL reduces
 * bf16 pairwise in its own order: not bitwise equal to the threads backend).
 * Data: f32, f64, bf16, i64. Without HAVE_NCCL every function returns
 * DT_ERR_UNSUPPORTED. Nothing here prints, exits or keeps global state.
 */
#ifndef DT_COMM_NCCL_H
#define DT_COMM_NCCL_H

#include "../comm/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* True when this libdtensor was built with NCCL. */
bool dt_comm_nccl_built(void);
/* True when c is an NCCL communicator. */
bool dt_comm_is_nccl(const dt_comm *c);

typedef enum dt_nccl_mode {
  DT_NCCL_BLOCKING = 0, DT_NCCL_STREAM = 1, DT_NCCL_DEFERRED = 2
} dt_nccl_mode;

/* Sets c's mode (see above); new communicators start BLOCKING, splits inherit. */
dt_status dt_comm_nccl_set_mode(dt_comm *c, dt_nccl_mode mode);
/* The handle of the last operation queued on c (0: none yet). */
uint64_t dt_comm_nccl_ticket(const dt_comm *c);
/* Orders the rank's compute stream after operation `ticket` of c and every
 * operation before it (device side; no host wait). Issues queued sends.
 * Reports an asynchronous NCCL error already known, without waiting. */
dt_status dt_comm_nccl_wait(dt_comm *c, uint64_t ticket);
/* Waits on the host, within the job timeout, until every operation queued on c
 * is complete (queued sends are issued first). */
dt_status dt_comm_nccl_sync(dt_comm *c);

/* ---- for the launchers (lib/launch) ------------------------------------------ */

/* How a launcher tells the ranks' communicators about the rest of the job.
 * Both may be NULL. failed: true when another rank failed (fills rank and
 * msg); fail: this rank failed (timeout, NCCL error) and the others should know. */
typedef struct dt_nccl_hooks {
  void *arg;
  bool (*failed)(void *arg, int *rank, char *msg, size_t n);
  void (*fail)(void *arg, int rank, dt_status s, const char *msg);
} dt_nccl_hooks;

/* The job's NCCL identifier: made once (ncclGetUniqueId) by one process and
 * handed to every rank (threads: shared memory; mpi: a broadcast). */
typedef struct dt_nccl_id {
  unsigned char bytes[128]; /* NCCL_UNIQUE_ID_BYTES */
} dt_nccl_id;
dt_status dt_nccl_id_make(dt_ctx *ctx, dt_nccl_id *out);

/* Creates rank ctx->rank's world communicator of ctx->world_size ranks
 * (ncclCommInitRankConfig, non-blocking, polled within timeout_s; <= 0: 300 s)
 * on GPU `ordinal`, whose compute stream (a cudaStream_t) is `compute_stream`.
 * Collective: every rank of the job calls it with the same id. */
dt_status dt_nccl_comm_world(dt_ctx *ctx, const dt_nccl_id *id, int ordinal,
                             void *compute_stream, double timeout_s,
                             const dt_nccl_hooks *hooks, dt_comm **out);

#ifdef __cplusplus
}
#endif
#endif
