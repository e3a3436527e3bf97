// split: an AllReduce becomes a ReduceScatter (along dim 0) followed by an AllGather; every use
// of the AllReduce now uses the AllGather. The pair computes exactly what the AllReduce did.
#pragma once

#include "tandem/schedule/schedule.h"

namespace tandem::schedule {

// Preconditions (each a UserError naming the rule): the stage is an AllReduce; its value has at
// least one dim (a scalar has no parts); it is not yet fused or overlapped (split first).
// Returns the ids of the new ReduceScatter ("<name>.rs") and AllGather ("<name>.ag").
Schedule::SplitResult split(Schedule& s, const StageRef& allreduce);

}  // namespace tandem::schedule
