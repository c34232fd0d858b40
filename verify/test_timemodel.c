/* verify/test_timemodel.c: the time model (bench/harness/timemodel.c, sb_predict)
 * against oracles worked out here from the model its header states, on a
 * shape-only result and a hardware struct built by hand (no run, no file):
 *
 *   - one role, no pp: GEMM rows at calls 2 m n k batch / (peak eff) with a
 *     one-point (constant) efficiency table, memory-bound rows at bytes /
 *     (hbm_bw hbm_eff); recompute in the step but not in compute_s;
 *   - attention: attn_gemm at flops / (peak attn_eff), attention's row kernels
 *     (attn_softmax, attn_lse_bwd) free; the launch floor on every other kernel;
 *   - FSDP on dp_shard: forward all-gathers under the forward compute expose
 *     only the first call, above it the rest's excess; reduce-scatters in backward
 *     likewise with the last call;
 *   - TP: exposed in full; with async TP one chunk (1/tp) plus the rest's excess
 *     over the linear GEMMs; with Float8 a block's all-gathers at half their bytes
 *     (fp8), the output layer's and every reduce-scatter at theirs;
 *   - accumulation: A (step without optimizer) + optimizer; tokens/s/GPU and MFU;
 *   - pipeline pp 4 (four equal roles, t_b = 2 t_f) on the schedules of
 *     dt_pp_schedule_generate: GPipe and 1F1B with m 8 give the makespan
 *     (m + p - 1)(t_f + t_b) and the bubble fraction (p - 1) / (m + p - 1) of
 *     Narayanan et al. 2021 (arXiv:2104.04473) sec. 2.2; interleaved 1F1B with
 *     v 2, (p - 1) / (v m + p - 1) (sec. 2.2.2); GPipe with stage-boundary sends
 *     2 (p - 1) hops longer, the recvs free;
 *   - memory: the worst role's peak (1 + alloc_overhead) + reserved, fits, over;
 *   - planted bug: a row's calls doubled moves the step far outside the
 *     tolerance, so the step check can fail.
 * The collective costs are the alpha-beta forms of hardware.h's comment
 * (nccl-tests doc/PERFORMANCE.md bus factors) written out here for one node.
 * Tolerance: relative 1e-12 - the test sums the same closed forms in its own
 * order (the pipeline simulation adds some 50 action times); only double
 * rounding differs, a few ulps.
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../bench/harness/hardware.h"
#include "../bench/harness/store.h"
#include "../bench/harness/timemodel.h"
#include "testutil.h"

/* Defined in bench/harness/run.c, which this test does not link: the same values
 * (TorchTitan's mesh order; the compute ledger's phases). */
const char *const sb_dim_names[SB_NDIMS] = {"pp", "dp_replicate", "dp_shard", "cp", "tp"};
const char *const sb_role_phases[SB_ROLE_PHASES] = {"forward", "backward", "recompute", "optimizer",
                                                    "other"};

/* expectations written out here, the same sums in another order: a few ulps */
static const double TOL = 1e-12;

#define close_to(got, want) tu_close((got), (want), TOL)
/* CHECK_NEAR(got, want, printf format and arguments naming the check) */
#define CHECK_NEAR(got, want, ...) TU_CHECK_REL((got), (want), TOL, __VA_ARGS__)

/* ---- the hardware: round numbers ------------------------------------------------------ */

static const double PEAK = 1e15, GEMM_EFF = 0.8, HBM_BW = 3e12, HBM_EFF = 0.5, ATTN_EFF = 0.4;
static const double INTRA_BW = 1e11, INTRA_LAT = 2e-6, BASE_LAT = 1e-5;
static const double HBM = 80e9, ALLOC = 0.05, RESERVED = 2e9;
static const int64_t VOCAB = 128256;

static void make_hw(sb_hw *hw) {
  memset(hw, 0, sizeof *hw);
  snprintf(hw->name, sizeof hw->name, "test");
  hw->peak_flops[SB_HW_BF16] = PEAK;
  hw->n_gemm[SB_HW_BF16] = 1; /* one point: the efficiency is the same for every shape */
  hw->gemm[SB_HW_BF16][0].flops = 1e9;
  hw->gemm[SB_HW_BF16][0].eff = GEMM_EFF;
  hw->attn_eff[SB_HW_BF16] = ATTN_EFF;
  hw->hbm_bytes = HBM;
  hw->hbm_bw = HBM_BW;
  hw->hbm_eff = HBM_EFF;
  hw->gpus_per_node = 8;
  hw->intra_bw = INTRA_BW;
  hw->intra_lat = INTRA_LAT;
  hw->inter_bw = 2.5e10;
  hw->inter_lat = 5e-6;
  hw->coll_base_lat = BASE_LAT;
  hw->alloc_overhead = ALLOC;
  hw->reserved_bytes = RESERVED;
}

/* The oracle's unit costs, from the stated model. */
static double o_gemm(double m, double n, double k, double batch) {
  return 2 * m * n * k * batch / (PEAK * GEMM_EFF);
}
static double o_mem(double bytes) { return bytes / (HBM_BW * HBM_EFF); }
/* all_gather / reduce_scatter, a ring of n in one node: n - 1 steps, bus factor (n-1)/n */
static double o_ag(double S, int n) {
  return BASE_LAT + (n - 1) * INTRA_LAT + (double)(n - 1) / n * S / INTRA_BW;
}
/* all_reduce in one node: the ring (2(n-1) steps, factor 2(n-1)/n) or the tree
 * (2 (n-1) intra latencies, S up and S down), the faster */
static double o_ar(double S, int n) {
  const double ring = BASE_LAT + 2 * (n - 1) * INTRA_LAT + 2.0 * (n - 1) / n * S / INTRA_BW;
  const double tree = BASE_LAT + 2 * (n - 1) * INTRA_LAT + 2 * S / INTRA_BW;
  return ring < tree ? ring : tree;
}

/* ---- building a shape-only result ----------------------------------------------------- */

static void krow(sb_role *r, const char *op, const char *phase, int64_t m, int64_t n, int64_t k,
                 int64_t batch, double flops, double bytes, int64_t calls) {
  if (r->n_krows == r->cap_krows) {
    r->cap_krows = r->cap_krows ? 2 * r->cap_krows : 8;
    r->krows = realloc(r->krows, sizeof *r->krows * (size_t)r->cap_krows);
    if (!r->krows) abort();
  }
  sb_krow *x = &r->krows[r->n_krows++];
  memset(x, 0, sizeof *x);
  snprintf(x->op, sizeof x->op, "%s", op);
  snprintf(x->phase, sizeof x->phase, "%s", phase);
  x->dtype = DT_BF16;
  x->m = m, x->n = n, x->k = k, x->batch = batch;
  x->flops = flops;
  x->bytes = bytes;
  x->calls = calls;
}
static void gemm(sb_role *r, const char *phase, int64_t m, int64_t n, int64_t k, int64_t batch,
                 int64_t calls) {
  krow(r, "gemm", phase, m, n, k, batch, 2.0 * m * n * k * batch, 0, calls);
}
static void comm(sb_role *r, const char *op, const char *dim, const char *phase, int64_t calls,
                 double bytes_per_call) {
  sb_comm_row *c = &r->comm[r->n_comm++];
  memset(c, 0, sizeof *c);
  snprintf(c->op, sizeof c->op, "%s", op);
  snprintf(c->mesh_dim, sizeof c->mesh_dim, "%s", dim);
  snprintf(c->phase, sizeof c->phase, "%s", phase);
  c->calls = calls;
  c->payload_bytes = (int64_t)(bytes_per_call * (double)calls);
}

/* a per-module row (sb_role.fcomm: the ledger's scope) beside the merged ones */
static void fcomm(sb_role *r, const char *op, const char *dim, const char *phase, const char *fqn,
                  int64_t calls, double bytes_per_call) {
  if (r->n_fcomm == r->cap_fcomm) {
    r->cap_fcomm = r->cap_fcomm ? 2 * r->cap_fcomm : 8;
    r->fcomm = realloc(r->fcomm, sizeof *r->fcomm * (size_t)r->cap_fcomm);
    if (!r->fcomm) abort();
  }
  sb_fqn_comm *c = &r->fcomm[r->n_fcomm++];
  memset(c, 0, sizeof *c);
  snprintf(c->op, sizeof c->op, "%s", op);
  snprintf(c->mesh_dim, sizeof c->mesh_dim, "%s", dim);
  snprintf(c->phase, sizeof c->phase, "%s", phase);
  snprintf(c->fqn, sizeof c->fqn, "%s", fqn);
  c->calls = calls;
  c->payload_bytes = (int64_t)(bytes_per_call * (double)calls);
}

typedef struct tcase {
  sb_result meta;
  sb_opts o;
  sb_tm_features f;
} tcase;

/* n_roles empty roles over the mesh dims, each rank r of role r % n_roles */
static void tc_init(tcase *t, const int dims[SB_NDIMS], int n_roles) {
  memset(t, 0, sizeof *t);
  int world = 1;
  for (int d = 0; d < SB_NDIMS; d++) t->o.dims[d] = dims[d], world *= dims[d];
  t->o.world = world;
  t->meta.n_roles = n_roles;
  t->meta.roles = calloc((size_t)n_roles, sizeof *t->meta.roles);
  t->meta.shape.world = world;
  t->meta.shape.role_of = calloc((size_t)world, sizeof(int));
  if (!t->meta.roles || !t->meta.shape.role_of) abort();
  for (int r = 0; r < world; r++) t->meta.shape.role_of[r] = r % n_roles;
  for (int i = 0; i < n_roles; i++) t->meta.roles[i].count = world / n_roles;
  t->meta.shape.pp = t->meta.shape.pp_v = t->meta.shape.pp_m = 1;
  t->meta.shape.pp_kind = -1;
  t->meta.shape.vocab = VOCAB;
  t->meta.shape.dim = 4096;
  t->meta.shape.flops_per_token = 1e9;
  t->meta.shape.tokens_per_step = 8192;
}
static void tc_free(tcase *t) {
  for (int i = 0; i < t->meta.n_roles; i++) free(t->meta.roles[i].krows), free(t->meta.roles[i].fcomm);
  free(t->meta.roles);
  free(t->meta.shape.role_of);
  free(t->meta.shape.pp_len);
  free(t->meta.shape.pp_acts);
}
static int predict(const sb_hw *hw, tcase *t, sb_prediction *p, const char *what) {
  char err[512] = "";
  int rc = sb_predict(hw, &t->o, &t->meta, &t->f, p, err, sizeof err);
  TU_CHECK(rc == 0, "%s: sb_predict: %s", what, err);
  return rc;
}

/* ---- the checks ----------------------------------------------------------------------- */

/* One role, no pp: the rows of every phase, their costs and sums; accumulation
 * and the throughput figures; the planted bug. */
static void test_compute(const sb_hw *hw) {
  const int dims[SB_NDIMS] = {1, 1, 1, 1, 1};
  const double G = o_gemm(4096, 4096, 4096, 1);
  const double fwd = 10 * G + 3 * o_gemm(128, 256, 512, 4) + 2 * o_mem(3e9);
  const double bwd = 20 * G + 2 * o_mem(6e9), rec = 10 * G, opt = o_mem(6e9) + o_mem(1e8);
  for (int A = 1; A <= 4; A += 3) {
    tcase t;
    tc_init(&t, dims, 1);
    sb_role *r = &t.meta.roles[0];
    gemm(r, "forward", 4096, 4096, 4096, 1, 10);
    gemm(r, "forward", 128, 256, 512, 4, 3);
    krow(r, "rmsnorm", "forward", 0, 0, 0, 0, 0, 3e9, 2);
    gemm(r, "backward", 4096, 4096, 4096, 1, 20);
    krow(r, "rmsnorm_bwd", "backward", 0, 0, 0, 0, 0, 6e9, 2);
    gemm(r, "recompute", 4096, 4096, 4096, 1, 10);
    krow(r, "adamw", "optimizer", 0, 0, 0, 0, 0, 6e9, 1);
    krow(r, "fill", "other", 0, 0, 0, 0, 0, 1e8, 1);
    t.f.accum_steps = A;
    sb_prediction p;
    if (!predict(hw, &t, &p, "compute")) {
      const double step = A * (fwd + bwd + rec) + opt;
      CHECK_NEAR(p.step_s, step, "one role A %d: step_s", A);
      CHECK_NEAR(p.compute_s, A * (fwd + bwd) + opt, "one role A %d: compute_s", A);
      CHECK_NEAR(p.recompute_s, A * rec, "one role A %d: recompute_s", A);
      TU_CHECK(p.bubble_s == 0, "one role A %d: bubble %g", A, p.bubble_s);
      for (int d = 0; d < SB_NDIMS; d++)
        TU_CHECK(p.exposed_comm_s[d] == 0 && p.comm_s[d] == 0, "one role: comm on dim %d", d);
      /* tokens_per_step: the shape-only run's (one microstep), as plan.c runs it */
      const double tps = A * 8192.0 / step / 1;
      CHECK_NEAR(p.tokens_per_s_per_gpu, tps, "one role A %d: tokens/s/GPU", A);
      CHECK_NEAR(p.mfu, 1e9 * tps / PEAK, "one role A %d: mfu", A);
      if (A == 1) {
        /* planted bug: the first GEMM's calls doubled: the step moves by 10 G, far
         * beyond the tolerance, so the check above can fail */
        r->krows[0].calls *= 2;
        sb_prediction q;
        if (!predict(hw, &t, &q, "planted"))
          TU_CHECK(!close_to(q.step_s, step) && close_to(q.step_s, step + 10 * G),
                   "planted bug: doubled calls give %.17g (oracle %.17g): the check cannot fail",
                   q.step_s, step);
      }
    }
    tc_free(&t);
  }
}

/* attn_gemm at the attention efficiency, the row kernels free, the launch floor */
static void test_attention(const sb_hw *hw0) {
  sb_hw hw = *hw0;
  const int dims[SB_NDIMS] = {1, 1, 1, 1, 1};
  for (int floor_on = 0; floor_on < 2; floor_on++) {
    hw.kernel_s = floor_on ? 1e-3 : 0;
    tcase t;
    tc_init(&t, dims, 1);
    sb_role *r = &t.meta.roles[0];
    krow(r, "attn_gemm", "forward", 0, 0, 0, 0, 1e12, 0, 4);
    krow(r, "attn_gemm", "backward", 0, 0, 0, 0, 1e6, 0, 2); /* 2.5 ns: under the floor, kept */
    krow(r, "attn_softmax", "forward", 0, 0, 0, 0, 0, 1e12, 4);
    krow(r, "attn_lse_bwd", "backward", 0, 0, 0, 0, 0, 1e12, 4);
    krow(r, "add", "forward", 0, 0, 0, 0, 0, 1, 5); /* 1 byte: the floor when it is on */
    sb_prediction p;
    if (!predict(&hw, &t, &p, "attention")) {
      const double attn = 4 * 1e12 / (PEAK * ATTN_EFF) + 2 * 1e6 / (PEAK * ATTN_EFF);
      const double add = 5 * (floor_on ? 1e-3 : o_mem(1));
      CHECK_NEAR(p.step_s, attn + add, "attention (floor %d): step_s", floor_on);
      CHECK_NEAR(p.compute_s, attn + add, "attention (floor %d): compute_s", floor_on);
    }
    tc_free(&t);
  }
}

/* FSDP prefetch: dp_shard 8 in one node */
static void test_fsdp(const sb_hw *hw) {
  const int dims[SB_NDIMS] = {1, 1, 8, 1, 1};
  const double F = 100 * o_gemm(4096, 4096, 4096, 1), B = 2 * F;
  const double sizes[2] = {1e8, 2e9}; /* rest under the compute; rest over it */
  for (int c = 0; c < 2; c++) {
    const double S = sizes[c], one = o_ag(S, 8);
    tcase t;
    tc_init(&t, dims, 1);
    sb_role *r = &t.meta.roles[0];
    gemm(r, "forward", 4096, 4096, 4096, 1, 100);
    gemm(r, "backward", 4096, 4096, 4096, 1, 200);
    comm(r, "all_gather", "dp_shard", "forward", 4, S);
    comm(r, "reduce_scatter", "dp_shard", "backward", 4, S);
    /* the oracle: the first gather exposed, the other three hidden up to F;
     * the last reduce-scatter exposed, the other three hidden up to B */
    const double xf = one + fmax(0, 3 * one - F), xb = one + fmax(0, 3 * one - B);
    if (c == 0) TU_CHECK(3 * one < F && 3 * one < B, "fsdp case 0 is not under the compute");
    if (c == 1) TU_CHECK(3 * one > F && 3 * one > B, "fsdp case 1 is not over the compute");
    sb_prediction p;
    if (!predict(hw, &t, &p, "fsdp")) {
      CHECK_NEAR(p.exposed_comm_s[2], xf + xb, "fsdp S %g: exposed dp_shard", S);
      CHECK_NEAR(p.comm_s[2], 8 * one, "fsdp S %g: all dp_shard comm", S);
      CHECK_NEAR(p.step_s, F + B + xf + xb, "fsdp S %g: step_s", S);
    }
    tc_free(&t);
  }
}

/* TP 4 in one node, exposed; async TP */
static void test_tp(const sb_hw *hw) {
  const int dims[SB_NDIMS] = {1, 1, 1, 1, 4};
  const double L = 100 * o_gemm(4096, 4096, 4096, 1);
  const double sizes[2] = {1e8, 1e9};
  for (int c = 0; c < 2; c++)
    for (int async = 0; async < 2; async++) {
      const double S = sizes[c], one = o_ar(S, 4), all = 8 * one;
      tcase t;
      tc_init(&t, dims, 1);
      sb_role *r = &t.meta.roles[0];
      gemm(r, "forward", 4096, 4096, 4096, 1, 100);
      comm(r, "all_reduce", "tp", "forward", 8, S);
      t.f.async_tp = async;
      /* async: one chunk of tp's four, the other three behind the linear GEMMs */
      const double x = async ? all / 4 + fmax(0, all * 3 / 4 - L) : all;
      if (async) TU_CHECK((c == 0) == (all * 3 / 4 < L), "tp case %d on the wrong side", c);
      sb_prediction p;
      if (!predict(hw, &t, &p, "tp")) {
        CHECK_NEAR(p.exposed_comm_s[4], x, "tp S %g async %d: exposed tp", S, async);
        CHECK_NEAR(p.comm_s[4], all, "tp S %g async %d: all tp comm", S, async);
        CHECK_NEAR(p.step_s, L + x, "tp S %g async %d: step_s", S, async);
      }
      tc_free(&t);
    }
}

/* Float8's TP all-gathers: a block's ("layers.*") in fp8, half the bytes; the output
 * layer's in bf16; reduce-scatters in bf16; without float8 every row at its bytes */
static void test_float8_tp(const sb_hw *hw) {
  const int dims[SB_NDIMS] = {1, 1, 1, 1, 4};
  const double S = 1e8;
  for (int f8 = 0; f8 < 2; f8++) {
    tcase t;
    tc_init(&t, dims, 1);
    sb_role *r = &t.meta.roles[0];
    comm(r, "all_gather", "tp", "forward", 3, S);
    fcomm(r, "all_gather", "tp", "forward", "layers.0.attention", 1, S);
    fcomm(r, "all_gather", "tp", "forward", "layers.0.feed_forward", 1, S);
    fcomm(r, "all_gather", "tp", "forward", "output", 1, S);
    comm(r, "reduce_scatter", "tp", "forward", 2, S);
    fcomm(r, "reduce_scatter", "tp", "forward", "layers.0.attention.wo", 1, S);
    fcomm(r, "reduce_scatter", "tp", "forward", "layers.0.feed_forward.w2", 1, S);
    t.f.float8 = f8;
    const double want = f8 ? 2 * o_ag(S / 2, 4) + o_ag(S, 4) + 2 * o_ag(S, 4) : 5 * o_ag(S, 4);
    sb_prediction p;
    if (!predict(hw, &t, &p, "float8 tp")) {
      CHECK_NEAR(p.comm_s[4], want, "float8 %d: tp comm", f8);
      CHECK_NEAR(p.exposed_comm_s[4], want, "float8 %d: exposed tp", f8);
    }
    tc_free(&t);
  }
}

/* memory: the worst role's peak with the allocator's overhead and the reserve */
static void test_memory(const sb_hw *hw) {
  const int dims[SB_NDIMS] = {1, 1, 2, 1, 1};
  const double peaks[2] = {70e9, 80e9};
  for (int c = 0; c < 2; c++) {
    tcase t;
    tc_init(&t, dims, 2);
    for (int i = 0; i < 2; i++) {
      sb_role *r = &t.meta.roles[i];
      gemm(r, "forward", 1024, 1024, 1024, 1, 1);
      r->peak = (int64_t)(i ? peaks[c] : 50e9);
      for (int k = 0; k < 4; k++) r->mem[k] = (int64_t)(i + 1) * 1000 * (k + 1);
    }
    sb_prediction p;
    if (!predict(hw, &t, &p, "memory")) {
      const double want = peaks[c] * (1 + ALLOC) + RESERVED; /* 75.5 GB fits; 86 GB does not */
      CHECK_NEAR(p.peak_bytes, want, "memory case %d: peak_bytes", c);
      TU_CHECK(p.fits == (want <= HBM), "memory case %d: fits %d", c, p.fits);
      CHECK_NEAR(p.over_bytes, want <= HBM ? 0 : want - HBM, "memory case %d: over_bytes", c);
      for (int k = 0; k < 4; k++)
        TU_CHECK(p.mem_split[k] == 2000.0 * (k + 1), "memory case %d: split %d", c, k);
    }
    tc_free(&t);
  }
}

/* pp 4, four roles alike, t_b = 2 t_f, the generated schedules */
static void test_pipeline(const sb_hw *hw, dt_ctx *ctx) {
  const struct { dt_pp_schedule_kind k; int v; } cases[] = {
      {DT_PP_GPIPE, 1}, {DT_PP_1F1B, 1}, {DT_PP_INTERLEAVED_1F1B, 2}};
  const int P = 4, M = 8;
  const int dims[SB_NDIMS] = {P, 1, 1, 1, 1};
  const double F = 64 * o_gemm(4096, 4096, 4096, 1), B = 2 * F; /* a rank's step of F and B */
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const int v = cases[c].v;
    dt_pp_schedule s;
    dt_status st = dt_pp_schedule_generate(ctx, cases[c].k, P, v, M, &s);
    TU_CHECK(st == DT_OK, "generate %s: %s", dt_pp_schedule_kind_str(cases[c].k), dt_last_error(ctx));
    if (st != DT_OK) continue;
    tcase t;
    tc_init(&t, dims, P);
    for (int i = 0; i < P; i++) {
      gemm(&t.meta.roles[i], "forward", 4096, 4096, 4096, 1, 64);
      gemm(&t.meta.roles[i], "backward", 4096, 4096, 4096, 1, 128);
    }
    sb_shape_facts *sf = &t.meta.shape;
    sf->pp = P, sf->pp_v = v, sf->pp_m = M, sf->pp_kind = (int)cases[c].k;
    size_t n = 0;
    for (int r = 0; r < P; r++) n += (size_t)s.len[r];
    sf->pp_len = calloc((size_t)P, sizeof *sf->pp_len);
    sf->pp_acts = malloc(sizeof *sf->pp_acts * n);
    if (!sf->pp_len || !sf->pp_acts) abort();
    size_t k = 0;
    for (int r = 0; r < P; r++)
      for (int i = 0; i < s.len[r]; i++)
        if (s.acts[r][i].kind == DT_PP_F || s.acts[r][i].kind == DT_PP_B)
          sf->pp_acts[k++] = s.acts[r][i], sf->pp_len[r]++;
    dt_pp_schedule_free(ctx, &s);
    sb_prediction p;
    if (!predict(hw, &t, &p, "pipeline")) {
      /* per action t_f = F / (v m), t_b = 2 t_f; the fill and drain add p - 1
       * action pairs to the v m pairs every rank runs */
      const double tfb = (F + B) / (v * M);
      const double span = (v * M + P - 1) * tfb, bubble = (P - 1) * tfb;
      const double frac = (double)(P - 1) / (v * M + P - 1);
      const char *name = dt_pp_schedule_kind_str(cases[c].k);
      CHECK_NEAR(p.step_s, span, "%s pp %d v %d m %d: step_s (the makespan)", name, P, v, M);
      CHECK_NEAR(p.bubble_s, bubble, "%s pp %d v %d m %d: bubble_s", name, P, v, M);
      CHECK_NEAR(p.bubble_s / p.step_s, frac, "%s pp %d v %d m %d: bubble fraction", name, P, v, M);
      CHECK_NEAR(frac, dt_pp_bubble_fraction(cases[c].k, P, v, M), "%s: library formula", name);
      TU_CHECK(p.exposed_comm_s[0] == 0, "%s: pp comm without send rows", name);
      if (cases[c].k == DT_PP_GPIPE) {
        /* the stage boundaries' sends: pp 4 in one node, a hop of base + intra latency
         * + S / intra_bw; GPipe's critical path crosses p - 1 boundaries forward and
         * p - 1 backward, each action still back to back behind its input, so the
         * makespan grows by 2 (p - 1) hops; a recv is the far end of a send, free */
        const double S = 5e7, hop = BASE_LAT + INTRA_LAT + S / INTRA_BW;
        for (int i = 0; i < P; i++) {
          comm(&t.meta.roles[i], "send", "pp", "forward", M, S);
          comm(&t.meta.roles[i], "recv", "pp", "forward", M, S);
        }
        sb_prediction q;
        if (!predict(hw, &t, &q, "pipeline hops")) {
          CHECK_NEAR(q.step_s, span + 2 * (P - 1) * hop, "GPipe with hops: step_s");
          CHECK_NEAR(q.exposed_comm_s[0], 2 * (P - 1) * hop, "GPipe with hops: exposed pp");
          CHECK_NEAR(q.bubble_s, bubble, "GPipe with hops: bubble (the schedule's alone)");
          CHECK_NEAR(q.comm_s[0], M * hop, "GPipe with hops: all pp comm (sends only)");
        }
      }
    }
    tc_free(&t);
  }
}

int main(void) {
  sb_hw hw;
  make_hw(&hw);
  dt_ctx ctx;
  dt_ctx_init(&ctx, 0, 1);
  test_compute(&hw);
  test_attention(&hw);
  test_fsdp(&hw);
  test_tp(&hw);
  test_float8_tp(&hw);
  test_memory(&hw);
  test_pipeline(&hw, &ctx);
  return tu_finish("test_timemodel");
}
