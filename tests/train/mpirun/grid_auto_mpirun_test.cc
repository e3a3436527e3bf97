// `tandem train --grid auto` under a real mpirun: rank 0 plans and every process takes its choice,
// even where the processes' own plans would differ (here each process is given another memory
// limit, so each alone would choose another budget); a plan with no grid that fits stops every
// process, and rank 0 alone says why.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "support/cli.h"

namespace tandem::train {
namespace {

using ::testing::HasSubstr;

// Two processes of `tandem train --grid auto --ranks 2`, rank 0 with TANDEM_MEMORY_LIMIT=`limit0`
// and rank 1 with `limit1` (MPMD: one executable context each).
tandem::testing::CommandResult two_processes(const std::string& limit0, const std::string& limit1) {
  const std::string train = fmt::format(
      "{} train --backend mpi --model tiny --grid auto --ranks 2 --steps 2 --eval-every 0 "
      "--threads 1 --executor plan",
      tandem::testing::tandem_binary());
  return tandem::testing::run_command(
      fmt::format("{} -np 1 env TANDEM_MEMORY_LIMIT={} {} : -np 1 env TANDEM_MEMORY_LIMIT={} {}",
                  tandem::testing::mpirun_command(120), limit0, train, limit1, train));
}

TEST(GridAutoMpirun, EveryProcessTakesRankZerosChoice) {
  // 5200 KiB for 2 ranks on rank 0 leaves 2600 KiB a rank: no configuration fits in-core there
  // (grid_auto_test.cc); rank 1 alone, with 1 GiB, would train in-core.
  const auto r = two_processes("5200KiB", "1GiB");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--grid auto: --dp ")) << r.output;
  EXPECT_THAT(r.output, HasSubstr(" --memory-budget ")) << "rank 0's out-of-core choice\n"
                                                        << r.output;
  EXPECT_THAT(r.output, HasSubstr("that fit 2.54 MiB a rank")) << r.output;
}

TEST(GridAutoMpirun, NoGridThatFitsStopsEveryProcessWithRankZerosReason) {
  const auto r = two_processes("64KiB", "1GiB");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("tandem: error: ")) << r.output;
  EXPECT_THAT(r.output, HasSubstr("a rank")) << r.output;
  // One process says why; the other stops without a word.
  const size_t first = r.output.find("tandem: error: ");
  EXPECT_EQ(r.output.find("tandem: error: ", first + 1), std::string::npos) << r.output;
}

}  // namespace
}  // namespace tandem::train
