/* lib/comm/comm_impl.h: internal interface between the comm front, its backends
 * (comm_threads.c, comm_mpi.c) and the launcher. Not installed, not public. */
#ifndef DT_COMM_IMPL_H
#define DT_COMM_IMPL_H

#include "comm/comm.h"
#include "comm/launch.h"

/* ---- threads backend ---- */
typedef struct dt_threads_job dt_threads_job;

/* Shared state of one threads job: `world` ranks, collective timeout in seconds. */
dt_status dt_threads_job_create(int world, double timeout_s, dt_threads_job **out);
void dt_threads_job_destroy(dt_threads_job *job);
/* The world communicator of rank ctx->rank (called by that rank's thread). */
dt_status dt_threads_comm_world(dt_threads_job *job, dt_ctx *ctx, dt_comm **out);
/* Marks the job failed by `rank` (the first caller wins) and wakes every waiter,
 * so pending and later collectives return DT_ERR_ABORTED. */
void dt_threads_job_fail(dt_threads_job *job, int rank, dt_status s, const char *msg);
/* True when the job failed; copies the first failure out. */
bool dt_threads_job_failed(dt_threads_job *job, int *rank, dt_status *s, char *msg, size_t n);

/* ---- mpi backend (comm_mpi.c; stubs return DT_ERR_UNSUPPORTED without MPI) ---- */
/* Common helper: fill the comm's name and world_ranks (malloc'd). */
dt_status dt_comm_init_base(dt_comm *c, const dt_comm_ops *ops, dt_ctx *ctx, const char *name,
                            int rank, int size, const int *world_ranks);
void dt_comm_free_base(dt_comm *c);

#endif
