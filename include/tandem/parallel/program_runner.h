// The door through which the trainer runs its communication points (the optimizer step, the
// Megatron epilogue, the pipeline hand-off): a DSL program with one chosen schedule, set up once
// per communicator and sizes (an exec::Runner), then run many times. The trainer never calls an
// executor directly, so swapping executors or the way the schedule is chosen changes this file
// pair only.
//
// Executors (TANDEM_EXECUTOR, or the constructor's argument; exec/runner.h): compiled (the
// lowered plan JIT-compiled once, cached on disk by content, shared by the ranks of a process; the
// default), plan (the plan runner: the same fused loops, hooks inside the collectives and blocked
// overlap, interpreted), reference (the interpreter on the scheduled program: split, reorder and
// slicing take effect, fusion and overlap do not).
// Schedules: the first name of a preference list that the program allows (schedule::first_allowed:
// nothing is enumerated; a name that does not parse is a UserError), else the unscheduled program;
// the caller may pass the autotuner's choice as the first preference.
// TANDEM_SCHEDULE_<PROGRAM>=<name> (TANDEM_SCHEDULE_ADAM="fused(RS-C-AG)+slice(m,v)") forces one; a
// name that does not parse or that the program does not allow is a UserError saying why. Chunk
// size: the autotuner's record gives its winner with the chunk size it ran fastest at; the runners
// of that schedule run their collectives at it (exec::RunnerOptions::chunk_bytes), every other
// schedule at the process's comm::chunk_bytes().
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/core/tensor.h"
#include "tandem/dsl/ir.h"
#include "tandem/exec/runner.h"
#include "tandem/schedule/plan.h"
#include "tandem/schedule/schedule.h"

namespace tandem::parallel {

// A communication point's schedules by name, best first, and the chunk size (bytes) that goes with
// the first: the autotuner's winner and chunk size (tune/cache.h), or 0 for the process's
// comm::chunk_bytes().
struct SchedulePreferences {
  std::vector<std::string> names;
  size_t chunk_bytes = 0;
};

class ProgramRunner {
 public:
  // `first_chunk_bytes`: the chunk size of the first preference (see above); the runners run at
  // it when that is the schedule chosen.
  ProgramRunner(const dsl::Program& program, const std::vector<std::string>& preferences,
                exec::RunnerKind executor = exec::runner_kind_from_env(),
                size_t first_chunk_bytes = 0);
  ~ProgramRunner();

  const std::string& schedule_name() const { return schedule_name_; }
  // The chunk size the runners' collectives run at (0: the process's).
  size_t chunk_bytes() const { return chunk_bytes_; }
  std::string executor_name() const {
    return std::string(exec::runner_kind_description(executor_));
  }
  exec::RunnerKind executor() const { return executor_; }
  // The program as scheduled (its inputs' layouts are the ones sessions store).
  const dsl::Program& program() const { return schedule_.program(); }
  const schedule::Schedule& schedule() const { return schedule_; }

  // Sets the schedule up on this rank of `comm` for `symbols`: a collective over `comm` (it may
  // split off the program's groups). The inputs named in `bound` live in the caller's memory
  // (exec::Runner::bind), the others in the runner's. `segments`: the bounds of the tensors a
  // program with segment ops updates (dsl/ir.h). This ProgramRunner must outlive the result.
  std::unique_ptr<exec::Runner> prepare(comm::Communicator& comm, const dsl::SymbolMap& symbols,
                                        const std::vector<std::string>& bound = {},
                                        const dsl::Segments& segments = {}) const;

 private:
  schedule::Schedule schedule_;
  std::unique_ptr<schedule::Plan> plan_;
  mutable std::once_flag compile_once_;
  mutable std::shared_ptr<const exec::CompiledPlan> compiled_;
  std::string schedule_name_;
  exec::RunnerKind executor_;
  size_t chunk_bytes_ = 0;
};

}  // namespace tandem::parallel
