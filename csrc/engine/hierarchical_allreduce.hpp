// Hierarchical allreduce for a group that spans nodes with the same number of
// its ranks on every node.
//
// Note [Hierarchical allreduce]
// With N nodes of L ranks each, the message is cut, round by round (at most
// one shared-memory slot per round), into L slices. In each round:
//   1. node-local reduce-scatter through the node's shared segments: local
//      rank l reduces slice l over the node's ranks, in local-rank order;
//   2. inter-node allreduce of slice l by the N ranks of local index l, one
//      on each node, over their own communicator (`peers_`), all L of them
//      in parallel: each node's link carries its share of the message once
//      in each direction as in a flat bandwidth-optimal allreduce over N
//      ranks, and nothing crosses the network twice;
//   3. node-local allgather: every rank copies the other slices from their
//      reducers' segments.
// Each slice's final value is computed by one flat allreduce whose result is
// identical on its N ranks (Note [Bitwise identical results]) and then only
// copied, so results are bitwise identical on all ranks and across runs.
// Unequal ranks per node have no slice layout that keeps every link busy
// alike: the Allreducer then falls back to the flat algorithm `auto` would
// pick (Allreducer::resolve), on every rank alike, so nothing can hang.
#pragma once

#include <memory>
#include <vector>

#include "allreduce.hpp"
#include "shared_memory_allreduce.hpp"

namespace tnt {

class HierarchicalAllreduce {
 public:
  // Bigger than the one-node slot: each round costs an inter-node latency.
  static constexpr std::size_t kSlotBytes = 4 << 20;

  // Collective over `group`, which spans nodes with equal ranks per node.
  explicit HierarchicalAllreduce(ProcessGroup& group);
  ~HierarchicalAllreduce();
  void run(const AllreduceCall& call);
  // Collective (Note [Closing is explicit]).
  void close();

 private:
  void allreduce_across_nodes(void* slice, std::size_t count, DType dtype, ReduceOp op);

  ProcessGroup& group_;
  std::unique_ptr<ProcessGroup> node_;   // this node's ranks of group_, by group rank
  std::unique_ptr<ProcessGroup> peers_;  // the ranks of group_ with this rank's local index, one per node
  std::unique_ptr<SharedMemoryAllreduce> shared_;  // over node_
  std::vector<char> scratch_;            // for the inter-node algorithm
};

}  // namespace tnt
