// The data-parallel exchange overlapped with the backward under a real mpirun, on a grid whose
// backward communicates too (dp 2 x tp 2: the communication thread and the main thread both call
// MPI, which MPI_THREAD_MULTIPLE allows): the same losses, bitwise, as the exchange after the
// backward, and the start-up line says the exchange overlapped; the model state sharded over the
// data-parallel ranks (--shard weights: gathers on the communication thread too) trains the same
// losses; under MPI_THREAD_SERIALIZED the exchange overlaps only where the backward does not
// communicate.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "support/cli.h"
#include "support/scratch.h"

namespace tandem::train {
namespace {

using tandem::testing::ScratchDir;
using ::testing::HasSubstr;

struct JobRun {
  tandem::testing::CommandResult result;
  std::vector<std::string> losses;  // each step's "loss" field, as written
};

// mpirun starting `np` processes of tandem, as root too, killed after 2 minutes.
std::string mpirun_tandem(int np) {
  return fmt::format("{} -np {} {}", tandem::testing::mpirun_command(120), np,
                     tandem::testing::tandem_binary());
}

JobRun train_4_processes(const ScratchDir& dir, const std::string& exchange,
                         const std::string& shard = "moments") {
  const std::string metrics = dir.path("metrics-" + exchange + "-" + shard + ".jsonl");
  JobRun r;
  r.result = tandem::testing::run_command(fmt::format(
      "{} train --backend mpi --model tiny --dp 2 --tp 2 --steps 4 --eval-every 0 --threads 1 "
      "--bucket-mb 0.05 --grad-exchange {} --shard {} --metrics {}",
      mpirun_tandem(4), exchange, shard, metrics));
  r.losses = tandem::testing::logged_losses(metrics);
  return r;
}

TEST(ExchangeMpirun, OverlappedBesideTensorParallelMatchesAfterTheBackward) {
  ScratchDir dir;
  const JobRun after = train_4_processes(dir, "after");
  const JobRun overlap = train_4_processes(dir, "overlap");
  ASSERT_EQ(after.result.status, 0) << after.result.output;
  ASSERT_EQ(overlap.result.status, 0) << overlap.result.output;
  EXPECT_THAT(overlap.result.output, HasSubstr("overlapped with the backward"));
  ASSERT_EQ(after.losses.size(), 4u) << after.result.output;
  EXPECT_EQ(overlap.losses, after.losses);
}

TEST(ExchangeMpirun, ShardedWeightsTrainTheSameLosses) {
  ScratchDir dir;
  const JobRun unsharded = train_4_processes(dir, "overlap");
  const JobRun sharded = train_4_processes(dir, "overlap", "weights");
  ASSERT_EQ(sharded.result.status, 0) << sharded.result.output;
  EXPECT_THAT(sharded.result.output, HasSubstr("sharded over the 2 data-parallel ranks"));
  ASSERT_EQ(unsharded.losses.size(), 4u) << unsharded.result.output;
  EXPECT_EQ(sharded.losses, unsharded.losses);
}

// MPI initialised with MPI_THREAD_SERIALIZED (TANDEM_MPI_THREADS=serialized) on a grid whose
// backward does not communicate (dp 2 alone): the exchange still overlaps the backward (its
// thread is the only one calling MPI meanwhile), with the same losses, bitwise, as under
// MPI_THREAD_MULTIPLE; beside tensor parallelism it runs after the backward, the same losses
// again.
TEST(ExchangeMpirun, SerializedMpiOverlapsOnlyWhereTheBackwardDoesNotCommunicate) {
  ScratchDir dir;
  const auto train = [&](const char* threads, int tp) {
    const std::string metrics = dir.path(fmt::format("{}-tp{}.jsonl", threads, tp));
    JobRun r;
    r.result = tandem::testing::run_command(fmt::format(
        "TANDEM_MPI_THREADS={} {} train --backend mpi --model tiny --dp 2 --tp {} --steps 3 "
        "--eval-every 0 --threads 1 --bucket-mb 0.05 --metrics {}",
        threads, mpirun_tandem(2 * tp), tp, metrics));
    r.losses = tandem::testing::logged_losses(metrics);
    return r;
  };
  for (int tp : {1, 2}) {
    SCOPED_TRACE(fmt::format("dp 2 tp {}", tp));
    const JobRun multiple = train("multiple", tp);
    const JobRun serialized = train("serialized", tp);
    ASSERT_EQ(multiple.result.status, 0) << multiple.result.output;
    ASSERT_EQ(serialized.result.status, 0) << serialized.result.output;
    EXPECT_THAT(multiple.result.output, HasSubstr("overlapped with the backward"));
    EXPECT_THAT(serialized.result.output,
                HasSubstr(tp == 1 ? "overlapped with the backward"
                                  : "after the backward (this MPI's thread level cannot overlap "
                                    "it)"));
    ASSERT_EQ(multiple.losses.size(), 3u) << multiple.result.output;
    EXPECT_EQ(serialized.losses, multiple.losses);
  }
}

}  // namespace
}  // namespace tandem::train
