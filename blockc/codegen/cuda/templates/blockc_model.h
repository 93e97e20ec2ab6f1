/* blockc_model.h: the C API of a model blockc generated (libblockc_model.so).
 * The same for every model; the generated model.cu includes it, so each
 * definition is checked against what is declared here.
 *
 * A model's life, on one thread at a time:
 *
 *   blockc_model* m = blockc_create("weights.bin");      // NULL: blockc_last_error() says why
 *   long long max_dims[] = {8, 1024};                     // the largest run, one per symbol
 *   if (blockc_reserve(m, max_dims)) ...                  // the device arena: its only allocation
 *   for (...)                                             // any dims up to max_dims, each
 *     if (blockc_run(m, inputs, outputs, dims, stream)) ...  // blockc_model_error(m) says why
 *   blockc_destroy(m);
 *
 * dims hold one size per symbolic dim of the model, in the order
 * blockc_symbol_name gives. inputs and outputs are device pointers, in the
 * model's order (model.json lists them), contiguous, of the sizes the dims
 * give. blockc_run only enqueues work on `stream` (NULL: the legacy default
 * stream): synchronize it before reading the outputs. A model's runs share
 * its arena, so enqueue them on one stream, or synchronize between runs on
 * different ones (two models share nothing). A model that reads ids
 * (token embeddings, positions) checks them on the device, so its blockc_run
 * waits for the stream to say whether one was out of range.
 *
 * Memory. blockc_reserve allocates the arena every intermediate buffer lives
 * in, sized for max_dims; blockc_run never allocates device memory. A run
 * over what was reserved is refused (BLOCKC_NOT_RESERVED), never reallocated
 * behind the caller's back; blockc_reserve may be called again, between
 * runs, to reserve more. A model with no symbolic dims is reserved by
 * blockc_create. blockc_arena_bytes(dims) is what a reservation costs.
 *
 * CUDA graphs. The first run at a set of dims captures its launches into a
 * CUDA graph; later runs at those dims launch the graph, one call instead of
 * one per kernel. Runs with other input or output pointers update the graph
 * (cudaGraphExecUpdate). A model keeps graphs for its 16 most recently run
 * dims. Instantiating a graph takes driver memory; that happens on the first
 * run at new dims, not on every run.
 *
 * Switches, read from the environment by blockc_create (0 or 1):
 *   BLOCKC_CUDA_GRAPHS=0          launch kernel by kernel, never through a graph;
 *   BLOCKC_CUDA_CHECK_LAUNCHES=1  wait for each launch and check it, so that a
 *                                 fault inside a kernel, not only a launch CUDA
 *                                 refuses, names its kernel (slow: for debugging;
 *                                 no graphs);
 *   BLOCKC_CUDA_TENSOR_CORES=0    attention always on its float32 SIMT kernel, not
 *                                 the mma.sync one (1, the default on a GPU: the
 *                                 mma.sync kernel where dtype, head size and
 *                                 alignment allow; the emulator runs it only at 1).
 * A launch CUDA refuses is named by its kernel and the IR nodes it computes:
 * "launch 3 of 12, kernel add_layernorm_f32_768 (IR nodes %5 %6: add_layernorm): ...";
 * a fault inside a kernel only by the launch it was seen after, unless
 * BLOCKC_CUDA_CHECK_LAUNCHES=1 waits for each.
 *
 * Errors. blockc_last_error() is the calling thread's last error (blockc_create
 * has no model yet); blockc_model_error(m) is why m's last blockc_reserve or
 * blockc_run failed. Two models in one process, or two threads each with its
 * own model, share nothing. */
#ifndef BLOCKC_MODEL_H
#define BLOCKC_MODEL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct blockc_model blockc_model;

/* What blockc_reserve and blockc_run return. */
#define BLOCKC_OK 0
#define BLOCKC_ERROR 1         /* bad dims or ids, a failed launch or CUDA call: the error text says which */
#define BLOCKC_NOT_RESERVED 2  /* dims over what blockc_reserve reserved, or nothing reserved yet */

blockc_model* blockc_create(const char* weights_path);
/* The weights file's bytes, from host memory. */
blockc_model* blockc_create_from_memory(const void* image, unsigned long long size);
int blockc_reserve(blockc_model* m, const long long* max_dims);
int blockc_run(blockc_model* m, const void* const* inputs, void* const* outputs, const long long* dims,
               void* stream);
void blockc_destroy(blockc_model* m);

const char* blockc_last_error(void);
const char* blockc_model_error(const blockc_model* m);

int blockc_num_inputs(void);
int blockc_num_outputs(void);
int blockc_num_symbols(void);
const char* blockc_symbol_name(int k);         /* NULL past the last */
size_t blockc_arena_bytes(const long long* dims);

/* Device memory, so a caller needs nothing but this library. 0: done. */
void* blockc_device_alloc(size_t n);
void blockc_device_free(void* p);
int blockc_copy_to_device(void* dst, const void* src, size_t n);
int blockc_copy_to_host(void* dst, const void* src, size_t n);
int blockc_synchronize(void);

/* CUDA events, to time the device's work on a stream rather than the host's.
 * blockc_event_seconds waits for `end`, then gives the time from `start`. */
void* blockc_event_create(void);
int blockc_event_record(void* event, void* stream);
int blockc_event_seconds(void* start, void* end, double* seconds);
void blockc_event_destroy(void* event);

/* For blockc's emulator runner: create, reserve, run once, destroy.
 * buffers = weights image, inputs..., outputs...; ints = dims..., image size. */
int blockc_entry(void** buffers, const long long* ints);

#ifdef __cplusplus
}
#endif

#endif /* BLOCKC_MODEL_H */
