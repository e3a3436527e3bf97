// Lowering: a Schedule into its Plan, by a short linear pipeline of passes (units, order,
// storage, steps), each timed and, with TANDEM_DEBUG_IR=1, printed.
#pragma once

#include "tandem/schedule/plan.h"
#include "tandem/schedule/schedule.h"

namespace tandem::schedule {

Plan lower(const Schedule& s);

}  // namespace tandem::schedule
