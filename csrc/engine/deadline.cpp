#include "deadline.hpp"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <thread>

#include "errors.hpp"
#include "log.hpp"

namespace tnt {

Deadline::Deadline(const WaitLimits& limits) : start_(std::chrono::steady_clock::now()), limits_(limits) {}

namespace {
constexpr unsigned kSpinRounds = 2000;
constexpr unsigned kYieldRounds = 2000;
std::atomic<unsigned> g_spin_rounds{kSpinRounds};
}  // namespace

void set_oversubscribed(bool oversubscribed) { g_spin_rounds = oversubscribed ? 0 : kSpinRounds; }

void back_off(unsigned round) {
  const unsigned spin = g_spin_rounds.load(std::memory_order_relaxed);
  if (round < spin) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  } else if (round < spin + kYieldRounds) {
    sched_yield();
  } else {
    // Long waits sleep, ever longer up to 0.5 ms, so a rank blocked on a slow
    // peer leaves its core to the compute threads; the added latency is at
    // most one sleep, small against a wait that long.
    const unsigned micros = std::min(500u, 10u + (round - spin - kYieldRounds) / 8);
    std::this_thread::sleep_for(std::chrono::microseconds(micros));
  }
}

void Deadline::wait(const std::function<bool()>& done, const char* what,
                    const std::function<std::string()>& describe_missing) {
  for (unsigned round = 0;; ++round) {
    if (done()) return;
    back_off(round);
    if ((round & 63u) != 63u) continue;
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    if (!warned_ && waited > limits_.stall_warning_seconds) {
      warned_ = true;
      log_warning(std::string(what) + " has waited " + std::to_string(static_cast<int>(waited)) +
                  " s for " + describe_missing() +
                  "; one of them may be slower, stuck, or running different code (set TNT_LOG_LEVEL=DEBUG for details)");
    }
    if (waited > limits_.timeout_seconds) {
      throw TimeoutError(std::string(what) + " timed out after " + std::to_string(static_cast<int>(waited)) +
                         " s waiting for " + describe_missing() +
                         ": those ranks did not take part (crashed, hung, or called a different collective); "
                         "raise TNT_TIMEOUT_SECONDS (launcher flag --timeout) if they are merely slow");
    }
  }
}

}  // namespace tnt
