// Where the transformer blocks' weights, gradients and (with a store) moments live on one rank:
// the interface ModelState dispatches through, with one implementation per placement, chosen once
// when the optimizer places its moments (model_state.h):
//   - in memory: the blocks are ranges of ModelState's flat buffers (src/parallel/memory_blocks.h);
//   - streamed from a tier: a BlockStore's slots (--model-state; src/parallel/streamed_blocks.h);
//   - sharded, in memory or streamed: each rank's slices, whole blocks gathered before use
//     (--shard weights, over a BlockStore of the slices with --model-state; sharded_blocks.h).
// Each placement's sizing before it exists (the memory estimate's and the planner's) is static on
// the type that allocates it: BlockStore's and ShardedBlocks'.
#pragma once

#include <cstdint>

namespace tandem::parallel {

class BlockStore;
class ShardedBlocks;

class BlockPlacement {
 public:
  virtual ~BlockPlacement() = default;

  // Compute's use of block l's weights (its local elements, in layout order), held until
  // release(l). prefetch(in_use, direction) starts bringing early the blocks that follow block
  // `in_use` (about to compute) in `direction` (+1 the forward, -1 the backward).
  virtual float* acquire(int layer) = 0;
  virtual void release(int layer) {}
  virtual void prefetch(int in_use, int direction) {}
  // Block l's gradients for this step (accumulated into by its backwards until its update).
  virtual float* gradients(int layer) = 0;
  // A store's gradient parking between a step's backwards and its read-aheads (block_store.h).
  virtual void park_gradients(int layer) {}
  virtual void prefetch_gradients(int layer) {}
  virtual void prefetch_moments(int layer) {}
  // A backward without an update: the blocks' gradients held outside the flat buffer are let go.
  virtual void drop_gradients() {}

  // Outside a step: block l's whole weights written (this rank's slice kept, when sharded), or
  // read (not when sharded: no rank holds them whole outside a step).
  virtual void write_weights(int layer, const float* in) = 0;
  virtual void read_weights(int layer, float* out) = 0;

  // The optimizer's update of block l: its weights and gradients, and its moments when the
  // placement keeps them (keeps_moments(): a store's); else m and v are null and the caller's
  // moments serve. Held until end_update(l), which writes back what lives elsewhere.
  struct Update {
    float* w = nullptr;
    float* g = nullptr;
    float* m = nullptr;
    float* v = nullptr;
  };
  virtual bool keeps_moments() const { return false; }
  virtual Update begin_update(int layer) = 0;
  virtual void end_update(int layer) {}
  // Outside a step, when keeps_moments(): block l's moment piece copied out or in.
  virtual void read_moments(int layer, float* m, float* v);
  virtual void write_moments(int layer, const float* m, const float* v);

  // Bytes this placement holds in memory beside ModelState's flat buffers and a store's slots
  // (which the store reports itself).
  virtual uint64_t memory_bytes() const { return 0; }
  // The placement's store (--model-state), and the sharded placement itself (--shard weights), for
  // what only they answer; null otherwise.
  virtual BlockStore* store() const { return nullptr; }
  virtual ShardedBlocks* sharded() { return nullptr; }
};

}  // namespace tandem::parallel
