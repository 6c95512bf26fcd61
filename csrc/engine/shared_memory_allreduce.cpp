#include "shared_memory_allreduce.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "copy_count.hpp"
#include "errors.hpp"
#include "reduce_kernels.hpp"

namespace tnt {

namespace {

enum Flag : int { kStaged = 0, kReduced = 1, kConsumed = 2 };

struct CallDescriptor {
  std::uint64_t call;
  std::int64_t count;
  std::int32_t dtype;
  std::int32_t op;
};

CallDescriptor* descriptor_slot(const SharedSegments& segments, int rank, std::uint64_t call) {
  return reinterpret_cast<CallDescriptor*>(segments.notes(rank)) + call % 2;
}


}  // namespace

SharedMemoryAllreduce::SharedMemoryAllreduce(ProcessGroup& group, std::size_t slot_bytes)
    : group_(group), slot_bytes_(slot_bytes), segments_(group, 2 * slot_bytes) {}

void SharedMemoryAllreduce::describe_call(const AllreduceCall& call) {
  const std::uint64_t seq = ++calls_;
  *descriptor_slot(segments_, group_.rank(), seq) =
      CallDescriptor{seq, static_cast<std::int64_t>(call.count), static_cast<std::int32_t>(call.dtype),
                     static_cast<std::int32_t>(call.op)};
}

// Runs after the first round's STAGED wait: a peer cannot overwrite its
// descriptor of this call before this rank stages its next call's first round.
void SharedMemoryAllreduce::check_same_call() {
  const CallDescriptor& mine = *descriptor_slot(segments_, group_.rank(), calls_);
  bool same = true;
  for (int r = 0; r < group_.size(); ++r) {
    const CallDescriptor& theirs = *descriptor_slot(segments_, r, calls_);
    same = same && theirs.call == mine.call && theirs.count == mine.count && theirs.dtype == mine.dtype &&
           theirs.op == mine.op;
  }
  if (same) return;
  std::vector<std::string> calls;
  for (int r = 0; r < group_.size(); ++r) {
    const CallDescriptor& d = *descriptor_slot(segments_, r, calls_);
    calls.push_back(tnt::describe_call(static_cast<std::size_t>(d.count), static_cast<DType>(d.dtype),
                                  static_cast<ReduceOp>(d.op)));
  }
  throw_mismatched_calls(group_, calls);
}

void SharedMemoryAllreduce::run(const AllreduceCall& call, const Between& between, int average_divisor) {
  group_.guarded("shared-memory allreduce", [&] {
    describe_call(call);
    const std::size_t per_round = slot_bytes_ / element_size(call.dtype);
    const int divisor = average_divisor > 0 ? average_divisor : group_.size();
    std::size_t offset = 0;
    do {
      const std::size_t length = std::min(per_round, call.count - offset);
      run_round(call, offset, length, offset == 0, between, divisor);
      offset += length;
    } while (offset < call.count);
  });
}

void SharedMemoryAllreduce::run_round(const AllreduceCall& call, std::size_t offset, std::size_t length,
                                      bool first, const Between& between, int average_divisor) {
  const int p = group_.size();
  const int self = group_.rank();
  const std::size_t elem = element_size(call.dtype);
  const std::uint64_t round = ++rounds_;
  const std::size_t slot_offset = (round % 2) * slot_bytes_;
  const char* in = static_cast<const char*>(call.in) + offset * elem;
  char* out = static_cast<char*>(call.out) + offset * elem;
  auto slot = [&](int rank) { return segments_.data(rank) + slot_offset; };

  segments_.wait_for_others(kConsumed, round >= 2 ? round - 2 : 0, "shared-memory allreduce (slot reuse)");
  for (int c = 0; c < p; ++c) {
    if (c == self) continue;
    const Range chunk = part_of(length, p, c);
    std::memcpy(slot(self) + chunk.offset * elem, in + chunk.offset * elem, chunk.length * elem);
    count_copied(chunk.length * elem);
  }
  segments_.notify(kStaged, round);

  segments_.wait_for_others(kStaged, round, "shared-memory allreduce (reduce)");
  if (first) {
    try {
      check_same_call();
    } catch (const MismatchError&) {
      // Every rank sees the same descriptors and fails here alike: finish the
      // round's notifications so the segments stay usable for the next call.
      segments_.notify(kReduced, round);
      segments_.notify(kConsumed, round);
      throw;
    }
  }
  const Range own = part_of(length, p, self);
  std::vector<const void*> inputs(p);
  for (int r = 0; r < p; ++r) {
    inputs[r] = (r == self ? in : slot(r)) + own.offset * elem;
  }
  // Reduced into the slot, not into `out`, which may alias `in`.
  char* result = slot(self) + own.offset * elem;
  reduce_many(result, inputs.data(), p, own.length, call.dtype, call.op);
  if (between) between(result, own.length);
  finish_average(result, own.length, call.dtype, call.op, average_divisor);
  std::memcpy(out + own.offset * elem, result, own.length * elem);
  count_copied(own.length * elem);
  segments_.notify(kReduced, round);

  // Copy each chunk as soon as its owner published it, without a fixed order.
  std::vector<bool> copied(p, false);
  copied[self] = true;
  int remaining = p - 1;
  group_.wait_until(
      [&] {
        for (int c = 0; c < p; ++c) {
          if (copied[c] || segments_.peek(c, kReduced) < round) continue;
          const Range chunk = part_of(length, p, c);
          std::memcpy(out + chunk.offset * elem, slot(c) + chunk.offset * elem, chunk.length * elem);
          count_copied(chunk.length * elem);
          copied[c] = true;
          --remaining;
        }
        return remaining == 0;
      },
      "shared-memory allreduce (gather)",
      [&] {
        std::vector<int> behind;
        for (int c = 0; c < p; ++c) {
          if (!copied[c]) behind.push_back(c);
        }
        return group_.describe_ranks(behind);
      });
  segments_.notify(kConsumed, round);
}

}  // namespace tnt
