/* lib/device/device_meta.c: the meta device: arrays with shape and dtype and no
 * storage, for shape-only runs of the real runtime at any scale (DESIGN.md,
 * "New backends, not new code paths").
 *
 * Allocation hands out unique addresses DT_META_TAG + offset, where offset
 * counts the bytes handed out so far (256-aligned as cudaMalloc): no memory
 * behind them, and, like cuda-emu's tag, outside every user-space address, so
 * a host read or write of meta data faults at once instead of passing. The
 * bytes are accounted in the rank's device counters (dt_mem_track_device)
 * exactly as cuda-emu accounts its real allocations, so the memory split and
 * peak of a shape-only run are the ones of a run on the device it models.
 * Every slot (GEMM, fill, axpy, the kernel table) checks nothing but the tag
 * and does no arithmetic; what the kernels would do is recorded by the compute
 * ledger at the front and at the ops' call sites, as on every device. A copy
 * from meta to host writes zeros (there is no value), so host code that reads
 * a result back (a loss) sees 0. The attention blocking fields are cuda-emu's,
 * so the ops cut the same GEMMs and scratch as on the CUDA devices.
 * The bytes the program holds are what the counters show; beside them the device
 * models PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp,
 * DeviceCachingAllocator: sizes rounded to 512 B; requests up to 1 MiB from 2 MiB
 * segments of the small pool, up to 10 MiB from 20 MiB segments, larger ones from
 * a segment of their size rounded to 2 MiB; the best-fitting free block of the
 * pool (smallest, then lowest address) is split when more than 1 MiB (small pool:
 * 512 B) would be left over; a freed block merges with free neighbours of its
 * segment; segments are kept, never returned), and reports the segments' bytes
 * as the rank's reserved memory (dt_mem_track_reserved), what TorchTitan prints
 * as its memory (torch.cuda.max_memory_reserved). Allocation is in program order,
 * one stream, as the ledgers' runs are.
 * Not here: any value, any timing, the allocator's retry that frees the cache
 * when a segment does not fit the device (there is no capacity here). */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "device/device.h"
#include "device/kernels.h"

/* A block of the caching allocator's model: a run of one segment, in address
 * order (prev, next: indices of its segment's neighbours, -1 none). */
typedef struct cblock {
  uint64_t addr, size;
  int prev, next;
  bool free, small;
} cblock;

typedef struct cache_model {
  cblock *b;
  int nb, capb;
  int *spare, nspare;      /* recycled block indices (capacity capb) */
  int *fre, nfre;          /* the free blocks by (pool, size, address) (capacity capb) */
  uint64_t *hkey;          /* allocated blocks by address: open addressing */
  int *hval;
  size_t hcap, hn;
  uint64_t reserved;
} cache_model;

typedef struct meta_impl {
  uint64_t next;           /* bytes handed out so far: the next address's offset */
  cache_model cm;
  dt_device_ops ops;       /* the slots, with kern pointing at `kern` */
  dt_kernels kern;
  dt_kern_attn attn;       /* no-op slots, cuda-emu's blocking */
} meta_impl;

static bool is_meta(const void *p) { return ((uintptr_t)p & DT_META_TAG) == DT_META_TAG; }

static dt_status bad(dt_device *d, const char *call, const void *p) {
  return dt_error(d->ctx, DT_ERR_INVALID, call, "%p is not a meta device pointer", p);
}

/* ---- the caching allocator's model ---- */

enum {
  CM_SMALL = 1 << 20,          /* kSmallSize: the small pool's largest request */
  CM_SMALL_SEG = 2 << 20,      /* kSmallBuffer */
  CM_MID_SEG = 20 << 20,       /* kLargeBuffer, for requests under kMinLargeAlloc */
  CM_MIN_LARGE = 10 << 20,     /* kMinLargeAlloc */
  CM_ROUND_LARGE = 2 << 20,    /* kRoundLarge */
  CM_MIN_BLOCK = 512,          /* kMinBlockSize */
};

static uint64_t hslot(const cache_model *c, uint64_t k) {
  return (k * 0x9E3779B97F4A7C15ull >> 17) & (c->hcap - 1);
}

static bool cm_grow(cache_model *c) {
  if (c->nb < c->capb) return true;
  int nc = c->capb ? 2 * c->capb : 256;
  cblock *b = realloc(c->b, sizeof *b * (size_t)nc);
  if (b) c->b = b;
  int *sp = b ? realloc(c->spare, sizeof *sp * (size_t)nc) : NULL;
  if (sp) c->spare = sp;
  int *fr = sp ? realloc(c->fre, sizeof *fr * (size_t)nc) : NULL;
  if (fr) c->fre = fr;
  if (!fr) return false;
  c->capb = nc;
  return true;
}

static int cm_new(cache_model *c, uint64_t addr, uint64_t size, bool small) {
  int i;
  if (c->nspare) i = c->spare[--c->nspare];
  else {
    if (!cm_grow(c)) return -1;
    i = c->nb++;
  }
  c->b[i] = (cblock){addr, size, -1, -1, false, small};
  return i;
}

static bool h_put(cache_model *c, uint64_t k, int v) {
  if (2 * (c->hn + 1) > c->hcap) { /* rehash at half full */
    size_t oc = c->hcap, nc = oc ? 2 * oc : 1024;
    uint64_t *nk = calloc(nc, sizeof *nk);
    int *nv = malloc(nc * sizeof *nv);
    if (!nk || !nv) {
      free(nk);
      free(nv);
      return false;
    }
    uint64_t *ok = c->hkey;
    int *ov = c->hval;
    c->hkey = nk, c->hval = nv, c->hcap = nc;
    for (size_t j = 0; j < oc; j++)
      if (ok[j]) {
        size_t q = hslot(c, ok[j]);
        while (nk[q]) q = (q + 1) & (nc - 1);
        nk[q] = ok[j], nv[q] = ov[j];
      }
    free(ok);
    free(ov);
  }
  size_t q = hslot(c, k);
  while (c->hkey[q]) q = (q + 1) & (c->hcap - 1);
  c->hkey[q] = k, c->hval[q] = v, c->hn++;
  return true;
}

static int h_take(cache_model *c, uint64_t k) {
  if (!c->hcap) return -1;
  size_t q = hslot(c, k);
  while (c->hkey[q] && c->hkey[q] != k) q = (q + 1) & (c->hcap - 1);
  if (!c->hkey[q]) return -1;
  const int v = c->hval[q];
  c->hkey[q] = 0, c->hn--;
  for (size_t r = (q + 1) & (c->hcap - 1); c->hkey[r]; r = (r + 1) & (c->hcap - 1)) {
    const uint64_t kk = c->hkey[r]; /* re-place the run after the hole */
    const int vv = c->hval[r];
    c->hkey[r] = 0, c->hn--;
    size_t z = hslot(c, kk);
    while (c->hkey[z]) z = (z + 1) & (c->hcap - 1);
    c->hkey[z] = kk, c->hval[z] = vv, c->hn++;
  }
  return v;
}

/* Whether free block a orders before (pool, size, addr): the small pool first, then
 * by size, then by address, as the allocator's BlockComparatorSize. */
static bool before(const cblock *a, bool small, uint64_t size, uint64_t addr) {
  if (a->small != small) return a->small && !small;
  if (a->size != size) return a->size < size;
  return a->addr < addr;
}

/* The first position in fre whose block does not order before the key. */
static int fre_lower(const cache_model *c, bool small, uint64_t size, uint64_t addr) {
  int lo = 0, hi = c->nfre;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (before(&c->b[c->fre[mid]], small, size, addr)) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

static void fre_insert(cache_model *c, int i) {
  const cblock *x = &c->b[i];
  const int at = fre_lower(c, x->small, x->size, x->addr);
  memmove(&c->fre[at + 1], &c->fre[at], sizeof *c->fre * (size_t)(c->nfre - at));
  c->fre[at] = i;
  c->nfre++;
}

static void fre_remove(cache_model *c, int i) {
  const cblock *x = &c->b[i];
  const int at = fre_lower(c, x->small, x->size, x->addr);
  if (at >= c->nfre || c->fre[at] != i) return;
  memmove(&c->fre[at], &c->fre[at + 1], sizeof *c->fre * (size_t)(c->nfre - at - 1));
  c->nfre--;
}

/* The model's malloc: the address of a block of at least `bytes`, and the
 * segment bytes it added (0 when a cached block served it). addr 0: no memory. */
static uint64_t cm_alloc(meta_impl *im, size_t bytes) {
  cache_model *c = &im->cm;
  const uint64_t size = bytes < CM_MIN_BLOCK ? CM_MIN_BLOCK
                                             : ((uint64_t)bytes + CM_MIN_BLOCK - 1) / CM_MIN_BLOCK * CM_MIN_BLOCK;
  const bool small = size <= CM_SMALL;
  int best = -1;
  const int at = fre_lower(c, small, size, 0); /* best fit: the smallest, then lowest, that fits */
  if (at < c->nfre && c->b[c->fre[at]].small == small) best = c->fre[at];
  if (best < 0) { /* a new segment */
    const uint64_t seg = small ? CM_SMALL_SEG : size < CM_MIN_LARGE ? CM_MID_SEG
                       : (size + CM_ROUND_LARGE - 1) / CM_ROUND_LARGE * CM_ROUND_LARGE;
    if (im->next > ((uint64_t)1 << 53) - seg) return 0;
    best = cm_new(c, im->next + 256, seg, small); /* + 256: no block at offset 0 */
    if (best < 0) return 0;
    im->next += seg + 256;
    c->reserved += seg;
  } else {
    fre_remove(c, best);
  }
  cblock *x = &c->b[best];
  const uint64_t rest = x->size - size;
  if (small ? rest >= CM_MIN_BLOCK : rest > CM_SMALL) { /* split: the remainder stays free */
    int r = cm_new(c, x->addr + size, rest, small);
    if (r >= 0) {
      x = &c->b[best]; /* cm_new may move the array */
      c->b[r].free = true;
      c->b[r].prev = best;
      c->b[r].next = x->next;
      if (x->next >= 0) c->b[x->next].prev = r;
      x->next = r;
      x->size = size;
      fre_insert(c, r);
    }
  }
  x->free = false;
  if (!h_put(c, x->addr, best)) return 0;
  return x->addr;
}

/* Block j absorbed into its neighbour i (i before j in the segment); neither is in
 * the free set (a block's key changes with its size). */
static void cm_merge(cache_model *c, int i, int j) {
  cblock *a = &c->b[i], *b = &c->b[j];
  a->size += b->size;
  a->next = b->next;
  if (b->next >= 0) c->b[b->next].prev = i;
  c->spare[c->nspare++] = j;
}

static void cm_free(cache_model *c, uint64_t addr) {
  int i = h_take(c, addr);
  if (i < 0) return;
  c->b[i].free = true;
  const int nx = c->b[i].next;
  if (nx >= 0 && c->b[nx].free) {
    fre_remove(c, nx);
    cm_merge(c, i, nx);
  }
  const int pv = c->b[i].prev;
  if (pv >= 0 && c->b[pv].free) {
    fre_remove(c, pv);
    cm_merge(c, pv, i);
    i = pv;
  }
  fre_insert(c, i);
}

static void cm_release(cache_model *c) {
  free(c->b);
  free(c->spare);
  free(c->fre);
  free(c->hkey);
  free(c->hval);
}

static dt_status meta_alloc(dt_device *d, size_t bytes, void **out) {
  meta_impl *im = d->impl;
  const uint64_t before = im->cm.reserved;
  const uint64_t addr = bytes > ((uint64_t)1 << 52) ? 0 : cm_alloc(im, bytes);
  if (!addr) {
    *out = NULL;
    return dt_error(d->ctx, DT_ERR_NOMEM, "dt_device_alloc",
                    "meta: %zu bytes past the tag's address range (or no host memory)", bytes);
  }
  *out = (void *)(uintptr_t)(DT_META_TAG + (uintptr_t)addr);
  if (im->cm.reserved > before) dt_mem_track_reserved(d->ctx, im->cm.reserved);
  dt_mem_track_device(d->ctx, bytes, true);
  return DT_OK;
}

static void meta_free(dt_device *d, void *p, size_t bytes) {
  if (!is_meta(p)) {
    (void)bad(d, "dt_device_free", p);
    return;
  }
  meta_impl *im = d->impl;
  cm_free(&im->cm, (uint64_t)((uintptr_t)p - DT_META_TAG));
  dt_mem_track_device(d->ctx, bytes, false);
}

static dt_status meta_copy(dt_device *d, void *dst, const void *src, size_t bytes,
                           dt_copy_kind k) {
  const char *c = "dt_device_copy";
  bool dd = k == DT_COPY_H2D || k == DT_COPY_D2D, sd = k == DT_COPY_D2H || k == DT_COPY_D2D;
  if (dd != is_meta(dst)) return dd ? bad(d, c, dst) : dt_error(d->ctx, DT_ERR_INVALID, c, "the destination is device memory");
  if (sd != is_meta(src)) return sd ? bad(d, c, src) : dt_error(d->ctx, DT_ERR_INVALID, c, "the source is device memory");
  if (k == DT_COPY_D2H) memset(dst, 0, bytes);
  else if (k == DT_COPY_H2H) memmove(dst, src, bytes);
  return DT_OK;
}

static dt_status meta_gemm(dt_device *d, const dt_gemm_desc *g) {
  if (!is_meta(g->c)) return bad(d, "dt_device_gemm", g->c);
  if (g->k > 0 && (!is_meta(g->a) || !is_meta(g->b)))
    return bad(d, "dt_device_gemm", is_meta(g->a) ? g->b : g->a);
  return DT_OK;
}

static dt_status meta_fill(dt_device *d, dt_dtype t, void *x, int64_t n, double value) {
  (void)t; (void)n; (void)value;
  return is_meta(x) ? DT_OK : bad(d, "dt_device_fill", x);
}

static dt_status meta_axpy(dt_device *d, dt_dtype t, int64_t n, double alpha, const void *x,
                           void *y) {
  (void)t; (void)n; (void)alpha;
  return is_meta(x) && is_meta(y) ? DT_OK : bad(d, "dt_device_axpy", is_meta(x) ? y : x);
}

static void meta_destroy(dt_device *d) {
  meta_impl *im = d->impl;
  if (im) cm_release(&im->cm);
  free(d->impl);
  free(d);
}

/* ---- the kernel table: every slot does nothing ---- */

static dt_status k_silu(dt_device *d, dt_dtype t, int64_t n, const void *x, void *y) { (void)d; (void)t; (void)n; (void)x; (void)y; return DT_OK; }
static dt_status k_cast(dt_device *d, dt_dtype ts, const void *s, dt_dtype td, void *x, int64_t n) { (void)d; (void)ts; (void)s; (void)td; (void)x; (void)n; return DT_OK; }
static dt_status k_scale(dt_device *d, dt_dtype t, int64_t n, double a, const void *x, void *y) { (void)d; (void)t; (void)n; (void)a; (void)x; (void)y; return DT_OK; }
static dt_status k_binary(dt_device *d, dt_dtype t, dt_pw_op op, int nd, const int64_t *sh, const void *a, const int64_t *sa, const void *b, const int64_t *sb, void *y) { (void)d; (void)t; (void)op; (void)nd; (void)sh; (void)a; (void)sa; (void)b; (void)sb; (void)y; return DT_OK; }
static dt_status k_swiglu_bwd(dt_device *d, dt_dtype t, int64_t n, const void *a, const void *b, const void *g, void *da, void *db) { (void)d; (void)t; (void)n; (void)a; (void)b; (void)g; (void)da; (void)db; return DT_OK; }
static dt_status k_reduce(dt_device *d, dt_dtype tx, const void *x, dt_dtype ty, void *y, int64_t o, int64_t r, int64_t i, double a) { (void)d; (void)tx; (void)x; (void)ty; (void)y; (void)o; (void)r; (void)i; (void)a; return DT_OK; }
static dt_status k_softmax(dt_device *d, dt_dtype t, int64_t o, int64_t L, int64_t i, const void *x, void *y) { (void)d; (void)t; (void)o; (void)L; (void)i; (void)x; (void)y; return DT_OK; }
static dt_status k_softmax_bwd(dt_device *d, dt_dtype t, int64_t o, int64_t L, int64_t i, const void *y, const void *dy, void *dx) { (void)d; (void)t; (void)o; (void)L; (void)i; (void)y; (void)dy; (void)dx; return DT_OK; }
static dt_status k_permute(dt_device *d, size_t es, int nd, const int64_t *sh, const int64_t *st, int64_t off, const void *x, void *y) { (void)d; (void)es; (void)nd; (void)sh; (void)st; (void)off; (void)x; (void)y; return DT_OK; }
static dt_status k_sum_dims(dt_device *d, dt_dtype tx, int nd, const int64_t *sh, uint32_t dims, const void *x, dt_dtype ty, void *y, double div) { (void)d; (void)tx; (void)nd; (void)sh; (void)dims; (void)x; (void)ty; (void)y; (void)div; return DT_OK; }
static dt_status k_contract(dt_device *d, dt_dtype t, int no, const int64_t *os, const int64_t *oa, const int64_t *ob, int ns, const int64_t *ss, const int64_t *sa, const int64_t *sb, const void *a, const void *b, void *y) { (void)d; (void)t; (void)no; (void)os; (void)oa; (void)ob; (void)ns; (void)ss; (void)sa; (void)sb; (void)a; (void)b; (void)y; return DT_OK; }

static const dt_kern_pw meta_pw = {
    .silu = k_silu, .cast = k_cast, .scale = k_scale, .binary = k_binary,
    .swiglu_bwd = k_swiglu_bwd, .reduce = k_reduce, .softmax = k_softmax,
    .softmax_bwd = k_softmax_bwd, .permute = k_permute, .sum_dims = k_sum_dims,
    .contract = k_contract,
};

static dt_status k_rms_fwd(dt_device *d, dt_dtype t, int64_t r, int64_t n, double e, const void *x, const void *w, void *y) { (void)d; (void)t; (void)r; (void)n; (void)e; (void)x; (void)w; (void)y; return DT_OK; }
static dt_status k_rms_bwd(dt_device *d, dt_dtype t, int64_t r, int64_t n, double e, const void *x, const void *w, const void *dy, void *dx, void *gxh, void *dw, void *ws) { (void)d; (void)t; (void)r; (void)n; (void)e; (void)x; (void)w; (void)dy; (void)dx; (void)gxh; (void)dw; (void)ws; return DT_OK; }
static dt_status k_rope(dt_device *d, dt_dtype t, const dt_kern_rope_args *a, const void *x, void *y) { (void)d; (void)t; (void)a; (void)x; (void)y; return DT_OK; }
static dt_status k_embedding(dt_device *d, dt_dtype t, int64_t n, const int64_t *ids, int64_t r, int64_t c, int64_t off, const void *w, void *y) { (void)d; (void)t; (void)n; (void)ids; (void)r; (void)c; (void)off; (void)w; (void)y; return DT_OK; }
static dt_status k_embedding_bwd(dt_device *d, dt_dtype tg, int64_t n, const int64_t *ids, const void *g, int64_t r, int64_t c, int64_t off, dt_dtype tw, void *gw) { (void)d; (void)tg; (void)n; (void)ids; (void)g; (void)r; (void)c; (void)off; (void)tw; (void)gw; return DT_OK; }
static dt_status k_ce_max(dt_device *d, dt_dtype t, int64_t np, int64_t V, const void *x, double *mx) { (void)d; (void)t; (void)np; (void)V; (void)x; (void)mx; return DT_OK; }
static dt_status k_ce_sumexp(dt_device *d, dt_dtype t, int64_t np, int64_t V, int64_t vo, const void *x, const int64_t *tg, bool fm, double *mx, double *se, double *tl) { (void)d; (void)t; (void)np; (void)V; (void)vo; (void)x; (void)tg; (void)fm; (void)mx; (void)se; (void)tl; return DT_OK; }
static dt_status k_ce_loss(dt_device *d, dt_dtype t, int64_t np, double nt, const double *mx, const double *se, const double *tl, double *lse, void *loss) { (void)d; (void)t; (void)np; (void)nt; (void)mx; (void)se; (void)tl; (void)lse; (void)loss; return DT_OK; }
static dt_status k_ce_bwd(dt_device *d, dt_dtype t, int64_t np, int64_t V, int64_t vo, const void *x, const int64_t *tg, const double *lse, const void *g, double nt, void *dx) { (void)d; (void)t; (void)np; (void)V; (void)vo; (void)x; (void)tg; (void)lse; (void)g; (void)nt; (void)dx; return DT_OK; }

static const dt_kern_rows meta_rows = {
    .rms_fwd = k_rms_fwd, .rms_bwd = k_rms_bwd, .rope = k_rope, .embedding = k_embedding,
    .embedding_bwd = k_embedding_bwd, .ce_max = k_ce_max, .ce_sumexp = k_ce_sumexp,
    .ce_loss = k_ce_loss, .ce_bwd = k_ce_bwd, .check_ids = NULL, /* ids are never read */
};

static dt_status k_copy_box(dt_device *d, size_t es, int nd, void *dst, const int64_t *ds, const int64_t *doff, const void *src, const int64_t *ss, const int64_t *soff, const int64_t *box) { (void)d; (void)es; (void)nd; (void)dst; (void)ds; (void)doff; (void)src; (void)ss; (void)soff; (void)box; return DT_OK; }
static dt_status k_lreduce(dt_device *d, dt_dtype t, int op, int64_t n, int nin, const void *const *in, void *out, double div) { (void)d; (void)t; (void)op; (void)n; (void)nin; (void)in; (void)out; (void)div; return DT_OK; }
static const dt_kern_layout meta_layout = {.copy_box = k_copy_box, .reduce = k_lreduce};

static dt_status k_adamw(dt_device *d, int64_t n, dt_dtype st, void *ms, void *m, void *v, dt_dtype gt, const void *g, dt_dtype wt, void *w, const dt_kern_adamw_hp *hp) { (void)d; (void)n; (void)st; (void)ms; (void)m; (void)v; (void)gt; (void)g; (void)wt; (void)w; (void)hp; return DT_OK; }
static const dt_kern_optim meta_optim = {.adamw = k_adamw};

static dt_status k_a_softmax(dt_device *d, dt_dtype t, const dt_attn_rows *g, void *P) { (void)d; (void)t; (void)g; (void)P; return DT_OK; }
static dt_status k_a_softmax_bwd(dt_device *d, dt_dtype t, const dt_attn_rows *g, const void *P, void *dP) { (void)d; (void)t; (void)g; (void)P; (void)dP; return DT_OK; }
static dt_status k_a_online(dt_device *d, dt_dtype t, const dt_attn_rows *g, void *P, void *m, void *l, void *O, int64_t old, int64_t os, int64_t hd) { (void)d; (void)t; (void)g; (void)P; (void)m; (void)l; (void)O; (void)old; (void)os; (void)hd; return DT_OK; }
static dt_status k_a_finish(dt_device *d, dt_dtype t, int64_t n, int64_t hd, void *O, const void *m, const void *l, void *lse) { (void)d; (void)t; (void)n; (void)hd; (void)O; (void)m; (void)l; (void)lse; return DT_OK; }
static dt_status k_a_rowdot(dt_device *d, dt_dtype t, int64_t n, int64_t hd, const void *dO, const void *O, void *D) { (void)d; (void)t; (void)n; (void)hd; (void)dO; (void)O; (void)D; return DT_OK; }
static dt_status k_a_lse_bwd(dt_device *d, dt_dtype t, const dt_attn_rows *g, void *P, void *dS, const void *lse, const void *D) { (void)d; (void)t; (void)g; (void)P; (void)dS; (void)lse; (void)D; return DT_OK; }

static const dt_device_ops meta_ops_base = {
    .name = "meta",
    .alloc = meta_alloc,
    .free = meta_free,
    .copy = meta_copy,
    .gemm = meta_gemm,
    .fill = meta_fill,
    .axpy = meta_axpy,
    .sync = NULL,
    .destroy = meta_destroy,
    .kern = NULL, /* the impl's table (its attention blocking is copied at create) */
};

bool dt_device_is_meta(const dt_device *d) { return d && d->kind == DT_DEV_META; }

dt_status dt_device_meta_create(dt_ctx *ctx, dt_device **out) {
  if (!out) return dt_error(ctx, DT_ERR_INVALID, "dt_device_meta_create", "NULL out");
  *out = NULL;
  dt_device *d = calloc(1, sizeof *d);
  meta_impl *im = calloc(1, sizeof *im);
  if (!d || !im) {
    free(d);
    free(im);
    return dt_error(ctx, DT_ERR_NOMEM, "dt_device_meta_create", "no memory");
  }
  im->attn = *dt_kernels_emu.attn; /* the blocking fields */
  im->attn.softmax = k_a_softmax;
  im->attn.softmax_bwd = k_a_softmax_bwd;
  im->attn.online = k_a_online;
  im->attn.finish = k_a_finish;
  im->attn.rowdot = k_a_rowdot;
  im->attn.lse_bwd = k_a_lse_bwd;
  im->kern = (dt_kernels){.name = "meta", .pw = &meta_pw, .rows = &meta_rows, .attn = &im->attn,
                          .layout = &meta_layout, .optim = &meta_optim, .bf16_as_f32 = false,
                          .shape_only = true};
  im->ops = meta_ops_base;
  im->ops.kern = &im->kern;
  d->ops = &im->ops;
  d->kind = DT_DEV_META;
  d->ctx = ctx;
  d->impl = im;
  dt_device_install_memory(d);
  *out = d;
  return DT_OK;
}
