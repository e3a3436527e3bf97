// The blocks' state sharded across the data-parallel ranks: slices, gathers, gradient slots (see
// sharded_blocks.h).
#include "tandem/parallel/sharded_blocks.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "tandem/core/error.h"
#include "tandem/core/formulas.h"
#include "tandem/dsl/workloads.h"

namespace tandem::parallel {

uint64_t ShardedBlocks::state_bytes(int64_t block_floats, int blocks, int dp, int micro_batches,
                                    int gather_ahead) {
  const auto slice = static_cast<uint64_t>(slice_floats(block_floats, dp));
  // Each block's slice of the weights, m and v.
  return 3 * static_cast<uint64_t>(blocks) * slice * sizeof(float) +
         slot_bytes(block_floats, blocks, micro_batches, gather_ahead);
}

uint64_t ShardedBlocks::slot_bytes(int64_t block_floats, int blocks, int micro_batches,
                                   int gather_ahead) {
  const auto n = static_cast<uint64_t>(block_floats);
  const uint64_t grads = micro_batches > 1 ? static_cast<uint64_t>(blocks) * n : kGradientSlots * n;
  return (static_cast<uint64_t>(gather_slots(gather_ahead)) * n + grads) * sizeof(float);
}

int64_t ShardedBlocks::slice_count(int64_t block_floats, const comm::Communicator& dp) {
  return fx::part_count(block_floats, dp.size(), dp.rank());
}

ShardedBlocks::ShardedBlocks(const ShardLayout& layout, comm::Communicator& dp,
                             SerialWorker* thread, exec::RunnerKind executor,
                             const SchedulePreferences& schedules, int micro_batches,
                             int gather_ahead, float* flat_grads,
                             std::unique_ptr<BlockStore> slices)
    : layout_(layout),
      dp_(dp),
      thread_(thread),
      micro_batches_(micro_batches),
      gather_ahead_(gather_ahead),
      flat_grads_(flat_grads),
      store_(std::move(slices)),
      first_(layout.first_layer()),
      blocks_(layout.end_layer() - layout.first_layer()),
      block_floats_(layout.block_floats()) {
  // The slice the optimizer's sliced programs give this rank (its part of each block's segment).
  slice_begin_ = fx::part_offset(block_floats_, dp.size(), dp.rank());
  slice_count_ = slice_count(block_floats_, dp);
  if (store_ == nullptr)
    slices_ = Tensor::zeros(DType::F32, Shape{std::max<int64_t>(blocks_ * slice_count_, 1)});
  TANDEM_CHECK(gather_ahead >= 1, "a prefetch distance of {} blocks", gather_ahead);
  const int slots = gather_slots(gather_ahead);
  gathered_ = Tensor::empty(DType::F32, Shape{slots * block_floats_});
  slots_.resize(static_cast<size_t>(slots));
  if (micro_batches_ == 1) {
    grad_slots_ = Tensor::empty(DType::F32, Shape{kGradientSlots * block_floats_});
    grad_slot_layer_.assign(kGradientSlots, -1);
  }
  program_ = std::make_unique<ProgramRunner>(
      dsl::workloads::gather_weights(),
      schedules.names.empty() ? std::vector<std::string>{"C"} : schedules.names, executor,
      schedules.chunk_bytes);
  runner_ = program_->prepare(dp, {{"N", block_floats_}}, {"w", "w_all"});
}

// The gathers queued on the thread bind the slots: they finish before the slots go.
ShardedBlocks::~ShardedBlocks() { detach_thread(); }

void ShardedBlocks::detach_thread() {
  if (thread_ == nullptr) return;
  try {
    thread_->wait();
  } catch (...) {  // a failed gather was reported where it was waited for
  }
  std::lock_guard<std::mutex> lock(mutex_);
  thread_ = nullptr;
  for (Slot& slot : slots_) slot.ticket = 0;
}

int ShardedBlocks::index(int layer) const {
  TANDEM_CHECK(layer >= first_ && layer < first_ + blocks_, "block {} is not in [{}, {})", layer,
               first_, first_ + blocks_);
  return layer - first_;
}

float* ShardedBlocks::slice(int layer) const {
  TANDEM_CHECK(store_ == nullptr, "block {}'s slice is in the store", layer);
  return slices_.data_as<float>() + static_cast<int64_t>(index(layer)) * slice_count_;
}

void ShardedBlocks::read_slice(int layer, float* out) {
  if (store_ != nullptr) return store_->read_weights(layer, out);
  std::memcpy(out, slice(layer), static_cast<size_t>(slice_count_) * sizeof(float));
}

void ShardedBlocks::write_slice(int layer, const float* in) {
  if (store_ != nullptr) return store_->write_weights(layer, in);
  std::memcpy(slice(layer), in, static_cast<size_t>(slice_count_) * sizeof(float));
}

int ShardedBlocks::free_slot(int keep_first, int keep_last) const {
  int best = -1;
  for (int s = 0; s < static_cast<int>(slots_.size()); ++s) {
    const Slot& slot = slots_[static_cast<size_t>(s)];
    if (slot.users > 0 || (slot.layer >= keep_first && slot.layer <= keep_last)) continue;
    if (best < 0 || slot.used < slots_[static_cast<size_t>(best)].used) best = s;
  }
  return best;
}

void ShardedBlocks::gather(int s, int layer) {
  const auto begin = std::chrono::steady_clock::now();
  float* w = store_ != nullptr ? store_->acquire(layer) : slice(layer);
  runner_->bind("w", Tensor::view_of(w, DType::F32, Shape{slice_count_}));
  runner_->bind("w_all", Tensor::view_of(gathered_.data_as<float>() + s * block_floats_, DType::F32,
                                         Shape{block_floats_}));
  runner_->run();
  if (store_ != nullptr) store_->release(layer);
  if (sink_) sink_("gather h." + std::to_string(layer), begin, std::chrono::steady_clock::now());
}

void ShardedBlocks::start_gather(int s, int layer) {
  Slot& slot = slots_[static_cast<size_t>(s)];
  slot.layer = layer;
  slot.used = ++clock_;
  if (thread_ == nullptr) {
    slot.ticket = 0;
    gather(s, layer);
    return;
  }
  slot.ticket = thread_->submit([this, s, layer] {
    comm::set_comm_activity("the gather of h." + std::to_string(layer) + "'s weights");
    gather(s, layer);
  });
}

float* ShardedBlocks::acquire(int layer) {
  index(layer);
  std::unique_lock<std::mutex> lock(mutex_);
  int s = -1;
  for (int i = 0; i < static_cast<int>(slots_.size()); ++i)
    if (slots_[static_cast<size_t>(i)].layer == layer) s = i;
  if (s < 0) {
    s = free_slot(0, -1);
    TANDEM_CHECK(s >= 0, "no gather slot free for block {}: every one is in use", layer);
    start_gather(s, layer);
  }
  Slot& slot = slots_[static_cast<size_t>(s)];
  ++slot.users;
  slot.used = ++clock_;
  const uint64_t ticket = slot.ticket;
  lock.unlock();
  // The slot cannot be taken while it has a user; its gather's failure surfaces here.
  if (ticket != 0) thread_->wait_for(ticket);
  return gathered_.data_as<float>() + s * block_floats_;
}

void ShardedBlocks::release(int layer) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Slot& slot : slots_)
    if (slot.layer == layer && slot.users > 0) return (void)--slot.users;
  TANDEM_CHECK(false, "block {} released but not held", layer);
}

void ShardedBlocks::prefetch(int in_use, int direction) {
  for (int k = 0; k <= gather_ahead_; ++k) prefetch_one(in_use + k * direction, in_use);
}

void ShardedBlocks::prefetch_one(int layer, int in_use) {
  if (thread_ == nullptr || layer < first_ || layer >= first_ + blocks_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const Slot& slot : slots_)
    if (slot.layer == layer) return;
  // Least recently used alone could take a nearer block gathered ahead for this farther one.
  const int s = free_slot(std::min(in_use, layer), std::max(in_use, layer));
  if (s < 0) return;
  // The slice read before its gather when the store has a slot for it (its own read-ahead rule);
  // else the gather reads it.
  if (store_ != nullptr) store_->prefetch(layer, in_use);
  start_gather(s, layer);
}

float* ShardedBlocks::gradients(int layer) {
  index(layer);  // checks the layer
  if (micro_batches_ > 1) return flat_grads_ + layout_.block_range(layer).first;
  std::unique_lock<std::mutex> lock(mutex_);
  for (size_t s = 0; s < grad_slot_layer_.size(); ++s)
    if (grad_slot_layer_[s] == layer) return grad_slots_.data_as<float>() + s * block_floats_;
  // A slot is freed by an update queued on the communication thread, which never waits for this.
  size_t s = 0;
  grad_freed_.wait(lock, [&] {
    for (s = 0; s < grad_slot_layer_.size(); ++s)
      if (grad_slot_layer_[s] < 0) return true;
    return false;
  });
  grad_slot_layer_[s] = layer;
  float* g = grad_slots_.data_as<float>() + s * block_floats_;
  std::fill(g, g + block_floats_, 0.0f);
  return g;
}

void ShardedBlocks::prefetch_moments(int layer) {
  if (store_ != nullptr) store_->prefetch_moments(layer);
}

void ShardedBlocks::write_weights(int layer, const float* in) {
  write_slice(layer, in + slice_begin_);
}

void ShardedBlocks::read_weights(int layer, float*) {
  internal_error(
      fmt::format("block {}'s whole weights read outside a step: they are sharded", layer));
}

// With a store, its update holds one of its gradient slots, unused: the gradients are ours.
BlockPlacement::Update ShardedBlocks::begin_update(int layer) {
  float* g = gradients(layer);
  if (store_ == nullptr) return {slice(layer), g, nullptr, nullptr};
  store_->gradients(layer);
  const BlockStore::Update u = store_->begin_update(layer);
  return {u.w, g, u.m, u.v};
}

void ShardedBlocks::read_moments(int layer, float* m, float* v) {
  TANDEM_CHECK(store_ != nullptr, "block {}'s moments are not the sharded state's", layer);
  store_->read_moments(layer, m, v);
}

void ShardedBlocks::write_moments(int layer, const float* m, const float* v) {
  TANDEM_CHECK(store_ != nullptr, "block {}'s moments are not the sharded state's", layer);
  store_->write_moments(layer, m, v);
}

void ShardedBlocks::end_update(int layer) {
  if (store_ != nullptr) store_->end_update(layer);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int& l : grad_slot_layer_)
      if (l == layer) l = -1;
    for (Slot& slot : slots_)
      if (slot.layer == layer) {
        TANDEM_CHECK(slot.users == 0, "block {} updated while its gathered weights are in use",
                     layer);
        slot.layer = -1;
      }
  }
  grad_freed_.notify_all();
}

void ShardedBlocks::drop_gradients() {
  if (store_ != nullptr) store_->drop_gradients();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::fill(grad_slot_layer_.begin(), grad_slot_layer_.end(), -1);
  }
  grad_freed_.notify_all();
}

uint64_t ShardedBlocks::memory_bytes() const {
  return (slices_.defined() ? slices_.nbytes() : 0) + gathered_.nbytes() +
         (grad_slots_.defined() ? grad_slots_.nbytes() : 0);
}

}  // namespace tandem::parallel
