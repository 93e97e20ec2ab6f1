// cuda_emu_internal.h: the block state machine shared by cuda_emu_sched.cpp and
// the two ways of running threads, cuda_emu_fibers.cpp and cuda_emu_threads.cpp.
// Exactly one of those two compiles to something, chosen by BLOCKC_EMU_THREADS.
#ifndef BLOCKC_CUDA_EMU_INTERNAL_H
#define BLOCKC_CUDA_EMU_INTERNAL_H

#include "cuda_emu.h"

#include <memory>
#include <string>
#include <mutex>
#include <vector>

#ifdef BLOCKC_EMU_THREADS
#include <condition_variable>
#elif defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#error "sanitizers do not understand fiber stacks: build with -DBLOCKC_EMU_THREADS"
#endif

namespace blockc_emu {
namespace detail {

enum State : int { kRunning, kAtBarrier, kAtWarp, kExited };

constexpr size_t kDynamicSharedCap = 256 * 1024;  // blockc_emu_dynamic_shared()'s size

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
  unsigned clock;  // its own warp clock, as Block::warp_clock has it (the race checker's)
};

// One launch's threads; reset by start_block for each block in turn.
struct Block {
  const char* kernel;
  Body body;
  void* closure;
  dim3 grid;
  size_t shmem;
  unsigned index = 0, count = 0;  // linear index of this block, blocks in the grid
  std::vector<Lane> lanes;
  int n = 0, running = 0, exited = 0, at_barrier = 0, bar_true = 0;
  const char* bar_file = nullptr;  // call site of the barrier now filling
  int bar_line = 0;
  // What orders shared-memory accesses (cuda_emu_racecheck.cpp): `epoch` changes
  // at every __syncthreads and block start, `block_epoch` at block start only;
  // warp_clock[i * 32 + k] is what lane i knows of lane k of its warp's clock.
  unsigned epoch = 0, block_epoch = 0;
  std::vector<unsigned> warp_clock;
#ifdef BLOCKC_EMU_THREADS
  std::mutex mu;
  std::unique_ptr<std::condition_variable[]> warp_cv;  // one per warp: wake only the lanes concerned
  std::condition_variable next_block_cv;
  bool done = false;
#endif
};

// The thread (fiber or OS) now running; initial-exec, as blockc_emu_tls: the race
// checker reads it at every shared-memory access, and __tls_get_addr showed in profiles.
extern __thread Lane* t_lane __attribute__((tls_model("initial-exec")));

[[noreturn]] void fail(const Block& b, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
std::string thread_name(const Block& b, int i);  // "thread (x,y,z) [warp w lane l]": how errors name lane i
size_t stack_bytes();
int max_grid_yz();  // the grid's y and z limit (BLOCKC_EMU_MAX_GRID_YZ, else 65,535)
void start_block(Block& b, unsigned index);  // lanes, counters and dynamic shared memory for block `index`
void finish_thread(Lane& me);               // marks `me` exited and checks nobody waits on it

// cuda_emu_racecheck.cpp: what the race checker learns from the scheduler (no-ops
// in a build without it).
void race_launch(Block& b);
void race_block_start(Block& b);
void race_block_end(Block& b);
void race_barrier(Block& b);                           // a __syncthreads completes
void race_syncwarp(Block& b, int base, unsigned mask);  // a __syncwarp completes
void race_shared_var(SharedVar& v);                     // a static __shared__ variable, first met

// Provided by the mode: run every block of the launch; wait until `me` runs again.
void run_blocks(Block& b);
#ifdef BLOCKC_EMU_THREADS
using Guard = std::unique_lock<std::mutex>;
inline Guard lock_block(Block& b) { return Guard(b.mu); }
#else
struct Guard {};
inline Guard lock_block(Block&) { return {}; }
#endif
void wait_running(Block& b, Lane& me, Guard& g);
void wake_warp(Block& b, int warp);
void wake_all(Block& b);

}  // namespace detail
}  // namespace blockc_emu

#endif  // BLOCKC_CUDA_EMU_INTERNAL_H
