// Rounding a kernel's f32 output to bf16 for the matmul that reads it from the saved buffers.
#include "matmul_operands.h"
#include "tandem/nn/layers.h"

namespace tandem::nn {

void round_to_bf16(bf16* dst, const float* src, int64_t n) { detail::convert(src, dst, n); }

}  // namespace tandem::nn
