// GPT model configs to and from the JSON a checkpoint's meta.json stores.
#include "tandem/train/model_config.h"

#include <climits>
#include <cstdint>

#include "settings.h"
#include "tandem/core/error.h"
#include "tandem/io/json_file.h"

namespace tandem::train {

// The model settings' part of meta.json (settings.h): a GPT-2 model's JSON is what it always
// was; a Llama model's adds "arch" and its fields (a checkpoint without "arch" is GPT-2's).
nlohmann::json model_config_to_json(const nn::GPTConfig& c) { return detail::model_config_json(c); }

std::vector<std::string> model_compat_keys() {
  return {"vocab_size",   "n_layers", "n_heads",       "d_model",  "max_positions",
          "arch",         "kv_heads", "ffn",           "norm_eps", "rope_theta",
          "rope_scaling", "qkv_bias", "tie_embeddings"};
}

nn::GPTConfig model_config_from_json(const nlohmann::json& j, const std::string& source) {
  auto get_int = [&](const char* key) -> int {
    if (!j.contains(key) || !j[key].is_number_integer())
      user_error("{}: the model config has no integer '{}'", source, key);
    // Read wide, so that a value past int is refused rather than wrapped.
    const nlohmann::json& v = j[key];
    const bool fits = v.is_number_unsigned()
                          ? v.get<uint64_t>() <= static_cast<uint64_t>(INT_MAX)
                          : v.get<int64_t>() >= INT_MIN && v.get<int64_t>() <= INT_MAX;
    if (!fits)
      user_error("{}: the model config's '{}' ({}) is out of range", source, key,
                 io::json_excerpt(v));
    return v.get<int>();
  };
  nn::GPTConfig c;
  c.vocab_size = get_int("vocab_size");
  c.n_layers = get_int("n_layers");
  c.n_heads = get_int("n_heads");
  c.d_model = get_int("d_model");
  c.seq_len = get_int("seq_len");
  c.max_positions = get_int("max_positions");
  auto get_number = [&](const nlohmann::json& in, const char* key) -> double {
    if (!in.contains(key) || !in[key].is_number())
      user_error("{}: the model config has no number '{}'", source, key);
    return in[key].get<double>();
  };
  auto get_bool = [&](const char* key) -> bool {
    if (!j.contains(key) || !j[key].is_boolean())
      user_error("{}: the model config has no true/false '{}'", source, key);
    return j[key].get<bool>();
  };
  if (j.contains("arch")) {
    if (!j["arch"].is_string() || (j["arch"] != "llama" && j["arch"] != "gpt2"))
      user_error("{}: the model config's 'arch' is {}; tandem builds gpt2 and llama", source,
                 io::json_excerpt(j["arch"]));
    if (j["arch"] == "llama") {
      c.arch = nn::Arch::Llama;
      c.kv_heads = get_int("kv_heads");
      c.ffn = get_int("ffn");
      c.norm_eps = static_cast<float>(get_number(j, "norm_eps"));
      c.rope_theta = get_number(j, "rope_theta");
      c.qkv_bias = get_bool("qkv_bias");
      c.tie_embeddings = get_bool("tie_embeddings");
      if (j.contains("rope_scaling")) {
        const nlohmann::json& r = j["rope_scaling"];
        if (!r.is_object() || !r.contains("rope_type") || r["rope_type"] != "llama3")
          user_error("{}: the model config's 'rope_scaling' is {}; tandem computes llama3's",
                     source, io::json_excerpt(r));
        c.rope_scaling.type = nn::RopeType::Llama3;
        c.rope_scaling.factor = get_number(r, "factor");
        c.rope_scaling.low_freq_factor = get_number(r, "low_freq_factor");
        c.rope_scaling.high_freq_factor = get_number(r, "high_freq_factor");
        c.rope_scaling.original_max_position_embeddings =
            static_cast<int64_t>(get_number(r, "original_max_position_embeddings"));
      }
    }
  }
  if (j.contains("dropout")) {
    if (!j["dropout"].is_number())
      user_error("{}: the model config's 'dropout' is not a number", source);
    c.dropout = j["dropout"].get<float>();
  }
  try {
    c.validate();
  } catch (const UserError& e) {
    user_error("{}: {}", source, e.what());
  }
  return c;
}

}  // namespace tandem::train
