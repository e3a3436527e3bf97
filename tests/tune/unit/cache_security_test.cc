// The tuner's cache follows the JIT cache's rules: records 0600 in a 0700 folder whatever the
// umask, written through no planted link, and a folder or record another user owns or can write
// refused, naming it.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include "support/scratch.h"
#include "tandem/tune/cache.h"
#include "tune/tune_testing.h"

namespace tandem::tune {
namespace {

namespace fs = std::filesystem;
using tandem::testing::user_error_of;

TuneRecord small_record() {
  TuneRecord r;
  r.key.program = "adam";
  r.key.program_hash = hash_hex("program adam");
  r.key.sizes = {{"N", 64}};
  r.key.backend = "thread";
  r.key.executor = "plan";
  r.key.machine = machine_id();
  r.created = "2026-01-01T00:00:00Z";
  CandidateTiming c;
  c.name = "AR-C";
  c.times = {0.01};
  r.candidates = {c};
  r.winner = "AR-C";
  return r;
}

mode_t mode_of(const fs::path& p) {
  struct stat st;
  EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
  return st.st_mode & 07777;
}

TEST(TuneCacheSecurity, ModesArePrivateWhateverTheUmask) {
  testing::TempCacheDir dir("modes");
  const mode_t old = ::umask(0);
  const std::string path = store_record(small_record(), dir.str());
  ::umask(old);
  EXPECT_EQ(mode_of(fs::path(path).parent_path()), 0700u);
  EXPECT_EQ(mode_of(path), 0600u);
}

TEST(TuneCacheSecurity, LinkAtAPredictableTemporaryPathOverwritesNothing) {
  testing::TempCacheDir dir("link");
  const TuneRecord r = small_record();
  const std::string path = record_path(r.key, dir.str());
  fs::create_directories(fs::path(path).parent_path());
  const fs::path victim = dir.path() / "victim";
  std::ofstream(victim) << "precious";
  const size_t thread = std::hash<std::thread::id>{}(std::this_thread::get_id());
  fs::create_symlink(victim, fmt::format("{}.tmp.{}.{}", path, ::getpid(), thread));
  store_record(r, dir.str());
  std::ifstream f(victim);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(f), {}), "precious")
      << "written through the link";
  EXPECT_FALSE(fs::is_symlink(path));
  EXPECT_TRUE(load_record(r.key, dir.str()).has_value());
}

TEST(TuneCacheSecurity, FolderOthersCanWriteIsRefused) {
  testing::TempCacheDir dir("writable");
  const TuneRecord r = small_record();
  const fs::path folder = fs::path(store_record(r, dir.str())).parent_path();
  fs::permissions(folder, fs::perms::all);
  for (const std::function<void()>& f : std::vector<std::function<void()>>{
           [&] { load_record(r.key, dir.str()); }, [&] { store_record(r, dir.str()); }}) {
    const std::string message = user_error_of(f);
    EXPECT_NE(message.find("'" + folder.string() + "'"), std::string::npos) << message;
    EXPECT_NE(message.find("group or others can write"), std::string::npos) << message;
  }
}

TEST(TuneCacheSecurity, RecordOfAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to give a file to another user";
  testing::TempCacheDir dir("owner");
  const TuneRecord r = small_record();
  const std::string path = store_record(r, dir.str());
  ASSERT_EQ(::chown(path.c_str(), 65534, 65534), 0);
  const std::string message = user_error_of([&] { load_record(r.key, dir.str()); });
  EXPECT_NE(message.find("'" + path + "'"), std::string::npos) << message;
  EXPECT_NE(message.find("belongs to uid 65534"), std::string::npos) << message;
}

}  // namespace
}  // namespace tandem::tune
