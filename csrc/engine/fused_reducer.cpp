#include "fused_reducer.hpp"

#include <algorithm>
#include <cstring>
#include <deque>
#include <numeric>

#if defined(__linux__)
#include <sys/prctl.h>
#endif

#include "copy_count.hpp"
#include "deadline.hpp"
#include "descriptor_exchange.hpp"
#include "errors.hpp"
#include "fnv1a.hpp"
#include "log.hpp"
#include "quarantine.hpp"
#include "reduce_kernels.hpp"

namespace tnt {

namespace {
std::atomic<std::uint64_t> g_reductions_completed{0};
std::atomic<std::uint64_t> g_copied_bytes{0};
std::string tensor_text(std::size_t tensor) { return "tensor " + std::to_string(tensor); }
constexpr std::size_t kAlignment = 64;  // shared buckets start on their own cache line
constexpr std::size_t kBlockBytes = 4096;  // Note [Two copies per gradient byte]: the L1-sized block

// out[i] = in[0][i] (op) ... (op) in[n-1][i] where `out` is in[self]: reduce_many
// may alias only in[0], and in[1] works too (its first pass reads in[1][i] before
// writing out[i], later passes never read it); others go through a small block.
void reduce_into_operand(char* out, const void* const* in, int n, int self, std::size_t count, DType dtype,
                         ReduceOp op) {
  if (self <= 1) {
    reduce_many(out, in, n, count, dtype, op);
    return;
  }
  alignas(kAlignment) char block[kBlockBytes];
  const std::size_t elem = element_size(dtype);
  const std::size_t per_block = kBlockBytes / elem;
  std::vector<const void*> parts(n);
  for (std::size_t done = 0; done < count; done += per_block) {
    const std::size_t length = std::min(per_block, count - done);
    for (int r = 0; r < n; ++r) parts[r] = static_cast<const char*>(in[r]) + done * elem;
    reduce_many(block, parts.data(), n, length, dtype, op);
    std::memcpy(out + done * elem, block, length * elem);
  }
}
}  // namespace

void count_copied(std::size_t bytes) { g_copied_bytes.fetch_add(bytes, std::memory_order_relaxed); }

std::uint64_t FusedReducer::copied_bytes_in_process() { return g_copied_bytes.load(std::memory_order_relaxed); }

FusedReducer::FusedReducer(const ProcessGroup& group, std::vector<TensorSpec> tensors,
                           std::size_t fusion_threshold_bytes, ReduceOp op, Algorithm algorithm)
    : allreducer_(std::make_unique<Allreducer>(group)), op_(op), algorithm_(algorithm) {
  if (tensors.empty()) throw UsageError("a reducer needs at least one tensor to reduce");
  tensors_.reserve(tensors.size());
  for (const TensorSpec& spec : tensors) {
    auto slot = std::make_unique<TensorSlot>();
    slot->spec = spec;
    tensors_.push_back(std::move(slot));
  }
  ProcessGroup& own_group = allreducer_->group();
  // Note [Two copies per gradient byte]
  const bool shared = own_group.size() > 1 && own_group.on_one_node() &&
                      allreducer_->resolve(algorithm, 0) == Algorithm::shared_memory;
  lay_out(fusion_threshold_bytes, shared);
  check_same_layout(fusion_threshold_bytes);
  if (shared) {
    for (const auto& bucket : buckets_) {
      const std::size_t end = bucket->shared_offset + bucket->count * element_size(bucket->dtype);
      shared_area_bytes_ = std::max(shared_area_bytes_, (end + kAlignment - 1) / kAlignment * kAlignment);
    }
    // Two areas, used by odd and even steps (Note [Two copies per gradient byte]).
    segments_ = std::make_unique<SharedSegments>(own_group, 2 * shared_area_bytes_,
                                                 kFlagsPerBucket * static_cast<int>(buckets_.size()));
    inputs_.resize(own_group.size());
  }
  progress_thread_ = std::thread([this] { progress_loop(); });
}

std::uint64_t FusedReducer::reductions_completed_in_process() {
  return g_reductions_completed.load(std::memory_order_acquire);
}

void FusedReducer::stop_progress_thread() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  queued_.notify_all();
  if (progress_thread_.joinable()) progress_thread_.join();
}

void FusedReducer::close() {
  if (closed_) return;
  stop_progress_thread();
  closed_ = true;
  abandon();
  // A failed group keeps its windows (Note [A failed group stays failed]).
  if (!allreducer_->group().failed()) {
    allreducer_->close();
    if (segments_) segments_->close();
  }
}

void FusedReducer::abandon() {
  stop_progress_thread();
  // Whoever still waits for a result (a FinishAllreduce op) hears of it now.
  const char* text = "the gradient reducer was closed or destroyed before this result was delivered";
  fail_with(std::make_exception_ptr(UsageError(text)), text);
}

// See Note [A cancelled step fails the reducer].
void FusedReducer::cancel_step() {
  const char* text = "a training step was cancelled partway on this rank (an op of it failed); "
                     "the ranks' steps no longer match, so this reducer cannot be used again";
  fail_with(std::make_exception_ptr(UsageError(text)), text);
}

FusedReducer::~FusedReducer() {
  abandon();
  if (allreducer_->group().failed()) {
    // Note [Memory that a failed collective may still write]
    for (auto& bucket : buckets_) quarantine(std::move(bucket->buffer));
  }
}

void FusedReducer::lay_out(std::size_t fusion_threshold_bytes, bool shared) {
  Bucket* current = nullptr;
  std::size_t current_bytes = 0;
  for (std::size_t id = 0; id < tensors_.size(); ++id) {
    TensorSlot& tensor = *tensors_[id];
    const bool closed = current == nullptr || current->dtype != tensor.spec.dtype ||
                        (current_bytes >= fusion_threshold_bytes && !current->tensors.empty());
    if (closed) {
      buckets_.push_back(std::make_unique<Bucket>());
      current = buckets_.back().get();
      current->dtype = tensor.spec.dtype;
      current_bytes = 0;
    }
    tensor.bucket = buckets_.size() - 1;
    tensor.offset = current->count;
    current->count += tensor.spec.count;
    current->tensors.push_back(id);
    current_bytes += tensor.spec.count * element_size(tensor.spec.dtype);
  }
  std::size_t shared_bytes = 0;
  for (auto& bucket : buckets_) {
    const std::size_t bytes = bucket->count * element_size(bucket->dtype);
    if (shared) {
      bucket->shared_offset = shared_bytes;
      shared_bytes += (bytes + kAlignment - 1) / kAlignment * kAlignment;
    } else {
      bucket->buffer.resize(bytes);
    }
    bucket->missing_inputs = static_cast<int>(bucket->tensors.size());
    bucket->missing_outputs = static_cast<int>(bucket->tensors.size());
  }
  order_.resize(buckets_.size());
  std::iota(order_.begin(), order_.end(), std::size_t{0});  // Note [Buckets are reduced in an agreed order]
}

void FusedReducer::check_same_layout(std::size_t fusion_threshold_bytes) {
  // Note [Ranks call alike]: the hash over every tensor's (count, dtype) is equal on all ranks iff the layouts are.
  Fnv1a hash;
  std::uint64_t total_elements = 0;
  for (const auto& tensor : tensors_) {
    hash.add(tensor->spec.count);
    hash.add(static_cast<std::uint64_t>(tensor->spec.dtype));
    total_elements += tensor->spec.count;
  }
  ProcessGroup& group = allreducer_->group();
  DescriptorExchange exchange(group, "gradient reducer set-up (checking the ranks' layouts)");
  exchange.start(Descriptor{hash.value(), tensors_.size(), total_elements, fusion_threshold_bytes,
                            static_cast<std::uint64_t>(op_), static_cast<std::uint64_t>(algorithm_)});
  exchange.wait();
  if (exchange.all_same()) return;
  std::string text = "ranks registered different gradient layouts:";
  for (int r = 0; r < group.size(); ++r) {
    const Descriptor& d = exchange.of(r);
    text += std::string(r ? ";" : "") + " rank " + std::to_string(group.world_rank_of(r)) + " has " +
            std::to_string(d[1]) + " tensors of " + std::to_string(d[2]) + " elements in total (layout hash " +
            std::to_string(d[0] % 100000) + "), fusion threshold " + std::to_string(d[3]) + " bytes, op " +
            op_name(static_cast<ReduceOp>(d[4])) + ", algorithm " + algorithm_name(static_cast<Algorithm>(d[5]));
  }
  throw MismatchError(text + ". Every rank must build the same model and use the same fusion threshold "
                             "(TNT_FUSION_THRESHOLD_KB)");
}

double FusedReducer::now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

FusedReducer::TensorSlot& FusedReducer::slot(std::size_t tensor, std::size_t bytes, const char* what) {
  if (tensor >= tensors_.size()) {
    throw UsageError(std::string(what) + ": " + tensor_text(tensor) + " does not exist; the reducer has " +
                     std::to_string(tensors_.size()) + " tensors");
  }
  TensorSlot& slot = *tensors_[tensor];
  const std::size_t expected = slot.spec.count * element_size(slot.spec.dtype);
  if (bytes != expected) {
    throw UsageError(std::string(what) + ": " + tensor_text(tensor) + " was registered with " +
                     std::to_string(slot.spec.count) + " " + dtype_name(slot.spec.dtype) + " elements (" +
                     std::to_string(expected) + " bytes) but got " + std::to_string(bytes) + " bytes");
  }
  if (failed_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::rethrow_exception(error_ptr_);
  }
  // A group that failed elsewhere (another reducer, a main-thread collective) fails this reducer at once.
  allreducer_->group().check_usable(what);
  return slot;
}

void FusedReducer::ready(std::size_t tensor, const void* data, std::size_t bytes) {
  TensorSlot& slot = this->slot(tensor, bytes, "ready");
  Bucket& bucket = *buckets_[slot.bucket];
  if (slot.marked.exchange(true, std::memory_order_acq_rel)) {
    throw UsageError("ready: " + tensor_text(tensor) + " was marked ready twice before its result was collected; "
                     "every tensor is marked ready once and collected once per step");
  }
  const std::uint64_t epoch = bucket.epoch.load(std::memory_order_acquire);
  if (segments_ && epoch > 2) {
    // Note [Two copies per gradient byte]: this area last held step epoch-2's results. Peers collected them
    // before they handed in step epoch-1's tensors, which this rank's collection of epoch-1 needed: no wait.
    segments_->wait_for_others(flag(slot.bucket, kConsumed), epoch - 2,
                               "gradient reducer (a peer still collecting an earlier step's results)");
  }
  char* area = segments_ ? bucket_area(bucket, allreducer_->group().rank(), epoch) : bucket.buffer.data();
  std::memcpy(area + slot.offset * element_size(bucket.dtype), data, bytes);
  count_copied(bytes);
  if (bucket.missing_inputs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    if (segments_) segments_->notify(flag(slot.bucket, kStaged), epoch);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      bucket.state = State::queued;
      bucket.times.queued = now();
    }
    queued_.notify_one();
    // The progress thread may sleep on the doorbell, waiting for peers' sums (peers_reduced): this bucket ends that.
    if (segments_) segments_->ring(allreducer_->group().rank());
  }
}

// Note [One progress thread]
// One background thread per reducer issues every bucket's allreduce, because
// MPI collectives on a communicator must be issued in one order (Note
// [Buckets are reduced in an agreed order]) and a single thread gives that order for
// free. It runs asynchronously to the framework so that backprop goes on
// computing while buckets travel: ready() only copies and queues. A thread per
// tensor would oversubscribe the cores that compute the gradients and still
// have to serialise on the communicator. While no bucket is queued the thread
// sleeps on a condition variable, so an idle rank spends no CPU on it; while a
// collective waits for peers it backs off from spinning to sleeping
// (back_off()); waits for a peer's flag in shared memory sleep on this rank's
// doorbell until a peer rings it (Note [Doorbells] in shared_segments.hpp).
// Linux lets a timed sleep overrun by the thread's timer slack, 50 us by
// default, which a bucket whose peer is ready would wait on top of its
// reduction. 1 us of slack makes those sleeps as short as asked (the thread
// sleeps no more often).
void FusedReducer::progress_loop() {
#if defined(__linux__)
  prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);  // nanoseconds, this thread only
#endif
  std::deque<std::size_t> completing;  // shared buckets whose own chunk is reduced, in reduction order
  for (;;) {
    std::size_t id = 0;
    bool took = false;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      std::string expired;
      if (completing.empty()) expired = wait_for_work(lock);
      if (!expired.empty()) {
        lock.unlock();
        fail_with(std::make_exception_ptr(TimeoutError(expired)), expired);
        return;
      }
      if (stopping_) return;
      if (buckets_[next_bucket_]->state == State::queued) {
        id = next_bucket_;
        took = true;
        buckets_[id]->state = State::reducing;
        buckets_[id]->times.started = now();
      }
    }
    std::size_t current = id;
    try {
      if (took) {
        advance_order();
        reduce_bucket(id);
        if (segments_) {
          completing.push_back(id);
        } else {
          publish_reduced(id);
        }
      }
      // Shared buckets: finish those every peer reduced too; wait only when no later bucket is queued.
      while (!completing.empty()) {
        current = completing.front();
        if (!peers_reduced(current, /*wait=*/!took)) break;
        completing.pop_front();
        publish_reduced(current);
      }
    } catch (const std::exception& error) {
      fail("gradient bucket " + std::to_string(current) + ": " + error.what());
      return;
    }
  }
}

// Note [Async finishes have a deadline]
// A blocking wait() runs under a Deadline of its own. An async finish (the TF op's
// when_reduced) cannot: it returns at once and its callback runs when the bucket is
// reduced. If a tensor of the bucket is never marked ready (a step that hands over
// only some gradients, a tensor handed over twice instead of two), nothing would ever
// run the callback and the step would wait forever, with every thread asleep. So the
// idle progress thread keeps the deadline for them: when async waiters have waited
// twice the timeout (the bound wait() uses) without any bucket being reduced, the
// reducer fails with a TimeoutError naming this rank's missing tensors, and every
// waiter gets it. Any reduced bucket restarts the clock: a slow but moving step is
// not cut short; peers that stop are caught by the reduction's own deadline.
std::string FusedReducer::wait_for_work(std::unique_lock<std::mutex>& lock) {
  const auto has_work = [&] { return stopping_ || buckets_[next_bucket_]->state == State::queued; };
  const WaitLimits& limits = allreducer_->group().limits();
  const WaitLimits async_limits{2 * limits.timeout_seconds, 2 * limits.stall_warning_seconds};
  while (!has_work()) {
    if (!waiters_since_) {
      queued_.wait(lock);
      continue;
    }
    const auto limit = *waiters_since_ + std::chrono::duration_cast<Deadline::Clock::duration>(
                                             std::chrono::duration<double>(async_limits.timeout_seconds));
    if (queued_.wait_until(lock, limit, has_work)) break;
    if (!waiters_since_ || Deadline::Clock::now() < limit) continue;  // a bucket was reduced meanwhile
    for (const auto& bucket : buckets_) {
      if (bucket->waiters.empty()) continue;
      const std::size_t id = static_cast<std::size_t>(&bucket - buckets_.data());
      Deadline deadline(async_limits, *waiters_since_, "every registered tensor must be marked ready once per step");
      return deadline.timeout_error("finish of bucket " + std::to_string(id), missing_tensors(*bucket)).what();
    }
    waiters_since_.reset();
  }
  return std::string();
}

std::string FusedReducer::missing_tensors(const Bucket& bucket) const {
  std::string missing;
  for (std::size_t id : bucket.tensors) {
    if (!tensors_[id]->marked.load()) missing += (missing.empty() ? "" : ", ") + std::to_string(id);
  }
  return missing.empty() ? std::string("earlier buckets or other ranks") : "tensor(s) " + missing + " of this rank";
}

void FusedReducer::advance_order() {
  position_ = (position_ + 1) % order_.size();
  if (position_ == 0 && ++steps_taken_ == kStepsBeforeReordering && order_.size() > 1) agree_on_ready_order();
  next_bucket_ = order_[position_];
}

// Note [Buckets are reduced in an agreed order]. Called once the step's last
// bucket was taken, before its results are delivered: every bucket was queued
// in this step (the framework collects that bucket's results, and so begins
// its next step, only after it is reduced). A mixed snapshot would still give
// one order on all ranks.
void FusedReducer::agree_on_ready_order() {
  std::vector<std::uint64_t> order(order_.size());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::iota(order.begin(), order.end(), std::uint64_t{0});
    std::stable_sort(order.begin(), order.end(), [&](std::uint64_t a, std::uint64_t b) {
      return buckets_[a]->times.queued < buckets_[b]->times.queued;
    });
  }
  ProcessGroup& group = allreducer_->group();
  try {
    group.broadcast(order.data(), order.size() * sizeof(std::uint64_t), 0);
  } catch (...) {
    if (group.failed()) quarantine(std::move(order));  // Note [Memory that a failed collective may still write]
    throw;
  }
  std::vector<bool> seen(order_.size(), false);
  for (std::uint64_t id : order) {
    TNT_ASSERT(id < seen.size() && !seen[id], "the agreed bucket order is not a permutation of the buckets");
    seen[id] = true;
  }
  order_.assign(order.begin(), order.end());
}

void FusedReducer::reduce_bucket(std::size_t id) {
  Bucket& bucket = *buckets_[id];
  if (segments_) {
    allreducer_->group().guarded("gradient reducer", [&] { reduce_own_chunk(id); });
    return;
  }
  const AllreduceCall call{bucket.buffer.data(), bucket.buffer.data(), bucket.count, bucket.dtype, op_};
  allreducer_->run(call, algorithm_, /*verified=*/true);
}

void FusedReducer::reduce_own_chunk(std::size_t id) {
  // The rank's compute threads want the cores meanwhile (deadline.hpp): sleep until a peer's flag changes
  // (Note [Doorbells] in shared_segments.hpp).
  SharedSegments::DoorbellSleeper sleeper(*segments_);
  PatientWaits patient(&sleeper);
  Bucket& bucket = *buckets_[id];
  const std::uint64_t epoch = bucket.epoch.load(std::memory_order_acquire);
  segments_->wait_for_others(flag(id, kStaged), epoch, "gradient reducer (waiting for the peers' gradients)");
  const ProcessGroup& group = allreducer_->group();
  const int p = group.size();
  const int self = group.rank();
  const std::size_t elem = element_size(bucket.dtype);
  const Range own = part_of(bucket.count, p, self);
  for (int r = 0; r < p; ++r) inputs_[r] = bucket_area(bucket, r, epoch) + own.offset * elem;
  char* result = bucket_area(bucket, self, epoch) + own.offset * elem;
  reduce_into_operand(result, inputs_.data(), p, self, own.length, bucket.dtype, op_);
  finish_average(result, own.length, bucket.dtype, op_, p);
  segments_->notify(flag(id, kReduced), epoch);
}

bool FusedReducer::peers_reduced(std::size_t id, bool wait) {
  // As in reduce_own_chunk; ready() rings this rank's doorbell too when it queues a bucket, which ends this wait.
  SharedSegments::DoorbellSleeper sleeper(*segments_);
  PatientWaits patient(&sleeper);
  const std::uint64_t epoch = buckets_[id]->epoch.load(std::memory_order_acquire);
  ProcessGroup& group = allreducer_->group();
  const int self = group.rank();
  const int reduced = flag(id, kReduced);
  auto all_reduced = [&] {
    for (int r = 0; r < group.size(); ++r) {
      if (r != self && segments_->peek(r, reduced) < epoch) return false;
    }
    return true;
  };
  if (all_reduced() || !wait) return all_reduced();
  bool interrupted = false;
  group.guarded("gradient reducer", [&] {
    group.wait_until(
        [&] {
          if (all_reduced()) return true;
          std::lock_guard<std::mutex> lock(mutex_);
          interrupted = stopping_ || buckets_[next_bucket_]->state == State::queued;
          return interrupted;
        },
        "gradient reducer (waiting for the peers' sums)",
        [&] {
          std::vector<int> behind;
          for (int r = 0; r < group.size(); ++r) {
            if (r != self && segments_->peek(r, reduced) < epoch) behind.push_back(r);
          }
          return group.describe_ranks(behind);
        });
  });
  return all_reduced();
}

void FusedReducer::publish_reduced(std::size_t id) {
  Bucket& bucket = *buckets_[id];
  std::vector<Callback> waiters;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    bucket.state = State::reduced;
    bucket.times.finished = now();
    reductions_completed_.fetch_add(1, std::memory_order_acq_rel);
    g_reductions_completed.fetch_add(1, std::memory_order_acq_rel);
    waiters.swap(bucket.waiters);
    // Progress: async waiters of other buckets count from now (Note [Async finishes have a deadline]).
    if (waiters_since_) {
      const bool others_wait = std::any_of(buckets_.begin(), buckets_.end(),
                                           [](const auto& other) { return !other->waiters.empty(); });
      waiters_since_ = others_wait ? std::optional<Deadline::Clock::time_point>(Deadline::Clock::now())
                                   : std::nullopt;
    }
  }
  reduced_.notify_all();
  for (Callback& waiter : waiters) waiter(std::string());
}

char* FusedReducer::bucket_area(const Bucket& bucket, int rank, std::uint64_t epoch) const {
  return segments_->data(rank) + (epoch % 2) * shared_area_bytes_ + bucket.shared_offset;
}

void FusedReducer::fail(const std::string& error) {
  log_warning(error);
  std::exception_ptr typed;
  try {
    std::rethrow_exception(std::current_exception());
  } catch (const TimeoutError&) {
    typed = std::make_exception_ptr(TimeoutError(error));
  } catch (const MismatchError&) {
    typed = std::make_exception_ptr(MismatchError(error));
  } catch (const GroupFailedError&) {
    typed = std::make_exception_ptr(GroupFailedError(error));
  } catch (...) {
    typed = std::make_exception_ptr(Error(error));
  }
  fail_with(typed, error);
}

// Records the first failure; fails every waiter, also those of a later one.
void FusedReducer::fail_with(std::exception_ptr error, const std::string& text) {
  std::vector<Callback> waiters;
  std::string reported;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (error_.empty()) {
      error_ = text;
      error_ptr_ = error;
      failed_.store(true, std::memory_order_release);
    }
    reported = error_;
    for (auto& bucket : buckets_) {
      for (Callback& waiter : bucket->waiters) waiters.push_back(std::move(waiter));
      bucket->waiters.clear();
    }
  }
  reduced_.notify_all();
  for (Callback& waiter : waiters) waiter(reported);
}

void FusedReducer::when_reduced(std::size_t tensor, Callback callback) {
  if (tensor >= tensors_.size()) throw UsageError("when_reduced: " + tensor_text(tensor) + " does not exist");
  Bucket& bucket = *buckets_[tensors_[tensor]->bucket];
  std::string error;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (error_.empty() && bucket.state != State::reduced) {
      bucket.waiters.push_back(std::move(callback));
      if (!waiters_since_) {
        waiters_since_ = Deadline::Clock::now();
        queued_.notify_all();  // an idle progress thread starts keeping the deadline
      }
      return;
    }
    error = error_;
  }
  callback(error);
}

void FusedReducer::copy_result(std::size_t tensor, void* out, std::size_t bytes) {
  TensorSlot& slot = this->slot(tensor, bytes, "copy_result");
  Bucket& bucket = *buckets_[slot.bucket];
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TNT_ASSERT(bucket.state == State::reduced, "copy_result before the bucket was reduced");
  }
  if (slot.collected.exchange(true, std::memory_order_acq_rel)) {
    throw UsageError("copy_result: the result of " + tensor_text(tensor) + " was collected twice in one step");
  }
  const std::size_t elem = element_size(bucket.dtype);
  if (segments_) {
    // Each rank's chunk from its own segment (Note [Two copies per gradient byte]).
    const int p = allreducer_->group().size();
    const std::size_t begin = slot.offset;
    const std::size_t end = begin + slot.spec.count;
    const std::uint64_t epoch = bucket.epoch.load(std::memory_order_acquire);
    for (int c = 0; c < p; ++c) {
      const Range chunk = part_of(bucket.count, p, c);
      const std::size_t low = std::max(begin, chunk.offset);
      const std::size_t high = std::min(end, chunk.offset + chunk.length);
      if (low >= high) continue;
      std::memcpy(static_cast<char*>(out) + (low - begin) * elem,
                  bucket_area(bucket, c, epoch) + low * elem, (high - low) * elem);
    }
  } else {
    std::memcpy(out, bucket.buffer.data() + slot.offset * elem, bytes);
  }
  count_copied(bytes);
  if (bucket.missing_outputs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    if (segments_) {
      const std::uint64_t epoch = bucket.epoch.load(std::memory_order_acquire);
      segments_->notify(flag(slot.bucket, kConsumed), epoch);
      bucket.epoch.store(epoch + 1, std::memory_order_release);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    for (std::size_t id : bucket.tensors) {
      tensors_[id]->marked.store(false, std::memory_order_relaxed);
      tensors_[id]->collected.store(false, std::memory_order_relaxed);
    }
    bucket.missing_inputs.store(static_cast<int>(bucket.tensors.size()), std::memory_order_release);
    bucket.missing_outputs.store(static_cast<int>(bucket.tensors.size()), std::memory_order_release);
    bucket.state = State::filling;
  }
}

void FusedReducer::wait(std::size_t tensor, void* out, std::size_t bytes) {
  TensorSlot& slot = this->slot(tensor, bytes, "wait");
  Bucket& bucket = *buckets_[slot.bucket];
  const WaitLimits& limits = allreducer_->group().limits();
  {
    // The progress thread has its own deadline for peers; this one catches a
    // bucket that never completes on this rank. It allows for the peer wait too.
    Deadline deadline(WaitLimits{2 * limits.timeout_seconds, 2 * limits.stall_warning_seconds},
                      Deadline::Clock::now(), "every registered tensor must be marked ready once per step");
    std::unique_lock<std::mutex> lock(mutex_);
    deadline.wait(
        lock, reduced_, [&] { return !error_.empty() || bucket.state == State::reduced; },
        "wait: " + tensor_text(tensor) + "'s bucket " + std::to_string(slot.bucket),
        [&] { return missing_tensors(bucket); });
    if (!error_.empty()) std::rethrow_exception(error_ptr_);
  }
  copy_result(tensor, out, bytes);
}

std::size_t FusedReducer::bucket_of(std::size_t tensor) const {
  if (tensor >= tensors_.size()) throw UsageError("bucket_of: " + tensor_text(tensor) + " does not exist");
  return tensors_[tensor]->bucket;
}

std::size_t FusedReducer::bucket_bytes(std::size_t bucket) const {
  if (bucket >= buckets_.size()) throw UsageError("bucket " + std::to_string(bucket) + " does not exist");
  return buckets_[bucket]->count * element_size(buckets_[bucket]->dtype);
}

std::vector<BucketTimes> FusedReducer::last_step_times() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<BucketTimes> times;
  for (const auto& bucket : buckets_) times.push_back(bucket->times);
  return times;
}

}  // namespace tnt
