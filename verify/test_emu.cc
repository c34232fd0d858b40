/* verify/test_emu.cc: the host emulator of the GPU kernels (lib/device/kern/emu.cc)
 * against what CUDA guarantees, with kernels written here in sbk.cuh's style:
 *   - every thread of every block runs once with its own (tx, bx) and the launch's
 *     (ntx, nbx): a kernel marks (bx, tx) cells, checked against a zeroed grid;
 *   - t.sync() is a barrier: a tree reduction through shared memory
 *     (sbk_block_reduce) gives the sum 0 + 1 + ... + (n - 1) = n (n - 1) / 2 and the max
 *     n - 1 in every thread, for block sizes 1 .. 1024;
 *   - shared memory is per block and starts as garbage (0xA5 bytes), not zero;
 *   - the failures a GPU would hang on or reject are errors: a barrier that some
 *     threads skip (divergent __syncthreads), sync() in a kernel launched without
 *     SBK_SYNC, a block of 1025 threads, 48 KiB + 1 of shared memory, a grid of 0.
 * The last group is how this test proves it can fail: each broken kernel must be
 * reported, not pass. */
#include "config.h"

#include <stdio.h>
#include <string.h>

#define SB_KERN_EMU 1
#define restrict __restrict /* the C headers' restrict, in C++ */
extern "C" {
#include "testutil.h"
}
#include "device/kern/sbk.cuh"

static void test_coverage(dt_device *d) {
  const int grids[] = {1, 3, 7}, blocks[] = {1, 32, 96, 1024};
  for (int g : grids)
    for (int b : blocks) {
      static int hits[7 * 1024];
      memset(hits, 0, sizeof hits);
      int *h = hits;
      dt_status st = sbk_launch(d, "cover", g, b, 0, 0, SBK_LAMBDA(const sbk_thr &t) {
        if (t.ntx == b && t.nbx == g) h[t.bx * t.ntx + t.tx]++;
      });
      TU_CHECK(st == DT_OK, "coverage launch <<<%d, %d>>>: %s", g, b, dt_status_str(st));
      int bad = 0;
      for (int i = 0; i < g * b; i++) bad += hits[i] != 1;
      TU_CHECK(bad == 0, "<<<%d, %d>>>: %d threads did not run exactly once", g, b, bad);
    }
}

static void test_barrier(dt_device *d) {
  for (int b = 1; b <= 1024; b *= 2) {
    static double sums[4 * 1024], maxs[4 * 1024];
    double *sp = sums, *mp = maxs;
    const int g = 4;
    dt_status st = sbk_launch(d, "reduce", g, b, b * sizeof(double), SBK_SYNC,
                              SBK_LAMBDA(const sbk_thr &t) {
      double *buf = (double *)t.smem;
      double v = t.tx + 1000.0 * t.bx;
      sp[t.bx * t.ntx + t.tx] = sbk_block_reduce(t, v, buf, 0);
      mp[t.bx * t.ntx + t.tx] = sbk_block_reduce(t, v, buf, 1);
    });
    TU_CHECK(st == DT_OK, "reduce launch b=%d: %s", b, dt_status_str(st));
    int bad = 0;
    for (int bx = 0; bx < g; bx++)
      for (int i = 0; i < b; i++) {
        double want_sum = b * (b - 1) / 2.0 + 1000.0 * bx * b, want_max = b - 1 + 1000.0 * bx;
        bad += sums[bx * b + i] != want_sum || maxs[bx * b + i] != want_max;
      }
    TU_CHECK(bad == 0, "block %d: %d threads got a wrong block sum or max", b, bad);
  }
}

static void test_shared_garbage(dt_device *d) {
  static unsigned char seen[2];
  unsigned char *sp = seen;
  dt_status st = sbk_launch(d, "smem", 2, 1, 16, 0, SBK_LAMBDA(const sbk_thr &t) {
    sp[t.bx] = (unsigned char)t.smem[5];
    t.smem[5] = 0; /* the next block must not see this */
  });
  TU_CHECK(st == DT_OK && seen[0] == 0xA5 && seen[1] == 0xA5,
           "shared memory starts as 0xA5 in each block (saw %#x, %#x)", seen[0], seen[1]);
}

static void test_failures(dt_device *d, dt_ctx *ctx) {
  dt_status st = sbk_launch(d, "divergent", 1, 64, 0, SBK_SYNC, SBK_LAMBDA(const sbk_thr &t) {
    if (t.tx < 32) t.sync();
  });
  TU_CHECK(st == DT_ERR_INTERNAL && strstr(dt_last_error(ctx), "barrier"),
           "a barrier half the block skips -> %s: %s", dt_status_str(st), dt_last_error(ctx));
  st = sbk_launch(d, "stray", 1, 4, 0, 0, SBK_LAMBDA(const sbk_thr &t) { t.sync(); });
  TU_CHECK(st == DT_ERR_INTERNAL && strstr(dt_last_error(ctx), "SBK_SYNC"),
           "sync without SBK_SYNC -> %s: %s", dt_status_str(st), dt_last_error(ctx));
  st = sbk_launch(d, "big", 1, 1025, 0, 0, SBK_LAMBDA(const sbk_thr &) {});
  TU_CHECK(st == DT_ERR_INVALID, "a block of 1025 threads -> %s", dt_status_str(st));
  st = sbk_launch(d, "smem", 1, 32, SBK_MAX_SMEM + 1, 0, SBK_LAMBDA(const sbk_thr &) {});
  TU_CHECK(st == DT_ERR_INVALID, "48 KiB + 1 of shared memory -> %s", dt_status_str(st));
  st = sbk_launch(d, "empty", 0, 32, 0, 0, SBK_LAMBDA(const sbk_thr &) {});
  TU_CHECK(st == DT_ERR_INVALID, "a grid of 0 blocks -> %s", dt_status_str(st));
  dt_error_clear(ctx);
}

int main() {
  dt_ctx ctx;
  dt_ctx_init(&ctx, 0, 1);
  dt_device *d = NULL;
  TU_OK(&ctx, dt_device_cuda_emu_create(&ctx, &d));
  if (d) {
    test_coverage(d);
    test_barrier(d);
    test_shared_garbage(d);
    test_failures(d, &ctx);
    printf("emulator: coverage, barriers 1..1024, shared memory, 5 planted failures\n");
  }
  dt_device_destroy(d);
  dt_ctx_release(&ctx);
  return tu_finish("test_emu");
}
