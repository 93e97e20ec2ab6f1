// Shared memory as the race checker sees it: correct kernels it must pass,
// and kernels whose bugs it must name (faults.cu's shared_race is another).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

// faults.cu's shared_race with its barrier (unless `barrier` is 0), on a
// file-scope array: each thread reads its neighbour's element.
__shared__ float ring[128];

__global__ void shared_ring(const float* __restrict__ x, float* __restrict__ y, int barrier) {
  ring[threadIdx.x] = x[threadIdx.x];
  if (barrier) __syncthreads();
  y[threadIdx.x] = ring[(threadIdx.x + 1) % blockDim.x];
}

// Only block 0 writes `total`; every block reads it (block 1 reads what block 0 left).
__global__ void stale_shared(float* y) {
  __shared__ float total;
  if (blockIdx.x == 0 && threadIdx.x == 0) total = 1.0f;
  __syncthreads();
  y[blockIdx.x * blockDim.x + threadIdx.x] = total;
}

// Lanes hand values to their neighbour through shared memory; `how` orders the
// write before the read: 0 nothing, 1 __syncwarp, 2 a shuffle (which does not order memory).
__global__ void warp_handoff(float* y, int how) {
  __shared__ float slot[32];
  const int lane = threadIdx.x;
  slot[lane] = (float)lane;
  if (how == 1) __syncwarp();
  if (how == 2) y[lane] = __shfl_sync(0xffffffffu, y[lane], 0);
  y[lane] = slot[(lane + 1) % 32];
}

// Every thread counts into shared memory with atomics, then thread 0 reads the
// total after the barrier: atomics do not race with atomics.
__global__ void shared_count(const int* __restrict__ flags, int* __restrict__ out) {
  __shared__ int count;
  if (threadIdx.x == 0) count = 0;
  __syncthreads();
  if (flags[blockIdx.x * blockDim.x + threadIdx.x]) atomicAdd(&count, 1);
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x] = count;
}

// Half-precision neighbours share 4-byte words: distinct bytes are not a race.
__global__ void half_pairs(const __half* __restrict__ x, __half* __restrict__ y) {
  __shared__ __half h[64];
  h[threadIdx.x] = x[threadIdx.x];
  __syncthreads();
  y[threadIdx.x] = h[threadIdx.x ^ 1];
}

extern "C" int run_shared_ring(void** buffers, const long long* ints) {
  BLOCKC_LAUNCH(shared_ring, 1, 128, 0, 0, (const float*)buffers[0], (float*)buffers[1], (int)ints[0]);
  return (int)cudaGetLastError();
}
extern "C" int run_stale_shared(void** buffers, const long long*) {
  BLOCKC_LAUNCH(stale_shared, 2, 32, 0, 0, (float*)buffers[0]);
  return (int)cudaGetLastError();
}
extern "C" int run_warp_handoff(void** buffers, const long long* ints) {
  BLOCKC_LAUNCH(warp_handoff, 1, 32, 0, 0, (float*)buffers[0], (int)ints[0]);
  return (int)cudaGetLastError();
}
extern "C" int run_shared_count(void** buffers, const long long*) {
  BLOCKC_LAUNCH(shared_count, 2, 64, 0, 0, (const int*)buffers[0], (int*)buffers[1]);
  return (int)cudaGetLastError();
}
extern "C" int run_half_pairs(void** buffers, const long long*) {
  BLOCKC_LAUNCH(half_pairs, 1, 64, 0, 0, (const __half*)buffers[0], (__half*)buffers[1]);
  return (int)cudaGetLastError();
}
