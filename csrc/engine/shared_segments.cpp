#include "shared_segments.hpp"

#include <cstring>

#include "errors.hpp"
#include "mpi_call.hpp"

namespace tnt {

static_assert(std::atomic<std::uint64_t>::is_always_lock_free,
              "notification flags must be lock-free to work across processes");

SharedSegments::SharedSegments(ProcessGroup& group, std::size_t data_bytes)
    : group_(group), data_bytes_(data_bytes), bases_(group.size()) {
  TNT_ASSERT(group.on_one_node(), "shared segments need a group on one node");
  MPI_Info info;
  TNT_MPI(MPI_Info_create(&info));
  // Each segment is placed in its owner's memory (first touch), not one contiguous block.
  TNT_MPI(MPI_Info_set(info, "alloc_shared_noncontig", "true"));
  char* mine = nullptr;
  const MPI_Aint bytes = static_cast<MPI_Aint>(kHeaderBytes + data_bytes);
  const int rc = MPI_Win_allocate_shared(bytes, 1, info, group.comm(), &mine, &window_);
  MPI_Info_free(&info);
  TNT_MPI(rc);
  std::memset(mine, 0, kHeaderBytes);
  for (int r = 0; r < group.size(); ++r) {
    MPI_Aint size = 0;
    int unit = 0;
    void* base = nullptr;
    TNT_MPI(MPI_Win_shared_query(window_, r, &size, &unit, &base));
    bases_[r] = static_cast<char*>(base);
  }
  // Nobody reads a header before its owner zeroed it.
  group.barrier();
}

void SharedSegments::close() {
  if (window_ == MPI_WIN_NULL) return;
  // MPI_Win_free waits for every rank without a deadline: meet under one
  // first, so that a missing peer is a TimeoutError rather than a hang. A
  // failed group keeps its window: peers may still write into it.
  group_.barrier();
  TNT_MPI(MPI_Win_free(&window_));
  window_ = MPI_WIN_NULL;
}

SharedSegments::~SharedSegments() = default;

std::atomic<std::uint64_t>* SharedSegments::flag_of(int rank, int flag) const {
  return reinterpret_cast<std::atomic<std::uint64_t>*>(bases_[rank] + 64 * flag);
}

void SharedSegments::notify(int flag, std::uint64_t epoch) {
  flag_of(group_.rank(), flag)->store(epoch, std::memory_order_release);
}

std::uint64_t SharedSegments::peek(int rank, int flag) const {
  return flag_of(rank, flag)->load(std::memory_order_acquire);
}

void SharedSegments::wait_for_others(int flag, std::uint64_t epoch, const char* what) {
  const int self = group_.rank();
  const int size = group_.size();
  auto all_there = [&] {
    for (int r = 0; r < size; ++r) {
      if (r != self && peek(r, flag) < epoch) return false;
    }
    return true;
  };
  if (all_there()) return;
  group_.wait_until(all_there, what, [&] {
    std::vector<int> behind;
    for (int r = 0; r < size; ++r) {
      if (r != self && peek(r, flag) < epoch) behind.push_back(r);
    }
    return group_.describe_ranks(behind);
  });
}

}  // namespace tnt
