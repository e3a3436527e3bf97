// The collective timeout: its setting (TANDEM_COMM_TIMEOUT, or set_comm_timeout_s), the grace a
// wait keeps after a stop signal, the calling thread's activity for messages, and the message a
// wait that passed its deadline gives.
#include "timeout.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdlib>

#include "tandem/comm/communicator.h"
#include "tandem/core/env.h"
#include "tandem/core/error.h"
#include "tandem/core/stop_signal.h"

namespace tandem::comm {
namespace {

// Negative: no override, the environment's value holds.
std::atomic<double> g_timeout_override{-1.0};

double env_timeout_s() {
  static const double s = [] {
    const std::string v = env_str("TANDEM_COMM_TIMEOUT", "");
    return v.empty() ? kDefaultCommTimeoutS : parse_comm_timeout(v, "TANDEM_COMM_TIMEOUT");
  }();
  return s;
}

thread_local std::string t_activity;

// The stop grace: negative outside a ScopedStopGrace (waits ignore the signal).
std::atomic<double> g_stop_grace{-1.0};
// The ScopedStopGraceOff objects alive.
std::atomic<int> g_stop_grace_off{0};

double stop_grace_floor_s() {
  static const double s = [] {
    const std::string v = env_str("TANDEM_STOP_GRACE", "");
    if (v.empty()) return kDefaultStopGraceS;
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (*end != '\0' || !std::isfinite(x) || x < 0 || x > kMaxCommTimeoutS)
      user_error(
          "TANDEM_STOP_GRACE={} is not a grace: expected a number of seconds, 0 or more (default "
          "{:g})",
          v, kDefaultStopGraceS);
    return x;
  }();
  return s;
}

}  // namespace

double parse_comm_timeout(const std::string& text, const std::string& what) {
  char* end = nullptr;
  const double s = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(s) || s < 0)
    user_error(
        "{}={} is not a timeout: expected a number of seconds, 0 or more (0: wait forever; "
        "default {})",
        what, text, kDefaultCommTimeoutS);
  if (s > kMaxCommTimeoutS)
    user_error("{}={} is too long a timeout: at most {:g} seconds (0: wait forever)", what, text,
               kMaxCommTimeoutS);
  return s;
}

double comm_timeout_s() {
  const double o = g_timeout_override.load(std::memory_order_relaxed);
  return o >= 0 ? o : env_timeout_s();
}

void set_comm_timeout_s(double seconds) {
  g_timeout_override.store(seconds, std::memory_order_relaxed);
}

double stop_grace_s() { return g_stop_grace.load(std::memory_order_relaxed); }

void raise_stop_grace_s(double seconds) {
  double now = g_stop_grace.load();
  // Only within a scope (now >= 0), and only upwards.
  while (now >= 0 && seconds > now && !g_stop_grace.compare_exchange_weak(now, seconds)) {
  }
}

ScopedStopGrace::ScopedStopGrace(std::optional<double> floor_s) {
  g_stop_grace.store(floor_s ? std::max(0.0, *floor_s) : stop_grace_floor_s());
}
ScopedStopGrace::~ScopedStopGrace() { g_stop_grace.store(-1.0); }

ScopedStopGraceOff::ScopedStopGraceOff() { g_stop_grace_off.fetch_add(1); }
ScopedStopGraceOff::~ScopedStopGraceOff() { g_stop_grace_off.fetch_sub(1); }

void set_comm_activity(std::string what) { t_activity = std::move(what); }
const std::string& comm_activity() { return t_activity; }

namespace detail {

Deadline::Deadline() : limit_s_(comm_timeout_s()), start_(Clock::now()) {
  if (limit_s_ > 0)
    end_ = start_ +
           std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limit_s_));
}

bool Deadline::stopped() const {
  if (StopSignals::received() == 0) return false;  // one atomic load: the common case
  const double grace = stop_grace_s();
  if (grace < 0 || g_stop_grace_off.load() > 0) return false;
  const Clock::time_point from = std::max(start_, StopSignals::received_at());
  return Clock::now() >=
         from + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace));
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) out += i + 1 == ranks.size() ? " and " : ", ";
    out += std::to_string(ranks[i]);
  }
  return out;
}

void timed_out(std::string_view where, const Deadline& d, std::string_view what) {
  const std::string& activity = comm_activity();
  if (d.stopped()) {
    const int sig = StopSignals::received();
    throw StopWaitError(
        sig,
        fmt::format("{}{}: given up {:g} s after {}: {}; a rank that does not arrive is stuck, "
                    "stopped, lost or started with other settings",
                    where, activity.empty() ? "" : " at " + activity, stop_grace_s(),
                    sig == SIGINT ? "SIGINT" : "SIGTERM", what));
  }
  throw TimeoutError(fmt::format(
      "{} timed out after {:g} s{}: {}; a rank that does not arrive is stuck, stopped or lost (the "
      "limit is --comm-timeout or TANDEM_COMM_TIMEOUT)",
      where, d.limit_s(), activity.empty() ? "" : " at " + activity, what));
}

}  // namespace detail
}  // namespace tandem::comm
