// The hierarchical collectives on in-process ranks grouped into nodes (TANDEM_RANKS_PER_NODE,
// forced through set_ranks_per_node): inside each node the Direct algorithm, across nodes the ring.
// Every collective, dtype, op and size (0, 1, primes, sizes that do not divide by the rank count),
// with and without the fused hook (which must still see exactly this rank's part, chunk by
// chunk), in place and not, against closed-form results and random inputs; and the grouping
// itself as rank_nodes() reports it.
#include <gtest/gtest.h>

#include <ostream>
#include <vector>

#include "comm/collective_checks.h"
#include "tandem/comm/thread.h"

namespace tandem::comm::testing {
namespace {

// p ranks in nodes of k.
struct Grouping {
  int ranks, per_node;
};

std::string grouping_name(const ::testing::TestParamInfo<Grouping>& info) {
  return fmt::format("p{}_nodes_of_{}", info.param.ranks, info.param.per_node);
}
void PrintTo(const Grouping& g, std::ostream* os) {
  *os << g.ranks << " ranks, nodes of " << g.per_node;
}

class Hierarchical : public ::testing::TestWithParam<Grouping> {
 protected:
  Hierarchical() : nodes_(GetParam().per_node), chunk_(64) {}

  void on_every_rank(const std::function<std::string(Communicator&)>& body) {
    const int p = GetParam().ranks;
    std::vector<std::string> errors(p);
    with_deadline(120, "hierarchical collective", [&] {
      run_ranks(p, [&](Communicator& comm) { errors[comm.rank()] = body(comm); });
    });
    for (int r = 0; r < p; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  }

  ScopedRanksPerNode nodes_;
  ScopedChunkBytes chunk_;
};

TEST_P(Hierarchical, RankNodes) {
  on_every_rank([&](Communicator& c) {
    std::vector<int> want;
    for (int r = 0; r < c.size(); ++r) want.push_back(r / GetParam().per_node);
    return c.rank_nodes() == want ? "" : fmt::format("rank {}: unexpected rank_nodes\n", c.rank());
  });
}

TEST_P(Hierarchical, EveryCollective) {
  on_every_rank([&](Communicator& c) {
    const CollectiveAlgo algo = CollectiveAlgo::Auto;
    std::string err;
    for (DType t : kAllDTypes)
      for (int64_t n : {0, 1, 7, 13, 1000, 4099}) {
        for (ReduceOp op : kAllOps) {
          err += all_reduce_case(c, algo, t, n, op, false);
          err += all_reduce_case(c, algo, t, n, op, true);
          err += reduce_scatter_case(c, algo, t, n, op, true, false);
          err += reduce_scatter_case(c, algo, t, n, op, false, true);
        }
        err += all_gather_case(c, algo, t, n, false);
        err += all_gather_case(c, algo, t, n, true);
        for (int root = 0; root < c.size(); ++root) err += broadcast_case(c, algo, t, n, root);
      }
    return err;
  });
}

TEST_P(Hierarchical, RandomInputsAgainstTheReference) {
  on_every_rank([&](Communicator& c) {
    std::string err;
    for (DType t : {DType::F32, DType::BF16})
      for (int64_t n : {5, 997, 10007}) err += random_case(c, t, n, 7 + static_cast<uint64_t>(n));
    return err;
  });
}

// Split groups inherit the grouping by world rank: a group of one rank from each node runs flat,
// a group of two whole nodes hierarchically.
TEST_P(Hierarchical, SplitGroups) {
  on_every_rank([&](Communicator& c) {
    auto odd_even = c.split(c.rank() % 2, c.rank());
    std::string err =
        all_reduce_case(*odd_even, CollectiveAlgo::Auto, DType::F32, 101, ReduceOp::Sum, true);
    err += random_case(*odd_even, DType::F32, 333, 3);
    return err;
  });
}

// 1-4 ranks (and 6, for 3 nodes of 2 and 2 nodes of 3); with one node, or one rank per node, the
// flat algorithms run.
INSTANTIATE_TEST_SUITE_P(Groupings, Hierarchical,
                         ::testing::Values(Grouping{1, 1}, Grouping{2, 1}, Grouping{2, 2},
                                           Grouping{3, 1}, Grouping{4, 2}, Grouping{4, 4},
                                           Grouping{6, 2}, Grouping{6, 3}),
                         grouping_name);

}  // namespace
}  // namespace tandem::comm::testing
