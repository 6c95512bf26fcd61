// TntAdamUpdate: Keras 3's Adam update of one float32 variable (without
// amsgrad), in one pass over the variable, its two moments and its gradient.
//
// Note [Keras's Adam in one pass]
// Keras's Adam.update_step is ten elementwise TensorFlow ops per variable
// (subtract, multiply, assign_add for each moment, square, then multiply,
// sqrt, add, divide, assign_sub), each reading and writing whole arrays: about
// 30 passes over arrays of the variable's size where 7 would do (read the
// gradient, the variable and both moments; write back the three). On arrays
// larger than the caches the update is bound by memory, and it is the largest
// part of a pipeline stage's last weight pass (both ranks of a 2-stage pipeline
// run theirs at once and share the memory). One thread, a stage's 4 Dense
// layers (`python -m bench.pipeline.adam_update`): Dense(2048) 81.6 -> 20.5 ms,
// Dense(512) 3.25 -> 1.00 ms.
// This kernel does, per element, exactly Keras's float32 operations in Keras's
// order, each rounded to float32 as TensorFlow's separate ops round it:
//     m += (g - m) * (1 - beta_1)
//     v += (g * g - v) * (1 - beta_2)
//     var -= (m * alpha) / (sqrt(v) + epsilon)
// with alpha = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t) computed beforehand by
// Keras's own scalar ops (tarantella/keras/adam_in_one_pass.py). IEEE
// addition, subtraction, multiplication, division and square root are
// correctly rounded whatever the vector width, so the result is Keras's to the
// bit provided no two of them are fused: this file is compiled without -march
// and its AVX loop asks for AVX alone, so there is no FMA to contract into.
// The thread's denormal mode is TensorFlow's, as for its own kernels. Bitwise
// equality with Keras's Adam is tested (tests/keras/test_adam_in_one_pass.py).
#define EIGEN_USE_THREADS  // training_op_helpers.h copies variables on the CPU device

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <cmath>
#include <cstdint>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/kernels/training_op_helpers.h"
#include "tensorflow/core/platform/threadpool.h"

namespace tnt_tf {
namespace {

using ::tensorflow::CPUDevice;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;

struct AdamConstants {
  float alpha, one_minus_beta_1, one_minus_beta_2, epsilon;
};

// Elements [begin, end) of one update, each operation its own statement.
void update_range(float* var, float* m, float* v, const float* g, const AdamConstants& c, int64_t begin,
                  int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    const float grad = g[i];
    float step_m = grad - m[i];
    step_m = step_m * c.one_minus_beta_1;
    const float new_m = m[i] + step_m;
    float square = grad * grad;
    float step_v = square - v[i];
    step_v = step_v * c.one_minus_beta_2;
    const float new_v = v[i] + step_v;
    const float numerator = new_m * c.alpha;
    float denominator = std::sqrt(new_v);
    denominator = denominator + c.epsilon;
    const float change = numerator / denominator;
    var[i] = var[i] - change;
    m[i] = new_m;
    v[i] = new_v;
  }
}

#if defined(__x86_64__)
// The same, 8 lanes at a time with AVX (the rest by update_range). The compiler
// vectorises neither loop itself (a sqrt that may set errno), and on arrays
// that fit in the caches the scalar loop is bound by its square roots and
// divisions: a stage of Dense(512) took 2.7 ms with it alone, 1.0 ms with this
// one. Each intrinsic is one correctly rounded operation, as the scalar's.
__attribute__((target("avx"))) void update_range_avx(float* var, float* m, float* v, const float* g,
                                                       const AdamConstants& c, int64_t begin, int64_t end) {
  const __m256 alpha = _mm256_set1_ps(c.alpha);
  const __m256 one_minus_beta_1 = _mm256_set1_ps(c.one_minus_beta_1);
  const __m256 one_minus_beta_2 = _mm256_set1_ps(c.one_minus_beta_2);
  const __m256 epsilon = _mm256_set1_ps(c.epsilon);
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m256 grad = _mm256_loadu_ps(g + i);
    __m256 new_m = _mm256_loadu_ps(m + i);
    new_m = _mm256_add_ps(new_m, _mm256_mul_ps(_mm256_sub_ps(grad, new_m), one_minus_beta_1));
    __m256 new_v = _mm256_loadu_ps(v + i);
    new_v = _mm256_add_ps(new_v, _mm256_mul_ps(_mm256_sub_ps(_mm256_mul_ps(grad, grad), new_v), one_minus_beta_2));
    const __m256 change =
        _mm256_div_ps(_mm256_mul_ps(new_m, alpha), _mm256_add_ps(_mm256_sqrt_ps(new_v), epsilon));
    _mm256_storeu_ps(var + i, _mm256_sub_ps(_mm256_loadu_ps(var + i), change));
    _mm256_storeu_ps(m + i, new_m);
    _mm256_storeu_ps(v + i, new_v);
  }
  update_range(var, m, v, g, c, i, end);
}
#endif

using UpdateRange = void (*)(float*, float*, float*, const float*, const AdamConstants&, int64_t, int64_t);

// The loop for this CPU: AVX lanes where it has them.
UpdateRange update_range_for_this_cpu() {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx")) return update_range_avx;
#endif
  return update_range;
}

float scalar_input(OpKernelContext* ctx, int index) { return ctx->input(index).scalar<float>()(); }

class AdamUpdateOp : public OpKernel {
 public:
  explicit AdamUpdateOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    auto locks = ::tensorflow::MaybeLockVariableInputMutexesInOrder<CPUDevice, float>(ctx, true, false, {0, 1, 2});
    Tensor var, m, v;
    OP_REQUIRES_OK(ctx, (::tensorflow::GetInputTensorFromVariable<CPUDevice, float>(ctx, 0, true, false, &var)));
    OP_REQUIRES_OK(ctx, (::tensorflow::GetInputTensorFromVariable<CPUDevice, float>(ctx, 1, true, false, &m)));
    OP_REQUIRES_OK(ctx, (::tensorflow::GetInputTensorFromVariable<CPUDevice, float>(ctx, 2, true, false, &v)));
    const Tensor& grad = ctx->input(3);
    OP_REQUIRES(ctx, var.IsInitialized() && m.IsInitialized() && v.IsInitialized(),
                absl::FailedPreconditionError("TntAdamUpdate: a variable or a moment is not initialised"));
    OP_REQUIRES(ctx, var.shape() == grad.shape() && m.shape() == grad.shape() && v.shape() == grad.shape(),
                absl::InvalidArgumentError("TntAdamUpdate: the variable " + var.shape().DebugString() +
                                           ", its moments and its gradient " + grad.shape().DebugString() +
                                           " differ in shape"));
    const AdamConstants constants{scalar_input(ctx, 4), scalar_input(ctx, 5), scalar_input(ctx, 6),
                                  scalar_input(ctx, 7)};
    float* var_data = var.flat<float>().data();
    float* m_data = m.flat<float>().data();
    float* v_data = v.flat<float>().data();
    const float* g_data = grad.flat<float>().data();
    static const UpdateRange update = update_range_for_this_cpu();
    // Per element: 4 loads, 3 stores, about 12 flops with a sqrt and a divide.
    constexpr int64_t kCostPerElement = 40;
    ctx->device()->tensorflow_cpu_worker_threads()->workers->ParallelFor(
        grad.NumElements(), kCostPerElement, [&](int64_t begin, int64_t end) {
          update(var_data, m_data, v_data, g_data, constants, begin, end);
        });
  }
};

}  // namespace

REGISTER_OP("TntAdamUpdate")
    .Input("var: resource")
    .Input("m: resource")
    .Input("v: resource")
    .Input("grad: float")
    .Input("alpha: float")
    .Input("one_minus_beta_1: float")
    .Input("one_minus_beta_2: float")
    .Input("epsilon: float")
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc("Keras's Adam update of `var` and its moments `m`, `v` in one pass (Note [Keras's Adam in one pass]).");

REGISTER_KERNEL_BUILDER(Name("TntAdamUpdate").Device(::tensorflow::DEVICE_CPU), AdamUpdateOp);

}  // namespace tnt_tf
