// Choosing a schedule for a communication point, and the sessions that run it (see
// program_runner.h).
#include "tandem/parallel/program_runner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cctype>

#include "tandem/core/env.h"
#include "tandem/core/error.h"
#include "tandem/exec/compiled.h"
#include "tandem/schedule/preference.h"
#include "tandem/schedule/recipe.h"

namespace tandem::parallel {
namespace {

// TANDEM_SCHEDULE_ADAM, TANDEM_SCHEDULE_MEGATRON_LAYER, ...
std::string env_name(const std::string& program) {
  std::string out = "TANDEM_SCHEDULE_";
  for (char ch : program)
    out += std::isalnum(static_cast<unsigned char>(ch)) ? static_cast<char>(std::toupper(ch)) : '_';
  return out;
}

}  // namespace

ProgramRunner::ProgramRunner(const dsl::Program& program,
                             const std::vector<std::string>& preferences, exec::RunnerKind executor,
                             size_t first_chunk_bytes)
    : schedule_(program), executor_(executor) {
  // The unscheduled program, unless a preference applies.
  schedule_name_ = schedule::Recipe::unscheduled(program).str();
  schedule_ = schedule::Recipe::unscheduled(program).apply(program);
  const std::string var = env_name(program.name());
  const std::string forced = env_str(var.c_str(), "");
  if (!forced.empty()) {
    try {
      schedule::NamedSchedule s = schedule::schedule_by_name(program, forced);
      schedule_ = std::move(s.schedule);
      schedule_name_ = s.name;
    } catch (const UserError& e) {
      user_error("{}={}: {}", var, forced, e.what());
    }
  } else if (auto chosen = schedule::first_allowed(
                 program, preferences,
                 fmt::format("the schedule preferences of program '{}'", program.name()))) {
    schedule_ = std::move(chosen->schedule.schedule);
    schedule_name_ = chosen->schedule.name;
    if (chosen->index == 0) chunk_bytes_ = first_chunk_bytes;
  }
  plan_ = std::make_unique<schedule::Plan>(schedule_.lower());
}

ProgramRunner::~ProgramRunner() = default;

std::unique_ptr<exec::Runner> ProgramRunner::prepare(comm::Communicator& comm,
                                                     const dsl::SymbolMap& symbols,
                                                     const std::vector<std::string>& bound,
                                                     const dsl::Segments& segments) const {
  exec::RunnerOptions options;
  options.bound = bound;
  options.segments = segments;
  options.chunk_bytes = chunk_bytes_;
  if (executor_ == exec::RunnerKind::Compiled) {
    // Compiled once per process (the JIT keeps loaded modules and caches on disk by content).
    std::call_once(compile_once_, [&] { compiled_ = exec::compile_plan(*plan_); });
    options.compiled = compiled_;
  }
  return exec::make_runner(executor_, *plan_, comm, symbols, options);
}

}  // namespace tandem::parallel
