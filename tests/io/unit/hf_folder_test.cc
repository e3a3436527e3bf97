// Hugging Face folders' names and config.json: GPT-2's and Llama's written as transformers writes
// them and read back (published configs too); the hub's older GPT-2 names mapped to
// GPT2LMHeadModel's; constant buffers told apart from weights; weights in one file or in shards
// an index names, widened from bf16.
#include "tandem/io/hf_folder.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "support/files.h"
#include "support/scratch.h"
#include "tandem/core/error.h"
#include "tandem/io/safetensors.h"

namespace tandem::io {
namespace {

TEST(HfGpt2Layout, ConfigJsonRoundTrips) {
  HfGpt2Config c;
  c.vocab_size = 50257;
  c.n_positions = 1024;
  c.n_embd = 768;
  c.n_layer = 12;
  c.n_head = 12;
  c.dropout = 0.1f;  // written as 0.1, not as the float's 0.10000000149011612
  c.eos_token_id = 50256;
  const nlohmann::json j = hf_gpt2_config_json(c);
  EXPECT_EQ(j["model_type"], "gpt2");
  EXPECT_EQ(j["architectures"], nlohmann::json({"GPT2LMHeadModel"}));
  EXPECT_EQ(j["resid_pdrop"].get<double>(), 0.1);
  EXPECT_EQ(j["activation_function"], "gelu_new");
  EXPECT_TRUE(j["n_inner"].is_null());
  EXPECT_EQ(j["bos_token_id"], 50256);
  const HfGpt2Config back = hf_gpt2_config_from_json(j, "config.json");
  EXPECT_EQ(back.vocab_size, 50257);
  EXPECT_EQ(back.n_positions, 1024);
  EXPECT_EQ(back.n_embd, 768);
  EXPECT_EQ(back.n_layer, 12);
  EXPECT_EQ(back.n_head, 12);
  EXPECT_EQ(back.dropout, 0.1);
  EXPECT_EQ(back.layer_norm_epsilon, 1e-5);
  EXPECT_EQ(back.eos_token_id, 50256);
}

// The hub's gpt2 config.json as it is published: fields tandem does not write are accepted.
TEST(HfGpt2Layout, ReadsThePublishedGpt2Config) {
  const auto j = nlohmann::json::parse(R"({
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
    "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768,
    "n_head": 12, "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1,
    "summary_activation": null, "summary_first_dropout": 0.1, "summary_proj_to_labels": true,
    "summary_type": "cls_index", "summary_use_proj": true,
    "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}},
    "vocab_size": 50257})");
  const HfGpt2Config c = hf_gpt2_config_from_json(j, "gpt2/config.json");
  EXPECT_EQ(c.vocab_size, 50257);
  EXPECT_EQ(c.n_layer, 12);
  EXPECT_EQ(c.dropout, 0.1);
}

TEST(HfGpt2Layout, Names) {
  EXPECT_EQ(hf_gpt2_name("h.0.attn.c_attn.weight"), "transformer.h.0.attn.c_attn.weight");
  EXPECT_EQ(hf_gpt2_canonical_name("wte.weight"), "transformer.wte.weight");
  EXPECT_EQ(hf_gpt2_canonical_name("transformer.ln_f.bias"), "transformer.ln_f.bias");
  EXPECT_EQ(hf_gpt2_canonical_name("lm_head.weight"), "lm_head.weight");
  EXPECT_TRUE(hf_gpt2_is_buffer("transformer.h.11.attn.bias"));
  EXPECT_TRUE(hf_gpt2_is_buffer("transformer.h.0.attn.masked_bias"));
  EXPECT_FALSE(hf_gpt2_is_buffer("transformer.h.0.attn.c_attn.bias"));
  EXPECT_FALSE(hf_gpt2_is_buffer("transformer.h.x.attn.bias"));
  EXPECT_FALSE(hf_gpt2_is_buffer("h.0.attn.bias"));  // canonical names only
  EXPECT_EQ(hf_tokenizer_file_name("/data/shards/tokenizer.model"), "tokenizer.model");
  EXPECT_EQ(hf_tokenizer_file_name("/data/gpt2/tokenizer.json"), "tokenizer.json");
}

TEST(HfGpt2Layout, AMissingConfigNamesTheFile) {
  tandem::testing::ScratchDir dir;
  EXPECT_EQ(tandem::testing::user_error_of([&] { read_hf_config(dir.path("config.json")); }),
            "Hugging Face model config '" + dir.path("config.json") + "' does not exist");
}

TEST(HfLlamaLayout, ConfigJsonRoundTrips) {
  for (const bool qwen2 : {false, true}) {
    HfLlamaConfig c;
    c.qwen2 = qwen2;
    c.vocab_size = 320;
    c.hidden_size = 64;
    c.intermediate_size = 160;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.max_position_embeddings = 32;
    c.rms_norm_eps = 1e-5f;  // as tandem holds it: written 1e-05, not 9.99999974737875e-06
    c.rope_theta = 500000.0;
    c.rope_scaling = HfLlama3Scaling{32.0, 1.0, 4.0, 8192};
    c.tie_word_embeddings = true;
    c.eos_token_id = 3;
    const nlohmann::json j = hf_llama_config_json(c);
    EXPECT_EQ(j["model_type"], qwen2 ? "qwen2" : "llama");
    EXPECT_EQ(j["architectures"][0], qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM");
    EXPECT_EQ(j["hidden_act"], "silu");
    EXPECT_EQ(j["rms_norm_eps"], 1e-5);
    EXPECT_EQ(j["rope_scaling"]["rope_type"], "llama3");
    EXPECT_EQ(j["torch_dtype"], "float32");
    EXPECT_EQ(j.contains("attention_bias"), !qwen2);
    const HfLlamaConfig back = hf_llama_config_from_json(j, "config.json");
    EXPECT_EQ(back.qwen2, qwen2);
    EXPECT_EQ(back.vocab_size, 320);
    EXPECT_EQ(back.hidden_size, 64);
    EXPECT_EQ(back.intermediate_size, 160);
    EXPECT_EQ(back.num_hidden_layers, 2);
    EXPECT_EQ(back.num_attention_heads, 4);
    EXPECT_EQ(back.num_key_value_heads, 2);
    EXPECT_EQ(back.max_position_embeddings, 32);
    EXPECT_EQ(back.rms_norm_eps, 1e-5);
    EXPECT_EQ(back.rope_theta, 500000.0);
    EXPECT_EQ(back.rope_scaling, c.rope_scaling);
    EXPECT_TRUE(back.tie_word_embeddings);
  }
}

// config.json as published (Llama 3.2 1B's and Qwen2.5 0.5B's, abridged to the fields that
// matter): list-valued eos ids, a disabled sliding window and LlamaConfig's defaults read.
TEST(HfLlamaLayout, ReadsPublishedConfigs) {
  const auto llama = nlohmann::json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "head_dim": 64,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": false,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16,
    "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "use_cache": true, "vocab_size": 128256})");
  const HfLlamaConfig l = hf_llama_config_from_json(llama, "llama-3.2-1b/config.json");
  EXPECT_FALSE(l.qwen2);
  EXPECT_EQ(l.num_key_value_heads, 8);
  EXPECT_EQ(l.max_position_embeddings, 131072);
  EXPECT_EQ(l.rope_scaling, (HfLlama3Scaling{32.0, 1.0, 4.0, 8192}));
  EXPECT_TRUE(l.tie_word_embeddings);
  const auto qwen = nlohmann::json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896,
    "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
    "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "use_sliding_window": false, "vocab_size": 151936})");
  const HfLlamaConfig q = hf_llama_config_from_json(qwen, "qwen2.5-0.5b/config.json");
  EXPECT_TRUE(q.qwen2);
  EXPECT_EQ(q.rms_norm_eps, 1e-6);
  EXPECT_FALSE(q.rope_scaling);
  // LlamaConfig's defaults: untied, as many key/value heads as heads, eps 1e-6.
  const auto bare = nlohmann::json::parse(R"({"model_type": "llama", "vocab_size": 32,
    "hidden_size": 16, "intermediate_size": 40, "num_hidden_layers": 1,
    "num_attention_heads": 2, "max_position_embeddings": 8})");
  const HfLlamaConfig b = hf_llama_config_from_json(bare, "config.json");
  EXPECT_FALSE(b.tie_word_embeddings);
  EXPECT_EQ(b.num_key_value_heads, 2);
  EXPECT_EQ(b.rms_norm_eps, 1e-6);
  EXPECT_EQ(b.rope_theta, 10000.0);
}

TEST(HfLlamaLayout, Buffers) {
  EXPECT_TRUE(hf_llama_is_buffer("model.layers.3.self_attn.rotary_emb.inv_freq"));
  EXPECT_FALSE(hf_llama_is_buffer("model.layers.3.self_attn.q_proj.weight"));
}

// Weights as one file or as shards an index names, read by name, widened from 16-bit files.
TEST(HfWeightsFiles, OneFileOrShardsAndWidened) {
  tandem::testing::ScratchDir dir;
  std::filesystem::create_directories(dir.path("one"));
  std::filesystem::create_directories(dir.path("two"));
  const Tensor a = Tensor::zeros(DType::F32, {2, 3});
  for (int64_t i = 0; i < 6; ++i) a.set(i, 0.5f * static_cast<float>(i) - 1.0f);
  const Tensor b = Tensor::zeros(DType::F32, {4});
  for (int64_t i = 0; i < 4; ++i) b.set(i, 3.0f + static_cast<float>(i));
  save_safetensors(dir.path("one/model.safetensors"), {{"a", a}, {"b", b}});
  save_safetensors(dir.path("two/model-00001-of-00002.safetensors"), {{"a", a.to(DType::BF16)}});
  save_safetensors(dir.path("two/model-00002-of-00002.safetensors"), {{"b", b.to(DType::F16)}});
  tandem::testing::write_bytes(
      dir.path("two/model.safetensors.index.json"),
      R"({"metadata": {"total_size": 28}, "weight_map": {"a": "model-00001-of-00002.safetensors",
          "b": "model-00002-of-00002.safetensors"}})");
  const auto identity = [](std::string_view n) { return std::string(n); };
  for (const char* folder : {"one", "two"}) {
    const HfWeights w(dir.path(folder), identity);
    EXPECT_EQ(w.sharded(), std::string(folder) == "two");
    EXPECT_EQ(w.tensors().size(), 2u);
    std::vector<float> got(6);
    w.read("a", {2, 3}, got.data());
    for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(got[i], a.get(i)) << folder;  // exact in bf16
    w.read("b", {4}, got.data());
    for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(got[i], b.get(i)) << folder;
    EXPECT_EQ(
        tandem::testing::user_error_of([&] {
          w.read("b", {2, 2}, got.data());
        }),
        "tensor 'b' in '" + w.find("b")->file->path() + "' has shape [4]; this model needs [2, 2]");
  }
}

}  // namespace
}  // namespace tandem::io
