/* The engine's C interface for the TensorFlow face. Plain C types only, so the
 * op library, compiled against TensorFlow's headers and flags, cannot clash
 * with the engine's C++ ABI. Every function returns 0 on success, or non-zero
 * with a message written to `error` (at most `error_size` bytes, terminated). */
#ifndef TNT_C_API_H_
#define TNT_C_API_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Called once the result is in `out`; `error` is NULL on success. */
typedef void (*tnt_done_fn)(void* context, const char* error);

int tnt_reducer_ready(int reducer, size_t tensor, const void* data, size_t bytes, char* error, size_t error_size);

/* Copies tensor's reduced result into `out` as soon as its bucket is reduced,
 * then calls done(context, NULL); on failure calls done(context, message).
 * `done` runs on the progress thread or, if the result is there, at once. */
int tnt_reducer_deliver(int reducer, size_t tensor, void* out, size_t bytes, tnt_done_fn done, void* context,
                        char* error, size_t error_size);

/* A step was cancelled partway on this rank: fail the reducer and everything awaited from it at once
 * (Note [A cancelled step fails the reducer] in fused_reducer.hpp). Does nothing if it is gone. */
void tnt_reducer_cancel_step(int reducer);

/* The number of bucket allreduces the reducer completed since it was made. */
int tnt_reducer_reductions_completed(int reducer, unsigned long long* count, char* error, size_t error_size);

/* Queues the element-wise sum over the allreducer's group of every rank's `count` elements of dtype
 * `dtype_name` ("float32", ...) at `in`, into `out` (`in` may equal `out`), and returns; calls
 * done(context, NULL) from the allreducer's worker once `out` holds it, done(context, message) if it
 * failed (Note [In-graph allreduces]). On a non-zero return nothing was queued and `done` never runs. */
int tnt_graph_allreduce_sum(int allreducer, const void* in, void* out, size_t count, const char* dtype_name,
                            tnt_done_fn done, void* context, char* error, size_t error_size);

/* A step was cancelled partway on this rank: fail the allreducer's queued and later sums at once.
 * Does nothing if it is gone. */
void tnt_graph_allreduce_cancel_step(int allreducer);

/* The version of this interface. The op library compiles TNT_ENGINE_ABI_VERSION
 * in and compares it with what the loaded engine's tnt_engine_abi_version()
 * returns; raise it with every change of this file's functions. */
#define TNT_ENGINE_ABI_VERSION 4
int tnt_engine_abi_version(void);

#ifdef __cplusplus
}
#endif

#endif /* TNT_C_API_H_ */
