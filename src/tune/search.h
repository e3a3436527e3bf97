// The tuner's search (internal to tune/): which schedules it times, in which order (tune.h says
// why one collective at a time). tune() measures; this decides what to measure next.
#pragma once

#include <functional>
#include <string>

#include "tandem/dsl/ir.h"
#include "tandem/schedule/recipe.h"
#include "tandem/tune/tune.h"

namespace tandem::tune::detail {

// Times one schedule (nothing when a schedule of that name was timed already, or the budget is
// spent).
using TimeFn = std::function<void(schedule::NamedSchedule)>;
// The fastest schedule timed so far (the baseline when none passed its check).
using LeaderFn = std::function<const schedule::NamedSchedule&()>;

// Calls `time` on each schedule of the search in turn: the baseline and `only` when given;
// else the collectives one at a time, then the leader's overlaps at each of o.blocks.
void search(const dsl::Program& program, const TuneOptions& o, const TimeFn& time,
            const LeaderFn& leader);

// What the cache key hashes of the search (TuneKey::candidates). `only` names that do not parse
// or that the program does not allow are UserErrors here, before anything runs.
std::string search_description(const dsl::Program& program, const TuneOptions& o);

}  // namespace tandem::tune::detail
