// The data-parallel gradient exchange: buckets exchanged while the backward goes on give bitwise
// the weights of the exchange after the backward (same programs, same data, same order), on every
// grid and executor, for AdamW and LAMB; buckets of blocks give the weights of one segment where
// the reduction order is the same; the trace shows the exchange running during the backward;
// clipping by the whole model's gradient norm keeps all of that.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tandem/parallel/optimizer.h"
#include "train/test_util.h"

namespace tandem::train {
namespace {

using exec::RunnerKind;
using nlohmann::json;
using parallel::GradExchange;
using parallel::OptimizerKind;

// "adamw plan dp=2 tp=1 pp=1": what a failure names.
std::string named(OptimizerKind optimizer, RunnerKind executor, const parallel::GridShape& g) {
  return fmt::format("{} {} {}", parallel::optimizer_name(optimizer),
                     exec::runner_kind_name(executor), g.str());
}

// Four blocks of a few KiB each, so that a small bucket holds about one block.
TrainConfig exchange_run(parallel::GridShape grid, OptimizerKind optimizer, GradExchange exchange,
                         std::optional<double> bucket_mb, RunnerKind executor) {
  TrainConfig c = testing::tiny_run(3);
  c.model.n_layers = 4;
  c.batch = 8;
  c.grid = grid;
  c.optimizer.kind = optimizer;
  c.optimizer.exchange = exchange;
  c.optimizer.bucket_mb = bucket_mb;
  c.optimizer.weight_decay = 0.01;
  c.model.dropout = 0.1;
  c.executor = executor;
  c.keep_weights = true;
  return c;
}

constexpr double kSmallBucket = 0.01;  // MiB: one block of d_model 16 is about 13 KiB

using testing::expect_bitwise;

TEST(GradExchange, OverlappedEqualsAfterTheBackwardBitwise) {
  const std::vector<parallel::GridShape> grids = {{2, 1, 1}, {2, 2, 1}, {2, 1, 2}, {4, 1, 1}};
  for (const RunnerKind executor : {RunnerKind::Compiled, RunnerKind::Plan})
    for (const OptimizerKind optimizer : {OptimizerKind::AdamW, OptimizerKind::Lamb})
      for (const parallel::GridShape& g : grids) {
        const std::string what = named(optimizer, executor, g);
        const TrainResult after =
            train(exchange_run(g, optimizer, GradExchange::After, kSmallBucket, executor));
        const TrainResult overlap =
            train(exchange_run(g, optimizer, GradExchange::Overlap, kSmallBucket, executor));
        expect_bitwise(after, overlap, what);
      }
}

// Buckets only change which elements share a program run. The sums are the same where the
// reduction adds the same ranks in the same order for every element: always at dp = 2 (a + b is
// b + a, bitwise), and on in-process ranks at any dp (the direct algorithm adds the ranks in rank
// order). Where a ring of p >= 3 ranks reduces (MPI), the order follows each element's place in
// the ring's chunks, so it moves with the bucket's boundaries: tests/train/mpi bounds that.
TEST(GradExchange, BucketsEqualOneSegmentWhereTheReductionOrderIsTheSame) {
  for (const parallel::GridShape& g :
       std::vector<parallel::GridShape>{{2, 1, 1}, {4, 1, 1}, {2, 2, 1}}) {
    const TrainResult one = train(exchange_run(g, OptimizerKind::AdamW, GradExchange::After,
                                               std::nullopt, RunnerKind::Compiled));
    const TrainResult many = train(exchange_run(g, OptimizerKind::AdamW, GradExchange::Overlap,
                                                kSmallBucket, RunnerKind::Compiled));
    expect_bitwise(one, many, "buckets vs one segment at " + g.str());
  }
}

TEST(GradExchange, TheTraceShowsTheExchangeDuringTheBackward) {
  testing::ScratchDir dir;
  TrainConfig c = exchange_run({2, 1, 1}, OptimizerKind::AdamW, GradExchange::Overlap, kSmallBucket,
                               RunnerKind::Compiled);
  c.model.d_model = 64;  // a backward of some milliseconds per block
  c.model.n_heads = 4;
  c.model.seq_len = c.model.max_positions = 64;
  c.steps = 4;
  c.trace_path = dir.path("trace.json");
  train(c);
  const json j = json::parse(testing::read_bytes(c.trace_path));
  std::map<int, std::string> rows;  // (pid 0's) tid -> stream
  for (const json& e : j["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name" && e["pid"] == 0)
      rows[e["tid"]] = e["args"]["name"];
  // For each exchange span, whether a backward span of the same rank ends after it began.
  int spans = 0, during = 0;
  for (const json& x : j["traceEvents"]) {
    if (x["ph"] != "X" || x["pid"] != 0 || rows[x["tid"]] != "dp exchange") continue;
    ++spans;
    const double begin = x["ts"];
    for (const json& b : j["traceEvents"])
      if (b["ph"] == "X" && b["pid"] == 0 && rows[b["tid"]] == "compute" &&
          b["name"].get<std::string>().rfind("backward h.", 0) == 0 &&
          b["ts"].get<double>() >= begin) {
        ++during;
        break;
      }
  }
  EXPECT_GT(spans, 4 * 4) << "a span per bucket and step (4 blocks, the embeddings, ln_f)";
  EXPECT_GT(during, 0) << "no bucket's exchange started before a later block's backward";
}

// --------------------------------------------------------------------------- gradient clipping

TrainConfig clipped_run(parallel::GridShape grid, OptimizerKind optimizer, GradExchange exchange,
                        double clip, RunnerKind executor) {
  TrainConfig c = exchange_run(grid, optimizer, exchange, kSmallBucket, executor);
  c.optimizer.clip_grad_norm = clip;
  return c;
}

// The reductions overlap the backward and the updates follow the norm: the same programs on the
// same data in the same order as after the backward, so bitwise the same.
TEST(GradClipping, OverlappedEqualsAfterTheBackwardBitwise) {
  const std::vector<parallel::GridShape> grids = {{2, 1, 1}, {2, 2, 1}, {2, 1, 2}, {4, 1, 1}};
  for (const RunnerKind executor : {RunnerKind::Compiled, RunnerKind::Plan})
    for (const OptimizerKind optimizer : {OptimizerKind::AdamW, OptimizerKind::Lamb})
      for (const parallel::GridShape& g : grids) {
        const std::string what = named(optimizer, executor, g);
        const TrainResult after =
            train(clipped_run(g, optimizer, GradExchange::After, 0.05, executor));
        const TrainResult overlap =
            train(clipped_run(g, optimizer, GradExchange::Overlap, 0.05, executor));
        expect_bitwise(after, overlap, what);
        ASSERT_EQ(after.grad_norms.size(), 3u) << what;
        EXPECT_EQ(after.grad_norms, overlap.grad_norms) << what;
      }
}

// A limit no gradient reaches scales by exactly 1, and the two halves then compute what the
// one-program ZeRO-1 step computes: bitwise the weights of the run without clipping.
TEST(GradClipping, ALimitAboveTheNormChangesNothing) {
  for (const parallel::GridShape& g :
       std::vector<parallel::GridShape>{{1, 1, 1}, {2, 1, 1}, {2, 2, 1}, {2, 1, 2}})
    for (const OptimizerKind optimizer : {OptimizerKind::AdamW, OptimizerKind::Lamb}) {
      const TrainResult plain = train(
          exchange_run(g, optimizer, GradExchange::Overlap, kSmallBucket, RunnerKind::Compiled));
      const TrainResult clipped =
          train(clipped_run(g, optimizer, GradExchange::Overlap, 1e30, RunnerKind::Compiled));
      expect_bitwise(plain, clipped, named(optimizer, RunnerKind::Compiled, g));
    }
}

// The norm is the whole model's, each element counted once: tensors every tp rank holds whole
// and the last stage's copy of wte are not counted twice. Every grid sees the norm of one rank.
TEST(GradClipping, TheNormIsTheWholeModelsOnEveryGrid) {
  auto run = [](parallel::GridShape g) {
    TrainConfig c =
        clipped_run(g, OptimizerKind::AdamW, GradExchange::Overlap, 0.05, RunnerKind::Compiled);
    c.model.dropout = 0;  // the same gradient on every grid, up to the order of sums
    return train(c);
  };
  const TrainResult one = run({1, 1, 1});
  ASSERT_EQ(one.grad_norms.size(), 3u);
  EXPECT_GT(one.grad_norms[0], 0.05) << "the test wants a norm the limit clips";
  for (const parallel::GridShape& g :
       std::vector<parallel::GridShape>{{2, 1, 1}, {1, 2, 1}, {1, 1, 2}, {2, 2, 2}}) {
    const TrainResult r = run(g);
    ASSERT_EQ(r.grad_norms.size(), 3u) << g.str();
    // The first step's gradient is the same model's on the same batch: only the order of the
    // sums differs.
    EXPECT_NEAR(r.grad_norms[0], one.grad_norms[0], 1e-5 * one.grad_norms[0]) << g.str();
    for (size_t i = 0; i < one.losses.size(); ++i)
      EXPECT_NEAR(r.losses[i], one.losses[i], 1e-4) << g.str() << " step " << i + 1;
  }
}

// The updates stream their moments from a slow tier as the one-program step's do: bitwise the
// weights of moments in memory.
TEST(GradClipping, StateInTheSlowTierEqualsStateInMemory) {
  for (const parallel::GridShape& g : std::vector<parallel::GridShape>{{2, 1, 1}, {2, 2, 1}}) {
    const TrainResult memory = train(
        clipped_run(g, OptimizerKind::AdamW, GradExchange::Overlap, 0.05, RunnerKind::Compiled));
    TrainConfig c =
        clipped_run(g, OptimizerKind::AdamW, GradExchange::Overlap, 0.05, RunnerKind::Compiled);
    c.optimizer.state_tier = ooc::TierSpec::parse("host");
    expect_bitwise(memory, train(c), "host tier at " + g.str());
  }
}

// Clipping takes effect: a limit below the norm gives other weights than no limit.
TEST(GradClipping, ALimitBelowTheNormChangesTheStep) {
  const TrainResult plain = train(exchange_run(
      {2, 1, 1}, OptimizerKind::AdamW, GradExchange::Overlap, kSmallBucket, RunnerKind::Compiled));
  const TrainResult clipped = train(clipped_run({2, 1, 1}, OptimizerKind::AdamW,
                                                GradExchange::Overlap, 0.05, RunnerKind::Compiled));
  ASSERT_GT(clipped.grad_norms[0], 0.05);
  EXPECT_NE(plain.weights, clipped.weights);
  EXPECT_EQ(plain.losses[0], clipped.losses[0]) << "the first loss comes before any update";
}

}  // namespace
}  // namespace tandem::train
