// The rank grid: coordinates and the communicators split from the world for each parallelism.
#include "tandem/parallel/grid.h"

#include <fmt/format.h>

#include "tandem/core/error.h"

namespace tandem::parallel {

std::string GridShape::str() const { return fmt::format("dp={} tp={} pp={}", dp, tp, pp); }

GridCoord grid_coord(const GridShape& s, int rank) {
  TANDEM_CHECK(rank >= 0 && rank < s.size(), "rank {} outside a grid of {}", rank, s.size());
  return {(rank / s.tp) % s.dp, rank % s.tp, rank / (s.tp * s.dp)};
}

int grid_rank(const GridShape& s, const GridCoord& c) { return (c.pp * s.dp + c.dp) * s.tp + c.tp; }

Grid::Grid(comm::Communicator& world, GridShape shape) : world_(world), shape_(shape) {
  if (shape.dp < 1 || shape.tp < 1 || shape.pp < 1)
    user_error("the rank grid {} needs every size at least 1", shape.str());
  if (world.size() != shape.size())
    user_error("the rank grid {} needs {} ranks, but there are {}", shape.str(), shape.size(),
               world.size());
  coord_ = grid_coord(shape, world.rank());
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
