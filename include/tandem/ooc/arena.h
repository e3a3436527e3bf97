// The fast tier: one block of memory of exactly the budget, in which a MemorySchedule places
// every buffer at its offset. The arena checks each placement (inside the budget, not
// overlapping a live region) and measures its high-water mark: the highest byte any live region
// reached. Its pages are touched only where regions are, so resident memory follows use.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace tandem::ooc {

class Arena {
 public:
  // UserError if the memory cannot be reserved.
  explicit Arena(uint64_t budget);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // The region [offset, offset + bytes) goes live; returns its memory. An InternalError if it
  // passes the budget or overlaps a live region: the schedule that placed it is wrong.
  char* acquire(uint64_t offset, uint64_t bytes, std::string_view name);
  void release(uint64_t offset);
  char* at(uint64_t offset) const { return base_ + offset; }

  uint64_t budget() const { return budget_; }
  // A smaller budget, while nothing is live: the rest of the reservation is released to the
  // system and never touched again.
  void shrink(uint64_t budget);
  uint64_t high_water() const { return high_water_; }  // max end of a live region, ever
  uint64_t live_bytes() const { return live_; }
  void reset_high_water() { high_water_ = 0; }

 private:
  char* base_ = nullptr;
  uint64_t budget_, mapped_;
  uint64_t high_water_ = 0, live_ = 0;
  struct Live {
    uint64_t bytes;
    std::string name;
  };
  std::map<uint64_t, Live> live_regions_;
};

}  // namespace tandem::ooc
