// The process's shared arena: one large, sparse anonymous shared-memory file (memfd) mapped once,
// from which a first-fit allocator hands out tensor storage that other processes of the same
// machine can map too (through /proc/<pid>/fd/<fd>), so that MPI ranks of one node read each
// other's collective buffers where they lie. Internal to comm/.
//
// Only touched pages take memory; a freed block of 2 MiB or more gives its pages back (a hole
// punched in the file). Size: TANDEM_COMM_SHM_BYTES (default 1 TiB of address space);
// TANDEM_COMM_SHM=0 turns the arena off (MPI collectives then take the ring).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string_view>

#include "tandem/core/allocator.h"

namespace tandem::comm::detail {

class SharedArena final : public Allocator {
 public:
  // The process's arena, made on first use; nullptr where it is turned off or cannot be made.
  static SharedArena* get();

  void* allocate(size_t bytes) override;
  void deallocate(void* p, size_t bytes) noexcept override;
  std::string_view name() const override { return "shared"; }

  int fd() const { return fd_; }
  size_t capacity() const { return capacity_; }
  char* base() const { return base_; }
  // Whether [p, p + bytes) lies in the arena.
  bool contains(const void* p, size_t bytes) const {
    const char* c = static_cast<const char*>(p);
    return c >= base_ && c + bytes <= base_ + capacity_;
  }

 private:
  SharedArena(int fd, char* base, size_t capacity);

  int fd_;
  char* base_;
  size_t capacity_;
  std::mutex mu_;
  std::map<size_t, size_t> free_;  // offset -> length of each free range, coalesced
};

// The arena of process `pid` (its descriptor `fd`, `bytes` long) mapped into this process, once
// per process and kept until exit; nullptr when it cannot be (another pid namespace, no /proc).
char* map_peer_arena(int pid, int fd, size_t bytes);

}  // namespace tandem::comm::detail
