/* The peer channels' C interface for the TensorFlow face (csrc/tf/p2p_ops.cc):
 * post a send or a receive on the channels with a given id (PeerChannels::id,
 * `tarantella.pipeline.channels`' `.id` in Python) and get a callback when it
 * is done. Plain C types only, as c_api.h. Both return 0 once the transfer is
 * queued (then `done` runs exactly once: with NULL on success or the error
 * text, on the channels' progress thread or the caller's), or non-zero with
 * the message in `error` if nothing was queued (then `done` never runs).
 * The buffer must stay valid until `done` has run. */
#ifndef TNT_C_API_CHANNELS_H_
#define TNT_C_API_CHANNELS_H_

#include <stddef.h>

#include "c_api.h"

#ifdef __cplusplus
extern "C" {
#endif

int tnt_channels_send(int channels, int peer, int tag, const void* data, size_t bytes, tnt_done_fn done,
                      void* context, char* error, size_t error_size);
int tnt_channels_receive(int channels, int peer, int tag, void* out, size_t bytes, tnt_done_fn done, void* context,
                         char* error, size_t error_size);

#ifdef __cplusplus
}
#endif

#endif /* TNT_C_API_CHANNELS_H_ */
