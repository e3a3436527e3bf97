// tandem.load_checkpoint: a checkpoint's weights (tandem's folder, or a Hugging Face export) as
// NumPy arrays, read by the code `tandem eval` and `tandem train --init-from` read them with, so
// that a damaged or missing file is refused with the same message.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "bindings.h"
#include "tandem/core/error.h"
#include "tandem/io/hf_folder.h"
#include "tandem/train/evaluate.h"

namespace tandem::python {
namespace {

namespace fs = std::filesystem;

py::array_t<float> new_array(const Shape& shape) {
  return py::array_t<float>(std::vector<py::ssize_t>(shape.dims().begin(), shape.dims().end()));
}

// tandem's checkpoint (a folder, or the newest of a --save series): its model's tensors, checked
// against its meta.json's model as `tandem eval` checks them.
py::dict tandem_weights(const std::string& path) {
  std::optional<train::LoadedModel> model;
  {
    py::gil_scoped_release nogil;
    model.emplace(train::load_model(path));
  }
  py::dict out;
  for (const auto& [name, t] : model->params.named()) {
    py::array_t<float> a = new_array(t.shape());
    std::memcpy(a.mutable_data(), t.data(), t.nbytes());
    out[py::str(name)] = std::move(a);
  }
  return out;
}

std::string same_name(std::string_view name) { return std::string(name); }

// A Hugging Face folder (config.json of GPT-2 or Llama/Qwen2, model.safetensors or its shards):
// every weight by its state-dict name (GPT-2's prefixed "transformer."; buffers left out), f32.
py::dict hf_weights(const std::string& dir) {
  const io::HfConfig config = io::read_hf_config((fs::path(dir) / "config.json").string());
  const bool gpt2 = std::holds_alternative<io::HfGpt2Config>(config);
  const io::HfWeights weights(dir, gpt2 ? io::hf_gpt2_canonical_name : same_name);
  py::dict out;
  for (const auto& [name, found] : weights.tensors()) {
    if (gpt2 ? io::hf_gpt2_is_buffer(name) : io::hf_llama_is_buffer(name)) continue;
    py::array_t<float> a = new_array(found.entry->shape);
    float* data = a.mutable_data();
    {
      py::gil_scoped_release nogil;
      weights.read(name, found.entry->shape, data);
    }
    out[py::str(name)] = std::move(a);
  }
  return out;
}

}  // namespace

void bind_checkpoint(py::module_& m) {
  m.def(
      "load_checkpoint",
      [](const py::object& path) {
        const std::string p = py::module_::import("os").attr("fspath")(path).cast<std::string>();
        // A Hugging Face folder has config.json; tandem's checkpoints and series never do.
        if (fs::exists(fs::path(p) / "config.json")) return hf_weights(p);
        return tandem_weights(p);
      },
      py::arg("path"),
      "load_checkpoint(path) -> dict[str, numpy.ndarray]\n\n"
      "The weights of a checkpoint as float32 arrays by name, in their shapes: a tandem "
      "checkpoint folder, or a --save folder (its newest), by the model's tensor names "
      "('wte.weight', 'h.0.attn.c_attn.weight', ...); or a Hugging Face folder (`tandem export "
      "--format hf`'s, or GPT-2, Llama and Qwen2 folders from the hub: config.json and "
      "model.safetensors or its shards) by its state-dict names ('transformer.wte.weight', "
      "'model.layers.0.self_attn.q_proj.weight'), bf16 and f16 widened. A missing, damaged or "
      "mismatched file raises tandem.Error with the message `tandem eval` (or `tandem train "
      "--init-from`) gives.");
}

}  // namespace tandem::python
