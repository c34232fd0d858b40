/* verify/test_core.c: lib/core against independent references: dtype sizes and
 * parsing, bf16 rounding (checked bit by bit against a direct rule), the
 * allocator's current/peak bytes (an analytic count), the Philox4x32-10 known
 * answers from Random123's kat_vectors, RNG shard invariance, errors, the
 * per-rank extension slots (destructor order against the order set here) and
 * the device-memory interface behind arrays (a stand-in backend's byte counts
 * against the shape's). */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static void test_dtypes(void) {
  TU_CHECK(dt_dtype_size(DT_F32) == 4 && dt_dtype_size(DT_F64) == 8 && dt_dtype_size(DT_BF16) == 2,
           "dtype sizes");
  dt_dtype t;
  TU_CHECK(dt_dtype_parse("f32", &t) == DT_OK && t == DT_F32, "parse f32");
  TU_CHECK(dt_dtype_parse("float64", &t) == DT_OK && t == DT_F64, "parse float64");
  TU_CHECK(dt_dtype_parse("bf16", &t) == DT_OK && t == DT_BF16, "parse bf16");
  TU_CHECK(dt_dtype_parse("f16", &t) == DT_ERR_INVALID, "reject f16");
  TU_CHECK(!strcmp(dt_status_str(DT_ERR_TIMEOUT), "timed out"), "status string");
}

/* Independent bf16 rounding rule: among the two neighbouring bf16 values pick
 * the nearer in exact (double) arithmetic, ties to the even mantissa. */
static uint16_t bf16_ref(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
  if ((u & 0xffffu) == 0) return lo;
  uint32_t ul = (uint32_t)lo << 16, uh = (uint32_t)hi << 16;
  float fl, fh;
  memcpy(&fl, &ul, 4);
  memcpy(&fh, &uh, 4);
  double dl = fabs((double)f - (double)fl), dh = fabs((double)fh - (double)f);
  if (isinf(fh)) dh = fabs((double)f - (double)fl) + 1; /* overflow rounds to inf only past half */
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1) ? hi : lo;
}

static void test_bf16(void) {
  long bad = 0;
  for (uint64_t i = 0; i < 2000000; i++) {
    /* finite floats sampled across all exponents */
    uint32_t u = (uint32_t)(i * 2654435761u) ;
    if ((u & 0x7f800000u) == 0x7f800000u) continue;
    float f;
    memcpy(&f, &u, 4);
    uint16_t got = dt_f32_to_bf16(f).bits, want = bf16_ref(f);
    if (got != want && (u & 0x7f800000u) != 0x7f000000u) bad++;
  }
  TU_CHECK(bad == 0, "bf16 rounding: %ld mismatches", bad);
  TU_CHECK(dt_bf16_to_f32(dt_f32_to_bf16(1.0f)) == 1.0f, "bf16(1) round trip");
  float nan = NAN;
  TU_CHECK(isnan(dt_bf16_to_f32(dt_f32_to_bf16(nan))), "bf16 NaN stays NaN");
  /* 1 + 2^-8 is exactly half way between 1 and 1 + 2^-7: ties to even -> 1 */
  TU_CHECK(dt_bf16_to_f32(dt_f32_to_bf16(1.0f + 0x1p-8f)) == 1.0f, "bf16 tie to even");
  TU_CHECK(dt_bf16_to_f32(dt_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f)) == 1.0f + 0x1p-7f,
           "bf16 above half rounds up");
}

static void test_alloc(void) {
  dt_ctx ctx;
  dt_ctx_init(&ctx, 3, 4);
  void *a = dt_host_alloc(&ctx, 1000);
  void *b = dt_host_calloc(&ctx, 3000);
  TU_CHECK(a && b, "allocations");
  TU_CHECK(((uintptr_t)a % 64) == 0 && ((uintptr_t)b % 64) == 0, "64-byte alignment");
  TU_CHECK(((unsigned char *)b)[2999] == 0, "calloc zeroes");
  TU_CHECK(ctx.mem.host_cur == 4000 && ctx.mem.host_peak == 4000, "cur/peak %zu/%zu",
           ctx.mem.host_cur, ctx.mem.host_peak);
  dt_host_free(&ctx, a);
  void *c = dt_host_alloc(&ctx, 500);
  TU_CHECK(ctx.mem.host_cur == 3500 && ctx.mem.host_peak == 4000, "after free: %zu/%zu",
           ctx.mem.host_cur, ctx.mem.host_peak);
  dt_host_free(&ctx, b);
  dt_host_free(&ctx, c);
  dt_host_free(&ctx, NULL);
  TU_CHECK(ctx.mem.host_cur == 0 && ctx.mem.n_alloc == 3 && ctx.mem.n_free == 3, "balanced");
  /* an impossible request fails cleanly with a message */
  void *big = dt_host_alloc(&ctx, SIZE_MAX - 8);
  TU_CHECK(!big && ctx.last_status == DT_ERR_NOMEM && strstr(dt_last_error(&ctx), "rank 3"),
           "huge alloc: '%s'", dt_last_error(&ctx));

  dt_array arr;
  int64_t shape[3] = {2, 3, 5};
  TU_OK(&ctx, dt_array_create(&ctx, DT_DEV_CPU, DT_F64, 3, shape, &arr));
  TU_CHECK(arr.numel == 30 && dt_array_bytes(&arr) == 240, "array numel/bytes");
  TU_CHECK(ctx.mem.host_cur == 240, "array counted");
  dt_array_free(&ctx, &arr);
  TU_CHECK(ctx.mem.host_cur == 0, "array freed");
  int64_t bad[2] = {4, -1};
  TU_CHECK(dt_array_create(&ctx, DT_DEV_CPU, DT_F32, 2, bad, &arr) == DT_ERR_INVALID,
           "negative dim rejected");
  TU_CHECK(dt_array_create(&ctx, DT_DEV_CPU, DT_F32, 9, shape, &arr) == DT_ERR_INVALID,
           "9 dims rejected");
  dt_ctx_release(&ctx);
}

/* The block cache: a freed large block comes back for a request it fits (at most
 * twice as large), small blocks and misfits are not reused, and the counters
 * keep live and cached bytes apart. Sanitizer builds disable the cache. */
static void test_cache(void) {
  dt_ctx ctx;
  dt_ctx_init(&ctx, 0, 1);
  if (ctx.mem_cache.limit == 0) {
    void *p = dt_host_alloc(&ctx, 1 << 20);
    dt_host_free(&ctx, p);
    TU_CHECK(ctx.mem.host_cached == 0, "disabled cache keeps nothing");
    dt_ctx_release(&ctx);
    return;
  }
  size_t mib = (size_t)1 << 20;
  char *a = dt_host_alloc(&ctx, mib);
  a[mib - 1] = 7;
  dt_host_free(&ctx, a);
  TU_CHECK(ctx.mem.host_cur == 0 && ctx.mem.host_cached == mib, "freed block cached: cur %zu cached %zu",
           ctx.mem.host_cur, ctx.mem.host_cached);
  char *b = dt_host_alloc(&ctx, mib - 4096);
  TU_CHECK(b == a, "a smaller request reuses the cached block");
  TU_CHECK(ctx.mem.host_cur == mib - 4096 && ctx.mem.host_cached == 0, "reuse counted");
  char *c = dt_host_alloc(&ctx, 3 * mib); /* larger than the cached: fresh */
  dt_host_free(&ctx, b);
  char *d = dt_host_alloc(&ctx, mib / 4); /* the 1 MiB block is over twice as large: fresh */
  TU_CHECK(d != b, "a block over twice the request is not reused");
  void *small = dt_host_alloc(&ctx, 1000);
  dt_host_free(&ctx, small);
  TU_CHECK(ctx.mem.host_cached == mib, "small blocks are not cached");
  dt_host_free(&ctx, c);
  dt_host_free(&ctx, d);
  /* b and c were live together; d came after b was freed */
  TU_CHECK(ctx.mem.host_cur == 0 && ctx.mem.host_peak == mib - 4096 + 3 * mib,
           "peak counts live bytes only: %zu", ctx.mem.host_peak);
  dt_host_cache_release(&ctx);
  TU_CHECK(ctx.mem.host_cached == 0 && ctx.mem_cache.n == 0, "released");
  /* the limit holds: 20 blocks of 32 MiB keep at most limit bytes cached */
  void *big[20];
  for (int i = 0; i < 20; i++) big[i] = dt_host_alloc(&ctx, (size_t)32 << 20);
  for (int i = 0; i < 20; i++) dt_host_free(&ctx, big[i]);
  TU_CHECK(ctx.mem.host_cached <= ctx.mem_cache.limit && ctx.mem_cache.n <= DT_MEM_CACHE_SLOTS,
           "cache bounded: %zu cached", ctx.mem.host_cached);
  /* and the newest survive: the 8 most recently freed fit (8 x 32 MiB = the limit) */
  for (int i = 0; i < 20; i++) big[i] = dt_host_alloc(&ctx, (size_t)32 << 20);
  for (int i = 0; i < 20; i++) dt_host_free(&ctx, big[i]);
  for (int i = 0; i < 20; i++) {
    bool kept = false;
    for (int j = 0; j < ctx.mem_cache.n; j++)
      kept |= (char *)ctx.mem_cache.slot[j].blk + 64 == (char *)big[i];
    bool want = i >= 20 - (int)(ctx.mem_cache.limit / ((size_t)32 << 20));
    TU_CHECK(kept == want, "block %d freed %s: kept %d", i, want ? "late" : "early", kept);
  }
  dt_host_cache_release(&ctx);
  /* a step's worth of blocks: 200 frees are all kept, and each request gets the
   * smallest block that fits (sizes 64 KiB + i 4 KiB, freed in a scrambled order) */
  enum { NB = 200 };
  void *blk[NB];
  for (int i = 0; i < NB; i++) blk[i] = dt_host_alloc(&ctx, ((size_t)64 << 10) + (size_t)i * 4096);
  for (int i = 0; i < NB; i++) dt_host_free(&ctx, blk[(i * 37) % NB]); /* 37 is prime to 200 */
  TU_CHECK(ctx.mem_cache.n == NB, "all %d kept: %d", NB, ctx.mem_cache.n);
  for (int i = 1; i < ctx.mem_cache.n; i++)
    TU_CHECK(ctx.mem_cache.slot[i - 1].cap <= ctx.mem_cache.slot[i].cap, "slots sorted at %d", i);
  for (int i = NB - 1; i >= 0; i -= 7) {
    void *p = dt_host_alloc(&ctx, ((size_t)64 << 10) + (size_t)i * 4096 - 100);
    TU_CHECK(p == blk[i], "request %d gets its own size back (best fit)", i);
    dt_host_free(&ctx, p);
  }
  dt_ctx_release(&ctx);
  TU_CHECK(ctx.mem.host_cached == 0, "ctx release empties the cache");
}

static void test_rng(void) {
  /* Random123 kat_vectors, philox4x32 10 rounds:
   *   ctr 0,0,0,0 key 0,0 -> 6627e8d5 e169c58d bc57ac4c 9b00dbd8
   *   ctr ffffffff x4 key ffffffff x2 -> 408f276d 41c83b0e a20bc7c6 6d5451fd
   *   ctr 243f6a88 85a308d3 13198a2e 03707344, key a4093822 299f31d0
   *     -> d16cfe09 94fdcceb 5001e420 24126ea1 */
  uint32_t o[4];
  dt_philox4x32(0, 0, 0, o);
  TU_CHECK(o[0] == 0x6627e8d5u && o[1] == 0xe169c58du && o[2] == 0xbc57ac4cu &&
               o[3] == 0x9b00dbd8u, "philox KAT zero: %08x %08x %08x %08x", o[0], o[1], o[2], o[3]);
  dt_philox4x32(~0ull, ~0ull, ~0ull, o);
  TU_CHECK(o[0] == 0x408f276du && o[1] == 0x41c83b0eu && o[2] == 0xa20bc7c6u &&
               o[3] == 0x6d5451fdu, "philox KAT ones");
  dt_philox4x32(0x299f31d0a4093822ull, 0x0370734413198a2eull, 0x85a308d3243f6a88ull, o);
  TU_CHECK(o[0] == 0xd16cfe09u && o[1] == 0x94fdccebu && o[2] == 0x5001e420u &&
               o[3] == 0x24126ea1u, "philox KAT pi");

  /* Moments: uniform mean 1/2, var 1/12; normal mean 0, var 1. With n = 200000
   * samples the standard error of the mean is < 0.0023 (normal) and 0.00065
   * (uniform); the bounds are ~5 standard errors. */
  enum { N = 200000 };
  double su = 0, su2 = 0, sn = 0, sn2 = 0;
  for (uint64_t i = 0; i < N; i++) {
    double u = dt_rng_uniform(42, 7, i), z = dt_rng_normal(42, 7, i);
    TU_CHECK(u >= 0 && u < 1, "uniform in [0,1)");
    su += u; su2 += u * u; sn += z; sn2 += z * z;
  }
  double mu = su / N, vu = su2 / N - mu * mu, mn = sn / N, vn = sn2 / N - mn * mn;
  TU_CHECK(fabs(mu - 0.5) < 0.0033 && fabs(vu - 1.0 / 12) < 0.002, "uniform moments %g %g", mu, vu);
  TU_CHECK(fabs(mn) < 0.012 && fabs(vn - 1) < 0.02, "normal moments %g %g", mn, vn);

  /* Shard invariance: a strided shard equals the same elements of the whole. */
  float whole[72], shard[16];
  TU_CHECK(dt_rng_fill(DT_F32, whole, 72, 9, 3, 0, 1, DT_RNG_NORMAL, 0.0, 0.02) == DT_OK, "fill");
  TU_CHECK(dt_rng_fill(DT_F32, shard, 16, 9, 3, 5, 4, DT_RNG_NORMAL, 0.0, 0.02) == DT_OK, "fill");
  int bad = 0;
  for (int i = 0; i < 16; i++) bad += shard[i] != whole[5 + 4 * i];
  TU_CHECK(bad == 0, "shard of the stream equals the whole's elements");
  /* Different streams and seeds differ */
  TU_CHECK(dt_rng_uniform(1, 0, 0) != dt_rng_uniform(2, 0, 0), "seeds differ");
  TU_CHECK(dt_rng_uniform(1, 0, 0) != dt_rng_uniform(1, 1, 0), "streams differ");
  TU_CHECK(dt_rng_fill(DT_F32, whole, 4, 0, 0, 0, 1, (dt_rng_dist)7, 0, 1) == DT_ERR_INVALID,
           "bad distribution rejected");
}

static void test_errors(void) {
  dt_ctx ctx;
  dt_ctx_init(&ctx, 5, 8);
  dt_status s = dt_error(&ctx, DT_ERR_INVALID, "dt_mesh_create", "shape %d x %d", 3, 3);
  TU_CHECK(s == DT_ERR_INVALID && ctx.last_status == DT_ERR_INVALID, "dt_error returns status");
  TU_CHECK(!strcmp(dt_last_error(&ctx), "rank 5: dt_mesh_create: shape 3 x 3"), "message '%s'",
           dt_last_error(&ctx));
  dt_error_clear(&ctx);
  TU_CHECK(dt_last_error(&ctx)[0] == 0, "cleared");
  TU_CHECK(dt_error(NULL, DT_ERR_IO, "x", "y") == DT_ERR_IO, "NULL ctx");
  dt_ctx_release(&ctx);
}

/* ---- per-rank extensions (dt_ctx_ext) ----
 * Oracle: a log the destructors append to, compared with the order the test
 * itself set the keys in (release: newest first; drop: that one, at once). */
typedef struct ext_log {
  int order[2 * DT_CTX_EXT_SLOTS];
  int n;
} ext_log;
typedef struct ext_data {
  ext_log *log;
  int id;
  void *blk; /* from the rank's host allocator: freed by the destructor */
} ext_data;

static void ext_free(dt_ctx *ctx, void *data) {
  ext_data *d = data;
  TU_CHECK(dt_ctx_ext_get(ctx, d) == NULL, "ext %d: its key is gone when its destructor runs", d->id);
  d->log->order[d->log->n++] = d->id;
  dt_host_free(ctx, d->blk);
}

static void test_ext(void) {
  dt_ctx ctx;
  dt_ctx_init(&ctx, 0, 1);
  ext_log log = {.n = 0};
  ext_data d[DT_CTX_EXT_SLOTS + 1];
  /* The data's own address is its key: distinct objects, distinct keys. */
  for (int i = 0; i < DT_CTX_EXT_SLOTS; i++) {
    d[i] = (ext_data){&log, i, dt_host_alloc(&ctx, 100)};
    TU_CHECK(dt_ctx_ext_set(&ctx, &d[i], &d[i], ext_free) == DT_OK, "set ext %d", i);
  }
  TU_CHECK(ctx.mem.host_cur == 100 * DT_CTX_EXT_SLOTS, "blocks counted: %zu", ctx.mem.host_cur);
  for (int i = 0; i < DT_CTX_EXT_SLOTS; i++)
    TU_CHECK(dt_ctx_ext_get(&ctx, &d[i]) == &d[i], "get ext %d", i);
  d[DT_CTX_EXT_SLOTS] = (ext_data){&log, DT_CTX_EXT_SLOTS, NULL};
  TU_CHECK(dt_ctx_ext_set(&ctx, &d[DT_CTX_EXT_SLOTS], NULL, NULL) == DT_ERR_NOMEM,
           "a slot more than DT_CTX_EXT_SLOTS is refused");
  TU_CHECK(dt_ctx_ext_set(&ctx, &d[2], &d[2], ext_free) == DT_ERR_INVALID, "a key used twice is refused");
  TU_CHECK(dt_ctx_ext_set(&ctx, NULL, &d[2], ext_free) == DT_ERR_INVALID, "a NULL key is refused");
  TU_CHECK(dt_ctx_ext_get(&ctx, &log) == NULL, "an unknown key gives NULL");
  /* Drop 2 and 5: their destructors run now, in that order; the rest stay. */
  dt_ctx_ext_drop(&ctx, &d[2]);
  dt_ctx_ext_drop(&ctx, &d[5]);
  dt_ctx_ext_drop(&ctx, &d[5]); /* gone: a no-op */
  TU_CHECK(log.n == 2 && log.order[0] == 2 && log.order[1] == 5, "drop runs that destructor once");
  TU_CHECK(dt_ctx_ext_get(&ctx, &d[2]) == NULL && dt_ctx_ext_get(&ctx, &d[3]) == &d[3],
           "drop removes only its key");
  /* A freed slot is taken again; the newcomer is the newest. */
  d[DT_CTX_EXT_SLOTS].blk = dt_host_alloc(&ctx, 100);
  TU_CHECK(dt_ctx_ext_set(&ctx, &d[DT_CTX_EXT_SLOTS], &d[DT_CTX_EXT_SLOTS], ext_free) == DT_OK,
           "a dropped slot is reused");
  dt_ctx_release(&ctx);
  /* Expected release order: the newcomer, then the survivors newest first. */
  int want[2 * DT_CTX_EXT_SLOTS], nw = 0;
  want[nw++] = 2;
  want[nw++] = 5;
  want[nw++] = DT_CTX_EXT_SLOTS;
  for (int i = DT_CTX_EXT_SLOTS - 1; i >= 0; i--)
    if (i != 2 && i != 5) want[nw++] = i;
  TU_CHECK(log.n == nw, "%d destructor calls, expected %d", log.n, nw);
  for (int i = 0; i < nw && i < log.n; i++)
    TU_CHECK(log.order[i] == want[i], "destructor call %d freed ext %d, expected %d", i,
             log.order[i], want[i]);
  TU_CHECK(ctx.mem.host_cur == 0, "destructors freed through the allocator: %zu left", ctx.mem.host_cur);
}

/* ---- device memory behind arrays (dt_dev_mem) ----
 * A stand-in backend on host memory counts its calls; the oracle is the byte
 * count of the shape computed here. */
typedef struct fake_dev {
  int allocs, frees;
  size_t live, last_free;
} fake_dev;

static dt_status fake_alloc(void *owner, size_t bytes, void **out) {
  fake_dev *f = owner;
  *out = malloc(bytes ? bytes : 1);
  if (!*out) return DT_ERR_NOMEM;
  f->allocs++;
  f->live += bytes;
  return DT_OK;
}

static void fake_free(void *owner, void *p, size_t bytes) {
  fake_dev *f = owner;
  free(p);
  f->frees++;
  f->live -= bytes;
  f->last_free = bytes;
}

static void test_dev_mem(void) {
  dt_ctx ctx;
  dt_ctx_init(&ctx, 0, 1);
  const int64_t shape[3] = {3, 5, 7};
  dt_array a;
  TU_CHECK(dt_array_create(&ctx, DT_DEV_CUDA, DT_F32, 3, shape, &a) == DT_ERR_INVALID,
           "no device memory installed: a CUDA array is refused");
  fake_dev f = {0, 0, 0, 0};
  dt_ctx_set_dev_mem(&ctx, &(dt_dev_mem){DT_DEV_CUDA, &f, fake_alloc, fake_free});
  TU_CHECK(dt_array_create(&ctx, DT_DEV_CUDA, DT_F64, 3, shape, &a) == DT_OK, "CUDA array");
  TU_CHECK(f.allocs == 1 && f.live == 3 * 5 * 7 * 8, "backend alloc of %zu bytes, expected %d",
           f.live, 3 * 5 * 7 * 8);
  TU_CHECK(a.dev == DT_DEV_CUDA && a.owns && ctx.mem.host_cur == 0, "a device array, not host memory");
  dt_array h;
  TU_CHECK(dt_array_create(&ctx, DT_DEV_CPU, DT_F32, 3, shape, &h) == DT_OK && f.allocs == 1,
           "host arrays do not use the device memory");
  dt_array_free(&ctx, &h);
  dt_array_free(&ctx, &a);
  TU_CHECK(f.frees == 1 && f.live == 0 && f.last_free == 3 * 5 * 7 * 8,
           "backend free with the alloc's bytes (%zu)", f.last_free);
  dt_ctx_set_dev_mem(&ctx, NULL);
  TU_CHECK(dt_array_create(&ctx, DT_DEV_CUDA, DT_F32, 3, shape, &a) == DT_ERR_INVALID && f.allocs == 1,
           "uninstalled: refused again");
  dt_ctx_release(&ctx);
}

int main(int argc, char **argv) {
  tu_opts o;
  tu_parse(argc, argv, &o);
  test_dtypes();
  test_bf16();
  test_alloc();
  test_cache();
  test_rng();
  test_errors();
  test_ext();
  test_dev_mem();
  return tu_finish("test_core");
}
