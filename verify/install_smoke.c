/* verify/install_smoke.c: a program built against the INSTALLED libdtensor
 * (verify/installcheck.sh: cc $(pkg-config --cflags dtensor) ... $(pkg-config
 * --libs dtensor)), with nothing of the source tree on its include path.
 *
 * A 2-rank job on the threads backend: an all_reduce(sum) of rank+1 (expected
 * 1 + 2 = 3 everywhere), then a 5 x 3 f32 DTensor with element (i, j) = 10 i + j
 * sharded on dim 0 over a 1-D mesh (rank 0 holds rows 0..2, rank 1 rows 3..4:
 * torch.chunk's split) and redistributed to Replicate: every rank must then
 * hold the whole tensor, checked element by element against the formula.
 * Built with -DSMOKE_PLANT the expected all_reduce value is wrong, so the
 * program must fail: installcheck.sh builds it that way once to prove it can.
 * Prints "install_smoke: ok" and exits 0, else one line per failure and exit 1. */
#include <dtensor/dtensor.h>

#include <stdio.h>
#include <string.h>

enum { WORLD = 2, ROWS = 5, COLS = 3 };

#ifdef SMOKE_PLANT
#define EXPECTED_SUM 4.0f
#else
#define EXPECTED_SUM 3.0f /* 1 + 2: rank + 1 summed over 2 ranks */
#endif

typedef struct smoke_arg {
  char why[WORLD][160]; /* per rank: empty when its checks passed */
} smoke_arg;

static dt_status smoke_rank(dt_ctx *ctx, void *argp) {
  smoke_arg *arg = argp;
  char *why = arg->why[ctx->rank];
  dt_status s;
  float mine[4], sum[4];
  for (int i = 0; i < 4; i++) mine[i] = (float)(ctx->rank + 1);
  if ((s = dt_comm_all_reduce(ctx->world, mine, sum, 4, DT_F32, DT_RED_SUM)) != DT_OK) {
    snprintf(why, 160, "all_reduce: %s", dt_last_error(ctx));
    return s;
  }
  for (int i = 0; i < 4; i++)
    if (sum[i] != EXPECTED_SUM) {
      snprintf(why, 160, "all_reduce: element %d is %g, expected %g", i, sum[i], EXPECTED_SUM);
      return DT_ERR_INVALID;
    }

  dt_mesh *mesh = NULL;
  const int shape[1] = {WORLD};
  const char *const names[1] = {"tp"};
  if ((s = dt_mesh_create(ctx, ctx->world, 1, shape, names, &mesh)) != DT_OK) {
    snprintf(why, 160, "dt_mesh_create: %s", dt_last_error(ctx));
    return s;
  }
  float g[ROWS * COLS];
  for (int i = 0; i < ROWS; i++)
    for (int j = 0; j < COLS; j++) g[i * COLS + j] = (float)(10 * i + j);
  const int64_t gshape[2] = {ROWS, COLS};
  dt_array global;
  dt_tensor sharded, repl;
  memset(&sharded, 0, sizeof sharded);
  memset(&repl, 0, sizeof repl);
  dt_placement shard0 = dt_shard(0), rep = dt_replicate();
  bool have_sharded = false, have_repl = false;
  if ((s = dt_array_wrap(ctx, DT_DEV_CPU, DT_F32, 2, gshape, g, &global)) != DT_OK ||
      (s = dt_tensor_distribute(ctx, mesh, &global, &shard0, &sharded)) != DT_OK) {
    snprintf(why, 160, "distribute: %s", dt_last_error(ctx));
    goto out;
  }
  have_sharded = true;
  const int64_t want_rows = ctx->rank == 0 ? 3 : 2;
  if (dt_tensor_local(&sharded)->shape[0] != want_rows) {
    snprintf(why, 160, "shard: %lld local rows, expected %lld",
             (long long)dt_tensor_local(&sharded)->shape[0], (long long)want_rows);
    s = DT_ERR_INVALID;
    goto out;
  }
  if ((s = dt_redistribute(ctx, &sharded, &rep, DT_PLANNER_GREEDY, &repl)) != DT_OK) {
    snprintf(why, 160, "redistribute S(0)->R: %s", dt_last_error(ctx));
    goto out;
  }
  have_repl = true;
  const dt_array *loc = dt_tensor_local(&repl);
  const float *v = loc->data;
  if (loc->numel != ROWS * COLS) {
    snprintf(why, 160, "replicate: %lld elements, expected %d", (long long)loc->numel, ROWS * COLS);
    s = DT_ERR_INVALID;
    goto out;
  }
  for (int i = 0; i < ROWS; i++)
    for (int j = 0; j < COLS; j++)
      if (v[i * COLS + j] != (float)(10 * i + j)) {
        snprintf(why, 160, "replicate: (%d, %d) is %g, expected %d", i, j, v[i * COLS + j],
                 10 * i + j);
        s = DT_ERR_INVALID;
        goto out;
      }
out:
  if (have_repl) dt_tensor_free(ctx, &repl);
  if (have_sharded) dt_tensor_free(ctx, &sharded);
  dt_mesh_free(mesh);
  return s;
}

int main(void) {
  smoke_arg arg;
  memset(&arg, 0, sizeof arg);
  dt_launch_opts opts;
  memset(&opts, 0, sizeof opts);
  opts.backend = DT_BACKEND_THREADS;
  opts.world = WORLD;
  opts.timeout_s = 60;
  dt_launch_report rep;
  memset(&rep, 0, sizeof rep);
  dt_status s = dt_launch(&opts, smoke_rank, &arg, &rep);
  int bad = s != DT_OK;
  for (int r = 0; r < WORLD; r++)
    if (arg.why[r][0]) {
      fprintf(stderr, "install_smoke: rank %d: %s\n", r, arg.why[r]);
      bad = 1;
    }
  if (s != DT_OK)
    fprintf(stderr, "install_smoke: dt_launch: %s (rank %d: %s)\n", dt_status_str(s),
            rep.failed_rank, rep.failed_msg);
  dt_launch_report_free(&rep);
  if (bad) return 1;
  printf("install_smoke: ok\n");
  return 0;
}
