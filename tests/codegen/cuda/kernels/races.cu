// Shared memory that behaves like a GPU's: a block never reads another block's values.
#include <cuda_runtime.h>

// Only block 0 writes `total`; every block reads it (block 1 reads what block 0 left).
__global__ void stale_shared(float* y) {
  __shared__ float total;
  if (blockIdx.x == 0 && threadIdx.x == 0) total = 1.0f;
  __syncthreads();
  y[blockIdx.x * blockDim.x + threadIdx.x] = total;
}

extern "C" int run_stale_shared(void** buffers, const long long*) {
  BLOCKC_LAUNCH(stale_shared, 2, 32, 0, 0, (float*)buffers[0]);
  return (int)cudaGetLastError();
}
