// Note [Ranks call alike]
// A collective whose ranks disagree (a different element count, dtype, op,
// algorithm or gradient layout) would move the wrong bytes, hang, or return a
// wrong result. So each such collective has every rank describe its call in a
// fixed-size Descriptor, the ranks exchange them, and each rank compares all
// of them with its own: where they differ, every rank sees the same
// descriptors and raises the same MismatchError naming each rank's call. The
// exchange is this file's DescriptorExchange everywhere but in the shared-memory
// allreduce, whose descriptors travel in its segments' headers at no extra
// synchronisation (Note [Shared-memory allreduce rounds]). When it must be
// waited for is each caller's choice: a gradient reducer's set-up waits at once
// (FusedReducer::check_same_layout); an allreduce across nodes waits only after
// its data exchange (Note [Checking calls alongside the data]).
#pragma once

#include <mpi.h>

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "process_group.hpp"

namespace tnt {

// Six words of whatever the caller compares; unused words stay 0.
using Descriptor = std::array<std::uint64_t, 6>;

// Gathers every rank's Descriptor without blocking: start(), then test() or
// wait(), then all_same() / of(). Reusable once complete.
class DescriptorExchange {
 public:
  // `what` names the exchange in a timeout message.
  DescriptorExchange(ProcessGroup& group, const char* what);
  // Quarantines its buffers if the group failed while an exchange was pending
  // (Note [Memory that a failed collective may still write]).
  ~DescriptorExchange();
  DescriptorExchange(const DescriptorExchange&) = delete;
  DescriptorExchange& operator=(const DescriptorExchange&) = delete;

  void start(const Descriptor& mine);
  // True once every rank's descriptor is in (never blocks).
  bool test();
  // test() until true, under the group's deadline.
  void wait();
  // After completion: every rank's descriptor equals this rank's.
  bool all_same() const;
  const Descriptor& of(int group_rank) const { return (*all_)[group_rank]; }

 private:
  ProcessGroup& group_;
  const char* what_;
  // Heap blocks that a pending MPI_Iallgather writes into / reads from.
  std::unique_ptr<Descriptor> mine_;
  std::unique_ptr<std::vector<Descriptor>> all_;
  MPI_Request request_ = MPI_REQUEST_NULL;
  bool complete_ = false;
};

}  // namespace tnt
