// --cp 2 under a real mpirun: two processes split each sequence, the keys and values gathered and
// their gradients summed by MPI (or passed round the ring), with the same losses, bitwise, as the
// same run on the thread backend (every reduction is over 2 ranks, whose f32 sum is the same in
// either order, and the gather and the shifts move bytes), and with MPI_THREAD_SERIALIZED as with
// MPI_THREAD_MULTIPLE; and a grid that needs more processes than mpirun started is refused naming
// both counts.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "support/cli.h"
#include "support/scratch.h"

namespace tandem::train {
namespace context_parallel_mpirun_test {

using tandem::testing::ScratchDir;
using ::testing::HasSubstr;

std::string mpirun(int np) {
  return fmt::format("{} -np {}", tandem::testing::mpirun_command(120), np);
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

// MPI initialised with MPI_THREAD_SERIALIZED (TANDEM_MPI_THREADS=serialized): the ring's and the
// overlapped order's exchanges run on the calling thread (the data-parallel exchange's thread
// could call MPI beside them), and the data-parallel exchange runs after the backward (the
// backward communicates); the same losses, bitwise, as with MPI_THREAD_MULTIPLE, where both run
// on their threads (the same exchanges at the same points, on other threads).
TEST(ContextParallelMpirun, SerializedMpiRunsTheExchangesOnTheCallingThreadWithTheSameLosses) {
  for (const char* order : {"ring", "overlap"}) {
    SCOPED_TRACE(order);
    ScratchDir dir;
    const auto train = [&](const char* threads) {
      const std::string metrics = dir.path(std::string(threads) + ".jsonl");
      const auto r = tandem::testing::run_command(
          fmt::format("TANDEM_MPI_THREADS={} TANDEM_CP_ORDER={} {} {} {} --backend mpi "
                      "--metrics {}",
                      threads, order, mpirun(2), tandem::testing::tandem_binary(), kRun, metrics));
      return std::pair{r, tandem::testing::logged_losses(metrics)};
    };
    const auto [multiple, multiple_losses] = train("multiple");
    const auto [serialized, serialized_losses] = train("serialized");
    ASSERT_EQ(multiple.status, 0) << multiple.output;
    ASSERT_EQ(serialized.status, 0) << serialized.output;
    const std::string name = order == std::string("ring") ? "ring" : "overlapped";
    EXPECT_THAT(multiple.output, HasSubstr(fmt::format("context parallelism ({} order)", name)));
    EXPECT_THAT(multiple.output, HasSubstr("overlapped with the backward"));
    EXPECT_THAT(serialized.output,
                HasSubstr(fmt::format(
                    "context parallelism ({} order, the exchanges on the calling thread)", name)));
    EXPECT_THAT(serialized.output,
                HasSubstr("after the backward (this MPI's thread level cannot overlap it)"));
    ASSERT_EQ(multiple_losses.size(), 3u) << multiple.output;
    EXPECT_EQ(serialized_losses, multiple_losses);
  }
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
