// SHA-256 via OpenSSL's libcrypto: its EVP digest uses the CPU's SHA extensions where there are
// some (about 2 GB/s with SHA-NI), so checksumming a checkpoint costs little next to writing it.
#include "tandem/core/sha256.h"

#include <openssl/evp.h>

#include "tandem/core/error.h"

namespace tandem {

void Sha256::Free::operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  TANDEM_CHECK(ctx_ != nullptr, "OpenSSL could not allocate a digest context");
  TANDEM_CHECK(EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) == 1,
               "OpenSSL could not start a SHA-256 digest");
}

void Sha256::update(const void* data, size_t bytes) {
  TANDEM_CHECK(ctx_ != nullptr, "update() of a moved-from Sha256");
  if (bytes == 0) return;
  TANDEM_CHECK(EVP_DigestUpdate(ctx_.get(), data, bytes) == 1, "OpenSSL failed to hash {} bytes",
               bytes);
}

std::string Sha256::hex() {
  TANDEM_CHECK(ctx_ != nullptr, "hex() of a moved-from Sha256");
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  TANDEM_CHECK(EVP_DigestFinal_ex(ctx_.get(), digest, &size) == 1 && size == 32,
               "OpenSSL failed to finish a SHA-256 digest ({} bytes)", size);
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * size, '\0');
  for (unsigned int i = 0; i < size; ++i) {
    out[2 * i] = kDigits[digest[i] >> 4];
    out[2 * i + 1] = kDigits[digest[i] & 15];
  }
  return out;
}

std::string sha256_hex(std::string_view s) {
  Sha256 h;
  h.update(s);
  return h.hex();
}

}  // namespace tandem
