// A checkpoint file's tensors checked against the model, read into and viewed from the whole-model
// flat layout.
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
namespace {

Tensor f32_view(float* p, Shape s) { return Tensor::view_of(p, DType::F32, std::move(s)); }

}  // namespace

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

void check_tensor_names(const std::vector<io::NamedTensor>& tensors, const nn::GPTConfig& c,
                        const std::vector<std::string>& prefixes, const std::string& file) {
  std::set<std::string, std::less<>> want;
  for (const std::string& prefix : prefixes)
    for (const nn::ParamSpec& s : nn::gpt_parameter_specs(c)) want.insert(prefix + s.name);
  std::map<std::string, std::string, std::less<>> have;  // the name now -> the name in the file
  std::vector<std::string> extra;
  for (const io::NamedTensor& t : tensors) {
    const auto [it, fresh] = have.emplace(legacy_tensor_name(t.name), t.name);
    if (!fresh)
      user_error("checkpoint file '{}' holds tensor '{}' twice, as '{}' and as '{}'", file,
                 it->first, it->second, t.name);
    if (!want.contains(it->first)) extra.push_back(t.name);
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
  user_error(
      "checkpoint file '{}' does not match its model ({} layers, d_model {}): it has {}; "
      "the weights and meta.json come from different models",
      file, c.n_layers, c.d_model, fmt::join(parts, ", and "));
}

std::vector<float> whole_from_tensors(const std::vector<io::NamedTensor>& tensors,
                                      const nn::GPTConfig& c, const std::string& prefix,
                                      const std::string& file) {
  std::map<std::string, const Tensor*, std::less<>> by_name;
  for (const io::NamedTensor& t : tensors) by_name[legacy_tensor_name(t.name)] = &t.tensor;
  std::vector<float> whole(static_cast<size_t>(nn::gpt_num_parameters(c)));
  for (const nn::ParamSpec& s : nn::gpt_parameter_specs(c)) {
    const std::string name = prefix + s.name;
    auto it = by_name.find(name);
    if (it == by_name.end())
      user_error("checkpoint file '{}' has no tensor '{}', which this model needs", file, name);
    const Tensor& t = *it->second;
    if (!(t.shape() == s.shape))
      user_error("tensor '{}' in '{}' has shape {}; this model needs {}", name, file,
                 t.shape().str(), s.shape.str());
    if (t.dtype() == DType::F32) {
      std::memcpy(whole.data() + s.offset, t.data(),
                  static_cast<size_t>(s.numel()) * sizeof(float));
    } else {
      for (int64_t i = 0; i < s.numel(); ++i) whole[static_cast<size_t>(s.offset + i)] = t.get(i);
    }
  }
  return whole;
}

std::vector<io::NamedTensor> tensor_views(std::vector<float>& whole, const nn::GPTConfig& c,
                                          const std::string& prefix) {
  std::vector<io::NamedTensor> out;
  for (const nn::ParamSpec& s : nn::gpt_parameter_specs(c))
    out.push_back({prefix + s.name, f32_view(whole.data() + s.offset, s.shape)});
  return out;
}

}  // namespace tandem::train::detail
