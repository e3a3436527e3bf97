// Compiles, caches and loads JIT kernels; see jit.h for the cache's contract.
#include "tandem/exec/jit.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>

#include "tandem/core/env.h"
#include "tandem/core/error.h"
#include "tandem/core/file_io.h"
#include "tandem/core/private_cache.h"
#include "tandem/core/sha256.h"

namespace tandem::exec {
namespace fs = std::filesystem;
namespace {

constexpr const char* kCacheFormat = "tandem-jit-3 (sha256 recorded, key symbol)";
// The symbol every module defines: its cache key, checked after a module is loaded from the cache.
constexpr const char* kKeySymbol = "tandem_jit_key";

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

// When this process is (nearly) out of file descriptors, the message that says so: a command it
// starts then cannot open its pipes, libraries or files, and fails in ways that blame the
// command. Counts /proc/self/fd against the soft RLIMIT_NOFILE; "" when there is room.
std::string out_of_descriptors(int err) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return "";
  std::error_code ec;
  size_t open = 0;
  for (auto it = fs::directory_iterator("/proc/self/fd", ec); !ec && it != fs::directory_iterator();
       it.increment(ec))
    ++open;
  // A compiler needs a few dozen of its own (libraries, temporary files, pipes to its passes).
  constexpr size_t kHeadroom = 32;
  if (err != EMFILE && err != ENFILE && (ec || open + kHeadroom < limit.rlim_cur)) return "";
  if (err == ENFILE) return "the system has run out of file descriptors (ENFILE)";
  return fmt::format(
      "this process has run out of file descriptors: {} of its limit of {} are open (raise it "
      "with ulimit -n)",
      open, limit.rlim_cur);
}

// Runs a shell command, returning its exit status and combined output.
std::pair<int, std::string> run_command(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) {
    const int err = errno;
    if (const std::string why = out_of_descriptors(err); !why.empty())
      user_error("the JIT cannot run its compiler: {}", why);
    user_error("could not run '{}': {}", cmd, std::strerror(err));
  }
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
  if (rc != 0) {
    if (const std::string why = out_of_descriptors(0); !why.empty())
      user_error("the JIT cannot run its compiler '{}': {}", cxx, why);
    user_error("the JIT's compiler '{}' does not run (set CXX to a C++20 compiler):\n{}", cxx,
               version);
  }
  auto [rc2, native] = run_command(shell_quote(cxx) + " -march=native -x c++ -E -v - </dev/null");
  std::string cc1;
  std::istringstream lines(native);
  for (std::string line; std::getline(lines, line);)
    if (line.find("cc1") != std::string::npos && line.find("-march") != std::string::npos)
      cc1 = line;
  return cache[cxx] = version.substr(0, version.find('\n')) + "\n" + cc1;
}

std::string key_of(const std::string& source, const std::string& cxx,
                   const std::vector<std::string>& flags) {
  // The cache's layout is part of the key: entries from before the SHA-256 record are never
  // consulted.
  std::string all = std::string(kCacheFormat) + "\n" + source + "\n--cxx--\n" + cxx + "\n" +
                    compiler_identity(cxx) + "\n--flags--\n";
  for (const auto& f : flags) all += f + " ";
  return hash128(all);
}

// Holds an exclusive flock on a file for its lifetime. The file is opened without following a
// symbolic link and must be this user's own regular file, so a planted link creates nothing.
class FileLock {
 public:
  explicit FileLock(const fs::path& path) {
    fd_ = ::open(path.c_str(), O_CREAT | O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd_ < 0 && errno == ELOOP)
      user_error("the JIT lock file {} is a symbolic link, which tandem never makes; remove it",
                 path.string());
    if (fd_ < 0)
      user_error("cannot create the JIT lock file {}: {}", path.string(), std::strerror(errno));
    try {
      check_private_file(fd_, path.string());
    } catch (const UserError&) {
      ::close(fd_);
      throw;
    }
    ::fchmod(fd_, 0600);  // the umask may have taken bits the next run needs
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

// Closes a file descriptor when it goes out of scope.
struct Closer {
  int fd;
  ~Closer() { ::close(fd); }
};

// The SHA-256 of an open file's contents.
std::string hash_of(int fd, const fs::path& path) {
  Sha256 h;
  std::array<char, 65536> buf;
  for (;;) {
    const IoResult r = read_full(fd, buf.data(), buf.size());
    if (!r.ok())
      user_error("cannot read the JIT module {}: {}", path.string(), std::strerror(r.error));
    h.update(buf.data(), r.done);
    if (r.done < buf.size()) return h.hex();
  }
}

// Why the shared object at `so` is not the one whose hash was recorded in `sum` when it was
// compiled ("" when it is). A file another user owns or can write is a UserError naming it.
std::string mismatch(const fs::path& so, const fs::path& sum) {
  const int fd = ::open(so.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0 && errno == ELOOP) return "it is a symbolic link";
  if (fd < 0) return fmt::format("it cannot be opened: {}", std::strerror(errno));
  const Closer closer{fd};
  struct stat st;
  if (::fstat(fd, &st) == 0 && !S_ISREG(st.st_mode)) return "it is not a regular file";
  check_private_file(fd, so.string());
  const std::string got = hash_of(fd, so);
  const std::optional<std::string> record = read_private_file(sum.string());
  if (!record) return fmt::format("{} is missing", sum.filename().string());
  if (record->substr(0, got.size()) != got)
    return fmt::format("its SHA-256 differs from {}", sum.filename().string());
  return "";
}

// Compiles `src` into `so` and records the shared object's SHA-256 in `sum`. The compiler writes
// into a folder of its own (mkdtemp: nobody can plant a link there); the result is moved into
// place.
void compile_entry(const std::string& cxx, const std::vector<std::string>& flags,
                   const fs::path& src, const fs::path& so, const fs::path& sum) {
  std::string work = (so.parent_path() / (so.stem().string() + ".build-XXXXXX")).string();
  if (::mkdtemp(work.data()) == nullptr)
    user_error("cannot create a JIT build folder in {}: {}", so.parent_path().string(),
               std::strerror(errno));
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup{work};
  ::chmod(work.c_str(), 0700);  // the umask may have taken the owner's bits
  const fs::path out = fs::path(work) / so.filename();
  std::string cmd = shell_quote(cxx);
  // Appended piecewise: GCC 12 warns falsely (-Wrestrict) on chained string concatenation.
  for (const auto& f : {flags, std::vector<std::string>{src.string(), "-o", out.string()}})
    for (const auto& word : f) {
      cmd += ' ';
      cmd += shell_quote(word);
    }
  auto [rc, output] = run_command(cmd);
  if (rc != 0) {
    if (const std::string why = out_of_descriptors(0); !why.empty())
      user_error("the JIT cannot run its compiler: {}", why);
    user_error("JIT compile failed (exit {}):\n  {}\n{}", rc, cmd, output);
  }
  const int fd = ::open(out.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) user_error("the JIT compiler wrote no {}: {}", out.string(), std::strerror(errno));
  const Closer closer{fd};
  // 0700: a shared object is code (the loader needs only read, but nothing more is given away).
  if (::fchmod(fd, 0700) != 0)
    user_error("cannot set the mode of {}: {}", out.string(), std::strerror(errno));
  const std::string hash = hash_of(fd, out);
  // The record first: a crash between the two leaves a mismatch, which the next run repairs.
  write_private_file(sum.string(), fmt::format("{}  {}\n", hash, so.filename().string()));
  if (::rename(out.c_str(), so.c_str()) != 0)
    user_error("cannot move the JIT module into place at {}: {}", so.string(),
               std::strerror(errno));
}

// `source` with the definition of kKeySymbol (the cache key) appended, visible whatever the flags.
std::string with_key_symbol(const std::string& source, const std::string& key) {
  return fmt::format(
      "{}\nextern \"C\" __attribute__((visibility(\"default\"))) const char {}[] = \"{}\";\n",
      source, kKeySymbol, key);
}

// Whether the loaded module is the one compiled for `key`: a library and a record replaced
// together (their SHA-256s agree) pass the check before loading, not this one.
bool defines_key(void* handle, const std::string& key) {
  const auto* got = static_cast<const char*>(dlsym(handle, kKeySymbol));
  return got != nullptr && std::strncmp(got, key.c_str(), key.size() + 1) == 0;
}

}  // namespace

std::vector<std::string> default_jit_flags() {
  return {"-std=c++20",        "-O3",     "-march=native", "-fPIC", "-shared", "-fno-math-errno",
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
  return default_cache_dir();
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
  const fs::path dir = make_private_dir(jit_cache_dir(options), key.substr(0, 2));
  const fs::path so = dir / (key + ".so"), sum = dir / (key + ".sha256");
  bool compiled_now = false;
  FileLock file_lock(dir / (key + ".lock"));  // held until the module is loaded
  // Checked before it is loaded: garbage, a truncated file (which would kill the run with SIGBUS
  // inside dlopen) or another program's library is compiled again.
  struct stat st;
  const bool present = ::lstat(so.c_str(), &st) == 0;
  const std::string why = present ? mismatch(so, sum) : "";
  auto compile = [&](const std::string& reason) {
    if (!reason.empty())
      fmt::print(
          stderr,
          "tandem: the JIT cache entry {} is not what was compiled ({}); compiling it again\n",
          so.string(), reason);
    const fs::path src = dir / (key + ".cc");
    write_private_file(src.string(), with_key_symbol(source, key));
    compile_entry(cxx, flags, src, so, sum);
    compiled_now = true;
  };
  if (!present || !why.empty()) compile(why);
  void* handle = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) user_error("cannot load JIT module {}: {}", so.string(), dlerror());
  if (!compiled_now && !defines_key(handle, key)) {
    // Damaged as a mismatch is: compiled again, then loaded from its new file.
    dlclose(handle);
    compile(fmt::format("it does not define {} as {}", kKeySymbol, key));
    handle = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) user_error("cannot load JIT module {}: {}", so.string(), dlerror());
  }
  if (!defines_key(handle, key)) {
    dlclose(handle);
    user_error(
        "the JIT module {} loads as another library (one of that name stays loaded in this "
        "process); remove the cache entry and run again",
        so.string());
  }
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
