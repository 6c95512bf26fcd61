#include "deadline.hpp"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <thread>

#include "errors.hpp"
#include "log.hpp"

namespace tnt {

Deadline::Deadline(const WaitLimits& limits, Clock::time_point start, const char* cause)
    : start_(start), limits_(limits), cause_(cause) {}

double Deadline::waited() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

namespace {
constexpr unsigned kSpinRounds = 2000;
constexpr unsigned kYieldRounds = 2000;
std::atomic<unsigned> g_spin_rounds{kSpinRounds};
constexpr unsigned kPatientSpinRounds = 200;  // about 10 us
thread_local bool t_patient = false;
thread_local WaitSleeper* t_sleeper = nullptr;
}  // namespace

void set_oversubscribed(bool oversubscribed) { g_spin_rounds = oversubscribed ? 0 : kSpinRounds; }

PatientWaits::PatientWaits(WaitSleeper* sleeper) : previous_(t_patient), previous_sleeper_(t_sleeper) {
  t_patient = true;
  t_sleeper = sleeper;
}
PatientWaits::~PatientWaits() {
  t_patient = previous_;
  t_sleeper = previous_sleeper_;
}

void back_off(unsigned round) {
  const unsigned spin = t_patient ? std::min(kPatientSpinRounds, g_spin_rounds.load(std::memory_order_relaxed))
                                  : g_spin_rounds.load(std::memory_order_relaxed);
  const unsigned yields = t_patient ? 0 : kYieldRounds;
  if (round < spin) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  } else if (round < spin + yields) {
    sched_yield();
  } else if (t_patient && t_sleeper != nullptr) {
    t_sleeper->sleep();
  } else {
    // Long waits sleep, ever longer up to 0.5 ms, so a rank blocked on a slow
    // peer leaves its core to the compute threads; the added latency is at
    // most one sleep, small against a wait that long.
    const unsigned micros = std::min(500u, 10u + (round - spin - yields) / 8);
    std::this_thread::sleep_for(std::chrono::microseconds(micros));
  }
}

void back_off_briefly(unsigned round) {
  const unsigned spin = g_spin_rounds.load(std::memory_order_relaxed);
  // Oversubscribed (spin == 0: set_oversubscribed), or still spinning: back_off's own step.
  if (spin == 0 || round < spin) {
    back_off(round);
  } else {
    sched_yield();
  }
}

void Deadline::wait(const std::function<bool()>& done, const char* what,
                    const std::function<std::string()>& describe_missing) {
  for (unsigned round = 0;; ++round) {
    if (done()) return;
    back_off(round);
    if ((round & 63u) == 63u) check_time(what, describe_missing);
  }
}

void Deadline::wait(std::unique_lock<std::mutex>& lock, std::condition_variable& changed,
                    const std::function<bool()>& done, const std::string& what,
                    const std::function<std::string()>& describe_missing) {
  auto at = [this](double seconds) {
    return start_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  };
  while (!done()) {
    const double next = warned_ ? limits_.timeout_seconds
                                : std::min(limits_.stall_warning_seconds, limits_.timeout_seconds);
    if (changed.wait_until(lock, at(next), done)) return;
    check_time(what, describe_missing);
  }
}

void Deadline::check_time(const std::string& what, const std::function<std::string()>& describe_missing) {
  const double seconds = waited();
  if (!warned_ && seconds > limits_.stall_warning_seconds) {
    warned_ = true;
    log_warning(what + " has waited " + std::to_string(static_cast<int>(seconds)) + " s for " + describe_missing() +
                ", which may be slower, stuck, or running different code (set TNT_LOG_LEVEL=DEBUG for details)");
  }
  if (seconds > limits_.timeout_seconds) throw timeout_error(what, describe_missing());
}

TimeoutError Deadline::timeout_error(const std::string& what, const std::string& missing) const {
  return TimeoutError(what + " timed out after " + std::to_string(static_cast<int>(waited())) + " s waiting for " +
                      missing + ": " + cause_ +
                      "; raise TNT_TIMEOUT_SECONDS (launcher flag --timeout) if they are merely slow");
}

}  // namespace tnt
