// The counter-based generator: the published Philox known answers, and independence from the
// order in which elements are drawn.
#include "tandem/core/rng.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

namespace tandem {
namespace {

// Known-answer vectors of Philox4x32-10 from the Random123 distribution (kat_vectors).
TEST(Rng, PhiloxKnownAnswers) {
  auto zero = philox4x32(0, {0, 0, 0, 0});
  EXPECT_EQ(zero, (std::array<uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  auto ones =
      philox4x32(0xffffffffffffffffull, {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu});
  EXPECT_EQ(ones, (std::array<uint32_t, 4>{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  auto pi = philox4x32(uint64_t{0x299f31d0u} << 32 | 0xa4093822u,
                       {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u});
  EXPECT_EQ(pi, (std::array<uint32_t, 4>{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(Rng, DrawsDoNotDependOnOrder) {
  std::vector<uint64_t> order(1000);
  std::iota(order.begin(), order.end(), 0);
  std::vector<uint32_t> forward(1000), shuffled(1000);
  for (uint64_t i : order) forward[i] = random_bits(42, i);
  std::shuffle(order.begin(), order.end(), std::mt19937(7));
  for (uint64_t i : order) shuffled[i] = random_bits(42, i);
  EXPECT_EQ(forward, shuffled);
}

TEST(Rng, UniformIsInRangeAndRoughlyUniform) {
  double sum = 0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    float u = random_uniform(1, i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
  }
  EXPECT_NEAR(sum / n, 0.5, 0.01);
}

TEST(Rng, DropoutKeepsAboutOneMinusP) {
  int kept = 0;
  for (int i = 0; i < 100000; ++i) kept += dropout_keep(3, i, 0.25f);
  EXPECT_NEAR(kept / 100000.0, 0.75, 0.01);
}

// random_bits_tile is random_bits bit for bit: every start within a block, lengths across the
// tile (256 words) and 8-block boundaries, counters carrying into the high word, other streams.
TEST(Rng, TileEqualsRandomBits) {
  const uint64_t key = 0x0123456789abcdefull;
  for (uint64_t first : {uint64_t{0}, uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{1001},
                         (uint64_t{1} << 34) - 5, ~uint64_t{0} - 700})
    for (int64_t n : {0, 1, 3, 4, 5, 31, 32, 33, 253, 255, 256, 257, 1000}) {
      for (uint32_t stream : {0u, 7u}) {
        std::vector<uint32_t> got(static_cast<size_t>(n) + 1, 0xdeadbeefu);
        random_bits_tile(got.data(), key, first, n, stream);
        for (int64_t k = 0; k < n; ++k)
          ASSERT_EQ(got[static_cast<size_t>(k)],
                    random_bits(key, first + static_cast<uint64_t>(k), stream))
              << "first " << first << " n " << n << " k " << k << " stream " << stream;
        EXPECT_EQ(got[static_cast<size_t>(n)], 0xdeadbeefu) << "wrote past n = " << n;
      }
    }
}

TEST(Rng, SeedsAndStreamsDiffer) {
  EXPECT_NE(random_bits(1, 0), random_bits(2, 0));
  EXPECT_NE(random_bits(1, 0, 0), random_bits(1, 0, 1));
}

}  // namespace
}  // namespace tandem
