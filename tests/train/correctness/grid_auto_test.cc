// `tandem plan --ranks N` lists the grids that fit and recommends one; `tandem train --grid auto`
// trains on the grid it chose (a tiny model, 2 in-process ranks, 1 step) and says so at start-up.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <regex>

#include "support/cli.h"

namespace tandem::train {
namespace {

using tandem::testing::run_tandem;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;

TEST(GridAuto, PlanListsTheGridsAndRecommendsOne) {
  const auto r = run_tandem("plan --model tiny --ranks 2 --memory-per-rank 64MiB");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, ContainsRegex("dp=2 tp=1 pp=1 +moments +memory +in-core"));
  EXPECT_THAT(r.output, ContainsRegex("dp=2 tp=1 pp=1 +weights +memory +in-core"));
  EXPECT_THAT(r.output, ContainsRegex("dp=1 tp=2 pp=1 +moments"));
  EXPECT_THAT(r.output, ContainsRegex("dp=1 tp=1 pp=2 +moments"));
  EXPECT_THAT(r.output, ContainsRegex("dp=1 tp=1 pp=1 cp=2 +moments"));
  EXPECT_THAT(r.output, HasSubstr("\nrecommended: --dp "));
}

// At a limit that leaves out-of-core room or not, the run's grid, sharding and budget are the
// choice its start-up line names.
TEST(GridAuto, TrainTakesThePlansChoice) {
  for (const char* limit : {"64MiB", "2600KiB"}) {
    SCOPED_TRACE(limit);
    const auto r = run_tandem(fmt::format(
        "train --model tiny --grid auto --ranks 2 --memory-per-rank {} --steps 1 --eval-every 0 "
        "--executor plan --threads 1 --quiet",
        limit));
    ASSERT_EQ(r.status, 0) << r.output;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(
        r.output, m,
        std::regex("\n  --grid auto: --dp ([0-9]) --tp ([0-9]) --pp ([0-9])(?: --micro-batches "
                   "[0-9]+)?( --shard weights)?"
                   "( --memory-budget [0-9]+[KMG]iB)? \\((in-core|out-of-core[^)]*)\\), (the "
                   "fastest|chosen) "
                   "of [0-9]+ configurations? of 2 ranks that fit [0-9.]+ MiB a rank, predicted")))
        << r.output;
    EXPECT_THAT(r.output, HasSubstr(fmt::format("2 ranks (dp={} tp={} pp={}, thread backend)",
                                                m[1].str(), m[2].str(), m[3].str())));
    EXPECT_EQ(m[5].matched, r.output.find("  out-of-core: budget") != std::string::npos);
    // 2600 KiB: no configuration fits in-core, not even a pipeline of 8 micro-batches (the plan
    // runner's exchange buffers are two segments); which of several fits is the fastest would
    // depend on the machine's rates.
    if (std::string(limit) == "2600KiB") {
      EXPECT_TRUE(m[5].matched) << r.output;
    }
  }
}

// A model whose only grid of 2 ranks is a pipeline (1 head, 3 rows, 18 tokens) and whose head
// outweighs its blocks: the split of the layers and the micro-batch count the plan chose, when it
// chose other than the flags' own, are the run's.
TEST(GridAuto, TrainTakesThePipelinesSplitAndMicroBatches) {
  const auto r = run_tandem(
      "train --layers 4 --d-model 8 --heads 1 --seq-len 18 --batch 3 --grid auto --ranks 2 "
      "--memory-per-rank 1GiB --steps 1 --eval-every 0 --executor plan --threads 1 --quiet");
  ASSERT_EQ(r.status, 0) << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m,
                                std::regex("\n  --grid auto: --dp 1 --tp 1 --pp 2( --stage-layers "
                                           "([0-9],[0-9]))?( --micro-batches ([0-9]+))? \\(")))
      << r.output;
  const std::string grid =
      m[1].matched ? "dp=1 tp=1 pp=2 stage-layers=" + m[2].str() : "dp=1 tp=1 pp=2";
  EXPECT_THAT(r.output, HasSubstr("2 ranks (" + grid + ", thread backend)"));
  const int micro = m[3].matched ? std::stoi(m[4].str()) : 3;  // automatic: 3 rows, 3
  if (micro > 1) {
    EXPECT_THAT(r.output,
                HasSubstr(fmt::format("; {} micro-batches of {} rows, 1F1B", micro, 3 / micro)));
  } else {
    EXPECT_THAT(r.output, ::testing::Not(HasSubstr(" micro-batches of ")));
  }
}

}  // namespace
}  // namespace tandem::train
