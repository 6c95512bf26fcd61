// Waiting without hanging: every blocking wait in the engine polls a
// condition under a Deadline and backs off from spinning to sleeping, so a
// waiting rank costs little CPU and a lost peer becomes a TimeoutError.
#pragma once

#include <chrono>
#include <functional>
#include <string>

namespace tnt {

struct WaitLimits {
  double timeout_seconds = 300.0;        // then TimeoutError
  double stall_warning_seconds = 60.0;   // then one warning on stderr
};

class Deadline {
 public:
  explicit Deadline(const WaitLimits& limits);
  // Polls `done` until it returns true. On the stall warning and on timeout,
  // `describe_missing()` names what is still awaited (e.g. "rank 2, rank 3").
  void wait(const std::function<bool()>& done, const char* what,
            const std::function<std::string()>& describe_missing);

 private:
  std::chrono::steady_clock::time_point start_;
  WaitLimits limits_;
  bool warned_ = false;
};

// One step of the spin -> yield -> sleep back-off, `round` counting from 0.
void back_off(unsigned round);

// With more ranks on a node than cores, a spinning rank holds the core that the
// rank it waits for needs: then waits start by yielding, without spinning.
void set_oversubscribed(bool oversubscribed);

}  // namespace tnt
