/* lib/core/core.h: status codes, per-rank context, dtypes, local arrays, the
 * peak-tracking allocator and the sharding-invariant counter RNG.
 *
 * This is the bottom layer of libdtensor: it knows nothing of communication,
 * devices or meshes (dt_comm and dt_device are opaque handles here; device
 * memory comes through the dt_dev_mem interface a backend installs). Nothing in
 * it is global: every piece of mutable state hangs off a dt_ctx, one per rank.
 */
#ifndef DT_CORE_H
#define DT_CORE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define DT_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define DT_PRINTF(f, a)
#endif

/* ---- status ------------------------------------------------------------ */

/* Every library call returns one of these; DT_OK is 0, errors are negative. */
typedef enum dt_status {
  DT_OK = 0,
  DT_ERR_INVALID = -1,     /* bad argument from the caller (shape, name, count) */
  DT_ERR_NOMEM = -2,       /* an allocation failed */
  DT_ERR_UNSUPPORTED = -3, /* not built in, or no such slot in this backend */
  DT_ERR_BACKEND = -4,     /* MPI, BLAS, CUDA, cuBLAS or NCCL reported an error */
  DT_ERR_ABORTED = -5,     /* another rank failed; this call gave up instead of hanging */
  DT_ERR_TIMEOUT = -6,     /* a collective waited longer than the job's timeout */
  DT_ERR_NODEVICE = -7,    /* the backend is built but no device is present */
  DT_ERR_IO = -8,          /* file or database error */
  DT_ERR_INTERNAL = -9,    /* a broken invariant inside the library */
} dt_status;

/* Short constant description of a status ("invalid argument", ...). */
const char *dt_status_str(dt_status s);

/* ---- dtypes ------------------------------------------------------------- */

typedef enum dt_dtype {
  DT_F32 = 0,
  DT_F64 = 1,
  DT_BF16 = 2, /* storage only: converted to f32 for arithmetic */
  DT_I64 = 3,  /* indices (token ids, targets): moved, gathered, never reduced */
  DT_DTYPE_COUNT
} dt_dtype;

/* bfloat16 storage: the upper 16 bits of an IEEE binary32. */
typedef struct dt_bf16 { uint16_t bits; } dt_bf16;
#ifdef __cplusplus
static_assert(sizeof(dt_bf16) == 2, "bf16 is two bytes");
#else
_Static_assert(sizeof(dt_bf16) == 2, "bf16 is two bytes");
#endif

size_t dt_dtype_size(dt_dtype t);        /* 4, 8, 2, 8; 0 for an invalid dtype */
const char *dt_dtype_name(dt_dtype t);   /* "f32", "f64", "bf16", "i64" */
/* Parses "f32"/"float32", "f64"/"float64", "bf16"/"bfloat16", "i64"/"int64";
 * DT_ERR_INVALID otherwise. */
dt_status dt_dtype_parse(const char *s, dt_dtype *out);
dt_bf16 dt_f32_to_bf16(float f);         /* round to nearest even; NaN stays NaN */
float dt_bf16_to_f32(dt_bf16 h);

/* ---- per-rank context --------------------------------------------------- */

typedef struct dt_ctx dt_ctx;
/* Handles the launcher (lib/launch) sets on each rank's context; core never
 * dereferences them. */
typedef struct dt_comm dt_comm;
typedef struct dt_device dt_device;

enum { DT_ERRMSG_LEN = 1024, DT_LABEL_LEN = 64 };

/* Where a dt_array's data lives: host memory, or a device's memory. */
/* DT_DEV_META: shapes without storage (lib/device/device_meta.c), for shape-only runs. */
typedef enum dt_device_kind { DT_DEV_CPU = 0, DT_DEV_CUDA = 1, DT_DEV_META = 2 } dt_device_kind;

/* What part of the bytes in use the code that owns them has noted (dt_mem_note):
 * the layers above core say what their buffers are, so a peak can be split. */
enum {
  DT_MEM_NOTE_FSDP_PARAMS = 0, /* FSDP's unsharded parameters (its all-gathers' results) */
  DT_MEM_NOTE_COMM = 1,        /* flat send / receive buffers of collectives */
  DT_MEM_NOTE_GRADS = 2,       /* the gradients of leaves (parameters) a tape holds */
  DT_MEM_NOTES = 3
};

/* Where a high-water mark was reached: its bytes, ctx's phase and module at the
 * allocation that reached it, and the noted bytes in use then. */
typedef struct dt_mem_peak_at {
  size_t bytes;
  size_t note[DT_MEM_NOTES];
  char phase[16];
  char where[DT_LABEL_LEN];     /* ctx->scope: the module (fqn) */
} dt_mem_peak_at;

/* Bytes in use and the high-water mark, per memory kind. */
typedef struct dt_mem_stats {
  size_t host_cur, host_peak;   /* live bytes requested by the program, and the high-water mark */
  size_t host_cached;           /* freed blocks kept for reuse (not counted in host_cur) */
  size_t dev_cur, dev_peak;     /* device bytes, as the device backends report them */
  /* what a device's caching allocator holds (its segments), where the device models
   * one (the meta device: PyTorch's), and the high-water mark; 0 where none */
  size_t dev_reserved, dev_reserved_peak;
  uint64_t n_alloc, n_free;
  size_t note[2][DT_MEM_NOTES]; /* [0] host, [1] device: the noted bytes in use */
  dt_mem_peak_at at[2];         /* [0] host, [1] device: where the peak was reached */
} dt_mem_stats;

/* Freed large host blocks kept per rank for reuse, like PyTorch's caching
 * allocator: a redistribute that allocates its output every call reuses the
 * pages of the last one instead of faulting fresh ones in. A training step
 * frees its activations together (a debugmodel step at batch 4 x seq 128 frees
 * about 150 large blocks), so the slots hold more than one step's worth. */
enum { DT_MEM_CACHE_SLOTS = 256 };
typedef struct dt_mem_slot {
  void *blk;      /* the raw block */
  size_t cap;     /* its usable bytes */
  uint64_t stamp; /* when it was put (the oldest is evicted) */
} dt_mem_slot;
typedef struct dt_mem_cache {
  dt_mem_slot slot[DT_MEM_CACHE_SLOTS]; /* ascending by cap */
  uint64_t tick;
  int n;
  size_t limit;                         /* most bytes kept; 0 disables the cache */
} dt_mem_cache;

/* The memory behind the rank's non-host arrays. Core owns the interface; a
 * device backend provides the memory: the first device of a kind created on a
 * context installs itself (lib/device), and dt_array_create / dt_array_free of
 * arrays of that kind call it. kind == DT_DEV_CPU (all zero): none installed. */
typedef struct dt_dev_mem {
  dt_device_kind kind;
  void *owner;                  /* the backend's handle, passed back to alloc and free */
  dt_status (*alloc)(void *owner, size_t bytes, void **out);
  void (*free)(void *owner, void *p, size_t bytes);
} dt_dev_mem;

/* Per-rank state of a layer above core (the comm ledger, the ops dispatch
 * cache), hung on the context under a key the layer owns: the address of one
 * of its own static const objects, so keys never clash and nothing global is
 * written. dt_ctx_release frees each with its destructor. */
enum { DT_CTX_EXT_SLOTS = 8 };
typedef void (*dt_ctx_ext_free_fn)(dt_ctx *ctx, void *data);
typedef struct dt_ctx_ext {
  const void *key;              /* NULL: a free slot */
  void *data;
  dt_ctx_ext_free_fn free_fn;   /* may be NULL */
} dt_ctx_ext;

/* All mutable state of one rank. Created by a launcher (lib/launch/launch.h);
 * a program never shares one dt_ctx between two ranks. */
struct dt_ctx {
  int rank;                  /* rank in the world */
  int world_size;
  dt_comm *world;            /* the world communicator (owned by the launcher) */
  dt_device *device;         /* the compute device (owned by the launcher) */
  dt_mem_stats mem;
  dt_mem_cache mem_cache;
  dt_dev_mem dev_mem;        /* see dt_dev_mem */
  char phase[16];            /* what the rank is doing ("forward", ...); comm copies */
  char scope[DT_LABEL_LEN];  /* both labels into every ledger row; scope: the module the
                              * rank computes in (its fqn: forward, and each tape node's
                              * backward), or another caller's label */
  uint64_t label_gen;        /* bumped by every dt_ctx_set_phase / _scope (ledger caches) */
  dt_status last_status;
  char last_error[DT_ERRMSG_LEN]; /* "rank R: call: detail" */
  void *user;                /* free for the program */
  dt_ctx_ext ext[DT_CTX_EXT_SLOTS]; /* see dt_ctx_ext; use the functions below */
};

/* Initialises a context for rank `rank` of `world_size`; no allocation. */
void dt_ctx_init(dt_ctx *ctx, int rank, int world_size);
/* Frees what the context owns: every extension (newest first, while the
 * context and its allocator still work), then the cached host blocks. Not the
 * comm or the device, which the launcher owns. */
void dt_ctx_release(dt_ctx *ctx);

/* The data hung under key, NULL when none. */
void *dt_ctx_ext_get(const dt_ctx *ctx, const void *key);
/* Hangs data under key, freed by free_fn (may be NULL) at dt_ctx_release or
 * dt_ctx_ext_drop. DT_ERR_INVALID (recorded) for a NULL key or one already in
 * use; DT_ERR_NOMEM when all DT_CTX_EXT_SLOTS are taken. */
dt_status dt_ctx_ext_set(dt_ctx *ctx, const void *key, void *data, dt_ctx_ext_free_fn free_fn);
/* Frees the data under key with its destructor and clears the slot; no-op when none. */
void dt_ctx_ext_drop(dt_ctx *ctx, const void *key);

/* Installs m (copied) as the memory behind the rank's arrays of kind m->kind;
 * NULL uninstalls. */
void dt_ctx_set_dev_mem(dt_ctx *ctx, const dt_dev_mem *m);

/* Records an error as the rank's last error and returns `s`, so that
 *   return dt_error(ctx, DT_ERR_INVALID, "dt_mesh_create", "shape %d", n);
 * both records and propagates. `ctx` may be NULL (then it only returns). */
dt_status dt_error(dt_ctx *ctx, dt_status s, const char *call, const char *fmt, ...)
    DT_PRINTF(4, 5);
/* The last error message ("" when none). */
const char *dt_last_error(const dt_ctx *ctx);
void dt_error_clear(dt_ctx *ctx);

void dt_ctx_set_phase(dt_ctx *ctx, const char *phase);
void dt_ctx_set_scope(dt_ctx *ctx, const char *scope);

/* Check macros: evaluate once; on failure propagate (DT_CHECK) or jump (DT_CHECK_GOTO). */
#define DT_CHECK(expr)                   \
  do {                                   \
    dt_status dt_check_s_ = (expr);      \
    if (dt_check_s_ != DT_OK) return dt_check_s_; \
  } while (0)
#define DT_CHECK_GOTO(expr, st, label)   \
  do {                                   \
    (st) = (expr);                       \
    if ((st) != DT_OK) goto label;       \
  } while (0)

/* ---- allocator ---------------------------------------------------------- */

/* 64-byte aligned host memory, counted in ctx->mem. Returns NULL (and records
 * DT_ERR_NOMEM) on failure; bytes == 0 returns a valid unique pointer. */
void *dt_host_alloc(dt_ctx *ctx, size_t bytes);
void *dt_host_calloc(dt_ctx *ctx, size_t bytes);
void dt_host_free(dt_ctx *ctx, void *p); /* NULL is a no-op */
/* Returns every cached block to the system. */
void dt_host_cache_release(dt_ctx *ctx);
/* For device backends: account `bytes` more (or fewer) device bytes in ctx->mem
 * (current, peak and the call counts). */
void dt_mem_track_device(dt_ctx *ctx, size_t bytes, bool add);
/* A device's caching allocator now holds `bytes` (dt_mem_stats.dev_reserved); the
 * high-water mark follows. dt_mem_peak_restart on the device restarts it too. */
void dt_mem_track_reserved(dt_ctx *ctx, size_t bytes);
/* Notes that `bytes` more (add) or fewer of the memory in use (device or host)
 * are of kind `note` (DT_MEM_NOTE_*): called by the buffer's owner beside its
 * allocation and its free. */
void dt_mem_note(dt_ctx *ctx, bool device, int note, size_t bytes, bool add);
/* The high-water mark of the device (or host) counters with where it was reached
 * (p->bytes is the peak): read, set back (a saved one), and restarted at the bytes
 * in use now (a step's own peak apart from the run's). Programs move the peak only
 * through these, so the record stays the peak's. */
void dt_mem_peak_get(const dt_ctx *ctx, bool device, dt_mem_peak_at *out);
void dt_mem_peak_set(dt_ctx *ctx, bool device, const dt_mem_peak_at *p);
void dt_mem_peak_restart(dt_ctx *ctx, bool device);

/* ---- the compute ledger: every kernel the rank ran ------------------------- */

/* One kernel call (or every identical call of the rank's ledger: `calls`, in
 * the order each was first seen), as the device front or an op's kernel call
 * site saw it. FLOPs count a multiply-add
 * as two (GEMM: 2 m n k per matrix); bytes are what the kernel reads and
 * writes of its operands (no caches modelled). A real run and a shape-only run
 * (the meta device) write the same rows. */
typedef struct dt_kledger_row {
  char op[24];               /* "gemm", "rms_fwd", "adamw", ... */
  char phase[16];            /* ctx->phase at the call */
  char scope[DT_LABEL_LEN];  /* ctx->scope at the call (module fqn) */
  int dtype;                 /* dt_dtype of the operands */
  int64_t m, n, k, batch;    /* GEMM shape (0 for other kernels) */
  double flops;              /* per call */
  uint64_t bytes_read, bytes_written; /* per call */
  uint64_t calls;
} dt_kledger_row;

typedef struct dt_kledger {
  dt_kledger_row *rows;      /* rows[0..n), oldest first */
  size_t n, cap;
  bool enabled;
  uint64_t dropped_calls;    /* calls of rows a failed allocation could not append */
  size_t *index;             /* open-addressing index of rows by content (row + 1; 0: empty) */
  size_t index_cap;          /* a power of two, over twice n */
  uint64_t *hash;            /* hash[i]: rows[i]'s content hash (checked before comparing) */
  uint64_t label_gen;        /* the ctx->label_gen label_hash is of (0: none yet) */
  uint64_t label_hash;       /* hash of ctx's phase and scope at label_gen */
  uint64_t repeat;           /* every add counts its calls this many times (0 read as 1) */
} dt_kledger;

/* The rank's compute ledger (read only; never NULL; empty before the rank has
 * one). It records while enabled; the comm ledger's dt_ledger_init and
 * dt_ledger_enable (lib/comm) switch both ledgers together, so the two always
 * cover the same part of a step. */
const dt_kledger *dt_kledger_of(const dt_ctx *ctx);
/* Gives the rank its compute ledger, or sets `enabled` on the one it has. */
dt_status dt_kledger_init(dt_ctx *ctx, bool enabled);
void dt_kledger_clear(dt_ctx *ctx);
/* Appends *row (phase and scope are taken from ctx; calls from row, 0 read as
 * 1), merged into the row that equals it in everything but calls when there is
 * one (so a step's ledger has one row per distinct kernel, whatever its length). No-op when
 * the rank has no ledger or it is off; a failed allocation drops the row and
 * counts its calls in dropped_calls (the kernel itself never fails for the ledger). */
void dt_kledger_add(dt_ctx *ctx, const dt_kledger_row *row);
/* Sets how many times every following add counts its calls (r >= 1) and
 * returns the previous factor, to be set back. For a loop of calls that differ
 * only in their addresses on a device that does no arithmetic (dt_kernels.
 * shape_only): one pass recorded r times leaves the rows r passes would. */
uint64_t dt_kledger_set_repeat(dt_ctx *ctx, uint64_t r);
/* A non-GEMM kernel's row: op, dtype, FLOPs and bytes read / written. */
void dt_kledger_kernel(dt_ctx *ctx, const char *op, dt_dtype t, double flops, uint64_t bytes_read,
                       uint64_t bytes_written);

/* ---- local arrays -------------------------------------------------------- */

enum { DT_MAX_DIMS = 8 };

/* A contiguous row-major n-d tensor held by one rank. */
typedef struct dt_array {
  dt_dtype dtype;
  int ndim;                     /* 0 (a scalar) .. DT_MAX_DIMS */
  int64_t shape[DT_MAX_DIMS];
  int64_t numel;
  dt_device_kind dev;
  void *data;                   /* host or device pointer, per dev */
  bool owns;                    /* data is freed by dt_array_free */
} dt_array;

/* Allocates an uninitialised array: dev CPU from the host allocator, another
 * kind from the memory installed for it (ctx->dev_mem; DT_ERR_INVALID when
 * none is). */
dt_status dt_array_create(dt_ctx *ctx, dt_device_kind dev, dt_dtype dtype, int ndim,
                          const int64_t *shape, dt_array *out);
/* Wraps caller memory; dt_array_free will not free it. */
dt_status dt_array_wrap(dt_ctx *ctx, dt_device_kind dev, dt_dtype dtype, int ndim,
                        const int64_t *shape, void *data, dt_array *out);
void dt_array_free(dt_ctx *ctx, dt_array *a);
size_t dt_array_bytes(const dt_array *a);
/* Copies the box of sizes box[0..ndim) from host array src (shape src_shape)
 * at src_off into host array dst (shape dst_shape) at dst_off; es: element
 * bytes. Both contiguous row-major; the box must fit both (not checked). */
void dt_copy_box(size_t es, int ndim, void *dst, const int64_t *dst_shape, const int64_t *dst_off,
                 const void *src, const int64_t *src_shape, const int64_t *src_off,
                 const int64_t *box);
/* numel of a shape; -1 when a dim is negative or the product overflows. */
int64_t dt_shape_numel(int ndim, const int64_t *shape);

/* ---- counter-based RNG (Philox4x32-10) ------------------------------------ */

/* The value at global element `index` of the stream (seed, stream) depends on
 * nothing else, so any shard of a tensor is generated without the rest of it,
 * identically for every layout. */
double dt_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index);  /* [0, 1) */
double dt_rng_normal(uint64_t seed, uint64_t stream, uint64_t index);   /* N(0, 1) */
/* Raw Philox4x32-10 block for counter (index, stream) and key from seed. */
void dt_philox4x32(uint64_t seed, uint64_t stream, uint64_t index, uint32_t out[4]);

typedef enum dt_rng_dist { DT_RNG_UNIFORM = 0, DT_RNG_NORMAL = 1 } dt_rng_dist;

/* Fills n host elements of dtype: out[i] = a + b*u (uniform) or a + b*z (normal)
 * for element index first + i*stride. */
dt_status dt_rng_fill(dt_dtype dtype, void *out, int64_t n, uint64_t seed, uint64_t stream,
                      uint64_t first, uint64_t stride, dt_rng_dist dist, double a, double b);

/* Monotonic wall clock in seconds. */
double dt_now(void);

#ifdef __cplusplus
}
#endif
#endif
