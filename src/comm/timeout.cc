// The collective timeout: its setting (TANDEM_COMM_TIMEOUT, or set_comm_timeout_s), the calling
// thread's activity for messages, and the message a wait that passed its deadline gives.
#include "timeout.h"

#include <fmt/format.h>

#include <atomic>
#include <cmath>
#include <cstdlib>

#include "tandem/comm/communicator.h"
#include "tandem/core/env.h"
#include "tandem/core/error.h"

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

void set_comm_activity(std::string what) { t_activity = std::move(what); }
const std::string& comm_activity() { return t_activity; }

namespace detail {

Deadline::Deadline() : limit_s_(comm_timeout_s()) {
  if (limit_s_ > 0)
    end_ = Clock::now() +
           std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limit_s_));
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
  throw TimeoutError(fmt::format(
      "{} timed out after {:g} s{}: {}; a rank that does not arrive is stuck, stopped or lost (the "
      "limit is --comm-timeout or TANDEM_COMM_TIMEOUT)",
      where, d.limit_s(), activity.empty() ? "" : " at " + activity, what));
}

}  // namespace detail
}  // namespace tandem::comm
