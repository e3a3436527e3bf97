// Rotary position embeddings (Hugging Face's rotate_half layout): the inverse frequencies with
// optional Llama 3.1 scaling, their cos/sin tables, and the in-place rotation and its inverse.
#include <algorithm>
#include <cmath>
#include <numbers>

#include "columns.h"
#include "tandem/core/error.h"
#include "tandem/core/parallel.h"
#include "tandem/nn/layers.h"

namespace tandem::nn {
namespace {

// Checks the Llama3 fields as Hugging Face's config validation does (factor >= 1,
// high_freq_factor > low_freq_factor), plus what keeps the formula finite.
void check_llama3(const RopeScaling& s) {
  if (!(s.factor >= 1.0))
    user_error("RoPE llama3 scaling: factor is {}; it must be >= 1", s.factor);
  if (!(s.low_freq_factor > 0.0))
    user_error("RoPE llama3 scaling: low_freq_factor is {}; it must be > 0", s.low_freq_factor);
  if (!(s.high_freq_factor > s.low_freq_factor))
    user_error(
        "RoPE llama3 scaling: high_freq_factor ({}) must be greater than low_freq_factor ({})",
        s.high_freq_factor, s.low_freq_factor);
  if (s.original_max_position_embeddings < 1)
    user_error("RoPE llama3 scaling: original_max_position_embeddings is {}; it must be >= 1",
               s.original_max_position_embeddings);
}

// Llama 3.1's rescaling of one inverse frequency f: long wavelengths (beyond the original context
// over low_freq_factor) slowed by `factor`, short ones (under it over high_freq_factor) kept, and
// a linear blend in 1 / wavelen between the two.
double llama3_scaled(double f, const RopeScaling& s) {
  const double orig = static_cast<double>(s.original_max_position_embeddings);
  const double wavelen = 2.0 * std::numbers::pi / f;
  const double low_freq_wavelen = orig / s.low_freq_factor;
  const double high_freq_wavelen = orig / s.high_freq_factor;
  if (wavelen > low_freq_wavelen) return f / s.factor;
  if (wavelen < high_freq_wavelen) return f;
  const double smooth =
      (orig / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return (1.0 - smooth) * f / s.factor + smooth * f;
}

// Checks a kernel call against its table: a mismatch is the caller's bug, not the user's.
void check_call(const RopeTable& rope, int B, int T, int NH, int HS, int64_t stride, int pos0) {
  TANDEM_CHECK(HS == rope.head_size && HS >= 2 && HS % 2 == 0, "RoPE on heads of {}, table for {}",
               HS, rope.head_size);
  TANDEM_CHECK(B >= 0 && T >= 0 && NH >= 0 && stride >= static_cast<int64_t>(NH) * HS,
               "RoPE on B {} T {} NH {} HS {} with row stride {}", B, T, NH, HS, stride);
  TANDEM_CHECK(pos0 >= 0 && static_cast<int64_t>(pos0) + T <= rope.positions,
               "RoPE positions {}..{} past a table of {}", pos0, static_cast<int64_t>(pos0) + T,
               rope.positions);
}

// One head: (a[i], b[i]) := (a c - b s, b c + a s), i < half; a and b are the head's two halves.
void rotate(float* __restrict a, float* __restrict b, const float* __restrict c,
            const float* __restrict s, int half) {
  for (int i = 0; i < half; ++i) {
    const float x1 = a[i], x2 = b[i];
    a[i] = x1 * c[i] - x2 * s[i];
    b[i] = x2 * c[i] + x1 * s[i];
  }
}

// The inverse (transpose) rotation: (a, b) := (a c + b s, b c - a s).
void unrotate(float* __restrict a, float* __restrict b, const float* __restrict c,
              const float* __restrict s, int half) {
  for (int i = 0; i < half; ++i) {
    const float x1 = a[i], x2 = b[i];
    a[i] = x1 * c[i] + x2 * s[i];
    b[i] = x2 * c[i] - x1 * s[i];
  }
}

// Rotates every head of every row (by the inverse rotation when kInverse), rows split over
// threads (each head is written by one thread only, so the bits do not depend on the split).
template <bool kInverse>
void for_heads(float* x, const RopeTable& rope, int B, int T, int NH, int HS, int64_t stride,
               int pos0) {
  check_call(rope, B, T, NH, HS, stride, pos0);
  const int half = HS / 2;
  const int64_t rows = static_cast<int64_t>(B) * T;
  const int64_t grain =
      std::max<int64_t>(1, detail::kParallelGrain / std::max<int64_t>(1, int64_t{NH} * HS));
  parallel_for(rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t p = pos0 + r % T;
      const float* c = rope.cos.data() + p * half;
      const float* s = rope.sin.data() + p * half;
      float* row = x + r * stride;
      for (int h = 0; h < NH; ++h) {
        float* head = row + static_cast<int64_t>(h) * HS;
        if constexpr (kInverse)
          unrotate(head, head + half, c, s, half);
        else
          rotate(head, head + half, c, s, half);
      }
    }
  });
}

}  // namespace

std::vector<float> rope_inv_freq(int HS, double theta, const RopeScaling& scaling) {
  if (HS < 2 || HS % 2 != 0)
    user_error("RoPE: head size is {}; it must be even and at least 2", HS);
  if (!(theta > 0.0) || !std::isfinite(theta))
    user_error("RoPE: theta is {}; it must be a positive number", theta);
  if (scaling.type == RopeType::Llama3) check_llama3(scaling);
  std::vector<float> inv_freq(static_cast<size_t>(HS / 2));
  for (int i = 0; i < HS / 2; ++i) {
    // Rounded to f32 first, as the checkpoint's code holds it, then scaled from that value.
    const float f = static_cast<float>(std::pow(theta, -2.0 * i / HS));
    inv_freq[i] = scaling.type == RopeType::Llama3
                      ? static_cast<float>(llama3_scaled(static_cast<double>(f), scaling))
                      : f;
  }
  return inv_freq;
}

RopeTable rope_table(const std::vector<float>& inv_freq, int positions) {
  TANDEM_CHECK(!inv_freq.empty() && positions >= 0, "RoPE table of {} frequencies, {} positions",
               inv_freq.size(), positions);
  const int half = static_cast<int>(inv_freq.size());
  RopeTable t;
  t.head_size = 2 * half;
  t.positions = positions;
  t.cos.resize(static_cast<size_t>(positions) * half);
  t.sin.resize(static_cast<size_t>(positions) * half);
  for (int p = 0; p < positions; ++p)
    for (int i = 0; i < half; ++i) {
      // The angle as the f32 product the reference implementations form; its cos and sin
      // computed in double and rounded to f32.
      const float angle = static_cast<float>(p) * inv_freq[i];
      t.cos[static_cast<size_t>(p) * half + i] = static_cast<float>(std::cos(double{angle}));
      t.sin[static_cast<size_t>(p) * half + i] = static_cast<float>(std::sin(double{angle}));
    }
  return t;
}

void rope_forward(float* x, const RopeTable& rope, int B, int T, int NH, int HS, int64_t stride,
                  int pos0) {
  for_heads<false>(x, rope, B, T, NH, HS, stride, pos0);
}

void rope_backward(float* dx, const RopeTable& rope, int B, int T, int NH, int HS, int64_t stride,
                   int pos0) {
  for_heads<true>(dx, rope, B, T, NH, HS, stride, pos0);
}

}  // namespace tandem::nn
