// `tandem emit`: prints the source the code generator emits for one named schedule of a workload.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>
#include <vector>

#include "commands.h"
#include "tandem/codegen/cpp.h"
#include "tandem/core/error.h"
#include "tandem/schedule/lower.h"
#include "tandem/tune/tune.h"

namespace tandem::cli {
namespace {

struct EmitFlags {
  std::string workload;
  std::string schedule;
  std::string target = "cpp";
  std::string dtype;
  bool list = false;
};

void run_emit(const EmitFlags& f) {
  const std::vector<std::string> targets = {"cpp"};
  if (f.target != "cpp") user_error("--target '{}' is not a target; targets: {}", f.target, fmt::join(targets, ", "));
  const dsl::Program program = workload_program(f.workload, f.dtype);
  if (f.list || f.schedule.empty()) {
    std::vector<std::string> names;
    for (const auto& s : schedule::enumerate_schedules(program)) names.push_back(s.name);
    if (f.list) {
      for (const auto& n : names) fmt::print("{}\n", n);
      return;
    }
    user_error("give --schedule NAME; the schedules of '{}' are: {}", f.workload, fmt::join(names, ", "));
  }
  const schedule::NamedSchedule s = tune::schedule_by_name(program, f.schedule);
  fmt::print("{}", codegen::emit_cpp(s.schedule.lower()));
}

}  // namespace

void add_emit(CLI::App& app) {
  auto f = std::make_shared<EmitFlags>();
  auto* cmd = app.add_subcommand("emit", "Print the source generated for one schedule of a workload");
  cmd->add_option("workload", f->workload, "adam, lamb, megatron_layer or pipeline_stage")->required();
  cmd->add_option("--schedule", f->schedule, "The schedule's name, as `tandem tune` or --list prints it");
  cmd->add_option("--target", f->target, "What to emit: cpp (the CPU JIT's C++)")->capture_default_str();
  cmd->add_option("--dtype", f->dtype, "Gradient dtype (adam, lamb) or tensor dtype (layers): f32, bf16, f16");
  cmd->add_flag("--list", f->list, "List the workload's schedules instead");
  cmd->callback([f] { run_emit(*f); });
}

}  // namespace tandem::cli
