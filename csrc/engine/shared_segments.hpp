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
//
// Note [Doorbells]
// A waiter that polls a peer's flag with timed sleeps wakes every 10-20 us
// while the peer is behind: on a node whose cores the ranks' compute threads
// fill, each wake-up preempts a compute thread (two context switches, and on a
// virtual machine a timer reprogramming that exits to the hypervisor). At
// ResNet-50's step (32x32, 54 buckets, peers milliseconds apart; 2 ranks on 2
// cores) that cost about 45 ms of CPU per step and rank (perf), more than the
// reduction's copies, and 2-rank tnt.Model took 118 ms per step more than Keras
// on both ranks; with doorbells 12 ms (bench.fixed_cost paired). So every segment
// header has a doorbell: a counter of rings and a count of sleepers. notify()
// rings every peer's doorbell after its flag store; a waiter (DoorbellSleeper,
// for PatientWaits) notes the rings, checks its condition, and sleeps in the
// kernel (a futex on the counter, shared between the processes) until the
// counter moves: it wakes when a peer changed a flag, not on a timer. The
// counter is read before the check and the futex sleeps only while it still
// holds that value, so a ring between check and sleep is never missed; the
// ringer makes the wake-up system call only when someone sleeps (all seq_cst:
// either the waiter sees the ring or the ringer sees the sleeper). A sleep is
// bounded (1 ms) so that a wait still checks its deadline and its other
// conditions now and then.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "deadline.hpp"
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
  // kNotesBytes of rank's header after the flags and the doorbell, for small notes such as a call descriptor.
  char* notes(int rank) const { return bases_[rank] + static_cast<std::size_t>(flags_ + 1) * 64; }
  int flag_count() const { return flags_; }
  std::size_t data_bytes() const { return data_bytes_; }

  // Sets this rank's `flag` to `epoch` and rings every peer's doorbell (Note [Doorbells]).
  void notify(int flag, std::uint64_t epoch);
  // Wakes whoever sleeps on `rank`'s doorbell (also this rank's own, for a change it made itself).
  void ring(int rank);
  std::uint64_t peek(int rank, int flag) const;
  // Waits until every other rank's `flag` reached `epoch`; `what` names the
  // stage in the timeout message, which lists the ranks still behind.
  void wait_for_others(int flag, std::uint64_t epoch, const char* what);

  // For PatientWaits on this rank's threads: sleeps on this rank's doorbell (Note [Doorbells]).
  class DoorbellSleeper : public WaitSleeper {
   public:
    explicit DoorbellSleeper(const SharedSegments& segments);
    ~DoorbellSleeper() override;
    DoorbellSleeper(const DoorbellSleeper&) = delete;
    DoorbellSleeper& operator=(const DoorbellSleeper&) = delete;
    void sleep() override;

   private:
    const SharedSegments& segments_;
    bool armed_ = false;
    std::uint32_t seen_ = 0;  // the rings counted when last armed
  };

 private:
  struct Doorbell {
    std::atomic<std::uint32_t> rings;     // only grows (and wraps); the futex word
    std::atomic<std::uint32_t> sleepers;  // the owner's threads that may sleep on `rings`
  };
  std::atomic<std::uint64_t>* flag_of(int rank, int flag) const;
  Doorbell* doorbell_of(int rank) const;
  ProcessGroup& group_;
  MPI_Win window_ = MPI_WIN_NULL;
  std::uint64_t creation_ = 0;  // this process's count of windows made before this one
  int flags_;
  std::size_t header_bytes_;  // flags_ cache lines, the doorbell's, kNotesBytes
  std::size_t data_bytes_;
  std::vector<char*> bases_;
};

}  // namespace tnt
