#include "graph_allreducer.hpp"

#include <exception>
#include <utility>

namespace tnt {

GraphAllreducer::GraphAllreducer(const ProcessGroup& group, Algorithm algorithm)
    : allreducer_(group), algorithm_(algorithm), worker_([this] { work(); }) {}

GraphAllreducer::~GraphAllreducer() { stop_worker(); }

void GraphAllreducer::submit(const AllreduceCall& call, Callback done) {
  std::string failure;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) failure = "the in-graph allreducer was closed before this sum was asked for";
    else if (!failure_.empty()) failure = failure_;
    else queue_.push_back(Queued{call, std::move(done)});
  }
  if (!failure.empty()) {
    done(failure);
    return;
  }
  queued_.notify_one();
}

void GraphAllreducer::cancel_step() {
  std::deque<Queued> dropped;
  const std::string text = "a training step was cancelled partway on this rank (an op of it failed); the ranks' "
                           "in-graph sums no longer match, so this allreducer cannot be used again";
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failure_.empty()) failure_ = text;
    dropped.swap(queue_);
  }
  for (Queued& queued : dropped) queued.done(text);
}

void GraphAllreducer::close() {
  if (closed_) return;
  stop_worker();
  closed_ = true;
  if (!allreducer_.group().failed()) allreducer_.close();
}

void GraphAllreducer::stop_worker() {
  std::deque<Queued> dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    dropped.swap(queue_);
  }
  queued_.notify_all();
  if (worker_.joinable()) worker_.join();
  for (Queued& queued : dropped) queued.done("the in-graph allreducer was closed before this sum ran");
}

void GraphAllreducer::work() {
  for (;;) {
    Queued next;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      queued_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    std::string failure;
    try {
      allreducer_.run(next.call, algorithm_);
    } catch (const std::exception& e) {
      failure = e.what();  // a failed group stays failed by itself; a mismatch leaves the next sums usable
    }
    next.done(failure);
  }
}

}  // namespace tnt
