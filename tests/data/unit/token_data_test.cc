// Token data: a corpus tokenized with a trained BPE tokenizer decodes back to its text, the shards
// are the same for any thread count, the sampler draws from mapped shards exactly what it draws
// from the same tokens in memory, for any data-parallel split, and the shards' pages it read leave
// the process's mappings once a batch is drawn, while bytes in memory stay.
#include <gtest/gtest.h>
#include <sentencepiece_processor.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "tandem/data/token_corpus.h"
#include "tandem/data/tokenizer.h"
#include "tandem/io/token_shards.h"
#include "train/token_test_util.h"

namespace tandem::data {
namespace {

using testing::ScratchDir;

// Every token of a split, read from the shard files' bytes (not through the mapped corpus).
std::vector<int32_t> shard_file_tokens(const std::string& dir, const std::string& prefix) {
  std::vector<int32_t> out;
  for (int i = 0;; ++i) {
    const std::string path = fmt::format("{}/{}-{:06}.bin", dir, prefix, i);
    if (!std::filesystem::exists(path)) break;
    const std::string bytes = testing::read_bytes(path);
    for (size_t at = io::kShardHeaderBytes; at + 2 <= bytes.size(); at += 2) {
      uint16_t v;
      std::memcpy(&v, bytes.data() + at, 2);
      out.push_back(v);
    }
  }
  return out;
}

TEST(Tokenize, ShardsDecodeToTheText) {
  ScratchDir dir;
  const std::string text = train::testing::write_corpus(dir);
  const TokenizeSummary s = tokenize(train::testing::tiny_tokenize(dir, "shards"));
  EXPECT_EQ(s.files, 3u);
  EXPECT_EQ(s.text_bytes, text.size());
  EXPECT_EQ(s.vocab_size, 320);
  EXPECT_GT(s.train_shards, 1);
  EXPECT_GT(s.validation_tokens, 0u);
  const Tokenizer tok = Tokenizer::load(dir.path("shards/tokenizer.model"));
  std::vector<int32_t> all = shard_file_tokens(dir.path("shards"), "train");
  const std::vector<int32_t> val = shard_file_tokens(dir.path("shards"), "val");
  EXPECT_EQ(all.size(), s.train_tokens);
  EXPECT_EQ(val.size(), s.validation_tokens);
  all.insert(all.end(), val.begin(), val.end());
  // An end-of-text token closes each file; it decodes to nothing.
  EXPECT_EQ(std::count(all.begin(), all.end(), tok.eos_id()), 3);
  EXPECT_EQ(tok.decode(all), text);
  // Subwords: fewer tokens than bytes.
  EXPECT_LT(static_cast<double>(all.size()), 0.9 * static_cast<double>(text.size()));
  // The validation text's bytes are recorded for bits per byte, the split at a line start.
  const Corpus c = load_shard_corpus(dir.path("shards"));
  const std::string val_text = tok.decode(val);
  EXPECT_EQ(c.validation_text_bytes, val_text.size());
  EXPECT_EQ(text.substr(text.size() - val_text.size()), val_text);
  EXPECT_EQ(text[text.size() - val_text.size() - 1], '\n');
  EXPECT_NEAR(static_cast<double>(val_text.size()) / static_cast<double>(text.size()), 0.1, 0.02);
}

// A model tandem trained encodes a line at a time, to exactly the ids SentencePiece gives the
// whole text at once (its merges never cross a newline).
TEST(Tokenize, LineByLineEncodingGivesTheWholeTextsIds) {
  ScratchDir dir;
  const std::string corpus = train::testing::write_corpus(dir);
  tokenize(train::testing::tiny_tokenize(dir, "shards"));
  const Tokenizer tok = Tokenizer::load(dir.path("shards/tokenizer.model"));
  EXPECT_TRUE(tok.encodes_by_line());
  sentencepiece::SentencePieceProcessor whole;
  ASSERT_TRUE(whole.LoadFromSerializedProto(tok.model_bytes()).ok());
  for (const std::string& text :
       {corpus, std::string("\n\n  two  spaces \n\tand a tab\r\nCRLF\n"), std::string("no newline"),
        std::string("caf\xc3\xa9 \xe2\x82\xac 12345\n\n\n"), std::string(3000, 'a') + "\n b"}) {
    std::vector<int> want;
    ASSERT_TRUE(whole.Encode(text, &want).ok());
    const std::vector<int32_t> got = tok.encode(text);
    EXPECT_EQ(got, std::vector<int32_t>(want.begin(), want.end())) << text.substr(0, 40);
    EXPECT_EQ(tok.decode(got), text);
  }
}

TEST(Tokenize, SameShardsForAnyThreadCount) {
  ScratchDir dir;
  train::testing::write_corpus(dir);
  TokenizeConfig one = train::testing::tiny_tokenize(dir, "one", 2000, 1);
  tokenize(one);
  TokenizeConfig three = train::testing::tiny_tokenize(dir, "three", 2000, 3);
  three.tokenizer = dir.path("one/tokenizer.model");  // SentencePiece's training is its own
  tokenize(three);
  // Every file but shards.json (which names where the tokenizer came from) is the same.
  int compared = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path("one"))) {
    const std::string f = e.path().filename().string();
    if (f == "shards.json") continue;
    EXPECT_EQ(testing::read_bytes(dir.path("one/" + f)),
              testing::read_bytes(dir.path("three/" + f)))
        << f;
    ++compared;
  }
  EXPECT_GT(compared, 4);
  EXPECT_EQ(load_shard_corpus(dir.path("one")).train.size(),
            load_shard_corpus(dir.path("three")).train.size());
}

TEST(TokenCorpus, MappedBatchesEqualTheInMemoryReference) {
  ScratchDir dir;
  train::testing::write_corpus(dir);
  tokenize(train::testing::tiny_tokenize(dir, "shards", 500));  // short shards: windows cross them
  const Corpus c = load_shard_corpus(dir.path("shards"));
  EXPECT_EQ(c.vocab_size, 320);
  EXPECT_EQ(c.train.unit, "tokens");
  EXPECT_GT(c.train.spans.size(), 5u);
  const std::vector<int32_t> ref = shard_file_tokens(dir.path("shards"), "train");
  ASSERT_EQ(c.train.size(), ref.size());
  const BatchSampler s(c.train, 8, 64, 42);
  for (int64_t step : {0, 1, 17}) {
    const Batch b = s.global(step);
    for (int64_t r = 0; r < 8; ++r) {
      const size_t off = static_cast<size_t>(s.row_offset(step, r));
      for (int64_t t = 0; t < 64; ++t) {
        ASSERT_EQ(b.inputs[static_cast<size_t>(r * 64 + t)], ref[off + static_cast<size_t>(t)]);
        ASSERT_EQ(b.targets[static_cast<size_t>(r * 64 + t)],
                  ref[off + static_cast<size_t>(t) + 1]);
      }
    }
    // dp 1 and dp 2 draw the same global batch.
    const Batch r0 = s.rank_share(step, 0, 2), r1 = s.rank_share(step, 1, 2);
    std::vector<int32_t> joined = r0.inputs;
    joined.insert(joined.end(), r1.inputs.begin(), r1.inputs.end());
    EXPECT_EQ(joined, b.inputs);
  }
  // A fresh open (a resumed run) draws the same batches.
  const Corpus again = load_shard_corpus(dir.path("shards"));
  EXPECT_EQ(BatchSampler(again.train, 8, 64, 42).global(17).inputs, s.global(17).inputs);
  EXPECT_EQ(again.fingerprint_hex(), c.fingerprint_hex());
  // Evaluation windows read the same tokens.
  const Batch w = window_batch(c.validation, 16, 2, 1);
  const std::vector<int32_t> val = shard_file_tokens(dir.path("shards"), "val");
  EXPECT_EQ(w.inputs, std::vector<int32_t>(val.begin() + 32, val.begin() + 48));
}

// The kB of the mapping starting at `start` that are mapped into this process: its Rss in
// /proc/self/smaps (mincore would say which pages the page cache holds, mapped or not).
uint64_t mapped_kb(const void* start) {
  std::ifstream smaps("/proc/self/smaps");
  const std::string want = fmt::format("{:x}-", reinterpret_cast<uintptr_t>(start));
  bool in = false;
  for (std::string line; std::getline(smaps, line);) {
    if (line.find('-') != std::string::npos && line.find(' ') > line.find('-') &&
        line.find(':') > line.find(' '))
      in = line.rfind(want, 0) == 0;  // a mapping's first line: "start-end perms offset ..."
    else if (in && line.rfind("Rss:", 0) == 0)
      return std::stoull(line.substr(4));
  }
  ADD_FAILURE() << "no mapping starts at " << want;
  return 0;
}

uint64_t mapped_kb(const TokenSplit& split) {
  uint64_t kb = 0;
  for (const TokenSpan& span : split.spans) kb += mapped_kb(span.mapping);
  return kb;
}

TEST(TokenCorpus, DrawnBatchesLeaveNoShardPagesMappedAndReadTheSameAgain) {
  ScratchDir dir;
  train::testing::write_corpus(dir);
  tokenize(train::testing::tiny_tokenize(dir, "shards", 500));
  const Corpus c = load_shard_corpus(dir.path("shards"));
  const std::vector<int32_t> ref = shard_file_tokens(dir.path("shards"), "train");
  for (const TokenSpan& span : c.train.spans) ASSERT_NE(span.mapping, nullptr) << span.name;
  EXPECT_EQ(mapped_kb(c.train) + mapped_kb(c.validation), 0u) << "opening reads the headers";
  // Reading maps the shards' pages; releasing them keeps every token.
  std::vector<int32_t> all(c.train.size());
  c.train.read(0, all.size(), all.data());
  ASSERT_EQ(all, ref);
  EXPECT_GT(mapped_kb(c.train), 0u) << "reading maps the pages: the check can see them";
  c.train.release(0, all.size());
  EXPECT_EQ(mapped_kb(c.train), 0u);
  // A drawn batch (windows across shards) releases what it read, and draws the same again.
  const BatchSampler s(c.train, 8, 64, 42);
  const Batch b = s.global(3);
  EXPECT_EQ(mapped_kb(c.train), 0u);
  EXPECT_EQ(s.global(3).inputs, b.inputs);
  std::fill(all.begin(), all.end(), -1);
  c.train.read(0, all.size(), all.data());
  EXPECT_EQ(all, ref) << "the released pages read the same tokens again";
  for (int64_t r = 0; r < 8; ++r) {
    const auto off = static_cast<std::ptrdiff_t>(s.row_offset(3, r));
    EXPECT_EQ(std::vector<int32_t>(b.targets.begin() + r * 64, b.targets.begin() + (r + 1) * 64),
              std::vector<int32_t>(ref.begin() + off + 1, ref.begin() + off + 65))
        << "row " << r;
  }
  // So does an evaluation batch.
  window_batch(c.validation, 16, 0, 4);
  EXPECT_EQ(mapped_kb(c.validation), 0u);
}

TEST(TokenCorpus, ReleasingBytesInMemoryKeepsThem) {
  const Corpus c = synthetic_corpus(4096);
  ASSERT_EQ(c.train.spans.size(), 1u);
  EXPECT_EQ(c.train.spans[0].mapping, nullptr) << "bytes are the process's own memory";
  const std::vector<uint8_t> before = c.train.bytes();
  BatchSampler(c.train, 4, 32, 7).global(0);
  c.train.release(0, c.train.size());
  EXPECT_EQ(c.train.bytes(), before);
}

TEST(TokenCorpus, VocabularyComesFromTheFolder) {
  ScratchDir dir;
  train::testing::write_corpus(dir);
  tokenize(train::testing::tiny_tokenize(dir, "shards"));
  EXPECT_TRUE(is_shard_folder(dir.path("shards")));
  EXPECT_EQ(data_vocab_size(dir.path("shards")), 320);
  EXPECT_EQ(data_vocab_size(dir.path("corpus/a.txt")), kByteVocab);
  EXPECT_EQ(data_vocab_size(""), kByteVocab);
}

}  // namespace
}  // namespace tandem::data
