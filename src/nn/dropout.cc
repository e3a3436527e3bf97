// Dropout whose mask is drawn from the counter-based RNG by global element index, never stored.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "tandem/core/rng.h"
#include "tandem/nn/layers.h"

namespace tandem::nn {
namespace {

// Philox4x32-10 blocks first .. first + count - 1 in stream 0 under `key`: bitwise the words
// core's random_bits returns, written as straight-line code over scalars so that GCC vectorises
// across blocks (8 Philox blocks per AVX2 instruction instead of one).
void philox_blocks(uint32_t* __restrict out, uint64_t key, uint64_t first, int count) {
  for (int b = 0; b < count; ++b) {
    const uint64_t block = first + static_cast<uint64_t>(b);
    uint32_t c0 = static_cast<uint32_t>(block), c1 = static_cast<uint32_t>(block >> 32);
    uint32_t c2 = 0, c3 = 0;
    uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
    for (int round = 0; round < 10; ++round) {
      const uint64_t p0 = uint64_t{0xD2511F53u} * c0;
      const uint64_t p1 = uint64_t{0xCD9E8D57u} * c2;
      const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
      const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
      c1 = static_cast<uint32_t>(p1);
      c3 = static_cast<uint32_t>(p0);
      c0 = n0;
      c2 = n2;
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    out[4 * b + 0] = c0;
    out[4 * b + 1] = c1;
    out[4 * b + 2] = c2;
    out[4 * b + 3] = c3;
  }
}

// dropout_keep(u >= p) with u = (bits >> 8) * 2^-24 holds exactly when (bits >> 8) >=
// ceil(p * 2^24): both sides are exact in double. An integer compare vectorises where a float
// compare-and-select does not (trapping math).
uint32_t keep_threshold(float p) {
  return static_cast<uint32_t>(std::ceil(static_cast<double>(p) * 16777216.0));
}

constexpr int kChunkBlocks = 64;  // Philox blocks per chunk: 256 elements, 1 KiB on the stack

}  // namespace

void dropout_mask(float* mask, int64_t n, const Dropout& d) {
  const uint32_t threshold = keep_threshold(d.p);
  const uint32_t scale_bits = std::bit_cast<uint32_t>(d.scale());
  uint32_t bits[4 * kChunkBlocks];
  int64_t i = 0;
  while (i < n) {
    const uint64_t index = static_cast<uint64_t>(d.index_offset + i);
    const int skip = static_cast<int>(index & 3);  // elements of the first block before ours
    const int64_t take = std::min<int64_t>(n - i, 4 * kChunkBlocks - skip);
    philox_blocks(bits, d.key, index >> 2, static_cast<int>((skip + take + 3) / 4));
    const uint32_t* __restrict src = bits + skip;
    float* __restrict dst = mask + i;
    for (int64_t k = 0; k < take; ++k) {
      const uint32_t keep = (src[k] >> 8) >= threshold ? scale_bits : 0u;
      dst[k] = std::bit_cast<float>(keep);
    }
    i += take;
  }
}

// (n) -> (n); out may equal inp.
void dropout_forward(float* out, const float* inp, int64_t n, const Dropout& d) {
  if (!d.active()) {
    if (out != inp) std::copy(inp, inp + n, out);
    return;
  }
  constexpr int64_t kChunk = 4 * kChunkBlocks;
  float mask[kChunk];
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t m = std::min(kChunk, n - i);
    Dropout part = d;
    part.index_offset = d.index_offset + i;
    dropout_mask(mask, m, part);
    for (int64_t k = 0; k < m; ++k) out[i + k] = inp[i + k] * mask[k];
  }
}

// dinp (n) += dout (n) * mask.
void dropout_backward(float* dinp, const float* dout, int64_t n, const Dropout& d) {
  float* __restrict di = dinp;
  const float* __restrict g = dout;
  if (!d.active()) {
    for (int64_t i = 0; i < n; ++i) di[i] += g[i];
    return;
  }
  constexpr int64_t kChunk = 4 * kChunkBlocks;
  float mask[kChunk];
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t m = std::min(kChunk, n - i);
    Dropout part = d;
    part.index_offset = d.index_offset + i;
    dropout_mask(mask, m, part);
    for (int64_t k = 0; k < m; ++k) di[i + k] += g[i + k] * mask[k];
  }
}

}  // namespace tandem::nn
