// Dead-stage elimination: drop every stage whose value reaches no output, update or send.
// Inputs and scalars stay (they are the program's interface).
#pragma once

#include "tandem/schedule/schedule.h"

namespace tandem::schedule {

void eliminate_dead_stages(Schedule& s);

}  // namespace tandem::schedule
