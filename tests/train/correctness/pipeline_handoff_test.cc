// The pipeline's hand-offs are DSL programs on every executor: the activations forward
// (pipeline_stage) and the gradients back (grad_handoff, its sends left in flight so that 1F1B
// goes on). Pipelines of 2 and 3 stages with 4 micro-batches train to the losses of one rank on
// the compiled, plan and reference executors (the reference one used to split its groups at each
// run, a collective that two programs on one link could have matched wrongly), and the trace
// names the gradient hand-off.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

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

TEST(PipelineHandoff, TheTraceNamesTheGradientHandoff) {
  testing::ScratchDir dir;
  TrainConfig c = pipeline_run(2, exec::RunnerKind::Compiled);
  c.trace_path = dir.path("trace.json");
  train(c);
  const nlohmann::json j = nlohmann::json::parse(testing::read_bytes(c.trace_path));
  int sends = 0, recvs = 0;
  for (const nlohmann::json& e : j["traceEvents"]) {
    if (e["ph"] != "X") continue;
    sends += e["name"] == "pipeline grad_handoff (send)";
    recvs += e["name"] == "pipeline grad_handoff (recv)";
  }
  EXPECT_EQ(sends, 3 * 4) << "stage 1 hands back every micro-batch's gradient, every step";
  EXPECT_EQ(recvs, 3 * 4) << "stage 0 receives every micro-batch's gradient, every step";
}

}  // namespace
}  // namespace tandem::train
