// The reduce op of a code the compiled code passes back (codegen/abi.h).
#include "tandem/core/reduce_op.h"

#include "tandem/core/error.h"

namespace tandem {

ReduceOp reduce_op_of_code(int32_t code) {
  if (code < 0 || code > reduce_op_code(ReduceOp::Min))
    internal_error(fmt::format("reduce op code {}", code));
  return static_cast<ReduceOp>(code);
}

}  // namespace tandem
