// The optimizer state in the slow tier (see tiered_state.h).
#include "tiered_state.h"

#include <cstdlib>
#include <cstring>

#include "tandem/core/error.h"

namespace tandem::parallel::detail {

TieredState::TieredState(const ooc::TierSpec& spec, const std::vector<int64_t>& lengths,
                         ooc::TransferEngine& engine)
    : lengths_(lengths), io_(engine), read_ticket_(lengths.size(), 0) {
  uint64_t total = 0;
  for (size_t i = 0; i < lengths_.size(); ++i) {
    offset_.push_back(total);
    total += 2 * half(i);
    slot_bytes_ = std::max(slot_bytes_, half(i));
  }
  tier_ = ooc::open_slow_tier(spec, std::max<uint64_t>(total, ooc::kIoAlignment),
                              "the optimizer state (--optimizer-state)");
  slot_bytes_ = std::max<uint64_t>(slot_bytes_, ooc::kIoAlignment);
  staging_ = static_cast<char*>(std::aligned_alloc(ooc::kIoAlignment, 4 * slot_bytes_));
  if (staging_ == nullptr)
    user_error("cannot allocate {} bytes of optimizer-state staging", 4 * slot_bytes_);
  // Zeros everywhere, written through the slots (the file tier takes aligned transfers only).
  std::memset(staging_, 0, 4 * slot_bytes_);
  for (size_t i = 0; i < lengths_.size(); ++i) {
    tier_->write(offset_[i], staging_, half(i));
    tier_->write(offset_[i] + half(i), staging_, half(i));
  }
}

TieredState::~TieredState() {
  try {
    io_.wait_all();  // nothing may still use the slots
  } catch (...) {    // the error was reported where it happened
  }
  std::free(staging_);
}

float* TieredState::m(size_t i) const {
  return reinterpret_cast<float*>(staging_ + (i % 2) * 2 * slot_bytes_);
}
float* TieredState::v(size_t i) const {
  return reinterpret_cast<float*>(staging_ + ((i % 2) * 2 + 1) * slot_bytes_);
}

void TieredState::prefetch(size_t i) {
  if (i >= lengths_.size()) return;
  read_ticket_[i] =
      io_.read_async(*tier_, {{offset_[i], m(i), half(i)}, {offset_[i] + half(i), v(i), half(i)}},
                     "", last_write_);
}

void TieredState::begin_step() {
  prefetch(0);
  prefetch(1);
}

Moments::View TieredState::begin_update(size_t i) {
  io_.wait(read_ticket_[i]);
  return {m(i), v(i)};
}

void TieredState::end_update(size_t i) {
  last_write_ =
      io_.write_async(*tier_, {{offset_[i], m(i), half(i)}, {offset_[i] + half(i), v(i), half(i)}});
  prefetch(i + 2);
}

void TieredState::finish_step() { io_.wait_all(); }

void TieredState::read(size_t i, float* m_out, float* v_out) {
  io_.wait_all();
  tier_->read(offset_[i], m(0), half(i));
  tier_->read(offset_[i] + half(i), v(0), half(i));
  std::memcpy(m_out, m(0), static_cast<size_t>(lengths_[i]) * sizeof(float));
  std::memcpy(v_out, v(0), static_cast<size_t>(lengths_[i]) * sizeof(float));
}

void TieredState::write(size_t i, const float* m_in, const float* v_in) {
  io_.wait_all();
  std::memset(m(0), 0, half(i));
  std::memset(v(0), 0, half(i));
  std::memcpy(m(0), m_in, static_cast<size_t>(lengths_[i]) * sizeof(float));
  std::memcpy(v(0), v_in, static_cast<size_t>(lengths_[i]) * sizeof(float));
  tier_->write(offset_[i], m(0), half(i));
  tier_->write(offset_[i] + half(i), v(0), half(i));
}

}  // namespace tandem::parallel::detail
