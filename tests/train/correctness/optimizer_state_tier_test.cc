// The optimizer state beside the slow tier (--optimizer-state host|file:DIR): the same weights,
// bitwise, as with the state in memory, at dp 1 to 4, on both executors, for AdamW and LAMB, with
// the exchange overlapped; a checkpoint saved from one place resumes in another; and a tier that
// cannot be opened is refused naming the flag.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/cli.h"
#include "train/test_util.h"

namespace tandem::train {
namespace {

using exec::RunnerKind;
using parallel::OptimizerKind;

// `tier` as --optimizer-state takes it: memory, host or file:DIR.
TrainConfig state_run(int dp, OptimizerKind optimizer, RunnerKind executor,
                      const std::string& tier) {
  TrainConfig c = testing::tiny_run(3);
  c.model.n_layers = 3;
  c.batch = 12;
  c.grid = {dp, 1, 1};
  c.optimizer.kind = optimizer;
  c.optimizer.bucket_mb = 0.01;  // a bucket a block: several segments share the two staging slots
  if (tier != "memory") c.optimizer.state_tier = ooc::TierSpec::parse(tier);
  c.executor = executor;
  c.keep_weights = true;
  return c;
}

using testing::expect_bitwise;

TEST(OptimizerStateTier, SameWeightsAsInMemory) {
  testing::ScratchDir dir;
  const std::vector<std::string> tiers = {"host", "file:" + dir.path("state")};
  for (int dp : {1, 2, 3, 4})
    for (const RunnerKind executor : {RunnerKind::Compiled, RunnerKind::Plan}) {
      const TrainResult memory = train(state_run(dp, OptimizerKind::AdamW, executor, "memory"));
      for (const std::string& tier : tiers)
        expect_bitwise(memory, train(state_run(dp, OptimizerKind::AdamW, executor, tier)),
                       "adamw dp " + std::to_string(dp) + " " +
                           std::string(exec::runner_kind_name(executor)) + " " + tier);
    }
  for (int dp : {2, 3}) {
    const TrainResult memory =
        train(state_run(dp, OptimizerKind::Lamb, RunnerKind::Compiled, "memory"));
    for (const std::string& tier : tiers)
      expect_bitwise(memory, train(state_run(dp, OptimizerKind::Lamb, RunnerKind::Compiled, tier)),
                     "lamb dp " + std::to_string(dp) + " " + tier);
  }
}

TEST(OptimizerStateTier, ACheckpointMovesBetweenMemoryAndTheTier) {
  testing::ScratchDir dir;
  TrainConfig straight = state_run(2, OptimizerKind::AdamW, RunnerKind::Compiled, "memory");
  straight.steps = 4;
  const TrainResult want = train(straight);
  // Two steps with the state in memory, saved; two more with it in the host tier.
  TrainConfig first = state_run(2, OptimizerKind::AdamW, RunnerKind::Compiled, "memory");
  first.steps = 2;
  first.save_dir = dir.path("ck");
  train(first);
  TrainConfig second = state_run(2, OptimizerKind::AdamW, RunnerKind::Compiled, "host");
  second.steps = 4;
  second.resume_dir = dir.path("ck");
  const TrainResult got = train(second);
  EXPECT_EQ(got.weights, want.weights);
  // And back: saved from the tier, resumed in memory.
  TrainConfig third = state_run(2, OptimizerKind::AdamW, RunnerKind::Compiled, "host");
  third.steps = 2;
  third.save_dir = dir.path("ck2");
  train(third);
  TrainConfig fourth = state_run(2, OptimizerKind::AdamW, RunnerKind::Compiled, "memory");
  fourth.steps = 4;
  fourth.resume_dir = dir.path("ck2");
  EXPECT_EQ(train(fourth).weights, want.weights);
}

TEST(OptimizerStateTier, BadPlacesNameTheFlag) {
  testing::ScratchDir dir;
  testing::write_bytes(dir.path("a-file"), "x");
  const auto r = tandem::testing::run_tandem("train --optimizer-state disk");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.output,
            "tandem: error: --optimizer-state disk: write memory, host (a slow tier in host "
            "memory) or file:DIR (an "
            "O_DIRECT file in folder DIR)\n");
  TrainConfig c =
      state_run(1, OptimizerKind::AdamW, RunnerKind::Plan, "file:" + dir.path("a-file") + "/sub");
  const std::string e = testing::user_error_of([&] { train(c); });
  EXPECT_EQ(e, "--optimizer-state 'file:" + dir.path("a-file") + "/sub': cannot create folder '" +
                   dir.path("a-file") + "/sub': Not a directory");
}

}  // namespace
}  // namespace tandem::train
