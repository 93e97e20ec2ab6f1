// half and bfloat16 through NVIDIA's own headers: per row, a dot product of a
// half row with a bfloat16 row accumulated in float, and an elementwise
// y = hsqrt(|a|) * b + hexp(a) written back in half and in bfloat16.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

constexpr int kThreads = 64;

__global__ void mixed_precision(const __half* __restrict__ a, const __nv_bfloat16* __restrict__ b, int cols,
                                float* __restrict__ dots, __half* __restrict__ y_half,
                                __nv_bfloat16* __restrict__ y_bf16) {
  __shared__ float partial[kThreads / 32];
  const size_t base = (size_t)blockIdx.x * cols;
  float acc = 0.0f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    const __half ah = a[base + c];
    const __nv_bfloat16 bb = b[base + c];
    acc += __half2float(ah) * __bfloat162float(bb);
    const __half bh = __float2half_rn(__bfloat162float(bb));
    y_half[base + c] = __hadd(__hmul(hsqrt(__habs(ah)), bh), hexp(ah));
    const __nv_bfloat16 ab = __float2bfloat16_rn(__half2float(ah));
    y_bf16[base + c] = __hfma(hsqrt(__habs(ab)), bb, hexp(ab));
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) dots[blockIdx.x] = partial[0] + partial[1];
}

extern "C" int run_mixed_precision(void** buffers, const long long* ints) {
  const int rows = (int)ints[0], cols = (int)ints[1];
  BLOCKC_LAUNCH(mixed_precision, rows, kThreads, 0, 0, (const __half*)buffers[0], (const __nv_bfloat16*)buffers[1],
                cols, (float*)buffers[2], (__half*)buffers[3], (__nv_bfloat16*)buffers[4]);
  return (int)cudaGetLastError();
}
