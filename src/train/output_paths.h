// The files a run will write (--save, --metrics, --trace), checked before its first step, so that a
// bad path is refused at once instead of after hours of training. Internal to train/.
#pragma once

#include "tandem/train/train_config.h"

namespace tandem::train::detail {

// Creates the folders the outputs go in (as mkdir -p does) and proves each writable by writing
// there; a path that cannot be written is a UserError naming its flag, the path and the reason.
// On MPI only world rank 0 writes, so only it calls this.
void check_outputs(const TrainConfig& cfg);

}  // namespace tandem::train::detail
