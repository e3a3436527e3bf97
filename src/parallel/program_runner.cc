// Choosing a schedule for a communication point, and the sessions that run it (see
// program_runner.h).
#include "tandem/parallel/program_runner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <map>

#include "tandem/core/env.h"
#include "tandem/core/error.h"
#include "tandem/exec/compiled.h"
#include "tandem/schedule/enumerate.h"

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

ProgramRunner::ProgramRunner(const dsl::Program& program, const std::vector<std::string>& preferences,
                             exec::RunnerKind executor)
    : schedule_(program), executor_(executor) {
  std::vector<schedule::NamedSchedule> all = schedule::enumerate_schedules(program);
  TANDEM_CHECK(!all.empty(), "program '{}' has no schedule", program.name());
  for (const schedule::NamedSchedule& s : all) candidates_.push_back(s.name);

  std::vector<std::string> wanted = preferences;
  const std::string var = env_name(program.name());
  const std::string forced = env_str(var.c_str(), "");
  if (!forced.empty()) {
    if (std::find(candidates_.begin(), candidates_.end(), forced) == candidates_.end())
      user_error("{}={}: program '{}' has no schedule of that name; its schedules are: {}", var,
                 forced, program.name(), fmt::join(candidates_, ", "));
    wanted = {forced};
  }
  size_t pick = 0;  // the unscheduled program comes first
  for (const std::string& w : wanted) {
    auto it = std::find(candidates_.begin(), candidates_.end(), w);
    if (it != candidates_.end()) {
      pick = static_cast<size_t>(it - candidates_.begin());
      break;
    }
  }
  schedule_ = std::move(all[pick].schedule);
  schedule_name_ = all[pick].name;
  plan_ = std::make_unique<schedule::Plan>(schedule_.lower());
}

ProgramRunner::~ProgramRunner() = default;

std::unique_ptr<exec::Runner> ProgramRunner::prepare(comm::Communicator& comm, const dsl::SymbolMap& symbols,
                                                     const std::vector<std::string>& bound) const {
  exec::RunnerOptions options;
  options.bound = bound;
  if (executor_ == exec::RunnerKind::Compiled) {
    // Compiled once per process (the JIT keeps loaded modules and caches on disk by content).
    std::call_once(compile_once_, [&] { compiled_ = exec::compile_plan(*plan_); });
    options.compiled = compiled_;
  }
  return exec::make_runner(executor_, *plan_, comm, symbols, options);
}

}  // namespace tandem::parallel
