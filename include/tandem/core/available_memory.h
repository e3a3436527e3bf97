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

}  // namespace tandem
