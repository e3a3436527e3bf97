// A checkpoint file's named tensors (GPT-2's names, tandem's for both families) checked against the
// model, and read one at a time into a float buffer. Internal to train/.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/io/safetensors.h"
#include "tandem/io/safetensors_stream.h"
#include "tandem/nn/gpt.h"

namespace tandem::train::detail {

// The model's name for a checkpoint file's tensor: the embeddings may be named "wte" and "wpe"
// (with any prefix, "m.wte"), which read as "wte.weight" and "wpe.weight"; others unchanged.
std::string legacy_tensor_name(std::string_view name);

// Refuses a checkpoint file whose tensors are not exactly the model's, each name under each of
// `prefixes` ({""} for weights, {"m.", "v."} for the optimizer's moments): one UserError naming
// `file`, the tensors the model does not have and those it needs but the file lacks, and ending
// with `why` (what such a file is).
void check_tensor_names(
    const std::vector<std::string>& names, const nn::GPTConfig& c,
    const std::vector<std::string>& prefixes, const std::string& file,
    std::string_view why = "the weights and meta.json come from different models");

// The same against the names `want` (a Hugging Face folder's, as train/hf_folder.cc lays them
// out), `file` naming what holds them.
void check_tensor_names(const std::vector<std::string>& names, const std::vector<std::string>& want,
                        const nn::GPTConfig& c, const std::string& file, std::string_view why);

// The tensors a checkpoint file holds for the model: each parameter under each prefix, f32.
std::vector<io::TensorSpec> checkpoint_specs(const nn::GPTConfig& c,
                                             const std::vector<std::string>& prefixes);

// A checkpoint file's tensors by the model's names (prefix + parameter name), each file name read
// as `model_name` maps it.
class CheckpointTensors {
 public:
  using NameMap = std::string (*)(std::string_view);
  explicit CheckpointTensors(const io::SafetensorsReader& file,  // must outlive this
                             NameMap model_name = legacy_tensor_name);
  // Tensor prefix + spec.name read whole (its checksum verified) into `out` (spec.numel()
  // floats), widened to f32 from a 16-bit file. Its absence or another shape is a UserError
  // naming the file.
  void read(const std::string& prefix, const nn::ParamSpec& spec, float* out) const;

 private:
  const io::SafetensorsReader& file_;
  std::map<std::string, size_t, std::less<>> index_;  // the model's name -> the file's entry
};

}  // namespace tandem::train::detail
