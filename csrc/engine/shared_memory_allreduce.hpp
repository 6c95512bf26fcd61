// Allreduce for ranks on one node over SharedSegments, in rounds that fit a
// segment slot.
//
// Note [Shared-memory allreduce rounds]
// The message is cut into rounds of at most one slot; each round is cut into
// p chunks, chunk c owned by rank c. In round g (using slot g % 2), rank r
//   1. waits until every rank finished round g-2 (it used the same slot),
//   2. stages its input for every chunk c != r at chunk c's place in its own
//      slot, and notifies STAGED = g,
//   3. waits for everyone's STAGED, reduces chunk r from the ranks' inputs in
//      rank order into its own slot (finishing the average there), copies it
//      to its output, and notifies REDUCED = g,
//   4. copies every other chunk c from rank c's slot as soon as rank c
//      notified REDUCED, and notifies CONSUMED = g.
// Two slots let a rank stage round g+1 while slower ranks still read round g.
// Rounds are small enough to stay in cache between the writer and the reader.
// Every call has at least one round (an empty one for 0 elements). With its
// first round each rank publishes a descriptor of the call (count, dtype, op)
// before notifying STAGED, and checks everyone's after waiting for STAGED, so
// ranks that call differently get a MismatchError instead of garbage, at no
// extra synchronisation.
//
// The hierarchical allreduce (hierarchical_allreduce.hpp) runs the same rounds
// over the ranks of one node and, between steps 3's reduction and its
// publication, allreduces chunk r with the ranks of the same local index on
// the other nodes (`between`): the rounds are then a node-local reduce-scatter,
// the inter-node allreduce of each slice, and a node-local allgather.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "allreduce.hpp"
#include "shared_segments.hpp"

namespace tnt {

class SharedMemoryAllreduce {
 public:
  static constexpr std::size_t kSlotBytes = 1 << 20;

  // Runs on this rank's reduced chunk of a round (`count` elements, reduced
  // in place) before the others may read it.
  using Between = std::function<void(void* chunk, std::size_t count)>;

  // Collective over `group` (on one node); two slots of `slot_bytes` each.
  explicit SharedMemoryAllreduce(ProcessGroup& group, std::size_t slot_bytes = kSlotBytes);
  // `between` and `average_divisor` (0: the group's size) serve the
  // hierarchical allreduce; the plain shared-memory allreduce needs neither.
  void run(const AllreduceCall& call, const Between& between = nullptr, int average_divisor = 0);
  // Collective: frees the segments (Note [Closing is explicit]).
  void close() { segments_.close(); }

 private:
  void describe_call(const AllreduceCall& call);
  void check_same_call();
  void run_round(const AllreduceCall& call, std::size_t offset, std::size_t length, bool first,
                 const Between& between, int average_divisor);

  ProcessGroup& group_;
  std::size_t slot_bytes_;
  SharedSegments segments_;
  std::uint64_t calls_ = 0;   // calls started, all ranks alike
  std::uint64_t rounds_ = 0;  // rounds started, all ranks alike
};

}  // namespace tnt
