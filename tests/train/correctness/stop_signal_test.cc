// SIGTERM and SIGINT (a batch scheduler's notice, Ctrl-C): the run stops after the step in
// progress with a checkpoint, releases its --save folder, exits with 128 + the signal's number,
// and resuming from that checkpoint ends bitwise where the uninterrupted run ends; a second
// signal ends the process at once; the temporary folders a killed save left are removed by the
// next run that owns the folder.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>

#include "support/cli.h"
#include "support/scratch.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

// Steps of about 0.1 s (d_model 128), so that a signal sent after the first one lands mid-run.
std::string flags(const std::string& save, int steps, int d_model = 128) {
  return fmt::format(
      "train --layers 4 --d-model {} --heads 4 --seq-len 64 --batch 8 --dp 1 --tp 1 "
      "--eval-every 0 --steps {} --save '{}' --keep-checkpoints 5",
      d_model, steps, save);
}

std::string read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Starts the run, sends `signals` (0.05 s apart) once its first step is in the metrics file,
// waits, and returns its output followed by "status N".
testing::CommandResult run_and_signal(const std::string& args, const std::string& metrics,
                                      std::initializer_list<const char*> signals) {
  std::string send;
  for (const char* sig : signals) send += fmt::format("kill -{} $pid; sleep 0.05; ", sig);
  return testing::run_command(fmt::format(
      "('{}' {} --metrics '{}' 2>&1 & pid=$!; while [ ! -s '{}' ]; do sleep 0.02; done; {} wait "
      "$pid; echo \"status $?\")",
      testing::tandem_binary(), args, metrics, metrics, send));
}

TEST(StopSignal, SigtermSavesStopsAndTheResumeIsBitwiseTheUninterruptedRun) {
  testing::ScratchDir dir;
  const int steps = 40;
  const testing::CommandResult straight =
      testing::run_tandem(flags(dir.path("straight"), steps) + " --quiet");
  ASSERT_EQ(straight.status, 0) << straight.output;

  const testing::CommandResult stopped =
      run_and_signal(flags(dir.path("ck"), steps), dir.path("m.jsonl"), {"TERM"});
  EXPECT_THAT(stopped.output, HasSubstr("status 143")) << stopped.output;
  EXPECT_THAT(stopped.output, HasSubstr("tandem train: SIGTERM: stopping after this step"));
  EXPECT_THAT(stopped.output, ::testing::ContainsRegex("stopped by SIGTERM after step [0-9]+ of "
                                                       "40; --resume .* continues it"));
  EXPECT_FALSE(fs::exists(dir.path("ck/.tandem-lock"))) << "the lock is released";
  const std::string latest = read(dir.path("ck/latest"));
  ASSERT_FALSE(latest.empty()) << stopped.output;
  EXPECT_NE(latest, "step-00000040\n") << "the signal came before the end";

  const testing::CommandResult resumed = testing::run_tandem(
      flags(dir.path("ck"), steps) + " --quiet --resume '" + dir.path("ck") + "'");
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_EQ(read(dir.path("ck/step-00000040/weights.safetensors")),
            read(dir.path("straight/step-00000040/weights.safetensors")));
  EXPECT_EQ(read(dir.path("ck/step-00000040/optimizer.safetensors")),
            read(dir.path("straight/step-00000040/optimizer.safetensors")));
}

TEST(StopSignal, ASecondSignalStopsAtOnce) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer defers a signal to its next safe point, so two sent close "
                  "together may arrive as one";
#endif
  testing::ScratchDir dir;
  const testing::CommandResult r =
      // Steps of about a second: the second signal comes while the first waits for the step.
      run_and_signal(flags(dir.path("ck"), 400, 768), dir.path("m.jsonl"), {"INT", "INT"});
  EXPECT_THAT(r.output, HasSubstr("status 130")) << r.output;
  EXPECT_THAT(r.output, Not(HasSubstr("stopped by SIGINT after step")));
}

TEST(StopSignal, TemporaryFoldersOfAKilledSaveAreRemovedByTheNextRun) {
  testing::ScratchDir dir;
  fs::create_directories(dir.path("ck/step-00000003.tmp-99999"));
  fs::create_directories(
      dir.path("ck/step-00000002.old-99998"));  // may be a checkpoint's only copy
  std::ofstream(dir.path("ck/.latest.tmp-99999-0")) << "step-00000003\n";
  const testing::CommandResult r = testing::run_tandem(flags(dir.path("ck"), 1) + " --quiet");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_FALSE(fs::exists(dir.path("ck/step-00000003.tmp-99999")));
  EXPECT_FALSE(fs::exists(dir.path("ck/.latest.tmp-99999-0")));
  EXPECT_TRUE(fs::exists(dir.path("ck/step-00000002.old-99998")));
}

}  // namespace
}  // namespace tandem
