// The optimizer state beside the slow tier (KARMA's multi-rank out-of-core): the moments of
// every optimizer segment live in a slow tier (host memory or an O_DIRECT file, ooc/slow_tier.h),
// and the fast tier holds two staging slots, each the size of the largest segment's state.
// Segments run in a fixed order 0, 1, 2, ...; segment i's state is read into slot i % 2 ahead of
// its run (while segment i - 1 runs), and written back after it, by the tier's transfer engine, so
// the transfers overlap the updates and the backward. Slot reuse is safe because every read
// follows the writes queued before it: segment i's write-back lands before segment i + 2's read.
// The tiered implementation of the moments (moments.h). Internal to parallel/.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "moments.h"
#include "tandem/core/bytes.h"
#include "tandem/ooc/slow_tier.h"
#include "tandem/ooc/transfer_engine.h"

namespace tandem::parallel::detail {

class TieredState final : public Moments {
 public:
  // `lengths[i]`: floats of segment i's m (and of its v). Opens the tier (a full disk or an
  // unwritable folder is a UserError now) and writes zeros: Adam's moments start at zero. The
  // transfers go through `engine` (the tier's), which must outlive this.
  TieredState(const ooc::TierSpec& spec, const std::vector<int64_t>& lengths,
              ooc::TransferEngine& engine);
  ~TieredState() override;

  // A step: begin_step prefetches the first two segments; begin_update(i) waits for segment i's
  // read and gives its slot's m and v; end_update(i) writes it back and prefetches segment i + 2.
  // finish_step waits for every transfer.
  void begin_step() override;
  View begin_update(size_t i) override;
  void end_update(size_t i) override;
  void finish_step() override;

  // Outside a step (checkpoints): segment i's state, copied out of or into the tier.
  void read(size_t i, float* m, float* v) override;
  void write(size_t i, const float* m, const float* v) override;

  // In memory: the two staging slots' m and v.
  uint64_t memory_bytes() const override { return 2 * 2 * slot_bytes_; }
  uint64_t tier_bytes() const override { return tier_->capacity(); }
  std::string describe() const override { return tier_->describe(); }

 private:
  // Segment i's staging: its slot's m and v (lengths[i] floats each).
  float* m(size_t i) const;
  float* v(size_t i) const;
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
