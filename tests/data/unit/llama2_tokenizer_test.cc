// Llama 2's kind of tokenizer: a tokenizer.json of SentencePiece BPE with byte fallback (Mistral
// 7B's, normalizer Prepend and Replace, decoder Replace, ByteFallback, Fuse, Strip, <s> first)
// against the ids Hugging Face's tokenizers gives, and Llama 2's tokenizer.model against the ids
// SentencePiece gives; a document encoded in pieces cut at line ends gets the ids of the whole,
// and tandem tokenize's shards hold them.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "data/llama2_test_util.h"
#include "tandem/core/sha256.h"
#include "tandem/data/token_corpus.h"
#include "tandem/data/tokenizer.h"
#include "train/hf_tokenizer_test_util.h"
#include "train/token_test_util.h"

namespace tandem::data {
namespace llama2_tokenizer_test {

using llama2_testing::llama2_goldens;
using llama2_testing::llama2_json_path;
using llama2_testing::llama2_json_tokenizer;
using llama2_testing::llama2_model_path;
using llama2_testing::llama2_model_tokenizer;
using testing::ScratchDir;

// Checks `tok` against the goldens' cases (`cases`: their array) and the document.
void expect_cases(const Tokenizer& tok, const nlohmann::json& cases,
                  const nlohmann::json& document) {
  const nlohmann::json& texts = llama2_goldens()["cases"];
  ASSERT_EQ(cases.size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string text = texts[i]["text"].get<std::string>();
    const std::vector<int32_t> want = cases[i]["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(text), want) << text;
    EXPECT_EQ(tok.decode(want), cases[i]["decoded"].get<std::string>()) << text;
  }
  EXPECT_EQ(tok.encode(llama2_goldens()["document"]["text"].get<std::string>()),
            document["ids"].get<std::vector<int32_t>>());
}

// The document's ids when it is encoded in two pieces cut after each of its line ends, the second
// as text after a line end: the whole's, every time.
void expect_pieces_encode_as_the_whole(const Tokenizer& tok, const nlohmann::json& document) {
  const std::string text = llama2_goldens()["document"]["text"].get<std::string>();
  const std::vector<int32_t> whole = document["ids"].get<std::vector<int32_t>>();
  int cuts = 0;
  for (size_t nl = text.find('\n'); nl != std::string::npos; nl = text.find('\n', nl + 1)) {
    std::vector<int32_t> ids = tok.encode(text.substr(0, nl + 1));
    const std::vector<int32_t> rest =
        tok.encode(text.substr(nl + 1), Tokenizer::Start::kAfterLineEnd);
    ids.insert(ids.end(), rest.begin(), rest.end());
    EXPECT_EQ(ids, whole) << "cut after byte " << nl;
    ++cuts;
  }
  EXPECT_GT(cuts, 10);
  // A text that starts a document gets "▁" first; the same text after a line end does not.
  EXPECT_NE(tok.encode("Hello"), tok.encode("Hello", Tokenizer::Start::kAfterLineEnd));
}

// Tokenizes the goldens' document as one file with `tokenizer`: the shards hold, in order, the
// bos (if any), the document's ids and the eos, although the validation split cuts it.
void expect_document_shards(const std::string& tokenizer, const nlohmann::json& document) {
  ScratchDir dir;
  std::filesystem::create_directories(dir.path("corpus"));
  const std::string text = llama2_goldens()["document"]["text"].get<std::string>();
  testing::write_bytes(dir.path("corpus/doc.txt"), text);
  TokenizeConfig c = train::testing::tiny_tokenize(dir, "shards");
  c.tokenizer = tokenizer;
  c.validation_fraction = 0.3;
  tokenize(c);
  const Corpus corpus = load_shard_corpus(dir.path("shards"));
  ASSERT_GT(corpus.validation.size(), 0u);
  std::vector<int32_t> all(corpus.train.size() + corpus.validation.size());
  corpus.train.read(0, corpus.train.size(), all.data());
  corpus.validation.read(0, corpus.validation.size(), all.data() + corpus.train.size());
  const Tokenizer tok = Tokenizer::load(corpus.tokenizer_path);
  std::vector<int32_t> want;
  if (tok.bos_id() >= 0) want.push_back(tok.bos_id());
  for (const int32_t id : document["ids"].get<std::vector<int32_t>>()) want.push_back(id);
  want.push_back(tok.eos_id());
  EXPECT_EQ(all, want);
  EXPECT_EQ(tok.decode(all), text);
}

TEST(Llama2Tokenizer, TheFilesAreTheOnesTheGoldensWereComputedWith) {
  EXPECT_EQ(sha256_hex(testing::read_bytes(llama2_json_path())),
            llama2_goldens()["sha256"].get<std::string>())
      << "tests/data/llama2/tokenizer.json changed: run make_goldens.mjs there again";
  EXPECT_EQ(sha256_hex(testing::read_bytes(llama2_model_path())),
            llama2_goldens()["model"]["sha256"].get<std::string>())
      << "tests/data/llama2/tokenizer.model changed: run make_model_goldens.py there again";
}

TEST(Llama2Tokenizer, EncodesAndDecodesAsHuggingFaceDoes) {
  // English, code, German, Chinese, Japanese, Arabic, emoji, leading spaces, the empty string,
  // characters outside the vocabulary, special tokens and "▁" written in the text.
  expect_cases(llama2_json_tokenizer(), llama2_goldens()["cases"], llama2_goldens()["document"]);
}

TEST(Llama2Tokenizer, NormalizedAddedTokensAreMatchedInTheNormalizedText) {
  // Some Llama 2 files have <s>, </s> and <unk> normalized: Hugging Face matches "▁<s>" in the
  // normalized text, so "<s>" after a space is the token and at a text's start or after a line
  // end it is characters.
  ScratchDir dir;
  nlohmann::json j = nlohmann::json::parse(testing::read_bytes(llama2_json_path()));
  for (nlohmann::json& a : j["added_tokens"]) a["normalized"] = true;
  const Tokenizer tok = Tokenizer::load(train::testing::write_tokenizer(dir, j, "normalized.json"));
  for (const nlohmann::json& c : llama2_goldens()["normalized_added_tokens"]) {
    const std::string text = c["text"].get<std::string>();
    EXPECT_EQ(tok.encode(text), c["ids"].get<std::vector<int32_t>>()) << text;
  }
}

TEST(Llama2Tokenizer, DecodesBytePiecesAsHuggingFaceDoes) {
  // Byte pieces that are not UTF-8 (one U+FFFD each), around a special token (dropped first),
  // and leading spaces (one is stripped).
  const Tokenizer& tok = llama2_json_tokenizer();
  for (const nlohmann::json& c : llama2_goldens()["decode"])
    EXPECT_EQ(tok.decode(c["ids"].get<std::vector<int32_t>>()), c["decoded"].get<std::string>())
        << c["ids"].dump();
}

TEST(Llama2Tokenizer, WhatTheFileSays) {
  const Tokenizer& tok = llama2_json_tokenizer();
  EXPECT_EQ(tok.vocab_size(), 32000);
  // The template's <s> starts each document; </s> ends it; both decode to nothing.
  EXPECT_EQ(tok.bos_id(), llama2_goldens()["bos"].get<int>());
  EXPECT_EQ(tok.encode("<s>"), std::vector<int32_t>{tok.bos_id()});
  EXPECT_EQ(tok.encode("</s>"), std::vector<int32_t>{tok.eos_id()});
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.decode({tok.bos_id(), tok.eos_id()}), "");
  EXPECT_EQ(tok.file_name(), "tokenizer.json");
}

TEST(Llama2Tokenizer, ByteFallbackForCharactersOutsideTheVocabulary) {
  // U+10FFFF is not in the vocabulary: "▁", then its four bytes' pieces <0xF4> <0x8F> <0xBF>
  // <0xBF> (ids 3 to 258 are <0x00> to <0xFF>).
  const Tokenizer& tok = llama2_json_tokenizer();
  const std::vector<int32_t> ids = tok.encode("\U0010FFFF");
  ASSERT_EQ(ids.size(), 5u);
  EXPECT_EQ(tok.decode({ids[0]}), "");  // "▁" alone: the space Strip takes
  EXPECT_EQ(std::vector<int32_t>(ids.begin() + 1, ids.end()),
            (std::vector<int32_t>{3 + 0xF4, 3 + 0x8F, 3 + 0xBF, 3 + 0xBF}));
  EXPECT_EQ(tok.decode(ids), "\U0010FFFF");
  EXPECT_EQ(tok.decode({3 + 0xF4}), "\uFFFD");
}

TEST(Llama2Tokenizer, ADocumentInPiecesCutAtLineEndsEncodesAsTheWhole) {
  expect_pieces_encode_as_the_whole(llama2_json_tokenizer(), llama2_goldens()["document"]);
}

TEST(Llama2Tokenizer, DecodeInvertsEncode) {
  const Tokenizer& tok = llama2_json_tokenizer();
  for (const std::string& t :
       {synthetic_text(5000, 5), std::string("no leading space"),
        std::string("\t tabs\t\tand  spaces \n\n\r\n"), std::string(300, ' ') + "x",
        std::string("Ünïcödé 日本語 🦙 \U0010FFFF end")})
    EXPECT_EQ(tok.decode(tok.encode(t)), t) << t.substr(0, 40);
}

TEST(Llama2Tokenizer, TokenizeWritesTheDocumentsIdsBetweenBosAndEos) {
  expect_document_shards(llama2_json_path(), llama2_goldens()["document"]);
}

TEST(Llama2Tokenizer, AFileLongerThanAChunkGetsTheWholeDocumentsIds) {
  // tandem tokenize encodes 1 MiB chunks cut at line ends: a line that runs past 1 MiB, with "é"
  // across the 1 MiB mark, starts the second chunk, whose "▁" the whole document does not have.
  const std::string line = "The quick brown fox, naïve café.\n";
  std::string text;
  while (text.size() + line.size() < (size_t{1} << 20) - 20) text += line;
  text += std::string((size_t{1} << 20) - 1 - text.size(), 'x') + "é tail\n";
  for (int i = 0; i < 3000; ++i) text += line;
  ScratchDir dir;
  std::filesystem::create_directories(dir.path("corpus"));
  testing::write_bytes(dir.path("corpus/long.txt"), text);
  TokenizeConfig c = train::testing::tiny_tokenize(dir, "shards");
  c.tokenizer = llama2_json_path();
  c.validation_fraction = 0.01;
  tokenize(c);
  const Corpus corpus = load_shard_corpus(dir.path("shards"));
  std::vector<int32_t> all(corpus.train.size() + corpus.validation.size());
  corpus.train.read(0, corpus.train.size(), all.data());
  corpus.validation.read(0, corpus.validation.size(), all.data() + corpus.train.size());
  const Tokenizer& tok = llama2_json_tokenizer();
  std::vector<int32_t> want = {tok.bos_id()};
  const std::vector<int32_t> ids = tok.encode(text);
  want.insert(want.end(), ids.begin(), ids.end());
  want.push_back(tok.eos_id());
  ASSERT_EQ(all.size(), want.size());
  EXPECT_TRUE(all == want);
}

TEST(Llama2Model, TheModelIsLlama2s) {
  // SentencePiece BPE with byte fallback and a dummy prefix, encoded a line at a time.
  const Tokenizer& tok = llama2_model_tokenizer();
  EXPECT_EQ(tok.vocab_size(), 32000);
  EXPECT_EQ(tok.eos_id(), llama2_goldens()["model"]["eos"].get<int>());
  EXPECT_EQ(tok.bos_id(), -1);  // SentencePiece's models put no bos before a document
  EXPECT_TRUE(tok.encodes_by_line());
  EXPECT_EQ(tok.encode("Hello world"), (std::vector<int32_t>{15043, 3186}));
  EXPECT_EQ(tok.file_name(), "tokenizer.model");
}

TEST(Llama2Model, EncodesAndDecodesAsSentencePieceDoes) {
  expect_cases(llama2_model_tokenizer(), llama2_goldens()["model"]["cases"],
               llama2_goldens()["model"]["document"]);
}

TEST(Llama2Model, ADocumentInPiecesCutAtLineEndsEncodesAsTheWhole) {
  expect_pieces_encode_as_the_whole(llama2_model_tokenizer(),
                                    llama2_goldens()["model"]["document"]);
}

TEST(Llama2Model, TokenizeWritesTheDocumentsIds) {
  expect_document_shards(llama2_model_path(), llama2_goldens()["model"]["document"]);
}

}  // namespace llama2_tokenizer_test
}  // namespace tandem::data
