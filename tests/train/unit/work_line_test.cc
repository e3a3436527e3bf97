// The start-up line of the step's work: the performance model's FLOP formulas (perf/flops.h),
// which the benchmark scripts read instead of writing their own.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>

#include "tandem/perf/flops.h"
#include "tandem/train/trainer.h"
#include "train/test_util.h"

namespace tandem::train {
namespace {

TEST(WorkLine, IsThePerformanceModelsFlops) {
  TrainConfig c = testing::tiny_run(1);
  c.model.arch = nn::Arch::Llama;  // a Llama block's own matmuls (grouped keys, SwiGLU)
  c.model.kv_heads = 1;
  std::ostringstream out;
  c.out = &out;
  train(c);
  const nn::GPTConfig& m = c.model;
  const double token = perf::step_flops_per_token(m, m.seq_len);
  EXPECT_THAT(out.str(),
              ::testing::HasSubstr(fmt::format(
                  "\n  work: {:.4e} FLOP a token, {:.4e} a step (the matmuls, forward and "
                  "backward, no recomputation)\n",
                  token, token * c.batch * m.seq_len)));
}

}  // namespace
}  // namespace tandem::train
