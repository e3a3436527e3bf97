// sum_in_place (update(g, AllReduce(Sum, g))): every schedule on every executor sums the ranks'
// g into each rank's own, bound buffer, at 1-4 ranks and an uneven size, with an f32 or a bf16
// wire; compiled, the f32 all-reduce schedule works in that buffer and allocates nothing of its
// size (the bf16 one, one bf16 copy).
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

// g stays f32 in place whatever the wire; a bf16 wire rounds each rank's g to bf16 (to nearest:
// at most half bf16's spacing, 2^-8 of it, bf16 carrying 8 significant bits) and the sum once more
// (2^-8 of the sum; the thread backend combines the ranks in f32 and rounds once), so
// |got - sum| <= 2^-8 (sum of |g_q| + |sum|), and 1e-5 in f32.
TEST(SumInPlace, EveryScheduleSumsIntoTheBoundBuffer) {
  const int64_t n = 1003;
  for (const DType wire : {DType::F32, DType::BF16}) {
    const dsl::Program program = dsl::workloads::sum_in_place(wire);
    const std::vector<schedule::NamedSchedule> schedules = schedule::enumerate_schedules(program);
    ASSERT_GE(schedules.size(), 2u);
    for (const schedule::NamedSchedule& ns : schedules) {
      const schedule::Plan plan = ns.schedule.lower();
      for (RunnerKind kind : {RunnerKind::Compiled, RunnerKind::Plan, RunnerKind::Reference})
        for (int ranks : {1, 2, 3, 4})
          comm::run_ranks(ranks, [&](comm::Communicator& c) {
            const std::string what = fmt::format("{} wire {} on {} at {} ranks", ns.name,
                                                 dtype_name(wire), runner_kind_name(kind), ranks);
            std::vector<float> g(n);
            for (int64_t i = 0; i < n; ++i) g[static_cast<size_t>(i)] = value_at(c.rank(), i);
            RunnerOptions o;
            o.bound = {"g"};
            std::unique_ptr<Runner> r = make_runner(kind, plan, c, {{"N", n}}, o);
            // (The plan runner, an interpreter, keeps f32 scratch for its chunks.) In bf16 the
            // all-reduce works in one bf16 copy of g: half its bytes.
            if (ns.name == "AR-C" && kind != RunnerKind::Plan) {
              const size_t copy = wire == DType::F32 ? 0 : static_cast<size_t>(n) * 2;
              EXPECT_LT(r->allocated_bytes(), copy + 1024u) << what;
            }
            r->bind("g", Tensor::view_of(g.data(), DType::F32, Shape{n}));
            r->run();
            for (int64_t i = 0; i < n; ++i) {
              double want = 0, magnitude = 0;
              for (int q = 0; q < ranks; ++q) {
                want += value_at(q, i);
                magnitude += std::abs(value_at(q, i));
              }
              const double tol =
                  wire == DType::F32 ? 1e-5 : 0x1p-8 * (magnitude + std::abs(want)) + 1e-7;
              ASSERT_NEAR(g[static_cast<size_t>(i)], want, tol) << what << " at " << i;
            }
          });
    }
  }
}

}  // namespace
}  // namespace tandem::exec
