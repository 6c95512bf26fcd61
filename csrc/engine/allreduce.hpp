// Allreduce over a ProcessGroup, with selectable algorithms.
//
// Note [Bitwise identical results]
// Every algorithm gives the same bits on all ranks, and the same bits across
// runs with the same inputs, rank count and algorithm: each element's final
// value is computed either by exactly one rank and then copied to the others
// (ring, Rabenseifner, shared memory, hierarchical), or by pairs of ranks that
// combine the same two operands (recursive doubling), which needs a commutative
// combination: IEEE addition is commutative bit for bit, and min and max are
// made so (IEEE's own min and max are not where operands are NaN or -0 and +0:
// the engine's select under a total order, Note [Min and max of floating
// point]; the `mpi` algorithm uses them too, through its own MPI op). `auto`
// depends only on the byte count, the rank count and the group's node layout,
// so all ranks choose alike.
//
// Note [Choosing an algorithm]
// `auto`: all ranks on one node -> shared_memory; nodes with the same number
// (> 1) of the group's ranks each -> hierarchical (Note [Hierarchical
// allreduce]); otherwise the flat algorithms: recursive doubling below 64 KiB
// (and at any size for 2 ranks, where it moves no more bytes than the
// bandwidth-optimal ones, in one step), Rabenseifner for 2^k ranks, ring for
// other counts. The hierarchical allreduce picks its inter-node algorithm by
// the same rule, for its slice and the node count. Asking for hierarchical
// where it does not apply falls back alike on every rank: to shared_memory
// on one node, and to the flat choice with one rank per node or with unequal
// ranks per node (e.g. 3 + 1).
//
// Note [Closing is explicit]
// Freeing shared windows (MPI_Win_free) waits for every rank of the group. A
// destructor run by Python's garbage collector, at a different moment on each
// rank, must never wait for peers (it would deadlock against a peer inside
// the next collective). So the collective part of freeing happens only in an
// explicit close() (Python: Group.close(), Reducer.close()) or in the
// engine's stop at exit; a destructor frees only what is local and leaves
// unclosed windows to MPI_Finalize.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "dtype.hpp"
#include "exchange.hpp"
#include "process_group.hpp"

namespace tnt {

enum class Algorithm : int { automatic = 0, ring, recursive_doubling, rabenseifner, shared_memory, mpi, hierarchical };

const char* algorithm_name(Algorithm algorithm);
Algorithm algorithm_from_name(const std::string& name);  // "auto", "ring", ...; throws UsageError

class SharedMemoryAllreduce;
class HierarchicalAllreduce;
class AllreduceCallCheck;

// What one allreduce call works on; `in` may equal `out`.
struct AllreduceCall {
  const void* in;
  void* out;
  std::size_t count;
  DType dtype;
  ReduceOp op;
  // The tag of the call's point-to-point messages (Note [Calls checked by
  // their message tags]).
  int tag = kExchangeTag;
};

// Runs allreduces on its own duplicate of a group (Note [One communicator per
// user]); use one Allreducer per thread.
class Allreducer {
 public:
  explicit Allreducer(const ProcessGroup& group);
  ~Allreducer();

  // Checks that all ranks call alike (Note [Checking calls alongside the
  // data]) unless `verified`: the caller already knows all ranks pass the
  // same count, dtype and op (a FusedReducer's static buckets).
  void run(const AllreduceCall& call, Algorithm algorithm, bool verified = false);
  // What `auto` runs for `bytes` (Note [Choosing an algorithm]).
  Algorithm choose(std::size_t bytes) const;
  // The algorithm that runs when `algorithm` is asked for (fallbacks applied).
  Algorithm resolve(Algorithm algorithm, std::size_t bytes) const;
  ProcessGroup& group() { return *group_; }
  // Collective: frees the shared segments (Note [Closing is explicit]).
  void close();

 private:
  void run_resolved(const AllreduceCall& call, Algorithm algorithm, bool verified);
  // The flat or hierarchical algorithm `chosen`, without any check.
  void run_algorithm(const AllreduceCall& call, Algorithm chosen);
  // Note [Calls checked by their message tags]: whether this group's calls are.
  bool checks_by_tags() const;
  std::unique_ptr<ProcessGroup> group_;
  std::unique_ptr<AllreduceCallCheck> call_check_;        // made on first use; after group_, which it uses
  std::unique_ptr<SharedMemoryAllreduce> shared_memory_;  // made on first use (collective)
  std::unique_ptr<HierarchicalAllreduce> hierarchical_;   // made on first use (collective)
  std::vector<char> scratch_;
};

// The flat algorithm for `bytes` over `ranks` ranks on several nodes.
Algorithm choose_flat(std::size_t bytes, int ranks);

// The algorithms; each reduces `call` in place in call.out after copying
// call.in there, using `scratch` as it needs.
void ring_allreduce(ProcessGroup& group, const AllreduceCall& call, std::vector<char>& scratch);
void recursive_doubling_allreduce(ProcessGroup& group, const AllreduceCall& call, std::vector<char>& scratch);
void rabenseifner_allreduce(ProcessGroup& group, const AllreduceCall& call, std::vector<char>& scratch);
void mpi_allreduce(ProcessGroup& group, const AllreduceCall& call);

// What one rank called, as mismatch messages show it: "float32[10] sum".
std::string describe_call(std::size_t count, DType dtype, ReduceOp op);
// The message for ranks that called an allreduce differently (Note [Ranks
// call alike]); `calls[r]` is describe_call() of group rank r, plus any detail.
std::string mismatched_calls_message(const ProcessGroup& group, const std::vector<std::string>& calls);
// Throws MismatchError(mismatched_calls_message(group, calls)).
[[noreturn]] void throw_mismatched_calls(const ProcessGroup& group, const std::vector<std::string>& calls);

// Splits `count` elements into `parts` contiguous ranges, the first
// `count % parts` one element longer.
struct Range {
  std::size_t offset;
  std::size_t length;
};
Range part_of(std::size_t count, int parts, int index);

}  // namespace tnt
