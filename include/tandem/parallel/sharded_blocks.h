// The transformer blocks' state sharded across the data-parallel ranks (--shard weights, ZeRO-3 /
// FSDP): each rank keeps its slice (1/dp) of every block's weights (the optimizer's slice(w,m,v)
// schedule updates the slice and leaves it there), and the blocks compute with whole weights
// gathered into a few slots just before use by the gather_weights program (an AllGather over the
// data-parallel group). A gather runs on the data-parallel communication thread (the one that
// runs the optimizer's updates), started D blocks ahead (the prefetch distance, --gather-ahead)
// so that it overlaps the blocks computing before it; without that thread it runs when needed.
// D + 1 gather slots hold the block computing and the D gathered ahead of it. A gathered block
// stays in its slot until the slot is wanted for another block or its update changes the slice:
// the forward's last blocks are still there when the backward turns.
//
// The gathers are collectives over the data-parallel group, so every rank must start the same
// gathers in the same order. They run in submission order on the one thread, and every rank
// submits them from its compute thread at the same points of the same step (the model's
// acquire and prefetch calls), choosing slots from state that only those calls change: an update
// (on the thread) only marks its block's slot stale, a block the step no longer asks for, which
// neither choice depends on. So the ranks' sequences agree for any D they share.
//
// Sharded and streamed: with `slices` (--model-state), the slices of the weights (and the moments)
// live in that store's tier instead of memory: a gather reads its block's slice into one of the
// store's slots first (read ahead when the gather is, if the store has a slot for it), and the
// update takes the slice and moments from the store, which writes them back; each rank streams
// only its 1/dp of the model. Without a store the moments of the slices are ModelState's.
//
// The gradients: with one micro-batch a step, a block's gradients live in one of two slots from
// its backward until its update (on the communication thread) has reduce-scattered them; with
// several, the sums must outlive the step's backwards, so every block's lives in the flat
// gradient buffer (the caller's) until the update.
//
// Public for its sizing (the memory estimate's and the planner's); ModelState is its one user.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/core/serial_worker.h"
#include "tandem/core/tensor.h"
#include "tandem/exec/runner.h"
#include "tandem/parallel/block_placement.h"
#include "tandem/parallel/block_store.h"
#include "tandem/parallel/program_runner.h"
#include "tandem/parallel/shard.h"

namespace tandem::parallel {

class ShardedBlocks final : public BlockPlacement {
 public:
  // The blocks of `layout` (which must outlive this) over the data-parallel group `dp`; `thread`:
  // the group's communication thread (null: gathers run on the caller's). `flat_grads`: the flat
  // gradient buffer, whose block ranges hold the sums when `micro_batches` > 1. `slices`: the
  // store of the slices (null: in memory here). `gather_ahead`: the prefetch distance D (>= 1;
  // gather_slots(D) gather slots). The slices start at zero (the caller writes the weights before
  // the first step). A collective over `dp`.
  ShardedBlocks(const ShardLayout& layout, comm::Communicator& dp, SerialWorker* thread,
                exec::RunnerKind executor, const SchedulePreferences& schedules, int micro_batches,
                int gather_ahead, float* flat_grads, std::unique_ptr<BlockStore> slices = nullptr);
  ~ShardedBlocks() override;

  // The sizing, before a sharded state exists. The gather slots at prefetch distance D (the block
  // computing and the D gathered ahead of it); the gradient slots with one micro-batch (the block
  // whose update runs, the block computing).
  static int gather_slots(int gather_ahead) { return gather_ahead + 1; }
  static constexpr int kGradientSlots = 2;
  // The largest slice of a block of `block_floats` local elements over `dp` ranks.
  static int64_t slice_floats(int64_t block_floats, int dp) { return (block_floats + dp - 1) / dp; }
  // What the blocks' state takes in memory on one rank, for `blocks` blocks of `block_floats`
  // local elements each over `dp` data-parallel ranks with `micro_batches` a step, gathering
  // `gather_ahead` blocks ahead: every block's weight and moment slices (1/dp each: the moments
  // are ModelState's), and slot_bytes.
  static uint64_t state_bytes(int64_t block_floats, int blocks, int dp, int micro_batches,
                              int gather_ahead);
  // Of which the gather and gradient slots (what stays in memory when the slices live in a
  // --model-state tier): gather_slots(gather_ahead) gathered blocks' weights, and the gradients
  // (kGradientSlots blocks' with one micro-batch; with several every block's sum, in the flat
  // buffer, which must outlive the step's backwards).
  static uint64_t slot_bytes(int64_t block_floats, int blocks, int micro_batches, int gather_ahead);

  // This rank's slice of every block: local elements [slice_begin(), slice_end()) of a block
  // (offsets within it), and block l's slice of the weights in memory (not with a store).
  static int64_t slice_count(int64_t block_floats, const comm::Communicator& dp);
  int64_t slice_begin() const { return slice_begin_; }
  int64_t slice_end() const { return slice_begin_ + slice_count_; }
  float* slice(int layer) const;
  // Outside a step: block l's slice copied out or in (wherever it lives).
  void read_slice(int layer, float* out);
  void write_slice(int layer, const float* in);

  // Compute's use of block l's whole weights, held until release(l): gathered now unless a
  // prefetch brought them. prefetch(in_use, direction) starts the gathers of block `in_use` and
  // the gather_ahead blocks after it in `direction`, nearest first (prefetch_one).
  float* acquire(int layer) override;
  void release(int layer) override;
  void prefetch(int in_use, int direction) override;

  // Block l's gradients for this step: a slot zeroed when first asked for (waiting for one to be
  // freed by an update), or its range of the flat buffer with several micro-batches.
  float* gradients(int layer) override;
  // A store of the slices reads the moments ahead; the gradients are never the store's.
  void prefetch_moments(int layer) override;
  // A backward without an update (the out-of-core profile's): its gradient slots are let go.
  void drop_gradients() override;

  // Outside a step: a block's whole weights in, this rank's slice kept. They cannot be read back
  // whole (read_slice reads the slice).
  void write_weights(int layer, const float* in) override;
  void read_weights(int layer, float* out) override;

  // The optimizer's update of block l: its slice of the weights and its gradients (its moments the
  // store's, or ModelState's). end_update: the slot of gradients is free, and its gathered weights
  // (if any slot holds them) are stale. On the thread that runs the update.
  bool keeps_moments() const override { return store_ != nullptr; }
  Update begin_update(int layer) override;
  void end_update(int layer) override;
  void read_moments(int layer, float* m, float* v) override;
  void write_moments(int layer, const float* m, const float* v) override;

  // The communication thread is going: waits for the gathers queued on it (a failure was
  // reported where it was waited for); later gathers run on the caller's thread.
  void detach_thread();

  // Called on the thread that ran each gather: "gather h.3" and when it ran (for --trace).
  using GatherSink =
      std::function<void(const std::string& name, std::chrono::steady_clock::time_point begin,
                         std::chrono::steady_clock::time_point end)>;
  void set_gather_sink(GatherSink sink) { sink_ = std::move(sink); }

  // The chunk size the gathers' collectives run at (0: the process's).
  size_t chunk_bytes() const { return program_->chunk_bytes(); }

  // Bytes in memory: the slices, the gather slots and the gradient slots (not the flat buffer, not
  // the store's).
  uint64_t memory_bytes() const override;
  BlockStore* store() const override { return store_.get(); }
  ShardedBlocks* sharded() override { return this; }

 private:
  struct Slot {
    int layer = -1;
    int users = 0;
    uint64_t ticket = 0;  // the gather's job on the thread (0: done, or ran inline)
    uint64_t used = 0;    // for least recently used
  };
  int index(int layer) const;
  // Starts the gather of block l on the communication thread when a slot can be had without
  // taking one that holds a block from `in_use` (the one computing) to l, which are used before
  // l (no-op without the thread, or for a layer outside the blocks).
  void prefetch_one(int layer, int in_use);
  // A free gather slot (no users, not holding a block in [keep_first, keep_last]), least recently
  // used first; -1: none.
  int free_slot(int keep_first, int keep_last) const;
  // Runs or queues the gather of block `layer` into slot `s`.
  void start_gather(int s, int layer);
  void gather(int s, int layer);

  const ShardLayout& layout_;
  comm::Communicator& dp_;
  SerialWorker* thread_;
  int micro_batches_;
  int gather_ahead_;
  float* flat_grads_;
  std::unique_ptr<BlockStore> store_;  // the slices' (--model-state), or null: slices_
  int first_ = 0, blocks_ = 0;
  int64_t block_floats_ = 0, slice_begin_ = 0, slice_count_ = 0;
  Tensor slices_;  // blocks x slice_count
  Tensor gathered_, grad_slots_;
  std::vector<Slot> slots_;
  std::vector<int> grad_slot_layer_;  // per gradient slot: its block, or -1
  uint64_t clock_ = 0;
  std::mutex mutex_;
  std::condition_variable grad_freed_;
  GatherSink sink_;
  std::unique_ptr<ProgramRunner> program_;
  std::unique_ptr<exec::Runner> runner_;  // used only on the thread that runs the gathers
};

}  // namespace tandem::parallel
