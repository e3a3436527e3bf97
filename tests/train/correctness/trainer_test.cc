// The training loop end to end on tiny models: data-, tensor- and pipeline-parallel runs match
// a single-rank run of the same global batch and seed, a resumed run continues bitwise like one
// that never stopped, the loss falls on the synthetic corpus, and bad checkpoints are refused
// with a message that says what is wrong.
#include "tandem/train/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tandem/core/error.h"
#include "tandem/io/checkpoint_series.h"
#include "train/test_util.h"

namespace tandem::train {
namespace {

using testing::initial_weights;
using testing::relative_update_difference;
using testing::ScratchDir;

TrainConfig tiny(parallel::GridShape grid = {1, 1, 1}, int64_t steps = 4) {
  TrainConfig c;
  c.model.n_layers = 2;
  c.model.n_heads = 2;
  c.model.d_model = 16;
  c.model.seq_len = 16;
  c.model.max_positions = 16;
  c.batch = 8;
  c.steps = steps;
  c.lr = 1e-2;
  c.warmup = 2;
  c.seed = 3;
  c.grid = grid;
  c.synthetic_bytes = 1 << 15;
  c.eval_every = 0;
  c.progress = false;
  c.keep_weights = true;
  c.blas_threads = 1;
  static std::ostringstream sink;  // the summary lines, unread
  c.out = &sink;
  return c;
}

// Tolerance of the equivalence: the parallel runs sum the same terms in other orders (per-rank
// GEMMs, ReduceScatter/AllReduce), so after 4 AdamW steps losses agree to 2e-4 and the weights'
// difference is below 1% of the distance they moved (Adam's normalised step turns rounding-level
// gradient differences into update differences only where a gradient is ~0).
void expect_equivalent(const TrainConfig& cfg, const std::string& what) {
  const TrainResult want = train(tiny({1, 1, 1}, cfg.steps));
  const TrainResult got = train(cfg);
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t i = 0; i < want.losses.size(); ++i)
    EXPECT_NEAR(got.losses[i], want.losses[i], 2e-4) << what << " step " << i;
  ASSERT_EQ(got.weights.size(), want.weights.size());
  EXPECT_LT(relative_update_difference(got.weights, want.weights, initial_weights(cfg)), 1e-2)
      << what;
}

TEST(TrainerEquivalence, DataParallelMatchesOneRank) {
  TrainConfig c = tiny({2, 1, 1});
  const TrainResult r = train(c);
  EXPECT_EQ(r.optimizer_schedule, "fused(RS-C-AG)+slice(m,v)");
  expect_equivalent(c, "dp=2");
}

TEST(TrainerEquivalence, DataAndTensorParallelMatchOneRank) {
  expect_equivalent(tiny({2, 2, 1}), "dp=2 tp=2");
}

TEST(TrainerEquivalence, PipelineParallelMatchesOneRank) {
  TrainConfig c = tiny({1, 1, 2});
  c.micro_batches = 4;
  expect_equivalent(c, "pp=2");
}

// Within the losses' tolerance above, not bitwise: at dp = 2 the gradients are summed in another
// order, and both of LAMB's norms, ||w|| and ||r||, are sums of the two ranks' f32 partial sums of
// their slices, which round differently from one rank's sum over the whole tensor.
TEST(TrainerEquivalence, LambDataParallelMatchesOneRank) {
  TrainConfig one = tiny({1, 1, 1});
  one.optimizer.kind = parallel::OptimizerKind::Lamb;
  TrainConfig two = tiny({2, 1, 1});
  two.optimizer.kind = parallel::OptimizerKind::Lamb;
  const TrainResult want = train(one);
  const TrainResult got = train(two);
  for (size_t i = 0; i < want.losses.size(); ++i)
    EXPECT_NEAR(got.losses[i], want.losses[i], 2e-4) << i;
}

// The executors run the same schedules: the JIT-compiled code and the plan runner compute what
// the reference interpreter computes in the same order of operations, so the runs agree to the
// last bit or nearly (the interpreter does not fuse; fusion keeps each element's arithmetic).
TEST(TrainerExecutors, CompiledPlanAndReferenceExecutorsAgree) {
  TrainConfig c = tiny({2, 2, 1}, 3);
  c.executor = exec::RunnerKind::Compiled;
  const TrainResult compiled = train(c);
  c.executor = exec::RunnerKind::Plan;
  const TrainResult plan = train(c);
  c.executor = exec::RunnerKind::Reference;
  const TrainResult reference = train(c);
  EXPECT_EQ(compiled.executor, "compiled (JIT)");
  EXPECT_EQ(plan.executor, "plan runner");
  for (size_t i = 0; i < compiled.losses.size(); ++i) {
    EXPECT_NEAR(compiled.losses[i], plan.losses[i], 1e-6) << i;
    EXPECT_NEAR(compiled.losses[i], reference.losses[i], 1e-6) << i;
  }
  EXPECT_LT(relative_update_difference(compiled.weights, reference.weights, initial_weights(c)),
            1e-4);
}

// Mixed precision: bf16 gradients in the optimizer program (f32 master weights and moments)
// follow the f32 run to bf16's resolution (8 bits of mantissa: ~0.4% per gradient).
TEST(Trainer, Bf16GradientsFollowTheF32Run) {
  TrainConfig c = tiny({2, 1, 1}, 4);
  const TrainResult f32 = train(c);
  c.grad_dtype = DType::BF16;
  const TrainResult bf16 = train(c);
  ASSERT_EQ(bf16.losses.size(), f32.losses.size());
  EXPECT_EQ(bf16.losses[0], f32.losses[0]);  // the first loss comes before any update
  for (size_t i = 1; i < f32.losses.size(); ++i)
    EXPECT_NEAR(bf16.losses[i], f32.losses[i], 2e-2) << i;
  EXPECT_NE(bf16.weights, f32.weights);  // the gradients really were rounded
}

TEST(Trainer, LossFallsOnTheSyntheticCorpus) {
  TrainConfig c = tiny({1, 1, 1}, 40);
  c.model.d_model = 32;
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

// Stopping after 3 steps and resuming gives bitwise the losses and weights of 6 uninterrupted
// steps, with the optimizer state sliced over dp and the model sharded over tp.
TEST(TrainerResume, ContinuesBitwiseLikeAnUninterruptedRun) {
  for (parallel::GridShape grid : {parallel::GridShape{1, 1, 1}, parallel::GridShape{2, 2, 1}}) {
    ScratchDir dir;
    const TrainResult straight = train(tiny(grid, 6));
    TrainConfig first = tiny(grid, 6);
    first.save_dir = dir.path("ck");
    first.save_every = 3;
    first.steps = 3;
    const TrainResult a = train(first);
    TrainConfig second = tiny(grid, 6);
    second.resume_dir = dir.path("ck");
    const TrainResult b = train(second);
    EXPECT_EQ(b.first_step, 3);
    std::vector<double> joined = a.losses;
    joined.insert(joined.end(), b.losses.begin(), b.losses.end());
    EXPECT_EQ(joined, straight.losses) << grid.str();
    EXPECT_EQ(b.weights, straight.weights) << grid.str();
  }
}

// --save keeps the newest --keep-checkpoints step folders; --resume takes the folder of them (its
// `latest`) or any one of them, and continues bitwise like the run that did not stop.
TEST(TrainerResume, FromTheSaveFolderOrOneStepFolder) {
  ScratchDir dir;
  TrainConfig first = tiny({1, 1, 1}, 6);
  first.save_dir = dir.path("ck");
  first.save_every = 1;
  first.keep_checkpoints = 3;
  const TrainResult straight = train(first);
  EXPECT_EQ(dir.list("ck"), (std::vector<std::string>{"latest", "step-00000004", "step-00000005",
                                                      "step-00000006"}));
  for (const std::string from : {"ck", "ck/step-00000004"}) {
    TrainConfig second = tiny({1, 1, 1}, 6);
    second.resume_dir = dir.path(from);
    const TrainResult b = train(second);
    const int64_t at = from == "ck" ? 6 : 4;
    EXPECT_EQ(b.first_step, at) << from;
    EXPECT_EQ(b.losses, std::vector<double>(straight.losses.begin() + at, straight.losses.end()))
        << from;
    EXPECT_EQ(b.weights, straight.weights) << from;
  }
}

// A checkpoint from one grid resumes on another: the whole-model weights and moments are
// re-sharded (the loss then matches to the equivalence tolerance, not bitwise).
TEST(TrainerResume, ResumesOnAnotherGrid) {
  ScratchDir dir;
  TrainConfig first = tiny({2, 2, 1}, 3);
  first.save_dir = dir.path("ck");
  train(first);
  TrainConfig second = tiny({1, 1, 2}, 6);
  second.micro_batches = 2;
  second.resume_dir = dir.path("ck");
  const TrainResult b = train(second);
  const TrainResult straight = train(tiny({1, 1, 1}, 6));
  ASSERT_EQ(b.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(b.losses[i], straight.losses[3 + i], 2e-4) << i;
}

TEST(TrainerCheckpoint, WeightsUseGpt2NamesAndLoadForEval) {
  ScratchDir dir;
  TrainConfig c = tiny({1, 2, 1}, 2);
  c.save_dir = dir.path("ck");
  const TrainResult r = train(c);
  const LoadedModel m = load_model(dir.path("ck"));
  EXPECT_EQ(m.meta.step, 2);
  EXPECT_EQ(m.config.d_model, 16);
  const float* w = m.params.flat().data_as<float>();
  EXPECT_EQ(std::vector<float>(w, w + m.params.size()), r.weights);
  EXPECT_EQ(m.params["h.1.attn.c_attn.weight"].shape(), (Shape{16, 48}));
  std::vector<uint8_t> text(200);
  for (size_t i = 0; i < text.size(); ++i) text[i] = static_cast<uint8_t>('a' + i % 7);
  const auto [loss, scored] = evaluate_windows(m.params, text, 16, 4, 0);
  EXPECT_EQ(scored, 12 * 16);  // 199 targets hold 12 full windows of 16
  EXPECT_TRUE(std::isfinite(loss));
}

// eval's --precision bf16: the same weights multiplied with bf16 operands score close to fp32
// (each product's operands rounded to 8 bits of mantissa, the sums in f32), but not the same.
TEST(TrainerCheckpoint, EvalInBf16TracksFp32) {
  ScratchDir dir;
  TrainConfig c = tiny({1, 1, 1}, 2);
  c.save_dir = dir.path("ck");
  train(c);
  std::vector<uint8_t> text(400);
  for (size_t i = 0; i < text.size(); ++i) text[i] = static_cast<uint8_t>('a' + i * 7 % 11);
  const LoadedModel f32 = load_model(dir.path("ck"));
  const LoadedModel bf16 = load_model(dir.path("ck"), DType::BF16);
  EXPECT_EQ(bf16.config.matmul, DType::BF16);
  const double a = evaluate_windows(f32.params, text, 16, 4, 0).first;
  const double b = evaluate_windows(bf16.params, text, 16, 4, 0).first;
  EXPECT_NE(a, b);
  EXPECT_NEAR(b, a, 0.01 * a);
}

std::string error_of(const TrainConfig& c) {
  try {
    train(c);
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TrainerCheckpoint, RefusesAModelThatDoesNotMatch) {
  ScratchDir dir;
  TrainConfig first = tiny({1, 1, 1}, 1);
  first.save_dir = dir.path("ck");
  train(first);
  TrainConfig other = tiny({1, 1, 1}, 2);
  other.model.d_model = 32;
  other.resume_dir = dir.path("ck");
  EXPECT_EQ(error_of(other), "checkpoint '" + dir.path("ck") +
                                 "' was trained with d_model 16, this run asks for 32");
  TrainConfig lamb = tiny({1, 1, 1}, 2);
  lamb.optimizer.kind = parallel::OptimizerKind::Lamb;
  lamb.resume_dir = dir.path("ck");
  EXPECT_EQ(error_of(lamb), "checkpoint '" + dir.path("ck") +
                                "' was trained with optimizer adamw, this run asks for lamb");
}

TEST(TrainerCheckpoint, RefusesACorruptCheckpoint) {
  ScratchDir dir;
  TrainConfig first = tiny({1, 1, 1}, 1);
  first.save_dir = dir.path("ck");
  train(first);
  const std::string weights = io::resolve_checkpoint(dir.path("ck")) + "/weights.safetensors";
  std::filesystem::resize_file(weights, std::filesystem::file_size(weights) - 100);
  TrainConfig resume = tiny({1, 1, 1}, 2);
  resume.resume_dir = dir.path("ck");
  const std::string msg = error_of(resume);
  EXPECT_NE(msg.find("weights.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("corrupt"), std::string::npos) << msg;
  EXPECT_THROW(load_model(dir.path("ck")), UserError);
}

TEST(TrainerConfig, RefusesGridsThatDoNotFit) {
  TrainConfig c = tiny({3, 1, 1});
  EXPECT_EQ(error_of(c), "--batch 8 does not split evenly over --dp 3 data-parallel ranks");
  c = tiny({1, 4, 1});
  EXPECT_EQ(error_of(c), "--tp 4 must divide the number of heads (2)");
  c = tiny({1, 1, 3});
  EXPECT_EQ(error_of(c), "--pp 3 needs at least 3 layers; the model has 2");
  c = tiny({2, 1, 1});
  c.micro_batches = 3;
  EXPECT_EQ(error_of(c),
            "each data-parallel rank's 4 rows do not split evenly into 3 micro-batches "
            "(--batch 8, --dp 2, --micro-batches 3)");
}

}  // namespace
}  // namespace tandem::train
