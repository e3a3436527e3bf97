// Shared by the tune suites: a temporary cache folder per test (TANDEM_CACHE_DIR points at it, so
// the JIT's kernels and the tuner's records land there and vanish afterwards).
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace tandem::testing {

class TempCacheDir {
 public:
  explicit TempCacheDir(const std::string& tag) {
    path_ = std::filesystem::temp_directory_path() /
            fmt::format("tandem-tune-test-{}-{}-{}", tag, ::getpid(), counter()++);
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
    const char* old = std::getenv("TANDEM_CACHE_DIR");
    had_old_ = old != nullptr;
    if (had_old_) old_ = old;
    ::setenv("TANDEM_CACHE_DIR", path_.c_str(), 1);
  }
  ~TempCacheDir() {
    if (had_old_)
      ::setenv("TANDEM_CACHE_DIR", old_.c_str(), 1);
    else
      ::unsetenv("TANDEM_CACHE_DIR");
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempCacheDir(const TempCacheDir&) = delete;
  TempCacheDir& operator=(const TempCacheDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }

 private:
  static int& counter() {
    static int n = 0;
    return n;
  }
  std::filesystem::path path_;
  bool had_old_ = false;
  std::string old_;
};

}  // namespace tandem::testing
