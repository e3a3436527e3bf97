// Hugging Face model folders (what transformers' save_pretrained writes and from_pretrained
// reads): config.json, the weights as model.safetensors or as shards an index names, and the
// tokenizer's files beside them. Two families: GPT-2 (GPT2LMHeadModel) and Llama
// (LlamaForCausalLM, and Qwen2ForCausalLM: a Llama with q/k/v biases).
//
// GPT-2: tandem's parameter names are GPT2Model's ("h.0.attn.c_attn.weight") and its linear
// weights are already (in, out), as HF's Conv1D stores them, so the two layouts differ only in the
// "transformer." prefix of GPT2LMHeadModel's state dict and in the LM head: tied to wte, it is
// not stored (save_pretrained leaves a tied weight out of safetensors files). Readers also take
// the hub's older files, which name GPT2Model's tensors without the prefix and hold the causal
// masks as buffers ("h.0.attn.bias", "h.0.attn.masked_bias"), and a stored lm_head.weight.
//
// Llama: LlamaForCausalLM's names ("model.layers.0.self_attn.q_proj.weight"), nn.Linear's
// (out, in) weights, one tensor per projection; tandem's fused tensors are split and transposed
// by train/hf_folder.h. Rotary positions are HF's rotate_half convention in both, so q and k
// need no permutation. Older files' "rotary_emb.inv_freq" buffers are constants, not weights.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "tandem/io/safetensors_stream.h"

namespace tandem::io {

inline constexpr std::string_view kHfWeightsFile = "model.safetensors";
inline constexpr std::string_view kHfConfigFile = "config.json";
// A sharded folder's index: {"metadata": {...}, "weight_map": {tensor name: shard file name}}.
inline constexpr std::string_view kHfIndexFile = "model.safetensors.index.json";
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

// Llama 3.1's "llama3" rope_scaling (nn::RopeScaling's fields, as the config names them).
struct HfLlama3Scaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
  bool operator==(const HfLlama3Scaling&) const = default;
};

// The LlamaConfig (or Qwen2Config) fields that describe tandem's Llama model; the others are
// written with the values that make transformers compute what tandem computes (SiLU, no bias on
// o_proj or the MLP, head_dim = hidden_size / num_attention_heads, no sliding window) and refused
// otherwise, one field a message.
struct HfLlamaConfig {
  bool qwen2 = false;  // model_type "qwen2": q/k/v projections with biases; else "llama", none
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;  // absent: num_attention_heads
  int max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;  // LlamaConfig's and Qwen2Config's default
  double rope_theta = 10000.0;
  std::optional<HfLlama3Scaling> rope_scaling;  // null: none
  bool tie_word_embeddings = false;             // LlamaConfig's default
  // The tokenizer's end-of-text id when an export knows it; readers ignore both ids (Llama 3's
  // eos_token_id is a list).
  std::optional<int> bos_token_id, eos_token_id;
};

nlohmann::json hf_llama_config_json(const HfLlamaConfig& c);
// Reads a config.json of model_type "llama" or "qwen2", naming `source` in errors: the sizes must
// be positive integers, and every field tandem cannot compute is one UserError naming the field.
HfLlamaConfig hf_llama_config_from_json(const nlohmann::json& j, const std::string& source);

// A config.json of either family, by its model_type: "'DIR/config.json' does not exist",
// "'DIR/config.json' is not JSON: ...", a model_type tandem does not read, or the family's own
// refusals.
using HfConfig = std::variant<HfGpt2Config, HfLlamaConfig>;
HfConfig read_hf_config(const std::string& path);

// The state-dict name of tandem's tensor `name`: "transformer." + name.
std::string hf_gpt2_name(std::string_view tandem_name);
// A file's tensor name as GPT2LMHeadModel's state dict spells it: GPT2Model's names (the hub's
// older files) get the "transformer." prefix; lm_head.weight and prefixed names are unchanged.
std::string hf_gpt2_canonical_name(std::string_view name);
// Whether a canonical name is one of the causal-mask buffers older files hold
// ("transformer.h.0.attn.bias", "transformer.h.0.attn.masked_bias"): constants, not weights.
bool hf_gpt2_is_buffer(std::string_view canonical_name);

// A Llama file's tensor that is a constant, not a weight: "model.layers.0.self_attn.rotary_emb.
// inv_freq", which older transformers saved.
bool hf_llama_is_buffer(std::string_view name);

// The tensors of a Hugging Face folder, by name: its model.safetensors, else the shards its
// model.safetensors.index.json maps them to (each file's header read once, the tensors read on
// demand, one at a time). Names are looked up as `canonical` maps them (GPT-2:
// hf_gpt2_canonical_name); two tensors of one canonical name, an index that is not JSON or
// names a file outside the folder (an absolute path, a "..") or a shard that does not exist or
// lacks the tensor mapped to it are each a UserError naming the file and the entry.
class HfWeights {
 public:
  using NameMap = std::string (*)(std::string_view);
  HfWeights(const std::string& dir, NameMap canonical);
  ~HfWeights();
  HfWeights(const HfWeights&) = delete;
  HfWeights& operator=(const HfWeights&) = delete;

  // What holds the weights, for messages: DIR/model.safetensors, or
  // DIR/model.safetensors.index.json.
  const std::string& source() const { return source_; }
  // Whether the weights are shards an index names.
  bool sharded() const { return sharded_; }

  struct Found {
    const SafetensorsReader* file;
    const SafetensorsEntry* entry;  // its name as the file spells it
  };
  // Every tensor, by canonical name.
  const std::map<std::string, Found, std::less<>>& tensors() const { return by_name_; }
  // The tensor of canonical name `name`, or null.
  const Found* find(std::string_view name) const;
  // Tensor `name` whole (its checksum verified where its file records one) into `out`, widened to
  // f32 from a BF16 or F16 file; it must have shape `shape`: a UserError naming the tensor and
  // its file otherwise.
  void read(std::string_view name, const Shape& shape, float* out) const;

 private:
  std::string source_;
  bool sharded_ = false;
  std::vector<std::unique_ptr<SafetensorsReader>> files_;
  std::map<std::string, Found, std::less<>> by_name_;
};

// The name a tokenizer file gets in the folder: "tokenizer.json" for a Hugging Face tokenizer
// (a .json file), else "tokenizer.model" (SentencePiece), as transformers' tokenizers look for
// them.
std::string hf_tokenizer_file_name(std::string_view tokenizer_path);

}  // namespace tandem::io
