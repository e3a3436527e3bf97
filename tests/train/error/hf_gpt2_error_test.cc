// Bad Hugging Face GPT-2 folders and flags (Llama's: hf_llama_error_test.cc): each is refused with
// one message naming the file and the tensor or field, before any rank starts where the headers
// tell (names, shapes, config), and on every rank together where only the data does (an untied LM
// head).
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "support/cli.h"
#include "tandem/io/checkpoint_series.h"
#include "tandem/io/safetensors.h"
#include "tandem/train/hf_folder.h"
#include "train/test_util.h"

namespace tandem::train {
namespace {

using testing::ScratchDir;
using testing::user_error_of;
namespace fs = std::filesystem;

// A tiny run's checkpoint (under dir/ckpt) exported to dir/hf; returns the export.
std::string exported(const ScratchDir& dir) {
  TrainConfig c = testing::tiny_run(1);
  c.save_dir = dir.path("ckpt");
  train(c);
  export_hf(c.save_dir, dir.path("hf"));
  return dir.path("hf");
}

TrainConfig init_run(const std::string& folder) {
  TrainConfig c = testing::tiny_run(0);
  c.init_from = folder;
  return c;
}

// The export's tensors, changed by `edit`, written back.
template <typename F>
void edit_weights(const std::string& folder, F&& edit) {
  io::SafetensorsFile f = io::load_safetensors(folder + "/model.safetensors");
  edit(f.tensors);
  io::save_safetensors(folder + "/model.safetensors", f.tensors, {{"format", "pt"}});
}

// The export's config.json, changed by `edit`, written back.
template <typename F>
void edit_config(const std::string& folder, F&& edit) {
  auto j = nlohmann::json::parse(testing::read_bytes(folder + "/config.json"));
  edit(j);
  testing::write_bytes(folder + "/config.json", j.dump());
}

TEST(HfGpt2Errors, MissingFolderAndFiles) {
  ScratchDir dir;
  EXPECT_EQ(user_error_of([&] { train(init_run(dir.path("none"))); }),
            "Hugging Face folder '" + dir.path("none") + "' does not exist");
  const std::string hf = exported(dir);
  fs::remove(hf + "/model.safetensors");
  EXPECT_EQ(user_error_of([&] { train(init_run(hf)); }),
            "Hugging Face folder '" + hf +
                "' has no model.safetensors (nor model.safetensors.index.json and its shards; "
                "tandem export --format hf writes one; save a transformers model with "
                "save_pretrained(..., safe_serialization=True))");
  fs::remove(hf + "/config.json");
  EXPECT_EQ(
      user_error_of([&] { train(init_run(hf)); }),
      "Hugging Face folder '" + hf + "' has no config.json (tandem export --format hf writes one)");
}

TEST(HfGpt2Errors, ATensorNamedOtherwiseIsNamed) {
  ScratchDir dir;
  const std::string hf = exported(dir);
  edit_weights(hf, [](std::vector<io::NamedTensor>& ts) {
    for (io::NamedTensor& t : ts)
      if (t.name == "transformer.h.1.mlp.c_fc.bias") t.name = "transformer.h.1.mlp.fc.bias";
  });
  EXPECT_EQ(user_error_of([&] { train(init_run(hf)); }),
            "checkpoint file '" + hf +
                "/model.safetensors' does not match its model (2 layers, d_model 16): it has 1 "
                "tensor this model does not have ('transformer.h.1.mlp.fc.bias'), and no tensor "
                "'transformer.h.1.mlp.c_fc.bias', which this model needs; it is not the model '" +
                hf + "/config.json' describes");
}

TEST(HfGpt2Errors, ATensorOfAnotherShapeIsNamed) {
  ScratchDir dir;
  const std::string hf = exported(dir);
  edit_weights(hf, [](std::vector<io::NamedTensor>& ts) {
    for (io::NamedTensor& t : ts)
      if (t.name == "transformer.h.0.attn.c_proj.weight")
        t.tensor = Tensor::zeros(DType::F32, {16, 8});
  });
  EXPECT_EQ(user_error_of([&] { train(init_run(hf)); }),
            "tensor 'transformer.h.0.attn.c_proj.weight' in '" + hf +
                "/model.safetensors' has shape [16, 8]; the model '" + hf +
                "/config.json' describes needs [16, 16]");
}

TEST(HfGpt2Errors, AVocabularyOtherThanTheDatasIsRefused) {
  ScratchDir dir;
  const std::string hf = exported(dir);
  edit_config(hf, [](nlohmann::json& j) { j["vocab_size"] = 320; });
  EXPECT_EQ(user_error_of([&] { train(init_run(hf)); }),
            "'" + hf +
                "/config.json' does not describe this run's model: vocab_size 320 where this run "
                "has 256 (the synthetic corpus's bytes)");
  // The command says which flag or data disagrees.
  const auto r = tandem::testing::run_tandem("train --init-from '" + hf + "' --steps 0");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("the vocabulary of the synthetic corpus (256 tokens) disagrees with '" +
                          hf + "/config.json', which has vocab_size 320"),
            std::string::npos)
      << r.output;
}

TEST(HfGpt2Errors, FlagsThatDisagreeWithConfigJsonNameBoth) {
  ScratchDir dir;
  const std::string hf = exported(dir);
  const std::string file = hf + "/config.json";
  for (const auto& [flags, want] : std::vector<std::pair<std::string, std::string>>{
           {"--layers 3", "--layers 3 disagrees with '" + file + "', which has n_layer 2"},
           {"--d-model 32", "--d-model 32 disagrees with '" + file + "', which has n_embd 16"},
           {"--model tiny",
            "--model tiny (d-model 64) disagrees with '" + file + "', which has n_embd 16"},
           {"--seq-len 32",
            "--seq-len 32 disagrees with '" + file + "', which has n_positions 16: at most 16"},
           {"--resume '" + dir.path("ckpt") + "'", "give one of them"}}) {
    const auto r = tandem::testing::run_tandem("train --init-from '" + hf + "' --steps 0 " + flags);
    EXPECT_EQ(r.status, 1) << flags;
    EXPECT_NE(r.output.find(want), std::string::npos) << flags << ": " << r.output;
  }
}

TEST(HfGpt2Errors, MalformedOrForeignConfigJson) {
  ScratchDir dir;
  const std::string hf = exported(dir);
  const std::string file = hf + "/config.json";
  const std::string good = testing::read_bytes(file);
  testing::write_bytes(file, "{\"model_type\": \"gpt2\",");
  EXPECT_NE(user_error_of([&] { hf_model_config(hf); }).find("'" + file + "' is not valid JSON: "),
            std::string::npos);
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> cases = {
      {[](nlohmann::json& j) { j.erase("n_layer"); },
       "'" + file + "' has no integer 'n_layer': it is not a GPT-2 config"},
      {[](nlohmann::json& j) { j["n_head"] = -2; },
       "'" + file + "': 'n_head' is -2; it must be a positive integer"},
      {[](nlohmann::json& j) { j["model_type"] = "mistral"; },
       "'" + file +
           "' is a config of model_type \"mistral\"; tandem reads GPT-2, Llama and Qwen2 models "
           "(\"gpt2\", \"llama\", \"qwen2\")"},
      {[](nlohmann::json& j) { j["activation_function"] = "relu"; },
       "'" + file +
           "': 'activation_function' is \"relu\"; tandem's GPT-2 computes GELU's tanh "
           "approximation (\"gelu_new\")"},
      {[](nlohmann::json& j) { j["n_inner"] = 32; },
       "'" + file + "': 'n_inner' is 32; tandem's GPT-2 has an MLP of 4 n_embd (64): null or 64"},
      {[](nlohmann::json& j) { j["tie_word_embeddings"] = false; },
       "'" + file +
           "': 'tie_word_embeddings' is false; tandem's GPT-2 ties its LM head to wte, so it must "
           "be true"},
      {[](nlohmann::json& j) { j["layer_norm_epsilon"] = 1e-6; },
       "'" + file + "': 'layer_norm_epsilon' is 1e-06; tandem's LayerNorm uses 1e-05"},
      {[](nlohmann::json& j) { j["attn_pdrop"] = 0.2; },
       "'" + file +
           "': resid_pdrop 0, embd_pdrop 0 and attn_pdrop 0.2 differ; tandem has one dropout for "
           "the three (give --dropout to choose it)"},
  };
  for (const auto& [edit, want] : cases) {
    testing::write_bytes(file, good);
    edit_config(hf, edit);
    EXPECT_EQ(user_error_of([&] { train(init_run(hf)); }), want);
  }
}

TEST(HfGpt2Errors, AnUntiedHeadIsRefusedOnEveryRank) {
  ScratchDir dir;
  const std::string hf = exported(dir);
  edit_weights(hf, [](std::vector<io::NamedTensor>& ts) {
    ts.push_back({"lm_head.weight", Tensor::zeros(DType::F32, {256, 16})});
  });
  TrainConfig c = init_run(hf);
  c.grid = {1, 2, 1};
  EXPECT_EQ(user_error_of([&] { train(c); }),
            "tensor 'lm_head.weight' in '" + hf +
                "/model.safetensors' differs from 'transformer.wte.weight': tandem's GPT-2 ties "
                "its LM head to wte, so an untied head cannot be loaded");
}

TEST(HfGpt2Errors, ExportRefusesAFolderWithOtherFilesAndAnUnknownFormat) {
  ScratchDir dir;
  exported(dir);
  fs::create_directories(dir.path("mine"));
  testing::write_bytes(dir.path("mine/notes.txt"), "keep me");
  EXPECT_EQ(user_error_of([&] { export_hf(dir.path("ckpt"), dir.path("mine")); }),
            "--out '" + dir.path("mine") +
                "' holds files an export does not write (notes.txt): the folder is replaced "
                "whole, so give a new or empty folder");
  EXPECT_EQ(testing::read_bytes(dir.path("mine/notes.txt")), "keep me");
  const auto r = tandem::testing::run_tandem("export --format onnx --out '" + dir.path("x") +
                                             "' '" + dir.path("ckpt") + "'");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("--format onnx: the formats are hf (a Hugging Face folder)"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(dir.path("x")));
}

}  // namespace
}  // namespace tandem::train
