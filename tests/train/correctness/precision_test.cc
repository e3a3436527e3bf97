// Training with bf16 matmuls (--precision bf16): the loss tracks the fp32 run's, data-, tensor-
// and pipeline-parallel runs match the single-rank bf16 run as the fp32 ones match theirs,
// out-of-core and streamed model state give bitwise the in-core bf16 weights, and a checkpoint
// (f32 master weights) resumes in either precision.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>

#include "support/bf16_emulate.h"
#include "support/cli.h"
#include "tandem/train/trainer.h"
#include "train/test_util.h"

namespace tandem::train {
namespace {

using testing::expect_bitwise;
using testing::initial_weights;
using testing::relative_update_difference;
using testing::ScratchDir;

TrainConfig bf16_run(parallel::GridShape grid = {1, 1, 1}, int64_t steps = 4) {
  TrainConfig c = testing::tiny_run(steps);
  c.model.d_model = 32;
  c.model.matmul = DType::BF16;
  c.batch = 8;
  c.seed = 3;
  c.grid = grid;
  c.synthetic_bytes = 1 << 15;
  c.keep_weights = true;
  return c;
}

// 300 steps at make run's learning rate (validation over 8 batches at the end).
TrainConfig three_hundred_steps(parallel::GridShape grid) {
  TrainConfig c = bf16_run(grid, 300);
  c.lr = 3e-3;
  c.warmup = 30;
  c.eval_every = 300;
  c.batch = 16;
  c.eval_batches = 8;
  return c;
}

// `got`'s loss within 2% of `want`'s after the same steps: the validation loss and the mean of the
// last 20 training losses (one step's batch alone is noisier than that).
void expect_loss_within_two_percent(const TrainResult& got, const TrainResult& want,
                                    const char* what) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  ASSERT_EQ(got.val_losses.size(), 1u);
  ASSERT_EQ(want.val_losses.size(), 1u);
  EXPECT_NE(got.weights, want.weights) << what << ": the runs computed the same";
  auto tail_mean = [](const std::vector<double>& l) {
    double s = 0;
    for (size_t i = l.size() - 20; i < l.size(); ++i) s += l[i];
    return s / 20;
  };
  const double want_tail = tail_mean(want.losses), got_tail = tail_mean(got.losses);
  EXPECT_LT(want_tail, want.losses.front() - 1.0) << "the runs must have learnt something";
  EXPECT_NEAR(got_tail, want_tail, 0.02 * want_tail) << what;
  const double want_val = want.val_losses[0].second, got_val = got.val_losses[0].second;
  EXPECT_NEAR(got_val, want_val, 0.02 * want_val) << what;
  std::printf(
      "%s: loss after 300 steps: training (last 20) %.4f against %.4f, validation %.4f "
      "against %.4f\n",
      what, got_tail, want_tail, got_val, want_val);
}

// The accuracy check, on a smaller model than make run's: with the same seed, the bf16
// run's loss is within 2% of fp32's. bf16 operands round each product by about 2^-8; the sums, the
// optimizer and the master weights are f32, so the runs differ by noise, not drift.
TEST(Precision, Bf16LossWithinTwoPercentOfFp32) {
  TrainConfig c = three_hundred_steps({1, 1, 1});
  const TrainResult bf16 = train(c);
  c.model.matmul = DType::F32;
  expect_loss_within_two_percent(bf16, train(c), "bf16 matmuls against f32");
}

// Gradients exchanged in bf16 (--grad-dtype bf16) on two data-parallel ranks of a bf16 run: each
// rank's gradient is rounded to bf16 (a relative 2^-8 at most, unbiased), summed in f32 and
// rounded again; the moments and the master weights stay f32, so the loss tracks the f32
// gradients' within the same 2%.
TEST(Precision, Bf16GradientsLossWithinTwoPercentOfF32Gradients) {
  TrainConfig c = three_hundred_steps({2, 1, 1});
  c.grad_dtype = DType::BF16;
  const TrainResult bf16 = train(c);
  c.grad_dtype = DType::F32;
  expect_loss_within_two_percent(bf16, train(c), "bf16 gradients against f32");
}

// The tensor-parallel exchanges in bf16 (--tp-dtype bf16) on two tensor-parallel ranks: each
// projection's partial product is rounded to bf16 before the sum and the sum once more, and the
// backward's input-gradient partials likewise (each a relative 2^-8 at most, unbiased); the
// residual stream, the optimizer and the master weights stay f32, so the loss tracks the f32
// exchanges' within the same 2%.
TEST(Precision, Bf16TensorParallelExchangesLossWithinTwoPercentOfF32) {
  TrainConfig c = three_hundred_steps({1, 2, 1});
  c.tp_dtype = DType::BF16;
  const TrainResult bf16 = train(c);
  EXPECT_EQ(bf16.tp_dtype, DType::BF16);
  c.tp_dtype = DType::F32;
  expect_loss_within_two_percent(bf16, train(c), "bf16 tensor-parallel exchanges against f32");
}

// As trainer_test's equivalence of the fp32 grids, with the same tolerances: the parallel runs
// sum the same f32 terms in other orders (per-rank GEMMs, reductions), and in bf16 every rank
// rounds the same operands (the tensor-parallel epilogue multiplies the rounded values).
void expect_matches_one_rank(const TrainConfig& cfg, const std::string& what,
                             double loss_tol = 2e-4, double weights_tol = 1e-2) {
  TrainConfig one = cfg;
  one.grid = {1, 1, 1};
  one.micro_batches = 0;
  one.tp_dtype = DType::F32;
  const TrainResult want = train(one);
  const TrainResult got = train(cfg);
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], want.losses[i], loss_tol) << what << " step " << i;
    worst = std::max(worst, std::abs(got.losses[i] - want.losses[i]));
  }
  const double weights =
      relative_update_difference(got.weights, want.weights, initial_weights(cfg));
  EXPECT_LT(weights, weights_tol) << what;
  std::printf("%s: largest loss difference %.3g, relative weight difference %.3g\n", what.c_str(),
              worst, weights);
}

// The same grids with the tensor-parallel exchanges in bf16 (--tp-dtype bf16). The one-rank run
// rounds nothing it sums; these round each rank's partial product (and the backward's partial
// input gradient) to bf16 before the sum, and the sum once more: to nearest, so at most half
// bf16's spacing each, 2^-8 relative, twice, per element of two of a block's four projections'
// outputs and of its two input gradients. That is the size of the error the bf16 operands
// already make against f32 (2^-8 per operand of every product), so these runs differ from the
// one-rank run as a bf16 run differs from an fp32 one, not as a reordered f32 sum does: a loss
// near 5.5 moved by a relative 2^-8 would be 2e-2 off, but the errors are unbiased and average
// over the B x T x C = 4096 elements, leaving about 2^-8 / sqrt(4096) ~ 6e-5 relative, 3e-4 of
// the loss; the bound takes 1e-3 (not 2e-4), and the weights a few percent of the distance
// training moved them (5e-2, not 1e-2). Measured: 2.5e-4 and 1.75% (tp = 2; the 2 x 2 x 2 grid
// the same: dp and pp add only f32 reorderings).
constexpr double kWireLossTol = 1e-3, kWireWeightsTol = 5e-2;

TEST(PrecisionGrids, TensorParallelBf16Exchanges) {
  TrainConfig c = bf16_run({1, 2, 1});
  c.tp_dtype = DType::BF16;
  expect_matches_one_rank(c, "tp=2, bf16 exchanges", kWireLossTol, kWireWeightsTol);
}

TEST(PrecisionGrids, AllThreeBf16Exchanges) {
  TrainConfig c = bf16_run({2, 2, 2});
  c.micro_batches = 2;
  c.tp_dtype = DType::BF16;
  expect_matches_one_rank(c, "2x2x2, bf16 exchanges", kWireLossTol, kWireWeightsTol);
}

TEST(PrecisionGrids, DataParallel) { expect_matches_one_rank(bf16_run({2, 1, 1}), "dp=2"); }

TEST(PrecisionGrids, TensorParallel) { expect_matches_one_rank(bf16_run({1, 2, 1}), "tp=2"); }

TEST(PrecisionGrids, PipelineParallel) {
  TrainConfig c = bf16_run({1, 1, 2});
  c.micro_batches = 4;
  expect_matches_one_rank(c, "pp=2");
}

TEST(PrecisionGrids, AllThree) {
  TrainConfig c = bf16_run({2, 2, 2});
  c.micro_batches = 2;
  expect_matches_one_rank(c, "2x2x2");
}

// Memory placement never changes a bit: activations out-of-core and the blocks' model state in
// a slow tier, in bf16 as in fp32 (the bf16 scratch is in the workspace the planner places).
void expect_placement_bitwise(parallel::GridShape grid, DType tp_dtype) {
  TrainConfig c = bf16_run(grid, 3);
  c.tp_dtype = tp_dtype;
  c.model.n_layers = 4;
  c.model.dropout = 0.1f;  // recomputed units draw the same masks
  c.eval_every = 2;
  c.optimizer.bucket_mb = 0.001;  // a bucket a block, as the block store updates them
  const TrainResult in_core = train(c);
  TrainConfig ooc = c;
  ooc.memory_budget = "64MiB";
  ooc.ooc_plan = "SRCKsRCK/p1";
  expect_bitwise(in_core, train(ooc), "out-of-core " + ooc.ooc_plan);
  TrainConfig streamed = c;
  streamed.model_state = ooc::TierSpec::parse("host");
  expect_bitwise(in_core, train(streamed), "--model-state host");
}

TEST(PrecisionMemory, OutOfCoreAndModelStateBitwiseAsInCore) {
  expect_placement_bitwise({1, 1, 1}, DType::F32);
}

// With the tensor-parallel exchanges in bf16 the epilogue binds the saved bf16 activation and a
// bf16 copy of the weights in the workspace: still wherever the planner places them.
TEST(PrecisionMemory, TensorParallelBf16ExchangesOutOfCoreAndModelStateBitwiseAsInCore) {
  expect_placement_bitwise({1, 2, 1}, DType::BF16);
}

// A checkpoint holds the f32 master weights: resuming in bf16 continues bitwise, and the same
// checkpoint resumes in fp32.
TEST(PrecisionCheckpoint, ResumesInEitherPrecision) {
  ScratchDir dir;
  const TrainConfig straight = bf16_run({1, 1, 1}, 6);
  const TrainResult whole = train(straight);
  TrainConfig first = straight;
  first.save_dir = dir.path("ck");
  first.save_every = 3;
  first.steps = 3;
  train(first);
  TrainConfig again = straight;
  again.resume_dir = dir.path("ck");
  const TrainResult bf16 = train(again);
  EXPECT_EQ(bf16.first_step, 3);
  EXPECT_EQ(bf16.weights, whole.weights);
  again.model.matmul = DType::F32;
  const TrainResult f32 = train(again);
  EXPECT_EQ(f32.first_step, 3);
  ASSERT_EQ(f32.losses.size(), 3u);
  EXPECT_NE(f32.weights, whole.weights);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(f32.losses[i], whole.losses[3 + i], 2e-2) << i;
}

TEST(PrecisionFlag, TheStartUpLineSaysWhich) {
  const auto r = tandem::testing::run_tandem(
      "train --model tiny --steps 1 --dp 1 --tp 1 --eval-every 0 --executor plan --precision bf16");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("precision bf16: the linear layers' and the LM head's matmuls on bf16"),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace tandem::train
