// What a user reads when the slow tier cannot be had or fails: bad tier text, a folder they may
// not write, a disk too full for the swap file, and a failed transfer surfacing at wait().
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "support/scratch.h"
#include "tandem/core/bytes.h"
#include "tandem/core/error.h"
#include "tandem/ooc/slow_tier.h"
#include "tandem/ooc/transfer_engine.h"

namespace tandem::ooc {
namespace {

namespace fs = std::filesystem;
using tandem::testing::drop_root;
using tandem::testing::ScratchDir;
using tandem::testing::user_error_in_child;
using tandem::testing::user_error_of;

TEST(TierSpecErrors, BadText) {
  EXPECT_EQ(user_error_of([] { TierSpec::parse("disk:/tmp"); }),
            "slow tier 'disk:/tmp' not understood; write 'host' (host memory) or 'file:DIR' (a "
            "swap file in folder DIR)");
  EXPECT_EQ(user_error_of([] { TierSpec::parse("file:"); }),
            "slow tier 'file:' not understood; write 'host' (host memory) or 'file:DIR' (a swap "
            "file in folder DIR)");
}

TEST(SlowTierErrors, UnwritableFolder) {
  ScratchDir dir;
  const std::string ro = dir.path("ro");
  fs::create_directory(ro);
  ::chmod(ro.c_str(), 0555);
  auto open_in = [](const std::string& folder) {
    return [folder] { open_slow_tier(TierSpec::parse("file:" + folder), 1 << 20); };
  };
  EXPECT_EQ(user_error_in_child(drop_root, open_in(ro)),
            "slow tier folder '" + ro + "' is not writable: Permission denied");
  EXPECT_EQ(user_error_in_child(drop_root, open_in(ro + "/sub")),
            "slow tier folder '" + ro + "/sub' cannot be created: Permission denied");
  ::chmod(ro.c_str(), 0755);
  EXPECT_EQ(dir.list("ro"), std::vector<std::string>{});
}

TEST(SlowTierErrors, FolderIsAFile) {
  ScratchDir dir;
  const std::string file = dir.path("f");
  {
    std::FILE* f = std::fopen(file.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fclose(f);
  }
  EXPECT_EQ(user_error_of([&] { open_slow_tier(TierSpec::parse("file:" + file), 1 << 20); }),
            "slow tier folder '" + file + "' is not a folder");
  EXPECT_EQ(
      user_error_of([&] { open_slow_tier(TierSpec::parse("file:" + file + "/sub"), 1 << 20); }),
      "slow tier folder '" + file + "/sub' cannot be created: Not a directory");
}

// A file-size limit fails fallocate(2) with EFBIG the way a full disk fails it with ENOSPC: the
// same path through the tier, without needing a full disk.
TEST(SlowTierErrors, DiskTooFullForTheSwapFile) {
  ScratchDir dir;
  auto limit_file_size = [] {
    rlimit limit{};
    ::getrlimit(RLIMIT_FSIZE, &limit);
    limit.rlim_cur = 1 << 20;
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(3);
  };
  // The size reads as human_bytes() writes it everywhere in ooc, next to the exact count.
  EXPECT_EQ(
      user_error_in_child(limit_file_size,
                          [&] { open_slow_tier(TierSpec::parse("file:" + dir.path()), 64 << 20); }),
      "slow tier " + dir.path() + ": cannot reserve " + human_bytes(67108864) +
          " (67108864 bytes) for swapped activations: File too large");
  // The capacity is rounded up to the I/O alignment, and the message shows what was reserved.
  EXPECT_EQ(user_error_in_child(
                limit_file_size,
                [&] { open_slow_tier(TierSpec::parse("file:" + dir.path()), 1288490188); }),
            "slow tier " + dir.path() + ": cannot reserve " + human_bytes(1288491008) +
                " (1288491008 bytes) for swapped activations: File too large");
  EXPECT_EQ(dir.list(), std::vector<std::string>{}) << "the unlinked swap file is gone";
}

// A tier whose writes at or past `bad_offset` fail as a disk error would.
class FailingTier final : public SlowTier {
 public:
  explicit FailingTier(uint64_t bad_offset)
      : inner_(open_slow_tier({}, 1 << 20)), bad_(bad_offset) {}
  void write(uint64_t offset, const void* src, size_t bytes) override {
    if (offset >= bad_)
      user_error(
          "slow tier file '/nvme/tandem-swap-1-abcdef': cannot write {} bytes at offset {}: "
          "Input/output error",
          bytes, offset);
    inner_->write(offset, src, bytes);
  }
  void read(uint64_t offset, void* dst, size_t bytes) override { inner_->read(offset, dst, bytes); }
  uint64_t capacity() const override { return inner_->capacity(); }
  std::string describe() const override { return "failing " + inner_->describe(); }

 private:
  std::unique_ptr<SlowTier> inner_;
  uint64_t bad_;
};

TEST(TransferEngineErrors, FailedTransferSurfacesAtWait) {
  FailingTier tier(8192);
  std::vector<char> block(4096, 'x'), back(4096, 0);
  const std::string expected =
      "slow tier file '/nvme/tandem-swap-1-abcdef': cannot write 4096 bytes at offset 8192: "
      "Input/output error";
  TransferEngine engine;
  TransferEngine::Client client(engine, /*keep_spans=*/true);
  const auto good = client.write_async(tier, 0, block.data(), 4096, "a");
  const auto bad = client.write_async(tier, 8192, block.data(), 4096, "b");
  const auto after = client.write_async(tier, 4096, block.data(), 4096, "c");
  client.wait(good);
  EXPECT_EQ(user_error_of([&] { client.wait(bad); }), expected);
  EXPECT_EQ(user_error_of([&] { client.wait(after); }), expected)
      << "later transfers on the failed stream fail with it";
  EXPECT_EQ(user_error_of([&] { client.wait_all(); }), expected);
  // The read stream is unaffected.
  const auto read = client.read_async(tier, 0, back.data(), 4096, "a");
  client.wait(read);
  EXPECT_EQ(back, block);
  const auto spans = client.take_spans();
  ASSERT_EQ(spans.size(), 2u) << "the failed and the skipped transfers are not spans";
  EXPECT_EQ(spans[0].label, "a");
  EXPECT_TRUE(spans[0].write);
  EXPECT_FALSE(spans[1].write);
}

TEST(TransferEngineErrors, UnwaitedFailureDoesNotThrowFromTheDestructor) {
  FailingTier tier(0);
  std::vector<char> block(4096, 'x');
  TransferEngine engine;
  TransferEngine::Client client(engine);
  client.write_async(tier, 0, block.data(), 4096);
}

// Two clients of one engine: a failed write surfaces at the client that waits for it (at its
// `done`, at wait() and at a read that follows it), and the other client's transfers, queued on
// the same streams around it, go on.
TEST(TransferEngineErrors, FailureSurfacesAtItsClientOnly) {
  FailingTier failing(8192);
  auto healthy = open_slow_tier({}, 1 << 16);
  std::vector<char> block(4096, 'x'), back(4096, 0), theirs(4096, 'y'), their_back(4096, 0);
  const std::string expected =
      "slow tier file '/nvme/tandem-swap-1-abcdef': cannot write 4096 bytes at offset 8192: "
      "Input/output error";
  TransferEngine engine;
  TransferEngine::Client mine(engine), other(engine);
  std::string reported;
  const auto bad = mine.write_async(
      failing, 8192, block.data(), 4096, "bad",
      [&](const TransferEngine::Span& span, std::exception_ptr error) {
        EXPECT_EQ(span.label, "bad");
        reported = error ? user_error_of([&] { std::rethrow_exception(error); }) : "";
      });
  const auto their_write = other.write_async(*healthy, 0, theirs.data(), 4096);
  const auto follows = mine.read_async(failing, 0, back.data(), 4096, "", bad);
  const auto their_read = other.read_async(*healthy, 0, their_back.data(), 4096, "", their_write);
  EXPECT_EQ(user_error_of([&] { mine.wait(follows); }), expected)
      << "a read after a failed write fails with it";
  EXPECT_EQ(reported, expected);
  EXPECT_EQ(user_error_of([&] { mine.wait(bad); }), expected);
  EXPECT_EQ(user_error_of([&] { mine.wait_all(); }), expected);
  other.wait(their_read);
  other.wait_all();
  EXPECT_EQ(their_back, theirs);
  // The other client's later writes still move data.
  const auto later = other.write_async(*healthy, 4096, theirs.data(), 4096);
  other.wait(later);
}

}  // namespace
}  // namespace tandem::ooc
