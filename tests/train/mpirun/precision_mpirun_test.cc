// bf16 training with the tensor-parallel exchanges in bf16 (--precision bf16 --tp-dtype bf16) on
// the 2x2x2 grid under a real mpirun: the same losses, bitwise, as the same run on the thread
// backend. Both sum each tensor-parallel pair's bf16 partials in f32 and round once (the thread
// backend's direct algorithm, and a ring of 2), and every other reduction is over 2 ranks too, so
// the order of every floating-point operation is the same; the start-up line says what the
// exchanges carried.
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

struct GridRun {
  tandem::testing::CommandResult result;
  std::vector<std::string> losses;  // each step's "loss" field, as written
};

// `tandem train` on the 2x2x2 grid in bf16 with bf16 tensor-parallel exchanges; `launch` is the
// mpirun prefix ("" for the thread backend).
GridRun train_grid(const ScratchDir& dir, const std::string& name, const std::string& launch,
                   const std::string& backend) {
  const std::string metrics = dir.path("metrics-" + name + ".jsonl");
  GridRun r;
  r.result = tandem::testing::run_command(fmt::format(
      "{} {} train --backend {} --model tiny --dp 2 --tp 2 --pp 2 --steps 3 --eval-every 0 "
      "--threads 1 --precision bf16 --tp-dtype bf16 --metrics {}",
      launch, tandem::testing::tandem_binary(), backend, metrics));
  r.losses = tandem::testing::logged_losses(metrics);
  return r;
}

TEST(PrecisionMpirun, Bf16TensorParallelExchangesOnTheGridMatchTheThreadBackend) {
  ScratchDir dir;
  const GridRun mpi =
      train_grid(dir, "mpi", fmt::format("{} -np 8", tandem::testing::mpirun_command(180)), "mpi");
  const GridRun threads = train_grid(dir, "thread", "", "thread");
  ASSERT_EQ(mpi.result.status, 0) << mpi.result.output;
  ASSERT_EQ(threads.result.status, 0) << threads.result.output;
  EXPECT_THAT(mpi.result.output, HasSubstr("--tp-dtype bf16"));
  ASSERT_EQ(threads.losses.size(), 3u) << threads.result.output;
  EXPECT_EQ(mpi.losses, threads.losses);
}

}  // namespace
}  // namespace tandem::train
