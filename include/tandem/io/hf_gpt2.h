// The Hugging Face GPT-2 folder (transformers' GPT2LMHeadModel as save_pretrained writes it):
// model.safetensors with the state dict's tensor names, config.json with GPT2Config's fields, and
// the tokenizer's files beside them.
//
// tandem's parameter names are GPT2Model's ("h.0.attn.c_attn.weight") and its linear weights are
// already (in, out), as HF's Conv1D stores them, so the two layouts differ only in the
// "transformer." prefix of GPT2LMHeadModel's state dict and in the LM head: tied to wte, it is
// not stored (save_pretrained leaves a tied weight out of safetensors files). Readers also take
// the hub's older files, which name GPT2Model's tensors without the prefix and hold the causal
// masks as buffers ("h.0.attn.bias", "h.0.attn.masked_bias"), and a stored lm_head.weight.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace tandem::io {

inline constexpr std::string_view kHfWeightsFile = "model.safetensors";
inline constexpr std::string_view kHfConfigFile = "config.json";
inline constexpr std::string_view kHfPrefix = "transformer.";
inline constexpr std::string_view kHfLmHead = "lm_head.weight";

// The GPT2Config fields that describe tandem's model; the others are written with the values that
// make transformers compute what tandem computes (GELU's tanh approximation "gelu_new", an MLP of
// 4 n_embd, attention scaled by 1/sqrt(head size), a tied LM head) and refused otherwise.
struct HfGpt2Config {
  int vocab_size = 0;
  int n_positions = 0;
  int n_embd = 0;
  int n_layer = 0;
  int n_head = 0;
  double layer_norm_epsilon = 1e-5;
  double dropout = 0.0;  // resid_pdrop = embd_pdrop = attn_pdrop
  // The tokenizer's end-of-text id, when it has one (GPT2Config's bos and eos ids); else null.
  std::optional<int> eos_token_id;
};

// config.json's contents.
nlohmann::json hf_gpt2_config_json(const HfGpt2Config& c);
// Reads a config.json's object, naming `source` in errors: the five sizes must be positive
// integers, model_type "gpt2", and every field tandem cannot compute (another activation, n_inner
// other than 4 n_embd, untied embeddings, attention scaled otherwise, cross-attention, three
// dropouts that differ) is one UserError naming the field.
HfGpt2Config hf_gpt2_config_from_json(const nlohmann::json& j, const std::string& source);
// The same from the file: "'DIR/config.json' does not exist", "'DIR/config.json' is not JSON: ...".
HfGpt2Config read_hf_gpt2_config(const std::string& path);

// The state-dict name of tandem's tensor `name`: "transformer." + name.
std::string hf_gpt2_name(std::string_view tandem_name);
// A file's tensor name as GPT2LMHeadModel's state dict spells it: GPT2Model's names (the hub's
// older files) get the "transformer." prefix; lm_head.weight and prefixed names are unchanged.
std::string hf_gpt2_canonical_name(std::string_view name);
// Whether a canonical name is one of the causal-mask buffers older files hold
// ("transformer.h.0.attn.bias", "transformer.h.0.attn.masked_bias"): constants, not weights.
bool hf_gpt2_is_buffer(std::string_view canonical_name);

// The name a tokenizer file gets in the folder: "tokenizer.json" for a Hugging Face tokenizer
// (a .json file), else "tokenizer.model" (SentencePiece), as transformers' tokenizers look for
// them.
std::string hf_tokenizer_file_name(std::string_view tokenizer_path);

}  // namespace tandem::io
