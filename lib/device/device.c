/* lib/device/device.c: the device front: argument checks, the compute ledger's
 * GEMM rows, then the backend slot. */
#include "config.h"

#include <string.h>

#include "device/device.h"
#include "device/kernels.h"

static dt_status need(dt_device *d, const void *slot, const char *call) {
  if (!d) return DT_ERR_INVALID;
  if (!slot)
    return dt_error(d->ctx, DT_ERR_UNSUPPORTED, call, "device '%s' has no such operation",
                    d->ops->name);
  return DT_OK;
}

static dt_status mem_alloc(void *owner, size_t bytes, void **out) {
  return dt_device_alloc(owner, bytes, out);
}

static void mem_free(void *owner, void *p, size_t bytes) { dt_device_free(owner, p, bytes); }

void dt_device_install_memory(dt_device *d) {
  if (!d || !d->ctx || d->kind == DT_DEV_CPU || d->ctx->dev_mem.alloc) return;
  dt_ctx_set_dev_mem(d->ctx, &(dt_dev_mem){d->kind, d, mem_alloc, mem_free});
}

void dt_device_destroy(dt_device *d) {
  if (!d) return;
  if (d->ctx && d->ctx->dev_mem.owner == d) dt_ctx_set_dev_mem(d->ctx, NULL);
  if (d->ops->destroy) d->ops->destroy(d);
}

dt_status dt_device_alloc(dt_device *d, size_t bytes, void **out) {
  DT_CHECK(need(d, (const void *)d->ops->alloc, "dt_device_alloc"));
  return d->ops->alloc(d, bytes, out);
}

void dt_device_free(dt_device *d, void *p, size_t bytes) {
  if (d && p && d->ops->free) d->ops->free(d, p, bytes);
}

dt_status dt_device_copy(dt_device *d, void *dst, const void *src, size_t bytes, dt_copy_kind k) {
  DT_CHECK(need(d, (const void *)d->ops->copy, "dt_device_copy"));
  if (bytes == 0) return DT_OK;
  if (!dst || !src) return dt_error(d->ctx, DT_ERR_INVALID, "dt_device_copy", "NULL buffer");
  return d->ops->copy(d, dst, src, bytes, k);
}

dt_status dt_gemm_check(dt_ctx *ctx, const dt_gemm_desc *g) {
  const char *c = "dt_device_gemm";
  if (!g) return dt_error(ctx, DT_ERR_INVALID, c, "NULL descriptor");
  if (g->dtype != DT_F32 && g->dtype != DT_F64 && g->dtype != DT_BF16)
    return dt_error(ctx, DT_ERR_UNSUPPORTED, c, "dtype %s (f32, f64 and bf16 only)",
                    dt_dtype_name(g->dtype));
  if (g->c_f32 && g->dtype != DT_BF16)
    return dt_error(ctx, DT_ERR_INVALID, c, "c_f32 is for bf16 inputs, not %s",
                    dt_dtype_name(g->dtype));
  if (g->m < 0 || g->n < 0 || g->k < 0 || g->batch < 1)
    return dt_error(ctx, DT_ERR_INVALID, c, "m=%lld n=%lld k=%lld batch=%lld",
                    (long long)g->m, (long long)g->n, (long long)g->k, (long long)g->batch);
  int64_t a_cols = g->trans_a ? g->m : g->k, b_cols = g->trans_b ? g->k : g->n;
  int64_t a_rows = g->trans_a ? g->k : g->m, b_rows = g->trans_b ? g->n : g->k;
  if (g->lda < (a_cols > 1 ? a_cols : 1) || g->ldb < (b_cols > 1 ? b_cols : 1) ||
      g->ldc < (g->n > 1 ? g->n : 1))
    return dt_error(ctx, DT_ERR_INVALID, c, "leading dims lda=%lld ldb=%lld ldc=%lld too small",
                    (long long)g->lda, (long long)g->ldb, (long long)g->ldc);
  /* The outputs must be disjoint: one after another, or side by side within
   * each row (the heads of a [b, s, heads, hd] tensor: stride_c >= n and every
   * matrix within the row's ldc). */
  bool stacked = g->stride_c >= (g->m - 1) * g->ldc + g->n;
  bool side = g->stride_c >= g->n && (g->batch - 1) * g->stride_c + g->n <= g->ldc;
  if (g->batch > 1 && (g->stride_a < 0 || g->stride_b < 0 || !(stacked || side)))
    return dt_error(ctx, DT_ERR_INVALID, c, "batch strides overlap the output");
  if ((g->m && g->n && !g->c) || (g->m && g->k && a_rows && !g->a) || (g->n && g->k && b_rows && !g->b))
    return dt_error(ctx, DT_ERR_INVALID, c, "NULL matrix");
  return DT_OK;
}

/* The compute ledger's row of a GEMM: 2 m n k FLOPs per matrix (a multiply
 * and an add per term; beta's scaling of C is not counted, as in the 6N
 * training-FLOPs convention of Kaplan et al. 2020, sec. 2.1), A and B read, C
 * written (and read when beta != 0). Every device passes here, so real and
 * shape-only runs write the same rows. */
static void record_gemm(dt_ctx *ctx, const dt_gemm_desc *g) {
  if (!ctx || !dt_kledger_of(ctx)->enabled) return;
  const uint64_t es = dt_dtype_size(g->dtype), ec = g->c_f32 ? 4 : es;
  const uint64_t b = (uint64_t)g->batch, m = (uint64_t)g->m, n = (uint64_t)g->n,
                 k = (uint64_t)g->k;
  dt_kledger_row r;
  memset(&r, 0, sizeof r);
  const char *op = g->op ? g->op : "gemm";
  const size_t l = strnlen(op, sizeof r.op - 1);
  memcpy(r.op, op, l); /* r is zeroed: NUL-terminated */
  r.dtype = (int)g->dtype;
  r.m = g->m;
  r.n = g->n;
  r.k = g->k;
  r.batch = g->batch;
  r.flops = 2.0 * (double)m * (double)n * (double)k * (double)b;
  r.bytes_read = b * (m * k + k * n) * es + (g->beta != 0.0 ? b * m * n * ec : 0);
  r.bytes_written = b * m * n * ec;
  dt_kledger_add(ctx, &r);
}

dt_status dt_device_gemm(dt_device *d, const dt_gemm_desc *g) {
  DT_CHECK(need(d, (const void *)d->ops->gemm, "dt_device_gemm"));
  DT_CHECK(dt_gemm_check(d->ctx, g));
  if (g->m == 0 || g->n == 0) return DT_OK;
  record_gemm(d->ctx, g);
  return d->ops->gemm(d, g);
}

dt_status dt_device_fill(dt_device *d, dt_dtype t, void *x, int64_t n, double value) {
  DT_CHECK(need(d, (const void *)d->ops->fill, "dt_device_fill"));
  if (n < 0 || (n > 0 && !x) || dt_dtype_size(t) == 0)
    return dt_error(d->ctx, DT_ERR_INVALID, "dt_device_fill", "bad buffer or dtype");
  if (n == 0) return DT_OK;
  dt_kledger_kernel(d->ctx, "fill", t, 0, 0, (uint64_t)n * dt_dtype_size(t));
  return d->ops->fill(d, t, x, n, value);
}

dt_status dt_device_axpy(dt_device *d, dt_dtype t, int64_t n, double alpha, const void *x, void *y) {
  DT_CHECK(need(d, (const void *)d->ops->axpy, "dt_device_axpy"));
  if (n < 0 || (n > 0 && (!x || !y)))
    return dt_error(d->ctx, DT_ERR_INVALID, "dt_device_axpy", "bad buffers");
  if (n == 0) return DT_OK;
  dt_kledger_kernel(d->ctx, "axpy", t, 2.0 * (double)n, 2 * (uint64_t)n * dt_dtype_size(t),
                    (uint64_t)n * dt_dtype_size(t));
  return d->ops->axpy(d, t, n, alpha, x, y);
}

dt_status dt_device_sync(dt_device *d) {
  if (!d) return DT_ERR_INVALID;
  return d->ops->sync ? d->ops->sync(d) : DT_OK;
}

dt_status dt_device_kernels(dt_ctx *ctx, dt_device_kind kind, const char *who, dt_kdev *out) {
  dt_device *d = ctx->device;
  if (d && d->kind == kind && d->ops->kern) {
    out->dev = d;
    out->k = d->ops->kern;
    return DT_OK;
  }
  if (kind == DT_DEV_CPU) {
    out->host = (dt_device){.ops = dt_device_cpu_ops(), .kind = DT_DEV_CPU, .ctx = ctx};
    out->dev = &out->host;
    out->k = out->host.ops->kern;
    return DT_OK;
  }
  out->dev = NULL;
  out->k = NULL;
  return dt_error(ctx, DT_ERR_UNSUPPORTED, who, "device arrays, but the rank's device (%s) has no kernels for them",
                  d ? d->ops->name : "none");
}
