// A checkpoint's whole model loaded for `tandem eval` and `tandem sample`, and its mean loss over
// a token sequence's consecutive windows.
#include "tandem/train/evaluate.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "checkpoint_tensors.h"
#include "tandem/core/error.h"
#include "tandem/train/data.h"
#include "tandem/train/memory_estimate.h"
#include "tandem/train/model_config.h"

namespace tandem::train {

LoadedModel load_model(const std::string& dir) {
  io::Checkpoint ck = io::load_checkpoint(dir, false);
  const nn::GPTConfig config =
      model_config_from_json(ck.meta.model_config, "checkpoint '" + ck.folder + "'");
  // A diverged model would score NaN or sample noise: say why instead.
  io::refuse_non_finite(ck.weights, ck.folder, "weights");
  const std::string file = ck.folder + "/" + std::string(io::kWeightsFile);
  detail::check_tensor_names(ck.weights, config, {""}, file);
  LoadedModel out{config, nn::ParameterSet(config), ck.meta};
  const std::vector<float> w = detail::whole_from_tensors(ck.weights, config, "", file);
  std::memcpy(out.params.flat().data(), w.data(), w.size() * sizeof(float));
  return out;
}

std::pair<double, int64_t> evaluate_windows(const nn::ParameterSet& params,
                                            const std::vector<uint8_t>& tokens, int seq_len,
                                            int batch, int64_t max_windows) {
  const nn::GPTConfig& c = params.config();
  if (seq_len < 1 || seq_len > c.max_positions)
    user_error("--seq-len {} must be in [1, {}] for this model", seq_len, c.max_positions);
  if (batch < 1) user_error("--batch {} must be at least 1", batch);
  TokenSplit split{"the data", "all of it", std::make_shared<const std::vector<uint8_t>>(tokens)};
  int64_t windows = window_count(split, seq_len);
  if (windows == 0)
    user_error("the data has {} bytes; evaluation needs at least seq_len + 1 = {}", tokens.size(),
               seq_len + 1);
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
    const Batch b = window_batch(split, seq_len, w, rows);
    const nn::Batch nb{b.inputs.data(), b.targets.data(), rows, seq_len};
    const float loss = nn::gpt_forward(params, *acts, *ws, nb, nn::StepRng{0, 0, 0, false});
    sum += static_cast<double>(loss) * rows;  // the mean over equal-length windows
  }
  return {sum / static_cast<double>(windows), windows * seq_len};
}

}  // namespace tandem::train
