// The blocks in memory: each block's weights and gradients are its range of the rank's flat
// buffers (ModelState's), updated in place by the optimizer, whose moments are ModelState's too.
// Nothing to fetch or write back, so every hint is a no-op. Internal to parallel/.
#pragma once

#include "tandem/parallel/block_placement.h"
#include "tandem/parallel/shard.h"

namespace tandem::parallel::detail {

class MemoryBlocks final : public BlockPlacement {
 public:
  // The blocks of `layout` in the flat buffers `params` and `grads` (layout.size() floats each);
  // all three must outlive this.
  MemoryBlocks(const ShardLayout& layout, float* params, float* grads)
      : layout_(layout), params_(params), grads_(grads) {}

  float* acquire(int layer) override;
  float* gradients(int layer) override;
  void write_weights(int layer, const float* in) override;
  void read_weights(int layer, float* out) override;
  Update begin_update(int layer) override;

 private:
  const ShardLayout& layout_;
  float* params_;
  float* grads_;
};

}  // namespace tandem::parallel::detail
