/* bench/harness/explain_op.c: `shardbench explain --op NAME`, the look at one op's
 * sharding propagation (as PyTorch's _sharding_prop.py ShardingPropagator picks
 * an op strategy) before trusting it.
 *
 *   shardbench explain --mesh 4 --op matmul --input '[8,8] S(0)' \
 *       --input '[8,32] S(0)' [--dim D | --dims D,D] [--keepdim] [--to 4,-1] \
 *       [--eq 'bmk,bkn->bmn'] [--scalar X] [--i0 N] [--i1 N] [--i2 N] [--dtype f32|f64] \
 *       [--planner greedy|min-cost] [--seed N] [--world N] [--backward] [--json]
 *
 * bench/harness/explain.c routes here when --op is given. Every flag is validated
 * before any work (one line on stderr naming the flag, exit 2); the op's own
 * shape inference runs then too, so an input the op refuses is bad input. It
 * prints:
 *   1. the op, its attributes and the input specs;
 *   2. every candidate strategy dt_op_plan generated (input placements ->
 *      output placements) with its cost, the count before and after the
 *      shardability filter, and the chosen one marked;
 *   3. the redistributions of the inputs that the choice causes, each a
 *      dt_redistribute_plan with its steps, per-step cost and trace;
 *   4. a real run on the threads backend (world = mesh size): float inputs from
 *      dt_tensor_rand (its Partial(sum) holder scheme gives exact globals), i64
 *      ids from Philox in [0, bound); rank 0's ledger of dt_op_call and the
 *      totals over ranks; each output's placements, global shape, and whether
 *      dt_tensor_full(output) matches the same op run through dt_op_call on a
 *      1-rank mesh (a separate dt_launch, world 1) on the unsharded inputs.
 *   --backward also calls op->backward with a random output gradient (the
 *   output's placements, Partial -> R) and checks the input gradients the same
 *   way, with the ledger rows the backward issued.
 * --json prints the same content as one JSON object. Exit codes: 0 all
 * matched, 1 a mismatch or a library failure, 2 bad input.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char CMD[] = "explain";

/* The run holds every input and output globally once per rank (full tensors)
 * plus the reference: cap the inputs at 1 GiB over all ranks so that a typo in
 * --input cannot take the machine's memory (the same limit as explain). */
static const double RUN_BYTES_CAP = 1073741824.0;

/* The text report lists at most this many candidates (a 2-D mesh of an op
 * with 8 options per mesh dim): past that the list scrolls off a screen; the
 * chosen one is always listed, and --json lists them all. */
enum { TEXT_MAX_CANDS = 64 };

/* Philox streams: float input j uses stream IN_STREAM + j, the output
 * gradient j GOUT_STREAM + j, ids of input j ID_STREAM + j. Any distinct
 * values; the reference run uses the same ones, so it sees the same globals. */
enum { IN_STREAM = 1, GOUT_STREAM = 101, ID_STREAM = 201 };

/* Random floats are uniform in [RAND_LO, RAND_LO + RAND_SPAN): centred, so
 * sums do not grow with their length and both signs are exercised. */
static const double RAND_LO = -1.0, RAND_SPAN = 2.0;

/* Comparison bounds, relative to the largest magnitude of the reference
 * tensor: a sharded kernel sums in another order than the unsharded one
 * (Partial sums reduced across ranks, split reductions), so only f32's and
 * f64's rounding separates them: about 1e-7 and 1e-16 per term, with margin
 * for a few hundred terms. */
static const double RTOL_F32 = 1e-5, RTOL_F64 = 1e-12;

/* Text widths for placement lists, shapes and one candidate. */
enum { PL_STR_LEN = 128, SHAPE_STR_LEN = 160, CAND_STR_LEN = 768 };

/* Which attributes an op reads (ops.h documents them), as flag bits. */
enum {
  A_DIM = 1 << 0,
  A_DIMS = 1 << 1,
  A_KEEPDIM = 1 << 2,
  A_TO = 1 << 3,
  A_EQ = 1 << 4,
  A_SCALAR = 1 << 5,
  A_I0 = 1 << 6,
  A_I1 = 1 << 7,
  A_I2 = 1 << 8,
  A_ALL = (1 << 9) - 1
};
static const char *const ATTR_FLAG[] = {"--dim", "--dims", "--keepdim", "--to",
                                        "--eq",  "--scalar", "--i0", "--i1", "--i2"};
enum { N_ATTR_FLAGS = sizeof ATTR_FLAG / sizeof ATTR_FLAG[0] };

typedef struct op_attr_use {
  const char *name;
  unsigned reads;  /* flags the op reads; others are refused */
  unsigned needs;  /* flags it cannot do without */
} op_attr_use;

/* From lib/ops/ops.h. An op not listed (added later) reads every flag, each
 * mapped to its dt_op_attrs field as named. */
static const op_attr_use ATTR_USE[] = {
    {"einsum", A_EQ, A_EQ},
    {"matmul", 0, 0},
    {"linear", 0, 0},
    {"add", 0, 0},
    {"sub", 0, 0},
    {"mul", 0, 0},
    {"scale", A_SCALAR, A_SCALAR},
    {"silu", 0, 0},
    {"swiglu", 0, 0},
    {"sum", A_DIM | A_DIMS | A_KEEPDIM, 0},
    {"mean", A_DIM | A_DIMS | A_KEEPDIM, 0},
    {"softmax", A_DIM, A_DIM},
    {"view", A_TO, A_TO},
    {"reshape", A_TO, A_TO},
    {"transpose", A_DIMS, A_DIMS},
    {"permute", A_DIMS, A_DIMS},
    {"rms_norm", A_SCALAR, 0},
    {"rope", A_SCALAR | A_I0 | A_I1, 0},
    {"sdpa", 0, 0},
    {"sdpa_cp", A_DIM | A_I0 | A_I1 | A_I2, A_DIM},
    {"embedding", 0, 0},
    {"cross_entropy", 0, 0},
};

typedef struct in_desc {
  int ndim;
  int64_t gshape[DT_MAX_DIMS];
  dt_placement pl[DT_MAX_MESH_DIMS];
  dt_dtype dtype;      /* --dtype, or DT_I64 with the suffix */
  int64_t id_bound;    /* i64: ids are in [0, id_bound) */
  int64_t *ids;        /* i64: the global ids (malloc'd) */
  char text[PL_STR_LEN + SHAPE_STR_LEN + 8]; /* shape, placements, " i64" */
} in_desc;

typedef struct eo_opts {
  int mesh_ndim;
  int mesh_shape[DT_MESH_MAX_DIMS];
  char names[DT_MESH_MAX_DIMS][DT_MESH_NAME_LEN];
  int world;
  const dt_op *op;
  int n_in;
  in_desc in[DT_OP_MAX_IN];
  dt_op_attrs attrs;
  unsigned given;      /* A_* flags given */
  dt_dtype dtype;
  dt_planner planner;
  uint64_t seed;
  bool backward, json;
} eo_opts;

/* One tensor as a rank saw it after the run, checked against the reference. */
typedef struct tcheck {
  bool made;
  int ndim;
  int64_t gshape[DT_MAX_DIMS];
  dt_placement pl[DT_MAX_MESH_DIMS];
  dt_dtype dtype;
  bool shape_bad;      /* full_tensor's shape or dtype differs from the reference */
  int64_t bad;         /* first element beyond the bound, -1: none */
  double got, want;
  double max_err;      /* max |got - want| / scale */
  /* reference run only: the global values (malloc'd) and their scale */
  double *full;
  int64_t numel;
  double maxabs;
} tcheck;

typedef struct rank_res {
  dt_ledger_row *fw, *bw;  /* ledger rows of dt_op_call and of op->backward */
  size_t nfw, nbw;
  tcheck out[DT_OP_MAX_OUT];
  tcheck gin[DT_OP_MAX_IN];
  int chosen;              /* the rank's dispatch decision (index), -1: cached */
} rank_res;

typedef struct job {
  const eo_opts *o;
  bool ref;                /* the 1-rank reference run */
  const rank_res *refres;  /* the reference, for the sharded run */
  rank_res *res;           /* one per rank */
} job;

/* An input's redistribution, as dt_op_call will run it. */
typedef struct redist_view {
  bool moves;
  dt_placement dst[DT_MAX_MESH_DIMS];
  bool ok;
  char err[DT_ERRMSG_LEN];
  sb_plan_view pv, gv; /* pv: --planner; gv: what dt_op_call runs (greedy), when they differ */
} redist_view;

typedef struct report {
  const eo_opts *o;
  dt_spec out[DT_OP_MAX_OUT];
  dt_candidate chosen;
  dt_op_report rep;
  redist_view rv[DT_OP_MAX_IN];
  bool ran;
  char run_err[DT_ERRMSG_LEN + 96];
  const rank_res *res, *ref;
  sb_ledger_total *tfw, *tbw;
  size_t ntfw, ntbw;
  double rtol;
  char tol_why[192];
  int out_bad_rank[DT_OP_MAX_OUT], gin_bad_rank[DT_OP_MAX_IN];
  int decision_bad_rank;   /* a rank's dispatch chose another candidate */
  bool match;
} report;

/* ---- small helpers ---- */

static bool same_pl(int m, const dt_placement *a, const dt_placement *b) {
  for (int i = 0; i < m; i++)
    if (!dt_placement_eq(a[i], b[i])) return false;
  return true;
}

static bool is_float(dt_dtype t) { return t == DT_F32 || t == DT_F64 || t == DT_BF16; }

/* "[S(0),R]" */
static void pl_str(int m, const dt_placement *pl, char *buf, size_t n) {
  char s[PL_STR_LEN];
  dt_placements_str(m, pl, s, sizeof s);
  snprintf(buf, n, "[%s]", s);
}

/* "[S(0),R] [R,R] -> [S(0),R]" */
static void cand_str(const eo_opts *o, const dt_candidate *c, char *buf, size_t n) {
  size_t k = 0;
  buf[0] = '\0';
  for (int j = 0; j < o->op->n_in + 1 + o->op->n_out && k < n; j++) {
    char p[PL_STR_LEN + 2];
    int w;
    if (j < o->op->n_in) {
      pl_str(o->mesh_ndim, c->in[j], p, sizeof p);
      w = snprintf(buf + k, n - k, "%s%s", j ? " " : "", p);
    } else if (j == o->op->n_in) {
      w = snprintf(buf + k, n - k, " ->");
    } else {
      pl_str(o->mesh_ndim, c->out[j - o->op->n_in - 1], p, sizeof p);
      w = snprintf(buf + k, n - k, " %s", p);
    }
    if (w < 0) break;
    k += (size_t)w;
  }
}


/* Strips "rank R: " from a library message: the plan is made by the program. */

static double elem_get(dt_dtype t, const void *p, int64_t i) {
  switch (t) {
    case DT_F32: return ((const float *)p)[i];
    case DT_F64: return ((const double *)p)[i];
    case DT_BF16: return dt_bf16_to_f32(((const dt_bf16 *)p)[i]);
    case DT_I64: return (double)((const int64_t *)p)[i];
    default: return NAN;
  }
}

/* ---- flags ---- */

/* A comma list of integers in lo..hi, 1..max of them. */
static dt_status parse_ints(const char *s, long lo, long hi, int max, int64_t *out, int *n,
                            char *err, size_t errn) {
  const char *p = s;
  *n = 0;
  for (;;) {
    char *end;
    errno = 0;
    long long v = strtoll(p, &end, 10);
    if (end == p || errno == ERANGE || isspace((unsigned char)*p) || (*end && *end != ',')) {
      snprintf(err, errn, "expected integers joined by ',' like 0,1, got '%s'", s);
      return DT_ERR_INVALID;
    }
    if (v < lo || v > hi) {
      snprintf(err, errn, "%lld in '%s' is out of %ld..%ld", v, s, lo, hi);
      return DT_ERR_INVALID;
    }
    if (*n == max) {
      snprintf(err, errn, "'%s' has more than %d entries", s, max);
      return DT_ERR_INVALID;
    }
    out[(*n)++] = v;
    if (!*end) break;
    p = end + 1;
  }
  return DT_OK;
}

/* '[d0,d1,...] PLACEMENTS [i64]' (the shape may be [] for a 0-d tensor). */
static dt_status parse_input(const char *s, const eo_opts *o, in_desc *d, char *err, size_t errn) {
  const char *p = s;
  while (isspace((unsigned char)*p)) p++;
  if (*p != '[') {
    snprintf(err, errn, "expected '[d0,d1,...] PLACEMENTS' like '[8,8] S(0)', got '%s'", s);
    return DT_ERR_INVALID;
  }
  const char *close = strchr(p, ']');
  if (!close) {
    snprintf(err, errn, "no ']' closing the shape in '%s'", s);
    return DT_ERR_INVALID;
  }
  char shape[SHAPE_STR_LEN];
  size_t k = 0;
  for (const char *q = p + 1; q < close; q++)
    if (!isspace((unsigned char)*q)) {
      if (k + 1 >= sizeof shape) {
        snprintf(err, errn, "the shape of '%s' is too long", s);
        return DT_ERR_INVALID;
      }
      shape[k++] = *q;
    }
  shape[k] = '\0';
  char why[SB_ERR_LEN];
  if (k == 0) d->ndim = 0;
  else if (sb_parse_shape(shape, &d->ndim, d->gshape, why, sizeof why) != DT_OK) {
    snprintf(err, errn, "%s", why);
    return DT_ERR_INVALID;
  }
  /* The placements, then an optional dtype word. */
  char rest[PL_STR_LEN];
  const char *r = close + 1;
  while (isspace((unsigned char)*r)) r++;
  if (strlen(r) >= sizeof rest) {
    snprintf(err, errn, "the placements of '%s' are too long", s);
    return DT_ERR_INVALID;
  }
  snprintf(rest, sizeof rest, "%s", r);
  size_t l = strlen(rest);
  while (l && isspace((unsigned char)rest[l - 1])) rest[--l] = '\0';
  d->dtype = o->dtype;
  char *sp = strrchr(rest, ' ');
  if (sp && isalpha((unsigned char)sp[1])) {
    dt_dtype t;
    if (dt_dtype_parse(sp + 1, &t) != DT_OK || t != DT_I64) {
      snprintf(err, errn, "only 'i64' may follow the placements (for ids; --dtype sets the "
               "float inputs), got '%s'", sp + 1);
      return DT_ERR_INVALID;
    }
    d->dtype = DT_I64;
    *sp = '\0';
    l = strlen(rest);
    while (l && isspace((unsigned char)rest[l - 1])) rest[--l] = '\0';
  }
  if (!rest[0]) {
    snprintf(err, errn, "no placements after the shape in '%s' (one per mesh dim, e.g. '[8,8] "
             "S(0)')", s);
    return DT_ERR_INVALID;
  }
  if (sb_parse_placements(rest, o->mesh_ndim, d->ndim, d->pl, why, sizeof why) != DT_OK) {
    snprintf(err, errn, "%s", why);
    return DT_ERR_INVALID;
  }
  if (d->dtype == DT_I64)
    for (int i = 0; i < o->mesh_ndim; i++)
      if (d->pl[i].kind == DT_PL_PARTIAL) {
        snprintf(err, errn, "i64 ids are never reduced: no Partial placement in '%s'", s);
        return DT_ERR_INVALID;
      }
  char ps[PL_STR_LEN], ss[SHAPE_STR_LEN];
  dt_placements_str(o->mesh_ndim, d->pl, ps, sizeof ps);
  sb_shape_str(d->ndim, d->gshape, false, ss, sizeof ss);
  snprintf(d->text, sizeof d->text, "%s %s%s", ss, ps, d->dtype == DT_I64 ? " i64" : "");
  return DT_OK;
}

static const op_attr_use *attr_use(const char *name) {
  for (size_t i = 0; i < sizeof ATTR_USE / sizeof ATTR_USE[0]; i++)
    if (!strcmp(ATTR_USE[i].name, name)) return &ATTR_USE[i];
  return NULL;
}

static int unknown_op(const char *name) {
  int n;
  const dt_op *const *all = dt_op_all(&n);
  char list[1024];
  size_t k = 0;
  list[0] = '\0';
  for (int i = 0; i < n && k < sizeof list; i++) {
    int w = snprintf(list + k, sizeof list - k, "%s%s", i ? ", " : "", all[i]->name);
    if (w < 0) break;
    k += (size_t)w;
  }
  return sb_usage_error(CMD, "--op", "unknown op '%s'; known: %s", name, list);
}

/* Sets the attributes from the flags; see ATTR_USE. */
static int set_attrs(eo_opts *o, const op_attr_use *use, long dim, const int64_t *dims, int ndims,
                     const int64_t *to, int nto, const char *eq, double scalar, long i0, long i1,
                     long i2, bool keepdim) {
  unsigned reads = use ? use->reads : A_ALL, needs = use ? use->needs : 0;
  const char *nm = o->op->name;
  for (int b = 0; b < N_ATTR_FLAGS; b++) {
    unsigned bit = 1u << b;
    if ((o->given & bit) && !(reads & bit)) {
      char rl[128];
      size_t k = 0;
      rl[0] = '\0';
      for (int c = 0; c < N_ATTR_FLAGS && k < sizeof rl; c++)
        if (reads & (1u << c)) {
          int w = snprintf(rl + k, sizeof rl - k, "%s%s", k ? ", " : "", ATTR_FLAG[c]);
          if (w > 0) k += (size_t)w;
        }
      return sb_usage_error(CMD, ATTR_FLAG[b], "%s does not read it (it reads %s)", nm,
                            k ? rl : "no attribute flags");
    }
    if ((needs & bit) && !(o->given & bit) &&
        !(bit == A_DIM && (o->given & A_DIMS)) && !(bit == A_DIMS && (o->given & A_DIM)))
      return sb_usage_error(CMD, ATTR_FLAG[b], "required by %s", nm);
  }
  dt_op_attrs *a = &o->attrs;
  bool reduction = use && (use->reads & A_DIMS) && (use->reads & A_KEEPDIM);
  if ((o->given & A_DIM) && (o->given & A_DIMS) && use)
    return sb_usage_error(CMD, "--dim", "give --dim or --dims, not both");
  if (o->given & A_DIM) {
    if (reduction) {
      a->dims[0] = (int)dim;
      a->ndims = 1;
    } else {
      a->dim = (int)dim;
    }
  }
  if (o->given & A_DIMS) {
    if (use && !strcmp(nm, "transpose")) {
      if (ndims != 2)
        return sb_usage_error(CMD, "--dims", "transpose swaps two dims (i0,i1), got %d", ndims);
      a->i0 = (int)dims[0];
      a->i1 = (int)dims[1];
    } else {
      a->ndims = ndims;
      for (int i = 0; i < ndims; i++) a->dims[i] = (int)dims[i];
    }
  }
  if (o->given & A_KEEPDIM) a->keepdim = keepdim;
  if (o->given & A_TO) {
    a->shape_n = nto;
    for (int i = 0; i < nto; i++) a->shape[i] = to[i];
  }
  if (o->given & A_EQ) {
    if (strlen(eq) >= sizeof a->eq)
      return sb_usage_error(CMD, "--eq", "'%s' is longer than %zu characters", eq,
                            sizeof a->eq - 1);
    snprintf(a->eq, sizeof a->eq, "%s", eq);
  }
  if (o->given & A_SCALAR) a->scalar = scalar;
  if (o->given & A_I0) a->i0 = (int)i0;
  if (o->given & A_I1) a->i1 = (int)i1;
  if (o->given & A_I2) a->i2 = (int)i2;
  return 0;
}

/* Ids of input j lie in [0, bound): embedding's vocabulary is its weight's
 * first dim; otherwise (cross_entropy's targets) the first float input's last
 * dim; without one, 2^31 (a token id range). */
static int64_t id_bound(const eo_opts *o, int j) {
  for (int i = 0; i < o->n_in; i++) {
    if (i == j || !is_float(o->in[i].dtype) || o->in[i].ndim == 0) continue;
    if (!strcmp(o->op->name, "embedding")) return o->in[i].gshape[0];
    return o->in[i].gshape[o->in[i].ndim - 1];
  }
  return INT64_C(1) << 31;
}

static int parse_flags(int argc, char **argv, eo_opts *o) {
  static const struct option lopts[] = {
      {"mesh", required_argument, 0, 'm'},   {"names", required_argument, 0, 'n'},
      {"world", required_argument, 0, 'w'},  {"op", required_argument, 0, 'o'},
      {"input", required_argument, 0, 'I'},  {"dim", required_argument, 0, 'D'},
      {"dims", required_argument, 0, 'L'},   {"keepdim", no_argument, 0, 'k'},
      {"to", required_argument, 0, 't'},     {"eq", required_argument, 0, 'e'},
      {"scalar", required_argument, 0, 'x'}, {"i0", required_argument, 0, '0'},
      {"i1", required_argument, 0, '1'},     {"i2", required_argument, 0, '2'},
      {"dtype", required_argument, 0, 'd'},
      {"planner", required_argument, 0, 'p'}, {"seed", required_argument, 0, 'S'},
      {"backward", no_argument, 0, 'b'},     {"json", no_argument, 0, 'j'},
      {"shape", required_argument, 0, 's'},  {"from", required_argument, 0, 'f'},
      {"help", no_argument, 0, 'h'},         {0, 0, 0, 0}};
  const char *mesh_s = NULL, *names_s = NULL, *world_s = NULL, *op_s = NULL, *dim_s = NULL;
  const char *dims_s = NULL, *to_s = NULL, *eq_s = NULL, *scalar_s = NULL, *i0_s = NULL;
  const char *i1_s = NULL, *i2_s = NULL, *dtype_s = "f32", *planner_s = "greedy", *seed_s = NULL;
  const char *in_s[DT_OP_MAX_IN + 1];
  int n_in_s = 0;
  bool keepdim = false;
  static const char *const repeatable[] = {"input", NULL}; /* one per operand */
  int ch = sb_getopt_repeats(CMD, argc, argv, ":h", lopts, repeatable);
  if (ch) return ch;
  while ((ch = getopt_long(argc, argv, ":h", lopts, NULL)) != -1) {
    switch (ch) {
      case 'm': mesh_s = optarg; break;
      case 'n': names_s = optarg; break;
      case 'w': world_s = optarg; break;
      case 'o': op_s = optarg; break;
      case 'I':
        if (n_in_s == DT_OP_MAX_IN + 1)
          return sb_usage_error(CMD, "--input", "more than %d given (no op takes more)",
                                DT_OP_MAX_IN);
        in_s[n_in_s++] = optarg;
        break;
      case 'D': dim_s = optarg; o->given |= A_DIM; break;
      case 'L': dims_s = optarg; o->given |= A_DIMS; break;
      case 'k': keepdim = true; o->given |= A_KEEPDIM; break;
      case 't': to_s = optarg; o->given |= A_TO; break;
      case 'e': eq_s = optarg; o->given |= A_EQ; break;
      case 'x': scalar_s = optarg; o->given |= A_SCALAR; break;
      case '0': i0_s = optarg; o->given |= A_I0; break;
      case '1': i1_s = optarg; o->given |= A_I1; break;
      case '2': i2_s = optarg; o->given |= A_I2; break;
      case 'd': dtype_s = optarg; break;
      case 'p': planner_s = optarg; break;
      case 'S': seed_s = optarg; break;
      case 'b': o->backward = true; break;
      case 'j': o->json = true; break;
      case 's':
        return sb_usage_error(CMD, "--shape", "not used with --op (give each operand as --input "
                              "'[d0,d1] PLACEMENTS')");
      case 'f':
        return sb_usage_error(CMD, "--from", "not used with --op (give each operand as --input "
                              "'[d0,d1] PLACEMENTS')");
      case 'h': fputs(sb_explain_usage, stdout); return -1;
      default: return sb_getopt_error(CMD, ch, argv, lopts);
    }
  }
  if (optind < argc)
    return sb_usage_error(CMD, NULL, "unexpected argument '%s' (flags only; see `shardbench "
                          "help explain`)", argv[optind]);
  char err[SB_ERR_LEN];
  int mrc = sb_parse_mesh_flags(CMD, mesh_s, world_s, names_s, "4", &o->mesh_ndim,
                                o->mesh_shape, &o->world, o->names);
  if (mrc) return mrc;
  if (!op_s || !op_s[0]) return sb_usage_error(CMD, "--op", "empty op name");
  o->op = dt_op_find(op_s);
  if (!o->op) return unknown_op(op_s);
  if (sb_parse_dtype(dtype_s, &o->dtype, err, sizeof err) != DT_OK)
    return sb_usage_error(CMD, "--dtype", "%s", err);
  if (o->dtype != DT_F32 && o->dtype != DT_F64)
    return sb_usage_error(CMD, "--dtype", "--op runs f32 or f64 (the comparison bound is "
                          "defined for those), got '%s'", dtype_s);
  if (sb_parse_planner(planner_s, &o->planner, err, sizeof err) != DT_OK)
    return sb_usage_error(CMD, "--planner", "%s", err);
  o->seed = 1;
  if (seed_s) {
    long s;
    if (sb_parse_long(seed_s, 0, 2147483647L, &s, err, sizeof err) != DT_OK)
      return sb_usage_error(CMD, "--seed", "%s", err);
    o->seed = (uint64_t)s;
  }
  o->n_in = o->op->n_in;
  if (n_in_s != o->n_in)
    return sb_usage_error(CMD, "--input", "%s takes %d input%s, got %d (give --input once per "
                          "operand, in order)", o->op->name, o->n_in, o->n_in == 1 ? "" : "s",
                          n_in_s);
  for (int j = 0; j < n_in_s; j++)
    if (parse_input(in_s[j], o, &o->in[j], err, sizeof err) != DT_OK)
      return sb_usage_error(CMD, "--input", "input %d: %s", j, err);

  /* Attributes. */
  long dim = 0, i0 = 0, i1 = 0, i2 = 0;
  int64_t dims[DT_MAX_DIMS], to[DT_MAX_DIMS];
  int ndims = 0, nto = 0;
  double scalar = 0;
  if (dim_s && sb_parse_long(dim_s, -DT_MAX_DIMS, DT_MAX_DIMS - 1, &dim, err, sizeof err) != DT_OK)
    return sb_usage_error(CMD, "--dim", "%s", err);
  if (dims_s && parse_ints(dims_s, -DT_MAX_DIMS, DT_MAX_DIMS - 1, DT_MAX_DIMS, dims, &ndims, err,
                           sizeof err) != DT_OK)
    return sb_usage_error(CMD, "--dims", "%s", err);
  /* A view dim is at most 2^40 elements, as --shape's (explain). */
  if (to_s && parse_ints(to_s, -1, 1L << 40, DT_MAX_DIMS, to, &nto, err, sizeof err) != DT_OK)
    return sb_usage_error(CMD, "--to", "%s", err);
  if (scalar_s) {
    char *end;
    errno = 0;
    scalar = strtod(scalar_s, &end);
    if (end == scalar_s || *end || errno == ERANGE || !isfinite(scalar))
      return sb_usage_error(CMD, "--scalar", "expected a finite number, got '%s'", scalar_s);
  }
  if (i0_s && sb_parse_long(i0_s, -2147483647L, 2147483647L, &i0, err, sizeof err) != DT_OK)
    return sb_usage_error(CMD, "--i0", "%s", err);
  if (i1_s && sb_parse_long(i1_s, -2147483647L, 2147483647L, &i1, err, sizeof err) != DT_OK)
    return sb_usage_error(CMD, "--i1", "%s", err);
  if (i2_s && sb_parse_long(i2_s, -2147483647L, 2147483647L, &i2, err, sizeof err) != DT_OK)
    return sb_usage_error(CMD, "--i2", "%s", err);
  int rc = set_attrs(o, attr_use(o->op->name), dim, dims, ndims, to, nto, eq_s, scalar, i0, i1,
                     i2, keepdim);
  if (rc) return rc;

  if (o->backward && !o->op->backward)
    return sb_usage_error(CMD, "--backward", "%s has no backward", o->op->name);

  double bytes = 0;
  for (int j = 0; j < o->n_in; j++)
    bytes += (double)dt_shape_numel(o->in[j].ndim, o->in[j].gshape) *
             (double)dt_dtype_size(o->in[j].dtype);
  if (bytes * (o->world + 2) > RUN_BYTES_CAP)
    return sb_usage_error(CMD, "--input", "the inputs are %.0f bytes; the run holds them on each "
                          "of %d ranks, over this command's 1 GiB limit", bytes, o->world);
  for (int j = 0; j < o->n_in; j++)
    if (o->in[j].dtype == DT_I64) {
      o->in[j].id_bound = id_bound(o, j);
      if (o->in[j].id_bound <= 0)
        return sb_usage_error(CMD, "--input", "input %d: no valid id: %s's vocabulary is empty", j,
                              o->op->name);
    }
  return 0;
}

/* ---- the plan ---- */

static int make_decision(const eo_opts *o, report *rp) {
  dt_spec in[DT_OP_MAX_IN];
  memset(in, 0, sizeof in);
  for (int j = 0; j < o->n_in; j++) {
    in[j].mesh_ndim = o->mesh_ndim;
    memcpy(in[j].pl, o->in[j].pl, sizeof in[j].pl);
    for (int i = 0; i < o->mesh_ndim; i++) in[j].mesh_shape[i] = o->mesh_shape[i];
    in[j].ndim = o->in[j].ndim;
    memcpy(in[j].gshape, o->in[j].gshape, sizeof in[j].gshape);
    in[j].dtype = o->in[j].dtype;
  }
  rp->rep.cand = malloc(sizeof(dt_candidate) * DT_OP_MAX_CANDIDATES);
  if (!rp->rep.cand) return fprintf(stderr, "shardbench explain: out of memory\n"), SB_EXIT_FAIL;
  rp->rep.max_cand = DT_OP_MAX_CANDIDATES;
  dt_ctx pctx;
  dt_ctx_init(&pctx, 0, 1);
  dt_status s = dt_op_plan(&pctx, o->op, &o->attrs, o->mesh_shape, in, rp->out, &rp->chosen,
                           &rp->rep);
  if (s != DT_OK) {
    const char *m = sb_strip_rank(dt_last_error(&pctx));
    int rc = sb_usage_error(CMD, "--op", "%s refuses these inputs: %s", o->op->name,
                            m[0] ? m : dt_status_str(s));
    dt_ctx_release(&pctx);
    return rc;
  }
  dt_ctx_release(&pctx);
  if (rp->rep.chosen < 0 || rp->rep.chosen >= rp->rep.n_candidates)
    return fprintf(stderr, "shardbench explain: dt_op_plan chose candidate %d of %d\n",
                   rp->rep.chosen, rp->rep.n_candidates),
           SB_EXIT_FAIL;
  return 0;
}

/* The ops that divide by a count (mean; cross_entropy is a mean over rows) give
 * 0/0 = NaN from no elements, in PyTorch as here (torch.mean of an empty tensor
 * is nan): an output element computed from an empty input has no value to
 * compare, so such an input is refused. Other ops on empty inputs run and are
 * compared exactly (a sum of nothing is 0, an empty output has nothing to
 * differ). */
static int refuse_empty_mean(const eo_opts *o, const report *rp) {
  if (strcmp(o->op->name, "mean") && strcmp(o->op->name, "cross_entropy")) return 0;
  int64_t out_elems = 0;
  for (int j = 0; j < o->op->n_out; j++) out_elems += dt_shape_numel(rp->out[j].ndim, rp->out[j].gshape);
  for (int j = 0; j < o->n_in; j++)
    if (dt_shape_numel(o->in[j].ndim, o->in[j].gshape) == 0 && out_elems > 0)
      return sb_usage_error(CMD, "--input", "input %d is empty: %s of no elements is 0/0 (NaN, as "
                            "in PyTorch), nothing to compare", j, o->op->name);
  return 0;
}

/* The plans of the inputs the chosen candidate moves. A plan error is shown,
 * not fatal: the run then shows what dt_op_call does with it. */
static void make_redists(const eo_opts *o, report *rp) {
  for (int j = 0; j < o->n_in; j++) {
    redist_view *v = &rp->rv[j];
    const in_desc *d = &o->in[j];
    memcpy(v->dst, rp->chosen.in[j], sizeof v->dst);
    v->moves = !same_pl(o->mesh_ndim, d->pl, v->dst);
    if (!v->moves) continue;
    v->ok = sb_plan_view_make(o->mesh_ndim, o->mesh_shape, d->ndim, d->gshape, d->dtype, d->pl, v->dst,
                              o->planner, &v->pv, v->err, sizeof v->err) == SB_PLAN_OK;
    if (v->ok && o->planner != DT_PLANNER_GREEDY)
      v->ok = sb_plan_view_make(o->mesh_ndim, o->mesh_shape, d->ndim, d->gshape, d->dtype, d->pl,
                                v->dst, DT_PLANNER_GREEDY, &v->gv, v->err, sizeof v->err) == SB_PLAN_OK;
  }
}

/* ---- the run (one call per rank; the reference is a run of world 1) ---- */

/* Records t's layout, gathers it, and stores (reference) or compares it. */
static dt_status check_tensor(dt_ctx *ctx, const job *jb, const dt_tensor *t, tcheck *c,
                              const tcheck *want) {
  const eo_opts *o = jb->o;
  c->made = true;
  c->ndim = t->ndim;
  memcpy(c->gshape, t->gshape, sizeof c->gshape);
  memcpy(c->pl, t->pl, sizeof c->pl);
  c->dtype = t->dtype;
  c->bad = -1;
  dt_array full;
  DT_CHECK(dt_tensor_full(ctx, t, &full));
  dt_status s = DT_OK;
  if (jb->ref) {
    c->numel = full.numel;
    c->full = malloc((size_t)(full.numel ? full.numel : 1) * sizeof *c->full);
    if (!c->full) {
      s = dt_error(ctx, DT_ERR_NOMEM, "explain", "cannot keep the reference");
    } else {
      for (int64_t i = 0; i < full.numel; i++) {
        c->full[i] = elem_get(full.dtype, full.data, i);
        if (fabs(c->full[i]) > c->maxabs) c->maxabs = fabs(c->full[i]);
      }
    }
  } else {
    c->shape_bad = !want->made || full.ndim != want->ndim || full.dtype != want->dtype ||
                   full.numel != want->numel;
    for (int d = 0; !c->shape_bad && d < full.ndim; d++)
      c->shape_bad = full.shape[d] != want->gshape[d];
    if (!c->shape_bad) {
      double rtol = full.dtype == DT_F64 ? RTOL_F64 : full.dtype == DT_I64 ? 0 : RTOL_F32;
      double scale = want->maxabs > 0 ? want->maxabs : 1;
      (void)o;
      for (int64_t i = 0; i < full.numel; i++) {
        double g = elem_get(full.dtype, full.data, i), w = want->full[i];
        double e = fabs(g - w) / scale;
        if (!(e <= c->max_err)) c->max_err = isnan(e) ? INFINITY : e;
        if (c->bad < 0 && !(g == w || e <= rtol)) {
          c->bad = i;
          c->got = g;
          c->want = w;
        }
      }
    }
  }
  dt_array_free(ctx, &full);
  return s;
}

/* Input j on this rank's mesh: float from dt_tensor_rand, ids sliced from the
 * program's global array. */
static dt_status make_input(dt_ctx *ctx, const job *jb, dt_mesh *mesh, int m, const int *mshape,
                            int j, const dt_placement *pl, dt_tensor *t) {
  const in_desc *d = &jb->o->in[j];
  if (d->dtype != DT_I64)
    return dt_tensor_rand(ctx, mesh, d->ndim, d->gshape, d->dtype, pl, jb->o->seed,
                          IN_STREAM + (uint64_t)j, DT_RNG_UNIFORM, RAND_LO, RAND_SPAN, t);
  int coords[DT_MESH_MAX_DIMS];
  for (int i = 0; i < m; i++) coords[i] = dt_mesh_coord(mesh, i);
  int64_t ls[DT_MAX_DIMS], off[DT_MAX_DIMS], zero[DT_MAX_DIMS] = {0};
  dt_local_shape_offset(d->ndim, d->gshape, m, mshape, coords, pl, ls, off);
  dt_array loc;
  DT_CHECK(dt_array_create(ctx, DT_DEV_CPU, DT_I64, d->ndim, ls, &loc));
  if (dt_shape_numel(d->ndim, ls) > 0)
    dt_copy_box(sizeof(int64_t), d->ndim, loc.data, ls, zero, d->ids, d->gshape, off, ls);
  dt_status s = dt_tensor_from_local(ctx, mesh, &loc, pl, d->ndim, d->gshape, t);
  dt_array_free(ctx, &loc);
  return s;
}

static dt_status run_rank(dt_ctx *ctx, void *argp) {
  job *jb = argp;
  const eo_opts *o = jb->o;
  const dt_op *op = o->op;
  rank_res *rr = &jb->res[ctx->rank];
  rr->chosen = -1;
  int m = jb->ref ? 1 : o->mesh_ndim;
  int ref_shape[1] = {1};
  const int *mshape = jb->ref ? ref_shape : o->mesh_shape;
  const char *names[DT_MESH_MAX_DIMS];
  if (jb->ref) names[0] = "ref";
  else
    for (int i = 0; i < m; i++) names[i] = o->names[i];
  dt_status s = DT_OK;
  dt_mesh *mesh = NULL;
  dt_tensor in[DT_OP_MAX_IN], out[DT_OP_MAX_OUT], gout[DT_OP_MAX_OUT], gin[DT_OP_MAX_IN];
  int n_in_made = 0, n_gout_made = 0;
  bool out_made = false, gin_made[DT_OP_MAX_IN] = {false};
  memset(in, 0, sizeof in);
  memset(out, 0, sizeof out);
  memset(gout, 0, sizeof gout);
  memset(gin, 0, sizeof gin);

  DT_CHECK_GOTO(dt_mesh_create(ctx, ctx->world, m, mshape, names, &mesh), s, done);
  for (int j = 0; j < o->n_in; j++) {
    dt_placement pl[DT_MAX_MESH_DIMS];
    for (int i = 0; i < m; i++) pl[i] = jb->ref ? dt_replicate() : o->in[j].pl[i];
    DT_CHECK_GOTO(make_input(ctx, jb, mesh, m, mshape, j, pl, &in[j]), s, done);
    n_in_made++;
  }
  const dt_tensor *inp[DT_OP_MAX_IN];
  dt_tensor *outp[DT_OP_MAX_OUT];
  for (int j = 0; j < o->n_in; j++) inp[j] = &in[j];
  for (int j = 0; j < op->n_out; j++) outp[j] = &out[j];

  /* The op alone on the ledger. */
  dt_op_report rep;
  memset(&rep, 0, sizeof rep);
  dt_ctx_set_phase(ctx, "forward");
  dt_ledger_clear(ctx);
  dt_ledger_enable(ctx, true);
  DT_CHECK_GOTO(dt_op_call(ctx, op, &o->attrs, inp, outp, &rep), s, done);
  out_made = true;
  dt_ledger_enable(ctx, false);
  if (!rep.cached) rr->chosen = rep.chosen;
  DT_CHECK_GOTO(sb_ledger_copy(ctx, &rr->fw, &rr->nfw), s, done);
  for (int j = 0; j < op->n_out; j++)
    DT_CHECK_GOTO(check_tensor(ctx, jb, &out[j], &rr->out[j],
                               jb->ref ? NULL : &jb->refres->out[j]), s, done);

  if (o->backward) {
    const dt_tensor *goutp[DT_OP_MAX_OUT], *outc[DT_OP_MAX_OUT];
    dt_tensor *ginp[DT_OP_MAX_IN];
    for (int j = 0; j < op->n_out; j++) {
      dt_placement pl[DT_MAX_MESH_DIMS];
      for (int i = 0; i < m; i++)
        pl[i] = out[j].pl[i].kind == DT_PL_PARTIAL ? dt_replicate() : out[j].pl[i];
      DT_CHECK_GOTO(dt_tensor_rand(ctx, mesh, out[j].ndim, out[j].gshape, out[j].dtype, pl, o->seed,
                                   GOUT_STREAM + (uint64_t)j, DT_RNG_UNIFORM, RAND_LO, RAND_SPAN,
                                   &gout[j]), s, done);
      n_gout_made++;
      goutp[j] = &gout[j];
      outc[j] = &out[j];
    }
    for (int j = 0; j < o->n_in; j++) ginp[j] = is_float(o->in[j].dtype) ? &gin[j] : NULL;
    dt_ctx_set_phase(ctx, "backward");
    dt_ledger_clear(ctx);
    dt_ledger_enable(ctx, true);
    DT_CHECK_GOTO(op->backward(ctx, &o->attrs, inp, outc, goutp, ginp), s, done);
    for (int j = 0; j < o->n_in; j++) gin_made[j] = ginp[j] != NULL;
    dt_ledger_enable(ctx, false);
    DT_CHECK_GOTO(sb_ledger_copy(ctx, &rr->bw, &rr->nbw), s, done);
    for (int j = 0; j < o->n_in; j++)
      if (gin_made[j])
        DT_CHECK_GOTO(check_tensor(ctx, jb, &gin[j], &rr->gin[j],
                                   jb->ref ? NULL : &jb->refres->gin[j]), s, done);
  }

done:
  dt_ledger_enable(ctx, false);
  for (int j = 0; j < o->n_in; j++)
    if (gin_made[j]) dt_tensor_free(ctx, &gin[j]);
  for (int j = 0; j < n_gout_made; j++) dt_tensor_free(ctx, &gout[j]);
  if (out_made)
    for (int j = 0; j < op->n_out; j++) dt_tensor_free(ctx, &out[j]);
  for (int j = 0; j < n_in_made; j++) dt_tensor_free(ctx, &in[j]);
  if (mesh) dt_mesh_free(mesh);
  return s;
}

static dt_status launch(job *jb, int world, char *err, size_t errn) {
  /* 300 s: the launcher's default; a wedged collective fails the run rather
   * than hanging the program. */
  dt_launch_opts lo = {.backend = DT_BACKEND_THREADS, .world = world, .timeout_s = 300};
  dt_launch_report lrep;
  memset(&lrep, 0, sizeof lrep);
  dt_status s = dt_launch(&lo, run_rank, jb, &lrep);
  if (s != DT_OK)
    snprintf(err, errn, "%s: rank %d failed: %s (%s)", jb->ref ? "reference run (1 rank)" : "run",
             lrep.failed_rank, lrep.failed_msg[0] ? lrep.failed_msg : "no message",
             dt_status_str(s));
  dt_launch_report_free(&lrep);
  return s;
}

static void free_res(rank_res *r, int n) {
  if (!r) return;
  for (int k = 0; k < n; k++) {
    free(r[k].fw);
    free(r[k].bw);
    for (int j = 0; j < DT_OP_MAX_OUT; j++) free(r[k].out[j].full);
    for (int j = 0; j < DT_OP_MAX_IN; j++) free(r[k].gin[j].full);
  }
  free(r);
}

/* Totals over all ranks (see sb_ledger_total_add) of the forward or backward rows. */
static sb_ledger_total *ledger_totals(const rank_res *rr, int world, bool bw, size_t *n) {
  size_t cap = 0;
  for (int r = 0; r < world; r++) cap += bw ? rr[r].nbw : rr[r].nfw;
  sb_ledger_total *t = calloc(cap ? cap : 1, sizeof *t);
  *n = 0;
  for (int r = 0; t && r < world; r++)
    sb_ledger_total_add(t, n, bw ? rr[r].bw : rr[r].fw, bw ? rr[r].nbw : rr[r].nfw);
  return t;
}

/* ---- text report ---- */

static int digits(dt_dtype t) { return t == DT_F64 ? 17 : 9; } /* tell two values apart */

static void print_attrs_text(const eo_opts *o) {
  const dt_op_attrs *a = &o->attrs;
  if (!o->given) return;
  printf("  attrs:");
  if (a->ndims) {
    printf(" dims=");
    for (int i = 0; i < a->ndims; i++) printf("%s%d", i ? "," : "", a->dims[i]);
  }
  if ((o->given & A_DIM) && !a->ndims) printf(" dim=%d", a->dim);
  if (o->given & A_KEEPDIM) printf(" keepdim=%s", a->keepdim ? "true" : "false");
  if (a->shape_n) {
    printf(" shape=");
    for (int i = 0; i < a->shape_n; i++) printf("%s%" PRId64, i ? "," : "", a->shape[i]);
  }
  if (o->given & A_EQ) printf(" eq=%s", a->eq);
  if (o->given & A_SCALAR) printf(" scalar=%.17g", a->scalar);
  if ((o->given & (A_I0 | A_I1)) || (o->given & A_DIMS && !a->ndims))
    printf(" i0=%d i1=%d", a->i0, a->i1);
  if (o->given & A_I2) printf(" i2=%d", a->i2);
  printf("\n");
}

static void print_check(const report *rp, const char *what, const tcheck *c0, const tcheck *ref,
                        const dt_placement *planned, int bad_rank, const tcheck *b) {
  const eo_opts *o = rp->o;
  char ps[PL_STR_LEN + 2], ss[SHAPE_STR_LEN];
  pl_str(o->mesh_ndim, c0->pl, ps, sizeof ps);
  sb_shape_str(c0->ndim, c0->gshape, false, ss, sizeof ss);
  printf("  %s: %s %s %s\n", what, ps, ss, dt_dtype_name(c0->dtype));
  double rtol = c0->dtype == DT_F64 ? RTOL_F64 : c0->dtype == DT_I64 ? 0 : RTOL_F32;
  if (bad_rank < 0) {
    printf("    full_tensor: match (%" PRId64 " elements) on every rank vs %s on 1 rank", ref->numel,
           o->op->name);
    if (rtol > 0)
      printf(", max |got - ref| = %.3g x max|ref| (%.4g); bound %.0e, %s", c0->max_err,
             ref->maxabs, rtol, rp->tol_why);
    else printf(", exactly");
    printf("\n");
    return;
  }
  if (!b->made)
    printf("    MISMATCH on rank %d: %s, but the 1-rank reference %s\n", bad_rank,
           ref->made ? "not produced" : "produced", ref->made ? "produced it" : "did not");
  else if (planned && !same_pl(o->mesh_ndim, b->pl, planned))
    printf("    placements: MISMATCH on rank %d: dt_op_call gave other placements than "
           "dt_op_plan\n", bad_rank);
  else if (b->shape_bad)
    printf("    full_tensor: MISMATCH on rank %d: shape or dtype differs from the 1-rank "
           "reference\n", bad_rank);
  else
    printf("    full_tensor: MISMATCH on rank %d at element %" PRId64 ": got %.*g, expected %.*g "
           "(bound %.0e of max|ref| %.4g)\n", bad_rank, b->bad, digits(c0->dtype), b->got,
           digits(c0->dtype), b->want, rtol, ref->maxabs);
}

static void print_text(const report *rp) {
  const eo_opts *o = rp->o;
  char ms[64];
  sb_mesh_str(o->mesh_ndim, o->mesh_shape, ms, sizeof ms);
  printf("op %s on mesh %s [", o->op->name, ms);
  for (int i = 0; i < o->mesh_ndim; i++) printf("%s%s", i ? ", " : "", o->names[i]);
  printf("] (%d rank%s), %s\n", o->world, o->world == 1 ? "" : "s", dt_dtype_name(o->dtype));
  print_attrs_text(o);
  for (int j = 0; j < o->n_in; j++) printf("  input %d: %s\n", j, o->in[j].text);
  for (int j = 0; j < o->op->n_out; j++) {
    char ss[SHAPE_STR_LEN];
    sb_shape_str(rp->out[j].ndim, rp->out[j].gshape, false, ss, sizeof ss);
    printf("  output %d: %s %s\n", j, ss, dt_dtype_name(rp->out[j].dtype));
  }

  const dt_op_report *rep = &rp->rep;
  printf("\nstrategies: %d generated, %d after the shardability filter; cost = the "
         "inputs' redistribute cost\n", rep->n_generated, rep->n_candidates);
  int listed = rep->n_candidates < rep->max_cand ? rep->n_candidates : rep->max_cand;
  int width = 0; /* the strategy column, sized to its widest entry */
  for (int pass = 0; pass < 2; pass++)
    for (int c = 0; c < listed; c++) {
      if (c >= TEXT_MAX_CANDS && c != rep->chosen) continue;
      char cs[CAND_STR_LEN];
      cand_str(o, &rep->cand[c], cs, sizeof cs);
      if (!pass) {
        if ((int)strlen(cs) > width) width = (int)strlen(cs);
        continue;
      }
      printf("  %s %4d  %-*s %12.4f us%s\n", c == rep->chosen ? "*" : " ", c, width, cs,
             rep->cand[c].cost_us, c == rep->chosen ? "  <- chosen" : "");
    }
  if (listed > TEXT_MAX_CANDS)
    printf("  (%d more not listed; --json lists them all)\n",
           listed - TEXT_MAX_CANDS - (rep->chosen >= TEXT_MAX_CANDS));
  char cs[CAND_STR_LEN];
  cand_str(o, &rp->chosen, cs, sizeof cs);
  printf("chosen: %s, estimated %.4f us (first of the cheapest in generation order)\n", cs,
         rep->cand[rep->chosen].cost_us);

  printf("\nredistributions of the inputs (dt_op_call runs the greedy plan):\n");
  bool any = false;
  for (int j = 0; j < o->n_in; j++) {
    const redist_view *v = &rp->rv[j];
    if (!v->moves) continue;
    any = true;
    char a[PL_STR_LEN + 2], b[PL_STR_LEN + 2];
    pl_str(o->mesh_ndim, o->in[j].pl, a, sizeof a);
    pl_str(o->mesh_ndim, v->dst, b, sizeof b);
    printf("  input %d: %s -> %s\n", j, a, b);
    if (!v->ok) {
      printf("    cannot plan: %s\n", v->err);
      continue;
    }
    printf("    plan (%s): %d step%s, estimated %.4f us\n", dt_planner_name(v->pv.plan.planner),
           v->pv.plan.n, v->pv.plan.n == 1 ? "" : "s", v->pv.plan.cost_us);
    sb_print_plan_steps(&v->pv, o->names, o->mesh_ndim, "      ", 4);
    printf("    trace: %s\n", v->pv.trace);
    if (v->gv.trace)
      printf("    greedy plan (what dt_op_call runs): %d step%s, estimated %.4f us, trace %s\n",
             v->gv.plan.n, v->gv.plan.n == 1 ? "" : "s", v->gv.plan.cost_us, v->gv.trace);
  }
  if (!any) printf("  (none: every input is already where the chosen strategy wants it)\n");

  printf("\nrun: threads backend, %d rank%s; reference: the same op on a 1-rank mesh\n", o->world,
         o->world == 1 ? "" : "s");
  if (!rp->ran) {
    printf("  FAILED: %s\n", rp->run_err);
    return;
  }
  if (rp->decision_bad_rank >= 0)
    printf("  dispatch: MISMATCH: rank %d's dt_op_call chose candidate %d, dt_op_plan %d\n",
           rp->decision_bad_rank, rp->res[rp->decision_bad_rank].chosen, rep->chosen);
  printf("  forward: rank 0 ledger of dt_op_call (%zu call%s)%s\n", rp->res[0].nfw,
         rp->res[0].nfw == 1 ? "" : "s", rp->res[0].nfw ? ":" : "");
  sb_print_ledger_rows(rp->res[0].fw, rp->res[0].nfw);
  sb_print_ledger_totals(rp->tfw, rp->ntfw, o->world);
  for (int j = 0; j < o->op->n_out; j++) {
    char w[32];
    snprintf(w, sizeof w, "output %d", j);
    int br = rp->out_bad_rank[j];
    print_check(rp, w, &rp->res[0].out[j], &rp->ref[0].out[j], rp->out[j].pl, br,
                br >= 0 ? &rp->res[br].out[j] : NULL);
  }
  if (!o->backward) return;
  printf("\nbackward: output gradient%s random with the output's placements (Partial -> R)\n",
         o->op->n_out == 1 ? "" : "s");
  printf("  backward: rank 0 ledger of %s's backward (%zu call%s)%s\n", o->op->name,
         rp->res[0].nbw, rp->res[0].nbw == 1 ? "" : "s", rp->res[0].nbw ? ":" : "");
  sb_print_ledger_rows(rp->res[0].bw, rp->res[0].nbw);
  sb_print_ledger_totals(rp->tbw, rp->ntbw, o->world);
  for (int j = 0; j < o->n_in; j++) {
    char w[32];
    snprintf(w, sizeof w, "grad input %d", j);
    if (!rp->res[0].gin[j].made) {
      printf("  %s: none (%s)\n", w, is_float(o->in[j].dtype) ? "not produced" : "ids");
      continue;
    }
    int br = rp->gin_bad_rank[j];
    print_check(rp, w, &rp->res[0].gin[j], &rp->ref[0].gin[j], NULL, br,
                br >= 0 ? &rp->res[br].gin[j] : NULL);
  }
}

/* ---- JSON report ---- */


static void json_pl(int m, const dt_placement *pl) {
  printf("[");
  for (int i = 0; i < m; i++) {
    char s[32];
    dt_placement_str(pl[i], s, sizeof s);
    if (i) printf(", ");
    sb_json_str(stdout, s);
  }
  printf("]");
}

static void json_check(const report *rp, const tcheck *c0, const tcheck *ref, int bad_rank,
                       const tcheck *bad) {
  const eo_opts *o = rp->o;
  double rtol = c0->dtype == DT_F64 ? RTOL_F64 : c0->dtype == DT_I64 ? 0 : RTOL_F32;
  printf("{\"placements\": ");
  json_pl(o->mesh_ndim, c0->pl);
  printf(", \"shape\": ");
  sb_json_shape(c0->ndim, c0->gshape);
  printf(", \"dtype\": ");
  sb_json_str(stdout, dt_dtype_name(c0->dtype));
  printf(", \"elements\": %" PRId64 ", \"match\": %s, \"rtol\": ", ref->numel,
         bad_rank < 0 ? "true" : "false");
  sb_json_num(rtol);
  printf(", \"scale\": ");
  sb_json_num(ref->maxabs);
  printf(", \"max_error\": ");
  sb_json_num(c0->max_err);
  printf(", \"why\": ");
  sb_json_str(stdout, rtol > 0 ? rp->tol_why : "ids compare exactly");
  if (bad_rank >= 0) {
    printf(", \"rank\": %d", bad_rank);
    if (bad->shape_bad) printf(", \"detail\": \"shape or dtype differs from the reference\"");
    else {
      printf(", \"index\": %" PRId64 ", \"got\": ", bad->bad);
      sb_json_num(bad->got);
      printf(", \"expected\": ");
      sb_json_num(bad->want);
    }
  }
  printf("}");
}

static void print_json(const report *rp) {
  const eo_opts *o = rp->o;
  const dt_op_attrs *a = &o->attrs;
  printf("{\"command\": \"explain\",\n \"mesh\": {\"shape\": [");
  for (int i = 0; i < o->mesh_ndim; i++) printf("%s%d", i ? ", " : "", o->mesh_shape[i]);
  printf("], \"names\": [");
  for (int i = 0; i < o->mesh_ndim; i++) {
    if (i) printf(", ");
    sb_json_str(stdout, o->names[i]);
  }
  printf("], \"ranks\": %d},\n \"op\": ", o->world);
  sb_json_str(stdout, o->op->name);
  printf(",\n \"attrs\": {\"dim\": %d, \"dims\": [", a->dim);
  for (int i = 0; i < a->ndims; i++) printf("%s%d", i ? ", " : "", a->dims[i]);
  printf("], \"keepdim\": %s, \"shape\": ", a->keepdim ? "true" : "false");
  sb_json_shape(a->shape_n, a->shape);
  printf(", \"eq\": ");
  sb_json_str(stdout, a->eq);
  printf(", \"scalar\": ");
  sb_json_num(a->scalar);
  printf(", \"i0\": %d, \"i1\": %d},\n \"dtype\": ", a->i0, a->i1);
  sb_json_str(stdout, dt_dtype_name(o->dtype));
  printf(", \"seed\": %" PRIu64 ",\n \"inputs\": [", o->seed);
  for (int j = 0; j < o->n_in; j++) {
    printf("%s\n  {\"shape\": ", j ? "," : "");
    sb_json_shape(o->in[j].ndim, o->in[j].gshape);
    printf(", \"placements\": ");
    json_pl(o->mesh_ndim, o->in[j].pl);
    printf(", \"dtype\": ");
    sb_json_str(stdout, dt_dtype_name(o->in[j].dtype));
    if (o->in[j].dtype == DT_I64) printf(", \"id_bound\": %" PRId64, o->in[j].id_bound);
    printf("}");
  }
  printf("],\n \"outputs\": [");
  for (int j = 0; j < o->op->n_out; j++) {
    printf("%s{\"shape\": ", j ? ", " : "");
    sb_json_shape(rp->out[j].ndim, rp->out[j].gshape);
    printf(", \"placements\": ");
    json_pl(o->mesh_ndim, rp->out[j].pl);
    printf(", \"dtype\": ");
    sb_json_str(stdout, dt_dtype_name(rp->out[j].dtype));
    printf("}");
  }
  const dt_op_report *rep = &rp->rep;
  printf("],\n \"strategies\": {\"generated\": %d, \"shardable\": %d, \"chosen\": %d, "
         "\"candidates\": [", rep->n_generated, rep->n_candidates, rep->chosen);
  int listed = rep->n_candidates < rep->max_cand ? rep->n_candidates : rep->max_cand;
  for (int c = 0; c < listed; c++) {
    printf("%s\n   {\"index\": %d, \"inputs\": [", c ? "," : "", c);
    for (int j = 0; j < o->n_in; j++) {
      if (j) printf(", ");
      json_pl(o->mesh_ndim, rep->cand[c].in[j]);
    }
    printf("], \"outputs\": [");
    for (int j = 0; j < o->op->n_out; j++) {
      if (j) printf(", ");
      json_pl(o->mesh_ndim, rep->cand[c].out[j]);
    }
    printf("], \"cost_us\": ");
    sb_json_num(rep->cand[c].cost_us);
    printf(", \"chosen\": %s}", c == rep->chosen ? "true" : "false");
  }
  printf("]},\n \"redistributions\": [");
  bool first = true;
  for (int j = 0; j < o->n_in; j++) {
    const redist_view *v = &rp->rv[j];
    if (!v->moves) continue;
    printf("%s\n  {\"input\": %d, \"from\": ", first ? "" : ",", j);
    first = false;
    json_pl(o->mesh_ndim, o->in[j].pl);
    printf(", \"to\": ");
    json_pl(o->mesh_ndim, v->dst);
    printf(", \"ok\": %s", v->ok ? "true" : "false");
    if (!v->ok) {
      printf(", \"error\": ");
      sb_json_str(stdout, v->err);
      printf("}");
      continue;
    }
    printf(", ");
    sb_json_plan_fields(&v->pv, o->names, o->mesh_ndim);
    if (v->gv.trace) {
      printf(", \"greedy_trace\": ");
      sb_json_str(stdout, v->gv.trace);
      printf(", \"greedy_cost_us\": ");
      sb_json_num(v->gv.plan.cost_us);
    }
    printf("}");
  }
  printf("],\n \"run\": {\"backend\": \"threads\", \"world\": %d, \"ok\": %s", o->world,
         rp->ran ? "true" : "false");
  if (!rp->ran) {
    printf(", \"error\": ");
    sb_json_str(stdout, rp->run_err);
    printf("},\n \"match\": false}\n");
    return;
  }
  printf(", \"dispatch_agrees\": %s", rp->decision_bad_rank < 0 ? "true" : "false");
  printf(",\n  \"forward\": {\"ledger_rank0\": ");
  sb_json_ledger_rows(rp->res[0].fw, rp->res[0].nfw, "    ");
  printf(",\n   \"ledger_totals\": ");
  sb_json_ledger_totals(rp->tfw, rp->ntfw, "    ");
  printf(",\n   \"outputs\": [");
  for (int j = 0; j < o->op->n_out; j++) {
    if (j) printf(", ");
    int br = rp->out_bad_rank[j];
    json_check(rp, &rp->res[0].out[j], &rp->ref[0].out[j], br,
               br >= 0 ? &rp->res[br].out[j] : NULL);
  }
  printf("]}");
  if (o->backward) {
    printf(",\n  \"backward\": {\"ledger_rank0\": ");
    sb_json_ledger_rows(rp->res[0].bw, rp->res[0].nbw, "    ");
    printf(",\n   \"ledger_totals\": ");
    sb_json_ledger_totals(rp->tbw, rp->ntbw, "    ");
    printf(",\n   \"input_grads\": [");
    for (int j = 0; j < o->n_in; j++) {
      if (j) printf(", ");
      if (!rp->res[0].gin[j].made) {
        printf("null");
        continue;
      }
      int br = rp->gin_bad_rank[j];
      json_check(rp, &rp->res[0].gin[j], &rp->ref[0].gin[j], br,
                 br >= 0 ? &rp->res[br].gin[j] : NULL);
    }
    printf("]}");
  }
  printf("},\n \"match\": %s}\n", rp->match ? "true" : "false");
}

/* ---- the subcommand ---- */

int sb_cmd_explain_op(int argc, char **argv) {
  eo_opts o;
  memset(&o, 0, sizeof o);
  report rp;
  memset(&rp, 0, sizeof rp);
  rank_res *ref = NULL, *res = NULL;
  int rc = parse_flags(argc, argv, &o);
  if (rc < 0) return SB_EXIT_OK; /* --help */
  if (rc) goto out;
  rp.o = &o;
  rp.decision_bad_rank = -1;
  for (int j = 0; j < DT_OP_MAX_OUT; j++) rp.out_bad_rank[j] = -1;
  for (int j = 0; j < DT_OP_MAX_IN; j++) rp.gin_bad_rank[j] = -1;

  /* The decision first: an input the op refuses is bad input, found before
   * any output or work. */
  if ((rc = make_decision(&o, &rp)) != 0) goto out;
  if ((rc = refuse_empty_mean(&o, &rp)) != 0) goto out;
  make_redists(&o, &rp);
  snprintf(rp.tol_why, sizeof rp.tol_why,
           "%s rounding: a sharded kernel may sum in another order", dt_dtype_name(o.dtype));

  /* Ids: valid for the op, the same for both runs. */
  for (int j = 0; j < o.n_in; j++) {
    in_desc *d = &o.in[j];
    if (d->dtype != DT_I64) continue;
    int64_t n = dt_shape_numel(d->ndim, d->gshape);
    d->ids = malloc((size_t)(n ? n : 1) * sizeof *d->ids);
    if (!d->ids) {
      fprintf(stderr, "shardbench explain: out of memory\n");
      rc = SB_EXIT_FAIL;
      goto out;
    }
    for (int64_t i = 0; i < n; i++) {
      uint32_t r[4];
      dt_philox4x32(o.seed, ID_STREAM + (uint64_t)j, (uint64_t)i, r);
      uint64_t v = ((uint64_t)r[0] << 32) | r[1];
      d->ids[i] = (int64_t)(v % (uint64_t)d->id_bound);
    }
  }

  ref = calloc(1, sizeof *ref);
  res = calloc((size_t)o.world, sizeof *res);
  if (!ref || !res) {
    fprintf(stderr, "shardbench explain: out of memory\n");
    rc = SB_EXIT_FAIL;
    goto out;
  }
  job rj = {.o = &o, .ref = true, .res = ref};
  job sj = {.o = &o, .ref = false, .refres = ref, .res = res};
  rp.res = res;
  rp.ref = ref;
  if (launch(&rj, 1, rp.run_err, sizeof rp.run_err) == DT_OK &&
      launch(&sj, o.world, rp.run_err, sizeof rp.run_err) == DT_OK) {
    rp.ran = true;
    rp.tfw = ledger_totals(res, o.world, false, &rp.ntfw);
    rp.tbw = ledger_totals(res, o.world, true, &rp.ntbw);
    if (!rp.tfw || !rp.tbw) {
      fprintf(stderr, "shardbench explain: out of memory\n");
      rc = SB_EXIT_FAIL;
      goto out;
    }
    for (int r = 0; r < o.world; r++) {
      if (rp.decision_bad_rank < 0 && res[r].chosen >= 0 && res[r].chosen != rp.rep.chosen)
        rp.decision_bad_rank = r;
      for (int j = 0; j < o.op->n_out; j++) {
        const tcheck *c = &res[r].out[j];
        bool pl_bad = !same_pl(o.mesh_ndim, c->pl, rp.out[j].pl);
        if (rp.out_bad_rank[j] < 0 && (c->shape_bad || c->bad >= 0 || pl_bad))
          rp.out_bad_rank[j] = r;
      }
      for (int j = 0; j < o.n_in; j++) {
        const tcheck *c = &res[r].gin[j];
        if (rp.gin_bad_rank[j] < 0 && c->made != ref->gin[j].made) rp.gin_bad_rank[j] = r;
        if (rp.gin_bad_rank[j] < 0 && c->made && (c->shape_bad || c->bad >= 0))
          rp.gin_bad_rank[j] = r;
      }
    }
  }
  rp.match = rp.ran && rp.decision_bad_rank < 0;
  for (int j = 0; j < o.op->n_out; j++) rp.match = rp.match && rp.out_bad_rank[j] < 0;
  for (int j = 0; j < o.n_in; j++) rp.match = rp.match && rp.gin_bad_rank[j] < 0;

  if (o.json) print_json(&rp);
  else print_text(&rp);
  if (!rp.ran) fprintf(stderr, "shardbench explain: %s\n", rp.run_err);
  else if (!rp.match) fprintf(stderr, "shardbench explain: MISMATCH (see the report)\n");
  rc = rp.match ? SB_EXIT_OK : SB_EXIT_FAIL;

out:
  free_res(ref, 1);
  free_res(res, o.world);
  free(rp.tfw);
  free(rp.tbw);
  free(rp.rep.cand);
  for (int j = 0; j < DT_OP_MAX_IN; j++) {
    sb_plan_view_free(&rp.rv[j].pv);
    sb_plan_view_free(&rp.rv[j].gv);
    free(o.in[j].ids);
  }
  return rc;
}
