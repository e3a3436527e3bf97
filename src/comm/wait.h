// Waiting without burning a core: a doorbell per waiting thread that spins briefly, then yields,
// then sleeps on a futex until a thread that changed something it may be waiting for rings it.
// Internal to comm/.
//
// The protocol (no lost wake-ups): a waiter announces itself (sleepers += 1), reads the bell,
// re-checks its condition and sleeps only if the bell still reads the same. A ringer changes its
// state first and then looks for sleepers. Every access involved is seq_cst, so either the waiter
// sees the new state or the ringer sees the sleeper (the store-buffering outcome where both miss
// is forbidden). Sleeps also time out, as a safety net: a missed ring costs time, never a hang.
#pragma once

#include <atomic>
#include <cstdint>

namespace tandem::comm::detail {

// How long a waiter spins and yields before it sleeps. Ranks that share cores spin very little:
// their spinning would take the core from the rank they wait for.
struct SpinPolicy {
  int spins = 2000;  // pause-instruction iterations (tens of microseconds)
  int yields = 16;   // sched_yield calls
};
// The policy for `threads` busy threads on this machine.
SpinPolicy spin_policy_for(int threads);

void cpu_relax();
void yield_thread();
// Sleeps while *word == expected, at most timeout_us (spurious returns are fine).
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_us);
void futex_wake_all(std::atomic<uint32_t>* word);

class alignas(64) Bell {
 public:
  // Wakes the owner if it sleeps. Call after the state change (a seq_cst store) it may wait for.
  void ring() {
    if (sleepers_.load(std::memory_order_seq_cst) != 0) {
      word_.fetch_add(1, std::memory_order_seq_cst);
      futex_wake_all(&word_);
    }
  }

  // Returns once ready() is true. ready() must read the awaited state with seq_cst loads.
  // check() runs between sleeps and may throw (the group was aborted, the peer is gone).
  template <typename Ready, typename Check>
  void wait(const SpinPolicy& policy, Ready&& ready, Check&& check) {
    for (int i = 0; i < policy.spins; ++i) {
      if (ready()) return;
      cpu_relax();
    }
    for (int i = 0; i < policy.yields; ++i) {
      if (ready()) return;
      check();
      yield_thread();
    }
    for (;;) {
      if (ready()) return;
      check();
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      const uint32_t seen = word_.load(std::memory_order_seq_cst);
      if (!ready()) futex_wait(&word_, seen, kSafetyTimeoutUs);
      sleepers_.fetch_sub(1, std::memory_order_seq_cst);
    }
  }

 private:
  static constexpr int64_t kSafetyTimeoutUs = 100'000;
  std::atomic<uint32_t> word_{0};
  std::atomic<uint32_t> sleepers_{0};
};

}  // namespace tandem::comm::detail
