// Data-parallel training over MPI processes (mpirun -np 2 and 3): the loss curve and the final
// weights match a single-rank run of the same global batch and seed, which every process also
// computes on its own with the thread backend.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <sstream>

#include "tandem/comm/mpi.h"
#include "tandem/train/trainer.h"

namespace tandem::train {
namespace {

TrainConfig tiny(int dp) {
  TrainConfig c;
  c.model.n_layers = 2;
  c.model.n_heads = 2;
  c.model.d_model = 16;
  c.model.seq_len = 16;
  c.model.max_positions = 16;
  c.batch = 6;  // splits over 2 and over 3 ranks
  c.steps = 4;
  c.lr = 1e-2;
  c.warmup = 2;
  c.seed = 3;
  c.grid = {dp, 1, 1};
  c.synthetic_bytes = 1 << 15;
  c.eval_every = 0;
  c.progress = false;
  c.keep_weights = true;
  c.blas_threads = 1;
  static std::ostringstream sink;
  c.out = &sink;
  return c;
}

// Tolerance as in the thread-backend equivalence tests (tests/train/correctness): losses to
// 2e-4, weights within 1% of the distance training moved them.
TEST(TrainerMpi, DataParallelOverProcessesMatchesOneRank) {
  std::unique_ptr<comm::Communicator> world = comm::mpi_wrap(MPI_COMM_WORLD);
  TrainConfig c = tiny(world->size());
  c.backend = "mpi";
  const TrainResult got = train_rank(*world, c, nullptr);
  EXPECT_EQ(got.optimizer_schedule, "fused(RS-C-AG)+slice(m,v)");

  TrainConfig one = tiny(1);
  const TrainResult want = train(one);
  TrainConfig zero = tiny(1);
  zero.steps = 0;
  const std::vector<float> w0 = train(zero).weights;

  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i) EXPECT_NEAR(got.losses[i], want.losses[i], 2e-4) << i;
  if (world->rank() == 0) {
    ASSERT_EQ(got.weights.size(), want.weights.size());
    double diff = 0, moved = 0;
    for (size_t i = 0; i < want.weights.size(); ++i) {
      diff += std::pow(static_cast<double>(got.weights[i]) - want.weights[i], 2);
      moved += std::pow(static_cast<double>(want.weights[i]) - w0[i], 2);
    }
    EXPECT_LT(std::sqrt(diff / moved), 1e-2);
  }
}

}  // namespace
}  // namespace tandem::train
