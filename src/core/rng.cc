// Normal variates from the counter-based generator (weight initialisation), and runs of random
// words drawn a tile of Philox blocks at a time (core/formulas.h's philox_blocks).
#include "tandem/core/rng.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace tandem {

float random_normal(uint64_t seed, uint64_t index, uint32_t stream) {
  // u1 in (0, 1] so that log is finite.
  const float u1 = 1.0f - random_uniform(seed, index, 2 * stream);
  const float u2 = random_uniform(seed, index, 2 * stream + 1);
  return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853071795864f * u2);
}

namespace {
// Blocks per tile: a multiple of 8 (one AVX2 register of counters in fx::philox_blocks).
constexpr int kTileBlocks = 64;
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
    fx::philox_blocks(words, seed, index >> 2, (skip + take + 3) / 4, stream);
    std::memcpy(out + done, words + skip, sizeof(uint32_t) * static_cast<size_t>(take));
    done += take;
  }
}

}  // namespace tandem
