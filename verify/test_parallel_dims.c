/* verify/test_parallel_dims.c: the mesh of dt_parallel_dims (lib/parallel/trainer.h)
 * against TorchTitan's ParallelDims (torchtitan/distributed/parallel_dims.py).
 *
 * Oracle: TorchTitan's mesh, written out here: the degrees > 1 in the order pp,
 * dp_replicate, dp_shard, cp, tp, world rank r at the row-major coordinates of r.
 * Two ranks are in the same group of a degree when all their other coordinates are
 * equal. For every degree combination up to world 32 the groups of dt_parallel_dims'
 * mesh (its names, shape and dt_parallel_dims_rank_index) must be TorchTitan's, each
 * group in the same rank order along the dim (the collectives' order); the flattened
 * dims' masks must name the dims of dp (dp_replicate, dp_shard), dp_shard_cp and
 * dp_cp. A planted mesh (the FSDP + TP order without its rank permutation) must fail
 * the same comparison, and bad degrees are refused.
 */
#include <stdio.h>
#include <string.h>

#include "testutil.h"

static const char *const NAMES[DT_PDIM_COUNT] = {"pp", "dp_replicate", "dp_shard", "cp", "tp"};

/* TorchTitan's coordinate of world rank r on degree p (0 when p is 1). */
static int tt_coord(const int *deg, int r, int p) {
  int c = r;
  for (int q = DT_PDIM_COUNT - 1; q > p; q--) c /= deg[q];
  return c % deg[p];
}

/* The coordinate of world rank r on degree p in d's mesh (0 when not in it); ident:
 * the plant, the mesh index taken as the world rank itself. */
static int our_coord(const dt_parallel_dims *d, int r, int p, bool ident) {
  if (d->dim[p] < 0) return 0;
  int c = ident ? r : dt_parallel_dims_rank_index(d, r);
  for (int k = d->ndim - 1; k > d->dim[p]; k--) c /= d->shape[k];
  return c % d->shape[d->dim[p]];
}

/* Whether d's mesh has TorchTitan's groups for every degree, in its order. */
static bool same_groups(const int *deg, const dt_parallel_dims *d, bool ident) {
  for (int p = 0; p < DT_PDIM_COUNT; p++)
    for (int a = 0; a < d->world_size; a++)
      for (int b = 0; b < d->world_size; b++) {
        bool tt_same = true, our_same = true;
        for (int q = 0; q < DT_PDIM_COUNT; q++)
          if (q != p) {
            tt_same = tt_same && tt_coord(deg, a, q) == tt_coord(deg, b, q);
            our_same = our_same && our_coord(d, a, q, ident) == our_coord(d, b, q, ident);
          }
        if (tt_same != our_same) return false;
        if (tt_same && tt_coord(deg, a, p) != our_coord(d, a, p, ident)) return false;
      }
  return true;
}

static unsigned mask_of(const dt_parallel_dims *d, int p, int q) {
  return (d->dim[p] >= 0 ? 1u << d->dim[p] : 0u) | (d->dim[q] >= 0 ? 1u << d->dim[q] : 0u);
}

static void check_all(dt_ctx *ctx) {
  static const int SIZES[] = {1, 2, 4};
  int n = 0, permuted = 0;
  int deg[DT_PDIM_COUNT];
  for (int i = 0; i < 243; i++) { /* 3^5 combinations */
    int w = 1;
    for (int p = 0, k = i; p < DT_PDIM_COUNT; p++, k /= 3) w *= deg[p] = SIZES[k % 3];
    if (w > 32) continue;
    dt_parallel_dims d;
    TU_OK(ctx, dt_parallel_dims_init(ctx, deg, w, &d));
    n++;
    TU_CHECK(same_groups(deg, &d, false), "degrees %d,%d,%d,%d,%d: groups differ from TorchTitan's",
             deg[0], deg[1], deg[2], deg[3], deg[4]);
    /* the names and sizes of the mesh dims are the degrees' */
    for (int p = 0; p < DT_PDIM_COUNT; p++) {
      TU_CHECK((d.dim[p] >= 0) == (deg[p] > 1), "%s in the mesh iff > 1", NAMES[p]);
      if (d.dim[p] >= 0)
        TU_CHECK(!strcmp(d.names[d.dim[p]], NAMES[p]) && d.shape[d.dim[p]] == deg[p],
                 "dim %d is %s:%d", d.dim[p], NAMES[p], deg[p]);
    }
    TU_CHECK(d.dp == mask_of(&d, DT_PDIM_DP_REPLICATE, DT_PDIM_DP_SHARD) &&
                 d.dp_shard_cp == mask_of(&d, DT_PDIM_DP_SHARD, DT_PDIM_CP) &&
                 d.dp_cp == mask_of(&d, DT_PDIM_DP_REPLICATE, DT_PDIM_CP),
             "flattened dims' masks");
    /* FSDP + TP without cp: tp before dp_shard, the ranks permuted */
    const bool swap = deg[DT_PDIM_DP_SHARD] > 1 && deg[DT_PDIM_TP] > 1 && deg[DT_PDIM_CP] == 1;
    TU_CHECK(d.tp_before_dp_shard == swap &&
                 (!swap || d.dim[DT_PDIM_TP] + 1 == d.dim[DT_PDIM_DP_SHARD]),
             "tp before dp_shard exactly for FSDP + TP without cp");
    if (swap) {
      permuted++;
      /* plant: the same mesh without the permutation has other groups */
      TU_CHECK(!same_groups(deg, &d, true), "plant: an unpermuted FSDP + TP mesh passed");
    }
    if (w == 1) TU_CHECK(d.ndim == 1 && d.shape[0] == 1, "world 1: one dim of size 1");
  }
  TU_CHECK(n > 100 && permuted > 10, "%d meshes, %d permuted", n, permuted);
}

static void check_errors(dt_ctx *ctx) {
  dt_parallel_dims d;
  const int bad[DT_PDIM_COUNT] = {1, 1, 0, 1, 2}, two[DT_PDIM_COUNT] = {1, 1, 2, 1, 2};
  TU_CHECK(dt_parallel_dims_init(ctx, bad, 2, &d) == DT_ERR_INVALID, "a degree 0 is refused");
  TU_CHECK(dt_parallel_dims_init(ctx, two, 8, &d) == DT_ERR_INVALID &&
               strstr(dt_last_error(ctx), "mesh has 4 ranks, world is 8"),
           "a world that is not the product: '%s'", dt_last_error(ctx));
}

int main(void) {
  dt_ctx ctx;
  dt_ctx_init(&ctx, 0, 1);
  check_all(&ctx);
  check_errors(&ctx);
  dt_ctx_release(&ctx);
  return tu_finish("test_parallel_dims");
}
