// The process's shared arena and the mapping of its peers' arenas (see shared_arena.h).
#include "shared_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>
#include <utility>

#include "tandem/core/env.h"
#include "tandem/core/error.h"

namespace tandem::comm::detail {
namespace {

constexpr size_t kPage = 4096;
constexpr size_t kPunchBytes = size_t{2} << 20;  // free blocks this large give their pages back
constexpr int64_t kDefaultArenaBytes = int64_t{1} << 40;

size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

}  // namespace

SharedArena::SharedArena(int fd, char* base, size_t capacity)
    : fd_(fd), base_(base), capacity_(capacity) {
  free_[0] = capacity;
}

SharedArena* SharedArena::get() {
  static SharedArena* arena = []() -> SharedArena* {
    if (env_int("TANDEM_COMM_SHM", 1) == 0) return nullptr;
    const int64_t want = env_int("TANDEM_COMM_SHM_BYTES", kDefaultArenaBytes);
    if (want < static_cast<int64_t>(kPage))
      user_error(
          "TANDEM_COMM_SHM_BYTES={} is not an arena size: expected at least {} bytes "
          "(default {})",
          want, kPage, kDefaultArenaBytes);
#ifdef __linux__
    const size_t bytes = round_up(static_cast<size_t>(want), kPage);
    const int fd = memfd_create("tandem-shared-arena", MFD_CLOEXEC);
    if (fd < 0) return nullptr;
    if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      close(fd);
      return nullptr;
    }
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (p == MAP_FAILED) {
      close(fd);
      return nullptr;
    }
    return new SharedArena(fd, static_cast<char*>(p), bytes);  // lives as long as the process
#else
    return nullptr;
#endif
  }();
  return arena;
}

void* SharedArena::allocate(size_t bytes) {
  const size_t len = round_up(std::max<size_t>(bytes, 1), kPage);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < len) continue;
    const size_t off = it->first, rest = it->second - len;
    free_.erase(it);
    if (rest > 0) free_[off + len] = rest;
    return base_ + off;
  }
  user_error(
      "the shared-memory arena ({} bytes, TANDEM_COMM_SHM_BYTES) has no free block of {} "
      "bytes left",
      capacity_, len);
}

void SharedArena::deallocate(void* p, size_t bytes) noexcept {
  if (p == nullptr) return;
  size_t off = static_cast<size_t>(static_cast<char*>(p) - base_);
  size_t len = round_up(std::max<size_t>(bytes, 1), kPage);
#ifdef __linux__
  if (len >= kPunchBytes)
    fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(off),
              static_cast<off_t>(len));
#endif
  std::lock_guard<std::mutex> lock(mu_);
  auto next = free_.lower_bound(off);
  if (next != free_.end() && off + len == next->first) {
    len += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      prev->second += len;
      return;
    }
  }
  free_[off] = len;
}

char* map_peer_arena(int pid, int fd, size_t bytes) {
#ifdef __linux__
  static std::mutex mu;
  static std::map<std::pair<int, int>, char*> mapped;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(pid, fd);
  auto it = mapped.find(key);
  if (it != mapped.end()) return it->second;
  char* base = nullptr;
  if (pid == getpid()) {
    SharedArena* mine = SharedArena::get();
    if (mine != nullptr && mine->fd() == fd) base = mine->base();
  } else {
    const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
    const int peer = open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (peer < 0) return nullptr;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, peer, 0);
    close(peer);
    if (p == MAP_FAILED) return nullptr;
    base = static_cast<char*>(p);
  }
  if (base != nullptr) mapped[key] = base;
  return base;
#else
  (void)pid;
  (void)fd;
  (void)bytes;
  return nullptr;
#endif
}

}  // namespace tandem::comm::detail
