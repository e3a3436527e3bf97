// Whole transfers over a file descriptor: the one place that loops over short transfers and
// EINTR, so that every writer and reader above core says only what a failure means to its user.
#pragma once

#include <sys/types.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <string>

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

}  // namespace tandem
