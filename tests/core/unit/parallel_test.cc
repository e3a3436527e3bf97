// parallel_for / parallel_parts: every index covered exactly once, at any width; errors reach the
// caller after every part finished; nested regions run serially; teams are per calling thread.
#include "tandem/core/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "tandem/core/blas.h"

namespace tandem {
namespace {

// Runs the test body at BLAS width `w`, restoring the old width after.
struct Width {
  int old;
  explicit Width(int w) : old(blas::num_threads()) { blas::set_num_threads(w); }
  ~Width() { blas::set_num_threads(old); }
};

TEST(Parallel, EveryIndexOnceAtAnyWidthAndGrain) {
  for (int w : {1, 2, 3}) {
    Width width(w);
    for (int64_t n : {0, 1, 7, 1000, 100003})
      for (int64_t grain : {1, 64, 1 << 20}) {
        std::vector<int> hits(static_cast<size_t>(n), 0);
        parallel_for(n, grain, [&](int64_t b, int64_t e) {
          ASSERT_LE(0, b);
          ASSERT_LT(b, e);
          ASSERT_LE(e, n);
          for (int64_t i = b; i < e; ++i) ++hits[static_cast<size_t>(i)];
        });
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(hits[static_cast<size_t>(i)], 1) << "n " << n << " i " << i;
      }
  }
}

TEST(Parallel, PartsRunOnDistinctThreadsAndAllFinish) {
  Width width(2);
  std::vector<std::thread::id> ids(4);
  std::atomic<int> done{0};
  parallel_parts(4, [&](int part) {
    ids[static_cast<size_t>(part)] = std::this_thread::get_id();
    ++done;
  });
  EXPECT_EQ(done.load(), 4);
  EXPECT_EQ(ids[0], std::this_thread::get_id());  // part 0 runs on the caller
  EXPECT_NE(ids[1], ids[0]);
}

TEST(Parallel, AnExceptionReachesTheCallerAfterEveryPart) {
  Width width(2);
  std::atomic<int> finished{0};
  EXPECT_THROW(parallel_parts(3,
                              [&](int part) {
                                if (part == 1) throw std::runtime_error("part 1 failed");
                                ++finished;
                              }),
               std::runtime_error);
  EXPECT_EQ(finished.load(), 2);
  // The team is still usable.
  std::atomic<int> again{0};
  parallel_parts(3, [&](int) { ++again; });
  EXPECT_EQ(again.load(), 3);
}

TEST(Parallel, NestedRegionsRunSerially) {
  Width width(2);
  std::atomic<int> inner{0};
  parallel_parts(2, [&](int) {
    parallel_for(10, 1, [&](int64_t b, int64_t e) { inner += static_cast<int>(e - b); });
  });
  EXPECT_EQ(inner.load(), 20);
}

TEST(Parallel, EachCallingThreadHasItsOwnTeam) {
  Width width(2);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 3; ++t)
    callers.emplace_back([&] {
      for (int r = 0; r < 50; ++r)
        parallel_for(1000, 1, [&](int64_t b, int64_t e) { total += e - b; });
    });
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(total.load(), 3 * 50 * 1000);
}

}  // namespace
}  // namespace tandem
