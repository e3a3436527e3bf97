// The transformations as Recipe::try_apply and the enumerator run them (internal to schedule/): on
// stage ids, each either carries itself out or leaves the schedule as it was and returns why it
// does not apply, the message the public transformation raises as a UserError.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tandem/schedule/schedule.h"

namespace tandem::schedule::detail {

// Why a transformation does not apply; nullopt when it applied.
using Rejection = std::optional<std::string>;

Rejection try_split(Schedule& s, int allreduce, Schedule::SplitResult* made = nullptr);
// `made`: the AllGathers reorder added.
Rejection try_reorder(Schedule& s, int allgather, const std::vector<int>& stages,
                      std::vector<int>* made = nullptr);
Rejection try_as_slice(Schedule& s, int input);
// `index`: the fused stage's index in Schedule::fused().
Rejection try_fuse(Schedule& s, const std::vector<int>& stages, int* index = nullptr);
// `index`: the overlap's index in Schedule::overlaps().
Rejection try_overlap(Schedule& s, const std::vector<int>& stages, int blocks,
                      int* index = nullptr);

// The fused stage (with its closure) fuse would add for `stages`, or why there is none; the
// schedule is not changed.
Rejection check_fuse(const Schedule& s, std::vector<int> stages, const std::string& who,
                     FusedStage& out);

}  // namespace tandem::schedule::detail
