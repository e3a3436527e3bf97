// The Runner interface on all three executors: inputs bound to the caller's memory give the same
// results as inputs copied into the runner's storage, updated inputs are written in the caller's
// memory, bound inputs cost the runner no allocation, and binding errors name what is wrong.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "support/schedules.h"
#include "support/scratch.h"
#include "tandem/comm/thread.h"
#include "tandem/dsl/dsl.h"
#include "tandem/dsl/workloads.h"
#include "tandem/exec/runner.h"
#include "tandem/schedule/enumerate.h"
#include "tandem/schedule/schedule.h"

namespace tandem::exec {
namespace {

using ::testing::HasSubstr;

using tandem::testing::plan_named;

void set_adam_scalars(Runner& r) {
  for (const auto& [name, v] : {std::pair<const char*, double>{"lr", 0.01},
                                {"beta1", 0.9},
                                {"beta2", 0.999},
                                {"eps", 1e-8},
                                {"weight_decay", 0.1},
                                {"step", 1},
                                {"grad_scale", 0.5}})
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
          const std::string what =
              schedule + " " + std::string(runner_kind_name(kind)) + " " + std::to_string(ranks);
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
          EXPECT_LT(bound->allocated_bytes() + 2 * static_cast<size_t>(n) * 4,
                    copied->allocated_bytes() + 1)
              << what;
          EXPECT_THAT(testing::user_error_of([&] { bound->run(); }),
                      HasSubstr("is to be bound, and is not"))
              << what;
          bound->bind("g", Tensor::view_of(g.data(), DType::F32, Shape{n}));
          bound->bind("w", Tensor::view_of(w.data(), DType::F32, Shape{n}));
          bound->input("m").fill(0.0f);
          bound->input("v").fill(0.0f);
          set_adam_scalars(*bound);
          bound->run();
          EXPECT_EQ(bound->input("w").data(), static_cast<void*>(w.data())) << what;
          for (int64_t i = 0; i < n; ++i)
            ASSERT_EQ(w[static_cast<size_t>(i)], want.get(i)) << what << " at " << i;
        });
  }
}

TEST(RunnerBind, AWrongBindingNamesTheInputAndItsStoredShape) {
  const schedule::Plan plan =
      plan_named(dsl::workloads::adam(DType::F32), "fused(RS-C-AG)+slice(m,v)");
  for (RunnerKind kind : {RunnerKind::Compiled, RunnerKind::Plan, RunnerKind::Reference})
    comm::run_ranks(2, [&](comm::Communicator& c) {
      std::unique_ptr<Runner> r = make_runner(kind, plan, c, {{"N", 10}});
      std::vector<float> small(4);
      EXPECT_EQ(testing::user_error_of(
                    [&] { r->bind("m", Tensor::view_of(small.data(), DType::F32, Shape{4})); }),
                "program 'adam': input 'm' is stored as f32[5] on this rank; bound to f32[4]");
      EXPECT_THAT(testing::user_error_of(
                      [&] { r->bind("q", Tensor::view_of(small.data(), DType::F32, Shape{4})); }),
                  HasSubstr("no input"));
    });
}

// A bound output is computed in the caller's memory (with every value the plan keeps in its
// buffer): bitwise the output of a run that stores it, for every schedule of the Megatron layer
// on every executor, and the buffer is not allocated.
TEST(RunnerBind, BoundOutputsAreComputedInTheCallersMemory) {
  const int64_t B = 7, K = 12, H = 10;  // K over 2 and 3 ranks; B uneven
  const dsl::Program program = dsl::workloads::megatron_layer(DType::F32, 0.25);
  const std::vector<schedule::NamedSchedule> schedules = schedule::enumerate_schedules(program);
  for (const schedule::NamedSchedule& ns : schedules) {
    const schedule::Plan plan = ns.schedule.lower();
    for (RunnerKind kind : {RunnerKind::Compiled, RunnerKind::Plan, RunnerKind::Reference})
      for (int ranks : {1, 2, 3})
        comm::run_ranks(ranks, [&](comm::Communicator& c) {
          const std::string what =
              ns.name + " " + std::string(runner_kind_name(kind)) + " " + std::to_string(ranks);
          auto fill = [&](Runner& r) {
            for (const char* name : {"x", "w", "bias", "residual"}) {
              const Tensor t = r.input(name);
              for (int64_t i = 0; i < t.numel(); ++i)
                t.set(i, 0.05f * static_cast<float>((i * 5 + c.rank() * 3 + name[0]) % 17) - 0.4f);
            }
            r.set_scalar("seed", 11);
          };
          std::unique_ptr<Runner> stored =
              make_runner(kind, plan, c, {{"B", B}, {"K", K}, {"H", H}});
          fill(*stored);
          stored->run();
          RunnerOptions o;
          o.bound = {"out"};
          std::unique_ptr<Runner> bound =
              make_runner(kind, plan, c, {{"B", B}, {"K", K}, {"H", H}}, o);
          EXPECT_LE(bound->allocated_bytes() + static_cast<size_t>(B * H) * 4,
                    stored->allocated_bytes())
              << what;
          fill(*bound);
          EXPECT_THAT(testing::user_error_of([&] { bound->run(); }),
                      HasSubstr("'out' is to be bound, and is not"))
              << what;
          std::vector<float> out(static_cast<size_t>(B * H), -1.0f);
          bound->bind("out", Tensor::view_of(out.data(), DType::F32, Shape{B, H}));
          bound->run();
          EXPECT_EQ(bound->output("out").data(), static_cast<void*>(out.data())) << what;
          const Tensor want = stored->output("out");
          for (int64_t i = 0; i < B * H; ++i)
            ASSERT_EQ(out[static_cast<size_t>(i)], want.get(i)) << what << " at " << i;
        });
  }
}

TEST(RunnerBind, AnUnknownNameIsNamed) {
  const schedule::Plan plan = plan_named(dsl::workloads::megatron_layer(DType::F32, 0.0), "AR-C");
  for (RunnerKind kind : {RunnerKind::Compiled, RunnerKind::Plan, RunnerKind::Reference})
    comm::run_ranks(1, [&](comm::Communicator& c) {
      RunnerOptions o;
      o.bound = {"outt"};
      if (kind != RunnerKind::Reference) {
        EXPECT_EQ(
            testing::user_error_of([&] {
              make_runner(kind, plan, c, {{"B", 2}, {"K", 2}, {"H", 2}}, o);
            }),
            "plan 'AR-C': program 'megatron_layer' has no input or output named 'outt' (these "
            "can be bound: x, w, bias, residual, out)");
      }
      std::unique_ptr<Runner> r = make_runner(kind, plan, c, {{"B", 2}, {"K", 2}, {"H", 2}});
      std::vector<float> mem(4);
      EXPECT_THAT(testing::user_error_of(
                      [&] { r->bind("outt", Tensor::view_of(mem.data(), DType::F32, Shape{4})); }),
                  HasSubstr("no input or output"));
    });
}

// The outputs no caller can bind say why: one computed in an input's buffer (the caller binds
// that input instead), and one stored block by block inside an overlap (no whole buffer holds it).
TEST(RunnerBind, OutputsThatCannotBeBoundSayWhy) {
  using namespace dsl;  // NOLINT: the builder's vocabulary
  Program in_place("in_place_out");
  const Expr g = in_place.input(F32, {"N"}, Local, "g");
  in_place.output(update(g, AllReduce(Sum, g).named("g_sum")).named("g1"), "sum");
  const schedule::Plan in_place_plan = schedule::Schedule(in_place).lower();

  Program blocked("blocked_out");
  const Expr x = blocked.input(F32, {"B", "K"}, Local, "x");
  const Expr w = blocked.input(F32, {"K", "H"}, Local, "w");
  blocked.output(ReduceScatter(Sum, matmul(x, w).named("y")).named("r"), "r");
  schedule::Schedule overlapped(blocked);
  overlapped.overlap({"y", "r"});
  const schedule::Plan blocked_plan = overlapped.lower();

  for (RunnerKind kind : {RunnerKind::Compiled, RunnerKind::Plan})
    comm::run_ranks(2, [&](comm::Communicator& c) {
      RunnerOptions o;
      o.bound = {"sum"};
      EXPECT_EQ(
          testing::user_error_of([&] {
            make_runner(kind, in_place_plan, c, {{"N", 8}}, o);
          }),
          fmt::format("plan '{}': output 'sum' is computed in input 'g''s buffer; bind that input",
                      in_place_plan.name));
      o.bound = {"r"};
      EXPECT_EQ(testing::user_error_of([&] {
                  make_runner(kind, blocked_plan, c, {{"B", 8}, {"K", 4}, {"H", 4}}, o);
                }),
                fmt::format("plan '{}': output 'r' is stored block by block under this schedule "
                            "and cannot be bound",
                            blocked_plan.name));
    });
}

}  // namespace
}  // namespace tandem::exec
