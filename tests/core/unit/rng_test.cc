// The counter-based generator: the published Philox known answers, and independence from the
// order in which elements are drawn.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "tandem/core/rng.h"

namespace tandem {
namespace {

// Known-answer vectors of Philox4x32-10 from the Random123 distribution (kat_vectors).
TEST(Rng, PhiloxKnownAnswers) {
  auto zero = philox4x32(0, {0, 0, 0, 0});
  EXPECT_EQ(zero, (std::array<uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  auto ones = philox4x32(0xffffffffffffffffull, {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu});
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

TEST(Rng, SeedsAndStreamsDiffer) {
  EXPECT_NE(random_bits(1, 0), random_bits(2, 0));
  EXPECT_NE(random_bits(1, 0, 0), random_bits(1, 0, 1));
}

}  // namespace
}  // namespace tandem
