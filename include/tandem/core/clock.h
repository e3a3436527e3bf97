// The monotonic clock every timing in tandem reads, and the seconds since a point of it.
#pragma once

#include <chrono>

namespace tandem {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace tandem
