// The Runner interface on all three executors: inputs bound to the caller's memory give the same
// results as inputs copied into the runner's storage, updated inputs are written in the caller's
// memory, bound inputs cost the runner no allocation, and binding errors name what is wrong.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "support/scratch.h"
#include "tandem/comm/thread.h"
#include "tandem/dsl/workloads.h"
#include "tandem/exec/runner.h"
#include "tandem/schedule/enumerate.h"

namespace tandem::exec {
namespace {

using ::testing::HasSubstr;

schedule::Plan plan_named(const dsl::Program& p, const std::string& name) {
  for (const schedule::NamedSchedule& ns : schedule::enumerate_schedules(p))
    if (ns.name == name) return ns.schedule.lower();
  ADD_FAILURE() << "no schedule " << name;
  return {};
}

void set_adam_scalars(Runner& r) {
  for (const auto& [name, v] : {std::pair<const char*, double>{"lr", 0.01}, {"beta1", 0.9}, {"beta2", 0.999},
                                {"eps", 1e-8}, {"weight_decay", 0.1}, {"step", 1}, {"grad_scale", 0.5}})
    r.set_scalar(name, v);
}

TEST(RunnerBind, BoundInputsMatchCopiedOnesOnEveryExecutor) {
  const int64_t n = 1001;  // uneven over 2 and 3 ranks
  const dsl::Program adam = dsl::workloads::adam(DType::F32);
  for (const std::string schedule : {"AR-C", "fused(RS-C-AG)+slice(m,v)"}) {
    const schedule::Plan plan = plan_named(adam, schedule);
    for (RunnerKind kind : {RunnerKind::Compiled, RunnerKind::Plan, RunnerKind::Reference})
      for (int ranks : {1, 2, 3})
        comm::run_ranks(ranks, [&](comm::Communicator& c) {
          const std::string what = schedule + " " + std::string(runner_kind_name(kind)) + " " + std::to_string(ranks);
          std::vector<float> g(n), w(n);
          for (int64_t i = 0; i < n; ++i) {
            g[static_cast<size_t>(i)] = 0.01f * static_cast<float>((i * 7 + c.rank()) % 13) - 0.06f;
            w[static_cast<size_t>(i)] = 0.5f - 0.001f * static_cast<float>(i % 101);
          }
          // Copied in, read back.
          std::unique_ptr<Runner> copied = make_runner(kind, plan, c, {{"N", n}});
          std::memcpy(copied->input("g").data(), g.data(), g.size() * 4);
          std::memcpy(copied->input("w").data(), w.data(), w.size() * 4);
          copied->input("m").fill(0.0f);
          copied->input("v").fill(0.0f);
          set_adam_scalars(*copied);
          copied->run();
          const Tensor want = copied->input("w");
          // Bound: never allocated, updated in place.
          RunnerOptions o;
          o.bound = {"g", "w"};
          std::unique_ptr<Runner> bound = make_runner(kind, plan, c, {{"N", n}}, o);
          EXPECT_LT(bound->allocated_bytes() + 2 * static_cast<size_t>(n) * 4, copied->allocated_bytes() + 1) << what;
          EXPECT_THAT(testing::user_error_of([&] { bound->run(); }), HasSubstr("is to be bound, and is not")) << what;
          bound->bind("g", Tensor::view_of(g.data(), DType::F32, Shape{n}));
          bound->bind("w", Tensor::view_of(w.data(), DType::F32, Shape{n}));
          bound->input("m").fill(0.0f);
          bound->input("v").fill(0.0f);
          set_adam_scalars(*bound);
          bound->run();
          EXPECT_EQ(bound->input("w").data(), static_cast<void*>(w.data())) << what;
          for (int64_t i = 0; i < n; ++i) ASSERT_EQ(w[static_cast<size_t>(i)], want.get(i)) << what << " at " << i;
        });
  }
}

TEST(RunnerBind, AWrongBindingNamesTheInputAndItsStoredShape) {
  const schedule::Plan plan = plan_named(dsl::workloads::adam(DType::F32), "fused(RS-C-AG)+slice(m,v)");
  for (RunnerKind kind : {RunnerKind::Compiled, RunnerKind::Plan, RunnerKind::Reference})
    comm::run_ranks(2, [&](comm::Communicator& c) {
      std::unique_ptr<Runner> r = make_runner(kind, plan, c, {{"N", 10}});
      std::vector<float> small(4);
      EXPECT_EQ(testing::user_error_of([&] { r->bind("m", Tensor::view_of(small.data(), DType::F32, Shape{4})); }),
                "program 'adam': input 'm' is stored as f32[5] on this rank; bound to f32[4]");
      EXPECT_THAT(testing::user_error_of([&] { r->bind("q", Tensor::view_of(small.data(), DType::F32, Shape{4})); }),
                  HasSubstr("no input"));
    });
}

}  // namespace
}  // namespace tandem::exec
