// A checkpoint's whole model loaded for `tandem eval` and `tandem sample`, and its mean loss over
// a token sequence's consecutive windows.
#include "tandem/train/evaluate.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>

#include "checkpoint_tensors.h"
#include "tandem/core/error.h"
#include "tandem/data/data.h"
#include "tandem/train/memory_estimate.h"
#include "tandem/train/model_config.h"

namespace tandem::train {

LoadedModel load_model(const std::string& dir, DType matmul) {
  const io::CheckpointReader ck(dir, false);
  nn::GPTConfig config =
      model_config_from_json(ck.meta().model_config, "checkpoint '" + ck.folder() + "'");
  config.matmul = matmul;
  std::vector<std::string> names;
  for (const io::SafetensorsEntry& e : ck.weights().tensors()) names.push_back(e.name);
  detail::check_tensor_names(names, config, {""}, ck.weights().path());
  // Each tensor read straight into the model's own buffer: no second copy of the weights.
  LoadedModel out{config, nn::ParameterSet(config), ck.meta()};
  const detail::CheckpointTensors tensors(ck.weights());
  float* flat = out.params.flat().data_as<float>();
  std::vector<io::NamedTensor> views;
  for (const nn::ParamSpec& s : out.params.specs()) {
    tensors.read("", s, flat + s.offset);
    views.push_back({s.name, Tensor::view_of(flat + s.offset, DType::F32, s.shape)});
  }
  // A diverged model would score NaN or sample noise: say why instead.
  io::refuse_non_finite(views, ck.folder(), "weights");
  return out;
}

std::unique_ptr<data::Tokenizer> model_tokenizer(const LoadedModel& model, const std::string& given,
                                                 const std::string& checkpoint_dir) {
  const nlohmann::json& x = model.meta.extra;
  const std::string recorded = x.contains("tokenizer") && x["tokenizer"].is_string()
                                   ? x["tokenizer"].get<std::string>()
                                   : "";
  const std::string recorded_sha =
      x.contains("tokenizer_sha256") && x["tokenizer_sha256"].is_string()
          ? x["tokenizer_sha256"].get<std::string>()
          : "";
  if (given.empty() && recorded.empty()) {
    if (model.config.vocab_size == data::kByteVocab) return nullptr;
    user_error(
        "checkpoint '{}' has a vocabulary of {} tokens and names no tokenizer; give "
        "--tokenizer FILE (the tokenizer.model or tokenizer.json of its data folder)",
        checkpoint_dir, model.config.vocab_size);
  }
  if (given.empty() && !std::filesystem::exists(recorded))
    user_error(
        "checkpoint '{}' was trained with tokenizer '{}', which no longer exists; give "
        "--tokenizer FILE",
        checkpoint_dir, recorded);
  auto tok =
      std::make_unique<data::Tokenizer>(data::Tokenizer::load(given.empty() ? recorded : given));
  if (!recorded_sha.empty() && tok->sha256() != recorded_sha)
    user_error("tokenizer '{}' (SHA-256 {}) is not the one checkpoint '{}' was trained with ({})",
               tok->source(), tok->sha256(), checkpoint_dir, recorded_sha);
  if (tok->vocab_size() != model.config.vocab_size)
    user_error("tokenizer '{}' has {} tokens; the model of checkpoint '{}' has {}", tok->source(),
               tok->vocab_size(), checkpoint_dir, model.config.vocab_size);
  return tok;
}

std::pair<double, int64_t> evaluate_windows(const nn::ParameterSet& params,
                                            const std::vector<uint8_t>& tokens, int seq_len,
                                            int batch, int64_t max_windows) {
  return evaluate_windows(
      params,
      data::TokenSplit::of_bytes("the data", "all of it",
                                 std::make_shared<const std::vector<uint8_t>>(tokens)),
      seq_len, batch, max_windows);
}

std::pair<double, int64_t> evaluate_windows(const nn::ParameterSet& params,
                                            const data::TokenSplit& split, int seq_len, int batch,
                                            int64_t max_windows) {
  const nn::GPTConfig& c = params.config();
  if (seq_len < 1 || seq_len > c.max_positions)
    user_error("--seq-len {} must be in [1, {}] for this model", seq_len, c.max_positions);
  if (batch < 1) user_error("--batch {} must be at least 1", batch);
  if (split.vocab_size > c.vocab_size)
    user_error("the data's vocabulary has {} tokens; the model's has only {}", split.vocab_size,
               c.vocab_size);
  int64_t windows = data::window_count(split, seq_len);
  if (windows == 0)
    user_error("the data has {} {}; evaluation needs at least seq_len + 1 = {}", split.size(),
               split.unit, seq_len + 1);
  if (max_windows > 0) windows = std::min(windows, max_windows);
  check_eval_memory(c, static_cast<int>(std::min<int64_t>(batch, windows)), seq_len);
  double sum = 0.0;
  std::unique_ptr<nn::GPTActivations> acts;
  std::unique_ptr<nn::Workspace> ws;
  for (int64_t w = 0; w < windows; w += batch) {
    const int rows = static_cast<int>(std::min<int64_t>(batch, windows - w));
    if (!acts || acts->batch() != rows) {
      acts = std::make_unique<nn::GPTActivations>(c, rows, seq_len);
      ws = std::make_unique<nn::Workspace>(c, rows, seq_len);
    }
    const data::Batch b = data::window_batch(split, seq_len, w, rows);
    const nn::Batch nb{b.inputs.data(), b.targets.data(), rows, seq_len};
    const float loss = nn::gpt_forward(params, *acts, *ws, nb, nn::StepRng{0, 0, 0, false});
    sum += static_cast<double>(loss) * rows;  // the mean over equal-length windows
  }
  return {sum / static_cast<double>(windows), windows * seq_len};
}

double bits_per_byte(double loss_nats, double bytes_per_token) {
  TANDEM_CHECK(bytes_per_token > 0, "bytes per token {}", bytes_per_token);
  return loss_nats / std::log(2.0) / bytes_per_token;
}

}  // namespace tandem::train
