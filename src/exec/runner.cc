// The runner interface's shared parts: executor names, the factory, results(), and the reference
// interpreter behind the interface.
#include "tandem/exec/runner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>

#include "tandem/core/env.h"
#include "tandem/core/error.h"
#include "tandem/exec/compiled.h"
#include "tandem/exec/plan_runner.h"

namespace tandem::exec {

std::string_view runner_kind_name(RunnerKind kind) {
  switch (kind) {
    case RunnerKind::Compiled:
      return "compiled";
    case RunnerKind::Plan:
      return "plan";
    case RunnerKind::Reference:
      return "reference";
  }
  internal_error("bad RunnerKind");
}

std::string_view runner_kind_description(RunnerKind kind) {
  switch (kind) {
    case RunnerKind::Compiled:
      return "compiled (JIT)";
    case RunnerKind::Plan:
      return "plan runner";
    case RunnerKind::Reference:
      return "reference interpreter";
  }
  internal_error("bad RunnerKind");
}

std::vector<std::string_view> runner_kind_names() { return {"compiled", "plan", "reference"}; }

RunnerKind runner_kind_from_name(std::string_view name, std::string_view what) {
  if (name == "compiled") return RunnerKind::Compiled;
  if (name == "plan") return RunnerKind::Plan;
  if (name == "reference") return RunnerKind::Reference;
  user_error("{} '{}': the executors are {}", what, name, fmt::join(runner_kind_names(), ", "));
}

RunnerKind runner_kind_from_env() {
  const std::string v = env_str("TANDEM_EXECUTOR", "compiled");
  return runner_kind_from_name(v.empty() ? "compiled" : v, "TANDEM_EXECUTOR");
}

TensorMap Runner::results() const {
  const dsl::Program& p = program();
  TensorMap r;
  for (const dsl::Output& o : p.outputs())
    if (placement().holds(p.stage(o.stage))) r[o.name] = output(o.name);
  for (int id : p.inputs())
    if (p.updater(id) >= 0 && placement().holds(p.stage(id)))
      r[p.stage(id).name] = input(p.stage(id).name);
  return r;
}

Tensor checked_binding(std::string_view program, std::string_view name, const Shape& stored,
                       DType dtype, const Tensor& memory) {
  if (memory.dtype() != dtype || memory.numel() != stored.numel() || !memory.defined())
    user_error("program '{}': input '{}' is stored as {}{} on this rank; bound to {}", program,
               name, dtype_name(dtype), stored.str(), memory.str());
  // A view that does not own the memory: the caller keeps it alive (the contract), and a runner
  // must not free another's buffer, or outlive the allocator it came from, by holding a share.
  return Tensor::view_of(memory.reshape(stored).data(), dtype, stored);
}

std::unique_ptr<Runner> make_runner(RunnerKind kind, const schedule::Plan& plan,
                                    comm::Communicator& comm, const dsl::SymbolMap& symbols,
                                    const RunnerOptions& options) {
  switch (kind) {
    case RunnerKind::Compiled: {
      std::shared_ptr<const CompiledPlan> compiled =
          options.compiled ? options.compiled : compile_plan(plan, options.jit);
      return std::make_unique<CompiledRunner>(std::move(compiled), comm, symbols, options);
    }
    case RunnerKind::Plan:
      return std::make_unique<PlanRunner>(plan, comm, symbols, options);
    case RunnerKind::Reference:
      return std::make_unique<ReferenceRunner>(plan.program, comm, symbols, options);
  }
  internal_error("bad RunnerKind");
}

// ------------------------------------------------------------------------- the interpreter

ReferenceRunner::ReferenceRunner(const dsl::Program& program, comm::Communicator& comm,
                                 const dsl::SymbolMap& symbols, const RunnerOptions& options)
    : program_(program), groups_(program, comm) {
  const Placement& place = groups_.placement();
  Allocator& alloc = options.alloc != nullptr ? *options.alloc : host_allocator();
  args_.symbols = symbols;
  args_.segments = options.segments;
  const std::vector<Shape> shapes = program.resolve_shapes(symbols);
  program.check_segments(symbols, options.segments);
  for (int id : program.inputs()) {
    const dsl::Stage& s = program.stage(id);
    if (!place.holds(s)) continue;
    const Shape local = dsl::local_shape(shapes[static_cast<size_t>(id)], s.type.layout,
                                         place.group_size, place.index);
    if (std::find(options.bound.begin(), options.bound.end(), s.name) != options.bound.end()) {
      // A placeholder of the right shape and no storage, until bind() gives it the caller's.
      args_.inputs[s.name] = Tensor::view_of(nullptr, s.type.dtype, local);
      unbound_.push_back(s.name);
      continue;
    }
    args_.inputs[s.name] = Tensor::zeros(s.type.dtype, local, alloc);
    bytes_ += args_.inputs[s.name].nbytes();
  }
  // Outputs in storage of their own (or the caller's, once bound), the same for every run, so
  // that another runner may bind one.
  for (const dsl::Output& o : program.outputs()) {
    const dsl::Stage& s = program.stage(o.stage);
    if (!place.holds(s)) continue;
    const Shape local = dsl::local_shape(shapes[static_cast<size_t>(o.stage)], s.type.layout,
                                         place.group_size, place.index);
    if (std::find(options.bound.begin(), options.bound.end(), o.name) != options.bound.end()) {
      outputs_[o.name] = Tensor::view_of(nullptr, s.type.dtype, local);
      unbound_.push_back(o.name);
      continue;
    }
    outputs_[o.name] = Tensor::zeros(s.type.dtype, local, alloc);
    bytes_ += outputs_[o.name].nbytes();
  }
}

Tensor ReferenceRunner::input(std::string_view name) const {
  auto it = args_.inputs.find(name);
  if (it == args_.inputs.end())
    user_error("program '{}' has no input '{}' on this rank", program_.name(), name);
  return it->second;
}

void ReferenceRunner::bind(std::string_view name, const Tensor& memory) {
  auto it = args_.inputs.find(name);
  TensorMap& where = it != args_.inputs.end() ? args_.inputs : outputs_;
  if (&where == &outputs_) it = outputs_.find(name);
  if (it == where.end())
    user_error("program '{}' has no input or output '{}' on this rank", program_.name(), name);
  it->second =
      checked_binding(program_.name(), name, it->second.shape(), it->second.dtype(), memory);
  std::erase(unbound_, std::string(name));
}

// A bad dropout seed is refused here, as the plan executors refuse it; an unknown name at run().
void ReferenceRunner::set_scalar(std::string_view name, double value) {
  for (int id : program_.scalars())
    if (program_.stage(id).name == name && keys_dropout(program_, id))
      dropout_seed(fmt::format("program '{}'", program_.name()), name, value);
  args_.scalars[std::string(name)] = value;
}

void ReferenceRunner::run() { run(nullptr); }

void ReferenceRunner::run_leaving_sends() { run(&sends_); }

void ReferenceRunner::wait_sends() { comm::wait_all(sends_); }

void ReferenceRunner::run(std::vector<comm::Request>* sends_left) {
  if (!unbound_.empty())
    user_error("program '{}': '{}' is to be bound, and is not; call bind first", program_.name(),
               unbound_[0]);
  const TensorMap values = run_reference(program_, groups_, args_, sends_left);
  for (const auto& [name, out] : outputs_) {
    auto it = values.find(name);
    TANDEM_CHECK(it != values.end() && it->second.nbytes() == out.nbytes(),
                 "program '{}' output '{}'", program_.name(), name);
    std::memcpy(out.data(), it->second.data(), out.nbytes());
  }
}

Tensor ReferenceRunner::output(std::string_view name) const {
  auto it = outputs_.find(name);
  if (it == outputs_.end())
    user_error("program '{}' gave this rank no output '{}'", program_.name(), name);
  return it->second;
}

}  // namespace tandem::exec
