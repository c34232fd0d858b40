/* verify/test_meta.c: shape-only runs (the meta device and the fake comm) against
 * real runs, and the compute ledger against the analytic FLOP count.
 *
 * 1. For each world-8 config below (two with activation checkpointing), one training step of the debugmodel runs on
 *    8 threads with real data (cuda-emu devices: device memory, so the memory
 *    counters are the ones a GPU run has) and then on the meta device with the
 *    fake comm, each rank alone. Per rank the two must agree exactly: the comm
 *    ledger row for row (op, reduce, group, group size, elements, dtype, payload
 *    and wire bytes, phase, scope; not seconds), the compute ledger row for row,
 *    the memory split (params, grads, optimizer, activations), the peak and where
 *    the step reached it (phase, module, FSDP's unsharded parameters and the
 *    collectives' buffers then); and in both every noted buffer is given back by
 *    the step's end.
 *    The oracle is the real run; the planted case adds one all_reduce to the
 *    real run's ledger and must fail the comparison. Every rank of a role
 *    (dt_parallel_dims_roles) must match its role's first rank; two configs with
 *    uneven FSDP shards (vocab 2050) also check the role count against the
 *    distinct torch.chunk sizes counted by hand.
 * 2. The compute ledger of a world-1 debugmodel step on meta against FLOPs derived
 *    here from the config alone: the linear layers' GEMMs give 6 N_linear per
 *    token (forward 2, backward 4: Kaplan et al. 2020, sec. 2.1; the N of
 *    TorchTitan's get_dense_model_nparams_and_flops, parameters less the
 *    embedding and the norms), and every linear GEMM shape is [tokens, in] x
 *    [in, out] or its transposes.
 * 3. The ledger at scale (check_scale): 8B FSDP 8 and 70B FSDP 32 x TP 8 on meta,
 *    every comm row against bytes derived from the shapes alone; the 8B FSDP
 *    collectives' fqns against the units.
 * 4. A tensor of more than 2^31 elements on meta (405B's output layer,
 *    128256 x 16384): created, accounted in full and freed; a host read of meta
 *    data faults (run in a child, which must die by a signal).
 * 5. The meta device's caching-allocator model (check_allocator): reserved bytes of
 *    an allocation sequence derived by hand from PyTorch's rules.
 * Not here: the full-scale benchmark (bench/shardbench-meta), the harness's --device
 * meta (verify/meta-run.sh).
 */
#include "config.h"

#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

enum { WORLD = 8, BATCH = 8, SEQ = 16 };
static const char MODEL[] = "debugmodel:n_layers=2";

typedef struct rank_out {
  dt_ledger_row *comm;
  size_t n_comm;
  dt_kledger_row *kern;
  size_t n_kern;
  int64_t mem[4];
  size_t peak;
  dt_mem_peak_at peak_at;       /* where the step peaked, and FSDP's / the collectives' bytes then */
  size_t notes_after[DT_MEM_NOTES]; /* the noted bytes still in use after the step (none) */
  bool done;
} rank_out;

typedef struct job {
  dt_ac_config ac;              /* activation checkpointing (zero: none) */
  dt_dtype dtype;               /* 0 (f32) unless set */
  int batch, seq;               /* 0: BATCH, SEQ */
  dt_llama_config cfg;
  dt_parallel_dims dims;
  const dt_parallel_plan *plan;
  rank_out out[WORLD];
} job;

static dt_status train_rank(dt_ctx *ctx, void *arg) {
  job *j = arg;
  const int batch = j->batch ? j->batch : BATCH, seq = j->seq ? j->seq : SEQ;
  int64_t *tokens = malloc(2 * sizeof *tokens * (size_t)batch * (size_t)seq);
  if (!tokens) return DT_ERR_NOMEM;
  int64_t *targets = tokens + (size_t)batch * (size_t)seq;
  for (int64_t i = 0; i < (int64_t)batch * seq; i++) {
    tokens[i] = (7 * i + 3) % j->cfg.vocab;
    targets[i] = (7 * i + 10) % j->cfg.vocab;
  }
  const dt_adamw adamw = DT_ADAMW_DEFAULT;
  dt_trainer_opts o;
  memset(&o, 0, sizeof o);
  o.dtype = j->dtype ? j->dtype : DT_F32;
  o.seed = 11;
  o.batch = batch;
  o.seq = seq;
  o.adamw = adamw;
  o.device_memory = true;
  o.ac = j->ac;
  dt_trainer *t = NULL;
  dt_status cs = dt_trainer_create(ctx, &j->cfg, &j->dims, j->plan, &o, &t);
  if (cs != DT_OK) {
    free(tokens);
    return cs;
  }
  dt_ledger_clear(ctx);
  dt_trainer_step rec;
  memset(&rec, 0, sizeof rec);
  dt_var *loss = NULL;
  dt_status s = dt_trainer_forward_backward(ctx, t, 0, tokens, targets, true, &loss, &rec);
  if (s == DT_OK) s = dt_trainer_optimizer_step(ctx, t, true, &rec);
  dt_ledger_enable(ctx, false);
  if (s == DT_OK) {
    rank_out *r = &j->out[ctx->rank];
    const dt_ledger *L = dt_ledger_of(ctx);
    const dt_kledger *K = dt_kledger_of(ctx);
    r->comm = malloc((L->n ? L->n : 1) * sizeof *r->comm);
    r->kern = malloc((K->n ? K->n : 1) * sizeof *r->kern);
    if (!r->comm || !r->kern) s = DT_ERR_NOMEM;
    else {
      if (L->n) memcpy(r->comm, L->rows, L->n * sizeof *r->comm);
      if (K->n) memcpy(r->kern, K->rows, K->n * sizeof *r->kern);
      r->n_comm = L->n;
      r->n_kern = K->n;
      r->mem[0] = rec.mem_params;
      r->mem[1] = rec.mem_grads;
      r->mem[2] = rec.mem_optimizer;
      r->mem[3] = rec.mem_activations;
      r->peak = rec.peak_bytes;
      r->peak_at = rec.peak_at;
      memcpy(r->notes_after, ctx->mem.note[1], sizeof r->notes_after);
      r->done = true;
    }
  }
  dt_trainer_free(ctx, t);
  free(tokens);
  return s;
}

static void job_free(job *j) {
  for (int r = 0; r < WORLD; r++) {
    free(j->out[r].comm);
    free(j->out[r].kern);
  }
  memset(j->out, 0, sizeof j->out);
}

/* world ranks on threads + cuda-emu (meta false) or each alone on meta + fake. */
static int run(job *j, int world, bool meta) {
  dt_launch_opts lo;
  memset(&lo, 0, sizeof lo);
  lo.backend = DT_BACKEND_THREADS;
  lo.world = world;
  lo.timeout_s = 120;
  lo.device = meta ? DT_DEV_META : DT_DEV_CUDA;
  lo.cuda_emu = !meta;
  lo.comm = meta ? DT_COMM_FAKE : DT_COMM_HOST;
  dt_launch_report rep;
  memset(&rep, 0, sizeof rep);
  const int blas = dt_device_cpu_blas_threads(1);
  dt_status s = dt_launch(&lo, train_rank, j, &rep);
  if (blas > 0) dt_device_cpu_blas_threads(blas);
  if (s != DT_OK)
    fprintf(stderr, "test_meta: %s world %d: rank %d: %s: %s\n", meta ? "meta" : "threads", world,
            rep.failed_rank, dt_status_str(rep.failed_status), rep.failed_msg);
  dt_launch_report_free(&rep);
  return s != DT_OK;
}

static bool comm_row_eq(const dt_ledger_row *a, const dt_ledger_row *b) {
  return a->op == b->op && a->reduce == b->reduce && !strcmp(a->group, b->group) &&
         a->group_size == b->group_size && a->elems == b->elems && a->dtype == b->dtype &&
         a->payload_bytes == b->payload_bytes && a->wire_bytes == b->wire_bytes &&
         !strcmp(a->phase, b->phase) && !strcmp(a->scope, b->scope);
}

static bool kern_row_eq(const dt_kledger_row *a, const dt_kledger_row *b) {
  return !strcmp(a->op, b->op) && !strcmp(a->phase, b->phase) && !strcmp(a->scope, b->scope) &&
         a->dtype == b->dtype && a->m == b->m && a->n == b->n && a->k == b->k &&
         a->batch == b->batch && a->flops == b->flops && a->bytes_read == b->bytes_read &&
         a->bytes_written == b->bytes_written && a->calls == b->calls;
}

/* The number of differences between the real run (ref) and meta's, printing the first. */
static int compare(const char *name, const job *ref, const job *meta, bool quiet) {
  int bad = 0;
  for (int r = 0; r < WORLD; r++) {
    const rank_out *a = &ref->out[r], *b = &meta->out[r];
    char where[160];
    snprintf(where, sizeof where, "%s rank %d", name, r);
    if (!a->done || !b->done) {
      if (!quiet) fprintf(stderr, "  %s: a run did not finish\n", where);
      bad++;
      continue;
    }
    if (a->n_comm != b->n_comm) {
      if (!quiet) fprintf(stderr, "  %s: comm ledger %zu rows real, %zu meta\n", where, a->n_comm, b->n_comm);
      bad++;
    }
    for (size_t i = 0; i < a->n_comm && i < b->n_comm; i++)
      if (!comm_row_eq(&a->comm[i], &b->comm[i])) {
        if (!quiet)
          fprintf(stderr, "  %s: comm row %zu: real %s %s/%d %llu elems %s %s, meta %s %s/%d %llu elems %s %s\n",
                  where, i, dt_coll_name(a->comm[i].op), a->comm[i].group, a->comm[i].group_size,
                  (unsigned long long)a->comm[i].elems, a->comm[i].phase, a->comm[i].scope,
                  dt_coll_name(b->comm[i].op), b->comm[i].group, b->comm[i].group_size,
                  (unsigned long long)b->comm[i].elems, b->comm[i].phase, b->comm[i].scope);
        bad++;
        break;
      }
    if (a->n_kern != b->n_kern) {
      if (!quiet) fprintf(stderr, "  %s: compute ledger %zu rows real, %zu meta\n", where, a->n_kern, b->n_kern);
      bad++;
    }
    for (size_t i = 0; i < a->n_kern && i < b->n_kern; i++)
      if (!kern_row_eq(&a->kern[i], &b->kern[i])) {
        if (!quiet)
          fprintf(stderr, "  %s: compute row %zu: real %s %s m%lld n%lld k%lld x%llu, meta %s %s m%lld n%lld k%lld x%llu\n",
                  where, i, a->kern[i].op, a->kern[i].scope, (long long)a->kern[i].m,
                  (long long)a->kern[i].n, (long long)a->kern[i].k,
                  (unsigned long long)a->kern[i].calls, b->kern[i].op, b->kern[i].scope,
                  (long long)b->kern[i].m, (long long)b->kern[i].n, (long long)b->kern[i].k,
                  (unsigned long long)b->kern[i].calls);
        bad++;
        break;
      }
    for (int k = 0; k < 4; k++)
      if (a->mem[k] != b->mem[k]) {
        if (!quiet)
          fprintf(stderr, "  %s: memory split %d: real %lld, meta %lld\n", where, k,
                  (long long)a->mem[k], (long long)b->mem[k]);
        bad++;
      }
    if (a->peak != b->peak) {
      if (!quiet) fprintf(stderr, "  %s: peak real %zu, meta %zu\n", where, a->peak, b->peak);
      bad++;
    }
    const dt_mem_peak_at *pa = &a->peak_at, *pb = &b->peak_at;
    if (pa->bytes != pb->bytes || strcmp(pa->phase, pb->phase) || strcmp(pa->where, pb->where) ||
        memcmp(pa->note, pb->note, sizeof pa->note)) {
      if (!quiet)
        fprintf(stderr, "  %s: peak at real %s %s (%zu B, fsdp %zu, comm %zu), meta %s %s (%zu B, "
                        "fsdp %zu, comm %zu)\n", where, pa->phase, pa->where, pa->bytes,
                pa->note[0], pa->note[1], pb->phase, pb->where, pb->bytes, pb->note[0], pb->note[1]);
      bad++;
    }
    /* every noted buffer is returned by the step's end (an independent invariant: the
     * owners note a buffer's bytes beside its allocation and take them back at its free);
     * the parameters' gradients stay to the next step's zero_grad: equal in both */
    for (int k = 0; k < DT_MEM_NOTES; k++)
      if (k == DT_MEM_NOTE_GRADS ? a->notes_after[k] != b->notes_after[k]
                                 : (a->notes_after[k] || b->notes_after[k])) {
        if (!quiet)
          fprintf(stderr, "  %s: note %d after the step: real %zu, meta %zu bytes\n", where, k,
                  a->notes_after[k], b->notes_after[k]);
        bad++;
      }
    /* the step peaks inside one of its phases (the record is taken inside the step's
     * halves, never between them, where the checks run with phase "check") */
    static const char *const phases[] = {"forward", "backward", "recompute", "optimizer"};
    bool in_step = false;
    for (int k = 0; k < 4; k++) in_step = in_step || !strcmp(pa->phase, phases[k]);
    if (!in_step) {
      if (!quiet) fprintf(stderr, "  %s: peak in phase '%s', not one of the step's\n", where,
                          pa->phase);
      bad++;
    }
  }
  return bad;
}

typedef struct cfg_case {
  const char *name, *plan;
  int deg[DT_PDIM_COUNT]; /* pp, dp_replicate, dp_shard, cp, tp */
  const char *ac;         /* activation checkpointing mode (NULL: none) */
  const char *model;      /* NULL: MODEL */
  int want_roles;         /* > 0: the roles dt_parallel_dims_roles must find (torch.chunk's
                           * distinct shard sizes, counted by hand) */
} cfg_case;

static const cfg_case CASES[] = {
    {"fsdp 8", "fsdp.plan", {1, 1, 8, 1, 1}, NULL, NULL, 0},
    {"dp 8 (ddp)", "dp.plan", {1, 8, 1, 1, 1}, NULL, NULL, 0},
    {"fsdp 4 x tp 2 (sp)", "fsdp-tp-sp.plan", {1, 1, 4, 1, 2}, NULL, NULL, 0},
    {"hsdp 4 x 2", "hsdp.plan", {1, 4, 2, 1, 1}, NULL, NULL, 0},
    {"fsdp 4 x cp 2", "fsdp-cp.plan", {1, 1, 4, 2, 1}, NULL, NULL, 0},
    {"fsdp 2 x cp 2 x tp 2", "fsdp-tp-cp.plan", {1, 1, 2, 2, 2}, NULL, NULL, 0},
    {"pp 2 x fsdp 4", "pp-fsdp.plan", {2, 1, 4, 1, 1}, NULL, NULL, 0},
    {"pp 2 x fsdp 2 x tp 2", "pp-fsdp-tp-sp.plan", {2, 1, 2, 1, 2}, NULL, NULL, 0},
    {"fsdp 4 x tp 2, full AC", "fsdp-tp-sp.plan", {1, 1, 4, 1, 2}, "full", NULL, 0},
    {"pp 2 x fsdp 4, selective AC", "pp-fsdp.plan", {2, 1, 4, 1, 1}, "selective", NULL, 0},
    /* uneven FSDP shards (torch.chunk of 2050 rows: 257 x 7 and 251 over 8; 513 x 3
     * and 511 over 4 x 2): the ranks of equal shard sizes share a role */
    {"fsdp 8, vocab 2050", "fsdp.plan", {1, 1, 8, 1, 1}, NULL, "debugmodel:n_layers=2:vocab=2050", 2},
    /* 2050 over 4: 513 x 3, 511; each over cp 2: 257 + 256, 256 + 255: three sizes */
    {"fsdp 4 x cp 2, vocab 2050", "fsdp-cp.plan", {1, 1, 4, 2, 1}, NULL,
     "debugmodel:n_layers=2:vocab=2050", 3},
    /* grouped-query attention (2 and 4 query heads per kv head) with
     * local batch 8 in [b, s, h, hd]: the meta device runs one pass of sdpa's and
     * sdpa_cp's loops over batch rows and group members and counts it for all
     * (dt_kernels.shape_only), which must leave the real run's ledger */
    {"tp 8, GQA", "torchtitan-tp-sp.plan", {1, 1, 1, 1, 8}, NULL, "debugmodel:n_layers=2:n_kv_heads=8", 0},
    {"cp 4 x tp 2, GQA, full AC", "fsdp-tp-cp.plan", {1, 1, 1, 4, 2}, "full",
     "debugmodel:n_layers=2:n_kv_heads=4", 0},
};

static int check_case(dt_ctx *hc, const cfg_case *c, bool plant_done) {
  static dt_plan plan;
  static dt_parallel_plan rp;
  static job real, meta;
  char path[512];
  memset(&real, 0, sizeof real);
  TU_OK(hc, dt_llama_config_get(hc, c->model ? c->model : MODEL, &real.cfg));
  if (dt_plan_load(hc, tu_plan_path(c->plan, path, sizeof path), &plan) != DT_OK ||
      dt_parallel_plan_resolve(hc, &plan, c->deg, &real.cfg, BATCH, SEQ, &rp) != DT_OK ||
      dt_parallel_dims_init(hc, c->deg, WORLD, &real.dims) != DT_OK) {
    tu_fail(__FILE__, __LINE__, "%s: %s", c->name, dt_last_error(hc));
    return 0;
  }
  real.plan = &rp;
  if (c->ac) TU_OK(hc, dt_ac_parse(hc, c->ac, NULL, &real.ac));
  meta = real;
  if (run(&real, WORLD, false) || run(&meta, WORLD, true)) {
    tu_fail(__FILE__, __LINE__, "%s: a run failed", c->name);
    job_free(&real);
    job_free(&meta);
    return 0;
  }
  int bad = compare(c->name, &real, &meta, false);
  tu_count();
  if (bad) tu_fail(__FILE__, __LINE__, "%s: meta differs from the real run (%d differences)", c->name, bad);
  /* the roles: every rank of a role must behave as its first rank (all 8 ran) */
  int role_of[WORLD];
  const int n_roles = dt_parallel_dims_roles(&meta.dims, &meta.cfg, BATCH, SEQ, role_of);
  static job alike; /* rank q's place holds its role's first rank's outputs (borrowed) */
  for (int q = 0; q < WORLD; q++) {
    int first = 0;
    while (role_of[first] != role_of[q]) first++;
    alike.out[q] = meta.out[first];
  }
  const int role_bad = compare(c->name, &alike, &meta, true);
  memset(&alike, 0, sizeof alike);
  tu_count();
  if (n_roles < 1 || role_bad)
    tu_fail(__FILE__, __LINE__, "%s: %d roles, %d ranks differ from their role's first rank",
            c->name, n_roles, role_bad);
  if (c->want_roles) {
    tu_count();
    if (n_roles != c->want_roles)
      tu_fail(__FILE__, __LINE__, "%s: %d roles, want %d", c->name, n_roles, c->want_roles);
  }
  size_t rows = 0;
  for (int r = 0; r < WORLD; r++) rows += real.out[r].n_comm;
  printf("  %-24s %zu comm rows, %zu compute rows on rank 0, %d role(s): %s\n", c->name, rows,
         real.out[0].n_kern, n_roles, bad || role_bad ? "DIFFER" : "equal");
  /* planted: one extra collective in the real run must be seen */
  if (!plant_done) {
    rank_out *o = &real.out[0];
    dt_ledger_row *g = realloc(o->comm, (o->n_comm + 1) * sizeof *g);
    if (g) {
      o->comm = g;
      g[o->n_comm] = g[0];
      g[o->n_comm].op = DT_COLL_ALL_REDUCE;
      o->n_comm++;
      tu_count();
      if (compare(c->name, &real, &meta, true) == 0)
        tu_fail(__FILE__, __LINE__, "planted: an extra all_reduce in the real run was not seen");
      else
        printf("  planted extra all_reduce: detected\n");
    }
  }
  job_free(&real);
  job_free(&meta);
  return 1;
}

/* ---- FLOPs of a world-1 step on meta against the analytic count ---- */

static dt_status flops_rank(dt_ctx *ctx, void *arg) { return train_rank(ctx, arg); }

static void check_flops(dt_ctx *hc) {
  static job j;
  memset(&j, 0, sizeof j);
  TU_OK(hc, dt_llama_config_get(hc, MODEL, &j.cfg));
  const int ones[DT_PDIM_COUNT] = {1, 1, 1, 1, 1};
  TU_OK(hc, dt_parallel_dims_init(hc, ones, 1, &j.dims));
  dt_launch_opts lo;
  memset(&lo, 0, sizeof lo);
  lo.world = 1;
  lo.device = DT_DEV_META;
  lo.comm = DT_COMM_FAKE;
  dt_launch_report rep;
  dt_status s = dt_launch(&lo, flops_rank, &j, &rep);
  TU_CHECK(s == DT_OK, "meta world 1: %s", rep.failed_msg);
  dt_launch_report_free(&rep);
  if (s != DT_OK) return;
  /* the config's linear layers, from its fields (TorchTitan's Transformer) */
  const dt_llama_config *c = &j.cfg;
  const int64_t D = c->dim, H = c->n_heads, KV = c->n_kv_heads, hd = D / H, F = dt_llama_ffn_hidden(c);
  const int64_t V = c->vocab, L = c->n_layers, T = (int64_t)BATCH * SEQ;
  const int64_t lin[][2] = {{D, H * hd}, {D, KV * hd}, {D, KV * hd}, {H * hd, D}, {D, F}, {F, D}, {D, F}};
  double n_linear = (double)V * D; /* output */
  for (int i = 0; i < 7; i++) n_linear += (double)L * lin[i][0] * lin[i][1];
  const double want = 6.0 * n_linear * (double)T;
  /* The linear layers' GEMMs are "gemm" rows; attention's are "attn_gemm" rows
   * (sdpa: QK^T and PV per head). Attention, per layer and sample: 2
   * GEMMs forward (S = QK^T, O = PV) and 5 backward (S recomputed from the
   * saved lse, dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q: FlashAttention-2,
   * Dao 2023, Alg. 2 lines 11-16), each 2 S^2 hd per head: 14 L H hd S^2 per
   * sample, where TorchTitan's 12 L H hd S per token does not count the
   * recompute. Exact here because one block holds the whole causal sequence
   * (no key block is skipped at seq 16). */
  double got = 0, attn = 0;
  const rank_out *o = &j.out[0];
  bool shapes_ok = true;
  double adamw = 0;
  for (size_t i = 0; i < o->n_kern; i++) {
    const dt_kledger_row *r = &o->kern[i];
    if (!strcmp(r->op, "adamw")) adamw += r->flops * (double)r->calls;
    if (strcmp(r->op, "gemm") && strcmp(r->op, "attn_gemm")) continue;
    if (getenv("SB_META_VERBOSE"))
      printf("    gemm %-9s m%lld n%lld k%lld b%lld x%llu\n", r->phase, (long long)r->m,
             (long long)r->n, (long long)r->k, (long long)r->batch, (unsigned long long)r->calls);
    if (!strcmp(r->op, "attn_gemm")) {
      attn += r->flops * (double)r->calls;
      continue;
    }
    got += r->flops * (double)r->calls;
    /* one of m, n, k is the tokens, the other two a linear layer's (in, out) */
    bool fits = false;
    const int64_t d3[3] = {r->m, r->n, r->k};
    for (int t = 0; t < 3 && !fits; t++) {
      if (d3[t] != T) continue;
      int64_t a = d3[(t + 1) % 3], b = d3[(t + 2) % 3];
      for (int q = 0; q < 7 && !fits; q++)
        fits = (a == lin[q][0] && b == lin[q][1]) || (a == lin[q][1] && b == lin[q][0]);
      fits = fits || (a == V && b == D) || (a == D && b == V);
    }
    if (!fits) shapes_ok = false;
  }
  const double want_attn = 14.0 * (double)L * H * hd * SEQ * SEQ * BATCH;
  printf("  linear GEMM FLOPs %.10g, analytic 6 N_linear T = %.10g\n", got, want);
  printf("  attention GEMM FLOPs %.10g, analytic 14 L H hd S^2 B = %.10g (TorchTitan's "
         "12 L H hd S T = %.10g)\n", attn, want_attn, 12.0 * L * H * hd * SEQ * T);
  /* exact: integers below 2^53 */
  TU_CHECK(got == want, "linear GEMM FLOPs %.17g, analytic %.17g", got, want);
  TU_CHECK(attn == want_attn, "attention GEMM FLOPs %.17g, analytic %.17g", attn, want_attn);
  TU_CHECK(shapes_ok, "a batch-1 GEMM is not [tokens] x a linear layer's (in, out)");
  /* AdamW: every parameter once, 15 FLOPs each (ops.h's convention): embedding,
   * the linear layers, the 2 L + 1 norms */
  const double n_params = n_linear + (double)V * D + (2.0 * L + 1) * D;
  printf("  adamw FLOPs %.10g, 15 x %.0f parameters = %.10g\n", adamw, n_params, 15 * n_params);
  TU_CHECK(adamw == 15 * n_params, "adamw FLOPs %.17g, 15 N %.17g", adamw, 15 * n_params);
  job_free(&j);
}


/* ---- the ledger at scale: bytes per step derived from the shapes alone ---- */

/* The sum over rank 0's comm rows of (op, group, phase): calls, payload and wire bytes. */
static void ledger_sum(const rank_out *o, dt_coll op, const char *group, const char *phase,
                       double *calls, double *payload, double *wire) {
  *calls = *payload = *wire = 0;
  for (size_t i = 0; i < o->n_comm; i++) {
    const dt_ledger_row *r = &o->comm[i];
    if (r->op != (int)op || strcmp(r->group, group) || strcmp(r->phase, phase)) continue;
    *calls += 1;
    *payload += (double)r->payload_bytes;
    *wire += r->wire_bytes;
  }
}

typedef struct want_row {
  dt_coll op;
  const char *group, *phase;
  double calls, payload; /* wire = payload (n - 1) / n (all_reduce 2 (n - 1) / n) */
  int n;
} want_row;

/* planted: w is a wrong derivation, which must not match */
static void check_rows(const char *name, const rank_out *o, const want_row *w, int nw, bool planted) {
  size_t matched = 0;
  int bad = 0;
  for (int i = 0; i < nw; i++) {
    double c, p, x;
    ledger_sum(o, w[i].op, w[i].group, w[i].phase, &c, &p, &x);
    const double f = (w[i].op == DT_COLL_ALL_REDUCE ? 2.0 : 1.0) * (w[i].n - 1) / w[i].n;
    /* exact: byte counts are integers below 2^53; the wire is payload times a ratio,
     * summed per call, so it is compared to 1e-12 relative (double rounding) */
    const bool ok = c == w[i].calls && p == w[i].payload && fabs(x - w[i].payload * f) <= 1e-12 * x;
    if (!ok) bad++;
    if (!ok && !planted)
      tu_fail(__FILE__, __LINE__,
              "%s: %s %s %s: %.0f calls %.17g B wire %.17g, derived %.0f calls %.17g B wire %.17g",
              name, dt_coll_name(w[i].op), w[i].group, w[i].phase, c, p, x, w[i].calls,
              w[i].payload, w[i].payload * f);
    matched += (size_t)c;
  }
  if (matched != o->n_comm) bad++;
  tu_count();
  if (planted) {
    if (!bad) tu_fail(__FILE__, __LINE__, "%s: planted: a wrong derivation matched", name);
    else printf("  %s: planted wrong derivation: detected\n", name);
    return;
  }
  if (matched != o->n_comm)
    tu_fail(__FILE__, __LINE__, "%s: %zu ledger rows, %zu of them derived", name, o->n_comm, matched);
  if (!bad) printf("  %s: %zu comm rows equal the derived bytes\n", name, matched);
}

/* The fqn (scope) of each FSDP collective of 8B FSDP 8 on rank 0, derived from the
 * units (FSDP2's fully_shard: a unit all-gathers as its first module is entered, and
 * reduce-scatters in the backward of that gather): forward all_gathers tok_embeddings,
 * layers.0 .. layers.L-1, norm (the root unit norm + output); backward reduce-scatters
 * the same units in reverse. planted: the root unit's name given as `planted`, which
 * must not match. */
static void check_fqns(const rank_out *o, int L, const char *planted) {
  char want[2][80][DT_LABEL_LEN];
  const int n = L + 2;
  for (int u = 0; u < n; u++) {
    char nm[DT_LABEL_LEN];
    if (u == 0) snprintf(nm, sizeof nm, "tok_embeddings");
    else if (u == n - 1) snprintf(nm, sizeof nm, "%s", planted ? planted : "norm");
    else snprintf(nm, sizeof nm, "layers.%d", u - 1);
    memcpy(want[0][u], nm, sizeof nm);
    memcpy(want[1][n - 1 - u], nm, sizeof nm);
  }
  int seen[2] = {0, 0}, bad = 0;
  for (size_t i = 0; i < o->n_comm; i++) {
    const dt_ledger_row *r = &o->comm[i];
    const int k = r->op == DT_COLL_ALL_GATHER && !strcmp(r->phase, "forward")         ? 0
                  : r->op == DT_COLL_REDUCE_SCATTER && !strcmp(r->phase, "backward") ? 1
                                                                                      : -1;
    if (k < 0) continue;
    if (seen[k] >= n || strcmp(r->scope, want[k][seen[k]])) bad++;
    seen[k]++;
  }
  if (seen[0] != n || seen[1] != n) bad++;
  tu_count();
  if (planted) {
    if (!bad) tu_fail(__FILE__, __LINE__, "8B FSDP 8: planted: the root unit as %s matched", planted);
    else printf("  8B FSDP 8: planted root-unit fqn %s: detected\n", planted);
  } else if (bad) {
    tu_fail(__FILE__, __LINE__, "8B FSDP 8: %d FSDP collectives under another fqn than their "
            "unit's (%d forward all_gathers, %d backward reduce_scatters; %d units)", bad,
            seen[0], seen[1], n);
  } else {
    printf("  8B FSDP 8: every FSDP collective's fqn is its unit's (%d all_gathers, %d "
           "reduce_scatters)\n", seen[0], seen[1]);
  }
}

static int run_rank0(dt_ctx *hc, job *j, const char *plan_file, const int deg[DT_PDIM_COUNT], int world) {
  static dt_plan plan;
  static dt_parallel_plan rp;
  char path[512];
  if (dt_plan_load(hc, tu_plan_path(plan_file, path, sizeof path), &plan) != DT_OK ||
      dt_parallel_plan_resolve(hc, &plan, deg, &j->cfg, j->batch, j->seq, &rp) != DT_OK ||
      dt_parallel_dims_init(hc, deg, world, &j->dims) != DT_OK) {
    tu_fail(__FILE__, __LINE__, "%s: %s", plan_file, dt_last_error(hc));
    return 1;
  }
  j->plan = &rp;
  dt_launch_opts lo;
  memset(&lo, 0, sizeof lo);
  lo.world = world;
  lo.device = DT_DEV_META;
  lo.comm = DT_COMM_FAKE;
  const int r0 = 0;
  lo.fake_ranks = &r0;
  lo.n_fake_ranks = 1;
  dt_launch_report rep;
  dt_status s = dt_launch(&lo, train_rank, j, &rep);
  TU_CHECK(s == DT_OK, "%s: %s", plan_file, rep.failed_msg);
  dt_launch_report_free(&rep);
  return s != DT_OK;
}

/* 8B under FSDP 8 (fsdp.plan) and 70B under FSDP 32 x TP 8 with sequence parallel
 * (fsdp-tp-cp.plan, cp 1), bf16, seq 8192, local batch 1: every comm row of rank
 * 0's step against bytes derived here from the config's shapes:
 *   FSDP (PyTorch FSDP2, torch/distributed/fsdp/_fully_shard): one all_gather per
 *   unit in forward (tok_embeddings, each layer, norm + output) of the unit's
 *   parameters (TP-local under TP) in bf16; in backward one per unit resharded
 *   after forward (all but norm + output, reshard_after_forward=False); one
 *   reduce_scatter per unit of its gradients in bf16;
 *   TP + SP (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
 *   Transformer Models", sec. 4.2.2: per layer, forward and backward, 4 all_gathers
 *   and 4 reduce_scatters of the [b, s, h] activation, 8 b s h (t - 1) / t on the
 *   wire): here 2 per layer each way plus the embedding's output (reduce_scatter)
 *   and the head's input (all_gather); loss parallel's 3 all_reduces of f64
 *   per-position statistics (max, sum of exp, target logit: [b, s]); the SP norm
 *   weights' gradients (2 L + 1, each its FSDP shard D / 32 in bf16) all-reduced
 *   over tp after the backward. */
static void check_scale(dt_ctx *hc) {
  static job j;
  /* 8B, FSDP 8 */
  memset(&j, 0, sizeof j);
  j.dtype = DT_BF16;
  j.batch = 8;
  j.seq = 8192;
  TU_OK(hc, dt_llama_config_get(hc, "8B", &j.cfg));
  const int d8[DT_PDIM_COUNT] = {1, 1, 8, 1, 1};
  if (!run_rank0(hc, &j, "fsdp.plan", d8, 8)) {
    const dt_llama_config *c = &j.cfg;
    const double D = c->dim, L = c->n_layers, KV = c->n_kv_heads, hd = D / c->n_heads,
                 F = dt_llama_ffn_hidden(c), V = c->vocab;
    const double P = 2 * V * D + L * (2 * D * D + 2 * D * KV * hd + 3 * D * F) + (2 * L + 1) * D;
    const want_row w[] = {
        {DT_COLL_ALL_GATHER, "dp_shard", "forward", L + 2, 2 * P, 8},
        {DT_COLL_ALL_GATHER, "dp_shard", "backward", L + 1, 2 * (P - V * D - D), 8},
        {DT_COLL_REDUCE_SCATTER, "dp_shard", "backward", L + 2, 2 * P, 8},
    };
    check_rows("8B FSDP 8", &j.out[0], w, 3, false);
    /* planted: as if norm + output were resharded after forward too */
    want_row p[3] = {w[0], w[1], w[2]};
    p[1].calls = L + 2;
    p[1].payload = 2 * P;
    check_rows("8B FSDP 8", &j.out[0], p, 3, true);
    check_fqns(&j.out[0], (int)L, NULL);
    check_fqns(&j.out[0], (int)L, "output"); /* planted: the root unit entered at output */
  }
  job_free(&j);
  /* 70B, FSDP 32 x TP 8 (SP, loss parallel) */
  memset(&j, 0, sizeof j);
  j.dtype = DT_BF16;
  j.batch = 32;
  j.seq = 8192;
  TU_OK(hc, dt_llama_config_get(hc, "70B", &j.cfg));
  const int d70[DT_PDIM_COUNT] = {1, 1, 32, 1, 8};
  if (!run_rank0(hc, &j, "fsdp-tp-cp.plan", d70, 256)) {
    const dt_llama_config *c = &j.cfg;
    const double t = 8, D = c->dim, L = c->n_layers, KV = c->n_kv_heads, hd = D / c->n_heads,
                 F = dt_llama_ffn_hidden(c), V = c->vocab, b = 1, S = j.seq;
    const double Pt = 2 * V * D / t + L * (2 * D * D / t + 2 * D * KV * hd / t + 3 * D * F / t) +
                      (2 * L + 1) * D;
    const double act = b * S * D * 2; /* one [b, s, h] bf16 activation */
    const want_row w[] = {
        {DT_COLL_ALL_GATHER, "dp_shard", "forward", L + 2, 2 * Pt, 32},
        {DT_COLL_ALL_GATHER, "dp_shard", "backward", L + 1, 2 * (Pt - V * D / t - D), 32},
        {DT_COLL_REDUCE_SCATTER, "dp_shard", "backward", L + 2, 2 * Pt, 32},
        {DT_COLL_ALL_GATHER, "tp", "forward", 2 * L + 1, (2 * L + 1) * act, 8},
        {DT_COLL_REDUCE_SCATTER, "tp", "forward", 2 * L + 1, (2 * L + 1) * act, 8},
        {DT_COLL_ALL_GATHER, "tp", "backward", 2 * L + 1, (2 * L + 1) * act, 8},
        {DT_COLL_REDUCE_SCATTER, "tp", "backward", 2 * L + 1, (2 * L + 1) * act, 8},
        {DT_COLL_ALL_REDUCE, "tp", "forward", 3, 3 * b * S * 8, 8},
        {DT_COLL_ALL_REDUCE, "tp", "optimizer", 2 * L + 1, (2 * L + 1) * D / 32 * 2, 8},
    };
    check_rows("70B FSDP 32 x TP 8", &j.out[0], w, 9, false);
  }
  job_free(&j);
}

/* ---- 64-bit sizes and the faulting tag ---- */

static void check_big_and_fault(void) {
  dt_ctx ctx;
  dt_ctx_init(&ctx, 0, 1);
  dt_device *d = NULL;
  TU_OK(&ctx, dt_device_meta_create(&ctx, &d));
  if (!d) return;
  const int64_t shape[2] = {128256, 16384}; /* 405B's output layer, 2.1e9 elements */
  dt_array a;
  TU_OK(&ctx, dt_array_create(&ctx, DT_DEV_META, DT_BF16, 2, shape, &a));
  const size_t want = (size_t)128256 * 16384 * 2;
  TU_CHECK(a.numel == (int64_t)128256 * 16384, "numel %lld", (long long)a.numel);
  TU_CHECK(dt_array_bytes(&a) == want, "bytes %zu, want %zu", dt_array_bytes(&a), want);
  TU_CHECK(ctx.mem.dev_cur == want && ctx.mem.dev_peak == want, "accounted %zu (peak %zu), want %zu",
           ctx.mem.dev_cur, ctx.mem.dev_peak, want);
  /* a GEMM over it records its 64-bit FLOPs */
  dt_gemm_desc g = {.dtype = DT_BF16, .m = 16384, .n = 128256, .k = 16384, .alpha = 1,
                    .a = a.data, .lda = 16384, .b = a.data, .ldb = 16384, .trans_b = true,
                    .c = a.data, .ldc = 128256, .batch = 1};
  TU_OK(&ctx, dt_kledger_init(&ctx, true));
  TU_OK(&ctx, dt_device_gemm(d, &g));
  const dt_kledger *K = dt_kledger_of(&ctx);
  TU_CHECK(K->n == 1 && K->rows[0].flops == 2.0 * 16384 * 128256 * 16384,
           "gemm row: %zu rows, flops %.17g", K->n, K->n ? K->rows[0].flops : 0.0);
  dt_array_free(&ctx, &a);
  TU_CHECK(ctx.mem.dev_cur == 0, "after free %zu", ctx.mem.dev_cur);
  /* planted host read: a child reads meta data and must die by a signal */
  TU_OK(&ctx, dt_array_create(&ctx, DT_DEV_META, DT_F32, 1, (int64_t[]){16}, &a));
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    volatile float v = ((volatile float *)a.data)[3];
    (void)v;
    _exit(0); /* reached only when the read did not fault */
  }
  int st = 0;
  /* died by the signal, or (under ASan, whose handler reports the SEGV) exited non-zero */
  bool died = pid > 0 && waitpid(pid, &st, 0) == pid &&
              (WIFSIGNALED(st) || (WIFEXITED(st) && WEXITSTATUS(st) != 0));
  TU_CHECK(died, "a host read of meta data did not fault (status %d)", st);
  if (died) printf("  planted host read of meta data: faulted (status %d)\n", st);
  dt_array_free(&ctx, &a);
  dt_device_destroy(d);
  dt_ctx_release(&ctx);
}

/* The meta device's model of PyTorch's caching allocator against a sequence whose
 * reserved bytes follow by hand from CUDACachingAllocator.cpp's rules (sizes to 512 B;
 * under 1 MiB: 2 MiB segments of the small pool; under 10 MiB: 20 MiB segments; else
 * the size rounded to 2 MiB; best fit; a split when over 1 MiB is left; neighbours
 * merge on free; segments kept). The planted half: the same sequence must show more
 * reserved than live bytes, which an allocator without a cache (reserved = live)
 * would not. */
static void check_allocator(void) {
  dt_ctx ctx;
  dt_ctx_init(&ctx, 0, 1);
  dt_device *d = NULL;
  TU_OK(&ctx, dt_device_meta_create(&ctx, &d));
  if (!d) return;
  const size_t M = (size_t)1 << 20;
  void *p[9] = {NULL};
  const size_t sz[9] = {30 * M, 20 * M, 12 * M, 5 * M, 5 * M, 100 << 10, 6 * M, 24 * M, 30 * M + 1};
  /* slot k >= 0: allocate sz[k] into p[k]; -k - 1: free p[k] */
  struct { int op; size_t reserved_mib; const char *why; } seq[] = {
      {0, 30, "30 MiB: a segment of its size (A)"},
      {-1, 30, "freed: the segment is kept"},
      {1, 30, "20 MiB from A's cached 30, split (10 MiB left free)"},
      {2, 42, "12 MiB: the 10 MiB left is too small, a new 12 MiB segment"},
      {3, 42, "5 MiB: best fit is A's free 10 MiB, split"},
      {4, 42, "5 MiB: A's free 5 MiB, an exact fit"},
      {5, 44, "100 KiB: a 2 MiB segment of the small pool"},
      {6, 64, "6 MiB (under 10 MiB): a 20 MiB segment, split (14 MiB left)"},
      {-4, 64, "the first 5 MiB freed: its neighbours are in use, no merge"},
      {-2, 64, "the 20 MiB freed: merged with the free 5 MiB after it (25 MiB)"},
      {7, 64, "24 MiB: best fit the merged 25 MiB (1 MiB left: not split)"},
      {8, 96, "30 MiB + 1 B, rounded to 512 B: no block fits, a 32 MiB segment"},
  };
  bool live[9] = {false};
  for (size_t i = 0; i < sizeof seq / sizeof seq[0]; i++) {
    const int k = seq[i].op >= 0 ? seq[i].op : -seq[i].op - 1;
    if (seq[i].op < 0) {
      dt_device_free(d, p[k], sz[k]);
      live[k] = false;
    } else {
      TU_OK(&ctx, dt_device_alloc(d, sz[k], &p[k]));
      live[k] = p[k] != NULL;
    }
    TU_CHECK(ctx.mem.dev_reserved == seq[i].reserved_mib * M,
             "allocator step %zu (%s): reserved %zu MiB, want %zu", i, seq[i].why,
             ctx.mem.dev_reserved / M, seq[i].reserved_mib);
  }
  TU_CHECK(ctx.mem.dev_reserved_peak == 96 * M, "reserved peak %zu MiB, want 96",
           ctx.mem.dev_reserved_peak / M);
  /* what an allocator without a cache (reserved = live) would fail */
  TU_CHECK(ctx.mem.dev_reserved > ctx.mem.dev_cur, "reserved %zu is not above live %zu",
           ctx.mem.dev_reserved, ctx.mem.dev_cur);
  for (int k = 0; k < 9; k++)
    if (live[k]) dt_device_free(d, p[k], sz[k]);
  TU_CHECK(ctx.mem.dev_cur == 0 && ctx.mem.dev_reserved == 96 * M,
           "all freed: live %zu, reserved %zu MiB (want 0, 96: segments are kept)",
           ctx.mem.dev_cur, ctx.mem.dev_reserved / M);
  dt_mem_peak_restart(&ctx, true);
  TU_CHECK(ctx.mem.dev_reserved_peak == ctx.mem.dev_reserved, "restart: reserved peak %zu",
           ctx.mem.dev_reserved_peak);
  dt_device_destroy(d);
  dt_ctx_release(&ctx);
}

int main(void) {
  dt_ctx hc;
  dt_ctx_init(&hc, 0, 1);
  printf("test_meta: 64-bit sizes and the faulting tag\n");
  check_big_and_fault();
  printf("test_meta: the caching allocator's model (reserved bytes, derived by hand)\n");
  check_allocator();
  printf("test_meta: compute ledger vs analytic FLOPs (%s, world 1, meta)\n", MODEL);
  check_flops(&hc);
  printf("test_meta: the ledger at scale (meta, rank 0 alone)\n");
  check_scale(&hc);
  printf("test_meta: world-%d configs, meta + fake vs threads + cuda-emu (%s, batch %d seq %d)\n",
         WORLD, MODEL, BATCH, SEQ);
  if (!getenv("SB_META_FLOPS_ONLY"))
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) check_case(&hc, &CASES[i], i > 0);
  dt_ctx_release(&hc);
  return tu_finish("test_meta");
}
