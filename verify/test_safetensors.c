/* verify/test_safetensors.c: lib/nn/safetensors.c and lib/nn/weights.c against the
 * published format (huggingface/safetensors README "Format"), written out by hand
 * here: files built byte by byte are read back, the writer's bytes are compared
 * with the bytes the format prescribes, and every kind of malformed file must be
 * refused on open with a message naming the file. Then the model's weights:
 * Hugging Face names with wq/wk rows permuted as TorchTitan's
 * Llama3StateDictAdapter._permute does (restated below as index arithmetic),
 * bf16 files rounded to nearest even, and a file loaded into a sharded model
 * equal to the same file loaded into a 1-rank model.
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

static char dir[256];

/* A file of the 8-byte size, header text (padded with pad spaces) and data. */
static void put_file(const char *path, const char *hdr, size_t pad, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  uint64_t len = strlen(hdr) + pad;
  unsigned char n8[8];
  for (int i = 0; i < 8; i++) n8[i] = (unsigned char)(len >> (8 * i));
  fwrite(n8, 1, 8, f);
  fwrite(hdr, 1, strlen(hdr), f);
  for (size_t i = 0; i < pad; i++) fputc(' ', f);
  if (n) fwrite(data, 1, n, f);
  fclose(f);
}

static void test_read_by_hand(dt_ctx *c) {
  char p[300];
  snprintf(p, sizeof p, "%s/hand.st", dir);
  /* a: F32 [2, 3] = 0..5; b: I64 [2] = {7, -9}; h: BF16 [2] = {1.5, -2}; f16: F16 [3] */
  unsigned char data[24 + 16 + 4 + 6];
  float a[6] = {0, 1, 2, 3, 4, 5};
  int64_t b[2] = {7, -9};
  uint16_t h[2] = {0x3fc0, 0xc000};       /* bf16 1.5, -2 */
  uint16_t f16[3] = {0x3c00, 0xc100, 0x0001}; /* 1, -2.5, the smallest subnormal 2^-24 */
  memcpy(data, a, 24);
  memcpy(data + 24, b, 16);
  memcpy(data + 40, h, 4);
  memcpy(data + 44, f16, 6);
  put_file(p,
           "{\"__metadata__\":{\"k\":\"v\"},"
           "\"b\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[24,40]},"
           "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
           "\"h\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[40,44]},"
           "\"f16\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[44,50]}}",
           5, data, sizeof data);
  dt_st_file f;
  TU_OK(c, dt_st_open(c, p, &f));
  TU_CHECK(f.n == 4 && !strcmp(dt_st_meta(&f, "k"), "v") && !dt_st_meta(&f, "x"), "header");
  const dt_st_tensor *ta = dt_st_find(&f, "a");
  TU_CHECK(ta && ta->ndim == 2 && ta->shape[0] == 2 && ta->shape[1] == 3, "a's shape");
  double ad[6];
  TU_OK(c, dt_st_read(c, &f, ta, DT_F64, ad));
  for (int i = 0; i < 6; i++) TU_CHECK(ad[i] == i, "a[%d] = %g", i, ad[i]);
  int64_t rows[2] = {1, 0};
  float ar[6];
  TU_OK(c, dt_st_read_rows(c, &f, ta, rows, 2, DT_F32, ar));
  TU_CHECK(ar[0] == 3 && ar[3] == 0 && ar[5] == 2, "rows 1, 0 of a");
  int64_t bd[2];
  TU_OK(c, dt_st_read(c, &f, dt_st_find(&f, "b"), DT_I64, bd));
  TU_CHECK(bd[0] == 7 && bd[1] == -9, "b");
  TU_CHECK(dt_st_read(c, &f, dt_st_find(&f, "b"), DT_F64, ad) == DT_ERR_UNSUPPORTED, "I64 as F64");
  double hd[2], fd[3];
  TU_OK(c, dt_st_read(c, &f, dt_st_find(&f, "h"), DT_F64, hd));
  TU_CHECK(hd[0] == 1.5 && hd[1] == -2, "bf16 %g %g", hd[0], hd[1]);
  TU_OK(c, dt_st_read(c, &f, dt_st_find(&f, "f16"), DT_F64, fd));
  TU_CHECK(fd[0] == 1 && fd[1] == -2.5 && fd[2] == ldexp(1, -24), "f16 %g %g %g", fd[0], fd[1],
           fd[2]);
  dt_st_close(c, &f);
}

static void test_refused(dt_ctx *c) {
  static const struct {
    const char *hdr;
    size_t data;   /* bytes of data after the header */
    const char *msg;
  } BAD[] = {
      {"[]", 0, "not start with '{'"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", 4, "header JSON"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
       "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "header JSON"},
      {"{\"a\":{\"dtype\":\"F31\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "unknown dtype"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "shape[0]"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, "need 8"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "a hole"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
       "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[2,6]}}", 6, "overlaps"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 3, "truncated"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 5, "truncated or padded"},
      {"{\"__metadata__\":{\"k\":1}}", 0, "not a string"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 0, "dtype, shape and data_offsets"},
  };
  char p[300];
  snprintf(p, sizeof p, "%s/bad.st", dir);
  unsigned char zeros[16] = {0};
  for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
    put_file(p, BAD[i].hdr, 0, zeros, BAD[i].data);
    dt_st_file f;
    dt_status s = dt_st_open(c, p, &f);
    TU_CHECK(s == DT_ERR_INVALID && strstr(dt_last_error(c), p) &&
                 strstr(dt_last_error(c), BAD[i].msg),
             "bad file %zu: %s: %s (expected '%s')", i, dt_status_str(s), dt_last_error(c),
             BAD[i].msg);
    if (s == DT_OK) dt_st_close(c, &f);
  }
  /* a header size beyond the file, and a file shorter than 8 bytes */
  FILE *fp = fopen(p, "wb");
  fwrite("\xff\xff\x00\x00\x00\x00\x00\x00{}", 1, 10, fp);
  fclose(fp);
  dt_st_file f;
  TU_CHECK(dt_st_open(c, p, &f) == DT_ERR_INVALID && strstr(dt_last_error(c), "does not fit"),
           "huge header size: %s", dt_last_error(c));
  fp = fopen(p, "wb");
  fwrite("\x02\x00", 1, 2, fp);
  fclose(fp);
  TU_CHECK(dt_st_open(c, p, &f) == DT_ERR_INVALID && strstr(dt_last_error(c), "too short"),
           "short file: %s", dt_last_error(c));
}

static void test_write_bytes(dt_ctx *c) {
  char p[300];
  snprintf(p, sizeof p, "%s/w.st", dir);
  const int64_t s1[1] = {2}, s0[1] = {1};
  const dt_st_spec sp[2] = {{"x", DT_F32, 1, s1}, {"y", DT_I64, 1, s0}};
  const char *k[1] = {"m"}, *v[1] = {"n"};
  dt_st_writer *w;
  TU_OK(c, dt_st_write_begin(c, p, 2, sp, 1, k, v, &w));
  const double x[2] = {0.5, -1};
  const int64_t y[1] = {3};
  TU_OK(c, dt_st_write_next(c, w, x, DT_F64));
  TU_CHECK(access(p, F_OK) != 0, "the file appears only when complete");
  TU_OK(c, dt_st_write_next(c, w, y, DT_I64));
  TU_OK(c, dt_st_write_end(c, w));
  /* the format: size, the JSON header padded with spaces to 8-byte alignment, data */
  const char *hdr = "{\"__metadata__\":{\"m\":\"n\"},\"x\":{\"dtype\":\"F32\",\"shape\":[2],"
                    "\"data_offsets\":[0,8]},\"y\":{\"dtype\":\"I64\",\"shape\":[1],"
                    "\"data_offsets\":[8,16]}}";
  size_t hl = strlen(hdr), pad = (8 - hl % 8) % 8, total = 8 + hl + pad + 16;
  unsigned char want[512], got[520];
  uint64_t n = hl + pad;
  for (int i = 0; i < 8; i++) want[i] = (unsigned char)(n >> (8 * i));
  memcpy(want + 8, hdr, hl);
  memset(want + 8 + hl, ' ', pad);
  const float xf[2] = {0.5f, -1.0f};
  memcpy(want + 8 + hl + pad, xf, 8);
  memcpy(want + 16 + hl + pad, y, 8);
  FILE *fp = fopen(p, "rb");
  size_t r = fp ? fread(got, 1, sizeof got, fp) : 0;
  if (fp) fclose(fp);
  TU_CHECK(r == total && !memcmp(got, want, total), "writer bytes (%zu, expected %zu)", r, total);
  /* abort leaves no file and no .tmp; an existing file is untouched */
  TU_OK(c, dt_st_write_begin(c, p, 2, sp, 0, NULL, NULL, &w));
  TU_OK(c, dt_st_write_next(c, w, x, DT_F64));
  TU_CHECK(dt_st_write_end(c, w) == DT_ERR_INVALID, "end before every tensor");
  char tmpp[320];
  snprintf(tmpp, sizeof tmpp, "%s.tmp", p);
  fp = fopen(p, "rb");
  r = fp ? fread(got, 1, sizeof got, fp) : 0;
  if (fp) fclose(fp);
  TU_CHECK(access(tmpp, F_OK) != 0 && r == total && !memcmp(got, want, total),
           "a failed write keeps the old file and leaves no .tmp");
}

/* A debugmodel cut to 2 layers with GQA (4 kv heads) so that wk's permutation
 * is over a different head count than wq's. */
static const char *MODEL = "debugmodel:n_layers=2:n_kv_heads=4:vocab=256";

typedef struct job {
  const char *save, *load;
  dt_dtype fdtype;
  dt_weight_names names;
  int tp;
} job;

static dt_status job_rank(dt_ctx *c, void *arg) {
  job *j = arg;
  dt_llama_config cfg;
  DT_CHECK(dt_llama_config_get(c, MODEL, &cfg));
  int shape[1] = {j->tp};
  const char *nm[1] = {"tp"};
  dt_mesh *mesh;
  DT_CHECK(dt_mesh_create(c, c->world, 1, shape, nm, &mesh));
  dt_model *m;
  dt_status s = dt_model_create(c, mesh, &cfg, DT_F32, 7, &m);
  if (s == DT_OK && j->tp > 1) { /* shard dim 0 of the linears (rows) and dim 1 of wo / w2 */
    for (int i = 0; i < m->n_mods; i++) {
      dt_module *md = &m->mods[i];
      size_t l = strlen(md->fqn);
      if (md->kind != DT_MOD_LINEAR) continue;
      bool rowwise = l > 3 && (!strcmp(md->fqn + l - 3, ".wo") || !strcmp(md->fqn + l - 3, ".w2"));
      md->wpl[0] = dt_shard(rowwise ? 1 : 0);
    }
  }
  if (s == DT_OK) s = dt_model_materialize(c, m);
  if (s == DT_OK && j->load) s = dt_model_load_weights(c, m, j->load);
  if (s == DT_OK && j->save) s = dt_model_save_weights(c, m, j->save, j->fdtype, j->names, 0,
                                                        NULL, NULL);
  dt_model_free(c, m);
  dt_mesh_free(mesh);
  return s;
}

static void run_job(const tu_opts *o, job *j) {
  dt_launch_opts lo;
  memset(&lo, 0, sizeof lo);
  lo.backend = o->backend;
  lo.world = j->tp;
  lo.timeout_s = 120;
  dt_launch_report rep;
  memset(&rep, 0, sizeof rep);
  dt_status s = dt_launch(&lo, job_rank, j, &rep);
  TU_CHECK(s == DT_OK, "job (tp %d): %s", j->tp, rep.failed_msg);
  dt_launch_report_free(&rep);
}

static bool same_bytes(const char *p1, const char *p2) {
  FILE *f1 = fopen(p1, "rb"), *f2 = fopen(p2, "rb");
  bool same = f1 && f2;
  int e1 = 0, e2 = 0;
  while (same && e1 != EOF) {
    e1 = fgetc(f1);
    e2 = fgetc(f2);
    same = e1 == e2;
  }
  if (f1) fclose(f1);
  if (f2) fclose(f2);
  return same;
}

static double *read_all(dt_ctx *c, const char *path, const char *name, int64_t *n) {
  dt_st_file f;
  double *x = NULL;
  if (dt_st_open(c, path, &f) != DT_OK) return NULL;
  const dt_st_tensor *t = dt_st_find(&f, name);
  if (t && (x = malloc(sizeof *x * (size_t)t->numel)) && dt_st_read(c, &f, t, DT_F64, x) != DT_OK) {
    free(x);
    x = NULL;
  }
  if (t) *n = t->numel;
  dt_st_close(c, &f);
  return x;
}

static void test_model_weights(dt_ctx *c, const tu_opts *o) {
  char tt[300], hf[300], bf[300], tt2[300], tt3[300];
  snprintf(tt, sizeof tt, "%s/tt.st", dir);
  snprintf(hf, sizeof hf, "%s/hf.st", dir);
  snprintf(bf, sizeof bf, "%s/bf.st", dir);
  snprintf(tt2, sizeof tt2, "%s/tt2.st", dir);
  snprintf(tt3, sizeof tt3, "%s/tt3.st", dir);
  job j1 = {tt, NULL, DT_F32, DT_NAMES_TORCHTITAN, 1};
  job j2 = {hf, NULL, DT_F32, DT_NAMES_HF, 2};
  job j3 = {bf, NULL, DT_BF16, DT_NAMES_TORCHTITAN, 1};
  run_job(o, &j1);
  run_job(o, &j2);
  run_job(o, &j3);
  /* HF's q_proj / k_proj: row h*hd + t*hd/2 + j holds TorchTitan's row h*hd + 2j + t
   * (_permute: view(heads, hd/2, 2, in).transpose(1, 2).reshape(rows, in)) */
  static const struct { const char *tt, *hf; int heads; } P[] = {
      {"layers.1.attention.wq.weight", "model.layers.1.self_attn.q_proj.weight", 16},
      {"layers.1.attention.wk.weight", "model.layers.1.self_attn.k_proj.weight", 4},
      {"layers.0.feed_forward.w1.weight", "model.layers.0.mlp.gate_proj.weight", 0},
      {"output.weight", "lm_head.weight", 0},
  };
  for (size_t p = 0; p < sizeof P / sizeof P[0]; p++) {
    int64_t n1 = 0, n2 = 0;
    double *a = read_all(c, tt, P[p].tt, &n1), *b = read_all(c, hf, P[p].hf, &n2);
    TU_CHECK(a && b && n1 == n2, "%s / %s in both files", P[p].tt, P[p].hf);
    if (a && b && n1 == n2) {
      const int64_t in = 256, rows = n1 / in, hd = P[p].heads ? rows / P[p].heads : 0;
      long bad = 0;
      for (int64_t r = 0; r < rows; r++) {
        int64_t hr = hd ? (r / hd) * hd + (r % hd % 2) * (hd / 2) + (r % hd) / 2 : r;
        bad += memcmp(a + r * in, b + hr * in, sizeof *a * (size_t)in) != 0;
      }
      TU_CHECK(bad == 0, "%s: %ld rows not where HF puts them", P[p].hf, bad);
    }
    free(a);
    free(b);
  }
  /* bf16: each value the f32 value rounded to nearest even (by hand: add half an
   * ulp of bf16 plus the tie bit, truncate) */
  int64_t n1 = 0, n2 = 0;
  double *a = read_all(c, tt, "layers.0.attention.wv.weight", &n1);
  double *b = read_all(c, bf, "layers.0.attention.wv.weight", &n2);
  long bad = 0;
  for (int64_t i = 0; a && b && i < n1; i++) {
    float f = (float)a[i];
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, 4);
    bad += (double)f != b[i];
  }
  TU_CHECK(a && b && n1 == n2 && bad == 0, "bf16 file: %ld of %lld values not rounded to nearest "
           "even", bad, (long long)n1);
  free(a);
  free(b);
  /* the HF file loaded into a tp-2 model, saved with TorchTitan names, is the
   * TorchTitan file byte for byte; and loaded on 1 rank likewise */
  job j4 = {tt2, hf, DT_F32, DT_NAMES_TORCHTITAN, 2};
  job j5 = {tt3, hf, DT_F32, DT_NAMES_TORCHTITAN, 1};
  run_job(o, &j4);
  run_job(o, &j5);
  TU_CHECK(same_bytes(tt, tt2), "HF file -> tp-2 model -> TorchTitan file differs from the "
           "original");
  TU_CHECK(same_bytes(tt, tt3), "HF file -> 1-rank model -> TorchTitan file differs from the "
           "original");
  /* a file of another model is refused by the check, naming the tensor */
  dt_llama_config cfg;
  dt_model *m;
  TU_OK(c, dt_llama_config_get(c, "debugmodel:n_layers=2:n_kv_heads=8:vocab=256", &cfg));
  TU_OK(c, dt_model_create(c, NULL, &cfg, DT_F32, 7, &m));
  dt_st_file f;
  dt_weight_names names;
  TU_OK(c, dt_st_open(c, tt, &f));
  TU_CHECK(dt_model_weights_check(c, m, &f, &names) == DT_ERR_INVALID &&
               strstr(dt_last_error(c), "layers.0.attention.wk.weight' has shape [64, 256]"),
           "a GQA file on an 8-kv-head model: %s", dt_last_error(c));
  dt_st_close(c, &f);
  dt_model_free(c, m);
}

int main(int argc, char **argv) {
  tu_opts o;
  tu_parse(argc, argv, &o);
  snprintf(dir, sizeof dir, "%s/test_safetensors.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR")
                                                                           : "/tmp");
  if (!mkdtemp(dir)) return 99;
  dt_ctx c;
  dt_ctx_init(&c, 0, 1);
  test_read_by_hand(&c);
  test_refused(&c);
  test_write_bytes(&c);
  test_model_weights(&c, &o);
  dt_ctx_release(&c);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return tu_finish("test_safetensors");
}
