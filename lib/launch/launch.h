/* lib/launch/launch.h: run one SPMD function on every rank of a job.
 *
 * The launcher is the layer that makes ranks: it gives each a dt_ctx, its
 * ledger, a world communicator (from a comm backend) and a compute device
 * (lib/device), runs fn, and reports how the job ended. It sits above comm and
 * device, which know nothing of each other.
 *
 * threads: the embedded default. dt_launch starts `world` threads in this
 *   process, gives each a dt_ctx, a world dt_comm and a device, runs fn on all of
 *   them and joins them.
 * mpi: one rank per process (under mpirun). dt_launch runs fn once for this
 *   process's rank; MPI is initialised on first use if the program has not done it.
 *
 * Failure: when a rank's fn returns an error, or a collective waits past
 * opts.timeout_s, every other rank's pending and later collectives return
 * DT_ERR_ABORTED instead of hanging, and the report names the first rank that
 * failed and why. The launcher never exits or prints.
 */
#ifndef DT_LAUNCH_H
#define DT_LAUNCH_H

#include "../comm/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dt_backend { DT_BACKEND_THREADS = 0, DT_BACKEND_MPI = 1 } dt_backend;

const char *dt_backend_name(dt_backend b);
dt_status dt_backend_parse(const char *s, dt_backend *out);
/* True when this libdtensor was built with the backend (threads: always). */
bool dt_backend_available(dt_backend b);

/* The world communicator's transport. host: the backend's own (threads: shared
 * memory, mpi: MPI). nccl: NCCL between GPUs (lib/comm/comm_nccl.h): needs
 * device DT_DEV_CUDA (not cuda_emu) and one GPU per rank (threads: world <=
 * GPUs; mpi: local ranks <= the node's GPUs); the threads or mpi job still
 * starts the ranks and carries failures. */
/* fake: shape-only runs (lib/comm/comm_fake.c): the ranks listed in
 * opts.fake_ranks (NULL: all of world) run one after another in the calling
 * thread, each alone as its rank of a world of opts.world ranks (any size up
 * to INT_MAX), every collective complete at once; any backend. */
typedef enum dt_comm_kind { DT_COMM_HOST = 0, DT_COMM_NCCL = 1, DT_COMM_FAKE = 2 } dt_comm_kind;

const char *dt_comm_kind_name(dt_comm_kind k);
dt_status dt_comm_kind_parse(const char *s, dt_comm_kind *out);
/* True when this libdtensor was built with it (host: always). */
bool dt_comm_kind_available(dt_comm_kind k);

typedef dt_status (*dt_spmd_fn)(dt_ctx *ctx, void *arg);

typedef struct dt_launch_opts {
  dt_backend backend;
  int world;            /* threads: number of ranks, 1..DT_THREADS_MAX_WORLD; mpi: ignored */
  double timeout_s;     /* a collective waiting longer fails the job; <= 0: 300 s */
  dt_device_kind device;/* DT_DEV_CPU (default), DT_DEV_CUDA or DT_DEV_META (the meta
                           device: shapes without storage) */
  bool cuda_emu;        /* with DT_DEV_CUDA: each rank gets a cuda-emu device (the
                           CUDA kernels on the host) instead of a GPU */
  bool no_ledger;       /* true: do not record ledger rows */
  dt_comm_kind comm;    /* the world communicator's transport (default host) */
  bool bind;            /* threads: pin rank r to the r-th CPU this process may use, when
                           world <= those CPUs (default: the scheduler places the ranks;
                           on a shared machine a pinned rank waits for its one busy core
                           while another core idles: bench/shardbench-pinning) */
  const int *fake_ranks;/* comm fake: the ranks to run, n_fake_ranks of them */
  int n_fake_ranks;
} dt_launch_opts;

typedef struct dt_launch_report {
  int world;            /* ranks in the job */
  int first_rank;       /* ranks first_rank .. first_rank+n_local-1 ran in this process
                           (comm fake: the n_local ranks listed, in their order) */
  int n_local;
  dt_status *rank_status; /* n_local entries: fn's status per local rank (malloc'd) */
  int failed_rank;      /* first rank that failed (error or timeout), -1 when none */
  dt_status failed_status;
  char failed_msg[DT_ERRMSG_LEN]; /* that rank's last error */
} dt_launch_report;

/* Runs fn(ctx, arg) on every rank. Returns DT_OK when every rank returned DT_OK,
 * else the first failure's status (the report says which rank and why:
 * failed_rank is the rank that raised the failure, by its own error or a
 * timeout, never one that only saw the abort; the lowest such rank under MPI).
 * `arg` is shared by all local ranks: index it by ctx->rank. rep may be NULL.
 * Under MPI every process calls dt_launch with the same opts. Communicators
 * split from ctx->world must be destroyed before fn returns. */
dt_status dt_launch(const dt_launch_opts *opts, dt_spmd_fn fn, void *arg, dt_launch_report *rep);
void dt_launch_report_free(dt_launch_report *rep);

/* The threads and MPI launchers behind dt_launch. */
dt_status dt_launch_threads(const dt_launch_opts *opts, dt_spmd_fn fn, void *arg,
                            dt_launch_report *rep);
dt_status dt_launch_mpi(const dt_launch_opts *opts, dt_spmd_fn fn, void *arg,
                        dt_launch_report *rep);

/* MPI process helpers for programs (DT_ERR_UNSUPPORTED without MPI). */
dt_status dt_mpi_init(int *argc, char ***argv);   /* idempotent */
int dt_mpi_rank(void);    /* world rank of this process; 0 without MPI */
int dt_mpi_size(void);
/* Ends MPI: MPI_Finalize when job_ok, else MPI_Abort (a failed job may leave
 * collectives pending that finalize would wait on forever). */
void dt_mpi_finish(bool job_ok);

#ifdef __cplusplus
}
#endif
#endif
