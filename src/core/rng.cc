// Normal variates from the counter-based generator (weight initialisation), and runs of random
// words drawn a tile of Philox blocks at a time.
#include "tandem/core/rng.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace tandem {

float random_normal(uint64_t seed, uint64_t index, uint32_t stream) {
  // u1 in (0, 1] so that log is finite.
  const float u1 = 1.0f - random_uniform(seed, index, 2 * stream);
  const float u2 = random_uniform(seed, index, 2 * stream + 1);
  return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853071795864f * u2);
}

namespace {

// Blocks per tile: a multiple of 8 (one AVX2 register of counters).
constexpr int kTileBlocks = 64;

// words[4 * b + w] = philox4x32(seed, {block0 + b, (block0 + b) >> 32, stream, 0})[w] for b in
// [0, count), count <= kTileBlocks; whole groups of 8 blocks are written (words has room).
void philox_tile(uint32_t* __restrict words, uint64_t seed, uint64_t block0, int count,
                 uint32_t stream) {
#if defined(__AVX2__)
  // Lane j of c0..c3 holds counter word 0..3 of block b + j. A 32 x 32 -> 64-bit product is
  // vpmuludq on the even lanes, and on the odd lanes shifted down; high and low halves are
  // blended back into 32-bit lanes.
  const __m256i m0 = _mm256_set1_epi64x(0xD2511F53u), m1 = _mm256_set1_epi64x(0xCD9E8D57u);
  for (int b = 0; b < count; b += 8) {
    alignas(32) uint32_t lo[8], hi[8];
    for (int j = 0; j < 8; ++j) {
      const uint64_t block = block0 + static_cast<uint64_t>(b + j);
      lo[j] = static_cast<uint32_t>(block);
      hi[j] = static_cast<uint32_t>(block >> 32);
    }
    __m256i c0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(lo));
    __m256i c1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(hi));
    __m256i c2 = _mm256_set1_epi32(static_cast<int>(stream)), c3 = _mm256_setzero_si256();
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    for (int round = 0; round < 10; ++round) {
      const __m256i p0_even = _mm256_mul_epu32(c0, m0);
      const __m256i p0_odd = _mm256_mul_epu32(_mm256_srli_epi64(c0, 32), m0);
      const __m256i p1_even = _mm256_mul_epu32(c2, m1);
      const __m256i p1_odd = _mm256_mul_epu32(_mm256_srli_epi64(c2, 32), m1);
      const __m256i p0_hi = _mm256_blend_epi32(_mm256_srli_epi64(p0_even, 32), p0_odd, 0xAA);
      const __m256i p0_lo = _mm256_blend_epi32(p0_even, _mm256_slli_epi64(p0_odd, 32), 0xAA);
      const __m256i p1_hi = _mm256_blend_epi32(_mm256_srli_epi64(p1_even, 32), p1_odd, 0xAA);
      const __m256i p1_lo = _mm256_blend_epi32(p1_even, _mm256_slli_epi64(p1_odd, 32), 0xAA);
      // The round of core/rng.h's philox4x32, lane-wise.
      c0 = _mm256_xor_si256(_mm256_xor_si256(p1_hi, c1), _mm256_set1_epi32(static_cast<int>(k0)));
      c2 = _mm256_xor_si256(_mm256_xor_si256(p0_hi, c3), _mm256_set1_epi32(static_cast<int>(k1)));
      c1 = p1_lo;
      c3 = p0_lo;
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    // Transpose: from word w of blocks b..b+7 per register to the four words of each block in turn.
    const __m256i t0 = _mm256_unpacklo_epi32(c0, c1), t1 = _mm256_unpackhi_epi32(c0, c1);
    const __m256i t2 = _mm256_unpacklo_epi32(c2, c3), t3 = _mm256_unpackhi_epi32(c2, c3);
    const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
    const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
    __m256i* dst = reinterpret_cast<__m256i*>(words + 4 * b);
    _mm256_storeu_si256(dst + 0, _mm256_permute2x128_si256(u0, u1, 0x20));
    _mm256_storeu_si256(dst + 1, _mm256_permute2x128_si256(u2, u3, 0x20));
    _mm256_storeu_si256(dst + 2, _mm256_permute2x128_si256(u0, u1, 0x31));
    _mm256_storeu_si256(dst + 3, _mm256_permute2x128_si256(u2, u3, 0x31));
  }
#else
  for (int b = 0; b < count; ++b) {
    const uint64_t block = block0 + static_cast<uint64_t>(b);
    const auto r = philox4x32(seed, {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                                     stream, 0u});
    for (int w = 0; w < 4; ++w) words[4 * b + w] = r[w];
  }
#endif
}

}  // namespace

void random_bits_tile(uint32_t* out, uint64_t seed, uint64_t first, int64_t n, uint32_t stream) {
  alignas(32) uint32_t words[4 * kTileBlocks];
  int64_t done = 0;
  while (done < n) {
    const uint64_t index = first + static_cast<uint64_t>(done);
    const int skip = static_cast<int>(index & 3);  // words of the first block before ours
    int64_t take = std::min<int64_t>(n - done, 4 * kTileBlocks - skip);
    // Indices wrap modulo 2^64 (and blocks with them, modulo 2^62): end the tile at the wrap.
    const uint64_t to_wrap = uint64_t{0} - index;  // 0 when index is 0: no wrap ahead
    if (to_wrap != 0 && to_wrap < static_cast<uint64_t>(take)) take = static_cast<int64_t>(to_wrap);
    philox_tile(words, seed, index >> 2, static_cast<int>((skip + take + 3) / 4), stream);
    std::memcpy(out + done, words + skip, sizeof(uint32_t) * static_cast<size_t>(take));
    done += take;
  }
}

}  // namespace tandem
