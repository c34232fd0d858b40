/* lib/core/status.c: status strings, the per-rank last error, context setup,
 * the extension slots and the monotonic clock. No global state: the error lives
 * in the dt_ctx. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"

const char *dt_status_str(dt_status s) {
  switch (s) {
    case DT_OK: return "ok";
    case DT_ERR_INVALID: return "invalid argument";
    case DT_ERR_NOMEM: return "out of memory";
    case DT_ERR_UNSUPPORTED: return "unsupported";
    case DT_ERR_BACKEND: return "backend error";
    case DT_ERR_ABORTED: return "aborted (another rank failed)";
    case DT_ERR_TIMEOUT: return "timed out";
    case DT_ERR_NODEVICE: return "no device";
    case DT_ERR_IO: return "i/o error";
    case DT_ERR_INTERNAL: return "internal error";
  }
  return "unknown status";
}

void dt_ctx_init(dt_ctx *ctx, int rank, int world_size) {
  memset(ctx, 0, sizeof *ctx);
  ctx->rank = rank;
  ctx->world_size = world_size;
  ctx->label_gen = 1; /* the ledgers' caches start at 0: none */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  ctx->mem_cache.limit = 0; /* reuse would hide use-after-free from the sanitizer */
#else
  ctx->mem_cache.limit = (size_t)256 << 20; /* per rank: 32 ranks keep at most 8 GiB */
#endif
}

void dt_ctx_release(dt_ctx *ctx) {
  /* Newest first: a later layer's state may refer to an earlier one's. */
  for (int i = DT_CTX_EXT_SLOTS - 1; i >= 0; i--)
    if (ctx->ext[i].key) dt_ctx_ext_drop(ctx, ctx->ext[i].key);
  dt_host_cache_release(ctx);
}

static int ext_find(const dt_ctx *ctx, const void *key) {
  for (int i = 0; key && i < DT_CTX_EXT_SLOTS; i++)
    if (ctx->ext[i].key == key) return i;
  return -1;
}

void *dt_ctx_ext_get(const dt_ctx *ctx, const void *key) {
  int i = ctx ? ext_find(ctx, key) : -1;
  return i < 0 ? NULL : ctx->ext[i].data;
}

dt_status dt_ctx_ext_set(dt_ctx *ctx, const void *key, void *data, dt_ctx_ext_free_fn free_fn) {
  if (!ctx || !key) return dt_error(ctx, DT_ERR_INVALID, "dt_ctx_ext_set", "NULL context or key");
  if (ext_find(ctx, key) >= 0)
    return dt_error(ctx, DT_ERR_INVALID, "dt_ctx_ext_set", "the key is already in use");
  /* The taken slots are always ext[0..n), oldest first (drop closes the gap),
   * so release, walking down from the top, runs newest first. */
  for (int i = 0; i < DT_CTX_EXT_SLOTS; i++) {
    if (ctx->ext[i].key) continue;
    ctx->ext[i] = (dt_ctx_ext){key, data, free_fn};
    return DT_OK;
  }
  return dt_error(ctx, DT_ERR_NOMEM, "dt_ctx_ext_set", "all %d extension slots are taken",
                  DT_CTX_EXT_SLOTS);
}

void dt_ctx_ext_drop(dt_ctx *ctx, const void *key) {
  int i = ctx ? ext_find(ctx, key) : -1;
  if (i < 0) return;
  dt_ctx_ext e = ctx->ext[i];
  /* Removed first, so free_fn sees the key gone. */
  memmove(&ctx->ext[i], &ctx->ext[i + 1], (size_t)(DT_CTX_EXT_SLOTS - 1 - i) * sizeof ctx->ext[0]);
  ctx->ext[DT_CTX_EXT_SLOTS - 1] = (dt_ctx_ext){NULL, NULL, NULL};
  if (e.free_fn) e.free_fn(ctx, e.data);
}

void dt_ctx_set_dev_mem(dt_ctx *ctx, const dt_dev_mem *m) {
  if (!ctx) return;
  if (m) ctx->dev_mem = *m;
  else memset(&ctx->dev_mem, 0, sizeof ctx->dev_mem);
}

dt_status dt_error(dt_ctx *ctx, dt_status s, const char *call, const char *fmt, ...) {
  if (!ctx) return s;
  ctx->last_status = s;
  int n = snprintf(ctx->last_error, sizeof ctx->last_error, "rank %d: %s: ", ctx->rank,
                   call ? call : "?");
  if (n < 0) n = 0;
  if ((size_t)n < sizeof ctx->last_error && fmt) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->last_error + n, sizeof ctx->last_error - (size_t)n, fmt, ap);
    va_end(ap);
  }
  return s;
}

const char *dt_last_error(const dt_ctx *ctx) { return ctx ? ctx->last_error : ""; }

void dt_error_clear(dt_ctx *ctx) {
  ctx->last_status = DT_OK;
  ctx->last_error[0] = '\0';
}

static void copy_label(char *dst, size_t n, const char *src) {
  if (!src) src = "";
  size_t l = strlen(src);
  if (l >= n) l = n - 1;
  memcpy(dst, src, l);
  memset(dst + l, 0, n - l); /* zero to the end: the ledgers compare and hash whole labels */
}

void dt_ctx_set_phase(dt_ctx *ctx, const char *phase) {
  copy_label(ctx->phase, sizeof ctx->phase, phase);
  ctx->label_gen++;
}

void dt_ctx_set_scope(dt_ctx *ctx, const char *scope) {
  if (!scope) scope = "";
  if (!strncmp(ctx->scope, scope, sizeof ctx->scope)) return; /* unchanged: the caches stay */
  copy_label(ctx->scope, sizeof ctx->scope, scope);
  ctx->label_gen++;
}

double dt_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
