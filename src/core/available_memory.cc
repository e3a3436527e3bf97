// The available-memory probe: /proc/meminfo, the cgroup's limit, the address-space limit.
#include "tandem/core/available_memory.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

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

// The room under this process's address-space limit (RLIMIT_AS, `ulimit -v`) less what it has
// mapped already (VmSize); nothing without a limit. Past it an allocation fails (or the
// allocator retries, spinning) however much memory the machine has.
std::optional<AvailableMemory> address_space_room() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return std::nullopt;
  std::ifstream f("/proc/self/status");
  uint64_t mapped = 0;
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmSize:", 0) == 0) mapped = std::strtoull(line.c_str() + 7, nullptr, 10) * 1024;
  const uint64_t cap = limit.rlim_cur;
  return AvailableMemory{cap > mapped ? cap - mapped : 0,
                         fmt::format("the room under the address-space limit (ulimit -v) of {} ({} "
                                     "mapped)",
                                     human_bytes(cap), human_bytes(mapped))};
}

}  // namespace

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
