// CUDA graphs: a stream capture recorded and replayed, an instantiated graph
// updated with other arguments, and the rules of capture, which the emulator
// checks as CUDA does.
#include <cuda_runtime.h>

__global__ void axpb(const float* __restrict__ x, float* __restrict__ y, float a, float b, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + b;
}

static void axpb_launch(const float* x, float* y, float a, float b, int n, unsigned block, cudaStream_t s) {
  BLOCKC_LAUNCH(axpb, (n + 127) / 128, block, 0, s, x, y, a, b, n);
}

// y = a x + 1, z = 3 y (z cleared first): three nodes, captured on `s`.
static cudaError_t capture_chain(const float* x, float* y, float* z, float a, int n, cudaStream_t s,
                                 cudaGraph_t* graph) {
  cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  if (e != cudaSuccess) return e;
  axpb_launch(x, y, a, 1.0f, n, 128, s);
  (void)cudaMemsetAsync(z, 0, n * sizeof(float), s);
  axpb_launch(y, z, 3.0f, 0.0f, n, 128, s);
  return cudaStreamEndCapture(s, graph);
}

// buffers: x, y, w, z (n floats each; y, w and z filled with -1 by the
// caller) and facts (16 ints, what each rule gave); ints: n. Returns 0, or
// the error of a call that had to succeed.
extern "C" int run_graphs(void** buffers, const long long* ints) {
  const float* x = (const float*)buffers[0];
  float *y = (float*)buffers[1], *w = (float*)buffers[2], *z = (float*)buffers[3];
  int* facts = (int*)buffers[4];
  const int n = (int)ints[0];
  cudaStream_t s = NULL;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = capture_chain(x, y, z, 2.0f, n, s, &graph);
  // 0: capturing ran nothing (y still -1)
  float y0 = 0.0f;
  if (e == cudaSuccess) e = cudaMemcpy(&y0, y, sizeof y0, cudaMemcpyDeviceToHost);
  facts[0] = y0 == -1.0f;
  if (e == cudaSuccess) e = cudaGraphInstantiate(&exec, graph, 0);
  if (e == cudaSuccess) e = cudaGraphLaunch(exec, s);
  if (e == cudaSuccess) e = cudaGraphLaunch(exec, s);
  if (graph) cudaGraphDestroy(graph);
  graph = NULL;
  // 1: the same nodes with other arguments (w = 4x + 1, z = 3w) update the instantiated graph
  if (e == cudaSuccess) e = capture_chain(x, w, z, 4.0f, n, s, &graph);
  cudaGraphExecUpdateResultInfo info;
  if (e == cudaSuccess) facts[1] = (int)cudaGraphExecUpdate(exec, graph, &info);
  if (e == cudaSuccess) e = cudaGraphLaunch(exec, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (graph) cudaGraphDestroy(graph);
  graph = NULL;
  // 2, 3: another topology (one node) cannot update it
  if (e == cudaSuccess) e = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  axpb_launch(x, y, 1.0f, 0.0f, n, 128, s);
  if (e == cudaSuccess) e = cudaStreamEndCapture(s, &graph);
  if (e == cudaSuccess) facts[2] = (int)cudaGraphExecUpdate(exec, graph, &info);
  facts[3] = (int)info.result;
  if (graph) cudaGraphDestroy(graph);
  graph = NULL;
  (void)cudaGetLastError();
  // 4: the legacy default stream cannot capture
  facts[4] = (int)cudaStreamBeginCapture(0, cudaStreamCaptureModeThreadLocal);
  (void)cudaGetLastError();
  // 5, 6, 7: cudaMalloc while this thread captures is refused and invalidates the capture
  if (e == cudaSuccess) e = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  void* p = NULL;
  facts[5] = (int)cudaMalloc(&p, 256);
  facts[6] = (int)cudaStreamEndCapture(s, &graph);
  facts[7] = graph == NULL;
  if (p) cudaFree(p);
  (void)cudaGetLastError();
  // 8, 9: a launch that fails while capturing is reported at once and invalidates the capture
  if (e == cudaSuccess) e = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  axpb_launch(x, y, 1.0f, 0.0f, n, 2048, s);
  facts[8] = (int)cudaGetLastError();
  facts[9] = (int)cudaStreamEndCapture(s, &graph);
  if (graph) cudaGraphDestroy(graph);
  (void)cudaGetLastError();
  if (exec) cudaGraphExecDestroy(exec);
  if (s) cudaStreamDestroy(s);
  return (int)e;
}
