// The bf16 buffer conversions: the native (AVX512_BF16) path is bitwise the portable one, which is
// bitwise core/formulas.h's, on every exponent (so ties, NaN, infinities and subnormals) and on
// every tail length; and the path choice follows TANDEM_BF16.
#include "tandem/core/bf16.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "support/bf16_emulate.h"
#include "tandem/core/env.h"
#include "tandem/core/formulas.h"
#include "tandem/core/gemm.h"

namespace tandem {
namespace {

// Every upper half (sign, exponent, top of the mantissa) with lower halves that round down, tie,
// round up and sit at the edges, plus random ones: 2^16 * 64 values.
std::vector<float> probe_values() {
  std::vector<uint32_t> lows = {0x0000, 0x0001, 0x3fff, 0x7ffe, 0x7fff, 0x8000,
                                0x8001, 0x8002, 0xbfff, 0xc000, 0xfffe, 0xffff};
  std::mt19937 rng(26);
  while (lows.size() < 64) lows.push_back(rng() & 0xffffu);
  std::vector<float> v;
  v.reserve((size_t{1} << 16) * lows.size());
  for (uint32_t hi = 0; hi < (1u << 16); ++hi)
    for (uint32_t lo : lows) v.push_back(fx::from_bits(hi << 16 | lo));
  return v;
}

// The first differing element, for a readable failure.
std::string first_difference(const std::vector<float>& src, const std::vector<bf16>& got,
                             const std::vector<bf16>& want) {
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i].bits != want[i].bits)
      return fmt::format("element {}: f32 bits {:08x} gave {:04x}, expected {:04x}", i,
                         fx::bits(src[i]), got[i].bits, want[i].bits);
  return "";
}

TEST(Bf16, PortablePathIsTheFormula) {
  const std::vector<float> src = probe_values();
  std::vector<bf16> got(src.size()), want(src.size());
  to_bf16(src.data(), got.data(), src.size(), Bf16Path::Portable);
  for (size_t i = 0; i < src.size(); ++i) want[i].bits = fx::st_bf16(src[i]);
  EXPECT_EQ(first_difference(src, got, want), "");
}

TEST(Bf16, NativePathIsBitwiseThePortableOne) {
  if (!cpu_has_avx512_bf16()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  const std::vector<float> src = probe_values();
  std::vector<bf16> native(src.size()), portable(src.size());
  to_bf16(src.data(), native.data(), src.size(), Bf16Path::Native);
  to_bf16(src.data(), portable.data(), src.size(), Bf16Path::Portable);
  EXPECT_EQ(first_difference(src, native, portable), "");
}

TEST(Bf16, NativePathHandlesEveryTailLength) {
  if (!cpu_has_avx512_bf16()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  // Subnormals (which the instruction flushes and the formula rounds) at every position.
  std::vector<float> src(40);
  for (size_t i = 0; i < src.size(); ++i)
    src[i] = fx::from_bits(i % 3 == 0 ? 0x00008001u + static_cast<uint32_t>(i) * 0x10000u
                                      : 0x3f808000u + static_cast<uint32_t>(i));
  for (size_t n = 0; n <= src.size(); ++n) {
    std::vector<bf16> native(src.size() + 1, bf16{0xabcd}), portable(src.size() + 1, bf16{0xabcd});
    to_bf16(src.data(), native.data(), n, Bf16Path::Native);
    to_bf16(src.data(), portable.data(), n, Bf16Path::Portable);
    for (size_t i = 0; i <= src.size(); ++i)
      ASSERT_EQ(native[i].bits, portable[i].bits) << "n=" << n << " i=" << i;
  }
}

TEST(Bf16, WideningIsExactForEveryValue) {
  std::vector<bf16> src(1 << 16);
  for (uint32_t i = 0; i < src.size(); ++i) src[i].bits = static_cast<uint16_t>(i);
  std::vector<float> wide(src.size());
  to_f32(src.data(), wide.data(), src.size());
  std::vector<bf16> back(src.size());
  to_bf16(wide.data(), back.data(), wide.size());
  for (uint32_t i = 0; i < src.size(); ++i) {
    ASSERT_EQ(fx::bits(wide[i]), i << 16) << "bf16 " << i;
    // Back again unchanged, except signalling NaNs, which come back quiet (payload kept).
    const bool signalling_nan = (i & 0x7fffu) > 0x7f80u && (i & 0x0040u) == 0;
    ASSERT_EQ(back[i].bits, signalling_nan ? (i | 0x0040u) : i) << "bf16 " << i;
  }
}

TEST(Bf16, PathFollowsTheEnvironment) {
  const bool emulate = env_str("TANDEM_BF16", "") == "emulate";
  EXPECT_EQ(bf16_native(), cpu_has_avx512_bf16() && !emulate);
  const std::string line = bf16_describe();
  EXPECT_NE(line.find(bf16_native() ? "native" : "emulated"), std::string::npos) << line;
  // Without native bf16, bf16 GEMMs are f32 ones on widened inputs.
  if (!bf16_native()) {
    EXPECT_EQ(gemm_library(DType::BF16), "OpenBLAS (bf16 widened to f32)");
  }
}

}  // namespace
}  // namespace tandem
