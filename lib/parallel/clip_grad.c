/* lib/parallel/clip_grad.c: gradient-norm clipping over a parallelized model, as
 * TorchTitan's clip_grad_norm_ (torchtitan/distributed/utils.py) does it with
 * PyTorch's torch.nn.utils.clip_grad_norm_ (torch/nn/utils/clip_grad.py
 * _get_total_norm, _clip_grads_with_norm_) on DTensor gradients.
 *
 * The total norm is over every parameter of the model however it is placed: a
 * gradient sharded on some mesh dims contributes its local partial sum of squares
 * (its local maximum for norm_type inf), reduced over exactly those dims (a
 * DTensor vector_norm is Partial there and Replicate elsewhere, so a Replicate dim
 * is counted once); a shard holds only its own rows (torch.chunk geometry: FSDP's
 * padding lives in the collectives' buffers, never in a gradient), so padding
 * counts nothing. Pipeline stages are combined over pp as TorchTitan's pp path
 * does: an all_reduce of norm^p (sum), or of the norm (max) for inf. Then every
 * gradient is scaled by max_norm / (total + 1e-6) when that is below 1
 * (clip_grads_with_norm_: the coefficient clamped to 1; a scale by 1 is none).
 *
 * Not here: other norm types than 2 and inf; foreach kernels (a host loop, f64
 * sums in element order, the same on every device: a device's gradient is copied
 * to the host for its sum, a cost of the option).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "trainer.h"

enum { MAX_GROUPS = 1 << DT_MAX_MESH_DIMS };

/* sum x^2 (p2) or max |x| over a local array, in f64. */
static dt_status local_norm(dt_ctx *ctx, const dt_array *a, bool p2, double *out) {
  *out = 0;
  if (a->numel == 0) return DT_OK;
  const size_t es = dt_dtype_size(a->dtype), bytes = es * (size_t)a->numel;
  const void *h = a->data;
  void *copy = NULL;
  if (a->dev != DT_DEV_CPU) {
    dt_kdev kd;
    DT_CHECK(dt_device_kernels(ctx, a->dev, "dt_clip_grad_norm", &kd));
    if (!(copy = malloc(bytes))) return dt_error(ctx, DT_ERR_NOMEM, "dt_clip_grad_norm", "no memory");
    dt_status s = dt_device_copy(kd.dev, copy, a->data, bytes, DT_COPY_D2H);
    if (s != DT_OK) {
      free(copy);
      return s;
    }
    h = copy;
  }
  double acc = 0;
  for (int64_t i = 0; i < a->numel; i++) {
    const double x = a->dtype == DT_F64   ? ((const double *)h)[i]
                     : a->dtype == DT_F32 ? (double)((const float *)h)[i]
                                          : (double)dt_bf16_to_f32(((const dt_bf16 *)h)[i]);
    if (p2) acc += x * x;
    else if (!(fabs(x) <= acc)) acc = fabs(x); /* a NaN wins, as torch's max does */
  }
  free(copy);
  *out = acc;
  return DT_OK;
}

/* g *= c in g's dtype (torch's grad.mul_(clip_coef) with the coefficient in that dtype). */
static dt_status scale_grad(dt_ctx *ctx, dt_array *a, double c) {
  if (a->numel == 0) return DT_OK;
  if (a->dev != DT_DEV_CPU) {
    dt_kdev kd;
    DT_CHECK(dt_device_kernels(ctx, a->dev, "dt_clip_grad_norm", &kd));
    return kd.k->pw->scale(kd.dev, a->dtype, a->numel, c, a->data, a->data);
  }
  const float cf = (float)c;
  for (int64_t i = 0; i < a->numel; i++) {
    if (a->dtype == DT_F64) ((double *)a->data)[i] *= c;
    else if (a->dtype == DT_F32) ((float *)a->data)[i] *= cf;
    else {
      dt_bf16 *b = &((dt_bf16 *)a->data)[i];
      *b = dt_f32_to_bf16(dt_bf16_to_f32(*b) * cf);
    }
  }
  return DT_OK;
}

dt_status dt_clip_grad_norm(dt_ctx *ctx, dt_model *m, int pp_dim, const dt_clip_opts *o,
                            double *total) {
  static const char WHO[] = "dt_clip_grad_norm";
  *total = 0;
  const bool p2 = !isinf(o->norm_type);
  if (p2 && o->norm_type != 2.0 && o->norm_type != 0.0)
    return dt_error(ctx, DT_ERR_UNSUPPORTED, WHO, "norm_type %g (2 and inf only)", o->norm_type);
  if (!(o->max_norm > 0)) return dt_error(ctx, DT_ERR_INVALID, WHO, "max_norm %g <= 0", o->max_norm);
  const int nd = dt_mesh_ndim(m->mesh);
  /* the partial norms, one per set of mesh dims the gradients are sharded on */
  unsigned mask[MAX_GROUPS];
  double part[MAX_GROUPS];
  int ng = 0;
  for (int i = 0; i < m->n_mods; i++) {
    dt_module *md = &m->mods[i];
    const dt_tensor *g0 = md->weight ? dt_var_grad(md->weight) : NULL;
    if (!g0) continue; /* no gradient (another stage's weight): nothing, as torch skips it */
    const dt_tensor *w = dt_var_value(md->weight);
    /* the gradient in the weight's placements, as AdamW would reduce it (P -> R, P -> S),
     * kept as the gradient so that the optimizer finds it reduced */
    bool same = true;
    for (int d = 0; d < w->mesh_ndim; d++) same = same && dt_placement_eq(g0->pl[d], w->pl[d]);
    if (!same) {
      dt_tensor gr = {0};
      DT_CHECK(dt_redistribute(ctx, g0, w->pl, DT_PLANNER_GREEDY, &gr));
      DT_CHECK(dt_var_set_grad(m->tape, md->weight, &gr));
      g0 = dt_var_grad(md->weight);
    }
    unsigned k = 0;
    for (int d = 0; d < nd; d++)
      if (d != pp_dim && w->pl[d].kind == DT_PL_SHARD) k |= 1u << d;
    if (o->fault_count_replicated[0] && !strcmp(md->fqn, o->fault_count_replicated))
      for (int d = 0; d < nd; d++) /* TEST SWITCH: its Replicate dims summed as if sharded */
        if (d != pp_dim && w->pl[d].kind == DT_PL_REPLICATE) k |= 1u << d;
    double v;
    DT_CHECK(local_norm(ctx, &g0->local, p2, &v));
    int at = 0;
    while (at < ng && mask[at] != k) at++;
    if (at == ng) {
      mask[ng] = k;
      part[ng++] = 0;
    }
    part[at] = p2 ? part[at] + v : (!(v <= part[at]) ? v : part[at]);
  }
  /* one all_reduce per mesh dim that shards some gradient: the partial norms of the
   * groups sharded there (after it, each is whole over that dim too) */
  for (int d = 0; d < nd; d++) {
    if (d == pp_dim) continue;
    double buf[MAX_GROUPS];
    int n = 0;
    for (int gi = 0; gi < ng; gi++)
      if (mask[gi] & (1u << d)) buf[n++] = part[gi];
    if (!n) continue;
    DT_CHECK(dt_comm_all_reduce(dt_mesh_comm(m->mesh, d), buf, buf, (size_t)n, DT_F64,
                                p2 ? DT_RED_SUM : DT_RED_MAX));
    n = 0;
    for (int gi = 0; gi < ng; gi++)
      if (mask[gi] & (1u << d)) part[gi] = buf[n++];
  }
  double t = 0;
  for (int gi = 0; gi < ng; gi++) t = p2 ? t + part[gi] : (!(part[gi] <= t) ? part[gi] : t);
  if (pp_dim >= 0) { /* the stages: norm^2 summed (max for inf) over pp */
    dt_comm *c = dt_mesh_comm(m->mesh, pp_dim);
    if (o->fault_drop_pp_rank && dt_mesh_coord(m->mesh, pp_dim) == o->fault_drop_pp_rank - 1)
      t = 0; /* TEST SWITCH: this stage left out */
    DT_CHECK(dt_comm_all_reduce(c, &t, &t, 1, DT_F64, p2 ? DT_RED_SUM : DT_RED_MAX));
  }
  *total = p2 ? sqrt(t) : t;
  const double coef = o->max_norm / (*total + 1e-6);
  if (!(coef < 1.0)) return DT_OK; /* clamped to 1: the gradients as they are */
  for (int i = 0; i < m->n_mods; i++) {
    dt_module *md = &m->mods[i];
    dt_tensor *g = md->weight ? (dt_tensor *)dt_var_grad(md->weight) : NULL; /* scaled in place */
    if (g) DT_CHECK(scale_grad(ctx, &g->local, coef));
  }
  (void)WHO;
  return DT_OK;
}
