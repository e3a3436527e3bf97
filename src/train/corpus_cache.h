// The corpus a training run reads: data's per-process cache under the run's three settings.
// Internal to train/.
#pragma once

#include <memory>

#include "tandem/data/token_corpus.h"
#include "tandem/train/train_config.h"

namespace tandem::train::detail {

inline std::shared_ptr<const data::Corpus> corpus_for(const TrainConfig& c) {
  return data::shared_corpus(c.data, c.synthetic_bytes, c.validation_fraction);
}

}  // namespace tandem::train::detail
