/* verify/test_comm.c: every collective, reduce op and dtype against a naive
 * reference, on the threads backend for worlds 1..8 (default) or on MPI
 * (--backend mpi, under mpirun, at the world mpirun gives).
 *
 * Inputs are small integers (exact in every dtype, so sums, products, max and
 * min must match exactly) computed by a formula of (rank, index): each rank can
 * compute every other rank's input and hence the expected result on its own.
 * Counts include 0, 1, primes and sizes not divisible by the world. Each call's
 * ledger row is checked against the bytes of the ring model computed here. On
 * threads, sums of random floats are also checked bitwise against the rank-order
 * sum (the backend's documented reduction order) and across repeated runs. */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static const size_t counts[] = {0, 1, 2, 7, 64, 257, 1000, 4099, 70001};
enum { N_COUNTS = sizeof counts / sizeof counts[0] };

typedef struct targ {
  bool threads; /* exact reduction order known: bitwise checks */
} targ;

/* Input element i of rank r for reduce op `op`: small exact integers. */
static double ival(int r, size_t i, dt_reduce_op op) {
  if (op == DT_RED_PROD) return (double)((r + (int)(i % 5)) % 3 + 1); /* 1..3: 3^8 exact */
  return (double)((int)((r * 131 + (int)(i % 1009) * 17 + 3) % 9) - 4); /* -4..4 */
}

static void set(dt_dtype t, void *p, size_t i, double v) {
  if (t == DT_F32) ((float *)p)[i] = (float)v;
  else if (t == DT_F64) ((double *)p)[i] = v;
  else ((dt_bf16 *)p)[i] = dt_f32_to_bf16((float)v);
}

static double get(dt_dtype t, const void *p, size_t i) {
  if (t == DT_F32) return ((const float *)p)[i];
  if (t == DT_F64) return ((const double *)p)[i];
  return dt_bf16_to_f32(((const dt_bf16 *)p)[i]);
}

static double ref_reduce(int n, size_t i, dt_reduce_op op) {
  double acc = ival(0, i, op);
  for (int r = 1; r < n; r++) {
    double v = ival(r, i, op);
    switch (op) {
      case DT_RED_SUM: case DT_RED_AVG: acc += v; break;
      case DT_RED_MAX: acc = v > acc ? v : acc; break;
      case DT_RED_MIN: acc = v < acc ? v : acc; break;
      case DT_RED_PROD: acc *= v; break;
      default: break;
    }
  }
  if (op == DT_RED_AVG) acc /= n;
  return acc;
}

/* avg = sum * (1/n) rounded in the dtype: within 2 ulps of the exact quotient
 * (one rounding of 1/n, one of the product). Other ops on small integers: exact. */
static bool close_enough(dt_dtype t, dt_reduce_op op, double got, double want) {
  if (op != DT_RED_AVG) return got == want;
  double ulp = t == DT_F64 ? 0x1p-52 : t == DT_F32 ? 0x1p-23 : 0x1p-7;
  return fabs(got - want) <= 2 * ulp * fabs(want) + 1e-300;
}

/* Checks the newest ledger row against the ring model computed independently. */
static void check_ledger(dt_ctx *ctx, dt_comm *c, dt_coll op, size_t count, dt_dtype t) {
  if (dt_ledger_of(ctx)->n == 0) { TU_CHECK(0, "no ledger row"); return; }
  const dt_ledger_row *r = &dt_ledger_of(ctx)->rows[dt_ledger_of(ctx)->n - 1];
  int n = c->size;
  uint64_t es = dt_dtype_size(t);
  uint64_t S = (op == DT_COLL_ALL_REDUCE || op == DT_COLL_BROADCAST || op == DT_COLL_SEND ||
                op == DT_COLL_RECV) ? count * es : (op == DT_COLL_BARRIER ? 0 : count * es * (uint64_t)n);
  double wire;
  switch (op) {
    case DT_COLL_ALL_REDUCE: wire = n > 1 ? 2.0 * (n - 1) / n * (double)S : 0; break;
    case DT_COLL_BROADCAST: wire = n > 1 ? (double)S : 0; break;
    case DT_COLL_SEND: wire = (double)S; break;
    case DT_COLL_RECV: wire = 0; break; /* counted once, on the sender's row */
    case DT_COLL_BARRIER: wire = 0; break;
    default: wire = n > 1 ? (double)(n - 1) / n * (double)S : 0; break;
  }
  TU_CHECK(r->op == (int)op && r->group_size == n && r->payload_bytes == S &&
               fabs(r->wire_bytes - wire) <= 1e-9 * (wire + 1) && r->dtype == (int)t &&
               !strcmp(r->group, c->name) && r->seconds >= 0 && !strcmp(r->phase, ctx->phase),
           "rank %d ledger for %s count %zu: op %d size %d payload %llu (want %llu) wire %g (want %g)",
           ctx->rank, dt_coll_name(op), count, r->op, r->group_size,
           (unsigned long long)r->payload_bytes, (unsigned long long)S, r->wire_bytes, wire);
}

static void *xalloc(dt_ctx *ctx, size_t bytes) { return dt_host_alloc(ctx, bytes ? bytes : 1); }

/* On a rank with a device (SB_TEST_DEVICE) the collectives of test_reductions
 * and test_movement run on device copies of their host buffers: the inputs are
 * uploaded, the outputs downloaded, so the same host-side checks cover the
 * backends' device path (threads: device copies and the reduce kernel; mpi:
 * the front's staging). The in-place forms keep their aliasing on the device. */
static bool on_dev(dt_ctx *ctx) { return ctx->device && ctx->device->kind != DT_DEV_CPU; }

static void *up(dt_ctx *ctx, const void *h, size_t bytes) {
  void *d = NULL;
  if (dt_device_alloc(ctx->device, bytes + 8, &d) != DT_OK) return NULL;
  if (h && bytes) dt_device_copy(ctx->device, d, h, bytes, DT_COPY_H2D);
  return d;
}
static void down(dt_ctx *ctx, void *h, void *d, size_t bytes) {
  dt_device_sync(ctx->device);
  if (bytes) dt_device_copy(ctx->device, h, d, bytes, DT_COPY_D2H);
}
static void dfree(dt_ctx *ctx, void *d, size_t bytes) { dt_device_free(ctx->device, d, bytes + 8); }

static dt_status D_all_reduce(dt_ctx *ctx, dt_comm *c, void *in, void *dst, size_t count,
                              dt_dtype t, dt_reduce_op op) {
  if (!on_dev(ctx)) return dt_comm_all_reduce(c, in, dst, count, t, op);
  size_t b = count * dt_dtype_size(t);
  void *din = up(ctx, in, b), *dd = dst == in ? din : up(ctx, NULL, b);
  dt_status s = dt_comm_all_reduce(c, din, dd, count, t, op);
  down(ctx, dst, dd, b);
  if (dd != din) dfree(ctx, dd, b);
  dfree(ctx, din, b);
  return s;
}
static dt_status D_reduce_scatter(dt_ctx *ctx, dt_comm *c, void *in, void *out, size_t count,
                                  dt_dtype t, dt_reduce_op op) {
  if (!on_dev(ctx)) return dt_comm_reduce_scatter(c, in, out, count, t, op);
  size_t b = count * dt_dtype_size(t), n = (size_t)c->size;
  void *din = up(ctx, in, b * n), *dout = up(ctx, NULL, b);
  dt_status s = dt_comm_reduce_scatter(c, din, dout, count, t, op);
  down(ctx, out, dout, b);
  dfree(ctx, din, b * n);
  dfree(ctx, dout, b);
  return s;
}
static dt_status D_all_gather(dt_ctx *ctx, dt_comm *c, char *send, char *recv, size_t count,
                              dt_dtype t) {
  if (!on_dev(ctx)) return dt_comm_all_gather(c, send, recv, count, t);
  size_t b = count * dt_dtype_size(t), n = (size_t)c->size;
  bool inplace = send == recv + (size_t)c->rank * b;
  char *dr = up(ctx, inplace ? recv : NULL, b * n), *ds = inplace ? dr + (size_t)c->rank * b : up(ctx, send, b);
  dt_status s = dt_comm_all_gather(c, ds, dr, count, t);
  down(ctx, recv, dr, b * n);
  if (!inplace) dfree(ctx, ds, b);
  dfree(ctx, dr, b * n);
  return s;
}
static dt_status D_all_to_all(dt_ctx *ctx, dt_comm *c, void *send, void *recv, size_t count,
                              dt_dtype t) {
  if (!on_dev(ctx)) return dt_comm_all_to_all(c, send, recv, count, t);
  size_t b = count * dt_dtype_size(t) * (size_t)c->size;
  void *ds = up(ctx, send, b), *dr = up(ctx, NULL, b);
  dt_status s = dt_comm_all_to_all(c, ds, dr, count, t);
  down(ctx, recv, dr, b);
  dfree(ctx, ds, b);
  dfree(ctx, dr, b);
  return s;
}
static dt_status D_broadcast(dt_ctx *ctx, dt_comm *c, void *buf, size_t count, dt_dtype t, int root) {
  if (!on_dev(ctx)) return dt_comm_broadcast(c, buf, count, t, root);
  size_t b = count * dt_dtype_size(t);
  void *d = up(ctx, buf, b);
  dt_status s = dt_comm_broadcast(c, d, count, t, root);
  down(ctx, buf, d, b);
  dfree(ctx, d, b);
  return s;
}
static dt_status D_scatter(dt_ctx *ctx, dt_comm *c, void *send, void *recv, size_t count,
                           dt_dtype t, int root) {
  if (!on_dev(ctx)) return dt_comm_scatter(c, send, recv, count, t, root);
  size_t b = count * dt_dtype_size(t), n = (size_t)c->size;
  void *ds = send ? up(ctx, send, b * n) : NULL, *dr = up(ctx, NULL, b);
  dt_status s = dt_comm_scatter(c, ds, dr, count, t, root);
  down(ctx, recv, dr, b);
  if (ds) dfree(ctx, ds, b * n);
  dfree(ctx, dr, b);
  return s;
}
static dt_status D_send(dt_ctx *ctx, dt_comm *c, void *buf, size_t count, dt_dtype t, int peer, int tag) {
  if (!on_dev(ctx)) return dt_comm_send(c, buf, count, t, peer, tag);
  size_t b = count * dt_dtype_size(t);
  void *d = up(ctx, buf, b);
  dt_status s = dt_comm_send(c, d, count, t, peer, tag);
  dfree(ctx, d, b);
  return s;
}
static dt_status D_recv(dt_ctx *ctx, dt_comm *c, void *buf, size_t count, dt_dtype t, int peer, int tag) {
  if (!on_dev(ctx)) return dt_comm_recv(c, buf, count, t, peer, tag);
  size_t b = count * dt_dtype_size(t);
  void *d = up(ctx, NULL, b);
  dt_status s = dt_comm_recv(c, d, count, t, peer, tag);
  down(ctx, buf, d, b);
  dfree(ctx, d, b);
  return s;
}

static void test_reductions(dt_ctx *ctx, dt_comm *c) {
  int n = c->size, me = c->rank;
  const dt_dtype dts[] = {DT_F32, DT_F64, DT_BF16};
  for (int di = 0; di < 3; di++) {
    dt_dtype t = dts[di];
    size_t es = dt_dtype_size(t);
    for (int op = 0; op < DT_RED_COUNT; op++) {
      for (int ci = 0; ci < N_COUNTS; ci++) {
        size_t count = counts[ci];
        if (t == DT_BF16 && count > 4099) continue;
        char *in = xalloc(ctx, count * es), *out = xalloc(ctx, count * es);
        for (size_t i = 0; i < count; i++) set(t, in, i, ival(me, i, (dt_reduce_op)op));
        /* out of place, then in place */
        for (int inplace = 0; inplace < 2; inplace++) {
          void *dst = inplace ? in : out;
          if (inplace)
            for (size_t i = 0; i < count; i++) set(t, in, i, ival(me, i, (dt_reduce_op)op));
          dt_status s = D_all_reduce(ctx, c, in, dst, count, t, (dt_reduce_op)op);
          if (s != DT_OK && t == DT_BF16 && s == DT_ERR_UNSUPPORTED) break;
          TU_OK(ctx, s);
          check_ledger(ctx, c, DT_COLL_ALL_REDUCE, count, t);
          long bad = 0; size_t first = 0;
          for (size_t i = 0; i < count; i++) {
            double want = ref_reduce(n, i, (dt_reduce_op)op);
            if (t == DT_BF16) want = dt_bf16_to_f32(dt_f32_to_bf16((float)want));
            if (!close_enough(t, (dt_reduce_op)op, get(t, dst, i), want)) { if (!bad) first = i; bad++; }
          }
          TU_CHECK(bad == 0, "all_reduce %s %s n=%d count=%zu inplace=%d: %ld wrong, first [%zu] %g vs %g",
                   dt_dtype_name(t), dt_reduce_name((dt_reduce_op)op), n, count, inplace, bad, first,
                   count ? get(t, dst, first) : 0.0, count ? ref_reduce(n, first, (dt_reduce_op)op) : 0.0);
        }
        dt_host_free(ctx, in);
        dt_host_free(ctx, out);

        /* reduce_scatter: count per rank; input has n*count elements */
        char *rin = xalloc(ctx, count * es * (size_t)n), *rout = xalloc(ctx, count * es);
        for (size_t i = 0; i < count * (size_t)n; i++) set(t, rin, i, ival(me, i, (dt_reduce_op)op));
        dt_status s = D_reduce_scatter(ctx, c, rin, rout, count, t, (dt_reduce_op)op);
        if (!(s == DT_ERR_UNSUPPORTED && t == DT_BF16)) {
          TU_OK(ctx, s);
          check_ledger(ctx, c, DT_COLL_REDUCE_SCATTER, count, t);
          long bad = 0;
          for (size_t i = 0; i < count; i++) {
            double want = ref_reduce(n, (size_t)me * count + i, (dt_reduce_op)op);
            if (t == DT_BF16) want = dt_bf16_to_f32(dt_f32_to_bf16((float)want));
            if (!close_enough(t, (dt_reduce_op)op, get(t, rout, i), want)) bad++;
          }
          TU_CHECK(bad == 0, "reduce_scatter %s %s n=%d count=%zu: %ld wrong", dt_dtype_name(t),
                   dt_reduce_name((dt_reduce_op)op), n, count, bad);
        }
        dt_host_free(ctx, rin);
        dt_host_free(ctx, rout);
      }
    }
  }
}

static void test_movement(dt_ctx *ctx, dt_comm *c) {
  int n = c->size, me = c->rank;
  const dt_dtype dts[] = {DT_F32, DT_F64};
  for (int di = 0; di < 2; di++) {
    dt_dtype t = dts[di];
    size_t es = dt_dtype_size(t);
    for (int ci = 0; ci < N_COUNTS; ci++) {
      size_t count = counts[ci], total = count * (size_t)n;
      char *a = xalloc(ctx, total * es), *b = xalloc(ctx, total * es);
      /* element value encodes (source rank, index): exact in f32 below 2^24 */
      /* all_gather out of place */
      for (size_t i = 0; i < count; i++) set(t, a, i, (double)(me * 100000 + (int)(i % 99991)));
      TU_OK(ctx, D_all_gather(ctx, c, a, b, count, t));
      check_ledger(ctx, c, DT_COLL_ALL_GATHER, count, t);
      long bad = 0;
      for (int q = 0; q < n; q++)
        for (size_t i = 0; i < count; i++)
          bad += get(t, b, (size_t)q * count + i) != (double)(q * 100000 + (int)(i % 99991));
      TU_CHECK(bad == 0, "all_gather %s n=%d count=%zu: %ld wrong", dt_dtype_name(t), n, count, bad);
      /* all_gather in place: my slot of the output is the input */
      memset(b, 0, total * es);
      for (size_t i = 0; i < count; i++)
        set(t, b + (size_t)me * count * es, i, (double)(me * 100000 + (int)(i % 99991)));
      TU_OK(ctx, D_all_gather(ctx, c, b + (size_t)me * count * es, b, count, t));
      bad = 0;
      for (int q = 0; q < n; q++)
        for (size_t i = 0; i < count; i++)
          bad += get(t, b, (size_t)q * count + i) != (double)(q * 100000 + (int)(i % 99991));
      TU_CHECK(bad == 0, "in-place all_gather %s n=%d count=%zu: %ld wrong", dt_dtype_name(t), n,
               count, bad);

      /* all_to_all: block q of my input goes to rank q; value encodes (src, dst, i) */
      for (int q = 0; q < n; q++)
        for (size_t i = 0; i < count; i++)
          set(t, a, (size_t)q * count + i, (double)(me * 1000000 + q * 10000 + (int)(i % 9973)));
      TU_OK(ctx, D_all_to_all(ctx, c, a, b, count, t));
      check_ledger(ctx, c, DT_COLL_ALL_TO_ALL, count, t);
      bad = 0;
      for (int q = 0; q < n; q++)
        for (size_t i = 0; i < count; i++)
          bad += get(t, b, (size_t)q * count + i) != (double)(q * 1000000 + me * 10000 + (int)(i % 9973));
      TU_CHECK(bad == 0, "all_to_all %s n=%d count=%zu: %ld wrong", dt_dtype_name(t), n, count, bad);

      /* broadcast and scatter from every root */
      for (int root = 0; root < n; root++) {
        for (size_t i = 0; i < count; i++) set(t, a, i, me == root ? (double)(root * 7 + (int)(i % 1000)) : -1.0);
        TU_OK(ctx, D_broadcast(ctx, c, a, count, t, root));
        check_ledger(ctx, c, DT_COLL_BROADCAST, count, t);
        bad = 0;
        for (size_t i = 0; i < count; i++) bad += get(t, a, i) != (double)(root * 7 + (int)(i % 1000));
        TU_CHECK(bad == 0, "broadcast %s root %d n=%d count=%zu: %ld wrong", dt_dtype_name(t), root,
                 n, count, bad);
        if (me == root)
          for (size_t i = 0; i < total; i++) set(t, a, i, (double)(root * 1000 + (int)(i % 99991)));
        TU_OK(ctx, D_scatter(ctx, c, me == root ? a : NULL, b, count, t, root));
        check_ledger(ctx, c, DT_COLL_SCATTER, count, t);
        bad = 0;
        for (size_t i = 0; i < count; i++)
          bad += get(t, b, i) != (double)(root * 1000 + (int)(((size_t)me * count + i) % 99991));
        TU_CHECK(bad == 0, "scatter %s root %d n=%d count=%zu: %ld wrong", dt_dtype_name(t), root, n,
                 count, bad);
      }

      /* send/recv around a ring, both directions, two tags */
      if (n > 1) {
        int next = (me + 1) % n, prev = (me + n - 1) % n;
        for (size_t i = 0; i < count; i++) set(t, a, i, (double)(me * 10 + (int)(i % 1000)));
        TU_OK(ctx, D_send(ctx, c, a, count, t, next, 1));
        check_ledger(ctx, c, DT_COLL_SEND, count, t);
        TU_OK(ctx, D_send(ctx, c, a, count, t, prev, 2));
        TU_OK(ctx, D_recv(ctx, c, b, count, t, prev, 1));
        check_ledger(ctx, c, DT_COLL_RECV, count, t);
        bad = 0;
        for (size_t i = 0; i < count; i++) bad += get(t, b, i) != (double)(prev * 10 + (int)(i % 1000));
        TU_OK(ctx, D_recv(ctx, c, b, count, t, next, 2));
        for (size_t i = 0; i < count; i++) bad += get(t, b, i) != (double)(next * 10 + (int)(i % 1000));
        TU_CHECK(bad == 0, "send/recv %s n=%d count=%zu: %ld wrong", dt_dtype_name(t), n, count, bad);
      }
      dt_host_free(ctx, a);
      dt_host_free(ctx, b);
    }
  }
  TU_OK(ctx, dt_comm_barrier(c));
  check_ledger(ctx, c, DT_COLL_BARRIER, 0, DT_F32);
}

/* Random f32 sums: on threads, bitwise equal to the rank-order sum, on every
 * rank and on every repetition. On MPI the order is MPI's: a tolerance of
 * n ulps of the sum of magnitudes (each of n-1 additions rounds once). */
static void test_random_sum(dt_ctx *ctx, dt_comm *c, const targ *ta) {
  int n = c->size, me = c->rank;
  size_t count = 10007;
  float *x = xalloc(ctx, count * 4), *y = xalloc(ctx, count * 4), *z = xalloc(ctx, count * 4);
  TU_OK(ctx, dt_rng_fill(DT_F32, x, (int64_t)count, 11, (uint64_t)c->world_ranks[me], 0, 1,
                         DT_RNG_NORMAL, 0, 1));
  TU_OK(ctx, dt_comm_all_reduce(c, x, y, count, DT_F32, DT_RED_SUM));
  TU_OK(ctx, dt_comm_all_reduce(c, x, z, count, DT_F32, DT_RED_SUM));
  long bad = 0, rep = 0;
  float *v = malloc((size_t)n * sizeof(float));
  for (size_t i = 0; i < count && v; i++) {
    float acc = 0; double mag = 0;
    for (int r = 0; r < n; r++) {
      dt_rng_fill(DT_F32, &v[r], 1, 11, (uint64_t)c->world_ranks[r], i, 1, DT_RNG_NORMAL, 0, 1);
      acc = r == 0 ? v[r] : acc + v[r];
      mag += fabs((double)v[r]);
    }
    if (ta->threads) bad += memcmp(&acc, &y[i], 4) != 0;
    else bad += fabs((double)acc - (double)y[i]) > n * 0x1p-23 * mag;
    rep += memcmp(&y[i], &z[i], 4) != 0;
  }
  free(v);
  TU_CHECK(bad == 0, "random sum n=%d: %ld elements differ from the rank-order sum", n, bad);
  TU_CHECK(rep == 0, "random sum n=%d: %ld elements differ between two runs", n, rep);
  /* every rank holds the same bits */
  float *all = xalloc(ctx, count * 4 * (size_t)n);
  TU_OK(ctx, dt_comm_all_gather(c, y, all, count, DT_F32));
  long diff = 0;
  for (int r = 1; r < n; r++) diff += memcmp(all, all + (size_t)r * count, count * 4) != 0;
  TU_CHECK(diff == 0, "ranks disagree on the all_reduce result");
  dt_host_free(ctx, all);
  dt_host_free(ctx, x);
  dt_host_free(ctx, y);
  dt_host_free(ctx, z);
}

static void test_split(dt_ctx *ctx, dt_comm *c) {
  int n = c->size, me = c->rank;
  /* color = parity, key = -rank: members in descending parent rank */
  dt_comm *sub = NULL;
  TU_OK(ctx, dt_comm_split(c, me % 2, -me, "parity", &sub));
  if (!sub) { TU_CHECK(0, "split returned no comm"); return; }
  int members = (n + 1 - me % 2) / 2;
  TU_CHECK(sub->size == members, "split size %d want %d", sub->size, members);
  /* my position: members of my parity with larger parent rank come first */
  int pos = 0;
  for (int q = me + 2; q < n; q += 2) pos++;
  TU_CHECK(sub->rank == pos, "split rank %d want %d", sub->rank, pos);
  for (int i = 0; i < sub->size; i++) {
    int expect_parent = 0, k = 0;
    for (int q = n - 1; q >= 0; q--)
      if (q % 2 == me % 2) { if (k == i) expect_parent = q; k++; }
    TU_CHECK(sub->world_ranks[i] == c->world_ranks[expect_parent], "split world_ranks[%d]", i);
  }
  TU_CHECK(!strcmp(sub->name, "parity"), "split name '%s'", sub->name);
  double v = (double)c->world_ranks[me], sum = 0;
  TU_OK(ctx, dt_comm_all_reduce(sub, &v, &sum, 1, DT_F64, DT_RED_SUM));
  double want = 0;
  for (int q = me % 2; q < n; q += 2) want += c->world_ranks[q];
  TU_CHECK(sum == want, "sum over split group %g want %g", sum, want);
  TU_CHECK(!strcmp(dt_ledger_of(ctx)->rows[dt_ledger_of(ctx)->n - 1].group, "parity"), "ledger group name");
  /* a rank may opt out with a negative color */
  dt_comm *none = (dt_comm *)1;
  TU_OK(ctx, dt_comm_split(c, me == 0 ? -1 : 0, me, "rest", &none));
  TU_CHECK(me == 0 ? none == NULL : (none && none->size == n - 1), "split with color -1");
  dt_comm_destroy(none);
  dt_comm_destroy(sub);
}

static void test_errors(dt_ctx *ctx, dt_comm *c) {
  float x = 0;
  TU_CHECK(dt_comm_broadcast(c, &x, 1, DT_F32, c->size) == DT_ERR_INVALID, "bad root rejected");
  TU_CHECK(strstr(dt_last_error(ctx), "root") != NULL, "bad root message '%s'", dt_last_error(ctx));
  TU_CHECK(dt_comm_all_reduce(c, &x, &x, 1, DT_F32, (dt_reduce_op)9) == DT_ERR_INVALID,
           "bad op rejected");
  TU_CHECK(dt_comm_all_reduce(c, NULL, &x, 1, DT_F32, DT_RED_SUM) == DT_ERR_INVALID,
           "NULL buffer rejected");
}

static dt_status body(dt_ctx *ctx, void *arg) {
  const targ *ta = arg;
  dt_comm *c = ctx->world;
  dt_ctx_set_phase(ctx, "forward");
  test_errors(ctx, c);
  test_reductions(ctx, c);
  test_movement(ctx, c);
  test_random_sum(ctx, c, ta);
  test_split(ctx, c);
  /* world-wide agreement on failures so far, so that MPI ranks exit alike */
  return DT_OK;
}

static dt_status body_wide(dt_ctx *ctx, void *arg) {
  test_random_sum(ctx, ctx->world, arg);
  test_split(ctx, ctx->world);
  return DT_OK;
}

int main(int argc, char **argv) {
  tu_opts o;
  tu_parse(argc, argv, &o);
  dt_device_cpu_blas_threads(1);
  targ ta = {.threads = o.backend == DT_BACKEND_THREADS};
  dt_launch_opts lo = {.backend = o.backend, .timeout_s = 120};
  tu_launch_device(&lo);
  if (o.backend == DT_BACKEND_MPI) {
    dt_launch_report rep;
    dt_status s = dt_launch(&lo, body, &ta, &rep);
    if (s != DT_OK)
      tu_fail(__FILE__, __LINE__, "launch: rank %d: %s", rep.failed_rank, rep.failed_msg);
    dt_launch_report_free(&rep);
    int rc = tu_finish("test_comm (mpi)");
    dt_mpi_finish(s == DT_OK);
    return rc;
  }
  for (int w = 1; w <= 8; w++) {
    lo.world = w;
    dt_launch_report rep;
    double t0 = dt_now();
    dt_status s = dt_launch(&lo, body, &ta, &rep);
    if (s != DT_OK)
      tu_fail(__FILE__, __LINE__, "launch world %d: rank %d: %s", w, rep.failed_rank, rep.failed_msg);
    printf("world %d: %.2f s\n", w, dt_now() - t0);
    dt_launch_report_free(&rep);
  }
  /* 32 ranks on the machine's cores: blocking waits must not starve anyone. */
  lo.world = 32;
  dt_launch_report rep;
  double t0 = dt_now();
  if (dt_launch(&lo, body_wide, &ta, &rep) != DT_OK)
    tu_fail(__FILE__, __LINE__, "launch world 32: rank %d: %s", rep.failed_rank, rep.failed_msg);
  printf("world 32 (random sums, split): %.2f s\n", dt_now() - t0);
  dt_launch_report_free(&rep);
  return tu_finish("test_comm");
}
