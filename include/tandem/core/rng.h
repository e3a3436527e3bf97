// Counter-based random numbers (Philox4x32-10, Salmon et al., SC'11): the value for element i
// depends only on (seed, stream, i), never on loop order, chunking or which rank computes it.
// This is what makes every schedule of a program, and a recomputed forward pass, draw the same
// dropout mask.
#pragma once

#include <array>
#include <cstdint>

namespace tandem {

// One Philox4x32-10 block: four 32-bit words for a 128-bit counter under a 64-bit key.
inline std::array<uint32_t, 4> philox4x32(uint64_t key, std::array<uint32_t, 4> ctr) {
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t{0xD2511F53u} * ctr[0];
    const uint64_t p1 = uint64_t{0xCD9E8D57u} * ctr[2];
    ctr = {static_cast<uint32_t>(p1 >> 32) ^ ctr[1] ^ k0, static_cast<uint32_t>(p1),
           static_cast<uint32_t>(p0 >> 32) ^ ctr[3] ^ k1, static_cast<uint32_t>(p0)};
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return ctr;
}

// The 32 random bits of element `index` in stream `stream` under `seed`. Four consecutive
// elements share one Philox block.
inline uint32_t random_bits(uint64_t seed, uint64_t index, uint32_t stream = 0) {
  const uint64_t block = index >> 2;
  const auto r = philox4x32(seed, {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                                   stream, 0u});
  return r[index & 3];
}

// out[k] = random_bits(seed, first + k, stream) for k in [0, n), bitwise, drawing one Philox block
// per four consecutive elements (not one per element) and, on AVX2, eight blocks at a time in the
// lanes of one register. For dropout masks and other long runs of consecutive indices.
void random_bits_tile(uint32_t* out, uint64_t seed, uint64_t first, int64_t n, uint32_t stream = 0);

// Uniform in [0, 1) with 24 bits of resolution (exactly representable in f32).
inline float random_uniform(uint64_t seed, uint64_t index, uint32_t stream = 0) {
  return static_cast<float>(random_bits(seed, index, stream) >> 8) * 0x1p-24f;
}

// Standard normal by Box-Muller over two uniforms of the same element (streams 2s and 2s+1).
float random_normal(uint64_t seed, uint64_t index, uint32_t stream = 0);

// Dropout's keep decision for element `index`: kept with probability 1 - p.
inline bool dropout_keep(uint64_t seed, uint64_t index, float p) {
  return random_uniform(seed, index) >= p;
}

}  // namespace tandem
