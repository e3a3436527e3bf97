// Choosing a schedule for a communication point and running it (see program_runner.h).
#include "tandem/parallel/program_runner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>

#include "tandem/core/env.h"
#include "tandem/core/error.h"
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

ProgramRunner::ProgramRunner(const dsl::Program& program, const std::vector<std::string>& preferences)
    : schedule_(program) {
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
}

exec::TensorMap ProgramRunner::run(comm::Communicator& comm, const exec::RunArgs& args) const {
  return exec::run_reference(schedule_.program(), comm, args);
}

}  // namespace tandem::parallel
