// The rank grid: coordinates and the communicators split from the world for each parallelism.
#include "tandem/parallel/grid.h"

#include <fmt/format.h>

#include <algorithm>

#include "tandem/core/error.h"

namespace tandem::parallel {

std::string GridShape::str() const { return fmt::format("dp={} tp={} pp={}", dp, tp, pp); }

GridOrder grid_order(const std::vector<int>& nodes) {
  for (int n : nodes)
    if (n != nodes.front()) return GridOrder::TpPpDp;
  return GridOrder::TpDpPp;
}

GridCoord grid_coord(const GridShape& s, int rank, GridOrder order) {
  TANDEM_CHECK(rank >= 0 && rank < s.size(), "rank {} outside a grid of {}", rank, s.size());
  if (order == GridOrder::TpPpDp) return {rank / (s.tp * s.pp), rank % s.tp, (rank / s.tp) % s.pp};
  return {(rank / s.tp) % s.dp, rank % s.tp, rank / (s.tp * s.dp)};
}

int grid_rank(const GridShape& s, const GridCoord& c, GridOrder order) {
  if (order == GridOrder::TpPpDp) return (c.dp * s.pp + c.pp) * s.tp + c.tp;
  return (c.pp * s.dp + c.dp) * s.tp + c.tp;
}

std::string Grid::mapping() const {
  // Nodes in the order their first rank appears.
  std::vector<int> order;
  for (int n : nodes_)
    if (std::find(order.begin(), order.end(), n) == order.end()) order.push_back(n);
  const bool aware = order_ == GridOrder::TpPpDp;
  std::string text = fmt::format(
      "rank mapping ({} node{}, {}):", order.size(), order.size() == 1 ? "" : "s",
      aware ? "tp inside a node, then pp, then dp across nodes" : "tp adjacent, then dp, then pp");
  constexpr size_t kShown = 16;  // nodes listed; a larger world ends with a count
  for (size_t i = 0; i < order.size(); ++i) {
    if (i == kShown) {
      text += fmt::format("\n    ... and {} more nodes", order.size() - kShown);
      break;
    }
    text += fmt::format("\n    node {}:", i);
    const char* sep = " ";
    for (int r = 0; r < static_cast<int>(nodes_.size()); ++r) {
      if (nodes_[r] != order[i]) continue;
      const GridCoord c = grid_coord(shape_, r, order_);
      text += fmt::format("{}rank {} (dp {} tp {} pp {})", sep, r, c.dp, c.tp, c.pp);
      sep = ", ";
    }
  }
  return text;
}

std::string Grid::warning() const {
  for (int r = 0; r < shape_.size(); r += shape_.tp) {  // the first rank of each tp group
    const GridCoord c = grid_coord(shape_, r, order_);
    std::vector<int> spans;
    for (int t = 0; t < shape_.tp; ++t) {
      const int node = nodes_[grid_rank(shape_, {c.dp, t, c.pp}, order_)];
      if (std::find(spans.begin(), spans.end(), node) == spans.end()) spans.push_back(node);
    }
    if (spans.size() > 1)
      return fmt::format(
          "warning: the tensor-parallel group of dp {} pp {} (tp={}) spans {} nodes: "
          "its all-reduce in every layer crosses the network; choose a --tp that "
          "divides the ranks per node",
          c.dp, c.pp, shape_.tp, spans.size());
  }
  return "";
}

Grid::Grid(comm::Communicator& world, GridShape shape) : world_(world), shape_(shape) {
  if (shape.dp < 1 || shape.tp < 1 || shape.pp < 1)
    user_error("the rank grid {} needs every size at least 1", shape.str());
  if (world.size() != shape.size())
    user_error("the rank grid {} needs {} ranks, but there are {}", shape.str(), shape.size(),
               world.size());
  nodes_ = world.rank_nodes();
  order_ = grid_order(nodes_);
  coord_ = grid_coord(shape, world.rank(), order_);
  const GridCoord c = coord_;
  const int tp = shape.tp, dp = shape.dp, pp = shape.pp;

  // Every rank calls every split, in the same order (each is a collective over the world).
  dp_ = world.split(c.pp * tp + c.tp, c.dp);
  tp_ = world.split(c.pp * dp + c.dp, c.tp);

  // Pipeline links: link l joins stage l (group 0) and stage l + 1 (group 1) of one dp_rank. A
  // middle stage belongs to two links, one even and one odd, so two splits cover them all, each
  // rank joining at most one link per split. Key: group 0's tp ranks first, then group 1's.
  auto link_color = [&](int link) { return link * dp + c.dp; };
  auto join = [&](int parity) -> std::unique_ptr<comm::Communicator> {
    int color = -1, key = 0;
    if (c.pp % 2 == parity && c.pp + 1 < pp) {  // sender into link c.pp
      color = link_color(c.pp);
      key = c.tp;
    } else if ((c.pp - 1) % 2 == parity && c.pp >= 1) {  // receiver from link c.pp - 1
      color = link_color(c.pp - 1);
      key = tp + c.tp;
    }
    return world.split(color, key);
  };
  even_link_ = join(0);
  odd_link_ = join(1);
  if (c.pp + 1 < pp) to_next_ = c.pp % 2 == 0 ? even_link_.get() : odd_link_.get();
  if (c.pp >= 1) from_prev_ = (c.pp - 1) % 2 == 0 ? even_link_.get() : odd_link_.get();

  // The tied embedding: first and last stage, same (dp_rank, tp_rank).
  const bool tied = pp > 1 && (c.pp == 0 || c.pp == pp - 1);
  tied_ = world.split(tied ? c.dp * tp + c.tp : -1, c.pp);
}

Grid::~Grid() = default;

}  // namespace tandem::parallel
