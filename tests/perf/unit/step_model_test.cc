// The step-time model's composition at stated rates: an exchange shorter than the backward is
// hidden and a longer one shows its excess, a pipeline of pp stages and M micro-batches stretches
// by (M + pp - 1) / M, the update and the other work add, ranks that outnumber their host's cores
// wait for them, and the FLOP formulas.
#include "tandem/perf/step_model.h"

#include <gtest/gtest.h>

#include "tandem/ooc/plan.h"
#include "tandem/ooc/planner.h"
#include "tandem/parallel/shard.h"
#include "tandem/perf/flops.h"

namespace tandem::perf {
namespace step_model_test {

StepShape shape(int dp, int tp, int pp, int micro_batches) {
  StepShape s;
  s.model.n_layers = 4;
  s.model.n_heads = 2;
  s.model.d_model = 32;
  s.model.seq_len = s.model.max_positions = 16;
  s.grid = {dp, tp, pp};
  s.micro_batches = micro_batches;
  s.batch = 4 * dp * micro_batches;
  return s;
}

Rates rates() {
  Rates r;
  for (int tp : {1, 2}) r.gemm_flops_per_s[tp] = 1e9;
  r.link_bytes_per_s = 1e9;
  r.link_latency_s = 1e-5;
  r.swap_tier = {1e9, 1e9};
  r.state_tier = {1e9, 1e9};
  return r;
}

// Every stage's in-core timeline, then the composition.
StepBreakdown predict(const StepShape& s, const Rates& r, std::vector<StageTimes>* out = nullptr) {
  std::vector<StageTimes> stages;
  std::vector<ooc::Prediction> timelines;
  for (int i = 0; i < s.grid.pp; ++i) {
    stages.push_back(stage_times(s, i, r));
    timelines.push_back(ooc::predict(stages.back().chain, ooc::keep_all(stages.back().chain.units),
                                     stages.back().profile));
  }
  if (out) *out = stages;
  return compose(s, stages, timelines, r);
}

TEST(StepModel, OneRankIsItsComputeAlone) {
  const StepShape s = shape(1, 1, 1, 1);
  std::vector<StageTimes> st;
  const StepBreakdown b = predict(s, rates(), &st);
  EXPECT_DOUBLE_EQ(b.compute, st[0].profile.compute_s());
  EXPECT_EQ(b.exposed_exchange, 0);
  EXPECT_EQ(b.exposed_io, 0);
  EXPECT_EQ(b.bubble, 0);
  EXPECT_EQ(b.update, 0);
  EXPECT_DOUBLE_EQ(b.total(), b.compute);
  // The matmul FLOPs at 1 GFLOP/s, the UnitFactors 1: a token's forward and backward.
  const double tokens = 4.0 * s.model.seq_len;
  EXPECT_NEAR(b.compute, tokens * step_flops_per_token(s.model, s.model.seq_len) / 1e9, 1e-12);
}

// A data-parallel exchange shorter than the last micro-batch's backward is hidden but for the
// embeddings' and ln_f's part; slowed past it, its excess shows.
TEST(StepModel, AnExchangeShorterThanTheBackwardIsHidden) {
  const StepShape s = shape(2, 1, 1, 1);
  std::vector<StageTimes> st;
  const StepBreakdown fast = predict(s, rates(), &st);
  ASSERT_LT(st[0].dp_blocks_s, st[0].backward_micro_s);
  EXPECT_DOUBLE_EQ(fast.exposed_exchange, st[0].dp_rest_s);
  Rates slow = rates();
  slow.link_bytes_per_s /= 1e4;
  const StepBreakdown b = predict(s, slow, &st);
  ASSERT_GT(st[0].dp_blocks_s, st[0].backward_micro_s);
  EXPECT_DOUBLE_EQ(b.exposed_exchange,
                   st[0].dp_blocks_s - st[0].backward_micro_s + st[0].dp_rest_s);
  // After the backward (--exchange after), nothing is hidden.
  StepShape after = s;
  after.overlap_exchange = false;
  const StepBreakdown a = predict(after, rates(), &st);
  EXPECT_DOUBLE_EQ(a.exposed_exchange, st[0].dp_blocks_s + st[0].dp_rest_s);
}

// 1F1B: the slowest stage's M micro-batches stretched by (M + pp - 1) / M.
TEST(StepModel, APipelineStretchesByItsBubble) {
  for (int M : {1, 2, 4}) {
    SCOPED_TRACE(M);
    const StepBreakdown b = predict(shape(1, 1, 2, M), rates());
    const double stage = b.compute + b.exposed_exchange + b.exposed_io;
    EXPECT_NEAR(b.bubble, stage * (2 - 1) / M, 1e-15);
    EXPECT_NEAR(b.total(), stage * (M + 2 - 1) / M, 1e-15);
  }
}

// The update adds: the rest's in full after the backward, the blocks' beyond what the backward
// leaves after their exchange.
TEST(StepModel, TheUpdateAndTheOtherWorkAdd) {
  const StepShape s = shape(1, 1, 1, 1);
  Rates r = rates();
  const StepBreakdown none = predict(s, r);
  r.update_params_per_s = 1e6;
  r.embedding_token_s = 1e-5;
  r.zero_floats_per_s = 1e8;
  std::vector<StageTimes> st;
  const StepBreakdown b = predict(s, r, &st);
  // dp 1: no exchange, so the blocks' update runs behind the backward.
  const double hidden = std::min(st[0].update_blocks_s, st[0].backward_micro_s);
  EXPECT_GT(st[0].update_rest_s, 0);
  EXPECT_DOUBLE_EQ(b.update, st[0].update_blocks_s - hidden + st[0].update_rest_s);
  EXPECT_GT(b.other, 0);
  EXPECT_DOUBLE_EQ(b.other, stage_other_s(s, 0, r));
  EXPECT_DOUBLE_EQ(b.total(), none.total() + b.update + b.other);
  // A rank of dp 2 updates half the parameters.
  const StepShape two = shape(2, 1, 1, 1);
  std::vector<StageTimes> st2;
  predict(two, r, &st2);
  EXPECT_DOUBLE_EQ(st2[0].update_rest_s, st[0].update_rest_s / 2);
}

// The other work: the embedding's forward and backward over the rank's tokens a step (the first
// stage's ranks), and the rank's gradients zeroed (the blocks' not, where they live apart); the
// busiest stage's adds to the step.
TEST(StepModel, TheOtherWorkIsTheEmbeddingsTokensAndTheZeroedGradients) {
  Rates r = rates();
  r.embedding_token_s = 1e-5;
  r.zero_floats_per_s = 1e8;
  const StepShape s = shape(1, 1, 1, 2);
  const double tokens = 2 * 4 * 16;  // 2 micro-batches of 4 rows
  const parallel::ShardLayout whole(s.model, s.grid, 0, 0);
  EXPECT_DOUBLE_EQ(stage_other_s(s, 0, r), tokens * 1e-5 + whole.size() / 1e8);
  // Twice the rows: twice the embedding's part.
  StepShape twice = s;
  twice.batch *= 2;
  EXPECT_DOUBLE_EQ(stage_other_s(twice, 0, r) - stage_other_s(s, 0, r), tokens * 1e-5);
  // The blocks in a store: their gradients' sums start there, only the rest is zeroed.
  StepShape streamed = s;
  streamed.state_streamed = true;
  const auto [first, end] = whole.blocks_range();
  EXPECT_DOUBLE_EQ(stage_other_s(streamed, 0, r),
                   tokens * 1e-5 + static_cast<double>(whole.size() - (end - first)) / 1e8);
  // A pipeline: the last stage has no embedding; the step adds the busiest stage's, the first.
  const StepShape pipe = shape(1, 1, 2, 2);
  const parallel::ShardLayout last(pipe.model, pipe.grid, 0, 1);
  EXPECT_DOUBLE_EQ(stage_other_s(pipe, 1, r), last.size() / 1e8);
  std::vector<StageTimes> st;
  const StepBreakdown none = predict(pipe, rates()), b = predict(pipe, r, &st);
  EXPECT_DOUBLE_EQ(st[1].other_s, stage_other_s(pipe, 1, r));
  EXPECT_GT(st[0].other_s, st[1].other_s);
  EXPECT_DOUBLE_EQ(b.other, st[0].other_s);
  EXPECT_NEAR(b.total(), none.total() + b.other, 1e-15);
  // Not measured: none.
  EXPECT_EQ(none.other, 0);
}

TEST(StepModel, TensorParallelExchangesCountInFull) {
  Rates slow = rates();
  slow.link_bytes_per_s /= 100;
  const StepBreakdown a = predict(shape(1, 2, 1, 1), rates());
  const StepBreakdown b = predict(shape(1, 2, 1, 1), slow);
  EXPECT_GT(b.exposed_exchange, 10 * a.exposed_exchange);
  EXPECT_DOUBLE_EQ(a.compute, b.compute);
}

TEST(StepModel, GatherAheadCoversAGather) {
  EXPECT_EQ(gather_ahead_for(3e-3, 1e-3, 10), 3);
  EXPECT_EQ(gather_ahead_for(0.5e-3, 1e-3, 10), 1);
  EXPECT_EQ(gather_ahead_for(3e-3, 1e-3, 3), 2);
  EXPECT_EQ(gather_ahead_for(3e-3, 0, 5), 4);
}

// GPT-2's formulas: 8 C^2 + 4 T C a token of attention, 16 C^2 of MLP, 2 C V of head; the step
// three times the forward.
TEST(StepModel, FlopFormulas) {
  nn::GPTConfig m;
  m.d_model = 64;
  m.n_layers = 3;
  m.vocab_size = 100;
  const double C = 64, T = 32;
  EXPECT_DOUBLE_EQ(attention_flops_per_token(m, T), 8 * C * C + 4 * T * C);
  EXPECT_DOUBLE_EQ(mlp_flops_per_token(m), 16 * C * C);
  EXPECT_DOUBLE_EQ(head_flops_per_token(m), 2 * C * 100);
  EXPECT_DOUBLE_EQ(step_flops_per_token(m, T), 3 * (3 * (24 * C * C + 4 * T * C) + 2 * C * 100));
}

StepShape with_cp(StepShape s, int cp) {
  s.grid.cp = cp;
  return s;
}

// Context parallelism: a rank's projections and MLP run on seq_len / cp tokens and its queries
// meet 1/cp of the causal scores, so every unit's compute halves at cp 2; each attention adds
// one key/value exchange in the forward and two in the backward, of (cp-1)/cp of the whole
// sequence's keys and values.
TEST(StepModel, ContextParallelismSplitsTheComputeAndAddsTheKvExchange) {
  const StepShape one = shape(1, 1, 1, 1), two = with_cp(one, 2);
  const Rates r = rates();
  std::vector<StageTimes> a, b;
  predict(one, r, &a);
  const StepBreakdown cp2 = predict(two, r, &b);
  ASSERT_EQ(a[0].profile.forward_s.size(), b[0].profile.forward_s.size());
  const KvExchange kv = kv_exchange(two, r);
  const double whole = 4.0 * 16 * 2 * 2 * 16 * sizeof(float);  // rows T 2 KVH HS floats
  EXPECT_DOUBLE_EQ(kv.bytes, whole / 2);
  EXPECT_DOUBLE_EQ(kv.seconds, r.link_latency_s + kv.bytes / r.link_bytes_per_s);
  EXPECT_EQ(kv_exchange(one, r).bytes, 0);
  // Every unit halves (the last carries the LM head, halved too); attention's add the exchanges.
  for (size_t u = 0; u < a[0].profile.forward_s.size(); ++u) {
    SCOPED_TRACE(u);
    const bool attn = u % 2 == 0;
    EXPECT_NEAR(b[0].profile.forward_s[u], a[0].profile.forward_s[u] / 2 + (attn ? kv.seconds : 0),
                1e-15);
    EXPECT_NEAR(b[0].profile.backward_s[u],
                a[0].profile.backward_s[u] / 2 + (attn ? 2 * kv.seconds : 0), 1e-15);
  }
  // The exchanges are communication: 3 a block; the link's bytes are theirs and the gradient
  // exchange's over the 2 replicas (as dp 2's).
  EXPECT_NEAR(b[0].comm_per_micro_s, 4 * 3 * kv.seconds, 1e-15);
  EXPECT_NEAR(cp2.link_bytes, 4 * 3 * kv.bytes + predict(shape(2, 1, 1, 1), r).link_bytes, 1e-6);
  EXPECT_GT(cp2.exposed_exchange, 0);
}

// The gradient exchange and the update run over the dp x cp replicas: cp 2 exchanges and slices
// as dp 2 does.
TEST(StepModel, ContextParallelRanksAreReplicasOfTheExchange) {
  const Rates r = [] {
    Rates x = rates();
    x.update_params_per_s = 1e6;
    return x;
  }();
  std::vector<StageTimes> cp, dp, one;
  predict(with_cp(shape(1, 1, 1, 1), 2), r, &cp);
  predict(shape(2, 1, 1, 1), r, &dp);
  predict(shape(1, 1, 1, 1), r, &one);
  EXPECT_GT(cp[0].dp_blocks_s, 0);
  EXPECT_DOUBLE_EQ(cp[0].dp_blocks_s, dp[0].dp_blocks_s);
  EXPECT_DOUBLE_EQ(cp[0].dp_rest_s, dp[0].dp_rest_s);
  EXPECT_DOUBLE_EQ(cp[0].update_rest_s, one[0].update_rest_s / 2);
  EXPECT_EQ(one[0].dp_blocks_s, 0);
}

// The bytes over the link a step: the data-parallel exchange's (R-1)/R of the gradients and the
// weights, plus tp's all-reduces.
TEST(StepModel, LinkBytesCountEveryExchange) {
  const Rates r = rates();
  EXPECT_EQ(predict(shape(1, 1, 1, 1), r).link_bytes, 0);
  std::vector<StageTimes> st;
  const StepBreakdown dp = predict(shape(2, 1, 1, 1), r, &st);
  EXPECT_NEAR(dp.link_bytes,
              (st[0].dp_blocks_s + st[0].dp_rest_s - 2 * r.link_latency_s) * r.link_bytes_per_s,
              1e-3);
  const StepShape tp = shape(1, 2, 1, 1);
  const double tokens = tp.rank_tokens();
  EXPECT_NEAR(predict(tp, r).link_bytes,
              tp.model.n_layers * 4 * 2.0 * 1 / 2 * tokens * tp.model.d_model * sizeof(float),
              1e-6);
}

// Rates of a host whose `ranks` share `slots` cores' worth: a core computes at `core` FLOP/s
// while the host is busy, a rank alone at `alone`, and the slowest of all computing at once at
// `together`.
Rates shared(int ranks, double slots, double together, double core, double alone) {
  Rates r = rates();
  r.host_ranks = ranks;
  r.host_slots = slots;
  for (int tp : {1, 2}) {
    r.gemm_flops_per_s[tp] = together;
    r.gemm_core_flops_per_s[tp] = core;
    r.gemm_alone_flops_per_s[tp] = alone;
  }
  return r;
}

// With cores of their own (slots >= ranks) the ranks compute at the rate measured with all at
// once, as before the host's cores were counted: a core's rate is not read and nothing waits,
// whatever share of the cores their exchanges and update take.
TEST(StepModel, RanksWithCoresOfTheirOwnPredictAsTheRateTogether) {
  for (const StepShape& s : {shape(2, 1, 2, 4), shape(4, 1, 1, 1), shape(1, 2, 2, 2)}) {
    const StepBreakdown before = predict(s, rates());
    for (double slots : {4.0, 8.0}) {
      Rates r = shared(4, slots, 1e9, 3e9, 3e9);
      r.link_core_share = r.update_core_share = 1;
      const StepBreakdown b = predict(s, r);
      EXPECT_EQ(b.str(), before.str());
      EXPECT_EQ(b.cores, 0);
    }
  }
  EXPECT_FALSE(ranks_share_cores(shared(4, 4, 1e9, 3e9, 3e9)));
  EXPECT_EQ(charged_gemm_rate(shared(4, 4, 1e9, 3e9, 3e9), 1), 1e9);
}

// 4 ranks on 2 cores, pp 2 x dp 2, M 4: while a stage waits in its bubble the other stage's ranks
// use its core, so the step is the host's compute over its 2 cores, each at a core's rate: a dp
// rank's whole forward and backward (both stages) at 1 GFLOP/s. Charging every rank the even
// share (all 4 computing at once, 0.5 GFLOP/s) through the bubble is slower by more than the
// bubble's share, (M + pp - 1) / M.
TEST(StepModel, RanksSharingCoresFillEachOthersBubble) {
  const int M = 4;
  const StepShape s = shape(2, 1, 2, M);
  const Rates r = shared(4, 2, 0.5e9, 1e9, 1e9);
  ASSERT_TRUE(ranks_share_cores(r));
  EXPECT_EQ(charged_gemm_rate(r, 1), 1e9);
  const StepBreakdown b = predict(s, r);
  const double tokens = s.rank_tokens() * M;
  const double host = tokens * step_flops_per_token(s.model, s.model.seq_len) / 1e9;
  EXPECT_GT(b.cores, 0);
  EXPECT_NEAR(b.total(), host, 1e-12);
  // The same ranks all computing at once at the even share, through the bubble.
  const StepBreakdown even = predict(s, shared(4, 4, 0.5e9, 1e9, 1e9));
  EXPECT_EQ(even.cores, 0);
  EXPECT_LT(b.total(), even.total() * M / (M + 2 - 1));
  // The critical path at a core's rate alone would be faster still: the host's cores bound it.
  EXPECT_LT(b.total() - b.cores, host);
}

// 4 ranks on 2 cores, pp 4: while the first micro-batch's forward is at stage 0 (and the last
// backward is back there) one rank has work and one core idles, a micro-batch's forward and
// backward at a stage; the rest of the step both cores are busy with the 4 stages' compute.
TEST(StepModel, APipelinesFillAndDrainLeaveCoresIdle) {
  const int M = 8;
  StepShape s = shape(1, 1, 4, M);
  s.model.vocab_size = 64;  // a light head: the stages alike, the host's cores the bound
  const StepBreakdown b = predict(s, shared(4, 2, 0.5e9, 1e9, 1e9));
  const double tokens = s.rank_tokens() * M;
  const double mean = tokens * step_flops_per_token(s.model, s.model.seq_len) / 1e9 / 4;
  EXPECT_GT(b.cores, 0);
  EXPECT_NEAR(b.total(), (4 * mean + (2 - 1) * mean / M) / 2, 1e-12);
  // Two ranks a stage (dp 2, pp 2) fill both cores from the start: nothing idles.
  const StepShape two = shape(2, 1, 2, M);
  const double whole = two.rank_tokens() * M * step_flops_per_token(two.model, two.model.seq_len);
  EXPECT_NEAR(predict(two, shared(4, 2, 0.5e9, 1e9, 1e9)).total(), whole / 1e9, 1e-12);
}

// One micro-batch: the pipeline's stages take turns and the host is never full, so the critical
// path at a core's rate sets the step and nothing waits for the cores.
TEST(StepModel, AHostThatIsNeverFullDoesNotWaitForItsCores) {
  const StepShape s = shape(2, 1, 2, 1);
  const StepBreakdown b = predict(s, shared(4, 2, 0.5e9, 1e9, 1e9));
  EXPECT_EQ(b.cores, 0);
  // The critical path, as if each rank had a core of its own at a core's rate.
  EXPECT_EQ(b.str(), predict(s, shared(4, 4, 1e9, 1e9, 1e9)).str());
}

// Data parallelism keeps every rank computing: 4 ranks on 2 cores take twice a rank's compute at
// a core's rate, the even share's compute; the exchanges and the update hide behind the others'.
TEST(StepModel, DataParallelRanksOnSharedCoresTakeTheEvenShare) {
  const StepShape s = shape(4, 1, 1, 1);
  const StepBreakdown b = predict(s, shared(4, 2, 0.5e9, 1e9, 1e9));
  const StepBreakdown even = predict(s, shared(4, 4, 0.5e9, 1e9, 1e9));
  EXPECT_NEAR(b.total(), 2 * b.compute, 1e-12);
  EXPECT_NEAR(b.total(), even.compute, 1e-12);
}

// 4 data-parallel ranks on 2 cores whose exchange outlasts their compute: without the exchange's
// copies and sums counted as the cores' work, the critical path sets the step (the exchange
// beyond the backward); with them (the in-process link's threads each half a core), the host's
// cores do: 4 ranks' compute at a core's rate, their bytes over the link at half a core a
// second and their updates at half a core a second, over 2 cores.
TEST(StepModel, TheExchangesCopiesOnTheCoresCanMakeTheHostBound) {
  const StepShape s = shape(4, 1, 1, 1);
  Rates r = shared(4, 2, 0.5e9, 1e9, 1e9);
  r.link_bytes_per_s = 1e6;  // the exchange a few times the compute
  r.update_params_per_s = 1e6;
  r.update_core_share = 0.5;
  std::vector<StageTimes> st;
  const StepBreakdown wire = predict(s, r, &st);  // a stated link: no cores' work
  ASSERT_GT(st[0].dp_blocks_s + st[0].dp_rest_s, 2 * wire.compute);
  EXPECT_EQ(wire.cores, 0);
  const double update = st[0].update_blocks_s + st[0].update_rest_s;
  ASSERT_GT(update, 0);
  r.link_core_share = 0.5;
  const StepBreakdown b = predict(s, r);
  EXPECT_GT(b.cores, 0);
  EXPECT_NEAR(b.total(), (4 * (b.compute + 0.5 * b.link_bytes / 1e6 + 0.5 * update)) / 2,
              1e-12 * b.total());
  EXPECT_GT(b.total(), wire.total());
  // The step's other work is the cores' too, and counted once: in the host's bound.
  r.embedding_token_s = 1e-6;
  std::vector<StageTimes> with;
  const StepBreakdown o = predict(s, r, &with);
  ASSERT_GT(with[0].other_s, 0);
  EXPECT_NEAR(o.total(),
              (4 * (o.compute + 0.5 * o.link_bytes / 1e6 + 0.5 * update + with[0].other_s)) / 2,
              1e-12 * o.total());
}

// 4 ranks on 2 cores in a pipeline of one micro-batch, the last stage (the LM head's) slowest:
// the stages take turns, so the critical path sets the step even with every exchange's bytes and
// the update counted as the cores' work, and the prediction is the one without them.
TEST(StepModel, TheExchangesCopiesWithinTheCriticalPathLeaveTheStepAlone) {
  const StepShape s = shape(2, 1, 2, 1);
  Rates r = shared(4, 2, 0.5e9, 1e9, 1e9);
  r.update_params_per_s = 1e8;
  const StepBreakdown before = predict(s, r);
  r.link_core_share = r.update_core_share = 0.5;
  std::vector<StageTimes> st;
  const StepBreakdown b = predict(s, r, &st);
  ASSERT_GT(b.link_bytes, 0);
  EXPECT_EQ(b.cores, 0);
  EXPECT_EQ(b.str(), before.str());
  // The host's work, counted, is less than the step: its 4 ranks' compute, bytes and update over
  // its 2 cores.
  double host = 0;
  for (const StageTimes& t : st)
    host +=
        2 * ((t.profile.compute_s() - t.comm_per_micro_s) +
             0.5 * t.link_bytes / r.link_bytes_per_s + 0.5 * (t.update_blocks_s + t.update_rest_s));
  EXPECT_LT(host / 2, b.total());
  EXPECT_GT(host / 2, 0.5 * b.total());
}

// More cores never slow a step; with as many as ranks, the rate alone's model (no waits).
TEST(StepModel, MoreCoresNeverSlowAStep) {
  for (const StepShape& s : {shape(2, 1, 2, 4), shape(1, 2, 2, 2), shape(4, 1, 1, 1)}) {
    double last = 1e30;
    for (double slots : {1.0, 1.5, 2.0, 3.0, 4.0}) {
      const StepBreakdown b = predict(s, shared(4, slots, 1e9, 1e9, 1e9));
      EXPECT_LE(b.total(), last) << slots;
      last = b.total();
    }
    EXPECT_EQ(predict(s, shared(4, 4, 1e9, 1e9, 1e9)).str(), predict(s, rates()).str());
  }
}

// A core's rate, summed over the host's cores, may round above a rank's alone: no faster than it.
TEST(StepModel, ACoresRateIsNoFasterThanARankAlone) {
  EXPECT_EQ(charged_gemm_rate(shared(4, 2, 0.5e9, 1.1e9, 1e9), 2), 1e9);
  EXPECT_EQ(charged_gemm_rate(shared(4, 2, 0.5e9, 0.9e9, 1e9), 2), 0.9e9);
}

}  // namespace step_model_test
}  // namespace tandem::perf
