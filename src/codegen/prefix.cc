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

// ---- reductions (dsl/elementwise.h: f32, element order, from the identity) ----
inline float tdm_sum(float acc, float x) { return acc + x; }
inline float tdm_prod(float acc, float x) { return acc * x; }

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
