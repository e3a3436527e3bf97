// tokenizer.json files of Llama 2's kind (a BPE that sets byte_fallback) that tandem cannot use,
// and the one message each gets: a pre-tokenizer, normalizers and decoders other than Llama 2's,
// their options, ignore_merges, a vocabulary without all 256 byte pieces, and line ends that a
// token holds or a merge joins (text is encoded in pieces cut at line ends).
#include <gtest/gtest.h>

#include <functional>

#include "data/llama2_test_util.h"
#include "tandem/data/tokenizer.h"
#include "train/hf_tokenizer_test_util.h"
#include "train/token_test_util.h"

namespace tandem::data {
namespace llama2_tokenizer_error_test {

using testing::ScratchDir;
using testing::user_error_of;

// The message Tokenizer::load gives for the small Llama 2-kind tokenizer changed by `change`.
std::string llama2_refusal(const ScratchDir& dir,
                           const std::function<void(nlohmann::json&)>& change) {
  nlohmann::json j = llama2_testing::small_llama2_json();
  change(j);
  const std::string path = train::testing::write_tokenizer(dir, j);
  return user_error_of([&] { Tokenizer::load(path); });
}

std::string llama2_unsupported(const ScratchDir& dir, const std::string& what) {
  return "tokenizer '" + dir.path("tokenizer.json") + "' is not supported: " + what +
         "; tandem reads Hugging Face tokenizer.json files of GPT-2's or Llama 3's byte-level BPE "
         "and of Llama 2's SentencePiece BPE";
}

TEST(Llama2TokenizerErrors, TheSmallFileLoads) {
  ScratchDir dir;
  const Tokenizer tok =
      Tokenizer::load(train::testing::write_tokenizer(dir, llama2_testing::small_llama2_json()));
  // "▁the▁tin": ▁ t, h e, ▁t he, i n.
  const std::vector<int32_t> ids = tok.encode("the tin");
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(tok.decode({ids[0]}), "the");
  EXPECT_EQ(tok.decode(ids), "the tin");
}

TEST(Llama2TokenizerErrors, PreTokenizersAndNormalizersOtherThanLlama2s) {
  ScratchDir dir;
  EXPECT_EQ(llama2_refusal(dir,
                           [](auto& j) {
                             j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "▁"}};
                           }),
            llama2_unsupported(dir,
                               "its BPE model sets byte_fallback, as Llama 2's does, but it has a "
                               "pre-tokenizer, Metaspace (Llama 2's has none)"));
  EXPECT_EQ(llama2_refusal(dir, [](auto& j) { j["normalizer"] = nullptr; }),
            llama2_unsupported(dir,
                               "its normalizer is missing (tandem implements Llama 2's: a "
                               "Sequence of Prepend and Replace)"));
  EXPECT_EQ(llama2_refusal(dir,
                           [](auto& j) {
                             j["normalizer"] = {{"type", "NFKC"}};
                           }),
            llama2_unsupported(dir,
                               "its normalizer is NFKC (tandem implements Llama 2's: a Sequence of "
                               "Prepend and Replace)"));
  EXPECT_EQ(llama2_refusal(dir,
                           [](auto& j) {
                             j["normalizer"]["normalizers"].push_back({{"type", "NFC"}});
                           }),
            llama2_unsupported(dir,
                               "its normalizer is a Sequence of Prepend, Replace, NFC (tandem "
                               "implements Llama 2's: a Sequence of Prepend and Replace)"));
  EXPECT_EQ(
      llama2_refusal(dir, [](auto& j) { j["normalizer"]["normalizers"][0]["prepend"] = "_"; }),
      llama2_unsupported(dir, "its Prepend normalizer prepends \"_\" (Llama 2's prepends \"▁\")"));
  EXPECT_EQ(
      llama2_refusal(dir, [](auto& j) { j["normalizer"]["normalizers"][1]["content"] = "_"; }),
      llama2_unsupported(dir,
                         "its Replace normalizer replaces {\"String\": \" \"} with \"_\" (Llama "
                         "2's replaces \" \" with \"▁\")"));
  EXPECT_EQ(llama2_refusal(dir,
                           [](auto& j) {
                             j["normalizer"]["normalizers"][1]["pattern"] = {{"Regex", "\\s"}};
                           }),
            llama2_unsupported(dir,
                               "its Replace normalizer replaces {\"Regex\": \"\\\\s\"} with \"▁\" "
                               "(Llama 2's replaces \" \" with \"▁\")"));
}

TEST(Llama2TokenizerErrors, DecodersOtherThanLlama2s) {
  ScratchDir dir;
  EXPECT_EQ(llama2_refusal(dir, [](auto& j) { j["decoder"] = nullptr; }),
            llama2_unsupported(dir,
                               "its decoder is missing (tandem implements Llama 2's: a Sequence "
                               "of Replace, ByteFallback, Fuse, Strip)"));
  EXPECT_EQ(llama2_refusal(dir,
                           [](auto& j) {
                             j["decoder"] = {{"type", "Metaspace"}};
                           }),
            llama2_unsupported(dir,
                               "its decoder is Metaspace (tandem implements Llama 2's: a Sequence "
                               "of Replace, ByteFallback, Fuse, Strip)"));
  EXPECT_EQ(llama2_refusal(dir, [](auto& j) { j["decoder"]["decoders"].erase(3); }),
            llama2_unsupported(dir,
                               "its decoder is a Sequence of Replace, ByteFallback, Fuse (tandem "
                               "implements Llama 2's: a Sequence of Replace, ByteFallback, Fuse, "
                               "Strip)"));
  EXPECT_EQ(llama2_refusal(dir, [](auto& j) { j["decoder"]["decoders"][0]["content"] = "_"; }),
            llama2_unsupported(dir,
                               "its Replace decoder replaces {\"String\": \"▁\"} with \"_\" (Llama "
                               "2's replaces \"▁\" with \" \")"));
  EXPECT_EQ(llama2_refusal(dir, [](auto& j) { j["decoder"]["decoders"][3]["start"] = 2; }),
            llama2_unsupported(dir,
                               "its Strip decoder strips \" \" 2 at the start and 0 at the end "
                               "(Llama 2's strips one \" \" at the start)"));
  EXPECT_EQ(llama2_refusal(dir, [](auto& j) { j["decoder"]["decoders"][3]["stop"] = 1; }),
            llama2_unsupported(dir,
                               "its Strip decoder strips \" \" 1 at the start and 1 at the end "
                               "(Llama 2's strips one \" \" at the start)"));
}

TEST(Llama2TokenizerErrors, OptionsAndVocabulariesTandemDoesNotImplement) {
  ScratchDir dir;
  EXPECT_EQ(llama2_refusal(dir, [](auto& j) { j["model"]["ignore_merges"] = true; }),
            llama2_unsupported(dir, "its BPE model sets ignore_merges"));
  // Byte fallback needs a piece for every byte (id 68 is some other token).
  EXPECT_EQ(llama2_refusal(dir,
                           [](auto& j) {
                             j["model"]["vocab"].erase("<0x41>");
                             j["model"]["vocab"]["not A"] = 68;
                           }),
            llama2_unsupported(dir,
                               "its vocabulary has no piece <0x41> for byte 0x41 (byte fallback "
                               "needs all 256)"));
}

TEST(Llama2TokenizerErrors, LineEndsInTokensOrMerges) {
  ScratchDir dir;
  EXPECT_EQ(llama2_refusal(dir,
                           [](auto& j) {
                             const size_t id = j["model"]["vocab"].size();
                             j["model"]["vocab"]["a\nb"] = id;
                           }),
            llama2_unsupported(dir,
                               "its token \"a\\nb\" holds a line end (tandem encodes text in "
                               "pieces cut at line ends)"));
  EXPECT_EQ(llama2_refusal(dir,
                           [](auto& j) {
                             const size_t id = j["model"]["vocab"].size();
                             j["model"]["vocab"]["<0x0A>t"] = id;
                             j["model"]["merges"].push_back("<0x0A> t");
                           }),
            llama2_unsupported(dir,
                               "its merge 4 ('<0x0A> t') joins the line end's byte piece (tandem "
                               "encodes text in pieces cut at line ends)"));
}

}  // namespace llama2_tokenizer_error_test
}  // namespace tandem::data
