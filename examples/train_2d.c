/* examples/train_2d.c: trains a Llama with TorchTitan's 2-D recipe (FSDP over
 * dp_shard 2 x TP 2 with sequence and loss parallel, plans/fsdp-tp-sp.plan written
 * out below) on 4 threads through the installed library, <dtensor/dtensor.h>:
 *
 *   cc $(pkg-config --cflags dtensor) examples/train_2d.c $(pkg-config --libs dtensor)
 *
 * It prints the loss of every step and checks it two ways, each independent of the
 * parallelism under test: the same program at world 1 (one rank, no plan: plain
 * training of the same model from the same seed on the same batch) gives the same
 * losses, up to f64 rounding (LOSS_TOL), and training on one fixed batch lowers
 * the loss (AdamW overfits it). Exit 0 when both hold, 1 otherwise.
 * -DTRAIN_2D_PLANT starts the world-1 run from another seed, which must fail.
 */
#include <dtensor/dtensor.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { STEPS = 4, BATCH = 4, SEQ = 16 };
static const char MODEL[] = "debugmodel:n_layers=2";
static const uint64_t SEED = 7;
/* The sharded run sums in another order (TP's partial sums, FSDP's reduce-scatter):
 * f64 rounding, about 1e-16 per operation, grows over the steps' AdamW updates to
 * ~1e-13 relative here; 1e-9 leaves room and still catches any real difference. */
static const double LOSS_TOL = 1e-9;

/* TorchTitan's apply_tp then apply_fsdp (torchtitan/models/llama3/infra/parallelize.py). */
static const char PLAN[] =
    "name = fsdp-tp-sp\n"
    "dims = dp_shard:2, tp:2\n"
    "loss_parallel = true\n"
    "[tp]\n"
    "tok_embeddings = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))\n"
    "norm = SequenceParallel()\n"
    "output = ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), "
    "use_local_output=False)\n"
    "layers.*.attention_norm = SequenceParallel()\n"
    "layers.*.attention = PrepareModuleInput(input_layouts=(Shard(1), None, None), "
    "desired_input_layouts=(Replicate(), None, None))\n"
    "layers.*.attention.wq = ColwiseParallel()\n"
    "layers.*.attention.wk = ColwiseParallel()\n"
    "layers.*.attention.wv = ColwiseParallel()\n"
    "layers.*.attention.wo = RowwiseParallel(output_layouts=Shard(1))\n"
    "layers.*.ffn_norm = SequenceParallel()\n"
    "layers.*.feed_forward = PrepareModuleInput(input_layouts=(Shard(1),), "
    "desired_input_layouts=(Replicate(),))\n"
    "layers.*.feed_forward.w1 = ColwiseParallel()\n"
    "layers.*.feed_forward.w2 = RowwiseParallel(output_layouts=Shard(1))\n"
    "layers.*.feed_forward.w3 = ColwiseParallel()\n"
    "[dp_shard]\n"
    "tok_embeddings = fully_shard(reshard_after_forward=True)\n"
    "layers.* = fully_shard(reshard_after_forward=True)\n"
    "norm, output = fully_shard(reshard_after_forward=False)\n"
    "root = fully_shard()\n";

typedef struct job {
  dt_llama_config cfg;
  const dt_parallel_dims *dims;
  const dt_parallel_plan *plan; /* NULL: world 1 */
  uint64_t seed;
  double loss[STEPS];           /* rank 0's */
} job;

static dt_status train_rank(dt_ctx *ctx, void *arg) {
  job *j = arg;
  int64_t tokens[BATCH * SEQ], targets[BATCH * SEQ];
  for (int i = 0; i < BATCH * SEQ; i++) { /* one fixed batch: next-token pairs */
    tokens[i] = (int64_t)((7 * i + 3) % j->cfg.vocab);
    targets[i] = (int64_t)((7 * i + 10) % j->cfg.vocab);
  }
  const dt_adamw adamw = DT_ADAMW_DEFAULT;
  dt_trainer_opts o;
  memset(&o, 0, sizeof o);
  o.dtype = DT_F64;
  o.seed = j->seed;
  o.batch = BATCH;
  o.seq = SEQ;
  o.adamw = adamw;
  dt_trainer *t = NULL;
  DT_CHECK(dt_trainer_create(ctx, &j->cfg, j->dims, j->plan, &o, &t));
  dt_status s = DT_OK;
  for (int step = 0; step < STEPS && s == DT_OK; step++) {
    dt_trainer_step rec;
    s = dt_trainer_train_step(ctx, t, step, tokens, targets, &rec);
    if (s == DT_OK && ctx->rank == 0) j->loss[step] = rec.loss;
  }
  dt_trainer_free(ctx, t);
  return s;
}

/* Trains j on world ranks of the threads backend; 0, or 1 with the reason printed. */
static int run(job *j, int world) {
  dt_launch_opts lo;
  memset(&lo, 0, sizeof lo);
  lo.backend = DT_BACKEND_THREADS;
  lo.world = world;
  lo.timeout_s = 120;
  dt_launch_report rep;
  memset(&rep, 0, sizeof rep);
  dt_status s = dt_launch(&lo, train_rank, j, &rep);
  if (s != DT_OK)
    fprintf(stderr, "train_2d: world %d: rank %d: %s: %s\n", world, rep.failed_rank,
            dt_status_str(rep.failed_status), rep.failed_msg);
  dt_launch_report_free(&rep);
  return s != DT_OK;
}

int main(void) {
  dt_ctx hc; /* a host context for the plan's errors */
  dt_ctx_init(&hc, 0, 1);
  static dt_plan plan;
  static dt_parallel_plan resolved;
  const int degrees[DT_PDIM_COUNT] = {1, 1, 2, 1, 2}, ones[DT_PDIM_COUNT] = {1, 1, 1, 1, 1};
  dt_parallel_dims d2, d1;
  job two, one;
  memset(&two, 0, sizeof two);
  int rc = 1;
  if (dt_llama_config_get(&hc, MODEL, &two.cfg) != DT_OK ||
      dt_plan_parse(&hc, PLAN, "train_2d.plan", &plan) != DT_OK ||
      dt_parallel_plan_resolve(&hc, &plan, degrees, &two.cfg, BATCH, SEQ, &resolved) != DT_OK ||
      dt_parallel_dims_init(&hc, degrees, 4, &d2) != DT_OK ||
      dt_parallel_dims_init(&hc, ones, 1, &d1) != DT_OK) {
    fprintf(stderr, "train_2d: %s\n", dt_last_error(&hc));
    goto out;
  }
  one = two;
  two.dims = &d2;
  two.plan = &resolved;
  two.seed = SEED;
  one.dims = &d1;
  one.plan = NULL;
#ifdef TRAIN_2D_PLANT
  one.seed = SEED + 1; /* a wrong reference: the check below must fail */
#else
  one.seed = SEED;
#endif
  if (run(&two, 4) || run(&one, 1)) goto out;
  rc = 0;
  for (int s = 0; s < STEPS; s++) {
    const double rel = fabs(two.loss[s] - one.loss[s]) / fabs(one.loss[s]);
    printf("step %d: loss %.12f (dp_shard 2 x tp 2), %.12f (world 1), relative difference %.2e\n",
           s, two.loss[s], one.loss[s], rel);
    if (!isfinite(two.loss[s]) || !(rel <= LOSS_TOL)) {
      fprintf(stderr, "train_2d: step %d: the 2-D loss differs from world 1's by %.3g (over %.0e)\n",
              s, rel, LOSS_TOL);
      rc = 1;
    }
  }
  if (!(two.loss[STEPS - 1] < two.loss[0])) {
    fprintf(stderr, "train_2d: the loss did not decrease on a fixed batch (%.12f -> %.12f)\n",
            two.loss[0], two.loss[STEPS - 1]);
    rc = 1;
  }
  if (rc == 0) printf("train_2d: ok\n");
out:
  dt_ctx_release(&hc);
  return rc;
}
