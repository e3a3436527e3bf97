// The plan runner: the test oracle between lowering and emission. It executes a lowered schedule
// (schedule::Plan) with interpreter semantics, on any Communicator: plain loops for the plan's
// fused loops, the communicator's chunked collectives with the fused computation inside their
// per-chunk hook, matmuls in row blocks handed to the collective block by block where the plan
// overlaps them. Tests compare it with run_reference, so a lowering is checked apart from any
// emitter, and measure with it the memory a schedule stores: every buffer comes from the
// Allocator it is given (the default, the host heap, means the communicator's:
// comm::buffer_allocator). It is not the executor to train with (the compiled one is): it stays
// selectable (TANDEM_EXECUTOR=plan, --executor plan) to run a schedule without a compiler, at an
// interpreter's speed, when a compiled result is in doubt.
//
// Set up, then run: construction sets up the storage both plan executors share (the group
// communicator and every value the plan stores on this rank, as Plan::values says) and allocates
// the scratch its collectives, reductions and matmuls need; run() allocates nothing.
// Values are computed exactly as the reference interpreter computes them: f32 arithmetic with the
// formulas of dsl/elementwise.h, each stage's value rounded to its dtype (in registers too),
// reductions accumulating in element order (whole-tensor sums and norms in 8 double lanes keyed
// by the global flat index, so chunking does not matter), reducing collectives working on f32
// copies and rounding once, matmuls through blas::sgemm on f32 copies. A schedule that keeps the
// order of operations is therefore bitwise equal to the reference; one that changes the order of
// a reduction (a norm's per-slice partials combined across ranks, a collective split into
// blocks) differs in rounding only.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "tandem/comm/communicator.h"
#include "tandem/core/allocator.h"
#include "tandem/core/tensor.h"
#include "tandem/dsl/ir.h"
#include "tandem/exec/reference.h"
#include "tandem/exec/runner.h"
#include "tandem/schedule/plan.h"

namespace tandem::exec {

class PlanRunner final : public Runner {
 public:
  // Collective over `comm` (it splits off the group communicator when the program has groups).
  // The plan must outlive the runner. A rank count that does not fit the program's groups, or an
  // unbound symbol, is a UserError.
  PlanRunner(const schedule::Plan& plan, comm::Communicator& comm, const dsl::SymbolMap& symbols,
             Allocator& alloc = host_allocator());
  PlanRunner(const schedule::Plan& plan, comm::Communicator& comm, const dsl::SymbolMap& symbols,
             const RunnerOptions& options);
  ~PlanRunner() override;
  PlanRunner(const PlanRunner&) = delete;
  PlanRunner& operator=(const PlanRunner&) = delete;

  const dsl::Program& program() const override;
  const Placement& placement() const override;
  // This rank's stored piece of input `name` (the whole tensor, or its slice when the plan stores
  // it sliced): fill it before run(); an input updated in place holds its new value after.
  Tensor input(std::string_view name) const override;
  void bind(std::string_view name, const Tensor& memory) override;
  // Copies a value into input `name`: this rank's stored piece as it is, or, when the plan stores a
  // slice of an input the caller holds whole (as_slice), the whole tensor, of which it keeps its
  // part.
  void load(std::string_view name, const Tensor& value);
  // Binds scalar `name` (a dropout seed: a non-negative integer below 2^53, checked here).
  void set_scalar(std::string_view name, double value) override;

  // Runs the plan once; every rank of the communicator calls it together.
  void run() override;
  void run_leaving_sends() override;
  void wait_sends() override;

  // This rank's piece of output `name` after run() (a view of the runner's storage).
  Tensor output(std::string_view name) const override;

  // Where this rank's stored piece of value `name` sits in the whole.
  using Piece = exec::Piece;
  Piece piece(std::string_view name) const;

  // Bytes this rank allocated to store value `name` (0 when it lives in another value's buffer
  // or in bound memory), and for everything (values and scratch), as requested from the
  // allocator.
  size_t allocated_bytes(std::string_view name) const;
  size_t allocated_bytes() const override;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// One run with run_reference's conventions: `args.inputs` holds this rank's piece of each input
// as the *program as written* lays it out (for an input the plan stores sliced, the whole
// tensor); inputs updated in place are written back into those tensors (for a sliced one, only
// this rank's part of it). Returns this rank's piece of every output of its group.
TensorMap run_plan(const schedule::Plan& plan, comm::Communicator& comm, const RunArgs& args,
                   Allocator& alloc = host_allocator());

}  // namespace tandem::exec
