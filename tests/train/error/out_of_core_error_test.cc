// What a user reads when out-of-core training cannot go ahead: a budget no plan fits (with the
// smallest that works), a bad budget, plan or tier, and a slow tier on a full disk, which is
// found before the first step and leaves an earlier checkpoint as it was.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "support/cli.h"
#include "tandem/io/checkpoint_series.h"
#include "tandem/train/trainer.h"
#include "train/test_util.h"

namespace tandem::train {
namespace {

using ::testing::HasSubstr;
using testing::ScratchDir;
using testing::user_error_of;

TrainConfig tiny() { return testing::tiny_run(2); }  // test_util.h's smallest run

TEST(OutOfCoreErrors, BudgetTooSmallNamesTheSmallestThatWorks) {
  TrainConfig c = tiny();
  c.memory_budget = "64KiB";
  const std::string m = user_error_of([&] { train(c); });
  EXPECT_THAT(m, HasSubstr("no out-of-core plan fits a memory budget of 64.0 KiB (65536 bytes)"));
  EXPECT_THAT(m, HasSubstr("the smallest budget that works is"));
}

TEST(OutOfCoreErrors, BadFlags) {
  TrainConfig c = tiny();
  c.memory_budget = "lots";
  EXPECT_THAT(user_error_of([&] { train(c); }), HasSubstr("--memory-budget: 'lots' is not a size"));
  c.memory_budget = "-5%";
  EXPECT_THAT(user_error_of([&] { train(c); }),
              HasSubstr("--memory-budget: '-5%' is not a usable share"));
  c.memory_budget = "600MiB";
  const auto r = tandem::testing::run_tandem("train --memory-budget 600MiB --slow-tier disk");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.output, HasSubstr("tandem: error: --slow-tier: slow tier 'disk' not understood"));
  c.ooc_plan = "KQ/p1";
  EXPECT_THAT(user_error_of([&] { train(c); }), HasSubstr("--ooc-plan: out-of-core plan 'KQ/p1'"));
  c.ooc_plan = "KK/p1";  // a letter per block, where a plan has one per half block
  EXPECT_THAT(user_error_of([&] { train(c); }),
              HasSubstr("has 2 units; this stage runs 4 (two per block"));
  c.memory_budget.clear();
  c.ooc_plan = "KKKK/p1";
  EXPECT_THAT(user_error_of([&] { train(c); }), HasSubstr("--ooc-plan needs --memory-budget"));
}

TEST(OutOfCoreErrors, FullDiskIsFoundBeforeTrainingAndKeepsTheCheckpoint) {
  ScratchDir dir;
  TrainConfig c = tiny();
  c.save_dir = dir.path("ckpt");
  train(c);
  const std::string before =
      testing::read_bytes(io::resolve_checkpoint(dir.path("ckpt")) + "/weights.safetensors");
  ASSERT_FALSE(before.empty());
  c.steps = 4;
  c.memory_budget = "64MiB";
  c.slow_tier = ooc::TierSpec::parse("file:" + dir.path("swap"));
  c.ooc_plan = "SSSS/p1";
  std::string m;
  {
    testing::FileSizeLimit limit(1 << 20);
    m = user_error_of([&] { train(c); });
  }
  EXPECT_THAT(m, HasSubstr(dir.path("swap")));
  EXPECT_THAT(m, HasSubstr("bytes"));
  EXPECT_EQ(testing::read_bytes(io::resolve_checkpoint(dir.path("ckpt")) + "/weights.safetensors"),
            before);
}

}  // namespace
}  // namespace tandem::train
