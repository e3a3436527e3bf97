// The pipeline's hand-offs are DSL programs on every executor: the activations forward
// (pipeline_stage) and the gradients back (grad_handoff, its sends left in flight so that 1F1B
// goes on). Pipelines of 2 and 3 stages with 4 micro-batches train to the losses of one rank on
// the compiled, plan and reference executors (the reference one used to split its groups at each
// run, a collective that two programs on one link could have matched wrongly), and the trace
// names the gradient hand-off and each rank's batch.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "train/test_util.h"

namespace tandem::train {
namespace {

TrainConfig pipeline_run(int pp, exec::RunnerKind executor) {
  TrainConfig c = testing::tiny_run(3);
  c.model.n_layers = 3;
  c.grid = {1, 1, pp};
  c.micro_batches = 4;
  c.executor = executor;
  return c;
}

// The stages add the same products in another order than one rank (the hand-off's boundary
// block runs as a row-parallel shard), so the losses agree to f32 rounding.
TEST(PipelineHandoff, EveryExecutorTrainsAsOneRank) {
  const TrainResult one = train(pipeline_run(1, exec::RunnerKind::Plan));
  for (const exec::RunnerKind executor :
       {exec::RunnerKind::Compiled, exec::RunnerKind::Plan, exec::RunnerKind::Reference})
    for (int pp : {2, 3}) {
      const TrainResult got = train(pipeline_run(pp, executor));
      ASSERT_EQ(got.losses.size(), one.losses.size())
          << exec::runner_kind_name(executor) << " pp " << pp;
      for (size_t i = 0; i < one.losses.size(); ++i)
        EXPECT_NEAR(got.losses[i], one.losses[i], 1e-5 * std::fabs(one.losses[i]))
            << exec::runner_kind_name(executor) << " pp " << pp;
    }
}

// Also the data loading: every rank draws its rows of each step's batch on a "data" row, before
// its first compute of the step, and the metrics count it as the "data" phase.
TEST(PipelineHandoff, TheTraceNamesTheGradientHandoffAndTheBatches) {
  testing::ScratchDir dir;
  TrainConfig c = pipeline_run(2, exec::RunnerKind::Compiled);
  c.trace_path = dir.path("trace.json");
  c.metrics_path = dir.path("metrics.jsonl");
  train(c);
  const nlohmann::json j = nlohmann::json::parse(testing::read_bytes(c.trace_path));
  std::map<std::pair<int, int>, std::string> rows;  // (pid, tid) -> stream
  for (const nlohmann::json& e : j["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name")
      rows[{e["pid"].get<int>(), e["tid"].get<int>()}] = e["args"]["name"];
  int sends = 0, recvs = 0;
  std::map<std::pair<int, std::string>, double> batch_end;  // (rank, "batch s") -> its end
  std::map<int, double> first_compute;                      // rank -> its first compute's start
  for (const nlohmann::json& e : j["traceEvents"]) {
    if (e["ph"] != "X") continue;
    sends += e["name"] == "pipeline grad_handoff (send)";
    recvs += e["name"] == "pipeline grad_handoff (recv)";
    const int rank = e["pid"];
    const std::string& row = rows[{rank, e["tid"].get<int>()}];
    const double ts = e["ts"];
    if (row == "data") batch_end[{rank, e["name"]}] = ts + e["dur"].get<double>();
    if (row == "compute" && (!first_compute.count(rank) || ts < first_compute[rank]))
      first_compute[rank] = ts;
  }
  EXPECT_EQ(sends, 3 * 4) << "stage 1 hands back every micro-batch's gradient, every step";
  EXPECT_EQ(recvs, 3 * 4) << "stage 0 receives every micro-batch's gradient, every step";
  EXPECT_EQ(batch_end.size(), 2u * 3u) << "a data span per rank and step";
  for (int rank : {0, 1}) {
    for (int step = 1; step <= 3; ++step)
      EXPECT_EQ(batch_end.count({rank, "batch " + std::to_string(step)}), 1u)
          << "rank " << rank << " step " << step;
    ASSERT_EQ(first_compute.count(rank), 1u) << rank;
    const double first_batch_end = batch_end[{rank, "batch 1"}];
    EXPECT_LE(first_batch_end, first_compute[rank])
        << "rank " << rank << " computes before its first batch is drawn";
  }
  const std::string metrics = testing::read_bytes(c.metrics_path);
  EXPECT_NE(metrics.find(R"("phase_s":{"data":)"), std::string::npos) << metrics;
}

}  // namespace
}  // namespace tandem::train
