// Every warp collective, with widths below 32 and a partial mask, so the
// emulator's lane rules can be checked against numpy. One value per thread in,
// one int per (thread, op) out: out[op * n + thread].
#include <cuda_runtime.h>

enum { kUp, kDown, kXor, kIdx, kBallot, kAny, kAll, kReduce, kMatch, kHalfXor, kActive, kCount, kOps };

__global__ void warp_ops(const int* __restrict__ x, int* __restrict__ out) {
  const unsigned full = 0xffffffffu;
  const int n = blockDim.x, t = threadIdx.x, lane = t % 32;
  const int v = x[t];
  int* o = out + t;
  o[kUp * n] = __shfl_up_sync(full, v, 1, 8);
  o[kDown * n] = __shfl_down_sync(full, v, 3);
  o[kXor * n] = __shfl_xor_sync(full, v, 5, 16);
  o[kIdx * n] = __shfl_sync(full, v, lane * 3, 8);
  o[kBallot * n] = (int)__ballot_sync(full, v > 0);
  o[kAny * n] = __any_sync(full, v > 90);
  o[kAll * n] = __all_sync(full, v > -100);
  o[kReduce * n] = __reduce_add_sync(full, v);
  o[kMatch * n] = (int)__match_any_sync(full, v & 3);
  __syncwarp();
  if (lane < 16) {
    o[kHalfXor * n] = __shfl_xor_sync(0x0000ffffu, v, 1);  // only the lower half takes part
  } else {
    o[kHalfXor * n] = -v;
  }
  o[kActive * n] = (int)__activemask();
  o[kCount * n] = __syncthreads_count(v > 0);
}

extern "C" int run_warp_ops(void** buffers, const long long* ints) {
  BLOCKC_LAUNCH(warp_ops, 1, (int)ints[0], 0, 0, (const int*)buffers[0], (int*)buffers[1]);
  return (int)cudaGetLastError();
}
