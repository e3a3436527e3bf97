// Inputs the autotuner runs a program on, and the check of a schedule's results against the
// reference interpreter's: values derived from (input name, rank, element index) by a cheap hash,
// so every schedule, rank count and slicing sees the same data without storing a pristine copy.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/core/tensor.h"
#include "tandem/dsl/ir.h"
#include "tandem/exec/reference.h"

namespace tandem::tune {

// Element i of input `name`'s whole value (Local inputs: as held by index `index` of its group),
// uniform in [0.25, 1.25): positive, so that second moments and norms stay away from their
// singular points, and of one magnitude, so that relative tolerances mean something.
float input_value(const std::string& name, int index, int64_t i);

// The standard value of each scalar of `program` on a group of `p` ranks: optimizer
// hyper-parameters by their usual names (lr 1e-3, beta1 0.9, beta2 0.999, eps 1e-8,
// weight_decay 0.01, step 1, grad_scale 1/p), 1234 for a scalar that keys a dropout mask, 0.5
// for any other; `given` overrides. A name in `given` that is not a scalar is a UserError.
exec::ScalarMap standard_scalars(const dsl::Program& program, int p,
                                 const exec::ScalarMap& given = {});

// Fills `t`, this rank's piece of input stage `id` of `program` (a program as written or as
// scheduled: the piece is laid out as that program declares it) when the input's global shape is
// `global`, with the input's values.
void fill_input(const Tensor& t, const dsl::Program& program, int id, const Shape& global,
                const exec::Placement& place);

// This rank's arguments for `program`: every input of its group allocated and filled, the
// scalars, and `symbols` (which must bind every symbol).
exec::RunArgs make_args(const dsl::Program& program, const exec::Placement& place,
                        const dsl::SymbolMap& symbols, const exec::ScalarMap& scalars);

// Sizes at which no value of `program` holds more than `limit` elements: `sizes` when they
// already fit, else every symbol divided by one common factor, keeping each extent's remainder
// modulo `modulus` (the rank count times the row blocks, so that the same partition paths run)
// and never going below `modulus` plus that remainder.
dsl::SymbolMap shrink_sizes(const dsl::Program& program, const dsl::SymbolMap& sizes, int64_t limit,
                            int64_t modulus);

// What the reference interpreter computed on this rank: its group's outputs and the new values
// of the inputs updated in place (by input name), laid out as the program as written lays them.
struct Expected {
  exec::TensorMap values;
  std::vector<Shape> global;  // each stage's global shape in the original program
};
Expected reference_results(const dsl::Program& program, comm::Communicator& comm,
                           const dsl::SymbolMap& symbols, const exec::ScalarMap& scalars);

// The outcome of comparing a schedule's results with the reference's.
struct Check {
  bool ok = true;
  double max_error = 0;  // the largest |got - want| / (1 + max |want|) over every value
  std::string message;   // when not ok: which value, how many elements differ, the first ones
};

// Compares `got` (results of a run of `scheduled`, laid out as it declares) with `want` (laid out
// as the program as written declares: an input the schedule stores sliced is compared with this
// rank's part of the reference's whole value). Tolerances by the value's dtype: |got - want| <= tol
// * (|want| + max |want|) with tol 2e-4 for f32 (reductions may change order), 2^-7 for bf16 and
// 2^-9 for f16 (one or two units in the last place after a rounding that went the other way).
Check compare_results(const dsl::Program& scheduled, const exec::Placement& place,
                      const Expected& want, const exec::TensorMap& got);

}  // namespace tandem::tune
