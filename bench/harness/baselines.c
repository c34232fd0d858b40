/* bench/harness/baselines.c: `shardbench baselines`: the analytic framework baselines
 * (Megatron-LM TP / TP + sequence parallel, ZeRO-1/2/3, DDP, FSDP, HSDP, GPipe /
 * 1F1B / interleaved PP, ring-attention CP, torchtitan FLOPs) of one config, each
 * with the published formula (paper and section) it comes from. The numbers are
 * computed by bench/harness/baselines_model.c (bench/harness/baselines.h); this
 * file parses flags, prints text or JSON, and with --db writes the baselines table
 * (linked to a configs row when --plan is given, else config_id NULL) and loads
 * results/published.csv into the published table, idempotently. With --plan the
 * plan file is read and the framework baselines its settings select (TP part +
 * DP part and their sum, the comm chart's cross) are added. The DB is opened,
 * checked and given its schema by bench/harness/store.c's sb_store_open, the one
 * path every command uses, before anything is printed.
 *
 * Exit codes (bench/harness/cli.h): 0 ok, 1 a DB error, 2 bad flags (one line).
 */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sqlite3.h>

#include "baselines.h"
#include "cli.h"
#include "datadir.h"
#include "store.h"

const char sb_baselines_usage[] =
    "usage: shardbench baselines --model debugmodel|8B|70B|405B [mesh] --batch B --seq S\n"
    "                            [--dtype f32|f64|bf16] [--microbatches M] [--virtual-stages V]\n"
    "                            [--plan NAME|PATH [--plans-dir DIR] [--workload W]]\n"
    "                            [--db FILE [--steps N] [--backend B] [--published CSV]]\n"
    "                            [--json]\n"
    "\n"
    "Analytic baselines from the frameworks' published formulas for one config:\n"
    "Megatron-LM TP and TP + sequence parallel comm (its own layout: every block split,\n"
    "vocabulary-parallel embedding, output fused with the cross-entropy) and activation\n"
    "memory, ZeRO-1/2/3, DDP, FSDP, HSDP comm and memory, GPipe / 1F1B / interleaved\n"
    "bubbles, activations and p2p, ring-attention CP KV traffic, torchtitan FLOPs. Each\n"
    "row names its paper and section. Comm is wire bytes per rank per step by the ring\n"
    "model (AR 2(n-1)/n S, AG/RS (n-1)/n S), comparable with the ledger's wire_bytes.\n"
    "\n"
    "mesh: --mesh pp:1,dp_replicate:2,dp_shard:1,cp:1,tp:4 (named dims, any order,\n"
    "      missing ones 1) or --pp N --dp-replicate N --dp-shard N --cp N --tp N\n"
    "  --batch B            global batch (sequences); divisible by dp_replicate*dp_shard\n"
    "  --seq S              sequence length; divisible by cp\n"
    "  --dtype T            element type of activations, params, grads (default bf16)\n"
    "  --microbatches M     PP micro-batches per step (default pp)\n"
    "  --virtual-stages V   interleaved PP stages per rank (default 1)\n"
    "  --db FILE            write the rows into the baselines table of a results DB\n"
    "                       (the one shardbench sweep writes; another application's\n"
    "                       SQLite file is refused) and load --published (default\n"
    "                       results/published.csv of $SHARDBENCH_DATADIR, ./ or the\n"
    "                       installed data)\n"
    "  --plan NAME|PATH     read DIR/NAME.plan (or the file PATH, as run takes it) and\n"
    "                       add the baselines its settings select\n"
    "                       (styles on modules, sequence parallel, loss_parallel; the\n"
    "                       mesh's dp dims): the TP and DP parts and their sum,\n"
    "                       comm_bytes_per_step_combined; with --db the rows are linked\n"
    "                       to the configs row of this key (model= workload= plan= mesh=\n"
    "                       dtype= batch= seq= steps= backend= world=), else config_id NULL\n"
    "  --plans-dir DIR      where NAME.plan lives (default: $SHARDBENCH_PLANS,\n"
    "                       $SHARDBENCH_DATADIR/plans, ./plans, the installed plans/)\n"
    "  --workload W         model (default) or block (one layer), with --plan (the\n"
    "                       single-layer workloads have no whole-model formulas)\n"
    "  --steps N, --backend B   the rest of the configs key (1, threads)\n"
    "  --json               one JSON object instead of the table\n";

static const char *const CMD = "baselines";

/* The default --published: results/published.csv as bench/harness/datadir.h
 * finds it. The path is written into a compound literal, which lives as long
 * as the block of the initializer that uses the macro. */
#define DEFAULT_PUBLISHED \
  sb_data_file(SB_DATA_RESULTS, "published.csv", (char[SB_DATA_PATH]){0}, SB_DATA_PATH)

/* Mesh dims in the order of results/schema.sql's configs columns. */
enum { D_PP = 0, D_DPR, D_DPS, D_CP, D_TP, D_N };
static const char *const dim_names[D_N] = {"pp", "dp_replicate", "dp_shard", "cp", "tp"};

/* "pp:1,dp_replicate:2,...": named sizes, any order, each dim at most once. */
static int parse_named_mesh(const char *s, int sz[D_N], char *err, size_t errn) {
  bool seen[D_N] = {false};
  const char *p = s;
  if (!*p) {
    snprintf(err, errn, "empty; expected NAME:SIZE items like tp:4");
    return -1;
  }
  while (*p) {
    size_t l = strcspn(p, ",");
    const char *colon = memchr(p, ':', l);
    if (!colon) {
      snprintf(err, errn, "expected NAME:SIZE items like tp:4, got '%.*s'", (int)l, p);
      return -1;
    }
    int k = -1;
    for (int i = 0; i < D_N; i++)
      if ((size_t)(colon - p) == strlen(dim_names[i]) && !strncmp(p, dim_names[i], strlen(dim_names[i])))
        k = i;
    if (k < 0) {
      snprintf(err, errn, "unknown dim '%.*s' (pp, dp_replicate, dp_shard, cp, tp)",
               (int)(colon - p), p);
      return -1;
    }
    if (seen[k]) {
      snprintf(err, errn, "dim %s given twice", dim_names[k]);
      return -1;
    }
    char num[32];
    size_t nl = l - (size_t)(colon + 1 - p);
    if (nl == 0 || nl >= sizeof num) {
      snprintf(err, errn, "bad size for %s", dim_names[k]);
      return -1;
    }
    memcpy(num, colon + 1, nl);
    num[nl] = '\0';
    long v;
    /* 1..2^20 ranks per dim: above any real cluster's dim, and the products of
     * five such dims still fit a double exactly */
    if (sb_parse_long(num, 1, 1L << 20, &v, err, errn) != DT_OK) return -1;
    sz[k] = (int)v;
    seen[k] = true;
    p += l;
    if (*p == ',') {
      p++;
      if (!*p) {
        snprintf(err, errn, "trailing ','");
        return -1;
      }
    }
  }
  return 0;
}

/* ---- SQLite ---- */

static char *read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 4096, len = 0; /* grows by doubling */
  char *buf = malloc(cap);
  while (buf) {
    size_t r = fread(buf + len, 1, cap - len - 1, f);
    len += r;
    if (len + 1 < cap) break;
    char *nb = realloc(buf, cap * 2);
    if (!nb) {
      free(buf);
      buf = NULL;
      break;
    }
    buf = nb;
    cap *= 2;
  }
  fclose(f);
  if (buf) buf[len] = '\0';
  return buf;
}

static int db_fail(sqlite3 *db, const char *what) {
  fprintf(stderr, "shardbench %s: --db: %s: %s\n", CMD, what, db ? sqlite3_errmsg(db) : "?");
  return SB_EXIT_FAIL;
}

/* Splits one CSV line into at most max fields in place ("..." quoting with ""
 * escapes). Returns the field count, or -1 for an unterminated quote. */
static int csv_split(char *line, char **f, int max) {
  int n = 0;
  char *p = line;
  for (;;) {
    if (n == max) return n + 1;
    char *out = p;
    f[n++] = p;
    if (*p == '"') {
      p++;
      for (;;) {
        if (!*p) return -1;
        if (*p == '"' && p[1] == '"') {
          *out++ = '"';
          p += 2;
        } else if (*p == '"') {
          p++;
          break;
        } else {
          *out++ = *p++;
        }
      }
      p += strcspn(p, ","); /* anything between the closing quote and ',' is dropped */
      bool more = *p == ',';
      *out = '\0';
      if (!more) return n;
      p++;
    } else {
      size_t l = strcspn(p, ",");
      bool more = p[l] == ',';
      p[l] = '\0';
      if (!more) return n;
      p += l + 1;
    }
  }
}

/* Loads the published CSV: a row is inserted unless an identical one is there. */
static int load_published(sqlite3 *db, const char *path, int *added) {
  char *text = read_text(path);
  if (!text) {
    fprintf(stderr, "shardbench %s: --published: cannot read %s: %s\n", CMD, path,
            strerror(errno));
    return SB_EXIT_FAIL;
  }
  static const char *const sql =
      "INSERT INTO published (framework, model, hardware, gpus, metric, value, source) "
      "SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7 WHERE NOT EXISTS (SELECT 1 FROM published WHERE "
      "framework = ?1 AND model = ?2 AND hardware = ?3 AND gpus = ?4 AND metric = ?5 AND "
      "value = ?6 AND source = ?7)";
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
    free(text);
    return db_fail(db, "prepare published insert");
  }
  int rc = SB_EXIT_OK, lineno = 0;
  *added = 0;
  char *save = NULL;
  for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    lineno++;
    size_t l = strlen(line);
    if (l && line[l - 1] == '\r') line[l - 1] = '\0';
    if (lineno == 1 || !line[0]) continue; /* the header */
    enum { NF = 7 };                        /* the published table's columns */
    char *f[NF + 1];
    int nf = csv_split(line, f, NF);
    char *end;
    long gpus = nf == NF ? strtol(f[3], &end, 10) : 0;
    bool ok = nf == NF && !*end;
    double val = ok ? strtod(f[5], &end) : 0;
    if (!ok || *end) {
      fprintf(stderr, "shardbench %s: --published: %s:%d: expected 7 fields "
              "framework,model,hardware,gpus,metric,value,source\n", CMD, path, lineno);
      rc = SB_EXIT_FAIL;
      break;
    }
    sqlite3_reset(st);
    for (int i = 0; i < NF; i++) {
      if (i == 3) sqlite3_bind_int64(st, i + 1, gpus);
      else if (i == 5) sqlite3_bind_double(st, i + 1, val);
      else sqlite3_bind_text(st, i + 1, f[i], -1, SQLITE_TRANSIENT);
    }
    if (sqlite3_step(st) != SQLITE_DONE) {
      rc = db_fail(db, "insert published");
      break;
    }
    *added += sqlite3_changes(db);
  }
  sqlite3_finalize(st);
  free(text);
  return rc;
}

typedef struct db_args {
  const char *path, *published, *plan, *workload, *backend, *dtype;
  long steps;
} db_args;

/* The configs row of the config (as run and sweep key it: sb_config_fill),
 * inserted when new; *id = its id. Inside the write transaction. */
static int config_row(sb_store *st, const sb_baseline_in *in, const db_args *da, int64_t *id) {
  sb_opts o;
  memset(&o, 0, sizeof o);
  snprintf(o.model, sizeof o.model, "%s", in->model.name);
  snprintf(o.workload, sizeof o.workload, "%s", da->workload);
  snprintf(o.plan, sizeof o.plan, "%s", da->plan);
  const int sz[D_N] = {in->pp, in->dp_replicate, in->dp_shard, in->cp, in->tp};
  int64_t world = 1;
  for (int i = 0; i < D_N; i++) world *= o.dims[i] = sz[i];
  if (world > INT_MAX) {
    fprintf(stderr, "shardbench %s: --db: a world of %lld ranks does not fit a configs row\n", CMD,
            (long long)world);
    return SB_EXIT_FAIL;
  }
  o.world = (int)world;
  snprintf(o.dtype, sizeof o.dtype, "%s", da->dtype);
  o.batch = (int)in->batch;
  o.seq = (int)in->seq;
  o.steps = (int)da->steps;
  snprintf(o.backend, sizeof o.backend, "%s", da->backend);
  sb_config c;
  sb_config_fill(&o, &c);
  return sb_store_config_id(st, &c, id) ? SB_EXIT_FAIL : SB_EXIT_OK;
}

/* Writes the rows (and the published table) into the DB opened by
 * sb_store_open (bench/harness/store.c: checked, schema created or upgraded), in
 * one transaction; closes it. */
static int write_db(sb_store *sto, const sb_baseline_in *in, const db_args *da,
                    const sb_baseline_row *rows, int n) {
  sqlite3 *db = sto->db;
  int rc = SB_EXIT_OK;
  if (sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK) {
    rc = db_fail(db, "begin");
    goto out;
  }
  int64_t cid = 0; /* 0: rows linked to no config */
  if (da->plan && (rc = config_row(sto, in, da, &cid)) != SB_EXIT_OK) goto rollback;
  if (sb_store_put_baselines(sto, cid, rows, n)) {
    rc = SB_EXIT_FAIL;
    goto rollback;
  }
  int added = 0;
  if ((rc = load_published(db, da->published, &added)) != SB_EXIT_OK) goto rollback;
  if (sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
    rc = db_fail(db, "commit");
    goto rollback;
  }
  fprintf(stderr, "shardbench %s: wrote %d baselines rows (config_id %s) and %d new published rows to %s\n",
          CMD, n, cid > 0 ? "set" : "NULL", added, da->path);
  goto out;
rollback:
  sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
out:
  sb_store_close(sto);
  return rc;
}

/* ---- output ---- */

/* The Megatron-LM TP rows of the text and JSON output: its own layout, with and
 * without sequence parallel. */
typedef struct tp_summary {
  const char *name;
  sb_framework_comm c;
} tp_summary;

/* The plan-selected baseline, when --plan is given. */
typedef struct plan_summary {
  const char *name;      /* NULL: no --plan */
  sb_plan_traits tr;
  sb_framework_comm c;
} plan_summary;

static void print_json(const sb_baseline_in *in, const char *dtype, const tp_summary tp[2],
                       const plan_summary *ps, const sb_baseline_row *rows, int n) {
  printf("{\"model\": ");
  sb_json_str(stdout, in->model.name);
  printf(", \"mesh\": {\"pp\": %d, \"dp_replicate\": %d, \"dp_shard\": %d, \"cp\": %d, \"tp\": %d}",
         in->pp, in->dp_replicate, in->dp_shard, in->cp, in->tp);
  printf(", \"batch\": %lld, \"seq\": %lld, \"dtype\": ", (long long)in->batch, (long long)in->seq);
  sb_json_str(stdout, dtype);
  printf(", \"microbatches\": %d, \"virtual_stages\": %d, \"params\": %lld",
         in->microbatches, in->virtual_stages, (long long)dt_llama_nparams(&in->model));
  printf(", \"tp_comm\": {");
  for (int k = 0; k < 2; k++)
    printf("%s\"%s\": {\"blocks\": %.17g, \"embedding\": %.17g, \"logits\": %.17g, "
           "\"total\": %.17g}",
           k ? ", " : "", tp[k].name, tp[k].c.tp_blocks, tp[k].c.tp_embedding, tp[k].c.tp_logits,
           tp[k].c.tp);
  printf("}");
  if (ps->name) {
    const sb_plan_traits *t = &ps->tr;
    printf(", \"plan\": {\"name\": ");
    sb_json_str(stdout, ps->name);
    printf(", \"attn_tp_layers\": %d, \"mlp_tp_layers\": %d, \"vocab_embedding\": %s, "
           "\"vocab_output\": %s, \"sequence_parallel\": %s, \"loss_parallel\": %s, "
           "\"framework\": ",
           t->attn_tp_layers, t->mlp_tp_layers, t->vocab_embedding ? "true" : "false",
           t->vocab_output ? "true" : "false", t->sequence_parallel ? "true" : "false",
           t->loss_parallel ? "true" : "false");
    sb_json_str(stdout, ps->c.name);
    printf(", \"tp\": %.17g, \"dp\": %.17g, \"cp\": %.17g, \"comm_bytes_per_step_combined\": "
           "%.17g}", ps->c.tp, ps->c.dp, ps->c.cp, ps->c.total);
  }
  printf(", \"baselines\": [");
  for (int i = 0; i < n; i++) {
    printf("%s\n  {\"framework\": ", i ? "," : "");
    sb_json_str(stdout, rows[i].framework);
    printf(", \"quantity\": ");
    sb_json_str(stdout, rows[i].quantity);
    printf(", \"value\": %.17g, \"unit\": ", rows[i].value);
    sb_json_str(stdout, rows[i].unit);
    printf(", \"formula\": ");
    sb_json_str(stdout, rows[i].formula);
    printf("}");
  }
  printf("\n]}\n");
}

static void print_text(const sb_baseline_in *in, const char *dtype, const tp_summary tp[2],
                       const plan_summary *ps, const sb_baseline_row *rows, int n) {
  printf("config: model %s (%lld params), pp %d dp_replicate %d dp_shard %d cp %d tp %d, "
         "batch %lld seq %lld dtype %s, microbatches %d, virtual stages %d\n",
         in->model.name, (long long)dt_llama_nparams(&in->model), in->pp, in->dp_replicate,
         in->dp_shard, in->cp, in->tp, (long long)in->batch, (long long)in->seq, dtype,
         in->microbatches, in->virtual_stages);
  printf("Megatron-LM TP comm per rank per step, its own layout (wire bytes, ring model):\n");
  printf("  %-15s %18s %16s %16s %18s\n", "framework", "blocks", "embedding", "logits", "total");
  for (int k = 0; k < 2; k++)
    printf("  %-15s %18.0f %16.0f %16.0f %18.0f\n", tp[k].name, tp[k].c.tp_blocks,
           tp[k].c.tp_embedding, tp[k].c.tp_logits, tp[k].c.tp);
  if (ps->name) {
    const sb_plan_traits *t = &ps->tr;
    printf("plan %s: %d/%d layers' attention and %d/%d MLPs split, embedding %s, output %s, "
           "sequence parallel %s, loss parallel %s\n",
           ps->name, t->attn_tp_layers, t->layers, t->mlp_tp_layers, t->layers,
           t->vocab_embedding ? "vocab-split" : "whole", t->vocab_output ? "vocab-split" : "whole",
           t->sequence_parallel ? "yes" : "no", t->loss_parallel ? "yes" : "no");
    printf("  selects %s: tp %.0f + dp %.0f + cp %.0f = %.0f bytes per rank per step\n",
           ps->c.name[0] ? ps->c.name : "(none)", ps->c.tp, ps->c.dp, ps->c.cp, ps->c.total);
  }
  printf("\n%-15s %-36s %22s %-8s %s\n", "framework", "quantity", "value", "unit", "formula");
  for (int i = 0; i < n; i++)
    printf("%-15s %-36s %22.15g %-8s %s\n", rows[i].framework, rows[i].quantity, rows[i].value,
           rows[i].unit, rows[i].formula);
}

/* Reads the plan file at path into the traits of the model config cfg. 0, or -1
 * with a one-line reason in err. */
static int read_plan_traits(const char *path, const dt_llama_config *cfg, sb_plan_traits *tr,
                            char *err, size_t errn) {
  dt_plan *plan = calloc(1, sizeof *plan);
  if (!plan) {
    snprintf(err, errn, "out of memory");
    return -1;
  }
  dt_ctx hc; /* a host context, only for the parser's error message */
  dt_ctx_init(&hc, 0, 1);
  int rc = 0;
  if (dt_plan_load(&hc, path, plan) != DT_OK) {
    snprintf(err, errn, "%s", sb_plan_msg(dt_last_error(&hc)));
    rc = -1;
  } else {
    sb_plan_traits_get(plan, cfg, tr);
  }
  dt_ctx_release(&hc);
  free(plan);
  return rc;
}

/* ---- the command ---- */

/* The flags as given. */
typedef struct bl_args {
  const char *model, *mesh, *plans_flag;
  long dims[D_N], batch, seq, mbs, vs;
  dt_dtype dt;
  bool json;
  db_args da;
  char plan_name[64], plan_path[1024];
} bl_args;

/* Sizes up to 2^20 ranks per dim, batch/seq up to 2^30: beyond any real run, and
 * their products stay exact in double. */
static const long DIM_MAX = 1L << 20, TOK_MAX = 1L << 30;

/* The flags into a; 0, -1 after --help, or the one-line error's exit code. */
static int parse_flags(int argc, char **argv, bl_args *a) {
  enum {
    O_MODEL = 1000, O_MESH, O_PP, O_DPR, O_DPS, O_CP, O_TP, O_BATCH, O_SEQ, O_DTYPE, O_MB, O_VS,
    O_DB, O_PLAN, O_WORKLOAD, O_STEPS, O_BACKEND, O_PUB, O_JSON, O_HELP, O_PLANS_DIR
  };
  static const struct option lopts[] = {
      {"model", required_argument, NULL, O_MODEL},
      {"mesh", required_argument, NULL, O_MESH},
      {"pp", required_argument, NULL, O_PP},
      {"dp-replicate", required_argument, NULL, O_DPR},
      {"dp-shard", required_argument, NULL, O_DPS},
      {"cp", required_argument, NULL, O_CP},
      {"tp", required_argument, NULL, O_TP},
      {"batch", required_argument, NULL, O_BATCH},
      {"seq", required_argument, NULL, O_SEQ},
      {"dtype", required_argument, NULL, O_DTYPE},
      {"microbatches", required_argument, NULL, O_MB},
      {"virtual-stages", required_argument, NULL, O_VS},
      {"db", required_argument, NULL, O_DB},
      {"plan", required_argument, NULL, O_PLAN},
      {"workload", required_argument, NULL, O_WORKLOAD},
      {"steps", required_argument, NULL, O_STEPS},
      {"backend", required_argument, NULL, O_BACKEND},
      {"published", required_argument, NULL, O_PUB},
      {"json", no_argument, NULL, O_JSON},
      {"plans-dir", required_argument, NULL, O_PLANS_DIR},
      {"help", no_argument, NULL, O_HELP},
      {NULL, 0, NULL, 0}};
  char err[SB_ERR_LEN];
  int ch = sb_getopt_repeats(CMD, argc, argv, ":h", lopts, NULL);
  if (ch) return ch;
  while ((ch = getopt_long(argc, argv, ":h", lopts, NULL)) != -1) {
    long *dst = NULL, hi = DIM_MAX;
    const char *flag = NULL;
    switch (ch) {
    case O_MODEL: a->model = optarg; break;
    case O_MESH: a->mesh = optarg; break;
    case O_PP: dst = &a->dims[D_PP]; flag = "--pp"; break;
    case O_DPR: dst = &a->dims[D_DPR]; flag = "--dp-replicate"; break;
    case O_DPS: dst = &a->dims[D_DPS]; flag = "--dp-shard"; break;
    case O_CP: dst = &a->dims[D_CP]; flag = "--cp"; break;
    case O_TP: dst = &a->dims[D_TP]; flag = "--tp"; break;
    case O_BATCH: dst = &a->batch; flag = "--batch"; hi = TOK_MAX; break;
    case O_SEQ: dst = &a->seq; flag = "--seq"; hi = TOK_MAX; break;
    case O_MB: dst = &a->mbs; flag = "--microbatches"; hi = TOK_MAX; break;
    case O_VS: dst = &a->vs; flag = "--virtual-stages"; break;
    case O_STEPS: dst = &a->da.steps; flag = "--steps"; hi = TOK_MAX; break;
    case O_DTYPE:
      if (sb_parse_dtype(optarg, &a->dt, err, sizeof err) != DT_OK)
        return sb_usage_error(CMD, "--dtype", "%s", err);
      break;
    case O_DB: a->da.path = optarg; break;
    case O_PLAN: a->da.plan = optarg; break;
    case O_WORKLOAD: a->da.workload = optarg; break;
    case O_BACKEND: a->da.backend = optarg; break;
    case O_PUB: a->da.published = optarg; break;
    case O_JSON: a->json = true; break;
    case O_PLANS_DIR: a->plans_flag = optarg; break;
    case O_HELP:
    case 'h': fputs(sb_baselines_usage, stdout); return -1;
    default: return sb_getopt_error(CMD, ch, argv, lopts);
    }
    if (dst && sb_parse_long(optarg, 1, hi, dst, err, sizeof err) != DT_OK)
      return sb_usage_error(CMD, flag, "%s", err);
  }
  if (optind < argc) return sb_usage_error(CMD, NULL, "unexpected argument '%s'", argv[optind]);
  return 0;
}

/* The config the flags describe into in, checked; 0 or the one-line error's code. */
static int make_input(bl_args *a, sb_baseline_in *in) {
  char err[SB_ERR_LEN];
  if (!a->model) return sb_usage_error(CMD, "--model", "required (debugmodel, 8B, 70B or 405B)");
  if (a->batch < 0) return sb_usage_error(CMD, "--batch", "required");
  if (a->seq < 0) return sb_usage_error(CMD, "--seq", "required");
  memset(in, 0, sizeof *in);
  int rc = sb_check_model(CMD, "--model", a->model);
  if (rc) return rc;
  dt_llama_config_get(NULL, a->model, &in->model);
  int sz[D_N] = {1, 1, 1, 1, 1};
  if (a->mesh && parse_named_mesh(a->mesh, sz, err, sizeof err))
    return sb_usage_error(CMD, "--mesh", "%s", err);
  for (int i = 0; i < D_N; i++) {
    if (a->dims[i] < 0) continue;
    if (a->mesh && sz[i] != a->dims[i])
      return sb_usage_error(CMD, NULL, "--%s %ld disagrees with --mesh %s:%d", dim_names[i],
                            a->dims[i], dim_names[i], sz[i]);
    sz[i] = (int)a->dims[i];
  }
  in->pp = sz[D_PP];
  in->dp_replicate = sz[D_DPR];
  in->dp_shard = sz[D_DPS];
  in->cp = sz[D_CP];
  in->tp = sz[D_TP];
  in->batch = a->batch;
  in->seq = a->seq;
  in->elem_bytes = (int)dt_dtype_size(a->dt);
  in->microbatches = a->mbs > 0 ? (int)a->mbs : in->pp; /* default: one micro-batch per stage */
  in->virtual_stages = (int)a->vs;
  if (!a->da.path && a->da.steps != 1) return sb_usage_error(CMD, "--steps", "needs --db");
  if (!a->da.plan && (a->plans_flag || strcmp(a->da.workload, "model")))
    return sb_usage_error(CMD, a->plans_flag ? "--plans-dir" : "--workload", "needs --plan");
  if (strcmp(a->da.workload, "model") && strcmp(a->da.workload, "block"))
    return sb_usage_error(CMD, "--workload",
                          "expected model or block, got '%s' (the framework formulas count a "
                          "whole model; the single-layer workloads have no baselines)",
                          a->da.workload);
  (void)sb_workload_config(NULL, a->model, a->da.workload, &in->model); /* known model */
  if (sb_baseline_check(in, err, sizeof err)) return sb_usage_error(CMD, NULL, "%s", err);
  a->da.dtype = dt_dtype_name(a->dt);
  return 0;
}

/* --plan NAME|PATH (as `run` takes it): the framework baselines its settings
 * select into ps; the stored plan name is the file's base name. */
static int plan_part(bl_args *a, const sb_baseline_in *in, plan_summary *ps) {
  memset(ps, 0, sizeof *ps);
  if (!a->da.plan) return 0;
  char dir[768], err[SB_ERR_LEN];
  sb_plans_dir(a->plans_flag, dir, sizeof dir);
  if (sb_plan_locate(dir, a->da.plan, a->plan_path, sizeof a->plan_path, a->plan_name,
                     sizeof a->plan_name, err, sizeof err) ||
      read_plan_traits(a->plan_path, &in->model, &ps->tr, err, sizeof err))
    return sb_usage_error(CMD, "--plan", "%s", err);
  a->da.plan = a->plan_name;
  ps->name = a->plan_name;
  if (sb_framework_comm_compute(in, &ps->tr, &ps->c)) return sb_usage_error(CMD, NULL, "bad config");
  return 0;
}

/* Every formula's row, Megatron-LM's own layouts, and the plan's sum (its parts
 * repeat rows of the table) into rows (n) and tp; 0 or the error's code. */
static int compute(const sb_baseline_in *in, const plan_summary *ps, sb_baseline_row *rows,
                   int *n, tp_summary tp[2]) {
  *n = sb_baseline_compute(in, rows, SB_BASELINE_MAX_ROWS);
  memset(tp, 0, 2 * sizeof *tp);
  tp[0].name = "megatron-tp";
  tp[1].name = "megatron-tp-sp";
  sb_plan_traits tm, ts;
  sb_plan_traits_megatron(&in->model, false, &tm);
  sb_plan_traits_megatron(&in->model, true, &ts);
  if (*n < 0 || sb_framework_comm_compute(in, &tm, &tp[0].c) ||
      sb_framework_comm_compute(in, &ts, &tp[1].c))
    return sb_usage_error(CMD, NULL, "bad config");
  if (ps->name) {
    sb_baseline_row pr[5];
    int k = sb_baseline_plan_rows(in, &ps->tr, pr, 5);
    for (int i = 0; i < k && *n < SB_BASELINE_MAX_ROWS; i++)
      if (!strcmp(pr[i].quantity, "comm_bytes_per_step_combined")) rows[(*n)++] = pr[i];
  }
  return 0;
}

int sb_cmd_baselines(int argc, char **argv) {
  bl_args a = {.dims = {-1, -1, -1, -1, -1}, .batch = -1, .seq = -1, .mbs = -1, .vs = 1,
               .dt = DT_BF16, .da = {NULL, DEFAULT_PUBLISHED, NULL, "model", "threads", NULL, 1}};
  sb_baseline_in in;
  plan_summary ps;
  sb_baseline_row rows[SB_BASELINE_MAX_ROWS];
  tp_summary tp[2];
  int n = 0;
  int rc = parse_flags(argc, argv, &a);
  if (rc) return rc < 0 ? SB_EXIT_OK : rc;
  if ((rc = make_input(&a, &in)) || (rc = plan_part(&a, &in, &ps)) ||
      (rc = compute(&in, &ps, rows, &n, tp)))
    return rc;
  sb_store st;
  if (a.da.path) { /* checked before anything is printed */
    if (access(a.da.published, R_OK) != 0)
      return sb_usage_error(CMD, "--published", "cannot read '%s': %s", a.da.published,
                            strerror(errno));
    if ((rc = sb_store_open(&st, a.da.path, CMD))) return rc;
  }
  if (a.json) print_json(&in, a.da.dtype, tp, &ps, rows, n);
  else print_text(&in, a.da.dtype, tp, &ps, rows, n);
  if (a.da.path) return write_db(&st, &in, &a.da, rows, n);
  return SB_EXIT_OK;
}
