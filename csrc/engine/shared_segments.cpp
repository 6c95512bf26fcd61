#include "shared_segments.hpp"

#include <cstring>
#include <map>
#include <mutex>

#include "errors.hpp"
#include "mpi_call.hpp"

namespace tnt {

static_assert(std::atomic<std::uint64_t>::is_always_lock_free,
              "notification flags must be lock-free to work across processes");

// Note [Windows are freed in creation order]
// A window that was not closed explicitly (its owner was garbage-collected,
// or still lives at exit) must still be freed before MPI_Finalize, and
// MPI_Win_free waits for every rank of the window. Left to MPI_Finalize, the
// windows are freed in the MPI library's own order, which need not be the
// same on every rank (it hung jobs at exit: one rank freeing window A while
// its peer waited in window B). Windows are made collectively, so every rank
// made them in one order; freeing them in that order, at one point of the
// program (the engine's stop), meets the same peers in the same sequence as
// their creation did.
namespace {
struct UnclosedWindows {
  std::mutex mutex;
  std::uint64_t made = 0;
  std::map<std::uint64_t, SharedSegments*> live;  // by creation number
  std::map<std::uint64_t, MPI_Win> orphaned;       // owners gone, windows still up
};
UnclosedWindows& unclosed() {
  static UnclosedWindows* windows = new UnclosedWindows();  // never destroyed: used at exit
  return *windows;
}
}  // namespace

SharedSegments::SharedSegments(ProcessGroup& group, std::size_t data_bytes, int flags)
    : group_(group),
      flags_(flags),
      header_bytes_(static_cast<std::size_t>(flags) * 64 + kNotesBytes),
      data_bytes_(data_bytes),
      bases_(group.size()) {
  TNT_ASSERT(group.on_one_node(), "shared segments need a group on one node");
  TNT_ASSERT(flags > 0, "shared segments need at least one flag");
  MPI_Info info;
  TNT_MPI(MPI_Info_create(&info));
  // Each segment is placed in its owner's memory (first touch), not one contiguous block.
  TNT_MPI(MPI_Info_set(info, "alloc_shared_noncontig", "true"));
  char* mine = nullptr;
  const MPI_Aint bytes = static_cast<MPI_Aint>(header_bytes_ + data_bytes);
  const int rc = MPI_Win_allocate_shared(bytes, 1, info, group.comm(), &mine, &window_);
  MPI_Info_free(&info);
  TNT_MPI(rc);
  std::memset(mine, 0, header_bytes_);
  for (int r = 0; r < group.size(); ++r) {
    MPI_Aint size = 0;
    int unit = 0;
    void* base = nullptr;
    TNT_MPI(MPI_Win_shared_query(window_, r, &size, &unit, &base));
    bases_[r] = static_cast<char*>(base);
  }
  // Nobody reads a header before its owner zeroed it.
  group.barrier();
  std::lock_guard<std::mutex> lock(unclosed().mutex);
  creation_ = unclosed().made++;
  unclosed().live[creation_] = this;
}

void SharedSegments::close() {
  if (window_ == MPI_WIN_NULL) return;
  // MPI_Win_free waits for every rank without a deadline: meet under one
  // first, so that a missing peer is a TimeoutError rather than a hang. A
  // failed group keeps its window: peers may still write into it.
  group_.barrier();
  TNT_MPI(MPI_Win_free(&window_));
  window_ = MPI_WIN_NULL;
  std::lock_guard<std::mutex> lock(unclosed().mutex);
  unclosed().live.erase(creation_);
}

SharedSegments::~SharedSegments() {
  std::lock_guard<std::mutex> lock(unclosed().mutex);
  unclosed().live.erase(creation_);
  if (window_ != MPI_WIN_NULL) unclosed().orphaned[creation_] = window_;
}

void SharedSegments::free_all_at_exit() {
  std::map<std::uint64_t, MPI_Win*> windows;
  std::lock_guard<std::mutex> lock(unclosed().mutex);
  for (auto& [creation, segments] : unclosed().live) windows[creation] = &segments->window_;
  for (auto& [creation, window] : unclosed().orphaned) windows[creation] = &window;
  for (auto& [creation, window] : windows) {
    if (*window != MPI_WIN_NULL) MPI_Win_free(window);  // MPI sets it to MPI_WIN_NULL
  }
  unclosed().live.clear();
  unclosed().orphaned.clear();
}

std::atomic<std::uint64_t>* SharedSegments::flag_of(int rank, int flag) const {
  TNT_ASSERT(flag >= 0 && flag < flags_, "no such notification flag");
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
