// Enumeration: every legal schedule of a program reachable by the transformations, each with a
// short readable name (CoCoNeT's names: AR-C, fused(AR-C), RS-C-AG, fused(RS-C-AG), ol(MM,...)),
// derived from the program's structure and never from its name.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tandem/dsl/ir.h"
#include "tandem/schedule/schedule.h"

namespace tandem::schedule {

struct EnumerateOptions {
  // The inputs that may be stored sliced (as_slice). nullopt: the program's state, that is,
  // every input updated in place whose new value also feeds another computation (optimizer
  // moments feed the weight update; the weights, whose new value feeds nothing, are the step's
  // result and stay whole).
  std::optional<std::vector<std::string>> state;
  int blocks = 4;  // row blocks of the overlapped schedules
};

struct NamedSchedule {
  std::string name;
  Schedule schedule;
};

// Schedules in a fixed order, the unscheduled program ("AR-C" when it has an AllReduce) first.
// Schedules whose lowered plans are identical are listed once, under the first name.
std::vector<NamedSchedule> enumerate_schedules(const dsl::Program& program, const EnumerateOptions& options = {});

}  // namespace tandem::schedule
