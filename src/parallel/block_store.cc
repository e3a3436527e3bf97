// The blocks' weights and moments in a slow tier, staged through a few slots (see block_store.h).
#include "tandem/parallel/block_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "tandem/core/bytes.h"
#include "tandem/core/error.h"

namespace tandem::parallel {
namespace {

// Bytes rounded up to the tier's O_DIRECT alignment.
uint64_t io_aligned(uint64_t b) { return round_up(b, ooc::kIoAlignment); }

}  // namespace

struct BlockStore::Slot {
  Kind kind = Kind::Weights;
  char* mem = nullptr;
  int layer = -1;           // the block whose data it holds; -1: free
  int holds = 0;            // acquire / begin_update not yet released
  int reads = 0;            // reads queued and not yet run
  int writes = 0;           // write-backs queued and not yet run
  uint64_t used = 0;        // when last used, for least recently used
  bool parked = false;      // gradients between two backwards of their block: may be written out
  bool read_ahead = false;  // filled by a prefetch and not used since
};

BlockStore::BlockStore(const ooc::TierSpec& tier, ooc::TransferEngine& transfers,
                       const ShardLayout& layout, const MomentPieces& moments, int micro_batches,
                       const ooc::TierBandwidth& bandwidth)
    : BlockStore(tier, transfers, layout.first_layer(), layout.end_layer() - layout.first_layer(),
                 layout.block_floats(), moments, micro_batches, bandwidth) {}

BlockStore::BlockStore(const ooc::TierSpec& tier, ooc::TransferEngine& transfers, int first_layer,
                       int blocks, int64_t block_floats, const MomentPieces& moments,
                       int micro_batches, const ooc::TierBandwidth& bandwidth)
    : first_(first_layer),
      micro_batches_(micro_batches),
      block_floats_(block_floats),
      pieces_(moments),
      bandwidth_(bandwidth),
      io_(transfers) {
  const int n = blocks;
  TANDEM_CHECK(micro_batches >= 1, "{} micro-batches", micro_batches);
  TANDEM_CHECK(static_cast<int>(moments.size()) == n, "{} moment pieces for {} blocks",
               moments.size(), n);
  w_slot_bytes_ = weight_bytes();
  uint64_t total = 0;
  blocks_.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    Block& b = blocks_[static_cast<size_t>(i)];
    const uint64_t piece = piece_bytes(first_ + i);
    mv_slot_bytes_ = std::max(mv_slot_bytes_, 2 * piece);
    b.w_at = total;
    b.m_at = b.w_at + w_slot_bytes_;
    b.v_at = b.m_at + piece;
    total = b.v_at + piece;
    if (micro_batches > 1) {
      b.g_at = total;
      total += w_slot_bytes_;
    }
  }
  mv_slot_bytes_ = std::max<uint64_t>(mv_slot_bytes_, 2 * ooc::kIoAlignment);
  tier_ = ooc::open_slow_tier(tier, std::max<uint64_t>(total, ooc::kIoAlignment),
                              "the model state (--model-state)");
  const uint64_t staging = staging_bytes();
  staging_ = static_cast<char*>(std::aligned_alloc(ooc::kIoAlignment, staging));
  if (staging_ == nullptr) user_error("cannot allocate {} bytes of model-state staging", staging);
  char* at = staging_;
  auto add = [&](Kind kind, int count, uint64_t bytes) {
    for (int i = 0; i < count; ++i, at += bytes) {
      Slot s;
      s.kind = kind;
      s.mem = at;
      slots_.push_back(s);
    }
  };
  add(Kind::Weights, kWeightSlots, w_slot_bytes_);
  add(Kind::Gradients, gradient_slots(micro_batches), w_slot_bytes_);
  add(Kind::Moments, kMomentSlots, mv_slot_bytes_);
  // Adam's moments start at zero: written through a zeroed moment slot (the file tier takes
  // aligned transfers only).
  char* zeros = slots_.back().mem;
  std::memset(zeros, 0, mv_slot_bytes_);
  for (int l = first_; l < end_layer(); ++l) {
    const Block& b = block(l);
    tier_->write(b.m_at, zeros, piece_bytes(l));
    tier_->write(b.v_at, zeros, piece_bytes(l));
  }
}

BlockStore::~BlockStore() {
  try {
    io_.wait_all();
  } catch (...) {  // the error was reported where it happened
  }
  std::free(staging_);
  std::free(resident_mem_);
}

uint64_t BlockStore::staging_bytes() const {
  return (kWeightSlots + gradient_slots(micro_batches_)) * w_slot_bytes_ +
         kMomentSlots * mv_slot_bytes_;
}

uint64_t BlockStore::staging_bytes(int64_t block_floats, int64_t piece_floats, int micro_batches) {
  const uint64_t w = io_aligned(static_cast<uint64_t>(block_floats) * sizeof(float)),
                 mv = std::max(2 * io_aligned(static_cast<uint64_t>(piece_floats) * sizeof(float)),
                               2 * ooc::kIoAlignment);
  return (kWeightSlots + gradient_slots(micro_batches)) * w + kMomentSlots * mv;
}

uint64_t BlockStore::resident_block_bytes(int64_t block_floats, int64_t piece_floats) {
  return io_aligned(static_cast<uint64_t>(block_floats) * sizeof(float)) +
         2 * io_aligned(static_cast<uint64_t>(piece_floats) * sizeof(float));
}

uint64_t BlockStore::weight_bytes() const {
  return io_aligned(static_cast<uint64_t>(block_floats_) * sizeof(float));
}

uint64_t BlockStore::piece_bytes(int layer) const {
  const auto& [b, e] = pieces_[static_cast<size_t>(layer - first_)];
  return io_aligned(static_cast<uint64_t>(e - b) * sizeof(float));
}

uint64_t BlockStore::resident_bytes(int count) const {
  uint64_t bytes = 0;
  for (int l = end_layer() - count; l < end_layer(); ++l)
    bytes += w_slot_bytes_ + 2 * piece_bytes(l);
  return bytes;
}

float* BlockStore::home_m(int layer) {
  return reinterpret_cast<float*>(block(layer).home + w_slot_bytes_);
}

float* BlockStore::home_v(int layer) {
  return reinterpret_cast<float*>(block(layer).home + w_slot_bytes_ + piece_bytes(layer));
}

void BlockStore::set_resident(int count) {
  TANDEM_CHECK(count >= 0 && count <= blocks(), "{} resident blocks of {}", count, blocks());
  if (count == resident_) return;
  flush();
  std::lock_guard<std::mutex> lock(mutex_);
  for (const Slot& s : slots_)
    TANDEM_CHECK(s.holds == 0 && s.reads == 0 && s.writes == 0,
                 "resident blocks changed during a step");
  // The blocks resident so far go back to the tier, then the new ones come from it: the tier is
  // where every block's state is between the two.
  for (int l = end_layer() - resident_; l < end_layer(); ++l) {
    Block& b = block(l);
    tier_->write(b.w_at, b.home, w_slot_bytes_);
    tier_->write(b.m_at, b.home + w_slot_bytes_, piece_bytes(l));
    tier_->write(b.v_at, b.home + w_slot_bytes_ + piece_bytes(l), piece_bytes(l));
    b.home = nullptr;
  }
  std::free(resident_mem_);
  resident_mem_ = nullptr;
  resident_ = 0;
  if (count == 0) return;
  const uint64_t bytes = resident_bytes(count);
  resident_mem_ = static_cast<char*>(std::aligned_alloc(ooc::kIoAlignment, bytes));
  if (resident_mem_ == nullptr)
    user_error("cannot allocate {} bytes for {} resident blocks", bytes, count);
  char* at = resident_mem_;
  for (int l = end_layer() - count; l < end_layer(); ++l) {
    Block& b = block(l);
    TANDEM_CHECK(b.g_slot < 0 && !b.g_in_tier, "block {} made resident with gradients pending", l);
    // A slot caching the block is let go: the home is its only copy in memory from now on.
    for (const int slot : {b.w_slot, b.mv_slot})
      if (slot >= 0) {
        slots_[static_cast<size_t>(slot)].layer = -1;
        slots_[static_cast<size_t>(slot)].read_ahead = false;
      }
    b.w_slot = b.mv_slot = -1;
    b.home = at;
    tier_->read(b.w_at, b.home, w_slot_bytes_);
    tier_->read(b.m_at, b.home + w_slot_bytes_, piece_bytes(l));
    tier_->read(b.v_at, b.home + w_slot_bytes_ + piece_bytes(l), piece_bytes(l));
    at += w_slot_bytes_ + 2 * piece_bytes(l);
  }
  resident_ = count;
}

BlockStore::Block& BlockStore::block(int layer) {
  TANDEM_CHECK(layer >= first_ && layer < end_layer(), "block {} is not in the store [{}, {})",
               layer, first_, end_layer());
  return blocks_[static_cast<size_t>(layer - first_)];
}

float* BlockStore::data(int slot) const {
  return reinterpret_cast<float*>(slots_[static_cast<size_t>(slot)].mem);
}

int BlockStore::take_slot(std::unique_lock<std::mutex>& lock, Kind kind, int layer, bool wait,
                          int keep) {
  auto older = [&](int i, int than) {
    return than < 0 || slots_[static_cast<size_t>(i)].used < slots_[static_cast<size_t>(than)].used;
  };
  for (;;) {
    int best = -1, read_ahead = -1;
    bool in_flight = false;
    for (int i = 0; i < static_cast<int>(slots_.size()); ++i) {
      const Slot& s = slots_[static_cast<size_t>(i)];
      if (s.kind != kind || s.holds > 0) continue;
      if (s.reads > 0 || s.writes > 0) {
        in_flight = true;
        continue;
      }
      if (s.layer < 0) {
        best = i;
        break;
      }
      // Gradients are taken from a block only when parked (then written back first).
      if (s.layer == keep || (kind == Kind::Gradients && !s.parked)) continue;
      if (s.read_ahead) {
        if (older(i, read_ahead)) read_ahead = i;
      } else if (older(i, best)) {
        best = i;
      }
    }
    // A block read ahead is about to be used: taken only when no transfer can free another slot.
    if (best < 0 && wait && !in_flight) best = read_ahead;
    if (best >= 0) {
      Slot& s = slots_[static_cast<size_t>(best)];
      if (s.layer >= 0) {  // evicted: its block is back to living in the tier only
        Block& old = block(s.layer);
        if (kind == Kind::Gradients) {
          start_gradient_write(best, s.layer);
          old.g_in_tier = true;
          s.parked = false;
        }
        (kind == Kind::Weights     ? old.w_slot
         : kind == Kind::Gradients ? old.g_slot
                                   : old.mv_slot) = -1;
      }
      s.layer = layer;
      s.used = ++clock_;
      s.read_ahead = false;
      Block& b = block(layer);
      (kind == Kind::Weights ? b.w_slot : kind == Kind::Gradients ? b.g_slot : b.mv_slot) = best;
      return best;
    }
    if (!wait) return -1;
    changed_.wait(lock);
  }
}

void BlockStore::start_read(Kind kind, int layer) {
  const Block& b = block(layer);
  const int slot = kind == Kind::Weights     ? b.w_slot
                   : kind == Kind::Gradients ? b.g_slot
                                             : b.mv_slot;
  Slot& s = slots_[static_cast<size_t>(slot)];
  ++s.reads;
  const uint64_t at = kind == Kind::Weights ? b.w_at : b.g_at, m_at = b.m_at, v_at = b.v_at,
                 piece = piece_bytes(layer);
  char* mem = s.mem;
  const uint64_t half = mv_slot_bytes_ / 2;
  std::vector<ooc::TransferEngine::Piece> pieces;
  if (kind != Kind::Moments)
    pieces = {{at, mem, w_slot_bytes_}};
  else
    pieces = {{m_at, mem, piece}, {v_at, mem + half, piece}};
  io_.read_async(*tier_, std::move(pieces),
                 fmt::format("read h.{} {}", layer,
                             kind == Kind::Weights     ? "weights"
                             : kind == Kind::Gradients ? "gradients"
                                                       : "moments"),
                 last_write_,
                 [this, slot](const ooc::TransferEngine::Span& span, std::exception_ptr failed) {
                   transferred(span, std::move(failed), slot);
                 });
}

void BlockStore::transferred(const ooc::TransferEngine::Span& span, std::exception_ptr failed,
                             int slot, int other) {
  if (sink_) sink_(span.label, span.begin, span.end);
  std::lock_guard<std::mutex> lock(mutex_);
  (span.write ? traffic_.written_bytes : traffic_.read_bytes) += span.bytes;
  traffic_.busy_s += std::chrono::duration<double>(span.end - span.begin).count();
  for (const int i : {slot, other}) {
    if (i < 0) continue;
    Slot& s = slots_[static_cast<size_t>(i)];
    --(span.write ? s.writes : s.reads);
  }
  if (failed && !error_) error_ = failed;
  changed_.notify_all();
}

void BlockStore::start_gradient_write(int slot, int layer) {
  Slot& s = slots_[static_cast<size_t>(slot)];
  ++s.writes;
  const uint64_t at = block(layer).g_at;
  const char* mem = s.mem;
  last_write_ = io_.write_async(
      *tier_, at, mem, w_slot_bytes_, fmt::format("write h.{} gradients", layer),
      [this, slot](const ooc::TransferEngine::Span& span, std::exception_ptr failed) {
        transferred(span, std::move(failed), slot);
      });
}

void BlockStore::await(std::unique_lock<std::mutex>& lock, int slot, bool writes) {
  changed_.wait(lock, [&] {
    const Slot& s = slots_[static_cast<size_t>(slot)];
    return s.reads == 0 && (!writes || s.writes == 0);
  });
  if (error_) std::rethrow_exception(error_);
}

float* BlockStore::acquire(int layer) {
  std::unique_lock<std::mutex> lock(mutex_);
  Block& b = block(layer);
  if (b.home != nullptr) return reinterpret_cast<float*>(b.home);
  if (b.w_slot < 0) {
    take_slot(lock, Kind::Weights, layer, true);
    start_read(Kind::Weights, layer);
  }
  const int slot = b.w_slot;
  Slot& s = slots_[static_cast<size_t>(slot)];
  ++s.holds;  // before waiting, so that nobody takes it meanwhile
  s.used = ++clock_;
  s.read_ahead = false;
  await(lock, slot);
  return data(slot);
}

void BlockStore::release(int layer) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (block(layer).home != nullptr) return;
  const int slot = block(layer).w_slot;
  TANDEM_CHECK(slot >= 0 && slots_[static_cast<size_t>(slot)].holds > 0,
               "release of block {} not held", layer);
  --slots_[static_cast<size_t>(slot)].holds;
  changed_.notify_all();
}

void BlockStore::prefetch(int layer, int in_use) {
  if (layer < first_ || layer >= end_layer()) return;
  std::unique_lock<std::mutex> lock(mutex_);
  if (block(layer).w_slot >= 0 || block(layer).home != nullptr) return;
  const int slot = take_slot(lock, Kind::Weights, layer, false, in_use);
  if (slot < 0) return;
  start_read(Kind::Weights, layer);
  slots_[static_cast<size_t>(slot)].read_ahead = true;
}

void BlockStore::prefetch_moments(int layer) {
  if (layer < first_ || layer >= end_layer()) return;
  std::unique_lock<std::mutex> lock(mutex_);
  if (block(layer).mv_slot >= 0 || block(layer).home != nullptr) return;
  const int slot = take_slot(lock, Kind::Moments, layer, false);
  if (slot < 0) return;
  start_read(Kind::Moments, layer);
  slots_[static_cast<size_t>(slot)].read_ahead = true;
}

float* BlockStore::gradients(int layer) {
  std::unique_lock<std::mutex> lock(mutex_);
  Block& b = block(layer);
  if (b.g_slot >= 0) {  // computing, or parked (maybe still being read back)
    slots_[static_cast<size_t>(b.g_slot)].parked = false;
    slots_[static_cast<size_t>(b.g_slot)].read_ahead = false;
    await(lock, b.g_slot);
    return data(b.g_slot);
  }
  const int slot = take_slot(lock, Kind::Gradients, layer, true);
  if (b.g_in_tier) {
    b.g_in_tier = false;
    start_read(Kind::Gradients, layer);  // after the slot's own write-back, in order
    await(lock, slot);
    return data(slot);
  }
  await(lock, slot, /*writes=*/true);  // the evicted block's sum has left the slot
  lock.unlock();  // the slot is this block's until parked or updated: zeroed without the lock
  std::memset(data(slot), 0, static_cast<size_t>(block_floats_) * sizeof(float));
  return data(slot);
}

void BlockStore::park_gradients(int layer) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int slot = block(layer).g_slot;
  TANDEM_CHECK(slot >= 0, "park of block {}'s gradients, which are in no slot", layer);
  TANDEM_CHECK(micro_batches_ > 1, "gradients parked in a store set up for one micro-batch");
  Slot& s = slots_[static_cast<size_t>(slot)];
  s.parked = true;
  s.used = ++clock_;
  changed_.notify_all();
}

void BlockStore::prefetch_gradients(int layer) {
  if (layer < first_ || layer >= end_layer()) return;
  std::unique_lock<std::mutex> lock(mutex_);
  Block& b = block(layer);
  if (b.g_slot >= 0 || !b.g_in_tier) return;
  const int slot = take_slot(lock, Kind::Gradients, layer, false);
  if (slot < 0) return;
  b.g_in_tier = false;
  start_read(Kind::Gradients, layer);
  slots_[static_cast<size_t>(slot)].parked = true;  // read, not yet asked for
  slots_[static_cast<size_t>(slot)].read_ahead = true;
}

BlockStore::Update BlockStore::begin_update(int layer) {
  std::unique_lock<std::mutex> lock(mutex_);
  Block& b = block(layer);
  TANDEM_CHECK(b.g_slot >= 0, "the update of block {} without its gradients", layer);
  if (b.home != nullptr)
    return {reinterpret_cast<float*>(b.home), data(b.g_slot), home_m(layer), home_v(layer)};
  if (b.w_slot < 0) {
    take_slot(lock, Kind::Weights, layer, true);
    start_read(Kind::Weights, layer);
  }
  ++slots_[static_cast<size_t>(b.w_slot)].holds;
  slots_[static_cast<size_t>(b.w_slot)].read_ahead = false;
  if (b.mv_slot < 0) {
    take_slot(lock, Kind::Moments, layer, true);
    start_read(Kind::Moments, layer);
  }
  ++slots_[static_cast<size_t>(b.mv_slot)].holds;
  slots_[static_cast<size_t>(b.mv_slot)].read_ahead = false;
  await(lock, b.w_slot);
  await(lock, b.mv_slot);
  float* mv = data(b.mv_slot);
  return {data(b.w_slot), data(b.g_slot), mv, mv + mv_slot_bytes_ / 2 / sizeof(float)};
}

void BlockStore::end_update(int layer) {
  std::lock_guard<std::mutex> lock(mutex_);
  Block& b = block(layer);
  if (b.home != nullptr) {  // updated in place: nothing to write
    slots_[static_cast<size_t>(b.g_slot)].layer = -1;
    b.g_slot = -1;
    changed_.notify_all();
    return;
  }
  Slot& w = slots_[static_cast<size_t>(b.w_slot)];
  Slot& mv = slots_[static_cast<size_t>(b.mv_slot)];
  ++w.writes;
  ++mv.writes;
  const int w_slot = b.w_slot, mv_slot = b.mv_slot;
  const uint64_t w_at = b.w_at, m_at = b.m_at, v_at = b.v_at, piece = piece_bytes(layer),
                 half = mv_slot_bytes_ / 2;
  char *wm = w.mem, *mvm = mv.mem;
  last_write_ = io_.write_async(
      *tier_, {{w_at, wm, w_slot_bytes_}, {m_at, mvm, piece}, {v_at, mvm + half, piece}},
      fmt::format("write h.{} weights, moments", layer),
      [this, w_slot, mv_slot](const ooc::TransferEngine::Span& span, std::exception_ptr failed) {
        transferred(span, std::move(failed), w_slot, mv_slot);
      });
  --w.holds;
  --mv.holds;
  slots_[static_cast<size_t>(b.g_slot)].layer = -1;
  b.g_slot = -1;
  changed_.notify_all();
}

void BlockStore::drop_gradients() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Block& b : blocks_) {
    b.g_in_tier = false;
    if (b.g_slot < 0) continue;
    Slot& s = slots_[static_cast<size_t>(b.g_slot)];
    s.layer = -1;
    s.parked = false;
    b.g_slot = -1;
  }
  changed_.notify_all();
}

void BlockStore::read_weights(int layer, float* out) {
  const float* w = acquire(layer);
  std::memcpy(out, w, static_cast<size_t>(block_floats_) * sizeof(float));
  release(layer);
}

void BlockStore::write_weights(int layer, const float* in) {
  std::unique_lock<std::mutex> lock(mutex_);
  Block& b = block(layer);
  if (b.home != nullptr) {
    std::memcpy(b.home, in, static_cast<size_t>(block_floats_) * sizeof(float));
    return;
  }
  if (b.w_slot < 0) take_slot(lock, Kind::Weights, layer, true);
  Slot& s = slots_[static_cast<size_t>(b.w_slot)];
  await(lock, b.w_slot, /*writes=*/true);  // nothing queued uses the slot or the block's region
  std::memcpy(s.mem, in, static_cast<size_t>(block_floats_) * sizeof(float));
  const int slot = b.w_slot;
  ++s.writes;
  lock.unlock();
  tier_->write(b.w_at, s.mem, w_slot_bytes_);
  lock.lock();
  --slots_[static_cast<size_t>(slot)].writes;
  changed_.notify_all();
}

void BlockStore::read_moments(int layer, float* m, float* v) {
  std::unique_lock<std::mutex> lock(mutex_);
  Block& b = block(layer);
  const auto& [begin, end] = pieces_[static_cast<size_t>(layer - first_)];
  const size_t bytes = static_cast<size_t>(end - begin) * sizeof(float);
  if (b.home != nullptr) {
    std::memcpy(m, home_m(layer), bytes);
    std::memcpy(v, home_v(layer), bytes);
    return;
  }
  if (b.mv_slot < 0) {
    take_slot(lock, Kind::Moments, layer, true);
    start_read(Kind::Moments, layer);
  }
  const int slot = b.mv_slot;
  ++slots_[static_cast<size_t>(slot)].holds;
  slots_[static_cast<size_t>(slot)].read_ahead = false;
  await(lock, slot);
  std::memcpy(m, data(slot), bytes);
  std::memcpy(v, slots_[static_cast<size_t>(slot)].mem + mv_slot_bytes_ / 2, bytes);
  --slots_[static_cast<size_t>(slot)].holds;
  changed_.notify_all();
}

void BlockStore::write_moments(int layer, const float* m, const float* v) {
  std::unique_lock<std::mutex> lock(mutex_);
  Block& b = block(layer);
  const auto& [begin, end] = pieces_[static_cast<size_t>(layer - first_)];
  const size_t bytes = static_cast<size_t>(end - begin) * sizeof(float);
  if (b.home != nullptr) {
    std::memcpy(home_m(layer), m, bytes);
    std::memcpy(home_v(layer), v, bytes);
    return;
  }
  if (b.mv_slot < 0) take_slot(lock, Kind::Moments, layer, true);
  const int slot = b.mv_slot;
  Slot& s = slots_[static_cast<size_t>(slot)];
  await(lock, slot, /*writes=*/true);  // nothing queued uses the slot or the block's region
  std::memcpy(s.mem, m, bytes);
  std::memcpy(s.mem + mv_slot_bytes_ / 2, v, bytes);
  ++s.writes;
  lock.unlock();
  tier_->write(b.m_at, s.mem, piece_bytes(layer));
  tier_->write(b.v_at, s.mem + mv_slot_bytes_ / 2, piece_bytes(layer));
  lock.lock();
  --s.writes;
  changed_.notify_all();
}

BlockStore::Traffic BlockStore::traffic() {
  std::lock_guard<std::mutex> lock(mutex_);
  return traffic_;
}

BlockStore::Traffic BlockStore::predicted_step_traffic(int resident) const {
  // Every block's piece has one size (the blocks have, and so have their slices).
  return predicted_step_traffic(blocks(), block_floats_,
                                static_cast<int64_t>(piece_bytes(first_) / sizeof(float)),
                                micro_batches_, resident);
}

BlockStore::Traffic BlockStore::predicted_step_traffic(int blocks, int64_t block_floats,
                                                       int64_t piece_floats, int micro_batches,
                                                       int resident) {
  Traffic t;
  const uint64_t n = static_cast<uint64_t>(blocks), M = static_cast<uint64_t>(micro_batches);
  const uint64_t w = io_aligned(static_cast<uint64_t>(block_floats) * sizeof(float)),
                 piece = io_aligned(static_cast<uint64_t>(piece_floats) * sizeof(float));
  // The streamed blocks run one after another as if the resident ones were not there.
  const uint64_t streamed = n - static_cast<uint64_t>(resident);
  const uint64_t misses = streamed > kWeightSlots ? streamed - kWeightSlots : 0;
  t.read_bytes = streamed * 2 * piece + 2 * M * misses * w;
  t.written_bytes = streamed * (w + 2 * piece);
  if (n > static_cast<uint64_t>(gradient_slots(micro_batches))) {
    t.read_bytes += (M - 1) * n * w;
    t.written_bytes += (M - 1) * n * w;
  }
  return t;
}

void BlockStore::reset_traffic() {
  std::lock_guard<std::mutex> lock(mutex_);
  traffic_ = {};
}

void BlockStore::flush() {
  io_.wait_all();
  std::lock_guard<std::mutex> lock(mutex_);
  if (error_) std::rethrow_exception(error_);
}

}  // namespace tandem::parallel
