// A set of ranks that run collectives together: the world, or a sub-group
// (e.g. the data-parallel replicas of one pipeline stage).
//
// Note [One communicator per user]
// MPI matches collectives per communicator in call order, so two threads may
// never interleave collectives on one communicator. Every object that runs
// collectives on its own thread (a FusedReducer's progress thread) therefore
// gets its own duplicate of the group's communicator via `duplicate()`.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "deadline.hpp"

namespace tnt {

class ProcessGroup {
 public:
  // Takes a duplicate of `comm`; the caller keeps ownership of `comm`.
  ProcessGroup(MPI_Comm comm, WaitLimits limits);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // World rank of group rank `group_rank`, for messages that users read.
  int world_rank_of(int group_rank) const { return world_ranks_[group_rank]; }
  // True when every rank of the group can map the others' memory.
  bool on_one_node() const { return on_one_node_; }
  MPI_Comm comm() const { return comm_; }
  const WaitLimits& limits() const { return limits_; }

  // Collectives; each waits under the group's deadline.
  void barrier();
  void broadcast(void* data, std::size_t bytes, int root);
  // out holds size() * bytes.
  void allgather(const void* in, std::size_t bytes, void* out);
  // Blocks of different sizes; returns every rank's block, in rank order.
  std::vector<std::vector<char>> allgatherv(const void* in, std::size_t bytes);

  // A new group of the ranks that pass the same `color`, ordered by `key`.
  std::unique_ptr<ProcessGroup> split(int color, int key) const;
  std::unique_ptr<ProcessGroup> duplicate() const;

  // Waits for `requests` under the deadline; `peers[i]` is the group rank
  // request i waits on (named in the timeout message), -1 if none.
  void wait_all(std::vector<MPI_Request>& requests, const std::vector<int>& peers, const char* what);
  std::string describe_ranks(const std::vector<int>& group_ranks) const;

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  bool on_one_node_ = true;
  std::vector<int> world_ranks_;
  WaitLimits limits_;
};

// MPI counts are ints; every message of the engine stays below this.
constexpr std::size_t kMaxMessageBytes = static_cast<std::size_t>(1) << 30;
int checked_count(std::size_t bytes);

}  // namespace tnt
