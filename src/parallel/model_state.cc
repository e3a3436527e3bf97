// One rank's model state: the flat buffers, and the placements of the blocks and of the moments
// chosen once and dispatched through (see model_state.h).
#include "tandem/parallel/model_state.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "memory_blocks.h"
#include "moments.h"
#include "streamed_blocks.h"
#include "tandem/core/error.h"
#include "tandem/parallel/sharded_blocks.h"
#include "tiered_state.h"

namespace tandem::parallel {
namespace {

// A store opens its tier when made: its failure (a full disk, an unwritable folder) names the flag.
std::unique_ptr<BlockStore> open_block_store(
    const ooc::TierSpec& tier, const std::function<std::unique_ptr<BlockStore>()>& open) {
  try {
    return open();
  } catch (const UserError& e) {
    user_error("--model-state {}: {}", tier.str(), e.what());
  }
}

}  // namespace

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
    return;  // placed by place_moments, which has what the store and the gathers need
  }
  Allocator& a = allocator != nullptr ? *allocator : host_allocator();
  params_ = Tensor::zeros(DType::F32, Shape{layout_.size()}, a);
  grads_ = Tensor::zeros(DType::F32, Shape{layout_.size()}, a);
  blocks_ = std::make_unique<detail::MemoryBlocks>(layout_, params_.data_as<float>(),
                                                   grads_.data_as<float>());
}

// The placements wait for their transfers before the engines they use go.
ModelState::~ModelState() {
  blocks_.reset();
  moments_.reset();
}

BlockPlacement& ModelState::blocks() const {
  TANDEM_CHECK(blocks_ != nullptr, "the blocks' state used before place_moments placed it");
  return *blocks_;
}

detail::Moments& ModelState::moments() const {
  TANDEM_CHECK(moments_ != nullptr, "the moments used before place_moments placed them");
  return *moments_;
}

ShardedBlocks& ModelState::sharded_blocks() const {
  ShardedBlocks* s = sharded();
  TANDEM_CHECK(s != nullptr, "a weight slice of an unsharded state");
  return *s;
}

size_t ModelState::resident_bytes() const {
  if (!blocks_elsewhere()) return params_.nbytes();
  const auto [b, e] = layout_.blocks_range();
  return static_cast<size_t>(layout_.size() - (e - b)) * sizeof(float);
}

void ModelState::zero_gradients() {
  // Sharded with several micro-batches, the blocks' sums live in the flat buffer.
  if (!blocks_elsewhere() || (weights_sharded() && options_.micro_batches > 1))
    return grads_.fill(0.0f);
  const auto [b, e] = layout_.blocks_range();
  float* g = grads_.data_as<float>();
  std::fill(g, g + b, 0.0f);
  std::fill(g + e, g + layout_.size(), 0.0f);
  drop_gradients();
}

float* ModelState::acquire_block(int layer) { return blocks().acquire(layer); }
void ModelState::release_block(int layer) { blocks().release(layer); }
void ModelState::prefetch_blocks(int in_use, int direction) {
  blocks().prefetch(in_use, direction);
}
float* ModelState::block_gradients(int layer) { return blocks().gradients(layer); }
void ModelState::park_gradients(int layer) { blocks().park_gradients(layer); }
void ModelState::prefetch_gradients(int layer) { blocks().prefetch_gradients(layer); }
void ModelState::prefetch_moments(int layer) { blocks().prefetch_moments(layer); }
void ModelState::drop_gradients() { blocks().drop_gradients(); }

void ModelState::write_block_weights(int layer, const float* in) {
  blocks().write_weights(layer, in);
}

void ModelState::read_block_weights(int layer, float* out) { blocks().read_weights(layer, out); }

std::pair<int64_t, int64_t> ModelState::weight_slice(int layer) const {
  const ShardedBlocks& s = sharded_blocks();
  const int64_t b = layout_.block_range(layer).first;
  return {b + s.slice_begin(), b + s.slice_end()};
}

void ModelState::read_weight_slice(int layer, float* out) {
  sharded_blocks().read_slice(layer, out);
}

void ModelState::place_moments(std::vector<Piece> pieces, const Group* group) {
  TANDEM_CHECK(pieces_.empty() && !moments_, "the moments placed twice");
  pieces_ = std::move(pieces);
  // Every block's piece, by block (each block is a piece of its own when the blocks are elsewhere).
  const int first = layout_.first_layer(), blocks = layout_.end_layer() - first;
  BlockStore::MomentPieces block_pieces(static_cast<size_t>(blocks), {-1, -1});
  for (const Piece& p : pieces_) {
    if (p.block < 0) continue;
    TANDEM_CHECK(blocks_elsewhere() && p.block >= first && p.block < first + blocks &&
                     block_pieces[static_cast<size_t>(p.block - first)].first < 0,
                 "a piece of block {} twice, outside [{}, {}) or without a store", p.block, first,
                 first + blocks);
    block_pieces[static_cast<size_t>(p.block - first)] = {p.begin, p.end};
  }
  if (blocks_elsewhere()) blocks_ = place_blocks(block_pieces, group);
  // The rest of the moments: every piece's but the blocks' a store keeps.
  std::vector<int64_t> lengths;
  for (const Piece& p : pieces_)
    lengths.push_back(p.block >= 0 && blocks_->keeps_moments() ? 0 : p.end - p.begin);
  if (!options_.moments) {
    moments_ = detail::memory_moments(lengths);
    return;
  }
  try {
    moments_ = std::make_unique<detail::TieredState>(*options_.moments, lengths,
                                                     engines_.of(*options_.moments));
  } catch (const UserError& e) {
    user_error("--optimizer-state {}: {}", options_.moments->str(), e.what());
  }
}

std::unique_ptr<BlockPlacement> ModelState::place_blocks(const BlockStore::MomentPieces& pieces,
                                                         const Group* group) {
  const int first = layout_.first_layer(), blocks = layout_.end_layer() - first;
  if (!weights_sharded()) {
    for (size_t i = 0; i < pieces.size(); ++i)
      TANDEM_CHECK(pieces[i].first >= 0, "no piece for block {}", first + static_cast<int>(i));
    return std::make_unique<detail::StreamedBlocks>(open_block_store(*options_.blocks, [&] {
      return std::make_unique<BlockStore>(*options_.blocks, engines_.of(*options_.blocks), layout_,
                                          pieces, options_.micro_batches,
                                          options_.blocks_bandwidth);
    }));
  }
  TANDEM_CHECK(group != nullptr && group->dp != nullptr,
               "a sharded state without its data-parallel group");
  std::unique_ptr<BlockStore> slices;
  if (blocks_in_store()) {
    // The store holds this rank's slices: a block of the store is a slice, its moment piece all
    // of it; the gradients are the sharded state's (the store's one-micro-batch slots).
    const int64_t slice = ShardedBlocks::slice_count(layout_.block_floats(), *group->dp);
    slices = open_block_store(*options_.blocks, [&] {
      return std::make_unique<BlockStore>(
          *options_.blocks, engines_.of(*options_.blocks), first, blocks, slice,
          BlockStore::MomentPieces(static_cast<size_t>(blocks), {0, slice}), 1,
          options_.blocks_bandwidth);
    });
  }
  auto sharded = std::make_unique<ShardedBlocks>(
      layout_, *group->dp, group->thread, group->executor, options_.gather_schedules,
      options_.micro_batches, options_.gather_ahead, grads_.data_as<float>(), std::move(slices));
  // The optimizer's piece of a block is the slice the sharded state keeps.
  for (size_t i = 0; i < pieces.size(); ++i) {
    const int l = first + static_cast<int>(i);
    const int64_t b = layout_.block_range(l).first;
    TANDEM_CHECK(
        pieces[i].first < 0 ||
            pieces[i] == std::make_pair(b + sharded->slice_begin(), b + sharded->slice_end()),
        "block {}'s piece [{}, {}) is not this rank's slice", l, pieces[i].first, pieces[i].second);
  }
  return sharded;
}

void ModelState::set_gather_sink(
    std::function<void(const std::string&, std::chrono::steady_clock::time_point,
                       std::chrono::steady_clock::time_point)>
        sink) {
  if (ShardedBlocks* s = sharded()) s->set_gather_sink(std::move(sink));
}

void ModelState::detach_thread() {
  if (ShardedBlocks* s = sharded()) s->detach_thread();
}

void ModelState::begin_step() { moments().begin_step(); }

// A piece of the flat buffers, or a block whose placement gives its weights and gradients (and its
// moments, when it keeps them).
ModelState::Update ModelState::begin_update(size_t i) {
  const Piece& p = pieces_.at(i);
  if (p.block >= 0 && blocks().keeps_moments()) return blocks_->begin_update(p.block);
  Update u = p.block >= 0 ? blocks().begin_update(p.block)
                          : Update{params_.data_as<float>() + p.segment_begin,
                                   grads_.data_as<float>() + p.segment_begin};
  const detail::Moments::View mv = moments().begin_update(i);
  u.m = mv.m;
  u.v = mv.v;
  return u;
}

void ModelState::end_update(size_t i) {
  const Piece& p = pieces_.at(i);
  if (p.block >= 0) blocks().end_update(p.block);
  if (p.block < 0 || !blocks_->keeps_moments()) moments().end_update(i);
}

void ModelState::finish_step() { moments().finish_step(); }

float* ModelState::segment_gradients(size_t i) const {
  const Piece& p = pieces_.at(i);
  TANDEM_CHECK(p.block < 0, "the gradients of block {} are the store's", p.block);
  return grads_.data_as<float>() + p.segment_begin;
}

void ModelState::read_moments(size_t i, float* m, float* v) {
  const Piece& p = pieces_.at(i);
  if (p.block >= 0 && blocks().keeps_moments()) return blocks_->read_moments(p.block, m, v);
  moments().read(i, m, v);
}

void ModelState::write_moments(size_t i, const float* m, const float* v) {
  const Piece& p = pieces_.at(i);
  if (p.block >= 0 && blocks().keeps_moments()) return blocks_->write_moments(p.block, m, v);
  moments().write(i, m, v);
}

uint64_t ModelState::sharded_bytes() const {
  return blocks_ != nullptr ? blocks_->memory_bytes() : 0;
}

size_t ModelState::gather_chunk_bytes() const {
  const ShardedBlocks* s = sharded();
  return s != nullptr ? s->chunk_bytes() : 0;
}

size_t ModelState::moment_bytes() const { return moments_ ? moments_->memory_bytes() : 0; }

size_t ModelState::moment_tier_bytes() const { return moments_ ? moments_->tier_bytes() : 0; }

std::string ModelState::moment_tier_description() const {
  return moments_ ? moments_->describe() : "";
}

}  // namespace tandem::parallel
