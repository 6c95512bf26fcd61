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
// The descriptor exchange is a collective of its own: its small messages, as
// many as the data's at small sizes, cost more than the round trip they were
// meant to hide where each node holds one rank. There the calls are checked
// by their message tags instead (Note [Calls checked by their message tags]).
//
// Note [Calls checked by their message tags]
// Where `auto` runs a flat algorithm across nodes (one rank per node, or
// unequal ranks per node), every point-to-point message of a checked call
// carries the call in its tag: a high bit (marking a checked call), the
// parity of the call's sequence number on the group's allreducer, and a hash
// of its descriptor (count, dtype, op, algorithm asked for) in the remaining
// bits below MPI_TAG_UB. A receive matches only its own call's tag, so data
// of a differing call is never taken in. The waits of the call look (Note
// [Checks that ride along a wait]) at the first pending message of each other
// rank in turn: one with a checked tag of this call's parity but another hash
// is a call that differs. Ranks are never more than one call apart (a rank ends a
// call only after all ranks began it), so the parity tells the next call's
// messages from this one's. No rank ends a call that differs from another
// rank's: the data of each rank reaches every rank along the algorithm's
// messages, and the first message between differing ranks is seen by its
// receiver (still waiting), who tells every rank at once (a notice message of
// its own tag, polled by every wait). Then
// all ranks exchange their descriptors, as above, and raise the same
// MismatchError naming each rank's call, and the group fails (data moved).
// `mpi` still waits for the descriptor exchange first (its messages are MPI's).
// Calls that need no check (a FusedReducer's verified buckets) keep the plain
// tag kExchangeTag and are not counted.
// The hash leaves a chance of 2^-29 (Open MPI's tag bound) that two differing
// calls look alike; those then differ in their sizes almost surely, which a
// receive still refuses (Note [A receive never truncates]).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

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
  // The same, checked by message tags (Note [Calls checked by their message
  // tags]): `data_exchange` sends and receives with the tag it is given;
  // `check_first` as above. All ranks of the group must use this form alike.
  void run_tagged(const AllreduceCall& call, Algorithm asked, bool check_first,
                  const std::function<void(int tag)>& data_exchange);

 private:
  // The tag of the next call described by `d` (and counts the call).
  int next_tag(const Descriptor& d);
  // Polls the other ranks' first pending messages; throws MismatchError after
  // telling every rank if one belongs to a different call or is a notice.
  void watch_for_other_calls(int tag, const AllreduceCall& call, Algorithm asked);
  [[noreturn]] void found_other_call(const std::string& what, const AllreduceCall& call, Algorithm asked);
  // After the data exchange failed: the MismatchError if the descriptors,
  // given at most `seconds` to arrive, differ; else returns.
  void explain_failure(double seconds);
  [[noreturn]] void throw_mismatch(bool data_moved);

  ProcessGroup& group_;
  DescriptorExchange exchange_;
  bool exchange_started_ = false;  // in run_tagged: the descriptors are on their way
  std::uint64_t calls_ = 0;        // checked by tags, on this group
  int hash_bits_ = 0;              // of a tag, below its parity bit
  bool found_other_call_ = false;  // in this call
  bool noticed_ = false;           // this rank told the others
  unsigned watch_round_ = 0;
};

}  // namespace tnt
