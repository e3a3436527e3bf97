// The CPU JIT's compile cache (after TorchInductor's code cache): C++ source is compiled into a
// shared object with the system compiler, cached on disk by a hash of everything that decides the
// machine code (source, compiler and version, flags, the instruction set -march=native resolves
// to), and loaded with dlopen. Several threads or processes compiling the same source wait on a
// per-key file lock; files are written under a temporary name and renamed into place.
//
// Loading runs the object's code, so the cache is private (core/private_cache.h: never a shared
// folder, folders 0700 and files 0600, the .so 0700; what another user owns or can write is
// refused). Beside each <key>.so, <key>.sha256 records the SHA-256 of what was compiled (in
// sha256sum's format); an entry that does not match it (garbage, truncated, another program's
// library) is compiled again before anything loads it, with one line on stderr saying so.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tandem::exec {

struct JitOptions {
  std::string cxx;                 // empty: $CXX, else "c++"
  std::vector<std::string> flags;  // empty: default_jit_flags()
  std::string cache_dir;           // empty: default_cache_dir() (core/private_cache.h)
};

// -O3 -march=native -fPIC -shared -std=c++20 -fno-math-errno -ffp-contract=off: the last two
// match the library's own flags, so that compiled schedules round exactly as the interpreter does.
std::vector<std::string> default_jit_flags();

// A loaded shared object; unloaded when the last reference goes.
class JitModule {
 public:
  JitModule(void* handle, std::string path, std::string key, bool compiled_now);
  ~JitModule();
  JitModule(const JitModule&) = delete;
  JitModule& operator=(const JitModule&) = delete;

  // The address of an extern "C" symbol; a missing one is an InternalError naming it.
  void* symbol(const std::string& name) const;
  const std::string& path() const { return path_; }
  const std::string& key() const { return key_; }
  bool compiled_now() const { return compiled_now_; }  // false: it came from the cache

 private:
  void* handle_;
  std::string path_, key_;
  bool compiled_now_;
};

// Compiles `source` (or finds it in the cache) and loads it. A failed compile is a UserError
// carrying the command and the compiler's output.
std::shared_ptr<JitModule> jit_compile(const std::string& source, const JitOptions& options = {});

// The cache key jit_compile would use: 32 hex digits.
std::string jit_cache_key(const std::string& source, const JitOptions& options = {});

// The cache folder jit_compile would use.
std::string jit_cache_dir(const JitOptions& options = {});

// Counters for this process, so tests can check that a second run compiles nothing.
struct JitStats {
  int64_t compiles = 0;
  int64_t disk_hits = 0;    // found compiled on disk
  int64_t memory_hits = 0;  // already loaded in this process
};
JitStats jit_stats();

}  // namespace tandem::exec
