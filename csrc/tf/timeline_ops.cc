// TensorFlow ops that note, for tarantella's timeline (tarantella/timeline/),
// the moment a tensor of a compiled step exists: TntTimelineMark and
// TntTimelineMarkAfter. They are only put into a step while the timeline is on.
//
// Note [Timeline marks]
// A mark appends (event id, CLOCK_MONOTONIC seconds) to a process-wide buffer
// that Python drains after each step through tnt_timeline_drain (ctypes on this
// same library). No Python runs inside the step (tf.py_function would hold the
// GIL and serialise the step). TntTimelineMark is a stateless identity of its
// input: it runs the moment its input exists, and being stateless it is not
// chained to the step's other stateful ops by TensorFlow's automatic control
// dependencies; it is kept because its output replaces the input downstream.
// TntTimelineMarkAfter has no output and takes a resource (a variable) instead:
// it runs after the last write to that variable created before it (automatic
// control dependencies order uses of a resource) and is stateful, so it is
// never pruned; owning a resource input keeps it out of the creation-order chain
// of resource-less stateful ops too.
#include <time.h>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tnt_tf {
namespace {

struct Mark {
  int64_t event;
  double seconds;
};

std::mutex marks_mutex;
std::vector<Mark> marks;  // guarded by marks_mutex; drained by tnt_timeline_drain
constexpr size_t kMaxPendingMarks = 1 << 20;  // a job that never drains keeps memory bounded

void note(int64_t event) {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  const double seconds = static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
  std::lock_guard<std::mutex> lock(marks_mutex);
  if (marks.size() < kMaxPendingMarks) marks.push_back({event, seconds});
}

}  // namespace

REGISTER_OP("TntTimelineMark")
    .Input("input: T")
    .Output("output: T")
    .Attr("T: type")
    .Attr("event: int")
    .SetShapeFn(::tensorflow::shape_inference::UnchangedShape)
    .Doc("Identity that notes when its input exists (timeline event `event`).");

REGISTER_OP("TntTimelineMarkAfter")
    .Input("resource: resource")
    .Attr("event: int")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc("Notes when it runs (timeline event `event`): after the writes to `resource` created before it.");

class TimelineMark : public ::tensorflow::OpKernel {
 public:
  explicit TimelineMark(::tensorflow::OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("event", &event_));
  }
  bool IsExpensive() override { return false; }
  void Compute(::tensorflow::OpKernelContext* context) override {
    note(event_);
    if (context->num_inputs() > 0 && context->num_outputs() > 0) context->set_output(0, context->input(0));
  }

 private:
  int64_t event_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("TntTimelineMark").Device(::tensorflow::DEVICE_CPU), TimelineMark);
REGISTER_KERNEL_BUILDER(Name("TntTimelineMarkAfter").Device(::tensorflow::DEVICE_CPU), TimelineMark);

}  // namespace tnt_tf

// Copies up to `capacity` pending marks (oldest first) into `events`/`seconds`
// and removes them; returns how many. For ctypes (tarantella/timeline/graph_marks.py).
extern "C" __attribute__((visibility("default"))) size_t tnt_timeline_drain(int64_t* events, double* seconds,
                                                                           size_t capacity) {
  std::lock_guard<std::mutex> lock(tnt_tf::marks_mutex);
  const size_t count = tnt_tf::marks.size() < capacity ? tnt_tf::marks.size() : capacity;
  for (size_t i = 0; i < count; ++i) {
    events[i] = tnt_tf::marks[i].event;
    seconds[i] = tnt_tf::marks[i].seconds;
  }
  tnt_tf::marks.erase(tnt_tf::marks.begin(), tnt_tf::marks.begin() + static_cast<std::ptrdiff_t>(count));
  return count;
}
