#include "allreduce.hpp"

#include <cstring>

#include "allreduce_call_check.hpp"
#include "errors.hpp"
#include "hierarchical_allreduce.hpp"
#include "quarantine.hpp"
#include "reduce_kernels.hpp"
#include "shared_memory_allreduce.hpp"

namespace tnt {

namespace {
const char* const kAlgorithmNames[] = {"auto",          "ring", "recursive_doubling", "rabenseifner",
                                      "shared_memory", "mpi",  "hierarchical"};
constexpr std::size_t kSmallMessageBytes = 64 * 1024;

bool is_power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }
}  // namespace

const char* algorithm_name(Algorithm algorithm) { return kAlgorithmNames[static_cast<int>(algorithm)]; }

Algorithm algorithm_from_name(const std::string& name) {
  for (int i = 0; i <= static_cast<int>(Algorithm::hierarchical); ++i) {
    if (name == kAlgorithmNames[i]) return static_cast<Algorithm>(i);
  }
  throw UsageError("unknown allreduce algorithm '" + name +
                   "': use auto, ring, recursive_doubling, rabenseifner, shared_memory, hierarchical or mpi");
}

Range part_of(std::size_t count, int parts, int index) {
  const std::size_t base = count / parts;
  const std::size_t extra = count % parts;
  const std::size_t i = static_cast<std::size_t>(index);
  return Range{i * base + (i < extra ? i : extra), base + (i < extra ? 1 : 0)};
}

std::string describe_call(std::size_t count, DType dtype, ReduceOp op) {
  return std::string(dtype_name(dtype)) + "[" + std::to_string(count) + "] " + op_name(op);
}

std::string mismatched_calls_message(const ProcessGroup& group, const std::vector<std::string>& calls) {
  std::string text = "allreduce called differently on different ranks:";
  for (int r = 0; r < group.size(); ++r) {
    text += std::string(r ? ";" : "") + " rank " + std::to_string(group.world_rank_of(r)) + " had " + calls[r];
  }
  return text + ". Every rank must reduce the same number of elements of the same dtype with the same op (and "
                "algorithm), in the same order";
}

void throw_mismatched_calls(const ProcessGroup& group, const std::vector<std::string>& calls) {
  throw MismatchError(mismatched_calls_message(group, calls));
}

Allreducer::Allreducer(const ProcessGroup& group) : group_(group.duplicate()) {}

Allreducer::~Allreducer() {
  // Note [Memory that a failed collective may still write]
  if (group_->failed()) quarantine(std::move(scratch_));
}

void Allreducer::close() {
  if (shared_memory_) shared_memory_->close();
  if (hierarchical_) hierarchical_->close();
}

Algorithm choose_flat(std::size_t bytes, int ranks) {
  // Two ranks: recursive doubling sends each rank's whole vector once, as
  // many bytes as Rabenseifner's two half-size steps, in one step.
  if (bytes < kSmallMessageBytes || ranks == 2) return Algorithm::recursive_doubling;
  return is_power_of_two(ranks) ? Algorithm::rabenseifner : Algorithm::ring;
}

Algorithm Allreducer::choose(std::size_t bytes) const {
  return resolve(Algorithm::hierarchical, bytes);
}

Algorithm Allreducer::resolve(Algorithm algorithm, std::size_t bytes) const {
  const ProcessGroup& g = *group_;
  if (algorithm == Algorithm::automatic) return choose(bytes);
  if (algorithm != Algorithm::hierarchical) return algorithm;
  if (g.on_one_node()) return Algorithm::shared_memory;
  if (g.equal_ranks_per_node() && g.local_size() > 1) return Algorithm::hierarchical;
  return choose_flat(bytes, g.size());
}

void Allreducer::run(const AllreduceCall& call, Algorithm algorithm, bool verified) {
  group_->guarded("allreduce", [&] { run_resolved(call, algorithm, verified); });
}

void Allreducer::run_resolved(const AllreduceCall& call, Algorithm algorithm, bool verified) {
  const std::size_t bytes = call.count * element_size(call.dtype);
  if (algorithm == Algorithm::shared_memory && !group_->on_one_node()) {
    throw UsageError("the shared_memory allreduce needs all ranks on one node; use auto or hierarchical");
  }
  if (group_->size() == 1) {
    if (call.out != call.in && bytes) std::memmove(call.out, call.in, bytes);
    return;
  }
  const Algorithm chosen = resolve(algorithm, bytes);
  if (chosen == Algorithm::shared_memory) {
    // Checks the call itself, through the segment headers, at no extra cost.
    if (!shared_memory_) shared_memory_ = std::make_unique<SharedMemoryAllreduce>(*group_);
    shared_memory_->run(call);
    return;
  }
  if (verified) {
    run_algorithm(call, chosen);
    return;
  }
  if (!call_check_) call_check_ = std::make_unique<AllreduceCallCheck>(*group_);
  // Note [Checking calls alongside the data]: what must not start before the check.
  const bool check_first = group_->on_one_node() || chosen == Algorithm::mpi ||
                           (chosen == Algorithm::hierarchical && !hierarchical_);
  if (checks_by_tags()) {
    call_check_->run_tagged(call, algorithm, check_first, [&](int tag) {
      AllreduceCall tagged = call;
      tagged.tag = tag;
      run_algorithm(tagged, chosen);
    });
    return;
  }
  call_check_->run(call, algorithm, check_first, [&] { run_algorithm(call, chosen); });
}

bool Allreducer::checks_by_tags() const {
  // Where `auto` is flat across nodes: the same on every rank, whatever each asks for.
  const ProcessGroup& g = *group_;
  return !g.on_one_node() && !(g.equal_ranks_per_node() && g.local_size() > 1);
}

void Allreducer::run_algorithm(const AllreduceCall& call, Algorithm chosen) {
  switch (chosen) {
    case Algorithm::ring: ring_allreduce(*group_, call, scratch_); break;
    case Algorithm::recursive_doubling: recursive_doubling_allreduce(*group_, call, scratch_); break;
    case Algorithm::rabenseifner: rabenseifner_allreduce(*group_, call, scratch_); break;
    case Algorithm::mpi: mpi_allreduce(*group_, call); break;
    case Algorithm::hierarchical:
      if (!hierarchical_) hierarchical_ = std::make_unique<HierarchicalAllreduce>(*group_);
      // Divides averages itself, once, by the whole group's size.
      hierarchical_->run(call);
      return;
    default: TNT_ASSERT(false, "unresolved algorithm");
  }
  finish_average(call.out, call.count, call.dtype, call.op, group_->size());
}

}  // namespace tnt
