/* lib/comm/comm_impl.h: internal interface between the comm front (comm.c) and
 * its backends (comm_threads.c, comm_mpi.c). Private to lib/comm: not installed. */
#ifndef DT_COMM_IMPL_H
#define DT_COMM_IMPL_H

#include "../comm/comm.h"
#include "../comm/comm_job.h"

/* Fills the comm's ops, ctx, name, rank and size, and world_ranks (malloc'd;
 * world_ranks NULL: 0..size-1). */
dt_status dt_comm_init_base(dt_comm *c, const dt_comm_ops *ops, dt_ctx *ctx, const char *name,
                            int rank, int size, const int *world_ranks);
void dt_comm_free_base(dt_comm *c);

#endif
