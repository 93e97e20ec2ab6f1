// Dynamic shared memory, declared at block scope and at file scope: each block
// reverses its chunk of the input through `extern __shared__` buffers.
#include <cuda_runtime.h>

extern __shared__ __align__(16) float file_scope_tile[];

__global__ void reverse_chunks(const float* __restrict__ x, float* __restrict__ y, int n) {
  extern __shared__ float tile[];
  const int base = blockIdx.x * blockDim.x, i = base + threadIdx.x;
  tile[threadIdx.x] = i < n ? x[i] : 0.0f;
  __syncthreads();
  const int j = base + (blockDim.x - 1 - threadIdx.x);
  if (j < n) y[j] = tile[threadIdx.x];
}

// Two arrays carved from one dynamic allocation: x*2 and x+1 per element.
__global__ void carve(const float* __restrict__ x, float* __restrict__ y, int n) {
  float* twice = file_scope_tile;
  float* plus = file_scope_tile + blockDim.x;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const float v = i < n ? x[i] : 0.0f;
  twice[threadIdx.x] = 2.0f * v;
  plus[blockDim.x - 1 - threadIdx.x] = v + 1.0f;
  __syncthreads();
  if (i < n) y[i] = twice[threadIdx.x] + plus[blockDim.x - 1 - threadIdx.x];
}

extern "C" int run_reverse_chunks(void** buffers, const long long* ints) {
  const int n = (int)ints[0], block = (int)ints[1];
  BLOCKC_LAUNCH(reverse_chunks, (n + block - 1) / block, block, block * sizeof(float), 0,
                (const float*)buffers[0], (float*)buffers[1], n);
  return (int)cudaGetLastError();
}

extern "C" int run_carve(void** buffers, const long long* ints) {
  const int n = (int)ints[0], block = (int)ints[1];
  BLOCKC_LAUNCH(carve, (n + block - 1) / block, block, 2 * block * sizeof(float), 0,
                (const float*)buffers[0], (float*)buffers[1], n);
  return (int)cudaGetLastError();
}

// 64 KiB of dynamic shared memory: refused unless the kernel's limit is raised.
extern "C" int run_big_shared(void** buffers, const long long* ints) {
  const int n = (int)ints[0], raise_limit = (int)ints[1];
  if (raise_limit) cudaFuncSetAttribute(reverse_chunks, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024);
  BLOCKC_LAUNCH(reverse_chunks, 1, 256, 64 * 1024, 0, (const float*)buffers[0], (float*)buffers[1], n);
  return (int)cudaGetLastError();
}
