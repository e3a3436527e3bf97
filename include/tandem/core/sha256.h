// SHA-256 (FIPS 180-4): a strong content hash, for checking that a file is the one that was
// written (the JIT cache records the hash of every shared object it compiles, checkpoints the
// hash of every tensor).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

struct evp_md_ctx_st;  // OpenSSL's EVP_MD_CTX, kept out of callers' includes

namespace tandem {

// Fed in pieces with update(), read once with hex(). Owns an OpenSSL digest context: movable,
// not copyable; a moved-from object may only be assigned to or destroyed.
class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t bytes);
  void update(std::string_view s) { update(s.data(), s.size()); }
  std::string hex();  // 64 lowercase hex digits; the object is spent afterwards

 private:
  struct Free {
    void operator()(evp_md_ctx_st* ctx) const;
  };
  std::unique_ptr<evp_md_ctx_st, Free> ctx_;
};

// The SHA-256 of `s`, as 64 lowercase hex digits.
std::string sha256_hex(std::string_view s);

}  // namespace tandem
