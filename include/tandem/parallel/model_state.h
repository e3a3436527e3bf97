// The whole model's training state (weights and the optimizer's two moments, in the whole-model
// flat layout of nn::gpt_parameter_specs) gathered from the shards of a grid and scattered back
// to them: what a checkpoint holds.
#pragma once

#include <vector>

#include "tandem/parallel/model.h"
#include "tandem/parallel/optimizer.h"

namespace tandem::parallel {

// Weights and the optimizer's moments, each in the whole-model flat layout.
struct WholeModelState {
  std::vector<float> weights, m, v;
};

// The whole model's weights assembled from every rank's shard: each tensor written by one rank
// (dp rank 0, its writer among tp ranks and stages) into a zeroed buffer, then summed over the
// world (adding zeros is exact). A collective over the world.
std::vector<float> gather_weights(const ParallelGPT& model);

// The weights as gather_weights, then the optimizer's moments likewise: each dp rank deposits the
// pieces it keeps (all of them when the state is sliced; dp rank 0's whole copy otherwise). A
// collective over the world.
WholeModelState gather_state(const ParallelGPT& model, const DataParallelOptimizer& opt);

// Copies this rank's part of `state` into the model's weights and the optimizer's moments.
void scatter_state(const WholeModelState& state, const ParallelGPT& model,
                   DataParallelOptimizer& opt);

}  // namespace tandem::parallel
