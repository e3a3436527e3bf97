// Element types (f32, bf16, f16) and their conversions: round to nearest even, NaN and infinity
// preserved, subnormals handled exactly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "tandem/core/formulas.h"

namespace tandem {

enum class DType : uint8_t { F32, BF16, F16 };

inline constexpr DType kAllDTypes[] = {DType::F32, DType::BF16, DType::F16};

// One bfloat16 element in memory: the upper 16 bits of an f32. A type of its own, so that a
// function taking bf16 buffers (core/gemm.h, core/bf16.h) cannot be handed f16 ones; a bf16
// tensor's data_as<bf16>() gives them.
struct bf16 {
  uint16_t bits;
};
static_assert(sizeof(bf16) == 2 && alignof(bf16) == 2);

constexpr size_t dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }
std::string_view dtype_name(DType t);
// Parses "f32", "bf16" or "f16"; anything else is a UserError listing the choices.
DType parse_dtype(std::string_view name);

// The conversions are core/formulas.h's (round to nearest even, subnormals exact, NaN kept),
// the very text the emitted kernels use.
inline uint16_t f32_to_bf16(float f) { return fx::st_bf16(f); }
inline float bf16_to_f32(uint16_t h) { return fx::ld_bf16(h); }
inline uint16_t f32_to_f16(float f) { return fx::st_f16(f); }
inline float f16_to_f32(uint16_t h) { return fx::ld_f16(h); }

// Loads element i of a buffer of type t as f32; stores an f32 into element i.
inline float load_as_f32(const void* p, DType t, size_t i) {
  switch (t) {
    case DType::F32:
      return static_cast<const float*>(p)[i];
    case DType::BF16:
      return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::F16:
      return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
  return 0.0f;
}

inline void store_from_f32(void* p, DType t, size_t i, float v) {
  switch (t) {
    case DType::F32:
      static_cast<float*>(p)[i] = v;
      break;
    case DType::BF16:
      static_cast<uint16_t*>(p)[i] = f32_to_bf16(v);
      break;
    case DType::F16:
      static_cast<uint16_t*>(p)[i] = f32_to_f16(v);
      break;
  }
}

}  // namespace tandem
