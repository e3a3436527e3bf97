// The available-memory probe: /proc/meminfo, the cgroup's limit, the address-space limit.
#include "tandem/core/available_memory.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "tandem/core/bytes.h"
#include "tandem/core/env.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

// The first line of a small file, or "" when it cannot be read.
std::string first_line(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

std::optional<uint64_t> number_in(const std::string& path) {
  const std::string text = first_line(path);
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  return std::strtoull(text.c_str(), nullptr, 10);
}

std::optional<uint64_t> mem_available() {
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  uint64_t kib = 0;
  while (f >> key >> kib) {
    std::getline(f, unit);
    if (key == "MemAvailable:") return kib * 1024;
  }
  return std::nullopt;
}

// The room under this process's cgroup memory limit, with the limit file's name; nothing when
// there is no limit (or no cgroup file to read).
std::optional<AvailableMemory> cgroup_room() {
  std::ifstream f("/proc/self/cgroup");
  std::string line;
  while (std::getline(f, line)) {
    // v2: "0::/path"; v1: "N:memory:/path" (the controllers may be a list: "N:cpu,memory:/p").
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    const bool v2 = line.substr(0, a) == "0" && controllers.empty();
    bool memory = false;
    std::stringstream list(controllers);
    for (std::string c; std::getline(list, c, ',');) memory = memory || c == "memory";
    if (!v2 && !memory) continue;
    const std::string root = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory";
    const char* limit_file = v2 ? "memory.max" : "memory.limit_in_bytes";
    const char* usage_file = v2 ? "memory.current" : "memory.usage_in_bytes";
    // Inside a container the process's own cgroup is often the mount's root.
    for (const std::string& dir : {root + (path == "/" ? "" : path), root}) {
      const std::optional<uint64_t> limit = number_in(dir + "/" + limit_file);  // "max": none
      if (!limit) continue;
      if (*limit >= (uint64_t{1} << 60)) return std::nullopt;  // v1's "no limit"
      const uint64_t used = number_in(dir + "/" + usage_file).value_or(0);
      return AvailableMemory{
          *limit > used ? *limit - used : 0,
          fmt::format("the room under the cgroup limit {} ({} of {} used)", dir + "/" + limit_file,
                      human_bytes(used), human_bytes(*limit))};
    }
  }
  return std::nullopt;
}

// The room under this process's address-space limit less what it has mapped already. Past it an
// allocation fails (or the allocator retries, spinning) however much memory the machine has.
std::optional<AvailableMemory> address_space_room() {
  const std::optional<AddressSpace> as = address_space();
  if (!as) return std::nullopt;
  return AvailableMemory{as->room(),
                         fmt::format("the room under the address-space limit (ulimit -v) of {} ({} "
                                     "mapped)",
                                     human_bytes(as->limit), human_bytes(as->mapped))};
}

}  // namespace

std::optional<AddressSpace> address_space() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return std::nullopt;
  std::ifstream f("/proc/self/status");
  AddressSpace as;
  as.limit = limit.rlim_cur;
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmSize:", 0) == 0)
      as.mapped = std::strtoull(line.c_str() + 7, nullptr, 10) * 1024;
  return as;
}

ThreadReservations thread_reservations(int blas_callers, int blas_threads, int others) {
  const auto n = [](int k) { return static_cast<uint64_t>(std::max(0, k)); };
  const uint64_t cores = std::max(1u, std::thread::hardware_concurrency());
  // The workers OpenBLAS starts when it is loaded (its thread count from the environment as it
  // reads it, else the cores), and those it adds when asked for more.
  uint64_t at_load = cores;
  for (const char* name : {"OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"})
    if (const std::string v = env_str(name, ""); !v.empty()) {
      at_load = std::max<uint64_t>(1, std::strtoull(v.c_str(), nullptr, 10));
      break;
    }
  const uint64_t workers = std::max(at_load, n(blas_threads)) - 1;
  // pthread's default stack is the soft stack limit (2 MiB where that is unlimited).
  rlimit stack{};
  uint64_t stack_bytes = uint64_t{8} << 20;
  if (::getrlimit(RLIMIT_STACK, &stack) == 0)
    stack_bytes = stack.rlim_cur == RLIM_INFINITY ? uint64_t{2} << 20 : stack.rlim_cur;
  // glibc's arenas beside the main one: at most MALLOC_ARENA_MAX, else 8 per core, in all.
  const std::string max_text = env_str("MALLOC_ARENA_MAX", "");
  const uint64_t arena_max =
      max_text.empty() ? 8 * cores : std::strtoull(max_text.c_str(), nullptr, 10);
  ThreadReservations r;
  r.blas_library = kOpenBlasLibraryBytes;
  r.others = kOtherMappingsBytes;
  r.blas_buffers = kOpenBlasBufferBytes * (1 + n(blas_callers) + workers);
  r.stacks = stack_bytes * (n(blas_callers) + workers + n(others));
  r.arenas =
      kMallocArenaBytes * std::min(n(blas_callers) + n(others), arena_max > 0 ? arena_max - 1 : 0);
  return r;
}

std::string ThreadReservations::str() const {
  return fmt::format(
      "{} of OpenBLAS's library, {} of its buffers, {} of thread stacks, {} of malloc arenas, {} "
      "of other mappings",
      human_bytes(blas_library), human_bytes(blas_buffers), human_bytes(stacks),
      human_bytes(arenas), human_bytes(others));
}

std::optional<AvailableMemory> available_memory() {
  const std::string stated = env_str("TANDEM_MEMORY_LIMIT", "");
  if (stated == "off") return std::nullopt;
  if (!stated.empty()) {
    try {
      return AvailableMemory{parse_bytes(stated), "TANDEM_MEMORY_LIMIT"};
    } catch (const UserError& e) {
      user_error("TANDEM_MEMORY_LIMIT: {} (give a size such as 16GiB, or off)", e.what());
    }
  }
  std::optional<AvailableMemory> best;
  if (const auto bytes = mem_available())
    best = AvailableMemory{*bytes, "MemAvailable in /proc/meminfo"};
  if (const auto room = cgroup_room(); room && (!best || room->bytes < best->bytes)) best = room;
  if (const auto room = address_space_room(); room && (!best || room->bytes < best->bytes))
    best = room;
  return best;
}

}  // namespace tandem
