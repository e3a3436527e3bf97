// The resident-block choice against every count tried, on random predictions of the shapes the
// model gives (compute nondecreasing and infinite past what fits, I/O nonincreasing), and the
// step-time arithmetic.
#include "tandem/perf/streamed_state.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <vector>

namespace tandem::perf {
namespace streamed_state_test {

// The most resident of the counts with the shortest step, trying each.
int fastest_by_trying_all(const std::vector<double>& compute, const std::vector<double>& io) {
  int best = 0;
  double best_s = std::numeric_limits<double>::infinity();
  for (size_t r = 0; r < compute.size(); ++r) {
    if (!std::isfinite(compute[r])) break;
    const double s = std::max(compute[r], io[r]);
    if (s <= best_s) {
      best_s = s;
      best = static_cast<int>(r);
    }
  }
  return best;
}

TEST(StreamedState, ResidentBlocksAreTheFastestOfEveryCount) {
  std::mt19937 gen(7);
  for (int trial = 0; trial < 2000; ++trial) {
    const int n = std::uniform_int_distribution<int>(0, 40)(gen);
    // Small integer steps, so that ties (plateaus) are common.
    std::uniform_int_distribution<int> step(0, 2);
    std::vector<double> compute(static_cast<size_t>(n) + 1), io(compute.size());
    double c = std::uniform_int_distribution<int>(1, 20)(gen), d = 60;
    for (int r = 0; r <= n; ++r) {
      compute[static_cast<size_t>(r)] = c += step(gen);
      io[static_cast<size_t>(r)] = d -= step(gen);
    }
    const int fits = std::uniform_int_distribution<int>(0, n + 1)(gen);  // n + 1: all fit
    for (int r = std::max(fits, 1); r <= n; ++r)
      compute[static_cast<size_t>(r)] = std::numeric_limits<double>::infinity();
    int asked = 0;
    const int chosen = fastest_resident_blocks(
        n,
        [&](int r) {
          ++asked;
          return compute[static_cast<size_t>(r)];
        },
        [&](int r) { return io[static_cast<size_t>(r)]; });
    ASSERT_EQ(chosen, fastest_by_trying_all(compute, io)) << "trial " << trial << ", n " << n;
    EXPECT_LE(asked, 3 * (1 + static_cast<int>(std::log2(n + 1))) + 3);
  }
}

TEST(StreamedState, SharedTierAddsTheActivationsSwaps) {
  const ooc::TierBandwidth bw{2e9, 4e9};
  EXPECT_DOUBLE_EQ(state_io_s(1.5, 4'000'000'000, bw, false), 1.5);
  EXPECT_DOUBLE_EQ(state_io_s(1.5, 4'000'000'000, bw, true), 1.5 + 2.0 + 1.0);
  EXPECT_DOUBLE_EQ(streamed_step_s(2.0, 3.0), 3.0);
  EXPECT_DOUBLE_EQ(streamed_step_s(4.0, 3.0), 4.0);
  // The store's bytes at the tier's two bandwidths: 4 GB read at 4 GB/s, 2 GB written at 2 GB/s.
  parallel::BlockStore::Traffic t;
  t.read_bytes = 4'000'000'000, t.written_bytes = 2'000'000'000;
  EXPECT_DOUBLE_EQ(store_io_s(t, bw), 1.0 + 1.0);
}

}  // namespace streamed_state_test
}  // namespace tandem::perf
