// LAMB in buckets (DataParallelOptimizer: one lamb_bucket program per bucket, its tensors as
// segments) against LAMB per tensor (one `lamb` program per local tensor, same schedule): bitwise
// on one rank, and on 2 and 3 ranks every weight within 1e-7 of its tensor's norm after three
// steps (the bound's derivation: exec/correctness/lamb_bucket_test.cc), with and without
// clipping's update; and LAMB runs as many programs as AdamW.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "tandem/comm/thread.h"
#include "tandem/dsl/workloads.h"
#include "tandem/nn/gpt.h"
#include "tandem/parallel/optimizer.h"
#include "tandem/parallel/program_runner.h"
#include "tandem/parallel/shard.h"

namespace tandem::parallel {
namespace {

constexpr int kSteps = 3;
constexpr double kLr = 0.01;

nn::GPTConfig small_model() {
  nn::GPTConfig cfg;
  cfg.n_layers = 3;
  cfg.n_heads = 2;
  cfg.d_model = 32;
  cfg.seq_len = cfg.max_positions = 16;
  return cfg;
}

float weight_at(int64_t i) {
  return static_cast<float>(0.3 * std::sin(0.37 * static_cast<double>(i) + 0.1));
}
float grad_at(int rank, int step, int64_t i) {
  return static_cast<float>(0.05 *
                            std::cos(0.71 * static_cast<double>(i) + 1.3 * rank + 0.5 * step));
}

OptimizerConfig lamb_config() {
  OptimizerConfig oc;
  oc.kind = OptimizerKind::Lamb;
  oc.weight_decay = 0.01;
  oc.bucket_mb = 0.02;  // a block a bucket or so: several buckets of many tensors
  return oc;
}

// The weights after kSteps of the bucketed optimizer (rank 0's: every rank holds the same).
std::vector<float> bucketed(int dp, std::optional<double> clip) {
  std::vector<float> out;
  comm::run_ranks(dp, [&](comm::Communicator& c) {
    const ShardLayout layout(small_model(), {dp, 1, 1}, 0, 0);
    const int64_t n = layout.size();
    ModelState state(layout, {});
    Tensor params = state.params(), grads = state.grads();
    for (int64_t i = 0; i < n; ++i) params.set(i, weight_at(i));
    OptimizerConfig oc = lamb_config();
    oc.clip_grad_norm = clip;
    DataParallelOptimizer opt(oc, state, c, {}, exec::RunnerKind::Compiled);
    for (int step = 1; step <= kSteps; ++step) {
      for (int64_t i = 0; i < n; ++i) grads.set(i, grad_at(c.rank(), step, i));
      opt.step(kLr, step);
    }
    if (c.rank() == 0) out.assign(params.data_as<float>(), params.data_as<float>() + n);
  });
  return out;
}

// The same steps with the per-tensor programs, as the optimizer ran them before buckets: lamb per
// tensor under ZeRO-1 (unclipped), or grad_reduce then lamb_update per tensor (clip: the factor
// the bucketed run's norm gives, passed in, since only the updates are compared).
std::vector<float> per_tensor(int dp, std::optional<double> clip_factor) {
  std::vector<float> out;
  const DType g = DType::F32;
  const std::vector<std::string> zero1 = {"fused(RS-C-AG)+slice(m,v)"};
  ProgramRunner one(dsl::workloads::lamb(g), zero1, exec::RunnerKind::Compiled);
  ProgramRunner reduce(dsl::workloads::grad_reduce(g), {"C"}, exec::RunnerKind::Compiled);
  ProgramRunner update(dsl::workloads::lamb_update(g), {"fused(C)"}, exec::RunnerKind::Compiled);
  comm::run_ranks(dp, [&](comm::Communicator& c) {
    const ShardLayout layout(small_model(), {dp, 1, 1}, 0, 0);
    const int64_t n = layout.size();
    Tensor params = Tensor::zeros(DType::F32, Shape{n}),
           grads = Tensor::zeros(DType::F32, Shape{n});
    for (int64_t i = 0; i < n; ++i) params.set(i, weight_at(i));
    struct Tensor1 {
      std::unique_ptr<exec::Runner> step, reduce;
    };
    std::vector<Tensor1> runs;
    for (const LocalTensor& lt : layout.tensors()) {
      const dsl::SymbolMap symbols{{"N", lt.numel()}};
      Tensor1 t;
      if (clip_factor) {
        t.reduce = reduce.prepare(c, symbols, {"g"});
        t.reduce->bind("g", grads.flat_slice(lt.local_offset, lt.numel()));
        t.step = update.prepare(c, symbols, {"w", "g_sum"});
        t.step->bind("g_sum", t.reduce->output("g_sum"));
      } else {
        t.step = one.prepare(c, symbols, {"w", "g"});
        t.step->bind("g", grads.flat_slice(lt.local_offset, lt.numel()));
      }
      t.step->bind("w", params.flat_slice(lt.local_offset, lt.numel()));
      t.step->input("m").fill(0.0f);
      t.step->input("v").fill(0.0f);
      runs.push_back(std::move(t));
    }
    const OptimizerConfig oc = lamb_config();
    for (int step = 1; step <= kSteps; ++step) {
      for (int64_t i = 0; i < n; ++i) grads.set(i, grad_at(c.rank(), step, i));
      for (Tensor1& t : runs) {
        if (t.reduce) t.reduce->run();
        exec::Runner& r = *t.step;
        r.set_scalar("lr", kLr);
        r.set_scalar("beta1", oc.beta1);
        r.set_scalar("beta2", oc.beta2);
        r.set_scalar("eps", oc.eps);
        r.set_scalar("weight_decay", oc.weight_decay);
        r.set_scalar("step", step);
        r.set_scalar("grad_scale", 1.0 / dp);
        if (clip_factor) r.set_scalar("clip", *clip_factor);
        r.run();
      }
    }
    if (c.rank() == 0) out.assign(params.data_as<float>(), params.data_as<float>() + n);
  });
  return out;
}

// The largest |a - b| over a tensor's elements, relative to that tensor's L2 norm in b.
double max_normwise_error(const std::vector<float>& a, const std::vector<float>& b,
                          const ShardLayout& layout) {
  double worst = 0;
  for (const LocalTensor& lt : layout.tensors()) {
    double norm = 0, diff = 0;
    for (int64_t i = lt.local_offset; i < lt.local_offset + lt.numel(); ++i) {
      const size_t k = static_cast<size_t>(i);
      norm += static_cast<double>(b[k]) * b[k];
      diff = std::max(diff, std::abs(static_cast<double>(a[k]) - b[k]));
    }
    worst = std::max(worst, diff / std::sqrt(norm));
  }
  return worst;
}

TEST(LambBuckets, EqualPerTensorLambBitwiseOnOneRankAndWithinTheBoundOnMore) {
  for (int dp : {1, 2, 3})
    for (const bool clipped : {false, true}) {
      // A clip limit far above the gradient's norm: clip = 1 exactly, in both runs.
      const std::vector<float> got =
          bucketed(dp, clipped ? std::optional<double>{1e6} : std::nullopt);
      const std::vector<float> want =
          per_tensor(dp, clipped ? std::optional<double>{1.0} : std::nullopt);
      ASSERT_EQ(got.size(), want.size());
      if (dp == 1) {
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
            << "clipped " << clipped;
        continue;
      }
      const ShardLayout layout(small_model(), {dp, 1, 1}, 0, 0);
      EXPECT_LE(max_normwise_error(got, want, layout), 1e-7)
          << "dp " << dp << ", clipped " << clipped;
    }
}

TEST(LambBuckets, AsManyProgramsAsAdamW) {
  comm::run_ranks(2, [&](comm::Communicator& c) {
    const ShardLayout layout(small_model(), {2, 1, 1}, 0, 0);
    ModelState for_lamb(layout, {}), for_adam(layout, {});
    OptimizerConfig lamb = lamb_config(), adam = lamb_config();
    adam.kind = OptimizerKind::AdamW;
    const DataParallelOptimizer l(lamb, for_lamb, c, {}, exec::RunnerKind::Plan);
    const DataParallelOptimizer a(adam, for_adam, c, {}, exec::RunnerKind::Plan);
    EXPECT_EQ(l.segments(), a.segments());
    EXPECT_EQ(l.buckets(), a.buckets());
    EXPECT_GT(l.buckets(), 1);
    EXPECT_EQ(l.tensors(), static_cast<int>(layout.tensors().size()));
    EXPECT_LT(l.segments(), l.tensors());
  });
}

}  // namespace
}  // namespace tandem::parallel
