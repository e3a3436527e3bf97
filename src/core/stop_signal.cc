// The handlers: async-signal-safe (an atomic flag, the time from clock_gettime, write(2), and for a
// second signal the default action re-raised).
#include "tandem/core/stop_signal.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstring>

namespace tandem {
namespace {

std::atomic<int> g_received{0};
// Nanoseconds of the steady clock (clock_gettime(CLOCK_MONOTONIC), async-signal-safe) at the first
// signal; stored before g_received is published, so a reader that sees the signal sees its time.
std::atomic<int64_t> g_received_ns{0};
std::atomic<const char*> g_who{""};
std::atomic<const char*> g_point{""};
struct sigaction g_old_term, g_old_int;

void on_signal(int sig) {
  const int64_t now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::steady_clock::now().time_since_epoch())
                             .count();
  if (g_received.load() == 0) g_received_ns.store(now_ns);
  int none = 0;
  if (!g_received.compare_exchange_strong(none, sig)) {
    // The second: stop now, as the signal's default action would have.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigaction(sig, &dfl, nullptr);
    raise(sig);
    return;
  }
  // write(2) piece by piece: formatting is not async-signal-safe.
  auto say = [](const char* text) {
    const ssize_t ignored = write(STDERR_FILENO, text, std::strlen(text));
    (void)ignored;
  };
  if (sig == SIGINT) say("\n");
  say(g_who.load());
  say(sig == SIGINT ? ": SIGINT: stopping after " : ": SIGTERM: stopping after ");
  say(g_point.load());
  say(" (again: stop at once)\n");
}

}  // namespace

StopSignals::StopSignals(const char* who, const char* point) {
  g_received = 0;
  g_who = who;
  g_point = point;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // the collectives' and the files' system calls carry on
  sigaction(SIGTERM, &sa, &g_old_term);
  sigaction(SIGINT, &sa, &g_old_int);
}

StopSignals::~StopSignals() {
  sigaction(SIGTERM, &g_old_term, nullptr);
  sigaction(SIGINT, &g_old_int, nullptr);
}

int StopSignals::received() { return g_received.load(); }

std::chrono::steady_clock::time_point StopSignals::received_at() {
  return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(g_received_ns.load()));
}

}  // namespace tandem
