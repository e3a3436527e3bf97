// Bad Hugging Face Llama and Qwen2 folders and flags: each config.json field tandem cannot
// compute, each tensor of another shape or name, each flag that disagrees with the folder and each
// index entry outside the folder is refused with one message naming it, and nothing is saved.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "support/cli.h"
#include "tandem/io/checkpoint_series.h"
#include "tandem/io/safetensors.h"
#include "tandem/train/hf_folder.h"
#include "train/test_util.h"

namespace tandem::train {
namespace hf_llama_error_test {

using testing::ScratchDir;
using testing::user_error_of;
namespace fs = std::filesystem;

// A small Llama (4 heads, 2 key/value heads, MLP 160, the head tied; Qwen2's q/k/v biases with
// `qkv_bias`) trained one step under dir/ckpt and exported to dir/hf.
TrainConfig small_llama(bool qkv_bias) {
  TrainConfig c = testing::tiny_run(1);
  c.model.arch = nn::Arch::Llama;
  c.model.d_model = 64;
  c.model.n_heads = 4;
  c.model.kv_heads = 2;
  c.model.ffn = 160;
  c.model.qkv_bias = qkv_bias;
  return c;
}

std::string exported_llama(const ScratchDir& dir, bool qkv_bias = false) {
  TrainConfig c = small_llama(qkv_bias);
  c.save_dir = dir.path("ckpt");
  train(c);
  export_hf(c.save_dir, dir.path("hf"));
  return dir.path("hf");
}

// A run from `folder` that would save under dir/saved.
TrainConfig init_llama(const ScratchDir& dir, const std::string& folder, bool qkv_bias = false) {
  TrainConfig c = small_llama(qkv_bias);
  c.steps = 0;
  c.init_from = folder;
  c.save_dir = dir.path("saved");
  return c;
}

template <typename F>
void edit_llama_config(const std::string& folder, F&& edit) {
  auto j = nlohmann::json::parse(testing::read_bytes(folder + "/config.json"));
  edit(j);
  testing::write_bytes(folder + "/config.json", j.dump());
}

template <typename F>
void edit_llama_weights(const std::string& folder, F&& edit) {
  io::SafetensorsFile f = io::load_safetensors(folder + "/model.safetensors");
  edit(f.tensors);
  io::save_safetensors(folder + "/model.safetensors", f.tensors, {{"format", "pt"}});
}

using Edit = std::function<void(nlohmann::json&)>;

TEST(HfLlamaErrors, ConfigFieldsTandemCannotComputeAreNamed) {
  ScratchDir dir;
  const std::string hf = exported_llama(dir);
  const std::string file = hf + "/config.json";
  const std::string good = testing::read_bytes(file);
  const std::vector<std::pair<Edit, std::string>> cases = {
      {[](nlohmann::json& j) { j["model_type"] = "mistral"; },
       "'" + file +
           "' is a config of model_type \"mistral\"; tandem reads GPT-2, Llama and Qwen2 models "
           "(\"gpt2\", \"llama\", \"qwen2\")"},
      {[](nlohmann::json& j) { j.erase("intermediate_size"); },
       "'" + file + "' has no integer 'intermediate_size': it is not a Llama config"},
      {[](nlohmann::json& j) { j["num_attention_heads"] = 0; },
       "'" + file + "': 'num_attention_heads' is 0; it must be a positive integer"},
      {[](nlohmann::json& j) {
         j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
       },
       "'" + file +
           "': 'rope_scaling' has rope_type \"linear\"; tandem computes llama3's scaling or none "
           "(null, or \"default\")"},
      {[](nlohmann::json& j) {
         j["rope_scaling"] = {{"rope_type", "llama3"},
                              {"factor", 0.5},
                              {"low_freq_factor", 1.0},
                              {"high_freq_factor", 4.0},
                              {"original_max_position_embeddings", 8192}};
       },
       "'" + file + "': RoPE llama3 scaling: factor is 0.5; it must be >= 1"},
      {[](nlohmann::json& j) {
         j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
       },
       "'" + file + "': 'rope_scaling' (llama3) has no number 'low_freq_factor'"},
      {[](nlohmann::json& j) {
         j["use_sliding_window"] = true;
         j["sliding_window"] = 4096;
       },
       "'" + file +
           "': 'use_sliding_window' is true with 'sliding_window' 4096; tandem's Llama attends "
           "to every earlier position, so it must be false (or 'sliding_window' null)"},
      {[](nlohmann::json& j) { j["attention_bias"] = true; },
       "'" + file +
           "': 'attention_bias' is true; tandem's Llama has no bias on o_proj (a Llama with "
           "attention_bias has biases on q, k, v and o; a Qwen2 folder's q/k/v biases load), so "
           "it must be false"},
      {[](nlohmann::json& j) { j["head_dim"] = 32; },
       "'" + file +
           "': 'head_dim' is 32; tandem's Llama has heads of hidden_size / num_attention_heads "
           "(64 / 4): null or that quotient"},
      {[](nlohmann::json& j) { j["hidden_act"] = "gelu"; },
       "'" + file +
           "': 'hidden_act' is \"gelu\"; tandem's Llama computes SwiGLU with SiLU (\"silu\")"},
      {[](nlohmann::json& j) { j["mlp_bias"] = true; },
       "'" + file +
           "': 'mlp_bias' is true; tandem's Llama has no biases in its MLP, so it must be false"},
  };
  for (const auto& [edit, want] : cases) {
    testing::write_bytes(file, good);
    edit_llama_config(hf, edit);
    EXPECT_EQ(user_error_of([&] { train(init_llama(dir, hf)); }), want);
    EXPECT_FALSE(fs::exists(dir.path("saved"))) << want;
  }
  // Qwen2's sliding window is refused by its own family's name; switched off, it loads.
  ScratchDir qdir;
  const std::string qwen = exported_llama(qdir, true);
  edit_llama_config(qwen, [](nlohmann::json& j) { j["use_sliding_window"] = true; });
  EXPECT_NO_THROW(train(init_llama(qdir, qwen, true)));  // sliding_window null: no window
  fs::remove_all(qdir.path("saved"));
  edit_llama_config(qwen, [](nlohmann::json& j) { j["sliding_window"] = 32768; });
  EXPECT_EQ(user_error_of([&] { train(init_llama(qdir, qwen, true)); }),
            "'" + qwen +
                "/config.json': 'use_sliding_window' is true with 'sliding_window' 32768; "
                "tandem's Qwen2 attends to every earlier position, so it must be false (or "
                "'sliding_window' null)");
}

TEST(HfLlamaErrors, ATensorOfAnotherShapeOrNameIsNamed) {
  ScratchDir dir;
  const std::string hf = exported_llama(dir);
  const std::string weights = hf + "/model.safetensors";
  const std::string good = testing::read_bytes(weights);
  edit_llama_weights(hf, [](std::vector<io::NamedTensor>& ts) {
    for (io::NamedTensor& t : ts)
      if (t.name == "model.layers.1.self_attn.k_proj.weight")
        t.tensor = Tensor::zeros(DType::F32, {16, 64});
  });
  EXPECT_EQ(user_error_of([&] { train(init_llama(dir, hf)); }),
            "tensor 'model.layers.1.self_attn.k_proj.weight' in '" + weights +
                "' has shape [16, 64]; the model '" + hf +
                "/config.json' describes needs [32, 64]");
  testing::write_bytes(weights, good);
  edit_llama_weights(hf, [](std::vector<io::NamedTensor>& ts) {
    for (io::NamedTensor& t : ts)
      if (t.name == "model.layers.0.mlp.up_proj.weight") t.name = "model.layers.0.mlp.w3.weight";
  });
  EXPECT_EQ(user_error_of([&] { train(init_llama(dir, hf)); }),
            "checkpoint file '" + weights +
                "' does not match its model (2 layers, d_model 64): it has 1 tensor this model "
                "does not have ('model.layers.0.mlp.w3.weight'), and no tensor "
                "'model.layers.0.mlp.up_proj.weight', which this model needs; it is not the model "
                "'" +
                hf + "/config.json' describes");
  // Biases a Llama folder does not have: the Qwen2 run's are missing.
  testing::write_bytes(weights, good);
  edit_llama_config(hf, [](nlohmann::json& j) { j["model_type"] = "qwen2"; });
  EXPECT_NE(user_error_of([&] { train(init_llama(dir, hf, true)); })
                .find("no tensors 'model.layers.0.self_attn.k_proj.bias', "
                      "'model.layers.0.self_attn.q_proj.bias'"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(dir.path("saved")));
}

TEST(HfLlamaErrors, AStoredHeadOtherThanTheTiedEmbeddingIsRefusedOnEveryRank) {
  ScratchDir dir;
  const std::string hf = exported_llama(dir);
  edit_llama_weights(hf, [](std::vector<io::NamedTensor>& ts) {
    ts.push_back({"lm_head.weight", Tensor::zeros(DType::F32, {256, 64})});
  });
  TrainConfig c = init_llama(dir, hf);
  c.grid = {1, 2, 1};
  EXPECT_EQ(user_error_of([&] { train(c); }),
            "tensor 'lm_head.weight' in '" + hf +
                "/model.safetensors' differs from 'model.embed_tokens.weight': the folder's "
                "config.json ties the LM head to the embedding (tie_word_embeddings true), so an "
                "untied head cannot be loaded");
  // Found as the ranks read the weights: the --save folder is made (and locked), with no
  // checkpoint in it.
  if (fs::exists(dir.path("saved"))) {
    for (const std::string& f : dir.list("saved"))
      EXPECT_FALSE(f.starts_with("step-") || f == "latest") << f;
  }
}

// The run's block against the folder's: through train() (the field, the run's value and its
// flag) and through the command (the flag, or the preset, and the field).
TEST(HfLlamaErrors, ABlockOtherThanTheFoldersNamesTheField) {
  ScratchDir dir;
  const std::string hf = exported_llama(dir);
  const std::string file = hf + "/config.json";
  TrainConfig c = init_llama(dir, hf);
  c.model.kv_heads = 4;
  c.model.tie_embeddings = false;
  EXPECT_EQ(user_error_of([&] { train(c); }),
            "'" + file +
                "' does not describe this run's model: num_key_value_heads 2 where this run has 4 "
                "(--kv-heads); tie_word_embeddings true where this run has false "
                "(--tie-embeddings)");
  EXPECT_FALSE(fs::exists(dir.path("saved")));
  for (const auto& [flags, want] : std::vector<std::pair<std::string, std::string>>{
           {"--arch gpt2",
            "--arch gpt2 disagrees with '" + file + "', which has model_type \"llama\""},
           {"--layers 3",
            "--layers 3 disagrees with '" + file + "', which has num_hidden_layers 2"},
           {"--kv-heads 4",
            "--kv-heads 4 disagrees with '" + file + "', which has num_key_value_heads 2"},
           {"--ffn 128",
            "--ffn 128 disagrees with '" + file + "', which has intermediate_size 160"},
           {"--norm-eps 1e-6",
            "--norm-eps 1e-06 disagrees with '" + file + "', which has rms_norm_eps 1e-05"},
           {"--rope-theta 500000",
            "--rope-theta 500000 disagrees with '" + file + "', which has rope_theta 10000"},
           {"--rope-scaling llama3:32,1,4,8192",
            "--rope-scaling llama3:32,1,4,8192 disagrees with '" + file +
                "', which has rope_scaling none"},
           {"--qkv-bias", "--qkv-bias true disagrees with '" + file +
                              "', which has model_type \"llama\" (no q/k/v biases)"},
           {"--tie-embeddings false", "--tie-embeddings false disagrees with '" + file +
                                          "', which has tie_word_embeddings true"},
           {"--model smollm-135m", "--model smollm-135m (layers 30) disagrees with '" + file +
                                       "', which has num_hidden_layers 2"},
           {"--model small", "--model small (arch gpt2) disagrees with '" + file +
                                 "', which has model_type \"llama\""},
           {"--seq-len 32", "--seq-len 32 disagrees with '" + file +
                                "', which has max_position_embeddings 16: at most 16"}}) {
    const auto r = tandem::testing::run_tandem("train --init-from '" + hf + "' --steps 0 --save '" +
                                               dir.path("saved") + "' " + flags);
    EXPECT_EQ(r.status, 1) << flags;
    EXPECT_NE(r.output.find(want), std::string::npos) << flags << ": " << r.output;
    EXPECT_FALSE(fs::exists(dir.path("saved"))) << flags;
  }
}

// A sharded folder's index: entries outside the folder, missing shards, a tensor not in the shard
// its entry names, JSON that is not an index.
TEST(HfLlamaErrors, IndexEntriesOutsideTheFolderOrWrongAreNamed) {
  ScratchDir dir;
  const std::string hf = exported_llama(dir);
  fs::rename(hf + "/model.safetensors", hf + "/model-00001-of-00001.safetensors");
  const std::string index = hf + "/model.safetensors.index.json";
  const io::SafetensorsReader shard(hf + "/model-00001-of-00001.safetensors");
  auto write_index = [&](const std::string& name, const std::string& file) {
    nlohmann::json map = nlohmann::json::object();
    for (const io::SafetensorsEntry& e : shard.tensors())
      map[e.name] = "model-00001-of-00001.safetensors";
    map[name] = file;
    testing::write_bytes(index, nlohmann::json{{"weight_map", map}}.dump());
  };
  const std::string q = "model.layers.0.self_attn.q_proj.weight";
  write_index(q, "model-00001-of-00001.safetensors");
  EXPECT_NO_THROW(train(init_llama(dir, hf)));  // the index as written loads
  fs::remove_all(dir.path("saved"));
  for (const auto& [file, want] : std::vector<std::pair<std::string, std::string>>{
           {"../model-00001-of-00001.safetensors",
            "'" + index + "': weight_map entry '" + q +
                "' names the file '../model-00001-of-00001.safetensors', which is not inside the "
                "folder: a shard must be a file beside the index"},
           {"/etc/passwd", "'" + index + "': weight_map entry '" + q +
                               "' names the file '/etc/passwd', which is not inside the folder: a "
                               "shard must be a file beside the index"},
           {"model-00002-of-00002.safetensors",
            "'" + index + "': weight_map entry '" + q + "' names the shard '" + hf +
                "/model-00002-of-00002.safetensors', which does not exist"}}) {
    write_index(q, file);
    EXPECT_EQ(user_error_of([&] { train(init_llama(dir, hf)); }), want) << file;
    EXPECT_FALSE(fs::exists(dir.path("saved"))) << file;
  }
  // An entry whose shard lacks the tensor.
  io::save_safetensors(hf + "/model-00002-of-00002.safetensors",
                       {{"unrelated", Tensor::zeros(DType::F32, {1})}});
  write_index(q, "model-00002-of-00002.safetensors");
  EXPECT_EQ(user_error_of([&] { train(init_llama(dir, hf)); }),
            "'" + index + "': weight_map entry '" + q +
                "' names the shard 'model-00002-of-00002.safetensors', which has no such tensor");
  testing::write_bytes(index, "{\"weight_map\": [");
  EXPECT_NE(user_error_of([&] {
              train(init_llama(dir, hf));
            }).find("'" + index + "' is not valid JSON: "),
            std::string::npos);
  testing::write_bytes(index, "{\"metadata\": {}}");
  EXPECT_EQ(user_error_of([&] { train(init_llama(dir, hf)); }),
            "'" + index + "' has no object 'weight_map' (tensor name -> shard file)");
  EXPECT_FALSE(fs::exists(dir.path("saved")));
}

}  // namespace hf_llama_error_test
}  // namespace tandem::train
