// The out-of-core profile cache's loader against damaged files: many seeded random mutations of
// a valid file each give a miss or a clean load of a valid profile (never a crash, a hang or an
// exception), and the profile's own reader refuses with a UserError only. CI runs this suite under
// ASan.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "support/mutations.h"
#include "support/scratch.h"
#include "tandem/core/error.h"
#include "tandem/ooc/profile.h"

namespace tandem::ooc {
namespace {

using tandem::testing::mutate;
using tandem::testing::ScratchDir;

const std::string kMutationKey = R"({"model":"tiny","batch":4})";

Profile measured() {
  Profile p = uniform_profile(4, 0.5, 1.0, 2e9, 3e9);
  p.recompute_s = {0.25, 0.5, 0.75, 1.0};
  return p;
}

void expect_valid(const Profile& p, uint64_t seed) {
  EXPECT_FALSE(p.forward_s.empty()) << "seed " << seed;
  EXPECT_EQ(p.forward_s.size(), p.backward_s.size()) << "seed " << seed;
  for (const auto* times : {&p.forward_s, &p.backward_s, &p.recompute_s})
    for (double t : *times) EXPECT_GE(t, 0) << "seed " << seed;
  EXPECT_GT(p.write_bytes_per_s, 0) << "seed " << seed;
  EXPECT_GT(p.read_bytes_per_s, 0) << "seed " << seed;
}

TEST(ProfileMutations, NegativeTimesAreRefused) {
  nlohmann::json j = measured().to_json();
  j["backward_s"][2] = -1.0;
  EXPECT_EQ(tandem::testing::user_error_of([&] { Profile::from_json(j); }),
            "out-of-core profile has a negative time (-1 s)");
}

TEST(ProfileMutations, EveryDamagedFileIsAMissOrAValidProfile) {
  ScratchDir dir;
  const std::string cache = dir.path("cache");
  store_cached_profile(cache, "p.json", kMutationKey, measured());
  const std::filesystem::path file = std::filesystem::path(cache) / "ooc" / "p.json";
  std::string valid;
  {
    std::ifstream f(file, std::ios::binary);
    valid.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  ASSERT_TRUE(load_cached_profile(cache, "p.json", kMutationKey).has_value());
  int misses = 0;
  for (uint64_t seed = 0; seed < 2000; ++seed) {
    const std::string text = mutate(valid, seed);
    {
      std::ofstream f(file, std::ios::trunc | std::ios::binary);
      f << text;
    }
    try {
      if (const auto p = load_cached_profile(cache, "p.json", kMutationKey))
        expect_valid(*p, seed);
      else
        ++misses;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "seed " << seed << ": " << e.what() << "\n" << text;
    }
    // The reader itself, on whatever still parses: a valid profile or a UserError.
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("profile")) continue;
    try {
      expect_valid(Profile::from_json(j["profile"]), seed);
    } catch (const UserError&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << "seed " << seed << ": " << e.what() << "\n" << text;
    }
  }
  EXPECT_GT(misses, 0);
}

}  // namespace
}  // namespace tandem::ooc
