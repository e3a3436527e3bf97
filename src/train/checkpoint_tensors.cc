// A checkpoint file's tensors checked against the model and read one at a time.
#include "checkpoint_tensors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <string_view>

#include "tandem/core/error.h"

namespace tandem::train::detail {
std::string legacy_tensor_name(std::string_view name) {
  // Some checkpoints name the embeddings as the model's fields do ("wte"), not as Hugging Face's
  // GPT-2 state dict does ("wte.weight").
  for (std::string_view stem : {"wte", "wpe"}) {
    if (name.size() >= stem.size() && name.substr(name.size() - stem.size()) == stem &&
        (name.size() == stem.size() || name[name.size() - stem.size() - 1] == '.'))
      return std::string(name) + ".weight";
  }
  return std::string(name);
}

namespace {

// "a, b and c", or the first `most` of them and "and N more".
std::string some_names(const std::vector<std::string>& names, size_t most = 6) {
  std::string out;
  const size_t shown = std::min(names.size(), most);
  for (size_t i = 0; i < shown; ++i) {
    if (i > 0) out += i + 1 == shown && shown == names.size() ? " and " : ", ";
    out += "'" + names[i] + "'";
  }
  if (shown < names.size()) out += fmt::format(" and {} more", names.size() - shown);
  return out;
}

}  // namespace

void check_tensor_names(const std::vector<std::string>& names, const nn::GPTConfig& c,
                        const std::vector<std::string>& prefixes, const std::string& file,
                        std::string_view why) {
  std::vector<std::string> want;
  for (const std::string& prefix : prefixes)
    for (const nn::ParamSpec& s : nn::gpt_parameter_specs(c)) want.push_back(prefix + s.name);
  check_tensor_names(names, want, c, file, why);
}

void check_tensor_names(const std::vector<std::string>& names,
                        const std::vector<std::string>& wanted, const nn::GPTConfig& c,
                        const std::string& file, std::string_view why) {
  const std::set<std::string, std::less<>> want(wanted.begin(), wanted.end());
  std::map<std::string, std::string, std::less<>> have;  // the name now -> the name in the file
  std::vector<std::string> extra;
  for (const std::string& name : names) {
    const auto [it, fresh] = have.emplace(legacy_tensor_name(name), name);
    if (!fresh)
      user_error("checkpoint file '{}' holds tensor '{}' twice, as '{}' and as '{}'", file,
                 it->first, it->second, name);
    if (!want.contains(it->first)) extra.push_back(name);
  }
  std::vector<std::string> missing;
  for (const std::string& name : want)
    if (!have.contains(name)) missing.push_back(name);
  if (extra.empty() && missing.empty()) return;
  std::vector<std::string> parts;
  if (!extra.empty())
    parts.push_back(fmt::format("{} tensor{} this model does not have ({})", extra.size(),
                                extra.size() == 1 ? "" : "s", some_names(extra)));
  if (!missing.empty())
    parts.push_back(fmt::format("no tensor{} {}, which this model needs",
                                missing.size() == 1 ? "" : "s", some_names(missing)));
  user_error("checkpoint file '{}' does not match its model ({} layers, d_model {}): it has {}; {}",
             file, c.n_layers, c.d_model, fmt::join(parts, ", and "), why);
}

std::vector<io::TensorSpec> checkpoint_specs(const nn::GPTConfig& c,
                                             const std::vector<std::string>& prefixes) {
  std::vector<io::TensorSpec> out;
  for (const std::string& prefix : prefixes)
    for (const nn::ParamSpec& s : nn::gpt_parameter_specs(c))
      out.push_back({prefix + s.name, DType::F32, s.shape});
  return out;
}

CheckpointTensors::CheckpointTensors(const io::SafetensorsReader& file, NameMap model_name)
    : file_(file) {
  for (size_t i = 0; i < file.tensors().size(); ++i) index_[model_name(file.tensors()[i].name)] = i;
}

void CheckpointTensors::read(const std::string& prefix, const nn::ParamSpec& spec,
                             float* out) const {
  const std::string name = prefix + spec.name;
  const auto it = index_.find(name);
  if (it == index_.end())
    user_error("checkpoint file '{}' has no tensor '{}', which this model needs", file_.path(),
               name);
  const io::SafetensorsEntry& e = file_.tensors()[it->second];
  if (!(e.shape == spec.shape))
    user_error("tensor '{}' in '{}' has shape {}; this model needs {}", name, file_.path(),
               e.shape.str(), spec.shape.str());
  if (e.dtype == DType::F32) {
    file_.read(it->second, out, static_cast<size_t>(spec.numel()) * sizeof(float));
    return;
  }
  const Tensor t = file_.read_tensor(it->second);  // 16-bit: widened element by element
  for (int64_t i = 0; i < spec.numel(); ++i) out[i] = t.get(i);
}

}  // namespace tandem::train::detail
