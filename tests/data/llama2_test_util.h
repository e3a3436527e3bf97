// Helpers of the Llama 2 tokenizer tests: the files in tests/data/llama2/ (Mistral 7B's
// tokenizer.json, of Llama 2's kind, and Llama 2's tokenizer.model), loaded once, the ids their
// references gave (goldens.json), and a small tokenizer.json of the same kind for the error tests.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "support/files.h"
#include "tandem/data/tokenizer.h"

namespace tandem::data::llama2_testing {

inline std::string llama2_dir() { return std::string(TANDEM_SOURCE_DIR) + "/tests/data/llama2"; }
inline std::string llama2_json_path() { return llama2_dir() + "/tokenizer.json"; }
inline std::string llama2_model_path() { return llama2_dir() + "/tokenizer.model"; }

inline const nlohmann::json& llama2_goldens() {
  static const nlohmann::json goldens =
      nlohmann::json::parse(tandem::testing::read_bytes(llama2_dir() + "/goldens.json"));
  return goldens;
}

// The tokenizers, loaded once per test program (each load reads the whole file).
inline const Tokenizer& llama2_json_tokenizer() {
  static const Tokenizer tok = Tokenizer::load(llama2_json_path());
  return tok;
}
inline const Tokenizer& llama2_model_tokenizer() {
  static const Tokenizer tok = Tokenizer::load(llama2_model_path());
  return tok;
}

// The tokenizer.json here with its model cut to the control tokens, the 256 byte pieces, "▁" and
// a few pieces and merges (▁ t, h e, ▁t he, i n), in ids that run from 0: small enough to load
// often.
inline nlohmann::json small_llama2_json() {
  static const nlohmann::json small = [] {
    nlohmann::json j = nlohmann::json::parse(tandem::testing::read_bytes(llama2_json_path()));
    nlohmann::json vocab = nlohmann::json::object();
    for (const auto& [token, id] : j["model"]["vocab"].items())
      if (id.get<int>() < 259) vocab[token] = id;
    for (const char* piece :
         {"\u2581", "t", "h", "e", "i", "n", "\u2581t", "he", "\u2581the", "in"})
      if (!vocab.contains(piece)) {
        const size_t id = vocab.size();
        vocab[piece] = id;
      }
    j["model"]["vocab"] = vocab;
    j["model"]["merges"] = {"\u2581 t", "h e", "\u2581t he", "i n"};
    return j;
  }();
  return small;
}

}  // namespace tandem::data::llama2_testing
