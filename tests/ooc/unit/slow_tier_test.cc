// Slow tiers and the swap engine: tier specs round-trip; host and file tiers give back the bytes
// they were given at any aligned offset; the swap file is never visible in its folder; the engine's
// two streams keep data intact under interleaving and report what they moved.
#include "tandem/ooc/slow_tier.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "support/scratch.h"
#include "tandem/core/error.h"
#include "tandem/ooc/swap_engine.h"

namespace tandem::ooc {
namespace {

namespace fs = std::filesystem;
using tandem::testing::ScratchDir;

// Memory aligned for O_DIRECT, filled with random bytes.
struct AlignedBytes {
  explicit AlignedBytes(size_t n, uint64_t seed = 0)
      : size(n),
        data(static_cast<unsigned char*>(std::aligned_alloc(kIoAlignment, n)), &std::free) {
    std::mt19937_64 generator(seed);
    for (size_t i = 0; i < n; ++i) data.get()[i] = static_cast<unsigned char>(generator());
  }
  unsigned char* get() const { return data.get(); }
  bool operator==(const AlignedBytes& o) const {
    return size == o.size && std::equal(get(), get() + size, o.get());
  }
  size_t size;
  std::unique_ptr<unsigned char, decltype(&std::free)> data;
};

TEST(TierSpec, ParsesAndRoundTrips) {
  const TierSpec host = TierSpec::parse("host");
  EXPECT_EQ(host.kind, TierSpec::Kind::Host);
  EXPECT_EQ(host.str(), "host");
  const TierSpec file = TierSpec::parse("file:/mnt/nvme/swap");
  EXPECT_EQ(file.kind, TierSpec::Kind::File);
  EXPECT_EQ(file.dir, "/mnt/nvme/swap");
  EXPECT_EQ(file.str(), "file:/mnt/nvme/swap");
  for (const char* text : {"host", "file:/tmp", "file:relative/dir", "file:a:b"})
    EXPECT_EQ(TierSpec::parse(TierSpec::parse(text).str()).str(), text);
  for (const char* bad : {"", "Host", "file:", "file", "disk:/tmp", " host"})
    EXPECT_THROW(TierSpec::parse(bad), UserError) << bad;
}

// Writes random blocks at several aligned offsets (first, middle, last) and reads them back.
void expect_round_trips(SlowTier& tier) {
  const uint64_t capacity = tier.capacity();
  ASSERT_GE(capacity, 1u << 20);
  const std::vector<std::pair<uint64_t, size_t>> ranges = {
      {0, kIoAlignment},
      {kIoAlignment, 3 * kIoAlignment},
      {capacity / 2, 64 * kIoAlignment},
      {capacity - 2 * kIoAlignment, 2 * kIoAlignment},
  };
  std::vector<AlignedBytes> written;
  for (size_t i = 0; i < ranges.size(); ++i) {
    written.emplace_back(ranges[i].second, i + 1);
    tier.write(ranges[i].first, written.back().get(), ranges[i].second);
  }
  for (size_t i = 0; i < ranges.size(); ++i) {
    AlignedBytes back(ranges[i].second, 999);
    tier.read(ranges[i].first, back.get(), ranges[i].second);
    EXPECT_TRUE(back == written[i]) << "range " << i << " at offset " << ranges[i].first;
  }
}

TEST(SlowTier, HostRoundTrips) {
  auto tier = open_slow_tier(TierSpec::parse("host"), 1 << 20);
  EXPECT_EQ(tier->capacity(), 1u << 20);
  EXPECT_EQ(tier->describe(), "host memory");
  expect_round_trips(*tier);
}

TEST(SlowTier, CapacityIsRoundedUpToTheAlignment) {
  EXPECT_EQ(open_slow_tier(TierSpec::parse("host"), 5000)->capacity(), 2 * kIoAlignment);
  ScratchDir dir;
  EXPECT_EQ(open_slow_tier(TierSpec::parse("file:" + dir.path()), 1)->capacity(), kIoAlignment);
}

TEST(SlowTier, FileRoundTripsAndIsNeverVisible) {
  ScratchDir dir;
  {
    auto tier = open_slow_tier(TierSpec::parse("file:" + dir.path()), 2 << 20);
    EXPECT_EQ(tier->capacity(), 2u << 20);
    // Unlinked at once: nothing to clean up after a crash.
    EXPECT_EQ(dir.list(), std::vector<std::string>{});
    const std::string shown = tier->describe();
    EXPECT_TRUE(shown.starts_with(fmt::format("file {}/tandem-swap-{}-", dir.path(), ::getpid())))
        << shown;
    EXPECT_TRUE(shown.ends_with("(O_DIRECT)") ||
                shown.ends_with("(buffered: the filesystem refuses O_DIRECT)"))
        << shown;
    expect_round_trips(*tier);
  }
  EXPECT_EQ(dir.list(), std::vector<std::string>{});
}

TEST(SlowTier, FileTierCreatesItsFolderWithParents) {
  ScratchDir dir;
  auto tier = open_slow_tier(TierSpec::parse("file:" + dir.path("a/b/c")), 1 << 20);
  EXPECT_TRUE(fs::is_directory(dir.path("a/b/c")));
  EXPECT_EQ(dir.list("a/b/c"), std::vector<std::string>{});
  expect_round_trips(*tier);
}

TEST(SlowTier, TwoTiersShareAFolder) {
  ScratchDir dir;
  auto a = open_slow_tier(TierSpec::parse("file:" + dir.path()), 1 << 20);
  auto b = open_slow_tier(TierSpec::parse("file:" + dir.path()), 1 << 20);
  EXPECT_NE(a->describe(), b->describe());
  AlignedBytes one(kIoAlignment, 1), two(kIoAlignment, 2), back(kIoAlignment, 3);
  a->write(0, one.get(), kIoAlignment);
  b->write(0, two.get(), kIoAlignment);
  a->read(0, back.get(), kIoAlignment);
  EXPECT_TRUE(back == one);
}

TEST(SlowTier, MisalignedFileTransferIsABug) {
  ScratchDir dir;
  auto tier = open_slow_tier(TierSpec::parse("file:" + dir.path()), 1 << 20);
  AlignedBytes block(2 * kIoAlignment);
  EXPECT_THROW(tier->write(100, block.get(), kIoAlignment), InternalError);
  EXPECT_THROW(tier->write(0, block.get(), 100), InternalError);
  EXPECT_THROW(tier->write(0, block.get() + 1, kIoAlignment), InternalError);
  EXPECT_THROW(tier->read(1 << 20, block.get(), kIoAlignment), InternalError);
}

TEST(SwapEngine, InterleavedWritesAndReadsKeepDataIntact) {
  for (const std::string spec : {"host", "file"}) {
    SCOPED_TRACE(spec);
    ScratchDir dir;
    constexpr size_t kBlocks = 48;
    constexpr size_t kBlock = 16 * kIoAlignment;
    auto tier = open_slow_tier(TierSpec::parse(spec == "host" ? spec : "file:" + dir.path()),
                               kBlocks * kBlock);
    SwapEngine engine(*tier);
    EXPECT_EQ(&engine.tier(), tier.get());
    std::vector<AlignedBytes> out, in;
    for (size_t i = 0; i < kBlocks; ++i) {
      out.emplace_back(kBlock, 100 + i);
      in.emplace_back(kBlock, 0);
    }
    std::vector<SwapEngine::Ticket> writes(kBlocks), reads;
    // Swap block i out, and swap block i-8 back in once its own swap-out is known to be done:
    // the two streams overlap, each on ranges the other is not touching.
    for (size_t i = 0; i < kBlocks; ++i) {
      writes[i] = engine.write_async(i * kBlock, out[i].get(), kBlock, fmt::format("out{}", i));
      if (i >= 8) {
        engine.wait(writes[i - 8]);
        reads.push_back(engine.read_async((i - 8) * kBlock, in[i - 8].get(), kBlock,
                                          fmt::format("in{}", i - 8)));
      }
    }
    for (size_t i = kBlocks - 8; i < kBlocks; ++i) {
      engine.wait(writes[i]);
      reads.push_back(engine.read_async(i * kBlock, in[i].get(), kBlock, fmt::format("in{}", i)));
    }
    for (SwapEngine::Ticket t : reads) engine.wait(t);
    engine.wait_all();
    for (size_t i = 0; i < kBlocks; ++i) EXPECT_TRUE(in[i] == out[i]) << "block " << i;

    // Tickets are unique across both streams.
    std::vector<SwapEngine::Ticket> all = writes;
    all.insert(all.end(), reads.begin(), reads.end());
    std::sort(all.begin(), all.end());
    EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end());
    EXPECT_EQ(std::count(all.begin(), all.end(), 0u), 0);

    const std::vector<SwapEngine::Span> spans = engine.take_spans();
    ASSERT_EQ(spans.size(), 2 * kBlocks);
    size_t n_writes = 0;
    for (const auto& span : spans) {
      n_writes += span.write;
      EXPECT_EQ(span.bytes, kBlock);
      EXPECT_EQ(span.label.substr(0, span.write ? 3 : 2), span.write ? "out" : "in");
      EXPECT_LE(span.begin, span.end);
    }
    EXPECT_EQ(n_writes, kBlocks);
    EXPECT_TRUE(engine.take_spans().empty()) << "spans are handed out once";
  }
}

TEST(SwapEngine, DestructorFinishesQueuedWork) {
  auto tier = open_slow_tier(TierSpec::parse("host"), 1 << 20);
  AlignedBytes block(1 << 20, 5), back(1 << 20, 6);
  {
    SwapEngine engine(*tier);
    for (size_t i = 0; i < 16; ++i)
      engine.write_async(i * (1 << 16), block.get() + i * (1 << 16), 1 << 16);
  }
  tier->read(0, back.get(), 1 << 20);
  EXPECT_TRUE(back == block);
}

TEST(SwapEngine, WaitOnAFinishedTicketReturnsAtOnce) {
  auto tier = open_slow_tier(TierSpec::parse("host"), 1 << 20);
  SwapEngine engine(*tier);
  AlignedBytes block(kIoAlignment);
  const auto t = engine.write_async(0, block.get(), kIoAlignment);
  engine.wait_all();
  engine.wait(t);
  engine.wait(t);
  EXPECT_THROW(engine.wait(t + 1), InternalError) << "a ticket never issued";
  EXPECT_THROW(engine.read_async(1 << 20, block.get(), kIoAlignment), InternalError)
      << "past the end";
}

TEST(MeasureBandwidth, BothTiersReportPositiveFigures) {
  ScratchDir dir;
  for (const std::string& spec : std::vector<std::string>{"host", "file:" + dir.path()}) {
    auto tier = open_slow_tier(TierSpec::parse(spec), 8 << 20);
    const TierBandwidth bw = measure_bandwidth(*tier, 8 << 20, 1 << 20);
    EXPECT_GT(bw.write_bytes_per_s, 0) << spec;
    EXPECT_GT(bw.read_bytes_per_s, 0) << spec;
  }
}

}  // namespace
}  // namespace tandem::ooc
