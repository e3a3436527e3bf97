// --cp 2 under a real mpirun: two processes split each sequence, the keys and values gathered and
// their gradients summed by MPI (or passed round the ring), with the same losses, bitwise, as the
// same run on the thread backend (every reduction is over 2 ranks, whose f32 sum is the same in
// either order, and the gather and the shifts move bytes); and a grid that needs more processes
// than mpirun started is refused naming both counts.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "support/cli.h"
#include "support/scratch.h"

namespace tandem::train {
namespace context_parallel_mpirun_test {

using tandem::testing::ScratchDir;
using ::testing::HasSubstr;

std::string mpirun(int np) {
  const char* bin = std::getenv("TANDEM_MPIRUN");
  return fmt::format(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout -s KILL 120 {} -np {} "
      "--oversubscribe",
      bin != nullptr ? bin : "mpirun", np);
}

constexpr const char* kRun =
    "train --model tiny --dp 1 --tp 1 --cp 2 --seq-len 32 --steps 3 --eval-every 0 --threads 1";

TEST(ContextParallelMpirun, TwoProcessesTrainAsTheThreadBackend) {
  ScratchDir dir;
  const std::string mpi_metrics = dir.path("mpi.jsonl"), thread_metrics = dir.path("thread.jsonl");
  const auto mpi = tandem::testing::run_command(
      fmt::format("{} {} {} --backend mpi --metrics {}", mpirun(2),
                  tandem::testing::tandem_binary(), kRun, mpi_metrics));
  const auto threads = tandem::testing::run_tandem(
      fmt::format("{} --backend thread --metrics {}", kRun, thread_metrics));
  ASSERT_EQ(mpi.status, 0) << mpi.output;
  ASSERT_EQ(threads.status, 0) << threads.output;
  EXPECT_THAT(mpi.output, HasSubstr("dp=1 tp=1 pp=1 cp=2, mpi backend"));
  const std::vector<std::string> losses = tandem::testing::logged_losses(thread_metrics);
  ASSERT_EQ(losses.size(), 3u) << threads.output;
  EXPECT_EQ(tandem::testing::logged_losses(mpi_metrics), losses);
}

// The ring order (TANDEM_CP_ORDER=ring): the pieces passed round by MPI's point-to-point shifts,
// on the communication thread or, without MPI_THREAD_MULTIPLE, on the calling one; the same
// losses as the thread backend's ring, bitwise (the shifts move bytes, the products and merges
// are the same on either backend).
TEST(ContextParallelMpirun, TheRingTrainsAsOnTheThreadBackend) {
  ScratchDir dir;
  const std::string mpi_metrics = dir.path("mpi.jsonl"), thread_metrics = dir.path("thread.jsonl");
  const auto mpi = tandem::testing::run_command(
      fmt::format("TANDEM_CP_ORDER=ring {} {} {} --backend mpi --metrics {}", mpirun(2),
                  tandem::testing::tandem_binary(), kRun, mpi_metrics));
  const auto threads = tandem::testing::run_command(
      fmt::format("TANDEM_CP_ORDER=ring '{}' {} --backend thread --metrics {}",
                  tandem::testing::tandem_binary(), kRun, thread_metrics));
  ASSERT_EQ(mpi.status, 0) << mpi.output;
  ASSERT_EQ(threads.status, 0) << threads.output;
  EXPECT_THAT(mpi.output, HasSubstr("context parallelism (ring order"));
  EXPECT_THAT(threads.output, HasSubstr("context parallelism (ring order)"));
  const std::vector<std::string> losses = tandem::testing::logged_losses(thread_metrics);
  ASSERT_EQ(losses.size(), 3u) << threads.output;
  EXPECT_EQ(tandem::testing::logged_losses(mpi_metrics), losses);
}

TEST(ContextParallelMpirun, AGridOfMoreRanksThanProcessesIsRefused) {
  const auto r = tandem::testing::run_command(
      fmt::format("{} {} train --backend mpi --model tiny --dp 1 --tp 1 --cp 4 --seq-len 32 "
                  "--steps 1 --eval-every 0 --threads 1",
                  mpirun(2), tandem::testing::tandem_binary()));
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.output, HasSubstr("--backend mpi: the grid dp=1 tp=1 pp=1 cp=4 needs 4 processes, "
                                  "but there are 2 (start it with mpirun -np 4)"));
}

}  // namespace context_parallel_mpirun_test
}  // namespace tandem::train
