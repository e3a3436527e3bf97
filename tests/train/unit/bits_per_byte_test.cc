// Bits per byte: a mean loss per token turned into bits per byte of text, comparable across
// tokenizers.
#include <gtest/gtest.h>

#include <cmath>

#include "tandem/train/evaluate.h"

namespace tandem::train {
namespace {

TEST(BitsPerByte, KnownCases) {
  // Bytes: a loss of ln 2 per byte is one bit per byte.
  EXPECT_DOUBLE_EQ(bits_per_byte(std::log(2.0), 1.0), 1.0);
  // A token standing for 4 bytes with a loss of 8 bits: 2 bits per byte.
  EXPECT_DOUBLE_EQ(bits_per_byte(8 * std::log(2.0), 4.0), 2.0);
}

}  // namespace
}  // namespace tandem::train
