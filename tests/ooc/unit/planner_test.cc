// The out-of-core plan, schedule, model and planner: names, lifetimes, peaks, and the planner's
// optimality against exhaustive enumeration.
#include "tandem/ooc/planner.h"

#include <gtest/gtest.h>

#include <random>

#include "tandem/core/bytes.h"
#include "tandem/core/error.h"

namespace tandem::ooc {
namespace {

nn::GPTConfig small_config(int layers) {
  nn::GPTConfig c;
  c.n_layers = layers;
  c.d_model = 64;
  c.n_heads = 4;
  c.seq_len = 32;
  c.max_positions = 32;
  return c;
}

// The chain of `blocks` blocks: 2 * blocks units (attention, MLP, attention, ...).
nn::ChainLayout chain(int blocks, int micro = 1, bool head = true) {
  std::vector<nn::ChainLayout::Pass> order;
  for (int k = 0; k < micro; ++k) {
    order.push_back({true, k});
    order.push_back({false, k});
  }
  return nn::gpt_chain_layout(small_config(blocks), 4, 32, 0, blocks, head, order);
}

uint64_t unit_bytes(const MemorySchedule& s, int u) { return s.input_bytes() + s.buffers_bytes(u); }

TEST(Plan, NamesRoundTrip) {
  for (const char* s : {"KKSR/p1", "RCCK/p0", "S/p3", "sSsK/p2"})
    EXPECT_EQ(Plan::parse(s).str(), s);
  EXPECT_EQ(chen_sqrt(9, 1).str(), "RCCRCCRCC/p1");
  EXPECT_EQ(chen_sqrt(18, 2).str(), "RCCCCCRCCCCCRCCCCC/p1");  // 9 blocks: segments of 3 blocks
  EXPECT_EQ(recompute_all(6, 2).str(), "RCRCRC/p1");           // every block from its input
  EXPECT_EQ(karma(4, 2).str(), "SSRR/p1");
}

TEST(Chain, UnitsAreHalfBlocks) {
  const auto c = chain(3);
  EXPECT_EQ(c.units, 6);
  EXPECT_EQ(c.unit_name(0), "h0.attn");
  EXPECT_EQ(c.unit_name(5), "h2.mlp");
  EXPECT_EQ(c.kind(1).input, nn::BlockAct::Resid1);
  EXPECT_EQ(c.kind(0).output, nn::BlockAct::Resid1);
  EXPECT_EQ(c.kind(1).output, nn::BlockAct::Out);
  // Every saved buffer of a block belongs to exactly one half; Resid1 and Out are the halves'
  // outputs, held as the next unit's input.
  std::vector<int> owners(nn::kNumActs<nn::BlockAct>, 0);
  for (const auto& k : c.kinds) {
    for (nn::BlockAct a : k.saves) ++owners[static_cast<size_t>(a)];
    ++owners[static_cast<size_t>(k.output)];
  }
  for (int a = 0; a < nn::kNumActs<nn::BlockAct>; ++a)
    EXPECT_EQ(owners[static_cast<size_t>(a)], 1) << a;
}

// The schedule sizes each buffer by its type: with bf16 matmuls the attention half's ln_1.out
// (and, with the unfused attention kernel, attn.y) and the MLP half's ln_2.out and mlp.gelu.out
// take 2 bytes an element (nn::act_dtype), so a unit's buffers (what it keeps, swaps or
// recomputes) shrink by theirs.
TEST(Chain, Bf16SavedBuffersAreSizedByTheirType) {
  const std::vector<nn::ChainLayout::Pass> order = {{true, 0}, {false, 0}};
  for (nn::AttentionKernel kernel : {nn::AttentionKernel::Fused, nn::AttentionKernel::Unfused}) {
    nn::GPTConfig c = small_config(2);
    c.attention = kernel;
    const MemorySchedule f32(nn::gpt_chain_layout(c, 4, 32, 0, 2, true, order), keep_all(4));
    c.matmul = DType::BF16;
    const MemorySchedule b16(nn::gpt_chain_layout(c, 4, 32, 0, 2, true, order), keep_all(4));
    const uint64_t half_of_one = uint64_t{4} * 32 * 64 * 2;  // a (B, T, C) buffer's saved bytes
    const uint64_t attn = kernel == nn::AttentionKernel::Unfused ? 2 : 1;
    EXPECT_EQ(b16.buffers_bytes(0) + attn * half_of_one, f32.buffers_bytes(0));
    EXPECT_EQ(b16.buffers_bytes(1) + 5 * half_of_one, f32.buffers_bytes(1));
    EXPECT_EQ(b16.input_bytes(), f32.input_bytes());  // the residual stream stays f32
  }
}

// The attention half saves (B, NH, T) for the fused kernel where the unfused one saves the
// (B, NH, T, T) softmax: the unit's buffers differ by exactly that (before the arena's
// alignment), and the schedule places fewer bytes.
TEST(Chain, FusedAttentionSavesTheLogSumExpNotTheSoftmax) {
  const std::vector<nn::ChainLayout::Pass> order = {{true, 0}, {false, 0}};
  nn::GPTConfig c = small_config(2);
  const int B = 4, T = 32;
  c.attention = nn::AttentionKernel::Unfused;
  const nn::ChainLayout unfused = nn::gpt_chain_layout(c, B, T, 0, 2, true, order);
  c.attention = nn::AttentionKernel::Fused;
  const nn::ChainLayout fused = nn::gpt_chain_layout(c, B, T, 0, 2, true, order);
  auto bytes = [](const std::vector<nn::ChainLayout::Buffer>& buffers) {
    uint64_t s = 0;
    for (const auto& b : buffers) s += b.bytes();
    return s;
  };
  const uint64_t heads = static_cast<uint64_t>(B) * c.n_heads;
  EXPECT_EQ(bytes(fused.kinds[0].buffers) + heads * T * (T - 1) * 4,
            bytes(unfused.kinds[0].buffers));
  EXPECT_EQ(bytes(fused.kinds[1].buffers), bytes(unfused.kinds[1].buffers));
  EXPECT_LT(MemorySchedule(fused, keep_all(4)).buffers_bytes(0),
            MemorySchedule(unfused, keep_all(4)).buffers_bytes(0));
}

TEST(Plan, BadNames) {
  EXPECT_THROW(Plan::parse("KX/p1"), UserError);
  EXPECT_THROW(Plan::parse("KK"), UserError);
  EXPECT_THROW(Plan::parse("CK/p1"), UserError);  // a segment needs a start
  EXPECT_THROW(Plan::parse("KCK/p1"), UserError);
}

TEST(Bytes, ParseAndPrint) {
  EXPECT_EQ(parse_bytes("600MiB"), 600ull << 20);
  EXPECT_EQ(parse_bytes("1.5GiB"), 3ull << 29);
  EXPECT_EQ(parse_bytes("2G"), 2ull << 30);
  EXPECT_EQ(parse_bytes("4096"), 4096u);
  EXPECT_EQ(parse_bytes("1GB"), 1000000000u);
  EXPECT_THROW(parse_bytes("lots"), UserError);
  EXPECT_THROW(parse_bytes("5 parsecs"), UserError);
  EXPECT_EQ(human_bytes(3ull << 29), "1.50 GiB");
  EXPECT_EQ(parse_budget("25%", 1000), 250u);  // a share of the in-core need
  EXPECT_EQ(parse_budget("12.5%", 1u << 20), 1u << 17);
  EXPECT_EQ(parse_budget("600MiB", 1), 600ull << 20);
  EXPECT_THROW(parse_budget("0%", 1000), UserError);
  EXPECT_THROW(parse_budget("half%", 1000), UserError);
}

TEST(Place, NoOverlapInTimeAndSpace) {
  std::mt19937 rng(7);
  std::vector<Interval> iv;
  for (int i = 0; i < 60; ++i) {
    const int a = static_cast<int>(rng() % 30), b = a + static_cast<int>(rng() % 8);
    iv.push_back(Interval{(1 + rng() % 16) * 4096, a, b});
  }
  const uint64_t extent = place(iv);
  uint64_t live_max = 0;
  for (int t = 0; t < 40; ++t) {
    uint64_t live = 0;
    for (const auto& x : iv) live += (x.first <= t && t <= x.last) ? x.bytes : 0;
    live_max = std::max(live_max, live);
  }
  EXPECT_GE(extent, live_max);
  for (size_t i = 0; i < iv.size(); ++i)
    for (size_t j = i + 1; j < iv.size(); ++j) {
      const bool time = iv[i].first <= iv[j].last && iv[j].first <= iv[i].last;
      const bool space =
          iv[i].offset < iv[j].offset + iv[j].bytes && iv[j].offset < iv[i].offset + iv[i].bytes;
      EXPECT_FALSE(time && space) << i << " and " << j;
    }
}

TEST(Schedule, KeepAllHoldsEveryUnitAtTheTurn) {
  const auto c = chain(2);
  const MemorySchedule keep(c, keep_all(4));
  const MemorySchedule rec(c, recompute_all(4, 1));
  uint64_t all = 0;
  for (int u = 0; u < 4; ++u) all += unit_bytes(keep, u);
  EXPECT_NE(keep.buffers_bytes(0), keep.buffers_bytes(1));  // attention and MLP differ
  EXPECT_GE(keep.peak_bytes(), all);
  EXPECT_LT(rec.peak_bytes(), keep.peak_bytes());
  EXPECT_EQ(keep.transfers().size(), 0u);
  const MemorySchedule swap(c, swap_all(4, 1));
  EXPECT_EQ(swap.transfers().size(), 12u);  // input and buffers out, one read back, per unit
  EXPECT_EQ(swap.swapped_bytes(), all);
  EXPECT_EQ(rec.actions()[static_cast<size_t>(rec.op_index({false, 0, 2}))].recompute,
            std::vector<int>{2});
  // A swap whose write is waited for frees its memory one operation sooner.
  EXPECT_LT(MemorySchedule(c, Plan::parse("ssss/p0")).peak_bytes(), swap.peak_bytes());
  const MemorySchedule chen(c, Plan::parse("RCRC/p1"));
  EXPECT_EQ(chen.actions()[static_cast<size_t>(chen.op_index({false, 0, 3}))].recompute,
            (std::vector<int>{2, 3}));
}

TEST(Schedule, RefusesRecomputingAHandOff) {
  EXPECT_THROW(MemorySchedule(chain(2, 1, false), recompute_all(4, 2)), UserError);
  EXPECT_THROW(MemorySchedule(chain(2, 1, false), Plan::parse("KK/p1")),
               UserError);  // a letter per unit
  EXPECT_NO_THROW(MemorySchedule(chain(2, 1, false), Plan::parse("RCRK/p1")));
}

TEST(Model, SlowTransfersStallAndRecomputeCosts) {
  const auto c = chain(2);
  Profile fast = uniform_profile(4, 1.0, 2.0, 1e15, 1e15);
  EXPECT_NEAR(predict(c, keep_all(4), fast).step_s, 12.0, 1e-9);
  EXPECT_NEAR(predict(c, swap_all(4, 1), fast).step_s, 12.0, 1e-6);  // free transfers hide
  EXPECT_NEAR(predict(c, recompute_all(4, 2), fast).step_s, 16.0, 1e-9);
  Profile slow = uniform_profile(4, 1.0, 2.0, 1e3, 1e3);
  EXPECT_GT(predict(c, swap_all(4, 1), slow).stall_s, 1.0);
  // Micro-batches in turn: planned on one, scaled.
  EXPECT_NEAR(predict(chain(2, 3), recompute_all(4, 2), fast).step_s, 48.0, 1e-9);
}

// The property the planner's bounds promise: the same best time as trying every plan.
TEST(Planner, EqualsExhaustiveSearchOnSmallChains) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 12; ++trial) {
    const int n = 2 * (1 + trial % 3);  // units: 2, 4, 6
    const auto c = chain(n / 2, 1, trial % 4 != 0);
    Profile p;
    for (int j = 0; j < n; ++j) {
      p.forward_s.push_back(0.5 + (rng() % 100) / 100.0);
      p.backward_s.push_back(1.0 + (rng() % 100) / 50.0);
    }
    const uint64_t blk = unit_bytes(MemorySchedule(c, keep_all(n)), 0);
    p.write_bytes_per_s = blk / (0.2 + (rng() % 100) / 40.0);
    p.read_bytes_per_s = blk / (0.2 + (rng() % 100) / 40.0);
    const uint64_t full = MemorySchedule(c, keep_all(n)).peak_bytes();
    const uint64_t budget = full * (30 + rng() % 70) / 100;
    const auto brute = plan_exhaustive(c, p, budget);
    if (!brute) {
      EXPECT_THROW(plan_step(c, p, budget), UserError) << "n=" << n;
      continue;
    }
    const PlannerResult r = plan_step(c, p, budget);
    EXPECT_TRUE(r.optimal);
    EXPECT_NEAR(r.best.prediction.step_s, brute->prediction.step_s, 1e-9)
        << "n=" << n << " planner " << r.best.plan.str() << " exhaustive " << brute->plan.str();
    EXPECT_LE(r.best.prediction.peak_bytes, budget);
    for (const Evaluated& b : r.baselines) {
      if (b.fits) {
        EXPECT_LE(r.best.prediction.step_s, b.prediction.step_s + 1e-9)
            << strategy_name(b.strategy);
      }
    }
  }
}

TEST(Planner, NoPlanFitsNamesTheSmallestBudget) {
  const auto c = chain(2);
  const Profile p = uniform_profile(4, 1.0, 2.0, 1e9, 1e9);
  try {
    plan_step(c, p, 4096);
    FAIL() << "expected an error";
  } catch (const UserError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("no out-of-core plan fits a memory budget of 4.00 KiB"), std::string::npos)
        << m;
    EXPECT_NE(m.find("the smallest budget that works is"), std::string::npos) << m;
  }
  const PlannerResult r = plan_step(c, p, 1ull << 40);
  EXPECT_EQ(r.best.plan.str(), "KKKK/p1");  // room for everything: keep it
  const SmallestBudget low = smallest_budget(c, p);
  EXPECT_TRUE(low.proven);
  const PlannerResult tight = plan_step(c, p, low.bytes);
  EXPECT_LE(tight.best.prediction.peak_bytes, low.bytes);
  EXPECT_THROW(plan_step(c, p, low.bytes - 4096), UserError);
  // A search cut short at once still finds a plan wherever one fits (the lean plans seed it).
  const PlannerResult cut = plan_step(c, p, low.bytes, 1);
  EXPECT_FALSE(cut.optimal);
  EXPECT_LE(cut.best.prediction.peak_bytes, low.bytes);
}

// The bounds prune: a chain of 16 units near its smallest budget is searched to the end (proven
// optimal) within the default limit.
TEST(Planner, TightBudgetOnALongChainIsProvenOptimal) {
  const auto c = chain(8);
  const Profile p = uniform_profile(16, 1.0, 2.0, 1e9, 1e9);
  const SmallestBudget low = smallest_budget(c, p);
  const PlannerResult r = plan_step(c, p, low.bytes + low.bytes / 10);
  EXPECT_TRUE(r.optimal) << r.evaluated << " plans";
}

}  // namespace
}  // namespace tandem::ooc
