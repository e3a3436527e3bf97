// One rank's model state: its placement in memory, a moments tier or a block store (see
// model_state.h).
#include "tandem/parallel/model_state.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "sharded_blocks.h"
#include "tandem/core/error.h"
#include "tiered_state.h"

namespace tandem::parallel {

// Two mappings of the shard's size that reserve address space only: pages are memory once
// written, and the blocks' ranges never are (the store holds the blocks). Anonymous pages read
// as zeros.
struct ModelState::Reserved {
  explicit Reserved(int64_t floats) : bytes(static_cast<size_t>(floats) * sizeof(float)) {
    params = map();
    grads = map();
  }
  ~Reserved() {
    ::munmap(params, bytes);
    ::munmap(grads, bytes);
  }
  float* map() const {
    void* p = ::mmap(nullptr, std::max<size_t>(bytes, 1), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
      user_error("cannot reserve {} bytes of address space for the model: {}", bytes,
                 std::strerror(errno));
    return static_cast<float*>(p);
  }
  size_t bytes;
  float* params = nullptr;
  float* grads = nullptr;
};

ModelState::ModelState(ShardLayout layout, const Options& options, Allocator* allocator,
                       ooc::TransferEngines* engines)
    : layout_(std::move(layout)),
      options_(options),
      own_engines_(engines != nullptr ? nullptr : std::make_unique<ooc::TransferEngines>()),
      engines_(engines != nullptr ? *engines : *own_engines_) {
  TANDEM_CHECK(!(options.blocks && options.moments), "a block store beside a moments tier");
  TANDEM_CHECK(options.micro_batches >= 1, "{} micro-batches", options.micro_batches);
  TANDEM_CHECK(!(options.sharded && options.moments), "sharded weights beside a moments tier");
  if (blocks_elsewhere()) {
    reserved_ = std::make_unique<Reserved>(layout_.size());
    params_ = Tensor::view_of(reserved_->params, DType::F32, Shape{layout_.size()});
    grads_ = Tensor::view_of(reserved_->grads, DType::F32, Shape{layout_.size()});
  } else {
    Allocator& a = allocator != nullptr ? *allocator : host_allocator();
    params_ = Tensor::zeros(DType::F32, Shape{layout_.size()}, a);
    grads_ = Tensor::zeros(DType::F32, Shape{layout_.size()}, a);
  }
}

// The store and the tier wait for their transfers before the engines they use go.
ModelState::~ModelState() {
  sharded_.reset();
  store_.reset();
  tier_.reset();
}

std::pair<int64_t, int64_t> ModelState::blocks_range() const {
  return {layout_.block_range(layout_.first_layer()).first,
          layout_.block_range(layout_.end_layer() - 1).second};
}

size_t ModelState::resident_bytes() const {
  if (!blocks_elsewhere()) return params_.nbytes();
  const auto [b, e] = blocks_range();
  return static_cast<size_t>(layout_.size() - (e - b)) * sizeof(float);
}

void ModelState::zero_gradients() {
  // Sharded with several micro-batches, the blocks' sums live in the flat buffer.
  if (!blocks_elsewhere() || (weights_sharded() && options_.micro_batches > 1))
    return grads_.fill(0.0f);
  const auto [b, e] = blocks_range();
  float* g = grads_.data_as<float>();
  std::fill(g, g + b, 0.0f);
  std::fill(g + e, g + layout_.size(), 0.0f);
  drop_gradients();
}

// A sharded state's blocks are gathered (its store, if any, holds only the slices).
float* ModelState::acquire_block(int layer) {
  if (sharded_) return sharded_->acquire(layer);
  if (store_) return store_->acquire(layer);
  return params_.data_as<float>() + layout_.block_range(layer).first;
}

void ModelState::release_block(int layer) {
  if (sharded_) return sharded_->release(layer);
  if (store_) store_->release(layer);
}

// A sharded state's store (--model-state) reads a slice ahead with each gather, when it has a
// slot for it; unsharded, the store reads one block ahead.
void ModelState::prefetch_blocks(int in_use, int direction) {
  if (sharded_) {
    for (int k = 0; k <= options_.gather_ahead; ++k)
      sharded_->prefetch(in_use + k * direction, in_use);
    return;
  }
  if (store_) store_->prefetch(in_use + direction, in_use);
}

float* ModelState::block_gradients(int layer) {
  if (sharded_) return sharded_->gradients(layer);
  if (store_) return store_->gradients(layer);
  return grads_.data_as<float>() + layout_.block_range(layer).first;
}

void ModelState::park_gradients(int layer) {
  if (store_ && !sharded_) store_->park_gradients(layer);
}

void ModelState::prefetch_gradients(int layer) {
  if (store_ && !sharded_) store_->prefetch_gradients(layer);
}

void ModelState::prefetch_moments(int layer) {
  if (store_) store_->prefetch_moments(layer);
}

void ModelState::drop_gradients() {
  if (store_) store_->drop_gradients();
  if (sharded_) sharded_->drop_gradients();
}

void ModelState::write_block_weights(int layer, const float* in) {
  if (sharded_) return sharded_->write_slice(layer, in + sharded_->slice_begin());
  if (store_) return store_->write_weights(layer, in);
  const auto [b, e] = layout_.block_range(layer);
  std::memcpy(params_.data_as<float>() + b, in, static_cast<size_t>(e - b) * sizeof(float));
}

void ModelState::read_block_weights(int layer, float* out) {
  TANDEM_CHECK(!sharded_, "a sharded block's whole weights read outside a step");
  if (store_) return store_->read_weights(layer, out);
  const auto [b, e] = layout_.block_range(layer);
  std::memcpy(out, params_.data_as<float>() + b, static_cast<size_t>(e - b) * sizeof(float));
}

std::pair<int64_t, int64_t> ModelState::weight_slice(int layer) const {
  TANDEM_CHECK(sharded_ != nullptr, "a weight slice of an unsharded state");
  const int64_t b = layout_.block_range(layer).first;
  return {b + sharded_->slice_begin(), b + sharded_->slice_end()};
}

void ModelState::read_weight_slice(int layer, float* out) {
  TANDEM_CHECK(sharded_ != nullptr, "a weight slice of an unsharded state");
  sharded_->read_slice(layer, out);
}

void ModelState::place_moments(std::vector<Piece> pieces, const Group* group) {
  TANDEM_CHECK(pieces_.empty() && !tier_ && !store_ && !sharded_, "the moments placed twice");
  pieces_ = std::move(pieces);
  if (options_.moments) {
    std::vector<int64_t> lengths;
    for (const Piece& p : pieces_) lengths.push_back(p.end - p.begin);
    try {
      tier_ = std::make_unique<detail::TieredState>(*options_.moments, lengths,
                                                    engines_.of(*options_.moments));
    } catch (const UserError& e) {
      user_error("--optimizer-state {}: {}", options_.moments->str(), e.what());
    }
    return;
  }
  // The blocks' moments go to the store (a piece each, by block); the rest stay here.
  const int first = layout_.first_layer(), blocks = layout_.end_layer() - first;
  BlockStore::MomentPieces block_pieces(static_cast<size_t>(blocks), {-1, -1});
  for (const Piece& p : pieces_) {
    const int64_t len = p.block >= 0 && blocks_in_store() ? 0 : p.end - p.begin;
    m_.push_back(Tensor::zeros(DType::F32, Shape{len}));
    v_.push_back(Tensor::zeros(DType::F32, Shape{len}));
    if (p.block < 0) continue;
    TANDEM_CHECK(blocks_elsewhere() && p.block >= first && p.block < first + blocks &&
                     block_pieces[static_cast<size_t>(p.block - first)].first < 0,
                 "a piece of block {} twice, outside [{}, {}) or without a store", p.block, first,
                 first + blocks);
    block_pieces[static_cast<size_t>(p.block - first)] = {p.begin, p.end};
  }
  if (weights_sharded()) {
    TANDEM_CHECK(group != nullptr && group->dp != nullptr,
                 "a sharded state without its data-parallel group");
    if (blocks_in_store()) {
      // The store holds this rank's slices: a block of the store is a slice, its moment piece
      // all of it; the gradients are the sharded state's (the store's one-micro-batch slots).
      const auto [b, e] = layout_.block_range(first);
      const int64_t slice = detail::ShardedBlocks::slice_count(e - b, *group->dp);
      try {
        store_ = std::make_unique<BlockStore>(
            *options_.blocks, engines_.of(*options_.blocks), first, blocks, slice,
            BlockStore::MomentPieces(static_cast<size_t>(blocks), {0, slice}));
      } catch (const UserError& e) {
        user_error("--model-state {}: {}", options_.blocks->str(), e.what());
      }
    }
    sharded_ = std::make_unique<detail::ShardedBlocks>(
        layout_, *group->dp, group->thread, group->executor, options_.gather_schedules,
        options_.micro_batches, options_.gather_ahead, grads_.data_as<float>(), store_.get());
    // The optimizer's piece of a block is the slice the sharded state keeps.
    for (const Piece& p : pieces_)
      if (p.block >= 0)
        TANDEM_CHECK(std::make_pair(p.begin, p.end) == weight_slice(p.block),
                     "block {}'s piece [{}, {}) is not this rank's slice", p.block, p.begin, p.end);
  }
  if (!blocks_in_store() || store_) return;
  for (size_t i = 0; i < block_pieces.size(); ++i)
    TANDEM_CHECK(block_pieces[i].first >= 0, "no piece for block {}", first + static_cast<int>(i));
  try {
    store_ = std::make_unique<BlockStore>(*options_.blocks, engines_.of(*options_.blocks), layout_,
                                          block_pieces, options_.micro_batches);
  } catch (const UserError& e) {
    user_error("--model-state {}: {}", options_.blocks->str(), e.what());
  }
}

void ModelState::set_gather_sink(
    std::function<void(const std::string&, std::chrono::steady_clock::time_point,
                       std::chrono::steady_clock::time_point)>
        sink) {
  if (sharded_) sharded_->set_gather_sink(std::move(sink));
}

void ModelState::detach_thread() {
  if (sharded_) sharded_->detach_thread();
}

void ModelState::begin_step() {
  if (tier_) tier_->begin();
}

ModelState::Update ModelState::begin_update(size_t i) {
  const Piece& p = pieces_.at(i);
  if (p.block >= 0 && sharded_) {
    float* g = sharded_->gradients(p.block);
    if (!store_)
      return {sharded_->slice(p.block), g, m_[i].data_as<float>(), v_[i].data_as<float>()};
    store_->gradients(p.block);  // the store's update holds a gradient slot; the slice's is unused
    const BlockStore::Update u = store_->begin_update(p.block);
    return {u.w, g, u.m, u.v};
  }
  if (p.block >= 0) {
    const BlockStore::Update u = store_->begin_update(p.block);
    return {u.w, u.g, u.m, u.v};
  }
  Update u{params_.data_as<float>() + p.segment_begin, grads_.data_as<float>() + p.segment_begin,
           nullptr, nullptr};
  if (tier_) {
    tier_->await(i);
    u.m = tier_->m(i);
    u.v = tier_->v(i);
  } else {
    u.m = m_[i].data_as<float>();
    u.v = v_[i].data_as<float>();
  }
  return u;
}

void ModelState::end_update(size_t i) {
  const Piece& p = pieces_.at(i);
  if (p.block >= 0 && sharded_) {
    if (store_) store_->end_update(p.block);
    return sharded_->updated(p.block);
  }
  if (p.block >= 0) return store_->end_update(p.block);
  if (tier_) tier_->done(i);
}

void ModelState::finish_step() {
  if (tier_) tier_->finish();
}

float* ModelState::segment_gradients(size_t i) const {
  const Piece& p = pieces_.at(i);
  TANDEM_CHECK(p.block < 0, "the gradients of block {} are the store's", p.block);
  return grads_.data_as<float>() + p.segment_begin;
}

void ModelState::read_moments(size_t i, float* m, float* v) {
  const Piece& p = pieces_.at(i);
  if (p.block >= 0 && store_) return store_->read_moments(p.block, m, v);
  if (tier_) return tier_->read(i, m, v);
  const size_t bytes = static_cast<size_t>(p.end - p.begin) * sizeof(float);
  std::memcpy(m, m_[i].data(), bytes);
  std::memcpy(v, v_[i].data(), bytes);
}

void ModelState::write_moments(size_t i, const float* m, const float* v) {
  const Piece& p = pieces_.at(i);
  if (p.block >= 0 && store_) return store_->write_moments(p.block, m, v);
  if (tier_) return tier_->write(i, m, v);
  const size_t bytes = static_cast<size_t>(p.end - p.begin) * sizeof(float);
  std::memcpy(m_[i].data(), m, bytes);
  std::memcpy(v_[i].data(), v, bytes);
}

uint64_t ModelState::sharded_blocks_bytes(int64_t block_floats, int blocks, int dp,
                                          int micro_batches, int gather_ahead) {
  const auto n = static_cast<uint64_t>(block_floats), b = static_cast<uint64_t>(blocks);
  const uint64_t slice = (n + static_cast<uint64_t>(dp) - 1) / static_cast<uint64_t>(dp);
  return 3 * b * slice * sizeof(float) +
         sharded_slots_bytes(block_floats, blocks, micro_batches, gather_ahead);
}

uint64_t ModelState::sharded_slots_bytes(int64_t block_floats, int blocks, int micro_batches,
                                         int gather_ahead) {
  const auto n = static_cast<uint64_t>(block_floats), b = static_cast<uint64_t>(blocks);
  const uint64_t grads = micro_batches > 1 ? b * n : 2 * n;
  return (static_cast<uint64_t>(gather_slots(gather_ahead)) * n + grads) * sizeof(float);
}

uint64_t ModelState::sharded_bytes() const { return sharded_ ? sharded_->memory_bytes() : 0; }

size_t ModelState::gather_chunk_bytes() const { return sharded_ ? sharded_->chunk_bytes() : 0; }

size_t ModelState::moment_bytes() const {
  if (tier_) return tier_->staging_bytes();
  size_t b = 0;
  for (size_t i = 0; i < m_.size(); ++i) b += m_[i].nbytes() + v_[i].nbytes();
  return b;
}

size_t ModelState::moment_tier_bytes() const { return tier_ ? tier_->tier_bytes() : 0; }

std::string ModelState::moment_tier_description() const { return tier_ ? tier_->describe() : ""; }

}  // namespace tandem::parallel
