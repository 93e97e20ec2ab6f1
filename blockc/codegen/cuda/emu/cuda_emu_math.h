// cuda_emu_math.h: device math, bit and memory intrinsics, atomics, and the
// half/bfloat16 functions that NVIDIA's headers declare only for the device.
// Included by cuda_emu.h; not meant to be included alone.
//
// glibc already declares `__expf`, `__logf` and the other `__`-prefixed libm
// names, so those intrinsics are macros onto the standard functions; the rest
// are inline functions. Fast-math intrinsics compute the precise result here,
// so emulated numerics are at least as accurate as the GPU's.
#ifndef BLOCKC_CUDA_EMU_MATH_H
#define BLOCKC_CUDA_EMU_MATH_H

// ---- float intrinsics ---------------------------------------------------------
#define __expf(x) ::expf(x)
#define __exp10f(x) ::exp10f(x)
#define __logf(x) ::logf(x)
#define __log2f(x) ::log2f(x)
#define __log10f(x) ::log10f(x)
#define __sinf(x) ::sinf(x)
#define __cosf(x) ::cosf(x)
#define __tanf(x) ::tanf(x)
#define __tanhf(x) ::tanhf(x)
#define __powf(x, y) ::powf(x, y)
#define __sincosf(x, s, c) ::sincosf(x, s, c)

inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __frsqrt_rn(float a) { return 1.0f / std::sqrt(a); }
inline float rsqrtf(float a) { return 1.0f / std::sqrt(a); }
inline double rsqrt(double a) { return 1.0 / std::sqrt(a); }
inline float rcbrtf(float a) { return 1.0f / std::cbrt(a); }
inline float __saturatef(float a) { return a < 0.0f ? 0.0f : (a > 1.0f ? 1.0f : (a == a ? a : 0.0f)); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
inline float normcdff(float x) { return 0.5f * std::erfc(-x * 0.70710678118654752f); }

// CUDA's min/max accept any mix of arithmetic types, as its device headers do.
template <class A, class B,
          class = std::enable_if_t<std::is_arithmetic<A>::value && std::is_arithmetic<B>::value>>
constexpr std::common_type_t<A, B> min(A a, B b) { return b < a ? b : a; }
template <class A, class B,
          class = std::enable_if_t<std::is_arithmetic<A>::value && std::is_arithmetic<B>::value>>
constexpr std::common_type_t<A, B> max(A a, B b) { return a < b ? b : a; }

// ---- conversions and bit casts ----------------------------------------------------
inline int __float2int_rn(float x) { return (int)std::nearbyint(x); }
inline int __float2int_rz(float x) { return (int)x; }
inline int __float2int_rd(float x) { return (int)std::floor(x); }
inline int __float2int_ru(float x) { return (int)std::ceil(x); }
inline unsigned __float2uint_rn(float x) { return (unsigned)std::nearbyint(x); }
inline unsigned __float2uint_rz(float x) { return (unsigned)x; }
inline long long __float2ll_rn(float x) { return (long long)std::nearbyint(x); }
inline long long __float2ll_rz(float x) { return (long long)x; }
inline float __int2float_rn(int x) { return (float)x; }
inline float __uint2float_rn(unsigned x) { return (float)x; }
inline float __ll2float_rn(long long x) { return (float)x; }
inline float __double2float_rn(double x) { return (float)x; }
inline int __float_as_int(float x) { int r; std::memcpy(&r, &x, 4); return r; }
inline unsigned __float_as_uint(float x) { unsigned r; std::memcpy(&r, &x, 4); return r; }
inline float __int_as_float(int x) { float r; std::memcpy(&r, &x, 4); return r; }
inline float __uint_as_float(unsigned x) { float r; std::memcpy(&r, &x, 4); return r; }
inline long long __double_as_longlong(double x) { long long r; std::memcpy(&r, &x, 8); return r; }
inline double __longlong_as_double(long long x) { double r; std::memcpy(&r, &x, 8); return r; }

// ---- integer intrinsics -----------------------------------------------------------
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
  x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
  x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
  x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
  return __builtin_bswap32(x);
}
inline int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
inline long long __mul64hi(long long a, long long b) { return (long long)(((__int128)a * b) >> 64); }
inline int __mul24(int a, int b) { return ((a << 8) >> 8) * ((b << 8) >> 8); }
inline unsigned __umul24(unsigned a, unsigned b) { return (a & 0xffffffu) * (b & 0xffffffu); }
inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned s) {
  unsigned long long v = ((unsigned long long)hi << 32) | lo;
  return (unsigned)((v << (s & 31)) >> 32);
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned s) {
  unsigned long long v = ((unsigned long long)hi << 32) | lo;
  return (unsigned)(v >> (s & 31));
}

// ---- cache-hinted loads and stores: plain memory here -----------------------------
template <class T> T __ldg(const T* p) { return *p; }
template <class T> T __ldcg(const T* p) { return *p; }
template <class T> T __ldca(const T* p) { return *p; }
template <class T> T __ldcs(const T* p) { return *p; }
template <class T> T __ldlu(const T* p) { return *p; }
template <class T> T __ldcv(const T* p) { return *p; }
template <class T> void __stcg(T* p, T v) { *p = v; }
template <class T> void __stcs(T* p, T v) { *p = v; }
template <class T> void __stwb(T* p, T v) { *p = v; }
template <class T> void __stwt(T* p, T v) { *p = v; }

// ---- atomics: __atomic builtins, so ThreadSanitizer sees them in thread mode ------
namespace blockc_emu {
template <class T, class F>
T atomic_update(T* p, F f) {  // compare-and-swap loop for what has no builtin
  T old;
  __atomic_load(p, &old, __ATOMIC_RELAXED);
  T desired;
  do { desired = f(old); } while (!__atomic_compare_exchange(p, &old, &desired, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED));
  return old;
}
}  // namespace blockc_emu

#define BLOCKC_EMU_INT_ATOMICS(T)                                                                    \
  inline T atomicAdd(T* p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }               \
  inline T atomicSub(T* p, T v) { return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST); }               \
  inline T atomicExch(T* p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }             \
  inline T atomicAnd(T* p, T v) { return __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST); }               \
  inline T atomicOr(T* p, T v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }                 \
  inline T atomicXor(T* p, T v) { return __atomic_fetch_xor(p, v, __ATOMIC_SEQ_CST); }               \
  inline T atomicMin(T* p, T v) { return blockc_emu::atomic_update(p, [v](T o) { return v < o ? v : o; }); } \
  inline T atomicMax(T* p, T v) { return blockc_emu::atomic_update(p, [v](T o) { return o < v ? v : o; }); } \
  inline T atomicCAS(T* p, T cmp, T v) {                                                             \
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);              \
    return cmp;                                                                                      \
  }
BLOCKC_EMU_INT_ATOMICS(int)
BLOCKC_EMU_INT_ATOMICS(unsigned)
BLOCKC_EMU_INT_ATOMICS(long long)
BLOCKC_EMU_INT_ATOMICS(unsigned long long)
#undef BLOCKC_EMU_INT_ATOMICS
inline unsigned short atomicCAS(unsigned short* p, unsigned short cmp, unsigned short v) {
  __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return cmp;
}
inline unsigned atomicInc(unsigned* p, unsigned v) {
  return blockc_emu::atomic_update(p, [v](unsigned o) { return o >= v ? 0u : o + 1; });
}
inline unsigned atomicDec(unsigned* p, unsigned v) {
  return blockc_emu::atomic_update(p, [v](unsigned o) { return (o == 0 || o > v) ? v : o - 1; });
}

#define BLOCKC_EMU_FLOAT_ATOMICS(T)                                                                    \
  inline T atomicAdd(T* p, T v) { return blockc_emu::atomic_update(p, [v](T o) { return T(o + v); }); } \
  inline T atomicSub(T* p, T v) { return blockc_emu::atomic_update(p, [v](T o) { return T(o - v); }); } \
  inline T atomicExch(T* p, T v) { T old; __atomic_exchange(p, &v, &old, __ATOMIC_SEQ_CST); return old; } \
  inline T atomicMin(T* p, T v) { return blockc_emu::atomic_update(p, [v](T o) { return v < o ? v : o; }); } \
  inline T atomicMax(T* p, T v) { return blockc_emu::atomic_update(p, [v](T o) { return o < v ? v : o; }); }
BLOCKC_EMU_FLOAT_ATOMICS(float)
BLOCKC_EMU_FLOAT_ATOMICS(double)
#undef BLOCKC_EMU_FLOAT_ATOMICS
inline __half atomicAdd(__half* p, __half v) {
  return blockc_emu::atomic_update(p, [v](__half o) { return __float2half(__half2float(o) + __half2float(v)); });
}
inline __nv_bfloat16 atomicAdd(__nv_bfloat16* p, __nv_bfloat16 v) {
  return blockc_emu::atomic_update(
      p, [v](__nv_bfloat16 o) { return __float2bfloat16(__bfloat162float(o) + __bfloat162float(v)); });
}
inline __half2 atomicAdd(__half2* p, __half2 v) {
  return blockc_emu::atomic_update(p, [v](__half2 o) { return __hadd2(o, v); });
}
inline __nv_bfloat162 atomicAdd(__nv_bfloat162* p, __nv_bfloat162 v) {
  return blockc_emu::atomic_update(p, [v](__nv_bfloat162 o) { return __hadd2(o, v); });
}
#define atomicAdd_block atomicAdd
#define atomicAdd_system atomicAdd
#define atomicMax_block atomicMax
#define atomicMin_block atomicMin
#define atomicExch_block atomicExch
#define atomicCAS_block atomicCAS

// ---- half and bfloat16 functions missing from the host side of NVIDIA's headers ---
// Computed in float and rounded once, as the GPU's own implementations are
// accurate to within that rounding.
#define BLOCKC_EMU_LOWP_MATH(H, H2, to_f, from_f, f2_to, f2_from)                       \
  inline H hexp(H a) { return from_f(std::exp(to_f(a))); }                                \
  inline H hexp2(H a) { return from_f(std::exp2(to_f(a))); }                              \
  inline H hexp10(H a) { return from_f(std::pow(10.0f, to_f(a))); }                       \
  inline H hlog(H a) { return from_f(std::log(to_f(a))); }                                \
  inline H hlog2(H a) { return from_f(std::log2(to_f(a))); }                              \
  inline H hlog10(H a) { return from_f(std::log10(to_f(a))); }                           \
  inline H hsqrt(H a) { return from_f(std::sqrt(to_f(a))); }                              \
  inline H hrsqrt(H a) { return from_f(1.0f / std::sqrt(to_f(a))); }                      \
  inline H hrcp(H a) { return from_f(1.0f / to_f(a)); }                                   \
  inline H hsin(H a) { return from_f(std::sin(to_f(a))); }                                \
  inline H hcos(H a) { return from_f(std::cos(to_f(a))); }                                \
  inline H htanh(H a) { return from_f(std::tanh(to_f(a))); }                              \
  inline H htanh_approx(H a) { return from_f(std::tanh(to_f(a))); }                       \
  inline H hceil(H a) { return from_f(std::ceil(to_f(a))); }                              \
  inline H hfloor(H a) { return from_f(std::floor(to_f(a))); }                            \
  inline H htrunc(H a) { return from_f(std::trunc(to_f(a))); }                            \
  inline H hrint(H a) { return from_f(std::nearbyint(to_f(a))); }                         \
  inline H __hfma(H a, H b, H c) { return from_f(std::fma(to_f(a), to_f(b), to_f(c))); }  \
  inline H __hfma_relu(H a, H b, H c) {                                                   \
    float r = std::fma(to_f(a), to_f(b), to_f(c));                                        \
    return from_f(r < 0.0f ? 0.0f : r);                                                   \
  }                                                                                       \
  inline H2 __hfma2(H2 a, H2 b, H2 c) {                                                   \
    float2 fa = f2_to(a), fb = f2_to(b), fc = f2_to(c);                                   \
    return f2_from(make_float2(std::fma(fa.x, fb.x, fc.x), std::fma(fa.y, fb.y, fc.y)));  \
  }                                                                                       \
  inline H2 h2exp(H2 a) { float2 f = f2_to(a); return f2_from(make_float2(std::exp(f.x), std::exp(f.y))); } \
  inline H2 h2exp2(H2 a) { float2 f = f2_to(a); return f2_from(make_float2(std::exp2(f.x), std::exp2(f.y))); } \
  inline H2 h2log(H2 a) { float2 f = f2_to(a); return f2_from(make_float2(std::log(f.x), std::log(f.y))); } \
  inline H2 h2sqrt(H2 a) { float2 f = f2_to(a); return f2_from(make_float2(std::sqrt(f.x), std::sqrt(f.y))); } \
  inline H2 h2rsqrt(H2 a) { float2 f = f2_to(a); return f2_from(make_float2(1.0f / std::sqrt(f.x), 1.0f / std::sqrt(f.y))); } \
  inline H2 h2rcp(H2 a) { float2 f = f2_to(a); return f2_from(make_float2(1.0f / f.x, 1.0f / f.y)); } \
  inline H2 h2sin(H2 a) { float2 f = f2_to(a); return f2_from(make_float2(std::sin(f.x), std::sin(f.y))); } \
  inline H2 h2cos(H2 a) { float2 f = f2_to(a); return f2_from(make_float2(std::cos(f.x), std::cos(f.y))); } \
  inline H2 h2tanh(H2 a) { float2 f = f2_to(a); return f2_from(make_float2(std::tanh(f.x), std::tanh(f.y))); }
BLOCKC_EMU_LOWP_MATH(__half, __half2, __half2float, __float2half_rn, __half22float2, __float22half2_rn)
BLOCKC_EMU_LOWP_MATH(__nv_bfloat16, __nv_bfloat162, __bfloat162float, __float2bfloat16_rn,
                     __bfloat1622float2, __float22bfloat162_rn)
#undef BLOCKC_EMU_LOWP_MATH

#endif  // BLOCKC_CUDA_EMU_MATH_H
