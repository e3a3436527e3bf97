// DType conversions: round to nearest even, NaN and infinity kept, subnormals exact; checked
// exhaustively against the compiler's own _Float16 where it has one, and bf16 by definition.
#include "tandem/core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "tandem/core/error.h"

namespace tandem {
namespace {

float from_bits(uint32_t x) {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::F32), 4u);
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_name(DType::F16), "f16");
  EXPECT_EQ(parse_dtype("bf16"), DType::BF16);
}

TEST(DType, ParseRejectsUnknownWithTheChoices) {
  try {
    parse_dtype("fp8");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(), "unknown dtype 'fp8': expected one of f32, bf16, f16");
  }
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 lies exactly between 1 and 1 + 2^-7: ties go to the even one (1.0).
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808000u)), 0x3f80);
  // 1 + 3 * 2^-8 lies between 1 + 2^-7 (odd) and 1 + 2^-6: the tie goes up to the even one.
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f818000u)), 0x3f82);
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808001u)), 0x3f81);  // just above the tie rounds up
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // overflows to infinity
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(from_bits(0x7f800001u)))));  // low-payload NaN
}

TEST(DType, Bf16RoundTripsEveryBf16Value) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = bf16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_bf16(f), h) << std::hex << h;
  }
}

TEST(DType, F16RoundTripsEveryF16Value) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    ASSERT_EQ(f32_to_f16(f), h) << std::hex << h;
  }
}

TEST(DType, F16EdgeCases) {
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);    // largest finite
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);    // below the halfway point
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);    // halfway: rounds to infinity
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);    // smallest subnormal
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);    // tie between 0 and 2^-24: even
  EXPECT_EQ(f32_to_f16(0x1.8p-24f), 0x0002);  // tie between 1 and 2 ulp: even
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::infinity()), 0x7c00);
}

#if defined(__FLT16_MAX__)
// Every f32 bit pattern a stride apart, against the compiler's conversion (IEEE round to even).
TEST(DType, F16MatchesCompilerConversion) {
  for (uint64_t x = 0; x <= 0xffffffffull; x += 9973) {
    const float f = from_bits(static_cast<uint32_t>(x));
    const _Float16 h = static_cast<_Float16>(f);
    uint16_t bits;
    std::memcpy(&bits, &h, 2);
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), bits) << std::hex << x;
  }
}
#endif

}  // namespace
}  // namespace tandem
