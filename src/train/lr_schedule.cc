// The learning rate of each step: linear warm-up, then cosine decay to lr * min_lr_ratio.
#include "tandem/train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace tandem::train {

double learning_rate(const TrainConfig& c, int64_t step) {
  if (c.warmup > 0 && step < c.warmup)
    return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup);
  const double min_lr = c.lr * c.min_lr_ratio;
  const int64_t span = c.steps - c.warmup;
  if (span <= 1) return c.lr;
  const double t =
      std::min(1.0, static_cast<double>(step - c.warmup) / static_cast<double>(span - 1));
  return min_lr + 0.5 * (c.lr - min_lr) * (1.0 + std::cos(M_PI * t));
}

}  // namespace tandem::train
