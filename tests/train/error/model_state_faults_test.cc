// Faults around the streamed model state (--model-state file:DIR): a tier the disk cannot hold is
// refused before step 1, naming the folder and the bytes; a run killed mid-step (SIGKILL: no
// chance to save) leaves its last checkpoint intact, and resuming from it ends bitwise where the
// uninterrupted run ends.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "support/cli.h"
#include "support/files.h"
#include "support/scratch.h"
#include "train/test_util.h"

namespace tandem::train {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

TEST(ModelStateFaults, ATierTheDiskCannotHoldIsRefusedBeforeTheFirstStep) {
  testing::ScratchDir dir;
  TrainConfig c = testing::tiny_run(1);
  c.model.n_layers = 4;
  c.model.d_model = 64;
  c.model_state = ooc::TierSpec::parse("file:" + dir.path());
  std::string error;
  {
    // Files stop growing at 64 KiB, as on a full disk: the tier (a few MiB) cannot be reserved.
    const tandem::testing::FileSizeLimit full(64 << 10);
    error = testing::user_error_of([&] { train(c); });
  }
  EXPECT_THAT(error, HasSubstr("--model-state file:" + dir.path() + ": slow tier " + dir.path() +
                               ": cannot reserve "));
  // The first the tier is asked for: the performance model's probe of its bandwidth.
  EXPECT_THAT(error, ::testing::ContainsRegex("reserve [0-9.]+ MiB \\([0-9]+ bytes\\) for the "
                                              "model state's bandwidth probe \\(--model-state\\): "
                                              "File too large"));
  EXPECT_TRUE(fs::is_empty(dir.path())) << "nothing left behind";
}

// Steps of a few tens of milliseconds, the blocks (6, more than the store's weight slots) in a
// file tier, a checkpoint after every step.
std::string flags(const std::string& dir, const std::string& save, int steps) {
  return fmt::format(
      "train --layers 6 --d-model 96 --heads 4 --seq-len 64 --batch 8 --micro-batches 2 --dp 1 "
      "--tp 1 --eval-every 0 --steps {} --model-state 'file:{}' --save '{}' --save-every 1 "
      "--keep-checkpoints 3",
      steps, dir, save);
}

std::string read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(ModelStateFaults, AKillMidStepLeavesTheLastCheckpointWhichResumesBitwise) {
  testing::ScratchDir dir;
  const int steps = 30;
  fs::create_directories(dir.path("tier"));
  const tandem::testing::CommandResult straight = tandem::testing::run_tandem(
      flags(dir.path("tier"), dir.path("straight"), steps) + " --quiet");
  ASSERT_EQ(straight.status, 0) << straight.output;

  // Killed once a few steps are in the metrics file: wherever it lands (inside a step, a block's
  // write-back or a checkpoint's save), `latest` names a whole checkpoint.
  const std::string metrics = dir.path("m.jsonl");
  const tandem::testing::CommandResult killed = tandem::testing::run_command(
      fmt::format("('{}' {} --quiet --metrics '{}' >/dev/null 2>&1 & pid=$!; "
                  "while [ \"$(wc -l < '{}' 2>/dev/null || echo 0)\" -lt 4 ]; do sleep 0.01; done; "
                  "kill -KILL $pid; wait $pid; echo \"status $?\")",
                  tandem::testing::tandem_binary(), flags(dir.path("tier"), dir.path("ck"), steps),
                  metrics, metrics));
  EXPECT_THAT(killed.output, HasSubstr("status 137")) << killed.output;
  const std::string latest = read(dir.path("ck/latest"));
  ASSERT_FALSE(latest.empty()) << "a checkpoint was saved before the kill";
  EXPECT_NE(latest, fmt::format("step-{:08d}\n", steps)) << "the kill came before the end";
  EXPECT_TRUE(fs::is_empty(dir.path("tier"))) << "the killed run's tier file was unlinked";

  const tandem::testing::CommandResult resumed =
      tandem::testing::run_tandem(flags(dir.path("tier"), dir.path("ck"), steps) +
                                  " --quiet --resume '" + dir.path("ck") + "'");
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  const std::string last = fmt::format("/step-{:08d}/", steps);
  EXPECT_EQ(read(dir.path("ck") + last + "weights.safetensors"),
            read(dir.path("straight") + last + "weights.safetensors"));
  EXPECT_EQ(read(dir.path("ck") + last + "optimizer.safetensors"),
            read(dir.path("straight") + last + "optimizer.safetensors"));
}

}  // namespace
}  // namespace tandem::train
