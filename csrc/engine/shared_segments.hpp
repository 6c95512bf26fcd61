// GASPI-style one-sided communication on one node: every rank of a group
// owns a segment (an MPI-3 shared window) that all the others map, and a row
// of notification flags in its header. A rank writes only its own segment
// and flags; it reads the others' after seeing their flags.
//
// Note [Notifications are epochs]
// A flag holds the number of the last epoch (round, call) its owner finished
// for that stage. Flags only grow, so they are never reset, and a reader
// waits for `flag >= epoch`. The owner's data writes happen before its
// release-store of the flag; the reader's acquire-load of the flag happens
// before its reads, so a seen flag means the data is there.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "process_group.hpp"

namespace tnt {

class SharedSegments {
 public:
  static constexpr int kFlags = 8;
  static constexpr std::size_t kNotesBytes = 512;

  // Collective over `group`, which must be on one node. Each segment's header
  // holds `flags` notification flags, each on its own cache line, then the
  // owner's notes; its data follows, 64-byte aligned.
  SharedSegments(ProcessGroup& group, std::size_t data_bytes, int flags = kFlags);
  // Frees the window: collective, so only by an explicit close (Note [Closing is explicit]).
  void close();
  // Hands a window that was not closed to free_all_at_exit(): freeing it waits
  // for every peer, which a destructor run by a garbage collector must never do.
  ~SharedSegments();
  // Collective over the world, once, at the engine's stop before MPI_Finalize:
  // frees every window not closed yet, live or orphaned, in creation order
  // (Note [Windows are freed in creation order]).
  static void free_all_at_exit();
  SharedSegments(const SharedSegments&) = delete;
  SharedSegments& operator=(const SharedSegments&) = delete;

  char* data(int rank) const { return bases_[rank] + header_bytes_; }
  // kNotesBytes of rank's header after the flags, for small notes such as a call descriptor.
  char* notes(int rank) const { return bases_[rank] + static_cast<std::size_t>(flags_) * 64; }
  int flag_count() const { return flags_; }
  std::size_t data_bytes() const { return data_bytes_; }

  void notify(int flag, std::uint64_t epoch);
  std::uint64_t peek(int rank, int flag) const;
  // Waits until every other rank's `flag` reached `epoch`; `what` names the
  // stage in the timeout message, which lists the ranks still behind.
  void wait_for_others(int flag, std::uint64_t epoch, const char* what);

 private:
  std::atomic<std::uint64_t>* flag_of(int rank, int flag) const;
  ProcessGroup& group_;
  MPI_Win window_ = MPI_WIN_NULL;
  std::uint64_t creation_ = 0;  // this process's count of windows made before this one
  int flags_;
  std::size_t header_bytes_;  // flags_ cache lines + kNotesBytes
  std::size_t data_bytes_;
  std::vector<char*> bases_;
};

}  // namespace tnt
