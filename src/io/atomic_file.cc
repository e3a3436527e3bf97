// Atomic file and folder replacement over POSIX calls (open, write, fsync, rename, renameat2).
#include "tandem/io/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "tandem/core/error.h"
#include "tandem/core/file_io.h"

namespace tandem::io {
namespace fs = std::filesystem;
namespace {

std::string errno_text(int err) { return std::strerror(err); }

// The folder a path lives in, as users wrote it: "." for a bare file name.
std::string folder_of(const std::string& path) {
  fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

// Whether the temporary folder at `path`, named with `tail`, is a leftover: its name's process is
// gone (or is this one), and nobody claims it (a running writer's folder is its own business: two
// exports to one folder at once). The claim also covers a writer whose pid this process cannot
// see; the pid, the moment between a folder's mkdir and its claim.
bool is_leftover(const fs::path& path, std::string_view tail) {
  long pid = 0;
  if (!is_temporary_tail(tail, &pid)) return false;
  if (pid != ::getpid() && !(::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH))
    return false;
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return errno == ENOTDIR;  // a file left by an older writer: nobody claims it
  // Held (EWOULDBLOCK): a writer's. Another failure (a filesystem without flock): the pid decides.
  const bool claimed = ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);
  return !claimed;
}

// A folder path without trailing separators, so that "ckpt/" and "ckpt" name the same folder and
// the sibling names (ckpt.tmp-<pid>) come out right.
fs::path normalise_folder(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  if (!p.empty() && p.filename().empty()) p = p.parent_path();
  return p;
}

}  // namespace

AtomicFile::AtomicFile(std::string path, std::string shown_as)
    : path_(std::move(path)), shown_(shown_as.empty() ? path_ : std::move(shown_as)) {
  struct stat st;
  had_previous_ = ::lstat(path_.c_str(), &st) == 0 && S_ISREG(st.st_mode);
  if (fs::path(path_).filename().empty())
    user_error("cannot write '{}': it names a folder, not a file", shown_);
  if (const int err = file_.create(path_, 0644); err != 0) {
    const std::string folder = folder_of(shown_);
    if (err == ELOOP) refuse_symlink(shown_, "cannot write: ");
    if (err == ENOENT) user_error("cannot write '{}': folder '{}' does not exist", shown_, folder);
    if (err == ENOTDIR) user_error("cannot write '{}': '{}' is not a folder", shown_, folder);
    user_error("cannot write '{}': {}{}", shown_, errno_text(err),
               had_previous_ ? "; the previous file is unchanged" : "");
  }
}

AtomicFile::~AtomicFile() = default;

void AtomicFile::fail(int err) {
  file_.discard();
  committed_ = true;  // nothing left for the destructor to do
  if (err == ELOOP) refuse_symlink(shown_, "cannot write: ");
  user_error("cannot write '{}': {}{}", shown_, errno_text(err),
             had_previous_ ? "; the previous file is unchanged" : "");
}

void AtomicFile::write(const void* data, size_t bytes) {
  TANDEM_CHECK(file_.fd() >= 0 && !committed_, "write to '{}' after commit", shown_);
  const IoResult r = write_all(file_.fd(), data, bytes);
  written_ += r.done;
  if (!r.ok()) fail(r.error);
}

void AtomicFile::write_at(size_t offset, const void* data, size_t bytes) {
  TANDEM_CHECK(file_.fd() >= 0 && !committed_, "write to '{}' after commit", shown_);
  TANDEM_CHECK(offset <= written_ && bytes <= written_ - offset,
               "rewrite of bytes [{}, {}) of '{}', which has {}", offset, offset + bytes, shown_,
               written_);
  const IoResult r = pwrite_all(file_.fd(), data, bytes, offset);
  if (!r.ok()) fail(r.error);
}

void AtomicFile::commit() {
  TANDEM_CHECK(file_.fd() >= 0 && !committed_, "'{}' committed twice", shown_);
  const int err = file_.commit();
  if (err != 0 && file_.renamed())
    user_error("cannot sync folder '{}': {}", folder_of(path_), errno_text(err));
  if (err != 0) fail(err);
  committed_ = true;
}

void write_file_atomic(const std::string& path, std::string_view contents) {
  AtomicFile f(path);
  f.write(contents);
  f.commit();
}

// What a path that is not a regular file is, for a message.
const char* file_kind(mode_t mode) {
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a pipe";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

std::string read_file(const std::string& path, std::string_view what) {
  // O_NONBLOCK: opening a pipe with no writer would otherwise wait forever, before the check.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) user_error("{} '{}' does not exist", what, path);
    user_error("cannot read {} '{}': {}", what, path, errno_text(err));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
    ::close(fd);
    user_error("{} '{}' is a folder, not a file", what, path);
  }
  // A device or a pipe may never end (/dev/zero, /dev/urandom) and is read whole into memory:
  // only regular files, whose size is known, are read.
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    user_error(
        "{} '{}' is {}, not a regular file: tandem reads the whole file into memory, so "
        "it takes files only (copy what you want to read into one)",
        what, path, file_kind(st.st_mode));
  }
  std::string out;
  out.reserve(static_cast<size_t>(st.st_size) + 1);  // + 1: the read that finds the end
  const IoResult r = read_to_end(fd, out);
  ::close(fd);
  if (!r.ok()) user_error("cannot read {} '{}': {}", what, path, errno_text(r.error));
  return out;
}

void fsync_folder(const std::string& dir) {
  if (const int err = sync_folder(dir); err != 0)
    user_error("cannot sync folder '{}': {}", dir, errno_text(err));
}

void replace_folder_atomic(const std::string& dir, const std::vector<FolderFile>& files,
                           const FolderWriteHooks& hooks) {
  FolderReplacement folder(dir, hooks);
  for (const FolderFile& file : files) {
    try {
      AtomicFile& out = folder.open_file(file.name);
      file.write(out);
      folder.close_file(out);
    } catch (const UserError& e) {
      throw UserError(e.what() + folder.unchanged_note());
    }
  }
  folder.commit();
}

FolderReplacement::FolderReplacement(const std::string& dir, FolderWriteHooks hooks)
    : dir_(dir), hooks_(std::move(hooks)) {
  const fs::path target = normalise_folder(dir);
  base_ = target.filename().string();
  if (base_.empty() || base_ == "." || base_ == "..")
    user_error("cannot write '{}': give the folder a name (not '{}')", dir, dir);
  const fs::path parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  std::error_code ec;
  if (!fs::is_directory(parent, ec)) {
    if (fs::exists(parent, ec))
      user_error("cannot write '{}': '{}' is not a folder", dir, parent.string());
    user_error("cannot write '{}': folder '{}' does not exist", dir, parent.string());
  }
  if (is_symlink(target.string())) refuse_symlink(dir, "cannot write: ");
  existed_ = fs::exists(target, ec);
  if (existed_ && !fs::is_directory(target, ec))
    user_error("cannot write '{}': it exists and is not a folder", dir);
  if (existed_) unchanged_ = fmt::format("; the previous contents of '{}' are unchanged", dir);
  target_ = target.string();
  parent_ = parent.string();
  // A name drawn at random and made with mkdir: nothing planted in `parent` is ever written into.
  if (create_unique_folder(parent_, fmt::format("{}.tmp-{}-", base_, ::getpid()), 0755, tmp_) != 0)
    user_error("cannot write '{}': cannot create a temporary folder in '{}': {}{}", dir, parent_,
               errno_text(errno), unchanged_);
  claim_.claim(tmp_);  // where flock is not supported, the pid in its name protects it alone
}

FolderReplacement::~FolderReplacement() {
  open_.clear();  // closes and removes unfinished files first
  if (!committed_) {
    std::error_code ec;
    fs::remove_all(tmp_, ec);
  }
}

void FolderReplacement::stage(std::string_view name) const {
  if (hooks_.after) hooks_.after(name);
}

AtomicFile& FolderReplacement::open_file(const std::string& name) {
  TANDEM_CHECK(!committed_, "file '{}' opened after '{}' was committed", name, dir_);
  open_.push_back(std::make_unique<AtomicFile>((fs::path(tmp_) / name).string(),
                                               (fs::path(target_) / name).string()));
  return *open_.back();
}

void FolderReplacement::close_file(AtomicFile& file) {
  auto it =
      std::find_if(open_.begin(), open_.end(), [&](const auto& f) { return f.get() == &file; });
  TANDEM_CHECK(it != open_.end(), "'{}' is not an open file of '{}'", file.path(), dir_);
  file.commit();  // fsyncs the file and the temporary folder
  const std::string name = fs::path(file.path()).filename().string();
  open_.erase(it);
  stage("wrote " + name);
}

void FolderReplacement::commit() {
  TANDEM_CHECK(!committed_ && open_.empty(), "'{}' committed twice or with files open", dir_);
  const fs::path tmp = tmp_, target = target_, parent = parent_;
  const std::string& dir = dir_;
  std::error_code ec;
  // From here on the temporary folder is either in place or removed below, never left behind.
  committed_ = true;
  auto rename_or_fail = [&](const fs::path& from, const fs::path& to) {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      const int err = errno;
      fs::remove_all(tmp, ec);
      user_error("cannot write '{}': renaming '{}' to '{}' failed: {}{}", dir, from.string(),
                 to.string(), errno_text(err), unchanged_);
    }
  };
  if (!existed_) {
    rename_or_fail(tmp, target);
    fsync_folder(parent.string());
    stage("renamed");
  } else {
    bool exchanged = false;
    if (hooks_.use_exchange) {
      // One step: no moment exists at which `dir` is missing or partial.
      if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
        exchanged = true;
      } else if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) {
        const int err = errno;
        fs::remove_all(tmp, ec);
        user_error("cannot write '{}': swapping in '{}' failed: {}{}", dir, tmp.string(),
                   errno_text(err), unchanged_);
      }
    }
    if (exchanged) {
      fsync_folder(parent.string());
      stage("exchanged");
      fs::remove_all(tmp, ec);  // now the old contents
      stage("removed old");
    } else {
      // Two renames; between them resolve_folder() finds the old folder under its .old name.
      const fs::path old = parent / fmt::format("{}.old-{}-{}", base_, ::getpid(), random_name());
      rename_or_fail(target, old);
      fsync_folder(parent.string());
      stage("moved old aside");
      if (::rename(tmp.c_str(), target.c_str()) != 0) {
        const int err = errno;
        ::rename(old.c_str(), target.c_str());  // put the old folder back
        fs::remove_all(tmp, ec);
        user_error("cannot write '{}': renaming '{}' into place failed: {}{}", dir, tmp.string(),
                   errno_text(err), unchanged_);
      }
      fsync_folder(parent.string());
      stage("renamed");
      fs::remove_all(old, ec);
      stage("removed old");
    }
  }

  // What interrupted saves left behind: `dir` is now complete, so none of it is needed.
  remove_leftovers(parent.string(), base_);
}

FolderClaim::~FolderClaim() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

int FolderClaim::claim(const std::string& path) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd_ < 0) return errno;
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    return err;
  }
  return 0;
}

void remove_leftovers(const std::string& parent, const std::string& base) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(parent, ec)) {
    const std::string name = entry.path().filename().string();
    for (std::string_view kind : {".tmp-", ".old-"}) {
      const std::string prefix = base + std::string(kind);
      if (name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0 &&
          is_leftover(entry.path(), std::string_view(name).substr(prefix.size())))
        fs::remove_all(entry.path(), ec);
    }
  }
}

std::string resolve_folder(const std::string& dir) {
  const fs::path target = normalise_folder(dir);
  std::error_code ec;
  if (fs::exists(target, ec)) return dir;
  const fs::path parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  const std::string prefix = target.filename().string() + ".old-";
  fs::path best;
  fs::file_time_type best_time{};
  for (const auto& entry : fs::directory_iterator(parent, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
        !is_temporary_tail(std::string_view(name).substr(prefix.size())) || !entry.is_directory(ec))
      continue;
    const auto t = entry.last_write_time(ec);
    if (best.empty() || t > best_time) {
      best = entry.path();
      best_time = t;
    }
  }
  return best.empty() ? dir : best.string();
}

}  // namespace tandem::io
