// Sampling the next token (nn::sample_token): at small temperatures the greedy choice, where
// weights computed as probabilities would all underflow; at ordinary ones the softmax of the
// logits over the temperature, by a chi-squared test of many draws (fixed seed: deterministic).
#include "tandem/nn/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "tandem/core/rng.h"

namespace tandem::nn {
namespace {

constexpr int kSamplingDraws = 20000;

// How often each token is drawn in kSamplingDraws draws (seed 7).
std::vector<int> sampling_counts(const std::vector<float>& logits, double temperature, int top_k) {
  std::vector<int> counts(logits.size());
  for (int i = 0; i < kSamplingDraws; ++i)
    ++counts[static_cast<size_t>(sample_token(logits.data(), static_cast<int>(logits.size()),
                                              temperature, top_k,
                                              random_uniform(7, static_cast<uint64_t>(i))))];
  return counts;
}

// The softmax of logits / temperature over the top_k largest (0: all), in double.
std::vector<double> softmax_at(const std::vector<float>& logits, double temperature, int top_k) {
  std::vector<float> sorted = logits;
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  const float cut = top_k > 0 ? sorted[static_cast<size_t>(top_k - 1)] : sorted.back();
  std::vector<double> p(logits.size());
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i)
    if (logits[i] >= cut) total += p[i] = std::exp((logits[i] - sorted[0]) / temperature);
  for (double& x : p) x /= total;
  return p;
}

// Pearson's chi-squared statistic of the counts against the distribution p; a token p gives no
// chance must never be drawn.
double chi_squared(const std::vector<int>& counts, const std::vector<double>& p) {
  double chi2 = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (p[i] == 0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " has no chance";
      continue;
    }
    const double expected = kSamplingDraws * p[i];
    chi2 += (counts[i] - expected) * (counts[i] - expected) / expected;
  }
  return chi2;
}

TEST(Sampling, SmallTemperaturesAreGreedy) {
  // Logits a model gives: the largest 0.1 above the next. As probabilities raised to 1 / 0.0005,
  // every weight underflowed to 0 and the draw fell through to the least likely token.
  std::vector<float> logits(64);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = 4.0f * random_uniform(3, i) - 2.0f;
  logits[17] = *std::max_element(logits.begin(), logits.end()) + 0.1f;
  const int V = static_cast<int>(logits.size());
  for (double t : {0.0, 1e-300, 1e-30, 1e-6, 0.0005, 0.001})
    for (double u : {0.0, 0.25, 0.5, 0.999999})
      EXPECT_EQ(sample_token(logits.data(), V, t, 0, u), 17) << "temperature " << t << " u " << u;
  EXPECT_EQ(sample_token(logits.data(), V, 0.0005, 5, 0.999999), 17);  // with top-k too
  // Very negative and very spread logits: no weight overflows or becomes NaN.
  const std::vector<float> spread = {-1e30f, -3e38f, 1e30f, 0.0f};
  for (double t : {1e-10, 1.0, 1e10}) EXPECT_EQ(sample_token(spread.data(), 4, t, 0, 0.9), 2);
}

TEST(Sampling, DrawsFollowTheSoftmaxAtTheTemperature) {
  const std::vector<float> logits = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f, -3.0f, 1.5f};
  // 6 degrees of freedom: a correct sampler exceeds 22.46 with probability 0.001.
  for (double t : {1.0, 0.7, 3.0})
    EXPECT_LT(chi_squared(sampling_counts(logits, t, 0), softmax_at(logits, t, 0)), 22.46)
        << "temperature " << t;
  // The top 3 (2 degrees of freedom: 13.82).
  EXPECT_LT(chi_squared(sampling_counts(logits, 1.0, 3), softmax_at(logits, 1.0, 3)), 13.82);
  // The test tells temperatures apart: draws at 1 are not the softmax at 0.5.
  EXPECT_GT(chi_squared(sampling_counts(logits, 1.0, 0), softmax_at(logits, 0.5, 0)), 22.46);
}

}  // namespace
}  // namespace tandem::nn
