#include "process_group.hpp"

#include <algorithm>
#include <climits>

#include "errors.hpp"
#include "mpi_call.hpp"
#include "quarantine.hpp"

namespace tnt {

int checked_count(std::size_t bytes) {
  if (bytes > kMaxMessageBytes) {
    throw UsageError("a single message of " + std::to_string(bytes) +
                     " bytes exceeds the engine's limit of 1 GiB; split the buffer into smaller pieces");
  }
  return static_cast<int>(bytes);
}

ProcessGroup::ProcessGroup(MPI_Comm comm, WaitLimits limits, std::shared_ptr<GroupHealth> health)
    : limits_(limits), health_(health ? std::move(health) : std::make_shared<GroupHealth>()) {
  TNT_MPI(MPI_Comm_dup(comm, &comm_));
  TNT_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  TNT_MPI(MPI_Comm_rank(comm_, &rank_));
  TNT_MPI(MPI_Comm_size(comm_, &size_));
  int world_rank = 0;
  TNT_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
  world_ranks_.resize(size_);
  TNT_MPI(MPI_Allgather(&world_rank, 1, MPI_INT, world_ranks_.data(), 1, MPI_INT, comm_));
  learn_node_layout();
}

void ProcessGroup::learn_node_layout() {
  MPI_Comm node_comm = MPI_COMM_NULL;
  TNT_MPI(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node_comm));
  TNT_MPI(MPI_Comm_rank(node_comm, &local_rank_));
  TNT_MPI(MPI_Comm_size(node_comm, &local_size_));
  TNT_MPI(MPI_Comm_free(&node_comm));
  const int mine[2] = {local_rank_, local_size_};
  std::vector<int> all(2 * size_);
  TNT_MPI(MPI_Allgather(mine, 2, MPI_INT, all.data(), 2, MPI_INT, comm_));
  node_count_ = 0;
  equal_ranks_per_node_ = true;
  for (int r = 0; r < size_; ++r) {
    if (all[2 * r] == 0) ++node_count_;
    equal_ranks_per_node_ = equal_ranks_per_node_ && all[2 * r + 1] == local_size_;
  }
  on_one_node_ = node_count_ == 1;
}

ProcessGroup::~ProcessGroup() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::string ProcessGroup::describe_ranks(const std::vector<int>& group_ranks) const {
  if (group_ranks.empty()) return "no rank";
  std::string text = group_ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < group_ranks.size(); ++i) {
    if (i) text += ", ";
    text += std::to_string(world_rank_of(group_ranks[i]));
  }
  return text;
}

std::string ProcessGroup::first_failure() const {
  std::lock_guard<std::mutex> lock(health_->mutex);
  return health_->first_failure;
}

void ProcessGroup::check_usable(const char* what) const {
  if (!failed()) return;
  throw GroupFailedError(std::string(what) + " refused: an earlier collective of this process group failed on this "
                         "rank (" + first_failure() + "), so its peers may be gone or out of step and no later "
                         "collective could be trusted; end the job and restart it (from a checkpoint)");
}

void ProcessGroup::mark_failed(const std::string& reason) {
  std::lock_guard<std::mutex> lock(health_->mutex);
  if (health_->failed.load(std::memory_order_relaxed)) return;
  health_->first_failure = reason;
  health_->failed.store(true, std::memory_order_release);
}

namespace {
thread_local WaitHook* t_wait_hook = nullptr;
}

WaitHook::WaitHook(std::function<void()> poll) : poll_(std::move(poll)), outer_(t_wait_hook) { t_wait_hook = this; }

WaitHook::~WaitHook() { t_wait_hook = outer_; }

void WaitHook::poll_current() {
  if (t_wait_hook) t_wait_hook->poll_();
}

void ProcessGroup::wait_until(const std::function<bool()>& done, const char* what,
                              const std::function<std::string()>& describe_missing) {
  Deadline deadline(limits_);
  try {
    // Note [Checks that ride along a wait]
    deadline.wait(
        [&] {
          WaitHook::poll_current();
          return done();
        },
        what, describe_missing);
  } catch (const TimeoutError& error) {
    mark_failed(error.what());
    throw;
  }
}

void ProcessGroup::wait_all(std::vector<MPI_Request>& requests, const std::vector<int>& peers, const char* what) {
  // Requests left pending by a timeout stay with MPI; their buffers are
  // quarantined by their owners (Note [Memory that a failed collective may still write]).
  wait_until(
      [&] {
        int flag = 0;
        TNT_MPI(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &flag, MPI_STATUSES_IGNORE));
        return flag != 0;
      },
      what,
      [&] {
        std::vector<int> missing;
        for (std::size_t i = 0; i < requests.size(); ++i) {
          if (requests[i] != MPI_REQUEST_NULL && i < peers.size() && peers[i] >= 0) missing.push_back(peers[i]);
        }
        // A partner both sent to and received from is named once.
        std::sort(missing.begin(), missing.end());
        missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
        if (!missing.empty()) return describe_ranks(missing);
        // A collective does not say who is missing: name the others while that stays short.
        std::vector<int> others;
        for (int r = 0; r < size_; ++r) {
          if (r != rank_) others.push_back(r);
        }
        if (others.size() == 1) return describe_ranks(others);
        if (others.size() <= 8) return "one or more of " + describe_ranks(others);
        return std::string("one or more of the group's other ranks");
      });
}

void ProcessGroup::barrier() {
  guarded("barrier", [&] {
    std::vector<MPI_Request> request(1);
    TNT_MPI(MPI_Ibarrier(comm_, &request[0]));
    wait_all(request, {}, "barrier");
  });
}

void ProcessGroup::broadcast(void* data, std::size_t bytes, int root) {
  if (root < 0 || root >= size_) {
    throw UsageError("broadcast root " + std::to_string(root) + " is not a rank of this group of " +
                     std::to_string(size_));
  }
  guarded("broadcast", [&] {
    std::vector<MPI_Request> request(1);
    TNT_MPI(MPI_Ibcast(data, checked_count(bytes), MPI_BYTE, root, comm_, &request[0]));
    wait_all(request, {rank_ == root ? -1 : root}, "broadcast");
  });
}

void ProcessGroup::allgather(const void* in, std::size_t bytes, void* out, const char* what) {
  guarded(what, [&] {
    std::vector<MPI_Request> request(1);
    TNT_MPI(MPI_Iallgather(in, checked_count(bytes), MPI_BYTE, out, checked_count(bytes), MPI_BYTE, comm_,
                           &request[0]));
    wait_all(request, {}, what);
  });
}

std::vector<std::vector<char>> ProcessGroup::allgatherv(const void* in, std::size_t bytes) {
  // The receive buffers outlive a failed call (Note [Memory that a failed collective may still write]).
  auto mine = std::make_shared<long long>(static_cast<long long>(bytes));
  auto sizes_block = std::make_shared<std::vector<long long>>(size_);
  std::vector<long long>& sizes = *sizes_block;
  try {
    allgather(mine.get(), sizeof(long long), sizes.data());
  } catch (...) {
    if (failed()) {
      keep_until_exit(sizes_block);
      keep_until_exit(mine);
    }
    throw;
  }
  std::vector<int> counts(size_), displacements(size_);
  std::size_t total = 0;
  for (int r = 0; r < size_; ++r) {
    counts[r] = checked_count(static_cast<std::size_t>(sizes[r]));
    displacements[r] = checked_count(total);
    total += static_cast<std::size_t>(sizes[r]);
  }
  auto all_block = std::make_shared<std::vector<char>>(total);
  std::vector<char>& all = *all_block;
  try {
    guarded("allgatherv", [&] {
      std::vector<MPI_Request> request(1);
      TNT_MPI(MPI_Iallgatherv(in, checked_count(bytes), MPI_BYTE, all.data(), counts.data(), displacements.data(),
                              MPI_BYTE, comm_, &request[0]));
      wait_all(request, {}, "allgatherv");
    });
  } catch (...) {
    if (failed()) keep_until_exit(all_block);
    throw;
  }
  std::vector<std::vector<char>> blocks(size_);
  for (int r = 0; r < size_; ++r) {
    blocks[r].assign(all.begin() + displacements[r], all.begin() + displacements[r] + counts[r]);
  }
  return blocks;
}

std::unique_ptr<ProcessGroup> ProcessGroup::split(int color, int key) const {
  if (color < 0) throw UsageError("a process group color must be >= 0, got " + std::to_string(color));
  check_usable("split");
  MPI_Comm sub = MPI_COMM_NULL;
  TNT_MPI(MPI_Comm_split(comm_, color, key, &sub));
  auto group = std::make_unique<ProcessGroup>(sub, limits_, health_);
  TNT_MPI(MPI_Comm_free(&sub));
  return group;
}

std::unique_ptr<ProcessGroup> ProcessGroup::split_by_node() const {
  check_usable("split_by_node");
  MPI_Comm node = MPI_COMM_NULL;
  TNT_MPI(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
  auto group = std::make_unique<ProcessGroup>(node, limits_, health_);
  TNT_MPI(MPI_Comm_free(&node));
  return group;
}

std::unique_ptr<ProcessGroup> ProcessGroup::duplicate() const {
  check_usable("duplicate");
  return std::make_unique<ProcessGroup>(comm_, limits_, health_);
}

}  // namespace tnt
