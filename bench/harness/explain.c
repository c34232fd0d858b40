/* bench/harness/explain.c: `shardbench explain`, the look before trusting a layout.
 *
 *   shardbench explain --mesh 2x2x2 [--names dp,cp,tp] --shape 16,24 \
 *       --from 'S(0),S(1),P(sum)' --to 'R,S(0),S(0)' [--dtype f32] \
 *       [--planner greedy|min-cost] [--seed N] [--world N] [--json]
 *
 * It validates every flag before any work (one line on stderr and exit 2 for
 * bad input), then prints:
 *   1. each rank's mesh coordinate, local shape and global offset in the source
 *      and the target layout (like PyTorch's visualize_sharding), cross-checked
 *      against an independent torch.chunk reference written here, and for 1-D
 *      and 2-D tensors on small meshes a map of which ranks hold which block;
 *   2. the redistribute plan: each step (mesh dim, name, src -> dst, kind,
 *      estimated cost), PyTorch's trace string and the total estimate (with
 *      min-cost, the greedy plan's estimate next to it);
 *   3. a real run on the threads backend, one rank per mesh position: each rank
 *      builds its source shard of a deterministic global tensor, redistributes,
 *      and checks its target shard and full_tensor() against the global tensor
 *      (exactly); the program prints rank 0's ledger and the totals over ranks.
 * --json prints the same content as one JSON object. Exit codes: 0 all
 * matched, 1 a mismatch or a library failure, 2 bad input.
 *
 * This is a program: it prints and exits. It is not a benchmark (timings are
 * left out so that the output is the same run to run) and not a test driver
 * (verify/explain.sh drives it).
 */
#include "config.h"

#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

const char sb_explain_usage[] =
    "usage: shardbench explain --mesh 2x2x2 [--names dp,cp,tp] --shape 16,24\n"
    "           --from 'S(0),S(1),P(sum)' --to 'R,S(0),S(0)' [--dtype f32|f64|bf16]\n"
    "           [--planner greedy|min-cost] [--seed N] [--world N] [--json]\n"
    "\n"
    "Shows, for a tensor on a device mesh, every rank's shard in the source and\n"
    "the target layout, the redistribute plan with its estimated cost, then runs\n"
    "it on the threads backend (one rank per mesh position) and checks the\n"
    "result against the global tensor, exactly.\n"
    "\n"
    "  --mesh S      mesh sizes joined by 'x' (1..5 dims, 1..1024 ranks)\n"
    "  --names N     mesh dim names, comma separated (default dim0,dim1,...)\n"
    "  --shape S     global tensor shape, comma separated (1..8 dims, sizes >= 0)\n"
    "  --from P      source placements, one per mesh dim: S(d), R, P(sum|avg|max|min)\n"
    "  --to P        target placements (a Partial target only from R or the same P)\n"
    "  --dtype T     f32 (default), f64 or bf16\n"
    "  --planner P   greedy (PyTorch's default, the default here) or min-cost\n"
    "  --seed N      seed of the global tensor's values (default 1)\n"
    "  --world N     ranks to run; must equal the mesh's product (default: it)\n"
    "  --json        one JSON object on stdout instead of the text report\n"
    "\n"
    "\n"
    "usage: shardbench explain --mesh 4 --op NAME --input '[8,8] S(0)' [--input ...]\n"
    "           [--dim D | --dims D,D] [--keepdim] [--to 4,-1] [--eq 'bmk,bkn->bmn']\n"
    "           [--scalar X] [--i0 N] [--i1 N] [--i2 N] [--dtype f32|f64] [--planner P]\n"
    "           [--seed N] [--world N] [--backward] [--json]\n"
    "\n"
    "With --op, explains one op's sharding propagation instead: every candidate\n"
    "strategy (input placements -> output placements) with its redistribute cost\n"
    "and the chosen one, the plans of the input redistributions it causes, then\n"
    "runs the op on the threads backend and checks full_tensor(output) against\n"
    "the same op run on a 1-rank mesh (relative to max|ref|: 1e-5 f32, 1e-12 f64).\n"
    "\n"
    "  --op NAME     the op (an unknown name lists the known ones)\n"
    "  --input SPEC  one operand, '[d0,d1,...] PLACEMENTS' with one placement per\n"
    "                mesh dim as --from, optional 'i64' after them for ids (e.g.\n"
    "                '[2,5] R i64'); once per operand, in order\n"
    "  --dim D       softmax's dim; sum and mean: reduce dim D (as --dims D)\n"
    "  --dims D,D    sum, mean: dims to reduce (default all); permute: the order;\n"
    "                transpose: the two dims to swap\n"
    "  --keepdim     sum, mean: keep reduced dims as size 1\n"
    "  --to S        view, reshape: the target shape (-1 infers one dim)\n"
    "  --eq E        einsum: the equation, two operands, letters a-z\n"
    "  --scalar X    scale: the factor; rms_norm: eps; rope: theta\n"
    "  --i0 N        rope: 1 applies Llama 3.1 frequency scaling (--i1, --i2: op-specific;\n"
    "                sdpa_cp: --dim the cp mesh dim, --i1 the storage order, --i2 1 = ring)\n"
    "  --dtype T     f32 (default) or f64 for the float inputs\n"
    "  --planner P   planner of the input redistributions shown (dt_op_call runs greedy)\n"
    "  --backward    also run the op's backward with a random output gradient and\n"
    "                check the input gradients the same way\n"
    "\n"
    "Exit codes: 0 every check matched, 1 a mismatch or a run failure, 2 bad input.\n";

static const char CMD[] = "explain";

/* The run materialises the global tensor once in the program and once per rank
 * (full_tensor), plus shards: cap that at 1 GiB so a typo in --shape cannot
 * take the machine's memory. */
static const double RUN_BYTES_CAP = 1073741824.0;

/* The owner map is drawn for meshes of at most 16 ranks and at most 12 x 24
 * blocks: past that a line wraps on an 80-100 column terminal. */
enum { MAP_MAX_WORLD = 16, MAP_MAX_ROWS = 24, MAP_MAX_COLS = 12 };

/* Philox stream of the explain tensor: any fixed value; it only has to differ
 * from nothing else, since this program generates one tensor. */
enum { EX_STREAM = 7 };

/* Text widths for placement lists and shapes. */
enum { PL_STR_LEN = 128, SHAPE_STR_LEN = 160 };

typedef struct ex_opts {
  int mesh_ndim;
  int mesh_shape[DT_MESH_MAX_DIMS];
  char names[DT_MESH_MAX_DIMS][DT_MESH_NAME_LEN];
  int world;
  int ndim;
  int64_t gshape[DT_MAX_DIMS];
  dt_placement src[DT_MAX_MESH_DIMS], dst[DT_MAX_MESH_DIMS];
  dt_dtype dtype;
  dt_planner planner;
  uint64_t seed;
  bool json;
} ex_opts;

/* Per rank geometry of one layout (flat arrays [world][ndim]). */
typedef struct ex_geom {
  int64_t *lshape, *goff;
} ex_geom;

/* What each rank of the run reports back. */
typedef struct rank_out {
  dt_ledger_row *rows;   /* copy of its ledger rows of the redistribute (malloc'd) */
  size_t nrows;
  int64_t full_bad;      /* first mismatching element of full_tensor, -1: none */
  double full_got, full_want;
  bool full_shape_bad;   /* full_tensor came back with another shape */
  bool local_checked;    /* the target has no Partial dim, so the shard is a slice */
  int64_t local_bad;     /* first mismatching element of the target shard, -1: none */
  bool geom_bad;         /* the result's local shape/offset differ from the table */
} rank_out;

typedef struct run_arg {
  const ex_opts *o;
  double rtol;           /* 0: exact; else the relative bound (see tolerance()) */
  const void *global;    /* the expected global tensor, o->dtype */
  const ex_geom *src_g, *dst_g;
  rank_out *out;         /* o->world entries, indexed by rank */
} run_arg;

/* ---- small helpers ---- */

static void rank_coords(const ex_opts *o, int rank, int *coords) {
  for (int d = o->mesh_ndim - 1; d >= 0; d--) {
    coords[d] = rank % o->mesh_shape[d];
    rank /= o->mesh_shape[d];
  }
}

static void coords_str(int n, const int *c, char *buf, size_t bn) {
  size_t k = 0;
  int w = snprintf(buf, bn, "(");
  if (w > 0) k = (size_t)w;
  for (int i = 0; i < n && k < bn; i++) {
    w = snprintf(buf + k, bn - k, "%s%d", i ? ", " : "", c[i]);
    if (w < 0) break;
    k += (size_t)w;
  }
  if (k < bn) snprintf(buf + k, bn - k, ")");
}

static bool has_partial(int n, const dt_placement *pl) {
  for (int i = 0; i < n; i++)
    if (pl[i].kind == DT_PL_PARTIAL) return true;
  return false;
}

static double elem_get(dt_dtype t, const void *p, int64_t i) {
  switch (t) {
    case DT_F32: return ((const float *)p)[i];
    case DT_F64: return ((const double *)p)[i];
    case DT_BF16: return dt_bf16_to_f32(((const dt_bf16 *)p)[i]);
    default: return NAN;
  }
}

static void elem_set(dt_dtype t, void *p, int64_t i, double v) {
  switch (t) {
    case DT_F32: ((float *)p)[i] = (float)v; break;
    case DT_F64: ((double *)p)[i] = v; break;
    case DT_BF16: ((dt_bf16 *)p)[i] = dt_f32_to_bf16((float)v); break;
    default: break;
  }
}

/* got == want, or within the relative bound rtol of want (rtol 0: exact). */
static bool same_value(double got, double want, double rtol) {
  return got == want || (rtol > 0 && fabs(got - want) <= rtol * fabs(want));
}

/* The global tensor: element i is a multiple of 1/8 in [-4, 4), from Philox.
 * Six significant bits at most, so the value is exact in bf16, f32 and f64,
 * and adding zeros, max and min of equal values keep it exact: the check can
 * demand equality. */
static double global_value(uint64_t seed, uint64_t i) {
  uint32_t r[4];
  dt_philox4x32(seed, EX_STREAM, i, r);
  return ((double)(r[0] % 64u) - 32.0) / 8.0;
}

/* Calls fn(local_flat_start, global_flat_start, run_len, arg) for each
 * innermost run of the block [off, off+lshape) of a row-major tensor gshape. */
typedef void (*block_fn)(int64_t li, int64_t gi, int64_t len, void *arg);
static void for_block(int ndim, const int64_t *gshape, const int64_t *lshape, const int64_t *off,
                      block_fn fn, void *arg) {
  if (dt_shape_numel(ndim, lshape) <= 0) return;
  int64_t gstride[DT_MAX_DIMS];
  gstride[ndim - 1] = 1;
  for (int d = ndim - 2; d >= 0; d--) gstride[d] = gstride[d + 1] * gshape[d + 1];
  int64_t idx[DT_MAX_DIMS] = {0};
  int64_t inner = lshape[ndim - 1], li = 0;
  for (;;) {
    int64_t gi = 0;
    for (int d = 0; d < ndim; d++) gi += (off[d] + idx[d]) * gstride[d];
    fn(li, gi, inner, arg);
    li += inner;
    int d = ndim - 2;
    while (d >= 0 && ++idx[d] == lshape[d]) idx[d--] = 0;
    if (d < 0) break;
  }
}

typedef struct blk_copy {
  size_t es;
  const char *g;
  char *l;
} blk_copy;
static void blk_copy_fn(int64_t li, int64_t gi, int64_t len, void *arg) {
  blk_copy *b = arg;
  memcpy(b->l + (size_t)li * b->es, b->g + (size_t)gi * b->es, (size_t)len * b->es);
}

typedef struct blk_cmp {
  dt_dtype t;
  double rtol;
  const void *g, *l;
  int64_t bad; /* first bad local index */
} blk_cmp;
static void blk_cmp_fn(int64_t li, int64_t gi, int64_t len, void *arg) {
  blk_cmp *b = arg;
  if (b->bad >= 0) return;
  for (int64_t k = 0; k < len; k++)
    if (!same_value(elem_get(b->t, b->l, li + k), elem_get(b->t, b->g, gi + k), b->rtol)) {
      b->bad = li + k;
      return;
    }
}

/* Independent reference of the shard geometry (PyTorch placement_types.py
 * Shard._split_tensor): torch.chunk per mesh dim, mesh dims applied left to right on the local piece,
 * offsets adding up. Written here, apart from libdtensor, to check it. */
static void ref_local_shape_offset(const ex_opts *o, const int *coords, const dt_placement *pl,
                                   int64_t *lshape, int64_t *goff) {
  for (int d = 0; d < o->ndim; d++) {
    lshape[d] = o->gshape[d];
    goff[d] = 0;
  }
  for (int i = 0; i < o->mesh_ndim; i++) {
    if (pl[i].kind != DT_PL_SHARD) continue;
    int d = pl[i].dim, n = o->mesh_shape[i], k = coords[i];
    int64_t len = lshape[d], c = (len + n - 1) / n;
    int64_t start = (int64_t)k * c, end = (int64_t)(k + 1) * c;
    if (start > len) start = len;
    if (end > len) end = len;
    lshape[d] = end - start;
    goff[d] += start;
  }
}

/* Fills g with the library's geometry for every rank; returns the first rank
 * where the reference disagrees (-1 when none), with its reference values. */
static int geom_build(const ex_opts *o, const dt_placement *pl, ex_geom *g, int64_t *ref_l,
                      int64_t *ref_o) {
  int bad = -1;
  for (int r = 0; r < o->world; r++) {
    int coords[DT_MESH_MAX_DIMS];
    rank_coords(o, r, coords);
    int64_t *l = g->lshape + (size_t)r * (size_t)o->ndim, *of = g->goff + (size_t)r * (size_t)o->ndim;
    dt_local_shape_offset(o->ndim, o->gshape, o->mesh_ndim, o->mesh_shape, coords, pl, l, of);
    int64_t rl[DT_MAX_DIMS], ro[DT_MAX_DIMS];
    ref_local_shape_offset(o, coords, pl, rl, ro);
    if (bad < 0 && (memcmp(rl, l, (size_t)o->ndim * sizeof *l) ||
                    memcmp(ro, of, (size_t)o->ndim * sizeof *of))) {
      bad = r;
      memcpy(ref_l, rl, sizeof rl);
      memcpy(ref_o, ro, sizeof ro);
    }
  }
  return bad;
}

/* ---- how exact the check can be ---- */

/* Unit roundoff of a dtype (half the gap above 1.0). */
static double unit_roundoff(dt_dtype t) {
  switch (t) {
    case DT_F64: return 0x1p-53;
    case DT_BF16: return 0x1p-8;
    default: return 0x1p-24;
  }
}

static bool pow2(int n) { return n > 0 && (n & (n - 1)) == 0; }

/* The comparison is exact except where the semantics themselves round: a mesh
 * dim of size n > 1 that averages (P(avg) as source or target) or partitions
 * (R -> P(sum) divides by n, as PyTorch's _partition_value does) takes n terms
 * and a scale by 1/n. With the inputs used here (multiples of 1/8 under 4) the
 * terms and the scale are exact when n is a power of two in f32 and f64; when
 * n is not a power of two, or the dtype is bf16 (8-bit significand: n*v does
 * not fit), each reduction of n terms rounds up to (n-1) times (recursive
 * summation bound, Higham 4.2) and the scale and the partition once each. So
 * the bound is (sum of n over such dims + 2) unit roundoffs, relative.
 * Returns 0 (exact) or that bound, with the reason in why. */
static double tolerance(const ex_opts *o, char *why, size_t wn) {
  int terms = 0;
  size_t k = 0;
  why[0] = '\0';
  for (int i = 0; i < o->mesh_ndim; i++) {
    int n = o->mesh_shape[i];
    dt_placement a = o->src[i], b = o->dst[i];
    bool avg = (a.kind == DT_PL_PARTIAL && a.op == DT_RED_AVG) ||
               (b.kind == DT_PL_PARTIAL && b.op == DT_RED_AVG);
    bool part = b.kind == DT_PL_PARTIAL && b.op == DT_RED_SUM && a.kind != DT_PL_PARTIAL;
    if (n <= 1 || !(avg || part) || (pow2(n) && o->dtype != DT_BF16)) continue;
    terms += n;
    if (k < wn) {
      int w = snprintf(why + k, wn - k, "%s%s over %s (%d)", k ? ", " : "",
                       avg ? "P(avg)" : "R -> P(sum) divides", o->names[i], n);
      if (w > 0) k += (size_t)w;
    }
  }
  if (!terms) return 0;
  return (terms + 2) * unit_roundoff(o->dtype);
}

/* ---- flags ---- */

static int parse_flags(int argc, char **argv, ex_opts *o) {
  static const struct option lopts[] = {
      {"mesh", required_argument, 0, 'm'},  {"names", required_argument, 0, 'n'},
      {"shape", required_argument, 0, 's'}, {"from", required_argument, 0, 'f'},
      {"to", required_argument, 0, 't'},    {"dtype", required_argument, 0, 'd'},
      {"planner", required_argument, 0, 'p'}, {"seed", required_argument, 0, 'S'},
      {"world", required_argument, 0, 'w'}, {"json", no_argument, 0, 'j'},
      {"help", no_argument, 0, 'h'},        {0, 0, 0, 0}};
  const char *mesh_s = NULL, *names_s = NULL, *shape_s = NULL, *from_s = NULL, *to_s = NULL;
  const char *dtype_s = "f32", *planner_s = "greedy", *seed_s = NULL, *world_s = NULL;
  int ch = sb_getopt_repeats(CMD, argc, argv, ":h", lopts, NULL);
  if (ch) return ch;
  while ((ch = getopt_long(argc, argv, ":h", lopts, NULL)) != -1) {
    switch (ch) {
      case 'm': mesh_s = optarg; break;
      case 'n': names_s = optarg; break;
      case 's': shape_s = optarg; break;
      case 'f': from_s = optarg; break;
      case 't': to_s = optarg; break;
      case 'd': dtype_s = optarg; break;
      case 'p': planner_s = optarg; break;
      case 'S': seed_s = optarg; break;
      case 'w': world_s = optarg; break;
      case 'j': o->json = true; break;
      case 'h': fputs(sb_explain_usage, stdout); return -1;
      default: return sb_getopt_error(CMD, ch, argv, lopts);
    }
  }
  if (optind < argc)
    return sb_usage_error(CMD, NULL, "unexpected argument '%s' (flags only; see `shardbench "
                          "help explain`)", argv[optind]);
  char err[SB_ERR_LEN];
  int mrc = sb_parse_mesh_flags(CMD, mesh_s, world_s, names_s, "2x2x2", &o->mesh_ndim,
                                o->mesh_shape, &o->world, o->names);
  if (mrc) return mrc;
  if (!shape_s) return sb_usage_error(CMD, "--shape", "required, e.g. --shape 16,24");
  if (sb_parse_shape(shape_s, &o->ndim, o->gshape, err, sizeof err) != DT_OK)
    return sb_usage_error(CMD, "--shape", "%s", err);
  if (!from_s) return sb_usage_error(CMD, "--from", "required, e.g. --from 'S(0),R'");
  if (sb_parse_placements(from_s, o->mesh_ndim, o->ndim, o->src, err, sizeof err) != DT_OK)
    return sb_usage_error(CMD, "--from", "%s", err);
  if (!to_s) return sb_usage_error(CMD, "--to", "required, e.g. --to 'R,S(0)'");
  if (sb_parse_placements(to_s, o->mesh_ndim, o->ndim, o->dst, err, sizeof err) != DT_OK)
    return sb_usage_error(CMD, "--to", "%s", err);
  if (sb_parse_dtype(dtype_s, &o->dtype, err, sizeof err) != DT_OK)
    return sb_usage_error(CMD, "--dtype", "%s", err);
  if (sb_parse_planner(planner_s, &o->planner, err, sizeof err) != DT_OK)
    return sb_usage_error(CMD, "--planner", "%s", err);
  o->seed = 1;
  if (seed_s) {
    long s;
    if (sb_parse_long(seed_s, 0, 2147483647L, &s, err, sizeof err) != DT_OK)
      return sb_usage_error(CMD, "--seed", "%s", err);
    o->seed = (uint64_t)s;
  }
  double bytes = (double)dt_shape_numel(o->ndim, o->gshape) * (double)dt_dtype_size(o->dtype);
  if (bytes * (o->world + 2) > RUN_BYTES_CAP) {
    char sh[SHAPE_STR_LEN];
    sb_shape_str(o->ndim, o->gshape, false, sh, sizeof sh);
    return sb_usage_error(CMD, "--shape", "%s %s is %.0f bytes; the run holds it on each of %d "
                          "ranks, over this command's 1 GiB limit", sh,
                          dt_dtype_name(o->dtype), bytes, o->world);
  }
  return 0;
}

/* ---- the plan ---- */

static int make_plan(const ex_opts *o, dt_planner planner, sb_plan_view *v) {
  char err[DT_ERRMSG_LEN];
  int r = sb_plan_view_make(o->mesh_ndim, o->mesh_shape, o->ndim, o->gshape, o->dtype, o->src, o->dst,
                            planner, v, err, sizeof err);
  if (r == SB_PLAN_REFUSED) {
    char fs[PL_STR_LEN], ts[PL_STR_LEN];
    dt_placements_str(o->mesh_ndim, o->src, fs, sizeof fs);
    dt_placements_str(o->mesh_ndim, o->dst, ts, sizeof ts);
    return sb_usage_error(CMD, "--to", "cannot redistribute %s -> %s: %s", fs, ts, err);
  }
  if (r != SB_PLAN_OK) return fprintf(stderr, "shardbench explain: %s\n", err), SB_EXIT_FAIL;
  return 0;
}

/* ---- the run (one call per rank) ---- */

static dt_status run_rank(dt_ctx *ctx, void *argp) {
  run_arg *a = argp;
  const ex_opts *o = a->o;
  rank_out *ro = &a->out[ctx->rank];
  ro->full_bad = ro->local_bad = -1;
  size_t es = dt_dtype_size(o->dtype);
  size_t nd = (size_t)o->ndim;
  const int64_t *sl = a->src_g->lshape + (size_t)ctx->rank * nd;
  const int64_t *so = a->src_g->goff + (size_t)ctx->rank * nd;
  const int64_t *tl = a->dst_g->lshape + (size_t)ctx->rank * nd;
  const int64_t *to = a->dst_g->goff + (size_t)ctx->rank * nd;
  dt_status s = DT_OK;
  dt_mesh *mesh = NULL;
  dt_array loc, full;
  dt_tensor src, out;
  bool have_loc = false, have_full = false, have_src = false, have_out = false;

  const char *names[DT_MESH_MAX_DIMS];
  for (int i = 0; i < o->mesh_ndim; i++) names[i] = o->names[i];
  DT_CHECK_GOTO(dt_mesh_create(ctx, ctx->world, o->mesh_ndim, o->mesh_shape, names, &mesh), s,
                done);
  int coords[DT_MESH_MAX_DIMS];
  rank_coords(o, ctx->rank, coords);
  for (int i = 0; i < o->mesh_ndim; i++)
    if (dt_mesh_coord(mesh, i) != coords[i]) {
      s = dt_error(ctx, DT_ERR_INTERNAL, "explain", "mesh coordinate %d is %d, expected %d", i,
                   dt_mesh_coord(mesh, i), coords[i]);
      goto done;
    }

  /* The source shard: a slice of the global tensor; a Partial(sum) dim keeps it
   * at coordinate 0 and zeros elsewhere (their sum is the value), avg, max and
   * min keep it everywhere (the mean, max, min of equal values). */
  DT_CHECK_GOTO(dt_array_create(ctx, DT_DEV_CPU, o->dtype, o->ndim, sl, &loc), s, done);
  have_loc = true;
  blk_copy bc = {.es = es, .g = a->global, .l = loc.data};
  for_block(o->ndim, o->gshape, sl, so, blk_copy_fn, &bc);
  for (int i = 0; i < o->mesh_ndim; i++)
    if (o->src[i].kind == DT_PL_PARTIAL && o->src[i].op == DT_RED_SUM && coords[i] != 0)
      memset(loc.data, 0, dt_array_bytes(&loc));
  DT_CHECK_GOTO(dt_tensor_from_local(ctx, mesh, &loc, o->src, o->ndim, o->gshape, &src), s, done);
  have_src = true;
  dt_array_free(ctx, &loc);
  have_loc = false;

  /* The redistribute, alone on the ledger. */
  dt_ledger_clear(ctx);
  dt_ledger_enable(ctx, true);
  DT_CHECK_GOTO(dt_redistribute(ctx, &src, o->dst, o->planner, &out), s, done);
  have_out = true;
  DT_CHECK_GOTO(sb_ledger_copy(ctx, &ro->rows, &ro->nrows), s, done);
  dt_ledger_enable(ctx, false); /* full_tensor below is the check, not the plan */

  /* The target shard: where the table says, and (no Partial) the global's slice. */
  const dt_array *ol = dt_tensor_local(&out);
  ro->geom_bad = ol->ndim != o->ndim || out.ndim != o->ndim;
  for (int d = 0; !ro->geom_bad && d < o->ndim; d++)
    ro->geom_bad = ol->shape[d] != tl[d] || out.goffset[d] != to[d] || out.gshape[d] != o->gshape[d];
  ro->local_checked = !ro->geom_bad && !has_partial(o->mesh_ndim, o->dst) &&
                      ol->dtype == o->dtype && ol->dev == DT_DEV_CPU;
  if (ro->local_checked) {
    blk_cmp cmp = {.t = o->dtype, .rtol = a->rtol, .g = a->global, .l = ol->data, .bad = -1};
    for_block(o->ndim, o->gshape, tl, to, blk_cmp_fn, &cmp);
    ro->local_bad = cmp.bad;
  }

  /* full_tensor on every rank equals the global tensor, exactly. */
  DT_CHECK_GOTO(dt_tensor_full(ctx, &out, &full), s, done);
  have_full = true;
  ro->full_shape_bad = full.ndim != o->ndim || full.dtype != o->dtype;
  for (int d = 0; !ro->full_shape_bad && d < o->ndim; d++)
    ro->full_shape_bad = full.shape[d] != o->gshape[d];
  if (!ro->full_shape_bad) {
    for (int64_t i = 0; i < full.numel; i++) {
      double g = elem_get(o->dtype, full.data, i), w = elem_get(o->dtype, a->global, i);
      if (!same_value(g, w, a->rtol)) {
        ro->full_bad = i;
        ro->full_got = g;
        ro->full_want = w;
        break;
      }
    }
  }

done:
  if (have_full) dt_array_free(ctx, &full);
  if (have_loc) dt_array_free(ctx, &loc);
  if (have_out) dt_tensor_free(ctx, &out);
  if (have_src) dt_tensor_free(ctx, &src);
  if (mesh) dt_mesh_free(mesh);
  return s;
}

/* ---- ledger summaries ---- */

/* Totals over all ranks (see sb_ledger_total_add). */
static sb_ledger_total *sb_ledger_totals(const rank_out *ro, int world, size_t *n) {
  size_t cap = 0;
  for (int r = 0; r < world; r++) cap += ro[r].nrows;
  sb_ledger_total *t = calloc(cap ? cap : 1, sizeof *t);
  *n = 0;
  for (int r = 0; t && r < world; r++) sb_ledger_total_add(t, n, ro[r].rows, ro[r].nrows);
  return t;
}

/* ---- the owner map (text only) ---- */

static int cmp_i64(const void *x, const void *y) {
  int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
  return (a > b) - (a < b);
}

/* Sorted unique cut points of tensor dim d over every non-empty shard. */
static int cuts(const ex_opts *o, const ex_geom *g, int d, int64_t *out, int cap) {
  int n = 0;
  out[n++] = 0;
  out[n++] = o->gshape[d];
  for (int r = 0; r < o->world && n + 2 <= cap; r++) {
    const int64_t *l = g->lshape + (size_t)r * (size_t)o->ndim;
    if (dt_shape_numel(o->ndim, l) == 0) continue;
    int64_t of = g->goff[(size_t)r * (size_t)o->ndim + (size_t)d];
    out[n++] = of;
    out[n++] = of + l[d];
  }
  qsort(out, (size_t)n, sizeof *out, cmp_i64);
  int u = 0;
  for (int i = 0; i < n; i++)
    if (!u || out[i] != out[u - 1]) out[u++] = out[i];
  return u;
}

static bool holds(const ex_opts *o, const ex_geom *g, int r, const int64_t *lo, const int64_t *hi) {
  const int64_t *l = g->lshape + (size_t)r * (size_t)o->ndim;
  const int64_t *of = g->goff + (size_t)r * (size_t)o->ndim;
  for (int d = 0; d < o->ndim; d++)
    if (lo[d] < of[d] || hi[d] > of[d] + l[d]) return false;
  return true;
}

static void draw_map(const ex_opts *o, const char *title, const dt_placement *pl, const ex_geom *g) {
  char ps[PL_STR_LEN];
  dt_placements_str(o->mesh_ndim, pl, ps, sizeof ps);
  int64_t rc[2 * MAP_MAX_WORLD + 2], cc[2 * MAP_MAX_WORLD + 2];
  int nr = 2, nc;
  bool two = o->ndim == 2;
  if (two) {
    nr = cuts(o, g, 0, rc, 2 * MAP_MAX_WORLD + 2);
    nc = cuts(o, g, 1, cc, 2 * MAP_MAX_WORLD + 2);
  } else {
    rc[0] = 0;
    rc[1] = 1;
    nc = cuts(o, g, 0, cc, 2 * MAP_MAX_WORLD + 2);
  }
  printf("\n%s %s: which ranks hold each block%s\n", title, ps,
         has_partial(o->mesh_ndim, pl) ? " (Partial: each holds a term of the value)" : "");
  if (nr - 1 > MAP_MAX_ROWS || nc - 1 > MAP_MAX_COLS || nr < 2 || nc < 2) {
    printf("  (%d x %d blocks: too many to draw)\n", nr - 1, nc - 1);
    return;
  }
  /* Cell texts first, to size the columns. */
  enum { CELL = 48 }; /* 16 ranks as "0,1,..,15" is 37 characters */
  char cell[MAP_MAX_ROWS][MAP_MAX_COLS][CELL];
  char head[MAP_MAX_COLS][32];
  int w[MAP_MAX_COLS];
  for (int j = 0; j + 1 < nc; j++) {
    snprintf(head[j], sizeof head[j], "%s %" PRId64 ":%" PRId64, two ? "cols" : "elems", cc[j],
             cc[j + 1]);
    w[j] = (int)strlen(head[j]);
  }
  for (int i = 0; i + 1 < nr; i++)
    for (int j = 0; j + 1 < nc; j++) {
      int64_t lo[2], hi[2];
      if (two) {
        lo[0] = rc[i], hi[0] = rc[i + 1], lo[1] = cc[j], hi[1] = cc[j + 1];
      } else {
        lo[0] = cc[j], hi[0] = cc[j + 1];
      }
      size_t k = 0;
      cell[i][j][0] = '\0';
      for (int r = 0; r < o->world && k < CELL; r++)
        if (holds(o, g, r, lo, hi)) {
          int m = snprintf(cell[i][j] + k, CELL - k, "%s%d", k ? "," : "", r);
          if (m > 0) k += (size_t)m;
        }
      if (!k) snprintf(cell[i][j], CELL, "-");
      int l = (int)strlen(cell[i][j]);
      if (l > w[j]) w[j] = l;
    }
  char rh[MAP_MAX_ROWS][32];
  int rw = 0;
  for (int i = 0; i + 1 < nr; i++) {
    if (two) snprintf(rh[i], sizeof rh[i], "rows %" PRId64 ":%" PRId64, rc[i], rc[i + 1]);
    else snprintf(rh[i], sizeof rh[i], "ranks");
    int l = (int)strlen(rh[i]);
    if (l > rw) rw = l;
  }
  /* The last column is not padded: no trailing blanks. */
  printf("  %-*s", rw, "");
  for (int j = 0; j + 1 < nc; j++) printf("  %-*s", j + 2 < nc ? w[j] : 0, head[j]);
  printf("\n");
  for (int i = 0; i + 1 < nr; i++) {
    printf("  %-*s", rw, rh[i]);
    for (int j = 0; j + 1 < nc; j++) printf("  %-*s", j + 2 < nc ? w[j] : 0, cell[i][j]);
    printf("\n");
  }
}

/* ---- reporting ---- */

typedef struct report {
  const ex_opts *o;
  const ex_geom *src_g, *dst_g;
  int geom_bad_rank;             /* -1: the library's geometry matches the reference */
  char geom_msg[4 * SHAPE_STR_LEN + PL_STR_LEN + 128];
  const sb_plan_view *pv;
  const sb_plan_view *greedy;       /* NULL unless --planner min-cost */
  bool ran;
  char run_err[DT_ERRMSG_LEN + 64];
  const rank_out *ro;
  const sb_ledger_total *tot;
  size_t ntot;
  int64_t numel;
  /* verdicts */
  int full_bad_rank, local_bad_rank, geomrun_bad_rank;
  int local_checked_ranks;
  bool match;
  double rtol;                   /* 0: compared exactly */
  char tol_why[256];
} report;

static void json_plan(const ex_opts *o, const sb_plan_view *v) {
  printf("{");
  sb_json_plan_fields(v, o->names, o->mesh_ndim);
  printf("}");
}

static void print_json(const report *rp) {
  const ex_opts *o = rp->o;
  char fs[PL_STR_LEN], ts[PL_STR_LEN];
  dt_placements_str(o->mesh_ndim, o->src, fs, sizeof fs);
  dt_placements_str(o->mesh_ndim, o->dst, ts, sizeof ts);
  printf("{\"command\": \"explain\",\n \"mesh\": {\"shape\": [");
  for (int i = 0; i < o->mesh_ndim; i++) printf("%s%d", i ? ", " : "", o->mesh_shape[i]);
  printf("], \"names\": [");
  for (int i = 0; i < o->mesh_ndim; i++) {
    if (i) printf(", ");
    sb_json_str(stdout, o->names[i]);
  }
  printf("], \"ranks\": %d},\n \"tensor\": {\"shape\": ", o->world);
  sb_json_shape(o->ndim, o->gshape);
  printf(", \"dtype\": ");
  sb_json_str(stdout, dt_dtype_name(o->dtype));
  printf(", \"elements\": %" PRId64 ", \"bytes\": %" PRId64 ", \"seed\": %" PRIu64 "},\n",
         rp->numel, rp->numel * (int64_t)dt_dtype_size(o->dtype), o->seed);
  printf(" \"from\": ");
  sb_json_str(stdout, fs);
  printf(", \"to\": ");
  sb_json_str(stdout, ts);
  printf(",\n \"layouts\": [");
  for (int r = 0; r < o->world; r++) {
    int c[DT_MESH_MAX_DIMS];
    rank_coords(o, r, c);
    size_t k = (size_t)r * (size_t)o->ndim;
    printf("%s\n  {\"rank\": %d, \"coord\": [", r ? "," : "", r);
    for (int i = 0; i < o->mesh_ndim; i++) printf("%s%d", i ? ", " : "", c[i]);
    printf("], \"from\": {\"local_shape\": ");
    sb_json_shape(o->ndim, rp->src_g->lshape + k);
    printf(", \"offset\": ");
    sb_json_shape(o->ndim, rp->src_g->goff + k);
    printf("}, \"to\": {\"local_shape\": ");
    sb_json_shape(o->ndim, rp->dst_g->lshape + k);
    printf(", \"offset\": ");
    sb_json_shape(o->ndim, rp->dst_g->goff + k);
    printf("}}");
  }
  printf("],\n \"geometry_check\": {\"match\": %s", rp->geom_bad_rank < 0 ? "true" : "false");
  if (rp->geom_bad_rank >= 0) {
    printf(", \"detail\": ");
    sb_json_str(stdout, rp->geom_msg);
  }
  printf("},\n \"plan\": ");
  json_plan(o, rp->pv);
  if (rp->greedy) {
    printf(",\n \"greedy_plan\": ");
    json_plan(o, rp->greedy);
  }
  printf(",\n \"run\": {\"backend\": \"threads\", \"world\": %d, \"ok\": %s", o->world,
         rp->ran ? "true" : "false");
  if (!rp->ran) {
    printf(", \"error\": ");
    sb_json_str(stdout, rp->run_err);
    printf("},\n \"match\": false}\n");
    return;
  }
  printf(",\n  \"ledger_rank0\": ");
  sb_json_ledger_rows(rp->ro[0].rows, rp->ro[0].nrows, "   ");
  printf(",\n  \"ledger_totals\": ");
  sb_json_ledger_totals(rp->tot, rp->ntot, "   ");
  printf(",\n  \"full_tensor\": {\"match\": %s, \"elements\": %" PRId64 ", \"exact\": %s",
         rp->full_bad_rank < 0 ? "true" : "false", rp->numel, rp->rtol > 0 ? "false" : "true");
  if (rp->rtol > 0) {
    printf(", \"rtol\": ");
    sb_json_num(rp->rtol);
    printf(", \"why\": ");
    sb_json_str(stdout, rp->tol_why);
  }
  if (rp->full_bad_rank >= 0) {
    const rank_out *b = &rp->ro[rp->full_bad_rank];
    printf(", \"rank\": %d", rp->full_bad_rank);
    if (b->full_shape_bad) printf(", \"detail\": \"wrong shape or dtype\"");
    else {
      printf(", \"index\": %" PRId64 ", \"got\": ", b->full_bad);
      sb_json_num(b->full_got);
      printf(", \"expected\": ");
      sb_json_num(b->full_want);
    }
  }
  printf("},\n  \"local_shards\": {\"checked_ranks\": %d, \"match\": %s",
         rp->local_checked_ranks,
         rp->local_bad_rank < 0 && rp->geomrun_bad_rank < 0 ? "true" : "false");
  if (rp->geomrun_bad_rank >= 0)
    printf(", \"layout_differs_on_rank\": %d", rp->geomrun_bad_rank);
  if (rp->local_bad_rank >= 0) printf(", \"values_differ_on_rank\": %d", rp->local_bad_rank);
  printf("}},\n \"match\": %s}\n", rp->match ? "true" : "false");
}

static void print_plan_text(const ex_opts *o, const sb_plan_view *v) {
  printf("\nplan (%s): %d step%s, estimated %.2f us\n", dt_planner_name(v->plan.planner),
         v->plan.n, v->plan.n == 1 ? "" : "s", v->plan.cost_us);
  sb_print_plan_steps(v, o->names, o->mesh_ndim, "  ", 2);
  printf("  trace: %s\n", v->trace);
}

/* Significant digits that tell two values of a dtype apart. */
static int digits(dt_dtype t) { return t == DT_F64 ? 17 : t == DT_BF16 ? 4 : 9; }

static void print_text(const report *rp) {
  const ex_opts *o = rp->o;
  char fs[PL_STR_LEN], ts[PL_STR_LEN], ms[64], sh[SHAPE_STR_LEN];
  dt_placements_str(o->mesh_ndim, o->src, fs, sizeof fs);
  dt_placements_str(o->mesh_ndim, o->dst, ts, sizeof ts);
  sb_mesh_str(o->mesh_ndim, o->mesh_shape, ms, sizeof ms);
  sb_shape_str(o->ndim, o->gshape, false, sh, sizeof sh);
  printf("mesh %s [", ms);
  for (int i = 0; i < o->mesh_ndim; i++) printf("%s%s", i ? ", " : "", o->names[i]);
  printf("] (%d rank%s), tensor %s %s (%" PRId64 " bytes)\n", o->world, o->world == 1 ? "" : "s",
         sh, dt_dtype_name(o->dtype), rp->numel * (int64_t)dt_dtype_size(o->dtype));
  printf("from %s  to %s\n\n", fs, ts);

  /* The layout table, columns sized to their widest entry. */
  char(*cs)[64] = calloc((size_t)o->world, sizeof *cs);
  char(*fcol)[2 * SHAPE_STR_LEN + 8] = calloc((size_t)o->world, sizeof *fcol);
  char(*tcol)[2 * SHAPE_STR_LEN + 8] = calloc((size_t)o->world, sizeof *tcol);
  if (!cs || !fcol || !tcol) {
    free(cs);
    free(fcol);
    free(tcol);
    printf("(layout table: out of memory)\n");
  } else {
    int wc = (int)strlen("coord"), wf = (int)strlen("from: local shape @ offset");
    for (int r = 0; r < o->world; r++) {
      int c[DT_MESH_MAX_DIMS];
      rank_coords(o, r, c);
      coords_str(o->mesh_ndim, c, cs[r], sizeof cs[r]);
      size_t k = (size_t)r * (size_t)o->ndim;
      char a[SHAPE_STR_LEN], b[SHAPE_STR_LEN];
      sb_shape_str(o->ndim, rp->src_g->lshape + k, false, a, sizeof a);
      sb_shape_str(o->ndim, rp->src_g->goff + k, false, b, sizeof b);
      snprintf(fcol[r], sizeof fcol[r], "%s @ %s", a, b);
      sb_shape_str(o->ndim, rp->dst_g->lshape + k, false, a, sizeof a);
      sb_shape_str(o->ndim, rp->dst_g->goff + k, false, b, sizeof b);
      snprintf(tcol[r], sizeof tcol[r], "%s @ %s", a, b);
      if ((int)strlen(cs[r]) > wc) wc = (int)strlen(cs[r]);
      if ((int)strlen(fcol[r]) > wf) wf = (int)strlen(fcol[r]);
    }
    printf("%5s  %-*s  %-*s  %s\n", "rank", wc, "coord", wf, "from: local shape @ offset",
           "to: local shape @ offset");
    for (int r = 0; r < o->world; r++)
      printf("%5d  %-*s  %-*s  %s\n", r, wc, cs[r], wf, fcol[r], tcol[r]);
    free(cs);
    free(fcol);
    free(tcol);
  }
  if (rp->geom_bad_rank >= 0) printf("geometry: MISMATCH: %s\n", rp->geom_msg);
  if ((o->ndim == 1 || o->ndim == 2) && o->world <= MAP_MAX_WORLD) {
    draw_map(o, "from", o->src, rp->src_g);
    draw_map(o, "to", o->dst, rp->dst_g);
  }

  print_plan_text(o, rp->pv);
  if (rp->greedy)
    printf("  greedy plan for comparison: %d step%s, estimated %.2f us (trace %s)\n",
           rp->greedy->plan.n, rp->greedy->plan.n == 1 ? "" : "s", rp->greedy->plan.cost_us,
           rp->greedy->trace);

  printf("\nrun: threads backend, %d rank%s\n", o->world, o->world == 1 ? "" : "s");
  if (!rp->ran) {
    printf("  FAILED: %s\n", rp->run_err);
    return;
  }
  printf("  rank 0 ledger (%zu call%s):\n", rp->ro[0].nrows, rp->ro[0].nrows == 1 ? "" : "s");
  sb_print_ledger_rows(rp->ro[0].rows, rp->ro[0].nrows);
  sb_print_ledger_totals(rp->tot, rp->ntot, o->world);
  if (rp->geomrun_bad_rank >= 0)
    printf("  target layout: MISMATCH: rank %d's result has another local shape or offset than "
           "the table\n", rp->geomrun_bad_rank);
  if (rp->local_bad_rank >= 0)
    printf("  local shards: MISMATCH on rank %d at local element %" PRId64 "\n", rp->local_bad_rank,
           rp->ro[rp->local_bad_rank].local_bad);
  else if (rp->local_checked_ranks)
    printf("  local shards: match the global tensor's slices on %d rank%s\n",
           rp->local_checked_ranks, rp->local_checked_ranks == 1 ? "" : "s");
  else if (rp->geomrun_bad_rank < 0)
    printf("  local shards: not compared (a Partial target holds terms, not slices)\n");
  if (rp->full_bad_rank < 0) {
    printf("  full_tensor: match (%" PRId64 " elements) on every rank", rp->numel);
    if (rp->rtol > 0)
      printf(", within %.3g relative: %s rounds", rp->rtol, rp->tol_why);
    else
      printf(", exactly");
    printf("\n");
  } else {
    const rank_out *b = &rp->ro[rp->full_bad_rank];
    if (b->full_shape_bad)
      printf("  full_tensor: MISMATCH on rank %d: wrong shape or dtype\n", rp->full_bad_rank);
    else
      printf("  full_tensor: MISMATCH on rank %d at element %" PRId64 ": got %.*g, expected "
             "%.*g (%s)\n", rp->full_bad_rank, b->full_bad, digits(o->dtype), b->full_got,
             digits(o->dtype), b->full_want, rp->rtol > 0 ? "beyond the bound" : "exact check");
  }
}

/* ---- the subcommand ---- */

int sb_cmd_explain(int argc, char **argv) {
  /* --op NAME explains an op instead (bench/harness/explain_op.c). */
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--")) break;
    if (!strcmp(argv[i], "--op") || !strncmp(argv[i], "--op=", 5))
      return sb_cmd_explain_op(argc, argv);
  }
  ex_opts o;
  memset(&o, 0, sizeof o);
  int rc = parse_flags(argc, argv, &o);
  if (rc < 0) return SB_EXIT_OK; /* --help */
  if (rc) return rc;

  report rp;
  memset(&rp, 0, sizeof rp);
  rp.o = &o;
  rp.numel = dt_shape_numel(o.ndim, o.gshape);
  rp.full_bad_rank = rp.local_bad_rank = rp.geomrun_bad_rank = rp.geom_bad_rank = -1;

  sb_plan_view pv, gv;
  memset(&pv, 0, sizeof pv);
  memset(&gv, 0, sizeof gv);
  ex_geom sg = {0}, tg = {0};
  void *global = NULL;
  rank_out *ro = NULL;
  sb_ledger_total *tot = NULL;

  /* The plan first: a rejected target is bad input (exit 2), found before any
   * output or work. */
  if ((rc = make_plan(&o, o.planner, &pv)) != 0) goto out;
  if (o.planner != DT_PLANNER_GREEDY) {
    if ((rc = make_plan(&o, DT_PLANNER_GREEDY, &gv)) != 0) goto out;
    rp.greedy = &gv;
  }
  rp.pv = &pv;

  size_t cells = (size_t)o.world * (size_t)o.ndim;
  sg.lshape = calloc(cells, sizeof(int64_t));
  sg.goff = calloc(cells, sizeof(int64_t));
  tg.lshape = calloc(cells, sizeof(int64_t));
  tg.goff = calloc(cells, sizeof(int64_t));
  size_t es = dt_dtype_size(o.dtype);
  global = malloc(rp.numel ? (size_t)rp.numel * es : 1);
  ro = calloc((size_t)o.world, sizeof *ro);
  if (!sg.lshape || !sg.goff || !tg.lshape || !tg.goff || !global || !ro) {
    fprintf(stderr, "shardbench explain: out of memory\n");
    rc = SB_EXIT_FAIL;
    goto out;
  }
  rp.src_g = &sg;
  rp.dst_g = &tg;

  /* Geometry, checked against the reference above. */
  for (int pass = 0; pass < 2; pass++) {
    int64_t rl[DT_MAX_DIMS], rof[DT_MAX_DIMS];
    const dt_placement *pl = pass ? o.dst : o.src;
    ex_geom *g = pass ? &tg : &sg;
    int bad = geom_build(&o, pl, g, rl, rof);
    if (bad >= 0 && rp.geom_bad_rank < 0) {
      char ps[PL_STR_LEN], a[SHAPE_STR_LEN], b[SHAPE_STR_LEN], c[SHAPE_STR_LEN], d[SHAPE_STR_LEN];
      size_t k = (size_t)bad * (size_t)o.ndim;
      dt_placements_str(o.mesh_ndim, pl, ps, sizeof ps);
      sb_shape_str(o.ndim, g->lshape + k, false, a, sizeof a);
      sb_shape_str(o.ndim, g->goff + k, false, b, sizeof b);
      sb_shape_str(o.ndim, rl, false, c, sizeof c);
      sb_shape_str(o.ndim, rof, false, d, sizeof d);
      rp.geom_bad_rank = bad;
      snprintf(rp.geom_msg, sizeof rp.geom_msg,
               "rank %d under %s: libdtensor says %s @ %s, torch.chunk says %s @ %s", bad, ps, a, b,
               c, d);
    }
  }

  for (int64_t i = 0; i < rp.numel; i++) elem_set(o.dtype, global, i, global_value(o.seed, (uint64_t)i));

  /* The run. */
  rp.rtol = tolerance(&o, rp.tol_why, sizeof rp.tol_why);
  run_arg ra = {.o = &o, .rtol = rp.rtol, .global = global, .src_g = &sg, .dst_g = &tg, .out = ro};
  /* 300 s: the launcher's default; a wedged collective fails the run rather
   * than hanging the program (1024 ranks on 2 cores take seconds, not minutes). */
  dt_launch_opts lo = {.backend = DT_BACKEND_THREADS, .world = o.world, .timeout_s = 300};
  dt_launch_report lrep;
  memset(&lrep, 0, sizeof lrep);
  dt_status s = dt_launch(&lo, run_rank, &ra, &lrep);
  rp.ro = ro;
  if (s != DT_OK) {
    snprintf(rp.run_err, sizeof rp.run_err, "rank %d failed: %s (%s)", lrep.failed_rank,
             lrep.failed_msg[0] ? lrep.failed_msg : "no message", dt_status_str(s));
  } else {
    rp.ran = true;
    tot = sb_ledger_totals(ro, o.world, &rp.ntot);
    if (!tot) {
      dt_launch_report_free(&lrep);
      fprintf(stderr, "shardbench explain: out of memory\n");
      rc = SB_EXIT_FAIL;
      goto out;
    }
    rp.tot = tot;
    for (int r = 0; r < o.world; r++) {
      if (rp.full_bad_rank < 0 && (ro[r].full_bad >= 0 || ro[r].full_shape_bad))
        rp.full_bad_rank = r;
      if (rp.geomrun_bad_rank < 0 && ro[r].geom_bad) rp.geomrun_bad_rank = r;
      if (rp.local_bad_rank < 0 && ro[r].local_bad >= 0) rp.local_bad_rank = r;
      rp.local_checked_ranks += ro[r].local_checked;
    }
  }
  dt_launch_report_free(&lrep);
  rp.match = rp.ran && rp.full_bad_rank < 0 && rp.local_bad_rank < 0 && rp.geomrun_bad_rank < 0 &&
             rp.geom_bad_rank < 0;

  if (o.json) print_json(&rp);
  else print_text(&rp);
  if (!rp.ran) fprintf(stderr, "shardbench explain: run failed: %s\n", rp.run_err);
  else if (!rp.match) fprintf(stderr, "shardbench explain: MISMATCH (see the report)\n");
  rc = rp.match ? SB_EXIT_OK : SB_EXIT_FAIL;

out:
  if (ro)
    for (int r = 0; r < o.world; r++) free(ro[r].rows);
  free(ro);
  free(tot);
  free(global);
  free(sg.lshape);
  free(sg.goff);
  free(tg.lshape);
  free(tg.goff);
  sb_plan_view_free(&pv);
  sb_plan_view_free(&gv);
  return rc;
}
