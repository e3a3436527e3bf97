// The corpus a training run reads, built once per process and shared by its in-process ranks (the
// synthetic corpus takes a moment to generate; a file is read once). Internal to train/.
#pragma once

#include <memory>

#include "tandem/data/data.h"
#include "tandem/train/train_config.h"

namespace tandem::train::detail {

// The corpus of config.data (a shard folder, a text file split by config.validation_fraction, or
// the synthetic corpus); the same
// object for every call with the same three settings while it stays cached.
std::shared_ptr<const data::Corpus> corpus_for(const TrainConfig& config);

}  // namespace tandem::train::detail
