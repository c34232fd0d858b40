/* lib/nn/safetensors.h: reading and writing the safetensors format
 * (huggingface/safetensors, README "Format"): 8 bytes N (u64 little-endian), N
 * bytes of a JSON header, then the byte buffer. The header maps each tensor name
 * to {"dtype": "F32", "shape": [..], "data_offsets": [BEGIN, END]} (offsets into
 * the byte buffer) and may hold "__metadata__": {string: string}. Tensors are
 * little-endian, row-major; the buffer is covered by the tensors exactly (no
 * holes, no overlap). The header is parsed with Jansson.
 *
 * A reader validates the whole header and the file's size when it opens the
 * file (DT_ERR_INVALID, "PATH: ..." naming what is wrong), so that a caller can
 * refuse a bad file before any work. A writer writes PATH.tmp and renames it
 * to PATH when every tensor is in: a failed or aborted write leaves no PATH
 * behind and an existing PATH untouched.
 */
#ifndef DT_SAFETENSORS_H
#define DT_SAFETENSORS_H

#include "../core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { DT_ST_NAME_LEN = 192, DT_ST_DTYPE_LEN = 12, DT_ST_MAX_DIMS = DT_MAX_DIMS };
/* Largest header a reader accepts (the reference implementation's limit). */
#define DT_ST_MAX_HEADER ((uint64_t)100000000)

typedef struct dt_st_tensor {
  char name[DT_ST_NAME_LEN];
  char dtype[DT_ST_DTYPE_LEN];     /* as the file spells it: "F32", "BF16", "I64", ... */
  int ndim;
  int64_t shape[DT_ST_MAX_DIMS];
  int64_t numel;
  uint64_t begin, end;             /* byte offsets into the byte buffer */
} dt_st_tensor;

typedef struct dt_st_file {
  int fd;
  char path[512];
  int n;                           /* tensors, in the buffer's order */
  dt_st_tensor *t;
  int n_meta;
  char **meta_key, **meta_val;     /* __metadata__ */
  uint64_t data_start;             /* 8 + N */
  uint64_t data_len;
} dt_st_file;

/* Opens and validates path: the header (JSON object, known dtypes, shapes,
 * offsets that match the sizes and tile the buffer, no duplicate names, a
 * string-only __metadata__) and the file size. On failure nothing is left open. */
dt_status dt_st_open(dt_ctx *ctx, const char *path, dt_st_file *out);
void dt_st_close(dt_ctx *ctx, dt_st_file *f);
/* The tensor of that name, or NULL. */
const dt_st_tensor *dt_st_find(const dt_st_file *f, const char *name);
/* The metadata value of key, or NULL. */
const char *dt_st_meta(const dt_st_file *f, const char *key);
/* Element size of a safetensors dtype ("F32": 4); 0 when unknown. */
size_t dt_st_dtype_size(const char *dtype);
/* The file dtype of a dt_dtype ("F32", "F64", "BF16", "I64"). */
const char *dt_st_dtype_of(dt_dtype t);
/* Reads rows rows[0..nrows) of t's dim 0 (a row: the product of the other dims;
 * a 0-d tensor is one row of one element), in that order, converted to `to`,
 * into out (nrows x row elements). Floats (F64, F32, BF16, F16) convert to F64
 * or F32 (rounded to nearest); I64 reads as I64; anything else is
 * DT_ERR_UNSUPPORTED. Consecutive rows are read in one call. */
dt_status dt_st_read_rows(dt_ctx *ctx, const dt_st_file *f, const dt_st_tensor *t,
                          const int64_t *rows, int64_t nrows, dt_dtype to, void *out);
/* All of t (rows 0..shape[0]). */
dt_status dt_st_read(dt_ctx *ctx, const dt_st_file *f, const dt_st_tensor *t, dt_dtype to,
                     void *out);

/* ---- writing ---- */

typedef struct dt_st_spec {
  const char *name;
  dt_dtype dtype;                  /* stored as: F32, F64, BF16 or I64 */
  int ndim;
  const int64_t *shape;
} dt_st_spec;

typedef struct dt_st_writer dt_st_writer;

/* Starts PATH.tmp with the header of the n tensors (in this order) and the
 * metadata pairs (NULL/0: none). */
dt_status dt_st_write_begin(dt_ctx *ctx, const char *path, int n, const dt_st_spec *specs,
                            int n_meta, const char *const *keys, const char *const *vals,
                            dt_st_writer **out);
/* The next tensor's data, given in dtype `from` (host, numel of its spec);
 * converted to the spec's dtype (floats to floats, rounded to nearest even;
 * I64 to I64 only). */
dt_status dt_st_write_next(dt_ctx *ctx, dt_st_writer *w, const void *data, dt_dtype from);
/* Checks that every tensor was written, flushes and renames PATH.tmp to PATH.
 * Frees w whatever happens. */
dt_status dt_st_write_end(dt_ctx *ctx, dt_st_writer *w);
/* Removes PATH.tmp and frees w (NULL: nothing). */
void dt_st_write_abort(dt_ctx *ctx, dt_st_writer *w);

#ifdef __cplusplus
}
#endif
#endif
