/* bench/harness/run_cmd.c: `shardbench run` (flags, checks, the DB, printing), and what
 * run and sweep share before a config runs: where plans live and which file a
 * --plan names, the plan check, the MFU peak and the memory limit. The config
 * runner itself is bench/harness/run.c's sb_execute.
 *
 * Order of `run`: flags; their checks (backend, dtype, workload, model, mesh
 * against the world, the plan file parsed and its patterns matched against the
 * model's modules); the config's checks and memory estimate (sb_execute's
 * SB_STAGE_CHECK: a config over the memory limit is bad input here, exit 2);
 * the DB opened (sb_store_open); the MFU peak measured once; the run; the
 * summary and the DB rows. Everything up to the DB is refused with one line on
 * stderr and exit 2 before any work; nothing is created.
 */
#include "config.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "datadir.h"
#include "store.h"

/* The sgemm peak probe: n x n x n products (512: big enough to reach the BLAS
 * kernel's steady rate, 0.27 GFLOP, a few ms), best of PEAK_REPS after one warm-up. */
enum { PEAK_N = 512, PEAK_REPS = 5 };

/* ---- plans ------------------------------------------------------------------------ */

void sb_plans_dir(const char *flag, char *out, size_t n) {
  sb_data_dir(SB_DATA_PLANS, flag, out, n); /* none found: out names the installed one */
}

int sb_plan_locate(const char *dir, const char *arg, char *path, size_t pn, char *name, size_t nn,
                   char *err, size_t errn) {
  size_t l = strlen(arg);
  bool is_path = strchr(arg, '/') || (l > 5 && !strcmp(arg + l - 5, ".plan"));
  int w = is_path ? snprintf(path, pn, "%s", arg) : snprintf(path, pn, "%s/%s.plan", dir, arg);
  if (w < 0 || (size_t)w >= pn) {
    snprintf(err, errn, "path '%.64s...' is longer than %zu characters", arg, pn - 1);
    return -1;
  }
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  size_t bl = strlen(base);
  if (bl > 5 && !strcmp(base + bl - 5, ".plan")) bl -= 5;
  if (bl == 0 || bl >= nn) {
    snprintf(err, errn, "plan name '%.*s' is empty or longer than %zu characters", (int)bl, base,
             nn - 1);
    return -1;
  }
  snprintf(name, nn, "%.*s", (int)bl, base);
  return 0;
}

const char *sb_plan_msg(const char *m) {
  m = sb_strip_rank(m);
  if (!strncmp(m, "dt_plan_", 8)) {
    const char *c = strstr(m, ": ");
    if (c) m = c + 2;
  }
  return m;
}

int sb_plan_validate(const char *cmd, const char *flag, const char *path, const char *const *models,
                     int n) {
  if (access(path, R_OK) != 0) return sb_usage_error(cmd, flag, "no plan file '%s'", path);
  dt_ctx hc; /* a host context: for the library's messages */
  dt_ctx_init(&hc, 0, 1);
  dt_plan *plan = calloc(1, sizeof *plan);
  int rc = 0;
  if (!plan) {
    rc = sb_usage_error(cmd, flag, "out of memory");
  } else if (dt_plan_load(&hc, path, plan) != DT_OK) {
    rc = sb_usage_error(cmd, flag, "%s", sb_plan_msg(dt_last_error(&hc)));
  } else {
    for (int i = 0; i < n && !rc; i++) {
      dt_llama_config cfg;
      if (dt_llama_config_get(&hc, models[i], &cfg) != DT_OK ||
          dt_plan_check_modules(&hc, plan, &cfg) != DT_OK)
        rc = sb_usage_error(cmd, flag, "%s", sb_plan_msg(dt_last_error(&hc)));
    }
  }
  free(plan);
  dt_ctx_release(&hc);
  return rc;
}

int sb_parse_ac(const char *cmd, const char *flag, const char *s, dt_ac_config *out) {
  char mode[32];
  const char *colon = strchr(s, ':');
  const size_t ml = colon ? (size_t)(colon - s) : strlen(s);
  if (ml >= sizeof mode)
    return sb_usage_error(cmd, flag, "expected none, full or selective[:op|:N], got '%s'", s);
  memcpy(mode, s, ml);
  mode[ml] = '\0';
  if (colon && strcmp(mode, "selective"))
    return sb_usage_error(cmd, flag, "'%s': only selective takes an option (selective:op or "
                          "selective:N)", s);
  dt_ctx hc;
  dt_ctx_init(&hc, 0, 1);
  int rc = 0;
  if (dt_ac_parse(&hc, mode, colon ? colon + 1 : NULL, out) != DT_OK)
    rc = sb_usage_error(cmd, flag, "%s", sb_strip_call(dt_last_error(&hc)));
  dt_ctx_release(&hc);
  return rc;
}

void sb_plan_ac(const char *path, dt_ac_config *out) {
  memset(out, 0, sizeof *out);
  dt_plan *plan = calloc(1, sizeof *plan);
  dt_ctx hc;
  dt_ctx_init(&hc, 0, 1);
  if (plan && dt_plan_load(&hc, path, plan) == DT_OK) *out = plan->ac;
  dt_ctx_release(&hc);
  free(plan);
}

int sb_check_model(const char *cmd, const char *flag, const char *model) {
  dt_llama_config tmp;
  dt_ctx hc;
  dt_ctx_init(&hc, 0, 1);
  int rc = 0;
  if (dt_llama_config_get(&hc, model, &tmp) != DT_OK)
    rc = sb_usage_error(cmd, flag, "%s", sb_strip_call(dt_last_error(&hc)));
  dt_ctx_release(&hc);
  return rc;
}

int sb_check_workload(const char *cmd, const char *flag, const char *w) {
  static const char *const known[] = {"model", "block", "embedding", "attention", "feed_forward",
                                      "output"};
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
    if (!strcmp(w, known[i])) return 0;
  return sb_usage_error(cmd, flag,
                        "expected model, block, embedding, attention, feed_forward or output, got "
                        "'%s'", w);
}

/* ---- the MFU peak and the memory limit --------------------------------------------- */

/* --device cuda: the GPU's own rate on a large GEMM of the run's dtype (bf16:
 * f32 accumulation on the tensor cores; f32: no TF32, as the cuda device runs
 * it), best of PEAK_REPS after a warm-up, times the GPUs the ranks use (ranks
 * of a threads job share GPU 0). NAN (source says why) when it cannot run. */
enum { PEAK_GPU_N = 4096 };
static double gpu_peak_tflops(int world, const char *dtype, char *source, size_t n) {
  dt_ctx c;
  dt_ctx_init(&c, 0, 1);
  dt_device *d = NULL;
  const dt_dtype t = !strcmp(dtype, "bf16") ? DT_BF16 : DT_F32;
  const size_t bytes = (size_t)PEAK_GPU_N * PEAK_GPU_N * dt_dtype_size(t);
  void *buf[3] = {NULL, NULL, NULL};
  double best = 1e30;
  dt_status s = dt_device_cuda_create(&c, 0, &d);
  for (int i = 0; i < 3 && s == DT_OK; i++) s = dt_device_alloc(d, bytes, &buf[i]);
  for (int i = 0; i < 2 && s == DT_OK; i++) s = dt_device_fill(d, t, buf[i], (int64_t)bytes / (int64_t)dt_dtype_size(t), 0.01);
  dt_gemm_desc g = {.dtype = t, .m = PEAK_GPU_N, .n = PEAK_GPU_N, .k = PEAK_GPU_N, .alpha = 1,
                    .a = buf[0], .lda = PEAK_GPU_N, .b = buf[1], .ldb = PEAK_GPU_N,
                    .c = buf[2], .ldc = PEAK_GPU_N, .batch = 1};
  for (int r = 0; r <= PEAK_REPS && s == DT_OK; r++) {
    s = dt_device_sync(d);
    double t0 = dt_now();
    if (s == DT_OK) s = dt_device_gemm(d, &g);
    if (s == DT_OK) s = dt_device_sync(d);
    double dt = dt_now() - t0;
    if (s == DT_OK && r > 0 && dt < best) best = dt;
  }
  if (s != DT_OK) snprintf(source, n, "none: %s", sb_strip_call(dt_last_error(&c)));
  for (int i = 0; i < 3; i++) dt_device_free(d, buf[i], bytes);
  dt_device_destroy(d);
  dt_ctx_release(&c);
  if (s != DT_OK) return NAN;
  int ngpu = dt_device_cuda_count();
  const int gpus = world < ngpu ? world : ngpu > 0 ? ngpu : 1;
  const double per = 2.0 * PEAK_GPU_N * PEAK_GPU_N * (double)PEAK_GPU_N / best / 1e12;
  snprintf(source, n, "measured: %s GEMM %d^3 on GPU 0, %.4g TFLOP/s x %d GPU%s", dt_dtype_name(t),
           PEAK_GPU_N, per, gpus, gpus == 1 ? "" : "s");
  return per * gpus;
}

double sb_default_peak_tflops_on(int world, const char *device, const char *dtype, char *source,
                                 size_t n) {
  if (device && !strcmp(device, "cuda")) return gpu_peak_tflops(world, dtype, source, n);
  return sb_default_peak_tflops(world, source, n);
}

double sb_default_peak_tflops(int world, char *source, size_t n) {
  float *a = malloc(sizeof(float) * PEAK_N * PEAK_N * 3);
  snprintf(source, n, "none: no memory to measure it");
  if (!a) return NAN;
  for (long i = 0; i < 3L * PEAK_N * PEAK_N; i++) a[i] = (float)((i % 17) * 0.01);
  int prev = dt_device_cpu_blas_threads(1);
  double best = 1e30;
  for (int r = 0; r <= PEAK_REPS; r++) {
    double t0 = dt_now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, PEAK_N, PEAK_N, PEAK_N, 1.0f, a, PEAK_N,
                a + PEAK_N * PEAK_N, PEAK_N, 0.0f, a + 2 * PEAK_N * PEAK_N, PEAK_N);
    double t = dt_now() - t0;
    if (r > 0 && t < best) best = t;
  }
  if (prev > 0) dt_device_cpu_blas_threads(prev);
  free(a);
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  if (ncpu < 1) ncpu = 1;
  const long cores = world < ncpu ? world : ncpu;
  const double per_core = 2.0 * PEAK_N * PEAK_N * PEAK_N / best / 1e12;
  snprintf(source, n, "measured: sgemm %d^3 on 1 core, %.4g TFLOP/s x %ld core%s", PEAK_N,
           per_core, cores, cores == 1 ? "" : "s");
  return per_core * (double)cores;
}

int sb_limits_from_flags(const char *cmd, const char *peak_s, const char *mem_s, bool no_mem_check,
                         sb_opts *o) {
  o->peak_tflops = 0;
  o->peak_source[0] = '\0';
  if (peak_s) {
    char *end;
    o->peak_tflops = strtod(peak_s, &end);
    if (end == peak_s || *end || !(o->peak_tflops > 0) || !isfinite(o->peak_tflops))
      return sb_usage_error(cmd, "--peak-tflops", "expected a positive number, got '%s'", peak_s);
    snprintf(o->peak_source, sizeof o->peak_source, "--peak-tflops");
  }
  if (no_mem_check && mem_s)
    return sb_usage_error(cmd, "--mem-limit", "give --mem-limit or --no-mem-check, not both");
  o->mem_limit = 0;
  if (no_mem_check) {
    snprintf(o->mem_limit_src, sizeof o->mem_limit_src, "--no-mem-check");
  } else if (mem_s) {
    char err[SB_ERR_LEN];
    size_t v;
    if (sb_parse_bytes(mem_s, (size_t)1 << 50, &v, err, sizeof err) != DT_OK)
      return sb_usage_error(cmd, "--mem-limit", "%s", err);
    o->mem_limit = (double)v;
    snprintf(o->mem_limit_src, sizeof o->mem_limit_src, "--mem-limit");
  } else {
    o->mem_limit = sb_mem_available(o->mem_limit_src, sizeof o->mem_limit_src);
    if (!isfinite(o->mem_limit)) o->mem_limit = 0; /* unknown: no check */
  }
  return 0;
}

int sb_check_device(const char *device, const char *dtype, const char **flag, char *err,
                    size_t errn) {
  *flag = "--device";
  if (strcmp(device, "cpu") && strcmp(device, "cuda") && strcmp(device, "cuda-emu") &&
      strcmp(device, "meta")) {
    snprintf(err, errn, "expected cpu, cuda, cuda-emu or meta, got '%s'", device);
    return -1;
  }
  if (!strcmp(device, "cuda") && !dt_device_cuda_built()) {
    snprintf(err, errn, "cuda: this shardbench is built without CUDA (cuda-emu runs the same "
                        "kernels on the host)");
    return -1;
  }
  if (!strcmp(device, "cuda") && dt_device_cuda_count() == 0) {
    snprintf(err, errn, "cuda: no GPU is visible (cuda-emu runs the same kernels on the host)");
    return -1;
  }
  if (!strcmp(dtype, "bf16") && !strcmp(device, "cpu")) {
    *flag = "--dtype";
    snprintf(err, errn, "bf16 runs on a device (--device cuda or cuda-emu); the CPU runs f32 "
                        "and f64");
    return -1;
  }
  return 0;
}

/* ---- shardbench run ------------------------------------------------------------------- */

const char sb_run_usage[] =
    "usage: shardbench run [--model debugmodel] [--workload W] [--plan NAME|PATH]\n"
    "                      [--mesh dp_replicate:2,tp:4 | --pp N --dp-replicate N --dp-shard N\n"
    "                       --cp N --tp N] [--dtype f32|f64|bf16] [--batch 8] [--seq 32]\n"
    "                      [--device cpu|cuda|cuda-emu|meta]\n"
    "                      [--steps 2] [--warmup 1] [--backend threads|mpi] [--world N]\n"
    "                      [--comm host|nccl] [--pin-ranks] [--ac MODE[:OPTION]]\n"
    "                      [--peak-tflops X] [--mem-limit BYTES | --no-mem-check]\n"
    "                      [--plans-dir DIR] [--db FILE] [--json]\n"
    "                      [--load-weights FILE] [--save-weights FILE [--weights-dtype f32|f64|bf16]\n"
    "                       [--weights-names torchtitan|hf]] [--save-trace FILE]\n"
    "                      [--max-norm X] [--lr-warmup-steps N] [--lr-decay-ratio R]\n"
    "                      [--lr-decay-type linear|sqrt|cosine] [--lr-min-factor F]\n"
    "                      [--global-batch N]\n"
    "\n"
    "Runs one config: builds the mesh over TorchTitan's dims pp, dp_replicate, dp_shard,\n"
    "cp, tp (only dims of size > 1, in that order), applies the plan (the [tp] entries on\n"
    "tp; fully_shard over dp_shard x cp; cp shards the sequence, context parallel;\n"
    "dp_replicate adds data parallel), trains warm-up + timed steps with AdamW, and\n"
    "checks every step's loss and weight gradients and the final weights against the\n"
    "same model on one rank (relative, normwise: 2^10 u before the first update, 2^17 u\n"
    "after; f32 6.1e-5 / 7.8e-3, f64 1.1e-13 / 1.5e-11), naming the worst. Prints step\n"
    "time (median), tokens/s, TFLOP/s (TorchTitan's flops_per_token), MFU, peak host\n"
    "memory per rank (and its estimate) and comm per step. Unsupported configs (a plan\n"
    "that does not fit the mesh) are reported as skipped with the reason.\n"
    "\n"
    "  --comm host|nccl the world communicator's transport: host (default: the backend's\n"
    "                   own, shared memory or MPI) or nccl (NCCL between GPUs, one GPU\n"
    "                   per rank; needs an NCCL build, the cuda device and a GPU)\n"
    "  --plan NAME|PATH NAME: PLANS_DIR/NAME.plan; a path (with a '/' or ending in .plan):\n"
    "                   that file (default: torchtitan-tp-sp with tp > 1, else dp).\n"
    "                   Parsed, and its patterns matched against the model's modules,\n"
    "                   before anything runs; the stored name is the file's base name\n"
    "                   without .plan\n"
    "  --workload W     model (default: the config's layers), block (one layer), or one\n"
    "                   layer type alone, on every plan and mesh that fits (pp = 1):\n"
    "                   embedding     tok_embeddings: tokens -> [b, s, dim]\n"
    "                   attention     x + attention(attention_norm(x))\n"
    "                   feed_forward  x + feed_forward(ffn_norm(x))\n"
    "                   output        norm + output + the model's cross-entropy loss\n"
    "                   x: an N(0, 1) activation [b, s, dim] from the seed, placed as the\n"
    "                   model's layers receive it; the loss of the ones without the\n"
    "                   head: mean(y * R), R a fixed N(0, 1) [b, s, dim] tensor\n"
    "  --device D       where the sharded job's ranks compute: cpu (default), cuda\n"
    "                   (one GPU per rank; needs a CUDA build and a visible GPU) or\n"
    "                   cuda-emu (the CUDA kernels run on the host: checks the GPU path\n"
    "                   without a GPU). The reference runs on the CPU. The device is\n"
    "                   part of the config key (\"device=...\", absent for cpu).\n"
    "                   meta: a shape-only run (status shape-only) on the meta device\n"
    "                   and the fake comm, one rank per distinct role, any size and\n"
    "                   world: no reference, no timing; per role the memory split and\n"
    "                   peak, the comm ledger and the compute ledger per phase. Not\n"
    "                   with --load-weights or --save-weights or --save-trace; --db\n"
    "                   writes shape_runs/shape_roles/shape_comm rows, not results\n"
    "  --dtype T        f32 (default), f64, or bf16 on a device: bf16 parameters and\n"
    "                   activations, f32 master weights and AdamW state, checked against\n"
    "                   an f32 reference with bf16's tolerance\n"
    "  --world N        ranks (default: the mesh's product; alone: tp = N)\n"
    "  --peak-tflops X  MFU denominator (default: measured once, 1-core sgemm x\n"
    "                   min(world, CPUs)); stored with the run\n"
    "  --mem-limit B    refuse a config whose estimated memory (every rank, the\n"
    "                   reference) is over B bytes (64M, 8G; default: the machine's\n"
    "                   available memory)\n"
    "  --no-mem-check   run whatever the estimate says\n"
    "  --plans-dir DIR  where NAME.plan lives (default: $SHARDBENCH_PLANS,\n"
    "                   $SHARDBENCH_DATADIR/plans, ./plans, the installed plans/)\n"
    "  --db FILE        append runs/configs/results/comm rows (results/schema.sql;\n"
    "                   --device meta: runs/shape_* rows)\n"
    "  --ac MODE[:OPT]  activation checkpointing of the sharded job's blocks, over the\n"
    "                   plan's activation_checkpoint_mode / selective_ac_option:\n"
    "                   none, full, selective:N (every N-th block), selective:op\n"
    "                   (TorchTitan's per-op policy); the reference runs without\n"
    "  --json           one JSON object instead of the summary\n"
    "  --max-norm X     clip the gradients to total norm X (> 0; TorchTitan's\n"
    "                   training.max_norm, clip_grad_norm_ over every mesh dim; default:\n"
    "                   the plan's max_norm, else none); both jobs clip, and every step's\n"
    "                   norm is checked against the reference's\n"
    "  --lr-warmup-steps N, --lr-decay-ratio R, --lr-decay-type linear|sqrt|cosine,\n"
    "  --lr-min-factor F  TorchTitan's lr_scheduler over the run's warm-up + timed\n"
    "                   steps (defaults 0, none: decay over the rest, linear, 0); any\n"
    "                   of them turns the schedule on, for both jobs\n"
    "  --global-batch N gradient accumulation (TorchTitan's training.global_batch_size):\n"
    "                   N / --batch microsteps of --batch sequences each, every one\n"
    "                   reduced after its backward (gradient sync on), the loss scaled by\n"
    "                   1 / microsteps; N a multiple of --batch; under pp each microstep\n"
    "                   is a pipeline step of the schedule's microbatches; both jobs\n"
    "  --pin-ranks      threads backend: pin rank r to the r-th CPU when the ranks are\n"
    "                   no more than the CPUs (default: the scheduler places them,\n"
    "                   faster on a shared machine; bench/shardbench-pinning measures it)\n"
    "  --model M        debugmodel, 8B, 70B, 405B, each with optional :KEY=VALUE\n"
    "                   overrides (debugmodel:n_layers=2:n_kv_heads=4; keys: dim,\n"
    "                   n_layers, n_heads, n_kv_heads, vocab, multiple_of,\n"
    "                   ffn_dim_multiplier, norm_eps, rope_theta, rope_scaling, depth_init)\n"
    "  --load-weights F start both the reference and the sharded job from safetensors\n"
    "                   file F (TorchTitan or Hugging Face names, told by the file; F64,\n"
    "                   F32, BF16 or F16), checked against the model before any work\n"
    "  --save-weights F write the sharded job's initial weights (gathered) to F\n"
    "  --weights-dtype  F's dtype (default: --dtype); --weights-names: its names\n"
    "                   (torchtitan, default; hf: Hugging Face Llama, wq/wk rows permuted)\n"
    "  --save-trace F   write the unsharded reference's tokens, losses, every step's\n"
    "                   gradients and the final weights (F64) to safetensors file F\n"
    "\n"
    "Exit: 0 ok or skipped, 1 mismatch or failure, 2 bad input (flags, plan, DB, memory).\n";

int sb_parse_mesh_named(const char *s, int dims[SB_NDIMS], char *err, size_t errn) {
  for (int i = 0; i < SB_NDIMS; i++) dims[i] = 1;
  if (!strcmp(s, "1")) return 0;
  const char *p = s;
  int last = -1;
  for (;;) {
    size_t l = strcspn(p, ":,");
    int d = 0;
    while (d < SB_NDIMS && (strlen(sb_dim_names[d]) != l || strncmp(p, sb_dim_names[d], l))) d++;
    if (d == SB_NDIMS || p[l] != ':') {
      snprintf(err, errn, "expected NAME:SIZE,... with names pp, dp_replicate, dp_shard, cp, tp "
                          "(or 1), got '%s'", s);
      return -1;
    }
    if (d <= last) {
      snprintf(err, errn, "dims must be distinct, in the order pp, dp_replicate, dp_shard, cp, tp");
      return -1;
    }
    last = d;
    p += l + 1;
    size_t v = strcspn(p, ",");
    char num[16];
    if (v == 0 || v >= sizeof num) {
      snprintf(err, errn, "bad size in '%s'", s);
      return -1;
    }
    memcpy(num, p, v);
    num[v] = '\0';
    long x;
    if (sb_parse_long(num, 1, SB_MAX_WORLD_META, &x, err, errn) != DT_OK) return -1;
    dims[d] = (int)x;
    p += v;
    if (!*p) return 0;
    if (!*++p) { /* past the ',' */
      snprintf(err, errn, "trailing ',' in '%s'", s);
      return -1;
    }
  }
}

typedef struct run_args {
  sb_opts o;
  bool dims_given, mesh_given, json, no_mem_check;
  long world;
  const char *db, *plans_flag, *plan_arg, *peak_s, *mem_s;
  const char *load_w, *save_w, *wdtype_s, *wnames_s, *trace;
  bool ac_given;
  bool lr_given;                 /* an --lr-* flag */
} run_args;

enum { O_MODEL = 256, O_WORKLOAD, O_PLAN, O_MESH, O_PP, O_DPR, O_DPS, O_CP, O_TP, O_DTYPE,
       O_BATCH, O_SEQ, O_STEPS, O_WARMUP, O_BACKEND, O_WORLD, O_PEAK, O_MEMLIM, O_NOMEM, O_PLANS,
       O_DB, O_JSON, O_LOADW, O_SAVEW, O_WDTYPE, O_WNAMES, O_TRACE, O_COMM, O_DEVICE, O_PIN, O_AC,
       O_MAXNORM, O_LRWARM, O_LRRATIO, O_LRTYPE, O_LRMIN, O_GBATCH, O_HELP };
static const struct option run_lopts[] = {
    {"model", required_argument, NULL, O_MODEL}, {"workload", required_argument, NULL, O_WORKLOAD},
    {"plan", required_argument, NULL, O_PLAN},   {"mesh", required_argument, NULL, O_MESH},
    {"pp", required_argument, NULL, O_PP},       {"dp-replicate", required_argument, NULL, O_DPR},
    {"dp-shard", required_argument, NULL, O_DPS}, {"cp", required_argument, NULL, O_CP},
    {"tp", required_argument, NULL, O_TP},       {"dtype", required_argument, NULL, O_DTYPE},
    {"batch", required_argument, NULL, O_BATCH}, {"seq", required_argument, NULL, O_SEQ},
    {"steps", required_argument, NULL, O_STEPS}, {"warmup", required_argument, NULL, O_WARMUP},
    {"backend", required_argument, NULL, O_BACKEND}, {"world", required_argument, NULL, O_WORLD},
    {"peak-tflops", required_argument, NULL, O_PEAK},
    {"mem-limit", required_argument, NULL, O_MEMLIM},
    {"no-mem-check", no_argument, NULL, O_NOMEM},
    {"plans-dir", required_argument, NULL, O_PLANS}, {"db", required_argument, NULL, O_DB},
    {"json", no_argument, NULL, O_JSON},
    {"load-weights", required_argument, NULL, O_LOADW},
    {"save-weights", required_argument, NULL, O_SAVEW},
    {"weights-dtype", required_argument, NULL, O_WDTYPE},
    {"weights-names", required_argument, NULL, O_WNAMES},
    {"save-trace", required_argument, NULL, O_TRACE},
    {"comm", required_argument, NULL, O_COMM},
    {"device", required_argument, NULL, O_DEVICE},
    {"pin-ranks", no_argument, NULL, O_PIN},
    {"ac", required_argument, NULL, O_AC},
    {"max-norm", required_argument, NULL, O_MAXNORM},
    {"lr-warmup-steps", required_argument, NULL, O_LRWARM},
    {"lr-decay-ratio", required_argument, NULL, O_LRRATIO},
    {"lr-decay-type", required_argument, NULL, O_LRTYPE},
    {"lr-min-factor", required_argument, NULL, O_LRMIN},
    {"global-batch", required_argument, NULL, O_GBATCH},
    {"help", no_argument, NULL, O_HELP},
    {NULL, 0, NULL, 0}};

/* One flag into a; 0, -1 after --help, or SB_EXIT_USAGE (printed). */
static int run_flag(int ch, run_args *a, char **argv) {
  static const char CMD[] = "run";
  sb_opts *o = &a->o;
  char err[SB_ERR_LEN], flag[40];
  long v;
  snprintf(flag, sizeof flag, "--%s",
           ch >= O_MODEL && ch <= O_HELP ? run_lopts[ch - O_MODEL].name : "?");
  switch (ch) {
  case O_MODEL: case O_WORKLOAD: case O_DTYPE: case O_BACKEND: case O_COMM: case O_DEVICE: {
    char *dst = ch == O_MODEL ? o->model : ch == O_WORKLOAD ? o->workload
                : ch == O_DTYPE ? o->dtype : ch == O_COMM ? o->comm
                : ch == O_DEVICE ? o->device : o->backend;
    size_t cap = ch == O_MODEL ? sizeof o->model : ch == O_WORKLOAD ? sizeof o->workload
                 : ch == O_DTYPE ? sizeof o->dtype : ch == O_COMM ? sizeof o->comm
                 : ch == O_DEVICE ? sizeof o->device
                 : sizeof o->backend;
    if (strlen(optarg) >= cap || !optarg[0])
      return sb_usage_error(CMD, flag, "value '%s' is empty or longer than %zu characters",
                            optarg, cap - 1);
    snprintf(dst, cap, "%s", optarg);
    return 0;
  }
  case O_MESH:
    if (sb_parse_mesh_named(optarg, o->dims, err, sizeof err))
      return sb_usage_error(CMD, "--mesh", "%s", err);
    a->mesh_given = true;
    return 0;
  case O_PP: case O_DPR: case O_DPS: case O_CP: case O_TP:
    if (sb_parse_long(optarg, 1, SB_MAX_WORLD_META, &v, err, sizeof err) != DT_OK)
      return sb_usage_error(CMD, flag, "%s", err);
    o->dims[ch - O_PP] = (int)v;
    a->dims_given = true;
    return 0;
  case O_BATCH: case O_SEQ: case O_STEPS: case O_WARMUP: {
    long lo = ch == O_WARMUP ? 0 : 1,
         hi = ch == O_STEPS || ch == O_WARMUP ? SB_MAX_STEPS : 1 << 20;
    if (sb_parse_long(optarg, lo, hi, &v, err, sizeof err) != DT_OK)
      return sb_usage_error(CMD, flag, "%s", err);
    int *dst = ch == O_BATCH ? &o->batch : ch == O_SEQ ? &o->seq : ch == O_STEPS ? &o->steps
                                                                                : &o->warmup;
    *dst = (int)v;
    return 0;
  }
  case O_WORLD:
    if (sb_parse_long(optarg, 1, SB_MAX_WORLD_META, &a->world, err, sizeof err) != DT_OK)
      return sb_usage_error(CMD, "--world", "%s", err);
    return 0;
  case O_PLAN: a->plan_arg = optarg; return 0;
  case O_PEAK: a->peak_s = optarg; return 0;
  case O_MEMLIM: a->mem_s = optarg; return 0;
  case O_NOMEM: a->no_mem_check = true; return 0;
  case O_PLANS: a->plans_flag = optarg; return 0;
  case O_DB: a->db = optarg; return 0;
  case O_JSON: a->json = true; return 0;
  case O_PIN: o->pin_ranks = true; return 0;
  case O_LOADW: a->load_w = optarg; return 0;
  case O_SAVEW: a->save_w = optarg; return 0;
  case O_WDTYPE: a->wdtype_s = optarg; return 0;
  case O_WNAMES: a->wnames_s = optarg; return 0;
  case O_TRACE: a->trace = optarg; return 0;
  case O_AC:
    a->ac_given = true;
    return sb_parse_ac(CMD, "--ac", optarg, &o->ac);
  case O_MAXNORM: case O_LRRATIO: case O_LRMIN: { /* > 0; the two fractions in [0, 1] */
    char *end;
    const double x = strtod(optarg, &end);
    const bool frac = ch != O_MAXNORM;
    if (end == optarg || *end || !isfinite(x) || (frac ? x < 0 || x > 1 : !(x > 0)))
      return sb_usage_error(CMD, flag, "expected %s, got '%s'",
                            frac ? "a number in [0, 1]" : "a number > 0", optarg);
    if (ch == O_MAXNORM) o->max_norm = x;
    else if (ch == O_LRMIN) o->lr.min_lr_factor = x;
    else {
      o->lr.decay_ratio = x;
      o->lr.has_decay_ratio = true;
    }
    a->lr_given = a->lr_given || frac;
    return 0;
  }
  case O_LRWARM:
    if (sb_parse_long(optarg, 0, SB_MAX_STEPS, &v, err, sizeof err) != DT_OK)
      return sb_usage_error(CMD, flag, "%s", err);
    o->lr.warmup_steps = (int)v;
    a->lr_given = true;
    return 0;
  case O_GBATCH:
    if (sb_parse_long(optarg, 1, 1 << 20, &v, err, sizeof err) != DT_OK)
      return sb_usage_error(CMD, flag, "%s", err);
    o->global_batch = (int)v;
    return 0;
  case O_LRTYPE:
    if (!dt_lr_decay_parse(optarg, &o->lr.decay_type))
      return sb_usage_error(CMD, flag, "expected linear, sqrt or cosine, got '%s'", optarg);
    a->lr_given = true;
    return 0;
  case O_HELP: fputs(sb_run_usage, stdout); return -1;
  default: return sb_getopt_error(CMD, ch, argv, run_lopts);
  }
}

/* The flags into a, with their defaults. */
static int run_parse(int argc, char **argv, run_args *a) {
  memset(a, 0, sizeof *a);
  sb_opts *o = &a->o;
  snprintf(o->model, sizeof o->model, "debugmodel");
  snprintf(o->workload, sizeof o->workload, "model");
  snprintf(o->dtype, sizeof o->dtype, "f32");
  snprintf(o->backend, sizeof o->backend, "threads");
  snprintf(o->comm, sizeof o->comm, "host");
  snprintf(o->device, sizeof o->device, "cpu");
  o->batch = 8;   /* debugmodel dims, a small batch: seconds per step on 2 cores */
  o->seq = 32;
  o->steps = 2;   /* a median of 2 timed steps */
  o->warmup = 1;  /* the first step faults in pages and fills the caches */
  for (int i = 0; i < SB_NDIMS; i++) o->dims[i] = 1;
  int rc = sb_getopt_repeats("run", argc, argv, ":", run_lopts, NULL);
  if (rc) return rc;
  int ch;
  while ((ch = getopt_long(argc, argv, ":", run_lopts, NULL)) != -1)
    if ((rc = run_flag(ch, a, argv)) != 0) return rc;
  if (optind < argc) return sb_usage_error("run", NULL, "unexpected argument '%s'", argv[optind]);
  if (a->lr_given) o->lr.training_steps = o->warmup + o->steps; /* training.steps: every step */
  /* training.global_batch_size: a multiple of local_batch_size x dp degree (--batch) */
  if (o->global_batch && o->global_batch % o->batch)
    return sb_usage_error("run", "--global-batch", "%d is not a multiple of --batch %d (the "
                          "local batch x the data-parallel degree)", o->global_batch, o->batch);
  if (o->global_batch > o->batch && strcmp(o->workload, "model"))
    return sb_usage_error("run", "--global-batch", "gradient accumulation runs the model workload");
  return 0;
}

/* A file the run will write: its directory exists and is writable, and the name
 * fits. 0 or SB_EXIT_USAGE (printed). */
static int out_path(const char *flag, const char *path, char *dst, size_t n) {
  if (!path[0] || strlen(path) + 5 >= n) /* room for ".tmp" */
    return sb_usage_error("run", flag, "path '%.64s' is empty or longer than %zu characters",
                          path, n - 6);
  char dir[1024];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash) slash[slash == dir ? 1 : 0] = '\0';
  else snprintf(dir, sizeof dir, ".");
  if (access(dir, W_OK) != 0)
    return sb_usage_error("run", flag, "cannot write in directory '%s' of '%s'", dir, path);
  snprintf(dst, n, "%s", path);
  return 0;
}

/* --load-weights (opened and checked against the model), --save-weights,
 * --weights-dtype, --weights-names, --save-trace. 0 or SB_EXIT_USAGE (printed). */
static int weights_check(run_args *a, dt_dtype run_dtype) {
  static const char CMD[] = "run";
  sb_opts *o = &a->o;
  o->weights_dtype = run_dtype;
  o->weights_names = DT_NAMES_TORCHTITAN;
  if (a->wdtype_s && (dt_dtype_parse(a->wdtype_s, &o->weights_dtype) != DT_OK ||
                      o->weights_dtype == DT_I64))
    return sb_usage_error(CMD, "--weights-dtype", "expected f32, f64 or bf16, got '%s'",
                          a->wdtype_s);
  if (a->wnames_s) {
    if (!strcmp(a->wnames_s, "hf")) o->weights_names = DT_NAMES_HF;
    else if (strcmp(a->wnames_s, "torchtitan"))
      return sb_usage_error(CMD, "--weights-names", "expected torchtitan or hf, got '%s'",
                            a->wnames_s);
  }
  if ((a->wdtype_s || a->wnames_s) && !a->save_w)
    return sb_usage_error(CMD, a->wdtype_s ? "--weights-dtype" : "--weights-names",
                          "applies to --save-weights, which is not given");
  int rc = 0;
  if (a->save_w && (rc = out_path("--save-weights", a->save_w, o->save_weights,
                                  sizeof o->save_weights)))
    return rc;
  char trace[sizeof o->save_weights];
  if (a->trace && (rc = out_path("--save-trace", a->trace, trace, sizeof trace))) return rc;
  if (a->trace && sb_workload_single(o->workload))
    return sb_usage_error(CMD, "--save-trace", "the trace replays the model from its tokens; "
                          "workload '%s' starts elsewhere (model or block)", o->workload);
  if (a->trace && a->save_w && !strcmp(a->trace, a->save_w))
    return sb_usage_error(CMD, "--save-trace", "is the same file as --save-weights ('%s')",
                          a->trace);
  if (!a->load_w) return 0;
  if (strlen(a->load_w) >= sizeof o->load_weights)
    return sb_usage_error(CMD, "--load-weights", "path is longer than %zu characters",
                          sizeof o->load_weights - 1);
  snprintf(o->load_weights, sizeof o->load_weights, "%s", a->load_w);
  dt_ctx hc;
  dt_ctx_init(&hc, 0, 1);
  dt_llama_config cfg;
  dt_model *m = NULL;
  dt_st_file f;
  dt_weight_names names;
  bool open = false;
  dt_status s = sb_workload_config(&hc, o->model, o->workload, &cfg);
  if (s == DT_OK) s = dt_model_create(&hc, NULL, &cfg, run_dtype, 0, &m);
  if (s == DT_OK) open = (s = dt_st_open(&hc, o->load_weights, &f)) == DT_OK;
  if (s == DT_OK) s = dt_model_weights_check(&hc, m, &f, &names);
  if (s != DT_OK) rc = sb_usage_error(CMD, "--load-weights", "%s", sb_strip_call(dt_last_error(&hc)));
  if (open) dt_st_close(&hc, &f);
  dt_model_free(&hc, m);
  dt_ctx_release(&hc);
  return rc;
}

/* The checks of the flags' values, before any work; under MPI it joins the job
 * (rank). 0 or SB_EXIT_USAGE (printed). */
static int run_check(run_args *a, int *argc, char ***argv, dt_backend *be, int *rank) {
  static const char CMD[] = "run";
  sb_opts *o = &a->o;
  if (a->mesh_given && a->dims_given)
    return sb_usage_error(CMD, NULL, "give --mesh or --pp/--dp-replicate/--dp-shard/--cp/--tp, "
                                     "not both");
  if (dt_backend_parse(o->backend, be) != DT_OK)
    return sb_usage_error(CMD, "--backend", "expected threads or mpi, got '%s'", o->backend);
  if (!dt_backend_available(*be))
    return sb_usage_error(CMD, "--backend", "'%s' is not built into this shardbench", o->backend);
  dt_comm_kind ck;
  if (dt_comm_kind_parse(o->comm, &ck) != DT_OK)
    return sb_usage_error(CMD, "--comm", "expected host or nccl, got '%s'", o->comm);
  if (!dt_comm_kind_available(ck))
    return sb_usage_error(CMD, "--comm", "'%s' is not built into this shardbench", o->comm);
  if (ck == DT_COMM_NCCL && dt_device_cuda_count() < 1)
    return sb_usage_error(CMD, "--comm", "nccl needs a GPU and none is visible");
  dt_dtype dtype;
  if (dt_dtype_parse(o->dtype, &dtype) != DT_OK ||
      (dtype != DT_F32 && dtype != DT_F64 && dtype != DT_BF16))
    return sb_usage_error(CMD, "--dtype", "expected f32, f64 or bf16, got '%s'", o->dtype);
  char err[SB_ERR_LEN];
  const char *dflag;
  if (sb_check_device(o->device, o->dtype, &dflag, err, sizeof err))
    return sb_usage_error(CMD, dflag, "%s", err);
  const bool meta = !strcmp(o->device, "meta");
  if (meta && ck != DT_COMM_HOST)
    return sb_usage_error(CMD, "--comm", "--device meta runs on the fake comm, not %s", o->comm);
  if (meta && (a->load_w || a->save_w || a->trace))
    return sb_usage_error(CMD, a->load_w ? "--load-weights" : a->save_w ? "--save-weights"
                               : "--save-trace",
                          "a shape-only run (--device meta) has no data");
  if (ck == DT_COMM_NCCL && strcmp(o->device, "cpu") && strcmp(o->device, "cuda"))
    return sb_usage_error(CMD, "--comm", "nccl moves GPU memory: it runs with --device cuda, not %s",
                          o->device);
  int rc = sb_check_workload(CMD, "--workload", o->workload);
  if (!rc) rc = sb_check_model(CMD, "--model", o->model);
  if (rc) return rc;
  if ((rc = sb_limits_from_flags(CMD, a->peak_s, a->mem_s, a->no_mem_check, o))) return rc;
  if ((rc = weights_check(a, dtype))) return rc;
  long world = a->world;
  if (*be == DT_BACKEND_MPI) {
    if (dt_mpi_init(argc, argv) != DT_OK)
      return sb_usage_error(CMD, "--backend", "MPI could not be initialised");
    *rank = dt_mpi_rank();
    if (world && world != dt_mpi_size())
      return sb_usage_error(CMD, "--world", "%ld, but mpirun started %d processes", world,
                            dt_mpi_size());
    world = dt_mpi_size();
  }
  long long prod_ll = 1;
  for (int i = 0; i < SB_NDIMS && prod_ll <= SB_MAX_WORLD_META; i++) prod_ll *= o->dims[i];
  if (prod_ll > SB_MAX_WORLD_META)
    return sb_usage_error(CMD, NULL, "the mesh has over %d ranks", (int)SB_MAX_WORLD_META);
  int prod = (int)prod_ll;
  if (!world) world = prod;
  if (!a->mesh_given && !a->dims_given && prod == 1) o->dims[4] = (int)world, prod = (int)world;
  if (prod != world)
    return sb_usage_error(CMD, NULL, "the mesh has %d ranks but the world is %ld", prod, world);
  if (!meta && world > SB_MAX_WORLD)
    return sb_usage_error(CMD, "--world", "%ld ranks: at most %d run (--device meta: any)", world,
                          (int)SB_MAX_WORLD);
  o->world = (int)world;
  /* no --plan: TorchTitan's TP recipe when there is a tp dim, else plain data parallel
   * (a 1-rank run: the unsharded model) */
  if (!a->plan_arg) a->plan_arg = o->dims[4] > 1 ? "torchtitan-tp-sp" : "dp";
  char dir[768];
  sb_plans_dir(a->plans_flag, dir, sizeof dir);
  if (sb_plan_locate(dir, a->plan_arg, o->plan_path, sizeof o->plan_path, o->plan, sizeof o->plan,
                     err, sizeof err))
    return sb_usage_error(CMD, "--plan", "%s", err);
  const char *models[1] = {o->model};
  if ((rc = sb_plan_validate(CMD, "--plan", o->plan_path, models, 1))) return rc;
  if (!a->ac_given) sb_plan_ac(o->plan_path, &o->ac);
  if (sb_fault_check(CMD, *rank == 0)) return SB_EXIT_USAGE; /* TEST SWITCH (run.c) */
  return 0;
}

/* Rank 0: the run's rows (runs with its peak, configs, results, comm; a shape-only
 * run's shape_runs, shape_roles, shape_comm, apart from the measured ones). */
static int run_store(sb_store *st, int argc, char **argv, const sb_opts *o, const sb_config *c,
                     const sb_result *r) {
  char ac[32];
  dt_ac_str(&o->ac, ac, sizeof ac);
  int rc = sb_store_begin_run(st, argc, argv, o->backend, o->world, o->peak_tflops,
                              o->peak_source) ||
           (strcmp(o->device, "meta") ? sb_store_put(st, c, r)
                                      : sb_store_put_shape(st, c, ac, r)) ||
           sb_store_end_run(st);
  sb_store_close(st);
  return rc ? SB_EXIT_FAIL : SB_EXIT_OK;
}

/* Rank 0, after the run: --save-trace written from the reference; a file that
 * was asked for but not written (the config skipped or failed before it) is an
 * error. The exit code. */
static int saved_files(const run_args *a, const sb_ref *ref, const sb_result *r, int rc) {
  char err[SB_ERR_LEN];
  if (a->trace && !ref->key[0]) {
    fprintf(stderr, "shardbench run: --save-trace: not written: the config is %s%s%s\n",
            r->status, r->reason[0] ? ": " : "", r->reason);
    rc = SB_EXIT_FAIL;
  } else if (a->trace && sb_trace_write(&a->o, &ref->snap, a->trace, err, sizeof err)) {
    fprintf(stderr, "shardbench run: --save-trace: %s\n", err);
    rc = SB_EXIT_FAIL;
  }
  if (a->save_w && !r->weights_saved) {
    fprintf(stderr, "shardbench run: --save-weights: not written: the config is %s%s%s\n",
            r->status, r->reason[0] ? ": " : "", r->reason);
    rc = SB_EXIT_FAIL;
  }
  return rc;
}

int sb_cmd_run(int argc, char **argv) {
  run_args a;
  dt_backend be;
  int rank = 0;
  int rc = run_parse(argc, argv, &a);
  if (rc) return rc < 0 ? SB_EXIT_OK : rc;
  if ((rc = run_check(&a, &argc, &argv, &be, &rank))) return rc;
  sb_opts *o = &a.o;
  sb_result r;
  sb_execute(o, NULL, SB_STAGE_CHECK, &r);
  if (r.mem_refused) return sb_usage_error("run", NULL, "%s", r.reason);
  /* shape-only: a mesh or plan that does not fit the job is bad input */
  if (!strcmp(o->device, "meta") && !strcmp(r.status, "skipped"))
    return sb_usage_error("run", NULL, "%s", r.reason);
  sb_store st;
  memset(&st, 0, sizeof st);
  if (a.db && rank == 0 && (rc = sb_store_open(&st, a.db, "run"))) return rc;
  if (rank == 0 && !(o->peak_tflops > 0) && strcmp(o->device, "meta")) /* meta: no timing */
    o->peak_tflops = sb_default_peak_tflops_on(o->world, o->device, o->dtype, o->peak_source,
                                               sizeof o->peak_source);
  sb_config c;
  sb_config_fill(o, &c);
  sb_ref ref;
  memset(&ref, 0, sizeof ref);
  sb_execute(o, &ref, SB_STAGE_RUN, &r);
  rc = SB_EXIT_OK;
  if (rank == 0) {
    sb_print_result(stdout, &c, &r, a.json);
    if (a.db) rc = run_store(&st, argc, argv, o, &c, &r);
    rc = saved_files(&a, &ref, &r, rc);
  }
  sb_ref_free(&ref);
  if (!strcmp(r.status, "mismatch") || !strcmp(r.status, "failed")) rc = SB_EXIT_FAIL;
  sb_result_free(&r);
  /* a failed job may leave collectives pending: dt_mpi_finish(false) aborts */
  if (be == DT_BACKEND_MPI) dt_mpi_finish(strcmp(r.status, "failed") != 0);
  return rc;
}
