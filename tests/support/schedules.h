// The lowered plan of a program's schedule by its enumerated name, for tests that run one named
// schedule (a test failure, and an empty plan, when the program has none of that name).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "tandem/dsl/ir.h"
#include "tandem/schedule/enumerate.h"
#include "tandem/schedule/plan.h"

namespace tandem::testing {

inline schedule::Plan plan_named(const dsl::Program& p, const std::string& name) {
  for (const schedule::NamedSchedule& ns : schedule::enumerate_schedules(p))
    if (ns.name == name) return ns.schedule.lower();
  ADD_FAILURE() << "no schedule " << name << " of " << p.name();
  return {};
}

}  // namespace tandem::testing
