// A training run's checkpoints: what a save writes (the run's meta, and its weights and moments
// tensor by tensor) and what a resume reads back, checked against the run's config. Internal to
// train/.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint_tensors.h"
#include "tandem/data/data.h"
#include "tandem/io/checkpoint.h"
#include "tandem/io/hf_folder.h"
#include "tandem/parallel/state_streamer.h"
#include "tandem/train/trainer.h"

namespace tandem::train {

// What a resumed run starts from, opened and checked once per process by prepare_resume (so that
// a refusal is one message rather than one per rank): the files' headers and meta.json; world
// rank 0 reads the tensors, one at a time, as the ranks restore them (restore_state).
struct ResumeState {
  io::RunMeta meta;
  std::string folder;  // the checkpoint read: a series' step folder, or resume_dir itself
  std::shared_ptr<const io::CheckpointReader> reader;
  std::vector<std::string> warnings;  // the data, batch or seed differ from the original run's
  // --init-from: the Hugging Face folder's weights (and no reader); the run starts at step 0 with
  // a fresh optimizer.
  std::shared_ptr<const io::HfWeights> init_weights;
};

namespace detail {

// The meta of this run's checkpoint after `step` steps: model, data and its position, RNG,
// optimizer and learning-rate settings, batch and grid.
io::RunMeta run_meta(const TrainConfig& config, const data::Corpus& corpus, int64_t step);

// Saves the model's weights and moments after `step` steps in the run's series (--save), one
// tensor at a time: every rank gathers each tensor, world rank 0 writes it. A tensor that is not
// finite stops the save on every rank with the series untouched. A collective over the world.
struct SaveResult {
  std::string folder;      // the step folder written
  std::string not_finite;  // else: the first tensor that is not finite, described
};
SaveResult save_state(const TrainConfig& config, const data::Corpus& corpus, int64_t step,
                      const parallel::ParallelGPT& model, parallel::DataParallelOptimizer& opt);

// This rank's weights and moments from the checkpoint `resume` opened: world rank 0 reads each
// tensor (its checksum verified; weights and moments finite, second moments not negative) and the
// ranks take their parts. A bad tensor is one UserError on every rank. A collective over the world.
void restore_state(const ResumeState& resume, const parallel::ParallelGPT& model,
                   parallel::DataParallelOptimizer& opt);

// --init-from (src/train/hf_folder.cc): the Hugging Face folder's config.json, tensor names and
// tokenizer checked against the run, as prepare_resume checks a checkpoint.
std::shared_ptr<const ResumeState> prepare_init(const TrainConfig& config);
// This rank's weights from the folder `init` opened, as restore_state restores a checkpoint's;
// the moments stay as the optimizer made them (zero). A collective over the world.
void restore_hf_weights(const ResumeState& init, const parallel::ParallelGPT& model);

}  // namespace detail
}  // namespace tandem::train
