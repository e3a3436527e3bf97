// Llama 3-style tokenizer.json files tandem cannot use, and the one message each gets: split
// patterns other than Llama 3's (Qwen 2's, a string), other Split options, other pre-tokenizer
// sequences, post-processors and templates tandem does not implement, added tokens with options,
// and templates or added tokens that do not hold together.
#include <gtest/gtest.h>

#include <functional>

#include "data/llama3_test_util.h"
#include "tandem/data/tokenizer.h"
#include "train/hf_tokenizer_test_util.h"
#include "train/token_test_util.h"

namespace tandem::data {
namespace llama3_tokenizer_error_test {

using testing::ScratchDir;
using testing::user_error_of;

// The message Tokenizer::load gives for the small Llama 3 tokenizer changed by `change`.
std::string llama3_refusal(const ScratchDir& dir,
                           const std::function<void(nlohmann::json&)>& change) {
  nlohmann::json j = llama3_testing::small_llama3_json();
  change(j);
  const std::string path = train::testing::write_tokenizer(dir, j);
  return user_error_of([&] { Tokenizer::load(path); });
}

std::string llama3_unsupported(const ScratchDir& dir, const std::string& what) {
  return "tokenizer '" + dir.path("tokenizer.json") + "' is not supported: " + what +
         "; tandem reads Hugging Face tokenizer.json files of GPT-2's or Llama 3's byte-level BPE "
         "and of Llama 2's SentencePiece BPE";
}

std::string llama3_malformed(const ScratchDir& dir, const std::string& what) {
  return "tokenizer '" + dir.path("tokenizer.json") + "' is malformed: " + what;
}

nlohmann::json& split_of(nlohmann::json& j) { return j["pre_tokenizer"]["pretokenizers"][0]; }
nlohmann::json& template_of(nlohmann::json& j) { return j["post_processor"]["processors"][1]; }

TEST(Llama3TokenizerErrors, SplitPatternsOtherThanLlama3s) {
  ScratchDir dir;
  // Qwen 2's pattern differs from Llama 3's in one place (\p{N} for \p{N}{1,3}).
  const std::string qwen2 =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
      "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  EXPECT_EQ(
      llama3_refusal(dir, [&](auto& j) { split_of(j)["pattern"]["Regex"] = qwen2; }),
      llama3_unsupported(dir, "its Split pre-tokenizer's pattern " + nlohmann::json(qwen2).dump() +
                                  " is not Llama 3's (tandem implements that one pattern)"));
  EXPECT_EQ(llama3_refusal(dir,
                           [](auto& j) {
                             split_of(j)["pattern"] = {{"String", " "}};
                           }),
            llama3_unsupported(dir,
                               "its Split pre-tokenizer splits on the string \" \" (tandem "
                               "implements Llama 3's pattern only)"));
  EXPECT_EQ(llama3_refusal(dir, [](auto& j) { split_of(j).erase("pattern"); }),
            llama3_unsupported(dir, "its Split pre-tokenizer has no pattern {\"Regex\": ...}"));
  EXPECT_EQ(llama3_refusal(dir, [](auto& j) { split_of(j)["behavior"] = "Removed"; }),
            llama3_unsupported(dir, "its Split pre-tokenizer's behavior is Removed, not Isolated"));
  EXPECT_EQ(llama3_refusal(dir, [](auto& j) { split_of(j)["invert"] = true; }),
            llama3_unsupported(dir, "its Split pre-tokenizer sets invert"));
}

TEST(Llama3TokenizerErrors, OtherPreTokenizerSequences) {
  ScratchDir dir;
  EXPECT_EQ(
      llama3_refusal(dir,
                     [](auto& j) {
                       j["pre_tokenizer"]["pretokenizers"].push_back({{"type", "Digits"}});
                     }),
      llama3_unsupported(dir,
                         "its pre-tokenizer is a Sequence of Split, ByteLevel, Digits (tandem "
                         "implements Llama 3's: Split, ByteLevel)"));
  EXPECT_EQ(llama3_refusal(dir, [](auto& j) { j["pre_tokenizer"]["pretokenizers"] = {}; }),
            llama3_unsupported(dir,
                               "its pre-tokenizer is a Sequence of nothing (tandem implements "
                               "Llama 3's: Split, ByteLevel)"));
  EXPECT_EQ(llama3_refusal(
                dir, [](auto& j) { j["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = true; }),
            llama3_unsupported(dir,
                               "its ByteLevel pre-tokenizer after Split uses GPT-2's pattern too "
                               "(use_regex true; Llama 3's sets it false)"));
  EXPECT_EQ(
      llama3_refusal(
          dir, [](auto& j) { j["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true; }),
      llama3_unsupported(dir, "its ByteLevel pre-tokenizer sets add_prefix_space"));
}

TEST(Llama3TokenizerErrors, PostProcessorsTandemDoesNotImplement) {
  ScratchDir dir;
  EXPECT_EQ(llama3_refusal(dir,
                           [](auto& j) {
                             j["post_processor"] = {{"type", "RobertaProcessing"}};
                           }),
            llama3_unsupported(dir,
                               "its post-processor is RobertaProcessing (tandem implements "
                               "ByteLevel and TemplateProcessing)"));
  // A template that puts a token after the text, or two before it.
  const nlohmann::json bos = {{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}};
  const nlohmann::json eos = {{"SpecialToken", {{"id", "<|end_of_text|>"}, {"type_id", 0}}}};
  const nlohmann::json a = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}};
  EXPECT_EQ(llama3_refusal(dir,
                           [&](auto& j) {
                             template_of(j)["single"] = {bos, a, eos};
                           }),
            llama3_unsupported(dir,
                               "its TemplateProcessing post-processor's single template is "
                               "'<|begin_of_text|> $A <|end_of_text|>' (tandem implements '$A' "
                               "and one special token then '$A')"));
  EXPECT_EQ(llama3_refusal(dir,
                           [&](auto& j) {
                             template_of(j)["single"] = {bos, bos, a};
                           }),
            llama3_unsupported(dir,
                               "its TemplateProcessing post-processor's single template is "
                               "'<|begin_of_text|> <|begin_of_text|> $A' (tandem implements '$A' "
                               "and one special token then '$A')"));
  EXPECT_EQ(llama3_refusal(
                dir, [](auto& j) { j["post_processor"]["processors"].push_back(template_of(j)); }),
            llama3_unsupported(dir, "its post-processor has two TemplateProcessing steps"));
}

TEST(Llama3TokenizerErrors, TemplatesAndAddedTokensThatDoNotHoldTogether) {
  ScratchDir dir;
  EXPECT_EQ(llama3_refusal(dir,
                           [](auto& j) {
                             template_of(j)["special_tokens"]["<|begin_of_text|>"]["ids"] = {1, 2};
                           }),
            llama3_malformed(dir,
                             "its TemplateProcessing post-processor gives no single id for "
                             "'<|begin_of_text|>'"));
  EXPECT_EQ(
      llama3_refusal(
          dir, [](auto& j) { template_of(j)["special_tokens"]["<|begin_of_text|>"]["ids"] = {7}; }),
      llama3_malformed(dir,
                       "its TemplateProcessing post-processor gives '<|begin_of_text|>' the "
                       "id 7, which is not that token's"));
  EXPECT_EQ(llama3_refusal(dir, [](auto& j) { j["added_tokens"][1]["lstrip"] = true; }),
            llama3_unsupported(dir, "its added token '<|end_of_text|>' sets lstrip"));
  EXPECT_EQ(
      llama3_refusal(dir, [](auto& j) { j["added_tokens"][2]["single_word"] = true; }),
      llama3_unsupported(dir, "its added token '<|reserved_special_token_0|>' sets single_word"));
  EXPECT_EQ(
      llama3_refusal(dir, [](auto& j) { j["added_tokens"].back()["content"] = ""; }),
      llama3_malformed(
          dir,
          "added token " +
              std::to_string(
                  llama3_testing::small_llama3_json()["added_tokens"].back()["id"].get<int>()) +
              " is empty"));
}

TEST(Llama3TokenizerErrors, TokenizeWritesNothing) {
  ScratchDir dir;
  train::testing::write_corpus(dir);
  nlohmann::json j = llama3_testing::small_llama3_json();
  split_of(j)["invert"] = true;
  TokenizeConfig c = train::testing::tiny_tokenize(dir, "out");
  c.tokenizer = train::testing::write_tokenizer(dir, j);
  EXPECT_EQ(user_error_of([&] { tokenize(c); }),
            llama3_unsupported(dir, "its Split pre-tokenizer sets invert"));
  EXPECT_FALSE(std::filesystem::exists(dir.path("out")));
}

}  // namespace llama3_tokenizer_error_test
}  // namespace tandem::data
