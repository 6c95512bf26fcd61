// Non-blocking point-to-point transfers of byte buffers between the ranks of
// a process group: the activations and activation gradients of a pipeline
// travel through them.
//
// A transfer is addressed by (peer, tag); the caller chooses tags (the
// pipeline composes them from micro-batch and tensor ids). Between one pair of
// ranks, transfers with the same tag match in posting order (MPI's
// non-overtaking rule), so a tag may be reused as soon as both sides post
// their transfers in the same order.
//
// Note [Channels post on the caller's thread]
// A transfer is posted (MPI_Isend/MPI_Irecv, on the channels' own duplicate of
// the group's communicator: Note [One communicator per user]) by the thread
// that queues it, and completed by the channels' progress thread, which polls
// all active transfers with one MPI_Testsome, backing off from spinning to
// sleeping (back_off()) while nothing completes (but not while a receive is
// awaited: Note [Awaited receives are polled without sleeping]), and sleeps on a condition
// variable while nothing is active, so an idle channel costs no CPU.
// Completion fires the transfer's callbacks on the progress thread and wakes
// blocking waiters.
// Why post on the caller's thread: a pipeline stage sends an activation and
// goes straight on computing the next pass, and with a rank pinned to one
// core the progress thread shares that core with TensorFlow's compute
// thread. When the progress thread posted the send, the send waited for it to
// get the core (the scheduler's time slice: 1-2 ms, as long as a pass), and
// the next stage idled meanwhile: measured at batch 1024, M = 8, 2 pinned
// stages, the first activation and the gradients a stage waited for at the
// turn and the drain arrived 1.3-2 ms after they were sent; posted by the
// sending op itself they arrive in 0.1-0.2 ms (bubble 0.20 -> 0.13; results/
// pipeline/README.md). The post hands MPI the message's header (sm: eager up
// to 4 KiB; larger messages are then pulled by the receiver, CMA single copy),
// a few microseconds on the caller's thread. The polling stays on the
// progress thread so that the compute thread never waits in MPI's progress
// engine for a peer. Transfers are posted under the channels' lock, so they
// reach MPI in the order they were queued (the non-overtaking rule above).
// Newly posted transfers restart the progress thread's back-off: a receive
// posted now is usually awaited soon, and the fast polling ends in sleeps
// again if it is not.
//
// Lifecycle, in the order the stages run:
//   PeerChannels()   framework thread, once: duplicate the communicator,
//                    start the progress thread.
//   send() / receive()
//                    any framework thread, per buffer: post a transfer and
//                    return its handle at once; the buffer must stay valid and
//                    untouched until the transfer is done.
//   progress_loop()  the progress thread: test posted transfers, complete
//                    them (Note [Channels post on the caller's thread]).
//   when_done() / wait()
//                    any framework thread, per transfer: a callback once the
//                    transfer is done (or at once), or a blocking wait under
//                    the group's timeout; a wait beyond it is a TimeoutError
//                    naming the peer and the tag.
//   ~PeerChannels()  framework thread: cancel what is still active, stop and
//                    join the progress thread. Call it before MPI is finalised.
//
// Note [Awaited receives are polled without sleeping]
// While a receive is active and a transfer was queued or completed within the
// last kBriskPolling (50 ms), the progress thread polls between spins and
// yields (back_off_briefly()) and never sleeps on a timer: a pipeline stage
// posts its receives a pass or two ahead and goes idle the moment the one it
// needs next is missing, so the receive's completion, and with it the stage's
// next pass, waited out the sleep the back-off had reached (tens to hundreds of
// microseconds, plus the timer's slack), once per micro-batch and direction. A
// yield costs the compute threads nothing when they are running (they take the
// core back), and the poll ends in sleeps again once nothing has happened for
// kBriskPolling (between steps, during evaluation or a checkpoint). Measured on
// the 2-core machine, 2-stage 1F1B, M = 8, 8 x Dense(512), global batch 128,
// launcher defaults, A/B runs alternating: 4700-4870 -> 5470-5860 samples/s,
// 0.60 -> 0.68 of the ideal pipeline speed-up (python -m bench.pipeline.defaults
// --widths 512 --batches 128 --repeats 2). Sends alone do not poll briskly:
// their completion only ends the step.
// With more ranks on the node than cores it is the usual back-off
// (set_oversubscribed): there a polling thread takes a core a rank needs.
//
// Note [Transfers expire on the progress thread]
// A transfer that is only awaited through when_done() (the TensorFlow ops)
// has no blocking waiter to time it out, so the progress thread does: while
// nothing completes it checks the active transfers (every 50 ms, by the
// clock), and once one has
// waited the group's timeout since it was queued the channels fail with a
// timeout naming the peer and tag (as wait() would): a lost peer ends the
// job instead of hanging it.
//
// Note [Cancelled transfers are withdrawn]
// A step that fails on this rank leaves transfers nobody will wait for: the
// receives posted ahead for later passes, and sends whose peer is waiting on
// this rank for something else first. TensorFlow cancels the step's pending
// ops; the transfer ops then cancel() their transfers (csrc/tf/p2p_ops.cc)
// and finish at once. The progress thread withdraws each from MPI
// (MPI_Cancel): a receive not yet matched is taken back and completes as
// failed with kCancelled; a send may be on its way already (MPI may refuse to
// take sends back, Open MPI's ob1 does) and then completes as usual when the
// peer takes it. Either way its callbacks run once, as for any transfer, and
// a cancelled transfer never expires (it is nobody's wait; the channels stay
// usable): the job ends through the op's error, not through this timeout.
#pragma once

#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "deadline.hpp"
#include "process_group.hpp"

namespace tnt {

class PeerChannels;

// One send or receive. Created by PeerChannels; the caller holds it through a
// shared_ptr and reads it only through the PeerChannels that made it.
class Transfer {
 public:
  enum class Kind { send, receive };
  enum class State { queued, active, done, failed };

  Kind kind() const { return kind_; }
  int peer() const { return peer_; }
  int tag() const { return tag_; }
  std::size_t bytes() const { return bytes_; }
  std::string describe(const ProcessGroup& group) const;

 private:
  friend class PeerChannels;
  Kind kind_ = Kind::send;
  int peer_ = 0;                      // group rank of the other side
  int tag_ = 0;
  void* data_ = nullptr;              // caller's buffer; valid until done or failed
  std::size_t bytes_ = 0;             // exact size; a receive of another size fails
  MPI_Request request_ = MPI_REQUEST_NULL;  // set when posted (under mutex_), then the progress thread's
  State state_ = State::queued;       // guarded by PeerChannels::mutex_
  std::string error_;                 // guarded by mutex_; set with State::failed
  bool timed_out_ = false;            // guarded by mutex_; error_ is a timeout
  bool cancelled_ = false;            // guarded by mutex_; Note [Cancelled transfers are withdrawn]
  std::chrono::steady_clock::time_point queued_at_;  // Note [Transfers expire on the progress thread]
  std::vector<std::function<void(const std::string&)>> callbacks_;  // guarded by mutex_
};

using TransferPtr = std::shared_ptr<Transfer>;

class PeerChannels {
 public:
  // Called with an empty string on success, or the error text.
  using Callback = std::function<void(const std::string& error)>;

  explicit PeerChannels(const ProcessGroup& group);
  ~PeerChannels();
  PeerChannels(const PeerChannels&) = delete;
  PeerChannels& operator=(const PeerChannels&) = delete;

  TransferPtr send(int peer, int tag, const void* data, std::size_t bytes);
  TransferPtr receive(int peer, int tag, void* data, std::size_t bytes);

  // True once the transfer is done; throws if it failed.
  bool test(const TransferPtr& transfer);
  // Runs `callback` once the transfer is done or failed (at once if it is),
  // on the progress thread or the caller's.
  void when_done(const TransferPtr& transfer, Callback callback);
  // Blocks until the transfer is done, under the group's timeout.
  void wait(const TransferPtr& transfer);
  // Withdraws a transfer nobody will wait for (Note [Cancelled transfers are withdrawn]); its callbacks
  // still run once. Does nothing if it is over.
  void cancel(const TransferPtr& transfer);
  // The error text of a transfer that cancel() withdrew.
  static const char* const kCancelled;

  int rank() const { return group_->rank(); }
  // Process-wide id for the TensorFlow face (c_api_channels.h), which names channels by it.
  int id() const { return id_; }
  // Runs `use` with the live channels of that id (under the registry's lock, so they are not
  // destroyed meanwhile); false if there are none.
  static bool with_channels(int id, const std::function<void(PeerChannels&)>& use);
  int size() const { return group_->size(); }
  // Transfers queued or active right now.
  std::size_t in_flight() const;
  static int max_tag();

 private:
  TransferPtr queue(Transfer::Kind kind, int peer, int tag, void* data, std::size_t bytes);
  void progress_loop();
  void post(Transfer& transfer);  // caller holds mutex_
  void complete(std::size_t index, const MPI_Status& status);
  void finish(Transfer& transfer, Transfer::State state, const std::string& error);
  void fail_all(const std::string& error, bool timed_out = false);
  [[noreturn]] void rethrow(const Transfer& transfer) const;
  // The transfer's timeout, counted from when it was queued.
  Deadline deadline_of(const Transfer& transfer) const;
  void expire_overdue();
  void withdraw_cancelled();  // progress thread: MPI_Cancel what cancel() asked for
  bool awaits_receive() const;  // progress thread: an active receive (Note [Awaited receives are polled
                                // without sleeping])

  std::unique_ptr<ProcessGroup> group_;  // own duplicate (Note [One communicator per user])
  int id_ = 0;                           // in the registry from construction to destruction

  mutable std::mutex mutex_;
  std::condition_variable work_;     // the progress thread sleeps here while idle
  std::condition_variable finished_; // blocking wait() sleeps here
  std::deque<TransferPtr> queued_;   // guarded by mutex_; posted, not yet polled by the progress thread
  std::vector<TransferPtr> cancelling_;  // guarded by mutex_; cancel()ed, not yet withdrawn from MPI
  bool stopping_ = false;            // guarded by mutex_
  std::string error_;                // guarded by mutex_; an MPI failure ends the channels
  std::size_t active_count_ = 0;     // guarded by mutex_; size of active_ for in_flight()

  // Progress thread only: active transfers and their requests, index-aligned for MPI_Testsome.
  std::vector<TransferPtr> active_;
  std::vector<MPI_Request> requests_;
  std::thread progress_thread_;      // last member: starts after everything above exists
};

}  // namespace tnt
