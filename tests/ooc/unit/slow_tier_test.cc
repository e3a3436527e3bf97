// Slow tiers and the transfer engine: tier specs round-trip; host and file tiers give back the
// bytes they were given at any aligned offset; the swap file is never visible in its folder; the
// engine's two streams keep data intact under interleaving and report what they moved, a read
// named after a write sees its data, and clients of one engine keep their tiers apart.
#include "tandem/ooc/slow_tier.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "support/scratch.h"
#include "tandem/core/error.h"
#include "tandem/ooc/transfer_engine.h"

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

TEST(TransferEngine, InterleavedWritesAndReadsKeepDataIntact) {
  for (const std::string spec : {"host", "file"}) {
    SCOPED_TRACE(spec);
    ScratchDir dir;
    constexpr size_t kBlocks = 48;
    constexpr size_t kBlock = 16 * kIoAlignment;
    auto tier = open_slow_tier(TierSpec::parse(spec == "host" ? spec : "file:" + dir.path()),
                               kBlocks * kBlock);
    TransferEngine engine;
    TransferEngine::Client client(engine, /*keep_spans=*/true);
    EXPECT_EQ(&client.engine(), &engine);
    std::vector<AlignedBytes> out, in;
    for (size_t i = 0; i < kBlocks; ++i) {
      out.emplace_back(kBlock, 100 + i);
      in.emplace_back(kBlock, 0);
    }
    std::vector<TransferEngine::Ticket> writes(kBlocks), reads;
    // Swap block i out, and swap block i-8 back in once its own swap-out is known to be done:
    // the two streams overlap, each on ranges the other is not touching.
    for (size_t i = 0; i < kBlocks; ++i) {
      writes[i] =
          client.write_async(*tier, i * kBlock, out[i].get(), kBlock, fmt::format("out{}", i));
      if (i >= 8) {
        client.wait(writes[i - 8]);
        reads.push_back(client.read_async(*tier, (i - 8) * kBlock, in[i - 8].get(), kBlock,
                                          fmt::format("in{}", i - 8)));
      }
    }
    for (size_t i = kBlocks - 8; i < kBlocks; ++i) {
      client.wait(writes[i]);
      reads.push_back(
          client.read_async(*tier, i * kBlock, in[i].get(), kBlock, fmt::format("in{}", i)));
    }
    for (TransferEngine::Ticket t : reads) client.wait(t);
    client.wait_all();
    for (size_t i = 0; i < kBlocks; ++i) EXPECT_TRUE(in[i] == out[i]) << "block " << i;

    // Tickets are unique across both streams.
    std::vector<TransferEngine::Ticket> all = writes;
    all.insert(all.end(), reads.begin(), reads.end());
    std::sort(all.begin(), all.end());
    EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end());
    EXPECT_EQ(std::count(all.begin(), all.end(), 0u), 0);

    const std::vector<TransferEngine::Span> spans = client.take_spans();
    ASSERT_EQ(spans.size(), 2 * kBlocks);
    size_t n_writes = 0;
    for (const auto& span : spans) {
      n_writes += span.write;
      EXPECT_EQ(span.bytes, kBlock);
      EXPECT_EQ(span.label.substr(0, span.write ? 3 : 2), span.write ? "out" : "in");
      EXPECT_LE(span.begin, span.end);
    }
    EXPECT_EQ(n_writes, kBlocks);
    EXPECT_TRUE(client.take_spans().empty()) << "spans are handed out once";
  }
}

TEST(TransferEngine, DestructorFinishesQueuedWork) {
  auto tier = open_slow_tier(TierSpec::parse("host"), 1 << 20);
  AlignedBytes block(1 << 20, 5), back(1 << 20, 6);
  {
    TransferEngine engine;
    TransferEngine::Client client(engine);
    for (size_t i = 0; i < 16; ++i)
      client.write_async(*tier, i * (1 << 16), block.get() + i * (1 << 16), 1 << 16);
  }
  tier->read(0, back.get(), 1 << 20);
  EXPECT_TRUE(back == block);
}

TEST(TransferEngine, WaitOnAFinishedTicketReturnsAtOnce) {
  auto tier = open_slow_tier(TierSpec::parse("host"), 1 << 20);
  TransferEngine engine;
  TransferEngine::Client client(engine);
  AlignedBytes block(kIoAlignment);
  const auto t = client.write_async(*tier, 0, block.get(), kIoAlignment);
  client.wait_all();
  client.wait(t);
  client.wait(t);
  EXPECT_THROW(client.wait(t + 1), InternalError) << "a ticket never issued";
  EXPECT_THROW(client.read_async(*tier, 1 << 20, block.get(), kIoAlignment), InternalError)
      << "past the end";
  EXPECT_THROW(client.read_async(*tier, 0, block.get(), kIoAlignment, "", t + 1), InternalError)
      << "after a ticket that is no write";
  EXPECT_TRUE(client.take_spans().empty()) << "spans are kept only when asked for";
}

// A tier whose writes wait until the test opens a gate: the writes queue up behind it.
class GatedTier final : public SlowTier {
 public:
  explicit GatedTier(uint64_t bytes) : inner_(open_slow_tier({}, bytes)) {}
  void open() {
    std::lock_guard lock(mutex_);
    open_ = true;
    cv_.notify_all();
  }
  void write(uint64_t offset, const void* src, size_t bytes) override {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return open_; });
    lock.unlock();
    inner_->write(offset, src, bytes);
  }
  void read(uint64_t offset, void* dst, size_t bytes) override { inner_->read(offset, dst, bytes); }
  uint64_t capacity() const override { return inner_->capacity(); }
  std::string describe() const override { return "gated " + inner_->describe(); }

 private:
  std::unique_ptr<SlowTier> inner_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
};

TEST(TransferEngine, ReadAfterAWriteSeesItsDataThoughQueuedBehindOthers) {
  constexpr size_t kBlock = 4 * kIoAlignment;
  auto tier = open_slow_tier({}, 8 * kBlock);
  std::vector<AlignedBytes> out;
  for (size_t i = 0; i < 8; ++i) out.emplace_back(kBlock, 10 + i);
  AlignedBytes old_data(kBlock, 99), back(kBlock, 0), other(kBlock, 0);
  tier->write(7 * kBlock, old_data.get(), kBlock);  // what a read not after the write would see
  GatedTier gated(8 * kBlock);
  TransferEngine engine;
  TransferEngine::Client client(engine);
  // Seven writes held at the gate, then the one the read names, then a read of its range.
  std::vector<TransferEngine::Ticket> writes;
  for (size_t i = 0; i < 7; ++i)
    writes.push_back(client.write_async(gated, i * kBlock, out[i].get(), kBlock));
  const auto last = client.write_async(*tier, 7 * kBlock, out[7].get(), kBlock);
  // A read that names no write is not held back by the queued writes.
  const auto free_read = client.read_async(*tier, 7 * kBlock, other.get(), kBlock);
  client.wait(free_read);
  EXPECT_TRUE(other == old_data);
  std::atomic<bool> read_done{false};
  const auto read = client.read_async(*tier, 7 * kBlock, back.get(), kBlock, "", last,
                                      [&](const TransferEngine::Span&, std::exception_ptr error) {
                                        EXPECT_FALSE(error);
                                        read_done = true;
                                      });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(read_done) << "the read ran before the write it follows";
  gated.open();
  client.wait(read);
  EXPECT_TRUE(read_done);
  EXPECT_TRUE(back == out[7]);
  client.wait_all();
  for (size_t i = 0; i < 7; ++i) {
    AlignedBytes got(kBlock, 0);
    gated.read(i * kBlock, got.get(), kBlock);
    EXPECT_TRUE(got == out[i]) << "block " << i;
  }
}

TEST(TransferEngine, ClientsOfOneEngineKeepTheirTiersApart) {
  for (const std::string spec : {"host", "file"}) {
    SCOPED_TRACE(spec);
    ScratchDir dir;
    const TierSpec tier_spec = TierSpec::parse(spec == "host" ? spec : "file:" + dir.path());
    constexpr size_t kBlocks = 16;
    constexpr size_t kBlock = 4 * kIoAlignment;
    // Two clients, each in its own tier at the same offsets, interleaving on the one engine.
    auto tier_a = open_slow_tier(tier_spec, kBlocks * kBlock);
    auto tier_b = open_slow_tier(tier_spec, kBlocks * kBlock);
    TransferEngine engine;
    TransferEngine::Client a(engine, /*keep_spans=*/true), b(engine, /*keep_spans=*/true);
    std::vector<AlignedBytes> out_a, out_b, in_a, in_b;
    for (size_t i = 0; i < kBlocks; ++i) {
      out_a.emplace_back(kBlock, 200 + i);
      out_b.emplace_back(kBlock, 300 + i);
      in_a.emplace_back(kBlock, 0);
      in_b.emplace_back(kBlock, 0);
    }
    std::vector<TransferEngine::Ticket> reads_a, reads_b;
    for (size_t i = 0; i < kBlocks; ++i) {
      const auto wa = a.write_async(*tier_a, i * kBlock, out_a[i].get(), kBlock, "a");
      const auto wb = b.write_async(*tier_b, i * kBlock, out_b[i].get(), kBlock, "b");
      reads_b.push_back(b.read_async(*tier_b, i * kBlock, in_b[i].get(), kBlock, "b", wb));
      reads_a.push_back(a.read_async(*tier_a, i * kBlock, in_a[i].get(), kBlock, "a", wa));
    }
    a.wait_all();
    for (const auto t : reads_a) a.wait(t);
    for (size_t i = 0; i < kBlocks; ++i) EXPECT_TRUE(in_a[i] == out_a[i]) << "a, block " << i;
    b.wait_all();
    for (size_t i = 0; i < kBlocks; ++i) EXPECT_TRUE(in_b[i] == out_b[i]) << "b, block " << i;
    // Each client's spans are its own.
    for (auto* c : {&a, &b}) {
      const auto spans = c->take_spans();
      EXPECT_EQ(spans.size(), 2 * kBlocks);
      for (const auto& span : spans) EXPECT_EQ(span.label, c == &a ? "a" : "b");
    }
  }
}

}  // namespace
}  // namespace tandem::ooc
