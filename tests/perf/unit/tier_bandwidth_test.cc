// The tier probe on both tiers: positive rates from a tier given, and from a spec (a probe tier
// opened in the file tier's folder and removed after).
#include "tandem/perf/tier_bandwidth.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/scratch.h"
#include "tandem/core/error.h"

namespace tandem::perf {
namespace {

using tandem::testing::ScratchDir;

TEST(MeasureTier, BothTiersReportPositiveFigures) {
  ScratchDir dir;
  for (const std::string& spec : std::vector<std::string>{"host", "file:" + dir.path()}) {
    auto tier = ooc::open_slow_tier(ooc::TierSpec::parse(spec), 8 << 20);
    const ooc::TierBandwidth bw = measure_tier(*tier, 8 << 20, 1 << 20);
    EXPECT_GT(bw.write_bytes_per_s, 0) << spec;
    EXPECT_GT(bw.read_bytes_per_s, 0) << spec;
  }
}

TEST(MeasureTier, FromASpecLeavesNoProbeBehind) {
  ScratchDir dir;
  // Not a multiple of the alignment: rounded up, not refused.
  const ooc::TierBandwidth bw =
      measure_tier(ooc::TierSpec::parse("file:" + dir.path()), (2 << 20) + 1);
  EXPECT_GT(bw.write_bytes_per_s, 0);
  EXPECT_GT(bw.read_bytes_per_s, 0);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

// A folder that cannot be one: the tier's own message.
TEST(MeasureTier, AFileForAFolderIsAUserError) {
  ScratchDir dir;
  const std::string file = dir.path("plain");
  std::ofstream(file) << "x";
  EXPECT_EQ(tandem::testing::user_error_of(
                [&] { measure_tier(ooc::TierSpec::parse("file:" + file), 1 << 20); }),
            "slow tier folder '" + file + "' is not a folder");
}

}  // namespace
}  // namespace tandem::perf
