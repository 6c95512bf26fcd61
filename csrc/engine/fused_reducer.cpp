#include "fused_reducer.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "descriptor_exchange.hpp"
#include "errors.hpp"
#include "fnv1a.hpp"
#include "log.hpp"
#include "quarantine.hpp"

namespace tnt {

namespace {
std::atomic<std::uint64_t> g_reductions_completed{0};
std::string tensor_text(std::size_t tensor) { return "tensor " + std::to_string(tensor); }
}  // namespace

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
  lay_out(fusion_threshold_bytes);
  check_same_layout(fusion_threshold_bytes);
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
  if (!allreducer_->group().failed()) allreducer_->close();
}

void FusedReducer::abandon() {
  stop_progress_thread();
  // Whoever still waits for a result (a FinishAllreduce op) hears of it now.
  const char* text = "the gradient reducer was closed or destroyed before this result was delivered";
  fail_with(std::make_exception_ptr(UsageError(text)), text);
}

FusedReducer::~FusedReducer() {
  abandon();
  if (allreducer_->group().failed()) {
    // Note [Memory that a failed collective may still write]
    for (auto& bucket : buckets_) quarantine(std::move(bucket->buffer));
  }
}

void FusedReducer::lay_out(std::size_t fusion_threshold_bytes) {
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
  for (auto& bucket : buckets_) {
    bucket->buffer.resize(bucket->count * element_size(bucket->dtype));
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
  std::memcpy(bucket.buffer.data() + slot.offset * element_size(bucket.dtype), data, bytes);
  if (bucket.missing_inputs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      bucket.state = State::queued;
      bucket.times.queued = now();
    }
    queued_.notify_one();
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
// (back_off()).
void FusedReducer::progress_loop() {
  for (;;) {
    Bucket* bucket = nullptr;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      queued_.wait(lock, [&] { return stopping_ || buckets_[next_bucket_]->state == State::queued; });
      if (stopping_) return;
      bucket = buckets_[next_bucket_].get();
      bucket->state = State::reducing;
      bucket->times.started = now();
    }
    const std::size_t id = next_bucket_;
    try {
      const AllreduceCall call{bucket->buffer.data(), bucket->buffer.data(), bucket->count, bucket->dtype, op_};
      allreducer_->run(call, algorithm_, /*verified=*/true);
      advance_order();  // before the waiters wake: this step's queued times are all still in place
    } catch (const std::exception& error) {
      fail("gradient bucket " + std::to_string(id) + ": " + error.what());
      return;
    }
    std::vector<Callback> waiters;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      bucket->state = State::reduced;
      bucket->times.finished = now();
      reductions_completed_.fetch_add(1, std::memory_order_acq_rel);
      g_reductions_completed.fetch_add(1, std::memory_order_acq_rel);
      waiters.swap(bucket->waiters);
    }
    reduced_.notify_all();
    for (Callback& waiter : waiters) waiter(std::string());
  }
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
  std::memcpy(out, bucket.buffer.data() + slot.offset * element_size(bucket.dtype), bytes);
  if (bucket.missing_outputs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
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
        "wait: " + tensor_text(tensor) + "'s bucket " + std::to_string(slot.bucket), [&] {
          std::string missing;
          for (std::size_t id : bucket.tensors) {
            if (!tensors_[id]->marked.load()) missing += (missing.empty() ? "" : ", ") + std::to_string(id);
          }
          return missing.empty() ? std::string("earlier buckets or other ranks")
                                 : "tensor(s) " + missing + " of this rank";
        });
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
  return buckets_[bucket]->buffer.size();
}

std::vector<BucketTimes> FusedReducer::last_step_times() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<BucketTimes> times;
  for (const auto& bucket : buckets_) times.push_back(bucket->times);
  return times;
}

}  // namespace tnt
