// cuda_emu_sched.cpp: the checked state machine behind every barrier and warp
// collective, and the launcher. See cuda_emu.h for the model.
//
// A thread is running, at a barrier, in a warp collective, or exited; the last
// thread to arrive completes a barrier or collective for everyone. A state
// change that can never complete (a lane exits while a warp-mate waits for it,
// a thread exits while others wait at __syncthreads, ...) aborts at once with a
// message; if nothing runs and nothing can complete, the block is diagnosed.
// How a thread waits is the mode's business: cuda_emu_fibers.cpp switches back
// to the scheduler, cuda_emu_threads.cpp waits on a condition variable.
#include "cuda_emu_internal.h"

#include <algorithm>
#include <cstdarg>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/asan_interface.h>
#endif

extern "C" {
__thread blockc_emu::ThreadCtx* blockc_emu_tls __attribute__((tls_model("initial-exec")));
unsigned blockc_emu_block_serial = 1;  // from 1: SharedVar::block starts at 0, so each variable is filled
}

namespace blockc_emu {
namespace detail {

__thread Lane* t_lane __attribute__((tls_model("initial-exec")));

void fail(const Block& b, const char* fmt, ...) {
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

std::string thread_name(const Block& b, int i) {
  const uint3& t = b.lanes[i].ctx.thread_idx;
  char buf[96];
  std::snprintf(buf, sizeof buf, "thread (%u,%u,%u) [warp %d lane %d]", t.x, t.y, t.z, i / 32, i % 32);
  return buf;
}

namespace {

const char* const kOpNames[] = {
    "__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync",
    "__ballot_sync", "__syncwarp", "__match_any_sync", "__match_all_sync",
    "__reduce_add_sync", "__reduce_min_sync", "__reduce_max_sync", "__reduce_min_sync",
    "__reduce_max_sync", "__reduce_and_sync", "__reduce_or_sync", "__reduce_xor_sync",
};

std::string site(const char* file, int line) { return std::string(file) + ":" + std::to_string(line); }

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
      msg += "\n  " + thread_name(b, i) + " " + describe(b.lanes[i]);
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
             thread_name(b, j).c_str(), site(b.lanes[j].file, b.lanes[j].line).c_str(), thread_name(b, i).c_str());
  int base = i & ~31;
  for (int j = base; j < std::min(base + 32, b.n); ++j) {
    const Lane& o = b.lanes[j];
    if (j != i && o.state == kAtWarp && (o.mask >> (i & 31) & 1u))
      fail(b, "divergent warp: lane %d (%s) waits in %s(mask 0x%08x) at %s for lane %d (%s), which %s",
           j & 31, thread_name(b, j).c_str(), kOpNames[o.op], o.mask, site(o.file, o.line).c_str(), i & 31,
           thread_name(b, i).c_str(), describe(me).c_str());
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
               kOpNames[op], site(me.file, me.line).c_str(), l, thread_name(b, base + l).c_str(), src, mask);
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
  if (op == kSyncWarp) race_syncwarp(b, base, mask);
}

void after_blocking(Block& b) {
  if (b.running == 0 && b.exited < b.n) diagnose_stuck(b);
}

}  // namespace
}  // namespace detail

using namespace detail;

int sync_block(int kind, int pred, const char* file, int line) {
  Lane& me = *t_lane;
  Block& b = *me.block;
  Guard g = lock_block(b);
  if (b.exited > 0)
    for (int j = 0; j < b.n; ++j)
      if (b.lanes[j].state == kExited)
        fail(b, "barrier deadlock: %s waits at __syncthreads at %s, but %s has exited without reaching it",
             thread_name(b, int(&me - b.lanes.data())).c_str(), site(file, line).c_str(), thread_name(b, j).c_str());
  if (b.at_barrier > 0 && (b.bar_line != line || std::strcmp(b.bar_file, file) != 0))
    for (int j = 0; j < b.n; ++j)
      if (b.lanes[j].state == kAtBarrier)
        fail(b, "threads wait at different barriers: %s at __syncthreads at %s, %s at %s", thread_name(b, j).c_str(),
             site(b.bar_file, b.bar_line).c_str(), thread_name(b, int(&me - b.lanes.data())).c_str(), site(file, line).c_str());
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
    race_barrier(b);
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
         site(file, line).c_str(), mask, lane, thread_name(b, i).c_str());
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
           kOpNames[op], site(file, line).c_str(), lane, thread_name(b, i).c_str(), mask, l, b.n);
    const Lane& o = b.lanes[base + l];
    if (o.state == kRunning) { complete = false; continue; }
    bool same = o.state == kAtWarp && o.op == op && o.mask == mask &&
                (op == kSyncWarp || (o.line == line && std::strcmp(o.file, file) == 0));
    if (!same)
      fail(b, "divergent warp: lane %d (%s) waits in %s(mask 0x%08x) at %s for lane %d (%s), which %s",
           lane, thread_name(b, i).c_str(), kOpNames[op], mask, site(file, line).c_str(), l, thread_name(b, base + l).c_str(),
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
  fail(b, "%s at %s in %s", what, site(file, line).c_str(), thread_name(b, int(t_lane - b.lanes.data())).c_str());
}

// ---- running a launch ---------------------------------------------------------------
namespace detail {
namespace {

alignas(128) unsigned char g_dynamic_shared[kDynamicSharedCap];
std::mutex g_launch_mu;
std::mutex g_attr_mu;
std::unordered_map<const void*, int> g_max_dynamic_shared;

// Static __shared__ variables declared at file scope. A function's static: they
// are met while the library loads, perhaps before this file's globals are built.
std::vector<SharedVar*>& file_scope_shared() {
  static std::vector<SharedVar*> vars;
  return vars;
}

void fill(SharedVar& v) { std::memset(v.addr, 0xff, v.size); }

bool valid_config(dim3 grid, dim3 block) {
  unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
  const unsigned yz = (unsigned)max_grid_yz();
  return grid.x >= 1 && grid.y >= 1 && grid.z >= 1 && grid.x <= 0x7fffffffu && grid.y <= yz &&
         grid.z <= yz && block.x >= 1 && block.y >= 1 && block.z >= 1 && block.x <= 1024 &&
         block.y <= 1024 && block.z <= 64 && threads <= 1024;
}

}  // namespace

int max_grid_yz() {
  // A GPU's 65,535; BLOCKC_EMU_MAX_GRID_YZ lowers it so that a test crosses it with a few blocks.
  static const int limit = [] {
    const char* v = std::getenv("BLOCKC_EMU_MAX_GRID_YZ");
    const long n = v ? std::strtol(v, nullptr, 10) : 0;
    return n > 0 && n < 65535 ? (int)n : 65535;
  }();
  return limit;
}

size_t stack_bytes() {
  const char* kb = std::getenv("BLOCKC_EMU_STACK_KB");
  size_t n = kb ? std::strtoul(kb, nullptr, 10) * 1024 : 0;
#ifdef BLOCKC_EMU_THREADS
  return std::max<size_t>(n, 1024 * 1024);  // sanitizers grow frames
#else
  return std::max<size_t>(n ? n : 64 * 1024, 16 * 1024);
#endif
}

void start_block(Block& b, unsigned index) {
  b.index = index;
  const uint3 bid = make_uint3(index % b.grid.x, index / b.grid.x % b.grid.y, index / (b.grid.x * b.grid.y));
  for (Lane& l : b.lanes) {
    l.ctx.block_idx = bid;
    l.state = kRunning;
  }
  b.running = b.n;
  b.exited = b.at_barrier = b.bar_true = 0;
  ++blockc_emu_block_serial;  // block-scope static __shared__ variables are filled as threads enter them
  for (SharedVar* v : file_scope_shared()) fill(*v);
  race_block_start(b);
#ifdef __SANITIZE_ADDRESS__
  ASAN_UNPOISON_MEMORY_REGION(g_dynamic_shared, kDynamicSharedCap);
  size_t tail = (b.shmem + 7) & ~size_t(7);
  ASAN_POISON_MEMORY_REGION(g_dynamic_shared + tail, kDynamicSharedCap - tail);
#endif
  std::memset(g_dynamic_shared, 0xff, b.shmem);  // uninitialised reads show as NaN
}

void finish_thread(Lane& me) {
  Block& b = *me.block;
  Guard g = lock_block(b);
  me.state = kExited;
  ++b.exited;
  --b.running;
  check_not_awaited(b, int(&me - b.lanes.data()));
  if (b.exited == b.n) race_block_end(b);
  after_blocking(b);
}

}  // namespace detail

void enter_shared(SharedVar& v) {
  if (!t_lane) {  // at file scope, while the library loads
    file_scope_shared().push_back(&v);
    race_shared_var(v);
    fill(v);
    return;
  }
  Block& b = *t_lane->block;
  Guard g = lock_block(b);
  if (v.block == blockc_emu_block_serial) return;  // another thread of the block was first
  if (v.block == 0) race_shared_var(v);
  fill(v);
  __atomic_store_n(&v.block, blockc_emu_block_serial, __ATOMIC_RELEASE);
}

void set_max_dynamic_shared(const void* kernel, int bytes) {
  std::lock_guard<std::mutex> g(g_attr_mu);
  g_max_dynamic_shared[kernel] = bytes;
}

void launch_kernel(const char* name, const void* kernel, dim3 grid, dim3 block, size_t shmem,
                   cudaStream_t stream, Body body, void* closure, Keep keep) {
  // CUDA checks a launch's configuration when it is made, captured or not;
  // a failed launch invalidates the capture it was part of.
  if (!valid_config(grid, block)) {
    std::fprintf(stderr, "blockc-emu: launch of %s failed: invalid configuration grid (%u,%u,%u) block (%u,%u,%u)\n",
                 name, grid.x, grid.y, grid.z, block.x, block.y, block.z);
    record_error(cudaErrorInvalidConfiguration);
    if (capturing(stream)) invalidate_capture(stream);
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
    if (capturing(stream)) invalidate_capture(stream);
    return;
  }
  if (capturing(stream)) {
    capture_kernel(stream, name, kernel, grid, block, shmem, body, keep(closure));
    return;
  }
  run_kernel(name, grid, block, shmem, body, closure);
}

void run_kernel(const char* name, dim3 grid, dim3 block, size_t shmem, Body body, void* closure) {
  count(kKernelLaunches);
  std::lock_guard<std::mutex> serial(g_launch_mu);
  Block b;
  b.kernel = name;
  b.body = body;
  b.closure = closure;
  b.grid = grid;
  b.shmem = shmem;
  b.count = grid.x * grid.y * grid.z;
  b.n = int(block.x * block.y * block.z);
  b.lanes.resize(b.n);
  for (int i = 0; i < b.n; ++i) {
    Lane& l = b.lanes[i];
    l = Lane{};
    l.ctx.thread_idx = make_uint3(i % block.x, i / block.x % block.y, i / (block.x * block.y));
    l.ctx.block_dim = block;
    l.ctx.grid_dim = grid;
    l.ctx.linear = i;
    l.ctx.block = &b;
    l.block = &b;
  }
  race_launch(b);
  run_blocks(b);
}

}  // namespace blockc_emu

extern "C" void* blockc_emu_dynamic_shared(void) { return blockc_emu::detail::g_dynamic_shared; }
