// The lowered plan of a program's schedule by its enumerated name, for tests that run one named
// schedule (a test failure, and an empty plan, when the program has none of that name).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "tandem/dsl/ir.h"
#include "tandem/schedule/plan.h"
#include "tandem/schedule/recipe.h"

namespace tandem::testing {

inline schedule::Plan plan_named(const dsl::Program& p, const std::string& name) {
  return schedule::schedule_by_name(p, name).schedule.lower();
}

}  // namespace tandem::testing
