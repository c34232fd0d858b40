/* bench/harness/verdict.c: the sharded-vs-unsharded check (see verdict.h). */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "verdict.h"

/* ---- token batches ---- */

void sb_token_ids(int step, int which, int64_t n, int vocab, int64_t *ids) {
  uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(2 * step + which + 1);
  for (int64_t i = 0; i < n; i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    ids[i] = (int64_t)((x >> 33) % (uint64_t)vocab);
  }
}

/* The global ids of (step, which) wrapped as a [batch, seq] host array (ids owned by
 * the caller) and the placements: Shard(0) on the dims of dp_dims. */
static dt_status token_array(dt_ctx *ctx, dt_mesh *mesh, int batch, int seq, int vocab,
                             unsigned dp_dims, int step, int which, int64_t **ids, dt_array *a,
                             dt_placement *pl) {
  const int64_t n = (int64_t)batch * seq;
  *ids = malloc((size_t)(n ? n : 1) * sizeof **ids);
  if (!*ids) return dt_error(ctx, DT_ERR_NOMEM, "sb_token_tensor", "no memory");
  sb_token_ids(step, which, n, vocab, *ids);
  for (int i = 0; i < dt_mesh_ndim(mesh); i++)
    pl[i] = dp_dims & (1u << i) ? dt_shard(0) : dt_replicate();
  const int64_t shape[2] = {batch, seq};
  return dt_array_wrap(ctx, DT_DEV_CPU, DT_I64, 2, shape, *ids, a);
}

dt_status sb_token_tensor(dt_ctx *ctx, dt_mesh *mesh, int batch, int seq, int vocab,
                          unsigned dp_dims, int step, int which, dt_tensor *out) {
  int64_t *ids = NULL;
  dt_array a;
  dt_placement pl[DT_MAX_MESH_DIMS];
  dt_status s = token_array(ctx, mesh, batch, seq, vocab, dp_dims, step, which, &ids, &a, pl);
  if (s == DT_OK) s = dt_tensor_distribute(ctx, mesh, &a, pl, out);
  free(ids);
  return s;
}

dt_status sb_token_tensor_cp(dt_ctx *ctx, const dt_model *m, int batch, int seq, int vocab,
                             unsigned dp_dims, int step, int which, dt_tensor *out) {
  int64_t *ids = NULL;
  dt_array a;
  dt_placement pl[DT_MAX_MESH_DIMS];
  dt_status s = token_array(ctx, m->mesh, batch, seq, vocab, dp_dims, step, which, &ids, &a, pl);
  if (s == DT_OK) s = dt_cp_shard_sequence(ctx, m, &a, 1, pl, out);
  free(ids);
  return s;
}

/* ---- gathering ---- */

dt_status sb_gather_f64(dt_ctx *ctx, const dt_tensor *t, double **out, int64_t *n) {
  *out = NULL;
  *n = 0;
  dt_array a;
  DT_CHECK(dt_tensor_full(ctx, t, &a)); /* Partial dims are reduced on the way */
  dt_status s = DT_OK;
  if (a.dev != DT_DEV_CPU || (a.dtype != DT_F64 && a.dtype != DT_F32 && a.dtype != DT_BF16))
    s = dt_error(ctx, DT_ERR_UNSUPPORTED, "sb_gather_f64", "needs a host f32, f64 or bf16 tensor");
  else if (!(*out = malloc((size_t)(a.numel ? a.numel : 1) * sizeof **out)))
    s = dt_error(ctx, DT_ERR_NOMEM, "sb_gather_f64", "no memory");
  else {
    for (int64_t i = 0; i < a.numel; i++)
      (*out)[i] = a.dtype == DT_F64   ? ((const double *)a.data)[i]
                  : a.dtype == DT_F32 ? (double)((const float *)a.data)[i]
                                      : (double)dt_bf16_to_f32(((const dt_bf16 *)a.data)[i]);
    *n = a.numel;
  }
  dt_array_free(ctx, &a);
  return s;
}

/* ---- the normwise comparison ---- */

/* a is a worse error than b: larger, or NaN where b is not. */
static bool worse(double a, double b) { return (isnan(a) && !isnan(b)) || a > b; }

void sb_cmp_init(sb_cmp *c) {
  memset(c, 0, sizeof *c);
  c->param_dtype = DT_DTYPE_COUNT;
}

double sb_cmp_add(sb_cmp *c, const char *what, const double *got, int64_t n_got,
                  const double *ref, int64_t n_ref, double tol) {
  double abs_e = 0, rel = 0;
  char name[SB_WORST_LEN];
  snprintf(name, sizeof name, "%s", what);
  if (n_got != n_ref) {
    abs_e = rel = INFINITY;
    snprintf(name, sizeof name, "%s (%lld elements, reference %lld)", what, (long long)n_got,
             (long long)n_ref);
  } else {
    double scale = 0;
    for (int64_t i = 0; i < n_ref; i++) {
      double d = fabs(got[i] - ref[i]);
      if (worse(d, abs_e)) abs_e = d; /* NaN sticks */
      if (fabs(ref[i]) > scale) scale = fabs(ref[i]);
    }
    rel = scale > 0 ? abs_e / scale : abs_e == 0 ? 0 : isnan(abs_e) ? NAN : INFINITY;
  }
  if (worse(abs_e, c->max_abs)) c->max_abs = abs_e;
  if (c->n == 0 || worse(rel / tol, c->worst_rel / c->worst_tol)) {
    c->worst_rel = rel;
    c->worst_abs = abs_e;
    c->worst_tol = tol;
    snprintf(c->worst, sizeof c->worst, "%s", name);
  }
  c->n++;
  if (!(rel <= tol)) c->n_over++;
  return rel;
}

bool sb_cmp_ok(const sb_cmp *c) { return c->n > 0 && c->n_over == 0; }

dt_status sb_cmp_merge(dt_comm *comm, sb_cmp *c) {
  /* sb_cmp travels as i64 words (moved, never reduced): the worst record and its
   * name together, whatever rank holds it. */
  enum { W = (sizeof(sb_cmp) + sizeof(int64_t) - 1) / sizeof(int64_t) };
  int64_t mine[W];
  memset(mine, 0, sizeof mine);
  memcpy(mine, c, sizeof *c);
  int64_t *all = malloc(sizeof mine * (size_t)comm->size);
  if (!all) return dt_error(comm->ctx, DT_ERR_NOMEM, "sb_cmp_merge", "no memory");
  dt_status s = dt_comm_all_gather(comm, mine, all, W, DT_I64);
  if (s == DT_OK) {
    sb_cmp best, r;
    memcpy(&best, all, sizeof best);
    for (int k = 1; k < comm->size; k++) {
      memcpy(&r, all + (size_t)k * W, sizeof r);
      double max_abs = worse(r.max_abs, best.max_abs) ? r.max_abs : best.max_abs;
      if (r.n && (!best.n || worse(r.worst_rel / r.worst_tol, best.worst_rel / best.worst_tol)))
        best = r;
      best.max_abs = max_abs;
    }
    *c = best;
  }
  free(all);
  return s;
}

/* ---- what a run computed ---- */

void sb_snap_free(sb_snap *s) {
  if (s->grad)
    for (int64_t k = 0; k < (int64_t)s->n_steps * s->n_mods; k++) free(s->grad[k]);
  if (s->param)
    for (int i = 0; i < s->n_mods; i++) free(s->param[i]);
  free(s->grad);
  free(s->param);
  free(s->loss);
  free(s->grad_norm);
  free(s->numel);
  free(s->name);
  memset(s, 0, sizeof *s);
}

dt_status sb_snap_init(dt_ctx *ctx, const dt_model *m, int n_steps, sb_snap *s) {
  memset(s, 0, sizeof *s);
  s->n_steps = n_steps;
  s->n_mods = m->n_mods;
  const size_t nm = (size_t)(m->n_mods ? m->n_mods : 1), ns = (size_t)(n_steps ? n_steps : 1);
  s->name = calloc(nm, sizeof *s->name);
  s->numel = calloc(nm, sizeof *s->numel);
  s->loss = calloc(ns, sizeof *s->loss);
  s->grad_norm = calloc(ns, sizeof *s->grad_norm);
  s->grad = calloc(nm * ns, sizeof *s->grad);
  s->param = calloc(nm, sizeof *s->param);
  if (!s->name || !s->numel || !s->loss || !s->grad_norm || !s->grad || !s->param) {
    sb_snap_free(s);
    return dt_error(ctx, DT_ERR_NOMEM, "sb_snap_init", "no memory");
  }
  for (int i = 0; i < m->n_mods; i++) {
    const dt_module *md = &m->mods[i];
    if (md->wndim == 0) continue;
    snprintf(s->name[i], sizeof s->name[i], "%s.weight", md->fqn);
    s->numel[i] = dt_shape_numel(md->wndim, md->wshape);
  }
  return DT_OK;
}

/* Gathers t; keeps it in *keep (rec != NULL) and compares it with the reference's
 * slot ref_v into c (ref != NULL; a slot the reference lacks compares as 0 elements). */
static dt_status visit(dt_ctx *ctx, const dt_tensor *t, const char *what, double **keep,
                       const sb_snap *ref, const double *ref_v, int64_t ref_n, double tol,
                       sb_cmp *c) {
  double *v = NULL;
  int64_t n = 0;
  DT_CHECK(sb_gather_f64(ctx, t, &v, &n));
  if (ref) sb_cmp_add(c, what, v, n, ref_v, ref_v ? ref_n : 0, tol);
  if (keep) {
    free(*keep);
    *keep = v;
  } else {
    free(v);
  }
  return DT_OK;
}

static dt_status check_shape(dt_ctx *ctx, const dt_model *m, int step, const sb_snap *s) {
  if (s && (s->n_mods != m->n_mods || step < 0 || step >= s->n_steps))
    return dt_error(ctx, DT_ERR_INVALID, "sb_snap", "step %d / %d modules outside the snapshot's "
                    "%d steps / %d modules", step, m->n_mods, s->n_steps, s->n_mods);
  return DT_OK;
}

dt_status sb_snap_step(dt_ctx *ctx, const dt_model *m, const dt_var *loss, int step, sb_snap *rec,
                       const sb_snap *ref, sb_cmp *c) {
  DT_CHECK(check_shape(ctx, m, step, rec));
  DT_CHECK(check_shape(ctx, m, step, ref));
  const double tol = sb_tolerance_params(m->dtype, c ? c->param_dtype : DT_DTYPE_COUNT, step > 0);
  char what[SB_WORST_LEN];
  snprintf(what, sizeof what, "loss step %d", step);
  double *lv = NULL;
  int64_t ln = 0;
  DT_CHECK(sb_gather_f64(ctx, dt_var_value(loss), &lv, &ln));
  if (ref) sb_cmp_add(c, what, lv, ln, &ref->loss[step], 1, tol);
  if (rec) rec->loss[step] = ln == 1 ? lv[0] : NAN;
  free(lv);
  for (int i = 0; i < m->n_mods; i++) {
    const dt_module *md = &m->mods[i];
    if (md->wndim == 0) continue;
    const dt_tensor *g = md->weight ? dt_var_grad(md->weight) : NULL;
    if (!g) return dt_error(ctx, DT_ERR_INTERNAL, "sb_snap_step", "%s: no gradient", md->fqn);
    const size_t k = (size_t)step * (size_t)m->n_mods + (size_t)i;
    snprintf(what, sizeof what, "%s.weight grad step %d", md->fqn, step);
    DT_CHECK(visit(ctx, g, what, rec ? &rec->grad[k] : NULL, ref, ref ? ref->grad[k] : NULL,
                   ref ? ref->numel[i] : 0, tol, c));
  }
  return DT_OK;
}

void sb_snap_norm(const dt_model *m, int step, double norm, sb_snap *rec, const sb_snap *ref,
                  sb_cmp *c) {
  if (rec && step >= 0 && step < rec->n_steps) rec->grad_norm[step] = norm;
  if (!ref) return;
  char what[SB_WORST_LEN];
  snprintf(what, sizeof what, "grad_norm step %d", step);
  /* the gradients' tier: the norm is a function of this step's gradients, which are
   * compared with it (|norm - ref| <= ||g - g_ref||_2, both rounding noise at the
   * gradients' scale); its own f64 sum of squares adds n u_f64, far below it */
  const double tol = sb_tolerance_params(m->dtype, c ? c->param_dtype : DT_DTYPE_COUNT, step > 0);
  const bool in = step >= 0 && step < ref->n_steps;
  sb_cmp_add(c, what, &norm, 1, in ? &ref->grad_norm[step] : NULL, in ? 1 : 0, tol);
}

dt_status sb_snap_params(dt_ctx *ctx, const dt_model *m, int step, sb_snap *rec,
                         const sb_snap *ref, sb_cmp *c) {
  DT_CHECK(check_shape(ctx, m, step, rec));
  DT_CHECK(check_shape(ctx, m, step, ref));
  char what[SB_WORST_LEN];
  for (int i = 0; i < m->n_mods; i++) {
    const dt_module *md = &m->mods[i];
    if (md->wndim == 0) continue;
    if (!md->weight)
      return dt_error(ctx, DT_ERR_INVALID, "sb_snap_params", "%s: not materialized", md->fqn);
    snprintf(what, sizeof what, "%s.weight param after step %d", md->fqn, step);
    DT_CHECK(visit(ctx, dt_var_value(md->weight), what, rec ? &rec->param[i] : NULL, ref,
                   ref ? ref->param[i] : NULL, ref ? ref->numel[i] : 0,
                   sb_tolerance_params(m->dtype, c ? c->param_dtype : DT_DTYPE_COUNT, true), c));
  }
  return DT_OK;
}

/* ---- tolerances ---- */

/* The sharded run computes the reference's sums in another order (matmuls split
 * over tp and summed across ranks, weight gradients summed per dp shard then
 * all-reduced, sequence-sharded norm-gradient sums), so the two differ by
 * rounding alone. u is the unit roundoff: 2^-53 (f64), 2^-24 (f32).
 *
 * Before any optimizer update (step 0's loss and gradients) only that order
 * differs. Reordering a sum of n terms changes it by at most about n·u of the
 * sum of |terms| (linear, worst case) and typically √n·u (the roundings are
 * independent); the longest sums here have hundreds to a few thousand terms
 * (dim 256, ffn 768, vocab 2048, batch x seq tokens), compounded over the layers.
 * Measured (`shardbench sweep --world 8 --dtypes f32,f64`: debugmodel, block and
 * 6-layer model, every plan that runs; and verify/harness.sh's world-4 sweep):
 * normwise <= 2.0e-15 in f64 and 1.05e-6 in f32, both ~18·u, the √n growth of
 * n ≈ 300. Tolerance 2^10·u (1.1e-13 f64, 6.1e-5 f32): the worst-case bound of a
 * 1000-term reordered sum, 55x over the measured spread, and still 4 (f32) to 13
 * (f64) orders below the O(1) error of a wrong shard or a missing reduce.
 *
 * After an update (later losses and gradients, the final weights) AdamW's
 * conditioning adds to it: the update lr·m/(sqrt(v) + eps) is lr·g/eps for an
 * element whose gradient lies within eps = 1e-8 of zero, so a rounding
 * difference d there moves the weight by lr·d/eps (lr/eps = 8e4). Measured in
 * the same sweeps: weights after the last step <= 3.6e-13 (3200·u) in f64 and
 * 5.3e-4 (8900·u) in f32, later gradients <= 1430·u; 8 steps measure the same
 * as 3 (the differences saturate, they do not compound). Tolerance 2^17·u
 * (1.5e-11 f64, 7.8e-3 f32): 15x (f32) and 40x (f64) over the measured worst.
 * In f32 this check is coarse by nature (an optimizer bug that moves a weight
 * by lr is 1e-3..1e-2 of the tensor's largest element): step 0's tight check
 * and an f64 run are the sharp ones. */
double sb_tolerance(dt_dtype dtype, bool after_update) {
  const double u = dtype == DT_F64 ? 0x1p-53 : 0x1p-24;
  return u * (after_update ? 0x1p17 : 0x1p10);
}

/* FSDP's mixed precision (MixedPrecisionPolicy(param_dtype=bfloat16), TorchTitan's
 * default training.mixed_precision_param): every forward and backward uses the
 * weights rounded to bf16 (round to nearest even, unit roundoff u = 2^-8 =
 * 3.9e-3), while the reference uses them unrounded; the ops compute on those
 * rounded values widened to the model's dtype (f32 or f64 arithmetic, not bf16
 * matmuls), gradients are reduced in f32 or finer and AdamW updates the
 * unrounded master weights. Summation order (above: 2^-24 at most) is noise
 * next to the rounding, so the error does not depend on the mesh or the model's
 * dtype: measured the same to 3 digits over dp_shard 2, 4, 8 and dp_replicate 2
 * x dp_shard 2, f32 and f64, at one batch.
 *
 * Before any update: a forward with weights W(1 + d), |d| <= u elementwise,
 * moves the logits, the loss and the gradients relatively by u times a
 * conditioning factor (the first-order change sums the d of every weight the
 * quantity depends on, through the layers; independent roundings largely
 * cancel). Measured (fsdp-bf16, 1 to 8 steps; the 6-layer debugmodel, the block
 * workload and a 2-layer dim-16 vocab-5 model; batch x seq from 4 x 8 to
 * 16 x 64; dp_shard 3 uneven): gradients 4.8e-3 .. 6.2e-3 (1.2 .. 1.6 u), losses <= 2.8e-4.
 * Tolerance 2^-5 = 8 u: 5x over the measured worst, and 30x below a skipped
 * reduce_scatter (0.95 .. 0.99: the gradient of half or less of the batch).
 *
 * After an update the rounding's size no longer sets the error: AdamW's first
 * steps move every element by about lr·sign(g) (|m/(sqrt(v) + eps)| <= 1.01 in
 * the first 8 steps and 1.17 ever for betas 0.9, 0.95, by Cauchy-Schwarz over
 * the bias-corrected moments' weights), and each element
 * whose gradient is smaller than the bf16 perturbation of it can take the
 * other sign, so a weight differs by up to 2·lr per update, relative 2·lr /
 * max|W| for the tensor. Measured: after one update exactly that, 1.59e-3 =
 * 2·lr on the deepest block's wo / w2 / w3 (depth-scaled init, max|W| = 0.026:
 * 6.2e-2); after 3 and 8 updates <= 1.14e-1 (an element's sign settles: the
 * flips do not repeat every step); later gradients <= 3.8e-2. Tolerance 2^-2:
 * 2.2x over the measured worst and above the 3-update worst case 3·2·lr / 0.026
 * = 0.18. This check is coarse by nature (a shard AdamW skipped moves its
 * weights by lr / max|W| ~ 3e-2, under it; a wrong or lost shard, O(1), is
 * caught), and the error grows with lr / max|W|: a deeper model (smaller
 * depth-scaled init) or a larger lr moves it toward the tolerance. Step 0's
 * check is the sharp one.
 *
 * param_dtype f32 on an f64 model rounds each weight once to f32 (relative
 * 2^-24 at most), within what f32's own tiers (above) cover: measured
 * 1.4e-7 before and 7.3e-5 after an update. */
double sb_tolerance_params(dt_dtype dtype, dt_dtype param_dtype, bool after_update) {
  if (param_dtype == DT_BF16) return after_update ? 0x1p-2 : 0x1p-5;
  if (param_dtype == DT_F32) return sb_tolerance(DT_F32, after_update);
  return sb_tolerance(dtype, after_update);
}
