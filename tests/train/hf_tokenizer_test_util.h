// Helpers of the tokenizer.json tests: a small GPT-2-style byte-level BPE that the tests write
// themselves (GPT-2's byte alphabet, a handful of merges, <|endoftext|>), and its ids by token.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "support/files.h"
#include "support/scratch.h"

namespace tandem::train::testing {

using tandem::testing::ScratchDir;
using tandem::testing::write_bytes;

// GPT-2's bytes_to_unicode(), written out here as the reference: the printable bytes stand for
// themselves, the others for U+0100, U+0101, ... in byte order. Returned as UTF-8.
inline std::string byte_char(int b) {
  auto printable = [](int x) {
    return (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
  };
  int cp = b;
  if (!printable(b)) {
    cp = 256;
    for (int x = 0; x < b; ++x) cp += printable(x) ? 0 : 1;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// The test tokenizer's merges, lowest rank first. The last three join "x" or "e" to what follows
// them, so an encoding shows where a word of non-ASCII text ended ("é" is U+00E9: Ã ©; "٣" is
// U+0663: Ù £; a combining acute accent is U+0301: Ì and byte 0x81's character).
inline std::vector<std::pair<std::string, std::string>> test_merges() {
  return {{"Ġ", "t"}, {"h", "e"},   {"Ġt", "he"}, {"'", "s"},  {"Ġ", "Ġ"}, {"1", "2"},
          {"c", "a"}, {"ca", "t"},  {"Ċ", "Ċ"},   {"Ã", "©"},  {"a", "a"}, {"y", "z"},
          {"x", "y"}, {"Ġ", "cat"}, {"i", "n"},   {"x", "Ã©"}, {"x", "Ù"}, {"e", "Ì"}};
}

// The test tokenizer.json, in the layout Hugging Face's tokenizers library writes for GPT-2: id b
// is byte b's character, then one id per merge in rank order, then <|endoftext|>.
inline nlohmann::json test_tokenizer_json() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& [l, r] : test_merges()) {
    const size_t id = vocab.size();
    vocab[l + r] = id;
    merges.push_back(l + " " + r);
  }
  const size_t eos = vocab.size();
  vocab["<|endoftext|>"] = eos;
  const nlohmann::json byte_level = {{"type", "ByteLevel"},
                                     {"add_prefix_space", false},
                                     {"trim_offsets", true},
                                     {"use_regex", true}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens",
           {{{"id", eos},
             {"content", "<|endoftext|>"},
             {"single_word", false},
             {"lstrip", false},
             {"rstrip", false},
             {"normalized", true},
             {"special", true}}}},
          {"normalizer", nullptr},
          {"pre_tokenizer", byte_level},
          {"post_processor", byte_level},
          {"decoder", byte_level},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", ""},
            {"end_of_word_suffix", ""},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"vocab", vocab},
            {"merges", merges}}}};
}

// Writes `j` to dir/name and returns the path.
inline std::string write_tokenizer(const ScratchDir& dir, const nlohmann::json& j,
                                   const std::string& name = "tokenizer.json") {
  write_bytes(dir.path(name), j.dump(1));
  return dir.path(name);
}

// The test tokenizer's ids of `tokens` (its byte-level strings, such as "Ġthe").
inline std::vector<int32_t> ids_of(const std::vector<std::string>& tokens) {
  const nlohmann::json vocab = test_tokenizer_json()["model"]["vocab"];
  std::vector<int32_t> ids;
  for (const std::string& t : tokens) ids.push_back(vocab.at(t).get<int32_t>());
  return ids;
}

}  // namespace tandem::train::testing
