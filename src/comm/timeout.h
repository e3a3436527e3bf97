// The collective timeout as the backends use it: a deadline started when a call begins to wait,
// and the one message every backend gives when it passes. Internal to comm/.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::comm::detail {

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;
  // From now, comm_timeout_s() long (never, when it is 0).
  Deadline();
  // The timeout passed, or a stop signal's grace did (stopped()).
  bool passed() const { return (limit_s_ > 0 && Clock::now() >= end_) || stopped(); }
  // A first SIGTERM or SIGINT came, and the stop grace (communicator.h) has passed since the later
  // of it and this deadline's start.
  bool stopped() const;
  double limit_s() const { return limit_s_; }

 private:
  double limit_s_;
  Clock::time_point start_;
  Clock::time_point end_;
};

// "rank 2", "ranks 1 and 3", "ranks 0, 2 and 3".
std::string rank_list(const std::vector<int>& ranks);

// Throws the TimeoutError of a wait that passed its deadline:
// "<where> timed out after 2 s at step 3: <what>; ..." where `what` says whom it waited for
// ("rank 2 did not arrive"); or, when a stop signal's grace passed, the StopWaitError
// "<where> at step 3: given up 5 s after SIGTERM: <what>; ...".
[[noreturn]] void timed_out(std::string_view where, const Deadline& d, std::string_view what);

}  // namespace tandem::comm::detail
