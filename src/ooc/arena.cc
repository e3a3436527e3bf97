// The budgeted fast-tier arena: placement checks and the high-water mark.
#include "tandem/ooc/arena.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "tandem/core/bytes.h"
#include "tandem/core/error.h"

namespace tandem::ooc {

Arena::Arena(uint64_t budget) : budget_(budget), mapped_((budget + 4095) / 4096 * 4096) {
  if (budget == 0) user_error("a memory budget of 0 bytes holds nothing");
  void* p = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    user_error("cannot reserve the fast-tier arena of {} ({} bytes): {}", human_bytes(budget),
               budget, std::strerror(errno));
  base_ = static_cast<char*>(p);
}

void Arena::shrink(uint64_t budget) {
  TANDEM_CHECK(budget > 0 && budget <= budget_ && live_regions_.empty(),
               "arena of {} bytes shrunk to {} with {} live", budget_, budget, live_);
  budget_ = budget;
  // The pages past the new budget go back to the system (steps run before, such as the
  // profile's, may have touched them): what the budget no longer holds is not resident.
  const uint64_t keep = (budget + 4095) / 4096 * 4096;
  if (keep < mapped_) madvise(base_ + keep, mapped_ - keep, MADV_DONTNEED);
}

Arena::~Arena() {
  if (base_ != nullptr) munmap(base_, mapped_);
}

char* Arena::acquire(uint64_t offset, uint64_t bytes, std::string_view name) {
  TANDEM_CHECK(offset + bytes <= budget_, "region {} [{}, {}) passes the budget of {} bytes", name,
               offset, offset + bytes, budget_);
  auto next = live_regions_.lower_bound(offset);
  if (next != live_regions_.end())
    TANDEM_CHECK(offset + bytes <= next->first, "region {} [{}, {}) overlaps live region {} at {}",
                 name, offset, offset + bytes, next->second.name, next->first);
  if (next != live_regions_.begin()) {
    auto prev = std::prev(next);
    TANDEM_CHECK(prev->first + prev->second.bytes <= offset,
                 "region {} at {} overlaps live region {} [{}, {})", name, offset,
                 prev->second.name, prev->first, prev->first + prev->second.bytes);
  }
  live_regions_.emplace(offset, Live{bytes, std::string(name)});
  live_ += bytes;
  high_water_ = std::max(high_water_, offset + bytes);
  return base_ + offset;
}

void Arena::release(uint64_t offset) {
  auto it = live_regions_.find(offset);
  TANDEM_CHECK(it != live_regions_.end(), "no live region at {}", offset);
  live_ -= it->second.bytes;
  live_regions_.erase(it);
}

}  // namespace tandem::ooc
