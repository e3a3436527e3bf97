// The rank grid with a context-parallel axis: cp nests inside dp (replica = dp_rank * cp +
// cp_rank stands where the data-parallel rank stood), cp() joins the ranks that split a sequence,
// dp() the dp x cp replicas that average their gradients; a grid without cp is unchanged.
#include <gtest/gtest.h>

#include <mutex>
#include <vector>

#include "tandem/comm/thread.h"
#include "tandem/core/error.h"
#include "tandem/parallel/grid.h"

namespace tandem::parallel {
namespace {

// The world ranks of `group`'s members, in its rank order.
std::vector<int> members(comm::Communicator& group, int world_rank) {
  Tensor mine = Tensor::empty(DType::F32, Shape{1});
  mine.set(0, static_cast<float>(world_rank));
  Tensor all = Tensor::empty(DType::F32, Shape{group.size()});
  group.all_gather(mine, all);
  std::vector<int> v;
  for (int i = 0; i < all.numel(); ++i) v.push_back(static_cast<int>(all.get(i)));
  return v;
}

TEST(GridContext, CoordinatesNestCpInsideDp) {
  const GridShape s{2, 2, 2, 2};
  EXPECT_EQ(s.size(), 16);
  EXPECT_EQ(s.replicas(), 4);
  for (GridOrder order : {GridOrder::TpDpPp, GridOrder::TpPpDp})
    for (int r = 0; r < s.size(); ++r) EXPECT_EQ(grid_rank(s, grid_coord(s, r, order), order), r);
  // One node: tp adjacent, then cp, then dp, then pp.
  EXPECT_EQ(grid_coord(s, 1, GridOrder::TpDpPp), (GridCoord{0, 1, 0, 0}));
  EXPECT_EQ(grid_coord(s, 2, GridOrder::TpDpPp), (GridCoord{0, 0, 0, 1}));
  EXPECT_EQ(grid_coord(s, 4, GridOrder::TpDpPp), (GridCoord{1, 0, 0, 0}));
  EXPECT_EQ(grid_coord(s, 8, GridOrder::TpDpPp), (GridCoord{0, 0, 1, 0}));
  // Across nodes: tp, then pp, then the replicas (cp inside dp).
  EXPECT_EQ(grid_coord(s, 2, GridOrder::TpPpDp), (GridCoord{0, 0, 1, 0}));
  EXPECT_EQ(grid_coord(s, 4, GridOrder::TpPpDp), (GridCoord{0, 0, 0, 1}));
  EXPECT_EQ(grid_coord(s, 8, GridOrder::TpPpDp), (GridCoord{1, 0, 0, 0}));
  // Without cp the order and the text are what they were.
  EXPECT_EQ(grid_coord(GridShape{2, 2, 2}, 2, GridOrder::TpDpPp), (GridCoord{1, 0, 0}));
  EXPECT_EQ(GridShape({2, 2, 1}).str(), "dp=2 tp=2 pp=1");
  EXPECT_EQ(s.str(), "dp=2 tp=2 pp=2 cp=2");
}

// dp=2 tp=2 cp=2 on one node: each group's members by world rank.
TEST(GridContext, CommunicatorsJoinTheRightRanks) {
  const GridShape s{2, 2, 1, 2};
  std::mutex mu;
  std::vector<std::vector<int>> cp(8), dp(8), tp(8);
  std::vector<int> replica(8);
  std::string mapping;
  comm::run_ranks(s.size(), [&](comm::Communicator& world) {
    Grid g(world, s);
    const int r = world.rank();
    std::vector<int> c = members(g.cp(), r), d = members(g.dp(), r), t = members(g.tp(), r);
    std::lock_guard<std::mutex> lock(mu);
    cp[r] = c;
    dp[r] = d;
    tp[r] = t;
    replica[r] = g.replica();
    EXPECT_EQ(g.dp().rank(), g.replica());
    EXPECT_EQ(g.cp().rank(), g.coord().cp);
    if (r == 0) mapping = g.mapping();
  });
  EXPECT_EQ(cp[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(cp[5], (std::vector<int>{5, 7}));
  EXPECT_EQ(dp[1], (std::vector<int>{1, 3, 5, 7}));  // every replica of tp rank 1
  EXPECT_EQ(tp[6], (std::vector<int>{6, 7}));
  EXPECT_EQ(replica, (std::vector<int>{0, 0, 1, 1, 2, 2, 3, 3}));
  EXPECT_EQ(mapping,
            "rank mapping (1 node, tp adjacent, then cp, then dp, then pp):\n"
            "    node 0: rank 0 (dp 0 tp 0 pp 0 cp 0), rank 1 (dp 0 tp 1 pp 0 cp 0), rank 2 (dp 0 "
            "tp 0 pp 0 cp 1), rank 3 (dp 0 tp 1 pp 0 cp 1), rank 4 (dp 1 tp 0 pp 0 cp 0), rank 5 "
            "(dp 1 tp 1 pp 0 cp 0), rank 6 (dp 1 tp 0 pp 0 cp 1), rank 7 (dp 1 tp 1 pp 0 cp 1)");
}

// Two stages: the pipeline links and the tied embedding pair ranks of the same replica.
TEST(GridContext, PipelineLinksStayWithinAReplica) {
  const GridShape s{1, 1, 2, 2};
  std::mutex mu;
  std::vector<std::vector<int>> link(4), tied(4);
  comm::run_ranks(s.size(), [&](comm::Communicator& world) {
    Grid g(world, s);
    comm::Communicator* l = g.first_stage() ? g.to_next() : g.from_prev();
    std::vector<int> m = members(*l, world.rank()), t = members(*g.tied(), world.rank());
    std::lock_guard<std::mutex> lock(mu);
    link[world.rank()] = m;
    tied[world.rank()] = t;
  });
  // Ranks 0, 1: stage 0, cp 0 and 1; ranks 2, 3: stage 1.
  EXPECT_EQ(link[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(link[3], (std::vector<int>{1, 3}));
  EXPECT_EQ(tied[1], (std::vector<int>{1, 3}));
}

TEST(GridContext, ACpBelowOneIsRefused) {
  comm::run_ranks(1, [&](comm::Communicator& world) {
    try {
      Grid g(world, GridShape{1, 1, 1, 0});
      ADD_FAILURE() << "no error";
    } catch (const UserError& e) {
      EXPECT_STREQ(e.what(), "the rank grid dp=1 tp=1 pp=1 cp=0 needs every size at least 1");
    }
  });
}

}  // namespace
}  // namespace tandem::parallel
