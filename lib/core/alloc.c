/* lib/core/alloc.c: 64-byte aligned host allocation counted per rank (current
 * and peak bytes in ctx->mem). A 64-byte header in front of each block keeps
 * its size, so free needs no size from the caller. */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "core/core.h"

enum { DT_ALIGN = 64 }; /* a cache line; also the AVX-512 vector width */

typedef struct { size_t bytes, cap; uint64_t magic; } dt_alloc_hdr;
_Static_assert(sizeof(dt_alloc_hdr) <= DT_ALIGN, "header fits in the alignment pad");
#define DT_ALLOC_MAGIC 0x6474616c6c6f6321ull /* "dtalloc!" catches foreign frees */

/* Where the counters of space sp (0 host, 1 device) stand now, as a peak's record. */
static void snap(dt_ctx *ctx, int sp, size_t bytes) {
  dt_mem_peak_at *a = &ctx->mem.at[sp];
  a->bytes = bytes;
  memcpy(a->note, ctx->mem.note[sp], sizeof a->note);
  memcpy(a->phase, ctx->phase, sizeof a->phase);
  memcpy(a->where, ctx->scope, sizeof a->where);
}

static void track(dt_ctx *ctx, int sp, size_t bytes, bool add) {
  size_t *cur = sp ? &ctx->mem.dev_cur : &ctx->mem.host_cur;
  size_t *peak = sp ? &ctx->mem.dev_peak : &ctx->mem.host_peak;
  if (add) {
    *cur += bytes;
    if (*cur > *peak) {
      *peak = *cur;
      snap(ctx, sp, *cur);
    }
  } else {
    *cur = bytes > *cur ? 0 : *cur - bytes;
  }
}

void dt_mem_note(dt_ctx *ctx, bool device, int note, size_t bytes, bool add) {
  if (!ctx || note < 0 || note >= DT_MEM_NOTES) return;
  size_t *n = &ctx->mem.note[device ? 1 : 0][note];
  *n = add ? *n + bytes : bytes > *n ? 0 : *n - bytes;
}

void dt_mem_peak_get(const dt_ctx *ctx, bool device, dt_mem_peak_at *out) {
  *out = ctx->mem.at[device ? 1 : 0];
}

void dt_mem_peak_set(dt_ctx *ctx, bool device, const dt_mem_peak_at *p) {
  const int sp = device ? 1 : 0;
  *(sp ? &ctx->mem.dev_peak : &ctx->mem.host_peak) = p->bytes;
  ctx->mem.at[sp] = *p;
}

void dt_mem_peak_restart(dt_ctx *ctx, bool device) {
  const int sp = device ? 1 : 0;
  size_t *peak = sp ? &ctx->mem.dev_peak : &ctx->mem.host_peak;
  *peak = sp ? ctx->mem.dev_cur : ctx->mem.host_cur;
  if (sp) ctx->mem.dev_reserved_peak = ctx->mem.dev_reserved;
  snap(ctx, sp, *peak);
}

/* Blocks below this go straight back to malloc, which recycles them well; the
 * cache is for the large ones that glibc maps and unmaps each time. */
#define DT_CACHE_MIN ((size_t)64 << 10)

static void cache_remove(dt_mem_cache *c, int i) {
  memmove(&c->slot[i], &c->slot[i + 1], (size_t)(c->n - i - 1) * sizeof c->slot[0]);
  c->n--;
}

/* First slot whose cap is >= bytes (n when none). */
static int cache_lower_bound(const dt_mem_cache *c, size_t bytes) {
  int lo = 0, hi = c->n;
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    if (c->slot[mid].cap < bytes) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* The smallest cached block with room for `bytes` wasting at most half of it, or NULL. */
static dt_alloc_hdr *cache_take(dt_ctx *ctx, size_t bytes) {
  dt_mem_cache *c = &ctx->mem_cache;
  int i = cache_lower_bound(c, bytes);
  if (i == c->n || c->slot[i].cap / 2 > bytes) return NULL;
  dt_alloc_hdr *h = c->slot[i].blk;
  ctx->mem.host_cached -= c->slot[i].cap;
  cache_remove(c, i);
  return h;
}

/* Keeps a freed block for reuse, evicting the oldest ones while the slots or
 * the byte limit are full; false when it does not fit the cache at all. */
static bool cache_put(dt_ctx *ctx, dt_alloc_hdr *h) {
  dt_mem_cache *c = &ctx->mem_cache;
  if (h->cap < DT_CACHE_MIN || h->cap > c->limit) return false;
  while (c->n > 0 && (c->n == DT_MEM_CACHE_SLOTS || ctx->mem.host_cached + h->cap > c->limit)) {
    int old = 0;
    for (int i = 1; i < c->n; i++)
      if (c->slot[i].stamp < c->slot[old].stamp) old = i;
    free(c->slot[old].blk);
    ctx->mem.host_cached -= c->slot[old].cap;
    cache_remove(c, old);
  }
  int i = cache_lower_bound(c, h->cap);
  memmove(&c->slot[i + 1], &c->slot[i], (size_t)(c->n - i) * sizeof c->slot[0]);
  c->slot[i] = (dt_mem_slot){h, h->cap, ++c->tick};
  c->n++;
  ctx->mem.host_cached += h->cap;
  return true;
}

void dt_host_cache_release(dt_ctx *ctx) {
  if (!ctx) return;
  for (int i = 0; i < ctx->mem_cache.n; i++) free(ctx->mem_cache.slot[i].blk);
  ctx->mem_cache.n = 0;
  ctx->mem.host_cached = 0;
}

void *dt_host_alloc(dt_ctx *ctx, size_t bytes) {
  dt_alloc_hdr *hit = ctx && bytes >= DT_CACHE_MIN ? cache_take(ctx, bytes) : NULL;
  if (hit) {
    hit->bytes = bytes;
    hit->magic = DT_ALLOC_MAGIC;
    track(ctx, 0, bytes, true);
    ctx->mem.n_alloc++;
    return (char *)hit + DT_ALIGN;
  }
  if (bytes > SIZE_MAX - DT_ALIGN) {
    dt_error(ctx, DT_ERR_NOMEM, "dt_host_alloc", "request of %zu bytes overflows", bytes);
    return NULL;
  }
  void *p = NULL;
  if (posix_memalign(&p, DT_ALIGN, bytes + DT_ALIGN) != 0 || !p) {
    dt_error(ctx, DT_ERR_NOMEM, "dt_host_alloc", "cannot allocate %zu bytes", bytes);
    return NULL;
  }
  dt_alloc_hdr *h = p;
  h->bytes = bytes;
  h->cap = bytes;
  h->magic = DT_ALLOC_MAGIC;
  if (ctx) {
    track(ctx, 0, bytes, true);
    ctx->mem.n_alloc++;
  }
  return (char *)p + DT_ALIGN;
}

void *dt_host_calloc(dt_ctx *ctx, size_t bytes) {
  void *p = dt_host_alloc(ctx, bytes);
  if (p) memset(p, 0, bytes);
  return p;
}

void dt_host_free(dt_ctx *ctx, void *p) {
  if (!p) return;
  dt_alloc_hdr *h = (dt_alloc_hdr *)(void *)((char *)p - DT_ALIGN);
  if (h->magic != DT_ALLOC_MAGIC) abort(); /* not ours: a broken invariant */
  h->magic = 0;
  if (ctx) {
    track(ctx, 0, h->bytes, false);
    ctx->mem.n_free++;
    if (cache_put(ctx, h)) return;
  }
  free(h);
}

void dt_mem_track_reserved(dt_ctx *ctx, size_t bytes) {
  if (!ctx) return;
  ctx->mem.dev_reserved = bytes;
  if (bytes > ctx->mem.dev_reserved_peak) ctx->mem.dev_reserved_peak = bytes;
}

void dt_mem_track_device(dt_ctx *ctx, size_t bytes, bool add) {
  if (!ctx) return;
  track(ctx, 1, bytes, add);
  if (add) ctx->mem.n_alloc++;
  else ctx->mem.n_free++;
}
