// The compiled runner's contract beyond correctness: set up, then run (every byte comes from the
// allocator it is given, at construction; runs allocate nothing from it), the memory a schedule
// stores (with as_slice, each rank keeps 1/p of the optimizer state, measured from the runner's
// allocations), and outputs as views of the runner's storage that the next run refreshes.
#include <gtest/gtest.h>

#include "support/schedules.h"
#include "tandem/comm/thread.h"
#include "tandem/dsl/dsl.h"
#include "tandem/exec/compiled.h"
#include "tandem/schedule/transforms.h"

namespace tandem::exec {
namespace {

using tandem::testing::plan_named;

void bind_adam(CompiledRunner& run, float grad) {
  for (const auto& [name, v] : {std::pair<const char*, double>{"lr", 0.01},
                                {"beta1", 0.9},
                                {"beta2", 0.999},
                                {"eps", 1e-8},
                                {"weight_decay", 0.0},
                                {"step", 1},
                                {"grad_scale", 1.0}})
    run.set_scalar(name, v);
  run.input("g").fill(grad);
  run.input("w").fill(1.0f);
  run.input("m").fill(0.0f);
  run.input("v").fill(0.0f);
}

TEST(CompiledRunner, AllocatesAtSetupOnlyAndKeepsOneOverPOfTheState) {
  const int64_t n = 4096;
  auto sliced =
      compile_plan(plan_named(dsl::workloads::adam(DType::F32), "fused(RS-C-AG)+slice(m,v)"));
  auto whole = compile_plan(plan_named(dsl::workloads::adam(DType::F32), "fused(RS-C-AG)"));
  for (int ranks : {1, 2, 4})
    comm::run_ranks(ranks, [&](comm::Communicator& c) {
      CountingAllocator counting;
      RunnerOptions options;
      options.alloc = &counting;
      CompiledRunner run(sliced, c, {{"N", n}}, options);
      const size_t live = counting.live_bytes(), peak = counting.peak_bytes();
      EXPECT_EQ(run.allocated_bytes(), peak);
      bind_adam(run, 0.5f);
      for (int k = 0; k < 3; ++k) run.run();
      EXPECT_EQ(counting.live_bytes(), live) << "run() allocates nothing";
      EXPECT_EQ(counting.peak_bytes(), peak);
      // m and v: this rank's slice, 1/p of the whole; w stays whole.
      const size_t part = static_cast<size_t>(dsl::part_count(n, ranks, c.rank())) * 4;
      EXPECT_EQ(run.allocated_bytes("m"), part);
      EXPECT_EQ(run.allocated_bytes("v"), part);
      EXPECT_EQ(run.allocated_bytes("w"), static_cast<size_t>(n) * 4);
      CompiledRunner unsliced(whole, c, {{"N", n}});
      EXPECT_EQ(unsliced.allocated_bytes("m"), static_cast<size_t>(n) * 4);
    });
}

TEST(CompiledRunner, OutputsAreViewsRefreshedByEachRun) {
  auto layer = compile_plan(
      plan_named(dsl::workloads::megatron_layer(DType::F32, 0.0), "ol(MM,fused(AR-C))"));
  comm::run_ranks(2, [&](comm::Communicator& c) {
    CompiledRunner run(layer, c, {{"B", 6}, {"K", 4}, {"H", 3}});
    EXPECT_TRUE(run.overlapping())
        << "the thread backend runs a pipeline's communication on its own thread";
    run.set_scalar("seed", 1);
    run.input("x").fill(1.0f);
    run.input("w").fill(0.5f);
    run.input("bias").fill(0.25f);
    run.input("residual").fill(0.0f);
    run.run();
    const Tensor out = run.output("out");
    // Each rank holds K/2 = 2 columns of x and rows of w: 2 * 0.5 per rank, summed over 2 ranks.
    for (int64_t i = 0; i < out.numel(); ++i) EXPECT_EQ(out.get(i), 2.25f);
    run.input("residual").fill(1.0f);
    run.run();
    for (int64_t i = 0; i < out.numel(); ++i)
      EXPECT_EQ(out.get(i), 3.25f) << "the same view, refreshed";
  });
}

// The overlap, proved from its timeline rather than from a thread's existence: the
// communication of block b (its AllReduce, with the fused epilogue) runs on the communication
// thread while the computing thread multiplies block b + 1 (between the queueing of block b's
// AllReduce and of block b + 1's). A machine busy enough to start the communication thread late
// every time could hide it in one run, so up to 5 runs are looked at, until every rank has seen
// it: the ranks decide together (a rank that stopped alone would leave the other's next run
// waiting for it).
TEST(CompiledRunner, TheOverlapsTimelineShowsBlockBCommunicatingWhileBlockBPlusOneComputes) {
  auto layer = compile_plan(
      plan_named(dsl::workloads::megatron_layer(DType::F32, 0.0), "ol(MM,fused(AR-C))"));
  comm::run_ranks(2, [&](comm::Communicator& c) {
    CompiledRunner run(layer, c, {{"B", 1024}, {"K", 1024}, {"H", 512}});
    run.set_scalar("seed", 1);
    run.input("x").fill(0.5f);
    run.input("w").fill(0.25f);
    run.input("bias").fill(0.0f);
    run.input("residual").fill(0.0f);
    int blocks = 0, overlapped = 0;
    for (int attempt = 0; attempt < 5; ++attempt) {
      std::vector<CompiledRunner::QueuedOp> log;
      run.record_queue(&log);
      run.run();
      run.record_queue(nullptr);
      blocks = static_cast<int>(log.size());
      for (size_t i = 0; i + 1 < log.size(); ++i) {
        ASSERT_EQ(log[i].block, static_cast<int>(i)) << "the blocks' AllReduces in issue order";
        EXPECT_LE(log[i].queued, log[i].began);
        EXPECT_LE(log[i].began, log[i].ended);
        overlapped += log[i].began < log[i + 1].queued;  // began while block i + 1 computed
      }
      Tensor least = Tensor::empty(DType::F32, Shape{1});
      least.set(0, static_cast<float>(overlapped));
      c.all_reduce(least, comm::ReduceOp::Min);
      if (least.get(0) > 0) break;  // every rank has seen it
    }
    EXPECT_GE(blocks, 2)
        << "a pipeline of blocks, each AllReduce queued for the communication thread";
    EXPECT_GT(overlapped, 0)
        << "no block's AllReduce began before the next block's matmul was done";
  });
}

}  // namespace
}  // namespace tandem::exec
