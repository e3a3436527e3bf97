// The topology-aware rank grid: on two or more nodes (here forced with set_ranks_per_node, as
// TANDEM_RANKS_PER_NODE does), each tensor-parallel group sits inside a node when it fits, then
// the pipeline stages, then the data-parallel replicas across nodes; the mapping a run prints at
// start, and the warning when a tp group must span nodes.
#include <gtest/gtest.h>

#include <mutex>
#include <vector>

#include "support/cli.h"
#include "tandem/comm/thread.h"
#include "tandem/parallel/grid.h"

namespace tandem::parallel {
namespace {

struct ScopedNodes {
  explicit ScopedNodes(int k) { comm::set_ranks_per_node(k); }
  ~ScopedNodes() { comm::set_ranks_per_node(-1); }
};

TEST(GridTopology, OrderFollowsTheNodes) {
  EXPECT_EQ(grid_order({0, 0, 0, 0}), GridOrder::TpDpPp);
  EXPECT_EQ(grid_order({0, 0, 1, 1}), GridOrder::TpPpDp);
  const GridShape s{2, 2, 2};
  for (int r = 0; r < s.size(); ++r)
    EXPECT_EQ(grid_rank(s, grid_coord(s, r, GridOrder::TpPpDp), GridOrder::TpPpDp), r);
  // tp adjacent, then pp, then dp outermost.
  EXPECT_EQ(grid_coord(s, 1, GridOrder::TpPpDp), (GridCoord{0, 1, 0}));
  EXPECT_EQ(grid_coord(s, 2, GridOrder::TpPpDp), (GridCoord{0, 0, 1}));
  EXPECT_EQ(grid_coord(s, 4, GridOrder::TpPpDp), (GridCoord{1, 0, 0}));
}

// 8 ranks as 4 nodes of 2, dp=2 tp=2 pp=2: every tp group inside one node, each replica's two
// stages on two nodes, the data-parallel groups across nodes.
TEST(GridTopology, TensorParallelGroupsStayInsideANode) {
  ScopedNodes nodes(2);
  const GridShape s{2, 2, 2};
  std::mutex mu;
  std::vector<GridCoord> coords(s.size());
  std::string mapping, warning = "unset";
  comm::run_ranks(s.size(), [&](comm::Communicator& world) {
    Grid g(world, s);
    const std::vector<int> tp_nodes = [&] {
      Tensor mine = Tensor::empty(DType::F32, Shape{1});
      mine.set(0, static_cast<float>(world.rank() / 2));
      Tensor all = Tensor::empty(DType::F32, Shape{g.tp().size()});
      g.tp().all_gather(mine, all);
      std::vector<int> v;
      for (int i = 0; i < all.numel(); ++i) v.push_back(static_cast<int>(all.get(i)));
      return v;
    }();
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(g.order(), GridOrder::TpPpDp);
    EXPECT_EQ(tp_nodes, std::vector<int>(2, world.rank() / 2)) << "rank " << world.rank();
    coords[world.rank()] = g.coord();
    if (world.rank() == 0) {
      mapping = g.mapping();
      warning = g.warning();
    }
  });
  EXPECT_EQ(coords[2], (GridCoord{0, 0, 1}));
  EXPECT_EQ(coords[5], (GridCoord{1, 1, 0}));
  EXPECT_EQ(mapping,
            "rank mapping (4 nodes, tp inside a node, then pp, then dp across nodes):\n"
            "    node 0: rank 0 (dp 0 tp 0 pp 0), rank 1 (dp 0 tp 1 pp 0)\n"
            "    node 1: rank 2 (dp 0 tp 0 pp 1), rank 3 (dp 0 tp 1 pp 1)\n"
            "    node 2: rank 4 (dp 1 tp 0 pp 0), rank 5 (dp 1 tp 1 pp 0)\n"
            "    node 3: rank 6 (dp 1 tp 0 pp 1), rank 7 (dp 1 tp 1 pp 1)");
  EXPECT_EQ(warning, "");
}

TEST(GridTopology, WarnsWhenATensorParallelGroupSpansNodes) {
  ScopedNodes nodes(2);
  std::string warning;
  comm::run_ranks(4, [&](comm::Communicator& world) {
    Grid g(world, GridShape{1, 4, 1});
    if (world.rank() == 0) warning = g.warning();
  });
  EXPECT_EQ(
      warning,
      "warning: the tensor-parallel group of dp 0 pp 0 (tp=4) spans 2 nodes: its all-reduce in "
      "every layer crosses the network; choose a --tp that divides the ranks per node");
}

// One node: Megatron-LM's order, as before.
TEST(GridTopology, OneNodeKeepsMegatronsOrder) {
  std::string mapping;
  comm::run_ranks(4, [&](comm::Communicator& world) {
    Grid g(world, GridShape{2, 2, 1});
    EXPECT_EQ(g.order(), GridOrder::TpDpPp);
    if (world.rank() == 0) mapping = g.mapping();
  });
  EXPECT_EQ(
      mapping,
      "rank mapping (1 node, tp adjacent, then dp, then pp):\n"
      "    node 0: rank 0 (dp 0 tp 0 pp 0), rank 1 (dp 0 tp 1 pp 0), rank 2 (dp 1 tp 0 pp 0), "
      "rank 3 (dp 1 tp 1 pp 0)");
}

// `tandem train` prints the mapping at start, and the warning.
TEST(GridTopology, TrainPrintsTheMappingAndTheWarning) {
  const std::string train =
      "train --model tiny --steps 1 --executor plan --eval-every 0 --dp 1 --tp 2";
  auto r = tandem::testing::run_command(
      fmt::format("TANDEM_RANKS_PER_NODE=1 '{}' {}", tandem::testing::tandem_binary(), train));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(
      r.output.find("  rank mapping (2 nodes, tp inside a node, then pp, then dp across nodes):\n"
                    "    node 0: rank 0 (dp 0 tp 0 pp 0)\n    node 1: rank 1 (dp 0 tp 1 pp 0)\n"
                    "tandem train: warning: the tensor-parallel group of dp 0 pp 0 (tp=2) spans 2 "
                    "nodes"),
      std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace tandem::parallel
