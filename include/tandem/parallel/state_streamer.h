// The model's training state (weights and the optimizer's two moments) moved between the grid's
// shards and whole GPT-2 tensors one tensor at a time: initialisation, checkpoints and the tests'
// view of the weights never build a whole-model buffer, so a model as large as the ranks' shards
// together can be saved and restored.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "tandem/nn/gpt.h"
#include "tandem/parallel/model.h"
#include "tandem/parallel/optimizer.h"

namespace tandem::parallel {

// GPT-2's initialisation of this rank's weights: each element the value nn::gpt_init gives the
// whole model's element, computed for this rank's elements only (a block in a store written to it
// whole).
void init_weights(const ParallelGPT& model, uint64_t seed);

// Which of a checkpoint's three tensor sets: the weights, or the optimizer's first or second
// moment.
enum class StatePart { Weights, M, V };

// Whole tensors of the model's state assembled from, and spread to, the shards. Every rank of the
// world calls the same functions for the same tensors in the same order (they are collectives);
// a tensor is at most one buffer of its size on each rank, and the moments pass through at most a
// few of the optimizer's pieces at a time.
class StateStreamer {
 public:
  // `opt` null: weights only.
  StateStreamer(const ParallelGPT& model, DataParallelOptimizer* opt);
  ~StateStreamer();

  // Tensor `spec` of `part` assembled into `out` (spec.numel() floats) on every rank: each element
  // written by the one rank that owns it (the writer among tp ranks and stages; for the moments,
  // the dp rank that keeps that slice), then summed over the world.
  void gather(StatePart part, const nn::ParamSpec& spec, float* out);

  // Tensor `spec` of `part`, held whole by world rank 0 in `in` (spec.numel() floats on every
  // rank; the others' receive it), copied into this rank's shard. Moments are staged per optimizer
  // piece and written once the piece's m and v are both complete: scatter every tensor's M and V
  // (in any order of tensors), then finish().
  void scatter(StatePart part, const nn::ParamSpec& spec, float* in);
  // Checks that every piece of the moments was written (an InternalError otherwise).
  void finish();

 private:
  struct Staged;
  struct StagedBlock {
    std::vector<float> w;
    int64_t filled = 0;
  };
  const std::vector<float>& piece_state(size_t piece, StatePart part);
  // This rank's weights from local element `local` on (within one tensor): the model's buffer, or
  // the block read from the store.
  const float* local_weights(int64_t local);
  // --shard weights: this rank's slice of block l's weights (read once per block).
  const float* slice_weights(int layer);

  const ParallelGPT& model_;
  DataParallelOptimizer* opt_;
  // The piece read last (gather), its m and v.
  int64_t cached_piece_ = -1;
  std::vector<float> cached_m_, cached_v_;
  std::vector<Staged> staged_;  // scatter: per piece
  // Blocks in a store: the block read last (gather), and blocks being assembled (scatter).
  int cached_block_ = -1;
  std::vector<float> cached_block_w_;
  std::map<int, StagedBlock> staged_blocks_;
  int cached_slice_ = -1;  // --shard weights: the slice read last (gather)
  std::vector<float> cached_slice_w_;
};

// The whole model's weights in the whole-model flat layout (nn::gpt_parameter_specs), on every
// rank: for tests and tools that ask for the model in memory. A collective over the world.
std::vector<float> gather_weights(const ParallelGPT& model);

}  // namespace tandem::parallel
