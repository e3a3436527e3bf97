// The Hugging Face GPT-2 layout's names and config.json: written as transformers writes them and
// read back; the hub's older names mapped to GPT2LMHeadModel's; the causal-mask buffers told apart
// from weights.
#include "tandem/io/hf_gpt2.h"

#include <gtest/gtest.h>

#include "support/scratch.h"
#include "tandem/core/error.h"

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
  EXPECT_EQ(tandem::testing::user_error_of([&] { read_hf_gpt2_config(dir.path("config.json")); }),
            "Hugging Face model config '" + dir.path("config.json") + "' does not exist");
}

}  // namespace
}  // namespace tandem::io
