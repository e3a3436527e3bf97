// Data a run cannot train on, and the messages that say why: missing, empty or too-short files,
// batches that do not split over the data-parallel ranks, bad sizes.
#include <gtest/gtest.h>

#include "support/files.h"
#include "support/scratch.h"
#include "tandem/data/data.h"

namespace tandem::data {
namespace {

using testing::ScratchDir;
using testing::user_error_of;

TEST(DataErrors, MissingEmptyOrFolder) {
  ScratchDir dir;
  EXPECT_EQ(user_error_of([&] { load_text_corpus(dir.path("none.txt")); }),
            "data file '" + dir.path("none.txt") + "' does not exist");
  testing::write_bytes(dir.path("empty.txt"), "");
  EXPECT_EQ(user_error_of([&] { load_text_corpus(dir.path("empty.txt")); }),
            "data file '" + dir.path("empty.txt") + "' is empty");
  EXPECT_EQ(user_error_of([&] { load_text_corpus(dir.path()); }),
            "data file '" + dir.path() + "' is a folder, not a file");
}

TEST(DataErrors, ShorterThanOneSequence) {
  ScratchDir dir;
  testing::write_bytes(dir.path("tiny.txt"), std::string(100, 'x'));
  const Corpus c = load_text_corpus(dir.path("tiny.txt"));
  EXPECT_EQ(user_error_of([&] { BatchSampler(c.train, 8, 128, 1); }),
            "data file '" + dir.path("tiny.txt") +
                "' is too short for sequence length 128: its training split (the first 90%) has "
                "90 bytes, and one sequence needs 129");
  EXPECT_EQ(user_error_of([&] { BatchSampler(c.validation, 8, 10, 1); }),
            "data file '" + dir.path("tiny.txt") +
                "' is too short for sequence length 10: its validation split (the last 10%) has "
                "10 bytes, and one sequence needs 11");
  EXPECT_NO_THROW(BatchSampler(c.validation, 8, 9, 1));
  EXPECT_EQ(user_error_of([&] { window_batch(synthetic_corpus(64).validation, 8, 0, 1); }),
            "the synthetic corpus is too short for sequence length 8: its validation split (the "
            "last 10%) has 6 bytes, and one sequence needs 9");
}

TEST(DataErrors, BadSizes) {
  const Corpus c = synthetic_corpus(4096);
  EXPECT_EQ(user_error_of([&] { BatchSampler(c.train, 0, 16, 1); }),
            "batch size must be at least 1 (got 0)");
  EXPECT_EQ(user_error_of([&] { BatchSampler(c.train, 4, -2, 1); }),
            "sequence length must be at least 1 (got -2)");
  EXPECT_EQ(user_error_of([&] { make_corpus("abc", "x", 1.0); }),
            "validation fraction 1 is outside [0, 1)");
  EXPECT_EQ(user_error_of([&] { make_corpus("abc", "x", -0.5); }),
            "validation fraction -0.5 is outside [0, 1)");
}

TEST(DataErrors, BatchDoesNotSplitOverRanks) {
  const BatchSampler s(synthetic_corpus(4096).train, 10, 16, 1);
  EXPECT_EQ(user_error_of([&] { s.rank_share(0, 0, 4); }),
            "a global batch of 10 rows does not split evenly over 4 data-parallel ranks; choose a "
            "batch size divisible by 4");
}

}  // namespace
}  // namespace tandem::data
