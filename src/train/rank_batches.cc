// A rank's rows of each global batch, its micro-batches, the world's mean loss, and the
// validation loss.
#include "rank_batches.h"

#include "tandem/core/tensor.h"
#include "tandem/parallel/context_parallel.h"

namespace tandem::train::detail {

RankBatches::RankBatches(const TrainConfig& cfg, const parallel::Grid& grid)
    : grid_(grid),
      dp_rank_(grid.coord().dp),
      dp_size_(cfg.grid.dp),
      first_row_(static_cast<int64_t>(grid.coord().dp) * (cfg.batch / cfg.grid.dp)),
      micro_batches_(cfg.micro_batch_count()),
      rows_(static_cast<int>(cfg.batch / cfg.grid.dp / micro_batches_)),
      tokens_(cfg.model.seq_len / cfg.grid.cp),
      cp_(cfg.grid.cp) {
  if (cp_ > 1)
    positions_ = parallel::ContextSplit(cfg.model.seq_len, cp_, grid.coord().cp).positions();
}

data::Batch RankBatches::draw(const data::BatchSampler& sampler, int64_t index) const {
  data::Batch rows = sampler.rank_share(index, dp_rank_, dp_size_);
  if (cp_ == 1) return rows;
  // Every rank of the cp group draws the same rows (the sampler is a pure function) and keeps
  // its tokens of each.
  data::Batch mine;
  mine.rows = rows.rows;
  mine.seq_len = tokens_;
  mine.inputs.reserve(static_cast<size_t>(rows.rows) * static_cast<size_t>(tokens_));
  mine.targets.reserve(mine.inputs.capacity());
  for (int64_t r = 0; r < rows.rows; ++r) {
    const size_t at = static_cast<size_t>(r) * static_cast<size_t>(rows.seq_len);
    for (int t : positions_) {
      mine.inputs.push_back(rows.inputs[at + static_cast<size_t>(t)]);
      mine.targets.push_back(rows.targets[at + static_cast<size_t>(t)]);
    }
  }
  return mine;
}

std::vector<parallel::MicroBatch> RankBatches::micro_batches(const data::Batch& b) const {
  std::vector<parallel::MicroBatch> out;
  for (int k = 0; k < micro_batches_; ++k) {
    const size_t at =
        static_cast<size_t>(k) * static_cast<size_t>(rows_) * static_cast<size_t>(tokens_);
    out.push_back({b.inputs.data() + at, b.targets.data() + at, rows_, tokens_,
                   first_row_ + static_cast<int64_t>(k) * rows_});
  }
  return out;
}

// Each last-stage rank of tp rank 0 contributes its share; the sum over the world is the mean.
// A row's cp ranks hold as many of its tokens each: their mean loss is the row's.
double RankBatches::mean_loss(double micro_loss_sum, int64_t global_batches) const {
  const double contribution =
      micro_loss_sum / (static_cast<double>(micro_batches_) * dp_size_ * cp_ * global_batches);
  const bool counts = grid_.last_stage() && grid_.coord().tp == 0;
  float v = counts ? static_cast<float>(contribution) : 0.0f;
  grid_.world().all_reduce(Tensor::view_of(&v, DType::F32, Shape{1}), comm::ReduceOp::Sum);
  return v;
}

namespace {

constexpr uint64_t kValidationSeedTag = 0x76616c69646174ull;  // "validat"

}  // namespace

data::BatchSampler validation_sampler(const data::Corpus& corpus, const TrainConfig& cfg) {
  return data::BatchSampler(corpus.validation, cfg.batch, cfg.model.seq_len,
                            cfg.seed ^ kValidationSeedTag);
}

double validation_loss(parallel::ParallelGPT& model, const RankBatches& batches,
                       const data::BatchSampler& validation, int64_t eval_batches) {
  double sum = 0.0;
  for (int64_t i = 0; i < eval_batches; ++i) {
    const data::Batch b = batches.draw(validation, i);
    sum += model.forward(batches.micro_batches(b));
  }
  return batches.mean_loss(sum, eval_batches);
}

}  // namespace tandem::train::detail
