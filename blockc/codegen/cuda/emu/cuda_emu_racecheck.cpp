// cuda_emu_racecheck.cpp: a shared-memory race checker in the spirit of
// compute-sanitizer's racecheck and initcheck.
//
// With -DBLOCKC_EMU_RACECHECK (toolchain.compile_emulated's default without a
// sanitizer), the kernel sources are compiled with g++'s -fsanitize=thread, which calls
// __tsan_read4(addr), __tsan_write8(addr), ... before every load and store;
// this file defines those functions instead of linking ThreadSanitizer. An
// address outside shared memory returns at once. For each byte of shared
// memory the checker keeps the last write (thread, barrier epoch, that
// thread's warp clock, code address) and the reads since, and aborts, naming
// kernel, block, threads, variable, offsets and source lines, when
//   * two threads access a byte, at least one writing, in the same barrier
//     epoch (no __syncthreads() between them) and, within a warp, with no
//     __syncwarp() naming both between them. Only these two order memory:
//     CUDA's programming guide promises ordering for __syncwarp ("threads
//     within a warp that wish to communicate via memory can store to memory,
//     execute __syncwarp(), and then safely read") and not for shuffles,
//     votes, matches or reductions, and since Volta a warp's lanes are not
//     lockstep. Atomics do not race with atomics;
//   * a thread reads a byte that no thread of its block has written. This is
//     judged at the end of the barrier epoch: in fiber mode thread 0 runs first,
//     so a read that a later thread's write races with is reported as that race;
//   * an access falls outside the launch's dynamic shared memory.
// Whether a race is found does not depend on the schedule, as both accesses
// happen in any order; which pair is named, and as which hazard, may.
//
// Cost, on the 2-core VM of cuda_emu.h's figures: a checked access takes ~10 ns
// (two calls, a compare, one 48-byte Cell per 4-byte granule touched), any other
// access a call and a compare. A float32 GPT-2 layer (d_model 256, 128 tokens)
// runs 3.3x slower, nearly all of it in its tiled GEMMs, which read shared
// memory once per two multiply-adds; compiling takes ~10% longer. The tests
// under tests/codegen/cuda took about a quarter more CPU time (262 s before).
// Warp clocks are vector clocks over a warp's 32 lanes, joined at __syncwarp.
// The reads of a byte since its last write are kept as their warp, lanes and
// latest clock, so lanes whose clocks drifted apart under partial-mask
// __syncwarp may be reported where a per-lane record would not.
//
// Not seen: accesses in code compiled without the flag (none in generated
// kernels), memcpy/memset calls that g++ does not expand inline, and a static
// __shared__ declaration toolchain.rewrite_shared cannot parse (two names in
// one declaration): such a variable is neither filled (cuda_emu.h) nor checked.
#include "cuda_emu_internal.h"

#ifndef BLOCKC_EMU_RACECHECK
namespace blockc_emu {
namespace detail {
void race_launch(Block&) {}
void race_block_start(Block&) {}
void race_block_end(Block&) {}
void race_barrier(Block&) {}
void race_syncwarp(Block&, int, unsigned) {}
void race_shared_var(SharedVar&) {}
}  // namespace detail
}  // namespace blockc_emu
#else

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>

#include <dlfcn.h>

namespace blockc_emu {
namespace detail {
namespace {

// Code addresses are kept as offsets from this library's ELF header (the
// kernels and the checker are linked into one library), 4 bytes, not 8.
extern "C" const char __ehdr_start __attribute__((visibility("hidden")));
unsigned code_offset(const void* pc) { return unsigned((uintptr_t)pc - (uintptr_t)&__ehdr_start); }
const void* code_at(unsigned offset) { return &__ehdr_start + offset; }

// What shared memory has seen: its last write, and the reads since. One Cell
// covers a 4-byte granule while every access to it has covered all 4 bytes
// (floats, ints, vectors of them); a narrower access splits it into one Cell per
// byte (`split`), and a write of the whole granule joins it again.
struct Cell {
  unsigned w_epoch, w_clock;  // the write's barrier epoch and its thread's own warp clock
  unsigned r_epoch, r_clock;  // the reads': epoch and latest clock
  unsigned r_lanes;           // lanes of r_warp that read
  unsigned split;             // 0, or 1 + the index of its 4 byte Cells in g_bytes
  unsigned w_pc, r_pc, r_pc2; // code_offset of the write and of two reads
  short w_tid, r_tid, r_tid2; // writer; a reader and another one (-1: none)
  short r_warp;               // kManyWarps: readers in several warps
  bool w_atomic;
};
constexpr short kManyWarps = -2;
unsigned g_epoch = 1;          // barrier epochs, increasing across blocks and launches
// Static __shared__ variables met so far, by address. A function's static, as
// file-scope ones are met while the library loads, perhaps before this file's globals.
std::vector<SharedVar*>& g_vars() {
  static std::vector<SharedVar*> vars;
  return vars;
}
std::vector<Cell> g_bytes;     // split granules' byte Cells, 4 by 4
std::vector<unsigned> g_free;  // indices in g_bytes free again

// The first read of a byte nobody in the block wrote, reported when its epoch
// ends unless a racing write is reported first.
struct Unwritten {
  bool pending = false;
  int tid;
  const void* pc;
  std::string where;
};

Unwritten g_unwritten;
std::vector<Cell> g_dynamic_shadow;  // one Cell per granule of the dynamic buffer in use
// Every address the checker tracks lies in [lo, lo + span): the fast path's one compare.
std::atomic<uintptr_t> g_lo{~uintptr_t(0)}, g_span{0};

void widen(uintptr_t lo, uintptr_t hi) {
  uintptr_t old_lo = g_lo.load(), old_hi = old_lo + g_span.load();
  if (g_span.load() == 0) old_hi = 0;
  lo = std::min(lo, old_lo);
  hi = std::max(hi, old_hi);
  g_span.store(0);  // no access matches while the bounds change
  g_lo.store(lo);
  g_span.store(hi - lo);
}

}  // namespace

void race_shared_var(SharedVar& v) {
  v.shadow = new Cell[(v.size + 3) / 4]();
  std::vector<SharedVar*>& vars = g_vars();
  auto by_address = [](SharedVar* a, SharedVar* b) { return a->addr < b->addr; };
  vars.insert(std::lower_bound(vars.begin(), vars.end(), &v, by_address), &v);
  widen((uintptr_t)v.addr, (uintptr_t)v.addr + v.size);
}

namespace {

enum Kind { kRead, kWrite, kAtomicLoad, kAtomicStore, kAtomicUpdate };

// Where an address lies: the variable (null: dynamic shared memory), its shadow, the offset.
struct Place {
  SharedVar* var;
  Cell* shadow;
  size_t offset, size;
};

uintptr_t g_dynamic;    // blockc_emu_dynamic_shared()
SharedVar* g_recent[2];  // the variables the last accesses found: a tiled GEMM alternates two

bool place_of(const Block& b, uintptr_t a, Place& p) {
  if (a - g_dynamic < kDynamicSharedCap) {
    p = {nullptr, g_dynamic_shadow.data(), a - g_dynamic, b.shmem};
    return true;
  }
  SharedVar* v = g_recent[0];
  if (!v || a - (uintptr_t)v->addr >= v->size) {
    v = g_recent[1];
    if (!v || a - (uintptr_t)v->addr >= v->size) {
      const std::vector<SharedVar*>& vars = g_vars();
      auto it = std::upper_bound(vars.begin(), vars.end(), a,
                                 [](uintptr_t x, SharedVar* w) { return x < (uintptr_t)w->addr; });
      if (it == vars.begin()) return false;
      v = *(it - 1);
      if (a - (uintptr_t)v->addr >= v->size) return false;
    }
    g_recent[1] = g_recent[0];
    g_recent[0] = v;
  }
  p = {v, static_cast<Cell*>(v->shadow), a - (uintptr_t)v->addr, v->size};
  return true;
}

const char* basename_of(const char* path) {
  const char* s = std::strrchr(path, '/');
  return s ? s + 1 : path;
}

// "file:line (function)" for a code address, innermost inlined frame first, by
// addr2line on the library (built with -g); the process is about to abort.
std::string source_of(const void* pc) {
  Dl_info info;
  if (!pc || !dladdr(pc, &info) || !info.dli_fname) return "an unknown place";
  uintptr_t offset = (uintptr_t)pc - 1 - (uintptr_t)info.dli_fbase;  // pc is a return address
  std::string cmd = "addr2line -C -f -i -e '";
  for (const char* c = info.dli_fname; *c; ++c) cmd += *c == '\'' ? std::string("'\\''") : std::string(1, *c);
  char address[32];
  std::snprintf(address, sizeof address, "0x%lx", (unsigned long)offset);
  cmd += std::string("' ") + address + " 2>/dev/null";
  std::string out;
  if (FILE* f = popen(cmd.c_str(), "r")) {
    char func[1024], loc[1024];  // this may run on a fiber's 64 KiB stack
    for (int frame = 0; frame < 3 && std::fgets(func, sizeof func, f) && std::fgets(loc, sizeof loc, f); ++frame) {
      func[std::strcspn(func, "\n")] = loc[std::strcspn(loc, "\n")] = 0;
      std::string name = std::string(func).substr(0, std::strcspn(func, "("));  // no parameter list
      out += (frame ? ", inlined into " : "") + std::string(basename_of(loc)) + " (" + name + ")";
    }
    pclose(f);
  }
  if (out.empty() || out[0] == '?') return std::string(basename_of(info.dli_fname)) + "+" + address;
  return out;
}

std::string bytes_of(const Place& p, size_t n) {
  char buf[512];
  if (p.var)
    std::snprintf(buf, sizeof buf, "%zu byte%s at offset %zu of `%s` (__shared__, %s:%d, %zu bytes)", n,
                  n == 1 ? "" : "s", p.offset, p.var->name, basename_of(p.var->file), p.var->line, p.var->size);
  else
    std::snprintf(buf, sizeof buf, "%zu byte%s at offset %zu of dynamic shared memory (%zu bytes)", n,
                  n == 1 ? "" : "s", p.offset, p.size);
  return buf;
}

const char* verb(int kind) {
  switch (kind) {
    case kRead: return "reads";
    case kWrite: return "writes";
    case kAtomicLoad: return "atomically reads";
    case kAtomicStore: return "atomically writes";
    default: return "atomically updates";
  }
}

[[noreturn]] void report_race(const Block& b, int me, int kind, const void* pc, const Place& p, size_t n,
                              int other, bool other_wrote, const void* other_pc) {
  const char* hazard = other_wrote ? (kind == kRead || kind == kAtomicLoad ? "read after write" : "write after write")
                                   : "write after read";
  const char* between = me / 32 == other / 32 ? "no __syncwarp() naming both lanes or __syncthreads()"
                                              : "no __syncthreads()";
  fail(b, "shared memory race (%s) on %s: %s %s it at %s; %s %s it at %s, with %s between them", hazard,
       bytes_of(p, n).c_str(), thread_name(b, me).c_str(), verb(kind), source_of(pc).c_str(),
       thread_name(b, other).c_str(), other_wrote ? "wrote" : "read", source_of(other_pc).c_str(), between);
}

[[noreturn]] __attribute__((noinline, cold)) void report_outside(const Block& b, int me, int kind, const void* pc,
                                                                 const Place& p, size_t n) {
  if (p.var)
    fail(b, "%s %s %s at %s, past the end of `%s`", thread_name(b, me).c_str(), verb(kind), bytes_of(p, n).c_str(),
         source_of(pc).c_str(), p.var->name);
  fail(b, "%s %s %s at %s: past the dynamic shared memory the launch asked for", thread_name(b, me).c_str(),
       verb(kind), bytes_of(p, n).c_str(), source_of(pc).c_str());
}

bool ordered(const Block& b, int me, int other, unsigned other_clock) {
  return me / 32 == other / 32 && b.warp_clock[me * 32 + other % 32] >= other_clock;
}

// One access, as each Cell it touches sees it.
struct Access {
  Block& b;
  const Place& p;
  size_t n;
  int kind, me, warp;
  unsigned clock, lane_bit, pc;
  bool writes, atomic;

  // The reports are out of line: the checks run at every shared-memory access.
  [[noreturn]] __attribute__((noinline, cold)) void race(int other, bool other_wrote, unsigned other_pc) const {
    report_race(b, me, kind, code_at(pc), p, n, other, other_wrote, code_at(other_pc));
  }
  __attribute__((noinline, cold)) void unwritten() const { g_unwritten = {true, me, code_at(pc), bytes_of(p, n)}; }

  void visit(Cell& c) const {
    if (c.w_epoch == b.epoch && c.w_tid != me && !(atomic && c.w_atomic) && !ordered(b, me, c.w_tid, c.w_clock))
      race(c.w_tid, true, c.w_pc);
    if (kind != kAtomicStore && kind != kWrite && c.w_epoch < b.block_epoch && !g_unwritten.pending)
      unwritten();
    if (writes) {
      if (c.r_epoch == b.epoch) {
        bool unordered = c.r_warp != warp;
        for (unsigned others = c.r_lanes & ~lane_bit; !unordered && others; others &= others - 1)
          unordered = b.warp_clock[me * 32 + __builtin_ctz(others)] < c.r_clock;
        if (unordered) {
          bool first = c.r_tid != me;
          race(first ? c.r_tid : c.r_tid2, false, first ? c.r_pc : c.r_pc2);
        }
      }
      c.w_epoch = b.epoch;
      c.w_clock = clock;
      c.w_tid = (short)me;
      c.w_atomic = atomic;
      c.w_pc = pc;
      c.r_epoch = 0;  // the reads before are ordered before this write, or were reported
    } else if (kind == kRead) {
      if (c.r_epoch != b.epoch) {
        c.r_epoch = b.epoch;
        c.r_warp = (short)warp;
        c.r_lanes = lane_bit;
        c.r_clock = clock;
        c.r_tid = (short)me;
        c.r_pc = pc;
        c.r_tid2 = -1;
      } else {
        if (c.r_warp != warp) c.r_warp = kManyWarps;
        c.r_lanes |= lane_bit;
        c.r_clock = std::max(c.r_clock, clock);
        if (c.r_tid != me && c.r_tid2 < 0) {
          c.r_tid2 = (short)me;
          c.r_pc2 = pc;
        }
      }
    }
  }
};

unsigned split(Cell& granule) {
  unsigned at;
  if (!g_free.empty()) {
    at = g_free.back();
    g_free.pop_back();
  } else {
    at = (unsigned)g_bytes.size();
    g_bytes.resize(at + 4);
  }
  std::fill(g_bytes.begin() + at, g_bytes.begin() + at + 4, granule);
  granule.split = at + 1;
  return at;
}

void check(const void* addr, size_t n, int kind, const void* pc) {
  Lane* lane = t_lane;
  if (!lane) return;  // host code
  Block& b = *lane->block;
  Guard g = lock_block(b);
  Place p;
  if (!place_of(b, (uintptr_t)addr, p)) return;
  const int me = int(lane - b.lanes.data());
  if (p.offset + n > p.size) report_outside(b, me, kind, pc, p, n);
  const bool writes = kind == kWrite || kind == kAtomicStore || kind == kAtomicUpdate;
  const Access a{b, p, n, kind, me, me / 32, lane->clock, 1u << (me % 32), code_offset(pc),
                 writes, kind >= kAtomicLoad};
  const size_t end = p.offset + n;
  for (size_t at = p.offset; at < end;) {
    Cell& granule = p.shadow[at / 4];
    const size_t lo = at % 4, hi = std::min<size_t>(4, lo + (end - at));
    at += hi - lo;
    if (hi - lo == 4 && !granule.split) {
      a.visit(granule);
      continue;
    }
    const unsigned bytes = granule.split ? granule.split - 1 : split(granule);
    for (size_t k = lo; k < hi; ++k) a.visit(g_bytes[bytes + k]);
    if (hi - lo == 4 && writes) {  // the 4 bytes agree again
      granule = g_bytes[bytes];
      granule.split = 0;
      g_free.push_back(bytes);
    }
  }
}

// The epoch ends: a read of never-written memory that no write raced with is reported now.
void end_epoch(Block& b) {
  if (!g_unwritten.pending) return;
  g_unwritten.pending = false;
  fail(b, "%s reads %s at %s, which no thread of this block has written (static __shared__ memory keeps "
       "nothing from a previous block; it reads as 0xFF bytes, NaN for floats)",
       thread_name(b, g_unwritten.tid).c_str(), g_unwritten.where.c_str(), source_of(g_unwritten.pc).c_str());
}

}  // namespace

void race_block_start(Block& b) { b.block_epoch = b.epoch = ++g_epoch; }

void race_launch(Block& b) {
  b.warp_clock.assign((size_t)b.n * 32, 0);
  for (int i = 0; i < b.n; ++i) b.warp_clock[(size_t)i * 32 + i % 32] = b.lanes[i].clock = 1;
  if (g_dynamic_shadow.size() < (b.shmem + 3) / 4) g_dynamic_shadow.resize((b.shmem + 3) / 4);
  if (!g_dynamic) {
    g_dynamic = (uintptr_t)blockc_emu_dynamic_shared();
    widen(g_dynamic, g_dynamic + kDynamicSharedCap);
  }
}

void race_block_end(Block& b) { end_epoch(b); }

void race_barrier(Block& b) {
  end_epoch(b);
  b.epoch = ++g_epoch;
}

// __syncwarp(mask): each lane named learns what the others know, then ticks its own clock.
void race_syncwarp(Block& b, int base, unsigned mask) {
  unsigned joined[32] = {};
  for (unsigned m = mask; m; m &= m - 1)
    for (int k = 0; k < 32; ++k)
      joined[k] = std::max(joined[k], b.warp_clock[(size_t)(base + __builtin_ctz(m)) * 32 + k]);
  for (unsigned m = mask; m; m &= m - 1) {
    int l = __builtin_ctz(m);
    std::copy(joined, joined + 32, b.warp_clock.begin() + (size_t)(base + l) * 32);
    b.lanes[base + l].clock = ++b.warp_clock[(size_t)(base + l) * 32 + l];
  }
}

}  // namespace detail
}  // namespace blockc_emu

// ---- ThreadSanitizer's instrumentation ABI, as g++ -fsanitize=thread calls it --------------
// Everything but shared memory returns at the first compare. The memory order
// arguments are ignored: every atomic here is sequentially consistent.
namespace {
inline bool in_shared(const volatile void* p) {
  using blockc_emu::detail::g_lo;
  using blockc_emu::detail::g_span;
  return (uintptr_t)p - g_lo.load(std::memory_order_relaxed) < g_span.load(std::memory_order_relaxed);
}
inline void note(const volatile void* p, size_t n, int kind, const void* pc) {
  if (__builtin_expect(in_shared(p), 0)) blockc_emu::detail::check((const void*)p, n, kind, pc);
}
}  // namespace

#define BLOCKC_EMU_API extern "C" __attribute__((visibility("hidden")))
#define BLOCKC_EMU_PC __builtin_return_address(0)
using blockc_emu::detail::kRead;
using blockc_emu::detail::kWrite;

#define BLOCKC_EMU_PLAIN(n)                                                                              \
  BLOCKC_EMU_API void __tsan_read##n(void* p) { note(p, n, kRead, BLOCKC_EMU_PC); }                    \
  BLOCKC_EMU_API void __tsan_write##n(void* p) { note(p, n, kWrite, BLOCKC_EMU_PC); }                  \
  BLOCKC_EMU_API void __tsan_unaligned_read##n(void* p) { note(p, n, kRead, BLOCKC_EMU_PC); }          \
  BLOCKC_EMU_API void __tsan_unaligned_write##n(void* p) { note(p, n, kWrite, BLOCKC_EMU_PC); }        \
  BLOCKC_EMU_API void __tsan_volatile_read##n(void* p) { note(p, n, kRead, BLOCKC_EMU_PC); }           \
  BLOCKC_EMU_API void __tsan_volatile_write##n(void* p) { note(p, n, kWrite, BLOCKC_EMU_PC); }
BLOCKC_EMU_PLAIN(1)
BLOCKC_EMU_PLAIN(2)
BLOCKC_EMU_PLAIN(4)
BLOCKC_EMU_PLAIN(8)
BLOCKC_EMU_PLAIN(16)
#undef BLOCKC_EMU_PLAIN
BLOCKC_EMU_API void __tsan_read_range(void* p, unsigned long n) { note(p, n, kRead, BLOCKC_EMU_PC); }
BLOCKC_EMU_API void __tsan_write_range(void* p, unsigned long n) { note(p, n, kWrite, BLOCKC_EMU_PC); }
BLOCKC_EMU_API void __tsan_init() {}
BLOCKC_EMU_API void __tsan_func_entry(void*) {}
BLOCKC_EMU_API void __tsan_func_exit() {}
BLOCKC_EMU_API void __tsan_vptr_update(void**, void*) {}
BLOCKC_EMU_API void __tsan_vptr_read(void**) {}

#define BLOCKC_EMU_SC __ATOMIC_SEQ_CST
#define BLOCKC_EMU_UPDATE(bits, T, op)                                                               \
  BLOCKC_EMU_API T __tsan_atomic##bits##_##op(volatile T* a, T v, int) {                           \
    note(a, sizeof(T), blockc_emu::detail::kAtomicUpdate, BLOCKC_EMU_PC);                           \
    return __atomic_##op(a, v, BLOCKC_EMU_SC);                                                      \
  }
#define BLOCKC_EMU_ATOMICS(bits, T)                                                                   \
  BLOCKC_EMU_API T __tsan_atomic##bits##_load(const volatile T* a, int) {                            \
    note(a, sizeof(T), blockc_emu::detail::kAtomicLoad, BLOCKC_EMU_PC);                             \
    return __atomic_load_n(a, BLOCKC_EMU_SC);                                                       \
  }                                                                                                 \
  BLOCKC_EMU_API void __tsan_atomic##bits##_store(volatile T* a, T v, int) {                         \
    note(a, sizeof(T), blockc_emu::detail::kAtomicStore, BLOCKC_EMU_PC);                            \
    __atomic_store_n(a, v, BLOCKC_EMU_SC);                                                          \
  }                                                                                                 \
  BLOCKC_EMU_API T __tsan_atomic##bits##_exchange(volatile T* a, T v, int) {                        \
    note(a, sizeof(T), blockc_emu::detail::kAtomicUpdate, BLOCKC_EMU_PC);                           \
    return __atomic_exchange_n(a, v, BLOCKC_EMU_SC);                                                \
  }                                                                                                 \
  BLOCKC_EMU_UPDATE(bits, T, fetch_add)                                                             \
  BLOCKC_EMU_UPDATE(bits, T, fetch_sub)                                                             \
  BLOCKC_EMU_UPDATE(bits, T, fetch_and)                                                             \
  BLOCKC_EMU_UPDATE(bits, T, fetch_or)                                                              \
  BLOCKC_EMU_UPDATE(bits, T, fetch_xor)                                                             \
  BLOCKC_EMU_UPDATE(bits, T, fetch_nand)                                                            \
  BLOCKC_EMU_API int __tsan_atomic##bits##_compare_exchange_strong(volatile T* a, T* c, T v, int, int) { \
    note(a, sizeof(T), blockc_emu::detail::kAtomicUpdate, BLOCKC_EMU_PC);                           \
    return __atomic_compare_exchange_n(a, c, v, false, BLOCKC_EMU_SC, BLOCKC_EMU_SC);               \
  }                                                                                                 \
  BLOCKC_EMU_API int __tsan_atomic##bits##_compare_exchange_weak(volatile T* a, T* c, T v, int, int) { \
    note(a, sizeof(T), blockc_emu::detail::kAtomicUpdate, BLOCKC_EMU_PC);                           \
    return __atomic_compare_exchange_n(a, c, v, false, BLOCKC_EMU_SC, BLOCKC_EMU_SC);               \
  }                                                                                                 \
  BLOCKC_EMU_API T __tsan_atomic##bits##_compare_exchange_val(volatile T* a, T c, T v, int, int) {   \
    note(a, sizeof(T), blockc_emu::detail::kAtomicUpdate, BLOCKC_EMU_PC);                           \
    __atomic_compare_exchange_n(a, &c, v, false, BLOCKC_EMU_SC, BLOCKC_EMU_SC);                     \
    return c;                                                                                       \
  }
BLOCKC_EMU_ATOMICS(8, uint8_t)
BLOCKC_EMU_ATOMICS(16, uint16_t)
BLOCKC_EMU_ATOMICS(32, uint32_t)
BLOCKC_EMU_ATOMICS(64, uint64_t)
#undef BLOCKC_EMU_ATOMICS
#undef BLOCKC_EMU_UPDATE
BLOCKC_EMU_API void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(BLOCKC_EMU_SC); }
BLOCKC_EMU_API void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(BLOCKC_EMU_SC); }
#endif  // BLOCKC_EMU_RACECHECK
