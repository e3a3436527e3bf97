// The transformer blocks' model state beyond memory (--model-state host|file:DIR): every block's
// weights and this rank's piece of its optimizer moments live in a slow tier (host memory, or an
// O_DIRECT file on a fast disk: ooc/slow_tier.h), and a few staging slots in memory hold the
// blocks in flight. The embeddings and ln_f stay in memory (with the byte vocabulary they are a
// fraction of a block).
//
// A step (one micro-batch): the forward reads block l's weights into a slot (read ahead while
// block l - 1 computes) and lets them go after; the backward reads them again (or finds them still
// in a slot), computes block l's gradients into a gradient slot, and as soon as they are final the
// optimizer's update of block l (the fused DSL program, on its thread) meets weights, gradients
// and moments in slots; the new weights and moments are written back while the backward goes on,
// and the gradients are dropped. Nothing of the blocks' state is in memory outside the slots.
//
// With several micro-batches a step, a block's gradients accumulate over its backwards: after
// each but the last, its gradient slot is parked, and a parked slot taken for another block is
// first written back to the block's gradient region in the tier, from which its next backward
// reads it again (read ahead as the following block's backward starts). The sums are the same
// floats, in the same order, as in-core accumulation.
//
// Where the budget has room, the last blocks of the store can stay resident instead (their
// weights and moments in memory for the whole run, updated in place; their gradients still pass
// through the gradient slots): their reads and write-backs leave the step. The trainer's planner
// chooses how many (set_resident).
//
// Slots are a small write-back cache: a block's weights stay in their slot after use (and after
// the update, which changes them in place) until the slot is needed for another block; a slot is
// reused only once nothing holds it and its write-back has finished. Transfers run on the tier's
// transfer engine (shared with the run's other clients of the tier), each read after the store's
// writes queued before it, so a block's write-back always lands before a later read of it. Every
// call is thread-safe (the backward and the optimizer's thread share the store).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "tandem/ooc/slow_tier.h"
#include "tandem/ooc/transfer_engine.h"
#include "tandem/parallel/shard.h"

namespace tandem::parallel {

class BlockStore {
 public:
  // The local elements [first, second) of a block whose moments this rank keeps (the rank's slice
  // of it when the optimizer slices its moments), per block of the layout.
  using MomentPieces = std::vector<std::pair<int64_t, int64_t>>;

  // Blocks [first_layer, end_layer) of `layout`. Opens the tier, its
  // bytes reserved now (a full disk or an unwritable folder is a UserError naming the folder and
  // the bytes), and writes zero moments (Adam's start). The weights are the caller's to write
  // (write_weights) before the first step. With `micro_batches` > 1 the tier also has room for
  // every block's gradients, and the store a third gradient slot. The transfers go through
  // `transfers` (the tier's engine), which must outlive the store. `bandwidth`: the tier's, as
  // the performance model measured it (perf/tier_bandwidth.h; the layer above measures, the
  // store only keeps it for the predictions that read bandwidth()).
  BlockStore(const ooc::TierSpec& tier, ooc::TransferEngine& transfers, const ShardLayout& layout,
             const MomentPieces& moments, int micro_batches = 1,
             const ooc::TierBandwidth& bandwidth = {});
  // The same for `blocks` blocks from `first_layer` of `block_floats` elements each (--shard
  // weights: each rank's slices of the blocks, the moments' pieces the same slices).
  BlockStore(const ooc::TierSpec& tier, ooc::TransferEngine& transfers, int first_layer, int blocks,
             int64_t block_floats, const MomentPieces& moments, int micro_batches = 1,
             const ooc::TierBandwidth& bandwidth = {});
  ~BlockStore();
  BlockStore(const BlockStore&) = delete;
  BlockStore& operator=(const BlockStore&) = delete;

  // Compute's use of block l's weights (its local elements, in layout order): held until the
  // matching release(l). A block not in a slot is read now (waiting for a free slot if need be);
  // prefetch(l, in_use) starts its read early when a slot can be had without taking block
  // `in_use`'s (the block computing now, about to be acquired) or another read-ahead block's.
  float* acquire(int layer);
  void release(int layer);
  void prefetch(int layer, int in_use);
  // Block l's gradients for this step, zeroed when first asked for (or the sum so far, read back
  // from the tier); kept until end_update(l), park_gradients(l) or drop_gradients().
  float* gradients(int layer);
  // Block l's backward of a micro-batch that is not the step's last is done: its gradients may
  // leave their slot for the tier until its next backward asks for them.
  void park_gradients(int layer);
  // Starts reading block l's parked gradients back when they are in the tier and a slot is free.
  void prefetch_gradients(int layer);

  // The optimizer's update of block l: its weights (held until end_update), gradients, and moment
  // piece (read ahead by prefetch_moments(l), else now). end_update writes the weights and moments
  // back and frees the gradients.
  struct Update {
    float* w;
    float* g;
    float* m;
    float* v;
  };
  Update begin_update(int layer);
  void end_update(int layer);
  void prefetch_moments(int layer);
  // A backward without an update (the out-of-core profile): its gradients are let go.
  void drop_gradients();

  // Outside a step: block l's weights or moments copied out of or into the store.
  void read_weights(int layer, float* out);
  void write_weights(int layer, const float* in);
  void read_moments(int layer, float* m, float* v);
  void write_moments(int layer, const float* m, const float* v);
  // Waits for every transfer of the store's (not the engine's other clients'); rethrows a failed
  // one.
  void flush();

  // Keeps the last `count` blocks resident from now on (0: every block streams), their state
  // moved between the tier and memory now. Outside a step only.
  void set_resident(int count);
  int resident() const { return resident_; }
  int blocks() const { return static_cast<int>(blocks_.size()); }
  // The memory of `count` resident blocks (weights and moments), beside the slots.
  uint64_t resident_bytes(int count) const;

  // Called on the engine's thread after each transfer of a step: "read h.3 weights", "write h.3
  // weights, moments", and when it ran (for --trace).
  using TransferSink =
      std::function<void(const std::string& name, std::chrono::steady_clock::time_point begin,
                         std::chrono::steady_clock::time_point end)>;
  void set_transfer_sink(TransferSink sink) { sink_ = std::move(sink); }

  // Bytes moved between the slots and the tier, and the seconds the engine spent moving them,
  // since construction (or the last reset).
  struct Traffic {
    uint64_t read_bytes = 0, written_bytes = 0;
    double busy_s = 0;
  };
  Traffic traffic();
  void reset_traffic();
  // What a step moves when no activation is recomputed, on one pipeline stage: every block's
  // moments read and its weights and moments written once; its weights read in each forward and
  // backward but for the blocks still in a weight slot when the pass turns (kWeightSlots at each
  // turn); with M micro-batches, its gradients written and read back M - 1 times when there are
  // more blocks than gradient slots.
  // Resident blocks move nothing.
  Traffic predicted_step_traffic() const { return predicted_step_traffic(resident_); }
  Traffic predicted_step_traffic(int resident) const;
  // The same before a store exists (the planners'): `blocks` blocks of `block_floats` local
  // elements, moment pieces of `piece_floats`, `micro_batches` a step, `resident` of them resident.
  static Traffic predicted_step_traffic(int blocks, int64_t block_floats, int64_t piece_floats,
                                        int micro_batches, int resident = 0);

  int first_layer() const { return first_; }
  int end_layer() const { return first_ + static_cast<int>(blocks_.size()); }
  const MomentPieces& moment_pieces() const { return pieces_; }
  uint64_t tier_bytes() const { return tier_->capacity(); }
  // Bytes of the staging slots (weights, gradients, moments).
  uint64_t staging_bytes() const;
  // The same before a store exists (the memory estimate's): a store whose largest block has
  // `block_floats` local elements and largest moment piece `piece_floats`, `micro_batches` a step;
  // and what one block of those sizes takes resident (its weights and moments).
  static uint64_t staging_bytes(int64_t block_floats, int64_t piece_floats, int micro_batches);
  static uint64_t resident_block_bytes(int64_t block_floats, int64_t piece_floats);
  // The tier's bandwidth given when the store was made (0 each way when none was): what the
  // performance model times the predicted traffic at (perf/streamed_state.h's store_io_s).
  const ooc::TierBandwidth& bandwidth() const { return bandwidth_; }
  std::string describe() const { return tier_->describe(); }

  // Slots of each kind: weights (the block computing, the next read ahead, the one the update
  // holds, one spare), gradients (the block whose update runs, the block computing, and with
  // several micro-batches the next block's sum read ahead), moments.
  static constexpr int kWeightSlots = 4, kMomentSlots = 2;
  static constexpr int gradient_slots(int micro_batches) { return micro_batches > 1 ? 3 : 2; }

 private:
  struct Slot;
  struct Block {
    uint64_t w_at = 0, m_at = 0, v_at = 0, g_at = 0;  // tier offsets (g_at: M > 1 only)
    int w_slot = -1, g_slot = -1, mv_slot = -1;
    bool g_in_tier = false;  // this step's gradient sum so far is in the tier, not in a slot
    char* home = nullptr;    // resident: its weights, then its moments m and v, in memory
  };
  enum class Kind { Weights, Gradients, Moments };

  Block& block(int layer);
  // A slot of `kind` for block `layer`: a free one, else the least recently used block's but for
  // block `keep`'s and those read ahead and not yet used. With `wait`, waits while transfers in
  // flight may free one, and takes a read-ahead block's only when nothing else ever will; without,
  // returns -1 at once. Called with the mutex held.
  int take_slot(std::unique_lock<std::mutex>& lock, Kind kind, int layer, bool wait, int keep = -1);
  // Queues the read of block `layer`'s weights, gradients or moments into its slot. Mutex held.
  void start_read(Kind kind, int layer);
  // Queues the write of a parked gradient slot back to block `layer`'s region. Mutex held.
  void start_gradient_write(int slot, int layer);
  // A transfer of slots `slot` and `other` (-1: none) is over: the traffic, the trace, the slots'
  // counts. On the engine's thread.
  void transferred(const ooc::TransferEngine::Span& span, std::exception_ptr failed, int slot,
                   int other = -1);
  // Waits until the slot's reads (and, with `writes`, its writes) have run. Mutex held (released
  // while waiting).
  void await(std::unique_lock<std::mutex>& lock, int slot, bool writes = false);
  float* data(int slot) const;
  // A resident block's moments in its home.
  float* home_m(int layer);
  float* home_v(int layer);
  uint64_t weight_bytes() const;
  uint64_t piece_bytes(int layer) const;

  int first_ = 0;
  int micro_batches_ = 1;
  int64_t block_floats_ = 0;
  MomentPieces pieces_;
  std::vector<Block> blocks_;
  std::vector<Slot> slots_;
  uint64_t w_slot_bytes_ = 0, mv_slot_bytes_ = 0;
  char* staging_ = nullptr;
  int resident_ = 0;
  char* resident_mem_ = nullptr;  // the resident blocks' homes
  std::unique_ptr<ooc::SlowTier> tier_;
  ooc::TierBandwidth bandwidth_;
  std::mutex mutex_;
  std::condition_variable changed_;
  uint64_t clock_ = 0;        // for least recently used
  std::exception_ptr error_;  // the first failed transfer
  Traffic traffic_;
  TransferSink sink_;
  ooc::TransferEngine::Ticket last_write_ = 0;  // the last write-back queued: reads follow it
  ooc::TransferEngine::Client io_;              // last: its transfers end before the rest goes
};

}  // namespace tandem::parallel
