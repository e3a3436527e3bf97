// What the four examples share: where the ranks come from (threads of this process, or MPI
// processes under mpirun), printing on one rank, inputs drawn from a fixed hash, and the check
// that runs a compiled schedule and the reference interpreter on the same inputs and compares.
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/comm/mpi.h"
#include "tandem/comm/thread.h"
#include "tandem/exec/compiled.h"
#include "tandem/exec/runner.h"
#include "tandem/schedule/recipe.h"

namespace example {

using namespace tandem;

// The command line: `example [ranks] [sizes...]` on in-process ranks, `mpirun -np R example
// [sizes...]` on MPI processes (one rank each).
struct Launch {
  Launch(int argc, char** argv, int default_ranks) : mpi(comm::launched_by_mpirun()) {
    const int first = mpi ? 1 : 2;
    if (mpi) world = comm::mpi_world();
    ranks = mpi ? world->size() : (argc > 1 ? std::atoi(argv[1]) : default_ranks);
    for (int i = first; i < argc; ++i) sizes.emplace_back(argv[i]);
  }
  // Size argument i, or `fallback` when not given.
  int64_t size(size_t i, int64_t fallback) const {
    return i < sizes.size() ? std::atoll(sizes[i].c_str()) : fallback;
  }
  // Whether this process prints what every rank would print alike (rank 0's process).
  bool root() const { return !mpi || world->rank() == 0; }
  // Prints a heading and a program or plan, once.
  void show(std::string_view heading, const std::string& text) const {
    if (root()) fmt::print("=== {}\n{}\n", heading, text);
  }
  // Calls fn on every rank (this process's MPI rank, or `ranks` threads); whether it returned
  // true on every one of them.
  bool run(const std::function<bool(comm::Communicator&)>& fn) const {
    if (mpi) return fn(*world);
    std::atomic<bool> ok{true};
    comm::run_ranks(ranks, [&](comm::Communicator& comm) {
      if (!fn(comm)) ok = false;
    });
    return ok;
  }
  bool mpi;
  int ranks;
  std::unique_ptr<comm::Communicator> world;
  std::vector<std::string> sizes;
};

// Whether `s` lowers to the same plan as the schedule its name describes (schedule::Recipe: the
// name the tuner and `tandem emit --schedule` use); says which, once.
inline bool same_as_recipe(const Launch& launch, const schedule::Schedule& s) {
  auto steps = [](const schedule::Schedule& x) {  // the plan without its first line, the name
    const std::string text = x.lower().str();
    return text.substr(text.find('\n'));
  };
  const bool same = steps(schedule::schedule_by_name(s.original(), s.name()).schedule) == steps(s);
  if (launch.root())
    fmt::print("{} the plan the recipe {} describes\n", same ? "same as" : "MISMATCH: not",
               s.name());
  return same;
}

// The hyperparameters of one Adam or LAMB step; grad_scale averages the summed gradients.
inline exec::ScalarMap optimizer_scalars(int ranks) {
  return {{"lr", 1e-3},           {"beta1", 0.9}, {"beta2", 0.999},           {"eps", 1e-8},
          {"weight_decay", 0.01}, {"step", 3},    {"grad_scale", 1.0 / ranks}};
}

// Element i of input `name`: uniform in [0, 1) (a second moment must not be negative), from a
// hash of the name, the index and, for a Local input (each rank holds its own), the rank; so the
// whole tensors are the same on any rank count.
inline float random_value(std::string_view name, int64_t i, int rank) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a of the name, then a splitmix64 finish
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  h += static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull +
       static_cast<uint64_t>(rank + 1) * 0xC2B2AE3D27D4EB4Full;
  h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
  h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
  return static_cast<float>((h ^ (h >> 31)) >> 41) / static_cast<float>(1 << 23);
}

// The largest |got - want|; clears `ok` where an element differs by more than allowed (by any
// bit, when rtol is 0).
inline double max_difference(const Tensor& got, const Tensor& want, double rtol, bool& ok) {
  if (got.dtype() != want.dtype() || got.numel() != want.numel()) {
    ok = false;
    return INFINITY;
  }
  double worst = 0;
  const size_t es = dtype_size(got.dtype());
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.get(i), w = want.get(i), d = std::abs(g - w);
    worst = std::max(worst, d);
    const size_t at = static_cast<size_t>(i) * es;
    if (rtol == 0)
      ok &= std::memcmp(static_cast<const char*>(got.data()) + at,
                        static_cast<const char*>(want.data()) + at, es) == 0;
    else
      ok &= (std::isnan(g) && std::isnan(w)) || d <= 1e-6 + rtol * std::abs(w);
  }
  return worst;
}

// Runs `compiled` with the compiled executor and `program` (as written) with the reference
// interpreter on the same random inputs, on every rank; compares every output and every input
// updated in place (this rank's slice where the schedule stores it sliced), bitwise when `rtol`
// is 0, else within |diff| <= 1e-6 + rtol |want|. The first rank of each group prints the verdict
// over all ranks; every rank returns it.
inline bool check_against_reference(const dsl::Program& program,
                                    std::shared_ptr<const exec::CompiledPlan> compiled,
                                    comm::Communicator& comm, const dsl::SymbolMap& symbols,
                                    const exec::ScalarMap& scalars, double rtol) {
  const dsl::Program& scheduled = compiled->plan().program;
  exec::RunnerOptions options;
  options.compiled = compiled;  // compiled once, shared by every rank of this process
  std::unique_ptr<exec::Runner> runner =
      exec::make_runner(exec::RunnerKind::Compiled, compiled->plan(), comm, symbols, options);
  const exec::Placement place = exec::placement(program, comm);
  const std::vector<Shape> shapes = program.resolve_shapes(symbols);
  exec::RunArgs ref{symbols, scalars, {}};
  auto stored_piece = [&](const Tensor& whole, std::string_view name) {
    return exec::piece_of(whole, scheduled.stage(*scheduled.find(name)).type.layout,
                          place.group_size, place.index);
  };
  std::set<std::string> sliced;      // inputs the schedule stores sliced (as_slice)
  for (int id : program.inputs()) {  // the whole tensor; each executor gets the piece it stores
    const dsl::Stage& in = program.stage(id);
    if (!place.holds(in)) continue;
    Tensor whole = Tensor::empty(in.type.dtype, shapes[static_cast<size_t>(id)]);
    for (int64_t i = 0; i < whole.numel(); ++i)
      whole.set(i, random_value(in.name, i, in.type.layout.is_local() ? comm.rank() : -1));
    ref.inputs[in.name] =
        exec::piece_of(whole, in.type.layout, place.group_size, place.index).clone();
    const Tensor mine = stored_piece(whole, in.name);
    if (scheduled.stage(*scheduled.find(in.name)).type.layout != in.type.layout)
      sliced.insert(in.name);
    std::memcpy(runner->input(in.name).data(), mine.data(), mine.nbytes());
  }
  for (const auto& [name, value] : scalars) runner->set_scalar(name, value);
  runner->run();
  exec::TensorMap want = exec::run_reference(program, comm, ref);
  for (const auto& [name, t] : ref.inputs)
    if (program.updater(*program.find(name)) >= 0) want[name] = t;

  bool ok = true;
  double worst = 0;
  std::string names;
  for (const auto& [name, got] : runner->results()) {
    const bool slice = sliced.count(name) > 0;
    worst = std::max(
        worst,
        max_difference(got, slice ? stored_piece(want.at(name), name) : want.at(name), rtol, ok));
    names += fmt::format("{}{}{}", names.empty() ? "" : ", ", name, slice ? " (slice)" : "");
  }
  // The verdict of every rank: the largest difference and whether any rank mismatched.
  Tensor all = Tensor::empty(DType::F32, Shape{2});
  all.set(0, static_cast<float>(worst));
  all.set(1, ok ? 0.0f : 1.0f);
  comm.all_reduce(all, comm::ReduceOp::Max);
  ok = all.get(1) == 0.0f;
  if (place.index == 0)  // one line per group, naming what it compared
    fmt::print(
        "compiled vs reference on {} ranks ({}){}: {}; max |diff| over all ranks {:.3g} ({}): {}\n",
        comm.size(), comm::backend_name(comm.backend()),
        program.groups() > 1 ? fmt::format(", group {}", place.group) : "", names, all.get(0),
        rtol == 0 ? "bitwise" : fmt::format("tolerance {:g} relative", rtol),
        ok ? "OK" : "MISMATCH");
  return ok;
}

}  // namespace example
