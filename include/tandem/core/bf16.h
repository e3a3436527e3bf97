// bf16 on this CPU: whether it is native (AVX512_BF16), the line that says so, and the buffer
// conversions f32 <-> bf16 that every path computes bit for bit as core/formulas.h does.
//
// TANDEM_BF16=emulate makes a CPU with AVX512_BF16 take the path of one without it (portable
// conversions; bf16 GEMMs widened to f32 for OpenBLAS, see core/gemm.h), so that path is tested
// on any machine. Unset, tandem uses what the CPU has.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "tandem/core/dtype.h"

namespace tandem {

enum class Bf16Path : uint8_t {
  Native,    // AVX512_BF16: vcvtneps2bf16 conversions, oneDNN's bf16 matmul kernels
  Portable,  // any x86-64: integer rounding (vectorised by the compiler), bf16 GEMMs via f32
};

// Whether this CPU has AVX512_BF16 (with AVX512F and BW), whatever TANDEM_BF16 says.
bool cpu_has_avx512_bf16();
// The path this process takes: Native where the CPU has it and TANDEM_BF16 is not "emulate".
// A value of TANDEM_BF16 other than "emulate" (or empty) is a UserError.
Bf16Path bf16_path();
inline bool bf16_native() { return bf16_path() == Bf16Path::Native; }
// One line for a start-up message, e.g. "bf16: native (AVX512_BF16)" or "bf16: emulated
// (TANDEM_BF16=emulate): f32 arithmetic on bf16 values".
std::string bf16_describe();

// dst[i] = bf16 of src[i], rounded to nearest even, NaN kept NaN (quiet), subnormals rounded
// like any other value: bitwise fx::st_bf16 on every path.
void to_bf16(const float* src, bf16* dst, size_t n);
void to_f32(const bf16* src, float* dst, size_t n);
// The same on a named path (tests compare them); Native on a CPU without it is an InternalError.
void to_bf16(const float* src, bf16* dst, size_t n, Bf16Path path);
// to_bf16 and to_f32 split over the calling thread's team (core/parallel.h), for buffers of a
// layer's size: each element converts alone, so any split gives the same bits.
void to_bf16_parallel(const float* src, bf16* dst, int64_t n);
void to_f32_parallel(const bf16* src, float* dst, int64_t n);

}  // namespace tandem
