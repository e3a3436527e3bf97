// A checkpoint's tensors must be exactly its model's: weights of another model under a meta.json
// (tensors the model does not have, or lacks) are refused by eval, sample and resume, naming the
// tensors; the embeddings are written under Hugging Face's names (wte.weight, wpe.weight) and
// checkpoints that named them wte and wpe still load.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "support/cli.h"
#include "tandem/io/checkpoint.h"
#include "tandem/io/checkpoint_series.h"
#include "train/test_util.h"

namespace tandem::train {
namespace {

using ::testing::HasSubstr;
using testing::ScratchDir;
using testing::user_error_of;
namespace fs = std::filesystem;

// A one-step run of `layers` blocks saved to `dir`; returns its step folder.
std::string saved_run(const std::string& dir, int layers) {
  TrainConfig c = testing::tiny_run(1);
  c.model.n_layers = layers;
  c.save_dir = dir;
  train(c);
  return io::resolve_checkpoint(dir);
}

// A 2-layer checkpoint whose files are replaced by a 3-layer run's (weights_from = 3), or the
// other way round: meta.json says one model, the tensors are another's.
struct Mixed {
  std::string folder;
};

Mixed mixed(const ScratchDir& dir, int meta_layers, int tensor_layers) {
  const std::string meta = saved_run(dir.path("meta"), meta_layers);
  const std::string other = saved_run(dir.path("other"), tensor_layers);
  for (std::string_view f : {io::kWeightsFile, io::kOptimizerFile})
    fs::copy_file(other + "/" + std::string(f), meta + "/" + std::string(f),
                  fs::copy_options::overwrite_existing);
  return {meta};
}

TEST(CheckpointTensors, ExtraTensorsAreRefusedByEvalSampleAndResume) {
  ScratchDir dir;
  const Mixed m = mixed(dir, 2, 3);
  const std::string want =
      "checkpoint file '" + m.folder +
      "/weights.safetensors' does not match its model (2 layers, d_model 16): it has 12 tensors "
      "this model does not have ('h.2.attn.c_attn.bias', 'h.2.attn.c_attn.weight', "
      "'h.2.attn.c_proj.bias', 'h.2.attn.c_proj.weight', 'h.2.ln_1.bias', 'h.2.ln_1.weight' and 6 "
      "more); the weights and meta.json come from different models";
  // eval and sample load through load_model.
  EXPECT_EQ(user_error_of([&] { load_model(m.folder); }), want);
  for (const std::string cmd : {"eval --max-windows 1", "sample --tokens 1"}) {
    const auto r = tandem::testing::run_tandem(cmd + " --checkpoint '" + m.folder + "'");
    EXPECT_EQ(r.status, 1) << cmd << ": " << r.output;
    EXPECT_EQ(r.output, "tandem: error: " + want + "\n") << cmd;
  }
  TrainConfig c = testing::tiny_run(2);
  c.resume_dir = m.folder;
  EXPECT_EQ(user_error_of([&] { train(c); }), want);
}

TEST(CheckpointTensors, MissingTensorsAreNamed) {
  ScratchDir dir;
  const Mixed m = mixed(dir, 3, 2);
  const std::string message = user_error_of([&] { load_model(m.folder); });
  EXPECT_THAT(message, HasSubstr("does not match its model (3 layers, d_model 16): it has no "
                                 "tensors 'h.2.attn.c_attn.bias', "));
  EXPECT_THAT(message, HasSubstr("and 6 more, which this model needs"));
  TrainConfig c = testing::tiny_run(2);
  c.model.n_layers = 3;
  c.resume_dir = m.folder;
  EXPECT_THAT(user_error_of([&] { train(c); }), HasSubstr("it has no tensors 'h.2."));
}

// The optimizer file is checked on resume too: moments of another model.
TEST(CheckpointTensors, ExtraOptimizerTensorsAreRefusedOnResume) {
  ScratchDir dir;
  const std::string meta = saved_run(dir.path("meta"), 2);
  const std::string other = saved_run(dir.path("other"), 3);
  fs::copy_file(other + "/optimizer.safetensors", meta + "/optimizer.safetensors",
                fs::copy_options::overwrite_existing);
  TrainConfig c = testing::tiny_run(2);
  c.resume_dir = meta;
  EXPECT_THAT(user_error_of([&] { train(c); }),
              HasSubstr("optimizer.safetensors' does not match its model (2 layers, d_model 16): "
                        "it has 24 tensors this model does not have ('m.h.2."));
}

TEST(CheckpointTensors, EmbeddingsAreWrittenUnderHuggingFaceNames) {
  ScratchDir dir;
  const std::string ck = saved_run(dir.path("ck"), 2);
  const io::SafetensorsFile w = io::load_safetensors(ck + "/weights.safetensors");
  EXPECT_NE(w.find("wte.weight"), nullptr);
  EXPECT_NE(w.find("wpe.weight"), nullptr);
  EXPECT_EQ(w.find("wte"), nullptr);
  const io::SafetensorsFile o = io::load_safetensors(ck + "/optimizer.safetensors");
  EXPECT_NE(o.find("m.wte.weight"), nullptr);
  EXPECT_NE(o.find("v.wpe.weight"), nullptr);
}

// A checkpoint of an older tandem, with the embeddings named wte and wpe, loads for eval and
// resumes to the same weights as the checkpoint under the new names.
TEST(CheckpointTensors, OldEmbeddingNamesStillLoad) {
  ScratchDir dir;
  const std::string ck = saved_run(dir.path("ck"), 2);
  const std::string old = dir.path("old");
  fs::copy(ck, old);
  for (std::string_view f : {io::kWeightsFile, io::kOptimizerFile}) {
    const std::string path = old + "/" + std::string(f);
    io::SafetensorsFile file = io::load_safetensors(path);
    for (io::NamedTensor& t : file.tensors)
      if (t.name.ends_with("wte.weight") || t.name.ends_with("wpe.weight"))
        t.name.resize(t.name.size() - std::string_view(".weight").size());
    io::save_safetensors(path, file.tensors, file.metadata);
  }
  ASSERT_NE(io::load_safetensors(old + "/weights.safetensors").find("wte"), nullptr);
  const LoadedModel a = load_model(ck), b = load_model(old);
  ASSERT_EQ(a.params.flat().numel(), b.params.flat().numel());
  EXPECT_EQ(std::memcmp(a.params.flat().data(), b.params.flat().data(), a.params.flat().nbytes()),
            0);
  auto resumed = [&](const std::string& from) {
    TrainConfig c = testing::tiny_run(2);
    c.resume_dir = from;
    c.keep_weights = true;
    return train(c).weights;
  };
  EXPECT_EQ(resumed(ck), resumed(old));
  // Both names at once is one tensor twice.
  io::SafetensorsFile both = io::load_safetensors(ck + "/weights.safetensors");
  both.tensors.push_back({"wte", *both.find("wte.weight")});
  io::save_safetensors(ck + "/weights.safetensors", both.tensors, both.metadata);
  const std::string twice = user_error_of([&] { load_model(ck); });
  EXPECT_THAT(twice, ::testing::AnyOf("checkpoint file '" + ck +
                                          "/weights.safetensors' holds tensor 'wte.weight' "
                                          "twice, as 'wte.weight' and as 'wte'",
                                      "checkpoint file '" + ck +
                                          "/weights.safetensors' holds tensor 'wte.weight' "
                                          "twice, as 'wte' and as 'wte.weight'"));
}

}  // namespace
}  // namespace tandem::train
