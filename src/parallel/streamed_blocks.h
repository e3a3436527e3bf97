// The blocks streamed from a tier (--model-state): every call goes to the rank's BlockStore,
// which holds the blocks' weights, gradients and moments and stages them through its slots
// (block_store.h says how); its sizing before it exists is BlockStore's static formulas. Internal
// to parallel/.
#pragma once

#include <memory>
#include <utility>

#include "tandem/parallel/block_placement.h"
#include "tandem/parallel/block_store.h"

namespace tandem::parallel::detail {

class StreamedBlocks final : public BlockPlacement {
 public:
  explicit StreamedBlocks(std::unique_ptr<BlockStore> store) : store_(std::move(store)) {}

  float* acquire(int layer) override { return store_->acquire(layer); }
  void release(int layer) override { store_->release(layer); }
  // The store reads one block ahead (its own rule for which slot it may take).
  void prefetch(int in_use, int direction) override {
    store_->prefetch(in_use + direction, in_use);
  }
  float* gradients(int layer) override { return store_->gradients(layer); }
  void park_gradients(int layer) override { store_->park_gradients(layer); }
  void prefetch_gradients(int layer) override { store_->prefetch_gradients(layer); }
  void prefetch_moments(int layer) override { store_->prefetch_moments(layer); }
  void drop_gradients() override { store_->drop_gradients(); }

  void write_weights(int layer, const float* in) override { store_->write_weights(layer, in); }
  void read_weights(int layer, float* out) override { store_->read_weights(layer, out); }

  bool keeps_moments() const override { return true; }
  Update begin_update(int layer) override {
    const BlockStore::Update u = store_->begin_update(layer);
    return {u.w, u.g, u.m, u.v};
  }
  void end_update(int layer) override { store_->end_update(layer); }
  void read_moments(int layer, float* m, float* v) override { store_->read_moments(layer, m, v); }
  void write_moments(int layer, const float* m, const float* v) override {
    store_->write_moments(layer, m, v);
  }

  BlockStore* store() const override { return store_.get(); }

 private:
  std::unique_ptr<BlockStore> store_;
};

}  // namespace tandem::parallel::detail
