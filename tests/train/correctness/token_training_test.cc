// Training on token shards end to end: a tiny model trains a few steps on a tokenized corpus, the
// same for one and two data-parallel ranks, and its checkpoint names the tokenizer that sample
// and eval decode with.
#include <gtest/gtest.h>

#include <cmath>

#include "tandem/data/token_corpus.h"
#include "tandem/train/evaluate.h"
#include "train/test_util.h"
#include "train/token_test_util.h"

namespace tandem::train {
namespace {

using testing::ScratchDir;

TEST(TokenTraining, TrainsOnShardsAndRecordsTheTokenizer) {
  ScratchDir dir;
  testing::write_corpus(dir);
  data::tokenize(testing::tiny_tokenize(dir, "shards"));
  TrainConfig c = testing::tiny_run(4);
  c.data = dir.path("shards");
  c.model.vocab_size = data::data_vocab_size(c.data);
  c.keep_weights = true;
  c.eval_every = 2;
  c.save_dir = dir.path("ck");
  const TrainResult one = train(c);
  ASSERT_EQ(one.losses.size(), 4u);
  for (double l : one.losses) EXPECT_TRUE(std::isfinite(l));
  EXPECT_NEAR(one.losses[0], std::log(320.0), 0.5);  // a fresh model guesses among 320 tokens

  // Two data-parallel ranks draw the same global batches: the same losses.
  TrainConfig c2 = c;
  c2.grid = {2, 1, 1};
  c2.save_dir.clear();
  const TrainResult two = train(c2);
  ASSERT_EQ(two.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(two.losses[i], one.losses[i], 1e-4) << i;

  const LoadedModel m = load_model(dir.path("ck"));
  EXPECT_EQ(m.config.vocab_size, 320);
  const auto tok = model_tokenizer(m, "", dir.path("ck"));
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_size(), 320);
  const data::Corpus corpus = data::load_shard_corpus(dir.path("shards"));
  const auto [loss, scored] = evaluate_windows(m.params, corpus.validation, 16, 4, 8);
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_EQ(scored, 8 * 16);
}

TEST(TokenTraining, TheModelsVocabularyIsTheDatas) {
  ScratchDir dir;
  testing::write_corpus(dir);
  data::tokenize(testing::tiny_tokenize(dir, "shards"));
  TrainConfig c = testing::tiny_run(1);
  c.data = dir.path("shards");
  EXPECT_EQ(testing::user_error_of([&] { c.validate(); }),
            "the model's vocabulary is 256; the data (" + dir.path("shards") + ") has 320 tokens");
}

}  // namespace
}  // namespace tandem::train
