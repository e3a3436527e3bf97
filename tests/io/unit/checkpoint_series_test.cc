// A run's checkpoints side by side: step-numbered folders, the newest N kept, a `latest` file
// naming the newest, and the checkpoint a folder names (itself, the series' latest, or its
// highest step) found for --resume, eval and sample.
#include "tandem/io/checkpoint_series.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "support/files.h"
#include "support/scratch.h"

namespace tandem::io {
namespace {

using ::testing::ElementsAre;
using testing::ScratchDir;
using testing::user_error_of;
namespace fs = std::filesystem;

Checkpoint at_step(int64_t step) {
  Checkpoint c;
  c.meta.step = step;
  c.meta.optimizer = "adamw";
  Tensor w = Tensor::empty(DType::F32, Shape{4});
  w.fill(static_cast<float>(step));
  c.weights.push_back({"w", w});
  c.optimizer.push_back({"m.w", Tensor::zeros(DType::F32, Shape{4})});
  return c;
}

TEST(CheckpointSeries, KeepsTheNewestAndPointsLatestAtIt) {
  ScratchDir dir;
  for (int64_t s = 1; s <= 4; ++s)
    EXPECT_EQ(save_in_series(dir.path("ck"), at_step(s), 2), dir.path("ck/" + step_folder_name(s)));
  EXPECT_THAT(dir.list("ck"), ElementsAre("latest", "step-00000003", "step-00000004"));
  EXPECT_EQ(testing::read_bytes(dir.path("ck/latest")), "step-00000004\n");
  EXPECT_EQ(resolve_checkpoint(dir.path("ck")), dir.path("ck/step-00000004"));
  const Checkpoint back = load_checkpoint(dir.path("ck"));
  EXPECT_EQ(back.meta.step, 4);
  EXPECT_EQ(back.folder, dir.path("ck/step-00000004"));
  EXPECT_EQ(back.weights.at(0).tensor.get(0), 4.0f);
}

TEST(CheckpointSeries, KeepOneLeavesOnlyTheNewest) {
  ScratchDir dir;
  for (int64_t s = 10; s <= 30; s += 10) save_in_series(dir.path("ck"), at_step(s), 1);
  EXPECT_THAT(dir.list("ck"), ElementsAre("latest", "step-00000030"));
}

// A run that went back to an earlier step (resumed from it) writes lower step numbers: the later
// folders of the abandoned run are not its to delete, and `latest` names the new one.
TEST(CheckpointSeries, FoldersOfLaterStepsAreLeftAlone) {
  ScratchDir dir;
  for (int64_t s : {4, 5, 6}) save_in_series(dir.path("ck"), at_step(s), 3);
  save_in_series(dir.path("ck"), at_step(5), 1);
  EXPECT_THAT(dir.list("ck"), ElementsAre("latest", "step-00000005", "step-00000006"));
  EXPECT_EQ(load_checkpoint(dir.path("ck")).meta.step, 5);
}

TEST(CheckpointSeries, OneStepFolderAndASingleCheckpointNameThemselves) {
  ScratchDir dir;
  save_in_series(dir.path("ck"), at_step(1), 2);
  save_in_series(dir.path("ck"), at_step(2), 2);
  EXPECT_EQ(load_checkpoint(dir.path("ck/step-00000001")).meta.step, 1);
  save_checkpoint(dir.path("single"), at_step(7));
  EXPECT_TRUE(is_single_checkpoint(dir.path("single")));
  EXPECT_FALSE(is_single_checkpoint(dir.path("ck")));
  EXPECT_EQ(resolve_checkpoint(dir.path("single")), dir.path("single"));
}

// Without `latest` (copied without it, or a crash before the first pointer was written) the
// highest step is taken.
TEST(CheckpointSeries, WithoutLatestTheHighestStep) {
  ScratchDir dir;
  for (int64_t s : {8, 12}) save_in_series(dir.path("ck"), at_step(s), 2);
  fs::remove(dir.path("ck/latest"));
  EXPECT_EQ(load_checkpoint(dir.path("ck")).meta.step, 12);
}

TEST(CheckpointSeries, ABadPointerIsNamed) {
  ScratchDir dir;
  save_in_series(dir.path("ck"), at_step(3), 2);
  testing::write_bytes(dir.path("ck/latest"), "step-00000009\n");
  EXPECT_EQ(user_error_of([&] { load_checkpoint(dir.path("ck")); }),
            "checkpoint pointer '" + dir.path("ck/latest") +
                "' names 'step-00000009', which does not exist");
  testing::write_bytes(dir.path("ck/latest"), "../../etc\n");
  EXPECT_EQ(user_error_of([&] { load_checkpoint(dir.path("ck")); }),
            "checkpoint pointer '" + dir.path("ck/latest") +
                "' does not name a step folder (it holds '../../etc')");
}

TEST(CheckpointSeries, AnEmptyFolderIsNoCheckpoint) {
  ScratchDir dir;
  fs::create_directories(dir.path("empty"));
  EXPECT_EQ(
      user_error_of([&] { load_checkpoint(dir.path("empty")); }),
      "checkpoint '" + dir.path("empty") +
          "' is incomplete: it has no weights.safetensors, optimizer.safetensors and meta.json");
  EXPECT_EQ(user_error_of([&] { load_checkpoint(dir.path("none")); }),
            "checkpoint folder '" + dir.path("none") + "' does not exist");
}

}  // namespace
}  // namespace tandem::io
