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
      a->use_local_output != b->use_local_output || a->sequence_dim != b->sequence_dim)
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

static const dt_plan_entry *find_entry(const dt_plan *p, const char *pat) {
  for (int i = 0; i < p->n_entries; i++)
    if (!strcmp(p->entries[i].pattern, pat)) return &p->entries[i];
  return NULL;
}

static void check_entries(const dt_plan *p, const want *w, int n) {
  TU_CHECK(p->n_entries == n, "%s: %d entries, want %d", p->name, p->n_entries, n);
  for (int i = 0; i < n && i < p->n_entries; i++) {
    char buf[256];
    dt_style_str(&p->entries[i].style, buf, sizeof buf);
    TU_CHECK(!strcmp(p->entries[i].pattern, w[i].pattern), "%s entry %d: pattern %s want %s",
             p->name, i, p->entries[i].pattern, w[i].pattern);
    TU_CHECK(!strcmp(buf, w[i].str), "%s %s: %s want %s", p->name, w[i].pattern, buf, w[i].str);
    TU_CHECK(p->entries[i].dim == dt_plan_dim(p, "tp"), "%s: entry not on tp", p->name);
  }
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
  dt_llama_config cfg = debugmodel();
  TU_OK(ctx, dt_plan_resolve(ctx, &p, 8, &cfg, 2048));
  TU_CHECK(p.dim_sizes[0] == 8, "dp inferred %d", p.dim_sizes[0]);

  TU_CHECK(dt_plan_load(ctx, "/nonexistent/x.plan", &p) == DT_ERR_IO, "missing file -> IO");
}

/* Every style of every shipped plan prints and parses back to the same struct. */
static void check_round_trip(dt_ctx *ctx) {
  static const char *const files[] = {"torchtitan-tp-sp.plan", "tp-no-loss-parallel.plan",
                                      "megatron-tp.plan"};
  for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
    char path[512];
    dt_plan p, q;
    tu_plan_path(files[f], path, sizeof path);
    TU_OK(ctx, dt_plan_load(ctx, path, &p));
    for (int i = 0; i < p.n_entries; i++) {
      char s[256], text[512];
      int n = dt_style_str(&p.entries[i].style, s, sizeof s);
      TU_CHECK(n == (int)strlen(s), "length %d", n);
      snprintf(text, sizeof text, "dims = tp:2\n[tp]\nx = %s\n", s);
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
  };
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
    char text[512], s[256];
    dt_plan p, q;
    snprintf(text, sizeof text, "dims = tp:2\n[tp]\nx = %s   # comment\n", k[i].in);
    TU_OK(ctx, dt_plan_parse(ctx, text, "rt", &p));
    if (p.n_entries != 1) continue;
    dt_style_str(&p.entries[0].style, s, sizeof s);
    TU_CHECK(!strcmp(s, k[i].out), "%s printed %s want %s", k[i].in, s, k[i].out);
    snprintf(text, sizeof text, "dims = tp:2\n[tp]\nx = %s\n", s);
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
  EXPECT_ERR(ctx, "two -1", "dims = dp_replicate:-1, tp:-1\n", "bad.plan:1:28:",
             "at most one dim may be -1", "'dp_replicate' and 'tp'");
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

int main(void) {
  dt_ctx ctx;
  dt_ctx_init(&ctx, 0, 1);
  check_shipped(&ctx);
  check_round_trip(&ctx);
  check_fnmatch();
  check_resolve(&ctx);
  check_errors(&ctx);
  dt_ctx_release(&ctx);
  return tu_finish("test_plan_file");
}
