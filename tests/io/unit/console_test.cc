// The console helpers as a user reads them: durations and token rates in short text.
#include "tandem/io/console.h"

#include <gtest/gtest.h>

namespace tandem::io {
namespace {

TEST(Console, Formats) {
  EXPECT_EQ(format_duration(0.4), "0s");
  EXPECT_EQ(format_duration(42), "42s");
  EXPECT_EQ(format_duration(65), "1m05s");
  EXPECT_EQ(format_duration(3599.6), "1h00m");
  EXPECT_EQ(format_duration(7380), "2h03m");
  EXPECT_EQ(format_duration(-1), "?");
  EXPECT_EQ(format_rate(950), "950 tok/s");
  EXPECT_EQ(format_rate(12345), "12.3k tok/s");
  EXPECT_EQ(format_rate(4.56e6), "4.56M tok/s");
}

}  // namespace
}  // namespace tandem::io
