// The executors the autotuner times a schedule through: a small interface (set up once, bind the
// inputs, run many times, read the results) with the compiled executor of the CPU JIT behind it
// by default, and the plan runner and the reference interpreter as alternatives, so the tuner's
// protocol (check, warm up, repeat, take the median) is written once for all of them.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/core/tensor.h"

#include "tandem/comm/communicator.h"
#include "tandem/dsl/ir.h"
#include "tandem/exec/jit.h"
#include "tandem/exec/reference.h"
#include "tandem/schedule/plan.h"

namespace tandem::tune {

// One schedule set up on one rank for one binding of the symbols. Set up, then run: everything
// that costs (compiling, allocating, splitting the communicator) happens before the first run.
class PreparedRun {
 public:
  virtual ~PreparedRun() = default;
  // This rank's stored piece of input `name` of the *scheduled* program (plan.program), as it
  // lays the input out (an input that as_slice made Sliced is this rank's slice): fill it
  // before run(). Inputs the program updates hold their new values after a run.
  virtual Tensor input(std::string_view name) = 0;
  // Binds a scalar for the next runs.
  virtual void set_scalar(std::string_view name, double value) = 0;
  // Runs the schedule once; every rank of the communicator calls it together. This is the call
  // the tuner times.
  virtual void run() = 0;
  // After a run: this rank's piece of every output of its group, and of every input the program
  // updates in place (by the input's name), as the scheduled program lays them out.
  virtual exec::TensorMap results() = 0;
};

class Executor {
 public:
  virtual ~Executor() = default;
  // A short name, part of the tuning cache's key: "compiled", "plan", "interpreter".
  virtual std::string name() const = 0;
  // Sets `plan` up on this rank of `comm` (every rank calls it together with the same plan).
  // The plan must outlive the result. A plan the executor cannot run is a UserError.
  virtual std::unique_ptr<PreparedRun> prepare(const schedule::Plan& plan, comm::Communicator& comm,
                                               const dsl::SymbolMap& symbols) = 0;
};

// The compiled executor (exec/compiled: emitted C++, compiled through the JIT's cache, which
// `options` may point elsewhere).
std::unique_ptr<Executor> compiled_executor(const exec::JitOptions& options = {});
// The plan runner (exec/plan_runner: plain loops, fused hooks, blocked overlap; nothing compiled).
std::unique_ptr<Executor> plan_executor();
// The reference interpreter on the scheduled program (stage by stage: fusion and overlap are not
// carried out, only split, reorder and slicing show in its times). For tests of the tuner.
std::unique_ptr<Executor> interpreter_executor();

// The executors by name, for the command line: "compiled" (the default), "plan", "interpreter";
// an unknown name is a UserError listing these.
std::vector<std::string_view> executor_names();
std::unique_ptr<Executor> executor_by_name(std::string_view name);

}  // namespace tandem::tune
