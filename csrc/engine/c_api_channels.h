/* The peer channels' C interface for the TensorFlow face (csrc/tf/p2p_ops.cc):
 * post a send or a receive on the channels with a given id (PeerChannels::id,
 * `tarantella.channels`' `.id` in Python) and get a callback when it
 * is done. Plain C types only, as c_api.h. Both return 0 once the transfer is
 * queued (then `done` runs exactly once: with NULL on success or the error
 * text, on the channels' progress thread or the caller's), or non-zero with
 * the message in `error` if nothing was queued (then `done` never runs).
 * The buffer must stay valid until `done` has run. On success `*handle` names
 * the transfer for tnt_channels_cancel until `done` has run. */
#ifndef TNT_C_API_CHANNELS_H_
#define TNT_C_API_CHANNELS_H_

#include <stddef.h>

#include "c_api.h"

#ifdef __cplusplus
extern "C" {
#endif

int tnt_channels_send(int channels, int peer, int tag, const void* data, size_t bytes, tnt_done_fn done,
                      void* context, unsigned long long* handle, char* error, size_t error_size);
int tnt_channels_receive(int channels, int peer, int tag, void* out, size_t bytes, tnt_done_fn done, void* context,
                         unsigned long long* handle, char* error, size_t error_size);
/* Withdraws the transfer `handle` names (Note [Cancelled transfers are withdrawn] in peer_channels.hpp):
 * nobody will wait for it. Its `done` still runs once, and its buffer must stay valid until then. Does
 * nothing if the transfer is over or the channels are closed. */
void tnt_channels_cancel(int channels, unsigned long long handle);

#ifdef __cplusplus
}
#endif

#endif /* TNT_C_API_CHANNELS_H_ */
