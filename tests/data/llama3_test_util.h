// Helpers of the Llama 3 tokenizer.json tests: the small Llama 3 tokenizer in tests/data/llama3/
// (cut from the real one by make_goldens.mjs there) and the ids Hugging Face's tokenizers gave for
// its texts, with that file and with the real one.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "support/files.h"

namespace tandem::data::llama3_testing {

inline std::string llama3_dir() { return std::string(TANDEM_SOURCE_DIR) + "/tests/data/llama3"; }
inline std::string small_llama3_path() { return llama3_dir() + "/tokenizer.json"; }
inline nlohmann::json small_llama3_json() {
  return nlohmann::json::parse(tandem::testing::read_bytes(small_llama3_path()));
}
inline nlohmann::json llama3_goldens() {
  return nlohmann::json::parse(tandem::testing::read_bytes(llama3_dir() + "/goldens.json"));
}

}  // namespace tandem::data::llama3_testing
