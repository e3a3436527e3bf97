// fuse: run stages as one unit. (a) Consecutive element-wise computations become one loop over
// their common domain, intermediates kept in registers. (b) Computations on the result of one
// AllReduce or ReduceScatter run inside it, on each chunk as soon as it is reduced (the
// communicator's per-chunk hook), with the AllGathers of what they computed; values an AllReduce's
// hook computes on this rank's part and that are needed whole are gathered after it.
#pragma once

#include <vector>

#include "tandem/schedule/schedule.h"

namespace tandem::schedule {

// The fused stage holds the listed stages, the computations on a path between two of them, and
// the element-wise side computations of the same shape that only they use.
// Preconditions (each a UserError naming the rule): every stage is an element-wise computation
// on tensors, an update, a norm or reduction over every dim, an AllReduce or ReduceScatter, or
// an AllGather of something computed in the fused stage; at most one collective (an AllReduce,
// or a ReduceScatter with the AllGathers of its results); loop stages share one shape and
// domain (the collective's); nothing computes the collective's input; nothing uses a norm the
// same stage accumulates; no stage is in another fused stage; fusing makes no cycle.
// Returns the index of the fused stage in Schedule::fused().
int fuse(Schedule& s, const std::vector<StageRef>& stages);

}  // namespace tandem::schedule
