// TntAllreduceSum: a blocking in-graph sum over the ranks, for small tensors an
// op needs before it can go on (BatchNormalization's global statistics). It
// calls the engine through its C API only (Note [In-graph blocking allreduces]
// in csrc/engine/engine.hpp). Stateful, and left in tf.function's
// creation-order chain of stateful ops (unlike the gradient ops, Note [Start
// and finish ops are not chained]): that chain is what makes every rank run
// these ops in one order, so a blocked op waits only for its peers to reach
// the same op, never for one they run later.
#include <string>

#include "c_api.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tnt_tf {

using ::tensorflow::DataType;
using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
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
    .Doc("The element-wise sum of `input` over the ranks of the in-graph allreducer; blocks until it is there.");

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

class AllreduceSum : public OpKernel {
 public:
  explicit AllreduceSum(OpKernelConstruction* context) : OpKernel(context) {
    check_engine_abi(context);
    OP_REQUIRES_OK(context, context->GetAttr("allreducer", &allreducer_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& input = context->input(0);
    Tensor* sum = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, input.shape(), &sum));
    char error[1024] = {0};
    const int failed = tnt_graph_allreduce_sum(allreducer_, input.tensor_data().data(),
                                               const_cast<char*>(sum->tensor_data().data()),
                                               static_cast<size_t>(input.NumElements()), engine_dtype(input.dtype()),
                                               error, sizeof error);
    OP_REQUIRES(context, failed == 0,
                ::tensorflow::errors::Internal("tarantella: in-graph allreduce ", allreducer_, " failed: ", error));
  }

 private:
  int allreducer_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("TntAllreduceSum").Device(DEVICE_CPU), AllreduceSum);

}  // namespace tnt_tf
