// The check that every rank of a job was started with the same training flags: run at start-up,
// before the grid's first collective, so that ranks which disagree stop at once naming the flag
// instead of hanging in set-up or training silently to a wrong result. Internal to train/.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/data/data.h"
#include "tandem/train/train_config.h"

namespace tandem::train::detail {

// The settings every rank must share, as (flag, value) pairs in a fixed order: the model, the
// grid, the optimizer and its hyper-parameters, the learning-rate schedule, seeds, steps, batch,
// the data (by its fingerprint), precision, memory budgets and tiers, the executor, the outputs
// (rank 0 alone writes them) and the collective timeout. Per-host settings (--threads, --quiet)
// are left out.
std::vector<std::pair<std::string, std::string>> agreeing_settings(const TrainConfig& config,
                                                                   const data::Corpus& corpus);

// Exchanges agreeing_settings() over `world` (a collective: every rank calls it) and, where any
// differ, throws on every rank the same comm::CollectiveError naming each flag, the ranks and
// their values: "the ranks disagree on --steps: ranks 0 and 2 give 30, rank 1 gives 40".
void check_ranks_agree(comm::Communicator& world, const TrainConfig& config,
                       const data::Corpus& corpus);

}  // namespace tandem::train::detail
