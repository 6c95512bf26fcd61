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
// (tarantella/pipeline/compiled_step.py). Since each transfer has its own
// (peer, tag) attributes no two are alike, so no optimisation merges them,
// and the step consumes every send's token, so none is pruned.
#include <cstring>
#include <string>

#include "c_api.h"
#include "c_api_channels.h"
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

// One transfer in flight: what the engine's callback needs to finish the op.
struct Pending {
  OpKernelContext* context;
  AsyncOpKernel::DoneCallback done;
  Tensor held;  // a send's tensor, alive until it has left
  std::string what;

  static void finish(void* self, const char* error) {
    auto* pending = static_cast<Pending*>(self);
    if (error) pending->context->SetStatus(::tensorflow::errors::Internal("tarantella: ", pending->what, ": ", error));
    AsyncOpKernel::DoneCallback callback = std::move(pending->done);
    delete pending;
    callback();
  }
};

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
  // Hands the transfer to the engine; `pending` is owned by the engine's callback once it succeeds.
  void start(bool send, void* data, size_t bytes, Pending* pending) {
    char error[kErrorSize] = {0};
    const int failed = send ? tnt_channels_send(channels_, peer_, tag_, data, bytes, &Pending::finish, pending,
                                                error, sizeof error)
                            : tnt_channels_receive(channels_, peer_, tag_, data, bytes, &Pending::finish, pending,
                                                   error, sizeof error);
    if (failed) {
      OpKernelContext* context = pending->context;
      DoneCallback callback = std::move(pending->done);
      context->SetStatus(::tensorflow::errors::Internal("tarantella: ", pending->what, ": ", error));
      delete pending;
      callback();
    }
  }
  std::string describe(const char* kind) const {
    return std::string(kind) + (std::strcmp(kind, "send") == 0 ? " to rank " : " from rank ") +
           std::to_string(peer_) + " with tag " + std::to_string(tag_);
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
    auto* pending = new Pending{context, std::move(done), context->input(0), describe("send")};
    start(true, const_cast<char*>(pending->held.tensor_data().data()), pending->held.TotalBytes(), pending);
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
    auto* pending = new Pending{context, std::move(done), Tensor(), describe("receive")};
    start(false, const_cast<char*>(out->tensor_data().data()), out->TotalBytes(), pending);
  }

 private:
  TensorShape shape_;
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name("TntSend").Device(DEVICE_CPU), Send);
REGISTER_KERNEL_BUILDER(Name("TntReceive").Device(DEVICE_CPU), Receive);

}  // namespace tnt_tf
