// The aligned host allocator and the counting wrapper.
#include "tandem/core/allocator.h"

#include <cstdlib>
#include <new>

#include "tandem/core/error.h"

namespace tandem {
namespace {

class HostAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    // aligned_alloc needs a size that is a multiple of the alignment; never ask for 0 bytes.
    size_t rounded = (bytes + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
    if (rounded == 0) rounded = kTensorAlignment;
    void* p = std::aligned_alloc(kTensorAlignment, rounded);
    if (p == nullptr) user_error("out of host memory allocating {} bytes", bytes);
    return p;
  }
  void deallocate(void* p, size_t) noexcept override { std::free(p); }
  std::string_view name() const override { return "host"; }
};

}  // namespace

Allocator& host_allocator() {
  static HostAllocator a;
  return a;
}

void* CountingAllocator::allocate(size_t bytes) {
  void* p = base_.allocate(bytes);
  size_t now = live_.fetch_add(bytes) + bytes;
  size_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
  return p;
}

void CountingAllocator::deallocate(void* p, size_t bytes) noexcept {
  live_.fetch_sub(bytes);
  base_.deallocate(p, bytes);
}

}  // namespace tandem
