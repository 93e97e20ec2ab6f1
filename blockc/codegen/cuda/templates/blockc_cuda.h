// blockc_cuda.h: the small runtime every generated file includes.
// Under nvcc it maps onto the CUDA runtime; compiled with -DBLOCKC_EMULATE by
// g++ it maps onto blockc's CPU emulation header, so the same source runs on
// machines with no GPU.
#pragma once

#ifdef BLOCKC_EMULATE
#include "cuda_emu.h"
#else
#include <cuda_runtime.h>
#endif
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#ifndef BLOCKC_LAUNCH
#define BLOCKC_LAUNCH(kernel, grid, block, shmem, stream, ...) \
  kernel<<<(grid), (block), (shmem), (stream)>>>(__VA_ARGS__)
#endif

// ---- storage <-> compute types: float math for every float storage type ----
__device__ __forceinline__ float blockc_to_compute(float x) { return x; }
__device__ __forceinline__ float blockc_to_compute(__half x) { return __half2float(x); }
__device__ __forceinline__ float blockc_to_compute(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ bool blockc_to_compute(bool x) { return x; }
__device__ __forceinline__ long long blockc_to_compute(long long x) { return x; }
__device__ __forceinline__ long long blockc_to_compute(int x) { return x; }

template <typename T> __device__ __forceinline__ T blockc_from_compute(float x);
template <> __device__ __forceinline__ float blockc_from_compute<float>(float x) { return x; }
template <> __device__ __forceinline__ __half blockc_from_compute<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 blockc_from_compute<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <typename T> __device__ __forceinline__ T blockc_from_compute(bool x) { return (T)x; }
template <typename T> __device__ __forceinline__ T blockc_from_compute(long long x) { return (T)x; }

// ---- activations ----
__device__ __forceinline__ float blockc_gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
__device__ __forceinline__ float blockc_gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
}

// ---- reductions: warp shuffles, then shared memory across warps ----
// Over float (the floats' compute type) or long long (the integers').
struct BlockcSum {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct BlockcMax {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
  __device__ __forceinline__ long long operator()(long long a, long long b) const { return a > b ? a : b; }
};
// The max of reduce_max, numpy's and ONNX's: a NaN in the operands is the result
// (fmaxf, which the softmax kernels use, would skip it).
struct BlockcNanMax {
  __device__ __forceinline__ float operator()(float a, float b) const { return (a > b || a != a) ? a : b; }
  __device__ __forceinline__ long long operator()(long long a, long long b) const { return a > b ? a : b; }
};

// Over the G lanes (a power of two up to 32) of an aligned group of a warp.
// The shuffles name only the group's own lanes, so where short rows share a
// warp, a group whose row is past the end may leave while the others reduce.
template <int G, typename T, typename Op>
__device__ __forceinline__ T blockc_group_reduce(T v, Op op) {
  const unsigned mask = (0xffffffffu >> (32 - G)) << ((threadIdx.x & 31) & ~(G - 1));
#pragma unroll
  for (int offset = G / 2; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(mask, v, offset));
  return v;
}

template <typename T, typename Op>
__device__ __forceinline__ T blockc_warp_reduce(T v, Op op) {
  return blockc_group_reduce<32>(v, op);
}

// Every thread of the block gets the result. `scratch` holds 32 values.
template <typename T, typename Op>
__device__ __forceinline__ T blockc_block_reduce(T v, Op op, T identity, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = blockc_warp_reduce(v, op);
  __syncthreads();  // scratch may still be read from a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : identity;
  return blockc_warp_reduce(v, op);
}

#define BLOCKC_CUDA_CHECK(call)                                                     \
  do {                                                                              \
    cudaError_t blockc_err_ = (call);                                               \
    if (blockc_err_ != cudaSuccess) {                                               \
      blockc_set_error("%s: %s", #call, cudaGetErrorString(blockc_err_));            \
      return 1;                                                                     \
    }                                                                               \
  } while (0)

// ---- 128-bit vector loads and stores: 4 floats or 8 halves per access ----
template <typename T>
struct BlockcVec {
  static constexpr int N = 16 / sizeof(T);
};

// Lanes of a 128-bit word are taken apart with shifts and bit casts, never by
// taking the word's address: that would push it to local memory (a spill).
__device__ __forceinline__ void blockc_load_vec(const float* __restrict__ p, float* out) {
  const float4 r = *reinterpret_cast<const float4*>(p);  // one 128-bit load
  out[0] = r.x;
  out[1] = r.y;
  out[2] = r.z;
  out[3] = r.w;
}
// Stores go through __stwb (st.global.wb, the default store) because it is one
// 128-bit instruction however it is placed: a float4 assigned through a cast
// pointer leaves nvcc four field stores to join again, and in the softmax
// kernels' first pack it did not (the PTX held four st.global.f32).
__device__ __forceinline__ void blockc_store_vec(float* __restrict__ p, const float* in) {
  __stwb(reinterpret_cast<float4*>(p), make_float4(in[0], in[1], in[2], in[3]));  // one 128-bit store
}

__device__ __forceinline__ float blockc_lo_to_float(unsigned w, __half) { return __half2float(__ushort_as_half((unsigned short)(w & 0xffffu))); }
__device__ __forceinline__ float blockc_hi_to_float(unsigned w, __half) { return __half2float(__ushort_as_half((unsigned short)(w >> 16))); }
__device__ __forceinline__ float blockc_lo_to_float(unsigned w, __nv_bfloat16) {
  return __bfloat162float(__ushort_as_bfloat16((unsigned short)(w & 0xffffu)));
}
__device__ __forceinline__ float blockc_hi_to_float(unsigned w, __nv_bfloat16) {
  return __bfloat162float(__ushort_as_bfloat16((unsigned short)(w >> 16)));
}
__device__ __forceinline__ unsigned blockc_pack2(float lo, float hi, __half) {
  return (unsigned)__half_as_ushort(__float2half_rn(lo)) | ((unsigned)__half_as_ushort(__float2half_rn(hi)) << 16);
}
__device__ __forceinline__ unsigned blockc_pack2(float lo, float hi, __nv_bfloat16) {
  return (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
         ((unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16);
}

template <typename T>  // __half or __nv_bfloat16: 8 per 128 bits
__device__ __forceinline__ void blockc_load_vec(const T* __restrict__ p, float* out) {
  const uint4 r = *reinterpret_cast<const uint4*>(p);  // one 128-bit load
  const unsigned w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    out[2 * k] = blockc_lo_to_float(w[k], T());
    out[2 * k + 1] = blockc_hi_to_float(w[k], T());
  }
}
template <typename T>
__device__ __forceinline__ void blockc_store_vec(T* __restrict__ p, const float* in) {
  __stwb(reinterpret_cast<uint4*>(p), make_uint4(blockc_pack2(in[0], in[1], T()), blockc_pack2(in[2], in[3], T()),
                                                 blockc_pack2(in[4], in[5], T()), blockc_pack2(in[6], in[7], T())));
}

__host__ __device__ __forceinline__ bool blockc_aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// Whether q sits as far past a 16-byte boundary as p does: then the columns
// that are 128-bit aligned in a row at p are aligned in a row at q too.
__host__ __device__ __forceinline__ bool blockc_same_phase(const void* p, const void* q) {
  return ((reinterpret_cast<uintptr_t>(p) ^ reinterpret_cast<uintptr_t>(q)) & 15u) == 0;
}

// N = BlockcVec<T>::N elements at p: one 128-bit access where `vec` (p is on
// 16 bytes), else N scalar ones.
template <typename T>
__device__ __forceinline__ void blockc_load_pack(const T* __restrict__ p, float* out, bool vec) {
  if (vec) {
    blockc_load_vec(p, out);
  } else {
#pragma unroll
    for (int k = 0; k < BlockcVec<T>::N; ++k) out[k] = blockc_to_compute(p[k]);
  }
}
template <typename T>
__device__ __forceinline__ void blockc_store_pack(T* __restrict__ p, const float* in, bool vec) {
  if (vec) {
    blockc_store_vec(p, in);
  } else {
#pragma unroll
    for (int k = 0; k < BlockcVec<T>::N; ++k) p[k] = blockc_from_compute<T>(in[k]);
  }
}

// A row of n elements at p, cut for 128-bit access: `head` elements up to its
// first 16-byte boundary, `body` whole vectors of N, then the tail. A row whose
// length is not a multiple of N starts anywhere in a vector, so the cut is made
// per row, from the row's address. Head and tail are the row's `edges` (fewer
// than 2N); edge k is column k in the head, column k + body * N in the tail.
template <typename T>
struct BlockcRowSplit {
  static constexpr int N = BlockcVec<T>::N;
  int head, body, edges;
  __device__ __forceinline__ BlockcRowSplit(const T* p, int n) {
    head = (int)(((16u - (reinterpret_cast<uintptr_t>(p) & 15u)) & 15u) / sizeof(T));
    if (head > n) head = n;
    body = (n - head) / N;
    edges = n - body * N;
  }
  __device__ __forceinline__ int edge_col(int k) const { return k < head ? k : k + body * N; }
};

// A row cached as float in a block's dynamic shared memory: 32 floats of
// scratch for blockc_block_reduce, up to 3 more so that column `head` (where
// the row's vectors start, BlockcRowSplit) lands on 16 bytes, then the row.
// Each thread reads back only the vectors it stored, so the passes over the
// cache need no barrier of their own.
__host__ __device__ __forceinline__ size_t blockc_row_cache_bytes(int cols) {
  return (32 + 3 + (size_t)cols) * sizeof(float);
}
__device__ __forceinline__ float* blockc_row_cache(float* smem, int head) { return smem + 32 + (4 - head % 4) % 4; }
// About four vectors of the row a thread: enough work to pay for the block's
// reductions, and up to 1024 threads, so that a long row has loads in flight.
inline int blockc_row_cache_threads(int cols, int vec) {
  int threads = 128;
  while (threads < 1024 && threads * 4 * vec < cols) threads *= 2;
  return threads;
}
// N floats (a multiple of 4) at p in shared memory, on 16 bytes.
template <int N>
__device__ __forceinline__ void blockc_store_floats(float* p, const float* in) {
#pragma unroll
  for (int k = 0; k < N; k += 4) *reinterpret_cast<float4*>(p + k) = make_float4(in[k], in[k + 1], in[k + 2], in[k + 3]);
}
template <int N>
__device__ __forceinline__ void blockc_load_floats(const float* p, float* out) {
#pragma unroll
  for (int k = 0; k < N; k += 4) {
    const float4 r = *reinterpret_cast<const float4*>(p + k);
    out[k] = r.x;
    out[k + 1] = r.y;
    out[k + 2] = r.z;
    out[k + 3] = r.w;
  }
}

// The dynamic shared memory a block of `kernel` may use: the device's opt-in
// limit (227 KiB on sm_90, 163 KiB on sm_80), which this asks for on `kernel`,
// else the 48 KiB every kernel has. Launchers ask once and keep the answer,
// which assumes a process runs its models on one kind of device.
template <typename K>
inline size_t blockc_dynamic_shared_limit(K* kernel) {
  int device = 0, optin = 0;
  if (cudaGetDevice(&device) == cudaSuccess &&
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) == cudaSuccess &&
      optin > 48 * 1024) {
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin) == cudaSuccess)
      return (size_t)optin;
    (void)cudaGetLastError();  // refused: the default limit stands, and the model's run is no worse for it
  }
  return 48 * 1024;
}

// How many blocks a grid may have along y and along z (65,535 on every GPU
// so far), asked once.
inline long long blockc_max_grid_yz() {
  static const long long limit = [] {
    int device = 0, y = 0, z = 0;
    if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&y, cudaDevAttrMaxGridDimY, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&z, cudaDevAttrMaxGridDimZ, device) != cudaSuccess || y <= 0 || z <= 0) {
      (void)cudaGetLastError();
      return 65535LL;
    }
    return (long long)(y < z ? y : z);
  }();
  return limit;
}

// `count` pieces of work (the tiled GEMM's row tiles x batch x heads) may pass
// what one grid axis allows: the launch spreads them over y and z, each within
// `most`, and every block takes the indices blockc_yz_first(), + blockc_yz_step(),
// ... below count, so a rest past y x z is still covered, each index once.
inline dim3 blockc_grid_yz(unsigned x, long long count, long long most) {
  const long long z = (count + most - 1) / most < most ? (count + most - 1) / most : most;
  const long long y = (count + z - 1) / z < most ? (count + z - 1) / z : most;
  return dim3(x, (unsigned)y, (unsigned)z);
}
inline dim3 blockc_grid_yz(unsigned x, long long count) { return blockc_grid_yz(x, count, blockc_max_grid_yz()); }
__device__ __forceinline__ long long blockc_yz_first() { return blockIdx.y + (long long)gridDim.y * blockIdx.z; }
__device__ __forceinline__ long long blockc_yz_step() { return (long long)gridDim.y * gridDim.z; }

// ---- tensor cores (sm_80+): cp.async, ldmatrix and mma.sync m16n8k16 ----
// A device pass for sm_80 or later defines them as inline PTX, the emulator
// as the C++ below; kernels that use them guard their bodies the same way
// (BLOCKC_TENSOR_CORE_CODE).
#if (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800) || (defined(BLOCKC_EMU) && BLOCKC_EMU)
#define BLOCKC_TENSOR_CORE_CODE 1
#else
#define BLOCKC_TENSOR_CORE_CODE 0
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
// One 16-byte cp.async into shared memory: from `src`, or zeros where !ok
// (a source size of 0 reads nothing); a group is committed after a batch.
__device__ __forceinline__ void blockc_cp_async16(void* dst, const void* src, bool ok) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void blockc_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void blockc_cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::); }

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i.
__device__ __forceinline__ void blockc_ldmatrix_x4(unsigned (&r)[4], const void* p) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
__device__ __forceinline__ void blockc_ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}

// c += a (16x16, row-major fragment) * b (16x8, column-major fragment), float32 accumulation.
template <typename T> __device__ __forceinline__ void blockc_mma_16816(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1);
template <> __device__ __forceinline__ void blockc_mma_16816<__half>(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                                                     unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <> __device__ __forceinline__ void blockc_mma_16816<__nv_bfloat16>(float (&c)[4], const unsigned (&a)[4],
                                                                            unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#elif defined(BLOCKC_EMU) && BLOCKC_EMU
// The same operations emulated (the emulator runs no inline PTX), so the
// tensor-core kernels run on the CPU against the reference. cp.async is a
// synchronous 16-byte copy, which the kernel's wait and barrier then order as
// on a GPU. ldmatrix and mma.sync are warp-collective through shuffles, with
// the fragment layouts of the PTX ISA (a lane's group g = lane / 4 and index
// t = lane % 4): ldmatrix gives lane i the elements (i / 4, 2(i % 4) + {0, 1})
// of each 8x8 matrix whose rows lanes 8j..8j+7 address (.trans: their
// transpose); mma.m16n8k16's A fragment holds A[g][2t..], A[g+8][2t..],
// A[g][2t+8..], A[g+8][2t+8..], its B fragment B[2t..][g], B[2t+8..][g], and
// its accumulator C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1]. Products
// and sums are float32 (a tensor core's order of summation may differ).
__device__ __forceinline__ void blockc_cp_async16(void* dst, const void* src, bool ok) {
  unsigned* d = static_cast<unsigned*>(dst);
  const unsigned* from = static_cast<const unsigned*>(src);
  for (int w = 0; w < 4; ++w) d[w] = ok ? from[w] : 0u;  // word by word: the race checker sees each store
}
__device__ __forceinline__ void blockc_cp_async_commit() {}
__device__ __forceinline__ void blockc_cp_async_wait_all() {}

__device__ __forceinline__ void blockc_ldmatrix_x4(unsigned (&r)[4], const void* p) {
  const int lane = threadIdx.x & 31;
  for (int j = 0; j < 4; ++j) {
    const unsigned short* row = static_cast<const unsigned short*>(__shfl_sync(0xffffffffu, p, 8 * j + lane / 4));
    r[j] = (unsigned)row[2 * (lane % 4)] | ((unsigned)row[2 * (lane % 4) + 1] << 16);
  }
}
__device__ __forceinline__ void blockc_ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
  const int lane = threadIdx.x & 31;
  for (int j = 0; j < 4; ++j) {
    const unsigned short* lo = static_cast<const unsigned short*>(__shfl_sync(0xffffffffu, p, 8 * j + 2 * (lane % 4)));
    const unsigned short* hi =
        static_cast<const unsigned short*>(__shfl_sync(0xffffffffu, p, 8 * j + 2 * (lane % 4) + 1));
    r[j] = (unsigned)lo[lane / 4] | ((unsigned)hi[lane / 4] << 16);
  }
}

__device__ __forceinline__ float blockc_emu_b16(unsigned bits, __half) { return __half2float(__ushort_as_half((unsigned short)bits)); }
__device__ __forceinline__ float blockc_emu_b16(unsigned bits, __nv_bfloat16) {
  return __bfloat162float(__ushort_as_bfloat16((unsigned short)bits));
}
template <typename T>
__device__ __forceinline__ void blockc_mma_16816(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  const int lane = threadIdx.x & 31, t = lane & 3;
  float arow[2][16], bcol[2][16];  // rows g and g + 8 of A; columns 2t and 2t + 1 of B
  for (int j = 0; j < 4; ++j) {    // lane j of a quad holds columns (rows of B) 2j, 2j + 1, 2j + 8, 2j + 9
    unsigned x[4];
    for (int i = 0; i < 4; ++i) x[i] = __shfl_sync(0xffffffffu, a[i], (lane & ~3) + j);
    for (int h = 0; h < 2; ++h) {
      arow[h][2 * j] = blockc_emu_b16(x[h] & 0xffffu, T());
      arow[h][2 * j + 1] = blockc_emu_b16(x[h] >> 16, T());
      arow[h][2 * j + 8] = blockc_emu_b16(x[h + 2] & 0xffffu, T());
      arow[h][2 * j + 9] = blockc_emu_b16(x[h + 2] >> 16, T());
    }
    for (int e = 0; e < 2; ++e) {  // column 2t + e of B lies in the quad of lanes 4(2t + e)..
      const unsigned y0 = __shfl_sync(0xffffffffu, b0, 4 * (2 * t + e) + j);
      const unsigned y1 = __shfl_sync(0xffffffffu, b1, 4 * (2 * t + e) + j);
      bcol[e][2 * j] = blockc_emu_b16(y0 & 0xffffu, T());
      bcol[e][2 * j + 1] = blockc_emu_b16(y0 >> 16, T());
      bcol[e][2 * j + 8] = blockc_emu_b16(y1 & 0xffffu, T());
      bcol[e][2 * j + 9] = blockc_emu_b16(y1 >> 16, T());
    }
  }
  for (int h = 0; h < 2; ++h) {
    for (int e = 0; e < 2; ++e) {
      float sum = 0.0f;
      for (int k = 0; k < 16; ++k) sum += arow[h][k] * bcol[e][k];
      c[2 * h + e] += sum;
    }
  }
}
#endif
#if BLOCKC_TENSOR_CORE_CODE
// Rows [r0, r0 + ROWS) of a [len, D] operand (row stride `stride`) into shared
// rows of `ld` elements, 16 bytes per cp.async; rows past `len` are zero-filled.
// Commits one group.
template <int ROWS, int D, typename T>
__device__ __forceinline__ void blockc_cp_async_rows(T* dst, int ld, const T* src, long long stride, long long r0,
                                                     long long len) {
  constexpr int E = 16 / (int)sizeof(T), CHUNKS = D / E;
  for (int e = threadIdx.x; e < ROWS * CHUNKS; e += blockDim.x) {
    const int r = e / CHUNKS, c = (e % CHUNKS) * E;
    const bool ok = r0 + r < len;
    blockc_cp_async16(dst + r * ld + c, ok ? src + (r0 + r) * stride + c : src, ok);
  }
  blockc_cp_async_commit();
}
#endif
