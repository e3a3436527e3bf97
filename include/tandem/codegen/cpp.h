// The C++ emitter of the CPU JIT: one translation unit per lowered plan, for any plan (never a
// program special-cased by name), compiled by exec/jit and run by exec/compiled.
//
// What the source looks like.
// - The shared prefix (cpp_prefix(): the ABI of codegen/abi.h, core/formulas.h's text (bf16/f16
//   loads and stores converted in registers with tandem's round-to-nearest-even, and the formula
//   of every elementwise op) and the helpers of src/codegen/runtime/cpu.h), then one function per
//   step.
// - A fused Loop becomes a driver that walks its domain (the whole shape, this rank's slice, a
//   pipeline block) in contiguous runs, and a run function: a straight loop over restrict
//   pointers with the stages as f32 expressions, which the compiler vectorises. Values not stored
//   stay in registers (rounded to their dtype, as the interpreter rounds every stage).
// - A Chunk-domain Loop becomes a hook (tandem_hook_fn) that the collective calls on each
//   reduced chunk: the computation runs inside the collective.
// - Collectives, transfers and the cross-rank part of norms call back into the host; matmuls
//   call CBLAS sgemm through the host's function pointer, a row block at a time in a Pipeline,
//   whose collectives the host may run on its communication thread while the next block is
//   computed.
// - Entry points: `extern "C" int tandem_run(const tandem_args*)` runs every step in order;
//   `tandem_step_<k>` runs top-level step k; `tandem_scratch_elems` and `tandem_abi_version`.
// Sizes, rank counts and scalars are run-time values (tandem_args), so one compiled source
// serves every size and rank count of a plan.
//
// A plan feature the emitter cannot compile is a UserError that names the plan, the step and
// the feature.
#pragma once

#include <string>

#include "tandem/schedule/plan.h"

namespace tandem::codegen {

// The text every emitted translation unit starts with.
const std::string& cpp_prefix();

// codegen/abi.h's declarations as text, one a line: what the C++ prefix (and the CUDA emitter's)
// pastes, so emitted code and host agree on the ABI.
std::string abi_declarations();

// The translation unit for `plan`: cpp_prefix() followed by the plan's functions. Deterministic:
// the same plan gives the same text (so the JIT's cache hits).
std::string emit_cpp(const schedule::Plan& plan);

// The symbol of top-level step k.
std::string step_symbol(int k);

}  // namespace tandem::codegen
