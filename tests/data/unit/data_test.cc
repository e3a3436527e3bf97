// Data: the synthetic corpus is fixed, grammatical and learnable; text files split as documented;
// the sampler draws the same batches from (seed, step) however a run is interrupted or split
// across data-parallel ranks.
#include "tandem/data/data.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "support/files.h"
#include "support/scratch.h"

namespace tandem::data {
namespace {

using testing::ScratchDir;

// H(next byte | the k bytes before it), in nats, by counting: H(context, next) - H(context).
double conditional_entropy(const std::vector<uint8_t>& t, int k) {
  std::vector<uint64_t> joint, context;
  for (size_t i = static_cast<size_t>(k); i < t.size(); ++i) {
    uint64_t c = 0;
    for (int j = k; j >= 1; --j) c = (c << 8) | t[i - static_cast<size_t>(j)];
    context.push_back(c);
    joint.push_back((c << 8) | t[i]);
  }
  auto entropy = [](std::vector<uint64_t>& v) {
    std::sort(v.begin(), v.end());
    double h = 0;
    const double n = static_cast<double>(v.size());
    for (size_t i = 0; i < v.size();) {
      size_t j = i;
      while (j < v.size() && v[j] == v[i]) ++j;
      const double p = static_cast<double>(j - i) / n;
      h -= p * std::log(p);
      i = j;
    }
    return h;
  };
  return entropy(joint) - entropy(context);
}

TEST(Synthetic, IsTheSameTextEverywhere) {
  const std::string text = synthetic_text();
  EXPECT_EQ(text.size(), kSyntheticBytes);
  EXPECT_EQ(text.substr(0, 60), "The quick fox that sees the teachers helps two clever dogs. ");
  // Pinned: a change here changes every default run's data, and invalidates resumed runs.
  EXPECT_EQ(synthetic_corpus().fingerprint_hex(), "5630ea818190590a");
  EXPECT_EQ(synthetic_text(1000, 7), synthetic_text(1000, 7));
  EXPECT_NE(synthetic_text(1000, 7), synthetic_text(1000, 8));
  EXPECT_EQ(synthetic_text(100), text.substr(0, 100));  // a prefix of the longer text
}

TEST(Synthetic, IsGrammatical) {
  const std::string text = synthetic_text(1 << 18);
  for (char c : text) EXPECT_TRUE((c >= ' ' && c <= '~') || c == '\n') << static_cast<int>(c);
  // Subjects agree with their verbs (also across a relative clause: "A bird that sees many cats
  // sees a child", the long-range agreement attention has to learn); "an" only before a vowel.
  for (const char* bad :
       {"The cats sees", "Many foxes chases", "Two children knows", "The cat see ", "A dog like ",
        "Does the cats", "Do the cat ", "Does a cat sees", "an cat", "a old", "a owl", "An cat"})
    EXPECT_EQ(text.find(bad), std::string::npos) << bad;
  for (const char* good : {"plus", " is ", "children", "an old", "The cats see ", "A dog likes ",
                           "Does the cat ", "Do the cats ", "?", ".\n"})
    EXPECT_NE(text.find(good), std::string::npos) << good;
}

TEST(Synthetic, IsLearnable) {
  // A model that knows the last three bytes could reach the conditional entropy; the unigram
  // entropy is where a model that learnt nothing stays. The gap is what a small GPT learns fast.
  const Corpus c = synthetic_corpus(1 << 18);
  const double h1 = unigram_entropy(c.train.bytes());
  const double h3 = conditional_entropy(c.train.bytes(), 3);
  EXPECT_GT(h1, 2.8);
  EXPECT_LT(h1, 3.3);
  EXPECT_LT(h3, 0.3 * h1) << "H1 " << h1 << " H|3 " << h3;
}

TEST(Corpus, SplitsTheLastTenPercentForValidation) {
  ScratchDir dir;
  std::string bytes(1000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>('a' + i % 26);
  testing::write_bytes(dir.path("t.txt"), bytes);
  const Corpus c = load_text_corpus(dir.path("t.txt"));
  EXPECT_EQ(c.source, dir.path("t.txt"));
  EXPECT_EQ(c.vocab_size, 256);
  ASSERT_EQ(c.train.size(), 900u);
  ASSERT_EQ(c.validation.size(), 100u);
  const std::vector<uint8_t> train = c.train.bytes(), validation = c.validation.bytes();
  EXPECT_EQ(std::string(train.begin(), train.end()), bytes.substr(0, 900));
  EXPECT_EQ(std::string(validation.begin(), validation.end()), bytes.substr(900));
  EXPECT_EQ(c.train.name, "training split (the first 90%)");
  EXPECT_EQ(c.validation.name, "validation split (the last 10%)");
  EXPECT_EQ(c.train.source, "data file '" + dir.path("t.txt") + "'");
  EXPECT_EQ(c.fingerprint, make_corpus(bytes, "other").fingerprint);
  EXPECT_NE(c.fingerprint, make_corpus(bytes.substr(1), "other").fingerprint);
  EXPECT_EQ(make_corpus("abc", "x", 0.0).validation.size(), 0u);
  EXPECT_EQ(make_corpus(std::string(10, 'x'), "x", 0.25).train.size(), 8u);
}

TEST(Entropy, UniformAndConstant) {
  std::vector<uint8_t> all(256 * 4);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint8_t>(i);
  EXPECT_NEAR(unigram_entropy(all), std::log(256.0), 1e-12);
  EXPECT_EQ(unigram_entropy(std::vector<uint8_t>(50, 'x')), 0.0);
}

TEST(BatchSampler, WindowsAreCorpusSlicesWithShiftedTargets) {
  const Corpus c = synthetic_corpus(1 << 16);
  const BatchSampler s(c.train, 8, 32, 1234);
  const Batch b = s.global(5);
  ASSERT_EQ(b.rows, 8);
  ASSERT_EQ(b.seq_len, 32);
  ASSERT_EQ(b.inputs.size(), 8u * 32);
  const std::vector<uint8_t> tokens = c.train.bytes();
  for (int64_t r = 0; r < 8; ++r) {
    const int64_t off = s.row_offset(5, r);
    ASSERT_GE(off, 0);
    ASSERT_LE(off + 32, static_cast<int64_t>(tokens.size()) - 1);
    for (int64_t t = 0; t < 32; ++t) {
      EXPECT_EQ(b.inputs[static_cast<size_t>(r * 32 + t)], tokens[static_cast<size_t>(off + t)]);
      EXPECT_EQ(b.targets[static_cast<size_t>(r * 32 + t)],
                tokens[static_cast<size_t>(off + t + 1)]);
    }
  }
}

bool same_batch(const Batch& a, const Batch& b) {
  return a.rows == b.rows && a.seq_len == b.seq_len && a.inputs == b.inputs &&
         a.targets == b.targets;
}

TEST(BatchSampler, ResumingAtStepKDrawsWhatAnUninterruptedRunWould) {
  const Corpus c = synthetic_corpus(1 << 16);
  const BatchSampler run(c.train, 4, 16, 99);
  std::vector<Batch> uninterrupted;
  for (int64_t step = 0; step < 20; ++step) uninterrupted.push_back(run.global(step));
  // A new process at step 12: a fresh sampler, no replay of steps 0..11.
  const BatchSampler resumed(synthetic_corpus(1 << 16).train, 4, 16, 99);
  for (int64_t step = 12; step < 20; ++step)
    EXPECT_TRUE(same_batch(resumed.global(step), uninterrupted[static_cast<size_t>(step)])) << step;
  EXPECT_FALSE(same_batch(run.global(0), run.global(1)));
  EXPECT_FALSE(same_batch(run.global(3), BatchSampler(c.train, 4, 16, 100).global(3)));
}

TEST(BatchSampler, RankSharesTileTheGlobalBatch) {
  const Corpus c = synthetic_corpus(1 << 16);
  const BatchSampler s(c.train, 8, 16, 7);
  for (int dp : {1, 2, 4, 8}) {
    const Batch global = s.global(3);
    Batch joined;
    for (int r = 0; r < dp; ++r) {
      const Batch part = s.rank_share(3, r, dp);
      EXPECT_EQ(part.rows, 8 / dp);
      joined.inputs.insert(joined.inputs.end(), part.inputs.begin(), part.inputs.end());
      joined.targets.insert(joined.targets.end(), part.targets.begin(), part.targets.end());
    }
    EXPECT_EQ(joined.inputs, global.inputs) << dp;
    EXPECT_EQ(joined.targets, global.targets) << dp;
  }
  // Rank 1 of 2 holds rows 4..7, exactly.
  EXPECT_TRUE(same_batch(s.rank_share(3, 1, 2), s.rows(3, 4, 8)));
  // A row does not depend on the batch size: growing the batch keeps the first rows.
  const Batch small = BatchSampler(c.train, 2, 16, 7).global(3);
  EXPECT_TRUE(same_batch(small, s.rows(3, 0, 2)));
}

TEST(BatchSampler, DrawsEveryStartPosition) {
  const Corpus c = make_corpus("abcdefghijklmnopqrst", "x", 0.0);  // 20 bytes: 16 windows of 4
  const BatchSampler s(c.train, 10, 4, 5);
  std::set<int64_t> seen;
  for (int64_t step = 0; step < 200; ++step)
    for (int64_t r = 0; r < 10; ++r) {
      const int64_t off = s.row_offset(step, r);
      ASSERT_LT(off, 16);
      seen.insert(off);
    }
  EXPECT_EQ(seen.size(), 16u);
  // The longest possible window: seq_len + 1 == the split.
  const BatchSampler whole(c.train, 1, 19, 5);
  EXPECT_EQ(whole.row_offset(0, 0), 0);
  EXPECT_EQ(whole.global(0).targets.back(), 't');
}

TEST(Windows, CoverTheSplitInOrder) {
  const Corpus c = make_corpus("0123456789", "x", 0.0);
  EXPECT_EQ(window_count(c.train, 3), 3);  // 012|3, 345|6, 678|9
  const Batch b = window_batch(c.train, 3, 1, 2);
  EXPECT_EQ(b.inputs, (std::vector<int32_t>{'3', '4', '5', '6', '7', '8'}));
  EXPECT_EQ(b.targets, (std::vector<int32_t>{'4', '5', '6', '7', '8', '9'}));
  EXPECT_EQ(window_count(c.train, 9), 1);
  EXPECT_EQ(window_count(c.train, 10), 0);
}

}  // namespace
}  // namespace tandem::data
