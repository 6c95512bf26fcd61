// Note [Checking calls alongside the data]
// An allreduce checks that every rank calls it alike (Note [Ranks call alike]):
// the element count, dtype, op and the algorithm asked for. Waiting for the
// ranks' descriptors before any data moves costs a network round trip on
// every call across nodes (about 70 us between the namespace hosts of the
// benchmark, half of a 64 KiB MPI_Allreduce). So the exchange starts without
// blocking just before the data exchange, and then:
//  - on one node (flat algorithms asked for by name; a round trip costs a few
//    microseconds there), before the first hierarchical call of a group
//    (which makes the node and peer sub-groups, collectively and blocking),
//    and before MPI's own allreduce (`mpi`: its messages are MPI's, which
//    could truncate, Note [A receive never truncates]), it is waited for
//    before any data moves: a mismatch raises MismatchError on every rank and
//    leaves the group usable;
//  - across nodes it runs alongside the data exchange. Every wait of the
//    algorithm polls it (Note [Checks that ride along a wait]) and ends with
//    the MismatchError as soon as all descriptors are in and differ, so a rank
//    that waits for a partner running another algorithm (or another count)
//    learns of it within a round trip, not at the timeout. A data exchange
//    that finished waits for the descriptors before returning (they are
//    usually in by then); one that failed (a message of the wrong size, Note
//    [A receive never truncates]) gives them a few seconds and reports the
//    mismatch they show instead of its own failure. Data of the mismatched call may have
//    moved by then, and its stray messages could be matched by a later call,
//    so a mismatch found this way fails the group (Note [A failed group stays
//    failed]): later calls raise GroupFailedError naming the mismatch.
// Carrying a descriptor hash in the algorithms' own messages would save the
// extra small messages too, but it changes every algorithm's message format,
// cannot reach into MPI's own allreduce, and still needs a separate check for
// a rank whose partner runs a different algorithm and never sends; the
// non-blocking exchange covers every algorithm in one place.
#pragma once

#include <functional>

#include "allreduce.hpp"
#include "descriptor_exchange.hpp"

namespace tnt {

class AllreduceCallCheck {
 public:
  explicit AllreduceCallCheck(ProcessGroup& group);
  // Runs `data_exchange` (the algorithm for `call`) checked as the Note says:
  // `check_first` waits for the check before it. `asked` is the algorithm the
  // caller asked for, before fallbacks.
  void run(const AllreduceCall& call, Algorithm asked, bool check_first, const std::function<void()>& data_exchange);

 private:
  // After the data exchange failed: the MismatchError if the descriptors,
  // given at most `seconds` to arrive, differ; else returns.
  void explain_failure(double seconds);
  [[noreturn]] void throw_mismatch(bool data_moved);

  ProcessGroup& group_;
  DescriptorExchange exchange_;
};

}  // namespace tnt
