// Whole transfers over a file descriptor: the one place that loops over short transfers and
// EINTR, so that every writer and reader above core says only what a failure means to its user.
#pragma once

#include <sys/types.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tandem {

// What a transfer did: `done` bytes moved, and `error` the errno that stopped it (0 when none).
// A read that returns with done < bytes and no error met the end of the file; a write that the
// kernel answers with 0 bytes reports ENOSPC.
struct IoResult {
  size_t done = 0;
  int error = 0;
  bool ok() const { return error == 0; }
};

// Writes all `bytes` (Linux moves at most about 2 GiB a call: larger buffers take several).
IoResult write_all(int fd, const void* data, size_t bytes);
IoResult pwrite_all(int fd, const void* data, size_t bytes, uint64_t offset);
// Reads `bytes`, or up to the end of the file.
IoResult read_full(int fd, void* data, size_t bytes);
IoResult pread_full(int fd, void* data, size_t bytes, uint64_t offset);
// Appends everything left in the file to `out` (a file that grows while it is read included).
IoResult read_to_end(int fd, std::string& out);

// Calls `call` again while it fails with EINTR (a system call that returns -1 and sets errno).
template <class Call>
auto retry_on_eintr(Call call) {
  for (;;) {
    auto r = call();
    if (!(r < 0 && errno == EINTR)) return r;
  }
}
// posix_fallocate, which returns its error instead of setting errno, retried on EINTR: 0 or the
// error.
int allocate_all(int fd, uint64_t bytes);

// Files in a folder someone else may also write to (docs/training.md, "Files tandem writes"): no
// name tandem creates there can be planted first, and no symbolic link is followed.

// A name nobody can predict: `n` letters and digits from the kernel's random source.
std::string random_name(size_t n = 12);

// Creates a new file `dir`/`prefix`<random name> with O_CREAT | O_EXCL | O_NOFOLLOW (a file or
// link planted beforehand is never opened: another name is drawn), mode `mode` less the umask,
// opened with O_CLOEXEC and `flags`; its path in `path`. The descriptor, or -1 with errno set.
int create_unique_file(const std::string& dir, std::string_view prefix, mode_t mode, int flags,
                       std::string& path);

// The same for a folder (mkdir draws another name when one exists); 0, or -1 with errno set.
int create_unique_folder(const std::string& dir, std::string_view prefix, mode_t mode,
                         std::string& path);

// Whether `path` itself is a symbolic link (lstat; false when it does not exist).
bool is_symlink(const std::string& path);

// The one message for a link where tandem would write: "'P' is a symbolic link: tandem does not
// write through links (remove it, or give another path)", after `what` (e.g. "--save 'ck': ").
[[noreturn]] void refuse_symlink(const std::string& path, std::string_view what = {});

// fsync a folder so that a rename or a new entry in it survives a power cut; 0 or the errno
// (a filesystem that cannot sync folders, EINVAL, counts as done).
int sync_folder(const std::string& dir);

// A file replaced whole and crash-safely: written under a temporary name beside its destination,
// then fsync'd and renamed over it. The one such writer: io::AtomicFile (checkpoints, traces,
// token folders) and the private cache's files stand on it. The temporary is made by
// create_unique_file (".<name>.tmp-<pid>-<random>"); a destination that is a symbolic link is
// refused (ELOOP), never replaced or followed. Each call returns 0 or the errno that stopped it;
// the caller says what that means to its user. Destroyed uncommitted, the temporary is removed.
class ReplacementFile {
 public:
  ReplacementFile() = default;
  ~ReplacementFile() { discard(); }
  ReplacementFile(const ReplacementFile&) = delete;
  ReplacementFile& operator=(const ReplacementFile&) = delete;

  // Creates the temporary for destination `path` with mode `mode` (less the umask).
  int create(const std::string& path, mode_t mode);
  // fsync the file, close it, rename it over the destination, fsync the folder.
  int commit();
  // Closes and removes the temporary (nothing when committed).
  void discard();

  int fd() const { return fd_; }
  const std::string& temp_path() const { return temp_; }
  // Whether the rename has happened (a failure after it is the folder's fsync only).
  bool renamed() const { return renamed_; }

 private:
  std::string path_, temp_;
  int fd_ = -1;
  bool renamed_ = false;
};

// The temporary names create_unique_file and create_unique_folder give, as `<pid>-<random>`
// after a ".tmp-" or ".old-": whether `s` is such a tail (the older `<pid>` alone included), and
// the pid it names.
bool is_temporary_tail(std::string_view s, long* pid = nullptr);

}  // namespace tandem
