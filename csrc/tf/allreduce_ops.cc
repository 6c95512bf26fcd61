// TensorFlow ops that hand gradients to the engine's fused reducer and take
// the reduced results back: TntStartAllreduce and TntFinishAllreduce.
//
// They talk to the engine only through its C API (c_api.h), so this library,
// compiled against the installed TensorFlow's headers and flags
// (tarantella/tf_ops.py), never shares a C++ type with the engine.
//
// Note [Start and finish are separate ops]
// One op per gradient would have to wait for its bucket inside the kernel. The
// graph instead gets, per gradient k, Start_k (depends only on gradient k:
// runs as soon as backprop produced it, copies it into its bucket and returns
// at once) and Finish_k (depends only on Start_k's token: delivers the reduced
// gradient once its bucket is reduced). Finish is an AsyncOpKernel: a finish
// op that blocked an inter-op thread while its bucket waits for gradients not
// yet computed could starve the very ops that complete the bucket (deadlock
// with few inter-op threads). Both ops are stateful, so TensorFlow neither
// prunes, folds nor merges them; the Python side takes them out of
// tf.function's creation-order chain of stateful ops, so that each is ordered
// by its data alone (Note [Start and finish ops are not chained] in
// tarantella/keras/graph_allreduce.py).
#include <memory>
#include <string>

#include "c_api.h"
#include "pending_op.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tnt_tf {

using ::tensorflow::AsyncOpKernel;
using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::PartialTensorShape;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

constexpr size_t kErrorSize = 1024;
constexpr int kEngineAbiVersion = TNT_ENGINE_ABI_VERSION;  // as compiled in; the engine's is asked at run time

REGISTER_OP("TntStartAllreduce")
    .Input("gradient: T")
    .Output("token: int32")
    .Attr("T: {half, bfloat16, float, double, int32, int64}")
    .Attr("reducer: int")
    .Attr("tensor: int")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Scalar());
      return ::tensorflow::OkStatus();
    })
    .Doc("Copies `gradient` into its bucket of reducer `reducer` (tensor id `tensor`); returns a token for the finish op.");

REGISTER_OP("TntFinishAllreduce")
    .Input("token: int32")
    .Output("reduced: T")
    .Attr("T: {half, bfloat16, float, double, int32, int64}")
    .Attr("shape: shape")
    .Attr("reducer: int")
    .Attr("tensor: int")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      PartialTensorShape shape;
      TF_RETURN_IF_ERROR(c->GetAttr("shape", &shape));
      ShapeHandle out;
      TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shape, &out));
      c->set_output(0, out);
      return ::tensorflow::OkStatus();
    })
    .Doc("The sum over all ranks of the tensor the matching start op handed in; waits without blocking a thread.");

void check_engine_abi(OpKernelConstruction* context) {
  OP_REQUIRES(context, tnt_engine_abi_version() == kEngineAbiVersion,
              ::tensorflow::errors::FailedPrecondition(
                  "tarantella: the TensorFlow op library expects engine ABI ", kEngineAbiVersion,
                  " but the loaded engine has ", tnt_engine_abi_version(),
                  "; delete the op cache (TNT_CACHE_DIR, default ~/.cache/tarantella) and rerun"));
}

class StartAllreduce : public OpKernel {
 public:
  explicit StartAllreduce(OpKernelConstruction* context) : OpKernel(context) {
    check_engine_abi(context);
    OP_REQUIRES_OK(context, context->GetAttr("reducer", &reducer_));
    OP_REQUIRES_OK(context, context->GetAttr("tensor", &tensor_));
  }

  // Run inline the moment the gradient exists instead of queueing behind the
  // (expensive) backprop kernels: the earlier a bucket fills, the more of its
  // allreduce overlaps the rest of backprop. It only copies into the bucket.
  bool IsExpensive() override { return false; }

  void Compute(OpKernelContext* context) override {
    const Tensor& gradient = context->input(0);
    char error[kErrorSize] = {0};
    const int failed = tnt_reducer_ready(reducer_, static_cast<size_t>(tensor_), gradient.tensor_data().data(),
                                         gradient.TotalBytes(), error, sizeof error);
    OP_REQUIRES(context, failed == 0,
                ::tensorflow::errors::Internal("tarantella: gradient ", tensor_, " of reducer ", reducer_,
                                               " could not start its allreduce: ", error));
    Tensor* token = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({}), &token));
    token->scalar<int32_t>()() = 0;
  }

 private:
  int reducer_ = 0;
  int64_t tensor_ = 0;
};

class FinishAllreduce : public AsyncOpKernel {
 public:
  explicit FinishAllreduce(OpKernelConstruction* context) : AsyncOpKernel(context) {
    check_engine_abi(context);
    OP_REQUIRES_OK(context, context->GetAttr("reducer", &reducer_));
    OP_REQUIRES_OK(context, context->GetAttr("tensor", &tensor_));
    PartialTensorShape shape;
    OP_REQUIRES_OK(context, context->GetAttr("shape", &shape));
    OP_REQUIRES(context, shape.AsTensorShape(&shape_),
                ::tensorflow::errors::InvalidArgument("tarantella: gradient shapes must be fully known"));
  }

  void ComputeAsync(OpKernelContext* context, DoneCallback done) override {
    Tensor* reduced = nullptr;
    OP_REQUIRES_OK_ASYNC(context, context->allocate_output(0, shape_, &reduced), done);
    const Tensor out = *reduced;  // the context may be gone once a cancellation finished the op
    auto op = std::make_shared<PendingOp>(
        context, std::move(done), "gradient " + std::to_string(tensor_) + " of reducer " + std::to_string(reducer_),
        out);
    const int reducer = reducer_;
    // Note [A cancelled step fails the reducer] in csrc/engine/fused_reducer.hpp.
    if (!PendingOp::watch(op, [reducer] { tnt_reducer_cancel_step(reducer); })) return;
    char error[kErrorSize] = {0};
    void* engine_context = PendingOp::engine_context(op);
    const int failed = tnt_reducer_deliver(reducer_, static_cast<size_t>(tensor_),
                                           const_cast<char*>(out.tensor_data().data()), out.TotalBytes(),
                                           &PendingOp::engine_done, engine_context, error, sizeof error);
    if (failed) {
      PendingOp::release(engine_context);
      op->finish(::tensorflow::errors::Internal("tarantella: ", op->what(), " could not be collected: ", error), true);
    }
  }

 private:
  int reducer_ = 0;
  int64_t tensor_ = 0;
  TensorShape shape_;
};

REGISTER_KERNEL_BUILDER(Name("TntStartAllreduce").Device(DEVICE_CPU), StartAllreduce);
REGISTER_KERNEL_BUILDER(Name("TntFinishAllreduce").Device(DEVICE_CPU), FinishAllreduce);

}  // namespace tnt_tf
