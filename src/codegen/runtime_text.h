// The runtime files the emitters paste into every program (src/codegen/runtime/), as text: embedded
// by the build (cmake/embed_text.cmake, which drops their `#pragma once` and quoted includes).
// Private to src/codegen.
#pragma once

#include <string_view>

namespace tandem::codegen {

std::string_view cpu_text();           // runtime/cpu.h: the C++ translation unit's helpers
std::string_view cuda_prefix_text();   // runtime/cuda_prefix.cuh: before a CUDA program's steps
std::string_view cuda_runtime_text();  // runtime/cuda_runtime.cuh: the ABI's callbacks
std::string_view cuda_main_text();     // runtime/cuda_main.cu: main()

}  // namespace tandem::codegen
