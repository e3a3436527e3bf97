// A bad TANDEM_RANKS_PER_NODE (not a whole number of ranks, or not a divisor of the world) ends in
// one clear error: from run_ranks, and from the tandem command as a user reads it.
#include <gtest/gtest.h>

#include <string>

#include "comm/testing.h"
#include "support/cli.h"
#include "tandem/comm/thread.h"
#include "tandem/core/error.h"

namespace tandem::comm::testing {
namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const UserError& e) {
    return e.what();
  }
  return "no error";
}

TEST(RanksPerNode, MustDivideTheRanks) {
  ScopedRanksPerNode nodes(3);
  EXPECT_EQ(error_of([] { run_ranks(4, [](Communicator&) {}); }),
            "TANDEM_RANKS_PER_NODE=3 does not divide the 4 ranks into whole nodes; use a divisor "
            "of 4");
  EXPECT_EQ(error_of([] { run_ranks(6, [](Communicator&) {}); }), "no error");
}

// The variable as the tandem command reads it: every bad value, one line, exit status 1.
TEST(RanksPerNode, BadValuesFromTheEnvironment) {
  const std::string train = "train --model tiny --steps 1 --executor plan --eval-every 0";
  for (const char* bad : {"abc", "0", "-2", "2x", "1.5"}) {
    const auto r = tandem::testing::run_command(fmt::format(
        "TANDEM_RANKS_PER_NODE='{}' '{}' {}", bad, tandem::testing::tandem_binary(), train));
    EXPECT_EQ(r.status, 1) << r.output;
    EXPECT_EQ(r.output,
              fmt::format("tandem: error: TANDEM_RANKS_PER_NODE={} is not a number of ranks: "
                          "expected a whole number of 1 or more (how many consecutive ranks "
                          "behave as one node), or unset to let the machine decide\n",
                          bad));
  }
  // dp=2 x tp=2: 4 ranks, which nodes of 3 cannot hold.
  const auto r = tandem::testing::run_command(
      fmt::format("TANDEM_RANKS_PER_NODE=3 '{}' {}", tandem::testing::tandem_binary(), train));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_EQ(r.output,
            "tandem: error: TANDEM_RANKS_PER_NODE=3 does not divide the 4 ranks into whole "
            "nodes; use a divisor of 4\n");
}

}  // namespace
}  // namespace tandem::comm::testing
