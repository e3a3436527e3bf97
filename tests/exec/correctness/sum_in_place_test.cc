// sum_in_place (update(g, AllReduce(Sum, g))): every schedule on every executor sums the ranks'
// g into each rank's own, bound buffer, at 1-4 ranks and an uneven size; compiled, the all-reduce
// schedule works in that buffer and allocates nothing of its size.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "support/schedules.h"
#include "tandem/comm/thread.h"
#include "tandem/dsl/workloads.h"
#include "tandem/exec/runner.h"
#include "tandem/schedule/enumerate.h"

namespace tandem::exec {
namespace {

float value_at(int rank, int64_t i) {
  return static_cast<float>(std::sin(0.3 * static_cast<double>(i) + rank));
}

TEST(SumInPlace, EveryScheduleSumsIntoTheBoundBuffer) {
  const int64_t n = 1003;
  const dsl::Program program = dsl::workloads::sum_in_place();
  const std::vector<schedule::NamedSchedule> schedules = schedule::enumerate_schedules(program);
  ASSERT_GE(schedules.size(), 2u);
  for (const schedule::NamedSchedule& ns : schedules) {
    const schedule::Plan plan = ns.schedule.lower();
    for (RunnerKind kind : {RunnerKind::Compiled, RunnerKind::Plan, RunnerKind::Reference})
      for (int ranks : {1, 2, 3, 4})
        comm::run_ranks(ranks, [&](comm::Communicator& c) {
          const std::string what =
              fmt::format("{} on {} at {} ranks", ns.name, runner_kind_name(kind), ranks);
          std::vector<float> g(n);
          for (int64_t i = 0; i < n; ++i) g[static_cast<size_t>(i)] = value_at(c.rank(), i);
          RunnerOptions o;
          o.bound = {"g"};
          std::unique_ptr<Runner> r = make_runner(kind, plan, c, {{"N", n}}, o);
          // (The plan runner, an interpreter, keeps f32 scratch for its chunks.)
          if (ns.name == "AR-C" && kind != RunnerKind::Plan) {
            EXPECT_LT(r->allocated_bytes(), 1024u) << what;
          }
          r->bind("g", Tensor::view_of(g.data(), DType::F32, Shape{n}));
          r->run();
          for (int64_t i = 0; i < n; ++i) {
            double want = 0;
            for (int q = 0; q < ranks; ++q) want += value_at(q, i);
            ASSERT_NEAR(g[static_cast<size_t>(i)], want, 1e-5) << what << " at " << i;
          }
        });
  }
}

}  // namespace
}  // namespace tandem::exec
