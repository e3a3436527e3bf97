// The fast-tier arena: a shrunk budget gives the pages past it back to the system (a run whose
// profile passes touched the whole arena before the model state took part of the budget must not
// keep them resident).
#include "tandem/ooc/arena.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <vector>

namespace tandem::ooc {
namespace {

// How many of the pages of [p, p + bytes) are resident.
size_t resident_pages(const char* p, uint64_t bytes) {
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in((bytes + page - 1) / page);
  EXPECT_EQ(mincore(const_cast<char*>(p), bytes, in.data()), 0);
  size_t n = 0;
  for (unsigned char c : in) n += c & 1;
  return n;
}

TEST(Arena, ShrinkingReleasesThePagesPastTheNewBudget) {
  constexpr uint64_t kMiB = 1 << 20;
  Arena arena(16 * kMiB);
  char* all = arena.acquire(0, 16 * kMiB, "everything");
  std::memset(all, 1, 16 * kMiB);
  ASSERT_EQ(resident_pages(all, 16 * kMiB) * sysconf(_SC_PAGESIZE), 16 * kMiB);
  arena.release(0);
  arena.shrink(4 * kMiB);
  EXPECT_EQ(arena.budget(), 4 * kMiB);
  EXPECT_EQ(resident_pages(all + 4 * kMiB, 12 * kMiB), 0u);
  EXPECT_EQ(resident_pages(all, 4 * kMiB) * sysconf(_SC_PAGESIZE), 4 * kMiB)
      << "the pages within the budget keep their contents";
  EXPECT_EQ(all[4 * kMiB - 1], 1);
}

}  // namespace
}  // namespace tandem::ooc
