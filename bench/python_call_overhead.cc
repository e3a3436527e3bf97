// The C++ side of bench/python_torch_fused_adamw.py's per-call figure: the adam schedule
// fused(RS-C-AG)+slice(m,v) compiled, set up once on this rank of the MPI world with its inputs
// bound (in the shared arena, as the Python side's world.empty arrays are), then run many times;
// prints rank 0's median microseconds a call, which Bound.run's is compared with
// (docs/benchmarks.md). mpirun -np 2 build/release/bench/bench_python_call_overhead N CALLS
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "tandem/comm/mpi.h"
#include "tandem/dsl/workloads.h"
#include "tandem/exec/compiled.h"
#include "tandem/exec/runner.h"
#include "tandem/schedule/recipe.h"

using namespace tandem;

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 16;
  const int calls = argc > 2 ? std::atoi(argv[2]) : 2000;
  auto world = comm::mpi_world();
  const dsl::Program program = dsl::workloads::adam(DType::F32);
  const schedule::NamedSchedule s =
      schedule::schedule_by_name(program, "fused(RS-C-AG)+slice(m,v)");
  const schedule::Plan plan = s.schedule.lower();
  exec::RunnerOptions o;
  o.compiled = exec::compile_plan(plan);
  o.bound = {"g", "w", "m", "v"};
  auto runner =
      exec::make_runner(exec::RunnerKind::Compiled, o.compiled->plan(), *world, {{"N", n}}, o);
  Allocator& a = world->allocator();
  const int64_t part = n / world->size() + (world->rank() < n % world->size() ? 1 : 0);
  std::vector<Tensor> keep;
  for (auto [name, count] : {std::pair{"g", n}, {"w", n}, {"m", part}, {"v", part}}) {
    keep.push_back(Tensor::zeros(DType::F32, Shape{count}, a));
    runner->bind(name, keep.back());
  }
  for (auto [k, v] : {std::pair{"lr", 1e-3},
                      {"beta1", 0.9},
                      {"beta2", 0.999},
                      {"eps", 1e-8},
                      {"weight_decay", 0.0},
                      {"step", 1.0},
                      {"grad_scale", 0.5}})
    runner->set_scalar(k, v);
  // Checked first: every gradient 1 on every rank and the weights 0 make AdamW's first step
  // -lr * 1 / (1 + eps) in every weight.
  keep[0].fill(1.0f);
  runner->run();
  for (int64_t i : {int64_t{0}, n - 1})
    if (std::abs(keep[1].get(i) + 1e-3f) > 1e-8f) {
      std::fprintf(stderr, "rank %d: w[%lld] = %g after one step, not -1e-3\n", world->rank(),
                   static_cast<long long>(i), static_cast<double>(keep[1].get(i)));
      comm::abort_mpi_job(1);
    }
  std::vector<double> us;
  for (int i = 0; i < calls; ++i) {
    world->barrier();
    const auto t0 = std::chrono::steady_clock::now();
    runner->run();
    us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(us.begin(), us.begin() + us.size() / 2, us.end());
  if (world->rank() == 0)
    std::printf(
        "C++ runner->run(), adam fused(RS-C-AG)+slice(m,v), N = %lld: median %.1f us a call over "
        "%d calls\n",
        static_cast<long long>(n), us[us.size() / 2], calls);
}
