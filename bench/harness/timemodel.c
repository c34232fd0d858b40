/* bench/harness/timemodel.c: the predicted step of a config (timemodel.h).
 *
 * Per role (one rank standing for its alike ranks):
 *   compute   each compute-ledger row: "gemm" at the hardware's GEMM efficiency
 *             for its shape (Float8: the linear layers at the fp8 rate plus their
 *             scaling casts, the output layer kept in bf16 as TorchTitan's
 *             float8 converter filters it); "attn_gemm" (attention's tiles) as one
 *             fused kernel at the hardware's attention efficiency; attention's row
 *             kernels (softmax, online softmax, lse) live inside that fused
 *             kernel and cost nothing more; every other kernel at HBM bandwidth,
 *             with torch.compile fusing pointwise chains (see COMPILE_BYTES).
 *   comm      each comm-ledger row: calls x sb_hw_coll_best_s of its mean call,
 *             over the group its mesh dim is, laid on nodes in TorchTitan's rank
 *             order (tp innermost); a recv is the far end of a send and is not
 *             charged again.
 *   overlap   FSDP (dp_shard, dp_shard_cp): the all-gathers hide behind the
 *             compute of the phase that issues them and the reduce-scatters
 *             behind backward, except the first gather and the last reduce
 *             (FSDP2's prefetch: torch/distributed/fsdp/_fully_shard/
 *             _fsdp_param_group.py, one unit ahead); DDP / HSDP all-reduce on
 *             dp_replicate behind backward except the last bucket; TP exposed,
 *             or with async TP hidden behind the GEMMs except one chunk in tp
 *             (torch/distributed/_symmetric_memory fused_all_gather_matmul splits
 *             the gather into tp chunks); the CP ring (send/recv on cp) behind the
 *             attention kernel its rotation feeds, the all-gather rotation exposed;
 *             everything else (the loss's reductions, clipping's norm) exposed.
 *   pipeline  the schedule's F and B actions of every pp rank, each F taking its
 *             rank's forward (compute + exposed TP/CP) over v m, each B its
 *             backward + recompute over v m, a stage boundary that crosses ranks
 *             adding the send's time; the makespan of that DAG is the pipelined
 *             part of the step, and its idle time on the slowest rank the bubble.
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "timemodel.h"

/* torch.compile (Inductor) fuses a chain of pointwise kernels into one, reading
 * the chain's inputs once and writing its outputs once: the chains of a Llama
 * block (RMSNorm's square-mean-scale, SwiGLU's silu-mul, rope's rotations, the
 * residual adds and casts) have two to four kernels, so about half the
 * kernel-by-kernel bytes remain. An assumption stated as one factor, checked by
 * the published compile rows (results/published.csv), not fitted to one. */
static const double COMPILE_BYTES = 0.5;
/* Float8 tensorwise scaling of a GEMM operand: amax read (bf16) plus the cast's
 * bf16 read and fp8 write, 5 bytes per element; compile fuses the amax into the
 * producer (3 bytes). torchao float8 training, "tensorwise" recipe. */
static const double F8_SCALE_BYTES = 5.0, F8_SCALE_BYTES_COMPILED = 3.0;

/* The mesh dims of a comm row's group name, as a mask over sb_dim_names (pp
 * dp_replicate dp_shard cp tp): a dim's name, or a flattened group's, its members'
 * names joined by '_' in mesh order (dt_mesh_flatten; TorchTitan's ParallelDims
 * names dp = dp_replicate x dp_shard and dp_shard_cp). 0: unknown. */
static unsigned dim_mask(const char *name) {
  static const struct { const char *n; unsigned m; } part[] = {
      {"dp_replicate", 2u}, {"dp_shard", 4u}, {"pp", 1u}, {"cp", 8u}, {"tp", 16u},
      {"dp", 2u | 4u}};
  unsigned mask = 0;
  const char *c = name;
  while (*c) {
    size_t i = 0, n = 0;
    for (; i < sizeof part / sizeof part[0]; i++) {
      n = strlen(part[i].n);
      if (!strncmp(c, part[i].n, n) && (c[n] == '\0' || c[n] == '_')) break;
    }
    if (i == sizeof part / sizeof part[0]) return 0;
    mask |= part[i].m;
    c += n;
    if (*c == '_') c++;
  }
  return mask;
}

/* Float8's TP all-gathers (torchao float8_tensor_parallel.py, which TorchTitan's
 * apply_tp uses for the blocks' linears when Float8 is on): PrepareFloat8ModuleInput
 * casts a block's attention / feed_forward input to float8 before its all-gather,
 * and Float8RowwiseParallel casts wo's and w2's output gradients to float8 before the
 * backward's all-gather, so every TP all-gather inside a block moves 1 byte per
 * element. The output layer (the float8 converter filters it) and the embedding
 * gather in bf16; reduce-scatters stay bf16. Row c's seconds from the role's rows
 * per module (the ledger's scope), the blocks' ("layers.*") at half their bytes;
 * -1 when the role's per-module rows do not cover it. */
static double f8_tp_gathers(const sb_hw *hw, const sb_role *ro, const sb_comm_row *c, int n,
                            int per_node) {
  double all = 0;
  int64_t calls = 0;
  for (int k = 0; k < ro->n_fcomm; k++) {
    const sb_fqn_comm *q = &ro->fcomm[k];
    if (q->calls <= 0 || strcmp(q->op, c->op) || strcmp(q->mesh_dim, c->mesh_dim) ||
        strcmp(q->phase, c->phase))
      continue;
    const double b = (double)q->payload_bytes / (double)q->calls *
                     (strncmp(q->fqn, "layers.", 7) ? 1.0 : 0.5);
    all += sb_hw_coll_best_s(hw, c->op, b, n, per_node) * (double)q->calls;
    calls += q->calls;
  }
  return calls == c->calls ? all : -1; /* -1: no per-module rows cover the row */
}

/* Group size and members per node of a group over the dims in mask: ranks are
 * laid out row-major in (pp, dp_replicate, dp_shard, cp, tp), gpus_per_node
 * consecutive ranks per node, so a dim's stride is the product of the dims
 * inside it. */
static void group_span(const int dims[SB_NDIMS], unsigned mask, int gpn, int *n, int *per_node) {
  int size = 1, inner = -1;
  for (int d = SB_NDIMS - 1; d >= 0; d--)
    if (mask & (1u << d)) {
      size *= dims[d];
      if (inner < 0) inner = d;
    }
  long stride = 1;
  for (int d = SB_NDIMS - 1; d > inner && inner >= 0; d--) stride *= dims[d];
  *n = size;
  if (gpn < 1) gpn = 1;
  if (stride >= gpn) {
    *per_node = 1;
  } else {
    long fit = gpn / stride;
    *per_node = (int)(fit < size ? fit : size);
  }
  if (*per_node < 1) *per_node = 1;
}

typedef struct role_time {
  double comp[SB_ROLE_PHASES];    /* compute seconds per phase */
  double attn[SB_ROLE_PHASES];    /* of which the fused attention kernels */
  double lin[SB_ROLE_PHASES];     /* of which the linear GEMMs */
  /* comm seconds per dim and phase, split by kind */
  double fsdp_ag[SB_ROLE_PHASES], fsdp_rs, fsdp_first, fsdp_last;
  double ddp_ar, ddp_last;
  double tp[SB_ROLE_PHASES];
  double cp_ring[SB_ROLE_PHASES], cp_other[SB_ROLE_PHASES];
  double pp_send, pp_send_per_call;
  double other[SB_ROLE_PHASES];
  double comm_dim[SB_NDIMS];      /* all collective time, attributed to the outermost dim */
} role_time;

static int phase_of(const char *p) {
  for (int q = 0; q < SB_ROLE_PHASES; q++)
    if (!strcmp(p, sb_role_phases[q])) return q;
  return SB_ROLE_PHASES - 1;
}

static bool attn_row_kernel(const char *op) {
  return !strncmp(op, "attn_", 5) && strcmp(op, "attn_gemm");
}

static bool pointwise(const char *op) {
  return strcmp(op, "adamw") && strcmp(op, "embedding") && strcmp(op, "embedding_bwd") &&
         strncmp(op, "ce_", 3) && strcmp(op, "cross_entropy_bwd");
}

static int hw_dtype_of(int dt) {
  switch ((dt_dtype)dt) {
    case DT_BF16: return SB_HW_BF16;
    default: return SB_HW_F32;
  }
}

static int role_costs(const sb_hw *hw, const sb_opts *o, const sb_result *meta,
                      const sb_role *ro, const sb_tm_features *f, role_time *t, char *err,
                      size_t errn) {
  memset(t, 0, sizeof *t);
  const int64_t V = meta->shape.vocab;
  for (int i = 0; i < ro->n_krows; i++) {
    const sb_krow *k = &ro->krows[i];
    const int p = phase_of(k->phase);
    const double calls = (double)k->calls;
    int dt = hw_dtype_of(k->dtype);
    double s;
    if (!strcmp(k->op, "gemm")) {
      const bool output = k->m == V || k->n == V || k->k == V ||
                          (o->dims[4] > 1 && (k->m == V / o->dims[4] || k->n == V / o->dims[4] ||
                                              k->k == V / o->dims[4]));
      if (f->float8 && dt == SB_HW_BF16 && !output && hw->peak_flops[SB_HW_FP8] > 0) {
        s = sb_hw_gemm_s(hw, SB_HW_FP8, k->m, k->n, k->k, k->batch);
        const double elems = (double)k->batch * ((double)k->m * k->k + (double)k->k * k->n);
        s += sb_hw_mem_s(hw, elems * (f->compile ? F8_SCALE_BYTES_COMPILED : F8_SCALE_BYTES));
      } else {
        s = sb_hw_gemm_s(hw, dt, k->m, k->n, k->k, k->batch);
      }
      t->lin[p] += s * calls;
    } else if (!strcmp(k->op, "attn_gemm")) {
      const double eff = hw->attn_eff[dt];
      if (!(eff > 0) || !(hw->peak_flops[dt] > 0)) {
        snprintf(err, errn, "%s: no attention efficiency or peak for the run's dtype", hw->name);
        return -1;
      }
      s = k->flops / (hw->peak_flops[dt] * eff);
      t->attn[p] += s * calls;
    } else if (attn_row_kernel(k->op)) {
      s = 0; /* inside the fused attention kernel */
    } else {
      double b = k->bytes;
      if (f->compile && pointwise(k->op)) b *= COMPILE_BYTES;
      s = sb_hw_mem_s(hw, b);
    }
    if (hw->kernel_s > 0 && !attn_row_kernel(k->op) && strcmp(k->op, "attn_gemm") &&
        s < hw->kernel_s)
      s = hw->kernel_s; /* a launch's floor */
    t->comp[p] += s * calls;
  }

  /* ranks sharing a host's cores (threads ranks on a CPU) run at cores / ranks */
  if (hw->shared_cores > 0) {
    int world = 1;
    for (int d = 0; d < SB_NDIMS; d++) world *= o->dims[d];
    const int per = world < hw->gpus_per_node ? world : hw->gpus_per_node;
    if (per > hw->shared_cores) {
      const double x = (double)per / hw->shared_cores;
      for (int p = 0; p < SB_ROLE_PHASES; p++) t->comp[p] *= x, t->attn[p] *= x, t->lin[p] *= x;
    }
  }
  for (int i = 0; i < ro->n_comm; i++) {
    const sb_comm_row *c = &ro->comm[i];
    if (!strcmp(c->op, "recv") || c->calls <= 0) continue;
    const unsigned mask = dim_mask(c->mesh_dim);
    if (!mask) {
      snprintf(err, errn, "comm row on '%s': not a mesh dim the time model knows", c->mesh_dim);
      return -1;
    }
    int n, per_node;
    group_span(o->dims, mask, hw->gpus_per_node, &n, &per_node);
    double bytes = (double)c->payload_bytes / (double)c->calls;
    const bool fsdp = (mask == 4u || mask == (4u | 8u)) &&
                      (!strcmp(c->op, "all_gather") || !strcmp(c->op, "reduce_scatter"));
    if (fsdp && f->float8 && !strcmp(c->op, "all_gather")) bytes *= 0.5; /* fp8 all-gather */
    const double one = sb_hw_coll_best_s(hw, c->op, bytes, n, per_node);
    const double f8 = mask == 16u && f->float8 && !strcmp(c->op, "all_gather")
                          ? f8_tp_gathers(hw, ro, c, n, per_node) : -1;
    const double all = f8 >= 0 ? f8 : one * (double)c->calls;
    const int p = phase_of(c->phase);
    int outer = 0;
    while (!(mask & (1u << outer))) outer++;
    t->comm_dim[outer] += all;
    if (fsdp && !strcmp(c->op, "all_gather")) {
      t->fsdp_ag[p] += all;
      if (p == 0 && t->fsdp_first == 0) t->fsdp_first = one;
    } else if (fsdp) {
      t->fsdp_rs += all;
      t->fsdp_last = one;
    } else if (mask == 2u && !strcmp(c->op, "all_reduce") && p == 1) {
      t->ddp_ar += all;
      t->ddp_last = one;
    } else if (mask == 16u && p != 3) {
      t->tp[p] += all;
    } else if (mask == 8u && !strcmp(c->op, "send")) {
      t->cp_ring[p] += all;
    } else if (mask == 8u && p != 3) {
      t->cp_other[p] += all;
    } else if (mask == 1u && !strcmp(c->op, "send")) {
      t->pp_send += all;
      t->pp_send_per_call = one;
    } else {
      t->other[p] += all;
    }
  }
  return 0;
}

/* Exposed TP and CP seconds of phase p (they ride inside the pipeline's actions). */
static double exposed_tp(const role_time *t, int p, const sb_opts *o, const sb_tm_features *f) {
  if (!f->async_tp) return t->tp[p];
  const double chunk = t->tp[p] / (o->dims[4] > 1 ? o->dims[4] : 1);
  const double rest = t->tp[p] - chunk - t->lin[p];
  return chunk + (rest > 0 ? rest : 0);
}
static double exposed_cp(const role_time *t, int p) {
  const double r = t->cp_ring[p] - t->attn[p];
  return t->cp_other[p] + (r > 0 ? r : 0);
}
static double pos(double x) { return x > 0 ? x : 0; }

/* What a role spends outside the pipelined span: FSDP's exposed gathers and
 * reduce-scatters (the first gather and the last reduce, and what compute cannot
 * hide), DDP's last bucket and the excess over backward, both per microstep; and
 * once per step the optimizer's compute and collectives. */
typedef struct outside_parts {
  double fsdp, ddp, opt;
} outside_parts;

static outside_parts outside(const role_time *t) {
  const double fwd = t->comp[0], bwd = t->comp[1] + t->comp[2];
  outside_parts o;
  o.fsdp = t->fsdp_first + pos(t->fsdp_ag[0] - fwd - t->fsdp_first) +
           pos(t->fsdp_ag[1] + t->fsdp_ag[2] + t->fsdp_rs - t->fsdp_last - bwd) + t->fsdp_last +
           t->fsdp_ag[3];
  o.ddp = t->ddp_last + pos(t->ddp_ar - t->ddp_last - bwd);
  o.opt = t->comp[3] + t->comp[4] + t->tp[3] + t->cp_other[3] + t->cp_ring[3] + t->other[3] +
          t->other[4];
  return o;
}

/* The pipelined makespan of the F / B actions with per-pp-rank times (tf, tb), a
 * cross-rank boundary costing hop; busy of the slowest rank into *busy. */
static int simulate_pp(const sb_shape_facts *sf, const double *tf, const double *tb, double hop,
                       double *makespan, double *busy_max, char *err, size_t errn) {
  const int P = sf->pp, S = sf->pp * sf->pp_v, M = sf->pp_m;
  double *fend = malloc(sizeof *fend * (size_t)S * (size_t)M);
  double *bend = malloc(sizeof *bend * (size_t)S * (size_t)M);
  int *at = calloc((size_t)P, sizeof *at), *off = calloc((size_t)P + 1, sizeof *off);
  double *clock = calloc((size_t)P, sizeof *clock), *busy = calloc((size_t)P, sizeof *busy);
  int rc = 0;
  if (!fend || !bend || !at || !off || !clock || !busy) {
    snprintf(err, errn, "out of memory");
    rc = -1;
    goto out;
  }
  for (int i = 0; i < S * M; i++) fend[i] = bend[i] = -1;
  for (int r = 0; r < P; r++) off[r + 1] = off[r] + sf->pp_len[r];
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < P; r++) {
      while (at[r] < sf->pp_len[r]) {
        const dt_pp_action a = sf->pp_acts[off[r] + at[r]];
        const int s = a.stage, m = a.mb;
        if (s < 0 || s >= S || m < 0 || m >= M) {
          snprintf(err, errn, "pipeline action %d/%d out of range", s, m);
          rc = -1;
          goto out;
        }
        double ready = clock[r];
        if (a.kind == DT_PP_F) {
          if (s > 0) {
            const double e = fend[(s - 1) * M + m];
            if (e < 0) break;
            const double d = e + (dt_pp_stage_rank(s - 1, P) != r ? hop : 0);
            ready = d > ready ? d : ready;
          }
          fend[s * M + m] = ready + tf[r];
          clock[r] = ready + tf[r];
          busy[r] += tf[r];
        } else {
          const double own = fend[s * M + m];
          if (own < 0) break;
          ready = own > ready ? own : ready;
          if (s < S - 1) {
            const double e = bend[(s + 1) * M + m];
            if (e < 0) break;
            const double d = e + (dt_pp_stage_rank(s + 1, P) != r ? hop : 0);
            ready = d > ready ? d : ready;
          }
          bend[s * M + m] = ready + tb[r];
          clock[r] = ready + tb[r];
          busy[r] += tb[r];
        }
        at[r]++;
        moved = true;
      }
    }
  }
  for (int r = 0; r < P; r++)
    if (at[r] < sf->pp_len[r]) {
      snprintf(err, errn, "pipeline schedule deadlocks at pp rank %d", r);
      rc = -1;
      goto out;
    }
  double span = 0, bm = 0;
  for (int r = 0; r < P; r++) {
    span = clock[r] > span ? clock[r] : span;
    bm = busy[r] > bm ? busy[r] : bm;
  }
  *makespan = span;
  *busy_max = bm;
out:
  free(fend);
  free(bend);
  free(at);
  free(off);
  free(clock);
  free(busy);
  return rc;
}

int sb_predict(const sb_hw *hw, const sb_opts *o, const sb_result *meta,
               const sb_tm_features *f, sb_prediction *p, char *err, size_t errn) {
  memset(p, 0, sizeof *p);
  if (!meta->roles || meta->n_roles < 1 || !meta->shape.role_of) {
    snprintf(err, errn, "no shape-only roles to predict from");
    return -1;
  }
  const sb_shape_facts *sf = &meta->shape;
  const int nr = meta->n_roles;
  role_time *rt = calloc((size_t)nr, sizeof *rt);
  if (!rt) {
    snprintf(err, errn, "out of memory");
    return -1;
  }
  int rc = 0;
  for (int i = 0; i < nr && !rc; i++) rc = role_costs(hw, o, meta, &meta->roles[i], f, &rt[i], err, errn);
  /* per role: the step outside the pipeline (FSDP, DDP, the optimizer, other comm) */
  double *tf = NULL, *tb = NULL;
  const int P = sf->pp > 1 ? sf->pp : 1;
  if (!rc) {
    tf = calloc((size_t)P, sizeof *tf);
    tb = calloc((size_t)P, sizeof *tb);
    if (!tf || !tb) snprintf(err, errn, "out of memory"), rc = -1;
  }
  /* the slowest role at each pp coordinate sets that rank's action times */
  int *pp_role = rc ? NULL : malloc(sizeof *pp_role * (size_t)P);
  if (!rc && !pp_role) snprintf(err, errn, "out of memory"), rc = -1;
  if (!rc) {
    for (int r = 0; r < P; r++) pp_role[r] = -1;
    const int per_pp = sf->world / P;
    const double vm = (double)sf->pp_v * sf->pp_m;
    for (int rank = 0; rank < sf->world; rank++) {
      const int q = rank / per_pp, i = sf->role_of[rank];
      const role_time *t = &rt[i];
      const double f_ = t->comp[0] + exposed_tp(t, 0, o, f) + exposed_cp(t, 0) + t->other[0];
      const double b_ = t->comp[1] + t->comp[2] + exposed_tp(t, 1, o, f) + exposed_tp(t, 2, o, f) +
                        exposed_cp(t, 1) + exposed_cp(t, 2) + t->other[1] + t->other[2];
      if (pp_role[q] < 0 || f_ + b_ > (tf[q] + tb[q]) * vm) {
        pp_role[q] = i;
        tf[q] = f_ / vm;
        tb[q] = b_ / vm;
      }
    }
  }
  /* makespan0: the same schedule with free hops, so the bubble is the schedule's
   * and the hops' extra is pp's exposed comm */
  double makespan = 0, makespan0 = 0, busy = 0;
  if (!rc && P > 1) {
    double hop = 0;
    for (int i = 0; i < nr; i++) hop = rt[i].pp_send_per_call > hop ? rt[i].pp_send_per_call : hop;
    rc = simulate_pp(sf, tf, tb, hop, &makespan, &busy, err, errn);
    if (!rc) rc = simulate_pp(sf, tf, tb, 0, &makespan0, &busy, err, errn);
  } else if (!rc) {
    makespan = makespan0 = busy = tf[0] + tb[0];
  }
  if (!rc) {
    /* the slowest role's whole step: the pipelined span plus what lies outside it */
    outside_parts worst = {.fsdp = -1};
    int wi = 0;
    for (int i = 0; i < nr; i++) {
      const outside_parts o_ = outside(&rt[i]);
      if (i == 0 || o_.fsdp + o_.ddp + o_.opt > worst.fsdp + worst.ddp + worst.opt) {
        worst = o_;
        wi = i;
      }
    }
    const role_time *t = &rt[wi];
    p->worst_role = wi;
    const double A = f->accum_steps > 1 ? f->accum_steps : 1;
    p->step_s = A * (makespan + worst.fsdp + worst.ddp) + worst.opt;
    p->opt_s = worst.opt;
    p->bubble_s = P > 1 ? pos(makespan0 - busy) : 0;
    p->compute_s = t->comp[0] + t->comp[1] + t->comp[3] + t->comp[4];
    p->recompute_s = t->comp[2];
    for (int d = 0; d < SB_NDIMS; d++) p->comm_s[d] = t->comm_dim[d];
    p->exposed_comm_s[2] = worst.fsdp;
    p->exposed_comm_s[1] = worst.ddp;
    for (int q = 0; q < 3; q++) {
      p->exposed_comm_s[4] += exposed_tp(t, q, o, f);
      p->exposed_comm_s[3] += exposed_cp(t, q);
    }
    p->exposed_comm_s[4] += t->tp[3];
    p->exposed_comm_s[0] = P > 1 ? pos(makespan - makespan0) : 0;
    p->tokens_per_s_per_gpu = A * (double)sf->tokens_per_step / p->step_s / (double)sf->world;
    p->compute_s = A * (p->compute_s - t->comp[3] - t->comp[4]) + t->comp[3] + t->comp[4];
    p->recompute_s *= A;
    p->bubble_s *= A;
    for (int d = 0; d < SB_NDIMS; d++) p->exposed_comm_s[d] *= A, p->comm_s[d] *= A;
    /* TorchTitan's MFU is over the bf16 peak (Float8 runs too); an f32 run's is f32's */
    const int pdt = sb_hw_dtype(o->dtype) == SB_HW_F32 ? SB_HW_F32 : SB_HW_BF16;
    const double peak = hw->peak_flops[pdt];
    p->mfu = peak > 0 ? sf->flops_per_token * p->tokens_per_s_per_gpu / peak : NAN;
    /* memory: the worst role's peak, the allocator's overhead and what the runtime reserves */
    double pk = 0, rv = 0;
    for (int i = 0; i < nr; i++) {
      const sb_role *ro = &meta->roles[i];
      if ((double)ro->peak > pk) {
        pk = (double)ro->peak;
        for (int k = 0; k < 4; k++) p->mem_split[k] = (double)ro->mem[k];
      }
      if ((double)ro->reserved > rv) rv = (double)ro->reserved;
    }
    /* The peak as TorchTitan prints it, the caching allocator's reserved peak: the
     * meta device models PyTorch's allocator (its segments, rv); without that model,
     * the live peak plus the hardware file's overhead. The allocator frees its cached
     * segments and retries before it fails, so a layout fits while its live peak does,
     * and what it reserves then stops at the HBM. */
    const double live = pk * (rv > 0 ? 1 : 1 + hw->alloc_overhead) + hw->reserved_bytes;
    p->peak_bytes = rv > 0 ? rv + hw->reserved_bytes : live;
    p->fits = live <= hw->hbm_bytes;
    if (p->fits && p->peak_bytes > hw->hbm_bytes) p->peak_bytes = hw->hbm_bytes;
    p->over_bytes = p->fits ? 0 : live - hw->hbm_bytes;
    if (!(p->step_s > 0)) snprintf(err, errn, "the predicted step is not positive"), rc = -1;
  }
  free(tf);
  free(tb);
  free(pp_role);
  free(rt);
  return rc;
}
