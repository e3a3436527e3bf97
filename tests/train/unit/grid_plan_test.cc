// The plan across grids at stated rates: which grids of 4 ranks a model allows and why the others
// are refused, every listed configuration within the limit per rank, the recommendation the
// fastest prediction, the one error naming the smallest memory per rank that works, and the
// memory estimate's sharded blocks.
#include "tandem/train/grid_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <regex>
#include <sstream>

#include "tandem/core/bytes.h"
#include "tandem/parallel/shard.h"
#include "tandem/parallel/sharded_blocks.h"
#include "tandem/train/memory_estimate.h"
#include "train/test_util.h"

namespace tandem::train {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;
using testing::user_error_of;

// 2 layers, 2 heads, a batch of 6: of the grids of 4 ranks, pp 4 has too few layers, tp 4 too few
// heads, dp 4 does not divide the batch.
TrainConfig model() {
  TrainConfig c = testing::tiny_run(1);
  c.model.d_model = 32;
  c.batch = 6;
  return c;
}

Rates rates() {
  Rates r;
  for (int tp : {1, 2, 4}) r.gemm_flops_per_s[tp] = 1e10;
  r.link_bytes_per_s = 1e9;
  r.link_latency_s = 1e-5;
  r.swap_tier = {1e9, 1e9};
  r.state_tier = {1e9, 1e9};
  return r;
}

// The most any rank of the option's run needs (every tp rank of every stage).
uint64_t largest_rank(const GridOption& o) {
  uint64_t most = 0;
  for (int s = 0; s < o.cfg.grid.pp; ++s)
    for (int t = 0; t < o.cfg.grid.tp; ++t) {
      const RankMemory m = rank_memory(o.cfg, t, s);
      most = std::max(most, o.cfg.memory_budget.empty()
                                ? m.in_core()
                                : m.with_budget(parse_bytes(o.cfg.memory_budget)));
    }
  return most;
}

TEST(GridPlan, TheGridsOfFourRanksAndWhyOthersAreRefused) {
  const GridCandidates c = candidate_grids(model(), 4);
  std::vector<std::string> allowed;
  for (const parallel::GridShape& g : c.allowed) allowed.push_back(g.str());
  EXPECT_THAT(allowed, UnorderedElementsAre("dp=1 tp=2 pp=2", "dp=2 tp=1 pp=2", "dp=2 tp=2 pp=1",
                                            "dp=2 tp=1 pp=1 cp=2", "dp=1 tp=2 pp=1 cp=2",
                                            "dp=1 tp=1 pp=2 cp=2", "dp=1 tp=1 pp=1 cp=4"));
  std::vector<std::string> refused;
  for (const Refusal& r : c.refused) refused.push_back(r.what + ": " + r.why);
  EXPECT_THAT(refused, UnorderedElementsAre(
                           "dp=1 tp=1 pp=4: --pp 4 needs at least 4 layers; the model has 2",
                           "dp=1 tp=4 pp=1: --tp 4 must divide the number of heads (2)",
                           "dp=4 tp=1 pp=1: --batch 6 does not split evenly over --dp 4 "
                           "data-parallel ranks"));
}

// Every grid with dp >= 2 is also planned with --shard weights, and with --model-state naming a
// tier, with the blocks streamed (and with dp >= 2 each rank's slices streamed); a pipeline's
// rows split into more micro-batches where that is predicted faster (6 rows: 6 rather than the
// automatic 3; the 2 layers of pp 2 have no other split).
bool as_flagged(const GridOption& o) {
  return o.cfg.micro_batches == 0 && o.cfg.grid.stage_layers.empty();
}

TEST(GridPlan, ConfigurationsOfEachGrid) {
  const GridPlan p = plan_grids(model(), 4, 1ull << 30, rates());
  std::vector<std::string> listed;
  for (const GridOption& o : p.options) listed.push_back(o.describe());
  EXPECT_THAT(listed, UnorderedElementsAre(
                          "dp=1 tp=2 pp=2, --shard moments, blocks in memory, in-core",
                          "dp=1 tp=2 pp=2, 6 micro-batches, --shard moments, blocks in memory, "
                          "in-core",
                          "dp=2 tp=1 pp=2, --shard moments, blocks in memory, in-core",
                          "dp=2 tp=1 pp=2, --shard weights, blocks in memory, in-core",
                          "dp=2 tp=2 pp=1, --shard moments, blocks in memory, in-core",
                          "dp=2 tp=2 pp=1, --shard weights, blocks in memory, in-core",
                          "dp=2 tp=1 pp=1 cp=2, --shard moments, blocks in memory, in-core",
                          "dp=2 tp=1 pp=1 cp=2, --shard weights, blocks in memory, in-core",
                          "dp=1 tp=2 pp=1 cp=2, --shard moments, blocks in memory, in-core",
                          "dp=1 tp=1 pp=2 cp=2, --shard moments, blocks in memory, in-core",
                          "dp=1 tp=1 pp=1 cp=4, --shard moments, blocks in memory, in-core"));
  TrainConfig streamed = model();
  streamed.model_state = ooc::TierSpec{};  // host
  const GridPlan q = plan_grids(streamed, 4, 1ull << 30, rates());
  EXPECT_EQ(std::count_if(q.options.begin(), q.options.end(), as_flagged), 20);
  EXPECT_EQ(std::count_if(
                q.options.begin(), q.options.end(),
                [](const GridOption& o) { return as_flagged(o) && o.cfg.model_state.has_value(); }),
            10);
  EXPECT_EQ(std::count_if(q.options.begin(), q.options.end(),
                          [](const GridOption& o) {
                            return as_flagged(o) && o.cfg.model_state.has_value() &&
                                   o.cfg.optimizer.sharding == parallel::Sharding::Weights;
                          }),
            3);
  // Each other option is a pipeline's micro-batch count, on a grid listed as flagged too.
  for (const GridOption& o : q.options) {
    if (as_flagged(o)) continue;
    EXPECT_GE(o.cfg.grid.pp, 2) << o.describe();
    EXPECT_GT(o.cfg.micro_batches, 0) << o.describe();
  }
}

// The least memory per rank the error names, as bytes.
uint64_t smallest_that_works(int ranks) {
  const std::string e = user_error_of([&] { plan_grids(model(), ranks, 1024, rates()); });
  std::smatch m;
  if (!std::regex_search(e, m, std::regex("--memory-per-rank ([0-9]+[KMG]iB)"))) {
    ADD_FAILURE() << e;
    return 0;
  }
  return parse_bytes(m[1].str());
}

// At limits from roomy to the least that works, every configuration listed fits, and the
// recommendation is the fastest prediction or the simplest of those tied with it.
TEST(GridPlan, EveryConfigurationFitsAndTheFastestIsRecommended) {
  const GridPlan roomy = plan_grids(model(), 4, 1ull << 30, rates());
  uint64_t in_core = UINT64_MAX;
  for (const GridOption& o : roomy.options) in_core = std::min(in_core, o.memory_per_rank);
  const uint64_t least = smallest_that_works(4);
  ASSERT_LT(least, in_core);
  for (const uint64_t limit : {uint64_t{1} << 30, in_core, (in_core + least) / 2, least}) {
    SCOPED_TRACE(human_bytes(limit));
    const GridPlan p = plan_grids(model(), 4, limit, rates());
    ASSERT_FALSE(p.options.empty());
    double fastest = p.options.front().step_s;
    for (const GridOption& o : p.options) {
      SCOPED_TRACE(o.describe());
      EXPECT_LE(o.memory_per_rank, limit);
      EXPECT_EQ(largest_rank(o), o.memory_per_rank);
      EXPECT_EQ(o.cfg.memory_budget.empty(), o.activations == "in-core");
      EXPECT_GT(o.step_s, 0);
      EXPECT_EQ(o.step_s, o.breakdown.total());
      EXPECT_EQ(o.breakdown.update, 0);  // the stated rates measure no update
      EXPECT_EQ(o.breakdown.other, 0);
      fastest = std::min(fastest, o.step_s);
    }
    // The recommendation: the first by the tie rule of those tied with the fastest.
    EXPECT_EQ(p.options.front().step_s, fastest);
    EXPECT_LE(p.best().step_s, fastest * (1 + kPlanTieFraction));
    for (size_t i = 0; i < p.ties(); ++i) {
      if (i != p.recommended) {
        EXPECT_TRUE(preferred_in_tie(p.best(), p.options[i]));
      }
    }
    for (size_t i = p.ties(); i < p.options.size(); ++i)
      EXPECT_GT(p.options[i].step_s, fastest * (1 + kPlanTieFraction));
    EXPECT_TRUE(std::is_sorted(
        p.options.begin(), p.options.end(),
        [](const GridOption& a, const GridOption& b) { return a.step_s < b.step_s; }));
  }
}

// The trainer's prediction of a configuration as configured (the end's predicted breakdown) is
// the plan's of it: in-core and under the --memory-budget the plan gave it.
TEST(GridPlan, PredictStepIsThePlansPrediction) {
  const uint64_t least = smallest_that_works(4);
  for (const uint64_t limit : {uint64_t{1} << 30, least}) {
    const GridPlan p = plan_grids(model(), 4, limit, rates());
    for (const GridOption& o : p.options) {
      SCOPED_TRACE(o.describe());
      const perf::StepBreakdown b = predict_step(o.cfg, p.rates);
      EXPECT_DOUBLE_EQ(b.total(), o.step_s);
      EXPECT_DOUBLE_EQ(b.compute, o.breakdown.compute);
      EXPECT_DOUBLE_EQ(b.exposed_io, o.breakdown.exposed_io);
    }
  }
}

// Below the least any configuration needs: one error naming that memory, which then works, and
// the configuration needing it.
TEST(GridPlan, ATooSmallLimitNamesTheSmallestMemoryThatWorks) {
  const std::string e = user_error_of([] { plan_grids(model(), 4, 1024, rates()); });
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      e, m,
      std::regex("^no grid of 4 ranks fits 1.00 KiB a rank: the smallest memory per rank that "
                 "works is [0-9.]+ [KM]iB \\(--memory-per-rank ([0-9]+[KMG]iB)\\), with (dp=. tp=. "
                 "pp=.)(, [0-9]+ micro-batches)?, --shard (moments|weights), blocks in memory(, "
                 "activations out-of-core)?$")))
      << e;
  const uint64_t smallest = parse_bytes(m[1].str());
  const GridPlan p = plan_grids(model(), 4, smallest, rates());
  EXPECT_TRUE(std::any_of(p.options.begin(), p.options.end(),
                          [&](const GridOption& o) { return o.cfg.grid.str() == m[2].str(); }));
  EXPECT_THAT(user_error_of([&] { plan_grids(model(), 4, smallest - 1024, rates()); }),
              HasSubstr("the smallest memory per rank that works"));
}

TEST(GridPlan, NoGridOfTheRanks) {
  EXPECT_EQ(user_error_of([] { plan_grids(model(), 5, 1ull << 30, rates()); }),
            "no grid of 5 ranks suits this model and batch: dp=1 tp=1 pp=5: --pp 5 needs at least "
            "5 layers; the model has 2; dp=1 tp=5 pp=1: --tp 5 must divide the number of heads "
            "(2); dp=5 tp=1 pp=1: --batch 6 does not split evenly over --dp 5 data-parallel ranks; "
            "and 1 more");
  EXPECT_EQ(user_error_of([] { candidate_grids(model(), 0); }), "--ranks 0 must be at least 1");
}

// A slow link makes the tensor-parallel grids' all-reduces the larger part of their step.
TEST(GridPlan, ASlowerLinkSlowsTensorParallelism) {
  Rates slow = rates();
  slow.link_bytes_per_s /= 100;
  auto step_of = [](const GridPlan& p, const std::string& grid) {
    for (const GridOption& o : p.options)
      if (o.cfg.grid.str() == grid) return o;
    ADD_FAILURE() << grid << " not planned";
    return GridOption{};
  };
  const GridPlan fast_p = plan_grids(model(), 4, 1ull << 30, rates());
  const GridPlan slow_p = plan_grids(model(), 4, 1ull << 30, slow);
  const GridOption a = step_of(fast_p, "dp=1 tp=2 pp=2"), b = step_of(slow_p, "dp=1 tp=2 pp=2");
  EXPECT_GT(b.breakdown.exposed_exchange, 10 * a.breakdown.exposed_exchange);
  EXPECT_GT(b.step_s, a.step_s);
  EXPECT_GT(a.breakdown.bubble, 0);  // pp 2
  EXPECT_EQ(step_of(fast_p, "dp=2 tp=2 pp=1").breakdown.bubble, 0);
}

// --shard weights: the blocks' weights, gradients and moments are what the sharded model state
// keeps of them; the rest of the shard as before.
TEST(MemoryEstimate, ShardedWeightsCountTheShardedBlocks) {
  TrainConfig c = model();
  c.grid = {2, 1, 1};
  c.optimizer.sharding = parallel::Sharding::Weights;
  const MemoryEstimate e = estimate_memory(c);
  const parallel::ShardLayout layout(c.model, c.grid, 0, 0);
  const int64_t block = layout.block_floats();
  EXPECT_EQ(e.sharded_blocks,
            2 * parallel::ShardedBlocks::state_bytes(block, 2, 2, c.micro_batch_count(), 1));
  EXPECT_EQ(e.parameters, 2 * static_cast<uint64_t>(layout.size() - 2 * block) * sizeof(float));
  EXPECT_THAT(e.str(), HasSubstr("sharded blocks (--shard weights)"));
  c.optimizer.sharding = parallel::Sharding::Moments;
  EXPECT_EQ(estimate_memory(c).sharded_blocks, 0u);
}

// Each block gathered further ahead holds one more gathered block on every rank: the estimate
// grows by exactly one block's weights a rank per step of --gather-ahead.
TEST(MemoryEstimate, EachBlockGatheredAheadCountsOneMoreSlot) {
  TrainConfig c = model();
  c.grid = {2, 1, 1};
  c.optimizer.sharding = parallel::Sharding::Weights;
  const parallel::ShardLayout layout(c.model, c.grid, 0, 0);
  const uint64_t block = static_cast<uint64_t>(layout.block_floats()) * sizeof(float);
  c.gather_ahead = 1;
  const MemoryEstimate one = estimate_memory(c);
  EXPECT_EQ(estimate_memory(model()).sharded_blocks, 0u);
  for (int d = 2; d <= 3; ++d) {
    c.gather_ahead = d;
    const MemoryEstimate e = estimate_memory(c);
    EXPECT_EQ(e.sharded_blocks - one.sharded_blocks, 2 * (d - 1) * block) << "D=" << d;
    EXPECT_EQ(e.total() - one.total(), 2 * (d - 1) * block) << "D=" << d;
  }
  c.model_state = ooc::TierSpec{};  // the slices streamed: the gather slots stay in memory
  c.gather_ahead = 1;
  const uint64_t streamed = estimate_memory(c).sharded_blocks;
  c.gather_ahead = 2;
  EXPECT_EQ(estimate_memory(c).sharded_blocks - streamed, 2 * block);
}

// --gather-ahead auto: the fewest blocks whose compute covers a gather, within the stage's
// blocks - 1, and at least one.
TEST(GridPlan, GatherAheadCoversAGather) {
  EXPECT_EQ(gather_ahead_for(3e-3, 1e-3, 10), 3);
  EXPECT_EQ(gather_ahead_for(2.5e-3, 1e-3, 10), 3);
  EXPECT_EQ(gather_ahead_for(1e-3, 1e-3, 10), 1);
  EXPECT_EQ(gather_ahead_for(0.5e-3, 1e-3, 10), 1);  // compute dominates
  EXPECT_EQ(gather_ahead_for(3e-3, 1e-3, 3), 2);     // 3 slots hold the stage's 3 blocks
  EXPECT_EQ(gather_ahead_for(3e-3, 1e-3, 1), 1);
  EXPECT_EQ(gather_ahead_for(0, 1e-3, 10), 1);

  TrainConfig c = model();
  c.model.n_layers = 8;
  c.grid = {2, 1, 1};
  c.optimizer.sharding = parallel::Sharding::Weights;
  Rates r = rates();
  const GatherTiming t = gather_timing(c, r);
  // The link slowed until a gather takes 2.5 blocks' forward: 3 blocks ahead.
  r.link_bytes_per_s *= (t.gather_s - r.link_latency_s) / (2.5 * t.block_forward_s);
  r.link_latency_s = 0;
  TrainConfig slow = c;
  choose_gather_ahead(slow, r);
  EXPECT_EQ(slow.gather_ahead.value(), 3);
  EXPECT_THAT(slow.gather_ahead.reason(), HasSubstr("--gather-ahead auto: a gather "));
  c.gather_ahead = 2;  // given: kept
  choose_gather_ahead(c, r);
  EXPECT_EQ(c.gather_ahead, Auto<int>(2));
}

// The plan gives every sharded configuration the prefetch distance auto chooses at its rates,
// counts its memory with it and names it among the flags.
TEST(GridPlan, ShardedConfigurationsGatherAheadByTheRule) {
  const GridPlan p = plan_grids(model(), 4, 1ull << 30, rates());
  int sharded = 0;
  for (const GridOption& o : p.options) {
    if (o.cfg.optimizer.sharding != parallel::Sharding::Weights) {
      EXPECT_FALSE(o.cfg.gather_ahead.known()) << o.describe();
      continue;
    }
    ++sharded;
    const GatherTiming t = gather_timing(o.cfg, p.rates);
    EXPECT_EQ(o.cfg.gather_ahead.value(),
              gather_ahead_for(t.gather_s, t.block_forward_s, o.cfg.model.n_layers / o.cfg.grid.pp))
        << o.describe();
    EXPECT_EQ(o.memory_per_rank, largest_rank(o)) << o.describe();
  }
  EXPECT_EQ(sharded, 3);
  EXPECT_THAT(grid_plan_report(p), HasSubstr("--shard weights --gather-ahead 1"));
}

// Context-parallel grids are offered only where --cp would run: the sequence cuts into 2 cp
// chunks, no dropout, the fused attention; a cp ruled out for every grid is one refusal.
TEST(GridPlan, ContextParallelGridsOnlyWhereLegal) {
  auto cps = [](const GridCandidates& c) {
    std::vector<int> v;
    for (const parallel::GridShape& g : c.allowed) v.push_back(g.cp);
    return v;
  };
  auto refused = [](const GridCandidates& c) {
    std::vector<std::string> v;
    for (const Refusal& r : c.refused)
      if (r.what.starts_with("grids with")) v.push_back(r.what + ": " + r.why);
    return v;
  };
  EXPECT_THAT(cps(candidate_grids(model(), 4)), ::testing::Contains(4));
  TrainConfig twelve = model();  // 2 cp = 4 divides 12, 8 does not
  twelve.model.seq_len = twelve.model.max_positions = 12;
  const GridCandidates t = candidate_grids(twelve, 4);
  EXPECT_THAT(cps(t), ::testing::Contains(2));
  EXPECT_THAT(cps(t), ::testing::Not(::testing::Contains(4)));
  EXPECT_THAT(refused(t), UnorderedElementsAre(
                              "grids with cp=4: --cp 4 cuts each sequence into 8 equal chunks (two "
                              "a rank, balanced for the causal mask), which --seq-len 12 does not "
                              "divide into: give a --seq-len that is a multiple of 8"));
  TrainConfig dropout = model();
  dropout.model.dropout = 0.1f;
  TrainConfig unfused = model();
  unfused.model.attention = nn::AttentionKernel::Unfused;
  for (const TrainConfig& c : {dropout, unfused}) {
    const GridCandidates g = candidate_grids(c, 4);
    EXPECT_THAT(cps(g), ::testing::Each(1));
    EXPECT_EQ(refused(g).size(), 2u);  // cp=2 and cp=4
  }
  EXPECT_THAT(refused(candidate_grids(dropout, 4)),
              ::testing::Contains(HasSubstr("--cp 2 does not support --dropout yet")));
  // A cp configuration is planned in-core only (--memory-budget is refused with --cp), and the
  // end of a run predicts it as the plan did.
  const GridPlan p = plan_grids(model(), 4, 1ull << 30, rates());
  for (const GridOption& o : p.options) {
    if (o.cfg.grid.cp == 1) continue;
    EXPECT_EQ(o.activations, "in-core") << o.describe();
    EXPECT_GT(o.breakdown.exposed_exchange, 0) << o.describe();  // the key/value exchanges
  }
}

GridOption option(const std::string& flags, double step_s, double link_bytes) {
  GridOption o;
  o.cfg = model();
  std::istringstream in(flags);
  std::string word;
  while (in >> word) {
    int* axis = word == "dp"   ? &o.cfg.grid.dp
                : word == "tp" ? &o.cfg.grid.tp
                : word == "pp" ? &o.cfg.grid.pp
                : word == "cp" ? &o.cfg.grid.cp
                               : nullptr;
    if (axis != nullptr) in >> *axis;
    if (word == "weights") o.cfg.optimizer.sharding = parallel::Sharding::Weights;
  }
  o.step_s = step_s;
  o.breakdown.compute = step_s;
  o.breakdown.link_bytes = link_bytes;
  return o;
}

// The tie rule: of the options within the stated error of the fastest, the fewest bytes over the
// link, then the simplest, then the grid; whatever order they come in, the same choice.
TEST(GridPlan, TiesAreBrokenByAFixedRule) {
  const double f = 1 + kPlanTieFraction;
  std::vector<GridOption> options = {
      option("dp 4", 1.0, 500),                  // the fastest, the most bytes
      option("dp 2 pp 2", 1.0 * f * 0.99, 100),  // tied
      option("dp 2 tp 2 weights", 1.02, 100),    // tied, as few bytes, sharded: less simple
      option("pp 4", 1.0 * f * 1.01, 0),         // fewest bytes, but not tied
  };
  EXPECT_EQ(tied_with_fastest(options), 3u);
  std::vector<size_t> order = {0, 1, 2, 3};
  do {
    std::vector<GridOption> shuffled;
    for (size_t i : order) shuffled.push_back(options[i]);
    EXPECT_EQ(shuffled[recommended_of(shuffled)].cfg.grid.str(), "dp=2 tp=1 pp=2");
  } while (std::next_permutation(order.begin(), order.end()));
  // Equal bytes and as simple: the grid decides, dp first.
  EXPECT_TRUE(preferred_in_tie(option("dp 1 pp 2", 1, 7), option("dp 2 pp 2", 1, 7)));
  EXPECT_FALSE(preferred_in_tie(option("dp 2 pp 2", 1, 7), option("dp 1 pp 2", 1, 7)));
  // Fewer tensor-parallel ranks are simpler, whatever the grid's order says.
  EXPECT_TRUE(preferred_in_tie(option("dp 2 tp 1 pp 2", 1, 7), option("dp 1 tp 2 pp 2", 1, 7)));
  // Fewer cp ranks are simpler.
  EXPECT_TRUE(preferred_in_tie(option("dp 2 pp 2", 1, 7), option("dp 2 cp 2", 1, 7)));
}

// Two plans at the same rates, and at rates a little off each other, recommend the same
// configuration; the report marks the ties and states the rule.
TEST(GridPlan, RepeatedPlansRecommendTheSame) {
  const GridPlan a = plan_grids(model(), 4, 1ull << 30, rates());
  const GridPlan b = plan_grids(model(), 4, 1ull << 30, rates());
  EXPECT_EQ(a.best().describe(), b.best().describe());
  EXPECT_EQ(grid_plan_report(a), grid_plan_report(b));
  // A plan with ties: the table marks them, the recommendation states the rule.
  GridPlan tied;
  tied.ranks = 4;
  tied.memory_per_rank = 1ull << 30;
  tied.options = {option("dp 2 pp 2", 1.0, 500), option("dp 2 tp 2", 1.05, 100),
                  option("tp 2 pp 2", 1.5, 0)};
  tied.recommended = recommended_of(tied.options);
  ASSERT_EQ(tied.ties(), 2u);
  const std::string report = grid_plan_report(tied);
  EXPECT_THAT(report, HasSubstr("\n* dp=2 tp=2 pp=1 "));
  EXPECT_THAT(report, HasSubstr("\n= dp=2 tp=1 pp=2 "));
  EXPECT_THAT(report, HasSubstr("\n  dp=1 tp=2 pp=2 "));
  EXPECT_THAT(report, HasSubstr("2 configurations (marked = and *) are predicted within 10% of "
                                "the fastest, the model's stated error: a tie, broken by a fixed "
                                "rule: the even split of the layers and the micro-batches as "
                                "given first, then the fewest bytes over the link a step"));
  EXPECT_THAT(grid_choice_line(tied),
              HasSubstr("chosen of 3 configurations of 4 ranks that fit 1.00 GiB a rank, predicted "
                        "1.0500 s a step; 2 of them predicted within 10% of the fastest"));
  // Compute 2% faster and the link 2% slower: the tied set and so the choice stay.
  Rates off = rates();
  for (auto& [tp, f] : off.gemm_flops_per_s) f *= 1.02;
  off.link_bytes_per_s *= 0.98;
  const GridPlan c = plan_grids(model(), 4, 1ull << 30, off);
  std::vector<std::string> tied_a, tied_c;
  for (size_t i = 0; i < a.ties(); ++i) tied_a.push_back(a.options[i].describe());
  for (size_t i = 0; i < c.ties(); ++i) tied_c.push_back(c.options[i].describe());
  std::sort(tied_a.begin(), tied_a.end());
  std::sort(tied_c.begin(), tied_c.end());
  ASSERT_EQ(tied_a, tied_c);
  EXPECT_EQ(a.best().describe(), c.best().describe());
}

// ------------------------------------------------ the pipeline's split and micro-batches searched

// Compute slow enough that the matmuls, not the link's latency, make a tiny model's step.
Rates compute_bound_rates() {
  Rates r = rates();
  for (auto& [tp, f] : r.gemm_flops_per_s) f = 1e7;
  return r;
}

// 4 layers 8 wide under a vocabulary of 256: the head's matmul is about two blocks', so the last
// stage of an even split (2 blocks and the head) is twice the first's. One head, 3 rows and 18
// tokens leave 2 ranks one grid, dp=1 tp=1 pp=2 (no tp, dp or cp fits).
TrainConfig head_heavy(int64_t batch = 3) {
  TrainConfig c = model();
  c.model.n_layers = 4;
  c.model.n_heads = 1;
  c.model.d_model = 8;
  c.model.seq_len = 18;
  c.model.max_positions = 18;
  c.batch = batch;
  return c;
}

const GridOption* find_option(const GridPlan& p, const parallel::StageLayers& split, int micro) {
  for (const GridOption& o : p.options)
    if (o.cfg.grid.pp == 2 && o.cfg.grid.dp == 1 && o.cfg.grid.stage_layers == split &&
        o.cfg.micro_batches == micro)
      return &o;
  return nullptr;
}

// With the head heavy, moving a layer off the last stage is predicted faster beyond the model's
// stated error, and recommended; the report and --grid auto's line name the split as its flag,
// and the trainer's prediction of it (read from the same split) is the plan's.
TEST(GridPlanPipeline, AHeavyHeadMovesLayersOffTheLastStage) {
  const Rates r = compute_bound_rates();
  const GridPlan p = plan_grids(head_heavy(), 2, 1ull << 30, r);
  const GridOption* even = find_option(p, {}, 0);
  const GridOption* moved = find_option(p, {3, 1}, 0);
  ASSERT_NE(even, nullptr);
  ASSERT_NE(moved, nullptr);
  EXPECT_GT(even->step_s, moved->step_s * (1 + kPlanTieFraction));
  EXPECT_EQ(p.best().cfg.grid.stage_layers.str(), "3,1");
  EXPECT_THAT(grid_plan_report(p),
              HasSubstr("recommended: --dp 1 --tp 1 --pp 2 --stage-layers 3,1 (in-core)"));
  EXPECT_THAT(grid_choice_line(p),
              HasSubstr("--grid auto: --dp 1 --tp 1 --pp 2 --stage-layers 3,1"));
  EXPECT_DOUBLE_EQ(predict_step(moved->cfg, r).total(), moved->step_s);
  // The split moves compute, not memory it cannot hold: its stages' needs are the estimate's.
  EXPECT_EQ(largest_rank(*moved), moved->memory_per_rank);
  EXPECT_GT(rank_memory(moved->cfg, 0, 0).in_core(), rank_memory(even->cfg, 0, 0).in_core());
}

// A pipeline's rows split into more micro-batches shrink the bubble: with 8 rows, 8 micro-batches
// on the moved split beat the automatic 4.
TEST(GridPlanPipeline, MoreMicroBatchesShrinkTheBubble) {
  const Rates r = compute_bound_rates();
  const GridPlan p = plan_grids(head_heavy(8), 2, 1ull << 30, r);
  const GridOption* even = find_option(p, {}, 0);
  const GridOption* best = find_option(p, {3, 1}, 8);
  ASSERT_NE(even, nullptr);
  ASSERT_NE(best, nullptr);
  EXPECT_LT(best->breakdown.bubble, even->breakdown.bubble / 2);
  EXPECT_LT(best->step_s, even->step_s);
  EXPECT_THAT(grid_plan_report(p), HasSubstr("--pp 2 --stage-layers 3,1 --micro-batches 8"));
  // Micro-batches given are kept: none is searched.
  TrainConfig given = head_heavy(8);
  given.micro_batches = 2;
  for (const GridOption& o : plan_grids(given, 2, 1ull << 30, r).options)
    EXPECT_EQ(o.cfg.micro_batches, 2) << o.describe();
}

// Balanced stages (a wide model, the head a third of a block) keep the even split: no other is
// predicted faster, so none is listed.
TEST(GridPlanPipeline, BalancedStagesKeepTheEvenSplit) {
  for (const int layers : {4, 5}) {
    TrainConfig c = head_heavy();
    c.model.d_model = 64;
    c.model.n_layers = layers;
    const GridPlan p = plan_grids(c, 2, 1ull << 30, compute_bound_rates());
    for (const GridOption& o : p.options)
      EXPECT_TRUE(o.cfg.grid.stage_layers.empty()) << o.describe();
    EXPECT_TRUE(p.best().cfg.grid.stage_layers.empty());
  }
}

// Within the stated error the flags' split and micro-batches win, whatever the link bytes say.
TEST(GridPlanPipeline, TiesPreferTheEvenSplitAndTheGivenMicroBatches) {
  GridOption even = option("pp 2", 1.0, 500), split = option("pp 2", 0.95, 100);
  split.cfg.grid.stage_layers = {1, 1};
  GridOption micro = option("pp 2", 0.95, 100);
  micro.cfg.micro_batches = 6;
  EXPECT_TRUE(preferred_in_tie(even, split));
  EXPECT_FALSE(preferred_in_tie(split, even));
  EXPECT_TRUE(preferred_in_tie(even, micro));
  EXPECT_TRUE(preferred_in_tie(micro, split));  // a count changed is less than a split
  std::vector<GridOption> options = {split, micro, even};
  EXPECT_TRUE(options[recommended_of(options)].cfg.grid.stage_layers.empty());
  EXPECT_EQ(options[recommended_of(options)].cfg.micro_batches, 0);
}

}  // namespace
}  // namespace tandem::train
