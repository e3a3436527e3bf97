// The data-parallel step in two halves (grad_reduce, then adam_update or lamb_update: what
// gradient clipping runs) against the one-program step under its ZeRO-1 schedule: with clip = 1
// bitwise the same weights and moments, and a clip of 1/2 is bitwise the one-program step on half
// the gradient scale (a power of two scales exactly). Every executor, 1-3 ranks, an uneven size,
// both gradient dtypes, two steps.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "support/schedules.h"
#include "tandem/comm/thread.h"
#include "tandem/core/dtype.h"
#include "tandem/dsl/workloads.h"
#include "tandem/exec/runner.h"

namespace tandem::exec {
namespace {

using tandem::testing::plan_named;

constexpr int64_t kN = 1001;  // uneven over 2 and 3 ranks

void set_hyper(Runner& r, int step) {
  for (const auto& [name, v] : {std::pair<const char*, double>{"lr", 0.01},
                                {"beta1", 0.9},
                                {"beta2", 0.999},
                                {"eps", 1e-8},
                                {"weight_decay", 0.1}})
    r.set_scalar(name, v);
  r.set_scalar("step", step);
}

float grad_at(int rank, int step, int64_t i) {
  return static_cast<float>(0.06 * std::cos(0.71 * i + 1.3 * rank + 0.5 * step));
}

struct Case {
  bool lamb;
  DType grad_dtype;
  RunnerKind kind;
  int ranks;
  std::string str() const {
    return fmt::format("{} g {} on {} at {} ranks", lamb ? "lamb" : "adam", dtype_name(grad_dtype),
                       runner_kind_name(kind), ranks);
  }
};

// Two steps of the one-program step with `grad_scale` on every rank's gradient, and of the two
// halves with `clip`; expects bitwise the same w, m and v.
void check(const Case& c, double grad_scale, double clip) {
  const schedule::Plan whole =
      plan_named(c.lamb ? dsl::workloads::lamb(c.grad_dtype) : dsl::workloads::adam(c.grad_dtype),
                 "fused(RS-C-AG)+slice(m,v)");
  const schedule::Plan reduce = plan_named(dsl::workloads::grad_reduce(c.grad_dtype), "C");
  const schedule::Plan update = plan_named(c.lamb ? dsl::workloads::lamb_update(c.grad_dtype)
                                                  : dsl::workloads::adam_update(c.grad_dtype),
                                           "fused(C)");
  comm::run_ranks(c.ranks, [&](comm::Communicator& comm) {
    const dsl::SymbolMap n{{"N", kN}};
    std::unique_ptr<Runner> one = make_runner(c.kind, whole, comm, n);
    std::unique_ptr<Runner> first = make_runner(c.kind, reduce, comm, n);
    RunnerOptions bound;
    bound.bound = {"g_sum"};
    std::unique_ptr<Runner> second = make_runner(c.kind, update, comm, n, bound);
    second->bind("g_sum", first->output("g_sum"));
    for (Runner* r : {one.get(), second.get()}) {
      // Full mantissas, so that sums in another order would show.
      for (int64_t i = 0; i < kN; ++i)
        r->input("w").set(i, static_cast<float>(0.5 * std::sin(0.37 * i + 0.1)));
      r->input("m").fill(0.0f);
      r->input("v").fill(0.0f);
    }
    for (int step = 1; step <= 2; ++step) {
      for (Runner* r : {one.get(), first.get()}) {
        const Tensor g = r->input("g");
        for (int64_t i = 0; i < kN; ++i) g.set(i, grad_at(comm.rank(), step, i));
      }
      set_hyper(*one, step);
      one->set_scalar("grad_scale", grad_scale * clip);
      one->run();
      first->run();
      set_hyper(*second, step);
      second->set_scalar("grad_scale", grad_scale);
      second->set_scalar("clip", clip);
      second->run();
      for (const char* name : {"w", "m", "v"}) {
        const Tensor want = one->input(name), got = second->input(name);
        ASSERT_EQ(want.numel(), got.numel()) << c.str() << " " << name;
        ASSERT_EQ(std::memcmp(want.data(), got.data(), want.nbytes()), 0)
            << c.str() << ": " << name << " differs at step " << step << " (clip " << clip << ")";
      }
    }
  });
}

class ClippedStep : public ::testing::TestWithParam<RunnerKind> {};

TEST_P(ClippedStep, TheTwoHalvesWithClipOneAreTheOneProgramStep) {
  for (bool lamb : {false, true})
    for (DType g : {DType::F32, DType::BF16})
      for (int ranks : {1, 2, 3}) check({lamb, g, GetParam(), ranks}, 1.0 / ranks, 1.0);
}

TEST_P(ClippedStep, AClipOfOneHalfIsHalfTheGradientScale) {
  for (bool lamb : {false, true})
    for (int ranks : {1, 2, 3}) check({lamb, DType::F32, GetParam(), ranks}, 1.0 / ranks, 0.5);
}

INSTANTIATE_TEST_SUITE_P(Executors, ClippedStep,
                         ::testing::Values(RunnerKind::Compiled, RunnerKind::Plan,
                                           RunnerKind::Reference),
                         [](const auto& info) {
                           return std::string(runner_kind_name(info.param));
                         });

}  // namespace
}  // namespace tandem::exec
