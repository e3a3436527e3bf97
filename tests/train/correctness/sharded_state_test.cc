// The model state sharded across the data-parallel ranks (--shard weights, ZeRO-3): each rank
// keeps 1/dp of every block's weights and moments, gathers a block's weights before using them,
// and updates its slice with the slice(w,m,v) schedule. The weights and losses are bitwise those
// of unsharded (ZeRO-1) training, whose update is the same reduce-scatter and the same arithmetic
// on the same slices: on dp, dp x tp, dp x pp and 2 x 2 x 2 grids, uneven slices, several
// micro-batches, the exchange after the backward, every executor, LAMB, bf16 gradients and matmuls,
// beside out-of-core activation plans (a recomputed unit gathers again). A checkpoint is the same
// file whatever the sharding, so a run resumes under another sharding and another grid.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "support/files.h"
#include "tandem/parallel/shard.h"
#include "tandem/parallel/sharded_blocks.h"
#include "train/test_util.h"

namespace tandem::train {
namespace {

using testing::expect_bitwise;
using testing::ScratchDir;

TrainConfig sharded_run(parallel::GridShape grid, int layers) {
  TrainConfig c = testing::tiny_run(3);
  c.model.n_layers = layers;
  c.model.d_model = 32;
  c.model.dropout = 0.1f;  // a gathered block draws the same masks as the whole one
  c.batch = 12;
  c.grid = grid;
  c.eval_every = 2;  // the validation's forward gathers the blocks too
  c.synthetic_bytes = 1 << 15;
  c.keep_weights = true;
  return c;
}

TrainResult sharded(TrainConfig c) {
  c.optimizer.sharding = parallel::Sharding::Weights;
  return train(c);
}

struct ShardedCase {
  parallel::GridShape grid;
  int layers;
  int micro_batches = 1;
};

void PrintTo(const ShardedCase& c, std::ostream* os) {
  *os << c.grid.str() << " M=" << c.micro_batches;
}

class ShardedState : public ::testing::TestWithParam<ShardedCase> {};

TEST_P(ShardedState, WeightsBitwiseAsUnsharded) {
  const ShardedCase& cs = GetParam();
  TrainConfig c = sharded_run(cs.grid, cs.layers);
  c.micro_batches = cs.micro_batches;
  const TrainResult ref = train(c);
  const TrainResult r = sharded(c);
  expect_bitwise(ref, r, "sharded");
  EXPECT_EQ(r.val_losses, ref.val_losses);
  EXPECT_THAT(r.optimizer_schedule, ::testing::HasSubstr("slice(w,m,v) (blocks)"));
}

INSTANTIATE_TEST_SUITE_P(Grids, ShardedState,
                         // More blocks than gather and gradient slots; dp 3 cuts a block's
                         // elements into unequal slices.
                         ::testing::Values(ShardedCase{{2, 1, 1}, 5}, ShardedCase{{3, 1, 1}, 4},
                                           ShardedCase{{4, 1, 1}, 3}, ShardedCase{{2, 2, 1}, 4},
                                           ShardedCase{{2, 1, 2}, 6}, ShardedCase{{2, 2, 2}, 6},
                                           ShardedCase{{2, 1, 1}, 4, 2},
                                           ShardedCase{{2, 2, 1}, 4, 3}));

// Each rank's slices streamed from its own tier (--model-state with --shard weights): the same
// weights again, on both tiers, with more blocks than the store's slots, several micro-batches
// and resident blocks; and its checkpoint is the in-memory run's.
TEST(ShardedStateVariants, SlicesStreamedFromEachRanksTier) {
  ScratchDir dir;
  struct Tiered {
    parallel::GridShape grid;
    int layers, micro_batches, resident;
  };
  for (const Tiered& t : {Tiered{{2, 1, 1}, 6, 1, 0}, Tiered{{2, 2, 1}, 5, 2, 0},
                          Tiered{{2, 1, 2}, 10, 2, 1}, Tiered{{3, 1, 1}, 6, 1, 2}}) {
    TrainConfig c = sharded_run(t.grid, t.layers);
    c.micro_batches = t.micro_batches;
    const TrainResult ref = train(c);
    for (const std::string& tier : {std::string("host"), "file:" + dir.path()}) {
      TrainConfig s = c;
      s.model_state = ooc::TierSpec::parse(tier);
      s.resident_blocks = t.resident;
      const TrainResult r = sharded(s);
      const std::string what =
          fmt::format("{} M={} resident {} {}", t.grid.str(), t.micro_batches, t.resident, tier);
      EXPECT_EQ(r.resident_blocks, t.resident) << what;
      expect_bitwise(ref, r, what);
      EXPECT_EQ(r.val_losses, ref.val_losses) << what;
    }
  }
  TrainConfig c = sharded_run({2, 1, 1}, 6);
  c.steps = 2;
  c.eval_every = 0;
  c.save_dir = dir.path("in-memory");
  train(c);
  c.save_dir = dir.path("streamed");
  c.model_state = ooc::TierSpec::parse("file:" + dir.path());
  sharded(c);
  EXPECT_EQ(testing::read_bytes(dir.path("streamed/step-00000002/weights.safetensors")),
            testing::read_bytes(dir.path("in-memory/step-00000002/weights.safetensors")));
}

TEST(ShardedStateVariants, ExecutorsLambExchangeAfterAndBf16) {
  auto both = [](TrainConfig c, const std::string& what) {
    expect_bitwise(train(c), sharded(c), what);
  };
  TrainConfig c = sharded_run({2, 1, 1}, 4);
  c.executor = exec::RunnerKind::Compiled;
  both(c, "compiled");
  c.executor = exec::RunnerKind::Reference;
  both(c, "reference");
  c.executor = exec::RunnerKind::Plan;
  // LAMB's norms add the ranks' partial sums over the slices of a segment: a bucket a block, as
  // the sharded blocks are segments, cuts them the same way.
  c.optimizer.kind = parallel::OptimizerKind::Lamb;
  c.optimizer.bucket_mb = 0.001;
  both(c, "lamb");
  c.optimizer.kind = parallel::OptimizerKind::AdamW;
  c.optimizer.bucket_mb.reset();
  c.optimizer.exchange = parallel::GradExchange::After;  // each block's update still runs at once
  both(c, "exchange after");
  c.optimizer.exchange = parallel::GradExchange::Overlap;
  c.grad_dtype = DType::BF16;
  both(c, "bf16 gradients");
  c.grad_dtype = DType::F32;
  c.model.matmul = DType::BF16;
  both(c, "bf16 matmuls");
}

// Activation plans that recompute, swap and keep: a recomputed unit gathers its block again.
TEST(ShardedStateVariants, BesideOutOfCoreActivationPlans) {
  for (const char* plan : {"SRCKsRCK/p1", "RRRRRRRR/p2"}) {
    TrainConfig c = sharded_run({2, 1, 1}, 4);
    const TrainResult ref = train(c);
    c.memory_budget = "64MiB";
    c.ooc_plan = plan;
    const TrainResult r = sharded(c);
    EXPECT_EQ(r.ooc_plan, plan);
    expect_bitwise(ref, r, plan);
  }
}

// The checkpoint of a sharded run is the unsharded run's, byte for byte; each resumes the other,
// and a sharded run resumes on another grid.
TEST(ShardedStateVariants, CheckpointsAreTheSameFileWhateverTheSharding) {
  ScratchDir dir;
  TrainConfig straight = sharded_run({2, 1, 1}, 4);
  straight.steps = 4;
  straight.eval_every = 0;
  const TrainResult want = train(straight);

  TrainConfig first = straight;
  first.steps = 2;
  first.save_dir = dir.path("unsharded");
  train(first);
  first.save_dir = dir.path("sharded");
  sharded(first);
  for (const char* file : {"weights.safetensors", "optimizer.safetensors", "meta.json"})
    EXPECT_EQ(testing::read_bytes(dir.path("sharded/step-00000002/") + file),
              testing::read_bytes(dir.path("unsharded/step-00000002/") + file))
        << file;

  TrainConfig second = straight;
  second.resume_dir = dir.path("unsharded");
  EXPECT_EQ(sharded(second).weights, want.weights) << "unsharded, then sharded";
  second.resume_dir = dir.path("sharded");
  EXPECT_EQ(train(second).weights, want.weights) << "sharded, then unsharded";
  // dp 4 x tp 2 from a dp 2 checkpoint: the same steps as that grid continuing from it.
  second.grid = {4, 2, 1};
  const TrainResult other_grid = train(second);
  EXPECT_EQ(sharded(second).weights, other_grid.weights) << "sharded on another grid";
}

// Each rank holds 1/dp of the blocks' weights and moments, two gathered blocks and two blocks'
// gradients: less than unsharded training's whole weights, gradients and sliced moments.
TEST(ShardedStateVariants, EachRankHoldsItsSlices) {
  TrainConfig c = sharded_run({4, 1, 1}, 6);
  c.gather_ahead = 1;
  c.steps = 1;
  c.eval_every = 0;
  std::ostringstream out;
  c.out = &out;
  const TrainResult r = sharded(c);
  const nn::GPTConfig& m = c.model;
  const parallel::ShardLayout layout(m, c.grid, 0, 0);
  const int64_t per_block = layout.block_floats(), rest = layout.size() - per_block * m.n_layers;
  // Slices of weights, m and v; 2 gathered; 2 gradients; the rest whole (weights, gradients)
  // with its moments sliced.
  const uint64_t want = parallel::ShardedBlocks::state_bytes(per_block, m.n_layers, 4, 1, 1) +
                        static_cast<uint64_t>(2 * rest + 2 * ((rest + 3) / 4)) * sizeof(float);
  EXPECT_LE(r.state_memory_bytes, want + 64) << out.str();
  EXPECT_GE(r.state_memory_bytes, want - 64) << out.str();
  EXPECT_LT(r.state_memory_bytes,
            static_cast<uint64_t>(2 * nn::gpt_num_parameters(m)) * sizeof(float));
  EXPECT_THAT(out.str(), ::testing::HasSubstr("sharded over the 4 data-parallel ranks"));
}

// However far ahead the blocks are gathered (--gather-ahead D, D + 1 gather slots), the weights
// are bitwise unsharded training's: with several micro-batches, on a pipeline stage with as many
// slots as blocks (D = 3 of 4), beside a plan that recomputes (a recomputed unit gathers its block
// again), and with the slices streamed from a tier (whose own read-ahead skips what it has no slot
// for).
TEST(ShardedStateVariants, EveryGatherAheadGivesTheSameWeights) {
  struct Variant {
    std::string what;
    parallel::GridShape grid;
    int layers, micro_batches;
    std::string plan;
    bool streamed;
  };
  for (const Variant& v :
       {Variant{"dp2", {2, 1, 1}, 5, 1, "", false}, Variant{"dp2 M=2", {2, 1, 1}, 5, 2, "", false},
        Variant{"dp2 pp2", {2, 1, 2}, 8, 2, "", false},
        Variant{"recomputed", {2, 1, 1}, 4, 1, "SRCKsRCK/p1", false},
        Variant{"streamed", {2, 1, 1}, 6, 1, "", true}}) {
    TrainConfig c = sharded_run(v.grid, v.layers);
    c.micro_batches = v.micro_batches;
    const TrainResult ref = train(c);
    if (!v.plan.empty()) {
      c.memory_budget = "64MiB";
      c.ooc_plan = v.plan;
    }
    if (v.streamed) c.model_state = ooc::TierSpec{};  // host
    for (int d = 1; d <= 3; ++d) {
      c.gather_ahead = d;
      const TrainResult r = sharded(c);
      const std::string what = fmt::format("{}, --gather-ahead {}", v.what, d);
      expect_bitwise(ref, r, what);
      EXPECT_EQ(r.val_losses, ref.val_losses) << what;
    }
  }
}

// Each block gathered further ahead holds one more block's weights on each rank; the start-up
// line says how far ahead and why.
TEST(ShardedStateVariants, EachBlockAheadHoldsOneMoreBlock) {
  TrainConfig c = sharded_run({2, 1, 1}, 6);
  c.steps = 1;
  c.eval_every = 0;
  const parallel::ShardLayout layout(c.model, c.grid, 0, 0);
  const uint64_t block = static_cast<uint64_t>(layout.block_floats()) * sizeof(float);
  std::vector<uint64_t> bytes;
  for (int d = 1; d <= 3; ++d) {
    std::ostringstream out;
    c.out = &out;
    c.gather_ahead = d;
    bytes.push_back(sharded(c).state_memory_bytes);
    EXPECT_THAT(out.str(), ::testing::HasSubstr(fmt::format(
                               "gathered into {} slots before its forward and backward", d + 1)));
    EXPECT_THAT(out.str(), ::testing::HasSubstr(fmt::format("(--gather-ahead {})", d)));
  }
  EXPECT_EQ(bytes[1] - bytes[0], block);
  EXPECT_EQ(bytes[2] - bytes[1], block);
  std::ostringstream out;
  c.out = &out;
  c.gather_ahead = Auto<int>();
  sharded(c);
  EXPECT_THAT(out.str(), ::testing::HasSubstr("ahead (--gather-ahead auto: a gather "));
  EXPECT_THAT(out.str(), ::testing::HasSubstr(" ms, a block's forward "));
}

// The gathers show on the exchange's row of the trace, beside the updates they share a thread with.
TEST(ShardedStateVariants, TheTraceShowsTheGathers) {
  ScratchDir dir;
  TrainConfig c = sharded_run({2, 1, 1}, 4);
  c.steps = 2;
  c.eval_every = 0;
  c.trace_path = dir.path("trace.json");
  sharded(c);
  const std::string trace = testing::read_bytes(c.trace_path);
  for (const char* want : {"\"gather h.0\"", "\"gather h.3\"", "\"dp exchange h.3\""})
    EXPECT_NE(trace.find(want), std::string::npos) << want;
}

// A step of 6 blocks gathers each block once in the forward (a block gathered ahead is never
// given up for a farther one) and all but the forward's last D + 1 again in the backward (still
// in their slots when it turns): 12 - (D + 1) gathers a rank.
TEST(ShardedStateVariants, GatheredAheadBlocksStayUntilUsed) {
  ScratchDir dir;
  TrainConfig c = sharded_run({2, 1, 1}, 6);
  c.steps = 1;
  c.eval_every = 0;
  c.trace_path = dir.path("trace.json");
  for (int d = 1; d <= 3; ++d) {
    c.gather_ahead = d;
    sharded(c);
    const std::string trace = testing::read_bytes(c.trace_path);
    int gathers = 0;
    for (size_t at = trace.find("\"gather h."); at != std::string::npos;
         at = trace.find("\"gather h.", at + 1))
      ++gathers;
    EXPECT_EQ(gathers, 2 * (12 - (d + 1))) << "--gather-ahead " << d;
  }
}

TEST(ShardedStateVariants, WhatItCannotServeIsRefused) {
  TrainConfig c = sharded_run({1, 1, 1}, 2);
  c.optimizer.sharding = parallel::Sharding::Weights;
  EXPECT_THAT(testing::user_error_of([&] { train(c); }),
              ::testing::HasSubstr("--shard weights shards the model state across the "
                                   "data-parallel replicas (dp x cp ranks): it needs --dp or --cp "
                                   "2 or more (got --dp 1 --cp 1)"));
  c.grid = {2, 1, 1};
  c.optimizer.clip_grad_norm = 1.0;
  EXPECT_THAT(testing::user_error_of([&] { train(c); }),
              ::testing::HasSubstr("--clip-grad-norm cannot be used with it"));
  c.optimizer.clip_grad_norm.reset();
  // A schedule forced on the optimizer that keeps the weights whole.
  ::setenv("TANDEM_SCHEDULE_ADAM", "AR-C", 1);
  const std::string forced = testing::user_error_of([&] { train(c); });
  ::unsetenv("TANDEM_SCHEDULE_ADAM");
  EXPECT_THAT(forced, ::testing::HasSubstr("--shard weights needs an optimizer schedule that "
                                           "updates each rank's slice of the weights"));
  c.gather_ahead = 2;
  c.optimizer.sharding = parallel::Sharding::Moments;
  EXPECT_THAT(testing::user_error_of([&] { train(c); }),
              ::testing::HasSubstr("--gather-ahead 2 sets how far ahead --shard weights gathers "
                                   "the blocks' weights: it needs --shard weights (got --shard "
                                   "moments)"));
  c.optimizer.sharding = parallel::Sharding::Weights;
  c.gather_ahead = Auto<int>();
  c.optimizer.state_tier = ooc::TierSpec::parse("host");
  EXPECT_THAT(testing::user_error_of([&] { train(c); }),
              ::testing::HasSubstr("--shard weights with --optimizer-state host: the moments of a "
                                   "sharded model state go to a slow tier with its weights; give "
                                   "--model-state host instead"));
}

}  // namespace
}  // namespace tandem::train
