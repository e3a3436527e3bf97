// Llama-family models through the training loop: the loss falls, data, tensor and pipeline
// parallelism match one rank, out-of-core plans, streamed and sharded model state give bitwise the
// in-core weights, a resumed run continues bitwise (and on another grid), bf16 follows f32, and
// grids that split a key/value head are refused.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "tandem/core/bytes.h"
#include "tandem/core/error.h"
#include "tandem/train/trainer.h"
#include "train/test_util.h"

namespace tandem::train {
namespace llama_training_test {

using testing::expect_bitwise;
using testing::initial_weights;
using testing::relative_update_difference;
using testing::ScratchDir;

// A tiny Llama: grouped-query attention (4 heads sharing 2 key/value heads), an MLP narrower than
// 4 x d_model, an untied head; dropout so that recomputed and gathered units must draw the same
// masks.
TrainConfig llama_run(parallel::GridShape grid, int layers, int64_t steps = 3) {
  TrainConfig c = testing::tiny_run(steps);
  c.model.arch = nn::Arch::Llama;
  c.model.n_layers = layers;
  c.model.n_heads = 4;
  c.model.kv_heads = 2;
  c.model.d_model = 32;
  c.model.ffn = 48;
  c.model.tie_embeddings = false;
  c.model.dropout = 0.1f;
  c.batch = 12;
  c.grid = grid;
  c.eval_every = 2;
  c.synthetic_bytes = 1 << 15;
  c.keep_weights = true;
  return c;
}

TEST(LlamaTraining, LossFallsOnTheSyntheticCorpus) {
  TrainConfig c = llama_run({1, 1, 1}, 2, 40);
  c.model.dropout = 0.0f;
  c.model.tie_embeddings = true;
  c.lr = 3e-3;
  c.warmup = 5;
  c.eval_every = 40;
  c.eval_batches = 2;
  const TrainResult r = train(c);
  ASSERT_EQ(r.losses.size(), 40u);
  EXPECT_NEAR(r.losses.front(), std::log(256.0), 0.3);  // an untrained model: ~uniform over bytes
  EXPECT_LT(r.losses.back(), r.losses.front() - 1.5);
  ASSERT_EQ(r.val_losses.size(), 1u);
  EXPECT_LT(r.val_losses[0].second, r.losses.front() - 1.5);
}

// A grid sums the same gradients in other orders (per-rank GEMMs, the exchanges): the equivalence
// tolerance of the GPT-2 grids (trainer_test.cc). Tensor parallelism splits the query heads and
// the key/value heads (4 and 2 over tp 2: a key/value head a rank), the SwiGLU gate and up
// column-parallel and the down projection row-parallel.
TEST(LlamaTraining, GridsMatchOneRank) {
  TrainConfig one = llama_run({1, 1, 1}, 4, 4);
  // The Megatron epilogue draws its residual dropout from the DSL's stream, not nn's: with
  // dropout the grids match their own in-core runs (the bitwise tests below), not one rank.
  one.model.dropout = 0.0f;
  const TrainResult want = train(one);
  for (parallel::GridShape grid : {parallel::GridShape{2, 1, 1}, parallel::GridShape{1, 2, 1},
                                   parallel::GridShape{1, 1, 2}, parallel::GridShape{2, 2, 2}}) {
    TrainConfig c = one;
    c.grid = grid;
    if (grid.pp > 1) c.micro_batches = 2;
    const TrainResult got = train(c);
    ASSERT_EQ(got.losses.size(), want.losses.size()) << grid.str();
    for (size_t i = 0; i < want.losses.size(); ++i)
      EXPECT_NEAR(got.losses[i], want.losses[i], 2e-4) << grid.str() << " step " << i;
    EXPECT_LT(relative_update_difference(got.weights, want.weights, initial_weights(one)), 1e-2)
        << grid.str();
  }
}

TEST(LlamaTraining, OutOfCorePlansBitwiseAsInCore) {
  for (const auto& [grid, plan] : {std::pair{parallel::GridShape{1, 1, 1}, "SRCKsRCK/p1"},
                                   std::pair{parallel::GridShape{1, 1, 1}, "RRRRRRRR/p1"},
                                   std::pair{parallel::GridShape{1, 2, 1}, "RCSsRCKK/p1"},
                                   std::pair{parallel::GridShape{1, 1, 2}, "SKRK/p1"}}) {
    const TrainConfig in_core = llama_run(grid, 4);
    const TrainResult ref = train(in_core);
    TrainConfig c = in_core;
    c.memory_budget = "64MiB";
    c.slow_tier = ooc::TierSpec::parse("host");
    c.ooc_plan = plan;
    const TrainResult r = train(c);
    EXPECT_EQ(r.ooc_plan, plan);
    expect_bitwise(ref, r, plan);
    EXPECT_EQ(r.val_losses, ref.val_losses) << plan;
    EXPECT_LE(r.ooc_high_water, parse_bytes(c.memory_budget)) << plan;
  }
}

TEST(LlamaTraining, StreamedAndShardedModelStateBitwiseAsInMemory) {
  ScratchDir dir;
  for (parallel::GridShape grid : {parallel::GridShape{2, 1, 1}, parallel::GridShape{2, 2, 2}}) {
    TrainConfig in_core = llama_run(grid, grid.pp > 1 ? 10 : 5);
    in_core.optimizer.bucket_mb = 0.001;  // a bucket a block, as the store updates them
    in_core.micro_batches = grid.pp;      // the same split as the streamed run (whose default is 1)
    const TrainResult ref = train(in_core);
    for (const std::string& tier : {std::string("host"), "file:" + dir.path()}) {
      TrainConfig c = in_core;
      c.model_state = ooc::TierSpec::parse(tier);
      expect_bitwise(ref, train(c), grid.str() + " streamed from " + tier);
    }
    TrainConfig sharded = llama_run(grid, grid.pp > 1 ? 10 : 5);
    sharded.micro_batches = grid.pp;
    const TrainResult unsharded = train(sharded);
    sharded.optimizer.sharding = parallel::Sharding::Weights;
    expect_bitwise(unsharded, train(sharded), grid.str() + " --shard weights");
  }
}

// A checkpoint records the Llama fields: the run resumes bitwise, and a run asking for another
// block is refused naming the field.
TEST(LlamaTraining, ResumesBitwiseAndRefusesAnotherBlock) {
  ScratchDir dir;
  // Without dropout, so that another grid's run is comparable (GridsMatchOneRank).
  auto run = [](parallel::GridShape grid) {
    TrainConfig c = llama_run(grid, 2, 6);
    c.model.dropout = 0.0f;
    return c;
  };
  const TrainResult straight = train(run({1, 1, 1}));
  TrainConfig first = run({1, 1, 1});
  first.save_dir = dir.path("ck");
  first.save_every = 3;
  first.steps = 3;
  const TrainResult a = train(first);
  TrainConfig second = run({1, 1, 1});
  second.resume_dir = dir.path("ck");
  const TrainResult b = train(second);
  std::vector<double> joined = a.losses;
  joined.insert(joined.end(), b.losses.begin(), b.losses.end());
  EXPECT_EQ(joined, straight.losses);
  EXPECT_EQ(b.weights, straight.weights);

  // On another grid: re-sharded, the losses to the equivalence tolerance.
  TrainConfig regrid = run({1, 2, 2});
  regrid.micro_batches = 2;
  regrid.resume_dir = dir.path("ck");
  const TrainResult c = train(regrid);
  ASSERT_EQ(c.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(c.losses[i], straight.losses[3 + i], 2e-4) << i;

  TrainConfig other = second;
  other.model.kv_heads = 4;
  EXPECT_THAT(testing::user_error_of([&] { train(other); }),
              ::testing::HasSubstr("was trained with kv_heads 2, this run asks for 4"));
  TrainConfig gpt2 = second;
  gpt2.model = testing::tiny_run(1).model;
  gpt2.model.d_model = 32;
  gpt2.model.n_heads = 4;
  EXPECT_THAT(testing::user_error_of([&] { train(gpt2); }), ::testing::HasSubstr("arch"));
}

// bf16 matmuls (RMSNorm, the rotation and the softmax stay f32): the losses follow the f32 run's.
TEST(LlamaTraining, Bf16FollowsF32) {
  TrainConfig c = llama_run({1, 1, 1}, 2, 4);
  c.model.dropout = 0.0f;
  const TrainResult f32 = train(c);
  c.model.matmul = DType::BF16;
  const TrainResult bf16 = train(c);
  ASSERT_EQ(bf16.losses.size(), f32.losses.size());
  for (size_t i = 0; i < f32.losses.size(); ++i)
    EXPECT_NEAR(bf16.losses[i], f32.losses[i], 2e-2 * f32.losses[i]) << "step " << i;
}

TEST(LlamaTraining, QkvBiasAndMultiQueryAttentionTrain) {
  TrainConfig c = llama_run({1, 1, 1}, 2, 20);
  c.model.dropout = 0.0f;
  c.model.kv_heads = 1;
  c.model.qkv_bias = true;
  c.lr = 3e-3;
  const TrainResult r = train(c);
  EXPECT_LT(r.losses.back(), r.losses.front() - 0.5);
}

// bf16 exchanges between the tensor-parallel ranks (--tp-dtype bf16) follow the f32 wire.
TEST(LlamaTraining, Bf16TensorParallelExchangesFollowTheF32Wire) {
  TrainConfig c = llama_run({1, 2, 1}, 2, 4);
  c.model.dropout = 0.0f;
  c.model.matmul = DType::BF16;
  const TrainResult f32 = train(c);
  c.tp_dtype = DType::BF16;
  const TrainResult bf16 = train(c);
  ASSERT_EQ(bf16.losses.size(), f32.losses.size());
  for (size_t i = 0; i < f32.losses.size(); ++i)
    EXPECT_NEAR(bf16.losses[i], f32.losses[i], 1e-2 * f32.losses[i]) << "step " << i;
}

TEST(LlamaTraining, GridsThatSplitAKeyValueHeadAreRefused) {
  TrainConfig c = llama_run({1, 4, 1}, 2);  // 4 query heads, 2 key/value heads
  EXPECT_THAT(testing::user_error_of([&] { train(c); }),
              ::testing::HasSubstr("--tp 4 must divide the key/value heads (2, --kv-heads)"));
  c = llama_run({1, 2, 1}, 2);
  c.model.ffn = 47;
  EXPECT_THAT(testing::user_error_of([&] { train(c); }),
              ::testing::HasSubstr("--tp 2 must divide the MLP's width (47, --ffn)"));
}

}  // namespace llama_training_test
}  // namespace tandem::train
