// Internal helpers that let nn's hot loops vectorise under the project's flags (no -ffast-math,
// trapping math on): a branch-free exp and tanh, and reductions split over fixed lanes.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

namespace tandem::nn::detail {

// Lanes of a split reduction: 16 floats are two AVX2 registers (one AVX-512 register), enough
// independent chains to hide the add latency. The summation order is fixed, so the result is
// bitwise reproducible whatever the CPU.
inline constexpr int kLanes = 16;

// sum(x[0..n)) with kLanes partial sums. GCC will not reassociate a plain float reduction
// without -ffast-math; spelling the lanes out lets it use vector adds.
inline float lane_sum(const float* x, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) acc[k] += x[i + k];
  float s = 0.0f;
  for (int k = 0; k < kLanes; ++k) s += acc[k];
  for (; i < n; ++i) s += x[i];
  return s;
}

// sum(x[i] * y[i]) over [0, n), lanes as in lane_sum.
inline float lane_dot(const float* x, const float* y, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) acc[k] += x[i + k] * y[i + k];
  float s = 0.0f;
  for (int k = 0; k < kLanes; ++k) s += acc[k];
  for (; i < n; ++i) s += x[i] * y[i];
  return s;
}

// A float's bits as a signed integer that orders like the float (negative values have their
// magnitude bits flipped); the map is its own inverse. Integer max vectorises where a float
// compare-and-select does not (trapping math), and a positive NaN still wins.
inline int32_t ordered_bits(float x) {
  const int32_t b = std::bit_cast<int32_t>(x);
  return b ^ ((b >> 31) & 0x7fffffff);
}
inline float from_ordered_bits(int32_t o) {
  return std::bit_cast<float>(o ^ ((o >> 31) & 0x7fffffff));
}

// max(x[0..n)), n >= 1.
inline float lane_max(const float* x, int64_t n) {
  int32_t acc[kLanes];
  for (int k = 0; k < kLanes; ++k) acc[k] = ordered_bits(x[0]);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) acc[k] = std::max(acc[k], ordered_bits(x[i + k]));
  int32_t m = acc[0];
  for (int k = 1; k < kLanes; ++k) m = std::max(m, acc[k]);
  for (; i < n; ++i) m = std::max(m, ordered_bits(x[i]));
  return from_ordered_bits(m);
}

// exp(x) within 2 ulp on [-87, 88], saturating outside (exp(-inf) gives 1.6e-38, not 0), NaN
// kept. Cephes' expf polynomial with Cody-Waite range reduction. Branch-free and with no float
// compare or float-to-int conversion: with trapping math on, GCC refuses to if-convert either,
// so the clamp is done on the bits (sign and magnitude) and 2^n is read off the rounding
// constant's mantissa.
inline float exp_approx(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t sign = bits & 0x80000000u, mag = bits & 0x7fffffffu;
  const uint32_t limit = sign != 0 ? 0x42AE0000u /* 87 */ : 0x42B00000u /* 88 */;
  const uint32_t nan = mag > 0x7f800000u ? mag : 0u;
  x = std::bit_cast<float>(sign | std::min(mag, limit) | nan);
  // n = round(x / ln 2), held in the low mantissa bits of `shifted` (1.5 * 2^23 + n).
  const float shifted = x * 1.44269504f + 12582912.0f;
  const float n = shifted - 12582912.0f;
  float r = x - n * 0.693359375f;  // ln 2 split in two so that n * hi is exact
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const uint32_t two_n = (std::bit_cast<uint32_t>(shifted) - 0x4B400000u + 127u) << 23;
  return p * std::bit_cast<float>(two_n);
}

// tanh(u) = 1 - 2 / (exp(2u) + 1): absolute error below 2e-7, saturating to +-1.
inline float tanh_approx(float u) { return 1.0f - 2.0f / (exp_approx(2.0f * u) + 1.0f); }

}  // namespace tandem::nn::detail
