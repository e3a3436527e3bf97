// Counter-based random numbers (Philox4x32-10, Salmon et al., SC'11): the value for element i
// depends only on (seed, stream, i), never on loop order, chunking or which rank computes it.
// This is what makes every schedule of a program, and a recomputed forward pass, draw the same
// dropout mask.
#pragma once

#include <array>
#include <cstdint>

#include "tandem/core/formulas.h"

namespace tandem {

// One Philox4x32-10 block: four 32-bit words for a 128-bit counter under a 64-bit key
// (core/formulas.h's, the text every emitted kernel uses).
inline std::array<uint32_t, 4> philox4x32(uint64_t key, std::array<uint32_t, 4> ctr) {
  const fx::Philox r = fx::philox4x32(key, {ctr[0], ctr[1], ctr[2], ctr[3]});
  return {r.c0, r.c1, r.c2, r.c3};
}

// The 32 random bits of element `index` in stream `stream` under `seed`. Four consecutive
// elements share one Philox block.
inline uint32_t random_bits(uint64_t seed, uint64_t index, uint32_t stream = 0) {
  return fx::random_bits(seed, index, stream);
}

// out[k] = random_bits(seed, first + k, stream) for k in [0, n), bitwise, drawing one Philox block
// per four consecutive elements (not one per element) and, on AVX2, eight blocks at a time in the
// lanes of one register. For dropout masks and other long runs of consecutive indices.
void random_bits_tile(uint32_t* out, uint64_t seed, uint64_t first, int64_t n, uint32_t stream = 0);

// Uniform in [0, 1) with 24 bits of resolution (exactly representable in f32).
inline float random_uniform(uint64_t seed, uint64_t index, uint32_t stream = 0) {
  return fx::uniform_of(random_bits(seed, index, stream));
}

// Standard normal by Box-Muller over two uniforms of the same element (streams 2s and 2s+1).
float random_normal(uint64_t seed, uint64_t index, uint32_t stream = 0);

// Dropout's keep decision for element `index`: kept with probability 1 - p.
inline bool dropout_keep(uint64_t seed, uint64_t index, float p) {
  return fx::dropout_keep_word(random_bits(seed, index), p);
}

}  // namespace tandem
