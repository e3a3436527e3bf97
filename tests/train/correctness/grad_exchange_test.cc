// The data-parallel gradient exchange: buckets exchanged while the backward goes on give bitwise
// the weights of the exchange after the backward (same programs, same data, same order), on every
// grid and executor, for AdamW and LAMB; buckets of blocks give the weights of one segment where
// the reduction order is the same; the trace shows the exchange running during the backward; the
// optimizer state really is 1/dp per rank, and the programs read and write the model's own
// buffers.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

#include "tandem/comm/thread.h"
#include "tandem/nn/gpt.h"
#include "tandem/parallel/shard.h"
#include "tandem/train/optimizer.h"
#include "train/test_util.h"

namespace tandem::train {
namespace {

using nlohmann::json;

// Four blocks of a few KiB each, so that a small bucket holds about one block.
TrainConfig exchange_run(parallel::GridShape grid, const std::string& optimizer, const std::string& exchange,
                         std::optional<double> bucket_mb, const std::string& executor) {
  TrainConfig c = testing::tiny_run(3);
  c.model.n_layers = 4;
  c.batch = 8;
  c.grid = grid;
  c.optimizer.name = optimizer;
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
  for (const std::string executor : {"compiled", "plan"})
    for (const std::string optimizer : {"adamw", "lamb"})
      for (const parallel::GridShape& g : grids) {
        const std::string what = optimizer + " " + executor + " " + g.str();
        const TrainResult after = train(exchange_run(g, optimizer, "after", kSmallBucket, executor));
        const TrainResult overlap = train(exchange_run(g, optimizer, "overlap", kSmallBucket, executor));
        expect_bitwise(after, overlap, what);
      }
}

// Buckets only change which elements share a program run. The sums are the same where the
// reduction adds the same ranks in the same order for every element: always at dp = 2 (a + b is
// b + a, bitwise), and on in-process ranks at any dp (the direct algorithm adds the ranks in rank
// order). Where a ring of p >= 3 ranks reduces (MPI), the order follows each element's place in
// the ring's chunks, so it moves with the bucket's boundaries: tests/train/mpi bounds that.
TEST(GradExchange, BucketsEqualOneSegmentWhereTheReductionOrderIsTheSame) {
  for (const parallel::GridShape& g : std::vector<parallel::GridShape>{{2, 1, 1}, {4, 1, 1}, {2, 2, 1}}) {
    const TrainResult one = train(exchange_run(g, "adamw", "after", std::nullopt, "compiled"));
    const TrainResult many = train(exchange_run(g, "adamw", "overlap", kSmallBucket, "compiled"));
    expect_bitwise(one, many, "buckets vs one segment at " + g.str());
  }
}

TEST(GradExchange, TheTraceShowsTheExchangeDuringTheBackward) {
  testing::ScratchDir dir;
  TrainConfig c = exchange_run({2, 1, 1}, "adamw", "overlap", kSmallBucket, "compiled");
  c.model.d_model = 64;  // a backward of some milliseconds per block
  c.model.n_heads = 4;
  c.model.seq_len = c.model.max_positions = 64;
  c.steps = 4;
  c.trace_path = dir.path("trace.json");
  train(c);
  const json j = json::parse(testing::read_bytes(c.trace_path));
  std::map<int, std::string> rows;  // (pid 0's) tid -> stream
  for (const json& e : j["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name" && e["pid"] == 0) rows[e["tid"]] = e["args"]["name"];
  // For each exchange span, whether a backward span of the same rank ends after it began.
  int spans = 0, during = 0;
  for (const json& x : j["traceEvents"]) {
    if (x["ph"] != "X" || x["pid"] != 0 || rows[x["tid"]] != "dp exchange") continue;
    ++spans;
    const double begin = x["ts"];
    for (const json& b : j["traceEvents"])
      if (b["ph"] == "X" && b["pid"] == 0 && rows[b["tid"]] == "compute" &&
          b["name"].get<std::string>().rfind("backward h.", 0) == 0 && b["ts"].get<double>() >= begin) {
        ++during;
        break;
      }
  }
  EXPECT_GT(spans, 4 * 4) << "a span per bucket and step (4 blocks, the embeddings, ln_f)";
  EXPECT_GT(during, 0) << "no bucket's exchange started before a later block's backward";
}

// ZeRO-1 memory: with slice(m,v) each rank holds 1/dp of the moments, and the programs allocate
// neither gradients nor weights (they are bound to the model's buffers), only the reduce-scatter's
// 1/dp result.
TEST(GradExchange, StateIsOneOverDpAndTheModelsBuffersAreBound) {
  nn::GPTConfig cfg;
  cfg.n_layers = 3;
  cfg.n_heads = 2;
  cfg.d_model = 32;
  cfg.seq_len = cfg.max_positions = 16;
  for (int dp : {1, 2, 3}) {
    comm::run_ranks(dp, [&](comm::Communicator& c) {
      const parallel::ShardLayout layout(cfg, {dp, 1, 1}, 0, 0);
      const int64_t n = layout.size();
      Tensor params = Tensor::zeros(DType::F32, Shape{n}), grads = Tensor::zeros(DType::F32, Shape{n});
      OptimizerConfig oc;
      oc.bucket_mb = 0.02;
      DataParallelOptimizer opt(oc, layout, params, grads, c, {"fused(RS-C-AG)+slice(m,v)"}, exec::RunnerKind::Compiled);
      EXPECT_GT(opt.buckets(), 1);
      int64_t mine = 0;
      for (const DataParallelOptimizer::Piece& pc : opt.pieces()) mine += pc.end - pc.begin;
      EXPECT_EQ(opt.state_bytes(), static_cast<size_t>(mine) * 8);
      // 1/dp of every segment, so within a float per segment of 8N/dp.
      EXPECT_LE(std::abs(static_cast<double>(mine) - static_cast<double>(n) / dp), opt.segments()) << dp;
      // Nothing the size of the gradients or the weights: the reduce-scatter's 1/dp result, and
      // the scalars and scratch (under a KiB a segment).
      EXPECT_LE(opt.buffer_bytes(), static_cast<size_t>(n / dp + opt.segments()) * 4 + 1024u * opt.segments())
          << dp;
      // The update lands in the model's own weights.
      grads.fill(1.0f);
      opt.step(0.1, 1);
      EXPECT_NE(params.get(0), 0.0f);
      EXPECT_NE(params.get(n - 1), 0.0f);
    });
  }
}

}  // namespace
}  // namespace tandem::train
