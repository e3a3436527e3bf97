// One rank's part in the global batches of a grid: the rows its data-parallel rank draws (with
// context parallelism, its tokens of each: ContextSplit's positions), split into the
// micro-batches the model runs, the world's mean of the losses the ranks report, and the
// validation loss a training run reports over such batches. Internal to train/.
#pragma once

#include <cstdint>
#include <vector>

#include "tandem/data/data.h"
#include "tandem/parallel/grid.h"
#include "tandem/parallel/model.h"
#include "tandem/train/train_config.h"

namespace tandem::train::detail {

class RankBatches {
 public:
  RankBatches(const TrainConfig& config, const parallel::Grid& grid);

  int micro_batch_count() const { return micro_batches_; }  // per global batch
  int micro_rows() const { return rows_; }                  // rows of each micro-batch
  int tokens() const { return tokens_; }  // tokens of each row this rank holds: seq_len / cp

  // This rank's rows of global batch `index` of `sampler` (a training step, or a validation
  // batch): rows [d B/dp, (d+1) B/dp) for data-parallel rank d; with cp > 1, of each row the
  // tokens and targets at its context-parallel positions (ContextSplit), in that order.
  data::Batch draw(const data::BatchSampler& sampler, int64_t index) const;
  // Those rows as the micro-batches a step runs, each pointing into `rows`.
  std::vector<parallel::MicroBatch> micro_batches(const data::Batch& rows) const;
  // The mean token loss over `global_batches` global batches, given each rank's sum of its
  // micro-batches' mean losses (only the last stage's tensor-parallel rank 0 counts; the cp
  // ranks of a row hold as many tokens each, so their mean is the row's). A collective over the
  // world.
  double mean_loss(double micro_loss_sum, int64_t global_batches = 1) const;

 private:
  const parallel::Grid& grid_;
  int dp_rank_, dp_size_;
  int64_t first_row_;  // this rank's first row in the global batch
  int micro_batches_, rows_, tokens_;
  int cp_;
  std::vector<int> positions_;  // cp > 1: this rank's positions in each row
};

// The validation loss: the model's mean loss over the first eval_batches global batches of the
// validation split, drawn under a seed of their own.
// The validation split's sampler: its own seed, so that its batches never coincide with the
// training batches' offsets by construction.
data::BatchSampler validation_sampler(const data::Corpus& corpus, const TrainConfig& config);

// The mean loss of `model` over global batches 0 .. eval_batches - 1 of `validation` (forward
// only). A collective over the world.
double validation_loss(parallel::ParallelGPT& model, const RankBatches& batches,
                       const data::BatchSampler& validation, int64_t eval_batches);

}  // namespace tandem::train::detail
