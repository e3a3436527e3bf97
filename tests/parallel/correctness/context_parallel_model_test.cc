// ParallelGPT with its sequences split over a context-parallel group against the whole model run
// by nn: GPT-2 (learned positions) and Llama (rotary positions, grouped-query heads), alone and
// with tensor parallelism inside each context-parallel rank. The mean of the ranks' losses is
// the whole model's loss, and the mean of the ranks' gradients (what the data-parallel exchange
// over dp x cp computes) its gradient; and what context parallelism does not support is refused.
//
// Tolerance: as model_test's, 1e-4 of each tensor's largest gradient and 1e-5 of the loss (the
// ranks sum attention's keys and the weights' products in other orders).
#include <gtest/gtest.h>

#include <mutex>

#include "parallel/parallel_test_util.h"
#include "tandem/comm/thread.h"
#include "tandem/core/error.h"
#include "tandem/parallel/model.h"

namespace tandem::parallel {
namespace context_parallel_model_test {

using testing::close;
using testing::tiny_config;
using testing::tokens;

using testing::StepResult;
using testing::whole_model_step;

// cp x tp ranks: each context-parallel rank its tokens of every row (one micro-batch of B rows),
// a tensor-parallel grid of tp ranks inside it; the attention's exchanges in `order`.
StepResult context_parallel_step(const nn::GPTConfig& c, int cp, int tp,
                                 const std::vector<int32_t>& in, const std::vector<int32_t>& tg,
                                 int B, ContextOrder order = ContextOrder::Overlapped) {
  nn::ParameterSet whole(c);
  nn::gpt_init(whole, 7);
  // Each cp rank's gradient, its tp ranks' shards deposited together (the replicated tensors
  // alike on every tp rank), and its loss.
  std::vector<std::vector<float>> grads(static_cast<size_t>(cp),
                                        std::vector<float>(static_cast<size_t>(whole.size())));
  std::vector<double> losses(static_cast<size_t>(cp));
  std::mutex mu;
  comm::run_ranks(cp * tp, [&](comm::Communicator& world) {
    // Ranks tp apart hold the same heads of different tokens.
    const int cp_rank = world.rank() / tp, tp_rank = world.rank() % tp;
    std::unique_ptr<comm::Communicator> cp_group = world.split(tp_rank, cp_rank);
    std::unique_ptr<comm::Communicator> tp_world = world.split(cp_rank, tp_rank);
    Grid grid(*tp_world, GridShape{1, tp, 1});
    const ContextSplit split(c.seq_len, cp, cp_rank);
    const int Tl = split.tokens();
    ProgramOptions o;
    o.context_group = cp_group.get();
    o.executor = exec::RunnerKind::Reference;
    o.context_schedules.order = order;
    ParallelGPT model(c, grid, B, Tl, 1, o);
    model.layout().extract(whole.flat().data_as<float>(), model.params().data_as<float>());
    std::vector<int32_t> mine_in, mine_tg;
    for (int b = 0; b < B; ++b)
      for (int t : split.positions()) {
        mine_in.push_back(in[static_cast<size_t>(b) * c.seq_len + t]);
        mine_tg.push_back(tg[static_cast<size_t>(b) * c.seq_len + t]);
      }
    const double loss = model.forward_backward({{mine_in.data(), mine_tg.data(), B, Tl, 0}}, 5, 3);
    std::lock_guard<std::mutex> lock(mu);
    model.layout().deposit(model.grads().data_as<float>(), 0, model.layout().size(),
                           grads[static_cast<size_t>(cp_rank)].data());
    if (tp_rank == 0) losses[static_cast<size_t>(cp_rank)] = loss;
  });
  StepResult r;
  r.grads.assign(static_cast<size_t>(whole.size()), 0.0f);
  for (int k = 0; k < cp; ++k) {
    r.loss += losses[static_cast<size_t>(k)] / cp;
    for (size_t i = 0; i < r.grads.size(); ++i)
      r.grads[i] += grads[static_cast<size_t>(k)][i] / static_cast<float>(cp);
  }
  return r;
}

void expect_match(const nn::GPTConfig& c, const StepResult& got, const StepResult& want,
                  const std::string& what) {
  EXPECT_NEAR(got.loss, want.loss, 1e-5 * std::max(1.0, std::fabs(want.loss))) << what;
  auto part = [](const std::vector<float>& v, const nn::ParamSpec& s) {
    const auto first = v.begin() + static_cast<std::ptrdiff_t>(s.offset);
    return std::vector<float>(first, first + static_cast<std::ptrdiff_t>(s.numel()));
  };
  for (const nn::ParamSpec& s : nn::gpt_parameter_specs(c))
    EXPECT_TRUE(close(what + " d" + s.name, part(got.grads, s), part(want.grads, s), 1e-4, 1e-7));
}

nn::GPTConfig llama_config() {
  nn::GPTConfig c = tiny_config(2, 4, 16, 16);
  c.arch = nn::Arch::Llama;
  c.kv_heads = 2;
  c.ffn = 24;
  return c;
}

TEST(ContextParallelModel, LossAndGradientsMatchTheWholeModel) {
  const int B = 2;
  for (const nn::GPTConfig& c : {tiny_config(2, 2, 16, 16), llama_config()}) {
    const std::vector<int32_t> in = tokens(static_cast<size_t>(B) * c.seq_len, 1);
    const std::vector<int32_t> tg = tokens(static_cast<size_t>(B) * c.seq_len, 2);
    const StepResult want = whole_model_step(c, in, tg, B, 5, 3);
    for (int cp : {1, 2, 4}) {
      const std::string what =
          std::string(c.llama() ? "llama" : "gpt-2") + " cp " + std::to_string(cp);
      expect_match(c, context_parallel_step(c, cp, 1, in, tg, B), want, what);
    }
    expect_match(c, context_parallel_step(c, 2, 2, in, tg, B), want, "cp 2 x tp 2");
    expect_match(c, context_parallel_step(c, 2, 1, in, tg, B, ContextOrder::Sequential), want,
                 "cp 2, sequential");
  }
}

TEST(ContextParallelModel, WhatItDoesNotSupportIsRefused) {
  const auto message = [](nn::GPTConfig c, int T) {
    std::string m = "no error";
    comm::run_ranks(2, [&](comm::Communicator& world) {
      std::unique_ptr<comm::Communicator> solo = world.split(world.rank(), 0);
      Grid grid(*solo, GridShape{});
      ProgramOptions o;
      o.context_group = &world;
      o.executor = exec::RunnerKind::Reference;
      try {
        ParallelGPT model(c, grid, 1, T, 1, o);
      } catch (const UserError& e) {
        if (world.rank() == 0) m = e.what();
      }
    });
    return m;
  };
  nn::GPTConfig c = tiny_config(1, 2, 16, 16);
  EXPECT_EQ(message(c, 8), "no error");
  EXPECT_EQ(message(c, 16),
            "sequence length 32 (16 tokens on each of 2 context-parallel ranks) is outside [1, "
            "16]");
  EXPECT_EQ(message(c, 3),
            "context parallelism over 2 ranks cuts a sequence into 4 equal chunks (two a rank), "
            "which 6 tokens are not: the sequence length must be a multiple of 4");
  c.dropout = 0.1f;
  EXPECT_EQ(message(c, 8),
            "context parallelism does not support dropout yet (the model's is 0.1): its residual "
            "and embedding masks would be drawn by this rank's token index, not the sequence's");
  c.dropout = 0.0f;
  c.attention = nn::AttentionKernel::Unfused;
  EXPECT_EQ(message(c, 8),
            "context parallelism runs the fused attention kernel, not the unfused one");
}

}  // namespace context_parallel_model_test
}  // namespace tandem::parallel
