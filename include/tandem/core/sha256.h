// SHA-256 (FIPS 180-4): a strong content hash, for checking that a file is the one that was
// written (the JIT cache records the hash of every shared object it compiles).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tandem {

// Fed in pieces with update(), read once with hex().
class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t bytes);
  void update(std::string_view s) { update(s.data(), s.size()); }
  std::string hex();  // 64 lowercase hex digits; the object is spent afterwards

 private:
  void block(const uint8_t* p);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_{};
  size_t used_ = 0;     // bytes waiting in buf_
  uint64_t total_ = 0;  // bytes fed so far
};

// The SHA-256 of `s`, as 64 lowercase hex digits.
std::string sha256_hex(std::string_view s);

}  // namespace tandem
