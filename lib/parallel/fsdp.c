/* lib/parallel/fsdp.c: FSDP2's fully_shard over a dp_shard mesh dim, a cp mesh dim or
 * the two flattened, HSDP over dp_replicate x that, ZeRO-1/2/3 and mixed precision
 * (PyTorch's torch/distributed/fsdp/_fully_shard/: _fsdp_param.py FSDPParam,
 * _fsdp_collectives.py foreach_all_gather / foreach_reduce, _fsdp_param_group.py
 * FSDPParamGroup, _fully_shard.py fully_shard's shard_placement_fn; TorchTitan v0.2.0
 * torchtitan/models/llama3/infra/parallelize.py apply_fsdp).
 *
 * The FSDP group: context parallel ranks hold the same weights but see other
 * tokens, so their weight gradients are Partial(sum) on cp as on the data dims;
 * TorchTitan (torchtitan/distributed/parallel_dims.py ParallelDims: the
 * flattened "dp_shard_cp" mesh, fsdp_enabled when dp_shard or cp is) shards over
 * dp_shard x cp, and over cp alone when dp_shard is 1. Here the FSDP dims are
 * shard_dim, cp_dim or both (cp_dim == shard_dim + 1: dp_shard outer); with cp,
 * the collectives run on one communicator over the flattened pair (or cp alone),
 * named "dp_shard_cp" as TorchTitan's mesh (dt_mesh_flatten), of W = DS x C
 * ranks, flattened rank r = coord(dp_shard) x C + coord(cp).
 *
 * Units: each fully_shard entry (in plan order) claims the weights of the
 * modules its patterns match and of their descendants that no earlier entry
 * claimed; "root" claims whatever is left. A unit opens at the pre hook of the
 * first of its matched modules to run and closes at the post hook of the last
 * (the model root: the start and end of forward).
 *
 * Sharding one weight: its placement on each FSDP dim becomes Shard(d) (both
 * dims: the same d, nested; DTensor nests left to right, so flattened rank r
 * holds the torch.chunk of cp's coordinate of the torch.chunk of dp_shard's,
 * which is the flattened chunk r when the sizes divide). The tensor FSDP splits
 * is the weight as the other mesh dims leave it (TP's local block when TP shards
 * it), seen as [outer, L, inner] around dim d: L rows over the W ranks with
 * torch.chunk's sizes (c = ceil(L / W) rows, short or empty chunks at the end,
 * nested: ceil(ceil(L / DS) / C) == ceil(L / W)), as FSDPParam._init_sharded_param
 * does. d is 0 unless a mesh dim after the FSDP dims shards dim 0 (TP after
 * dp_shard / cp in TorchTitan's mesh order: Colwise weights, the Rowwise
 * embedding); then d is 1 for a 2-D weight no later dim shards on dim 1, as
 * FSDP2's shard_placement_fn returning Shard(1) gives (FSDP's chunks and TP's
 * blocks then cut different dims and commute); otherwise it is refused. With TP
 * before the FSDP dims, dim 0 of TP's local block is split (what PyTorch
 * expresses with _StridedShard on a [dp, tp] mesh).
 *
 * One all_gather per unit: every member's shard, padded to c rows, packed into
 * one flat segment of P = sum outer x c x inner elements per rank; the [W, P]
 * result is copied out into each member's unsharded tensor (its FSDP dims'
 * placements Replicate; a dim-1 shard as `outer` runs of size x inner), recorded
 * on the step tape as one custom function (fsdp_all_gather) whose backward is
 * the unit's one reduce_scatter: each member's gradient (Partial(sum) over the
 * FSDP dims, the batch and the sequence being sharded there) is chunked the same
 * way into a [W, P] buffer, reduce-scattered (sum), and for HSDP all-reduced over
 * dp_replicate (one call); the result is the sharded weight's gradient. The loss
 * is the global mean, so sums are the average TorchTitan's AVG reduction of
 * per-rank means gives. A gradient Replicate on an FSDP dim (not dependent on
 * what that dim shards) is contributed by coordinate 0 of that dim only, so the
 * sum is exact; other mesh dims keep their placements (a Partial there, like
 * the SequenceParallel norms' tp Partial, is reduced by the optimizer).
 *
 * reshard_after_forward (ZeRO-3): after the unit's forward its unsharded
 * values are freed and the unit's output goes through an identity custom
 * function (fsdp_pre_backward) whose backward gathers them again before the
 * unit's backward runs (FSDP2's pre-backward hook on the outputs). Without it
 * (ZeRO-2, and TorchTitan's last group) they stay until the reduce_scatter.
 * After the reduce_scatter they are freed (reshard after backward).
 *
 * Pipeline mode (dt_fsdp_pipeline_begin .. _end, called by dt_pipeline_step): with
 * pp, TorchTitan's apply_fsdp keeps every unit gathered after forward
 * (reshard_after_forward_policy "default": `not pp_enabled`), and PyTorch's
 * pipelining accumulates unsharded gradients over the microbatches and reduces
 * once (torch/distributed/pipelining/stage.py _PipelineStageBase:
 * backward_maybe_with_nosync runs every microbatch's backward with
 * set_requires_gradient_sync(False) and set_reshard_after_backward(False);
 * perform_reduce_grad, the REDUCE_GRAD action schedules.py places after a
 * stage's last backward, turns them back on and runs each group's
 * post_backward: one reduce_scatter). Here a unit's view holds its members on
 * this rank's stages (TorchTitan applies fully_shard to each stage's model part,
 * so a unit never spans ranks; a "root" unit whose modules sit on two stages is
 * the part each rank holds), packed anew. A view opens at the pre hook of the
 * unit's first matched module or of any of its members, whichever runs first
 * (a root unit has no hook of its own in a stage): one all_gather into leaves
 * of a tape of the step's own (not the microbatch tapes, which pp.c frees
 * after each backward), requiring a gradient, that m->mods[].compute points at
 * for the step; the microbatch tapes' backwards accumulate their gradients.
 * After the last backward of every stage its members are on
 * (dt_fsdp_pipeline_stage_done), the view's reduce_scatter (+ HSDP all_reduce)
 * runs on the accumulated gradients (reduce_unit, ag_backward's body), the
 * result is added to the sharded weights' gradients and the unsharded data is
 * freed. A unit with no member here is never gathered; its weights get no
 * gradient here (their stage's rank trains them). An explicit
 * reshard_after_forward=True is refused there (TorchTitan's "always" policy
 * would gather per microbatch); the default is False. ZeRO-1 keeps its whole
 * weights (the gradients accumulate in them) and reduces / gathers each view.
 *
 * Mixed precision (MixedPrecisionPolicy in _fsdp_api.py): the all_gather moves
 * param_dtype (bf16: the f32 shard rounded to nearest even; the copy holds those
 * values widened, since the ops compute in f32 / f64), the reduce_scatter
 * reduce_dtype; the sharded master weights keep the model's dtype.
 *
 * ZeRO-1 (arXiv:1910.02054 sec. 5.1, P_os): the weights stay whole (no gathers
 * for compute); AdamW's state is each rank's row shard (dt_module.opl), so the
 * optimizer updates only those rows; dt_fsdp_reduce_grads all-reduces each
 * unit's gradients (one call per unit over the FSDP group, one over
 * dp_replicate) and dt_fsdp_after_step all-gathers each unit's updated rows.
 * AdamW updates rows, so ZeRO-1 refuses a dim-1 shard (DT_ERR_UNSUPPORTED).
 */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "device/kernels.h"
#include "device/xfer.h"
#include "parallel/parallel.h"

typedef struct fsdp_member {
  int mod;                  /* module index */
  int dim;                  /* the tensor dim FSDP shards (0, or 1: see the top) */
  int64_t outer, rows, inner; /* the tensor FSDP splits as [outer, L, inner] around dim */
  int64_t c;                /* ceil(L / W): padded rows per rank */
  int64_t off;              /* this member's offset in a rank's flat segment */
  dt_placement upl[DT_MAX_MESH_DIMS]; /* the unsharded placements (FSDP dims: Replicate) */
  dt_var *unsharded;        /* this step's unsharded variable, NULL before the unit opens */
} fsdp_member;

struct fsdp;

typedef struct fsdp_unit {
  char name[96];
  int first, last;          /* the modules whose pre / post hooks open and close it */
  bool raf;                 /* reshard after forward */
  bool raf_given;           /* the entry sets it (else FSDP2's default) */
  int n;
  fsdp_member *mem;
  int64_t P;                /* a rank's flat segment (elements) */
  struct fsdp *f;
} fsdp_unit;

typedef struct fsdp {
  dt_fsdp_opts o;
  dt_model *m;
  int nfd, fd[2];           /* the FSDP mesh dims, outer first (dp_shard, cp) */
  dt_comm *comm;            /* their group: the dim's, or the flattened pair's */
  int W, coord;             /* the group's size and this rank's flattened rank */
  int n_units;
  fsdp_unit *u;
  /* pipeline mode (dt_fsdp_pipeline_begin .. _end; see the top) */
  bool piped;               /* pv holds the last pipeline step's views */
  bool in_step;             /* between begin and end: units open once, stay open */
  fsdp_unit *pv;            /* [n_units]: each unit's members on this rank's stages */
  bool *opened, *reduced;   /* [n_units], this step */
  int *stage;               /* [n_mods]: a module's stage here, -1: not on this rank */
  bool *done;               /* [n_stages]: the stage's last backward has run */
  int n_stages;
  dt_tape *ptape;           /* the step's unsharded leaves */
} fsdp;

static const char WHO[] = "dt_fully_shard";

static dt_dtype comm_dtype(const fsdp *f, bool reduce) {
  dt_dtype d = reduce ? f->o.reduce_dtype : f->o.param_dtype;
  return d == DT_DTYPE_COUNT ? f->m->dtype : d;
}

/* The rows [off, off + size) of L that flattened rank r holds: torch.chunk over
 * the first FSDP dim at r's coordinate there, then over the second of that. */
static void fsdp_chunk(const fsdp *f, int64_t L, int r, int64_t *size, int64_t *off) {
  int64_t sz = L, at = 0;
  int below = f->W;
  for (int k = 0; k < f->nfd; k++) {
    const int n = dt_mesh_size(f->m->mesh, f->fd[k]);
    below /= n;
    int64_t cs, co;
    dt_chunk(sz, n, (r / below) % n, &cs, &co);
    sz = cs;
    at += co;
  }
  *size = sz;
  *off = at;
}

/* ---- flat buffers and layout moves --------------------------------------------------
 * Every flat buffer lives where the unit's weights do (host memory on a CPU rank,
 * the device's otherwise) and the collectives take it as it is (lib/comm/comm.h).
 * The moves go through that device's kernels (dt_device_kernels; the CPU's are
 * host loops): a byte move per contiguous run, the layout copy_box for strided
 * runs, and the device's cast for a dtype change (param / reduce dtype: each
 * element once, through f64, bf16 rounded to nearest even). */

/* The device of the unit's weights, its handle and kernels (not copied: see dt_kdev). */
typedef struct fdev {
  dt_device_kind kind;
  dt_kdev kd;
} fdev;

/* The device the unit's weights live on. */
static dt_device_kind unit_dev(const fsdp_unit *u) {
  if (!u->n) return DT_DEV_CPU;
  return dt_var_value(u->f->m->mods[u->mem[0].mod].weight)->local.dev;
}

static dt_status on_dev(dt_ctx *ctx, dt_device_kind kind, fdev *D) {
  D->kind = kind;
  DT_CHECK(dt_device_kernels(ctx, kind, WHO, &D->kd));
  if (!D->kd.k->layout || !D->kd.k->layout->copy_box)
    return dt_error(ctx, DT_ERR_UNSUPPORTED, WHO, "the device has no kernel copy_box");
  return DT_OK;
}

/* A flat buffer of n (>= 1 allocated) elements on D; zeroed when zero. */
static dt_status fbuf(dt_ctx *ctx, const fdev *D, dt_dtype t, int64_t n, bool zero, dt_array *a) {
  const int64_t len = n > 0 ? n : 1;
  DT_CHECK(dt_array_create(ctx, D->kind, t, 1, &len, a));
  if (!zero) return DT_OK;
  dt_status s = dt_device_fill(D->kd.dev, t, a->data, len, 0.0);
  if (s != DT_OK) dt_array_free(ctx, a);
  return s;
}

/* A collective's flat buffer (fbuf), noted as communication memory until
 * cfree (dt_mem_note: a peak's split). */
static dt_status cbuf(dt_ctx *ctx, const fdev *D, dt_dtype t, int64_t n, bool zero, dt_array *a) {
  DT_CHECK(fbuf(ctx, D, t, n, zero, a));
  dt_mem_note(ctx, D->kind != DT_DEV_CPU, DT_MEM_NOTE_COMM, dt_array_bytes(a), true);
  return DT_OK;
}

static void cfree(dt_ctx *ctx, dt_array *a) {
  if (a->data) dt_mem_note(ctx, a->dev != DT_DEV_CPU, DT_MEM_NOTE_COMM, dt_array_bytes(a), false);
  dt_array_free(ctx, a);
}

/* An unsharded value's memory, noted as FSDP's unsharded parameters until ufree. */
static dt_status ualloc(dt_ctx *ctx, dt_device_kind dev, dt_dtype t, int nd, const int64_t *shape,
                        dt_array *a) {
  DT_CHECK(dt_array_create(ctx, dev, t, nd, shape, a));
  dt_mem_note(ctx, dev != DT_DEV_CPU, DT_MEM_NOTE_FSDP_PARAMS, dt_array_bytes(a), true);
  return DT_OK;
}

static void ufree(dt_ctx *ctx, dt_array *a) {
  if (a->data && a->owns)
    dt_mem_note(ctx, a->dev != DT_DEV_CPU, DT_MEM_NOTE_FSDP_PARAMS, dt_array_bytes(a), false);
  dt_array_free(ctx, a);
}

/* n elements from src (ts) to dst (td), converted; a plain copy when equal. */
static dt_status convert(const fdev *D, void *dst, dt_dtype td, const void *src, dt_dtype ts,
                         int64_t n) {
  return dt_device_convert(D->kd.dev, ts, src, td, dst, n);
}

/* One dtype (es bytes): one box copy [outer, n] out of [outer, sstride] into
 * [outer, dstride]. */
static dt_status box_runs(const fdev *D, size_t es, char *dst, int64_t dstride, const char *src,
                          int64_t sstride, int64_t outer, int64_t n) {
  const int64_t ds[2] = {outer, dstride}, ss[2] = {outer, sstride}, zo[2] = {0, 0},
                box[2] = {outer, n};
  const uint64_t bytes = (uint64_t)(outer > 0 ? outer : 0) * (uint64_t)(n > 0 ? n : 0) * es;
  dt_kledger_kernel(D->kd.dev->ctx, "copy_box", DT_F32, 0, bytes, bytes);
  return D->kd.k->layout->copy_box(D->kd.dev, es, 2, dst, ds, zo, src, ss, zo, box);
}

/* outer runs of n elements, run o from src + o * sstride (dtype ts) to dst + o *
 * dstride (dtype td), strides in elements. A dtype change on strided runs goes
 * through a contiguous [outer, n] buffer on the contiguous side's far end (the
 * runs FSDP moves are contiguous on one side: a rank's packed segment). */
static dt_status runs(dt_ctx *ctx, const fdev *D, char *dst, dt_dtype td, int64_t dstride,
                      const char *src, dt_dtype ts, int64_t sstride, int64_t outer, int64_t n) {
  if (outer <= 0 || n <= 0) return DT_OK;
  const size_t ed = dt_dtype_size(td), es = dt_dtype_size(ts);
  if (outer == 1 || (dstride == n && sstride == n)) return convert(D, dst, td, src, ts, outer * n);
  if (td == ts) return box_runs(D, es, dst, dstride, src, sstride, outer, n);
  if (dstride != n && sstride != n) { /* strided on both sides: run by run */
    dt_status s = DT_OK;
    for (int64_t o = 0; s == DT_OK && o < outer; o++)
      s = convert(D, dst + (size_t)(o * dstride) * ed, td, src + (size_t)(o * sstride) * es, ts, n);
    return s;
  }
  dt_array t;
  const bool gather = dstride == n; /* strided source: gather in ts, then convert */
  DT_CHECK(fbuf(ctx, D, gather ? ts : td, outer * n, false, &t));
  dt_status s = gather ? box_runs(D, es, t.data, n, src, sstride, outer, n)
                       : convert(D, t.data, td, src, ts, outer * n);
  if (s == DT_OK)
    s = gather ? convert(D, dst, td, t.data, ts, outer * n)
               : box_runs(D, ed, dst, dstride, t.data, n, outer, n);
  dt_array_free(ctx, &t);
  return s;
}

/* Rank r's chunk of member mb out of its whole tensor `full` (dtype ft) into seg
 * (dtype st), as the rank's shard lays it out: [outer, size, inner]. */
static dt_status pack(dt_ctx *ctx, const fdev *D, const fsdp *f, const fsdp_member *mb, int r,
                      char *seg, dt_dtype st, const char *full, dt_dtype ft) {
  int64_t size, off;
  fsdp_chunk(f, mb->rows, r, &size, &off);
  return runs(ctx, D, seg, st, size * mb->inner,
              full + (size_t)(off * mb->inner) * dt_dtype_size(ft), ft, mb->rows * mb->inner,
              mb->outer, size * mb->inner);
}

/* ---- all_gather (forward, and again before backward) ------------------------------ */

/* Member k's whole tensor from an all_gather's [W, P] result recv (dtype rt) into
 * dst (dtype dt): rank r's segment holds its chunk of it. */
static dt_status unpack(dt_ctx *ctx, const fdev *D, const fsdp_unit *u, int k, const char *recv,
                        dt_dtype rt, void *dst, dt_dtype dt) {
  const fsdp_member *mb = &u->mem[k];
  const size_t es = dt_dtype_size(rt);
  dt_status s = DT_OK;
  for (int r = 0; s == DT_OK && r < u->f->W; r++) {
    int64_t size, off;
    fsdp_chunk(u->f, mb->rows, r, &size, &off);
    s = runs(ctx, D, (char *)dst + (size_t)(off * mb->inner) * dt_dtype_size(dt), dt,
             mb->rows * mb->inner, recv + ((size_t)r * (size_t)u->P + (size_t)mb->off) * es, rt,
             size * mb->inner, mb->outer, size * mb->inner);
  }
  return s;
}

/* The unit's unsharded values into vals[k] (already allocated, right local shape):
 * the shards converted to the param dtype into one flat segment, all_gather, each
 * member's chunks converted back out. */
static dt_status gather_into(dt_ctx *ctx, fsdp_unit *u, dt_tensor *const *vals) {
  fsdp *f = u->f;
  const dt_dtype pd = comm_dtype(f, false), md = f->m->dtype;
  const size_t es = dt_dtype_size(pd);
  fdev D;
  DT_CHECK(on_dev(ctx, unit_dev(u), &D));
  dt_array send = {0}, recv = {0};
  dt_status s = cbuf(ctx, &D, pd, u->P, true, &send);
  if (s == DT_OK) s = cbuf(ctx, &D, pd, u->P * f->W, false, &recv);
  for (int k = 0; s == DT_OK && k < u->n; k++) {
    const fsdp_member *mb = &u->mem[k];
    const dt_tensor *w = dt_var_value(f->m->mods[mb->mod].weight);
    s = convert(&D, (char *)send.data + (size_t)mb->off * es, pd, w->local.data, md,
                w->local.numel);
  }
  if (s == DT_OK) s = dt_comm_all_gather(f->comm, send.data, recv.data, (size_t)u->P, pd);
  for (int k = 0; s == DT_OK && k < u->n; k++)
    s = unpack(ctx, &D, u, k, recv.data, pd, vals[k]->local.data, md);
  cfree(ctx, &send);
  cfree(ctx, &recv);
  return s;
}

static dt_tensor *value_of(dt_var *v) { return (dt_tensor *)dt_var_value(v); } /* FSDP owns them */

/* Frees the unit's unsharded data (the variables and their shapes stay). */
static void reshard(dt_ctx *ctx, fsdp_unit *u) {
  for (int k = 0; k < u->n; k++)
    if (u->mem[k].unsharded) ufree(ctx, &value_of(u->mem[k].unsharded)->local);
}

/* Gathers the unit again into its variables (freed by reshard). */
static dt_status regather(dt_ctx *ctx, fsdp_unit *u) {
  dt_tensor **vals = dt_host_alloc(ctx, sizeof *vals * (size_t)u->n);
  dt_status s = vals ? DT_OK : dt_error(ctx, DT_ERR_NOMEM, WHO, "no memory");
  for (int k = 0; s == DT_OK && k < u->n; k++) {
    dt_tensor *v = value_of(u->mem[k].unsharded);
    if (!v->local.data) { /* memory of the same shape where it lived */
      dt_array a;
      s = ualloc(ctx, v->local.dev, v->local.dtype, v->local.ndim, v->local.shape, &a);
      if (s == DT_OK) {
        v->local.data = a.data;
        v->local.owns = true;
      }
    }
    vals[k] = v;
  }
  if (s == DT_OK) s = gather_into(ctx, u, vals);
  dt_host_free(ctx, vals);
  return s;
}

/* ---- reduce_scatter (the all_gather's backward) ----------------------------------- */

/* Whether mesh dim d is one of the FSDP dims. */
static bool is_fsdp_dim(const fsdp *f, int d) {
  for (int k = 0; k < f->nfd; k++)
    if (f->fd[k] == d) return true;
  return false;
}

/* The unit's reduce_scatter (+ HSDP all_reduce) of its members' unsharded gradients
 * gout[k] (NULL: none, zeros) into the sharded gradients gin[k] (NULL: not wanted). */
static dt_status reduce_unit(dt_ctx *ctx, fsdp_unit *u, const dt_tensor *const *gout,
                             dt_tensor *const *gin) {
  fsdp *f = u->f;
  dt_model *m = f->m;
  const int rd = f->o.replicate_dim, nd = dt_mesh_ndim(m->mesh);
  const dt_dtype rt = comm_dtype(f, true), md = m->dtype;
  const size_t es = dt_dtype_size(rt);
  /* the gradients packed, converted to rt, into send [W, P]; this rank's sum in recv */
  fdev D;
  dt_array sb = {0}, rb = {0};
  dt_status s = on_dev(ctx, unit_dev(u), &D);
  if (s == DT_OK) s = cbuf(ctx, &D, rt, u->P * f->W, true, &sb);
  if (s == DT_OK) s = cbuf(ctx, &D, rt, u->P, false, &rb);
  char *send = sb.data, *recv = rb.data;
  dt_tensor *g = dt_host_calloc(ctx, sizeof *g * (size_t)u->n); /* each gradient, redistributed */
  bool *partial_rep = dt_host_calloc(ctx, sizeof *partial_rep * (size_t)u->n);
  if (s == DT_OK && !(send && recv && g && partial_rep))
    s = dt_error(ctx, DT_ERR_NOMEM, WHO, "no memory");
  bool any_rep = false;
  for (int k = 0; s == DT_OK && k < u->n; k++) {
    const fsdp_member *mb = &u->mem[k];
    const dt_tensor *go = gout[k];
    if (!go) continue; /* no gradient: zeros */
    /* the gradient's layout on the other dims made the unsharded weight's (a Partial
     * where the weight is Replicate stays Partial) */
    dt_placement tgt[DT_MAX_MESH_DIMS];
    bool same = true;
    for (int d = 0; d < nd; d++) {
      const bool dp = d == rd || is_fsdp_dim(f, d);
      bool keep = dp || (go->pl[d].kind == DT_PL_PARTIAL && mb->upl[d].kind == DT_PL_REPLICATE);
      tgt[d] = keep ? go->pl[d] : mb->upl[d];
      if (dp && go->pl[d].kind == DT_PL_SHARD) tgt[d] = dt_replicate();
      same = same && dt_placement_eq(tgt[d], go->pl[d]);
    }
    s = same ? dt_tensor_from_local(ctx, go->mesh, &go->local, go->pl, go->ndim, go->gshape, &g[k])
             : dt_redistribute(ctx, go, tgt, DT_PLANNER_GREEDY, &g[k]);
    if (s != DT_OK) break;
    /* a Partial(sum) gradient on an FSDP dim is summed; a Replicate one (not
     * dependent on what that dim shards) counts once: from coordinate 0 there */
    bool contribute = true;
    for (int q = 0; q < f->nfd; q++) {
      const dt_placement p = g[k].pl[f->fd[q]];
      if (p.kind == DT_PL_PARTIAL && p.op != DT_RED_SUM) {
        s = dt_error(ctx, DT_ERR_UNSUPPORTED, WHO, "%s: a Partial gradient that is not a sum",
                     m->mods[mb->mod].fqn);
        break;
      }
      if (p.kind != DT_PL_PARTIAL && dt_mesh_coord(m->mesh, f->fd[q]) != 0) contribute = false;
    }
    partial_rep[k] = rd >= 0 && g[k].pl[rd].kind == DT_PL_PARTIAL;
    any_rep = any_rep || partial_rep[k];
    if (s == DT_OK && partial_rep[k] && g[k].pl[rd].op != DT_RED_SUM)
      s = dt_error(ctx, DT_ERR_UNSUPPORTED, WHO, "%s: a Partial gradient that is not a sum",
                   m->mods[mb->mod].fqn);
    if (s != DT_OK || !contribute) continue;
    for (int r = 0; s == DT_OK && r < f->W; r++)
      s = pack(ctx, &D, f, mb, r, send + ((size_t)r * (size_t)u->P + (size_t)mb->off) * es, rt,
               g[k].local.data, g[k].local.dtype);
  }
  if (s == DT_OK) s = dt_comm_reduce_scatter(f->comm, send, recv, (size_t)u->P, rt, DT_RED_SUM);
  for (int k = 0; s == DT_OK && f->o.fault_no_reduce[0] && k < u->n; k++) {
    const fsdp_member *mb = &u->mem[k];
    if (!g[k].mesh || strcmp(m->mods[mb->mod].fqn, f->o.fault_no_reduce)) continue;
    /* the fault: this rank's own chunk of its partial gradient */
    s = pack(ctx, &D, f, mb, f->coord, recv + (size_t)mb->off * es, rt, g[k].local.data,
             g[k].local.dtype);
  }
  if (s == DT_OK && any_rep) { /* HSDP: the shard's sum over the replicas */
    for (int k = 0; s == DT_OK && k < u->n; k++) /* a gradient Replicate over dp_replicate counts once */
      if (g[k].mesh && !partial_rep[k] && dt_mesh_coord(m->mesh, rd) != 0)
        s = dt_device_fill(D.kd.dev, rt, recv + (size_t)u->mem[k].off * es,
                           u->mem[k].outer * u->mem[k].c * u->mem[k].inner, 0.0);
    if (s == DT_OK) s = dt_comm_all_reduce(dt_mesh_comm(m->mesh, rd), recv, recv, (size_t)u->P, rt, DT_RED_SUM);
  }
  for (int k = 0; s == DT_OK && k < u->n; k++) {
    if (!gin[k] || !g[k].mesh) continue;
    const fsdp_member *mb = &u->mem[k];
    const dt_tensor *w = dt_var_value(m->mods[mb->mod].weight);
    dt_placement pl[DT_MAX_MESH_DIMS];
    for (int d = 0; d < nd; d++)
      pl[d] = is_fsdp_dim(f, d)                         ? w->pl[d]
              : d == rd                                 ? (any_rep ? dt_replicate() : g[k].pl[d])
              : g[k].pl[d].kind == DT_PL_PARTIAL        ? g[k].pl[d]
                                                        : w->pl[d];
    dt_array a;
    s = dt_array_create(ctx, w->local.dev, md, w->local.ndim, w->local.shape, &a);
    if (s != DT_OK) break;
    s = convert(&D, a.data, md, recv + (size_t)mb->off * es, rt, w->local.numel);
    if (s != DT_OK) {
      dt_array_free(ctx, &a);
      break;
    }
    s = dt_tensor_from_local(ctx, w->mesh, &a, pl, w->ndim, w->gshape, gin[k]);
    dt_array_free(ctx, &a);
  }
  for (int k = 0; g && k < u->n; k++) dt_tensor_free(ctx, &g[k]);
  dt_host_free(ctx, g);
  dt_host_free(ctx, partial_rep);
  cfree(ctx, &sb);
  cfree(ctx, &rb);
  return s;
}

static dt_status ag_backward(dt_ctx *ctx, void *state, int n_out, const dt_tensor *const *gout,
                             int n_in, dt_tensor *const *gin) {
  fsdp_unit *u = state;
  if (n_out != u->n || n_in != u->n)
    return dt_error(ctx, DT_ERR_INTERNAL, WHO, "%s: %d/%d gradients for %d weights", u->name,
                    n_out, n_in, u->n);
  DT_CHECK(reduce_unit(ctx, u, gout, gin));
  reshard(ctx, u); /* reshard after backward */
  return DT_OK;
}

/* ---- the unit's boundaries --------------------------------------------------------- */

/* The unit's unsharded values, gathered into vals[0..n) (made here: the members'
 * unsharded shapes and placements); on failure none is left allocated. */
static dt_status gather_new(dt_ctx *ctx, fsdp_unit *u, dt_tensor *vals) {
  dt_model *m = u->f->m;
  dt_tensor **vp = dt_host_alloc(ctx, sizeof *vp * (size_t)u->n);
  dt_status s = vp ? DT_OK : dt_error(ctx, DT_ERR_NOMEM, WHO, "no memory");
  for (int k = 0; s == DT_OK && k < u->n; k++) {
    const dt_module *md = &m->mods[u->mem[k].mod];
    vp[k] = &vals[k];
    /* uninitialised: the all_gather writes every element */
    s = dt_tensor_meta(ctx, m->mesh, u->mem[k].upl, md->wndim, md->wshape, m->dtype, WHO,
                       &vals[k]);
    int64_t ls[DT_MAX_DIMS];
    if (s == DT_OK) dt_tensor_local_shape(&vals[k], ls);
    if (s == DT_OK) /* where the sharded weight lives */
      s = ualloc(ctx, dt_var_value(md->weight)->local.dev, m->dtype, md->wndim, ls,
                 &vals[k].local);
  }
  if (s == DT_OK) s = gather_into(ctx, u, vp);
  for (int k = 0; s != DT_OK && k < u->n; k++) {
    ufree(ctx, &vals[k].local);
    dt_tensor_free(ctx, &vals[k]);
  }
  dt_host_free(ctx, vp);
  return s;
}

static dt_status open_unit(dt_ctx *ctx, fsdp_unit *u, dt_tape *tape) {
  fsdp *f = u->f;
  dt_model *m = f->m;
  const size_t n = (size_t)u->n;
  dt_var **in = dt_host_alloc(ctx, sizeof *in * n), **out = dt_host_alloc(ctx, sizeof *out * n);
  dt_tensor *vals = dt_host_calloc(ctx, sizeof *vals * n);
  dt_status s = in && out && vals ? DT_OK : dt_error(ctx, DT_ERR_NOMEM, WHO, "no memory");
  for (int k = 0; s == DT_OK && k < u->n; k++) in[k] = m->mods[u->mem[k].mod].weight;
  if (s == DT_OK) s = gather_new(ctx, u, vals);
  if (s == DT_OK) { /* dt_ad_custom takes the values (and frees them on failure) */
    s = dt_ad_custom(tape, "fsdp_all_gather", ag_backward, u, u->n, in, u->n, vals, out);
    for (int k = 0; s == DT_OK && k < u->n; k++) {
      u->mem[k].unsharded = out[k];
      m->mods[u->mem[k].mod].compute = out[k];
    }
  }
  dt_host_free(ctx, in);
  dt_host_free(ctx, out);
  dt_host_free(ctx, vals);
  return s;
}

/* Identity on the unit's output; its backward gathers the unit again first. */
static dt_status pre_backward(dt_ctx *ctx, void *state, int n_out, const dt_tensor *const *gout,
                              int n_in, dt_tensor *const *gin) {
  fsdp_unit *u = state;
  if (n_out != 1 || n_in != 1) return dt_error(ctx, DT_ERR_INTERNAL, WHO, "fsdp_pre_backward");
  DT_CHECK(regather(ctx, u));
  if (!gin[0] || !gout[0]) return DT_OK;
  const dt_tensor *g = gout[0];
  return dt_tensor_from_local(ctx, g->mesh, &g->local, g->pl, g->ndim, g->gshape, gin[0]);
}

static dt_status close_unit(dt_ctx *ctx, fsdp_unit *u, dt_tape *tape, dt_var **io, int n) {
  if (!u->raf || !u->mem[0].unsharded) return DT_OK;
  reshard(ctx, u);
  if (n < 1 || !io[0]) return DT_OK;
  /* a view of the unit's output, not a copy: FSDP2's pre-backward hook is a hook on the
   * output tensors (torch/distributed/fsdp/_fully_shard/_fsdp_state.py
   * _register_pre_backward_hook, register_multi_grad_hook), no new memory. The tape
   * keeps the viewed value while the view lives (a checkpointed region does not free
   * a value that a kept one views) */
  dt_tensor y = *dt_var_value(io[0]);
  y.local.owns = false;
  dt_var *out;
  DT_CHECK(dt_ad_custom(tape, "fsdp_pre_backward", pre_backward, u, 1, io, 1, &y, &out));
  io[0] = out;
  return DT_OK;
}

/* ---- pipeline mode ------------------------------------------------------------------- */

/* Unit i's view's members gathered once into leaves of the step's tape that
 * require a gradient; the stages' forwards compute with them (m->mods[].compute)
 * and every microbatch's backward accumulates into their gradients. */
static dt_status pipe_open(dt_ctx *ctx, fsdp *f, int i) {
  fsdp_unit *v = &f->pv[i];
  dt_model *m = f->m;
  dt_tensor *vals = dt_host_calloc(ctx, sizeof *vals * (size_t)v->n);
  dt_status s = vals ? DT_OK : dt_error(ctx, DT_ERR_NOMEM, WHO, "no memory");
  if (s == DT_OK) s = gather_new(ctx, v, vals);
  f->opened[i] = s == DT_OK;
  for (int k = 0; s == DT_OK && k < v->n; k++) { /* the leaf takes (or frees) the value */
    dt_var *leaf = dt_var_leaf(f->ptape, &vals[k], true);
    if (!leaf) {
      s = DT_ERR_NOMEM;
      for (int j = k + 1; j < v->n; j++) dt_tensor_free(ctx, &vals[j]);
      break;
    }
    v->mem[k].unsharded = leaf;
    m->mods[v->mem[k].mod].compute = leaf;
    /* the microbatches' gradients accumulate unsharded in the reduce dtype, as FSDP2's
     * do without gradient sync (torch/distributed/fsdp/_fully_shard/_fsdp_param.py
     * to_accumulated_grad_if_needed) */
    if (comm_dtype(f, true) != value_of(leaf)->dtype) dt_var_accumulate_in(leaf, comm_dtype(f, true));
  }
  dt_host_free(ctx, vals);
  return s;
}

/* g added into weight w's gradient (g moved in; freed). */
static dt_status add_grad(dt_ctx *ctx, dt_model *m, dt_var *w, dt_tensor *g) {
  const dt_tensor *old = dt_var_grad(w);
  if (!old) return dt_var_set_grad(m->tape, w, g);
  bool same = old->dtype == g->dtype;
  for (int d = 0; d < old->mesh_ndim; d++) same = same && dt_placement_eq(old->pl[d], g->pl[d]);
  dt_tensor r = {0};
  dt_status s = same ? DT_OK : dt_redistribute(ctx, g, old->pl, DT_PLANNER_GREEDY, &r);
  const dt_tensor *a = same ? g : &r;
  if (s == DT_OK && a->local.numel != old->local.numel)
    s = dt_error(ctx, DT_ERR_INTERNAL, WHO, "a gradient of %lld elements for one of %lld",
                 (long long)a->local.numel, (long long)old->local.numel);
  dt_tensor *o = (dt_tensor *)old; /* the tape's, accumulated into in place */
  if (s == DT_OK && o->local.numel) { /* o += a where o lives */
    fdev D;
    dt_array c = {0};
    const void *x = a->local.data;
    s = on_dev(ctx, o->local.dev, &D);
    if (s == DT_OK && a->dtype != o->dtype) { /* a converted to o's dtype first */
      s = fbuf(ctx, &D, o->dtype, o->local.numel, false, &c);
      if (s == DT_OK) s = convert(&D, c.data, o->dtype, a->local.data, a->dtype, o->local.numel);
      x = c.data;
    }
    if (s == DT_OK) s = dt_device_axpy(D.kd.dev, o->dtype, o->local.numel, 1.0, x, o->local.data);
    dt_array_free(ctx, &c);
  }
  dt_tensor_free(ctx, &r);
  dt_tensor_free(ctx, g);
  return s;
}

/* Unit i's reduction after the last backward of every stage its view's members are
 * on: the accumulated unsharded gradients reduce-scattered (+ HSDP all_reduce)
 * into the sharded weights' gradients, then the unsharded values and gradients
 * freed (reshard after backward). */
static dt_status pipe_reduce(dt_ctx *ctx, fsdp *f, int i) {
  fsdp_unit *v = &f->pv[i];
  dt_model *m = f->m;
  f->reduced[i] = true;
  const dt_tensor **gout = dt_host_calloc(ctx, sizeof *gout * (size_t)v->n);
  dt_tensor *res = dt_host_calloc(ctx, sizeof *res * (size_t)v->n);
  dt_tensor **gin = dt_host_calloc(ctx, sizeof *gin * (size_t)v->n);
  dt_status s = gout && res && gin ? DT_OK : dt_error(ctx, DT_ERR_NOMEM, WHO, "no memory");
  for (int k = 0; s == DT_OK && k < v->n; k++) {
    gout[k] = dt_var_grad(v->mem[k].unsharded);
    gin[k] = &res[k];
  }
  char saved[sizeof ctx->phase];
  memcpy(saved, ctx->phase, sizeof saved);
  dt_ctx_set_phase(ctx, "backward");
  if (s == DT_OK) s = reduce_unit(ctx, v, gout, (dt_tensor *const *)gin);
  dt_ctx_set_phase(ctx, saved);
  for (int k = 0; res && k < v->n; k++) {
    if (s == DT_OK && res[k].mesh) s = add_grad(ctx, m, m->mods[v->mem[k].mod].weight, &res[k]);
    dt_tensor_free(ctx, &res[k]);
  }
  for (int k = 0; k < v->n; k++) { /* reshard after backward */
    (void)dt_var_set_grad(f->ptape, v->mem[k].unsharded, NULL); /* a drop cannot fail */
    ufree(ctx, &value_of(v->mem[k].unsharded)->local);
    m->mods[v->mem[k].mod].compute = NULL;
  }
  dt_host_free(ctx, gout);
  dt_host_free(ctx, res);
  dt_host_free(ctx, gin);
  return s;
}

/* The step's state (not the views): compute reset, the leaves freed. */
static void pipe_step_free(dt_ctx *ctx, fsdp *f) {
  (void)ctx;
  for (int i = 0; f->pv && i < f->n_units; i++)
    for (int k = 0; k < f->pv[i].n; k++) {
      if (f->pv[i].mem[k].unsharded) f->m->mods[f->pv[i].mem[k].mod].compute = NULL;
      f->pv[i].mem[k].unsharded = NULL;
    }
  dt_tape_free(f->ptape);
  f->ptape = NULL;
  f->in_step = false;
}

static void pipe_free(dt_ctx *ctx, fsdp *f) {
  pipe_step_free(ctx, f);
  for (int i = 0; f->pv && i < f->n_units; i++) dt_host_free(ctx, f->pv[i].mem);
  dt_host_free(ctx, f->pv);
  dt_host_free(ctx, f->opened);
  dt_host_free(ctx, f->reduced);
  dt_host_free(ctx, f->stage);
  dt_host_free(ctx, f->done);
  f->pv = NULL;
  f->opened = f->reduced = f->done = NULL;
  f->stage = NULL;
  f->piped = false;
}

/* Whether unit i opens at md's pre hook in pipeline mode: at its first matched
 * module or at any of its members here, whichever runs first (a root unit has no
 * hook of its own in a stage). */
static bool pipe_opens_at(const fsdp *f, int i, const dt_module *md) {
  const fsdp_unit *v = &f->pv[i];
  if (!v->n || f->opened[i]) return false;
  if (f->u[i].first == md->index) return true;
  for (int k = 0; k < v->n; k++)
    if (v->mem[k].mod == md->index) return true;
  return false;
}

static dt_status param_pre(dt_ctx *ctx, dt_module *md, struct dt_tape *tape, dt_var **io, int n,
                           void *state) {
  (void)io;
  (void)n;
  fsdp *f = state;
  for (int i = 0; f->in_step && i < f->n_units; i++)
    if (pipe_opens_at(f, i, md)) DT_CHECK(pipe_open(ctx, f, i));
  for (int i = 0; !f->in_step && i < f->n_units; i++)
    if (f->u[i].first == md->index && f->u[i].n > 0) DT_CHECK(open_unit(ctx, &f->u[i], tape));
  return DT_OK;
}

static dt_status param_post(dt_ctx *ctx, dt_module *md, struct dt_tape *tape, dt_var **io, int n,
                            void *state) {
  fsdp *f = state;
  if (f->in_step) return DT_OK; /* open until the step's reduction */
  for (int i = 0; i < f->n_units; i++)
    if (f->u[i].last == md->index && f->u[i].n > 0) DT_CHECK(close_unit(ctx, &f->u[i], tape, io, n));
  return DT_OK;
}

static void fsdp_free(dt_ctx *ctx, void *state) {
  fsdp *f = state;
  pipe_free(ctx, f);
  for (int i = 0; i < f->n_units; i++) dt_host_free(ctx, f->u[i].mem);
  dt_host_free(ctx, f->u);
  dt_host_free(ctx, f);
}

/* ---- setup ---------------------------------------------------------------------------- */

/* Whether module i is md or below it ("layers.0.attention.wq" under "layers.0"). */
static bool under(const dt_module *top, const dt_module *md) {
  size_t l = strlen(top->fqn);
  if (!l) return true; /* the model root */
  return !strncmp(md->fqn, top->fqn, l) && (md->fqn[l] == '\0' || md->fqn[l] == '.');
}

/* Whether a mesh dim after the FSDP dims shards tensor dim td of md's weight. */
static int later_shards(const fsdp *f, const dt_module *md, int nd, int td) {
  for (int d = f->fd[f->nfd - 1] + 1; d < nd; d++)
    if (md->wpl[d].kind == DT_PL_SHARD && md->wpl[d].dim == td) return d;
  return -1;
}

/* One member's geometry on this rank's mesh coordinates. */
static dt_status member_layout(dt_ctx *ctx, fsdp *f, dt_module *md, fsdp_member *mb) {
  dt_model *m = f->m;
  int nd, shape[DT_MAX_MESH_DIMS], coords[DT_MAX_MESH_DIMS];
  dt_tensor_mesh_info(m->mesh, &nd, shape, coords);
  for (int k = 0; k < f->nfd; k++)
    if (md->wpl[f->fd[k]].kind != DT_PL_REPLICATE)
      return dt_error(ctx, DT_ERR_INVALID, WHO, "%s: already placed on the %s dim", md->fqn,
                      dt_mesh_name(m->mesh, f->fd[k]));
  if (f->o.replicate_dim >= 0 && md->wpl[f->o.replicate_dim].kind != DT_PL_REPLICATE)
    return dt_error(ctx, DT_ERR_INVALID, WHO, "%s: not Replicate on the dp_replicate dim", md->fqn);
  /* dim 0, unless a later mesh dim shards it: DTensor nests shards left to right,
   * so FSDP's chunk of dim 0 would not be a chunk of that dim's block; dim 1 then
   * (FSDP2's shard_placement_fn returning Shard(1)) */
  int td = 0;
  const int d0 = later_shards(f, md, nd, 0);
  if (d0 >= 0) {
    const int d1 = md->wndim == 2 ? later_shards(f, md, nd, 1) : -1;
    if (md->wndim != 2 || d1 >= 0)
      return dt_error(ctx, DT_ERR_INVALID, WHO,
                      "%s: mesh dim %d (%s) after the FSDP dims shards dim 0 and %s: put it "
                      "before them in the mesh (FSDP splits the rows that dim leaves)",
                      md->fqn, d0, dt_mesh_name(m->mesh, d0),
                      md->wndim != 2 ? "the weight is not 2-D" : "a later dim shards dim 1");
    if (f->o.zero == 1)
      return dt_error(ctx, DT_ERR_UNSUPPORTED, WHO,
                      "%s: ZeRO-1 would shard dim 1 (mesh dim %s after the FSDP dims shards dim "
                      "0), but AdamW's ZeRO-1 state is a shard of rows",
                      md->fqn, dt_mesh_name(m->mesh, d0));
    td = 1;
  }
  for (int d = 0; d < nd; d++) mb->upl[d] = md->wpl[d];
  int64_t lshape[DT_MAX_DIMS], goff[DT_MAX_DIMS];
  dt_local_shape_offset(md->wndim, md->wshape, nd, shape, coords, mb->upl, lshape, goff);
  mb->mod = md->index;
  mb->dim = td;
  mb->outer = 1;
  mb->inner = 1;
  for (int i = 0; i < md->wndim; i++) {
    if (i < td) mb->outer *= lshape[i];
    if (i > td) mb->inner *= lshape[i];
  }
  mb->rows = lshape[td];
  mb->c = (mb->rows + f->W - 1) / f->W;
  if (f->o.zero == 1) { /* the weight stays whole; AdamW's state is the row shard */
    for (int d = 0; d < nd; d++) md->opl[d] = md->wpl[d];
    for (int k = 0; k < f->nfd; k++) md->opl[f->fd[k]] = dt_shard(0);
    md->has_opl = true;
  } else {
    for (int k = 0; k < f->nfd; k++) md->wpl[f->fd[k]] = dt_shard(td);
  }
  return DT_OK;
}

/* A unit over the modules matched[0..nm) (their weights and their descendants' not
 * claimed yet); root: every weight not claimed yet. */
static dt_status add_unit(dt_ctx *ctx, fsdp *f, const char *name, const int *matched, int nm,
                          bool root, bool raf, bool raf_given, bool *claimed) {
  dt_model *m = f->m;
  fsdp_unit *u = &f->u[f->n_units];
  snprintf(u->name, sizeof u->name, "%s", name);
  u->f = f;
  u->raf = raf;
  u->raf_given = raf_given;
  u->first = root ? 0 : m->n_mods;
  u->last = root ? 0 : -1;
  u->mem = dt_host_calloc(ctx, sizeof *u->mem * (size_t)m->n_mods);
  if (!u->mem) return dt_error(ctx, DT_ERR_NOMEM, WHO, "no memory");
  f->n_units++;
  for (int q = 0; q < nm; q++) {
    const int i = matched[q];
    if (i < u->first) u->first = i;
    if (i > u->last) u->last = i;
    for (int j = i; j < m->n_mods; j++) {
      dt_module *md = &m->mods[j];
      if (!under(&m->mods[i], md) || !md->wndim || claimed[j]) continue;
      claimed[j] = true;
      DT_CHECK(member_layout(ctx, f, md, &u->mem[u->n++]));
    }
  }
  for (int j = 0; root && j < m->n_mods; j++) {
    if (!m->mods[j].wndim || claimed[j]) continue;
    claimed[j] = true;
    DT_CHECK(member_layout(ctx, f, &m->mods[j], &u->mem[u->n++]));
  }
  for (int k = 0; k < u->n; k++) {
    u->mem[k].off = u->P;
    u->P += u->mem[k].outer * u->mem[k].c * u->mem[k].inner;
  }
  return DT_OK;
}

/* The units of one entry: "root"; a group (one unit over every match); or one
 * unit per matched module (TorchTitan's fully_shard of each block). */
static dt_status entry_units(dt_ctx *ctx, fsdp *f, const dt_plan_entry *en, bool *claimed,
                             int *matched) {
  dt_model *m = f->m;
  if (en->style.kind != DT_STYLE_FULLY_SHARD)
    return dt_error(ctx, DT_ERR_INVALID, WHO, "entry '%s' is not fully_shard", en->pattern);
  char pats[8][96];
  const int np = dt_plan_entry_patterns(en, pats, 8);
  const bool root = np == 1 && !strcmp(pats[0], "root");
  /* FSDP2's default (None): True, except the root, which is never resharded */
  const bool raf = f->o.zero == 2 ? false
                   : en->style.reshard_after_forward >= 0 ? en->style.reshard_after_forward == 1
                                                          : !root;
  const bool given = en->style.reshard_after_forward >= 0;
  if (root) return add_unit(ctx, f, "root", NULL, 0, true, raf, given, claimed);
  int nm = 0, hits = 0;
  for (int i = 1; i < m->n_mods; i++) {
    bool hit = false;
    for (int p = 0; p < np && !hit; p++) hit = dt_fqn_match(pats[p], m->mods[i].fqn);
    if (!hit) continue;
    hits++;
    if (np > 1) matched[nm++] = i;
    else DT_CHECK(add_unit(ctx, f, m->mods[i].fqn, &i, 1, false, raf, given, claimed));
  }
  if (!hits) return dt_error(ctx, DT_ERR_INVALID, WHO, "entry '%s' matches no module", en->pattern);
  if (np > 1) return add_unit(ctx, f, en->pattern, matched, nm, false, raf, given, claimed);
  return DT_OK;
}

dt_status dt_fully_shard(dt_ctx *ctx, dt_model *m, const dt_plan_entry *entries, int n_entries,
                         const dt_fsdp_opts *o) {
  if (!ctx || !m || !o || (n_entries && !entries) || n_entries < 0)
    return dt_error(ctx, DT_ERR_INVALID, WHO, "NULL argument");
  const int nd = dt_mesh_ndim(m->mesh);
  const int sd = o->shard_dim, cd = o->cp_dim, rd = o->replicate_dim;
  if (sd < -1 || sd >= nd || cd < -1 || cd >= nd || (sd < 0 && cd < 0) || rd < -1 || rd >= nd ||
      (rd >= 0 && (rd == sd || rd == cd)))
    return dt_error(ctx, DT_ERR_INVALID, WHO,
                    "bad mesh dims (shard %d, cp %d, replicate %d; %d dims)", sd, cd, rd, nd);
  if (sd >= 0 && cd >= 0 && cd != sd + 1)
    return dt_error(ctx, DT_ERR_INVALID, WHO,
                    "cp dim %d must follow the dp_shard dim %d (FSDP shards over the flattened "
                    "dp_shard x cp, dp_shard outer)", cd, sd);
  if (o->zero < 1 || o->zero > 3)
    return dt_error(ctx, DT_ERR_INVALID, WHO, "ZeRO stage %d (1, 2 or 3)", o->zero);
  if (m->param_state) return dt_error(ctx, DT_ERR_INVALID, WHO, "the model is fully_shard'ed already");
  for (int i = 0; i < m->n_mods; i++)
    if (m->mods[i].weight)
      return dt_error(ctx, DT_ERR_INVALID, WHO, "apply fully_shard before dt_model_materialize");
  fsdp *f = dt_host_calloc(ctx, sizeof *f);
  if (f) f->u = dt_host_calloc(ctx, sizeof *f->u * (size_t)(m->n_mods + n_entries + 1));
  bool *claimed = dt_host_calloc(ctx, sizeof *claimed * (size_t)m->n_mods);
  int *matched = dt_host_alloc(ctx, sizeof *matched * (size_t)m->n_mods);
  if (!f || !f->u || !claimed || !matched) {
    if (f) dt_host_free(ctx, f->u);
    dt_host_free(ctx, f);
    dt_host_free(ctx, claimed);
    dt_host_free(ctx, matched);
    return dt_error(ctx, DT_ERR_NOMEM, WHO, "no memory");
  }
  f->o = *o;
  f->m = m;
  if (sd >= 0) f->fd[f->nfd++] = sd;
  if (cd >= 0) f->fd[f->nfd++] = cd;
  f->W = 1;
  f->coord = 0;
  for (int k = 0; k < f->nfd; k++) {
    f->W *= dt_mesh_size(m->mesh, f->fd[k]);
    f->coord = f->coord * dt_mesh_size(m->mesh, f->fd[k]) + dt_mesh_coord(m->mesh, f->fd[k]);
  }
  dt_status s = DT_OK;
  if (cd < 0) {
    f->comm = dt_mesh_comm(m->mesh, sd);
  } else { /* one communicator over the pair (collective: every rank calls this); over cp
            * alone too, named as TorchTitan's mesh, so that its rows are told apart
            * from context parallel's own on cp */
    const char *names[2] = {sd >= 0 ? dt_mesh_name(m->mesh, sd) : dt_mesh_name(m->mesh, cd),
                            dt_mesh_name(m->mesh, cd)};
    dt_mesh *sub = NULL, *flat = NULL;
    s = dt_mesh_slice(m->mesh, f->nfd, names + (sd >= 0 ? 0 : 1), &sub);
    if (s == DT_OK) s = dt_mesh_flatten(sub, sd >= 0 ? NULL : "dp_shard_cp", &flat);
    if (s == DT_OK) f->comm = dt_mesh_comm(flat, 0);
  }
  for (int e = 0; s == DT_OK && e < n_entries; e++)
    s = entry_units(ctx, f, &entries[e], claimed, matched);
  for (int j = 0; s == DT_OK && j < m->n_mods; j++)
    if (m->mods[j].wndim && !claimed[j])
      s = dt_error(ctx, DT_ERR_INVALID, WHO, "%s is in no fully_shard unit", m->mods[j].fqn);
  dt_host_free(ctx, claimed);
  dt_host_free(ctx, matched);
  if (s != DT_OK) {
    for (int i = 0; i < f->n_units; i++) /* placements back to what they were */
      for (int k = 0; k < f->u[i].n; k++) {
        for (int q = 0; q < f->nfd; q++) m->mods[f->u[i].mem[k].mod].wpl[f->fd[q]] = dt_replicate();
        m->mods[f->u[i].mem[k].mod].has_opl = false;
      }
    fsdp_free(ctx, f);
    return s;
  }
  m->param_pre = o->zero == 1 ? NULL : param_pre; /* ZeRO-1 never gathers for compute */
  m->param_post = o->zero == 1 ? NULL : param_post;
  m->param_state = f;
  m->param_free = fsdp_free;
  return DT_OK;
}

/* ---- ZeRO-1: gradients all-reduced, updated rows all-gathered ------------------------- */

static fsdp *fsdp_of(dt_model *m) { return m && m->param_free == fsdp_free ? m->param_state : NULL; }

/* One unit's gradients summed over the group c of mesh dims dims[0..n) (one flat
 * all_reduce): a gradient Partial(sum) there is summed, one Replicate on some of
 * them counts once (from coordinate 0 of those); afterwards it is Replicate on
 * all of them. */
static dt_status zero1_reduce(dt_ctx *ctx, fsdp *f, fsdp_unit *u, dt_comm *c, const int *dims,
                              int n_dims) {
  dt_model *m = f->m;
  const dt_dtype md = m->dtype, rt = comm_dtype(f, true);
  const size_t es = dt_dtype_size(rt);
  int64_t total = 0;
  for (int k = 0; k < u->n; k++) total += u->mem[k].outer * u->mem[k].rows * u->mem[k].inner;
  fdev D;
  DT_CHECK(on_dev(ctx, unit_dev(u), &D));
  dt_array db;
  DT_CHECK(cbuf(ctx, &D, rt, total, true, &db));
  char *buf = db.data;
  bool any = false;
  int64_t at = 0;
  dt_status s = DT_OK;
  for (int k = 0; k < u->n && s == DT_OK; k++) {
    /* a gradient the ops left Shard(d) on a reduced dim (a batch too small to split
     * over the data ranks makes the planner reduce-scatter it) is gathered first:
     * it is then Replicate there and, already summed, counts once */
    dt_var *w = m->mods[u->mem[k].mod].weight;
    const dt_tensor *g = dt_var_grad(w);
    if (!g) continue;
    dt_placement tgt[DT_MAX_MESH_DIMS];
    memcpy(tgt, g->pl, sizeof tgt);
    bool sharded = false;
    for (int q = 0; q < n_dims; q++)
      if (tgt[dims[q]].kind == DT_PL_SHARD) {
        tgt[dims[q]] = dt_replicate();
        sharded = true;
      }
    dt_tensor whole;
    if (sharded && (s = dt_redistribute(ctx, g, tgt, DT_PLANNER_GREEDY, &whole)) == DT_OK)
      s = dt_var_set_grad(m->tape, w, &whole);
  }
  for (int k = 0; k < u->n && s == DT_OK; k++) {
    const fsdp_member *mb = &u->mem[k];
    const dt_tensor *g = dt_var_grad(m->mods[mb->mod].weight);
    const int64_t n = mb->outer * mb->rows * mb->inner;
    bool contribute = g && g->local.numel == n;
    for (int q = 0; g && q < n_dims; q++) {
      const bool partial = g->pl[dims[q]].kind == DT_PL_PARTIAL;
      any = any || partial;
      if (!partial && dt_mesh_coord(m->mesh, dims[q]) != 0) contribute = false;
    }
    if (contribute) s = convert(&D, buf + (size_t)at * es, rt, g->local.data, md, n);
    at += n;
  }
  if (s == DT_OK && any) s = dt_comm_all_reduce(c, buf, buf, (size_t)total, rt, DT_RED_SUM);
  at = 0;
  for (int k = 0; any && s == DT_OK && k < u->n; k++) {
    const fsdp_member *mb = &u->mem[k];
    dt_tensor *g = (dt_tensor *)dt_var_grad(m->mods[mb->mod].weight); /* the tape's, reduced in place */
    const int64_t n = mb->outer * mb->rows * mb->inner;
    /* the fault keeps each rank's own partial sum */
    if (g && g->local.numel == n && strcmp(m->mods[mb->mod].fqn, f->o.fault_no_reduce)) {
      s = convert(&D, g->local.data, md, buf + (size_t)at * es, rt, n);
    }
    for (int q = 0; g && q < n_dims; q++) g->pl[dims[q]] = dt_replicate();
    at += n;
  }
  cfree(ctx, &db);
  return s;
}

dt_status dt_fsdp_reduce_grads(dt_ctx *ctx, dt_model *m) {
  fsdp *f = fsdp_of(m);
  if (!f || f->o.zero != 1) return DT_OK; /* ZeRO-2/3 reduce in backward */
  char saved[sizeof ctx->phase];
  memcpy(saved, ctx->phase, sizeof saved);
  dt_ctx_set_phase(ctx, "backward");
  dt_status s = DT_OK;
  fsdp_unit *us = f->piped ? f->pv : f->u; /* pipelined: the units' members here */
  for (int i = 0; s == DT_OK && i < f->n_units; i++) {
    if (!us[i].n) continue;
    s = zero1_reduce(ctx, f, &us[i], f->comm, f->fd, f->nfd);
    if (s == DT_OK && f->o.replicate_dim >= 0)
      s = zero1_reduce(ctx, f, &us[i], dt_mesh_comm(m->mesh, f->o.replicate_dim),
                       &f->o.replicate_dim, 1);
  }
  dt_ctx_set_phase(ctx, saved);
  return s;
}

dt_status dt_fsdp_after_step(dt_ctx *ctx, dt_model *m) {
  fsdp *f = fsdp_of(m);
  if (!f || f->o.zero != 1) return DT_OK;
  const dt_dtype md = m->dtype;
  const size_t es = dt_dtype_size(md);
  dt_status s = DT_OK;
  fsdp_unit *us = f->piped ? f->pv : f->u; /* pipelined: the units' members here */
  for (int i = 0; s == DT_OK && i < f->n_units; i++) {
    fsdp_unit *u = &us[i];
    if (!u->n) continue;
    fdev D;
    dt_array sb = {0}, rb = {0};
    s = on_dev(ctx, unit_dev(u), &D);
    if (s == DT_OK) s = cbuf(ctx, &D, md, u->P, true, &sb);
    if (s == DT_OK) s = cbuf(ctx, &D, md, u->P * f->W, false, &rb);
    char *send = sb.data, *recv = rb.data;
    for (int k = 0; s == DT_OK && k < u->n; k++) { /* this rank's updated rows */
      const fsdp_member *mb = &u->mem[k];
      const dt_tensor *w = dt_var_value(m->mods[mb->mod].weight);
      s = pack(ctx, &D, f, mb, f->coord, send + (size_t)mb->off * es, md, w->local.data, md);
    }
    if (s == DT_OK) s = dt_comm_all_gather(f->comm, send, recv, (size_t)u->P, md);
    for (int k = 0; s == DT_OK && k < u->n; k++) {
      void *dst = value_of(m->mods[u->mem[k].mod].weight)->local.data;
      s = unpack(ctx, &D, u, k, recv, md, dst, md);
    }
    cfree(ctx, &sb);
    cfree(ctx, &rb);
  }
  return s;
}

void dt_fsdp_release(dt_ctx *ctx, dt_model *m) {
  if (!m || m->param_free != fsdp_free) return;
  fsdp_free(ctx, m->param_state);
  m->param_pre = m->param_post = NULL;
  m->param_state = NULL;
  m->param_free = NULL;
}

/* ---- pipeline mode: the API ------------------------------------------------------------ */

dt_status dt_fsdp_pipeline_begin(dt_ctx *ctx, dt_model *m, const int *stage_of) {
  fsdp *f = fsdp_of(m);
  if (!f) return DT_OK;
  if (!stage_of) return dt_error(ctx, DT_ERR_INVALID, WHO, "NULL argument");
  if (f->in_step) return dt_error(ctx, DT_ERR_INVALID, WHO, "a pipeline step is running already");
  for (int i = 0; f->o.zero == 3 && i < f->n_units; i++)
    if (f->u[i].raf_given && f->u[i].raf)
      return dt_error(ctx, DT_ERR_UNSUPPORTED, WHO,
                      "unit %s: reshard_after_forward=True inside pipeline stages is not "
                      "supported (TorchTitan's default with pp: False, kept for the step)",
                      f->u[i].name);
  pipe_free(ctx, f); /* the previous step's views */
  const size_t nu = (size_t)f->n_units, nm = (size_t)m->n_mods;
  int ns = 0;
  for (size_t i = 0; i < nm; i++)
    if (stage_of[i] >= ns) ns = stage_of[i] + 1;
  f->pv = dt_host_calloc(ctx, sizeof *f->pv * (nu ? nu : 1));
  f->opened = dt_host_calloc(ctx, sizeof *f->opened * (nu ? nu : 1));
  f->reduced = dt_host_calloc(ctx, sizeof *f->reduced * (nu ? nu : 1));
  f->stage = dt_host_alloc(ctx, sizeof *f->stage * nm);
  f->done = dt_host_calloc(ctx, sizeof *f->done * (size_t)(ns ? ns : 1));
  dt_status s = f->pv && f->opened && f->reduced && f->stage && f->done
                    ? DT_OK
                    : dt_error(ctx, DT_ERR_NOMEM, WHO, "no memory");
  if (s == DT_OK) memcpy(f->stage, stage_of, sizeof *f->stage * nm);
  f->n_stages = ns;
  for (size_t i = 0; s == DT_OK && i < nu; i++) { /* the members here, packed anew */
    const fsdp_unit *u = &f->u[i];
    fsdp_unit *v = &f->pv[i];
    *v = *u;
    v->n = 0;
    v->P = 0;
    v->mem = dt_host_calloc(ctx, sizeof *v->mem * (size_t)(u->n ? u->n : 1));
    if (!v->mem) {
      s = dt_error(ctx, DT_ERR_NOMEM, WHO, "no memory");
      break;
    }
    for (int k = 0; k < u->n; k++) {
      if (stage_of[u->mem[k].mod] < 0) continue;
      fsdp_member *mb = &v->mem[v->n++];
      *mb = u->mem[k];
      mb->unsharded = NULL;
      mb->off = v->P;
      v->P += mb->outer * mb->c * mb->inner;
    }
  }
  if (s == DT_OK && f->o.zero != 1) s = dt_tape_create(ctx, NULL, &f->ptape);
  if (s != DT_OK) {
    pipe_free(ctx, f);
    return s;
  }
  f->piped = true;
  f->in_step = f->o.zero != 1; /* ZeRO-1 gathers nothing for compute */
  return DT_OK;
}

/* Reduces every open unit whose members' stages have all run their last backward. */
static dt_status pipe_reduce_ready(dt_ctx *ctx, fsdp *f, bool all) {
  for (int i = 0; i < f->n_units; i++) {
    if (!f->opened[i] || f->reduced[i]) continue;
    bool ready = true;
    for (int k = 0; !all && k < f->pv[i].n; k++) ready = ready && f->done[f->stage[f->pv[i].mem[k].mod]];
    if (ready) DT_CHECK(pipe_reduce(ctx, f, i));
  }
  return DT_OK;
}

dt_status dt_fsdp_pipeline_stage_done(dt_ctx *ctx, dt_model *m, int stage) {
  fsdp *f = fsdp_of(m);
  if (!f || !f->in_step) return DT_OK;
  if (stage < 0 || stage >= f->n_stages)
    return dt_error(ctx, DT_ERR_INVALID, WHO, "stage %d: this rank holds stages below %d", stage,
                    f->n_stages);
  f->done[stage] = true;
  return pipe_reduce_ready(ctx, f, false);
}

dt_status dt_fsdp_pipeline_end(dt_ctx *ctx, dt_model *m, bool reduce) {
  fsdp *f = fsdp_of(m);
  if (!f || !f->in_step) return DT_OK;
  dt_status s = reduce ? pipe_reduce_ready(ctx, f, true) : DT_OK;
  pipe_step_free(ctx, f);
  return s;
}
