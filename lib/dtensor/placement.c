/* lib/dtensor/placement.c: placements (parse, print, compare) and shard geometry.
 *
 * Pure functions, no communication: torch.chunk splitting (chunk = ceil(L/n),
 * short and empty shards at the end), nested sharding left to right, logical
 * shapes and padding, as torch/distributed/tensor/placement_types.py (Shard's
 * local_shard_size_and_offset, Shard._split_tensor) and _utils.py
 * (compute_local_shape_and_global_offset) define them. */
#include "config.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/dtensor.h"

dt_placement dt_shard(int dim) { return (dt_placement){.kind = DT_PL_SHARD, .dim = dim}; }
dt_placement dt_replicate(void) { return (dt_placement){.kind = DT_PL_REPLICATE}; }
dt_placement dt_partial(dt_reduce_op op) { return (dt_placement){.kind = DT_PL_PARTIAL, .op = op}; }

bool dt_placement_eq(dt_placement a, dt_placement b) {
  if (a.kind != b.kind) return false;
  if (a.kind == DT_PL_SHARD) return a.dim == b.dim;
  if (a.kind == DT_PL_PARTIAL) return a.op == b.op;
  return true;
}

static void set_err(char *err, size_t errn, const char *fmt, ...) DT_PRINTF(3, 4);
static void set_err(char *err, size_t errn, const char *fmt, ...) {
  if (!err || !errn) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errn, fmt, ap);
  va_end(ap);
}

/* Matches `word` at *p (case-sensitive), advancing past it. */
static bool eat(const char **p, const char *word) {
  size_t l = strlen(word);
  if (strncmp(*p, word, l)) return false;
  *p += l;
  return true;
}

static void skip_ws(const char **p) {
  while (isspace((unsigned char)**p)) (*p)++;
}

dt_status dt_placement_parse(const char *s, dt_placement *out, char *err, size_t errn) {
  if (!s) {
    set_err(err, errn, "empty placement%s", "");
    return DT_ERR_INVALID;
  }
  const char *p = s;
  skip_ws(&p);
  dt_placement pl;
  if (eat(&p, "Shard") || eat(&p, "S")) {
    skip_ws(&p);
    if (!eat(&p, "(")) goto bad;
    skip_ws(&p);
    if (eat(&p, "dim")) { /* Shard(dim=0) as PyTorch's repr writes it */
      skip_ws(&p);
      if (!eat(&p, "=")) goto bad;
      skip_ws(&p);
    }
    char *end;
    long d = strtol(p, &end, 10);
    if (end == p) goto bad;
    if (d < -DT_MAX_DIMS || d >= DT_MAX_DIMS) {
      set_err(err, errn, "'%s': shard dim %ld is out of range (tensors have at most %d dims)", s,
              d, DT_MAX_DIMS);
      return DT_ERR_INVALID;
    }
    p = end;
    skip_ws(&p);
    if (!eat(&p, ")")) goto bad;
    pl = dt_shard((int)d);
  } else if (eat(&p, "Replicate") || eat(&p, "R")) {
    skip_ws(&p);
    if (eat(&p, "(")) {
      skip_ws(&p);
      if (!eat(&p, ")")) goto bad;
    }
    pl = dt_replicate();
  } else if (eat(&p, "Partial") || eat(&p, "P")) {
    pl = dt_partial(DT_RED_SUM);
    skip_ws(&p);
    if (eat(&p, "(")) {
      skip_ws(&p);
      if (eat(&p, ")")) {
        /* Partial() is sum */
      } else {
        eat(&p, "reduce_op");
        skip_ws(&p);
        eat(&p, "=");
        skip_ws(&p);
        bool quoted = eat(&p, "\"") || eat(&p, "'");
        const char *w = p;
        while (isalpha((unsigned char)*p)) p++;
        char word[16];
        size_t l = (size_t)(p - w);
        if (l == 0 || l >= sizeof word) goto bad;
        memcpy(word, w, l);
        word[l] = '\0';
        dt_reduce_op op;
        if (dt_reduce_parse(word, &op) != DT_OK || op == DT_RED_PROD) {
          if (err && errn)
            snprintf(err, errn, "'%s': unknown Partial reduce op '%s' (expected sum, avg, max or min)",
                     s, word);
          return DT_ERR_INVALID;
        }
        pl.op = op;
        if (quoted && !(eat(&p, "\"") || eat(&p, "'"))) goto bad;
        skip_ws(&p);
        if (!eat(&p, ")")) goto bad;
      }
    }
  } else {
    goto bad;
  }
  skip_ws(&p);
  if (*p) goto bad;
  *out = pl;
  return DT_OK;
bad:
  set_err(err, errn, "'%s': expected a placement: S(d), R or P(sum|avg|max|min)", s);
  return DT_ERR_INVALID;
}

dt_status dt_placements_parse(const char *s, int max, dt_placement *out, int *n, char *err,
                              size_t errn) {
  *n = 0;
  if (!s) {
    set_err(err, errn, "empty placement list%s", "");
    return DT_ERR_INVALID;
  }
  const char *p = s;
  char tok[64];
  int k = 0;
  for (;;) {
    /* a token ends at a comma outside parentheses */
    const char *start = p;
    int depth = 0;
    while (*p && !(*p == ',' && depth == 0)) {
      if (*p == '(') depth++;
      else if (*p == ')') depth--;
      p++;
    }
    const char *end = p; /* surrounding whitespace does not count */
    while (start < end && isspace((unsigned char)*start)) start++;
    while (end > start && isspace((unsigned char)end[-1])) end--;
    size_t l = (size_t)(end - start);
    if (l >= sizeof tok) {
      if (err && errn) snprintf(err, errn, "'%s': placement %d is too long", s, k);
      return DT_ERR_INVALID;
    }
    memcpy(tok, start, l);
    tok[l] = '\0';
    if (k >= max) {
      if (err && errn) snprintf(err, errn, "'%s': more than %d placements", s, max);
      return DT_ERR_INVALID;
    }
    DT_CHECK(dt_placement_parse(tok, &out[k], err, errn));
    k++;
    if (!*p) break;
    p++; /* the comma */
  }
  *n = k;
  return DT_OK;
}

dt_status dt_placements_normalize(int n, dt_placement *pl, int ndim, char *err, size_t errn) {
  for (int i = 0; i < n; i++) { /* check all first: on error nothing changes */
    if (pl[i].kind != DT_PL_SHARD) continue;
    int d = pl[i].dim < 0 ? pl[i].dim + ndim : pl[i].dim;
    if (d < 0 || d >= ndim) {
      if (err && errn)
        snprintf(err, errn, "mesh dim %d: S(%d) is out of range for a tensor of %d dims", i,
                 pl[i].dim, ndim);
      return DT_ERR_INVALID;
    }
  }
  for (int i = 0; i < n; i++)
    if (pl[i].kind == DT_PL_SHARD && pl[i].dim < 0) pl[i].dim += ndim;
  return DT_OK;
}

int dt_placement_str(dt_placement p, char *buf, size_t n) {
  switch (p.kind) {
    case DT_PL_SHARD: return snprintf(buf, n, "S(%d)", p.dim);
    case DT_PL_PARTIAL: return snprintf(buf, n, "P(%s)", dt_reduce_name(p.op));
    default: return snprintf(buf, n, "R");
  }
}

int dt_placements_str(int n, const dt_placement *pl, char *buf, size_t bn) {
  int total = 0;
  if (bn) buf[0] = '\0';
  for (int i = 0; i < n; i++) {
    char one[24];
    dt_placement_str(pl[i], one, sizeof one);
    size_t used = (size_t)total < bn ? (size_t)total : bn;
    total += snprintf(buf + used, bn - used, "%s%s", i ? "," : "", one);
  }
  return total;
}

/* ---- geometry ---- */

void dt_chunk(int64_t L, int n, int k, int64_t *size, int64_t *offset) {
  if (n < 1) n = 1;
  int64_t c = (L + n - 1) / n; /* torch.chunk: ceil(L/n) per chunk */
  int64_t lo = (int64_t)k * c, hi = lo + c;
  if (lo > L) lo = L;
  if (hi > L) hi = L;
  if (size) *size = hi - lo;
  if (offset) *offset = lo;
}

int64_t dt_chunk_pad(int64_t L, int n, int k) {
  int64_t size;
  dt_chunk(L, n, k, &size, NULL);
  return (L + n - 1) / (n < 1 ? 1 : n) - size;
}

void dt_logical_shape(int ndim, const int64_t *gshape, const int *mesh_shape, const int *coords,
                      const dt_placement *pl, int upto, int64_t *out) {
  for (int d = 0; d < ndim; d++) out[d] = gshape[d];
  for (int i = 0; i < upto; i++) {
    if (pl[i].kind != DT_PL_SHARD) continue;
    int d = pl[i].dim;
    int64_t size;
    dt_chunk(out[d], mesh_shape[i], coords[i], &size, NULL);
    out[d] = size;
  }
}

void dt_local_shape_offset(int ndim, const int64_t *gshape, int mesh_ndim, const int *mesh_shape,
                           const int *coords, const dt_placement *pl, int64_t *lshape,
                           int64_t *goffset) {
  for (int d = 0; d < ndim; d++) {
    lshape[d] = gshape[d];
    goffset[d] = 0;
  }
  for (int i = 0; i < mesh_ndim; i++) {
    if (pl[i].kind != DT_PL_SHARD) continue;
    int d = pl[i].dim;
    int64_t size, off;
    dt_chunk(lshape[d], mesh_shape[i], coords[i], &size, &off);
    lshape[d] = size;
    goffset[d] += off;
  }
  /* an empty shard's offset is clamped to the dim's end, as torch.chunk */
  for (int d = 0; d < ndim; d++)
    if (goffset[d] > gshape[d]) goffset[d] = gshape[d];
}

int64_t dt_num_shards(int mesh_ndim, const int *mesh_shape, const dt_placement *pl) {
  int64_t n = 1;
  for (int i = 0; i < mesh_ndim; i++)
    if (pl[i].kind == DT_PL_SHARD) n *= mesh_shape[i];
  return n;
}
