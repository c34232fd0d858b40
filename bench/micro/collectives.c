/* bench/micro/collectives.c: collective bandwidth in the spirit of nccl-tests.
 *
 *   bench/shardbench-collectives --backend threads --world 8 --op all_reduce \
 *       --min-bytes 1M --max-bytes 64M --iters 20 [--csv]
 *   mpirun -np 4 bench/shardbench-collectives --backend mpi ...       (libdtensor's MPI backend)
 *   mpirun -np 4 bench/shardbench-collectives --backend mpi-raw ...   (plain MPI_Allreduce etc.,
 *                                                           the baseline)
 *   bench/shardbench-collectives --memcpy                              (the machine's memcpy bound)
 *
 * For each size S (bytes of the nccl-tests array: the all_reduce buffer, the
 * all_gather output, the reduce_scatter input) it prints the time per call (the
 * slowest rank's mean over --iters after --warmup calls), algbw = S / t and busbw
 * = algbw * bus factor (all_reduce 2(n-1)/n; all_gather, reduce_scatter,
 * all_to_all (n-1)/n; broadcast 1). Results are checked once after timing
 * (all_reduce of ones must give n). This program prints; the library does not.
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef HAVE_MPI
#include <mpi.h>
#endif

#include "dtensor.h"
#include "../common/flags.h"

typedef struct bopts {
  const char *backend;
  dt_backend be;
  bool raw;       /* mpi-raw: call MPI directly, bypassing libdtensor */
  dt_coll op;
  dt_dtype dtype;
  int world;
  size_t min_bytes, max_bytes;
  int iters, warmup;
  bool csv;
  bool memcpy_only;
} bopts;

typedef struct row {
  size_t bytes, count;
  double seconds;
  long wrong;
} row;

enum { MAX_ROWS = 64 };

typedef struct shared {
  const bopts *o;
  row rows[MAX_ROWS];
  int nrows;
  int world;
} shared;

static void usage(FILE *f, const char *argv0) {
  fprintf(f,
          "usage: %s [--backend threads|mpi|mpi-raw] [--world N] [--op OP] [--dtype f32|f64]\n"
          "          [--min-bytes B] [--max-bytes B] [--iters N] [--warmup N] [--csv] [--memcpy]\n"
          "  OP: all_reduce (default), all_gather, reduce_scatter, all_to_all, broadcast\n"
          "  B accepts K, M, G suffixes (powers of 1024). Defaults: threads, world 2,\n"
          "  1M..64M, 20 iterations after 3 warm-up calls.\n",
          argv0);
}

static int parse_bytes(const char *s, size_t *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || v < 0) return -1;
  double mul = 1;
  if (*end == 'K' || *end == 'k') mul = 1024.0, end++;
  else if (*end == 'M' || *end == 'm') mul = 1048576.0, end++;
  else if (*end == 'G' || *end == 'g') mul = 1073741824.0, end++;
  if (*end == 'B' || *end == 'b') end++;
  if (*end) return -1;
  *out = (size_t)(v * mul);
  return 0;
}

static double bus_factor(dt_coll op, int n) {
  return n > 1 ? dt_coll_bus_factor(op, n) : 0.0;
}

/* Elements each rank passes as `count` for an array of S bytes. */
static size_t count_for(dt_coll op, size_t bytes, size_t es, int n) {
  size_t elems = bytes / es;
  switch (op) {
    case DT_COLL_ALL_GATHER:
    case DT_COLL_REDUCE_SCATTER:
    case DT_COLL_ALL_TO_ALL: return elems / (size_t)n;
    default: return elems;
  }
}

#ifdef HAVE_MPI
static MPI_Datatype mpi_type(dt_dtype t) { return t == DT_F64 ? MPI_DOUBLE : MPI_FLOAT; }
#endif

static dt_status run_once(dt_ctx *ctx, const bopts *o, void *a, void *b, size_t count) {
  dt_comm *c = ctx->world;
#ifdef HAVE_MPI
  if (o->raw) {
    MPI_Datatype t = mpi_type(o->dtype);
    int n = c->size, rc = MPI_SUCCESS, ic = (int)count;
    switch (o->op) {
      case DT_COLL_ALL_REDUCE: rc = MPI_Allreduce(a, b, ic, t, MPI_SUM, MPI_COMM_WORLD); break;
      case DT_COLL_ALL_GATHER: rc = MPI_Allgather(a, ic, t, b, ic, t, MPI_COMM_WORLD); break;
      case DT_COLL_REDUCE_SCATTER:
        rc = MPI_Reduce_scatter_block(a, b, ic, t, MPI_SUM, MPI_COMM_WORLD);
        break;
      case DT_COLL_ALL_TO_ALL: rc = MPI_Alltoall(a, ic, t, b, ic, t, MPI_COMM_WORLD); break;
      case DT_COLL_BROADCAST: rc = MPI_Bcast(a, ic, t, 0, MPI_COMM_WORLD); break;
      default: return DT_ERR_UNSUPPORTED;
    }
    (void)n;
    return rc == MPI_SUCCESS ? DT_OK : DT_ERR_BACKEND;
  }
#endif
  switch (o->op) {
    case DT_COLL_ALL_REDUCE: return dt_comm_all_reduce(c, a, b, count, o->dtype, DT_RED_SUM);
    case DT_COLL_ALL_GATHER: return dt_comm_all_gather(c, a, b, count, o->dtype);
    case DT_COLL_REDUCE_SCATTER:
      return dt_comm_reduce_scatter(c, a, b, count, o->dtype, DT_RED_SUM);
    case DT_COLL_ALL_TO_ALL: return dt_comm_all_to_all(c, a, b, count, o->dtype);
    case DT_COLL_BROADCAST: return dt_comm_broadcast(c, a, count, o->dtype, 0);
    default: return DT_ERR_UNSUPPORTED;
  }
}

static dt_status bench_rank(dt_ctx *ctx, void *arg) {
  shared *sh = arg;
  const bopts *o = sh->o;
  dt_comm *c = ctx->world;
  int n = c->size;
  size_t es = dt_dtype_size(o->dtype);
  dt_ledger_enable(ctx, false); /* time the collective, not the bookkeeping */
  /* Buffers sized for the largest call: all_gather's output and reduce_scatter's
   * input are S bytes; the others S as well. */
  size_t cap = o->max_bytes + 64;
  char *a = dt_host_alloc(ctx, cap), *b = dt_host_alloc(ctx, cap);
  if (!a || !b) return DT_ERR_NOMEM;
  memset(a, 0, cap);
  memset(b, 0, cap);
  int nr = 0;
  for (size_t bytes = o->min_bytes; bytes <= o->max_bytes && nr < MAX_ROWS; bytes *= 2) {
    size_t count = count_for(o->op, bytes, es, n);
    for (int i = 0; i < o->warmup; i++) DT_CHECK(run_once(ctx, o, a, b, count));
    DT_CHECK(dt_comm_barrier(c));
    double t0 = dt_now();
    for (int i = 0; i < o->iters; i++) DT_CHECK(run_once(ctx, o, a, b, count));
    double t = (dt_now() - t0) / o->iters, tmax = 0;
    DT_CHECK(dt_comm_all_reduce(c, &t, &tmax, 1, DT_F64, DT_RED_MAX));
    /* Check after timing: all_reduce of ones gives n everywhere. */
    long wrong = 0;
    if (o->op == DT_COLL_ALL_REDUCE) {
      if (o->dtype == DT_F32) for (size_t i = 0; i < count; i++) ((float *)a)[i] = 1.0f;
      else for (size_t i = 0; i < count; i++) ((double *)a)[i] = 1.0;
      DT_CHECK(run_once(ctx, o, a, b, count));
      for (size_t i = 0; i < count; i++) {
        double v = o->dtype == DT_F32 ? ((float *)b)[i] : ((double *)b)[i];
        wrong += v != (double)n;
      }
      memset(a, 0, cap);
    }
    long wsum = 0;
    double wl = (double)wrong, ws = 0;
    DT_CHECK(dt_comm_all_reduce(c, &wl, &ws, 1, DT_F64, DT_RED_SUM));
    wsum = (long)ws;
    if (ctx->rank == 0) sh->rows[nr] = (row){.bytes = bytes, .count = count, .seconds = tmax, .wrong = wsum};
    nr++;
    if (bytes == 0) break;
  }
  if (ctx->rank == 0) {
    sh->nrows = nr;
    sh->world = n;
  }
  dt_host_free(ctx, a);
  dt_host_free(ctx, b);
  return DT_OK;
}

static void print_rows(const bopts *o, const shared *sh) {
  const char *be = o->backend;
  int n = sh->world;
  if (o->csv) {
    printf("backend,op,dtype,world,bytes,count,time_us,algbw_GBps,busbw_GBps,wrong\n");
  } else {
    printf("# shardbench collectives: backend %s, op %s, dtype %s, world %d, iters %d\n", be,
           dt_coll_name(o->op), dt_dtype_name(o->dtype), n, o->iters);
    printf("#%12s %12s %12s %10s %10s %7s\n", "size(B)", "count", "time(us)", "algbw", "busbw",
           "#wrong");
    printf("#%12s %12s %12s %10s %10s %7s\n", "", "(elements)", "", "(GB/s)", "(GB/s)", "");
  }
  for (int i = 0; i < sh->nrows; i++) {
    const row *r = &sh->rows[i];
    double alg = r->seconds > 0 ? (double)r->bytes / r->seconds / 1e9 : 0;
    double bus = alg * bus_factor(o->op, n);
    if (o->csv)
      printf("%s,%s,%s,%d,%zu,%zu,%.3f,%.4f,%.4f,%ld\n", be, dt_coll_name(o->op),
             dt_dtype_name(o->dtype), n, r->bytes, r->count, r->seconds * 1e6, alg, bus, r->wrong);
    else
      printf(" %12zu %12zu %12.1f %10.3f %10.3f %7ld\n", r->bytes, r->count, r->seconds * 1e6, alg,
             bus, r->wrong);
  }
}

/* memcpy bandwidth of one thread over a buffer far larger than the caches:
 * bytes copied per second (read + write traffic is twice that). */
static void memcpy_bound(bool csv) {
  size_t bytes = (size_t)256 << 20;
  char *a = malloc(bytes), *b = malloc(bytes);
  if (!a || !b) {
    fprintf(stderr, "collectives: --memcpy: cannot allocate 2 x 256 MiB\n");
    exit(1);
  }
  memset(a, 1, bytes);
  memset(b, 2, bytes);
  double best = 1e30;
  for (int i = 0; i < 7; i++) {
    double t0 = dt_now();
    memcpy(i % 2 ? a : b, i % 2 ? b : a, bytes);
    double t = dt_now() - t0;
    if (t < best) best = t;
  }
  if (csv) printf("memcpy_bytes,best_s,GBps\n%zu,%.6f,%.3f\n", bytes, best, (double)bytes / best / 1e9);
  else printf("memcpy of %zu MiB, one thread: %.3f GB/s (best of 7)\n", bytes >> 20,
              (double)bytes / best / 1e9);
  free(a);
  free(b);
}

int main(int argc, char **argv) {
  bopts o = {.backend = "threads", .be = DT_BACKEND_THREADS, .op = DT_COLL_ALL_REDUCE,
             .dtype = DT_F32, .world = 2, .min_bytes = (size_t)1 << 20,
             .max_bytes = (size_t)64 << 20, .iters = 20, .warmup = 3};
  static const struct option lopts[] = {
      {"backend", required_argument, 0, 'b'}, {"world", required_argument, 0, 'w'},
      {"op", required_argument, 0, 'o'},      {"dtype", required_argument, 0, 'd'},
      {"min-bytes", required_argument, 0, 'm'}, {"max-bytes", required_argument, 0, 'M'},
      {"iters", required_argument, 0, 'i'},   {"warmup", required_argument, 0, 'W'},
      {"csv", no_argument, 0, 'c'},           {"memcpy", no_argument, 0, 'y'},
      {"help", no_argument, 0, 'h'},          {0, 0, 0, 0}};
  int ch;
  while ((ch = getopt_long(argc, argv, "b:w:o:d:m:M:i:W:chy", lopts, NULL)) != -1) {
    switch (ch) {
      case 'b':
        o.backend = optarg;
        if (!strcmp(optarg, "mpi-raw")) {
          o.raw = true;
          o.be = DT_BACKEND_MPI;
        } else if (dt_backend_parse(optarg, &o.be) != DT_OK) {
          fprintf(stderr, "collectives: --backend: expected threads, mpi or mpi-raw, got '%s'\n", optarg);
          return 2;
        }
        break;
      case 'w':
        if (sb_flag_int(optarg, 1, DT_THREADS_MAX_WORLD, &o.world)) {
          fprintf(stderr, "collectives: --world: expected 1..%d, got '%s'\n", DT_THREADS_MAX_WORLD, optarg);
          return 2;
        }
        break;
      case 'o':
        if (dt_coll_parse(optarg, &o.op) != DT_OK || o.op > DT_COLL_BROADCAST) {
          fprintf(stderr, "collectives: --op: expected all_reduce, all_gather, reduce_scatter, all_to_all or broadcast, got '%s'\n", optarg);
          return 2;
        }
        break;
      case 'd':
        if (dt_dtype_parse(optarg, &o.dtype) != DT_OK || o.dtype == DT_BF16) {
          fprintf(stderr, "collectives: --dtype: expected f32 or f64, got '%s'\n", optarg);
          return 2;
        }
        break;
      case 'm':
      case 'M':
        if (parse_bytes(optarg, ch == 'm' ? &o.min_bytes : &o.max_bytes)) {
          fprintf(stderr, "collectives: --%s: expected a size like 4096, 64K or 1M, got '%s'\n",
                  ch == 'm' ? "min-bytes" : "max-bytes", optarg);
          return 2;
        }
        break;
      case 'i':
        if (sb_flag_int(optarg, 1, 1000000, &o.iters)) {
          fprintf(stderr, "collectives: --iters: expected 1..1000000, got '%s'\n", optarg);
          return 2;
        }
        break;
      case 'W':
        if (sb_flag_int(optarg, 0, 1000000, &o.warmup)) {
          fprintf(stderr, "collectives: --warmup: expected 0..1000000, got '%s'\n", optarg);
          return 2;
        }
        break;
      case 'c': o.csv = true; break;
      case 'y': o.memcpy_only = true; break;
      case 'h': usage(stdout, argv[0]); return 0;
      default: usage(stderr, argv[0]); return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "collectives: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  if (o.memcpy_only) {
    memcpy_bound(o.csv);
    return 0;
  }
  if (o.min_bytes == 0 || o.min_bytes > o.max_bytes) {
    fprintf(stderr, "collectives: --min-bytes must be >= 1 and <= --max-bytes\n");
    return 2;
  }
  if (o.max_bytes > ((size_t)2 << 30)) {
    fprintf(stderr, "collectives: --max-bytes: at most 2G\n");
    return 2;
  }
  if (!dt_backend_available(o.be)) {
    fprintf(stderr, "collectives: backend %s is not built into this libdtensor\n", o.backend);
    return 2;
  }
  dt_device_cpu_blas_threads(1);
  shared sh;
  memset(&sh, 0, sizeof sh);
  sh.o = &o;
  dt_launch_opts lo = {.backend = o.be, .world = o.world, .timeout_s = 600};
  dt_launch_report rep;
  dt_status s = dt_launch(&lo, bench_rank, &sh, &rep);
  int my_rank = o.be == DT_BACKEND_MPI ? dt_mpi_rank() : 0;
  if (s != DT_OK) {
    fprintf(stderr, "collectives: rank %d failed: %s (%s)\n", rep.failed_rank, rep.failed_msg,
            dt_status_str(s));
  } else if (my_rank == 0) {
    print_rows(&o, &sh);
  }
  long wrong = 0;
  for (int i = 0; i < sh.nrows; i++) wrong += sh.rows[i].wrong;
  dt_launch_report_free(&rep);
  if (o.be == DT_BACKEND_MPI) dt_mpi_finish(s == DT_OK);
  if (wrong && my_rank == 0) fprintf(stderr, "collectives: %ld wrong elements\n", wrong);
  return s != DT_OK || wrong ? 1 : 0;
}
