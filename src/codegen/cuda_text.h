// The fixed text of every emitted CUDA program, around the per-plan part that cuda.cc writes:
// the prefix (headers, core/formulas.h, the ABI, device helpers), the runtime behind the ABI's
// callbacks (NCCL collectives and transfers, stream ordering, cuBLAS), main() and the Makefile.
// Private to src/codegen.
#pragma once

#include <string>

#include "tandem/codegen/cpp.h"  // abi_declarations

namespace tandem::codegen {

// Everything the step functions use; `symbols` sizes the symbol array kernels receive.
std::string cuda_prefix(int symbols);
// The ABI's callbacks over NCCL, CUDA streams and events, and cuBLAS (cuda_runtime.cc).
const std::string& cuda_runtime();
// main(): set-up, the check against the reference's results, the timing loop (cuda_main.cc).
const std::string& cuda_main();
// A Makefile building <name>.cu into <name> with nvcc for sm_80 and sm_90.
std::string cuda_makefile(const std::string& name);

}  // namespace tandem::codegen
