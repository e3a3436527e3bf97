// Flags and small cases a user meets: parse errors in tandem's own form, sizes named by their
// flags, an automatic micro-batch count that fits the batch, --steps 0 saving the initial model,
// --model refused with --resume when it is not the checkpoint's, eval and sample flags checked,
// eval without the optimizer state, a learning rate beyond f32, and a full disk under --metrics
// saving the checkpoint before the run stops.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <regex>

#include "support/cli.h"
#include "tandem/io/checkpoint_series.h"
#include "train/test_util.h"

namespace tandem::train {
namespace {

using tandem::testing::run_tandem;
using ::testing::HasSubstr;
using testing::ScratchDir;
using testing::user_error_of;
namespace fs = std::filesystem;

TEST(Flags, ParseErrorsAreTandemErrors) {
  auto r = run_tandem("train --steps abc");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(
      r.output,
      "tandem: error: Could not convert: --steps = abc (tandem train --help lists the flags)\n");
  r = run_tandem("eval");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.output,
            "tandem: error: --checkpoint is required (tandem eval --help lists the flags)\n");
  r = run_tandem("trian");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.output,
            "tandem: error: 'trian' is not a tandem command; the commands are info, tokenize, "
            "train, plan, eval, sample, export, tune, emit\n");
  r = run_tandem("train --help");
  EXPECT_EQ(r.status, 0);
  EXPECT_THAT(r.output, HasSubstr("--layers"));
}

// A value no check abbreviated (here a 10 000-character preset name echoed back) is shown cut in
// the middle by the error itself (core/error.h), keeping its start, its end and its length.
TEST(Flags, AnOverlongValueInAMessageIsCutInTheMiddle) {
  const auto r = run_tandem("train --model " + std::string(10000, 'x'));
  EXPECT_EQ(r.status, 1);
  EXPECT_LT(r.output.size(), 600u) << r.output.size() << " bytes";
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("tandem: error: --model xxx"));
  EXPECT_THAT(r.output, ::testing::ContainsRegex("xxx[^ ]* \\(1000[0-9] characters\\)"));
  EXPECT_THAT(r.output, HasSubstr("the presets are"));
}

TEST(Flags, ModelSizesAreNamedByTheirFlags) {
  auto r = run_tandem("train --layers 0");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.output, "tandem: error: --layers 0 must be at least 1\n");
  TrainConfig c = testing::tiny_run(1);
  c.model.d_model = 10;
  c.model.n_heads = 4;
  EXPECT_EQ(user_error_of([&] { c.validate(); }), "--d-model 10 must be divisible by --heads 4");
  c = testing::tiny_run(1);
  c.model.seq_len = 0;
  EXPECT_EQ(user_error_of([&] { c.validate(); }), "--seq-len 0 must be at least 1");
}

// The Llama fields: refused on a GPT-2 model, each bad value named by its flag.
TEST(Flags, LlamaFieldsAreNamedByTheirFlags) {
  const std::pair<const char*, const char*> cases[] = {
      {"train --kv-heads 2",
       "tandem: error: --kv-heads is a Llama field: add --arch llama (or a "
       "Llama --model)\n"},
      {"train --qkv-bias",
       "tandem: error: --qkv-bias is a Llama field: add --arch llama (or a "
       "Llama --model)\n"},
      {"train --tie-embeddings false",
       "tandem: error: --tie-embeddings false is a Llama field: add --arch llama (or a Llama "
       "--model)\n"},
      {"train --model smollm-135m --arch gpt2",
       "tandem: error: --arch gpt2 disagrees with --model smollm-135m, a llama model\n"},
      {"train --arch llama --kv-heads 0",
       "tandem: error: --kv-heads 0 must be at least 1 (1: multi-query attention)\n"},
      {"train --arch llama --kv-heads 3", "tandem: error: --kv-heads 3 must divide --heads 4\n"},
      {"train --arch llama --norm-eps 0",
       "tandem: error: --norm-eps 0 must be a positive number\n"},
      {"train --arch llama --rope-scaling llama3:8,1",
       "tandem: error: --rope-scaling llama3:8,1: --rope-scaling is none or "
       "llama3:FACTOR,LOW,HIGH,ORIGINAL (e.g. llama3:32,1,4,8192)\n"},
      {"train --arch llama --tp 4 --kv-heads 2",
       "tandem: error: --tp 4 must divide the key/value heads (2, --kv-heads): each rank keeps "
       "whole key/value heads\n"},
  };
  for (const auto& [args, message] : cases) {
    const auto r = run_tandem(args);
    EXPECT_EQ(r.status, 1) << args;
    EXPECT_EQ(r.output, message) << args;
  }
}

// Without --lr: a preset's own rate at its own width, else the width's, else a resumed run's; the
// start-up lines say which.
TEST(Flags, TheLearningRateFollowsThePresetTheWidthAndTheCheckpoint) {
  const std::string small = "train --dp 1 --tp 1 --quiet --seq-len 16 --batch 2 ";
  const std::string run = small + "--steps 0 ";
  auto r = run_tandem(run + "--model tiny");
  EXPECT_THAT(r.output, HasSubstr("learning rate 0.003 (the default for d_model 64), warm-up 30 "
                                  "steps, cosine decay to 0.0003\n"));
  r = run_tandem(run + "--model tiny --d-model 256 --heads 4");
  EXPECT_THAT(r.output, HasSubstr("learning rate 0.0015 (the default for d_model 256)"));
  r = run_tandem(run + "--model gpt2 --layers 1");
  EXPECT_THAT(r.output, HasSubstr("learning rate 0.0006 (--model gpt2's), warm-up 100 steps"));
  r = run_tandem(run + "--model gpt2 --layers 1 --d-model 96 --heads 2 --lr 1e-3 --warmup 5");
  EXPECT_THAT(r.output, HasSubstr("learning rate 0.001, warm-up 5 steps,"));
  ScratchDir dir;
  r = run_tandem(small + "--model tiny --steps 1 --lr 2e-3 --warmup 7 --save " + dir.path("ck"));
  ASSERT_EQ(r.status, 0) << r.output;
  r = run_tandem(small + "--steps 2 --resume " + dir.path("ck"));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("learning rate 0.002 (the checkpoint's), warm-up 7 steps"));
  // A resumed model keeps its positions: a longer --seq-len is refused with both numbers.
  r = run_tandem("train --dp 1 --tp 1 --quiet --batch 2 --steps 2 --seq-len 17 --resume " +
                 dir.path("ck"));
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.output,
            "tandem: error: --seq-len 17 is more than the model's 16 positions (set when it was "
            "first trained; GPT-2 learns a vector a position): at most 16\n");
}

TEST(Flags, ShardNamesItsChoices) {
  const auto r = run_tandem("train --shard zero");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.output,
            "tandem: error: --shard zero: the data-parallel ranks shard the moments (ZeRO-1) or "
            "the weights (ZeRO-3: weights, gradients and moments)\n");
}

TEST(Flags, TpDtypeNamesItsChoicesAndNeedsBf16Precision) {
  for (const char* bad : {"f16", "fp32", "BF16"}) {
    const auto r = run_tandem(std::string("train --tp 2 --tp-dtype ") + bad);
    EXPECT_EQ(r.status, 1) << bad;
    EXPECT_EQ(r.output, std::string("tandem: error: --tp-dtype ") + bad +
                            ": the tensor-parallel dtypes are f32 and bf16 (or auto: the "
                            "autotuner's choice)\n");
  }
  const std::string needs =
      "--tp-dtype bf16 carries bf16 matmul operands and products between the tensor-parallel "
      "ranks: it needs --precision bf16 (this run's precision is fp32; --tp-dtype f32 or auto "
      "trains it)";
  const auto r = run_tandem("train --tp 2 --precision fp32 --tp-dtype bf16");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.output, "tandem: error: " + needs + "\n");
  // The same refusal for a config made in code, and for a type the flag cannot name.
  TrainConfig c = testing::tiny_run(1);
  c.grid.tp = 2;
  c.tp_dtype = DType::BF16;
  EXPECT_EQ(user_error_of([&] { c.validate(); }), needs);
  c.tp_dtype = DType::F16;
  c.model.matmul = DType::BF16;
  EXPECT_EQ(user_error_of([&] { c.validate(); }),
            "--tp-dtype f16: the tensor-parallel dtypes are f32 and bf16 (or auto: the "
            "autotuner's choice)");
}

TEST(Flags, GatherAheadIsACountOrAuto) {
  for (const char* bad : {"0", "-1", "two", "2x"}) {
    const auto r = run_tandem(std::string("train --shard weights --gather-ahead ") + bad);
    EXPECT_EQ(r.status, 1) << bad;
    EXPECT_EQ(r.output, std::string("tandem: error: --gather-ahead ") + bad +
                            ": give a count of blocks (1 or more) or auto\n");
  }
  const auto r = run_tandem("train --gather-ahead 2");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.output,
            "tandem: error: --gather-ahead 2 sets how far ahead --shard weights gathers the "
            "blocks' weights: it needs --shard weights (got --shard moments)\n");
  const auto far = run_tandem("train --shard weights --layers 6 --pp 2 --gather-ahead 3");
  EXPECT_EQ(far.status, 1);
  EXPECT_EQ(far.output,
            "tandem: error: --gather-ahead 3: a pipeline stage holds 3 blocks here, so at most 2 "
            "can be gathered ahead of the one computing\n");
}

// --stage-layers: one count of layers a stage, --pp of them, each at least 1, summing to
// --layers, with a pipeline; each mistake one error naming both numbers.
TEST(Flags, StageLayersAreOneCountAStageSummingToTheLayers) {
  const std::string five = "train --layers 5 --dp 1 --tp 1 ";
  const std::pair<std::string, std::string> cases[] = {
      {"--pp 2 --stage-layers 1,2,2",
       "--stage-layers 1,2,2 gives 3 counts, one a stage, but --pp is 2"},
      {"--pp 3 --stage-layers 5", "--stage-layers 5 gives 1 count, one a stage, but --pp is 3"},
      {"--pp 2 --stage-layers 0,5",
       "--stage-layers 0,5: stage 0 gets 0 layers; each stage needs at least 1"},
      {"--pp 2 --stage-layers=6,-1",
       "--stage-layers 6,-1: stage 1 gets -1 layers; each stage needs at least 1"},
      {"--pp 2 --stage-layers 2,2",
       "--stage-layers 2,2 sums to 4 layers; the model has 5 (--layers)"},
      {"--pp 2 --stage-layers 3,4",
       "--stage-layers 3,4 sums to 7 layers; the model has 5 (--layers)"},
      {"--stage-layers 5",
       "--stage-layers 5 splits a pipeline's layers over its stages: it needs --pp 2 or more "
       "(got --pp 1)"},
      {"--pp 2 --stage-layers 2,x",
       "--stage-layers 2,x: 'x' is not a count of layers; give one integer a stage, separated by "
       "commas (e.g. 3,5)"},
      {"--pp 2 --stage-layers 2,,3",
       "--stage-layers 2,,3: '' is not a count of layers; give one integer a stage, separated by "
       "commas (e.g. 3,5)"},
  };
  for (const auto& [args, error] : cases) {
    const auto r = run_tandem(five + args);
    EXPECT_EQ(r.status, 1) << args;
    EXPECT_EQ(r.output, "tandem: error: " + error + "\n") << args;
  }
  // A split is a fixed-size value: at most 64 stages.
  std::string many = "1";
  for (int i = 1; i < 65; ++i) many += ",1";
  const auto r = run_tandem("train --layers 65 --dp 1 --tp 1 --pp 65 --stage-layers " + many);
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.output, "tandem: error: --stage-layers " + many +
                          ": 65 counts; a split names at most 64 stages (a longer pipeline "
                          "splits its layers evenly)\n");
  // The plan across grids chooses the split.
  for (const char* mode : {"train --grid auto --ranks 2", "plan --model tiny --ranks 2"}) {
    const auto r = run_tandem(std::string(mode) + " --stage-layers 1,1");
    EXPECT_EQ(r.status, 1) << mode;
    EXPECT_THAT(r.output, HasSubstr("chooses --stage-layers: leave it out")) << mode;
  }
}

TEST(Flags, PrecisionNamesItsChoices) {
  const auto r = run_tandem("train --precision fp16");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.output,
            "tandem: error: --precision fp16: the precisions are fp32, bf16 and auto (bf16 where "
            "the CPU has AVX512_BF16)\n");
}

// --attention names its two kernels when given neither (train and plan), and the one given
// reaches the run: the start-up line names the unfused kernel, and the settings the ranks agree on
// carry it (settings_test).
TEST(Flags, AttentionNamesItsChoices) {
  for (const char* command : {"train", "plan --memory-budget 1GiB"}) {
    const auto r = run_tandem(std::string(command) + " --attention flash");
    EXPECT_EQ(r.status, 1) << command;
    EXPECT_EQ(r.output,
              "tandem: error: --attention flash: the attention kernels are fused (blocked, saves a "
              "value a row: the default) and unfused (saves the T x T softmax: the reference)\n")
        << command;
  }
  const std::string tiny = "train --model tiny --dp 1 --tp 1 --steps 1 --eval-every 0 ";
  auto r = run_tandem(tiny + "--attention unfused");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("(2 heads, unfused attention, ")) << r.output;
  r = run_tandem(tiny + "--attention fused");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, ::testing::Not(HasSubstr("unfused"))) << r.output;
}

// 2 x pp micro-batches do not divide 4 rows at pp 3: the automatic count is 4, which does.
TEST(Flags, AutomaticMicroBatchesDivideTheRows) {
  TrainConfig c = testing::tiny_run(1);
  c.model.n_layers = 3;
  c.batch = 8;
  c.grid = {2, 1, 3};
  EXPECT_EQ(c.micro_batch_count(), 4);
  c.batch = 14;  // 7 rows: no divisor in [3, 6]; 7 is the smallest above
  EXPECT_EQ(c.micro_batch_count(), 7);
  c.batch = 4;  // 2 rows, fewer than the stages: one row each
  EXPECT_EQ(c.micro_batch_count(), 2);
  c.batch = 24;  // 12 rows: 2 x pp = 6 divides them, as before
  EXPECT_EQ(c.micro_batch_count(), 6);
  c.batch = 8;
  c.grid = {1, 1, 3};
  c.micro_batches = 0;
  EXPECT_EQ(train(c).losses.size(), 1u);
}

TEST(Flags, StepsZeroSavesTheInitialModel) {
  ScratchDir dir;
  TrainConfig c = testing::tiny_run(0);
  c.save_dir = dir.path("ck");
  c.keep_weights = true;
  const std::vector<float> initial = train(c).weights;
  EXPECT_EQ(testing::read_bytes(dir.path("ck/latest")), "step-00000000\n");
  const LoadedModel m = load_model(dir.path("ck"));
  EXPECT_EQ(m.meta.step, 0);
  ASSERT_EQ(static_cast<size_t>(m.params.flat().numel()), initial.size());
  EXPECT_EQ(std::memcmp(m.params.flat().data(), initial.data(), initial.size() * sizeof(float)), 0);
  // Resumed from it, a run is the run that never stopped.
  TrainConfig whole = testing::tiny_run(2);
  whole.keep_weights = true;
  TrainConfig resumed = whole;
  resumed.resume_dir = dir.path("ck");
  EXPECT_EQ(train(resumed).weights, train(whole).weights);
}

TEST(Flags, ModelWithResumeMustBeTheCheckpointsModel) {
  ScratchDir dir;
  const std::string common = " --dp 1 --tp 1 --executor plan --eval-every 0 --quiet";
  auto r = run_tandem("train --model tiny --steps 1 --save '" + dir.path("ck") + "'" + common);
  ASSERT_EQ(r.status, 0) << r.output;
  r = run_tandem("train --model small --steps 2 --resume '" + dir.path("ck") + "'" + common);
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.output,
              HasSubstr("tandem: error: checkpoint '" + dir.path("ck") + "' was trained with "));
  EXPECT_THAT(r.output, HasSubstr("this run asks for "));
  r = run_tandem("train --model tiny --steps 2 --resume '" + dir.path("ck") + "'" + common);
  EXPECT_EQ(r.status, 0) << r.output;
}

TEST(Flags, EvalAndSampleFlagsAreChecked) {
  const std::pair<const char*, const char*> cases[] = {
      {"eval --checkpoint x --seq-len 0", "--seq-len 0 must be at least 1"},
      {"eval --checkpoint x --max-windows -1", "--max-windows -1 must be 0 (all) or more"},
      {"sample --checkpoint x --temperature nan",
       "--temperature nan must be a finite number, 0 or more"},
      {"sample --checkpoint x --temperature inf",
       "--temperature inf must be a finite number, 0 or more"},
  };
  for (const auto& [args, message] : cases) {
    const auto r = run_tandem(args);
    EXPECT_EQ(r.status, 1) << args;
    EXPECT_EQ(r.output, std::string("tandem: error: ") + message + "\n") << args;
  }
}

TEST(Flags, EvalDoesNotNeedTheOptimizerState) {
  ScratchDir dir;
  TrainConfig c = testing::tiny_run(1);
  c.save_dir = dir.path("ck");
  train(c);
  fs::remove(io::resolve_checkpoint(dir.path("ck")) + "/optimizer.safetensors");
  const auto r = run_tandem("eval --max-windows 2 --checkpoint '" + dir.path("ck") + "'");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("checkpoint at step 1"));
}

TEST(Flags, EvalAndSampleTakeThePrecision) {
  ScratchDir dir;
  TrainConfig c = testing::tiny_run(1);
  c.save_dir = dir.path("ck");
  train(c);
  const std::string ck = " --checkpoint '" + dir.path("ck") + "'";
  auto r = run_tandem("eval --max-windows 2 --precision bf16" + ck);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("checkpoint at step 1, bf16 matmuls"));
  r = run_tandem("sample --tokens 4 --prompt ab --precision bf16" + ck);
  EXPECT_EQ(r.status, 0) << r.output;
  for (const char* command : {"eval", "sample"}) {
    r = run_tandem(std::string(command) + " --precision half" + ck);
    EXPECT_EQ(r.status, 1) << command;
    EXPECT_THAT(r.output, HasSubstr("--precision half: the precisions are fp32, bf16 and auto"))
        << command;
  }
}

TEST(Flags, LearningRateBeyondF32IsRefused) {
  TrainConfig c = testing::tiny_run(1);
  c.lr = 1e39;
  EXPECT_EQ(user_error_of([&] { train(c); }),
            "--lr 1e+39 must be positive and finite in f32 (at most 3.40282e+38)");
}

// A metrics file that cannot grow (a full disk; here a file-size limit, which fails the write
// the same way) stops the run after the step whose line was lost, with that step's checkpoint
// saved: the model trained so far is not lost.
TEST(Flags, FullDiskUnderMetricsSavesTheCheckpointFirst) {
  ScratchDir dir;
  TrainConfig c = testing::tiny_run(1000);
  c.model.n_layers = 1;
  c.model.n_heads = 1;
  c.model.d_model = 4;
  c.model.seq_len = 8;
  c.model.max_positions = 8;
  c.save_dir = dir.path("ck");
  c.metrics_path = dir.path("m.jsonl");
  std::string m;
  {
    testing::FileSizeLimit limit(24 << 10);  // the checkpoint's files are smaller
    m = user_error_of([&] { train(c); });
  }
  std::smatch got;
  ASSERT_TRUE(std::regex_match(
      m, got,
      std::regex(
          "cannot write metrics file '.*/m.jsonl': File too large; training stopped after step "
          "([0-9]+); the checkpoint at step \\1 is saved in '.*/ck/step-0*\\1': resume from it "
          "once "
          "the output can be written")))
      << m;
  const int64_t step = std::stoll(got[1]);
  EXPECT_GT(step, 1);
  EXPECT_EQ(load_model(dir.path("ck")).meta.step, step);
}

}  // namespace
}  // namespace tandem::train
