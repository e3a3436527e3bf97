// The tuner's search on in-process ranks: a program with two collectives is tuned one collective at
// a time (each keeps the choice that was fastest, made known here by delaying the others), then
// the leader's overlap at other block counts; the time budget stops the search; the winner is timed
// at each chunk size, by runners set up at that size (the process's size untouched); and the cache
// key changes with the block counts, chunk sizes and budget.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "schedule/testing.h"
#include "support/slowed_runner.h"
#include "tandem/comm/communicator.h"
#include "tandem/comm/thread.h"
#include "tandem/schedule/enumerate.h"
#include "tandem/schedule/recipe.h"
#include "tandem/tune/tune.h"
#include "tune/tune_testing.h"

namespace tandem::tune {
namespace {

using schedule::Move;
using schedule::Recipe;

// Runs the plan runner, then sleeps by the recipe: 110 ms, less 40 when the first collective is
// fused(RS-C-AG), less 30 when the second overlaps with its matmul, less 32 more at 2 blocks (every
// gap wider than a loaded 2-core machine's scheduling delays under the sanitizers, which flipped
// 8 and 16 ms gaps).
class ByRecipeExecutor final : public Executor {
 public:
  explicit ByRecipeExecutor(dsl::Program p)
      : program_(std::move(p)), inner_(executor_of(exec::RunnerKind::Plan)) {}
  std::string name() const override { return "by-recipe"; }
  std::unique_ptr<exec::Runner> prepare(const schedule::Plan& plan, comm::Communicator& comm,
                                        const dsl::SymbolMap& symbols,
                                        size_t chunk_bytes) override {
    const auto parts = Recipe::parse(plan.name).parts(program_);
    int ms = 110;
    if (parts[0].move == Move::Reorder && parts[0].fuse) ms -= 40;
    if (parts[1].overlap_matmul) ms -= parts[1].blocks == 2 ? 62 : 30;
    return std::make_unique<testing::SlowedRunner>(
        inner_->prepare(plan, comm, symbols, chunk_bytes), std::chrono::milliseconds(ms));
  }

 private:
  dsl::Program program_;
  std::unique_ptr<Executor> inner_;
};

// Runs the plan runner and logs, on rank 0, the chunk size each runner is set up at and the
// process's chunk size at each of its runs.
class ChunkLoggingExecutor final : public Executor {
 public:
  ChunkLoggingExecutor() : inner_(executor_of(exec::RunnerKind::Plan)) {}
  std::string name() const override { return "chunk-logging"; }
  std::unique_ptr<exec::Runner> prepare(const schedule::Plan& plan, comm::Communicator& comm,
                                        const dsl::SymbolMap& symbols,
                                        size_t chunk_bytes) override {
    const bool logged = comm.rank() == 0;  // rank 0's thread alone touches the logs
    if (logged) prepared.push_back(chunk_bytes);
    return std::make_unique<testing::SlowedRunner>(
        inner_->prepare(plan, comm, symbols, chunk_bytes), std::chrono::milliseconds(0),
        testing::SlowedRunner::Alter{}, [this, logged] {
          if (logged) process_at_run.push_back(comm::chunk_bytes());
        });
  }
  std::vector<size_t> prepared, process_at_run;

 private:
  std::unique_ptr<Executor> inner_;
};

TuneOptions two_collectives_options() {
  TuneOptions o;
  o.sizes = {{"N", 37}, {"B", 8}, {"K", 6}, {"H", 5}};
  o.scalars = {{"lr", 0.01}};
  o.reps = 3;
  o.warmup = 0;
  o.final_margin = 0;  // no final round: the first pass decides
  o.write_cache = false;
  o.chunk_bytes = {};
  return o;
}

TEST(Search, TunesTheCollectivesOneAtATimeThenTheBlocks) {
  testing::TempCacheDir dir("per-collective");
  const dsl::Program p = schedule::testing::two_collectives();
  TuneOptions o = two_collectives_options();
  o.executor = std::make_shared<ByRecipeExecutor>(p);
  o.blocks = {2};
  const TuneResult r = tune_threads(p, 2, o);
  const auto parts = Recipe::parse(r.record.winner).parts(p);
  EXPECT_EQ(parts[0].move, Move::Reorder) << r.record.winner;
  EXPECT_TRUE(parts[0].fuse) << r.record.winner;
  EXPECT_TRUE(parts[1].overlap_matmul) << r.record.winner;
  EXPECT_EQ(parts[1].blocks, 2) << r.record.winner;
  for (const auto& c : r.record.candidates) EXPECT_TRUE(c.ok) << c.name << ": " << c.error;
  // The sum of the rounds, not their product.
  const size_t round0 =
      schedule::enumerate_collective(p, std::vector<schedule::CollectiveRecipe>(2), 0).size();
  const size_t all = schedule::enumerate_schedules(p).size();
  EXPECT_GT(r.record.candidates.size(), round0);
  EXPECT_LT(r.record.candidates.size(), all);
  EXPECT_EQ(r.record.candidates.front().name, "AR-C");
  // The first round leaves the second collective unscheduled.
  for (size_t i = 0; i < round0; ++i)
    EXPECT_EQ(Recipe::parse(r.record.candidates[i].name).parts(p)[1], schedule::CollectiveRecipe{})
        << r.record.candidates[i].name;
  EXPECT_EQ(r.record.space, 2560);
  EXPECT_EQ(r.record.left_untimed, 0);
}

TEST(Search, TheBudgetStopsTheSearch) {
  testing::TempCacheDir dir("budget");
  const dsl::Program adam = dsl::workloads::adam(DType::F32);
  TuneOptions o;
  o.sizes = {{"N", 100}};
  o.reps = 1;
  o.executor = executor_of(exec::RunnerKind::Plan);
  o.budget_s = 1e-9;  // spent once the baseline is timed
  const TuneResult r = tune_threads(adam, 2, o);
  ASSERT_EQ(r.record.candidates.size(), 1u);
  EXPECT_EQ(r.record.winner, "AR-C");
  EXPECT_EQ(r.record.left_untimed,
            static_cast<int64_t>(schedule::enumerate_schedules(adam).size()) - 1);
  EXPECT_DOUBLE_EQ(r.record.budget_s, 1e-9);
  // Read back from the cache, the record says the same.
  const TuneResult again = tune_threads(adam, 2, o);
  EXPECT_TRUE(again.from_cache);
  EXPECT_EQ(again.record.left_untimed, r.record.left_untimed);
}

TEST(Search, TheWinnerIsTimedAtEachChunkSize) {
  testing::TempCacheDir dir("chunks");
  const dsl::Program adam = dsl::workloads::adam(DType::F32);
  TuneOptions o;
  o.sizes = {{"N", 5000}};
  o.reps = 2;
  auto logging = std::make_shared<ChunkLoggingExecutor>();
  o.executor = logging;
  o.only = {"fused(RS-C-AG)+slice(m,v)"};
  o.chunk_bytes = {256, 8192};
  comm::set_chunk_bytes(1000);
  const TuneResult r = tune_threads(adam, 2, o);
  EXPECT_EQ(comm::chunk_bytes(), 1000u) << "the process's chunk size is left alone";
  comm::set_chunk_bytes(0);
  // The candidates at the process's size (0), then the winner once per size of the chunk round.
  ASSERT_GE(logging->prepared.size(), 2u);
  EXPECT_EQ(std::vector<size_t>(logging->prepared.end() - 2, logging->prepared.end()),
            (std::vector<size_t>{256, 8192}));
  for (size_t k = 0; k + 2 < logging->prepared.size(); ++k) EXPECT_EQ(logging->prepared[k], 0u);
  for (size_t process : logging->process_at_run)
    EXPECT_EQ(process, 1000u) << "the tuner changed the process's size";
  ASSERT_EQ(r.record.chunks.size(), 2u);
  EXPECT_EQ(r.record.chunks[0].bytes, 256u);
  EXPECT_EQ(r.record.chunks[1].bytes, 8192u);
  for (const ChunkTiming& c : r.record.chunks)
    EXPECT_EQ(c.times.size(), 4u);  // final_reps 0: 2 x reps
  EXPECT_TRUE(r.record.chunk_bytes == 256u || r.record.chunk_bytes == 8192u);
  const ChunkTiming& chosen = r.record.chunks[r.record.chunk_bytes == 256u ? 0 : 1];
  for (const ChunkTiming& c : r.record.chunks) EXPECT_LE(chosen.median(), c.median());
  const TuneResult cached = tune_threads(adam, 2, o);
  EXPECT_TRUE(cached.from_cache);
  EXPECT_EQ(cached.record.chunk_bytes, r.record.chunk_bytes);
  ASSERT_EQ(cached.record.chunks.size(), 2u);
  EXPECT_EQ(cached.record.chunks[1].times, r.record.chunks[1].times);
}

TEST(Search, TheKeyCoversBlocksChunksAndBudget) {
  const dsl::Program layer = dsl::workloads::megatron_layer();
  TuneOptions o;
  o.sizes = {{"B", 8}, {"K", 8}, {"H", 8}};
  comm::run_ranks(2, [&](comm::Communicator& c) {
    const TuneKey base = tune_key(layer, c, o);
    EXPECT_EQ(tune_key(layer, c, o), base);
    EXPECT_EQ(base.ranks, 2);
    EXPECT_EQ(base.nodes, 1);
    EXPECT_EQ(base.backend, "thread");
    TuneOptions blocks = o;
    blocks.blocks = {2, 8};
    EXPECT_NE(tune_key(layer, c, blocks).candidates, base.candidates);
    TuneOptions enumerated = o;
    enumerated.enumerate.blocks = 8;
    EXPECT_NE(tune_key(layer, c, enumerated).candidates, base.candidates);
    TuneOptions chunks = o;
    chunks.chunk_bytes = {size_t{1} << 20};
    EXPECT_NE(tune_key(layer, c, chunks).candidates, base.candidates);
    TuneOptions budget = o;
    budget.budget_s = 30;
    EXPECT_NE(tune_key(layer, c, budget).candidates, base.candidates);
    EXPECT_NE(tune_key(layer, c, chunks).digest(), base.digest());
  });
}

// Two ranks of one node share memory; two nodes of one rank talk over the network: a choice
// timed on one layout is not looked up for the other.
TEST(Search, TheKeyCoversTheNodes) {
  const dsl::Program layer = dsl::workloads::megatron_layer();
  TuneOptions o;
  o.sizes = {{"B", 8}, {"K", 8}, {"H", 8}};
  TuneKey one_node, two_nodes;
  comm::run_ranks(2, [&](comm::Communicator& c) {
    if (c.rank() == 0) one_node = tune_key(layer, c, o);
  });
  comm::set_ranks_per_node(1);
  comm::run_ranks(2, [&](comm::Communicator& c) {
    if (c.rank() == 0) two_nodes = tune_key(layer, c, o);
  });
  comm::set_ranks_per_node(-1);
  EXPECT_EQ(one_node.nodes, 1);
  EXPECT_EQ(two_nodes.nodes, 2);
  EXPECT_NE(one_node.digest(), two_nodes.digest());
  EXPECT_THAT(two_nodes.str(),
              ::testing::HasSubstr("on 2 ranks of 2 nodes (thread, compiled executor)"));
}

}  // namespace
}  // namespace tandem::tune
