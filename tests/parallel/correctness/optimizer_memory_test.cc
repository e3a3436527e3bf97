// The data-parallel optimizer's memory: the state really is 1/dp per rank, nothing else is the
// size of the model, and the programs read and write the model's own buffers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "tandem/comm/thread.h"
#include "tandem/nn/gpt.h"
#include "tandem/parallel/optimizer.h"
#include "tandem/parallel/shard.h"

namespace tandem::parallel {
namespace {

// ZeRO-1 memory: with slice(m,v) each rank holds 1/dp of the moments, and the programs allocate
// neither gradients nor weights nor moments (they are bound at each run), only one segment's
// reduce-scatter result and scratch per segment shape, since segments of one shape share their
// programs; clipping also keeps every segment's reduced gradient (1/dp of the model) until the
// update.
TEST(DataParallelOptimizer, StateIsOneOverDpAndTheModelsBuffersAreBound) {
  nn::GPTConfig cfg;
  cfg.n_layers = 8;
  cfg.n_heads = 2;
  cfg.d_model = 32;
  cfg.seq_len = cfg.max_positions = 16;
  for (int dp : {1, 2, 3})
    for (const std::optional<double> clip : {std::optional<double>{}, std::optional<double>{1.0}}) {
      comm::run_ranks(dp, [&](comm::Communicator& c) {
        const ShardLayout layout(cfg, {dp, 1, 1}, 0, 0);
        const int64_t n = layout.size();
        ModelState state(layout, {});
        Tensor params = state.params(), grads = state.grads();
        OptimizerConfig oc;
        oc.bucket_mb = 0.02;
        oc.clip_grad_norm = clip;
        DataParallelOptimizer opt(oc, state, c, {{"fused(RS-C-AG)+slice(m,v)"}},
                                  exec::RunnerKind::Compiled);
        EXPECT_GT(opt.buckets(), 1);
        int64_t mine = 0;
        for (const ModelState::Piece& pc : state.pieces()) mine += pc.end - pc.begin;
        EXPECT_EQ(state.moment_bytes(), static_cast<size_t>(mine) * 8);
        // 1/dp of every segment, so within a float per segment of 8N/dp.
        EXPECT_LE(std::abs(static_cast<double>(mine) - static_cast<double>(n) / dp), opt.segments())
            << dp;
        // Nothing the size of the gradients or the weights: at most four segment shapes (the
        // blocks' buckets, a smaller last bucket, the two other segments), each one segment's
        // 1/dp result plus scalars and scratch under a KiB.
        int64_t largest = 0;
        for (const ModelState::Piece& pc : state.pieces())
          largest = std::max(largest, pc.end - pc.begin);
        const size_t programs = 4 * (static_cast<size_t>(largest) * 4 + 1024);
        EXPECT_LT(programs, static_cast<size_t>(mine) * 4) << "too few buckets to tell";
        EXPECT_LE(opt.buffer_bytes(), programs + (clip ? static_cast<size_t>(mine) * 4 : 0)) << dp;
        // The update lands in the model's own weights.
        grads.fill(1.0f);
        opt.step(0.1, 1);
        EXPECT_NE(params.get(0), 0.0f);
        EXPECT_NE(params.get(n - 1), 0.0f);
        EXPECT_EQ(opt.grad_norm().has_value(), clip.has_value());
      });
    }
}

}  // namespace
}  // namespace tandem::parallel
