// The flags of the plan across grids: --grid auto without --ranks, a --grid other than auto,
// --ranks without the mode it belongs to, flags naming what the plan chooses, a size that is not
// one, and a per-rank limit no grid fits (the one error naming the smallest memory that works).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>

#include "support/cli.h"

namespace tandem::train {
namespace {

using tandem::testing::run_tandem;
using ::testing::MatchesRegex;

// Each case: the arguments and the one error line.
struct Case {
  const char* args;
  const char* error;
};

TEST(GridFlags, EachMistakeIsOneClearError) {
  const Case cases[] = {
      {"train --grid auto",
       "--grid auto needs --ranks N: the number of ranks to choose a grid for"},
      {"train --grid 2x2x1 --ranks 4",
       "--grid 2x2x1: the one value is auto (the fastest grid of --ranks N that `tandem plan` "
       "finds); give a grid with --dp, --tp and --pp"},
      {"train --ranks 4", "--ranks needs --grid auto"},
      {"train --memory-per-rank 1GiB", "--memory-per-rank needs --grid auto"},
      {"train --grid auto --ranks 4 --dp 2",
       "--grid auto plans across grids and chooses --dp: leave it out"},
      {"train --grid auto --ranks 4 --shard weights",
       "--grid auto plans across grids and chooses --shard: leave it out"},
      {"train --grid auto --ranks 4 --memory-budget 1GiB",
       "--grid auto plans across grids and chooses --memory-budget: leave it out"},
      {"train --grid auto --ranks 0", "--ranks 0 must be at least 1"},
      // Past the bound the plan answers in well under a second (these spun, then died of
      // SIGFPE, or printed a 139 KB line).
      {"plan --model tiny --ranks 2147483647 --memory-per-rank 1GiB",
       "--ranks 2147483647: the plan across grids takes at most 4096 ranks; plan a run of that "
       "size or fewer, or give --dp, --tp and --pp"},
      {"train --grid auto --ranks 1000000 --memory-per-rank 1GiB",
       "--ranks 1000000: the plan across grids takes at most 4096 ranks; plan a run of that "
       "size or fewer, or give --dp, --tp and --pp"},
      {"plan --model tiny",
       "tandem plan needs --memory-budget (the out-of-core plan of one grid), "
       "or --ranks N (the plan across grids)"},
      {"plan --model tiny --memory-budget 1GiB --link-gbps 10", "--link-gbps needs --ranks N"},
      {"plan --model tiny --ranks 4 --memory-budget 1GiB",
       "--ranks plans across grids and chooses --memory-budget: leave it out"},
      {"plan --model tiny --ranks 2 --link-gbps 0",
       "--link-gbps 0 must be a number of Gbit/s from 0.001 to 1000000"},
      // Accepted, it printed a step time of 300 digits and 0 tokens/s.
      {"plan --model tiny --ranks 2 --link-gbps 1e-300",
       "--link-gbps 1e-300 must be a number of Gbit/s from 0.001 to 1000000"},
      {"plan --model tiny --ranks 2 --link-gbps 1e300",
       "--link-gbps 1e+300 must be a number of Gbit/s from 0.001 to 1000000"},
      {"plan --model tiny --ranks 2 --memory-per-rank lots",
       "--memory-per-rank: 'lots' is not a size: write a number of bytes or one with a unit, e.g. "
       "600MiB, 1.5GiB, 2G"},
  };
  for (const Case& c : cases) {
    const auto r = run_tandem(c.args);
    EXPECT_EQ(r.status, 1) << c.args;
    EXPECT_EQ(r.output, fmt::format("tandem: error: {}\n", c.error)) << c.args;
  }
}

// The most ranks the plan takes: an answer, or one short refusal, in well under the time a plan
// of a few ranks takes (its rates are measured once either way).
TEST(GridFlags, TheMostRanksGiveOneShortLine) {
  const auto begin = std::chrono::steady_clock::now();
  const auto r = run_tandem("plan --model tiny --ranks 4096 --memory-per-rank 64KiB");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count(), 20.0);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_LT(r.output.size(), 700u) << r.output;
  EXPECT_EQ(r.output.rfind("tandem: error: no grid of 4096 ranks ", 0), 0u) << r.output;
}

TEST(GridFlags, ALimitNoGridFitsNamesTheSmallestMemoryPerRankThatWorks) {
  const auto r = run_tandem("plan --model tiny --ranks 4 --memory-per-rank 64KiB");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.output,
              MatchesRegex("tandem: error: no grid of 4 ranks fits 64.0 KiB a rank: the smallest "
                           "memory per rank that works is [0-9.]+ MiB \\(--memory-per-rank "
                           "[0-9]+[KM]iB\\), with dp=[124] tp=[12] pp=[124]( stage-layers=[0-9,]+)?"
                           "(, [0-9]+ micro-batches)?, --shard [a-z]+, blocks in memory(, "
                           "activations out-of-core)?\n"));
}

}  // namespace
}  // namespace tandem::train
