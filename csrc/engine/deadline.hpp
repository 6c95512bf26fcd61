// Waiting without hanging: every blocking wait in the engine runs under a
// Deadline, the one home of the stall warning and the timeout. A wait either
// polls a condition (MPI requests, shared-memory flags), backing off from
// spinning to sleeping so that a waiting rank costs little CPU, or sleeps on a
// condition variable that whoever changes the condition notifies (a progress
// thread's results). Either way a stalled wait warns once, and a lost peer
// becomes a TimeoutError naming what is missing.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>

#include "errors.hpp"

namespace tnt {

struct WaitLimits {
  double timeout_seconds = 300.0;        // then TimeoutError
  double stall_warning_seconds = 60.0;   // then one warning on stderr
};

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;
  // What the timeout message gives as the likely cause, unless a wait says otherwise.
  static constexpr const char* kRanksMissing =
      "those ranks did not take part (crashed, hung, or called a different collective)";

  // Counts from `start`; `cause` ends the timeout message.
  explicit Deadline(const WaitLimits& limits, Clock::time_point start = Clock::now(),
                    const char* cause = kRanksMissing);
  double waited() const;
  bool passed() const { return waited() > limits_.timeout_seconds; }

  // Polls `done` until it returns true. On the stall warning and on timeout,
  // `describe_missing()` names what is still awaited (e.g. "rank 2, rank 3").
  void wait(const std::function<bool()>& done, const char* what,
            const std::function<std::string()>& describe_missing);
  // The same, sleeping on `changed` between checks of `done` (the caller holds
  // `lock` on the mutex guarding what `done` reads; whoever changes it notifies).
  void wait(std::unique_lock<std::mutex>& lock, std::condition_variable& changed, const std::function<bool()>& done,
            const std::string& what, const std::function<std::string()>& describe_missing);
  // The error a wait for `what`, still missing `missing`, ends with.
  TimeoutError timeout_error(const std::string& what, const std::string& missing) const;

 private:
  // Warns once the stall warning time has passed; throws once the timeout has.
  void check_time(const std::string& what, const std::function<std::string()>& describe_missing);

  Clock::time_point start_;
  WaitLimits limits_;
  const char* cause_;
  bool warned_ = false;
};

// One step of the spin -> yield -> sleep back-off, `round` counting from 0.
void back_off(unsigned round);

// One step of a wait for something due within the time of a compute pass: spin,
// then yield for as long as it lasts, never a timed sleep (Note [Awaited receives
// are polled without sleeping] in peer_channels.hpp). With more ranks on the node
// than cores it is back_off: there a polling thread takes a core a rank needs.
void back_off_briefly(unsigned round);

// With more ranks on a node than cores, a spinning rank holds the core that the
// rank it waits for needs: then waits start by yielding, without spinning.
void set_oversubscribed(bool oversubscribed);

// Sleeps until what a wait polls may have changed (whoever changes it wakes the
// sleeper), instead of back_off's timed sleeps. back_off calls sleep() after each
// failed check of the condition; the first call only arms the sleeper (it notes
// the wake-ups so far), so a change between that call's return and the next
// check is never slept through.
class WaitSleeper {
 public:
  virtual ~WaitSleeper() = default;
  virtual void sleep() = 0;
};

// Within its scope, this thread's waits spin briefly and never yield: they go
// to back_off's sleeps at once, or to `sleeper` when given. For a background
// thread that waits while the rank's compute threads want every core (the fused
// reducer's progress thread waiting for a peer's flag in shared memory): its
// spins, yields and timed wake-ups came out of backprop's time. Not for waits
// that drive MPI's progress (they poll it).
class PatientWaits {
 public:
  explicit PatientWaits(WaitSleeper* sleeper = nullptr);
  ~PatientWaits();
  PatientWaits(const PatientWaits&) = delete;
  PatientWaits& operator=(const PatientWaits&) = delete;

 private:
  bool previous_;
  WaitSleeper* previous_sleeper_;
};

}  // namespace tnt
