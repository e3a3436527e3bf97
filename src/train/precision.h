// The start-up line of a run that says how its matmuls multiply (--precision) and why. Internal
// to train/.
#pragma once

#include <string>

#include "tandem/core/dtype.h"

namespace tandem::train::detail {

// "  precision bf16: ...\n" or "  precision fp32: ...\n": what multiplies in which type, the
// library that runs the bf16 products, and whether this CPU has native bf16 (what --precision
// auto goes by).
std::string precision_line(DType matmul);

}  // namespace tandem::train::detail
