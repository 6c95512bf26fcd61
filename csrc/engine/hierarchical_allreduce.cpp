#include "hierarchical_allreduce.hpp"

#include "errors.hpp"
#include "quarantine.hpp"

namespace tnt {

HierarchicalAllreduce::HierarchicalAllreduce(ProcessGroup& group) : group_(group) {
  TNT_ASSERT(group.equal_ranks_per_node(), "the hierarchical allreduce needs equal ranks per node");
  node_ = group.split_by_node();
  peers_ = group.split(node_->rank(), group.rank());
  shared_ = std::make_unique<SharedMemoryAllreduce>(*node_, kSlotBytes);
}

HierarchicalAllreduce::~HierarchicalAllreduce() {
  // Note [Memory that a failed collective may still write]
  if (group_.failed()) quarantine(std::move(scratch_));
}

void HierarchicalAllreduce::close() { shared_->close(); }

void HierarchicalAllreduce::allreduce_across_nodes(void* slice, std::size_t count, DType dtype, ReduceOp op) {
  if (peers_->size() == 1) return;
  // `average` is summed here and divided once by the whole group's size.
  const ReduceOp combine = op == ReduceOp::average ? ReduceOp::sum : op;
  const AllreduceCall call{slice, slice, count, dtype, combine};
  switch (choose_flat(count * element_size(dtype), peers_->size())) {
    case Algorithm::recursive_doubling: recursive_doubling_allreduce(*peers_, call, scratch_); break;
    case Algorithm::rabenseifner: rabenseifner_allreduce(*peers_, call, scratch_); break;
    default: ring_allreduce(*peers_, call, scratch_); break;
  }
}

void HierarchicalAllreduce::run(const AllreduceCall& call) {
  shared_->run(
      call, [&](void* slice, std::size_t count) { allreduce_across_nodes(slice, count, call.dtype, call.op); },
      group_.size());
}

}  // namespace tnt
