/* lib/nn/safetensors.c: the safetensors reader and writer (format: the header
 * comment of safetensors.h; huggingface/safetensors README "Format" and
 * safetensors/src/tensor.rs, Metadata::validate, for what a valid file is).
 *
 * Validation on open, as the reference implementation does it: the header size
 * fits the file and is at most 100 MB; the header is a JSON object (Jansson,
 * duplicate keys rejected) whose first byte is '{'; every entry but
 * __metadata__ has exactly a known dtype, a shape of non-negative integers and
 * data_offsets [begin, end] with end - begin = numel x element size; sorted by
 * begin, the entries tile [0, data_len) with no hole or overlap, and data_len
 * is the rest of the file. Data is little-endian (a big-endian host is refused).
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nn/safetensors.h"

typedef struct st_dtype {
  const char *name;
  size_t size;
} st_dtype;

/* Every dtype of the format (safetensors/src/tensor.rs, enum Dtype). */
static const st_dtype ST_DTYPES[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1},
    {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},     {"U32", 4},
    {"F32", 4},  {"C64", 8}, {"F64", 8}, {"I64", 8},     {"U64", 8},
};

size_t dt_st_dtype_size(const char *dtype) {
  for (size_t i = 0; dtype && i < sizeof ST_DTYPES / sizeof ST_DTYPES[0]; i++)
    if (!strcmp(dtype, ST_DTYPES[i].name)) return ST_DTYPES[i].size;
  return 0;
}

const char *dt_st_dtype_of(dt_dtype t) {
  switch (t) {
  case DT_F32: return "F32";
  case DT_F64: return "F64";
  case DT_BF16: return "BF16";
  case DT_I64: return "I64";
  default: return NULL;
  }
}

static bool little_endian(void) {
  const uint16_t one = 1;
  unsigned char b;
  memcpy(&b, &one, 1);
  return b == 1;
}

static uint64_t le64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

/* pread of exactly n bytes at off; false on a short read or an error. */
static bool read_at(int fd, void *buf, size_t n, uint64_t off) {
  unsigned char *p = buf;
  while (n) {
    ssize_t r = pread(fd, p, n, (off_t)off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= (size_t)r;
    off += (uint64_t)r;
  }
  return true;
}

static void file_free(dt_ctx *ctx, dt_st_file *f) {
  for (int i = 0; i < f->n_meta; i++) {
    if (f->meta_key) dt_host_free(ctx, f->meta_key[i]);
    if (f->meta_val) dt_host_free(ctx, f->meta_val[i]);
  }
  dt_host_free(ctx, f->meta_key);
  dt_host_free(ctx, f->meta_val);
  dt_host_free(ctx, f->t);
  if (f->fd >= 0) close(f->fd);
  memset(f, 0, sizeof *f);
  f->fd = -1;
}

void dt_st_close(dt_ctx *ctx, dt_st_file *f) {
  if (f) file_free(ctx, f);
}

static char *dup_str(dt_ctx *ctx, const char *s) {
  size_t n = strlen(s) + 1;
  char *d = dt_host_alloc(ctx, n);
  if (d) memcpy(d, s, n);
  return d;
}

static int by_begin(const void *a, const void *b) {
  const dt_st_tensor *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return x->end < y->end ? -1 : x->end > y->end;
}

/* One entry of the header into t; false with a reason in why. */
static bool parse_entry(const char *name, json_t *v, dt_st_tensor *t, char *why, size_t whyn) {
  if (strlen(name) == 0 || strlen(name) >= DT_ST_NAME_LEN) {
    snprintf(why, whyn, "tensor name '%.40s...' is empty or longer than %d bytes", name,
             DT_ST_NAME_LEN - 1);
    return false;
  }
  snprintf(t->name, sizeof t->name, "%s", name);
  if (!json_is_object(v) || json_object_size(v) != 3) {
    snprintf(why, whyn, "'%s': expected an object of dtype, shape and data_offsets", name);
    return false;
  }
  json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
         *off = json_object_get(v, "data_offsets");
  if (!json_is_string(dt) || !json_is_array(sh) || !json_is_array(off)) {
    snprintf(why, whyn, "'%s': expected dtype (a string), shape and data_offsets (arrays)", name);
    return false;
  }
  size_t es = dt_st_dtype_size(json_string_value(dt));
  if (!es) {
    snprintf(why, whyn, "'%s': unknown dtype '%.16s'", name, json_string_value(dt));
    return false;
  }
  snprintf(t->dtype, sizeof t->dtype, "%s", json_string_value(dt));
  if (json_array_size(sh) > DT_ST_MAX_DIMS) {
    snprintf(why, whyn, "'%s': %zu dims (at most %d)", name, json_array_size(sh), DT_ST_MAX_DIMS);
    return false;
  }
  t->ndim = (int)json_array_size(sh);
  for (int d = 0; d < t->ndim; d++) {
    json_t *x = json_array_get(sh, (size_t)d);
    if (!json_is_integer(x) || json_integer_value(x) < 0) {
      snprintf(why, whyn, "'%s': shape[%d] is not a non-negative integer", name, d);
      return false;
    }
    t->shape[d] = json_integer_value(x);
  }
  t->numel = dt_shape_numel(t->ndim, t->shape);
  if (t->numel < 0 || (uint64_t)t->numel > UINT64_MAX / es) {
    snprintf(why, whyn, "'%s': shape overflows", name);
    return false;
  }
  json_t *b = json_array_get(off, 0), *e = json_array_get(off, 1);
  if (json_array_size(off) != 2 || !json_is_integer(b) || !json_is_integer(e) ||
      json_integer_value(b) < 0 || json_integer_value(e) < json_integer_value(b)) {
    snprintf(why, whyn, "'%s': data_offsets must be [begin, end] with 0 <= begin <= end", name);
    return false;
  }
  t->begin = (uint64_t)json_integer_value(b);
  t->end = (uint64_t)json_integer_value(e);
  if (t->end - t->begin != (uint64_t)t->numel * es) {
    snprintf(why, whyn, "'%s': data_offsets [%llu, %llu] hold %llu bytes; %s %lld elements need "
             "%llu", name, (unsigned long long)t->begin, (unsigned long long)t->end,
             (unsigned long long)(t->end - t->begin), t->dtype, (long long)t->numel,
             (unsigned long long)((uint64_t)t->numel * es));
    return false;
  }
  return true;
}

static bool parse_meta(dt_ctx *ctx, json_t *m, dt_st_file *f, char *why, size_t whyn) {
  if (!json_is_object(m)) {
    snprintf(why, whyn, "__metadata__ is not an object");
    return false;
  }
  size_t n = json_object_size(m);
  f->meta_key = dt_host_calloc(ctx, (n ? n : 1) * sizeof(char *));
  f->meta_val = dt_host_calloc(ctx, (n ? n : 1) * sizeof(char *));
  if (!f->meta_key || !f->meta_val) {
    snprintf(why, whyn, "no memory");
    return false;
  }
  const char *k;
  json_t *v;
  json_object_foreach(m, k, v) {
    if (!json_is_string(v)) {
      snprintf(why, whyn, "__metadata__ '%.64s' is not a string", k);
      return false;
    }
    f->meta_key[f->n_meta] = dup_str(ctx, k);
    f->meta_val[f->n_meta] = dup_str(ctx, json_string_value(v));
    f->n_meta++;
    if (!f->meta_key[f->n_meta - 1] || !f->meta_val[f->n_meta - 1]) {
      snprintf(why, whyn, "no memory");
      return false;
    }
  }
  return true;
}

/* The header into f (tensors sorted by offset, tiling the buffer); false with why. */
static bool parse_header(dt_ctx *ctx, const char *hdr, size_t n, dt_st_file *f, char *why,
                         size_t whyn) {
  if (n == 0 || hdr[0] != '{') {
    snprintf(why, whyn, "header does not start with '{'");
    return false;
  }
  json_error_t je;
  json_t *root = json_loadb(hdr, n, JSON_REJECT_DUPLICATES, &je);
  if (!root) {
    snprintf(why, whyn, "header JSON, byte %d: %s", je.position, je.text);
    return false;
  }
  bool ok = json_is_object(root);
  if (!ok) snprintf(why, whyn, "header is not a JSON object");
  size_t cap = json_object_size(root);
  if (ok && !(f->t = dt_host_calloc(ctx, (cap ? cap : 1) * sizeof *f->t))) {
    snprintf(why, whyn, "no memory");
    ok = false;
  }
  const char *k;
  json_t *v;
  json_object_foreach(root, k, v) {
    if (!ok) break;
    if (!strcmp(k, "__metadata__")) ok = parse_meta(ctx, v, f, why, whyn);
    else if ((ok = parse_entry(k, v, &f->t[f->n], why, whyn))) f->n++;
  }
  json_decref(root);
  if (!ok) return false;
  qsort(f->t, (size_t)f->n, sizeof *f->t, by_begin);
  uint64_t at = 0;
  for (int i = 0; i < f->n; i++) {
    if (f->t[i].begin != at) {
      snprintf(why, whyn, "'%s' starts at byte %llu of the data, expected %llu (%s)", f->t[i].name,
               (unsigned long long)f->t[i].begin, (unsigned long long)at,
               f->t[i].begin > at ? "a hole before it" : "it overlaps the previous tensor");
      return false;
    }
    at = f->t[i].end;
  }
  if (at != f->data_len) {
    snprintf(why, whyn, "the tensors cover %llu bytes of data; the file holds %llu after the "
             "header (truncated or padded)", (unsigned long long)at,
             (unsigned long long)f->data_len);
    return false;
  }
  return true;
}

dt_status dt_st_open(dt_ctx *ctx, const char *path, dt_st_file *out) {
  static const char WHO[] = "dt_st_open";
  if (!path || !out) return dt_error(ctx, DT_ERR_INVALID, WHO, "NULL argument");
  memset(out, 0, sizeof *out);
  out->fd = -1;
  if (!little_endian())
    return dt_error(ctx, DT_ERR_UNSUPPORTED, WHO, "%s: a big-endian host cannot read it", path);
  dt_st_file f;
  memset(&f, 0, sizeof f);
  snprintf(f.path, sizeof f.path, "%s", path);
  f.fd = open(path, O_RDONLY);
  if (f.fd < 0) return dt_error(ctx, DT_ERR_IO, WHO, "%s: %s", path, strerror(errno));
  struct stat st;
  unsigned char n8[8];
  char why[320] = "";
  char *hdr = NULL;
  dt_status s = DT_ERR_INVALID;
  if (fstat(f.fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    snprintf(why, sizeof why, "not a regular file");
  } else if (st.st_size < 8 || !read_at(f.fd, n8, 8, 0)) {
    snprintf(why, sizeof why, "%lld bytes: too short for the 8-byte header size",
             (long long)st.st_size);
  } else {
    uint64_t n = le64(n8), size = (uint64_t)st.st_size;
    if (n > DT_ST_MAX_HEADER || n > size - 8) {
      snprintf(why, sizeof why, "header size %llu does not fit the file (%llu bytes; at most %llu)",
               (unsigned long long)n, (unsigned long long)size,
               (unsigned long long)DT_ST_MAX_HEADER);
    } else if (!(hdr = dt_host_alloc(ctx, n ? n : 1))) {
      s = DT_ERR_NOMEM;
      snprintf(why, sizeof why, "no memory for a %llu-byte header", (unsigned long long)n);
    } else if (!read_at(f.fd, hdr, n, 8)) {
      s = DT_ERR_IO;
      snprintf(why, sizeof why, "reading the header: %s", strerror(errno));
    } else {
      f.data_start = 8 + n;
      f.data_len = size - 8 - n;
      if (parse_header(ctx, hdr, n, &f, why, sizeof why)) s = DT_OK;
    }
  }
  dt_host_free(ctx, hdr);
  if (s != DT_OK) {
    file_free(ctx, &f);
    return dt_error(ctx, s, WHO, "%s: %s", path, why);
  }
  *out = f;
  return DT_OK;
}

const dt_st_tensor *dt_st_find(const dt_st_file *f, const char *name) {
  for (int i = 0; f && name && i < f->n; i++)
    if (!strcmp(f->t[i].name, name)) return &f->t[i];
  return NULL;
}

const char *dt_st_meta(const dt_st_file *f, const char *key) {
  for (int i = 0; f && key && i < f->n_meta; i++)
    if (!strcmp(f->meta_key[i], key)) return f->meta_val[i];
  return NULL;
}

/* IEEE binary16 to float (subnormals, infinities and NaN included). */
static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | man << 13;
  } else if (exp) {
    bits = sign | (exp + 112) << 23 | man << 13;
  } else if (!man) {
    bits = sign;
  } else { /* subnormal: normalise */
    int e = -1;
    do {
      e++;
      man <<= 1;
    } while (!(man & 0x400));
    bits = sign | (uint32_t)(112 - e) << 23 | (man & 0x3ff) << 13;
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

/* n elements of file dtype src (raw little-endian) to `to`. */
static bool convert_in(const char *src, const unsigned char *in, int64_t n, dt_dtype to,
                       void *out) {
  if (!strcmp(src, "I64") || to == DT_I64) {
    if (strcmp(src, "I64") || to != DT_I64) return false;
    memcpy(out, in, (size_t)n * 8);
    return true;
  }
  if (to != DT_F32 && to != DT_F64) return false;
  for (int64_t i = 0; i < n; i++) {
    double v;
    if (!strcmp(src, "F64")) {
      memcpy(&v, in + 8 * i, 8);
    } else if (!strcmp(src, "F32")) {
      float x;
      memcpy(&x, in + 4 * i, 4);
      v = x;
    } else if (!strcmp(src, "BF16")) {
      dt_bf16 h;
      memcpy(&h.bits, in + 2 * i, 2);
      v = dt_bf16_to_f32(h);
    } else if (!strcmp(src, "F16")) {
      uint16_t h;
      memcpy(&h, in + 2 * i, 2);
      v = f16_to_f32(h);
    } else {
      return false;
    }
    if (to == DT_F64) ((double *)out)[i] = v;
    else ((float *)out)[i] = (float)v;
  }
  return true;
}

dt_status dt_st_read_rows(dt_ctx *ctx, const dt_st_file *f, const dt_st_tensor *t,
                          const int64_t *rows, int64_t nrows, dt_dtype to, void *out) {
  static const char WHO[] = "dt_st_read_rows";
  if (!f || !t || (nrows && (!rows || !out)))
    return dt_error(ctx, DT_ERR_INVALID, WHO, "NULL argument");
  const size_t es = dt_st_dtype_size(t->dtype), os = dt_dtype_size(to);
  const int64_t nr = t->ndim ? t->shape[0] : 1;
  const int64_t row = nr ? t->numel / nr : 0;
  unsigned char probe[8] = {0};
  if (!convert_in(t->dtype, probe, 1, to, probe))
    return dt_error(ctx, DT_ERR_UNSUPPORTED, WHO, "%s: '%s' is %s; it cannot be read as %s",
                    f->path, t->name, t->dtype, dt_dtype_name(to));
  enum { CHUNK = 1 << 20 };
  unsigned char *buf = dt_host_alloc(ctx, CHUNK);
  if (!buf) return dt_error(ctx, DT_ERR_NOMEM, WHO, "no memory");
  dt_status s = DT_OK;
  for (int64_t i = 0; i < nrows && s == DT_OK;) {
    if (rows[i] < 0 || rows[i] >= nr) {
      s = dt_error(ctx, DT_ERR_INVALID, WHO, "%s: '%s' has %lld rows; row %lld asked", f->path,
                   t->name, (long long)nr, (long long)rows[i]);
      break;
    }
    int64_t k = 1; /* a run of consecutive rows */
    while (i + k < nrows && rows[i + k] == rows[i] + k) k++;
    int64_t done = 0, total = k * row;
    uint64_t base = f->data_start + t->begin + (uint64_t)rows[i] * (uint64_t)row * es;
    while (done < total) {
      int64_t m = total - done;
      if ((uint64_t)m * es > CHUNK) m = (int64_t)(CHUNK / es);
      if (!read_at(f->fd, buf, (size_t)m * es, base + (uint64_t)done * es)) {
        s = dt_error(ctx, DT_ERR_IO, WHO, "%s: reading '%s': %s", f->path, t->name,
                     errno ? strerror(errno) : "file shorter than its header says");
        break;
      }
      convert_in(t->dtype, buf, m, to, (char *)out + (size_t)(i * row + done) * os);
      done += m;
    }
    i += k;
  }
  dt_host_free(ctx, buf);
  return s;
}

dt_status dt_st_read(dt_ctx *ctx, const dt_st_file *f, const dt_st_tensor *t, dt_dtype to,
                     void *out) {
  if (!t) return dt_error(ctx, DT_ERR_INVALID, "dt_st_read", "NULL tensor");
  const int64_t nr = t->ndim ? t->shape[0] : 1;
  int64_t *rows = dt_host_alloc(ctx, (size_t)(nr ? nr : 1) * sizeof *rows);
  if (!rows) return dt_error(ctx, DT_ERR_NOMEM, "dt_st_read", "no memory");
  for (int64_t i = 0; i < nr; i++) rows[i] = i;
  dt_status s = dt_st_read_rows(ctx, f, t, rows, nr, to, out);
  dt_host_free(ctx, rows);
  return s;
}

/* ---- writing ---- */

struct dt_st_writer {
  FILE *fp;
  char path[512], tmp[520];
  int n, next;
  dt_dtype *dtype;
  int64_t *numel;
};

void dt_st_write_abort(dt_ctx *ctx, dt_st_writer *w) {
  if (!w) return;
  if (w->fp) fclose(w->fp);
  unlink(w->tmp);
  dt_host_free(ctx, w->dtype);
  dt_host_free(ctx, w->numel);
  dt_host_free(ctx, w);
}

dt_status dt_st_write_begin(dt_ctx *ctx, const char *path, int n, const dt_st_spec *specs,
                            int n_meta, const char *const *keys, const char *const *vals,
                            dt_st_writer **out) {
  static const char WHO[] = "dt_st_write_begin";
  if (!path || !out || n < 0 || (n && !specs) || n_meta < 0 || (n_meta && (!keys || !vals)))
    return dt_error(ctx, DT_ERR_INVALID, WHO, "NULL or negative argument");
  *out = NULL;
  if (!little_endian())
    return dt_error(ctx, DT_ERR_UNSUPPORTED, WHO, "%s: a big-endian host cannot write it", path);
  if (strlen(path) >= sizeof((dt_st_writer *)0)->path)
    return dt_error(ctx, DT_ERR_INVALID, WHO, "path too long: %s", path);
  json_t *root = json_object();
  dt_st_writer *w = dt_host_calloc(ctx, sizeof *w);
  if (w) {
    w->dtype = dt_host_calloc(ctx, (size_t)(n ? n : 1) * sizeof *w->dtype);
    w->numel = dt_host_calloc(ctx, (size_t)(n ? n : 1) * sizeof *w->numel);
  }
  dt_status s = root && w && w->dtype && w->numel ? DT_OK
                                                  : dt_error(ctx, DT_ERR_NOMEM, WHO, "no memory");
  uint64_t at = 0;
  if (s == DT_OK && n_meta) {
    json_t *m = json_object();
    for (int i = 0; m && i < n_meta; i++) json_object_set_new(m, keys[i], json_string(vals[i]));
    if (!m || json_object_set_new(root, "__metadata__", m))
      s = dt_error(ctx, DT_ERR_INVALID, WHO, "metadata (not UTF-8?)");
  }
  for (int i = 0; s == DT_OK && i < n; i++) {
    const dt_st_spec *sp = &specs[i];
    const char *dn = dt_st_dtype_of(sp->dtype);
    int64_t numel = dt_shape_numel(sp->ndim, sp->shape);
    if (!sp->name || !sp->name[0] || strlen(sp->name) >= DT_ST_NAME_LEN || !dn || numel < 0 ||
        sp->ndim < 0 || sp->ndim > DT_ST_MAX_DIMS || !strcmp(sp->name, "__metadata__") ||
        json_object_get(root, sp->name)) {
      s = dt_error(ctx, DT_ERR_INVALID, WHO, "%s: tensor %d ('%s'): bad or repeated name, dtype "
                   "or shape", path, i, sp->name ? sp->name : "");
      break;
    }
    json_t *shape = json_array(), *e = json_object();
    for (int d = 0; d < sp->ndim; d++) json_array_append_new(shape, json_integer(sp->shape[d]));
    uint64_t bytes = (uint64_t)numel * dt_dtype_size(sp->dtype);
    json_object_set_new(e, "dtype", json_string(dn));
    json_object_set_new(e, "shape", shape);
    json_object_set_new(e, "data_offsets",
                        json_pack("[II]", (json_int_t)at, (json_int_t)(at + bytes)));
    if (json_object_set_new(root, sp->name, e)) {
      s = dt_error(ctx, DT_ERR_INVALID, WHO, "%s: tensor name '%s' (not UTF-8?)", path, sp->name);
      break;
    }
    at += bytes;
    w->dtype[i] = sp->dtype;
    w->numel[i] = numel;
  }
  char *hdr = s == DT_OK ? json_dumps(root, JSON_COMPACT) : NULL;
  json_decref(root);
  if (s == DT_OK && !hdr) s = dt_error(ctx, DT_ERR_NOMEM, WHO, "no memory for the header");
  if (s == DT_OK) {
    w->n = n;
    snprintf(w->path, sizeof w->path, "%s", path);
    snprintf(w->tmp, sizeof w->tmp, "%s.tmp", path);
    w->fp = fopen(w->tmp, "wb");
    if (!w->fp) s = dt_error(ctx, DT_ERR_IO, WHO, "%s: %s", w->tmp, strerror(errno));
  }
  if (s == DT_OK) {
    /* padded with spaces so that the data starts 8-byte aligned, as the reference
     * implementation writes it */
    size_t len = strlen(hdr), pad = (8 - len % 8) % 8;
    unsigned char n8[8];
    for (int i = 0; i < 8; i++) n8[i] = (unsigned char)((uint64_t)(len + pad) >> (8 * i));
    if (fwrite(n8, 1, 8, w->fp) != 8 || fwrite(hdr, 1, len, w->fp) != len ||
        fwrite("        ", 1, pad, w->fp) != pad)
      s = dt_error(ctx, DT_ERR_IO, WHO, "%s: %s", w->tmp, strerror(errno));
  }
  free(hdr);
  if (s != DT_OK) {
    dt_st_write_abort(ctx, w);
    return s;
  }
  *out = w;
  return DT_OK;
}

dt_status dt_st_write_next(dt_ctx *ctx, dt_st_writer *w, const void *data, dt_dtype from) {
  static const char WHO[] = "dt_st_write_next";
  if (!w || (!data && w->next < w->n && w->numel[w->next]))
    return dt_error(ctx, DT_ERR_INVALID, WHO, "NULL argument");
  if (w->next >= w->n)
    return dt_error(ctx, DT_ERR_INVALID, WHO, "%s: all %d tensors are written", w->path, w->n);
  const dt_dtype to = w->dtype[w->next];
  const int64_t n = w->numel[w->next];
  const bool fl_from = from == DT_F32 || from == DT_F64 || from == DT_BF16,
             fl_to = to == DT_F32 || to == DT_F64 || to == DT_BF16;
  if (!((from == DT_I64 && to == DT_I64) || (fl_from && fl_to)))
    return dt_error(ctx, DT_ERR_UNSUPPORTED, WHO, "%s: tensor %d: %s data for a %s tensor",
                    w->path, w->next, dt_dtype_name(from), dt_dtype_name(to));
  bool ok = true;
  if (from == to) {
    ok = fwrite(data, dt_dtype_size(to), (size_t)n, w->fp) == (size_t)n;
  } else {
    enum { CHUNK = 4096 };
    unsigned char buf[CHUNK * 8];
    for (int64_t i = 0; ok && i < n; i += CHUNK) {
      int64_t m = n - i < CHUNK ? n - i : CHUNK;
      for (int64_t j = 0; j < m; j++) {
        double v = from == DT_F64   ? ((const double *)data)[i + j]
                   : from == DT_F32 ? ((const float *)data)[i + j]
                                    : dt_bf16_to_f32(((const dt_bf16 *)data)[i + j]);
        if (to == DT_F64) {
          memcpy(buf + 8 * j, &v, 8);
        } else if (to == DT_F32) {
          float x = (float)v;
          memcpy(buf + 4 * j, &x, 4);
        } else { /* f64 -> f32 -> bf16: the f32 rounding never changes the bf16 result
                  * except on exact ties of the second rounding */
          dt_bf16 h = dt_f32_to_bf16((float)v);
          memcpy(buf + 2 * j, &h.bits, 2);
        }
      }
      ok = fwrite(buf, dt_dtype_size(to), (size_t)m, w->fp) == (size_t)m;
    }
  }
  if (!ok) return dt_error(ctx, DT_ERR_IO, WHO, "%s: %s", w->tmp, strerror(errno));
  w->next++;
  return DT_OK;
}

dt_status dt_st_write_end(dt_ctx *ctx, dt_st_writer *w) {
  static const char WHO[] = "dt_st_write_end";
  if (!w) return dt_error(ctx, DT_ERR_INVALID, WHO, "NULL writer");
  dt_status s = DT_OK;
  if (w->next != w->n)
    s = dt_error(ctx, DT_ERR_INVALID, WHO, "%s: %d of %d tensors written", w->path, w->next, w->n);
  else if (fflush(w->fp) != 0 || fsync(fileno(w->fp)) != 0)
    s = dt_error(ctx, DT_ERR_IO, WHO, "%s: %s", w->tmp, strerror(errno));
  int rc = fclose(w->fp);
  w->fp = NULL;
  if (s == DT_OK && rc != 0) s = dt_error(ctx, DT_ERR_IO, WHO, "%s: %s", w->tmp, strerror(errno));
  if (s == DT_OK && rename(w->tmp, w->path) != 0)
    s = dt_error(ctx, DT_ERR_IO, WHO, "%s: %s", w->path, strerror(errno));
  if (s != DT_OK) {
    dt_st_write_abort(ctx, w);
    return s;
  }
  dt_host_free(ctx, w->dtype);
  dt_host_free(ctx, w->numel);
  dt_host_free(ctx, w);
  return DT_OK;
}
