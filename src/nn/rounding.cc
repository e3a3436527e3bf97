// Rounding a kernel's staged f32 output into the bf16 buffer a matmul reads it from.
#include "matmul_operands.h"
#include "tandem/nn/layers.h"

namespace tandem::nn {

void store_staged(bf16* out, const float* staging, int64_t n) { to_bf16_parallel(staging, out, n); }

}  // namespace tandem::nn
