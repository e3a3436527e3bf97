// The rank grid of a parallel training run: dp x cp x tp x pp ranks, each rank's coordinates,
// and the communicators each kind of parallelism talks on (split once from the world, at set-up).
//
// Context parallelism (cp) nests inside data parallelism: the cp ranks of a data-parallel rank
// hold the same model shard and the same rows, each its part of every sequence
// (context_parallel.h). Its replica index, rep = dp_rank * cp + cp_rank (dp x cp of them), takes
// the data-parallel rank's place in the rank order, the pipeline links and the tied embedding.
//
// Rank order (GridOrder): tensor-parallel ranks are always adjacent (they talk every layer).
// - On one node, Megatron-LM's order: then the replicas (cp ranks adjacent), then pipeline stages,
//     world rank = (stage * dp * cp + rep) * tp + tp_rank                     (TpDpPp)
// - Across nodes (the world's rank_nodes() name two or more), topology-aware: each tensor-parallel
//   group inside a node when it fits, then the pipeline stages, then the replicas across nodes
//   (the gradient all-reduce, once a step, is the traffic that best stands the network):
//     world rank = (rep * pp + stage) * tp + tp_rank                          (TpPpDp)
// A tp group spans nodes when tp does not divide the ranks per node; Grid::warning() says so.
//
// Communicators, all split from the world at construction (a collective over the world):
//   dp()        the ranks holding the same shard of the model (same tp_rank and stage): the dp x
//               cp replicas, whose gradients are averaged (each cp rank's is its tokens' part);
//               the optimizer program sums gradients and slices the optimizer state over them.
//   cp()        the ranks of one context-parallel group (same dp_rank, tp_rank and stage): each
//               sequence is split over them. One rank when cp == 1.
//   tp()        the ranks of one tensor-parallel group (same replica and stage): the Megatron
//               epilogue's AllReduce.
//   to_next()   the pipeline link from this stage to the next, for this replica: 2 * tp ranks,
//               this stage's tp group first (the pipeline program's group 0), then the next
//               stage's (group 1); null on the last stage.
//   from_prev() the link from the previous stage, this rank in group 1; null on the first stage.
//   tied()      the first and the last stage's ranks with the same (replica, tp_rank): both hold
//               the tied token embedding (input embedding and LM head) and sum its gradient;
//               null when pp == 1 or on a middle stage.
#pragma once

#include <array>
#include <compare>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "tandem/comm/communicator.h"

namespace tandem::parallel {

// --stage-layers: how many layers each pipeline stage holds, in order; no counts: the even split.
// A fixed-size value, so that a grid stays a plain value that copies as bytes do; at most
// kMostStages counts (a pipeline of more stages splits evenly).
class StageLayers {
 public:
  static constexpr int kMostStages = 64;

  StageLayers() = default;
  // InternalError past kMostStages counts (the flag's parser refuses them first).
  StageLayers(std::initializer_list<int> counts) : StageLayers(std::vector<int>(counts)) {}
  StageLayers(const std::vector<int>& counts);  // implicit: a list of counts is a split

  bool empty() const { return stages_ == 0; }
  int size() const { return stages_; }
  int operator[](int stage) const { return counts_[static_cast<size_t>(stage)]; }
  const int* begin() const { return counts_.data(); }
  const int* end() const { return counts_.data() + stages_; }
  std::vector<int> counts() const { return {begin(), end()}; }
  std::string str() const;  // "3,5"; "" for the even split
  void clear() { *this = StageLayers(); }
  bool operator==(const StageLayers&) const = default;
  auto operator<=>(const StageLayers&) const = default;

 private:
  std::array<int, kMostStages> counts_{};
  int stages_ = 0;
};

struct GridShape {
  int dp = 1;
  int tp = 1;
  int pp = 1;
  int cp = 1;  // context-parallel ranks each sequence is split over
  // --stage-layers: how many layers each of the pp stages holds (pp counts, each at least 1,
  // summing to the model's layers); empty: the even split. shard.h's stage_first_layer and
  // stage_end_layer are the one reading of it.
  StageLayers stage_layers{};

  int size() const { return dp * tp * pp * cp; }
  // The ranks holding the same model shard: the gradient exchange's group, dp x cp.
  int replicas() const { return dp * cp; }
  // "dp=2 tp=2 pp=1", then " cp=2" where cp != 1 and " stage-layers=3,5" where given.
  std::string str() const;
  bool operator==(const GridShape&) const = default;
};

struct GridCoord {
  int dp = 0;
  int tp = 0;
  int pp = 0;  // the pipeline stage
  int cp = 0;
  bool operator==(const GridCoord&) const = default;
};

enum class GridOrder : uint8_t { TpDpPp, TpPpDp };

// The order for a world whose rank r sits on node nodes[r]: TpDpPp on one node, else TpPpDp.
GridOrder grid_order(const std::vector<int>& nodes);

GridCoord grid_coord(const GridShape& shape, int world_rank, GridOrder order = GridOrder::TpDpPp);
int grid_rank(const GridShape& shape, const GridCoord& coord, GridOrder order = GridOrder::TpDpPp);

class Grid {
 public:
  // Collective over `world`, whose size must be shape.size() (else a UserError naming both).
  Grid(comm::Communicator& world, GridShape shape);
  ~Grid();
  Grid(const Grid&) = delete;
  Grid& operator=(const Grid&) = delete;

  const GridShape& shape() const { return shape_; }
  const GridCoord& coord() const { return coord_; }
  GridOrder order() const { return order_; }
  // Where every rank is, node by node, for the start of a run:
  //   "rank mapping (2 nodes of 2 ranks: tp inside a node, then pp, then dp across nodes):
  //      node 0: rank 0 (dp 0 tp 0 pp 0), rank 1 (dp 0 tp 1 pp 0)
  // (each rank's cp too where cp != 1)
  //      node 1: ..."
  std::string mapping() const;
  // "" or, when some tensor-parallel group spans nodes, a warning that says which and why.
  std::string warning() const;
  // This rank's replica index, dp_rank * cp + cp_rank: its rank in dp().
  int replica() const { return coord_.dp * shape_.cp + coord_.cp; }
  bool first_stage() const { return coord_.pp == 0; }
  bool last_stage() const { return coord_.pp == shape_.pp - 1; }

  comm::Communicator& world() const { return world_; }
  comm::Communicator& dp() const { return *dp_; }
  comm::Communicator& tp() const { return *tp_; }
  comm::Communicator& cp() const { return *cp_; }
  comm::Communicator* to_next() const { return to_next_; }
  comm::Communicator* from_prev() const { return from_prev_; }
  comm::Communicator* tied() const { return tied_.get(); }

 private:
  comm::Communicator& world_;
  GridShape shape_;
  std::vector<int> nodes_;  // node of each world rank
  GridOrder order_ = GridOrder::TpDpPp;
  GridCoord coord_;
  std::unique_ptr<comm::Communicator> dp_, tp_, cp_, even_link_, odd_link_, tied_;
  comm::Communicator* to_next_ = nullptr;
  comm::Communicator* from_prev_ = nullptr;
};

}  // namespace tandem::parallel
