// Row sums: one block per row, 256 threads. Each warp reduces with
// __shfl_xor_sync; the 8 warp sums meet in shared memory and are reduced by
// the first warp with __shfl_down_sync in two halves of width 16.
#include <cuda_runtime.h>

constexpr int kThreads = 256;

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__global__ void __launch_bounds__(kThreads) row_sum(const float* __restrict__ x, float* __restrict__ out, int cols) {
  __shared__ float warp_sums[kThreads / 32];
  const float* row = x + (size_t)blockIdx.x * cols;
  float v = 0.0f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) v += row[c];
  v = warp_sum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    // 8 partial sums in lanes 0..7, zeros elsewhere; each 16-lane half reduces alone.
    float s = lane < kThreads / 32 ? warp_sums[lane] : 0.0f;
    for (int offset = 8; offset > 0; offset >>= 1) s += __shfl_down_sync(0xffffffffu, s, offset, 16);
    // Lane 0 holds the sum of lanes 0..15; lane 16 the sum of 16..31 (all zeros).
    float other = __shfl_sync(0xffffffffu, s, 16);
    if (lane == 0) out[blockIdx.x] = s + other;
  }
}

extern "C" int run_row_sum(void** buffers, const long long* scalars) {
  const int rows = (int)scalars[0], cols = (int)scalars[1];
  BLOCKC_LAUNCH(row_sum, rows, kThreads, 0, 0, (const float*)buffers[0], (float*)buffers[1], cols);
  return (int)cudaGetLastError();
}
