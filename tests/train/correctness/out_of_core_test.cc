// Out-of-core training end to end: every plan kind on both slow tiers and on data-, tensor- and
// pipeline-parallel grids gives bitwise the weights of in-core training with the same seed, the
// arena never passes its budget, and its high-water mark is the planner's predicted peak.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <sstream>

#include "tandem/core/bytes.h"
#include "tandem/core/error.h"
#include "tandem/train/trainer.h"
#include "tandem/tune/cache.h"
#include "train/test_util.h"

namespace tandem::train {
namespace {

using testing::ScratchDir;

TrainConfig small(parallel::GridShape grid, int layers) {
  TrainConfig c;
  c.model.n_layers = layers;
  c.model.n_heads = 2;
  c.model.d_model = 32;
  c.model.seq_len = 16;
  c.model.max_positions = 16;
  c.model.dropout = 0.1f;  // recomputed units must draw the same masks
  c.batch = 8;
  c.steps = 3;
  c.lr = 1e-2;
  c.warmup = 1;
  c.seed = 5;
  c.grid = grid;
  c.synthetic_bytes = 1 << 15;
  c.eval_every = 2;  // evaluation's forward runs in the arena too
  c.progress = false;
  c.keep_weights = true;
  c.blas_threads = 1;
  static std::ostringstream sink;
  c.out = &sink;
  return c;
}

struct OutOfCoreCase {
  parallel::GridShape grid;
  int layers;
  const char* plan;
};

void PrintTo(const OutOfCoreCase& c, std::ostream* os) { *os << c.grid.str() << " " << c.plan; }

class OutOfCore : public ::testing::TestWithParam<OutOfCoreCase> {};

TEST_P(OutOfCore, WeightsBitwiseAsInCoreWithinTheBudget) {
  const OutOfCoreCase& cs = GetParam();
  ScratchDir swap;
  const TrainConfig in_core = small(cs.grid, cs.layers);
  const TrainResult ref = train(in_core);
  for (const std::string& tier : {std::string("host"), "file:" + swap.path()}) {
    SCOPED_TRACE(tier);
    TrainConfig c = in_core;
    c.memory_budget = "64MiB";
    c.slow_tier = ooc::TierSpec::parse(tier);
    c.ooc_plan = cs.plan;
    const TrainResult r = train(c);
    EXPECT_EQ(r.ooc_plan, cs.plan);
    ASSERT_EQ(r.weights.size(), ref.weights.size());
    EXPECT_EQ(std::memcmp(r.weights.data(), ref.weights.data(), ref.weights.size() * sizeof(float)),
              0)
        << "weights differ from in-core training";
    EXPECT_EQ(r.losses, ref.losses);
    EXPECT_EQ(r.val_losses, ref.val_losses);
    EXPECT_EQ(r.ooc_high_water, r.ooc_predicted_peak) << "the model's peak is the arena's";
    EXPECT_LE(r.ooc_high_water, parse_bytes(c.memory_budget));
    EXPECT_TRUE(std::filesystem::is_empty(swap.path())) << "the swap file must never be visible";
  }
}

INSTANTIATE_TEST_SUITE_P(PlansAndGrids, OutOfCore,
                         ::testing::Values(OutOfCoreCase{{1, 1, 1}, 4, "SRCKsRCK/p1"},
                                           OutOfCoreCase{{1, 1, 1}, 4, "SSSSSSSS/p0"},
                                           OutOfCoreCase{{1, 1, 1}, 4, "RRRRRRRR/p1"},
                                           OutOfCoreCase{{1, 1, 1}, 4, "RCRCRCRC/p1"},
                                           OutOfCoreCase{{1, 1, 1}, 4, "RCCCCCCC/p2"},
                                           OutOfCoreCase{{1, 1, 1}, 4, "KSKSsKsK/p3"},
                                           OutOfCoreCase{{2, 1, 1}, 3, "SRCKSs/p1"},
                                           OutOfCoreCase{{1, 2, 1}, 3, "RCSsRC/p1"},
                                           OutOfCoreCase{{1, 1, 2}, 4, "SKRK/p1"},
                                           OutOfCoreCase{{1, 1, 2}, 4, "RCRK/p0"},
                                           OutOfCoreCase{{2, 2, 2}, 4, "SsRK/p1"}));

// The planner's own choice, at the smallest budget it can work with, on a tensor-parallel grid
// (whose ranks must agree on which units they recompute).
TEST(OutOfCorePlanner, TightBudgetBitwiseAndHighWaterIsThePredictedPeak) {
  const TrainConfig in_core = small({1, 2, 1}, 4);
  const TrainResult ref = train(in_core);
  TrainConfig c = in_core;
  c.memory_budget = "1GiB";
  c.ooc_plan = "KKKKKKKK/p1";
  const TrainResult all_kept = train(c);
  c.ooc_plan.clear();
  c.memory_budget = "60%";  // of the in-core need, which is the keep-all plan's high-water mark
  const TrainResult r = train(c);
  EXPECT_NE(r.ooc_plan, "KKKKKKKK/p1");
  EXPECT_EQ(std::memcmp(r.weights.data(), ref.weights.data(), ref.weights.size() * sizeof(float)),
            0);
  EXPECT_LE(r.ooc_high_water, all_kept.ooc_high_water * 6 / 10);
  EXPECT_EQ(r.ooc_high_water, r.ooc_predicted_peak);
}

// The profile is measured once per model, batch, grid, threads and tier kind, then read back.
TEST(OutOfCoreProfile, MeasuredOnceThenCached) {
  ScratchDir dir;
  setenv("TANDEM_CACHE_DIR", dir.path("cache").c_str(), 1);
  TrainConfig c = small({1, 1, 1}, 2);
  c.executor = exec::RunnerKind::Plan;  // nothing to compile in the fresh cache
  c.memory_budget = "64MiB";
  c.steps = 1;
  const TrainResult first = train(c);
  EXPECT_FALSE(first.ooc_profile_cached);
  ASSERT_EQ(dir.list("cache/ooc").size(), 1u);
  // Keyed by this build too: a rebuilt tandem (other kernels, other times) measures again.
  const std::string cached =
      tandem::testing::read_bytes(dir.path("cache/ooc/" + dir.list("cache/ooc").front()));
  EXPECT_NE(tune::build_id(), "unknown build");
  EXPECT_NE(cached.find(tune::build_id()), std::string::npos) << cached;
  const TrainResult second = train(c);
  EXPECT_TRUE(second.ooc_profile_cached);
  EXPECT_EQ(second.ooc_plan, first.ooc_plan);
  c.model.d_model = 64;  // another model: measured again, kept beside the first
  EXPECT_FALSE(train(c).ooc_profile_cached);
  EXPECT_EQ(dir.list("cache/ooc").size(), 2u);
  unsetenv("TANDEM_CACHE_DIR");
}

// Each pipeline stage caches its own profile, but measuring runs the pipeline: a stage whose
// profile is missing (another run writing it now, a run stopped between two stages' writes) makes
// every stage measure, rather than wait for peers that read theirs and went on.
TEST(OutOfCoreProfile, AStageWithoutItsProfileMeasuresWithTheOthers) {
  ScratchDir dir;
  setenv("TANDEM_CACHE_DIR", dir.path("cache").c_str(), 1);
  TrainConfig c = small({1, 1, 2}, 4);
  c.executor = exec::RunnerKind::Plan;
  c.memory_budget = "64MiB";
  c.steps = 1;
  c.comm_timeout_s = 60;  // fails in a minute rather than the default's ten
  EXPECT_FALSE(train(c).ooc_profile_cached);
  const std::vector<std::string> profiles = dir.list("cache/ooc");
  ASSERT_EQ(profiles.size(), 2u) << "one a stage";
  for (const std::string& gone : profiles) {
    const TrainResult full = train(c);
    EXPECT_TRUE(full.ooc_profile_cached);
    std::filesystem::remove(dir.path("cache/ooc/" + gone));
    const TrainResult r = train(c);
    EXPECT_FALSE(r.ooc_profile_cached) << "without " << gone;
    EXPECT_EQ(r.losses, full.losses);
    EXPECT_EQ(dir.list("cache/ooc").size(), 2u) << "written again";
  }
  unsetenv("TANDEM_CACHE_DIR");
}

// --trace: swap-out and swap-in rows beside compute; tandem plan: the predicted timeline.
TEST(OutOfCoreTrace, SwapRowsInTheTraceAndThePredictedTimeline) {
  ScratchDir dir;
  TrainConfig c = small({1, 1, 1}, 2);
  c.memory_budget = "64MiB";
  c.ooc_plan = "SKsK/p1";
  c.trace_path = dir.path("trace.json");
  train(c);
  const std::string trace = testing::read_bytes(c.trace_path);
  for (const char* row : {"\"swap-out\"", "\"swap-in\"", "\"compute\""})
    EXPECT_NE(trace.find(row), std::string::npos) << row;
  EXPECT_NE(trace.find("\"m0.h0.attn\""), std::string::npos)
      << "transfers are named by micro-batch and unit";
  EXPECT_NE(trace.find("\"m0.h1.attn\""), std::string::npos);
  EXPECT_NE(trace.find("\"forward h.1.mlp\""), std::string::npos) << "compute rows name the half";

  TrainConfig p = small({1, 1, 1}, 2);
  p.memory_budget = "64MiB";
  p.plan_only = true;
  p.trace_path = dir.path("plan.json");
  const TrainResult r = train(p);
  EXPECT_FALSE(r.ooc_plan.empty());
  EXPECT_GT(r.ooc_predicted_s, 0);
  EXPECT_TRUE(r.losses.empty()) << "tandem plan trains nothing";
  const std::string timeline = testing::read_bytes(p.trace_path);
  EXPECT_NE(timeline.find("\"traceEvents\""), std::string::npos);
  EXPECT_NE(timeline.find("forward m0 h1.mlp"), std::string::npos);
}

}  // namespace
}  // namespace tandem::train
