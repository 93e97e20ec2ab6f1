// Row softmax, one block per row: float4 loads over the 16-byte-aligned body of
// the row, scalar loads for the unaligned head and the tail. Block max and sum
// go through warp shuffles and shared memory.
#include <cuda_runtime.h>
#include <stdint.h>

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;

template <bool kMax>
__device__ __forceinline__ float block_reduce(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) {
    float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, other) : v + other;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = scratch[lane % kWarps];
  for (int o = kWarps / 2; o > 0; o >>= 1) {
    float other = __shfl_xor_sync(0xffffffffu, v, o, kWarps);
    v = kMax ? fmaxf(v, other) : v + other;
  }
  __syncthreads();  // scratch is reused by the next reduction
  return v;
}

__global__ void __launch_bounds__(kThreads) softmax_rows(const float* __restrict__ x, float* __restrict__ y, int cols) {
  __shared__ float scratch[kWarps];
  const float* row = x + (size_t)blockIdx.x * cols;
  float* out = y + (size_t)blockIdx.x * cols;
  // Elements before the first 16-byte boundary, then whole float4s, then the rest.
  int head = (int)(((16 - ((uintptr_t)row & 15)) & 15) / sizeof(float));
  if (head > cols) head = cols;
  const int body = (cols - head) / 4;
  const float4* row4 = reinterpret_cast<const float4*>(row + head);

  float m = -INFINITY;
  for (int c = threadIdx.x; c < head; c += blockDim.x) m = fmaxf(m, row[c]);
  for (int i = threadIdx.x; i < body; i += blockDim.x) {
    float4 v = row4[i];
    m = fmaxf(fmaxf(m, fmaxf(v.x, v.y)), fmaxf(v.z, v.w));
  }
  for (int c = head + 4 * body + threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, row[c]);
  m = block_reduce<true>(m, scratch);

  float s = 0.0f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) s += __expf(row[c] - m);
  s = block_reduce<false>(s, scratch);
  const float inv = __frcp_rn(s);

  for (int c = threadIdx.x; c < head; c += blockDim.x) out[c] = __expf(row[c] - m) * inv;
  float4* out4 = reinterpret_cast<float4*>(out + head);
  const bool out_aligned = ((uintptr_t)(out + head) & 15) == 0;
  for (int i = threadIdx.x; i < body; i += blockDim.x) {
    float4 v = row4[i];
    float4 r = make_float4(__expf(v.x - m) * inv, __expf(v.y - m) * inv, __expf(v.z - m) * inv, __expf(v.w - m) * inv);
    if (out_aligned) {
      out4[i] = r;
    } else {
      float* o = out + head + 4 * i;
      o[0] = r.x; o[1] = r.y; o[2] = r.z; o[3] = r.w;
    }
  }
  for (int c = head + 4 * body + threadIdx.x; c < cols; c += blockDim.x) out[c] = __expf(row[c] - m) * inv;
}

extern "C" int run_softmax(void** buffers, const long long* ints) {
  const int rows = (int)ints[0], cols = (int)ints[1];
  BLOCKC_LAUNCH(softmax_rows, rows, kThreads, 0, 0, (const float*)buffers[0], (float*)buffers[1], cols);
  return (int)cudaGetLastError();
}
