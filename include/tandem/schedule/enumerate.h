// Enumeration: the legal schedules of a program, as recipes (recipe.h) carried out and named
// after them (CoCoNeT's names: AR-C, fused(AR-C), RS-C-AG, fused(RS-C-AG), ol(MM,...)), derived
// from the program's structure and never from its name.
//
// The space: per collective, 4 moves (none, split, reorder, reorder past the sends) x fused into
// it or not x 4 overlaps (none, with its matmul, with its send, both); for the program, loop
// fusion (implied when any collective is fused) and slicing its state or not. With K collectives
// that is 2 x (1 + 2^K) x 16^K recipes (96 for one collective, 2560 for two), of which those the
// program allows and whose plans differ are listed: 11 for adam and lamb, 16 for
// megatron_layer, 41 for pipeline_stage. Overlaps use one block count (EnumerateOptions::blocks);
// the tuner searches the count separately (tune/tune.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tandem/dsl/ir.h"
#include "tandem/schedule/recipe.h"
#include "tandem/schedule/schedule.h"

namespace tandem::schedule {

struct EnumerateOptions {
  // The inputs that may be stored sliced (as_slice). nullopt: the program's state, that is,
  // every input updated in place whose new value also feeds another computation (optimizer
  // moments feed the weight update; the weights, whose new value feeds nothing, are the step's
  // result and stay whole). A recipe that slices stores every one of them that it can sliced.
  std::optional<std::vector<std::string>> state;
  int blocks = kDefaultBlocks;  // row blocks of the overlapped schedules
};

// The number of recipes enumerate_schedules considers for `program` (see the top), before
// legality; -1 when it does not fit in 63 bits.
int64_t recipe_space_size(const dsl::Program& program);

// Schedules in a fixed order, the unscheduled program ("AR-C" when it has an AllReduce) first.
// Schedules whose lowered plans are identical are listed once, under the first name. A recipe
// whose collectives all make the same choice is written with one part.
std::vector<NamedSchedule> enumerate_schedules(const dsl::Program& program,
                                               const EnumerateOptions& options = {});

// The same over the recipes in which only collective `k`'s part and the program-wide choices
// (loop fusion, slicing) vary, every other collective as in `base` (one part per collective):
// what the tuner times when it tunes one collective at a time.
std::vector<NamedSchedule> enumerate_collective(const dsl::Program& program,
                                                const std::vector<CollectiveRecipe>& base, size_t k,
                                                const EnumerateOptions& options = {});

}  // namespace tandem::schedule
