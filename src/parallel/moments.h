// The optimizer pieces' moments that no block placement keeps: one object, in memory or in a
// slow tier (--optimizer-state: tiered_state.h), chosen once when the optimizer places its
// moments. A step runs begin_step, then each piece's begin_update / end_update in piece order
// (a tier stages them in that order), then finish_step. Internal to parallel/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tandem::parallel::detail {

class Moments {
 public:
  virtual ~Moments() = default;

  virtual void begin_step() {}
  // Piece i's m and v (as many floats each as its length), held until end_update(i).
  struct View {
    float* m = nullptr;
    float* v = nullptr;
  };
  virtual View begin_update(size_t piece) = 0;
  virtual void end_update(size_t piece) {}
  virtual void finish_step() {}

  // Outside a step (checkpoints): piece i's moments copied out or in.
  virtual void read(size_t piece, float* m, float* v) = 0;
  virtual void write(size_t piece, const float* m, const float* v) = 0;

  // Bytes in memory (a tier's: its staging slots), in the tier, and the tier ("": in memory).
  virtual uint64_t memory_bytes() const = 0;
  virtual uint64_t tier_bytes() const { return 0; }
  virtual std::string describe() const { return ""; }
};

// Every piece's moments in memory, zero (Adam's start): `lengths[i]` floats of m and of v each.
std::unique_ptr<Moments> memory_moments(const std::vector<int64_t>& lengths);

}  // namespace tandem::parallel::detail
