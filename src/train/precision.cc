// The start-up line of a run's precision.
#include "precision.h"

#include <fmt/format.h>

#include "tandem/core/bf16.h"
#include "tandem/core/gemm.h"

namespace tandem::train::detail {

std::string precision_line(DType matmul) {
  if (matmul == DType::BF16)
    return fmt::format(
        "  precision bf16: the linear layers' and the LM head's matmuls on bf16 operands with f32 "
        "accumulation, through {}; attention, LayerNorm, softmax, GELU, the loss, the optimizer "
        "and the master weights in f32 ({})\n",
        gemm_library(DType::BF16), bf16_describe());
  return fmt::format("  precision fp32: every matmul in f32, through {} ({}{})\n",
                     gemm_library(DType::F32), bf16_describe(),
                     bf16_native() ? "; --precision bf16 or auto would use it" : "");
}

}  // namespace tandem::train::detail
