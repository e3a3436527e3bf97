// `tandem train --cp N`: each sequence split over N ranks (parallel/context_parallel.h), alone and
// with data, tensor and pipeline parallelism, trains as one rank trains the whole sequence, for
// GPT-2 (learned positions) and Llama (rotary positions, grouped-query heads); the validation loss
// follows; and a checkpoint moves between cp and no cp (the weights are replicated over the cp
// ranks, and checkpoints hold whole tensors).
//
// Tolerance: the cp ranks sum attention's key/value gradients and the weights' gradients over
// the tokens in other orders than one rank does, so the runs agree to f32 rounding, not bitwise:
// each step's loss within 1e-5 (one rank's mean over the tokens, against the mean of the ranks'
// means over theirs), and the final weights' difference under 1e-3 of the distance training
// moved them (relative_update_difference; the grids of trainer_test allow 1e-2, Adam's normalised
// step turning rounding-level gradient differences into update differences where a gradient is
// ~0).
#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tandem/train/trainer.h"
#include "train/test_util.h"

namespace tandem::train {
namespace context_parallel_training_test {

using testing::initial_weights;
using testing::relative_update_difference;
using testing::ScratchDir;

constexpr double kLossTolerance = 1e-5;
constexpr double kWeightTolerance = 1e-3;

// A tiny GPT-2 of 16 tokens a row (cp 4 holds chunks of 2), 4 rows, validated at the end.
TrainConfig gpt2_run(parallel::GridShape grid, int64_t steps = 3) {
  TrainConfig c = testing::tiny_run(steps);
  c.grid = grid;
  c.eval_every = steps;
  c.eval_batches = 1;
  c.keep_weights = true;
  return c;
}

// A tiny Llama: grouped-query attention (4 heads sharing 2 key/value heads), SwiGLU, an untied
// head, rotary positions at each token's place in the sequence.
TrainConfig llama_run(parallel::GridShape grid, int64_t steps = 3) {
  TrainConfig c = gpt2_run(grid, steps);
  c.model.arch = nn::Arch::Llama;
  c.model.n_heads = 4;
  c.model.kv_heads = 2;
  c.model.d_model = 32;
  c.model.ffn = 48;
  c.model.tie_embeddings = false;
  return c;
}

void expect_like_one_rank(const TrainResult& got, const TrainResult& want,
                          const std::vector<float>& w0, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t i = 0; i < want.losses.size(); ++i)
    EXPECT_NEAR(got.losses[i], want.losses[i], kLossTolerance) << what << " step " << i;
  ASSERT_EQ(got.val_losses.size(), want.val_losses.size()) << what;
  for (size_t i = 0; i < want.val_losses.size(); ++i) {
    EXPECT_EQ(got.val_losses[i].first, want.val_losses[i].first) << what;
    EXPECT_NEAR(got.val_losses[i].second, want.val_losses[i].second, kLossTolerance) << what;
  }
  ASSERT_EQ(got.weights.size(), want.weights.size()) << what;
  EXPECT_LT(relative_update_difference(got.weights, want.weights, w0), kWeightTolerance) << what;
}

void expect_grids_like_one_rank(TrainConfig (*run)(parallel::GridShape, int64_t),
                                const std::vector<parallel::GridShape>& grids) {
  const TrainConfig one = run({1, 1, 1}, 3);
  const TrainResult want = train(one);
  const std::vector<float> w0 = initial_weights(one);
  for (const parallel::GridShape& g : grids) {
    const TrainResult got = train(run(g, 3));
    expect_like_one_rank(got, want, w0, (one.model.llama() ? "llama " : "gpt-2 ") + g.str());
  }
}

TEST(ContextParallelTraining, Gpt2TrainsAsOneRank) {
  expect_grids_like_one_rank(
      gpt2_run,
      {{1, 1, 1, 2}, {1, 1, 1, 4}, {2, 1, 1, 2}, {1, 2, 1, 2}, {1, 1, 2, 2}, {2, 1, 2, 2}});
}

TEST(ContextParallelTraining, LlamaTrainsAsOneRank) {
  expect_grids_like_one_rank(llama_run, {{1, 1, 1, 2}, {2, 1, 1, 2}, {1, 2, 1, 2}, {1, 2, 2, 2}});
}

// Ring attention (TANDEM_CP_ORDER=ring): the keys and values passed round the group instead of
// gathered trains as one rank, alone and with data and tensor parallelism.
TEST(ContextParallelTraining, TheRingOrderTrainsAsOneRank) {
  setenv("TANDEM_CP_ORDER", "ring", 1);
  expect_grids_like_one_rank(gpt2_run, {{1, 1, 1, 2}, {1, 1, 1, 4}, {2, 1, 1, 2}});
  expect_grids_like_one_rank(llama_run, {{1, 1, 1, 2}, {1, 2, 1, 2}});
  unsetenv("TANDEM_CP_ORDER");
}

// The model state's modes treat the cp ranks as replicas: the moments in a host tier, the blocks
// streamed from one, the weights sharded over dp x cp (ZeRO-3) train as the same mode without cp.
TEST(ContextParallelTraining, TheModelStatesModesComposeWithCp) {
  struct Mode {
    std::string name;
    void (*set)(TrainConfig&);
    int dp;
    bool alone = true;  // the mode runs without cp at this dp (else: against the plain run)
  };
  const auto shard = [](TrainConfig& c) { c.optimizer.sharding = parallel::Sharding::Weights; };
  const Mode modes[] = {
      {"--optimizer-state host",
       [](TrainConfig& c) { c.optimizer.state_tier = ooc::TierSpec::parse("host"); }, 1},
      {"--model-state host", [](TrainConfig& c) { c.model_state = ooc::TierSpec::parse("host"); },
       1},
      {"--shard weights", shard, 2},
      // Sharded over the two cp ranks alone (the replicas): no data-parallel rank needed.
      {"--shard weights --dp 1", shard, 1, false},
  };
  for (const Mode& m : modes) {
    TrainConfig one = gpt2_run({m.dp, 1, 1});
    if (m.alone) m.set(one);
    TrainConfig split = gpt2_run({m.dp, 1, 1, 2});
    m.set(split);
    expect_like_one_rank(train(split), train(one), initial_weights(one), m.name);
  }
}

// The run says how it is split, that the moments are sliced over the dp x cp replicas, and how
// much of the kv exchanges the overlap hid.
TEST(ContextParallelTraining, TheStartUpLinesShowTheGrid) {
  TrainConfig c = gpt2_run({2, 1, 1, 2}, 1);
  std::ostringstream out;
  c.out = &out;
  train(c);
  const std::string text = out.str();
  EXPECT_NE(text.find("4 ranks (dp=2 tp=1 pp=1 cp=2, thread backend)"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 2 (dp 1 tp 0 pp 0 cp 0)"), std::string::npos) << text;
  EXPECT_NE(text.find("1/4 of the model's"), std::string::npos) << text;
  // The summary says how much of the attention's exchanges the products hid.
  EXPECT_NE(
      text.find("tandem train: context parallelism (overlapped order): the kv exchanges ran "),
      std::string::npos)
      << text;
}

// A checkpoint holds whole tensors: one saved with cp 2 resumes with cp 1 and the other way,
// continuing as a run that never stopped.
TEST(ContextParallelTraining, ACheckpointMovesBetweenCpAndNone) {
  const TrainResult straight = train(gpt2_run({1, 1, 1}, 4));
  for (const auto& [before, after] :
       {std::pair{parallel::GridShape{1, 1, 1, 2}, parallel::GridShape{1, 1, 1, 1}},
        std::pair{parallel::GridShape{1, 1, 1, 1}, parallel::GridShape{2, 1, 1, 2}}}) {
    ScratchDir dir;
    TrainConfig first = gpt2_run(before, 2);
    first.eval_every = 0;
    first.save_dir = dir.path("ck");
    train(first);
    TrainConfig second = gpt2_run(after, 4);
    second.eval_every = 0;
    second.resume_dir = dir.path("ck");
    const TrainResult r = train(second);
    const std::string what = before.str() + " then " + after.str();
    ASSERT_EQ(r.losses.size(), 2u) << what;
    for (size_t i = 0; i < 2; ++i)
      EXPECT_NEAR(r.losses[i], straight.losses[2 + i], kLossTolerance) << what << " step " << i;
  }
}

}  // namespace context_parallel_training_test
}  // namespace tandem::train
