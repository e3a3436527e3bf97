// The tuner's executors: adapters from the PreparedRun interface to the compiled executor, the
// plan runner and the reference interpreter.
#include "tandem/tune/executor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tandem/core/error.h"
#include "tandem/exec/compiled.h"
#include "tandem/exec/plan_runner.h"

namespace tandem::tune {
namespace {

bool in_group(const dsl::Stage& s, const exec::Placement& place) {
  return s.type.group == dsl::kAllGroups || s.type.group == place.group;
}

// The names results() reports on this rank: its group's outputs and updated inputs.
struct ResultNames {
  std::vector<std::string> outputs;
  std::vector<std::string> updated_inputs;
};

ResultNames result_names(const dsl::Program& program, const exec::Placement& place) {
  ResultNames r;
  for (const dsl::Output& o : program.outputs())
    if (in_group(program.stage(o.stage), place)) r.outputs.push_back(o.name);
  for (int id : program.inputs())
    if (program.updater(id) >= 0 && in_group(program.stage(id), place)) r.updated_inputs.push_back(program.stage(id).name);
  return r;
}

// ---------------------------------------------------------------- compiled and plan runner

// The compiled runner and the plan runner share one calling convention: each stores its inputs
// (filled in place through input()), the runs update them, and results() reads them back. The
// state lives in the runner between runs, as it does between the steps of a training loop.
template <typename Runner>
class RunnerRun final : public PreparedRun {
 public:
  template <typename... A>
  RunnerRun(const schedule::Plan& plan, comm::Communicator& comm, A&&... a)
      : names_(result_names(plan.program, exec::placement(plan.program, comm))), runner_(std::forward<A>(a)...) {}
  Tensor input(std::string_view name) override { return runner_.input(name); }
  void set_scalar(std::string_view name, double value) override { runner_.set_scalar(name, value); }
  void run() override { runner_.run(); }
  exec::TensorMap results() override {
    exec::TensorMap r;
    for (const std::string& n : names_.outputs) r[n] = runner_.output(n);
    for (const std::string& n : names_.updated_inputs) r[n] = runner_.input(n);
    return r;
  }

 private:
  ResultNames names_;
  Runner runner_;
};

class CompiledExecutor final : public Executor {
 public:
  explicit CompiledExecutor(exec::JitOptions options) : options_(std::move(options)) {}
  std::string name() const override { return "compiled"; }
  std::unique_ptr<PreparedRun> prepare(const schedule::Plan& plan, comm::Communicator& comm,
                                       const dsl::SymbolMap& symbols) override {
    return std::make_unique<RunnerRun<exec::CompiledRunner>>(plan, comm, exec::compile_plan(plan, options_), comm,
                                                             symbols);
  }

 private:
  exec::JitOptions options_;
};

class PlanExecutor final : public Executor {
 public:
  std::string name() const override { return "plan"; }
  std::unique_ptr<PreparedRun> prepare(const schedule::Plan& plan, comm::Communicator& comm,
                                       const dsl::SymbolMap& symbols) override {
    return std::make_unique<RunnerRun<exec::PlanRunner>>(plan, comm, plan, comm, symbols);
  }
};

// ---------------------------------------------------------------------------- interpreter

// The interpreter computes from RunArgs: the inputs are allocated here once, as the scheduled
// program lays them out, and updated in place by each run.
class InterpreterRun final : public PreparedRun {
 public:
  InterpreterRun(const schedule::Plan& plan, comm::Communicator& comm, const dsl::SymbolMap& symbols)
      : plan_(plan), comm_(comm), names_(result_names(plan.program, exec::placement(plan.program, comm))) {
    args_.symbols = symbols;
    const exec::Placement place = exec::placement(plan.program, comm);
    const std::vector<Shape> global = plan.program.resolve_shapes(symbols);
    for (int id : plan.program.inputs()) {
      const dsl::Stage& s = plan.program.stage(id);
      if (s.type.group != dsl::kAllGroups && s.type.group != place.group) continue;
      args_.inputs[s.name] = Tensor::zeros(
          s.type.dtype, dsl::local_shape(global[static_cast<size_t>(id)], s.type.layout, place.group_size, place.index));
    }
  }
  Tensor input(std::string_view name) override {
    auto it = args_.inputs.find(name);
    if (it == args_.inputs.end())
      user_error("program '{}' has no input '{}' on this rank", plan_.program.name(), name);
    return it->second;
  }
  void set_scalar(std::string_view name, double value) override { args_.scalars[std::string(name)] = value; }
  void run() override { out_ = exec::run_reference(plan_.program, comm_, args_); }
  exec::TensorMap results() override {
    exec::TensorMap r = out_;
    for (const std::string& n : names_.updated_inputs) r[n] = args_.inputs.at(n);
    return r;
  }

 private:
  const schedule::Plan& plan_;
  comm::Communicator& comm_;
  ResultNames names_;
  exec::RunArgs args_;
  exec::TensorMap out_;
};

class InterpreterExecutor final : public Executor {
 public:
  std::string name() const override { return "interpreter"; }
  std::unique_ptr<PreparedRun> prepare(const schedule::Plan& plan, comm::Communicator& comm,
                                       const dsl::SymbolMap& symbols) override {
    return std::make_unique<InterpreterRun>(plan, comm, symbols);
  }
};

}  // namespace

std::unique_ptr<Executor> compiled_executor(const exec::JitOptions& options) {
  return std::make_unique<CompiledExecutor>(options);
}
std::unique_ptr<Executor> plan_executor() { return std::make_unique<PlanExecutor>(); }
std::unique_ptr<Executor> interpreter_executor() { return std::make_unique<InterpreterExecutor>(); }

std::vector<std::string_view> executor_names() { return {"compiled", "plan", "interpreter"}; }

std::unique_ptr<Executor> executor_by_name(std::string_view name) {
  if (name == "compiled") return compiled_executor();
  if (name == "plan") return plan_executor();
  if (name == "interpreter") return interpreter_executor();
  user_error("unknown executor '{}'; choose one of: {}", name, fmt::join(executor_names(), ", "));
}

}  // namespace tandem::tune
