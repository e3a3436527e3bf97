// --stage-layers: a pipeline whose stages hold uneven shares of the layers trains what the even
// split and one rank train (within the pipeline tests' tolerance, trainer_test.cc's), beside
// tensor and data parallelism; the even split given by the flag is the default bit for bit; and a
// checkpoint saved with one split resumes with another (checkpoints hold whole-model tensors).
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "tandem/parallel/shard.h"
#include "tandem/train/trainer.h"
#include "train/test_util.h"

namespace tandem::train {
namespace {

using testing::initial_weights;
using testing::relative_update_difference;
using testing::ScratchDir;

// Five layers, so that two stages can hold 1 and 4 or 4 and 1.
TrainConfig five_layers(parallel::GridShape grid, std::vector<int> split = {}, int64_t steps = 4) {
  TrainConfig c = testing::tiny_run(steps);
  c.model.n_layers = 5;
  c.batch = 8;
  c.seed = 3;
  c.grid = grid;
  c.grid.stage_layers = std::move(split);
  c.synthetic_bytes = 1 << 15;
  c.keep_weights = true;
  return c;
}

// trainer_test.cc's expect_equivalent: losses within 2e-4 after 4 AdamW steps, weights within 1%
// of the distance they moved (the runs sum the same terms in other orders).
void expect_close(const TrainResult& got, const TrainResult& want, const TrainConfig& cfg,
                  const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t i = 0; i < want.losses.size(); ++i)
    EXPECT_NEAR(got.losses[i], want.losses[i], 2e-4) << what << " step " << i;
  ASSERT_EQ(got.weights.size(), want.weights.size()) << what;
  EXPECT_LT(relative_update_difference(got.weights, want.weights, initial_weights(cfg)), 1e-2)
      << what;
}

TEST(UnevenPipeline, SplitsTrainLikeTheEvenSplitAndOneRank) {
  const TrainResult one = train(five_layers({1, 1, 1}));
  const TrainResult even = train(five_layers({1, 1, 2}));
  expect_close(even, one, five_layers({1, 1, 2}), "pp=2 even");
  for (const std::vector<int>& split : {std::vector<int>{1, 4}, std::vector<int>{4, 1}}) {
    const TrainConfig c = five_layers({1, 1, 2}, split);
    const TrainResult r = train(c);
    const std::string what = c.grid.str();
    expect_close(r, one, c, what + " vs pp=1");
    expect_close(r, even, c, what + " vs the even split");
  }
}

// Tensor-parallel ranks beside the uneven stages, and data-parallel replicas of them.
TEST(UnevenPipeline, SplitsTrainLikeOneRankBesideTensorAndDataParallelism) {
  const TrainResult one = train(five_layers({1, 1, 1}));
  for (const TrainConfig& c : {five_layers({1, 2, 2}, {4, 1}), five_layers({2, 1, 2}, {1, 4}),
                               five_layers({1, 1, 3}, {1, 1, 3})})
    expect_close(train(c), one, c, c.grid.str());
}

// The run holds the split it is given: each stage's rank reports the parameters of its share
// (the start-up line "memory on rank r: parameters X MiB"), 1 block and the embeddings or 4 blocks
// and the head's copy of them.
TEST(UnevenPipeline, EachStageHoldsItsShare) {
  for (const std::vector<int>& split : {std::vector<int>{1, 4}, std::vector<int>{4, 1}}) {
    TrainConfig c = five_layers({1, 1, 2}, split, 1);
    std::ostringstream out;
    c.out = &out;
    train(c);
    for (int stage = 0; stage < 2; ++stage) {
      const parallel::ShardLayout layout(c.model, c.grid, 0, stage);
      EXPECT_EQ(layout.end_layer() - layout.first_layer(), split[static_cast<size_t>(stage)]);
      const std::string line =
          fmt::format("memory on rank {}: parameters {:.2f} MiB", stage,
                      static_cast<double>(layout.size()) * sizeof(float) / (1 << 20));
      EXPECT_NE(out.str().find(line), std::string::npos) << line << "\n" << out.str();
    }
  }
}

// The even split named by the flag is the layout the default computes: the same run bit for bit.
TEST(UnevenPipeline, TheEvenSplitGivenIsTheDefaultBitForBit) {
  testing::expect_bitwise(train(five_layers({1, 1, 2}, {3, 2})), train(five_layers({1, 1, 2})),
                          "--stage-layers 3,2 vs the default");
}

// A checkpoint names whole-model tensors ("h.3.attn.c_attn.weight"), whatever stage held them:
// saved with one split, it resumes with another, and on another grid.
TEST(UnevenPipeline, ACheckpointOfOneSplitResumesWithAnother) {
  const TrainConfig one = five_layers({1, 1, 1}, {}, 6);
  const TrainResult straight = train(one);
  const std::vector<float> w0 = initial_weights(one);
  ScratchDir dir;
  TrainConfig first = five_layers({1, 1, 2}, {1, 4}, 3);
  first.save_dir = dir.path("ck");
  train(first);
  for (const TrainConfig& next :
       {five_layers({1, 1, 2}, {4, 1}, 6), five_layers({1, 2, 3}, {2, 1, 2}, 6)}) {
    TrainConfig c = next;
    c.resume_dir = dir.path("ck");
    const TrainResult r = train(c);
    ASSERT_EQ(r.losses.size(), 3u) << c.grid.str();
    for (size_t i = 0; i < 3; ++i)
      EXPECT_NEAR(r.losses[i], straight.losses[3 + i], 2e-4) << c.grid.str() << " step " << i;
    ASSERT_EQ(r.weights.size(), straight.weights.size());
    EXPECT_LT(relative_update_difference(r.weights, straight.weights, w0), 1e-2) << c.grid.str();
  }
}

}  // namespace
}  // namespace tandem::train
