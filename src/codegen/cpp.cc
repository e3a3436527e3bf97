// The C++ emitter: the shared plan walker (emitter.h) after the CPU prefix (see cpp.h for the
// shape of the output and abi.h for the contract with the host).
#include "tandem/codegen/cpp.h"

#include <fmt/format.h>

#include "emitter.h"

namespace tandem::codegen {

std::string step_symbol(int k) { return fmt::format("tandem_step_{}", k); }

std::string emit_cpp(const schedule::Plan& plan) { return cpp_prefix() + "\n" + detail::Emitter(plan).emit_body(); }

}  // namespace tandem::codegen
