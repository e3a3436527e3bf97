// One rank's model state and its one owner: where each part of the rank's shard (its weights,
// gradients and the optimizer's moments) lives, and how it moves. The model reads weights and
// writes gradients through it; the data-parallel optimizer updates through it; checkpoints read
// and write through it. The weights and gradients are one flat local buffer each (ShardLayout
// order, from the data-parallel group's allocator, since its programs read and write them in
// place); the transformer blocks' state is placed by one BlockPlacement (block_placement.h):
//   - in memory: the blocks are ranges of the flat buffers;
//   - --model-state host|file:DIR: every block's weights, gradients and moments in a slow tier,
//     streamed through a few slots (block_store.h); the flat buffers' block ranges are then
//     reserved address space only, and the embeddings and ln_f stay there;
//   - --shard weights: every block's weights and moments sliced over the data-parallel ranks, the
//     whole weights gathered into a few slots before use, the gradients in slots until the update
//     (ZeRO-3, sharded_blocks.h; the embeddings and ln_f stay whole, their moments sliced, as
//     under ZeRO-1); with --model-state too, the slices streamed from its tier.
// The moments no placement keeps are one object too: in memory, one buffer per optimizer piece,
// or (--optimizer-state host|file:DIR) in a slow tier, staged piece by piece through two slots
// (KARMA's update beside the slow tier; src/parallel/tiered_state.h). Both objects are chosen once
// (the in-memory blocks at construction, the rest at place_moments), and every call below goes
// through them, so that neither the model nor the optimizer knows which placement holds what.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/core/allocator.h"
#include "tandem/core/serial_worker.h"
#include "tandem/core/tensor.h"
#include "tandem/exec/runner.h"
#include "tandem/ooc/slow_tier.h"
#include "tandem/ooc/transfer_engine.h"
#include "tandem/parallel/block_placement.h"
#include "tandem/parallel/block_store.h"
#include "tandem/parallel/program_runner.h"
#include "tandem/parallel/shard.h"

namespace tandem::parallel {
namespace detail {
class Moments;
}  // namespace detail

class ModelState {
 public:
  struct Options {
    // --model-state: the blocks' weights, gradients and moments in this tier.
    std::optional<ooc::TierSpec> blocks;
    // --optimizer-state: every piece's moments in this tier (not with `blocks`).
    std::optional<ooc::TierSpec> moments;
    int micro_batches = 1;  // a step's; the store keeps gradient sums between them
    // --shard weights: the blocks' weights and moments sliced over the data-parallel ranks (not
    // with `moments`), gathered by gather_weights with these schedules (the autotuner's choice
    // and chunk size; empty: "C" at the process's chunk size).
    bool sharded = false;
    SchedulePreferences gather_schedules;
    // --gather-ahead: how many blocks ahead of the one computing the sharded state gathers (its
    // prefetch distance D, at least 1), into D + 1 gather slots.
    int gather_ahead = 1;
    // `blocks`' bandwidth, measured above this layer (perf/tier_bandwidth.h): what the store's
    // predictions time its traffic at (BlockStore::bandwidth).
    ooc::TierBandwidth blocks_bandwidth;
  };

  // The state of `layout`'s shard, its weights and gradients zeroed (the moments come with
  // place_moments). `allocator` null: the default. `engines`: the run's transfer engine of each
  // tier, which the tiers' transfers go through (it must outlive the state); null: its own.
  ModelState(ShardLayout layout, const Options& options, Allocator* allocator = nullptr,
             ooc::TransferEngines* engines = nullptr);
  ~ModelState();
  ModelState(const ModelState&) = delete;
  ModelState& operator=(const ModelState&) = delete;

  const ShardLayout& layout() const { return layout_; }
  const Options& options() const { return options_; }
  // The flat local buffers (layout().size() floats each). With the blocks in a store, only the
  // embeddings' and ln_f's elements are memory; the blocks' are never touched.
  Tensor params() const { return params_; }
  Tensor grads() const { return grads_; }
  bool blocks_in_store() const { return options_.blocks.has_value(); }
  bool weights_sharded() const { return options_.sharded; }
  // Whether the blocks live outside the flat buffers (in a store, or sharded): each block is then
  // an optimizer piece of its own, and the flat buffers' block ranges are reserved address space.
  bool blocks_elsewhere() const { return blocks_in_store() || weights_sharded(); }
  // The blocks' store (--model-state), once place_moments opened it; else null.
  BlockStore* store() const { return blocks_ != nullptr ? blocks_->store() : nullptr; }
  // Bytes of params() (or grads()) in memory: all of it, or without the blocks in a store.
  size_t resident_bytes() const;
  // Zeroes the gradients before a step (the store's are zeroed when first written).
  void zero_gradients();

  // Compute's use of block l's weights (its local elements, in layout order), held until
  // release_block(l): in the flat buffer, read from the store, or gathered from the data-parallel
  // ranks' slices. prefetch_blocks(in_use, direction) starts bringing early the blocks that
  // follow block `in_use` (the one about to compute) in `direction` (+1 the forward, -1 the
  // backward): the store the next one; a sharded state `in_use` itself and the next gather_ahead,
  // nearest first (a layer outside the stage's blocks is ignored).
  float* acquire_block(int layer);
  void release_block(int layer);
  void prefetch_blocks(int in_use, int direction);
  // Block l's gradients for this step (accumulated into by its backwards until its update).
  float* block_gradients(int layer);
  // The store's gradient parking between a step's backwards, and its read-aheads (no-ops for the
  // other placements; block_store.h says what they do).
  void park_gradients(int layer);
  void prefetch_gradients(int layer);
  void prefetch_moments(int layer);
  // A backward without an update (the out-of-core profile's): the blocks' gradients are let go.
  void drop_gradients();

  // Outside a step: block l's whole weights written (initialisation, checkpoints: the store keeps
  // them, a sharded state its slice), or read (from a store only).
  void write_block_weights(int layer, const float* in);
  void read_block_weights(int layer, float* out);
  // --shard weights: the local elements [first, second) of block l this rank keeps, and (outside
  // a step) their weights copied out.
  std::pair<int64_t, int64_t> weight_slice(int layer) const;
  void read_weight_slice(int layer, float* out);

  // The optimizer's pieces: piece i is the segment of local elements [segment_begin, segment_end)
  // its program updates, of which this rank keeps the moments of [begin, end) (its slice, when
  // the moments are sliced over the data-parallel ranks); `block` >= 0 when the segment is that
  // block, whose state the store holds (every block is one with --model-state).
  struct Piece {
    int64_t segment_begin = 0, segment_end = 0;
    int64_t begin = 0, end = 0;
    int block = -1;
  };
  // The data-parallel group a sharded state gathers over: its communicator, its communication
  // thread (null: none; the gathers run when needed), the executor of the gather program.
  struct Group {
    comm::Communicator* dp = nullptr;
    SerialWorker* thread = nullptr;
    exec::RunnerKind executor = exec::RunnerKind::Compiled;
  };
  // Places every piece's moments (zero: Adam's start) where they live: in memory, in the
  // moments' tier, or for the blocks in the store, which opens now (its tier's bytes reserved: a
  // full disk or an unwritable folder is a UserError naming the flag, the folder and the bytes).
  // A sharded state sets up its slices and gathers on `group` (required) now (a collective over
  // it). Once.
  void place_moments(std::vector<Piece> pieces, const Group* group = nullptr);
  // The group's communication thread is going: the gathers queued on it finish, later ones run
  // on the caller's thread.
  void detach_thread();
  const std::vector<Piece>& pieces() const { return pieces_; }

  // A step's updates. begin_step before the first; begin_update(i) gives piece i's segment's
  // weights and gradients and its moments (read from a tier or the store when they live there),
  // held until end_update(i), which writes them back where they live. The tiered moments are
  // staged in piece order: update pieces 0, 1, 2, ... (each at most once a step). finish_step
  // waits for the write-backs.
  using Update = BlockPlacement::Update;
  void begin_step();
  Update begin_update(size_t piece);
  void end_update(size_t piece);
  void finish_step();
  // Piece i's segment's gradients (in memory: not for a block in the store).
  float* segment_gradients(size_t piece) const;

  // Outside a step: piece i's moments (end - begin floats each) copied out of or into wherever
  // they live.
  void read_moments(size_t piece, float* m, float* v);
  void write_moments(size_t piece, const float* m, const float* v);

  // --shard weights: what the sharded state allocated on this rank (0 unsharded): the slices in
  // memory, the gather and gradient slots (its sizing beforehand: ShardedBlocks::state_bytes).
  uint64_t sharded_bytes() const;
  // --shard weights: the chunk size the gathers run at (0: the process's), after place_moments.
  size_t gather_chunk_bytes() const;

  // --shard weights: called on the thread that ran each gather of a block's weights, with its name
  // ("gather h.3") and when it ran (for --trace). After place_moments.
  void set_gather_sink(std::function<void(const std::string&, std::chrono::steady_clock::time_point,
                                          std::chrono::steady_clock::time_point)>
                           sink);

  // Bytes of the moments in memory (with a tier: its staging slots; without the store's), in the
  // moments' tier, and that tier's description ("" in memory).
  size_t moment_bytes() const;
  size_t moment_tier_bytes() const;
  std::string moment_tier_description() const;

 private:
  struct Reserved;  // address space reserved for params_ and grads_ when blocks are in a store
  // The placement of the blocks elsewhere than memory, from the optimizer's block pieces.
  std::unique_ptr<BlockPlacement> place_blocks(const BlockStore::MomentPieces& pieces,
                                               const Group* group);
  // The placements, checked to be there (before place_moments only the in-memory blocks are).
  BlockPlacement& blocks() const;
  detail::Moments& moments() const;
  ShardedBlocks* sharded() const { return blocks_ != nullptr ? blocks_->sharded() : nullptr; }
  ShardedBlocks& sharded_blocks() const;

  ShardLayout layout_;
  Options options_;
  std::unique_ptr<ooc::TransferEngines> own_engines_;  // when none were given
  ooc::TransferEngines& engines_;
  std::unique_ptr<Reserved> reserved_;
  Tensor params_, grads_;
  std::vector<Piece> pieces_;
  std::unique_ptr<BlockPlacement> blocks_;    // the blocks' weights, gradients (and moments)
  std::unique_ptr<detail::Moments> moments_;  // every other piece's moments
};

}  // namespace tandem::parallel
