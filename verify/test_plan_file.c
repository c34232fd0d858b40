/* verify/test_plan_file.c: plan files (lib/parallel/plan_file.c, plans/README.md).
 *
 * Parses every shipped plan (from $srcdir/plans: Automake's harness runs tests from
 * the build dir and sets srcdir) and checks its entries, styles and PyTorch defaults
 * against TorchTitan's plan text (apply_tp in
 * torchtitan/models/llama3/infra/parallelize.py, TorchTitan v0.2.0);
 * dt_style_str round trips; dt_fqn_match on parallelize_module's test keys
 * ("net*", "net?", "net[1-2]", "layers.*.net[1]": torch/distributed/tensor/parallel/api.py
 * matches each token with fnmatch; test/distributed/tensor/parallel/test_parallelize_api.py);
 * dt_plan_resolve on debugmodel for several worlds and tp sizes; and every
 * error class, each with DT_ERR_INVALID and a message naming where and what.
 * The FSDP plans (fsdp, hsdp, fsdp-tp-sp, zero1, zero2) against TorchTitan's
 * apply_fsdp units written out here; fully_shard round trips; the zero /
 * mixed_precision_* / bucket_cap_mb settings; fully_shard units that leave a
 * weight out or claim one twice (dt_plan_check_modules).
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "parallel/parallel.h"
#include "testutil.h"

/* debugmodel (llama3_args["debugmodel"] in torchtitan/models/llama3/__init__.py,
 * TorchTitan v0.2.0), written out here apart from lib/nn's table. */
static dt_llama_config debugmodel(void) {
  dt_llama_config c;
  memset(&c, 0, sizeof c);
  snprintf(c.name, sizeof c.name, "debugmodel");
  c.dim = 256;
  c.n_layers = 6;
  c.n_heads = 16;
  c.n_kv_heads = 16;
  c.vocab = 2048;
  c.multiple_of = 256;
  c.norm_eps = 1e-5;
  c.rope_theta = 500000;
  return c;
}

static bool style_eq(const dt_style *a, const dt_style *b) {
  if (a->kind != b->kind || a->n_in != b->n_in || a->n_out != b->n_out ||
      a->use_local_output != b->use_local_output || a->sequence_dim != b->sequence_dim ||
      a->reshard_after_forward != b->reshard_after_forward)
    return false;
  for (int i = 0; i < a->n_in; i++) {
    const dt_style_layout *x = &a->input_layouts[i], *y = &b->input_layouts[i];
    const dt_style_layout *dx = &a->desired_input_layouts[i], *dy = &b->desired_input_layouts[i];
    if (x->none != y->none || (!x->none && !dt_placement_eq(x->pl, y->pl))) return false;
    if (dx->none != dy->none || (!dx->none && !dt_placement_eq(dx->pl, dy->pl))) return false;
  }
  for (int i = 0; i < a->n_out; i++) {
    const dt_style_layout *x = &a->output_layouts[i], *y = &b->output_layouts[i];
    if (x->none != y->none || (!x->none && !dt_placement_eq(x->pl, y->pl))) return false;
    if (a->kind == DT_STYLE_PREPARE_OUTPUT) {
      const dt_style_layout *dx = &a->desired_output_layouts[i], *dy = &b->desired_output_layouts[i];
      if (dx->none != dy->none || (!dx->none && !dt_placement_eq(dx->pl, dy->pl))) return false;
    }
  }
  return true;
}

static dt_style_layout L(dt_placement p) { return (dt_style_layout){.none = false, .pl = p}; }
static dt_style_layout NONE(void) { return (dt_style_layout){.none = true, .pl = {0}}; }

/* TorchTitan's plan (apply_tp in torchtitan/models/llama3/infra/parallelize.py,
 * v0.2.0), in the shipped file's order. */
typedef struct want {
  const char *pattern;
  const char *str; /* dt_style_str */
} want;

static const want k_titan[] = {
    {"tok_embeddings", "RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))"},
    {"norm", "SequenceParallel()"},
    {"output", "ColwiseParallel(input_layouts=Shard(1), use_local_output=False)"},
    {"layers.*.attention_norm", "SequenceParallel()"},
    {"layers.*.attention", "PrepareModuleInput(input_layouts=(Shard(1), None, None), "
                           "desired_input_layouts=(Replicate(), None, None))"},
    {"layers.*.attention.wq", "ColwiseParallel()"},
    {"layers.*.attention.wk", "ColwiseParallel()"},
    {"layers.*.attention.wv", "ColwiseParallel()"},
    {"layers.*.attention.wo", "RowwiseParallel(output_layouts=Shard(1))"},
    {"layers.*.ffn_norm", "SequenceParallel()"},
    {"layers.*.feed_forward", "PrepareModuleInput(input_layouts=(Shard(1),), "
                              "desired_input_layouts=(Replicate(),))"},
    {"layers.*.feed_forward.w1", "ColwiseParallel()"},
    {"layers.*.feed_forward.w2", "RowwiseParallel(output_layouts=Shard(1))"},
    {"layers.*.feed_forward.w3", "ColwiseParallel()"},
};
enum { N_TITAN = (int)(sizeof k_titan / sizeof k_titan[0]) };

/* The [tp] entry with this pattern (plans with [dp_shard] units repeat module names). */
static const dt_plan_entry *find_entry(const dt_plan *p, const char *pat) {
  for (int i = 0; i < p->n_entries; i++)
    if (p->entries[i].dim == dt_plan_dim(p, "tp") && !strcmp(p->entries[i].pattern, pat))
      return &p->entries[i];
  return NULL;
}

/* The entries under [dim], in file order, against w. */
static void check_section(const dt_plan *p, const char *dim, const want *w, int n) {
  int d = dt_plan_dim(p, dim), k = 0;
  TU_CHECK(d >= 0, "%s: no dim %s", p->name, dim);
  for (int i = 0; i < p->n_entries; i++) {
    if (p->entries[i].dim != d) continue;
    if (k < n) {
      char buf[256];
      dt_style_str(&p->entries[i].style, buf, sizeof buf);
      TU_CHECK(!strcmp(p->entries[i].pattern, w[k].pattern), "%s [%s] entry %d: pattern %s want %s",
               p->name, dim, k, p->entries[i].pattern, w[k].pattern);
      TU_CHECK(!strcmp(buf, w[k].str), "%s [%s] %s: %s want %s", p->name, dim, w[k].pattern, buf,
               w[k].str);
    }
    k++;
  }
  TU_CHECK(k == n, "%s: %d entries under [%s], want %d", p->name, k, dim, n);
}

static void check_entries(const dt_plan *p, const want *w, int n) {
  TU_CHECK(p->n_entries == n, "%s: %d entries, want %d", p->name, p->n_entries, n);
  check_section(p, "tp", w, n);
}

/* The exact structs behind TorchTitan's plan: styles and defaults. */
static void check_titan_structs(const dt_plan *p, bool loss_parallel) {
  dt_style s;
  const dt_plan_entry *e;

  e = find_entry(p, "tok_embeddings");
  dt_style_default(DT_STYLE_ROWWISE, &s);
  s.input_layouts[0] = L(dt_replicate());
  s.output_layouts[0] = L(dt_shard(1));
  TU_CHECK(e && style_eq(&e->style, &s), "tok_embeddings style");

  e = find_entry(p, "output");
  dt_style_default(DT_STYLE_COLWISE, &s);
  s.input_layouts[0] = L(dt_shard(1));
  s.output_layouts[0] = L(loss_parallel ? dt_shard(-1) : dt_replicate());
  s.use_local_output = !loss_parallel;
  TU_CHECK(e && style_eq(&e->style, &s), "output style");
  TU_CHECK(e && e->style.desired_input_layouts[0].pl.kind == DT_PL_REPLICATE, "output desired R");

  e = find_entry(p, "layers.*.attention.wo");
  TU_CHECK(e && e->style.kind == DT_STYLE_ROWWISE && e->style.n_out == 1 &&
               dt_placement_eq(e->style.output_layouts[0].pl, dt_shard(1)) &&
               dt_placement_eq(e->style.input_layouts[0].pl, dt_shard(-1)) &&
               dt_placement_eq(e->style.desired_input_layouts[0].pl, dt_shard(-1)) &&
               e->style.use_local_output,
           "wo is RowwiseParallel(output_layouts=(Shard(1),)) with Rowwise defaults");

  e = find_entry(p, "layers.*.attention.wq");
  dt_style_default(DT_STYLE_COLWISE, &s);
  TU_CHECK(e && style_eq(&e->style, &s), "wq default colwise");
  TU_CHECK(e && dt_placement_eq(e->style.input_layouts[0].pl, dt_replicate()) &&
               dt_placement_eq(e->style.output_layouts[0].pl, dt_shard(-1)) &&
               e->style.use_local_output,
           "colwise defaults (R,) -> (S(-1),), use_local_output");

  e = find_entry(p, "layers.*.attention");
  dt_style_default(DT_STYLE_PREPARE_INPUT, &s);
  s.n_in = 3;
  s.input_layouts[0] = L(dt_shard(1));
  s.input_layouts[1] = s.input_layouts[2] = NONE();
  s.desired_input_layouts[0] = L(dt_replicate());
  s.desired_input_layouts[1] = s.desired_input_layouts[2] = NONE();
  TU_CHECK(e && style_eq(&e->style, &s) && !e->style.use_local_output, "attention PMI");

  e = find_entry(p, "layers.*.feed_forward");
  TU_CHECK(e && e->style.kind == DT_STYLE_PREPARE_INPUT && e->style.n_in == 1 &&
               dt_placement_eq(e->style.input_layouts[0].pl, dt_shard(1)) &&
               dt_placement_eq(e->style.desired_input_layouts[0].pl, dt_replicate()),
           "feed_forward PMI");

  e = find_entry(p, "norm");
  TU_CHECK(e && e->style.kind == DT_STYLE_SEQUENCE && e->style.sequence_dim == 1 &&
               !e->style.use_local_output,
           "SequenceParallel defaults");
}

static void check_shipped(dt_ctx *ctx) {
  char path[512];
  dt_plan p;

  tu_plan_path("torchtitan-tp-sp.plan", path, sizeof path);
  TU_OK(ctx, dt_plan_load(ctx, path, &p));
  TU_CHECK(!strcmp(p.name, "torchtitan-tp-sp"), "name %s", p.name);
  TU_CHECK(p.n_dims == 1 && !strcmp(p.dim_names[0], "tp") && p.dim_sizes[0] == -1, "dims");
  TU_CHECK(p.loss_parallel, "loss_parallel");
  check_entries(&p, k_titan, N_TITAN);
  check_titan_structs(&p, true);

  want nolp[N_TITAN];
  memcpy(nolp, k_titan, sizeof nolp);
  nolp[2].str = "ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())";
  tu_plan_path("tp-no-loss-parallel.plan", path, sizeof path);
  TU_OK(ctx, dt_plan_load(ctx, path, &p));
  TU_CHECK(!strcmp(p.name, "tp-no-loss-parallel") && !p.loss_parallel, "no-lp header");
  check_entries(&p, nolp, N_TITAN);
  check_titan_structs(&p, false);

  static const want k_megatron[] = {
      {"tok_embeddings", "RowwiseParallel(input_layouts=Replicate())"},
      {"output", "ColwiseParallel(output_layouts=Replicate())"},
      {"layers.*.attention", "PrepareModuleInput(input_layouts=(Replicate(), None, None), "
                             "desired_input_layouts=(Replicate(), None, None))"},
      {"layers.*.attention.wq", "ColwiseParallel()"},
      {"layers.*.attention.wk", "ColwiseParallel()"},
      {"layers.*.attention.wv", "ColwiseParallel()"},
      {"layers.*.attention.wo", "RowwiseParallel()"},
      {"layers.*.feed_forward", "PrepareModuleInput(input_layouts=(Replicate(),), "
                                "desired_input_layouts=(Replicate(),))"},
      {"layers.*.feed_forward.w1", "ColwiseParallel()"},
      {"layers.*.feed_forward.w2", "RowwiseParallel()"},
      {"layers.*.feed_forward.w3", "ColwiseParallel()"},
  };
  tu_plan_path("megatron-tp.plan", path, sizeof path);
  TU_OK(ctx, dt_plan_load(ctx, path, &p));
  TU_CHECK(!strcmp(p.name, "megatron-tp") && !p.loss_parallel, "megatron header");
  check_entries(&p, k_megatron, (int)(sizeof k_megatron / sizeof k_megatron[0]));
  const dt_plan_entry *e = find_entry(&p, "layers.*.attention.wo");
  TU_CHECK(e && dt_placement_eq(e->style.output_layouts[0].pl, dt_replicate()), "megatron wo R");

  tu_plan_path("dp.plan", path, sizeof path);
  TU_OK(ctx, dt_plan_load(ctx, path, &p));
  TU_CHECK(!strcmp(p.name, "dp") && p.n_dims == 1 && !strcmp(p.dim_names[0], "dp_replicate") &&
               p.dim_sizes[0] == -1 && p.n_entries == 0 && !p.loss_parallel,
           "dp plan");
  /* apply_ddp: replicate(model, device_mesh=dp_mesh, bucket_cap_mb=100) */
  TU_CHECK(p.bucket_cap_mb == 100 && p.zero == 0 && p.param_dtype == DT_DTYPE_COUNT &&
               p.reduce_dtype == DT_DTYPE_COUNT,
           "dp settings: bucket_cap_mb %g zero %d", p.bucket_cap_mb, p.zero);
  dt_llama_config cfg = debugmodel();
  TU_OK(ctx, dt_plan_resolve(ctx, &p, 8, &cfg, 2048));
  TU_CHECK(p.dim_sizes[0] == 8, "dp inferred %d", p.dim_sizes[0]);

  TU_CHECK(dt_plan_load(ctx, "/nonexistent/x.plan", &p) == DT_ERR_IO, "missing file -> IO");
}

/* TorchTitan's apply_fsdp (torchtitan/models/llama3/infra/parallelize.py, v0.2.0) with
 * reshard_after_forward_policy "default" and no pipeline parallel, call by call:
 *   fully_shard(model.tok_embeddings, reshard_after_forward=R)         R = not pp_enabled
 *   for block in model.layers.values(): fully_shard(block, reshard_after_forward=R)
 *   fully_shard([model.norm, model.output],
 *               reshard_after_forward=reshard_after_forward_policy == "always")
 *   fully_shard(model)                                                   (FSDP2's default)
 * The group is stored with its patterns joined by ','. */
static const want k_apply_fsdp[] = {
    {"tok_embeddings", "fully_shard(reshard_after_forward=True)"},
    {"layers.*", "fully_shard(reshard_after_forward=True)"},
    {"norm,output", "fully_shard(reshard_after_forward=False)"},
    {"root", "fully_shard()"},
};
/* The same units with policy "never" (every unit reshard_after_forward=False: ZeRO-2). */
static const want k_apply_fsdp_never[] = {
    {"tok_embeddings", "fully_shard(reshard_after_forward=False)"},
    {"layers.*", "fully_shard(reshard_after_forward=False)"},
    {"norm,output", "fully_shard(reshard_after_forward=False)"},
    {"root", "fully_shard()"},
};
/* ZeRO-1: the units without reshard_after_forward (parameters are never resharded). */
static const want k_units_plain[] = {
    {"tok_embeddings", "fully_shard()"},
    {"layers.*", "fully_shard()"},
    {"norm,output", "fully_shard()"},
    {"root", "fully_shard()"},
};
enum { N_UNITS = 4 };

/* The reshard_after_forward fields themselves (1 True, 0 False, -1 not given), apart from
 * dt_style_str, for the units of w. */
static void check_raf(const dt_plan *p, const want *w) {
  int d = dt_plan_dim(p, "dp_shard"), k = 0;
  for (int i = 0; i < p->n_entries; i++) {
    const dt_plan_entry *e = &p->entries[i];
    if (e->dim != d || k >= N_UNITS) continue;
    int raf = strstr(w[k].str, "=True") ? 1 : strstr(w[k].str, "=False") ? 0 : -1;
    TU_CHECK(e->style.kind == DT_STYLE_FULLY_SHARD && e->style.reshard_after_forward == raf &&
                 e->style.n_in == 0 && e->style.n_out == 0,
             "%s %s: kind %d raf %d want %d", p->name, e->pattern, (int)e->style.kind,
             e->style.reshard_after_forward, raf);
    k++;
  }
}

static void check_shipped_fsdp(dt_ctx *ctx) {
  static const struct {
    const char *file, *name;
    int n_dims;
    const char *dims[2];
    int sizes[2];
    bool loss_parallel;
    int zero;
    const want *units;
    bool bf16; /* TorchTitan's mixed precision: param bf16, reduce f32 (else neither given) */
  } k[] = {
      {"fsdp.plan", "fsdp", 1, {"dp_shard"}, {-1}, false, 0, k_apply_fsdp, false},
      {"hsdp.plan", "hsdp", 2, {"dp_replicate", "dp_shard"}, {-1, 2}, false, 0, k_apply_fsdp, false},
      {"fsdp-tp-sp.plan", "fsdp-tp-sp", 2, {"dp_shard", "tp"}, {-1, 2}, true, 0, k_apply_fsdp, false},
      {"zero2.plan", "zero2", 1, {"dp_shard"}, {-1}, false, 2, k_apply_fsdp_never, false},
      {"zero1.plan", "zero1", 1, {"dp_shard"}, {-1}, false, 1, k_units_plain, false},
      {"fsdp-bf16.plan", "fsdp-bf16", 1, {"dp_shard"}, {-1}, false, 0, k_apply_fsdp, true},
  };
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
    char path[512];
    dt_plan p;
    tu_plan_path(k[i].file, path, sizeof path);
    TU_OK(ctx, dt_plan_load(ctx, path, &p));
    TU_CHECK(!strcmp(p.name, k[i].name), "%s: name %s", k[i].file, p.name);
    TU_CHECK(p.n_dims == k[i].n_dims, "%s: %d dims", k[i].file, p.n_dims);
    for (int d = 0; d < k[i].n_dims && d < p.n_dims; d++)
      TU_CHECK(!strcmp(p.dim_names[d], k[i].dims[d]) && p.dim_sizes[d] == k[i].sizes[d],
               "%s: dim %d is %s:%d want %s:%d", k[i].file, d, p.dim_names[d], p.dim_sizes[d],
               k[i].dims[d], k[i].sizes[d]);
    TU_CHECK(p.loss_parallel == k[i].loss_parallel && p.zero == k[i].zero &&
                 p.param_dtype == (k[i].bf16 ? DT_BF16 : DT_DTYPE_COUNT) &&
                 p.reduce_dtype == (k[i].bf16 ? DT_F32 : DT_DTYPE_COUNT) && p.bucket_cap_mb == 0,
             "%s: settings lp %d zero %d mp %d/%d bucket %g", k[i].file, p.loss_parallel, p.zero,
             (int)p.param_dtype, (int)p.reduce_dtype, p.bucket_cap_mb);
    check_section(&p, "dp_shard", k[i].units, N_UNITS);
    check_raf(&p, k[i].units);
    if (k[i].loss_parallel) { /* apply_tp before apply_fsdp: torchtitan-tp-sp's entries */
      check_section(&p, "tp", k_titan, N_TITAN);
      check_titan_structs(&p, true);
      TU_CHECK(p.n_entries == N_TITAN + N_UNITS, "%s: %d entries", k[i].file, p.n_entries);
    } else {
      TU_CHECK(p.n_entries == N_UNITS, "%s: %d entries", k[i].file, p.n_entries);
    }
    /* the group's patterns */
    const dt_plan_entry *g = NULL;
    for (int e = 0; e < p.n_entries; e++)
      if (p.entries[e].style.kind == DT_STYLE_FULLY_SHARD && strchr(p.entries[e].pattern, ','))
        g = &p.entries[e];
    char pats[4][96];
    int np = g ? dt_plan_entry_patterns(g, pats, 4) : 0;
    TU_CHECK(np == 2 && !strcmp(pats[0], "norm") && !strcmp(pats[1], "output"),
             "%s: the [norm, output] group has %d patterns", k[i].file, np);
  }
}

/* Every style of every shipped plan prints and parses back to the same struct. */
static void check_round_trip(dt_ctx *ctx) {
  static const char *const files[] = {"torchtitan-tp-sp.plan", "tp-no-loss-parallel.plan",
                                      "megatron-tp.plan", "fsdp.plan", "hsdp.plan",
                                      "fsdp-tp-sp.plan", "zero1.plan", "zero2.plan",
                                      "fsdp-bf16.plan"};
  for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
    char path[512];
    dt_plan p, q;
    tu_plan_path(files[f], path, sizeof path);
    TU_OK(ctx, dt_plan_load(ctx, path, &p));
    for (int i = 0; i < p.n_entries; i++) {
      char s[256], text[512];
      int n = dt_style_str(&p.entries[i].style, s, sizeof s);
      TU_CHECK(n == (int)strlen(s), "length %d", n);
      const char *dim = p.entries[i].style.kind == DT_STYLE_FULLY_SHARD ? "dp_shard" : "tp";
      snprintf(text, sizeof text, "dims = %s:2\n[%s]\nx = %s\n", dim, dim, s);
      TU_OK(ctx, dt_plan_parse(ctx, text, "rt", &q));
      TU_CHECK(q.n_entries == 1 && style_eq(&q.entries[0].style, &p.entries[i].style),
               "round trip of %s", s);
    }
  }
  /* more styles and spellings */
  static const struct {
    const char *in, *out;
  } k[] = {
      {"SequenceParallel(sequence_dim=0, use_local_output=True)",
       "SequenceParallel(sequence_dim=0, use_local_output=True)"},
      {"ColwiseParallel(input_layouts=S(1), output_layouts=R,)",
       "ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())"},
      {"ColwiseParallel(input_layouts=None)", "ColwiseParallel()"},
      {"RowwiseParallel(input_layouts=(Shard(-1),), output_layouts=P(sum), use_local_output=false)",
       "RowwiseParallel(output_layouts=Partial(), use_local_output=False)"},
      {"PrepareModuleOutput(output_layouts=Partial(avg), desired_output_layouts=(R,))",
       "PrepareModuleOutput(output_layouts=(Partial(avg),), desired_output_layouts=(Replicate(),))"},
      {"PrepareModuleInput( input_layouts = ( S(1) , None ) , desired_input_layouts=(R, None), "
       "use_local_output=True )",
       "PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), "
       "None), use_local_output=True)"},
      /* fully_shard: reshard_after_forward True / False / None (FSDP2's default) */
      {"fully_shard()", "fully_shard()"},
      {"fully_shard( reshard_after_forward = true )", "fully_shard(reshard_after_forward=True)"},
      {"fully_shard(reshard_after_forward=False,)", "fully_shard(reshard_after_forward=False)"},
      {"fully_shard(reshard_after_forward=None)", "fully_shard()"},
  };
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
    char text[512], s[256];
    dt_plan p, q;
    const char *dim = strncmp(k[i].in, "fully_shard", 11) ? "tp" : "dp_shard";
    snprintf(text, sizeof text, "dims = %s:2\n[%s]\nx = %s   # comment\n", dim, dim, k[i].in);
    TU_OK(ctx, dt_plan_parse(ctx, text, "rt", &p));
    if (p.n_entries != 1) continue;
    dt_style_str(&p.entries[0].style, s, sizeof s);
    TU_CHECK(!strcmp(s, k[i].out), "%s printed %s want %s", k[i].in, s, k[i].out);
    snprintf(text, sizeof text, "dims = %s:2\n[%s]\nx = %s\n", dim, dim, s);
    TU_OK(ctx, dt_plan_parse(ctx, text, "rt", &q));
    TU_CHECK(q.n_entries == 1 && style_eq(&q.entries[0].style, &p.entries[0].style), "rt %s", s);
  }
  /* truncation follows snprintf: the full length is returned */
  dt_style st;
  dt_style_default(DT_STYLE_COLWISE, &st);
  char small[8];
  int n = dt_style_str(&st, small, sizeof small);
  TU_CHECK(n == (int)strlen("ColwiseParallel()") && strlen(small) == sizeof small - 1, "trunc");
  /* SequenceParallel(sequence_dim=0) implies Shard(0) layouts */
  dt_plan p;
  TU_OK(ctx, dt_plan_parse(ctx, "dims=tp:2\n[tp]\nnorm=SequenceParallel(sequence_dim=0)\n", "sp", &p));
  TU_CHECK(p.n_entries == 1 && dt_placement_eq(p.entries[0].style.input_layouts[0].pl, dt_shard(0)),
           "SP layouts follow sequence_dim");
  TU_CHECK(!strcmp(p.name, "sp"), "default name from path: %s", p.name);
}

static void check_fnmatch(void) {
  static const struct {
    const char *pat, *fqn;
    bool match;
  } k[] = {
      {"net*", "net1", true},           {"net*", "net2", true},
      {"net*", "net", true},            {"net*", "layers", false},
      {"net?", "net1", true},           {"net?", "net12", false},
      {"net?", "net", false},           {"net[1-2]", "net1", true},
      {"net[1-2]", "net2", true},       {"net[1-2]", "net3", false},
      {"layers.*.net[1]", "layers.0.net1", true},
      {"layers.*.net[1]", "layers.1.net1", true},
      {"layers.*.net[1]", "layers.0.net2", false},
      {"layers.*.net[2]", "layers.7.net2", true},
      {"layers.*.net[1]", "layers.0.net1.x", false}, /* token counts differ */
      {"layers.*", "layers.0.attention", false},
      {"*", "layers.0", false},
      {"layers.*.attention", "layers.12.attention", true},
      {"layers.[0-1].attention.w?", "layers.1.attention.wq", true},
      {"layers.[!0].attention.wq", "layers.0.attention.wq", false},
      {"output", "output", true},
      {"output", "outputs", false},
  };
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
    TU_CHECK(dt_fqn_match(k[i].pat, k[i].fqn) == k[i].match, "fnmatch %s %s -> %d", k[i].pat,
             k[i].fqn, !k[i].match);
}

/* The shipped plan's text with its dims line replaced. */
static dt_status load_with_dims(dt_ctx *ctx, const char *file, const char *dims, dt_plan *p) {
  char path[512];
  tu_plan_path(file, path, sizeof path);
  char *t = tu_slurp(path);
  if (!t) return DT_ERR_IO;
  char *d = strstr(t, "dims = tp:-1");
  dt_status st = DT_ERR_INVALID;
  if (d) {
    size_t n = strlen(t) + strlen(dims) + 1;
    char *u = malloc(n);
    if (u) {
      snprintf(u, n, "%.*s%s%s", (int)(d - t), t, dims, d + strlen("dims = tp:-1"));
      st = dt_plan_parse(ctx, u, path, p);
      free(u);
    }
  }
  free(t);
  return st;
}

static void check_resolve(dt_ctx *ctx) {
  dt_llama_config cfg = debugmodel();
  static const int worlds[] = {2, 4, 8};
  static const char *const files[] = {"torchtitan-tp-sp.plan", "tp-no-loss-parallel.plan",
                                      "megatron-tp.plan"};
  for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
    for (size_t w = 0; w < sizeof worlds / sizeof worlds[0]; w++) {
      dt_plan p;
      char path[512];
      tu_plan_path(files[f], path, sizeof path);
      /* pure TP: tp = world */
      TU_OK(ctx, dt_plan_load(ctx, path, &p));
      TU_OK(ctx, dt_plan_resolve(ctx, &p, worlds[w], &cfg, 2048));
      TU_CHECK(p.dim_sizes[0] == worlds[w], "%s: tp %d for world %d", files[f], p.dim_sizes[0],
               worlds[w]);
      for (int tp = 2; tp <= 4; tp *= 2) {
        char dims[64];
        snprintf(dims, sizeof dims, "dims = dp_replicate:-1, tp:%d", tp);
        TU_OK(ctx, load_with_dims(ctx, files[f], dims, &p));
        TU_CHECK(p.n_dims == 2 && dt_plan_dim(&p, "tp") == 1 && p.entries[0].dim == 1, "2-D dims");
        dt_status st = dt_plan_resolve(ctx, &p, worlds[w], &cfg, 2048);
        if (worlds[w] % tp == 0) {
          TU_CHECK(st == DT_OK, "%s world %d tp %d: %s", files[f], worlds[w], tp, dt_last_error(ctx));
          TU_CHECK(p.dim_sizes[0] == worlds[w] / tp && p.dim_sizes[1] == tp, "dp %d tp %d",
                   p.dim_sizes[0], p.dim_sizes[1]);
        } else {
          TU_CHECK(st == DT_ERR_INVALID && strstr(dt_last_error(ctx), "not divisible"),
                   "world %d tp %d: %s", worlds[w], tp, dt_last_error(ctx));
        }
      }
    }
  }
  /* explicit sizes must multiply to the world */
  dt_plan p;
  TU_OK(ctx, dt_plan_parse(ctx, "dims = pp:2, dp_shard:2, cp:1, tp:2\n", "x.plan", &p));
  TU_OK(ctx, dt_plan_resolve(ctx, &p, 8, &cfg, 2048));
  TU_CHECK(dt_plan_resolve(ctx, &p, 4, &cfg, 2048) == DT_ERR_INVALID &&
               strstr(dt_last_error(ctx), "do not match the world of 4"),
           "product != world: %s", dt_last_error(ctx));
  /* CP: seq divisible by 2*cp */
  TU_OK(ctx, dt_plan_parse(ctx, "dims = cp:4\n", "cp.plan", &p));
  TU_CHECK(dt_plan_resolve(ctx, &p, 4, &cfg, 2052) == DT_ERR_INVALID &&
               strstr(dt_last_error(ctx), "2 x cp"),
           "cp seq: %s", dt_last_error(ctx));
  /* without load balancing cp alone divides the sequence */
  TU_OK(ctx, dt_plan_parse(ctx, "dims = cp:4\ncontext_parallel_load_balance = false\n", "cp.plan", &p));
  TU_CHECK(!p.cp_load_balance && p.cp_rotate == DT_CP_ALLGATHER, "cp settings");
  TU_OK(ctx, dt_plan_resolve(ctx, &p, 4, &cfg, 2052));
  TU_CHECK(dt_plan_resolve(ctx, &p, 4, &cfg, 2050) == DT_ERR_INVALID &&
               strstr(dt_last_error(ctx), "not divisible by 4 (cp)"),
           "cp seq, no load balance: %s", dt_last_error(ctx));
  /* two -1 dims parse (the harness sizes them from its mesh) but the world alone
   * cannot resolve them */
  TU_OK(ctx, dt_plan_parse(ctx, "dims = dp_shard:-1, cp:-1\ncontext_parallel_rotate_method = "
                                "alltoall\n", "x.plan", &p));
  TU_CHECK(p.cp_rotate == DT_CP_RING && p.cp_load_balance, "alltoall is the ring");
  TU_CHECK(dt_plan_resolve(ctx, &p, 8, &cfg, 2048) == DT_ERR_INVALID &&
               strstr(dt_last_error(ctx), "dims dp_shard and cp are both -1"),
           "two -1: %s", dt_last_error(ctx));
  p.dim_sizes[1] = 2;
  TU_OK(ctx, dt_plan_resolve(ctx, &p, 8, &cfg, 2048));
  TU_CHECK(p.dim_sizes[0] == 4, "dp_shard inferred as 4, got %d", p.dim_sizes[0]);
  /* megatron (no SP) does not need seq % tp; torchtitan (SP) does */
  char path[512];
  tu_plan_path("megatron-tp.plan", path, sizeof path);
  TU_OK(ctx, dt_plan_load(ctx, path, &p));
  TU_OK(ctx, dt_plan_resolve(ctx, &p, 4, &cfg, 2046));
}

/* The text must fail with DT_ERR_INVALID and a message containing every part. */
static void expect_err(dt_ctx *ctx, const char *what, const char *text, const char *const *parts) {
  dt_plan p;
  dt_status st = dt_plan_parse(ctx, text, "bad.plan", &p);
  TU_CHECK(st == DT_ERR_INVALID, "%s: status %s", what, dt_status_str(st));
  for (; *parts; parts++)
    TU_CHECK(strstr(dt_last_error(ctx), *parts), "%s: '%s' not in: %s", what, *parts,
             dt_last_error(ctx));
}
#define EXPECT_ERR(ctx, what, text, ...) \
  expect_err(ctx, what, text, (const char *const[]){__VA_ARGS__, NULL})

static void expect_resolve_err(dt_ctx *ctx, const char *what, const char *text, int world,
                               const dt_llama_config *cfg, int seq, const char *const *parts) {
  dt_plan p;
  TU_OK(ctx, dt_plan_parse(ctx, text, "bad.plan", &p));
  dt_status st = dt_plan_resolve(ctx, &p, world, cfg, seq);
  TU_CHECK(st == DT_ERR_INVALID, "%s: status %s", what, dt_status_str(st));
  for (; *parts; parts++)
    TU_CHECK(strstr(dt_last_error(ctx), *parts), "%s: '%s' not in: %s", what, *parts,
             dt_last_error(ctx));
}
#define EXPECT_RESOLVE_ERR(ctx, what, text, world, cfg, seq, ...) \
  expect_resolve_err(ctx, what, text, world, cfg, seq, (const char *const[]){__VA_ARGS__, NULL})

static void check_errors(dt_ctx *ctx) {
  /* syntax: FILE:LINE:COLUMN exactly */
  EXPECT_ERR(ctx, "missing comma",
             "# a comment\ndims = tp:2\n[tp]\n"
             "output = ColwiseParallel(output_layouts=Shard(-1) use_local_output=False)\n",
             "bad.plan:4:51: expected ')' or ',' after a keyword argument");
  EXPECT_ERR(ctx, "missing paren", "dims = tp:2\n\n[tp]\nnorm = SequenceParallel\n",
             "bad.plan:4:24: expected '(' after 'SequenceParallel'");
  EXPECT_ERR(ctx, "positional", "dims = tp:2\n[tp]\n  x = ColwiseParallel(Shard(1))\n",
             "bad.plan:3:28: expected '=' after 'Shard'");
  EXPECT_ERR(ctx, "tuple", "dims = tp:2\n[tp]\nx = PrepareModuleInput(input_layouts=(R R))\n",
             "bad.plan:3:41: expected ')' or ',' in a layout tuple");
  EXPECT_ERR(ctx, "trailing", "dims = tp:2\n[tp]\nx = ColwiseParallel() y\n",
             "bad.plan:3:23: expected the end of the line");
  EXPECT_ERR(ctx, "no equals", "dims = tp:2\n[tp]\nlayers.*.attention ColwiseParallel()\n",
             "bad.plan:3:20: expected '=' after 'layers.*.attention'");
  EXPECT_ERR(ctx, "header", "dims = tp:2\n[tp\n", "bad.plan:2:4: expected ']'");
  EXPECT_ERR(ctx, "bool", "dims = tp:2\n[tp]\nx = ColwiseParallel(use_local_output=yes)\n",
             "bad.plan:3:38: expected True or False");
  EXPECT_ERR(ctx, "loss_parallel value", "dims = tp:2\nloss_parallel = maybe\n",
             "bad.plan:2:17: expected true or false");
  /* unknown style, with a hint */
  EXPECT_ERR(ctx, "style", "dims = tp:2\n[tp]\nlayers.*.attention.wq = ColwiseParalel()\n",
             "bad.plan:3:25:", "unknown style 'ColwiseParalel' (did you mean ColwiseParallel?)");
  EXPECT_ERR(ctx, "style", "dims = tp:2\n[tp]\nx = Foo()\n", "bad.plan:3:5:", "unknown style 'Foo'",
             "expected ColwiseParallel");
  /* unknown kwarg, and one the style does not take */
  EXPECT_ERR(ctx, "kwarg", "dims = tp:2\n[tp]\nx = ColwiseParallel(output_layout=Shard(1))\n",
             "bad.plan:3:21:", "unknown keyword argument 'output_layout' for ColwiseParallel",
             "did you mean output_layouts");
  EXPECT_ERR(ctx, "kwarg", "dims = tp:2\n[tp]\nx = ColwiseParallel(sequence_dim=1)\n",
             "bad.plan:3:", "unknown keyword argument 'sequence_dim' for ColwiseParallel",
             "input_layouts, output_layouts or use_local_output");
  EXPECT_ERR(ctx, "kwarg twice",
             "dims = tp:2\n[tp]\nx = ColwiseParallel(use_local_output=True, use_local_output=False)\n",
             "bad.plan:3:", "given twice");
  /* bad placement */
  EXPECT_ERR(ctx, "placement", "dims = tp:2\n[tp]\nx = ColwiseParallel(input_layouts=Shard(x))\n",
             "bad.plan:3:35:", "bad placement 'Shard(x)'");
  EXPECT_ERR(ctx, "placement", "dims = tp:2\n[tp]\nx = RowwiseParallel(output_layouts=Sharded(1))\n",
             "bad.plan:3:", "bad placement 'Sharded(1)'");
  EXPECT_ERR(ctx, "colwise tuple",
             "dims = tp:2\n[tp]\nx = ColwiseParallel(input_layouts=(Shard(1), None))\n",
             "bad.plan:3:", "takes one placement");
  EXPECT_ERR(ctx, "PMI lengths",
             "dims = tp:2\n[tp]\nx = PrepareModuleInput(input_layouts=(Shard(1), None), "
             "desired_input_layouts=(R,))\n",
             "bad.plan:3:", "input_layouts has 2 layouts but desired_input_layouts has 1");
  EXPECT_ERR(ctx, "PMI missing", "dims = tp:2\n[tp]\nx = PrepareModuleInput(input_layouts=R)\n",
             "bad.plan:3:", "needs both input_layouts and desired_input_layouts");
  /* duplicate pattern */
  EXPECT_ERR(ctx, "duplicate",
             "dims = tp:2\n[tp]\nnorm = SequenceParallel()\n\nnorm = SequenceParallel()\n",
             "bad.plan:5:", "duplicate pattern 'norm'", "line 3");
  /* entries before a header, dims not in dims, unknown / misordered dims, two -1 */
  EXPECT_ERR(ctx, "before header", "dims = tp:2\nnorm = SequenceParallel()\n", "bad.plan:2:",
             "before a [dim] header");
  EXPECT_ERR(ctx, "header dim", "dims = dp_replicate:-1, tp:2\n[cp]\nnorm = SequenceParallel()\n",
             "bad.plan:2:", "dim 'cp' is not in dims (dp_replicate, tp)");
  EXPECT_ERR(ctx, "header before dims", "[tp]\n", "bad.plan:1:", "needs a 'dims = ...' line");
  EXPECT_ERR(ctx, "unknown dim", "dims = dp:2, tp:2\n", "bad.plan:1:8:", "unknown dim 'dp'");
  EXPECT_ERR(ctx, "unknown dim", "dims = tensor:2\n", "bad.plan:1:8:", "unknown dim 'tensor'");
  EXPECT_ERR(ctx, "order", "dims = tp:2, dp_shard:-1\n", "bad.plan:1:14:", "out of order");
  EXPECT_ERR(ctx, "size 0", "dims = tp:0\n", "bad.plan:1:11:", "expected a size >= 1");
  EXPECT_ERR(ctx, "no dims", "name = x\n", "bad.plan:", "no 'dims = ...' line");
  EXPECT_ERR(ctx, "setting", "dims = tp:2\nloss = true\n", "bad.plan:2:", "unknown setting 'loss'");
  EXPECT_ERR(ctx, "setting after header", "dims = tp:2\n[tp]\nloss_parallel = true\n",
             "bad.plan:3:", "must come before the first [dim] header");
  /* loss parallel needs Shard(-1) on the output */
  EXPECT_ERR(ctx, "loss parallel",
             "dims = tp:2\nloss_parallel = true\n[tp]\n"
             "output = ColwiseParallel(output_layouts=Replicate(), use_local_output=False)\n",
             "bad.plan:4:", "loss_parallel", "Shard(-1)");
  EXPECT_ERR(ctx, "loss parallel local",
             "dims = tp:2\nloss_parallel = true\n[tp]\noutput = ColwiseParallel()\n",
             "bad.plan:4:", "use_local_output=False");
  EXPECT_ERR(ctx, "loss parallel no output", "dims = tp:2\nloss_parallel = true\n",
             "bad.plan:", "needs an 'output' entry");

  /* resolve errors */
  dt_llama_config cfg = debugmodel();
  EXPECT_RESOLVE_ERR(ctx, "world", "dims = dp_replicate:-1, tp:4\n", 6, &cfg, 2048,
                     "bad.plan:", "world 6 is not divisible", "tp:4", "dp_replicate");
  EXPECT_RESOLVE_ERR(ctx, "no match",
                     "dims = tp:2\n[tp]\nlayers.*.attention.wq = ColwiseParallel()\n"
                     "layers.*.atention.wq = ColwiseParallel()\n",
                     2, &cfg, 2048, "bad.plan:4:", "pattern 'layers.*.atention.wq' matches no module");
  EXPECT_RESOLVE_ERR(ctx, "no match layer", "dims = tp:2\n[tp]\nlayers.6.attention.wq = ColwiseParallel()\n",
                     2, &cfg, 2048, "bad.plan:3:", "matches no module of debugmodel (6 layers)");
  EXPECT_RESOLVE_ERR(ctx, "colwise on norm", "dims = tp:2\n[tp]\nnorm = ColwiseParallel()\n", 2,
                     &cfg, 2048, "bad.plan:3:", "not a Linear or an Embedding");
  dt_llama_config six = cfg;
  six.n_heads = six.n_kv_heads = 6;
  EXPECT_RESOLVE_ERR(ctx, "heads", "dims = tp:-1\n[tp]\nlayers.*.attention.wq = ColwiseParallel()\n",
                     4, &six, 2048, "n_heads 6", "tp 4");
  dt_llama_config gqa = cfg;
  gqa.n_kv_heads = 2;
  EXPECT_RESOLVE_ERR(ctx, "kv heads", "dims = tp:-1\n[tp]\nlayers.*.attention.wk = ColwiseParallel()\n",
                     4, &gqa, 2048, "n_kv_heads 2", "tp 4");
  EXPECT_RESOLVE_ERR(ctx, "seq SP", "dims = tp:-1\n[tp]\nnorm = SequenceParallel()\n", 4, &cfg,
                     2046, "seq_len 2046", "sequence parallel");
  EXPECT_RESOLVE_ERR(ctx, "seq Shard(1)",
                     "dims = tp:-1\n[tp]\nlayers.*.attention.wo = RowwiseParallel(output_layouts=S(1))\n",
                     4, &cfg, 2046, "seq_len 2046");
  /* the shipped SP plan with seq not divisible */
  dt_plan p;
  char path[512];
  tu_plan_path("torchtitan-tp-sp.plan", path, sizeof path);
  TU_OK(ctx, dt_plan_load(ctx, path, &p));
  TU_CHECK(dt_plan_resolve(ctx, &p, 8, &cfg, 2044) == DT_ERR_INVALID &&
               strstr(dt_last_error(ctx), "torchtitan-tp-sp.plan") &&
               strstr(dt_last_error(ctx), "seq_len 2044"),
           "shipped SP seq: %s", dt_last_error(ctx));
}

/* Settings and groups that parse, with the values they must give. */
static void check_fsdp_syntax(dt_ctx *ctx) {
  dt_plan p;
  TU_OK(ctx, dt_plan_parse(ctx,
                           "dims = dp_replicate:2, dp_shard:-1\nzero = 3\n"
                           "mixed_precision_param = bfloat16   # TorchTitan's spelling\n"
                           "mixed_precision_reduce = f64\n"
                           "[dp_shard]\n"
                           "tok_embeddings ,\tnorm,output = fully_shard(reshard_after_forward=False)\n"
                           "layers.[0-2] = fully_shard()\nlayers.[3-5]=fully_shard()\n",
                           "s.plan", &p));
  TU_CHECK(p.zero == 3 && p.param_dtype == DT_BF16 && p.reduce_dtype == DT_F64 &&
               p.bucket_cap_mb == 0,
           "settings: zero %d param %d reduce %d", p.zero, (int)p.param_dtype, (int)p.reduce_dtype);
  TU_CHECK(p.n_entries == 3 && !strcmp(p.entries[0].pattern, "tok_embeddings,norm,output") &&
               p.entries[0].line == 6 && p.entries[0].dim == 1,
           "a group of three: '%s'", p.n_entries ? p.entries[0].pattern : "");
  char pats[4][96];
  int np = dt_plan_entry_patterns(&p.entries[0], pats, 4);
  TU_CHECK(np == 3 && !strcmp(pats[0], "tok_embeddings") && !strcmp(pats[1], "norm") &&
               !strcmp(pats[2], "output"),
           "group split: %d", np);
  np = dt_plan_entry_patterns(&p.entries[0], pats, 2);
  TU_CHECK(np == 2, "group split is bounded by max: %d", np);
  dt_llama_config cfg = debugmodel();
  TU_OK(ctx, dt_plan_check_modules(ctx, &p, &cfg)); /* every weight in exactly one unit */
  TU_OK(ctx, dt_plan_resolve(ctx, &p, 8, &cfg, 2048));
  TU_CHECK(p.dim_sizes[0] == 2 && p.dim_sizes[1] == 4, "HSDP 2 x %d", p.dim_sizes[1]);

  /* DDP x TP with a bucket size (25.5 is exact in binary) */
  TU_OK(ctx, dt_plan_parse(ctx, "dims = dp_replicate:-1, tp:2\nbucket_cap_mb = 25.5\n",
                           "b.plan", &p));
  TU_CHECK(p.bucket_cap_mb == 25.5 && p.zero == 0 && p.param_dtype == DT_DTYPE_COUNT,
           "bucket_cap_mb %g", p.bucket_cap_mb);
  TU_OK(ctx, dt_plan_parse(ctx, "dims = dp_replicate:-1\nbucket_cap_mb=1048576\n", "b.plan", &p));
  TU_CHECK(p.bucket_cap_mb == 1048576, "the largest bucket_cap_mb %g", p.bucket_cap_mb);
  /* zero = 3 and zero = 2 with reshard_after_forward=False: no contradiction */
  TU_OK(ctx, dt_plan_parse(ctx, "dims = dp_shard:-1\nzero = 3\n[dp_shard]\nroot = "
                           "fully_shard(reshard_after_forward=True)\n", "z.plan", &p));
  TU_OK(ctx, dt_plan_parse(ctx, "dims = dp_shard:-1\nzero = 2\n[dp_shard]\nroot = "
                           "fully_shard(reshard_after_forward=False)\n", "z.plan", &p));
  TU_CHECK(p.zero == 2 && p.entries[0].style.reshard_after_forward == 0, "zero 2 raf False");
}

/* dt_plan_check_modules / dt_plan_resolve on the FSDP plans and on units that
 * leave a module out or claim one twice. */
static void check_fsdp_modules(dt_ctx *ctx) {
  static const char *const files[] = {"fsdp.plan", "hsdp.plan", "fsdp-tp-sp.plan", "zero1.plan",
                                      "zero2.plan"};
  dt_llama_config cfg = debugmodel();
  dt_llama_config one = cfg, deep = cfg;
  one.n_layers = 1;
  deep.n_layers = 32;
  for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
    char path[512];
    dt_plan p;
    tu_plan_path(files[f], path, sizeof path);
    TU_OK(ctx, dt_plan_load(ctx, path, &p));
    TU_OK(ctx, dt_plan_check_modules(ctx, &p, &cfg));
    TU_OK(ctx, dt_plan_check_modules(ctx, &p, &one));
    TU_OK(ctx, dt_plan_check_modules(ctx, &p, &deep));
  }
  /* resolve: the -1 dim from the world */
  static const struct {
    const char *file;
    int world, want[2]; /* 0: resolve fails ("not divisible") */
  } r[] = {
      {"fsdp.plan", 8, {8}},          {"fsdp.plan", 3, {3}},
      {"hsdp.plan", 8, {4, 2}},       {"hsdp.plan", 4, {2, 2}},
      {"hsdp.plan", 2, {1, 2}},       {"hsdp.plan", 6, {3, 2}},
      {"hsdp.plan", 3, {0}},          {"fsdp-tp-sp.plan", 8, {4, 2}},
      {"fsdp-tp-sp.plan", 2, {1, 2}}, {"fsdp-tp-sp.plan", 1, {0}},
      {"zero1.plan", 4, {4}},         {"zero2.plan", 4, {4}},
  };
  for (size_t i = 0; i < sizeof r / sizeof r[0]; i++) {
    char path[512];
    dt_plan p;
    tu_plan_path(r[i].file, path, sizeof path);
    TU_OK(ctx, dt_plan_load(ctx, path, &p));
    dt_status st = dt_plan_resolve(ctx, &p, r[i].world, &cfg, 2048);
    if (!r[i].want[0]) {
      TU_CHECK(st == DT_ERR_INVALID && strstr(dt_last_error(ctx), "not divisible"),
               "%s world %d: %s", r[i].file, r[i].world, dt_last_error(ctx));
      continue;
    }
    TU_CHECK(st == DT_OK, "%s world %d: %s", r[i].file, r[i].world, dt_last_error(ctx));
    for (int d = 0; d < p.n_dims; d++)
      TU_CHECK(p.dim_sizes[d] == r[i].want[d], "%s world %d: %s = %d want %d", r[i].file,
               r[i].world, p.dim_names[d], p.dim_sizes[d], r[i].want[d]);
  }
  /* a root entry takes every weight no unit claimed; fully_shard fits any module kind */
  dt_plan p;
  TU_OK(ctx, dt_plan_parse(ctx, "dims = dp_shard:-1\n[dp_shard]\nroot = fully_shard()\n",
                           "r.plan", &p));
  TU_OK(ctx, dt_plan_check_modules(ctx, &p, &cfg));
  TU_OK(ctx, dt_plan_parse(ctx, "dims = dp_shard:-1\n[dp_shard]\nlayers.*.attention_norm = "
                           "fully_shard()\nlayers.*.feed_forward.w? = fully_shard()\nroot = "
                           "fully_shard()\n", "k.plan", &p));
  TU_OK(ctx, dt_plan_check_modules(ctx, &p, &cfg));
  /* units nested in one group are one unit, not an overlap */
  TU_OK(ctx, dt_plan_parse(ctx, "dims = dp_shard:-1\n[dp_shard]\nlayers.*, layers.*.attention = "
                           "fully_shard()\nroot = fully_shard()\n", "n.plan", &p));
  TU_OK(ctx, dt_plan_check_modules(ctx, &p, &cfg));
  /* "*" matches the one-token modules (tok_embeddings, norm, output), not the blocks: "layers"
   * alone is no module of the model (lib/nn lists no ModuleDict), so it claims nothing */
  TU_OK(ctx, dt_plan_parse(ctx, "dims = dp_shard:-1\n[dp_shard]\n* = fully_shard()\nlayers.* = "
                           "fully_shard()\n", "s.plan", &p));
  TU_OK(ctx, dt_plan_check_modules(ctx, &p, &cfg));
  /* dp_shard without [dp_shard] entries: no unit to check (the existing pure-dims plans) */
  TU_OK(ctx, dt_plan_parse(ctx, "dims = dp_shard:-1\n", "d.plan", &p));
  TU_OK(ctx, dt_plan_check_modules(ctx, &p, &cfg));
}

static void expect_modules_err(dt_ctx *ctx, const char *what, const char *text,
                               const char *const *parts) {
  dt_plan p;
  dt_llama_config cfg = debugmodel();
  TU_OK(ctx, dt_plan_parse(ctx, text, "bad.plan", &p));
  dt_status st = dt_plan_check_modules(ctx, &p, &cfg);
  TU_CHECK(st == DT_ERR_INVALID, "%s: status %s", what, dt_status_str(st));
  for (; *parts; parts++)
    TU_CHECK(strstr(dt_last_error(ctx), *parts), "%s: '%s' not in: %s", what, *parts,
             dt_last_error(ctx));
}
#define EXPECT_MODULES_ERR(ctx, what, text, ...) \
  expect_modules_err(ctx, what, text, (const char *const[]){__VA_ARGS__, NULL})

#define FS "dims = dp_shard:-1\n[dp_shard]\n" /* entries start at line 3 */

static void check_fsdp_errors(dt_ctx *ctx) {
  /* fully_shard only under [dp_shard], and only fully_shard there */
  EXPECT_ERR(ctx, "fully_shard under tp", "dims = dp_shard:2, tp:2\n[tp]\nnorm = fully_shard()\n",
             "bad.plan:3:8: fully_shard belongs under [dp_shard], not [tp]");
  EXPECT_ERR(ctx, "colwise under dp_shard", FS "output = ColwiseParallel()\n",
             "bad.plan:3:10: [dp_shard] holds fully_shard entries only, not ColwiseParallel");
  /* groups and root: fully_shard only, root alone, no repeats, no dangling comma */
  EXPECT_ERR(ctx, "group under tp", "dims = tp:2\n[tp]\nnorm, output = SequenceParallel()\n",
             "bad.plan:3:1: a group of patterns ('norm, output') is one fully_shard unit");
  EXPECT_ERR(ctx, "root under tp", "dims = tp:2\n[tp]\nroot = ColwiseParallel()\n",
             "bad.plan:3:1: 'root' (the model itself) is for fully_shard only");
  EXPECT_ERR(ctx, "root in a group", FS "norm, root = fully_shard()\n",
             "bad.plan:3:7: 'root' (the model itself) cannot be in a group");
  EXPECT_ERR(ctx, "twice in a group", FS "norm,  norm = fully_shard()\n",
             "bad.plan:3:8: pattern 'norm' twice in one group");
  EXPECT_ERR(ctx, "dangling comma", FS "norm, = fully_shard()\n",
             "bad.plan:3:7: expected a pattern after ','");
  EXPECT_ERR(ctx, "empty token in a group", FS "norm, layers..x = fully_shard()\n",
             "bad.plan:3:7: bad pattern 'layers..x': an empty token");
  EXPECT_ERR(ctx, "group without =", FS "norm, output fully_shard()\n",
             "bad.plan:3:14: expected '=' after 'norm, output'");
  EXPECT_ERR(ctx, "duplicate group", FS "norm, output = fully_shard()\nnorm,output = fully_shard()\n",
             "bad.plan:4:1: duplicate pattern", "(first at line 3)");
  EXPECT_ERR(ctx, "group before header", "dims = dp_shard:2\nnorm, output = fully_shard()\n",
             "bad.plan:2:1: entry 'norm, output' comes before a [dim] header");
  /* fully_shard's kwargs and values */
  EXPECT_ERR(ctx, "raf typo", FS "x = fully_shard(reshard_after_forwards=True)\n",
             "bad.plan:3:17: unknown keyword argument 'reshard_after_forwards' for fully_shard "
             "(did you mean reshard_after_forward?)");
  EXPECT_ERR(ctx, "mp_policy kwarg", FS "x = fully_shard(mp_policy=None)\n",
             "bad.plan:3:17: unknown keyword argument 'mp_policy' for fully_shard (expected "
             "reshard_after_forward)");
  EXPECT_ERR(ctx, "raf value", FS "x = fully_shard(reshard_after_forward=yes)\n",
             "bad.plan:3:39: expected True, False or None after 'reshard_after_forward='");
  EXPECT_ERR(ctx, "raf empty", FS "x = fully_shard(reshard_after_forward=)\n",
             "bad.plan:3:39: expected True, False or None");
  EXPECT_ERR(ctx, "raf int", FS "x = fully_shard(reshard_after_forward=2)\n",
             "bad.plan:3:39: reshard_after_forward=2: an int", "is not supported");
  EXPECT_ERR(ctx, "raf twice",
             FS "x = fully_shard(reshard_after_forward=True, reshard_after_forward=False)\n",
             "bad.plan:3:45: keyword argument 'reshard_after_forward' given twice");
  EXPECT_ERR(ctx, "style hint", FS "x = FullyShard()\n",
             "bad.plan:3:5: unknown style 'FullyShard' (did you mean fully_shard?)");
  EXPECT_ERR(ctx, "no style", FS "x = 5\n", "bad.plan:3:5: expected a style (fully_shard)");
  EXPECT_ERR(ctx, "no paren", FS "x = fully_shard\n", "bad.plan:3:16: expected '(' after 'fully_shard'");
  /* zero */
  EXPECT_ERR(ctx, "zero 4", "dims = dp_shard:-1\nzero = 4\n",
             "bad.plan:2:8: expected 1, 2 or 3 (the ZeRO stage) after 'zero ='");
  EXPECT_ERR(ctx, "zero 0", "dims = dp_shard:-1\nzero = 0\n", "bad.plan:2:8: expected 1, 2 or 3");
  EXPECT_ERR(ctx, "zero 2x", "dims = dp_shard:-1\nzero = 2x\n", "bad.plan:2:8: expected 1, 2 or 3");
  EXPECT_ERR(ctx, "zero 1 2", "dims = dp_shard:-1\nzero = 1 2\n",
             "bad.plan:2:10: expected the end of the line after 'zero'");
  EXPECT_ERR(ctx, "zero no dp_shard", "dims = dp_replicate:-1\nzero = 1\n",
             "bad.plan:2:1: zero = 1 needs a dp_shard dim in dims");
  EXPECT_ERR(ctx, "zero 2 raf True",
             "dims = dp_shard:-1\nzero = 2\n[dp_shard]\nlayers.* = fully_shard()\n"
             "norm, output = fully_shard(reshard_after_forward=True)\nroot = fully_shard()\n",
             "bad.plan:5: 'norm,output': reshard_after_forward=True contradicts zero = 2 (line 2): "
             "ZeRO-2 keeps the parameters gathered from forward to backward");
  EXPECT_ERR(ctx, "zero 1 raf True",
             "# ZeRO-1\ndims = dp_shard:-1\n[dp_shard]\nroot = fully_shard(reshard_after_forward=True)\n"
             "zero = 1\n",
             "bad.plan:5:", "must come before the first [dim] header");
  EXPECT_ERR(ctx, "zero 1 raf True",
             "zero = 1\ndims = dp_shard:-1\n[dp_shard]\nroot = fully_shard(reshard_after_forward=True)\n",
             "bad.plan:4: 'root': reshard_after_forward=True contradicts zero = 1 (line 1)");
  /* mixed precision */
  EXPECT_ERR(ctx, "mp param f16", FS "mixed_precision_param = f16\n",
             "bad.plan:3:1: setting 'mixed_precision_param' must come before");
  EXPECT_ERR(ctx, "mp param f16", "dims = dp_shard:-1\nmixed_precision_param = f16\n",
             "bad.plan:2:25: 'f16' is not a dtype for mixed_precision_param (expected bf16, f32 or f64)");
  EXPECT_ERR(ctx, "mp param i64", "dims = dp_shard:-1\nmixed_precision_param = int64\n",
             "bad.plan:2:25: 'int64' is not a dtype for mixed_precision_param");
  EXPECT_ERR(ctx, "mp param none", "dims = dp_shard:-1\nmixed_precision_param =\n",
             "bad.plan:2:24: expected bf16, f32 or f64 after 'mixed_precision_param ='");
  EXPECT_ERR(ctx, "mp reduce bf16", "dims = dp_shard:-1\nmixed_precision_reduce = bf16\n",
             "bad.plan:2:26: 'bf16' is not a dtype for mixed_precision_reduce (expected f32 or f64)");
  EXPECT_ERR(ctx, "mp without units", "dims = dp_shard:-1\nmixed_precision_param = bf16\n",
             "bad.plan:2:1: mixed_precision_param needs fully_shard entries under [dp_shard]");
  EXPECT_ERR(ctx, "mp reduce with tp",
             "dims = tp:2\n  mixed_precision_reduce = f32\n[tp]\nnorm = SequenceParallel()\n",
             "bad.plan:2:3: mixed_precision_reduce needs fully_shard entries");
  /* bucket_cap_mb */
  static const char *const bad_caps[] = {"0", "-5", "1e3", "1.2.3", "abc", "2000000", ".", "0.0",
                                         ""};
  for (size_t i = 0; i < sizeof bad_caps / sizeof bad_caps[0]; i++) {
    char text[128];
    snprintf(text, sizeof text, "dims = dp_replicate:-1\nbucket_cap_mb = %s\n", bad_caps[i]);
    EXPECT_ERR(ctx, text, text,
               "bad.plan:2:17: expected a number of MiB > 0 and <= 1048576 after 'bucket_cap_mb ='");
  }
  EXPECT_ERR(ctx, "bucket no dp_replicate", "dims = tp:2\nbucket_cap_mb = 25\n",
             "bad.plan:2:1: bucket_cap_mb needs a dp_replicate dim in dims");
  EXPECT_ERR(ctx, "bucket with HSDP",
             "dims = dp_replicate:-1, dp_shard:2\nbucket_cap_mb = 25\n[dp_shard]\nroot = fully_shard()\n",
             "bad.plan:2:1: bucket_cap_mb is DDP's; with fully_shard entries (line 4)");
  /* settings: the new names in the list, a hint, repeats */
  EXPECT_ERR(ctx, "unknown setting", "dims = tp:2\nreshard = 1\n",
             "bad.plan:2:1: unknown setting 'reshard' (expected name, dims, loss_parallel, zero, "
             "mixed_precision_param, mixed_precision_reduce, bucket_cap_mb, "
             "context_parallel_rotate_method, context_parallel_load_balance, "
             "pipeline_parallel_schedule, pipeline_parallel_schedule_csv, "
             "pipeline_parallel_microbatch_size, pipeline_parallel_microbatches, "
             "module_fqns_per_model_part, "
             "pipeline_parallel_first_stage_less_layers, "
             "pipeline_parallel_last_stage_less_layers, activation_checkpoint_mode, "
             "selective_ac_option or max_norm)");
  /* activation checkpointing (TorchTitan's names) */
  EXPECT_ERR(ctx, "ac mode", "dims = tp:2\nactivation_checkpoint_mode = some\n",
             "bad.plan:2:30: 'some': expected none, selective or full");
  EXPECT_ERR(ctx, "ac N < 1", "dims = tp:2\nactivation_checkpoint_mode = selective\n"
             "selective_ac_option = 0\n", "bad.plan:3:23: '0': expected op or an integer >= 1");
  {
    dt_plan p;
    TU_OK(ctx, dt_plan_parse(ctx, "dims = tp:2\nselective_ac_option = 3\n"
                             "activation_checkpoint_mode = selective\n", "ac.plan", &p));
    TU_CHECK(p.ac.mode == DT_AC_SELECTIVE && p.ac.every == 3, "selective:3 parsed as %d:%d",
             (int)p.ac.mode, p.ac.every);
    TU_OK(ctx, dt_plan_parse(ctx, "dims = tp:2\nactivation_checkpoint_mode = selective\n",
                             "ac.plan", &p));
    TU_CHECK(p.ac.every == 2, "selective's default option %d, TorchTitan's is 2", p.ac.every);
    TU_CHECK(p.ac_given, "activation_checkpoint_mode given, ac_given false");
    TU_OK(ctx, dt_plan_parse(ctx, "dims = tp:2\n", "ac.plan", &p));
    TU_CHECK(p.ac.mode == DT_AC_NONE, "no setting: AC %d, want none", (int)p.ac.mode);
    TU_CHECK(!p.ac_given, "no setting: ac_given true");
    /* none stated is given (shardbench plan searches it alone); an option alone is not */
    TU_OK(ctx, dt_plan_parse(ctx, "dims = tp:2\nactivation_checkpoint_mode = none\n", "ac.plan",
                             &p));
    TU_CHECK(p.ac.mode == DT_AC_NONE && p.ac_given, "none stated: AC %d, ac_given %d",
             (int)p.ac.mode, (int)p.ac_given);
    TU_OK(ctx, dt_plan_parse(ctx, "dims = tp:2\nselective_ac_option = op\n", "ac.plan", &p));
    TU_CHECK(p.ac.mode == DT_AC_NONE && !p.ac_given, "option alone: AC %d, ac_given %d",
             (int)p.ac.mode, (int)p.ac_given);
  }
  /* max_norm (training.max_norm): a number > 0, the clipping's; 0 or a word is refused */
  {
    dt_plan mp;
    TU_CHECK(dt_plan_parse(ctx, "dims = tp:2\nmax_norm = 0.25\n", "ok.plan", &mp) == DT_OK,
             "max_norm: %s", dt_last_error(ctx));
    TU_CHECK(mp.max_norm == 0.25, "max_norm: %g", mp.max_norm);
    TU_CHECK(dt_plan_parse(ctx, "dims = tp:2\n", "ok.plan", &mp) == DT_OK && mp.max_norm == 0,
             "max_norm not given: %g", mp.max_norm);
  }
  EXPECT_ERR(ctx, "max_norm 0", "dims = tp:2\nmax_norm = 0\n",
             "bad.plan:2:12: expected a gradient norm > 0 after 'max_norm =' (e.g. 1.0)");
  EXPECT_ERR(ctx, "max_norm word", "dims = tp:2\nmax_norm = one\n", "bad.plan:2:12:");
  /* pipeline parallel settings */
  EXPECT_ERR(ctx, "pp schedule word", "dims = pp:2\npipeline_parallel_schedule = 1F2B\n",
             "bad.plan:2:30: expected GPipe, 1F1B or Interleaved1F1B");
  EXPECT_ERR(ctx, "pp schedule without pp", "dims = tp:2\npipeline_parallel_schedule = GPipe\n",
             "bad.plan:2:1: pipeline_parallel_schedule needs a pp dim in dims");
  EXPECT_ERR(ctx, "pp microbatch size", "dims = pp:2\npipeline_parallel_microbatch_size = 0\n",
             "bad.plan:2:37: expected a microbatch size >= 1");
  /* pipeline_parallel_microbatches: a count, or pp (the pp degree); not with the size */
  EXPECT_ERR(ctx, "pp microbatches 0", "dims = pp:2\npipeline_parallel_microbatches = 0\n",
             "bad.plan:2:34: expected a microbatch count >= 1 or pp");
  EXPECT_ERR(ctx, "pp microbatches word", "dims = pp:2\npipeline_parallel_microbatches = ppx\n",
             "bad.plan:2:34: expected a microbatch count >= 1 or pp");
  EXPECT_ERR(ctx, "pp microbatches without pp", "dims = tp:2\npipeline_parallel_microbatches = 4\n",
             "bad.plan:2:1: pipeline_parallel_microbatches needs a pp dim in dims");
  EXPECT_ERR(ctx, "pp microbatches and size",
             "dims = pp:2\npipeline_parallel_microbatch_size = 2\npipeline_parallel_microbatches = 4\n",
             "bad.plan:3:1: give pipeline_parallel_microbatch_size (line 2) or "
             "pipeline_parallel_microbatches, not both");
  {
    dt_plan p;
    TU_OK(ctx, dt_plan_parse(ctx, "dims = pp:2\npipeline_parallel_microbatches = 6\n", "mb.plan", &p));
    TU_CHECK(p.pp_microbatches == 6, "microbatches 6 parsed as %d", p.pp_microbatches);
    TU_OK(ctx, dt_plan_parse(ctx, "dims = pp:2\npipeline_parallel_microbatches = pp\n", "mb.plan", &p));
    TU_CHECK(p.pp_microbatches == -1, "microbatches pp parsed as %d, want -1", p.pp_microbatches);
    TU_OK(ctx, dt_plan_parse(ctx, "dims = pp:2\n", "mb.plan", &p));
    TU_CHECK(p.pp_microbatches == 0 && p.pp_microbatch_size == 1,
             "not given: microbatches %d, size %d", p.pp_microbatches, p.pp_microbatch_size);
  }
  EXPECT_ERR(ctx, "pp schedule and csv",
             "dims = pp:2\npipeline_parallel_schedule = GPipe\npipeline_parallel_schedule_csv = x.csv\n",
             "bad.plan:3:1: give pipeline_parallel_schedule (line 2) or pipeline_parallel_schedule_csv");
  /* the stage split: TorchTitan's module_fqns_per_model_part (a TOML list of lists) */
  {
    dt_plan p;
    TU_OK(ctx, dt_plan_parse(ctx,
                             "dims = pp:2\nmodule_fqns_per_model_part = [[\"tok_embeddings\", "
                             "'layers.0'],[ \"layers.1\" ,\"layers.2\", \"norm\", \"output\" ] ]\n",
                             "split.plan", &p));
    TU_CHECK(p.pp_n_stages == 2 && p.pp_stages_line == 2 &&
                 !strcmp(p.pp_stages, "tok_embeddings,layers.0;layers.1,layers.2,norm,output"),
             "split: %d stages on line %d: '%s'", p.pp_n_stages, p.pp_stages_line, p.pp_stages);
    TU_CHECK(p.pp_first_less == 1 && p.pp_last_less == 1, "TorchTitan's defaults 1, 1: %d, %d",
             p.pp_first_less, p.pp_last_less);
    TU_OK(ctx, dt_plan_parse(ctx,
                             "dims = pp:2\npipeline_parallel_first_stage_less_layers = 0\n"
                             "pipeline_parallel_last_stage_less_layers = 3\n", "less.plan", &p));
    TU_CHECK(p.pp_first_less == 0 && p.pp_last_less == 3 && p.pp_n_stages == 0,
             "less: %d, %d, %d stages", p.pp_first_less, p.pp_last_less, p.pp_n_stages);
  }
  EXPECT_ERR(ctx, "split not a list", "dims = pp:2\nmodule_fqns_per_model_part = tok_embeddings\n",
             "bad.plan:2:30: expected '['");
  EXPECT_ERR(ctx, "split unquoted", "dims = pp:2\nmodule_fqns_per_model_part = [[tok_embeddings]]\n",
             "bad.plan:2:32: expected a quoted module name in stage 0");
  EXPECT_ERR(ctx, "split unterminated", "dims = pp:2\nmodule_fqns_per_model_part = [[\"norm]]\n",
             "bad.plan:2:32: unterminated string");
  EXPECT_ERR(ctx, "split empty stage",
             "dims = pp:2\nmodule_fqns_per_model_part = [[\"tok_embeddings\"], []]\n",
             "bad.plan:2:52: expected a quoted module name in stage 1");
  EXPECT_ERR(ctx, "split typo",
             "dims = pp:2\nmodule_fqns_per_model_part = [[\"tok_embedding\", \"layers.0\"], "
             "[\"norm\", \"output\"]]\n",
             "bad.plan:2: module_fqns_per_model_part: stage 0: 'tok_embedding' is not tok_embeddings, layers.N, norm or output");
  EXPECT_ERR(ctx, "split order",
             "dims = pp:2\nmodule_fqns_per_model_part = [[\"tok_embeddings\", \"layers.1\"], "
             "[\"layers.0\", \"norm\", \"output\"]]\n",
             "bad.plan:2: module_fqns_per_model_part: stage 0: layers.1 out of order (expected "
             "layers.0");
  EXPECT_ERR(ctx, "split head not last",
             "dims = pp:2\nmodule_fqns_per_model_part = [[\"tok_embeddings\", \"norm\", "
             "\"output\"], [\"layers.0\"]]\n",
             "stage 0: norm must be in the last stage");
  EXPECT_ERR(ctx, "split trailing", "dims = pp:2\nmodule_fqns_per_model_part = "
             "[[\"tok_embeddings\", \"norm\", \"output\"]] x\n",
             "bad.plan:2:69: expected the end of the line after 'module_fqns_per_model_part'");
  EXPECT_ERR(ctx, "split without pp", "dims = tp:2\nmodule_fqns_per_model_part = "
             "[[\"tok_embeddings\", \"norm\", \"output\"]]\n",
             "bad.plan:2:1: module_fqns_per_model_part needs a pp dim in dims");
  EXPECT_ERR(ctx, "split and less", "dims = pp:2\nmodule_fqns_per_model_part = "
             "[[\"tok_embeddings\", \"norm\", \"output\"]]\n"
             "pipeline_parallel_last_stage_less_layers = 2\n",
             "bad.plan:3:1: pipeline_parallel_last_stage_less_layers shapes the generated split; "
             "module_fqns_per_model_part (line 2) gives the stages: not both");
  EXPECT_ERR(ctx, "less negative", "dims = pp:2\npipeline_parallel_first_stage_less_layers = -1\n",
             "bad.plan:2:45: expected a number of layers >= 0");
  /* context parallel settings */
  EXPECT_ERR(ctx, "rotate word", "dims = cp:2\ncontext_parallel_rotate_method = ringg\n",
             "bad.plan:2:34: expected allgather or ring (alltoall) after "
             "'context_parallel_rotate_method ='");
  EXPECT_ERR(ctx, "rotate without cp", "dims = tp:2\ncontext_parallel_rotate_method = ring\n",
             "bad.plan:2:1: context_parallel_rotate_method needs a cp dim in dims");
  EXPECT_ERR(ctx, "balance without cp", "dims = dp_shard:2\ncontext_parallel_load_balance = false\n",
             "bad.plan:2:1: context_parallel_load_balance needs a cp dim in dims");
  EXPECT_ERR(ctx, "balance word", "dims = cp:2\ncontext_parallel_load_balance = yes\n",
             "bad.plan:2:33: expected true or false after 'context_parallel_load_balance ='");
  EXPECT_ERR(ctx, "setting hint", "dims = dp_shard:2\nmixed_precision_params = bf16\n",
             "bad.plan:2:1: unknown setting 'mixed_precision_params' (did you mean "
             "mixed_precision_param?)");
  EXPECT_ERR(ctx, "zero twice", "dims = dp_shard:2\nzero = 1\nzero = 2\n",
             "bad.plan:3:1: setting 'zero' given twice (first at line 2)");

  /* units against the model: a weight in no unit (no root), a weight in two */
  EXPECT_MODULES_ERR(ctx, "norm in no unit",
                     FS "tok_embeddings = fully_shard()\nlayers.* = fully_shard()\noutput = fully_shard()\n",
                     "bad.plan: module 'norm' is in no fully_shard unit (add a root = fully_shard() "
                     "entry or a unit for it)");
  EXPECT_MODULES_ERR(ctx, "block 1 in no unit",
                     FS "layers.0 = fully_shard()\ntok_embeddings, norm, output = fully_shard()\n",
                     "bad.plan: module 'layers.1.attention_norm' is in no fully_shard unit");
  EXPECT_MODULES_ERR(ctx, "nested units",
                     FS "layers.* = fully_shard()\nlayers.*.attention = fully_shard()\nroot = fully_shard()\n",
                     "bad.plan:4: module 'layers.0.attention.wq' is in two fully_shard units: "
                     "'layers.*' (line 3) and 'layers.*.attention' (line 4)");
  EXPECT_MODULES_ERR(ctx, "group and unit",
                     FS "norm, output = fully_shard()\noutput = fully_shard()\nroot = fully_shard()\n",
                     "bad.plan:4: module 'output' is in two fully_shard units: 'norm,output' (line 3) "
                     "and 'output' (line 4)");
  EXPECT_MODULES_ERR(ctx, "overlapping ranges",
                     FS "layers.[0-2] = fully_shard()\nlayers.[2-5] = fully_shard()\nroot = fully_shard()\n",
                     "bad.plan:4: module 'layers.2.attention_norm' is in two fully_shard units");
  EXPECT_MODULES_ERR(ctx, "group pattern no match", FS "norm, outptu = fully_shard()\nroot = fully_shard()\n",
                     "bad.plan:3: pattern 'outptu' matches no module of debugmodel (6 layers)");
  EXPECT_MODULES_ERR(ctx, "star leaves the blocks", FS "* = fully_shard()\n",
                     "bad.plan: module 'layers.0.attention_norm' is in no fully_shard unit");
  EXPECT_MODULES_ERR(ctx, "layers is no module", FS "layers = fully_shard()\nroot = fully_shard()\n",
                     "bad.plan:3: pattern 'layers' matches no module");
  EXPECT_MODULES_ERR(ctx, "colwise on a block", "dims = tp:2\n[tp]\nlayers.* = ColwiseParallel()\n",
                     "bad.plan:3: pattern 'layers.*' matches 'layers.0', which is not a Linear");
  dt_llama_config cfg = debugmodel();
  EXPECT_RESOLVE_ERR(ctx, "resolve: no unit", FS "layers.* = fully_shard()\n", 4, &cfg, 2048,
                     "bad.plan: module 'tok_embeddings' is in no fully_shard unit");
}
#undef FS

int main(void) {
  dt_ctx ctx;
  dt_ctx_init(&ctx, 0, 1);
  check_shipped(&ctx);
  check_shipped_fsdp(&ctx);
  check_round_trip(&ctx);
  check_fsdp_syntax(&ctx);
  check_fsdp_modules(&ctx);
  check_fnmatch();
  check_resolve(&ctx);
  check_errors(&ctx);
  check_fsdp_errors(&ctx);
  dt_ctx_release(&ctx);
  return tu_finish("test_plan_file");
}
