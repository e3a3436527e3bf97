// The whole model's training state (weights and the optimizer's two moments, in the whole-model
// flat layout of nn::gpt_parameter_specs) gathered from the shards of a grid and scattered back to
// them, and converted from and to a checkpoint file's named tensors. Internal to train/.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tandem/nn/gpt.h"
#include "tandem/parallel/model.h"
#include "tandem/train/optimizer.h"
#include "tandem/train/safetensors.h"

namespace tandem::train::detail {

// Weights and the optimizer's moments, each in the whole-model flat layout.
struct WholeModelState {
  std::vector<float> weights, m, v;
};

// The whole model's weights assembled from every rank's shard: each tensor written by one rank
// (dp rank 0, its writer among tp ranks and stages) into a zeroed buffer, then summed over the
// world (adding zeros is exact). A collective over the world.
std::vector<float> gather_weights(const parallel::ParallelGPT& model);

// The weights as gather_weights, then the optimizer's moments likewise: each dp rank deposits the
// pieces it keeps (all of them when the state is sliced; dp rank 0's whole copy otherwise). A
// collective over the world.
WholeModelState gather_state(const parallel::ParallelGPT& model, const DataParallelOptimizer& opt);

// Copies this rank's part of `state` into the model's weights and the optimizer's moments.
void scatter_state(const WholeModelState& state, const parallel::ParallelGPT& model,
                   DataParallelOptimizer& opt);

// The name a checkpoint file's tensor has now: older checkpoints named the embeddings "wte" and
// "wpe" (with any prefix, "m.wte"), which read as "wte.weight" and "wpe.weight"; others unchanged.
std::string legacy_tensor_name(std::string_view name);

// Refuses a checkpoint file whose tensors are not exactly the model's, each name under each of
// `prefixes` ({""} for weights, {"m.", "v."} for the optimizer's moments): one UserError naming
// `file`, the tensors the model does not have and those it needs but the file lacks.
void check_tensor_names(const std::vector<NamedTensor>& tensors, const nn::GPTConfig& c,
                        const std::vector<std::string>& prefixes, const std::string& file);

// Whole-model tensors from a checkpoint file's list (named prefix + parameter name), each checked
// for presence and shape; UserErrors name `file`.
std::vector<float> whole_from_tensors(const std::vector<NamedTensor>& tensors,
                                      const nn::GPTConfig& c, const std::string& prefix,
                                      const std::string& file);

// Views (not copies) of `whole`'s tensors, named prefix + parameter name, to write to a file.
std::vector<NamedTensor> tensor_views(std::vector<float>& whole, const nn::GPTConfig& c,
                                      const std::string& prefix);

}  // namespace tandem::train::detail
