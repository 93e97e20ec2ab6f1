// cuda_emu.h: run blockc's generated CUDA on a CPU, with g++.
//
// The emulator force-includes this header (`g++ -x c++ -include cuda_emu.h`)
// into the exact `.cu` that nvcc compiles for the GPU, and links cuda_emu_*.cpp
// beside it (blockc/codegen/cuda/toolchain.py does both). Under nvcc the header
// only defines BLOCKC_LAUNCH, so a file may also include it itself.
//
// How a launch runs. `BLOCKC_LAUNCH(kernel, grid, block, shmem, stream, args...)`
// runs the blocks one after another; the threads of a block are either
//   * fibers (default): one OS thread, a hand-rolled x86-64 context switch
//     (callee-saved registers, MXCSR, x87 control word and rsp), 64 KiB mmap'd
//     stacks with a guard page (BLOCKC_EMU_STACK_KB overrides), or
//   * OS threads (-DBLOCKC_EMU_THREADS): one pthread per CUDA thread, created
//     once per launch and reused block after block, with barriers and warp
//     rendezvous on a mutex and condition variables, which AddressSanitizer and
//     ThreadSanitizer understand. toolchain.compile_emulated(sanitize=...) picks
//     this mode, as does threads=True.
// Measured on the 2-core x86-64 VM this was written on (g++ 12 -O2), 40 blocks
// x 256 threads x 64 barriers. The bare switch (cuda_emu_switch.h, timed by
// bench/emu_context_switch.cpp; these figures are from before it kept MXCSR and
// the x87 control word), per thread per barrier (ranges over repeated runs on a
// shared machine):
//     hand-rolled fiber switch        31-35 ns
//     ucontext swapcontext           470-720 ns  (15-21x: a sigprocmask syscall per switch)
//     one OS thread per CUDA thread  3.4-4.4 us  (100-140x, std::barrier)
// The emulator itself, with every check, per thread per operation:
//     fibers:  __syncthreads 85 ns, __shfl_xor_sync 163 ns
//     threads: __syncthreads 16 us, __shfl_xor_sync 15 us (~190x: keep shapes small)
// A 512 x 4096 float4 softmax (512 blocks of 128 threads) runs in ~0.3 s on fibers.
//
// What is checked. Every barrier and warp collective records its call site.
// The program aborts, naming the kernel, block, thread and warp lane, when
//   * __syncthreads waits while another thread of the block has exited, or
//     threads wait at different __syncthreads call sites;
//   * a warp collective (__shfl*_sync, __ballot_sync, __any/__all_sync,
//     __match*_sync, __reduce*_sync, __syncwarp) names a lane that has exited,
//     waits at a barrier, does not exist, or sits in a different collective,
//     or a shuffle reads a lane outside its mask (divergence);
//   * no thread of a block can make progress; and, in fiber mode, a fiber
//     overflows its stack or any thread takes SIGSEGV/SIGBUS (the address, block
//     and thread are printed). Nothing hangs: a stuck block is always diagnosed;
//   * unless a sanitizer is on, two threads access a shared-memory byte, one
//     writing, with no __syncthreads (or, within a warp, __syncwarp) between,
//     or a thread reads shared memory no thread of its block wrote
//     (cuda_emu_racecheck.cpp, which gives the rules and their cost).
// Shared memory, static and dynamic, is filled with 0xFF (NaN for floats) at
// each block, so a block never sees another block's values.
//
// Constraints.
//   * `__shared__` is `static`: one copy per kernel, which is per block because
//     blocks run one at a time. Launches from several host threads at once are
//     serialised by a lock.
//   * Shared memory needs two source rewrites (toolchain.rewrite_shared), each on
//     the declaration's line. `extern __shared__ T name[];` becomes
//         static T* const name = reinterpret_cast<T*>(blockc_emu_dynamic_shared());
//     The dynamic buffer has a fixed address (256 KiB, 128-byte aligned), so the
//     rewrite is right at block and at file scope. `__shared__ T name[N];` is
//     followed by `BLOCKC_EMU_SHARED(name);`, which fills it and shows it to the
//     race checker. Only the sources compiled are rewritten, not headers.
//   * Streams are synchronous; events time host work. Device memory is host memory.
//   * Stream capture and CUDA graphs (cuda_emu_streams.cpp) record launches,
//     memsets and memcpys and replay them in order; the rules a program can
//     break while capturing are checked as CUDA checks them (see there).
//   * blockc_emu_counters() says what the process did so far (allocations,
//     launches, graph captures, updates and launches), for tests to read.
//   * Not emulated: inline PTX, wmma, CUB, cooperative groups, texture/surface
//     objects. Emulated kernels avoid them (BLOCKC_EMU is 1 here). The tensor-core
//     operations blockc's kernels use (cp.async, ldmatrix, mma.sync m16n8k16)
//     are emulated by blockc_cuda.h's wrappers around them, not here.
//   * Kernel template arguments contain commas: parenthesise the kernel,
//     `BLOCKC_LAUNCH((k<float, 4>), ...)`.
#ifndef BLOCKC_CUDA_EMU_H
#define BLOCKC_CUDA_EMU_H

#if defined(__CUDACC__)  // real nvcc: launches are launches
#define BLOCKC_EMU 0
#define BLOCKC_LAUNCH(kernel, grid, block, shmem, stream, ...) \
  kernel<<<(grid), (block), (shmem), (stream)>>>(__VA_ARGS__)
#else

#define BLOCKC_EMU 1
#if !defined(__x86_64__) && !defined(BLOCKC_EMU_THREADS)
#error "cuda_emu fibers need x86-64; build with -DBLOCKC_EMU_THREADS elsewhere"
#endif

// Space qualifiers, defined before NVIDIA's host_defines.h, which keeps them.
#define __host__
#define __device__
#define __global__
#define __shared__ static
#define __constant__
#define __managed__
#define __grid_constant__
#define __launch_bounds__(...)
#define __DEVICE_LAUNCH_PARAMETERS_H__  // its `extern uint3 threadIdx` would clash

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <vector_types.h>
#include <vector_functions.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#ifndef __forceinline__
#define __forceinline__ inline __attribute__((always_inline))
#endif

constexpr int warpSize = 32;

namespace blockc_emu {

// What the built-in variables read; the scheduler points t_ctx at the running thread.
struct ThreadCtx {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
  int linear;   // x + y*bx + z*bx*by: warp = linear / 32, lane = linear % 32
  void* block;  // the scheduler's block state
};

enum WarpOp : int {
  kShflIdx, kShflUp, kShflDown, kShflXor,
  kBallot, kSyncWarp, kMatchAny, kMatchAll,
  kReduceAddU, kReduceMinU, kReduceMaxU, kReduceMinS, kReduceMaxS,
  kReduceAnd, kReduceOr, kReduceXor,
};

// Block-wide barrier; kind 0 plain, 1 count, 2 and, 3 or. Returns the reduction.
int sync_block(int kind, int pred, const char* file, int line);
// A warp collective over the lanes in `mask`; returns this lane's result bits.
uint64_t warp_collective(int op, unsigned mask, uint64_t value, int arg, int width,
                         const char* file, int line);
unsigned active_mask();
[[noreturn]] void trap(const char* what, const char* file, int line);

// Used by the runtime API (cuda_emu_runtime.cpp) and the launcher.
void record_error(cudaError_t err);
void set_max_dynamic_shared(const void* kernel, int bytes);

// A static `__shared__` variable, as toolchain.rewrite_shared declares one
// beside each: `__shared__ float buf[64]; BLOCKC_EMU_SHARED(buf);`. `block`
// is the block that last filled it with 0xFF; the first thread of a block to
// pass the declaration does that, so no block reads another block's values.
struct SharedVar {
  void* addr;
  size_t size;
  const char* name;
  const char* file;
  int line;
  unsigned block;  // written with release order after the fill (thread mode)
  void* shadow;    // the race checker's record of it (cuda_emu_racecheck.cpp)
};
void enter_shared(SharedVar& v);
extern "C" unsigned blockc_emu_block_serial;  // changes at every block start
// Constructed each time a thread passes the declaration (at file scope: once, at load).
struct SharedEnter {
  explicit SharedEnter(SharedVar& v) {
    const unsigned now = __atomic_load_n(&blockc_emu_block_serial, __ATOMIC_RELAXED);
    if (__atomic_load_n(&v.block, __ATOMIC_ACQUIRE) != now) enter_shared(v);
  }
};
// What blockc_emu_counters() reports; each counts from the process's start.
enum Counter : int {
  kDeviceAllocations,    // cudaMalloc and the calls that allocate through it
  kKernelLaunches,       // kernels run (a graph's too), not those only captured
  kGraphCaptures,        // stream captures ended into a graph
  kGraphInstantiations,
  kGraphUpdates,         // successful cudaGraphExecUpdate calls
  kGraphLaunches,
  kNumCounters,
};
void count(Counter c);

using Body = void (*)(void*);
// A copy of a launch's closure that outlives the launch: what a capture keeps.
using Keep = std::shared_ptr<void> (*)(const void* closure);
// Checks the configuration, then runs the launch, or records it where `stream` captures.
void launch_kernel(const char* name, const void* kernel, dim3 grid, dim3 block,
                   size_t shmem, cudaStream_t stream, Body body, void* closure, Keep keep);
// Runs a checked launch now (the launcher, and a graph's kernel nodes).
void run_kernel(const char* name, dim3 grid, dim3 block, size_t shmem, Body body, void* closure);

// Stream capture (cuda_emu_streams.cpp).
bool capturing(cudaStream_t stream);
void invalidate_capture(cudaStream_t stream);
void capture_kernel(cudaStream_t stream, const char* name, const void* kernel, dim3 grid, dim3 block,
                    size_t shmem, Body body, std::shared_ptr<void> closure);
void capture_memset(cudaStream_t stream, void* dst, int value, size_t count);
void capture_memcpy(cudaStream_t stream, void* dst, const void* src, size_t count);
// cudaSuccess, or (after invalidating this thread's captures) the error CUDA
// gives a call that may synchronize while a capture forbids it.
cudaError_t refuse_during_capture(const char* call);

template <class T>
uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value,
                "warp shuffles move values of at most 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  return bits;
}
template <class T>
T from_bits(uint64_t bits) {
  T v;
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}

// Runs `kernel(args...)` in every thread of every block. Arguments are converted
// to the parameter types once, as the CUDA runtime does, and copied per thread.
template <class... P, class... A>
void launch(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t shmem,
            cudaStream_t stream, A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "kernel launched with the wrong number of arguments");
  struct Closure {
    void (*kernel)(P...);
    std::tuple<std::decay_t<P>...> params;
  } closure{kernel, std::tuple<std::decay_t<P>...>(std::forward<A>(args)...)};
  launch_kernel(name, reinterpret_cast<const void*>(kernel), grid, block, shmem, stream,
                [](void* c) {
                  auto* cl = static_cast<Closure*>(c);
                  auto params = cl->params;
                  std::apply(cl->kernel, params);
                },
                &closure,
                [](const void* c) -> std::shared_ptr<void> {
                  return std::make_shared<Closure>(*static_cast<const Closure*>(c));
                });
}

}  // namespace blockc_emu

extern "C" {
extern __thread blockc_emu::ThreadCtx* blockc_emu_tls __attribute__((tls_model("initial-exec")));
void* blockc_emu_dynamic_shared(void);
// The counters as one JSON object ({"device_allocations": 3, ...}) in `buf`;
// returns the length it needs, as snprintf does.
int blockc_emu_counters(char* buf, int size);
}

#define BLOCKC_LAUNCH(kernel, grid, block, shmem, stream, ...) \
  ::blockc_emu::launch(#kernel, kernel, dim3(grid), dim3(block), (size_t)(shmem), (stream), ##__VA_ARGS__)

// cuda_runtime.h declares its kernel- and symbol-taking templates only for nvcc.
template <class T>
cudaError_t cudaFuncSetAttribute(T* kernel, cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}
template <class T>
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, T* kernel) {
  return ::cudaFuncGetAttributes(attr, reinterpret_cast<const void*>(kernel));
}
template <class T>
cudaError_t cudaFuncSetCacheConfig(T*, cudaFuncCache) { return cudaSuccess; }
template <class T>
cudaError_t cudaMemcpyToSymbol(const T& symbol, const void* src, size_t count, size_t offset = 0,
                               cudaMemcpyKind kind = cudaMemcpyHostToDevice) {
  return ::cudaMemcpyToSymbol(static_cast<const void*>(&symbol), src, count, offset, kind);
}
template <class T>
cudaError_t cudaMemcpyToSymbolAsync(const T& symbol, const void* src, size_t count, size_t offset = 0,
                                    cudaMemcpyKind kind = cudaMemcpyHostToDevice, cudaStream_t = 0) {
  return ::cudaMemcpyToSymbol(static_cast<const void*>(&symbol), src, count, offset, kind);
}
template <class T>
cudaError_t cudaMemcpyFromSymbol(void* dst, const T& symbol, size_t count, size_t offset = 0,
                                 cudaMemcpyKind kind = cudaMemcpyDeviceToHost) {
  return ::cudaMemcpyFromSymbol(dst, static_cast<const void*>(&symbol), count, offset, kind);
}
template <class T>
cudaError_t cudaGetSymbolAddress(void** ptr, const T& symbol) {
  *ptr = const_cast<void*>(static_cast<const void*>(&symbol));
  return cudaSuccess;
}

// Valid at block and at namespace scope (a const object has internal linkage there).
#define BLOCKC_EMU_SHARED(v)                                                                        \
  static ::blockc_emu::SharedVar blockc_emu_shared_##v{&(v), sizeof(v), #v, __FILE__, __LINE__, 0, nullptr}; \
  [[maybe_unused]] const ::blockc_emu::SharedEnter blockc_emu_enter_##v { blockc_emu_shared_##v }

#define threadIdx (blockc_emu_tls->thread_idx)
#define blockIdx (blockc_emu_tls->block_idx)
#define blockDim (blockc_emu_tls->block_dim)
#define gridDim (blockc_emu_tls->grid_dim)

// ---- barriers and fences ----------------------------------------------------
#define BLOCKC_EMU_SITE const char *blockc_file = __builtin_FILE(), int blockc_line = __builtin_LINE()

inline void __syncthreads(BLOCKC_EMU_SITE) { blockc_emu::sync_block(0, 1, blockc_file, blockc_line); }
inline int __syncthreads_count(int p, BLOCKC_EMU_SITE) { return blockc_emu::sync_block(1, p, blockc_file, blockc_line); }
inline int __syncthreads_and(int p, BLOCKC_EMU_SITE) { return blockc_emu::sync_block(2, p, blockc_file, blockc_line); }
inline int __syncthreads_or(int p, BLOCKC_EMU_SITE) { return blockc_emu::sync_block(3, p, blockc_file, blockc_line); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
[[noreturn]] inline void __trap(BLOCKC_EMU_SITE) { blockc_emu::trap("__trap()", blockc_file, blockc_line); }
inline void __nanosleep(unsigned) {}
inline long long clock64() { return (long long)__builtin_ia32_rdtsc(); }

// ---- warp collectives ---------------------------------------------------------
template <class T>
T __shfl_sync(unsigned mask, T v, int src, int width = warpSize, BLOCKC_EMU_SITE) {
  return blockc_emu::from_bits<T>(blockc_emu::warp_collective(
      blockc_emu::kShflIdx, mask, blockc_emu::to_bits(v), src, width, blockc_file, blockc_line));
}
template <class T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = warpSize, BLOCKC_EMU_SITE) {
  return blockc_emu::from_bits<T>(blockc_emu::warp_collective(
      blockc_emu::kShflUp, mask, blockc_emu::to_bits(v), (int)delta, width, blockc_file, blockc_line));
}
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = warpSize, BLOCKC_EMU_SITE) {
  return blockc_emu::from_bits<T>(blockc_emu::warp_collective(
      blockc_emu::kShflDown, mask, blockc_emu::to_bits(v), (int)delta, width, blockc_file, blockc_line));
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = warpSize, BLOCKC_EMU_SITE) {
  return blockc_emu::from_bits<T>(blockc_emu::warp_collective(
      blockc_emu::kShflXor, mask, blockc_emu::to_bits(v), lane_mask, width, blockc_file, blockc_line));
}
inline unsigned __ballot_sync(unsigned mask, int pred, BLOCKC_EMU_SITE) {
  return (unsigned)blockc_emu::warp_collective(blockc_emu::kBallot, mask, pred != 0, 0, 32,
                                               blockc_file, blockc_line);
}
inline int __any_sync(unsigned mask, int pred, BLOCKC_EMU_SITE) {
  return __ballot_sync(mask, pred, blockc_file, blockc_line) != 0;
}
inline int __all_sync(unsigned mask, int pred, BLOCKC_EMU_SITE) {
  return __ballot_sync(mask, pred, blockc_file, blockc_line) == mask;
}
inline void __syncwarp(unsigned mask = 0xffffffffu, BLOCKC_EMU_SITE) {
  blockc_emu::warp_collective(blockc_emu::kSyncWarp, mask, 0, 0, 32, blockc_file, blockc_line);
}
inline unsigned __activemask() { return blockc_emu::active_mask(); }
template <class T>
unsigned __match_any_sync(unsigned mask, T v, BLOCKC_EMU_SITE) {
  return (unsigned)blockc_emu::warp_collective(blockc_emu::kMatchAny, mask, blockc_emu::to_bits(v), 0,
                                               32, blockc_file, blockc_line);
}
template <class T>
unsigned __match_all_sync(unsigned mask, T v, int* pred, BLOCKC_EMU_SITE) {
  unsigned r = (unsigned)blockc_emu::warp_collective(blockc_emu::kMatchAll, mask, blockc_emu::to_bits(v),
                                                     0, 32, blockc_file, blockc_line);
  *pred = r != 0;
  return r;
}
#define BLOCKC_EMU_REDUCE(name, T, op)                                                            \
  inline T name(unsigned mask, T v, BLOCKC_EMU_SITE) {                                            \
    return (T)blockc_emu::warp_collective(blockc_emu::op, mask, (uint64_t)(uint32_t)v, 0, 32, \
                                          blockc_file, blockc_line);                              \
  }
BLOCKC_EMU_REDUCE(__reduce_add_sync, unsigned, kReduceAddU)
BLOCKC_EMU_REDUCE(__reduce_add_sync, int, kReduceAddU)
BLOCKC_EMU_REDUCE(__reduce_min_sync, unsigned, kReduceMinU)
BLOCKC_EMU_REDUCE(__reduce_max_sync, unsigned, kReduceMaxU)
BLOCKC_EMU_REDUCE(__reduce_min_sync, int, kReduceMinS)
BLOCKC_EMU_REDUCE(__reduce_max_sync, int, kReduceMaxS)
BLOCKC_EMU_REDUCE(__reduce_and_sync, unsigned, kReduceAnd)
BLOCKC_EMU_REDUCE(__reduce_or_sync, unsigned, kReduceOr)
BLOCKC_EMU_REDUCE(__reduce_xor_sync, unsigned, kReduceXor)
#undef BLOCKC_EMU_REDUCE

#include "cuda_emu_math.h"

#endif  // __CUDACC__
#endif  // BLOCKC_CUDA_EMU_H
