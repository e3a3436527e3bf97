// reorder: move an AllGather past the computations that consume it. Those computations then run
// on this rank's slice (Replicated operands of the full shape are scattered, a view without
// communication; smaller ones are broadcast as before), and each of their results that is needed
// whole afterwards (by a later stage, an update, or as an output) gets its own AllGather. This is
// what makes an optimizer update cost 1/p of the work per rank.
#pragma once

#include <vector>

#include "tandem/schedule/schedule.h"

namespace tandem::schedule {

// The stages moved past are those on a path from the AllGather to any of `stages`, plus the
// element-wise side computations of the AllGather's shape that only they use (so that no
// full-size work remains, e.g. beta1 * m). Scalar arithmetic on the way stays whole; a norm or
// reduction of a moved stage includes its cross-rank part.
// Preconditions (each a UserError naming the rule): the first stage is an AllGather; every
// listed stage consumes it (directly or through other stages); every moved stage is
// element-wise, a norm or reduction, or a send/recv, of the AllGather's shape; none reads a
// Local or Partial value (those have no slice) or a value sliced along another dim; none is
// fused or overlapped yet.
// Returns the ids of the AllGathers it made (named "<stage>.ag"), in program order.
std::vector<int> reorder(Schedule& s, const StageRef& allgather,
                         const std::vector<StageRef>& stages);

}  // namespace tandem::schedule
