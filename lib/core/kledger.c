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
static const dt_kledger no_kledger = {NULL, 0, 0, false, 0};

static void kledger_free(dt_ctx *ctx, void *data) {
  (void)ctx;
  dt_kledger *l = data;
  free(l->rows);
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
  if (l) l->n = 0, l->dropped_calls = 0;
}

static bool same(const dt_kledger_row *a, const dt_kledger_row *b) {
  return !strcmp(a->op, b->op) && !strcmp(a->phase, b->phase) && !strcmp(a->scope, b->scope) &&
         a->dtype == b->dtype && a->m == b->m && a->n == b->n && a->k == b->k &&
         a->batch == b->batch && a->flops == b->flops && a->bytes_read == b->bytes_read &&
         a->bytes_written == b->bytes_written;
}

void dt_kledger_add(dt_ctx *ctx, const dt_kledger_row *row) {
  dt_kledger *l = get(ctx);
  if (!l || !l->enabled || !row) return;
  dt_kledger_row r = *row;
  memcpy(r.phase, ctx->phase, sizeof r.phase);
  memcpy(r.scope, ctx->scope, sizeof r.scope);
  if (r.calls == 0) r.calls = 1;
  if (l->n > 0 && same(&l->rows[l->n - 1], &r)) {
    l->rows[l->n - 1].calls += r.calls;
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
