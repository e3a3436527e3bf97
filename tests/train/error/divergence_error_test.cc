// A run that diverges stops with the step, the last finite loss and the checkpoint it keeps, and
// never writes a non-finite model over a good one; a checkpoint holding NaN weights is refused by
// eval, sample and resume.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "support/cli.h"
#include "tandem/io/checkpoint_series.h"
#include "train/test_util.h"

namespace tandem::train {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using testing::ScratchDir;
using testing::user_error_of;
namespace fs = std::filesystem;

// Adam moves every weight by about the learning rate a step: at 1e30 the first update leaves
// finite but enormous weights, whose forward pass overflows.
TEST(Divergence, NonFiniteLossStopsTheRunAndKeepsTheLastCheckpoint) {
  ScratchDir dir;
  TrainConfig c = testing::tiny_run(20);
  c.lr = 1e30;
  c.warmup = 0;
  c.save_dir = dir.path("ck");
  c.save_every = 1;
  c.metrics_path = dir.path("m.jsonl");
  const std::string m = user_error_of([&] { train(c); });
  EXPECT_THAT(m,
              MatchesRegex("the loss at step 2 is (NaN|[+-]infinity) \\(the last finite loss was "
                           "[0-9.]+, at step 1\\): training diverged and stopped without "
                           "saving; the last checkpoint, at step 1 in '.*/ck/step-00000001', "
                           "is kept: resume from it with a lower --lr or a longer --warmup"));
  EXPECT_EQ(testing::read_bytes(dir.path("ck/latest")), "step-00000001\n");
  EXPECT_EQ(load_model(dir.path("ck")).meta.step, 1);  // finite: it loads for eval
  // The diverged step is in the metrics, its loss null (JSON has no NaN).
  const std::string lines = testing::read_bytes(dir.path("m.jsonl"));
  EXPECT_THAT(lines, HasSubstr("{\"step\":2,\"loss\":null"));
}

// A weight decay whose product with the learning rate is beyond f32's range makes the update
// infinite although the loss before it was finite: the save after it must refuse the model
// rather than write it.
TEST(Divergence, ANonFiniteModelIsNeverSaved) {
  ScratchDir dir;
  TrainConfig first = testing::tiny_run(2);
  first.save_dir = dir.path("ck");
  train(first);
  TrainConfig c = testing::tiny_run(6);
  c.resume_dir = dir.path("ck");
  c.save_dir = dir.path("ck");
  c.save_every = 1;
  c.lr = 1e30;
  c.optimizer.weight_decay = 1e30;
  c.warmup = 0;
  const std::string m = user_error_of([&] { train(c); });
  EXPECT_THAT(m, MatchesRegex("the model after step 3 is not finite \\(tensor '[a-z_.0-9]+' has "
                              "[0-9]+ NaN and [0-9]+ infinite values of [0-9]+\\): training "
                              "diverged and stopped without saving; the last checkpoint, at step "
                              "2 in '.*/ck/step-00000002', is kept: .*"));
  EXPECT_EQ(testing::read_bytes(dir.path("ck/latest")), "step-00000002\n");
  EXPECT_FALSE(fs::exists(dir.path("ck/step-00000003")));
}

TEST(Divergence, WithoutAnEarlierSaveTheMessageSaysSo) {
  ScratchDir dir;
  TrainConfig c = testing::tiny_run(4);
  c.lr = 1e30;
  c.optimizer.weight_decay = 1e30;
  c.warmup = 0;
  c.save_dir = dir.path("ck");
  c.save_every = 1;
  EXPECT_THAT(user_error_of([&] { train(c); }),
              HasSubstr("training diverged and stopped without saving; no checkpoint was saved "
                        "before it (--save-every N saves one every N steps)"));
  EXPECT_FALSE(fs::exists(dir.path("ck/latest")));
}

// A checkpoint whose weights hold a NaN (written by something else, or by an older tandem that
// saved diverged models) is refused by eval and sample (load_model) and by resume.
TEST(Divergence, NaNWeightsAreRefusedByEvalAndResume) {
  ScratchDir dir;
  TrainConfig first = testing::tiny_run(1);
  first.save_dir = dir.path("ck");
  train(first);
  io::Checkpoint ck = io::load_checkpoint(dir.path("ck"));
  for (io::NamedTensor& t : ck.weights)
    if (t.name == "h.1.mlp.c_fc.weight") t.tensor.set(5, std::nanf(""));
  io::save_checkpoint(dir.path("nan"), ck);
  const std::string want =
      "checkpoint '" + dir.path("nan") +
      "' holds non-finite weights: tensor 'h.1.mlp.c_fc.weight' has 1 NaN and 0 infinite values of "
      "1024; the model diverged before it was saved, so use an earlier checkpoint";
  EXPECT_EQ(user_error_of([&] { load_model(dir.path("nan")); }), want);
  TrainConfig resume = testing::tiny_run(3);
  resume.resume_dir = dir.path("nan");
  EXPECT_EQ(user_error_of([&] { train(resume); }), want);
  // The command says so and fails.
  const tandem::testing::CommandResult eval =
      tandem::testing::run_tandem("eval --checkpoint '" + dir.path("nan") + "'");
  EXPECT_EQ(eval.status, 1) << eval.output;
  EXPECT_EQ(eval.output, "tandem: error: " + want + "\n");
}

// Optimizer state no optimizer wrote: a negative second moment (with a checksum that matches,
// as a tool that rewrote the file would leave it) is refused on resume, naming the tensor; so is
// a tensor whose bytes do not match the checksum recorded for it.
TEST(Divergence, ImpossibleOrAlteredOptimizerStateIsRefusedOnResume) {
  ScratchDir dir;
  TrainConfig first = testing::tiny_run(1);
  first.save_dir = dir.path("ck");
  train(first);
  io::Checkpoint ck = io::load_checkpoint(dir.path("ck"));
  for (io::NamedTensor& t : ck.optimizer)
    if (t.name == "v.h.0.ln_1.bias") t.tensor.set(3, -1.0f);
  io::save_checkpoint(dir.path("negative"), ck);
  TrainConfig resume = testing::tiny_run(3);
  resume.resume_dir = dir.path("negative");
  EXPECT_EQ(user_error_of([&] { train(resume); }),
            "checkpoint '" + dir.path("negative") +
                "' holds a negative second moment (-1 at element 3 of tensor 'v.h.0.ln_1.bias'): "
                "no optimizer wrote it; the file was altered");
  // One byte of the weights changed after the save: the checksum no longer matches.
  const std::string file = dir.path("ck/step-00000001/weights.safetensors");
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-7, std::ios::end);
  const char c = static_cast<char>(f.get() ^ 0x10);
  f.seekp(-7, std::ios::end);
  f.put(c);
  f.close();
  resume.resume_dir = dir.path("ck");
  EXPECT_THAT(user_error_of([&] { train(resume); }),
              ::testing::HasSubstr("does not match its checksum"));
}

TEST(Divergence, BadSettings) {
  TrainConfig c = testing::tiny_run(1);
  c.keep_checkpoints = 0;
  EXPECT_EQ(user_error_of([&] { train(c); }),
            "--keep-checkpoints 0 must be at least 1 (the newest checkpoint is always kept)");
  c = testing::tiny_run(1);
  c.comm_timeout_s = -2;
  EXPECT_EQ(user_error_of([&] { train(c); }),
            "--comm-timeout -2 must be a number of seconds, 0 (wait forever) or more");
}

}  // namespace
}  // namespace tandem::train
