// What Recipe::apply and the enumerator ask the transformations (internal to schedule/): the
// largest legal argument of each, derived from the program's structure.
#pragma once

#include <vector>

#include "tandem/dsl/ir.h"
#include "tandem/schedule/schedule.h"

namespace tandem::schedule::detail {

// Every consumer of AllGather `ag` that reorder can move past it (with or without sends and
// their receives), in program order.
std::vector<int> movable_consumers(const dsl::Program& p, int ag, bool through_transfers);

// The largest fused stage around collective `c` (AllReduce or ReduceScatter): the computations
// on its result that can run in its hook, their side computations, the norms of inputs (or of
// this rank's part of one) over the hook's domain, and (for a ReduceScatter) the AllGathers of
// what they compute. Empty when nothing can be fused into it.
std::vector<int> fusable_into(const Schedule& s, int c);

// Element-wise computations not yet fused, grouped into the largest loops fuse accepts (each
// group has at least two stages).
std::vector<std::vector<int>> fusable_loops(const Schedule& s);

}  // namespace tandem::schedule::detail
