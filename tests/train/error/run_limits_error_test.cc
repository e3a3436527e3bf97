// What one run may not do to another or to the machine: a second run writing a --save folder that
// a live run holds is refused naming the holder's pid; --backend thread under mpirun is warned
// about; inputs without an end (a device, a pipe) and rank counts past the thread backend's limit
// are refused at once.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <thread>

#include "support/cli.h"
#include "train/test_util.h"

namespace tandem::train {
namespace {

using ::testing::HasSubstr;
using testing::ScratchDir;
using testing::user_error_of;
namespace fs = std::filesystem;

// `tandem train` writing to `save` for a long time, started in the background; killed at the end.
class LongRun {
 public:
  explicit LongRun(const std::string& save) {
    const std::string bin = tandem::testing::tandem_binary();
    pid_ = ::fork();
    if (pid_ == 0) {
      const int null = ::open("/dev/null", O_WRONLY);
      ::dup2(null, 1);
      ::dup2(null, 2);
      ::execl(bin.c_str(), bin.c_str(), "train", "--model", "tiny", "--layers", "1", "--dp", "1",
              "--tp", "1", "--steps", "1000000", "--eval-every", "0", "--executor", "plan",
              "--quiet", "--save", save.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~LongRun() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
};

// Waits (up to 60 s) until `path` holds `text`.
bool wait_for_content(const std::string& path, const std::string& text) {
  for (int i = 0; i < 600; ++i) {
    if (testing::read_bytes(path) == text) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

TEST(SaveFolderLock, ASecondWriterIsRefusedNamingTheHolder) {
  ScratchDir dir;
  const std::string save = dir.path("ck");
  {
    LongRun holder(save);
    ASSERT_GT(holder.pid(), 0);
    const std::string lock = save + "/.tandem-lock";
    ASSERT_TRUE(wait_for_content(lock, std::to_string(holder.pid()) + "\n"));
    TrainConfig c = testing::tiny_run(1);
    c.save_dir = save;
    EXPECT_EQ(user_error_of([&] { train(c); }),
              "--save '" + save + "' is being written by another tandem run (pid " +
                  std::to_string(holder.pid()) + ", which holds '" + lock +
                  "'): two runs writing one folder would remove each other's checkpoints; give "
                  "this run another --save folder, or wait for that run to end");
    // The refused run touched nothing of the holder's.
    EXPECT_EQ(testing::read_bytes(lock), std::to_string(holder.pid()) + "\n");
  }
  // The holder was killed (its lock file left behind): the lock went with the process, so the
  // next run takes it, and removes the file at its end.
  TrainConfig c = testing::tiny_run(1);
  c.save_dir = save;
  train(c);
  EXPECT_FALSE(fs::exists(save + "/.tandem-lock"));
  EXPECT_TRUE(fs::exists(save + "/latest"));
}

TEST(SaveFolderLock, OneRunResumingFromItsOwnFolderIsNotRefused) {
  ScratchDir dir;
  TrainConfig c = testing::tiny_run(1);
  c.save_dir = dir.path("ck");
  train(c);
  c.steps = 2;
  c.resume_dir = dir.path("ck");
  EXPECT_EQ(train(c).first_step, 1);
}

TEST(ThreadBackendUnderMpirun, IsWarnedAbout) {
  ::setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  TrainConfig c = testing::tiny_run(1);
  std::ostringstream out;
  c.out = &out;
  train(c);
  ::unsetenv("OMPI_COMM_WORLD_RANK");
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  EXPECT_THAT(out.str(), HasSubstr("tandem train: warning: this process is rank 1 of 2 started by "
                                   "an MPI launcher, but --backend thread runs all 1 ranks inside "
                                   "each process: the 2 processes train 2 separate copies; give "
                                   "--backend mpi to train one model across them\n"));
  std::ostringstream alone;
  c.out = &alone;
  train(c);
  EXPECT_THAT(alone.str(), ::testing::Not(HasSubstr("warning")));
}

// /dev/zero never ends: it is refused, not read until memory runs out; so is a pipe, without
// waiting for a writer.
TEST(EndlessInputs, DevicesAndPipesAreRefused) {
  ScratchDir dir;
  TrainConfig c = testing::tiny_run(1);
  c.data = "/dev/zero";
  EXPECT_EQ(user_error_of([&] { train(c); }),
            "data file '/dev/zero' is a character device, not a regular file: tandem reads the "
            "whole file into memory, so it takes files only (copy what you want to read into one)");
  const std::string fifo = dir.path("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  c.data = fifo;
  EXPECT_THAT(user_error_of([&] { train(c); }), HasSubstr("' is a pipe, not a regular file"));
  const auto r = tandem::testing::run_tandem("train --model tiny --steps 1 --data /dev/zero");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.output, HasSubstr("tandem: error: data file '/dev/zero' is a character device"));
}

TEST(RankLimits, ThreadRanksPastTheLimitAreRefused) {
  auto r = tandem::testing::run_tandem("tune adam --ranks 100000");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.output,
            "tandem: error: --ranks 100000: the thread backend runs at most 256 ranks, each a "
            "thread of this process (more only oversubscribe this machine and exhaust its "
            "memory); use --backend mpi for more\n");
  TrainConfig c = testing::tiny_run(1);
  c.batch = 512;
  c.grid = {512, 1, 1};
  EXPECT_EQ(user_error_of([&] { train(c); }),
            "--dp 512 x --tp 1 x --pp 1 is 512 ranks; the thread backend runs at most 256, each "
            "a thread of this process: use --backend mpi under mpirun for more");
  c.grid = {100000, 100000, 1};  // the product overflows an int
  EXPECT_THAT(user_error_of([&] { train(c); }), HasSubstr("is 10000000000 ranks"));
}

}  // namespace
}  // namespace tandem::train
