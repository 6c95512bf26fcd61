// A set of ranks that run collectives together: the world, or a sub-group
// (e.g. the data-parallel replicas of one pipeline stage).
//
// Note [One communicator per user]
// MPI matches collectives per communicator in call order, so two threads may
// never interleave collectives on one communicator. Every object that runs
// collectives on its own thread (a FusedReducer's progress thread) therefore
// gets its own duplicate of the group's communicator via `duplicate()`.
//
// Note [A failed group stays failed]
// After a collective timed out or MPI reported an error, this rank no longer
// knows how far its peers got: a frozen peer may wake up and answer a message
// of the failed call, shared-memory epochs disagree, and requests the engine
// could not cancel may still complete (Note [Memory that a failed collective
// may still write]). Any later collective could then combine data of
// different calls and return a wrong result without an error. So the first
// such failure marks the group failed, together with every group made from
// the same root by duplicate() or split() (a lost peer is lost to all of
// them), and every later collective raises GroupFailedError at once, naming
// the first failure. A mismatch (MismatchError) that all ranks detect alike
// before any data moves (on one node, at a reducer's set-up) leaves the group
// usable; one detected while the data moves (an allreduce across nodes, Note
// [Checking calls alongside the data]) fails the group like a timeout.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "deadline.hpp"
#include "errors.hpp"

namespace tnt {

// The failure state a group shares with the groups derived from it.
struct GroupHealth {
  std::atomic<bool> failed{false};
  std::mutex mutex;
  std::string first_failure;  // guarded by mutex
};

class ProcessGroup {
 public:
  // Takes a duplicate of `comm`; the caller keeps ownership of `comm`.
  // `health` is shared with the parent group (nullptr: a new root).
  ProcessGroup(MPI_Comm comm, WaitLimits limits, std::shared_ptr<GroupHealth> health = nullptr);
  // Frees the communicator: MPI_Comm_free only drops a reference in Open MPI
  // and MPICH and never waits for peers, so this is safe from a garbage
  // collector (Note [Closing is explicit]).
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // World rank of group rank `group_rank`, for messages that users read.
  int world_rank_of(int group_rank) const { return world_ranks_[group_rank]; }
  // True when every rank of the group can map the others' memory.
  bool on_one_node() const { return on_one_node_; }
  // Node layout: ranks of this group on this rank's node (this rank's index
  // among them, ordered by group rank), and whether every node of the group
  // holds the same number of the group's ranks.
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  int node_count() const { return node_count_; }
  bool equal_ranks_per_node() const { return equal_ranks_per_node_; }
  MPI_Comm comm() const { return comm_; }
  const WaitLimits& limits() const { return limits_; }

  // Collectives; each waits under the group's deadline.
  void barrier();
  void broadcast(void* data, std::size_t bytes, int root);
  // out holds size() * bytes; `what` names the call in a timeout message.
  void allgather(const void* in, std::size_t bytes, void* out, const char* what = "allgather");
  // Blocks of different sizes; returns every rank's block, in rank order.
  std::vector<std::vector<char>> allgatherv(const void* in, std::size_t bytes);

  // A new group of the ranks that pass the same `color`, ordered by `key`.
  std::unique_ptr<ProcessGroup> split(int color, int key) const;
  std::unique_ptr<ProcessGroup> duplicate() const;
  // The ranks of this group on this rank's node, ordered by group rank.
  std::unique_ptr<ProcessGroup> split_by_node() const;

  // Waits for `requests` under the deadline; `peers[i]` is the group rank
  // request i waits on (named in the timeout message), -1 if none.
  void wait_all(std::vector<MPI_Request>& requests, const std::vector<int>& peers, const char* what);
  // Polls `done` under the deadline (see Deadline::wait); a timeout fails the group.
  void wait_until(const std::function<bool()>& done, const char* what,
                  const std::function<std::string()>& describe_missing);
  std::string describe_ranks(const std::vector<int>& group_ranks) const;

  // Note [A failed group stays failed]
  bool failed() const { return health_->failed.load(std::memory_order_acquire); }
  std::string first_failure() const;
  // Throws GroupFailedError if the group failed; `what` names the refused call.
  void check_usable(const char* what) const;
  // Records `reason` as the group's failure (the first one wins).
  void mark_failed(const std::string& reason);
  // Runs `body`, a collective of this group: refuses it on a failed group,
  // and marks the group failed if it times out or MPI fails.
  template <typename Body>
  void guarded(const char* what, Body&& body) {
    check_usable(what);
    try {
      body();
    } catch (const TimeoutError& error) {
      mark_failed(error.what());
      throw;
    } catch (const MpiError& error) {
      mark_failed(error.what());
      throw;
    }
  }
  const std::shared_ptr<GroupHealth>& health() const { return health_; }

 private:
  void learn_node_layout();
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  bool on_one_node_ = true;
  int local_rank_ = 0;
  int local_size_ = 1;
  int node_count_ = 1;
  bool equal_ranks_per_node_ = true;
  std::vector<int> world_ranks_;
  WaitLimits limits_;
  std::shared_ptr<GroupHealth> health_;
};

// Note [Checks that ride along a wait]
// While a WaitHook lives on a thread, every wait of every process group on
// that thread (ProcessGroup::wait_until, and so every collective, exchange and
// shared-memory wait) calls its `poll` between polls of what it waits for. A
// check that runs alongside a collective (Note [Checking calls alongside the
// data]) thus gets MPI progress and can end the collective with its own error
// at once, whichever sub-group (node, peers) the collective waits on. An
// allreduce runs on one thread from start to end, so a thread-local hook
// reaches exactly its waits. Hooks nest; the innermost one is polled.
class WaitHook {
 public:
  explicit WaitHook(std::function<void()> poll);
  ~WaitHook();
  WaitHook(const WaitHook&) = delete;
  WaitHook& operator=(const WaitHook&) = delete;
  // Polls this thread's innermost hook, if any.
  static void poll_current();

 private:
  std::function<void()> poll_;
  WaitHook* outer_;
};

// MPI counts are ints; every message of the engine stays below this.
constexpr std::size_t kMaxMessageBytes = static_cast<std::size_t>(1) << 30;
int checked_count(std::size_t bytes);

}  // namespace tnt
