// The learning-rate schedule of a training run: linear warm-up to the peak, then cosine decay to
// lr * min_lr_ratio at the last step; a function of the step alone, so a resumed run follows it.
#pragma once

#include <cstdint>

#include "tandem/train/train_config.h"

namespace tandem::train {

// The learning rate of step `step` (0-based) under the warm-up + cosine schedule.
double learning_rate(const TrainConfig& config, int64_t step);

}  // namespace tandem::train
