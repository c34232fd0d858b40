/* verify/test_nccl.c: the NCCL comm backend on the GPUs of this host, world 1
 * and world = GPU count (when > 1), threads launcher, opts.comm nccl.
 *
 * Oracle: each rank's input is a formula of (rank, index) giving small integers
 * (exact in f32, f64 and bf16, as are their sums, max and min over <= 8 ranks),
 * so every rank computes the expected result of every collective itself, in
 * double. Buffers live on the GPU (uploaded, collective, downloaded); one
 * all_reduce uses host buffers (the staged path). Also: the split (color, key
 * order, world ranks, a reduction inside it), a send/recv ring with the sends
 * first (the eager promise), the deferred mode with a ticket, a failed rank
 * aborting its peer (world >= 2), and the launcher's refusals (emulated device,
 * more ranks than GPUs), which run before the skip. SKIP (77) without NCCL or
 * without a GPU. */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "comm/comm_nccl.h"

static int failures;

#define CHECK(cond, ...)                                       \
  do {                                                         \
    if (!(cond)) {                                             \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);     \
      fprintf(stderr, __VA_ARGS__);                            \
      fprintf(stderr, "\n");                                   \
      failures++;                                              \
    }                                                          \
  } while (0)

static const size_t counts[] = {0, 1, 7, 4099, 70001};
enum { N_COUNTS = sizeof counts / sizeof counts[0] };
static const dt_dtype types[] = {DT_F32, DT_F64, DT_BF16};

static double ival(int r, size_t i, dt_reduce_op op) {
  if (op == DT_RED_PROD) return (double)((r + (int)(i % 5)) % 2 + 1); /* 1..2: 2^8 exact in bf16 */
  return (double)((int)((r * 131 + (int)(i % 1009) * 17 + 3) % 9) - 4); /* -4..4 */
}

static void set(dt_dtype t, void *p, size_t i, double v) {
  if (t == DT_F32) ((float *)p)[i] = (float)v;
  else if (t == DT_F64) ((double *)p)[i] = v;
  else if (t == DT_I64) ((int64_t *)p)[i] = (int64_t)v;
  else ((dt_bf16 *)p)[i] = dt_f32_to_bf16((float)v);
}

static double get(dt_dtype t, const void *p, size_t i) {
  if (t == DT_F32) return ((const float *)p)[i];
  if (t == DT_F64) return ((const double *)p)[i];
  if (t == DT_I64) return (double)((const int64_t *)p)[i];
  return dt_bf16_to_f32(((const dt_bf16 *)p)[i]);
}

static double unit(dt_dtype t) {
  return t == DT_F32 ? 0x1p-24 : t == DT_F64 ? 0x1p-53 : t == DT_BF16 ? 0x1p-8 : 0.0;
}

static double ref_reduce(int n, size_t i, dt_reduce_op op) {
  double acc = ival(0, i, op);
  for (int r = 1; r < n; r++) {
    double v = ival(r, i, op);
    if (op == DT_RED_MAX) acc = v > acc ? v : acc;
    else if (op == DT_RED_MIN) acc = v < acc ? v : acc;
    else if (op == DT_RED_PROD) acc *= v;
    else acc += v;
  }
  return op == DT_RED_AVG ? acc / n : acc;
}

/* Exact except avg, whose sum is exact and whose division by n rounds once or,
 * if NCCL pre-multiplies by 1/n (its ncclAvg may), twice: 2 units of the dtype. */
static bool close_to(dt_dtype t, dt_reduce_op op, double got, double want) {
  if (op != DT_RED_AVG) return got == want;
  return fabs(got - want) <= 2.0 * unit(t) * fabs(want);
}

/* ---- device buffers ---- */

typedef struct dbuf {
  dt_device *d;
  void *p;
  size_t bytes;
} dbuf;

static dt_status dalloc(dt_ctx *ctx, dbuf *b, size_t bytes) {
  b->d = ctx->device;
  b->bytes = bytes ? bytes : 1;
  return dt_device_alloc(b->d, b->bytes, &b->p);
}
static void dfree(dbuf *b) {
  if (b->p) dt_device_free(b->d, b->p, b->bytes);
  b->p = NULL;
}
static dt_status up(dbuf *b, const void *h, size_t bytes) {
  return bytes ? dt_device_copy(b->d, b->p, h, bytes, DT_COPY_H2D) : DT_OK;
}
static dt_status down(void *h, const dbuf *b, size_t off, size_t bytes) {
  return bytes ? dt_device_copy(b->d, h, (const char *)b->p + off, bytes, DT_COPY_D2H) : DT_OK;
}

/* ---- the collectives ---- */

static dt_status check_all_reduce(dt_ctx *ctx, dt_comm *c, dt_dtype t, size_t count,
                                  dt_reduce_op op, bool host) {
  size_t es = dt_dtype_size(t), bytes = count * es;
  char *h = malloc(bytes + 1), *o = malloc(bytes + 1);
  dbuf s = {0}, r = {0};
  dt_status st = h && o ? DT_OK : DT_ERR_NOMEM;
  for (size_t i = 0; st == DT_OK && i < count; i++) set(t, h, i, ival(c->rank, i, op));
  if (host) {
    memcpy(o, h, bytes); /* in place, host memory */
    if (st == DT_OK) st = dt_comm_all_reduce(c, o, o, count, t, op);
  } else {
    if (st == DT_OK) st = dalloc(ctx, &s, bytes);
    if (st == DT_OK) st = dalloc(ctx, &r, bytes);
    if (st == DT_OK) st = up(&s, h, bytes);
    if (st == DT_OK) st = dt_comm_all_reduce(c, s.p, r.p, count, t, op);
    if (st == DT_OK) st = down(o, &r, 0, bytes);
  }
  int bad = 0;
  for (size_t i = 0; st == DT_OK && i < count; i++) {
    double g = get(t, o, i), w = ref_reduce(c->size, i, op);
    if (!close_to(t, op, g, w) && bad++ < 3)
      CHECK(false, "all_reduce %s %s n=%zu host=%d [%zu]: got %g want %g", dt_dtype_name(t),
            dt_reduce_name(op), count, host, i, g, w);
  }
  CHECK(st == DT_OK, "all_reduce %s: %s", dt_dtype_name(t), dt_last_error(ctx));
  dfree(&s);
  dfree(&r);
  free(h);
  free(o);
  return st;
}

/* all_gather (out of place, and in place), reduce_scatter (sum), all_to_all,
 * broadcast from the last rank, scatter from the last rank. */
static dt_status check_moves(dt_ctx *ctx, dt_comm *c, dt_dtype t, size_t count) {
  const int n = c->size, me = c->rank;
  size_t es = dt_dtype_size(t), blk = count * es, all = blk * (size_t)n;
  char *h = malloc(all + 1), *o = malloc(all + 1);
  dbuf s = {0}, r = {0};
  dt_status st = h && o ? DT_OK : DT_ERR_NOMEM;
  if (st == DT_OK) st = dalloc(ctx, &s, all);
  if (st == DT_OK) st = dalloc(ctx, &r, all);
  int bad = 0;
#define EXPECT(what, idx, g, w)                                                            \
  if ((g) != (w) && bad++ < 3)                                                             \
  CHECK(false, "%s %s n=%zu [%zu]: got %g want %g", what, dt_dtype_name(t), count, (size_t)(idx), \
        (double)(g), (double)(w))
  /* all_gather: block q holds rank q's input */
  for (size_t i = 0; i < count; i++) set(t, h, i, ival(me, i, DT_RED_SUM));
  if (st == DT_OK) st = up(&s, h, blk);
  if (st == DT_OK) st = dt_comm_all_gather(c, s.p, r.p, count, t);
  if (st == DT_OK) st = down(o, &r, 0, all);
  for (int q = 0; st == DT_OK && q < n; q++)
    for (size_t i = 0; i < count; i++)
      EXPECT("all_gather", q * count + i, get(t, o, q * count + i), ival(q, i, DT_RED_SUM));
  /* in place: own block already at its slot of r */
  if (st == DT_OK) st = up(&r, h, 0);
  if (st == DT_OK && blk) st = dt_device_copy(ctx->device, (char *)r.p + (size_t)me * blk, s.p, blk, DT_COPY_D2D);
  if (st == DT_OK) st = dt_comm_all_gather(c, (char *)r.p + (size_t)me * blk, r.p, count, t);
  if (st == DT_OK) st = down(o, &r, 0, all);
  for (int q = 0; st == DT_OK && q < n; q++)
    for (size_t i = 0; i < count; i++)
      EXPECT("all_gather in place", q * count + i, get(t, o, q * count + i), ival(q, i, DT_RED_SUM));
  /* reduce_scatter: input element j = ival(me, j); rank me gets block me summed */
  for (size_t j = 0; j < count * (size_t)n; j++) set(t, h, j, ival(me, j, DT_RED_SUM));
  if (st == DT_OK) st = up(&s, h, all);
  if (st == DT_OK) st = dt_comm_reduce_scatter(c, s.p, r.p, count, t, DT_RED_SUM);
  if (st == DT_OK) st = down(o, &r, 0, blk);
  for (size_t i = 0; st == DT_OK && i < count; i++)
    EXPECT("reduce_scatter", i, get(t, o, i), ref_reduce(n, (size_t)me * count + i, DT_RED_SUM));
  /* all_to_all: block q of rank p's input is 100p + q + i; rank me receives block me */
  for (int q = 0; q < n; q++)
    for (size_t i = 0; i < count; i++) set(t, h, q * count + i, (double)(10 * me + q) + (double)(i % 7));
  if (st == DT_OK) st = up(&s, h, all);
  if (st == DT_OK) st = dt_comm_all_to_all(c, s.p, r.p, count, t);
  if (st == DT_OK) st = down(o, &r, 0, all);
  for (int p = 0; st == DT_OK && p < n; p++)
    for (size_t i = 0; i < count; i++)
      EXPECT("all_to_all", p * count + i, get(t, o, p * count + i),
             (double)(10 * p + me) + (double)(i % 7));
  /* broadcast from the last rank */
  int root = n - 1;
  for (size_t i = 0; i < count; i++) set(t, h, i, me == root ? ival(root, i, DT_RED_SUM) : 99.0);
  if (st == DT_OK) st = up(&r, h, blk);
  if (st == DT_OK) st = dt_comm_broadcast(c, r.p, count, t, root);
  if (st == DT_OK) st = down(o, &r, 0, blk);
  for (size_t i = 0; st == DT_OK && i < count; i++)
    EXPECT("broadcast", i, get(t, o, i), ival(root, i, DT_RED_SUM));
  /* scatter from the last rank: block q = ival(q, i) */
  for (int q = 0; q < n; q++)
    for (size_t i = 0; i < count; i++) set(t, h, q * count + i, ival(q, i, DT_RED_MIN));
  if (st == DT_OK) st = up(&s, h, all);
  if (st == DT_OK) st = dt_comm_scatter(c, me == root ? s.p : NULL, r.p, count, t, root);
  if (st == DT_OK) st = down(o, &r, 0, blk);
  for (size_t i = 0; st == DT_OK && i < count; i++)
    EXPECT("scatter", i, get(t, o, i), ival(me, i, DT_RED_MIN));
#undef EXPECT
  CHECK(st == DT_OK, "moves %s n=%zu: %s", dt_dtype_name(t), count, dt_last_error(ctx));
  dfree(&s);
  dfree(&r);
  free(h);
  free(o);
  return st;
}

/* Ring: every rank sends to the next first (eager), then receives from the
 * previous; two messages per pair, received in send order. */
static dt_status check_ring(dt_ctx *ctx, dt_comm *c, size_t count) {
  const int n = c->size, me = c->rank;
  if (n < 2) return DT_OK;
  size_t bytes = count * sizeof(float);
  float *h = malloc(bytes), *o = malloc(bytes);
  dbuf s = {0}, r = {0};
  dt_status st = h && o ? DT_OK : DT_ERR_NOMEM;
  if (st == DT_OK) st = dalloc(ctx, &s, bytes);
  if (st == DT_OK) st = dalloc(ctx, &r, bytes);
  for (int k = 0; st == DT_OK && k < 2; k++) {
    for (size_t i = 0; i < count; i++) h[i] = (float)(1000 * k + 10 * me + (int)(i % 9));
    st = up(&s, h, bytes);
    if (st == DT_OK) st = dt_comm_send(c, s.p, count, DT_F32, (me + 1) % n, k);
  }
  int prev = (me + n - 1) % n;
  for (int k = 0; st == DT_OK && k < 2; k++) {
    st = dt_comm_recv(c, r.p, count, DT_F32, prev, k);
    if (st == DT_OK) st = down(o, &r, 0, bytes);
    int bad = 0;
    for (size_t i = 0; st == DT_OK && i < count; i++)
      if (o[i] != (float)(1000 * k + 10 * prev + (int)(i % 9)) && bad++ < 3)
        CHECK(false, "ring msg %d [%zu]: got %g", k, i, (double)o[i]);
  }
  CHECK(st == DT_OK, "ring: %s", dt_last_error(ctx));
  dfree(&s);
  dfree(&r);
  free(h);
  free(o);
  return st;
}

/* Split by parity, keys reversing the order: rank and world ranks as the
 * colors and keys say, and a sum over the members only. */
static dt_status check_split(dt_ctx *ctx, dt_comm *c) {
  const int n = c->size, me = c->rank;
  dt_comm *sub = NULL;
  dt_status st = dt_comm_split(c, me % 2, -me, "par", &sub);
  CHECK(st == DT_OK && sub, "split: %s", dt_last_error(ctx));
  if (st != DT_OK || !sub) return st != DT_OK ? st : DT_ERR_INTERNAL;
  int members[64], m = 0;
  for (int q = n - 1; q >= 0; q--)
    if (q % 2 == me % 2) members[m++] = q; /* key -q: descending rank */
  CHECK(sub->size == m, "split size %d want %d", sub->size, m);
  for (int i = 0; i < m && i < sub->size; i++) {
    CHECK(sub->world_ranks[i] == members[i], "split world_ranks[%d] %d want %d", i,
          sub->world_ranks[i], members[i]);
    if (members[i] == me) CHECK(sub->rank == i, "split rank %d want %d", sub->rank, i);
  }
  double v = (double)(me + 1), sum = 0.0, want = 0.0;
  for (int i = 0; i < m; i++) want += members[i] + 1;
  st = dt_comm_all_reduce(sub, &v, &sum, 1, DT_F64, DT_RED_SUM); /* host buffers: staged */
  CHECK(st == DT_OK && sum == want, "split sum %g want %g: %s", sum, want, dt_last_error(ctx));
  dt_comm *none = NULL;
  if (st == DT_OK) st = dt_comm_split(c, me == 0 ? 0 : -1, 0, "zero", &none);
  CHECK(st == DT_OK && (me == 0) == (none != NULL), "split with no color: %s", dt_last_error(ctx));
  dt_comm_destroy(none);
  dt_comm_destroy(sub);
  return st;
}

/* Deferred mode: an all_gather queued, a ticket, the compute stream ordered
 * after it by wait, then read through the device's stream. */
static dt_status check_deferred(dt_ctx *ctx, dt_comm *c) {
  const int n = c->size, me = c->rank;
  const size_t count = 100003;
  size_t blk = count * sizeof(float);
  float *h = malloc(blk * (size_t)n);
  dbuf s = {0}, r = {0};
  dt_status st = h ? DT_OK : DT_ERR_NOMEM;
  if (st == DT_OK) st = dalloc(ctx, &s, blk);
  if (st == DT_OK) st = dalloc(ctx, &r, blk * (size_t)n);
  for (size_t i = 0; i < count; i++) h[i] = (float)(me * 7 + (int)(i % 13));
  if (st == DT_OK) st = up(&s, h, blk);
  if (st == DT_OK) st = dt_comm_nccl_set_mode(c, DT_NCCL_DEFERRED);
  if (st == DT_OK) st = dt_comm_all_gather(c, s.p, r.p, count, DT_F32);
  uint64_t ticket = dt_comm_nccl_ticket(c);
  CHECK(ticket > 0, "no ticket after a deferred all_gather");
  if (st == DT_OK) st = dt_comm_nccl_wait(c, ticket);
  if (st == DT_OK) st = down(h, &r, 0, blk * (size_t)n);
  if (st == DT_OK) st = dt_comm_nccl_sync(c);
  (void)dt_comm_nccl_set_mode(c, DT_NCCL_BLOCKING);
  int bad = 0;
  for (int q = 0; st == DT_OK && q < n; q++)
    for (size_t i = 0; i < count; i++)
      if (h[q * count + i] != (float)(q * 7 + (int)(i % 13)) && bad++ < 3)
        CHECK(false, "deferred all_gather [%d][%zu]: got %g", q, i, (double)h[q * count + i]);
  CHECK(st == DT_OK, "deferred: %s", dt_last_error(ctx));
  dfree(&s);
  dfree(&r);
  free(h);
  return st;
}

static dt_status run_all(dt_ctx *ctx, void *arg) {
  (void)arg;
  dt_comm *c = ctx->world;
  CHECK(dt_comm_is_nccl(c), "the world is not an nccl communicator");
  const dt_reduce_op ops[] = {DT_RED_SUM, DT_RED_AVG, DT_RED_MAX, DT_RED_MIN, DT_RED_PROD};
  dt_status st = DT_OK;
  for (int ti = 0; st == DT_OK && ti < 3; ti++)
    for (int k = 0; st == DT_OK && k < N_COUNTS; k++) {
      for (int oi = 0; st == DT_OK && oi < 5; oi++)
        st = check_all_reduce(ctx, c, types[ti], counts[k], ops[oi], false);
      if (st == DT_OK) st = check_moves(ctx, c, types[ti], counts[k]);
    }
  for (int k = 0; st == DT_OK && k < N_COUNTS; k++) st = check_moves(ctx, c, DT_I64, counts[k]);
  if (st == DT_OK) st = check_all_reduce(ctx, c, DT_F32, 4099, DT_RED_SUM, true);
  if (st == DT_OK) st = dt_comm_barrier(c);
  if (st == DT_OK) st = check_ring(ctx, c, 70001);
  if (st == DT_OK) st = check_split(ctx, c);
  if (st == DT_OK) st = check_deferred(ctx, c);
  /* every call above is in the ledger, tagged with the group */
  const dt_ledger *l = dt_ledger_of(ctx);
  CHECK(l->n > 0 && !strcmp(l->rows[0].group, "world"), "ledger rows: %zu", l->n);
  return failures ? DT_ERR_INTERNAL : st;
}

/* Rank 1 fails before the collective rank 0 waits in: rank 0 must return
 * DT_ERR_ABORTED well inside the timeout (the launcher's hook), not hang. */
static dt_status run_abort(dt_ctx *ctx, void *arg) {
  double *waited = arg;
  if (ctx->rank == 1) return dt_error(ctx, DT_ERR_INVALID, "test", "planted failure");
  float v = 1.0f, out = 0.0f;
  double t0 = dt_now();
  dt_status st = ctx->rank == 0 ? dt_comm_all_reduce(ctx->world, &v, &out, 1, DT_F32, DT_RED_SUM)
                                : DT_OK;
  if (ctx->rank == 0) {
    *waited = dt_now() - t0;
    CHECK(st == DT_ERR_ABORTED, "rank 0 got %s (%s), want aborted", dt_status_str(st),
          dt_last_error(ctx));
  }
  return st;
}

static dt_launch_opts nccl_opts(int world) {
  dt_launch_opts o;
  memset(&o, 0, sizeof o);
  o.backend = DT_BACKEND_THREADS;
  o.world = world;
  o.timeout_s = 60;
  o.device = DT_DEV_CUDA;
  o.comm = DT_COMM_NCCL;
  return o;
}

int main(void) {
  /* the checker rejects a planted wrong value (it can fail) */
  CHECK(!close_to(DT_F32, DT_RED_SUM, 3.0, 4.0) && !close_to(DT_BF16, DT_RED_AVG, 1.02, 1.0) &&
            close_to(DT_F32, DT_RED_AVG, 1.0 + 0x1p-24, 1.0),
        "the checker accepts a wrong value");
  if (!dt_comm_nccl_built()) {
    printf("SKIP: built without NCCL\n");
    return failures ? 1 : 77;
  }
  dt_launch_report rep;
  /* refusal: NCCL on the emulated device */
  dt_launch_opts o = nccl_opts(1);
  o.cuda_emu = true;
  dt_status st = dt_launch(&o, run_all, NULL, &rep);
  CHECK(st == DT_ERR_INVALID && strstr(rep.failed_msg, "cuda device"), "emu refused: %s: %s",
        dt_status_str(st), rep.failed_msg);
  dt_launch_report_free(&rep);
  int ngpu = dt_device_cuda_count();
  if (ngpu < 1) {
    printf("%s\n", failures ? "FAIL: the launcher's refusals" : "SKIP: no GPU (the launcher's refusals passed)");
    return failures ? 1 : 77;
  }
  /* refusal: more ranks than GPUs, naming the counts */
  o = nccl_opts(ngpu + 1);
  char want[64];
  snprintf(want, sizeof want, "this host has %d", ngpu);
  st = dt_launch(&o, run_all, NULL, &rep);
  CHECK(st == DT_ERR_INVALID && strstr(rep.failed_msg, want), "oversubscribed: %s: %s",
        dt_status_str(st), rep.failed_msg);
  dt_launch_report_free(&rep);
  int worlds[2] = {1, ngpu};
  for (int w = 0; w < (ngpu > 1 ? 2 : 1); w++) {
    o = nccl_opts(worlds[w]);
    st = dt_launch(&o, run_all, NULL, &rep);
    CHECK(st == DT_OK, "world %d: %s: rank %d: %s", worlds[w], dt_status_str(st), rep.failed_rank,
          rep.failed_msg);
    dt_launch_report_free(&rep);
    printf("world %d: collectives checked\n", worlds[w]);
  }
  if (ngpu > 1) {
    double waited = -1.0;
    o = nccl_opts(2);
    o.timeout_s = 30; /* the abort must come from the hook, long before this */
    st = dt_launch(&o, run_abort, &waited, &rep);
    CHECK(st == DT_ERR_INVALID && rep.failed_rank == 1, "abort: %s, failed rank %d: %s",
          dt_status_str(st), rep.failed_rank, rep.failed_msg);
    CHECK(waited >= 0.0 && waited < 10.0, "rank 0 waited %.3g s for the abort", waited);
    dt_launch_report_free(&rep);
  }
  printf("%s\n", failures ? "FAIL" : "PASS");
  return failures ? 1 : 0;
}
