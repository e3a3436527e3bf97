// The blocks' model state in a slow tier (--model-state host|file:DIR): the same weights and
// losses, bitwise, as in-core training with a bucket a block, on data-, tensor- and
// pipeline-parallel grids, both tiers, both executors, AdamW and LAMB, bf16 gradients, beside
// every kind of activation plan; checkpoints move between in-core and streamed runs; and the
// settings it cannot serve are refused, naming the flag.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "support/cli.h"
#include "support/files.h"
#include "tandem/core/bytes.h"
#include "train/test_util.h"

namespace tandem::train {
namespace {

using exec::RunnerKind;
using testing::expect_bitwise;
using testing::ScratchDir;

TrainConfig run(parallel::GridShape grid, int layers) {
  TrainConfig c = testing::tiny_run(3);
  c.model.n_layers = layers;
  c.model.d_model = 32;
  c.model.dropout = 0.1f;  // recomputed units draw the same masks from the store's weights
  c.batch = 12;
  c.grid = grid;
  c.eval_every = 2;  // the validation's forward streams the blocks too
  c.synthetic_bytes = 1 << 15;
  c.optimizer.bucket_mb = 0.001;  // in-core: a bucket a block, as the store updates them
  c.keep_weights = true;
  return c;
}

struct Case {
  parallel::GridShape grid;
  int layers;
  int micro_batches = 1;
  int resident = 0;  // --resident-blocks
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.grid.str() << " M=" << c.micro_batches << " resident " << c.resident;
}

class ModelState : public ::testing::TestWithParam<Case> {};

TEST_P(ModelState, WeightsBitwiseAsInCoreOnBothTiers) {
  const Case& cs = GetParam();
  ScratchDir dir;
  TrainConfig in_core = run(cs.grid, cs.layers);
  in_core.micro_batches = cs.micro_batches;
  const TrainResult ref = train(in_core);
  for (const std::string& tier : {std::string("host"), "file:" + dir.path()}) {
    TrainConfig c = in_core;
    c.model_state = ooc::TierSpec::parse(tier);
    c.resident_blocks = cs.resident;
    const TrainResult r = train(c);
    EXPECT_EQ(r.resident_blocks, cs.resident) << tier;
    expect_bitwise(ref, r, tier);
    EXPECT_EQ(r.val_losses, ref.val_losses) << tier;
    EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "the tier's file is never visible";
  }
}

INSTANTIATE_TEST_SUITE_P(Grids, ModelState,
                         // More blocks per rank than the store has weight slots: blocks are
                         // evicted and read back. With several micro-batches, gradient sums
                         // go out to the tier and back between a block's backwards (more blocks
                         // than gradient slots), interleaved with forwards under 1F1B.
                         ::testing::Values(Case{{1, 1, 1}, 6}, Case{{2, 1, 1}, 6},
                                           Case{{3, 1, 1}, 5}, Case{{1, 2, 1}, 5},
                                           Case{{1, 1, 2}, 10}, Case{{2, 2, 2}, 10},
                                           Case{{1, 1, 1}, 6, 3}, Case{{2, 1, 1}, 5, 2},
                                           Case{{1, 2, 1}, 5, 2}, Case{{1, 1, 2}, 10, 3},
                                           Case{{2, 2, 2}, 10, 2},
                                           // The last blocks resident, the rest streaming.
                                           Case{{1, 1, 1}, 6, 1, 2}, Case{{2, 1, 1}, 6, 2, 1},
                                           Case{{1, 1, 2}, 10, 3, 2}, Case{{2, 2, 2}, 10, 2, 1}));

TEST(ModelStateVariants, CompiledExecutorLambAndBf16Gradients) {
  auto both = [](TrainConfig c, const std::string& what) {
    const TrainResult ref = train(c);
    c.model_state = ooc::TierSpec::parse("host");
    expect_bitwise(ref, train(c), what);
  };
  TrainConfig c = run({2, 1, 1}, 6);
  c.executor = RunnerKind::Compiled;
  both(c, "compiled");
  c.optimizer.kind = parallel::OptimizerKind::Lamb;
  both(c, "lamb");
  c.optimizer.kind = parallel::OptimizerKind::AdamW;
  c.grad_dtype = DType::BF16;
  both(c, "bf16 gradients");
  c.grad_dtype = DType::F32;
  c.optimizer.exchange = parallel::GradExchange::After;  // each block's update still runs at once
  both(c, "exchange after");
}

// Every kind of activation plan (keep, swap, recompute, checkpoint-recompute chains, prefetch
// distances) beside the streamed blocks: a recomputed unit reads its block's weights again.
TEST(ModelStateVariants, BesideOutOfCoreActivationPlans) {
  for (const char* plan :
       {"SRCKsRCKSRCK/p1", "RCCCCCCCCCCC/p2", "RRRRRRRRRRRR/p1", "KSKSsKsKKSKS/p3"}) {
    TrainConfig c = run({1, 1, 1}, 6);
    const TrainResult ref = train(c);
    c.memory_budget = "64MiB";
    c.ooc_plan = plan;
    c.model_state = ooc::TierSpec::parse("host");
    c.resident_blocks = 0;  // every block streams (the budget would hold them all)
    const TrainResult r = train(c);
    EXPECT_EQ(r.ooc_plan, plan);
    expect_bitwise(ref, r, plan);
  }
}

// A checkpoint written while streaming resumes in-core, and the other way round, bitwise.
TEST(ModelStateVariants, CheckpointsMoveBetweenInCoreAndStreamed) {
  ScratchDir dir;
  TrainConfig straight = run({2, 1, 1}, 6);
  straight.steps = 4;
  straight.eval_every = 0;
  const TrainResult want = train(straight);
  for (const bool streamed_first : {true, false}) {
    const std::string ck = dir.path(streamed_first ? "from-streamed" : "from-in-core");
    TrainConfig first = straight;
    first.steps = 2;
    first.save_dir = ck;
    if (streamed_first) first.model_state = ooc::TierSpec::parse("file:" + dir.path());
    train(first);
    TrainConfig second = straight;
    second.resume_dir = ck;
    if (!streamed_first) second.model_state = ooc::TierSpec::parse("host");
    const TrainResult got = train(second);
    EXPECT_EQ(got.weights, want.weights) << (streamed_first ? "streamed, then in-core" : "back");
  }
}

// --memory-budget holds the model state in memory (the blocks' slots, the embeddings and ln_f with
// their gradients and moments) and the activations together: too small a budget is refused naming
// both and the smallest that works; the run trains at exactly that budget, and a byte less is
// refused (so all of it is counted in it).
TEST(ModelStateVariants, TheBudgetHoldsTheModelStateInMemoryAndTheActivations) {
  TrainConfig c = run({1, 1, 1}, 6);
  c.steps = 2;
  c.eval_every = 0;
  c.model_state = ooc::TierSpec::parse("host");
  c.memory_budget = "1MiB";  // the activations alone need about 850 KiB
  const std::string error = testing::user_error_of([&] { train(c); });
  EXPECT_THAT(error, ::testing::HasSubstr(
                         "--memory-budget 1.00 MiB holds the model state in memory (slots, "
                         "embeddings and ln_f) ("))
      << error;
  const size_t at = error.find("give at least ");
  ASSERT_NE(at, std::string::npos) << error;
  const uint64_t smallest = std::stoull(error.substr(error.find('(', at) + 1));
  c.memory_budget = std::to_string(smallest);
  const TrainResult at_smallest = train(c);
  EXPECT_GT(at_smallest.ooc_high_water, 0u);
  EXPECT_GE(smallest, at_smallest.state_memory_bytes + at_smallest.ooc_high_water);
  // 64 more rows of wpe add their weights, gradients and two moments to what the budget holds.
  TrainConfig wider = c;
  wider.memory_budget = std::to_string(2 * smallest);
  wider.resident_blocks = 0;  // the same blocks streamed in both
  const uint64_t before = train(wider).state_memory_bytes;
  wider.model.max_positions += 64;
  const uint64_t rows = 64 * static_cast<uint64_t>(wider.model.d_model) * sizeof(float);
  EXPECT_EQ(train(wider).state_memory_bytes, before + 4 * rows);
  c.memory_budget = std::to_string(smallest - 1);
  EXPECT_THAT(testing::user_error_of([&] { train(c); }),
              ::testing::HasSubstr(fmt::format("({} bytes)", smallest)));
}

// With room in --memory-budget the planner keeps blocks resident: the weights are still bitwise
// in-core's, resident blocks write nothing back (a step writes exactly the streamed blocks'
// weights and moments, as predicted), and fewer bytes are read than with every block streaming.
// A budget with no room keeps none.
TEST(ModelStateVariants, ThePlannerKeepsBlocksResidentWhereTheBudgetHasRoom) {
  TrainConfig c = run({1, 1, 1}, 8);
  c.steps = 3;
  c.eval_every = 0;
  const TrainResult ref = train(c);
  c.model_state = ooc::TierSpec::parse("host");
  c.memory_budget = "256MiB";  // the slots and the activations need about 3 MiB
  const TrainResult chosen = train(c);
  expect_bitwise(ref, chosen, "resident blocks");
  EXPECT_EQ(chosen.resident_blocks, 8) << "every block fits, and each one kept saves I/O";
  EXPECT_EQ(chosen.state_written_bytes, 0u);
  EXPECT_EQ(chosen.state_read_bytes, 0u);

  c.resident_blocks = 3;
  const TrainResult three = train(c);
  expect_bitwise(ref, three, "3 resident");
  EXPECT_EQ(three.resident_blocks, 3);
  EXPECT_EQ(three.state_written_bytes, 3 * three.state_predicted_written);
  c.resident_blocks = 0;
  const TrainResult none = train(c);
  EXPECT_EQ(none.state_written_bytes, 3 * none.state_predicted_written);
  EXPECT_LT(three.state_written_bytes, none.state_written_bytes);
  EXPECT_LT(three.state_read_bytes, none.state_read_bytes);

  // The smallest budget that holds the slots and the activations leaves no room for a block.
  c.resident_blocks = Auto<int>();
  c.memory_budget = "1MiB";
  const std::string error = testing::user_error_of([&] { train(c); });
  const size_t at = error.find("give at least ");
  ASSERT_NE(at, std::string::npos) << error;
  c.memory_budget =
      error.substr(error.find('(', at) + 1, error.find(" bytes)", at) - error.find('(', at) - 1);
  EXPECT_EQ(train(c).resident_blocks, 0);
}

// --resident-blocks is refused without a streamed model state, naming what it needs, and a value
// that is neither a count nor auto is refused naming the flag.
TEST(ModelStateVariants, ResidentBlocksNeedAModelState) {
  TrainConfig c = run({1, 1, 1}, 2);
  c.resident_blocks = 1;
  EXPECT_THAT(testing::user_error_of([&] { train(c); }),
              ::testing::HasSubstr("--resident-blocks 1 keeps blocks of a streamed model state in "
                                   "memory: it needs --model-state"));
  for (const char* bad : {"-1", "some", "2x"}) {
    const tandem::testing::CommandResult r =
        tandem::testing::run_tandem(std::string("train --resident-blocks=") + bad);
    EXPECT_EQ(r.status, 1) << bad;
    EXPECT_EQ(r.output, fmt::format("tandem: error: --resident-blocks {}: give a count of blocks "
                                    "(0 or more) or auto\n",
                                    bad));
  }
}

// --trace has a "model state" row naming every read and write-back of the store, gradient sums
// included when a step has several micro-batches.
TEST(ModelStateVariants, TheTraceShowsTheStoresTransfers) {
  ScratchDir dir;
  TrainConfig c = run({1, 1, 1}, 6);
  c.steps = 2;
  c.eval_every = 0;
  c.micro_batches = 2;
  c.model_state = ooc::TierSpec::parse("host");
  c.trace_path = dir.path("trace.json");
  train(c);
  const std::string trace = tandem::testing::read_bytes(c.trace_path);
  for (const char* want :
       {"\"model state\"", "\"read h.5 weights\"", "\"read h.0 moments\"",
        "\"write h.0 weights, moments\"", "\"write h.5 gradients\"", "\"read h.5 gradients\""})
    EXPECT_NE(trace.find(want), std::string::npos) << want;
}

TEST(ModelStateVariants, WhatItCannotServeIsRefused) {
  TrainConfig c = run({1, 1, 1}, 2);
  c.model_state = ooc::TierSpec::parse("host");
  c.optimizer.clip_grad_norm = 1.0;
  EXPECT_EQ(testing::user_error_of([&] { train(c); }),
            "--model-state host updates each block before the whole gradient's norm is known; "
            "--clip-grad-norm cannot be used with it");
  c.optimizer.clip_grad_norm.reset();
  c.optimizer.state_tier = ooc::TierSpec::parse("host");
  EXPECT_EQ(testing::user_error_of([&] { train(c); }),
            "--model-state host already keeps the optimizer state in its tier; leave out "
            "--optimizer-state");
  c.optimizer.state_tier.reset();
  const tandem::testing::CommandResult flag =
      tandem::testing::run_tandem("train --model-state disk");
  EXPECT_EQ(flag.status, 1);
  EXPECT_EQ(flag.output,
            "tandem: error: --model-state disk: write memory, host (a slow tier in host memory) or "
            "file:DIR (an O_DIRECT file in folder DIR)\n");
  c.model_state = ooc::TierSpec::parse("file:/proc/no-such-folder");
  EXPECT_THAT(testing::user_error_of([&] { train(c); }),
              ::testing::HasSubstr("--model-state file:/proc/no-such-folder: slow tier folder "
                                   "'/proc/no-such-folder' cannot be created"));
}

}  // namespace
}  // namespace tandem::train
