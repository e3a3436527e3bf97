// What `tandem eval` and `tandem sample` use: the whole model a checkpoint holds, and its mean
// loss over the consecutive windows of a token sequence.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tandem/data/data.h"
#include "tandem/data/tokenizer.h"
#include "tandem/io/checkpoint.h"
#include "tandem/nn/gpt.h"

namespace tandem::train {

// The model a checkpoint holds, its weights checked tensor by tensor against its own config
// ("tensor 'h.0.ln_1.weight' is missing", "... has shape [64]; the model needs [128]"). `matmul`:
// how its linear layers and head multiply (F32, or BF16 operands with f32 accumulation: eval's
// and sample's --precision); checkpoints hold f32 weights either way.
struct LoadedModel {
  nn::GPTConfig config;
  nn::ParameterSet params;
  io::RunMeta meta;
};
LoadedModel load_model(const std::string& checkpoint_dir, DType matmul = DType::F32);

// The tokenizer a checkpoint's model reads: `given` (--tokenizer) or the one its training data
// recorded; null for a byte-level model given none. A recorded tokenizer that is gone, one whose
// SHA-256 differs from the recorded, or one whose vocabulary is not the model's is a UserError.
std::unique_ptr<data::Tokenizer> model_tokenizer(const LoadedModel& model, const std::string& given,
                                                 const std::string& checkpoint_dir);

// The mean loss of `params` over every full window of seq_len tokens of `tokens` (consecutive,
// non-overlapping), at most `max_windows` of them (0: all), `batch` windows at a time. Returns
// (mean loss, tokens scored).
std::pair<double, int64_t> evaluate_windows(const nn::ParameterSet& params,
                                            const std::vector<uint8_t>& tokens, int seq_len,
                                            int batch, int64_t max_windows);
// The same over a split's tokens (bytes or mapped shards).
std::pair<double, int64_t> evaluate_windows(const nn::ParameterSet& params,
                                            const data::TokenSplit& split, int seq_len, int batch,
                                            int64_t max_windows);

// Bits per byte of a mean loss of `loss_nats` per token, each token standing for
// `bytes_per_token` bytes of text: comparable across tokenizers (bytes: loss / ln 2).
double bits_per_byte(double loss_nats, double bytes_per_token);

}  // namespace tandem::train
