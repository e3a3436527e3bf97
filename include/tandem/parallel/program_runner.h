// The door through which the trainer runs its communication points (the optimizer step, the
// Megatron epilogue, the pipeline hand-off): a DSL program with one chosen schedule, set up once
// per communicator and sizes (a ProgramSession), then run many times. The trainer never calls an
// executor directly, so swapping executors or the way the schedule is chosen changes this file
// pair only.
//
// Executors (TANDEM_EXECUTOR, or the constructor's argument):
//   compiled   exec::CompiledRunner: the lowered plan emitted as C++, JIT-compiled once (cached
//              on disk by content, shared by the ranks of a process) and run; the default
//   plan       exec::PlanRunner on the lowered plan: the same fused loops, hooks inside the
//              collectives and blocked overlap, interpreted (nothing compiled)
//   reference  exec::run_reference on the scheduled program: split, reorder and slicing take
//              effect, fusion and overlap (which only the plan expresses) do not
// Schedules: the first name of a preference list found among schedule::enumerate_schedules'
// names (CoCoNeT's), else the unscheduled program; the caller may pass the autotuner's choice as
// the first preference. TANDEM_SCHEDULE_<PROGRAM>=<name> (TANDEM_SCHEDULE_ADAM=
// "fused(RS-C-AG)+slice(m,v)") forces one; an unknown name is a UserError listing the names.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/core/tensor.h"
#include "tandem/dsl/ir.h"
#include "tandem/schedule/plan.h"
#include "tandem/schedule/schedule.h"

namespace tandem::exec {
class CompiledPlan;
}

namespace tandem::parallel {

enum class ExecutorKind { Compiled, Plan, Reference };
// "compiled (JIT)", "plan runner", "reference interpreter"
std::string_view executor_name(ExecutorKind kind);
// "compiled", "plan" or "reference" (a UserError naming `what` otherwise).
ExecutorKind executor_from_name(std::string_view name, std::string_view what = "executor");
// TANDEM_EXECUTOR, default "compiled".
ExecutorKind executor_from_env();

// One schedule set up on one rank of one communicator for one binding of the symbols. Inputs are
// the runner's own storage, laid out as the scheduled program lays them out (an input that
// as_slice made Sliced is this rank's part): fill them, bind the scalars, run, read the outputs.
// Inputs the program updates hold their new value after run(), and keep it (optimizer state can
// live there).
class ProgramSession {
 public:
  virtual ~ProgramSession() = default;
  virtual Tensor input(std::string_view name) = 0;
  virtual void set_scalar(std::string_view name, double value) = 0;
  // Every rank of the communicator calls it together.
  virtual void run() = 0;
  // This rank's piece of output `name` after run() (storage of the session).
  virtual Tensor output(std::string_view name) = 0;
};

class ProgramRunner {
 public:
  ProgramRunner(const dsl::Program& program, const std::vector<std::string>& preferences,
                ExecutorKind executor = executor_from_env());
  ~ProgramRunner();

  const std::string& schedule_name() const { return schedule_name_; }
  std::string executor_name() const { return std::string(parallel::executor_name(executor_)); }
  // The program as scheduled (its inputs' layouts are the ones sessions store).
  const dsl::Program& program() const { return schedule_.program(); }
  const schedule::Schedule& schedule() const { return schedule_; }
  // Every schedule name the program has, in enumeration order.
  const std::vector<std::string>& candidates() const { return candidates_; }

  // Sets the schedule up on this rank of `comm` for `symbols`: a collective over `comm` (it may
  // split off the program's groups). The runner must outlive the session.
  std::unique_ptr<ProgramSession> prepare(comm::Communicator& comm, const dsl::SymbolMap& symbols) const;

 private:
  schedule::Schedule schedule_;
  std::unique_ptr<schedule::Plan> plan_;
  mutable std::once_flag compile_once_;
  mutable std::shared_ptr<const exec::CompiledPlan> compiled_;
  std::string schedule_name_;
  std::vector<std::string> candidates_;
  ExecutorKind executor_;
};

}  // namespace tandem::parallel
