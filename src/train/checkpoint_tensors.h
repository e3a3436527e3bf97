// A checkpoint file's named tensors (Hugging Face's GPT-2 names) checked against the model and
// converted from and to the whole-model flat layout of nn::gpt_parameter_specs. Internal to train/.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tandem/io/safetensors.h"
#include "tandem/nn/gpt.h"

namespace tandem::train::detail {

// The model's name for a checkpoint file's tensor: the embeddings may be named "wte" and "wpe"
// (with any prefix, "m.wte"), which read as "wte.weight" and "wpe.weight"; others unchanged.
std::string legacy_tensor_name(std::string_view name);

// Refuses a checkpoint file whose tensors are not exactly the model's, each name under each of
// `prefixes` ({""} for weights, {"m.", "v."} for the optimizer's moments): one UserError naming
// `file`, the tensors the model does not have and those it needs but the file lacks.
void check_tensor_names(const std::vector<io::NamedTensor>& tensors, const nn::GPTConfig& c,
                        const std::vector<std::string>& prefixes, const std::string& file);

// Whole-model tensors from a checkpoint file's list (named prefix + parameter name), each checked
// for presence and shape; UserErrors name `file`.
std::vector<float> whole_from_tensors(const std::vector<io::NamedTensor>& tensors,
                                      const nn::GPTConfig& c, const std::string& prefix,
                                      const std::string& file);

// Views (not copies) of `whole`'s tensors, named prefix + parameter name, to write to a file.
std::vector<io::NamedTensor> tensor_views(std::vector<float>& whole, const nn::GPTConfig& c,
                                          const std::string& prefix);

}  // namespace tandem::train::detail
