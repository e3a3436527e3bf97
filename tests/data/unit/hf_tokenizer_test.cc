// Hugging Face tokenizer.json (GPT-2's byte-level BPE): encodings of a small tokenizer the test
// writes worked out by hand (GPT-2's pre-tokenization pattern, merges by rank, the byte alphabet),
// decode(encode(text)) == text, encoding from many threads at once, and token shards written with
// it that load back with the same tokenizer.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <thread>

#include "tandem/core/sha256.h"
#include "tandem/data/token_corpus.h"
#include "tandem/data/tokenizer.h"
#include "train/hf_tokenizer_test_util.h"
#include "train/token_test_util.h"

namespace tandem::data {
namespace {

using testing::ScratchDir;
using train::testing::byte_char;
using train::testing::ids_of;

// The ids of each byte of `s`, one token a byte.
std::vector<std::string> byte_tokens(std::string_view s) {
  std::vector<std::string> out;
  for (char c : s) out.push_back(byte_char(static_cast<unsigned char>(c)));
  return out;
}

std::vector<std::string> join(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class HfTokenizer : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = train::testing::write_tokenizer(dir_, train::testing::test_tokenizer_json());
    tok_ = std::make_unique<Tokenizer>(Tokenizer::load(path_));
  }
  std::vector<int32_t> encode(std::string_view s) const { return tok_->encode(s); }
  ScratchDir dir_;
  std::string path_;
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(HfTokenizer, ByteAlphabetIsGpt2s) {
  // The reference mapping itself, against characters GPT-2's vocabulary is known for.
  EXPECT_EQ(byte_char(' '), "Ġ");
  EXPECT_EQ(byte_char('\n'), "Ċ");
  EXPECT_EQ(byte_char('\t'), "ĉ");
  EXPECT_EQ(byte_char(0), "Ā");
  EXPECT_EQ(byte_char(0xAD), "Ń");
  EXPECT_EQ(byte_char('A'), "A");
  EXPECT_EQ(byte_char(0xE9), "é");
  // Every byte encodes to its own token (id b here) and decodes back (alone, a byte past ASCII is
  // not UTF-8: U+FFFD).
  for (int b = 0; b < 256; ++b) {
    const std::string s(1, static_cast<char>(b));
    ASSERT_EQ(encode(s), std::vector<int32_t>{b}) << b;
    ASSERT_EQ(tok_->decode({b}), b < 0x80 ? s : "\uFFFD") << b;
  }
}

TEST_F(HfTokenizer, WhatTheFileSays) {
  EXPECT_EQ(tok_->vocab_size(), 256 + 18 + 1);
  EXPECT_EQ(tok_->eos_id(), ids_of({"<|endoftext|>"})[0]);
  EXPECT_EQ(tok_->file_name(), "tokenizer.json");
  EXPECT_EQ(tok_->source(), path_);
  EXPECT_EQ(tok_->model_bytes(), testing::read_bytes(path_));
  EXPECT_EQ(tok_->sha256(), sha256_hex(testing::read_bytes(path_)));
}

TEST_F(HfTokenizer, WordsAndMerges) {
  // " cat": Ġ c a t -> Ġ ca t -> Ġ cat -> Ġcat; "the" merges h e only (no "t he").
  EXPECT_EQ(encode("the cat"), ids_of({"t", "he", "Ġcat"}));
  // A space starts the next word: Ġ t h e -> Ġt he -> Ġthe.
  EXPECT_EQ(encode(" the"), ids_of({"Ġthe"}));
  // Merges by rank, not by position: y z (rank 11) before x y (rank 12); the leftmost of equals.
  EXPECT_EQ(encode("xyz"), ids_of({"x", "yz"}));
  EXPECT_EQ(encode("aaa"), ids_of({"aa", "a"}));
  EXPECT_EQ(encode("aaaa"), ids_of({"aa", "aa"}));
  // A word longer than the cache holds is merged the same way.
  EXPECT_EQ(encode(std::string(1001, 'a')).size(), 501u);
}

TEST_F(HfTokenizer, Contractions) {
  EXPECT_EQ(encode("it's"), ids_of({"i", "t", "'s"}));
  // 's is a word of its own even before a letter; "'" alone otherwise (case matters).
  EXPECT_EQ(encode("'sa"), ids_of({"'s", "a"}));
  EXPECT_EQ(encode("IT'S"), ids_of({"I", "T", "'", "S"}));
  EXPECT_EQ(encode("we'll"), ids_of({"w", "e", "'", "l", "l"}));
}

TEST_F(HfTokenizer, DigitsAndPunctuation) {
  // Numbers are words of their own, with an optional leading space, never split into digits.
  EXPECT_EQ(encode("in 12345"), ids_of({"in", "Ġ", "12", "3", "4", "5"}));
  EXPECT_EQ(encode("x12y"), ids_of({"x", "12", "y"}));
  // Punctuation runs: "!!" one word; " ?!" with its space; brackets apart from letters.
  EXPECT_EQ(encode("Hi!!"), ids_of({"H", "i", "!", "!"}));
  EXPECT_EQ(encode("(cat)"), ids_of({"(", "cat", ")"}));
  EXPECT_EQ(encode("a ?!"), ids_of({"a", "Ġ", "?", "!"}));
}

TEST_F(HfTokenizer, Whitespace) {
  // Two spaces: the first alone, the second starts " b" (so Ġ Ġ never merges across them).
  EXPECT_EQ(encode("a  b"), ids_of({"a", "Ġ", "Ġ", "b"}));
  EXPECT_EQ(encode("a   b"), ids_of({"a", "ĠĠ", "Ġ", "b"}));
  // Newlines: a run but its last character, which stands alone before a word.
  EXPECT_EQ(encode("a\n\nb"), ids_of({"a", "Ċ", "Ċ", "b"}));
  EXPECT_EQ(encode("a\n\n\nb"), ids_of({"a", "ĊĊ", "Ċ", "b"}));
  EXPECT_EQ(encode(" \n cat"), ids_of({"Ġ", "Ċ", "Ġcat"}));
  // At the end of the text a run is one word.
  EXPECT_EQ(encode("end  "), ids_of({"e", "n", "d", "ĠĠ"}));
  EXPECT_EQ(encode("x\t\n"), ids_of({"x", "ĉ", "Ċ"}));
}

TEST_F(HfTokenizer, NonAsciiText) {
  // é is a letter: "café" one word, "xé" one word (x Ã© merges); UTF-8 bytes, then merges.
  EXPECT_EQ(encode("café"), ids_of({"ca", "f", "Ã©"}));
  EXPECT_EQ(encode("xé"), ids_of({"xÃ©"}));
  // ٣ (ARABIC-INDIC DIGIT THREE) is a number: a word apart from x, so x Ù does not merge.
  EXPECT_EQ(encode("x٣"), ids_of({"x", "Ù", "£"}));
  // A combining accent is neither letter nor number: a word apart from its e.
  EXPECT_EQ(encode("e\u0301"), ids_of(join({"e"}, byte_tokens("\u0301"))));
  // CJK letters are a word; " café" follows with its space.
  EXPECT_EQ(encode("日本語 café"), ids_of(join(byte_tokens("日本語"), {"Ġ", "ca", "f", "Ã©"})));
  // A no-break space is whitespace: alone before the word that follows.
  EXPECT_EQ(encode("x\u00a0the"), ids_of(join(join({"x"}, byte_tokens("\u00a0")), {"t", "he"})));
}

TEST_F(HfTokenizer, EndOfTextIsSpecial) {
  const int32_t eos = tok_->eos_id();
  // Appended between documents, it decodes to nothing; written in the text it is that token, as
  // Hugging Face's tokenizers encodes it (an added token is matched before the text is cut into
  // words), so the text around it is encoded apart.
  EXPECT_EQ(tok_->decode(ids_of({"t", "he", "<|endoftext|>", "Ġcat"})), "the cat");
  EXPECT_EQ(encode("the<|endoftext|> cat"), ids_of({"t", "he", "<|endoftext|>", "Ġcat"}));
  EXPECT_EQ(encode("<|endoftext|><|endoftext|>"), std::vector<int32_t>(2, eos));
  EXPECT_EQ(encode("a<|endoftext|"),
            ids_of({"a", "<", "|", "e", "n", "d", "o", "f", "t", "e", "x", "t", "|"}));
  EXPECT_EQ(tok_->decode(encode("x<|endoftext|>y")), "xy");
  EXPECT_EQ(testing::user_error_of([&] { tok_->decode({eos + 1}); }),
            "token id 275 is outside the tokenizer's vocabulary of 275 tokens");
}

TEST_F(HfTokenizer, DecodeInvertsEncode) {
  const std::vector<std::string> texts = {
      "",
      synthetic_text(20000, 5),
      "Ünïcödé: 日本語, naïve café — €5. It's 2024; they'll've \"quoted\"\n\n\n  tabs\t\tend ",
      "  leading spaces\r\nwindows lines\r\n\u3000ideographic space, emoji 🙂🙂, e\u0301\u0301",
      std::string(3000, ' ') + std::string(3000, 'x') + std::string(100, '\n'),
  };
  for (const std::string& t : texts) EXPECT_EQ(tok_->decode(encode(t)), t) << t.substr(0, 40);
  // Bytes that are not UTF-8 encode too, and decode as Hugging Face's do: U+FFFD for each bad part.
  EXPECT_EQ(tok_->decode(encode("a\xff\xfe b\xe6\x97")), "a\uFFFD\uFFFD b\uFFFD");
  EXPECT_EQ(tok_->decode(ids_of({"Ã"})), "\uFFFD");  // half of é
  EXPECT_EQ(tok_->decode(ids_of({"Ã", "©"})), "é");
}

TEST_F(HfTokenizer, EncodesFromManyThreadsAtOnce) {
  const std::string text = synthetic_text(40000, 9);
  std::vector<std::string> parts;
  for (size_t at = 0; at < text.size(); at += 5000) parts.push_back(text.substr(at, 5000));
  std::vector<std::vector<int32_t>> serial;
  {
    const Tokenizer fresh = Tokenizer::load(path_);  // its own, empty word cache
    for (const std::string& p : parts) serial.push_back(fresh.encode(p));
  }
  std::vector<std::vector<std::vector<int32_t>>> got(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < got.size(); ++t)
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round)
        for (size_t i = 0; i < parts.size(); ++i)
          got[t].push_back(tok_->encode(parts[(i + t) % parts.size()]));
    });
  for (std::thread& th : threads) th.join();
  for (size_t t = 0; t < got.size(); ++t)
    for (size_t k = 0; k < got[t].size(); ++k)
      ASSERT_EQ(got[t][k], serial[(k % parts.size() + t) % parts.size()]) << t << " " << k;
}

TEST(HfTokenizerOptions, IgnoreMergesTakesWholeWordsFromTheVocabulary) {
  ScratchDir dir;
  nlohmann::json j = train::testing::test_tokenizer_json();
  j["model"]["vocab"]["Ġxyz"] = j["model"]["vocab"].size();
  const Tokenizer merged = Tokenizer::load(train::testing::write_tokenizer(dir, j, "merged.json"));
  EXPECT_EQ(merged.encode(" xyz"), ids_of({"Ġ", "x", "yz"}));
  j["model"]["ignore_merges"] = true;
  const Tokenizer whole = Tokenizer::load(train::testing::write_tokenizer(dir, j, "whole.json"));
  EXPECT_EQ(whole.encode(" xyz"), std::vector<int32_t>{275});
  EXPECT_EQ(whole.encode(" xy"), merged.encode(" xy"));
  EXPECT_EQ(whole.decode({275}), " xyz");
}

TEST(HfTokenizerShards, TokenizeWritesTheJsonBesideTheShards) {
  ScratchDir dir;
  const std::string text = train::testing::write_corpus(dir);
  TokenizeConfig c = train::testing::tiny_tokenize(dir, "shards");
  c.tokenizer = train::testing::write_tokenizer(dir, train::testing::test_tokenizer_json());
  const TokenizeSummary s = tokenize(c);
  EXPECT_EQ(s.vocab_size, 275);
  // The tokenizer is kept as tokenizer.json, named in shards.json, and loads back the same.
  EXPECT_FALSE(std::filesystem::exists(dir.path("shards/tokenizer.model")));
  EXPECT_EQ(testing::read_bytes(dir.path("shards/tokenizer.json")),
            testing::read_bytes(c.tokenizer));
  const nlohmann::json index =
      nlohmann::json::parse(testing::read_bytes(dir.path("shards/shards.json")));
  EXPECT_EQ(index["tokenizer"], "tokenizer.json");
  const Corpus corpus = load_shard_corpus(dir.path("shards"));
  EXPECT_EQ(corpus.tokenizer_path, dir.path("shards/tokenizer.json"));
  const Tokenizer tok = Tokenizer::load(corpus.tokenizer_path);
  EXPECT_EQ(tok.sha256(), corpus.tokenizer_sha256);
  // The shards decode to the text (an end-of-text token after each of the three files).
  std::vector<int32_t> all(corpus.train.size() + corpus.validation.size());
  corpus.train.read(0, corpus.train.size(), all.data());
  corpus.validation.read(0, corpus.validation.size(), all.data() + corpus.train.size());
  EXPECT_EQ(std::count(all.begin(), all.end(), tok.eos_id()), 3);
  EXPECT_EQ(tok.decode(all), text);
}

}  // namespace
}  // namespace tandem::data
