// cuda_emu_runtime.cpp: the CUDA runtime calls a generated host file makes,
// on host memory. NVIDIA's cuda_runtime_api.h declares them; this defines them,
// so no libcudart is linked. Streams are synchronous (every launch has finished
// when BLOCKC_LAUNCH returns; cuda_emu_streams.cpp has them, their capture and
// graphs); events record host time.
#include "cuda_emu.h"
#include "cuda_emu_internal.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

struct CUevent_st {
  std::chrono::steady_clock::time_point when;
};

namespace blockc_emu {
namespace {
std::atomic<int> g_last_error{cudaSuccess};
int g_device = 0;
std::atomic<long long> g_counters[kNumCounters];
const char* const kCounterNames[kNumCounters] = {"device_allocations", "kernel_launches", "graph_captures",
                                                 "graph_instantiations", "graph_updates", "graph_launches"};
}  // namespace

void record_error(cudaError_t err) { g_last_error.store(err); }
void count(Counter c) { ++g_counters[c]; }
}  // namespace blockc_emu

extern "C" {

int blockc_emu_counters(char* buf, int size) {
  int n = std::snprintf(buf, size, "{");
  for (int c = 0; c < blockc_emu::kNumCounters; ++c)
    n += std::snprintf(buf + std::min(n, size), size - std::min(n, size), "%s\"%s\": %lld", c ? ", " : "",
                       blockc_emu::kCounterNames[c], blockc_emu::g_counters[c].load());
  n += std::snprintf(buf + std::min(n, size), size - std::min(n, size), "}");
  return n;
}

cudaError_t cudaGetLastError(void) { return (cudaError_t)blockc_emu::g_last_error.exchange(cudaSuccess); }
cudaError_t cudaPeekAtLastError(void) { return (cudaError_t)blockc_emu::g_last_error.load(); }

const char* cudaGetErrorString(cudaError_t err) {
  switch (err) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureWrongThread: return "attempt to terminate a thread-local capture sequence from "
                                                   "another thread";
    case cudaErrorGraphExecUpdateFailure: return "the graph update was not performed because it included "
                                                 "changes which violated constraints specific to instantiated "
                                                 "graph update";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    default: return "unknown error (blockc-emu)";
  }
}
const char* cudaGetErrorName(cudaError_t err) {
  switch (err) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureWrongThread: return "cudaErrorStreamCaptureWrongThread";
    case cudaErrorGraphExecUpdateFailure: return "cudaErrorGraphExecUpdateFailure";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    default: return "cudaErrorUnknown";
  }
}

// ---- memory ------------------------------------------------------------------------
cudaError_t cudaMalloc(void** ptr, size_t size) {
  blockc_emu::count(blockc_emu::kDeviceAllocations);
  const cudaError_t refused = blockc_emu::refuse_during_capture("cudaMalloc");
  if (refused != cudaSuccess) {
    *ptr = nullptr;
    return refused;
  }
  // 256-byte alignment, as cudaMalloc guarantees and vectorised loads rely on.
  if (posix_memalign(ptr, 256, size ? size : 1) != 0) {
    *ptr = nullptr;
    blockc_emu::record_error(cudaErrorMemoryAllocation);
    return cudaErrorMemoryAllocation;
  }
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** ptr, size_t size) { return cudaMalloc(ptr, size); }
cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int) { return cudaMalloc(ptr, size); }
cudaError_t cudaMallocManaged(void** ptr, size_t size, unsigned int) { return cudaMalloc(ptr, size); }
cudaError_t cudaMallocAsync(void** ptr, size_t size, cudaStream_t) { return cudaMalloc(ptr, size); }
cudaError_t cudaFree(void* ptr) {
  const cudaError_t refused = blockc_emu::refuse_during_capture("cudaFree");
  if (refused != cudaSuccess) return refused;
  std::free(ptr);
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* ptr) { return cudaFree(ptr); }
cudaError_t cudaFreeAsync(void* ptr, cudaStream_t) { return cudaFree(ptr); }

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind) {
  const cudaError_t refused = blockc_emu::refuse_during_capture("cudaMemcpy");
  if (refused != cudaSuccess) return refused;
  if (count) std::memmove(dst, src, count);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind, cudaStream_t stream) {
  if (blockc_emu::capturing(stream)) {
    blockc_emu::capture_memcpy(stream, dst, src, count);
    return cudaSuccess;
  }
  if (count) std::memmove(dst, src, count);
  return cudaSuccess;
}
cudaError_t cudaMemcpy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                         enum cudaMemcpyKind) {
  for (size_t r = 0; r < height; ++r) std::memmove((char*)dst + r * dpitch, (const char*)src + r * spitch, width);
  return cudaSuccess;
}
cudaError_t cudaMemset(void* ptr, int value, size_t count) {
  const cudaError_t refused = blockc_emu::refuse_during_capture("cudaMemset");
  if (refused != cudaSuccess) return refused;
  if (count) std::memset(ptr, value, count);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
  if (blockc_emu::capturing(stream)) {
    blockc_emu::capture_memset(stream, ptr, value, count);
    return cudaSuccess;
  }
  if (count) std::memset(ptr, value, count);
  return cudaSuccess;
}
cudaError_t cudaMemcpyToSymbol(const void* symbol, const void* src, size_t count, size_t offset, enum cudaMemcpyKind) {
  std::memcpy((char*)symbol + offset, src, count);
  return cudaSuccess;
}
cudaError_t cudaMemcpyFromSymbol(void* dst, const void* symbol, size_t count, size_t offset, enum cudaMemcpyKind) {
  std::memcpy(dst, (const char*)symbol + offset, count);
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  *free_bytes = *total_bytes = (size_t)16 << 30;
  return cudaSuccess;
}

// ---- device, events ---------------------------------------------------------
cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  blockc_emu::g_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = blockc_emu::g_device;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
  const cudaError_t refused = blockc_emu::refuse_during_capture("cudaDeviceSynchronize");
  return refused != cudaSuccess ? refused : cudaPeekAtLastError();
}
cudaError_t cudaDeviceReset(void) { return cudaSuccess; }
// Reports an sm_90-class device (an H100's limits).
cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int) {
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMultiProcessorCount: *value = 132; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = 48 * 1024; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = 232448; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = 233472; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrMaxRegistersPerBlock: *value = 65536; break;
    case cudaDevAttrL2CacheSize: *value = 50 * 1024 * 1024; break;
    case cudaDevAttrMaxGridDimX: *value = 0x7fffffff; break;
    case cudaDevAttrMaxGridDimY:
    case cudaDevAttrMaxGridDimZ: *value = blockc_emu::detail::max_grid_yz(); break;
    default: *value = 0; return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp* prop, int) {
  std::memset(prop, 0, sizeof *prop);
  std::strncpy(prop->name, "blockc-emu (CPU)", sizeof prop->name - 1);
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 132;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->sharedMemPerBlock = 48 * 1024;
  prop->sharedMemPerBlockOptin = 232448;
  prop->sharedMemPerMultiprocessor = 233472;
  prop->regsPerBlock = 65536;
  prop->totalGlobalMem = (size_t)16 << 30;
  prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 0x7fffffff;
  prop->maxGridSize[1] = prop->maxGridSize[2] = blockc_emu::detail::max_grid_yz();
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void* func, enum cudaFuncAttribute attr, int value) {
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || value > 232448) return cudaErrorInvalidValue;
    blockc_emu::set_max_dynamic_shared(func, value);
  }
  return cudaSuccess;
}
cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes* attr, const void*) {
  std::memset(attr, 0, sizeof *attr);
  attr->maxThreadsPerBlock = 1024;
  attr->maxDynamicSharedSizeBytes = 48 * 1024;
  attr->ptxVersion = attr->binaryVersion = 90;
  return cudaSuccess;
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, const void*, int block_size, size_t) {
  *blocks = block_size > 0 ? std::max(1, 2048 / block_size) : 0;
  return cudaSuccess;
}
cudaError_t cudaMemcpyToSymbolAsync(const void* symbol, const void* src, size_t count, size_t offset,
                                    enum cudaMemcpyKind kind, cudaStream_t) {
  return cudaMemcpyToSymbol(symbol, src, count, offset, kind);
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  *event = new CUevent_st{std::chrono::steady_clock::now()};
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) { return cudaEventCreate(event); }
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (blockc_emu::capturing(stream)) {  // event nodes are not emulated (cuda_emu_streams.cpp)
    std::fprintf(stderr, "blockc-emu: cudaEventRecord on a capturing stream is not emulated\n");
    blockc_emu::invalidate_capture(stream);
    blockc_emu::record_error(cudaErrorNotSupported);
    return cudaErrorNotSupported;
  }
  event->when = std::chrono::steady_clock::now();
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  *ms = std::chrono::duration<float, std::milli>(end->when - start->when).count();
  return cudaSuccess;
}

}  // extern "C"
