/* bench/harness/explain_common.c: what `explain` (a redistribute) and `explain --op`
 * (an op's input redistributions) show alike: a planned redistribute with its
 * per-step estimates, the table and JSON of its steps, the per-rank ledger and
 * its totals over ranks. Declared in cli.h. */
#include "config.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

int sb_plan_view_make(int mesh_ndim, const int *mesh_shape, int ndim, const int64_t *gshape,
                      dt_dtype dtype, const dt_placement *src, const dt_placement *dst,
                      dt_planner planner, sb_plan_view *v, char *err, size_t errn) {
  memset(v, 0, sizeof *v);
  dt_layout lay;
  memset(&lay, 0, sizeof lay);
  lay.mesh_ndim = mesh_ndim;
  memcpy(lay.mesh_shape, mesh_shape, sizeof lay.mesh_shape[0] * (size_t)mesh_ndim);
  lay.ndim = ndim;
  memcpy(lay.gshape, gshape, sizeof lay.gshape[0] * (size_t)ndim);
  lay.dtype = dtype;
  dt_ctx pctx;
  dt_ctx_init(&pctx, 0, 1);
  dt_status s = dt_redistribute_plan(&pctx, &lay, src, dst, planner, &v->plan);
  if (s != DT_OK) {
    const char *m = sb_strip_rank(dt_last_error(&pctx));
    snprintf(err, errn, "%s", m[0] ? m : dt_status_str(s));
    dt_ctx_release(&pctx);
    return SB_PLAN_REFUSED;
  }
  dt_ctx_release(&pctx);
  if (v->plan.n < 0 || v->plan.n > DT_MAX_STEPS) {
    snprintf(err, errn, "the planner returned %d steps", v->plan.n);
    return SB_PLAN_BROKEN;
  }
  /* Per step estimate: the cost model's bytes before a step are the global
   * bytes over the number of shards of the state before it (PyTorch
   * _collective_utils.py redistribute_cost). */
  dt_topo topo;
  dt_topo_build(mesh_ndim, mesh_shape, 1, &topo); /* CPU mesh: 1 device per host */
  dt_placement cur[DT_MAX_MESH_DIMS];
  memcpy(cur, src, sizeof cur[0] * (size_t)mesh_ndim);
  double gbytes = (double)dt_shape_numel(ndim, gshape) * (double)dt_dtype_size(dtype);
  for (int i = 0; i < v->plan.n; i++) {
    const dt_redist_step *st = &v->plan.steps[i];
    v->local_bytes[i] = gbytes / (double)dt_num_shards(mesh_ndim, mesh_shape, cur);
    v->step_cost[i] = dt_step_cost(&topo, st, v->local_bytes[i]);
    if (st->mesh_dim >= 0 && st->mesh_dim < mesh_ndim) cur[st->mesh_dim] = st->dst;
  }
  int len = dt_redist_plan_trace(&v->plan, NULL, 0);
  if (len < 0) len = 0;
  v->trace = malloc((size_t)len + 1);
  if (!v->trace) {
    snprintf(err, errn, "out of memory");
    return SB_PLAN_BROKEN;
  }
  v->trace[0] = '\0';
  dt_redist_plan_trace(&v->plan, v->trace, (size_t)len + 1);
  return SB_PLAN_OK;
}

void sb_plan_view_free(sb_plan_view *v) {
  free(v->trace);
  v->trace = NULL;
}

static const char *dim_name(const sb_mesh_names names, int mesh_ndim, int d) {
  return d >= 0 && d < mesh_ndim ? names[d] : "?";
}

void sb_print_plan_steps(const sb_plan_view *v, const sb_mesh_names names, int mesh_ndim,
                         const char *indent, int prec) {
  if (!v->plan.n) return;
  printf("%s%4s  %-14s %-16s %-15s %12s %10s\n", indent, "step", "mesh dim", "src -> dst", "kind",
         "bytes before", "est. us");
  for (int i = 0; i < v->plan.n; i++) {
    const dt_redist_step *st = &v->plan.steps[i];
    char a[32], b[32], md[48], sd[80];
    dt_placement_str(st->src, a, sizeof a);
    dt_placement_str(st->dst, b, sizeof b);
    snprintf(md, sizeof md, "%d (%s)", st->mesh_dim, dim_name(names, mesh_ndim, st->mesh_dim));
    snprintf(sd, sizeof sd, "%s -> %s", a, b);
    printf("%s%4d  %-14s %-16s %-15s %12.0f %10.*f\n", indent, i + 1, md, sd,
           dt_step_kind_name(st->kind), v->local_bytes[i], prec, v->step_cost[i]);
  }
}

void sb_json_plan_fields(const sb_plan_view *v, const sb_mesh_names names, int mesh_ndim) {
  printf("\"planner\": ");
  sb_json_str(stdout, dt_planner_name(v->plan.planner));
  printf(", \"steps\": [");
  for (int i = 0; i < v->plan.n; i++) {
    const dt_redist_step *st = &v->plan.steps[i];
    char a[32], b[32];
    dt_placement_str(st->src, a, sizeof a);
    dt_placement_str(st->dst, b, sizeof b);
    dt_coll c;
    printf("%s{\"mesh_dim\": %d, \"name\": ", i ? ", " : "", st->mesh_dim);
    sb_json_str(stdout, dim_name(names, mesh_ndim, st->mesh_dim));
    printf(", \"src\": ");
    sb_json_str(stdout, a);
    printf(", \"dst\": ");
    sb_json_str(stdout, b);
    printf(", \"kind\": ");
    sb_json_str(stdout, dt_step_kind_name(st->kind));
    printf(", \"collective\": ");
    if (dt_step_coll(st->kind, &c)) sb_json_str(stdout, dt_coll_name(c));
    else printf("null");
    printf(", \"local_bytes_before\": ");
    sb_json_num(v->local_bytes[i]);
    printf(", \"cost_us\": ");
    sb_json_num(v->step_cost[i]);
    printf("}");
  }
  printf("], \"trace\": ");
  sb_json_str(stdout, v->trace);
  printf(", \"cost_us\": ");
  sb_json_num(v->plan.cost_us);
}

dt_status sb_ledger_copy(dt_ctx *ctx, dt_ledger_row **rows, size_t *n) {
  const dt_ledger *l = dt_ledger_of(ctx);
  *n = 0;
  if (!l->n) return DT_OK;
  *rows = malloc(l->n * sizeof **rows);
  if (!*rows) return dt_error(ctx, DT_ERR_NOMEM, "explain", "cannot copy the ledger");
  memcpy(*rows, l->rows, l->n * sizeof **rows);
  *n = l->n;
  return DT_OK;
}

void sb_ledger_total_add(sb_ledger_total *t, size_t *n, const dt_ledger_row *rows, size_t nrows) {
  for (size_t i = 0; i < nrows; i++) {
    const dt_ledger_row *row = &rows[i];
    size_t k = 0;
    while (k < *n && !(t[k].op == row->op && t[k].reduce == row->reduce &&
                       t[k].group_size == row->group_size && !strcmp(t[k].group, row->group)))
      k++;
    if (k == *n) {
      memset(&t[k], 0, sizeof t[k]);
      t[k].op = row->op;
      t[k].reduce = row->reduce;
      t[k].group_size = row->group_size;
      snprintf(t[k].group, sizeof t[k].group, "%s", row->group);
      (*n)++;
    }
    t[k].calls++;
    t[k].payload += row->payload_bytes;
    t[k].wire += row->wire_bytes;
  }
}

void sb_print_ledger_rows(const dt_ledger_row *rows, size_t n) {
  if (!n) return;
  printf("    %-15s %-6s %-12s %5s %12s %14s %14s\n", "op", "reduce", "group", "size", "elems",
         "payload B", "wire B");
  for (size_t i = 0; i < n; i++) {
    const dt_ledger_row *row = &rows[i];
    printf("    %-15s %-6s %-12s %5d %12" PRIu64 " %14" PRIu64 " %14.0f\n", sb_op_name(row->op),
           sb_red_name(row->reduce), row->group, row->group_size, row->elems, row->payload_bytes,
           row->wire_bytes);
  }
}

void sb_print_ledger_totals(const sb_ledger_total *t, size_t n, int world) {
  printf("  totals over all %d rank%s:%s\n", world, world == 1 ? "" : "s",
         n ? "" : " (no collectives)");
  if (!n) return;
  printf("    %-15s %-6s %-12s %5s %7s %14s %14s\n", "op", "reduce", "group", "size", "calls",
         "payload B", "wire B");
  for (size_t i = 0; i < n; i++)
    printf("    %-15s %-6s %-12s %5d %7" PRIu64 " %14" PRIu64 " %14.0f\n", sb_op_name(t[i].op),
           sb_red_name(t[i].reduce), t[i].group, t[i].group_size, t[i].calls, t[i].payload,
           t[i].wire);
}

/* {"op", "reduce", "group", "group_size", count_key, "payload_bytes", "wire_bytes"} */
static void json_ledger_entry(int op, int reduce, const char *group, int group_size,
                              const char *count_key, uint64_t count, uint64_t payload, double wire) {
  printf("{\"op\": ");
  sb_json_str(stdout, sb_op_name(op));
  printf(", \"reduce\": ");
  if (reduce >= 0) sb_json_str(stdout, sb_red_name(reduce));
  else printf("null");
  printf(", \"group\": ");
  sb_json_str(stdout, group);
  printf(", \"group_size\": %d, \"%s\": %" PRIu64 ", \"payload_bytes\": %" PRIu64 ", \"wire_bytes\": ",
         group_size, count_key, count, payload);
  sb_json_num(wire);
  printf("}");
}

void sb_json_ledger_rows(const dt_ledger_row *rows, size_t n, const char *indent) {
  printf("[");
  for (size_t i = 0; i < n; i++) {
    printf("%s\n%s", i ? "," : "", indent);
    json_ledger_entry(rows[i].op, rows[i].reduce, rows[i].group, rows[i].group_size, "elems",
                      rows[i].elems, rows[i].payload_bytes, rows[i].wire_bytes);
  }
  printf("]");
}

void sb_json_ledger_totals(const sb_ledger_total *t, size_t n, const char *indent) {
  printf("[");
  for (size_t i = 0; i < n; i++) {
    printf("%s\n%s", i ? "," : "", indent);
    json_ledger_entry(t[i].op, t[i].reduce, t[i].group, t[i].group_size, "calls", t[i].calls,
                      t[i].payload, t[i].wire);
  }
  printf("]");
}

void sb_json_shape(int n, const int64_t *v) {
  printf("[");
  for (int i = 0; i < n; i++) printf("%s%" PRId64, i ? ", " : "", v[i]);
  printf("]");
}
