// Proof of meaning for per-collective recipes: every schedule enumerate_schedules yields for a
// program with two collectives (each collective its own split, reorder, fusion and overlap, the
// state sliced or not), run by the plan runner on 1 to 3 ranks, equals the reference interpreter
// on the unscheduled program.
#include <gtest/gtest.h>

#include <mutex>

#include "exec/schedule_checks.h"
#include "tandem/comm/thread.h"

namespace tandem::schedule::testing {
namespace {

TEST(PerCollectiveEquivalence, EveryScheduleOfTwoCollectives) {
  comm::set_chunk_bytes(64);  // several chunks per fused hook on these small tensors
  const Case c = two_collectives_case(37, 9, 6, 5);
  const std::vector<Plan> plans = all_plans(c);
  EXPECT_EQ(plans.size(), 94u);  // distinct legal plans of the 2560 recipes
  for (int ranks = 1; ranks <= 3; ++ranks) {
    std::mutex mu;
    std::string failures;
    int checked = 0;
    comm::run_ranks(ranks, [&](comm::Communicator& comm) {
      const Outcome o = check_all_schedules(c, plans, comm);
      std::lock_guard<std::mutex> lock(mu);
      failures += o.failures;
      if (comm.rank() == 0) checked = o.schedules;
    });
    EXPECT_EQ(failures, "") << ranks << " ranks";
    EXPECT_EQ(checked, static_cast<int>(plans.size()));
  }
  comm::set_chunk_bytes(0);
}

// Collectives partitioned along an inner dim ([outer, rows, inner] with outer > 1, rows that do
// not divide by the ranks): a reduce-scatter along dim 1 of a Local [B, C, D] gradient, an update
// on the scattered part (fusable into the scatter's hook), and the gather back; every schedule by
// the plan runner on 1 to 4 ranks equals the reference interpreter.
TEST(PerCollectiveEquivalence, EveryScheduleOfCollectivesAlongAnInnerDim) {
  using namespace tandem::dsl;  // NOLINT: the builder's vocabulary
  comm::set_chunk_bytes(64);
  Program p("inner_dim");
  const Expr lr = p.scalar("lr");
  const Expr g = p.input(F32, {"B", "C", "D"}, Local, "g");
  const Expr w = p.input(F32, {"B", "C", "D"}, Sliced(1), "w");
  const Expr g_part = ReduceScatter(Sum, g, 1).named("g_part");
  const Expr w1 = update(w, w - lr * g_part).named("w1");
  p.output(AllGather(w1).named("w_all"), "w_all");
  const Case c{"inner_dim B=3 C=5 D=4", p, {{"B", 3}, {"C", 5}, {"D", 4}}, {{"lr", 0.01}}, 1};
  const std::vector<Plan> plans = all_plans(c);
  EXPECT_GE(plans.size(), 2u);
  for (int ranks = 1; ranks <= 4; ++ranks) {
    std::mutex mu;
    std::string failures;
    comm::run_ranks(ranks, [&](comm::Communicator& comm) {
      const Outcome o = check_all_schedules(c, plans, comm);
      std::lock_guard<std::mutex> lock(mu);
      failures += o.failures;
    });
    EXPECT_EQ(failures, "") << ranks << " ranks";
  }
  comm::set_chunk_bytes(0);
}

}  // namespace
}  // namespace tandem::schedule::testing
