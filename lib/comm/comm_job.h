/* lib/comm/comm_job.h: what the comm backends give the launchers (lib/launch):
 * the shared state of one job and its world communicator. Private: included by
 * lib/comm and lib/launch only, not installed. A launcher creates ranks, their
 * contexts and devices; the backend owns everything that moves data or carries a
 * failure from one rank to another.
 */
#ifndef DT_COMM_JOB_H
#define DT_COMM_JOB_H

#include "../comm/comm.h"

/* ---- threads backend (comm_threads.c) -------------------------------------- */

typedef struct dt_threads_job dt_threads_job;

/* Shared state of one threads job: `world` ranks (1..DT_THREADS_MAX_WORLD),
 * collective timeout in seconds (<= 0: 300). */
dt_status dt_threads_job_create(int world, double timeout_s, dt_threads_job **out);
void dt_threads_job_destroy(dt_threads_job *job);
/* The world communicator of rank ctx->rank (called by that rank's thread). */
dt_status dt_threads_comm_world(dt_threads_job *job, dt_ctx *ctx, dt_comm **out);
/* Marks the job failed by `rank` (the first caller wins) and wakes every waiter,
 * so pending and later collectives return DT_ERR_ABORTED. */
void dt_threads_job_fail(dt_threads_job *job, int rank, dt_status s, const char *msg);
/* True when the job failed; copies the first failure out. */
bool dt_threads_job_failed(dt_threads_job *job, int *rank, dt_status *s, char *msg, size_t n);

/* ---- fake backend (comm_fake.c) -------------------------------------------- */

/* The world communicator of a rank that runs alone as rank `rank` of `world`
 * ranks: every call completes at once (comm_fake.c). */
dt_status dt_fake_comm_world(dt_ctx *ctx, int rank, int world, dt_comm **out);

/* ---- mpi backend (comm_mpi.c; built with HAVE_MPI only) -------------------- */

typedef struct dt_mpi_job dt_mpi_job;

/* How a job ended, as every rank agrees (dt_mpi_job_agree). */
typedef struct dt_job_outcome {
  int failed_rank;                /* the first rank that failed, -1 when none */
  dt_status failed_status;
  char failed_msg[DT_ERRMSG_LEN]; /* that rank's last error */
} dt_job_outcome;

/* This process's part of an MPI job; MPI must be initialised. Collective over
 * MPI_COMM_WORLD: every process calls it, whatever failed before on its side
 * (`st`, this rank's status so far), so no rank is left waiting in the setup
 * collectives (dups of MPI_COMM_WORLD for control and data and, when node_rank
 * is given, the node split that gives this process's rank within its node).
 * On return:
 *   *job == NULL: nobody can be told of a failure (no memory for the job, or no
 *     control communicator); the returned status is that failure, recorded on
 *     ctx, and the other ranks will end by their timeout;
 *   *job != NULL: DT_OK with *world the world communicator (*node_rank set),
 *     or this rank's failure, to be passed on to dt_mpi_job_done.
 * timeout_s: a collective waiting longer fails the job (<= 0: 300 s). */
dt_status dt_mpi_job_open(dt_ctx *ctx, dt_status st, double timeout_s, dt_mpi_job **job,
                          dt_comm **world, int *node_rank);
/* After fn: waits (within the job timeout) until the rank's buffered sends
 * are received, and when the rank failed (fn_st, or that wait) tells every
 * other rank. Returns the rank's final status. */
dt_status dt_mpi_job_done(dt_mpi_job *job, dt_ctx *ctx, dt_status fn_st);
/* Collective over the job's control communicator, whatever the data
 * communicators hold: agrees on the job's outcome (the lowest rank that raised a
 * failure, its status and message) given this rank's final status. Returns
 * DT_OK when every rank succeeded, else the first failure's status. */
dt_status dt_mpi_job_agree(dt_mpi_job *job, dt_ctx *ctx, dt_status rank_st, dt_job_outcome *out);
/* Frees the job, or keeps what an MPI request may still use (see comm_mpi.c).
 * The world communicator must be destroyed first. */
void dt_mpi_job_close(dt_mpi_job *job, dt_ctx *ctx);

#endif
