/* lib/launch/launch.c: dt_launch, which picks the launcher of the backend, and
 * the backend names. The launchers are launch_threads.c and launch_mpi.c. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_nccl.h"
#include "launch/launch.h"

const char *dt_backend_name(dt_backend b) {
  switch (b) {
    case DT_BACKEND_THREADS: return "threads";
    case DT_BACKEND_MPI: return "mpi";
  }
  return "?";
}

dt_status dt_backend_parse(const char *s, dt_backend *out) {
  if (s && !strcmp(s, "threads")) *out = DT_BACKEND_THREADS;
  else if (s && !strcmp(s, "mpi")) *out = DT_BACKEND_MPI;
  else return DT_ERR_INVALID;
  return DT_OK;
}

bool dt_backend_available(dt_backend b) {
  if (b == DT_BACKEND_THREADS) return true;
#ifdef HAVE_MPI
  if (b == DT_BACKEND_MPI) return true;
#endif
  return false;
}

const char *dt_comm_kind_name(dt_comm_kind k) {
  switch (k) {
    case DT_COMM_HOST: return "host";
    case DT_COMM_NCCL: return "nccl";
  }
  return "?";
}

dt_status dt_comm_kind_parse(const char *s, dt_comm_kind *out) {
  if (s && !strcmp(s, "host")) *out = DT_COMM_HOST;
  else if (s && !strcmp(s, "nccl")) *out = DT_COMM_NCCL;
  else return DT_ERR_INVALID;
  return DT_OK;
}

bool dt_comm_kind_available(dt_comm_kind k) {
  return k == DT_COMM_HOST || (k == DT_COMM_NCCL && dt_comm_nccl_built());
}

void dt_launch_report_free(dt_launch_report *rep) {
  if (!rep) return;
  free(rep->rank_status);
  rep->rank_status = NULL;
}

dt_status dt_launch(const dt_launch_opts *opts, dt_spmd_fn fn, void *arg, dt_launch_report *rep) {
  if (rep) {
    memset(rep, 0, sizeof *rep);
    rep->failed_rank = -1;
  }
  if (!opts || !fn) {
    if (rep) snprintf(rep->failed_msg, sizeof rep->failed_msg, "dt_launch: NULL opts or fn");
    return DT_ERR_INVALID;
  }
  switch (opts->backend) {
    case DT_BACKEND_THREADS: return dt_launch_threads(opts, fn, arg, rep);
    case DT_BACKEND_MPI: return dt_launch_mpi(opts, fn, arg, rep);
  }
  return DT_ERR_INVALID;
}

