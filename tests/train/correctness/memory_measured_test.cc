// The start-up memory estimate against the peak resident memory the kernel measured for the run
// (getrusage of the child), on a model large enough to see it (57M parameters): in memory, and
// with the blocks in a file tier (--model-state), which must need less by about the blocks'
// weights, gradients and moments.
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "support/cli.h"
#include "support/scratch.h"

extern char** environ;

namespace tandem {
namespace {

struct Measured {
  double peak_mib = 0;      // the kernel's high-water mark of resident memory
  double estimate_mib = 0;  // "memory estimate: X MiB" of the start-up lines
};

Measured run_measured(const std::string& args, const std::string& log) {
  const std::string cmd =
      "exec '" + testing::tandem_binary() + "' " + args + " > '" + log + "' 2>&1";
  std::vector<char*> argv = {const_cast<char*>("/bin/sh"), const_cast<char*>("-c"),
                             const_cast<char*>(cmd.c_str()), nullptr};
  pid_t pid = 0;
  EXPECT_EQ(posix_spawn(&pid, "/bin/sh", nullptr, nullptr, argv.data(), environ), 0);
  int status = 0;
  struct rusage usage {};
  EXPECT_EQ(wait4(pid, &status, 0, &usage), pid);
  std::ifstream f(log);
  std::stringstream text;
  text << f.rdbuf();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << text.str();
  Measured m;
  m.peak_mib = static_cast<double>(usage.ru_maxrss) / 1024.0;
  const std::string out = text.str();
  // "memory estimate: 1.10 GiB on this machine ..."
  const std::string key = "memory estimate: ";
  if (const size_t at = out.find(key); at != std::string::npos) {
    std::istringstream figure(out.substr(at + key.size(), 16));
    double value = 0;
    std::string unit;
    figure >> value >> unit;
    m.estimate_mib = value * (unit == "GiB" ? 1024.0 : unit == "KiB" ? 1.0 / 1024 : 1.0);
  }
  EXPECT_GT(m.estimate_mib, 0.0) << out;
  return m;
}

TEST(MemoryMeasured, TheEstimateMatchesThePeakResidentMemory) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "sanitizers change every process's memory";
#endif
  testing::ScratchDir dir;
  // The compiled executor: the plan interpreter's update of 57M parameters alone takes 15 s.
  const std::string base =
      "train --dp 1 --tp 1 --seq-len 64 --batch 1 --steps 1 --eval-every 0 --quiet --executor "
      "compiled --threads 1";
  // What any run holds besides its estimate: the program, its libraries, BLAS and the data.
  const Measured floor =
      run_measured(base + " --layers 1 --d-model 16 --heads 1", dir.path("floor.log"));
  const std::string big = base + " --layers 8 --d-model 768 --heads 8";  // 57M parameters
  const Measured in_core = run_measured(big, dir.path("in-core.log"));
  const Measured streamed =
      run_measured(big + " --model-state file:" + dir.path(), dir.path("streamed.log"));
  const double in_core_own = in_core.peak_mib - floor.peak_mib,
               streamed_own = streamed.peak_mib - floor.peak_mib;
  RecordProperty("floor_mib", std::to_string(floor.peak_mib));
  // In memory: parameters, gradients and moments (0.85 GiB) dominate; within 15%.
  EXPECT_NEAR(in_core_own, in_core.estimate_mib, 0.15 * in_core.estimate_mib)
      << "peak " << in_core.peak_mib << " MiB, floor " << floor.peak_mib << " MiB";
  // Streamed: the block slots and the embeddings; within 25% (a smaller figure, so the program's
  // own buffers weigh more).
  EXPECT_NEAR(streamed_own, streamed.estimate_mib, 0.25 * streamed.estimate_mib)
      << "peak " << streamed.peak_mib << " MiB, floor " << floor.peak_mib << " MiB";
  // And the blocks' state is really out of memory: most of what the estimates say it saves.
  EXPECT_LT(streamed.peak_mib + 0.8 * (in_core.estimate_mib - streamed.estimate_mib),
            in_core.peak_mib);
  std::printf(
      "floor %.0f MiB; in memory: peak %.0f MiB, estimate %.0f MiB; streamed: peak %.0f "
      "MiB, estimate %.0f MiB\n",
      floor.peak_mib, in_core.peak_mib, in_core.estimate_mib, streamed.peak_mib,
      streamed.estimate_mib);
}

}  // namespace
}  // namespace tandem
