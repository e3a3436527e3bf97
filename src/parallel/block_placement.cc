// The block placements' shared defaults (see block_placement.h).
#include "tandem/parallel/block_placement.h"

#include "tandem/core/error.h"

namespace tandem::parallel {

// Only a placement that keeps the blocks' moments (a store's) is asked for them.
void BlockPlacement::read_moments(int layer, float*, float*) {
  internal_error(fmt::format("block {}'s moments read from a placement without them", layer));
}

void BlockPlacement::write_moments(int layer, const float*, const float*) {
  internal_error(fmt::format("block {}'s moments written to a placement without them", layer));
}

}  // namespace tandem::parallel
