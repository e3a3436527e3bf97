// tokenizer.json files tandem cannot use, and the one message each gets: JSON that does not
// parse, tokenizers of another kind (model, pre-tokenizer, normalizer, decoder, options), and
// vocabularies or merges that do not hold together; tokenize writes nothing for any of them.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>

#include "tandem/data/tokenizer.h"
#include "train/hf_tokenizer_test_util.h"
#include "train/token_test_util.h"

namespace tandem::data {
namespace {

using testing::ScratchDir;
using testing::user_error_of;

// The message Tokenizer::load gives for the test tokenizer changed by `change`.
std::string refusal(const ScratchDir& dir, const std::function<void(nlohmann::json&)>& change) {
  nlohmann::json j = train::testing::test_tokenizer_json();
  change(j);
  const std::string path = train::testing::write_tokenizer(dir, j);
  return user_error_of([&] { Tokenizer::load(path); });
}

std::string unsupported(const ScratchDir& dir, const std::string& what) {
  return "tokenizer '" + dir.path("tokenizer.json") + "' is not supported: " + what +
         "; tandem reads Hugging Face tokenizer.json files of GPT-2's or Llama 3's byte-level BPE "
         "and of Llama 2's SentencePiece BPE";
}

std::string malformed(const ScratchDir& dir, const std::string& what) {
  return "tokenizer '" + dir.path("tokenizer.json") + "' is malformed: " + what;
}

TEST(HfTokenizerErrors, NotJson) {
  ScratchDir dir;
  testing::write_bytes(dir.path("tokenizer.json"), "{\"model\": {\"type\": \"BPE\",");
  EXPECT_EQ(user_error_of([&] { Tokenizer::load(dir.path("tokenizer.json")); })
                .rfind("tokenizer '" + dir.path("tokenizer.json") +
                           "' is not valid JSON: parse error at line 1, column 26: syntax error ",
                       0),
            0u);
  testing::write_bytes(dir.path("tokenizer.json"), "[1, 2]");
  EXPECT_EQ(user_error_of([&] { Tokenizer::load(dir.path("tokenizer.json")); }),
            unsupported(dir, "it has no \"model\" (it is not a Hugging Face tokenizer.json)"));
  // A tokenizer.json under another name is read as SentencePiece, and the message says why.
  testing::write_bytes(dir.path("gpt2.model"), train::testing::test_tokenizer_json().dump());
  const std::string message = user_error_of([&] { Tokenizer::load(dir.path("gpt2.model")); });
  EXPECT_EQ(
      message.rfind(
          "tokenizer '" + dir.path("gpt2.model") + "' is not a SentencePiece .model file (", 0),
      0u)
      << message;
  EXPECT_TRUE(message.ends_with("); a Hugging Face tokenizer's name ends in .json")) << message;
}

TEST(HfTokenizerErrors, AnotherKindOfTokenizer) {
  ScratchDir dir;
  EXPECT_EQ(refusal(dir, [](auto& j) { j["model"]["type"] = "WordPiece"; }),
            unsupported(dir, "its model is WordPiece, not BPE"));
  EXPECT_EQ(refusal(dir, [](auto& j) { j["model"]["type"] = "Unigram"; }),
            unsupported(dir, "its model is Unigram, not BPE"));
  EXPECT_EQ(refusal(dir, [](auto& j) { j["model"].erase("vocab"); }),
            unsupported(dir, "its BPE model has no vocab"));
  EXPECT_EQ(refusal(dir, [](auto& j) { j["model"].erase("merges"); }),
            unsupported(dir, "its BPE model has no merges"));
  // byte_fallback makes it Llama 2's kind, which has no pre-tokenizer.
  EXPECT_EQ(refusal(dir, [](auto& j) { j["model"]["byte_fallback"] = true; }),
            unsupported(dir,
                        "its BPE model sets byte_fallback, as Llama 2's does, but it has a "
                        "pre-tokenizer, ByteLevel (Llama 2's has none)"));
  EXPECT_EQ(refusal(dir, [](auto& j) { j["model"]["dropout"] = 0.1; }),
            unsupported(dir, "its BPE model sets dropout"));
  EXPECT_EQ(refusal(dir, [](auto& j) { j["model"]["continuing_subword_prefix"] = "##"; }),
            unsupported(dir, "its BPE model sets continuing_subword_prefix"));
  EXPECT_EQ(refusal(dir,
                    [](auto& j) {
                      j["normalizer"] = {{"type", "NFC"}};
                    }),
            unsupported(dir,
                        "its normalizer is NFC (GPT-2's and Llama 3's have none; Llama 2's kind "
                        "sets byte_fallback)"));
  EXPECT_EQ(refusal(dir,
                    [](auto& j) {
                      j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "▁"}};
                    }),
            unsupported(dir,
                        "its pre-tokenizer is Metaspace, not ByteLevel or a Sequence of Split and "
                        "ByteLevel"));
  EXPECT_EQ(refusal(dir, [](auto& j) { j["pre_tokenizer"] = nullptr; }),
            unsupported(dir,
                        "it has no pre-tokenizer (GPT-2's is ByteLevel; Llama 3's a Sequence of "
                        "Split and ByteLevel)"));
  EXPECT_EQ(refusal(dir, [](auto& j) { j["pre_tokenizer"]["add_prefix_space"] = true; }),
            unsupported(dir, "its ByteLevel pre-tokenizer sets add_prefix_space"));
  EXPECT_EQ(refusal(dir, [](auto& j) { j["pre_tokenizer"]["use_regex"] = false; }),
            unsupported(dir,
                        "its ByteLevel pre-tokenizer does not use GPT-2's pattern (use_regex "
                        "false)"));
  EXPECT_EQ(refusal(dir,
                    [](auto& j) {
                      j["decoder"] = {{"type", "WordPiece"}};
                    }),
            unsupported(dir, "its decoder is WordPiece, not ByteLevel"));
  // A vocabulary without the byte alphabet is not byte-level (id 65 is some other token).
  EXPECT_EQ(refusal(dir,
                    [](auto& j) {
                      j["model"]["vocab"].erase("A");
                      j["model"]["vocab"]["not A"] = 65;
                    }),
            unsupported(dir,
                        "its vocabulary has no token for byte 0x41 ('A'), so it is not a "
                        "byte-level BPE"));
}

TEST(HfTokenizerErrors, VocabularyAndMergesThatDoNotHoldTogether) {
  ScratchDir dir;
  EXPECT_EQ(refusal(dir, [](auto& j) { j["model"]["vocab"].erase("Ġcat"); }),
            malformed(dir, "it has no token of id 269 (ids must run from 0 without gaps)"));
  EXPECT_EQ(refusal(dir, [](auto& j) { j["model"]["vocab"]["Ġcat"] = 999; }),
            malformed(dir, "token 'Ġcat' has id 999 (ids must run from 0 without gaps)"));
  EXPECT_EQ(refusal(dir, [](auto& j) { j["model"]["vocab"]["Ġcat"] = 0; }),
            malformed(dir, "tokens 'Ā' and 'Ġcat' have the same id 0"));
  EXPECT_EQ(refusal(dir, [](auto& j) { j["model"]["vocab"]["!"] = "one"; }),
            "tokenizer '" + dir.path("tokenizer.json") +
                "': 'model.vocab[\"!\"]' must be an integer (it is \"one\")");
  EXPECT_EQ(refusal(dir, [](auto& j) { j["model"]["merges"].push_back("q zz"); }),
            malformed(dir, "merge 18 ('q zz') names a token not in its vocab"));
  EXPECT_EQ(refusal(dir, [](auto& j) { j["model"]["merges"].push_back("qzz"); }),
            malformed(dir, "merge 18 (\"qzz\") is not two tokens"));
}

TEST(HfTokenizerErrors, TokenizeWritesNothing) {
  ScratchDir dir;
  train::testing::write_corpus(dir);
  nlohmann::json j = train::testing::test_tokenizer_json();
  j["model"]["type"] = "WordPiece";
  TokenizeConfig c = train::testing::tiny_tokenize(dir, "out");
  c.tokenizer = train::testing::write_tokenizer(dir, j);
  EXPECT_EQ(user_error_of([&] { tokenize(c); }),
            unsupported(dir, "its model is WordPiece, not BPE"));
  EXPECT_FALSE(std::filesystem::exists(dir.path("out")));
}

}  // namespace
}  // namespace tandem::data
