// The Hugging Face GPT-2 folder's names and config.json, written and read back with checks.
#include "tandem/io/hf_gpt2.h"

#include <fmt/format.h>

#include <climits>
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

  bool has(const char* key) const { return j.contains(key) && !j[key].is_null(); }

  int positive_int(const char* key) const {
    if (!j.contains(key) || !j[key].is_number_integer())
      user_error("'{}' has no integer '{}': it is not a GPT-2 config", source, key);
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
      user_error("'{}': '{}' is {}; tandem's GPT-2 {}, so it must be {}", source, key,
                 json_excerpt(j[key]), what, want);
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

HfGpt2Config read_hf_gpt2_config(const std::string& path) {
  const std::string text = read_file(path, "Hugging Face model config");
  // Nesting past kMaxJsonDepth is refused before anything recursive walks it.
  const nlohmann::json j = parse_json(text, fmt::format("Hugging Face model config '{}'", path));
  return hf_gpt2_config_from_json(j, path);
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

std::string hf_tokenizer_file_name(std::string_view tokenizer_path) {
  return tokenizer_path.ends_with(".json") ? "tokenizer.json" : "tokenizer.model";
}

}  // namespace tandem::io
