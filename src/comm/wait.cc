// The platform half of waiting: pause, yield, and futex sleep/wake (Linux), with a portable
// fallback that sleeps briefly. The futexes are process-shared (no FUTEX_PRIVATE_FLAG), so a bell
// in memory that several processes map wakes a sleeper in any of them.
#include "wait.h"

#include <sched.h>

#include <chrono>
#include <climits>
#include <thread>

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace tandem::comm::detail {

SpinPolicy spin_policy_for(int threads) {
  const unsigned cores = std::thread::hardware_concurrency();
  if (cores != 0 && static_cast<unsigned>(threads) <= cores) return SpinPolicy{2000, 16};
  return SpinPolicy{64, 4};
}

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

void yield_thread() { sched_yield(); }

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_us) {
#ifdef __linux__
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
  timespec ts{static_cast<time_t>(timeout_us / 1'000'000),
              static_cast<long>((timeout_us % 1'000'000) * 1000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
#else
  if (word->load() == expected) std::this_thread::sleep_for(std::chrono::microseconds(50));
  (void)timeout_us;
#endif
}

void futex_wake_all(std::atomic<uint32_t>* word) {
#ifdef __linux__
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
#else
  (void)word;
#endif
}

}  // namespace tandem::comm::detail
