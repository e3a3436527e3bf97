// The unit graph (internal to schedule/): the stages of a scheduled program grouped into the units
// that become steps (a fused stage is one unit, every other computation its own), with the
// dependencies between units, including the anti-dependencies of in-place updates (every
// reader of an input runs before the unit that overwrites it). fuse and overlap check their
// requests against it (no cycles); lower orders the steps by it.
#pragma once

#include <map>
#include <utility>
#include <vector>

#include "tandem/dsl/ir.h"
#include "tandem/schedule/schedule.h"

namespace tandem::schedule::detail {

enum class UnitKind : uint8_t {
  Scalar,      // rank-0 arithmetic
  Loop,        // elementwise stages and updates (one, or a fused stage without a collective)
  Accumulate,  // a Norm or Reduce(all dims) on its own
  Reduce,      // a Reduce over one dim
  Matmul,
  Collective,  // a collective, with its fused computation when `fused` >= 0
  Send,
  Recv,
};

struct Unit {
  UnitKind kind = UnitKind::Loop;
  std::vector<int> stages;  // ascending
  int fused = -1;           // index in Schedule::fused()
  int collective = -1;      // Collective: the collective stage (the reducing one when fused)
  int overlap = -1;         // index in Schedule::overlaps()
  int group = dsl::kAllGroups;
};

struct UnitGraph {
  std::vector<Unit> units;
  std::vector<int> unit_of;             // stage -> unit; -1 for sources, constants and scatters
  std::vector<std::vector<int>> preds;  // unit -> the units it must follow
  // (pred, unit) -> (a stage of pred, a stage of unit) that explains the edge
  std::map<std::pair<int, int>, std::pair<int, int>> why;
};

UnitGraph build_units(const dsl::Program& p, const std::vector<FusedStage>& fused,
                      const std::vector<Overlap>& overlaps);

// The unit a stage's value comes from, looking through scatters (views); -1 for sources.
int producer_unit(const dsl::Program& p, const UnitGraph& g, int stage);

struct UnitOrder {
  std::vector<int> order;  // units in execution order (empty when cyclic)
  // When cyclic: stages s0, s1, ..., sk where each s(i+1) needs s(i) (directly, or by reading an
  // input that s(i) overwrites), s0 and sk in the same unit.
  std::vector<int> cycle;
};

// Topological order, keeping the units of one overlap and group together, ties broken by the
// smallest stage id (so that unscheduled programs run in program order).
UnitOrder order_units(const dsl::Program& p, const UnitGraph& g);

// "w1 needs trust, which needs r_norm, which is computed in the same fused stage": the cycle
// of order_units in words.
std::string describe_cycle(const dsl::Program& p, const std::vector<int>& cycle);

}  // namespace tandem::schedule::detail
