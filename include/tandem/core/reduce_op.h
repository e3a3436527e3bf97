// The reduction operators, defined once for the DSL (reduce stages, reducing collectives), the
// communicator and the compiled code's ABI (whose integer codes are these enumerators' values).
#pragma once

#include <cstdint>
#include <string_view>

namespace tandem {

enum class ReduceOp : uint8_t { Sum, Prod, Max, Min };

// "sum", "prod", "max", "min".
constexpr std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Prod:
      return "prod";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Min:
      return "min";
  }
  return "?";
}

// The op's code in codegen/abi.h's tandem_collective::op (0 sum, 1 prod, 2 max, 3 min), and back;
// a code out of range is an internal error (the emitter and the host disagree).
constexpr int32_t reduce_op_code(ReduceOp op) { return static_cast<int32_t>(op); }
ReduceOp reduce_op_of_code(int32_t code);

static_assert(reduce_op_code(ReduceOp::Sum) == 0 && reduce_op_code(ReduceOp::Prod) == 1 &&
                  reduce_op_code(ReduceOp::Max) == 2 && reduce_op_code(ReduceOp::Min) == 3,
              "codegen/abi.h fixes the reduce codes");

}  // namespace tandem
