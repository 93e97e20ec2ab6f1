// Measures what one CUDA-thread switch costs in the three ways an emulator can
// run a block's threads: the emulator's own fiber switch (included from
// blockc/codegen/cuda/emu/cuda_emu_switch.h, not copied),
// ucontext's swapcontext, and one OS thread per CUDA thread with a barrier.
// Each block has 256 threads that pass `kBarriers` __syncthreads-like barriers.
//
//   g++ -O2 -std=c++20 -pthread bench/emu_context_switch.cpp -o /tmp/emu_switch && /tmp/emu_switch
//
// The numbers it printed on the reference machine are in blockc/codegen/cuda/emu/cuda_emu.h.
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <ucontext.h>
#include <vector>

#include "../blockc/codegen/cuda/emu/cuda_emu_switch.h"

#ifndef BENCH_BLOCKS
#define BENCH_BLOCKS 40  // -DBENCH_BLOCKS=1: a quick run that shows the benchmark still builds and runs
#endif
static constexpr int kThreads = 256, kBarriers = 64, kBlocks = BENCH_BLOCKS;
static constexpr size_t kStack = 64 * 1024;

// --- the emulator's own fiber switch (cuda_emu_switch.h) ---------------------
struct Fib { void* sp; bool waiting; bool done; std::vector<char> stack; };
static Fib fibs[kThreads];
static void* sched_sp;
static int arrived;
static volatile float sink;

static void fiber_body(Fib* f) {
  float acc = 0;
  for (int b = 0; b < kBarriers; ++b) {
    acc += b;
    f->waiting = true;
    if (++arrived == kThreads) { arrived = 0; for (auto& g : fibs) g.waiting = false; }
    else blockc_emu_switch(&f->sp, sched_sp);
  }
  sink = acc;
  f->done = true;
  blockc_emu_switch(&f->sp, sched_sp);
}

static double run_fibers() {
  for (auto& f : fibs) f.stack.resize(kStack);
  auto t0 = std::chrono::steady_clock::now();
  for (int blk = 0; blk < kBlocks; ++blk) {
    for (auto& f : fibs) {
      f.sp = blockc_emu_fiber_stack(f.stack.data() + kStack, fiber_body, &f);
      f.waiting = false; f.done = false;
    }
    for (int live = kThreads; live;) {
      live = 0;
      for (auto& f : fibs)
        if (!f.done) { ++live; if (!f.waiting) blockc_emu_switch(&sched_sp, f.sp); }
    }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// --- swapcontext ------------------------------------------------------------
static ucontext_t uc_sched, uc[kThreads];
static bool uc_wait[kThreads], uc_done[kThreads];
static int uc_cur;
static void uc_body() {
  int me = uc_cur; float acc = 0;
  for (int b = 0; b < kBarriers; ++b) {
    acc += b; uc_wait[me] = true;
    if (++arrived == kThreads) { arrived = 0; for (bool& w : uc_wait) w = false; }
    else swapcontext(&uc[me], &uc_sched);
  }
  sink = acc; uc_done[me] = true;
  swapcontext(&uc[me], &uc_sched);
}
static double run_swapcontext() {
  std::vector<std::vector<char>> stacks(kThreads, std::vector<char>(kStack));
  auto t0 = std::chrono::steady_clock::now();
  for (int blk = 0; blk < kBlocks; ++blk) {
    for (int i = 0; i < kThreads; ++i) {
      getcontext(&uc[i]);
      uc[i].uc_stack.ss_sp = stacks[i].data(); uc[i].uc_stack.ss_size = kStack;
      uc[i].uc_link = nullptr; makecontext(&uc[i], uc_body, 0);
      uc_wait[i] = uc_done[i] = false;
    }
    for (int live = kThreads; live;) {
      live = 0;
      for (int i = 0; i < kThreads; ++i)
        if (!uc_done[i]) { ++live; if (!uc_wait[i]) { uc_cur = i; swapcontext(&uc_sched, &uc[i]); } }
    }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// --- one OS thread per CUDA thread -----------------------------------------
static double run_threads() {
  auto t0 = std::chrono::steady_clock::now();
  for (int blk = 0; blk < kBlocks; ++blk) {
    std::barrier bar(kThreads);
    std::vector<std::thread> ts;
    for (int i = 0; i < kThreads; ++i)
      ts.emplace_back([&] { float acc = 0; for (int b = 0; b < kBarriers; ++b) { acc += b; bar.arrive_and_wait(); } sink = acc; });
    for (auto& t : ts) t.join();
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int main() {
  const double waits = double(kBlocks) * kThreads * kBarriers;   // thread-barrier waits
  double f = run_fibers(), s = run_swapcontext(), t = run_threads();
  std::printf("%d blocks x %d threads x %d barriers\n", kBlocks, kThreads, kBarriers);
  std::printf("fiber switch : %7.1f ns per thread-barrier\n", f / waits * 1e9);
  std::printf("swapcontext  : %7.1f ns per thread-barrier (%.1fx fiber)\n", s / waits * 1e9, s / f);
  std::printf("OS threads   : %7.1f ns per thread-barrier (%.1fx fiber)\n", t / waits * 1e9, t / f);
}
