// A training run's checkpoints: what a save writes (the run's meta and its whole-model weights and
// moments) and what a resume reads back, checked against the run's config. Internal to train/.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint_tensors.h"
#include "tandem/io/checkpoint.h"
#include "tandem/parallel/model_state.h"
#include "tandem/train/data.h"
#include "tandem/train/trainer.h"

namespace tandem::train {

// What a resumed run starts from, read and checked once per process by prepare_resume (so that
// every rank does not read the files, and a refusal is one message rather than one per rank).
struct ResumeState {
  io::RunMeta meta;
  std::string folder;  // the checkpoint read: a series' step folder, or resume_dir itself
  parallel::WholeModelState state;
  std::vector<std::string> warnings;  // the data, batch or seed differ from the original run's
};

namespace detail {

// The checkpoint of this run after `step` steps: its meta (model, data and its position, RNG,
// optimizer and learning-rate settings, batch and grid) and `state`'s tensors, viewed, not
// copied: `state` must outlive it.
io::Checkpoint run_checkpoint(const TrainConfig& config, const Corpus& corpus, int64_t step,
                              parallel::WholeModelState& state);

}  // namespace detail
}  // namespace tandem::train
