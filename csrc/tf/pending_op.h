// An AsyncOpKernel's call that waits for the engine: the transfer ops
// (p2p_ops.cc) and FinishAllreduce (allreduce_ops.cc).
//
// Note [A waiting op finishes once: by the engine or by cancellation]
// When an op of a step fails, TensorFlow's executor cancels the step's
// cancellation manager and then waits for every op still running, ours
// included. An op that waited only for the engine would hold the failed step
// (and the job) until the engine's timeout, minutes later: a receive posted
// ahead for a pass that will never run, a send whose peer waits on this rank
// for something else first, a gradient whose bucket will never fill. So each
// call registers with the step's cancellation manager; on cancellation it
// asks the engine to withdraw what it posted (`withdraw`) and finishes at once
// as Cancelled. Whichever comes first, the engine's callback or the
// cancellation, finishes the op; the other finds it finished. The engine may
// still write into the buffer after a cancelled op finished (MPI cannot
// always take a transfer back), so the call keeps `held`, a reference to the
// buffer, until the engine's callback has run: the engine owns one reference
// to the call, the cancellation callback another.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "tensorflow/core/framework/cancellation.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tnt_tf {

class PendingOp {
 public:
  PendingOp(::tensorflow::OpKernelContext* context, ::tensorflow::AsyncOpKernel::DoneCallback done, std::string what,
            ::tensorflow::Tensor held)
      : context_(context), done_(std::move(done)), what_(std::move(what)), held_(std::move(held)) {}

  // Registers with the step's cancellation manager, calling `withdraw` on cancellation (on the cancelling
  // thread, before the op finishes). False if the step is cancelled already: the op is then finished.
  static bool watch(const std::shared_ptr<PendingOp>& self, std::function<void()> withdraw) {
    ::tensorflow::CancellationManager* manager = self->context_->cancellation_manager();
    if (manager == nullptr) return true;
    const ::tensorflow::CancellationToken token = manager->get_cancellation_token();
    self->withdraw_ = std::move(withdraw);
    std::weak_ptr<PendingOp> weak = self;
    const bool registered = manager->RegisterCallback(token, [weak] {
      if (std::shared_ptr<PendingOp> op = weak.lock()) op->cancel();
    });
    if (!registered) {
      self->finish(::tensorflow::errors::Cancelled("tarantella: ", self->what_, ": the step was cancelled"), false);
      return false;
    }
    self->manager_ = manager;
    self->token_ = token;
    return true;
  }

  // The context the engine's callback gets: it owns a reference to the call until engine_done runs.
  static void* engine_context(const std::shared_ptr<PendingOp>& self) {
    return new std::shared_ptr<PendingOp>(self);
  }
  // The engine gave up before it took the context (nothing was posted): drop its reference.
  static void release(void* context) { delete static_cast<std::shared_ptr<PendingOp>*>(context); }

  // tnt_done_fn: the engine is done with the buffer; `error` is NULL on success.
  static void engine_done(void* context, const char* error) {
    std::unique_ptr<std::shared_ptr<PendingOp>> owner(static_cast<std::shared_ptr<PendingOp>*>(context));
    PendingOp& op = **owner;
    op.finish(error ? ::tensorflow::errors::Internal("tarantella: ", op.what_, ": ", error)
                    : ::tensorflow::OkStatus(),
              true);
  }

  // Finishes the op with `status` unless it is finished already (then nothing).
  void finish(const ::tensorflow::Status& status, bool deregister) {
    if (finished_.exchange(true)) return;
    // Not from the cancellation callback: the manager runs it and may be gone once the op is done.
    if (deregister && manager_ != nullptr) manager_->TryDeregisterCallback(token_);
    if (!status.ok()) context_->SetStatus(status);
    ::tensorflow::AsyncOpKernel::DoneCallback done = std::move(done_);
    done();
  }

  const std::string& what() const { return what_; }

 private:
  void cancel() {
    if (withdraw_) withdraw_();
    finish(::tensorflow::errors::Cancelled("tarantella: ", what_, ": cancelled, another op of the step failed"),
           false);
  }

  ::tensorflow::OpKernelContext* context_;
  ::tensorflow::AsyncOpKernel::DoneCallback done_;
  std::string what_;
  ::tensorflow::Tensor held_;  // the buffer the engine reads or writes, alive until engine_done
  std::atomic<bool> finished_{false};
  std::function<void()> withdraw_;
  ::tensorflow::CancellationManager* manager_ = nullptr;
  ::tensorflow::CancellationToken token_ = 0;
};

}  // namespace tnt_tf
