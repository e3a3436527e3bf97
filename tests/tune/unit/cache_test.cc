// The tuning cache: records survive a JSON round trip, every field of the key changes the file,
// and damaged, missing or foreign records read as misses; records of the older format read, but
// load_record treats them as stale.
#include "tandem/tune/cache.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "tandem/core/error.h"
#include "tune/tune_testing.h"

namespace tandem::tune {
namespace {

namespace fs = std::filesystem;

TuneKey sample_key() {
  TuneKey k;
  k.program = "adam";
  k.program_hash = hash_hex("program adam\n ...");
  k.sizes = {{"N", 1 << 20}};
  k.ranks = 2;
  k.backend = "thread";
  k.executor = "compiled";
  k.machine = machine_id();
  k.candidates = hash_hex("AR-C\nfused(RS-C-AG)");
  return k;
}

TuneRecord sample_record() {
  TuneRecord r;
  r.key = sample_key();
  r.warmup = 1;
  r.reps = 3;
  r.created = "2026-01-01T00:00:00Z";
  CandidateTiming a{"AR-C", true, "", 0.0, {0.030, 0.010, 0.020}, {}};
  CandidateTiming b{"fused(RS-C-AG)", true, "", 1.5e-7, {0.004, 0.005, 0.006, 0.003}, {}};
  CandidateTiming c{"RS-C-AG", false, "results differ", 0.25, {}, {}};
  r.candidates = {a, b, c};
  r.winner = "fused(RS-C-AG)";
  return r;
}

TEST(TuneCache, MedianMinMax) {
  const TuneRecord r = sample_record();
  EXPECT_DOUBLE_EQ(r.candidates[0].median(), 0.020);   // odd count: the middle one
  EXPECT_DOUBLE_EQ(r.candidates[1].median(), 0.0045);  // even count: the mean of the middle two
  EXPECT_DOUBLE_EQ(r.candidates[1].min(), 0.003);
  EXPECT_DOUBLE_EQ(r.candidates[1].max(), 0.006);
  EXPECT_TRUE(std::isinf(r.candidates[2].median()));  // no times: never the fastest
}

TEST(TuneCache, JsonRoundTrip) {
  const TuneRecord r = sample_record();
  const TuneRecord back = record_from_json(record_to_json(r));
  EXPECT_EQ(back.key, r.key);
  EXPECT_EQ(back.winner, r.winner);
  EXPECT_EQ(back.warmup, 1);
  EXPECT_EQ(back.reps, 3);
  EXPECT_EQ(back.created, r.created);
  ASSERT_EQ(back.candidates.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(back.candidates[i].name, r.candidates[i].name);
    EXPECT_EQ(back.candidates[i].ok, r.candidates[i].ok);
    EXPECT_EQ(back.candidates[i].times, r.candidates[i].times);
    EXPECT_EQ(back.candidates[i].error, r.candidates[i].error);
    EXPECT_DOUBLE_EQ(back.candidates[i].max_error, r.candidates[i].max_error);
    EXPECT_EQ(back.candidates[i].final_times, r.candidates[i].final_times);
  }
}

TEST(TuneCache, JsonRoundTripKeepsTheFinalRound) {
  TuneRecord r = sample_record();
  r.final_margin = 0.15;
  r.final_max = 4;
  r.final_reps = 2;
  r.candidates[0].final_times = {0.011, 0.009};
  r.candidates[1].final_times = {0.008, 0.012};
  r.winner = "AR-C";
  EXPECT_DOUBLE_EQ(r.candidates[1].final_median(), 0.010);
  EXPECT_TRUE(std::isinf(r.candidates[2].final_median()));
  const std::string text = record_to_json(r);
  EXPECT_NE(text.find("\"tandem-tune-2\""), std::string::npos) << text;
  const TuneRecord back = record_from_json(text);
  EXPECT_EQ(back.winner, "AR-C");
  EXPECT_DOUBLE_EQ(back.final_margin, 0.15);
  EXPECT_EQ(back.final_max, 4);
  EXPECT_EQ(back.final_reps, 2);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(back.candidates[i].final_times, r.candidates[i].final_times) << i;
    EXPECT_EQ(back.candidates[i].retimed(), i < 2) << i;
  }
}

// The chunk round's choice survives the round trip; a record without one (no chunk round, or
// written before chunk rounds) reads as chunk size 0: the process's.
TEST(TuneCache, JsonRoundTripKeepsTheChunkSize) {
  TuneRecord r = sample_record();
  const std::string without = record_to_json(r);
  EXPECT_EQ(without.find("\"chunks\""), std::string::npos) << without;
  EXPECT_EQ(record_from_json(without).chunk_bytes, 0u);
  EXPECT_TRUE(record_from_json(without).chunks.empty());
  r.chunks = {{65536, {0.002, 0.003}}, {262144, {0.001}}};
  r.chunk_bytes = 262144;
  const TuneRecord back = record_from_json(record_to_json(r));
  EXPECT_EQ(back.chunk_bytes, 262144u);
  ASSERT_EQ(back.chunks.size(), 2u);
  EXPECT_EQ(back.chunks[0].bytes, 65536u);
  EXPECT_EQ(back.chunks[0].times, r.chunks[0].times);
}

// A record written before the final round (format 1) still reads, as a record without a final
// round; but the cache treats it as stale, says so, and the key is tuned again.
TEST(TuneCache, OlderFormatReadsButIsStale) {
  testing::TempCacheDir dir("format1");
  const TuneRecord r = sample_record();
  std::string text = record_to_json(r);
  const std::string v2 = "\"tandem-tune-2\"";
  text.replace(text.find(v2), v2.size(), "\"tandem-tune-1\"");
  const size_t final_at = text.find("\"final\"");
  ASSERT_NE(final_at, std::string::npos);
  const TuneRecord back = record_from_json(text);
  EXPECT_EQ(back.winner, r.winner);
  EXPECT_EQ(back.final_reps, 0);
  for (const auto& c : back.candidates) EXPECT_FALSE(c.retimed());

  const std::string path = store_record(r, dir.str());
  {
    std::ofstream f(path, std::ios::trunc);
    f << text;
  }
  std::string stale;
  EXPECT_FALSE(load_record(r.key, dir.str(), &stale).has_value());
  EXPECT_NE(stale.find("older format (tandem-tune-1"), std::string::npos) << stale;
  EXPECT_NE(stale.find(path), std::string::npos) << stale;
  EXPECT_NE(stale.find("is not used"), std::string::npos) << stale;
  // The current format is no stale record.
  store_record(r, dir.str());
  stale.clear();
  EXPECT_TRUE(load_record(r.key, dir.str(), &stale).has_value());
  EXPECT_TRUE(stale.empty()) << stale;
}

TEST(TuneCache, EveryKeyFieldChangesTheDigest) {
  const TuneKey base = sample_key();
  std::vector<TuneKey> variants(8, base);
  variants[0].program = "lamb";
  variants[1].program_hash = hash_hex("other text");
  variants[2].sizes["N"] = 1 << 21;
  variants[3].ranks = 4;
  variants[4].backend = "mpi";
  variants[5].executor = "plan";
  variants[6].machine = "another CPU [avx2] 2 threads";
  variants[7].candidates = hash_hex("AR-C");
  std::set<std::string> digests = {base.digest()};
  for (const TuneKey& k : variants) {
    EXPECT_FALSE(k == base);
    digests.insert(k.digest());
  }
  EXPECT_EQ(digests.size(), variants.size() + 1);
  EXPECT_EQ(base.digest().size(), 32u);
  EXPECT_EQ(base.digest(), sample_key().digest());  // stable
}

TEST(TuneCache, MachineIdNamesTheCpu) {
  const std::string id = machine_id();
  EXPECT_NE(id.find(" threads"), std::string::npos) << id;
  EXPECT_EQ(id, machine_id());
}

TEST(TuneCache, StoreThenLoad) {
  testing::TempCacheDir dir("cache");
  const TuneRecord r = sample_record();
  EXPECT_FALSE(load_record(r.key, dir.str()).has_value());
  const std::string path = store_record(r, dir.str());
  EXPECT_EQ(path, record_path(r.key, dir.str()));
  EXPECT_TRUE(fs::exists(path));
  // Nothing but the record is left in the folder (the temporary was renamed).
  int files = 0;
  for (const auto& e : fs::directory_iterator(fs::path(path).parent_path()))
    files += e.is_regular_file();
  EXPECT_EQ(files, 1);
  auto back = load_record(r.key, dir.str());
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->winner, "fused(RS-C-AG)");
  // Another key does not find it.
  TuneKey other = r.key;
  other.ranks = 3;
  EXPECT_FALSE(load_record(other, dir.str()).has_value());
}

TEST(TuneCache, DamagedOrForeignRecordsAreMisses) {
  testing::TempCacheDir dir("damaged");
  const TuneRecord r = sample_record();
  const std::string path = store_record(r, dir.str());
  {
    std::ofstream f(path, std::ios::trunc);
    f << "{\"format\": \"tandem-tune-1\", \"key\": ";  // cut short, as by a crash mid-write
  }
  EXPECT_FALSE(load_record(r.key, dir.str()).has_value());
  // A well-formed record stored under this key's name but holding another key.
  TuneRecord foreign = r;
  foreign.key.ranks = 8;
  {
    std::ofstream f(path, std::ios::trunc);
    f << record_to_json(foreign);
  }
  EXPECT_FALSE(load_record(r.key, dir.str()).has_value());
}

TEST(TuneCache, MalformedRecordsAreUserErrors) {
  EXPECT_THROW(record_from_json("not json"), UserError);
  EXPECT_THROW(record_from_json("{\"format\": \"something-else\"}"), UserError);
  TuneRecord r = sample_record();
  r.winner = "RS-C-AG";  // listed, but it failed its check
  try {
    record_from_json(record_to_json(r));
    FAIL() << "a record whose winner failed was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("winner 'RS-C-AG'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tandem::tune
