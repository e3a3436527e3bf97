// The validation loss a training run reports: the model's mean loss over the first eval_batches
// global batches of the validation split, drawn under a seed of their own. Internal to train/.
#pragma once

#include <cstdint>

#include "rank_batches.h"
#include "tandem/data/data.h"
#include "tandem/parallel/model.h"
#include "tandem/train/train_config.h"

namespace tandem::train::detail {

// The validation split's sampler: its own seed, so that its batches never coincide with the
// training batches' offsets by construction.
data::BatchSampler validation_sampler(const data::Corpus& corpus, const TrainConfig& config);

// The mean loss of `model` over global batches 0 .. eval_batches - 1 of `validation` (forward
// only). A collective over the world.
double validation_loss(parallel::ParallelGPT& model, const RankBatches& batches,
                       const data::BatchSampler& validation, int64_t eval_batches);

}  // namespace tandem::train::detail
