/* bench/harness/hardware.c: the hardware file reader and the unit costs of
 * bench/harness/hardware.h. The format is documented in results/hardware/README.md:
 *
 *   key = value            # citation
 *   source.key = citation  (instead of the comment)
 *
 * Every numeric key must carry a citation (its trailing comment, or a
 * source.KEY line): a number with none is a load error, so no file ships an
 * uncited number. Units are in the key's suffix (_tflops, _gb, _gib, _tbps,
 * _gbps = gigabytes per second, _us).
 *
 * The collective model is NCCL's own tuning model reduced to its skeleton
 * (NVIDIA/nccl src/graph/tuning.cc, ncclTopoTuneModel; bus factors as in
 * NVIDIA/nccl-tests doc/PERFORMANCE.md), see coll_time below.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor.h"
#include "datadir.h"
#include "hardware.h"

/* ---- the keys ----------------------------------------------------------------------- */

typedef enum slot {
  S_PEAK_BF16, S_PEAK_FP8, S_PEAK_F32, /* = SB_HW_* order */
  S_HBM, S_HBM_BW, S_HBM_EFF, S_GPN, S_INTRA_BW, S_INTRA_LAT, S_INTER_BW, S_INTER_LAT,
  S_BASE_LAT, S_GEMM_BF16, S_GEMM_FP8, S_GEMM_F32, S_ALLOC, S_RESERVED, S_DESC,
  S_ATTN_BF16, S_ATTN_FP8, S_ATTN_F32, /* = SB_HW_* order */
  S_KERNEL, S_SHARED, S_NSLOTS
} slot;

/* How a value is checked: */
typedef enum rule {
  R_NONNEG,   /* >= 0 (a peak: 0 = not rated; a latency) */
  R_POS,      /* > 0 (a capacity, a bandwidth) */
  R_EFF,      /* in (0, 1] */
  R_FRAC,     /* in [0, 1) */
  R_COUNT,    /* an integer >= 1 */
  R_GEMM,     /* FLOPS:EFF points */
  R_TEXT      /* free text, no citation needed */
} rule;

typedef struct keydef {
  const char *key;
  slot s;
  double scale; /* value x scale = SI units (bytes, B/s, FLOP/s, s) */
  rule r;
  bool required;
} keydef;

static const double GIB = 1073741824.0;

static const keydef KEYS[] = {
    {"peak_bf16_tflops", S_PEAK_BF16, 1e12, R_NONNEG, false},
    {"peak_bf16_gflops", S_PEAK_BF16, 1e9, R_NONNEG, false},
    {"peak_fp8_tflops", S_PEAK_FP8, 1e12, R_NONNEG, false},
    {"peak_fp8_gflops", S_PEAK_FP8, 1e9, R_NONNEG, false},
    {"peak_f32_tflops", S_PEAK_F32, 1e12, R_NONNEG, false},
    {"peak_f32_gflops", S_PEAK_F32, 1e9, R_NONNEG, false},
    {"hbm_gb", S_HBM, 1e9, R_POS, true},
    {"hbm_gib", S_HBM, GIB, R_POS, true},
    {"hbm_tbps", S_HBM_BW, 1e12, R_POS, true},
    {"hbm_gbps", S_HBM_BW, 1e9, R_POS, true},
    {"hbm_eff", S_HBM_EFF, 1, R_EFF, true},
    {"gpus_per_node", S_GPN, 1, R_COUNT, true},
    {"intra_gbps", S_INTRA_BW, 1e9, R_POS, true},
    {"intra_lat_us", S_INTRA_LAT, 1e-6, R_NONNEG, true},
    {"inter_gbps", S_INTER_BW, 1e9, R_POS, true},
    {"inter_lat_us", S_INTER_LAT, 1e-6, R_NONNEG, true},
    {"coll_base_lat_us", S_BASE_LAT, 1e-6, R_NONNEG, true},
    {"gemm_bf16", S_GEMM_BF16, 1, R_GEMM, false},
    {"gemm_fp8", S_GEMM_FP8, 1, R_GEMM, false},
    {"gemm_f32", S_GEMM_F32, 1, R_GEMM, false},
    {"alloc_overhead", S_ALLOC, 1, R_FRAC, true},
    {"reserved_gb", S_RESERVED, 1e9, R_NONNEG, true},
    {"reserved_gib", S_RESERVED, GIB, R_NONNEG, true},
    {"description", S_DESC, 1, R_TEXT, false},
    {"attn_bf16_eff", S_ATTN_BF16, 1, R_EFF, false},
    {"attn_fp8_eff", S_ATTN_FP8, 1, R_EFF, false},
    {"attn_f32_eff", S_ATTN_F32, 1, R_EFF, false},
    {"kernel_us", S_KERNEL, 1e-6, R_NONNEG, false},
    {"shared_cores", S_SHARED, 1, R_COUNT, false},
};
enum { NKEYS = sizeof KEYS / sizeof KEYS[0] };

static const char *const DTYPE_NAMES[SB_HW_NDTYPES] = {"bf16", "fp8", "f32"};

static const keydef *find_key(const char *k) {
  for (int i = 0; i < NKEYS; i++)
    if (!strcmp(KEYS[i].key, k)) return &KEYS[i];
  return NULL;
}

/* The first key of a slot, for messages about a missing one ("hbm_gb or hbm_gib"). */
static void slot_names(slot s, char *out, size_t n) {
  out[0] = '\0';
  size_t used = 0;
  for (int i = 0; i < NKEYS; i++) {
    if (KEYS[i].s != s) continue;
    int w = snprintf(out + used, n - used, "%s'%s'", used ? " or " : "", KEYS[i].key);
    if (w < 0 || (size_t)w >= n - used) return;
    used += (size_t)w;
  }
}

/* ---- the reader ---------------------------------------------------------------------- */

typedef struct pstate {
  const char *path;
  char *err;
  size_t errn;
  int set_line[S_NSLOTS];        /* line a slot was set on, 0: not set */
  const keydef *set_key[S_NSLOTS];
  bool cited[S_NSLOTS];          /* a trailing comment or a source.KEY line */
  int source_line[S_NSLOTS];     /* line of its source.KEY, 0: none */
  const keydef *source_key[S_NSLOTS];
} pstate;

static int perr(pstate *p, int line, const char *fmt, ...) DT_PRINTF(3, 4);
static int perr(pstate *p, int line, const char *fmt, ...) {
  int w = snprintf(p->err, p->errn, "%s:%d: ", p->path, line);
  if (w >= 0 && (size_t)w < p->errn) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err + w, p->errn - (size_t)w, fmt, ap);
    va_end(ap);
  }
  return -1;
}

static char *trim(char *s) {
  while (*s == ' ' || *s == '\t') s++;
  size_t l = strlen(s);
  while (l > 0 && (s[l - 1] == ' ' || s[l - 1] == '\t' || s[l - 1] == '\r')) s[--l] = '\0';
  return s;
}

/* A finite number filling the whole of s. */
static bool parse_num(const char *s, double *out) {
  if (!*s) return false;
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || *end || errno == ERANGE || !isfinite(v)) return false;
  *out = v;
  return true;
}

static int check_rule(pstate *p, int line, const keydef *kd, const char *text, double v) {
  switch (kd->r) {
    case R_NONNEG:
      if (v < 0) return perr(p, line, "'%s' = %s: must be >= 0", kd->key, text);
      break;
    case R_POS:
      if (!(v > 0)) return perr(p, line, "'%s' = %s: must be > 0", kd->key, text);
      break;
    case R_EFF:
      if (!(v > 0 && v <= 1)) return perr(p, line, "'%s' = %s: an efficiency must be in (0, 1]", kd->key, text);
      break;
    case R_FRAC:
      if (!(v >= 0 && v < 1)) return perr(p, line, "'%s' = %s: must be in [0, 1)", kd->key, text);
      break;
    case R_COUNT:
      if (!(v >= 1 && v <= 1e6 && v == floor(v)))
        return perr(p, line, "'%s' = %s: must be a whole number >= 1", kd->key, text);
      break;
    default: break;
  }
  return 0;
}

/* "FLOPS:EFF FLOPS:EFF ...": flops > 0 strictly increasing, eff in (0, 1]. */
static int parse_gemm(pstate *p, int line, const keydef *kd, char *v, sb_hw *hw) {
  int dt = (int)(kd->s - S_GEMM_BF16);
  int np = 0;
  for (char *save = NULL, *tok = strtok_r(v, " \t", &save); tok; tok = strtok_r(NULL, " \t", &save)) {
    char *colon = strchr(tok, ':');
    double f, e;
    if (!colon) return perr(p, line, "'%s': point '%s' is not FLOPS:EFF", kd->key, tok);
    *colon = '\0';
    if (!parse_num(tok, &f) || !parse_num(colon + 1, &e)) {
      *colon = ':';
      return perr(p, line, "'%s': bad number in point '%s' (expected FLOPS:EFF)", kd->key, tok);
    }
    *colon = ':';
    if (!(f > 0)) return perr(p, line, "'%s': point '%s': flops must be > 0", kd->key, tok);
    if (!(e > 0 && e <= 1))
      return perr(p, line, "'%s': point '%s': an efficiency must be in (0, 1]", kd->key, tok);
    if (np > 0 && !(f > hw->gemm[dt][np - 1].flops))
      return perr(p, line, "'%s': point %d ('%s') is not above the previous one's flops (%g): "
                  "points must increase in flops", kd->key, np + 1, tok, hw->gemm[dt][np - 1].flops);
    if (np == SB_HW_MAX_GEMM_PTS)
      return perr(p, line, "'%s': more than %d points", kd->key, (int)SB_HW_MAX_GEMM_PTS);
    hw->gemm[dt][np].flops = f;
    hw->gemm[dt][np].eff = e;
    np++;
  }
  if (np == 0) return perr(p, line, "'%s': no FLOPS:EFF points", kd->key);
  hw->n_gemm[dt] = np;
  return 0;
}

static void set_value(sb_hw *hw, slot s, double v) {
  switch (s) {
    case S_PEAK_BF16: case S_PEAK_FP8: case S_PEAK_F32: hw->peak_flops[s - S_PEAK_BF16] = v; break;
    case S_HBM: hw->hbm_bytes = v; break;
    case S_HBM_BW: hw->hbm_bw = v; break;
    case S_HBM_EFF: hw->hbm_eff = v; break;
    case S_GPN: hw->gpus_per_node = (int)v; break;
    case S_INTRA_BW: hw->intra_bw = v; break;
    case S_INTRA_LAT: hw->intra_lat = v; break;
    case S_INTER_BW: hw->inter_bw = v; break;
    case S_INTER_LAT: hw->inter_lat = v; break;
    case S_BASE_LAT: hw->coll_base_lat = v; break;
    case S_ALLOC: hw->alloc_overhead = v; break;
    case S_RESERVED: hw->reserved_bytes = v; break;
    case S_ATTN_BF16: case S_ATTN_FP8: case S_ATTN_F32: hw->attn_eff[s - S_ATTN_BF16] = v; break;
    case S_KERNEL: hw->kernel_s = v; break;
    case S_SHARED: hw->shared_cores = (int)v; break;
    default: break;
  }
}

/* One non-blank, non-comment line (modified in place). */
static int parse_line(pstate *p, int line, char *s, sb_hw *hw) {
  char *eq = strchr(s, '=');
  if (!eq) return perr(p, line, "expected 'key = value', got '%.60s'", s);
  *eq = '\0';
  char *key = trim(s), *rest = eq + 1;
  if (!*key) return perr(p, line, "no key before '='");

  if (!strncmp(key, "source.", 7)) {
    const keydef *kd = find_key(key + 7);
    if (!kd || kd->r == R_TEXT) return perr(p, line, "'%s' cites unknown key '%s'", key, key + 7);
    char *text = trim(rest);
    if (!*text) return perr(p, line, "'%s' is empty", key);
    if (p->source_line[kd->s])
      return perr(p, line, "duplicate source for '%s' (first on line %d as '%s')", kd->key,
                  p->source_line[kd->s], p->source_key[kd->s]->key);
    p->source_line[kd->s] = line;
    p->source_key[kd->s] = kd;
    return 0;
  }

  const keydef *kd = find_key(key);
  if (!kd) return perr(p, line, "unknown key '%s'", key);
  if (p->set_line[kd->s]) {
    if (p->set_key[kd->s] == kd)
      return perr(p, line, "duplicate key '%s' (first set on line %d)", key, p->set_line[kd->s]);
    return perr(p, line, "duplicate key: '%s' sets what '%s' set on line %d", key,
                p->set_key[kd->s]->key, p->set_line[kd->s]);
  }
  char *value = rest, *comment = NULL;
  if (kd->r != R_TEXT) {
    char *hash = strchr(rest, '#');
    if (hash) {
      *hash = '\0';
      comment = trim(hash + 1);
    }
  }
  value = trim(value);
  if (!*value) return perr(p, line, "'%s' has no value", key);
  p->set_line[kd->s] = line;
  p->set_key[kd->s] = kd;
  p->cited[kd->s] = comment && *comment;
  if (kd->r == R_TEXT) return 0;
  if (kd->r == R_GEMM) return parse_gemm(p, line, kd, value, hw);
  double v;
  if (!parse_num(value, &v)) return perr(p, line, "'%s': bad number '%s'", key, value);
  if (check_rule(p, line, kd, value, v)) return -1;
  set_value(hw, kd->s, v * kd->scale);
  return 0;
}

/* The checks over the whole file, after its last line (nlines). */
static int check_file(pstate *p, int nlines, sb_hw *hw) {
  /* citations, in file order */
  int first = 0;
  slot first_s = S_NSLOTS;
  for (int s = 0; s < S_NSLOTS; s++) {
    if (!p->set_line[s] || p->set_key[s]->r == R_TEXT) continue;
    if (p->cited[s] || p->source_line[s]) continue;
    if (!first || p->set_line[s] < first) first = p->set_line[s], first_s = (slot)s;
  }
  if (first)
    return perr(p, first, "'%s' has no source: add '# <citation>' to the line or a "
                "'source.%s = <citation>' line", p->set_key[first_s]->key, p->set_key[first_s]->key);
  for (int s = 0; s < S_NSLOTS; s++)
    if (p->source_line[s] && !p->set_line[s])
      return perr(p, p->source_line[s], "'source.%s' cites a key the file does not set",
                  p->source_key[s]->key);
  for (int i = 0; i < NKEYS; i++) {
    if (!KEYS[i].required || p->set_line[KEYS[i].s]) continue;
    char names[128];
    slot_names(KEYS[i].s, names, sizeof names);
    return perr(p, nlines, "missing required key %s", names);
  }
  bool rated = false;
  for (int d = 0; d < SB_HW_NDTYPES; d++) {
    slot g = (slot)(S_GEMM_BF16 + d), pk = (slot)(S_PEAK_BF16 + d);
    if (hw->peak_flops[d] > 0) {
      rated = true;
      if (!hw->n_gemm[d])
        return perr(p, nlines, "missing required key 'gemm_%s': %s is rated (line %d) and needs "
                    "its GEMM efficiency table", DTYPE_NAMES[d], DTYPE_NAMES[d], p->set_line[pk]);
    } else if (hw->n_gemm[d]) {
      return perr(p, p->set_line[g], "'gemm_%s' given but %s has no peak > 0", DTYPE_NAMES[d],
                  DTYPE_NAMES[d]);
    }
  }
  if (!rated) return perr(p, nlines, "no dtype is rated: give a peak_bf16/fp8/f32_tflops > 0");
  if (!(hw->reserved_bytes < hw->hbm_bytes))
    return perr(p, p->set_line[S_RESERVED], "'%s' is not below the HBM capacity",
                p->set_key[S_RESERVED]->key);
  return 0;
}

static int parse_text(pstate *p, sb_hw *hw) {
  char *buf = strdup(hw->text);
  if (!buf) return perr(p, 0, "out of memory");
  int line = 0, rc = 0;
  char *s = buf;
  while (*s && !rc) {
    char *nl = strchr(s, '\n');
    if (nl) *nl = '\0';
    line++;
    char *t = trim(s);
    if (*t && *t != '#') rc = parse_line(p, line, t, hw);
    s = nl ? nl + 1 : s + strlen(s);
  }
  free(buf);
  return rc ? rc : check_file(p, line, hw);
}

/* The whole file, NUL-terminated; NULL with errno on failure. */
static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 4096, len = 0;
  char *b = malloc(cap);
  while (b) {
    size_t r = fread(b + len, 1, cap - 1 - len, f);
    len += r;
    if (len < cap - 1) break;
    if (cap > ((size_t)1 << 24)) { /* 16 MiB: not a hardware file */
      free(b);
      b = NULL;
      errno = EFBIG;
      break;
    }
    char *nb = realloc(b, cap *= 2);
    if (!nb) free(b);
    b = nb;
  }
  bool bad = b && ferror(f);
  int e = errno;
  fclose(f);
  if (bad) {
    free(b);
    errno = e ? e : EIO;
    return NULL;
  }
  if (b) b[len] = '\0';
  if (b && strlen(b) != len) { /* a NUL byte: not text */
    free(b);
    errno = EINVAL;
    return NULL;
  }
  return b;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* ", ".joined names of the files in dir (not README.md, not dotfiles), sorted. */
static void list_names(const char *dir, char *out, size_t n) {
  out[0] = '\0';
  DIR *d = opendir(dir);
  if (!d) return;
  char *names[64];
  int k = 0;
  for (struct dirent *e; k < 64 && (e = readdir(d));) {
    if (e->d_name[0] == '.' || !strcmp(e->d_name, "README.md")) continue;
    if (!(names[k] = strdup(e->d_name))) break;
    k++;
  }
  closedir(d);
  qsort(names, (size_t)k, sizeof names[0], cmp_str);
  size_t used = 0;
  for (int i = 0; i < k; i++) {
    int w = snprintf(out + used, n - used, "%s%s", i ? ", " : "", names[i]);
    if (w > 0 && (size_t)w < n - used) used += (size_t)w;
    free(names[i]);
  }
}

int sb_hw_load(const char *name, sb_hw *hw, char *err, size_t errn) {
  memset(hw, 0, sizeof *hw);
  char path[sizeof hw->path], dir[SB_DATA_PATH + 16];
  dir[0] = '\0';
  if (!name || !*name) {
    snprintf(err, errn, "hardware: empty name");
    return -1;
  }
  if (strchr(name, '/')) {
    if (snprintf(path, sizeof path, "%s", name) >= (int)sizeof path) {
      snprintf(err, errn, "%.64s...: path longer than %zu characters", name, sizeof path - 1);
      return -1;
    }
  } else {
    for (const char *c = name; *c; c++)
      if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
            *c == '-' || *c == '_' || (*c == '.' && c != name))) {
        snprintf(err, errn, "hardware: bad name '%.64s' (letters, digits, '-', '_', '.'; a path "
                 "needs a '/')", name);
        return -1;
      }
    char res[SB_DATA_PATH];
    sb_data_dir(SB_DATA_RESULTS, NULL, res, sizeof res);
    snprintf(dir, sizeof dir, "%s/hardware", res);
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path) {
      snprintf(err, errn, "hardware: name '%.64s' too long", name);
      return -1;
    }
  }
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  if (!*base || strlen(base) >= sizeof hw->name) {
    snprintf(err, errn, "%s: the file name must have 1..%zu characters", path, sizeof hw->name - 1);
    return -1;
  }
  char *text = slurp(path);
  if (!text) {
    int e = errno;
    char known[512];
    known[0] = '\0';
    if (dir[0]) list_names(dir, known, sizeof known);
    if (dir[0] && e == ENOENT)
      snprintf(err, errn, "%s: no hardware file '%s' (known: %s)", path, name,
               known[0] ? known : "none");
    else
      snprintf(err, errn, "%s: cannot read: %s", path, strerror(e));
    return -1;
  }
  memcpy(hw->name, base, strlen(base) + 1); /* fits: checked above */
  snprintf(hw->path, sizeof hw->path, "%s", path);
  hw->text = text;
  pstate p;
  memset(&p, 0, sizeof p);
  p.path = path;
  p.err = err;
  p.errn = errn;
  if (parse_text(&p, hw)) {
    free(text);
    memset(hw, 0, sizeof *hw);
    return -1;
  }
  return 0;
}

void sb_hw_free(sb_hw *hw) {
  if (!hw) return;
  free(hw->text);
  memset(hw, 0, sizeof *hw);
}

int sb_hw_dtype(const char *dtype) {
  if (!dtype) return -1;
  if (!strcmp(dtype, "bf16")) return SB_HW_BF16;
  if (!strcmp(dtype, "fp8")) return SB_HW_FP8;
  if (!strcmp(dtype, "f32") || !strcmp(dtype, "f64")) return SB_HW_F32;
  return -1;
}

/* ---- unit costs ---------------------------------------------------------------------- */

/* The table's efficiency at `flops` per call: linear in log10(flops) between
 * neighbouring points, the end points' value outside them. */
static double gemm_eff(const sb_hw_gemm_pt *pt, int np, double flops) {
  if (flops <= pt[0].flops) return pt[0].eff;
  if (flops >= pt[np - 1].flops) return pt[np - 1].eff;
  int i = 1;
  while (pt[i].flops < flops) i++;
  double x0 = log10(pt[i - 1].flops), x1 = log10(pt[i].flops), x = log10(flops);
  return pt[i - 1].eff + (pt[i].eff - pt[i - 1].eff) * (x - x0) / (x1 - x0);
}

double sb_hw_gemm_s(const sb_hw *hw, int dt, int64_t m, int64_t n, int64_t k, int64_t batch) {
  if (dt < 0 || dt >= SB_HW_NDTYPES || !(hw->peak_flops[dt] > 0) || hw->n_gemm[dt] < 1)
    return INFINITY; /* not rated: the caller's sum shows it */
  if (m <= 0 || n <= 0 || k <= 0 || batch <= 0) return 0;
  double per_call = 2.0 * (double)m * (double)n * (double)k;
  double eff = gemm_eff(hw->gemm[dt], hw->n_gemm[dt], per_call);
  return per_call * (double)batch / (hw->peak_flops[dt] * eff);
}

double sb_hw_mem_s(const sb_hw *hw, double bytes) {
  if (!(bytes > 0)) return 0;
  return bytes / (hw->hbm_bw * hw->hbm_eff);
}

/* The collective model (NVIDIA/nccl src/graph/tuning.cc, ncclTopoTuneModel, kept
 * to its skeleton: one protocol, no per-channel caps; nccl-tests
 * doc/PERFORMANCE.md for the bus factors):
 *
 *   t = base + steps latency + factor x S / busbw
 *
 * - nodes N = ceil(n / per_node) (per_node clamped to 1..n);
 * - busbw, the slowest link a GPU's traffic crosses: intra_bw when N = 1;
 *   inter_bw when per_node = 1; min(intra_bw, inter_bw) otherwise: with one NIC
 *   per GPU NCCL runs per_node rings at once, each through its own NIC, so a
 *   ring's bus bandwidth is the per-GPU link rate, not inter_bw x per_node;
 * - ring: tuning.cc's nsteps (all_reduce 2(n-1); all_gather, reduce_scatter
 *   n-1) of which nInterSteps (all_reduce 2N when N > 1; the others N-1) cross
 *   nodes at inter_lat, the rest at intra_lat (nInterSteps capped at nsteps:
 *   tuning.cc's 2N exceeds 2(n-1) when per_node = 1); bus factor
 *   all_reduce 2(n-1)/n, all_gather / reduce_scatter / all_to_all / scatter
 *   (n-1)/n, broadcast / reduce 1; all_to_all, scatter, broadcast and reduce
 *   take all_gather's steps (n-1, N-1 of them inter-node): our choice, as
 *   tuning.cc models broadcast/reduce by a chunk pipeline we do not keep;
 * - tree (all_reduce only; NCCL has no tree for the others, so they take the
 *   ring): latency 2 ((per_node - 1) intra_lat + floor(log2 N) inter_lat)
 *   (tuning.cc's up-and-down chain in the node plus the binary tree over
 *   nodes), and algbw = busbw / 2 (tuning.cc's ratio 0.5: S up, S down);
 * - send / recv: one transfer, S / link bw + that link's latency (intra when
 *   per_node >= n, both ends in one node); barrier: a 0-byte all_reduce;
 * - base: coll_base_lat once per call (tuning.cc's baseLat). A group of one: 0.
 */
typedef enum ckind { C_AR, C_AG, C_BCAST, C_P2P, C_UNKNOWN } ckind;

static ckind coll_kind(const char *op) {
  if (!op) return C_UNKNOWN;
  if (!strcmp(op, "all_reduce") || !strcmp(op, "barrier")) return C_AR;
  if (!strcmp(op, "all_gather") || !strcmp(op, "reduce_scatter") || !strcmp(op, "all_to_all") ||
      !strcmp(op, "scatter"))
    return C_AG;
  if (!strcmp(op, "broadcast") || !strcmp(op, "reduce")) return C_BCAST;
  if (!strcmp(op, "send") || !strcmp(op, "recv")) return C_P2P;
  return C_UNKNOWN;
}

static int ilog2_floor(int x) {
  int l = 0;
  while (x > 1) x >>= 1, l++;
  return l;
}

static double coll_time(const sb_hw *hw, const char *op, double bytes, int n, int per_node,
                        sb_hw_algo algo) {
  ckind c = coll_kind(op);
  if (c == C_UNKNOWN) return INFINITY;
  if (n <= 1) return 0;
  if (!strcmp(op, "barrier") || !(bytes > 0)) bytes = 0;
  if (per_node < 1 || per_node > n) per_node = per_node < 1 ? 1 : n;
  int nodes = (n + per_node - 1) / per_node;
  double busbw = nodes == 1      ? hw->intra_bw
                 : per_node == 1 ? hw->inter_bw
                                 : fmin(hw->intra_bw, hw->inter_bw);
  double base = hw->coll_base_lat;
  if (c == C_P2P) {
    bool in_node = per_node >= n;
    return base + (in_node ? hw->intra_lat : hw->inter_lat) +
           bytes / (in_node ? hw->intra_bw : hw->inter_bw);
  }
  if (c == C_AR && algo == SB_HW_TREE) {
    double lat = 2.0 * ((per_node - 1) * hw->intra_lat + ilog2_floor(nodes) * hw->inter_lat);
    return base + lat + 2.0 * bytes / busbw;
  }
  int nsteps, ninter;
  double factor;
  if (c == C_AR) {
    nsteps = 2 * (n - 1);
    ninter = nodes > 1 ? 2 * nodes : 0;
    factor = 2.0 * (n - 1) / n;
  } else {
    nsteps = n - 1;
    ninter = nodes - 1;
    factor = c == C_BCAST ? 1.0 : (double)(n - 1) / n;
  }
  if (ninter > nsteps) ninter = nsteps;
  double lat = (nsteps - ninter) * hw->intra_lat + ninter * hw->inter_lat;
  return base + lat + factor * bytes / busbw;
}

double sb_hw_coll_s(const sb_hw *hw, const char *op, double bytes, int n, int per_node,
                    sb_hw_algo algo) {
  return coll_time(hw, op, bytes, n, per_node, algo);
}

double sb_hw_coll_best_s(const sb_hw *hw, const char *op, double bytes, int n, int per_node) {
  return fmin(coll_time(hw, op, bytes, n, per_node, SB_HW_RING),
              coll_time(hw, op, bytes, n, per_node, SB_HW_TREE));
}
