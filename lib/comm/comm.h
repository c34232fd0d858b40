/* lib/comm/comm.h: the one front for every collective, and the comm-backend vtable.
 *
 * Every collective of the runtime goes through the dt_comm_* functions below,
 * which time the call and append one row to the calling rank's ledger (op, group,
 * group size, elements, dtype, payload bytes, wire bytes by the ring model,
 * seconds, phase, scope). Backends (threads, mpi, nccl, fake) fill a dt_comm_ops table and
 * never write the ledger themselves. This layer knows nothing of devices, meshes
 * or placements, and does not start ranks (lib/launch does).
 *
 * Counts: all_gather, reduce_scatter and scatter take the count held by ONE rank
 * (the output of all_gather and the input of reduce_scatter are count * size);
 * all_to_all takes the count sent to each peer.
 *
 * Buffers are host memory, or, on a rank whose compute device is not the CPU,
 * that device's memory: the launcher installs a dt_comm_mem hook (below) on the
 * world communicator, and every communicator split from it inherits it. The
 * buffers of one call are all host or all device memory, on every member.
 * A backend that works on device buffers (ops.device_buffers: threads, through
 * the hook) gets them as they are; for any other (mpi, which is not assumed
 * CUDA-aware) the front stages them through host memory (D2H, the call, H2D).
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
  /* Bytes of device buffers the comm layer copied through host memory while
   * recording (each device-to-host and host-to-device copy counted on the rank
   * that made it): the front's staging for a backend without device buffers
   * (mpi), and the threads backend's point to point where it has no device
   * scratch (or its test switch p2p_via_host is on). 0 where every transfer
   * stays on the device. */
  uint64_t staged_bytes;
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
/* Adds to staged_bytes while recording (for the front and the backends). */
void dt_ledger_add_staged(dt_ctx *ctx, uint64_t bytes);

/* ---- backends and the front ---------------------------------------------- */

/* ---- device memory, seen from the comm layer ------------------------------- */

typedef enum dt_comm_copy_kind {
  DT_COMM_H2D = 1, DT_COMM_D2H = 2, DT_COMM_D2D = 3 /* the values of dt_copy_kind */
} dt_comm_copy_kind;

/* The rank's device as the collectives need it, installed by the launcher
 * (this layer does not include lib/device). All slots take `dev` first. */
typedef struct dt_comm_mem {
  void *dev;  /* NULL: no hook, every buffer is host memory */
  /* true when p is memory of this device */
  bool (*is_device)(void *dev, const void *p);
  /* byte copy; the device-side pointers may belong to another rank's device
   * handle of the same memory (threads: every rank's device shares GPU 0) */
  dt_status (*copy)(void *dev, void *dst, const void *src, size_t bytes, dt_comm_copy_kind k);
  /* out = in[0] op in[1] op ... op in[nin-1] element-wise, left to right (bf16
   * accumulated in f32); avg divides the sum by `divisor` */
  dt_status (*reduce)(void *dev, dt_dtype t, dt_reduce_op op, size_t n, int nin,
                      const void *const *in, void *out, double divisor);
  /* waits until the work queued on the device is done */
  dt_status (*sync)(void *dev);
  /* Comm scratch in device memory, outside the rank's memory counters: the
   * threads backend's eager messages of device buffers, allocated by the
   * sender and freed by the receiver (any rank's handle of the same memory
   * frees what another's allocated: threads ranks share one GPU). NULL: point
   * to point stages through host memory. */
  dt_status (*scratch_alloc)(void *dev, size_t bytes, void **out);
  void (*scratch_free)(void *dev, void *p, size_t bytes);
  /* TEST SWITCH: point to point stages through host memory even with
   * scratch_alloc (the path before device-to-device messages), so a test sees
   * dt_ledger.staged_bytes count it. Never set in normal use. */
  bool p2p_via_host;
} dt_comm_mem;

typedef struct dt_comm_ops {
  const char *name;  /* "threads", "mpi" */
  bool device_buffers; /* the slots take device buffers (else the front stages them) */
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
  /* Optional: the new communicator of the caller's group, given by its members
   * (ranks in c, in new-rank order; the caller among them). Local, no comm: for
   * a backend whose other ranks do not run (fake). NULL: split is used. */
  dt_status (*split_group)(dt_comm *c, int n, const int *members, dt_comm **out);
  void (*destroy)(dt_comm *c);
} dt_comm_ops;

struct dt_comm {
  const dt_comm_ops *ops;
  dt_ctx *ctx;                 /* the owning rank */
  char name[DT_LABEL_LEN];     /* group label written to the ledger */
  int rank, size;              /* rank within this communicator, and its size */
  int *world_ranks;            /* world rank of each member, size entries */
  dt_comm_mem mem;             /* the rank's device memory hook (mem.dev NULL: none) */
  void *impl;
};

/* Installs the device hook on c (copied; NULL removes it). Communicators split
 * from c afterwards inherit it. The launcher calls it on the world communicator
 * of a rank whose device is not the CPU. */
void dt_comm_set_mem(dt_comm *c, const dt_comm_mem *m);
/* True when c has a hook and p is device memory. */
bool dt_comm_is_device(const dt_comm *c, const void *p);

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
/* The split whose outcome the caller knows: color and key as for dt_comm_split,
 * and members[0..n), the ranks in c of the caller's new group in new-rank
 * order (the ranks with the caller's color, ordered by key). A backend with a
 * split_group slot (fake) makes the communicator from the members alone;
 * every other one runs dt_comm_split (collective), and a result that differs
 * from the members is DT_ERR_INTERNAL. Meshes split this way so that one rank
 * of a fake world can build its sub-communicators alone. */
dt_status dt_comm_split_group(dt_comm *c, int color, int key, int n, const int *members,
                              const char *name, dt_comm **out);
void dt_comm_destroy(dt_comm *c);
/* True when c's other members do not run (the fake backend: its calls complete
 * alone and receive no data), so a caller that would learn something from a
 * peer (a shape) must know it itself. */
bool dt_comm_runs_alone(const dt_comm *c);

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
