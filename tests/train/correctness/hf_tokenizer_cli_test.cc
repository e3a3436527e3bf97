// A Hugging Face tokenizer.json (GPT-2's, Llama 3's) through the tandem command: tokenize encodes a
// folder of text with it, train reads the shards, and sample and eval use the tokenizer the shards
// recorded.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "support/cli.h"
#include "train/hf_tokenizer_test_util.h"
#include "train/token_test_util.h"

namespace tandem::train {
namespace {

using ::testing::HasSubstr;

TEST(HfTokenizerCli, TokenizeTrainSampleAndEval) {
  testing::ScratchDir dir;
  testing::write_corpus(dir);
  const std::string json = testing::write_tokenizer(dir, testing::test_tokenizer_json());
  tandem::testing::CommandResult r = tandem::testing::run_tandem(
      fmt::format("tokenize '{}' --out '{}' --tokenizer '{}' --threads 2 --quiet",
                  dir.path("corpus"), dir.path("shards"), json));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("(vocabulary 275, uint16)"));

  r = tandem::testing::run_tandem(fmt::format(
      "train --layers 2 --d-model 16 --heads 2 --seq-len 16 --batch 4 --dp 1 --tp 1 --steps 2 "
      "--eval-every 0 --executor plan --data '{}' --save '{}' --quiet",
      dir.path("shards"), dir.path("ck")));
  ASSERT_EQ(r.status, 0) << r.output;

  r = tandem::testing::run_tandem(fmt::format(
      "sample --checkpoint '{}' --prompt 'the cat' --tokens 8 --seed 1", dir.path("ck")));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output.rfind("the cat", 0), 0u) << r.output;
  EXPECT_GT(r.output.size(), 7u) << r.output;

  // eval scores the validation shards, and a text file encoded with the recorded tokenizer.
  r = tandem::testing::run_tandem(
      fmt::format("eval --checkpoint '{}' --data '{}'", dir.path("ck"), dir.path("shards")));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr(" bits/byte) over ")) << r.output;
  r = tandem::testing::run_tandem(
      fmt::format("eval --checkpoint '{}' --data '{}'", dir.path("ck"), dir.path("corpus/a.txt")));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr(" bits/byte) over ")) << r.output;
}

TEST(HfTokenizerCli, Llama3TokenizeTrainSampleAndEval) {
  // The small Llama 3 tokenizer of tests/data/llama3/: each document starts with its bos.
  testing::ScratchDir dir;
  testing::write_corpus(dir);
  const std::string json = std::string(TANDEM_SOURCE_DIR) + "/tests/data/llama3/tokenizer.json";
  tandem::testing::CommandResult r = tandem::testing::run_tandem(
      fmt::format("tokenize '{}' --out '{}' --tokenizer '{}' --threads 2 --quiet",
                  dir.path("corpus"), dir.path("shards"), json));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("(vocabulary 3018, uint16)"));
  EXPECT_THAT(tandem::testing::read_bytes(dir.path("shards/shards.json")),
              HasSubstr("\"bos_id\": 3005"));

  r = tandem::testing::run_tandem(fmt::format(
      "train --layers 2 --d-model 16 --heads 2 --seq-len 16 --batch 4 --dp 1 --tp 1 --steps 2 "
      "--eval-every 0 --executor plan --data '{}' --save '{}' --quiet",
      dir.path("shards"), dir.path("ck")));
  ASSERT_EQ(r.status, 0) << r.output;
  r = tandem::testing::run_tandem(fmt::format(
      "sample --checkpoint '{}' --prompt \"DON'T stop\" --tokens 8 --seed 1", dir.path("ck")));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output.rfind("DON'T stop", 0), 0u) << r.output;
  r = tandem::testing::run_tandem(
      fmt::format("eval --checkpoint '{}' --data '{}'", dir.path("ck"), dir.path("corpus/a.txt")));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr(" bits/byte) over ")) << r.output;
}

}  // namespace
}  // namespace tandem::train
