// The out-of-core profile cache: a profile reads back for its key only, a damaged file is a miss,
// and the JIT cache's rules hold (0600 in a 0700 folder whatever the umask; a folder or file
// another user owns or can write refused, naming it).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "support/scratch.h"
#include "tandem/ooc/profile.h"

namespace tandem::ooc {
namespace {

namespace fs = std::filesystem;
using tandem::testing::ScratchDir;
using tandem::testing::user_error_of;

const std::string kKey = R"({"model":"tiny","batch":4})";

mode_t mode_of(const fs::path& p) {
  struct stat st;
  EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
  return st.st_mode & 07777;
}

TEST(ProfileCache, ReadsBackForItsKeyOnly) {
  ScratchDir dir;
  const std::string cache = dir.path("cache");
  EXPECT_FALSE(load_cached_profile(cache, "p.json", kKey).has_value());
  const Profile p = uniform_profile(3, 0.5, 1.0, 2e9, 3e9);
  store_cached_profile(cache, "p.json", kKey, p);
  const auto back = load_cached_profile(cache, "p.json", kKey);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->forward_s, p.forward_s);
  EXPECT_EQ(back->read_bytes_per_s, 3e9);
  EXPECT_FALSE(load_cached_profile(cache, "p.json", R"({"model":"other"})").has_value());
  std::ofstream(fs::path(cache) / "ooc" / "p.json", std::ios::trunc) << "{\"key\": ";  // cut short
  EXPECT_FALSE(load_cached_profile(cache, "p.json", kKey).has_value());
}

TEST(ProfileCache, ModesArePrivateWhateverTheUmask) {
  ScratchDir dir;
  const mode_t old = ::umask(0);
  store_cached_profile(dir.path("cache"), "p.json", kKey, uniform_profile(2, 1, 2, 1e9, 1e9));
  ::umask(old);
  EXPECT_EQ(mode_of(dir.path("cache")), 0700u);
  EXPECT_EQ(mode_of(dir.path("cache/ooc")), 0700u);
  EXPECT_EQ(mode_of(dir.path("cache/ooc/p.json")), 0600u);
  EXPECT_EQ(dir.list("cache/ooc"), std::vector<std::string>{"p.json"});  // no temporary left
}

TEST(ProfileCache, FolderOthersCanWriteIsRefused) {
  ScratchDir dir;
  store_cached_profile(dir.path("cache"), "p.json", kKey, uniform_profile(2, 1, 2, 1e9, 1e9));
  fs::permissions(dir.path("cache/ooc"), fs::perms::all);
  const std::string message =
      user_error_of([&] { load_cached_profile(dir.path("cache"), "p.json", kKey); });
  EXPECT_NE(message.find(fmt::format("'{}'", dir.path("cache/ooc"))), std::string::npos) << message;
  EXPECT_NE(message.find("group or others can write"), std::string::npos) << message;
}

TEST(ProfileCache, FileOfAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to give a file to another user";
  ScratchDir dir;
  store_cached_profile(dir.path("cache"), "p.json", kKey, uniform_profile(2, 1, 2, 1e9, 1e9));
  ASSERT_EQ(::chown(dir.path("cache/ooc/p.json").c_str(), 65534, 65534), 0);
  const std::string message =
      user_error_of([&] { load_cached_profile(dir.path("cache"), "p.json", kKey); });
  EXPECT_NE(message.find(fmt::format("'{}'", dir.path("cache/ooc/p.json"))), std::string::npos)
      << message;
  EXPECT_NE(message.find("belongs to uid 65534"), std::string::npos) << message;
}

}  // namespace
}  // namespace tandem::ooc
