// GPT model configs to and from the JSON a checkpoint's meta.json stores.
#include "tandem/train/model_config.h"

#include <climits>
#include <cstdint>

#include "tandem/core/error.h"

namespace tandem::train {

nlohmann::json model_config_to_json(const nn::GPTConfig& c) {
  return {{"vocab_size", c.vocab_size}, {"n_layers", c.n_layers},
          {"n_heads", c.n_heads},       {"d_model", c.d_model},
          {"seq_len", c.seq_len},       {"max_positions", c.max_positions},
          {"dropout", c.dropout}};
}

std::vector<std::string> model_compat_keys() {
  return {"vocab_size", "n_layers", "n_heads", "d_model", "max_positions"};
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
      user_error("{}: the model config's '{}' ({}) is out of range", source, key, v.dump());
    return v.get<int>();
  };
  nn::GPTConfig c;
  c.vocab_size = get_int("vocab_size");
  c.n_layers = get_int("n_layers");
  c.n_heads = get_int("n_heads");
  c.d_model = get_int("d_model");
  c.seq_len = get_int("seq_len");
  c.max_positions = get_int("max_positions");
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
