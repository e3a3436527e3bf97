// Checkpoints: RunMeta through JSON, a full save and load with every tensor bitwise equal, the
// folder layout, crash safety of a save, and config compatibility messages.
#include "tandem/io/checkpoint.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "support/files.h"
#include "support/scratch.h"

namespace tandem::io {
namespace {

using nlohmann::json;
using testing::ScratchDir;
using testing::user_error_of;

RunMeta sample_meta(int64_t step) {
  RunMeta m;
  m.model_config = {{"layers", 2}, {"heads", 4}, {"d_model", 64}, {"seq_len", 32}, {"vocab", 256}};
  m.step = step;
  m.data_source = "synthetic";
  m.data_fingerprint = "0123456789abcdef";
  m.data_position = step;
  m.rng_seed = (uint64_t{1} << 63) + 5;  // beyond int64: must survive JSON as unsigned
  m.rng_counter = 3 * static_cast<uint64_t>(step);
  m.optimizer = "adamw";
  m.optimizer_hparams = {{"lr", 3e-4}, {"beta1", 0.9}, {"beta2", 0.95}, {"weight_decay", 0.1}};
  m.extra = {{"dp", 2}, {"tp", 2}};
  return m;
}

Checkpoint sample_checkpoint(int64_t step) {
  Checkpoint c;
  c.meta = sample_meta(step);
  auto filled = [step](DType t, Shape s, float base) {
    Tensor x = Tensor::empty(t, std::move(s));
    for (int64_t i = 0; i < x.numel(); ++i) x.set(i, base + static_cast<float>(i + step) * 0.125f);
    return x;
  };
  c.weights = {{"wte", filled(DType::F32, Shape{256, 8}, 0.5f)},
               {"h.0.ln_1.weight", filled(DType::F32, Shape{8}, 1.0f)},
               {"h.0.attn.c_attn.weight", filled(DType::BF16, Shape{8, 24}, -1.0f)}};
  c.optimizer = {{"m.wte", filled(DType::F32, Shape{256, 8}, 0.0f)},
                 {"v.wte", filled(DType::F32, Shape{256, 8}, 2.0f)}};
  return c;
}

void expect_same_tensors(const std::vector<NamedTensor>& got,
                         const std::vector<NamedTensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const NamedTensor& w : want) {
    auto it = std::find_if(got.begin(), got.end(),
                           [&](const NamedTensor& g) { return g.name == w.name; });
    ASSERT_NE(it, got.end()) << w.name;
    EXPECT_EQ(it->tensor.dtype(), w.tensor.dtype()) << w.name;
    EXPECT_EQ(it->tensor.shape(), w.tensor.shape()) << w.name;
    ASSERT_EQ(it->tensor.nbytes(), w.tensor.nbytes());
    EXPECT_EQ(std::memcmp(it->tensor.data(), w.tensor.data(), w.tensor.nbytes()), 0) << w.name;
  }
}

TEST(RunMeta, RoundTripsThroughJsonText) {
  const RunMeta m = sample_meta(1234);
  const json j = run_meta_to_json(m);
  EXPECT_EQ(j["format"], "tandem checkpoint");
  EXPECT_EQ(j["format_version"], kCheckpointFormatVersion);
  EXPECT_EQ(j["tandem_version"], "0.1.0");
  EXPECT_EQ(j["rng"]["seed"].get<uint64_t>(), (uint64_t{1} << 63) + 5);
  EXPECT_EQ(run_meta_from_json(json::parse(j.dump(2)), "meta.json"), m);
  EXPECT_EQ(run_meta_from_json(j, "meta.json"), m);  // in-memory values, without a text round trip
}

TEST(RunMeta, RecordsTheProjectsVersion) {
  // kTandemVersion restates project(VERSION) of the top-level CMakeLists.txt; keep them in step.
  const std::string cmake = testing::read_bytes(
      (std::filesystem::path(__FILE__).parent_path() / "../../../CMakeLists.txt").string());
  if (cmake.empty()) GTEST_SKIP() << "source tree not found from " << __FILE__;
  EXPECT_NE(cmake.find("project(tandem VERSION " + std::string(kTandemVersion) + " "),
            std::string::npos);
}

TEST(Checkpoint, SavesTheLayoutAndLoadsEveryTensorBitwise) {
  ScratchDir dir;
  const std::string ckdir = dir.path("ckpt");
  const Checkpoint c = sample_checkpoint(100);
  save_checkpoint(ckdir, c);
  EXPECT_EQ(dir.list("ckpt"), (std::vector<std::string>{"meta.json", "optimizer.safetensors",
                                                        "weights.safetensors"}));
  EXPECT_EQ(dir.list(), std::vector<std::string>{"ckpt"});
  // The weights file is a plain safetensors file other tools read; its metadata says "pt".
  EXPECT_EQ(load_safetensors(ckdir + "/weights.safetensors").metadata,
            (SafetensorsMetadata{{"format", "pt"}}));
  // meta.json is readable JSON.
  EXPECT_EQ(json::parse(read_file(ckdir + "/meta.json"))["step"], 100);

  const Checkpoint back = load_checkpoint(ckdir);
  EXPECT_EQ(back.meta, c.meta);
  expect_same_tensors(back.weights, c.weights);
  expect_same_tensors(back.optimizer, c.optimizer);

  const Checkpoint light = load_checkpoint(ckdir, /*with_optimizer=*/false);
  expect_same_tensors(light.weights, c.weights);
  EXPECT_TRUE(light.optimizer.empty());
}

TEST(Checkpoint, ASecondSaveReplacesTheFirstWhole) {
  ScratchDir dir;
  const std::string ckdir = dir.path("ckpt");
  save_checkpoint(ckdir, sample_checkpoint(1));
  const Checkpoint second = sample_checkpoint(2);
  save_checkpoint(ckdir, second);
  const Checkpoint back = load_checkpoint(ckdir);
  EXPECT_EQ(back.meta.step, 2);
  expect_same_tensors(back.weights, second.weights);
  EXPECT_EQ(dir.list(), std::vector<std::string>{"ckpt"});
}

// A process killed at each step of a save over an older checkpoint: the checkpoint a later run
// loads is always one of the two, whole (meta, weights and optimizer from the same step).
TEST(Checkpoint, AKilledSaveLeavesTheOldOrTheNewCheckpoint) {
  for (bool use_exchange : {true, false}) {
    for (const char* stage :
         {"wrote weights.safetensors", "wrote optimizer.safetensors", "wrote meta.json",
          "exchanged", "moved old aside", "renamed", "removed old"}) {
      SCOPED_TRACE(std::string(stage) + (use_exchange ? "" : " (two renames)"));
      ScratchDir dir;
      const std::string ckdir = dir.path("ckpt");
      save_checkpoint(ckdir, sample_checkpoint(1));
      const pid_t pid = ::fork();
      if (pid == 0) {
        FolderWriteHooks hooks;
        hooks.use_exchange = use_exchange;
        hooks.after = [&](std::string_view s) {
          if (s == stage) ::_exit(42);
        };
        try {
          save_checkpoint(ckdir, sample_checkpoint(2), hooks);
        } catch (...) {
          ::_exit(1);
        }
        ::_exit(0);
      }
      int status = 0;
      ::waitpid(pid, &status, 0);
      ASSERT_TRUE(WIFEXITED(status));
      if (WEXITSTATUS(status) == 0) continue;  // this path has no such stage
      ASSERT_EQ(WEXITSTATUS(status), 42);
      const Checkpoint back = load_checkpoint(ckdir);
      ASSERT_TRUE(back.meta.step == 1 || back.meta.step == 2);
      const Checkpoint want = sample_checkpoint(back.meta.step);
      EXPECT_EQ(back.meta, want.meta);
      expect_same_tensors(back.weights, want.weights);
      expect_same_tensors(back.optimizer, want.optimizer);
      const bool committed = std::string_view(stage) == "exchanged" ||
                             std::string_view(stage) == "renamed" ||
                             std::string_view(stage) == "removed old";
      EXPECT_EQ(back.meta.step, committed ? 2 : 1);
    }
  }
}

TEST(ConfigCompatibility, AcceptsEqualConfigs) {
  const json saved = {{"d_model", 256}, {"layers", 4}};
  EXPECT_TRUE(config_mismatches(saved, saved).empty());
  EXPECT_NO_THROW(
      check_config_compatible("ckpt", saved, json::parse(R"({"layers":4,"d_model":256})")));
  // Only the listed keys matter: a run may change its dropout.
  EXPECT_NO_THROW(check_config_compatible("ckpt", {{"d_model", 256}, {"dropout", 0.1}},
                                          {{"d_model", 256}, {"dropout", 0.0}}, {"d_model"}));
}

TEST(ConfigCompatibility, NamesEveryDifference) {
  const json saved = {{"d_model", 256}, {"layers", 4}, {"heads", 4}, {"dtype", "f32"}};
  const auto diffs =
      config_mismatches(saved, {{"d_model", 128}, {"layers", 2}, {"heads", 4}, {"dtype", "bf16"}});
  ASSERT_EQ(diffs.size(), 3u);
  EXPECT_EQ(diffs[0].key, "d_model");  // all keys, sorted
  EXPECT_EQ(diffs[0].saved, 256);
  EXPECT_EQ(diffs[0].requested, 128);
  EXPECT_EQ(diffs[1].key, "dtype");
  EXPECT_EQ(diffs[2].key, "layers");
}

}  // namespace
}  // namespace tandem::io
