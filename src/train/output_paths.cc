// The check of a run's output paths before its first step (folders created, each place written
// to), and the --save folder's lock.
#include "output_paths.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>

#include "tandem/core/error.h"
#include "tandem/core/file_io.h"
#include "tandem/io/checkpoint_series.h"
#include "tandem/ooc/slow_tier.h"

namespace tandem::train::detail {
namespace fs = std::filesystem;

namespace {

// Creates `folder` and its parents; `flag` and `path` name the output in the error.
void make_folder(const char* flag, const std::string& path, const fs::path& folder) {
  std::error_code ec;
  if (fs::is_directory(folder, ec)) return;
  fs::create_directories(folder, ec);
  if (ec)
    user_error("{} '{}': cannot create folder '{}': {}", flag, path, folder.string(), ec.message());
}

// Proves `folder` writable by creating a file there and removing it: access(2) would say yes to
// root on a read-only filesystem. The name is drawn at random and created exclusively: a file or
// link planted in the folder is neither followed nor in the way.
void probe_folder(const char* flag, const std::string& path, const fs::path& folder) {
  std::string probe;
  const int fd = create_unique_file(
      folder.string(), fmt::format(".tandem-write-test-{}-", ::getpid()), 0600, O_WRONLY, probe);
  if (fd < 0)
    user_error("{} '{}': cannot write in folder '{}': {}", flag, path, folder.string(),
               std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

// A file the run writes: its folder made and written to; the path itself must not be a folder, or
// a symbolic link (the metrics file is opened in place: a link would send its lines elsewhere).
void check_file(const char* flag, const std::string& path) {
  std::error_code ec;
  if (is_symlink(path)) refuse_symlink(path, fmt::format("{} ", flag));
  if (fs::is_directory(path, ec))
    user_error("{} '{}' is a folder; give the name of a file to write", flag, path);
  fs::path folder = fs::path(path).parent_path();
  if (folder.empty()) folder = ".";
  make_folder(flag, path, folder);
  probe_folder(flag, path, folder);
  // An existing file must be writable itself (the metrics file is appended to in place).
  if (fs::exists(path, ec) && ::access(path.c_str(), W_OK) != 0)
    user_error("{} '{}': cannot write the file: {}", flag, path, std::strerror(errno));
}

void check_save_folder(const std::string& dir) {
  std::error_code ec;
  // The folder named may be a link (the user's own choice of path); what tandem makes inside it
  // never is (the lock, below, and io's atomic files).
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    user_error("--save '{}' is a file; give a folder for the checkpoints", dir);
  // Step folders written beside a single checkpoint's files would make the folder two things.
  if (io::is_single_checkpoint(dir))
    user_error(
        "--save '{}' is itself a checkpoint (it holds meta.json); --save takes the folder "
        "the step-numbered checkpoints go in: give a new folder (--resume '{}' --save NEW "
        "continues from this one)",
        dir, dir);
  make_folder("--save", dir, dir);
  probe_folder("--save", dir, dir);
}

}  // namespace

void check_outputs(const TrainConfig& cfg) {
  if (!cfg.save_dir.empty()) check_save_folder(cfg.save_dir);
  if (!cfg.metrics_path.empty()) check_file("--metrics", cfg.metrics_path);
  if (!cfg.trace_path.empty()) check_file("--trace", cfg.trace_path);
  // The optimizer state's swap file is written at set-up: its folder too.
  const std::optional<ooc::TierSpec>& tier = cfg.optimizer.state_tier;
  if (tier && tier->kind == ooc::TierSpec::Kind::File) {
    make_folder("--optimizer-state", tier->str(), tier->dir);
    probe_folder("--optimizer-state", tier->str(), tier->dir);
  }
}

// What saves killed part-way left in `dir` (step folders and the `latest` file being written,
// "<name>.tmp-<pid>..."): with the lock held no other run is writing them. Folders moved aside
// (".old-<pid>") stay: one may be the only copy of a checkpoint.
void SaveFolderLock::remove_temporaries(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const size_t at = name.rfind(".tmp-");
    if (at == std::string::npos || at == 0 ||
        !is_temporary_tail(std::string_view(name).substr(at + 5)))
      continue;
    fs::remove_all(entry.path(), ec);  // a link is removed itself, never followed
  }
}

SaveFolderLock::SaveFolderLock(const std::string& dir)
    : path_((fs::path(dir) / kSaveLockFile).string()) {
  // A holder removes the file when it lets go: a lock taken on a file already removed (opened
  // just before) protects nothing, so it is taken again on the file now at the path.
  for (int attempt = 0; attempt < 100; ++attempt) {
    // O_NOFOLLOW: a link planted at the lock's name is refused, never truncated through;
    // O_NONBLOCK: a planted pipe does not hang the open (it is refused just below).
    const int fd =
        ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
    if (fd < 0) {
      if (errno == ELOOP) refuse_symlink(path_, fmt::format("--save '{}': the lock file ", dir));
      user_error("--save '{}': cannot create the lock file '{}': {}", dir, path_,
                 std::strerror(errno));
    }
    struct stat opened;
    if (::fstat(fd, &opened) != 0 || !S_ISREG(opened.st_mode)) {
      ::close(fd);
      user_error("--save '{}': the lock file '{}' is not a regular file; remove it", dir, path_);
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err != EWOULDBLOCK) {  // no locks on this filesystem: run unlocked
        ::close(fd);
        return;
      }
      std::string holder;
      char buf[32] = {};
      const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
      if (n > 0) holder = std::string(buf, static_cast<size_t>(n));
      while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
      ::close(fd);
      user_error(
          "--save '{}' is being written by another tandem run ({}, which holds '{}'): two "
          "runs writing one folder would remove each other's checkpoints; give this run "
          "another --save folder, or wait for that run to end",
          dir, holder.empty() ? "its pid not yet written" : "pid " + holder, path_);
    }
    struct stat held, now;
    // lstat: the file now at the path itself, not what a link put there since would point at.
    if (::fstat(fd, &held) == 0 && ::lstat(path_.c_str(), &now) == 0 && held.st_ino == now.st_ino &&
        held.st_dev == now.st_dev) {
      const std::string pid = std::to_string(::getpid()) + "\n";
      if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) < 0) {
        const int err = errno;
        ::unlink(path_.c_str());
        ::close(fd);
        user_error("--save '{}': cannot write the lock file '{}': {}", dir, path_,
                   std::strerror(err));
      }
      fd_ = fd;
      remove_temporaries(dir);
      return;
    }
    ::close(fd);
  }
  user_error("--save '{}': cannot take the lock '{}': it is removed as often as it is made", dir,
             path_);
}

SaveFolderLock::~SaveFolderLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // while still held: a run waiting on it retries on a new file
  ::close(fd_);
}

}  // namespace tandem::train::detail
