// The one allocator interface every tensor's storage comes from, so that a memory budget (the
// out-of-core arena) or a measurement (CountingAllocator) can stand in for the host heap.
#pragma once

#include <atomic>
#include <cstddef>
#include <string_view>

namespace tandem {

inline constexpr size_t kTensorAlignment = 64;  // one cache line; a full AVX-512 register

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns storage of at least `bytes`, aligned to kTensorAlignment; throws on failure.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* p, size_t bytes) noexcept = 0;
  virtual std::string_view name() const = 0;
};

// The process heap, 64-byte aligned. Thread-safe.
Allocator& host_allocator();

// Forwards to another allocator and records the bytes live now and at the high-water mark.
class CountingAllocator final : public Allocator {
 public:
  explicit CountingAllocator(Allocator& base = host_allocator()) : base_(base) {}
  void* allocate(size_t bytes) override;
  void deallocate(void* p, size_t bytes) noexcept override;
  std::string_view name() const override { return "counting"; }

  size_t live_bytes() const { return live_.load(); }
  size_t peak_bytes() const { return peak_.load(); }

 private:
  Allocator& base_;
  std::atomic<size_t> live_{0};
  std::atomic<size_t> peak_{0};
};

}  // namespace tandem
