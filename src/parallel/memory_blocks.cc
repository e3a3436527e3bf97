// The blocks in the flat buffers (see memory_blocks.h).
#include "memory_blocks.h"

#include <cstring>

namespace tandem::parallel::detail {

float* MemoryBlocks::acquire(int layer) { return params_ + layout_.block_range(layer).first; }

float* MemoryBlocks::gradients(int layer) { return grads_ + layout_.block_range(layer).first; }

void MemoryBlocks::write_weights(int layer, const float* in) {
  std::memcpy(acquire(layer), in, static_cast<size_t>(layout_.block_floats()) * sizeof(float));
}

void MemoryBlocks::read_weights(int layer, float* out) {
  std::memcpy(out, acquire(layer), static_cast<size_t>(layout_.block_floats()) * sizeof(float));
}

BlockPlacement::Update MemoryBlocks::begin_update(int layer) {
  return {acquire(layer), gradients(layer), nullptr, nullptr};
}

}  // namespace tandem::parallel::detail
