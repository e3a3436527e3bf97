// Hugging Face folders' names and config.json (GPT-2 and Llama), written and read back with
// checks, and their weights, one file or sharded, read tensor by tensor.
#include "tandem/io/hf_folder.h"

#include <fmt/format.h>

#include <climits>
#include <filesystem>
#include <set>
#include <string>

#include "tandem/core/error.h"
#include "tandem/io/atomic_file.h"
#include "tandem/io/json_file.h"

namespace tandem::io {
namespace {

// A double as the shortest decimal a float of the same value prints as: 0.1f is written 0.1,
// not 0.10000000149011612.
double as_written(double v) { return std::stod(fmt::format("{}", static_cast<float>(v))); }

// config.json's fields, read with errors naming the file; a field left out has GPT2Config's
// default.
struct Field {
  const nlohmann::json& j;
  const std::string& source;
  std::string_view family = "GPT-2";  // the model tandem computes, in messages

  bool has(const char* key) const { return j.contains(key) && !j[key].is_null(); }

  int positive_int(const char* key) const {
    if (!j.contains(key) || !j[key].is_number_integer())
      user_error("'{}' has no integer '{}': it is not a {} config", source, key, family);
    const nlohmann::json& v = j[key];
    const bool fits = v.is_number_unsigned()
                          ? v.get<uint64_t>() >= 1 && v.get<uint64_t>() <= uint64_t{INT_MAX}
                          : v.get<int64_t>() >= 1 && v.get<int64_t>() <= INT_MAX;
    if (!fits)
      user_error("'{}': '{}' is {}; it must be a positive integer", source, key, json_excerpt(v));
    return v.get<int>();
  }

  double number(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    if (!j[key].is_number())
      user_error("'{}': '{}' is {}, not a number", source, key, json_excerpt(j[key]));
    return j[key].get<double>();
  }

  // A boolean field that must hold `want` (its default when absent) for tandem to compute the
  // model: `what` says what tandem computes.
  void flag(const char* key, bool want, std::string_view what) const {
    if (!has(key)) return;
    if (!j[key].is_boolean())
      user_error("'{}': '{}' is {}, not true or false", source, key, json_excerpt(j[key]));
    if (j[key].get<bool>() != want)
      user_error("'{}': '{}' is {}; tandem's {} {}, so it must be {}", source, key,
                 json_excerpt(j[key]), family, what, want);
  }
};

}  // namespace

nlohmann::json hf_gpt2_config_json(const HfGpt2Config& c) {
  const double p = as_written(c.dropout);
  const nlohmann::json eos =
      c.eos_token_id ? nlohmann::json(*c.eos_token_id) : nlohmann::json(nullptr);
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", c.vocab_size},
          {"n_positions", c.n_positions},
          {"n_ctx", c.n_positions},
          {"n_embd", c.n_embd},
          {"n_layer", c.n_layer},
          {"n_head", c.n_head},
          {"n_inner", nullptr},
          {"activation_function", "gelu_new"},
          {"resid_pdrop", p},
          {"embd_pdrop", p},
          {"attn_pdrop", p},
          {"layer_norm_epsilon", c.layer_norm_epsilon},
          {"initializer_range", 0.02},
          {"scale_attn_weights", true},
          {"scale_attn_by_inverse_layer_idx", false},
          {"reorder_and_upcast_attn", false},
          {"tie_word_embeddings", true},
          {"use_cache", true},
          {"bos_token_id", eos},
          {"eos_token_id", eos},
          {"torch_dtype", "float32"}};
}

HfGpt2Config hf_gpt2_config_from_json(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) user_error("'{}' is not a JSON object: it is not a GPT-2 config", source);
  const Field f{j, source};
  if (!j.contains("model_type") || !j["model_type"].is_string())
    user_error("'{}' has no 'model_type': it is not a Hugging Face model config", source);
  if (j["model_type"] != "gpt2")
    user_error("'{}' is a config of model_type {}; tandem reads GPT-2 models (\"gpt2\")", source,
               json_excerpt(j["model_type"]));
  HfGpt2Config c;
  c.vocab_size = f.positive_int("vocab_size");
  c.n_positions = f.positive_int("n_positions");
  c.n_embd = f.positive_int("n_embd");
  c.n_layer = f.positive_int("n_layer");
  c.n_head = f.positive_int("n_head");
  c.layer_norm_epsilon = f.number("layer_norm_epsilon", 1e-5);
  // GELU's tanh approximation; transformers names it both ways.
  if (f.has("activation_function")) {
    const nlohmann::json& a = j["activation_function"];
    if (a != "gelu_new" && a != "gelu_pytorch_tanh")
      user_error(
          "'{}': 'activation_function' is {}; tandem's GPT-2 computes GELU's tanh "
          "approximation (\"gelu_new\")",
          source, json_excerpt(a));
  }
  if (f.has("n_inner") &&
      (!j["n_inner"].is_number_integer() || j["n_inner"].get<int64_t>() != 4 * int64_t{c.n_embd}))
    user_error("'{}': 'n_inner' is {}; tandem's GPT-2 has an MLP of 4 n_embd ({}): null or {}",
               source, json_excerpt(j["n_inner"]), 4 * int64_t{c.n_embd}, 4 * int64_t{c.n_embd});
  f.flag("tie_word_embeddings", true, "ties its LM head to wte");
  f.flag("scale_attn_weights", true, "scales attention by 1/sqrt(head size)");
  f.flag("scale_attn_by_inverse_layer_idx", false, "scales attention by 1/sqrt(head size) only");
  f.flag("add_cross_attention", false, "has no cross-attention");
  // One dropout probability for GPT-2's three sites.
  const double resid = f.number("resid_pdrop", 0.1), embd = f.number("embd_pdrop", 0.1),
               attn = f.number("attn_pdrop", 0.1);
  if (resid != embd || resid != attn)
    user_error(
        "'{}': resid_pdrop {}, embd_pdrop {} and attn_pdrop {} differ; tandem has one dropout "
        "for the three (give --dropout to choose it)",
        source, resid, embd, attn);
  c.dropout = resid;
  if (f.has("eos_token_id")) {
    if (!j["eos_token_id"].is_number_integer())
      user_error("'{}': 'eos_token_id' is {}, not an integer", source,
                 json_excerpt(j["eos_token_id"]));
    c.eos_token_id = j["eos_token_id"].get<int>();
  }
  return c;
}

nlohmann::json hf_llama_config_json(const HfLlamaConfig& c) {
  const auto id = [](const std::optional<int>& v) {
    return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
  };
  nlohmann::json scaling = nullptr;
  if (c.rope_scaling)
    scaling = {
        {"rope_type", "llama3"},
        {"factor", c.rope_scaling->factor},
        {"low_freq_factor", c.rope_scaling->low_freq_factor},
        {"high_freq_factor", c.rope_scaling->high_freq_factor},
        {"original_max_position_embeddings", c.rope_scaling->original_max_position_embeddings}};
  nlohmann::json j = {{"architectures", {c.qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"}},
                      {"model_type", c.qwen2 ? "qwen2" : "llama"},
                      {"vocab_size", c.vocab_size},
                      {"hidden_size", c.hidden_size},
                      {"intermediate_size", c.intermediate_size},
                      {"num_hidden_layers", c.num_hidden_layers},
                      {"num_attention_heads", c.num_attention_heads},
                      {"num_key_value_heads", c.num_key_value_heads},
                      {"max_position_embeddings", c.max_position_embeddings},
                      {"hidden_act", "silu"},
                      {"rms_norm_eps", as_written(c.rms_norm_eps)},
                      {"rope_theta", c.rope_theta},
                      {"rope_scaling", scaling},
                      {"tie_word_embeddings", c.tie_word_embeddings},
                      {"attention_dropout", 0.0},
                      {"initializer_range", 0.02},
                      {"use_cache", true},
                      {"bos_token_id", id(c.bos_token_id)},
                      {"eos_token_id", id(c.eos_token_id)},
                      {"torch_dtype", "float32"}};
  if (c.qwen2) {
    // Qwen2's q/k/v biases are part of its architecture; its sliding window is off.
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.num_hidden_layers;
  } else {
    j["head_dim"] = c.hidden_size / c.num_attention_heads;
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
  }
  return j;
}

HfLlamaConfig hf_llama_config_from_json(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) user_error("'{}' is not a JSON object: it is not a Llama config", source);
  if (!j.contains("model_type") || (j["model_type"] != "llama" && j["model_type"] != "qwen2"))
    user_error("'{}' is not a config of model_type \"llama\" or \"qwen2\"", source);
  HfLlamaConfig c;
  c.qwen2 = j["model_type"] == "qwen2";
  const Field f{j, source, c.qwen2 ? "Qwen2" : "Llama"};
  c.vocab_size = f.positive_int("vocab_size");
  c.hidden_size = f.positive_int("hidden_size");
  c.intermediate_size = f.positive_int("intermediate_size");
  c.num_hidden_layers = f.positive_int("num_hidden_layers");
  c.num_attention_heads = f.positive_int("num_attention_heads");
  c.num_key_value_heads =
      f.has("num_key_value_heads") ? f.positive_int("num_key_value_heads") : c.num_attention_heads;
  c.max_position_embeddings = f.positive_int("max_position_embeddings");
  c.rms_norm_eps = f.number("rms_norm_eps", 1e-6);
  c.rope_theta = f.number("rope_theta", 10000.0);
  if (f.has("hidden_act") && j["hidden_act"] != "silu")
    user_error("'{}': 'hidden_act' is {}; tandem's {} computes SwiGLU with SiLU (\"silu\")", source,
               json_excerpt(j["hidden_act"]), f.family);
  // The query/key head size must be hidden_size / num_attention_heads, as tandem's layout has it.
  if (f.has("head_dim")) {
    const nlohmann::json& h = j["head_dim"];
    if (!h.is_number_integer() || c.hidden_size % c.num_attention_heads != 0 ||
        h.get<int64_t>() != c.hidden_size / c.num_attention_heads)
      user_error(
          "'{}': 'head_dim' is {}; tandem's {} has heads of hidden_size / num_attention_heads "
          "({} / {}): null or that quotient",
          source, json_excerpt(h), f.family, c.hidden_size, c.num_attention_heads);
  }
  if (!c.qwen2)
    f.flag("attention_bias", false,
           "has no bias on o_proj (a Llama with attention_bias has biases on q, k, v and o; a "
           "Qwen2 folder's q/k/v biases load)");
  f.flag("mlp_bias", false, "has no biases in its MLP");
  // A sliding window that transformers applies (Qwen2 with use_sliding_window true).
  if (f.has("use_sliding_window")) {
    if (!j["use_sliding_window"].is_boolean())
      user_error("'{}': 'use_sliding_window' is {}, not true or false", source,
                 json_excerpt(j["use_sliding_window"]));
    if (j["use_sliding_window"].get<bool>() && f.has("sliding_window"))
      user_error(
          "'{}': 'use_sliding_window' is true with 'sliding_window' {}; tandem's {} attends to "
          "every earlier position, so it must be false (or 'sliding_window' null)",
          source, json_excerpt(j["sliding_window"]), f.family);
  }
  if (f.has("tie_word_embeddings")) {
    if (!j["tie_word_embeddings"].is_boolean())
      user_error("'{}': 'tie_word_embeddings' is {}, not true or false", source,
                 json_excerpt(j["tie_word_embeddings"]));
    c.tie_word_embeddings = j["tie_word_embeddings"].get<bool>();
  }
  if (f.has("rope_scaling")) {
    const nlohmann::json& r = j["rope_scaling"];
    if (!r.is_object())
      user_error("'{}': 'rope_scaling' is {}; tandem computes llama3's scaling or none (null)",
                 source, json_excerpt(r));
    // transformers spells the kind "rope_type" (older configs: "type").
    const nlohmann::json type = r.contains("rope_type") ? r["rope_type"]
                                : r.contains("type")    ? r["type"]
                                                        : nullptr;
    if (type != "llama3" && type != "default")
      user_error(
          "'{}': 'rope_scaling' has rope_type {}; tandem computes llama3's scaling or none "
          "(null, or \"default\")",
          source, json_excerpt(type));
    if (type == "llama3") {
      const Field s{r, source, f.family};
      HfLlama3Scaling l;
      const auto need = [&](const char* key) {
        if (!r.contains(key) || !r[key].is_number())
          user_error("'{}': 'rope_scaling' (llama3) has no number '{}'", source, key);
        return r[key].get<double>();
      };
      l.factor = need("factor");
      l.low_freq_factor = need("low_freq_factor");
      l.high_freq_factor = need("high_freq_factor");
      l.original_max_position_embeddings = s.positive_int("original_max_position_embeddings");
      c.rope_scaling = l;
    }
  }
  return c;
}

HfConfig read_hf_config(const std::string& path) {
  const std::string text = read_file(path, "Hugging Face model config");
  // Nesting past kMaxJsonDepth is refused before anything recursive walks it.
  const nlohmann::json j = parse_json(text, fmt::format("Hugging Face model config '{}'", path));
  if (!j.is_object()) user_error("'{}' is not a JSON object: it is not a model config", path);
  if (!j.contains("model_type") || !j["model_type"].is_string())
    user_error("'{}' has no 'model_type': it is not a Hugging Face model config", path);
  const nlohmann::json& type = j["model_type"];
  if (type == "gpt2") return hf_gpt2_config_from_json(j, path);
  if (type == "llama" || type == "qwen2") return hf_llama_config_from_json(j, path);
  user_error(
      "'{}' is a config of model_type {}; tandem reads GPT-2, Llama and Qwen2 models (\"gpt2\", "
      "\"llama\", \"qwen2\")",
      path, json_excerpt(type));
}

std::string hf_gpt2_name(std::string_view tandem_name) {
  return std::string(kHfPrefix) + std::string(tandem_name);
}

std::string hf_gpt2_canonical_name(std::string_view name) {
  if (name.starts_with(kHfPrefix) || name.starts_with("lm_head.")) return std::string(name);
  return hf_gpt2_name(name);
}

bool hf_gpt2_is_buffer(std::string_view name) {
  if (!name.starts_with(kHfPrefix)) return false;
  name.remove_prefix(kHfPrefix.size());
  if (!name.starts_with("h.")) return false;
  const size_t dot = name.find('.', 2);
  if (dot == std::string_view::npos || dot == 2) return false;
  for (char ch : name.substr(2, dot - 2))
    if (ch < '0' || ch > '9') return false;
  const std::string_view rest = name.substr(dot + 1);
  return rest == "attn.bias" || rest == "attn.masked_bias";
}

bool hf_llama_is_buffer(std::string_view name) {
  return name.starts_with("model.layers.") && name.ends_with(".rotary_emb.inv_freq");
}

// ---------------------------------------------------------------------------------------------
// HfWeights.

namespace {

namespace fs = std::filesystem;

// A shard's file name from the index, refused unless it names a file inside the folder.
void check_shard_name(const std::string& index, const std::string& tensor,
                      const std::string& file) {
  const fs::path p(file);
  bool outside = file.empty() || p.is_absolute() || p.has_root_path();
  for (const fs::path& part : p)
    if (part == "..") outside = true;
  if (outside)
    user_error(
        "'{}': weight_map entry '{}' names the file '{}', which is not inside the folder: a "
        "shard must be a file beside the index",
        index, tensor, file);
}

}  // namespace

HfWeights::HfWeights(const std::string& dir, NameMap canonical) {
  const std::string single = (fs::path(dir) / kHfWeightsFile).string();
  const std::string index = (fs::path(dir) / kHfIndexFile).string();
  std::error_code ec;
  // One file -> the tensors it holds; the index's weight_map, checked against them below.
  std::vector<std::pair<std::string, std::string>> mapped;  // (tensor, file)
  if (fs::exists(single, ec) || !fs::exists(index, ec)) {
    if (!fs::exists(single, ec))
      user_error(
          "Hugging Face folder '{}' has no {} (nor {} and its shards; tandem export --format "
          "hf writes one; save a transformers model with save_pretrained(..., "
          "safe_serialization=True))",
          dir, kHfWeightsFile, kHfIndexFile);
    source_ = single;
    files_.push_back(std::make_unique<SafetensorsReader>(single));
  } else {
    source_ = index;
    sharded_ = true;
    const nlohmann::json j = parse_json(read_file(index, "Hugging Face weights index"),
                                        fmt::format("Hugging Face weights index '{}'", index));
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      user_error("'{}' has no object 'weight_map' (tensor name -> shard file)", index);
    std::map<std::string, size_t> file_index;
    for (const auto& [tensor, file] : j["weight_map"].items()) {
      if (!file.is_string())
        user_error("'{}': weight_map entry '{}' is {}, not a file name", index, tensor,
                   json_excerpt(file));
      const std::string name = file.get<std::string>();
      check_shard_name(index, tensor, name);
      mapped.emplace_back(tensor, name);
      if (file_index.contains(name)) continue;
      const std::string path = (fs::path(dir) / name).string();
      if (!fs::exists(path, ec))
        user_error("'{}': weight_map entry '{}' names the shard '{}', which does not exist", index,
                   tensor, path);
      file_index[name] = files_.size();
      files_.push_back(std::make_unique<SafetensorsReader>(path));
    }
    if (files_.empty()) user_error("'{}': its weight_map names no tensors", index);
  }
  for (const std::unique_ptr<SafetensorsReader>& f : files_)
    for (const SafetensorsEntry& e : f->tensors()) {
      const auto [it, fresh] = by_name_.emplace(canonical(e.name), Found{f.get(), &e});
      if (!fresh)
        user_error("'{}' holds tensor '{}' twice, as '{}' in '{}' and as '{}' in '{}'", source_,
                   it->first, it->second.entry->name, it->second.file->path(), e.name, f->path());
    }
  // Every entry of the index must be in the shard it names.
  for (const auto& [tensor, file] : mapped) {
    const Found* found = find(canonical(tensor));
    if (found == nullptr || found->file->path() != (fs::path(dir) / file).string())
      user_error("'{}': weight_map entry '{}' names the shard '{}', which has no such tensor",
                 source_, tensor, file);
  }
}

HfWeights::~HfWeights() = default;

const HfWeights::Found* HfWeights::find(std::string_view name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &it->second;
}

void HfWeights::read(std::string_view name, const Shape& shape, float* out) const {
  const Found* f = find(name);
  if (f == nullptr) user_error("'{}' has no tensor '{}', which this model needs", source_, name);
  const SafetensorsEntry& e = *f->entry;
  if (!(e.shape == shape))
    user_error("tensor '{}' in '{}' has shape {}; this model needs {}", e.name, f->file->path(),
               e.shape.str(), shape.str());
  const size_t index = static_cast<size_t>(&e - f->file->tensors().data());
  if (e.dtype == DType::F32) {
    f->file->read(index, out, static_cast<size_t>(shape.numel()) * sizeof(float));
    return;
  }
  const Tensor t = f->file->read_tensor(index);  // 16-bit: widened element by element
  for (int64_t i = 0; i < shape.numel(); ++i) out[i] = t.get(i);
}

std::string hf_tokenizer_file_name(std::string_view tokenizer_path) {
  return tokenizer_path.ends_with(".json") ? "tokenizer.json" : "tokenizer.model";
}

}  // namespace tandem::io
