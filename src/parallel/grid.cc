// The rank grid: coordinates and the communicators split from the world for each parallelism.
#include "tandem/parallel/grid.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "tandem/core/error.h"

namespace tandem::parallel {

StageLayers::StageLayers(const std::vector<int>& counts) {
  TANDEM_CHECK(counts.size() <= static_cast<size_t>(kMostStages),
               "a split of {} stages; at most {}", counts.size(), kMostStages);
  std::copy(counts.begin(), counts.end(), counts_.begin());
  stages_ = static_cast<int>(counts.size());
}

std::string StageLayers::str() const { return fmt::format("{}", fmt::join(*this, ",")); }

std::string GridShape::str() const {
  std::string text = fmt::format("dp={} tp={} pp={}", dp, tp, pp);
  if (cp != 1) text += fmt::format(" cp={}", cp);  // the text of grids without cp unchanged
  if (!stage_layers.empty()) text += " stage-layers=" + stage_layers.str();
  return text;
}

GridOrder grid_order(const std::vector<int>& nodes) {
  for (int n : nodes)
    if (n != nodes.front()) return GridOrder::TpPpDp;
  return GridOrder::TpDpPp;
}

// The replica index (dp_rank * cp + cp_rank) stands where the data-parallel rank stood.
GridCoord grid_coord(const GridShape& s, int rank, GridOrder order) {
  TANDEM_CHECK(rank >= 0 && rank < s.size(), "rank {} outside a grid of {}", rank, s.size());
  const int reps = s.replicas();
  const int rep = order == GridOrder::TpPpDp ? rank / (s.tp * s.pp) : (rank / s.tp) % reps;
  const int stage = order == GridOrder::TpPpDp ? (rank / s.tp) % s.pp : rank / (s.tp * reps);
  return {rep / s.cp, rank % s.tp, stage, rep % s.cp};
}

int grid_rank(const GridShape& s, const GridCoord& c, GridOrder order) {
  const int rep = c.dp * s.cp + c.cp;
  if (order == GridOrder::TpPpDp) return (rep * s.pp + c.pp) * s.tp + c.tp;
  return (c.pp * s.replicas() + rep) * s.tp + c.tp;
}

std::string Grid::mapping() const {
  // Nodes in the order their first rank appears.
  std::vector<int> order;
  for (int n : nodes_)
    if (std::find(order.begin(), order.end(), n) == order.end()) order.push_back(n);
  const bool aware = order_ == GridOrder::TpPpDp;
  const bool cp = shape_.cp != 1;
  std::string text = fmt::format(
      "rank mapping ({} node{}, {}):", order.size(), order.size() == 1 ? "" : "s",
      aware ? (cp ? "tp inside a node, then pp, then cp and dp across nodes"
                  : "tp inside a node, then pp, then dp across nodes")
            : (cp ? "tp adjacent, then cp, then dp, then pp" : "tp adjacent, then dp, then pp"));
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
      text += fmt::format("{}rank {} (dp {} tp {} pp {}{})", sep, r, c.dp, c.tp, c.pp,
                          cp ? fmt::format(" cp {}", c.cp) : std::string());
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
      const int node = nodes_[grid_rank(shape_, {c.dp, t, c.pp, c.cp}, order_)];
      if (std::find(spans.begin(), spans.end(), node) == spans.end()) spans.push_back(node);
    }
    if (spans.size() > 1)
      return fmt::format(
          "warning: the tensor-parallel group of dp {} pp {}{} (tp={}) spans {} nodes: "
          "its all-reduce in every layer crosses the network; choose a --tp that "
          "divides the ranks per node",
          c.dp, c.pp, shape_.cp != 1 ? fmt::format(" cp {}", c.cp) : std::string(), shape_.tp,
          spans.size());
  }
  return "";
}

Grid::Grid(comm::Communicator& world, GridShape shape) : world_(world), shape_(shape) {
  if (shape.dp < 1 || shape.tp < 1 || shape.pp < 1 || shape.cp < 1)
    user_error("the rank grid {} needs every size at least 1", shape.str());
  if (world.size() != shape.size())
    user_error("the rank grid {} needs {} ranks, but there are {}", shape.str(), shape.size(),
               world.size());
  nodes_ = world.rank_nodes();
  order_ = grid_order(nodes_);
  coord_ = grid_coord(shape, world.rank(), order_);
  const GridCoord c = coord_;
  const int tp = shape.tp, reps = shape.replicas(), pp = shape.pp, rep = replica();

  // Every rank calls every split, in the same order (each is a collective over the world).
  dp_ = world.split(c.pp * tp + c.tp, rep);
  tp_ = world.split(c.pp * reps + rep, c.tp);
  cp_ = world.split((c.pp * shape.dp + c.dp) * tp + c.tp, c.cp);

  // Pipeline links: link l joins stage l (group 0) and stage l + 1 (group 1) of one dp_rank. A
  // middle stage belongs to two links, one even and one odd, so two splits cover them all, each
  // rank joining at most one link per split. Key: group 0's tp ranks first, then group 1's.
  auto link_color = [&](int link) { return link * reps + rep; };
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

  // The tied embedding: first and last stage, same (replica, tp_rank).
  const bool tied = pp > 1 && (c.pp == 0 || c.pp == pp - 1);
  tied_ = world.split(tied ? rep * tp + c.tp : -1, c.pp);
}

Grid::~Grid() = default;

}  // namespace tandem::parallel
