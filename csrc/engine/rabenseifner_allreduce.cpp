// Rabenseifner: a reduce-scatter by recursive halving (each step exchanges
// half of the remaining range with a partner) followed by an allgather by
// recursive doubling that retraces the same ranges. Bandwidth-optimal like the
// ring but in 2*log2(p) - 1 steps (Note [The last halving and the first
// doubling in one step]); each element is reduced by one rank only, but for
// the last step's range, which both partners reduce alike.
//
// Note [Rabenseifner's exchange order]
// The first halving step moves half the message, the last one 1/p of it. The
// halving therefore pairs ranks whose (core) numbers differ in the lowest bit
// first: with block placement (ranks 0..L-1 on the first node, ...) those are
// neighbours on one node, so the large exchanges go through shared memory and
// only the small late ones cross the network. The allgather retraces the
// steps backwards, so its large exchanges are node-local too.
//
// Note [The last halving and the first doubling in one step]
// The last halving step and the first allgather step pair the same ranks over
// the same range: each sends its partner half of it, reduces its own half,
// then sends that and receives the other. Both at once is one exchange of the
// whole range (recursive doubling's step on it): the same bytes each way, one
// round and one message fewer, and each rank reduces the whole range itself.
// Each half is combined in the order of the two steps (the owner's values
// first), so both ranks get the same bits, and the same as the two steps.
// Across nodes each round waits for the partner to be scheduled and its
// message to cross: on the namespace hosts of the benchmark (4 hosts x 1 rank
// on 2 cores) 4 rounds took 150-160 us at 64 KiB where 3 take 125-130 us
// (MPI_Allreduce, Rabenseifner's algorithm too: 135-150 us).
#include <cstring>

#include "allreduce.hpp"
#include "exchange.hpp"
#include "power_of_two_fold.hpp"
#include "reduce_kernels.hpp"

namespace tnt {

void rabenseifner_allreduce(ProcessGroup& group, const AllreduceCall& call, std::vector<char>& scratch) {
  const std::size_t elem = element_size(call.dtype);
  char* out = static_cast<char*>(call.out);
  const Fold fold(group.rank(), group.size());
  // Where this rank's current values are: the first halving step reads `in`
  // itself (Note [Reading the input in place]); a fold works on `out`.
  const char* current = static_cast<const char*>(call.in);
  if (fold.remainder > 0 || fold.core_size == 1) {
    if (call.out != call.in) std::memmove(out, call.in, call.count * elem);
    current = out;
  }
  fold_in(group, fold, call, scratch);
  if (fold.core_rank >= 0) {
    // What each halving step split and which half this rank kept, retraced backwards.
    struct Halving {
      Range whole;
      bool kept_upper;
    };
    std::vector<Halving> steps;
    Range mine{0, call.count};
    // The largest range received: the first step's half, or with two core ranks the whole.
    scratch.resize((fold.core_size == 2 ? call.count : call.count / 2 + 1) * elem);
    for (int mask = 1; mask < fold.core_size; mask <<= 1) {
      const int partner = fold.group_rank_of(fold.core_rank ^ mask);
      const Range lower{mine.offset, mine.length / 2};
      const Range upper{mine.offset + lower.length, mine.length - lower.length};
      const bool keep_upper = (fold.core_rank & mask) != 0;
      const Range keep = keep_upper ? upper : lower;
      const Range give = keep_upper ? lower : upper;
      if (2 * mask == fold.core_size) {
        // Note [The last halving and the first doubling in one step]
        exchange(group, current + mine.offset * elem, mine.length * elem, partner, scratch.data(), mine.length * elem,
                 partner, call.tag, "Rabenseifner allreduce");
        char* theirs_keep = scratch.data() + (keep.offset - mine.offset) * elem;
        char* theirs_give = scratch.data() + (give.offset - mine.offset) * elem;
        combine_into(out + keep.offset * elem, current + keep.offset * elem, theirs_keep, keep.length, call.dtype,
                     call.op);
        // The partner's half, its values first; combine_into's `out` may not alias `received`.
        if (current == out) {
          combine_into(theirs_give, theirs_give, out + give.offset * elem, give.length, call.dtype, call.op);
          std::memcpy(out + give.offset * elem, theirs_give, give.length * elem);
        } else {
          combine_into(out + give.offset * elem, theirs_give, current + give.offset * elem, give.length, call.dtype,
                       call.op);
        }
        break;
      }
      exchange(group, current + give.offset * elem, give.length * elem, partner, scratch.data(), keep.length * elem,
               partner, call.tag, "Rabenseifner allreduce (reduce-scatter)");
      combine_into(out + keep.offset * elem, current + keep.offset * elem, scratch.data(), keep.length, call.dtype,
                   call.op);
      current = out;
      steps.push_back({mine, keep_upper});
      mine = keep;
    }
    for (int mask = fold.core_size / 4; mask >= 1; mask >>= 1) {
      const Range whole = steps.back().whole;
      const bool have_upper = steps.back().kept_upper;
      steps.pop_back();
      const int partner = fold.group_rank_of(fold.core_rank ^ mask);
      const Range lower{whole.offset, whole.length / 2};
      const Range upper{whole.offset + lower.length, whole.length - lower.length};
      const Range missing = have_upper ? lower : upper;
      exchange(group, out + mine.offset * elem, mine.length * elem, partner, out + missing.offset * elem,
               missing.length * elem, partner, call.tag, "Rabenseifner allreduce (allgather)");
      mine = whole;
    }
  }
  fold_out(group, fold, call);
}

}  // namespace tnt
