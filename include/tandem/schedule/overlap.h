// overlap: run a producer and its consumer concurrently, row block by row block: a matmul's
// finished row blocks are reduced while later blocks are still computed; a collective's
// finished blocks are sent to the next pipeline group while later blocks are still reduced.
#pragma once

#include <vector>

#include "tandem/schedule/schedule.h"

namespace tandem::schedule {

// `stages` name units (a stage stands for its whole fused stage) forming a chain, each consuming
// the previous one: matmul -> AllReduce/ReduceScatter (fused or not), and collective -> Send.
// The matching Recv in the other group, and AllGathers of sliced values made inside, join.
// Preconditions (each a UserError naming the rule): at least two units; each consumes the one
// before it; only matmuls, collectives, element-wise computations and send/recv; every blocked
// value has the same rows (dim 0), and the matmul's rows are not sliced; a sliced value made
// inside is used only inside (collectives split each block separately); no stage is in
// another overlap; blocks >= 1; no cycle.
// Returns the index of the overlap in Schedule::overlaps().
int overlap(Schedule& s, const std::vector<StageRef>& stages, int blocks = 4);

}  // namespace tandem::schedule
