// Whole transfers over a file descriptor (file_io.h).
#include "tandem/core/file_io.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>

#include "tandem/core/error.h"

namespace tandem {

namespace {

// Repeats `step(done)` (one system call moving bytes from position `done`) until `bytes` have
// moved, the call fails with anything but EINTR, or it moves nothing: the end of a read's file,
// or a write the kernel accepts no more of (reported as ENOSPC).
template <class Step>
IoResult transfer(size_t bytes, bool writing, Step step) {
  IoResult r;
  while (r.done < bytes) {
    const ssize_t n = step(r.done);
    if (n < 0) {
      if (errno == EINTR) continue;
      r.error = errno;
      return r;
    }
    if (n == 0) {
      if (writing) r.error = ENOSPC;
      return r;
    }
    r.done += static_cast<size_t>(n);
  }
  return r;
}

}  // namespace

IoResult write_all(int fd, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  return transfer(bytes, true, [&](size_t done) { return ::write(fd, p + done, bytes - done); });
}

IoResult pwrite_all(int fd, const void* data, size_t bytes, uint64_t offset) {
  const char* p = static_cast<const char*>(data);
  return transfer(bytes, true, [&](size_t done) {
    return ::pwrite(fd, p + done, bytes - done, static_cast<off_t>(offset + done));
  });
}

IoResult read_full(int fd, void* data, size_t bytes) {
  char* p = static_cast<char*>(data);
  return transfer(bytes, false, [&](size_t done) { return ::read(fd, p + done, bytes - done); });
}

IoResult pread_full(int fd, void* data, size_t bytes, uint64_t offset) {
  char* p = static_cast<char*>(data);
  return transfer(bytes, false, [&](size_t done) {
    return ::pread(fd, p + done, bytes - done, static_cast<off_t>(offset + done));
  });
}

IoResult read_to_end(int fd, std::string& out) {
  IoResult total;
  constexpr size_t kChunk = 65536;
  for (;;) {
    const size_t start = out.size();
    out.resize(start + kChunk);
    const IoResult r = read_full(fd, out.data() + start, kChunk);
    out.resize(start + r.done);
    total.done += r.done;
    if (!r.ok()) {
      total.error = r.error;
      return total;
    }
    if (r.done < kChunk) return total;
  }
}

int allocate_all(int fd, uint64_t bytes) {
  int err;
  do {
    err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  } while (err == EINTR);
  return err;
}

namespace {

std::string folder_of(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

std::string joined(const std::string& dir, std::string_view prefix, const std::string& name) {
  return (std::filesystem::path(dir) / (std::string(prefix) + name)).string();
}

// Draws a name and calls `make(path)` (-1 with errno EEXIST when the name is taken) until one is
// free: a name someone planted is passed over, never opened.
template <class Make>
int with_unique_name(const std::string& dir, std::string_view prefix, std::string& path,
                     Make make) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    path = joined(dir, prefix, random_name());
    const int r = retry_on_eintr([&] { return make(path); });
    if (r >= 0 || errno != EEXIST) return r;
  }
  return -1;  // errno EEXIST: a hundred random names taken
}

}  // namespace

std::string random_name(size_t n) {
  static constexpr std::string_view kChars = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::string bytes(n, '\0');
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::getrandom(bytes.data() + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  if (got < n) {  // no getrandom (an old kernel): the standard library's source
    std::random_device device;
    for (size_t i = got; i < n; ++i) bytes[i] = static_cast<char>(device());
  }
  std::string out(n, ' ');
  for (size_t i = 0; i < n; ++i)
    out[i] = kChars[static_cast<unsigned char>(bytes[i]) % kChars.size()];
  return out;
}

int create_unique_file(const std::string& dir, std::string_view prefix, mode_t mode, int flags,
                       std::string& path) {
  return with_unique_name(dir, prefix, path, [&](const std::string& p) {
    return ::open(p.c_str(), O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | flags, mode);
  });
}

int create_unique_folder(const std::string& dir, std::string_view prefix, mode_t mode,
                         std::string& path) {
  return with_unique_name(dir, prefix, path,
                          [&](const std::string& p) { return ::mkdir(p.c_str(), mode); });
}

bool is_symlink(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
}

void refuse_symlink(const std::string& path, std::string_view what) {
  user_error(
      "{}'{}' is a symbolic link: tandem does not write through links (remove it, or give "
      "another path)",
      what, path);
}

int sync_folder(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno;
  int err = 0;
  if (::fsync(fd) != 0 && errno != EINVAL) err = errno;
  ::close(fd);
  return err;
}

int ReplacementFile::create(const std::string& path, mode_t mode) {
  discard();
  path_ = path;
  renamed_ = false;
  if (is_symlink(path)) return ELOOP;
  const std::filesystem::path p(path);
  const std::string prefix = fmt::format(".{}.tmp-{}-", p.filename().string(), ::getpid());
  fd_ = create_unique_file(folder_of(path), prefix, mode, O_RDWR, temp_);
  if (fd_ < 0) {
    const int err = errno;
    temp_.clear();
    return err;
  }
  return 0;
}

int ReplacementFile::commit() {
  if (fd_ < 0) return EBADF;
  // The data must be on disk before the rename makes it visible, or a power cut could leave the
  // new name pointing at an empty file.
  if (retry_on_eintr([&] { return ::fsync(fd_); }) != 0) return errno;
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0 && errno != EINTR) return errno;
  // Checked again just before: a link planted since create() is refused, not replaced.
  if (is_symlink(path_)) return ELOOP;
  if (::rename(temp_.c_str(), path_.c_str()) != 0) return errno;
  renamed_ = true;
  temp_.clear();
  return sync_folder(folder_of(path_));
}

void ReplacementFile::discard() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!temp_.empty() && !renamed_) ::unlink(temp_.c_str());
  temp_.clear();
}

bool is_temporary_tail(std::string_view s, long* pid) {
  const size_t dash = s.find('-');
  const std::string_view digits = s.substr(0, dash);
  if (digits.empty() || digits.size() > 10) return false;
  long value = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + (c - '0');
  }
  if (dash != std::string_view::npos) {
    const std::string_view rest = s.substr(dash + 1);
    if (rest.empty()) return false;
    for (char c : rest)
      if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))) return false;
  }
  if (pid != nullptr) *pid = value;
  return true;
}

}  // namespace tandem
