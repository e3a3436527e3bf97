// Runs the `tandem` command from the test suites: the binary sits at the top of the build folder,
// one level above the test executables (tests/), unless TANDEM_BIN names it.
#pragma once

#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace tandem::testing {

inline std::string tandem_binary() {
  if (const char* bin = std::getenv("TANDEM_BIN")) return bin;
  char self[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return "tandem";
  self[n] = '\0';
  return (std::filesystem::path(self).parent_path().parent_path() / "tandem").string();
}

// The start of a shell command running mpirun ($TANDEM_MPIRUN, else mpirun on PATH), as root too,
// oversubscribed, killed after `kill_after_s` seconds; the caller adds -np N and the program.
inline std::string mpirun_command(int kill_after_s) {
  const char* mpirun = std::getenv("TANDEM_MPIRUN");
  return fmt::format(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout -s KILL {} {} "
      "--oversubscribe",
      kill_after_s, mpirun != nullptr ? mpirun : "mpirun");
}

struct CommandResult {
  int status = -1;     // the exit code
  std::string output;  // stdout and stderr together
};

// Runs a shell command line, stdout and stderr together.
inline CommandResult run_command(const std::string& command) {
  CommandResult r;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  size_t got;
  while ((got = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), got);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// Runs `tandem <args>` (args already shell-quoted where needed).
inline CommandResult run_tandem(const std::string& args) {
  const std::string bin = tandem_binary();
  if (!std::filesystem::exists(bin)) {
    CommandResult r;
    r.output = fmt::format(
        "the tandem binary is not at {} (build the `tandem` target, or set TANDEM_BIN)", bin);
    return r;
  }
  return run_command(fmt::format("'{}' {}", bin, args));
}

// The `"loss":...` fields of a --metrics file, one a step, as written (compared as text).
inline std::vector<std::string> logged_losses(const std::string& metrics) {
  std::vector<std::string> losses;
  std::ifstream f(metrics);
  for (std::string line; std::getline(f, line);) {
    const size_t at = line.find("\"loss\":");
    if (at != std::string::npos) losses.push_back(line.substr(at, line.find(',', at) - at));
  }
  return losses;
}

}  // namespace tandem::testing
