#include "process_group.hpp"

#include <climits>

#include "errors.hpp"
#include "mpi_call.hpp"

namespace tnt {

int checked_count(std::size_t bytes) {
  if (bytes > kMaxMessageBytes) {
    throw UsageError("a single message of " + std::to_string(bytes) +
                     " bytes exceeds the engine's limit of 1 GiB; split the buffer into smaller pieces");
  }
  return static_cast<int>(bytes);
}

ProcessGroup::ProcessGroup(MPI_Comm comm, WaitLimits limits) : limits_(limits) {
  TNT_MPI(MPI_Comm_dup(comm, &comm_));
  TNT_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  TNT_MPI(MPI_Comm_rank(comm_, &rank_));
  TNT_MPI(MPI_Comm_size(comm_, &size_));
  int world_rank = 0;
  TNT_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
  world_ranks_.resize(size_);
  TNT_MPI(MPI_Allgather(&world_rank, 1, MPI_INT, world_ranks_.data(), 1, MPI_INT, comm_));
  MPI_Comm node_comm = MPI_COMM_NULL;
  TNT_MPI(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node_comm));
  int node_size = 0;
  TNT_MPI(MPI_Comm_size(node_comm, &node_size));
  TNT_MPI(MPI_Comm_free(&node_comm));
  int local_all = node_size == size_ ? 1 : 0;
  int global_all = 0;
  TNT_MPI(MPI_Allreduce(&local_all, &global_all, 1, MPI_INT, MPI_MIN, comm_));
  on_one_node_ = global_all == 1;
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

void ProcessGroup::wait_all(std::vector<MPI_Request>& requests, const std::vector<int>& peers, const char* what) {
  Deadline deadline(limits_);
  deadline.wait(
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
        return missing.empty() ? std::string("the group's other ranks") : describe_ranks(missing);
      });
}

void ProcessGroup::barrier() {
  std::vector<MPI_Request> request(1);
  TNT_MPI(MPI_Ibarrier(comm_, &request[0]));
  wait_all(request, {}, "barrier");
}

void ProcessGroup::broadcast(void* data, std::size_t bytes, int root) {
  if (root < 0 || root >= size_) {
    throw UsageError("broadcast root " + std::to_string(root) + " is not a rank of this group of " +
                     std::to_string(size_));
  }
  std::vector<MPI_Request> request(1);
  TNT_MPI(MPI_Ibcast(data, checked_count(bytes), MPI_BYTE, root, comm_, &request[0]));
  wait_all(request, {rank_ == root ? -1 : root}, "broadcast");
}

void ProcessGroup::allgather(const void* in, std::size_t bytes, void* out) {
  std::vector<MPI_Request> request(1);
  TNT_MPI(MPI_Iallgather(in, checked_count(bytes), MPI_BYTE, out, checked_count(bytes), MPI_BYTE, comm_, &request[0]));
  wait_all(request, {}, "allgather");
}

std::vector<std::vector<char>> ProcessGroup::allgatherv(const void* in, std::size_t bytes) {
  long long mine = static_cast<long long>(bytes);
  std::vector<long long> sizes(size_);
  allgather(&mine, sizeof mine, sizes.data());
  std::vector<int> counts(size_), displacements(size_);
  std::size_t total = 0;
  for (int r = 0; r < size_; ++r) {
    counts[r] = checked_count(static_cast<std::size_t>(sizes[r]));
    displacements[r] = checked_count(total);
    total += static_cast<std::size_t>(sizes[r]);
  }
  std::vector<char> all(total);
  std::vector<MPI_Request> request(1);
  TNT_MPI(MPI_Iallgatherv(in, checked_count(bytes), MPI_BYTE, all.data(), counts.data(), displacements.data(),
                          MPI_BYTE, comm_, &request[0]));
  wait_all(request, {}, "allgatherv");
  std::vector<std::vector<char>> blocks(size_);
  for (int r = 0; r < size_; ++r) {
    blocks[r].assign(all.begin() + displacements[r], all.begin() + displacements[r] + counts[r]);
  }
  return blocks;
}

std::unique_ptr<ProcessGroup> ProcessGroup::split(int color, int key) const {
  if (color < 0) throw UsageError("a process group color must be >= 0, got " + std::to_string(color));
  MPI_Comm sub = MPI_COMM_NULL;
  TNT_MPI(MPI_Comm_split(comm_, color, key, &sub));
  auto group = std::make_unique<ProcessGroup>(sub, limits_);
  TNT_MPI(MPI_Comm_free(&sub));
  return group;
}

std::unique_ptr<ProcessGroup> ProcessGroup::duplicate() const { return std::make_unique<ProcessGroup>(comm_, limits_); }

}  // namespace tnt
