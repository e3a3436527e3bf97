// The token shard loader against damaged files: a valid shard's bytes flipped, cut short,
// extended and spliced many times over (seeded, the same on every machine); each either opens as
// a consistent shard (its size exactly the header and the tokens it announces) or is refused with
// a UserError, never a crash, a hang or another exception.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "support/mutations.h"
#include "support/scratch.h"
#include "tandem/core/error.h"
#include "tandem/io/token_shards.h"

namespace tandem::io {
namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(TokenShardMutation, EveryDamagedShardIsRefusedOrConsistent) {
  testing::ScratchDir dir;
  constexpr int64_t kVocab = 300;
  Sha256Digest tokenizer{};
  for (size_t i = 0; i < tokenizer.size(); ++i) tokenizer[i] = static_cast<uint8_t>(i * 7);
  const std::string valid_path = dir.path("valid.bin");
  {
    ShardWriter w(valid_path, "valid.bin", kVocab, tokenizer);
    std::mt19937 rng(1);
    std::vector<int32_t> ids(1000);
    for (int32_t& id : ids) id = static_cast<int32_t>(rng() % kVocab);
    w.append(ids.data(), ids.size());
    w.finish();
  }
  const std::string valid = read_bytes(valid_path);
  ASSERT_EQ(valid.size(), kShardHeaderBytes + 2000);
  int refused = 0, opened = 0;
  const std::string path = dir.path("mutant.bin");
  for (uint64_t seed = 0; seed < 3000; ++seed) {
    const std::string bytes = testing::mutate(valid, seed);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    try {
      const MappedShard shard(path, kVocab, tokenizer);
      EXPECT_EQ(kShardHeaderBytes + shard.count() * static_cast<uint64_t>(shard.width()),
                bytes.size())
          << "seed " << seed;
      ++opened;
    } catch (const UserError&) {
      ++refused;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "seed " << seed << ": not a UserError: " << e.what();
    }
  }
  // Both outcomes occur: damage to the tokens alone leaves a consistent shard (its ids are
  // checked against the vocabulary by the corpus that reads them).
  EXPECT_GT(refused, 0);
  EXPECT_GT(opened, 0);
}

}  // namespace
}  // namespace tandem::io
