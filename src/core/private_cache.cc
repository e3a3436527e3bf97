// The private cache folder: where it is, and files in it created, checked and read safely.
#include "tandem/core/private_cache.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "tandem/core/env.h"
#include "tandem/core/error.h"
#include "tandem/core/file_io.h"

namespace tandem {
namespace fs = std::filesystem;
namespace {

constexpr const char* kOwnFolder = "set TANDEM_CACHE_DIR to a folder of your own";

// The home folder the password database gives the effective user; empty when it has none.
std::string home_from_passwd() {
  long size = ::sysconf(_SC_GETPW_R_SIZE_MAX);
  std::vector<char> buf(size > 0 ? static_cast<size_t>(size) : 16384);
  passwd pw;
  passwd* found = nullptr;
  int rc;
  while ((rc = ::getpwuid_r(::geteuid(), &pw, buf.data(), buf.size(), &found)) == ERANGE)
    buf.resize(buf.size() * 2);
  return rc == 0 && found != nullptr && found->pw_dir != nullptr ? std::string(found->pw_dir)
                                                                 : std::string();
}

// Refuses what another user owns or what group or others can write, naming it.
void check_owner_and_mode(const struct stat& st, const std::string& what, const std::string& path) {
  if (st.st_uid != ::geteuid())
    user_error(
        "refusing the cache {} '{}': it belongs to uid {}, not to this user (uid {}), and what "
        "tandem "
        "finds there it loads and runs; {}",
        what, path, st.st_uid, ::geteuid(), kOwnFolder);
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0)
    user_error(
        "refusing the cache {} '{}': group or others can write to it (mode {:04o}), and what "
        "tandem finds "
        "there it loads and runs; `chmod go-w` it or {}",
        what, path, st.st_mode & 07777, kOwnFolder);
}

// Checks an existing folder; false when it does not exist.
bool check_dir(const fs::path& dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT) return false;
    user_error("cannot inspect the cache folder '{}': {}", dir.string(), std::strerror(errno));
  }
  if (!S_ISDIR(st.st_mode))
    user_error("the cache folder '{}' is not a folder; {}", dir.string(), kOwnFolder);
  check_owner_and_mode(st, "folder", dir.string());
  return true;
}

// Closes a file descriptor when it goes out of scope.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::string default_cache_dir() {
  const std::string dir = env_str("TANDEM_CACHE_DIR", "");
  if (!dir.empty()) return dir;
  std::string home = env_str("HOME", "");
  if (home.empty()) home = home_from_passwd();
  if (home.empty())
    user_error(
        "no folder for tandem's cache: HOME is unset and the password database has no home folder "
        "for uid "
        "{}; set TANDEM_CACHE_DIR to a folder of your own (a shared folder such as /tmp is never "
        "used: "
        "another user could plant code there)",
        ::geteuid());
  return (fs::path(home) / ".cache" / "tandem").string();
}

fs::path make_private_dir(const std::string& root, const std::string& sub) {
  const fs::path dir = fs::path(root) / sub;
  // Top-down, so every folder made here is 0700: chmod after mkdir, since the umask may take bits.
  fs::path p;
  std::error_code ec;
  for (const fs::path& part : dir) {
    p /= part;
    if (::mkdir(p.c_str(), 0700) == 0) {
      if (::chmod(p.c_str(), 0700) != 0)
        user_error("cannot set the mode of the cache folder '{}': {}", p.string(),
                   std::strerror(errno));
    } else if (const int err = errno; err != EEXIST && !fs::is_directory(p, ec)) {
      errno = err;
      user_error("cannot create the cache folder '{}': {}; {}", p.string(), std::strerror(errno),
                 kOwnFolder);
    }
  }
  if (!check_dir(root) || !check_dir(dir))
    user_error("the cache folder '{}' vanished while it was made", dir.string());
  return dir;
}

bool private_dir_exists(const std::string& root, const std::string& sub) {
  return check_dir(root) && check_dir(fs::path(root) / sub);
}

void check_private_file(int fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0)
    user_error("cannot inspect the cache file '{}': {}", path, std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    user_error("the cache file '{}' is not a regular file; remove it", path);
  check_owner_and_mode(st, "file", path);
}

std::optional<std::string> read_private_file(const std::string& path) {
  // O_NONBLOCK: a pipe planted there must not hang the open; it is refused just below.
  Fd f{::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK)};
  if (f.fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    if (errno == ELOOP)
      user_error("the cache file '{}' is a symbolic link, which tandem never makes; remove it",
                 path);
    user_error("cannot read the cache file '{}': {}", path, std::strerror(errno));
  }
  check_private_file(f.fd, path);
  std::string text;
  const IoResult r = read_to_end(f.fd, text);
  if (!r.ok()) user_error("cannot read the cache file '{}': {}", path, std::strerror(r.error));
  return text;
}

void write_private_file(const std::string& path, std::string_view contents, mode_t mode) {
  // The one crash-safe writer (file_io.h): a temporary nobody can predict, created exclusively
  // (never through a planted link), fsync'd and renamed over `path`.
  ReplacementFile file;
  int err = file.create(path, 0600);
  if (err == 0 && ::fchmod(file.fd(), mode) != 0) err = errno;  // whatever the umask
  if (err == 0) {
    const IoResult r = write_all(file.fd(), contents.data(), contents.size());
    if (!r.ok()) err = r.error;
  }
  if (err == 0) err = file.commit();
  if (err == ELOOP)
    user_error("the cache file '{}' is a symbolic link, which tandem never makes; remove it", path);
  if (err != 0 && file.renamed())
    return;  // in place; only the folder's fsync failed: the file is whole, as a cache needs
  if (err != 0) user_error("cannot write the cache file '{}': {}", path, std::strerror(err));
}

}  // namespace tandem
