// Broken kernels the emulator must diagnose (they compile cleanly with nvcc).
#include <cuda_runtime.h>

// Only the first 64 threads reach the barrier; the others return.
__global__ void partial_barrier(float* x) {
  if (threadIdx.x < 64) {
    x[threadIdx.x] += 1.0f;
    __syncthreads();
  }
}

// A full-mask shuffle that half of the warp never reaches.
__global__ void divergent_shuffle(float* x) {
  float v = x[threadIdx.x];
  if (threadIdx.x % 32 < 16) v = __shfl_sync(0xffffffffu, v, 0);
  x[threadIdx.x] = v;
}

// Writes one element past a 64-float shared array when blockDim.x > 64.
__global__ void shared_overflow(const float* __restrict__ x, float* __restrict__ y) {
  __shared__ float buf[64];
  buf[threadIdx.x] = x[threadIdx.x];
  __syncthreads();
  if (threadIdx.x < 64) y[threadIdx.x] = buf[63 - threadIdx.x];
}

// Reads a neighbour's shared element without the barrier between write and read.
__global__ void shared_race(const float* __restrict__ x, float* __restrict__ y) {
  __shared__ float buf[128];
  buf[threadIdx.x] = x[threadIdx.x];
  y[threadIdx.x] = buf[(threadIdx.x + 1) % blockDim.x];  // missing __syncthreads()
}

extern "C" int run_partial_barrier(void** buffers, const long long*) {
  BLOCKC_LAUNCH(partial_barrier, 2, 128, 0, 0, (float*)buffers[0]);
  return (int)cudaGetLastError();
}
extern "C" int run_divergent_shuffle(void** buffers, const long long*) {
  BLOCKC_LAUNCH(divergent_shuffle, 1, 64, 0, 0, (float*)buffers[0]);
  return (int)cudaGetLastError();
}
extern "C" int run_shared_overflow(void** buffers, const long long* ints) {
  BLOCKC_LAUNCH(shared_overflow, 1, (int)ints[0], 0, 0, (const float*)buffers[0], (float*)buffers[1]);
  return (int)cudaGetLastError();
}
extern "C" int run_shared_race(void** buffers, const long long*) {
  BLOCKC_LAUNCH(shared_race, 1, 128, 0, 0, (const float*)buffers[0], (float*)buffers[1]);
  return (int)cudaGetLastError();
}

// Thread 3 writes far outside any allocation.
__global__ void wild_write(float* x, long long offset) {
  if (threadIdx.x == 3) x[offset] = 1.0f;
}

// A 256 KiB local array: more than a fiber's 64 KiB stack.
__global__ void stack_hog(float* x) {
  volatile float local[65536];
  for (int i = 0; i < 65536; i += 1024) local[i] = x[threadIdx.x];
  x[threadIdx.x] = local[threadIdx.x * 1024];
}

// Thread 0 waits for a flag nobody sets.
__global__ void spin_forever(int* flag) {
  while (atomicAdd(flag, 0) == 0) {
  }
}

extern "C" int run_wild_write(void** buffers, const long long* ints) {
  BLOCKC_LAUNCH(wild_write, 1, 32, 0, 0, (float*)buffers[0], ints[0]);
  return (int)cudaGetLastError();
}
extern "C" int run_stack_hog(void** buffers, const long long*) {
  BLOCKC_LAUNCH(stack_hog, 1, 32, 0, 0, (float*)buffers[0]);
  return (int)cudaGetLastError();
}
extern "C" int run_spin_forever(void** buffers, const long long*) {
  BLOCKC_LAUNCH(spin_forever, 1, 1, 0, 0, (int*)buffers[0]);
  return (int)cudaGetLastError();
}

// The two halves of the block meet at different __syncthreads.
__global__ void split_barrier(float* x) {
  if (threadIdx.x < 32) {
    __syncthreads();
  } else {
    x[threadIdx.x] = 1.0f;
    __syncthreads();
  }
}

extern "C" int run_split_barrier(void** buffers, const long long*) {
  BLOCKC_LAUNCH(split_barrier, 1, 64, 0, 0, (float*)buffers[0]);
  return (int)cudaGetLastError();
}
