// Recursive doubling: log2(p) steps, each exchanging the whole vector with
// the partner whose core rank differs in one bit. Latency-optimal, so the
// choice for small messages across nodes.
#include <cstring>

#include "allreduce.hpp"
#include "exchange.hpp"
#include "power_of_two_fold.hpp"
#include "reduce_kernels.hpp"

namespace tnt {

void recursive_doubling_allreduce(ProcessGroup& group, const AllreduceCall& call, std::vector<char>& scratch) {
  const std::size_t bytes = call.count * element_size(call.dtype);
  const Fold fold(group.rank(), group.size());
  // The first step reads `in` itself (Note [Reading the input in place]); a fold works on `out`.
  const void* current = call.in;
  if (fold.remainder > 0 || fold.core_size == 1) {
    if (call.out != call.in) std::memmove(call.out, call.in, bytes);
    current = call.out;
  }
  fold_in(group, fold, call, scratch);
  if (fold.core_rank >= 0) {
    scratch.resize(bytes);
    for (int mask = 1; mask < fold.core_size; mask <<= 1) {
      const int partner = fold.group_rank_of(fold.core_rank ^ mask);
      exchange(group, current, bytes, partner, scratch.data(), bytes, partner, call.tag,
               "recursive-doubling allreduce");
      combine_into(call.out, current, scratch.data(), call.count, call.dtype, call.op);
      current = call.out;
    }
  }
  fold_out(group, fold, call);
}

}  // namespace tnt
