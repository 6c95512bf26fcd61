#include "c_api_channels.h"

#include <atomic>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "c_api_error.hpp"
#include "peer_channels.hpp"

namespace {

using tnt::report_c_api_error;

// when_done() runs its callback at once if the transfer is already over; that
// must not happen under the registry's lock (the callback resumes TensorFlow,
// which may post the next transfer and take the lock again), so such an early
// completion is remembered and reported after the lock is released.
struct Completion {
  enum : int { registering, early, registered };
  std::atomic<int> state{registering};
  std::string error;
  tnt_done_fn done;
  void* context;
};

// Transfers in flight by handle, for tnt_channels_cancel: from when they are queued until their
// callback has run.
std::mutex g_handles_mutex;
std::map<unsigned long long, std::weak_ptr<tnt::Transfer>> g_handles;
unsigned long long g_next_handle = 1;

int start(bool send, int channels, int peer, int tag, void* data, size_t bytes, tnt_done_fn done, void* context,
          unsigned long long* handle, char* error, size_t error_size) {
  auto completion = std::make_shared<Completion>();
  completion->done = done;
  completion->context = context;
  try {
    const bool found = tnt::PeerChannels::with_channels(channels, [&](tnt::PeerChannels& open) {
      tnt::TransferPtr transfer = send ? open.send(peer, tag, data, bytes) : open.receive(peer, tag, data, bytes);
      unsigned long long id = 0;
      {
        std::lock_guard<std::mutex> lock(g_handles_mutex);
        id = g_next_handle++;
        g_handles[id] = transfer;
      }
      *handle = id;
      open.when_done(transfer, [completion, id](const std::string& failure) {
        {
          std::lock_guard<std::mutex> lock(g_handles_mutex);
          g_handles.erase(id);
        }
        int expected = Completion::registering;
        if (completion->state.compare_exchange_strong(expected, Completion::early)) {
          completion->error = failure;
          return;
        }
        completion->done(completion->context, failure.empty() ? nullptr : failure.c_str());
      });
    });
    if (!found) return report_c_api_error("the peer channels " + std::to_string(channels) + " are closed", error, error_size);
  } catch (const std::exception& e) {
    return report_c_api_error(e.what(), error, error_size);
  }
  int expected = Completion::registering;
  if (!completion->state.compare_exchange_strong(expected, Completion::registered)) {
    done(context, completion->error.empty() ? nullptr : completion->error.c_str());
  }
  return 0;
}

}  // namespace

extern "C" {

int tnt_channels_send(int channels, int peer, int tag, const void* data, size_t bytes, tnt_done_fn done,
                      void* context, unsigned long long* handle, char* error, size_t error_size) {
  return start(true, channels, peer, tag, const_cast<void*>(data), bytes, done, context, handle, error,
               error_size);
}

int tnt_channels_receive(int channels, int peer, int tag, void* out, size_t bytes, tnt_done_fn done, void* context,
                         unsigned long long* handle, char* error, size_t error_size) {
  return start(false, channels, peer, tag, out, bytes, done, context, handle, error, error_size);
}

void tnt_channels_cancel(int channels, unsigned long long handle) {
  tnt::TransferPtr transfer;
  {
    std::lock_guard<std::mutex> lock(g_handles_mutex);
    auto found = g_handles.find(handle);
    if (found == g_handles.end()) return;
    transfer = found->second.lock();
  }
  if (!transfer) return;
  try {
    tnt::PeerChannels::with_channels(channels, [&](tnt::PeerChannels& open) { open.cancel(transfer); });
  } catch (const std::exception&) {
    // Withdrawing is a courtesy to MPI: the op finishes either way, and channels that failed have
    // failed every transfer already.
  }
}

}  // extern "C"
