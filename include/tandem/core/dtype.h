// Element types (f32, bf16, f16) and their conversions: round to nearest even, NaN and infinity
// preserved, subnormals handled exactly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace tandem {

enum class DType : uint8_t { F32, BF16, F16 };

inline constexpr DType kAllDTypes[] = {DType::F32, DType::BF16, DType::F16};

constexpr size_t dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }
std::string_view dtype_name(DType t);
// Parses "f32", "bf16" or "f16"; anything else is a UserError listing the choices.
DType parse_dtype(std::string_view name);

// bfloat16: the upper half of an f32, rounded to nearest even.
inline uint16_t f32_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

inline float bf16_to_f32(uint16_t h) {
  uint32_t x = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

// IEEE half precision, rounded to nearest even (including into and out of subnormals).
inline uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));  // NaN
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to infinity
  if (ax < 0x38800000u) {
    // Result is subnormal (or zero): shift the 24-bit significand into place, round to even.
    if (ax < 0x33000000u) return static_cast<uint16_t>(sign);  // below half the smallest subnormal
    const uint32_t e = ax >> 23;
    const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // value / 2^-24 == significand * 2^(e - 126)
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  // Normal: rebias the exponent, round the 13 dropped bits to even (a carry may bump the exponent).
  uint32_t r = ax - 0x38000000u;
  r += 0x0fffu + ((r >> 13) & 1u);
  return static_cast<uint16_t>(sign | (r >> 13));
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  uint32_t x;
  if (e == 0x1f) {
    x = sign | 0x7f800000u | (m << 13);  // infinity or NaN (payload kept)
  } else if (e != 0) {
    x = sign | ((e + 112) << 23) | (m << 13);
  } else if (m == 0) {
    x = sign;
  } else {
    // Subnormal half: normalise into an f32.
    float f = static_cast<float>(m) * 0x1p-24f;
    std::memcpy(&x, &f, 4);
    x |= sign;
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

// Loads element i of a buffer of type t as f32; stores an f32 into element i.
inline float load_as_f32(const void* p, DType t, size_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(p)[i];
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
  return 0.0f;
}

inline void store_from_f32(void* p, DType t, size_t i, float v) {
  switch (t) {
    case DType::F32: static_cast<float*>(p)[i] = v; break;
    case DType::BF16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(v); break;
    case DType::F16: static_cast<uint16_t*>(p)[i] = f32_to_f16(v); break;
  }
}

}  // namespace tandem
