// The executors the autotuner times a schedule through: a factory of exec::Runner (set up once,
// bind the inputs, run many times, read the results) with a name that is part of the tuning
// cache's key, so the tuner's protocol (check, warm up, repeat, take the median) is written once
// for every executor, and tests can wrap one to rig its timings.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/dsl/ir.h"
#include "tandem/exec/jit.h"
#include "tandem/exec/runner.h"
#include "tandem/schedule/plan.h"

namespace tandem::tune {

class Executor {
 public:
  virtual ~Executor() = default;
  // A short name, part of the tuning cache's key: exec::runner_kind_name's for the built-in ones.
  virtual std::string name() const = 0;
  // Sets `plan` up on this rank of `comm` (every rank calls it together with the same plan and
  // chunk size), its collectives run at `chunk_bytes` (exec::RunnerOptions::chunk_bytes; 0: the
  // process's comm::chunk_bytes()). The plan must outlive the result. A plan the executor cannot
  // run is a UserError.
  virtual std::unique_ptr<exec::Runner> prepare(const schedule::Plan& plan,
                                                comm::Communicator& comm,
                                                const dsl::SymbolMap& symbols,
                                                size_t chunk_bytes) = 0;
};

// The executor of a kind: the compiled one compiles through the JIT's cache, which `options` may
// point elsewhere.
std::unique_ptr<Executor> executor_of(exec::RunnerKind kind, const exec::JitOptions& options = {});
// The executors by name, for the command line (exec::runner_kind_from_name's names).
std::unique_ptr<Executor> executor_by_name(std::string_view name);

}  // namespace tandem::tune
