// The validation loss of the model being trained, over the validation split's batches.
#include "validation.h"

namespace tandem::train::detail {
namespace {

constexpr uint64_t kValidationSeedTag = 0x76616c69646174ull;  // "validat"

}  // namespace

data::BatchSampler validation_sampler(const data::Corpus& corpus, const TrainConfig& cfg) {
  return data::BatchSampler(corpus.validation, cfg.batch, cfg.model.seq_len,
                            cfg.seed ^ kValidationSeedTag);
}

double validation_loss(parallel::ParallelGPT& model, const RankBatches& batches,
                       const data::BatchSampler& validation, int64_t eval_batches) {
  double sum = 0.0;
  for (int64_t i = 0; i < eval_batches; ++i) {
    const data::Batch b = batches.draw(validation, i);
    sum += model.forward(batches.micro_batches(b));
  }
  return batches.mean_loss(sum, eval_batches);
}

}  // namespace tandem::train::detail
