// The optimizer state beside the slow tier (KARMA's multi-rank out-of-core): the moments of
// every optimizer segment live in a slow tier (host memory or an O_DIRECT file, ooc/slow_tier.h),
// and the fast tier holds two staging slots, each the size of the largest segment's state.
// Segments run in a fixed order 0, 1, 2, ...; segment i's state is read into slot i % 2 ahead of
// its run (while segment i - 1 runs), and written back after it, by the tier's transfer engine, so
// the transfers overlap the updates and the backward. Slot reuse is safe because every read
// follows the writes queued before it: segment i's write-back lands before segment i + 2's read.
// Internal to parallel/.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "tandem/core/bytes.h"
#include "tandem/ooc/slow_tier.h"
#include "tandem/ooc/transfer_engine.h"

namespace tandem::parallel::detail {

class TieredState {
 public:
  // `lengths[i]`: floats of segment i's m (and of its v). Opens the tier (a full disk or an
  // unwritable folder is a UserError now) and writes zeros: Adam's moments start at zero. The
  // transfers go through `engine` (the tier's), which must outlive this.
  TieredState(const ooc::TierSpec& spec, const std::vector<int64_t>& lengths,
              ooc::TransferEngine& engine);
  ~TieredState();

  // Segment i's staging: its slot's m and v (lengths[i] floats each).
  float* m(size_t i) const;
  float* v(size_t i) const;

  // A step: prefetch the first two segments; before segment i runs, await(i); after, done(i)
  // writes it back and prefetches segment i + 2. finish() waits for every transfer.
  void begin();
  void await(size_t i);
  void done(size_t i);
  void finish();

  // Outside a step (checkpoints): segment i's state, copied out of or into the tier.
  void read(size_t i, float* m, float* v);
  void write(size_t i, const float* m, const float* v);

  uint64_t tier_bytes() const { return tier_->capacity(); }
  uint64_t staging_bytes() const { return 2 * 2 * slot_bytes_; }
  std::string describe() const { return tier_->describe(); }

 private:
  void prefetch(size_t i);
  uint64_t half(size_t i) const {
    return round_up(static_cast<uint64_t>(lengths_[i]) * sizeof(float), ooc::kIoAlignment);
  }

  std::vector<int64_t> lengths_;
  std::vector<uint64_t> offset_;  // segment i's m at offset_[i], its v at offset_[i] + half(i)
  uint64_t slot_bytes_ = 0;       // one slot's m (or v): the largest half
  std::unique_ptr<ooc::SlowTier> tier_;
  char* staging_ = nullptr;         // slots 0 and 1: [m0 | v0 | m1 | v1], kIoAlignment-aligned
  ooc::TransferEngine::Client io_;  // after tier_: its transfers end before the tier closes
  std::vector<ooc::TransferEngine::Ticket> read_ticket_;
  ooc::TransferEngine::Ticket last_write_ = 0;  // every read follows it
};

}  // namespace tandem::parallel::detail
