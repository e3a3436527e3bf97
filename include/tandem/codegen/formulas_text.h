// The text of core/formulas.h, embedded by the build (cmake/embed_text.cmake): what the C++ and
// CUDA emitters paste into every translation unit, so that emitted code computes with the very
// formulas the host library (and so the reference interpreter) is compiled from.
#pragma once

#include <string_view>

namespace tandem::codegen {

std::string_view formulas_text();

}  // namespace tandem::codegen
