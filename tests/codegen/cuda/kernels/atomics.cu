// Global atomics: a histogram (atomicAdd int), a float sum (atomicAdd float),
// the maximum (atomicMax int), a first-writer flag (atomicCAS) and a counter
// that hands out slots (atomicAdd unsigned + atomicExch).
#include <cuda_runtime.h>

__global__ void histogram_stats(const int* __restrict__ values, int n, int bins, int* __restrict__ hist,
                                float* __restrict__ sum, int* __restrict__ max_value, int* __restrict__ first,
                                unsigned* __restrict__ slots, int* __restrict__ order) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int v = values[i];
  atomicAdd(&hist[v % bins], 1);
  atomicAdd(sum, 0.5f * (float)v);
  atomicMax(max_value, v);
  atomicCAS(first, -1, i == 0 ? 0 : -1);  // only element 0 may claim it
  const unsigned slot = atomicAdd(slots, 1u);
  atomicExch(&order[slot], v);
}

extern "C" int run_histogram(void** buffers, const long long* ints) {
  const int n = (int)ints[0], bins = (int)ints[1];
  BLOCKC_LAUNCH(histogram_stats, (n + 127) / 128, 128, 0, 0, (const int*)buffers[0], n, bins, (int*)buffers[1],
                (float*)buffers[2], (int*)buffers[3], (int*)buffers[4], (unsigned*)buffers[5], (int*)buffers[6]);
  return (int)cudaGetLastError();
}
