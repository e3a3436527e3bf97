// tandem's exact element formulas, written once: the 16-bit conversions, every elementwise op,
// dropout's counter-based Philox, and the arithmetic of parts (which rank holds which rows). The
// host library includes this header (core/dtype.h, core/rng.h, dsl/elementwise.h, so the reference
// interpreter computes with it), and the build embeds its text into the code emitters
// (codegen/formulas_text.h), which paste it at the top of every emitted C++ and CUDA translation
// unit and print calls to these functions. A formula changed here changes everywhere, bit for bit.
//
// Rules for this file, because it is compiled as C++ by the host compiler, by the JIT, and as
// CUDA (host and device) by nvcc:
// - self-contained: standard headers only, nothing of tandem, no exceptions, no std::array;
// - every function is TANDEM_FX (inline, and __host__ __device__ under nvcc);
// - selects are written as bit blends, never branches, so loops over them vectorise on the CPU
//   and do not diverge on the GPU;
// - exact arithmetic only where exactness is promised: + - * / sqrt are correctly rounded on
//   both sides (the CPU builds use -ffp-contract=off, the CUDA build -fmad=false); exp, log,
//   tanh and pow come from each side's math library, so a GPU result of those may differ from
//   the CPU's in the last bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TANDEM_FX __host__ __device__ inline
#else
#define TANDEM_FX inline
#endif

#if defined(__AVX2__) && !defined(__CUDACC__)
#include <immintrin.h>
#endif

namespace tandem::fx {

// ------------------------------------------------------------------------------ bits, blends

TANDEM_FX uint32_t bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return x;
#endif
}
TANDEM_FX float from_bits(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(x);
#else
  float f;
  std::memcpy(&f, &x, 4);
  return f;
#endif
}
TANDEM_FX uint32_t mask(bool c) { return 0u - static_cast<uint32_t>(c); }
TANDEM_FX uint32_t usel(bool c, uint32_t a, uint32_t b) {
  const uint32_t m = mask(c);
  return (a & m) | (b & ~m);
}
TANDEM_FX float fsel(bool c, float a, float b) { return from_bits(usel(c, bits(a), bits(b))); }

// ------------------------------------------------- bf16 and f16: round to nearest even, NaN kept

// bfloat16 is the upper half of an f32; a NaN stays a (quiet) NaN with its payload's top bits.
TANDEM_FX float ld_bf16(uint16_t h) { return from_bits(static_cast<uint32_t>(h) << 16); }
TANDEM_FX uint16_t st_bf16(float f) {
  const uint32_t x = bits(f);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (x >> 16) | 0x0040u;
  return static_cast<uint16_t>(usel((x & 0x7fffffffu) > 0x7f800000u, quiet_nan, rounded));
}
// IEEE half: subnormals exact both ways, infinities and NaN payloads kept.
TANDEM_FX float ld_f16(uint16_t h) {
  const uint32_t o = static_cast<uint32_t>(h & 0x7fffu) << 13;
  const uint32_t e = o & 0x0f800000u;
  const uint32_t x = o + 0x38000000u + (0x38000000u & mask(e == 0x0f800000u));  // inf, NaN
  const float sub = from_bits(x + 0x00800000u) - from_bits(0x38800000u);        // subnormal
  return from_bits(usel(e == 0, bits(sub), x) | (static_cast<uint32_t>(h & 0x8000u) << 16));
}
TANDEM_FX uint16_t st_f16(float f) {
  const uint32_t x = bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  const uint32_t big = usel(ax > 0x7f800000u, 0x7e00u | ((ax >> 13) & 0x3ffu), 0x7c00u);
  // Below 2^-14 the result is subnormal: adding 0.5 lines the bits up and rounds to even.
  const uint32_t sub = bits(from_bits(ax) + 0.5f) - 0x3f000000u;
  const uint32_t normal = (ax - 0x38000000u + 0x0fffu + ((ax >> 13) & 1u)) >> 13;
  return static_cast<uint16_t>(sign |
                               usel(ax >= 0x47800000u, big, usel(ax < 0x38800000u, sub, normal)));
}
// Loads and stores by dtype name (emitters print ld_<dtype> / st_<dtype> / rt_<dtype>).
TANDEM_FX float ld_f32(float x) { return x; }
TANDEM_FX float st_f32(float x) { return x; }
// A value kept in a register is rounded to its stage's dtype, as if it had been stored.
TANDEM_FX float rt_f32(float x) { return x; }
TANDEM_FX float rt_bf16(float x) { return ld_bf16(st_bf16(x)); }
TANDEM_FX float rt_f16(float x) { return ld_f16(st_f16(x)); }

// ------------------------------------------------------------------------- elementwise ops
// Every op computes in f32; the rounding to the stage's dtype happens at the store (or rt_*).

TANDEM_FX float neg(float x) { return -x; }
TANDEM_FX float abs(float x) { return from_bits(bits(x) & 0x7fffffffu); }
TANDEM_FX float sqrt(float x) { return std::sqrt(x); }
TANDEM_FX float rsqrt(float x) { return 1.0f / std::sqrt(x); }
TANDEM_FX float exp(float x) { return std::exp(x); }
TANDEM_FX float log(float x) { return std::log(x); }
TANDEM_FX float tanh(float x) { return std::tanh(x); }
// GELU, tanh approximation (as in GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
TANDEM_FX float gelu(float x) {
  const float inner = 0.7978845608f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + std::tanh(inner));
}
TANDEM_FX float relu(float x) { return fsel(x > 0.0f, x, 0.0f); }
TANDEM_FX float cast(float x) { return x; }

TANDEM_FX float add(float a, float b) { return a + b; }
TANDEM_FX float sub(float a, float b) { return a - b; }
TANDEM_FX float mul(float a, float b) { return a * b; }
TANDEM_FX float div(float a, float b) { return a / b; }
TANDEM_FX float pow(float a, float b) { return std::pow(a, b); }
// IEEE fmax / fmin as glibc computes them: a NaN operand loses; ties (+0, -0) give the first.
TANDEM_FX float max(float a, float b) { return fsel(a >= b || b != b, a, b); }
TANDEM_FX float min(float a, float b) { return fsel(a <= b || b != b, a, b); }
// Comparisons give 1 or 0.
TANDEM_FX float cmp(bool c) { return from_bits(0x3f800000u & mask(c)); }
TANDEM_FX float lt(float a, float b) { return cmp(a < b); }
TANDEM_FX float le(float a, float b) { return cmp(a <= b); }
TANDEM_FX float gt(float a, float b) { return cmp(a > b); }
TANDEM_FX float ge(float a, float b) { return cmp(a >= b); }
TANDEM_FX float eq(float a, float b) { return cmp(a == b); }
TANDEM_FX float ne(float a, float b) { return cmp(a != b); }
TANDEM_FX float select(float c, float a, float b) { return fsel(c != 0.0f, a, b); }

// Reductions over one dim (and Prod, Max, Min over every dim) fold in f32, in element order,
// from the identity: Sum 0, Prod 1, Max -inf, Min +inf.
TANDEM_FX float sum(float acc, float x) { return acc + x; }
TANDEM_FX float prod(float acc, float x) { return acc * x; }

// ------------------------------------------------------------------------ index arithmetic

// The part of an extent n that index r of p holds (a Sliced dim, a collective's partition, a
// pipeline's row blocks): the first n % p parts hold one element more.
TANDEM_FX int64_t part_count(int64_t n, int64_t p, int64_t r) {
  return n / p + (r < n % p ? 1 : 0);
}
TANDEM_FX int64_t part_offset(int64_t n, int64_t p, int64_t r) {
  return r * (n / p) + (r < n % p ? r : n % p);
}
// The index, in a buffer holding rows [off, off + cnt) of one dim (span = that dim's extent
// times `inner`, the elements after it), of global flat index g.
TANDEM_FX int64_t part_index(int64_t g, int64_t span, int64_t inner, int64_t off, int64_t cnt) {
  const int64_t o = g / span;
  return o * cnt * inner + (g - o * span) - off * inner;
}

// ------------------------------------------------------------------- Philox4x32-10 and dropout
// Counter-based random numbers (Salmon et al., SC'11): the word for element i depends only on
// (key, stream, i), never on loop order, chunking or which rank (or GPU thread) computes it.
// Element i takes word (i & 3) of block (i >> 2) under counter {block, block >> 32, stream, 0}.

struct Philox {
  uint32_t c0, c1, c2, c3;
};
// One Philox4x32-10 block under a 64-bit key.
TANDEM_FX Philox philox4x32(uint64_t key, Philox c) {
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t{0xD2511F53u} * c.c0;
    const uint64_t p1 = uint64_t{0xCD9E8D57u} * c.c2;
    c = {static_cast<uint32_t>(p1 >> 32) ^ c.c1 ^ k0, static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c.c3 ^ k1, static_cast<uint32_t>(p0)};
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c;
}
TANDEM_FX Philox philox_block(uint64_t key, uint64_t block, uint32_t stream) {
  return philox4x32(key,
                    {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), stream, 0u});
}
// The 32 random bits of element `index` in stream `stream` under `key`.
TANDEM_FX uint32_t random_bits(uint64_t key, uint64_t index, uint32_t stream = 0) {
  const Philox r = philox_block(key, index >> 2, stream);
  const uint32_t j = static_cast<uint32_t>(index & 3);
  return usel(j == 0, r.c0, usel(j == 1, r.c1, usel(j == 2, r.c2, r.c3)));
}
// Uniform in [0, 1) with 24 bits of resolution (exactly representable in f32).
TANDEM_FX float uniform_of(uint32_t word) {
  return static_cast<float>(static_cast<int32_t>(word >> 8)) * 0x1p-24f;
}

// Dropout: element x is kept when its uniform is >= p, and then scaled by 1 / (1 - p) (`scale`,
// computed in double and rounded to f32 once, by dropout_scale). `word` is the element's
// random_bits(seed, global flat index), so every slicing and chunking draws the same mask.
TANDEM_FX float dropout_scale(double p) { return static_cast<float>(1.0 / (1.0 - p)); }
TANDEM_FX bool dropout_keep_word(uint32_t word, float p) { return uniform_of(word) >= p; }
TANDEM_FX float dropout_word(float x, uint32_t word, float p, float scale) {
  return from_bits(bits(x * scale) & mask(dropout_keep_word(word, p)));
}
TANDEM_FX float dropout(float x, uint64_t seed, uint64_t index, float p, float scale) {
  return dropout_word(x, random_bits(seed, index), p, scale);
}

#if !defined(__CUDACC__)
// Philox blocks block0 .. block0 + count - 1 (stream `stream`) into words, four per block:
// words[4 * b + w] is word w of block block0 + b. Whole groups of 8 blocks are written, so
// `words` must have room for count rounded up to 8 blocks. On AVX2 eight blocks run in the
// 32-bit lanes of one register (vpmuludq on the even and odd lanes, high and low halves blended
// back); elsewhere a loop over philox_block. For dropout masks and other long runs of
// consecutive indices: one block serves four elements.
inline void philox_blocks(uint32_t* __restrict words, uint64_t key, uint64_t block0, int64_t count,
                          uint32_t stream) {
#if defined(__AVX2__)
  const __m256i m0 = _mm256_set1_epi64x(0xD2511F53u), m1 = _mm256_set1_epi64x(0xCD9E8D57u);
  for (int64_t b = 0; b < count; b += 8) {
    alignas(32) uint32_t lo[8], hi[8];
    for (int j = 0; j < 8; ++j) {
      const uint64_t block = block0 + static_cast<uint64_t>(b + j);
      lo[j] = static_cast<uint32_t>(block);
      hi[j] = static_cast<uint32_t>(block >> 32);
    }
    __m256i c0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(lo));
    __m256i c1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(hi));
    __m256i c2 = _mm256_set1_epi32(static_cast<int>(stream)), c3 = _mm256_setzero_si256();
    uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
#pragma GCC unroll 10
    for (int round = 0; round < 10; ++round) {
      // 32 x 32 -> 64-bit products of the even lanes, then of the odd lanes shifted down.
      const __m256i e0 = _mm256_mul_epu32(c0, m0),
                    o0 = _mm256_mul_epu32(_mm256_srli_epi64(c0, 32), m0);
      const __m256i e1 = _mm256_mul_epu32(c2, m1),
                    o1 = _mm256_mul_epu32(_mm256_srli_epi64(c2, 32), m1);
      const __m256i hi0 = _mm256_blend_epi32(_mm256_srli_epi64(e0, 32), o0, 0xAA);
      const __m256i lo0 = _mm256_blend_epi32(e0, _mm256_slli_epi64(o0, 32), 0xAA);
      const __m256i hi1 = _mm256_blend_epi32(_mm256_srli_epi64(e1, 32), o1, 0xAA);
      const __m256i lo1 = _mm256_blend_epi32(e1, _mm256_slli_epi64(o1, 32), 0xAA);
      // philox4x32's round, lane-wise.
      c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32(static_cast<int>(k0)));
      c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32(static_cast<int>(k1)));
      c1 = lo1;
      c3 = lo0;
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    // Words by lane (c0..c3 of blocks b..b+7) to words by element (block-major).
    const __m256i t0 = _mm256_unpacklo_epi32(c0, c1), t1 = _mm256_unpackhi_epi32(c0, c1);
    const __m256i t2 = _mm256_unpacklo_epi32(c2, c3), t3 = _mm256_unpackhi_epi32(c2, c3);
    const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
    const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
    __m256i* o = reinterpret_cast<__m256i*>(words + 4 * b);
    _mm256_storeu_si256(o + 0, _mm256_permute2x128_si256(u0, u1, 0x20));
    _mm256_storeu_si256(o + 1, _mm256_permute2x128_si256(u2, u3, 0x20));
    _mm256_storeu_si256(o + 2, _mm256_permute2x128_si256(u0, u1, 0x31));
    _mm256_storeu_si256(o + 3, _mm256_permute2x128_si256(u2, u3, 0x31));
  }
#else
  for (int64_t b = 0; b < count; ++b) {
    const Philox r = philox_block(key, block0 + static_cast<uint64_t>(b), stream);
    words[4 * b + 0] = r.c0;
    words[4 * b + 1] = r.c1;
    words[4 * b + 2] = r.c2;
    words[4 * b + 3] = r.c3;
  }
#endif
}
#endif

}  // namespace tandem::fx
