// The tuning record's loader against damaged files: numbers out of range are refused naming the
// field, and many seeded random mutations of a valid record each give a clean load or a clean
// UserError (never a crash, a hang or another exception). CI runs this suite under ASan.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "support/mutations.h"
#include "tandem/core/error.h"
#include "tandem/tune/cache.h"
#include "tune/tune_testing.h"

namespace tandem::tune {
namespace {

using tandem::testing::mutate;

TuneRecord full_record() {
  TuneRecord r;
  r.key.program = "adam";
  r.key.program_hash = hash_hex("program adam");
  r.key.sizes = {{"N", 1 << 20}};
  r.key.ranks = 2;
  r.key.backend = "thread";
  r.key.executor = "compiled";
  r.key.machine = "test machine";
  r.key.candidates = hash_hex("AR-C\nfused(RS-C-AG)");
  r.warmup = 1;
  r.reps = 3;
  r.created = "2026-01-01T00:00:00Z";
  r.check_sizes = {{"N", 4096}};
  r.candidates = {{"AR-C", true, "", 0.0, {0.03, 0.01}, {0.02, 0.02}},
                  {"fused(RS-C-AG)", true, "", 1e-7, {0.004, 0.005}, {0.004}},
                  {"RS-C-AG", false, "results differ", 0.25, {}, {}}};
  r.winner = "fused(RS-C-AG)";
  r.final_margin = 0.1;
  r.final_max = 3;
  r.final_reps = 6;
  r.chunk_bytes = 65536;
  r.chunks = {{65536, {0.004}}, {262144, {0.005}}};
  return r;
}

std::string cache_error_of(const std::string& text) {
  try {
    record_from_json(text);
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

std::string with(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return at == std::string::npos ? text : text.replace(at, from.size(), to);
}

TEST(TuneCacheNumbers, ValuesOutOfRangeAreRefusedNamingTheField) {
  const std::string valid = record_to_json(full_record(), -1);
  EXPECT_EQ(cache_error_of(with(valid, "\"chosen\":65536", "\"chosen\":-5")),
            "tuning record: 'chunks.chosen' is -5; expected a whole number from 0 to "
            "1099511627776");
  EXPECT_EQ(cache_error_of(with(valid, "\"ranks\":2", "\"ranks\":99999999999")),
            "tuning record: 'ranks' is 99999999999; expected a whole number from 1 to 2147483647");
  EXPECT_EQ(cache_error_of(with(valid, "\"reps\":3", "\"reps\":-1")),
            "tuning record: 'reps' is -1; expected a whole number from 0 to 2147483647");
  EXPECT_EQ(cache_error_of(with(valid, "\"N\":1048576", "\"N\":1.5")),
            "tuning record: 'sizes.N' is 1.5; expected a whole number from 0 to "
            "9223372036854775807");
}

TEST(TuneCacheMutations, EveryDamagedRecordIsACleanUserErrorOrLoad) {
  const std::string valid = record_to_json(full_record());
  ASSERT_EQ(record_from_json(valid).winner, "fused(RS-C-AG)");
  int loaded = 0, refused = 0;
  for (uint64_t seed = 0; seed < 3000; ++seed) {
    const std::string text = mutate(valid, seed);
    try {
      record_from_json(text);
      ++loaded;
    } catch (const UserError&) {
      ++refused;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "seed " << seed << ": " << e.what() << "\n" << text;
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(loaded, 0);  // some mutations (inside a name, a time) leave a valid record
}

// Through the cache's files: a damaged record file is a miss (retuned and replaced).
TEST(TuneCacheMutations, DamagedRecordFilesAreMisses) {
  testing::TempCacheDir dir("mutations");
  const TuneRecord r = full_record();
  const std::string path = store_record(r, dir.str());
  const std::string valid = record_to_json(r) + "\n";
  for (uint64_t seed = 0; seed < 300; ++seed) {
    const std::string text = mutate(valid, seed);
    {
      std::ofstream f(path, std::ios::trunc | std::ios::binary);
      f << text;
    }
    try {
      load_record(r.key, dir.str());
    } catch (const std::exception& e) {
      ADD_FAILURE() << "seed " << seed << ": " << e.what() << "\n" << text;
    }
  }
}

// Nested 100 000 deep (which overflowed the stack while a message quoted it) or ill-typed: one
// UserError naming the record, never nlohmann's own text; through the cache's files, a miss.
TEST(TuneCacheMutations, DeepOrIllTypedRecordsAreCleanErrors) {
  const std::string deep =
      "{\"format\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  EXPECT_EQ(cache_error_of(deep),
            "tuning record nests arrays and objects more than 64 deep: it is not a file tandem "
            "reads");
  const std::string valid = record_to_json(full_record(), -1);
  const std::string m =
      cache_error_of(with(valid, "\"winner\":\"fused(RS-C-AG)\"", "\"winner\":[1]"));
  EXPECT_EQ(m.rfind("tuning record is malformed: ", 0), 0u) << m;
  EXPECT_EQ(m.find("[json.exception"), std::string::npos) << m;
  testing::TempCacheDir dir("deep");
  const TuneRecord r = full_record();
  const std::string path = store_record(r, dir.str());
  {
    std::ofstream f(path, std::ios::trunc | std::ios::binary);
    f << deep;
  }
  EXPECT_FALSE(load_record(r.key, dir.str()).has_value());
}

}  // namespace
}  // namespace tandem::tune
