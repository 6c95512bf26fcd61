// TensorFlow ops that move a pipeline's activations and their gradients
// between ranks over the engine's peer channels: TntSend and TntReceive.
// They reach the channels only through the engine's C API
// (c_api_channels.h), as the allreduce ops do.
//
// Note [Transfers are stateless async ops]
// Both are AsyncOpKernels: a send completes once its tensor has left (the
// kernel holds the tensor until then), a receive once its output is filled;
// neither blocks a thread meanwhile. They are deliberately NOT stateful:
// tf.function chains every stateful op without resource inputs in creation
// order (automatic control dependencies), which would make a receive posted
// ahead wait for every op created before it, and every later send wait for
// that receive; the schedule would serialise on the network. Stateless, they
// run as soon as their inputs exist, and the step orders them explicitly: a
// send's input is the tensor it sends, a receive's input is a trigger scalar
// the pipeline step computes after the pass it is posted ahead of
// (tarantella/pipelining/compiled_step.py). Since each transfer has its own
// (peer, tag) attributes no two are alike, so no optimisation merges them,
// and the step consumes every send's token, so none is pruned.
#include <memory>
#include <mutex>
#include <string>

#include "c_api.h"
#include "c_api_channels.h"
#include "pending_op.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tnt_tf {

using ::tensorflow::AsyncOpKernel;
using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::PartialTensorShape;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace {

constexpr size_t kErrorSize = 1024;

REGISTER_OP("TntSend")
    .Input("tensor: T")
    .Output("token: int32")
    .Attr("T: {half, bfloat16, float, double, int8, uint8, int32, int64, bool}")
    .Attr("channels: int")
    .Attr("peer: int")
    .Attr("tag: int")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Scalar());
      return ::tensorflow::OkStatus();
    })
    .Doc("Sends `tensor` to world rank `peer` with `tag` on peer channels `channels`; done once it has left.");

REGISTER_OP("TntReceive")
    .Input("after: int32")
    .Output("tensor: T")
    .Attr("T: {half, bfloat16, float, double, int8, uint8, int32, int64, bool}")
    .Attr("shape: shape")
    .Attr("channels: int")
    .Attr("peer: int")
    .Attr("tag: int")
    .SetShapeFn([](InferenceContext* c) {
      PartialTensorShape shape;
      TF_RETURN_IF_ERROR(c->GetAttr("shape", &shape));
      ShapeHandle out;
      TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shape, &out));
      c->set_output(0, out);
      return ::tensorflow::OkStatus();
    })
    .Doc("Receives a tensor of `shape` from world rank `peer` with `tag`; posted once `after` exists.");

class Transfer : public AsyncOpKernel {
 public:
  explicit Transfer(OpKernelConstruction* context) : AsyncOpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("channels", &channels_));
    OP_REQUIRES_OK(context, context->GetAttr("peer", &peer_));
    OP_REQUIRES_OK(context, context->GetAttr("tag", &tag_));
  }
  // Posting only queues the transfer: run inline, as early as possible.
  bool IsExpensive() override { return false; }

 protected:
  // Hands the transfer of `held`'s buffer to the engine; the op finishes when the engine is done with it or
  // when the step is cancelled (Note [A waiting op finishes once: by the engine or by cancellation]).
  void start(bool send, OpKernelContext* context, DoneCallback done, Tensor held) {
    auto op = std::make_shared<PendingOp>(context, std::move(done), describe(send), held);
    // What cancellation withdraws: known once the engine has queued the transfer.
    struct Posted {
      std::mutex mutex;
      unsigned long long handle = 0;
      bool cancelled = false;
    };
    auto posted = std::make_shared<Posted>();
    const int channels = channels_;
    if (!PendingOp::watch(op, [posted, channels] {
          std::lock_guard<std::mutex> lock(posted->mutex);
          posted->cancelled = true;
          if (posted->handle != 0) tnt_channels_cancel(channels, posted->handle);
        })) {
      return;
    }
    char error[kErrorSize] = {0};
    void* engine_context = PendingOp::engine_context(op);
    char* data = const_cast<char*>(held.tensor_data().data());
    unsigned long long handle = 0;
    const int failed =
        send ? tnt_channels_send(channels_, peer_, tag_, data, held.TotalBytes(), &PendingOp::engine_done,
                                 engine_context, &handle, error, sizeof error)
             : tnt_channels_receive(channels_, peer_, tag_, data, held.TotalBytes(), &PendingOp::engine_done,
                                    engine_context, &handle, error, sizeof error);
    if (failed) {
      PendingOp::release(engine_context);
      op->finish(::tensorflow::errors::Internal("tarantella: ", op->what(), ": ", error), true);
      return;
    }
    std::lock_guard<std::mutex> lock(posted->mutex);
    posted->handle = handle;
    if (posted->cancelled) tnt_channels_cancel(channels_, handle);
  }

 private:
  std::string describe(bool send) const {
    return std::string(send ? "send to rank " : "receive from rank ") + std::to_string(peer_) + " with tag " +
           std::to_string(tag_);
  }

  int channels_ = 0;
  int peer_ = 0;
  int tag_ = 0;
};

class Send : public Transfer {
 public:
  using Transfer::Transfer;
  void ComputeAsync(OpKernelContext* context, DoneCallback done) override {
    Tensor* token = nullptr;
    OP_REQUIRES_OK_ASYNC(context, context->allocate_output(0, TensorShape({}), &token), done);
    token->scalar<int32_t>()() = 0;
    start(true, context, std::move(done), context->input(0));
  }
};

class Receive : public Transfer {
 public:
  explicit Receive(OpKernelConstruction* context) : Transfer(context) {
    PartialTensorShape shape;
    OP_REQUIRES_OK(context, context->GetAttr("shape", &shape));
    OP_REQUIRES(context, shape.AsTensorShape(&shape_),
                ::tensorflow::errors::InvalidArgument("tarantella: a received tensor's shape must be fully known"));
  }
  void ComputeAsync(OpKernelContext* context, DoneCallback done) override {
    Tensor* out = nullptr;
    OP_REQUIRES_OK_ASYNC(context, context->allocate_output(0, shape_, &out), done);
    start(false, context, std::move(done), *out);
  }

 private:
  TensorShape shape_;
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name("TntSend").Device(DEVICE_CPU), Send);
REGISTER_KERNEL_BUILDER(Name("TntReceive").Device(DEVICE_CPU), Receive);

}  // namespace tnt_tf
