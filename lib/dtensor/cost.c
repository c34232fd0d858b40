/* lib/dtensor/cost.c: PyTorch's alpha-beta cost model for redistribution
 * (torch/distributed/tensor/_collective_utils.py: MeshTopoInfo,
 * allgather_cost, allreduce_cost, reduce_scatter_cost, redistribute_cost).
 *
 * What it is: pure arithmetic on mesh sizes and byte counts, in microseconds.
 * What it is not: a measurement or a ring model of the wire (the comm ledger
 * records what really moved), and it ignores chunk padding as PyTorch does.
 * No allocation, no communication, no printing.
 */
#include "config.h"

#include <math.h>

#include "dtensor/dtensor.h"

/* PyTorch's MeshTopoInfo constants: 87.7 GB/s and 0.6 us per hop inside a host;
 * inter-host dims get bandwidth * 0.22 (19.294 GB/s) and 2.7 us ("ethernet"). */
#define DT_TOPO_BW_GBPS 87.7
#define DT_TOPO_LAT_US 0.6
#define DT_TOPO_INTER_BW_FACTOR 0.22
#define DT_TOPO_INTER_LAT_US 2.7
/* The fixed launch latency of every collective in PyTorch's cost functions (us). */
#define DT_COST_BASE_US 6.6
/* PyTorch converts bytes to GB with three divisions by 1024. */
#define DT_BYTES_PER_GB 1073741824.0
/* GB / (GB/s) = s; times 1e6 gives microseconds. */
#define DT_US_PER_S 1e6
/* redistribute_cost adds 1.0 us to S(a) -> S(b) so that all_gather is preferred
 * over all_to_all at equal volume (PyTorch's comment: "penalty"). */
#define DT_A2A_PENALTY_US 1.0

void dt_topo_build(int mesh_ndim, const int *mesh_shape, int devices_per_host, dt_topo *out) {
  if (!out) return;
  if (mesh_ndim < 0) mesh_ndim = 0;
  if (mesh_ndim > DT_MAX_MESH_DIMS) mesh_ndim = DT_MAX_MESH_DIMS;
  /* A host holds at least one device; a nonsense count is read as a CPU mesh. */
  if (devices_per_host < 1) devices_per_host = 1;
  out->mesh_ndim = mesh_ndim;
  for (int i = 0; i < DT_MAX_MESH_DIMS; i++) {
    out->bw_gbps[i] = DT_TOPO_BW_GBPS;
    out->lat_us[i] = DT_TOPO_LAT_US;
    out->size[i] = i < mesh_ndim && mesh_shape ? mesh_shape[i] : 1;
  }
  /* Walk last -> first multiplying sizes; once the product exceeds one host,
   * this dim and (the product only grows) every earlier one cross hosts. */
  double total = 1.0;
  for (int i = mesh_ndim - 1; i >= 0; i--) {
    total *= out->size[i] > 0 ? out->size[i] : 1;
    if (total > devices_per_host) {
      out->bw_gbps[i] *= DT_TOPO_INTER_BW_FACTOR;
      out->lat_us[i] = DT_TOPO_INTER_LAT_US;
    }
  }
}

/* n devices of mesh dim d, or 0 when d is not a dim of t. */
static int topo_n(const dt_topo *t, int d) {
  if (!t || d < 0 || d >= t->mesh_ndim) return 0;
  return t->size[d];
}

/* The shared ring formula: base + hops * factor * lat + 1e6 * GB * hops * factor / n / bw,
 * with factor 1 for all_gather / reduce_scatter and 2 for all_reduce. A group of
 * one issues no collective in the executor, so it costs 0. */
static double ring_cost(const dt_topo *t, int d, double bytes, double factor) {
  int n = topo_n(t, d);
  if (n <= 1) return 0.0;
  double hops = (double)(n - 1);
  double gb = bytes / DT_BYTES_PER_GB;
  return DT_COST_BASE_US + factor * hops * t->lat_us[d] +
         DT_US_PER_S * gb * factor * hops / (double)n / t->bw_gbps[d];
}

double dt_cost_allgather(const dt_topo *t, int mesh_dim, double bytes) {
  return ring_cost(t, mesh_dim, bytes, 1.0);
}

double dt_cost_reduce_scatter(const dt_topo *t, int mesh_dim, double bytes) {
  return ring_cost(t, mesh_dim, bytes, 1.0);
}

double dt_cost_allreduce(const dt_topo *t, int mesh_dim, double bytes) {
  return ring_cost(t, mesh_dim, bytes, 2.0);
}

static bool pl_eq(dt_placement a, dt_placement b) {
  if (a.kind != b.kind) return false;
  if (a.kind == DT_PL_SHARD) return a.dim == b.dim;
  if (a.kind == DT_PL_PARTIAL) return a.op == b.op;
  return true;
}

/* One mesh dim of redistribute_cost: the cost of cur -> tgt given local bytes
 * *b before it; updates *b to the local bytes after it. Equal placements and
 * size-1 dims cost 0 (no comm); S -> P and P(x) -> P(y) cost INFINITY. */
static double dim_cost(const dt_topo *t, int d, dt_placement cur, dt_placement tgt, double *b) {
  if (pl_eq(cur, tgt)) return 0.0;
  if (tgt.kind == DT_PL_PARTIAL && cur.kind != DT_PL_REPLICATE) return INFINITY;
  int n = topo_n(t, d);
  if (n < 1) n = 1;
  double c = 0.0;
  if (cur.kind == DT_PL_SHARD && tgt.kind == DT_PL_REPLICATE) {
    *b *= n;
    c = dt_cost_allgather(t, d, *b);
  } else if (cur.kind == DT_PL_SHARD && tgt.kind == DT_PL_SHARD) {
    c = n > 1 ? dt_cost_allgather(t, d, *b) + DT_A2A_PENALTY_US : 0.0;
  } else if (cur.kind == DT_PL_PARTIAL && tgt.kind == DT_PL_REPLICATE) {
    c = dt_cost_allreduce(t, d, *b);
  } else if (cur.kind == DT_PL_PARTIAL && tgt.kind == DT_PL_SHARD) {
    c = dt_cost_reduce_scatter(t, d, *b);
    *b /= n;
  } else if (cur.kind == DT_PL_REPLICATE && tgt.kind == DT_PL_SHARD) {
    *b /= n; /* no comm; the local piece shrinks (recent PyTorch divides B by n here too) */
  }
  /* R -> P: local partition, 0 and bytes unchanged. */
  return c;
}

double dt_redistribute_cost(const dt_topo *t, double global_bytes, const dt_placement *cur,
                            const dt_placement *tgt) {
  if (!t || !cur || !tgt) return INFINITY;
  bool replicated = true;
  double shards = 1.0;
  for (int i = 0; i < t->mesh_ndim; i++) {
    if (cur[i].kind != DT_PL_REPLICATE) replicated = false;
    if (cur[i].kind == DT_PL_SHARD) shards *= t->size[i];
  }
  /* PyTorch: a replicated source costs 0 whatever the target. */
  if (replicated) return 0.0;
  double b = global_bytes / shards, cost = 0.0;
  for (int i = 0; i < t->mesh_ndim; i++) {
    double c = dim_cost(t, i, cur[i], tgt[i], &b);
    if (isinf(c)) return INFINITY;
    cost += c;
  }
  return cost;
}

double dt_step_cost(const dt_topo *t, const dt_redist_step *s, double local_bytes) {
  if (!t || !s) return INFINITY;
  if (topo_n(t, s->mesh_dim) < 1) return INFINITY;
  double b = local_bytes;
  return dim_cost(t, s->mesh_dim, s->src, s->dst, &b);
}
