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
static const dt_kledger no_kledger = {0};

static void kledger_free(dt_ctx *ctx, void *data) {
  (void)ctx;
  dt_kledger *l = data;
  free(l->rows);
  free(l->index);
  free(l->hash);
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

/* Whether row a is the call r (op zero past its NUL) made under ctx's labels
 * (zero past theirs, as every stored row's): all but calls. The numbers first
 * (they differ most often). */
static bool same(const dt_kledger_row *a, const dt_kledger_row *r, const char *op,
                 const dt_ctx *ctx) {
  return a->dtype == r->dtype && a->m == r->m && a->n == r->n && a->k == r->k &&
         a->batch == r->batch && a->flops == r->flops && a->bytes_read == r->bytes_read &&
         a->bytes_written == r->bytes_written && !memcmp(a->op, op, sizeof a->op) &&
         !memcmp(a->phase, ctx->phase, sizeof a->phase) &&
         !memcmp(a->scope, ctx->scope, sizeof a->scope);
}

/* A multiply-xorshift mix (the finaliser of MurmurHash3's 64-bit variant). */
static uint64_t mix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  return h ^ (h >> 33);
}

/* A hash of n words: each word times its own odd constant, summed (independent
 * products), then mixed. For the index only: `same` decides equality. */
static uint64_t words_hash(uint64_t seed, const uint64_t *w, int n) {
  static const uint64_t K[11] = {
      0x9e3779b97f4a7c15ull, 0xbf58476d1ce4e5b9ull, 0x94d049bb133111ebull, 0xd6e8feb86659fd93ull,
      0xa0761d6478bd642full, 0xe7037ed1a0b428dbull, 0x8ebc6af09c88c6e3ull, 0x589965cc75374cc3ull,
      0x1d8e4e27c47d124full, 0xc2b2ae3d27d4eb4full, 0x165667b19e3779f9ull};
  uint64_t h = seed;
  for (int i = 0; i < n; i++) h += (w[i] ^ (w[i] >> 31)) * K[i % 11];
  return mix(h);
}

/* Over what `same` compares: op (24 bytes, zero past its NUL), the numbers and
 * label, the hash of the phase and scope. */
static uint64_t row_hash(const dt_kledger_row *r, const char *op, uint64_t label) {
  uint64_t w[11];
  memcpy(&w[0], op, 24); /* 3 words */
  memcpy(&w[3], &r->flops, 8);
  w[4] = (uint64_t)r->m, w[5] = (uint64_t)r->n, w[6] = (uint64_t)r->k, w[7] = (uint64_t)r->batch;
  w[8] = r->bytes_read, w[9] = r->bytes_written, w[10] = (uint64_t)r->dtype;
  return words_hash(label, w, 11);
}

_Static_assert(sizeof(((dt_ctx *)0)->phase) == 16 && sizeof(((dt_ctx *)0)->scope) == 64 &&
                   sizeof(((dt_kledger_row *)0)->op) == 24,
               "label_hash and row_hash read these sizes");
static uint64_t label_hash(const char *phase, const char *scope) {
  uint64_t w[10];
  memcpy(&w[0], phase, 16);
  memcpy(&w[2], scope, 64);
  return words_hash(0x243f6a8885a308d3ull, w, 10);
}

/* Rebuilds the index at twice the capacity; false when out of memory. */
static bool grow_index(dt_kledger *l) {
  const size_t cap = l->index_cap ? 2 * l->index_cap : 1024;
  size_t *x = calloc(cap, sizeof *x);
  uint64_t *hs = realloc(l->hash, cap / 2 * sizeof *hs); /* n < cap / 2 rows */
  if (!x || !hs) {
    free(x);
    if (hs) l->hash = hs;
    return false;
  }
  l->hash = hs;
  for (size_t i = 0; i < l->n; i++) {
    size_t h = (size_t)hs[i] & (cap - 1);
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
  char op[sizeof row->op] = {0}; /* the op zero past its NUL: `same` and the hash read it all */
  memcpy(op, row->op, strnlen(row->op, sizeof op - 1));
  const uint64_t calls = (row->calls ? row->calls : 1) * (l->repeat ? l->repeat : 1);
  if (l->label_gen != ctx->label_gen) { /* the labels changed since the last row */
    l->label_gen = ctx->label_gen;
    l->label_hash = label_hash(ctx->phase, ctx->scope);
  }
  const uint64_t hv = row_hash(row, op, l->label_hash);
  /* the common case: a run of calls */
  if (l->n > 0 && l->hash[l->n - 1] == hv && same(&l->rows[l->n - 1], row, op, ctx)) {
    l->rows[l->n - 1].calls += calls;
    return;
  }
  if ((l->n + 1) * 2 > l->index_cap && !grow_index(l)) {
    l->dropped_calls += calls;
    return;
  }
  size_t h = (size_t)hv & (l->index_cap - 1);
  for (; l->index[h]; h = (h + 1) & (l->index_cap - 1)) {
    const size_t i = l->index[h] - 1;
    if (l->hash[i] == hv && same(&l->rows[i], row, op, ctx)) {
      l->rows[i].calls += calls;
      return;
    }
  }
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 256;
    dt_kledger_row *g = realloc(l->rows, cap * sizeof *g);
    if (!g) {
      l->dropped_calls += calls;
      return;
    }
    l->rows = g;
    l->cap = cap;
  }
  dt_kledger_row *r = &l->rows[l->n];
  *r = *row;
  memcpy(r->op, op, sizeof r->op);
  memcpy(r->phase, ctx->phase, sizeof r->phase);
  memcpy(r->scope, ctx->scope, sizeof r->scope);
  r->calls = calls;
  l->index[h] = l->n + 1;
  l->hash[l->n++] = hv;
}

uint64_t dt_kledger_set_repeat(dt_ctx *ctx, uint64_t r) {
  dt_kledger *l = get(ctx);
  if (!l) return 1;
  const uint64_t prev = l->repeat ? l->repeat : 1;
  l->repeat = r ? r : 1;
  return prev;
}

void dt_kledger_kernel(dt_ctx *ctx, const char *op, dt_dtype t, double flops, uint64_t bytes_read,
                       uint64_t bytes_written) {
  dt_kledger *l = get(ctx);
  if (!l || !l->enabled) return;
  dt_kledger_row r;
  memset(&r, 0, sizeof r);
  if (!op) op = "?";
  memcpy(r.op, op, strnlen(op, sizeof r.op - 1)); /* r is zeroed: NUL-terminated */
  r.dtype = (int)t;
  r.flops = flops;
  r.bytes_read = bytes_read;
  r.bytes_written = bytes_written;
  dt_kledger_add(ctx, &r);
}
