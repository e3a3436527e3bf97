// The prefix every emitted C++ translation unit starts with: the host ABI, and the helpers that
// make the emitted loops round exactly as tandem does (core/dtype.h, dsl/elementwise.h) while
// staying vectorisable (selects are bit blends, never branches the vectoriser gives up on).
#include <string>

#include "tandem/codegen/abi.h"
#include "tandem/codegen/cpp.h"

namespace tandem::codegen {
namespace {

// The ABI macro stringifies to one line; break it after each ';', '{' and '}' for readers.
std::string reflow(const std::string& line) {
  std::string out;
  int depth = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (c == '}') --depth;
    if (c == ' ' && !out.empty() && out.back() == '\n') continue;
    if (!out.empty() && out.back() == '\n') out.append(static_cast<size_t>(2 * depth), ' ');
    out += c;
    if (c == '{') ++depth;
    // '}' is followed by a typedef's name; break after the ';' that ends it instead.
    if (c == ';' || c == '{') out += '\n';
  }
  return out;
}

constexpr const char* kHelpers = R"(
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

// ---- bits, blends (selects written as masks so that if-conversion never has to speculate) ----
inline uint32_t tdm_bits(float f) { uint32_t x; std::memcpy(&x, &f, 4); return x; }
inline float tdm_float(uint32_t x) { float f; std::memcpy(&f, &x, 4); return f; }
inline uint32_t tdm_mask(bool c) { return 0u - static_cast<uint32_t>(c); }
inline uint32_t tdm_usel(bool c, uint32_t a, uint32_t b) { const uint32_t m = tdm_mask(c); return (a & m) | (b & ~m); }
inline float tdm_fsel(bool c, float a, float b) { return tdm_float(tdm_usel(c, tdm_bits(a), tdm_bits(b))); }

// ---- bf16 and f16, exactly core/dtype.h's conversions (round to nearest even, NaN kept) ----
inline float tdm_ld_f32(float x) { return x; }
inline float tdm_st_f32(float x) { return x; }
inline float tdm_ld_bf16(uint16_t h) { return tdm_float(static_cast<uint32_t>(h) << 16); }
inline uint16_t tdm_st_bf16(float f) {
  const uint32_t x = tdm_bits(f);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (x >> 16) | 0x0040u;
  return static_cast<uint16_t>(tdm_usel((x & 0x7fffffffu) > 0x7f800000u, quiet_nan, rounded));
}
inline float tdm_ld_f16(uint16_t h) {
  const uint32_t o = static_cast<uint32_t>(h & 0x7fffu) << 13;
  const uint32_t e = o & 0x0f800000u;
  const uint32_t x = o + 0x38000000u + (0x38000000u & tdm_mask(e == 0x0f800000u));  // inf, NaN
  const float sub = tdm_float(x + 0x00800000u) - tdm_float(0x38800000u);             // subnormal
  return tdm_float(tdm_usel(e == 0, tdm_bits(sub), x) | (static_cast<uint32_t>(h & 0x8000u) << 16));
}
inline uint16_t tdm_st_f16(float f) {
  const uint32_t x = tdm_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  const uint32_t big = tdm_usel(ax > 0x7f800000u, 0x7e00u | ((ax >> 13) & 0x3ffu), 0x7c00u);
  // Below 2^-14 the result is subnormal: adding 0.5 lines the bits up and rounds to even.
  const uint32_t sub = tdm_bits(tdm_float(ax) + 0.5f) - 0x3f000000u;
  const uint32_t normal = (ax - 0x38000000u + 0x0fffu + ((ax >> 13) & 1u)) >> 13;
  return static_cast<uint16_t>(sign | tdm_usel(ax >= 0x47800000u, big, tdm_usel(ax < 0x38800000u, sub, normal)));
}
// A value kept in a register is rounded to its stage's dtype, as if it had been stored.
inline float tdm_rt_f32(float x) { return x; }
inline float tdm_rt_bf16(float x) { return tdm_ld_bf16(tdm_st_bf16(x)); }
inline float tdm_rt_f16(float x) { return tdm_ld_f16(tdm_st_f16(x)); }

// ---- the elementwise formulas of dsl/elementwise.h ----
inline float tdm_cmp(bool c) { return tdm_float(0x3f800000u & tdm_mask(c)); }
// glibc's fmaxf/fminf: a NaN operand loses, ties (+0, -0) give the first operand.
inline float tdm_fmax(float a, float b) { return tdm_fsel(a >= b || b != b, a, b); }
inline float tdm_fmin(float a, float b) { return tdm_fsel(a <= b || b != b, a, b); }
inline float tdm_relu(float x) { return tdm_fsel(x > 0.0f, x, 0.0f); }
inline float tdm_gelu(float x) {
  const float inner = 0.7978845608f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + std::tanh(inner));
}
inline float tdm_select(float c, float a, float b) { return tdm_fsel(c != 0.0f, a, b); }

// core/rng.h's Philox4x32-10, word (index & 3) of block (index >> 2), stream 0.
inline uint32_t tdm_random_bits(uint64_t key, uint64_t index) {
  const uint64_t block = index >> 2;
  uint32_t c0 = static_cast<uint32_t>(block), c1 = static_cast<uint32_t>(block >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
#pragma GCC unroll 10
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t{0xD2511F53u} * c0;
    const uint64_t p1 = uint64_t{0xCD9E8D57u} * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0, n1 = static_cast<uint32_t>(p1);
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1, n3 = static_cast<uint32_t>(p0);
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  const uint32_t j = static_cast<uint32_t>(index & 3);
  return tdm_usel(j == 0, c0, tdm_usel(j == 1, c1, tdm_usel(j == 2, c2, c3)));
}
// Kept (uniform >= p) elements are scaled by 1 / (1 - p), computed in double by the emitter.
inline float tdm_dropout(float x, uint64_t seed, uint64_t index, float p, float scale) {
  const float u = static_cast<float>(tdm_random_bits(seed, index) >> 8) * 0x1p-24f;
  return tdm_float(tdm_bits(x * scale) & tdm_mask(u >= p));
}
// The same random words a tile at a time, as core/rng.h's random_bits draws them: one Philox block
// serves four consecutive elements. tdm_random_words(w, key, first, n), n <= 256, fills w and
// returns r with r[k] = random_bits(key, first + k) for k < n. On AVX2 eight blocks run in the
// 32-bit lanes of one register (vpmuludq on the even and odd lanes, hi/lo words blended back);
// elsewhere a loop over blocks that the compiler vectorises as it can.
struct tdm_words { alignas(32) uint32_t w[288]; };  // 256 + 3 words, rounded up to 8 blocks
inline const uint32_t* tdm_random_words(tdm_words* __restrict buf, uint64_t key, uint64_t first, int64_t n) {
  uint32_t* __restrict out = buf->w;
  const uint64_t b0 = first >> 2;
  const int64_t nb = static_cast<int64_t>(((first & 3) + static_cast<uint64_t>(n) + 3) >> 2);
#if defined(__AVX2__)
  const __m256i m0 = _mm256_set1_epi64x(0xD2511F53u), m1 = _mm256_set1_epi64x(0xCD9E8D57u);
  for (int64_t b = 0; b < nb; b += 8) {
    alignas(32) uint32_t lo[8], hi[8];
    for (int j = 0; j < 8; ++j) {
      const uint64_t block = b0 + static_cast<uint64_t>(b + j);
      lo[j] = static_cast<uint32_t>(block);
      hi[j] = static_cast<uint32_t>(block >> 32);
    }
    __m256i c0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(lo));
    __m256i c1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(hi));
    __m256i c2 = _mm256_setzero_si256(), c3 = _mm256_setzero_si256();
    uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
#pragma GCC unroll 10
    for (int round = 0; round < 10; ++round) {
      // 32 x 32 -> 64-bit products of the even lanes, then of the odd lanes shifted down.
      const __m256i e0 = _mm256_mul_epu32(c0, m0), o0 = _mm256_mul_epu32(_mm256_srli_epi64(c0, 32), m0);
      const __m256i e1 = _mm256_mul_epu32(c2, m1), o1 = _mm256_mul_epu32(_mm256_srli_epi64(c2, 32), m1);
      const __m256i hi0 = _mm256_blend_epi32(_mm256_srli_epi64(e0, 32), o0, 0xAA);
      const __m256i lo0 = _mm256_blend_epi32(e0, _mm256_slli_epi64(o0, 32), 0xAA);
      const __m256i hi1 = _mm256_blend_epi32(_mm256_srli_epi64(e1, 32), o1, 0xAA);
      const __m256i lo1 = _mm256_blend_epi32(e1, _mm256_slli_epi64(o1, 32), 0xAA);
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
    __m256i* o = reinterpret_cast<__m256i*>(out + 4 * b);
    _mm256_store_si256(o + 0, _mm256_permute2x128_si256(u0, u1, 0x20));
    _mm256_store_si256(o + 1, _mm256_permute2x128_si256(u2, u3, 0x20));
    _mm256_store_si256(o + 2, _mm256_permute2x128_si256(u0, u1, 0x31));
    _mm256_store_si256(o + 3, _mm256_permute2x128_si256(u2, u3, 0x31));
  }
#else
  const uint32_t key0 = static_cast<uint32_t>(key), key1 = static_cast<uint32_t>(key >> 32);
  for (int64_t b = 0; b < nb; ++b) {
    const uint64_t block = b0 + static_cast<uint64_t>(b);
    uint32_t c0 = static_cast<uint32_t>(block), c1 = static_cast<uint32_t>(block >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = key0, k1 = key1;
#pragma GCC unroll 10
    for (int round = 0; round < 10; ++round) {
      const uint64_t p0 = uint64_t{0xD2511F53u} * c0;
      const uint64_t p1 = uint64_t{0xCD9E8D57u} * c2;
      const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0, n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
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
#endif
  return out + (first & 3);
}
// tdm_dropout with element's random word given.
inline float tdm_dropout_word(float x, uint32_t word, float p, float scale) {
  const float u = static_cast<float>(static_cast<int32_t>(word >> 8)) * 0x1p-24f;
  return tdm_float(tdm_bits(x * scale) & tdm_mask(u >= p));
}

// ---- reductions (dsl/elementwise.h: f32, element order, from the identity) ----
inline float tdm_sum(float acc, float x) { return acc + x; }
inline float tdm_prod(float acc, float x) { return acc * x; }
// Whole-tensor sums (dsl/elementwise.h's SumLanes): x[k], of global flat index g0 + k, is added
// in double to lane (g0 + k) % 8 (sumsq: its exact square), each lane in element order. Peeled
// to a multiple of 8 of the global index, the middle is groups of 8 whose lanes are independent
// accumulators: the group loop vectorises (2 x 4 doubles on AVX2) without reassociating any
// lane's additions.
inline void tdm_fold_sum8(double* __restrict lanes, const float* __restrict x, int64_t n, int64_t g0) {
  int64_t k = 0;
  for (; k < n && ((g0 + k) & 7) != 0; ++k) lanes[(g0 + k) & 7] += static_cast<double>(x[k]);
  double l[8];
  for (int j = 0; j < 8; ++j) l[j] = lanes[j];
  const int64_t groups = (n - k) / 8;
  const float* p = x + k;
  for (int64_t q = 0; q < groups; ++q, p += 8) {
    double d[8];
    for (int j = 0; j < 8; ++j) d[j] = static_cast<double>(p[j]);
    for (int j = 0; j < 8; ++j) l[j] += d[j];
  }
  k += groups * 8;
  for (int j = 0; j < 8; ++j) lanes[j] = l[j];
  for (; k < n; ++k) lanes[(g0 + k) & 7] += static_cast<double>(x[k]);
}
inline void tdm_fold_sumsq8(double* __restrict lanes, const float* __restrict x, int64_t n, int64_t g0) {
  int64_t k = 0;
  for (; k < n && ((g0 + k) & 7) != 0; ++k) {
    const double d = x[k];
    lanes[(g0 + k) & 7] += d * d;
  }
  double l[8];
  for (int j = 0; j < 8; ++j) l[j] = lanes[j];
  const int64_t groups = (n - k) / 8;
  const float* p = x + k;
  for (int64_t q = 0; q < groups; ++q, p += 8) {
    double d[8];
    for (int j = 0; j < 8; ++j) d[j] = static_cast<double>(p[j]);
    for (int j = 0; j < 8; ++j) l[j] += d[j] * d[j];
  }
  k += groups * 8;
  for (int j = 0; j < 8; ++j) lanes[j] = l[j];
  for (; k < n; ++k) {
    const double d = x[k];
    lanes[(g0 + k) & 7] += d * d;
  }
}
// The lanes added in order 0..7, rounded to f32 once.
inline float tdm_sum_lanes(const double* lanes) {
  double s = 0.0;
  for (int j = 0; j < 8; ++j) s += lanes[j];
  return static_cast<float>(s);
}

// ---- index arithmetic ----
inline int64_t tdm_min(int64_t a, int64_t b) { return a < b ? a : b; }
// ir.h's split of n over p: the first n % p parts hold one more.
inline int64_t tdm_part_cnt(int64_t n, int64_t p, int64_t r) { return n / p + (r < n % p ? 1 : 0); }
inline int64_t tdm_part_off(int64_t n, int64_t p, int64_t r) { return r * (n / p) + (r < n % p ? r : n % p); }
// The index, in a buffer holding rows [off, off + cnt) of one dim (span = that dim's extent
// times `inner`, the elements after it), of global flat index g.
inline int64_t tdm_part_index(int64_t g, int64_t span, int64_t inner, int64_t off, int64_t cnt) {
  const int64_t o = g / span;
  return o * cnt * inner + (g - o * span) - off * inner;
}

}  // namespace
)";

}  // namespace

const std::string& cpp_prefix() {
  static const std::string text = std::string(
                                      "// Emitted by tandem codegen/cpp. Prefix: the host ABI and "
                                      "tandem's exact element formulas.\n"
                                      "#include <cmath>\n#include <cstdint>\n#include <cstring>\n\n"
                                      "extern \"C\" {\n") +
                                  reflow(TANDEM_KERNEL_ABI_TEXT) + "}\n" + kHelpers;
  return text;
}

}  // namespace tandem::codegen
