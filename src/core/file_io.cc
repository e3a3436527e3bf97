// Whole transfers over a file descriptor (file_io.h).
#include "tandem/core/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

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

}  // namespace tandem
