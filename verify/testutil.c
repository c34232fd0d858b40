/* verify/testutil.c: failure and check counting and flag parsing for the test programs. */
#include "config.h"

#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* Test programs are processes of their own: a process-wide counter is fine here
 * (it is not lib/). Atomic, because the ranks of a threads job are threads. */
static atomic_long failures;
static atomic_long checks;

void tu_count(void) { atomic_fetch_add(&checks, 1); }
long tu_checks(void) { return atomic_load(&checks); }

void tu_fail(const char *file, int line, const char *fmt, ...) {
  long n = atomic_fetch_add(&failures, 1);
  /* Print the first 50 failures; the count says how many more. */
  if (n >= 50) return;
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  fprintf(stderr, "FAIL %s:%d: %s\n", file, line, buf);
}

long tu_failures(void) { return atomic_load(&failures); }

void tu_parse(int argc, char **argv, tu_opts *o) {
  memset(o, 0, sizeof *o);
  o->backend = DT_BACKEND_THREADS;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--backend") && i + 1 < argc) {
      if (dt_backend_parse(argv[++i], &o->backend) != DT_OK) {
        fprintf(stderr, "%s: --backend: expected threads or mpi, got '%s'\n", argv[0], argv[i]);
        exit(2);
      }
    } else if (!strcmp(argv[i], "--quick")) {
      o->quick = 1;
    } else {
      fprintf(stderr, "%s: unknown argument '%s' (use --backend threads|mpi, --quick)\n",
              argv[0], argv[i]);
      exit(2);
    }
  }
  if (!dt_backend_available(o->backend)) {
    printf("SKIP: backend %s is not built\n", dt_backend_name(o->backend));
    exit(SB_SKIP);
  }
}

const char *tu_plan_path(const char *file, char *buf, size_t n) {
  const char *src = getenv("srcdir");
  snprintf(buf, n, "%s/plans/%s", src && *src ? src : ".", file);
  return buf;
}

char *tu_slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *b = NULL;
  long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
  if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (b = malloc((size_t)n + 1)) &&
      fread(b, 1, (size_t)n, f) != (size_t)n) {
    free(b);
    b = NULL;
  }
  if (b) b[n] = '\0';
  fclose(f);
  return b;
}

bool tu_close(double got, double want, double rtol) {
  if (got == want) return true;
  return fabs(got - want) <= rtol * fabs(want);
}

int tu_finish(const char *name) {
  long f = tu_failures(), n = tu_checks();
  if (f) {
    fprintf(stderr, "%s: %ld check(s) failed\n", name, f);
    return 1;
  }
  if (n == 0) {
    fprintf(stderr, "%s: FAIL: ran no check\n", name);
    return 1;
  }
  printf("%s: all %ld check(s) passed\n", name, n);
  return 0;
}

double *tu_full_f64(dt_ctx *ctx, const dt_tensor *t, int64_t *n) {
  if (!t) return NULL;
  dt_array f;
  if (dt_tensor_full(ctx, t, &f) != DT_OK) return NULL;
  double *v = malloc(sizeof *v * (size_t)(f.numel ? f.numel : 1));
  if (v) memcpy(v, f.data, sizeof *v * (size_t)f.numel);
  *n = f.numel;
  dt_array_free(ctx, &f);
  return v;
}

double tu_normwise(const double *a, const double *ref, int64_t n) {
  double d = 0, s = 0;
  for (int64_t i = 0; i < n; i++) {
    d = fmax(d, fabs(a[i] - ref[i]));
    s = fmax(s, fabs(ref[i]));
  }
  return s > 0 ? d / s : d;
}

const char *tu_device_name(void) {
  const char *e = getenv("SB_TEST_DEVICE");
  if (!e || !*e || !strcmp(e, "cpu")) return "cpu";
  if (!strcmp(e, "cuda-emu") || !strcmp(e, "cuda")) return e;
  fprintf(stderr, "SB_TEST_DEVICE=%s: expected cpu, cuda-emu or cuda\n", e);
  exit(2);
}

void tu_launch_device(dt_launch_opts *lo) {
  const char *d = tu_device_name();
  if (!strcmp(d, "cpu")) return;
  lo->device = DT_DEV_CUDA;
  lo->cuda_emu = !strcmp(d, "cuda-emu");
}

dt_status tu_host_copy(dt_ctx *ctx, const dt_array *a, dt_array *out) {
  DT_CHECK(dt_array_create(ctx, DT_DEV_CPU, a->dtype, a->ndim, a->shape, out));
  if (!a->numel) return DT_OK;
  if (a->dev == DT_DEV_CPU) {
    memcpy(out->data, a->data, dt_array_bytes(a));
    return DT_OK;
  }
  dt_status s = dt_device_copy(ctx->device, out->data, a->data, dt_array_bytes(a), DT_COPY_D2H);
  if (s == DT_OK) s = dt_device_sync(ctx->device);
  if (s != DT_OK) dt_array_free(ctx, out);
  return s;
}
