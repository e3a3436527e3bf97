// Shared by the compiled-plan suites (thread backend and mpirun): every enumerated schedule of a
// program, emitted and compiled once per process (the source does not depend on sizes or rank
// counts), run by exec/compiled and compared with the reference interpreter on the unscheduled
// program, with the inputs and comparison of exec/schedule_checks.h.
//
// Equality. Bitwise wherever the plan runner is bitwise (exec/schedule_checks.h: keeps_order), with
// one more exception that is the compiled code's own: a reducing collective on bf16/f16 values
// reduces in that dtype on the wire (half the bytes), and the ring algorithm rounds after each of
// its p - 1 steps, where the reference reduces f32 copies and rounds once. The thread backend's
// direct algorithm combines every rank's values in f32 and rounds once, as the reference does, and
// a ring of 2 rounds once too, so this only concerns the ring (MPI) on 3 or more ranks. There the
// reduced value may differ by p - 2 extra roundings, each at most half an ulp of bf16 (2^-8
// relative), about 0.8% for p = 4; what is computed from it moves by the same relative amount
// (the inputs of exec/schedule_checks.h are positive, so nothing cancels), hence 1e-2 relative.
#pragma once

#include <fmt/format.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "exec/schedule_checks.h"
#include "tandem/exec/compiled.h"
#include "tandem/schedule/enumerate.h"

namespace tandem::codegen::testing {

using schedule::Plan;
using schedule::Step;
using schedule::StepKind;
using schedule::testing::Case;

// The compiled module of `plan`, compiled at most once per process and kept loaded.
inline std::shared_ptr<const exec::CompiledPlan> compiled(const Plan& plan) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const exec::CompiledPlan>> cache;
  std::lock_guard<std::mutex> lock(mu);
  const std::string key = plan.program.name() + "\n" + plan.str();
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  return cache[key] = exec::compile_plan(plan);
}

struct Schedules {
  std::vector<std::string> names;
  std::vector<std::shared_ptr<const exec::CompiledPlan>> plans;
};

// Every schedule of `program`, lowered and compiled (call once, before the ranks start).
inline Schedules compile_all(const dsl::Program& program) {
  Schedules s;
  for (const schedule::NamedSchedule& ns : schedule::enumerate_schedules(program)) {
    s.names.push_back(ns.name);
    s.plans.push_back(compiled(ns.schedule.lower()));
  }
  return s;
}

// Whether a reducing collective of the plan reduces bf16/f16 values on a ring of >= 3 ranks.
inline bool rounds_per_hop(const Plan& plan, comm::Backend backend, int ranks) {
  if (backend == comm::Backend::Thread || ranks / plan.program.groups() < 3) return false;
  bool narrow = false;
  std::function<void(const Step&)> visit = [&](const Step& s) {
    if (s.kind == StepKind::Collective &&
        (s.collective.op == dsl::Op::AllReduce || s.collective.op == dsl::Op::ReduceScatter))
      narrow |= plan.program.stage(s.collective.stage).type.dtype != DType::F32;
    if (s.kind == StepKind::Pipeline)
      for (const Step& b : s.pipeline.body) visit(b);
  };
  for (const Step& s : plan.steps) visit(s);
  return narrow;
}

// |got - want| <= atol + rtol |want| everywhere, else a labelled report.
inline std::string compare_within(const std::string& label, const Tensor& got, const Tensor& want,
                                  double rtol, double atol) {
  if (got.dtype() != want.dtype() || !(got.shape() == want.shape()))
    return fmt::format("{}: got {}, want {}\n", label, got.str(), want.str());
  int64_t bad = 0;
  double max_diff = 0;
  std::string first;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.get(i), w = want.get(i);
    if ((std::isnan(g) && std::isnan(w)) || std::abs(g - w) <= atol + rtol * std::abs(w)) continue;
    max_diff = std::max(max_diff, std::abs(g - w));
    if (++bad <= 4) first += fmt::format(" [{}]={:.9g} (want {:.9g})", i, g, w);
  }
  if (bad == 0) return "";
  return fmt::format("{}: {} of {} elements differ (rtol {}, atol {}), max |diff| {:.3g}:{}\n",
                     label, bad, got.numel(), rtol, atol, max_diff, first);
}

struct Outcome {
  int schedules = 0;
  int bitwise = 0;
  std::string failures;
};

// Runs the reference once, then every compiled schedule, on `comm` (every rank calls it).
inline Outcome check_compiled(const Case& c, const Schedules& all, comm::Communicator& comm,
                              exec::CompiledOptions options = {}) {
  using schedule::testing::compare;
  using schedule::testing::make_inputs;
  Outcome out;
  exec::RunArgs ref_args{c.symbols, c.scalars, make_inputs(c.program, c.symbols, comm)};
  const exec::TensorMap ref = exec::run_reference(c.program, comm, ref_args);
  const exec::Placement pl = exec::placement(c.program, comm);
  for (size_t k = 0; k < all.plans.size(); ++k) {
    const Plan& plan = all.plans[k]->plan();
    const std::string where =
        fmt::format("{} / {} on rank {} of {}", c.label, all.names[k], comm.rank(), comm.size());
    const bool per_hop =
        !options.reduce_in_f32 && rounds_per_hop(plan, comm.backend(), comm.size());
    const bool bitwise =
        schedule::testing::keeps_order(plan, c.program, comm.backend(), comm.size()) && !per_hop;
    // Per-hop rounding of a bf16/f16 sum: up to p - 2 extra half-ulps of the narrow dtype.
    auto check = [&](const std::string& label, const Tensor& got, const Tensor& want) {
      if (!per_hop) return compare(label, got, want, bitwise);
      return compare_within(label, got, want, 1e-2, 1e-3);
    };
    try {
      exec::CompiledRunner runner(all.plans[k], comm, c.symbols, {}, options);
      for (const auto& [name, v] : c.scalars) runner.set_scalar(name, v);
      const exec::TensorMap inputs = make_inputs(c.program, c.symbols, comm);
      for (const auto& [name, t] : inputs) runner.load(name, t);
      runner.run();
      ++out.schedules;
      out.bitwise += bitwise ? 1 : 0;
      for (const auto& [name, want] : ref)
        out.failures += check(fmt::format("{}: output {}", where, name), runner.output(name), want);
      for (int id : c.program.inputs()) {
        const dsl::Stage& s = c.program.stage(id);
        if (!pl.holds(s) || c.program.updater(id) < 0) continue;
        const Tensor& want = ref_args.inputs.at(s.name);
        const Tensor have = runner.input(s.name);
        const dsl::Stage& stored = plan.program.stage(*plan.program.find(s.name));
        out.failures += check(fmt::format("{}: updated {}", where, s.name), have,
                              exec::piece_of(want, stored.type.layout, pl.group_size, pl.index));
      }
    } catch (const std::exception& e) {
      out.failures += fmt::format("{}: threw: {}\n", where, e.what());
    }
  }
  return out;
}

}  // namespace tandem::codegen::testing
