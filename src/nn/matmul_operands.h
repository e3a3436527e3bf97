// Internal: the bf16 copies of a matmul's operands in a MatmulPrecision's scratch, shared by the
// linear layers and the LM head, and the bf16 outputs of the kernels whose output a matmul reads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "tandem/core/bf16.h"
#include "tandem/core/error.h"
#include "tandem/core/parallel.h"
#include "tandem/nn/layers.h"

namespace tandem::nn::detail {

// out (n) = the values kernel(dst, first, count) writes for elements [first, first + count) into
// dst: directly into an f32 out; into an f32 tile of a few KiB, then rounded by to_bf16 (its
// vectorised conversion: a per-element rounding store would stop the kernel's loop vectorising),
// for a bf16 out, a matmul's input that the forward saves in bf16. Bitwise to_bf16 of the f32
// values either way.
template <typename Kernel>
void write_output(float* out, int64_t n, const Kernel& kernel) {
  kernel(out, int64_t{0}, n);
}
template <typename Kernel>
void write_output(bf16* out, int64_t n, const Kernel& kernel) {
  constexpr int64_t kTile = 1024;
  float tile[kTile];
  for (int64_t b = 0; b < n; b += kTile) {
    const int64_t count = std::min(kTile, n - b);
    kernel(tile, b, count);
    to_bf16(tile, out + b, static_cast<size_t>(count));
  }
}

// The bf16 copy of an n-element operand in `scratch` (size elements).
inline const bf16* operand(const float* src, int64_t n, bf16* scratch, int64_t size,
                           const char* which) {
  TANDEM_CHECK(scratch != nullptr && size >= n, "bf16 matmul scratch '{}' holds {} of {} elements",
               which, scratch != nullptr ? size : 0, n);
  to_bf16_parallel(src, scratch, n);
  return scratch;
}
inline const bf16* rows_of(const MatmulPrecision& mm, const float* src, int64_t n) {
  return operand(src, n, mm.rows, mm.rows_size, "rows");
}
inline const bf16* other_of(const MatmulPrecision& mm, const float* src, int64_t n) {
  return operand(src, n, mm.other, mm.other_size, "other");
}

// An input saved in bf16 is its own bf16 operand: its values are what converting the f32 ones it
// was rounded from would give, so no scratch and no pass over it.
inline const bf16* rows_of(const MatmulPrecision&, const bf16* src, int64_t) { return src; }
inline const bf16* other_of(const MatmulPrecision&, const bf16* src, int64_t) { return src; }

inline bool in_bf16(const MatmulPrecision& mm) {
  TANDEM_CHECK(mm.type == DType::F32 || mm.type == DType::BF16, "{} matmuls", dtype_name(mm.type));
  return mm.type == DType::BF16;
}

// Whether a call with input element type In multiplies in bf16: a bf16 input needs bf16 matmuls.
template <typename In>
bool in_bf16_for(const MatmulPrecision& mm) {
  constexpr bool f32_input = std::is_same_v<In, float>;
  const bool b = in_bf16(mm);
  TANDEM_CHECK(b || f32_input, "a bf16 input to {} matmuls", dtype_name(mm.type));
  return b;
}

}  // namespace tandem::nn::detail
