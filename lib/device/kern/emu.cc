/* lib/device/kern/emu.cc: runs sbk.cuh kernels on the host (the "cuda-emu" device).
 *
 * Blocks run one after another. A kernel launched without SBK_SYNC runs each
 * thread to completion in turn on the caller's stack. With SBK_SYNC every thread
 * of a block is a fiber with its own stack (a register switch on x86-64,
 * ucontext elsewhere): the scheduler resumes each
 * live fiber in thread order until it reaches t.sync() or returns, and repeats
 * until all have returned, so a barrier releases only when every thread has
 * arrived, as __syncthreads does. A round in which some threads returned while
 * others wait at a barrier is a divergent barrier (undefined on the GPU): the
 * launch fails with that message. The launch limits are CUDA's defaults.
 * Shared memory starts filled with 0xA5 bytes in every block, so a kernel that
 * reads it before writing sees garbage here too. Nothing here is global: the
 * state of a launch lives on the launching thread's stack and heap.
 */
#include "config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>

#define SB_KERN_EMU 1
#include "device/kern/sbk.cuh"

namespace {

enum { FIBER_STACK = 64 * 1024 };
enum fstate { F_READY, F_BARRIER, F_DONE };

struct block;

#if defined(__x86_64__) && !defined(SBK_EMU_UCONTEXT)
/* A fiber switch is a few instructions here: glibc's swapcontext also saves
 * the signal mask with a system call, which made a row kernel of 512 blocks of
 * 256 threads take seconds. sbk_ctx_switch saves the callee-saved registers
 * (System V AMD64 ABI: rbx, rbp, r12-r15) on the current stack, stores its
 * stack pointer in *from, and resumes the fiber whose stack pointer is `to`.
 * A new fiber's stack holds six register slots (rbx = the fiber, r12 = its C
 * entry) and the address of sbk_fiber_start, which calls entry(fiber). */
extern "C" void sbk_ctx_switch(void **from, void *to);
extern "C" void sbk_fiber_start(void);
__asm__(".text\n"
        ".p2align 4\n"
        ".globl sbk_ctx_switch\n"
        ".hidden sbk_ctx_switch\n"
        ".type sbk_ctx_switch,@function\n"
        "sbk_ctx_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size sbk_ctx_switch, .-sbk_ctx_switch\n"
        ".p2align 4\n"
        ".globl sbk_fiber_start\n"
        ".hidden sbk_fiber_start\n"
        ".type sbk_fiber_start,@function\n"
        "sbk_fiber_start:\n"
        "  movq %rbx, %rdi\n"
        "  call *%r12\n"
        "  ud2\n"
        ".size sbk_fiber_start, .-sbk_fiber_start\n"
        ".section .note.GNU-stack,\"\",@progbits\n"
        ".text\n");

typedef void *fctx;
struct fiber {
  fctx ctx;
  sbk_thr t;
  fstate state;
};
static void fiber_main(fiber *fb);
/* Stack top 16-byte aligned; after the `ret` into sbk_fiber_start the stack
 * pointer is that top, so its `call` enters fiber_main aligned as the ABI wants. */
void make_fiber(fiber *fb, char *stack, block *) {
  uintptr_t top = ((uintptr_t)stack + FIBER_STACK) & ~(uintptr_t)15;
  void **sp = (void **)top;
  *--sp = (void *)sbk_fiber_start;
  *--sp = NULL;                     /* rbp */
  *--sp = (void *)fb;               /* rbx */
  *--sp = (void *)fiber_main;       /* r12 */
  *--sp = NULL;                     /* r13 */
  *--sp = NULL;                     /* r14 */
  *--sp = NULL;                     /* r15 */
  fb->ctx = (void *)sp;
}
inline void switch_ctx(fctx *from, fctx *to) { sbk_ctx_switch(from, *to); }
#else
/* Portable fibers: ucontext (slower: swapcontext saves the signal mask). */
typedef ucontext_t fctx;
struct fiber {
  fctx ctx;
  sbk_thr t;
  fstate state;
};
static void fiber_main(fiber *fb);
void trampoline(unsigned lo, unsigned hi) {
  fiber_main((fiber *)(((uintptr_t)hi << 32) | (uintptr_t)lo));
}
/* getcontext returns twice, so it sits in a function of its own (no locals of
 * the scheduler's to clobber). */
__attribute__((noinline)) void make_fiber(fiber *fb, char *stack, block *);
inline void switch_ctx(fctx *from, fctx *to) { swapcontext(from, to); }
#endif

struct block {
  fctx main;
  fiber *cur;          /* NULL: threads run without fibers (no SBK_SYNC) */
  void (*call)(const void *, const sbk_thr *);
  const void *f;
  bool stray_sync;     /* t.sync() in a kernel launched without SBK_SYNC */
};

#if !defined(__x86_64__) || defined(SBK_EMU_UCONTEXT)
__attribute__((noinline)) void make_fiber(fiber *fb, char *stack, block *b) {
  getcontext(&fb->ctx);
  fb->ctx.uc_stack.ss_sp = stack;
  fb->ctx.uc_stack.ss_size = FIBER_STACK;
  fb->ctx.uc_link = &b->main;
  uintptr_t p = (uintptr_t)fb;
  makecontext(&fb->ctx, (void (*)())trampoline, 2, (unsigned)(p & 0xffffffffu),
              (unsigned)(p >> 32));
}
#endif

/* A fiber's life: the kernel body, then back to the scheduler for good. */
static void fiber_main(fiber *fb) {
  block *b = (block *)fb->t.blk;
  b->call(b->f, &fb->t);
  fb->state = F_DONE;
  switch_ctx(&fb->ctx, &b->main); /* never resumed */
}

} // namespace

extern "C" void sbk_emu_sync(const sbk_thr *t) {
  block *b = (block *)t->blk;
  if (!b->cur) {
    b->stray_sync = true;
    return;
  }
  fiber *fb = b->cur;
  fb->state = F_BARRIER;
  switch_ctx(&fb->ctx, &b->main);
}

extern "C" dt_status sbk_emu_run(dt_device *d, const char *name, int64_t grid, int nthr,
                                 size_t smem, int flags,
                                 void (*call)(const void *f, const sbk_thr *t), const void *f) {
  if (grid <= 0 || grid > INT_MAX || nthr <= 0 || nthr > SBK_MAX_BLOCK || smem > SBK_MAX_SMEM)
    return dt_error(d->ctx, DT_ERR_INVALID, name, "launch <<<%lld, %d, %zu>>> out of range",
                    (long long)grid, nthr, smem);
  char *sm = (char *)malloc(smem ? smem : 1);
  if (!sm) return dt_error(d->ctx, DT_ERR_NOMEM, name, "no memory for shared memory");
  block b;
  memset(&b, 0, sizeof b);
  b.call = call;
  b.f = f;
  dt_status st = DT_OK;
  fiber *fib = NULL;
  char *stacks = NULL;
  size_t stack_bytes = (size_t)nthr * FIBER_STACK;
  if (flags & SBK_SYNC) {
    fib = (fiber *)calloc((size_t)nthr, sizeof *fib);
    void *m = mmap(NULL, stack_bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    stacks = m == MAP_FAILED ? NULL : (char *)m;
    if (!fib || !stacks) {
      st = dt_error(d->ctx, DT_ERR_NOMEM, name, "no memory for %d fibers", nthr);
      goto out;
    }
  }
  for (int64_t bx = 0; bx < grid && st == DT_OK; bx++) {
    memset(sm, 0xA5, smem ? smem : 1);
    if (!(flags & SBK_SYNC)) {
      sbk_thr t = {0, (int)bx, nthr, (int)grid, sm, &b};
      for (int tx = 0; tx < nthr; tx++) {
        t.tx = tx;
        call(f, &t);
      }
      if (b.stray_sync)
        st = dt_error(d->ctx, DT_ERR_INTERNAL, name,
                      "the kernel calls sync() but was launched without SBK_SYNC");
      continue;
    }
    for (int tx = 0; tx < nthr; tx++) {
      fiber *fb = &fib[tx];
      fb->t = sbk_thr{tx, (int)bx, nthr, (int)grid, sm, &b};
      fb->state = F_READY;
      make_fiber(fb, stacks + (size_t)tx * FIBER_STACK, &b);
    }
    for (;;) {
      int done = 0, waiting = 0;
      for (int tx = 0; tx < nthr; tx++) {
        fiber *fb = &fib[tx];
        if (fb->state == F_DONE) continue;
        fb->state = F_READY;
        b.cur = fb;
        switch_ctx(&b.main, &fb->ctx);
        b.cur = NULL;
      }
      for (int tx = 0; tx < nthr; tx++) {
        if (fib[tx].state == F_DONE) done++;
        else waiting++;
      }
      if (waiting == 0) break;
      if (done > 0) {
        st = dt_error(d->ctx, DT_ERR_INTERNAL, name,
                      "block %lld: %d threads returned while %d wait at a barrier",
                      (long long)bx, done, waiting);
        break; /* the waiting fibers are abandoned with their stacks */
      }
    }
  }
out:
  if (stacks) munmap(stacks, stack_bytes);
  free(fib);
  free(sm);
  return st;
}
