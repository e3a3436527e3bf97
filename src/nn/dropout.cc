// Dropout whose mask is drawn from the counter-based RNG by global element index, never stored.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "columns.h"
#include "tandem/core/rng.h"
#include "tandem/nn/layers.h"

namespace tandem::nn {
namespace {

// dropout_keep(u >= p) with u = (bits >> 8) * 2^-24 holds exactly when (bits >> 8) >=
// ceil(p * 2^24): both sides are exact in double. An integer compare vectorises where a float
// compare-and-select does not (trapping math).
uint32_t keep_threshold(float p) {
  return static_cast<uint32_t>(std::ceil(static_cast<double>(p) * 16777216.0));
}

// Elements per chunk: 1 KiB of random words (and of mask) on the stack.
constexpr int64_t kChunk = 256;

// mask (n) for global elements first .. first + n - 1, n <= kChunk.
void mask_chunk(float* __restrict mask, int64_t n, uint64_t key, uint64_t first, uint32_t threshold,
                uint32_t scale_bits) {
  uint32_t bits[kChunk];
  random_bits_tile(bits, key, first, n);
  for (int64_t k = 0; k < n; ++k) {
    const uint32_t keep = (bits[k] >> 8) >= threshold ? scale_bits : 0u;
    mask[k] = std::bit_cast<float>(keep);
  }
}

// Runs body(begin, end, mask) over [0, n) in chunks of at most kChunk elements, in parallel
// (core/parallel.h), mask holding the chunk's scale-or-zero factors. Each element's mask depends
// only on its global index, so the split changes no bit.
template <class Body>
void for_mask_chunks(int64_t n, const Dropout& d, const Body& body) {
  const uint32_t threshold = keep_threshold(d.p);
  const uint32_t scale_bits = std::bit_cast<uint32_t>(d.scale());
  parallel_for(n, detail::kParallelGrain, [&](int64_t b, int64_t e) {
    float mask[kChunk];
    for (int64_t i = b; i < e; i += kChunk) {
      const int64_t m = std::min(kChunk, e - i);
      mask_chunk(mask, m, d.key, static_cast<uint64_t>(d.index_offset + i), threshold, scale_bits);
      body(i, m, mask);
    }
  });
}

}  // namespace

void dropout_mask(float* mask, int64_t n, const Dropout& d) {
  for_mask_chunks(n, d, [&](int64_t i, int64_t m, const float* chunk) {
    std::copy(chunk, chunk + m, mask + i);
  });
}

// (n) -> (n); out may equal inp.
void dropout_forward(float* out, const float* inp, int64_t n, const Dropout& d) {
  if (!d.active()) {
    if (out != inp) std::copy(inp, inp + n, out);
    return;
  }
  for_mask_chunks(n, d, [&](int64_t i, int64_t m, const float* mask) {
    for (int64_t k = 0; k < m; ++k) out[i + k] = inp[i + k] * mask[k];
  });
}

// dinp (n) += dout (n) * mask.
void dropout_backward(float* dinp, const float* dout, int64_t n, const Dropout& d) {
  if (!d.active()) {
    parallel_for(n, detail::kParallelGrain, [&](int64_t b, int64_t e) {
      float* __restrict di = dinp;
      const float* __restrict g = dout;
      for (int64_t i = b; i < e; ++i) di[i] += g[i];
    });
    return;
  }
  for_mask_chunks(n, d, [&](int64_t i, int64_t m, const float* __restrict mask) {
    float* __restrict di = dinp + i;
    const float* __restrict g = dout + i;
    for (int64_t k = 0; k < m; ++k) di[k] += g[k] * mask[k];
  });
}

}  // namespace tandem::nn
