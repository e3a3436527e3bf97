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
#include "tandem/exec/plan_runner.h"
#include "tandem/exec/reference.h"
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

// The compiled executor: the lowered plan as JIT-compiled C++.
class CompiledSession final : public ProgramSession {
 public:
  CompiledSession(std::shared_ptr<const exec::CompiledPlan> plan, comm::Communicator& comm,
                  const dsl::SymbolMap& symbols)
      : runner_(std::move(plan), comm, symbols) {}
  Tensor input(std::string_view name) override { return runner_.input(name); }
  void set_scalar(std::string_view name, double value) override { runner_.set_scalar(name, value); }
  void run() override { runner_.run(); }
  Tensor output(std::string_view name) override { return runner_.output(name); }

 private:
  exec::CompiledRunner runner_;
};

// The plan runner: the lowered plan, fusion and overlap included.
class PlanSession final : public ProgramSession {
 public:
  PlanSession(const schedule::Plan& plan, comm::Communicator& comm, const dsl::SymbolMap& symbols)
      : runner_(plan, comm, symbols) {}
  Tensor input(std::string_view name) override { return runner_.input(name); }
  void set_scalar(std::string_view name, double value) override { runner_.set_scalar(name, value); }
  void run() override { runner_.run(); }
  Tensor output(std::string_view name) override { return runner_.output(name); }

 private:
  exec::PlanRunner runner_;
};

// The reference interpreter on the scheduled program, over inputs this session owns.
class ReferenceSession final : public ProgramSession {
 public:
  ReferenceSession(const dsl::Program& program, comm::Communicator& comm, const dsl::SymbolMap& symbols)
      : program_(program), comm_(comm) {
    args_.symbols = symbols;
    const exec::Placement place = exec::placement(program, comm);
    const std::vector<Shape> shapes = program.resolve_shapes(symbols);
    for (int id : program.inputs()) {
      const dsl::Stage& s = program.stage(id);
      if (s.type.group != dsl::kAllGroups && s.type.group != place.group) continue;
      const Shape local = dsl::local_shape(shapes[static_cast<size_t>(id)], s.type.layout,
                                           place.group_size, place.index);
      args_.inputs[program.display_name(id)] = Tensor::zeros(s.type.dtype, local);
    }
  }
  Tensor input(std::string_view name) override {
    auto it = args_.inputs.find(name);
    if (it == args_.inputs.end())
      user_error("program '{}' has no input '{}' on this rank", program_.name(), name);
    return it->second;
  }
  void set_scalar(std::string_view name, double value) override {
    args_.scalars[std::string(name)] = value;
  }
  void run() override { outputs_ = exec::run_reference(program_, comm_, args_); }
  Tensor output(std::string_view name) override {
    auto it = outputs_.find(name);
    if (it == outputs_.end())
      user_error("program '{}' gave this rank no output '{}'", program_.name(), name);
    return it->second;
  }

 private:
  const dsl::Program& program_;
  comm::Communicator& comm_;
  exec::RunArgs args_;
  exec::TensorMap outputs_;
};

}  // namespace

std::string_view executor_name(ExecutorKind kind) {
  switch (kind) {
    case ExecutorKind::Compiled: return "compiled (JIT)";
    case ExecutorKind::Plan: return "plan runner";
    case ExecutorKind::Reference: return "reference interpreter";
  }
  internal_error("bad ExecutorKind");
}

ExecutorKind executor_from_name(std::string_view v, std::string_view what) {
  if (v == "compiled") return ExecutorKind::Compiled;
  if (v == "plan") return ExecutorKind::Plan;
  if (v == "reference") return ExecutorKind::Reference;
  user_error("{} '{}': the executors are compiled, plan and reference", what, v);
}

ExecutorKind executor_from_env() {
  const std::string v = env_str("TANDEM_EXECUTOR", "compiled");
  return executor_from_name(v.empty() ? "compiled" : v, "TANDEM_EXECUTOR");
}

ProgramRunner::ProgramRunner(const dsl::Program& program, const std::vector<std::string>& preferences,
                             ExecutorKind executor)
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

std::unique_ptr<ProgramSession> ProgramRunner::prepare(comm::Communicator& comm,
                                                       const dsl::SymbolMap& symbols) const {
  switch (executor_) {
    case ExecutorKind::Compiled: {
      // Compiled once per process (the JIT keeps loaded modules and caches on disk by content).
      std::call_once(compile_once_, [&] { compiled_ = exec::compile_plan(*plan_); });
      return std::make_unique<CompiledSession>(compiled_, comm, symbols);
    }
    case ExecutorKind::Plan: return std::make_unique<PlanSession>(*plan_, comm, symbols);
    case ExecutorKind::Reference: return std::make_unique<ReferenceSession>(schedule_.program(), comm, symbols);
  }
  internal_error("bad ExecutorKind");
}

}  // namespace tandem::parallel
