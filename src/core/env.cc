// Reads TANDEM_* settings from the environment with a clear error for malformed values.
#include "tandem/core/env.h"

#include <cerrno>
#include <cstdlib>

#include "tandem/core/error.h"

namespace tandem {

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(v, &end, 0);
  if (*end != '\0') user_error("environment variable {}='{}' is not an integer", name, v);
  if (errno == ERANGE)
    user_error("environment variable {}='{}' is out of range (a 64-bit integer)", name, v);
  return x;
}

std::string env_str(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v == nullptr ? fallback : std::string(v);
}

}  // namespace tandem
