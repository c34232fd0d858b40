/* lib/core/alloc.c: 64-byte aligned host allocation counted per rank (current
 * and peak bytes in ctx->mem). A 64-byte header in front of each block keeps
 * its size, so free needs no size from the caller. */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "core/core.h"

enum { DT_ALIGN = 64 }; /* a cache line; also the AVX-512 vector width */

typedef struct { size_t bytes; uint64_t magic; } dt_alloc_hdr;
_Static_assert(sizeof(dt_alloc_hdr) <= DT_ALIGN, "header fits in the alignment pad");
#define DT_ALLOC_MAGIC 0x6474616c6c6f6321ull /* "dtalloc!" catches foreign frees */

static void track(size_t *cur, size_t *peak, size_t bytes, bool add) {
  if (add) {
    *cur += bytes;
    if (*cur > *peak) *peak = *cur;
  } else {
    *cur = bytes > *cur ? 0 : *cur - bytes;
  }
}

void *dt_host_alloc(dt_ctx *ctx, size_t bytes) {
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
  h->magic = DT_ALLOC_MAGIC;
  if (ctx) {
    track(&ctx->mem.host_cur, &ctx->mem.host_peak, bytes, true);
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
    track(&ctx->mem.host_cur, &ctx->mem.host_peak, h->bytes, false);
    ctx->mem.n_free++;
  }
  free(h);
}

void dt_mem_track_device(dt_ctx *ctx, size_t bytes, bool add) {
  if (!ctx) return;
  track(&ctx->mem.dev_cur, &ctx->mem.dev_peak, bytes, add);
  if (add) ctx->mem.n_alloc++;
  else ctx->mem.n_free++;
}
