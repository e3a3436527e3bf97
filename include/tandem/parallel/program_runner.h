// The door through which the trainer runs its communication points (the optimizer step, the
// Megatron epilogue, the pipeline hand-off): a DSL program with one chosen schedule, and the
// executor that runs it. The trainer never calls an executor directly, so that swapping the
// reference interpreter for the compiled executor (and the preference list for the autotuner's
// cached choice) changes this file pair only.
//
// What runs today: the schedule is chosen from schedule::enumerate_schedules by a preference
// list of CoCoNeT names (first match wins; the unscheduled program if none matches), and the
// scheduled program (after split, reorder and as_slice) is run by exec::run_reference. The
// reference interpreter evaluates the rewritten program stage by stage, so a schedule's rewrites
// (ReduceScatter + AllGather, computation on 1/p slices, state stored sliced) take effect, while
// its fusions and overlaps (which only the lowered plan expresses) do not.
//
// TANDEM_SCHEDULE_<PROGRAM>=<name> (e.g. TANDEM_SCHEDULE_ADAM="RS-C-AG+slice(m,v)") forces a
// schedule by name; an unknown name is a UserError listing the legal ones.
#pragma once

#include <string>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/dsl/ir.h"
#include "tandem/exec/reference.h"
#include "tandem/schedule/schedule.h"

namespace tandem::parallel {

class ProgramRunner {
 public:
  // Enumerates `program`'s schedules and keeps the first whose name is in `preferences` (in the
  // order given), or the environment's choice.
  ProgramRunner(const dsl::Program& program, const std::vector<std::string>& preferences);

  const std::string& schedule_name() const { return schedule_name_; }
  // The program as scheduled: its inputs' layouts are the ones to bind (as_slice makes state
  // Sliced: bind this rank's part).
  const dsl::Program& program() const { return schedule_.program(); }
  const schedule::Schedule& schedule() const { return schedule_; }
  std::string executor_name() const { return "reference interpreter"; }
  // Every schedule name the program has, in enumeration order.
  const std::vector<std::string>& candidates() const { return candidates_; }

  // Runs on every rank of `comm` (a collective); returns this rank's outputs.
  exec::TensorMap run(comm::Communicator& comm, const exec::RunArgs& args) const;

 private:
  schedule::Schedule schedule_;
  std::string schedule_name_;
  std::vector<std::string> candidates_;
};

}  // namespace tandem::parallel
