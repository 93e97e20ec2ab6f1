// cuda_emu_streams.cpp: streams, stream capture and CUDA graphs, on the CPU.
//
// Emulated streams are synchronous, so a graph is simply what its capture
// recorded, in order -- kernel launches (the kernel and a copy of its
// arguments), memsets and memcpys -- and cudaGraphLaunch replays that list.
// What a program can get wrong is checked as CUDA checks it, so that code
// proven here does not fail on a GPU for a rule the emulator skipped:
//   * the legacy default stream cannot capture (cudaErrorStreamCaptureUnsupported);
//   * while this thread captures in global or thread-local mode (or another
//     thread in global mode), calls that may synchronize -- cudaMalloc,
//     cudaFree, cudaMemcpy, cudaMemset, cudaDeviceSynchronize, and a
//     synchronize of the capturing or the legacy stream -- fail with
//     cudaErrorStreamCaptureUnsupported and invalidate the capture;
//   * a launch that fails while capturing invalidates the capture, and
//     cudaStreamEndCapture then returns cudaErrorStreamCaptureInvalidated;
//   * cudaGraphExecUpdate takes a graph of the same nodes, kind by kind (a
//     kernel node may change its function and arguments, as since CUDA 11.2),
//     else it fails with cudaErrorGraphExecUpdateFailure.
// Not emulated: event record nodes (cudaEventRecord on a capturing stream
// fails rather than doing something CUDA would not), child graphs built by
// hand, and cross-stream capture through events.
#include "cuda_emu.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

namespace blockc_emu {
namespace graph {

struct Node {
  enum Kind { kKernel, kMemset, kMemcpy } kind;
  const char* name;   // kernel nodes
  const void* kernel;
  dim3 grid, block;
  size_t shmem;
  Body body;
  std::shared_ptr<void> closure;
  void* dst;          // memset and memcpy nodes
  const void* src;
  size_t count;
  int value;
};

void run(const Node& n) {
  switch (n.kind) {
    case Node::kKernel: run_kernel(n.name, n.grid, n.block, n.shmem, n.body, n.closure.get()); break;
    case Node::kMemset: if (n.count) std::memset(n.dst, n.value, n.count); break;
    case Node::kMemcpy: if (n.count) std::memmove(n.dst, n.src, n.count); break;
  }
}

}  // namespace graph
}  // namespace blockc_emu

struct CUstream_st {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id owner;                       // the thread that began the capture
  std::vector<blockc_emu::graph::Node> nodes;  // what the capture has recorded
};
struct CUgraph_st {
  std::vector<blockc_emu::graph::Node> nodes;
};
struct CUgraphExec_st {
  std::vector<blockc_emu::graph::Node> nodes;
};

namespace blockc_emu {
namespace {

thread_local std::vector<cudaStream_t> t_strict;  // this thread's captures in global or thread-local mode
thread_local int t_global = 0;                    // of which in global mode
std::atomic<int> g_global{0};                     // global-mode captures in the process

cudaError_t fail(cudaError_t err) {
  record_error(err);
  return err;
}

void end_strict(cudaStream_t s) {
  auto it = std::find(t_strict.begin(), t_strict.end(), s);
  if (it == t_strict.end()) return;
  t_strict.erase(it);
  if (s->mode == cudaStreamCaptureModeGlobal) {
    --t_global;
    --g_global;
  }
}

bool legacy(cudaStream_t s) { return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread; }

}  // namespace

bool capturing(cudaStream_t stream) { return !legacy(stream) && stream->status != cudaStreamCaptureStatusNone; }

void invalidate_capture(cudaStream_t stream) {
  if (capturing(stream)) stream->status = cudaStreamCaptureStatusInvalidated;
}

// A recorded call on a capture already invalidated is itself an error, as in CUDA.
static bool recording(cudaStream_t stream) {
  if (stream->status == cudaStreamCaptureStatusActive) return true;
  record_error(cudaErrorStreamCaptureInvalidated);
  return false;
}

void capture_kernel(cudaStream_t stream, const char* name, const void* kernel, dim3 grid, dim3 block, size_t shmem,
                    Body body, std::shared_ptr<void> closure) {
  if (recording(stream))
    stream->nodes.push_back({graph::Node::kKernel, name, kernel, grid, block, shmem, body, std::move(closure),
                             nullptr, nullptr, 0, 0});
}

void capture_memset(cudaStream_t stream, void* dst, int value, size_t count) {
  if (recording(stream))
    stream->nodes.push_back({graph::Node::kMemset, nullptr, nullptr, dim3(), dim3(), 0, nullptr, nullptr, dst,
                             nullptr, count, value});
}

void capture_memcpy(cudaStream_t stream, void* dst, const void* src, size_t count) {
  if (recording(stream))
    stream->nodes.push_back({graph::Node::kMemcpy, nullptr, nullptr, dim3(), dim3(), 0, nullptr, nullptr, dst, src,
                             count, 0});
}

cudaError_t refuse_during_capture(const char* call) {
  if (t_strict.empty() && g_global.load() - t_global <= 0) return cudaSuccess;
  for (cudaStream_t s : t_strict) s->status = cudaStreamCaptureStatusInvalidated;
  std::fprintf(stderr, "blockc-emu: %s during a stream capture in global or thread-local mode: CUDA refuses it "
               "(cudaErrorStreamCaptureUnsupported) and invalidates the capture\n", call);
  return fail(cudaErrorStreamCaptureUnsupported);
}

}  // namespace blockc_emu

using blockc_emu::graph::Node;

extern "C" {

// ---- streams ---------------------------------------------------------------------------------
cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  *stream = new CUstream_st{};
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) { return cudaStreamCreate(stream); }
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (blockc_emu::legacy(stream)) return blockc_emu::fail(cudaErrorInvalidResourceHandle);
  blockc_emu::end_strict(stream);
  delete stream;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (blockc_emu::capturing(stream)) {
    blockc_emu::invalidate_capture(stream);
    return blockc_emu::fail(cudaErrorStreamCaptureUnsupported);
  }
  if (blockc_emu::legacy(stream)) {
    const cudaError_t e = blockc_emu::refuse_during_capture("cudaStreamSynchronize of the legacy stream");
    if (e != cudaSuccess) return e;
  }
  return cudaPeekAtLastError();
}
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int) { return cudaSuccess; }
cudaError_t cudaStreamQuery(cudaStream_t) { return cudaSuccess; }

// ---- capture -----------------------------------------------------------------------------------
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
  if (blockc_emu::legacy(stream)) {
    std::fprintf(stderr, "blockc-emu: cudaStreamBeginCapture on the legacy default stream: CUDA refuses it "
                 "(capture needs a stream of its own)\n");
    return blockc_emu::fail(cudaErrorStreamCaptureUnsupported);
  }
  if (stream->status != cudaStreamCaptureStatusNone) return blockc_emu::fail(cudaErrorIllegalState);
  stream->status = cudaStreamCaptureStatusActive;
  stream->mode = mode;
  stream->owner = std::this_thread::get_id();
  stream->nodes.clear();
  if (mode != cudaStreamCaptureModeRelaxed) blockc_emu::t_strict.push_back(stream);
  if (mode == cudaStreamCaptureModeGlobal) {
    ++blockc_emu::t_global;
    ++blockc_emu::g_global;
  }
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  *graph = nullptr;
  if (!blockc_emu::capturing(stream)) return blockc_emu::fail(cudaErrorIllegalState);
  if (stream->mode != cudaStreamCaptureModeRelaxed && stream->owner != std::this_thread::get_id())
    return blockc_emu::fail(cudaErrorStreamCaptureWrongThread);
  blockc_emu::end_strict(stream);
  const bool ok = stream->status == cudaStreamCaptureStatusActive;
  stream->status = cudaStreamCaptureStatusNone;
  std::vector<Node> nodes;
  nodes.swap(stream->nodes);
  if (!ok) return blockc_emu::fail(cudaErrorStreamCaptureInvalidated);
  *graph = new CUgraph_st{std::move(nodes)};
  blockc_emu::count(blockc_emu::kGraphCaptures);
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus* status) {
  *status = blockc_emu::legacy(stream) ? cudaStreamCaptureStatusNone : stream->status;
  return cudaSuccess;
}

// ---- graphs ------------------------------------------------------------------------------------
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (!graph) return blockc_emu::fail(cudaErrorInvalidValue);
  *exec = new CUgraphExec_st{graph->nodes};
  blockc_emu::count(blockc_emu::kGraphInstantiations);
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags) {
  return cudaGraphInstantiate(exec, graph, flags);
}

cudaError_t cudaGraphExecUpdate(cudaGraphExec_t exec, cudaGraph_t graph, cudaGraphExecUpdateResultInfo* info) {
  std::memset(info, 0, sizeof *info);
  if (!exec || !graph) return blockc_emu::fail(cudaErrorInvalidValue);
  info->result = cudaGraphExecUpdateSuccess;
  if (exec->nodes.size() != graph->nodes.size()) {
    info->result = cudaGraphExecUpdateErrorTopologyChanged;
  } else {
    for (size_t i = 0; i < graph->nodes.size(); ++i)
      if (exec->nodes[i].kind != graph->nodes[i].kind) info->result = cudaGraphExecUpdateErrorNodeTypeChanged;
  }
  if (info->result != cudaGraphExecUpdateSuccess) return blockc_emu::fail(cudaErrorGraphExecUpdateFailure);
  exec->nodes = graph->nodes;
  blockc_emu::count(blockc_emu::kGraphUpdates);
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (!exec) return blockc_emu::fail(cudaErrorInvalidValue);
  if (blockc_emu::capturing(stream)) {  // a graph launched into a capture becomes part of it
    if (blockc_emu::recording(stream))
      stream->nodes.insert(stream->nodes.end(), exec->nodes.begin(), exec->nodes.end());
    return cudaSuccess;
  }
  blockc_emu::count(blockc_emu::kGraphLaunches);
  for (const Node& n : exec->nodes) blockc_emu::graph::run(n);
  return cudaPeekAtLastError();
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}

}  // extern "C"
