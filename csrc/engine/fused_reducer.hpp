// The fused, non-blocking gradient reducer.
//
// Tensors (gradients) are registered once, in the order the framework expects
// them to become ready, and laid out into buckets: consecutive tensors of one
// dtype share a bucket until it holds at least the fusion threshold (0: one
// bucket per tensor). Each training step, every tensor is marked ready once
// and its result collected once.
//
// Note [Buckets are reduced in an agreed order]
// Collectives must be issued in the same order on every rank, but ranks may
// mark tensors ready in different orders. Buckets therefore have static ids
// and the progress thread reduces them in one order that every rank holds: a
// bucket complete early simply waits for those before it in that order.
// Nothing deadlocks (ready() never waits for a result, so every bucket of a
// step gets queued whatever the order) and no bucket is matched with another
// rank's different bucket. The order starts as the id order (the registration
// order: the framework's guess). Once the last bucket of the second step
// (kStepsBeforeReordering) is taken, every rank's progress thread, at the same
// point of its sequence of collectives, sorts the buckets by when they were
// queued in that step and takes group rank 0's order (a broadcast); buckets
// are reduced in that order from the next step on, as PyTorch DDP rebuilds its
// buckets in the order gradients became ready after the first iteration (here
// the layout stays, only the order changes). The second step, not the first:
// the first also builds and warms up the framework's step. If the real order
// changes later, only overlap is lost.
//
// Note [Two copies per gradient byte]
// On one node (the algorithm resolves to shared_memory and the group has more
// than one rank) the buckets live in the reducer's SharedSegments: bucket b
// occupies the same bytes of every rank's segment, and
//   ready()           copies the tensor straight into its place in this
//                     rank's segment (copy 1);
//   progress thread   reduces this rank's chunk of the bucket (part_of(count,
//                     p, rank)) from all segments in rank order, in place in
//                     its own segment (a reduction, no copy);
//   copy_result()     copies each element range from the segment of the rank
//                     that reduced it into the output (copy 2),
// instead of the four copies of a private bucket handed to the shared-memory
// allreduce (tensor -> bucket -> own slot; slots -> bucket; bucket -> output).
// Each bucket has three flags in every segment's header, epochs counting the
// bucket's steps (Note [Notifications are epochs]): STAGED (this rank's inputs
// are in its segment), REDUCED (its chunk holds the result) and CONSUMED (it
// copied out all its results of the bucket: peers may overwrite theirs).
// Each segment holds two areas of all buckets, used by odd and even steps:
// ready() of step e writes while peers may still copy out step e-1's results
// (a ready() that waited for them would hold up the framework thread that
// runs it, and every op behind it). Step e-2's results in the same area were
// collected before the peers handed in step e-1's tensors, which this rank's
// step e-1 needed; ready() checks that (CONSUMED >= e-2) and never waits in
// practice. The progress thread
// waits for STAGED >= e, reduces, notifies REDUCED = e and goes on with the
// next bucket; a bucket is reduced once every rank's REDUCED >= e, which the
// thread checks between buckets and waits for only when no later bucket is
// queued. Every element is computed by one rank, in rank order, so results
// are bitwise those of the shared-memory allreduce (Note [Bitwise identical
// results]). A rank r >= 2 of three or more writes its sums through an
// L1-sized block (its own input, an operand of the sum, is the destination).
// Groups across nodes keep private buckets and the allreduce algorithms.
//
// Lifecycle, in the order the stages run:
//   FusedReducer()   framework thread, once: lay out buckets, check that all
//                    ranks registered the same layout (collective), start the
//                    progress thread.
//   ready()          any framework thread, once per tensor per step, as soon
//                    as the tensor exists: copy it into its bucket; the last
//                    copy into a bucket queues the bucket.
//   progress_loop()  the progress thread: allreduce queued buckets in id
//                    order (Note [Buckets are reduced in an agreed order]), then wake
//                    the bucket's waiters.
//   when_reduced() / wait()
//                    any framework thread, once per tensor per step: get the
//                    tensor's result (by callback or blocking); the last
//                    collection of a bucket makes it ready for the next step.
//   close()          framework thread, collectively on all ranks, once no
//                    step is in flight: stop the progress thread, free the
//                    shared segments (Note [Closing is explicit]).
//   abandon() / ~FusedReducer()
//                    any thread, also a garbage collector's: stop and join
//                    the progress thread and fail every result still awaited
//                    (a pending TensorFlow FinishAllreduce gets an error, it
//                    is never left waiting); nothing collective.
//
// Note [A cancelled step fails the reducer]
// When an op of a step fails, TensorFlow cancels the step's pending ops; a
// FinishAllreduce then calls cancel_step() and finishes at once instead of
// waiting (until the timeout) for buckets whose other gradients will never
// come. The step stopped partway: some of its tensors were handed in, others
// not, and the other ranks may be inside the bucket allreduces this rank will
// not join. No later step can be matched with theirs, so the reducer fails:
// every awaited result gets the error at once, and any later use says why.
// The job ends through the failed op's error (one rank's uncaught exception
// ends all ranks).
#pragma once

#include <atomic>
#include <chrono>
#include <exception>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "allreduce.hpp"
#include "dtype.hpp"
#include "process_group.hpp"
#include "shared_segments.hpp"

namespace tnt {

struct TensorSpec {
  std::size_t count;
  DType dtype;
};

// When a bucket went through its stages in the last step, in seconds since
// the reducer started; for measuring overlap.
struct BucketTimes {
  double queued = 0;    // the last tensor of the bucket was marked ready
  double started = 0;   // the progress thread began its allreduce
  double finished = 0;  // the allreduce ended
};

class FusedReducer {
 public:
  // Called with an empty string on success, or the error text.
  using Callback = std::function<void(const std::string& error)>;

  FusedReducer(const ProcessGroup& group, std::vector<TensorSpec> tensors, std::size_t fusion_threshold_bytes,
               ReduceOp op, Algorithm algorithm);
  ~FusedReducer();
  FusedReducer(const FusedReducer&) = delete;
  FusedReducer& operator=(const FusedReducer&) = delete;

  void ready(std::size_t tensor, const void* data, std::size_t bytes);
  // Calls `callback` once the tensor's bucket is reduced (at once if it is),
  // on the progress thread or the caller's; the callback then calls
  // copy_result() for this tensor, exactly once.
  void when_reduced(std::size_t tensor, Callback callback);
  void copy_result(std::size_t tensor, void* out, std::size_t bytes);
  // Blocking form of when_reduced + copy_result, under the timeout.
  void wait(std::size_t tensor, void* out, std::size_t bytes);

  std::size_t tensor_count() const { return tensors_.size(); }
  std::size_t bucket_count() const { return buckets_.size(); }
  std::size_t bucket_of(std::size_t tensor) const;
  std::size_t bucket_bytes(std::size_t bucket) const;
  std::vector<BucketTimes> last_step_times() const;
  // steady_clock time (seconds since its epoch: CLOCK_MONOTONIC, Python's time.monotonic) that the
  // BucketTimes count from, so a timeline can place them beside other events of the process.
  double clock_origin() const { return std::chrono::duration<double>(start_.time_since_epoch()).count(); }
  // Bucket allreduces the progress thread finished successfully since the reducer was made.
  std::uint64_t reductions_completed() const { return reductions_completed_.load(std::memory_order_acquire); }
  // The same, summed over every reducer this process ever made (closed ones too).
  static std::uint64_t reductions_completed_in_process();
  // Bytes copied on the reducers' data paths (ready, copy_result, and the
  // shared-memory allreduce's staging and gathering), over the process: for
  // tests of Note [Two copies per gradient byte].
  static std::uint64_t copied_bytes_in_process();
  // True when the buckets live in shared segments (Note [Two copies per gradient byte]).
  bool buckets_in_shared_memory() const { return segments_ != nullptr; }

  // Collective: see the lifecycle above. Later calls fail with UsageError.
  void close();
  // Local: what the destructor does, for a reducer that others may still
  // hold for a moment (Engine::remove_reducer). Idempotent.
  void abandon();
  // Local, any thread, never blocks: a step failed on this rank partway
  // (Note [A cancelled step fails the reducer]).
  void cancel_step();

 private:
  enum class State { filling, queued, reducing, reduced };

  struct TensorSlot {
    std::size_t bucket;        // index into buckets_
    std::size_t offset;        // first element inside the bucket's buffer
    TensorSpec spec;
    std::atomic<bool> marked{false};     // ready() seen this step
    std::atomic<bool> collected{false};  // copy_result() seen this step
  };

  struct Bucket {
    DType dtype;
    std::size_t count = 0;                 // elements, sum of its tensors' counts
    std::vector<std::size_t> tensors;      // its tensors, in registration order
    std::vector<char> buffer;              // private buckets: inputs, then (once reduced) results; reduced in place
    std::size_t shared_offset = 0;         // shared buckets: first byte inside each area of every rank's segment
    std::atomic<std::uint64_t> epoch{1};   // shared buckets: this step's number for its flags, all ranks alike;
                                           // advanced by the last copy_result of a step
    std::atomic<int> missing_inputs{0};    // tensors not yet ready this step; 0 -> queued
    std::atomic<int> missing_outputs{0};   // tensors not yet collected this step; 0 -> filling again
    State state = State::filling;          // guarded by mutex_
    std::vector<Callback> waiters;         // guarded by mutex_; run once reduced
    BucketTimes times;                     // guarded by mutex_
  };

  enum SharedFlag : int { kStaged = 0, kReduced = 1, kConsumed = 2, kFlagsPerBucket = 3 };

  void lay_out(std::size_t fusion_threshold_bytes, bool shared);
  void check_same_layout(std::size_t fusion_threshold_bytes);
  void progress_loop();
  // Progress thread, once it took bucket next_bucket_: the next bucket of the
  // agreed order (Note [Buckets are reduced in an agreed order]); collective
  // once, at the end of step kStepsBeforeReordering.
  void advance_order();
  void agree_on_ready_order();
  // Progress thread, one bucket: its whole allreduce (private buckets), or
  // this rank's chunk of it (shared buckets; then complete once peers_reduced).
  void reduce_bucket(std::size_t id);
  void reduce_own_chunk(std::size_t id);
  // Shared buckets: every peer reduced its chunk of bucket `id` this step.
  // `wait`: poll until it did, or until the next bucket is queued or the
  // reducer stops (then false).
  bool peers_reduced(std::size_t id, bool wait);
  // The bucket's results are complete: wake its waiters.
  void publish_reduced(std::size_t id);
  // Shared buckets: where `bucket` lies in `rank`'s segment in step `epoch`.
  char* bucket_area(const Bucket& bucket, int rank, std::uint64_t epoch) const;
  int flag(std::size_t bucket, SharedFlag which) const { return static_cast<int>(bucket) * kFlagsPerBucket + which; }
  // This rank's tensors of `bucket` not yet marked ready this step, as "tensor(s) 1, 4 of this
  // rank", or "earlier buckets or other ranks" when all were. Caller holds mutex_.
  std::string missing_tensors(const Bucket& bucket) const;
  // Progress thread, idle, holding mutex_ (in `lock`): sleeps until a bucket is queued or the
  // reducer stops; returns an error text when async waiters waited past their deadline.
  std::string wait_for_work(std::unique_lock<std::mutex>& lock);
  void fail(const std::string& error);
  void fail_with(std::exception_ptr error, const std::string& text);
  void stop_progress_thread();
  double now() const;
  TensorSlot& slot(std::size_t tensor, std::size_t bytes, const char* what);

  std::unique_ptr<Allreducer> allreducer_;  // used only by the progress thread (Note [One communicator per user])
  // Shared buckets' memory (Note [Two copies per gradient byte]), over allreducer_'s group; null otherwise.
  std::unique_ptr<SharedSegments> segments_;
  std::size_t shared_area_bytes_ = 0;      // shared buckets: bytes of one area (all buckets, 64-byte aligned)
  std::vector<const void*> inputs_;         // progress thread only: the reduction's operands
  ReduceOp op_;
  Algorithm algorithm_;
  std::vector<std::unique_ptr<TensorSlot>> tensors_;
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();

  mutable std::mutex mutex_;
  std::condition_variable queued_;    // the progress thread waits here for its next bucket
  std::condition_variable reduced_;   // blocking wait() waits here
  bool stopping_ = false;             // guarded by mutex_
  std::string error_;                 // guarded by mutex_; once set, every call fails with it
  std::exception_ptr error_ptr_;      // guarded by mutex_; the exception behind error_
  std::atomic<bool> failed_{false};   // error_ is set; read without the lock on hot paths
  // Note [Async finishes have a deadline]: since when async waiters (when_reduced) have waited
  // without any bucket being reduced; unset while none waits. Guarded by mutex_.
  std::optional<std::chrono::steady_clock::time_point> waiters_since_;
  std::size_t next_bucket_ = 0;       // progress thread only: the bucket it reduces next, order_[position_]
  std::vector<std::size_t> order_;    // progress thread only: bucket ids in the agreed order (a permutation)
  std::size_t position_ = 0;          // progress thread only: next_bucket_'s index in order_
  std::uint64_t steps_taken_ = 0;     // progress thread only: steps whose every bucket it took
  static constexpr std::uint64_t kStepsBeforeReordering = 2;
  std::atomic<std::uint64_t> reductions_completed_{0};  // written by the progress thread only
  bool closed_ = false;               // framework thread only: close() ran
  std::thread progress_thread_;       // last member: starts after everything above exists
};

}  // namespace tnt
