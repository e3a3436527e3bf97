// How much memory this process may still use, and where that figure comes from: what a run's
// memory check compares its estimate with.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace tandem {

// The memory this process may still use: MemAvailable from /proc/meminfo, or the room left under
// this process's cgroup limit (v2 memory.max less memory.current; v1 memory.limit_in_bytes less
// memory.usage_in_bytes) or the room under the address-space limit (RLIMIT_AS less VmSize) when
// that is less. The TANDEM_MEMORY_LIMIT environment variable states it
// instead ("16GiB"; "off": no check). Nothing when it cannot be read (or is off).
struct AvailableMemory {
  uint64_t bytes = 0;
  std::string source;  // "MemAvailable in /proc/meminfo", "the cgroup limit ...", ...
};
std::optional<AvailableMemory> available_memory();

// The address-space limit (RLIMIT_AS, `ulimit -v`) and what this process has mapped (VmSize);
// nothing without a limit.
struct AddressSpace {
  uint64_t limit = 0;
  uint64_t mapped = 0;
  uint64_t room() const { return limit > mapped ? limit - mapped : 0; }
};
std::optional<AddressSpace> address_space();

// The address space a process reserves for the BLAS and its threads beyond the memory they use,
// which only an address-space limit counts; counted before the BLAS is loaded (tandem train checks
// before it loads it; one loaded already is counted again, on the safe side). Measured on Debian
// 12 (OpenBLAS 0.3.21, glibc 2.36): a tiny run's VmSize is these, its data and what was mapped
// before, within 2%.
// - OpenBLAS's library: 38 MiB (VmSize before and after loading it with one thread).
// - OpenBLAS maps a 128 MiB buffer (its BUFFER_SIZE, 32 << 22 on x86-64) for each thread that
//   runs a product: the main thread, the callers, and each of its workers, which it starts when it
//   is loaded (as many as the cores, or OPENBLAS_NUM_THREADS, less one) or when asked for more.
//   When the limit leaves no room for one it retries without end: the run would hang.
// - every thread's stack (the soft RLIMIT_STACK, 8 MiB by default), which pthread_create maps;
// - glibc's malloc arena for each thread that allocates (64 MiB each, at most MALLOC_ARENA_MAX or
//   8 per core), which may take the room OpenBLAS then lacks.
// - 64 MiB for what else a run maps as it goes (files it reads, its executor's code, small
//   buffers): a tiny run peaks within it above the rest.
// `blas_callers`: the threads that call the BLAS; `blas_threads`: the thread count it is set to;
// `others`: the other threads that allocate (communication, transfers).
inline constexpr uint64_t kOpenBlasLibraryBytes = uint64_t{38} << 20;
inline constexpr uint64_t kOpenBlasBufferBytes = uint64_t{128} << 20;
inline constexpr uint64_t kMallocArenaBytes = uint64_t{64} << 20;
inline constexpr uint64_t kOtherMappingsBytes = uint64_t{64} << 20;
struct ThreadReservations {
  uint64_t blas_library = 0, blas_buffers = 0, stacks = 0, arenas = 0, others = 0;
  uint64_t total() const { return blas_library + blas_buffers + stacks + arenas + others; }
  // "38 MiB of OpenBLAS's library, 384 MiB of its buffers, 24 MiB of thread stacks, 128 MiB of
  // malloc arenas, 64 MiB of other mappings"
  std::string str() const;
};
ThreadReservations thread_reservations(int blas_callers, int blas_threads, int others);

}  // namespace tandem
