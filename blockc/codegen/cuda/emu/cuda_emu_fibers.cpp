// cuda_emu_fibers.cpp: a block's threads as fibers on the calling OS thread
// (the default mode). A fiber runs until it waits at a barrier or warp
// collective, or exits; it then switches back to the scheduler, which resumes
// the next running fiber in thread order.
#ifndef BLOCKC_EMU_THREADS
#include "cuda_emu_internal.h"
#include "cuda_emu_switch.h"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <sys/mman.h>
#include <unistd.h>

namespace blockc_emu {
namespace detail {
namespace {

void* g_sched_sp;  // the scheduler's stack pointer while a fiber runs

struct Stack {
  char* base;  // the guard page; the usable stack follows it
  size_t size;
};
std::vector<Stack> g_stacks;  // reused by every launch
size_t g_page;
Block* g_running_block;

void fiber_main(Lane* me) {
  me->block->body(me->block->closure);
  finish_thread(*me);
  blockc_emu_switch(&me->sp, g_sched_sp);  // never resumed
}

void prepare_fiber(Lane& lane, const Stack& s) {
  lane.sp = blockc_emu_fiber_stack(s.base + g_page + s.size, fiber_main, &lane);
}

void ensure_stacks(int n) {
  g_page = (size_t)sysconf(_SC_PAGESIZE);
  size_t size = (stack_bytes() + g_page - 1) / g_page * g_page;
  if (!g_stacks.empty() && g_stacks[0].size != size) {
    for (const Stack& s : g_stacks) munmap(s.base, s.size + g_page);
    g_stacks.clear();
  }
  while ((int)g_stacks.size() < n) {
    void* p = mmap(nullptr, size + g_page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED || mprotect(p, g_page, PROT_NONE) != 0) {
      std::fprintf(stderr, "blockc-emu: cannot map %d fiber stacks\n", n);
      std::abort();
    }
    g_stacks.push_back({(char*)p, size});
  }
}

// A fault inside a kernel (SIGSEGV, SIGBUS, SIGFPE, SIGILL) names the thread; a
// fault in a guard page is a stack overflow (kernels are built with
// -fstack-clash-protection, so a big frame touches the guard page rather than
// jumping over it). The default action then runs, so the process still dies.
void on_fault(int sig, siginfo_t* info, void*) {
  char buf[512];
  int len = 0;
  Lane* me = t_lane;
  if (me && g_running_block) {
    Block& b = *g_running_block;
    int i = int(me - b.lanes.data());
    char* addr = (char*)info->si_addr;
    bool overflow = i >= 0 && i < (int)g_stacks.size() && addr >= g_stacks[i].base && addr < g_stacks[i].base + g_page;
    const ThreadCtx& c = me->ctx;
    len = std::snprintf(buf, sizeof buf,
                        "blockc-emu: error in kernel %s, block (%u,%u,%u): %s in thread (%u,%u,%u) [warp %d lane %d] "
                        "at address %p%s\n",
                        b.kernel, c.block_idx.x, c.block_idx.y, c.block_idx.z,
                        overflow ? "fiber stack overflow" : strsignal(sig), c.thread_idx.x, c.thread_idx.y,
                        c.thread_idx.z, i / 32, i % 32, (void*)addr, overflow ? " (raise BLOCKC_EMU_STACK_KB)" : "");
  }
  if (len > 0) (void)!write(2, buf, (size_t)std::min<int>(len, sizeof buf - 1));
  signal(sig, SIG_DFL);  // returning re-runs the fault, which now kills the process
}

void install_fault_handler() {
  static thread_local bool done = false;
  if (done) return;
  done = true;
  stack_t alt{};
  alt.ss_size = 64 * 1024;
  alt.ss_sp = std::malloc(alt.ss_size);
  sigaltstack(&alt, nullptr);
  struct sigaction sa {};
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL}) sigaction(sig, &sa, nullptr);
}

}  // namespace

void wait_running(Block&, Lane& me, Guard&) {
  while (me.state != kRunning) blockc_emu_switch(&me.sp, g_sched_sp);
}
void wake_warp(Block&, int) {}  // the scheduler finds running fibers itself
void wake_all(Block&) {}

void run_blocks(Block& b) {
  ensure_stacks(b.n);
  install_fault_handler();
  g_running_block = &b;
  for (unsigned index = 0; index < b.count; ++index) {
    start_block(b, index);
    for (int i = 0; i < b.n; ++i) prepare_fiber(b.lanes[i], g_stacks[i]);
    while (b.exited < b.n) {
      bool ran = false;
      for (Lane& l : b.lanes)
        if (l.state == kRunning) {
          ran = true;
          t_lane = &l;
          blockc_emu_tls = &l.ctx;
          blockc_emu_switch(&g_sched_sp, l.sp);
        }
      // Every transition checks for a stuck block, so this is only a backstop.
      if (!ran) fail(b, "no thread can make progress (scheduler backstop)");
    }
  }
  g_running_block = nullptr;
  t_lane = nullptr;
}

}  // namespace detail
}  // namespace blockc_emu
#endif  // !BLOCKC_EMU_THREADS
