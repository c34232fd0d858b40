/* lib/ops/registry.c: the table of ops, const data (no mutable global state). */
#include "config.h"

#include <string.h>

#include "ops/ops.h"

static const dt_op *const registry[] = {
    &dt_op_einsum, &dt_op_matmul, &dt_op_linear, &dt_op_add,  &dt_op_sub,  &dt_op_mul,
    &dt_op_scale,  &dt_op_cast,   &dt_op_silu,   &dt_op_swiglu, &dt_op_sum,  &dt_op_mean, &dt_op_softmax,
    &dt_op_view,   &dt_op_reshape, &dt_op_transpose, &dt_op_permute, &dt_op_rms_norm,
    &dt_op_rope,   &dt_op_sdpa,   &dt_op_sdpa_cp, &dt_op_embedding, &dt_op_cross_entropy,
    &dt_op_log_softmax_nll,
};

const dt_op *dt_op_find(const char *name) {
  for (size_t i = 0; name && i < sizeof registry / sizeof registry[0]; i++)
    if (!strcmp(registry[i]->name, name)) return registry[i];
  return NULL;
}

const dt_op *const *dt_op_all(int *n) {
  *n = (int)(sizeof registry / sizeof registry[0]);
  return registry;
}
