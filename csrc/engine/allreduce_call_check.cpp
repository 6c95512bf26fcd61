#include "allreduce_call_check.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "errors.hpp"

namespace tnt {

namespace {
// How long a failed data exchange waits for the descriptors that may explain it.
constexpr double kExplainSeconds = 5.0;

Descriptor describe(const AllreduceCall& call, Algorithm asked) {
  return Descriptor{call.count, static_cast<std::uint64_t>(call.dtype), static_cast<std::uint64_t>(call.op),
                    static_cast<std::uint64_t>(asked), 0, 0};
}
}  // namespace

AllreduceCallCheck::AllreduceCallCheck(ProcessGroup& group)
    : group_(group), exchange_(group, "allreduce (checking that all ranks call it alike)") {}

void AllreduceCallCheck::run(const AllreduceCall& call, Algorithm asked, bool check_first,
                             const std::function<void()>& data_exchange) {
  exchange_.start(describe(call, asked));
  if (check_first) {
    exchange_.wait();
    if (!exchange_.all_same()) throw_mismatch(false);
    data_exchange();
    return;
  }
  try {
    WaitHook hook([this] {
      if (exchange_.test() && !exchange_.all_same()) throw_mismatch(true);
    });
    data_exchange();
  } catch (const TimeoutError&) {
    explain_failure(0.0);  // the descriptors had the whole timeout to arrive
    throw;
  } catch (...) {
    explain_failure(kExplainSeconds);
    throw;
  }
  exchange_.wait();
  if (!exchange_.all_same()) throw_mismatch(true);
}

void AllreduceCallCheck::explain_failure(double seconds) {
  try {
    Deadline deadline(WaitLimits{seconds, seconds + 1.0});
    deadline.wait([this] { return exchange_.test(); }, "allreduce (checking that all ranks call it alike)",
                  [] { return std::string("the other ranks' call descriptors"); });
  } catch (const Error&) {
    return;  // nothing to add: the data exchange's own failure stands
  }
  if (!exchange_.all_same()) throw_mismatch(true);
}

void AllreduceCallCheck::throw_mismatch(bool data_moved) {
  std::vector<std::string> calls;
  for (int r = 0; r < group_.size(); ++r) {
    const Descriptor& d = exchange_.of(r);
    calls.push_back(describe_call(static_cast<std::size_t>(d[0]), static_cast<DType>(d[1]),
                                  static_cast<ReduceOp>(d[2])) +
                    " via " + algorithm_name(static_cast<Algorithm>(d[3])));
  }
  std::string text = mismatched_calls_message(group_, calls);
  if (data_moved) {
    text += " (found while the data moved, so this process group is unusable from now on)";
    group_.mark_failed(text);
  }
  throw MismatchError(text);
}

}  // namespace tnt
