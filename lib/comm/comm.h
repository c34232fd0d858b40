/* lib/comm/comm.h: the one front for every collective, and the comm-backend vtable.
 *
 * Every collective of the runtime goes through the dt_comm_* functions below,
 * which time the call and append one row to the calling rank's ledger (op, group,
 * group size, elements, dtype, payload bytes, wire bytes by the ring model,
 * seconds, phase, scope). Backends (threads, mpi) fill a dt_comm_ops table and
 * never write the ledger themselves. This layer knows nothing of devices, meshes
 * or placements, and does not start ranks (lib/launch does).
 *
 * Counts: all_gather, reduce_scatter and scatter take the count held by ONE rank
 * (the output of all_gather and the input of reduce_scatter are count * size);
 * all_to_all takes the count sent to each peer. Buffers are on the device the
 * backend works with (host memory for threads and mpi).
 */
#ifndef DT_COMM_H
#define DT_COMM_H

#include "../core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dt_reduce_op {
  DT_RED_SUM = 0, DT_RED_AVG = 1, DT_RED_MAX = 2, DT_RED_MIN = 3, DT_RED_PROD = 4,
  DT_RED_COUNT
} dt_reduce_op;

typedef enum dt_coll {
  DT_COLL_ALL_REDUCE = 0,
  DT_COLL_ALL_GATHER,
  DT_COLL_REDUCE_SCATTER,
  DT_COLL_ALL_TO_ALL,
  DT_COLL_BROADCAST,
  DT_COLL_SCATTER,
  DT_COLL_SEND,
  DT_COLL_RECV,
  DT_COLL_BARRIER,
  DT_COLL_COUNT
} dt_coll;

const char *dt_coll_name(dt_coll c);           /* "all_reduce", ... */
dt_status dt_coll_parse(const char *s, dt_coll *out);
const char *dt_reduce_name(dt_reduce_op r);    /* "sum", "avg", ... */
dt_status dt_reduce_parse(const char *s, dt_reduce_op *out);

/* nccl-tests bus factor of a collective over n ranks (all_reduce 2(n-1)/n;
 * all_gather, reduce_scatter, all_to_all, scatter (n-1)/n; broadcast, send 1;
 * recv and barrier 0: a point-to-point transfer is counted once, on the
 * sender's side). A group of one moves nothing: 0. */
double dt_coll_bus_factor(dt_coll c, int n);
/* Elements in the nccl-tests array size S of a call with the given count. */
uint64_t dt_coll_elems(dt_coll c, uint64_t count, int n);

/* Most ranks of a threads job (one process, a thread per rank). */
enum { DT_THREADS_MAX_WORLD = 1024 };

/* ---- the ledger: every collective the rank issued -------------------------- */

/* One collective call as the comm front saw it. */
typedef struct dt_ledger_row {
  int op;                    /* dt_coll */
  int reduce;                /* dt_reduce_op, or -1 */
  char group[DT_LABEL_LEN];  /* communicator name, e.g. "tp" or "world" */
  int group_size;
  uint64_t elems;            /* elements in S (the nccl-tests array size) */
  int dtype;                 /* dt_dtype */
  uint64_t payload_bytes;    /* S in bytes */
  double wire_bytes;         /* bytes each rank moves by the ring model */
  double seconds;            /* wall time of the call on this rank */
  char phase[16];            /* ctx->phase at the call: "forward", "backward", "" ... */
  char scope[DT_LABEL_LEN];  /* ctx->scope at the call: module fqn or other caller label */
} dt_ledger_row;

typedef struct dt_ledger {
  dt_ledger_row *rows;       /* rows[0..n), oldest first */
  size_t n, cap;
  bool enabled;              /* false: calls are not recorded */
} dt_ledger;

/* The calling rank's ledger (read only; never NULL). Before the rank has one
 * it is an empty ledger that reads enabled: recording is on by default. */
const dt_ledger *dt_ledger_of(const dt_ctx *ctx);
/* Gives the rank its ledger (kept on ctx until dt_ctx_release), recording or
 * not; on a rank that has one, only sets `enabled`. The launchers call it for
 * every rank they start. DT_ERR_NOMEM (recorded) when out of memory. */
dt_status dt_ledger_init(dt_ctx *ctx, bool enabled);
/* Drops the rows (keeps the memory and the enabled flag). */
void dt_ledger_clear(dt_ctx *ctx);
/* Turns recording on or off (dt_ledger_init; an allocation failure is
 * recorded on ctx and leaves recording as it was). */
void dt_ledger_enable(dt_ctx *ctx, bool on);
/* Appends a row (used by the front; exposed for tests of reporters). */
dt_status dt_ledger_append(dt_ctx *ctx, const dt_ledger_row *row);

/* ---- backends and the front ---------------------------------------------- */

typedef struct dt_comm_ops {
  const char *name;  /* "threads", "mpi" */
  dt_status (*all_reduce)(dt_comm *c, const void *send, void *recv, size_t count,
                          dt_dtype t, dt_reduce_op op);
  dt_status (*all_gather)(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t);
  dt_status (*reduce_scatter)(dt_comm *c, const void *send, void *recv, size_t count,
                              dt_dtype t, dt_reduce_op op);
  dt_status (*all_to_all)(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t);
  dt_status (*broadcast)(dt_comm *c, void *buf, size_t count, dt_dtype t, int root);
  dt_status (*scatter)(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t,
                       int root);
  dt_status (*send)(dt_comm *c, const void *buf, size_t count, dt_dtype t, int peer, int tag);
  dt_status (*recv)(dt_comm *c, void *buf, size_t count, dt_dtype t, int peer, int tag);
  dt_status (*barrier)(dt_comm *c);
  /* Collective over c: ranks with equal color form a new communicator, ordered
   * by (key, rank in c). color < 0: the caller joins none and *out = NULL. */
  dt_status (*split)(dt_comm *c, int color, int key, dt_comm **out);
  void (*destroy)(dt_comm *c);
} dt_comm_ops;

struct dt_comm {
  const dt_comm_ops *ops;
  dt_ctx *ctx;                 /* the owning rank */
  char name[DT_LABEL_LEN];     /* group label written to the ledger */
  int rank, size;              /* rank within this communicator, and its size */
  int *world_ranks;            /* world rank of each member, size entries */
  void *impl;
};

/* The front. Each validates arguments, calls the backend, and records a ledger row.
 * In-place is allowed where send == recv (all_reduce; all_gather when send is the
 * caller's own slot recv + rank*count; reduce_scatter is not in-place). Zero
 * counts are valid and still synchronise. On DT_ERR_ABORTED / DT_ERR_TIMEOUT the
 * buffers' contents are unspecified (mpi: a late peer may still write a receive
 * buffer until the process ends, which must then end with dt_mpi_finish(false)).
 *
 * send is eager on every backend: it returns once the payload is copied, so the
 * buffer may be reused at once and two ranks may send to each other before
 * either receives. recv takes the oldest message from `peer` with `tag`. */
dt_status dt_comm_all_reduce(dt_comm *c, const void *send, void *recv, size_t count,
                             dt_dtype t, dt_reduce_op op);
dt_status dt_comm_all_gather(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t);
dt_status dt_comm_reduce_scatter(dt_comm *c, const void *send, void *recv, size_t count,
                                 dt_dtype t, dt_reduce_op op);
dt_status dt_comm_all_to_all(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t);
dt_status dt_comm_broadcast(dt_comm *c, void *buf, size_t count, dt_dtype t, int root);
dt_status dt_comm_scatter(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t,
                          int root);
dt_status dt_comm_send(dt_comm *c, const void *buf, size_t count, dt_dtype t, int peer, int tag);
dt_status dt_comm_recv(dt_comm *c, void *buf, size_t count, dt_dtype t, int peer, int tag);
dt_status dt_comm_barrier(dt_comm *c);
/* Split (see dt_comm_ops.split); the new communicator is named `name`. */
dt_status dt_comm_split(dt_comm *c, int color, int key, const char *name, dt_comm **out);
void dt_comm_destroy(dt_comm *c);

/* Helpers for backends: element-wise reduce `in` into `acc` (n elements; the
 * two must not overlap). */
void dt_reduce_into(dt_dtype t, dt_reduce_op op, void *restrict acc, const void *restrict in,
                    size_t n);
/* acc /= divisor element-wise (DT_RED_AVG finalisation: divide by the group size). */
void dt_div_inplace(dt_dtype t, void *acc, size_t n, double divisor);

#ifdef __cplusplus
}
#endif
#endif
