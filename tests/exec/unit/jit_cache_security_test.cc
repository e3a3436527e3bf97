// The JIT cache against a hostile or careless neighbour: no shared fallback folder, no planted
// link followed, private modes whatever the umask, folders and files of another user refused, and
// a corrupt entry (garbage, truncated, another program's library, with its record or without)
// compiled again, saying so.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>

#include "support/scratch.h"
#include "tandem/core/error.h"
#include "tandem/exec/jit.h"

namespace tandem::exec {
namespace {

namespace fs = std::filesystem;
using tandem::testing::ScratchDir;
using tandem::testing::user_error_of;

constexpr uid_t kNobody = 65534;

// Sets (or unsets, with nullopt) an environment variable for the lifetime of the object.
class EnvGuard {
 public:
  EnvGuard(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value->c_str(), 1);
    else
      ::unsetenv(name);
  }
  ~EnvGuard() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Sets the umask for the lifetime of the object.
class UmaskGuard {
 public:
  explicit UmaskGuard(mode_t m) : old_(::umask(m)) {}
  ~UmaskGuard() { ::umask(old_); }

 private:
  mode_t old_;
};

mode_t mode_of(const fs::path& p) {
  struct stat st;
  EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
  return st.st_mode & 07777;
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << text;
}

// Runs `f` in a child process and returns its exit status (a signal shows as 128 + its number),
// so a crash (a SIGBUS inside dlopen) fails the test instead of killing the suite.
int status_in_child(const std::function<bool()>& f) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    bool ok = false;
    try {
      ok = f();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
    }
    ::_exit(ok ? 0 : 1);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

class JitCacheSecurity : public ::testing::Test {
 protected:
  void SetUp() override { options_.cache_dir = cache_.string(); }

  // A source no other test compiles; `answer_<k>(x)` returns x * k + the test's line.
  std::string source(int k) const {
    return fmt::format("extern \"C\" int answer_{0}(int x) {{ return x * {0} + {1}; }}\n", k,
                       line());
  }
  static int line() { return ::testing::UnitTest::GetInstance()->current_test_info()->line(); }
  static int call(const std::shared_ptr<JitModule>& m, int k, int x) {
    return reinterpret_cast<int (*)(int)>(m->symbol(fmt::format("answer_{}", k)))(x);
  }
  fs::path shard(const std::string& key) const { return cache_ / key.substr(0, 2); }
  fs::path so_of(const std::string& key) const { return shard(key) / (key + ".so"); }

  // Compiles `k`'s source once and unloads it, so the next request reads the disk.
  std::string compile_and_unload(int k) {
    auto m = jit_compile(source(k), options_);
    EXPECT_EQ(call(m, k, 1), k + line());
    return m->key();
  }

  ScratchDir dir_;
  fs::path cache_ = dir_.path("cache");
  JitOptions options_;
};

// 1. Never a shared folder: without HOME the password database names the home folder.
TEST_F(JitCacheSecurity, WithoutHomeTheCacheIsInThePasswordDatabasesHome) {
  EnvGuard no_dir("TANDEM_CACHE_DIR", std::nullopt), no_home("HOME", std::nullopt);
  const passwd* pw = ::getpwuid(::geteuid());
  if (pw == nullptr) GTEST_SKIP() << "this user is not in the password database";
  const std::string dir = jit_cache_dir();
  EXPECT_EQ(dir, (fs::path(pw->pw_dir) / ".cache" / "tandem").string());
  EXPECT_NE(dir.rfind("/tmp", 0), 0u) << dir;
}

// 1. ... and with no home folder at all, a refusal naming TANDEM_CACHE_DIR.
TEST_F(JitCacheSecurity, WithoutAnyHomeTheCacheIsRefused) {
  if (::geteuid() != 0)
    GTEST_SKIP() << "needs root, to become a user the password database does not know";
  constexpr uid_t kUnknown = 54321;
  if (::getpwuid(kUnknown) != nullptr)
    GTEST_SKIP() << "uid " << kUnknown << " is in the password database";
  const std::string message = tandem::testing::user_error_in_child(
      [] {
        ::unsetenv("HOME");
        ::unsetenv("TANDEM_CACHE_DIR");
        if (::setgid(kUnknown) != 0 || ::setuid(kUnknown) != 0) ::_exit(3);
      },
      [] { jit_cache_dir(); });
  EXPECT_NE(message.find("TANDEM_CACHE_DIR"), std::string::npos) << message;
  EXPECT_NE(message.find("HOME is unset"), std::string::npos) << message;
}

// 2. A link planted at the lock file's path creates nothing where it points.
TEST_F(JitCacheSecurity, LinkAtTheLockPathCreatesNothing) {
  const std::string src = source(3);
  const std::string key = jit_cache_key(src, options_);
  fs::create_directories(shard(key));
  const fs::path victim = dir_.path("victim-lock");
  fs::create_symlink(victim, shard(key) / (key + ".lock"));
  const std::string message = user_error_of([&] { jit_compile(src, options_); });
  EXPECT_NE(message.find(".lock"), std::string::npos) << message;
  EXPECT_NE(message.find("symbolic link"), std::string::npos) << message;
  EXPECT_FALSE(fs::exists(fs::symlink_status(victim))) << "the lock's link was followed";
}

// 2. Links planted at the temporary names a writer could be predicted to use overwrite nothing.
TEST_F(JitCacheSecurity, LinksAtPredictableTemporaryPathsOverwriteNothing) {
  const std::string src = source(4);
  const std::string key = jit_cache_key(src, options_);
  fs::create_directories(shard(key));
  std::vector<fs::path> victims;
  for (const std::string suffix : {".cc", ".so"}) {
    const fs::path victim = dir_.path("victim" + suffix);
    write_text(victim, "precious");
    fs::create_symlink(victim, shard(key) / fmt::format("{}{}.tmp.{}", key, suffix, ::getpid()));
    victims.push_back(victim);
  }
  auto m = jit_compile(src, options_);
  EXPECT_EQ(call(m, 4, 1), 4 + line());
  for (const fs::path& v : victims)
    EXPECT_EQ(read_text(v), "precious") << v << " was overwritten through a link";
  EXPECT_FALSE(fs::is_symlink(shard(key) / (key + ".cc")));
}

// 3. Under umask 000 the folders are 0700, the shared object 0700 and every other file 0600.
TEST_F(JitCacheSecurity, ModesArePrivateWhateverTheUmask) {
  std::string key;
  {
    UmaskGuard open_umask(0);
    key = jit_compile(source(5), options_)->key();
  }
  EXPECT_EQ(mode_of(cache_), 0700u);
  EXPECT_EQ(mode_of(shard(key)), 0700u);
  EXPECT_EQ(mode_of(so_of(key)), 0700u);
  for (const char* ext : {".cc", ".sha256", ".lock"})
    EXPECT_EQ(mode_of(shard(key) / (key + ext)), 0600u) << ext;
  // Nothing else is left behind: no temporaries, no build folder.
  int files = 0;
  for (const auto& e : fs::directory_iterator(shard(key)))
    files += e.path().filename().string().rfind(key, 0) == 0;
  EXPECT_EQ(files, 4);
}

// 3. A cache folder group or others can write is refused, naming it.
TEST_F(JitCacheSecurity, FolderOthersCanWriteIsRefused) {
  fs::create_directories(cache_);
  fs::permissions(cache_, fs::perms::all);
  std::string message = user_error_of([&] { jit_compile(source(6), options_); });
  EXPECT_NE(message.find("'" + cache_.string() + "'"), std::string::npos) << message;
  EXPECT_NE(message.find("group or others can write"), std::string::npos) << message;
  // The shard folder too.
  fs::permissions(cache_, fs::perms::owner_all);
  const std::string key = jit_cache_key(source(6), options_);
  fs::create_directories(shard(key));
  fs::permissions(shard(key), fs::perms::owner_all | fs::perms::group_write);
  message = user_error_of([&] { jit_compile(source(6), options_); });
  EXPECT_NE(message.find("'" + shard(key).string() + "'"), std::string::npos) << message;
}

// 3. A shared object others can write is refused, naming it.
TEST_F(JitCacheSecurity, SharedObjectOthersCanWriteIsRefused) {
  const std::string key = compile_and_unload(7);
  fs::permissions(so_of(key), fs::perms::all);
  const std::string message = user_error_of([&] { jit_compile(source(7), options_); });
  EXPECT_NE(message.find("'" + so_of(key).string() + "'"), std::string::npos) << message;
  EXPECT_NE(message.find("group or others can write"), std::string::npos) << message;
}

// 3. A folder or shared object another user owns is refused, naming it.
TEST_F(JitCacheSecurity, FolderOrFileOfAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to give a file to another user";
  const std::string key = compile_and_unload(8);
  ASSERT_EQ(::chown(so_of(key).c_str(), kNobody, kNobody), 0);
  std::string message = user_error_of([&] { jit_compile(source(8), options_); });
  EXPECT_NE(message.find("'" + so_of(key).string() + "'"), std::string::npos) << message;
  EXPECT_NE(message.find("belongs to uid 65534"), std::string::npos) << message;
  ASSERT_EQ(::chown(cache_.c_str(), kNobody, kNobody), 0);
  message = user_error_of([&] { jit_compile(source(8), options_); });
  EXPECT_NE(message.find("'" + cache_.string() + "'"), std::string::npos) << message;
  EXPECT_NE(message.find("belongs to uid 65534"), std::string::npos) << message;
}

// 4. Garbage at the shared object's path is compiled again, saying so, and then loads.
TEST_F(JitCacheSecurity, GarbageEntryIsCompiledAgain) {
  const std::string key = compile_and_unload(9);
  write_text(so_of(key), "this is not an ELF file");
  ::testing::internal::CaptureStderr();
  auto m = jit_compile(source(9), options_);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(m->compiled_now());
  EXPECT_EQ(call(m, 9, 2), 18 + line());
  EXPECT_NE(err.find(so_of(key).string()), std::string::npos) << err;
  EXPECT_NE(err.find("compiling it again"), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
}

// 4. A truncated shared object (a SIGBUS inside dlopen, were it loaded) is compiled again.
TEST_F(JitCacheSecurity, TruncatedEntryIsCompiledAgain) {
  const std::string key = compile_and_unload(10);
  fs::resize_file(so_of(key), fs::file_size(so_of(key)) / 2);
  const int expect = 10 * 3 + line();
  EXPECT_EQ(status_in_child([&] {
              auto m = jit_compile(source(10), options_);
              return m->compiled_now() && call(m, 10, 3) == expect;
            }),
            0);
}

// 4. Another program's valid library at the path is compiled over, not run.
TEST_F(JitCacheSecurity, AnotherLibraryAtThePathIsCompiledAgain) {
  const std::string key = compile_and_unload(11);
  const std::string other = compile_and_unload(12);
  fs::copy_file(so_of(other), so_of(key), fs::copy_options::overwrite_existing);
  ::testing::internal::CaptureStderr();
  auto m = jit_compile(source(11), options_);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(m->compiled_now());
  EXPECT_EQ(call(m, 11, 1), 11 + line());
  EXPECT_NE(err.find("SHA-256 differs"), std::string::npos) << err;
}

// 4. Another library and its record, replaced together (their SHA-256s agree): the module
// loaded is not the one compiled for the key, and is compiled again; it used to be run, and the
// missing symbol was an internal error.
TEST_F(JitCacheSecurity, AnotherLibraryWithItsRecordIsCompiledAgain) {
  const std::string key = compile_and_unload(15);
  const std::string other = compile_and_unload(16);
  fs::copy_file(so_of(other), so_of(key), fs::copy_options::overwrite_existing);
  fs::copy_file(shard(other) / (other + ".sha256"), shard(key) / (key + ".sha256"),
                fs::copy_options::overwrite_existing);
  ::testing::internal::CaptureStderr();
  auto m = jit_compile(source(15), options_);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(m->compiled_now());
  EXPECT_EQ(call(m, 15, 1), 15 + line());
  EXPECT_NE(err.find(so_of(key).string()), std::string::npos) << err;
  EXPECT_NE(err.find("does not define tandem_jit_key"), std::string::npos) << err;
  EXPECT_NE(err.find("compiling it again"), std::string::npos) << err;
  m.reset();
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(jit_compile(source(15), options_)->compiled_now());  // repaired: a disk hit
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

// 4. An entry without its record (it cannot be checked) is compiled again; a repaired entry is a
// plain disk hit afterwards.
TEST_F(JitCacheSecurity, EntryWithoutItsRecordIsCompiledAgainThenHits) {
  const std::string key = compile_and_unload(13);
  fs::remove(shard(key) / (key + ".sha256"));
  ::testing::internal::CaptureStderr();
  EXPECT_TRUE(jit_compile(source(13), options_)->compiled_now());
  EXPECT_NE(::testing::internal::GetCapturedStderr().find(".sha256 is missing"), std::string::npos);
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(jit_compile(source(13), options_)->compiled_now());
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

// The record is in sha256sum's format, so `sha256sum -c` checks an entry by hand.
TEST_F(JitCacheSecurity, RecordIsSha256sumFormat) {
  const std::string key = compile_and_unload(14);
  const std::string record = read_text(shard(key) / (key + ".sha256"));
  ASSERT_EQ(record.size(), 64 + 2 + key.size() + 3 + 1) << record;
  EXPECT_EQ(record.substr(64), "  " + key + ".so\n");
}

}  // namespace
}  // namespace tandem::exec
