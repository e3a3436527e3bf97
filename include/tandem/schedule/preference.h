// Choosing from a preference list: the first schedule name, best first, that a program allows.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/dsl/ir.h"
#include "tandem/schedule/recipe.h"

namespace tandem::schedule {

// The schedule chosen from a preference list, and its position in the list.
struct Preferred {
  NamedSchedule schedule;
  size_t index = 0;
};

// The first of `names` (best first) that `program` allows, or nullopt when it allows none: a
// well-formed name the program does not allow (a matmul overlap for a program without a matmul)
// is passed over. Every name must parse: one that does not is a UserError naming `source` (where
// the list came from: a variable, a flag, a tuning record) and the name.
std::optional<Preferred> first_allowed(const dsl::Program& program,
                                       const std::vector<std::string>& names,
                                       std::string_view source);

}  // namespace tandem::schedule
