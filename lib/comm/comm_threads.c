/* lib/comm/comm_threads.c: the threads comm backend, the embedded default.
 *
 * N ranks are N threads of one process. A group (one per communicator) is a
 * shared struct: a mutex + condvar barrier and one posted send/recv pointer per
 * member. A collective posts its buffers, meets the others at a barrier, then
 * every rank does its share of the work directly on the other ranks' buffers,
 * and a last barrier keeps the buffers alive until everyone has read them.
 *
 *   all_reduce      = each rank reduces its 1/n chunk of all inputs (in rank
 *                     order 0..n-1), then copies the other chunks from their
 *                     owners: 2(n-1)/n * S read across ranks, like a ring.
 *   reduce_scatter  = the first half of that; all_gather = the second.
 *
 * Every element is reduced once, by one rank, in rank order: results are
 * bitwise identical run to run and on every rank. A waiting rank polls for a
 * few microseconds only when every rank has a core of its own (job->spin);
 * otherwise, and after that, it blocks on the condvar, so 32 ranks share 2
 * cores without starving anyone.
 *
 * Failure: the job (dt_threads_job) holds a failed flag. When a rank fails
 * (launcher) or a wait passes the timeout (here), the flag is set and every
 * group's condvar is broadcast; waiters see it and return DT_ERR_ABORTED.
 *
 * Device buffers (a rank whose device is not the CPU; see dt_comm_mem): the
 * same schedule, with the copies as device-to-device copies and the reduction
 * as the device's reduce kernel, through the hook the launcher installed. A
 * rank syncs its device before each barrier, so a peer reads a buffer only
 * after the work that produced it has finished (ranks of one GPU run on
 * separate streams), and no buffer is released while a copy from it is queued.
 * Point to point on device buffers keeps the eager message in device memory
 * (the hook's scratch_alloc, freed by the receiver): a device-to-device copy
 * on each side and nothing through the host; without the scratch slots (or
 * with the test switch p2p_via_host) the message is staged in host memory and
 * dt_ledger.staged_bytes counts both copies.
 *
 * This is not a network transport: it only joins threads of one process.
 */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm_impl.h"

typedef struct tmsg {
  struct tmsg *next;
  int src, tag;
  size_t bytes;
  /* a device message: the payload in device scratch the sender allocated
   * (dt_comm_mem.scratch_alloc), freed by whoever drops the message with a
   * live rank's hook; else the payload is data */
  void *dpay;
  char data[];
} tmsg;

/* mem: a live rank's hook (the receiver's, or the last member's at the group's
 * end); NULL (the job's end, every device gone): a device payload is left to
 * the process's end. */
static void msg_free(tmsg *m, const dt_comm_mem *mem) {
  if (m->dpay && mem && mem->scratch_free) mem->scratch_free(mem->dev, m->dpay, m->bytes);
  free(m);
}

typedef struct tgroup {
  struct dt_threads_job *job;
  int size;
  int *world_ranks;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int arrived;          /* members at the current barrier */
  uint64_t gen;         /* barrier generation (under mu) */
  atomic_uint_fast64_t agen; /* copy of gen for spinning waiters */
  bool *here;           /* here[m]: member m waits at the current barrier */
  const void **sbuf;    /* posted send pointer per member */
  void **rbuf;          /* posted recv pointer per member */
  bool *ondev;          /* posted buffers are device memory, per member */
  int *colors, *keys;   /* split scratch */
  struct tgroup **newg; /* split result per member */
  tmsg **inbox;         /* point to point: queue per destination member */
  int refs;             /* dt_comm handles alive on it */
  struct tgroup *next;  /* job registry */
} tgroup;

struct dt_threads_job {
  int world;
  double timeout_s;
  pthread_mutex_t mu; /* guards the failure record and the registry */
  atomic_int failed;
  bool spin;          /* ranks <= online cpus: a waiter may spin briefly first */
  int fail_rank;
  dt_status fail_status;
  char fail_msg[DT_ERRMSG_LEN];
  tgroup *groups;
  tgroup *world_group;
};

/* Longest a waiter polls before it sleeps: about two futex round trips. */
#define SPIN_SECONDS 20e-6

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* Bytes of the reduction block kept on the stack: fits L1 with the inputs' lines. */
enum { RED_BLOCK_BYTES = 4096 };

static const dt_comm_ops threads_ops;

/* ---- groups ---- */

/* mem: see msg_free (messages never received). */
static void group_free(tgroup *g, const dt_comm_mem *mem) {
  for (int m = 0; m < g->size; m++) {
    tmsg *q = g->inbox[m];
    while (q) {
      tmsg *n = q->next;
      msg_free(q, mem);
      q = n;
    }
  }
  pthread_mutex_destroy(&g->mu);
  pthread_cond_destroy(&g->cv);
  free(g->world_ranks);
  free(g->here);
  free(g->sbuf);
  free(g->rbuf);
  free(g->ondev);
  free(g->colors);
  free(g->keys);
  free(g->newg);
  free(g->inbox);
  free(g);
}

static tgroup *group_new(dt_threads_job *job, int size, const int *world_ranks, int refs) {
  tgroup *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  g->job = job;
  g->size = size;
  size_t n = (size_t)size;
  g->world_ranks = malloc(n * sizeof(int));
  g->here = calloc(n, sizeof(bool));
  g->sbuf = calloc(n, sizeof(void *));
  g->rbuf = calloc(n, sizeof(void *));
  g->ondev = calloc(n, sizeof(bool));
  g->colors = calloc(n, sizeof(int));
  g->keys = calloc(n, sizeof(int));
  g->newg = calloc(n, sizeof(tgroup *));
  g->inbox = calloc(n, sizeof(tmsg *));
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  int e1 = pthread_mutex_init(&g->mu, NULL);
  int e2 = pthread_cond_init(&g->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (!g->world_ranks || !g->here || !g->sbuf || !g->rbuf || !g->ondev || !g->colors || !g->keys ||
      !g->newg || !g->inbox || e1 || e2) {
    if (!e1) pthread_mutex_destroy(&g->mu);
    if (!e2) pthread_cond_destroy(&g->cv);
    free(g->world_ranks); free(g->here); free(g->sbuf); free(g->rbuf); free(g->ondev);
    free(g->colors); free(g->keys); free(g->newg); free(g->inbox); free(g);
    return NULL;
  }
  memcpy(g->world_ranks, world_ranks, n * sizeof(int));
  g->refs = refs;
  atomic_init(&g->agen, 0);
  pthread_mutex_lock(&job->mu);
  g->next = job->groups;
  job->groups = g;
  pthread_mutex_unlock(&job->mu);
  return g;
}

/* Drops one reference; the last one unlinks and frees the group (mem: the
 * dropping rank's hook, or NULL; see msg_free). */
static void group_unref(tgroup *g, const dt_comm_mem *mem) {
  dt_threads_job *job = g->job;
  pthread_mutex_lock(&job->mu);
  bool last = --g->refs == 0;
  if (last) {
    for (tgroup **p = &job->groups; *p; p = &(*p)->next)
      if (*p == g) { *p = g->next; break; }
    if (job->world_group == g) job->world_group = NULL;
  }
  pthread_mutex_unlock(&job->mu);
  if (last) group_free(g, mem);
}

/* ---- the job ---- */

dt_status dt_threads_job_create(int world, double timeout_s, dt_threads_job **out) {
  *out = NULL;
  if (world < 1 || world > DT_THREADS_MAX_WORLD) return DT_ERR_INVALID;
  dt_threads_job *job = calloc(1, sizeof *job);
  if (!job) return DT_ERR_NOMEM;
  job->world = world;
  job->timeout_s = timeout_s > 0 ? timeout_s : 300.0;
  job->fail_rank = -1;
  atomic_init(&job->failed, 0);
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  job->spin = cpus > 0 && world <= cpus;
  if (pthread_mutex_init(&job->mu, NULL)) {
    free(job);
    return DT_ERR_NOMEM;
  }
  int *ranks = malloc((size_t)world * sizeof(int));
  if (!ranks) {
    pthread_mutex_destroy(&job->mu);
    free(job);
    return DT_ERR_NOMEM;
  }
  for (int i = 0; i < world; i++) ranks[i] = i;
  /* One reference for the job itself, dropped at destroy. */
  job->world_group = group_new(job, world, ranks, 1);
  free(ranks);
  if (!job->world_group) {
    pthread_mutex_destroy(&job->mu);
    free(job);
    return DT_ERR_NOMEM;
  }
  *out = job;
  return DT_OK;
}

void dt_threads_job_destroy(dt_threads_job *job) {
  if (!job) return;
  if (job->world_group) group_unref(job->world_group, NULL);
  /* Groups still referenced belong to comms their owners did not destroy
   * (e.g. after an abort): free them now, no thread uses them any more. */
  tgroup *g = job->groups;
  while (g) {
    tgroup *n = g->next;
    group_free(g, NULL);
    g = n;
  }
  pthread_mutex_destroy(&job->mu);
  free(job);
}

void dt_threads_job_fail(dt_threads_job *job, int rank, dt_status s, const char *msg) {
  pthread_mutex_lock(&job->mu);
  if (!atomic_load(&job->failed)) {
    job->fail_rank = rank;
    job->fail_status = s;
    snprintf(job->fail_msg, sizeof job->fail_msg, "%s", msg ? msg : "");
    atomic_store(&job->failed, 1);
  }
  /* Wake every waiter of every group: they re-check the flag. Lock order is
   * job->mu then g->mu; waiters never take job->mu while holding g->mu. */
  for (tgroup *g = job->groups; g; g = g->next) {
    pthread_mutex_lock(&g->mu);
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
  }
  pthread_mutex_unlock(&job->mu);
}

bool dt_threads_job_failed(dt_threads_job *job, int *rank, dt_status *s, char *msg, size_t n) {
  if (!atomic_load(&job->failed)) return false;
  pthread_mutex_lock(&job->mu);
  if (rank) *rank = job->fail_rank;
  if (s) *s = job->fail_status;
  if (msg && n) snprintf(msg, n, "%s", job->fail_msg);
  pthread_mutex_unlock(&job->mu);
  return true;
}

static dt_status aborted(dt_comm *c, const char *what) {
  dt_threads_job *job = ((tgroup *)c->impl)->job;
  int r = -1;
  char msg[DT_ERRMSG_LEN];
  msg[0] = '\0';
  dt_threads_job_failed(job, &r, NULL, msg, sizeof msg);
  return dt_error(c->ctx, DT_ERR_ABORTED, what, "group '%s': job aborted by rank %d: %s", c->name,
                  r, msg);
}

static struct timespec deadline_after(double s) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  double whole = (double)(time_t)s;
  ts.tv_sec += (time_t)s;
  ts.tv_nsec += (long)((s - whole) * 1e9);
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  return ts;
}

/* Called with g->mu held when a wait timed out; releases it, fails the job. */
static dt_status timed_out(dt_comm *c, tgroup *g, const char *what, bool list_missing) {
  char missing[256];
  size_t off = 0;
  missing[0] = '\0';
  if (list_missing) {
    for (int m = 0; m < g->size && off + 16 < sizeof missing; m++)
      if (!g->here[m])
        off += (size_t)snprintf(missing + off, sizeof missing - off, "%s%d", off ? "," : "",
                                g->world_ranks[m]);
  }
  pthread_mutex_unlock(&g->mu);
  dt_status s = dt_error(c->ctx, DT_ERR_TIMEOUT, what,
                         "group '%s' (%d ranks) waited %.3g s%s%s%s", c->name, g->size,
                         g->job->timeout_s, list_missing ? " for ranks [" : "",
                         list_missing ? missing : "", list_missing ? "]" : "");
  dt_threads_job_fail(g->job, c->ctx->rank, s, c->ctx->last_error);
  return s;
}

/* The barrier every collective is built from. */
static dt_status tbarrier(dt_comm *c, const char *what) {
  tgroup *g = c->impl;
  if (g->size == 1) return atomic_load(&g->job->failed) ? aborted(c, what) : DT_OK;
  pthread_mutex_lock(&g->mu);
  if (atomic_load(&g->job->failed)) {
    pthread_mutex_unlock(&g->mu);
    return aborted(c, what);
  }
  uint64_t gen = g->gen;
  if (++g->arrived == g->size) {
    g->arrived = 0;
    g->gen++;
    atomic_store_explicit(&g->agen, g->gen, memory_order_release);
    memset(g->here, 0, (size_t)g->size * sizeof(bool));
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    return DT_OK;
  }
  g->here[c->rank] = true;
  if (g->job->spin) {
    /* Every rank has a core of its own: wait up to SPIN_SECONDS polling before
     * sleeping, which saves a futex wake-up per barrier. With more ranks than
     * cores this is off, so a waiter never takes a core a working rank needs. */
    pthread_mutex_unlock(&g->mu);
    double t0 = dt_now();
    for (unsigned i = 1;; i++) {
      if (atomic_load_explicit(&g->agen, memory_order_acquire) != gen) return DT_OK;
      if (atomic_load(&g->job->failed)) break;
      if ((i & 63) == 0 && dt_now() - t0 > SPIN_SECONDS) break;
      cpu_relax();
    }
    pthread_mutex_lock(&g->mu);
  }
  struct timespec dl = deadline_after(g->job->timeout_s);
  while (g->gen == gen) {
    if (atomic_load(&g->job->failed)) {
      pthread_mutex_unlock(&g->mu);
      return aborted(c, what);
    }
    int rc = pthread_cond_timedwait(&g->cv, &g->mu, &dl);
    if (rc == ETIMEDOUT && g->gen == gen && !atomic_load(&g->job->failed))
      return timed_out(c, g, what, true);
  }
  pthread_mutex_unlock(&g->mu);
  return DT_OK;
}

/* Posts this rank's buffers and waits for every member's. */
static dt_status post(dt_comm *c, const void *send, void *recv, const char *what) {
  tgroup *g = c->impl;
  g->sbuf[c->rank] = send; /* read by others only after the barrier (mutex order) */
  g->rbuf[c->rank] = recv;
  return tbarrier(c, what);
}

/* ---- device buffers ---- */

/* True when this call's buffers are device memory (the front has checked that
 * they are not mixed). */
static bool on_dev(dt_comm *c, const void *a, const void *b) {
  return dt_comm_is_device(c, a) || dt_comm_is_device(c, b);
}

static dt_status dsync(dt_comm *c) { return c->mem.sync ? c->mem.sync(c->mem.dev) : DT_OK; }

/* The device's queued work, then the barrier. */
static dt_status dbarrier(dt_comm *c, bool dev, const char *what) {
  if (dev) DT_CHECK(dsync(c));
  return tbarrier(c, what);
}

static dt_status dcopy(dt_comm *c, bool dev, void *dst, const void *src, size_t bytes) {
  if (!bytes) return DT_OK;
  if (!dev) {
    memcpy(dst, src, bytes);
    return DT_OK;
  }
  return c->mem.copy(c->mem.dev, dst, src, bytes, DT_COMM_D2D);
}

/* Posts this rank's buffers, and where they live, and waits for every member's;
 * a group whose members disagree (host on one, device on another) fails on
 * every member alike. */
static dt_status dpost(dt_comm *c, bool dev, const void *send, void *recv, const char *what) {
  tgroup *g = c->impl;
  g->ondev[c->rank] = dev;
  if (dev) DT_CHECK(dsync(c));
  DT_CHECK(post(c, send, recv, what));
  for (int m = 0; m < g->size; m++)
    if (g->ondev[m] != dev)
      return dt_error(c->ctx, DT_ERR_INVALID, what,
                      "group '%s': rank %d passed %s buffers, rank %d %s buffers", c->name,
                      g->world_ranks[c->rank], dev ? "device" : "host", g->world_ranks[m],
                      g->ondev[m] ? "device" : "host");
  return DT_OK;
}

/* dst = reduce over members of sbuf[m] + off (len elements) on the device. */
static dt_status dreduce(dt_comm *c, dt_dtype t, dt_reduce_op op, void *dst, size_t off,
                         size_t len) {
  tgroup *g = c->impl;
  if (!len) return DT_OK;
  size_t es = dt_dtype_size(t);
  const void **in = malloc((size_t)g->size * sizeof *in);
  if (!in) return dt_error(c->ctx, DT_ERR_NOMEM, "reduce", "no memory");
  for (int m = 0; m < g->size; m++) in[m] = (const char *)g->sbuf[m] + off * es;
  dt_status s = c->mem.reduce(c->mem.dev, t, op, len, g->size, in, dst,
                              op == DT_RED_AVG ? (double)g->size : 0.0);
  free(in);
  return s;
}

/* Balanced split of count elements into n chunks: chunk i = [lo, hi). */
static void chunk(size_t count, int n, int i, size_t *lo, size_t *hi) {
  size_t q = count / (size_t)n, r = count % (size_t)n, ui = (size_t)i;
  *lo = ui * q + (ui < r ? ui : r);
  *hi = *lo + q + (ui < r ? 1 : 0);
}

/* dst[0..len) = reduce over members m = 0..n-1 of src_m[off..off+len), in order.
 * bf16 is accumulated in f32 and rounded once at the end. */
static void reduce_range(tgroup *g, dt_dtype t, dt_reduce_op op, void *dst, size_t off,
                         size_t len) {
  size_t es = dt_dtype_size(t);
  _Alignas(64) unsigned char tmp[RED_BLOCK_BYTES];
  if (t == DT_BF16) {
    _Alignas(64) float acc[RED_BLOCK_BYTES / 4 / 2], in[RED_BLOCK_BYTES / 4 / 2];
    size_t block = sizeof acc / sizeof acc[0];
    for (size_t b = 0; b < len; b += block) {
      size_t nb = len - b < block ? len - b : block;
      for (int m = 0; m < g->size; m++) {
        const dt_bf16 *src = (const dt_bf16 *)g->sbuf[m] + off + b;
        float *to = m == 0 ? acc : in;
        for (size_t i = 0; i < nb; i++) to[i] = dt_bf16_to_f32(src[i]);
        if (m > 0) dt_reduce_into(DT_F32, op, acc, in, nb);
      }
      if (op == DT_RED_AVG) dt_div_inplace(DT_F32, acc, nb, (double)g->size);
      dt_bf16 *out = (dt_bf16 *)dst + b;
      for (size_t i = 0; i < nb; i++) out[i] = dt_f32_to_bf16(acc[i]);
    }
    (void)tmp;
    return;
  }
  size_t block = RED_BLOCK_BYTES / es;
  for (size_t b = 0; b < len; b += block) {
    size_t nb = len - b < block ? len - b : block;
    memcpy(tmp, (const char *)g->sbuf[0] + (off + b) * es, nb * es);
    for (int m = 1; m < g->size; m++)
      dt_reduce_into(t, op, tmp, (const char *)g->sbuf[m] + (off + b) * es, nb);
    if (op == DT_RED_AVG) dt_div_inplace(t, tmp, nb, (double)g->size);
    memcpy((char *)dst + b * es, tmp, nb * es);
  }
}

static dt_status th_all_reduce(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t,
                               dt_reduce_op op) {
  tgroup *g = c->impl;
  size_t es = dt_dtype_size(t);
  bool dev = on_dev(c, send, recv);
  if (g->size == 1) {
    if (send != recv) DT_CHECK(dcopy(c, dev, recv, send, count * es));
    return dbarrier(c, dev, "all_reduce");
  }
  DT_CHECK(dpost(c, dev, send, recv, "all_reduce"));
  size_t lo, hi;
  chunk(count, g->size, c->rank, &lo, &hi);
  /* My chunk of every input is read only by me, so writing it in place is safe. */
  if (dev) DT_CHECK(dreduce(c, t, op, (char *)recv + lo * es, lo, hi - lo));
  else reduce_range(g, t, op, (char *)recv + lo * es, lo, hi - lo);
  DT_CHECK(dbarrier(c, dev, "all_reduce"));
  for (int q = 0; q < g->size; q++) {
    if (q == c->rank) continue;
    size_t qlo, qhi;
    chunk(count, g->size, q, &qlo, &qhi);
    DT_CHECK(dcopy(c, dev, (char *)recv + qlo * es, (const char *)g->rbuf[q] + qlo * es,
                   (qhi - qlo) * es));
  }
  return dbarrier(c, dev, "all_reduce");
}

static dt_status th_reduce_scatter(dt_comm *c, const void *send, void *recv, size_t count,
                                   dt_dtype t, dt_reduce_op op) {
  tgroup *g = c->impl;
  bool dev = on_dev(c, send, recv);
  DT_CHECK(dpost(c, dev, send, recv, "reduce_scatter"));
  if (dev) DT_CHECK(dreduce(c, t, op, recv, (size_t)c->rank * count, count));
  else reduce_range(g, t, op, recv, (size_t)c->rank * count, count);
  return dbarrier(c, dev, "reduce_scatter");
}

static dt_status th_all_gather(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t) {
  tgroup *g = c->impl;
  size_t bytes = count * dt_dtype_size(t);
  bool dev = on_dev(c, send, recv);
  DT_CHECK(dpost(c, dev, send, recv, "all_gather"));
  for (int q = 0; q < g->size; q++) {
    char *dst = (char *)recv + (size_t)q * bytes;
    if (dst != g->sbuf[q]) DT_CHECK(dcopy(c, dev, dst, g->sbuf[q], bytes));
  }
  return dbarrier(c, dev, "all_gather");
}

static dt_status th_all_to_all(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t) {
  tgroup *g = c->impl;
  size_t bytes = count * dt_dtype_size(t);
  bool dev = on_dev(c, send, recv);
  DT_CHECK(dpost(c, dev, send, recv, "all_to_all"));
  for (int q = 0; q < g->size; q++)
    DT_CHECK(dcopy(c, dev, (char *)recv + (size_t)q * bytes,
                   (const char *)g->sbuf[q] + (size_t)c->rank * bytes, bytes));
  return dbarrier(c, dev, "all_to_all");
}

static dt_status th_broadcast(dt_comm *c, void *buf, size_t count, dt_dtype t, int root) {
  tgroup *g = c->impl;
  bool dev = on_dev(c, buf, buf);
  DT_CHECK(dpost(c, dev, buf, buf, "broadcast"));
  if (c->rank != root) DT_CHECK(dcopy(c, dev, buf, g->sbuf[root], count * dt_dtype_size(t)));
  return dbarrier(c, dev, "broadcast");
}

static dt_status th_scatter(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t,
                            int root) {
  tgroup *g = c->impl;
  size_t bytes = count * dt_dtype_size(t);
  bool dev = on_dev(c, c->rank == root ? send : NULL, recv);
  DT_CHECK(dpost(c, dev, send, recv, "scatter"));
  const char *src = (const char *)g->sbuf[root] + (size_t)c->rank * bytes;
  if (src != recv) DT_CHECK(dcopy(c, dev, recv, src, bytes));
  return dbarrier(c, dev, "scatter");
}

static dt_status th_barrier(dt_comm *c) { return tbarrier(c, "barrier"); }

/* Point to point is eager: send copies into the receiver's inbox and returns, so
 * two ranks that send to each other first cannot deadlock. A recv takes the
 * oldest message from `peer` with `tag`. */
static dt_status th_send(dt_comm *c, const void *buf, size_t count, dt_dtype t, int peer, int tag) {
  tgroup *g = c->impl;
  size_t bytes = count * dt_dtype_size(t);
  if (atomic_load(&g->job->failed)) return aborted(c, "send");
  const bool dev = bytes && on_dev(c, buf, buf);
  const bool d2d = dev && c->mem.scratch_alloc && c->mem.scratch_free && !c->mem.p2p_via_host;
  tmsg *m = malloc(sizeof *m + (d2d ? 0 : bytes));
  if (!m) return dt_error(c->ctx, DT_ERR_NOMEM, "send", "cannot buffer %zu bytes", bytes);
  m->next = NULL;
  m->src = c->rank;
  m->tag = tag;
  m->bytes = bytes;
  m->dpay = NULL;
  if (dev) {
    /* the work that wrote buf is done before the copy; the copy is done before
     * the message is posted (the receiver's stream is another) */
    dt_status s = dsync(c);
    if (s == DT_OK && d2d) {
      s = c->mem.scratch_alloc(c->mem.dev, bytes, &m->dpay);
      if (s == DT_OK) s = c->mem.copy(c->mem.dev, m->dpay, buf, bytes, DT_COMM_D2D);
      if (s == DT_OK) s = dsync(c);
    } else if (s == DT_OK) {
      dt_ledger_add_staged(c->ctx, bytes);
      s = c->mem.copy(c->mem.dev, m->data, buf, bytes, DT_COMM_D2H);
    }
    if (s != DT_OK) {
      msg_free(m, &c->mem);
      return s;
    }
  } else if (bytes) {
    memcpy(m->data, buf, bytes);
  }
  pthread_mutex_lock(&g->mu);
  tmsg **p = &g->inbox[peer];
  while (*p) p = &(*p)->next;
  *p = m;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
  return DT_OK;
}

static dt_status th_recv(dt_comm *c, void *buf, size_t count, dt_dtype t, int peer, int tag) {
  tgroup *g = c->impl;
  size_t bytes = count * dt_dtype_size(t);
  struct timespec dl = deadline_after(g->job->timeout_s);
  pthread_mutex_lock(&g->mu);
  for (;;) {
    if (atomic_load(&g->job->failed)) {
      pthread_mutex_unlock(&g->mu);
      return aborted(c, "recv");
    }
    for (tmsg **p = &g->inbox[c->rank]; *p; p = &(*p)->next) {
      tmsg *m = *p;
      if (m->src != peer || m->tag != tag) continue;
      *p = m->next;
      pthread_mutex_unlock(&g->mu);
      dt_status s = DT_OK;
      const bool dev = bytes && on_dev(c, buf, buf);
      if (m->bytes != bytes) {
        s = dt_error(c->ctx, DT_ERR_INVALID, "recv",
                     "message from rank %d tag %d has %zu bytes, expected %zu", peer, tag,
                     m->bytes, bytes);
      } else if (m->dpay && !c->mem.copy) {
        s = dt_error(c->ctx, DT_ERR_INVALID, "recv",
                     "a device message from rank %d on a rank without a device", peer);
      } else if (m->dpay) {
        /* device to device, done before the message's memory goes */
        if (!dev) dt_ledger_add_staged(c->ctx, bytes);
        s = c->mem.copy(c->mem.dev, buf, m->dpay, bytes, dev ? DT_COMM_D2D : DT_COMM_D2H);
        if (s == DT_OK && dev) s = dsync(c);
      } else if (dev) {
        dt_ledger_add_staged(c->ctx, bytes);
        s = c->mem.copy(c->mem.dev, buf, m->data, bytes, DT_COMM_H2D);
      } else if (bytes) {
        memcpy(buf, m->data, bytes);
      }
      msg_free(m, &c->mem);
      return s;
    }
    int rc = pthread_cond_timedwait(&g->cv, &g->mu, &dl);
    if (rc == ETIMEDOUT && !atomic_load(&g->job->failed)) {
      char what[64];
      snprintf(what, sizeof what, "recv from %d tag %d", peer, tag);
      return timed_out(c, g, what, false);
    }
  }
}

static dt_status make_comm(dt_ctx *ctx, tgroup *g, int rank, const char *name, dt_comm **out) {
  dt_comm *c = calloc(1, sizeof *c);
  if (!c) return dt_error(ctx, DT_ERR_NOMEM, "split", "no memory");
  dt_status s = dt_comm_init_base(c, &threads_ops, ctx, name, rank, g->size, g->world_ranks);
  if (s != DT_OK) {
    free(c);
    return s;
  }
  c->impl = g;
  *out = c;
  return DT_OK;
}

static int cmp_key(const void *a, const void *b) {
  const int *x = a, *y = b; /* (key, parent rank) pairs */
  if (x[0] != y[0]) return x[0] < y[0] ? -1 : 1;
  return x[1] < y[1] ? -1 : x[1] > y[1];
}

static dt_status th_split(dt_comm *c, int color, int key, dt_comm **out) {
  tgroup *g = c->impl;
  int me = c->rank, n = g->size;
  *out = NULL;
  g->colors[me] = color;
  g->keys[me] = key;
  DT_CHECK(tbarrier(c, "split"));
  /* The lowest parent rank of each color builds that color's group. */
  bool leader = color >= 0;
  for (int q = 0; q < me && leader; q++)
    if (g->colors[q] == color) leader = false;
  dt_status s = DT_OK;
  if (leader) {
    int cnt = 0;
    for (int q = 0; q < n; q++) cnt += g->colors[q] == color;
    int *pairs = malloc((size_t)cnt * 2 * sizeof(int));
    int *wr = malloc((size_t)cnt * sizeof(int));
    tgroup *ng = NULL;
    if (pairs && wr) {
      int k = 0;
      for (int q = 0; q < n; q++)
        if (g->colors[q] == color) { pairs[2 * k] = g->keys[q]; pairs[2 * k + 1] = q; k++; }
      qsort(pairs, (size_t)cnt, 2 * sizeof(int), cmp_key);
      for (int i = 0; i < cnt; i++) wr[i] = g->world_ranks[pairs[2 * i + 1]];
      ng = group_new(g->job, cnt, wr, cnt);
    }
    /* On failure every member of this color sees NULL and reports it. */
    for (int q = 0; q < n; q++)
      if (g->colors[q] == color) g->newg[q] = ng;
    free(pairs);
    free(wr);
  }
  DT_CHECK(tbarrier(c, "split"));
  if (color >= 0) {
    tgroup *ng = g->newg[me];
    if (!ng) {
      s = dt_error(c->ctx, DT_ERR_NOMEM, "split", "cannot create the group for color %d", color);
    } else {
      int r = 0;
      for (int i = 0; i < ng->size; i++)
        if (ng->world_ranks[i] == g->world_ranks[me]) r = i;
      s = make_comm(c->ctx, ng, r, NULL, out);
      if (s != DT_OK) group_unref(ng, &c->mem);
    }
  }
  /* Keep newg[] stable until every member has read its entry. */
  dt_status s2 = tbarrier(c, "split");
  if (s == DT_OK && s2 != DT_OK) {
    dt_comm_destroy(*out);
    *out = NULL;
    s = s2;
  }
  return s;
}

static void th_destroy(dt_comm *c) {
  if (!c) return;
  tgroup *g = c->impl;
  const dt_comm_mem mem = c->mem; /* this rank's device outlives its comms */
  dt_comm_free_base(c);
  free(c);
  if (g) group_unref(g, &mem);
}

static const dt_comm_ops threads_ops = {
    .name = "threads",
    .device_buffers = true,
    .all_reduce = th_all_reduce,
    .all_gather = th_all_gather,
    .reduce_scatter = th_reduce_scatter,
    .all_to_all = th_all_to_all,
    .broadcast = th_broadcast,
    .scatter = th_scatter,
    .send = th_send,
    .recv = th_recv,
    .barrier = th_barrier,
    .split = th_split,
    .destroy = th_destroy,
};

dt_status dt_threads_comm_world(dt_threads_job *job, dt_ctx *ctx, dt_comm **out) {
  tgroup *g = job->world_group;
  pthread_mutex_lock(&job->mu);
  g->refs++;
  pthread_mutex_unlock(&job->mu);
  dt_status s = make_comm(ctx, g, ctx->rank, "world", out);
  if (s != DT_OK) group_unref(g, NULL);
  return s;
}
