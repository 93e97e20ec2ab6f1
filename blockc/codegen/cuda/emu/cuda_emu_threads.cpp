// cuda_emu_threads.cpp: one OS thread per CUDA thread (-DBLOCKC_EMU_THREADS),
// the mode AddressSanitizer and ThreadSanitizer runs use: every barrier and
// warp rendezvous goes through the block's mutex, which both understand.
// A launch creates blockDim threads once (thread creation costs ~1 ms under
// ThreadSanitizer); the last thread to finish a block starts the next one.
#ifdef BLOCKC_EMU_THREADS
#include "cuda_emu_internal.h"

#include <cstdio>
#include <cstdlib>

#include <pthread.h>

namespace blockc_emu {
namespace detail {
namespace {

void* thread_main(void* arg) {
  Lane& me = *static_cast<Lane*>(arg);
  Block& b = *me.block;
  t_lane = &me;
  blockc_emu_tls = &me.ctx;
  for (;;) {
    b.body(b.closure);
    unsigned index;
    {
      Guard g = lock_block(b);
      index = b.index;
    }
    finish_thread(me);
    Guard g = lock_block(b);
    if (b.exited == b.n) {  // the last thread out starts the next block for everyone
      if (b.index + 1 < b.count) {
        start_block(b, b.index + 1);
        for (int w = 0; w < (b.n + 31) / 32; ++w) b.warp_cv[w].notify_all();
      } else {
        b.done = true;
      }
      b.next_block_cv.notify_all();
    }
    b.next_block_cv.wait(g, [&] { return b.done || b.index != index; });
    if (b.done) return nullptr;
  }
}

}  // namespace

void wait_running(Block& b, Lane& me, Guard& g) {
  b.warp_cv[int(&me - b.lanes.data()) / 32].wait(g, [&] { return me.state == kRunning; });
}
void wake_warp(Block& b, int warp) { b.warp_cv[warp].notify_all(); }
void wake_all(Block& b) {
  for (int w = 0; w < (b.n + 31) / 32; ++w) wake_warp(b, w);
}

void run_blocks(Block& b) {
  b.warp_cv.reset(new std::condition_variable[(b.n + 31) / 32]);
  b.done = false;
  start_block(b, 0);
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

}  // namespace detail
}  // namespace blockc_emu
#endif  // BLOCKC_EMU_THREADS
