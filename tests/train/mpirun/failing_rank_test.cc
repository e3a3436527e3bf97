// `tandem train --backend mpi` under a real mpirun, when one rank fails alone: a bad output path
// found by rank 0 at start, a disk that fills under rank 0 during a save, a rank that stops. The
// job must end within seconds, the failing (or waiting) rank's message on stderr, instead of the
// other ranks waiting forever. And a failure all ranks reach together is reported once. Each test
// starts mpirun itself (with a time limit, so that a regression is a failure, not a hung suite);
// the folder's CTest label, train.mpirun, is picked by `ctest -L mpi`.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <thread>

#include "support/cli.h"
#include "support/scratch.h"
#include "train/test_util.h"

namespace tandem::train {
namespace {

using tandem::testing::CommandResult;
using tandem::testing::ScratchDir;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// A job that mpirun did not end by itself within this many seconds counts as hung.
constexpr int kHung = 90;

// `mpirun -np 2` running `tandem train` on the tiny model for (practically) ever, data-parallel
// over both processes, each process's pid written to DIR/pid.<rank> first (exec keeps it).
std::string job(const ScratchDir& dir, const std::string& flags) {
  return fmt::format(
      "{} -np 2 sh -c 'echo $$ > {}/pid.$OMPI_COMM_WORLD_RANK; exec \"{}\" train --backend "
      "mpi --model tiny --dp 2 --tp 1 --steps 100000000 --eval-every 0 --executor plan --threads 1 "
      "--quiet {}'",
      tandem::testing::mpirun_command(kHung), dir.path(), tandem::testing::tandem_binary(), flags);
}

struct Ended {
  CommandResult result;
  double seconds = 0;
};

// Starts the job; `meanwhile` runs while it does (to stop a rank, fill a disk).
Ended run_job(const std::string& command, const std::function<void()>& meanwhile = {}) {
  const auto begin = Clock::now();
  auto running =
      std::async(std::launch::async, [&] { return tandem::testing::run_command(command); });
  if (meanwhile) meanwhile();
  Ended e{running.get(), std::chrono::duration<double>(Clock::now() - begin).count()};
  return e;
}

// Waits (at most a minute) until `path` exists: the job has got that far.
bool wait_for_file(const std::string& path) {
  for (int i = 0; i < 600 && !fs::exists(path); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  return fs::exists(path);
}

int pid_of_rank(const ScratchDir& dir, int rank) {
  std::ifstream f(dir.path("pid." + std::to_string(rank)));
  int pid = 0;
  f >> pid;
  return pid;
}

void expect_ended_by_itself(const Ended& e) {
  EXPECT_NE(e.result.status, 0) << e.result.output;
  EXPECT_LT(e.seconds, kHung - 5) << "mpirun did not end the job:\n" << e.result.output;
}

// Rank 0 alone writes the outputs, so rank 0 alone finds a bad one, before the first step.
TEST(FailingRank, ABadOutputPathOnRankZeroEndsTheJob) {
  ScratchDir dir;
  testing::write_bytes(dir.path("file"), "x");
  for (const std::string flag : {"--metrics", "--save", "--trace"}) {
    const std::string path = dir.path("file/out");
    const Ended e = run_job(job(dir, flag + " " + path));
    expect_ended_by_itself(e);
    EXPECT_THAT(e.result.output, HasSubstr("tandem: error: rank 0 of 2: " + flag + " '" + path +
                                           "': cannot create folder '"))
        << e.result.output;
    EXPECT_LT(e.seconds, 30) << e.result.output;
  }
}

// A disk that fills under rank 0 in the middle of the run (here: a file-size limit set on rank 0
// once its first checkpoint is written) fails the next save on rank 0 alone.
TEST(FailingRank, ADiskThatFillsDuringASaveEndsTheJob) {
  ScratchDir dir;
  const Ended e = run_job(job(dir, "--save " + dir.path("ck") + " --save-every 2"), [&] {
    if (!wait_for_file(dir.path("ck/latest"))) return;
    const std::string limit = fmt::format("prlimit --pid {} --fsize=4096", pid_of_rank(dir, 0));
    EXPECT_EQ(std::system(limit.c_str()), 0) << limit;
  });
  expect_ended_by_itself(e);
  EXPECT_THAT(e.result.output,
              MatchesRegex("(.|\n)*tandem: error: rank 0 of 2: cannot write "
                           "'[^']*/ck/step-[0-9]+/[a-z.]+': File too large(.|\n)*"))
      << e.result.output;
  // The checkpoint `latest` names is still whole.
  EXPECT_TRUE(fs::exists(dir.path("ck/latest")));
}

// A data file that only rank 0 can read: rank 1 fails before MPI starts, which ends the job too,
// its message naming it.
TEST(FailingRank, ADataFileMissingOnOneRankEndsTheJob) {
  ScratchDir dir;
  testing::write_bytes(dir.path("data.txt"), std::string(20000, 'a'));
  std::string command = job(dir, "--data \"$DATA\"");
  const std::string exec = "exec ";
  command.insert(command.find(exec), "DATA=" + dir.path("data.txt") +
                                         "; [ \"$OMPI_COMM_WORLD_RANK\" = 1 ] && DATA=" +
                                         dir.path("missing.txt") + "; ");
  const Ended e = run_job(command);
  expect_ended_by_itself(e);
  EXPECT_THAT(e.result.output, HasSubstr("tandem: error: rank 1 of 2: data file '" +
                                         dir.path("missing.txt") + "' does not exist"))
      << command << "\n"
      << e.result.output;
}

// Ranks started with different flags (here a seed, which would train silently to another
// result) all stop at start-up, before any step, and rank 0 names the flag, the ranks and their
// values, once.
TEST(FailingRank, RanksGivenDifferentFlagsStopAtStartNamingTheFlag) {
  ScratchDir dir;
  std::string command = job(dir, "--seed \"$SEED\"");
  const std::string exec = "exec ";
  command.insert(command.find(exec), "SEED=$((1 + 7 * OMPI_COMM_WORLD_RANK)); ");
  const Ended e = run_job(command);
  expect_ended_by_itself(e);
  EXPECT_THAT(e.result.output,
              HasSubstr("tandem: error: the ranks disagree on --seed: rank 0 gives 1, rank 1 "
                        "gives 8; every rank of a job must be started with the same flags"))
      << command << "\n"
      << e.result.output;
}

// The metrics file, which rank 0 alone appends to every step, stops growing mid-run: every rank
// learns of it after the step (and would save its checkpoint, with --save) and stops; rank 0 says
// why, once.
TEST(FailingRank, AMetricsFileThatCannotGrowEndsTheJob) {
  ScratchDir dir;
  const Ended e = run_job(job(dir, "--metrics " + dir.path("m.jsonl")), [&] {
    if (!wait_for_file(dir.path("m.jsonl"))) return;
    const std::string limit = fmt::format("prlimit --pid {} --fsize=100", pid_of_rank(dir, 0));
    EXPECT_EQ(std::system(limit.c_str()), 0) << limit;
  });
  expect_ended_by_itself(e);
  EXPECT_THAT(e.result.output,
              HasSubstr("tandem: error: cannot write metrics file '" + dir.path("m.jsonl") +
                        "': File too large; training stopped "
                        "after step "))
      << e.result.output;
}

// A rank stopped (SIGSTOP: a debugger, a hung node) leaves rank 0 waiting in a collective until
// the timeout, which then ends the job naming the collective, the step and the stopped rank
// (which may have stopped before the call, or inside it: over shared memory, rank 0 then sees
// that it arrived but never finished its part, or, waiting to send, that it never posted the
// matching receive).
TEST(FailingRank, AStoppedRankTimesOut) {
  ScratchDir dir;
  int stopped = 0;
  const Ended e =
      run_job(job(dir, "--comm-timeout 2 --save " + dir.path("ck") + " --save-every 5"), [&] {
        if (!wait_for_file(dir.path("ck/latest"))) return;
        stopped = pid_of_rank(dir, 1);
        ::kill(stopped, SIGSTOP);
      });
  if (stopped > 0) ::kill(stopped, SIGKILL);  // should mpirun have left it
  expect_ended_by_itself(e);
  EXPECT_THAT(
      e.result.output,
      MatchesRegex(
          "(.|\n)*tandem: error: [a-z_]+ on rank 0 of 2 timed out "
          "after 2 s at [a-z ]*step [0-9]+( \\([a-z0-9._]+\\))?: rank 1 (did not arrive|never "
          "sent|never posted the receive|arrived but has not finished its part)(.|\n)*"))
      << e.result.output;
  EXPECT_LT(e.seconds, 60) << e.result.output;
}

// The same stopped rank, but the job gets a SIGTERM (a batch scheduler's notice) while rank 0
// waits for it, with a communication timeout far away: rank 0 gives up the stop grace (1 s here)
// after the signal, naming the collective, the stopped rank, the signal, the step that was not
// saved and the checkpoint that was, and exits as the signal asks (143).
TEST(FailingRank, ASigtermEndsAWaitForAStoppedRankWellBeforeTheTimeout) {
  ScratchDir dir;
  int stopped = 0;
  double signalled_at = 0;
  const auto begin = Clock::now();
  std::string command = job(dir, "--comm-timeout 300 --save " + dir.path("ck") + " --save-every 5");
  command.insert(command.find("exec "), "export TANDEM_STOP_GRACE=1; ");
  const Ended e = run_job(command, [&] {
    if (!wait_for_file(dir.path("ck/latest"))) return;
    stopped = pid_of_rank(dir, 1);
    ::kill(stopped, SIGSTOP);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // rank 0 now waits for it
    signalled_at = std::chrono::duration<double>(Clock::now() - begin).count();
    ::kill(pid_of_rank(dir, 0), SIGTERM);
  });
  if (stopped > 0) ::kill(stopped, SIGKILL);  // should mpirun have left it
  expect_ended_by_itself(e);
  EXPECT_THAT(
      e.result.output,
      MatchesRegex("(.|\n)*tandem: error: [a-z_]+ on rank 0 of 2 at [a-z ]*step [0-9]+( "
                   "\\([a-z0-9._]+\\))?: given up [0-9.]+ s after SIGTERM: rank 1 [^;]*; a "
                   "rank that does not arrive is stuck, stopped, lost or started with other "
                   "settings; no checkpoint was written for step [0-9]+, the step in "
                   "progress; the last checkpoint is step [0-9]+ in '[^']*/ck/"
                   "step-[0-9]+'(.|\n)*"))
      << e.result.output;
  EXPECT_LT(e.seconds - signalled_at, 30) << "the timeout is 300 s:\n" << e.result.output;
}

// A divergence every rank finds together (the loss is all-reduced) is one failure: rank 0 prints
// it once, every rank exits, and the checkpoint before it is kept.
TEST(FailingRank, ADivergenceIsReportedOnceAndKeepsTheCheckpoint) {
  ScratchDir dir;
  const Ended e =
      run_job(job(dir, "--lr 1e30 --warmup 0 --save " + dir.path("ck") + " --save-every 1"));
  expect_ended_by_itself(e);
  const std::string& out = e.result.output;
  EXPECT_THAT(out, HasSubstr("tandem: error: the loss at step 2 is NaN")) << out;
  const size_t first = out.find("tandem: error:");
  EXPECT_EQ(out.find("tandem: error:", first + 1), std::string::npos) << out;
  EXPECT_EQ(testing::read_bytes(dir.path("ck/latest")), "step-00000001\n");
}

}  // namespace
}  // namespace tandem::train
