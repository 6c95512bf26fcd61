#include "shared_segments.hpp"

#include <chrono>
#include <climits>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#endif

#include "errors.hpp"
#include "mpi_call.hpp"

namespace tnt {

static_assert(std::atomic<std::uint64_t>::is_always_lock_free,
              "notification flags must be lock-free to work across processes");
static_assert(std::atomic<std::uint32_t>::is_always_lock_free && sizeof(std::atomic<std::uint32_t>) == 4,
              "a doorbell's counter is a futex word shared between processes");

namespace {
// Note [Doorbells]: the longest sleep before a waiter checks its deadline and conditions again.
constexpr long kDoorbellSleepLimitNanoseconds = 1000000;  // 1 ms
}  // namespace

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
      header_bytes_(static_cast<std::size_t>(flags + 1) * 64 + kNotesBytes),
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

SharedSegments::Doorbell* SharedSegments::doorbell_of(int rank) const {
  return reinterpret_cast<Doorbell*>(bases_[rank] + 64 * static_cast<std::size_t>(flags_));
}

void SharedSegments::notify(int flag, std::uint64_t epoch) {
  // seq_cst, not release: a sleeper's check of this flag and its look at the rings must not both miss it.
  flag_of(group_.rank(), flag)->store(epoch, std::memory_order_seq_cst);
  for (int r = 0; r < group_.size(); ++r) {
    if (r != group_.rank()) ring(r);
  }
}

void SharedSegments::ring(int rank) {
  Doorbell* bell = doorbell_of(rank);
  bell->rings.fetch_add(1, std::memory_order_seq_cst);
  if (bell->sleepers.load(std::memory_order_seq_cst) == 0) return;  // nobody to wake: no system call
#if defined(__linux__)
  // Not FUTEX_PRIVATE: the word is shared between processes.
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&bell->rings), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
#endif
}

SharedSegments::DoorbellSleeper::DoorbellSleeper(const SharedSegments& segments) : segments_(segments) {}

SharedSegments::DoorbellSleeper::~DoorbellSleeper() {
  if (armed_) segments_.doorbell_of(segments_.group_.rank())->sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

void SharedSegments::DoorbellSleeper::sleep() {
  Doorbell* bell = segments_.doorbell_of(segments_.group_.rank());
  if (!armed_) {  // the caller checks its condition once more before the first sleep
    armed_ = true;
    bell->sleepers.fetch_add(1, std::memory_order_seq_cst);
    seen_ = bell->rings.load(std::memory_order_seq_cst);
    return;
  }
#if defined(__linux__)
  const timespec limit{0, kDoorbellSleepLimitNanoseconds};
  // Returns at once if the rings moved since seen_ (EAGAIN), on a ring, or after the limit.
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&bell->rings), FUTEX_WAIT, seen_, &limit, nullptr, 0);
#else
  std::this_thread::sleep_for(std::chrono::microseconds(10));
#endif
  seen_ = bell->rings.load(std::memory_order_seq_cst);  // read before the caller's next check
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
