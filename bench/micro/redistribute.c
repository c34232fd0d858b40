/* bench/micro/redistribute.c: what dt_redistribute costs over the raw collective it issues.
 *
 *   bench/shardbench-redistribute [--world 8] [--bytes 64M] [--iters 10] [--warmup 2] [--reps 5]
 *                      [--cols C [--dim 0|1]]
 *
 * On the threads backend, a 1-D mesh of --world ranks, an f32 tensor of --bytes
 * in all ([N], or [N/C, C] with --cols), it times in the same run:
 *   (a) dt_redistribute S(d) -> R      against dt_comm_all_gather of the same size;
 *   (b) dt_redistribute P(sum) -> S(d) against dt_comm_reduce_scatter of the same size.
 * Fairness: both go through the same communicator (the mesh dim's), with the
 * ledger off for both; the raw call reuses preallocated buffers, as nccl-tests
 * does, while each redistribute call is timed whole, as a user calls it: plan,
 * allocation of the output DTensor, any packing or unpacking, the collective,
 * and freeing the output again. The raw send buffer is the source DTensor's own
 * local shard, so both read the same memory. Raw and redistribute alternate
 * within each rep (which goes first flips every rep) so that drift in the
 * machine's load hits both alike.
 *
 * Per-call time is the slowest rank's mean over --iters calls after --warmup
 * calls; algbw = S / t with S the nccl-tests array size (the all_gather output,
 * the reduce_scatter input: the whole tensor); busbw = algbw * (n-1)/n for both.
 * Each figure is the median over --reps; the ratio is redistribute/raw busbw
 * (goal: >= 0.9). After timing, both results are checked exactly against the
 * expected values (small integers, so f32 sums are exact). Exit: 0 ran and
 * checked (the ratio is reported, not enforced), 1 a check or run failed,
 * 2 bad input. This program prints; the library does not.
 */
#include "config.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor.h"
#include "../common/flags.h"
#include "../stats.h"

static const char PROG[] = "redistribute";

/* Most reps kept (each rep is a row of times; more than this is not a benchmark
 * anyone waits for). */
enum { MAX_REPS = 1000 };

/* Values of the test tensor are (i + r) mod 8 on rank r: a sum over up to 1024
 * ranks stays below 2^13, exact in f32's 24-bit significand. */
enum { VAL_MOD = 8 };

/* The goal the issue sets for redistribute over the raw collective. */
static const double RATIO_GOAL = 0.9;

typedef struct bopts {
  int world;
  size_t bytes;
  int iters, warmup, reps;
  int64_t cols;   /* 0: a 1-D tensor */
  int dim;        /* the sharded tensor dim */
} bopts;

/* Variants timed: index into the result table. */
enum { V_AG_REDIST = 0, V_AG_RAW, V_AG_TOUCH, V_RS_REDIST, V_RS_RAW, V_RS_TOUCH, V_COUNT };
static const char *const v_names[V_COUNT] = {
    "redistribute", "raw all_gather", "alloc+touch out", "redistribute", "raw reduce_scatter",
    "alloc+touch out"};

typedef struct shared {
  const bopts *o;
  int ndim;
  int64_t gshape[2];
  int64_t numel;                  /* elements of the whole tensor */
  double t[V_COUNT][MAX_REPS];    /* slowest rank's mean seconds per call, per rep */
  long wrong[V_COUNT];            /* wrong elements found by the checks (summed over ranks) */
} shared;

typedef struct rstate {
  dt_ctx *ctx;
  dt_comm *comm;
  dt_tensor src;                  /* S(dim) for (a), P(sum) for (b) */
  dt_placement dst[1];
  void *raw_out;                  /* preallocated raw output */
  size_t raw_count;               /* count argument of the raw collective */
  size_t touch_bytes;
} rstate;

typedef dt_status (*variant_fn)(rstate *st);

static dt_status do_redist(rstate *st) {
  dt_tensor out;
  DT_CHECK(dt_redistribute(st->ctx, &st->src, st->dst, DT_PLANNER_GREEDY, &out));
  dt_tensor_free(st->ctx, &out);
  return DT_OK;
}

static dt_status do_raw_ag(rstate *st) {
  return dt_comm_all_gather(st->comm, dt_tensor_local(&st->src)->data, st->raw_out,
                            st->raw_count, DT_F32);
}

static dt_status do_raw_rs(rstate *st) {
  return dt_comm_reduce_scatter(st->comm, dt_tensor_local(&st->src)->data, st->raw_out,
                                st->raw_count, DT_F32, DT_RED_SUM);
}

/* What a fresh output costs by itself: allocate, write every byte once, free. */
static dt_status do_touch(rstate *st) {
  void *p = dt_host_alloc(st->ctx, st->touch_bytes);
  if (!p) return DT_ERR_NOMEM;
  memset(p, 0, st->touch_bytes);
  dt_host_free(st->ctx, p);
  return DT_OK;
}

/* Times one variant: warm-up, barrier, iters calls; the slowest rank's mean. */
static dt_status time_variant(rstate *st, const bopts *o, variant_fn fn, double *tmax) {
  for (int i = 0; i < o->warmup; i++) DT_CHECK(fn(st));
  DT_CHECK(dt_comm_barrier(st->comm));
  double t0 = dt_now();
  for (int i = 0; i < o->iters; i++) DT_CHECK(fn(st));
  double t = (dt_now() - t0) / o->iters;
  return dt_comm_all_reduce(st->comm, &t, tmax, 1, DT_F64, DT_RED_MAX);
}

/* The local data of rank r: element at global flat index i is (i + r) mod 8
 * (P sources); shards of the S source take the values (i mod 8) of the
 * global. */
static float val(int64_t i, int r) { return (float)((i + r) % VAL_MOD); }

/* Global flat index of local element k of rank r's shard along `dim`. */
static int64_t gidx(const shared *sh, const int64_t *lshape, const int64_t *goff, int64_t k) {
  if (sh->ndim == 1) return goff[0] + k;
  int64_t row = k / lshape[1], col = k % lshape[1];
  return (goff[0] + row) * sh->gshape[1] + goff[1] + col;
}

static dt_status make_tensor(dt_ctx *ctx, dt_mesh *mesh, const shared *sh, dt_placement pl,
                             dt_tensor *out) {
  int coord = dt_mesh_coord(mesh, 0), n = dt_mesh_size(mesh, 0);
  int64_t lshape[2], goff[2];
  dt_local_shape_offset(sh->ndim, sh->gshape, 1, &n, &coord, &pl, lshape, goff);
  dt_array a;
  DT_CHECK(dt_array_create(ctx, DT_DEV_CPU, DT_F32, sh->ndim, lshape, &a));
  float *d = a.data;
  for (int64_t k = 0; k < a.numel; k++) {
    int64_t g = gidx(sh, lshape, goff, k);
    d[k] = pl.kind == DT_PL_PARTIAL ? val(g, coord) : val(g, 0);
  }
  dt_status s = dt_tensor_from_local(ctx, mesh, &a, &pl, sh->ndim, sh->gshape, out);
  dt_array_free(ctx, &a);
  return s;
}

/* Wrong elements of a redistribute result and of the raw output, after timing.
 * S -> R: everything is val(i, 0). P(sum) -> S: the sum over ranks of val. */
static long check_case(rstate *st, const shared *sh, bool reduce, long *raw_wrong) {
  int n = st->comm->size, me = st->comm->rank;
  dt_tensor out;
  long wrong = 0;
  if (dt_redistribute(st->ctx, &st->src, st->dst, DT_PLANNER_GREEDY, &out) != DT_OK) return -1;
  const dt_array *l = dt_tensor_local(&out);
  const float *d = l->data;
  for (int64_t k = 0; k < l->numel; k++) {
    int64_t g = gidx(sh, l->shape, out.goffset, k);
    float want = 0;
    if (reduce)
      for (int r = 0; r < n; r++) want += val(g, r);
    else
      want = val(g, 0);
    wrong += d[k] != want;
  }
  dt_tensor_free(st->ctx, &out);
  /* The raw output: all_gather gives the shards in rank order; reduce_scatter
   * gives this rank's block of the flat input. */
  const float *ro = st->raw_out;
  *raw_wrong = 0;
  if (!reduce) {
    /* Shard r's k-th element came from rank r's local data. */
    int64_t per = (int64_t)st->raw_count;
    for (int r = 0; r < n; r++) {
      int64_t lshape[2], goff[2];
      dt_local_shape_offset(sh->ndim, sh->gshape, 1, &n, &r, &st->src.pl[0], lshape, goff);
      for (int64_t k = 0; k < per; k++)
        *raw_wrong += ro[r * per + k] != val(gidx(sh, lshape, goff, k), 0);
    }
  } else {
    /* reduce_scatter reduces the flat input: rank me gets flat block me, whose
     * element k has global flat index me*count + k of the rank-local layout,
     * which is the global layout (every P rank holds the whole tensor). */
    for (int64_t k = 0; k < (int64_t)st->raw_count; k++) {
      int64_t g = (int64_t)me * (int64_t)st->raw_count + k;
      float want = 0;
      for (int r = 0; r < n; r++) want += val(g, r);
      *raw_wrong += ro[k] != want;
    }
  }
  return wrong;
}

static dt_status bench_rank(dt_ctx *ctx, void *arg) {
  shared *sh = arg;
  const bopts *o = sh->o;
  dt_status s = DT_OK;
  dt_mesh *mesh = NULL;
  rstate st;
  memset(&st, 0, sizeof st);
  st.ctx = ctx;
  bool have_src = false;
  const char *names[1] = {"x"};
  dt_ledger_enable(ctx, false); /* off for raw and redistribute alike */
  DT_CHECK_GOTO(dt_mesh_create(ctx, ctx->world, 1, &o->world, names, &mesh), s, done);
  st.comm = dt_mesh_comm(mesh, 0);
  int n = o->world;
  size_t whole = (size_t)sh->numel * sizeof(float);
  long wrong[V_COUNT] = {0};

  for (int c = 0; c < 2; c++) {
    bool reduce = c == 1;
    /* (a) S(dim) -> R: raw all_gather of count numel/n into a whole buffer.
     * (b) P(sum) -> S(dim): raw reduce_scatter of count numel/n from the whole. */
    dt_placement spl = reduce ? dt_partial(DT_RED_SUM) : dt_shard(o->dim);
    st.dst[0] = reduce ? dt_shard(o->dim) : dt_replicate();
    st.raw_count = (size_t)sh->numel / (size_t)n;
    size_t raw_bytes = reduce ? st.raw_count * sizeof(float) : whole;
    st.touch_bytes = raw_bytes; /* the size of the redistribute's output */
    DT_CHECK_GOTO(make_tensor(ctx, mesh, sh, spl, &st.src), s, done);
    have_src = true;
    st.raw_out = dt_host_calloc(ctx, raw_bytes);
    if (!st.raw_out) {
      s = DT_ERR_NOMEM;
      goto done;
    }
    int vr = reduce ? V_RS_REDIST : V_AG_REDIST, vw = reduce ? V_RS_RAW : V_AG_RAW;
    int vt = reduce ? V_RS_TOUCH : V_AG_TOUCH;
    variant_fn raw = reduce ? do_raw_rs : do_raw_ag;
    for (int rep = 0; rep < o->reps; rep++) {
      double tr, tw;
      if (rep % 2 == 0) {
        DT_CHECK_GOTO(time_variant(&st, o, raw, &tw), s, done);
        DT_CHECK_GOTO(time_variant(&st, o, do_redist, &tr), s, done);
      } else {
        DT_CHECK_GOTO(time_variant(&st, o, do_redist, &tr), s, done);
        DT_CHECK_GOTO(time_variant(&st, o, raw, &tw), s, done);
      }
      if (ctx->rank == 0) {
        sh->t[vr][rep] = tr;
        sh->t[vw][rep] = tw;
      }
    }
    /* For reference: what a fresh output of this size costs alone. */
    for (int rep = 0; rep < o->reps; rep++) {
      double tt;
      DT_CHECK_GOTO(time_variant(&st, o, do_touch, &tt), s, done);
      if (ctx->rank == 0) sh->t[vt][rep] = tt;
    }
    long raw_wrong = 0;
    long w = check_case(&st, sh, reduce, &raw_wrong);
    if (w < 0) {
      s = ctx->last_status ? ctx->last_status : DT_ERR_INTERNAL;
      goto done;
    }
    wrong[vr] = w;
    wrong[vw] = raw_wrong;
    dt_host_free(ctx, st.raw_out);
    st.raw_out = NULL;
    dt_tensor_free(ctx, &st.src);
    have_src = false;
  }
  /* Sum the wrong counts over ranks (as doubles: the front's reduce types). */
  double wl[V_COUNT], ws[V_COUNT];
  for (int v = 0; v < V_COUNT; v++) wl[v] = (double)wrong[v];
  DT_CHECK_GOTO(dt_comm_all_reduce(st.comm, wl, ws, V_COUNT, DT_F64, DT_RED_SUM), s, done);
  if (ctx->rank == 0)
    for (int v = 0; v < V_COUNT; v++) sh->wrong[v] = (long)ws[v];

done:
  if (st.raw_out) dt_host_free(ctx, st.raw_out);
  if (have_src) dt_tensor_free(ctx, &st.src);
  if (mesh) dt_mesh_free(mesh);
  return s;
}

/* ---- statistics and the table ---- */

typedef struct stat3 { double med, lo, hi; } stat3;

static stat3 stats(const double *v, int n) {
  double *s = malloc((size_t)n * sizeof *s);
  stat3 r = {0, 0, 0};
  if (!s) return r;
  memcpy(s, v, (size_t)n * sizeof *s);
  r.med = sb_median(s, n);
  r.lo = s[0];
  r.hi = s[n - 1];
  free(s);
  return r;
}

static void print_row(const char *cse, const char *what, stat3 t, double S, double bf) {
  double alg = S / t.med / 1e9;
  printf("%-13s %-19s %11.0f %11.0f %11.0f %9.3f %9.3f\n", cse, what, t.med * 1e6, t.lo * 1e6,
         t.hi * 1e6, alg, alg * bf);
}

/* A row with a time only (bytes: the buffer size, shown in the busbw column's place). */
static void print_time(const char *cse, const char *what, stat3 t, double bytes) {
  printf("%-13s %-19s %11.0f %11.0f %11.0f %9s %9s   (%.0f bytes per rank)\n", cse, what,
         t.med * 1e6, t.lo * 1e6, t.hi * 1e6, "-", "-", bytes);
}

static void print_ratio(const shared *sh, int vr, int vw, int reps) {
  stat3 r = stats(sh->t[vr], reps), w = stats(sh->t[vw], reps);
  double per[MAX_REPS];
  for (int i = 0; i < reps; i++) per[i] = sh->t[vw][i] / sh->t[vr][i];
  stat3 p = stats(per, reps);
  double ratio = w.med / r.med; /* same S and bus factor: busbw ratio = time ratio inverted */
  printf("%-13s ratio redistribute/raw busbw: %.3f (per-rep ratios: median %.3f, %.3f..%.3f); "
         "goal >= %.2f: %s\n",
         "", ratio, p.med, p.lo, p.hi, RATIO_GOAL, ratio >= RATIO_GOAL ? "met" : "NOT met");
}

/* ---- flags ---- */

static void usage(FILE *f) {
  fprintf(f,
          "usage: bench/shardbench-redistribute [--world N] [--bytes B] [--iters N] [--warmup N]\n"
          "                          [--reps N] [--cols C [--dim 0|1]]\n"
          "  Times dt_redistribute S(d)->R and P(sum)->S(d) against the raw all_gather and\n"
          "  reduce_scatter of the same size on the threads backend (1-D mesh of N ranks).\n"
          "  Defaults: world 8, 64M bytes (K, M, G: powers of 1024), iters 10 after 2\n"
          "  warm-up calls, median of 5 reps, a 1-D f32 tensor (--cols C: [B/4/C, C]).\n");
}

/* One line "PROG: FLAG: message" on stderr (bench/common/flags.h); returns 2. */
#define bad(...) sb_flag_bad(PROG, __VA_ARGS__)

/* At most 4 GiB: the whole tensor lives on every rank in case (b). */
static const size_t MAX_BYTES = (size_t)4 << 30;

int main(int argc, char **argv) {
  bopts o = {.world = 8, .bytes = (size_t)64 << 20, .iters = 10, .warmup = 2, .reps = 5,
             .cols = 0, .dim = 0};
  static const struct option lopts[] = {
      {"world", required_argument, 0, 'w'}, {"bytes", required_argument, 0, 'b'},
      {"iters", required_argument, 0, 'i'}, {"warmup", required_argument, 0, 'W'},
      {"reps", required_argument, 0, 'r'},  {"cols", required_argument, 0, 'c'},
      {"dim", required_argument, 0, 'd'},   {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  opterr = 0;
  int ch;
  long v;
  while ((ch = getopt_long(argc, argv, ":h", lopts, NULL)) != -1) {
    switch (ch) {
      case 'w':
        if (sb_flag_long(optarg, 2, DT_THREADS_MAX_WORLD, &v))
          return bad("--world", "expected 2..1024 (a group of one moves nothing), got '%s'", optarg);
        o.world = (int)v;
        break;
      case 'b':
        if (sb_flag_bytes(optarg, MAX_BYTES, &o.bytes))
          return bad("--bytes", "expected a size like 1M or 64M, 1 byte..4G, got '%s'", optarg);
        break;
      case 'i':
        if (sb_flag_long(optarg, 1, 1000000, &v))
          return bad("--iters", "expected 1..1000000, got '%s'", optarg);
        o.iters = (int)v;
        break;
      case 'W':
        if (sb_flag_long(optarg, 0, 1000000, &v))
          return bad("--warmup", "expected 0..1000000, got '%s'", optarg);
        o.warmup = (int)v;
        break;
      case 'r':
        if (sb_flag_long(optarg, 1, MAX_REPS, &v))
          return bad("--reps", "expected 1..1000, got '%s'", optarg);
        o.reps = (int)v;
        break;
      case 'c':
        if (sb_flag_long(optarg, 1, 1L << 30, &v))
          return bad("--cols", "expected 1..2^30, got '%s'", optarg);
        o.cols = v;
        break;
      case 'd':
        if (sb_flag_long(optarg, 0, 1, &v)) return bad("--dim", "expected 0 or 1, got '%s'", optarg);
        o.dim = (int)v;
        break;
      case 'h': usage(stdout); return 0;
      default: return sb_flag_getopt_bad(PROG, ch, argv); /* ':' missing value, '?' unknown */
    }
  }
  if (optind < argc) return bad(argv[optind], "unexpected argument");
  if (o.dim == 1 && !o.cols) return bad("--dim", "1 needs a 2-D tensor (--cols)");

  shared *sh = calloc(1, sizeof *sh);
  if (!sh) {
    fprintf(stderr, "%s: out of memory\n", PROG);
    return 1;
  }
  sh->o = &o;
  /* Even shards, so that both sides move the same bytes with no padding:
   * round the element count down to a multiple of the world along the
   * sharded dim. */
  int64_t elems = (int64_t)(o.bytes / sizeof(float));
  if (!o.cols) {
    sh->ndim = 1;
    sh->gshape[0] = elems / o.world * o.world;
  } else {
    sh->ndim = 2;
    int64_t rows = elems / o.cols;
    if (o.dim == 0) rows = rows / o.world * o.world;
    else if (o.cols % o.world) {
      free(sh);
      return bad("--cols", "must be a multiple of --world (%d) with --dim 1, got %lld", o.world,
                 (long long)o.cols);
    }
    sh->gshape[0] = rows;
    sh->gshape[1] = o.cols;
  }
  sh->numel = sh->ndim == 1 ? sh->gshape[0] : sh->gshape[0] * sh->gshape[1];
  if (sh->numel < o.world) {
    free(sh);
    return bad("--bytes", "too small: fewer f32 elements than the %d ranks", o.world);
  }

  dt_launch_opts lo = {.backend = DT_BACKEND_THREADS, .world = o.world, .timeout_s = 600};
  dt_launch_report rep;
  dt_status s = dt_launch(&lo, bench_rank, sh, &rep);
  if (s != DT_OK) {
    fprintf(stderr, "%s: rank %d failed: %s (%s)\n", PROG, rep.failed_rank, rep.failed_msg,
            dt_status_str(s));
    dt_launch_report_free(&rep);
    free(sh);
    return 1;
  }
  dt_launch_report_free(&rep);

  double S = (double)sh->numel * sizeof(float);
  double bf = dt_coll_bus_factor(DT_COLL_ALL_GATHER, o.world); /* (n-1)/n, = reduce_scatter's */
  char shape[64];
  if (sh->ndim == 1) snprintf(shape, sizeof shape, "[%lld]", (long long)sh->gshape[0]);
  else
    snprintf(shape, sizeof shape, "[%lld, %lld]", (long long)sh->gshape[0],
             (long long)sh->gshape[1]);
  char sd[16], ps[32];
  snprintf(sd, sizeof sd, "S(%d)", o.dim);
  printf("# shardbench redistribute vs raw: threads, world %d, f32 %s = %.0f bytes, 1-D mesh\n",
         o.world, shape, S);
  printf("# time per call: slowest rank's mean over %d calls after %d warm-up; median, min "
         "and max over %d reps\n", o.iters, o.warmup, o.reps);
  printf("%-13s %-19s %11s %11s %11s %9s %9s\n", "# case", "variant", "time(us)", "min(us)",
         "max(us)", "algbw", "busbw");
  snprintf(ps, sizeof ps, "%s->R", sd);
  print_row(ps, v_names[V_AG_REDIST], stats(sh->t[V_AG_REDIST], o.reps), S, bf);
  print_row(ps, v_names[V_AG_RAW], stats(sh->t[V_AG_RAW], o.reps), S, bf);
  print_ratio(sh, V_AG_REDIST, V_AG_RAW, o.reps);
  print_time(ps, v_names[V_AG_TOUCH], stats(sh->t[V_AG_TOUCH], o.reps), S);
  snprintf(ps, sizeof ps, "P(sum)->%s", sd);
  print_row(ps, v_names[V_RS_REDIST], stats(sh->t[V_RS_REDIST], o.reps), S, bf);
  print_row(ps, v_names[V_RS_RAW], stats(sh->t[V_RS_RAW], o.reps), S, bf);
  print_ratio(sh, V_RS_REDIST, V_RS_RAW, o.reps);
  print_time(ps, v_names[V_RS_TOUCH], stats(sh->t[V_RS_TOUCH], o.reps), S / o.world);
  printf("# alloc+touch out: allocating, writing once and freeing a buffer of the output's size\n"
         "# on every rank at once (no collective): the share of a redistribute call that a\n"
         "# fresh output costs on this machine.\n");
  long wrong = 0;
  for (int i = 0; i < V_COUNT; i++) {
    if (sh->wrong[i])
      fprintf(stderr, "%s: %s of case %s: %ld wrong elements\n", PROG, v_names[i],
              i < V_RS_REDIST ? "S->R" : "P->S", sh->wrong[i]);
    wrong += sh->wrong[i];
  }
  printf("# check: %s\n", wrong ? "WRONG results (see stderr)" : "every result exact");
  free(sh);
  return wrong ? 1 : 0;
}
