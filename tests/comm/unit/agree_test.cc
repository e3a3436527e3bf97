// comm/agree.h, the ranks' agreement vocabulary: each call's result on every rank, for 1-4 ranks,
// strings of any length (odd, empty, differing between ranks), and rank 0's refusal reaching all.
#include "tandem/comm/agree.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tandem/comm/thread.h"
#include "tandem/core/error.h"

namespace tandem::comm {
namespace agree_test {

using ::testing::HasSubstr;

// A different string on each rank, of a length that differs too (rank 1's is empty).
std::string rank_text(int r) { return r == 1 ? std::string() : std::string(2 * r + 1, 'a' + r); }

TEST(Agree, BroadcastStringTakesRankZerosBytesEverywhere) {
  for (int p = 1; p <= 4; ++p)
    for (const std::string& want :
         {std::string(), std::string("a"), std::string("fused(RS-C-AG)+slice(m,v)"),
          std::string(1001, '\xff')}) {
      std::vector<std::string> got(static_cast<size_t>(p));
      run_ranks(p, [&](Communicator& c) {
        got[static_cast<size_t>(c.rank())] =
            broadcast_string(c, c.rank() == 0 ? want : "not rank 0's");
      });
      for (int r = 0; r < p; ++r)
        EXPECT_EQ(got[static_cast<size_t>(r)], want) << p << " ranks, rank " << r;
    }
}

TEST(Agree, GatheredStringsAreEveryRanksInRankOrder) {
  for (int p = 1; p <= 4; ++p) {
    std::vector<std::string> want;
    for (int r = 0; r < p; ++r) want.push_back(rank_text(r));
    std::vector<std::vector<std::string>> all(static_cast<size_t>(p)), root(all.size());
    run_ranks(p, [&](Communicator& c) {
      const auto r = static_cast<size_t>(c.rank());
      all[r] = all_gather_strings(c, rank_text(c.rank()));
      root[r] = gather_strings(c, rank_text(c.rank()));
    });
    for (int r = 0; r < p; ++r) {
      EXPECT_EQ(all[static_cast<size_t>(r)], want) << p << " ranks, rank " << r;
      EXPECT_EQ(root[static_cast<size_t>(r)], r == 0 ? want : std::vector<std::string>())
          << p << " ranks, rank " << r;
    }
  }
}

TEST(Agree, TruthMinimumAndMaximumAreTheGroups) {
  for (int p = 1; p <= 4; ++p) {
    std::vector<int> every(static_cast<size_t>(p)), one_false(every.size()), lo(every.size()),
        hi(every.size());
    run_ranks(p, [&](Communicator& c) {
      const auto r = static_cast<size_t>(c.rank());
      every[r] = all_true(c, true);
      one_false[r] = all_true(c, c.rank() != p - 1);
      lo[r] = all_min(c, 10 - 3 * c.rank());
      hi[r] = all_max(c, -c.rank() * 1000);
    });
    for (int r = 0; r < p; ++r) {
      const auto i = static_cast<size_t>(r);
      EXPECT_TRUE(every[i]);
      EXPECT_FALSE(one_false[i]);
      EXPECT_EQ(lo[i], 10 - 3 * (p - 1));
      EXPECT_EQ(hi[i], 0);
    }
  }
}

TEST(Agree, RankZeroDecidesAndItsRefusalStopsEveryRank) {
  for (int p = 1; p <= 4; ++p) {
    std::vector<std::string> got(static_cast<size_t>(p));
    std::vector<int> runs(static_cast<size_t>(p));
    run_ranks(p, [&](Communicator& c) {
      got[static_cast<size_t>(c.rank())] = decide_on_root(c, [&] {
        ++runs[static_cast<size_t>(c.rank())];
        return std::string("dp=2\nwhy: it fits");
      });
    });
    for (int r = 0; r < p; ++r) {
      EXPECT_EQ(got[static_cast<size_t>(r)], "dp=2\nwhy: it fits");
      EXPECT_EQ(runs[static_cast<size_t>(r)], r == 0 ? 1 : 0) << "only rank 0 decides";
    }
    std::vector<std::string> errors(static_cast<size_t>(p));
    run_ranks(p, [&](Communicator& c) {
      try {
        decide_on_root(c, []() -> std::string { throw UserError("no grid fits in 1 GiB"); });
      } catch (const UserError& e) {
        errors[static_cast<size_t>(c.rank())] = e.what();
      }
    });
    for (int r = 0; r < p; ++r)
      EXPECT_THAT(errors[static_cast<size_t>(r)], HasSubstr("no grid fits in 1 GiB")) << r;
  }
}

}  // namespace agree_test
}  // namespace tandem::comm
