// The rank grid's coordinates and communicators, the 1F1B order, and the shard layout's map
// between one rank's parameters and the whole model's.
#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <numeric>
#include <set>

#include "parallel/parallel_test_util.h"
#include "tandem/comm/thread.h"
#include "tandem/core/error.h"
#include "tandem/parallel/grid.h"
#include "tandem/parallel/pipeline.h"
#include "tandem/parallel/shard.h"

namespace tandem::parallel {
namespace {

using testing::tiny_config;

TEST(Grid, CoordinatesRoundTripWithTensorParallelRanksAdjacent) {
  const GridShape s{3, 2, 2};
  for (int r = 0; r < s.size(); ++r) EXPECT_EQ(grid_rank(s, grid_coord(s, r)), r);
  EXPECT_EQ(grid_coord(s, 1), (GridCoord{0, 1, 0}));
  EXPECT_EQ(grid_coord(s, 2), (GridCoord{1, 0, 0}));
  EXPECT_EQ(grid_coord(s, 6), (GridCoord{0, 0, 1}));
}

TEST(Grid, SplitsTheWorldIntoEachParallelismsGroups) {
  const GridShape s{2, 2, 3};
  std::mutex mu;
  comm::run_ranks(s.size(), [&](comm::Communicator& world) {
    Grid g(world, s);
    const GridCoord c = g.coord();
    // Each group's members, by world rank, via an all_gather of world ranks.
    auto members = [&](comm::Communicator& group) {
      Tensor mine = Tensor::empty(DType::F32, Shape{1});
      mine.set(0, static_cast<float>(world.rank()));
      Tensor all = Tensor::empty(DType::F32, Shape{group.size()});
      group.all_gather(mine, all);
      std::vector<int> out;
      for (int i = 0; i < group.size(); ++i) out.push_back(static_cast<int>(all.get(i)));
      return out;
    };
    std::vector<int> dp = members(g.dp()), tp = members(g.tp());
    std::vector<int> want_dp, want_tp;
    for (int d = 0; d < s.dp; ++d) want_dp.push_back(grid_rank(s, {d, c.tp, c.pp}));
    for (int t = 0; t < s.tp; ++t) want_tp.push_back(grid_rank(s, {c.dp, t, c.pp}));
    std::vector<int> next, prev, want_next, want_prev;
    if (g.to_next() != nullptr) {
      next = members(*g.to_next());
      for (int st : {c.pp, c.pp + 1})
        for (int t = 0; t < s.tp; ++t) want_next.push_back(grid_rank(s, {c.dp, t, st}));
    }
    if (g.from_prev() != nullptr) {
      prev = members(*g.from_prev());
      for (int st : {c.pp - 1, c.pp})
        for (int t = 0; t < s.tp; ++t) want_prev.push_back(grid_rank(s, {c.dp, t, st}));
    }
    std::vector<int> tied, want_tied;
    if (g.tied() != nullptr) {
      tied = members(*g.tied());
      want_tied = {grid_rank(s, {c.dp, c.tp, 0}), grid_rank(s, {c.dp, c.tp, s.pp - 1})};
    }
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(dp, want_dp) << "rank " << world.rank();
    EXPECT_EQ(tp, want_tp) << "rank " << world.rank();
    EXPECT_EQ(g.to_next() != nullptr, c.pp < s.pp - 1);
    EXPECT_EQ(g.from_prev() != nullptr, c.pp > 0);
    EXPECT_EQ(next, want_next) << "rank " << world.rank();
    EXPECT_EQ(prev, want_prev) << "rank " << world.rank();
    EXPECT_EQ(g.tied() != nullptr, c.pp == 0 || c.pp == s.pp - 1);
    EXPECT_EQ(tied, want_tied) << "rank " << world.rank();
  });
}

TEST(Grid, RefusesAWorldOfTheWrongSize) {
  comm::run_ranks(2, [&](comm::Communicator& world) {
    try {
      Grid g(world, GridShape{2, 2, 1});
      ADD_FAILURE() << "no error";
    } catch (const UserError& e) {
      EXPECT_STREQ(e.what(), "the rank grid dp=2 tp=2 pp=1 needs 4 ranks, but there are 2");
    }
  });
}

TEST(OneFOneB, WarmsUpThenAlternatesThenDrains) {
  EXPECT_EQ(str(one_f_one_b(2, 0, 4)), "F0 F1 B0 F2 B1 F3 B2 B3");
  EXPECT_EQ(str(one_f_one_b(2, 1, 4)), "F0 B0 F1 B1 F2 B2 F3 B3");
  EXPECT_EQ(str(one_f_one_b(4, 0, 2)), "F0 F1 B0 B1");
  EXPECT_EQ(str(one_f_one_b(1, 0, 3)), "F0 B0 F1 B1 F2 B2");
}

TEST(OneFOneB, EveryMicroBatchRunsForwardThenBackwardWithinTheInFlightLimit) {
  for (int P : {1, 2, 3, 5})
    for (int M : {1, 2, 3, 7})
      for (int s = 0; s < P; ++s) {
        const std::vector<PipeOp> ops = one_f_one_b(P, s, M);
        ASSERT_EQ(ops.size(), 2u * M);
        std::vector<int> f_at(M, -1), b_at(M, -1);
        int in_flight = 0, worst = 0, next_f = 0, next_b = 0;
        for (size_t i = 0; i < ops.size(); ++i) {
          if (ops[i].kind == PipeOp::Forward) {
            EXPECT_EQ(ops[i].micro, next_f++);  // forwards in order
            ++in_flight;
          } else {
            EXPECT_EQ(ops[i].micro, next_b++);  // backwards in order, each after its forward
            EXPECT_LT(ops[i].micro, next_f);
            --in_flight;
          }
          worst = std::max(worst, in_flight);
        }
        EXPECT_LE(worst, in_flight_limit(P, s, M)) << P << " stages, stage " << s << ", " << M;
      }
}

// Every whole-model element is written by exactly one (tp rank, stage) writer, and extract then
// deposit gives the whole model back.
TEST(ShardLayout, WritersTileTheWholeModelAndExtractDepositRoundTrips) {
  for (GridShape g : {GridShape{1, 1, 1}, GridShape{1, 2, 1}, GridShape{1, 1, 2},
                      GridShape{1, 2, 2}, GridShape{1, 4, 3}}) {
    const nn::GPTConfig c = tiny_config(3, 4, 16, 8);
    const int64_t n = nn::gpt_num_parameters(c);
    std::vector<float> whole(static_cast<size_t>(n));
    std::iota(whole.begin(), whole.end(), 1.0f);
    std::vector<int> writes(static_cast<size_t>(n), 0);
    std::vector<float> rebuilt(static_cast<size_t>(n), 0.0f);
    int64_t total_local = 0;
    for (int st = 0; st < g.pp; ++st)
      for (int t = 0; t < g.tp; ++t) {
        ShardLayout layout(c, g, t, st);
        total_local += layout.size();
        std::vector<float> local(static_cast<size_t>(layout.size()), -1.0f);
        layout.extract(whole.data(), local.data());
        for (float x : local) ASSERT_GE(x, 1.0f) << g.str() << ": a local element was not filled";
        layout.deposit(local.data(), 0, layout.size(), rebuilt.data());
        layout.for_each_run(0, layout.size(), true, [&](const LocalTensor&, const FlatRun& r) {
          for (int64_t i = 0; i < r.count; ++i) ++writes[static_cast<size_t>(r.global + i)];
        });
      }
    EXPECT_TRUE(std::all_of(writes.begin(), writes.end(), [](int w) { return w == 1; })) << g.str();
    EXPECT_EQ(rebuilt, whole) << g.str();
    // Sharded tensors are split, not copied: only the replicated ones add up beyond the model.
    EXPECT_GE(total_local, n) << g.str();
  }
}

TEST(ShardLayout, HeadColumnsKeepEachRanksQKVOfItsOwnHeads) {
  const nn::GPTConfig c = tiny_config(1, 4, 8, 4);  // C = 8, 4 heads of 2, tp = 2: c = 4
  const ShardLayout layout(c, GridShape{1, 2, 1}, 1, 0);
  const LocalTensor& w = layout.tensor("h.0.attn.c_attn.weight");
  EXPECT_EQ(w.local_shape, (Shape{8, 12}));
  // Row 0 of the shard: q columns [4, 8), k columns [12, 16), v columns [20, 24) of the whole.
  std::vector<int64_t> starts;
  for (const FlatRun& r : w.runs)
    if (r.local < w.local_offset + 12) starts.push_back(r.global - w.global_offset);
  EXPECT_EQ(starts, (std::vector<int64_t>{4, 12, 20}));
  const LocalTensor& proj = layout.tensor("h.0.mlp.c_proj.weight");
  EXPECT_EQ(proj.local_shape, (Shape{16, 8}));
  ASSERT_EQ(proj.runs.size(), 1u);
  EXPECT_EQ(proj.runs[0].global - proj.global_offset, 16 * 8);  // rows [16, 32) of (32, 8)
}

TEST(ShardLayout, StagesSplitTheLayersAndTheLastKeepsTheTiedEmbedding) {
  const nn::GPTConfig c = tiny_config(5, 2, 8, 4);
  EXPECT_EQ(stage_first_layer(5, GridShape{1, 1, 2}, 0), 0);
  EXPECT_EQ(stage_end_layer(5, GridShape{1, 1, 2}, 0), 3);
  EXPECT_EQ(stage_end_layer(5, GridShape{1, 1, 2}, 1), 5);
  const ShardLayout last(c, GridShape{1, 1, 2}, 0, 1);
  EXPECT_FALSE(last.has_embedding());
  EXPECT_TRUE(last.has_final());
  EXPECT_EQ(last.tensors().back().name, "wte.weight");
  EXPECT_FALSE(last.tensors().back().writer);
  EXPECT_EQ(last.first_layer(), 3);
}

// --stage-layers: the stages hold the counts given, the first the embeddings and the last the
// final norm and the head whatever their share.
TEST(ShardLayout, StagesHoldTheLayersOfAGivenSplit) {
  const nn::GPTConfig c = tiny_config(5, 2, 8, 4);
  GridShape g{1, 1, 3};
  g.stage_layers = {1, 3, 1};
  EXPECT_EQ(stage_first_layer(5, g, 0), 0);
  EXPECT_EQ(stage_end_layer(5, g, 0), 1);
  EXPECT_EQ(stage_first_layer(5, g, 1), 1);
  EXPECT_EQ(stage_end_layer(5, g, 1), 4);
  EXPECT_EQ(stage_end_layer(5, g, 2), 5);
  const ShardLayout first(c, g, 0, 0), middle(c, g, 0, 1), last(c, g, 0, 2);
  EXPECT_TRUE(first.has_embedding());
  EXPECT_EQ(first.end_layer() - first.first_layer(), 1);
  EXPECT_EQ(middle.first_layer(), 1);
  EXPECT_EQ(middle.end_layer(), 4);
  EXPECT_EQ(middle.blocks_range().second - middle.blocks_range().first, 3 * middle.block_floats());
  EXPECT_TRUE(last.has_final());
  EXPECT_EQ(last.first_layer(), 4);
  // Every tensor of the whole model is written by exactly one stage.
  int64_t written = 0;
  for (const ShardLayout* l : {&first, &middle, &last})
    for (const LocalTensor& t : l->tensors()) written += t.writer ? t.numel() : 0;
  EXPECT_EQ(written, nn::gpt_num_parameters(c));
  EXPECT_EQ(g.str(), "dp=1 tp=1 pp=3 stage-layers=1,3,1");
}

TEST(ShardLayout, RefusesASplitThatDoesNotFitTheGrid) {
  const nn::GPTConfig c = tiny_config(5, 2, 8, 4);
  auto error = [&](GridShape g) {
    try {
      ShardLayout(c, g, 0, 0);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  GridShape g{1, 1, 2};
  g.stage_layers = {1, 4};
  EXPECT_EQ(error(g), "no error");
  g.stage_layers = {1, 2, 2};
  EXPECT_EQ(error(g), "--stage-layers 1,2,2 gives 3 counts, one a stage, but --pp is 2");
  g.stage_layers = {0, 5};
  EXPECT_EQ(error(g), "--stage-layers 0,5: stage 0 gets 0 layers; each stage needs at least 1");
  g.stage_layers = {2, 2};
  EXPECT_EQ(error(g), "--stage-layers 2,2 sums to 4 layers; the model has 5 (--layers)");
  g = GridShape{1, 1, 1};
  g.stage_layers = {5};
  EXPECT_EQ(error(g),
            "--stage-layers 5 splits a pipeline's layers over its stages: it needs --pp 2 or more "
            "(got --pp 1)");
}

TEST(ShardLayout, RefusesGridsTheModelCannotSplitInto) {
  try {
    ShardLayout(tiny_config(2, 2, 16, 8), GridShape{1, 4, 1}, 0, 0);
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(),
                 "tensor parallelism over 4 ranks needs the head count (2) to be a multiple of 4");
  }
  try {
    ShardLayout(tiny_config(2, 2, 16, 8), GridShape{1, 1, 3}, 0, 0);
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(),
                 "pipeline parallelism over 3 stages needs at least 3 layers; the model has 2");
  }
}

}  // namespace
}  // namespace tandem::parallel
