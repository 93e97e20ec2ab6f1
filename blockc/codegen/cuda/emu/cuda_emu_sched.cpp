// cuda_emu_sched.cpp: runs a launch's blocks, as fibers or as OS threads, and
// checks every barrier and warp collective. See cuda_emu.h for the model.
//
// Both modes share one state machine per block (Block/Lane below). A thread is
// running, at a barrier, in a warp collective, or exited; the last thread to
// arrive completes a barrier or collective for everyone. A state change that
// can never complete (a lane exits while a warp-mate waits for it, a thread
// exits while others wait at __syncthreads, ...) aborts at once with a message;
// if nothing is running and nothing can complete, the block is diagnosed too.
// The modes differ only in how a thread waits: a fiber switches back to the
// scheduler, an OS thread waits on the block's condition variable.
#include "cuda_emu.h"

#include <algorithm>
#include <memory>
#include <csignal>
#include <cstdarg>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#ifdef BLOCKC_EMU_THREADS
#include <condition_variable>
#elif defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#error "sanitizers do not understand fiber stacks: build with -DBLOCKC_EMU_THREADS"
#endif
#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/asan_interface.h>
#endif

extern "C" {
__thread blockc_emu::ThreadCtx* blockc_emu_tls __attribute__((tls_model("initial-exec")));
}

namespace blockc_emu {
namespace {

enum State : int { kRunning, kAtBarrier, kAtWarp, kExited };

const char* const kOpNames[] = {
    "__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync",
    "__ballot_sync", "__syncwarp", "__match_any_sync", "__match_all_sync",
    "__reduce_add_sync", "__reduce_min_sync", "__reduce_max_sync", "__reduce_min_sync",
    "__reduce_max_sync", "__reduce_and_sync", "__reduce_or_sync", "__reduce_xor_sync",
};

struct Block;
struct Lane {
  ThreadCtx ctx;
  Block* block;
  int state;
  int op, arg, width;  // the pending warp collective
  unsigned mask;
  uint64_t value, result;
  const char* file;  // call site of the pending barrier or collective
  int line;
  void* sp;  // fiber mode: saved stack pointer
};

struct Block {
  const char* kernel;
  std::vector<Lane> lanes;
  int n = 0, running = 0, exited = 0, at_barrier = 0, bar_true = 0;
  const char* bar_file = nullptr;  // call site of the barrier now filling
  int bar_line = 0;
#ifdef BLOCKC_EMU_THREADS
  std::mutex mu;
  std::unique_ptr<std::condition_variable[]> warp_cv;  // one per warp: wake only the lanes concerned
#endif
};

__thread Lane* t_lane;  // the thread (fiber or OS) now running

std::string site(const char* file, int line) { return std::string(file) + ":" + std::to_string(line); }

std::string who(const Block& b, int i) {
  const uint3& t = b.lanes[i].ctx.thread_idx;
  char buf[96];
  std::snprintf(buf, sizeof buf, "thread (%u,%u,%u) [warp %d lane %d]", t.x, t.y, t.z, i / 32, i % 32);
  return buf;
}

[[noreturn]] void fail(const Block& b, const char* fmt, ...) {
  const ThreadCtx& c = b.lanes[0].ctx;
  std::fprintf(stderr, "blockc-emu: error in kernel %s, block (%u,%u,%u) of grid (%u,%u,%u), blockDim (%u,%u,%u): ",
               b.kernel, c.block_idx.x, c.block_idx.y, c.block_idx.z, c.grid_dim.x, c.grid_dim.y,
               c.grid_dim.z, c.block_dim.x, c.block_dim.y, c.block_dim.z);
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
  std::fputc('\n', stderr);
  std::fflush(stderr);
  std::abort();
}

std::string describe(const Lane& l) {
  switch (l.state) {
    case kExited: return "has exited";
    case kAtBarrier: return "waits at __syncthreads at " + site(l.file, l.line);
    case kAtWarp: {
      char m[16];
      std::snprintf(m, sizeof m, "0x%08x", l.mask);
      return std::string("waits in ") + kOpNames[l.op] + "(mask " + m + ") at " + site(l.file, l.line);
    }
    default: return "is running";
  }
}

// Nothing runs and nothing completes: name every waiting thread.
[[noreturn]] void diagnose_stuck(const Block& b) {
  std::string msg = "no thread can make progress (deadlock):";
  int shown = 0;
  for (int i = 0; i < b.n && shown < 8; ++i)
    if (b.lanes[i].state != kExited) {
      msg += "\n  " + who(b, i) + " " + describe(b.lanes[i]);
      ++shown;
    }
  fail(b, "%s", msg.c_str());
}

// A thread that can no longer reach anything may not leave others waiting on it.
void check_not_awaited(Block& b, int i) {
  const Lane& me = b.lanes[i];
  if (me.state == kExited && b.at_barrier > 0)
    for (int j = 0; j < b.n; ++j)
      if (b.lanes[j].state == kAtBarrier)
        fail(b, "barrier deadlock: %s waits at __syncthreads at %s, but %s has exited without reaching it",
             who(b, j).c_str(), site(b.lanes[j].file, b.lanes[j].line).c_str(), who(b, i).c_str());
  int base = i & ~31;
  for (int j = base; j < std::min(base + 32, b.n); ++j) {
    const Lane& o = b.lanes[j];
    if (j != i && o.state == kAtWarp && (o.mask >> (i & 31) & 1u))
      fail(b, "divergent warp: lane %d (%s) waits in %s(mask 0x%08x) at %s for lane %d (%s), which %s",
           j & 31, who(b, j).c_str(), kOpNames[o.op], o.mask, site(o.file, o.line).c_str(), i & 31,
           who(b, i).c_str(), describe(me).c_str());
  }
}

// PTX shfl.sync: the lane that `lane` reads, or itself when out of its segment.
int shuffle_source(int op, int lane, int arg, int width) {
  int seg_lo = lane & ~(width - 1), seg_hi = seg_lo | (width - 1), b = arg & 31, j = lane;
  switch (op) {
    case kShflIdx: j = seg_lo | (b & (width - 1)); break;
    case kShflUp: j = lane - b; if (j < seg_lo) j = lane; break;
    case kShflDown: j = lane + b; if (j > seg_hi) j = lane; break;
    case kShflXor: j = lane ^ b; if (j > seg_hi) j = lane; break;
  }
  return j;
}

void complete_collective(Block& b, int base, unsigned mask, int op) {
  int lo = __builtin_ctz(mask);
  uint64_t first = b.lanes[base + lo].value, acc = op == kBallot ? 0 : first;
  bool all_equal = true;
  for (int l = lo; l < 32; ++l) {
    if (!(mask >> l & 1u)) continue;
    uint64_t v = b.lanes[base + l].value;
    all_equal = all_equal && v == first;
    if (op == kBallot) {
      if (v) acc |= 1ull << l;
      continue;
    }
    if (l == lo) continue;
    switch (op) {
      case kReduceAddU: acc = (uint32_t)(acc + v); break;
      case kReduceMinU: acc = std::min<uint32_t>((uint32_t)acc, (uint32_t)v); break;
      case kReduceMaxU: acc = std::max<uint32_t>((uint32_t)acc, (uint32_t)v); break;
      case kReduceMinS: acc = (uint32_t)std::min<int32_t>((int32_t)acc, (int32_t)v); break;
      case kReduceMaxS: acc = (uint32_t)std::max<int32_t>((int32_t)acc, (int32_t)v); break;
      case kReduceAnd: acc &= v; break;
      case kReduceOr: acc |= v; break;
      case kReduceXor: acc ^= v; break;
    }
  }
  for (int l = 0; l < 32; ++l) {
    if (!(mask >> l & 1u)) continue;
    Lane& me = b.lanes[base + l];
    switch (op) {
      case kShflIdx: case kShflUp: case kShflDown: case kShflXor: {
        int src = shuffle_source(op, l, me.arg, me.width);
        if (!(mask >> src & 1u))
          fail(b, "%s at %s: lane %d (%s) reads lane %d, which is not in mask 0x%08x",
               kOpNames[op], site(me.file, me.line).c_str(), l, who(b, base + l).c_str(), src, mask);
        me.result = b.lanes[base + src].value;
        break;
      }
      case kSyncWarp: me.result = 0; break;
      case kMatchAny: {
        uint64_t m = 0;
        for (int k = 0; k < 32; ++k)
          if ((mask >> k & 1u) && b.lanes[base + k].value == me.value) m |= 1ull << k;
        me.result = m;
        break;
      }
      case kMatchAll: me.result = all_equal ? mask : 0; break;
      default: me.result = acc; break;
    }
    me.state = kRunning;
  }
  b.running += __builtin_popcount(mask);
}

// ---- how a thread waits: the only difference between the two modes --------------
#ifdef BLOCKC_EMU_THREADS
using Guard = std::unique_lock<std::mutex>;
Guard lock_block(Block& b) { return Guard(b.mu); }
void wake_warp(Block& b, int warp) { b.warp_cv[warp].notify_all(); }
void wake_all(Block& b) {
  for (int w = 0; w < (b.n + 31) / 32; ++w) wake_warp(b, w);
}
void wait_running(Block& b, Lane& me, Guard& g) {
  b.warp_cv[int(&me - b.lanes.data()) / 32].wait(g, [&] { return me.state == kRunning; });
}
#else
struct Guard {};
Guard lock_block(Block&) { return {}; }
void wake_warp(Block&, int) {}
void wake_all(Block&) {}
void* g_sched_sp;  // the scheduler's stack pointer while a fiber runs
extern "C" void blockc_emu_switch(void** save_sp, void* load_sp);
void wait_running(Block&, Lane& me, Guard&) {
  while (me.state != kRunning) blockc_emu_switch(&me.sp, g_sched_sp);
}
#endif

void after_blocking(Block& b) {
  if (b.running == 0 && b.exited < b.n) diagnose_stuck(b);
}

}  // namespace

int sync_block(int kind, int pred, const char* file, int line) {
  Lane& me = *t_lane;
  Block& b = *me.block;
  Guard g = lock_block(b);
  if (b.exited > 0)
    for (int j = 0; j < b.n; ++j)
      if (b.lanes[j].state == kExited)
        fail(b, "barrier deadlock: %s waits at __syncthreads at %s, but %s has exited without reaching it",
             who(b, int(&me - b.lanes.data())).c_str(), site(file, line).c_str(), who(b, j).c_str());
  if (b.at_barrier > 0 && (b.bar_line != line || std::strcmp(b.bar_file, file) != 0))
    for (int j = 0; j < b.n; ++j)
      if (b.lanes[j].state == kAtBarrier)
        fail(b, "threads wait at different barriers: %s at __syncthreads at %s, %s at %s", who(b, j).c_str(),
             site(b.bar_file, b.bar_line).c_str(), who(b, int(&me - b.lanes.data())).c_str(), site(file, line).c_str());
  if (b.at_barrier == 0) {
    b.bar_file = file;
    b.bar_line = line;
  }
  me.state = kAtBarrier;
  me.file = file;
  me.line = line;
  ++b.at_barrier;
  --b.running;
  b.bar_true += pred != 0;
  check_not_awaited(b, int(&me - b.lanes.data()));
  if (b.at_barrier == b.n) {
    int r = kind == 1 ? b.bar_true : kind == 2 ? b.bar_true == b.n : kind == 3 ? b.bar_true > 0 : 0;
    for (Lane& l : b.lanes) {
      l.state = kRunning;
      l.result = (uint64_t)r;
    }
    b.running = b.n;
    b.at_barrier = b.bar_true = 0;
    wake_all(b);
    return r;
  }
  after_blocking(b);
  wait_running(b, me, g);
  return (int)me.result;
}

uint64_t warp_collective(int op, unsigned mask, uint64_t value, int arg, int width, const char* file, int line) {
  Lane& me = *t_lane;
  Block& b = *me.block;
  Guard g = lock_block(b);
  int i = int(&me - b.lanes.data()), base = i & ~31, lane = i & 31;
  if (!(mask >> lane & 1u))
    fail(b, "%s at %s: mask 0x%08x does not name the calling lane %d (%s)", kOpNames[op],
         site(file, line).c_str(), mask, lane, who(b, i).c_str());
  if (width < 1 || width > 32 || (width & (width - 1)))
    fail(b, "%s at %s: width %d is not a power of two in [1, 32]", kOpNames[op], site(file, line).c_str(), width);
  me.state = kAtWarp;
  me.op = op;
  me.mask = mask;
  me.arg = arg;
  me.width = width;
  me.value = value;
  me.file = file;
  me.line = line;
  --b.running;
  bool complete = true;
  for (int l = 0; l < 32; ++l) {
    if (!(mask >> l & 1u) || l == lane) continue;
    if (base + l >= b.n)
      fail(b, "%s at %s by lane %d (%s): mask 0x%08x names lane %d, which does not exist (the block has %d threads)",
           kOpNames[op], site(file, line).c_str(), lane, who(b, i).c_str(), mask, l, b.n);
    const Lane& o = b.lanes[base + l];
    if (o.state == kRunning) { complete = false; continue; }
    bool same = o.state == kAtWarp && o.op == op && o.mask == mask &&
                (op == kSyncWarp || (o.line == line && std::strcmp(o.file, file) == 0));
    if (!same)
      fail(b, "divergent warp: lane %d (%s) waits in %s(mask 0x%08x) at %s for lane %d (%s), which %s",
           lane, who(b, i).c_str(), kOpNames[op], mask, site(file, line).c_str(), l, who(b, base + l).c_str(),
           describe(o).c_str());
  }
  if (complete) {
    complete_collective(b, base, mask, op);
    wake_warp(b, base / 32);
    return me.result;
  }
  after_blocking(b);
  wait_running(b, me, g);
  return me.result;
}

unsigned active_mask() {
  Lane& me = *t_lane;
  Block& b = *me.block;
  Guard g = lock_block(b);
  int base = int(&me - b.lanes.data()) & ~31;
  unsigned m = 0;
  for (int l = 0; l < 32 && base + l < b.n; ++l)
    if (b.lanes[base + l].state != kExited) m |= 1u << l;
  return m;
}

void trap(const char* what, const char* file, int line) {
  Block& b = *t_lane->block;
  fail(b, "%s at %s in %s", what, site(file, line).c_str(), who(b, int(t_lane - b.lanes.data())).c_str());
}

// ---- running a launch ---------------------------------------------------------------
namespace {

constexpr size_t kDynamicSharedCap = 256 * 1024;
alignas(128) unsigned char g_dynamic_shared[kDynamicSharedCap];
std::mutex g_launch_mu;
std::mutex g_attr_mu;
std::unordered_map<const void*, int> g_max_dynamic_shared;
Body g_body;
void* g_closure;

size_t stack_bytes() {
  const char* kb = std::getenv("BLOCKC_EMU_STACK_KB");
  size_t n = kb ? std::strtoul(kb, nullptr, 10) * 1024 : 0;
#ifdef BLOCKC_EMU_THREADS
  return std::max<size_t>(n, 1024 * 1024);  // sanitizers grow frames
#else
  return std::max<size_t>(n ? n : 64 * 1024, 16 * 1024);
#endif
}

void finish_thread(Lane& me) {
  Block& b = *me.block;
  Guard g = lock_block(b);
  me.state = kExited;
  ++b.exited;
  --b.running;
  check_not_awaited(b, int(&me - b.lanes.data()));
  after_blocking(b);
}

#ifdef BLOCKC_EMU_THREADS
void* thread_main(void* arg) {
  Lane& me = *static_cast<Lane*>(arg);
  t_lane = &me;
  blockc_emu_tls = &me.ctx;
  g_body(g_closure);
  finish_thread(me);
  return nullptr;
}

void run_block(Block& b) {
  b.warp_cv.reset(new std::condition_variable[(b.n + 31) / 32]);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, stack_bytes());
  std::vector<pthread_t> ids(b.n);
  for (int i = 0; i < b.n; ++i)
    if (pthread_create(&ids[i], &attr, thread_main, &b.lanes[i]) != 0) {
      std::fprintf(stderr, "blockc-emu: cannot create thread %d of %d\n", i, b.n);
      std::abort();
    }
  for (pthread_t id : ids) pthread_join(id, nullptr);
  pthread_attr_destroy(&attr);
}
#else
// Saves the callee-saved registers, MXCSR and the x87 control word on the old
// stack, swaps rsp, restores them from the new one. A new fiber's stack is laid
// out as if it had called blockc_emu_switch; its "return" lands in
// blockc_emu_fiber_start, which calls r13(r12) with an aligned stack.
asm(R"(
    .text
    .p2align 4
    .globl blockc_emu_switch
    .hidden blockc_emu_switch
    .type blockc_emu_switch,@function
blockc_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size blockc_emu_switch,.-blockc_emu_switch
    .globl blockc_emu_fiber_start
    .hidden blockc_emu_fiber_start
    .type blockc_emu_fiber_start,@function
blockc_emu_fiber_start:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size blockc_emu_fiber_start,.-blockc_emu_fiber_start
)");
extern "C" void blockc_emu_fiber_start();

struct Stack {
  char* base;  // the guard page; the usable stack follows it
  size_t size;
};
std::vector<Stack> g_stacks;
size_t g_page;

void fiber_main(Lane* me) {
  g_body(g_closure);
  finish_thread(*me);
  blockc_emu_switch(&me->sp, g_sched_sp);  // never resumed
}

void prepare_fiber(Lane& lane, const Stack& s) {
  unsigned ctrl[2];
  asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(ctrl[0]), "=m"(ctrl[1]));
  uintptr_t top = (uintptr_t)(s.base + g_page + s.size) & ~(uintptr_t)15;
  void** sp = (void**)top;
  *--sp = (void*)blockc_emu_fiber_start;  // "return" address: rsp is 16-aligned after it
  *--sp = nullptr;                        // rbp
  *--sp = nullptr;                        // rbx
  *--sp = &lane;                          // r12: the argument
  *--sp = (void*)fiber_main;              // r13: the function
  *--sp = nullptr;                        // r14
  *--sp = nullptr;                        // r15
  --sp;
  std::memcpy(sp, ctrl, 4);               // MXCSR
  std::memcpy((char*)sp + 4, &ctrl[1], 2);  // x87 control word
  lane.sp = sp;
}

void ensure_stacks(int n) {
  g_page = (size_t)sysconf(_SC_PAGESIZE);
  size_t size = (stack_bytes() + g_page - 1) / g_page * g_page;
  if (!g_stacks.empty() && g_stacks[0].size != size) g_stacks.clear();  // leaked: rare, bounded
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
Block* g_running_block;
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
                        "blockc-emu: error in kernel %s, block (%u,%u,%u): %s in thread (%u,%u,%u) [warp %d lane %d] at address %p%s\n",
                        b.kernel, c.block_idx.x, c.block_idx.y, c.block_idx.z,
                        overflow ? "fiber stack overflow" : strsignal(sig),
                        c.thread_idx.x, c.thread_idx.y, c.thread_idx.z, i / 32, i % 32, (void*)addr,
                        overflow ? " (raise BLOCKC_EMU_STACK_KB)" : "");
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
  struct sigaction sa{};
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL}) sigaction(sig, &sa, nullptr);
}

void run_block(Block& b) {
  for (int i = 0; i < b.n; ++i) prepare_fiber(b.lanes[i], g_stacks[i]);
  g_running_block = &b;
  while (b.exited < b.n) {
    bool ran = false;
    for (Lane& l : b.lanes)
      if (l.state == kRunning) {
        ran = true;
        t_lane = &l;
        blockc_emu_tls = &l.ctx;
        blockc_emu_switch(&g_sched_sp, l.sp);
      }
    if (!ran) diagnose_stuck(b);
  }
  g_running_block = nullptr;
  t_lane = nullptr;
}
#endif

bool valid_config(dim3 grid, dim3 block) {
  unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
  return grid.x >= 1 && grid.y >= 1 && grid.z >= 1 && grid.x <= 0x7fffffffu && grid.y <= 65535 &&
         grid.z <= 65535 && block.x >= 1 && block.y >= 1 && block.z >= 1 && block.x <= 1024 &&
         block.y <= 1024 && block.z <= 64 && threads <= 1024;
}

}  // namespace

void set_max_dynamic_shared(const void* kernel, int bytes) {
  std::lock_guard<std::mutex> g(g_attr_mu);
  g_max_dynamic_shared[kernel] = bytes;
}

void launch_kernel(const char* name, const void* kernel, dim3 grid, dim3 block, size_t shmem,
                   cudaStream_t, Body body, void* closure) {
  if (!valid_config(grid, block)) {
    std::fprintf(stderr, "blockc-emu: launch of %s failed: invalid configuration grid (%u,%u,%u) block (%u,%u,%u)\n",
                 name, grid.x, grid.y, grid.z, block.x, block.y, block.z);
    record_error(cudaErrorInvalidConfiguration);
    return;
  }
  size_t limit = 48 * 1024;
  {
    std::lock_guard<std::mutex> g(g_attr_mu);
    auto it = g_max_dynamic_shared.find(kernel);
    if (it != g_max_dynamic_shared.end()) limit = std::max<size_t>(limit, (size_t)it->second);
  }
  if (shmem > limit || shmem > kDynamicSharedCap) {
    std::fprintf(stderr, "blockc-emu: launch of %s failed: %zu bytes of dynamic shared memory exceed the %zu allowed "
                 "(cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize) raises it)\n", name, shmem, limit);
    record_error(cudaErrorInvalidValue);
    return;
  }
  std::lock_guard<std::mutex> serial(g_launch_mu);
  g_body = body;
  g_closure = closure;
  int n = int(block.x * block.y * block.z);
#ifndef BLOCKC_EMU_THREADS
  ensure_stacks(n);
  install_fault_handler();
#endif
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        Block b;
        b.kernel = name;
        b.n = b.running = n;
        b.lanes.resize(n);
        for (int i = 0; i < n; ++i) {
          Lane& l = b.lanes[i];
          l = Lane{};
          l.ctx.thread_idx = make_uint3(i % block.x, i / block.x % block.y, i / (block.x * block.y));
          l.ctx.block_idx = make_uint3(bx, by, bz);
          l.ctx.block_dim = block;
          l.ctx.grid_dim = grid;
          l.ctx.linear = i;
          l.ctx.block = &b;
          l.block = &b;
          l.state = kRunning;
        }
#ifdef __SANITIZE_ADDRESS__
        ASAN_UNPOISON_MEMORY_REGION(g_dynamic_shared, kDynamicSharedCap);
        size_t tail = (shmem + 7) & ~size_t(7);
        ASAN_POISON_MEMORY_REGION(g_dynamic_shared + tail, kDynamicSharedCap - tail);
#endif
        std::memset(g_dynamic_shared, 0xff, shmem);  // uninitialised reads show as NaN
        run_block(b);
      }
}

}  // namespace blockc_emu

extern "C" void* blockc_emu_dynamic_shared(void) { return blockc_emu::g_dynamic_shared; }
