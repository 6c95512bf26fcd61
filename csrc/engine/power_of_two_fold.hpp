// Note [Folding to a power of two]
// Recursive doubling and Rabenseifner need 2^k ranks. With p = 2^k + rem, the
// first 2*rem ranks pair up: each even rank sends its data to the odd rank
// after it and sits out; the odd rank combines both. The 2^k remaining ranks
// ("core ranks", renumbered 0..2^k-1) run the algorithm, and at the end each
// odd rank sends the result back to its even partner.
#pragma once

#include <vector>

#include "allreduce.hpp"

namespace tnt {

struct Fold {
  int core_size;   // 2^k
  int core_rank;   // this rank's number among the core ranks, -1 if it sits out
  int remainder;   // rem

  explicit Fold(int rank, int size);
  // Group rank of core rank `core`.
  int group_rank_of(int core) const { return core < remainder ? 2 * core + 1 : core + remainder; }
};

// The first and last step of the fold, on call.out (already holding this rank's input).
void fold_in(ProcessGroup& group, const Fold& fold, const AllreduceCall& call, std::vector<char>& scratch);
void fold_out(ProcessGroup& group, const Fold& fold, const AllreduceCall& call);

}  // namespace tnt
