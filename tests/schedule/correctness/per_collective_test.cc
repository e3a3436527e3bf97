// Proof of meaning for per-collective recipes: every schedule enumerate_schedules yields for a
// program with two collectives (each collective its own split, reorder, fusion and overlap, the
// state sliced or not), run by the plan runner on 1 to 3 ranks, equals the reference interpreter
// on the unscheduled program.
#include <gtest/gtest.h>

#include <mutex>

#include "schedule/testing.h"
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

}  // namespace
}  // namespace tandem::schedule::testing
