/* lib/core/kledger.c: the per-rank compute ledger (core.h, dt_kledger_*): rows
 * of kernel work, hung on the context (dt_ctx_ext) like the comm ledger. The
 * recording sites are the device front (GEMM) and the ops' kernel calls; this
 * file only stores rows. Not a timer: no row has seconds. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

static const char kledger_key;
static const dt_kledger no_kledger = {NULL, 0, 0, false, 0, NULL, 0};

static void kledger_free(dt_ctx *ctx, void *data) {
  (void)ctx;
  dt_kledger *l = data;
  free(l->rows);
  free(l->index);
  free(l);
}

static dt_kledger *get(const dt_ctx *ctx) { return ctx ? dt_ctx_ext_get(ctx, &kledger_key) : NULL; }

const dt_kledger *dt_kledger_of(const dt_ctx *ctx) {
  const dt_kledger *l = get(ctx);
  return l ? l : &no_kledger;
}

dt_status dt_kledger_init(dt_ctx *ctx, bool enabled) {
  if (!ctx) return DT_ERR_INVALID;
  dt_kledger *l = get(ctx);
  if (!l) {
    l = calloc(1, sizeof *l);
    if (!l) return dt_error(ctx, DT_ERR_NOMEM, "dt_kledger_init", "no memory for the ledger");
    dt_status s = dt_ctx_ext_set(ctx, &kledger_key, l, kledger_free);
    if (s != DT_OK) {
      free(l);
      return s;
    }
  }
  l->enabled = enabled;
  return DT_OK;
}

void dt_kledger_clear(dt_ctx *ctx) {
  dt_kledger *l = get(ctx);
  if (l) {
    l->n = 0, l->dropped_calls = 0;
    if (l->index) memset(l->index, 0, l->index_cap * sizeof *l->index);
  }
}

static bool same(const dt_kledger_row *a, const dt_kledger_row *b) {
  return !strcmp(a->op, b->op) && !strcmp(a->phase, b->phase) && !strcmp(a->scope, b->scope) &&
         a->dtype == b->dtype && a->m == b->m && a->n == b->n && a->k == b->k &&
         a->batch == b->batch && a->flops == b->flops && a->bytes_read == b->bytes_read &&
         a->bytes_written == b->bytes_written;
}

/* FNV-1a over what `same` compares. */
static size_t row_hash(const dt_kledger_row *r) {
  uint64_t h = 1469598103934665603ull;
  const char *strs[3] = {r->op, r->phase, r->scope};
  for (int i = 0; i < 3; i++)
    for (const char *c = strs[i]; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
  uint64_t w[8];
  memcpy(&w[0], &r->flops, 8);
  w[1] = (uint64_t)r->m, w[2] = (uint64_t)r->n, w[3] = (uint64_t)r->k, w[4] = (uint64_t)r->batch;
  w[5] = r->bytes_read, w[6] = r->bytes_written, w[7] = (uint64_t)r->dtype;
  for (int i = 0; i < 8; i++) h = (h ^ w[i]) * 1099511628211ull, h ^= h >> 29;
  return (size_t)h;
}

/* Rebuilds the index at twice the capacity; false when out of memory. */
static bool grow_index(dt_kledger *l) {
  const size_t cap = l->index_cap ? 2 * l->index_cap : 1024;
  size_t *x = calloc(cap, sizeof *x);
  if (!x) return false;
  for (size_t i = 0; i < l->n; i++) {
    size_t h = row_hash(&l->rows[i]) & (cap - 1);
    while (x[h]) h = (h + 1) & (cap - 1);
    x[h] = i + 1;
  }
  free(l->index);
  l->index = x;
  l->index_cap = cap;
  return true;
}

void dt_kledger_add(dt_ctx *ctx, const dt_kledger_row *row) {
  dt_kledger *l = get(ctx);
  if (!l || !l->enabled || !row) return;
  dt_kledger_row r = *row;
  memcpy(r.phase, ctx->phase, sizeof r.phase);
  memcpy(r.scope, ctx->scope, sizeof r.scope);
  if (r.calls == 0) r.calls = 1;
  if (l->n > 0 && same(&l->rows[l->n - 1], &r)) { /* the common case: a run of calls */
    l->rows[l->n - 1].calls += r.calls;
    return;
  }
  if ((l->n + 1) * 2 > l->index_cap && !grow_index(l)) {
    l->dropped_calls += r.calls;
    return;
  }
  size_t h = row_hash(&r) & (l->index_cap - 1);
  for (; l->index[h]; h = (h + 1) & (l->index_cap - 1))
    if (same(&l->rows[l->index[h] - 1], &r)) {
      l->rows[l->index[h] - 1].calls += r.calls;
      return;
    }
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 256;
    dt_kledger_row *g = realloc(l->rows, cap * sizeof *g);
    if (!g) {
      l->dropped_calls += r.calls;
      return;
    }
    l->rows = g;
    l->cap = cap;
  }
  l->index[h] = l->n + 1;
  l->rows[l->n++] = r;
}

void dt_kledger_kernel(dt_ctx *ctx, const char *op, dt_dtype t, double flops, uint64_t bytes_read,
                       uint64_t bytes_written) {
  dt_kledger *l = get(ctx);
  if (!l || !l->enabled) return;
  dt_kledger_row r;
  memset(&r, 0, sizeof r);
  snprintf(r.op, sizeof r.op, "%s", op ? op : "?");
  r.dtype = (int)t;
  r.flops = flops;
  r.bytes_read = bytes_read;
  r.bytes_written = bytes_written;
  dt_kledger_add(ctx, &r);
}
