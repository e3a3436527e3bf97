// comm::broadcast_string: rank 0's bytes on every rank, any length (odd, empty), any rank count.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tandem/comm/thread.h"

namespace tandem::comm {
namespace {

TEST(BroadcastString, RankZerosBytesReachEveryRank) {
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

}  // namespace
}  // namespace tandem::comm
