// The steps Recipe::try_apply runs, in order (internal to schedule/), each returning why the
// schedule does not allow it: the enumerator runs the first one alone to learn which state inputs
// a recipe can slice.
#pragma once

#include <string>
#include <vector>

#include "checked.h"
#include "tandem/schedule/recipe.h"

namespace tandem::schedule::detail {

// Split, then reorder, each collective as its part says.
Rejection apply_moves(Schedule& s, const std::vector<CollectiveRecipe>& parts);
// Store each listed input sliced.
Rejection apply_slices(Schedule& s, const std::vector<std::string>& inputs);
// Fuse each collective's consumers into it as its part says, then (when `loops`) the rest into
// loops.
Rejection apply_fusion(Schedule& s, const std::vector<CollectiveRecipe>& parts, bool loops);
// Overlap each collective with its matmul and/or send as its part says.
Rejection apply_overlaps(Schedule& s, const std::vector<CollectiveRecipe>& parts);

}  // namespace tandem::schedule::detail
