#include "power_of_two_fold.hpp"

#include "exchange.hpp"
#include "reduce_kernels.hpp"

namespace tnt {

Fold::Fold(int rank, int size) {
  core_size = 1;
  while (core_size * 2 <= size) core_size *= 2;
  remainder = size - core_size;
  if (rank < 2 * remainder) {
    core_rank = rank % 2 == 1 ? rank / 2 : -1;
  } else {
    core_rank = rank - remainder;
  }
}

void fold_in(ProcessGroup& group, const Fold& fold, const AllreduceCall& call, std::vector<char>& scratch) {
  const int r = group.rank();
  if (r >= 2 * fold.remainder) return;
  const std::size_t bytes = call.count * element_size(call.dtype);
  if (r % 2 == 0) {
    exchange(group, call.out, bytes, r + 1, nullptr, 0, -1, call.tag, "allreduce (fold to a power of two)");
  } else {
    scratch.resize(bytes);
    exchange(group, nullptr, 0, -1, scratch.data(), bytes, r - 1, call.tag, "allreduce (fold to a power of two)");
    reduce_into(call.out, scratch.data(), call.count, call.dtype, call.op);
  }
}

void fold_out(ProcessGroup& group, const Fold& fold, const AllreduceCall& call) {
  const int r = group.rank();
  if (r >= 2 * fold.remainder) return;
  const std::size_t bytes = call.count * element_size(call.dtype);
  if (r % 2 == 1) {
    exchange(group, call.out, bytes, r - 1, nullptr, 0, -1, call.tag, "allreduce (unfold)");
  } else {
    exchange(group, nullptr, 0, -1, call.out, bytes, r + 1, call.tag, "allreduce (unfold)");
  }
}

}  // namespace tnt
