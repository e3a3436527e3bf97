// as_slice: store a Replicated input that is only ever used through its slice (optimizer
// moments after reorder) as Sliced, so that each rank keeps 1/p of it (ZeRO's saving), and drop
// the AllGather that fed its update, which becomes dead. The caller then binds and reads this
// rank's part of the input instead of the whole.
#pragma once

#include "tandem/schedule/schedule.h"

namespace tandem::schedule {

// Preconditions (each a UserError naming the rule): the stage is an input; it is Replicated with
// at least one dim; every reader takes its slice (scatter along one dim), and its update, if any,
// writes an AllGather of a value sliced along that dim. Dead stages are removed afterwards.
void as_slice(Schedule& s, const StageRef& input);

}  // namespace tandem::schedule
