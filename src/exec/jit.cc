// Compiles, caches and loads JIT kernels; see jit.h for the cache's contract.
#include "tandem/exec/jit.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "tandem/core/env.h"
#include "tandem/core/error.h"

namespace tandem::exec {
namespace fs = std::filesystem;
namespace {

std::mutex g_mutex;  // guards the counters and the table of loaded modules
JitStats g_stats;
std::map<std::string, std::weak_ptr<JitModule>> g_loaded;

// 128-bit FNV-1a (two 64-bit lanes with different offsets): a stable content hash for file names.
std::string hash128(const std::string& s) {
  uint64_t a = 0xcbf29ce484222325ull, b = 0x84222325cbf29ce4ull;
  for (unsigned char c : s) {
    a = (a ^ c) * 0x100000001b3ull;
    b = (b ^ (c + 0x5bu)) * 0x100000001b3ull;
  }
  return fmt::format("{:016x}{:016x}", a, b);
}

// Runs a shell command, returning its exit status and combined output.
std::pair<int, std::string> run_command(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) user_error("could not run '{}'", cmd);
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string resolve_cxx(const JitOptions& o) {
  if (!o.cxx.empty()) return o.cxx;
  return env_str("CXX", "c++");
}

// What the compiler is and what -march=native means on this machine: the compiler's version line
// and its cc1 command line for an empty input (which spells out the resolved -march and -mtune).
const std::string& compiler_identity(const std::string& cxx) {
  static std::mutex m;
  static std::map<std::string, std::string> cache;
  std::lock_guard<std::mutex> lock(m);
  auto it = cache.find(cxx);
  if (it != cache.end()) return it->second;
  auto [rc, version] = run_command(shell_quote(cxx) + " --version");
  if (rc != 0) user_error("the JIT's compiler '{}' does not run (set CXX to a C++20 compiler):\n{}", cxx, version);
  auto [rc2, native] = run_command(shell_quote(cxx) + " -march=native -x c++ -E -v - </dev/null");
  std::string cc1;
  std::istringstream lines(native);
  for (std::string line; std::getline(lines, line);)
    if (line.find("cc1") != std::string::npos && line.find("-march") != std::string::npos) cc1 = line;
  return cache[cxx] = version.substr(0, version.find('\n')) + "\n" + cc1;
}

std::string key_of(const std::string& source, const std::string& cxx, const std::vector<std::string>& flags) {
  std::string all = source + "\n--cxx--\n" + cxx + "\n" + compiler_identity(cxx) + "\n--flags--\n";
  for (const auto& f : flags) all += f + " ";
  return hash128(all);
}

// Holds an exclusive flock on a file for its lifetime.
class FileLock {
 public:
  explicit FileLock(const fs::path& path) {
    fd_ = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    if (fd_ < 0) user_error("cannot create the JIT lock file {}", path.string());
    if (::flock(fd_, LOCK_EX) != 0) {
      ::close(fd_);
      user_error("cannot lock {}", path.string());
    }
  }
  ~FileLock() {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_;
};

void write_file_atomically(const fs::path& path, const std::string& contents) {
  const fs::path tmp = path.string() + fmt::format(".tmp.{}", ::getpid());
  {
    std::ofstream f(tmp, std::ios::binary);
    f << contents;
    if (!f) user_error("cannot write {} (is the disk full?)", tmp.string());
  }
  fs::rename(tmp, path);
}

}  // namespace

std::vector<std::string> default_jit_flags() {
  return {"-std=c++20", "-O3", "-march=native", "-fPIC", "-shared", "-fno-math-errno",
          "-ffp-contract=off", "-fno-plt"};
}

JitModule::JitModule(void* handle, std::string path, std::string key, bool compiled_now)
    : handle_(handle), path_(std::move(path)), key_(std::move(key)), compiled_now_(compiled_now) {}

JitModule::~JitModule() { dlclose(handle_); }

void* JitModule::symbol(const std::string& name) const {
  void* s = dlsym(handle_, name.c_str());
  if (s == nullptr) internal_error(fmt::format("JIT module {} has no symbol '{}'", path_, name));
  return s;
}

std::string jit_cache_dir(const JitOptions& o) {
  if (!o.cache_dir.empty()) return o.cache_dir;
  std::string dir = env_str("TANDEM_CACHE_DIR", "");
  if (!dir.empty()) return dir;
  return env_str("HOME", "/tmp") + "/.cache/tandem";
}

std::string jit_cache_key(const std::string& source, const JitOptions& options) {
  const auto flags = options.flags.empty() ? default_jit_flags() : options.flags;
  return key_of(source, resolve_cxx(options), flags);
}

std::shared_ptr<JitModule> jit_compile(const std::string& source, const JitOptions& options) {
  const std::string cxx = resolve_cxx(options);
  const auto flags = options.flags.empty() ? default_jit_flags() : options.flags;
  const std::string key = key_of(source, cxx, flags);
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (auto loaded = g_loaded[key].lock()) {
      ++g_stats.memory_hits;
      return loaded;
    }
  }

  // Sharded by the key's first two digits, so no folder grows huge.
  const fs::path dir = fs::path(jit_cache_dir(options)) / key.substr(0, 2);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) user_error("cannot create the JIT cache folder {}: {}", dir.string(), ec.message());
  const fs::path so = dir / (key + ".so");
  bool compiled_now = false;
  {
    FileLock lock(dir / (key + ".lock"));
    if (!fs::exists(so)) {
      const fs::path src = dir / (key + ".cc");
      write_file_atomically(src, source);
      const fs::path tmp = so.string() + fmt::format(".tmp.{}", ::getpid());
      std::string cmd = shell_quote(cxx);
      // Appended piecewise: GCC 12 warns falsely (-Wrestrict) on chained string concatenation.
      for (const auto& f : {flags, std::vector<std::string>{src.string(), "-o", tmp.string()}})
        for (const auto& word : f) {
          cmd += ' ';
          cmd += shell_quote(word);
        }
      auto [rc, output] = run_command(cmd);
      if (rc != 0) {
        fs::remove(tmp, ec);
        user_error("JIT compile failed (exit {}):\n  {}\n{}", rc, cmd, output);
      }
      fs::rename(tmp, so);
      compiled_now = true;
    }
  }
  void* handle = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) user_error("cannot load JIT module {}: {}", so.string(), dlerror());
  auto module = std::make_shared<JitModule>(handle, so.string(), key, compiled_now);
  std::lock_guard<std::mutex> lock(g_mutex);
  ++(compiled_now ? g_stats.compiles : g_stats.disk_hits);
  g_loaded[key] = module;
  return module;
}

JitStats jit_stats() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_stats;
}

}  // namespace tandem::exec
