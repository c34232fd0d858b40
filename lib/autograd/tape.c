/* lib/autograd/tape.c: the per-rank tape of DTensor ops and reverse-mode backward.
 *
 * Variables and nodes are kept in arrays owned by the tape (allocated with the
 * rank's counted allocator, so ctx->mem shows them). A node is one recorded call:
 * an op of lib/ops with a copy of its attrs, or a redistribute with the source
 * placements. dt_backward walks the nodes from last to first; a node runs when
 * one of its outputs has a gradient, by the op's backward (DTensor ops via
 * dt_op_call) or by a redistribute (PyTorch's Redistribute.backward rule, see
 * autograd.h), and its inputs' gradients accumulate with dt_op_add. Nodes are
 * appended in execution order, so reverse order is a valid topological order.
 *
 * Checkpointed regions (autograd.h): a node remembers its region (1-based, 0:
 * none) and whether the save policy kept its outputs; a freed variable keeps
 * its DTensor's metadata (mesh, placements, shape) with no data, which is what
 * the recompute writes into again.
 *
 * What it is not: no graph pruning beyond "no output gradient, skip", no
 * retain_graph bookkeeping (the graph is never freed before the tape), no
 * recording of backward itself.
 */
#include "config.h"

#include <string.h>

#include "autograd/autograd.h"

struct dt_var {
  dt_tensor value;
  dt_tensor grad;
  bool has_grad;
  bool requires_grad;
  bool leaf;
  bool ac_freed;                        /* its value freed by a checkpointed region */
  bool ac_kept;                         /* a region's output: never freed by it */
  /* Lifetime (autograd.h, dt_var_release): readers counts the recorded backwards
   * (and recomputes) still to come that read the value; a released value is freed
   * when none is left and no view pins it. */
  int readers;
  int pins;                             /* live views of this value's data */
  dt_var *base;                         /* a view: the variable whose data it shows */
  bool released;                        /* the program holds it no more */
  bool freed;                           /* its value freed once released and unread */
  bool custom_out;                      /* a custom function's output: its caller's memory */
  bool unsaved;                         /* made by a checkpointed call that is recomputed */
  bool accum_set;                       /* its gradient is kept in accum_dtype */
  dt_dtype accum_dtype;
};

typedef enum node_kind { NODE_OP = 0, NODE_REDIST = 1, NODE_CUSTOM = 2 } node_kind;

typedef struct node {
  node_kind kind;
  const dt_op *op;                      /* NODE_OP */
  dt_op_attrs attrs;
  int n_in, n_out;
  dt_var *in[DT_OP_MAX_IN];
  dt_var *out[DT_OP_MAX_OUT];
  dt_placement src[DT_MAX_MESH_DIMS];   /* NODE_REDIST: the source placements */
  /* NODE_CUSTOM: any arity, arrays owned by the tape */
  dt_var **cin, **cout;
  dt_ad_backward_fn backward;
  void *state;
  int region;                           /* checkpointed region, 1-based; 0: none */
  bool saved;                           /* in a region: outputs kept (not recomputed) */
  char scope[DT_LABEL_LEN];             /* ctx->scope (module fqn) when recorded: its backward's */
} node;

/* A checkpointed region: nodes [first, end); freed: its unsaved values are freed now. */
typedef struct region {
  size_t first, end;
  bool freed;
  bool recompute_read;                  /* its recompute's readers still counted */
  int fault_zero_call;
} region;

struct dt_tape {
  dt_ctx *ctx;
  dt_tape_opts opts;
  dt_var **vars;
  size_t n_vars, cap_vars;
  node *nodes;
  size_t n_nodes, cap_nodes;
  region *regions;
  size_t n_regions, cap_regions;
  bool open;                            /* regions[n_regions - 1] is being recorded */
  dt_checkpoint_opts ac;                /* the open region's */
  size_t backward_start_bytes;          /* dt_tape_value_bytes when dt_backward began */
  dt_mem_peak_at forward_peak[2];       /* the rank's host, device peaks then */
};

enum { TAPE_INIT_CAP = 16 }; /* first array size; arrays double when full */

/* Grows a counted host array of `es`-byte elements to hold at least n + 1. */
static dt_status grow(dt_ctx *ctx, void **arr, size_t *cap, size_t n, size_t es) {
  if (n < *cap) return DT_OK;
  size_t nc = *cap ? 2 * *cap : TAPE_INIT_CAP;
  void *p = dt_host_alloc(ctx, nc * es);
  if (!p) return dt_error(ctx, DT_ERR_NOMEM, "dt_tape", "no memory for %zu entries", nc);
  if (*arr) {
    memcpy(p, *arr, n * es);
    dt_host_free(ctx, *arr);
  }
  *arr = p;
  *cap = nc;
  return DT_OK;
}

dt_status dt_tape_create(dt_ctx *ctx, const dt_tape_opts *opts, dt_tape **out) {
  if (!ctx || !out) return dt_error(ctx, DT_ERR_INVALID, "dt_tape_create", "NULL argument");
  *out = NULL;
  dt_tape *t = dt_host_calloc(ctx, sizeof *t);
  if (!t) return dt_error(ctx, DT_ERR_NOMEM, "dt_tape_create", "no memory");
  t->ctx = ctx;
  if (opts) t->opts = *opts;
  *out = t;
  return DT_OK;
}

/* A leaf's gradient is noted as such (DT_MEM_NOTE_GRADS), so a peak can tell the
 * parameters' gradients from the activations. */
static void note_grad(dt_ctx *ctx, const dt_var *v, const dt_tensor *g, bool add) {
  if (v->leaf && g->local.owns && g->local.data)
    dt_mem_note(ctx, g->local.dev != DT_DEV_CPU, DT_MEM_NOTE_GRADS, dt_array_bytes(&g->local), add);
}

static void var_drop_grad(dt_ctx *ctx, dt_var *v) {
  if (v->has_grad) {
    note_grad(ctx, v, &v->grad, false);
    dt_tensor_free(ctx, &v->grad);
  }
  memset(&v->grad, 0, sizeof v->grad);
  v->has_grad = false;
}

void dt_tape_free(dt_tape *t) {
  if (!t) return;
  dt_ctx *ctx = t->ctx;
  for (size_t i = 0; i < t->n_vars; i++) {
    dt_var *v = t->vars[i];
    dt_tensor_free(ctx, &v->value);
    var_drop_grad(ctx, v);
    dt_host_free(ctx, v);
  }
  for (size_t i = 0; i < t->n_nodes; i++)
    if (t->nodes[i].kind == NODE_CUSTOM) {
      dt_host_free(ctx, t->nodes[i].cin);
      dt_host_free(ctx, t->nodes[i].cout);
    }
  dt_host_free(ctx, t->vars);
  dt_host_free(ctx, t->nodes);
  dt_host_free(ctx, t->regions);
  dt_host_free(ctx, t);
}

static bool aliases(const dt_var *x, const dt_var *v);

/* A new variable owning *value (moved: *value is zeroed). On failure the value
 * is freed. */
static dt_var *new_var(dt_tape *t, dt_tensor *value, bool requires_grad, bool leaf) {
  dt_ctx *ctx = t->ctx;
  dt_var *v = NULL;
  if (grow(ctx, (void **)&t->vars, &t->cap_vars, t->n_vars, sizeof *t->vars) == DT_OK)
    v = dt_host_calloc(ctx, sizeof *v);
  if (!v) {
    dt_tensor_free(ctx, value);
    dt_error(ctx, DT_ERR_NOMEM, "dt_var", "no memory for a variable");
    return NULL;
  }
  v->value = *value;
  memset(value, 0, sizeof *value);
  v->requires_grad = requires_grad;
  v->leaf = leaf;
  t->vars[t->n_vars++] = v;
  return v;
}

/* Whether node n's backward reads the data of its input (out: output) j. A
 * redistribute's and a custom function's backward read only the gradients. */
static bool reads(const node *n, bool out, int j) {
  if (n->kind != NODE_OP) return false;
  return !(((out ? n->op->bwd_meta_out : n->op->bwd_meta_in) >> j) & 1u);
}

/* Frees v's value when the program released it, nothing still to come reads it
 * and no view pins it; a view instead unpins what it shows. Leaves and custom
 * outputs (the caller's memory, such as FSDP's unsharded parameters) are never
 * freed here. A recomputed call's output is marked as a checkpointed region's
 * freed value, so a recompute would restore it. */
static void maybe_free(dt_tape *t, dt_var *v) {
  if (!v->released || v->readers > 0 || v->pins > 0 || v->leaf || v->freed) return;
  if (v->base) {
    dt_var *b = v->base;
    v->base = NULL;
    v->freed = true;
    b->pins--;
    maybe_free(t, b);
    return;
  }
  if (v->custom_out || v->ac_freed || !v->value.local.owns || !v->value.local.data) return;
  dt_array_free(t->ctx, &v->value.local);
  if (v->unsaved) v->ac_freed = true;
  else v->freed = true;
}

static void unread(dt_tape *t, dt_var *v) {
  if (v->readers > 0) v->readers--;
  maybe_free(t, v);
}

void dt_var_accumulate_in(dt_var *v, dt_dtype dtype) {
  if (!v) return;
  v->accum_set = true;
  v->accum_dtype = dtype;
}

void dt_var_release(dt_tape *t, dt_var *v) {
  if (!t || !v) return;
  v->released = true;
  maybe_free(t, v);
}

size_t dt_tape_mark(const dt_tape *t) { return t ? t->n_vars : 0; }

void dt_tape_release_since(dt_tape *t, size_t mark, int n_keep, dt_var *const *keep) {
  if (!t) return;
  for (size_t i = mark; i < t->n_vars; i++) {
    dt_var *v = t->vars[i];
    bool kept = false;
    for (int k = 0; k < n_keep && !kept; k++) kept = keep[k] == v;
    if (!kept) dt_var_release(t, v);
  }
}

/* Counts the readers of a node just recorded. */
static void count_readers(node *n) {
  for (int j = 0; j < n->n_in; j++)
    if (reads(n, false, j)) n->in[j]->readers++;
  for (int j = 0; j < n->n_out; j++)
    if (reads(n, true, j)) n->out[j]->readers++;
}

dt_var *dt_var_leaf(dt_tape *t, dt_tensor *value, bool requires_grad) {
  if (!t || !value) return NULL;
  return new_var(t, value, requires_grad, true);
}

const dt_tensor *dt_var_value(const dt_var *v) { return v ? &v->value : NULL; }
const dt_tensor *dt_var_grad(const dt_var *v) { return v && v->has_grad ? &v->grad : NULL; }
bool dt_var_requires_grad(const dt_var *v) { return v && v->requires_grad; }

void dt_tape_zero_grad(dt_tape *t) {
  if (!t) return;
  for (size_t i = 0; i < t->n_vars; i++) var_drop_grad(t->ctx, t->vars[i]);
}

/* A new node's region fields: in the open region, the save policy decides. */
static void node_region(dt_tape *t, node *n, const dt_ad_call_info *call) {
  if (!t->open) return;
  n->region = (int)t->n_regions;
  /* a custom function's forward is the caller's: it is never re-run */
  n->saved = !call || (t->ac.save && t->ac.save(t->ac.state, call));
}

/* DT_ERR_INVALID when one of in[0..n) was freed by a checkpointed region. */
static dt_status check_not_freed(dt_ctx *ctx, const char *who, int n, dt_var *const *in) {
  for (int j = 0; j < n; j++)
    if (in[j] && in[j]->ac_freed)
      return dt_error(ctx, DT_ERR_INVALID, who,
                      "input %d was freed by activation checkpointing (not a region's output)", j);
    else if (in[j] && in[j]->freed)
      return dt_error(ctx, DT_ERR_INVALID, who, "input %d was released and freed", j);
  return DT_OK;
}

dt_status dt_ad_op(dt_tape *t, const dt_op *op, const dt_op_attrs *attrs, dt_var *const *in,
                   dt_var **out) {
  dt_ctx *ctx = t ? t->ctx : NULL;
  if (!t || !op || !in || !out) return dt_error(ctx, DT_ERR_INVALID, "dt_ad_op", "NULL argument");
  if (op->n_in > DT_OP_MAX_IN || op->n_out > DT_OP_MAX_OUT || op->n_in < 1)
    return dt_error(ctx, DT_ERR_INVALID, "dt_ad_op", "%s: bad arity", op->name);
  static const dt_op_attrs zero_attrs;
  if (!attrs) attrs = &zero_attrs;
  bool need = false;
  const dt_tensor *iv[DT_OP_MAX_IN];
  for (int j = 0; j < op->n_out; j++) out[j] = NULL;
  for (int j = 0; j < op->n_in; j++) {
    if (!in[j]) return dt_error(ctx, DT_ERR_INVALID, "dt_ad_op", "%s: input %d is NULL", op->name, j);
    iv[j] = &in[j]->value;
    need = need || in[j]->requires_grad;
  }
  DT_CHECK(check_not_freed(ctx, "dt_ad_op", op->n_in, in));
  if (need && !op->backward)
    return dt_error(ctx, DT_ERR_UNSUPPORTED, "dt_ad_op", "%s has no backward", op->name);
  if (need) { /* reserve the node first, so recording cannot fail after the call */
    DT_CHECK(grow(ctx, (void **)&t->nodes, &t->cap_nodes, t->n_nodes, sizeof *t->nodes));
  }
  dt_tensor ov[DT_OP_MAX_OUT];
  dt_tensor *op_out[DT_OP_MAX_OUT];
  for (int j = 0; j < op->n_out; j++) op_out[j] = &ov[j];
  DT_CHECK(dt_op_call(ctx, op, attrs, iv, op_out, NULL));
  dt_var *ovar[DT_OP_MAX_OUT] = {NULL};
  for (int j = 0; j < op->n_out; j++) {
    ovar[j] = new_var(t, &ov[j], need, false);
    if (!ovar[j]) { /* new_var freed ov[j]; free the rest (the made vars stay on the tape) */
      for (int k = j + 1; k < op->n_out; k++) dt_tensor_free(ctx, &ov[k]);
      return DT_ERR_NOMEM;
    }
  }
  if (need) {
    node *n = &t->nodes[t->n_nodes++];
    memset(n, 0, sizeof *n);
    n->kind = NODE_OP;
    memcpy(n->scope, ctx->scope, sizeof n->scope);
    n->op = op;
    n->attrs = *attrs;
    n->n_in = op->n_in;
    n->n_out = op->n_out;
    for (int j = 0; j < op->n_in; j++) n->in[j] = in[j];
    for (int j = 0; j < op->n_out; j++) n->out[j] = ovar[j];
    const dt_ad_call_info call = {op, 0, NULL, NULL};
    node_region(t, n, &call);
    count_readers(n);
    for (int j = 0; j < op->n_out; j++) ovar[j]->unsaved = n->region && !n->saved;
  }
  for (int j = 0; j < op->n_out; j++) out[j] = ovar[j];
  return DT_OK;
}

dt_status dt_ad_redistribute(dt_tape *t, dt_var *x, const dt_placement *dst, dt_var **out) {
  dt_ctx *ctx = t ? t->ctx : NULL;
  if (!t || !x || !dst || !out)
    return dt_error(ctx, DT_ERR_INVALID, "dt_ad_redistribute", "NULL argument");
  *out = NULL;
  DT_CHECK(check_not_freed(ctx, "dt_ad_redistribute", 1, &x));
  if (x->requires_grad)
    DT_CHECK(grow(ctx, (void **)&t->nodes, &t->cap_nodes, t->n_nodes, sizeof *t->nodes));
  dt_tensor y;
  DT_CHECK(dt_redistribute(ctx, &x->value, dst, DT_PLANNER_GREEDY, &y));
  dt_var *v = new_var(t, &y, x->requires_grad, false);
  if (!v) return DT_ERR_NOMEM;
  if (x->requires_grad) {
    node *n = &t->nodes[t->n_nodes++];
    memset(n, 0, sizeof *n);
    n->kind = NODE_REDIST;
    memcpy(n->scope, ctx->scope, sizeof n->scope);
    n->n_in = n->n_out = 1;
    n->in[0] = x;
    n->out[0] = v;
    for (int i = 0; i < x->value.mesh_ndim; i++) n->src[i] = x->value.pl[i];
    const dt_ad_call_info call = {NULL, x->value.mesh_ndim, n->src, v->value.pl};
    node_region(t, n, &call);
    v->unsaved = n->region && !n->saved;
  }
  *out = v;
  return DT_OK;
}

dt_status dt_ad_custom(dt_tape *t, const char *name, dt_ad_backward_fn backward, void *state,
                       int n_in, dt_var *const *in, int n_out, dt_tensor *values, dt_var **out) {
  static const char WHO[] = "dt_ad_custom";
  dt_ctx *ctx = t ? t->ctx : NULL;
  dt_status s = DT_OK;
  bool need = false;
  if (!t || !backward || n_in < 0 || n_out < 1 || (n_in && !in) || !values || !out)
    s = dt_error(ctx, DT_ERR_INVALID, WHO, "%s: bad arguments", name ? name : "?");
  for (int j = 0; s == DT_OK && j < n_in; j++) {
    if (!in[j]) s = dt_error(ctx, DT_ERR_INVALID, WHO, "%s: input %d is NULL", name, j);
    else need = need || in[j]->requires_grad;
  }
  if (s == DT_OK) s = check_not_freed(ctx, WHO, n_in, in);
  dt_var **cin = NULL, **cout = NULL;
  if (s == DT_OK && need) {
    s = grow(ctx, (void **)&t->nodes, &t->cap_nodes, t->n_nodes, sizeof *t->nodes);
    cin = s == DT_OK ? dt_host_alloc(ctx, sizeof *cin * (size_t)(n_in ? n_in : 1)) : NULL;
    cout = s == DT_OK ? dt_host_alloc(ctx, sizeof *cout * (size_t)n_out) : NULL;
    if (s == DT_OK && (!cin || !cout)) s = dt_error(ctx, DT_ERR_NOMEM, WHO, "no memory");
  }
  for (int j = 0; j < n_out; j++) {
    if (out) out[j] = NULL;
    if (s == DT_OK && !(out[j] = new_var(t, &values[j], need, false))) s = DT_ERR_NOMEM;
    else if (s != DT_OK && values) dt_tensor_free(ctx, &values[j]);
    if (s != DT_OK || !out[j]) continue;
    out[j]->custom_out = true;
    /* an output that views an input's data pins that input (its owner) */
    for (int i = 0; i < n_in && !out[j]->value.local.owns; i++)
      if (aliases(out[j], in[i])) {
        out[j]->base = in[i]->base ? in[i]->base : in[i];
        out[j]->base->pins++;
        break;
      }
  }
  if (s != DT_OK) {
    dt_host_free(ctx, cin);
    dt_host_free(ctx, cout);
    return s;
  }
  if (need) {
    node *n = &t->nodes[t->n_nodes++];
    memset(n, 0, sizeof *n);
    n->kind = NODE_CUSTOM;
    memcpy(n->scope, ctx->scope, sizeof n->scope);
    n->n_in = n_in;
    n->n_out = n_out;
    for (int j = 0; j < n_in; j++) cin[j] = in[j];
    for (int j = 0; j < n_out; j++) cout[j] = out[j];
    n->cin = cin;
    n->cout = cout;
    n->backward = backward;
    n->state = state;
    node_region(t, n, NULL);
  }
  return DT_OK;
}

/* ---- checkpointed regions ------------------------------------------------------------ */

dt_status dt_tape_checkpoint_begin(dt_tape *t, const dt_checkpoint_opts *o) {
  static const char WHO[] = "dt_tape_checkpoint_begin";
  dt_ctx *ctx = t ? t->ctx : NULL;
  if (!t) return dt_error(ctx, DT_ERR_INVALID, WHO, "NULL tape");
  if (t->open) return dt_error(ctx, DT_ERR_INVALID, WHO, "a region is open (regions do not nest)");
  DT_CHECK(grow(ctx, (void **)&t->regions, &t->cap_regions, t->n_regions, sizeof *t->regions));
  static const dt_checkpoint_opts none;
  t->ac = o ? *o : none;
  region *r = &t->regions[t->n_regions++];
  memset(r, 0, sizeof *r);
  r->first = r->end = t->n_nodes;
  r->fault_zero_call = t->ac.fault_zero_call;
  t->open = true;
  return DT_OK;
}

/* Whether x's data lies inside v's owned array. */
static bool aliases(const dt_var *x, const dt_var *v) {
  const char *b = v->value.local.data, *p = x->value.local.data;
  return b && p && p >= b && p < b + dt_array_bytes(&v->value.local);
}

/* Whether v (an unsaved output of region r) may be freed: not one of keep[], and
 * no kept variable of the region (keep[], saved outputs) is a view into it. */
static bool may_free(const dt_tape *t, const region *r, const dt_var *v, int n_keep,
                     dt_var *const *keep) {
  if (v->ac_kept) return false;
  for (int k = 0; k < n_keep; k++)
    if (keep[k] == v || (keep[k] && aliases(keep[k], v))) return false;
  for (size_t i = r->first; i < r->end; i++) {
    const node *n = &t->nodes[i];
    for (int j = 0; n->saved && j < n->n_out; j++) {
      const dt_var *o = n->kind == NODE_CUSTOM ? n->cout[j] : n->out[j];
      if (o == v || aliases(o, v)) return false;
    }
  }
  return true;
}

/* The recompute of region r reads the inputs of its recomputed calls: counted
 * as their readers when the region closes (d = +1), uncounted once the recompute
 * has run (-1), so what it needs is kept until then. */
static void recompute_readers(dt_tape *t, region *r, int d) {
  if ((d > 0) == r->recompute_read) return;
  r->recompute_read = d > 0;
  for (size_t i = r->first; i < r->end; i++) {
    node *n = &t->nodes[i];
    if (n->saved) continue;
    for (int j = 0; j < n->n_in; j++) {
      if (d > 0) n->in[j]->readers++;
      else unread(t, n->in[j]);
    }
  }
}

/* Frees region r's unsaved values (keep[]: its outputs, kept). */
static void region_free(dt_tape *t, region *r, int n_keep, dt_var *const *keep) {
  for (size_t i = r->first; i < r->end; i++) {
    node *n = &t->nodes[i];
    if (n->saved) continue;
    for (int j = 0; j < n->n_out; j++) {
      dt_var *v = n->out[j];
      if (v->ac_freed || !may_free(t, r, v, n_keep, keep)) continue;
      dt_array_free(t->ctx, &v->value.local);
      v->ac_freed = true;
    }
  }
  r->freed = true;
}

dt_status dt_tape_checkpoint_end(dt_tape *t, int n_keep, dt_var *const *keep) {
  static const char WHO[] = "dt_tape_checkpoint_end";
  dt_ctx *ctx = t ? t->ctx : NULL;
  if (!t || n_keep < 0 || (n_keep && !keep))
    return dt_error(ctx, DT_ERR_INVALID, WHO, "bad arguments");
  if (!t->open) return dt_error(ctx, DT_ERR_INVALID, WHO, "no region is open");
  t->open = false;
  region *r = &t->regions[t->n_regions - 1];
  r->end = t->n_nodes;
  for (int k = 0; k < n_keep; k++)
    if (keep[k]) keep[k]->ac_kept = true;
  recompute_readers(t, r, +1);
  region_free(t, r, n_keep, keep);
  return DT_OK;
}

size_t dt_tape_backward_start_bytes(const dt_tape *t) { return t ? t->backward_start_bytes : 0; }

void dt_tape_forward_peak_at(const dt_tape *t, bool device, dt_mem_peak_at *out) {
  memset(out, 0, sizeof *out);
  if (t) *out = t->forward_peak[device ? 1 : 0];
}

size_t dt_tape_value_bytes(const dt_tape *t) {
  size_t b = 0;
  for (size_t i = 0; t && i < t->n_vars; i++) {
    const dt_array *a = &t->vars[i]->value.local;
    if (a->owns && a->data) b += dt_array_bytes(a);
  }
  return b;
}

/* Zeroes a recomputed value (the planted bug of dt_checkpoint_opts). */
static void fault_zero(dt_tensor *v) {
  if (v->local.data && v->local.dev == DT_DEV_CPU)
    memset(v->local.data, 0, dt_array_bytes(&v->local));
}

/* Recomputes region r's freed values: its calls again in forward order, phase
 * "recompute" (the ledgers' rows say so). */
static dt_status region_recompute(dt_tape *t, region *r) {
  dt_ctx *ctx = t->ctx;
  char saved[sizeof ctx->phase];
  memcpy(saved, ctx->phase, sizeof saved);
  dt_ctx_set_phase(ctx, "recompute");
  dt_status s = DT_OK;
  int calls = 0;
  for (size_t i = r->first; i < r->end && s == DT_OK; i++) {
    node *n = &t->nodes[i];
    bool any = false;
    for (int j = 0; !n->saved && j < n->n_out; j++) any = any || n->out[j]->ac_freed;
    if (!any) continue;
    for (int j = 0; j < n->n_in && s == DT_OK; j++) {
      const dt_array *a = &n->in[j]->value.local;
      if (n->in[j]->ac_freed)
        s = dt_error(ctx, DT_ERR_INTERNAL, "dt_backward", "recompute: an input is not recomputed");
      else if (a->numel > 0 && !a->data) /* e.g. an FSDP unit inside the region, resharded */
        s = dt_error(ctx, DT_ERR_UNSUPPORTED, "dt_backward",
                     "recompute: input %d of a checkpointed call has no data (freed by its "
                     "owner, such as an FSDP unit smaller than the checkpointed block)", j);
    }
    if (s != DT_OK) break;
    dt_tensor ov[DT_OP_MAX_OUT];
    memset(ov, 0, sizeof ov);
    if (n->kind == NODE_REDIST) {
      s = dt_redistribute(ctx, &n->in[0]->value, n->out[0]->value.pl, DT_PLANNER_GREEDY, &ov[0]);
    } else {
      const dt_tensor *iv[DT_OP_MAX_IN];
      dt_tensor *op_out[DT_OP_MAX_OUT];
      for (int j = 0; j < n->n_in; j++) iv[j] = &n->in[j]->value;
      for (int j = 0; j < n->n_out; j++) op_out[j] = &ov[j];
      s = dt_op_call(ctx, n->op, &n->attrs, iv, op_out, NULL);
    }
    if (s != DT_OK) break;
    const bool zero = ++calls == r->fault_zero_call;
    for (int j = 0; j < n->n_out; j++) {
      dt_var *v = n->out[j];
      if (!v->ac_freed) {
        dt_tensor_free(ctx, &ov[j]);
        continue;
      }
      if (zero) fault_zero(&ov[j]);
      v->value = ov[j];
      v->ac_freed = false;
    }
  }
  r->freed = false;
  dt_ctx_set_phase(ctx, saved);
  return s;
}

static bool any_partial(const dt_tensor *g) {
  for (int i = 0; i < g->mesh_ndim; i++)
    if (g->pl[i].kind == DT_PL_PARTIAL) return true;
  return false;
}

/* *g with its Partial mesh dims made Replicate (in place; no-op when none). */
static dt_status reduce_partials(dt_ctx *ctx, dt_tensor *g) {
  if (!any_partial(g)) return DT_OK;
  dt_placement dst[DT_MAX_MESH_DIMS];
  for (int i = 0; i < g->mesh_ndim; i++)
    dst[i] = g->pl[i].kind == DT_PL_PARTIAL ? dt_replicate() : g->pl[i];
  dt_tensor r;
  DT_CHECK(dt_redistribute(ctx, g, dst, DT_PLANNER_GREEDY, &r));
  dt_tensor_free(ctx, g);
  *g = r;
  return DT_OK;
}

/* Adds the contribution *g (moved in: always consumed, also on error) to v's
 * gradient. */
static dt_status accumulate(dt_tape *t, dt_var *v, dt_tensor *g) {
  dt_ctx *ctx = t->ctx;
  dt_status s = DT_OK;
  if (t->opts.eager_reduce) s = reduce_partials(ctx, g);
  if (s == DT_OK && v->accum_set && g->dtype != v->accum_dtype) { /* cast, then accumulate */
    dt_op_attrs c;
    memset(&c, 0, sizeof c);
    c.i0 = (int)v->accum_dtype;
    dt_tensor w;
    const dt_tensor *ci[1] = {g};
    dt_tensor *co[1] = {&w};
    s = dt_op_call(ctx, &dt_op_cast, &c, ci, co, NULL);
    dt_tensor_free(ctx, g);
    if (s != DT_OK) return s;
    *g = w;
  }
  if (s != DT_OK) {
    dt_tensor_free(ctx, g);
    return s;
  }
  if (!v->has_grad) {
    v->grad = *g;
    v->has_grad = true;
    memset(g, 0, sizeof *g);
    note_grad(ctx, v, &v->grad, true);
    return DT_OK;
  }
  dt_tensor sum;
  const dt_tensor *ai[2] = {&v->grad, g};
  dt_tensor *ao[1] = {&sum};
  s = dt_op_call(ctx, &dt_op_add, NULL, ai, ao, NULL);
  dt_tensor_free(ctx, g);
  if (s != DT_OK) return s;
  note_grad(ctx, v, &v->grad, false);
  dt_tensor_free(ctx, &v->grad);
  v->grad = sum;
  note_grad(ctx, v, &v->grad, true);
  return DT_OK;
}

/* Backward of a redistribute node (PyTorch's Redistribute.backward, in
 * _redistribute.py): g (the output's gradient, any placements) goes to the
 * source placements, where a Partial source dim becomes Replicate unless g is
 * Partial on that dim too. */
static dt_status redist_backward(dt_tape *t, const node *n, const dt_tensor *g, dt_tensor *gin) {
  dt_placement dst[DT_MAX_MESH_DIMS];
  for (int i = 0; i < g->mesh_ndim; i++) {
    dt_placement src = n->src[i];
    dst[i] = (src.kind == DT_PL_PARTIAL && g->pl[i].kind != DT_PL_PARTIAL) ? dt_replicate() : src;
  }
  return dt_redistribute(t->ctx, g, dst, DT_PLANNER_GREEDY, gin);
}

/* A custom node: its callback fills the inputs' gradients, which accumulate. */
static dt_status run_custom(dt_tape *t, const node *n) {
  dt_ctx *ctx = t->ctx;
  bool any = false;
  for (int j = 0; j < n->n_out; j++) any = any || n->cout[j]->has_grad;
  if (!any) return DT_OK;
  dt_status s = DT_OK;
  const size_t ni = (size_t)(n->n_in ? n->n_in : 1);
  const dt_tensor **gout = dt_host_alloc(ctx, sizeof *gout * (size_t)n->n_out);
  dt_tensor *gbuf = dt_host_calloc(ctx, sizeof *gbuf * ni);
  dt_tensor **gin = dt_host_calloc(ctx, sizeof *gin * ni);
  if (!gout || !gbuf || !gin) s = dt_error(ctx, DT_ERR_NOMEM, "dt_backward", "no memory");
  if (s == DT_OK) {
    for (int j = 0; j < n->n_out; j++) gout[j] = n->cout[j]->has_grad ? &n->cout[j]->grad : NULL;
    for (int j = 0; j < n->n_in; j++) gin[j] = n->cin[j]->requires_grad ? &gbuf[j] : NULL;
    s = n->backward(ctx, n->state, n->n_out, gout, n->n_in, gin);
  }
  for (int j = 0; gin && j < n->n_in; j++) {
    if (!gin[j]) continue;
    if (s != DT_OK || !gbuf[j].mesh) {
      dt_tensor_free(ctx, &gbuf[j]);
      continue;
    }
    dt_status s2 = accumulate(t, n->cin[j], &gbuf[j]);
    if (s == DT_OK) s = s2;
  }
  for (int j = 0; j < n->n_out; j++)
    if (!n->cout[j]->leaf) var_drop_grad(ctx, n->cout[j]);
  dt_host_free(ctx, gout);
  dt_host_free(ctx, gbuf);
  dt_host_free(ctx, gin);
  return s;
}

static dt_status run_node(dt_tape *t, const node *n) {
  dt_ctx *ctx = t->ctx;
  if (n->kind == NODE_CUSTOM) return run_custom(t, n);
  bool any = false;
  for (int j = 0; j < n->n_out; j++) any = any || n->out[j]->has_grad;
  if (!any) return DT_OK;
  for (int j = 0; j < n->n_in + n->n_out; j++) {
    const bool o = j >= n->n_in;
    const dt_var *v = o ? n->out[j - n->n_in] : n->in[j];
    if (reads(n, o, o ? j - n->n_in : j) && v->freed)
      return dt_error(ctx, DT_ERR_INVALID, "dt_backward",
                      "%s: a value its backward reads was released and freed by an earlier "
                      "backward (the graph is not retained)", n->op ? n->op->name : "?");
  }
  dt_tensor gbuf[DT_OP_MAX_IN];
  dt_tensor *gin[DT_OP_MAX_IN] = {NULL};
  memset(gbuf, 0, sizeof gbuf);
  dt_status s = DT_OK;
  if (n->kind == NODE_REDIST) {
    if (n->in[0]->requires_grad) {
      s = redist_backward(t, n, &n->out[0]->grad, &gbuf[0]);
      if (s == DT_OK) gin[0] = &gbuf[0];
    }
  } else {
    const dt_tensor *iv[DT_OP_MAX_IN], *ov[DT_OP_MAX_OUT], *gout[DT_OP_MAX_OUT];
    for (int j = 0; j < n->n_in; j++) {
      iv[j] = &n->in[j]->value;
      if (n->in[j]->requires_grad) gin[j] = &gbuf[j];
    }
    for (int j = 0; j < n->n_out; j++) {
      ov[j] = &n->out[j]->value;
      gout[j] = n->out[j]->has_grad ? &n->out[j]->grad : NULL;
    }
    s = n->op->backward(ctx, &n->attrs, iv, ov, gout, gin);
  }
  /* every gradient made is consumed by accumulate (even after an error) */
  for (int j = 0; j < n->n_in; j++) {
    if (!gin[j]) continue;
    if (s != DT_OK || !gbuf[j].mesh) { /* failed, or the backward made none (zero) */
      dt_tensor_free(ctx, &gbuf[j]);
      continue;
    }
    dt_status s2 = accumulate(t, n->in[j], &gbuf[j]);
    if (s == DT_OK) s = s2;
  }
  /* the outputs' gradients are consumed: every use of them came later on the tape */
  for (int j = 0; j < n->n_out; j++)
    if (!n->out[j]->leaf) var_drop_grad(ctx, n->out[j]);
  return s;
}

static dt_status make_seed(dt_tape *t, dt_var *root, const dt_tensor *seed, dt_tensor *g) {
  dt_ctx *ctx = t->ctx;
  const dt_tensor *rv = &root->value;
  if (seed) {
    bool ok = seed->mesh == rv->mesh && seed->ndim == rv->ndim && seed->dtype == rv->dtype;
    for (int d = 0; ok && d < rv->ndim; d++) ok = seed->gshape[d] == rv->gshape[d];
    if (!ok)
      return dt_error(ctx, DT_ERR_INVALID, "dt_backward",
                      "seed differs from the root's mesh, global shape or dtype");
    return dt_tensor_from_local(ctx, seed->mesh, &seed->local, seed->pl, seed->ndim,
                                seed->gshape, g);
  }
  dt_placement pl[DT_MAX_MESH_DIMS];
  for (int i = 0; i < rv->mesh_ndim; i++)
    pl[i] = rv->pl[i].kind == DT_PL_PARTIAL ? dt_replicate() : rv->pl[i];
  /* uniform with a = 1, b = 0: every element exactly 1 (seed/stream unused) */
  return dt_tensor_rand(ctx, rv->mesh, rv->ndim, rv->gshape, rv->dtype, pl, 0, 0, DT_RNG_UNIFORM,
                        1.0, 0.0, g);
}

dt_status dt_backward(dt_tape *t, dt_var *root, const dt_tensor *seed) {
  dt_ctx *ctx = t ? t->ctx : NULL;
  if (!t || !root) return dt_error(ctx, DT_ERR_INVALID, "dt_backward", "NULL argument");
  bool mine = false;
  for (size_t i = 0; i < t->n_vars && !mine; i++) mine = t->vars[i] == root;
  if (!mine) return dt_error(ctx, DT_ERR_INVALID, "dt_backward", "root is not on this tape");
  if (!root->requires_grad)
    return dt_error(ctx, DT_ERR_UNSUPPORTED, "dt_backward", "root does not require a gradient");
  char saved[sizeof ctx->phase];
  memcpy(saved, ctx->phase, sizeof saved);
  dt_ctx_set_phase(ctx, "backward");
  dt_tensor g;
  t->backward_start_bytes = dt_tape_value_bytes(t);
  dt_mem_peak_get(ctx, false, &t->forward_peak[0]);
  dt_mem_peak_get(ctx, true, &t->forward_peak[1]);
  dt_status s = make_seed(t, root, seed, &g);
  if (s == DT_OK) s = accumulate(t, root, &g);
  for (size_t i = t->n_nodes; i-- > 0 && s == DT_OK;) {
    const node *n = &t->nodes[i];
    region *r = n->region ? &t->regions[n->region - 1] : NULL;
    if (r && r->freed && i + 1 == r->end) s = region_recompute(t, r);
    if (s == DT_OK && r && i + 1 == r->end) recompute_readers(t, r, -1);
    dt_ctx_set_scope(ctx, n->scope);
    if (s == DT_OK) s = run_node(t, n);
    /* what this node's backward read is read once less; released values go */
    for (int j = 0; s == DT_OK && j < n->n_in; j++)
      if (reads(n, false, j)) unread(t, n->in[j]);
    for (int j = 0; s == DT_OK && j < n->n_out; j++)
      if (reads(n, true, j)) unread(t, n->out[j]);
    /* the region's backward is done: its recomputed values go again */
    if (s == DT_OK && r && i == r->first) region_free(t, r, 0, NULL);
  }
  /* after an error, leave no half-consumed intermediate gradient behind */
  for (size_t i = 0; i < t->n_vars; i++)
    if (!t->vars[i]->leaf) var_drop_grad(ctx, t->vars[i]);
  dt_ctx_set_phase(ctx, saved);
  dt_ctx_set_scope(ctx, NULL);
  return s;
}

dt_status dt_var_set_grad(dt_tape *t, dt_var *v, dt_tensor *g) {
  dt_ctx *ctx = t ? t->ctx : NULL;
  if (!t || !v) {
    if (g) dt_tensor_free(ctx, g);
    return dt_error(ctx, DT_ERR_INVALID, "dt_var_set_grad", "NULL tape or variable");
  }
  if (g && (g->mesh != v->value.mesh || g->ndim != v->value.ndim ||
            memcmp(g->gshape, v->value.gshape, sizeof(int64_t) * (size_t)g->ndim))) {
    dt_tensor_free(ctx, g);
    return dt_error(ctx, DT_ERR_INVALID, "dt_var_set_grad", "the gradient's mesh or shape differs");
  }
  var_drop_grad(ctx, v);
  if (g) {
    v->grad = *g;
    v->has_grad = true;
    memset(g, 0, sizeof *g);
    note_grad(ctx, v, &v->grad, true);
  }
  return DT_OK;
}

dt_status dt_var_grad_reduce(dt_tape *t, dt_var *v) {
  dt_ctx *ctx = t ? t->ctx : NULL;
  if (!t || !v) return dt_error(ctx, DT_ERR_INVALID, "dt_var_grad_reduce", "NULL argument");
  if (!v->has_grad) return DT_OK;
  char saved[sizeof ctx->phase];
  memcpy(saved, ctx->phase, sizeof saved);
  dt_ctx_set_phase(ctx, "backward");
  dt_status s = reduce_partials(ctx, &v->grad);
  dt_ctx_set_phase(ctx, saved);
  return s;
}
