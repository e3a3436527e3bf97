// Each placement of the model state allocates what its sizing formula (the memory estimate's and
// the planner's, before the state exists) says: the blocks in memory, streamed from a tier,
// sharded, and sharded and streamed.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "parallel/parallel_test_util.h"
#include "tandem/comm/thread.h"
#include "tandem/parallel/block_store.h"
#include "tandem/parallel/model_state.h"
#include "tandem/parallel/shard.h"
#include "tandem/parallel/sharded_blocks.h"

namespace tandem::parallel {
namespace {

constexpr uint64_t kF32 = sizeof(float);

// The optimizer's pieces with every block its own piece (kept whole, or the slice [b, e) of
// each block, offsets within it), and the rest one piece kept whole.
std::vector<ModelState::Piece> block_pieces(const ShardLayout& layout, int64_t b, int64_t e) {
  std::vector<ModelState::Piece> pieces;
  for (int l = layout.first_layer(); l < layout.end_layer(); ++l) {
    const int64_t first = layout.block_range(l).first;
    pieces.push_back({first, first + layout.block_floats(), first + b, first + e, l});
  }
  const auto [blocks_begin, blocks_end] = layout.blocks_range();
  pieces.push_back({0, blocks_begin, 0, blocks_begin, -1});
  pieces.push_back({blocks_end, layout.size(), blocks_end, layout.size(), -1});
  return pieces;
}

// Moments of the pieces outside the blocks (ModelState's, in memory).
uint64_t rest_moment_bytes(const ShardLayout& layout) {
  const auto [b, e] = layout.blocks_range();
  return 2 * static_cast<uint64_t>(layout.size() - (e - b)) * kF32;
}

TEST(StateSizing, BlocksInMemoryAreTheFlatBuffers) {
  const ShardLayout layout(testing::tiny_config(3), {1, 1, 1}, 0, 0);
  ModelState state(layout, {});
  EXPECT_EQ(state.resident_bytes(), static_cast<uint64_t>(layout.size()) * kF32);
  const auto [b, e] = layout.blocks_range();
  EXPECT_EQ(e - b, 3 * layout.block_floats());
  state.place_moments({{0, b, 0, b, -1}, {b, layout.size(), b, layout.size(), -1}});
  EXPECT_EQ(state.moment_bytes(), 2 * static_cast<uint64_t>(layout.size()) * kF32);
  EXPECT_EQ(state.sharded_bytes(), 0u);
  EXPECT_EQ(state.store(), nullptr);
}

// --model-state: the store's slots and resident blocks are BlockStore's static formulas; the flat
// buffers hold the rest of the shard only.
TEST(StateSizing, StreamedBlocksStageWhatBlockStoreSays) {
  const ShardLayout layout(testing::tiny_config(3), {1, 1, 1}, 0, 0);
  const int64_t block = layout.block_floats();
  for (const int M : {1, 2}) {
    ModelState::Options o;
    o.blocks = ooc::TierSpec{};
    o.micro_batches = M;
    ModelState state(layout, o);
    state.place_moments(block_pieces(layout, 0, block));
    ASSERT_NE(state.store(), nullptr);
    EXPECT_EQ(state.store()->staging_bytes(), BlockStore::staging_bytes(block, block, M)) << M;
    for (int r = 0; r <= 3; ++r)
      EXPECT_EQ(state.store()->resident_bytes(r),
                static_cast<uint64_t>(r) * BlockStore::resident_block_bytes(block, block))
          << M;
    EXPECT_EQ(state.resident_bytes(), static_cast<uint64_t>(layout.size() - 3 * block) * kF32);
    EXPECT_EQ(state.moment_bytes(), rest_moment_bytes(layout));
    EXPECT_EQ(state.sharded_bytes(), 0u);
  }
}

// --shard weights, with and without --model-state: the sharded state's slices, gather slots and
// gradient slots, and the moments of its slices, are ShardedBlocks' formulas (with several
// micro-batches the gradient sums are the flat buffer's block ranges, which the formula counts).
TEST(StateSizing, ShardedBlocksHoldWhatTheirFormulasSay) {
  const ShardLayout layout(testing::tiny_config(3), {2, 1, 1}, 0, 0);
  const int64_t block = layout.block_floats();
  const int blocks = 3;
  for (const bool streamed : {false, true})
    for (const int M : {1, 2})
      for (const int D : {1, 2}) {
        comm::run_ranks(2, [&](comm::Communicator& dp) {
          ModelState::Options o;
          o.sharded = true;
          o.micro_batches = M;
          o.gather_ahead = D;
          if (streamed) o.blocks = ooc::TierSpec{};
          ModelState state(layout, o);
          const int64_t slice = ShardedBlocks::slice_count(block, dp);
          int64_t first = 0;
          for (int r = 0; r < dp.rank(); ++r) first += block / 2 + (r < block % 2 ? 1 : 0);
          const ModelState::Group group{&dp, nullptr, exec::RunnerKind::Plan};
          state.place_moments(block_pieces(layout, first, first + slice), &group);
          if (dp.rank() != 0) return;  // rank 0 holds the largest slice, which the formulas count
          ASSERT_EQ(slice, ShardedBlocks::slice_floats(block, 2));
          const uint64_t flat_sums = M > 1 ? blocks * static_cast<uint64_t>(block) * kF32 : 0;
          const uint64_t slots = ShardedBlocks::slot_bytes(block, blocks, M, D);
          const uint64_t block_moments = state.moment_bytes() - rest_moment_bytes(layout);
          if (streamed) {
            EXPECT_EQ(state.sharded_bytes() + flat_sums, slots);
            EXPECT_EQ(block_moments, 0u);
            ASSERT_NE(state.store(), nullptr);
            EXPECT_EQ(state.store()->staging_bytes(), BlockStore::staging_bytes(slice, slice, 1));
          } else {
            EXPECT_EQ(state.sharded_bytes() + flat_sums + block_moments,
                      ShardedBlocks::state_bytes(block, blocks, 2, M, D));
            EXPECT_EQ(state.store(), nullptr);
          }
        });
      }
}

}  // namespace
}  // namespace tandem::parallel
