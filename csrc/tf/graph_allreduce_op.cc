// TntAllreduceSum: an in-graph sum over the ranks, for small tensors an op
// needs before it can go on (BatchNormalization's global statistics). It
// calls the engine through its C API only (Note [In-graph allreduces] in
// csrc/engine/engine.hpp). Asynchronous: it queues the sum on the engine's
// worker and finishes when the sum is there, so TensorFlow's thread runs the
// rest of the step meanwhile (Note [An in-graph sum does not hold the
// framework's thread] in csrc/engine/graph_allreducer.hpp); a cancelled step
// finishes it at once (Note [A waiting op finishes once: by the engine or by
// cancellation] in pending_op.h). Stateful, and left in tf.function's
// creation-order chain of stateful ops (unlike the gradient ops, Note [Start
// and finish ops are not chained]): that chain is what makes every rank run
// these ops in one order, so a waiting op waits only for its peers to reach
// the same op, never for one they run later.
#include <cstring>
#include <string>

#include "c_api.h"
#include "pending_op.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tnt_tf {

using ::tensorflow::DataType;
using ::tensorflow::DEVICE_CPU;
using ::tensorflow::AsyncOpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;

REGISTER_OP("TntAllreduceSum")
    .Input("input: T")
    .Output("sum: T")
    .Attr("T: {half, bfloat16, float, double}")
    .Attr("allreducer: int")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::UnchangedShape)
    .Doc("The element-wise sum of `input` over the ranks of the in-graph allreducer.");

namespace {

const char* engine_dtype(DataType dtype) {
  switch (dtype) {
    case ::tensorflow::DT_HALF: return "float16";
    case ::tensorflow::DT_BFLOAT16: return "bfloat16";
    case ::tensorflow::DT_FLOAT: return "float32";
    case ::tensorflow::DT_DOUBLE: return "float64";
    default: return "unsupported";
  }
}

}  // namespace

void check_engine_abi(OpKernelConstruction* context);  // allreduce_ops.cc

class AllreduceSum : public AsyncOpKernel {
 public:
  explicit AllreduceSum(OpKernelConstruction* context) : AsyncOpKernel(context) {
    check_engine_abi(context);
    OP_REQUIRES_OK(context, context->GetAttr("allreducer", &allreducer_));
  }

  bool IsExpensive() override { return false; }  // it only queues the sum

  void ComputeAsync(OpKernelContext* context, DoneCallback done) override {
    const Tensor& input = context->input(0);
    Tensor* sum = nullptr;
    OP_REQUIRES_OK_ASYNC(context, context->forward_input_or_allocate_output({0}, 0, input.shape(), &sum), done);
    // Summed in place in the output, which the call holds until the engine is done with it: a cancelled
    // op finishes before that, and its input may then be gone.
    if (sum->tensor_data().data() != input.tensor_data().data()) {
      std::memcpy(const_cast<char*>(sum->tensor_data().data()), input.tensor_data().data(), input.TotalBytes());
    }
    const Tensor out = *sum;  // the context may be gone once a cancellation finished the op
    auto op = std::make_shared<PendingOp>(context, std::move(done), "in-graph allreduce " + std::to_string(allreducer_),
                                          out);
    const int allreducer = allreducer_;
    if (!PendingOp::watch(op, [allreducer] { tnt_graph_allreduce_cancel_step(allreducer); })) return;
    char error[1024] = {0};
    char* data = const_cast<char*>(out.tensor_data().data());
    void* engine_context = PendingOp::engine_context(op);
    const int failed = tnt_graph_allreduce_sum(allreducer_, data, data, static_cast<size_t>(out.NumElements()),
                                               engine_dtype(out.dtype()), &PendingOp::engine_done, engine_context,
                                               error, sizeof error);
    if (failed) {
      PendingOp::release(engine_context);
      op->finish(::tensorflow::errors::Internal("tarantella: ", op->what(), " failed: ", error), true);
    }
  }

 private:
  int allreducer_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("TntAllreduceSum").Device(DEVICE_CPU), AllreduceSum);

}  // namespace tnt_tf
